//! The state store's model-checked crash test: a seeded generator of operations on the
//! journal, its runs and its marks, on a simulated disk that loses what was not synced at a
//! power cut and fails writes, syncs, renames and removals on demand, checked after every
//! step against a plain in-memory model.
//!
//! The generator claims, marks done and releases dedup marks; writes guard state with
//! short and unbounded lifetimes; moves the clock across the lifetimes and `dedup.ttl`
//! (when runs are rewritten); commits, flushes to runs, merges, rewrites, sweeps and
//! prepares segments; reopens cleanly; cuts the power at once or before a random later
//! file operation (between any two, a rename and an unlink included); and injects ENOSPC
//! and EIO. The store runs without its threads: every step is a call the seed chose.
//!
//! What is checked, for every key after every step: the value the store returns, judged
//! the way its callers judge it (a mark or a guard state past its own expiry counts as
//! absent), is the model's latest value. After a power cut or a reopen it is the latest
//! value a successful commit covered, or a later one, never an earlier one; the model then
//! takes what survived as its own and as durable: a value a clean restart reads back must
//! outlive the next power cut, even one a failed sync left only in the page cache.
//!
//! `HOOKGATE_MODEL_SEED=<n>` replays one seed; `HOOKGATE_MODEL_SEEDS=<n>` runs that many
//! (from `HOOKGATE_MODEL_FIRST`, default 0); `HOOKGATE_MODEL_SECONDS=<s>` runs seeds from a
//! random first one until the time is up. A failing seed prints itself and its replay
//! command.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use disk_seam::sim::{Fault, OpKind, Rng, SimDisk};
use expiring_lsm::journal::{Journal, Settings};

use crate::state::keys::StoreKey;
use crate::state::marks::{classify, decode, encode, Claim, JournalMarks, KeyState, Mark};
use crate::store::Store;

/// Seeds plain `cargo test` runs (about 30 s in a debug build on two busy cores).
const CI_SEEDS: u64 = 250;
/// Steps of one seed.
const STEPS: usize = 400;
const MARK_KEYS: usize = 16;
const GUARD_KEYS: usize = 16;
/// The in-flight lease of claims.
const LEASE_MS: i64 = 30_000;
/// `dedup.ttl`: marks live this long, and a run is rewritten this long after it was written.
const TTL_MS: i64 = 60_000;
/// Small, so that commits roll segments.
const SEGMENT_BYTES: u64 = 2048;
const STORE_DIR: &str = "/var/lib/hookgate";
/// Failing seeds reported before the test stops.
const FAILURES_KEPT: usize = 5;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mark,
    Guard,
}

/// What the model knows of one key.
struct Model {
    key: StoreKey,
    kind: Kind,
    /// Values written durably, oldest first.
    history: Vec<Vec<u8>>,
    /// How many of `history` a successful commit covered.
    acked: usize,
    /// A claim (memory only): token and start.
    claim: Option<(u64, i64)>,
}

/// Figures of a run of seeds.
#[derive(Default)]
struct Totals {
    seeds: u64,
    steps: u64,
    crashes: u64,
    reopens: u64,
    faults: u64,
    file_ops: u64,
}

/// One seed's world: the disk, the clock, the store and the model.
struct World {
    rng: Rng,
    disk: SimDisk,
    now: Arc<AtomicI64>,
    store: Store,
    journal: Option<Arc<Journal>>,
    keys: Vec<Model>,
    next_id: u64,
    /// The last steps, for a failure's message.
    log: Vec<String>,
    crashes: u64,
    reopens: u64,
}

type Checked = Result<(), String>;

