//! Telnyx: an ed25519 signature of `timestamp|body`, checked with the route's secrets as
//! public keys; no id of the delivery apart from the event's own; events read at
//! `/data/...`, with guard rules for its message statuses and inbound keywords.

use base64::Engine;
use serde_json::{json, Value};

use super::mac::{header_str, SignedWindow};
use super::scheme::{Delivery, Scheme, Secret, SignatureError, Verify};
use super::sender::{ranks, IdKind, RouteKeys, Sender, SignRequest, Signed};

/// Header of the Telnyx profile: base64 ed25519 signature of `timestamp|body`.
pub const TELNYX_SIGNATURE: &str = "telnyx-signature-ed25519";
/// Seconds since the epoch, signed together with the body.
pub const TELNYX_TIMESTAMP: &str = "telnyx-timestamp";

/// Telnyx's per-recipient message statuses (`data.payload.to[0].status`), in order.
pub const TELNYX_RANKS: [(&str, u32); 8] = [
    ("queued", 0),
    ("sending", 1),
    ("sent", 2),
    ("delivered", 3),
    ("delivery_unconfirmed", 3),
    ("delivery_failed", 3),
    ("sending_failed", 3),
    ("expired", 3),
];

/// The Telnyx sender.
pub struct Telnyx;

impl Sender for Telnyx {
    fn scheme(&self, keys: &RouteKeys<'_>) -> Result<Scheme, String> {
        Ok(Scheme::new(TelnyxScheme {
            tolerance_secs: keys.tolerance_secs(),
        }))
    }

    /// The signed headers, and the public key a route must hold as a note.
    fn sign(&self, request: &SignRequest<'_>) -> Result<Signed, String> {
        let ts = request.timestamp;
        let (signature, public) = telnyx_signature(request.secret, ts, request.body)
            .ok_or("the key is not the base64 of a 32-byte ed25519 private key (seed)")?;
        Ok(Signed {
            headers: format!("telnyx-timestamp: {ts}\ntelnyx-signature-ed25519: {signature}"),
            note: Some(format!("public key (the route's secret): {public}")),
        })
    }

    /// Telnyx sends no id of the delivery apart from the event's own.
    fn request_id_header(&self) -> Option<&'static str> {
        None
    }

    fn fields(&self) -> Result<Value, &'static str> {
        Ok(json!({
            "event_id": "/data/id",
            "event_type": "/data/event_type",
            "timestamp": "/data/occurred_at",
        }))
    }

    fn guard(&self) -> Option<Value> {
        Some(json!({
            "status": {
                "events": ["message.sent", "message.finalized"],
                "message_id": "/data/payload/id",
                "status": "/data/payload/to/0/status",
                "ranks": ranks(&TELNYX_RANKS),
            },
            "keywords": {
                "events": ["message.received"],
                "text": "/data/payload/text",
                "contact": "/data/payload/from/phone_number",
                "channel": "/data/payload/to/0/phone_number",
            },
        }))
    }

    fn check_id(&self, kind: IdKind, _id: &str) -> Result<(), &'static str> {
        match kind {
            IdKind::Request => Err("telnyx sends no request id: ask with `inspect event`"),
            IdKind::Event | IdKind::Message => Ok(()),
        }
    }
}

/// The check of a Telnyx route: signed times within `tolerance_secs` of now.
#[derive(Debug, Clone)]
pub struct TelnyxScheme {
    /// The accepted age of `telnyx-timestamp`, either way.
    pub tolerance_secs: i64,
}

