//! What an unauthenticated client can take (SECURITY.md): connection slots, the sender's rate
//! limit, an empty secret, and memory before verification.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::require_broker;
use crate::util::*;

/// The second peer of these tests: an attacker with an address of its own.
const ATTACKER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

type Body = BoxBody<Bytes, Infallible>;

/// An HTTP/2 connection with prior knowledge (no TLS) from `from`; the connection task is
/// returned so a test can see when the server closed it.
async fn h2_connect(
    from: IpAddr,
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<Body>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    let tcp = connect_from(from, addr).await;
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("h2 handshake");
    (send, tokio::spawn(conn))
}

fn get(addr: SocketAddr, path: &str) -> http::Request<Body> {
    http::Request::get(format!("http://{addr}{path}"))
        .body(Empty::new().boxed())
        .expect("request")
}

async fn metric(
    client: &reqwest::Client,
    gw: &Gateway,
    name: &str,
    labels: &[(&str, &str)],
) -> f64 {
    scrape(client, gw).await.get(name, labels)
}

/// Waits until the closes counted for `reason` reach `n`.
async fn closes_reach(client: &reqwest::Client, gw: &Gateway, reason: &str, n: f64) -> bool {
    eventually(POLL_DEADLINE, || async {
        metric(
            client,
            gw,
            "hookgate_connections_closed_total",
            &[("reason", reason)],
        )
        .await
            >= n
    })
    .await
}

// ---------------------------------------------------------------------------------------
// 1. Connection slots.

#[tokio::test]
async fn silent_connections_are_closed_at_the_setup_deadline_and_the_sender_gets_in() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.extra = "limits:\n  max_connections: 8\n  header_read_timeout: 1s\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);

    // More silent connections than slots: without a deadline they would hold all of them.
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(TcpStream::connect(gw.addr).await.expect("connect"));
    }
    for (i, s) in silent.iter_mut().enumerate() {
        let got = read_until_closed(s, POLL_DEADLINE)
            .await
            .unwrap_or_else(|| panic!("silent connection {i} was never closed"));
        assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    }
    assert!(closes_reach(&client, &gw, "setup_timeout", 8.0).await);
    let (status, answer) = gw
        .deliver(&client, &event_body(&unique("evt")), "req_1")
        .await;
    assert_eq!(status, 200, "{answer}");

    // A connection that sent the HTTP/2 preface but never a request is closed too.
    let (_send, conn) = h2_connect(IpAddr::from([127, 0, 0, 1]), gw.addr).await;
    tokio::time::timeout(POLL_DEADLINE, conn)
        .await
        .expect("an HTTP/2 connection without a request was never closed")
        .expect("join")
        .ok();
    assert!(closes_reach(&client, &gw, "setup_timeout", 9.0).await);
    broker.delete().await;
}

/// TLS clients that finish the handshake (choosing h2 or http/1.1 by ALPN) and then send
/// nothing are closed by the same deadline.
#[tokio::test]
async fn silent_tls_connections_are_closed_after_the_handshake() {
    require_broker!();
    let (_dir, broker, cert, mut cfg) = tls_fixture().await;
    cfg.extra = "limits:\n  max_connections: 8\n  header_read_timeout: 1s\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(Some(&cert));

    let mut silent = Vec::new();
    for i in 0..8 {
        let alpn: &[u8] = if i % 2 == 0 { b"h2" } else { b"http/1.1" };
        silent.push(tls_connect(gw.addr, &cert, alpn).await);
    }
    for (i, s) in silent.iter_mut().enumerate() {
        let mut buf = [0u8; 256];
        let closed = tokio::time::timeout(POLL_DEADLINE, async {
            use tokio::io::AsyncReadExt;
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {} // an HTTP/2 SETTINGS frame, say
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "silent TLS connection {i} was never closed");
    }
    assert!(closes_reach(&client, &gw, "setup_timeout", 8.0).await);
    let (status, answer) = gw
        .deliver(&client, &event_body(&unique("evt")), "req_1")
        .await;
    assert_eq!(status, 200, "{answer}");
    broker.delete().await;
}

async fn tls_connect(
    addr: SocketAddr,
    cert: &TestCert,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    hookgate::tls::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(
            cert.cert_der.clone(),
        ))
        .expect("root");
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let tls = tokio::time::timeout(POLL_DEADLINE, connector.connect(name, tcp))
        .await
        .expect("handshake in time")
        .expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
    tls
}

