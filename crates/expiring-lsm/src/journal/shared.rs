//! What the requests and the threads of a journal share ([`Shared`]), and the hot set's
//! bookkeeping over its maps.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::batch::Open;
use super::copied::Copied;
use super::hot::{shard_of, Shard, HOT_SET_LIMIT_FACTOR, SHARDS};
use super::progress::Published;
use super::settings::Settings;
use crate::runs::Runs;
use crate::wal::Wal;
use crate::{Digest, LegacyBatches};

/// Work asked of the background threads.
#[derive(Default)]
pub(super) struct Asked {
    /// The journal used its spare segment: prepare the next.
    pub(super) spare: bool,
    /// The hot set is full: write a run.
    pub(super) flush: bool,
    /// A run was written, or a sweep is due: merge and delete runs.
    pub(super) merge: bool,
    /// The open left the journal's segment to make ([`Shared::recover`]).
    pub(super) recover: bool,
}

/// The journal's files and the batches taken from memory that are not on disk yet (a
/// failing disk keeps them until a write succeeds).
pub(super) struct Writer {
    pub(super) wal: Wal,
    pub(super) pending: Vec<Open>,
    /// The buffer of the last batch written, emptied: the next batch's, so a group commit
    /// allocates no buffer.
    pub(super) reusable: Option<Vec<u8>>,
}

/// What the requests and the threads share. Lock order: `writer`, a shard, `open`.
pub(super) struct Shared {
    pub(super) shards: Vec<Mutex<Shard>>,
    pub(super) open: Mutex<Open>,
    /// Wakes the writer for a batch's first record when it idles, and when a caller waits
    /// for the open batch (waits on `open`).
    pub(super) wake: Condvar,
    /// Whether the writer sleeps on `wake`; written under the `open` lock. Only then is it
    /// woken: a wake-up costs a system call even when nobody waits.
    pub(super) writer_sleeps: AtomicBool,
    /// Whether it sleeps with no time set, idle: then a batch's first record must wake it.
    /// Written under the `open` lock too.
    pub(super) writer_idles: AtomicBool,
    /// Held while batches are written, so they land in sequence order.
    pub(super) writer: Mutex<Writer>,
    /// Where the journal's segments are (spares are prepared there).
    pub(super) journal_dir: PathBuf,
    /// Spares prepared so far: each gets a name of its own.
    pub(super) spares: AtomicU64,
    /// Journal batches of a store written before the journal had files.
    pub(super) legacy: Arc<dyn LegacyBatches>,
    pub(super) runs: Runs,
    pub(super) settings: Settings,
    /// Entries in the hot set.
    pub(super) hot_count: AtomicUsize,
    pub(super) asked: Mutex<Asked>,
    /// Held by a flush to a run, and by a round of merges: one of each at a time. The
    /// flush's lock holds its copy of the hot set, kept from one flush to the next.
    pub(super) flushing: Mutex<Copied>,
    pub(super) merging: Mutex<()>,
    /// Wakes the flush and merge threads (waits on `asked`).
    pub(super) asked_wake: Condvar,
    pub(super) stop: AtomicBool,
    /// Set while writes fail; readiness reports it.
    pub(super) failing: AtomicBool,
    /// Set while the flush thread cannot write runs.
    pub(super) flush_failing: AtomicBool,
    /// When the writer thread started the commit it is in, if it is in one: a commit whose
    /// `fdatasync` hangs shows here
    /// ([`Journal::writer_busy_for`](super::Journal::writer_busy_for)).
    pub(super) writing_since: Mutex<Option<Instant>>,
    /// Looks of the flush thread for something to write (tests check it does not spin).
    #[cfg(test)]
    pub(super) flush_passes: AtomicU64,
    /// What is on disk, for [`Journal::durable`](super::Journal::durable).
    pub(super) progress: Published,
    /// The highest point a caller of [`Journal::durable`](super::Journal::durable) has
    /// waited for: the watchdog gives up on the waits when the journal stalls.
    pub(super) waited_below: AtomicU64,
}

impl Shared {
    pub(super) fn shard(&self, key: &Digest) -> MutexGuard<'_, Shard> {
        lock(&self.shards[shard_of(key)])
    }

    /// Whether the hot set refuses new keys: runs or the journal cannot be written (a run
    /// holds only what the journal holds, so either stops the flushes) and it holds
    /// [`HOT_SET_LIMIT_FACTOR`] times `hot_entries`. A flush that only falls behind never
    /// refuses: it catches up.
    pub(super) fn refuses_new_keys(&self) -> bool {
        (self.flush_failing.load(Ordering::Relaxed) || self.failing.load(Ordering::Relaxed))
            && self.hot_count.load(Ordering::Relaxed)
                >= self
                    .settings
                    .hot_entries
                    .saturating_mul(HOT_SET_LIMIT_FACTOR)
    }

    /// Counts a key the hot set took, and asks for a flush if it is full now.
    pub(super) fn count_one_more_hot(&self) {
        self.hot_count.fetch_add(1, Ordering::Relaxed);
        self.ask_flush_if_full();
    }

    /// Forgets hot values that expired by `now_ms`, one shard at a time.
    pub(super) fn forget_expired(&self, now_ms: i64) -> usize {
        let mut removed = 0;
        for shard in &self.shards {
            let shard = &mut lock(shard).map;
            let before = shard.len();
            shard.retain(|_, e| e.expires_ms > now_ms);
            removed += before - shard.len();
        }
        self.hot_count.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Forgets the entries whose records are in batches below `durable_below` (a run now
    /// holds them), and returns how many went. An entry changed since the run's copy has a
    /// newer batch and stays; so does a memory-only value, without the durable record it
    /// covered if the run holds that. A map that grew while the flush thread fell behind
    /// gives its room back, so the hot set's memory follows `hot_entries`, not the largest
    /// burst.
    pub(super) fn forget_written(&self, durable_below: u64) -> usize {
        let room = (self.settings.hot_entries.saturating_mul(2) / SHARDS).max(16);
        let mut forgotten = 0;
        for shard in &self.shards {
            let shard = &mut lock(shard).map;
            let before = shard.len();
            shard.retain(|_, e| e.stays_after_run(durable_below));
            forgotten += before - shard.len();
            if shard.capacity() > 2 * room {
                shard.shrink_to(room);
            }
        }
        self.hot_count.fetch_sub(forgotten, Ordering::Relaxed);
        forgotten
    }
}

/// The value `mutex` guards, poisoned or not: a thread of the journal that panics is
/// reported through `Settings::needs_restart` (see `threads::spawn_watched`), and the
/// requests go on being answered until the restart rather than panic in turn.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
