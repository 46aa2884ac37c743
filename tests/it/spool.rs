//! The spool (contract §6): a 200 is never lost, even while the broker is away.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::require_broker;
use crate::util::*;

/// How long a test waits for a drain or a reconnect before it fails.
const DRAIN_DEADLINE: Duration = Duration::from_secs(90);

/// The spool's depth, from the admin `/spool`.
async fn spool_depth(gw: &Gateway, client: &reqwest::Client) -> u64 {
    spool_json(gw, client).await["depth"]
        .as_u64()
        .expect("depth")
}

/// Waits until the spool is empty; fails after `timeout`.
async fn wait_drained(gw: &Gateway, client: &reqwest::Client, timeout: Duration) {
    let (_, body) = gw
        .admin_until(client, "/spool", timeout, |_, b| b.contains("\"depth\":0"))
        .await;
    assert!(body.contains("\"depth\":0"), "spool did not drain: {body}");
}

/// `hookgate spool ARGS --config PATH`: (success, stdout, stderr).
async fn spool_cli(config: &Path, args: &[&str]) -> (bool, String, String) {
    let mut cmd = hookgate();
    cmd.arg("spool").args(args).arg("--config").arg(config);
    let out = run_bounded(cmd, Duration::from_secs(30)).await;
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `hookgate spool status --config PATH`: (success, stdout, stderr).
async fn spool_status_cli(config: &Path) -> (bool, String, String) {
    spool_cli(config, &["status"]).await
}

/// A copy of the running gateway's config for the CLI: the test config binds the admin
/// listener to port 0, which the CLI cannot know, so it gets the bound address.
fn config_for_cli(gw: &Gateway, dir: &Path) -> std::path::PathBuf {
    let running = dir.join(format!("running-{}.yaml", gw.admin.port()));
    let text = std::fs::read_to_string(&gw.config_path)
        .expect("config")
        .replace(
            "admin:\n  addr: 127.0.0.1:0\n",
            &format!("admin:\n  addr: {}\n", gw.admin),
        );
    std::fs::write(&running, text).expect("write config");
    running
}

/// Ids seen more than once, with their counts.
fn duplicates(received: &[String]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for id in received {
        *counts.entry(id.clone()).or_insert(0usize) += 1;
    }
    counts.retain(|_, n| *n > 1);
    counts
}

fn missing(accepted: &[String], received: &[String]) -> Vec<String> {
    let got: BTreeSet<&String> = received.iter().collect();
    accepted
        .iter()
        .filter(|id| !got.contains(id))
        .cloned()
        .collect()
}

/// The fixture with the broker out of reach: a gateway started on it spools.
async fn fixture_broker_away() -> (tempfile::TempDir, Broker, GatewayConfig) {
    let (dir, broker, mut cfg) = fixture().await;
    cfg.amqp_url = unreachable_amqp_url();
    (dir, broker, cfg)
}

/// Delivers `n` events, `evt_000` on, each answered 200; their ids in order.
pub(crate) async fn accept_numbered(
    gw: &Gateway,
    client: &reqwest::Client,
    n: usize,
) -> Vec<String> {
    let ids: Vec<String> = (0..n).map(|i| format!("evt_{i:03}")).collect();
    for id in &ids {
        gw.accept(client, id).await;
    }
    ids
}

/// A gateway on `cfg` whose broker sits behind a proxy, connected, then cut: ready and
/// spooling. The proxy restores the broker.
pub(crate) async fn spooling_behind_a_cut_proxy(
    cfg: &mut GatewayConfig,
) -> (Proxy, Gateway, reqwest::Client) {
    let proxy = Proxy::to_rabbitmq().await;
    cfg.amqp_url = proxy.amqp_url("");
    let gw = Gateway::start(cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    proxy.cut();
    let (status, why) = gw
        .admin_until(&client, "/readyz", BROKER_TIMEOUT, |_, b| {
            b.contains("spooling")
        })
        .await;
    assert_eq!(status, 200, "{why}");
    (proxy, gw, client)
}

/// Delivers fresh events `evt_<first>`, `evt_<first + 1>`, ... until one is refused, at
/// most `at_most` of them: the ids answered 200 `accepted`, and the refused one (a 503
/// with `Retry-After`).
pub(crate) async fn accept_until_refused(
    gw: &Gateway,
    client: &reqwest::Client,
    first: usize,
    at_most: usize,
) -> (Vec<String>, String) {
    let mut accepted = Vec::new();
    for i in first..first + at_most {
        let id = format!("evt_{i:03}");
        let a = gw
            .deliver_answer(client, &event_body(&id), &format!("req_{id}"))
            .await;
        if a.status != 200 {
            assert_retry_later(&a, &format!("{id} on a full disk"));
            return (accepted, id);
        }
        assert_eq!(a.body["status"], "accepted", "{id}: {}", a.body);
        accepted.push(id);
    }
    panic!("a full disk took {at_most} spooled events");
}

#[tokio::test]
async fn events_spooled_while_the_broker_is_away_arrive_once_in_order_after_restart() {
    require_broker!();
    let (dir, broker, mut cfg) = fixture_broker_away().await;
    let mut gw = Gateway::start(&cfg).await;
    let client = client(None);

    let spooled = accept_numbered(&gw, &client, 20).await;
    // The CLI asks the running gateway (its store is locked), found from the config given
    // by --config or by HOOKGATE_CONFIG as `run` finds it, and says which one it asked.
    let running = config_for_cli(&gw, dir.path());
    let store_line = format!("store: {}\n", cfg.store.display());
    let (ok, out, err) = spool_status_cli(&running).await;
    assert!(ok, "spool status failed: {err}");
    assert!(out.contains("depth: 20\n"), "{out}");
    assert!(
        out.contains(&format!(
            "gateway: admin {} (the running gateway)\n",
            gw.admin
        )),
        "{out}"
    );
    assert!(out.contains(&store_line), "{out}");
    let mut cmd = hookgate();
    // Run elsewhere than the repository, where no default config file exists.
    cmd.current_dir(dir.path())
        .args(["spool", "status"])
        .env("HOOKGATE_CONFIG", &running);
    let by_env = run_bounded(cmd, Duration::from_secs(30)).await;
    let env_out = String::from_utf8_lossy(&by_env.stdout);
    assert!(
        by_env.status.success(),
        "{}",
        String::from_utf8_lossy(&by_env.stderr)
    );
    // The same answer but for the oldest entry's age, which may tick between the two calls.
    let without_age = |text: &str| {
        text.lines()
            .filter(|l| !l.starts_with("oldest:"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        without_age(&env_out),
        without_age(&out),
        "HOOKGATE_CONFIG finds the same gateway"
    );
    assert_eq!(broker.message_count().await, 0, "nothing published yet");

    gw.stop().await;
    // With no gateway running the CLI reads the store itself, and says so.
    let (ok, out, err) = spool_status_cli(&gw.config_path).await;
    assert!(ok, "spool status (stopped) failed: {err}");
    assert!(out.contains("depth: 20\n"), "{out}");
    assert!(
        out.contains("gateway: none answered on admin 127.0.0.1:0; the store was read directly\n"),
        "{out}"
    );
    assert!(out.contains(&store_line), "{out}");

    cfg.amqp_url = AMQP_URL.to_owned();
    let gw = Gateway::start(&cfg).await;
    gw.accept(&client, "sentinel").await;
    let got = ids(&broker.until_within("sentinel", DRAIN_DEADLINE).await);
    assert_eq!(got, spooled, "every spooled event once, in arrival order");
    assert_eq!(
        broker.message_count().await,
        0,
        "nothing after the sentinel"
    );
    wait_drained(&gw, &client, BROKER_TIMEOUT).await;
    assert!(
        gw.logged(
            r#""level":"INFO","message":"spool drained""#,
            BROKER_TIMEOUT
        )
        .await,
        "one INFO line says the spool has drained; logs:\n{}",
        gw.logs().join("\n")
    );
    broker.delete().await;
}

#[tokio::test]
async fn no_accepted_event_is_lost_when_the_link_is_cut_or_black_holed() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::new().await;
    let proxy = Proxy::to_rabbitmq().await;
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    cfg.amqp_url = proxy.amqp_url("heartbeat=2");
    cfg.confirm_timeout = "1s".into();
    let gw = Arc::new(Gateway::start(&cfg).await);
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    // Senders run until told to stop (at most MAX_PER_TASK each), so every phase of the
    // link happens while deliveries are flowing.
    const TASKS: usize = 3;
    const MAX_PER_TASK: usize = 1000;
    let done = Arc::new(AtomicUsize::new(0));
    let stop_sending = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::<(String, u16)>::new()));
    let mut senders = Vec::new();
    for t in 0..TASKS {
        let (gw, client, done, answers, stop_sending) = (
            gw.clone(),
            client.clone(),
            done.clone(),
            answers.clone(),
            stop_sending.clone(),
        );
        senders.push(tokio::spawn(async move {
            for i in 0..MAX_PER_TASK {
                if stop_sending.load(Ordering::SeqCst) {
                    break;
                }
                let id = format!("evt_{t}_{i:04}");
                let a = gw
                    .deliver_answer(&client, &event_body(&id), &format!("req_{id}"))
                    .await;
                answers.lock().expect("answers").push((id, a.status));
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let reach = |n: usize| {
        let done = done.clone();
        async move {
            let ok = wait_until(Duration::from_secs(120), || {
                done.load(Ordering::SeqCst) >= n
            })
            .await;
            assert!(ok, "deliveries stalled before {n}");
        }
    };
    let log_phase = |what: &str| {
        eprintln!("{what} after {} deliveries", done.load(Ordering::SeqCst));
    };
    reach(50).await;
    proxy.cut();
    log_phase("cut");
    reach(150).await;
    proxy.restore();
    log_phase("restored");
    // Black-hole a live connection, not a reconnect attempt.
    let (_, why) = gw
        .admin_until(&client, "/readyz", DRAIN_DEADLINE, |_, b| {
            b.contains("broker connected")
        })
        .await;
    assert!(why.contains("broker connected"), "no reconnect: {why}");
    let at = done.load(Ordering::SeqCst);
    reach(at + 20).await;
    proxy.black_hole();
    log_phase("black-holed");
    reach(at + 60).await;
    proxy.restore();
    log_phase("restored");
    reach(done.load(Ordering::SeqCst) + 30).await;
    stop_sending.store(true, Ordering::SeqCst);
    for s in senders {
        tokio::time::timeout(Duration::from_secs(120), s)
            .await
            .expect("senders timed out")
            .expect("sender");
    }
    let answers = answers.lock().expect("answers").clone();
    let refused: Vec<_> = answers.iter().filter(|(_, s)| *s != 200).collect();
    let accepted: Vec<String> = answers
        .iter()
        .filter(|(_, s)| *s == 200)
        .map(|(id, _)| id.clone())
        .collect();

    gw.accept(&client, "sentinel").await;
    let received = ids(&broker.until_within("sentinel", DRAIN_DEADLINE).await);
    let dups = duplicates(&received);
    let lost = missing(&accepted, &received);
    let logged = |what: &str| {
        gw.logs()
            .iter()
            .filter(|l| l.contains(&format!("\"message\":\"{what}")))
            .count()
    };
    let spooled = logged("event spooled");
    eprintln!(
        "link cut/black-hole: {} accepted, {} refused, {} spooled, {} received, {} duplicated ids {:?}, {} lost, {} proxy connections, {} connection losses logged",
        accepted.len(),
        refused.len(),
        spooled,
        received.len(),
        dups.len(),
        dups,
        lost.len(),
        proxy.accepted(),
        logged("broker connection lost")
    );
    assert!(spooled > 0, "nothing was spooled: the link never failed");
    assert!(
        logged("broker connection lost") >= 2,
        "the cut and the black-holed link were both noticed"
    );
    assert!(lost.is_empty(), "accepted events lost: {lost:?}");
    assert!(
        refused.is_empty(),
        "the spool had room, yet deliveries were refused: {refused:?}"
    );
    assert!(proxy.accepted() > 1, "the gateway never reconnected");
    let unknown: Vec<_> = received
        .iter()
        .filter(|id| !accepted.contains(id))
        .collect();
    assert!(unknown.is_empty(), "unexpected messages: {unknown:?}");
    broker.delete().await;
}

#[tokio::test]
async fn kill_9_while_the_spool_drains_loses_nothing() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture_broker_away().await;
    let gw = Arc::new(Gateway::start(&cfg).await);
    let client = client(None);

    const TASKS: usize = 4;
    const PER_TASK: usize = 125;
    let mut senders = Vec::new();
    for t in 0..TASKS {
        let (gw, client) = (gw.clone(), client.clone());
        senders.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..PER_TASK {
                let id = format!("evt_{t}_{i:03}");
                gw.accept(&client, &id).await;
                ids.push(id);
            }
            ids
        }));
    }
    let mut accepted = Vec::new();
    for s in senders {
        accepted.extend(s.await.expect("sender"));
    }
    assert_eq!(spool_depth(&gw, &client).await, 500);
    // kill -9 right away: the 200s promised the entries were on disk already.
    let mut gw = Arc::into_inner(gw).expect("sole owner");
    gw.kill9();

    // Restart through a proxy that lets 100 publishes through and swallows the connection
    // at the 101st: the drain stops at a known point, with entries still in the spool.
    let proxy = Proxy::to_rabbitmq().await;
    proxy.black_hole_after_publishes(100);
    cfg.amqp_url = proxy.amqp_url("");
    let mut gw = Gateway::start(&cfg).await;
    assert!(
        eventually(DRAIN_DEADLINE, || async { proxy.tripped() }).await,
        "the drain never reached its 101st publish"
    );
    let depth = spool_depth(&gw, &client).await;
    gw.kill9();
    assert!(
        depth >= 400,
        "entries are deleted only after their ack: {depth} left of 500"
    );

    cfg.amqp_url = AMQP_URL.to_owned();
    let gw = Gateway::start(&cfg).await;
    gw.accept(&client, "sentinel").await;
    let received = ids(&broker.until_within("sentinel", DRAIN_DEADLINE).await);
    let lost = missing(&accepted, &received);
    assert!(lost.is_empty(), "accepted events lost: {lost:?}");
    // Only what went out before the kill may come twice.
    let dups = duplicates(&received);
    assert!(dups.len() <= 100, "{} ids came twice", dups.len());
    // Each sender's events arrive in the order it sent them (first arrivals).
    for t in 0..TASKS {
        let prefix = format!("evt_{t}_");
        let mut seen = std::collections::BTreeSet::new();
        let firsts: Vec<&String> = received
            .iter()
            .filter(|id| id.starts_with(&prefix) && seen.insert(id.as_str()))
            .collect();
        let mut sorted = firsts.clone();
        sorted.sort();
        assert_eq!(firsts, sorted, "sender {t}'s order");
    }
    broker.delete().await;
}

#[tokio::test]
async fn events_drained_before_a_kill_9_are_not_published_again() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture_broker_away().await;
    let mut gw = Gateway::start(&cfg).await;
    let client = client(None);
    let spooled = accept_numbered(&gw, &client, 300).await;
    gw.stop().await;

    // The drainer counts an entry as done (the depth /spool reports) only once its delete
    // is on disk: a kill -9 right after the spool reads empty republishes nothing.
    cfg.amqp_url = AMQP_URL.to_owned();
    let mut gw = Gateway::start(&cfg).await;
    wait_drained(&gw, &client, DRAIN_DEADLINE).await;
    gw.kill9();

    let gw = Gateway::start(&cfg).await;
    gw.accept(&client, "sentinel").await;
    let received = ids(&broker.until_within("sentinel", DRAIN_DEADLINE).await);
    let dups = duplicates(&received);
    assert!(
        dups.is_empty(),
        "{} drained events were published again after the kill -9: {dups:?}",
        dups.len()
    );
    assert_eq!(received, spooled, "each once, in order");
    wait_drained(&gw, &client, BROKER_TIMEOUT).await;
    broker.delete().await;
}

/// Fills the spool until an event is refused; returns the accepted ids and the refused
/// event (id, body, request id) with its answer.
async fn fill_until_refused(
    gw: &Gateway,
    client: &reqwest::Client,
) -> (Vec<String>, (String, String, String), Answer) {
    let mut accepted = Vec::new();
    for i in 0..200 {
        let id = format!("evt_{i:03}");
        let body = event_body(&id);
        let request_id = format!("req_{id}");
        let a = gw.deliver_answer(client, &body, &request_id).await;
        match a.status {
            200 => {
                assert_eq!(a.body["status"], "accepted", "{}", a.body);
                accepted.push(id);
            }
            _ => return (accepted, (id, body, request_id), a),
        }
    }
    panic!("a 4KiB spool took 200 events");
}

/// A 503 `unavailable` with a `Retry-After` in seconds: the sender retries later.
pub(crate) fn assert_retry_later(a: &Answer, what: &str) {
    assert_eq!(a.status, 503, "{what}: {}", a.body);
    assert_eq!(
        a.body,
        serde_json::json!({"error": "unavailable"}),
        "{what}"
    );
    let secs: u64 = a
        .retry_after
        .as_deref()
        .unwrap_or_else(|| panic!("{what}: no Retry-After"))
        .parse()
        .expect("Retry-After in seconds");
    assert!(secs > 0, "{what}: Retry-After {secs}");
}

#[tokio::test]
async fn a_full_spool_answers_503_and_the_senders_retry_is_accepted_later() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture_broker_away().await;
    cfg.extra = "spool:\n  max_bytes: 4KiB\n".into();
    let mut gw = Gateway::start(&cfg).await;
    let client = client(None);

    let (mut accepted, (id, body, request_id), refused) = fill_until_refused(&gw, &client).await;
    assert!(!accepted.is_empty(), "nothing fitted in the spool");
    assert_retry_later(&refused, "spool full");
    // The room left is topped up with small events, so that no retry of the refused one
    // fits: its message may come out a few bytes shorter (the receipt time leaves out
    // trailing zeros).
    for i in 0.. {
        assert!(i < 100, "a 4KiB spool took 100 small events");
        let small = format!("s{i}");
        let small_body = serde_json::json!({"id": small, "event": "e"}).to_string();
        let a = gw
            .deliver_answer(&client, &small_body, &format!("req_{small}"))
            .await;
        if a.status != 200 {
            assert_retry_later(&a, "a small event, spool full");
            break;
        }
        accepted.push(small);
    }
    // The refused event was not recorded as seen: its retry is judged afresh (still full).
    let again = gw.deliver_answer(&client, &body, &request_id).await;
    assert_retry_later(&again, "retry while still full");

    gw.stop().await;
    cfg.amqp_url = AMQP_URL.to_owned();
    let gw = Gateway::start(&cfg).await;
    // The sender retries after Retry-After; by then the spool has drained.
    wait_drained(&gw, &client, DRAIN_DEADLINE).await;
    let retry = gw.deliver_answer(&client, &body, &request_id).await;
    assert_eq!(retry.status, 200, "{}", retry.body);
    assert_eq!(
        retry.body,
        serde_json::json!({"status": "accepted", "event_id": id}),
        "the retry is accepted, not a duplicate"
    );
    gw.accept(&client, "sentinel").await;
    let got = ids(&broker.until_within("sentinel", DRAIN_DEADLINE).await);
    let mut expected = accepted.clone();
    expected.push(id);
    assert_eq!(got, expected);
    broker.delete().await;
}

