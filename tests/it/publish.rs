//! Confirms and returns paired with their own publish (contract §5): against the real
//! broker, no event answered 200 is lost when routable and unroutable publishes, audit
//! copies and the spool drainer share the connection, when the broker nacks, or when a
//! confirm times out with others in flight.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::require_broker;
use crate::util::proxy::Proxy;
use crate::util::*;

/// How long a test waits for every accepted event to arrive (held entries are retried with
/// a back-off of up to 30 s once a queue is bound).
const ARRIVAL_DEADLINE: Duration = Duration::from_secs(90);
/// Deliveries sent at once in each round of the mixed test.
const CONCURRENCY: usize = 240;
/// Rounds of the mixed test.
const ROUNDS: usize = 3;

/// A botix event of `event_type` with a fresh timestamp.
fn typed_event(id: &str, event_type: &str) -> String {
    serde_json::json!({
        "id": id,
        "event": event_type,
        "timestamp": rfc3339_from_now(0),
        "data": {"contact_id": 1}
    })
    .to_string()
}

/// Reads the queue until every id of `accepted` came, or `deadline` passed; returns the
/// ids that never came.
async fn never_arrived(
    broker: &Broker,
    accepted: &BTreeSet<String>,
    deadline: Duration,
) -> Vec<String> {
    let mut waiting = accepted.clone();
    let until = tokio::time::Instant::now() + deadline;
    while !waiting.is_empty() {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        match broker.next(left.min(Duration::from_secs(5))).await {
            Some(m) => {
                if let Some(id) = m.message_id {
                    waiting.remove(&id);
                }
            }
            None => continue,
        }
    }
    waiting.into_iter().collect()
}

/// Sends `bodies` at once; returns the event ids answered 200 `accepted`, and the answers
/// that were neither that nor a drop.
async fn send_all(
    gw: &Arc<Gateway>,
    client: &reqwest::Client,
    bodies: Vec<(String, Vec<String>)>,
) -> (Vec<String>, Vec<String>) {
    let mut tasks = Vec::new();
    for (id, chain) in bodies {
        let (gw, client) = (gw.clone(), client.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            // A chain is sent in order: a status, then its repeat (dropped, audit copy).
            for (n, body) in chain.iter().enumerate() {
                let (status, answer) = gw.deliver(&client, body, &format!("r_{id}_{n}")).await;
                out.push((format!("{id}#{n}"), status, outcome(&answer)));
            }
            out
        }));
    }
    let mut accepted = Vec::new();
    let mut other = Vec::new();
    for t in tasks {
        for (id, status, outcome) in t.await.expect("sender") {
            let event_id = id.split('#').next().unwrap_or_default().to_owned();
            match (status, outcome.as_str()) {
                (200, "accepted") => accepted.push(event_id),
                (200, o) if o.starts_with("dropped:") => {}
                _ => other.push(format!("{id}: {status} {outcome}")),
            }
        }
    }
    (accepted, other)
}

#[tokio::test]
async fn mixed_concurrent_publishes_with_audit_copies_and_the_drainer_lose_no_accepted_event() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    // Queues for two of the three event types: `orphan.updated` is unroutable until the end,
    // and the audit copies (`dropped.…`) go nowhere.
    let broker = Broker::unbound().await;
    broker.bind("contact.#").await;
    broker.bind("message.#").await;
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange).with_spec_guard();
    cfg.amqp_extra = "  dropped_routing_key: \"dropped.{event}\"\n".into();
    let gw = Arc::new(Gateway::start(&cfg).await);
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    let run = unique("m");
    let mut accepted = BTreeSet::new();
    for round in 0..ROUNDS {
        let bodies = (0..CONCURRENCY)
            .map(|i| {
                let id = format!("{run}_{round}_{i:03}");
                let chain = match i % 4 {
                    0 | 1 => vec![typed_event(&id, "orphan.updated")],
                    2 => vec![typed_event(&id, "contact.created")],
                    // A status and its repeat: the repeat is dropped and its audit copy is
                    // published without `mandatory`, on the same connection.
                    _ => {
                        let message = format!("msg_{id}");
                        vec![
                            status_body(&id, &message, "delivered"),
                            status_body(&format!("{id}_again"), &message, "delivered"),
                        ]
                    }
                };
                (id, chain)
            })
            .collect();
        let (ok, other) = send_all(&gw, &client, bodies).await;
        assert!(other.is_empty(), "answers besides 200: {other:?}");
        accepted.extend(ok);
    }
    assert_eq!(accepted.len(), ROUNDS * CONCURRENCY, "each event once");

    // A queue for every key: the held entries can go now.
    broker.bind("#").await;
    let lost = never_arrived(&broker, &accepted, ARRIVAL_DEADLINE).await;
    assert!(
        lost.is_empty(),
        "{} of {} events answered 200 never arrived: {lost:?}",
        lost.len(),
        accepted.len()
    );
    // Every return was paired with a publish in flight.
    let unpaired = scrape(&client, &gw)
        .await
        .find("hookgate_publish_unpaired_returns_total", &[]);
    assert_eq!(unpaired, Some(0.0), "returns that matched no publish");
    broker.delete().await;
}

