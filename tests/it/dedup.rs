//! Dedup (contract §3) and freshness (contract §2 step 5): the real binary or the real app, the
//! real sled store, the real RabbitMQ.

use std::sync::Arc;
use std::time::Duration;

use crate::require_broker;
use crate::util::*;

/// RFC 3339 text of Unix milliseconds, written in a zone `hours` east of UTC.
fn rfc3339_offset(ms: i64, hours: i8) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .expect("time")
        .to_offset(time::UtcOffset::from_hms(hours, 0, 0).expect("offset"))
        .format(&time::format_description::well_known::Rfc3339)
        .expect("format")
}

#[tokio::test]
async fn same_delivery_twice_and_a_new_request_id_are_duplicates() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    let body = event_body("evt_twice");

    let (s, a) = gw.deliver(&client, &body, "req_twice").await;
    assert_eq!((s, outcome(&a)), (200, "accepted".into()));
    assert_eq!(a["event_id"], "evt_twice");
    // The sender's retry: same bytes, same request id.
    let (s, a) = gw.deliver(&client, &body, "req_twice").await;
    assert_eq!((s, outcome(&a)), (200, "duplicate".into()));
    assert_eq!(
        a,
        serde_json::json!({"status": "duplicate", "event_id": "evt_twice"})
    );
    // A manual re-send: new request id, same event id (and a new timestamp, so new bytes).
    let resend = event_body("evt_twice");
    let (s, a) = gw.deliver(&client, &resend, "req_manual").await;
    assert_eq!((s, outcome(&a)), (200, "duplicate".into()));

    let got = published_before_sentinel(&client, &gw, &broker).await;
    assert_eq!(ids(&got), vec!["evt_twice"]);
    assert_eq!(got[0].body, body.as_bytes());
    broker.delete().await;
}

#[tokio::test]
async fn fifty_concurrent_identical_deliveries_publish_once() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::new().await;
    let gw = Arc::new(Gateway::start(&GatewayConfig::new(dir.path(), &broker.exchange)).await);
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    let body = Arc::new(event_body("evt_50"));

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (gw, client, body) = (gw.clone(), client.clone(), body.clone());
        tasks.spawn(async move { gw.deliver(&client, &body, "req_50").await });
    }
    let mut outcomes = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (status, answer) = r.expect("task");
        assert_eq!(status, 200, "{answer}");
        outcomes.push(outcome(&answer));
    }
    let accepted = outcomes.iter().filter(|o| *o == "accepted").count();
    let duplicate = outcomes.iter().filter(|o| *o == "duplicate").count();
    assert_eq!((accepted, duplicate), (1, 49), "{outcomes:?}");

    assert_eq!(
        ids_before_sentinel(&client, &gw, &broker).await,
        vec!["evt_50"]
    );
    broker.delete().await;
}

#[tokio::test]
async fn failed_publish_is_not_recorded_and_restarts_keep_the_mark() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::new().await;
    let client = client(None);
    let body = event_body("evt_retry");

    // Broker unreachable, no spool: 503, and nothing recorded as seen.
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    cfg.amqp_url = unreachable_amqp_url();
    cfg.extra = "spool:\n  enabled: false\n".into();
    let mut gw = Gateway::start(&cfg).await;
    let (s, a) = gw.deliver(&client, &body, "req_retry").await;
    assert_eq!(s, 503, "{a}");
    gw.stop().await;

    // The broker is back (same store): the sender's retry is accepted, not a duplicate.
    cfg.amqp_url = AMQP_URL.into();
    let mut gw = Gateway::start(&cfg).await;
    wait_broker_connected(&client, &gw).await;
    let (s, a) = gw.deliver(&client, &body, "req_retry").await;
    assert_eq!((s, outcome(&a)), (200, "accepted".into()));
    gw.stop().await;

    // Another restart on the same store: the mark survived.
    let gw = Gateway::start(&cfg).await;
    wait_broker_connected(&client, &gw).await;
    for request_id in ["req_retry", "req_other"] {
        let (s, a) = gw.deliver(&client, &body, request_id).await;
        assert_eq!((s, outcome(&a)), (200, "duplicate".into()), "{request_id}");
    }
    assert_eq!(
        ids_before_sentinel(&client, &gw, &broker).await,
        vec!["evt_retry"]
    );
    broker.delete().await;
}

