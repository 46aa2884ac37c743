//! Reconciliation (contract §10) against a fake of the sender's list API, a real HTTP
//! server the test starts (`util::fake_botix`): pages, the sender's pacing rules, refused
//! keys and cursors, a kill -9 mid-walk, and the webhook path beside it.

use std::time::Duration;

use crate::redis::{on_redis, redis_available, KeyPrefix, REDIS_URL};
use crate::require_broker;
use crate::util::fake_botix::{message, FakeBotix, Logged, Scripted};
use crate::util::*;

/// The key the fake accepts.
pub(crate) const KEY: &str = "botix_test_key_5d1e";
/// The gateway's admin token, where a test asks for a walk.
pub(crate) const ADMIN_TOKEN: &str = "reconcile-admin-token-7c3a";
/// Messages are listed with this age, well inside any lookback.
const AGE_SECS: i64 = -120;

/// A gateway config whose route reconciles with `fake` (key in a file), with the spec's
/// guard, page size 2 and `extra` keys of the block (indented six spaces).
pub(crate) fn reconciling(mut cfg: GatewayConfig, fake: &FakeBotix, extra: &str) -> GatewayConfig {
    let key_path = cfg.dir.join("botix-api-key");
    if !key_path.exists() {
        std::fs::write(&key_path, format!("{KEY}\n")).expect("key file");
    }
    cfg = cfg.with_spec_guard();
    cfg.route_extra.push_str(&format!(
        "    reconcile:\n      url: {}\n      token_file: {}\n      interval: 1h\n      page_size: 2\n      timeout: 5s\n{extra}",
        fake.url(),
        key_path.display()
    ));
    cfg
}

pub(crate) fn outbound(id: &str, status: &str) -> serde_json::Value {
    message(
        id,
        "outbound",
        Some(status),
        "+15550100",
        "+15550199",
        "hello",
        &rfc3339_from_now(AGE_SECS),
    )
}

/// Five listed messages: two statuses, two inbound (a STOP among them) and an outbound
/// message with no status yet, which makes no event.
pub(crate) fn five_listed() -> [serde_json::Value; 5] {
    [
        outbound("msg_a", "delivered"),
        outbound("msg_b", "sent"),
        inbound("msg_c", "+15550111", "hi there"),
        message(
            "msg_d",
            "outbound",
            None,
            "+1",
            "+2",
            "no status yet",
            &rfc3339_from_now(AGE_SECS),
        ),
        inbound("msg_e", "+15550112", "STOP"),
    ]
}

pub(crate) fn inbound(id: &str, from: &str, text: &str) -> serde_json::Value {
    message(
        id,
        "inbound",
        None,
        from,
        "+15550100",
        text,
        &rfc3339_from_now(AGE_SECS),
    )
}

/// The route's reconciliation metric `name` (with `kind`, if given).
pub(crate) async fn metric(
    client: &reqwest::Client,
    gw: &Gateway,
    name: &str,
    kind: Option<&str>,
) -> f64 {
    let e = scrape(client, gw).await;
    match kind {
        Some(kind) => e.get(name, &[("route", "botix"), ("kind", kind)]),
        None => e.get(name, &[("route", "botix")]),
    }
}

/// Waits until the route has `n` complete walks.
pub(crate) async fn complete_walks(client: &reqwest::Client, gw: &Gateway, n: f64) {
    let done = eventually(POLL_DEADLINE * 2, || async {
        metric(
            client,
            gw,
            "hookgate_reconcile_walks_total",
            Some("complete"),
        )
        .await
            >= n
    })
    .await;
    assert!(
        done,
        "no complete walk; the gateway's log:\n{}",
        gw.logs().join("\n")
    );
}

/// The fixture with a fake sender that takes [`KEY`], its rate limit out of the way.
async fn fake_fixture() -> (tempfile::TempDir, Broker, GatewayConfig, FakeBotix) {
    let (dir, broker, cfg) = fixture().await;
    let fake = FakeBotix::start(KEY, 100, 60).await;
    (dir, broker, cfg, fake)
}

/// Starts a gateway on `cfg` and waits for its route's first complete walk.
pub(crate) async fn start_walked(cfg: &GatewayConfig) -> (Gateway, reqwest::Client) {
    let gw = Gateway::start(cfg).await;
    let client = client(None);
    complete_walks(&client, &gw, 1.0).await;
    (gw, client)
}

