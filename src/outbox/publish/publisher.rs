//! [`Publisher`], the handle callers publish through: it encodes a message, queues it for
//! the current connection's owners and waits for the broker's answer or the deadline.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tokio_util::sync::CancellationToken;

use super::connection;
use super::job::Job;
use super::link::Link;
use super::nodes::BrokerNodes;
use super::properties::{properties, short, short_constant};
use super::publish_error::PublishError;
use crate::config::Amqp;
use crate::metrics::Metrics;
use crate::outbox::message::Message;

/// A handle to the broker connection; cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    link: Arc<Link>,
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
        let link = Arc::new(Link {
            config,
            nodes,
            live: RwLock::new(None),
            blocked: AtomicBool::new(false),
            metrics,
            connected: tokio::sync::Notify::new(),
            became_blocked: tokio::sync::Notify::new(),
            next_id: AtomicU64::new(1),
        });
        tokio::spawn(connection::run(link.clone(), stop));
        Self { link }
    }

    /// Whether a connection is up and not blocked.
    pub fn is_connected(&self) -> bool {
        self.link.current().is_some() && !self.link.blocked.load(Ordering::Relaxed)
    }

    /// Waits until a connection is up (or returns at once if it is).
    pub async fn wait_connected(&self) {
        let notified = self.link.connected.notified();
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
        if self.link.blocked.load(Ordering::Relaxed) {
            return Err(PublishError::Blocked);
        }
        // Built before looking for a connection: a message that cannot be encoded fails the
        // same way whether or not the broker is there.
        let routing_key =
            short(msg.routing_key.as_ref()).ok_or(PublishError::Unfit("the routing key"))?;
        let id = self.link.next_id.fetch_add(1, Ordering::Relaxed);
        let properties = properties(msg, id)?;
        // The exchange name is checked when the config is loaded; should it not fit, every
        // message fails alike, which is a broker-side fault and not one to park them for.
        let exchange = short(exchange)
            .ok_or_else(|| PublishError::Channel("the exchange name is too long".into()))?;
        let live = self.link.current().ok_or(PublishError::NotConnected)?;
        let started = tokio::time::Instant::now();
        let deadline = started + self.link.config.confirm_timeout;
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job = Job {
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
        self.link
            .metrics
            .publish_duration
            .observe(started.elapsed().as_secs_f64());
        result
    }

    /// Closes the connection cleanly (at shutdown).
    pub async fn close(&self) {
        if let Some(live) = self.link.replace(None) {
            live.close(short_constant("shutdown")).await;
        }
    }
}
