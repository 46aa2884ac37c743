//! hookgate: a webhook receiver gateway. It terminates TLS, authenticates each delivery by
//! an HMAC over the raw body, drops duplicates and stale or repeated events, and hands
//! every accepted event to RabbitMQ with publisher confirms, spooling to disk while the
//! broker is away.
//!
//! # Layout
//!
//! - [`config`]: the YAML schema, defaults and validation; no I/O beyond reading the file.
//! - [`app`]: wiring of everything below; serves until shutdown and drains in order.
//! - [`http`]: accept loops, connection limits, timeouts, and outcome → HTTP answer.
//!   The only hyper importer.
//! - [`tls`]: PEM loading and certificate reload. The only rustls importer.
//! - [`signature`]: the sender profiles' signature schemes (HMAC, ed25519) and the
//!   constant-time check; pure. [`profiles`]: the fields and guard rules each profile brings.
//! - [`secrets`]: secrets from environment or files, swapped on reload.
//! - [`event`]: the delivery, its verified form, and the event read from it;
//!   [`fields`] reads the configured JSON Pointers (or form fields) out of a body in one pass.
//! - [`pipeline`]: verify → parse → freshness → dedup → guard → publish or spool.
//! - [`dedup`]: claim / in-flight / done marks.
//! - [`journal`]: the sled backend's marks and guard state: in memory, journaled to sled.
//! - [`guard`]: the pure out-of-order decisions; [`guard_state`] wraps them with per-key
//!   locks and stored state.
//! - [`publish`]: the AMQP connection and confirm channels. The only lapin importer.
//! - [`spool`]: the durable outbox in front of the broker (in order, held apart while
//!   unroutable, parked for an operator) and its supervised drainer.
//! - [`store`]: the sled database. The only sled importer.
//! - [`state`]: the backend of dedup marks and guard state, chosen once: sled, or
//!   [`redis_store`] (the only redis importer) for several replicas.
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics`, `/spool`.
//! - [`metrics`]: the Prometheus registry.
//! - [`ratelimit`]: the per-route token bucket for verified deliveries, and the per-peer
//!   bucket for failed verifications.
//! - [`budget`]: the shared budget of body bytes held before verification.
//! - [`shutdown`]: SIGTERM / SIGINT as one future.

pub mod admin;
pub mod app;
pub mod budget;
pub mod config;
pub mod dedup;
pub mod event;
pub mod fields;
pub mod guard;
pub mod guard_state;
pub mod http;
pub mod journal;
pub mod metrics;
pub mod pipeline;
pub mod profiles;
pub mod publish;
pub mod ratelimit;
pub mod redis_store;
pub mod secrets;
pub mod shutdown;
pub mod signature;
pub mod spool;
pub mod state;
pub mod store;
pub mod tls;
