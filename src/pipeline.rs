//! One delivery's way through hookgate: verify → parse → freshness → dedup → guard →
//! publish (or spool) → [`Outcome`]. No HTTP here: `http` maps outcomes to answers.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::budget::Charge;
use crate::clock::Clock;
use crate::config::{fits_short_string, Config, Route};
use crate::guard::{Check, GuardState, RouteGuard};
use crate::ingress::event::{self, Delivery, Event, EventFields, ParseError, RequestId};
use crate::ingress::secrets::RouteSecrets;
use crate::ingress::signature::Scheme;
use crate::ingress::trace::TraceContext;
use crate::metrics::{Metrics, RouteCounters};
use crate::outbox::message::Message;
use crate::outbox::spool::SpoolError;
use crate::outbox::{Delivered, Outbox};
use crate::ratelimit::TokenBucket;
use crate::state::keys::StoreKey;
use crate::state::{Claimed, StateStore};
use crate::store::StoreError;

/// Seconds a sender should wait after a 503 no error caused: a claim or a guard lock held
/// by another request for the whole wait.
pub const RETRY_AFTER_BUSY: u64 = crate::store::RETRY_AFTER_TRANSIENT_SECS;

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
    /// The label used in metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Accepted { .. } => "accepted",
            Outcome::Duplicate { .. } => "duplicate",
            Outcome::Dropped { .. } => "dropped",
            Outcome::InvalidSignature => "invalid_signature",
            Outcome::BadRequest(_) => "bad_request",
            Outcome::RateLimited { .. } => "rate_limited",
            Outcome::Unavailable { .. } => "unavailable",
        }
    }
}

/// A route built from its config before any port is bound: secrets loaded, signature
/// scheme, fields and guard rules compiled.
pub struct CompiledRoute {
    /// The route's config.
    pub config: Route,
    /// Where its events' id, type and time are.
    pub fields: EventFields,
    /// Its signature scheme.
    pub scheme: Scheme,
    /// Its active secrets (reloadable).
    pub secrets: RouteSecrets,
    /// Its guard rules.
    pub guard: RouteGuard,
}

/// A route as requests use it: compiled, with its rate limit on the serving clock and its
/// counters.
pub struct RouteRuntime {
    /// The route's config.
    pub config: Route,
    /// Where its events' id, type and time are.
    pub fields: EventFields,
    /// Its signature scheme.
    pub scheme: Scheme,
    /// Its active secrets (reloadable).
    pub secrets: RouteSecrets,
    /// Its guard rules.
    pub guard: RouteGuard,
    /// Its rate limit for verified deliveries, if configured.
    pub limiter: Option<TokenBucket>,
    /// Its request, drop, duplicate and signature counters.
    pub counters: RouteCounters,
}

impl RouteRuntime {
    /// `route` with its rate limit on `clock` and its counters in `metrics`.
    pub fn new(route: CompiledRoute, metrics: &Metrics, clock: &Clock) -> Self {
        let CompiledRoute {
            config,
            fields,
            scheme,
            secrets,
            guard,
        } = route;
        Self {
            limiter: config
                .rate_limit
                .as_ref()
                .map(|r| TokenBucket::new(r.per_second, r.burst, clock.clone())),
            counters: metrics.route_counters(&config.name),
            config,
            fields,
            scheme,
            secrets,
            guard,
        }
    }
}

/// Settings the pipeline reads on every request.
pub struct Settings {
    routing_key: String,
    dropped_routing_key: Option<String>,
    ttl: Duration,
    skew_ms: i64,
    in_flight_wait: Duration,
    in_flight_lease: Duration,
}

impl Settings {
    /// The settings of `config`.
    pub fn of(config: &Config) -> Self {
        Self {
            routing_key: config.amqp.routing_key.clone(),
            dropped_routing_key: config.amqp.dropped_routing_key.clone(),
            ttl: config.dedup.ttl,
            skew_ms: config.max_clock_skew.as_millis() as i64,
            in_flight_wait: config.dedup.in_flight_wait,
            in_flight_lease: config.dedup.in_flight_lease,
        }
    }
}

/// The request path, with the handles it needs and no others.
pub struct Pipeline {
    /// Routes in config order.
    routes: Vec<Arc<RouteRuntime>>,
    settings: Settings,
    state: Arc<StateStore>,
    guards: GuardState,
    outbox: Outbox,
    /// Requests answered 503 because the state store failed.
    store_errors: Counter,
    clock: Clock,
    /// Deliveries running in tasks of their own (see [`Pipeline::spawn_handle`]).
    tasks: TaskTracker,
}

