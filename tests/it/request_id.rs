//! `X-Request-Id` on every answer of the webhook listener, including the ones given before
//! the pipeline runs (404, 405, 408, 413) and the rate limiter's 429.

use crate::require_broker;
use crate::util::*;

/// The value of `name` in a raw HTTP answer head.
fn raw_header(answer: &str, name: &str) -> Option<String> {
    let head = answer.split("\r\n\r\n").next().unwrap_or_default();
    head.lines().skip(1).find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

fn request_id(resp: &reqwest::Response) -> Option<String> {
    resp.headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[tokio::test]
async fn every_answer_carries_x_request_id() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.extra = "limits:\n  max_body_bytes: 1KiB\n  body_read_timeout: 300ms\n".into();
    cfg.route_extra = "    rate_limit:\n      per_second: 1\n      burst: 1\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);

    // 404: the sender's id is echoed even on a path no route serves.
    let resp = client
        .post(gw.url("/nope"))
        .header("x-botix-request-id", "req_404")
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 404);
    assert_eq!(request_id(&resp).as_deref(), Some("req_404"));
    // 404 without an id from the sender: a generated one.
    let resp = client.get(gw.url("/nope")).send().await.expect("send");
    assert_eq!(resp.status(), 404);
    let generated = request_id(&resp).expect("a generated X-Request-Id");
    assert!(uuid_like(&generated), "{generated}");

    // 405.
    let resp = client
        .get(gw.url("/webhooks/botix"))
        .header("x-botix-request-id", "req_405")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 405);
    assert_eq!(request_id(&resp).as_deref(), Some("req_405"));

    // 413 on a declared length, answered before the body is sent.
    let answer = raw_exchange(
        gw.addr,
        "POST /webhooks/botix HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\nX-Botix-Request-Id: req_413\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(
        raw_header(&answer, "x-request-id").as_deref(),
        Some("req_413")
    );

    // 408: half a body, then nothing.
    let answer = raw_exchange(
        gw.addr,
        "POST /webhooks/botix HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nX-Botix-Request-Id: req_408\r\n\r\n{\"id\":",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert_eq!(
        raw_header(&answer, "x-request-id").as_deref(),
        Some("req_408")
    );

    // 401 comes from the pipeline.
    let resp = client
        .post(gw.url("/webhooks/botix"))
        .header("x-botix-request-id", "req_401")
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 401);
    assert_eq!(request_id(&resp).as_deref(), Some("req_401"));

    // 429: the route's bucket holds one verified delivery; the next within the second is
    // over it.
    let mut limited = None;
    for i in 0..5 {
        let id = format!("req_429_{i}");
        let body = event_body(&unique("evt_429"));
        let resp = client
            .post(gw.url("/webhooks/botix"))
            .header("x-botix-signature", sign(SECRET, body.as_bytes()))
            .header("x-botix-request-id", &id)
            .body(body)
            .send()
            .await
            .expect("send");
        if resp.status() == 429 {
            limited = Some((id, request_id(&resp)));
            break;
        }
    }
    let (id, echoed) = limited.expect("a 429 within five back-to-back requests");
    assert_eq!(echoed.as_deref(), Some(id.as_str()));
    broker.delete().await;
}

fn uuid_like(text: &str) -> bool {
    text.len() == 36 && text.chars().filter(|c| *c == '-').count() == 4
}
