//! Failover tests: servers of the tests' own on loopback, stopped under load.

// The integration tests' harness (the real binary, signing, metrics); not all of it is used.
#[allow(unused_imports)]
#[path = "../it/util/mod.rs"]
mod util;

mod rabbitmq;
