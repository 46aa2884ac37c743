//! The sled backend's dedup marks and guard state: held in memory while the gateway runs,
//! made durable as an append-only journal of batches in one sled tree.
//!
//! Why not one sled key per mark: an accepted event wrote three to four keys (claim, two done
//! marks, guard state), and those tree writes were about 40 % of hookgate's CPU per request
//! (BENCHMARKS.md, "The state layer"). Here a request changes one of 1,024 maps (chosen by key
//! hash) under its mutex and appends a record to a buffer; a writer thread stores the buffer
//! as one sled entry. sled locks its directory, so one process owns
//! the journal and memory is the single source of truth while it runs; opening replays it.
//!
//! Durability is a group commit: the writer thread takes every record appended so far as
//! one batch, hands it to sled and fsyncs, and starts the next batch as soon as that flush
//! ends (no timer on the way), so the records that arrived during one flush share the next.
//! A request that changed or read state waits with [`Journal::durable`] until the batch
//! holding everything it saw is on disk, and only then answers 200: a crash or a power loss
//! after the 200 forgets nothing the answer depended on. Claims are never written: after a
//! crash nothing is in flight.
//!
//! Space: a batch is deleted once none of its records is the current value of its key,
//! oldest batches first, so a superseded record never outlives the record that superseded
//! it (no tombstones are needed). An oldest batch that is mostly dead, or older than
//! `copy_after`, has its live records copied forward so it can go.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use nohash_hasher::BuildNoHashHasher;
use tokio::sync::watch;

use crate::state::keys::{Digest, StoreKey};
use crate::store::{StoreError, Tree};

/// The open batch's buffer is allocated with room for this much; a batch grows beyond it
/// while a flush is slow.
const BATCH_CAPACITY: usize = 32 * 1024;
/// After a failed write or flush the writer waits this long before it tries again, so a
/// full disk is not retried in a busy loop.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Batch header: created_ms (i64) and record count (u32), little-endian.
const HEADER_BYTES: usize = 12;
/// The map is split so that a sweep holds up only the requests whose keys fall in the part
/// being swept, two runtime workers rarely want the same lock, and growing a part (which
/// rehashes it under its lock) is short. Keys spread evenly, so all parts double at about
/// the same moment. With 64 parts the slowest single claim+done was 1.3 ms at a million
/// marks and 2.4 ms at three million, many of them close together; with 1,024 it is 0.2-0.4
/// and 0.7 ms (`examples/dedup_million.rs`).
const SHARDS: usize = 1024;

/// What [`Journal::modify`] does to a key.
pub enum Change<'v> {
    /// Leave it as it is.
    Keep,
    /// Set it; `durable: false` keeps it in memory only (claims).
    Put {
        value: &'v [u8],
        expires_ms: i64,
        durable: bool,
    },
}

struct Entry {
    value: Value,
    /// When a sweep may forget the entry.
    expires_ms: i64,
    /// The batch holding its current record; `None` for memory-only values.
    batch: Option<u64>,
}

/// A value held inline when it is small (dedup marks are 17 bytes), on the heap otherwise.
enum Value {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

const INLINE: usize = 22;

impl Value {
    fn new(value: &[u8]) -> Self {
        match u8::try_from(value.len()) {
            Ok(len) if value.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..value.len()].copy_from_slice(value);
                Value::Inline { len, bytes }
            }
            _ => Value::Heap(value.into()),
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Value::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Value::Heap(b) => b,
        }
    }
}

/// A hash map: a lookup costs one or two cache misses, where an ordered map of a million
/// marks walks five levels of nodes (the ordered map cost about 4 µs a request). Growing a shard rehashes it under its lock; a shard of a 3-million-mark
/// store holds about 3,000 entries (see [`SHARDS`]).
type Shard = HashMap<Digest, Entry, BuildNoHashHasher<Digest>>;

struct BatchInfo {
    /// Records of this batch that are still the current value of their key.
    live: u32,
    records: u32,
    created_ms: i64,
}

/// Records appended since the last write.
struct Open {
    seq: u64,
    buf: Vec<u8>,
}

