//! Wiring: load secrets, TLS and the store before any port is bound (`check`, `prepare`);
//! `gateway` starts the parts, serves both listeners until shutdown, then drains in order;
//! `loops` holds the background loops.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::clock::{system_clock, Clock};
use crate::config::{Config, Route};
use crate::guard::RouteGuard;
use crate::http::token::{AdminToken, TokenError};
use crate::ingress::event::EventFields;
use crate::ingress::secrets::{RouteSecrets, SecretError};
use crate::liveness::Liveness;
use crate::outbox::publish::{BrokerNodes, NodeUrlError};
use crate::pipeline::CompiledRoute;
use crate::reconcile::key::KeySource;
use crate::state::BackendChoice;
use crate::store::{Store, StoreError};
use crate::tls::{TlsError, TlsReloader};

mod gateway;
mod loops;

pub use gateway::serve;

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

/// The two listeners, bound by the caller (tests bind port 0).
pub struct Listeners {
    /// Webhook listener.
    pub webhooks: TcpListener,
    /// Admin listener.
    pub admin: TcpListener,
}

/// Knobs tests turn; production uses the defaults.
pub struct Options {
    /// The clock of freshness, dedup and guard decisions.
    pub clock: Clock,
    /// How often expired marks are swept.
    pub sweep_interval: Duration,
    /// Set by any part in a state only a restart cures; `/healthz` reports it.
    pub liveness: Liveness,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            clock: system_clock(),
            sweep_interval: Duration::from_secs(60),
            liveness: Liveness::new(),
        }
    }
}

/// Everything loaded from disk before any port is bound, so a bad secret or certificate
/// fails fast.
pub struct Prepared {
    resolved: Resolved,
    store: Store,
}

/// What [`check`] may read besides the config itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookups {
    /// Environment variables, secret files and TLS files, exactly as `run` reads them.
    Resolve,
    /// None of them: for checking a config in CI, where the Secrets it names do not exist.
    /// Everything that needs no look-up is still checked.
    Offline,
}

/// Checks everything `run` checks before it opens the store and binds its ports: with
/// [`Lookups::Resolve`], every secret source resolves to a non-empty secret, the TLS files
/// load, and the URLs (after `url_env`) parse. Returns the effective config (URLs taken
/// from the environment). The errors, and so the exit codes, are the ones `run` gives.
pub fn check(config: Config, lookups: Lookups) -> Result<Config, AppError> {
    crate::tls::install_crypto_provider();
    match lookups {
        Lookups::Resolve => resolve(config).map(|r| r.config),
        Lookups::Offline => {
            for route in &config.routes {
                route.scheme().map_err(|reason| AppError::Route {
                    route: route.name.clone(),
                    reason,
                })?;
            }
            // A URL named by `url_env` is only known where the gateway runs.
            if config.amqp.url_env.is_none() && config.amqp.urls_env.is_none() {
                BrokerNodes::parse(&config.amqp)?;
            }
            // So are a URL from the environment and the sentinels' password.
            let redis = &config.redis;
            if redis.url_env.is_none()
                && redis.sentinel_password_env.is_none()
                && redis.sentinel_password_file.is_none()
            {
                BackendChoice::from_config(&config).map_err(AppError::Backend)?;
            }
            Ok(config)
        }
    }
}

/// Loads secrets, TLS material and the store.
pub fn prepare(config: Config) -> Result<Prepared, AppError> {
    crate::tls::install_crypto_provider();
    let resolved = resolve(config)?;
    let store = Store::open_with_cache(&resolved.config.store.path, resolved.config.store.cache)?;
    Ok(Prepared { resolved, store })
}

/// The config with everything it names loaded, short of the store.
struct Resolved {
    config: Config,
    backend: BackendChoice,
    nodes: BrokerNodes,
    routes: Vec<CompiledRoute>,
    tls: Option<Arc<TlsReloader>>,
    admin_token: Option<AdminToken>,
}

fn resolve(mut config: Config) -> Result<Resolved, AppError> {
    take_urls_from_env(&mut config)?;
    let nodes = BrokerNodes::parse(&config.amqp)?;
    let routes = config
        .routes
        .iter()
        .map(compile_route)
        .collect::<Result<Vec<_>, _>>()?;
    let tls = config
        .listen
        .tls
        .clone()
        .map(TlsReloader::new)
        .transpose()?
        .map(Arc::new);
    let backend = BackendChoice::from_config(&config).map_err(AppError::Backend)?;
    let admin_token = config
        .admin
        .token_file
        .as_deref()
        .map(AdminToken::read)
        .transpose()?;
    Ok(Resolved {
        config,
        backend,
        nodes,
        routes,
        tls,
        admin_token,
    })
}

/// URLs with passwords may come from the environment (a Kubernetes Secret) rather than the
/// config file (a ConfigMap): `url_env` and `urls_env` of `amqp`, `url_env` of `redis`.
fn take_urls_from_env(config: &mut Config) -> Result<(), AppError> {
    if let Some(var) = &config.amqp.url_env {
        config.amqp.url = url_from_env(var)?;
    }
    if let Some(var) = &config.amqp.urls_env {
        config.amqp.urls = crate::config::split_urls(&url_from_env(var)?);
        if config.amqp.urls.is_empty() {
            return Err(AppError::UrlEnv(var.clone()));
        }
    }
    if let Some(var) = &config.redis.url_env {
        config.redis.url = url_from_env(var)?;
    }
    Ok(())
}

/// A route with its signature scheme, its secrets loaded and checked against the scheme,
/// its reconcile key read once, and its fields and guard.
fn compile_route(route: &Route) -> Result<CompiledRoute, AppError> {
    let route_error = |reason: String| AppError::Route {
        route: route.name.clone(),
        reason,
    };
    let scheme = route.scheme().map_err(route_error)?;
    let secrets = RouteSecrets::new(route.secrets.clone()).map_err(|source| AppError::Secret {
        route: route.name.clone(),
        source,
    })?;
    scheme
        .check_secrets(&secrets.current())
        .map_err(route_error)?;
    if secrets.has_inline() {
        tracing::warn!(route = %route.name, "inline secret in the config: for development only; use secret_env or secret_file");
    }
    warn_short_secrets(&route.name, &secrets);
    if let Some(reconcile) = &route.reconcile {
        // Like a secret, a key that cannot be read is a fault of the deployment, found
        // before any port is bound.
        KeySource::of(reconcile)
            .read()
            .map_err(|e| route_error(format!("reconcile: {e}")))?;
    }
    let mut fields = EventFields::for_route(route);
    let guard = RouteGuard::new(&route.guard, &mut fields);
    Ok(CompiledRoute {
        config: route.clone(),
        fields,
        scheme,
        secrets,
        guard,
    })
}

fn warn_short_secrets(route: &str, secrets: &RouteSecrets) {
    for source in secrets.short() {
        tracing::warn!(route = %route, %source, min_bytes = crate::ingress::secrets::MIN_SECRET_BYTES, "secret shorter than 16 bytes: use a long random key");
    }
}

fn url_from_env(var: &str) -> Result<String, AppError> {
    std::env::var(var)
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| AppError::UrlEnv(var.to_owned()))
}
