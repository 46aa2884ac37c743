//! One delivery's way through hookgate: verify → parse → freshness → dedup → guard →
//! publish (or spool) → [`Outcome`]. No HTTP here: `http` maps outcomes to answers. The
//! outcomes and drop reasons are in `outcome`, the routes and settings in `route`, the
//! AMQP message of an event in `message`.

mod message;
mod outcome;
mod route;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::budget::Charge;
use crate::clock::Clock;
use crate::config::fits_short_string;
use crate::guard::{Check, GuardState};
use crate::ingress::event::{self, Delivery, Event, ParseError, RequestId};
use crate::ingress::trace::TraceContext;
use crate::outbox::spooling::SpoolError;
use crate::outbox::{Delivered, Outbox};
use crate::state::decision::{Decided, EventRecord, RequestRecord, Source};
use crate::state::keys::StoreKey;
use crate::state::{Claimed, StateStore};
use crate::store_error::StoreError;

pub use message::{rfc3339, routing_key};
pub use outcome::{drop_reasons, FreshnessDrop, Outcome, RETRY_AFTER_BUSY};
pub use route::{CompiledRoute, PipelineSettings, RouteRuntime};

use message::message;

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
    /// Deliveries running in tasks of their own (see [`Pipeline::spawn_handle`]).
    tasks: TaskTracker,
}

