//! The senders hookgate takes deliveries from: their signature schemes and the constant-time
//! check, pure functions over headers and bytes. One file per way of signing: an HMAC of
//! the body in one header (`body_hmac`: botix and the custom profile), Standard Webhooks,
//! Twilio and Telnyx. What they share is here: the route's secrets, the tolerance of a
//! signed time, the HMAC-SHA256 and the comparison under every secret.

mod body_hmac;
mod standard_webhooks;
mod telnyx;
mod twilio;

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

pub use body_hmac::{botix_header, BOTIX_SIGNATURE};
pub use standard_webhooks::{
    standard_webhooks_signature, WEBHOOK_ID, WEBHOOK_SECRET_PREFIX, WEBHOOK_SIGNATURE,
    WEBHOOK_TIMESTAMP,
};
pub use telnyx::{telnyx_signature, TELNYX_SIGNATURE, TELNYX_TIMESTAMP};
pub use twilio::{twilio_signature, TWILIO_BODY_SHA256, TWILIO_SIGNATURE};

use crate::config::{Encoding, Profile, Route};

type HmacSha256 = Hmac<Sha256>;

/// A secret key. `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps key bytes.
    pub fn new(bytes: &[u8]) -> Self {
        Self(bytes.to_vec())
    }

    /// The key bytes, for the MAC only.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

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
                Scheme::Telnyx { .. } => telnyx::telnyx_key(secret.expose())
                    .is_none()
                    .then_some("is not the base64 of a 32-byte ed25519 public key"),
                Scheme::StandardWebhooks { .. } => secret
                    .expose()
                    .starts_with(WEBHOOK_SECRET_PREFIX.as_bytes())
                    .then(|| standard_webhooks::standard_webhooks_key(secret.expose()))
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
            } => body_hmac::verify(headers, header, prefix.as_deref(), *encoding, body, secrets),
            Scheme::StandardWebhooks { tolerance_secs } => {
                let window = SignedWindow::new(now_secs, *tolerance_secs);
                standard_webhooks::verify(headers, body, secrets, window)
            }
            Scheme::Twilio { urls } => twilio::verify(urls, headers, query, body, secrets),
            Scheme::Telnyx { tolerance_secs } => telnyx::verify(
                headers,
                body,
                secrets,
                SignedWindow::new(now_secs, *tolerance_secs),
            ),
        }
    }
}

/// The answer of a comparison made under every secret: a match with any of them, or none.
fn matched(ok: Choice) -> Result<(), SignatureError> {
    if bool::from(ok) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
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

/// When a signed timestamp is accepted: within `tolerance_secs` of `now_secs`, either way.
#[derive(Clone, Copy)]
struct SignedWindow {
    now_secs: i64,
    tolerance_secs: i64,
}

impl SignedWindow {
    fn new(now_secs: i64, tolerance_secs: i64) -> Self {
        Self {
            now_secs,
            tolerance_secs,
        }
    }

    /// Checks the signed Unix time `text`: malformed when not a number, stale when outside
    /// the window. The difference is taken in u64 (`abs_diff`): a subtraction of two i64
    /// overflows for a time such as i64::MIN, which is the sender's to choose.
    fn check(self, text: &str) -> Result<(), SignatureError> {
        let ts: i64 = text.parse().map_err(|_| SignatureError::Malformed)?;
        if self.now_secs.abs_diff(ts) > self.tolerance_secs.unsigned_abs() {
            return Err(SignatureError::Stale);
        }
        Ok(())
    }
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
    matched(ok)
}

/// The text of header `name`: missing, or malformed when not visible ASCII.
fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, SignatureError> {
    let value = headers.get(name).ok_or(SignatureError::Missing)?;
    value.to_str().map_err(|_| SignatureError::Malformed)
}

/// A SHA-256 MAC as the header encodes it.
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

/// What the tests of every scheme share: headers, and the providers' vectors.
#[cfg(test)]
mod testkit {
    use http::{HeaderMap, HeaderValue};

    pub(super) fn headers(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
        h
    }

    pub(super) fn provider_vectors(name: &str) -> serde_json::Value {
        let path = format!("{}/tests/data/providers/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("provider vectors");
        serde_json::from_str(&text).expect("vectors parse")
    }

    pub(super) fn text(v: &serde_json::Value) -> &str {
        v.as_str().expect("text")
    }
}
