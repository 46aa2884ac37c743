//! Certificate and secret rotation without a restart (contract §8): by polling the files and
//! on SIGHUP.

use std::time::Duration;

use crate::require_broker;
use crate::util::*;

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
