//! Why a publish failed: the one error the broker side reports to its callers.

/// Why the broker did not take a message. Every kind is retried later (spool or 503).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    #[error("broker not connected")]
    NotConnected,
    #[error("broker has blocked the connection")]
    Blocked,
    #[error("broker nacked the message")]
    Nack,
    #[error("message unroutable: no queue bound for routing key {0}")]
    Unroutable(String),
    /// A field of this message can never be sent: retrying cannot help.
    #[error("{0} does not fit an AMQP short string (255 bytes)")]
    Unfit(&'static str),
    #[error("no confirm within the timeout")]
    Timeout,
    #[error("channel error: {0}")]
    Channel(String),
}
