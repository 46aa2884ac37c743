//! The sender profiles through the real binary and the real RabbitMQ: deliveries signed as
//! Standard Webhooks, Twilio and Telnyx senders sign them (tests/data/providers/).

use crate::require_broker;
use crate::util::*;

const STANDARD_WEBHOOKS_DELIVERY: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/providers/standard_webhooks_delivery.json"
));

/// A route of profile standard-webhooks whose one secret is `secret`. The delivery was
/// signed once, when the file was made, so the timestamp tolerance is wide enough to
/// still take it; the signature check itself is the one every delivery gets.
fn standard_webhooks_route(cfg: &mut GatewayConfig, secret: &str) {
    cfg.secrets = format!("      - secret: \"{secret}\"\n");
    cfg.route_extra = "    profile: standard-webhooks\n    timestamp_tolerance: 36500d\n".into();
}

#[tokio::test]
async fn a_delivery_signed_by_the_reference_library_with_a_24_byte_secret_is_accepted() {
    require_broker!();
    let file: serde_json::Value =
        serde_json::from_str(STANDARD_WEBHOOKS_DELIVERY).expect("delivery file");
    assert_eq!(
        file["key_bytes"], 24,
        "the secret is the senders' usual 24 bytes"
    );
    let secret = file["secret"].as_str().expect("secret");
    let body = file["body"].as_str().expect("body");
    let headers: Vec<(&str, String)> = ["webhook-id", "webhook-timestamp", "webhook-signature"]
        .into_iter()
        .map(|h| (h, file["headers"][h].as_str().expect("header").to_owned()))
        .collect();
    let event_id = serde_json::from_str::<serde_json::Value>(body).expect("body")["id"]
        .as_str()
        .expect("id")
        .to_owned();

    let (_dir, broker, mut cfg) = fixture().await;
    standard_webhooks_route(&mut cfg, secret);
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    let (status, answer) = gw.post(&client, body, &headers).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        serde_json::json!({"status": "accepted", "event_id": event_id})
    );
    let msg = broker.next(BROKER_TIMEOUT).await.expect("published");
    assert_eq!(msg.body, body.as_bytes());
    assert_eq!(
        msg.header("x-request-id").as_deref(),
        Some(headers[0].1.as_str())
    );

    // One byte of the body changed: the same headers no longer match.
    let tampered = body.replacen("4200", "4201", 1);
    let (status, answer) = gw.post(&client, &tampered, &headers).await;
    assert_eq!(status, 401, "{answer}");
}

const TWILIO_VECTORS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/providers/twilio.json"
));
const TELNYX_VECTORS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/providers/telnyx.json"
));

/// The URL a Twilio route's sender signs; hookgate itself is reached on 127.0.0.1.
const TWILIO_PUBLIC_URL: &str = "https://hooks.example.com/webhooks/twilio";
const TWILIO_TOKEN: &str = "9f86d081884c7d659a2feaa0c55ad015";
const FORM: &str = "application/x-www-form-urlencoded";

fn twilio_route(cfg: &mut GatewayConfig, public_url: &str, token: &str) {
    cfg.secrets = format!("      - secret: \"{token}\"\n");
    cfg.route_extra = format!("    profile: twilio\n    public_url: {public_url}\n");
}

