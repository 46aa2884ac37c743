//! Signature schemes and their constant-time check; pure functions over headers and bytes.

use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

use crate::config::{Encoding, Profile, Route};
use crate::secrets::Secret;

type HmacSha256 = Hmac<Sha256>;

/// Header of the botix profile.
pub const BOTIX_SIGNATURE: &str = "x-botix-signature";
/// Headers of the Standard Webhooks profile.
pub const WEBHOOK_ID: &str = "webhook-id";
/// Seconds since the epoch, signed together with the id and body.
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// Space-separated `v1,<base64>` signatures.
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// Why a signature was refused. Only logged at debug level; the sender always sees one
/// answer (`invalid_signature`), so it cannot learn which part was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("signature header missing")]
    Missing,
    #[error("signature header malformed")]
    Malformed,
    #[error("signature does not match any active secret")]
    Mismatch,
    #[error("signature timestamp outside tolerance")]
    Stale,
}

/// How a route's signature is carried; built once from the route config.
#[derive(Debug, Clone)]
pub enum Scheme {
    /// HMAC-SHA256 of the raw body in `header`, after an optional prefix.
    BodyHmac {
        header: http::HeaderName,
        prefix: Option<String>,
        encoding: Encoding,
    },
    /// Standard Webhooks (`v1,<base64>` over `id.timestamp.body`).
    StandardWebhooks { tolerance_secs: i64 },
}

impl Scheme {
    /// The scheme a route's profile describes.
    pub fn for_route(route: &Route) -> Result<Self, String> {
        match route.profile {
            Profile::Botix => Ok(Scheme::BodyHmac {
                header: http::HeaderName::from_static(BOTIX_SIGNATURE),
                prefix: Some("sha256=".into()),
                encoding: Encoding::Hex,
            }),
            Profile::StandardWebhooks => Ok(Scheme::StandardWebhooks {
                tolerance_secs: route.timestamp_tolerance.as_secs() as i64,
            }),
            Profile::Custom => {
                let sig = route
                    .signature
                    .as_ref()
                    .ok_or_else(|| "profile custom needs signature".to_owned())?;
                let header = http::HeaderName::from_bytes(sig.header.as_bytes())
                    .map_err(|_| format!("invalid header name {:?}", sig.header))?;
                Ok(Scheme::BodyHmac {
                    header,
                    prefix: sig.prefix.clone(),
                    encoding: sig.encoding,
                })
            }
        }
    }

    /// Checks the request against every secret. `now_secs` is only used by schemes that
    /// sign a timestamp.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        secrets: &[Secret],
        now_secs: i64,
    ) -> Result<(), SignatureError> {
        match self {
            Scheme::BodyHmac {
                header,
                prefix,
                encoding,
            } => {
                let value = header_str(headers, header.as_str())?;
                // The prefix is optional on the wire: botix senders send either form.
                let encoded = match prefix {
                    Some(p) => value.strip_prefix(p.as_str()).unwrap_or(value),
                    None => value,
                };
                let mac = decode(encoded.trim(), *encoding)?;
                match_any(secrets, &mac, |key| hmac_parts(key, &[body]))
            }
            Scheme::StandardWebhooks { tolerance_secs } => {
                let id = header_str(headers, WEBHOOK_ID)?;
                let ts_text = header_str(headers, WEBHOOK_TIMESTAMP)?;
                let ts: i64 = ts_text.parse().map_err(|_| SignatureError::Malformed)?;
                // abs_diff in u64: a subtraction of two i64 overflows for a timestamp such
                // as i64::MIN, which is the sender's to choose.
                if now_secs.abs_diff(ts) > tolerance_secs.unsigned_abs() {
                    return Err(SignatureError::Stale);
                }
                let candidates: Vec<Vec<u8>> = header_str(headers, WEBHOOK_SIGNATURE)?
                    .split_whitespace()
                    .filter_map(|s| s.strip_prefix("v1,"))
                    .filter_map(|b| decode(b, Encoding::Base64).ok())
                    .collect();
                if candidates.is_empty() {
                    return Err(SignatureError::Malformed);
                }
                let mut ok = Choice::from(0);
                for secret in secrets {
                    let key = standard_webhooks_key(secret.expose());
                    let expected =
                        hmac_parts(&key, &[id.as_bytes(), b".", ts_text.as_bytes(), b".", body]);
                    for c in &candidates {
                        ok |= expected.as_slice().ct_eq(c.as_slice());
                    }
                }
                if bool::from(ok) {
                    Ok(())
                } else {
                    Err(SignatureError::Mismatch)
                }
            }
        }
    }
}

/// HMAC-SHA256 of the concatenated parts, as bytes.
pub fn hmac_parts(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    // HMAC accepts keys of any length, so this cannot fail; an empty MAC would never match.
    let Ok(mut mac) = <HmacSha256 as KeyInit>::new_from_slice(key) else {
        return Vec::new();
    };
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().as_slice().to_vec()
}

/// The botix header value for a body: `sha256=<lowercase hex>`.
pub fn botix_header(secret: &[u8], body: &[u8]) -> String {
    format!("sha256={}", hex::encode(hmac_parts(secret, &[body])))
}

