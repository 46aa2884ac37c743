//! The spool's model test: a seeded run of pushes, drains (through a broker stand-in that
//! acknowledges, refuses or is away as the seed says), moves to held, parks, republishes
//! and deletes, with power cuts at random points (mid-commit included) and injected I/O
//! errors, checked after every step against a model queue:
//!
//! - every entry whose push returned `Ok` is in exactly one area, or the broker
//!   acknowledged it (an entry it acknowledged may be back after a cut: the batch in
//!   flight);
//! - no entry is ever in two areas, and the counts match the tables;
//! - the events of one guard key reach the broker (first arrivals) in push order, parked
//!   ones aside (parking takes an entry out of its key's order by design);
//! - every message the broker gets is the one pushed under its id, never an altered one.
//!
//! Damage steps, beside loss: a bit flipped in the synced bytes of an entry's record (the
//! page cache dropped the page, so the running process reads the flip), a bit flipped
//! anywhere in the file while the process is down, a write torn or misdirected though its
//! sync succeeds, and unsynced writes reordered at the next power cut. A damaged record is
//! parked with a reason that says so; damage redb's checksums find when it recovers makes
//! the open refuse, naming the file, and the seed ends there (docs/guarantees.md, "A
//! damaged spool"). An open that succeeds keeps every promise above.
//!
//! `cargo test -p durable-spool model` runs [`SEEDS`] seeds of [`STEPS`] steps.
//! `HOOKGATE_SPOOL_MODEL_SECS=N` runs new seeds for N seconds instead (hours, say), going
//! on past failing seeds; `HOOKGATE_SPOOL_MODEL_SEED=S` replays seed S alone. A failing
//! seed prints itself and the command that replays it; the closing line counts seeds,
//! steps, faults, restarts, power cuts, damage, refused opens, entries parked as damaged
//! and failing seeds.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use disk_seam::sim::{Fault, OpKind, SimDisk, WriteDamage};
use disk_seam::Disk;

use crate::drain::Every;
use crate::parked_record::decode_parked;
use crate::record;
use crate::sink::{Sink, SinkError};
use crate::spool::Spool;
use crate::spool_file::SPOOL_FILE;
use crate::tables::Area;
use crate::testkit::{self, TestSink};

/// Seeds a plain `cargo test` runs.
const SEEDS: u64 = 64;
/// Steps per seed.
const STEPS: usize = 120;
const KEYS: [Option<&str>; 4] = [None, Some("a"), Some("b"), Some("c")];
/// The store folder of [`testkit::open_on`].
const STORE_DIR: &str = "/store";

/// SplitMix64: small, and the same sequence on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Prints the seed and how to replay it when a check fails.
struct SeedReport(u64);

impl Drop for SeedReport {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "spool model failed at seed {0}; replay it with\n  HOOKGATE_SPOOL_MODEL_SEED={0} cargo test -p durable-spool model",
                self.0
            );
        }
    }
}

