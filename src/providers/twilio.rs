//! Twilio: a base64 HMAC-SHA1 over the public URL (with the request's query) and the form
//! fields sorted by name, or over the URL alone with a `bodySHA256` query parameter. Its
//! body is a form (or JSON) whose fields name the event: a status callback is the message
//! and its status (`SM…:delivered`), an inbound message its SID. Its route needs
//! `public_url` and takes no `fields`; it brings guard rules for its statuses and keywords.

use std::borrow::Cow;

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{json, Value};
use sha1::Sha1;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use super::mac::{header_str, matched};
use super::scheme::{Delivery, Scheme, Secret, SignatureError, Verify};
use super::sender::{ranks, NamedEvent, OwnEvents, RouteKeys, Sender, SignRequest, Signed};

type HmacSha1 = Hmac<Sha1>;

/// Header of the Twilio profile: base64 HMAC-SHA1 of the URL and the sorted form fields.
pub const TWILIO_SIGNATURE: &str = "x-twilio-signature";
/// Query parameter of a Twilio JSON delivery: the hex SHA-256 of the body.
pub const TWILIO_BODY_SHA256: &str = "bodySHA256";
/// Twilio's id of one webhook delivery, the same on its retries.
pub const TWILIO_IDEMPOTENCY_TOKEN: &str = "i-twilio-idempotency-token";
/// The event type of a Twilio status callback (it carries `MessageStatus`).
pub const TWILIO_STATUS_EVENT: &str = "message.status";
/// The event type of an inbound Twilio message (no `MessageStatus`).
pub const TWILIO_RECEIVED_EVENT: &str = "message.received";

/// Twilio's message statuses in the order a message goes through them. A scheduled or
/// Messaging Service message starts `scheduled` or `accepted`, then `queued`; `received`,
/// `canceled` and the failures are final like `delivered`; `read` (WhatsApp) comes last.
pub const TWILIO_RANKS: [(&str, u32); 12] = [
    ("accepted", 0),
    ("scheduled", 0),
    ("queued", 1),
    ("sending", 2),
    ("receiving", 2),
    ("sent", 3),
    ("delivered", 4),
    ("undelivered", 4),
    ("failed", 4),
    ("received", 4),
    ("canceled", 4),
    ("read", 5),
];

/// The Twilio sender.
pub struct Twilio;

impl Sender for Twilio {
    fn check_keys(&self, keys: &RouteKeys<'_>) -> Result<(), String> {
        keys.refuse_signature()?;
        match keys.public_url {
            None => Err("public_url: required with profile twilio (the URL Twilio signs)".into()),
            Some(url) => check_public_url(url).map_err(|reason| format!("public_url: {reason}")),
        }
    }

    fn scheme(&self, keys: &RouteKeys<'_>) -> Result<Scheme, String> {
        let url = keys
            .public_url
            .ok_or_else(|| "profile twilio needs public_url".to_owned())?;
        Ok(Scheme::new(TwilioScheme {
            urls: public_url_forms(url),
        }))
    }

    fn sign(&self, request: &SignRequest<'_>) -> Result<Signed, String> {
        let url = request
            .url
            .or_else(|| request.route.and_then(|keys| keys.public_url))
            .ok_or("profile twilio signs a URL: give --url (with the query Twilio sends)")?;
        Ok(Signed::headers(format!(
            "X-Twilio-Signature: {}",
            twilio_signature(request.secret, url, request.body)
        )))
    }

    fn request_id_header(&self) -> Option<&'static str> {
        Some(TWILIO_IDEMPOTENCY_TOKEN)
    }

    fn fields(&self) -> Result<Value, &'static str> {
        Err(
            "not used with profile twilio: its event id is MessageSid with MessageStatus, \
             its type message.status or message.received",
        )
    }

    /// Form fields are read as one-token pointers: `/Body` is the field `Body`.
    fn guard(&self) -> Option<Value> {
        Some(json!({
            "status": {
                "events": [TWILIO_STATUS_EVENT],
                "message_id": "/MessageSid",
                "status": "/MessageStatus",
                "ranks": ranks(&TWILIO_RANKS),
            },
            "keywords": {
                "events": [TWILIO_RECEIVED_EVENT],
                "text": "/Body",
                "contact": "/From",
                "channel": "/To",
            },
        }))
    }

    fn own_events(&self) -> Option<OwnEvents> {
        Some(OwnEvents {
            pointers: &["/MessageSid", "/SmsSid", "/MessageStatus"],
            name: name_event,
        })
    }
}

/// A Twilio event from its `MessageSid`, `SmsSid` and `MessageStatus`: a status callback has
/// no event id of its own, so its id is the message and the status it reports; an inbound
/// message's id is its message SID.
fn name_event(values: &[Option<&str>]) -> NamedEvent {
    let [message_sid, sms_sid, status] = [0, 1, 2].map(|i| values.get(i).copied().flatten());
    let sid = message_sid.or(sms_sid);
    let id = match (sid, status) {
        (Some(sid), Some(status)) => Some(format!("{sid}:{status}")),
        (sid, _) => sid.map(str::to_owned),
    };
    let event_type = match status {
        Some(_) => TWILIO_STATUS_EVENT,
        None => TWILIO_RECEIVED_EVENT,
    };
    NamedEvent { id, event_type }
}