#[tokio::test]
async fn with_the_spool_disabled_a_broker_failure_is_503_and_nothing_is_recorded() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture_broker_away().await;
    cfg.extra = "spool:\n  enabled: false\n".into();
    let mut gw = Gateway::start(&cfg).await;
    let client = client(None);

    let body = event_body("evt_nospool");
    let first = gw.deliver_answer(&client, &body, "req_nospool").await;
    assert_retry_later(&first, "spool disabled");
    let (status, why) = gw.admin_get(&client, "/readyz").await;
    assert_eq!(status, 503, "{why}");
    let again = gw.deliver_answer(&client, &body, "req_nospool").await;
    assert_retry_later(&again, "retry, broker still away");

    gw.stop().await;
    cfg.amqp_url = AMQP_URL.to_owned();
    let gw = Gateway::start(&cfg).await;
    let (status, why) = gw
        .admin_until(&client, "/readyz", BROKER_TIMEOUT, |s, _| s == 200)
        .await;
    assert_eq!(status, 200, "{why}");
    let retry = gw.deliver_answer(&client, &body, "req_nospool").await;
    assert_eq!(
        retry.body,
        serde_json::json!({"status": "accepted", "event_id": "evt_nospool"}),
        "the retry is accepted, not a duplicate"
    );
    gw.accept(&client, "sentinel").await;
    assert_eq!(
        ids(&broker.until_within("sentinel", DRAIN_DEADLINE).await),
        vec!["evt_nospool".to_owned()]
    );
    broker.delete().await;
}

