//! The local backend: one replica's marks and guard state in the `expiring-lsm` journal,
//! its guard keys locked in process, and the rule that keeps the journal's reads of run
//! pages off the runtime's workers.

use std::sync::Arc;
use std::time::Duration;

use expiring_lsm::journal::Journal;

use crate::state::keys::StoreKey;
use crate::state::locks::KeyedLocks;
use crate::state::marks::JournalMarks;
use crate::store_error::StoreError;

/// The local backend: marks and guard state in the journal, guard keys locked in process.
pub struct LocalState {
    pub(super) marks: JournalMarks,
    pub(super) journal: Arc<Journal>,
    pub(super) locks: KeyedLocks,
    /// How long a request waits for a guard-key lock.
    pub(super) lock_wait: Duration,
}

/// The journal's `page_reads`: a lookup that reads run pages (a key the hot set lacks that
/// a run's filter may hold) runs as blocking when the runtime has several workers. The
/// runtime hands this worker's other tasks to another thread meanwhile, so a slow disk read
/// (done under the key's shard lock) does not stall the requests queued behind it. The
/// journal decides this under the lock it reads under: a key is looked up once.
pub(super) fn off_worker(lookup: &mut dyn FnMut()) {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi_thread {
        tokio::task::block_in_place(lookup)
    } else {
        lookup()
    }
}

impl LocalState {
    /// Writes guard state that may be forgotten at `expires_ms` (never when `None`).
    pub(super) fn put(
        &self,
        key: &StoreKey,
        value: &[u8],
        now_ms: i64,
        expires_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        let expires_ms = expires_ms.unwrap_or(i64::MAX);
        Ok(self.journal.put(&key.digest(), value, expires_ms, now_ms)?)
    }
}
