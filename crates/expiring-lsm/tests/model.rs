//! The store's model-checked crash test: a seeded generator of operations on the journal and
//! its runs, on a simulated disk that loses what was not synced at a power cut and fails
//! writes, syncs, renames and removals on demand, checked after every step against a plain
//! in-memory model.
//!
//! Keys are digests the test makes, in two groups. Claimed keys take memory-only values
//! through a read-and-change ([`Journal::modify`], set only while the key holds nothing that
//! counts: a claim), durable puts that count for the dedup window (a done mark), and the
//! forgetting of a memory-only value that is still theirs ([`Journal::forget_volatile_if`]:
//! a release). Put keys take durable puts with short, long and unbounded lifetimes. The
//! generator also moves the clock across the lifetimes and `ttl` (when runs are rewritten);
//! commits, flushes to runs, merges, rewrites, sweeps and prepares segments; reopens cleanly;
//! restarts the process with no stop (the page cache stays, what a failed sync left in it
//! included); cuts the power at once or before a random later file operation (between any
//! two, a rename and an unlink included); and injects ENOSPC and EIO. The store runs without its threads:
//! every step is a call the seed chose.
//!
//! Damage steps, beside loss: a bit flipped in synced bytes of a run or a journal segment
//! (sparing the last synced frame of the newest segment and a segment's only frame, whose
//! damage reads as a commit a crash cut short: no check can tell them apart), a run's write
//! torn or misdirected though its sync succeeds, and unsynced writes reordered at the next
//! power cut. After damage the store may
//! refuse to open ([`expiring_lsm::Error::Damaged`], or the journal's refusal) or fail a read
//! with `Damaged`; it never answers a wrong value, nor nothing for a key whose value counts.
//! A refused open is repaired (the flipped bits restored, as an operator restores a backup)
//! and tried again; a seed whose damage cannot be repaired ends there.
//!
//! A durable write counts as acknowledged only once [`Journal::durable`] says its
//! [`Journal::sync_point`] is reached, as a caller answers only then: a gate that lets a
//! write through early loses it at the next power cut, and one that holds back a write a
//! successful commit covered fails the step.
//!
//! Every value the test writes carries its own end: like the store's callers, the test
//! counts a value past it as absent (expired values stay readable until a sweep or a merge
//! drops them). What is checked, for every key after every step: the value the store returns,
//! judged so, is the model's latest value. After a power cut or a reopen it is the latest
//! value a successful commit covered, or a later one, never an earlier one; the model then
//! takes what survived as its own and as durable: a value a clean restart reads back must
//! outlive the next power cut, even one a failed sync left only in the page cache.
//!
//! `EXPIRING_LSM_MODEL_SEED=<n>` replays one seed; `EXPIRING_LSM_MODEL_SEEDS=<n>` runs that
//! many (from `EXPIRING_LSM_MODEL_FIRST`, default 0); `EXPIRING_LSM_MODEL_SECONDS=<s>` runs
//! seeds from a random first one until the time is up. A failing seed prints itself and its
//! replay command.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use disk_seam::sim::{Fault, OpKind, Rng, SimDisk, WriteDamage};
use expiring_lsm::journal::{Change, Journal, Settings, SyncPoint, JOURNAL_DIR, RUNS_DIR};
use expiring_lsm::{Digest, Error, NoLegacy};

/// Seeds plain `cargo test` runs (about 5 s in a debug build, 30 s on two busy cores).
const CI_SEEDS: u64 = 250;
/// Steps of one seed.
const STEPS: usize = 400;
/// Keys that take claims, releases and puts for the dedup window.
const CLAIMED_KEYS: usize = 16;
/// Keys that take puts with short, long and unbounded lifetimes.
const PUT_KEYS: usize = 16;
/// A claim counts this long; the store may forget it after twice as long.
const LEASE_MS: i64 = 30_000;
/// `ttl`, the dedup window: done puts count this long, and a run is rewritten this long
/// after it was written.
const TTL_MS: i64 = 60_000;
/// Small, so that commits roll segments.
const SEGMENT_BYTES: u64 = 2048;
const STORE_DIR: &str = "/var/lib/store";
/// Failing seeds reported before the test stops.
const FAILURES_KEPT: usize = 5;
/// Steps in a thousand that damage the disk.
const DAMAGE_PER_MILLE: u64 = 8;
/// Bytes before a journal segment's first frame, and of a frame's head.
const SEGMENT_MAGIC: usize = 8;
const FRAME_HEAD: usize = 16;
/// How a failing seed is run again.
const REPLAY: &str = "cargo test -p expiring-lsm --test model";

