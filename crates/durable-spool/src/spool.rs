//! The spool's facade: its open (which counts what a previous run left), what it answers
//! about itself, and its status. Pushes are in [`crate::push`], the drainer in
//! [`crate::drain`], the parked area's operations in [`crate::parked`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::failures::Failures;
use crate::ledger::Ledger;
use crate::locks::lock;
use crate::migrate;
use crate::options::Options;
use crate::record;
use crate::report::{Hung, Report};
use crate::store::Store;
use crate::tables::{Area, EntryRef, Tables};
use crate::writer::{self, Writer};

/// The longest a request waits for its spool entry's commit. A disk that takes longer is
/// treated as failing: the sender gets a 503 rather than waiting on a stuck store (the
/// entry may still reach the disk and be published; consumers dedup on message_id).
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// Entries read at once by a count at open.
const PAGE: usize = 1_000;

/// Depth, size and age of the spool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpoolStatus {
    /// Entries waiting in order for the broker.
    pub depth: u64,
    /// Bytes waiting (encoded entries, held ones included).
    pub bytes: u64,
    /// Age of the oldest waiting entry (held ones included) in seconds, if any.
    pub oldest_age_secs: Option<u64>,
    /// Entries held apart until a queue takes them (unroutable, and their guard keys'
    /// later events).
    #[serde(default)]
    pub held: u64,
    /// Entries parked for an operator.
    #[serde(default)]
    pub parked: u64,
    /// Whether the drainer has made no progress for `spool.stall_after` while entries wait.
    #[serde(default)]
    pub stalled: bool,
}

/// The spool.
pub struct Spool {
    pub(crate) tables: Tables,
    /// The one writer: group commits of pushes and of the drainer's changes.
    pub(crate) writer: Writer,
    /// Counts and flags, shared with the writer thread.
    pub(crate) ledger: Arc<Ledger>,
    pub(crate) enabled: bool,
    pub(crate) max_bytes: u64,
    /// Wakes the drainer when an entry is added.
    pub(crate) added: tokio::sync::Notify,
    /// Serialises an operator's changes of parked entries.
    pub(crate) admin: tokio::sync::Mutex<()>,
    /// The entry the drainer is working on, so a failure can be pinned on it.
    pub(crate) in_progress: Mutex<Option<EntryRef>>,
    /// The entries the drainer failed on.
    pub(crate) failed_on: Mutex<Failures>,
    /// Start of the drainer's clock (`beat_ms`, `refused_since_ms`).
    pub(crate) epoch: Instant,
    /// When the drainer last said it is alive.
    pub(crate) beat_ms: AtomicI64,
    /// Whether a drainer runs: only then does a silent beat mean a hang.
    pub(crate) drainer_started: AtomicBool,
    /// Since when the broker, connected, keeps refusing the head; -1 when it is not.
    pub(crate) refused_since_ms: AtomicI64,
    stall_after: Duration,
}

impl Spool {
    /// Opens the spool's tables in `store`, migrates a spool an earlier version left in
    /// the legacy sled store, and counts what a previous run left.
    pub fn open(store: &Store, options: &Options, report: Arc<dyn Report>) -> Result<Self, Error> {
        let tables = Tables::open(store.spool_db())?;
        migrate::from_legacy(store, &tables)?;
        // Removes the sled files if the state journal has nothing left in them either.
        store.retire_legacy_if_empty()?;
        let store = store.clone();
        // On a full disk it takes writes once there is room (see `writer`).
        let no_room = store.probe_room().err().map(|e| e.to_string());
        let reopen = Box::new(move || store.reopen_spool());
        Self::open_tables(tables, reopen, no_room, options, report)
    }

    fn open_tables(
        tables: Tables,
        reopen: writer::Reopen,
        no_room: Option<String>,
        options: &Options,
        report: Arc<dyn Report>,
    ) -> Result<Self, Error> {
        let ledger = Arc::new(Ledger::new(report));
        // Sequence numbers name entries in every area (a parked entry keeps its number), so
        // the next one is above all of them.
        let mut next_seq = 0;
        for area in [Area::Main, Area::Held, Area::Parked] {
            let (mut depth, mut bytes) = (0, 0);
            if area != Area::Parked {
                tables.for_each(area, PAGE, |_, v| {
                    depth += 1;
                    bytes += v.len() as u64;
                })?;
                ledger.bytes.fetch_add(bytes, Ordering::SeqCst);
            } else {
                depth = tables.len(area)?;
            }
            ledger.depth_of(area).store(depth, Ordering::SeqCst);
            if let Some(last) = tables.last_seq(area)? {
                next_seq = next_seq.max(last.saturating_add(1));
            }
        }
        let writer = Writer::start(tables.clone(), reopen, ledger.clone(), next_seq, no_room)?;
        let spool = Self {
            tables,
            writer,
            ledger,
            enabled: options.enabled,
            max_bytes: options.max_bytes,
            added: tokio::sync::Notify::new(),
            admin: tokio::sync::Mutex::new(()),
            in_progress: Mutex::new(None),
            failed_on: Mutex::new(Failures::default()),
            epoch: Instant::now(),
            beat_ms: AtomicI64::new(0),
            drainer_started: AtomicBool::new(false),
            refused_since_ms: AtomicI64::new(-1),
            stall_after: options.stall_after,
        };
        spool.recount_held_keys()?;
        spool.refresh_oldest()?;
        spool.ledger.publish_gauges();
        Ok(spool)
    }

