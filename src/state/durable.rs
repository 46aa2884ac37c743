//! What an answer waits for before it goes out: the state it rests on durable
//! ([`StateStore::sync`], [`StateStore::sync_keys`]), and, before a publish, the leases it
//! goes out under safe from a failover ([`StateStore::secure`]).

use crate::state::keys::StoreKey;
use crate::store_error::StoreError;

use super::{KeyLock, StateStore};

impl StateStore {
    /// Waits until every change made so far (and every value read so far) is durable, so
    /// an answer that depends on them may go out. Local: the journal's group commit, given
    /// up once the journal has made no progress for [`DURABLE_WAIT`](super::DURABLE_WAIT).
    /// Redis: its writes were acknowledged; how durable they are is Redis's own
    /// `appendfsync` setting.
    pub async fn sync(&self) -> Result<(), StoreError> {
        match self {
            StateStore::Local(s) => {
                let point = s.journal.sync_point();
                Ok(s.journal.durable(point).await?)
            }
            StateStore::Redis { .. } => Ok(()),
        }
    }

    /// Waits until the current records of `keys` are durable: for an answer that rests on
    /// these keys alone (a duplicate), which are on disk already unless a concurrent request
    /// wrote one moments ago. As [`StateStore::sync`], and on Redis with
    /// `redis.wait_replicas` until that many replicas have the marks.
    pub async fn sync_keys(&self, keys: &[&StoreKey]) -> Result<(), StoreError> {
        match self {
            StateStore::Local(s) => {
                let digests: Vec<_> = keys.iter().map(|k| k.digest()).collect();
                let point = s.journal.point_of(&digests.iter().collect::<Vec<_>>());
                Ok(s.journal.durable(point).await?)
            }
            StateStore::Redis { redis, .. } => Box::pin(redis.replicated(keys)).await,
        }
    }

    /// Before a publish: makes the leases it is published under (the claims `token` holds,
    /// and `lock`) safe from a failover. Redis with `redis.wait_replicas`: renewed and
    /// acknowledged by the replicas ([`RedisState::secure`]); otherwise nothing to do.
    /// True when the leases were renewed (they run anew from before the call).
    ///
    /// [`RedisState::secure`]: crate::state::redis::RedisState::secure
    pub async fn secure(
        &self,
        claims: &[&StoreKey],
        token: u64,
        lock: Option<&KeyLock>,
    ) -> Result<bool, StoreError> {
        match self {
            StateStore::Local(_) => Ok(false),
            StateStore::Redis {
                redis, lock_lease, ..
            } => {
                let lock = match lock {
                    Some(KeyLock::Redis { key, token }) => Some((key, *token)),
                    _ => None,
                };
                Box::pin(redis.secure(claims, token, lock, *lock_lease)).await
            }
        }
    }
}