#[tokio::test]
async fn readyz_is_200_spooling_while_there_is_room_and_503_when_full() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture_broker_away().await;
    cfg.extra = "spool:\n  max_bytes: 4KiB\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);

    let (status, why) = gw.admin_get(&client, "/readyz").await;
    assert_eq!(status, 200, "{why}");
    assert!(why.contains("spooling"), "{why}");
    gw.accept(&client, "evt_first").await;
    let (status, why) = gw.admin_get(&client, "/readyz").await;
    assert_eq!(status, 200, "{why}");
    assert!(why.contains("spooling"), "{why}");

    let (_, _, refused) = fill_until_refused(&gw, &client).await;
    assert_retry_later(&refused, "spool full");
    let (status, why) = gw.admin_get(&client, "/readyz").await;
    assert_eq!(
        status, 503,
        "once the spool refuses events, not ready: {why}"
    );
    broker.delete().await;
}

/// A gateway (with `extra` config) connected to a broker whose queue holds one message,
/// and the event `evt_fits` published to it: the queue is full from then on.
async fn start_on_a_full_queue(
    extra: &str,
) -> (tempfile::TempDir, Broker, Gateway, reqwest::Client) {
    let broker = Broker::rejecting_beyond(1).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    cfg.extra = extra.into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    gw.accept(&client, "evt_fits").await;
    (dir, broker, gw, client)
}

