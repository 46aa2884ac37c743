//! Failover tests: hookgate replicas under load while the servers behind them fail over.
//! Heavier than `tests/it`: every test starts servers of its own on loopback ports.

// The integration tests' harness (gateway, broker, signatures); this binary uses a part.
#[path = "../it/util/mod.rs"]
#[allow(unused_imports)]
mod util;

mod redis_servers;

mod cluster;
mod sentinel;
