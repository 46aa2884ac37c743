//! How a journal fares and what it holds: for readiness, metrics and tests.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::shared::lock;
use super::Journal;

impl Journal {
    /// How long the writer thread has been in the commit it is in (a write and an
    /// `fdatasync`), or `None` while it waits for records: a liveness check that finds it
    /// there far longer than a commit takes has found a hung disk.
    pub fn writer_busy_for(&self) -> Option<Duration> {
        lock(&self.shared.writing_since).map(|since| since.elapsed())
    }

    /// Whether the last write to the journal failed, or the hot set refuses new keys
    /// because runs cannot be written.
    pub fn is_failing(&self) -> bool {
        self.shared.failing.load(Ordering::SeqCst) || self.shared.refuses_new_keys()
    }

    /// Entries in the hot set.
    pub fn hot_len(&self) -> usize {
        self.shared.hot_count.load(Ordering::Relaxed)
    }

    /// Records in the hot set and on disk (superseded and expired ones on disk included
    /// until a merge drops them).
    pub fn len(&self) -> usize {
        self.hot_len() + self.shared.runs.entries() as usize
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory the runs' filters and indexes hold.
    pub fn runs_memory_bytes(&self) -> usize {
        self.shared.runs.memory_bytes()
    }

    /// Number of runs on disk.
    pub fn runs(&self) -> usize {
        self.shared.runs.snapshot().len()
    }

    /// Runs a merge found damaged: merges leave them, and a read of a damaged page fails.
    /// Cheap to read (a metric).
    pub fn damaged_runs(&self) -> usize {
        self.shared.runs.damaged()
    }

    /// Legacy batches left: those of a store written before the journal had files (for
    /// tests).
    pub fn legacy_batches(&self) -> usize {
        self.shared.legacy.len()
    }

    /// The journal's segment files (for tests).
    pub fn journal_segments(&self) -> usize {
        lock(&self.shared.writer).wal.segments()
    }
}
