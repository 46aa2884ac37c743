//! Load generator and baselines for hookgate (results in BENCHMARKS.md).
//!
//! Load: pre-signs realistic botix deliveries (status events, some out of order; inbound
//! messages, a few of them keywords; a share of duplicates), then sends them closed-loop over
//! `--connections` connections, or open-loop at `--rate` requests/s with latency measured
//! from each request's intended send time (so a stall shows up in the percentiles instead of
//! slowing the sender down). Every run is bounded by `--requests` and by time.
//!
//! ```sh
//! cargo run --release --example load -- --url https://127.0.0.1:8443/webhooks/botix \
//!     --insecure --connections 64 --duration 20s --json out.json
//! cargo run --release --example load -- --url ... --insecure --rate 2000 --duration 20s
//! ```
//!
//! Baselines (the ceilings hookgate is compared with), same TLS config as hookgate:
//! `--serve-baseline http` reads the body and answers 200; `--serve-baseline publish` also
//! verifies the botix HMAC and publishes with a confirm through hookgate's own publisher
//! (the same channel owners, batches and pairing of returns; mandatory, persistent, the
//! message's properties and headers built by hookgate's own function); `--serve-baseline
//! durable` also appends a record per delivery to a log in `--log-dir` after the confirm and
//! answers once its group commit's `fdatasync` returned (`group_log.rs`): what durability
//! must cost on this machine. Helpers for bench/run-load.sh: `--gen-cert DIR`,
//! `--amqp-setup`, `--amqp-teardown`, and `--consume` (the handler behind the gateway,
//! draining the queue).

