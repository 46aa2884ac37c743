//! A route's signature check as its sender built it, the secrets it checks with, and why a
//! delivery was refused.

use std::fmt;
use std::sync::Arc;

use http::HeaderMap;

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

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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

/// A delivery as a signature check reads it.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The request URL's query (without `?`), for schemes that sign it.
    pub query: Option<&'a str>,
    /// The raw body.
    pub body: &'a [u8],
    /// Now, Unix seconds, for schemes that sign a time.
    pub now_secs: i64,
}

/// One sender's check of a delivery against a route's secrets.
pub trait Verify: fmt::Debug + Send + Sync {
    /// Checks the delivery against every secret.
    fn verify(&self, delivery: &Delivery<'_>, secrets: &[Secret]) -> Result<(), SignatureError>;

    /// Why this scheme cannot use `secret` (a public key that is not one), if it cannot.
    fn unusable(&self, _secret: &[u8]) -> Option<&'static str> {
        None
    }
}

/// How a route's signature is checked; built once from the route by its sender.
#[derive(Debug, Clone)]
pub struct Scheme(Arc<dyn Verify>);

impl Scheme {
    /// The scheme that checks deliveries with `check`.
    pub fn new(check: impl Verify + 'static) -> Self {
        Self(Arc::new(check))
    }

    /// Whether every secret is usable by this scheme: a Telnyx public key must be the
    /// base64 of a valid ed25519 key, a `whsec_` secret must be base64. Checked at start,
    /// so a pasted key with a typo is a config error rather than a 401 for every delivery.
    pub fn check_secrets(&self, secrets: &[Secret]) -> Result<(), String> {
        for (i, secret) in secrets.iter().enumerate() {
            if let Some(problem) = self.0.unusable(secret.expose()) {
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
        let delivery = Delivery {
            headers,
            query,
            body,
            now_secs,
        };
        self.0.verify(&delivery, secrets)
    }
}
