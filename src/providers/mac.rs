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

/// A SHA-256 MAC as the header encodes it. A MAC is 32 bytes; a text of any other length
/// cannot match and is malformed. Decoded into place: no buffer of its own.
pub(super) fn decode(text: &str, encoding: Encoding) -> Result<[u8; 32], SignatureError> {
    let mut mac = [0; 32];
    match encoding {
        // Fails unless the text is exactly 64 hex digits.
        Encoding::Hex => {
            hex::decode_to_slice(text, &mut mac).map_err(|_| SignatureError::Malformed)?
        }
        Encoding::Base64 => {
            // The decoder wants room for its estimate, rounded up to whole groups of 3.
            let mut room = [0; 33];
            let len = base64::engine::general_purpose::STANDARD
                .decode_slice(text, &mut room)
                .map_err(|_| SignatureError::Malformed)?;
            if len != mac.len() {
                return Err(SignatureError::Malformed);
            }
            mac.copy_from_slice(&room[..len]);
        }
    }
    Ok(mac)
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

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;

    #[test]
    fn a_mac_decodes_only_at_its_32_bytes() {
        let b64 = |n: usize| base64::engine::general_purpose::STANDARD.encode(vec![7u8; n]);
        let mac = [7u8; 32];
        assert_eq!(decode(&hex::encode(mac), Encoding::Hex), Ok(mac));
        assert_eq!(decode(&b64(32), Encoding::Base64), Ok(mac));
        for (text, encoding) in [
            (hex::encode([7u8; 31]), Encoding::Hex),
            (hex::encode([7u8; 33]), Encoding::Hex),
            (format!("{}zz", &hex::encode(mac)[2..]), Encoding::Hex),
            (String::new(), Encoding::Hex),
            (b64(31), Encoding::Base64),
            (b64(33), Encoding::Base64),
            (b64(64), Encoding::Base64),
            (b64(32).trim_end_matches('=').to_owned(), Encoding::Base64),
            (format!("{}!", &b64(32)[1..]), Encoding::Base64),
            (String::new(), Encoding::Base64),
        ] {
            assert_eq!(
                decode(&text, encoding),
                Err(SignatureError::Malformed),
                "{text:?}"
            );
        }
    }
}