impl Verify for TelnyxScheme {
    /// Checks the signature against every configured public key.
    fn verify(&self, delivery: &Delivery<'_>, secrets: &[Secret]) -> Result<(), SignatureError> {
        let signature = header_str(delivery.headers, TELNYX_SIGNATURE)?;
        let signature = base64::engine::general_purpose::STANDARD
            .decode(signature.trim())
            .ok()
            .and_then(|b| ed25519_dalek::Signature::from_slice(&b).ok())
            .ok_or(SignatureError::Malformed)?;
        let ts_text = header_str(delivery.headers, TELNYX_TIMESTAMP)?.trim();
        SignedWindow::new(delivery.now_secs, self.tolerance_secs).check(ts_text)?;
        let body = delivery.body;
        let mut message = Vec::with_capacity(ts_text.len() + 1 + body.len());
        message.extend_from_slice(ts_text.as_bytes());
        message.push(b'|');
        message.extend_from_slice(body);
        // Public keys and signatures are not secret: stopping at the first match tells an
        // observer nothing it could not compute itself.
        let any = secrets.iter().any(|secret| {
            telnyx_key(secret.expose())
                .is_some_and(|key| key.verify_strict(&message, &signature).is_ok())
        });
        if any {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }

    fn unusable(&self, secret: &[u8]) -> Option<&'static str> {
        telnyx_key(secret)
            .is_none()
            .then_some("is not the base64 of a 32-byte ed25519 public key")
    }
}

/// A Telnyx-style signature (base64) of `timestamp|body` with an ed25519 signing key given
/// as the base64 of its 32-byte seed (or of the 64-byte seed and public key), and the
/// base64 public key a route must be configured with. `None` if the key is not that.
pub fn telnyx_signature(
    signing_key: &[u8],
    timestamp: i64,
    body: &[u8],
) -> Option<(String, String)> {
    use ed25519_dalek::Signer;
    let engine = base64::engine::general_purpose::STANDARD;
    let bytes = engine
        .decode(std::str::from_utf8(signing_key).ok()?.trim())
        .ok()?;
    let seed: [u8; 32] = bytes.get(..32)?.try_into().ok()?;
    if bytes.len() != 32 && bytes.len() != 64 {
        return None;
    }
    let key = ed25519_dalek::SigningKey::from_bytes(&seed);
    let mut message = timestamp.to_string().into_bytes();
    message.push(b'|');
    message.extend_from_slice(body);
    Some((
        engine.encode(key.sign(&message).to_bytes()),
        engine.encode(key.verifying_key().to_bytes()),
    ))
}

