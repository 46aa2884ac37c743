//! Guard scenarios shared by the tests of both backends (the local store and Redis): the
//! scenario file run step by step, and rounds of concurrent statuses for one message.

use std::collections::BTreeMap;
use std::sync::Arc;

use hookgate::config::DEFAULT_RANKS as RANKS;
use rand::seq::{IndexedRandom, SliceRandom};

use super::*;

const SCENARIOS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/guard_scenarios.json"
));

/// The rank of `status` in the default rank table.
fn rank(status: &str) -> u32 {
    RANKS
        .iter()
        .find(|(s, _)| *s == status)
        .map(|(_, r)| *r)
        .unwrap_or_else(|| panic!("{status} is not in the default rank table"))
}

/// Runs every scenario of `tests/data/guard_scenarios.json`, each on an empty store:
/// `configure` adapts the gateway config (e.g. to the Redis backend with a fresh key prefix).
pub async fn run_shared_scenarios(configure: impl Fn(GatewayConfig) -> GatewayConfig) {
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
        let got: Vec<(String, String)> = published_before_sentinel(&client, &gw, &broker)
            .await
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

/// Rounds of 20 status events for one message id sent at once in random order, spread over
/// `gateways`; the statuses published per message must never go down in rank.
pub async fn concurrent_status_rounds(gateways: &[Arc<Gateway>], broker: &Broker) {
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

    let got = published_before_sentinel(&client, gw, broker).await;
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
