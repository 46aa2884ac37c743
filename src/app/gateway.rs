//! The running gateway: its parts started in order, both listeners served, and the drain
//! at shutdown that stops them in order.

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::app_error::AppError;
use super::loops::{ping_loop, reload_loop, sweep_loop};
use super::options::{Listeners, Options};
use super::prepare::Prepared;
use crate::config::{Config, Limits};
use crate::http::admin_endpoints::{Admin, Health};
use crate::http::serve_admin;
use crate::http::token::AdminToken;
use crate::http::webhook::{serve_webhooks, WebhookService};
use crate::inspect::Inspector;
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::outbox::publish::{BrokerNodes, Publisher};
use crate::outbox::spooling::Spool;
use crate::outbox::Outbox;
use crate::pipeline::{CompiledRoute, Pipeline, PipelineSettings, RouteRuntime};
use crate::reconcile::{Parts as ReconcileParts, Reconcilers};
use crate::state::{BackendChoice, StateStore};
use crate::tls::TlsReloader;
use durable_spool::Store;

/// Connections the admin listener accepts at once.
const ADMIN_MAX_CONNECTIONS: NonZeroUsize = match NonZeroUsize::new(64) {
    Some(n) => n,
    None => NonZeroUsize::MIN,
};

/// Serves until `shutdown` completes, then drains: readiness 503, stop accepting, finish
/// in-flight requests within `shutdown_grace`, flush the store, close the broker.
pub async fn serve(
    prepared: Prepared,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
    options: Options,
) -> Result<(), AppError> {
    let Prepared { resolved, store } = prepared;
    let gateway = Gateway::start(
        resolved.config,
        &resolved.backend,
        resolved.nodes,
        store,
        resolved.routes,
        resolved.tls,
        &options,
    )?;
    let servers = gateway.listen(listeners, resolved.admin_token, &options);
    shutdown.await;
    gateway.drain(servers).await;
    tracing::info!("shutdown complete");
    Ok(())
}

/// The running parts behind the listeners, with the tokens that stop them in order.
struct Gateway {
    config: Config,
    store: Store,
    tls: Option<Arc<TlsReloader>>,
    metrics: Arc<Metrics>,
    publisher: Publisher,
    spool: Arc<Spool>,
    state: Arc<StateStore>,
    pipeline: Arc<Pipeline>,
    reconcilers: Arc<Reconcilers>,
    drainer: JoinHandle<()>,
    /// Stops the reconcilers' walks, as soon as shutdown begins.
    stop_reconcile: CancellationToken,
    /// Stops the publisher, the drainer and the loops, once the requests finished.
    stop_background: CancellationToken,
}

/// The listeners' tasks and the tokens that stop them.
struct Servers {
    webhooks: JoinHandle<()>,
    admin: JoinHandle<()>,
    /// One token: the webhook listener stops accepting at the moment readiness turns 503.
    shutting_down: CancellationToken,
    /// The admin listener stops last, so probes and scrapes see the whole drain.
    stop_admin: CancellationToken,
}

impl Gateway {
    /// Opens the spool and the state store, builds the pipeline and starts the publisher,
    /// the reconcilers, the spool drainer and the background loops.
    fn start(
        config: Config,
        backend: &BackendChoice,
        nodes: BrokerNodes,
        store: Store,
        routes: Vec<CompiledRoute>,
        tls: Option<Arc<TlsReloader>>,
        options: &Options,
    ) -> Result<Self, AppError> {
        let metrics = Arc::new(Metrics::new());
        let routes = route_runtimes(routes, &metrics, options);
        let stop_background = CancellationToken::new();
        let publisher = Publisher::start(
            config.amqp.clone(),
            nodes,
            metrics.clone(),
            stop_background.clone(),
        );
        let spool = open_spool(&store, &config, &metrics, &options.liveness)?;
        let state = open_state(backend, &config, &store, options, &stop_background)?;
        let exchange = &config.amqp.exchange;
        let outbox = Outbox::new(publisher.clone(), spool.clone(), exchange.clone());
        let pipeline = Arc::new(Pipeline::new(
            PipelineSettings::of(&config),
            routes.clone(),
            state.clone(),
            outbox,
            (
                metrics.store_errors.clone(),
                metrics.store_sync_duration.clone(),
            ),
            options.clock.clone(),
        ));
        let stop_reconcile = CancellationToken::new();
        let reconcile_parts = ReconcileParts {
            pipeline: pipeline.clone(),
            state: state.clone(),
            metrics: metrics.clone(),
            clock: options.clock.clone(),
        };
        let reconcilers = start_reconcilers(&routes, &reconcile_parts, &stop_reconcile)?;
        let drainer = tokio::spawn(spool.clone().run_drainer(
            publisher.clone(),
            exchange.clone(),
            stop_background.clone(),
        ));
        let gateway = Self {
            config,
            store,
            tls,
            metrics,
            publisher,
            spool,
            state,
            pipeline,
            reconcilers,
            drainer,
            stop_reconcile,
            stop_background,
        };
        gateway.spawn_loops(routes, options);
        Ok(gateway)
    }

    /// The sweep of expired marks and the reload of secrets and the certificate.
    fn spawn_loops(&self, routes: Vec<Arc<RouteRuntime>>, options: &Options) {
        tokio::spawn(sweep_loop(
            self.state.clone(),
            options.clock.clone(),
            options.sweep_interval,
            self.stop_background.clone(),
        ));
        tokio::spawn(reload_loop(
            routes,
            self.metrics.clone(),
            self.tls.clone(),
            self.config.reload_poll,
            self.stop_background.clone(),
        ));
    }