/// How far the journal is on disk, published by the writer to the waiting requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Progress {
    /// Every batch below this sequence number is on disk.
    durable_below: u64,
    /// The last failed write or flush covered every batch below this sequence number.
    failed_below: u64,
}

/// A point in the journal: the batches a request's answer depends on end below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncPoint(u64);

/// The open batch and what is known of the written ones.
struct Log {
    open: Open,
    batches: BTreeMap<u64, BatchInfo>,
}

/// Dedup marks and guard state with an append-only journal in sled. Dropping it stops the
/// writer thread and writes what is left.
pub struct Journal {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

/// What the requests and the writer thread share. Lock order: `writes`, `unwritten`, a
/// shard, `log`.
struct Shared {
    shards: Vec<Mutex<Shard>>,
    log: Mutex<Log>,
    /// Wakes the writer for a batch's first record and when the batch is full (waits on
    /// `log`).
    wake: Condvar,
    /// Held while a batch is written or deleted, so batches land in sequence order and a
    /// batch is never deleted while it is being written. Taken before any other lock.
    writes: Mutex<()>,
    tree: Tree,
    copy_after: Duration,
    stop: AtomicBool,
    /// Batches taken from memory that sled has not accepted yet (a failing disk).
    unwritten: Mutex<Vec<Open>>,
    /// Set while writes fail; readiness reports it.
    failing: AtomicBool,
    /// Batches below this were handed to sled (changed only under `writes`).
    inserted_below: AtomicU64,
    /// What is on disk, for [`Journal::durable`].
    progress: watch::Sender<Progress>,
}

impl Journal {
    /// Replays `tree` (values that expired by `now_ms` are dropped) and starts the writer
    /// thread. `copy_after` bounds how long a live record pins an old batch.
    pub fn open(tree: Tree, now_ms: i64, copy_after: Duration) -> Result<Arc<Self>, StoreError> {
        let mut shards: Vec<Shard> = (0..SHARDS).map(|_| Shard::default()).collect();
        let mut log = Log {
            open: Open::new(0),
            batches: BTreeMap::new(),
        };
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = tree.page(after.as_deref(), 256)?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            for (key, value) in page {
                let Some(seq) = decode_seq(&key) else {
                    continue;
                };
                log.open = Open::new(seq + 1);
                let Some((created_ms, records)) = decode_batch(&value) else {
                    tracing::warn!(batch = seq, "unreadable state batch ignored");
                    log.batches.insert(seq, BatchInfo::empty(now_ms));
                    continue;
                };
                let mut info = BatchInfo::empty(created_ms);
                info.records = records.len() as u32;
                log.batches.insert(seq, info);
                for (key, expires_ms, value) in records {
                    let entry = Entry {
                        value: Value::new(value),
                        expires_ms,
                        batch: Some(seq),
                    };
                    if let Some(old) = shards[shard_of(&key)].insert(key, entry) {
                        log.release(old.batch);
                    }
                    log.take(seq);
                }
            }
        }
        let replayed_below = log.open.seq;
        let shared = Arc::new(Shared {
            shards: shards.into_iter().map(Mutex::new).collect(),
            log: Mutex::new(log),
            wake: Condvar::new(),
            writes: Mutex::new(()),
            tree,
            copy_after,
            stop: AtomicBool::new(false),
            unwritten: Mutex::new(Vec::new()),
            failing: AtomicBool::new(false),
            inserted_below: AtomicU64::new(replayed_below),
            progress: watch::Sender::new(Progress {
                durable_below: replayed_below,
                failed_below: 0,
            }),
        });
        shared.forget_expired(now_ms);
        let for_writer = shared.clone();
        let writer = std::thread::Builder::new()
            .name("state-journal".into())
            .spawn(move || write_loop(&for_writer))
            .map_err(|e| StoreError::Stopped(format!("cannot start the journal writer: {e}")))?;
        Ok(Arc::new(Self {
            shared,
            writer: Some(writer),
        }))
    }

    /// The value of `key`, if any (expired values stay until a sweep; callers judge them).
    pub fn get(&self, key: &StoreKey) -> Option<Vec<u8>> {
        let key = key.digest();
        self.shared
            .shard(&key)
            .get(&key)
            .map(|e| e.value.as_slice().to_vec())
    }

