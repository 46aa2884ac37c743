//! A durable store of expiring records keyed by digest, for a service that must answer
//! only once a change is on disk: a journal of segment files made durable by group commit,
//! a bounded hot set in memory, and sorted runs on disk with a filter each, merged and
//! expired in the background. [`journal::Journal`] is the store; the other modules are its
//! parts. Every file operation goes through a [`disk_seam::Disk`], so tests run the store
//! on a simulated disk that loses what was not synced at a power cut. README.md gives the
//! design and the invariants the store keeps.

pub mod bloom;
mod digest;
mod error;
pub mod journal;
mod legacy;
pub mod run;
pub mod runs;
pub mod wal;

use std::sync::Arc;

pub use digest::Digest;
pub use error::{Cause, Error, StoreFault};
pub use legacy::{Entry, LegacyBatches, NoLegacy};

/// Unix time in milliseconds; injected so tests can move time without sleeping.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;
