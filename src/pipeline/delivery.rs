//! A webhook delivery's way in: run to its end, so a client that goes away does not cut it
//! short; then the signature, the route's rate limit and the parse, after which the
//! event is admitted like any other; and the counters of how it ended.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::budget::Charge;
use crate::ingress::event::{self, Delivery, Event, RequestId};
use crate::ingress::trace::TraceContext;
use crate::pipeline::outcome::Outcome;
use crate::pipeline::route::RouteRuntime;
use crate::pipeline::runs_to_end::RunsToEnd;

use super::Pipeline;

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
    /// Handles one delivery, to its end. Once a delivery is past verification it may
    /// publish, and a publish must be followed by its guard state and done marks; if the
    /// client resets the stream or closes the connection, hyper drops the request's future,
    /// and the delivery goes on in a task of its own ([`RunsToEnd`]). Polled by the
    /// request itself otherwise: no task and no wake-up of its own.
    pub fn handle_to_end(
        self: &Arc<Self>,
        route: Arc<RouteRuntime>,
        delivery: Delivery,
        charge: Charge,
    ) -> RunsToEnd<impl Future<Output = (Outcome, String)> + Send + 'static> {
        let pipeline = self.clone();
        RunsToEnd::new(
            self.tasks
                .track_future(async move { pipeline.handle(&route, delivery, charge).await }),
        )
    }

    /// Waits, at most `grace`, for the deliveries still running (their clients may have
    /// gone away), so shutdown does not cut one short between the broker's
    /// confirm and its state. True if all finished.
    pub async fn finish_running(&self, grace: Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(grace, self.tasks.wait()).await.is_ok()
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
        let span = tracing::info_span!("delivery", trace_id = trace.trace_id().as_str());
        let received = Received {
            delivery,
            charge,
            request_id,
            trace,
            now_ms,
        };
        // Not boxed here: the whole delivery is in one box already (`handle_to_end`), which
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
}
