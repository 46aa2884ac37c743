//! Prometheus metrics: one registry, the handles the rest of the code updates, and the text
//! exposition served on `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Latency buckets in seconds; the low end resolves sub-millisecond answers.
const LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Labels of per-route request counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteOutcome {
    /// Route name (`unmatched` for unknown paths).
    pub route: String,
    /// accepted, duplicate, dropped, invalid_signature, bad_request, too_large, rate_limited, unavailable, ...
    pub outcome: String,
}

/// Labels of guard drops.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteReason {
    /// Route name.
    pub route: String,
    /// Drop reason (contract §2).
    pub reason: String,
}

/// Labels with just the route.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    /// Route name.
    pub route: String,
}

/// Labels with just a reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: String,
}

/// Why a webhook connection was closed by hookgate (label of
/// `hookgate_connections_closed_total`).
pub const CLOSE_REASONS: [&str; 5] = [
    // No complete request head within `header_read_timeout` of the accept (TLS handshake,
    // protocol detection and the HTTP/2 preface included).
    "setup_timeout",
    // The TLS handshake failed.
    "tls_error",
    // No request for `idle_timeout` (kept-alive HTTP/1, or HTTP/2 with no open stream).
    "idle",
    // Older than `max_connection_age`: asked to close (GOAWAY), then closed.
    "max_age",
    // Accepted while `max_connections` were open: closed at once.
    "over_capacity",
];

/// Why a request was refused before its signature was checked (label of
/// `hookgate_refusals_total`).
pub const REFUSAL_REASONS: [&str; 2] = [
    // The peer address spent its `failed_verification_per_peer`: 429 before the body.
    "peer_failures",
    // The body could not be read within `body_read_timeout` while waiting for the
    // unverified body budget: 408.
    "body_budget",
];

/// Labels of the build info gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// Every outcome a route's requests are counted under: the pipeline's outcomes and the
/// answers given before the pipeline (wrong method, body too large, slow or cut short).
pub const REQUEST_OUTCOMES: [&str; 11] = [
    "accepted",
    "duplicate",
    "dropped",
    "invalid_signature",
    "bad_request",
    "rate_limited",
    "unavailable",
    "method_not_allowed",
    "too_large",
    "timeout",
    "aborted",
];

impl RouteOutcome {
    fn new(route: &str, outcome: &str) -> Self {
        Self {
            route: route.to_owned(),
            outcome: outcome.to_owned(),
        }
    }
}

/// Counts one request of `route` with `outcome`, building its label set.
fn count_labelled(family: &Family<RouteOutcome, Counter>, route: &str, outcome: &str) {
    family
        .get_or_create(&RouteOutcome::new(route, outcome))
        .inc();
}

/// A family with a series for each reason, so each is scraped (at zero) before it happens.
fn reason_family(reasons: &[&str]) -> Family<ReasonLabel, Counter> {
    let family = Family::<ReasonLabel, Counter>::default();
    for reason in reasons {
        let _ = family.get_or_create(&ReasonLabel {
            reason: (*reason).to_owned(),
        });
    }
    family
}

fn count_reason(family: &Family<ReasonLabel, Counter>, reason: &str) {
    family
        .get_or_create(&ReasonLabel {
            reason: reason.to_owned(),
        })
        .inc();
}

