//! # The broker side
//!
//! Publishes messages to RabbitMQ and says, for each, whether the broker took it: one
//! connection (to the first of the broker nodes that answers), confirm-mode channels each
//! owned by one task, a confirm and a return paired with their own publish, reconnect with
//! backoff (to the next node of a cluster). The one module that speaks lapin.
//!
//! ## What it promises
//!
//! A publish is `Ok` only when the broker confirmed it and returned nothing for it; every
//! other outcome is a [`PublishError`], within `confirm_timeout`. While no connection is up
//! a publish fails at once, so the caller can spool without waiting for a reconnect.
//!
//! ## Where to start reading
//!
//! [`Publisher`] (`publisher.rs`) is what callers hold; it queues a `job` for the current
//! connection (`live`). The connection task (`connection`) connects, opens the channels
//! and watches the connection, declaring the `exchange`; per channel one owner task (`owner`) alone publishes, in
//! batches, and answers each publish once the broker has decided all of its batch. What
//! they share is the `link`; the message's AMQP properties are built in `properties`.

mod connection;
mod exchange;
mod job;
mod link;
mod live;
mod nodes;
mod owner;
mod properties;
mod publish_error;
mod publisher;

pub use exchange::declare_exchange;
pub use nodes::{BrokerNodes, NodeUrlError};
pub use properties::properties;
pub use publish_error::PublishError;
pub use publisher::Publisher;
