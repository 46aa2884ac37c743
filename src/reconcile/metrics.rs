//! One route's reconciliation metrics: the handles of `metrics::ReconcileMetrics` with the
//! route's label, made when the reconciler starts so every series exists at zero.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::{Metrics, ReconcileMetrics, RouteKind, RouteLabel, SecondsCounter};
use crate::pipeline::Outcome;

/// Walk results counted in `hookgate_reconcile_walks_total`.
pub const WALK_RESULTS: [&str; 4] = ["complete", "gave_up", "key_refused", "failed"];
/// Event outcomes counted in `hookgate_reconcile_events_total`.
pub const EVENT_OUTCOMES: [&str; 5] = [
    "published",
    "duplicate",
    "dropped",
    "unavailable",
    "refused",
];

/// The metrics of one route's reconciler.
#[derive(Clone)]
pub struct RouteMetrics {
    families: ReconcileMetrics,
    route: String,
    /// Pages read.
    pub pages: Counter,
    /// Items listed.
    pub items: Counter,
    /// Events published: each one the webhook missed.
    pub missed: Counter,
    /// 429 answers.
    pub rate_limited: Counter,
    /// Seconds waited for the rate limit.
    pub wait_seconds: SecondsCounter,
    /// Unix seconds of the last complete walk's end.
    pub last_complete: Gauge,
    /// 1 while the key is refused.
    pub key_refused: Gauge,
}

impl RouteMetrics {
    /// The handles of `route`, every labelled series made at zero.
    pub fn new(metrics: &Metrics, route: &str) -> Self {
        let f = metrics.reconcile.clone();
        let label = RouteLabel {
            route: route.to_owned(),
        };
        let pages = f.pages.get_or_create(&label).clone();
        let items = f.items.get_or_create(&label).clone();
        let missed = f.missed_events.get_or_create(&label).clone();
        let rate_limited = f.rate_limited.get_or_create(&label).clone();
        let wait_seconds = f.rate_limit_wait.get_or_create(&label).clone();
        let last_complete = f.last_complete_walk.get_or_create(&label).clone();
        let key_refused = f.key_refused.get_or_create(&label).clone();
        let m = Self {
            pages,
            items,
            missed,
            rate_limited,
            wait_seconds,
            last_complete,
            key_refused,
            route: route.to_owned(),
            families: f,
        };
        for kind in WALK_RESULTS {
            let _ = m.families.walks.get_or_create(&m.kind(kind));
        }
        for kind in EVENT_OUTCOMES {
            let _ = m.families.events.get_or_create(&m.kind(kind));
        }
        m
    }

    fn kind(&self, kind: &str) -> RouteKind {
        RouteKind {
            route: self.route.clone(),
            kind: kind.to_owned(),
        }
    }

    /// Counts a walk that ended with `result` (one of [`WALK_RESULTS`]).
    pub fn walk(&self, result: &str) {
        self.families.walks.get_or_create(&self.kind(result)).inc();
    }

    /// Counts an event's outcome; a published one is also a missed one.
    pub fn event(&self, outcome: &Outcome) {
        let kind = match outcome {
            Outcome::Accepted { .. } => {
                self.missed.inc();
                "published"
            }
            Outcome::Duplicate { .. } => "duplicate",
            Outcome::Dropped { .. } => "dropped",
            Outcome::Unavailable { .. } | Outcome::RateLimited { .. } => "unavailable",
            Outcome::BadRequest(_) | Outcome::InvalidSignature => "refused",
        };
        self.families.events.get_or_create(&self.kind(kind)).inc();
    }

    /// Counts an answer or item not as documented.
    pub fn bad(&self, kind: &str) {
        self.families
            .bad_answers
            .get_or_create(&self.kind(kind))
            .inc();
    }

    /// Adds time waited for the rate limit.
    pub fn waited(&self, wait: Duration) {
        self.wait_seconds.inc_by(wait.as_secs_f64());
    }
}