#[tokio::test]
async fn freshness_drops_expired_and_future_and_reads_every_timestamp_form() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    let now = wall_ms();
    let body = |id: &str, ts: serde_json::Value| {
        serde_json::json!({"id": id, "event": "contact.created", "timestamp": ts, "data": {}})
            .to_string()
    };
    let hour = 3_600_000;
    let cases = [
        // dedup.ttl is 72 h by default; max_clock_skew 5 min.
        (
            "evt_expired",
            body("evt_expired", rfc3339_ms(now - 73 * hour).into()),
            "dropped:expired",
        ),
        (
            "evt_future",
            body("evt_future", rfc3339_ms(now + 6 * 60_000).into()),
            "dropped:future_timestamp",
        ),
        (
            "evt_skew_ok",
            body("evt_skew_ok", rfc3339_ms(now + 4 * 60_000).into()),
            "accepted",
        ),
        (
            "evt_old_ok",
            body("evt_old_ok", rfc3339_ms(now - 71 * hour).into()),
            "accepted",
        ),
        (
            "evt_secs",
            body("evt_secs", (now / 1000).into()),
            "accepted",
        ),
        ("evt_millis", body("evt_millis", now.into()), "accepted"),
        (
            "evt_rfc3339",
            body("evt_rfc3339", rfc3339_ms(now).into()),
            "accepted",
        ),
        // The same instant written with an offset: read as UTC it would be an hour ahead.
        (
            "evt_offset",
            body("evt_offset", rfc3339_offset(now, 1).into()),
            "accepted",
        ),
    ];
    let mut accepted = Vec::new();
    for (id, b, expect) in &cases {
        let (s, a) = gw.deliver(&client, b, &format!("req_{id}")).await;
        assert_eq!((s, outcome(&a)), (200, (*expect).to_owned()), "{id}");
        assert_eq!(a["event_id"], *id);
        if *expect == "accepted" {
            accepted.push((*id).to_owned());
        }
    }
    // A freshness drop records nothing: the same event with a good timestamp goes through.
    let (s, a) = gw
        .deliver(
            &client,
            &body("evt_future", rfc3339_ms(now).into()),
            "req_f2",
        )
        .await;
    assert_eq!((s, outcome(&a)), (200, "accepted".into()));
    accepted.push("evt_future".into());

    let metrics = scrape(&client, &gw).await;
    for (reason, n) in [("expired", 1.0), ("future_timestamp", 1.0)] {
        assert_eq!(metrics.dropped_total(reason), n, "{reason} in\n{metrics:?}");
    }
    assert_eq!(ids_before_sentinel(&client, &gw, &broker).await, accepted);
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_older_than_the_ttl_no_longer_counts_and_is_swept() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.extra = "dedup:\n  ttl: 1h\n".into();
    let app = InProcess::start(&cfg.yaml()).await;
    let client = client(None);
    let body_at = |ms: i64| {
        serde_json::json!({"id": "evt_ttl", "event": "contact.created", "timestamp": rfc3339_ms(ms), "data": {}})
            .to_string()
    };
    let held = || async {
        app.metrics(&client)
            .await
            .get("hookgate_state_entries", &[])
    };

    let t0 = app.now();
    let (s, a) = app.post(&client, &body_at(t0), "req_ttl_1").await;
    assert_eq!((s, outcome(&a)), (200, "accepted".into()));
    assert_eq!(held().await, 2.0, "an event mark and a request mark");

    // Just inside the TTL: still a duplicate (new request id, fresh timestamp), still stored.
    let hour = 3_600_000;
    app.set_now(t0 + hour - 60_000);
    let (s, a) = app
        .post(&client, &body_at(t0 + hour - 60_000), "req_ttl_2")
        .await;
    assert_eq!((s, outcome(&a)), (200, "duplicate".into()));
    assert_eq!(
        held().await,
        3.0,
        "nothing expired yet; the duplicate's request id is kept beside the first"
    );

    // Past the TTL: the background sweep removes both marks...
    app.set_now(t0 + hour + 60_000);
    assert!(
        eventually(Duration::from_secs(10), || async { held().await == 0.0 }).await,
        "expired marks were not swept: {} left",
        held().await
    );
    // ...and the event is new again (a timestamp fresh for the moved clock).
    let (s, a) = app
        .post(&client, &body_at(t0 + hour + 60_000), "req_ttl_3")
        .await;
    assert_eq!((s, outcome(&a)), (200, "accepted".into()));
    assert_eq!(held().await, 2.0);

    let sentinel = serde_json::json!({"id": "sentinel", "event": "contact.created", "timestamp": rfc3339_ms(t0 + hour + 60_000)}).to_string();
    let (s, _) = app.post(&client, &sentinel, "req_s").await;
    assert_eq!(s, 200);
    assert_eq!(
        ids(&broker.until("sentinel").await),
        vec!["evt_ttl", "evt_ttl"]
    );
    app.stop().await;
    broker.delete().await;
}