/// The messages published before a webhook sentinel event delivered now.
pub(crate) async fn published(
    client: &reqwest::Client,
    gw: &Gateway,
    broker: &Broker,
) -> Vec<Received> {
    let sentinel = unique("sentinel");
    gw.accept(client, &sentinel).await;
    broker.until(&sentinel).await
}

pub(crate) fn source(m: &Received) -> String {
    m.header("x-source").unwrap_or_default()
}

#[tokio::test]
async fn a_walk_publishes_each_listed_event_once_with_x_source_reconcile() {
    require_broker!();
    let (_dir, broker, cfg, fake) = fake_fixture().await;
    fake.push(five_listed());
    let (gw, client) = start_walked(&reconciling(cfg, &fake, "")).await;

    let got = published(&client, &gw, &broker).await;
    let mut seen: Vec<(String, String, String)> = got
        .iter()
        .map(|m| {
            let body = m.json();
            (
                m.header("x-event-type").unwrap_or_default(),
                body["data"]["message_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                source(m),
            )
        })
        .collect();
    seen.sort();
    let r = |t: &str, id: &str| (t.to_owned(), id.to_owned(), "reconcile".to_owned());
    assert_eq!(
        seen,
        vec![
            r("message.received", "msg_c"),
            r("message.received", "msg_e"),
            r("message.status", "msg_a"),
            r("message.status", "msg_b"),
        ],
        "one event per listed message with something to report, none for msg_d"
    );
    let stop = got
        .iter()
        .find(|m| m.json()["data"]["text"] == "STOP")
        .expect("stop");
    assert_eq!(stop.json()["data"]["from"], "+15550112");
    assert_eq!(stop.message_id.as_deref(), Some("reconcile:msg_e:received"));

    // Three pages of two, walked in order with one `since`.
    let log = fake.log();
    let cursors: Vec<Option<&str>> = log.iter().map(|l| l.cursor.as_deref()).collect();
    assert_eq!(cursors, vec![None, Some("c2"), Some("c4")]);
    assert!(log
        .iter()
        .all(|l| l.since == log[0].since && l.limit.as_deref() == Some("2")));
    assert_eq!(
        metric(&client, &gw, "hookgate_reconcile_pages_total", None).await,
        3.0
    );
    assert_eq!(
        metric(&client, &gw, "hookgate_reconcile_items_total", None).await,
        5.0
    );
    assert_eq!(
        metric(&client, &gw, "hookgate_reconcile_missed_events_total", None).await,
        4.0
    );
    // One INFO line for the walk with how many it published; each event only at DEBUG.
    let lines = |message: &str| -> Vec<serde_json::Value> {
        gw.logs()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["message"] == message)
            .collect()
    };
    let summary = "reconciliation published events the webhook missed";
    assert!(
        wait_until(POLL_DEADLINE, || !lines(summary).is_empty()).await,
        "{}",
        gw.logs().join("\n")
    );
    let summaries = lines(summary);
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    assert_eq!(
        (&summaries[0]["level"], &summaries[0]["published"]),
        (&"INFO".into(), &4.into())
    );
    let each = lines("reconciliation published an event the webhook missed");
    assert_eq!(each.len(), 4, "{each:?}");
    assert!(each.iter().all(|v| v["level"] == "DEBUG"), "{each:?}");
    broker.delete().await;
}

/// Every request after an answer whose `Remaining` was below `min_remaining` came at or
/// after that answer's `Reset`; returns how many such waits the log holds.
pub(crate) fn waits_for_reset(log: &[Logged], min_remaining: u64) -> usize {
    let mut waits = 0;
    for pair in log.windows(2) {
        if pair[0].remaining < min_remaining {
            waits += 1;
            assert!(
                pair[1].at_ms >= pair[0].reset_secs * 1000,
                "a request at {} ms came before Reset {} s: {log:#?}",
                pair[1].at_ms,
                pair[0].reset_secs
            );
        }
    }
    waits
}

