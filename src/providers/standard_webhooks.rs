//! Standard Webhooks: `v1,<base64>` HMAC-SHA256 signatures over `id.timestamp.body`, with
//! `whsec_` secrets; the delivery's id is `webhook-id`, its events are read with the route's
//! `fields`.

use base64::Engine;
use subtle::{Choice, ConstantTimeEq};

use super::mac::{decode, header_str, hmac_parts, matched, Encoding, SignedWindow};
use super::scheme::{Delivery, Scheme, Secret, SignatureError, Verify};
use super::sender::{RouteKeys, Sender, SignRequest, Signed};

/// Headers of the Standard Webhooks profile.
pub const WEBHOOK_ID: &str = "webhook-id";
/// Seconds since the epoch, signed together with the id and body.
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// Space-separated `v1,<base64>` signatures.
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
/// Standard Webhooks secrets are this prefix and the base64 of the key.
pub const WEBHOOK_SECRET_PREFIX: &str = "whsec_";

/// The Standard Webhooks sender.
pub struct StandardWebhooks;

impl Sender for StandardWebhooks {
    fn scheme(&self, keys: &RouteKeys<'_>) -> Result<Scheme, String> {
        Ok(Scheme::new(StandardWebhooksScheme {
            tolerance_secs: keys.tolerance_secs(),
        }))
    }

    fn sign(&self, request: &SignRequest<'_>) -> Result<Signed, String> {
        let id = request
            .id
            .map_or_else(|| format!("msg_{}", request.fresh), str::to_owned);
        let ts = request.timestamp;
        let signature = standard_webhooks_signature(request.secret, &id, ts, request.body)
            .ok_or("the secret is not whsec_ followed by base64")?;
        Ok(Signed::headers(format!(
            "webhook-id: {id}\nwebhook-timestamp: {ts}\nwebhook-signature: {signature}"
        )))
    }

    fn request_id_header(&self) -> Option<&'static str> {
        Some(WEBHOOK_ID)
    }
}

/// The check of a Standard Webhooks route: signed times within `tolerance_secs` of now.
#[derive(Debug, Clone)]
pub struct StandardWebhooksScheme {
    /// The accepted age of `webhook-timestamp`, either way.
    pub tolerance_secs: i64,
}

impl Verify for StandardWebhooksScheme {
    /// Checks every `v1` signature of the request against every key of every secret,
    /// without stopping at a match.
    fn verify(&self, delivery: &Delivery<'_>, secrets: &[Secret]) -> Result<(), SignatureError> {
        let headers = delivery.headers;
        let id = header_str(headers, WEBHOOK_ID)?;
        let ts_text = header_str(headers, WEBHOOK_TIMESTAMP)?;
        SignedWindow::new(delivery.now_secs, self.tolerance_secs).check(ts_text)?;
        let candidates: Vec<[u8; 32]> = header_str(headers, WEBHOOK_SIGNATURE)?
            .split_whitespace()
            .filter_map(|s| s.strip_prefix("v1,"))
            .filter_map(|b| decode(b, Encoding::Base64).ok())
            .collect();
        if candidates.is_empty() {
            return Err(SignatureError::Malformed);
        }
        let signed: [&[u8]; 5] = [id.as_bytes(), b".", ts_text.as_bytes(), b".", delivery.body];
        let mut ok = Choice::from(0);
        for secret in secrets {
            for key in standard_webhooks_key(secret.expose()) {
                let expected = hmac_parts(&key, &signed);
                for c in &candidates {
                    ok |= expected.as_slice().ct_eq(c.as_slice());
                }
            }
        }
        matched(ok)
    }

    fn unusable(&self, secret: &[u8]) -> Option<&'static str> {
        secret
            .starts_with(WEBHOOK_SECRET_PREFIX.as_bytes())
            .then(|| standard_webhooks_key(secret))
            .is_some_and(|keys| keys.is_empty())
            .then_some("starts with whsec_ but the rest is not base64 of a key")
    }
}

