//! The durable outbox of events the broker could not take, and the supervised task that
//! drains it.
//!
//! An entry is written and flushed to disk before the sender gets its 200; the drainer
//! deletes it only after the broker's confirm. A crash between the confirm and the delete
//! republishes that entry once (consumers dedup on `message_id`).
//!
//! Three areas, each a sled tree keyed by a big-endian sequence number (arrival order):
//!
//! - **main**: the FIFO the drainer publishes from, head first.
//! - **held**: entries no queue takes yet (unroutable), and the entries of their guard keys
//!   that arrived after them. Retried apart with back-off, so they hold back nothing else;
//!   an entry is tried only when no earlier held entry of its guard key is still waiting.
//! - **parked**: entries that can never be published as they are (undecodable, a record
//!   format this version does not know among them; a routing key that does not fit; or an
//!   entry the drainer failed on twice). They wait for an operator
//!   (`hookgate spool parked | republish | delete`), with the reason.
//!
//! An entry's value is a [`record`] of its message: versioned, and independent of
//! [`Message`]'s Rust shape.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use tokio_util::sync::CancellationToken;

use crate::config;
use crate::metrics::Metrics;
use crate::outbox::message::Message;
use crate::outbox::publish::{PublishError, Publisher};
use crate::outbox::record::{self, RecordError};
use crate::store::{Store, StoreError, Tree};

/// The longest a request waits for its spool entry's fsync. A disk that takes longer is
/// treated as failing: the sender gets a 503 rather than waiting on a stuck store (the
/// entry may still reach the disk and be published; consumers dedup on message_id).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// Back-off of the passes over held (unroutable) entries.
const HELD_RETRY_MIN: Duration = Duration::from_secs(1);
const HELD_RETRY_MAX: Duration = Duration::from_secs(30);
/// How often held (unroutable) entries are reported.
const UNROUTABLE_LOG_EVERY: Duration = Duration::from_secs(60);
/// Pause before the drainer is started again after a failure (doubling up to the max).
const RESTART_MIN: Duration = Duration::from_secs(1);
const RESTART_MAX: Duration = Duration::from_secs(30);
/// The longest the drainer sleeps without telling it is alive.
const BEAT: Duration = Duration::from_secs(1);
/// Entries read at once by a pass over the held area or a count.
const PAGE: usize = 1_000;

const MAIN_TREE: &str = "spool";
const HELD_TREE: &str = "spool_held";
const PARKED_TREE: &str = "spool_parked";
/// Where an earlier version put entries it could not read; moved to parked at open.
const LEGACY_CORRUPT_TREE: &str = "spool_corrupt";
/// Version byte of a parked record.
const PARKED_V1: u8 = 1;

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

/// Which area an entry is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Area {
    Main,
    Held,
}

/// An entry by area and key.
type EntryRef = (Area, Vec<u8>);

/// Entries the drainer failed on.
#[derive(Default)]
struct Failures {
    /// The entry of the last failure.
    last: Option<EntryRef>,
    /// An entry it failed on twice in a row, for the next pass to park.
    to_park: Option<EntryRef>,
}

/// What one attempt on an entry came to.
enum Step {
    /// The entry left its place (published, held apart or parked).
    Progress,
    /// The broker is away or blocked: not the drainer's fault.
    Wait,
    /// The broker refused it for now (nack, timeout, channel error).
    Failed(PublishError),
}

/// Lets a report through at most once per period.
#[derive(Default)]
struct Every(Option<Instant>);

impl Every {
    fn due(&mut self, every: Duration) -> bool {
        let due = self.0.is_none_or(|t| t.elapsed() >= every);
        if due {
            self.0 = Some(Instant::now());
        }
        due
    }
}