/// A Twilio status callback for `sid` as Twilio posts it, signed for the public URL.
fn twilio_status(sid: &str, status: &str, token: &str) -> (String, Vec<(&'static str, String)>) {
    let body = format!(
        "SmsSid={sid}&SmsStatus={status}&MessageStatus={status}&To=%2B14155550100\
         &MessagingServiceSid=MG0123&MessageSid={sid}&AccountSid=AC0123&From=%2B14155550111\
         &ApiVersion=2010-04-01"
    );
    let signature = hookgate::providers::twilio_signature(
        TWILIO_TOKEN.as_bytes(),
        TWILIO_PUBLIC_URL,
        body.as_bytes(),
    );
    let headers = vec![
        ("x-twilio-signature", signature),
        ("content-type", format!("{FORM}; charset=utf-8")),
        ("i-twilio-idempotency-token", token.to_owned()),
    ];
    (body, headers)
}

#[tokio::test]
async fn twilio_published_example_arrives_byte_for_byte_with_its_content_type() {
    require_broker!();
    let v: serde_json::Value = serde_json::from_str(TWILIO_VECTORS).expect("vectors");
    let (base, query) = v["url"]
        .as_str()
        .expect("url")
        .split_once('?')
        .expect("query");
    let mut form = String::new();
    for pair in v["form"]["params"].as_array().expect("params") {
        if !form.is_empty() {
            form.push('&');
        }
        let (name, value) = (
            pair[0].as_str().expect("name"),
            pair[1].as_str().expect("v"),
        );
        form.push_str(&format!("{name}={}", value.replace('+', "%2B")));
    }
    let (_dir, broker, mut cfg) = fixture().await;
    twilio_route(&mut cfg, base, v["auth_token"].as_str().expect("token"));
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    let headers = [
        (
            "x-twilio-signature",
            v["form"]["signature"]
                .as_str()
                .expect("signature")
                .to_owned(),
        ),
        ("content-type", FORM.to_owned()),
        ("i-twilio-idempotency-token", unique("tok")),
    ];
    // The query is Twilio's; the path is where hookgate listens, not the public URL's.
    let path = format!("/webhooks/botix?{query}");
    let (status, answer) = gw.post_to(&client, &path, &form, &headers).await;
    assert_eq!(status, 200, "{answer}");
    let msg = broker.next(BROKER_TIMEOUT).await.expect("published");
    assert_eq!(msg.body, form.as_bytes(), "the raw form, byte for byte");
    assert_eq!(msg.content_type.as_deref(), Some(FORM));
    assert_eq!(msg.header("x-request-id"), Some(headers[2].1.clone()));

    // Without Twilio's query the signed URL differs: refused.
    let (status, answer) = gw
        .post_to(&client, "/webhooks/botix", &form, &headers)
        .await;
    assert_eq!(status, 401, "{answer}");
}

/// Posts a Twilio status callback; its outcome, the answer and the body.
async fn send(
    gw: &Gateway,
    client: &reqwest::Client,
    sid: &str,
    status: &str,
    token: String,
) -> (String, serde_json::Value, String) {
    let (body, headers) = twilio_status(sid, status, &token);
    let (code, answer) = gw.post(client, &body, &headers).await;
    assert_eq!(code, 200, "{status}: {answer}");
    (outcome(&answer), answer, body)
}

#[tokio::test]
async fn a_reordered_twilio_status_chain_goes_through_the_guard() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    twilio_route(&mut cfg, TWILIO_PUBLIC_URL, TWILIO_TOKEN);
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    let sid = format!("SM{}", uuid::Uuid::new_v4().simple());
    let (outcome, answer, queued) = send(&gw, &client, &sid, "queued", unique("tok")).await;
    assert_eq!(outcome, "accepted");
    assert_eq!(answer["event_id"], format!("{sid}:queued"));
    let delivered_token = unique("tok");
    let (outcome, _, delivered) =
        send(&gw, &client, &sid, "delivered", delivered_token.clone()).await;
    assert_eq!(outcome, "accepted");
    // Twilio's late `sent`, after `delivered`: a lower rank, dropped.
    let (outcome, _, _) = send(&gw, &client, &sid, "sent", unique("tok")).await;
    assert_eq!(outcome, "dropped:stale_status");
    // Twilio's retry of the `delivered` callback (same token), and the same status sent
    // again under another token: both duplicates.
    let (outcome, _, _) = send(&gw, &client, &sid, "delivered", delivered_token).await;
    assert_eq!(outcome, "duplicate");
    let (outcome, _, _) = send(&gw, &client, &sid, "delivered", unique("tok")).await;
    assert_eq!(outcome, "duplicate");
    // `read` ranks above `delivered`.
    let (outcome, _, read) = send(&gw, &client, &sid, "read", unique("tok")).await;
    assert_eq!(outcome, "accepted");

    // An inbound message is the sentinel: everything before it has been published.
    let sentinel = format!("SM{}", uuid::Uuid::new_v4().simple());
    let inbound = format!("MessageSid={sentinel}&Body=hello&From=%2B14155550111&To=%2B14155550100");
    let signature = hookgate::providers::twilio_signature(
        TWILIO_TOKEN.as_bytes(),
        TWILIO_PUBLIC_URL,
        inbound.as_bytes(),
    );
    let (code, answer) = gw
        .post(&client, &inbound, &[("x-twilio-signature", signature)])
        .await;
    assert_eq!(code, 200, "{answer}");
    let published = broker.until(&sentinel).await;
    let bodies: Vec<&[u8]> = published.iter().map(|m| m.body.as_slice()).collect();
    assert_eq!(
        bodies,
        [queued.as_bytes(), delivered.as_bytes(), read.as_bytes()]
    );
    for m in &published {
        assert_eq!(m.routing_key, "message.status");
        assert_eq!(
            m.content_type.as_deref(),
            Some("application/x-www-form-urlencoded; charset=utf-8")
        );
    }
    let metrics = scrape(&client, &gw).await;
    assert_eq!(metrics.dropped_total("stale_status"), 1.0);
}