/// Why an event is dropped (label of `hookgate_dropped_events_total`): the guard's reasons, then
/// the freshness check's. A test below checks the guard's are all here.
pub const DROP_REASONS: [&str; 8] = [
    "stale_status",
    "repeated_status",
    "repeated_stop",
    "repeated_start",
    "repeated_help",
    "stale_keyword",
    "expired",
    "future_timestamp",
];

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
    requests_family: Family<RouteOutcome, Counter>,
    requests: Presized,
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
    /// Counts one answered request with `outcome`.
    pub fn count(&self, outcome: &str) {
        match self.requests.get(outcome) {
            Some(counter) => {
                counter.inc();
            }
            // An outcome missing from the list is still counted, the slow way.
            None => count_labelled(&self.requests_family, &self.route, outcome),
        }
    }

    /// Counts one dropped event with `reason`.
    pub fn count_drop(&self, reason: &str) {
        match self.drops.get(reason) {
            Some(counter) => {
                counter.inc();
            }
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
    /// Dedup marks and guard states held by the sled backend (set when scraped).
    pub state_entries: Gauge,
    /// Webhook connections closed by hookgate, by [`CLOSE_REASONS`].
    pub connections_closed: Family<ReasonLabel, Counter>,
    /// Webhook connections open now.
    pub connections_open: Gauge,
    /// `limits.max_connections`, so that an alert can compare the two.
    pub connections_max: Gauge,
    /// Requests refused before verification, by [`REFUSAL_REASONS`].
    pub refusals: Family<ReasonLabel, Counter>,
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
        // The process_* series keep their standard names, outside hookgate's prefix.
        let mut root = Registry::default();
        root.register_collector(Box::new(crate::process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("hookgate");
        let requests = Family::<RouteOutcome, Counter>::default();
        registry.register(
            "requests",
            "Webhook requests by route and outcome",
            requests.clone(),
        );
        let request_duration: Family<RouteLabel, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "request_duration_seconds",
            "Time from request head to answer, by route",
            request_duration.clone(),
        );
        let dedup_hits = Family::<RouteLabel, Counter>::default();
        registry.register(
            "dedup_hits",
            "Deliveries answered as duplicates",
            dedup_hits.clone(),
        );
        let drops = Family::<RouteReason, Counter>::default();
        registry.register(
            "dropped_events",
            "Events dropped by the guard or freshness check",
            drops.clone(),
        );
        let signature_failures = Family::<RouteLabel, Counter>::default();
        registry.register(
            "signature_failures",
            "Deliveries refused for a missing or wrong signature",
            signature_failures.clone(),
        );
        let publish_duration = Histogram::new(LATENCY_BUCKETS);
        registry.register(
            "publish_duration_seconds",
            "Time from publish to broker confirm",
            publish_duration.clone(),
        );
        let publish_unpaired_returns = Counter::default();
        registry.register(
            "publish_unpaired_returns",
            "Returned messages that matched no publish in flight (the pairing broke)",
            publish_unpaired_returns.clone(),
        );
        let broker_connected = Gauge::default();
        registry.register(
            "broker_connected",
            "1 while the AMQP connection is up",
            broker_connected.clone(),
        );
        let broker_blocked = Gauge::default();
        registry.register(
            "broker_blocked",
            "1 while the broker blocks publishing (a memory or disk alarm); events are spooled",
            broker_blocked.clone(),
        );
        let broker_node = Gauge::default();
        broker_node.set(-1);
        registry.register(
            "broker_node",
            "Position in amqp.urls (0 for amqp.url) of the broker node connected to; -1 while none",
            broker_node.clone(),
        );
        let spool_depth = Gauge::default();
        registry.register(
            "spool_depth",
            "Events waiting in the spool",
            spool_depth.clone(),
        );
        let spool_bytes = Gauge::default();
        registry.register(
            "spool_bytes",
            "Bytes waiting in the spool",
            spool_bytes.clone(),
        );
        let spool_held = Gauge::default();
        registry.register(
            "spool_held",
            "Spooled events held apart until a queue is bound for them",
            spool_held.clone(),
        );
        let spool_parked = Gauge::default();
        registry.register(
            "spool_parked",
            "Spool entries that cannot be published, parked for an operator",
            spool_parked.clone(),
        );
        let spool_drainer_restarts = Counter::default();
        registry.register(
            "spool_drainer_restarts",
            "Times the spool drainer failed and was started again",
            spool_drainer_restarts.clone(),
        );
        let spool_drainer_stalled = Gauge::default();
        registry.register(
            "spool_drainer_stalled",
            "1 while spooled events wait and the drainer makes no progress",
            spool_drainer_stalled.clone(),
        );
        let store_errors = Counter::default();
        registry.register(
            "store_errors",
            "Dedup or guard store operations that failed",
            store_errors.clone(),
        );
        let state_entries = Gauge::default();
        registry.register(
            "state_entries",
            "Dedup marks and guard states held by the sled backend, in memory and in runs on disk",
            state_entries.clone(),
        );
        let connections_closed = reason_family(&CLOSE_REASONS);
        registry.register(
            "connections_closed",
            "Webhook connections closed by hookgate, by reason",
            connections_closed.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "connections_open",
            "Webhook connections open now",
            connections_open.clone(),
        );
        let connections_max = Gauge::default();
        registry.register(
            "connections_max",
            "The webhook listener's max_connections",
            connections_max.clone(),
        );
        let refusals = reason_family(&REFUSAL_REASONS);
        registry.register(
            "refusals",
            "Requests refused before their signature was checked, by reason",
            refusals.clone(),
        );
        let unverified_body_bytes = Gauge::default();
        registry.register(
            "unverified_body_bytes",
            "Request body bytes held before their signature was checked",
            unverified_body_bytes.clone(),
        );
        let body_budget_waits = Counter::default();
        registry.register(
            "body_budget_waits",
            "Body reads that waited for the unverified body budget",
            body_budget_waits.clone(),
        );
        let secret_reload_failures = Family::<RouteLabel, Counter>::default();
        registry.register(
            "secret_reload_failures",
            "Secret reloads refused; the previous secrets stay in force",
            secret_reload_failures.clone(),
        );
        let reconcile = ReconcileMetrics::register(registry);
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        registry.register("build_info", "Build information", build);
        Self {
            registry: root,
            requests,
            request_duration,
            dedup_hits,
            drops,
            signature_failures,
            publish_duration,
            publish_unpaired_returns,
            broker_connected,
            broker_blocked,
            broker_node,
            spool_depth,
            spool_bytes,
            spool_held,
            spool_parked,
            spool_drainer_restarts,
            spool_drainer_stalled,
            store_errors,
            state_entries,
            connections_closed,
            connections_open,
            connections_max,
            refusals,
            unverified_body_bytes,
            body_budget_waits,
            secret_reload_failures,
            reconcile,
        }
    }

    /// Counts a connection closed for `reason` (one of [`CLOSE_REASONS`]).
    pub fn connection_closed(&self, reason: &str) {
        count_reason(&self.connections_closed, reason);
    }

    /// Counts a request refused for `reason` (one of [`REFUSAL_REASONS`]).
    pub fn refused(&self, reason: &str) {
        count_reason(&self.refusals, reason);
    }

    /// The counters of `route`: one for each of [`REQUEST_OUTCOMES`] and of
    /// [`DROP_REASONS`], its duplicates and its signature failures.
    pub fn route_counters(&self, route: &str) -> RouteCounters {
        let requests = REQUEST_OUTCOMES
            .iter()
            .map(|&outcome| {
                let labels = RouteOutcome::new(route, outcome);
                (outcome, self.requests.get_or_create(&labels).clone())
            })
            .collect();
        let drops = DROP_REASONS
            .iter()
            .map(|&reason| {
                let labels = RouteReason {
                    route: route.to_owned(),
                    reason: reason.to_owned(),
                };
                (reason, self.drops.get_or_create(&labels).clone())
            })
            .collect();
        let label = RouteLabel {
            route: route.to_owned(),
        };
        RouteCounters {
            route: route.to_owned(),
            requests_family: self.requests.clone(),
            requests: Presized(requests),
            drops_family: self.drops.clone(),
            drops: Presized(drops),
            dedup_hits: self.dedup_hits.get_or_create(&label).clone(),
            signature_failures: self.signature_failures.get_or_create(&label).clone(),
            duration: self.request_duration.get_or_create(&label).clone(),
        }
    }

    /// Counts one answered request.
    pub fn count_request(&self, route: &str, outcome: &str) {
        count_labelled(&self.requests, route, outcome);
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
        out
    }
}

/// Labels of reconciliation counts with a kind (walk result, event outcome, bad answer).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteKind {
    /// Route name.
    pub route: String,
    /// What is counted.
    pub kind: String,
}

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
    fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "reconcile_walks",
            "Reconciliation walks by result",
            m.walks.clone(),
        );
        registry.register(
            "reconcile_pages",
            "Pages read from the sender's list API",
            m.pages.clone(),
        );
        registry.register(
            "reconcile_items",
            "Messages listed by the sender's list API",
            m.items.clone(),
        );
        registry.register(
            "reconcile_missed_events",
            "Events reconciliation published: each one an event the webhook missed",
            m.missed_events.clone(),
        );
        registry.register(
            "reconcile_events",
            "Events reconciliation made, by outcome",
            m.events.clone(),
        );
        registry.register(
            "reconcile_rate_limited",
            "429 answers of the sender's list API",
            m.rate_limited.clone(),
        );
        registry.register(
            "reconcile_rate_limit_wait_seconds",
            "Time spent waiting for the sender's rate limit",
            m.rate_limit_wait.clone(),
        );
        registry.register(
            "reconcile_bad_answers",
            "Answers or items of the sender's list API not as documented, by kind",
            m.bad_answers.clone(),
        );
        registry.register(
            "reconcile_last_complete_walk_timestamp_seconds",
            "Unix time the last complete reconciliation walk ended",
            m.last_complete_walk.clone(),
        );
        registry.register(
            "reconcile_key_refused",
            "1 while the sender refuses the route's API key and its reconciler is stopped",
            m.key_refused.clone(),
        );
        m
    }
}

