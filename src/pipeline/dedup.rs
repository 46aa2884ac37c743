//! The dedup step: an event's keys claimed (or found decided, or busy), then settled as
//! the event ended: marked done with their decision records and synced, or released. The
//! claims of an event that left are never released.

use crate::guard::Judging;
use crate::ingress::event::Event;
use crate::outbox::Delivered;
use crate::pipeline::dedup_keys::DedupKeys;
use crate::pipeline::deliver::Failure;
use crate::pipeline::outcome::{Outcome, RETRY_AFTER_BUSY};
use crate::pipeline::route::RouteRuntime;
use crate::source::Source;
use crate::state::decision::{Decided, EventRecord};
use crate::state::keys::StoreKey;
use crate::state::Claimed;
use crate::store_error::StoreError;

use super::Pipeline;

impl Pipeline {
    /// Claims the event's dedup keys, runs the guard's check and delivers the event if the
    /// claim is this request's, and settles the claim.
    pub(super) async fn process(
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
        let name = route.config.name.as_str();
        let checked = self
            .guards
            .check(name, &route.guard, event, now_ms, Judging::Delivery)
            .await;
        let result = match checked {
            Ok(check) => {
                self.deliver_checked(route, event, check, now_ms, (&keys.all(), token, began))
                    .await
            }
            Err(error) => Err(Failure::before(error)),
        };
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
        keys: &DedupKeys<'_>,
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
                    .count_delivery(keys, Source::of(&event.request_id), request, now_ms)
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
    pub(super) async fn count_delivery(
        &self,
        keys: &DedupKeys<'_>,
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
    async fn keep_request(&self, keys: &DedupKeys<'_>, now_ms: i64, expires_ms: i64) {
        let Some(request) = &keys.request else {
            return;
        };
        let record = keys.request_record();
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
        keys: &DedupKeys<'_>,
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
        for key in keys.all().iter() {
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
        keys: &DedupKeys<'_>,
        token: u64,
        event: &Event,
        received_ms: i64,
        decided: Decided,
    ) -> Result<(), StoreError> {
        let source = Source::of(&event.request_id);
        // Only a webhook's request id is on a ticket; reconciliation's and a replay's are
        // made here and say nothing the source does not.
        let request = (source == Source::Webhook).then_some(event.request_id.as_str());
        let event_record = EventRecord::encode_first(received_ms, decided, source, request);
        let event_mark = (&keys.event, event_record.as_slice());
        let request_record = keys
            .request
            .as_ref()
            .map(|key| (key, keys.request_record()));
        let both;
        let marks: &[(&StoreKey, &[u8])] = match &request_record {
            Some((key, record)) => {
                both = [event_mark, (key, record.as_slice())];
                &both
            }
            None => std::slice::from_ref(&event_mark),
        };
        let (now, ttl) = (self.now_ms(), self.settings.ttl);
        self.state
            .mark_done(marks, token, now, event.timestamp_ms, ttl)
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
}

/// The record of an accepted event that went out as `how`.
fn accepted_as(how: Delivered) -> Decided {
    match how {
        Delivered::Published => Decided::Published,
        Delivered::Spooled => Decided::Spooled,
        Delivered::Held => Decided::Held,
    }
}