/// The model: what was promised, and what the broker saw (in the sink).
struct Run {
    rng: Rng,
    disk: SimDisk,
    spool: Option<Spool>,
    sink: TestSink,
    /// How the broker answers the next publishes, changed by the run.
    answers: Arc<Mutex<Rng>>,
    /// The broker's answers since the last step, for the trail.
    said: Arc<Mutex<Vec<String>>>,
    /// Messages the broker got that differ from the one pushed under their id.
    altered: Arc<Mutex<Vec<String>>>,
    next_id: u64,
    /// Every push, in order: its id and guard key.
    pushed: Vec<(String, Option<&'static str>)>,
    /// Pushes that returned Ok.
    promised: HashSet<String>,
    /// Entries parked at some point, and entries an operator deleted.
    parked_ever: HashSet<String>,
    deleted: HashSet<String>,
    log: Vec<String>,
    /// Power cuts and process restarts so far.
    cuts: u64,
    restarts: u64,
    /// Entries whose record had a bit flipped, by sequence number: their id.
    damaged: HashMap<u64, String>,
    /// Whether the disk was damaged: only then may an open refuse.
    damage_seen: bool,
    damage: Damage,
    /// Entries seen parked with a reason that names damage.
    parked_damaged: HashSet<u64>,
    /// Why an open refused on damage: the seed ends there.
    refused: Option<String>,
}

/// Damage injected into one seed.
#[derive(Default)]
struct Damage {
    /// Bits flipped in a record the process reads, and in the file while it is down.
    flips: u64,
    flips_at_rest: u64,
    tears: u64,
    misdirects: u64,
    reorders: u64,
}

impl Damage {
    fn total(&self) -> u64 {
        self.flips + self.flips_at_rest + self.tears + self.misdirects + self.reorders
    }
}

impl Run {
    fn new(seed: u64) -> Self {
        let answers = Arc::new(Mutex::new(Rng(seed ^ 0x5EED)));
        let broker = answers.clone();
        let said: Arc<Mutex<Vec<String>>> = Arc::default();
        let saying = said.clone();
        let altered: Arc<Mutex<Vec<String>>> = Arc::default();
        let altering = altered.clone();
        let sink = TestSink::new(move |msg| {
            let pushed = testkit::event(&msg.message_id, msg.order_key.as_deref());
            if *msg != pushed {
                altering
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(format!("{msg:?}"));
            }
            let roll = broker
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .below(100);
            let answer = match roll {
                0..70 => Ok(()),
                70..80 => Err(SinkError::Unroutable("k".into())),
                80..90 => Err(SinkError::Refused("broker nacked the message".into())),
                _ => Err(SinkError::Away("broker not connected".into())),
            };
            saying
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(format!("{}: {answer:?}", msg.message_id));
            answer
        });
        let disk = SimDisk::new(seed);
        let spool = testkit::open_caching(&disk, 0).expect("open");
        Self {
            rng: Rng(seed),
            disk,
            spool: Some(spool),
            sink,
            answers,
            said,
            altered,
            next_id: 0,
            pushed: Vec::new(),
            promised: HashSet::new(),
            parked_ever: HashSet::new(),
            deleted: HashSet::new(),
            log: Vec::new(),
            cuts: 0,
            restarts: 0,
            damaged: HashMap::new(),
            damage_seen: false,
            damage: Damage::default(),
            parked_damaged: HashSet::new(),
            refused: None,
        }
    }

    fn spool(&self) -> &Spool {
        self.spool.as_ref().expect("a spool is open")
    }

    /// The ids in each area, in order.
    fn areas(&self) -> HashMap<Area, Vec<String>> {
        let mut out = HashMap::new();
        for area in [Area::Main, Area::Held, Area::Parked] {
            let mut ids = Vec::new();
            self.spool()
                .tables
                .for_each(area, 256, |seq, v| {
                    let entry = match area {
                        Area::Parked => decode_parked(v).map_or(v, |(_, _, e)| e),
                        _ => v,
                    };
                    let id = match record::decode(entry) {
                        Ok(m) => m.message_id.into_owned(),
                        Err(_) => self.damaged.get(&seq).cloned().unwrap_or("?".into()),
                    };
                    ids.push(id);
                })
                .expect("read the tables");
            out.insert(area, ids);
        }
        out
    }

    /// A power cut: the spool's process is gone, the disk keeps what was synced and some
    /// of the rest.
    fn crash(&mut self) {
        let next = self.disk.crash();
        drop(self.spool.take());
        self.log.push("power cut".into());
        self.cuts += 1;
        self.disk = next;
        self.reopen("a power cut");
    }

    /// A process restart that is no power cut: the page cache stays, pages a failed sync
    /// left there included, and the next process reads them. Half of them are clean (a
    /// stop the process sees through: the spool closes its database), half are kills.
    fn restart(&mut self) {
        if self.disk.power_is_cut() {
            return self.crash();
        }
        let clean = self.rng.below(2) == 0;
        self.stop(clean);
        self.reopen("a restart");
    }

    /// Ends the spool's process, cleanly or by a kill, and takes the next one's handle.
    fn stop(&mut self, clean: bool) {
        let next = if clean {
            drop(self.spool.take());
            self.disk.restart()
        } else {
            let next = self.disk.restart();
            drop(self.spool.take());
            next
        };
        self.log.push(format!(
            "process restart ({})",
            if clean { "clean" } else { "kill" }
        ));
        self.restarts += 1;
        self.disk = next;
    }

    /// Opens the spool again. After damage the open may refuse, naming the file: the
    /// seed ends there, as an operator takes over (docs/guarantees.md).
    fn reopen(&mut self, after: &str) {
        match testkit::open_caching(&self.disk, 0) {
            Ok(spool) => self.spool = Some(spool),
            Err(error) if self.damage_seen && refuses_damage(&error.to_string()) => {
                self.log.push(format!("open refused: {error}"));
                self.refused = Some(error.to_string());
            }
            Err(error) => panic!(
                "the spool does not open after {after}: {error}\n{}",
                self.trail()
            ),
        }
    }

