//! Test harness: the real binary on port 0, a generated TLS certificate, real sled in a
//! temp dir, and the real RabbitMQ with a random exchange and queue per test.

#![allow(dead_code)]

pub mod broker;
pub mod cli;
pub mod disk;
pub mod fake_botix;
pub mod gateway;
pub mod inprocess;
pub mod metrics;
pub mod proxy;
pub mod raw;
pub mod scenarios;
pub mod shared_redis;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

pub use broker::Broker;
pub use broker::Received;
pub use cli::{hookgate, run_bounded};
pub use disk::fixture_on_small_disk;
pub use gateway::{
    admin_change, admin_token_file, deliver_in_task, Answer, Gateway, GatewayConfig,
};
pub use inprocess::InProcess;
pub use metrics::{scrape, Exposition};
pub use proxy::{Proxy, RABBITMQ};
pub use raw::{
    accept_on, raw_exchange, read_until, read_until_closed, read_until_closed_or, signed_request,
};
pub use scenarios::{concurrent_status_rounds, run_shared_scenarios};

/// The secret every test route accepts first.
pub const SECRET: &str = "whsec_test_8f2c1d9e4b7a6035";
/// The rotated-out secret, also accepted.
pub const PREVIOUS_SECRET: &str = "whsec_previous_51c0a7e2d94b";
/// The local broker.
pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Every broker await in tests is bounded by this.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(15);
/// Upper bound for anything that is polled for; generous for a loaded 2-core machine.
pub const POLL_DEADLINE: Duration = Duration::from_secs(20);

/// The usual start of a test: a temporary directory for the store, a fresh exchange with a
/// queue bound to every routing key, and a gateway config for both (to adjust, then start).
pub async fn fixture() -> (tempfile::TempDir, Broker, GatewayConfig) {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::new().await;
    let cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    (dir, broker, cfg)
}

/// [`fixture`] with the listener on TLS, with a certificate generated in the directory.
pub async fn tls_fixture() -> (tempfile::TempDir, Broker, TestCert, GatewayConfig) {
    let (dir, broker, mut cfg) = fixture().await;
    let cert = TestCert::generate(dir.path());
    cfg.tls = Some((cert.cert_path.clone(), cert.key_path.clone()));
    (dir, broker, cert, cfg)
}

/// Whether the broker can be used. When it is unreachable, tests skip with a loud message,
/// unless `HOOKGATE_REQUIRE_BROKER` is set (CI sets it): then they fail.
pub fn broker_available() -> bool {
    local_port_open(5672) || skip_or_fail("RabbitMQ is not reachable on 127.0.0.1:5672")
}

/// Whether something listens on `port` of this machine.
pub fn local_port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2))
        .is_ok()
}

/// A test cannot have what it needs (`why`): it fails when `HOOKGATE_REQUIRE_BROKER` is set
/// (CI sets it), else it is skipped with a loud message. Returns false, for the caller to
/// return early.
pub fn skip_or_fail(why: &str) -> bool {
    if std::env::var_os("HOOKGATE_REQUIRE_BROKER").is_some() {
        panic!("{why}, and HOOKGATE_REQUIRE_BROKER is set");
    }
    // Written to the process's stderr, not with `eprintln!`: the test harness captures the
    // macro's output of a passing test, and a skip must be seen on a developer's terminal.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "\n!!!!! SKIPPING: {why} (set HOOKGATE_REQUIRE_BROKER=1 to fail instead) !!!!!\n"
    );
    false
}

/// Sends the signal named `name` (TERM, INT, HUP, KILL) to process `pid`, with the
/// `kill(2)` system call.
pub fn send_signal(pid: u32, name: &str) {
    use rustix::process::{kill_process, Pid, Signal};
    let signal = match name {
        "TERM" => Signal::TERM,
        "INT" => Signal::INT,
        "HUP" => Signal::HUP,
        "KILL" => Signal::KILL,
        "STOP" => Signal::STOP,
        "CONT" => Signal::CONT,
        other => panic!("no signal named {other}"),
    };
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .expect("a child's process id");
    kill_process(pid, signal).unwrap_or_else(|e| panic!("kill -{name} {pid:?}: {e}"));
}

