//! A TCP proxy owned by a test, between the gateway and RabbitMQ, that can fail the link on
//! demand: cut it (close every connection, refuse new ones), black-hole it (keep the
//! connections open but drop every byte silently, as a dead network path does), and restore.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways.
    Open,
    /// Close every connection; accept new ones only to close them at once.
    Cut,
    /// Keep connections open, read and discard every byte, send nothing back. A connection
    /// black-holed once stays so (its AMQP stream has lost bytes), until the client gives up.
    BlackHole,
}

/// A running proxy on 127.0.0.1; stops when dropped.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on 127.0.0.1:0 and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let addr = listener.local_addr().expect("proxy addr");
        let (mode, rx) = watch::channel(Mode::Open);
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::SeqCst);
                if *rx.borrow() == Mode::Cut {
                    drop(client);
                    continue;
                }
                tokio::spawn(pipe(client, rx.clone(), upstream));
            }
        });
        Self {
            addr,
            mode,
            accepted,
            task,
        }
    }

    /// Forwards to the local RabbitMQ.
    pub async fn to_rabbitmq() -> Self {
        Self::start(SocketAddr::from(([127, 0, 0, 1], 5672))).await
    }

    /// An AMQP URL through the proxy, with `query` appended (e.g. `heartbeat=2`).
    pub fn amqp_url(&self, query: &str) -> String {
        let q = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        format!("amqp://guest:guest@{}/%2f{q}", self.addr)
    }

    /// Closes every connection and refuses new ones.
    pub fn cut(&self) {
        self.mode.send_replace(Mode::Cut);
    }

    /// Silently drops every byte of current and new connections.
    pub fn black_hole(&self) {
        self.mode.send_replace(Mode::BlackHole);
    }

    /// Forwards new connections again (black-holed ones stay dead until their client drops
    /// them, as after a real network partition).
    pub fn restore(&self) {
        self.mode.send_replace(Mode::Open);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// Connections accepted so far (including refused ones).
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        // Connection tasks see the sender go away and close.
        self.mode.send_replace(Mode::Cut);
    }
}

async fn pipe(mut client: TcpStream, mut mode: watch::Receiver<Mode>, upstream: SocketAddr) {
    // `None` upstream: black-holed for good.
    let initial = *mode.borrow_and_update();
    let mut up = match initial {
        Mode::Open => match TcpStream::connect(upstream).await {
            Ok(s) => Some(s),
            Err(_) => return,
        },
        Mode::BlackHole => None,
        Mode::Cut => return,
    };
    let mut from_client = vec![0u8; 16 * 1024];
    let mut from_up = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = *mode.borrow_and_update();
                match now {
                    Mode::Cut => return,
                    // Dropping the upstream side: the broker sees the client vanish, the
                    // client sees nothing at all.
                    Mode::BlackHole => up = None,
                    Mode::Open => {}
                }
            }
            n = client.read(&mut from_client) => {
                let n = match n {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let now = *mode.borrow();
                if now == Mode::BlackHole {
                    up = None;
                }
                if let Some(u) = up.as_mut() {
                    if u.write_all(&from_client[..n]).await.is_err() {
                        return;
                    }
                }
            }
            n = async {
                match up.as_mut() {
                    Some(u) => u.read(&mut from_up).await,
                    None => std::future::pending().await,
                }
            } => {
                let n = match n {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let now = *mode.borrow();
                if now == Mode::BlackHole {
                    up = None;
                    continue;
                }
                if client.write_all(&from_up[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
