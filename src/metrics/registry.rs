//! [`Metrics`]: every metric hookgate exports, in one registry, with the handles the rest
//! of the code updates and the text exposition served on `/metrics`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::format::{group_series, Format};
use super::labels::{
    BuildLabels, CloseReason, ReasonCounters, RefusalReason, RouteLabel, RouteOutcome, RouteReason,
};
use super::reconcile::ReconcileMetrics;

/// Latency buckets in seconds; the low end resolves sub-millisecond answers.
const LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// The route label of requests whose path matches no route.
pub const UNMATCHED_ROUTE: &str = "unmatched";
/// The outcome label of requests whose path matches no route.
const NOT_FOUND: &str = "not_found";

/// Every metric hookgate exports.
pub struct Metrics {
    registry: Registry,
    /// Requests by route and outcome.
    pub requests: Family<RouteOutcome, Counter>,
    /// Time from request head to answer, seconds, by route (`unmatched` for a path no
    /// route has).
    pub request_duration: Family<RouteLabel, Histogram, fn() -> Histogram>,
    /// Deliveries answered `duplicate`.
    pub dedup_hits: Family<RouteLabel, Counter>,
    /// Events dropped by the guard or the freshness check, by reason.
    pub drops: Family<RouteReason, Counter>,
    /// Deliveries refused for their signature.
    pub signature_failures: Family<RouteLabel, Counter>,
    /// Time from publish to broker confirm, seconds.
    pub publish_duration: Histogram,
    /// Returned messages whose publish id matched no publish in flight on their channel:
    /// the pairing of returns with publishes broke (never expected; each one is logged).
    pub publish_unpaired_returns: Counter,
    /// 1 while the broker connection is up.
    pub broker_connected: Gauge,
    /// 1 while the broker blocks the connection (a memory or disk alarm): events spool.
    pub broker_blocked: Gauge,
    /// Which broker node the connection is to: its position in `amqp.urls` (0 for
    /// `amqp.url`), -1 while there is none. A number, not a label: the URL would carry a
    /// host per node into every series.
    pub broker_node: Gauge,
    /// Events waiting in the spool.
    pub spool_depth: Gauge,
    /// Bytes waiting in the spool.
    pub spool_bytes: Gauge,
    /// Spooled events held apart until a queue takes them (unroutable, and the later events
    /// of their guard keys).
    pub spool_held: Gauge,
    /// Spool entries parked for an operator (`hookgate spool parked`).
    pub spool_parked: Gauge,
    /// Times the spool drainer failed and was started again.
    pub spool_drainer_restarts: Counter,
    /// 1 while entries wait and the drainer makes no progress (set when scraped).
    pub spool_drainer_stalled: Gauge,
    /// Dedup/guard store operations that failed (the request got a 503).
    pub store_errors: Counter,
    /// Time a request waited for its marks and guard state to be durable, seconds.
    pub store_sync_duration: Histogram,
    /// Dedup marks and guard states of the local backend (set when scraped).
    pub state_entries: Gauge,
    /// State runs a merge found damaged and leaves (local backend, set when scraped).
    pub state_runs_damaged: Gauge,
    /// Webhook connections closed by hookgate, by [`CloseReason`].
    pub connections_closed: ReasonCounters<CloseReason>,
    /// Webhook connections open now.
    pub connections_open: Gauge,
    /// `limits.max_connections`, so that an alert can compare the two.
    pub connections_max: Gauge,
    /// Requests refused before verification, by [`RefusalReason`].
    pub refusals: ReasonCounters<RefusalReason>,
    /// Body bytes held before their signature was checked.
    pub unverified_body_bytes: Gauge,
    /// Body reads that waited for the unverified body budget.
    pub body_budget_waits: Counter,
    /// Secret reloads refused (the previous secrets stay in force).
    pub secret_reload_failures: Family<RouteLabel, Counter>,
    /// Reconciliation with the senders' list APIs.
    pub reconcile: ReconcileMetrics,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let metrics = Self::unregistered();
        // The process_* series keep their standard names, outside hookgate's prefix.
        let mut root = Registry::default();
        root.register_collector(Box::new(crate::process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("hookgate");
        metrics.register_requests(registry);
        metrics.register_broker(registry);
        metrics.register_spool(registry);
        metrics.register_store(registry);
        metrics.register_listener(registry);
        registry.register(
            "secret_reload_failures",
            "Secret reloads refused; the previous secrets stay in force",
            metrics.secret_reload_failures.clone(),
        );
        metrics.reconcile.register(registry);
        register_build_info(registry);
        Self {
            registry: root,
            ..metrics
        }
    }

    /// Every handle, at its starting value, in a registry of its own that nothing reads.
    fn unregistered() -> Self {
        let broker_node = Gauge::default();
        broker_node.set(-1);
        Self {
            registry: Registry::default(),
            requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_histogram),
            dedup_hits: Family::default(),
            drops: Family::default(),
            signature_failures: Family::default(),
            publish_duration: latency_histogram(),
            publish_unpaired_returns: Counter::default(),
            broker_connected: Gauge::default(),
            broker_blocked: Gauge::default(),
            broker_node,
            spool_depth: Gauge::default(),
            spool_bytes: Gauge::default(),
            spool_held: Gauge::default(),
            spool_parked: Gauge::default(),
            spool_drainer_restarts: Counter::default(),
            spool_drainer_stalled: Gauge::default(),
            store_errors: Counter::default(),
            store_sync_duration: latency_histogram(),
            state_entries: Gauge::default(),
            state_runs_damaged: Gauge::default(),
            connections_closed: ReasonCounters::new(),
            connections_open: Gauge::default(),
            connections_max: Gauge::default(),
            refusals: ReasonCounters::new(),
            unverified_body_bytes: Gauge::default(),
            body_budget_waits: Counter::default(),
            secret_reload_failures: Family::default(),
            reconcile: ReconcileMetrics::default(),
        }
    }

