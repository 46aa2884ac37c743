//! # What arrives
//!
//! A delivery as read off the wire becomes an event: its signature is checked over the raw
//! body against the route's secrets, then the event is read out of the verified body.
//!
//! ## What it promises
//!
//! Nothing is parsed before the signature is verified: only [`event::Delivery::verify`]
//! makes the `Verified` that [`event::parse`] takes. The fields the route reads are read in
//! one pass over the body ([`fields`]). Pure, apart from reading secrets ([`secrets`]).
//!
//! ## Where to start reading
//!
//! [`event`]: `Delivery` → `Verified` → `Event`, and the request id of each delivery; then
//! [`secrets`] (the route's secrets and their reload) and [`trace`] (W3C trace context).
//! The signature schemes themselves are the senders' ([`crate::providers`]).

pub mod event;
pub mod fields;
pub mod secrets;
pub mod trace;
