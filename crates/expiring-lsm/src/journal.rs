//! The store: a bounded hot set in memory, the rest in sorted runs on disk ([`Runs`]), and a
//! journal of segment files ([`Wal`]) that makes the hot set durable. The crate's README
//! gives the design and its invariants.
//!
//! Callers read and change the hot set: one of 1,024 maps (chosen by digest) under its
//! mutex. A key the hot set does not hold is looked up in the runs, newest first: the
//! runs' filters rule most of them out without a disk read, and each map remembers the
//! runs' answers for the last keys it lacked (a caller reads a key, then writes it). Every
//! durable change appends a record to the open journal batch; a writer thread appends the
//! batch to the journal and fsyncs (a group commit: the batch that arrives during one flush
//! shares the next), and a caller that changed or read state waits with
//! [`Journal::durable`] for the batch holding everything it saw before it answers.
//! Memory-only values are never written: after a crash nothing is in flight. Batches of a
//! store written before the journal had files come from a [`LegacyBatches`] source: they
//! are replayed at open and removed once a run holds them.
//!
//! Once the hot set holds `hot_entries` entries, a flush thread writes those whose records
//! are on disk as a run, then forgets them and the journal batches the run now holds. A
//! merge thread merges runs and deletes expired ones. Neither holds a lock a caller needs
//! while it writes: a caller waits for neither.
//!
//! A record never expires before the record of its key it supersedes (a write keeps the
//! later expiry), so forgetting an expired record, in memory or in a run, never brings an
//! older value back.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nohash_hasher::BuildNoHashHasher;
use tokio::sync::watch;

use crate::run::Record;
use crate::runs::Runs;
use crate::wal::{Frame, Wal, FRAME_HEAD};
use crate::Clock;
use crate::Digest;
use crate::{Error, LegacyBatches};
use disk_seam::Disk;

/// Folder of the state's runs, inside the store's directory.
pub const RUNS_DIR: &str = "state-runs";
/// Folder of the state journal's segments, inside the store's directory.
pub const JOURNAL_DIR: &str = "state-journal";

/// The open batch's buffer is allocated with room for this much; a batch grows beyond it
/// while a flush is slow.
const BATCH_CAPACITY: usize = 32 * 1024;
/// After a failed write or flush the writer waits this long before it tries again, so a
/// full disk is not retried in a busy loop.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// After a failed run flush or merge, the background thread waits this long.
const BACKGROUND_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two merges that keep failing (see [`next_retry`]).
const BACKGROUND_RETRY_MAX: Duration = Duration::from_secs(300);
/// Nice value of the flush and merge threads: on two cores, a merge of millions of records
/// at the requests' priority showed in their p99; the journal's writer, which requests wait
/// for, keeps the normal priority.
const BACKGROUND_NICE: i32 = 10;
/// Batch header: created_ms (i64) and record count (u32), little-endian.
const HEADER_BYTES: usize = 12;
/// An open batch's buffer holds its frame's head, the batch header, then its records.
const EMPTY_BATCH: usize = FRAME_HEAD + HEADER_BYTES;
/// The hot set is split so that two runtime workers rarely want the same lock and growing a
/// part (which rehashes it under its lock) is short.
const SHARDS: usize = 1024;
/// While runs cannot be written, the hot set takes new keys up to this many times
/// `hot_entries`, then refuses them: its memory stays bounded, and so does the journal a
/// restart replays.
const HOT_SET_LIMIT_FACTOR: usize = 4;
/// While the hot set is full and none of it is on disk (the journal cannot be written),
/// the flush thread waits this long before it looks again: each look locks every map.
const NOTHING_TO_FLUSH_PAUSE: Duration = Duration::from_millis(100);
/// Runs lookups remembered per shard (see [`Shard::looked_up`]). The read and the write of
/// one request are milliseconds apart, and a shard sees a few dozen lookups a second.
const LOOKUPS_KEPT: usize = 4;

/// How the hot set and the runs are sized and kept.
#[derive(Clone)]
pub struct Settings {
    /// Entries the hot set holds before a flush writes them to a run.
    pub hot_entries: usize,
    /// The dedup window: a run is rewritten alone this long after it was written, so that
    /// long-lived records do not keep expired ones on disk.
    pub ttl: Duration,
    /// The clock of the background threads (expiry of runs).
    pub clock: Clock,
    /// Size of a journal segment file.
    pub segment_bytes: u64,
    /// Commits start at most this often (`store.commit_interval`); a record that arrives
    /// after a quiet interval is committed at once.
    pub commit_interval: Duration,
    /// Called, with the reason, when a thread of the journal ends before the journal is
    /// dropped: without its writer no change is ever durable again, without its flush and
    /// merge threads the hot set fills and stays full. Only a restart cures it.
    pub needs_restart: Arc<dyn Fn(String) + Send + Sync>,
    /// The file system of the runs and the journal's segments.
    pub disk: Arc<dyn Disk>,
    /// Whether the writer, flush and merge threads run. Without them nothing is written
    /// until the caller asks ([`Journal::write_now`], [`Journal::flush_to_run`],
    /// [`Journal::merge_now`], [`Journal::prepare_spare`]): the model test drives every
    /// step itself, in an order its seed decides.
    pub background: bool,
}

impl Settings {
    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }
}

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
    /// When the entry may be forgotten.
    expires_ms: i64,
    /// The journal batch holding its current record; `None` for memory-only values.
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

