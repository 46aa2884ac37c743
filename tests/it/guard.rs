//! The out-of-order guard (SPEC §4) through the real binary and the real RabbitMQ.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::seq::{IndexedRandom, SliceRandom};

use crate::require_broker;
use crate::util::*;

const SCENARIOS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/guard_scenarios.json"
));

use hookgate::config::profiles::DEFAULT_RANKS as RANKS;

fn rank(status: &str) -> u32 {
    RANKS
        .iter()
        .find(|(s, _)| *s == status)
        .map(|(_, r)| *r)
        .unwrap_or_else(|| panic!("{status} is not in the default rank table"))
}

/// The `hookgate_dropped_events_total` of route botix for `reason` (0 before the first).
pub(crate) fn dropped_total(metrics: &Exposition, reason: &str) -> f64 {
    metrics.get(
        "hookgate_dropped_events_total",
        &[("route", "botix"), ("reason", reason)],
    )
}

#[tokio::test]
async fn every_shared_scenario_through_the_binary() {
    require_broker!();
    run_shared_scenarios(|cfg| cfg).await;
}

/// Runs every scenario of `tests/data/guard_scenarios.json`, each on an empty store:
/// `configure` adapts the gateway config (e.g. to the Redis backend with a fresh key prefix).
pub(crate) async fn run_shared_scenarios(configure: impl Fn(GatewayConfig) -> GatewayConfig) {
    let file: serde_json::Value = serde_json::from_str(SCENARIOS).expect("scenario file");
    let scenarios = file["scenarios"].as_array().expect("scenarios");
    assert!(!scenarios.is_empty());
    let broker = Broker::new().await;
    let client = client(None);
    for scenario in scenarios {
        let name = scenario["name"].as_str().expect("name");
        // A fresh store per scenario, as the file says.
        let dir = tempfile::tempdir().expect("tempdir");
        let gw = Gateway::start(&configure(
            GatewayConfig::new(dir.path(), &broker.exchange).with_spec_guard(),
        ))
        .await;
        let base = wall_ms() - 10 * 60_000;
        let mut expected_messages = Vec::new();
        let steps = scenario["steps"].as_array().expect("steps");
        for (i, step) in steps.iter().enumerate() {
            let mut body = step[0].clone();
            let expected = step[1].as_str().expect("expected outcome");
            let offset = body["timestamp"].as_i64().expect("numeric timestamp");
            body["timestamp"] = rfc3339_ms(base + offset * 1000).into();
            let text = body.to_string();
            let event_id = body["id"].as_str().expect("id").to_owned();
            let (status, answer) = gw.deliver(&client, &text, &unique("req")).await;
            assert_eq!(status, 200, "{name} step {i}: {answer}");
            assert_eq!(outcome(&answer), expected, "{name} step {i}: {answer}");
            assert_eq!(answer["event_id"], event_id.as_str(), "{name} step {i}");
            if expected == "accepted" {
                expected_messages.push((event_id, text));
            }
        }
        let sentinel = unique("sentinel");
        let (s, _) = gw.deliver(&client, &event_body(&sentinel), "req_s").await;
        assert_eq!(s, 200);
        let got = broker.until(&sentinel).await;
        let got: Vec<(String, String)> = got
            .iter()
            .map(|m| {
                (
                    m.message_id.clone().unwrap_or_default(),
                    String::from_utf8_lossy(&m.body).into_owned(),
                )
            })
            .collect();
        assert_eq!(got, expected_messages, "{name}: published messages");
    }
    broker.delete().await;
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

/// Rounds of 20 status events for one message id sent at once in random order, spread over
/// `gateways`; the statuses published per message must never go down in rank.
pub(crate) async fn concurrent_status_rounds(gateways: &[Arc<Gateway>], broker: &Broker) {
    const ROUNDS: usize = 20;
    const EVENTS: usize = 20;
    let client = client(None);
    for gw in gateways {
        wait_broker_connected(&client, gw).await;
    }
    let gw = &gateways[0];

    // message id -> (accepted event ids, highest rank sent)
    let mut accepted: BTreeMap<String, (Vec<String>, u32)> = BTreeMap::new();
    for round in 0..ROUNDS {
        let message_id = format!("msg_{round}_{}", unique("m"));
        let base = wall_ms() - 10 * 60_000;
        let mut rng = rand::rng();
        let mut offsets: Vec<i64> = (0..EVENTS as i64).collect();
        offsets.shuffle(&mut rng);
        let events: Vec<(String, String)> = offsets
            .iter()
            .enumerate()
            .map(|(i, offset)| {
                let (status, _) = *RANKS.choose(&mut rng).expect("a status");
                let id = format!("{message_id}_e{i}");
                let body = status_at(&id, &message_id, status, base + offset * 1000);
                (id, body)
            })
            .collect();
        let max_rank = events
            .iter()
            .map(|(_, b)| {
                let v: serde_json::Value = serde_json::from_str(b).expect("json");
                rank(v["data"]["status"].as_str().expect("status"))
            })
            .max()
            .expect("events");
        let mut tasks = tokio::task::JoinSet::new();
        for (i, (id, body)) in events.into_iter().enumerate() {
            let (gw, client) = (gateways[i % gateways.len()].clone(), client.clone());
            tasks.spawn(async move {
                let answer = gw.deliver(&client, &body, &unique("req")).await;
                (id, answer)
            });
        }
        let entry = accepted.entry(message_id).or_insert((Vec::new(), max_rank));
        while let Some(r) = tasks.join_next().await {
            let (id, (status, answer)) = r.expect("task");
            assert!(status < 500, "{id}: {status} {answer}");
            assert_eq!(status, 200, "{id}: {answer}");
            let o = outcome(&answer);
            assert!(
                o == "accepted" || o == "dropped:stale_status" || o == "dropped:repeated_status",
                "{id}: {o}"
            );
            if o == "accepted" {
                entry.0.push(id);
            }
        }
    }

    let sentinel = unique("sentinel");
    gw.deliver(&client, &event_body(&sentinel), "req_s").await;
    let got = broker.until(&sentinel).await;
    let mut published: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for m in &got {
        let v = m.json();
        published
            .entry(
                v["data"]["message_id"]
                    .as_str()
                    .expect("message_id")
                    .to_owned(),
            )
            .or_default()
            .push((
                m.message_id.clone().unwrap_or_default(),
                v["data"]["status"].as_str().expect("status").to_owned(),
            ));
    }
    assert_eq!(published.len(), ROUNDS);
    for (message_id, (mut accepted_ids, max_rank)) in accepted {
        let sequence = published.remove(&message_id).unwrap_or_default();
        let ranks: Vec<u32> = sequence.iter().map(|(_, s)| rank(s)).collect();
        assert!(
            ranks.windows(2).all(|w| w[0] <= w[1]),
            "{message_id}: published ranks went down: {sequence:?}"
        );
        assert_eq!(
            ranks.last().copied(),
            Some(max_rank),
            "{message_id}: the highest rank sent must end up published: {sequence:?}"
        );
        let mut published_ids: Vec<String> = sequence.into_iter().map(|(id, _)| id).collect();
        published_ids.sort();
        accepted_ids.sort();
        assert_eq!(
            published_ids, accepted_ids,
            "{message_id}: published = accepted"
        );
    }
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
    cfg.amqp_url = "amqp://guest:guest@127.0.0.1:1/%2f".into();
    cfg.extra = "spool:\n  enabled: false\n".into();
    let gw = Gateway::start(&cfg).await;
    let (s, a) = gw.deliver(&client, &delivered, "req_delivered").await;
    assert_eq!(s, 503, "{a}");
    stop(gw).await;

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

    let sentinel = unique("sentinel");
    gw.deliver(&client, &event_body(&sentinel), "req_s").await;
    assert_eq!(
        ids(&broker.until(&sentinel).await),
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
    let before: Vec<f64> = reasons.iter().map(|r| dropped_total(&before, r)).collect();

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

    let after = scrape(&client, &gw).await;
    for (reason, before) in reasons.iter().zip(before) {
        assert_eq!(
            dropped_total(&after, reason),
            before + 1.0,
            "{reason} in\n{after:?}"
        );
    }

    let sentinel = unique("sentinel");
    gw.deliver(&client, &event_body(&sentinel), "req_s").await;
    let got = broker.until(&sentinel).await;
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
    let sentinel = unique("sentinel");
    gw.deliver(&client, &event_body(&sentinel), "req_s").await;
    assert_eq!(
        ids(&broker.until(&sentinel).await),
        vec!["kw_nul_0", "kw_nul_1"]
    );
    broker.delete().await;
}