#[tokio::test]
async fn no_request_goes_before_reset_once_remaining_is_below_the_threshold() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    // Two requests per 2-second window; the walk needs four pages.
    let fake = FakeBotix::start(KEY, 2, 2).await;
    fake.push((0..8).map(|i| outbound(&format!("msg_{i}"), "delivered")));
    let (gw, client) = start_walked(&reconciling(cfg, &fake, "      min_remaining: 1\n")).await;
    let log = fake.log();
    assert!(
        log.iter().all(|l| l.status == 200),
        "the walker ran into the limit: {log:#?}"
    );
    assert!(waits_for_reset(&log, 1) >= 1, "no window ran out: {log:#?}");
    assert_eq!(log.len(), 4, "{log:#?}");
    assert!(
        metric(
            &client,
            &gw,
            "hookgate_reconcile_rate_limit_wait_seconds_total",
            None
        )
        .await
            > 0.0
    );
    broker.delete().await;
}

#[tokio::test]
async fn a_reset_past_the_next_walk_gives_one_walk_up_per_interval_without_spinning() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    // One request per hour-long window: the first page leaves nothing, and the reset is
    // (but for one second in 3,600) further away than the next walk.
    let fake = FakeBotix::start(KEY, 1, 3600).await;
    fake.push((0..4).map(|i| outbound(&format!("msg_{i}"), "delivered")));
    let cfg = reconciling(cfg, &fake, "");
    let cfg = GatewayConfig {
        route_extra: cfg.route_extra.replace("interval: 1h", "interval: 1s"),
        ..cfg
    };
    let gw = Gateway::start(&cfg).await;
    const GIVEN_UP: &str = "reconciliation walk given up until the next interval";
    assert!(
        gw.logged(GIVEN_UP, POLL_DEADLINE).await,
        "no walk was given up: {}",
        gw.logs().join("\n")
    );
    // A bounded window of four intervals: a walk given up resumes an interval after its
    // try started, so at most one give-up (one log line, at most one request) per
    // interval, and one more for the window's edges.
    let count = |gw: &Gateway| gw.logs().iter().filter(|l| l.contains(GIVEN_UP)).count();
    let (lines_before, requests_before) = (count(&gw), fake.log().len());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (lines, requests) = (
        count(&gw) - lines_before,
        fake.log().len() - requests_before,
    );
    println!("in 4 s with interval 1s: {lines} walks given up, {requests} list requests");
    assert!(lines <= 5, "{lines} walks given up in 4 s with interval 1s");
    assert!(requests <= 5, "{requests} list requests in 4 s");
    broker.delete().await;
}

#[tokio::test]
async fn a_429_is_tried_again_no_sooner_than_retry_after() {
    require_broker!();
    let (_dir, broker, cfg, fake) = fake_fixture().await;
    fake.push([outbound("msg_1", "delivered")]);
    fake.script([Scripted::Status(429, Some("2".into()))]);
    let (gw, client) = start_walked(&reconciling(cfg, &fake, "")).await;
    let log = fake.log();
    assert_eq!(log.len(), 2, "{log:#?}");
    assert_eq!((log[0].status, log[1].status), (429, 200));
    // Retry-After 2 on the first 429: at least 2 s, doubled by nothing, plus jitter.
    assert!(
        log[1].at_ms - log[0].at_ms >= 2000,
        "retried after {} ms",
        log[1].at_ms - log[0].at_ms
    );
    assert_eq!(
        metric(&client, &gw, "hookgate_reconcile_rate_limited_total", None).await,
        1.0
    );
    broker.delete().await;
}

#[tokio::test]
async fn server_errors_are_tried_again_and_the_walk_completes() {
    require_broker!();
    let (_dir, broker, cfg, fake) = fake_fixture().await;
    fake.push([outbound("msg_1", "delivered")]);
    fake.script([Scripted::Status(503, None), Scripted::Status(500, None)]);
    let (gw, client) = start_walked(&reconciling(cfg, &fake, "")).await;
    let statuses: Vec<u16> = fake.log().iter().map(|l| l.status).collect();
    assert_eq!(statuses, vec![503, 500, 200]);
    let got = published(&client, &gw, &broker).await;
    assert_eq!(got.len(), 1);
    broker.delete().await;
}