#[tokio::test]
async fn idle_connections_are_closed_and_old_ones_are_asked_to_go() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = GatewayConfig::new(dir.path(), "unused");
    cfg.extra =
        "limits:\n  header_read_timeout: 5s\n  idle_timeout: 1s\n  max_connection_age: 3s\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);

    // A kept-alive HTTP/1 connection after its answer.
    let mut h1 = TcpStream::connect(gw.addr).await.expect("connect");
    h1.write_all(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let got = read_until_closed(&mut h1, POLL_DEADLINE)
        .await
        .expect("an idle HTTP/1 connection was never closed");
    assert!(
        got.starts_with(b"HTTP/1.1 404"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(closes_reach(&client, &gw, "idle", 1.0).await);

    // An HTTP/2 connection with no open stream.
    let (mut send, conn) = h2_connect(IpAddr::from([127, 0, 0, 1]), gw.addr).await;
    let resp = send
        .send_request(get(gw.addr, "/nope"))
        .await
        .expect("answer");
    assert_eq!(resp.status(), 404);
    tokio::time::timeout(POLL_DEADLINE, conn)
        .await
        .expect("an idle HTTP/2 connection was never closed")
        .expect("join")
        .expect("closed cleanly, with GOAWAY");
    assert!(closes_reach(&client, &gw, "idle", 2.0).await);

    // A busy HTTP/2 connection is never idle, but it ages: GOAWAY after max_connection_age,
    // and every request it got in was answered.
    let (mut send, conn) = h2_connect(IpAddr::from([127, 0, 0, 1]), gw.addr).await;
    let busy = async {
        let mut answered = 0;
        loop {
            if send.ready().await.is_err() {
                return answered;
            }
            match send.send_request(get(gw.addr, "/nope")).await {
                Ok(resp) => {
                    assert_eq!(resp.status(), 404);
                    answered += 1;
                }
                Err(_) => return answered,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let answered = tokio::time::timeout(POLL_DEADLINE, busy)
        .await
        .expect("an old connection was never asked to close");
    assert!(answered > 1, "{answered}");
    tokio::time::timeout(POLL_DEADLINE, conn)
        .await
        .expect("closed")
        .expect("join")
        .expect("closed cleanly, with GOAWAY");
    assert!(closes_reach(&client, &gw, "max_age", 1.0).await);
}

// ---------------------------------------------------------------------------------------
// 2. The sender's rate limit.

#[tokio::test]
async fn forged_deliveries_do_not_spend_the_senders_rate_limit() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.route_extra = "    rate_limit:\n      per_second: 2\n      burst: 5\n".into();
    cfg.extra =
        "limits:\n  failed_verification_per_peer:\n    per_second: 1\n    burst: 5\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    let attacker = client_from(ATTACKER);

    let body = event_body("evt_forged");
    let mut statuses = std::collections::BTreeMap::new();
    for i in 0..60 {
        // A made-up forwarding header changes nothing: no proxy is trusted by default.
        let resp = attacker
            .post(gw.url("/webhooks/botix"))
            .header("x-botix-signature", sign("not-the-secret", body.as_bytes()))
            .header("x-forwarded-for", format!("10.0.0.{i}"))
            .body(body.clone())
            .send()
            .await
            .expect("send");
        *statuses.entry(resp.status().as_u16()).or_insert(0) += 1;
    }
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        vec![401, 429],
        "{statuses:?}"
    );
    assert!(
        statuses[&429] >= 40,
        "the flood is refused cheaply: {statuses:?}"
    );

    // The real sender's bucket is untouched: its whole burst goes through, the sentinel
    // last. Exactly those deliveries arrive before it; no forged one does.
    let mut accepted = Vec::new();
    for i in 0..4 {
        let id = unique("evt");
        let (status, answer) = gw
            .deliver(&client, &event_body(&id), &format!("req_{i}"))
            .await;
        assert_eq!(status, 200, "delivery {i} after the flood: {answer}");
        accepted.push(id);
    }
    assert_eq!(
        ids_before_sentinel(&client, &gw, &broker).await,
        accepted,
        "the sentinel is the burst's fifth delivery"
    );
    let m = scrape(&client, &gw).await;
    assert!(m.get("hookgate_refusals_total", &[("reason", "peer_failures")]) >= 40.0);
    assert!(
        m.get(
            "hookgate_requests_total",
            &[("route", "botix"), ("outcome", "invalid_signature")]
        ) >= 5.0
    );
    broker.delete().await;
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_address_is_the_peer() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.extra = "limits:\n  peer_address_header: x-forwarded-for\n  failed_verification_per_peer:\n    per_second: 1\n    burst: 3\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    let body = event_body("evt_forged");
    let forged = |from: &'static str| {
        client
            .post(gw.url("/webhooks/botix"))
            .header("x-botix-signature", sign("not-the-secret", body.as_bytes()))
            .header("x-forwarded-for", from)
            .body(body.clone())
            .send()
    };
    let mut refused = false;
    for _ in 0..20 {
        // The proxy appends the address it saw; what the client claimed comes first.
        let status = forged("198.51.100.1, 203.0.113.9")
            .await
            .expect("send")
            .status();
        refused |= status == 429;
    }
    assert!(refused, "the forwarded address was limited");
    // Another forwarded address, over the same TCP peer, is not.
    assert_eq!(forged("203.0.113.10").await.expect("send").status(), 401);
    let signed = event_body(&unique("evt"));
    let resp = client
        .post(gw.url("/webhooks/botix"))
        .header("x-botix-signature", sign(SECRET, signed.as_bytes()))
        .header("x-forwarded-for", "203.0.113.9")
        .body(signed)
        .send()
        .await
        .expect("send");
    assert_eq!(
        resp.status(),
        429,
        "a limited address is refused before its body is read, signed or not"
    );
    // Nothing was accepted, so nothing arrives before the sentinel: not the refused signed
    // delivery, nor a forged one.
    let published = ids_before_sentinel(&client, &gw, &broker).await;
    assert!(published.is_empty(), "published: {published:?}");
    broker.delete().await;
}

#[tokio::test]
async fn a_forger_rotating_through_its_ipv6_64_stays_limited() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    // Bound on the IPv6 loopback; the trusted header carries the addresses a forger walks.
    cfg.listen_addr = "\"[::1]:0\"".into();
    cfg.extra = "limits:\n  peer_address_header: x-forwarded-for\n  failed_verification_per_peer:\n    per_second: 1\n    burst: 3\n".into();
    let gw = Gateway::start(&cfg).await;
    assert!(gw.addr.is_ipv6(), "listening on {}", gw.addr);
    let client = client(None);
    let body = event_body("evt_forged");
    let forged = |from: String| {
        client
            .post(gw.url("/webhooks/botix"))
            .header("x-botix-signature", sign("not-the-secret", body.as_bytes()))
            .header("x-forwarded-for", from)
            .body(body.clone())
            .send()
    };
    let mut statuses = std::collections::BTreeMap::new();
    for i in 0..20u32 {
        // A new address of the same /64 for every try.
        let from = format!("2001:db8:5:9:{:x}:{:x}::1", (i * 7919) & 0xffff, i + 1);
        let status = forged(from).await.expect("send").status().as_u16();
        *statuses.entry(status).or_insert(0) += 1;
    }
    // Twenty addresses, one failure each: only as one peer do they pass a burst of three.
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        vec![401, 429],
        "the /64 is one peer: {statuses:?}"
    );
    // The neighbouring /64 is another peer.
    let status = forged("2001:db8:5:a::1".into())
        .await
        .expect("send")
        .status();
    assert_eq!(status, 401);
    broker.delete().await;
}

