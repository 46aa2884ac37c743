//! Wiring: open the store, load secrets and TLS, start the publisher and spool drainer,
//! serve both listeners until shutdown, then drain in order.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::clock::{system_clock, Clock};
use crate::config::Config;
use crate::guard::RouteGuard;
use crate::http::admin::{Admin, Health};
use crate::http::serve_admin;
use crate::http::token::{AdminToken, TokenError};
use crate::http::webhook::{serve_webhooks, WebhookService};
use crate::ingress::event::EventFields;
use crate::ingress::secrets::{RouteSecrets, SecretError};
use crate::ingress::signature::Scheme;
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::outbox::publish::Publisher;
use crate::outbox::spool::Spool;
use crate::outbox::Outbox;
use crate::pipeline::{CompiledRoute, Pipeline, RouteRuntime, Settings};
use crate::reconcile::key::KeySource;
use crate::reconcile::{Parts as ReconcileParts, Reconcilers};
use crate::state::{BackendChoice, StateStore};
use crate::store::{Store, StoreError};
use crate::tls::{TlsError, TlsReloader};

/// Connections the admin listener accepts at once.
const ADMIN_MAX_CONNECTIONS: usize = 64;

/// Why the gateway could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("route {route}: {source}")]
    Secret { route: String, source: SecretError },
    #[error("route {route}: {reason}")]
    Route { route: String, reason: String },
    #[error("url_env/urls_env: environment variable {0} is not set or empty")]
    UrlEnv(String),
    #[error("{key}: {reason}")]
    Url { key: String, reason: String },
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
    config: Config,
    backend: BackendChoice,
    store: Store,
    routes: Vec<CompiledRoute>,
    tls: Option<Arc<TlsReloader>>,
    admin_token: Option<AdminToken>,
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
                Scheme::for_route(route).map_err(|reason| AppError::Route {
                    route: route.name.clone(),
                    reason,
                })?;
            }
            // A URL named by `url_env` is only known where the gateway runs.
            if config.amqp.url_env.is_none() && config.amqp.urls_env.is_none() {
                check_amqp_urls(&config.amqp)?;
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
    let Resolved {
        config,
        backend,
        routes,
        tls,
        admin_token,
    } = resolve(config)?;
    let store = Store::open_with_cache(&config.store.path, config.store.cache)?;
    Ok(Prepared {
        config,
        backend,
        store,
        routes,
        tls,
        admin_token,
    })
}

/// The config with everything it names loaded, short of the store.
struct Resolved {
    config: Config,
    backend: BackendChoice,
    routes: Vec<CompiledRoute>,
    tls: Option<Arc<TlsReloader>>,
    admin_token: Option<AdminToken>,
}

fn resolve(mut config: Config) -> Result<Resolved, AppError> {
    // URLs with passwords may come from the environment (a Kubernetes Secret) rather than
    // the config file (a ConfigMap).
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
    check_amqp_urls(&config.amqp)?;
    let mut routes = Vec::with_capacity(config.routes.len());
    for route in &config.routes {
        let scheme = Scheme::for_route(route).map_err(|reason| AppError::Route {
            route: route.name.clone(),
            reason,
        })?;
        let secrets =
            RouteSecrets::new(route.secrets.clone()).map_err(|source| AppError::Secret {
                route: route.name.clone(),
                source,
            })?;
        scheme
            .check_secrets(&secrets.current())
            .map_err(|reason| AppError::Route {
                route: route.name.clone(),
                reason,
            })?;
        if secrets.has_inline() {
            tracing::warn!(route = %route.name, "inline secret in the config: for development only; use secret_env or secret_file");
        }
        for source in secrets.short() {
            tracing::warn!(route = %route.name, %source, min_bytes = crate::ingress::secrets::MIN_SECRET_BYTES, "secret shorter than 16 bytes: use a long random key");
        }
        if let Some(reconcile) = &route.reconcile {
            // Like a secret, a key that cannot be read is a fault of the deployment, found
            // before any port is bound.
            KeySource::of(reconcile)
                .read()
                .map_err(|e| AppError::Route {
                    route: route.name.clone(),
                    reason: format!("reconcile: {e}"),
                })?;
        }
        let mut fields = EventFields::for_route(route);
        let guard = RouteGuard::new(&route.guard, &mut fields);
        routes.push(CompiledRoute {
            config: route.clone(),
            fields,
            scheme,
            secrets,
            guard,
        });
    }
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
        routes,
        tls,
        admin_token,
    })
}