#[tokio::test]
async fn an_event_the_broker_nacks_is_spooled_and_arrives_once_the_queue_has_room() {
    require_broker!();
    let (_dir, broker, gw, client) = start_on_a_full_queue("").await;
    // The queue is full: the broker nacks the next publish. The event is spooled (200), and
    // the drainer retries until the queue has room.
    gw.accept(&client, "evt_nacked").await;
    assert_eq!(
        spool_depth(&gw, &client).await,
        1,
        "the nacked event waits in the spool"
    );
    assert_eq!(
        broker.message_count().await,
        1,
        "the broker kept only the first"
    );

    gw.accept(&client, "sentinel").await;
    let got = ids(&broker.until_within("sentinel", DRAIN_DEADLINE).await);
    assert_eq!(got, ["evt_fits", "evt_nacked"], "each once, in order");
    broker.delete().await;
}

#[tokio::test]
async fn on_a_full_disk_spooling_answers_503_and_once_there_is_room_the_gateway_takes_deliveries_and_drains_with_no_restart(
) {
    require_broker!();
    let Some((disk, _dir, broker, mut cfg)) = fixture_on_small_disk().await else {
        return;
    };
    let (proxy, gw, client) = spooling_behind_a_cut_proxy(&mut cfg).await;
    let mut accepted = accept_numbered(&gw, &client, 3).await;

    // The disk fills. A spooled event that cannot be flushed is refused, not accepted.
    disk.fill();
    let (more, refused) = accept_until_refused(&gw, &client, 3, 197).await;
    accepted.extend(more);
    let (status, why) = gw.admin_get(&client, "/readyz").await;
    assert_eq!(status, 503, "a spool that cannot write is not ready: {why}");
    let (status, why) = gw.admin_get(&client, "/healthz").await;
    assert_eq!(
        status, 200,
        "a full disk passes without a restart, so liveness holds: {why}"
    );

    // Room again, and the broker back: nobody restarts anything.
    disk.free();
    proxy.restore();
    let (status, why) = gw
        .admin_until(&client, "/readyz", DRAIN_DEADLINE, |s, _| s == 200)
        .await;
    assert_eq!(status, 200, "ready again once the disk has room: {why}");
    wait_drained(&gw, &client, DRAIN_DEADLINE).await;
    // The sender retries what was refused; then a new event.
    gw.accept(&client, &refused).await;
    accepted.push(refused);
    gw.accept(&client, "sentinel").await;
    let got = ids(&broker.until_within("sentinel", DRAIN_DEADLINE).await);
    assert_eq!(
        got, accepted,
        "every accepted event once, in order, then the retried one"
    );
    let (status, why) = gw.admin_get(&client, "/healthz").await;
    assert_eq!(status, 200, "{why}");
    broker.delete().await;
}

