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
        delta(
            "hookgate_request_duration_seconds_count",
            &[("route", "botix")]
        ),
        4.0,
        "every answered delivery is timed"
    );
    assert_eq!(
        delta(
            "hookgate_request_duration_seconds_bucket",
            &[("route", "botix"), ("le", "+Inf")]
        ),
        4.0
    );
    assert!(
        delta("hookgate_publish_duration_seconds_count", &[]) >= 1.0,
        "the accepted event was published"
    );
    assert_eq!(
        delta("hookgate_store_sync_duration_seconds_count", &[]),
        2.0,
        "the accepted event and the duplicate each waited for their state on disk"
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

#[tokio::test]
async fn metrics_answer_the_text_format_unless_openmetrics_is_asked_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No broker needed: the exposition is there whether or not it is connected.
    let cfg = GatewayConfig::new(dir.path(), &unique("x"));
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    // A request to a path no route has is timed in the series of route "unmatched".
    let resp = client
        .post(gw.url("/webhooks/nowhere"))
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 404);

    let get = |accept: Option<&'static str>| {
        let mut req = client.get(gw.admin_url("/metrics"));
        if let Some(accept) = accept {
            req = req.header("accept", accept);
        }
        async move {
            let resp = req.send().await.expect("metrics");
            assert_eq!(resp.status(), 200);
            let content_type = resp.headers()["content-type"]
                .to_str()
                .expect("ascii")
                .to_owned();
            (content_type, resp.text().await.expect("body"))
        }
    };
    // What Prometheus sends when it prefers OpenMetrics.
    let prometheus =
        "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    for (accept, openmetrics) in [
        (None, false),
        (Some("text/plain"), false),
        (Some("*/*"), false),
        (Some(prometheus), true),
    ] {
        let (content_type, body) = get(accept).await;
        if openmetrics {
            assert!(
                content_type.starts_with("application/openmetrics-text; version=1.0.0"),
                "{accept:?}: {content_type}"
            );
            assert!(body.ends_with("# EOF\n"), "{accept:?}");
            assert!(body.contains("# TYPE hookgate_requests counter"));
        } else {
            assert_eq!(
                content_type, "text/plain; version=0.0.4; charset=utf-8",
                "{accept:?}"
            );
            assert!(!body.contains("# EOF"), "{accept:?}");
            assert!(body.contains("# TYPE hookgate_requests_total counter"));
        }
        let samples = Exposition::parse(&body);
        assert_eq!(
            samples.find(
                "hookgate_request_duration_seconds_count",
                &[("route", "unmatched")]
            ),
            Some(1.0),
            "{accept:?}"
        );
        for name in [
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            let value = samples.find(name, &[]);
            assert!(
                value.is_some_and(|v| v > 0.0),
                "{name} in {accept:?}: {value:?}"
            );
        }
    }
}