#[tokio::test]
async fn no_event_the_broker_nacks_is_answered_as_published() {
    require_broker!();
    // The queue takes 20 messages and has the broker nack every publish beyond that; a
    // reader takes messages all along, so acks and nacks alternate while publishes are in
    // flight.
    let broker = Arc::new(Broker::rejecting_beyond(20).await);
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    let gw = Arc::new(Gateway::start(&cfg).await);
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    let reading = tokio_util::sync::CancellationToken::new();
    let reader = {
        let (broker, reading) = (broker.clone(), reading.clone());
        tokio::spawn(async move {
            let mut got = BTreeSet::new();
            while !reading.is_cancelled() {
                if let Some(id) = broker
                    .next(Duration::from_millis(200))
                    .await
                    .and_then(|m| m.message_id)
                {
                    got.insert(id);
                }
            }
            got
        })
    };
    let run = unique("n");
    let mut accepted = BTreeSet::new();
    for round in 0..5 {
        // While the spool holds events in order, new ones go behind them without a publish:
        // each round starts once the drainer has emptied it.
        let (_, spool) = gw
            .admin_until(&client, "/spool", ARRIVAL_DEADLINE, |_, b| {
                b.contains("\"depth\":0")
            })
            .await;
        assert!(
            spool.contains("\"depth\":0"),
            "the spool never drained: {spool}"
        );
        let bodies = (0..CONCURRENCY)
            .map(|i| {
                let id = format!("{run}_{round}_{i:03}");
                let body = typed_event(&id, "contact.created");
                (id, vec![body])
            })
            .collect();
        let (ok, other) = send_all(&gw, &client, bodies).await;
        assert!(other.is_empty(), "answers besides 200: {other:?}");
        accepted.extend(ok);
    }
    reading.cancel();
    let got = reader.await.expect("reader");
    let waiting: BTreeSet<String> = accepted.difference(&got).cloned().collect();
    // A nacked event was spooled and comes later; one taken for published never comes.
    let lost = never_arrived(&broker, &waiting, ARRIVAL_DEADLINE).await;
    assert!(
        lost.is_empty(),
        "{} of {} events answered 200 never arrived: {lost:?}",
        lost.len(),
        accepted.len()
    );
    broker.delete().await;
}

#[tokio::test]
async fn publishes_in_flight_when_a_confirm_times_out_are_spooled_not_lost() {
    require_broker!();
    let broker = Broker::unbound().await;
    broker.bind("contact.#").await;
    let proxy = Proxy::to_rabbitmq().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    cfg.amqp_url = proxy.amqp_url("heartbeat=30");
    cfg.confirm_timeout = "1s".into();
    let gw = Arc::new(Gateway::start(&cfg).await);
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    let run = unique("t");
    let mut accepted = BTreeSet::new();
    for round in 0..3 {
        // The broker's answers are held back while a round is in flight, and let through
        // once the first confirms have timed out: the acks and returns of the publishes
        // still waiting, and of those that timed out, arrive together.
        let timeouts = |gw: &Gateway| {
            gw.logs()
                .iter()
                .filter(|l| l.contains("publish failed; spooling"))
                .count()
        };
        // While the spool holds events in order, new ones go behind them without a publish:
        // wait until the drainer has emptied it.
        let (_, spool) = gw
            .admin_until(&client, "/spool", ARRIVAL_DEADLINE, |_, b| {
                b.contains("\"depth\":0")
            })
            .await;
        assert!(
            spool.contains("\"depth\":0"),
            "the spool never drained: {spool}"
        );
        let before = timeouts(&gw);
        proxy.stall();
        let bodies: Vec<(String, Vec<String>)> = (0..CONCURRENCY)
            .map(|i| {
                let id = format!("{run}_{round}_{i:03}");
                let kind = if i % 2 == 0 {
                    "orphan.updated"
                } else {
                    "contact.created"
                };
                let body = typed_event(&id, kind);
                (id, vec![body])
            })
            .collect();
        let (gw2, client2) = (gw.clone(), client.clone());
        let sending = tokio::spawn(async move { send_all(&gw2, &client2, bodies).await });
        // The first timeouts are logged; then the link recovers.
        assert!(
            wait_until(POLL_DEADLINE, || timeouts(&gw) > before).await,
            "no confirm timed out"
        );
        proxy.restore();
        let (ok, other) = sending.await.expect("senders");
        assert!(other.is_empty(), "answers besides 200: {other:?}");
        accepted.extend(ok);
    }

    broker.bind("#").await;
    let lost = never_arrived(&broker, &accepted, ARRIVAL_DEADLINE).await;
    assert!(
        lost.is_empty(),
        "{} of {} events answered 200 never arrived: {lost:?}",
        lost.len(),
        accepted.len()
    );
    broker.delete().await;
}