/// The spool's status as JSON once `check` holds, or after [`BROKER_TIMEOUT`]: the drainer
/// counts a batch's entries as drained (or moved, or parked) once its commit returned,
/// which may be just after the broker took the batch's last message.
async fn spool_json_once(
    gw: &Gateway,
    client: &reqwest::Client,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let (_, body) = gw
        .admin_until(client, "/spool", BROKER_TIMEOUT, |_, b| {
            serde_json::from_str(b).is_ok_and(|v| check(&v))
        })
        .await;
    serde_json::from_str(&body).expect("spool json")
}

/// The spool's status as JSON.
async fn spool_json(gw: &Gateway, client: &reqwest::Client) -> serde_json::Value {
    let (status, body) = gw.admin_get(client, "/spool").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("spool json")
}

#[tokio::test]
async fn an_event_id_over_255_bytes_spooled_while_the_broker_is_away_arrives_and_nothing_stalls() {
    require_broker!();
    let (dir, broker, mut cfg) = fixture().await;
    let (proxy, gw, client) = spooling_behind_a_cut_proxy(&mut cfg).await;
    // An AMQP short string (message_id) holds 255 bytes; hookgate takes ids up to 512.
    let long_id = format!("evt_{}", "x".repeat(296));
    assert_eq!(long_id.len(), 300);
    gw.accept(&client, &long_id).await;
    gw.accept(&client, "evt_after").await;

    proxy.restore();
    wait_broker_connected(&client, &gw).await;
    gw.accept(&client, "sentinel").await;
    let got = broker.until_within("sentinel", DRAIN_DEADLINE).await;
    let ids: Vec<_> = got.iter().map(|m| m.header("x-event-id")).collect();
    assert_eq!(
        got.len(),
        2,
        "both events arrive, once each: x-event-id {ids:?}"
    );
    let fitted = got[0].message_id.clone().expect("message_id");
    assert!(fitted.len() <= 255, "message_id fits: {fitted}");
    assert_ne!(fitted, long_id);
    assert_eq!(
        got[0].header("x-event-id").as_deref(),
        Some(long_id.as_str())
    );
    assert_eq!(got[0].json()["id"], long_id.as_str(), "body byte for byte");
    assert_eq!(got[1].message_id.as_deref(), Some("evt_after"));
    assert_eq!(got[1].header("x-event-id"), None, "only a long id needs it");
    wait_drained(&gw, &client, BROKER_TIMEOUT).await;
    let (status, why) = gw.admin_get(&client, "/readyz").await;
    assert_eq!(status, 200, "{why}");
    assert!(why.contains("broker connected"), "{why}");

    // Published directly by another gateway (its own store, so not a duplicate), the same
    // event gets the same message_id: consumers can dedup on it.
    let other_dir = dir.path().join("other");
    std::fs::create_dir_all(&other_dir).expect("dir");
    let other = Gateway::start(&GatewayConfig::new(&other_dir, &broker.exchange)).await;
    wait_broker_connected(&client, &other).await;
    other.accept(&client, &long_id).await;
    let again = broker
        .next(BROKER_TIMEOUT)
        .await
        .expect("published directly");
    assert_eq!(again.message_id.as_deref(), Some(fitted.as_str()));
    assert_eq!(
        again.header("x-event-id").as_deref(),
        Some(long_id.as_str())
    );
    broker.delete().await;
}

/// An inbound message body of `contact` (not a keyword, so the guard lets it through).
fn received_body(event_id: &str, contact: &str, text: &str) -> String {
    serde_json::json!({
        "id": event_id,
        "event": "message.received",
        "timestamp": rfc3339_from_now(0),
        "data": {"from": contact, "to": "+15550000000", "text": text}
    })
    .to_string()
}

/// A status event of `message_id` with its own event type (`message.sent`, ...).
fn typed_status_body(event_id: &str, event_type: &str, message_id: &str, status: &str) -> String {
    serde_json::json!({
        "id": event_id,
        "event": event_type,
        "timestamp": rfc3339_from_now(0),
        "data": {"message_id": message_id, "status": status}
    })
    .to_string()
}

#[tokio::test]
async fn an_unroutable_event_waits_apart_while_other_keys_flow_and_its_guard_key_keeps_order() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::unbound().await;
    broker.bind("message.received").await;
    broker.bind("message.status").await;
    let cfg = GatewayConfig::new(dir.path(), &broker.exchange).with_spec_guard();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    // No queue is bound for `message.sent` yet.
    let held = [
        (
            "evt_sent_1",
            typed_status_body("evt_sent_1", "message.sent", "msg_1", "sent"),
        ),
        // The same message's next status: routable, but its guard key waits behind the first.
        (
            "evt_delivered_1",
            status_body("evt_delivered_1", "msg_1", "delivered"),
        ),
    ];
    for (id, body) in &held {
        gw.accept_body(&client, id, body).await;
    }
    let mut flowing = Vec::new();
    for i in 0..5 {
        let id = format!("evt_received_{i}");
        let body = received_body(&id, &format!("+1555000100{i}"), "hello");
        gw.accept_body(&client, &id, &body).await;
        flowing.push(id);
    }
    let id = "evt_delivered_2";
    gw.accept_body(&client, id, &status_body(id, "msg_2", "delivered"))
        .await;
    flowing.push(id.to_owned());
    let sentinel = received_body("sentinel", "+15550009999", "last");
    gw.accept_body(&client, "sentinel", &sentinel).await;
    let got = ids(&broker.until_within("sentinel", DRAIN_DEADLINE).await);
    assert_eq!(got, flowing, "routable events of other keys flow, in order");

    let spool = spool_json_once(&gw, &client, |s| s["held"] == 2).await;
    assert_eq!(spool["held"], 2, "{spool}");
    let metrics = scrape(&client, &gw).await;
    assert_eq!(metrics.find("hookgate_spool_held", &[]), Some(2.0));
    let (status, why) = gw.admin_get(&client, "/readyz").await;
    assert_eq!(
        status, 200,
        "events waiting for a queue do not stall the rest: {why}"
    );

    // A queue for `message.sent` appears: the held event arrives, and the one of the same
    // message behind it, in their order.
    broker.bind("message.sent").await;
    let mut late = Vec::new();
    for _ in 0..2 {
        let m = broker
            .next(DRAIN_DEADLINE)
            .await
            .expect("held events arrive");
        late.push(m.message_id.expect("message_id"));
    }
    assert_eq!(late, ["evt_sent_1", "evt_delivered_1"]);
    let (_, body) = gw
        .admin_until(&client, "/spool", BROKER_TIMEOUT, |_, b| {
            b.contains("\"held\":0")
        })
        .await;
    assert!(body.contains("\"held\":0"), "{body}");
    assert_eq!(broker.message_count().await, 0, "each once");
    broker.delete().await;
}

