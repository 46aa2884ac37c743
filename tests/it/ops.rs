//! Operations (SPEC §8, §9): metrics, graceful shutdown, certificate and secret rotation,
//! slow and hostile clients, connection and rate limits, and the CLI's config checks.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::require_broker;
use crate::util::*;

// ---------------------------------------------------------------------------------------
// Metrics.

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

// ---------------------------------------------------------------------------------------
// Graceful shutdown.

#[tokio::test]
async fn sigterm_finishes_a_request_whose_body_is_still_arriving() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    // Longer than every poll below, so a poll that runs out is reported as itself.
    cfg.extra = "shutdown_grace: 30s\n".into();
    let mut gw = Gateway::start(&cfg).await;
    let client = client(None);
    // Connected first, so the event is published rather than spooled for the next start.
    assert!(
        eventually(BROKER_TIMEOUT, || async {
            scrape(&client, &gw)
                .await
                .find("hookgate_broker_connected", &[])
                == Some(1.0)
        })
        .await,
        "broker never connected"
    );

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

// ---------------------------------------------------------------------------------------
// Certificate and secret rotation.

#[tokio::test]
async fn a_replaced_certificate_is_served_to_new_connections_without_a_restart() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::new().await;
    let old = TestCert::generate(dir.path());
    let new_dir = dir.path().join("new");
    std::fs::create_dir(&new_dir).expect("mkdir");
    let new = TestCert::generate(&new_dir);
    assert_ne!(old.cert_der, new.cert_der);
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    cfg.tls = Some((old.cert_path.clone(), old.key_path.clone()));
    let gw = Gateway::start(&cfg).await;

    assert_eq!(
        presented_cert(gw.addr, &[&old, &new]).await.expect("tls"),
        old.cert_der
    );
    // This client trusts only the old certificate and holds one HTTP/2 connection.
    let old_client = client(Some(&old));
    let resp = old_client
        .post(gw.url("/webhooks/botix"))
        .header("x-botix-signature", sign(SECRET, b"{}"))
        .body("{}")
        .send()
        .await
        .expect("request on the old certificate");
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    deliver_ok(&old_client, &gw, "before rotation").await;

    std::fs::write(
        &old.key_path,
        std::fs::read(&new.key_path).expect("new key"),
    )
    .expect("overwrite key");
    std::fs::write(&old.cert_path, &new.cert_pem).expect("overwrite cert");

    let deadline = tokio::time::Instant::now() + POLL_DEADLINE;
    loop {
        let got = presented_cert(gw.addr, &[&old, &new]).await;
        if got.as_ref().is_ok_and(|der| *der == new.cert_der) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "new connections never saw the new certificate; last handshake: {:?}",
            got.map(|der| if der == old.cert_der {
                "old cert"
            } else {
                "unknown cert"
            })
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The connection established before the rotation still works: a new connection from
    // this client would fail, since it does not trust the new certificate.
    deliver_ok(&old_client, &gw, "existing connection after rotation").await;
    let err = client(Some(&old))
        .get(gw.url("/"))
        .send()
        .await
        .expect_err("a fresh connection trusting only the old certificate must fail");
    assert!(err.is_connect(), "{err:?}");
    deliver_ok(&client(Some(&new)), &gw, "new connection after rotation").await;
    assert!(
        gw.logged("TLS certificate reloaded", BROKER_TIMEOUT).await,
        "the reload is logged"
    );
    broker.delete().await;
}

/// A gateway whose one route reads its secret from a file, with `extra` added to its config:
/// the temporary directory, the broker, the secret file's path and the gateway.
async fn gateway_with_secret_file(
    extra: &str,
) -> (tempfile::TempDir, Broker, std::path::PathBuf, Gateway) {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::new().await;
    let secret_path = dir.path().join("botix-secret");
    std::fs::write(&secret_path, format!("{SECRET}\n")).expect("secret file");
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    cfg.secrets = format!("      - secret_file: {}\n", secret_path.display());
    cfg.extra = extra.into();
    let gw = Gateway::start(&cfg).await;
    (dir, broker, secret_path, gw)
}

