//! [`Live`]: one broker connection, the queue its channel owners take publishes from, and
//! the token that ends them when the connection is left.

use std::time::Duration;

use lapin::options::ConfirmSelectOptions;
use lapin::types::ShortString;
use lapin::{Channel, Connection};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::job::Job;
use super::publish_error::PublishError;

/// How long a clean close may take before the connection is dropped as it is.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// One connection and the queue its owners take publishes from.
pub(super) struct Live {
    connection: Connection,
    /// The node's position in the list of nodes.
    node: usize,
    jobs: mpsc::UnboundedSender<Job>,
    /// Cancelled when this connection is left: its owners end, and the publishes still
    /// queued are dropped (their callers see `NotConnected`).
    gone: CancellationToken,
}

impl Live {
    /// A connection to the node at position `node`, with the sending end of its queue;
    /// `gone` is cancelled when the connection is left.
    pub(super) fn new(
        connection: Connection,
        node: usize,
        jobs: mpsc::UnboundedSender<Job>,
        gone: CancellationToken,
    ) -> Self {
        Self {
            connection,
            node,
            jobs,
            gone,
        }
    }

    /// Queues `job` for this connection's owners.
    pub(super) fn submit(&self, job: Job) -> Result<(), PublishError> {
        self.jobs.send(job).map_err(|_| PublishError::NotConnected)
    }

    /// Opens a confirm-mode channel on this connection.
    pub(super) async fn open_channel(&self) -> Result<Channel, lapin::Error> {
        let channel = self.connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(channel)
    }

    /// The lapin connection, for its events and its status.
    pub(super) fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Cancelled when this connection is left.
    pub(super) fn gone(&self) -> &CancellationToken {
        &self.gone
    }

    /// The node's position in the list of nodes (`amqp.urls`; 0 for `amqp.url`).
    pub(super) fn node(&self) -> usize {
        self.node
    }

    /// Ends the owners and closes the connection, waiting at most [`CLOSE_TIMEOUT`].
    pub(super) async fn close(&self, reason: ShortString) {
        self.gone.cancel();
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.connection.close(200, reason)).await;
    }
}