#[tokio::test]
async fn a_refused_key_stops_the_route_after_one_request_until_the_key_file_changes() {
    require_broker!();
    let (_dir, broker, cfg, fake) = fake_fixture().await;
    fake.push([outbound("msg_1", "delivered")]);
    // A key the sender has revoked.
    let key_path = cfg.dir.join("botix-api-key");
    std::fs::write(&key_path, "botix_revoked_key\n").expect("key file");
    let cfg = reconciling(cfg, &fake, "");
    let cfg = GatewayConfig {
        route_extra: cfg.route_extra.replace("interval: 1h", "interval: 1s"),
        ..cfg
    };
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    assert!(
        gw.logged("reconciliation of this route stops", POLL_DEADLINE)
            .await,
        "{}",
        gw.logs().join("\n")
    );
    assert_eq!(
        metric(&client, &gw, "hookgate_reconcile_key_refused", None).await,
        1.0
    );
    // Three intervals of silence: nothing but the time can show that no request follows.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = fake.log();
    assert_eq!(log.len(), 1, "requests after a 401: {log:#?}");
    assert_eq!(log[0].status, 401);
    let errors = gw
        .logs()
        .iter()
        .filter(|l| l.contains("\"ERROR\"") && l.contains("reconciliation"))
        .count();
    assert_eq!(errors, 1, "one ERROR for a refused key");

    // A new key in the file: the reconciler goes on by itself.
    std::fs::write(&key_path, format!("{KEY}\n")).expect("new key");
    complete_walks(&client, &gw, 1.0).await;
    assert_eq!(
        metric(&client, &gw, "hookgate_reconcile_key_refused", None).await,
        0.0
    );
    broker.delete().await;
}

#[tokio::test]
async fn a_refused_cursor_walks_again_from_since_and_publishes_nothing_twice() {
    require_broker!();
    let (_dir, broker, cfg, fake) = fake_fixture().await;
    fake.push((0..4).map(|i| outbound(&format!("msg_{i}"), "delivered")));
    fake.state
        .lock()
        .expect("fake")
        .expired_cursors
        .push("c2".into());
    let (gw, client) = start_walked(&reconciling(cfg, &fake, "")).await;
    let log = fake.log();
    let seen: Vec<(Option<&str>, u16)> = log
        .iter()
        .map(|l| (l.cursor.as_deref(), l.status))
        .collect();
    assert_eq!(
        seen,
        vec![
            (None, 200),
            (Some("c2"), 422),
            (None, 200),
            (Some("c2"), 200)
        ]
    );
    assert!(
        log.iter().all(|l| l.since == log[0].since),
        "the same since"
    );
    let got = published(&client, &gw, &broker).await;
    let mut ids = ids(&got);
    ids.sort();
    assert_eq!(
        ids,
        (0..4)
            .map(|i| format!("reconcile:msg_{i}:delivered"))
            .collect::<Vec<_>>()
    );
    broker.delete().await;
}

#[tokio::test]
async fn bad_answers_are_logged_with_the_route_and_given_up_without_a_storm() {
    require_broker!();
    let (_dir, broker, cfg, fake) = fake_fixture().await;
    fake.push((0..4).map(|i| outbound(&format!("msg_{i}"), "delivered")));
    fake.push([serde_json::json!({"direction": "inbound", "text": "no id"})]);
    fake.script([
        Scripted::Status(429, Some("soon".into())),
        Scripted::Body("<html>maintenance</html>".into()),
        Scripted::RepeatCursor,
        Scripted::RepeatCursor,
    ]);
    let cfg = reconciling(cfg, &fake, "");
    let cfg = GatewayConfig {
        route_extra: cfg.route_extra.replace("interval: 1h", "interval: 1s"),
        ..cfg
    };
    let (gw, client) = start_walked(&cfg).await;
    for needle in [
        "429 with a Retry-After that is not a number",
        "list answer not as documented",
        "page repeats a cursor",
        "listed item left out",
    ] {
        assert!(
            gw.logs()
                .iter()
                .any(|l| l.contains(needle) && l.contains("\"route\":\"botix\"")),
            "{needle}: {}",
            gw.logs().join("\n")
        );
    }
    let e = scrape(&client, &gw).await;
    for kind in ["bad_retry_after", "bad_body", "repeated_cursor", "bad_item"] {
        assert!(
            e.get(
                "hookgate_reconcile_bad_answers_total",
                &[("route", "botix"), ("kind", kind)]
            ) >= 1.0,
            "{kind}"
        );
    }
    // A 429 whose Retry-After is not a number waits as one of 5 s would.
    let log = fake.log();
    assert_eq!(log[0].retry_after.as_deref(), Some("soon"));
    assert!(
        log[1].at_ms - log[0].at_ms >= 5000,
        "retried after {} ms",
        log[1].at_ms - log[0].at_ms
    );
    // A bad walk is given up until the next interval: the bad body cost one request, the
    // repeated cursor two (the page and its repeat).
    assert!(log.len() <= 9, "{} requests: {log:#?}", log.len());
    broker.delete().await;
}

