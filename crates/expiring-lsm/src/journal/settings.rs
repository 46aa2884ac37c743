//! How a journal is sized and kept: [`Settings`], given to [`Journal::open`](super::Journal::open).

use std::sync::Arc;
use std::time::Duration;

use crate::Clock;
use disk_seam::Disk;

/// How the hot set and the runs are sized and kept.
#[derive(Clone)]
pub struct Settings {
    /// Entries the hot set holds before a flush writes them to a run.
    pub hot_entries: usize,
    /// The dedup window: a run is rewritten alone this long after it was written, so that
    /// long-lived records do not keep expired ones on disk. Must be longer than zero
    /// ([`Journal::open`](super::Journal::open) refuses zero).
    pub ttl: Duration,
    /// The clock of the background threads (expiry of runs).
    pub clock: Clock,
    /// Size of a journal segment file.
    pub segment_bytes: u64,
    /// Commits start at most this often (`store.commit_interval`). A commit starts once a
    /// caller waits for the open batch ([`Journal::durable`](super::Journal::durable)),
    /// at once after a quiet interval.
    pub commit_interval: Duration,
    /// How long a caller of [`Journal::durable`](super::Journal::durable) waits while the
    /// journal makes no progress (a hung `fdatasync`, a writer that ended) before it gets
    /// [`Error::NotDurable`](crate::Error::NotDurable). Needs the background threads:
    /// without them the caller drives every commit and a wait has no bound.
    pub durable_wait: Duration,
    /// Called, with the reason, when a thread of the journal ends before the journal is
    /// dropped: without its writer no change is ever durable again, without its flush and
    /// merge threads the hot set fills and stays full. Only a restart cures it.
    pub needs_restart: Arc<dyn Fn(String) + Send + Sync>,
    /// The file system of the runs and the journal's segments.
    pub disk: Arc<dyn Disk>,
    /// Whether the writer, flush and merge threads run. Without them nothing is written
    /// until the caller asks ([`Journal::write_now`](super::Journal::write_now), [`Journal::flush_to_run`](super::Journal::flush_to_run),
    /// [`Journal::merge_now`](super::Journal::merge_now), [`Journal::prepare_spare`](super::Journal::prepare_spare)): the model test drives every
    /// step itself, in an order its seed decides.
    pub background: bool,
    /// Runs a lookup in the runs that their filters could not rule out: it reads run pages,
    /// and may wait for the disk. [`read_here`] runs it on the calling thread; a caller on
    /// an async runtime's worker passes one that tells the runtime this thread blocks.
    pub page_reads: PageReads,
}

/// How a lookup that reads run pages is run. It is given the lookup and calls it once; a
/// lookup it does not call is run on the calling thread after it returns.
pub type PageReads = fn(&mut dyn FnMut());

/// Runs a lookup that reads run pages on the calling thread.
pub fn read_here(lookup: &mut dyn FnMut()) {
    lookup()
}

impl Settings {
    pub(super) fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }
}
