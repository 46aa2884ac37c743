//! The events reconciliation hands over: a message the sender's list API listed, taken like
//! a delivery past its signature, and an operator's replay, taken past the dedup marks.

use crate::guard::Judging;
use crate::ingress::event::Event;
use crate::pipeline::dedup_keys::DedupKeys;
use crate::pipeline::outcome::Outcome;
use crate::pipeline::route::RouteRuntime;
use crate::source::Source;

use super::Pipeline;

impl Pipeline {
    /// Handles one event reconciliation made of a message the sender's list API gave:
    /// freshness, dedup, guard and publish-or-spool, like a delivery past its signature
    /// (the API call was authenticated by the route's key). Its message carries
    /// `x-source: reconcile` (its request id says so). Not counted as a request: the
    /// reconciler counts what it finds.
    pub async fn handle_listed(&self, route: &RouteRuntime, event: Event) -> Outcome {
        let name = route.config.name.as_str();
        let now_ms = self.now_ms();
        if let Some(refused) = self.refusal(route, &event, now_ms) {
            return refused;
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

    /// Publishes again an event an operator's replay made of a listed message: routing
    /// keys, freshness, then the guard under its key's lock ([`GuardState::check`] as a
    /// [`Judging::Replay`]: a repeat of the newest state passes, an older event is dropped)
    /// and publish-or-spool.
    /// The dedup marks are neither consulted nor written: a replay exists to publish what
    /// they say was published. Its message carries `x-source: replay` (its request id says
    /// so). Not counted as a request: the replay counts what it publishes.
    ///
    /// [`GuardState::check`]: crate::guard::GuardState::check
    pub async fn handle_replayed(&self, route: &RouteRuntime, event: &Event) -> Outcome {
        let name = route.config.name.as_str();
        let now_ms = self.now_ms();
        if let Some(refused) = self.refusal(route, event, now_ms) {
            return refused;
        }
        let delivered = match self
            .guards
            .check(name, &route.guard, event, now_ms, Judging::Replay)
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
}