impl Pipeline {
    /// The request path over `routes`.
    pub fn new(
        settings: Settings,
        routes: Vec<Arc<RouteRuntime>>,
        state: Arc<StateStore>,
        outbox: Outbox,
        store_errors: Counter,
        clock: Clock,
    ) -> Self {
        Self {
            routes,
            settings,
            guards: GuardState::new(state.clone()),
            state,
            outbox,
            store_errors,
            clock,
            tasks: TaskTracker::new(),
        }
    }

    /// The route served at `path`.
    pub fn route(&self, path: &str) -> Option<&Arc<RouteRuntime>> {
        self.routes.iter().find(|r| r.config.path == path)
    }

    /// Handles one delivery in a task of its own. Once a delivery is past verification it
    /// may publish, and a publish must be followed by its guard state and done marks; if
    /// the client resets the stream or closes the connection, hyper drops the request's
    /// future, but not this task, so the delivery still runs to the end.
    pub fn spawn_handle(
        self: &Arc<Self>,
        route: Arc<RouteRuntime>,
        delivery: Delivery,
        charge: Charge,
    ) -> tokio::task::JoinHandle<(Outcome, String)> {
        let pipeline = self.clone();
        self.tasks
            .spawn(async move { pipeline.handle(&route, delivery, charge).await })
    }

    /// Waits, at most `grace`, for the deliveries still running in their own tasks (their
    /// clients may have gone away), so shutdown does not cut one short between the broker's
    /// confirm and its state. True if all finished.
    pub async fn finish_running(&self, grace: Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(grace, self.tasks.wait()).await.is_ok()
    }

    /// The current time of the injected clock.
    fn now_ms(&self) -> i64 {
        (self.clock)()
    }

    /// Handles one delivery on `route`. `charge` holds the body's bytes in the
    /// unverified body budget and is given back once the signature is checked. Returns the
    /// outcome and the request id to echo in `X-Request-Id`.
    pub async fn handle(
        &self,
        route: &RouteRuntime,
        delivery: Delivery,
        charge: Charge,
    ) -> (Outcome, String) {
        let name = route.config.name.as_str();
        let request_id = RequestId::of(&delivery.headers, route.config.profile);
        let now_ms = self.now_ms();
        let echoed = request_id.value.clone();
        // Boxed: the state machine of a whole delivery is kilobytes, and every future that
        // wraps it (hyper's, the panic guard's, the handler's) would copy it as it moves.
        let trace = TraceContext::of(&delivery.headers);
        // Every line logged for this delivery names its trace (INFO: WARN lines need it).
        let span = tracing::info_span!("delivery", trace_id = trace.trace_id());
        let outcome = Box::pin(self.run(route, delivery, charge, request_id, trace, now_ms))
            .instrument(span.clone())
            .await;
        let _in_span = span.enter();
        match &outcome {
            Outcome::Duplicate { .. } => {
                route.counters.dedup_hits.inc();
            }
            Outcome::Dropped { event_id, reason } => {
                route.counters.count_drop(reason);
                // DEBUG: a retry storm of stale statuses would flood the log at INFO; the
                // drops are counted by reason in the metrics.
                tracing::debug!(route = name, event_id = %event_id, reason, "event dropped");
            }
            Outcome::InvalidSignature => {
                route.counters.signature_failures.inc();
            }
            _ => {}
        }
        (outcome, echoed)
    }

    async fn run(
        &self,
        route: &RouteRuntime,
        delivery: Delivery,
        charge: Charge,
        request_id: RequestId,
        trace: TraceContext,
        now_ms: i64,
    ) -> Outcome {
        let name = route.config.name.as_str();
        let secrets = route.secrets.current();
        let verified = delivery.verify(&route.scheme, &secrets, now_ms / 1000);
        drop(charge);
        let verified = match verified {
            Ok(v) => v,
            Err(reason) => {
                // The reason is for the operator at debug level; the sender learns nothing.
                tracing::debug!(route = name, %reason, "signature refused");
                return Outcome::InvalidSignature;
            }
        };
        // Only a verified delivery spends the route's bucket: forgeries must not use up
        // the sender's share.
        if let Some(limiter) = &route.limiter {
            if let Err(retry_after) = limiter.try_take() {
                return Outcome::RateLimited { retry_after };
            }
        }
        let event = match event::parse(verified, &route.fields, request_id, trace) {
            Ok(e) => e,
            Err(e) => return Outcome::BadRequest(e),
        };
        if !self.routing_keys_fit(route, &event) {
            return Outcome::BadRequest(ParseError::RoutingKeyTooLong);
        }
        if let Some(reason) = self.freshness(&event, now_ms) {
            return Outcome::Dropped {
                event_id: event.id,
                reason,
            };
        }
        match self.process(route, &event, now_ms).await {
            Ok(outcome) => outcome,
            Err(error) => {
                self.store_errors.inc();
                // WARN per request; an outage of the shared store is reported once at ERROR
                // by the health check, so the log is not flooded while the sender retries.
                // The fault, and whether waiting may cure it, tell the operator what to do.
                tracing::warn!(
                    route = name,
                    event_id = %event.id,
                    %error,
                    fault = error.fault(),
                    transient = error.is_transient(),
                    "store failed; answering 503"
                );
                Outcome::Unavailable {
                    retry_after: error.retry_after_secs(),
                }
            }
        }
    }