impl World {
    fn new(seed: u64, store: Store) -> Result<Self, String> {
        let mut keys = Vec::new();
        for i in 0..MARK_KEYS {
            keys.push(Model::new(
                StoreKey::event("r", &format!("e{i}")),
                Kind::Mark,
            ));
        }
        for i in 0..GUARD_KEYS {
            keys.push(Model::new(
                StoreKey::raw(format!("g{i}").as_bytes()),
                Kind::Guard,
            ));
        }
        let mut world = Self {
            rng: Rng::new(seed),
            disk: SimDisk::new(seed ^ 0x5eed),
            now: Arc::new(AtomicI64::new(1_700_000_000_000)),
            store,
            journal: None,
            keys,
            next_id: 0,
            log: Vec::new(),
            crashes: 0,
            reopens: 0,
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
        let clock_now = self.now.clone();
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
            let now = clock_now.clone();
            let settings = Settings {
                hot_entries: usize::MAX,
                ttl: Duration::from_millis(TTL_MS as u64),
                clock: Arc::new(move || now.load(Ordering::SeqCst)),
                segment_bytes: SEGMENT_BYTES,
                commit_interval: Duration::ZERO,
                disk: self.disk.handle(),
                background: false,
                needs_restart: Arc::new(|_| {}),
            };
            let tree = Arc::new(self.store.tree("state").map_err(|e| e.to_string())?);
            match Journal::open(tree, Path::new(STORE_DIR), self.now(), settings) {
                Ok(journal) => {
                    self.journal = Some(journal);
                    return Ok(());
                }
                Err(error) if self.disk.power_is_cut() => last = error.to_string(),
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
        if self.journal()?.write_now().is_ok() {
            self.acked_all();
        }
        self.journal = None;
        self.reopens += 1;
        if self.disk.power_is_cut() {
            return self.crash_and_reopen();
        }
        self.open()?;
        self.resolve()
    }

    /// A commit succeeded: it covered every write made since the store was opened.
    fn acked_all(&mut self) {
        for k in &mut self.keys {
            k.acked = k.history.len();
        }
    }

    /// After a restart: each key holds the latest value a commit covered or a later one
    /// (judged as its callers would); the model takes it as its own.
    fn resolve(&mut self) -> Checked {
        let now = self.now();
        let journal = self.journal()?.clone();
        for k in &mut self.keys {
            k.claim = None;
            let raw = journal
                .get(&k.key.digest())
                .map_err(|e| format!("read of {} failed: {e}", k.name()))?;
            let from = k.acked.saturating_sub(1);
            let exact = raw
                .as_ref()
                .and_then(|r| (from..k.history.len()).rev().find(|&i| k.history[i] == *r));
            if let Some(i) = exact {
                k.history.truncate(i + 1);
                // What reads back is durable: after a power cut it is what the disk kept;
                // after a clean restart the open wrote what it replayed to a synced run,
                // pages a failed sync left in the cache included.
                k.acked = i + 1;
                continue;
            }
            let seen = k.visible(raw.as_deref(), now);
            let absent_allowed = k.acked == 0
                || k.history[from..]
                    .iter()
                    .any(|v| k.visible(Some(v), now).is_none());
            if seen.is_none() && absent_allowed {
                // Nothing visible survived: only a new write makes the key visible again.
                k.history.clear();
                k.acked = 0;
                continue;
            }
            let older = raw
                .as_ref()
                .and_then(|r| k.history[..from].iter().rposition(|v| v == r));
            return Err(format!(
                "after a restart {} reads {} ({}); the latest committed value is {} and {} were written after it",
                k.name(),
                show(raw.as_deref()),
                match older {
                    Some(i) => format!("write {i} of {}, superseded by a committed one", k.history.len()),
                    None => "no value the model allows".to_owned(),
                },
                show(k.history.get(from).map(Vec::as_slice).filter(|_| k.acked > 0)),
                k.history.len() - k.acked,
            ));
        }
        Ok(())
    }

    /// Every key reads as the model's latest value, judged as its callers judge it.
    fn check(&self) -> Checked {
        let now = self.now();
        let journal = self.journal()?;
        for k in &self.keys {
            let raw = journal
                .get(&k.key.digest())
                .map_err(|e| format!("read of {} failed: {e}", k.name()))?;
            let expected = k.expected();
            if k.visible(raw.as_deref(), now) != k.visible(expected.as_deref(), now) {
                return Err(format!(
                    "{} reads {}, the model holds {}",
                    k.name(),
                    show(raw.as_deref()),
                    show(expected.as_deref())
                ));
            }
        }
        Ok(())
    }

    /// One random step.
    fn step(&mut self, step: usize) -> Checked {
        let now = self.now();
        let journal = self.journal()?.clone();
        let marks = JournalMarks::new(journal.clone(), Duration::from_millis(LEASE_MS as u64));
        let roll = self.rng.below(100);
        let mark = self.rng.below(MARK_KEYS as u64) as usize;
        let guard = MARK_KEYS + self.rng.below(GUARD_KEYS as u64) as usize;
        let what = match roll {
            0..=14 => self.claim(&marks, mark, now)?,
            15..=26 => self.mark_done(&marks, mark, now)?,
            27..=31 => self.release(&marks, mark),
            32..=46 => self.put_guard(&journal, guard, now)?,
            47..=58 => self.acked_if_ok("commit", journal.write_now()),
            59..=64 => self.acked_if_ok("flush", journal.flush_to_run()),
            65..=69 => format!("merge -> {}", ok(&journal.merge_now())),
            70..=73 => self.sweep(&journal, now),
            74..=75 => format!("spare -> {}", ok(&journal.prepare_spare())),
            76..=87 => self.advance_clock(),
            88..=89 => {
                drop((journal, marks));
                self.note(step, "clean reopen".into());
                return self.reopen();
            }
            90..=91 => {
                drop((journal, marks));
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

    /// Claims mark key `mark`: the store must answer as the model expects.
    fn claim(&mut self, marks: &JournalMarks, mark: usize, now: i64) -> Result<String, String> {
        let token = self.rng.next_u64();
        let k = &mut self.keys[mark];
        let expected = match k
            .visible(k.expected().as_deref(), now)
            .as_deref()
            .and_then(decode)
        {
            Some(Mark::Done { .. }) => Claim::Done,
            Some(Mark::InFlight { .. }) => Claim::InFlight,
            None => Claim::Claimed,
        };
        let got = marks
            .try_claim(&k.key, token, now)
            .map_err(|e| format!("claim failed: {e}"))?;
        let what = format!("claim {} -> {got:?}", k.name());
        if got != expected {
            return Err(format!("{what}, the model expects {expected:?}"));
        }
        if got == Claim::Claimed {
            k.claim = Some((token, now));
        }
        Ok(what)
    }

    /// Marks mark key `mark` done, sometimes with another key in the same call.
    fn mark_done(&mut self, marks: &JournalMarks, mark: usize, now: i64) -> Result<String, String> {
        let expires = now + TTL_MS + self.rng.below(1000) as i64;
        let two = self.rng.below(3) == 0;
        let other = self.rng.below(MARK_KEYS as u64) as usize;
        let chosen: Vec<usize> = if two && other != mark {
            vec![mark, other]
        } else {
            vec![mark]
        };
        let keys: Vec<&StoreKey> = chosen.iter().map(|&i| &self.keys[i].key).collect();
        marks
            .mark_done(&keys, expires, now)
            .map_err(|e| format!("mark_done failed: {e}"))?;
        let value = encode(&Mark::Done {
            expires_ms: expires,
        })
        .to_vec();
        for &i in &chosen {
            let k = &mut self.keys[i];
            k.history.push(value.clone());
            k.claim = None;
        }
        Ok(format!("done {chosen:?} until {expires}"))
    }

    /// Releases mark key `mark`, mostly with its claim's token, sometimes with another.
    fn release(&mut self, marks: &JournalMarks, mark: usize) -> String {
        let k = &mut self.keys[mark];
        let token = match (k.claim, self.rng.below(4)) {
            (Some((token, _)), 1..) => token,
            _ => self.rng.next_u64(),
        };
        marks.release(&k.key, token);
        if k.claim.is_some_and(|(t, _)| t == token) {
            k.claim = None;
        }
        format!("release {}", self.keys[mark].name())
    }

    /// Writes guard key `guard` with an unbounded, a short or a long lifetime.
    fn put_guard(&mut self, journal: &Journal, guard: usize, now: i64) -> Result<String, String> {
        self.next_id += 1;
        let expires = match self.rng.below(3) {
            0 => i64::MAX,
            1 => now + 1 + self.rng.below(5_000) as i64,
            _ => now + 1 + self.rng.below(3 * TTL_MS as u64) as i64,
        };
        let mut value = self.next_id.to_le_bytes().to_vec();
        value.extend_from_slice(&expires.to_le_bytes());
        let k = &mut self.keys[guard];
        journal
            .put(&k.key.digest(), &value, expires, now)
            .map_err(|e| format!("put failed: {e}"))?;
        k.history.push(value);
        Ok(format!(
            "put {} #{} until {expires}",
            k.name(),
            self.next_id
        ))
    }

    /// A commit (or a flush, which commits first) that succeeded covers every write.
    fn acked_if_ok(&mut self, what: &str, done: Result<(), expiring_lsm::Error>) -> String {
        if done.is_ok() {
            self.acked_all();
        }
        format!("{what} -> {}", ok(&done))
    }

    /// A sweep, which commits what is open.
    fn sweep(&mut self, journal: &Journal, now: i64) -> String {
        let done = journal.sweep(now);
        if done.is_ok() {
            self.acked_all();
        }
        format!(
            "sweep -> {}",
            done.map(|n| n.to_string())
                .unwrap_or_else(|e| e.to_string())
        )
    }

    /// Moves the clock: mostly a little, sometimes across a lifetime or `dedup.ttl`.
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
    fn new(key: StoreKey, kind: Kind) -> Self {
        Self {
            key,
            kind,
            history: Vec::new(),
            acked: 0,
            claim: None,
        }
    }

    /// The key, readable.
    fn name(&self) -> String {
        String::from_utf8_lossy(self.key.as_bytes()).replace('\0', "/")
    }

    /// The value the store should hold now: a claim over the last written value.
    fn expected(&self) -> Option<Vec<u8>> {
        match self.claim {
            Some((token, since_ms)) => Some(encode(&Mark::InFlight { token, since_ms }).to_vec()),
            None => self.history.last().cloned(),
        }
    }

    /// `value` if its callers would count it at `now` (`None` if absent or expired).
    fn visible(&self, value: Option<&[u8]>, now: i64) -> Option<Vec<u8>> {
        let value = value?;
        let counts = match self.kind {
            Kind::Mark => classify(decode(value).as_ref(), now, LEASE_MS) != KeyState::Free,
            Kind::Guard => value
                .get(8..16)
                .and_then(|b| b.try_into().ok())
                .is_some_and(|b| i64::from_le_bytes(b) > now),
        };
        counts.then(|| value.to_vec())
    }
}

fn ok<T, E: std::fmt::Display>(result: &Result<T, E>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => format!("error: {e}"),
    }
}

fn show(value: Option<&[u8]>) -> String {
    match value {
        None => "nothing".into(),
        Some(v) => match (decode(v), v.len()) {
            (Some(mark), _) => format!("{mark:?}"),
            (None, 16) => {
                let id = u64::from_le_bytes(v[..8].try_into().unwrap_or_default());
                let expires = i64::from_le_bytes(v[8..].try_into().unwrap_or_default());
                format!("guard value #{id} until {expires}")
            }
            _ => format!("{v:?}"),
        },
    }
}

/// Runs one seed; an error names the step, what differed, and the last steps and file
/// operations.
fn run_seed(seed: u64, store: &Store, totals: &mut Totals) -> Checked {
    let mut world = World::new(seed, store.clone())?;
    let mut outcome = Ok(());
    let mut steps = 0;
    for step in 0..STEPS {
        steps += 1;
        outcome = world.step(step);
        if outcome.is_ok() && world.disk.power_is_cut() {
            world.note(step, "the power went".into());
            outcome = world.crash_and_reopen();
        }
        if outcome.is_ok() {
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
    totals.faults += world.disk.faults_injected();
    totals.file_ops += world.disk.ops();
    outcome
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

#[test]
fn the_store_matches_its_model_through_crashes_and_faults() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The journal reads a sled tree left by older stores: here an empty one, shared.
    let store = Store::open(dir.path()).expect("sled store");
    let started = Instant::now();
    let (first, until): (u64, Box<dyn Fn(u64) -> bool>) =
        if let Some(seed) = env_u64("HOOKGATE_MODEL_SEED") {
            (seed, Box::new(move |s| s == seed))
        } else if let Some(seconds) = env_u64("HOOKGATE_MODEL_SECONDS") {
            let first = crate::clock::system_clock()() as u64;
            let limit = Duration::from_secs(seconds);
            (first, Box::new(move |_| started.elapsed() < limit))
        } else {
            let first = env_u64("HOOKGATE_MODEL_FIRST").unwrap_or(0);
            let count = env_u64("HOOKGATE_MODEL_SEEDS").unwrap_or(CI_SEEDS);
            (first, Box::new(move |s| s < first + count))
        };
    let mut totals = Totals::default();
    let mut failures = Vec::new();
    let mut seed = first;
    while until(seed) && failures.len() < FAILURES_KEPT {
        if let Err(failure) = run_seed(seed, &store, &mut totals) {
            eprintln!(
                "model test failed: {failure}\nreplay: HOOKGATE_MODEL_SEED={seed} cargo test --lib state::model\n"
            );
            failures.push(seed);
        }
        seed += 1;
    }
    eprintln!(
        "model test: seeds {first}..{seed} ({} seeds), {} steps, {} file operations, {} power cuts, {} clean reopens, {} injected faults, in {:.1?}",
        totals.seeds,
        totals.steps,
        totals.file_ops,
        totals.crashes,
        totals.reopens,
        totals.faults,
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "the store differs from its model on seeds {failures:?}; replay one with HOOKGATE_MODEL_SEED={} cargo test --lib state::model",
        failures[0]
    );
}