    /// Sets `key` durably.
    pub fn put(&self, key: &StoreKey, value: &[u8], expires_ms: i64, now_ms: i64) {
        self.modify(key, now_ms, |_| {
            (
                Change::Put {
                    value,
                    expires_ms,
                    durable: true,
                },
                (),
            )
        });
    }

    /// Reads and changes `key` atomically: `decide` sees the current value and says what
    /// to do; its second result is returned.
    pub fn modify<'v, R>(
        &self,
        key: &StoreKey,
        now_ms: i64,
        decide: impl FnOnce(Option<&[u8]>) -> (Change<'v>, R),
    ) -> R {
        let key = key.digest();
        let mut shard = self.shared.shard(&key);
        // One probe of the table for the read and the write: in a map of a million entries
        // each probe is a cache miss.
        let slot = shard.entry(key);
        let current = match &slot {
            MapEntry::Occupied(found) => Some(found.get().value.as_slice()),
            MapEntry::Vacant(_) => None,
        };
        let (change, result) = decide(current);
        let Change::Put {
            value,
            expires_ms,
            durable,
        } = change
        else {
            return result;
        };
        let value = Value::new(value);
        let superseded = match &slot {
            MapEntry::Occupied(found) => found.get().batch,
            MapEntry::Vacant(_) => None,
        };
        // Every durable change of every shard needs the log lock, so only the log's own
        // bookkeeping happens under it: not the allocation above, nor the insert below, which
        // may grow (rehash) the shard. The shard lock is held throughout, so records of one
        // key enter the journal in the order their changes were made.
        let batch = if durable || superseded.is_some() {
            let mut log = self.shared.lock_log();
            log.release(superseded);
            durable.then(|| {
                let was_empty = log.open.buf.len() == HEADER_BYTES;
                let seq = log.append(&key, expires_ms, value.as_slice(), now_ms);
                // The writer sleeps while there is nothing to write: wake it for the first
                // record of a batch (it takes the batch as soon as its last flush ends).
                if was_empty {
                    self.shared.wake.notify_one();
                }
                seq
            })
        } else {
            None
        };
        let entry = Entry {
            value,
            expires_ms,
            batch,
        };
        match slot {
            MapEntry::Occupied(mut found) => {
                found.insert(entry);
            }
            MapEntry::Vacant(free) => {
                free.insert(entry);
            }
        }
        result
    }

    /// Forgets `key` if its value is memory-only and `forget` says so. Durable values are
    /// only forgotten by expiry: without a tombstone, a removed one would come back on replay.
    pub fn forget_volatile_if(&self, key: &StoreKey, forget: impl FnOnce(&[u8]) -> bool) {
        let key = key.digest();
        let mut shard = self.shared.shard(&key);
        if shard
            .get(&key)
            .is_some_and(|e| e.batch.is_none() && forget(e.value.as_slice()))
        {
            shard.remove(&key);
        }
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.shared.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets values that expired by `now_ms` and deletes the batches nothing needs any
    /// more. Returns how many values went.
    pub fn sweep(&self, now_ms: i64) -> Result<usize, StoreError> {
        let removed = self.shared.forget_expired(now_ms);
        // Also retries batches sled refused while no new records woke the writer.
        self.shared.write_now()?;
        self.shared.compact(now_ms)?;
        Ok(removed)
    }

    /// Hands every appended record to sled and flushes it to disk now (shutdown, tests).
    pub fn write_now(&self) -> Result<(), StoreError> {
        self.shared.write_now()
    }

    /// The point everything appended so far ends at: once it is durable, so is every
    /// change made before this call (and every value read before it).
    pub fn sync_point(&self) -> SyncPoint {
        let log = self.shared.lock_log();
        let has_records = log.open.buf.len() > HEADER_BYTES;
        SyncPoint(log.open.seq + u64::from(has_records))
    }

    /// Waits until everything before `point` is on disk (the writer's group commit), at
    /// most `wait`. An error if the write or the flush that covered it failed, or if it
    /// took longer: the caller must not answer 200 then.
    pub async fn durable(&self, point: SyncPoint, wait: Duration) -> Result<(), StoreError> {
        let mut progress = self.shared.progress.subscribe();
        let reached = tokio::time::timeout(wait, async {
            progress
                .wait_for(|p| p.durable_below >= point.0 || p.failed_below >= point.0)
                .await
                .map(|p| *p)
        })
        .await;
        match reached {
            Ok(Ok(p)) if p.durable_below >= point.0 => Ok(()),
            Ok(Ok(_)) => Err(StoreError::Unwritable(
                "state journal cannot be written to disk".into(),
            )),
            Ok(Err(_)) => Err(StoreError::Stopped("state journal writer stopped".into())),
            Err(_) => Err(StoreError::NotDurable(format!(
                "state journal not on disk within {wait:?}"
            ))),
        }
    }

    /// Whether the last write to sled failed.
    pub fn is_failing(&self) -> bool {
        self.shared.failing.load(Ordering::SeqCst)
    }

    /// Number of batches in sled (for tests and the dedup example).
    pub fn batches_on_disk(&self) -> usize {
        self.shared.tree.len()
    }
}

impl Shared {
    fn shard(&self, key: &Digest) -> MutexGuard<'_, Shard> {
        lock(&self.shards[shard_of(key)])
    }

