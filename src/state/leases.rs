//! Leases through the facade: one holder of a key across replicas (a route's
//! reconciliation), and the state a lease covers, written only while its holder has it.

use std::time::Duration;

use crate::store_error::StoreError;

use super::{LeaseHolder, StateStore};

impl StateStore {
    /// Takes, or extends while `holder` has it, the lease of its key for `ttl`: one holder
    /// across replicas. The local store serves one process, which holds the store's lock: always true.
    pub async fn lease(&self, holder: &LeaseHolder, ttl: Duration) -> Result<bool, StoreError> {
        match self {
            StateStore::Local(_) => Ok(true),
            StateStore::Redis { redis, .. } => Box::pin(redis.lease(holder, ttl)).await,
        }
    }

    /// Ends a lease `holder` has (a no-op for the local store).
    pub async fn end_lease(&self, holder: &LeaseHolder) -> Result<(), StoreError> {
        match self {
            StateStore::Local(_) => Ok(()),
            StateStore::Redis { redis, .. } => Box::pin(redis.end_lease(holder)).await,
        }
    }

    /// Writes state a lease covers (under the lease's key), never forgotten, only while
    /// `holder` has that lease; [`StoreError::LeaseLost`] otherwise. The local store serves
    /// one process, which holds every lease.
    pub async fn put_leased(
        &self,
        holder: &LeaseHolder,
        value: &[u8],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        match self {
            StateStore::Local(s) => s.put(&holder.key, value, now_ms, None),
            StateStore::Redis { redis, .. } => Box::pin(redis.put_leased(holder, value)).await,
        }
    }
}
