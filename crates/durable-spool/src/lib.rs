//! A durable outbox of messages a broker could not take, for a service that answers only
//! once a message is on disk, and the supervised drainer that publishes them again.
//!
//! An entry is committed to disk (redb, a durable commit: its `fdatasync` returned) before
//! a push returns; concurrent pushes share one commit ([`writer`]). The drainer deletes
//! entries only after the broker's confirms, a batch at a time in one commit ([`drain`]);
//! a crash between the confirms and that commit republishes at most that batch.
//!
//! Three areas, each a redb table keyed by a sequence number (arrival order), one counter
//! for all three ([`tables`]): **main**, the FIFO the drainer publishes from; **held**,
//! entries no queue takes yet and the later entries of their guard keys ([`held`]); and
//! **parked**, entries that can never be published as they are, waiting for an operator
//! with the reason ([`parked`]). An entry moves between areas in one commit, keeping its
//! number, so a crash leaves it in exactly one. A spool an earlier version kept in sled is
//! migrated at open ([`migrate`]). An entry's value is a [`record`] of its message:
//! versioned, and independent of [`SpooledMessage`]'s Rust shape.
//!
//! Every file operation of the database goes through a [`disk_seam::Disk`], so tests run
//! the spool on a simulated disk that loses what was not synced at a power cut. README.md
//! gives the design and the invariants the spool keeps.

mod changes;
mod drain;
mod error;
mod failures;
mod held;
mod ledger;
mod legacy;
mod locks;
mod migrate;
mod options;
mod parked;
mod parked_record;
mod push;
mod read_hold;
pub mod record;
mod report;
mod sink;
mod spool;
mod spool_file;
mod store;
mod supervise;
mod tables;
mod writer;

#[cfg(test)]
mod model;
#[cfg(test)]
mod testkit;

pub use drain::DRAIN_BATCH;
pub use error::{Cause, Error, SpoolError, StoreFault};
pub use legacy::{Entry, Tree};
pub use options::Options;
pub use parked_record::ParkedEntry;
pub use read_hold::ReadHold;
pub use record::{RecordError, SpooledMessage};
pub use report::{Counts, Hung, Report, Unreported};
pub use sink::{Sink, SinkError};
pub use spool::FLUSH_TIMEOUT;
pub use spool::{Spool, SpoolStatus};
pub use spool_file::{SeamFile, SPOOL_FILE};
pub use store::{Store, DEFAULT_CACHE_BYTES};