/// Compares `given` with the MAC under every secret without stopping at the first match,
/// so the time taken does not tell which secret (if any) matched.
fn match_any(
    secrets: &[Secret],
    given: &[u8],
    mac: impl Fn(&[u8]) -> Vec<u8>,
) -> Result<(), SignatureError> {
    let mut ok = Choice::from(0);
    for secret in secrets {
        ok |= mac(secret.expose()).as_slice().ct_eq(given);
    }
    if bool::from(ok) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

fn standard_webhooks_key(secret: &[u8]) -> Vec<u8> {
    // Standard Webhooks secrets are `whsec_<base64>`; the key is the decoded part.
    std::str::from_utf8(secret)
        .ok()
        .and_then(|s| s.strip_prefix("whsec_"))
        .and_then(|b| decode(b, Encoding::Base64).ok())
        .unwrap_or_else(|| secret.to_vec())
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, SignatureError> {
    let value = headers.get(name).ok_or(SignatureError::Missing)?;
    value.to_str().map_err(|_| SignatureError::Malformed)
}

fn decode(text: &str, encoding: Encoding) -> Result<Vec<u8>, SignatureError> {
    use base64::Engine;
    let bytes = match encoding {
        Encoding::Hex => hex::decode(text).map_err(|_| SignatureError::Malformed)?,
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|_| SignatureError::Malformed)?,
    };
    // A SHA-256 MAC is 32 bytes; anything else cannot match and is malformed.
    if bytes.len() != 32 {
        return Err(SignatureError::Malformed);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use http::HeaderValue;

    #[derive(serde::Deserialize)]
    struct Vectors {
        secrets: Vec<String>,
        deliveries: Vec<Vector>,
    }

    #[derive(serde::Deserialize)]
    struct Vector {
        name: String,
        secret: String,
        body_base64: String,
        body_utf8: String,
        signature_hex: String,
        header: String,
    }

    fn vectors() -> Vectors {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/testdata/deliveries.json"
        );
        let text = std::fs::read_to_string(path).expect("shared test vectors");
        serde_json::from_str(&text).expect("vectors parse")
    }

    fn botix() -> Scheme {
        Scheme::BodyHmac {
            header: http::HeaderName::from_static(BOTIX_SIGNATURE),
            prefix: Some("sha256=".into()),
            encoding: Encoding::Hex,
        }
    }

    fn headers(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
        h
    }

    #[test]
    fn every_shared_vector_has_the_expected_mac_and_verifies() {
        let v = vectors();
        let secrets: Vec<Secret> = v
            .secrets
            .iter()
            .map(|s| Secret::new(s.as_bytes()))
            .collect();
        for d in &v.deliveries {
            let body = base64::engine::general_purpose::STANDARD
                .decode(&d.body_base64)
                .expect("base64");
            let h = headers(BOTIX_SIGNATURE, &d.header);
            if d.name == "reserialised_body_must_fail" {
                // The header signs a compact body; the body sent was re-serialised.
                assert_ne!(
                    hex::encode(hmac_parts(d.secret.as_bytes(), &[&body])),
                    d.signature_hex
                );
                assert_eq!(
                    botix().verify(&h, &body, &secrets, 0),
                    Err(SignatureError::Mismatch),
                    "{}",
                    d.name
                );
                continue;
            }
            assert_eq!(body, d.body_utf8.as_bytes(), "{}", d.name);
            assert_eq!(
                hex::encode(hmac_parts(d.secret.as_bytes(), &[&body])),
                d.signature_hex,
                "{}",
                d.name
            );
            assert_eq!(botix().verify(&h, &body, &secrets, 0), Ok(()), "{}", d.name);
            // With only the one other secret configured, the delivery must fail.
            let others: Vec<Secret> = v
                .secrets
                .iter()
                .filter(|s| **s != d.secret)
                .map(|s| Secret::new(s.as_bytes()))
                .collect();
            assert_eq!(
                botix().verify(&h, &body, &others, 0),
                Err(SignatureError::Mismatch),
                "{}",
                d.name
            );
        }
    }

    #[test]
    fn bare_hex_uppercase_and_prefixed_forms_verify() {
        let secret = Secret::new(b"k");
        let body = br#"{"id":"1"}"#;
        let mac = hex::encode(hmac_parts(b"k", &[body]));
        for value in [mac.clone(), format!("sha256={mac}"), mac.to_uppercase()] {
            let h = headers(BOTIX_SIGNATURE, &value);
            assert_eq!(
                botix().verify(&h, body, std::slice::from_ref(&secret), 0),
                Ok(()),
                "{value}"
            );
        }
    }

    #[test]
    fn missing_malformed_and_wrong_signatures_fail() {
        let secret = [Secret::new(b"k")];
        let body = b"{}";
        assert_eq!(
            botix().verify(&HeaderMap::new(), body, &secret, 0),
            Err(SignatureError::Missing)
        );
        for bad in ["sha256=zz", "sha256=", "abc", &"a".repeat(66)] {
            let h = headers(BOTIX_SIGNATURE, bad);
            assert_eq!(
                botix().verify(&h, body, &secret, 0),
                Err(SignatureError::Malformed),
                "{bad}"
            );
        }
        let wrong = hex::encode(hmac_parts(b"other", &[body]));
        let h = headers(BOTIX_SIGNATURE, &wrong);
        assert_eq!(
            botix().verify(&h, body, &secret, 0),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn custom_base64_scheme_with_its_own_header() {
        let scheme = Scheme::BodyHmac {
            header: http::HeaderName::from_static("x-sig"),
            prefix: None,
            encoding: Encoding::Base64,
        };
        let body = b"payload";
        let mac = base64::engine::general_purpose::STANDARD.encode(hmac_parts(b"s3", &[body]));
        let h = headers("x-sig", &mac);
        assert_eq!(scheme.verify(&h, body, &[Secret::new(b"s3")], 0), Ok(()));
        assert_eq!(
            scheme.verify(&h, b"payload2", &[Secret::new(b"s3")], 0),
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
        let scheme = Scheme::StandardWebhooks {
            tolerance_secs: 300,
        };
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
        let scheme = Scheme::StandardWebhooks {
            tolerance_secs: 300,
        };
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
