//! Integration tests: the real binary, real TLS, real sled, the real RabbitMQ.

mod util;

mod accept;
mod dedup;
mod guard;
mod ops;
mod redis;
mod spool;