/// The check of a Twilio route.
#[derive(Debug, Clone)]
pub struct TwilioScheme {
    /// The forms of the route's `public_url` a sender may have signed.
    pub urls: Vec<String>,
}

impl Verify for TwilioScheme {
    /// The signature covers the URL the sender requested (the route's `public_url` with
    /// the request's query) followed by every form field, sorted by name (then value), each
    /// name followed by its value. A JSON delivery instead carries the body's SHA-256 in the
    /// `bodySHA256` query parameter, and the URL alone is signed.
    fn verify(&self, delivery: &Delivery<'_>, secrets: &[Secret]) -> Result<(), SignatureError> {
        let body = delivery.body;
        let given = base64::engine::general_purpose::STANDARD
            .decode(header_str(delivery.headers, TWILIO_SIGNATURE)?.trim())
            .map_err(|_| SignatureError::Malformed)?;
        // A SHA-1 MAC is 20 bytes.
        if given.len() != 20 {
            return Err(SignatureError::Malformed);
        }
        let query = delivery.query.filter(|q| !q.is_empty());
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
        for url in &self.urls {
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

/// A URL Twilio can be told to request: `http(s)://host[:port]/path`, no query (the
/// request's own query is appended when checking), no fragment, no user info.
pub fn check_public_url(url: &str) -> Result<(), String> {
    let Some((_, rest)) = url
        .strip_prefix("https://")
        .map(|r| ("https", r))
        .or_else(|| url.strip_prefix("http://").map(|r| ("http", r)))
    else {
        return Err(format!("{url:?} must start with https:// or http://"));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("{url:?} needs a host and no user info"));
    }
    if url.contains(['?', '#']) || url.chars().any(char::is_whitespace) {
        return Err(format!(
            "{url:?} must have no query, fragment or white space (a request's query is appended to it)"
        ));
    }
    Ok(())
}

/// The forms of `public_url` a Twilio signature may have been made over: as configured,
/// and with the port left out or the scheme's default port written, since senders and
/// Twilio's own validators differ on whether the port is part of the signed URL.
pub fn public_url_forms(url: &str) -> Vec<String> {
    let (scheme, rest, default_port) = if let Some(r) = url.strip_prefix("https://") {
        ("https", r, "443")
    } else if let Some(r) = url.strip_prefix("http://") {
        ("http", r, "80")
    } else {
        return vec![url.to_owned()];
    };
    let (authority, path) = rest.find('/').map_or((rest, ""), |at| rest.split_at(at));
    // The port follows the last ':' unless that ':' is inside an IPv6 literal.
    let host = match authority.rfind(':') {
        Some(at) if !authority[at..].contains(']') => &authority[..at],
        _ => authority,
    };
    let mut forms = vec![url.to_owned()];
    for form in [
        format!("{scheme}://{host}{path}"),
        format!("{scheme}://{host}:{default_port}{path}"),
    ] {
        if !forms.contains(&form) {
            forms.push(form);
        }
    }
    forms
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;
    use sha2::Digest;

    use super::*;
    use crate::providers::vectors::{headers, provider_vectors, text};

    /// A form body of the vector's parameters, in the order given (Twilio sorts them).
    fn form_body(params: &serde_json::Value) -> String {
        let mut form = form_urlencoded::Serializer::new(String::new());
        for pair in params.as_array().expect("params") {
            form.append_pair(text(&pair[0]), text(&pair[1]));
        }
        form.finish()
    }

    fn twilio_scheme(public_url: &str) -> Scheme {
        Scheme::new(TwilioScheme {
            urls: public_url_forms(public_url),
        })
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
    fn url_forms_with_and_without_the_port() {
        assert_eq!(
            public_url_forms("https://hooks.example.com/webhooks/twilio"),
            [
                "https://hooks.example.com/webhooks/twilio",
                "https://hooks.example.com:443/webhooks/twilio"
            ]
        );
        assert_eq!(
            public_url_forms("http://10.0.0.1:8080/t"),
            [
                "http://10.0.0.1:8080/t",
                "http://10.0.0.1/t",
                "http://10.0.0.1:80/t"
            ]
        );
        assert_eq!(
            public_url_forms("https://[::1]/t"),
            ["https://[::1]/t", "https://[::1]:443/t"]
        );
    }

    #[test]
    fn public_url_must_be_a_plain_http_url() {
        assert!(check_public_url("https://hooks.example.com/webhooks/twilio").is_ok());
        assert!(check_public_url("http://hooks.example.com").is_ok());
        for bad in [
            "hooks.example.com/x",
            "ftp://h/x",
            "https:///x",
            "https://h/x?a=1",
            "https://h/x#f",
            "https://u:p@h/x",
            "https://h/a b",
        ] {
            assert!(check_public_url(bad).is_err(), "{bad}");
        }
    }
}