/// Every broker node's URL parses; the error names the node's key.
fn check_amqp_urls(amqp: &crate::config::Amqp) -> Result<(), AppError> {
    for (i, url) in amqp.nodes().iter().enumerate() {
        crate::outbox::publish::check_url(url).map_err(|reason| AppError::Url {
            key: amqp.node_key(i),
            reason,
        })?;
    }
    Ok(())
}

fn url_from_env(var: &str) -> Result<String, AppError> {
    std::env::var(var)
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| AppError::UrlEnv(var.to_owned()))
}

/// Serves until `shutdown` completes, then drains: readiness 503, stop accepting, finish
/// in-flight requests within `shutdown_grace`, flush the store, close the broker.
pub async fn serve(
    prepared: Prepared,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
    options: Options,
) -> Result<(), AppError> {
    let Prepared {
        config,
        backend,
        store,
        routes,
        tls,
        admin_token,
    } = prepared;
    let metrics = Arc::new(Metrics::new());
    let routes: Vec<Arc<RouteRuntime>> = routes
        .into_iter()
        .map(|route| Arc::new(RouteRuntime::new(route, &metrics, &options.clock)))
        .collect();
    let stop_background = CancellationToken::new();
    let publisher = Publisher::start(
        config.amqp.clone(),
        metrics.clone(),
        stop_background.clone(),
    );
    let spool = Arc::new(Spool::open(&store, &config.spool, metrics.clone())?);
    let depth = spool.status(0).depth;
    if depth > 0 {
        tracing::info!(
            depth,
            "spool holds events from a previous run; draining once the broker is up"
        );
    }
    let state = Arc::new(StateStore::open(
        &backend,
        &config,
        &store,
        options.clock.clone(),
        &options.liveness,
    )?);
    tracing::info!(backend = state.name(), "dedup and guard state store");
    // A no-op for sled; for Redis it keeps readiness current while no requests flow.
    tokio::spawn(ping_loop(state.clone(), stop_background.clone()));
    let pipeline = Arc::new(Pipeline::new(
        Settings::of(&config),
        routes.clone(),
        state.clone(),
        Outbox::new(
            publisher.clone(),
            spool.clone(),
            config.amqp.exchange.clone(),
        ),
        metrics.store_errors.clone(),
        options.clock.clone(),
    ));
    let stop_reconcile = CancellationToken::new();
    let reconcilers = Arc::new(
        Reconcilers::start(
            &routes,
            &ReconcileParts {
                pipeline: pipeline.clone(),
                state: state.clone(),
                metrics: metrics.clone(),
                clock: options.clock.clone(),
            },
            &stop_reconcile,
        )
        .map_err(|e| AppError::Reconcile(e.to_string()))?,
    );
    let drainer = tokio::spawn(spool.clone().run_drainer(
        publisher.clone(),
        config.amqp.exchange.clone(),
        stop_background.clone(),
    ));
    tokio::spawn(sweep_loop(
        state.clone(),
        options.clock.clone(),
        options.sweep_interval,
        stop_background.clone(),
    ));
    tokio::spawn(reload_loop(
        routes,
        metrics.clone(),
        tls.clone(),
        config.reload_poll,
        stop_background.clone(),
    ));

    let shutting_down = CancellationToken::new();
    let admin = Arc::new(Admin {
        health: Health {
            state: state.clone(),
            spool: spool.clone(),
            publisher: publisher.clone(),
            metrics: metrics.clone(),
            clock: options.clock.clone(),
            liveness: options.liveness.clone(),
        },
        shutdown: shutting_down.clone(),
        reconcile: reconcilers.clone(),
        token: admin_token,
    });
    let addr_text = |l: &TcpListener| {
        l.local_addr()
            .map_or_else(|_| "?".to_owned(), |a| a.to_string())
    };
    let webhook_addr = addr_text(&listeners.webhooks);
    let admin_addr = addr_text(&listeners.admin);
    let service = Arc::new(WebhookService::new(
        pipeline.clone(),
        metrics.clone(),
        config.limits.clone(),
        options.clock.clone(),
    ));
    // One token: the listener stops accepting at the moment readiness turns 503.
    let webhooks = tokio::spawn(serve_webhooks(
        listeners.webhooks,
        tls.clone(),
        service,
        shutting_down.clone(),
        config.shutdown_grace,
    ));
    let stop_admin = CancellationToken::new();
    // Probes and scrapers need few connections; the webhook cap must not starve them, nor
    // they it.
    let admin_limits = crate::config::Limits {
        max_connections: ADMIN_MAX_CONNECTIONS,
        ..config.limits.clone()
    };
    let admin_task = tokio::spawn(serve_admin(
        listeners.admin,
        admin,
        admin_limits,
        stop_admin.clone(),
    ));
    tracing::info!(
        addr = %webhook_addr,
        admin_addr = %admin_addr,
        tls = tls.is_some(),
        "listening"
    );

    shutdown.await;
    shutting_down.cancel();
    // A walk stops between two events; what it published is marked before the flush.
    stop_reconcile.cancel();
    reconcilers.finish(config.shutdown_grace).await;
    // serve_webhooks returns once in-flight requests finished or the grace ran out.
    let _ = webhooks.await;
    if !pipeline.finish_running(config.shutdown_grace).await {
        tracing::warn!("deliveries still running at the end of the shutdown grace");
    }
    stop_background.cancel();
    let _ = drainer.await;
    if let Err(error) = state.write_now() {
        tracing::error!(%error, "state journal write at shutdown failed");
    }
    if let Err(error) = store.flush().await {
        tracing::error!(%error, "store flush at shutdown failed");
    }
    publisher.close().await;
    stop_admin.cancel();
    let _ = admin_task.await;
    tracing::info!("shutdown complete");
    Ok(())
}