/// A Telnyx delivery from the vector file, with fresh ids and time, signed with the
/// vector's key now (the vector's own signatures are checked in the unit tests).
fn telnyx_delivery(
    v: &serde_json::Value,
    index: usize,
    payload_id: &str,
    status: Option<&str>,
) -> (String, String, Vec<(&'static str, String)>) {
    let mut body: serde_json::Value =
        serde_json::from_str(v["deliveries"][index]["body"].as_str().expect("body")).expect("json");
    let event_id = uuid::Uuid::new_v4().to_string();
    body["data"]["id"] = event_id.clone().into();
    body["data"]["occurred_at"] = rfc3339_from_now(0).into();
    body["data"]["payload"]["id"] = payload_id.into();
    if let Some(status) = status {
        body["data"]["payload"]["to"][0]["status"] = status.into();
    }
    let body = body.to_string();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let (signature, public) = hookgate::providers::telnyx_signature(
        v["seed"].as_str().expect("seed").as_bytes(),
        now,
        body.as_bytes(),
    )
    .expect("signs");
    assert_eq!(public, v["public_key"].as_str().expect("public key"));
    let headers = vec![
        ("telnyx-signature-ed25519", signature),
        ("telnyx-timestamp", now.to_string()),
        ("content-type", "application/json".to_owned()),
    ];
    (event_id, body, headers)
}

#[tokio::test]
async fn telnyx_deliveries_verify_publish_and_are_guarded() {
    require_broker!();
    let v: serde_json::Value = serde_json::from_str(TELNYX_VECTORS).expect("vectors");
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.secrets = format!(
        "      - secret: \"{}\"\n",
        v["public_key"].as_str().expect("public key")
    );
    cfg.route_extra = "    profile: telnyx\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    let message = uuid::Uuid::new_v4().to_string();
    let (id, body, headers) = telnyx_delivery(&v, 0, &message, Some("delivered"));
    let (status, answer) = gw.post(&client, &body, &headers).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        serde_json::json!({"status": "accepted", "event_id": id})
    );
    let msg = broker.next(BROKER_TIMEOUT).await.expect("published");
    assert_eq!(msg.body, body.as_bytes());
    assert_eq!(msg.routing_key, "message.finalized");
    assert_eq!(msg.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(msg.content_type.as_deref(), Some("application/json"));

    // The same delivery again is a duplicate; a late `sent` for the message is stale.
    let (_, answer) = gw.post(&client, &body, &headers).await;
    assert_eq!(outcome(&answer), "duplicate");
    let (_, late, late_headers) = telnyx_delivery(&v, 0, &message, Some("sent"));
    let (_, answer) = gw.post(&client, &late, &late_headers).await;
    assert_eq!(outcome(&answer), "dropped:stale_status");

    // Inbound STOP, then STOP again under a new event id: the second is a repeat.
    let inbound = uuid::Uuid::new_v4().to_string();
    let (_, stop, stop_headers) = telnyx_delivery(&v, 1, &inbound, None);
    let (_, answer) = gw.post(&client, &stop, &stop_headers).await;
    assert_eq!(outcome(&answer), "accepted");
    let (_, again, again_headers) = telnyx_delivery(&v, 1, &inbound, None);
    let (_, answer) = gw.post(&client, &again, &again_headers).await;
    assert_eq!(outcome(&answer), "dropped:repeated_stop");

    // A body changed after signing, or signed by another key: refused.
    let (_, answer) = gw
        .post(
            &client,
            &body.replace("delivered", "delivery_failed"),
            &headers,
        )
        .await;
    assert_eq!(answer, serde_json::json!({"error": "invalid_signature"}));
    let mut other = headers.clone();
    other[0].1 = hookgate::providers::telnyx_signature(
        b"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=",
        other[1].1.parse().expect("ts"),
        body.as_bytes(),
    )
    .expect("signs")
    .0;
    let (status, _) = gw.post(&client, &body, &other).await;
    assert_eq!(status, 401);
}

/// Runs `hookgate sign --route botix` against a gateway's own config, with the secret in
/// `SIGN_SECRET`, and returns the header lines it printed.
fn signed_headers(gw: &Gateway, secret: &str, body: &str) -> Vec<(String, String)> {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args([
            "sign",
            "--route",
            "botix",
            "--secret-env",
            "SIGN_SECRET",
            "--config",
        ])
        .arg(&gw.config_path)
        .env("SIGN_SECRET", secret)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn hookgate sign");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write body");
    let out = child.wait_with_output().expect("hookgate sign");
    assert!(
        out.status.success(),
        "sign failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| {
            let (name, value) = l.split_once(": ").expect("a header line");
            (name.to_owned(), value.to_owned())
        })
        .collect()
}