/// A value as the test writes it: memory-only or durable, a number no other write has, and
/// the time from which it counts as absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Value {
    memory_only: bool,
    id: u64,
    counts_until: i64,
}

impl Value {
    /// A tag byte, then `id` and `counts_until` little-endian.
    fn encode(&self) -> [u8; 17] {
        let mut out = [0; 17];
        out[0] = if self.memory_only { 1 } else { 2 };
        out[1..9].copy_from_slice(&self.id.to_le_bytes());
        out[9..].copy_from_slice(&self.counts_until.to_le_bytes());
        out
    }

    /// [`Value::encode`]'s form; `None` for bytes no write of the test made.
    fn decode(bytes: &[u8]) -> Option<Self> {
        let memory_only = match (bytes.len(), bytes.first()) {
            (17, Some(1)) => true,
            (17, Some(2)) => false,
            _ => return None,
        };
        Some(Self {
            memory_only,
            id: u64::from_le_bytes(bytes[1..9].try_into().ok()?),
            counts_until: i64::from_le_bytes(bytes[9..].try_into().ok()?),
        })
    }
}

/// What the model knows of one key.
struct Model {
    name: String,
    digest: Digest,
    /// Values written durably, oldest first.
    history: Vec<Value>,
    /// How many of `history` a successful commit covered.
    acked: usize,
    /// A memory-only value over the last of `history`.
    claim: Option<Value>,
    /// A read after a restart failed on damage: what the key holds is not known until a
    /// write to it is acknowledged.
    unknown: bool,
}

/// Figures of a run of seeds.
#[derive(Default)]
struct Totals {
    seeds: u64,
    steps: u64,
    crashes: u64,
    reopens: u64,
    restarts: u64,
    faults: u64,
    file_ops: u64,
    damage: Damage,
}

/// Damage injected, and what the store made of it.
#[derive(Default, Clone, Copy)]
struct Damage {
    flips: u64,
    tears: u64,
    misdirects: u64,
    reorders: u64,
    /// Reads that failed with `Damaged`.
    damaged_reads: u64,
    /// Opens refused on damage, and repairs after them.
    refusals: u64,
    repairs: u64,
    /// Seeds that ended on damage no repair undid.
    ended: u64,
}

impl Damage {
    fn add(&mut self, other: &Damage) {
        self.flips += other.flips;
        self.tears += other.tears;
        self.misdirects += other.misdirects;
        self.reorders += other.reorders;
        self.damaged_reads += other.damaged_reads;
        self.refusals += other.refusals;
        self.repairs += other.repairs;
        self.ended += other.ended;
    }
}

/// One seed's world: the disk, the clock, the store and the model.
struct World {
    rng: Rng,
    disk: SimDisk,
    now: Arc<AtomicI64>,
    journal: Option<Arc<Journal>>,
    keys: Vec<Model>,
    /// The last id a value took.
    next_id: u64,
    /// The last steps, for a failure's message.
    log: Vec<String>,
    crashes: u64,
    reopens: u64,
    restarts: u64,
    /// Durable writes not yet through the gate: the key, how many of its history the
    /// write makes acknowledged, and its sync point.
    waiting: Vec<(usize, usize, SyncPoint)>,
    /// Whether the disk was damaged: only then may the store refuse to open or fail a read
    /// on damage.
    damage_seen: bool,
    damage: Damage,
    /// Why the store refused to open on damage no repair undid: the seed ends.
    refused: Option<String>,
}

type Checked = Result<(), String>;

impl World {
    fn new(seed: u64) -> Result<Self, String> {
        let claimed = (0..CLAIMED_KEYS).map(|i| Model::new(format!("claimed/{i}")));
        let put = (0..PUT_KEYS).map(|i| Model::new(format!("put/{i}")));
        let mut world = Self {
            rng: Rng::new(seed),
            disk: SimDisk::new(seed ^ 0x5eed),
            now: Arc::new(AtomicI64::new(1_700_000_000_000)),
            journal: None,
            keys: claimed.chain(put).collect(),
            next_id: 0,
            log: Vec::new(),
            crashes: 0,
            reopens: 0,
            restarts: 0,
            waiting: Vec::new(),
            damage_seen: false,
            damage: Damage::default(),
            refused: None,
        };
        world.open()?;
        Ok(world)
    }

