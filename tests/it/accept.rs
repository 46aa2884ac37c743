//! The accept path: signature, limits, answers, and the AMQP message of contract §5.

use std::io::{Read, Write};
use std::time::Duration;

use crate::require_broker;
use crate::util::*;

#[tokio::test]
async fn signed_delivery_over_tls_becomes_exactly_one_spec_message() {
    require_broker!();
    let (_dir, broker, cert, mut cfg) = tls_fixture().await;
    cfg.amqp_extra = "  routing_key: \"{route}.{event}\"\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(Some(&cert));

    // Odd spacing and non-ASCII text: the message must carry these exact bytes.
    let body = format!(
        "{{\"id\": \"evt_one\",  \"event\": \"message.received\", \"timestamp\": \"{}\", \"data\": {{\"text\": \"СТОП — stop\"}}}}",
        rfc3339_from_now(0)
    );
    let resp = client
        .post(gw.url("/webhooks/botix"))
        .header("x-botix-signature", sign(SECRET, body.as_bytes()))
        .header("x-botix-request-id", "req_one")
        .header("x-delivery-attempt", "2")
        .body(body.clone())
        .send()
        .await
        .expect("send");
    assert_eq!(
        resp.version(),
        reqwest::Version::HTTP_2,
        "ALPN must offer h2"
    );
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "req_one");
    assert_eq!(resp.headers()["content-type"], "application/json");
    let answer: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(
        answer,
        serde_json::json!({"status": "accepted", "event_id": "evt_one"})
    );

    let got = published_before_sentinel(&client, &gw, &broker).await;
    assert_eq!(got.len(), 1, "exactly one message");
    let m = &got[0];
    assert_eq!(m.body, body.as_bytes(), "raw body byte for byte");
    assert_eq!(m.routing_key, "botix.message.received");
    assert_eq!(m.message_id.as_deref(), Some("evt_one"));
    assert_eq!(m.delivery_mode, Some(2));
    assert_eq!(m.content_type.as_deref(), Some("application/json"));
    assert_eq!(m.app_id.as_deref(), Some("hookgate"));
    let now = time::OffsetDateTime::now_utc().unix_timestamp() as u64;
    assert!(
        m.timestamp.is_some_and(|t| t <= now && t + 60 >= now),
        "{:?}",
        m.timestamp
    );
    assert_eq!(m.header("x-request-id").as_deref(), Some("req_one"));
    assert_eq!(
        m.header("x-event-type").as_deref(),
        Some("message.received")
    );
    assert_eq!(m.header("x-delivery-attempt").as_deref(), Some("2"));
    assert_eq!(m.header("x-route").as_deref(), Some("botix"));
    let received_at = m.header("x-received-at").expect("x-received-at");
    assert!(received_at.ends_with('Z'), "{received_at}");
    time::OffsetDateTime::parse(&received_at, &time::format_description::well_known::Rfc3339)
        .expect("RFC 3339");
    broker.delete().await;
}

#[tokio::test]
async fn bad_signatures_get_401_and_publish_nothing() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    let body = event_body("evt_bad");
    let compact: serde_json::Value = serde_json::from_str(&body).expect("json");
    let reserialised = serde_json::to_string_pretty(&compact).expect("pretty");
    type Case<'a> = (&'a str, String, Vec<(&'a str, String)>);
    let cases: Vec<Case> = vec![
        (
            "wrong secret",
            body.clone(),
            vec![("x-botix-signature", sign("not-the-secret", body.as_bytes()))],
        ),
        ("missing", body.clone(), vec![]),
        (
            "malformed",
            body.clone(),
            vec![("x-botix-signature", "sha256=xyz".into())],
        ),
        (
            "re-serialised body",
            reserialised,
            vec![("x-botix-signature", sign(SECRET, body.as_bytes()))],
        ),
    ];
    for (name, b, headers) in cases {
        let (status, answer) = gw.post(&client, &b, &headers).await;
        assert_eq!(status, 401, "{name}");
        assert_eq!(
            answer,
            serde_json::json!({"error": "invalid_signature"}),
            "{name}"
        );
    }
    // The rotated-out secret is still active.
    let rotated = event_body("evt_rotated");
    let (status, _) = gw
        .post(
            &client,
            &rotated,
            &[(
                "x-botix-signature",
                sign(PREVIOUS_SECRET, rotated.as_bytes()),
            )],
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        ids_before_sentinel(&client, &gw, &broker).await,
        vec!["evt_rotated"]
    );
    assert!(
        !gw.logs().join("\n").contains(SECRET),
        "a secret reached the log"
    );
    broker.delete().await;
}

