//! botix: `X-Botix-Signature: sha256=<hex>` (or bare hex) over the raw body, the delivery's
//! id in `X-Botix-Request-Id` (a UUID or `req_<ulid>`), and the list API reconciliation
//! reads. Its events are read with the route's `fields`; it brings no guard of its own.

use http::HeaderName;

use super::body_hmac::BodyHmac;
use super::mac::{hmac_parts, Encoding};
use super::scheme::Scheme;
use super::sender::{IdKind, RouteKeys, Sender, SignRequest, Signed};

/// Header of the botix profile: `sha256=<hex>` of the body.
pub const BOTIX_SIGNATURE: &str = "x-botix-signature";
/// The id of one delivery attempt, the same on its retries.
pub const BOTIX_REQUEST_ID: &str = "x-botix-request-id";

/// The botix sender.
pub struct Botix;

impl Sender for Botix {
    fn scheme(&self, _keys: &RouteKeys<'_>) -> Result<Scheme, String> {
        Ok(Scheme::new(BodyHmac {
            header: HeaderName::from_static(BOTIX_SIGNATURE),
            prefix: Some("sha256=".into()),
            encoding: Encoding::Hex,
        }))
    }

    /// The signature value alone, as `X-Botix-Signature` carries it.
    fn sign(&self, request: &SignRequest<'_>) -> Result<Signed, String> {
        Ok(Signed::headers(botix_header(request.secret, request.body)))
    }

    fn request_id_header(&self) -> Option<&'static str> {
        Some(BOTIX_REQUEST_ID)
    }

    fn check_id(&self, kind: IdKind, id: &str) -> Result<(), &'static str> {
        match kind {
            IdKind::Request if !is_botix_request_id(id) => {
                Err("not a botix request id: X-Botix-Request-Id is a UUID or req_<ulid>")
            }
            IdKind::Event | IdKind::Message if is_botix_request_id(id) => Err(
                "this is a request id (a UUID or req_<ulid>, as X-Request-Id shows): ask with `inspect request`",
            ),
            _ => Ok(()),
        }
    }

    fn lists_messages(&self) -> bool {
        true
    }
}

/// The botix header value for a body: `sha256=<lowercase hex>`.
pub fn botix_header(secret: &[u8], body: &[u8]) -> String {
    format!("sha256={}", hex::encode(hmac_parts(secret, &[body])))
}

/// A botix request id: a UUID, or `req_` and a ULID (26 Crockford base32 characters).
fn is_botix_request_id(id: &str) -> bool {
    const CROCKFORD: &str = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    if uuid::Uuid::parse_str(id).is_ok() && id.len() == 36 {
        return true;
    }
    id.strip_prefix("req_").is_some_and(|ulid| {
        ulid.len() == 26
            && ulid
                .chars()
                .all(|c| CROCKFORD.contains(c.to_ascii_uppercase()))
    })
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;
    use crate::providers::mac::hmac_parts;
    use crate::providers::scheme::{Secret, SignatureError};
    use crate::providers::vectors::headers;
    use http::HeaderMap;

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
        Botix.scheme(&RouteKeys::default()).expect("scheme")
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
    fn botix_request_ids_are_uuids_or_req_and_a_ulid() {
        let ulid = "req_01JD8Z6Q3R7WXYZABCDEFGHJKM";
        for id in ["3f2504e0-4f89-41d3-9a0c-0305e82c3301", ulid] {
            assert_eq!(Botix.check_id(IdKind::Request, id), Ok(()), "{id}");
            assert!(Botix.check_id(IdKind::Event, id).is_err(), "{id}");
        }
        for id in [
            "evt_1",
            "req_01JD8Z6Q3R7W",
            "req_01JD8Z6Q3R7WXYZABCDEFGHJKI",
        ] {
            assert!(Botix.check_id(IdKind::Request, id).is_err(), "{id}");
            assert_eq!(Botix.check_id(IdKind::Message, id), Ok(()), "{id}");
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
}
