//! The real `hookgate` binary, started on port 0 with a config written for the test.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{sign, AMQP_URL, PREVIOUS_SECRET, SECRET};

/// The gateway binary under test: this build's, or another build named by
/// `HOOKGATE_TEST_BIN` (to run the same tests against an older build and see them fail).
pub fn gateway_binary() -> PathBuf {
    std::env::var_os("HOOKGATE_TEST_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_hookgate")),
        PathBuf::from,
    )
}

/// What goes into the test gateway's YAML.
#[derive(Clone)]
pub struct GatewayConfig {
    pub dir: PathBuf,
    pub store: PathBuf,
    pub exchange: String,
    /// `amqp.url`; left out of the YAML when empty (for `amqp.urls` in `amqp_extra`).
    pub amqp_url: String,
    /// `amqp.confirm_timeout` (default `3s`).
    pub confirm_timeout: String,
    /// (cert, key) for TLS; plain HTTP when `None`.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `listen.addr` (default `127.0.0.1:0`).
    pub listen_addr: String,
    /// Extra keys under `admin:` (indented two spaces).
    pub admin_extra: String,
    /// Extra keys under `store:` (indented two spaces).
    pub store_extra: String,
    /// Extra keys under `amqp:` (indented two spaces).
    pub amqp_extra: String,
    /// Extra top-level sections (dedup, spool, limits, shutdown_grace, ...).
    pub extra: String,
    /// The route's `secrets:` list items (indented six spaces).
    pub secrets: String,
    /// Extra keys of the route (indented four spaces), e.g. `guard:` or `rate_limit:`.
    pub route_extra: String,
    /// Environment variables for the process.
    pub env: Vec<(String, String)>,
}

impl GatewayConfig {
    /// A plain-HTTP gateway on port 0 with a store in `dir`, publishing to `exchange`.
    pub fn new(dir: &Path, exchange: &str) -> Self {
        Self {
            dir: dir.to_owned(),
            store: dir.join("store"),
            exchange: exchange.to_owned(),
            amqp_url: AMQP_URL.to_owned(),
            confirm_timeout: "3s".to_owned(),
            tls: None,
            listen_addr: "127.0.0.1:0".to_owned(),
            admin_extra: String::new(),
            store_extra: String::new(),
            amqp_extra: String::new(),
            extra: String::new(),
            secrets: format!("      - secret: {SECRET}\n      - secret: {PREVIOUS_SECRET}\n"),
            route_extra: String::new(),
            env: Vec::new(),
        }
    }

    /// The route guard of contract §7 with its defaults.
    pub fn with_spec_guard(mut self) -> Self {
        self.route_extra.push_str(
            "    guard:\n      status:\n        events: [message.status, message.sent, message.delivered, message.failed]\n      keywords:\n        events: [message.received]\n",
        );
        self
    }

    /// The YAML text.
    pub fn yaml(&self) -> String {
        let tls = match &self.tls {
            Some((c, k)) => format!(
                "  tls:\n    cert: {}\n    key: {}\n",
                c.display(),
                k.display()
            ),
            None => String::new(),
        };
        format!(
            "listen:\n  addr: {listen}\n{tls}admin:\n  addr: 127.0.0.1:0\n{admin_extra}store:\n  path: {store}\n{store_extra}amqp:\n{url}  exchange: {exchange}\n  confirm_timeout: {confirm_timeout}\n{amqp_extra}{extra}routes:\n  - name: botix\n    path: /webhooks/botix\n    secrets:\n{secrets}{route_extra}",
            listen = self.listen_addr,
            admin_extra = self.admin_extra,
            store = self.store.display(),
            store_extra = self.store_extra,
            url = if self.amqp_url.is_empty() {
                String::new()
            } else {
                format!("  url: {}\n", self.amqp_url)
            },
            exchange = self.exchange,
            confirm_timeout = self.confirm_timeout,
            amqp_extra = self.amqp_extra,
            extra = self.extra,
            secrets = self.secrets,
            route_extra = self.route_extra,
        )
    }
}