#[tokio::test]
async fn limits_and_bad_requests_get_the_spec_answers() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.extra = "limits:\n  max_body_bytes: 1KiB\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);

    for (body, expect) in [
        ("not json", "body is not a JSON object"),
        ("[1,2]", "body is not a JSON object"),
        ("{\"event\":\"x\"}", "event has no id"),
    ] {
        let (status, answer) = gw
            .post(
                &client,
                body,
                &[("x-botix-signature", sign(SECRET, body.as_bytes()))],
            )
            .await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(answer["error"], expect);
    }
    let resp = client
        .post(gw.url("/nope"))
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 404);
    let resp = client
        .get(gw.url("/webhooks/botix"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers()["allow"], "POST");

    // A declared length over the limit is refused before the body is sent.
    let addr = gw.addr;
    let answer = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        write!(s, "POST /webhooks/botix HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\nX-Botix-Signature: sha256=00\r\n\r\n{{\"id\":").expect("write");
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).expect("an answer before the body was sent");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
    .await
    .expect("join");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    // A chunked body that grows over the limit is cut off too.
    let big = format!("{{\"id\":\"x\",\"pad\":\"{}\"}}", "a".repeat(2048));
    let stream =
        futures_util::stream::iter(vec![Ok::<_, std::io::Error>(big.clone().into_bytes())]);
    let resp = client
        .post(gw.url("/webhooks/botix"))
        .header("x-botix-signature", sign(SECRET, big.as_bytes()))
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 413);
    let health = client
        .get(gw.admin_url("/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    // None of the refused requests reached the broker.
    let published = ids_before_sentinel(&client, &gw, &broker).await;
    assert!(published.is_empty(), "published: {published:?}");
    broker.delete().await;
}

#[tokio::test]
async fn unroutable_or_unreachable_broker_without_spool_is_503_with_retry_after() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::unbound().await;
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    cfg.extra = "spool:\n  enabled: false\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    // Wait for the connection, so the 503 below is about routing, not connecting.
    wait_broker_connected(&client, &gw).await;
    let (status, _) = gw
        .deliver(&client, &event_body("evt_unroutable"), "r1")
        .await;
    assert_eq!(status, 503, "no queue bound → not a 200");
    // The claim was released: once a queue is bound, the sender's retry goes through.
    broker.bind("#").await;
    let (status, answer) = gw
        .deliver(&client, &event_body("evt_unroutable"), "r2")
        .await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("accepted")));
    drop(gw);

    let dir2 = tempfile::tempdir().expect("tempdir");
    let mut cfg = GatewayConfig::new(dir2.path(), &broker.exchange);
    cfg.amqp_url = unreachable_amqp_url();
    cfg.extra = "spool:\n  enabled: false\n".into();
    let gw = Gateway::start(&cfg).await;
    let body = event_body("evt_no_broker");
    let resp = client
        .post(gw.url("/webhooks/botix"))
        .header("x-botix-signature", sign(SECRET, body.as_bytes()))
        .body(body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "5");
    let ready = client
        .get(gw.admin_url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 503, "no broker and no spool → not ready");
    broker.delete().await;
}

/// `amqps://` must really speak TLS (lapin falls back to plain TCP without its rustls
/// features): a TLS terminator owned by the test sits in front of the plain broker port, and
/// the gateway trusts its certificate through `SSL_CERT_FILE`.
#[tokio::test]
async fn amqps_url_publishes_over_tls() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::new().await;
    let cert = TestCert::generate(dir.path());
    let terminator = tls_terminator(&cert).await;
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    cfg.amqp_url = format!("amqps://guest:guest@localhost:{}/%2f", terminator.port());
    cfg.env
        .push(("SSL_CERT_FILE".into(), cert.cert_path.display().to_string()));
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    let (status, answer) = gw.deliver(&client, &event_body("evt_tls"), "r1").await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("accepted")));
    let m = broker
        .next(BROKER_TIMEOUT)
        .await
        .expect("message over amqps");
    assert_eq!(m.message_id.as_deref(), Some("evt_tls"));
    assert!(
        terminator.handshakes() > 0,
        "the gateway must have done a TLS handshake"
    );
    broker.delete().await;
}

struct Terminator {
    addr: std::net::SocketAddr,
    handshakes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Terminator {
    fn port(&self) -> u16 {
        self.addr.port()
    }
    fn handshakes(&self) -> usize {
        self.handshakes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Terminator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts TLS with `cert` on 127.0.0.1:0 and forwards the plaintext to RabbitMQ.
async fn tls_terminator(cert: &TestCert) -> Terminator {
    let files = hookgate::config::Tls {
        cert: cert.cert_path.clone(),
        key: cert.key_path.clone(),
    };
    let mut config = hookgate::tls::load(&files).expect("tls config");
    config.alpn_protocols.clear();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let handshakes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = handshakes.clone();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, count) = (acceptor.clone(), count.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Ok(mut upstream) = tokio::net::TcpStream::connect("127.0.0.1:5672").await
                else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut upstream).await;
            });
        }
    });
    Terminator {
        addr,
        handshakes,
        task,
    }
}