/// The sender's retry of event `id` (request id `req_<id>`): its status and outcome.
async fn retry(gw: &Gateway, client: &reqwest::Client, id: &str) -> (u16, String) {
    let (s, r) = gw
        .deliver(client, &event_body(id), &format!("req_{id}"))
        .await;
    (s, outcome(&r))
}

#[tokio::test]
async fn on_a_full_disk_nothing_is_answered_200_before_its_marks_are_on_disk() {
    require_broker!();
    let Some((disk, _dir, broker, mut cfg)) = fixture_on_small_disk().await else {
        return;
    };
    // The journal writes into segments filled before the disk was: small ones run out
    // within a few hundred events.
    cfg.store_extra = "  journal_segment: 64KiB\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    disk.fill();
    // Each event is published with a confirm, but its 200 waits for its marks to be flushed
    // to disk; once the journal cannot be flushed, the answer is 503 and readiness says so.
    let mut accepted = Vec::new();
    let mut refused = None;
    for i in 0..2000 {
        let id = format!("evt_full_{i:04}");
        let (s, r) = gw
            .deliver(&client, &event_body(&id), &format!("req_{id}"))
            .await;
        if s == 503 {
            refused = Some(id);
            break;
        }
        assert_eq!((s, outcome(&r).as_str()), (200, "accepted"), "{id}: {r}");
        accepted.push(id);
    }
    let refused = refused.expect("a full disk took 2000 events' marks");
    let (status, readiness) = gw.admin_get(&client, "/readyz").await;
    assert!(
        status == 503 && readiness.contains("state store unreachable"),
        "readiness on a full disk: {status} {readiness:?}"
    );
    assert!(
        gw.logged("state journal cannot be written", BROKER_TIMEOUT)
            .await,
        "no ERROR for the journal"
    );
    // The refused event reached the broker, but its mark is only in memory: the retry is
    // not answered 200 on the strength of it either.
    assert_eq!(retry(&gw, &client, &refused).await.0, 503);

    // sled stays failed after a write error until it is opened again: make room, restart.
    disk.free();
    let mut gw = gw;
    gw.kill9();
    let gw = Gateway::start(&cfg).await;
    wait_broker_connected(&client, &gw).await;
    // Every 200 stood for marks on disk: the retries of the last ones answered are
    // duplicates, not second publishes.
    for id in accepted.iter().rev().take(5) {
        assert_eq!(
            retry(&gw, &client, id).await,
            (200, "duplicate".to_owned()),
            "{id}"
        );
    }
    // The refused event was published, but its mark may never have reached the disk: its
    // retry is accepted (published again, as contract §3 allows across a store failure) or a
    // duplicate.
    let (s, again) = retry(&gw, &client, &refused).await;
    assert!(
        s == 200 && (again == "accepted" || again == "duplicate"),
        "{s} {again}"
    );
    accepted.push(refused.clone());
    if again == "accepted" {
        accepted.push(refused);
    }
    assert_eq!(
        ids_before_sentinel(&client, &gw, &broker).await,
        accepted,
        "each event answered 200 once"
    );
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_future_dated_event_keeps_its_mark_until_its_own_time_plus_the_ttl() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.extra = "dedup:\n  ttl: 1h\nmax_clock_skew: 10m\n".into();
    let app = InProcess::start(&cfg.yaml()).await;
    let client = client(None);
    let t0 = app.now();
    let minute = 60_000;
    let hour = 60 * minute;
    // Dated 9 minutes ahead: within the allowed skew, so accepted.
    let body = serde_json::json!({"id": "evt_future", "event": "contact.created", "timestamp": rfc3339_ms(t0 + 9 * minute), "data": {}}).to_string();
    let (s, a) = app.post(&client, &body, "req_future_1").await;
    assert_eq!((s, outcome(&a)), (200, "accepted".into()));
    // A replay an hour and a minute after receipt: the event itself is 52 minutes old, fresh
    // for the TTL, so only its mark can stop it; the mark lives until its time plus the TTL.
    app.set_now(t0 + hour + minute);
    let (s, a) = app.post(&client, &body, "req_future_2").await;
    assert_eq!((s, outcome(&a)), (200, "duplicate".into()));

    let sentinel = serde_json::json!({"id": "sentinel", "event": "contact.created", "timestamp": rfc3339_ms(t0 + hour + minute)}).to_string();
    let (s, _) = app.post(&client, &sentinel, "req_s").await;
    assert_eq!(s, 200);
    assert_eq!(ids(&broker.until("sentinel").await), vec!["evt_future"]);
    app.stop().await;
    broker.delete().await;
}
