//! [`AppError`]: why the gateway could not start or run, and which exit code it means.

use crate::http::token::TokenError;
use crate::ingress::secrets::SecretError;
use crate::outbox::publish::NodeUrlError;
use crate::store_error::StoreError;
use crate::tls::TlsError;

/// Why the gateway could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("route {route}: {source}")]
    Secret { route: String, source: SecretError },
    #[error("route {route}: {reason}")]
    Route { route: String, reason: String },
    #[error("url_env/urls_env: environment variable {0} is not set or empty")]
    UrlEnv(String),
    #[error(transparent)]
    BrokerUrl(#[from] NodeUrlError),
    #[error("{0}")]
    Backend(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("reconcile: {0}")]
    Reconcile(String),
    #[error(transparent)]
    AdminToken(#[from] TokenError),
}

impl AppError {
    /// Whether the fault is in the configuration (exit 64) rather than the environment.
    pub fn is_config(&self) -> bool {
        !matches!(self, AppError::Store(_))
    }
}