    fn lock_log(&self) -> MutexGuard<'_, Log> {
        lock(&self.log)
    }

    fn write_now(&self) -> Result<(), StoreError> {
        let _writing = lock(&self.writes);
        self.write_open()
    }

    /// Writes the open batch (and any earlier one sled refused) and flushes sled to disk;
    /// the caller holds `writes`.
    fn write_open(&self) -> Result<(), StoreError> {
        let mut unwritten = lock(&self.unwritten);
        // The next batch's buffer is allocated before the log lock, which requests wait for.
        let mut next = Open::new(0);
        let taken = {
            let mut log = self.lock_log();
            (log.open.buf.len() > HEADER_BYTES).then(|| {
                next.seq = log.open.seq + 1;
                std::mem::replace(&mut log.open, next)
            })
        };
        unwritten.extend(taken);
        let attempted_below = unwritten
            .last()
            .map_or(self.inserted_below.load(Ordering::SeqCst), |b| b.seq + 1);
        // Oldest first, and a batch leaves the queue only once sled took it.
        while let Some(batch) = unwritten.first() {
            if let Err(error) = self.tree.insert(&batch.seq.to_be_bytes(), &batch.buf) {
                return Err(self.failed(error, attempted_below));
            }
            self.inserted_below.store(batch.seq + 1, Ordering::SeqCst);
            unwritten.remove(0);
        }
        drop(unwritten);
        let inserted_below = self.inserted_below.load(Ordering::SeqCst);
        if inserted_below > self.progress.borrow().durable_below {
            if let Err(error) = self.tree.flush() {
                return Err(self.failed(error, attempted_below));
            }
            self.progress
                .send_modify(|p| p.durable_below = p.durable_below.max(inserted_below));
        }
        if self.failing.swap(false, Ordering::SeqCst) {
            tracing::info!("state journal written again");
        }
        Ok(())
    }

    /// Records a failed write or flush of the batches below `attempted_below`: their
    /// waiters learn it at once, readiness reports it, the log says it once.
    fn failed(&self, error: StoreError, attempted_below: u64) -> StoreError {
        if !self.failing.swap(true, Ordering::SeqCst) {
            tracing::error!(%error, "state journal cannot be written; retrying");
        }
        self.progress
            .send_modify(|p| p.failed_below = p.failed_below.max(attempted_below));
        error
    }

    /// Forgets expired values, one shard at a time. The log lock, which every durable change
    /// needs, is taken only to account for what went, not during the scan.
    fn forget_expired(&self, now_ms: i64) -> usize {
        let mut removed = 0;
        for shard in &self.shards {
            let mut released = Vec::new();
            {
                let mut shard = lock(shard);
                shard.retain(|_, e| {
                    let keep = e.expires_ms > now_ms;
                    if !keep {
                        released.push(e.batch);
                    }
                    keep
                });
            }
            removed += released.len();
            if !released.is_empty() {
                let mut log = self.lock_log();
                for batch in released {
                    log.release(batch);
                }
            }
        }
        removed
    }

    /// Deletes dead batches from the oldest on; copies a mostly dead (or old) oldest batch's
    /// live records forward first.
    fn compact(&self, now_ms: i64) -> Result<(), StoreError> {
        let _writing = lock(&self.writes);
        // Batches written by this compaction (the copies) wait for the next one, and so does
        // everything from the first batch sled has not taken yet.
        let end = {
            let unwritten = lock(&self.unwritten);
            unwritten
                .first()
                .map_or_else(|| self.lock_log().open.seq, |b| b.seq)
        };
        loop {
            let (seq, copy) = {
                let log = self.lock_log();
                let Some((&seq, info)) = log.batches.first_key_value() else {
                    return Ok(());
                };
                if seq >= end {
                    return Ok(());
                }
                let old = now_ms - info.created_ms >= self.copy_after.as_millis() as i64;
                let mostly_dead = info.live * 2 <= info.records;
                match (info.live, old || mostly_dead) {
                    (0, _) => (seq, false),
                    (_, true) => (seq, true),
                    (_, false) => return Ok(()),
                }
            };
            if copy {
                self.copy_forward(seq, now_ms)?;
                // The copies must be in sled before the batch they came from goes.
                self.write_open()?;
            }
            self.tree.remove(&seq.to_be_bytes())?;
            self.lock_log().batches.remove(&seq);
        }
    }

    /// Appends the records of batch `seq` that are still current to the open batch.
    fn copy_forward(&self, seq: u64, now_ms: i64) -> Result<(), StoreError> {
        let Some(bytes) = self.tree.get(&seq.to_be_bytes())? else {
            return Ok(());
        };
        let records = decode_batch(&bytes).map(|(_, r)| r).unwrap_or_default();
        for (key, _, _) in records {
            let mut shard = self.shard(&key);
            let Some(entry) = shard.get_mut(&key).filter(|e| e.batch == Some(seq)) else {
                continue;
            };
            let mut log = self.lock_log();
            let value = entry.value.as_slice();
            entry.batch = Some(log.append(&key, entry.expires_ms, value, now_ms));
            log.release(Some(seq));
        }
        Ok(())
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        {
            // Set under the lock the writer checks it under, so the wake-up cannot be missed.
            let _log = self.shared.lock_log();
            self.shared.stop.store(true, Ordering::SeqCst);
            self.shared.wake.notify_one();
        }
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        if let Err(error) = self.shared.write_now() {
            tracing::error!(%error, "state journal not written at shutdown");
        }
    }
}

