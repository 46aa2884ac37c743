//! # What leaves
//!
//! An accepted event leaves the request path here, and only here: published to RabbitMQ
//! with a confirm, or put in the durable spool (`crates/durable-spool`) while the broker
//! cannot take it.
//!
//! ## What it promises
//!
//! [`Outbox::deliver`] returns `Ok` only once the broker confirmed the message without
//! returning it, or its spool entry's commit returned (`fdatasync`). While the spool holds
//! anything, new events go behind it, so the broker sees each guard key's events in
//! arrival order.
//!
//! ## Where to start reading
//!
//! [`Outbox`] below; the AMQP message ([`message`]); the broker side ([`publish`]); the
//! spool's options, counters and publishing sink ([`spooling`]).

pub mod message;
pub mod publish;
pub mod spooling;

use std::sync::Arc;

use crate::outbox::message::Message;
use crate::outbox::publish::{PublishError, Publisher};
use crate::outbox::spooling::{Spool, SpoolError};

/// Where an accepted event went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// The broker confirmed it.
    Published,
    /// It is on disk in the spool, to be published later.
    Spooled,
    /// It is on disk in the spool's held area: unroutable (no queue bound for it), or behind
    /// an event of its guard key that is; published once a queue takes it.
    Held,
}

/// The publish-or-spool step: the only way an accepted event leaves the request path.
pub struct Outbox {
    publisher: Publisher,
    spool: Arc<Spool>,
    exchange: String,
}

impl Outbox {
    /// Publishes to `exchange` through `publisher`, spooling to `spool`.
    pub fn new(publisher: Publisher, spool: Arc<Spool>, exchange: String) -> Self {
        Self {
            publisher,
            spool,
            exchange,
        }
    }

    /// Publishes with a confirm, or spools. While the spool holds anything in order, new
    /// events go behind it so the broker sees them in arrival order. An unroutable event,
    /// and a later event of a guard key with events held (or with a failed push that may
    /// still come back, [`Spool::holds_key`]), go to the spool's held area, apart from the
    /// rest.
    pub async fn deliver(&self, msg: &Message<'_>) -> Result<Delivered, SpoolError> {
        if self.spool.is_empty() {
            if msg
                .order_key
                .as_deref()
                .is_some_and(|k| self.spool.holds_key(k))
            {
                return self.spool.push_held(msg).await.map(|()| Delivered::Held);
            }
            // Boxed: lapin's publish future is over a kilobyte, needed only while publishing.
            match Box::pin(self.publisher.publish(&self.exchange, msg)).await {
                Ok(()) => return Ok(Delivered::Published),
                Err(error @ PublishError::Unroutable(_)) => {
                    tracing::error!(%error, event_id = %msg.message_id, "unroutable event spooled apart until a queue is bound; bind a queue to the exchange");
                    return self.spool.push_held(msg).await.map(|()| Delivered::Held);
                }
                Err(PublishError::NotConnected) => {}
                Err(error) => {
                    tracing::warn!(%error, event_id = %msg.message_id, "publish failed; spooling")
                }
            }
        }
        self.spool.push(msg).await.map(|()| Delivered::Spooled)
    }

    /// The audit copy of a dropped event: best effort, never spooled, so an audit key with
    /// no queue bound cannot block the spool.
    pub async fn publish_audit(&self, msg: &Message<'_>) {
        if let Err(error) = self.publisher.publish_audit(&self.exchange, msg).await {
            tracing::warn!(%error, event_id = %msg.message_id, "audit copy of a dropped event not published");
        }
    }
}
