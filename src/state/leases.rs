//! Leases through the facade: one holder of a key across replicas (a route's
//! reconciliation), and the state a lease covers, written only while its holder has it.

use std::time::Duration;

use crate::state::keys::StoreKey;
use crate::store_error::StoreError;

use super::StateStore;

impl StateStore {
    /// Takes, or extends while `token` holds it, the lease of `key` for `ttl`: one holder
    /// across replicas. The local store serves one process, which holds the store's lock: always true.
    pub async fn lease(
        &self,
        key: &StoreKey,
        token: u64,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        match self {
            StateStore::Local(_) => Ok(true),
            StateStore::Redis { redis, .. } => redis.lease(key, token, ttl).await,
        }
    }

    /// Ends a lease `token` holds (a no-op for the local store).
    pub async fn end_lease(&self, key: &StoreKey, token: u64) -> Result<(), StoreError> {
        match self {
            StateStore::Local(_) => Ok(()),
            StateStore::Redis { redis, .. } => redis.end_lease(key, token).await,
        }
    }

    /// Writes state a lease covers ([`Self::lease`] of the same key), never forgotten, only
    /// while `token` holds that lease; [`StoreError::LeaseLost`] otherwise. The local store
    /// serves one process, which holds every lease.
    pub async fn put_leased(
        &self,
        key: &StoreKey,
        token: u64,
        value: &[u8],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        match self {
            StateStore::Local(s) => s.put(key, value, now_ms, None),
            StateStore::Redis { redis, .. } => redis.put_leased(key, token, value).await,
        }
    }
}