    async fn push(&mut self) {
        let key = KEYS[self.rng.below(KEYS.len() as u64) as usize];
        let id = format!("e{:04}", self.next_id);
        self.next_id += 1;
        let msg = testkit::event(&id, key);
        self.pushed.push((id.clone(), key));
        let spool = self.spool.as_ref().expect("a spool is open");
        // As the outbox does: while main is empty, behind the held entries of its key, or
        // else published at once (to held if the broker calls it unroutable); while main is
        // not empty, at its tail.
        let mut held = false;
        if spool.is_empty() {
            if key.is_some_and(|k| spool.holds_key(k)) {
                held = true;
            } else {
                match self.sink.publish("x", &msg).await {
                    Ok(()) => {
                        self.log.push(format!("publish {id} {key:?} at once"));
                        self.promised.insert(id);
                        return;
                    }
                    Err(SinkError::Unroutable(_)) => held = true,
                    Err(_) => {}
                }
            }
        }
        let result = if held {
            spool.push_held(&msg).await
        } else {
            spool.push(&msg).await
        };
        self.log
            .push(format!("push {id} {key:?} held {held}: {result:?}"));
        if result.is_ok() {
            self.promised.insert(id);
        }
    }

    async fn drain(&mut self) {
        let n = 1 + self.rng.below(8) as usize;
        let spool = self.spool();
        let rows = spool.tables.page(Area::Main, None, n).expect("head");
        let stop = tokio_util::sync::CancellationToken::new();
        let (_, committed) = spool
            .drain_batch(&self.sink, "x", rows, &mut Every::default(), &stop)
            .await;
        self.log
            .push(format!("drain up to {n}: committed {committed}"));
    }

    async fn retry_held(&mut self) {
        let stop = tokio_util::sync::CancellationToken::new();
        let published = self
            .spool()
            .retry_held(&self.sink, "x", &mut Every::default(), &stop)
            .await;
        self.log.push(format!("retry held: published {published}"));
    }

    /// Parks a random entry of main or held, as the drainer does with one it failed on.
    async fn park(&mut self) {
        let area = if self.rng.below(2) == 0 {
            Area::Main
        } else {
            Area::Held
        };
        let rows = self.spool().tables.page(area, None, 64).expect("read");
        if rows.is_empty() {
            return;
        }
        let (seq, value) = &rows[self.rng.below(rows.len() as u64) as usize];
        if let Ok(msg) = record::decode(value) {
            self.parked_ever.insert(msg.message_id.into_owned());
        }
        let stop = tokio_util::sync::CancellationToken::new();
        self.spool().park_entry(area, *seq, "model", &stop).await;
        self.log.push(format!("park {seq} of {area:?}"));
    }

    async fn operator(&mut self) {
        let parked = self.spool().parked_entries().expect("list");
        if parked.is_empty() {
            return;
        }
        let entry = &parked[self.rng.below(parked.len() as u64) as usize];
        if self.rng.below(4) == 0 {
            let result = self.spool().delete_parked(entry.id).await;
            self.log
                .push(format!("delete parked {}: {result:?}", entry.id));
            // An error leaves the delete in doubt, as it leaves a push: the failed commit is
            // in the page cache, and the reopen that sets it back makes it durable first,
            // so a power cut before the setting back keeps the delete.
            let damaged = self.damaged.get(&entry.id).cloned();
            self.deleted.extend(entry.event_id.clone().or(damaged));
        } else {
            let result = self.spool().republish(entry.id).await;
            self.log.push(format!("republish {}: {result:?}", entry.id));
        }
    }