#[tokio::test]
async fn hookgate_sign_makes_a_delivery_every_profile_accepts() {
    require_broker!();
    use base64::Engine;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let seed: [u8; 32] = rand::random();
    let seed = b64(&seed);
    let (_, telnyx_public) =
        hookgate::providers::telnyx_signature(seed.as_bytes(), 0, b"").expect("key");
    let whsec = format!("whsec_{}", b64(&rand::random::<[u8; 24]>()));
    let json = |id: &str| format!(r#"{{"id":"{id}","event":"contact.created"}}"#);
    let telnyx_body = |id: &str| {
        format!(r#"{{"data":{{"id":"{id}","event_type":"message.sent","payload":{{"id":"m"}}}}}}"#)
    };
    // (route keys, the secret the route holds, the secret `sign` gets, a body).
    let cases: Vec<(String, String, String, String)> = vec![
        (
            "    profile: standard-webhooks\n".into(),
            whsec.clone(),
            whsec,
            json("evt_sw"),
        ),
        (
            format!("    profile: twilio\n    public_url: {TWILIO_PUBLIC_URL}\n"),
            TWILIO_TOKEN.into(),
            TWILIO_TOKEN.into(),
            "MessageSid=SMsign&MessageStatus=sent&Body=hi%21".into(),
        ),
        (
            "    profile: telnyx\n".into(),
            telnyx_public,
            seed,
            telnyx_body("evt_tx"),
        ),
        (
            "    profile: custom\n    signature: {header: x-sig, prefix: \"v=\", encoding: base64}\n"
                .into(),
            "custom-secret".into(),
            "custom-secret".into(),
            json("evt_custom"),
        ),
    ];
    let client = client(None);
    for (route, route_secret, sign_secret, body) in cases {
        let (_dir, broker, mut cfg) = fixture().await;
        cfg.secrets = format!("      - secret: \"{route_secret}\"\n");
        cfg.route_extra = route.clone();
        let gw = Gateway::start(&cfg).await;
        wait_broker_connected(&client, &gw).await;
        let headers = signed_headers(&gw, &sign_secret, &body);
        let headers: Vec<(&str, String)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let (status, answer) = gw.post(&client, &body, &headers).await;
        assert_eq!(status, 200, "{route}: {answer}");
        assert_eq!(outcome(&answer), "accepted", "{route}");
        let msg = broker.next(BROKER_TIMEOUT).await.expect("published");
        assert_eq!(msg.body, body.as_bytes(), "{route}");
        // Signed for another body: refused.
        let (status, _) = gw.post(&client, &format!("{body} "), &headers).await;
        assert_eq!(status, 401, "{route}");
    }
}

/// `hookgate sign` with `args`, the secret in `SIGN_SECRET` (if any) and `{}` on stdin;
/// stdout goes to `stdout`.
async fn sign_exit(
    args: &[&str],
    secret: Option<&str>,
    stdout: std::process::Stdio,
) -> (i32, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"));
    cmd.arg("sign")
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(std::process::Stdio::piped());
    if let Some(secret) = secret {
        cmd.env("SIGN_SECRET", secret);
    }
    let out = run_bounded(cmd, POLL_DEADLINE).await;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), stderr)
}

