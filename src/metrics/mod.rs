//! # Metrics
//!
//! Prometheus metrics: one registry, the handles the rest of the code updates, and the text
//! exposition served on `/metrics`.
//!
//! ## Where to start reading
//!
//! [`Metrics`] (`registry.rs`) is every metric hookgate exports and how each is registered;
//! the label sets and label values are in `labels.rs`, a route's counters in `route.rs`,
//! reconciliation's families in `reconcile.rs`, the exposition formats in `format.rs`.

mod format;
mod labels;
mod reconcile;
mod registry;
mod route;

pub use format::Format;
pub(crate) use labels::label_values;
pub use labels::{
    CloseReason, LabelValue, ReasonCounters, ReasonLabel, RefusalReason, RequestOutcome, RouteKind,
    RouteLabel, RouteOutcome, RouteReason,
};
pub use reconcile::{ReconcileMetrics, SecondsCounter};
pub use registry::{Metrics, UNMATCHED_ROUTE};
pub use route::RouteCounters;
