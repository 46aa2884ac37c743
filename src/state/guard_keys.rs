//! Guard keys through the facade: a key's lock, held from decision to commit so events of
//! one key are decided one at a time, and the guard state read under it and written with
//! its release.

use std::time::Duration;

use crate::state::keys::StoreKey;
use crate::store_error::StoreError;

use super::{KeyLock, StateStore};

impl StateStore {
    /// Takes the lock of a guard key; events of one key are decided one at a time.
    pub async fn lock(&self, key: &StoreKey) -> Result<KeyLock, StoreError> {
        match self {
            StateStore::Local(s) => {
                match tokio::time::timeout(s.lock_wait, s.locks.lock(key.digest())).await {
                    Ok(guard) => Ok(KeyLock::Local(guard)),
                    Err(_) => Err(StoreError::Busy(
                        "guard key is locked by another request for too long",
                    )),
                }
            }
            StateStore::Redis {
                redis,
                lock_lease,
                lock_wait,
            } => {
                let token: u64 = rand::random();
                Box::pin(redis.lock(key, token, *lock_lease, *lock_wait)).await?;
                Ok(KeyLock::Redis {
                    key: key.clone(),
                    token,
                })
            }
        }
    }

    /// Releases a guard-key lock.
    pub async fn unlock(&self, lock: KeyLock) {
        if let (StateStore::Redis { redis, .. }, KeyLock::Redis { key, token }) = (self, lock) {
            // A failed unlock is not an error for the request: the lease frees the key.
            if let Err(error) = Box::pin(redis.unlock(&key, token)).await {
                tracing::warn!(%error, "guard lock not released; its lease will free it");
            }
        }
    }

    /// Writes the guard state of a key whose lock this request holds, and releases the
    /// lock. Redis: only while the lock is still this request's ([`StoreError::LeaseLost`]
    /// otherwise; see [`RedisState::commit_locked`]).
    ///
    /// [`RedisState::commit_locked`]: crate::state::redis::RedisState::commit_locked
    pub async fn commit_locked(
        &self,
        lock: KeyLock,
        key: &StoreKey,
        value: &[u8],
        now_ms: i64,
        expires_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        match (self, lock) {
            (StateStore::Redis { redis, .. }, KeyLock::Redis { key: locked, token }) => {
                debug_assert_eq!(&locked, key);
                let ttl = expires_ms.map(|e| Duration::from_millis((e - now_ms).max(1) as u64));
                Box::pin(redis.commit_locked(key, token, value, ttl)).await
            }
            (StateStore::Local(s), lock) => {
                let result = s.put(key, value, now_ms, expires_ms);
                self.unlock(lock).await;
                result
            }
            (StateStore::Redis { .. }, lock) => {
                self.unlock(lock).await;
                Err(StoreError::LeaseLost(
                    "the guard key's lock is not a Redis lock; nothing was written",
                ))
            }
        }
    }

    /// Reads guard state.
    pub async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            StateStore::Local(s) => Ok(s.journal.get(&key.digest())?),
            StateStore::Redis { redis, .. } => Box::pin(redis.get(key)).await,
        }
    }
}
