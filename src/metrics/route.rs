//! One route's counters, made at start-up: counting builds no label strings, and every
//! series is scraped (at zero) before its first event.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::labels::{RequestOutcome, RouteLabel, RouteOutcome, RouteReason};
use super::registry::Metrics;

/// Counters made once, each under its label value; a lookup walks a short list instead of
/// building a label set (two strings), hashing it and locking the family.
struct Presized(Vec<(&'static str, Counter)>);

impl Presized {
    fn get(&self, label: &str) -> Option<&Counter> {
        self.0
            .iter()
            .find(|(known, _)| *known == label)
            .map(|(_, c)| c)
    }
}

/// One route's counters, made at start-up: counting builds no label strings, and every
/// series is scraped (at zero) before its first event.
pub struct RouteCounters {
    route: String,
    /// One counter per [`RequestOutcome`], in the order of `RequestOutcome::ALL`.
    requests: [Counter; RequestOutcome::ALL.len()],
    drops_family: Family<RouteReason, Counter>,
    drops: Presized,
    /// Deliveries answered `duplicate`.
    pub dedup_hits: Counter,
    /// Deliveries refused for their signature.
    pub signature_failures: Counter,
    /// The route's series of the request duration histogram.
    pub duration: Histogram,
}

impl RouteCounters {
    /// The counters of `route` in `metrics`: one for each [`RequestOutcome`] and each of
    /// `drop_reasons`, its duplicates and its signature failures.
    pub(super) fn new(metrics: &Metrics, route: &str, drop_reasons: &[&'static str]) -> Self {
        let requests = RequestOutcome::ALL.map(|outcome| {
            let labels = RouteOutcome::new(route, outcome.as_str());
            metrics.requests.get_or_create(&labels).clone()
        });
        let drops = drop_reasons
            .iter()
            .map(|&reason| {
                let labels = RouteReason {
                    route: route.to_owned(),
                    reason: reason.to_owned(),
                };
                (reason, metrics.drops.get_or_create(&labels).clone())
            })
            .collect();
        let label = RouteLabel {
            route: route.to_owned(),
        };
        Self {
            route: route.to_owned(),
            requests,
            drops_family: metrics.drops.clone(),
            drops: Presized(drops),
            dedup_hits: metrics.dedup_hits.get_or_create(&label).clone(),
            signature_failures: metrics.signature_failures.get_or_create(&label).clone(),
            duration: metrics.request_duration.get_or_create(&label).clone(),
        }
    }

    /// Counts one answered request with `outcome`.
    pub fn count(&self, outcome: RequestOutcome) {
        // `ALL` lists the values in declaration order: a value's discriminant is its place.
        self.requests[outcome as usize].inc();
    }

    /// Counts one dropped event with `reason`.
    pub fn count_drop(&self, reason: &str) {
        match self.drops.get(reason) {
            Some(counter) => {
                counter.inc();
            }
            // A reason missing from the list is still counted, the slow way.
            None => {
                self.drops_family
                    .get_or_create(&RouteReason {
                        route: self.route.clone(),
                        reason: reason.to_owned(),
                    })
                    .inc();
            }
        }
    }
}

impl Metrics {
    /// The counters of `route`: one for each [`RequestOutcome`] and each of
    /// `drop_reasons`, its duplicates and its signature failures.
    pub fn route_counters(&self, route: &str, drop_reasons: &[&'static str]) -> RouteCounters {
        RouteCounters::new(self, route, drop_reasons)
    }
}
