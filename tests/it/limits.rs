//! Slow and hostile clients, and the connection and rate limits (SECURITY.md).

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::require_broker;
use crate::util::*;

#[tokio::test]
async fn a_slow_loris_is_cut_off_while_normal_traffic_flows() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.extra = "limits:\n  header_read_timeout: 1s\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);

    let mut loris = TcpStream::connect(gw.addr).await.expect("connect");
    loris
        .write_all(b"POST /webhooks/botix HTTP/1.1\r\nHost: x\r\nX-Botix-Sig")
        .await
        .expect("partial head");
    let cut = tokio::spawn(async move { read_until_closed(&mut loris, POLL_DEADLINE).await });

    let mut served = 0;
    while !cut.is_finished() {
        deliver_ok(&client, &gw, "alongside the slow loris").await;
        served += 1;
    }
    let got = cut
        .await
        .expect("join")
        .expect("the slow connection was never closed");
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 408"),
        "unexpected answer to a slow loris: {text}"
    );
    assert!(served >= 1);
    deliver_ok(&client, &gw, "after the slow loris").await;
    broker.delete().await;
}

#[tokio::test]
async fn hostile_bodies_and_headers_get_4xx_and_the_gateway_keeps_serving() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    let gw = Gateway::start(&cfg).await;
    let client = client(None);

    let post_bytes = |body: Vec<u8>| {
        let req = client
            .post(gw.url("/webhooks/botix"))
            .header("x-botix-signature", sign(SECRET, &body))
            .body(body);
        async move { req.send().await.expect("send").status().as_u16() }
    };

    let deep = format!(
        "{{\"id\":\"evt_deep\",\"event\":\"x\",\"data\":{}{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    assert_eq!(post_bytes(deep.into_bytes()).await, 400, "deep nesting");
    assert_eq!(healthz(&client, &gw).await, 200);
    deliver_ok(&client, &gw, "after deep nesting").await;

    let mut invalid = b"{\"id\":\"evt_utf8\",\"event\":\"x\",\"data\":\"".to_vec();
    invalid.extend_from_slice(&[0xff, 0xfe, 0xc3, 0x28]);
    invalid.extend_from_slice(b"\"}");
    assert_eq!(post_bytes(invalid).await, 400, "invalid UTF-8");
    assert_eq!(healthz(&client, &gw).await, 200);
    deliver_ok(&client, &gw, "after invalid UTF-8").await;

    let body = event_body("evt_big_header");
    let big = client
        .post(gw.url("/webhooks/botix"))
        .header("x-botix-signature", sign(SECRET, body.as_bytes()))
        .header("x-padding", "a".repeat(100 * 1024))
        .body(body)
        .send()
        .await;
    match big {
        Ok(resp) => assert_eq!(resp.status(), 431, "100 KiB header"),
        Err(e) => assert!(!e.is_timeout(), "a closed connection, not a hang: {e:?}"),
    }
    assert_eq!(healthz(&client, &gw).await, 200);
    deliver_ok(&client, &gw, "after a 100 KiB header").await;
    broker.delete().await;
}

#[tokio::test]
async fn connections_beyond_max_connections_are_refused() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.extra = "limits:\n  max_connections: 2\n  header_read_timeout: 60s\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    // Connected first, so every accepted delivery is published, not spooled.
    wait_broker_connected(&client, &gw).await;

    let mut accepted = Vec::new();
    // Two keep-alive connections, each proven served, then held idle.
    let mut held = Vec::new();
    for i in 0..2 {
        let mut s = TcpStream::connect(gw.addr).await.expect("connect");
        let id = format!("evt_held_{i}");
        accept_on(&mut s, &id).await;
        accepted.push(id);
        held.push(s);
    }
    let metrics = scrape(&client, &gw).await;
    assert_eq!(metrics.get("hookgate_connections_max", &[]), 2.0);
    assert_eq!(
        metrics.get("hookgate_connections_open", &[]),
        2.0,
        "the held connections are counted open"
    );
    let mut third = TcpStream::connect(gw.addr)
        .await
        .expect("the kernel completes the handshake");
    let _ = third
        .write_all(&signed_request(&event_body("evt_refused")))
        .await;
    let got = read_until_closed(&mut third, POLL_DEADLINE)
        .await
        .expect("the third connection was neither closed nor refused");
    assert!(
        got.is_empty(),
        "the third connection was served: {}",
        String::from_utf8_lossy(&got)
    );

    // The held connections still work, and a freed slot is usable again.
    let mut first = held.remove(0);
    accept_on(&mut first, "evt_held_again").await;
    accepted.push("evt_held_again".to_owned());
    drop(first);
    let addr = gw.addr;
    let request = b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n";
    assert!(
        eventually(POLL_DEADLINE, || async {
            let Ok(mut s) = TcpStream::connect(addr).await else {
                return false;
            };
            if s.write_all(request).await.is_err() {
                return false;
            }
            read_until_closed_or(&mut s, b"not_found").await
        })
        .await,
        "a closed connection never freed its slot"
    );

    // The sentinel goes over the connection still held, so no slot is needed: exactly the
    // accepted deliveries arrive before it, and the refused one never does.
    let sentinel = unique("sentinel");
    accept_on(&mut held[0], &sentinel).await;
    assert_eq!(ids(&broker.until(&sentinel).await), accepted);
    broker.delete().await;
}

/// In this process, on a clock the test moves: however slow the machine, real time cannot
/// refill the bucket, and a refill is shown by moving the clock, not by sleeping.
#[tokio::test]
async fn the_third_quick_request_is_rate_limited_with_retry_after_and_a_second_refills_one() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.route_extra = "    rate_limit:\n      per_second: 1\n      burst: 2\n".into();
    let gw = InProcess::start(&cfg.yaml()).await;
    let client = client(None);
    let mut accepted = Vec::new();

    for what in ["first of the burst", "second of the burst"] {
        let id = unique("evt");
        let (status, answer) = gw.post(&client, &event_body(&id), &id).await;
        assert_eq!(status, 200, "{what}: {answer}");
        accepted.push(id);
    }
    let body = event_body("evt_limited");
    let resp = client
        .post(format!("http://{}/webhooks/botix", gw.addr))
        .header("x-botix-signature", sign(SECRET, body.as_bytes()))
        .body(body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 429);
    let retry_after: u64 = resp.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("Retry-After in whole seconds");
    assert!(retry_after >= 1);
    let answer: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(answer["error"], "rate_limited");

    gw.set_now(gw.now() + 1000);
    let id = unique("evt");
    let (status, answer) = gw.post(&client, &event_body(&id), &id).await;
    assert_eq!(status, 200, "a second later one token is back: {answer}");
    accepted.push(id);
    let refused = unique("evt_refused");
    let (status, answer) = gw.post(&client, &event_body(&refused), &refused).await;
    assert_eq!(status, 429, "and only one: {answer}");

    // Another second for the sentinel's token: exactly the accepted events arrive before
    // it, and neither refused one does.
    gw.set_now(gw.now() + 1000);
    let sentinel = unique("sentinel");
    let (status, answer) = gw.post(&client, &event_body(&sentinel), &sentinel).await;
    assert_eq!(status, 200, "the sentinel: {answer}");
    assert_eq!(ids(&broker.until(&sentinel).await), accepted);
    gw.stop().await;
    broker.delete().await;
}