    /// The families of webhook requests, by route.
    fn register_requests(&self, registry: &mut Registry) {
        registry.register(
            "requests",
            "Webhook requests by route and outcome",
            self.requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from request head to answer, by route",
            self.request_duration.clone(),
        );
        registry.register(
            "dedup_hits",
            "Deliveries answered as duplicates",
            self.dedup_hits.clone(),
        );
        registry.register(
            "dropped_events",
            "Events dropped by the guard or freshness check",
            self.drops.clone(),
        );
        registry.register(
            "signature_failures",
            "Deliveries refused for a missing or wrong signature",
            self.signature_failures.clone(),
        );
    }

    /// The publisher's and the broker connection's metrics.
    fn register_broker(&self, registry: &mut Registry) {
        registry.register(
            "publish_duration_seconds",
            "Time from publish to broker confirm",
            self.publish_duration.clone(),
        );
        registry.register(
            "publish_unpaired_returns",
            "Returned messages that matched no publish in flight (the pairing broke)",
            self.publish_unpaired_returns.clone(),
        );
        registry.register(
            "broker_connected",
            "1 while the AMQP connection is up",
            self.broker_connected.clone(),
        );
        registry.register(
            "broker_blocked",
            "1 while the broker blocks publishing (a memory or disk alarm); events are spooled",
            self.broker_blocked.clone(),
        );
        registry.register(
            "broker_node",
            "Position in amqp.urls (0 for amqp.url) of the broker node connected to; -1 while none",
            self.broker_node.clone(),
        );
    }

    /// The spool's and its drainer's metrics.
    fn register_spool(&self, registry: &mut Registry) {
        registry.register(
            "spool_depth",
            "Events waiting in the spool",
            self.spool_depth.clone(),
        );
        registry.register(
            "spool_bytes",
            "Bytes waiting in the spool",
            self.spool_bytes.clone(),
        );
        registry.register(
            "spool_held",
            "Spooled events held apart until a queue is bound for them",
            self.spool_held.clone(),
        );
        registry.register(
            "spool_parked",
            "Spool entries that cannot be published, parked for an operator",
            self.spool_parked.clone(),
        );
        registry.register(
            "spool_drainer_restarts",
            "Times the spool drainer failed and was started again",
            self.spool_drainer_restarts.clone(),
        );
        registry.register(
            "spool_drainer_stalled",
            "1 while spooled events wait and the drainer makes no progress",
            self.spool_drainer_stalled.clone(),
        );
    }

