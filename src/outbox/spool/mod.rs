//! The durable outbox of events the broker could not take, and the supervised task that
//! drains it.
//!
//! An entry is committed to disk (redb, a durable commit: its `fdatasync` returned) before
//! the sender gets its 200; concurrent pushes share one commit ([`writer`]). The drainer
//! deletes entries only after the broker's confirms, a batch at a time in one commit
//! ([`drain`]); a crash between the confirms and that commit republishes at most that batch
//! (consumers dedup on `message_id`).
//!
//! Three areas, each a redb table keyed by a sequence number (arrival order), one counter
//! for all three ([`tables`]):
//!
//! - **main**: the FIFO the drainer publishes from, head first.
//! - **held**: entries no queue takes yet (unroutable), and the entries of their guard keys
//!   that arrived after them. Retried apart with back-off, so they hold back nothing else;
//!   an entry is tried only when no earlier held entry of its guard key is still waiting
//!   ([`held`]).
//! - **parked**: entries that can never be published as they are (undecodable, a record
//!   format this version does not know among them; a routing key that does not fit; or an
//!   entry the drainer failed on twice). They wait for an operator
//!   (`hookgate spool parked | republish | delete`), with the reason ([`parked`]).
//!
//! An entry moves between areas in one commit, keeping its number, so a crash leaves it in
//! exactly one. A spool an earlier version kept in sled is migrated at open ([`migrate`]).
//! An entry's value is a [`record`] of its message: versioned, and independent of
//! [`Message`]'s Rust shape.

mod changes;
mod drain;
mod held;
mod ledger;
mod migrate;
mod parked;
mod supervise;
mod tables;
mod writer;

#[cfg(test)]
mod model;
#[cfg(test)]
mod testkit;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config;
use crate::metrics::Metrics;
use crate::outbox::message::Message;
use crate::outbox::record::{self, RecordError};
use crate::store::{Store, StoreError};

pub use drain::{Sink, DRAIN_BATCH};

use ledger::Ledger;
use supervise::Failures;
use tables::{Area, Op, Tables};
use writer::{Failed, Writer};

/// The longest a request waits for its spool entry's commit. A disk that takes longer is
/// treated as failing: the sender gets a 503 rather than waiting on a stuck store (the
/// entry may still reach the disk and be published; consumers dedup on message_id).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// Entries read at once by a count at open.
const PAGE: usize = 1_000;

/// Why an event could not be spooled (the request answers 503 and the sender retries), or
/// why an operator's request on a parked entry failed.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool is disabled")]
    Disabled,
    #[error("spool is full ({bytes} of {max} bytes)")]
    Full { bytes: u64, max: u64 },
    #[error("no parked entry {0}")]
    NotParked(u64),
    #[error("parked entry {0} cannot be decoded; it can only be deleted")]
    Undecodable(u64),
    #[error("the event cannot be written as a spool record: {0}")]
    Record(#[from] RecordError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `Retry-After` of a delivery refused because the spool is full: the broker has been away
/// a while and will not be back in seconds.
pub const RETRY_AFTER_FULL_SECS: u64 = 60;

impl SpoolError {
    /// Seconds a sender should wait before retrying a delivery that met this error.
    pub fn retry_after_secs(&self) -> u64 {
        match self {
            SpoolError::Full { .. } => RETRY_AFTER_FULL_SECS,
            SpoolError::Store(e) => e.retry_after_secs(),
            _ => crate::store::RETRY_AFTER_TRANSIENT_SECS,
        }
    }
}

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

/// One parked entry, as `hookgate spool parked` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParkedEntry {
    /// The id to name it by in `republish` and `delete`.
    pub id: u64,
    /// When it was parked, Unix seconds.
    pub parked_at_secs: u64,
    /// Why.
    pub reason: String,
    /// Its event id, when the entry can be decoded.
    pub event_id: Option<String>,
    /// Its routing key, when the entry can be decoded.
    pub routing_key: Option<String>,
    /// Its route, when the entry can be decoded.
    pub route: Option<String>,
    /// Size of the entry in bytes.
    pub bytes: u64,
}

/// An entry by area and number.
type EntryRef = (Area, u64);

/// The spool.
pub struct Spool {
    tables: Tables,
    /// The one writer: group commits of pushes and of the drainer's changes.
    writer: Writer,
    /// Counts and flags, shared with the writer thread.
    ledger: Arc<Ledger>,
    enabled: bool,
    max_bytes: u64,
    /// Wakes the drainer when an entry is added.
    added: tokio::sync::Notify,
    /// Serialises an operator's changes of parked entries.
    admin: tokio::sync::Mutex<()>,
    /// The entry the drainer is working on, so a failure can be pinned on it.
    in_progress: Mutex<Option<EntryRef>>,
    /// The entries the drainer failed on.
    failed_on: Mutex<Failures>,
    /// Start of the drainer's clock (`beat_ms`, `refused_since_ms`).
    epoch: Instant,
    /// When the drainer last said it is alive.
    beat_ms: AtomicI64,
    /// Whether a drainer runs: only then does a silent beat mean a hang.
    drainer_started: AtomicBool,
    /// Since when the broker, connected, keeps refusing the head; -1 when it is not.
    refused_since_ms: AtomicI64,
    stall_after: Duration,
}

