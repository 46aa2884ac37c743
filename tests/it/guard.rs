//! The out-of-order guard (contract §4) through the real binary and the real RabbitMQ.

use std::sync::Arc;

use crate::require_broker;
use crate::util::*;

#[tokio::test]
async fn every_shared_scenario_through_the_binary() {
    require_broker!();
    run_shared_scenarios(|cfg| cfg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_statuses_for_one_message_never_publish_a_lower_rank() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::new().await;
    let gw = Arc::new(
        Gateway::start(&GatewayConfig::new(dir.path(), &broker.exchange).with_spec_guard()).await,
    );
    concurrent_status_rounds(&[gw], &broker).await;
    broker.delete().await;
}

#[tokio::test]
async fn a_failed_publish_does_not_advance_the_state() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::new().await;
    let client = client(None);
    let base = wall_ms() - 10 * 60_000;
    let delivered = status_at("evt_delivered", "msg_fail", "delivered", base + 2000);
    let sent = status_at("evt_sent", "msg_fail", "sent", base + 1000);

    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange).with_spec_guard();
    cfg.amqp_url = unreachable_amqp_url();
    cfg.extra = "spool:\n  enabled: false\n".into();
    let mut gw = Gateway::start(&cfg).await;
    let (s, a) = gw.deliver(&client, &delivered, "req_delivered").await;
    assert_eq!(s, 503, "{a}");
    gw.stop().await;

    cfg.amqp_url = AMQP_URL.into();
    let gw = Gateway::start(&cfg).await;
    wait_broker_connected(&client, &gw).await;
    // Had the failed `delivered` advanced the state, this `sent` would be stale.
    let (s, a) = gw.deliver(&client, &sent, "req_sent").await;
    assert_eq!((s, outcome(&a)), (200, "accepted".into()));
    // The sender's retry of the `delivered`.
    let (s, a) = gw.deliver(&client, &delivered, "req_delivered").await;
    assert_eq!((s, outcome(&a)), (200, "accepted".into()));
    // And now the order is enforced.
    let late = status_at("evt_sent_late", "msg_fail", "sent", base + 3000);
    let (s, a) = gw.deliver(&client, &late, "req_late").await;
    assert_eq!((s, outcome(&a)), (200, "dropped:stale_status".into()));

    assert_eq!(
        ids_before_sentinel(&client, &gw, &broker).await,
        vec!["evt_sent", "evt_delivered"]
    );
    broker.delete().await;
}

#[tokio::test]
async fn drops_go_to_the_dropped_routing_key_and_are_counted() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::new().await;
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange).with_spec_guard();
    cfg.amqp_extra = "  dropped_routing_key: \"dropped.{event}\"\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    // The audit copy is best effort and never spooled: wait for the connection.
    wait_broker_connected(&client, &gw).await;

    let before = scrape(&client, &gw).await;
    let reasons = ["stale_status", "repeated_status", "repeated_stop"];
    let before: Vec<f64> = reasons.iter().map(|r| before.dropped_total(r)).collect();

    let base = wall_ms() - 10 * 60_000;
    let stop_body = |id: &str, ts: i64| {
        serde_json::json!({
            "id": id, "event": "message.received", "timestamp": rfc3339_ms(ts),
            "data": {"message_id": format!("in_{id}"), "from": "+15550001111", "to": "+15550002222", "text": "STOP"}
        })
        .to_string()
    };
    let steps = [
        (
            "d1",
            status_at("d1", "msg_d", "delivered", base + 1000),
            "accepted",
        ),
        (
            "d2",
            status_at("d2", "msg_d", "sent", base + 2000),
            "dropped:stale_status",
        ),
        (
            "d3",
            status_at("d3", "msg_d", "delivered", base + 3000),
            "dropped:repeated_status",
        ),
        ("k1", stop_body("k1", base + 1000), "accepted"),
        ("k2", stop_body("k2", base + 2000), "dropped:repeated_stop"),
    ];
    for (id, body, expected) in &steps {
        let (s, a) = gw.deliver(&client, body, &format!("req_{id}")).await;
        assert_eq!((s, outcome(&a)), (200, (*expected).to_owned()), "{id}");
    }

    // Nothing per request is logged above DEBUG: a retry storm of stale statuses must not
    // flood the log (the drops are counted in metrics). Each drop has its DEBUG line.
    let drop_lines = || -> Vec<serde_json::Value> {
        gw.logs()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["message"] == "event dropped")
            .collect()
    };
    let last_logged = wait_until(BROKER_TIMEOUT, || {
        drop_lines().iter().any(|v| v["event_id"] == "k2")
    })
    .await;
    assert!(last_logged, "the last drop is logged: {:?}", gw.logs());
    let lines = drop_lines();
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in &lines {
        assert_eq!(line["level"], "DEBUG", "{line}");
    }

    let after = scrape(&client, &gw).await;
    for (reason, before) in reasons.iter().zip(before) {
        assert_eq!(
            after.dropped_total(reason),
            before + 1.0,
            "{reason} in\n{after:?}"
        );
    }

    let got = published_before_sentinel(&client, &gw, &broker).await;
    let by_key = |key: &str| -> Vec<String> {
        got.iter()
            .filter(|m| m.routing_key == key)
            .map(|m| m.message_id.clone().unwrap_or_default())
            .collect()
    };
    assert_eq!(by_key("message.status"), vec!["d1"]);
    assert_eq!(by_key("dropped.message.status"), vec!["d2", "d3"]);
    assert_eq!(by_key("message.received"), vec!["k1"]);
    assert_eq!(by_key("dropped.message.received"), vec!["k2"]);
    assert_eq!(got.len(), 5, "no other messages: {:?}", ids(&got));
    // The audit copy is the raw body too.
    let d2 = got
        .iter()
        .find(|m| m.message_id.as_deref() == Some("d2"))
        .expect("d2");
    assert_eq!(d2.body, steps[1].1.as_bytes());
    broker.delete().await;
}

#[tokio::test]
async fn contacts_and_channels_that_join_to_the_same_text_keep_their_own_opt_out() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    let gw = Gateway::start(&cfg.with_spec_guard()).await;
    let client = client(None);
    let base = wall_ms() - 60_000;
    // Joined with NUL, ("a\0b", "c") and ("a", "b\0c") would be one key.
    let pairs = [("+1555\u{0}1", "+1666"), ("+1555", "1\u{0}+1666")];
    for (i, (contact, channel)) in pairs.iter().enumerate() {
        let id = format!("kw_nul_{i}");
        let body = keyword_between(&id, contact, channel, "STOP", base + i as i64);
        let (s, a) = gw.deliver(&client, &body, &format!("req_{id}")).await;
        assert_eq!(
            (s, outcome(&a)),
            (200, "accepted".into()),
            "{contact:?} -> {channel:?}"
        );
    }
    assert_eq!(
        ids_before_sentinel(&client, &gw, &broker).await,
        vec!["kw_nul_0", "kw_nul_1"]
    );
    broker.delete().await;
}
