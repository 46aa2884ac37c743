//! A custom route: an HMAC-SHA256 of the raw body in a header its `signature` section names,
//! after an optional prefix, hex or base64. Its delivery id is botix's `X-Botix-Request-Id`,
//! its events are read with the route's `fields`.

use http::HeaderName;

use super::body_hmac::BodyHmac;
use super::botix::BOTIX_REQUEST_ID;
use super::mac::{encode, hmac_parts};
use super::scheme::Scheme;
use super::sender::{RouteKeys, Sender, SignRequest, Signed};

/// The sender of a custom route.
pub struct Custom;

impl Sender for Custom {
    fn check_keys(&self, keys: &RouteKeys<'_>) -> Result<(), String> {
        if keys.signature.is_none() {
            return Err("signature: required with profile custom".into());
        }
        keys.refuse_public_url()
    }

    fn scheme(&self, keys: &RouteKeys<'_>) -> Result<Scheme, String> {
        let sig = keys
            .signature
            .ok_or_else(|| "profile custom needs signature".to_owned())?;
        let header = HeaderName::from_bytes(sig.header.as_bytes())
            .map_err(|_| format!("invalid header name {:?}", sig.header))?;
        Ok(Scheme::new(BodyHmac {
            header,
            prefix: sig.prefix.clone(),
            encoding: sig.encoding,
        }))
    }

    /// `Header: <prefix><mac>` as the route's `signature` section says.
    fn sign(&self, request: &SignRequest<'_>) -> Result<Signed, String> {
        let sig = request
            .route
            .and_then(|keys| keys.signature)
            .ok_or("profile custom: give --route, whose signature section says how to sign")?;
        let mac = encode(&hmac_parts(request.secret, &[request.body]), sig.encoding);
        let prefix = sig.prefix.as_deref().unwrap_or_default();
        Ok(Signed::headers(format!("{}: {prefix}{mac}", sig.header)))
    }

    fn request_id_header(&self) -> Option<&'static str> {
        Some(BOTIX_REQUEST_ID)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::vectors::headers;
    use crate::providers::{CustomSignature, Encoding, Secret};

    fn keys(signature: &CustomSignature) -> RouteKeys<'_> {
        RouteKeys {
            signature: Some(signature),
            ..RouteKeys::default()
        }
    }

    #[test]
    fn a_custom_route_needs_its_signature_section_and_verifies_what_sign_makes() {
        assert!(Custom.check_keys(&RouteKeys::default()).is_err());
        let signature = CustomSignature {
            header: "x-sig".into(),
            prefix: Some("v1=".into()),
            encoding: Encoding::Base64,
        };
        assert_eq!(Custom.check_keys(&keys(&signature)), Ok(()));
        let request = SignRequest {
            secret: b"s3",
            body: b"payload",
            route: Some(keys(&signature)),
            url: None,
            id: None,
            fresh: "f",
            timestamp: 0,
        };
        let signed = Custom.sign(&request).expect("signs");
        let (name, value) = signed.headers.split_once(": ").expect("a header line");
        assert_eq!(name, "x-sig");
        assert!(value.starts_with("v1="), "{value}");
        let scheme = Custom.scheme(&keys(&signature)).expect("scheme");
        let secrets = [Secret::new(b"s3")];
        assert_eq!(
            scheme.verify(&headers(name, value), b"payload", &secrets, 0),
            Ok(())
        );
        assert!(scheme
            .verify(&headers(name, value), b"other", &secrets, 0)
            .is_err());
        let unsigned = SignRequest {
            route: None,
            ..request
        };
        assert!(Custom.sign(&unsigned).is_err(), "no route, no scheme");
    }
}