/// A spool entry as the store holds it (4-byte length of the JSON metadata, the metadata,
/// the body), written by the test as an earlier version of hookgate would have.
fn spool_entry(id: &str, routing_key: &str) -> Vec<u8> {
    let meta = serde_json::json!({
        "routing_key": routing_key,
        "message_id": id,
        "timestamp_secs": time::OffsetDateTime::now_utc().unix_timestamp(),
        "request_id": format!("req_{id}"),
        "event_type": "contact.created",
        "attempt": null,
        "route": "botix",
        "received_at": rfc3339_from_now(0),
    })
    .to_string();
    let mut entry = (meta.len() as u32).to_be_bytes().to_vec();
    entry.extend_from_slice(meta.as_bytes());
    entry.extend_from_slice(event_body(id).as_bytes());
    entry
}

/// The ids of the parked entries, from the admin listing.
async fn parked_ids(gw: &Gateway, client: &reqwest::Client) -> Vec<u64> {
    let (status, body) = gw.admin_get(client, "/spool/parked").await;
    assert_eq!(status, 200, "{body}");
    let entries: Vec<serde_json::Value> = serde_json::from_str(&body).expect("listing");
    entries
        .iter()
        .map(|e| e["id"].as_u64().expect("id"))
        .collect()
}

#[tokio::test]
async fn changing_parked_entries_needs_the_admin_token_as_well_as_a_loopback_peer() {
    require_broker!();
    let (dir, broker, mut cfg) = fixture().await;
    {
        let store = durable_spool::Store::open(&cfg.store).expect("store");
        let set_aside = store.tree("spool_corrupt").expect("tree");
        for (i, id) in ["evt_kept", "evt_changed"].into_iter().enumerate() {
            set_aside
                .insert(
                    &(i as u64).to_be_bytes(),
                    &spool_entry(id, "contact.created"),
                )
                .expect("insert");
        }
        store.flush().await.expect("flush");
    }
    let client = client(None);
    let delete = reqwest::Method::DELETE;

    // Without admin.token_file, no change is allowed, whatever is presented.
    let mut gw = Gateway::start(&cfg).await;
    let ids = parked_ids(&gw, &client).await;
    assert_eq!(ids.len(), 2, "{ids:?}");
    let path = format!("/spool/parked/{}", ids[0]);
    let (status, body) = admin_change(&gw, &client, delete.clone(), &path, Some("guess")).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("no admin.token_file"), "{body}");
    gw.stop().await;

    cfg.admin_extra = admin_token_file(dir.path(), "the-right-admin-token");
    let gw = Gateway::start(&cfg).await;
    for token in [
        None,
        Some("the-wrong-admin-token"),
        Some("the-right-admin-toke"),
    ] {
        let (status, body) = admin_change(&gw, &client, delete.clone(), &path, token).await;
        assert_eq!(status, 403, "{token:?}: {body}");
        assert!(body.contains("admin token"), "{body}");
        let republish = format!("{path}/republish");
        let (status, _) =
            admin_change(&gw, &client, reqwest::Method::POST, &republish, token).await;
        assert_eq!(status, 403, "{token:?}");
    }
    assert_eq!(parked_ids(&gw, &client).await, ids, "nothing was changed");

    let (status, body) = admin_change(
        &gw,
        &client,
        delete.clone(),
        &path,
        Some("the-right-admin-token"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(parked_ids(&gw, &client).await, ids[1..].to_vec());

    // The CLI reads the same file from the same config.
    let running = config_for_cli(&gw, dir.path());
    let (ok, out, err) = spool_cli(&running, &["delete", &ids[1].to_string(), "--yes"]).await;
    assert!(ok, "delete through the CLI failed: {err}");
    assert!(out.contains("deleted parked entry"), "{out}");
    assert!(parked_ids(&gw, &client).await.is_empty());
    broker.delete().await;
}

/// The id `hookgate spool parked` lists first on the line that mentions `needle`.
fn parked_id(listing: &str, needle: &str) -> String {
    listing
        .lines()
        .find(|l| l.contains(needle))
        .and_then(|l| l.split('\t').next())
        .unwrap_or_else(|| panic!("no parked entry mentions {needle}:\n{listing}"))
        .to_owned()
}

#[tokio::test]
async fn entries_that_cannot_be_published_are_parked_listed_and_republished_or_deleted() {
    require_broker!();
    let (dir, broker, mut cfg) = fixture().await;
    cfg.admin_extra = admin_token_file(dir.path(), "parked-admin-token");
    let long_key = format!("contact.{}", "k".repeat(300));
    {
        // What an earlier version may have left: an entry it cannot decode, one whose
        // routing key cannot be sent, an ordinary one, and one it had set aside.
        let store = durable_spool::Store::open(&cfg.store).expect("store");
        let spool = store.tree("spool").expect("tree");
        spool
            .insert(&0u64.to_be_bytes(), b"\0\0\0\x09not json!")
            .expect("insert");
        spool
            .insert(&1u64.to_be_bytes(), &spool_entry("evt_long_key", &long_key))
            .expect("insert");
        spool
            .insert(
                &2u64.to_be_bytes(),
                &spool_entry("evt_ok", "contact.created"),
            )
            .expect("insert");
        let set_aside = store.tree("spool_corrupt").expect("tree");
        set_aside
            .insert(
                &0u64.to_be_bytes(),
                &spool_entry("evt_rescued", "contact.created"),
            )
            .expect("insert");
        store.flush().await.expect("flush");
    }
    let mut gw = Gateway::start(&cfg).await;
    let client = client(None);
    gw.accept(&client, "sentinel").await;
    let got = ids(&broker.until_within("sentinel", DRAIN_DEADLINE).await);
    assert_eq!(
        got,
        ["evt_ok"],
        "entries that cannot be published hold back nothing"
    );
    let spool = spool_json_once(&gw, &client, |s| s["depth"] == 0 && s["parked"] == 3).await;
    assert_eq!(
        (&spool["depth"], &spool["parked"]),
        (&0.into(), &3.into()),
        "{spool}"
    );
    let metrics = scrape(&client, &gw).await;
    assert_eq!(metrics.find("hookgate_spool_parked", &[]), Some(3.0));
    assert!(
        gw.logged("spool entry parked", BROKER_TIMEOUT).await,
        "parking is logged"
    );

    let running = config_for_cli(&gw, dir.path());
    let (ok, listing, err) = spool_cli(&running, &["parked"]).await;
    assert!(ok, "spool parked failed: {err}");
    assert_eq!(listing.lines().count(), 3, "{listing}");
    let undecodable = parked_id(&listing, "cannot be decoded");
    let unfit = parked_id(&listing, "evt_long_key");
    assert!(
        listing
            .lines()
            .any(|l| l.contains("evt_long_key") && l.contains("routing key")),
        "{listing}"
    );
    let rescued = parked_id(&listing, "evt_rescued");

    // Republished, an entry that can be published arrives.
    let (ok, out, err) = spool_cli(&running, &["republish", &rescued]).await;
    assert!(ok, "republish failed: {err}");
    assert!(
        out.contains(&format!("republished parked entry {rescued}")),
        "{out}"
    );
    let m = broker
        .next(DRAIN_DEADLINE)
        .await
        .expect("the republished entry arrives");
    assert_eq!(m.message_id.as_deref(), Some("evt_rescued"));

    // Deleting loses events: not without --yes.
    let (ok, _, err) = spool_cli(&running, &["delete", &undecodable]).await;
    assert!(!ok, "delete without --yes must fail");
    assert!(err.contains("--yes"), "{err}");
    assert_eq!(spool_json(&gw, &client).await["parked"], 2);
    let (ok, _, err) = spool_cli(&running, &["delete", &undecodable, "--yes"]).await;
    assert!(ok, "delete failed: {err}");
    assert_eq!(spool_json(&gw, &client).await["parked"], 1);
    // An entry that still cannot be published is parked again, not retried forever.
    let (ok, _, err) = spool_cli(&running, &["republish", &unfit]).await;
    assert!(ok, "republish failed: {err}");
    let (_, body) = gw
        .admin_until(&client, "/spool", DRAIN_DEADLINE, |_, b| {
            b.contains("\"depth\":0") && b.contains("\"parked\":1")
        })
        .await;
    assert!(body.contains("\"parked\":1"), "{body}");

    // With the gateway stopped, the CLI works on the store itself.
    gw.stop().await;
    let (ok, listing, err) = spool_cli(&gw.config_path, &["parked"]).await;
    assert!(ok, "spool parked (stopped) failed: {err}");
    assert!(listing.contains("evt_long_key"), "{listing}");
    let (ok, _, err) = spool_cli(&gw.config_path, &["delete", "--all", "--yes"]).await;
    assert!(ok, "delete --all failed: {err}");
    let (ok, out, err) = spool_status_cli(&gw.config_path).await;
    assert!(ok, "{err}");
    assert!(out.contains("parked: 0\n"), "{out}");
    assert_eq!(
        broker.message_count().await,
        0,
        "nothing else was published"
    );
    broker.delete().await;
}

#[tokio::test]
async fn readiness_is_503_while_the_broker_keeps_refusing_the_spool_head_and_200_once_it_drains() {
    require_broker!();
    let (_dir, broker, gw, client) = start_on_a_full_queue("spool:\n  stall_after: 4s\n").await;
    // The queue is full: the broker nacks this one, and keeps nacking it from the spool.
    gw.accept(&client, "evt_nacked").await;
    let (status, why) = gw
        .admin_until(&client, "/readyz", DRAIN_DEADLINE, |s, _| s == 503)
        .await;
    assert_eq!(
        status, 503,
        "a spool that does not drain is not ready: {why}"
    );
    assert!(why.contains("not making progress"), "{why}");
    assert_eq!(spool_json(&gw, &client).await["stalled"], true);
    let metrics = scrape(&client, &gw).await;
    assert_eq!(
        metrics.find("hookgate_spool_drainer_stalled", &[]),
        Some(1.0)
    );

    // A consumer makes room: the head goes, and the gateway is ready again.
    let first = broker.next(BROKER_TIMEOUT).await.expect("the first event");
    assert_eq!(first.message_id.as_deref(), Some("evt_fits"));
    let (status, why) = gw
        .admin_until(&client, "/readyz", DRAIN_DEADLINE, |s, _| s == 200)
        .await;
    assert_eq!(status, 200, "{why}");
    let second = broker.next(DRAIN_DEADLINE).await.expect("the nacked event");
    assert_eq!(second.message_id.as_deref(), Some("evt_nacked"));
    let metrics = scrape(&client, &gw).await;
    assert_eq!(
        metrics.find("hookgate_spool_drainer_stalled", &[]),
        Some(0.0)
    );
    broker.delete().await;
}

#[tokio::test]
async fn a_routing_key_over_255_bytes_is_refused_before_anything_is_recorded() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    // `botix.` adds 6 bytes to the main key, `.dropped` 8 to the drop copy's.
    cfg.amqp_extra =
        "  routing_key: \"{route}.{event}\"\n  dropped_routing_key: \"{event}.dropped\"\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    let body = |event_type: &str| {
        serde_json::json!({
            "id": "evt_long_type",
            "event": event_type,
            "timestamp": rfc3339_from_now(0),
        })
        .to_string()
    };
    let fits = "t".repeat(247);
    let too_long = "t".repeat(248);

    let a = gw.deliver_answer(&client, &body(&too_long), "req_1").await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(
        a.body,
        serde_json::json!({"error": "routing key made from the event type is too long"})
    );
    // Nothing was recorded: the same event id with a type that fits is accepted.
    gw.accept_body(&client, "evt_long_type", &body(&fits)).await;
    let m = broker.next(BROKER_TIMEOUT).await.expect("published");
    assert_eq!(m.routing_key, format!("botix.{fits}"));
    assert_eq!(m.message_id.as_deref(), Some("evt_long_type"));
    broker.delete().await;
}