/// Skips the calling test (returns) when the broker is unavailable and not required.
#[macro_export]
macro_rules! require_broker {
    () => {
        if !$crate::util::broker_available() {
            return;
        }
    };
}

/// Waits until `/readyz` says the broker is connected (so a publish is not a spool or a
/// 503 for want of a connection).
pub async fn wait_broker_connected(client: &reqwest::Client, gw: &Gateway) {
    let deadline = tokio::time::Instant::now() + BROKER_TIMEOUT;
    loop {
        if let Ok(r) = client.get(gw.admin_url("/readyz")).send().await {
            if r.text()
                .await
                .unwrap_or_default()
                .contains("broker connected")
            {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker never connected; logs:\n{}",
            gw.logs().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A unique name for exchanges, queues and ids.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// The botix signature header for `body` under `secret`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    hookgate::providers::botix_header(secret.as_bytes(), body)
}

/// An RFC 3339 time `offset_secs` from now.
pub fn rfc3339_from_now(offset_secs: i64) -> String {
    let t = time::OffsetDateTime::now_utc() + time::Duration::seconds(offset_secs);
    t.format(&time::format_description::well_known::Rfc3339)
        .expect("format")
}

/// A status event whose timestamp is `ts_ms`.
pub fn status_at(event_id: &str, message_id: &str, status: &str, ts_ms: i64) -> String {
    serde_json::json!({
        "id": event_id,
        "event": "message.status",
        "timestamp": rfc3339_ms(ts_ms),
        "data": {"message_id": message_id, "status": status}
    })
    .to_string()
}

/// An inbound SMS (a keyword event) from `contact` to `channel` with `text`, at `ts_ms`.
pub fn keyword_between(
    event_id: &str,
    contact: &str,
    channel: &str,
    text: &str,
    ts_ms: i64,
) -> String {
    serde_json::json!({
        "id": event_id,
        "event": "message.received",
        "timestamp": rfc3339_ms(ts_ms),
        "data": {"message_id": format!("in_{event_id}"), "from": contact, "to": channel, "text": text}
    })
    .to_string()
}

/// A status event body with a fresh timestamp.
pub fn status_body(event_id: &str, message_id: &str, status: &str) -> String {
    serde_json::json!({
        "id": event_id,
        "event": "message.status",
        "timestamp": rfc3339_from_now(0),
        "data": {"message_id": message_id, "status": status}
    })
    .to_string()
}

/// A generic event body with a fresh timestamp.
pub fn event_body(event_id: &str) -> String {
    serde_json::json!({
        "id": event_id,
        "event": "contact.created",
        "timestamp": rfc3339_from_now(0),
        "data": {"contact_id": 1}
    })
    .to_string()
}

/// A self-signed certificate for 127.0.0.1 / localhost, written as PEM files in `dir`.
pub struct TestCert {
    pub cert_path: std::path::PathBuf,
    pub key_path: std::path::PathBuf,
    pub cert_pem: String,
    pub cert_der: Vec<u8>,
}

impl TestCert {
    pub fn generate(dir: &std::path::Path) -> Self {
        let ck = rcgen::generate_simple_self_signed(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ])
        .expect("cert");
        let cert_path = dir.join("tls.crt");
        let key_path = dir.join("tls.key");
        std::fs::write(&cert_path, ck.cert.pem()).expect("write cert");
        std::fs::write(&key_path, ck.signing_key.serialize_pem()).expect("write key");
        Self {
            cert_path,
            key_path,
            cert_pem: ck.cert.pem(),
            cert_der: ck.cert.der().to_vec(),
        }
    }
}

/// How long a test client keeps an idle connection for reuse: well under the gateway's
/// default `limits.header_read_timeout` (10 s), after which the gateway closes an idle
/// keep-alive connection. A client that reuses a connection the server is closing at that
/// moment sees the request fail (`IncompleteMessage`), as any HTTP client would.
const POOL_IDLE: Duration = Duration::from_secs(5);

/// A client that trusts `cert` (or any plain-HTTP server when `None`).
pub fn client(cert: Option<&TestCert>) -> reqwest::Client {
    hookgate::tls::install_crypto_provider();
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_idle_timeout(POOL_IDLE);
    if let Some(cert) = cert {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(
                cert.cert_der.clone(),
            ))
            .expect("root");
        let mut tls = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        builder = builder.tls_backend_preconfigured(tls);
    }
    builder.build().expect("client")
}

/// A plain-HTTP client that waits up to 120 s for an answer: as long as a frozen gateway,
/// or one waiting for a stopped replica, may take.
pub fn patient_client() -> reqwest::Client {
    hookgate::tls::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

/// A TCP connection to `addr` from the loopback address `from` (127.0.0.0/8 is all this
/// machine), so a test can play a second peer.
pub async fn connect_from(
    from: std::net::IpAddr,
    addr: std::net::SocketAddr,
) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind((from, 0).into())
        .expect("bind the client address");
    socket.connect(addr).await.expect("connect")
}

/// A plain-HTTP client whose connections come from the loopback address `from`.
pub fn client_from(from: std::net::IpAddr) -> reqwest::Client {
    hookgate::tls::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_idle_timeout(POOL_IDLE)
        .local_address(from)
        .build()
        .expect("client")
}

/// Polls `check` every 20 ms until it returns true or `timeout` passes.
pub async fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls an async check every 100 ms until it holds or the deadline passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The admin `/healthz` status.
pub async fn healthz(client: &reqwest::Client, gw: &Gateway) -> u16 {
    client
        .get(gw.admin_url("/healthz"))
        .send()
        .await
        .expect("healthz")
        .status()
        .as_u16()
}

/// A signed delivery of a fresh event; asserts the 200.
pub async fn deliver_ok(client: &reqwest::Client, gw: &Gateway, what: &str) {
    let id = unique("evt");
    let (status, answer) = gw.deliver(client, &event_body(&id), &unique("req")).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (200, Some("accepted")),
        "{what}: {answer}"
    );
}

