//! The local backend: one replica's marks and guard state in the `expiring-lsm` journal,
//! its guard keys locked in process, and the rule that moves the journal's reads of run
//! pages off the runtime's workers while the disk, not the page cache, answers them.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use expiring_lsm::journal::Journal;

use crate::state::keys::StoreKey;
use crate::state::locks::KeyedLocks;
use crate::state::marks::JournalMarks;
use crate::store_error::StoreError;

/// The local backend: marks and guard state in the journal, guard keys locked in process.
pub struct LocalState {
    pub(super) marks: JournalMarks,
    pub(super) journal: Arc<Journal>,
    pub(super) locks: KeyedLocks,
    /// How long a request waits for a guard-key lock.
    pub(super) lock_wait: Duration,
}

/// How long a lookup that reads run pages may take before it counts as slow: the page
/// cache answers in microseconds, a disk under pressure in milliseconds.
const SLOW_LOOKUP: Duration = Duration::from_millis(1);
/// The window over which slow lookups are counted.
const WINDOW: Duration = Duration::from_secs(1);
/// Slow lookups in one window that say the disk, not the page cache, answers: at least
/// this many, and at least a tenth of the window's lookups. A lookup preempted on a busy
/// machine is slow too, but rarely, and seldom many in a second.
const SLOW_IN_A_WINDOW: u32 = 8;
/// How long lookups run as blocking once the disk answers them.
const BLOCKING_FOR: Duration = Duration::from_secs(10);

/// The journal's `page_reads` (a key the hot set lacks that a run's filter may hold): in
/// place while run pages come from the page cache, as blocking for [`BLOCKING_FOR`] once
/// the disk answers them ([`SLOW_IN_A_WINDOW`]). As blocking, the runtime hands the
/// worker's other tasks to another thread meanwhile, so a slow disk read (done under the
/// key's shard lock) does not stall the requests queued behind it; but that hand-off and
/// the one back cost thread wake-ups and context switches, far more than a read the page
/// cache serves, which is nearly every read. The journal decides this under the lock it
/// reads under: a key is looked up once.
pub(super) fn page_lookup(lookup: &mut dyn FnMut()) {
    static LOOKUPS: PageLookups = PageLookups::new();
    LOOKUPS.run(lookup);
}

/// Where lookups that read run pages run, from how long the recent ones took.
pub(super) struct PageLookups {
    state: Mutex<Lookups>,
}

/// The lookups run in place in the current window, and whether they run as blocking now.
struct Lookups {
    /// Until when lookups run as blocking.
    blocking_until: Option<Instant>,
    /// When the current window began; `None` before the first lookup in place.
    window_started: Option<Instant>,
    lookups: u32,
    slow: u32,
}

/// How a lookup ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ran {
    InPlace,
    Blocking,
}

impl PageLookups {
    pub(super) const fn new() -> Self {
        Self {
            state: Mutex::new(Lookups {
                blocking_until: None,
                window_started: None,
                lookups: 0,
                slow: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lookups> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn run(&self, lookup: &mut dyn FnMut()) -> Ran {
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if !multi_thread {
            lookup();
            return Ran::InPlace;
        }
        let started = Instant::now();
        // The lock is held for the bookkeeping only, never across the lookup.
        let blocking = self
            .lock()
            .blocking_until
            .is_some_and(|until| started < until);
        if blocking {
            tokio::task::block_in_place(lookup);
            return Ran::Blocking;
        }
        lookup();
        self.lock().count(started, started.elapsed() > SLOW_LOOKUP);
        Ran::InPlace
    }
}

impl Lookups {
    /// Counts a lookup run in place that began `at`; enough slow ones in the window make
    /// the next ones run as blocking.
    fn count(&mut self, at: Instant, slow: bool) {
        if self
            .window_started
            .is_none_or(|began| at.saturating_duration_since(began) >= WINDOW)
        {
            self.window_started = Some(at);
            (self.lookups, self.slow) = (0, 0);
        }
        self.lookups += 1;
        self.slow += u32::from(slow);
        if self.slow >= SLOW_IN_A_WINDOW && self.slow * 10 >= self.lookups {
            self.blocking_until = Some(at + BLOCKING_FOR);
            self.window_started = None;
        }
    }
}

impl LocalState {
    /// Writes guard state that may be forgotten at `expires_ms` (never when `None`).
    pub(super) fn put(
        &self,
        key: &StoreKey,
        value: &[u8],
        now_ms: i64,
        expires_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        let expires_ms = expires_ms.unwrap_or(i64::MAX);
        Ok(self.journal.put(&key.digest(), value, expires_ms, now_ms)?)
    }
}