    /// The dedup and guard store's metrics.
    fn register_store(&self, registry: &mut Registry) {
        registry.register(
            "store_errors",
            "Dedup or guard store operations that failed",
            self.store_errors.clone(),
        );
        registry.register(
            "store_sync_duration_seconds",
            "Time a request waited for its marks and guard state to be durable (local: the journal's group commit)",
            self.store_sync_duration.clone(),
        );
        registry.register(
            "state_entries",
            "Dedup marks and guard states of the local backend, in memory and in runs on disk",
            self.state_entries.clone(),
        );
        registry.register(
            "state_runs_damaged",
            "State runs a merge found damaged and leaves: restore the store from a backup",
            self.state_runs_damaged.clone(),
        );
    }

    /// The webhook listener's connections, refusals and unverified body bytes.
    fn register_listener(&self, registry: &mut Registry) {
        registry.register(
            "connections_closed",
            "Webhook connections closed by hookgate, by reason",
            self.connections_closed.family(),
        );
        registry.register(
            "connections_open",
            "Webhook connections open now",
            self.connections_open.clone(),
        );
        registry.register(
            "connections_max",
            "The webhook listener's max_connections",
            self.connections_max.clone(),
        );
        registry.register(
            "refusals",
            "Requests refused before their signature was checked, by reason",
            self.refusals.family(),
        );
        registry.register(
            "unverified_body_bytes",
            "Request body bytes held before their signature was checked",
            self.unverified_body_bytes.clone(),
        );
        registry.register(
            "body_budget_waits",
            "Body reads that waited for the unverified body budget",
            self.body_budget_waits.clone(),
        );
    }

    /// Counts a request refused for `reason`.
    pub fn refused(&self, reason: RefusalReason) {
        self.refusals.count(reason);
    }

    /// Counts one request whose path matches no route.
    pub fn count_not_found(&self) {
        self.requests
            .get_or_create(&RouteOutcome::new(UNMATCHED_ROUTE, NOT_FOUND))
            .inc();
    }

    /// The request duration series of requests whose path matches no route.
    pub fn unmatched_duration(&self) -> Histogram {
        self.request_duration
            .get_or_create(&RouteLabel {
                route: UNMATCHED_ROUTE.to_owned(),
            })
            .clone()
    }

    /// The exposition in the Prometheus text format 0.0.4.
    pub fn render(&self) -> String {
        self.render_as(Format::Text)
    }

    /// The exposition in `format`.
    pub fn render_as(&self, format: Format) -> String {
        let mut out = String::new();
        let encoded = match format {
            Format::Text => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            }
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)
            }
        };
        if let Err(e) = encoded {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        group_series(&out)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The build info gauge: 1, labelled with the version.
fn register_build_info(registry: &mut Registry) {
    let build = Family::<BuildLabels, Gauge>::default();
    build
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION").to_owned(),
        })
        .set(1);
    registry.register("build_info", "Build information", build);
}