mod group_log;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use http::{header, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

// The same allocator as hookgate, so the baselines are not slower for want of it.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(about = "hookgate load generator and baselines")]
struct Cli {
    /// Target URL (http:// or https://).
    #[arg(long, default_value = "https://127.0.0.1:8443/webhooks/botix")]
    url: String,
    /// More targets (repeatable), e.g. the other replicas of one deployment behind no load
    /// balancer: connection i goes to the i-th of `--url` and these, round robin, so the
    /// pool of deliveries (its duplicates included) is spread over all of them.
    #[arg(long)]
    also_url: Vec<String>,
    /// Route secret used to sign the deliveries.
    #[arg(long, env = "LOAD_SECRET", default_value = "bench-secret")]
    secret: String,
    /// Concurrent requests in flight (HTTP/1.1: one connection each).
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// HTTP/2 connections the in-flight requests are spread over (with --http2).
    #[arg(long, default_value_t = 4)]
    h2_connections: usize,
    /// Measured time (after the warm-up).
    #[arg(long, default_value = "20s")]
    duration: humantime::Duration,
    /// Unmeasured time first (handshakes, broker channel warm-up).
    #[arg(long, default_value = "2s")]
    warmup: humantime::Duration,
    /// Open loop: requests per second, latency from the intended send time.
    #[arg(long)]
    rate: Option<f64>,
    /// Speak HTTP/2 (ALPN h2 over TLS, prior knowledge over plain HTTP).
    #[arg(long)]
    http2: bool,
    /// Accept any server certificate.
    #[arg(long)]
    insecure: bool,
    /// Trust this PEM certificate (chain) instead.
    #[arg(long)]
    ca: Option<PathBuf>,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// A label copied into the JSON (e.g. the target's name).
    #[arg(long, default_value = "")]
    label: String,
    /// Share of deliveries that repeat an earlier one (sender retry or manual re-send).
    #[arg(long, default_value_t = 0.05)]
    duplicates: f64,
    /// Share of status chains sent out of order (`delivered` before `sent`).
    #[arg(long, default_value_t = 0.05)]
    out_of_order: f64,
    /// Share of new events that are inbound messages (the rest are status events).
    #[arg(long, default_value_t = 0.3)]
    inbound: f64,
    /// Upper bound on requests sent (the pre-signed pool); default from rate or 400000.
    #[arg(long)]
    requests: Option<usize>,
    /// Per-request timeout (counted as an error).
    #[arg(long, default_value = "10s")]
    timeout: humantime::Duration,
    /// Seed of the delivery mix (event ids are unique per run anyway).
    #[arg(long, default_value_t = 8)]
    seed: u64,
    /// Run a baseline server instead of sending load.
    #[arg(long, value_enum)]
    serve_baseline: Option<Baseline>,
    /// Baseline listen address.
    #[arg(long, default_value = "127.0.0.1:8444")]
    listen: SocketAddr,
    /// Baseline TLS certificate (PEM); plain HTTP without --cert/--key.
    #[arg(long)]
    cert: Option<PathBuf>,
    /// Baseline TLS key (PEM).
    #[arg(long)]
    key: Option<PathBuf>,
    /// Folder of the durable baseline's log (created if missing).
    #[arg(long, default_value = "target/bench-durable")]
    log_dir: PathBuf,
    /// Broker for the publish baseline and the setup helpers.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp_url: String,
    /// Exchange for the publish baseline and the setup helpers.
    #[arg(long, default_value = "hookgate-bench")]
    exchange: String,
    /// Queue the setup helpers bind to the exchange with `#`.
    #[arg(long, default_value = "hookgate-bench")]
    queue: String,
    /// Write a self-signed certificate for 127.0.0.1/localhost (tls.crt, tls.key) to DIR.
    #[arg(long)]
    gen_cert: Option<PathBuf>,
    /// Declare the exchange and a durable, length-capped queue bound with `#`, then exit.
    #[arg(long)]
    amqp_setup: bool,
    /// With --amqp-setup: a transient queue instead (the broker then writes no message to
    /// disk, so its fsync latency drops out of the measurement).
    #[arg(long)]
    transient_queue: bool,
    /// With --amqp-setup: the classic queue's storage version (`x-queue-version`, 1 or 2;
    /// RabbitMQ 3.10–3.13 default to 1, 4.x has only 2). Default: the broker's.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=2))]
    queue_version: Option<u8>,
    /// Delete the queue and the exchange, then exit.
    #[arg(long)]
    amqp_teardown: bool,
    /// Consume `--queue` (auto-ack) until killed: the handler behind the gateway, so the
    /// queue stays short as in production instead of filling up during the run.
    #[arg(long)]
    consume: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Baseline {
    /// Read the body, answer 200.
    Http,
    /// Verify the HMAC, publish with a confirm, answer 200.
    Publish,
    /// As `publish`, then append a record to a log and answer once its group commit synced.
    Durable,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Some(dir) = &cli.gen_cert {
        return gen_cert(dir);
    }
    // The open loop runs on one thread: at a paced rate each request is woken through alone,
    // and a pacer thread handing it to runtime workers woke two threads per request. On one
    // thread the client used a fifth less CPU. The closed loop
    // and the servers need both cores.
    let rt = if cli.rate.is_some() && cli.serve_baseline.is_none() && !cli.consume {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build()?;
    if cli.amqp_setup || cli.amqp_teardown {
        return rt.block_on(amqp_admin(&cli));
    }
    if cli.consume {
        return rt.block_on(consume(&cli));
    }
    match cli.serve_baseline {
        Some(kind) => rt.block_on(serve_baseline(&cli, kind)),
        None => rt.block_on(run_load(&cli)),
    }
}

// ---------------------------------------------------------------------------------------
// The delivery mix

/// Deliveries in the pool per millisecond of their timestamps: a pool of a million spans
/// 10 s.
const DELIVERIES_PER_MS: i64 = 100;

/// One pre-signed delivery.
struct Delivery {
    body: Bytes,
    signature: HeaderValue,
    request_id: HeaderValue,
    event: HeaderValue,
    attempt: HeaderValue,
}

/// Builds `n` deliveries. Status chains (`sent` then `delivered`) are interleaved with other
/// traffic; `out_of_order` of them arrive reversed, so hookgate drops the late `sent` as
/// `stale_status`. `duplicates` repeat a recent delivery: half as a retry (same request id,
/// attempt 2), half as a manual re-send (new request id); both are duplicates by event id.
fn build_pool(cli: &Cli, n: usize) -> Vec<Delivery> {
    let mut rng = StdRng::seed_from_u64(cli.seed);
    let run = uuid::Uuid::new_v4().simple().to_string()[..10].to_owned();
    let secret = cli.secret.as_bytes();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let mut pool: Vec<Delivery> = Vec::with_capacity(n);
    let mut pending: VecDeque<(String, String)> = VecDeque::new();
    let mut seq = 0u64;
    let mut next_id = |prefix: &str| {
        seq += 1;
        format!("{prefix}_{run}_{seq}")
    };
    let texts = [
        "Hi, can you confirm my appointment for tomorrow at 10am? Thanks!",
        "Yes please, the blue one",
        "What time do you close today?",
        "ok",
        "Running 10 minutes late, sorry. See you soon.",
    ];
    while pool.len() < n {
        let roll: f64 = rng.random();
        if roll < cli.duplicates && !pool.is_empty() {
            let back = rng.random_range(0..pool.len().min(2000));
            let original = &pool[pool.len() - 1 - back];
            let request_id = if rng.random_bool(0.5) {
                original.request_id.clone()
            } else {
                header_value(&next_id("req"))
            };
            let d = Delivery {
                body: original.body.clone(),
                signature: original.signature.clone(),
                request_id,
                event: original.event.clone(),
                attempt: HeaderValue::from_static("2"),
            };
            pool.push(d);
            continue;
        }
        if !pending.is_empty() && rng.random_bool(0.5) {
            if let Some((event, body)) = pending.pop_front() {
                pool.push(sign(secret, &event, body, &next_id("req")));
            }
            continue;
        }
        // Timestamps rise with the pool but slower than any run sends it: at one millisecond
        // a delivery, a pool of a million would reach 1,000 s ahead of the clock, and
        // hookgate would drop every delivery past its clock skew (300 s) as
        // `future_timestamp`, which costs it almost nothing.
        let ts = now_ms + pool.len() as i64 / DELIVERIES_PER_MS;
        let id = next_id("evt");
        if rng.random_bool(cli.inbound.clamp(0.0, 1.0)) {
            let contact = rng.random_range(0..5000);
            let text = match rng.random_range(0..100) {
                0 => "STOP",
                1 => "Start",
                2 => "help",
                _ => texts[rng.random_range(0..texts.len())],
            };
            let body = serde_json::json!({
                "id": id, "event": "message.received", "timestamp": ts / 1000,
                "data": {
                    "message_id": next_id("msg"),
                    "from": format!("+1555{contact:07}"), "to": "+15551230000",
                    "text": text, "channel": "sms", "media": [],
                },
            })
            .to_string();
            pool.push(sign(secret, "message.received", body, &next_id("req")));
        } else {
            let message_id = next_id("msg");
            let status = |id: &str, status: &str, ts: i64| {
                serde_json::json!({
                    "id": id, "event": "message.status",
                    "timestamp": hookgate::pipeline::rfc3339(ts),
                    "data": {
                        "message_id": message_id, "status": status,
                        "to": "+15557654321", "from": "+15551230000",
                        "segments": 1, "error_code": null,
                        "price": {"amount": "0.0075", "currency": "USD"},
                    },
                })
                .to_string()
            };
            let sent = status(&id, "sent", ts);
            let delivered = status(&next_id("evt"), "delivered", ts + 1500);
            let (first, later) = if rng.random_bool(cli.out_of_order.clamp(0.0, 1.0)) {
                (delivered, sent)
            } else {
                (sent, delivered)
            };
            pool.push(sign(secret, "message.status", first, &next_id("req")));
            pending.push_back(("message.status".into(), later));
        }
    }
    pool
}

fn sign(secret: &[u8], event: &str, body: String, request_id: &str) -> Delivery {
    let signature = hookgate::providers::botix_header(secret, body.as_bytes());
    Delivery {
        body: Bytes::from(body),
        signature: header_value(&signature),
        request_id: header_value(request_id),
        event: header_value(event),
        attempt: HeaderValue::from_static("1"),
    }
}

fn header_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

// ---------------------------------------------------------------------------------------
// The client

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    /// Another handle to the same connection: HTTP/2 multiplexes, HTTP/1.1 cannot.
    fn share(&self) -> Option<Sender> {
        match self {
            Sender::H1(_) => None,
            Sender::H2(s) => Some(Sender::H2(s.clone())),
        }
    }

    async fn send(&mut self, req: Request<Full<Bytes>>) -> hyper::Result<Response<Incoming>> {
        match self {
            Sender::H1(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
            Sender::H2(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
        }
    }
}

struct Target {
    addr: SocketAddr,
    uri: Uri,
    path: Uri,
    host: HeaderValue,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    http2: bool,
}

impl Target {
    fn new(cli: &Cli, url: &str) -> Result<Self> {
        let uri: Uri = url.parse().context("--url")?;
        let authority = uri.authority().context("--url needs host:port")?.clone();
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => bail!("--url must be http:// or https://"),
        };
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))?
            .next()
            .context("--url host does not resolve")?;
        if !addr.ip().is_loopback() {
            bail!("only loopback targets are allowed ({addr})");
        }
        let tls = if https {
            let mut config = if cli.insecure {
                rustls::ClientConfig::builder()
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyCert::new()))
                    .with_no_client_auth()
            } else {
                let ca = cli
                    .ca
                    .as_ref()
                    .context("https needs --ca FILE or --insecure")?;
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(ca)? {
                    roots.add(cert?)?;
                }
                rustls::ClientConfig::builder()
                    .with_root_certificates(roots)
                    .with_no_client_auth()
            };
            config.alpn_protocols = vec![if cli.http2 {
                b"h2".to_vec()
            } else {
                b"http/1.1".to_vec()
            }];
            let name = ServerName::try_from(host.to_owned())?;
            Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
        } else {
            None
        };
        let path: Uri = uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .parse()?;
        Ok(Self {
            addr,
            host: HeaderValue::from_str(authority.as_str())?,
            uri,
            path,
            tls,
            http2: cli.http2,
        })
    }

    async fn connect(&self) -> Result<Sender> {
        let tcp = TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let io: Box<dyn Io> = match &self.tls {
            Some((connector, name)) => Box::new(connector.connect(name.clone(), tcp).await?),
            None => Box::new(tcp),
        };
        let io = TokioIo::new(io);
        if self.http2 {
            let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake(io)
                .await?;
            tokio::spawn(conn);
            Ok(Sender::H2(send))
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io).await?;
            tokio::spawn(conn);
            Ok(Sender::H1(send))
        }
    }

    fn request(&self, d: &Delivery) -> Result<Request<Full<Bytes>>> {
        // HTTP/2 needs scheme and authority in the URI; HTTP/1.1 sends the path and Host.
        let uri = if self.http2 { &self.uri } else { &self.path };
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(uri.clone())
            .body(Full::new(d.body.clone()))?;
        let h = req.headers_mut();
        if !self.http2 {
            h.insert(header::HOST, self.host.clone());
        }
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert("x-botix-signature", d.signature.clone());
        h.insert("x-botix-request-id", d.request_id.clone());
        h.insert("x-botix-event", d.event.clone());
        h.insert("x-delivery-attempt", d.attempt.clone());
        Ok(req)
    }
}