    async fn step(&mut self) {
        match self.rng.below(100) {
            0..35 => self.push().await,
            35..60 => self.drain().await,
            60..68 => self.retry_held().await,
            68..71 => self.park().await,
            71..75 => self.operator().await,
            75..79 => self.crash(),
            79..83 => self.restart(),
            83..88 => {
                // The power goes mid-operation, after some writes of its commit.
                let ops = 1 + self.rng.below(24);
                self.log
                    .push(format!("power off at operation {ops} from now"));
                self.disk.cut_power_after(ops);
                if self.rng.below(2) == 0 {
                    self.push().await;
                } else {
                    self.drain().await;
                }
                self.crash();
            }
            88..90 => self.damage().await,
            90..95 => {
                let kind = [OpKind::Write, OpKind::Sync][self.rng.below(2) as usize];
                let fault = [Fault::Io, Fault::NoSpace][self.rng.below(2) as usize];
                self.log.push(format!("inject {fault:?} on {kind:?}"));
                self.disk.fail_next(kind, fault);
            }
            _ => {
                // The broker changes its mind about what it takes.
                let reseed = self.rng.next();
                *self.answers.lock().unwrap_or_else(PoisonError::into_inner) = Rng(reseed);
            }
        }
        let said = std::mem::take(&mut *self.said.lock().unwrap_or_else(PoisonError::into_inner));
        if !said.is_empty() {
            self.log.push(format!("  broker: {}", said.join(", ")));
        }
        if self.refused.is_some() {
            return;
        }
        if self.spool().restart_needed().is_some() {
            // What a liveness probe does: the process is restarted, the page cache stays.
            self.log.push("the spool needs a restart".into());
            self.restart();
        }
    }

    /// Damages the disk: a bit flipped in an entry's record or anywhere in the file, a
    /// write torn or misdirected, or unsynced writes reordered at the next power cut.
    async fn damage(&mut self) {
        let file = Path::new(STORE_DIR).join(SPOOL_FILE);
        match self.rng.below(5) {
            0 => self.flip_in_record(&file),
            1 => {
                // While the process is down (stopped cleanly, killed, or the power went):
                // the next open is the first to read it.
                match self.rng.below(3) {
                    0 => self.stop(true),
                    1 => self.stop(false),
                    _ => {
                        let next = self.disk.crash();
                        drop(self.spool.take());
                        self.log.push("power cut".into());
                        self.cuts += 1;
                        self.disk = next;
                    }
                }
                let flip = self.disk.flip_synced_bit_in(&file, 0..u64::MAX);
                self.log.push(format!("a flip at rest: {flip:?}"));
                if flip.is_some() {
                    self.damage_seen = true;
                    self.damage.flips_at_rest += 1;
                }
                self.reopen("a bit flipped at rest");
            }
            2 | 3 => {
                let (damage, what) = if self.rng.below(2) == 0 {
                    self.damage.tears += 1;
                    (WriteDamage::Tear, "torn")
                } else {
                    self.damage.misdirects += 1;
                    (WriteDamage::Misdirect, "misdirected")
                };
                self.damage_seen = true;
                self.disk.damage_next_write(damage, SPOOL_FILE);
                self.log.push(format!("the next write is {what}"));
                // Its commit, so that the damage meets the spool's own pages.
                self.push().await;
            }
            _ => {
                self.damage_seen = true;
                self.damage.reorders += 1;
                self.disk.reorder_at_next_power_cut();
                self.log
                    .push("the next power cut reorders unsynced writes".into());
            }
        }
    }

    /// Flips a bit in the synced bytes of an entry's record (any copy of it in the file, so
    /// maybe one no longer in use), where the running process reads it: the spool caches no
    /// pages in the model, as after its cache and the kernel's dropped the page.
    fn flip_in_record(&mut self, file: &Path) {
        let area = [Area::Main, Area::Held, Area::Parked][self.rng.below(3) as usize];
        let rows = self.spool().tables.page(area, None, 64).expect("read");
        if rows.is_empty() {
            return;
        }
        let (seq, value) = &rows[self.rng.below(rows.len() as u64) as usize];
        let entry = match area {
            Area::Parked => decode_parked(value).map_or(&value[..], |(_, _, e)| e),
            _ => &value[..],
        };
        let Ok(msg) = record::decode(entry) else {
            return;
        };
        let synced = self.disk.synced_data(file).unwrap_or_default();
        // A copy the page cache holds too: the simulator flips a byte whose cached copy is
        // the synced one, and a byte of a page rewritten since but not yet synced may
        // match by chance, where no real disk would show a flip before that page's write.
        let cached = self.disk.open(file).and_then(|f| {
            let mut bytes = vec![0; usize::try_from(f.len()?).unwrap_or(0)];
            f.read_exact_at(&mut bytes, 0).map(|()| bytes)
        });
        let cached = cached.unwrap_or_default();
        let copies: Vec<usize> = synced
            .windows(entry.len())
            .enumerate()
            .filter(|(at, w)| *w == entry && cached.get(*at..at + entry.len()) == Some(entry))
            .map(|(at, _)| at)
            .collect();
        if copies.is_empty() {
            return;
        }
        let at = copies[self.rng.below(copies.len() as u64) as usize] as u64;
        let flip = self
            .disk
            .flip_synced_bit_in(file, at..at + entry.len() as u64);
        self.log
            .push(format!("flip in the record of {seq} of {area:?}: {flip:?}"));
        if flip.is_some() {
            self.damage_seen = true;
            self.damage.flips += 1;
            self.damaged.insert(*seq, msg.message_id.into_owned());
        }
    }

