//! Metrics (contract §8): the counters and gauges follow the traffic.

use crate::require_broker;
use crate::util::*;

#[tokio::test]
async fn metrics_follow_the_traffic() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    assert!(
        eventually(BROKER_TIMEOUT, || async {
            scrape(&client, &gw)
                .await
                .find("hookgate_broker_connected", &[])
                == Some(1.0)
        })
        .await,
        "hookgate_broker_connected never became 1"
    );
    let before = scrape(&client, &gw).await;
    let outcome = |o: &'static str| [("route", "botix"), ("outcome", o)];

    let body = event_body(&unique("evt_metrics"));
    let (s, _) = gw.deliver(&client, &body, "req_m1").await;
    assert_eq!(s, 200);
    let (s, answer) = gw.deliver(&client, &body, "req_m2").await;
    assert_eq!((s, answer["status"].as_str()), (200, Some("duplicate")));
    let (s, _) = gw
        .post(
            &client,
            &body,
            &[("x-botix-signature", sign("wrong-secret", body.as_bytes()))],
        )
        .await;
    assert_eq!(s, 401);
    let bad = "not json";
    let (s, _) = gw
        .post(
            &client,
            bad,
            &[("x-botix-signature", sign(SECRET, bad.as_bytes()))],
        )
        .await;
    assert_eq!(s, 400);

    let after = scrape(&client, &gw).await;
    let delta =
        |name: &str, labels: &[(&str, &str)]| after.get(name, labels) - before.get(name, labels);
    for o in ["accepted", "duplicate", "invalid_signature", "bad_request"] {
        assert_eq!(delta("hookgate_requests_total", &outcome(o)), 1.0, "{o}");
    }
    assert_eq!(delta("hookgate_requests_total", &outcome("dropped")), 0.0);
    assert_eq!(
        delta("hookgate_dedup_hits_total", &[("route", "botix")]),
        1.0
    );
    assert_eq!(
        delta("hookgate_signature_failures_total", &[("route", "botix")]),
        1.0
    );
    assert_eq!(
        delta("hookgate_request_duration_seconds_count", &[]),
        4.0,
        "every answered delivery is timed"
    );
    assert_eq!(
        delta(
            "hookgate_request_duration_seconds_bucket",
            &[("le", "+Inf")]
        ),
        4.0
    );
    assert!(
        delta("hookgate_publish_duration_seconds_count", &[]) >= 1.0,
        "the accepted event was published"
    );
    assert_eq!(after.find("hookgate_broker_connected", &[]), Some(1.0));
    assert_eq!(after.find("hookgate_spool_depth", &[]), Some(0.0));
    assert!(after.find("hookgate_spool_bytes", &[]).is_some());
    assert!(after.find("hookgate_store_errors_total", &[]).is_some());
    assert_eq!(
        after.find(
            "hookgate_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
    broker.delete().await;
}