    /// Handles one event reconciliation made of a message the sender's list API gave:
    /// freshness, dedup, guard and publish-or-spool, like a delivery past its signature
    /// (the API call was authenticated by the route's key). Its message carries
    /// `x-source: reconcile` (its request id says so). Not counted as a request: the
    /// reconciler counts what it finds.
    pub async fn handle_listed(&self, route: &RouteRuntime, event: Event) -> Outcome {
        let name = route.config.name.as_str();
        let now_ms = self.now_ms();
        if !self.routing_keys_fit(route, &event) {
            return Outcome::BadRequest(ParseError::RoutingKeyTooLong);
        }
        if let Some(reason) = self.freshness(&event, now_ms) {
            return Outcome::Dropped {
                event_id: event.id,
                reason,
            };
        }
        match self.process(route, &event, now_ms).await {
            Ok(outcome) => outcome,
            Err(error) => {
                self.store_errors.inc();
                tracing::warn!(route = name, event_id = %event.id, %error, "store failed; the walk stops here");
                Outcome::Unavailable {
                    retry_after: error.retry_after_secs(),
                }
            }
        }
    }

    /// Whether every routing key the event may be published with (its own, and the drop
    /// copy's) fits an AMQP short string. Checked before anything is recorded, so the
    /// refusal is final and nothing is spooled that could never be sent.
    fn routing_keys_fit(&self, route: &RouteRuntime, event: &Event) -> bool {
        let name = route.config.name.as_str();
        std::iter::once(&self.settings.routing_key)
            .chain(self.settings.dropped_routing_key.as_ref())
            .all(|template| fits_short_string(&routing_key(template, name, &event.event_type)))
    }