/// `--insecure`: any certificate, signatures still checked with ring's algorithms.
#[derive(Debug)]
struct AnyCert(rustls::crypto::WebPkiSupportedAlgorithms);

impl AnyCert {
    fn new() -> Self {
        Self(rustls::crypto::ring::default_provider().signature_verification_algorithms)
    }
}

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// What one worker saw.
struct Tally {
    latency_us: Histogram<u64>,
    /// Open loop: how late this client started each measured request (its own share of the
    /// latency: a busy client, or a late wake-up of the pacer or a worker).
    send_lag_us: Histogram<u64>,
    statuses: BTreeMap<u16, u64>,
    outcomes: BTreeMap<&'static str, u64>,
    errors: BTreeMap<String, u64>,
    /// Responses in the measured window (intended at or after its start, done by its end).
    completed: u64,
    sent: u64,
    /// `accepted` answers over the whole run, warm-up included (for CPU per event).
    accepted_total: u64,
}

/// A histogram of microseconds: 1 µs .. 120 s at 3 significant figures.
fn micros_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds")
}

impl Tally {
    fn new() -> Self {
        Self {
            latency_us: micros_histogram(),
            send_lag_us: micros_histogram(),
            statuses: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            errors: BTreeMap::new(),
            completed: 0,
            sent: 0,
            accepted_total: 0,
        }
    }

