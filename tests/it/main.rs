//! Integration tests: the real binary, real TLS, real sled, the real RabbitMQ.

mod util;

mod accept;
mod check_config;
mod claims;
mod client_errors;
mod dedup;
mod docs;
mod durability;
mod fencing;
mod full_disk;
mod fuzz;
mod guard;
mod hardening;
mod inspect;
mod layout;
mod lifecycle;
mod limits;
mod metrics;
mod providers;
mod publish;
mod reconcile;
mod redis;
mod replay;
mod request_id;
mod rotation;
mod spool;
mod vectors;
mod window;