/// The records of `tests/data/spool/legacy-v0-records.json`: spool entries exactly as
/// hookgate wrote them before its records had a format version.
fn legacy_records() -> Vec<Vec<u8>> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/spool/legacy-v0-records.json");
    let text = std::fs::read_to_string(&path).expect("legacy fixture");
    let fixture: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    fixture["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| hex::decode(r["hex"].as_str().expect("hex")).expect("hex digits"))
        .collect()
}

#[tokio::test]
async fn a_spool_left_in_the_legacy_format_drains_in_order_after_an_upgrade() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    {
        let store = durable_spool::Store::open(&cfg.store).expect("store");
        let spool = store.tree("spool").expect("tree");
        let records = legacy_records();
        for (seq, record) in (0u64..).zip(&records) {
            spool.insert(&seq.to_be_bytes(), record).expect("insert");
        }
        // A record in a format version this hookgate does not know (a newer one wrote it):
        // parked with the reason, never dropped and never in the way.
        spool
            .insert(&3u64.to_be_bytes(), b"\x09from a newer hookgate")
            .expect("insert");
        store.flush().await.expect("flush");
    }
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    gw.accept(&client, "sentinel").await;
    let got = broker.until_within("sentinel", DRAIN_DEADLINE).await;
    let ids: Vec<_> = got.iter().map(|m| m.message_id.as_deref()).collect();
    assert_eq!(
        ids,
        [
            Some("evt_legacy_1"),
            Some("evt_legacy_2"),
            Some("SM1:delivered")
        ],
        "every legacy entry once, in order, before what came after"
    );
    assert_eq!(got[0].routing_key, "contact.created");
    assert_eq!(got[0].header("x-delivery-attempt").as_deref(), Some("2"));
    assert_eq!(
        got[0].header("x-request-id").as_deref(),
        Some("req_legacy_1")
    );
    assert_eq!(got[0].timestamp, Some(1_795_946_400));
    assert_eq!(
        got[1].body,
        "{\"id\":\"evt_legacy_2\",\"event\":\"message.status\",\"data\":{\"message_id\":\"msg_1\",\"status\":\"read\",\"text\":\"caf\u{e9} \u{20ac}\"}}".as_bytes(),
        "the body byte for byte"
    );
    assert_eq!(got[1].header("x-delivery-attempt"), None);
    assert_eq!(got[2].routing_key, "twilio.message.status");
    assert_eq!(got[2].header("x-route").as_deref(), Some("twilio"));
    assert_eq!(
        got[2].content_type.as_deref(),
        Some("application/x-www-form-urlencoded")
    );
    assert_eq!(got[2].body, b"MessageSid=SM1&MessageStatus=delivered");

    let spool = spool_json_once(&gw, &client, |s| s["depth"] == 0 && s["parked"] == 1).await;
    assert_eq!(
        (&spool["depth"], &spool["parked"]),
        (&0.into(), &1.into()),
        "{spool}"
    );
    let (status, parked) = gw.admin_get(&client, "/spool/parked").await;
    assert_eq!(status, 200, "{parked}");
    assert!(
        parked.contains("cannot be decoded") && parked.contains("version 9"),
        "the reason names the unknown version: {parked}"
    );
    assert_eq!(
        broker.message_count().await,
        0,
        "nothing after the sentinel"
    );
    broker.delete().await;
}