    /// Counts the guard keys of the held entries from disk.
    pub(crate) fn recount_held_keys(&self) -> Result<(), Error> {
        let mut keys: HashMap<String, u64> = HashMap::new();
        self.tables.for_each(Area::Held, PAGE, |_, v| {
            if let Some(key) = record::decode(v).ok().and_then(|m| m.order_key) {
                *keys.entry(key.into_owned()).or_default() += 1;
            }
        })?;
        self.ledger.set_held_keys(keys);
        Ok(())
    }

    /// Whether nothing waits in order. While something does, new events queue behind it.
    pub fn is_empty(&self) -> bool {
        self.ledger.depth.load(Ordering::SeqCst) == 0
    }

    /// Whether entries of guard key `key` are held apart, or a push of it failed in a way
    /// that may still bring it back (its commit's pages are read again until the database
    /// is set back): a later event of that key must go behind them ([`Spool::push_held`]).
    pub fn holds_key(&self, key: &str) -> bool {
        self.ledger.holds_key(key) || self.ledger.key_in_doubt(key)
    }

    /// Whether the spool takes events: enabled, not at its bound, no event refused for lack
    /// of room since an entry last left, and the store taking writes.
    pub fn has_room(&self) -> bool {
        let l = &self.ledger;
        self.enabled
            && !l.refused.load(Ordering::SeqCst)
            && !l.store_failing.load(Ordering::SeqCst)
            && l.bytes.load(Ordering::SeqCst) < self.max_bytes
    }

    /// Whether entries wait behind one the store will not delete: new events queue behind
    /// them, so none can be taken even while the broker is connected.
    pub fn waits_on_store(&self) -> bool {
        self.ledger.store_failing.load(Ordering::SeqCst) && !self.is_empty()
    }

    /// For the liveness check: why the spool can take no writes until the process starts
    /// again, or `None` while it can. Set when the writer thread stopped, or when a
    /// database that met an I/O error cannot be set back to its last good commit (a
    /// database that only needs opening again is opened again by the writer, see
    /// [`crate::writer`]). Nothing clears it but a restart.
    pub fn restart_needed(&self) -> Option<String> {
        lock(&self.ledger.broken).clone()
    }

    /// For the liveness check: the thread of the spool that hangs, or `None`: its writer
    /// has been in one commit for longer than `deadline` (a hung `fdatasync`), or its
    /// drainer, once started, has not beaten for that long (it beats at least every second
    /// while it waits, and a publish waits at most a confirm timeout).
    pub fn hung(&self, deadline: Duration) -> Option<Hung> {
        let writing = *lock(&self.ledger.writing_since);
        if let Some(busy) = writing.map(|since| since.elapsed()) {
            if busy > deadline {
                return Some(Hung {
                    thread: "spool's writer thread",
                    step: "commit",
                    busy,
                });
            }
        }
        if !self.drainer_started.load(Ordering::SeqCst) {
            return None;
        }
        let silent = self.clock_ms() - self.beat_ms.load(Ordering::SeqCst);
        let busy = Duration::from_millis(u64::try_from(silent).unwrap_or(0));
        (busy > deadline).then_some(Hung {
            thread: "spool's drainer",
            step: "step",
            busy,
        })
    }

    /// Whether the database refuses writes until the writer has opened it again (after an
    /// I/O error): nothing is drained meanwhile.
    pub(crate) fn reopening(&self) -> bool {
        self.ledger.reopening.load(Ordering::SeqCst)
    }

    /// Whether entries wait in order and the drainer has made no progress on them for
    /// `spool.stall_after`: it has not run (it failed and waits to restart, or hangs), or
    /// the broker, connected, kept refusing the head. Waiting for an absent or blocked
    /// broker is not a stall; held entries waiting for a queue are not either.
    pub fn is_stalled(&self) -> bool {
        if self.is_empty() {
            return false;
        }
        let now = self.clock_ms();
        let limit = self.stall_after.as_millis() as i64;
        let refused = self.refused_since_ms.load(Ordering::SeqCst);
        now - self.beat_ms.load(Ordering::SeqCst) > limit || (refused >= 0 && now - refused > limit)
    }

    /// Depth, bytes, the oldest entry's age, held and parked counts, and whether the
    /// drainer is stalled.
    pub fn status(&self, now_secs: i64) -> SpoolStatus {
        let oldest_main = self.ledger.oldest_secs.load(Ordering::SeqCst);
        let oldest_held = self
            .tables
            .first(Area::Held)
            .ok()
            .flatten()
            .and_then(|(_, v)| record::decode(&v).ok())
            .map_or(-1, |m| m.timestamp_secs as i64);
        let oldest = match (oldest_main, oldest_held) {
            (-1, h) => h,
            (m, -1) => m,
            (m, h) => m.min(h),
        };
        SpoolStatus {
            depth: self.ledger.depth.load(Ordering::SeqCst),
            bytes: self.ledger.bytes.load(Ordering::SeqCst),
            oldest_age_secs: (oldest >= 0).then(|| (now_secs - oldest).max(0) as u64),
            held: self.ledger.held_depth.load(Ordering::SeqCst),
            parked: self.parked_depth(),
            stalled: self.is_stalled(),
        }
    }

    pub(crate) fn refresh_oldest(&self) -> Result<(), Error> {
        let oldest = self
            .tables
            .first(Area::Main)?
            .and_then(|(_, v)| record::decode(&v).ok())
            .map_or(-1, |m| m.timestamp_secs as i64);
        self.ledger.oldest_secs.store(oldest, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
#[path = "spool_tests.rs"]
mod tests;
