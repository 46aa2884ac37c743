//! What leaves: the AMQP message, its publication with a confirm, and the durable spool
//! in front of the broker with the on-disk record of a spooled message.

pub mod message;
pub mod publish;
pub mod record;
pub mod spool;
