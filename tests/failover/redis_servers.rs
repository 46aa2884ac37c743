//! Redis servers of the test's own on free loopback ports (plain servers, replicas,
//! sentinels, cluster nodes), each in a temporary folder and killed on drop; and the load
//! both failover tests drive through two hookgate replicas while a server is killed.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::util::*;

/// A free port on 127.0.0.1 (bound once, released, then given to a server).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A free port for a cluster node: below 55,536, with its cluster bus port (10,000 above
/// it) free too. Redis refuses a node whose bus port is out of range, and one whose bus
/// port another test's connection holds does not listen.
pub fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55_535 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// One `redis-server` process (a data node or, with `--sentinel`, a sentinel).
pub struct Server {
    child: Option<Child>,
    pub port: u16,
}

impl Server {
    /// Starts `redis-server <conf>` with `args` on `port` in `dir`; `None` (after a loud
    /// skip, or a failure where servers are required) when it cannot start.
    pub async fn start(dir: &Path, port: u16, conf: Option<&Path>, args: &[&str]) -> Option<Self> {
        match Self::try_start(dir, port, conf, args).await {
            Ok(server) => Some(server),
            Err(why) => {
                skip_or_fail(&why);
                None
            }
        }
    }

    /// [`Server::start`] that says why it failed instead of failing the test: a caller
    /// that picked a port another test took meanwhile tries another.
    pub async fn try_start(
        dir: &Path,
        port: u16,
        conf: Option<&Path>,
        args: &[&str],
    ) -> Result<Self, String> {
        let mut cmd = Command::new("redis-server");
        if let Some(conf) = conf {
            cmd.arg(conf);
        }
        cmd.args(["--bind", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .arg("--dir")
            .arg(dir)
            .args(["--save", "", "--appendonly", "no"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot run redis-server: {e}"))?;
        let server = Self {
            child: Some(child),
            port,
        };
        if !eventually(POLL_DEADLINE, || async move { local_port_open(port) }).await {
            return Err(format!("redis-server on port {port} did not listen"));
        }
        Ok(server)
    }

    /// `kill -9`: the server is gone at once, as a crashed node is.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends the signal named `name` (`STOP`, `CONT`, …) to the server.
    pub fn signal(&self, name: &str) {
        if let Some(child) = &self.child {
            send_signal(child.id(), name);
        }
    }

    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A connection to this server.
    pub async fn connect(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(format!("redis://{}/", self.addr()))?;
        tokio::time::timeout(
            Duration::from_secs(5),
            client.get_multiplexed_async_connection(),
        )
        .await
        .unwrap_or_else(|_| Err((redis::ErrorKind::Io, "connect timed out").into()))
    }

    /// A command's reply, or `None` when the server does not answer.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Option<T> {
        let mut conn = self.connect().await.ok()?;
        tokio::time::timeout(Duration::from_secs(5), cmd.query_async(&mut conn))
            .await
            .ok()?
            .ok()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Two gateways (real binary) with `redis_yaml` as their `redis:` section, publishing to
/// `broker`; and their store folders.
pub async fn two_gateways(
    broker: &Broker,
    redis_yaml: &str,
) -> (Gateway, Gateway, [tempfile::TempDir; 2]) {
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let prefix = unique("hg-failover") + ":";
    let make = |d: &tempfile::TempDir| {
        let mut cfg = GatewayConfig::new(d.path(), &broker.exchange).with_spec_guard();
        cfg.extra =
            format!("dedup:\n  backend: redis\nredis:\n  key_prefix: \"{prefix}\"\n{redis_yaml}");
        cfg
    };
    let a = Gateway::start(&make(&dirs[0])).await;
    let b = Gateway::start(&make(&dirs[1])).await;
    let c = client(None);
    wait_broker_connected(&c, &a).await;
    wait_broker_connected(&c, &b).await;
    (a, b, dirs)
}

/// Whether both gateways say ready (`/readyz` 200), polled until `within` passes.
pub async fn both_ready(gws: &[&Gateway], within: Duration) -> bool {
    let c = client(None);
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let mut all = true;
        for gw in gws {
            let (status, _) = gw.admin_get(&c, "/readyz").await;
            all &= status == 200;
        }
        if all {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What one delivery got.
#[derive(Clone, Debug)]
struct Sent {
    event: String,
    /// Milliseconds since the load began, when the request was sent.
    at_ms: u64,
    status: u16,
    outcome: String,
}

/// The figures of one failover run.
#[derive(Debug)]
pub struct Figures {
    pub deliveries: usize,
    pub unique_events: usize,
    pub answered_200: usize,
    pub answered_503: usize,
    pub other: usize,
    pub kill_at_ms: u64,
    pub ready_after_kill_ms: Option<u64>,
    pub messages: usize,
    pub duplicates: Vec<(String, usize, u64)>,
}

/// Deliveries per second of the load through a failover.
const RATE: u32 = 20;
/// How long the load lasts.
const LENGTH: Duration = Duration::from_secs(16);
/// How far into the load the server is killed.
const KILL_AFTER: Duration = Duration::from_secs(5);
/// How soon after the kill both gateways must be ready again.
const READY_WITHIN: Duration = Duration::from_secs(45);
/// How long before the kill a write may be lost by the failover.
const WINDOW: Duration = Duration::from_secs(2);

/// Drives [`RATE`] deliveries per second for [`LENGTH`] through the two gateways, in turn:
/// a new event each time, and every third delivery a retry of an earlier one through the
/// other gateway. `kill` runs [`KILL_AFTER`] into the load. Then both must be ready within
/// [`READY_WITHIN`]; events answered anything but 200 are retried until they get it; and
/// every event answered 200 must be on the queue, duplicates only for events first sent
/// within [`WINDOW`] before the kill or between the kill and the gateways' readiness (the
/// writes a failover may lose, and the publishes answered 503 that a retry repeats).
pub async fn load_through_failover(
    name: &str,
    a: &Gateway,
    b: &Gateway,
    broker: &Broker,
    kill: impl FnOnce(),
) -> Figures {
    let (rate, length, kill_after, ready_within, window) =
        (RATE, LENGTH, KILL_AFTER, READY_WITHIN, WINDOW);
    let c = patient_client();
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let gws = [a.url("/webhooks/botix"), b.url("/webhooks/botix")];
    let mut tasks = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    let mut kill = Some(kill);
    let mut kill_at_ms = 0;
    let readyz = [a.admin_url("/readyz"), b.admin_url("/readyz")];
    let mut watcher = None;
    let mut events = 0usize;
    let total = (length.as_secs_f64() * f64::from(rate)) as usize;
    for i in 0..total {
        tick.tick().await;
        if kill.is_some() && start.elapsed() >= kill_after {
            kill_at_ms = start.elapsed().as_millis() as u64;
            if let Some(k) = kill.take() {
                k();
            }
            watcher = Some(tokio::spawn(ready_again(readyz.clone(), ready_within)));
        }
        let (event, url) = if i % 3 == 2 && events > 0 {
            // A retry of an event sent a moment ago, through the other replica.
            let earlier = events.saturating_sub(1 + (i % 7));
            (format!("{name}_{earlier}"), gws[(earlier + 1) % 2].clone())
        } else {
            events += 1;
            (
                format!("{name}_{}", events - 1),
                gws[(events - 1) % 2].clone(),
            )
        };
        let (c, sent, at_ms) = (c.clone(), sent.clone(), start.elapsed().as_millis() as u64);
        tasks.push(tokio::spawn(async move {
            let (status, outcome) = post(&c, &url, &event).await;
            sent.lock().expect("lock").push(Sent {
                event,
                at_ms,
                status,
                outcome,
            });
        }));
    }
    for t in tasks {
        t.await.expect("delivery task");
    }
    let ready_after_kill_ms = match watcher {
        Some(w) => w.await.expect("readiness watcher"),
        None => None,
    };
    let ready = ready_after_kill_ms.is_some() && both_ready(&[a, b], ready_within).await;
    let sent = sent.lock().expect("lock").clone();

    // The sender retries what did not get a 200.
    let mut answered: HashMap<String, u64> = HashMap::new();
    for s in &sent {
        if s.status == 200 {
            let at = answered.entry(s.event.clone()).or_insert(s.at_ms);
            *at = (*at).min(s.at_ms);
        }
    }
    let unanswered: Vec<String> = (0..events)
        .map(|i| format!("{name}_{i}"))
        .filter(|e| !answered.contains_key(e))
        .collect();
    // An event whose request was cut off by the failover may have left its claim on the
    // promoted master; the claim is a crash leftover only after `dedup.in_flight_lease`,
    // and until then a retry is answered 503 (busy), as it should be.
    let claim_left_over = hookgate::config::Dedup::default().in_flight_lease;
    for event in &unanswered {
        let deadline = Instant::now() + claim_left_over + POLL_DEADLINE;
        loop {
            let (status, answer) = post(&c, &gws[0], event).await;
            if status == 200 {
                answered.insert(event.clone(), start.elapsed().as_millis() as u64);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{event} never got a 200 after the failover; the last answer {status} {answer} \
                 at {:.1}s",
                start.elapsed().as_secs_f64()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // Every event answered 200 is on the queue.
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.keys().any(|e| !counts.contains_key(e)) {
        if let Some(m) = broker.next(Duration::from_secs(1)).await {
            *counts.entry(m.message_id.unwrap_or_default()).or_default() += 1;
        }
        assert!(
            Instant::now() < deadline,
            "events answered 200 never arrived: {:?}",
            answered
                .keys()
                .filter(|e| !counts.contains_key(*e))
                .collect::<Vec<_>>()
        );
    }
    // Late copies (a spool drained after the check) still count as duplicates.
    while let Some(m) = broker.next(Duration::from_secs(2)).await {
        *counts.entry(m.message_id.unwrap_or_default()).or_default() += 1;
    }
    let messages = counts.values().sum();
    // When each event was first sent: an event published whose marks were lost, or whose
    // 200 was lost (a 503 after the publish), is published again by a later retry.
    let mut first_sent: HashMap<&str, u64> = HashMap::new();
    for s in &sent {
        let at = first_sent.entry(s.event.as_str()).or_insert(s.at_ms);
        *at = (*at).min(s.at_ms);
    }
    let duplicates: Vec<(String, usize, u64)> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(e, n)| {
            (
                e.clone(),
                *n,
                first_sent.get(e.as_str()).copied().unwrap_or(0),
            )
        })
        .collect();
    let figures = Figures {
        deliveries: sent.len(),
        unique_events: events,
        answered_200: sent.iter().filter(|s| s.status == 200).count(),
        answered_503: sent.iter().filter(|s| s.status == 503).count(),
        other: sent
            .iter()
            .filter(|s| s.status != 200 && s.status != 503)
            .count(),
        kill_at_ms,
        ready_after_kill_ms,
        messages,
        duplicates,
    };
    println!(
        "failover {name}: load {rate}/s for {length:?} ({} deliveries, {} events, every third a retry through the other replica); \
         server killed at {} ms; answers: {} x 200, {} x 503, {} other; {} retried after the load; \
         messages on the queue: {}; duplicates: {} {:?}; both replicas ready {:?} ms after the kill",
        figures.deliveries,
        figures.unique_events,
        figures.kill_at_ms,
        figures.answered_200,
        figures.answered_503,
        figures.other,
        unanswered.len(),
        figures.messages,
        figures.duplicates.len(),
        figures.duplicates,
        figures.ready_after_kill_ms,
    );
    let unexpected: Vec<String> = sent
        .iter()
        .filter(|s| s.status != 200 && s.status != 503)
        .map(|s| format!("{} {} {}", s.event, s.status, s.outcome))
        .collect();
    assert!(
        unexpected.is_empty(),
        "answers other than 200 and 503: {unexpected:?}"
    );
    assert!(
        ready,
        "both replicas were not ready within {ready_within:?} of the kill"
    );
    let from = kill_at_ms.saturating_sub(window.as_millis() as u64);
    let until = kill_at_ms + figures.ready_after_kill_ms.unwrap_or(0);
    let outside: Vec<_> = figures
        .duplicates
        .iter()
        .filter(|(_, _, at)| *at < from || *at > until)
        .collect();
    assert!(
        outside.is_empty(),
        "duplicates of events first sent outside the failover window [{from}, {until}] ms: {outside:?}"
    );
    figures
}

/// Milliseconds from now until both `/readyz` answer 200 again, after one of them has
/// noticed the failure (503) or 5 s have passed; `None` if not within `within`.
async fn ready_again(readyz: [String; 2], within: Duration) -> Option<u64> {
    let c = client(None);
    let start = Instant::now();
    let status = |url: String| {
        let c = c.clone();
        async move {
            match c.get(url).timeout(Duration::from_secs(2)).send().await {
                Ok(r) => r.status().as_u16(),
                Err(_) => 0,
            }
        }
    };
    while start.elapsed() < Duration::from_secs(5) {
        if status(readyz[0].clone()).await != 200 || status(readyz[1].clone()).await != 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while start.elapsed() < within {
        if status(readyz[0].clone()).await == 200 && status(readyz[1].clone()).await == 200 {
            return Some(start.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

fn patient_client() -> reqwest::Client {
    hookgate::tls::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

/// One signed delivery of `event` (a fresh body each time, same id): status and outcome.
async fn post(c: &reqwest::Client, url: &str, event: &str) -> (u16, String) {
    let body = event_body(event);
    let answer = c
        .post(url)
        .header("x-botix-signature", sign(SECRET, body.as_bytes()))
        .header("x-botix-request-id", unique("req"))
        .body(body)
        .send()
        .await;
    match answer {
        Ok(r) => {
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            (status, outcome(&body))
        }
        Err(e) => (0, e.to_string()),
    }
}
