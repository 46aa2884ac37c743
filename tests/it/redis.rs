//! The Redis backend (contract §3 "Backends"): several gateways sharing one Redis behave as one
//! for dedup and the guard, and a Redis outage is a 503, never a duplicate.

use std::time::Duration;

use crate::require_broker;
use crate::util::proxy::Proxy;
use crate::util::*;

pub(crate) use crate::util::shared_redis::{KeyPrefix, REDIS_URL};

/// Whether Redis can be used; the same rule as the broker (skip loudly, or fail in CI).
pub(crate) fn redis_available() -> bool {
    local_port_open(6379) || skip_or_fail("Redis is not reachable on 127.0.0.1:6379")
}

macro_rules! require_redis {
    () => {
        require_broker!();
        if !redis_available() {
            return;
        }
    };
}

/// Points a gateway config at Redis with its own key prefix.
pub(crate) fn on_redis(mut cfg: GatewayConfig, url: &str, prefix: &str) -> GatewayConfig {
    cfg.extra.push_str(&format!(
        "dedup:\n  backend: redis\nredis:\n  url: {url}\n  key_prefix: \"{prefix}\"\n"
    ));
    cfg
}

/// A plain connection to the Redis at `url`, for the test itself.
pub(crate) async fn redis_connection(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).expect("redis url");
    tokio::time::timeout(BROKER_TIMEOUT, client.get_multiplexed_async_connection())
        .await
        .expect("redis connect timed out")
        .expect("redis connect")
}

/// Two gateways (each with its own sled store and spool) sharing one fresh Redis prefix:
/// the gateways, the prefix (its keys go when it is dropped) and their store directories
/// (keep them alive).
async fn pair(
    broker: &Broker,
    guard: bool,
) -> (Gateway, Gateway, KeyPrefix, [tempfile::TempDir; 2]) {
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let prefix = KeyPrefix::new();
    let make = |d: &tempfile::TempDir| {
        let cfg = GatewayConfig::new(d.path(), &broker.exchange);
        let cfg = if guard { cfg.with_spec_guard() } else { cfg };
        on_redis(cfg, REDIS_URL, &prefix)
    };
    let a = Gateway::start(&make(&dirs[0])).await;
    let b = Gateway::start(&make(&dirs[1])).await;
    // Both publish directly (not into their spools), so a sentinel sent through either
    // arrives after everything accepted before it.
    let client = client(None);
    wait_broker_connected(&client, &a).await;
    wait_broker_connected(&client, &b).await;
    (a, b, prefix, dirs)
}

