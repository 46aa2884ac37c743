//! The points in the journal a caller's answer rests on, and the wait until they are on
//! disk.

use std::sync::atomic::Ordering;

use super::hot::Entry;
use super::progress::SyncPoint;
use super::Journal;
use crate::{Digest, Error};

impl Journal {
    /// The point everything appended so far ends at: once it is durable, so is every
    /// change made before this call (and every value read before it).
    pub fn sync_point(&self) -> SyncPoint {
        let open = self.shared.lock_open();
        let has_records = !open.is_empty();
        SyncPoint(open.seq + u64::from(has_records))
    }

    /// The point the current records of `keys` end at: an answer that rests on these keys
    /// alone (a duplicate's mark) waits for this, not for [`Journal::sync_point`], so a mark
    /// on disk long ago is not held up by other requests' open batch. A key the hot set
    /// does not hold is in a run, on disk; a memory-only value (a claim) waits for nothing.
    /// Read after the decision it serves: a key's batch only grows while the hot set holds
    /// it, so the point is never below that of the record the decision saw.
    pub fn point_of(&self, keys: &[&Digest]) -> SyncPoint {
        let batch_end = |key: &&Digest| {
            let key = **key;
            let shard = self.shared.shard(&key);
            shard
                .map
                .get(&key)
                .and_then(Entry::batch)
                .map_or(0, |b| b + 1)
        };
        SyncPoint(keys.iter().map(batch_end).max().unwrap_or(0))
    }

    /// Waits until everything before `point` is on disk (the writer's group commit). An
    /// error if the write or the flush that covered it failed, or if the journal made no
    /// progress for [`Settings::durable_wait`] meanwhile: the caller must not answer 200
    /// then. No timer per wait: the journal's watchdog thread gives up on stalled waits
    /// (see `threads::watch_loop`).
    ///
    /// [`Settings::durable_wait`]: super::Settings::durable_wait
    pub async fn durable(&self, point: SyncPoint) -> Result<(), Error> {
        let mut progress = self.shared.progress.get();
        if !progress.settles(point) {
            self.shared.ask_commit(point);
            self.shared
                .waited_below
                .fetch_max(point.0, Ordering::SeqCst);
            progress = self.shared.progress.settled(point).await;
        }
        if progress.durable_below >= point.0 {
            Ok(())
        } else if progress.failed_below >= point.0 {
            Err(Error::Unwritable(
                "state journal cannot be written to disk".into(),
            ))
        } else {
            Err(Error::NotDurable(format!(
                "state journal made no progress for {:?}",
                self.shared.settings.durable_wait
            )))
        }
    }
}
