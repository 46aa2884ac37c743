//! A webhook delivery's way in: run to its end, so a client that goes away does not cut it
//! short; then the signature, the route's rate limit and the parse, after which the
//! event is admitted like any other; and the counters of how it ended.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

use crate::budget::Charge;
use crate::ingress::event::{self, Delivery, Event, RequestId};
use crate::ingress::trace::TraceContext;
use crate::pipeline::log_scope::InTrace;
use crate::pipeline::outcome::Outcome;
use crate::pipeline::route::RouteRuntime;
use crate::pipeline::runs_to_end::RunsToEnd;
use crate::store_error::StoreError;

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
    ) -> RunsToEnd<impl Future<Output = (Outcome, Option<HeaderValue>)> + Send + 'static> {
        let trace = TraceContext::of(&delivery.headers);
        // Every line logged for this delivery names its trace; the span that says so is
        // made only for a line (`log_scope`).
        let trace_id = trace.trace_id();
        let handled = self.clone().handle(route, delivery, charge, trace);
        RunsToEnd::new(self.tasks.track_future(InTrace::new(trace_id, handled)))
    }

    /// Waits, at most `grace`, for the deliveries still running (their clients may have
    /// gone away), so shutdown does not cut one short between the broker's
    /// confirm and its state. True if all finished.
    pub async fn finish_running(&self, grace: Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(grace, self.tasks.wait()).await.is_ok()
    }

    /// Handles one delivery on `route`, in its trace's scope. `charge` holds the body's
    /// bytes in the unverified body budget and is given back once the signature is
    /// checked. Returns the outcome and the request id header to echo in `X-Request-Id`.
    async fn handle(
        self: Arc<Self>,
        route: Arc<RouteRuntime>,
        delivery: Delivery,
        charge: Charge,
        trace: TraceContext,
    ) -> (Outcome, Option<HeaderValue>) {
        let name = route.config.name.as_str();
        let request_id = RequestId::of(&delivery.headers, route.config.profile);
        let now_ms = self.now_ms();
        let echoed = request_id.echo();
        let received = Received {
            delivery,
            charge,
            request_id,
            trace,
            now_ms,
        };
        // The steps are awaited here, not in an `async fn` of their own: the whole delivery
        // is in one box (`handle_to_end`), and each `async fn` on the way would be one more
        // copy of the futures inside it.
        let outcome = 'outcome: {
            let event = match self.verified_event(&route, received) {
                Ok(event) => event,
                Err(refused) => break 'outcome refused,
            };
            if let Some(refused) = self.refusal(&route, &event, now_ms) {
                break 'outcome refused;
            }
            let processed = self.process(&route, &event, now_ms).await;
            processed.unwrap_or_else(|error| self.store_failed(&route, &event, error))
        };
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

    /// The 503 of a delivery whose state store failed.
    fn store_failed(&self, route: &RouteRuntime, event: &Event, error: StoreError) -> Outcome {
        self.store_errors.inc();
        // WARN per request; an outage of the shared store is reported once at ERROR by the
        // health check, so the log is not flooded while the sender retries. The fault, and
        // whether waiting may cure it, tell the operator what to do.
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