/// A sender's `traceparent`.
const SENT_PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Delivers event `id`, signed, with these extra headers; asserts it was accepted.
async fn accept_with(gw: &Gateway, client: &reqwest::Client, id: &str, extra: &[(&str, &str)]) {
    let body = event_body(id);
    let mut headers = vec![
        ("x-botix-signature", sign(SECRET, body.as_bytes())),
        ("x-botix-request-id", format!("req_{id}")),
    ];
    headers.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let (status, answer) = gw.post(client, &body, &headers).await;
    assert_eq!(status, 200, "{id}: {answer}");
}

/// Whether `value` has the shape of a version 00 `traceparent` with non-zero ids.
fn well_formed_traceparent(value: &str) -> bool {
    hookgate::ingress::trace::is_valid_traceparent(value)
}

#[tokio::test]
async fn the_senders_trace_context_or_a_new_one_travels_in_the_message_headers() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    let invalid = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
    accept_with(
        &gw,
        &client,
        "evt_traced",
        &[
            ("traceparent", SENT_PARENT),
            ("tracestate", "congo=t61rcWkgMzE"),
        ],
    )
    .await;
    accept_with(&gw, &client, "evt_untraced", &[]).await;
    accept_with(
        &gw,
        &client,
        "evt_bad_trace",
        &[
            ("traceparent", invalid),
            ("tracestate", "congo=t61rcWkgMzE"),
        ],
    )
    .await;
    gw.accept(&client, "sentinel").await;
    let got = broker.until_within("sentinel", ARRIVAL_DEADLINE).await;
    assert_eq!(ids(&got), ["evt_traced", "evt_untraced", "evt_bad_trace"]);
    assert_eq!(got[0].header("traceparent").as_deref(), Some(SENT_PARENT));
    assert_eq!(
        got[0].header("tracestate").as_deref(),
        Some("congo=t61rcWkgMzE")
    );
    let mut trace_ids = BTreeSet::new();
    for m in &got[1..] {
        let parent = m.header("traceparent").expect("a generated traceparent");
        assert!(well_formed_traceparent(&parent), "{parent}");
        assert_ne!(parent, invalid);
        assert_eq!(
            m.header("tracestate"),
            None,
            "no state without the sender's parent"
        );
        trace_ids.insert(parent[3..35].to_owned());
    }
    assert_eq!(trace_ids.len(), 2, "each new trace has its own id");

    // The delivery's log lines carry its trace id: a refused signature is logged (DEBUG)
    // inside the delivery's span.
    assert!(
        refusal_logged_in_its_trace(&gw).await,
        "{}",
        gw.logs().join("\n")
    );
    let mut gw = gw;
    gw.stop().await;

    // A spooled event keeps its trace: published after a restart with the same headers.
    cfg.amqp_url = unreachable_amqp_url();
    let mut gw = Gateway::start(&cfg).await;
    accept_with(
        &gw,
        &client,
        "evt_spooled_traced",
        &[("traceparent", SENT_PARENT), ("tracestate", "rojo=1")],
    )
    .await;
    gw.stop().await;
    cfg.amqp_url = AMQP_URL.to_owned();
    let gw = Gateway::start(&cfg).await;
    gw.accept(&client, "sentinel_2").await;
    let got = broker.until_within("sentinel_2", ARRIVAL_DEADLINE).await;
    assert_eq!(ids(&got), ["evt_spooled_traced"]);
    assert_eq!(got[0].header("traceparent").as_deref(), Some(SENT_PARENT));
    assert_eq!(got[0].header("tracestate").as_deref(), Some("rojo=1"));
    broker.delete().await;
}

/// Posts a delivery with a forged signature in the trace `SENT_PARENT` names; whether its
/// "signature refused" line is written inside the delivery's span with that trace id.
async fn refusal_logged_in_its_trace(gw: &Gateway) -> bool {
    let body = event_body("evt_forged");
    let forged = sign("not-the-secret-at-all", body.as_bytes());
    let headers = [
        ("x-botix-signature", forged),
        ("traceparent", SENT_PARENT.to_owned()),
    ];
    let (status, _) = gw.post(&client(None), &body, &headers).await;
    assert_eq!(status, 401);
    let in_trace = |l: &String| {
        serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| {
            v["message"] == "signature refused"
                && v["spans"].as_array().is_some_and(|spans| {
                    spans.iter().any(|s| {
                        s["name"] == "delivery"
                            && s["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
                    })
                })
        })
    };
    wait_until(BROKER_TIMEOUT, || gw.logs().iter().any(in_trace)).await
}