/// Keeps the state store's health flag current while no requests flow, so `/readyz` tells.
async fn ping_loop(state: Arc<StateStore>, stop: CancellationToken) {
    let mut was_healthy = true;
    loop {
        let probe = state.ping().await;
        if probe.is_ok() != was_healthy {
            match &probe {
                Ok(()) => tracing::info!("state store takes writes again"),
                Err(error) => tracing::error!(
                    %error,
                    "state store unreachable or refusing writes; answering 503 until it is back"
                ),
            }
            was_healthy = probe.is_ok();
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

async fn sweep_loop(
    state: Arc<StateStore>,
    clock: Clock,
    every: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let state = state.clone();
        let now_ms = clock();
        // sled calls block; a sweep of millions of marks must not hold a runtime worker.
        match tokio::task::spawn_blocking(move || state.sweep(now_ms)).await {
            Ok(Ok(n)) if n > 0 => tracing::debug!(removed = n, "expired marks swept"),
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "sweep failed"),
            Err(error) => tracing::warn!(%error, "sweep task failed"),
        }
    }
}

/// Re-reads secrets and the certificate on SIGHUP, and whenever their files change.
async fn reload_loop(
    routes: Vec<Arc<RouteRuntime>>,
    metrics: Arc<Metrics>,
    tls: Option<Arc<TlsReloader>>,
    poll: Duration,
    stop: CancellationToken,
) {
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let hup_recv = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let hup_recv = std::future::pending::<()>();
        let by_signal = tokio::select! {
            _ = stop.cancelled() => return,
            _ = hup_recv => true,
            _ = tokio::time::sleep(poll) => false,
        };
        for route in &routes {
            if !by_signal && route.secrets.files().next().is_none() {
                continue;
            }
            let name = &route.config.name;
            match route.secrets.reload() {
                Ok(true) => {
                    tracing::info!(route = %name, "secrets reloaded");
                    for source in route.secrets.short() {
                        tracing::warn!(route = %name, %source, min_bytes = crate::ingress::secrets::MIN_SECRET_BYTES, "secret shorter than 16 bytes: use a long random key");
                    }
                }
                Ok(false) => {}
                Err(error) => {
                    // An operator must act: the rotation they made is not in force.
                    metrics
                        .secret_reload_failures
                        .get_or_create(&crate::metrics::RouteLabel {
                            route: name.clone(),
                        })
                        .inc();
                    tracing::error!(route = %name, %error, "secret reload refused; keeping the previous secrets")
                }
            }
        }
        if let Some(tls) = &tls {
            match tls.reload_if_changed() {
                Ok(true) => tracing::info!("TLS certificate reloaded"),
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%error, "TLS reload failed; keeping the previous certificate")
                }
            }
        }
    }
}