#[tokio::test]
async fn a_kill_mid_walk_resumes_at_its_cursor_and_skips_nothing() {
    require_broker!();
    let (dir, broker, cfg) = fixture().await;
    // One page a second: two requests per one-second window, waiting when one is left.
    let fake = FakeBotix::start(KEY, 2, 1).await;
    fake.push((0..12).map(|i| outbound(&format!("msg_{i:02}"), "delivered")));
    let cfg = reconciling(cfg, &fake, "      min_remaining: 2\n");
    let mut gw = Gateway::start(&cfg).await;
    let log_has = |n: usize| {
        let fake = fake.clone();
        move || fake.log().len() >= n
    };
    assert!(wait_until(POLL_DEADLINE, log_has(3)).await);
    gw.kill9();
    let before = fake.log().len();
    let (gw, client) = start_walked(&cfg).await;
    let log = fake.log();
    let resumed = &log[before];
    assert!(
        resumed.cursor.is_some(),
        "the restarted walk began again at the first page: {log:#?}"
    );
    assert_eq!(resumed.since, log[0].since, "the same walk goes on");
    let got = published(&client, &gw, &broker).await;
    let mut ids = ids(&got);
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids,
        (0..12)
            .map(|i| format!("reconcile:msg_{i:02}:delivered"))
            .collect::<Vec<_>>(),
        "every listed event was published"
    );
    drop(dir);
    broker.delete().await;
}

#[tokio::test]
async fn beside_the_webhook_each_event_is_published_once() {
    require_broker!();
    let (dir, broker, mut cfg) = fixture().await;
    cfg.admin_extra = admin_token_file(dir.path(), ADMIN_TOKEN);
    let fake = FakeBotix::start(KEY, 100, 60).await;
    let gw = Gateway::start(&reconciling(cfg, &fake, "")).await;
    let client = client(None);
    // The first walk finds nothing.
    complete_walks(&client, &gw, 1.0).await;

    // The webhook brings a status and an inbound message.
    let now = wall_ms();
    let status = status_at("evt_status_a", "msg_a", "delivered", now - 60_000);
    let (code, answer) = gw.deliver(&client, &status, "req_a").await;
    assert_eq!((code, outcome(&answer)), (200, "accepted".to_owned()));
    let hello = serde_json::json!({
        "id": "evt_in_b", "event": "message.received", "timestamp": rfc3339_ms(now - 60_000),
        "data": {"message_id": "msg_b", "from": "+15550123", "to": "+15550100", "text": "hello"}
    })
    .to_string();
    let (code, answer) = gw.deliver(&client, &hello, "req_b").await;
    assert_eq!((code, outcome(&answer)), (200, "accepted".to_owned()));

    // The API lists both, and a STOP the webhook never brought.
    fake.push([
        outbound("msg_a", "delivered"),
        inbound("msg_b", "+15550123", "hello"),
        inbound("msg_c", "+15550123", "STOP"),
    ]);
    let run = "/reconcile/botix/run";
    let post = reqwest::Method::POST;
    let (status_code, text) = admin_change(&gw, &client, post.clone(), run, None).await;
    assert_eq!(status_code, 403, "a walk needs the admin token: {text}");
    assert!(text.contains("admin token"), "{text}");
    let (status_code, text) = admin_change(&gw, &client, post, run, Some(ADMIN_TOKEN)).await;
    assert_eq!(status_code, 200, "{text}");
    complete_walks(&client, &gw, 2.0).await;

    // The next STOP from that contact is a repeat.
    let stop = serde_json::json!({
        "id": "evt_in_d", "event": "message.received", "timestamp": rfc3339_ms(wall_ms()),
        "data": {"message_id": "msg_d", "from": "+15550123", "to": "+15550100", "text": "stop"}
    })
    .to_string();
    let (code, answer) = gw.deliver(&client, &stop, "req_d").await;
    assert_eq!(code, 200);
    assert_eq!(answer["reason"], "repeated_stop", "{answer}");

    let got = published(&client, &gw, &broker).await;
    let seen: Vec<(String, String)> = got
        .iter()
        .map(|m| (m.message_id.clone().unwrap_or_default(), source(m)))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("evt_status_a".to_owned(), "webhook".to_owned()),
            ("evt_in_b".to_owned(), "webhook".to_owned()),
            (
                "reconcile:msg_c:received".to_owned(),
                "reconcile".to_owned()
            ),
        ]
    );
    let e = scrape(&client, &gw).await;
    let kind = |k: &str| {
        e.get(
            "hookgate_reconcile_events_total",
            &[("route", "botix"), ("kind", k)],
        )
    };
    assert_eq!(
        (kind("published"), kind("duplicate"), kind("dropped")),
        (1.0, 1.0, 1.0)
    );
    broker.delete().await;
}

