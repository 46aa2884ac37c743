//! The process's life (contract §8): SIGTERM and SIGINT, a shutdown grace that runs out, and a
//! certificate rotation that fails.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::require_broker;
use crate::util::*;

#[tokio::test]
async fn sigint_shuts_down_cleanly_like_sigterm() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    let mut gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    deliver_ok(&client, &gw, "before SIGINT").await;

    gw.signal("INT");
    let status = gw
        .wait_exit(POLL_DEADLINE)
        .await
        .expect("exited after SIGINT");
    assert_eq!(
        status.code(),
        Some(0),
        "SIGINT is a clean shutdown, not a kill; logs:\n{}",
        gw.logs().join("\n")
    );
    assert!(
        gw.logs().iter().any(|l| l.contains("SIGINT received")),
        "the signal is logged; logs:\n{}",
        gw.logs().join("\n")
    );
    broker.delete().await;
}

/// The head of a signed HTTP/1.1 delivery of `body` to the botix route, with `extra`
/// header lines.
fn signed_head(body: &str, extra: &str) -> String {
    format!(
        "POST /webhooks/botix HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nX-Botix-Signature: {}\r\n{extra}\r\n",
        body.len(),
        sign(SECRET, body.as_bytes())
    )
}

#[tokio::test]
async fn sigterm_asks_an_idle_kept_alive_connection_to_close_without_waiting_for_the_grace() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    // A grace and connection deadlines beyond the poll deadline (hyper's header timer ends
    // a kept-alive connection that sends no request after `header_read_timeout`): only a
    // connection asked to close lets the gateway exit in time.
    cfg.extra =
        "shutdown_grace: 60s\nlimits:\n  header_read_timeout: 60s\n  idle_timeout: 120s\n".into();
    let mut gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    let body = event_body("evt_kept_alive");
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    let request = signed_head(&body, "") + &body;
    s.write_all(request.as_bytes()).await.expect("request");
    let answer = read_until(&mut s, b"\"status\":\"accepted\"}").await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));

    gw.signal("TERM");
    let status = gw
        .wait_exit(POLL_DEADLINE)
        .await
        .expect("still running: the idle connection was not asked to close");
    assert_eq!(status.code(), Some(0));
    assert!(
        !gw.logs()
            .iter()
            .any(|l| l.contains("connections still open after the shutdown grace")),
        "logs:\n{}",
        gw.logs().join("\n")
    );
    assert!(
        read_until_closed(&mut s, POLL_DEADLINE).await.is_some(),
        "the kept-alive connection is closed"
    );
    broker.delete().await;
}

#[tokio::test]
async fn a_request_still_arriving_when_the_grace_runs_out_is_cut_and_the_gateway_exits() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    // The body timeout is far beyond the poll deadline, so only the grace can end the wait.
    cfg.extra = "shutdown_grace: 1s\nlimits:\n  body_read_timeout: 120s\n".into();
    let mut gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    let body = event_body("evt_cut_by_grace");
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    let head = signed_head(&body, "Expect: 100-continue\r\n");
    s.write_all(head.as_bytes()).await.expect("head");
    // The 100-continue says the handler is reading the body: the request is in flight.
    read_until(&mut s, b"\r\n\r\n").await;
    s.write_all(&body.as_bytes()[..10]).await.expect("a little");

    gw.signal("TERM");
    let status = gw
        .wait_exit(POLL_DEADLINE)
        .await
        .expect("still running long after the grace ran out");
    assert_eq!(status.code(), Some(0));
    assert!(
        gw.logs()
            .iter()
            .any(|l| l.contains("connections still open after the shutdown grace")),
        "the cut is logged; logs:\n{}",
        gw.logs().join("\n")
    );
    let answer = read_until_closed(&mut s, POLL_DEADLINE)
        .await
        .expect("the connection is closed");
    assert!(
        !String::from_utf8_lossy(&answer).contains("accepted"),
        "a body that never arrived cannot be accepted"
    );
    assert!(
        broker.next(Duration::from_millis(500)).await.is_none(),
        "nothing is published for a request cut before its body arrived"
    );
    broker.delete().await;
}

#[tokio::test]
async fn a_broken_certificate_rotation_keeps_serving_the_old_certificate() {
    require_broker!();
    let (_dir, broker, cert, cfg) = tls_fixture().await;
    let gw = Gateway::start(&cfg).await;
    assert_eq!(
        presented_cert(gw.addr, &[&cert]).await.expect("tls"),
        cert.cert_der
    );

    // A half-written rotation: the certificate file holds no PEM at all.
    std::fs::write(&cert.cert_path, "-----BEGIN CERTIFICATE-----\ntruncated").expect("break");
    assert!(
        gw.logged("TLS reload failed", POLL_DEADLINE).await,
        "the failed reload is logged; logs:\n{}",
        gw.logs().join("\n")
    );
    assert_eq!(
        presented_cert(gw.addr, &[&cert])
            .await
            .expect("tls after a failed reload"),
        cert.cert_der,
        "new connections still get the old certificate"
    );
    deliver_ok(&client(Some(&cert)), &gw, "after a failed rotation").await;
    assert_eq!(healthz(&client(None), &gw).await, 200);
    broker.delete().await;
}

