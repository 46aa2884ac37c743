//! The signature vectors of `tests/data/deliveries.json` sent through the real binary, byte
//! for byte with the header as the sender wrote it: an oracle made outside hookgate's own
//! signer.

use base64::Engine as _;

use crate::require_broker;
use crate::util::*;

const DELIVERIES: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/deliveries.json"
));

#[tokio::test]
async fn every_signature_vector_gets_its_answer_from_the_binary_and_arrives_byte_for_byte() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    // The vectors carry fixed timestamps: a window of a century keeps them fresh.
    cfg.extra = "dedup:\n  ttl: 36500d\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    let file: serde_json::Value = serde_json::from_str(DELIVERIES).expect("vectors");
    let vectors = file["deliveries"].as_array().expect("deliveries");
    assert!(vectors.len() >= 5, "the file holds the vectors");

    let mut expected = Vec::new();
    for v in vectors {
        let name = v["name"].as_str().expect("name");
        let body = base64::engine::general_purpose::STANDARD
            .decode(v["body_base64"].as_str().expect("body"))
            .expect("base64 body");
        let resp = client
            .post(gw.url("/webhooks/botix"))
            .header("x-botix-signature", v["header"].as_str().expect("header"))
            .header("x-botix-request-id", format!("req_{name}"))
            .body(body.clone())
            .send()
            .await
            .expect("send");
        let status = resp.status().as_u16();
        if name.ends_with("_must_fail") {
            assert_eq!(status, 401, "{name}");
        } else {
            let answer: serde_json::Value = resp.json().await.expect("json");
            assert_eq!(
                (status, outcome(&answer)),
                (200, "accepted".into()),
                "{name}"
            );
            expected.push(body);
        }
    }
    let got: Vec<Vec<u8>> = published_before_sentinel(&client, &gw, &broker)
        .await
        .into_iter()
        .map(|m| m.body)
        .collect();
    assert_eq!(
        got, expected,
        "the accepted bodies, byte for byte, in order"
    );
    broker.delete().await;
}
