//! An HMAC-SHA256 of the raw body in one header, after an optional prefix: the botix
//! profile, and the custom profile's scheme.

use http::{HeaderMap, HeaderName};

use super::{decode, header_str, hmac_parts, match_any, Secret, SignatureError};
use crate::config::Encoding;

/// Header of the botix profile.
pub const BOTIX_SIGNATURE: &str = "x-botix-signature";

/// Checks the MAC in `header` against every secret.
pub(super) fn verify(
    headers: &HeaderMap,
    header: &HeaderName,
    prefix: Option<&str>,
    encoding: Encoding,
    body: &[u8],
    secrets: &[Secret],
) -> Result<(), SignatureError> {
    let value = header_str(headers, header.as_str())?;
    // The prefix is optional on the wire: botix senders send either form.
    let encoded = match prefix {
        Some(p) => value.strip_prefix(p).unwrap_or(value),
        None => value,
    };
    let mac = decode(encoded.trim(), encoding)?;
    match_any(secrets, &mac, |key| hmac_parts(key, &[body]))
}

/// The botix header value for a body: `sha256=<lowercase hex>`.
pub fn botix_header(secret: &[u8], body: &[u8]) -> String {
    format!("sha256={}", hex::encode(hmac_parts(secret, &[body])))
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;
    use crate::providers::testkit::*;
    use crate::providers::*;

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