/// The certificate the server presents to a new TLS connection; the client trusts `roots`.
pub async fn presented_cert(addr: SocketAddr, roots: &[&TestCert]) -> Result<Vec<u8>, String> {
    hookgate::tls::install_crypto_provider();
    let mut store = rustls::RootCertStore::empty();
    for c in roots {
        store
            .add(rustls::pki_types::CertificateDer::from(c.cert_der.clone()))
            .expect("root");
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(store)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let (_, conn) = tls.get_ref();
    let certs = conn.peer_certificates().ok_or("no peer certificate")?;
    Ok(certs[0].to_vec())
}

/// Milliseconds of the wall clock.
pub fn wall_ms() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp_nanos() as i64 / 1_000_000
}

/// RFC 3339 text of Unix milliseconds.
pub fn rfc3339_ms(ms: i64) -> String {
    hookgate::pipeline::rfc3339(ms)
}

/// `status` and `reason` of an answer as one string: `accepted`, `duplicate`,
/// `dropped:<reason>`.
pub fn outcome(answer: &serde_json::Value) -> String {
    match (answer["status"].as_str(), answer["reason"].as_str()) {
        (Some("dropped"), Some(reason)) => format!("dropped:{reason}"),
        (Some(status), _) => status.to_owned(),
        _ => format!("no status in {answer}"),
    }
}

/// Every message published before a sentinel: a fresh event sent through `gw` after the
/// requests under test, asserted accepted. It arrives after everything accepted before it,
/// so this sees all of them without guessing how long to wait.
pub async fn published_before_sentinel(
    client: &reqwest::Client,
    gw: &Gateway,
    broker: &Broker,
) -> Vec<Received> {
    let sentinel = unique("sentinel");
    gw.accept(client, &sentinel).await;
    broker.until(&sentinel).await
}

/// The message ids of [`published_before_sentinel`], in order.
pub async fn ids_before_sentinel(
    client: &reqwest::Client,
    gw: &Gateway,
    broker: &Broker,
) -> Vec<String> {
    ids(&published_before_sentinel(client, gw, broker).await)
}

/// An AMQP URL to a port of this machine that nothing listens on.
pub fn unreachable_amqp_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
}

/// The message ids of `messages`, in order.
pub fn ids(messages: &[broker::Received]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m.message_id.clone().unwrap_or_default())
        .collect()
}