/// The status a fresh delivery signed with `secret` gets; an accepted event's id is added to
/// `accepted`, for the check that exactly those reached the broker.
async fn status_signed_with(
    gw: &Gateway,
    client: &reqwest::Client,
    secret: &str,
    accepted: &std::sync::Mutex<Vec<String>>,
) -> u16 {
    let id = unique("evt_rot");
    let body = event_body(&id);
    let sig = sign(secret, body.as_bytes());
    let status = gw
        .post(client, &body, &[("x-botix-signature", sig)])
        .await
        .0;
    if status == 200 {
        accepted.lock().expect("lock").push(id);
    }
    status
}

/// Asserts that exactly the `accepted` events reached the broker, in order.
async fn assert_only_accepted_published(
    gw: &Gateway,
    client: &reqwest::Client,
    broker: &Broker,
    secret: &str,
    accepted: &std::sync::Mutex<Vec<String>>,
) {
    let body = event_body("sentinel");
    let sig = sign(secret, body.as_bytes());
    assert_eq!(
        gw.post(client, &body, &[("x-botix-signature", sig)])
            .await
            .0,
        200
    );
    let expected = accepted.lock().expect("lock").clone();
    assert_eq!(ids(&broker.until("sentinel").await), expected);
}

#[tokio::test]
async fn a_rotated_secret_file_is_picked_up_by_polling() {
    require_broker!();
    let (_dir, broker, secret_path, gw) = gateway_with_secret_file("").await;
    let client = client(None);
    let accepted = std::sync::Mutex::new(Vec::new());
    const NEW: &str = "whsec_rotated_by_file_0b7d";
    assert_eq!(
        status_signed_with(&gw, &client, SECRET, &accepted).await,
        200
    );
    assert_eq!(
        status_signed_with(&gw, &client, NEW, &accepted).await,
        401,
        "not yet rotated"
    );

    std::fs::write(&secret_path, format!("{NEW}\n")).expect("rotate");
    assert!(
        eventually(POLL_DEADLINE, || async {
            status_signed_with(&gw, &client, NEW, &accepted).await == 200
        })
        .await,
        "the rewritten secret file was never picked up"
    );
    assert_eq!(
        status_signed_with(&gw, &client, SECRET, &accepted).await,
        401,
        "the replaced secret is gone"
    );
    assert!(
        !gw.logs()
            .iter()
            .any(|l| l.contains(SECRET) || l.contains(NEW)),
        "a secret reached the log"
    );
    assert_only_accepted_published(&gw, &client, &broker, NEW, &accepted).await;
    broker.delete().await;
}

#[tokio::test]
async fn sighup_re_reads_a_rotated_secret_file_at_once() {
    require_broker!();
    // Polling is an hour away, so only the signal can make the new secret count.
    let (_dir, broker, secret_path, gw) = gateway_with_secret_file("reload_poll: 1h\n").await;
    let client = client(None);
    let accepted = std::sync::Mutex::new(Vec::new());
    const NEWER: &str = "whsec_rotated_by_sighup_93ae";
    assert_eq!(
        status_signed_with(&gw, &client, SECRET, &accepted).await,
        200
    );

    std::fs::write(&secret_path, NEWER).expect("rotate");
    assert_eq!(
        status_signed_with(&gw, &client, NEWER, &accepted).await,
        401,
        "nothing re-reads the file before the signal"
    );
    gw.signal("HUP");
    assert!(
        eventually(POLL_DEADLINE, || async {
            status_signed_with(&gw, &client, NEWER, &accepted).await == 200
        })
        .await,
        "the secret was not re-read after SIGHUP"
    );
    assert_eq!(
        status_signed_with(&gw, &client, SECRET, &accepted).await,
        401
    );
    assert_eq!(healthz(&client, &gw).await, 200, "SIGHUP must not stop it");
    assert!(
        !gw.logs()
            .iter()
            .any(|l| l.contains(SECRET) || l.contains(NEWER)),
        "a secret reached the log"
    );
    assert_only_accepted_published(&gw, &client, &broker, NEWER, &accepted).await;
    broker.delete().await;
}

// ---------------------------------------------------------------------------------------
// Slow and hostile clients.

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

// ---------------------------------------------------------------------------------------
// Connection and rate limits.