/// One part of the hot set, with what the runs said of the last keys it lacked.
#[derive(Default)]
struct Shard {
    /// A hash map: a lookup costs one or two cache misses.
    map: HashMap<Digest, Entry, BuildNoHashHasher<Digest>>,
    /// The runs' answers for the last [`LOOKUPS_KEPT`] keys `map` lacked, oldest first: a
    /// request that reads a key and then writes it (guard state, a request id's mark)
    /// looks through the runs once, not twice. An answer goes when its key enters `map`;
    /// until then a run can only lose the record to a merge that finds it expired, and
    /// every reader checks expiry itself.
    looked_up: Vec<(Digest, Option<Record>)>,
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

/// Work asked of the background threads.
#[derive(Default)]
struct Asked {
    /// The journal used its spare segment: prepare the next.
    spare: bool,
    /// The hot set is full: write a run.
    flush: bool,
    /// A run was written, or a sweep is due: merge and delete runs.
    merge: bool,
}

/// Dedup marks and guard state. Dropping it stops its threads and writes what is left.
pub struct Journal {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// The journal's files and the batches taken from memory that are not on disk yet (a
/// failing disk keeps them until a write succeeds).
struct Writer {
    wal: Wal,
    pending: Vec<Open>,
}

/// What the requests and the threads share. Lock order: `writer`, a shard, `open`.
struct Shared {
    shards: Vec<Mutex<Shard>>,
    open: Mutex<Open>,
    /// Wakes the writer for a batch's first record (waits on `open`).
    wake: Condvar,
    /// Held while batches are written, so they land in sequence order.
    writer: Mutex<Writer>,
    /// Where the journal's segments are (spares are prepared there).
    journal_dir: PathBuf,
    /// Spares prepared so far: each gets a name of its own.
    spares: AtomicU64,
    /// Journal batches of a store written before the journal had files.
    legacy: Arc<dyn LegacyBatches>,
    runs: Runs,
    settings: Settings,
    /// Entries in the hot set.
    held: AtomicUsize,
    asked: Mutex<Asked>,
    /// Held by a flush to a run, and by a round of merges: one of each at a time.
    flushing: Mutex<()>,
    merging: Mutex<()>,
    /// Wakes the flush and merge threads (waits on `asked`).
    asked_wake: Condvar,
    stop: AtomicBool,
    /// Set while writes fail; readiness reports it.
    failing: AtomicBool,
    /// Set while the flush thread cannot write runs.
    flush_failing: AtomicBool,
    /// Looks of the flush thread for something to write (tests check it does not spin).
    #[cfg(test)]
    flush_passes: AtomicU64,
    /// What is on disk, for [`Journal::durable`].
    progress: watch::Sender<Progress>,
}

impl Journal {
    /// Opens the runs and the journal in the store folder `dir`, replays the journal
    /// batches the runs do not hold (values that expired by `now_ms` are dropped) and
    /// starts the threads. Batches of a store written before the journal had files are
    /// read from `legacy` first; a store written before runs existed holds
    /// its whole state there: the replay reads it, and the first flush moves it to runs.
    pub fn open(
        legacy: Arc<dyn LegacyBatches>,
        dir: &Path,
        now_ms: i64,
        settings: Settings,
    ) -> Result<Arc<Self>, Error> {
        // The store folder's own entry: a power cut that takes the folder back takes every
        // run and segment in it. Its subfolders are synced into it as they are made.
        disk_seam::create_dir_all(&*settings.disk, dir)?;
        let parent = disk_seam::parent_of(dir);
        match settings.disk.sync_dir(&parent) {
            // A parent the process may not read (a mount point's) cannot be synced by it;
            // the store worked there before, and keeps working.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                tracing::warn!(error = %e, dir = %parent.display(), "store folder's parent not synced");
            }
            synced => synced?,
        }
        let runs = Runs::open(settings.disk.clone(), &dir.join(RUNS_DIR))?;
        let held_by_runs = runs.journal_below();
        let mut shards: Vec<Shard> = (0..SHARDS).map(|_| Shard::default()).collect();
        let mut replay = |seq: u64, batch: &[u8]| {
            let Some((_, records)) = decode_batch(batch) else {
                tracing::warn!(batch = seq, "unreadable state batch ignored");
                return;
            };
            for (key, expires_ms, value) in records {
                let entry = Entry {
                    value: Value::new(value),
                    expires_ms,
                    batch: Some(seq),
                };
                shards[shard_of(&key)].map.insert(key, entry);
            }
        };
        let mut next_seq = held_by_runs;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = legacy.page(after.as_deref(), 256)?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            for (key, value) in page {
                let Some(seq) = decode_seq(&key) else {
                    continue;
                };
                if seq < held_by_runs {
                    // Its records are in a run; the flush that wrote it did not get to
                    // delete the batch.
                    legacy.remove(&key)?;
                    continue;
                }
                next_seq = seq + 1;
                replay(seq, &value);
            }
        }
        let journal_dir = dir.join(JOURNAL_DIR);
        let disk = settings.disk.clone();
        let (mut wal, highest) = Wal::open(
            disk,
            &journal_dir,
            settings.segment_bytes,
            held_by_runs,
            |seq, batch| {
                // Batches a run holds are left for the run (see `a_batch_a_run_holds…`).
                if seq >= held_by_runs {
                    replay(seq, batch);
                }
            },
        )?;
        wal.forget_below(held_by_runs)?;
        let next_seq = highest.map_or(next_seq, |h| next_seq.max(h + 1));
        let held = shards.iter().map(|s| s.map.len()).sum();
        let shared = Arc::new(Shared {
            shards: shards.into_iter().map(Mutex::new).collect(),
            open: Mutex::new(Open::new(next_seq)),
            wake: Condvar::new(),
            writer: Mutex::new(Writer {
                wal,
                pending: Vec::new(),
            }),
            journal_dir,
            spares: AtomicU64::new(0),
            legacy,
            runs,
            settings,
            held: AtomicUsize::new(held),
            asked: Mutex::new(Asked::default()),
            flushing: Mutex::new(()),
            merging: Mutex::new(()),
            asked_wake: Condvar::new(),
            stop: AtomicBool::new(false),
            failing: AtomicBool::new(false),
            flush_failing: AtomicBool::new(false),
            #[cfg(test)]
            flush_passes: AtomicU64::new(0),
            progress: watch::Sender::new(Progress {
                durable_below: next_seq,
                failed_below: 0,
            }),
        });
        shared.forget_expired(now_ms);
        shared.make_replay_durable()?;
        let mut threads = Vec::new();
        // Without them the caller does their work (see `Settings::background`).
        let wanted = if shared.settings.background { 3 } else { 0 };
        for (name, work) in [
            ("state-journal", write_loop as fn(&Shared)),
            ("state-flush", flush_loop),
            ("state-merge", merge_loop),
        ]
        .into_iter()
        .take(wanted)
        {
            threads.push(spawn_watched(name, &shared, work)?);
        }
        shared.ask_flush_if_full();
        shared.ask(|a| {
            a.merge = true;
            a.spare = true;
        });
        Ok(Arc::new(Self { shared, threads }))
    }

    /// The value of `key`, if any (expired values stay until a sweep; callers judge them).
    pub fn get(&self, key: &Digest) -> Result<Option<Vec<u8>>, Error> {
        let key = *key;
        let mut shard = self.shared.shard(&key);
        if let Some(entry) = shard.map.get(&key) {
            return Ok(Some(entry.value.as_slice().to_vec()));
        }
        // After the hot set: a flush registers its run before it forgets the entries. Read
        // under the shard lock, as `modify` does, so no write of the key comes between the
        // read and the answer it leaves in `looked_up`.
        let record = on_disk(&mut shard.looked_up, &key, &self.shared.runs)?;
        Ok(record.map(|r| r.value.clone()))
    }

    /// Whether reading `key` now would read a run page: the hot set lacks it, no answer for
    /// it is remembered, and a run's filter says it may hold it.
    pub fn may_read_disk(&self, key: &Digest) -> bool {
        let key = *key;
        {
            let shard = self.shared.shard(&key);
            if shard.map.contains_key(&key) || shard.looked_up.iter().any(|(k, _)| *k == key) {
                return false;
            }
        }
        self.shared
            .runs
            .snapshot()
            .iter()
            .any(|run| run.may_contain(&key))
    }