#[tokio::test]
async fn hookgate_sign_exits_64_for_usage_and_1_for_io_as_run_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = GatewayConfig::new(dir.path(), "x");
    let config = dir.path().join("hookgate.yaml");
    std::fs::write(&config, cfg.yaml()).expect("write config");
    let config = config.to_str().expect("utf-8 path");
    let body = dir.path().join("body.json");
    std::fs::write(&body, "{}").expect("write body");
    let body = body.to_str().expect("utf-8 path");
    let missing = dir.path().join("no-such-body.json");
    let missing = missing.to_str().expect("utf-8 path");
    let piped = std::process::Stdio::piped;
    let cases: [(&str, &[&str], Option<&str>, i32); 6] = [
        (
            "signed",
            &["--secret-env", "SIGN_SECRET", body],
            Some("s"),
            0,
        ),
        (
            "no secret",
            &["--secret-env", "SIGN_SECRET", body],
            None,
            64,
        ),
        (
            "no such route",
            &[
                "--secret-env",
                "SIGN_SECRET",
                "--config",
                config,
                "--route",
                "nope",
                body,
            ],
            Some("s"),
            64,
        ),
        (
            "a Telnyx key that is not one",
            &["--secret-env", "SIGN_SECRET", "--profile", "telnyx", body],
            Some("not a key"),
            64,
        ),
        ("an unknown flag", &["--nope"], Some("s"), 64),
        (
            "an unreadable body",
            &["--secret-env", "SIGN_SECRET", missing],
            Some("s"),
            1,
        ),
    ];
    for (what, args, secret, code) in cases {
        let (got, stderr) = sign_exit(args, secret, piped()).await;
        assert_eq!(got, code, "{what}: {stderr}");
    }
    // A stdout that cannot be written (a full disk) is an I/O failure, not a panic.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let (got, stderr) = sign_exit(
        &["--secret-env", "SIGN_SECRET", body],
        Some("s"),
        full.into(),
    )
    .await;
    assert_eq!(got, 1, "a full stdout: {stderr}");
    assert!(stderr.contains("cannot write to stdout"), "{stderr}");
}
