//! Dedup marks through the facade: a claim of an event key (and of the sender's request
//! id), waited for while another request holds it; done marks with their decision records;
//! and the release of a claim a request gives up.

use std::time::{Duration, Instant};

use crate::state::backoff::Backoff;
use crate::state::keys::StoreKey;
use crate::state::marks::{Claim, KeyState, StoredMark};
use crate::store_error::StoreError;

use super::{Claimed, StateStore};

impl StateStore {
    /// Whether a read before the claim finds the request id's mark done. In Redis the
    /// common retry (the request id done) is so answered without a write, also by a Redis
    /// that refuses writes. The local store reads nothing here: its claim finds a done mark
    /// under the same lock and writes nothing then, so a read first would only look the
    /// key up twice on every delivery.
    async fn done_before_claim(&self, key: &StoreKey) -> Result<bool, StoreError> {
        match self {
            StateStore::Local(_) => Ok(false),
            StateStore::Redis { redis, .. } => {
                Ok(Box::pin(redis.state(key)).await? == KeyState::Done)
            }
        }
    }

    /// Claims a dedup key for `token`.
    async fn try_claim(
        &self,
        key: &StoreKey,
        token: u64,
        now_ms: i64,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        match self {
            StateStore::Local(s) => s.marks.try_claim(key, token, now_ms),
            StateStore::Redis { redis, .. } => Box::pin(redis.try_claim(key, token, lease)).await,
        }
    }

    /// Claims the event key for `token`, or waits, at most `wait`, for the request that
    /// holds it to finish. A request id the sender set is checked first: a retry under the
    /// same request id is a duplicate even when its body says otherwise. `now_ms` is read
    /// anew for every attempt.
    pub async fn claim_or_wait(
        &self,
        event: &StoreKey,
        request: Option<&StoreKey>,
        token: u64,
        wait: Duration,
        lease: Duration,
        now_ms: impl Fn() -> i64,
    ) -> Result<Claimed, StoreError> {
        let deadline = Instant::now() + wait;
        let mut backoff = Backoff::default();
        loop {
            let now = now_ms();
            // The request id is claimed like the event: of two concurrent retries under one
            // request id, whatever their bodies, one goes on and the other waits for it.
            if let Some(request) = request {
                if self.done_before_claim(request).await? {
                    return Ok(Claimed::Duplicate { by_request: true });
                }
                match self.try_claim(request, token, now, lease).await? {
                    Claim::Claimed => {}
                    Claim::Done => return Ok(Claimed::Duplicate { by_request: true }),
                    Claim::InFlight if Instant::now() >= deadline => return Ok(Claimed::Busy),
                    Claim::InFlight => {
                        backoff.pause().await;
                        continue;
                    }
                }
            }
            let claim = self.try_claim(event, token, now, lease).await;
            if let (Some(request), Ok(Claim::Done | Claim::InFlight) | Err(_)) = (request, &claim) {
                self.release(request, token).await?;
            }
            match claim? {
                Claim::Claimed => return Ok(Claimed::Owned),
                Claim::Done => return Ok(Claimed::Duplicate { by_request: false }),
                Claim::InFlight if Instant::now() >= deadline => return Ok(Claimed::Busy),
                Claim::InFlight => backoff.pause().await,
            }
        }
    }

    /// Marks keys done, each with its decision record, until `ttl` after the later of
    /// `now_ms` (receipt) and `event_ms` (the event's own time): a future-dated event's
    /// replay must still find its mark.
    pub async fn mark_done(
        &self,
        marks: &[(&StoreKey, &[u8])],
        token: u64,
        now_ms: i64,
        event_ms: Option<i64>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let from_ms = event_ms.map_or(now_ms, |e| e.max(now_ms));
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let expires_ms = from_ms.saturating_add(ttl_ms);
        match self {
            StateStore::Local(s) => s.marks.mark_done(marks, expires_ms, now_ms),
            StateStore::Redis { redis, .. } => {
                let lifetime =
                    Duration::from_millis(expires_ms.saturating_sub(now_ms).max(1) as u64);
                Box::pin(redis.mark_done(marks, token, lifetime)).await
            }
        }
    }

    /// The mark of a dedup key as stored, if one counts at `now_ms`: its state, expiry and
    /// decision record (`hookgate inspect`).
    pub async fn read_mark(
        &self,
        key: &StoreKey,
        now_ms: i64,
    ) -> Result<Option<StoredMark>, StoreError> {
        match self {
            StateStore::Local(s) => s.marks.read(key, now_ms),
            StateStore::Redis { redis, .. } => Box::pin(redis.read_mark(key, now_ms)).await,
        }
    }

    /// Rewrites the decision record of `key`'s done mark with `update`, keeping the mark
    /// and its expiry (a duplicate or a replay counted): that expiry when written, `None`
    /// when nothing was. Nobody waits for it to be durable: a crash may lose a count, never
    /// a mark.
    pub async fn update_record(
        &self,
        key: &StoreKey,
        now_ms: i64,
        update: impl FnOnce(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<Option<i64>, StoreError> {
        match self {
            StateStore::Local(s) => s.marks.update_record(key, now_ms, update),
            // Redis keeps the mark's time left; the expiry is counted from now.
            StateStore::Redis { redis, .. } => {
                let left = Box::pin(redis.update_record(key, update)).await?;
                Ok(left.map(|left| {
                    now_ms.saturating_add(i64::try_from(left.as_millis()).unwrap_or(i64::MAX))
                }))
            }
        }
    }

    /// Marks `key` done with `record` until `expires_ms` unless a mark holds it: the request
    /// id a duplicate came under, kept as long as its event's mark, so `inspect request`
    /// finds it and its retries are answered from it. True when written.
    pub async fn mark_done_if_free(
        &self,
        key: &StoreKey,
        record: &[u8],
        now_ms: i64,
        expires_ms: i64,
    ) -> Result<bool, StoreError> {
        match self {
            StateStore::Local(s) => s.marks.mark_done_if_free(key, record, expires_ms, now_ms),
            StateStore::Redis { redis, .. } => {
                let ttl = Duration::from_millis(expires_ms.saturating_sub(now_ms).max(1) as u64);
                Box::pin(redis.mark_done_if_free(key, record, ttl)).await
            }
        }
    }

    /// Releases a claim still held by `token`.
    pub async fn release(&self, key: &StoreKey, token: u64) -> Result<(), StoreError> {
        match self {
            StateStore::Local(s) => {
                s.marks.release(key, token);
                Ok(())
            }
            StateStore::Redis { redis, .. } => Box::pin(redis.release(key, token)).await,
        }
    }
}
