//! [`Job`]: one publish on its way from a [`super::Publisher`] to a channel owner, and the
//! queue of them a connection's owners share.

use std::sync::Arc;

use bytes::Bytes;
use lapin::types::ShortString;
use lapin::BasicProperties;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::time::Instant;

use super::publish_error::PublishError;

/// One publish handed to the owners.
pub(super) struct Job {
    /// The `x-publish-id` the message carries.
    pub id: u64,
    pub exchange: ShortString,
    pub routing_key: ShortString,
    pub mandatory: bool,
    pub body: Bytes,
    pub properties: BasicProperties,
    /// Past this the caller has waited `confirm_timeout`: a job not yet sent is answered
    /// `Timeout` without publishing.
    pub deadline: Instant,
    pub answer: oneshot::Sender<Result<(), PublishError>>,
}

/// The queue of a connection, shared by its owners: an idle owner holds the lock while it
/// waits for the next job, so work goes to whichever channel is free.
pub(super) type Jobs = Arc<Mutex<mpsc::UnboundedReceiver<Job>>>;
