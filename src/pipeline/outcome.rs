//! How a delivery ends, and why an event is dropped.

use crate::guard::decide::GuardDrop;
use crate::ingress::event::ParseError;
use crate::metrics::{label_values, RequestOutcome};

/// Seconds a sender should wait after a 503 no error caused: a claim or a guard lock held
/// by another request for the whole wait.
pub const RETRY_AFTER_BUSY: u64 = crate::store_error::RETRY_AFTER_TRANSIENT_SECS;

/// How one delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Published (or durably spooled).
    Accepted { event_id: String },
    /// Seen before; nothing published.
    Duplicate { event_id: String },
    /// Stale, repeated, expired or from the future; nothing published to the main key.
    Dropped {
        event_id: String,
        reason: &'static str,
    },
    /// Missing, malformed or wrong signature.
    InvalidSignature,
    /// Not a usable event; the reason is safe to show.
    BadRequest(ParseError),
    /// Over the route's rate limit.
    RateLimited { retry_after: u64 },
    /// The event could not be made safe now; the sender must retry.
    Unavailable { retry_after: u64 },
}

impl Outcome {
    /// The outcome the route's request is counted under.
    pub fn label(&self) -> RequestOutcome {
        match self {
            Outcome::Accepted { .. } => RequestOutcome::Accepted,
            Outcome::Duplicate { .. } => RequestOutcome::Duplicate,
            Outcome::Dropped { .. } => RequestOutcome::Dropped,
            Outcome::InvalidSignature => RequestOutcome::InvalidSignature,
            Outcome::BadRequest(_) => RequestOutcome::BadRequest,
            Outcome::RateLimited { .. } => RequestOutcome::RateLimited,
            Outcome::Unavailable { .. } => RequestOutcome::Unavailable,
        }
    }
}

label_values! {
    /// Why the freshness check drops an event (the guard's reasons are [`GuardDrop`]).
    pub enum FreshnessDrop {
        /// Older than the dedup TTL: a replay dedup may no longer recognise.
        Expired => "expired",
        /// Further ahead than `max_clock_skew`: it would outlive its own dedup mark.
        FutureTimestamp => "future_timestamp",
    }
}

/// Every reason an event is dropped for, as `hookgate_dropped_events_total` labels it: the
/// guard's, then the freshness check's. Each route counts them from start-up.
pub fn drop_reasons() -> Vec<&'static str> {
    let guard = GuardDrop::ALL.iter().map(|reason| reason.as_str());
    let freshness = FreshnessDrop::ALL.iter().map(|reason| reason.as_str());
    guard.chain(freshness).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn every_outcome_is_counted_under_its_request_outcome() {
        let id = || "evt_1".to_owned();
        let outcomes = [
            Outcome::Accepted { event_id: id() },
            Outcome::Duplicate { event_id: id() },
            Outcome::Dropped {
                event_id: id(),
                reason: "stale_status",
            },
            Outcome::InvalidSignature,
            Outcome::BadRequest(ParseError::NoEventId),
            Outcome::RateLimited { retry_after: 1 },
            Outcome::Unavailable { retry_after: 1 },
        ];
        let labels = outcomes.map(|outcome| outcome.label().as_str());
        assert_eq!(
            labels,
            [
                "accepted",
                "duplicate",
                "dropped",
                "invalid_signature",
                "bad_request",
                "rate_limited",
                "unavailable"
            ]
        );
    }

    #[test]
    fn every_drop_reason_has_a_counter_made_at_start_up() {
        let metrics = Metrics::new();
        let _counters = metrics.route_counters("botix", &drop_reasons());
        let text = metrics.render();
        let guard = GuardDrop::ALL.map(GuardDrop::as_str);
        let freshness = FreshnessDrop::ALL.map(FreshnessDrop::as_str);
        for reason in guard.into_iter().chain(freshness) {
            let series =
                format!("hookgate_dropped_events_total{{route=\"botix\",reason=\"{reason}\"}} 0");
            assert!(text.contains(&series), "{series} in\n{text}");
        }
        assert_eq!(freshness, ["expired", "future_timestamp"]);
    }
}
