//! The spool's counts in memory: entries and bytes per area, the guard keys with entries
//! held or in doubt, and the flags readiness and liveness read. Shared with the writer
//! thread, which takes back a push's reservation when its commit fails.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::locks::lock;
use crate::report::{Counts, Report};
use crate::tables::Area;

/// The counts. Depths and bytes count an entry from the moment its push is submitted (so
/// an event that arrives meanwhile queues behind it) until the commit that removes it.
pub(crate) struct Ledger {
    /// Entries in main.
    pub(crate) depth: AtomicU64,
    /// Entries in held.
    pub(crate) held_depth: AtomicU64,
    /// Entries in parked.
    pub(crate) parked_depth: AtomicU64,
    /// Bytes in main and held: the room `max_bytes` bounds.
    pub(crate) bytes: AtomicU64,
    /// Receipt time (Unix seconds) of the oldest entry in main, or -1.
    pub(crate) oldest_secs: AtomicI64,
    /// Set when an event was refused for lack of room, cleared when an entry leaves:
    /// `bytes < max_bytes` alone would call a spool ready that refuses every event.
    pub(crate) refused: AtomicBool,
    /// Set when a commit failed (a full disk, say), cleared when one succeeds.
    pub(crate) store_failing: AtomicBool,
    /// Set while the database refuses writes until the writer has opened it again.
    pub(crate) reopening: AtomicBool,
    /// When the writer thread started the commit (or reopen) it is in, if it is in one: a
    /// hung `fdatasync` shows here.
    pub(crate) writing_since: Mutex<Option<std::time::Instant>>,
    /// Why the spool can take no writes until the process starts again, once it cannot.
    pub(crate) broken: Mutex<Option<String>>,
    /// Guard keys with entries in held, and how many: a later event of such a key goes
    /// behind them instead of to the broker. A std mutex: held for a map operation only.
    held_keys: Mutex<HashMap<String, u64>>,
    /// Guard keys of pushes whose commit failed and may still be read back: its pages can
    /// stay in the page cache, where a reopen or a restart reads them (and makes them
    /// durable), until the writer has set the database back. A later event of such a key
    /// must not reach the broker before the entry might, so it goes to the spool instead,
    /// which refuses it meanwhile. Cleared once the database is set back.
    keys_in_doubt: Mutex<HashSet<String>>,
    /// Depths and bytes are reported to it after each change.
    report: Arc<dyn Report>,
}

impl Ledger {
    pub(crate) fn new(report: Arc<dyn Report>) -> Self {
        Self {
            depth: AtomicU64::new(0),
            held_depth: AtomicU64::new(0),
            parked_depth: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            oldest_secs: AtomicI64::new(-1),
            refused: AtomicBool::new(false),
            store_failing: AtomicBool::new(false),
            reopening: AtomicBool::new(false),
            writing_since: Mutex::new(None),
            broken: Mutex::new(None),
            held_keys: Mutex::new(HashMap::new()),
            keys_in_doubt: Mutex::new(HashSet::new()),
            report,
        }
    }

    /// The depth counter of `area`.
    pub(crate) fn depth_of(&self, area: Area) -> &AtomicU64 {
        match area {
            Area::Main => &self.depth,
            Area::Held => &self.held_depth,
            Area::Parked => &self.parked_depth,
        }
    }

    /// Counts an entry of `size` bytes into `area`.
    pub(crate) fn add(&self, area: Area, size: u64) {
        self.depth_of(area).fetch_add(1, Ordering::SeqCst);
        if area != Area::Parked {
            self.bytes.fetch_add(size, Ordering::SeqCst);
        }
    }

    /// Counts an entry of `size` bytes out of `area`; an entry leaving main or held makes
    /// room.
    pub(crate) fn sub(&self, area: Area, size: u64) {
        let _ = self
            .depth_of(area)
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if area != Area::Parked {
            let _ = self
                .bytes
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    Some(n.saturating_sub(size))
                });
            self.refused.store(false, Ordering::SeqCst);
        }
    }

    pub(crate) fn holds_key(&self, key: &str) -> bool {
        lock(&self.held_keys).contains_key(key)
    }

    pub(crate) fn hold_key(&self, key: Option<&str>) {
        if let Some(key) = key {
            *lock(&self.held_keys).entry(key.to_owned()).or_default() += 1;
        }
    }

    pub(crate) fn release_key(&self, key: Option<&str>) {
        let Some(key) = key else { return };
        let mut keys = lock(&self.held_keys);
        if let Some(n) = keys.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                keys.remove(key);
            }
        }
    }

    /// Whether a push of guard key `key` failed in a way that may still bring it back
    /// (see [`Ledger::keys_in_doubt`]).
    pub(crate) fn key_in_doubt(&self, key: &str) -> bool {
        lock(&self.keys_in_doubt).contains(key)
    }

    /// Notes that a push of guard key `key` failed and may still come back.
    pub(crate) fn doubt_key(&self, key: Option<&str>) {
        if let Some(key) = key {
            lock(&self.keys_in_doubt).insert(key.to_owned());
        }
    }

    /// The database is set back: no failed push can come back any more.
    pub(crate) fn settle_doubts(&self) {
        lock(&self.keys_in_doubt).clear();
    }

    /// Replaces the held guard keys with the counts read from the held area.
    pub(crate) fn set_held_keys(&self, keys: HashMap<String, u64>) {
        *lock(&self.held_keys) = keys;
    }

    /// Records that only a restart lets the spool write again; the first reason stays.
    pub(crate) fn set_broken(&self, reason: String) {
        lock(&self.broken).get_or_insert(reason);
    }

    pub(crate) fn publish_gauges(&self) {
        self.report.counts(Counts {
            depth: self.depth.load(Ordering::SeqCst),
            bytes: self.bytes.load(Ordering::SeqCst),
            held: self.held_depth.load(Ordering::SeqCst),
            parked: self.parked_depth.load(Ordering::SeqCst),
        });
    }

    pub(crate) fn report(&self) -> &Arc<dyn Report> {
        &self.report
    }
}
