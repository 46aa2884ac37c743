//! The background loops of a running gateway: the state store's health probe, the sweep of
//! expired marks, and the reload of secrets and the certificate.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::prepare::warn_short_secrets;
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::pipeline::RouteRuntime;
use crate::state::StateStore;
use crate::tls::TlsReloader;

/// Keeps the state store's health flag current while no requests flow, so `/readyz` tells.
pub(super) async fn ping_loop(state: Arc<StateStore>, stop: CancellationToken) {
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

/// Removes expired marks every `every`.
pub(super) async fn sweep_loop(
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
        // The local store sweeps in place: a sweep of millions of marks must not hold a runtime
        // worker.
        match tokio::task::spawn_blocking(move || state.sweep(now_ms)).await {
            Ok(Ok(n)) if n > 0 => tracing::debug!(removed = n, "expired marks swept"),
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "sweep failed"),
            Err(error) => tracing::warn!(%error, "sweep task failed"),
        }
    }
}

/// Re-reads secrets and the certificate on SIGHUP, and whenever their files change.
pub(super) async fn reload_loop(
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
            // A poll reads only secrets kept in files; a signal re-reads every source.
            if by_signal || route.secrets.files().next().is_some() {
                reload_secrets(route, &metrics);
            }
        }
        if let Some(tls) = &tls {
            reload_tls(tls);
        }
    }
}

fn reload_secrets(route: &RouteRuntime, metrics: &Metrics) {
    let name = &route.config.name;
    match route.secrets.reload() {
        Ok(true) => {
            tracing::info!(route = %name, "secrets reloaded");
            warn_short_secrets(name, &route.secrets);
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

fn reload_tls(tls: &TlsReloader) {
    match tls.reload_if_changed() {
        Ok(true) => tracing::info!("TLS certificate reloaded"),
        Ok(false) => {}
        Err(error) => {
            tracing::warn!(%error, "TLS reload failed; keeping the previous certificate")
        }
    }
}
