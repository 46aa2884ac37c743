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
