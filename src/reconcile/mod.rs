//! Reconciliation: what the webhook missed, found in the sender's list API (contract §10).
//!
//! A webhook may never arrive. For each route with a `reconcile:` block a task walks the
//! sender's list API every `interval` and hands each listed message, made into the event
//! the webhook would have brought, to the same [`Pipeline`](crate::pipeline::Pipeline):
//! what was published before is a duplicate, what was missed is published once. An
//! operator's replay walks a window the same way and publishes it again.
//!
//! # Guarantees
//!
//! - One replica walks a route at a time: the one holding the route's lease in the state
//!   store; a walk whose lease is lost stops.
//! - Where a walk stands is stored once a page's events are answered for, so a restart
//!   (or another replica) resumes the walk at that page.
//! - Requests keep the sender's rate limits; waits are decided by pure functions over an
//!   injected now (`pacing`).
//! - A refused key (401/403) stops the route's reconciler until the key changes.
//! - A walk ends between two events, never between an event's publish and its marks.
//!
//! # Where to start
//!
//! [`Reconcilers`] (`reconcilers.rs`) is what `app` starts and the admin endpoint asks;
//! `route_task.rs` is one route's reconciler; `walk.rs` walks a list and `replay_walk.rs`
//! replays a window. Around them: `api` reads the API's answers, `pacing` decides waits,
//! `items` makes events of listed messages, `position` stores where a walk stands, `key`
//! reads the API key, `metrics` counts and `control` is what the admin endpoint sees.

pub mod api;
mod control;
pub mod items;
pub mod key;
pub mod metrics;
pub mod pacing;
pub mod position;
mod reconcilers;
pub mod replay_walk;
mod route_task;
pub mod walk;

pub use control::{Control, RouteStatus};
pub use reconcilers::{Parts, Reconcilers, ReplayError, RunError, StartError};
