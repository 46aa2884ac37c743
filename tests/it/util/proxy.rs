//! A TCP proxy owned by a test, between the gateway and RabbitMQ, that can fail the link on
//! demand: cut it (close every connection, refuse new ones), black-hole it (keep the
//! connections open but drop every byte silently, as a dead network path does), and restore;
//! or black-hole its connections at an exact point of the AMQP stream: after N publishes.

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
    /// Keep forwarding the client's bytes to the broker, but hold back everything the
    /// broker sends (it waits in the socket buffers) until the mode changes: a link that
    /// stalls one way, then recovers with every byte intact.
    Stall,
}

/// The local RabbitMQ.
pub const RABBITMQ: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 5672);

/// A running proxy on 127.0.0.1; stops when dropped.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    accepted: Arc<AtomicUsize>,
    publishes: Arc<PublishBudget>,
    task: JoinHandle<()>,
}

/// How many more `basic.publish` frames the proxy forwards before it black-holes the
/// connection that sends the next one.
pub struct PublishBudget {
    /// `usize::MAX`: no limit.
    left: AtomicUsize,
    /// Set once a connection was black-holed for going over the budget.
    tripped: std::sync::atomic::AtomicBool,
}

impl PublishBudget {
    /// Takes one publish from the budget; false when none is left.
    fn take(&self) -> bool {
        self.left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
                usize::MAX => Some(n),
                0 => None,
                n => Some(n - 1),
            })
            .is_ok()
    }
}