// ---------------------------------------------------------------------------------------
// 3. Secrets are real keys.

/// Runs a short-lived hookgate command to completion (bounded).
async fn run_hookgate(args: &[&str], config: &std::path::Path) -> std::process::Output {
    let mut cmd = hookgate();
    cmd.args(args)
        .arg("--config")
        .arg(config)
        .arg("--log-format")
        .arg("text");
    run_bounded(cmd, POLL_DEADLINE).await
}

#[tokio::test]
async fn an_empty_secret_is_a_config_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = GatewayConfig::new(dir.path(), "x");
    cfg.secrets = "      - secret: \"\"\n      - secret: \"\"\n".into();
    let path = dir.path().join("empty-secret.yaml");
    std::fs::write(&path, cfg.yaml()).expect("write");
    for command in ["check-config", "run"] {
        let out = run_hookgate(&[command], &path).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{command}: {stderr}");
        assert!(
            stderr.contains("routes[0].secrets[0].secret") && stderr.contains("botix"),
            "{command} names the route and the source: {stderr}"
        );
    }
    assert!(!cfg.store.exists(), "nothing was opened");
}

#[tokio::test]
async fn an_emptied_secret_file_is_refused_on_reload_and_a_short_one_is_warned_about() {
    require_broker!();
    let (dir, broker, mut cfg) = fixture().await;
    let file = dir.path().join("botix-secret");
    std::fs::write(&file, format!("{SECRET}\n")).expect("write");
    let short = dir.path().join("short-secret");
    std::fs::write(&short, "tiny\n").expect("write");
    cfg.secrets = format!(
        "      - secret_file: {}\n      - secret_file: {}\n",
        file.display(),
        short.display()
    );
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    assert!(
        gw.logged("secret shorter than 16 bytes", POLL_DEADLINE)
            .await
    );
    assert!(
        gw.logs()
            .iter()
            .any(|l| l.contains(&format!("secret_file {}", short.display()))),
        "the warning names the source"
    );

    std::fs::write(&file, "\n").expect("empty the file");
    gw.signal("HUP");
    assert!(
        gw.logged("secret reload refused", POLL_DEADLINE).await,
        "logs:\n{}",
        gw.logs().join("\n")
    );
    let line = gw
        .logs()
        .into_iter()
        .find(|l| l.contains("secret reload refused"))
        .expect("line");
    let line: serde_json::Value = serde_json::from_str(&line).expect("json log");
    assert_eq!(line["level"], "ERROR");
    assert!(
        metric(
            &client,
            &gw,
            "hookgate_secret_reload_failures_total",
            &[("route", "botix")]
        )
        .await
            >= 1.0
    );
    let (status, answer) = gw
        .deliver(&client, &event_body(&unique("evt")), "req_1")
        .await;
    assert_eq!(status, 200, "the previous secrets stay in force: {answer}");
    broker.delete().await;
}