/// The spool.
pub struct Spool {
    main: Tree,
    held: Tree,
    parked: Tree,
    store: Store,
    enabled: bool,
    max_bytes: u64,
    /// Entries in main.
    depth: AtomicU64,
    /// Entries in held.
    held_depth: AtomicU64,
    /// Entries in parked.
    parked_depth: AtomicU64,
    /// Bytes in main and held: the room `max_bytes` bounds.
    bytes: AtomicU64,
    next_seq: AtomicU64,
    /// Depths and bytes are mirrored into its gauges.
    metrics: Arc<Metrics>,
    /// Receipt time (Unix seconds) of the oldest entry in main, or -1.
    oldest_secs: AtomicI64,
    /// Wakes the drainer when an entry is added.
    added: tokio::sync::Notify,
    /// Set when an event was refused for lack of room, cleared when an entry leaves:
    /// `bytes < max_bytes` alone would call a spool ready that refuses every event.
    refused: AtomicBool,
    /// Set when the store refused to write or delete an entry (a full disk, say), cleared
    /// when it takes one again.
    store_failing: AtomicBool,
    /// Guard keys with entries in held, and how many: a later event of such a key goes
    /// behind them instead of to the broker. A std mutex: held for a map operation only.
    held_keys: Mutex<HashMap<String, u64>>,
    /// The entry the drainer is working on, so a failure can be pinned on it.
    in_progress: Mutex<Option<EntryRef>>,
    /// The entries the drainer failed on.
    failed_on: Mutex<Failures>,
    /// Start of the drainer's clock (`beat_ms`, `stuck_since_ms`).
    epoch: Instant,
    /// When the drainer last said it is alive.
    beat_ms: AtomicI64,
    /// Since when the broker, connected, keeps refusing the head; -1 when it is not.
    stuck_since_ms: AtomicI64,
    stall_after: Duration,
}

