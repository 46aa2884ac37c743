//! The local backend's marks and guard state read from a stopped store, read-only, for
//! `hookgate inspect --store`: nothing in the folder is written, and no gateway can open it
//! while it is read.

use std::path::Path;
use std::time::Duration;

use expiring_lsm::journal::snapshot::Snapshot;

use crate::state::keys::StoreKey;
use crate::state::marks::{stored_mark, StoredMark};
use crate::store_error::StoreError;
use durable_spool::ReadHold;

/// A stopped store's state, as its next open would find it.
pub struct OfflineState {
    snapshot: Snapshot,
    lease_ms: i64,
    /// Keeps a gateway from opening the folder while it is read.
    _hold: ReadHold,
}

impl OfflineState {
    /// Reads the store folder `path`; `lease` is `dedup.in_flight_lease` (a claim older
    /// than it counts as none). An error says when another process holds the folder.
    pub fn open(path: &Path, lease: Duration) -> Result<Self, StoreError> {
        let hold = ReadHold::take(path)?;
        let snapshot = Snapshot::open(disk_seam::real(), path)?;
        Ok(Self {
            snapshot,
            lease_ms: i64::try_from(lease.as_millis()).unwrap_or(i64::MAX),
            _hold: hold,
        })
    }

    /// A dedup key's mark, if one counts at `now_ms`.
    pub fn read_mark(&self, key: &StoreKey, now_ms: i64) -> Result<Option<StoredMark>, StoreError> {
        let bytes = self.snapshot.get(&key.digest(), now_ms)?;
        Ok(bytes.and_then(|b| stored_mark(&b, now_ms, self.lease_ms)))
    }

    /// A guard key's stored state (its own expiry is the reader's to check).
    pub fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.snapshot.get(&key.digest(), i64::MIN)?)
    }
}