    /// An event older than the dedup TTL could be a replay dedup no longer recognises; one
    /// far in the future would outlive its own dedup mark.
    fn freshness(&self, event: &Event, now_ms: i64) -> Option<&'static str> {
        let ts = event.timestamp_ms?;
        if ts < now_ms - self.settings.ttl.as_millis() as i64 {
            Some("expired")
        } else if ts > now_ms + self.settings.skew_ms {
            Some("future_timestamp")
        } else {
            None
        }
    }

    async fn process(
        &self,
        route: &RouteRuntime,
        event: &Event,
        now_ms: i64,
    ) -> Result<Outcome, StoreError> {
        let name = route.config.name.as_str();
        // On a route that reconciles, an inbound message is one event whichever path
        // brought it: its dedup key is its message id, not the event id of either path.
        let ev_key = match route.fields.inbound_message_id(event) {
            Some(message_id) => StoreKey::message(name, &message_id),
            None => StoreKey::event(name, &event.id),
        };
        let req_key = event
            .request_id_from_sender
            .then(|| StoreKey::request(name, &event.request_id));
        let keys: Vec<&StoreKey> = std::iter::once(&ev_key).chain(req_key.as_ref()).collect();
        let token: u64 = rand::random();
        let claimed = self
            .state
            .claim_or_wait(
                &ev_key,
                req_key.as_ref(),
                token,
                self.settings.in_flight_wait,
                self.settings.in_flight_lease,
                || self.now_ms(),
            )
            .await?;
        match claimed {
            Claimed::Owned => {}
            Claimed::Duplicate => {
                // 200 only once the mark found is on disk: it may be a concurrent request's,
                // still on its way, and a crash must not let the 200 stand for a mark that
                // is gone. A mark written long ago waits for nothing.
                self.state.sync_keys(&keys).await?;
                return Ok(Outcome::Duplicate {
                    event_id: event.id.clone(),
                });
            }
            Claimed::Busy => {
                return Ok(Outcome::Unavailable {
                    retry_after: RETRY_AFTER_BUSY,
                });
            }
        }

        let result = self.decide_and_deliver(route, event, now_ms).await;
        match &result {
            Ok(Outcome::Accepted { .. } | Outcome::Dropped { .. }) => {
                // A drop is final too: the sender got its 200, and a retry must not be judged
                // against state that has moved on since.
                self.state
                    .mark_done(
                        &keys,
                        token,
                        self.now_ms(),
                        event.timestamp_ms,
                        self.settings.ttl,
                    )
                    .await?;
                // The guard state and the marks are on disk before the 200 (contract §4). If
                // they cannot be, the answer is 503 and the retry finds the marks in memory.
                self.state.sync().await?;
            }
            _ => {
                // Both claims are released even when one release fails; the first failure
                // is the answer.
                let mut released = Ok(());
                for key in &keys {
                    let r = self.state.release(key, token).await;
                    released = released.and(r);
                }
                released?;
            }
        }
        result
    }

    async fn decide_and_deliver(
        &self,
        route: &RouteRuntime,
        event: &Event,
        now_ms: i64,
    ) -> Result<Outcome, StoreError> {
        let name = route.config.name.as_str();
        let held = match self.guards.check(name, &route.guard, event, now_ms).await? {
            Check::Drop(reason) => {
                self.publish_drop_copy(route, event, now_ms).await;
                return Ok(Outcome::Dropped {
                    event_id: event.id.clone(),
                    reason: reason.as_str(),
                });
            }
            Check::Accept(held) => Some(held),
            Check::Unguarded => None,
        };
        let mut msg = self.message(route, event, &self.settings.routing_key, now_ms);
        msg.order_key = route.guard.order_key(name, event).map(Cow::Owned);
        match self.outbox.deliver(&msg).await {
            Ok(how) => {
                if let Some(held) = held {
                    self.guards.commit(held, now_ms).await?;
                }
                if matches!(how, Delivered::Spooled) {
                    tracing::debug!(route = name, event_id = %event.id, "event spooled");
                }
                Ok(Outcome::Accepted {
                    event_id: event.id.clone(),
                })
            }
            Err(error) => {
                if let Some(held) = held {
                    self.guards.abandon(held).await;
                }
                let SpoolError::Store(error) = error else {
                    return Ok(self.unavailable(name, event, error));
                };
                Err(error)
            }
        }
    }

    fn unavailable(&self, name: &str, event: &Event, error: SpoolError) -> Outcome {
        tracing::warn!(route = name, event_id = %event.id, %error, "event not accepted; answering 503");
        Outcome::Unavailable {
            retry_after: error.retry_after_secs(),
        }
    }

    /// The audit copy of a dropped event, when the config names a key for it.
    async fn publish_drop_copy(&self, route: &RouteRuntime, event: &Event, now_ms: i64) {
        if let Some(template) = &self.settings.dropped_routing_key {
            let msg = self.message(route, event, template, now_ms);
            self.outbox.publish_audit(&msg).await;
        }
    }

    fn message<'e>(
        &self,
        route: &'e RouteRuntime,
        event: &'e Event,
        template: &str,
        now_ms: i64,
    ) -> Message<'e> {
        Message {
            routing_key: routing_key(template, &route.config.name, &event.event_type),
            message_id: Cow::Borrowed(&event.id),
            timestamp_secs: (now_ms / 1000).max(0) as u64,
            request_id: Cow::Borrowed(&event.request_id),
            event_type: Cow::Borrowed(&event.event_type),
            attempt: event.attempt,
            route: Cow::Borrowed(&route.config.name),
            received_at: rfc3339(now_ms),
            order_key: None,
            body: event.body.clone(),
            content_type: event.content_type.as_deref().map(Cow::Borrowed),
            traceparent: Some(Cow::Borrowed(&event.trace.traceparent)),
            tracestate: event.trace.tracestate.as_deref().map(Cow::Borrowed),
        }
    }
}

/// Applies `{route}` and `{event}` to a routing key template.
pub fn routing_key<'e>(template: &str, route: &str, event_type: &'e str) -> Cow<'e, str> {
    if template == "{event}" {
        // The default: the event type itself, without searching the template.
        return Cow::Borrowed(event_type);
    }
    Cow::Owned(
        template
            .replace("{route}", route)
            .replace("{event}", event_type),
    )
}

/// Unix milliseconds as RFC 3339 UTC text (empty if out of range).
pub fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_has_a_precreated_request_counter() {
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
        for outcome in outcomes {
            assert!(
                crate::metrics::REQUEST_OUTCOMES.contains(&outcome.label()),
                "{}",
                outcome.label()
            );
        }
    }

    #[test]
    fn routing_key_template() {
        assert_eq!(
            routing_key("{route}.{event}", "botix", "message.status"),
            "botix.message.status"
        );
        assert_eq!(routing_key("fixed", "r", "e"), "fixed");
        assert_eq!(routing_key("{event}", "r", "e"), "e");
    }

    #[test]
    fn received_at_is_rfc3339_utc() {
        assert_eq!(rfc3339(1_795_946_403_250), "2026-11-29T10:00:03.25Z");
    }
}
