//! The real app in this process (`hookgate::app::serve`) with a clock the test moves, for
//! promises about time (TTL, retention) that must not wait for real hours.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{sign, Exposition, SECRET};

/// A gateway served in this process; its clock starts at the wall clock and moves only when
/// the test sets it.
pub struct InProcess {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// The app's liveness flag, for tests that mark it as a failing part would.
    pub liveness: hookgate::liveness::Liveness,
    now: Arc<AtomicI64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<Result<(), hookgate::app::AppError>>>,
}

impl InProcess {
    /// Serves `yaml` on port 0 with a background sweep every 20 ms.
    pub async fn start(yaml: &str) -> Self {
        Self::start_at(yaml, super::wall_ms()).await
    }

    /// As [`InProcess::start`], with the clock at `now_ms` from the start (the state store
    /// opens at that time).
    pub async fn start_at(yaml: &str, now_ms: i64) -> Self {
        let config = hookgate::config::Config::parse(yaml).expect("config");
        let prepared = hookgate::app::prepare(config).expect("prepare");
        let now = Arc::new(AtomicI64::new(now_ms));
        let clock: hookgate::clock::Clock = {
            let now = now.clone();
            Arc::new(move || now.load(Ordering::SeqCst))
        };
        let webhooks = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = webhooks.local_addr().expect("addr");
        let admin_addr = admin.local_addr().expect("admin addr");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let liveness = hookgate::liveness::Liveness::new();
        let server = tokio::spawn(hookgate::app::serve(
            prepared,
            hookgate::app::Listeners { webhooks, admin },
            async {
                let _ = stop_rx.await;
            },
            hookgate::app::Options {
                clock,
                sweep_interval: Duration::from_millis(20),
                liveness: liveness.clone(),
            },
        ));
        Self {
            liveness,
            addr,
            admin: admin_addr,
            now,
            stop: Some(stop_tx),
            server: Some(server),
        }
    }

    /// The gateway's clock, in Unix milliseconds.
    pub fn now(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    /// Sets the gateway's clock.
    pub fn set_now(&self, ms: i64) {
        self.now.store(ms, Ordering::SeqCst);
    }

    /// POSTs a signed body to the botix route.
    pub async fn post(
        &self,
        client: &reqwest::Client,
        body: &str,
        request_id: &str,
    ) -> (u16, serde_json::Value) {
        let resp = client
            .post(format!("http://{}/webhooks/botix", self.addr))
            .header("x-botix-signature", sign(SECRET, body.as_bytes()))
            .header("x-botix-request-id", request_id)
            .body(body.to_owned())
            .send()
            .await
            .expect("send");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("json"))
    }

    /// The admin `/metrics`, parsed.
    pub async fn metrics(&self, client: &reqwest::Client) -> Exposition {
        let text = client
            .get(format!("http://{}/metrics", self.admin))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics body");
        Exposition::parse(&text)
    }

    /// Shuts the app down and waits for it to finish cleanly.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            tokio::time::timeout(Duration::from_secs(40), server)
                .await
                .expect("server stopped")
                .expect("join")
                .expect("serve");
        }
    }
}