    /// Starts serving both listeners.
    fn listen(
        &self,
        listeners: Listeners,
        admin_token: Option<AdminToken>,
        options: &Options,
    ) -> Servers {
        let shutting_down = CancellationToken::new();
        let admin = self.admin_api(admin_token, &shutting_down, options);
        let webhook_addr = addr_text(&listeners.webhooks);
        let admin_addr = addr_text(&listeners.admin);
        let service = Arc::new(WebhookService::new(
            self.pipeline.clone(),
            self.metrics.clone(),
            self.config.limits.clone(),
            options.clock.clone(),
        ));
        let webhooks = tokio::spawn(serve_webhooks(
            listeners.webhooks,
            self.tls.clone(),
            service,
            shutting_down.clone(),
            self.config.shutdown_grace,
        ));
        let stop_admin = CancellationToken::new();
        // Probes and scrapers need few connections; the webhook cap must not starve them, nor
        // they it.
        let admin_limits = Limits {
            max_connections: ADMIN_MAX_CONNECTIONS,
            ..self.config.limits.clone()
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
            tls = self.tls.is_some(),
            "listening"
        );
        Servers {
            webhooks,
            admin: admin_task,
            shutting_down,
            stop_admin,
        }
    }

    /// What the admin listener serves: probes, metrics, the spool and reconciliation.
    fn admin_api(
        &self,
        token: Option<AdminToken>,
        shutting_down: &CancellationToken,
        options: &Options,
    ) -> Arc<Admin> {
        Arc::new(Admin {
            health: Health {
                state: self.state.clone(),
                spool: self.spool.clone(),
                publisher: self.publisher.clone(),
                metrics: self.metrics.clone(),
                clock: options.clock.clone(),
                liveness: options.liveness.clone(),
            },
            shutdown: shutting_down.clone(),
            reconcile: self.reconcilers.clone(),
            inspector: Inspector::new(&self.config),
            token,
        })
    }

    /// Stops in order: readiness and accepting, the reconcilers' walks, the requests in
    /// flight (within `shutdown_grace`), the background tasks; then writes the state
    /// journal, flushes the store, closes the broker and stops the admin listener.
    async fn drain(self, servers: Servers) {
        let grace = self.config.shutdown_grace;
        servers.shutting_down.cancel();
        // A walk stops between two events; what it published is marked before the flush.
        self.stop_reconcile.cancel();
        self.reconcilers.finish(grace).await;
        // serve_webhooks returns once in-flight requests finished or the grace ran out.
        let _ = servers.webhooks.await;
        if !self.pipeline.finish_running(grace).await {
            tracing::warn!("deliveries still running at the end of the shutdown grace");
        }
        self.stop_background.cancel();
        let _ = self.drainer.await;
        if let Err(error) = self.state.write_now() {
            tracing::error!(%error, "state journal write at shutdown failed");
        }
        if let Err(error) = self.store.flush().await {
            tracing::error!(%error, "store flush at shutdown failed");
        }
        self.publisher.close().await;
        servers.stop_admin.cancel();
        let _ = servers.admin.await;
    }
}

/// Each route with its rate limiter and counters, shared by the pipeline, the reconcilers
/// and the reload loop.
fn route_runtimes(
    routes: Vec<CompiledRoute>,
    metrics: &Metrics,
    options: &Options,
) -> Vec<Arc<RouteRuntime>> {
    routes
        .into_iter()
        .map(|route| Arc::new(RouteRuntime::new(route, metrics, &options.clock)))
        .collect()
}

fn start_reconcilers(
    routes: &[Arc<RouteRuntime>],
    parts: &ReconcileParts,
    stop: &CancellationToken,
) -> Result<Arc<Reconcilers>, AppError> {
    Reconcilers::start(routes, parts, stop)
        .map(Arc::new)
        .map_err(|e| AppError::Reconcile(e.to_string()))
}

/// Opens the dedup and guard state store and starts its health probe.
fn open_state(
    backend: &BackendChoice,
    config: &Config,
    store: &Store,
    options: &Options,
    stop: &CancellationToken,
) -> Result<Arc<StateStore>, AppError> {
    let state = Arc::new(StateStore::open(
        backend,
        config,
        store,
        options.clock.clone(),
        &options.liveness,
    )?);
    tracing::info!(backend = state.name(), "dedup and guard state store");
    // A no-op for the local store; for Redis it keeps readiness current while no requests
    // flow.
    tokio::spawn(ping_loop(state.clone(), stop.clone()));
    Ok(state)
}

/// Opens the spool; what a previous run left in it drains once the broker is up.
fn open_spool(
    store: &Store,
    config: &Config,
    metrics: &Arc<Metrics>,
    liveness: &Liveness,
) -> Result<Arc<Spool>, AppError> {
    let spool = Arc::new(crate::outbox::spooling::open(
        store,
        &config.spool,
        metrics.clone(),
    )?);
    let watched = Arc::downgrade(&spool);
    let deadline = config.store.hung_after;
    liveness.watch(move || {
        let hung = watched.upgrade()?.hung(deadline)?;
        crate::liveness::overdue(hung.thread, hung.step, hung.busy, deadline)
    });
    let depth = spool.status(0).depth;
    if depth > 0 {
        tracing::info!(
            depth,
            "spool holds events from a previous run; draining once the broker is up"
        );
    }
    Ok(spool)
}

fn addr_text(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string())
}
