//! The store: dedup marks and guard state, each a value under a digest with an expiry. A
//! bounded hot set in memory holds what changed lately; the rest is in sorted runs on disk
//! ([`Runs`](crate::runs::Runs)); a journal of segment files ([`Wal`](crate::wal::Wal))
//! makes the hot set durable. The crate's README gives the design and its invariants.
//!
//! # What it promises
//!
//! - A change is on disk once [`Journal::durable`] lets its [`Journal::sync_point`] (or
//!   [`Journal::point_of`] its keys) through: a caller answers only then, and a power cut
//!   after that never loses it.
//! - A read-and-change ([`Journal::modify`]) is atomic per key: a concurrent claim of the
//!   same key waits for its decision.
//! - A record never expires before the record of its key it supersedes (a write keeps the
//!   later expiry), so forgetting an expired record, in memory or in a run, never brings an
//!   older value back.
//! - An open replays the batches no run holds and makes them durable before it answers
//!   from them; damage that took acknowledged batches stops the open.
//! - No caller waits for a flush or a merge: neither holds a lock a caller needs while it
//!   writes.
//!
//! # Where to start reading
//!
//! [`Journal::open`] (`open`) builds the store; [`Journal::modify`] (`access`) is the path
//! of a request: one of the hot set's maps (`hot`), chosen by digest, under its mutex, then
//! the runs, newest first, for a key the hot set lacks. A durable change appends a record
//! to the open batch (`batch`); the writer thread commits the batches (`commit`) and
//! publishes how far the journal is on disk (`progress`, waited for in `durable`). Once the
//! hot set is full, the flush thread writes the entries whose records are on disk as a run,
//! and the merge thread keeps the runs few (`flush`, `threads`). What the requests and the
//! threads share, and its lock order, is in `shared`. `recover` makes up for what an open
//! on a full disk could not write; `status` and `upkeep` are the calls of readiness,
//! metrics and tests; `snapshot` reads a stopped store.

mod access;
mod batch;
mod change;
mod commit;
mod copied;
mod durable;
mod flush;
mod hot;
mod open;
mod progress;
mod recover;
mod settings;
mod shared;
pub mod snapshot;
mod status;
mod threads;
mod upkeep;

#[cfg(test)]
pub(crate) mod tests;

use std::sync::Arc;
use std::thread::JoinHandle;

pub use change::Change;
pub use progress::SyncPoint;
pub use settings::{read_here, PageReads, Settings};
use shared::Shared;

/// Folder of the state's runs, inside the store's directory.
pub const RUNS_DIR: &str = "state-runs";
/// Folder of the state journal's segments, inside the store's directory.
pub const JOURNAL_DIR: &str = "state-journal";

/// Dedup marks and guard state. Dropping it stops its threads and writes what is left.
pub struct Journal {
    /// What the requests and the threads share.
    shared: Arc<Shared>,
    /// The writer, flush and merge threads, joined at the drop (none without
    /// `Settings::background`).
    threads: Vec<JoinHandle<()>>,
}