    fn merge(&mut self, other: Tally) {
        let _ = self.latency_us.add(&other.latency_us);
        let _ = self.send_lag_us.add(&other.send_lag_us);
        for (k, v) in other.statuses {
            *self.statuses.entry(k).or_default() += v;
        }
        for (k, v) in other.outcomes {
            *self.outcomes.entry(k).or_default() += v;
        }
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        self.completed += other.completed;
        self.sent += other.sent;
        self.accepted_total += other.accepted_total;
    }
}

struct Plan {
    pool: Vec<Delivery>,
    next: AtomicUsize,
    start: Instant,
    measure_from: Instant,
    end: Instant,
    rate: Option<f64>,
    timeout: Duration,
    /// Open loop: one permit per request, released by [`pace`] at its intended send time.
    due: Semaphore,
}

impl Plan {
    /// When request `i` is meant to go (open loop).
    fn intended(&self, i: usize, rate: f64) -> Instant {
        self.start + Duration::from_secs_f64(i as f64 / rate)
    }

    /// Requests an open loop at `rate` sends: those meant to go before the end.
    fn open_loop_count(&self, rate: f64) -> usize {
        let span = self.end.saturating_duration_since(self.start).as_secs_f64();
        ((span * rate).ceil() as usize).min(self.pool.len())
    }

    /// The next request and when it is meant to go, or `None` when the run is over. In an
    /// open loop it waits for the request's permit, so it returns at its intended time.
    async fn take(&self) -> Option<(usize, Instant)> {
        if self.rate.is_some() {
            self.due.acquire().await.ok()?.forget();
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        if i >= self.pool.len() {
            return None;
        }
        let intended = match self.rate {
            Some(rate) => self.intended(i, rate),
            None => Instant::now(),
        };
        (intended < self.end).then_some((i, intended))
    }
}

/// The open loop's clock: releases each request's permit at its intended time. It waits on a
/// timerfd in the runtime's own epoll set, so it wakes within microseconds of each intended
/// time (tokio's timer ticks every millisecond, which added up to a millisecond of the
/// client's own delay to every measured latency) and, on the single-threaded runtime the
/// open loop runs on, hands the permit to a worker without waking another thread. Permits of
/// requests whose time has passed (a late wake-up) are released together, so the latency of
/// each is still counted from its intended time.
async fn pace(plan: Arc<Plan>, rate: f64, workers: usize) -> Result<()> {
    let timer = MicroTimer::new().context("timerfd")?;
    let count = plan.open_loop_count(rate);
    let mut released = 0;
    while released < count {
        let elapsed = plan.start.elapsed().as_secs_f64();
        // Requests 0..=k are due once start + k / rate has passed.
        let due = ((elapsed * rate).floor() as usize + 1).min(count);
        if due > released {
            plan.due.add_permits(due - released);
            released = due;
        }
        if released < count {
            let wait = plan
                .intended(released, rate)
                .saturating_duration_since(Instant::now());
            timer.sleep(wait).await.context("timerfd")?;
        }
    }
    // One more for each worker: it takes no request with it and ends.
    plan.due.add_permits(workers);
    Ok(())
}

/// A one-shot timer with microsecond resolution, waited on through the runtime's reactor.
struct MicroTimer(AsyncFd<OwnedFd>);

impl MicroTimer {
    fn new() -> std::io::Result<Self> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // tokio deprecated `with_interest` because a type whose `as_raw_fd` could close or
        // change its descriptor would break I/O safety; its replacement is an `unsafe fn`,
        // which this crate forbids. An `OwnedFd` keeps its descriptor open, and the same one,
        // for as long as the `AsyncFd` owns it, so the call is sound here.
        #[allow(deprecated)]
        Ok(Self(AsyncFd::with_interest(fd, Interest::READABLE)?))
    }

