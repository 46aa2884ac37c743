//! One event's way through hookgate, from its signature to its [`Outcome`].
//!
//! A webhook delivery is verified, rate limited and parsed; from there every event, a
//! delivery's or one reconciliation brings, takes the same steps: freshness, the dedup
//! claim, the guard, publish-or-spool, and the commit of its guard state and done marks.
//! [`Pipeline`] holds the handles these steps need and no others.
//!
//! # Guarantees
//!
//! - Nothing of a delivery is parsed, claimed or published before its signature verifies.
//! - An event is `Accepted` only once the broker confirmed it or the spool holds it, and
//!   its guard state and done marks are durable before the outcome is returned.
//! - A failure before the event left releases its claims, so the sender's retry is judged
//!   afresh; once it left, its claims are marked done whatever fails after.
//! - No HTTP here: `http` maps an [`Outcome`] to an answer.
//!
//! # Where to start
//!
//! `delivery.rs` takes a webhook delivery in; `admit.rs` checks an event before its claim;
//! `dedup.rs` claims and settles its keys (`dedup_keys.rs`); `deliver.rs` runs the guard
//! and the publish; `reconciled.rs` takes listed and replayed events. `outcome.rs` holds
//! the outcomes and drop reasons, `log_scope.rs` a delivery's trace for the log, `route.rs`
//! the routes and settings, `event_message.rs` the AMQP message of an event.

mod admit;
mod dedup;
mod dedup_keys;
mod deliver;
mod delivery;
mod event_message;
pub mod log_scope;
mod outcome;
mod reconciled;
mod route;
mod runs_to_end;

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::guard::GuardState;
use crate::outbox::Outbox;
use crate::state::StateStore;

pub use event_message::{rfc3339, routing_key};
pub use outcome::{drop_reasons, FreshnessDrop, Outcome, RETRY_AFTER_BUSY};
pub use route::{CompiledRoute, PipelineSettings, RouteRuntime};

/// The request path, with the handles it needs and no others.
pub struct Pipeline {
    /// Routes in config order.
    routes: Vec<Arc<RouteRuntime>>,
    settings: PipelineSettings,
    state: Arc<StateStore>,
    guards: GuardState,
    outbox: Outbox,
    /// Requests answered 503 because the state store failed.
    store_errors: Counter,
    /// How long requests waited for their state to be durable.
    sync_duration: Histogram,
    clock: Clock,
    /// Deliveries running (see [`Pipeline::handle_to_end`]).
    tasks: TaskTracker,
}

impl Pipeline {
    /// The request path over `routes`.
    pub fn new(
        settings: PipelineSettings,
        routes: Vec<Arc<RouteRuntime>>,
        state: Arc<StateStore>,
        outbox: Outbox,
        (store_errors, sync_duration): (Counter, Histogram),
        clock: Clock,
    ) -> Self {
        Self {
            routes,
            settings,
            guards: GuardState::new(state.clone()),
            state,
            outbox,
            store_errors,
            sync_duration,
            clock,
            tasks: TaskTracker::new(),
        }
    }

    /// The route served at `path`.
    pub fn route(&self, path: &str) -> Option<&Arc<RouteRuntime>> {
        self.routes.iter().find(|r| r.config.path == path)
    }

    /// The current time of the injected clock.
    fn now_ms(&self) -> i64 {
        (self.clock)()
    }
}
