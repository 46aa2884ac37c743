//! hookgate: a webhook receiver gateway. It terminates TLS, authenticates each delivery by
//! an HMAC over the raw body, drops duplicates and stale or repeated events, and hands
//! every accepted event to RabbitMQ with publisher confirms, spooling to disk while the
//! broker is away.
//!
//! # Layout
//!
//! A request goes through [`http`] (accept loop, limits, the webhook answer), [`ingress`]
//! (the delivery, its signature, the event read from it), [`pipeline`] (freshness, claim,
//! guard, deliver, commit), [`guard`] (out-of-order rules over stored state), [`state`]
//! (dedup marks and guard state: local or Redis) and [`outbox`] (the AMQP message, the
//! publish with a confirm, the durable spool). [`config`] is the schema every part reads and
//! depends on nothing else; [`app`] builds the parts and hands each only what it needs.
//! [`inspect`] answers what the store knows about one event, request, message or contact.
//! ARCHITECTURE.md is the code map, module by module, with the layers and the invariants.

pub mod app;
pub mod budget;
pub mod clock;
pub mod config;

pub mod guard;
pub mod http;
pub mod ingress;
pub mod inspect;
pub mod liveness;
pub mod metrics;
pub mod outbox;
pub mod pipeline;
pub mod process;
pub mod providers;
pub mod ratelimit;
pub mod reconcile;
pub mod shutdown;
pub mod source;
pub mod state;
pub mod store_error;
pub mod tls;