/// A request duration histogram with hookgate's latency buckets.
fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::labels::RequestOutcome;

    /// The value of the series `name{labels}` in the text exposition.
    fn sample(metrics: &Metrics, name: &str, labels: &str) -> Option<String> {
        let line = format!("{name}{{{labels}}} ");
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()).map(str::to_owned))
    }

    fn requests(metrics: &Metrics, route: &str, outcome: &str) -> Option<String> {
        let labels = format!("route=\"{route}\",outcome=\"{outcome}\"");
        sample(metrics, "hookgate_requests_total", &labels)
    }

    #[test]
    fn route_counters_exist_at_zero_and_count_into_the_family() {
        let metrics = Metrics::new();
        let counters = metrics.route_counters("botix", &[]);
        for outcome in RequestOutcome::ALL {
            assert_eq!(
                requests(&metrics, "botix", outcome.as_str()).as_deref(),
                Some("0")
            );
        }
        counters.count(RequestOutcome::Accepted);
        counters.count(RequestOutcome::Accepted);
        counters.count(RequestOutcome::Timeout);
        assert_eq!(
            requests(&metrics, "botix", "accepted").as_deref(),
            Some("2")
        );
        assert_eq!(requests(&metrics, "botix", "timeout").as_deref(), Some("1"));
        // The same series as the label-building path.
        metrics
            .requests
            .get_or_create(&RouteOutcome::new("botix", "accepted"))
            .inc();
        assert_eq!(
            requests(&metrics, "botix", "accepted").as_deref(),
            Some("3")
        );
        // A path no route has: counted under its own route and outcome.
        assert_eq!(requests(&metrics, "unmatched", "not_found"), None);
        metrics.count_not_found();
        assert_eq!(
            requests(&metrics, "unmatched", "not_found").as_deref(),
            Some("1")
        );
    }

    #[test]
    fn both_formats_carry_the_same_series_and_only_openmetrics_ends_in_eof() {
        let metrics = Metrics::new();
        let counters = metrics.route_counters("botix", &[]);
        counters.count(RequestOutcome::Accepted);
        counters.duration.observe(0.002);
        let text = metrics.render_as(Format::Text);
        let open = metrics.render_as(Format::OpenMetrics);
        for series in [
            "hookgate_requests_total{route=\"botix\",outcome=\"accepted\"} 1",
            "hookgate_request_duration_seconds_count{route=\"botix\"} 1",
        ] {
            assert!(text.contains(series), "{series} in\n{text}");
            assert!(open.contains(series), "{series} in\n{open}");
        }
        assert!(
            text.contains("# TYPE hookgate_requests_total counter"),
            "{text}"
        );
        assert!(open.contains("# TYPE hookgate_requests counter"), "{open}");
        assert!(!text.contains("# EOF"));
        assert!(open.ends_with("# EOF\n"));
        for name in [
            "process_resident_memory_bytes",
            "process_cpu_seconds_total",
            "process_start_time_seconds",
        ] {
            #[cfg(target_os = "linux")]
            assert!(
                text.lines().any(|l| l.starts_with(name)),
                "{name} in\n{text}"
            );
        }
    }

    #[test]
    fn drop_counters_exist_at_zero_and_count_into_the_family() {
        let metrics = Metrics::new();
        let reasons = ["stale_status", "expired"];
        let counters = metrics.route_counters("botix", &reasons);
        let drops = |reason: &str| {
            let labels = format!("route=\"botix\",reason=\"{reason}\"");
            sample(&metrics, "hookgate_dropped_events_total", &labels)
        };
        for reason in reasons {
            assert_eq!(drops(reason).as_deref(), Some("0"), "{reason}");
        }
        counters.count_drop("stale_status");
        counters.count_drop("something_new");
        assert_eq!(drops("stale_status").as_deref(), Some("1"));
        assert_eq!(drops("something_new").as_deref(), Some("1"));
        counters.dedup_hits.inc();
        assert!(metrics
            .render()
            .contains("hookgate_dedup_hits_total{route=\"botix\"} 1"));
    }

    #[test]
    fn every_close_and_refusal_reason_exists_at_zero_and_counts() {
        let metrics = Metrics::new();
        let closed = |reason: CloseReason| {
            let labels = format!("reason=\"{reason}\"");
            sample(&metrics, "hookgate_connections_closed_total", &labels)
        };
        for reason in CloseReason::ALL {
            assert_eq!(closed(reason).as_deref(), Some("0"), "{reason}");
        }
        metrics.connections_closed.count(CloseReason::MaxAge);
        assert_eq!(closed(CloseReason::MaxAge).as_deref(), Some("1"));
        let refused = |reason: RefusalReason| {
            let labels = format!("reason=\"{reason}\"");
            sample(&metrics, "hookgate_refusals_total", &labels)
        };
        for reason in RefusalReason::ALL {
            assert_eq!(refused(reason).as_deref(), Some("0"), "{reason}");
        }
        metrics.refused(RefusalReason::BodyBudget);
        assert_eq!(refused(RefusalReason::BodyBudget).as_deref(), Some("1"));
    }

    #[test]
    fn a_request_outcome_is_its_place_in_all() {
        // A route's request counters are indexed by the outcome's discriminant.
        for (place, outcome) in RequestOutcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome as usize, place, "{outcome}");
        }
    }
}