/// A Telnyx public key from its base64 text.
fn telnyx_key(secret: &[u8]) -> Option<ed25519_dalek::VerifyingKey> {
    let text = std::str::from_utf8(secret).ok()?.trim();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    let bytes: [u8; 32] = bytes.as_slice().try_into().ok()?;
    ed25519_dalek::VerifyingKey::from_bytes(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use http::{HeaderMap, HeaderValue};

    use super::*;
    use crate::providers::vectors::{headers, provider_vectors, text};

    #[test]
    fn telnyx_vectors_of_an_independent_ed25519_implementation() {
        let v = provider_vectors("telnyx.json");
        let key = [Secret::new(text(&v["public_key"]).as_bytes())];
        let scheme = Scheme::new(TelnyxScheme {
            tolerance_secs: 300,
        });
        assert_eq!(scheme.check_secrets(&key), Ok(()));
        for d in v["deliveries"].as_array().expect("deliveries") {
            let name = text(&d["name"]);
            let ts_text = text(&d["telnyx-timestamp"]);
            let ts: i64 = ts_text.parse().expect("timestamp");
            let body = text(&d["body"]).as_bytes();
            let signature = text(&d["telnyx-signature-ed25519"]);
            let mut h = headers(TELNYX_SIGNATURE, signature);
            h.insert(
                TELNYX_TIMESTAMP,
                HeaderValue::from_str(ts_text).expect("ts"),
            );
            assert_eq!(scheme.verify(&h, body, &key, ts + 300), Ok(()), "{name}");
            assert_eq!(scheme.verify(&h, body, &key, ts - 300), Ok(()), "{name}");
            assert_eq!(
                scheme.verify(&h, body, &key, ts + 301),
                Err(SignatureError::Stale),
                "{name}"
            );
            let mut tampered = body.to_vec();
            tampered[10] ^= 1;
            assert_eq!(
                scheme.verify(&h, &tampered, &key, ts),
                Err(SignatureError::Mismatch),
                "{name}"
            );
            // The timestamp is signed too.
            h.insert(TELNYX_TIMESTAMP, HeaderValue::from(ts + 1));
            assert_eq!(
                scheme.verify(&h, body, &key, ts),
                Err(SignatureError::Mismatch),
                "{name}"
            );
            // Signing with the vector's seed gives the same signature and public key.
            let (ours, public) =
                telnyx_signature(text(&v["seed"]).as_bytes(), ts, body).expect("seed");
            assert_eq!(
                (ours.as_str(), public.as_str()),
                (signature, text(&v["public_key"]))
            );
        }
    }

    #[test]
    fn telnyx_keys_and_headers_that_cannot_be_used() {
        let scheme = Scheme::new(TelnyxScheme {
            tolerance_secs: 300,
        });
        for bad in ["", "not base64", "AAAA", "whsec_abc"] {
            assert!(
                scheme
                    .check_secrets(&[Secret::new(bad.as_bytes())])
                    .is_err(),
                "{bad}"
            );
        }
        let v = provider_vectors("telnyx.json");
        let key = [Secret::new(text(&v["public_key"]).as_bytes())];
        assert_eq!(
            scheme.verify(&HeaderMap::new(), b"{}", &key, 0),
            Err(SignatureError::Missing)
        );
        let mut h = headers(TELNYX_SIGNATURE, "AAAA");
        h.insert(TELNYX_TIMESTAMP, HeaderValue::from_static("0"));
        assert_eq!(
            scheme.verify(&h, b"{}", &key, 0),
            Err(SignatureError::Malformed)
        );
        let (sig, _) = telnyx_signature(text(&v["seed"]).as_bytes(), 0, b"{}").expect("sig");
        let mut h = headers(TELNYX_SIGNATURE, &sig);
        h.insert(TELNYX_TIMESTAMP, HeaderValue::from_static("soon"));
        assert_eq!(
            scheme.verify(&h, b"{}", &key, 0),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn extreme_telnyx_timestamps_are_stale_not_an_overflow() {
        let scheme = Scheme::new(TelnyxScheme {
            tolerance_secs: 300,
        });
        let v = provider_vectors("telnyx.json");
        let key = [Secret::new(text(&v["public_key"]).as_bytes())];
        for (ts, now) in [
            (i64::MIN, 1_800_000_000),
            (i64::MAX, -1_800_000_000),
            (i64::MIN, i64::MAX),
            (i64::MAX, i64::MIN),
        ] {
            // Signed by the key for that very timestamp: only the tolerance can refuse it.
            let (sig, _) = telnyx_signature(text(&v["seed"]).as_bytes(), ts, b"{}").expect("signs");
            let mut h = headers(TELNYX_SIGNATURE, &sig);
            h.insert(
                TELNYX_TIMESTAMP,
                HeaderValue::from_str(&ts.to_string()).expect("value"),
            );
            assert_eq!(
                scheme.verify(&h, b"{}", &key, now),
                Err(SignatureError::Stale),
                "timestamp {ts} at {now}"
            );
            assert_eq!(scheme.verify(&h, b"{}", &key, ts), Ok(()), "at {ts} itself");
        }
    }

    #[test]
    fn a_telnyx_signing_key_is_the_seed_or_the_seed_and_public_key() {
        let engine = base64::engine::general_purpose::STANDARD;
        let v = provider_vectors("telnyx.json");
        let seed = engine.decode(text(&v["seed"])).expect("base64 seed");
        assert_eq!(seed.len(), 32);
        let from_seed = telnyx_signature(text(&v["seed"]).as_bytes(), 7, b"{}").expect("seed");
        let public = engine.decode(&from_seed.1).expect("public key");
        let pair = engine.encode([seed.as_slice(), public.as_slice()].concat());
        assert_eq!(
            telnyx_signature(pair.as_bytes(), 7, b"{}"),
            Some(from_seed),
            "64 bytes: the seed and the public key"
        );
        for len in [31, 33, 48, 63, 65] {
            let key = engine.encode(vec![7u8; len]);
            assert_eq!(
                telnyx_signature(key.as_bytes(), 7, b"{}"),
                None,
                "{len} bytes"
            );
        }
    }
}
