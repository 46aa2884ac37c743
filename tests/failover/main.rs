//! Failover tests: hookgate under load while servers of the tests' own on loopback (a Redis
//! Sentinel group, a Redis Cluster, RabbitMQ clusters of two and three nodes) fail over.
//! Heavier than `tests/it`: every test starts its servers on loopback ports of its own.

// The integration tests' harness (gateway, broker, signatures); this binary uses a part.
#[path = "../it/util/mod.rs"]
#[allow(unused_imports)]
mod util;

mod redis_servers;

mod cluster;
mod rabbitmq;
mod sentinel;
mod wait;