/// An answer of the gateway: status, `Retry-After` and the body (JSON, or the text as a
/// JSON string).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub body: serde_json::Value,
}

/// A running gateway process. Killed when dropped.
pub struct Gateway {
    child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub https: bool,
    pub config_path: PathBuf,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Gateway {
    /// Starts the binary and waits for its "listening" log line.
    pub async fn start(cfg: &GatewayConfig) -> Self {
        let config_path = cfg
            .dir
            .join(format!("hookgate-{}.yaml", uuid::Uuid::new_v4().simple()));
        std::fs::write(&config_path, cfg.yaml()).expect("write config");
        let mut cmd = Command::new(gateway_binary());
        cmd.arg("run")
            .arg("--config")
            .arg(&config_path)
            .arg("--log-format")
            .arg("json")
            .env("RUST_LOG", "info,hookgate=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in &cfg.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn hookgate");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if v["message"] == "listening" {
                        let _ = tx.send((
                            v["addr"].as_str().unwrap_or("").to_owned(),
                            v["admin_addr"].as_str().unwrap_or("").to_owned(),
                        ));
                    }
                }
                sink.lock().expect("logs").push(line);
            }
        });
        let (addr, admin) =
            tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(20)))
                .await
                .expect("join")
                .unwrap_or_else(|_| {
                    panic!(
                        "gateway did not start listening; logs:\n{}",
                        logs.lock().expect("logs").join("\n")
                    )
                });
        Self {
            child,
            addr: addr.parse().expect("addr"),
            admin: admin.parse().expect("admin addr"),
            https: cfg.tls.is_some(),
            config_path,
            logs,
        }
    }

    /// URL of a webhook path.
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.addr)
    }

    /// URL of an admin path.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// GETs an admin endpoint: (status, body).
    pub async fn admin_get(&self, client: &reqwest::Client, path: &str) -> (u16, String) {
        let resp = client
            .get(self.admin_url(path))
            .send()
            .await
            .expect("admin request");
        let status = resp.status().as_u16();
        (status, resp.text().await.expect("admin body"))
    }

    /// Log lines so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().expect("logs").clone()
    }

    /// Polls an admin endpoint until `check(status, body)` holds or `timeout` passes; returns
    /// the last answer.
    pub async fn admin_until(
        &self,
        client: &reqwest::Client,
        path: &str,
        timeout: Duration,
        check: impl Fn(u16, &str) -> bool,
    ) -> (u16, String) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (status, body) = self.admin_get(client, path).await;
            if check(status, &body) || tokio::time::Instant::now() >= deadline {
                return (status, body);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Delivers a fresh event `id` (request id `req_<id>`) and asserts it was accepted.
    pub async fn accept(&self, client: &reqwest::Client, id: &str) {
        self.accept_body(client, id, &super::event_body(id)).await;
    }

    /// Delivers `body`, the event `id` (request id `req_<id>`), and asserts it was accepted.
    pub async fn accept_body(&self, client: &reqwest::Client, id: &str, body: &str) {
        let (status, answer) = self.deliver(client, body, &format!("req_{id}")).await;
        assert_eq!(status, 200, "{id}: {answer}");
        assert_eq!(
            answer,
            serde_json::json!({"status": "accepted", "event_id": id}),
            "{id}"
        );
    }

    /// Waits until a log line contains `needle`: lines are read from the process's stderr
    /// by a thread of their own, so one written just before an answer may still be on its
    /// way. False if none did within `timeout`.
    pub async fn logged(&self, needle: &str, timeout: Duration) -> bool {
        super::wait_until(timeout, || self.logs().iter().any(|l| l.contains(needle))).await
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal by name (TERM, INT, HUP, KILL).
    pub fn signal(&self, name: &str) {
        super::send_signal(self.child.id(), name);
    }

    /// Waits for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM, and a clean exit within 40 s (so the store is flushed and unlocked).
    pub async fn stop(&mut self) {
        self.signal("TERM");
        let status = self.wait_exit(Duration::from_secs(40)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "gateway did not stop cleanly: {status:?}"
        );
    }

    /// `kill -9` and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// POSTs a signed body to the botix route with a request id.
    pub async fn deliver(
        &self,
        client: &reqwest::Client,
        body: &str,
        request_id: &str,
    ) -> (u16, serde_json::Value) {
        let a = self.deliver_answer(client, body, request_id).await;
        (a.status, a.body)
    }

    /// [`Self::deliver`], with the answer's `Retry-After`.
    pub async fn deliver_answer(
        &self,
        client: &reqwest::Client,
        body: &str,
        request_id: &str,
    ) -> Answer {
        let headers = [
            ("x-botix-signature", sign(SECRET, body.as_bytes())),
            ("x-botix-request-id", request_id.to_owned()),
        ];
        self.post_answer(client, "/webhooks/botix", body, &headers)
            .await
    }

    /// POSTs `body` to the botix route with these headers.
    pub async fn post(
        &self,
        client: &reqwest::Client,
        body: &str,
        headers: &[(&str, String)],
    ) -> (u16, serde_json::Value) {
        self.post_to(client, "/webhooks/botix", body, headers).await
    }

    /// POSTs `body` to `path` (which may carry a query) with these headers.
    pub async fn post_to(
        &self,
        client: &reqwest::Client,
        path: &str,
        body: &str,
        headers: &[(&str, String)],
    ) -> (u16, serde_json::Value) {
        let a = self.post_answer(client, path, body, headers).await;
        (a.status, a.body)
    }

    /// POSTs `body` to `path` with these headers: the whole [`Answer`].
    pub async fn post_answer(
        &self,
        client: &reqwest::Client,
        path: &str,
        body: &str,
        headers: &[(&str, String)],
    ) -> Answer {
        let mut req = client.post(self.url(path)).body(body.to_owned());
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let resp = req.send().await.unwrap_or_else(|e| {
            panic!(
                "request: {e:?}; the gateway's log:\n{}",
                self.logs().join("\n")
            )
        });
        Answer::read(resp).await
    }
}

impl Answer {
    /// The status, `Retry-After` and body of `resp`; a body that is not JSON is kept as a
    /// JSON string.
    async fn read(resp: reqwest::Response) -> Self {
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().expect("ascii").to_owned());
        let text = resp.text().await.expect("body");
        Answer {
            status,
            retry_after,
            body: serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        }
    }
}