#[tokio::test]
async fn a_log_filter_that_names_the_delivery_span_writes_the_lines_inside_it() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    // DEBUG only inside a delivery's span: the span must exist before the line is judged.
    cfg.env
        .push(("RUST_LOG".to_owned(), "info,[delivery]=debug".to_owned()));
    let gw = Gateway::start(&cfg).await;
    assert!(
        refusal_logged_in_its_trace(&gw).await,
        "{}",
        gw.logs().join("\n")
    );
    broker.delete().await;
}

#[tokio::test]
async fn a_broker_node_named_by_an_ipv6_address_is_reached_at_that_address() {
    require_broker!();
    // The broker answers here only on [::1], through a forwarder; this machine's
    // `localhost` is 127.0.0.1, where nothing listens on that port.
    let proxy = Proxy::start_on("[::1]:0", RABBITMQ).await;
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.amqp_url = proxy.amqp_url("");
    assert!(cfg.amqp_url.contains("@[::1]:"), "{}", cfg.amqp_url);
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    // The sentinel arrives through the node (nothing else was sent).
    let before = ids_before_sentinel(&client, &gw, &broker).await;
    assert!(before.is_empty(), "{before:?}");
    assert!(proxy.accepted() > 0, "the node was reached elsewhere");
    broker.delete().await;
}

#[tokio::test]
async fn no_publish_holds_its_caller_past_confirm_timeout_while_the_channels_wait() {
    require_broker!();
    let broker = Broker::new().await;
    let proxy = Proxy::to_rabbitmq().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    cfg.amqp_url = proxy.amqp_url("heartbeat=30");
    cfg.confirm_timeout = "1s".into();
    let gw = Arc::new(Gateway::start(&cfg).await);
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    // The broker's answers are held back: the first deliveries' batches take the channels
    // and wait for confirms, then for replacement channels the broker does not open; the
    // deliveries after them queue behind. Each caller must stop waiting at its own
    // confirm_timeout, whatever the channels do.
    proxy.stall();
    let run = unique("held");
    let mut running = Vec::new();
    for wave in 0..10 {
        for i in 0..4 {
            let (gw, client) = (gw.clone(), client.clone());
            let id = format!("{run}_{wave}_{i}");
            running.push(tokio::spawn(async move {
                gw.deliver(&client, &event_body(&id), &format!("req_{id}"))
                    .await
                    .0
            }));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut statuses = Vec::new();
    for r in running {
        statuses.push(r.await.expect("delivery"));
    }
    // The gateway's own histogram of how long callers waited for a publish: none past the
    // bucket of 2.5 s, with a confirm_timeout of 1 s.
    let e = scrape(&client, &gw).await;
    let count = e.get("hookgate_publish_duration_seconds_count", &[]);
    let within = e.get("hookgate_publish_duration_seconds_bucket", &[("le", "2.5")]);
    println!("statuses {statuses:?}; {count} publishes, {within} answered within 2.5 s");
    proxy.restore();
    assert!(count > 0.0, "nothing was published");
    assert_eq!(
        count - within,
        0.0,
        "{} of {count} publishes held their callers past 2.5 s with confirm_timeout 1s",
        count - within
    );
    broker.delete().await;
}

#[tokio::test]
async fn amqp_queue_is_declared_as_a_quorum_queue_bound_to_the_exchange() {
    use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
    use lapin::types::{FieldTable, ShortString};
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    let queue = unique("hg-quorum");
    cfg.amqp_extra = format!("  queue: {{name: {queue}}}\n");
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    gw.accept(&client, "quorum_1").await;

    let connection = lapin::Connection::connect(AMQP_URL, lapin::ConnectionProperties::default())
        .await
        .expect("connection");
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let name = ShortString::from(queue.as_str());
    let arrived = eventually(POLL_DEADLINE, || {
        let (connection, name) = (&connection, name.clone());
        async move {
            let Ok(channel) = connection.create_channel().await else {
                return false;
            };
            channel
                .queue_declare(name, passive, FieldTable::default())
                .await
                .is_ok_and(|q| q.message_count() == 1)
        }
    })
    .await;
    // Declared without a type, the queue is refused: it exists as a quorum queue.
    let channel = connection.create_channel().await.expect("channel");
    let classic = channel
        .queue_declare(
            name.clone(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    let cleanup = connection.create_channel().await.expect("channel");
    let _ = cleanup
        .queue_delete(name, QueueDeleteOptions::default())
        .await;
    assert!(
        arrived,
        "the accepted event never reached the declared queue"
    );
    assert!(
        classic.is_err(),
        "a classic declare of the queue was accepted: it is not a quorum queue"
    );
    broker.delete().await;
}