impl Proxy {
    /// Listens on 127.0.0.1:0 and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        Self::start_on("127.0.0.1:0", upstream).await
    }

    /// Listens on `listen` and forwards to `upstream`.
    pub async fn start_on(listen: &str, upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind(listen).await.expect("proxy bind");
        let addr = listener.local_addr().expect("proxy addr");
        let (mode, rx) = watch::channel(Mode::Open);
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let publishes = Arc::new(PublishBudget {
            left: AtomicUsize::new(usize::MAX),
            tripped: std::sync::atomic::AtomicBool::new(false),
        });
        let budget = publishes.clone();
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
                tokio::spawn(pipe(client, rx.clone(), upstream, budget.clone()));
            }
        });
        Self {
            addr,
            mode,
            accepted,
            publishes,
            task,
        }
    }

    /// Forwards to the local RabbitMQ.
    pub async fn to_rabbitmq() -> Self {
        Self::start(RABBITMQ).await
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

    /// Holds back what the broker sends on every connection until [`Self::restore`].
    pub fn stall(&self) {
        self.mode.send_replace(Mode::Stall);
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

    /// Forwards `n` more `basic.publish` frames, then black-holes the connection that sends
    /// the next one, right before that frame: a fault at an exact point of a stream.
    pub fn black_hole_after_publishes(&self, n: usize) {
        self.publishes.left.store(n, Ordering::SeqCst);
    }

    /// Whether a connection was black-holed for going over the publish budget.
    pub fn tripped(&self) -> bool {
        self.publishes.tripped.load(Ordering::SeqCst)
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

async fn pipe(
    mut client: TcpStream,
    mut mode: watch::Receiver<Mode>,
    upstream: SocketAddr,
    budget: Arc<PublishBudget>,
) {
    let mut frames = FrameScanner::default();
    // `None` upstream: black-holed for good.
    let initial = *mode.borrow_and_update();
    let mut up = match initial {
        Mode::Open | Mode::Stall => match TcpStream::connect(upstream).await {
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
                    Mode::Open | Mode::Stall => {}
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
                let mut forward = n;
                if up.is_some() {
                    if let Some(at) = frames
                        .publishes(&from_client[..n])
                        .into_iter()
                        .find(|_| !budget.take())
                    {
                        forward = at;
                    }
                }
                if let Some(u) = up.as_mut() {
                    if u.write_all(&from_client[..forward]).await.is_err() {
                        return;
                    }
                }
                if forward < n {
                    up = None;
                    budget.tripped.store(true, Ordering::SeqCst);
                }
            }
            n = async {
                match up.as_mut() {
                    Some(u) => u.read(&mut from_up).await,
                    None => std::future::pending().await,
                }
            }, if *mode.borrow() != Mode::Stall => {
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

/// Finds where `basic.publish` method frames start in the client's AMQP 0-9-1 stream: an
/// 8-byte protocol header, then frames of type (1 byte), channel (2), payload size (4),
/// payload, and an end byte; a method frame's payload starts with class and method ids.
#[derive(Default)]
struct FrameScanner {
    /// Whether the protocol header has been passed.
    past_preamble: usize,
    /// Bytes of the current frame still to pass over.
    skip: usize,
    /// The first bytes of the next frame, up to its class and method ids.
    head: Vec<u8>,
}

impl FrameScanner {
    const PREAMBLE: usize = 8;
    const HEADER: usize = 7;
    /// Frame type 1 (method), class 60 (basic), method 40 (publish).
    const PUBLISH: (u8, u16, u16) = (1, 60, 40);

    /// Offsets in `chunk` at which a publish frame starts (0 for one that began in an
    /// earlier chunk and is decided in this one).
    fn publishes(&mut self, chunk: &[u8]) -> Vec<usize> {
        let mut found = Vec::new();
        let mut start_in_chunk = 0;
        for (i, &byte) in chunk.iter().enumerate() {
            if self.past_preamble < Self::PREAMBLE {
                self.past_preamble += 1;
                continue;
            }
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            if self.head.is_empty() {
                start_in_chunk = i;
            }
            self.head.push(byte);
            if self.head.len() < Self::HEADER {
                continue;
            }
            let size = u32::from_be_bytes([self.head[3], self.head[4], self.head[5], self.head[6]]);
            let total = Self::HEADER + size as usize + 1;
            let frame_type = self.head[0];
            if frame_type == Self::PUBLISH.0 && size >= 4 && self.head.len() < Self::HEADER + 4 {
                continue;
            }
            if frame_type == Self::PUBLISH.0 && size >= 4 {
                let class = u16::from_be_bytes([self.head[7], self.head[8]]);
                let method = u16::from_be_bytes([self.head[9], self.head[10]]);
                if (class, method) == (Self::PUBLISH.1, Self::PUBLISH.2) {
                    found.push(start_in_chunk);
                }
            }
            self.skip = total - self.head.len();
            self.head.clear();
        }
        found
    }
}

#[test]
fn the_frame_scanner_finds_publishes_across_chunk_boundaries() {
    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![kind, 0, 1];
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f.push(0xCE);
        f
    }
    let publish = frame(1, &[0, 60, 0, 40, 0, 0]);
    let ack = frame(1, &[0, 60, 0, 80, 0]);
    let mut stream = b"AMQP\x00\x00\x09\x01".to_vec();
    stream.extend(frame(8, &[])); // heartbeat
    let first = stream.len();
    stream.extend(&publish);
    stream.extend(frame(2, &[0u8; 14])); // content header
    stream.extend(frame(3, b"{}")); // body
    stream.extend(&ack);
    let second = stream.len();
    stream.extend(&publish);
    // Whole, then split at every point: the same two publishes, at their offsets.
    assert_eq!(
        FrameScanner::default().publishes(&stream),
        vec![first, second]
    );
    for cut in 1..stream.len() {
        let mut scanner = FrameScanner::default();
        let (a, b) = stream.split_at(cut);
        let mut found: Vec<usize> = scanner.publishes(a);
        found.extend(scanner.publishes(b).into_iter().map(|at| at + cut));
        let expected: Vec<usize> = [first, second]
            .into_iter()
            .map(|at| if at < cut && at + 11 > cut { cut } else { at })
            .collect();
        assert_eq!(found, expected, "split at {cut}");
    }
}