    async fn sleep(&self, wait: Duration) -> std::io::Result<()> {
        // A zero it_value disarms the timer instead of firing it.
        if wait.is_zero() {
            return Ok(());
        }
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let value = Timespec::try_from(wait).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        timerfd_settime(
            self.0.get_ref(),
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: zero,
                it_value: value,
            },
        )?;
        loop {
            let mut ready = self.0.readable().await?;
            let mut expirations = [0u8; 8];
            match ready.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut expirations)?)) {
                Ok(result) => {
                    result?;
                    // The read emptied the timer: the next wait must wait for a new expiry.
                    ready.clear_ready();
                    return Ok(());
                }
                // Readiness left over from an earlier expiry: try_io cleared it; wait again.
                Err(_would_block) => continue,
            }
        }
    }
}

async fn worker(plan: Arc<Plan>, target: Arc<Target>, mut sender: Option<Sender>) -> Tally {
    let mut tally = Tally::new();
    while let Some((i, intended)) = plan.take().await {
        let measured = intended >= plan.measure_from;
        if measured && plan.rate.is_some() {
            let lag = intended.elapsed().as_micros() as u64;
            let _ = tally.send_lag_us.record(lag.max(1));
        }
        let result = tokio::time::timeout(plan.timeout, async {
            if sender.is_none() {
                sender = Some(target.connect().await?);
            }
            let req = target.request(&plan.pool[i])?;
            let Some(s) = sender.as_mut() else {
                bail!("no connection");
            };
            let resp = s.send(req).await?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), 1 << 20)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("body: {e}"))?
                .to_bytes();
            anyhow::Ok((status, body))
        })
        .await;
        tally.sent += 1;
        let done = Instant::now();
        match result {
            Ok(Ok((status, body))) => {
                let outcome = outcome_of(&body);
                if status == StatusCode::OK && outcome == "accepted" {
                    tally.accepted_total += 1;
                }
                if !measured {
                    continue;
                }
                let us = done.saturating_duration_since(intended).as_micros() as u64;
                let _ = tally.latency_us.record(us.max(1));
                *tally.statuses.entry(status.as_u16()).or_default() += 1;
                if status == StatusCode::OK {
                    *tally.outcomes.entry(outcome).or_default() += 1;
                }
                if done <= plan.end {
                    tally.completed += 1;
                }
            }
            Ok(Err(e)) => {
                sender = None;
                *tally.errors.entry(short_error(&e.to_string())).or_default() += 1;
                // A refused connection must not spin: retry after a pause, within the run.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) => {
                sender = None;
                *tally.errors.entry("timeout".into()).or_default() += 1;
            }
        }
    }
    tally
}

fn outcome_of(body: &[u8]) -> &'static str {
    let has = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    if has(br#""status":"accepted""#) {
        "accepted"
    } else if has(br#""status":"duplicate""#) {
        "duplicate"
    } else if has(br#""status":"dropped""#) {
        "dropped"
    } else {
        "other"
    }
}

fn short_error(e: &str) -> String {
    e.chars().take(80).collect()
}

async fn run_load(cli: &Cli) -> Result<()> {
    if cli.connections == 0 {
        bail!("--connections must be at least 1");
    }
    if cli.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        bail!("--rate must be a positive number of requests per second");
    }
    let targets = std::iter::once(&cli.url)
        .chain(&cli.also_url)
        .map(|url| Target::new(cli, url).map(Arc::new))
        .collect::<Result<Vec<_>>>()?;
    let duration: Duration = cli.duration.into();
    let warmup: Duration = cli.warmup.into();
    let total = warmup + duration;
    let n = cli.requests.unwrap_or(match cli.rate {
        // One second more than the run needs: the run ends by time, not by running dry.
        Some(rate) => (rate * (total.as_secs_f64() + 1.0)).ceil() as usize,
        None => 400_000,
    });
    let built = Instant::now();
    let pool = build_pool(cli, n);
    eprintln!(
        "pre-signed {} deliveries in {:.1}s",
        pool.len(),
        built.elapsed().as_secs_f64()
    );

    // Connect before the clock starts, so the warm-up is not spent in handshakes only.
    let mut senders = Vec::new();
    let conns = if cli.http2 {
        cli.h2_connections.clamp(1, cli.connections)
    } else {
        cli.connections
    };
    for c in 0..conns {
        let target = &targets[c % targets.len()];
        senders.push(Some(target.connect().await.context("connect")?));
    }
    let start = Instant::now();
    let measure_from = start + warmup;
    let plan = Arc::new(Plan {
        pool,
        next: AtomicUsize::new(0),
        start,
        measure_from,
        end: start + total,
        rate: cli.rate,
        timeout: cli.timeout.into(),
        due: Semaphore::new(0),
    });
    let pacer = cli
        .rate
        .map(|rate| tokio::spawn(pace(plan.clone(), rate, cli.connections)));
    let mut tasks = Vec::new();
    for w in 0..cli.connections {
        let (conn, sender) = if cli.http2 {
            (
                w % conns,
                senders[w % conns].as_ref().and_then(Sender::share),
            )
        } else {
            (w, senders[w].take())
        };
        let target = targets[conn % targets.len()].clone();
        tasks.push(tokio::spawn(worker(plan.clone(), target, sender)));
    }
    let window_start = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from.into()).await;
        CpuSnapshot::take()
    });
    let mut tally = Tally::new();
    for t in tasks {
        tally.merge(t.await?);
    }
    let cpu = window_start
        .await?
        .zip(CpuSnapshot::take())
        .map(|(a, b)| b.since(&a));
    if let Some(pacer) = pacer {
        pacer.await??;
    }
    let exhausted = plan.next.load(Ordering::Relaxed) >= plan.pool.len();
    report(cli, &tally, duration, exhausted, cpu)
}