/// The store of `tests/data/spool/README.md` ("sled-v0"), written by the sled spool.
fn sled_v0_store() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/spool/sled-v0/store")
}

#[tokio::test]
async fn a_sled_spool_written_by_the_previous_version_is_migrated_drained_and_removed() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    // A copy: the migration changes the store it opens.
    std::fs::create_dir_all(&cfg.store).expect("store folder");
    for entry in std::fs::read_dir(sled_v0_store()).expect("fixture") {
        let entry = entry.expect("fixture file");
        std::fs::copy(entry.path(), cfg.store.join(entry.file_name())).expect("copy");
    }
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    // Everything was moved at the start, and sled's files went with nothing left in them.
    for name in ["conf", "db", "blobs"] {
        assert!(
            !cfg.store.join(name).exists(),
            "sled's {name} is still in the store folder"
        );
    }
    let (_, body) = gw
        .admin_until(&client, "/spool", DRAIN_DEADLINE, |_, b| {
            b.contains("\"depth\":0") && b.contains("\"held\":0")
        })
        .await;
    let spool: serde_json::Value = serde_json::from_str(&body).expect("spool json");
    assert_eq!(
        (&spool["depth"], &spool["held"], &spool["parked"]),
        (&0.into(), &0.into(), &1.into()),
        "drained, the unreadable entry still parked: {spool}"
    );
    gw.accept(&client, "sentinel").await;
    let got = ids(&broker.until_within("sentinel", DRAIN_DEADLINE).await);
    let main: Vec<&String> = got
        .iter()
        .filter(|id| id.contains("_main_") && id.as_str() != "evt_sled_main_4")
        .collect();
    let held: Vec<&String> = got
        .iter()
        .filter(|id| id.contains("_held_") || id.as_str() == "evt_sled_main_4")
        .collect();
    assert_eq!(got.len(), 6, "each entry once: {got:?}");
    assert_eq!(
        main,
        ["evt_sled_main_1", "evt_sled_main_2", "evt_sled_main_3"],
        "the ordered entries in order: {got:?}"
    );
    assert_eq!(
        held,
        ["evt_sled_held_1", "evt_sled_held_2", "evt_sled_main_4"],
        "held entries in order, the one left in two areas once, from held: {got:?}"
    );
    let (status, parked) = gw.admin_get(&client, "/spool/parked").await;
    assert_eq!(status, 200, "{parked}");
    assert!(
        parked.contains("\"id\":6") && parked.contains("unreadable"),
        "the parked entry keeps its number and reason: {parked}"
    );
    broker.delete().await;
}
