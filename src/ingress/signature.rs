//! Signature schemes and their constant-time check; pure functions over headers and bytes.

use std::borrow::Cow;

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use crate::config::{Encoding, Profile, Route};
use crate::ingress::secrets::Secret;

type HmacSha256 = Hmac<Sha256>;
type HmacSha1 = Hmac<Sha1>;

/// Header of the botix profile.
pub const BOTIX_SIGNATURE: &str = "x-botix-signature";
/// Headers of the Standard Webhooks profile.
pub const WEBHOOK_ID: &str = "webhook-id";
/// Seconds since the epoch, signed together with the id and body.
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// Space-separated `v1,<base64>` signatures.
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
/// Standard Webhooks secrets are this prefix and the base64 of the key.
pub const WEBHOOK_SECRET_PREFIX: &str = "whsec_";
/// Header of the Twilio profile: base64 HMAC-SHA1 of the URL and the sorted form fields.
pub const TWILIO_SIGNATURE: &str = "x-twilio-signature";
/// Query parameter of a Twilio JSON delivery: the hex SHA-256 of the body.
pub const TWILIO_BODY_SHA256: &str = "bodySHA256";
/// Header of the Telnyx profile: base64 ed25519 signature of `timestamp|body`.
pub const TELNYX_SIGNATURE: &str = "telnyx-signature-ed25519";
/// Seconds since the epoch, signed together with the body.
pub const TELNYX_TIMESTAMP: &str = "telnyx-timestamp";

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
    /// Twilio: HMAC-SHA1 over the public URL (with the request's query) and the form
    /// fields sorted by name, or over the URL alone with a `bodySHA256` query parameter.
    Twilio {
        /// The forms of the route's `public_url` a sender may have signed.
        urls: Vec<String>,
    },
    /// Telnyx: ed25519 over `timestamp|body`; the route's secrets are public keys.
    Telnyx { tolerance_secs: i64 },
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
            Profile::Twilio => {
                let url = route
                    .public_url
                    .as_deref()
                    .ok_or_else(|| "profile twilio needs public_url".to_owned())?;
                Ok(Scheme::Twilio {
                    urls: crate::config::profiles::public_url_forms(url),
                })
            }
            Profile::Telnyx => Ok(Scheme::Telnyx {
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

    /// Whether every secret is usable by this scheme: a Telnyx public key must be the
    /// base64 of a valid ed25519 key, a `whsec_` secret must be base64. Checked at start,
    /// so a pasted key with a typo is a config error rather than a 401 for every delivery.
    pub fn check_secrets(&self, secrets: &[Secret]) -> Result<(), String> {
        for (i, secret) in secrets.iter().enumerate() {
            let problem = match self {
                Scheme::Telnyx { .. } => telnyx_key(secret.expose())
                    .is_none()
                    .then_some("is not the base64 of a 32-byte ed25519 public key"),
                Scheme::StandardWebhooks { .. } => secret
                    .expose()
                    .starts_with(WEBHOOK_SECRET_PREFIX.as_bytes())
                    .then(|| standard_webhooks_key(secret.expose()))
                    .is_some_and(|keys| keys.is_empty())
                    .then_some("starts with whsec_ but the rest is not base64 of a key"),
                _ => None,
            };
            if let Some(problem) = problem {
                return Err(format!("secrets[{i}] {problem}"));
            }
        }
        Ok(())
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
        self.verify_request(headers, None, body, secrets, now_secs)
    }

    /// [`Scheme::verify`] for a request whose URL query (`a=1&b=2`, without `?`) is part
    /// of what the sender signed (Twilio).
    pub fn verify_request(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
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
                signed_time(ts_text, now_secs, *tolerance_secs)?;
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
                    for key in standard_webhooks_key(secret.expose()) {
                        let expected = hmac_parts(
                            &key,
                            &[id.as_bytes(), b".", ts_text.as_bytes(), b".", body],
                        );
                        for c in &candidates {
                            ok |= expected.as_slice().ct_eq(c.as_slice());
                        }
                    }
                }
                matched(ok)
            }
            Scheme::Twilio { urls } => verify_twilio(urls, headers, query, body, secrets),
            Scheme::Telnyx { tolerance_secs } => {
                let signature = header_str(headers, TELNYX_SIGNATURE)?;
                let signature = base64::engine::general_purpose::STANDARD
                    .decode(signature.trim())
                    .ok()
                    .and_then(|b| ed25519_dalek::Signature::from_slice(&b).ok())
                    .ok_or(SignatureError::Malformed)?;
                let ts_text = header_str(headers, TELNYX_TIMESTAMP)?.trim();
                signed_time(ts_text, now_secs, *tolerance_secs)?;
                let mut message = Vec::with_capacity(ts_text.len() + 1 + body.len());
                message.extend_from_slice(ts_text.as_bytes());
                message.push(b'|');
                message.extend_from_slice(body);
                // Public keys and signatures are not secret: stopping at the first match
                // tells an observer nothing it could not compute itself.
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
        }
    }
}