// ---------------------------------------------------------------------------------------
// 4. Memory before authentication.

/// A body of `len` bytes that arrives in 1000-byte pieces and then never ends.
fn slow_endless_body(len: usize) -> Body {
    let pieces = futures_util::stream::iter(
        (0..len / 1000).map(|_| Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'a'; 1000])))),
    )
    .then(|frame| async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        frame
    })
    .chain(futures_util::stream::pending());
    BodyExt::boxed(StreamBody::new(pieces))
}

#[tokio::test]
async fn unverified_bodies_beyond_the_budget_wait_and_a_signed_delivery_gets_through() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    const BUDGET: f64 = 128.0 * 1024.0;
    cfg.extra = "limits:\n  max_body_bytes: 64KiB\n  max_unverified_body_bytes: 128KiB\n  h2_max_concurrent_streams: 4\n  body_read_timeout: 4s\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);

    // 4 connections × 4 streams, each a body just under the limit, sent slowly and never
    // finished: 1 MiB if nothing held them back.
    let mut streams = Vec::new();
    let mut conns = Vec::new();
    for _ in 0..4 {
        let (send, conn) = h2_connect(ATTACKER, gw.addr).await;
        conns.push(conn);
        for _ in 0..4 {
            let mut send = send.clone();
            let req = http::Request::post(format!("http://{}/webhooks/botix", gw.addr))
                .header("content-length", "65535")
                .header("x-botix-signature", sign("not-the-secret", b"x"))
                .body(slow_endless_body(60_000))
                .expect("request");
            streams.push(tokio::spawn(async move {
                send.ready().await.ok()?;
                send.send_request(req)
                    .await
                    .ok()
                    .map(|r| r.status().as_u16())
            }));
        }
    }
    assert!(
        eventually(POLL_DEADLINE, || async {
            metric(&client, &gw, "hookgate_body_budget_waits_total", &[]).await >= 1.0
        })
        .await,
        "no body read ever waited for the budget"
    );
    for _ in 0..5 {
        let held = metric(&client, &gw, "hookgate_unverified_body_bytes", &[]).await;
        assert!(held <= BUDGET, "{held} bytes held before verification");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The sender waits its turn behind bodies that arrived first, and gets through once
    // they time out.
    let (status, answer) = gw
        .deliver(&client, &event_body(&unique("evt")), "req_1")
        .await;
    assert_eq!(status, 200, "{answer}");
    for s in streams {
        let status = tokio::time::timeout(POLL_DEADLINE, s)
            .await
            .expect("every slow stream is answered")
            .expect("join");
        assert!(matches!(status, Some(408) | None), "{status:?}");
    }
    let m = scrape(&client, &gw).await;
    assert!(m.get("hookgate_refusals_total", &[("reason", "body_budget")]) >= 1.0);
    assert_eq!(
        m.get("hookgate_unverified_body_bytes", &[]),
        0.0,
        "all given back"
    );
    drop(conns);
    broker.delete().await;
}

// ---------------------------------------------------------------------------------------
// A neighbour on localhost.

#[tokio::test]
async fn admin_endpoints_refuse_changes_and_show_no_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = GatewayConfig::new(dir.path(), "unused");
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    for path in ["/readyz", "/spool", "/metrics", "/healthz"] {
        for method in [
            reqwest::Method::POST,
            reqwest::Method::PUT,
            reqwest::Method::DELETE,
        ] {
            let resp = client
                .request(method.clone(), gw.admin_url(path))
                .send()
                .await
                .expect("admin");
            assert_eq!(resp.status(), 405, "{method} {path}");
        }
        let (_, body) = gw.admin_get(&client, path).await;
        assert!(
            !body.contains(SECRET) && !body.contains(PREVIOUS_SECRET),
            "{path} shows a secret"
        );
    }
}