#[tokio::test]
async fn deliveries_alternated_between_two_instances_publish_each_event_once() {
    require_redis!();
    let broker = Broker::new().await;
    let (a, b, _prefix, _dirs) = pair(&broker, false).await;
    let client = client(None);
    let mut expected = Vec::new();
    for i in 0..20 {
        let id = format!("evt_alt_{i}");
        let body = event_body(&id);
        let (first, second) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let (s1, r1) = first.deliver(&client, &body, &unique("req")).await;
        // The sender's retry lands on the other replica, with a new request id.
        let (s2, r2) = second.deliver(&client, &body, &unique("req")).await;
        assert_eq!((s1, outcome(&r1).as_str()), (200, "accepted"), "{id}");
        assert_eq!((s2, outcome(&r2).as_str()), (200, "duplicate"), "{id}");
        expected.push(id);
    }
    assert_eq!(ids_before_sentinel(&client, &a, &broker).await, expected);
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_deliveries_spread_over_two_instances_publish_once() {
    require_redis!();
    let broker = Broker::new().await;
    let (a, b, _prefix, _dirs) = pair(&broker, false).await;
    let client = client(None);
    let body = event_body("evt_fifty");
    let urls = [a.url("/webhooks/botix"), b.url("/webhooks/botix")];
    let signature = sign(SECRET, body.as_bytes());
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (client, url, body, signature) = (
            client.clone(),
            urls[i % 2].clone(),
            body.clone(),
            signature.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let resp = client
                .post(url)
                .header("x-botix-signature", signature)
                .header("x-botix-request-id", format!("req_{i}"))
                .body(body)
                .send()
                .await
                .expect("send");
            let status = resp.status().as_u16();
            let answer: serde_json::Value = resp.json().await.expect("json");
            (status, outcome(&answer))
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        let (status, what) = t.await.expect("task");
        assert_eq!(status, 200, "{what}");
        match what.as_str() {
            "accepted" => accepted += 1,
            "duplicate" => {}
            other => panic!("unexpected outcome {other}"),
        }
    }
    assert_eq!(accepted, 1);
    assert_eq!(
        ids_before_sentinel(&client, &b, &broker).await,
        vec!["evt_fifty"]
    );
    broker.delete().await;
}

#[tokio::test]
async fn a_status_regression_and_a_repeated_stop_are_dropped_across_instances() {
    require_redis!();
    let broker = Broker::new().await;
    let (a, b, _prefix, _dirs) = pair(&broker, true).await;
    let client = client(None);
    let (_, r) = a
        .deliver(&client, &status_body("e1", "msg_x", "delivered"), "r1")
        .await;
    assert_eq!(outcome(&r), "accepted");
    let (_, r) = b
        .deliver(&client, &status_body("e2", "msg_x", "sent"), "r2")
        .await;
    assert_eq!(outcome(&r), "dropped:stale_status");
    let stop = |id: &str, text: &str| {
        serde_json::json!({"id": id, "event": "message.received", "timestamp": rfc3339_from_now(0),
            "data": {"from": "+15550001111", "to": "+15550002222", "text": text}})
        .to_string()
    };
    let (_, r) = b.deliver(&client, &stop("k1", "STOP"), "r3").await;
    assert_eq!(outcome(&r), "accepted");
    let (_, r) = a.deliver(&client, &stop("k2", "stop"), "r4").await;
    assert_eq!(outcome(&r), "dropped:repeated_stop");
    assert_eq!(
        ids_before_sentinel(&client, &a, &broker).await,
        vec!["e1", "k1"]
    );
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_statuses_over_two_instances_never_publish_a_lower_rank() {
    require_redis!();
    let broker = Broker::new().await;
    let (a, b, _prefix, _dirs) = pair(&broker, true).await;
    concurrent_status_rounds(&[std::sync::Arc::new(a), std::sync::Arc::new(b)], &broker).await;
    broker.delete().await;
}

#[tokio::test]
async fn redis_cut_mid_stream_gives_503s_no_duplicate_and_recovers() {
    require_redis!();
    let broker = Broker::new().await;
    let dir = tempfile::tempdir().expect("dir");
    let proxy = Proxy::start(([127, 0, 0, 1], 6379).into()).await;
    let prefix = KeyPrefix::new();
    let url = format!("redis://{}/0", proxy.addr);
    let gw = Gateway::start(&on_redis(
        GatewayConfig::new(dir.path(), &broker.exchange),
        &url,
        &prefix,
    ))
    .await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    for i in 0..10 {
        let id = format!("evt_before_{i}");
        let (s, r) = gw.deliver(&client, &event_body(&id), &unique("req")).await;
        assert_eq!((s, outcome(&r).as_str()), (200, "accepted"), "{id}");
        accepted.push(id);
    }
    proxy.cut();
    for i in 0..10 {
        let id = format!("evt_during_{i}");
        let (s, r) = gw.deliver(&client, &event_body(&id), &unique("req")).await;
        assert_eq!(s, 503, "{id}: {r}");
        refused.push(id);
    }
    let ready = client
        .get(gw.admin_url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(
        ready.status(),
        503,
        "readiness must say the store is unreachable"
    );
    let errors = scrape(&client, &gw)
        .await
        .get("hookgate_store_errors_total", &[]);
    assert!(errors >= 10.0, "store errors counted: {errors}");

    proxy.restore();
    // Recovery by itself: the sender's retries of the refused events go through.
    let deadline = tokio::time::Instant::now() + BROKER_TIMEOUT;
    for id in &refused {
        loop {
            let (s, r) = gw.deliver(&client, &event_body(id), &unique("req")).await;
            if s == 200 {
                assert_eq!(
                    outcome(&r),
                    "accepted",
                    "{id} was refused before, so it is new"
                );
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "Redis never came back: {s} {r}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        accepted.push(id.clone());
    }
    // Retries of events accepted before the cut are still duplicates.
    let (_, r) = gw
        .deliver(&client, &event_body("evt_before_0"), "again")
        .await;
    assert_eq!(outcome(&r), "duplicate");
    assert_eq!(
        ids_before_sentinel(&client, &gw, &broker).await,
        accepted,
        "each event exactly once"
    );
    broker.delete().await;
}

#[tokio::test]
async fn the_shared_guard_scenarios_pass_on_the_redis_backend() {
    require_redis!();
    let run = KeyPrefix::new();
    // A fresh prefix per scenario gives each an empty store, as the file asks.
    let counter = std::sync::atomic::AtomicUsize::new(0);
    run_shared_scenarios(|cfg| {
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        on_redis(cfg, REDIS_URL, &format!("{run}{n}:"))
    })
    .await;
}

/// A Redis of the test's own on a free port, plain or speaking only TLS (with a
/// self-signed certificate); stopped when dropped.
pub(crate) struct OwnRedis {
    child: std::process::Child,
    port: u16,
    /// The server's certificate when it speaks TLS.
    cert: Option<TestCert>,
    _dir: tempfile::TempDir,
}

impl OwnRedis {
    /// Starts `redis-server`; `None` when it cannot run here (see [`skip_or_fail`]).
    pub(crate) async fn start(tls: bool) -> Option<Self> {
        let dir = tempfile::tempdir().expect("dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let mut cmd = std::process::Command::new("redis-server");
        // DEBUG SLEEP (from loopback) lets a test stall the server between two commands.
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let cert = tls.then(|| TestCert::generate(dir.path()));
        match &cert {
            Some(cert) => {
                cmd.args(["--port", "0", "--tls-port"])
                    .arg(port.to_string())
                    .arg("--tls-cert-file")
                    .arg(&cert.cert_path)
                    .arg("--tls-key-file")
                    .arg(&cert.key_path)
                    .arg("--tls-ca-cert-file")
                    .arg(&cert.cert_path)
                    .args(["--tls-auth-clients", "no"]);
            }
            None => {
                cmd.arg("--port").arg(port.to_string());
            }
        }
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                skip_or_fail(&format!("cannot run redis-server: {e}"));
                return None;
            }
        };
        let mut redis = Self {
            child,
            port,
            cert,
            _dir: dir,
        };
        let listening = eventually(
            Duration::from_secs(10),
            || async move { local_port_open(port) },
        )
        .await;
        if !listening || !matches!(redis.child.try_wait(), Ok(None)) {
            skip_or_fail("redis-server did not listen (TLS asked of one built without it?)");
            return None;
        }
        Some(redis)
    }

    pub(crate) fn url(&self) -> String {
        let scheme = if self.cert.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gateway on `url` that trusts the certificates in `ca_file` (rustls-native-certs, which
/// the redis crate uses for `rediss://`, reads `SSL_CERT_FILE`).
async fn gateway_trusting(
    broker: &Broker,
    dir: &std::path::Path,
    url: &str,
    ca_file: &std::path::Path,
) -> Gateway {
    let mut cfg = on_redis(GatewayConfig::new(dir, &broker.exchange), url, "hg-tls:");
    cfg.env
        .push(("SSL_CERT_FILE".into(), ca_file.display().to_string()));
    Gateway::start(&cfg).await
}

#[tokio::test]
async fn a_rediss_url_keeps_the_state_in_a_tls_redis_and_refuses_an_untrusted_certificate() {
    require_broker!();
    let Some(redis) = OwnRedis::start(true).await else {
        return;
    };
    let cert = redis.cert.as_ref().expect("a TLS Redis has a certificate");
    let broker = Broker::new().await;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    let client = client(None);
    let body = event_body("evt_tls_1");

    let a = gateway_trusting(&broker, dirs[0].path(), &redis.url(), &cert.cert_path).await;
    wait_broker_connected(&client, &a).await;
    let (s, r) = a.deliver(&client, &body, "req_tls_1").await;
    assert_eq!((s, outcome(&r).as_str()), (200, "accepted"), "{r}");

    // A second gateway with a sled store of its own knows the event: the mark is in Redis.
    let b = gateway_trusting(&broker, dirs[1].path(), &redis.url(), &cert.cert_path).await;
    let (s, r) = b.deliver(&client, &body, "req_tls_2").await;
    assert_eq!((s, outcome(&r).as_str()), (200, "duplicate"), "{r}");

    // One that trusts another certificate cannot reach the store: 503, and nothing published.
    let other = TestCert::generate(dirs[2].path());
    let c = gateway_trusting(&broker, dirs[2].path(), &redis.url(), &other.cert_path).await;
    let (s, r) = c
        .deliver(&client, &event_body("evt_tls_2"), "req_tls_3")
        .await;
    assert_eq!(s, 503, "{r}");
    assert!(
        c.logged("invalid peer certificate", BROKER_TIMEOUT).await,
        "the refusal is the certificate check:\n{}",
        c.logs().join("\n")
    );

    assert_eq!(
        ids_before_sentinel(&client, &a, &broker).await,
        vec!["evt_tls_1".to_owned()],
        "the accepted event once, the refused one never"
    );
    broker.delete().await;
}

/// Sets a Redis configuration parameter.
async fn config_set(conn: &mut redis::aio::MultiplexedConnection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(conn)
        .await
        .expect("CONFIG SET");
}

#[tokio::test]
async fn a_redis_that_refuses_writes_is_not_ready_while_it_still_answers_reads() {
    require_broker!();
    let Some(redis) = OwnRedis::start(false).await else {
        return;
    };
    let broker = Broker::new().await;
    let dir = tempfile::tempdir().expect("dir");
    let cfg = on_redis(
        GatewayConfig::new(dir.path(), &broker.exchange),
        &redis.url(),
        "hg-oom:",
    );
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    let (s, r) = gw
        .deliver(&client, &event_body("evt_oom_1"), "req_oom_1")
        .await;
    assert_eq!((s, outcome(&r).as_str()), (200, "accepted"), "{r}");

    // Out of memory, evicting nothing: Redis still answers PING and GET, refuses writes.
    let mut conn = redis_connection(&redis.url()).await;
    config_set(&mut conn, "maxmemory-policy", "noeviction").await;
    config_set(&mut conn, "maxmemory", "1").await;
    // No request has failed yet, so only the readiness probe can tell.
    let (status, why) = gw
        .admin_until(&client, "/readyz", BROKER_TIMEOUT, |s, _| s == 503)
        .await;
    assert_eq!(status, 503, "ready although Redis refuses writes: {why}");
    // The sender retries the first delivery: reads find its marks.
    let (s, r) = gw
        .deliver(&client, &event_body("evt_oom_1"), "req_oom_1")
        .await;
    assert_eq!(
        (s, outcome(&r).as_str()),
        (200, "duplicate"),
        "a read still finds the mark: {r}"
    );
    let (status, why) = gw.admin_get(&client, "/readyz").await;
    assert_eq!(
        status, 503,
        "a read that worked does not make it ready: {why}"
    );
    let (s, r) = gw
        .deliver(&client, &event_body("evt_oom_2"), "req_oom_2")
        .await;
    assert_eq!(s, 503, "a claim cannot be written: {r}");

    config_set(&mut conn, "maxmemory", "0").await;
    let (status, why) = gw
        .admin_until(&client, "/readyz", BROKER_TIMEOUT, |s, _| s == 200)
        .await;
    assert_eq!(
        status, 200,
        "not ready after Redis took writes again: {why}"
    );
    let (s, r) = gw
        .deliver(&client, &event_body("evt_oom_2"), "req_oom_2")
        .await;
    assert_eq!(
        (s, outcome(&r).as_str()),
        (200, "accepted"),
        "the refused event's retry: {r}"
    );
    assert_eq!(
        ids_before_sentinel(&client, &gw, &broker).await,
        ["evt_oom_1", "evt_oom_2"],
        "each event once"
    );
    broker.delete().await;
}

#[tokio::test]
async fn a_claim_left_by_an_instance_killed_mid_publish_is_taken_over_after_the_lease() {
    require_redis!();
    let broker = Broker::new().await;
    let prefix = KeyPrefix::new();
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    // Instance A publishes through a proxy that will swallow its publish; B directly.
    let proxy = Proxy::to_rabbitmq().await;
    let shared = format!(
        "dedup:\n  backend: redis\n  in_flight_lease: 18s\n  in_flight_wait: 1s\nredis:\n  url: {REDIS_URL}\n  key_prefix: \"{prefix}\"\n"
    );
    let mut cfg_a = GatewayConfig::new(dirs[0].path(), &broker.exchange);
    cfg_a.amqp_url = proxy.amqp_url("");
    cfg_a.confirm_timeout = "1s".into();
    cfg_a.extra = shared.clone();
    let mut a = Gateway::start(&cfg_a).await;
    let mut cfg_b = GatewayConfig::new(dirs[1].path(), &broker.exchange);
    cfg_b.confirm_timeout = "1s".into();
    cfg_b.extra = shared;
    let b = Gateway::start(&cfg_b).await;
    let client = client(None);
    wait_broker_connected(&client, &a).await;
    wait_broker_connected(&client, &b).await;

    proxy.black_hole();
    let body = event_body("evt_orphaned");
    let held = {
        let (client, body, url) = (client.clone(), body.clone(), a.url("/webhooks/botix"));
        tokio::spawn(async move {
            let _ = client
                .post(url)
                .header("x-botix-signature", sign(SECRET, body.as_bytes()))
                .header("x-botix-request-id", "req_orphan_a")
                .body(body)
                .send()
                .await;
        })
    };
    // A holds the event's claim once a key other than the readiness probe's exists.
    let conn = redis_connection(REDIS_URL).await;
    let claimed = eventually(POLL_DEADLINE, || {
        let mut conn = conn.clone();
        let pattern = format!("{prefix}*");
        async move {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(pattern)
                .query_async(&mut conn)
                .await
                .expect("keys");
            keys.iter().any(|k| !k.ends_with("readiness-probe"))
        }
    })
    .await;
    assert!(claimed, "instance A never claimed the event");
    a.kill9();
    held.abort();

    // The lease outlasts a request's wait (it must cover the wait, the publish and the
    // spool's fsync): B answers 503 until the lease runs out, then takes the claim over.
    let deadline = tokio::time::Instant::now() + POLL_DEADLINE;
    let mut answers = Vec::new();
    loop {
        let (status, answer) = b.deliver(&client, &body, "req_orphan_b").await;
        answers.push((status, outcome(&answer)));
        if status == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dead instance's claim was not taken over: {answers:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        answers.last().map(|(_, o)| o.as_str()),
        Some("accepted"),
        "{answers:?}"
    );
    assert!(
        answers[..answers.len() - 1].iter().all(|(s, _)| *s == 503),
        "only 503s before the takeover: {answers:?}"
    );
    assert_eq!(
        ids_before_sentinel(&client, &b, &broker).await,
        vec!["evt_orphaned"]
    );
    broker.delete().await;
}

#[tokio::test]
async fn contacts_and_channels_that_join_to_the_same_redis_key_keep_their_own_opt_out() {
    require_redis!();
    let broker = Broker::new().await;
    let (a, _b, _prefix, _dirs) = pair(&broker, true).await;
    let client = client(None);
    let base = wall_ms() - 60_000;
    // Redis shows the key separator as ':', so ("a:b", "c") and ("a", "b:c") would meet.
    let pairs = [("+1555:1", "+1666"), ("+1555", "1:+1666")];
    for (i, (contact, channel)) in pairs.iter().enumerate() {
        let id = format!("kw_colon_{i}");
        let body = keyword_between(&id, contact, channel, "STOP", base + i as i64);
        let (s, r) = a.deliver(&client, &body, &format!("req_{id}")).await;
        assert_eq!(
            (s, outcome(&r).as_str()),
            (200, "accepted"),
            "{contact} -> {channel}"
        );
    }
    assert_eq!(
        ids_before_sentinel(&client, &a, &broker).await,
        vec!["kw_colon_0", "kw_colon_1"]
    );
    broker.delete().await;
}

#[tokio::test]
async fn with_wait_replicas_a_write_no_replica_acknowledged_is_a_503_and_one_it_did_a_200() {
    require_broker!();
    let Some(master) = OwnRedis::start(false).await else {
        return;
    };
    let broker = Broker::new().await;
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = on_redis(
        GatewayConfig::new(dir.path(), &broker.exchange),
        &master.url(),
        "hg-wait:",
    );
    // Long enough that an attached replica acknowledges even on a loaded machine (the
    // setting must stay under a Redis call's 2 s deadline); with no replica WAIT counts none
    // however long it waits.
    cfg.extra
        .push_str("  wait_replicas: 1\n  wait_timeout: 1500ms\n");
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    // No replica: WAIT 1 counts none, so no 200 may stand for the marks.
    let (s, r) = gw
        .deliver(&client, &event_body("evt_wait_1"), "req_wait_1")
        .await;
    assert_eq!(s, 503, "a 200 without a replica's acknowledgement: {r}");

    // A replica of the test's own joins; the sender's retry gets its 200.
    let replica_dir = tempfile::tempdir().expect("dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let mut replica = std::process::Command::new("redis-server")
        .args([
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--port",
        ])
        .arg(port.to_string())
        .arg("--dir")
        .arg(replica_dir.path())
        .args(["--replicaof", "127.0.0.1"])
        .arg(master.port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redis-server replica");
    let deadline = tokio::time::Instant::now() + POLL_DEADLINE;
    let mut answers = Vec::new();
    loop {
        let (s, r) = gw
            .deliver(&client, &event_body("evt_wait_1"), "req_wait_1b")
            .await;
        answers.push((s, outcome(&r)));
        if s == 200 || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The first attempt's claims were not acknowledged by a replica, so it published
    // nothing and released them: the retry is decided afresh and published, once.
    assert_eq!(
        answers.last(),
        Some(&(200, "accepted".to_owned())),
        "{answers:?}"
    );
    let published = ids_before_sentinel(&client, &gw, &broker).await;
    let _ = replica.kill();
    let _ = replica.wait();
    assert_eq!(published, ["evt_wait_1"]);
    broker.delete().await;
}
