//! What the signature schemes share: the HMAC-SHA256 of a message's parts, the encodings a
//! MAC is written in, the comparison under every secret, a signature header's text and the
//! window a signed time must fall in.

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

use super::scheme::{Secret, SignatureError};

type HmacSha256 = Hmac<Sha256>;

/// How a MAC is written in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Lowercase or uppercase hex.
    Hex,
    /// Standard base64 with padding.
    Base64,
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

/// The answer of a comparison made under every secret: a match with any of them, or none.
pub(super) fn matched(ok: Choice) -> Result<(), SignatureError> {
    if bool::from(ok) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// Compares `given` with the MAC under every secret without stopping at the first match,
/// so the time taken does not tell which secret (if any) matched.
pub(super) fn match_any(
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
pub(super) fn header_str<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<&'a str, SignatureError> {
    let value = headers.get(name).ok_or(SignatureError::Missing)?;
    value.to_str().map_err(|_| SignatureError::Malformed)
}

/// A SHA-256 MAC as the header encodes it.
pub(super) fn decode(text: &str, encoding: Encoding) -> Result<Vec<u8>, SignatureError> {
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

/// A MAC written as `encoding` says.
pub(super) fn encode(mac: &[u8], encoding: Encoding) -> String {
    match encoding {
        Encoding::Hex => hex::encode(mac),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(mac),
    }
}

/// When a signed timestamp is accepted: within `tolerance_secs` of `now_secs`, either way.
#[derive(Clone, Copy)]
pub(super) struct SignedWindow {
    now_secs: i64,
    tolerance_secs: i64,
}

impl SignedWindow {
    pub(super) fn new(now_secs: i64, tolerance_secs: i64) -> Self {
        Self {
            now_secs,
            tolerance_secs,
        }
    }

    /// Checks the signed Unix time `text`: malformed when not a number, stale when outside
    /// the window. The difference is taken in u64 (`abs_diff`): a subtraction of two i64
    /// overflows for a time such as i64::MIN, which is the sender's to choose.
    pub(super) fn check(self, text: &str) -> Result<(), SignatureError> {
        let ts: i64 = text.parse().map_err(|_| SignatureError::Malformed)?;
        if self.now_secs.abs_diff(ts) > self.tolerance_secs.unsigned_abs() {
            return Err(SignatureError::Stale);
        }
        Ok(())
    }
}
