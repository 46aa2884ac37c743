//! # Wiring
//!
//! Turns a config into a running gateway: everything that can fail on a bad secret,
//! certificate, URL or store is loaded before any port is bound, then the parts start, both
//! listeners serve until shutdown, and the parts drain in order.
//!
//! ## Where to start reading
//!
//! [`prepare`] (`check` and `prepare`: the start-up before the ports); `gateway`
//! (`serve`: the parts started, served, drained); `loops` (the background loops: broker
//! pings, secret and certificate reloads, the sweep of expired marks); [`AppError`] says
//! which exit code a failure means.

mod app_error;
mod gateway;
mod loops;
mod options;
mod prepare;

pub use app_error::AppError;
pub use gateway::serve;
pub use options::{Listeners, Options};
pub use prepare::{check, prepare, Lookups, Prepared};