    fn check(&mut self) {
        let altered = self
            .altered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        assert!(
            altered.is_empty(),
            "messages reached the broker altered: {altered:?}\n{}",
            self.trail()
        );
        let areas = self.areas();
        let acked: HashSet<String> = self.sink.acked().into_iter().collect();
        let mut seen: HashMap<&str, Area> = HashMap::new();
        for (area, ids) in &areas {
            for id in ids {
                if let Some(other) = seen.insert(id, *area) {
                    panic!("{id} is in {other:?} and {area:?}\n{}", self.trail());
                }
            }
        }
        for id in &self.promised {
            if !seen.contains_key(id.as_str()) && !acked.contains(id) && !self.deleted.contains(id)
            {
                panic!("{id} was answered Ok and is lost\n{}", self.trail());
            }
        }
        for entry in self.spool().parked_entries().expect("list") {
            if entry.reason.contains("damaged") {
                self.parked_damaged.insert(entry.id);
            } else if entry.event_id.is_none() && self.damaged.contains_key(&entry.id) {
                // The model's own parking gives its reason; any other names the damage.
                assert_eq!(
                    entry.reason,
                    "model",
                    "a damaged entry is parked with the reason {:?}\n{}",
                    entry.reason,
                    self.trail()
                );
            }
        }
        let spool = self.spool();
        let status = spool.status(100);
        let counts = (
            areas[&Area::Main].len() as u64,
            areas[&Area::Held].len() as u64,
            areas[&Area::Parked].len() as u64,
        );
        assert_eq!(
            (status.depth, status.held, status.parked),
            counts,
            "counts against the tables\n{}",
            self.trail()
        );
        // The key of a damaged record cannot be read: the ledger counts it only if it did
        // before the damage, and cannot count it out when the entry leaves the held area.
        let damaged_keys: HashSet<&str> = self
            .pushed
            .iter()
            .filter(|(id, _)| self.damaged.values().any(|d| d == id))
            .filter_map(|(_, k)| *k)
            .collect();
        if spool.restart_needed().is_none() {
            for key in KEYS.iter().flatten().filter(|k| !damaged_keys.contains(*k)) {
                let held = areas[&Area::Held].iter().any(|id| {
                    self.pushed
                        .iter()
                        .any(|(p, k)| p == id && k.as_deref() == Some(*key))
                });
                // The count of the held area's keys; `Spool::holds_key` also answers for the
                // keys of failed pushes still in doubt, which the order check covers.
                assert_eq!(
                    spool.ledger.holds_key(key),
                    held,
                    "guard key {key} held\n{}",
                    self.trail()
                );
            }
        }
    }

    /// Each guard key's events reach the broker in push order (first arrivals).
    fn check_order(&self) {
        let order: HashMap<&str, usize> = self
            .pushed
            .iter()
            .enumerate()
            .map(|(i, (id, _))| (id.as_str(), i))
            .collect();
        let key_of: HashMap<&str, &str> = self
            .pushed
            .iter()
            .filter_map(|(id, k)| k.map(|k| (id.as_str(), k)))
            .collect();
        let mut first = HashSet::new();
        let mut last_of_key: HashMap<&str, usize> = HashMap::new();
        let acked = self.sink.acked();
        for id in &acked {
            if !first.insert(id.as_str()) || self.parked_ever.contains(id) {
                continue;
            }
            let Some(key) = key_of.get(id.as_str()) else {
                continue;
            };
            let at = order[id.as_str()];
            if let Some(before) = last_of_key.insert(key, at) {
                let pushes: Vec<&String> = self
                    .pushed
                    .iter()
                    .filter(|(_, k)| k.as_deref() == Some(*key))
                    .map(|(id, _)| id)
                    .collect();
                let arrivals: Vec<&String> = acked
                    .iter()
                    .filter(|a| key_of.get(a.as_str()) == Some(key))
                    .collect();
                assert!(
                    before < at,
                    "guard key {key}: {id} reached the broker after a later event\npushed: {pushes:?}\narrived: {arrivals:?}\nparked: {:?}\n{}",
                    self.parked_ever,
                    self.trail()
                );
            }
        }
    }

