//! Where the drainer publishes ([`Sink`]: a broker, or a test's stand-in) and what a
//! refused publish comes to ([`SinkError`]): each kind has its own way in the spool.

use std::future::Future;

use crate::record::SpooledMessage;

/// Why a publish did not go through, by what the drainer does next.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// The broker is not connected, or blocks publishes: the drainer waits for it.
    #[error("broker away: {0}")]
    Away(String),
    /// No queue takes the message now: it is held apart, with its guard key.
    #[error("message unroutable: no queue bound for routing key {0}")]
    Unroutable(String),
    /// The message can never be published as it is (a field the protocol cannot carry):
    /// it is parked with this reason.
    #[error("{0}")]
    Unfit(String),
    /// The broker refused it for now (a nack, no confirm in time, a channel error): tried
    /// again after a pause.
    #[error("{0}")]
    Refused(String),
}

/// Where the drainer publishes.
pub trait Sink: Clone + Send + Sync + 'static {
    /// Whether a publish can be tried now.
    fn is_connected(&self) -> bool;
    /// Resolves when a connection is up.
    fn wait_connected(&self) -> impl Future<Output = ()> + Send;
    /// Publishes `msg` and waits for the broker's confirm.
    fn publish<'a>(
        &'a self,
        exchange: &'a str,
        msg: &'a SpooledMessage<'a>,
    ) -> impl Future<Output = Result<(), SinkError>> + Send + 'a;
}
