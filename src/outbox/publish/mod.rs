//! The RabbitMQ side: one connection (to the first of the broker nodes that answers),
//! confirm-mode channels each owned by one task, a confirm and a return paired with their
//! own publish, reconnect with backoff (to the next node of a cluster).
//!
//! A background task owns the connection ([`connection`]); per channel one owner task
//! ([`owner`]) alone publishes, in batches, and answers each publish once the broker has
//! decided all of its batch. Publishers hand their message to the owners through a queue
//! of the current connection; while there is none they fail at once, so the caller can
//! spool without waiting for a reconnect.

mod connection;
mod nodes;
mod owner;
mod properties;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Amqp;
use crate::metrics::Metrics;
use crate::outbox::message::Message;
use connection::Live;
pub use nodes::{BrokerNodes, NodeUrlError};
pub use properties::properties;
use properties::{short, short_constant};

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

struct Inner {
    config: Amqp,
    nodes: BrokerNodes,
    live: RwLock<Option<Arc<Live>>>,
    blocked: AtomicBool,
    metrics: Arc<Metrics>,
    /// Woken when a connection comes up, so the spool drainer need not poll.
    connected: tokio::sync::Notify,
    /// Woken when the broker blocks the connection, so owners waiting for confirms give up
    /// at once instead of at `confirm_timeout`.
    became_blocked: tokio::sync::Notify,
    /// The next publish id (header `x-publish-id`): one counter for the process, so no two
    /// publishes in flight anywhere share one.
    next_id: AtomicU64,
}

/// A handle to the broker connection; cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

impl Publisher {
    /// Starts the connection task. A broker that is down is not an error: the task keeps
    /// trying with capped, jittered backoff until `stop` is cancelled.
    pub fn start(
        config: Amqp,
        nodes: BrokerNodes,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> Self {
        let inner = Arc::new(Inner {
            config,
            nodes,
            live: RwLock::new(None),
            blocked: AtomicBool::new(false),
            metrics,
            connected: tokio::sync::Notify::new(),
            became_blocked: tokio::sync::Notify::new(),
            next_id: AtomicU64::new(1),
        });
        tokio::spawn(connection::run(inner.clone(), stop));
        Self { inner }
    }

    /// Whether a connection is up and not blocked.
    pub fn is_connected(&self) -> bool {
        self.inner.current().is_some() && !self.inner.blocked.load(Ordering::Relaxed)
    }

    /// Waits until a connection is up (or returns at once if it is).
    pub async fn wait_connected(&self) {
        let notified = self.inner.connected.notified();
        if self.is_connected() {
            return;
        }
        notified.await;
    }

    /// Publishes and waits for the broker's confirm. Only an ack with no return paired to
    /// this publish is success: a returned (unroutable) message is an error even though the
    /// broker acks it.
    pub async fn publish(&self, exchange: &str, msg: &Message<'_>) -> Result<(), PublishError> {
        self.publish_with(exchange, msg, true).await
    }

    /// Publishes an audit copy: not `mandatory`, so an audit key nobody binds is not an error.
    pub async fn publish_audit(
        &self,
        exchange: &str,
        msg: &Message<'_>,
    ) -> Result<(), PublishError> {
        self.publish_with(exchange, msg, false).await
    }

    async fn publish_with(
        &self,
        exchange: &str,
        msg: &Message<'_>,
        mandatory: bool,
    ) -> Result<(), PublishError> {
        if self.inner.blocked.load(Ordering::Relaxed) {
            return Err(PublishError::Blocked);
        }
        // Built before looking for a connection: a message that cannot be encoded fails the
        // same way whether or not the broker is there.
        let routing_key =
            short(msg.routing_key.as_ref()).ok_or(PublishError::Unfit("the routing key"))?;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let properties = properties(msg, id)?;
        // The exchange name is checked when the config is loaded; should it not fit, every
        // message fails alike, which is a broker-side fault and not one to park them for.
        let exchange = short(exchange)
            .ok_or_else(|| PublishError::Channel("the exchange name is too long".into()))?;
        let live = self.inner.current().ok_or(PublishError::NotConnected)?;
        let started = tokio::time::Instant::now();
        let deadline = started + self.inner.config.confirm_timeout;
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job = owner::Job {
            id,
            exchange,
            routing_key,
            mandatory,
            body: msg.body.clone(),
            properties,
            deadline,
            answer,
        };
        live.submit(job)?;
        // An owner answers every job it takes; a job still queued when its connection goes
        // is dropped, and so is its answer. The caller waits no longer than its deadline,
        // whatever the owners do (a batch taken just before the deadline, owners waiting
        // for a channel while the broker blocks the connection): the claims it holds are
        // leases, bounded by `confirm_timeout`. A job still queued then is dropped unsent
        // by the owner that takes it (its caller is gone, its deadline past); one already
        // sent may still be confirmed, and counts as not published (the spool or the
        // sender's retry makes the at-least-once copy).
        let result = match tokio::time::timeout_at(deadline, answered).await {
            Ok(answer) => answer.unwrap_or(Err(PublishError::NotConnected)),
            Err(_) => Err(PublishError::Timeout),
        };
        self.inner
            .metrics
            .publish_duration
            .observe(started.elapsed().as_secs_f64());
        result
    }

    /// Closes the connection cleanly (at shutdown).
    pub async fn close(&self) {
        if let Some(live) = self.inner.replace(None) {
            live.close(short_constant("shutdown")).await;
        }
    }
}

impl Inner {
    /// The connection in the slot, if any.
    fn current(&self) -> Option<Arc<Live>> {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts `live` in the slot and returns what was there; the `broker_connected` gauge
    /// follows the slot, so it cannot disagree with it. A block belongs to the connection
    /// it was sent on, so it ends with it.
    fn replace(&self, live: Option<Arc<Live>>) -> Option<Arc<Live>> {
        let mut slot = self.live.write().unwrap_or_else(PoisonError::into_inner);
        self.metrics.broker_connected.set(i64::from(live.is_some()));
        self.metrics
            .broker_node
            .set(live.as_ref().map_or(-1, |l| node_gauge(l.node())));
        self.set_blocked(false);
        std::mem::replace(&mut *slot, live)
    }

    /// Empties the slot only if it still holds `failed`: the connection task may already
    /// have put a new connection there.
    fn clear_if(&self, failed: &Arc<Live>) {
        let mut slot = self.live.write().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|l| Arc::ptr_eq(l, failed)) {
            *slot = None;
            self.metrics.broker_connected.set(0);
            self.metrics.broker_node.set(-1);
            self.set_blocked(false);
        }
    }

    /// Records whether the broker blocks publishing on the current connection.
    fn set_blocked(&self, blocked: bool) {
        self.blocked.store(blocked, Ordering::Relaxed);
        self.metrics.broker_blocked.set(i64::from(blocked));
        if blocked {
            self.became_blocked.notify_waiters();
        }
    }

    fn is_blocked(&self) -> bool {
        self.blocked.load(Ordering::Relaxed)
    }

    fn holds(&self, live: &Arc<Live>) -> bool {
        self.current().is_some_and(|l| Arc::ptr_eq(&l, live))
    }
}

/// A node's position as a gauge value (a list of nodes is never that long).
fn node_gauge(node: usize) -> i64 {
    i64::try_from(node).unwrap_or(i64::MAX)
}

/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