/// CPU time counters of the whole machine and of this client, from `/proc` (Linux). Over the
/// measured window they tell whether the machine had a core to spare at the tested load:
/// here the client, the servers, the broker and the consumer all share the same cores.
struct CpuSnapshot {
    /// All cores' time (user, nice, system, idle, iowait, irq, softirq, steal), in ticks.
    total: u64,
    /// The part of `total` not idle and not waiting for IO.
    busy: u64,
    /// This process's user and system time, in the same ticks.
    own: u64,
}

/// Shares of the machine's CPU time (all cores together) over a window.
struct CpuShares {
    machine_busy: f64,
    client: f64,
}

impl CpuSnapshot {
    fn take() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let ticks: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let total = ticks.iter().sum();
        let idle = ticks.get(3)? + ticks.get(4)?;
        let own_stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name may hold spaces; utime and stime are the 12th and 13th fields
        // after its closing parenthesis.
        let mut fields = own_stat.rsplit_once(')')?.1.split_whitespace().skip(11);
        let utime: u64 = fields.next()?.parse().ok()?;
        let stime: u64 = fields.next()?.parse().ok()?;
        Some(Self {
            total,
            busy: total.saturating_sub(idle),
            own: utime + stime,
        })
    }

    fn since(&self, earlier: &Self) -> CpuShares {
        let total = self.total.saturating_sub(earlier.total).max(1) as f64;
        CpuShares {
            machine_busy: self.busy.saturating_sub(earlier.busy) as f64 / total,
            client: self.own.saturating_sub(earlier.own) as f64 / total,
        }
    }
}

