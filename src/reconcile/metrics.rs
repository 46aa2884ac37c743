//! One route's reconciliation metrics: the handles of `metrics::ReconcileMetrics` with the
//! route's label, made when the reconciler starts so every series exists at zero.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::{
    label_values, Metrics, ReconcileMetrics, RouteKind, RouteLabel, SecondsCounter,
};
use crate::pipeline::Outcome;

label_values! {
    /// How a reconciliation walk ended (label `kind` of `hookgate_reconcile_walks_total`).
    pub enum WalkResult {
        /// Every page was read.
        Complete => "complete",
        /// Given up until the next interval.
        GaveUp => "gave_up",
        /// The sender refuses the API key.
        KeyRefused => "key_refused",
        /// The store failed.
        Failed => "failed",
    }
}

label_values! {
    /// What became of a reconciled event (label `kind` of `hookgate_reconcile_events_total`).
    pub enum EventOutcome {
        /// Published: one the webhook missed.
        Published => "published",
        /// Seen before.
        Duplicate => "duplicate",
        /// Dropped by the guard or the freshness check.
        Dropped => "dropped",
        /// Could not be made safe now, or over a rate limit.
        Unavailable => "unavailable",
        /// Not a usable event.
        Refused => "refused",
    }
}

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
        for result in WalkResult::ALL {
            let _ = m.families.walks.get_or_create(&m.kind(result.as_str()));
        }
        for outcome in EventOutcome::ALL {
            let _ = m.families.events.get_or_create(&m.kind(outcome.as_str()));
        }
        m
    }

    fn kind(&self, kind: &str) -> RouteKind {
        RouteKind {
            route: self.route.clone(),
            kind: kind.to_owned(),
        }
    }

    /// Counts a walk that ended with `result`.
    pub fn walk(&self, result: WalkResult) {
        self.families
            .walks
            .get_or_create(&self.kind(result.as_str()))
            .inc();
    }

    /// Counts an event's outcome; a published one is also a missed one.
    pub fn event(&self, outcome: &Outcome) {
        let kind = match outcome {
            Outcome::Accepted { .. } => {
                self.missed.inc();
                EventOutcome::Published
            }
            Outcome::Duplicate { .. } => EventOutcome::Duplicate,
            Outcome::Dropped { .. } => EventOutcome::Dropped,
            Outcome::Unavailable { .. } | Outcome::RateLimited { .. } => EventOutcome::Unavailable,
            Outcome::BadRequest(_) | Outcome::InvalidSignature => EventOutcome::Refused,
        };
        self.families
            .events
            .get_or_create(&self.kind(kind.as_str()))
            .inc();
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
