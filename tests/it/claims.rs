//! Claims and state that run out: a concurrent duplicate that waits longer than
//! `dedup.in_flight_wait`, and guard state older than its `retention`.

use crate::require_broker;
use crate::util::*;

#[tokio::test]
async fn a_duplicate_waiting_longer_than_in_flight_wait_gets_503_and_the_event_is_published_once() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::new().await;
    let proxy = Proxy::to_rabbitmq().await;
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    cfg.amqp_url = proxy.amqp_url("");
    // The first delivery's publish hangs for the confirm timeout; its duplicate may wait
    // only a second of that.
    cfg.confirm_timeout = "10s".into();
    cfg.extra = "dedup:\n  in_flight_wait: 1s\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    proxy.black_hole();
    // Two deliveries of one event at once: whichever claims first hangs on its publish
    // until the confirm times out (then spools, 200); the other may wait only a second.
    let body = event_body("evt_held");
    let send = |request_id: &'static str| {
        let task = deliver_in_task(&client, gw.url("/webhooks/botix"), &body, request_id);
        async move {
            let answer = task.await.expect("join");
            let what = answer.body["status"]
                .as_str()
                .or(answer.body["error"].as_str());
            let what = what.unwrap_or_default().to_owned();
            (answer.status, answer.retry_after.is_some(), what)
        }
    };
    let (one, two) = (send("req_held_1"), send("req_held_2"));
    let mut answers = Vec::new();
    for task in [one, two] {
        answers.push(
            tokio::time::timeout(POLL_DEADLINE, task)
                .await
                .expect("answered"),
        );
    }
    answers.sort();
    assert_eq!(
        answers,
        vec![
            (200, false, "accepted".to_owned()),
            (503, true, "unavailable".to_owned())
        ],
        "the holder is accepted (spooled), the waiter's wait runs out"
    );

    proxy.restore();
    assert_eq!(
        ids_before_sentinel(&client, &gw, &broker).await,
        vec!["evt_held"],
        "published exactly once"
    );
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_state_older_than_its_retention_is_forgotten() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.route_extra =
        "    guard:\n      status:\n        events: [message.status]\n        retention: 1h\n"
            .into();
    let app = InProcess::start(&cfg.yaml()).await;
    let client = client(None);
    let status_at = |id: &str, status: &str, ms: i64| {
        serde_json::json!({"id": id, "event": "message.status", "timestamp": rfc3339_ms(ms),
            "data": {"message_id": "msg_retained", "status": status}})
        .to_string()
    };

    let t0 = app.now();
    let (_, a) = app
        .post(&client, &status_at("evt_r1", "delivered", t0), "req_r1")
        .await;
    assert_eq!(outcome(&a), "accepted");
    // Within the retention a late `sent` is stale.
    app.set_now(t0 + 30 * 60_000);
    let (_, a) = app
        .post(
            &client,
            &status_at("evt_r2", "sent", t0 + 30 * 60_000),
            "req_r2",
        )
        .await;
    assert_eq!(outcome(&a), "dropped:stale_status");

    // Past the retention the message's state is forgotten: a `sent` is judged afresh.
    let later = t0 + 61 * 60_000;
    app.set_now(later);
    let (_, a) = app
        .post(&client, &status_at("evt_r3", "sent", later), "req_r3")
        .await;
    assert_eq!(outcome(&a), "accepted", "state outlived its retention");

    let (s, _) = app
        .post(&client, &status_at("sentinel", "read", later), "req_s")
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        ids(&broker.until("sentinel").await),
        vec!["evt_r1", "evt_r3"]
    );
    app.stop().await;
    broker.delete().await;
}