fn matched(ok: Choice) -> Result<(), SignatureError> {
    if bool::from(ok) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// Twilio: the signature covers the URL the sender requested (the route's `public_url`
/// with the request's query) followed by every form field, sorted by name (then value),
/// each name followed by its value. A JSON delivery instead carries the body's SHA-256 in
/// the `bodySHA256` query parameter, and the URL alone is signed.
fn verify_twilio(
    urls: &[String],
    headers: &HeaderMap,
    query: Option<&str>,
    body: &[u8],
    secrets: &[Secret],
) -> Result<(), SignatureError> {
    let given = base64::engine::general_purpose::STANDARD
        .decode(header_str(headers, TWILIO_SIGNATURE)?.trim())
        .map_err(|_| SignatureError::Malformed)?;
    // A SHA-1 MAC is 20 bytes.
    if given.len() != 20 {
        return Err(SignatureError::Malformed);
    }
    let query = query.filter(|q| !q.is_empty());
    let body_sha256 = query.and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(name, _)| name == TWILIO_BODY_SHA256)
            .map(|(_, value)| value.to_ascii_lowercase())
    });
    let fields = match &body_sha256 {
        Some(expected) => {
            let actual = hex::encode(Sha256::digest(body));
            if !bool::from(actual.as_bytes().ct_eq(expected.as_bytes())) {
                return Err(SignatureError::Mismatch);
            }
            Vec::new()
        }
        None => twilio_form_text(body),
    };
    let mut ok = Choice::from(0);
    for url in urls {
        let parts: [&[u8]; 4] = match query {
            Some(q) => [url.as_bytes(), b"?", q.as_bytes(), &fields],
            None => [url.as_bytes(), b"", b"", &fields],
        };
        for secret in secrets {
            ok |= hmac_sha1_parts(secret.expose(), &parts)
                .as_slice()
                .ct_eq(&given);
        }
    }
    matched(ok)
}

/// The form fields of a body as Twilio signs them: sorted by name and then value, each
/// name followed by its value, decoded from the form encoding.
fn twilio_form_text(body: &[u8]) -> Vec<u8> {
    let mut pairs: Vec<(Cow<'_, str>, Cow<'_, str>)> = form_urlencoded::parse(body).collect();
    pairs.sort_unstable();
    let mut text = Vec::with_capacity(body.len());
    for (name, value) in &pairs {
        text.extend_from_slice(name.as_bytes());
        text.extend_from_slice(value.as_bytes());
    }
    text
}

/// HMAC-SHA1 of the concatenated parts (Twilio).
fn hmac_sha1_parts(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let Ok(mut mac) = <HmacSha1 as KeyInit>::new_from_slice(key) else {
        return Vec::new();
    };
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().as_slice().to_vec()
}

