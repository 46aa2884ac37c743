//! [`Lookup`]: where the reports read — the running gateway's state store, or a stopped
//! one read offline.

use std::future::Future;

use crate::state::keys::StoreKey;
use crate::state::marks::StoredMark;
use crate::state::offline::OfflineState;
use crate::state::StateStore;
use crate::store_error::StoreError;

/// Where the reports read: the running gateway's state store, or a stopped one.
pub trait Lookup {
    /// A dedup key's mark, if one counts at `now_ms`.
    fn mark(
        &self,
        key: &StoreKey,
        now_ms: i64,
    ) -> impl Future<Output = Result<Option<StoredMark>, StoreError>> + Send;
    /// A guard key's stored state.
    fn guard(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send;
}

impl Lookup for StateStore {
    fn mark(
        &self,
        key: &StoreKey,
        now_ms: i64,
    ) -> impl Future<Output = Result<Option<StoredMark>, StoreError>> + Send {
        self.read_mark(key, now_ms)
    }
    fn guard(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send {
        self.get(key)
    }
}

impl Lookup for OfflineState {
    async fn mark(&self, key: &StoreKey, now_ms: i64) -> Result<Option<StoredMark>, StoreError> {
        self.read_mark(key, now_ms)
    }
    async fn guard(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        self.get(key)
    }
}
