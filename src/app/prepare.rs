//! Start-up before any port is bound: the config's secrets, TLS files, URLs and routes
//! resolved ([`check`]), then the store opened ([`prepare`]), so a bad secret, certificate
//! or store fails fast.

use std::sync::Arc;

use crate::config::{Config, Route};
use crate::guard::RouteGuard;
use crate::http::token::AdminToken;
use crate::ingress::event::EventFields;
use crate::ingress::secrets::RouteSecrets;
use crate::outbox::publish::BrokerNodes;
use crate::pipeline::CompiledRoute;
use crate::reconcile::key::KeySource;
use crate::state::BackendChoice;
use durable_spool::Store;

use crate::store_error::StoreError;
use crate::tls::TlsReloader;

use super::app_error::AppError;

/// Everything loaded from disk before any port is bound, so a bad secret or certificate
/// fails fast.
pub struct Prepared {
    pub(super) resolved: Resolved,
    pub(super) store: Store,
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
    let store = Store::open_with_cache(&resolved.config.store.path, resolved.config.store.cache)
        .map_err(StoreError::from)?;
    Ok(Prepared { resolved, store })
}

/// The config with everything it names loaded, short of the store.
pub(super) struct Resolved {
    pub(super) config: Config,
    pub(super) backend: BackendChoice,
    pub(super) nodes: BrokerNodes,
    pub(super) routes: Vec<CompiledRoute>,
    pub(super) tls: Option<Arc<TlsReloader>>,
    pub(super) admin_token: Option<AdminToken>,
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

pub(super) fn warn_short_secrets(route: &str, secrets: &RouteSecrets) {
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
