//! Client errors that a client library hides, read off the raw socket: a body that stalls
//! (408) and a request head over the limit (431). Each ends with the broker check that
//! nothing of them was published.

use crate::require_broker;
use crate::util::*;

#[tokio::test]
async fn a_body_that_stalls_gets_408_and_nothing_is_published() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.extra = "limits:\n  body_read_timeout: 1s\n".into();
    let gw = Gateway::start(&cfg).await;
    let body = event_body("evt_stalled");
    let request = format!(
        "POST /webhooks/botix HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nX-Botix-Signature: {}\r\n\r\n{}",
        body.len(),
        sign(SECRET, body.as_bytes()),
        &body[..body.len() / 2]
    );
    let answer = raw_exchange(gw.addr, &request).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_read_timeout"), "{answer}");

    let ids = ids_before_sentinel(&client(None), &gw, &broker).await;
    assert!(ids.is_empty(), "published before the sentinel: {ids:?}");
    broker.delete().await;
}

#[tokio::test]
async fn a_request_head_over_max_header_bytes_gets_431_and_nothing_is_published() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.extra = "limits:\n  max_header_bytes: 16KiB\n".into();
    let gw = Gateway::start(&cfg).await;
    let body = event_body("evt_big_head");
    let request = format!(
        "POST /webhooks/botix HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nX-Botix-Signature: {}\r\nX-Padding: {}\r\n\r\n{}",
        body.len(),
        sign(SECRET, body.as_bytes()),
        "a".repeat(20 * 1024),
        body
    );
    let answer = raw_exchange(gw.addr, &request).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    let ids = ids_before_sentinel(&client(None), &gw, &broker).await;
    assert!(ids.is_empty(), "published before the sentinel: {ids:?}");
    broker.delete().await;
}