#[tokio::test]
async fn two_replicas_on_redis_one_walks() {
    require_broker!();
    if !redis_available() {
        return;
    }
    let broker = Broker::new().await;
    let prefix = KeyPrefix::new();
    let fake = FakeBotix::start(KEY, 100, 60).await;
    fake.push((0..6).map(|i| outbound(&format!("msg_{i}"), "delivered")));
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let mut gateways = Vec::new();
    for dir in &dirs {
        let cfg = on_redis(
            GatewayConfig::new(dir.path(), &broker.exchange),
            REDIS_URL,
            &prefix,
        );
        gateways.push(Gateway::start(&reconciling(cfg, &fake, "")).await);
    }
    let client = client(None);
    let done = eventually(POLL_DEADLINE * 2, || async {
        let mut sum = 0.0;
        for gw in &gateways {
            sum += metric(
                &client,
                gw,
                "hookgate_reconcile_walks_total",
                Some("complete"),
            )
            .await;
        }
        sum >= 1.0
    })
    .await;
    assert!(done, "no replica walked");
    let mut walks = Vec::new();
    let mut leaders = 0;
    for gw in &gateways {
        walks.push(metric(&client, gw, "hookgate_reconcile_pages_total", None).await);
        let (_, body) = gw.admin_get(&client, "/reconcile").await;
        let status: serde_json::Value = serde_json::from_str(&body).expect("json");
        if status[0]["leader"] == true {
            leaders += 1;
        }
    }
    walks.sort_by(f64::total_cmp);
    assert_eq!(walks, vec![0.0, 3.0], "one replica read the three pages");
    assert_eq!(leaders, 1, "one replica holds the lease");
    assert_eq!(fake.log().len(), 3, "one walk's requests");
    broker.delete().await;
}

#[tokio::test]
async fn reconcile_status_and_run_work_through_the_running_gateway() {
    require_broker!();
    let (dir, broker, mut cfg) = fixture().await;
    // The command presents the token of the file the gateway's config names.
    cfg.admin_extra = admin_token_file(dir.path(), ADMIN_TOKEN);
    let fake = FakeBotix::start(KEY, 100, 60).await;
    fake.push([outbound("msg_1", "delivered")]);
    let (gw, _client) = start_walked(&reconciling(cfg, &fake, "")).await;
    // The admin address of the running gateway, in a config the command reads.
    let text = std::fs::read_to_string(&gw.config_path).expect("config");
    let text = text.replacen(
        "admin:\n  addr: 127.0.0.1:0",
        &format!("admin:\n  addr: {}", gw.admin),
        1,
    );
    let path = gw.config_path.with_extension("cli.yaml");
    std::fs::write(&path, text).expect("write");

    let mut cmd = hookgate();
    cmd.args(["reconcile", "status", "--config"]).arg(&path);
    let out = run_bounded(cmd, Duration::from_secs(30)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("route botix: waiting for the next interval"),
        "{stdout}"
    );
    assert!(stdout.contains("last result: complete"), "{stdout}");

    let mut cmd = hookgate();
    cmd.args([
        "reconcile",
        "run",
        "--route",
        "botix",
        "--since",
        "6h",
        "--config",
    ])
    .arg(&path);
    let out = run_bounded(cmd, Duration::from_secs(60)).await;
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fake.log().len(), 2, "the manual walk asked again");
    let since = |l: &Logged| l.since.clone().unwrap_or_default();
    let log = fake.log();
    assert!(
        since(&log[1]) > since(&log[0]),
        "--since 6h reaches back less than lookback"
    );

    let mut cmd = hookgate();
    cmd.args(["reconcile", "run", "--route", "nope", "--config"])
        .arg(&path);
    let out = run_bounded(cmd, Duration::from_secs(30)).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no route nope reconciles"));
    broker.delete().await;
}