impl Spool {
    /// Opens the spool's trees and counts what a previous run left in them.
    pub fn open(
        store: &Store,
        cfg: &config::SpoolConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StoreError> {
        let main = store.tree(MAIN_TREE)?;
        let held = store.tree(HELD_TREE)?;
        let parked = store.tree(PARKED_TREE)?;
        let (depth, main_bytes) = count(&main)?;
        let (held_depth, held_bytes) = count(&held)?;
        // Sequence numbers name entries in every area (a parked entry keeps its number), so
        // the next one is above all of them.
        let mut next_seq = 0;
        for tree in [&main, &held, &parked] {
            if let Some(last) = tree.last()?.and_then(|(k, _)| seq_of(&k)) {
                next_seq = next_seq.max(last + 1);
            }
        }
        let mut held_keys: HashMap<String, u64> = HashMap::new();
        for_each(&held, |_, v| {
            if let Some(key) = record::decode(v).ok().and_then(|m| m.order_key) {
                *held_keys.entry(key.into_owned()).or_default() += 1;
            }
        })?;
        let spool = Self {
            main,
            held,
            parked,
            store: store.clone(),
            enabled: cfg.enabled,
            max_bytes: cfg.max_bytes,
            depth: AtomicU64::new(depth),
            held_depth: AtomicU64::new(held_depth),
            parked_depth: AtomicU64::new(0),
            bytes: AtomicU64::new(main_bytes + held_bytes),
            next_seq: AtomicU64::new(next_seq),
            metrics,
            oldest_secs: AtomicI64::new(-1),
            added: tokio::sync::Notify::new(),
            refused: AtomicBool::new(false),
            store_failing: AtomicBool::new(false),
            held_keys: Mutex::new(held_keys),
            in_progress: Mutex::new(None),
            failed_on: Mutex::new(Failures::default()),
            epoch: Instant::now(),
            beat_ms: AtomicI64::new(0),
            stuck_since_ms: AtomicI64::new(-1),
            stall_after: cfg.stall_after,
        };
        spool.adopt_legacy_corrupt()?;
        spool
            .parked_depth
            .store(spool.parked.len() as u64, Ordering::SeqCst);
        spool.refresh_oldest()?;
        spool.publish_gauges();
        Ok(spool)
    }

    /// Moves what an earlier version set aside as unreadable into parked, under new numbers.
    fn adopt_legacy_corrupt(&self) -> Result<(), StoreError> {
        let legacy = self.store.tree(LEGACY_CORRUPT_TREE)?;
        if legacy.is_empty() {
            return Ok(());
        }
        let mut entries = Vec::new();
        for_each(&legacy, |k, v| entries.push((k.to_vec(), v.to_vec())))?;
        for (key, value) in entries {
            let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
            let reason = "set aside as unreadable by an earlier version";
            self.parked.insert(
                &seq.to_be_bytes(),
                &encode_parked(reason, now_secs(), &value),
            )?;
            legacy.remove(&key)?;
        }
        Ok(())
    }

    /// Whether nothing waits in order. While something does, new events queue behind it.
    pub fn is_empty(&self) -> bool {
        self.depth.load(Ordering::SeqCst) == 0
    }

    /// Whether entries of guard key `key` are held apart: a later event of that key must
    /// go behind them ([`Spool::push_held`]).
    pub fn holds_key(&self, key: &str) -> bool {
        self.held_keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(key)
    }

    /// Whether the spool takes events: enabled, not at its bound, no event refused for lack
    /// of room since an entry last left, and the store taking writes.
    pub fn has_room(&self) -> bool {
        self.enabled
            && !self.refused.load(Ordering::SeqCst)
            && !self.store_failing.load(Ordering::SeqCst)
            && self.bytes.load(Ordering::SeqCst) < self.max_bytes
    }

    /// Whether entries wait behind one the store will not delete: new events queue behind
    /// them, so none can be taken even while the broker is connected.
    pub fn is_stuck(&self) -> bool {
        self.store_failing.load(Ordering::SeqCst) && !self.is_empty()
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
        let stuck = self.stuck_since_ms.load(Ordering::SeqCst);
        now - self.beat_ms.load(Ordering::SeqCst) > limit || (stuck >= 0 && now - stuck > limit)
    }

    /// Appends the message to the ordered spool and makes it durable.
    pub async fn push(&self, msg: &Message<'_>) -> Result<(), SpoolError> {
        self.push_to(Area::Main, msg).await
    }

    /// Appends the message to the held area (it is unroutable, or its guard key has
    /// entries there) and makes it durable.
    pub async fn push_held(&self, msg: &Message<'_>) -> Result<(), SpoolError> {
        self.push_to(Area::Held, msg).await
    }

    async fn push_to(&self, area: Area, msg: &Message<'_>) -> Result<(), SpoolError> {
        if !self.enabled {
            return Err(SpoolError::Disabled);
        }
        let entry = record::encode(msg)?;
        let size = entry.len() as u64;
        let before = self.bytes.fetch_add(size, Ordering::SeqCst);
        if before + size > self.max_bytes {
            self.bytes.fetch_sub(size, Ordering::SeqCst);
            self.refused.store(true, Ordering::SeqCst);
            return Err(SpoolError::Full {
                bytes: before,
                max: self.max_bytes,
            });
        }
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        let order_key = msg.order_key.as_deref();
        // The key is marked held before the entry exists, so an event of the same key
        // never finds it unmarked while the entry is on its way in.
        if area == Area::Held {
            self.hold_key(order_key);
        }
        if let Err(e) = self.tree(area).insert(&seq.to_be_bytes(), &entry) {
            self.bytes.fetch_sub(size, Ordering::SeqCst);
            if area == Area::Held {
                self.release_key(order_key);
            }
            self.store_failing.store(true, Ordering::SeqCst);
            return Err(e.into());
        }
        match area {
            Area::Main => {
                self.depth.fetch_add(1, Ordering::SeqCst);
                let _ = self.oldest_secs.compare_exchange(
                    -1,
                    msg.timestamp_secs as i64,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
            Area::Held => {
                self.held_depth.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.publish_gauges();
        self.added.notify_one();
        // The 200 promises the event survives a crash: it must be on disk first. An entry
        // whose flush failed stays queued (the sender's retry may then be published twice,
        // which consumers dedup on message_id), but its sender gets a 503.
        let flushed = tokio::time::timeout(FLUSH_TIMEOUT, self.store.flush())
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::NotDurable(format!(
                    "the spool's fsync took longer than {FLUSH_TIMEOUT:?}"
                )))
            });
        self.store_failing.store(flushed.is_err(), Ordering::SeqCst);
        Ok(flushed?)
    }

    /// Depth, bytes, the oldest entry's age, held and parked counts, and whether the
    /// drainer is stalled.
    pub fn status(&self, now_secs: i64) -> SpoolStatus {
        let oldest_main = self.oldest_secs.load(Ordering::SeqCst);
        let oldest_held = self
            .held
            .first()
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
            depth: self.depth.load(Ordering::SeqCst),
            bytes: self.bytes.load(Ordering::SeqCst),
            oldest_age_secs: (oldest >= 0).then(|| (now_secs - oldest).max(0) as u64),
            held: self.held_depth.load(Ordering::SeqCst),
            parked: self.parked_depth.load(Ordering::SeqCst),
            stalled: self.is_stalled(),
        }
    }

    /// Runs the drainer until `stop`, supervised: a panic in it is logged at ERROR, counted
    /// in `hookgate_spool_drainer_restarts_total`, and the drainer starts again after a
    /// pause. An entry it failed on twice in a row is parked, so one bad entry cannot keep
    /// it failing.
    pub async fn run_drainer(
        self: Arc<Self>,
        publisher: Publisher,
        exchange: String,
        stop: CancellationToken,
    ) {
        let restarts = self.metrics.spool_drainer_restarts.clone();
        let spool = self.clone();
        let pass_stop = stop.clone();
        supervise(
            &restarts,
            &stop,
            RESTART_MIN,
            move || {
                spool
                    .clone()
                    .drain(publisher.clone(), exchange.clone(), pass_stop.clone())
            },
            || self.note_failure(),
        )
        .await;
    }

    /// Pins a drainer failure on the entry it was working on; the second failure in a row
    /// on the same entry marks it to be parked by the next pass.
    fn note_failure(&self) {
        let current = self
            .in_progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let mut failed = self
            .failed_on
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if current.is_some() && current == failed.last {
            failed.to_park = current;
            failed.last = None;
        } else {
            failed.last = current;
        }
    }

    /// Republishes entries until `stop`: main in order, each deleted only after its ack;
    /// held ones in passes with back-off; undecodable or unfit ones parked.
    async fn drain(
        self: Arc<Self>,
        publisher: Publisher,
        exchange: String,
        stop: CancellationToken,
    ) {
        let mut retry = RETRY_MIN;
        let mut failing = false;
        let mut held_retry = HELD_RETRY_MIN;
        let mut held_due = Instant::now();
        let mut unroutable_log = Every::default();
        loop {
            self.beat();
            if stop.is_cancelled() {
                return;
            }
            let poisoned = self
                .failed_on
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .to_park
                .take();
            if let Some((area, key)) = poisoned {
                self.park_key(area, &key, "the drainer failed on it twice", &stop)
                    .await;
                continue;
            }
            if self.held_depth.load(Ordering::SeqCst) > 0
                && Instant::now() >= held_due
                && publisher.is_connected()
            {
                let published = self
                    .retry_held(&publisher, &exchange, &mut unroutable_log, &stop)
                    .await;
                held_retry = if published {
                    HELD_RETRY_MIN
                } else {
                    (held_retry * 2).min(HELD_RETRY_MAX)
                };
                held_due = Instant::now() + held_retry;
                continue;
            }
            let head = match self.main.first() {
                Ok(h) => h,
                Err(error) => {
                    tracing::error!(%error, "cannot read the spool; retrying");
                    self.pause(&stop, RETRY_MAX).await;
                    continue;
                }
            };
            let Some((key, value)) = head else {
                self.stuck_since_ms.store(-1, Ordering::SeqCst);
                let added = self.added.notified();
                if self.is_empty() {
                    let wake = if self.held_depth.load(Ordering::SeqCst) > 0 {
                        held_due.saturating_duration_since(Instant::now()).min(BEAT)
                    } else {
                        BEAT
                    };
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = added => {}
                        _ = tokio::time::sleep(wake) => {}
                    }
                }
                continue;
            };
            if !publisher.is_connected() {
                self.stuck_since_ms.store(-1, Ordering::SeqCst);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = publisher.wait_connected() => {}
                    _ = tokio::time::sleep(BEAT) => {}
                }
                continue;
            }
            self.set_in_progress(Some((Area::Main, key.clone())));
            let step = self
                .drain_head(
                    &publisher,
                    &exchange,
                    &key,
                    &value,
                    &mut unroutable_log,
                    &stop,
                )
                .await;
            self.set_in_progress(None);
            match step {
                Step::Progress => {
                    self.stuck_since_ms.store(-1, Ordering::SeqCst);
                    if failing {
                        tracing::info!(
                            depth = self.depth.load(Ordering::SeqCst),
                            "spool draining again"
                        );
                    }
                    retry = RETRY_MIN;
                    failing = false;
                }
                Step::Wait => {
                    self.stuck_since_ms.store(-1, Ordering::SeqCst);
                    self.pause(&stop, RETRY_MIN).await;
                }
                Step::Failed(error) => {
                    let _ = self.stuck_since_ms.compare_exchange(
                        -1,
                        self.clock_ms(),
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    );
                    if !failing {
                        tracing::warn!(%error, "spool drain paused");
                    }
                    failing = true;
                    self.pause(&stop, retry).await;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// One attempt on the head of main.
    async fn drain_head(
        &self,
        publisher: &Publisher,
        exchange: &str,
        key: &[u8],
        value: &[u8],
        unroutable_log: &mut Every,
        stop: &CancellationToken,
    ) -> Step {
        let msg = match record::decode(value) {
            Ok(msg) => msg,
            Err(error) => {
                let reason = undecodable(&error);
                self.park(Area::Main, key, value, None, &reason, stop).await;
                return Step::Progress;
            }
        };
        let order_key = msg.order_key.as_deref();
        if order_key.is_some_and(|k| self.holds_key(k)) {
            // An earlier event of its guard key waits in held: this one goes behind it.
            self.move_to_held(key, value, order_key, stop).await;
            return Step::Progress;
        }
        match publisher.publish(exchange, &msg).await {
            Ok(()) => {
                self.remove(Area::Main, key, value.len() as u64, order_key, stop)
                    .await;
                Step::Progress
            }
            Err(error @ PublishError::Unroutable(_)) => {
                if unroutable_log.due(UNROUTABLE_LOG_EVERY) {
                    // Kept safe, and no longer in the way of the rest; but it arrives only
                    // once a queue is bound: an operator must act.
                    tracing::error!(%error, event_id = %msg.message_id, held = self.held_depth.load(Ordering::SeqCst) + 1, "spooled event is unroutable; held apart until a queue is bound to the exchange");
                }
                self.move_to_held(key, value, order_key, stop).await;
                Step::Progress
            }
            Err(error @ PublishError::Unfit(_)) => {
                let reason = error.to_string();
                self.park(Area::Main, key, value, order_key, &reason, stop)
                    .await;
                Step::Progress
            }
            Err(PublishError::NotConnected | PublishError::Blocked) => Step::Wait,
            Err(error) => Step::Failed(error),
        }
    }

    /// One pass over held entries in arrival order; returns whether any was published. An
    /// entry is skipped while an earlier one of its guard key, or one with its routing key,
    /// was unroutable in this pass. A broker failure ends the pass.
    async fn retry_held(
        &self,
        publisher: &Publisher,
        exchange: &str,
        unroutable_log: &mut Every,
        stop: &CancellationToken,
    ) -> bool {
        let mut published = false;
        let mut blocked_keys: HashSet<String> = HashSet::new();
        let mut blocked_routes: HashSet<String> = HashSet::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = match self.held.page(after.as_deref(), PAGE) {
                Ok(p) => p,
                Err(error) => {
                    tracing::error!(%error, "cannot read the held spool entries");
                    return published;
                }
            };
            let Some((last, _)) = page.last() else {
                return published;
            };
            after = Some(last.clone());
            for (key, value) in page {
                self.beat();
                if stop.is_cancelled() || !publisher.is_connected() {
                    return published;
                }
                let msg = match record::decode(&value) {
                    Ok(msg) => msg,
                    Err(error) => {
                        let reason = undecodable(&error);
                        self.park(Area::Held, &key, &value, None, &reason, stop)
                            .await;
                        continue;
                    }
                };
                let order_key = msg.order_key.as_deref();
                if order_key.is_some_and(|k| blocked_keys.contains(k)) {
                    continue;
                }
                if blocked_routes.contains(msg.routing_key.as_ref()) {
                    blocked_keys.extend(order_key.map(str::to_owned));
                    continue;
                }
                self.set_in_progress(Some((Area::Held, key.clone())));
                let result = publisher.publish(exchange, &msg).await;
                self.set_in_progress(None);
                match result {
                    Ok(()) => {
                        self.remove(Area::Held, &key, value.len() as u64, order_key, stop)
                            .await;
                        published = true;
                    }
                    Err(error @ PublishError::Unroutable(_)) => {
                        if unroutable_log.due(UNROUTABLE_LOG_EVERY) {
                            tracing::error!(%error, event_id = %msg.message_id, held = self.held_depth.load(Ordering::SeqCst), "held spool entries are still unroutable; bind a queue to the exchange");
                        }
                        blocked_routes.insert(msg.routing_key.to_string());
                        blocked_keys.extend(order_key.map(str::to_owned));
                    }
                    Err(error @ PublishError::Unfit(_)) => {
                        let reason = error.to_string();
                        self.park(Area::Held, &key, &value, order_key, &reason, stop)
                            .await;
                    }
                    Err(_) => return published,
                }
            }
        }
    }

    /// Moves a main entry to held, keeping its sequence number (so its arrival order).
    async fn move_to_held(
        &self,
        key: &[u8],
        value: &[u8],
        order_key: Option<&str>,
        stop: &CancellationToken,
    ) {
        // Marked held before it leaves main: a request that finds main empty then also
        // finds the key held, and goes behind this entry.
        self.hold_key(order_key);
        if let Err(error) = self.held.insert(key, value) {
            self.release_key(order_key);
            self.store_failing.store(true, Ordering::SeqCst);
            tracing::error!(%error, "cannot move an unroutable spool entry aside; retrying");
            self.pause(stop, RETRY_MAX).await;
            return;
        }
        self.held_depth.fetch_add(1, Ordering::SeqCst);
        self.bytes.fetch_add(value.len() as u64, Ordering::SeqCst);
        self.remove(Area::Main, key, value.len() as u64, None, stop)
            .await;
    }

    /// Parks the entry `key` of `area`, if it is still there.
    async fn park_key(&self, area: Area, key: &[u8], reason: &str, stop: &CancellationToken) {
        match self.tree(area).get(key) {
            Ok(Some(value)) => {
                let order_key = record::decode(&value)
                    .ok()
                    .and_then(|m| m.order_key.map(|k| k.into_owned()));
                self.park(area, key, &value, order_key.as_deref(), reason, stop)
                    .await;
            }
            Ok(None) => {}
            Err(error) => tracing::error!(%error, "cannot read a spool entry to park it"),
        }
    }

    /// Moves an entry that can never be published as it is to parked, under its own
    /// sequence number, so a crash halfway parks it again rather than twice.
    async fn park(
        &self,
        area: Area,
        key: &[u8],
        value: &[u8],
        order_key: Option<&str>,
        reason: &str,
        stop: &CancellationToken,
    ) {
        let parked = encode_parked(reason, now_secs(), value);
        let fresh = match self.parked.get(key) {
            Ok(existing) => existing.is_none(),
            Err(_) => true,
        };
        if let Err(error) = self.parked.insert(key, &parked) {
            self.store_failing.store(true, Ordering::SeqCst);
            tracing::error!(%error, "cannot park a spool entry; retrying");
            self.pause(stop, RETRY_MAX).await;
            return;
        }
        if fresh {
            self.parked_depth.fetch_add(1, Ordering::SeqCst);
        }
        let event_id = record::decode(value)
            .ok()
            .map(|m| m.message_id.into_owned());
        // Data kept but out of the flow: an operator must look at it.
        tracing::error!(
            id = seq_of(key).unwrap_or_default(),
            event_id = event_id.as_deref().unwrap_or("?"),
            reason,
            "spool entry parked; see `hookgate spool parked`"
        );
        self.remove(area, key, value.len() as u64, order_key, stop)
            .await;
    }

    /// Deletes an entry from `area` (published, moved or parked). While the store refuses,
    /// it retries the delete, not the publish: publishing the head again on every failed
    /// delete flooded the broker with copies (thousands a second on a full disk). The
    /// entries behind it wait; only a shutdown in the meantime leaves it to be published
    /// once more after a restart.
    async fn remove(
        &self,
        area: Area,
        key: &[u8],
        size: u64,
        order_key: Option<&str>,
        stop: &CancellationToken,
    ) {
        let mut retry = RETRY_MIN;
        let mut reported = false;
        loop {
            match self.tree(area).remove(key) {
                Ok(removed) => {
                    if removed.is_some() {
                        match area {
                            Area::Main => self.depth.fetch_sub(1, Ordering::SeqCst),
                            Area::Held => self.held_depth.fetch_sub(1, Ordering::SeqCst),
                        };
                        self.bytes.fetch_sub(size, Ordering::SeqCst);
                        self.refused.store(false, Ordering::SeqCst);
                        if area == Area::Held {
                            self.release_key(order_key);
                        }
                    }
                    self.store_failing.store(false, Ordering::SeqCst);
                    if reported {
                        tracing::info!("published spool entry deleted; the spool drains again");
                    }
                    break;
                }
                Err(error) => {
                    self.store_failing.store(true, Ordering::SeqCst);
                    if !reported {
                        tracing::error!(%error, "cannot delete a published spool entry; the spool waits until the store takes writes again");
                        reported = true;
                    }
                    if stop.is_cancelled() {
                        tracing::warn!("shutting down with a published spool entry not deleted; it will be published again after the restart");
                        return;
                    }
                    self.pause(stop, retry).await;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
        if let Err(error) = self.refresh_oldest() {
            tracing::warn!(%error, "cannot read the spool head");
        }
        self.publish_gauges();
    }

    /// Parked entries, oldest first.
    pub fn parked_entries(&self) -> Result<Vec<ParkedEntry>, StoreError> {
        let mut out = Vec::new();
        for_each(&self.parked, |k, v| {
            if let Some(entry) = describe_parked(k, v) {
                out.push(entry);
            }
        })?;
        Ok(out)
    }

    /// Puts parked entry `id` back at the tail of the ordered spool, for the drainer to
    /// publish (or park again, if it still cannot be published).
    pub async fn republish(&self, id: u64) -> Result<(), SpoolError> {
        let key = id.to_be_bytes();
        let parked = self.parked.get(&key)?.ok_or(SpoolError::NotParked(id))?;
        let entry = decode_parked(&parked)
            .map(|(_, _, entry)| entry)
            .filter(|entry| record::decode(entry).is_ok())
            .ok_or(SpoolError::Undecodable(id))?;
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        self.main.insert(&seq.to_be_bytes(), entry)?;
        self.depth.fetch_add(1, Ordering::SeqCst);
        self.bytes.fetch_add(entry.len() as u64, Ordering::SeqCst);
        if self.parked.remove(&key)?.is_some() {
            self.parked_depth.fetch_sub(1, Ordering::SeqCst);
        }
        self.refresh_oldest()?;
        self.publish_gauges();
        self.added.notify_one();
        self.store.flush().await?;
        Ok(())
    }

    /// Deletes parked entry `id` for good.
    pub async fn delete_parked(&self, id: u64) -> Result<(), SpoolError> {
        if self.parked.remove(&id.to_be_bytes())?.is_none() {
            return Err(SpoolError::NotParked(id));
        }
        self.parked_depth.fetch_sub(1, Ordering::SeqCst);
        self.publish_gauges();
        self.store.flush().await?;
        Ok(())
    }

    fn tree(&self, area: Area) -> &Tree {
        match area {
            Area::Main => &self.main,
            Area::Held => &self.held,
        }
    }

    fn hold_key(&self, key: Option<&str>) {
        if let Some(key) = key {
            *self
                .held_keys
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(key.to_owned())
                .or_default() += 1;
        }
    }

    fn release_key(&self, key: Option<&str>) {
        let Some(key) = key else { return };
        let mut keys = self
            .held_keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = keys.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                keys.remove(key);
            }
        }
    }

    fn set_in_progress(&self, entry: Option<EntryRef>) {
        *self
            .in_progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = entry;
    }

    fn clock_ms(&self) -> i64 {
        self.epoch.elapsed().as_millis() as i64
    }

    fn beat(&self) {
        self.beat_ms.store(self.clock_ms(), Ordering::SeqCst);
    }

    /// Sleeps `d` (or until `stop`), telling every second that the drainer is alive.
    async fn pause(&self, stop: &CancellationToken, d: Duration) {
        let end = Instant::now() + d;
        loop {
            self.beat();
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() || stop.is_cancelled() {
                return;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(left.min(BEAT)) => {}
            }
        }
    }

    fn refresh_oldest(&self) -> Result<(), StoreError> {
        let oldest = self
            .main
            .first()?
            .and_then(|(_, v)| record::decode(&v).ok())
            .map_or(-1, |m| m.timestamp_secs as i64);
        self.oldest_secs.store(oldest, Ordering::SeqCst);
        Ok(())
    }

    fn publish_gauges(&self) {
        let m = &self.metrics;
        m.spool_depth.set(self.depth.load(Ordering::SeqCst) as i64);
        m.spool_bytes.set(self.bytes.load(Ordering::SeqCst) as i64);
        m.spool_held
            .set(self.held_depth.load(Ordering::SeqCst) as i64);
        m.spool_parked
            .set(self.parked_depth.load(Ordering::SeqCst) as i64);
    }
}

/// Runs `pass` until it returns. A panic in it is logged at ERROR, counted in `restarts`,
/// reported to `failed`, and followed by a new pass after a pause that doubles (from
/// `first_pause` up to 30 s) while passes keep failing.
async fn supervise<F, Fut>(
    restarts: &Counter,
    stop: &CancellationToken,
    first_pause: Duration,
    mut pass: F,
    mut failed: impl FnMut(),
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut pause = first_pause;
    loop {
        let started = Instant::now();
        let error = match tokio::spawn(pass()).await {
            Ok(()) => return,
            Err(e) if e.is_cancelled() => return,
            Err(e) => e,
        };
        let panic = error.into_panic();
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        restarts.inc();
        failed();
        if started.elapsed() > RESTART_MAX {
            pause = first_pause;
        }
        // Events keep being spooled but none is published until it runs again.
        tracing::error!(panic = %what, restart_in = ?pause, "the spool drainer failed; restarting it");
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(RESTART_MAX);
    }
}

/// Reads the spool of a store directly (for `hookgate spool` when no gateway runs).
pub fn status_of_store(store: &Store, now_secs: i64) -> Result<SpoolStatus, StoreError> {
    let spool = Spool::open(
        store,
        &config::SpoolConfig::default(),
        Arc::new(Metrics::new()),
    )?;
    let mut status = spool.status(now_secs);
    status.stalled = false;
    Ok(status)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn seq_of(key: &[u8]) -> Option<u64> {
    key.try_into().ok().map(u64::from_be_bytes)
}

/// Calls `f` on every entry of `tree`, a page at a time.
fn for_each(tree: &Tree, mut f: impl FnMut(&[u8], &[u8])) -> Result<(), StoreError> {
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = tree.page(after.as_deref(), PAGE)?;
        let Some((last, _)) = page.last() else {
            return Ok(());
        };
        after = Some(last.clone());
        for (k, v) in &page {
            f(k, v);
        }
    }
}

fn count(tree: &Tree) -> Result<(u64, u64), StoreError> {
    let (mut depth, mut bytes) = (0, 0);
    for_each(tree, |_, v| {
        depth += 1;
        bytes += v.len() as u64;
    })?;
    Ok((depth, bytes))
}

/// The reason an entry that cannot be decoded is parked with.
fn undecodable(error: &RecordError) -> String {
    format!("the entry cannot be decoded: {error}")
}

/// Parked record: version byte, parked-at (u64 big-endian Unix seconds), reason length
/// (u16 big-endian), reason (UTF-8), then the entry as it was.
fn encode_parked(reason: &str, parked_at: u64, entry: &[u8]) -> Vec<u8> {
    let reason = &reason.as_bytes()[..reason.len().min(u16::MAX as usize)];
    let mut out = Vec::with_capacity(11 + reason.len() + entry.len());
    out.push(PARKED_V1);
    out.extend_from_slice(&parked_at.to_be_bytes());
    out.extend_from_slice(&(reason.len() as u16).to_be_bytes());
    out.extend_from_slice(reason);
    out.extend_from_slice(entry);
    out
}

fn decode_parked(record: &[u8]) -> Option<(u64, String, &[u8])> {
    if *record.first()? != PARKED_V1 {
        return None;
    }
    let parked_at = u64::from_be_bytes(record.get(1..9)?.try_into().ok()?);
    let len = u16::from_be_bytes(record.get(9..11)?.try_into().ok()?) as usize;
    let reason = String::from_utf8_lossy(record.get(11..11 + len)?).into_owned();
    Some((parked_at, reason, record.get(11 + len..)?))
}

fn describe_parked(key: &[u8], parked: &[u8]) -> Option<ParkedEntry> {
    let id = seq_of(key)?;
    let (parked_at_secs, reason, entry) = decode_parked(parked).unwrap_or((
        0,
        "the parked record cannot be decoded".to_owned(),
        parked,
    ));
    let msg = record::decode(entry).ok();
    Some(ParkedEntry {
        id,
        parked_at_secs,
        reason,
        event_id: msg.as_ref().map(|m| m.message_id.to_string()),
        routing_key: msg.as_ref().map(|m| m.routing_key.to_string()),
        route: msg.as_ref().map(|m| m.route.to_string()),
        bytes: entry.len() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "../../tests/data/spool/legacy-v0-records.json"
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
            let main = store.tree(MAIN_TREE).expect("tree");
            main.insert(&0u64.to_be_bytes(), &records[0])
                .expect("insert");
            main.insert(&1u64.to_be_bytes(), &records[1])
                .expect("insert");
            let held = store.tree(HELD_TREE).expect("tree");
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
        for tree in [&spool.main, &spool.held] {
            for_each(tree, |_, v| stored.push(record::decode(v))).expect("read");
        }
        let expected: Vec<_> = expected.into_iter().map(Ok).collect();
        assert_eq!(stored, expected);

        // An entry pushed now is a current record, behind them.
        spool.push(&msg("e4", "{}")).await.expect("push");
        let (_, last) = spool.main.last().expect("read").expect("an entry");
        assert_eq!(last.first(), Some(&record::VERSION));
        assert_eq!(record::decode(&last), Ok(msg("e4", "{}")));
    }

    #[test]
    fn parked_records_round_trip() {
        let record = encode_parked("why", 7, b"entry");
        assert_eq!(
            decode_parked(&record),
            Some((7, "why".to_owned(), &b"entry"[..]))
        );
        assert_eq!(decode_parked(b"\x02rest"), None);
        let listed = describe_parked(&5u64.to_be_bytes(), &record).expect("listed");
        assert_eq!(listed.id, 5);
        assert_eq!(listed.event_id, None, "the entry itself is not decodable");
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
        assert_eq!(status_of_store(&store, 100).expect("status").depth, 2);
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
            let legacy = store.tree(LEGACY_CORRUPT_TREE).expect("tree");
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
        supervise(
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
        let key = (Area::Main, 3u64.to_be_bytes().to_vec());
        spool.set_in_progress(Some(key.clone()));
        spool.note_failure();
        assert_eq!(spool.failed_on.lock().expect("lock").to_park, None);
        spool.set_in_progress(Some(key.clone()));
        spool.note_failure();
        assert_eq!(spool.failed_on.lock().expect("lock").to_park, Some(key));
    }
}