    fn now(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    fn journal(&self) -> Result<&Arc<Journal>, String> {
        self.journal
            .as_ref()
            .ok_or_else(|| "no open journal".to_owned())
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn note(&mut self, step: usize, what: String) {
        if self.log.len() == 30 {
            self.log.remove(0);
        }
        self.log
            .push(format!("step {step} @{}: {what}", self.now()));
    }

    /// Opens the store on the disk as it is; a failure a fault explains is tried again,
    /// then with faults off; a store that does not open on a sound disk fails the test.
    fn open(&mut self) -> Checked {
        let mut last = String::new();
        let mut failed = 0;
        while failed < 4 {
            if failed == 3 {
                self.disk.clear_faults();
            }
            if self.disk.power_is_cut() {
                // A cut during the open: the open starts again after the restart.
                self.disk = self.disk.crash();
                self.crashes += 1;
            }
            let now = self.now.clone();
            let settings = Settings {
                hot_entries: usize::MAX,
                ttl: Duration::from_millis(TTL_MS as u64),
                clock: Arc::new(move || now.load(Ordering::SeqCst)),
                segment_bytes: SEGMENT_BYTES,
                commit_interval: Duration::ZERO,
                durable_wait: Duration::from_secs(5),
                disk: self.disk.handle(),
                background: false,
                page_reads: expiring_lsm::journal::read_here,
                needs_restart: Arc::new(|_| {}),
            };
            let legacy = Arc::new(NoLegacy);
            match Journal::open(legacy, Path::new(STORE_DIR), self.now(), settings) {
                // An open goes on without what a disk that takes no writes refused it, but
                // one the power went during is a process that died with it.
                Ok(_) if self.disk.power_is_cut() => {
                    last = "the power went during the open".into();
                }
                Ok(journal) => {
                    self.journal = Some(journal);
                    return Ok(());
                }
                Err(error) if self.disk.power_is_cut() => last = error.to_string(),
                Err(error) if self.damage_seen && refuses_damage(&error) => {
                    self.damage.refusals += 1;
                    if self.disk.repair_flips() == 0 {
                        self.refused = Some(error.to_string());
                        return Ok(());
                    }
                    self.damage.repairs += 1;
                }
                Err(error) => {
                    last = error.to_string();
                    failed += 1;
                }
            }
        }
        Err(format!("the store does not open on a sound disk: {last}"))
    }

    /// A power cut now (or the end of one that happened), then a restart.
    fn crash_and_reopen(&mut self) -> Checked {
        self.disk = self.disk.crash();
        // Dropped after the cut: its last write finds the disk gone, as a dead process would.
        self.journal = None;
        self.crashes += 1;
        self.open()?;
        self.resolve()
    }

    /// A clean stop and restart: what the last commit covered is there, and what a failed
    /// commit left may be.
    fn reopen(&mut self) -> Checked {
        let journal = self.journal()?.clone();
        if journal.write_now().is_ok() {
            self.committed(&journal, "the last commit")?;
        }
        drop(journal);
        self.journal = None;
        self.reopens += 1;
        if self.disk.power_is_cut() {
            return self.crash_and_reopen();
        }
        self.open()?;
        self.resolve()
    }

    /// A process restart with no clean stop and no power cut (a kill, or a restart a
    /// liveness probe asked for): the old process writes nothing more, the page cache stays,
    /// pages a failed sync left there included; a later power cut may still take those.
    fn restart(&mut self) -> Checked {
        if self.disk.power_is_cut() {
            return self.crash_and_reopen();
        }
        self.disk = self.disk.restart();
        self.journal = None;
        self.restarts += 1;
        self.open()?;
        self.resolve()
    }

    /// Acknowledges the durable writes whose sync point the gate says is on disk.
    fn pass_gate(&mut self, journal: &Journal) {
        let waiting = std::mem::take(&mut self.waiting);
        for (key, upto, point) in waiting {
            let through = self.through(journal, point);
            if !through {
                self.waiting.push((key, upto, point));
                continue;
            }
            let k = &mut self.keys[key];
            k.acked = k.acked.max(upto);
            k.unknown = false;
        }
    }

    /// Whether [`Journal::durable`] answers at once that `point` is on disk: polled once,
    /// as a commit that has not happened yet would keep it waiting.
    fn through(&self, journal: &Journal, point: SyncPoint) -> bool {
        let waited = std::pin::pin!(journal.durable(point));
        let mut context = Context::from_waker(Waker::noop());
        matches!(waited.poll(&mut context), Poll::Ready(Ok(())))
    }

    /// A commit succeeded: it covered every write made so far, and the gate lets every one
    /// of them through.
    fn committed(&mut self, journal: &Journal, what: &str) -> Checked {
        self.pass_gate(journal);
        match self.waiting.first() {
            None => Ok(()),
            Some((key, upto, point)) => Err(format!(
                "{what} succeeded, but the gate holds back write {} of {} (sync point {point:?})",
                upto - 1,
                self.keys[*key].name
            )),
        }
    }

    /// A failed read or write is allowed if it names damage the disk was given.
    fn allowed(&mut self, error: &Error) -> bool {
        let damaged = self.damage_seen && matches!(error, Error::Damaged { .. });
        self.damage.damaged_reads += u64::from(damaged);
        damaged
    }

    /// After a restart: each key holds the latest value a commit covered or a later one
    /// (counted as its callers would); the model takes it as its own.
    fn resolve(&mut self) -> Checked {
        if self.refused.is_some() {
            return Ok(());
        }
        let now = self.now();
        let journal = self.journal()?.clone();
        // Sync points are the old process's; what survived is judged below.
        self.waiting.clear();
        for i in 0..self.keys.len() {
            // Memory-only values never outlive the process.
            self.keys[i].claim = None;
            let read = match self.keys[i].read(&journal)? {
                Ok(read) => read,
                Err(error) if self.allowed(&error) => {
                    self.keys[i].unknown = true;
                    continue;
                }
                Err(error) => return Err(format!("read of {} failed: {error}", self.keys[i].name)),
            };
            let k = &mut self.keys[i];
            if k.unknown {
                continue;
            }
            let from = k.acked.saturating_sub(1);
            let exact =
                read.and_then(|r| (from..k.history.len()).rev().find(|&i| k.history[i] == r));
            if let Some(i) = exact {
                k.history.truncate(i + 1);
                // What reads back is durable: after a power cut it is what the disk kept;
                // after a clean restart the open wrote what it replayed to a synced run,
                // pages a failed sync left in the cache included.
                k.acked = i + 1;
                continue;
            }
            let absent_allowed = k.acked == 0
                || k.history[from..]
                    .iter()
                    .any(|v| counting(Some(*v), now).is_none());
            if counting(read, now).is_none() && absent_allowed {
                // Nothing that counts survived: only a new write makes the key count again.
                k.history.clear();
                k.acked = 0;
                continue;
            }
            let older = read.and_then(|r| k.history[..from].iter().rposition(|v| *v == r));
            return Err(format!(
                "after a restart {} reads {} ({}); the latest committed value is {} and {} were written after it",
                k.name,
                show(read),
                match older {
                    Some(i) => format!("write {i} of {}, superseded by a committed one", k.history.len()),
                    None => "no value the model allows".to_owned(),
                },
                show(k.history.get(from).copied().filter(|_| k.acked > 0)),
                k.history.len() - k.acked,
            ));
        }
        Ok(())
    }

    /// Every key reads as the model's latest value, counted as its callers count it.
    fn check(&mut self) -> Checked {
        let now = self.now();
        let journal = self.journal()?.clone();
        for i in 0..self.keys.len() {
            let read = match self.keys[i].read(&journal)? {
                Ok(read) => read,
                Err(error) if self.allowed(&error) => continue,
                Err(error) => return Err(format!("read of {} failed: {error}", self.keys[i].name)),
            };
            let k = &self.keys[i];
            if k.unknown {
                continue;
            }
            let expected = k.expected();
            if counting(read, now) != counting(expected, now) {
                return Err(format!(
                    "{} reads {}, the model holds {}",
                    k.name,
                    show(read),
                    show(expected)
                ));
            }
        }
        Ok(())
    }

    /// One random step.
    fn step(&mut self, step: usize) -> Checked {
        let now = self.now();
        let journal = self.journal()?.clone();
        if self.rng.below(1000) < DAMAGE_PER_MILLE {
            let what = self.damage();
            self.note(step, what);
            return Ok(());
        }
        let roll = self.rng.below(100);
        let claimed = self.rng.below(CLAIMED_KEYS as u64) as usize;
        let put = CLAIMED_KEYS + self.rng.below(PUT_KEYS as u64) as usize;
        let what = match roll {
            0..=14 => self.claim(&journal, claimed, now)?,
            15..=26 => self.put_for_ttl(&journal, claimed, now)?,
            27..=31 => self.release(&journal, claimed),
            32..=46 => self.put_with_lifetime(&journal, put, now)?,
            47..=58 => self.acked_if_ok(&journal, "commit", journal.write_now())?,
            59..=64 => self.acked_if_ok(&journal, "flush", journal.flush_to_run())?,
            65..=69 => format!("merge -> {}", ok(&journal.merge_now())),
            70..=73 => self.sweep(&journal, now)?,
            74..=75 => format!("spare -> {}", ok(&journal.prepare_spare())),
            76..=87 => self.advance_clock(),
            88 => {
                drop(journal);
                self.note(step, "clean reopen".into());
                return self.reopen();
            }
            89 => {
                drop(journal);
                self.note(step, "process restart".into());
                return self.restart();
            }
            90..=91 => {
                drop(journal);
                self.note(step, "power cut now".into());
                return self.crash_and_reopen();
            }
            92..=94 => self.cut_power_later(),
            95..=98 => self.fail_next_operation(),
            _ => self.fail_randomly(),
        };
        self.note(step, what);
        Ok(())
    }

    /// Claims key `key`: a memory-only value, set by a read-and-change only while the key
    /// holds nothing that counts; the store must answer as the model expects.
    fn claim(&mut self, journal: &Journal, key: usize, now: i64) -> Result<String, String> {
        let claim = Value {
            memory_only: true,
            id: self.new_id(),
            counts_until: now + LEASE_MS,
        };
        let bytes = claim.encode();
        let k = &self.keys[key];
        let expected = counting(k.expected(), now);
        let held = match journal.modify(&k.digest, now, |current| {
            match counting(current.and_then(Value::decode), now) {
                Some(held) => (Change::Keep, Some(held)),
                None => {
                    let change = Change::Put {
                        value: &bytes,
                        expires_ms: now + 2 * LEASE_MS,
                        durable: false,
                    };
                    (change, None)
                }
            }
        }) {
            Ok(held) => held,
            Err(error) if self.allowed(&error) => return Ok(format!("claim -> {error}")),
            Err(error) => return Err(format!("claim failed: {error}")),
        };
        let k = &mut self.keys[key];
        let what = match held {
            None => format!("claim {} -> claimed #{}", k.name, claim.id),
            Some(held) => format!("claim {} -> held by {}", k.name, show(Some(held))),
        };
        if held != expected && !k.unknown {
            return Err(format!(
                "{what}, the model expects it held by {}",
                show(expected)
            ));
        }
        if held.is_none() {
            k.claim = Some(claim);
        }
        Ok(what)
    }

    /// A durable put that counts for `ttl` (a done mark) of key `key`, sometimes with
    /// another claimed key in the same step.
    fn put_for_ttl(&mut self, journal: &Journal, key: usize, now: i64) -> Result<String, String> {
        let value = Value {
            memory_only: false,
            id: self.new_id(),
            counts_until: now + TTL_MS + self.rng.below(1000) as i64,
        };
        let two = self.rng.below(3) == 0;
        let other = self.rng.below(CLAIMED_KEYS as u64) as usize;
        let chosen: Vec<usize> = if two && other != key {
            vec![key, other]
        } else {
            vec![key]
        };
        for &i in &chosen {
            let digest = self.keys[i].digest;
            match journal.put(&digest, &value.encode(), value.counts_until, now) {
                Ok(()) => self.written(journal, i, value),
                Err(error) if self.allowed(&error) => {}
                Err(error) => return Err(format!("put of {} failed: {error}", self.keys[i].name)),
            }
            self.keys[i].claim = None;
        }
        Ok(format!(
            "put {chosen:?} #{} until {}",
            value.id, value.counts_until
        ))
    }

    /// Forgets key `key`'s memory-only value if it is the claim of a token: mostly its
    /// claim's, sometimes another.
    fn release(&mut self, journal: &Journal, key: usize) -> String {
        let k = &mut self.keys[key];
        let token = match (k.claim, self.rng.below(4)) {
            (Some(claim), 1..) => claim.id,
            _ => self.rng.next_u64(),
        };
        journal.forget_volatile_if(&k.digest, |bytes| {
            Value::decode(bytes).is_some_and(|v| v.memory_only && v.id == token)
        });
        if k.claim.is_some_and(|c| c.id == token) {
            k.claim = None;
        }
        format!("release {} of #{token}", k.name)
    }

    /// A durable put of key `key` with an unbounded, a short or a long lifetime.
    fn put_with_lifetime(
        &mut self,
        journal: &Journal,
        key: usize,
        now: i64,
    ) -> Result<String, String> {
        let counts_until = match self.rng.below(3) {
            0 => i64::MAX,
            1 => now + 1 + self.rng.below(5_000) as i64,
            _ => now + 1 + self.rng.below(3 * TTL_MS as u64) as i64,
        };
        let value = Value {
            memory_only: false,
            id: self.new_id(),
            counts_until,
        };
        let digest = self.keys[key].digest;
        match journal.put(&digest, &value.encode(), counts_until, now) {
            Ok(()) => self.written(journal, key, value),
            Err(error) if self.allowed(&error) => return Ok(format!("put -> {error}")),
            Err(error) => return Err(format!("put failed: {error}")),
        }
        let name = &self.keys[key].name;
        Ok(format!("put {name} #{} until {counts_until}", value.id))
    }

    /// A durable write the store took: it waits for the gate. Over a key whose value is
    /// not known, it starts the key's history afresh.
    fn written(&mut self, journal: &Journal, key: usize, value: Value) {
        let k = &mut self.keys[key];
        if k.unknown {
            k.history.clear();
            k.acked = 0;
            self.waiting.retain(|(waiting, ..)| *waiting != key);
        }
        k.history.push(value);
        let upto = k.history.len();
        self.waiting.push((key, upto, journal.sync_point()));
    }

    /// A commit (or a flush, which commits first) that succeeded covers every write.
    fn acked_if_ok(
        &mut self,
        journal: &Journal,
        what: &str,
        done: Result<(), Error>,
    ) -> Result<String, String> {
        if done.is_ok() {
            self.committed(journal, what)?;
        }
        Ok(format!("{what} -> {}", ok(&done)))
    }

    /// A sweep, which commits what is open.
    fn sweep(&mut self, journal: &Journal, now: i64) -> Result<String, String> {
        let done = journal.sweep(now);
        if done.is_ok() {
            self.committed(journal, "sweep")?;
        }
        let what = done.map_or_else(|e| e.to_string(), |n| n.to_string());
        Ok(format!("sweep -> {what}"))
    }

    /// Damages the disk: a flipped bit, a torn or misdirected run write, or unsynced
    /// writes reordered at the next power cut.
    fn damage(&mut self) -> String {
        self.damage_seen = true;
        match self.rng.below(5) {
            0 | 1 => self.flip(),
            2 => {
                self.damage.tears += 1;
                self.disk.damage_next_write(WriteDamage::Tear, RUNS_DIR);
                "the next run write is torn".into()
            }
            3 => {
                self.damage.misdirects += 1;
                self.disk
                    .damage_next_write(WriteDamage::Misdirect, RUNS_DIR);
                "the next run write is misdirected".into()
            }
            _ => {
                self.damage.reorders += 1;
                self.disk.reorder_at_next_power_cut();
                "the next power cut reorders unsynced writes".into()
            }
        }
    }

    /// Flips a bit of synced bytes of a run or a journal segment, sparing the frames whose
    /// damage no check can tell from a commit a crash cut short (docs/guarantees.md): the
    /// last synced frame of the newest segment that holds any, and a segment's only one.
    fn flip(&mut self) -> String {
        let store = Path::new(STORE_DIR);
        let mut files = self.disk.files_under(&store.join(RUNS_DIR));
        files.retain(|p| p.extension().is_some_and(|e| e == "run"));
        let mut segments = self.disk.files_under(&store.join(JOURNAL_DIR));
        segments.retain(|p| p.extension().is_some_and(|e| e == "wal"));
        segments.sort();
        let newest = segments
            .iter()
            .rev()
            .find(|p| !whole_frames(&self.disk, p).is_empty())
            .cloned();
        files.extend(segments);
        if files.is_empty() {
            return "no file to flip a bit in".into();
        }
        let path = files[self.rng.below(files.len() as u64) as usize].clone();
        let segment = path.extension().is_some_and(|e| e == "wal");
        let frames = if segment {
            synced_frames(&self.disk, &path)
        } else {
            Vec::new()
        };
        let whole: Vec<u64> = frames
            .iter()
            .filter_map(|&(at, whole)| whole.then_some(at))
            .collect();
        // Bounded by whole frames, so a frame a flip made of the zeros after the last one
        // does not stand in for it; a damaged earlier frame still counts as one before it.
        let within = match (frames.as_slice(), whole.as_slice()) {
            ([], _) => 0..u64::MAX,
            // A lone frame's damage shows no batch it held: only the magic then.
            ([_], _) | (_, []) | (_, [_]) => 0..SEGMENT_MAGIC as u64,
            (_, [.., last]) if newest.as_ref() == Some(&path) => 0..*last,
            _ => 0..u64::MAX,
        };
        match self.disk.flip_synced_bit_in(&path, within) {
            Some(flip) => {
                self.damage.flips += 1;
                format!("bit flipped: {flip:?}")
            }
            None => format!("no synced byte to flip in {}", path.display()),
        }
    }

    /// Moves the clock: mostly a little, sometimes across a lifetime or `ttl`.
    fn advance_clock(&mut self) -> String {
        let by = match self.rng.below(10) {
            0 => TTL_MS + self.rng.below(TTL_MS as u64) as i64,
            1..=3 => self.rng.below(10_000) as i64,
            _ => self.rng.below(1_000) as i64,
        };
        self.now.fetch_add(by, Ordering::SeqCst);
        format!("clock +{by} ms")
    }

    /// The power goes before a random later file operation.
    fn cut_power_later(&mut self) -> String {
        let after = 1 + self.rng.below(30);
        self.disk.cut_power_after(after);
        format!("power cut before the {after}th file operation from now")
    }

    /// The next file operation of a random kind fails with ENOSPC or EIO.
    fn fail_next_operation(&mut self) -> String {
        let kind = [OpKind::Write, OpKind::Sync, OpKind::Rename, OpKind::Remove]
            [self.rng.below(4) as usize];
        let fault = if self.rng.below(2) == 0 {
            Fault::NoSpace
        } else {
            Fault::Io
        };
        self.disk.fail_next(kind, fault);
        format!("next {kind:?} fails with {fault:?}")
    }

    /// Every file operation fails with a random rate from now on (often none).
    fn fail_randomly(&mut self) -> String {
        let rate = [0, 0, 20_000, 100_000][self.rng.below(4) as usize];
        self.disk.fail_randomly(rate);
        format!("random faults: {rate} per million")
    }
}

impl Model {
    fn new(name: String) -> Self {
        Self {
            digest: Digest::of(name.as_bytes()),
            name,
            history: Vec::new(),
            acked: 0,
            claim: None,
            unknown: false,
        }
    }

    /// The value the store should hold now: a claim over the last durable value.
    fn expected(&self) -> Option<Value> {
        self.claim.or(self.history.last().copied())
    }

    /// What the store returns for the key, or its error; bytes no write made fail the
    /// test.
    fn read(&self, journal: &Journal) -> Result<Result<Option<Value>, Error>, String> {
        let raw = match journal.get(&self.digest) {
            Ok(raw) => raw,
            Err(error) => return Ok(Err(error)),
        };
        raw.map(|bytes| {
            Value::decode(&bytes)
                .ok_or_else(|| format!("{} reads {bytes:?}, which no write made", self.name))
        })
        .transpose()
        .map(Ok)
    }
}

/// Whether an open's error is a refusal on damage: a run's check, or the journal's.
fn refuses_damage(error: &Error) -> bool {
    matches!(error, Error::Damaged { .. } | Error::Open { .. })
}

/// The frames a power cut keeps of the journal segment at `path` (its synced frames,
/// walked by their lengths up to the zeros after them): where each starts, and whether it
/// is whole (its checksum holds). A flipped byte in the zeros after the last frame reads as
/// a frame that is not whole. Frames only the page cache holds were never acknowledged.
fn synced_frames(disk: &SimDisk, path: &Path) -> Vec<(u64, bool)> {
    let bytes = disk.synced_data(path).unwrap_or_default();
    let mut at = SEGMENT_MAGIC;
    let mut frames = Vec::new();
    while let Some(head) = bytes.get(at..at + FRAME_HEAD) {
        if head.iter().all(|b| *b == 0) {
            break;
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let whole = bytes
            .get(at..at + FRAME_HEAD + len)
            .is_some_and(|frame| len > 0 && crc32fast::hash(&frame[8..]) == crc);
        frames.push((at as u64, whole));
        at += FRAME_HEAD + len;
    }
    frames
}

/// Where the whole frames of the journal segment at `path` start.
fn whole_frames(disk: &SimDisk, path: &Path) -> Vec<u64> {
    synced_frames(disk, path)
        .into_iter()
        .filter_map(|(at, whole)| whole.then_some(at))
        .collect()
}

/// `value` if a caller counts it at `now` (`None` if absent or past its end).
fn counting(value: Option<Value>, now: i64) -> Option<Value> {
    value.filter(|v| v.counts_until > now)
}

fn ok<T, E: std::fmt::Display>(result: &Result<T, E>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => format!("error: {e}"),
    }
}

fn show(value: Option<Value>) -> String {
    match value {
        None => "nothing".into(),
        Some(v) if v.memory_only => format!("claim #{} until {}", v.id, v.counts_until),
        Some(v) => format!("durable #{} until {}", v.id, v.counts_until),
    }
}

/// Runs one seed; an error names the step, what differed, and the last steps and file
/// operations.
fn run_seed(seed: u64, totals: &mut Totals) -> Checked {
    let mut world = World::new(seed)?;
    let mut outcome = Ok(());
    let mut steps = 0;
    for step in 0..STEPS {
        if world.refused.is_some() {
            // Damage no repair undid: the store rightly refuses to open.
            world.damage.ended += 1;
            break;
        }
        steps += 1;
        outcome = world.step(step);
        if outcome.is_ok() && world.disk.power_is_cut() {
            world.note(step, "the power went".into());
            outcome = world.crash_and_reopen();
        }
        if outcome.is_ok() && world.refused.is_none() {
            if let Some(journal) = world.journal.clone() {
                world.pass_gate(&journal);
            }
            outcome = world.check();
        }
        if let Err(error) = outcome {
            outcome = Err(format!(
                "seed {seed}, step {step}: {error}\nlast steps:\n  {}\nlast file operations:\n  {}",
                world.log.join("\n  "),
                world.disk.recent().join("\n  ")
            ));
            break;
        }
    }
    totals.seeds += 1;
    totals.steps += steps;
    totals.crashes += world.crashes;
    totals.reopens += world.reopens;
    totals.restarts += world.restarts;
    totals.faults += world.disk.faults_injected();
    totals.file_ops += world.disk.ops();
    totals.damage.add(&world.damage);
    outcome
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

/// The first seed, and whether a seed is still to run: one seed, a time limit from a random
/// first one, or a count.
fn seeds_to_run(started: Instant) -> (u64, Box<dyn Fn(u64) -> bool>) {
    if let Some(seed) = env_u64("EXPIRING_LSM_MODEL_SEED") {
        (seed, Box::new(move |s| s == seed))
    } else if let Some(seconds) = env_u64("EXPIRING_LSM_MODEL_SECONDS") {
        let first = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let limit = Duration::from_secs(seconds);
        (first, Box::new(move |_| started.elapsed() < limit))
    } else {
        let first = env_u64("EXPIRING_LSM_MODEL_FIRST").unwrap_or(0);
        let count = env_u64("EXPIRING_LSM_MODEL_SEEDS").unwrap_or(CI_SEEDS);
        (first, Box::new(move |s| s < first + count))
    }
}

#[test]
fn the_store_matches_its_model_through_crashes_and_faults() {
    let started = Instant::now();
    let (first, until) = seeds_to_run(started);
    let mut totals = Totals::default();
    let mut failures = Vec::new();
    let mut seed = first;
    while until(seed) && failures.len() < FAILURES_KEPT {
        if let Err(failure) = run_seed(seed, &mut totals) {
            eprintln!(
                "model test failed: {failure}\nreplay: EXPIRING_LSM_MODEL_SEED={seed} {REPLAY}\n"
            );
            failures.push(seed);
        }
        seed += 1;
    }
    let d = totals.damage;
    eprintln!(
        "model test: seeds {first}..{seed} ({} seeds), {} steps, {} file operations, {} power cuts, {} clean reopens, {} process restarts, {} injected faults; damage: {} bit flips, {} torn and {} misdirected run writes, {} reordering power cuts, {} reads failed on damage, {} opens refused, {} repairs, {} seeds ended on damage; in {:.1?}",
        totals.seeds,
        totals.steps,
        totals.file_ops,
        totals.crashes,
        totals.reopens,
        totals.restarts,
        totals.faults,
        d.flips,
        d.tears,
        d.misdirects,
        d.reorders,
        d.damaged_reads,
        d.refusals,
        d.repairs,
        d.ended,
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "the store differs from its model on seeds {failures:?}; replay one with EXPIRING_LSM_MODEL_SEED={} {REPLAY}",
        failures[0]
    );
}
