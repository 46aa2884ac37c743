//! What leaves: the AMQP message, its publication with a confirm, and the durable spool
//! in front of the broker.

pub mod message;
pub mod publish;
pub mod spool;
