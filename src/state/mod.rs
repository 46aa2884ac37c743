//! Where dedup marks and guard state live.
//!
//! Every event asks this module two things: was it (or the sender's request id) handled
//! before, and what is the stored state of its guard key. [`StateStore`] answers both over
//! one of two backends, chosen once from `dedup.backend` ([`BackendChoice`]):
//!
//! - **local**, for one replica: marks and guard state in the `expiring-lsm` journal in the
//!   store folder, guard keys locked in process;
//! - **redis**, for several: claims, fenced done marks, guard commits and leases in a
//!   shared Redis (one server, Sentinel or Cluster).
//!
//! # Guarantees
//!
//! - The rest of the gateway calls [`StateStore`] and never asks which backend runs.
//! - A claim is an atomic check-and-set: of concurrent requests for one key exactly one
//!   owns it ([`Claimed::Owned`]); the others wait for it to end, at most `in_flight_wait`.
//! - Events of one guard key are decided one at a time, under its [`KeyLock`].
//! - What an answer rests on is durable before it goes out ([`StateStore::sync`]), or the
//!   call fails and the answer is 503.
//!
//! # Where to start
//!
//! The facade is declared here; its methods are grouped by job: `lifecycle.rs` (open,
//! health, sweeps), `dedup_marks.rs` (claims and done marks), `guard_keys.rs` (locks and
//! guard state), `leases.rs`, `durable.rs` (what an answer waits for). `local.rs` and
//! `redis.rs` are the two backends. Below them: `keys` (key formats, digest built once),
//! `marks` (pure mark decisions), `decision` (the record a done mark carries), `engine`
//! (the glue to `expiring-lsm`) and `offline` (a stopped store, read-only).

mod backend;
pub mod backoff;
pub mod decision;
mod dedup_marks;
mod durable;
mod engine;
mod guard_keys;
pub mod keys;
mod leases;
mod lifecycle;
mod local;
pub mod locks;
pub mod marks;
pub mod offline;
pub mod redis;
pub mod redis_link;
mod scripts;
pub mod slots;
pub mod wire;

#[cfg(test)]
mod local_tests;

use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use crate::state::keys::StoreKey;
use crate::state::redis::RedisState;

pub use backend::BackendChoice;
pub use engine::LegacyJournal;
pub use expiring_lsm::journal::{JOURNAL_DIR, RUNS_DIR};
pub use keys::LeaseHolder;
pub use local::LocalState;

/// Name of the sled tree that held the state journal before it had files of its own; a
/// store written then is read from it once.
pub const JOURNAL_TREE: &str = "state";

/// How long a request waits for the group commit that puts its state on disk before it
/// answers 503 instead of 200 (a disk that stalls, or a full one).
pub const DURABLE_WAIT: Duration = Duration::from_secs(5);

/// The chosen backend.
///
/// Every call into Redis is boxed where the facade makes it (`Box::pin(redis.…)`): a Redis
/// command's future holds kilobytes of the client's state, and unboxed it would be part of
/// every facade future, local ones included, and so of every delivery's future, which is
/// moved (copied) as each step starts. The local path pays nothing for the Redis one.
pub enum StateStore {
    /// Embedded, single replica.
    Local(LocalState),
    /// Shared by replicas.
    Redis {
        redis: RedisState,
        /// Lease of a guard-key lock: a dead replica's lock expires after it.
        lock_lease: Duration,
        /// How long a request waits for a guard-key lock.
        lock_wait: Duration,
    },
}

/// A held guard-key lock; released on [`StateStore::unlock`] (or by its lease in Redis).
pub enum KeyLock {
    /// An in-process lock, released when dropped.
    Local(OwnedMutexGuard<()>),
    /// A Redis lock owned by `token`.
    Redis { key: StoreKey, token: u64 },
}

/// What [`StateStore::claim_or_wait`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// This request owns the event key and must finish with `mark_done` or `release`.
    Owned,
    /// The event (or, when `by_request`, the sender's request id) was handled before.
    Duplicate { by_request: bool },
    /// Another request still holds it after the whole wait.
    Busy,
}