/// The route label of requests whose path matches no route.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// A request duration histogram with hookgate's latency buckets.
fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The exposition formats `/metrics` answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4: what `curl` and most scrapers read.
    Text,
    /// OpenMetrics 1.0.0 text, for a scraper that asks for it.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when `accept` lists `application/openmetrics-text` with a non-zero
    /// quality (Prometheus sends that), else the text format.
    pub fn from_accept(accept: Option<&str>) -> Self {
        let wants_openmetrics = accept.unwrap_or_default().split(',').any(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f64>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
        });
        if wants_openmetrics {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(metrics: &Metrics, route: &str, outcome: &str) -> Option<String> {
        let line = format!("hookgate_requests_total{{route=\"{route}\",outcome=\"{outcome}\"}} ");
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()).map(str::to_owned))
    }

    #[test]
    fn route_counters_exist_at_zero_and_count_into_the_family() {
        let metrics = Metrics::new();
        let requests = metrics.route_counters("botix");
        for outcome in REQUEST_OUTCOMES {
            assert_eq!(sample(&metrics, "botix", outcome).as_deref(), Some("0"));
        }
        requests.count("accepted");
        requests.count("accepted");
        requests.count("timeout");
        // Not in the list: counted all the same.
        requests.count("something_new");
        assert_eq!(sample(&metrics, "botix", "accepted").as_deref(), Some("2"));
        assert_eq!(sample(&metrics, "botix", "timeout").as_deref(), Some("1"));
        assert_eq!(
            sample(&metrics, "botix", "something_new").as_deref(),
            Some("1")
        );
        // The same series as the label-building path.
        metrics.count_request("botix", "accepted");
        assert_eq!(sample(&metrics, "botix", "accepted").as_deref(), Some("3"));
    }

    #[test]
    fn the_format_follows_accept_and_defaults_to_text() {
        let prometheus = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        for (accept, format) in [
            (None, Format::Text),
            (Some("*/*"), Format::Text),
            (Some("text/plain"), Format::Text),
            (Some(prometheus), Format::OpenMetrics),
            (Some("Application/OpenMetrics-Text"), Format::OpenMetrics),
            (
                Some("application/openmetrics-text;q=0, text/plain"),
                Format::Text,
            ),
        ] {
            assert_eq!(Format::from_accept(accept), format, "{accept:?}");
        }
    }

    #[test]
    fn both_formats_carry_the_same_series_and_only_openmetrics_ends_in_eof() {
        let metrics = Metrics::new();
        let counters = metrics.route_counters("botix");
        counters.count("accepted");
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
    fn every_guard_drop_reason_has_a_counter_made_at_start_up() {
        for drop in crate::guard::decide::GuardDrop::ALL {
            assert!(DROP_REASONS.contains(&drop.as_str()), "{drop}");
        }
    }

    #[test]
    fn drop_counters_exist_at_zero_and_count_into_the_family() {
        let metrics = Metrics::new();
        let counters = metrics.route_counters("botix");
        let drops = |reason: &str| {
            let line =
                format!("hookgate_dropped_events_total{{route=\"botix\",reason=\"{reason}\"}} ");
            metrics
                .render()
                .lines()
                .find_map(|l| l.strip_prefix(line.as_str()).map(str::to_owned))
        };
        for reason in DROP_REASONS {
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
}