fn report(
    cli: &Cli,
    t: &Tally,
    duration: Duration,
    exhausted: bool,
    cpu: Option<CpuShares>,
) -> Result<()> {
    let secs = duration.as_secs_f64();
    let rps = t.completed as f64 / secs;
    // Accepted share of the measured answers, applied to those done within the window.
    let answered: u64 = t.outcomes.values().sum::<u64>().max(1);
    let accepted = t.outcomes.get("accepted").copied().unwrap_or(0) * t.completed / answered;
    let h = &t.latency_us;
    let q = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let mode = match cli.rate {
        Some(r) => format!("open loop at {r} req/s"),
        None => format!("closed loop, {} in flight", cli.connections),
    };
    let errors: u64 = t.errors.values().sum();
    println!(
        "{} {}{} ({}, {}), {}s measured",
        cli.label,
        cli.url,
        cli.also_url
            .iter()
            .map(|u| format!(" + {u}"))
            .collect::<String>(),
        mode,
        if cli.http2 { "HTTP/2" } else { "HTTP/1.1" },
        secs
    );
    println!(
        "  requests/s {rps:.0}   accepted events/s {:.0}   errors {errors}",
        accepted as f64 / secs
    );
    println!("  statuses {:?}  outcomes {:?}", t.statuses, t.outcomes);
    if errors > 0 {
        println!("  errors {:?}", t.errors);
    }
    println!(
        "  latency ms  p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}  (n={})",
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999),
        h.max() as f64 / 1000.0,
        h.len()
    );
    let lag = &t.send_lag_us;
    let lag_q = |q: f64| lag.value_at_quantile(q) as f64 / 1000.0;
    if cli.rate.is_some() {
        println!(
            "  send lag ms (client side, included above)  p50 {:.2}  p99 {:.2}  max {:.2}",
            lag_q(0.5),
            lag_q(0.99),
            lag.max() as f64 / 1000.0
        );
    }
    if let Some(cpu) = &cpu {
        println!(
            "  machine CPU busy {:.0} % of all cores (this client {:.0} %), over the measured window",
            cpu.machine_busy * 100.0,
            cpu.client * 100.0
        );
    }
    if exhausted {
        println!("  note: the pool of pre-signed requests ran out before the time did (raise --requests)");
    }
    if let Some(rate) = cli.rate {
        if rps < rate * 0.95 {
            println!("  note: achieved {rps:.0} req/s < target {rate}: the target (or this client) is saturated");
        }
    }
    if let Some(path) = &cli.json {
        let v = serde_json::json!({
            "label": cli.label,
            "url": cli.url,
            "also_url": cli.also_url,
            "http2": cli.http2,
            "connections": cli.connections,
            "rate": cli.rate,
            "duration_s": secs,
            "warmup_s": Duration::from(cli.warmup).as_secs_f64(),
            "duplicates": cli.duplicates,
            "out_of_order": cli.out_of_order,
            "requests_sent": t.sent,
            "completed": t.completed,
            "accepted_total": t.accepted_total,
            "requests_per_s": rps,
            "accepted_per_s": accepted as f64 / secs,
            "statuses": t.statuses,
            "outcomes": t.outcomes,
            "errors": t.errors,
            "pool_exhausted": exhausted,
            "latency_ms": {
                "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p99_9": q(0.999),
                "max": h.max() as f64 / 1000.0, "mean": h.mean() / 1000.0, "count": h.len(),
            },
            "machine_cpu_busy_share": cpu.as_ref().map(|c| c.machine_busy),
            "client_cpu_share": cpu.as_ref().map(|c| c.client),
            "send_lag_ms": cli.rate.map(|_| serde_json::json!({
                "p50": lag_q(0.5), "p99": lag_q(0.99), "max": lag.max() as f64 / 1000.0,
            })),
        });
        std::fs::write(path, serde_json::to_vec_pretty(&v)?)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Baselines

struct Publish {
    publisher: hookgate::outbox::publish::Publisher,
    exchange: String,
    scheme: hookgate::providers::Scheme,
    secrets: Vec<hookgate::ingress::secrets::Secret>,
    /// The durable baseline's log; `None` for the publish baseline.
    log: Option<group_log::GroupLog>,
}

async fn serve_baseline(cli: &Cli, kind: Baseline) -> Result<()> {
    use hyper_util::server::conn::auto;
    let tls = match (&cli.cert, &cli.key) {
        (Some(cert), Some(key)) => Some(Arc::new(hookgate::tls::TlsReloader::new(
            hookgate::config::Tls {
                cert: cert.clone(),
                key: key.clone(),
            },
        )?)),
        (None, None) => None,
        _ => bail!("--cert and --key go together"),
    };
    let publish = match kind {
        Baseline::Http => None,
        Baseline::Publish => Some(Arc::new(connect_publish(cli, None).await?)),
        Baseline::Durable => {
            std::fs::create_dir_all(&cli.log_dir)?;
            let path = cli
                .log_dir
                .join(format!("durable-{}.log", std::process::id()));
            let log = group_log::GroupLog::open(&path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            Some(Arc::new(connect_publish(cli, Some(log)).await?))
        }
    };
    let listener = TcpListener::bind(cli.listen).await?;
    println!("baseline {kind:?} listening on {}", listener.local_addr()?);
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (tls, builder, publish) = (tls.clone(), builder.clone(), publish.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let publish = publish.clone();
                async move { Ok::<_, std::convert::Infallible>(baseline_answer(req, publish).await) }
            });
            let result = match tls {
                Some(tls) => match tls.accept(stream).await {
                    Ok(s) => builder.serve_connection(TokioIo::new(s), service).await,
                    Err(_) => return,
                },
                None => {
                    builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                }
            };
            drop(result);
        });
    }
}

