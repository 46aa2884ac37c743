//! SIGTERM / SIGINT as one future: Kubernetes sends SIGTERM to start a graceful shutdown.

use std::future::Future;

/// A future that completes on the first SIGTERM or SIGINT. The handlers are installed when
/// this is called, not when the future is first polled: a signal that arrives while the
/// gateway is still starting is held for it instead of ending the process. Call it inside
/// the runtime.
pub fn signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    let streams = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        )
    };
    async move {
        #[cfg(unix)]
        match streams {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
                    _ = int.recv() => tracing::info!("SIGINT received; shutting down"),
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Installs a SIGHUP handler (the reload task listens later); until then a SIGHUP is
/// ignored instead of ending the process.
pub async fn claim_sighup() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        // Once tokio has registered the signal, its disposition stays replaced for the life of
        // the process, even after this stream is dropped.
        if let Err(error) = signal(SignalKind::hangup()) {
            tracing::warn!(%error, "cannot install a SIGHUP handler");
        }
    }
}