/// The writer thread: sleeps while nothing was appended; otherwise writes and flushes
/// everything appended so far at once, and starts again as soon as that flush ends (records
/// that arrive meanwhile share the next flush). Ends when the journal is dropped.
fn write_loop(shared: &Shared) {
    let stopping = || shared.stop.load(Ordering::SeqCst);
    while !stopping() {
        {
            let mut log = shared.lock_log();
            while log.open.buf.len() == HEADER_BYTES && !stopping() {
                log = shared
                    .wake
                    .wait(log)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
        // A failure is logged (once), reported to the waiters, and retried by the next round.
        if shared.write_now().is_err() {
            std::thread::sleep(RETRY_PAUSE);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn shard_of(key: &Digest) -> usize {
    usize::from(u16::from_le_bytes([key.0[0], key.0[1]])) % SHARDS
}

impl Log {
    /// Appends a record to the open batch and returns the batch's sequence number.
    fn append(&mut self, key: &Digest, expires_ms: i64, value: &[u8], now_ms: i64) -> u64 {
        let seq = self.open.seq;
        let info = self
            .batches
            .entry(seq)
            .or_insert_with(|| BatchInfo::empty(now_ms));
        info.live += 1;
        info.records += 1;
        let buf = &mut self.open.buf;
        if buf.len() == HEADER_BYTES {
            buf[..8].copy_from_slice(&now_ms.to_le_bytes());
        }
        buf.extend_from_slice(&key.0);
        buf.extend_from_slice(&expires_ms.to_le_bytes());
        buf.extend_from_slice(&(value.len() as u32).to_le_bytes());
        buf.extend_from_slice(value);
        let count = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) + 1;
        buf[8..12].copy_from_slice(&count.to_le_bytes());
        seq
    }

    /// A record of batch `seq` (read at replay) is the current value of its key.
    fn take(&mut self, seq: u64) {
        if let Some(info) = self.batches.get_mut(&seq) {
            info.live += 1;
        }
    }

    /// A record of `batch` is no longer the current value of its key.
    fn release(&mut self, batch: Option<u64>) {
        if let Some(info) = batch.and_then(|b| self.batches.get_mut(&b)) {
            info.live = info.live.saturating_sub(1);
        }
    }
}

impl BatchInfo {
    fn empty(created_ms: i64) -> Self {
        Self {
            live: 0,
            records: 0,
            created_ms,
        }
    }
}

impl Open {
    fn new(seq: u64) -> Self {
        // Room for a full batch up front: growing the buffer record by record copied it
        // again and again on the request path.
        let mut buf = Vec::with_capacity(BATCH_CAPACITY);
        buf.resize(HEADER_BYTES, 0);
        Self { seq, buf }
    }
}

fn decode_seq(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

type Record<'a> = (Digest, i64, &'a [u8]);

/// A batch's creation time and records; `None` if it is cut short or malformed.
fn decode_batch(bytes: &[u8]) -> Option<(i64, Vec<Record<'_>>)> {
    let created_ms = i64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let count = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?);
    let mut rest = bytes.get(HEADER_BYTES..)?;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
        rest = tail;
        Some(head)
    };
    let mut records = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let key = Digest(take(16)?.try_into().ok()?);
        let expires_ms = i64::from_le_bytes(take(8)?.try_into().ok()?);
        let value_len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        records.push((key, expires_ms, take(value_len)?));
    }
    Some((created_ms, records))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn temp_store() -> (tempfile::TempDir, crate::store::Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = crate::store::Store::open(dir.path()).expect("store");
        (dir, store)
    }

    fn open(store: &crate::store::Store, now_ms: i64) -> Arc<Journal> {
        Journal::open(store.tree("state").expect("tree"), now_ms, DAY).expect("open")
    }

    /// Runs `puts` with the writer thread held off, so that their records form one batch:
    /// the writer takes whatever is open as soon as it wakes, which would split them at
    /// random.
    fn in_one_batch(j: &Journal, puts: impl FnOnce()) {
        let _writing = lock(&j.shared.writes);
        puts();
    }

    #[test]
    fn values_survive_a_reopen_and_expired_ones_do_not() {
        let (_dir, store) = temp_store();
        {
            let j = open(&store, 0);
            j.put(&StoreKey::raw(b"a"), b"1", 1_000, 0);
            j.put(&StoreKey::raw(b"b"), b"2", 100, 0);
            j.put(&StoreKey::raw(b"a"), b"3", 2_000, 10); // supersedes the first record of a
            j.modify(&StoreKey::raw(b"c"), 10, |_| {
                (
                    Change::Put {
                        value: b"claim",
                        expires_ms: 5_000,
                        durable: false,
                    },
                    (),
                )
            });
            assert_eq!(j.len(), 3);
        }
        let j = open(&store, 500);
        assert_eq!(j.get(&StoreKey::raw(b"a")).as_deref(), Some(&b"3"[..]));
        assert_eq!(
            j.get(&StoreKey::raw(b"b")),
            None,
            "expired before the reopen"
        );
        assert_eq!(
            j.get(&StoreKey::raw(b"c")),
            None,
            "claims are never written"
        );
        assert_eq!(j.len(), 1);
    }

    #[test]
    fn sweeping_deletes_dead_batches_oldest_first() {
        let (_dir, store) = temp_store();
        let j = open(&store, 0);
        j.put(&StoreKey::raw(b"short"), b"x", 100, 0);
        j.write_now().expect("write");
        j.put(&StoreKey::raw(b"long"), b"y", 10_000, 1);
        j.write_now().expect("write");
        assert_eq!(j.batches_on_disk(), 2);
        assert_eq!(j.sweep(50).expect("sweep"), 0);
        assert_eq!(j.batches_on_disk(), 2);
        assert_eq!(j.sweep(100).expect("sweep"), 1);
        assert_eq!(
            j.batches_on_disk(),
            1,
            "the first batch is dead and deleted"
        );
        assert_eq!(j.sweep(10_000).expect("sweep"), 1);
        assert_eq!(j.batches_on_disk(), 0);
        assert!(j.is_empty());
    }

    #[test]
    fn a_superseded_record_never_outlives_its_successor() {
        let (_dir, store) = temp_store();
        {
            let j = open(&store, 0);
            // Batch 0: k (soon superseded) and pin (long-lived, keeps batch 0 alive).
            in_one_batch(&j, || {
                j.put(&StoreKey::raw(b"k"), b"old", 9_000, 0);
                j.put(&StoreKey::raw(b"pin"), b"p", 9_000, 0);
                j.put(&StoreKey::raw(b"filler"), b"f", 9_000, 0);
            });
            j.write_now().expect("write");
            // Batch 1: k's new value, expiring sooner.
            j.put(&StoreKey::raw(b"k"), b"new", 500, 1);
            j.write_now().expect("write");
            // k expires; batch 1 is dead, batch 0 still holds pin and filler.
            j.sweep(600).expect("sweep");
            assert_eq!(j.batches_on_disk(), 2, "batch 1 waits for batch 0");
        }
        let j = open(&store, 600);
        assert_eq!(
            j.get(&StoreKey::raw(b"k")),
            None,
            "the old record of k must not come back"
        );
        assert_eq!(j.get(&StoreKey::raw(b"pin")).as_deref(), Some(&b"p"[..]));
    }

    #[test]
    fn a_mostly_dead_oldest_batch_is_copied_forward() {
        let (_dir, store) = temp_store();
        {
            let j = open(&store, 0);
            in_one_batch(&j, || {
                for i in 0..10u8 {
                    j.put(
                        &StoreKey::raw(&[i]),
                        b"v",
                        if i == 0 { 9_000 } else { 100 },
                        0,
                    );
                }
            });
            j.write_now().expect("write");
            j.sweep(200).expect("sweep");
            assert_eq!(j.len(), 1);
            // Batch 0 went; its one live record now sits in batch 1.
            assert_eq!(j.batches_on_disk(), 1);
        }
        let j = open(&store, 300);
        assert_eq!(j.get(&StoreKey::raw(&[0])).as_deref(), Some(&b"v"[..]));
        assert_eq!(j.len(), 1);
    }

    #[test]
    fn the_writer_thread_writes_without_being_asked() {
        let (_dir, store) = temp_store();
        let j = open(&store, 0);
        j.put(&StoreKey::raw(b"a"), b"1", 1_000, 0);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while j.batches_on_disk() == 0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(j.batches_on_disk(), 1);
    }

    #[tokio::test]
    async fn a_change_is_durable_once_the_group_commit_flushed_its_batch() {
        let (_dir, store) = temp_store();
        let j = open(&store, 0);
        // Nothing appended: nothing to wait for.
        let idle = j.sync_point();
        j.durable(idle, Duration::from_secs(5))
            .await
            .expect("nothing pending");
        j.put(&StoreKey::raw(b"a"), b"1", 1_000, 0);
        let point = j.sync_point();
        assert!(point.0 > idle.0, "a change moves the point");
        j.durable(point, Duration::from_secs(5))
            .await
            .expect("flushed by the writer thread");
        assert_eq!(j.batches_on_disk(), 1);
        assert!(j.shared.progress.borrow().durable_below >= point.0);
    }

    #[test]
    fn a_truncated_batch_is_skipped_not_fatal() {
        assert!(decode_batch(&[0; 5]).is_none());
        let mut log = Log {
            open: Open::new(0),
            batches: BTreeMap::new(),
        };
        log.append(&Digest::of(b"key"), 7, b"value", 1);
        let full = log.open.buf;
        let (created, records) = decode_batch(&full).expect("whole batch");
        assert_eq!((created, records.len()), (1, 1));
        assert!(decode_batch(&full[..full.len() - 1]).is_none());
    }
}
