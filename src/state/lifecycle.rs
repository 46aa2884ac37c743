//! The backend from its opening to its last flush: [`StateStore::open`] builds the chosen
//! one (local: the journal replayed, its writer watched by `liveness`), and the calls the
//! gateway's health checks and housekeeping make of it.

use std::sync::Arc;

use expiring_lsm::journal::{self, Journal};

use crate::clock::Clock;
use crate::config::Config;
use crate::liveness::Liveness;
use crate::state::backend::BackendChoice;
use crate::state::local::LocalState;
use crate::state::locks::KeyedLocks;
use crate::state::marks::JournalMarks;
use crate::state::redis::RedisState;
use crate::store_error::StoreError;
use durable_spool::Store;

use super::{StateStore, JOURNAL_TREE};

impl StateStore {
    /// Opens the chosen backend (local: its runs, and the journal replayed at the clock's
    /// time). Must run inside the tokio runtime. A failure only a restart cures marks
    /// `liveness`.
    pub fn open(
        choice: &BackendChoice,
        config: &Config,
        store: &Store,
        clock: Clock,
        liveness: &Liveness,
    ) -> Result<Self, StoreError> {
        match choice {
            BackendChoice::Local => {
                let now_ms = clock();
                let settings = journal::Settings {
                    hot_entries: config.store.hot_entries,
                    ttl: config.dedup.ttl,
                    clock,
                    segment_bytes: config.store.journal_segment,
                    commit_interval: config.store.commit_interval,
                    durable_wait: super::DURABLE_WAIT,
                    needs_restart: {
                        let liveness = liveness.clone();
                        Arc::new(move |reason| liveness.needs_restart(reason))
                    },
                    disk: disk_seam::real(),
                    background: true,
                    page_reads: super::local::page_lookup,
                };
                let legacy = Arc::new(super::engine::LegacyJournal(store.tree(JOURNAL_TREE)?));
                let journal = Journal::open(legacy, store.dir(), now_ms, settings)?;
                let watched = Arc::downgrade(&journal);
                let deadline = config.store.hung_after;
                liveness.watch(move || {
                    let busy = watched.upgrade()?.writer_busy_for()?;
                    crate::liveness::overdue(
                        "state journal's writer thread",
                        "commit",
                        busy,
                        deadline,
                    )
                });
                Ok(StateStore::Local(LocalState {
                    marks: JournalMarks::new(journal.clone(), config.dedup.in_flight_lease),
                    journal,
                    locks: KeyedLocks::default(),
                    lock_wait: config.dedup.in_flight_wait,
                }))
            }
            BackendChoice::Redis(target) => Ok(StateStore::Redis {
                redis: RedisState::connect(target)?,
                // Held across decide → publish → commit: the publish may take a whole
                // confirm timeout, so the lease is the in-flight lease.
                lock_lease: config.dedup.in_flight_lease,
                lock_wait: config.dedup.in_flight_wait,
            }),
        }
    }

    /// Name of the backend, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            StateStore::Local(_) => "local",
            StateStore::Redis { .. } => "redis",
        }
    }

    /// Whether the backend answers (local: whether the state journal is being written).
    pub fn is_healthy(&self) -> bool {
        match self {
            StateStore::Local(s) => !s.journal.is_failing(),
            StateStore::Redis { redis, .. } => redis.is_healthy(),
        }
    }

    /// Checks the backend now (for readiness while idle).
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            StateStore::Local(_) => Ok(()),
            StateStore::Redis { redis, .. } => Box::pin(redis.ping()).await,
        }
    }

    /// Forgets expired marks and guard state (local: those in memory now, and the runs on
    /// disk by the merge thread; Redis expires keys by itself). Returns how many entries
    /// went from memory.
    pub fn sweep(&self, now_ms: i64) -> Result<usize, StoreError> {
        match self {
            StateStore::Local(s) => Ok(s.journal.sweep(now_ms)?),
            StateStore::Redis { .. } => Ok(0),
        }
    }

    /// Dedup marks and guard states held (local only: Redis keeps its own count).
    pub fn entries(&self) -> Option<usize> {
        match self {
            StateStore::Local(s) => Some(s.journal.len()),
            StateStore::Redis { .. } => None,
        }
    }

    /// State runs a merge found damaged (local only).
    pub fn damaged_runs(&self) -> Option<usize> {
        match self {
            StateStore::Local(s) => Some(s.journal.damaged_runs()),
            StateStore::Redis { .. } => None,
        }
    }

    /// The local backend's journal (benchmarks and tests look inside it).
    pub fn journal(&self) -> Option<&Arc<Journal>> {
        match self {
            StateStore::Local(s) => Some(&s.journal),
            StateStore::Redis { .. } => None,
        }
    }

    /// Hands every journaled change to the store now (before the store's last flush).
    pub fn write_now(&self) -> Result<(), StoreError> {
        match self {
            StateStore::Local(s) => Ok(s.journal.write_now()?),
            StateStore::Redis { .. } => Ok(()),
        }
    }
}