/// The `webhook-signature` value (`v1,<base64>`) for a Standard Webhooks delivery.
/// `secret` is a `whsec_` secret (or its base64 alone); `None` if it is not base64.
pub fn standard_webhooks_signature(
    secret: &[u8],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Option<String> {
    let key = standard_webhooks_key(secret).into_iter().next()?;
    let ts = timestamp.to_string();
    let mac = hmac_parts(&key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
    Some(format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac)
    ))
}

/// The keys a configured Standard Webhooks secret may stand for. A `whsec_` secret is the
/// base64 of the key, of any length (senders make 24 or 32 random bytes); a secret that
/// does not parse as such has no key. The reference libraries also take the base64 without
/// the prefix, so a secret without it is tried both decoded and as its raw bytes.
fn standard_webhooks_key(secret: &[u8]) -> Vec<Vec<u8>> {
    let text = std::str::from_utf8(secret).ok();
    if let Some(b64) = text.and_then(|s| s.strip_prefix(WEBHOOK_SECRET_PREFIX)) {
        return secret_base64(b64).into_iter().collect();
    }
    let mut keys: Vec<Vec<u8>> = text.and_then(secret_base64).into_iter().collect();
    keys.push(secret.to_vec());
    keys
}

/// A base64 key, with or without padding; empty is no key.
fn secret_base64(text: &str) -> Option<Vec<u8>> {
    let text = text.trim().trim_end_matches('=');
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(text)
        .ok()
        .filter(|key| !key.is_empty())
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use http::{HeaderMap, HeaderValue};

    use super::*;

    /// The vector of the Standard Webhooks specification's own repository
    /// (tests/data/providers/standard_webhooks.json names the files).
    #[derive(serde::Deserialize)]
    struct SpecVector {
        secret: String,
        secret_without_prefix: String,
        msg_id: String,
        timestamp: String,
        payload: String,
        signature: String,
        other_signatures: Vec<String>,
        wrong_signature: String,
        tolerance_secs: i64,
    }

    fn spec_vector() -> SpecVector {
        let text = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/providers/standard_webhooks.json"
        ));
        serde_json::from_str(text).expect("vector parses")
    }

    fn webhook_headers(id: &str, ts: &str, signature: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(WEBHOOK_ID, HeaderValue::from_str(id).expect("id"));
        h.insert(WEBHOOK_TIMESTAMP, HeaderValue::from_str(ts).expect("ts"));
        h.insert(
            WEBHOOK_SIGNATURE,
            HeaderValue::from_str(signature).expect("signature"),
        );
        h
    }

    #[test]
    fn standard_webhooks_specification_vector_with_its_24_byte_secret() {
        let v = spec_vector();
        let scheme = Scheme::new(StandardWebhooksScheme {
            tolerance_secs: v.tolerance_secs,
        });
        let ts: i64 = v.timestamp.parse().expect("timestamp");
        let body = v.payload.as_bytes();
        let verify = |signature: &str, secret: &str, now: i64| {
            scheme.verify(
                &webhook_headers(&v.msg_id, &v.timestamp, signature),
                body,
                &[Secret::new(secret.as_bytes())],
                now,
            )
        };
        assert_eq!(verify(&v.signature, &v.secret, ts), Ok(()));
        // The reference libraries also take the base64 key without its prefix.
        assert_eq!(verify(&v.signature, &v.secret_without_prefix, ts), Ok(()));
        // Several signatures, one of them valid, in any position.
        let mut several = v.other_signatures.clone();
        several.insert(1, v.signature.clone());
        assert_eq!(verify(&several.join(" "), &v.secret, ts), Ok(()));
        assert_eq!(
            verify(&v.other_signatures.join(" "), &v.secret, ts),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(&v.wrong_signature, &v.secret, ts),
            Err(SignatureError::Mismatch)
        );
        // The tolerance window, both ways, inclusive at its edge.
        let tol = v.tolerance_secs;
        assert_eq!(verify(&v.signature, &v.secret, ts + tol), Ok(()));
        assert_eq!(verify(&v.signature, &v.secret, ts - tol), Ok(()));
        assert_eq!(
            verify(&v.signature, &v.secret, ts + tol + 1),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verify(&v.signature, &v.secret, ts - tol - 1),
            Err(SignatureError::Stale)
        );
    }

    #[test]
    fn standard_webhooks_secrets_in_every_form_senders_use() {
        let scheme = Scheme::new(StandardWebhooksScheme {
            tolerance_secs: 300,
        });
        let engine = base64::engine::general_purpose::STANDARD;
        for len in [16, 24, 32, 64] {
            let key: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(37)).collect();
            let b64 = engine.encode(&key);
            let sig = standard_webhooks_signature(format!("whsec_{b64}").as_bytes(), "m", 5, b"{}")
                .expect("signs");
            for secret in [
                format!("whsec_{b64}"),
                format!("whsec_{}", b64.trim_end_matches('=')),
                b64.clone(),
            ] {
                let secrets = [Secret::new(secret.as_bytes())];
                assert_eq!(scheme.check_secrets(&secrets), Ok(()), "{secret}");
                let h = webhook_headers("m", "5", &sig);
                assert_eq!(
                    scheme.verify(&h, b"{}", &secrets, 5),
                    Ok(()),
                    "{len} {secret}"
                );
            }
        }
        // A raw secret without the prefix is still used as it is.
        let raw = [Secret::new(b"plain secret")];
        let mac = hmac_parts(b"plain secret", &[b"m.5.{}"]);
        let h = webhook_headers("m", "5", &format!("v1,{}", engine.encode(mac)));
        assert_eq!(scheme.verify(&h, b"{}", &raw, 5), Ok(()));
        let broken = [Secret::new(b"whsec_not base64!")];
        assert!(scheme.check_secrets(&broken).is_err());
        assert_eq!(
            scheme.verify(&h, b"{}", &broken, 5),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn standard_webhooks_signature_and_tolerance() {
        let key = b"0123456789abcdef0123456789abcdef";
        let secret = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(key)
        );
        let body = br#"{"id":"e"}"#;
        let mac = hmac_parts(key, &[b"msg_1", b".", b"1000", b".", body]);
        let mut h = HeaderMap::new();
        h.insert(WEBHOOK_ID, HeaderValue::from_static("msg_1"));
        h.insert(WEBHOOK_TIMESTAMP, HeaderValue::from_static("1000"));
        let sig = format!(
            "v1,AAAA v1,{}",
            base64::engine::general_purpose::STANDARD.encode(&mac)
        );
        h.insert(
            WEBHOOK_SIGNATURE,
            HeaderValue::from_str(&sig).expect("value"),
        );
        let scheme = Scheme::new(StandardWebhooksScheme {
            tolerance_secs: 300,
        });
        let secrets = [Secret::new(secret.as_bytes())];
        assert_eq!(scheme.verify(&h, body, &secrets, 1100), Ok(()));
        assert_eq!(
            scheme.verify(&h, body, &secrets, 2000),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            scheme.verify(&h, b"{}", &secrets, 1100),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn extreme_standard_webhooks_timestamps_are_stale_not_an_overflow() {
        let scheme = Scheme::new(StandardWebhooksScheme {
            tolerance_secs: 300,
        });
        let secrets = [Secret::new(b"whsec_AAAA")];
        for (ts, now) in [
            (i64::MIN, 1_800_000_000),
            (i64::MAX, -1_800_000_000),
            (i64::MIN, i64::MAX),
        ] {
            let mut h = HeaderMap::new();
            h.insert(WEBHOOK_ID, HeaderValue::from_static("msg_1"));
            h.insert(
                WEBHOOK_TIMESTAMP,
                HeaderValue::from_str(&ts.to_string()).expect("value"),
            );
            h.insert(WEBHOOK_SIGNATURE, HeaderValue::from_static("v1,AAAA"));
            assert_eq!(
                scheme.verify(&h, b"{}", &secrets, now),
                Err(SignatureError::Stale),
                "timestamp {ts} at {now}"
            );
        }
    }
}
