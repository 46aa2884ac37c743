//! An HMAC-SHA256 of the raw body in one header, after an optional prefix: the scheme of
//! botix routes, and of custom routes as their `signature` section spells it out.

use http::HeaderName;
use serde::{Deserialize, Serialize};

use super::mac::{decode, header_str, hmac_parts, match_any, Encoding};
use super::scheme::{Delivery, Secret, SignatureError, Verify};

/// The `signature` section of a custom route: HMAC-SHA256 over the raw body.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CustomSignature {
    /// Header carrying the signature.
    pub header: String,
    /// Optional prefix before the encoded MAC, e.g. `sha256=`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// `hex` or `base64`.
    pub encoding: Encoding,
}

/// HMAC-SHA256 of the raw body in `header`, after an optional prefix.
#[derive(Debug, Clone)]
pub struct BodyHmac {
    /// The header that carries the MAC.
    pub header: HeaderName,
    /// Text before the MAC, optional on the wire.
    pub prefix: Option<String>,
    /// How the MAC is written.
    pub encoding: Encoding,
}

impl Verify for BodyHmac {
    /// Checks the MAC in the header against every secret.
    fn verify(&self, delivery: &Delivery<'_>, secrets: &[Secret]) -> Result<(), SignatureError> {
        let value = header_str(delivery.headers, self.header.as_str())?;
        // The prefix is optional on the wire: botix senders send either form.
        let encoded = match &self.prefix {
            Some(p) => value.strip_prefix(p.as_str()).unwrap_or(value),
            None => value,
        };
        let mac = decode(encoded.trim(), self.encoding)?;
        match_any(secrets, &mac, |key| hmac_parts(key, &[delivery.body]))
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;
    use crate::providers::vectors::headers;
    use crate::providers::Scheme;

    #[test]
    fn custom_base64_scheme_with_its_own_header() {
        let scheme = Scheme::new(BodyHmac {
            header: http::HeaderName::from_static("x-sig"),
            prefix: None,
            encoding: Encoding::Base64,
        });
        let body = b"payload";
        let mac = base64::engine::general_purpose::STANDARD.encode(hmac_parts(b"s3", &[body]));
        let h = headers("x-sig", &mac);
        assert_eq!(scheme.verify(&h, body, &[Secret::new(b"s3")], 0), Ok(()));
        assert_eq!(
            scheme.verify(&h, b"payload2", &[Secret::new(b"s3")], 0),
            Err(SignatureError::Mismatch)
        );
    }
}