    fn trail(&self) -> String {
        let from = self
            .log
            .len()
            .saturating_sub(env_u64("HOOKGATE_SPOOL_MODEL_TRAIL").map_or(30, |n| n as usize));
        format!("last steps:\n  {}", self.log[from..].join("\n  "))
    }
}

/// What the seeds run so far did, for the closing line.
#[derive(Default)]
struct Tally {
    seeds: u64,
    steps: u64,
    faults: u64,
    restarts: u64,
    cuts: u64,
    damage: Damage,
    /// Seeds that ended on an open refused on damage.
    refusals: u64,
    parked_damaged: u64,
    failures: Vec<u64>,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.seeds += other.seeds;
        self.steps += other.steps;
        self.faults += other.faults;
        self.restarts += other.restarts;
        self.cuts += other.cuts;
        self.damage.flips += other.damage.flips;
        self.damage.flips_at_rest += other.damage.flips_at_rest;
        self.damage.tears += other.damage.tears;
        self.damage.misdirects += other.damage.misdirects;
        self.damage.reorders += other.damage.reorders;
        self.refusals += other.refusals;
        self.parked_damaged += other.parked_damaged;
        self.failures.extend(&other.failures);
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = &self.damage;
        write!(
            f,
            "{} seeds, {} steps, {} injected faults, {} process restarts, {} power cuts; \
             damage {} ({} bits flipped in records, {} at rest, {} torn writes, {} misdirected, \
             {} reordering power cuts); {} opens refused on damage, {} entries parked as \
             damaged; {} failing seeds {:?}",
            self.seeds,
            self.steps,
            self.faults,
            self.restarts,
            self.cuts,
            d.total(),
            d.flips,
            d.flips_at_rest,
            d.tears,
            d.misdirects,
            d.reorders,
            self.refusals,
            self.parked_damaged,
            self.failures.len(),
            self.failures
        )
    }
}

/// Whether an open's error is the refusal of a damaged spool file, naming it.
fn refuses_damage(error: &str) -> bool {
    error.contains(SPOOL_FILE) && error.contains("is damaged")
}

async fn run_seed(seed: u64, steps: usize) -> Tally {
    let _report = SeedReport(seed);
    let mut run = Run::new(seed);
    let mut done = 0;
    while done < steps && run.refused.is_none() {
        run.step().await;
        done += 1;
        if run.refused.is_none() {
            run.check();
        }
    }
    if run.refused.is_none() {
        run.crash();
    }
    if run.refused.is_none() {
        run.check();
    }
    run.check_order();
    Tally {
        seeds: 1,
        steps: done as u64,
        faults: run.disk.faults_injected(),
        restarts: run.restarts,
        cuts: run.cuts,
        refusals: u64::from(run.refused.is_some()),
        parked_damaged: run.parked_damaged.len() as u64,
        damage: run.damage,
        failures: Vec::new(),
    }
}

/// Runs one seed on a runtime of its own, so that a failing seed neither stops the others
/// nor leaves its tasks behind: its tally, or the seed as a failure.
fn run_one(seed: u64, steps: usize) -> Tally {
    let outcome = std::panic::catch_unwind(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(run_seed(seed, steps))
    });
    outcome.unwrap_or_else(|_| Tally {
        seeds: 1,
        failures: vec![seed],
        ..Tally::default()
    })
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn the_spool_keeps_every_promised_entry_in_one_place_and_each_keys_order() {
    let mut tally = Tally::default();
    if let Some(seed) = env_u64("HOOKGATE_SPOOL_MODEL_SEED") {
        tally.add(&run_one(seed, STEPS));
        eprintln!("spool model: seed {seed}: {tally}");
    } else if let Some(secs) = env_u64("HOOKGATE_SPOOL_MODEL_SECS") {
        let end = Instant::now() + Duration::from_secs(secs);
        let start = Rng(std::process::id() as u64).next();
        let mut n = 0;
        while Instant::now() < end {
            tally.add(&run_one(start.wrapping_add(n), STEPS));
            n += 1;
        }
        eprintln!("spool model: seeds from {start}: {tally}");
    } else {
        for seed in 0..SEEDS {
            tally.add(&run_one(seed, STEPS));
        }
        eprintln!("spool model: {tally}");
    }
    assert!(tally.failures.is_empty(), "spool model: {tally}");
}