/// The `X-Twilio-Signature` value for a delivery to `url` (with its query, as the sender
/// requests it) with `body`: form fields, or a JSON body when `url` has `bodySHA256`.
pub fn twilio_signature(auth_token: &[u8], url: &str, body: &[u8]) -> String {
    let has_body_hash = url.split_once('?').is_some_and(|(_, q)| {
        form_urlencoded::parse(q.as_bytes()).any(|(name, _)| name == TWILIO_BODY_SHA256)
    });
    let fields = if has_body_hash {
        Vec::new()
    } else {
        twilio_form_text(body)
    };
    base64::engine::general_purpose::STANDARD
        .encode(hmac_sha1_parts(auth_token, &[url.as_bytes(), &fields]))
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

/// Checks that the signed Unix time `text` is within `tolerance_secs` of `now_secs`, either
/// way. The difference is taken in u64 (`abs_diff`): a subtraction of two i64 overflows
/// for a time such as i64::MIN, which is the sender's to choose.
fn signed_time(text: &str, now_secs: i64, tolerance_secs: i64) -> Result<(), SignatureError> {
    let ts: i64 = text.parse().map_err(|_| SignatureError::Malformed)?;
    if now_secs.abs_diff(ts) > tolerance_secs.unsigned_abs() {
        return Err(SignatureError::Stale);
    }
    Ok(())
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

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, SignatureError> {
    let value = headers.get(name).ok_or(SignatureError::Missing)?;
    value.to_str().map_err(|_| SignatureError::Malformed)
}

fn decode(text: &str, encoding: Encoding) -> Result<Vec<u8>, SignatureError> {
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
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/deliveries.json");
        let text = std::fs::read_to_string(path).expect("test vectors in tests/data");
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
        let scheme = Scheme::StandardWebhooks {
            tolerance_secs: v.tolerance_secs,
        };
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

    fn provider_vectors(name: &str) -> serde_json::Value {
        let path = format!("{}/tests/data/providers/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("provider vectors");
        serde_json::from_str(&text).expect("vectors parse")
    }

    fn text(v: &serde_json::Value) -> &str {
        v.as_str().expect("text")
    }

    /// A form body of the vector's parameters, in the order given (Twilio sorts them).
    fn form_body(params: &serde_json::Value) -> String {
        let mut form = form_urlencoded::Serializer::new(String::new());
        for pair in params.as_array().expect("params") {
            form.append_pair(text(&pair[0]), text(&pair[1]));
        }
        form.finish()
    }

    fn twilio_scheme(public_url: &str) -> Scheme {
        Scheme::Twilio {
            urls: crate::config::profiles::public_url_forms(public_url),
        }
    }

    #[test]
    fn twilio_published_examples_verify() {
        let v = provider_vectors("twilio.json");
        let token = [Secret::new(text(&v["auth_token"]).as_bytes())];
        let (base, query) = text(&v["url"]).split_once('?').expect("query");
        let scheme = twilio_scheme(base);
        let check = |body: &str, query: &str, signature: &str| {
            scheme.verify_request(
                &headers(TWILIO_SIGNATURE, signature),
                Some(query),
                body.as_bytes(),
                &token,
                0,
            )
        };
        for case in ["form", "repeated_params"] {
            let body = form_body(&v[case]["params"]);
            let signature = text(&v[case]["signature"]);
            assert_eq!(
                twilio_signature(b"12345", text(&v["url"]), body.as_bytes()),
                signature,
                "{case}"
            );
            assert_eq!(check(&body, query, signature), Ok(()), "{case}");
            // Another parameter value, another query, another token: no match.
            let changed = body.replacen("1234", "1235", 1);
            assert_eq!(
                check(&changed, query, signature),
                Err(SignatureError::Mismatch)
            );
            assert_eq!(
                check(&body, "foo=1", signature),
                Err(SignatureError::Mismatch)
            );
            assert_eq!(
                scheme.verify_request(
                    &headers(TWILIO_SIGNATURE, signature),
                    Some(query),
                    body.as_bytes(),
                    &[Secret::new(b"54321")],
                    0
                ),
                Err(SignatureError::Mismatch)
            );
        }
        // Signed over the URL with :443 written: accepted for the URL without it.
        let body = form_body(&v["form"]["params"]);
        assert_eq!(
            check(&body, query, text(&v["port_443"]["signature"])),
            Ok(())
        );
        // A JSON body: the query's bodySHA256 is the body's hash, the URL alone is signed.
        let json = &v["json"];
        let (_, json_query) = text(&json["url"]).split_once('?').expect("query");
        let signature = text(&json["signature"]);
        let body = text(&json["body"]);
        assert_eq!(
            hex::encode(Sha256::digest(body)),
            text(&json["body_sha256"])
        );
        assert_eq!(
            twilio_signature(b"12345", text(&json["url"]), body.as_bytes()),
            signature
        );
        assert_eq!(check(body, json_query, signature), Ok(()));
        assert_eq!(
            check(&body.replace("true", "false"), json_query, signature),
            Err(SignatureError::Mismatch),
            "a body that does not match its hash"
        );
    }

    #[test]
    fn twilio_missing_and_malformed_signatures() {
        let scheme = twilio_scheme("https://h.example/t");
        let token = [Secret::new(b"t")];
        assert_eq!(
            scheme.verify_request(&HeaderMap::new(), None, b"a=1", &token, 0),
            Err(SignatureError::Missing)
        );
        for bad in ["", "not base64!", "AAAA", &"A".repeat(44)] {
            assert_eq!(
                scheme.verify_request(&headers(TWILIO_SIGNATURE, bad), None, b"a=1", &token, 0),
                Err(SignatureError::Malformed),
                "{bad:?}"
            );
        }
        // The public URL is what counts, not where the request arrived.
        let body = b"MessageSid=SM1&MessageStatus=sent";
        let sig = twilio_signature(b"t", "https://h.example/t", body);
        assert_eq!(
            scheme.verify_request(&headers(TWILIO_SIGNATURE, &sig), None, body, &token, 0),
            Ok(())
        );
        let other = twilio_signature(b"t", "http://10.0.0.5:8080/t", body);
        assert_eq!(
            scheme.verify_request(&headers(TWILIO_SIGNATURE, &other), None, body, &token, 0),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn telnyx_vectors_of_an_independent_ed25519_implementation() {
        let v = provider_vectors("telnyx.json");
        let key = [Secret::new(text(&v["public_key"]).as_bytes())];
        let scheme = Scheme::Telnyx {
            tolerance_secs: 300,
        };
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
        let scheme = Scheme::Telnyx {
            tolerance_secs: 300,
        };
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
    fn standard_webhooks_secrets_in_every_form_senders_use() {
        let scheme = Scheme::StandardWebhooks {
            tolerance_secs: 300,
        };
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

    #[test]
    fn extreme_telnyx_timestamps_are_stale_not_an_overflow() {
        let scheme = Scheme::Telnyx {
            tolerance_secs: 300,
        };
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
    fn botix_header_is_the_prefixed_hex_hmac_the_botix_scheme_verifies() {
        let body = b"The quick brown fox jumps over the lazy dog";
        let header = botix_header(b"key", body);
        assert_eq!(
            header,
            "sha256=f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
        );
        let h = headers(BOTIX_SIGNATURE, &header);
        assert_eq!(botix().verify(&h, body, &[Secret::new(b"key")], 0), Ok(()));
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