async fn baseline_answer(
    req: Request<Incoming>,
    publish: Option<Arc<Publish>>,
) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let answer = |status: StatusCode, body: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    };
    let Ok(body) = Limited::new(body, 64 * 1024).collect().await else {
        return answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            r#"{"error":"payload_too_large"}"#,
        );
    };
    let body = body.to_bytes();
    let Some(p) = publish else {
        return answer(StatusCode::OK, r#"{"status":"accepted"}"#);
    };
    if p.scheme
        .verify(&parts.headers, &body, &p.secrets, 0)
        .is_err()
    {
        return answer(StatusCode::UNAUTHORIZED, r#"{"error":"invalid_signature"}"#);
    }
    let text = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    // The message hookgate would publish for this delivery (same properties and headers),
    // so the broker's work per message is the same for both servers.
    let request_id = text("x-botix-request-id");
    let event_type = text("x-botix-event");
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let msg = hookgate::outbox::message::Message {
        routing_key: event_type.as_str().into(),
        message_id: request_id.as_str().into(),
        timestamp_secs: (now_ms / 1000) as u64,
        request_id: request_id.as_str().into(),
        event_type: event_type.as_str().into(),
        attempt: text("x-delivery-attempt").parse().ok(),
        route: "botix".into(),
        received_at: hookgate::pipeline::rfc3339(now_ms).into(),
        order_key: None,
        body: body.clone(),
        content_type: None,
        traceparent: None,
        tracestate: None,
    };
    match p.publisher.publish(&p.exchange, &msg).await {
        Ok(()) => match &p.log {
            None => answer(StatusCode::OK, r#"{"status":"accepted"}"#),
            // The record is about as large as hookgate's two done marks (digest and value
            // each): the request id and the moment it was accepted.
            Some(log) => {
                let mut record = Vec::with_capacity(request_id.len() + 9);
                record.extend_from_slice(request_id.as_bytes());
                record.extend_from_slice(&now_ms.to_le_bytes());
                record.push(b'\n');
                match log.append(record).await {
                    Ok(()) => answer(StatusCode::OK, r#"{"status":"accepted"}"#),
                    Err(_) => answer(
                        StatusCode::SERVICE_UNAVAILABLE,
                        r#"{"error":"unavailable"}"#,
                    ),
                }
            }
        },
        Err(hookgate::outbox::publish::PublishError::Unfit(_)) => {
            answer(StatusCode::BAD_REQUEST, r#"{"error":"bad_request"}"#)
        }
        Err(_) => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":"unavailable"}"#,
        ),
    }
}

async fn connect_publish(cli: &Cli, log: Option<group_log::GroupLog>) -> Result<Publish> {
    // hookgate's publisher: its connection, channel owners and confirm handling.
    let config = hookgate::config::Amqp {
        url: cli.amqp_url.clone(),
        exchange: cli.exchange.clone(),
        declare: false,
        confirm_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let nodes = hookgate::outbox::publish::BrokerNodes::parse(&config)?;
    let publisher = hookgate::outbox::publish::Publisher::start(
        config,
        nodes,
        Arc::new(hookgate::metrics::Metrics::new()),
        tokio_util::sync::CancellationToken::new(),
    );
    tokio::time::timeout(Duration::from_secs(10), publisher.wait_connected())
        .await
        .context("the publish baseline cannot reach the broker")?;
    Ok(Publish {
        publisher,
        exchange: cli.exchange.clone(),
        scheme: hookgate::providers::Scheme::new(hookgate::providers::BodyHmac {
            header: http::HeaderName::from_static(hookgate::providers::BOTIX_SIGNATURE),
            prefix: Some("sha256=".into()),
            encoding: hookgate::config::Encoding::Hex,
        }),
        secrets: vec![hookgate::ingress::secrets::Secret::new(
            cli.secret.as_bytes(),
        )],
        log,
    })
}

// ---------------------------------------------------------------------------------------
// Helpers for bench/run-load.sh

fn gen_cert(dir: &std::path::Path) -> Result<()> {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])?;
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("tls.crt"), ck.cert.pem())?;
    std::fs::write(dir.join("tls.key"), ck.signing_key.serialize_pem())?;
    Ok(())
}

async fn consume(cli: &Cli) -> Result<()> {
    use futures_util::StreamExt;
    let connection =
        lapin::Connection::connect(&cli.amqp_url, lapin::ConnectionProperties::default()).await?;
    let ch = connection.create_channel().await?;
    ch.basic_qos(1000, Default::default()).await?;
    let mut consumer = ch
        .basic_consume(
            cli.queue.as_str().into(),
            "hookgate-bench-consumer".into(),
            lapin::options::BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await?;
    println!("consuming {}", cli.queue);
    let mut count: u64 = 0;
    while let Some(delivery) = consumer.next().await {
        delivery?;
        count += 1;
    }
    println!("consumed {count} messages");
    Ok(())
}

async fn amqp_admin(cli: &Cli) -> Result<()> {
    use lapin::options::{
        ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
        QueueDeleteOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    let connection =
        lapin::Connection::connect(&cli.amqp_url, lapin::ConnectionProperties::default()).await?;
    let ch = connection.create_channel().await?;
    if cli.amqp_setup {
        ch.exchange_declare(
            cli.exchange.as_str().into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
        // Durable, like a production queue, so persistent messages cost the broker what they
        // cost in production; capped so a long run cannot fill the shared broker's disk.
        let mut args = FieldTable::default();
        args.insert("x-max-length".into(), AMQPValue::LongInt(100_000));
        if let Some(version) = cli.queue_version {
            args.insert("x-queue-version".into(), AMQPValue::LongInt(version.into()));
        }
        ch.queue_declare(
            cli.queue.as_str().into(),
            QueueDeclareOptions {
                durable: !cli.transient_queue,
                ..Default::default()
            },
            args,
        )
        .await?;
        ch.queue_bind(
            cli.queue.as_str().into(),
            cli.exchange.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
        println!(
            "exchange {} with queue {} bound by #",
            cli.exchange, cli.queue
        );
    } else {
        let deleted = ch
            .queue_delete(cli.queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        ch.exchange_delete(
            cli.exchange.as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await?;
        match deleted {
            Ok(n) => println!(
                "deleted queue {} ({n} messages) and exchange {}",
                cli.queue, cli.exchange
            ),
            Err(e) => println!(
                "queue {}: {e}; exchange {} deleted",
                cli.queue, cli.exchange
            ),
        }
    }
    let _ = connection.close(200, "done".into()).await;
    Ok(())
}
