//! Twilio: a base64 HMAC-SHA1 over the public URL (with the request's query) and the form
//! fields sorted by name, or over the URL alone with a `bodySHA256` query parameter.

use std::borrow::Cow;

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use super::{header_str, matched, Secret, SignatureError};

type HmacSha1 = Hmac<Sha1>;

/// Header of the Twilio profile: base64 HMAC-SHA1 of the URL and the sorted form fields.
pub const TWILIO_SIGNATURE: &str = "x-twilio-signature";
/// Query parameter of a Twilio JSON delivery: the hex SHA-256 of the body.
pub const TWILIO_BODY_SHA256: &str = "bodySHA256";

/// Twilio: the signature covers the URL the sender requested (the route's `public_url`
/// with the request's query) followed by every form field, sorted by name (then value),
/// each name followed by its value. A JSON delivery instead carries the body's SHA-256 in
/// the `bodySHA256` query parameter, and the URL alone is signed.
pub(super) fn verify(
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

#[cfg(test)]
mod tests {
    use sha2::Digest;

    use super::*;
    use crate::providers::testkit::*;
    use crate::providers::*;

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
}