/// A delivery as it reached the pipeline, with what is learned of it on arrival.
struct Received {
    delivery: Delivery,
    /// The body's bytes in the unverified body budget, given back once the signature is
    /// checked.
    charge: Charge,
    request_id: RequestId,
    trace: TraceContext,
    /// When it arrived, by the pipeline's clock.
    now_ms: i64,
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
    async fn handle(
        &self,
        route: &RouteRuntime,
        delivery: Delivery,
        charge: Charge,
    ) -> (Outcome, String) {
        let name = route.config.name.as_str();
        let request_id = RequestId::of(&delivery.headers, route.config.profile);
        let now_ms = self.now_ms();
        let echoed = request_id.value.clone();
        let trace = TraceContext::of(&delivery.headers);
        // Every line logged for this delivery names its trace (INFO: WARN lines need it).
        let span = tracing::info_span!("delivery", trace_id = trace.trace_id());
        let received = Received {
            delivery,
            charge,
            request_id,
            trace,
            now_ms,
        };
        // Not boxed: a delivery runs in a task of its own (`spawn_handle`), whose memory
        // holds the kilobytes of its state machine where they are polled, never moved.
        let outcome = self.run(route, received).instrument(span.clone()).await;
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

    /// A delivery from its signature to its outcome; a failing store makes it a 503.
    async fn run(&self, route: &RouteRuntime, received: Received) -> Outcome {
        let now_ms = received.now_ms;
        let event = match self.verified_event(route, received) {
            Ok(event) => event,
            Err(refused) => return refused,
        };
        match self.admit(route, &event, now_ms).await {
            Ok(outcome) => outcome,
            Err(error) => {
                self.store_errors.inc();
                // WARN per request; an outage of the shared store is reported once at ERROR
                // by the health check, so the log is not flooded while the sender retries.
                // The fault, and whether waiting may cure it, tell the operator what to do.
                tracing::warn!(
                    route = route.config.name.as_str(),
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

    /// The event of a delivery whose signature verifies, within the route's rate limit;
    /// else the outcome that refuses it. The body's bytes leave the unverified body
    /// budget (`charge`) once the signature is checked.
    fn verified_event(&self, route: &RouteRuntime, received: Received) -> Result<Event, Outcome> {
        let Received {
            delivery,
            charge,
            request_id,
            trace,
            now_ms,
        } = received;
        let secrets = route.secrets.current();
        let verified = delivery.verify(&route.scheme, &secrets, now_ms / 1000);
        drop(charge);
        let verified = verified.map_err(|reason| {
            // The reason is for the operator at debug level; the sender learns nothing.
            tracing::debug!(route = route.config.name.as_str(), %reason, "signature refused");
            Outcome::InvalidSignature
        })?;
        // Only a verified delivery spends the route's bucket: forgeries must not use up
        // the sender's share.
        if let Some(limiter) = &route.limiter {
            limiter
                .try_take()
                .map_err(|retry_after| Outcome::RateLimited { retry_after })?;
        }
        event::parse(verified, &route.fields, request_id, trace).map_err(Outcome::BadRequest)
    }

    /// Handles one event reconciliation made of a message the sender's list API gave:
    /// freshness, dedup, guard and publish-or-spool, like a delivery past its signature
    /// (the API call was authenticated by the route's key). Its message carries
    /// `x-source: reconcile` (its request id says so). Not counted as a request: the
    /// reconciler counts what it finds.
    pub async fn handle_listed(&self, route: &RouteRuntime, event: Event) -> Outcome {
        let name = route.config.name.as_str();
        let now_ms = self.now_ms();
        match self.admit(route, &event, now_ms).await {
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

    /// Publishes again an event an operator's replay made of a listed message: routing
    /// keys, freshness, then the guard under its key's lock ([`GuardState::check_replayed`]:
    /// a repeat of the newest state passes, an older event is dropped) and publish-or-spool.
    /// The dedup marks are neither consulted nor written: a replay exists to publish what
    /// they say was published. Its message carries `x-source: replay` (its request id says
    /// so). Not counted as a request: the replay counts what it publishes.
    ///
    /// [`GuardState::check_replayed`]: crate::guard::GuardState::check_replayed
    pub async fn handle_replayed(&self, route: &RouteRuntime, event: &Event) -> Outcome {
        let name = route.config.name.as_str();
        let now_ms = self.now_ms();
        if !self.routing_keys_fit(route, event) {
            return Outcome::BadRequest(ParseError::RoutingKeyTooLong);
        }
        if let Some(reason) = self.freshness(event, now_ms) {
            return Outcome::Dropped {
                event_id: event.id.clone(),
                reason: reason.as_str(),
            };
        }
        let delivered = match self
            .guards
            .check_replayed(name, &route.guard, event, now_ms)
            .await
        {
            Ok(check) => self
                .deliver_checked(
                    route,
                    event,
                    check,
                    now_ms,
                    (&[], 0, tokio::time::Instant::now()),
                )
                .await
                .map_err(|failure| failure.error),
            Err(error) => Err(error),
        };
        if let Ok((Outcome::Accepted { .. }, _)) = &delivered {
            let keys = DedupKeys::of(route, event);
            self.count_delivery(&keys, Source::Replay, None, now_ms)
                .await;
        }
        delivered.map(|(outcome, _)| outcome).unwrap_or_else(|error| {
            self.store_errors.inc();
            tracing::warn!(route = name, event_id = %event.id, %error, "store failed; the replay stops here");
            Outcome::Unavailable {
                retry_after: error.retry_after_secs(),
            }
        })
    }

    /// The steps of an event past its signature: its routing keys must fit, it must be
    /// fresh, and then it is deduplicated, guarded and delivered.
    async fn admit(
        &self,
        route: &RouteRuntime,
        event: &Event,
        now_ms: i64,
    ) -> Result<Outcome, StoreError> {
        if !self.routing_keys_fit(route, event) {
            return Ok(Outcome::BadRequest(ParseError::RoutingKeyTooLong));
        }
        if let Some(reason) = self.freshness(event, now_ms) {
            return Ok(Outcome::Dropped {
                event_id: event.id.clone(),
                reason: reason.as_str(),
            });
        }
        self.process(route, event, now_ms).await
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
    fn freshness(&self, event: &Event, now_ms: i64) -> Option<FreshnessDrop> {
        let ts = event.timestamp_ms?;
        if ts < now_ms - self.settings.ttl.as_millis() as i64 {
            Some(FreshnessDrop::Expired)
        } else if ts > now_ms + self.settings.skew_ms {
            Some(FreshnessDrop::FutureTimestamp)
        } else {
            None
        }
    }

    /// Claims the event's dedup keys, decides and delivers it if the claim is this
    /// request's, and settles the claim.
    async fn process(
        &self,
        route: &RouteRuntime,
        event: &Event,
        now_ms: i64,
    ) -> Result<Outcome, StoreError> {
        let keys = DedupKeys::of(route, event);
        let token: u64 = rand::random();
        // The claims are taken after this instant, so their leases end after it plus the
        // lease: the publish must start in time to finish before ([`Self::deliver_checked`]).
        let began = tokio::time::Instant::now();
        if let Some(answered) = self.claim(&keys, token, event).await? {
            return Ok(answered);
        }
        let result = self
            .decide_and_deliver(route, event, now_ms, (&keys, token, began))
            .await;
        match result {
            Ok(decided) => {
                let result = Ok(decided);
                self.settle(&keys, token, event, now_ms, &result).await?;
                result.map(|(outcome, _)| outcome)
            }
            Err(Failure {
                error,
                left: Some(how),
            }) => {
                // The event left (published or spooled) and then its guard commit failed:
                // its claims are kept, never released, and marked done where they still
                // hold, so the sender's retry is a duplicate instead of being decided and
                // published again. Marks that cannot be written leave the claims to end
                // with their lease.
                let decided = accepted_as(how);
                if let Err(error) = self.mark(&keys, token, event, now_ms, decided).await {
                    tracing::warn!(event_id = %event.id, %error, "an event that left has no done marks; its claims end with their lease");
                }
                Err(error)
            }
            Err(Failure { error, left: None }) => {
                let result = Err(error);
                self.settle(&keys, token, event, now_ms, &result).await?;
                result.map(|(outcome, _): (Outcome, Option<Delivered>)| outcome)
            }
        }
    }

    /// Claims `keys` under `token`, waiting for a claim held by another request. `None`
    /// when the claim is this request's; else the outcome: a duplicate, or busy.
    async fn claim(
        &self,
        keys: &DedupKeys,
        token: u64,
        event: &Event,
    ) -> Result<Option<Outcome>, StoreError> {
        let claimed = self
            .state
            .claim_or_wait(
                &keys.event,
                keys.request.as_ref(),
                token,
                self.settings.in_flight_wait,
                self.settings.in_flight_lease,
                || self.now_ms(),
            )
            .await?;
        match claimed {
            Claimed::Owned => Ok(None),
            Claimed::Duplicate { by_request } => {
                // 200 only once the mark found is on disk: it may be a concurrent request's,
                // still on its way, and a crash must not let the 200 stand for a mark that
                // is gone. A mark written long ago waits for nothing.
                self.timed_sync(self.state.sync_keys(&keys.all())).await?;
                let now_ms = self.now_ms();
                let request = event
                    .request_id_from_sender
                    .then_some(event.request_id.as_str());
                let counted = self
                    .count_delivery(keys, source_of(event), request, now_ms)
                    .await;
                if let (false, Some(expires_ms)) = (by_request, counted) {
                    self.keep_request(keys, now_ms, expires_ms).await;
                }
                Ok(Some(Outcome::Duplicate {
                    event_id: event.id.clone(),
                }))
            }
            Claimed::Busy => Ok(Some(Outcome::Unavailable {
                retry_after: RETRY_AFTER_BUSY,
            })),
        }
    }

    /// Counts one more delivery of a decided event in its record: its source and the
    /// request id it came under; the event mark's expiry when counted. One write of the
    /// mark's record, which nobody waits for; a failure loses the count, never the answer,
    /// so it is only logged.
    async fn count_delivery(
        &self,
        keys: &DedupKeys,
        source: Source,
        request: Option<&str>,
        now_ms: i64,
    ) -> Option<i64> {
        let counted = self
            .state
            .update_record(&keys.event, now_ms, |bytes| {
                let mut record = EventRecord::decode(bytes)?;
                record.count_delivery(source, request);
                Some(record.encode())
            })
            .await;
        counted.unwrap_or_else(|error| {
            tracing::debug!(%error, "delivery not counted in the decision record");
            None
        })
    }

    /// Marks the request id a duplicate came under (a re-send: a new request id for an
    /// event decided before), pointing to its event, until its event's mark expires, so
    /// `inspect request` finds it and its own retries are answered from it. Logged only
    /// when it fails, like the count.
    async fn keep_request(&self, keys: &DedupKeys, now_ms: i64, expires_ms: i64) {
        let Some(request) = &keys.request else {
            return;
        };
        let record = keys.request_record().encode();
        let kept = self
            .state
            .mark_done_if_free(request, &record, now_ms, expires_ms)
            .await;
        if let Err(error) = kept {
            tracing::debug!(%error, "a duplicate's request id not kept");
        }
    }

    /// Ends the claim of `keys` as `result` says: an accepted or dropped event's keys are
    /// marked done with their decision records and synced, any other ending releases them.
    async fn settle(
        &self,
        keys: &DedupKeys,
        token: u64,
        event: &Event,
        received_ms: i64,
        result: &Result<(Outcome, Option<Delivered>), StoreError>,
    ) -> Result<(), StoreError> {
        let decided = match result {
            Ok((Outcome::Accepted { .. }, Some(how))) => Some(accepted_as(*how)),
            Ok((Outcome::Accepted { .. }, None)) => Some(Decided::Published),
            Ok((Outcome::Dropped { reason, .. }, _)) => Some(Decided::Dropped(reason)),
            _ => None,
        };
        if let Some(decided) = decided {
            // A drop is final too: the sender got its 200, and a retry must not be judged
            // against state that has moved on since.
            return self.mark(keys, token, event, received_ms, decided).await;
        }
        // Both claims are released even when one release fails; the first failure is the
        // answer.
        let mut released = Ok(());
        for key in keys.all() {
            let r = self.state.release(key, token).await;
            released = released.and(r);
        }
        released?;
        Ok(())
    }

    /// Marks `keys` done under the claim `token` took, each with its decision record, and
    /// waits until that is durable.
    async fn mark(
        &self,
        keys: &DedupKeys,
        token: u64,
        event: &Event,
        received_ms: i64,
        decided: Decided,
    ) -> Result<(), StoreError> {
        let source = source_of(event);
        // Only a webhook's request id is on a ticket; reconciliation's and a replay's are
        // made here and say nothing the source does not.
        let request = (source == Source::Webhook).then_some(event.request_id.as_str());
        let event_record = EventRecord::first(received_ms, decided, source, request).encode();
        let request_record = keys.request_record().encode();
        let mut marks: Vec<(&StoreKey, &[u8])> = vec![(&keys.event, &event_record)];
        if let Some(request) = &keys.request {
            marks.push((request, &request_record));
        }
        let (now, ttl) = (self.now_ms(), self.settings.ttl);
        self.state
            .mark_done(&marks, token, now, event.timestamp_ms, ttl)
            .await?;
        // The guard state and the marks are on disk before the 200 (contract §4). If they
        // cannot be, the answer is 503 and the retry finds the marks in memory.
        self.timed_sync(self.state.sync()).await
    }

    /// Waits for `sync`, a wait for state to be durable, and counts how long it took.
    async fn timed_sync(
        &self,
        sync: impl std::future::Future<Output = Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let synced = sync.await;
        self.sync_duration.observe(started.elapsed().as_secs_f64());
        synced
    }

    async fn decide_and_deliver(
        &self,
        route: &RouteRuntime,
        event: &Event,
        now_ms: i64,
        (keys, token, began): (&DedupKeys, u64, tokio::time::Instant),
    ) -> Result<(Outcome, Option<Delivered>), Failure> {
        let name = route.config.name.as_str();
        let check = self
            .guards
            .check(name, &route.guard, event, now_ms)
            .await
            .map_err(Failure::before)?;
        self.deliver_checked(route, event, check, now_ms, (&keys.all(), token, began))
            .await
    }

    /// Publishes (or spools) an event the guard accepted and commits its check, or answers
    /// the guard's drop; with how an accepted event went out. Before the publish, the
    /// leases it goes out under (`claims`, the claims their token holds, and the guard key's
    /// lock) are secured against a failover ([`StateStore::secure`]). A request that reaches
    /// its publish too late to finish within its leases (a stalled process) publishes
    /// nothing and answers 503.
    async fn deliver_checked(
        &self,
        route: &RouteRuntime,
        event: &Event,
        check: Check,
        now_ms: i64,
        (claims, token, began): (&[&StoreKey], u64, tokio::time::Instant),
    ) -> Result<(Outcome, Option<Delivered>), Failure> {
        let name = route.config.name.as_str();
        let held = match check {
            Check::Drop(reason) => {
                self.publish_drop_copy(route, event, now_ms).await;
                let outcome = Outcome::Dropped {
                    event_id: event.id.clone(),
                    reason: reason.as_str(),
                };
                return Ok((outcome, None));
            }
            Check::Accept(held) => Some(held),
            Check::Unguarded => None,
        };
        let renewing = tokio::time::Instant::now();
        let secured = self
            .state
            .secure(claims, token, held.as_ref().map(|h| h.lock()))
            .await
            .and_then(|renewed| {
                let since = if renewed { renewing } else { began };
                if since.elapsed() > self.settings.publish_by {
                    return Err(StoreError::LeaseLost(
                        "the request reached its publish too late to finish within its lease (a stalled process?); nothing was published",
                    ));
                }
                Ok(())
            });
        if let Err(error) = secured {
            if let Some(held) = held {
                self.guards.abandon(held).await;
            }
            return Err(Failure::before(error));
        }
        let mut msg = message(route, event, &self.settings.routing_key, now_ms);
        msg.order_key = route.guard.order_key(name, event).map(Cow::Owned);
        match self.outbox.deliver(&msg).await {
            Ok(how) => {
                if let Some(held) = held {
                    self.guards
                        .commit(held, now_ms)
                        .await
                        .map_err(|error| Failure {
                            error,
                            left: Some(how),
                        })?;
                }
                if matches!(how, Delivered::Spooled | Delivered::Held) {
                    tracing::debug!(route = name, event_id = %event.id, "event spooled");
                }
                let outcome = Outcome::Accepted {
                    event_id: event.id.clone(),
                };
                Ok((outcome, Some(how)))
            }
            Err(error) => {
                if let Some(held) = held {
                    self.guards.abandon(held).await;
                }
                let SpoolError::Store(error) = error else {
                    return Ok((self.unavailable(name, event, error), None));
                };
                Err(Failure::before(error.into()))
            }
        }
    }

    fn unavailable(&self, name: &str, event: &Event, error: SpoolError) -> Outcome {
        tracing::warn!(route = name, event_id = %event.id, %error, "event not accepted; answering 503");
        Outcome::Unavailable {
            retry_after: crate::outbox::spooling::retry_after_secs(&error),
        }
    }

    /// The audit copy of a dropped event, when the config names a key for it.
    async fn publish_drop_copy(&self, route: &RouteRuntime, event: &Event, now_ms: i64) {
        if let Some(template) = &self.settings.dropped_routing_key {
            let msg = message(route, event, template, now_ms);
            self.outbox.publish_audit(&msg).await;
        }
    }
}

/// A store failure on the way of an event, and how the event had left (published or
/// spooled) before it, if it had: the claims of one that left are never released.
struct Failure {
    error: StoreError,
    left: Option<Delivered>,
}

impl Failure {
    /// A failure before anything left.
    fn before(error: StoreError) -> Self {
        Self { error, left: None }
    }
}

/// The record of an accepted event that went out as `how`.
fn accepted_as(how: Delivered) -> Decided {
    match how {
        Delivered::Published => Decided::Published,
        Delivered::Spooled => Decided::Spooled,
        Delivered::Held => Decided::Held,
    }
}

/// The path that brought `event`, read from its request id as its message's `x-source`
/// is.
fn source_of(event: &Event) -> Source {
    use crate::outbox::message::{RECONCILE_REQUEST_PREFIX, REPLAY_REQUEST_PREFIX};
    if event.request_id.starts_with(RECONCILE_REQUEST_PREFIX) {
        Source::Reconcile
    } else if event.request_id.starts_with(REPLAY_REQUEST_PREFIX) {
        Source::Replay
    } else {
        Source::Webhook
    }
}

/// The store keys an event is deduplicated under: its own, and the sender's request id
/// when the route's profile says the sender sends one.
struct DedupKeys {
    event: StoreKey,
    request: Option<StoreKey>,
    /// The id the event key is made of, and whether it is an inbound message's.
    event_id: (String, bool),
}

impl DedupKeys {
    fn of(route: &RouteRuntime, event: &Event) -> Self {
        let name = route.config.name.as_str();
        // On a route that reconciles, an inbound message is one event whichever path
        // brought it: its dedup key is its message id, not the event id of either path.
        let (event_key, event_id) = match route.fields.inbound_message_id(event) {
            Some(message_id) => (
                StoreKey::message(name, &message_id),
                (message_id.into_owned(), true),
            ),
            None => (StoreKey::event(name, &event.id), (event.id.clone(), false)),
        };
        let request = event
            .request_id_from_sender
            .then(|| StoreKey::request(name, &event.request_id));
        Self {
            event: event_key,
            request,
            event_id,
        }
    }

    /// What the request id's mark records: the event key it was decided under.
    fn request_record(&self) -> RequestRecord {
        RequestRecord {
            event_id: self.event_id.0.clone(),
            by_message: self.event_id.1,
        }
    }

    /// The keys, the event's first.
    fn all(&self) -> Vec<&StoreKey> {
        std::iter::once(&self.event)
            .chain(self.request.as_ref())
            .collect()
    }
}