#[tokio::test]
async fn sigterm_finishes_a_request_whose_body_is_still_arriving() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    // Longer than every poll below, so a poll that runs out is reported as itself.
    cfg.extra = "shutdown_grace: 30s\n".into();
    let mut gw = Gateway::start(&cfg).await;
    let client = client(None);
    // Connected first, so the event is published rather than spooled for the next start.
    wait_broker_connected(&client, &gw).await;

    let body = event_body("evt_in_flight");
    let (first, rest) = body.as_bytes().split_at(body.len() / 2);
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    // `Expect: 100-continue` makes the gateway say when its handler is reading the body.
    let head = format!(
        "POST /webhooks/botix HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nX-Botix-Signature: {}\r\nX-Botix-Request-Id: req_in_flight\r\nExpect: 100-continue\r\n\r\n",
        body.len(),
        sign(SECRET, body.as_bytes())
    );
    s.write_all(head.as_bytes()).await.expect("head");
    let cont = read_until(&mut s, b"\r\n\r\n").await;
    assert!(
        cont.starts_with(b"HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&cont)
    );
    s.write_all(first).await.expect("first half");

    gw.signal("TERM");
    assert!(
        eventually(POLL_DEADLINE, || async {
            matches!(
                client.get(gw.admin_url("/readyz")).send().await,
                Ok(r) if r.status() == 503
            )
        })
        .await,
        "/readyz never answered 503 after SIGTERM"
    );
    let addr = gw.addr;
    assert!(
        eventually(POLL_DEADLINE, || async {
            // Bounded: with a full accept queue a SYN is dropped and connect() hangs.
            let attempt = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr));
            matches!(attempt.await, Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused)
        })
        .await,
        "new connections were still accepted after shutdown started"
    );
    assert!(
        gw.wait_exit(Duration::from_millis(1)).await.is_none(),
        "exited with a request in flight"
    );

    s.write_all(rest).await.expect("second half");
    let answer = read_until_closed(&mut s, POLL_DEADLINE)
        .await
        .expect("connection closed after the answer");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""status":"accepted""#), "{answer}");

    let status = gw
        .wait_exit(Duration::from_secs(30 + 10))
        .await
        .expect("exited within the grace");
    assert_eq!(status.code(), Some(0), "clean shutdown exits 0");
    let m = broker.next(BROKER_TIMEOUT).await.unwrap_or_else(|| {
        panic!(
            "the in-flight event was not published; logs:\n{}",
            gw.logs().join("\n")
        )
    });
    assert_eq!(m.message_id.as_deref(), Some("evt_in_flight"));
    broker.delete().await;
}

/// A second signal during the drain ends the process at once with 128 + that signal's
/// number, as a shell reports a process killed by it.
async fn second_signal_exits_with(first: &str, second: &str, code: i32) {
    let (_dir, broker, mut cfg) = fixture().await;
    // The drain waits for the request below far longer than any poll here.
    cfg.extra = "shutdown_grace: 120s\nlimits:\n  body_read_timeout: 120s\n".into();
    let mut gw = Gateway::start(&cfg).await;
    let body = event_body("evt_held_in_the_drain");
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    let head = signed_head(&body, "Expect: 100-continue\r\n");
    s.write_all(head.as_bytes()).await.expect("head");
    read_until(&mut s, b"\r\n\r\n").await;

    gw.signal(first);
    assert!(
        gw.logged(&format!("SIG{first} received"), POLL_DEADLINE)
            .await,
        "the first signal starts the drain; logs:\n{}",
        gw.logs().join("\n")
    );
    gw.signal(second);
    let status = gw
        .wait_exit(POLL_DEADLINE)
        .await
        .expect("exited at once after the second signal");
    assert_eq!(
        status.code(),
        Some(code),
        "SIG{first} then SIG{second}; logs:\n{}",
        gw.logs().join("\n")
    );
    broker.delete().await;
}

#[tokio::test]
async fn a_second_sigterm_exits_143() {
    require_broker!();
    second_signal_exits_with("TERM", "TERM", 143).await;
}

#[tokio::test]
async fn a_second_sigint_exits_130() {
    require_broker!();
    second_signal_exits_with("INT", "INT", 130).await;
}

#[tokio::test]
async fn sigint_during_a_sigterm_drain_exits_130() {
    require_broker!();
    second_signal_exits_with("TERM", "INT", 130).await;
}

#[tokio::test]
async fn healthz_fails_with_the_reason_once_a_part_needs_a_restart() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    let app = InProcess::start(&cfg.yaml()).await;
    let client = client(None);
    let get = |path: &'static str| {
        let (client, url) = (client.clone(), format!("http://{}{path}", app.admin));
        async move {
            let resp = client.get(url).send().await.expect("admin request");
            let status = resp.status().as_u16();
            (status, resp.text().await.expect("body"))
        }
    };
    assert_eq!(get("/healthz").await, (200, "ok\n".to_owned()));
    // What the state store's journal does when one of its threads ends.
    app.liveness
        .needs_restart("the state store's state-journal thread ended");
    assert_eq!(
        get("/healthz").await,
        (
            503,
            "needs a restart: the state store's state-journal thread ended\n".to_owned()
        )
    );
    // Readiness is about what may pass by itself, and the webhooks still answer.
    let ready = get("/readyz").await;
    assert!(
        ready.0 == 200 || ready.1.contains("broker"),
        "readiness: {ready:?}"
    );
    app.stop().await;
    broker.delete().await;
}
