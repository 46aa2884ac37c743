//! SIGTERM / SIGINT as futures: Kubernetes sends SIGTERM to start a graceful shutdown, and a
//! second signal ends the process at once with the shell's code for it.

use std::future::Future;

/// A signal that asks the gateway to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM (15): what Kubernetes and `docker stop` send.
    Terminate,
    /// SIGINT (2): Ctrl-C.
    Interrupt,
}

impl Signal {
    /// The exit code of a process ended by this signal, 128 + its number, as a shell
    /// reports it: 143 for SIGTERM, 130 for SIGINT.
    pub fn exit_code(self) -> u8 {
        match self {
            Signal::Terminate => 128 + 15,
            Signal::Interrupt => 128 + 2,
        }
    }
}

/// The SIGTERM and SIGINT handlers, installed once and read signal after signal: one that
/// arrives between two reads is held for the next one, never lost.
pub struct Signals {
    #[cfg(unix)]
    streams: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Installs the handlers now, so a signal that arrives while the gateway is still
    /// starting is held instead of ending the process. Call it inside the runtime.
    pub fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let streams = match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(term), Ok(int)) => Some((term, int)),
                _ => None,
            };
            Self { streams }
        }
        #[cfg(not(unix))]
        {
            Self {}
        }
    }

    /// The next SIGTERM or SIGINT. Where the handlers could not be installed, Ctrl-C.
    pub async fn next(&mut self) -> Signal {
        #[cfg(unix)]
        if let Some((term, int)) = &mut self.streams {
            return tokio::select! {
                _ = term.recv() => {
                    tracing::info!("SIGTERM received; shutting down");
                    Signal::Terminate
                }
                _ = int.recv() => {
                    tracing::info!("SIGINT received; shutting down");
                    Signal::Interrupt
                }
            };
        }
        let _ = tokio::signal::ctrl_c().await;
        Signal::Interrupt
    }
}

/// A future that completes on the first SIGTERM or SIGINT. The handlers are installed when
/// this is called, not when the future is first polled. Call it inside the runtime.
pub fn signal() -> impl Future<Output = Signal> {
    let mut signals = Signals::install();
    async move { signals.next().await }
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
