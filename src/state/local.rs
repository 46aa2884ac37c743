//! The local backend: one replica's marks and guard state in the `expiring-lsm` journal,
//! its guard keys locked in process, and the rule that moves the journal's reads of run
//! pages off the runtime's workers while the disk, not the page cache, answers them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
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
    static LOOKUPS: LazyLock<PageLookups> = LazyLock::new(PageLookups::default);
    LOOKUPS.run(lookup);
}

/// Where lookups that read run pages run, from how long the recent ones took.
pub(super) struct PageLookups {
    since: Instant,
    /// Until when (milliseconds after `since`) lookups run as blocking.
    blocking_until_ms: AtomicU64,
    window: Mutex<Window>,
}

/// The lookups run in place in the current window.
#[derive(Default)]
struct Window {
    started_ms: u64,
    lookups: u32,
    slow: u32,
}

/// How a lookup ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ran {
    InPlace,
    Blocking,
}

impl Default for PageLookups {
    fn default() -> Self {
        Self {
            since: Instant::now(),
            blocking_until_ms: AtomicU64::new(0),
            window: Mutex::default(),
        }
    }
}

impl PageLookups {
    pub(super) fn run(&self, lookup: &mut dyn FnMut()) -> Ran {
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if !multi_thread {
            lookup();
            return Ran::InPlace;
        }
        let started = Instant::now();
        let now_ms = millis(started.duration_since(self.since));
        if now_ms < self.blocking_until_ms.load(Ordering::Relaxed) {
            tokio::task::block_in_place(lookup);
            return Ran::Blocking;
        }
        lookup();
        self.count(now_ms, started.elapsed() > SLOW_LOOKUP);
        Ran::InPlace
    }

    /// Counts a lookup run in place; enough slow ones in the window make the next ones
    /// run as blocking.
    fn count(&self, now_ms: u64, slow: bool) {
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        if now_ms.saturating_sub(window.started_ms) >= millis(WINDOW) {
            *window = Window {
                started_ms: now_ms,
                ..Window::default()
            };
        }
        window.lookups += 1;
        window.slow += u32::from(slow);
        if window.slow >= SLOW_IN_A_WINDOW && window.slow * 10 >= window.lookups {
            let until = now_ms.saturating_add(millis(BLOCKING_FOR));
            self.blocking_until_ms.store(until, Ordering::Relaxed);
            *window = Window::default();
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