#[tokio::test]
async fn connections_beyond_max_connections_are_refused() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.extra = "limits:\n  max_connections: 2\n  header_read_timeout: 60s\n".into();
    let gw = Gateway::start(&cfg).await;

    let request = b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n";
    // Two keep-alive connections, each proven served, then held idle.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(gw.addr).await.expect("connect");
        s.write_all(request).await.expect("write");
        let got = read_until(&mut s, b"not_found").await;
        assert!(got.starts_with(b"HTTP/1.1 404"));
        held.push(s);
    }
    let mut third = TcpStream::connect(gw.addr)
        .await
        .expect("the kernel completes the handshake");
    let _ = third.write_all(request).await;
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
    first.write_all(request).await.expect("write");
    read_until(&mut first, b"not_found").await;
    drop(first);
    let addr = gw.addr;
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
    let deliver = || async {
        gw.post(&client, &event_body(&unique("evt")), &unique("req"))
            .await
    };

    for what in ["first of the burst", "second of the burst"] {
        let (status, answer) = deliver().await;
        assert_eq!(status, 200, "{what}: {answer}");
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
    let (status, answer) = deliver().await;
    assert_eq!(status, 200, "a second later one token is back: {answer}");
    let (status, answer) = deliver().await;
    assert_eq!(status, 429, "and only one: {answer}");
    gw.stop().await;
    broker.delete().await;
}

// ---------------------------------------------------------------------------------------
// CLI config checks.

#[tokio::test]
async fn check_config_validates_without_printing_secrets() {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/hookgate.yaml");
    let shipped_text = std::fs::read_to_string(&shipped).expect("shipped config");
    assert!(
        shipped_text.contains("dev-secret-change-me"),
        "fixture changed"
    );
    let mut cmd = hookgate();
    cmd.arg("check-config").arg("--config").arg(&shipped);
    let out = run_bounded(cmd, POLL_DEADLINE).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stdout.contains("/webhooks/botix"),
        "prints the config: {stdout}"
    );
    assert!(
        !stdout.contains("dev-secret-change-me") && !stderr.contains("dev-secret-change-me"),
        "a secret was printed: {stdout}{stderr}"
    );
    assert!(
        !stdout.contains("guest:guest"),
        "the AMQP password was printed"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let typo = dir.path().join("typo.yaml");
    std::fs::write(
        &typo,
        GatewayConfig::new(dir.path(), "x").yaml() + "limits:\n  max_body_byts: 1KiB\n",
    )
    .expect("write");
    let mut cmd = hookgate();
    cmd.arg("check-config").arg("--config").arg(&typo);
    let out = run_bounded(cmd, POLL_DEADLINE).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("limits.max_body_byts"), "{stderr}");
}

#[tokio::test]
async fn run_with_a_missing_secret_env_exits_64_before_binding() {
    const VAR: &str = "HOOKGATE_OPS_TEST_SURELY_UNSET_SECRET";
    let dir = tempfile::tempdir().expect("tempdir");
    // Hold the ports the config names: a gateway that bound before loading its secrets
    // would fail with "cannot bind" and exit 1 instead.
    let held: Vec<_> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let mut cfg = GatewayConfig::new(dir.path(), "x");
    cfg.secrets = format!("      - secret_env: {VAR}\n");
    let mut yaml = cfg.yaml();
    for l in &held {
        let addr = l.local_addr().expect("addr");
        yaml = yaml.replacen("addr: 127.0.0.1:0", &format!("addr: {addr}"), 1);
        assert!(yaml.contains(&addr.to_string()));
    }
    let path = dir.path().join("missing-env.yaml");
    std::fs::write(&path, yaml).expect("write");
    let mut cmd = hookgate();
    cmd.arg("run")
        .arg("--config")
        .arg(&path)
        .arg("--log-format")
        .arg("text")
        .env_remove(VAR);
    let out = run_bounded(cmd, POLL_DEADLINE).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains(VAR), "names the variable: {stderr}");
    assert!(!stderr.contains("cannot bind"), "{stderr}");
    assert!(
        !dir.path().join("store").exists(),
        "nothing was opened before the config failed"
    );
    drop(held);
}
