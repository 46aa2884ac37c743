//! HTTP: the gateway's two listeners.
//!
//! The webhook listener takes deliveries from the senders: it matches the route, enforces
//! the method, the per-peer limit and the body limits, hands the delivery to the
//! [`Pipeline`](crate::pipeline::Pipeline) and maps its
//! [`Outcome`](crate::pipeline::Outcome) to a status, a JSON body and `X-Request-Id`. The
//! admin listener serves the probes, the metrics and the operators' endpoints.
//!
//! # Guarantees
//!
//! - The only module that imports hyper; the rest of the gateway sees plain types.
//! - A connection is bounded: at most `max_connections` at once, one deadline from accept
//!   to its first complete request head, then idle and age limits; a peer cannot park more
//!   than one body's bytes in hyper's buffers per HTTP/2 connection.
//! - A delivery runs to its end once handed to the pipeline, even if its client goes away.
//!
//! # Where to start
//!
//! `webhook.rs` serves the webhook endpoint and maps outcomes to answers;
//! `admin_endpoints.rs` answers the admin endpoints and `admin_listener.rs` serves them,
//! allowing changes only to a loopback peer with the token (`token.rs`). Both listeners
//! run on `connections.rs` (the accept loop and one task per connection), which closes
//! connections at the deadlines of `deadlines.rs` and asks them to close when the listener
//! stops (`close_requests.rs`).

pub mod admin_endpoints;
mod admin_listener;
mod close_requests;
mod connections;
mod deadlines;
pub mod token;
pub mod webhook;

pub use admin_listener::serve_admin;
pub use connections::FullResponse;
