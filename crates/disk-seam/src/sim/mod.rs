//! A simulated disk for tests: files and directories in memory behind the same [`Disk`]
//! seam the stores use, a power cut that keeps only what was synced, and injected faults
//! (ENOSPC, EIO) and damage, all drawn from one seed so that a failing run replays.
//!
//! The stores' model tests run on it, as RocksDB's crash test and TigerBeetle's VOPR run on
//! theirs: a test makes a [`SimDisk`], hands [`SimDisk::handle`] to a store, schedules faults
//! or damage, cuts the power ([`SimDisk::crash`]), and checks what the store reopens against
//! a plain model.
//!
//! # What it promises
//!
//! A power cut keeps, the way LevelDB's and RocksDB's fault-injection environments model it:
//! - of a file's data, what its last successful sync covered, then any prefix of the writes
//!   made since (the last of them possibly cut short): a torn, unsynced tail;
//! - of a directory, the entries its last successful sync saw: a file created, renamed or
//!   removed, or a directory made, since then is undone (a renamed file is back under its
//!   old name, a removed one is back, a created one is gone with its data).
//!
//! A failed sync of a file keeps the data readable but drops it from what a power cut
//! keeps, as Linux does after a failed writeback; a new length stays for the next sync
//! that succeeds, as the file system's journal keeps the inode's size. A failed write, rename or removal
//! changes nothing. A process restart ([`SimDisk::restart`]) is not a power cut: the page
//! cache stays, so the next process reads what a failed sync left there, and a later power
//! cut still takes it away.
//!
//! Damage, beside loss, injected on demand and drawn from the same seed:
//! - a bit flipped in a file's synced data ([`SimDisk::flip_synced_bit`]), seen by reads at
//!   once and kept by power cuts, and undone by [`SimDisk::repair_flips`] (an operator's
//!   restore) where no write has covered it since;
//! - a torn or misdirected write ([`SimDisk::damage_next_write`]): its sync succeeds and
//!   reads see it whole where it was aimed (the page cache), but the platter got only a
//!   prefix of it, or got it at another offset of the file, which the next power cut shows;
//! - unsynced writes reordered ([`SimDisk::reorder_at_next_power_cut`]): the next power cut
//!   keeps any subset of each file's unsynced writes, a later one without an earlier.
//!
//! A file holds data in blocks of 4 KiB that writes take, and holes elsewhere, as `SEEK_DATA`
//! and `SEEK_HOLE` report them ([`DiskFile::data_ranges`](crate::DiskFile::data_ranges));
//! what a power cut keeps of them follows what it keeps of the writes.
//!
//! # Where to start reading
//!
//! - [`SimDisk`] below, then `control.rs` (faults, held syncs, power cuts, restarts) and
//!   `damage.rs` (flipped bits, torn and misdirected writes, reordering): what a test calls.
//! - `seam.rs` and `file.rs`: the calls a store makes, through the [`Disk`] and
//!   [`DiskFile`](crate::DiskFile) traits.
//! - `state.rs`: what the disk holds, and how each operation is counted, traced and failed;
//!   `inode.rs`, `change.rs` and `blocks.rs`: a file's bytes and blocks, and what a power
//!   cut keeps of them.
//! - `tests.rs`: each promise above as a test.
//!
//! The simulated disk is public, not behind a feature, so that unit tests and the
//! integration tests (another crate, which sees no `cfg(test)` item) use the same one: it
//! is plain `std`, and the binary, which never names it, does not carry it.

mod blocks;
mod change;
mod control;
mod damage;
mod faults;
mod file;
mod inode;
mod paths;
mod rng;
mod seam;
mod state;

use std::sync::{Arc, Mutex};

use crate::Disk;
pub use faults::{Fault, Flip, OpKind, WriteDamage, EIO, ENOSPC};
pub use rng::Rng;
use state::State;

/// A simulated disk; clones are handles to the same disk. A handle belongs to one
/// "process": after [`SimDisk::crash`], the handles and open files from before it fail
/// every call with EIO, and the returned handle sees what the power cut kept.
#[derive(Clone)]
pub struct SimDisk {
    /// The disk itself, shared by every handle and open file.
    state: Arc<Mutex<State>>,
    /// The "process" this handle belongs to: a call through a handle of an earlier one
    /// fails.
    generation: u64,
}

impl SimDisk {
    /// An empty disk (only `/`) whose torn tails and random faults follow `seed`. Relative
    /// paths are read as under `/`.
    pub fn new(seed: u64) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::new(seed))),
            generation: 0,
        }
    }

    /// This disk as the stores take it.
    pub fn handle(&self) -> Arc<dyn Disk> {
        Arc::new(self.clone())
    }
}

#[cfg(test)]
mod tests;