/// Delivers `body` under `request_id` to the botix route at `url` (a [`Gateway::url`]) in a
/// task of its own, for a delivery that hangs while the test goes on; the answer comes out
/// of the handle.
pub fn deliver_in_task(
    client: &reqwest::Client,
    url: String,
    body: &str,
    request_id: &str,
) -> tokio::task::JoinHandle<Answer> {
    let (client, body, request_id) = (client.clone(), body.to_owned(), request_id.to_owned());
    tokio::spawn(async move {
        let resp = client
            .post(url)
            .header("x-botix-signature", sign(SECRET, body.as_bytes()))
            .header("x-botix-request-id", request_id)
            .body(body)
            .send()
            .await
            .expect("answer");
        Answer::read(resp).await
    })
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An `admin.token_file` holding `token`, as the `admin:` keys of the test config.
pub fn admin_token_file(dir: &std::path::Path, token: &str) -> String {
    let path = dir.join("admin-token");
    std::fs::write(&path, format!("{token}\n")).expect("write token");
    format!("  token_file: {}\n", path.display())
}

/// Sends `method path` to the admin listener with `Authorization: Bearer token` when
/// given: (status, body).
pub async fn admin_change(
    gw: &Gateway,
    client: &reqwest::Client,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
) -> (u16, String) {
    let mut req = client.request(method, gw.admin_url(path));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.expect("admin request");
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("admin body"))
}
