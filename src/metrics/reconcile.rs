//! Reconciliation's metric families, labelled by route (their per-route handles are in
//! `reconcile::metrics`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::labels::{RouteKind, RouteLabel};

/// A counter of seconds.
pub type SecondsCounter = Counter<f64, std::sync::atomic::AtomicU64>;

/// Reconciliation's metric families, labelled by route (see `reconcile::metrics`).
#[derive(Clone, Default)]
pub struct ReconcileMetrics {
    /// Walks by result: `complete`, `gave_up`, `key_refused`, `failed`.
    pub walks: Family<RouteKind, Counter>,
    /// Pages read.
    pub pages: Family<RouteLabel, Counter>,
    /// Items listed.
    pub items: Family<RouteLabel, Counter>,
    /// Events published by reconciliation: each one an event the webhook missed.
    pub missed_events: Family<RouteLabel, Counter>,
    /// Events by outcome: `published`, `duplicate`, `dropped`, `unavailable`, `refused`.
    pub events: Family<RouteKind, Counter>,
    /// 429 answers.
    pub rate_limited: Family<RouteLabel, Counter>,
    /// Time spent waiting for the sender's rate limit (Reset and Retry-After).
    pub rate_limit_wait: Family<RouteLabel, SecondsCounter>,
    /// Answers or items not as documented, by kind.
    pub bad_answers: Family<RouteKind, Counter>,
    /// Unix time the last complete walk ended.
    pub last_complete_walk: Family<RouteLabel, Gauge>,
    /// 1 while the route's key is refused (401/403) and its reconciler stopped.
    pub key_refused: Family<RouteLabel, Gauge>,
}

impl ReconcileMetrics {
    /// Registers every family in `registry`.
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "reconcile_walks",
            "Reconciliation walks by result",
            self.walks.clone(),
        );
        registry.register(
            "reconcile_pages",
            "Pages read from the sender's list API",
            self.pages.clone(),
        );
        registry.register(
            "reconcile_items",
            "Messages listed by the sender's list API",
            self.items.clone(),
        );
        registry.register(
            "reconcile_missed_events",
            "Events reconciliation published: each one an event the webhook missed",
            self.missed_events.clone(),
        );
        registry.register(
            "reconcile_events",
            "Events reconciliation made, by outcome",
            self.events.clone(),
        );
        registry.register(
            "reconcile_rate_limited",
            "429 answers of the sender's list API",
            self.rate_limited.clone(),
        );
        registry.register(
            "reconcile_rate_limit_wait_seconds",
            "Time spent waiting for the sender's rate limit",
            self.rate_limit_wait.clone(),
        );
        registry.register(
            "reconcile_bad_answers",
            "Answers or items of the sender's list API not as documented, by kind",
            self.bad_answers.clone(),
        );
        registry.register(
            "reconcile_last_complete_walk_timestamp_seconds",
            "Unix time the last complete reconciliation walk ended",
            self.last_complete_walk.clone(),
        );
        registry.register(
            "reconcile_key_refused",
            "1 while the sender refuses the route's API key and its reconciler is stopped",
            self.key_refused.clone(),
        );
    }
}