impl Spool {
    /// Opens the spool's tables in `store`, migrates a spool an earlier version left in
    /// the legacy sled store, and counts what a previous run left.
    pub fn open(
        store: &Store,
        cfg: &config::SpoolConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StoreError> {
        let tables = Tables::open(store.spool_db())?;
        migrate::from_legacy(store, &tables)?;
        // Removes the sled files if the state journal has nothing left in them either.
        store.retire_legacy_if_empty()?;
        let store = store.clone();
        // On a full disk it takes writes once there is room (see `writer`).
        let no_room = store.probe_room().err().map(|e| e.to_string());
        let reopen = Box::new(move || store.reopen_spool());
        Self::open_tables(tables, reopen, no_room, cfg, metrics)
    }

    fn open_tables(
        tables: Tables,
        reopen: writer::Reopen,
        no_room: Option<String>,
        cfg: &config::SpoolConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StoreError> {
        let ledger = Arc::new(Ledger::new(metrics));
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
            enabled: cfg.enabled,
            max_bytes: cfg.max_bytes,
            added: tokio::sync::Notify::new(),
            admin: tokio::sync::Mutex::new(()),
            in_progress: Mutex::new(None),
            failed_on: Mutex::new(Failures::default()),
            epoch: Instant::now(),
            beat_ms: AtomicI64::new(0),
            drainer_started: AtomicBool::new(false),
            refused_since_ms: AtomicI64::new(-1),
            stall_after: cfg.stall_after,
        };
        spool.recount_held_keys()?;
        spool.refresh_oldest()?;
        spool.ledger.publish_gauges();
        Ok(spool)
    }

    /// Counts the guard keys of the held entries from disk.
    fn recount_held_keys(&self) -> Result<(), StoreError> {
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
    /// [`writer`]). Nothing clears it but a restart.
    pub fn restart_needed(&self) -> Option<String> {
        ledger::lock(&self.ledger.broken).clone()
    }

    /// For the liveness check: why the spool needs a restart because a thread of it hangs,
    /// or `None`: its writer has been in one commit for longer than `deadline` (a hung
    /// `fdatasync`), or its drainer, once started, has not beaten for that long (it beats at
    /// least every second while it waits, and a publish waits at most a confirm timeout).
    pub fn hung(&self, deadline: Duration) -> Option<String> {
        let writing = *ledger::lock(&self.ledger.writing_since);
        if let Some(reason) = writing.and_then(|since| {
            crate::liveness::overdue("spool's writer thread", "commit", since.elapsed(), deadline)
        }) {
            return Some(reason);
        }
        if !self.drainer_started.load(Ordering::SeqCst) {
            return None;
        }
        let silent = self.clock_ms() - self.beat_ms.load(Ordering::SeqCst);
        let silent = Duration::from_millis(u64::try_from(silent).unwrap_or(0));
        crate::liveness::overdue("spool's drainer", "step", silent, deadline)
    }

    /// Whether the database refuses writes until the writer has opened it again (after an
    /// I/O error): nothing is drained meanwhile.
    pub(super) fn reopening(&self) -> bool {
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

    /// Appends the message to the ordered spool; returns once its commit is on disk.
    pub async fn push(&self, msg: &Message<'_>) -> Result<(), SpoolError> {
        self.push_to(Area::Main, msg).await
    }

    /// Appends the message to the held area (it is unroutable, or its guard key has
    /// entries there); returns once its commit is on disk.
    pub async fn push_held(&self, msg: &Message<'_>) -> Result<(), SpoolError> {
        self.push_to(Area::Held, msg).await
    }

    async fn push_to(&self, area: Area, msg: &Message<'_>) -> Result<(), SpoolError> {
        if !self.enabled {
            return Err(SpoolError::Disabled);
        }
        let entry = record::encode(msg)?;
        let size = entry.len() as u64;
        let l = &self.ledger;
        let before = l.bytes.fetch_add(size, Ordering::SeqCst);
        if before + size > self.max_bytes {
            l.bytes.fetch_sub(size, Ordering::SeqCst);
            l.refused.store(true, Ordering::SeqCst);
            return Err(SpoolError::Full {
                bytes: before,
                max: self.max_bytes,
            });
        }
        let order_key = msg.order_key.as_deref().map(str::to_owned);
        // Counted (and its key marked held) before it is committed, so an event of the same
        // key, or any event while main is not empty, goes behind it meanwhile.
        if area == Area::Held {
            l.hold_key(order_key.as_deref());
        }
        l.depth_of(area).fetch_add(1, Ordering::SeqCst);
        if area == Area::Main {
            let _ = l.oldest_secs.compare_exchange(
                -1,
                msg.timestamp_secs as i64,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
        l.publish_gauges();
        // Run by the writer if the commit fails, even when this request has given up.
        let undo: writer::Undo = Box::new(move |l: &Ledger, failed: Failed| {
            if failed == Failed::InDoubt {
                // Before the counts go, so that an event of its key that finds main empty
                // finds the key held.
                l.doubt_key(order_key.as_deref());
            }
            l.sub(area, size);
            if area == Area::Held {
                l.release_key(order_key.as_deref());
            }
            if area == Area::Main && l.depth.load(Ordering::SeqCst) == 0 {
                l.oldest_secs.store(-1, Ordering::SeqCst);
            }
            l.publish_gauges();
        });
        let (_, answer) = self.writer.submit_numbered(
            |seq| {
                vec![Op::Put {
                    area,
                    seq,
                    value: entry,
                }]
            },
            Some(undo),
        )?;
        // The 200 promises the event survives a power cut: its commit must have returned.
        // An entry whose commit is late may still commit (the sender's retry may then be
        // published twice, which consumers dedup on message_id), but its sender gets a 503.
        match tokio::time::timeout(FLUSH_TIMEOUT, answer).await {
            Ok(Ok(Ok(()))) => {
                self.added.notify_one();
                Ok(())
            }
            Ok(Ok(Err(error))) => Err(error.into()),
            Ok(Err(_)) => {
                Err(StoreError::Stopped("the spool's writer thread has stopped".into()).into())
            }
            Err(_) => Err(StoreError::NotDurable(format!(
                "the spool's commit took longer than {FLUSH_TIMEOUT:?}"
            ))
            .into()),
        }
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

    fn refresh_oldest(&self) -> Result<(), StoreError> {
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
mod tests {
    use super::testkit::{power_cut, TestSink};
    use super::*;
    use crate::outbox::publish::PublishError;
    use disk_seam::sim::{Fault, OpKind, SimDisk};
    use prometheus_client::metrics::counter::Counter;
    use std::sync::atomic::AtomicU64;
    use tokio_util::sync::CancellationToken;

    fn cfg(max_bytes: u64) -> config::SpoolConfig {
        config::SpoolConfig {
            enabled: true,
            max_bytes,
            ..config::SpoolConfig::default()
        }
    }

    fn msg(id: &str, body: &str) -> Message<'static> {
        Message {
            routing_key: "k".into(),
            message_id: id.to_owned().into(),
            timestamp_secs: 100,
            request_id: "r".into(),
            event_type: "t".into(),
            attempt: Some(2),
            route: "botix".into(),
            received_at: "2026-11-29T10:00:00Z".into(),
            order_key: None,
            body: bytes::Bytes::copy_from_slice(body.as_bytes()),
            content_type: None,
            traceparent: None,
            tracestate: None,
        }
    }

    /// The messages of `tests/data/spool/legacy-v0-records.json`, in its order.
    fn legacy_fixture_messages() -> [Message<'static>; 3] {
        let first = Message {
            routing_key: "contact.created".into(),
            message_id: "evt_legacy_1".into(),
            timestamp_secs: 1_795_946_400,
            request_id: "req_legacy_1".into(),
            event_type: "contact.created".into(),
            attempt: Some(2),
            route: "botix".into(),
            received_at: "2026-11-29T10:00:00Z".into(),
            order_key: None,
            body: bytes::Bytes::from_static(
                br#"{"id":"evt_legacy_1","event":"contact.created","data":{"contact_id":1}}"#,
            ),
            content_type: None,
            traceparent: None,
            tracestate: None,
        };
        let second = Message {
            routing_key: "message.status".into(),
            message_id: "evt_legacy_2".into(),
            timestamp_secs: 1_795_946_401,
            request_id: "req_legacy_2".into(),
            event_type: "message.status".into(),
            attempt: None,
            route: "botix".into(),
            received_at: "2026-11-29T10:00:01Z".into(),
            order_key: Some("botix\0status\0msg_1".into()),
            body: bytes::Bytes::from_static(
                "{\"id\":\"evt_legacy_2\",\"event\":\"message.status\",\"data\":{\"message_id\":\"msg_1\",\"status\":\"read\",\"text\":\"caf\u{e9} \u{20ac}\"}}"
                    .as_bytes(),
            ),
            content_type: None,
            traceparent: None,
            tracestate: None,
        };
        let third = Message {
            routing_key: "twilio.message.status".into(),
            message_id: "SM1:delivered".into(),
            timestamp_secs: 1_795_946_402,
            request_id: "req_legacy_3".into(),
            event_type: "message.status".into(),
            attempt: None,
            route: "twilio".into(),
            received_at: "2026-11-29T10:00:02Z".into(),
            order_key: Some("twilio\0status\0SM1".into()),
            body: bytes::Bytes::from_static(b"MessageSid=SM1&MessageStatus=delivered"),
            content_type: Some("application/x-www-form-urlencoded".into()),
            traceparent: None,
            tracestate: None,
        };
        [first, second, third]
    }

    /// The raw records of `tests/data/spool/legacy-v0-records.json`.
    fn legacy_fixture_records() -> Vec<Vec<u8>> {
        let fixture: serde_json::Value = serde_json::from_str(include_str!(
            "../../../tests/data/spool/legacy-v0-records.json"
        ))
        .expect("fixture is JSON");
        let records = fixture["records"].as_array().expect("records");
        records
            .iter()
            .map(|r| {
                let record = hex::decode(r["hex"].as_str().expect("hex")).expect("hex digits");
                // The readable copies in the fixture say what the bytes hold.
                let (meta, body) = (r["meta"].as_str().expect("meta"), r["body"].as_str());
                let mut framed = (meta.len() as u32).to_be_bytes().to_vec();
                framed.extend_from_slice(meta.as_bytes());
                framed.extend_from_slice(body.expect("body").as_bytes());
                assert_eq!(
                    framed, record,
                    "the fixture's meta and body match its bytes"
                );
                record
            })
            .collect()
    }

    #[tokio::test]
    async fn a_spool_of_legacy_records_opens_and_its_entries_decode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = legacy_fixture_records();
        let expected = legacy_fixture_messages();
        assert_eq!(records.len(), expected.len());
        {
            let store = Store::open(dir.path()).expect("open");
            let main = store.tree("spool").expect("tree");
            main.insert(&0u64.to_be_bytes(), &records[0])
                .expect("insert");
            main.insert(&1u64.to_be_bytes(), &records[1])
                .expect("insert");
            let held = store.tree("spool_held").expect("tree");
            held.insert(&2u64.to_be_bytes(), &records[2])
                .expect("insert");
            store.flush().await.expect("flush");
        }
        let store = Store::open(dir.path()).expect("reopen");
        let spool = Spool::open(&store, &cfg(1 << 20), Arc::new(Metrics::new())).expect("spool");
        let status = spool.status(1_795_946_460);
        assert_eq!((status.depth, status.held), (2, 1));
        assert_eq!(
            status.oldest_age_secs,
            Some(60),
            "the head's timestamp is read"
        );
        assert!(
            spool.holds_key("twilio\0status\0SM1"),
            "the held entry's order key is read"
        );
        let mut stored = Vec::new();
        for area in [Area::Main, Area::Held] {
            spool
                .tables
                .for_each(area, PAGE, |_, v| stored.push(record::decode(v)))
                .expect("read");
        }
        let expected: Vec<_> = expected.into_iter().map(Ok).collect();
        assert_eq!(stored, expected);

        // An entry pushed now is a current record, behind them.
        spool.push(&msg("e4", "{}")).await.expect("push");
        let last_seq = spool
            .tables
            .last_seq(Area::Main)
            .expect("read")
            .expect("an entry");
        let last = spool
            .tables
            .get(Area::Main, last_seq)
            .expect("read")
            .expect("an entry");
        assert_eq!(last.first(), Some(&record::VERSION));
        assert_eq!(record::decode(&last), Ok(msg("e4", "{}")));
    }

    #[tokio::test]
    async fn push_counts_bounds_and_survives_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let metrics = Arc::new(Metrics::new());
        {
            let store = Store::open(dir.path()).expect("open");
            let spool = Spool::open(&store, &cfg(600), metrics.clone()).expect("spool");
            spool.push(&msg("e1", "{}")).await.expect("push");
            spool.push(&msg("e2", "{}")).await.expect("push");
            let full = spool.push(&msg("e3", &"x".repeat(500))).await;
            assert!(matches!(full, Err(SpoolError::Full { .. })), "{full:?}");
            assert!(
                !spool.has_room(),
                "a spool that refused an event is not ready"
            );
            assert_eq!(spool.status(160).depth, 2);
            assert_eq!(spool.status(160).oldest_age_secs, Some(60));
        }
        let store = Store::open(dir.path()).expect("reopen");
        let spool = Spool::open(&store, &cfg(600), metrics).expect("spool");
        assert_eq!(spool.status(100).depth, 2);
        let disabled = Spool::open(
            &store,
            &config::SpoolConfig {
                enabled: false,
                ..cfg(600)
            },
            Arc::new(Metrics::new()),
        )
        .expect("spool");
        assert!(matches!(
            disabled.push(&msg("e", "{}")).await,
            Err(SpoolError::Disabled)
        ));
    }

    #[tokio::test]
    async fn held_keys_survive_reopen_and_parked_entries_are_republished_or_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = Store::open(dir.path()).expect("open");
            let spool =
                Spool::open(&store, &cfg(1 << 20), Arc::new(Metrics::new())).expect("spool");
            let mut held = msg("e1", "{}");
            held.order_key = Some("botix\0status\0m1".into());
            spool.push_held(&held).await.expect("push held");
            assert!(spool.holds_key("botix\0status\0m1"));
            assert!(
                spool.is_empty(),
                "held entries are not in the ordered spool"
            );
            // What an earlier version set aside, and one entry it could not read at all.
            let legacy = store.tree("spool_corrupt").expect("tree");
            legacy
                .insert(
                    &0u64.to_be_bytes(),
                    &record::encode(&msg("e2", "{}")).expect("encode"),
                )
                .expect("insert");
            legacy
                .insert(&1u64.to_be_bytes(), b"garbage")
                .expect("insert");
        }
        let store = Store::open(dir.path()).expect("reopen");
        let metrics = Arc::new(Metrics::new());
        let spool = Spool::open(&store, &cfg(1 << 20), metrics.clone()).expect("spool");
        assert!(spool.holds_key("botix\0status\0m1"));
        let status = spool.status(100);
        assert_eq!((status.depth, status.held, status.parked), (0, 1, 2));
        assert_eq!(metrics.spool_parked.get(), 2);
        let parked = spool.parked_entries().expect("list");
        assert_eq!(parked.len(), 2);
        assert!(parked[0].id > 0, "numbered after the held entry");
        assert_eq!(parked[0].event_id.as_deref(), Some("e2"));
        assert_eq!(parked[1].event_id, None);

        assert!(matches!(
            spool.republish(parked[1].id).await,
            Err(SpoolError::Undecodable(_))
        ));
        spool.republish(parked[0].id).await.expect("republish");
        assert!(matches!(
            spool.republish(parked[0].id).await,
            Err(SpoolError::NotParked(_))
        ));
        spool.delete_parked(parked[1].id).await.expect("delete");
        let status = spool.status(100);
        assert_eq!((status.depth, status.held, status.parked), (1, 1, 0));
        assert_eq!(metrics.spool_parked.get(), 0);
    }

    #[tokio::test]
    async fn a_failed_pass_is_counted_and_run_again() {
        let restarts = Counter::default();
        let stop = CancellationToken::new();
        let passes = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(AtomicU64::new(0));
        let (p, f) = (passes.clone(), failures.clone());
        supervise::supervise(
            &restarts,
            &stop,
            Duration::from_millis(1),
            move || {
                let n = p.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < 2 {
                        panic!("pass {n} fails");
                    }
                }
            },
            move || {
                f.fetch_add(1, Ordering::SeqCst);
            },
        )
        .await;
        assert_eq!(passes.load(Ordering::SeqCst), 3);
        assert_eq!(failures.load(Ordering::SeqCst), 2);
        assert_eq!(restarts.get(), 2);
    }

    #[tokio::test]
    async fn the_same_entry_failing_twice_is_marked_for_parking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let spool = Spool::open(&store, &cfg(1 << 20), Arc::new(Metrics::new())).expect("spool");
        let key = (Area::Main, 3u64);
        spool.set_in_progress(Some(key));
        spool.note_failure();
        assert_eq!(spool.failed_on.lock().expect("lock").to_park(), None);
        spool.set_in_progress(Some(key));
        spool.note_failure();
        assert_eq!(spool.failed_on.lock().expect("lock").to_park(), Some(key));
    }

    /// The event ids in `area`, in order.
    fn ids_in(spool: &Spool, area: Area) -> Vec<String> {
        let mut ids = Vec::new();
        spool
            .tables
            .for_each(area, PAGE, |_, v| {
                let entry = match area {
                    Area::Parked => parked::decode_parked(v).map_or(v, |(_, _, e)| e),
                    _ => v,
                };
                ids.push(record::decode(entry).map_or("?".into(), |m| m.message_id.into_owned()));
            })
            .expect("read");
        ids
    }

    /// Seeds of the simulated disk each power-cut test runs: each keeps its own prefix of
    /// the unsynced writes.
    const DISK_SEEDS: std::ops::Range<u64> = 0..6;

    #[tokio::test]
    async fn a_push_answered_ok_survives_a_power_cut_that_drops_unsynced_writes() {
        for seed in DISK_SEEDS {
            let disk = SimDisk::new(seed);
            let spool = testkit::open_on(&disk).expect("open");
            let events: Vec<_> = (0..8)
                .map(|i| testkit::event(&format!("e{i}"), None))
                .collect();
            let pushes = events.iter().map(|e| spool.push(e));
            for result in futures_util::future::join_all(pushes).await {
                result.expect("push");
                let last = disk.recent().pop().unwrap_or_default();
                assert!(
                    last.contains("sync"),
                    "a push returns after a sync, not {last}"
                );
            }
            let (_, spool) = power_cut(&disk, spool);
            let mut ids = ids_in(&spool, Area::Main);
            ids.sort();
            let expected: Vec<String> = (0..8).map(|i| format!("e{i}")).collect();
            assert_eq!(
                ids, expected,
                "every push that returned Ok, disk seed {seed}"
            );
            assert_eq!(spool.status(100).depth, 8);
        }
    }

    #[tokio::test]
    async fn a_move_to_held_leaves_the_entry_in_exactly_one_area_at_any_power_cut() {
        for ops in 1..40 {
            for seed in DISK_SEEDS {
                // The drainer is told to stop once it has published, so a commit that the
                // power cut fails is not retried.
                let stop = CancellationToken::new();
                let stopping = stop.clone();
                let unroutable = testkit::TestSink::new(move |_| {
                    stopping.cancel();
                    Err(PublishError::Unroutable("k".into()))
                });
                let disk = SimDisk::new(seed);
                let spool = testkit::open_on(&disk).expect("open");
                spool
                    .push(&testkit::event("e1", Some("key")))
                    .await
                    .expect("push");
                disk.cut_power_after(ops);
                let rows = spool.tables.page(Area::Main, None, 1).expect("head");
                let _ = spool
                    .drain_batch(&unroutable, "x", rows, &mut Default::default(), &stop)
                    .await;
                let (_, spool) = power_cut(&disk, spool);
                let main = ids_in(&spool, Area::Main);
                let held = ids_in(&spool, Area::Held);
                assert_eq!(
                    main.len() + held.len(),
                    1,
                    "power cut at operation {ops}, disk seed {seed}: main {main:?}, held {held:?}"
                );
                assert_eq!(
                    spool.holds_key("key"),
                    held.len() == 1,
                    "the guard key is held exactly while its entry is"
                );
            }
        }
    }

    #[tokio::test]
    async fn entries_the_drainer_counted_as_done_stay_deleted_after_a_power_cut() {
        for seed in DISK_SEEDS {
            let disk = SimDisk::new(seed);
            let spool = testkit::open_on(&disk).expect("open");
            for i in 0..5 {
                spool
                    .push(&testkit::event(&format!("e{i}"), None))
                    .await
                    .expect("push");
            }
            let sink = testkit::TestSink::acking();
            let rows = spool.tables.page(Area::Main, None, 5).expect("head");
            let (_, committed) = spool
                .drain_batch(
                    &sink,
                    "x",
                    rows,
                    &mut Default::default(),
                    &CancellationToken::new(),
                )
                .await;
            assert!(committed);
            assert_eq!(spool.status(100).depth, 0, "counted as done");
            let (_, spool) = power_cut(&disk, spool);
            assert_eq!(
                ids_in(&spool, Area::Main),
                Vec::<String>::new(),
                "a power cut after the drainer counted the batch done republishes none of it"
            );
        }
    }

    #[tokio::test]
    async fn a_power_cut_mid_drain_republishes_at_most_the_batch_in_flight() {
        for ops in 1..30 {
            let disk = SimDisk::new(ops);
            let spool = testkit::open_on(&disk).expect("open");
            for i in 0..12 {
                spool
                    .push(&testkit::event(&format!("e{i:02}"), None))
                    .await
                    .expect("push");
            }
            // A first batch of 4 goes through; the power goes during the second, of 6,
            // after which the drainer is told to stop (so it does not retry the commit).
            let stop = CancellationToken::new();
            let (stopping, published) = (stop.clone(), Arc::new(AtomicU64::new(0)));
            let sink = testkit::TestSink::new(move |_| {
                if published.fetch_add(1, Ordering::SeqCst) + 1 == 10 {
                    stopping.cancel();
                }
                Ok(())
            });
            let rows = spool.tables.page(Area::Main, None, 4).expect("head");
            spool
                .drain_batch(&sink, "x", rows, &mut Default::default(), &stop)
                .await;
            disk.cut_power_after(ops);
            let rows = spool.tables.page(Area::Main, None, 6).expect("head");
            spool
                .drain_batch(&sink, "x", rows, &mut Default::default(), &stop)
                .await;
            let (_, spool) = power_cut(&disk, spool);
            let left = ids_in(&spool, Area::Main);
            let acked = sink.acked();
            let again: Vec<&String> = left.iter().filter(|id| acked.contains(id)).collect();
            assert!(
                again.len() <= 6,
                "cut at operation {ops}: {again:?} would go out again"
            );
            assert!(
                again.iter().all(|id| id.as_str() >= "e04"),
                "the first batch, counted done, stays deleted: {again:?}"
            );
            for i in 0..12 {
                let id = format!("e{i:02}");
                assert!(left.contains(&id) || acked.contains(&id), "{id} lost");
            }
        }
    }

    #[tokio::test]
    async fn after_an_io_error_the_spool_opens_its_database_again_and_takes_writes_with_no_restart()
    {
        for fault in [(OpKind::Write, Fault::NoSpace), (OpKind::Sync, Fault::Io)] {
            let disk = SimDisk::new(1);
            let spool = testkit::open_on(&disk).expect("open");
            spool.push(&testkit::event("e0", None)).await.expect("push");
            disk.fail_next(fault.0, fault.1);
            let refused = spool.push(&testkit::event("e1", None)).await;
            assert!(refused.is_err(), "{refused:?}");
            assert_eq!(spool.status(100).depth, 1, "refused pushes are not counted");
            // The writer opened the database again at once (the tests' pause is zero): no
            // restart.
            spool
                .push(&testkit::event("e2", None))
                .await
                .expect("push after the reopen");
            assert_eq!(spool.restart_needed(), None, "{fault:?}");
            assert!(spool.has_room());
            assert_eq!(
                ids_in(&spool, Area::Main),
                ["e0", "e2"],
                "the refused entry is set back, even where its pages reached the disk"
            );
            assert_eq!(spool.status(100).depth, 2);
            let (_, spool) = power_cut(&disk, spool);
            assert_eq!(ids_in(&spool, Area::Main), ["e0", "e2"], "{fault:?}");
        }
    }

    #[tokio::test]
    async fn a_commit_whose_sync_failed_read_back_by_a_restart_does_not_corrupt_the_spool_at_a_power_cut(
    ) {
        for seed in 0..8 {
            let disk = SimDisk::new(seed);
            let spool = testkit::open_on(&disk).expect("open");
            spool.push(&testkit::event("e0", None)).await.expect("push");
            // The failed commit writes a table the next one does not, so the next one
            // points at pages only the failed one wrote.
            disk.fail_next(OpKind::Sync, Fault::Io);
            assert!(spool
                .push_held(&testkit::event("e1", Some("k")))
                .await
                .is_err());
            // The process restarts (a kill, or a liveness probe for another reason); the
            // failed commit's pages are still in the page cache, and the next commits are
            // answered Ok.
            let (disk, spool) = testkit::restart(&disk, spool);
            spool
                .push(&testkit::event("e2", None))
                .await
                .expect("push after the restart");
            let (_, spool) = power_cut(&disk, spool);
            let ids = ids_in(&spool, Area::Main);
            assert_eq!(
                ids,
                ["e0", "e2"],
                "seed {seed}: every entry answered Ok is kept"
            );
            let held = ids_in(&spool, Area::Held);
            assert!(
                held.len() <= 1,
                "seed {seed}: the refused entry at most: {held:?}"
            );
        }
    }

    /// What the outbox does with an event (`Outbox::deliver`): to the broker at once while
    /// nothing waits in order and its guard key is not held, else into the spool.
    async fn deliver(spool: &Spool, sink: &TestSink, msg: &Message<'_>) -> Result<(), SpoolError> {
        let key_held = msg.order_key.as_deref().is_some_and(|k| spool.holds_key(k));
        if spool.is_empty() {
            if key_held {
                return spool.push_held(msg).await;
            }
            if sink.publish("x", msg).await.is_ok() {
                return Ok(());
            }
        }
        spool.push(msg).await
    }

    #[tokio::test]
    async fn a_push_whose_commit_failed_never_reaches_the_broker_after_a_later_event_of_its_key() {
        let disk = SimDisk::new(1);
        let spool = testkit::open_on(&disk).expect("open");
        let sink = TestSink::acking();
        // The push's sync fails, and so do the syncs of the reopens that would set it back
        // (at once, at the next request, while idle): its pages stay in the page cache. The
        // restart forgets the faults left.
        disk.fail_next(OpKind::Sync, Fault::NoSpace);
        for _ in 0..8 {
            disk.fail_next(OpKind::Sync, Fault::Io);
        }
        let refused = spool.push(&testkit::event("e0", Some("k"))).await;
        assert!(refused.is_err(), "answered 503: {refused:?}");
        let later = deliver(&spool, &sink, &testkit::event("e1", Some("k"))).await;
        // Other guard keys, and events without one, are not held up.
        for (id, key) in [("x0", Some("other")), ("x1", None)] {
            deliver(&spool, &sink, &testkit::event(id, key))
                .await
                .expect("to the broker");
        }
        // A kill before the database is set back: the next open reads the refused commit
        // from the page cache, and makes it durable.
        let (_disk, spool) = testkit::restart(&disk, spool);
        assert_eq!(
            ids_in(&spool, Area::Main),
            ["e0"],
            "the refused entry is back"
        );
        let stop = CancellationToken::new();
        let rows = spool.tables.page(Area::Main, None, 8).expect("read");
        spool
            .drain_batch(&sink, "x", rows, &mut Default::default(), &stop)
            .await;
        if later.is_err() {
            // Refused too: the sender retries it.
            deliver(&spool, &sink, &testkit::event("e1", Some("k")))
                .await
                .expect("the retry is taken");
        }
        assert_eq!(
            sink.acked(),
            ["x0", "x1", "e0", "e1"],
            "e0 came back and reached the broker after e1, a later event of its key"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_whose_sync_hangs_is_reported_past_the_deadline_and_not_after_it_returns() {
        let disk = SimDisk::new(1);
        let spool = Arc::new(testkit::open_on(&disk).expect("open"));
        let deadline = Duration::from_millis(1);
        assert_eq!(spool.hung(deadline), None, "an idle writer is no hung one");
        disk.hold_syncs();
        // Released however the test ends: a held sync would keep the writer from closing.
        struct Release(SimDisk);
        impl Drop for Release {
            fn drop(&mut self) {
                self.0.release_syncs();
            }
        }
        let release = Release(disk.clone());
        let pushing = {
            let spool = spool.clone();
            tokio::spawn(async move { spool.push(&testkit::event("e0", None)).await })
        };
        let end = Instant::now() + Duration::from_secs(10);
        let reason = loop {
            if let Some(reason) = spool.hung(deadline) {
                break reason;
            }
            assert!(Instant::now() < end, "a hung sync was never reported");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(reason.contains("spool's writer thread"), "{reason}");
        drop(release);
        pushing
            .await
            .expect("join")
            .expect("push once the sync returns");
        assert_eq!(spool.hung(deadline), None);
    }

    /// Copies the sled spool of `tests/data/spool/README.md` ("sled-v0") into `dir`.
    fn copy_sled_v0(dir: &std::path::Path) {
        let fixture =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/spool/sled-v0/store");
        for entry in std::fs::read_dir(fixture).expect("fixture") {
            let entry = entry.expect("fixture file");
            std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copy");
        }
    }

    #[tokio::test]
    async fn a_sled_spool_is_migrated_in_order_once_even_when_the_migration_runs_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        copy_sled_v0(dir.path());
        let expected_main = ["evt_sled_main_1", "evt_sled_main_2", "evt_sled_main_3"];
        let expected_held = ["evt_sled_held_1", "evt_sled_held_2", "evt_sled_main_4"];
        for run in 0..2 {
            let store = Store::open(dir.path()).expect("open");
            let spool =
                Spool::open(&store, &cfg(1 << 20), Arc::new(Metrics::new())).expect("spool");
            assert_eq!(ids_in(&spool, Area::Main), expected_main, "run {run}");
            assert_eq!(ids_in(&spool, Area::Held), expected_held, "run {run}");
            assert_eq!(ids_in(&spool, Area::Parked), ["?"], "run {run}");
            let status = spool.status(1_796_032_900);
            assert_eq!((status.depth, status.held, status.parked), (3, 3, 1));
            assert!(spool.holds_key("botix\0status\0msg_1"));
            assert_eq!(spool.parked_entries().expect("list")[0].id, 6);
            assert!(!store.has_legacy(), "the sled store is closed and removed");
            assert!(!dir.path().join("conf").exists() && !dir.path().join("db").exists());
            let next = spool
                .writer
                .submit_numbered(|_| Vec::new(), None)
                .expect("seq")
                .0;
            assert_eq!(next, 7, "numbers go on above the migrated ones");
            drop(spool);
            drop(store);
            // The sled files back, entries and all, beside the migrated tables: what a crash
            // after the migration's commit and before its removals from sled leaves.
            copy_sled_v0(dir.path());
        }
    }

    #[tokio::test]
    async fn entries_drained_after_a_migration_are_not_migrated_again_when_sled_loses_its_removals()
    {
        let dir = tempfile::tempdir().expect("tempdir");
        copy_sled_v0(dir.path());
        {
            let store = Store::open(dir.path()).expect("open");
            let spool =
                Spool::open(&store, &cfg(1 << 20), Arc::new(Metrics::new())).expect("spool");
            // The drainer publishes main and an operator deletes the parked entry.
            let drained: Vec<Op> = spool
                .tables
                .page(Area::Main, None, 100)
                .expect("main")
                .into_iter()
                .map(|(seq, _)| Op::Remove {
                    area: Area::Main,
                    seq,
                })
                .collect();
            spool.writer.commit(drained).await.expect("drained");
            spool.delete_parked(6).await.expect("deleted");
        }
        // A power cut in sled's flush window: its removals were never synced, so its files
        // come back with every entry.
        copy_sled_v0(dir.path());
        let store = Store::open(dir.path()).expect("open");
        let spool = Spool::open(&store, &cfg(1 << 20), Arc::new(Metrics::new())).expect("spool");
        assert!(
            ids_in(&spool, Area::Main).is_empty(),
            "published entries came back: {:?}",
            ids_in(&spool, Area::Main)
        );
        assert!(
            ids_in(&spool, Area::Parked).is_empty(),
            "a deleted entry came back"
        );
        assert_eq!(
            ids_in(&spool, Area::Held),
            ["evt_sled_held_1", "evt_sled_held_2", "evt_sled_main_4"]
        );
        assert!(!store.has_legacy());
    }
}
