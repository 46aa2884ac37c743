//! # The out-of-order guard
//!
//! Drops the events that would move a contact or a message backwards: a `sent` after
//! `delivered`, a second STOP, a delayed START older than the newest STOP, a HELP flood.
//!
//! ## What it promises
//!
//! Events of one guard key (a message id, or a contact and channel) are decided one at a
//! time: a check takes the key's lock and holds it until the caller commits (after the
//! broker or the spool took the event) or drops the check (a failed publish leaves the
//! state unchanged). A dropped event leaves the state as it was, and the key remembers the
//! drop for `hookgate inspect`.
//!
//! ## Where to start reading
//!
//! [`decide`] holds the rules as pure functions of (stored state, event): read it first.
//! `rules` compiles a route's `guard` section; `checks` runs a decision against the
//! stored state under the key's lock; [`stored`] is the state's stored form and expiry.

mod checks;
pub mod decide;
mod rules;
pub mod stored;

pub use checks::{Check, GuardState, Held, Judging};
pub use rules::RouteGuard;