    /// Sets `key` durably.
    pub fn put(
        &self,
        key: &Digest,
        value: &[u8],
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<(), Error> {
        self.modify(key, now_ms, |_| {
            (
                Change::Put {
                    value,
                    expires_ms,
                    durable: true,
                },
                (),
            )
        })
    }

    /// Reads and changes `key` atomically: `decide` sees the current value and says what
    /// to do; its second result is returned.
    pub fn modify<'v, R>(
        &self,
        key: &Digest,
        now_ms: i64,
        decide: impl FnOnce(Option<&[u8]>) -> (Change<'v>, R),
    ) -> Result<R, Error> {
        let key = *key;
        let mut shard = self.shared.shard(&key);
        let Shard { map, looked_up } = &mut *shard;
        // One probe of the table for the read and the write.
        let slot = map.entry(key);
        // A key the hot set lacks is read from the runs under the shard lock, so a
        // concurrent claim of the same key waits for this one's decision.
        let on_disk = match &slot {
            MapEntry::Occupied(_) => None,
            MapEntry::Vacant(_) => on_disk(looked_up, &key, &self.shared.runs)?,
        };
        let (current, current_expires) = match (&slot, on_disk) {
            (MapEntry::Occupied(found), _) => {
                let e = found.get();
                (Some(e.value.as_slice()), e.expires_ms)
            }
            (MapEntry::Vacant(_), Some(record)) => (Some(&record.value[..]), record.expires_ms),
            (MapEntry::Vacant(_), None) => (None, i64::MIN),
        };
        let (change, result) = decide(current);
        let Change::Put {
            value,
            expires_ms,
            durable,
        } = change
        else {
            return Ok(result);
        };
        if matches!(slot, MapEntry::Vacant(_)) && self.shared.refuses_new_keys() {
            return Err(Error::Unwritable(
                "state runs cannot be written and the hot set is full".into(),
            ));
        }
        // Never earlier than the record it supersedes (see the module's last paragraph).
        let expires_ms = expires_ms.max(current_expires);
        let value = Value::new(value);
        let batch = durable.then(|| {
            let mut open = self.shared.lock_open();
            let was_empty = open.buf.len() == EMPTY_BATCH;
            let seq = open.append(&key, expires_ms, value.as_slice(), now_ms);
            // The writer sleeps while there is nothing to write: wake it for the first
            // record of a batch (it takes the batch as soon as its last flush ends).
            if was_empty {
                self.shared.wake.notify_one();
            }
            seq
        });
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
                looked_up.retain(|(k, _)| *k != key);
                drop(shard);
                self.shared.held.fetch_add(1, Ordering::Relaxed);
                self.shared.ask_flush_if_full();
            }
        }
        Ok(result)
    }

    /// Forgets `key` if its value is memory-only and `forget` says so. Durable values are
    /// only forgotten by expiry: a removed one would come back on replay.
    pub fn forget_volatile_if(&self, key: &Digest, forget: impl FnOnce(&[u8]) -> bool) {
        let key = *key;
        let mut shard = self.shared.shard(&key);
        if shard
            .map
            .get(&key)
            .is_some_and(|e| e.batch.is_none() && forget(e.value.as_slice()))
        {
            shard.map.remove(&key);
            self.shared.held.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Entries in the hot set.
    pub fn hot_len(&self) -> usize {
        self.shared.held.load(Ordering::Relaxed)
    }

    /// Records in the hot set and on disk (superseded and expired ones on disk included
    /// until a merge drops them).
    pub fn len(&self) -> usize {
        self.hot_len() + self.shared.runs.entries() as usize
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory the runs' filters and indexes hold.
    pub fn runs_memory_bytes(&self) -> usize {
        self.shared.runs.memory_bytes()
    }

    /// Number of runs on disk.
    pub fn runs(&self) -> usize {
        self.shared.runs.snapshot().len()
    }

    /// Forgets hot values that expired by `now_ms` and asks the merge thread to delete
    /// expired runs. Returns how many hot values went.
    pub fn sweep(&self, now_ms: i64) -> Result<usize, Error> {
        let removed = self.shared.forget_expired(now_ms);
        // Also retries batches a failed write left while no new records woke the writer.
        self.shared.write_now()?;
        self.shared.ask(|a| a.merge = true);
        Ok(removed)
    }

    /// Writes every appended record to the journal and syncs it now (shutdown, tests).
    pub fn write_now(&self) -> Result<(), Error> {
        self.shared.write_now()
    }

    /// Writes the hot set's durable entries as a run now, as the flush thread does when the
    /// hot set is full (tests and the dedup benchmark).
    pub fn flush_to_run(&self) -> Result<(), Error> {
        self.shared.write_now()?;
        self.shared.flush_to_run().map(|_| ())
    }

    /// Does every merge and deletion that is due now (tests and the dedup benchmark).
    pub fn merge_now(&self) -> Result<(), Error> {
        self.shared.merge_due()
    }

    /// Prepares the journal's next segment if it has none, as the flush thread does (tests).
    pub fn prepare_spare(&self) -> Result<(), Error> {
        self.shared.prepare_spare()
    }

    /// The point everything appended so far ends at: once it is durable, so is every
    /// change made before this call (and every value read before it).
    pub fn sync_point(&self) -> SyncPoint {
        let open = self.shared.lock_open();
        let has_records = open.buf.len() > EMPTY_BATCH;
        SyncPoint(open.seq + u64::from(has_records))
    }

    /// The point the current records of `keys` end at: an answer that rests on these keys
    /// alone (a duplicate's mark) waits for this, not for [`Journal::sync_point`], so a mark
    /// on disk long ago is not held up by other requests' open batch. A key the hot set
    /// does not hold is in a run, on disk; a memory-only value (a claim) waits for nothing.
    /// Read after the decision it serves: a key's batch only grows while the hot set holds
    /// it, so the point is never below that of the record the decision saw.
    pub fn point_of(&self, keys: &[&Digest]) -> SyncPoint {
        let batch_end = |key: &&Digest| {
            let key = **key;
            let shard = self.shared.shard(&key);
            shard
                .map
                .get(&key)
                .and_then(|e| e.batch)
                .map_or(0, |b| b + 1)
        };
        SyncPoint(keys.iter().map(batch_end).max().unwrap_or(0))
    }

    /// Waits until everything before `point` is on disk (the writer's group commit), at
    /// most `wait`. An error if the write or the flush that covered it failed, or if it
    /// took longer: the caller must not answer 200 then.
    pub async fn durable(&self, point: SyncPoint, wait: Duration) -> Result<(), Error> {
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
            Ok(Ok(_)) => Err(Error::Unwritable(
                "state journal cannot be written to disk".into(),
            )),
            Ok(Err(_)) => Err(Error::Stopped("state journal writer stopped".into())),
            Err(_) => Err(Error::NotDurable(format!(
                "state journal not on disk within {wait:?}"
            ))),
        }
    }

    /// Whether the last write to the journal failed, or the hot set refuses new keys
    /// because runs cannot be written.
    pub fn is_failing(&self) -> bool {
        self.shared.failing.load(Ordering::SeqCst) || self.shared.refuses_new_keys()
    }

    /// Legacy batches left: those of a store written before the journal had files (for
    /// tests).
    pub fn legacy_batches(&self) -> usize {
        self.shared.legacy.len()
    }

    /// The journal's segment files (for tests).
    pub fn journal_segments(&self) -> usize {
        lock(&self.shared.writer).wal.segments()
    }
}

impl Shared {
    fn shard(&self, key: &Digest) -> MutexGuard<'_, Shard> {
        lock(&self.shards[shard_of(key)])
    }

    fn lock_open(&self) -> MutexGuard<'_, Open> {
        lock(&self.open)
    }

    /// Sets a task for the background threads and wakes them.
    fn ask(&self, task: impl FnOnce(&mut Asked)) {
        task(&mut lock(&self.asked));
        self.asked_wake.notify_all();
    }

    /// Whether the hot set refuses new keys: runs or the journal cannot be written (a run
    /// holds only what the journal holds, so either stops the flushes) and it holds
    /// [`HOT_SET_LIMIT_FACTOR`] times `hot_entries`. A flush that only falls behind never
    /// refuses: it catches up.
    fn refuses_new_keys(&self) -> bool {
        (self.flush_failing.load(Ordering::Relaxed) || self.failing.load(Ordering::Relaxed))
            && self.held.load(Ordering::Relaxed)
                >= self
                    .settings
                    .hot_entries
                    .saturating_mul(HOT_SET_LIMIT_FACTOR)
    }

    fn ask_flush_if_full(&self) {
        if self.held.load(Ordering::Relaxed) >= self.settings.hot_entries {
            let mut asked = lock(&self.asked);
            if !asked.flush {
                asked.flush = true;
                self.asked_wake.notify_all();
            }
        }
    }

    fn write_now(&self) -> Result<(), Error> {
        let mut writer = lock(&self.writer);
        self.write_open(&mut writer)
    }

    /// Writes the open batch (and any earlier one a failed write left) and syncs it; the
    /// caller holds `writer`.
    fn write_open(&self, writer: &mut Writer) -> Result<(), Error> {
        // The next batch's buffer is allocated before the lock requests wait for.
        let mut next = Open::new(0);
        let taken = {
            let mut open = self.lock_open();
            (open.buf.len() > EMPTY_BATCH).then(|| {
                next.seq = open.seq + 1;
                std::mem::replace(&mut *open, next)
            })
        };
        let Writer { wal, pending } = writer;
        pending.extend(taken);
        if let Some(last) = pending.last() {
            let written_below = last.seq + 1;
            let mut frames: Vec<Frame<'_>> = pending
                .iter_mut()
                .map(|batch| Frame {
                    seq: batch.seq,
                    bytes: &mut batch.buf,
                })
                .collect();
            if let Err(error) = wal.commit(&mut frames) {
                return Err(self.failed(error, written_below));
            }
            pending.clear();
            self.progress
                .send_modify(|p| p.durable_below = p.durable_below.max(written_below));
        }
        if self.failing.swap(false, Ordering::SeqCst) {
            tracing::info!("state journal written again");
        }
        if wal.wants_spare() {
            let mut asked = lock(&self.asked);
            if !asked.spare {
                asked.spare = true;
                self.asked_wake.notify_all();
            }
        }
        Ok(())
    }

    /// Prepares the journal's next segment, so that the writer does not fill one while
    /// requests wait for it.
    fn prepare_spare(&self) -> Result<(), Error> {
        if !lock(&self.writer).wal.wants_spare() {
            return Ok(());
        }
        let name = format!("spare-{}", self.spares.fetch_add(1, Ordering::Relaxed));
        let spare = Wal::prepare_spare(
            &*self.settings.disk,
            &self.journal_dir,
            self.settings.segment_bytes,
            &name,
        )?;
        lock(&self.writer).wal.adopt_spare(spare)
    }

    /// Records a failed write or flush of the batches below `attempted_below`: their
    /// waiters learn it at once, readiness reports it, the log says it once.
    fn failed(&self, error: Error, attempted_below: u64) -> Error {
        if !self.failing.swap(true, Ordering::SeqCst) {
            tracing::error!(%error, "state journal cannot be written; retrying");
        }
        self.progress
            .send_modify(|p| p.failed_below = p.failed_below.max(attempted_below));
        error
    }

    /// Forgets hot values that expired by `now_ms`, one shard at a time.
    fn forget_expired(&self, now_ms: i64) -> usize {
        let mut removed = 0;
        for shard in &self.shards {
            let shard = &mut lock(shard).map;
            let before = shard.len();
            shard.retain(|_, e| e.expires_ms > now_ms);
            removed += before - shard.len();
        }
        self.held.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Writes what the open replayed from the journal to a run before anything is answered
    /// from it. A batch whose `fdatasync` failed still reads back from the page cache after a
    /// clean restart, yet a power cut loses it (Linux marks such pages clean), and a request
    /// answered from its values would then rest on nothing. The run is synced; the segments
    /// below it are no longer read. Without room for the run the store does not open, as it
    /// does not without room for its next segment.
    fn make_replay_durable(&self) -> Result<(), Error> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        self.flush_to_run().map(drop)
    }

    /// Writes the hot entries whose records are on disk in the journal as a run, then
    /// forgets them and deletes the journal batches the run holds. Returns how many went.
    fn flush_to_run(&self) -> Result<usize, Error> {
        let _flushing = lock(&self.flushing);
        let below = self.progress.borrow().durable_below;
        let in_run = |e: &Entry| e.batch.is_some_and(|b| b < below);
        // One buffer of values and a small fixed entry per record: the copy costs about a
        // third of what the hot set's own entries do, and two allocations.
        let mut entries: Vec<(Digest, i64, u32, u32)> = Vec::new();
        let mut values: Vec<u8> = Vec::new();
        for shard in &self.shards {
            let shard = lock(shard);
            for (key, e) in shard.map.iter().filter(|(_, e)| in_run(e)) {
                let value = e.value.as_slice();
                entries.push((*key, e.expires_ms, values.len() as u32, value.len() as u32));
                values.extend_from_slice(value);
            }
        }
        if entries.is_empty() {
            return Ok(0);
        }
        entries.sort_unstable_by_key(|e| e.0 .0);
        let rewrite_after_ms = (self.settings.clock)().saturating_add(self.settings.ttl_ms());
        let records = entries.iter().map(|(key, expires_ms, at, len)| {
            let at = *at as usize;
            (key, *expires_ms, &values[at..at + *len as usize])
        });
        self.runs
            .flush(entries.len() as u64, records, below, rewrite_after_ms)?;
        let written = entries.len();
        drop((entries, values));
        // The run is registered: lookups find these values there from now on. An entry
        // changed since it was copied has a newer batch and stays. A map that grew while
        // the flush thread fell behind gives its room back, so the hot set's memory follows
        // `hot_entries`, not the largest burst.
        let room = (self.settings.hot_entries.saturating_mul(2) / SHARDS).max(16);
        let mut forgotten = 0;
        for shard in &self.shards {
            let shard = &mut lock(shard).map;
            let before = shard.len();
            shard.retain(|_, e| !in_run(e));
            forgotten += before - shard.len();
            if shard.capacity() > 2 * room {
                shard.shrink_to(room);
            }
        }
        self.held.fetch_sub(forgotten, Ordering::Relaxed);
        lock(&self.writer).wal.forget_below(below)?;
        let mut after: Option<Vec<u8>> = None;
        'pages: loop {
            let page = self.legacy.page(after.as_deref(), 256)?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            for (key, _) in page {
                if decode_seq(&key).is_some_and(|seq| seq >= below) {
                    break 'pages;
                }
                self.legacy.remove(&key)?;
            }
        }
        self.ask(|a| a.merge = true);
        Ok(written)
    }

    /// Deletes expired runs, then merges until nothing is due.
    fn merge_due(&self) -> Result<(), Error> {
        let _merging = lock(&self.merging);
        if self.stopping() {
            return Ok(());
        }
        let ttl_ms = self.settings.ttl_ms();
        self.runs.drop_expired((self.settings.clock)())?;
        while !self.stopping()
            && self
                .runs
                .merge_one((self.settings.clock)(), ttl_ms, &|| self.stopping())?
        {}
        Ok(())
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Waits `pause`, or less if the journal stops meanwhile.
    fn pause(&self, pause: Duration) {
        let until = Instant::now() + pause;
        let mut asked = lock(&self.asked);
        while !self.stopping() {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                return;
            };
            asked = self
                .asked_wake
                .wait_timeout(asked, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Waits until `take` finds work (it clears what it takes), or the journal stops.
    fn wait_for_task<T>(&self, take: impl Fn(&mut Asked) -> Option<T>) -> Option<T> {
        let mut asked = lock(&self.asked);
        loop {
            if self.stopping() {
                return None;
            }
            if let Some(task) = take(&mut asked) {
                return Some(task);
            }
            asked = self
                .asked_wake
                .wait(asked)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        {
            // Set under the locks the threads check it under, so no wake-up is missed.
            let _open = self.shared.lock_open();
            let _asked = lock(&self.shared.asked);
            self.shared.stop.store(true, Ordering::SeqCst);
            self.shared.wake.notify_all();
            self.shared.asked_wake.notify_all();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        if let Err(error) = self.shared.write_now() {
            tracing::error!(%error, "state journal not written at shutdown");
        }
    }
}

/// Starts a thread of the journal. Should it end before the journal is dropped (a panic),
/// the process is marked as needing a restart: the journal cannot work without it.
fn spawn_watched(
    name: &'static str,
    shared: &Arc<Shared>,
    work: fn(&Shared),
) -> Result<JoinHandle<()>, Error> {
    /// Reports the thread's end when dropped, by a return or by unwinding.
    struct Watch(Arc<Shared>, &'static str);
    impl Drop for Watch {
        fn drop(&mut self) {
            if !self.0.stopping() {
                (self.0.settings.needs_restart)(format!(
                    "the state store's {} thread ended",
                    self.1
                ));
            }
        }
    }
    let watch = Watch(shared.clone(), name);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || work(&watch.0))
        .map_err(|e| Error::Stopped(format!("cannot start {name}: {e}")))
}

/// The writer thread: sleeps while nothing was appended; otherwise writes and syncs
/// everything appended so far at once, and starts again as soon as that sync ends and the
/// commit interval has passed since the last one started (records that arrive meanwhile
/// share the next commit). Ends when the journal is dropped.
fn write_loop(shared: &Shared) {
    let interval = shared.settings.commit_interval;
    let mut last_start: Option<Instant> = None;
    while !shared.stopping() {
        {
            let mut open = shared.lock_open();
            while open.buf.len() == EMPTY_BATCH && !shared.stopping() {
                open = shared
                    .wake
                    .wait(open)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
        if let Some(pause) =
            last_start.and_then(|s| (s + interval).checked_duration_since(Instant::now()))
        {
            std::thread::sleep(pause);
        }
        last_start = Some(Instant::now());
        // A failure is logged (once), reported to the waiters, and retried by the next round.
        if shared.write_now().is_err() {
            std::thread::sleep(RETRY_PAUSE);
        }
    }
}

/// Lets the calling thread yield the CPU to the request threads.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    if let Err(error) =
        rustix::process::setpriority_process(Some(rustix::thread::gettid()), BACKGROUND_NICE)
    {
        tracing::debug!(%error, "background thread keeps its priority");
    }
}

/// The flush thread: prepares the journal's next segment when its spare was used, and
/// writes a run whenever the hot set is full.
fn flush_loop(shared: &Shared) {
    lower_priority();
    let take = |a: &mut Asked| {
        let (spare, flush) = (std::mem::take(&mut a.spare), std::mem::take(&mut a.flush));
        (spare || flush).then_some((spare, flush))
    };
    while let Some((spare, flush)) = shared.wait_for_task(take) {
        if spare {
            if let Err(error) = shared.prepare_spare() {
                // The writer makes its next segment itself then.
                tracing::warn!(%error, "state journal segment not prepared");
            }
        }
        if flush {
            #[cfg(test)]
            shared.flush_passes.fetch_add(1, Ordering::SeqCst);
            let flushed = shared.flush_to_run();
            let failed_before = shared
                .flush_failing
                .swap(flushed.is_err(), Ordering::Relaxed);
            match flushed {
                Err(error) => {
                    // Said once; the retries and their recovery are logged below ERROR.
                    if failed_before {
                        tracing::debug!(%error, "state run still not written");
                    } else {
                        tracing::error!(%error, "state run not written; the hot set keeps it and retries every second");
                    }
                    shared.pause(BACKGROUND_RETRY);
                }
                Ok(written) => {
                    if failed_before {
                        tracing::info!("state runs written again");
                    }
                    // Nothing in the full hot set is on disk yet (the journal cannot be
                    // written, or has not caught up): looking again at once would lock
                    // every map in a loop.
                    if written == 0 {
                        shared.pause(NOTHING_TO_FLUSH_PAUSE);
                    }
                }
            }
            shared.ask_flush_if_full();
        }
    }
}

/// The merge thread: merges and deletes runs after each flush and sweep.
fn merge_loop(shared: &Shared) {
    lower_priority();
    let mut retry = BACKGROUND_RETRY;
    while shared
        .wait_for_task(|a| std::mem::take(&mut a.merge).then_some(()))
        .is_some()
    {
        match shared.merge_due() {
            Ok(()) => retry = BACKGROUND_RETRY,
            Err(_) if shared.stopping() => return,
            Err(error) => {
                tracing::error!(%error, retry_in = ?retry, "state runs not merged; retrying");
                shared.pause(retry);
                retry = next_retry(retry);
                shared.ask(|a| a.merge = true);
            }
        }
    }
}

/// The wait before the next try of a merge that failed again after waiting `last`. A run
/// that cannot be read fails every merge that takes it in, and each try reads it up to the
/// damage: doubling the wait spares the disk and the log, and a merge that succeeds resets
/// it.
fn next_retry(last: Duration) -> Duration {
    last.saturating_mul(2).min(BACKGROUND_RETRY_MAX)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The runs' record of `key`, which the hot set lacks: remembered in `looked_up`, or read
/// and remembered there. The caller holds the key's shard lock.
fn on_disk<'a>(
    looked_up: &'a mut Vec<(Digest, Option<Record>)>,
    key: &Digest,
    runs: &Runs,
) -> Result<Option<&'a Record>, Error> {
    let at = match looked_up.iter().position(|(k, _)| k == key) {
        Some(at) => at,
        None => {
            let record = runs.get(key)?;
            if looked_up.len() == LOOKUPS_KEPT {
                looked_up.remove(0);
            }
            looked_up.push((*key, record));
            looked_up.len() - 1
        }
    };
    Ok(looked_up[at].1.as_ref())
}

fn shard_of(key: &Digest) -> usize {
    usize::from(u16::from_le_bytes([key.0[0], key.0[1]])) % SHARDS
}

impl Open {
    fn new(seq: u64) -> Self {
        // Room for a full batch up front: growing the buffer record by record copied it
        // again and again on the request path.
        let mut buf = Vec::with_capacity(BATCH_CAPACITY);
        buf.resize(EMPTY_BATCH, 0);
        Self { seq, buf }
    }

    /// Appends a record and returns the batch's sequence number.
    fn append(&mut self, key: &Digest, expires_ms: i64, value: &[u8], now_ms: i64) -> u64 {
        let buf = &mut self.buf;
        let header = FRAME_HEAD;
        if buf.len() == EMPTY_BATCH {
            buf[header..header + 8].copy_from_slice(&now_ms.to_le_bytes());
        }
        buf.extend_from_slice(&key.0);
        buf.extend_from_slice(&expires_ms.to_le_bytes());
        buf.extend_from_slice(&(value.len() as u32).to_le_bytes());
        buf.extend_from_slice(value);
        let at = header + 8;
        let count = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) + 1;
        buf[at..at + 4].copy_from_slice(&count.to_le_bytes());
        self.seq
    }
}

fn decode_seq(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

type BatchRecord<'a> = (Digest, i64, &'a [u8]);

/// A batch's creation time and records; `None` if it is cut short or malformed.
fn decode_batch(bytes: &[u8]) -> Option<(i64, Vec<BatchRecord<'_>>)> {
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
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::AtomicI64;

    const DAY: Duration = Duration::from_secs(86_400);

    /// Legacy batches in memory, as a store written before the journal had files holds them.
    #[derive(Default)]
    pub(crate) struct MemTree(Mutex<std::collections::BTreeMap<Vec<u8>, Vec<u8>>>);

    impl MemTree {
        pub(crate) fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), Error> {
            lock(&self.0).insert(key.to_vec(), value.to_vec());
            Ok(())
        }
    }

    impl LegacyBatches for MemTree {
        fn page(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<crate::Entry>, Error> {
            let map = lock(&self.0);
            let from = after.map_or(std::ops::Bound::Unbounded, |k| {
                std::ops::Bound::Excluded(k.to_vec())
            });
            let page = map.range((from, std::ops::Bound::Unbounded)).take(limit);
            Ok(page.map(|(k, v)| (k.clone(), v.clone())).collect())
        }
        fn remove(&self, key: &[u8]) -> Result<(), Error> {
            lock(&self.0).remove(key);
            Ok(())
        }
        fn len(&self) -> usize {
            lock(&self.0).len()
        }
    }

    /// The store folder beside the journal's: only its legacy batches matter here.
    #[derive(Default)]
    pub(crate) struct MemStore(Arc<MemTree>);

    impl MemStore {
        pub(crate) fn tree(&self, _name: &str) -> Result<Arc<MemTree>, Error> {
            Ok(self.0.clone())
        }
    }

    fn temp_store() -> (tempfile::TempDir, MemStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        (dir, MemStore::default())
    }

    fn settings(hot_entries: usize, now: &Arc<AtomicI64>) -> Settings {
        let now = now.clone();
        Settings {
            hot_entries,
            ttl: DAY,
            clock: Arc::new(move || now.load(Ordering::SeqCst)),
            segment_bytes: 1 << 20,
            commit_interval: Duration::from_millis(1),
            needs_restart: Arc::new(|_| {}),
            disk: disk_seam::real(),
            background: true,
        }
    }

    /// A journal whose background clock stands at `now_ms` and whose hot set is flushed
    /// only when asked.
    pub(crate) fn open_at(store: &MemStore, dir: &Path, now_ms: i64) -> Arc<Journal> {
        let now = Arc::new(AtomicI64::new(now_ms));
        open_with(store, dir, now_ms, settings(usize::MAX, &now))
    }

    /// A journal with `settings`, opened at `now_ms`.
    fn open_with(store: &MemStore, dir: &Path, now_ms: i64, settings: Settings) -> Arc<Journal> {
        Journal::open(store.tree("state").expect("tree"), dir, now_ms, settings).expect("open")
    }

    fn get(j: &Journal, key: &[u8]) -> Option<Vec<u8>> {
        j.get(&Digest::of(key)).expect("get")
    }

    fn put(j: &Journal, key: &[u8], value: &[u8], expires_ms: i64, now_ms: i64) {
        j.put(&Digest::of(key), value, expires_ms, now_ms)
            .expect("put");
    }

    #[test]
    fn values_survive_a_reopen_and_expired_ones_do_not() {
        let (dir, store) = temp_store();
        {
            let j = open_at(&store, dir.path(), 0);
            put(&j, b"a", b"1", 1_000, 0);
            put(&j, b"b", b"2", 100, 0);
            put(&j, b"a", b"3", 2_000, 10); // supersedes the first record of a
            j.modify(&Digest::of(b"c"), 10, |_| {
                (
                    Change::Put {
                        value: b"claim",
                        expires_ms: 5_000,
                        durable: false,
                    },
                    (),
                )
            })
            .expect("claim");
            assert_eq!(j.hot_len(), 3);
        }
        let j = open_at(&store, dir.path(), 500);
        assert_eq!(get(&j, b"a").as_deref(), Some(&b"3"[..]));
        assert_eq!(get(&j, b"b"), None, "expired before the reopen");
        assert_eq!(get(&j, b"c"), None, "claims are never written");
        assert_eq!(
            (j.hot_len(), j.runs()),
            (0, 1),
            "what the open replayed is in a run before it answers"
        );
    }

    #[test]
    fn a_flushed_hot_set_is_read_from_its_run_and_not_replayed() {
        let (dir, store) = temp_store();
        {
            let j = open_at(&store, dir.path(), 0);
            for i in 0..10u8 {
                put(&j, &[i], &[i, i], 1_000, 0);
            }
            j.flush_to_run().expect("flush");
            assert_eq!((j.hot_len(), j.runs(), j.journal_segments()), (0, 1, 1));
            for i in 0..10u8 {
                assert_eq!(get(&j, &[i]), Some(vec![i, i]), "key {i} from the run");
            }
            put(&j, &[10], b"hot", 1_000, 0);
            put(&j, &[0], b"newer", 1_000, 0);
        }
        let j = open_at(&store, dir.path(), 0);
        assert_eq!(
            (j.hot_len(), j.runs()),
            (0, 2),
            "the open wrote what it replayed to a run of its own"
        );
        assert_eq!(
            get(&j, &[0]).as_deref(),
            Some(&b"newer"[..]),
            "hot before disk"
        );
        assert_eq!(get(&j, &[5]), Some(vec![5, 5]));
        assert_eq!(get(&j, &[10]).as_deref(), Some(&b"hot"[..]));
        assert_eq!(j.len(), 12, "the run's ten and the hot two");
    }

    #[test]
    fn a_key_the_runs_answered_for_is_read_anew_once_a_newer_run_holds_it() {
        let (dir, store) = temp_store();
        let j = open_at(&store, dir.path(), 0);
        put(&j, b"old", b"v0", 1_000, 0);
        j.flush_to_run().expect("flush");
        // The runs' two kinds of answer, each remembered: a record, and none.
        assert_eq!(get(&j, b"old").as_deref(), Some(&b"v0"[..]));
        assert_eq!(get(&j, b"new"), None);
        put(&j, b"old", b"v1", 1_000, 1);
        put(&j, b"new", b"v1", 1_000, 1);
        // Through a run and out of the hot set: what the runs said before is stale now.
        j.flush_to_run().expect("flush");
        assert_eq!((j.hot_len(), j.runs()), (0, 2));
        assert_eq!(get(&j, b"old").as_deref(), Some(&b"v1"[..]));
        assert_eq!(get(&j, b"new").as_deref(), Some(&b"v1"[..]));
    }

    /// A batch as a store written before the journal had files holds it.
    fn legacy_batch(seq: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut open = Open::new(seq);
        open.append(&Digest::of(key), 1_000, value, 0);
        open.buf[FRAME_HEAD..].to_vec()
    }

    #[test]
    fn legacy_batches_are_replayed_then_moved_to_a_run() {
        let (dir, store) = temp_store();
        let tree = store.tree("state").expect("tree");
        tree.insert(&0u64.to_be_bytes(), &legacy_batch(0, b"a", b"1"))
            .expect("insert");
        tree.insert(&1u64.to_be_bytes(), &legacy_batch(1, b"b", b"2"))
            .expect("insert");
        {
            let j = open_at(&store, dir.path(), 0);
            assert_eq!(
                (get(&j, b"a"), get(&j, b"b")),
                (Some(b"1".to_vec()), Some(b"2".to_vec()))
            );
            assert_eq!(
                (j.legacy_batches(), j.hot_len(), j.runs()),
                (0, 0, 1),
                "the open moved them to a run"
            );
            put(&j, b"a", b"3", 1_000, 0);
            assert!(j.sync_point().0 > 1, "numbered after the legacy batches");
            j.flush_to_run().expect("flush");
        }
        let j = open_at(&store, dir.path(), 0);
        assert_eq!(get(&j, b"a").as_deref(), Some(&b"3"[..]));
        assert_eq!(get(&j, b"b").as_deref(), Some(&b"2"[..]));
    }

    #[test]
    fn a_batch_a_run_holds_is_not_replayed_over_the_run() {
        let (dir, store) = temp_store();
        {
            let j = open_at(&store, dir.path(), 0);
            put(&j, b"k", b"new", 1_000, 0);
            j.flush_to_run().expect("flush");
        }
        // As if the flush had written its run but not deleted the legacy batch it holds.
        let tree = store.tree("state").expect("tree");
        tree.insert(&0u64.to_be_bytes(), &legacy_batch(0, b"k", b"old"))
            .expect("insert");
        let j = open_at(&store, dir.path(), 0);
        assert_eq!(get(&j, b"k").as_deref(), Some(&b"new"[..]));
        assert_eq!((j.legacy_batches(), j.hot_len()), (0, 0), "deleted at open");
    }

    #[test]
    fn a_newer_record_keeps_the_later_expiry_of_the_one_it_supersedes() {
        let (dir, store) = temp_store();
        let j = open_at(&store, dir.path(), 0);
        put(&j, b"k", b"long", 9_000, 0);
        j.flush_to_run().expect("flush");
        put(&j, b"k", b"short", 500, 1);
        // Forgetting the newer record at 500 would bring "long" back from the run.
        assert_eq!(j.sweep(600).expect("sweep"), 0);
        assert_eq!(get(&j, b"k").as_deref(), Some(&b"short"[..]));
        j.flush_to_run().expect("flush");
        j.merge_now().expect("merge");
        assert_eq!(get(&j, b"k").as_deref(), Some(&b"short"[..]));
    }

    #[test]
    fn the_flush_thread_writes_a_run_once_the_hot_set_is_full() {
        let (dir, store) = temp_store();
        let now = Arc::new(AtomicI64::new(0));
        let j = open_with(&store, dir.path(), 0, settings(8, &now));
        for i in 0..20u8 {
            put(&j, &[i], b"v", 1_000, 0);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while j.runs() == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(j.runs() >= 1, "no run written");
        assert!(j.hot_len() < 20);
        for i in 0..20u8 {
            assert_eq!(get(&j, &[i]).as_deref(), Some(&b"v"[..]), "key {i}");
        }
    }

    #[tokio::test]
    async fn a_change_is_durable_once_the_group_commit_flushed_its_batch() {
        let (dir, store) = temp_store();
        let j = open_at(&store, dir.path(), 0);
        // Nothing appended: nothing to wait for.
        let idle = j.sync_point();
        j.durable(idle, Duration::from_secs(5))
            .await
            .expect("nothing pending");
        put(&j, b"a", b"1", 1_000, 0);
        let point = j.sync_point();
        assert!(point.0 > idle.0, "a change moves the point");
        j.durable(point, Duration::from_secs(5))
            .await
            .expect("flushed by the writer thread");
        assert!(j.shared.progress.borrow().durable_below >= point.0);
    }

    /// Waits, at most 30 s, until `condition` holds.
    fn wait_until(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn while_runs_cannot_be_written_the_hot_set_refuses_new_keys_past_four_times_its_size() {
        let (dir, store) = temp_store();
        let now = Arc::new(AtomicI64::new(0));
        let hot = 16;
        let j = open_with(&store, dir.path(), 0, settings(hot, &now));
        // A file where the runs' folder was: every run write fails.
        let runs = dir.path().join(RUNS_DIR);
        std::fs::remove_dir_all(&runs).expect("remove the runs' folder");
        std::fs::write(&runs, b"not a folder").expect("a file in its place");
        let key = |i: usize| format!("k{i}").into_bytes();
        let expires_ms = DAY.as_millis() as i64;
        for i in 0..hot {
            put(&j, &key(i), b"v", expires_ms, 0);
        }
        wait_until("a run write failed", || {
            j.shared.flush_failing.load(Ordering::Relaxed)
        });
        let mut taken = hot;
        let refused = loop {
            match j.put(&Digest::of(&key(taken)), b"v", expires_ms, 0) {
                Ok(()) => taken += 1,
                Err(error) => break error,
            }
            assert!(taken <= 100 * hot, "the hot set kept growing: {taken}");
        };
        assert_eq!(
            taken,
            HOT_SET_LIMIT_FACTOR * hot,
            "refused at {taken}: {refused}"
        );
        assert!(matches!(refused, Error::Unwritable(_)), "{refused:?}");
        assert!(j.is_failing(), "readiness reports it");
        // A key the hot set holds is still written.
        put(&j, &key(0), b"w", expires_ms, 0);
        assert_eq!(j.hot_len(), taken);

        std::fs::remove_file(&runs).expect("remove the file");
        std::fs::create_dir(&runs).expect("the runs' folder again");
        wait_until("runs are written again", || !j.is_failing());
        // New keys are taken again.
        put(&j, &key(taken), b"v", expires_ms, 0);
        assert_eq!(get(&j, b"k0").as_deref(), Some(&b"w"[..]));
    }

    #[test]
    fn while_the_journal_cannot_be_written_the_flush_thread_rests_and_the_hot_set_refuses_new_keys()
    {
        let (dir, store) = temp_store();
        let now = Arc::new(AtomicI64::new(0));
        let hot = 16;
        // Segments of a few batches: the journal soon needs a new one.
        let settings = Settings {
            segment_bytes: 512,
            ..settings(hot, &now)
        };
        let j = open_with(&store, dir.path(), 0, settings);
        // A file where the journal's folder was: no new segment can be made.
        let journal = dir.path().join(JOURNAL_DIR);
        // Moved aside, not deleted: the flush thread may be making a spare segment in it.
        std::fs::rename(&journal, dir.path().join("aside")).expect("move the journal's folder");
        std::fs::write(&journal, b"not a folder").expect("a file in its place");
        let key = |i: usize| format!("k{i}").into_bytes();
        let expires_ms = DAY.as_millis() as i64;
        let mut taken = 0;
        while !j.shared.failing.load(Ordering::SeqCst) {
            put(&j, &key(taken), b"v", expires_ms, 0);
            let _ = j.write_now();
            taken += 1;
            assert!(taken < 1_000, "the journal never failed");
        }
        // What reached the journal before it failed goes to a run; what follows cannot.
        j.shared.flush_to_run().expect("flush what is on disk");
        while j.hot_len() < hot {
            put(&j, &key(taken), b"v", expires_ms, 0);
            taken += 1;
        }
        // The hot set is full and nothing in it is on disk: the flush thread finds nothing
        // to write, and rests between its looks instead of locking every map again at once.
        wait_until("the flush thread looked", || {
            j.shared.flush_passes.load(Ordering::SeqCst) > 0
        });
        let before = j.shared.flush_passes.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(500));
        let passes = j.shared.flush_passes.load(Ordering::SeqCst) - before;
        assert!(
            passes <= 500 / NOTHING_TO_FLUSH_PAUSE.as_millis() as u64 + 2,
            "{passes} flush passes in 500 ms with nothing to flush"
        );
        let refused = loop {
            match j.put(&Digest::of(&key(taken)), b"v", expires_ms, 0) {
                Ok(()) => taken += 1,
                Err(error) => break error,
            }
            assert!(
                j.hot_len() <= 100 * hot,
                "the hot set kept growing: {taken}"
            );
        };
        assert_eq!(
            j.hot_len(),
            HOT_SET_LIMIT_FACTOR * hot,
            "refused at {}: {refused}",
            j.hot_len()
        );
        assert!(matches!(refused, Error::Unwritable(_)), "{refused:?}");
        assert!(j.is_failing(), "readiness reports it");
    }

    #[test]
    fn a_thread_of_the_journal_that_ends_before_it_is_dropped_marks_the_process_for_a_restart() {
        let (dir, store) = temp_store();
        let now = Arc::new(AtomicI64::new(0));
        let reason = Arc::new(Mutex::new(None));
        let kept = reason.clone();
        let watched = Settings {
            needs_restart: Arc::new(move |why| *lock(&kept) = Some(why)),
            ..settings(16, &now)
        };
        let j = open_with(&store, dir.path(), 0, watched);
        fn dies(_: &Shared) {
            panic!("a thread of the journal panics");
        }
        let thread = spawn_watched("state-test", &j.shared, dies).expect("spawn");
        assert!(thread.join().is_err(), "the thread panicked");
        assert_eq!(
            lock(&reason).as_deref(),
            Some("the state store's state-test thread ended")
        );
        // The journal's own threads end at its drop without marking anything.
        let quiet = Arc::new(Mutex::new(None::<String>));
        let marked = quiet.clone();
        let (j2_dir, j2_store) = temp_store();
        let j2 = open_with(
            &j2_store,
            j2_dir.path(),
            0,
            Settings {
                needs_restart: Arc::new(move |why| *lock(&marked) = Some(why)),
                ..settings(16, &now)
            },
        );
        drop(j2);
        assert_eq!(*lock(&quiet), None);
    }

    #[test]
    fn only_a_key_a_run_may_hold_that_is_neither_hot_nor_remembered_reads_the_disk() {
        let (dir, store) = temp_store();
        let j = open_at(&store, dir.path(), 0);
        put(&j, b"on disk", b"v", i64::MAX, 0);
        j.flush_to_run().expect("flush");
        put(&j, b"hot", b"v", i64::MAX, 0);
        assert!(!j.may_read_disk(&Digest::of(b"hot")));
        assert!(j.may_read_disk(&Digest::of(b"on disk")));
        assert_eq!(get(&j, b"on disk").as_deref(), Some(&b"v"[..]));
        assert!(
            !j.may_read_disk(&Digest::of(b"on disk")),
            "the runs' answer is remembered"
        );
    }

    #[tokio::test]
    async fn a_mark_on_disk_is_not_held_up_by_other_keys_open_batch() {
        let (dir, store) = temp_store();
        let now = Arc::new(AtomicI64::new(0));
        // After the first commit the writer starts the next one 2 s later at the earliest,
        // so `b` stays in the open batch for the rest of the test.
        let settings = Settings {
            commit_interval: Duration::from_secs(2),
            ..settings(usize::MAX, &now)
        };
        let j = open_with(&store, dir.path(), 0, settings);
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        put(&j, b"a", b"1", 1_000, 0);
        j.durable(j.sync_point(), Duration::from_secs(5))
            .await
            .expect("the first commit starts at once");
        put(&j, b"b", b"1", 1_000, 0);
        let soon = Duration::from_millis(1);
        j.durable(j.point_of(&[&a]), soon)
            .await
            .expect("a is on disk: its answer waits for no commit");
        assert!(
            j.durable(j.point_of(&[&a, &b]), soon).await.is_err(),
            "b is still in the open batch"
        );
        assert_eq!(j.point_of(&[&Digest::of(b"absent")]), SyncPoint(0));
    }

    #[tokio::test]
    async fn commits_start_no_more_often_than_the_interval() {
        let (dir, store) = temp_store();
        let now = Arc::new(AtomicI64::new(0));
        let interval = Duration::from_millis(300);
        let settings = Settings {
            commit_interval: interval,
            ..settings(usize::MAX, &now)
        };
        let j = open_with(&store, dir.path(), 0, settings);
        let wait = Duration::from_secs(5);
        // The first commit starts after this instant; the next one an interval after the
        // first started, at the earliest.
        let first_asked = Instant::now();
        put(&j, b"a", b"1", 1_000, 0);
        j.durable(j.sync_point(), wait).await.expect("first commit");
        put(&j, b"b", b"1", 1_000, 0);
        j.durable(j.sync_point(), wait)
            .await
            .expect("second commit");
        let between = first_asked.elapsed();
        assert!(
            between >= interval,
            "two commits {between:?} apart, closer than the {interval:?} interval"
        );
    }

    #[test]
    fn a_failing_merge_waits_twice_as_long_each_time_up_to_five_minutes() {
        let mut retry = BACKGROUND_RETRY;
        let mut waits = vec![retry.as_secs()];
        for _ in 0..10 {
            retry = next_retry(retry);
            waits.push(retry.as_secs());
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    }

    #[test]
    fn a_background_pause_ends_when_the_journal_closes() {
        let (dir, store) = temp_store();
        let j = open_at(&store, dir.path(), 0);
        let shared = j.shared.clone();
        let (ended, pause_ended) = std::sync::mpsc::channel();
        let pausing = std::thread::spawn(move || {
            shared.pause(Duration::from_secs(3600));
            let _ = ended.send(());
        });
        drop(j);
        // A bound only so that a pause that ignores the close fails instead of hanging.
        pause_ended
            .recv_timeout(Duration::from_secs(60))
            .expect("the pause ended when the journal closed");
        pausing.join().expect("pausing thread");
    }

    #[test]
    fn a_truncated_batch_is_skipped_not_fatal() {
        assert!(decode_batch(&[0; 5]).is_none());
        let mut open = Open::new(0);
        open.append(&Digest::of(b"key"), 7, b"value", 1);
        let full = &open.buf[FRAME_HEAD..];
        let (created, records) = decode_batch(full).expect("whole batch");
        assert_eq!((created, records.len()), (1, 1));
        assert!(decode_batch(&full[..full.len() - 1]).is_none());
    }

    /// Settings of a journal on the simulated `disk`, whose threads' work the test does.
    fn on_sim(disk: &disk_seam::sim::SimDisk, segment_bytes: u64) -> Settings {
        Settings {
            disk: disk.handle(),
            background: false,
            segment_bytes,
            ..settings(usize::MAX, &Arc::new(AtomicI64::new(0)))
        }
    }

    #[test]
    fn a_store_made_on_a_fresh_disk_keeps_its_runs_after_a_power_cut() {
        use disk_seam::sim::SimDisk;
        let (_dir, store) = temp_store();
        let disk = SimDisk::new(1);
        let dir = Path::new("/var/lib/hookgate");
        let j = open_with(&store, dir, 0, on_sim(&disk, 1 << 20));
        put(&j, b"stop", b"forever", i64::MAX, 0);
        // In a run, and out of the journal: the run is all that holds it.
        j.flush_to_run().expect("flush");
        assert_eq!((j.runs(), j.hot_len()), (1, 0));
        let disk = disk.crash();
        drop(j);
        let j = open_with(&store, dir, 0, on_sim(&disk, 1 << 20));
        assert_eq!(
            get(&j, b"stop").as_deref(),
            Some(&b"forever"[..]),
            "the run's folder was not synced into the store's, nor the store's into its parent"
        );
    }

    #[test]
    fn a_run_whose_folder_sync_failed_is_made_durable_before_a_restart_relies_on_it() {
        use disk_seam::sim::{Fault, OpKind, SimDisk};
        let (_dir, store) = temp_store();
        let disk = SimDisk::new(2);
        let dir = Path::new("/var/lib/hookgate");
        let j = open_with(&store, dir, 0, on_sim(&disk, 4096));
        put(&j, b"stop", b"forever", i64::MAX, 0);
        j.write_now().expect("commit");
        // The run is renamed into place, then its folder's sync fails: the flush fails and
        // the run's name is not durable.
        disk.fail_next_matching(
            OpKind::Sync,
            Fault::Io,
            "sync dir /var/lib/hookgate/state-runs",
        );
        assert!(j.flush_to_run().is_err());
        drop(j);
        // A clean restart finds the run and deletes the journal segments it holds.
        let j = open_with(&store, dir, 0, on_sim(&disk, 4096));
        assert_eq!(get(&j, b"stop").as_deref(), Some(&b"forever"[..]));
        let disk = disk.crash();
        drop(j);
        let j = open_with(&store, dir, 0, on_sim(&disk, 4096));
        assert_eq!(
            get(&j, b"stop").as_deref(),
            Some(&b"forever"[..]),
            "a power cut after the restart took the run back, and the segments were gone"
        );
    }

    #[test]
    fn a_batch_whose_sync_failed_and_that_a_clean_restart_read_back_outlives_a_power_cut() {
        use disk_seam::sim::{Fault, OpKind, SimDisk};
        let (_dir, store) = temp_store();
        let disk = SimDisk::new(3);
        let dir = Path::new("/var/lib/hookgate");
        let j = open_with(&store, dir, 0, on_sim(&disk, 4096));
        put(&j, b"first", b"kept", i64::MAX, 0);
        j.write_now().expect("commit");
        put(&j, b"stop", b"forever", i64::MAX, 0);
        // The commit's fdatasync fails, and so does the write when the journal closes: the
        // batch is in the page cache only, where a power cut loses it.
        disk.fail_next(OpKind::Sync, Fault::Io);
        assert!(j.write_now().is_err());
        disk.fail_next(OpKind::Sync, Fault::Io);
        drop(j);
        // A clean restart reads it back, and from then on answers from it.
        let j = open_with(&store, dir, 0, on_sim(&disk, 4096));
        assert_eq!(get(&j, b"stop").as_deref(), Some(&b"forever"[..]));
        put(&j, b"later", b"value", i64::MAX, 0);
        j.write_now().expect("commit");
        let disk = disk.crash();
        drop(j);
        let j = Journal::open(
            store.tree("state").expect("tree"),
            dir,
            0,
            on_sim(&disk, 4096),
        )
        .expect("the store opens after the power cut");
        assert_eq!(
            get(&j, b"stop").as_deref(),
            Some(&b"forever"[..]),
            "a value the restart answered from was lost at the power cut"
        );
        assert_eq!(get(&j, b"later").as_deref(), Some(&b"value"[..]));
    }
}
