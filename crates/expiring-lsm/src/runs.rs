//! The state that left the hot set: sorted run files in one directory, newest first for
//! lookups. Memory per run is its filter and page index (about 1 byte a record), whatever
//! the values; the records stay on disk.
//!
//! A flush of the hot set writes a level-0 run. [`FANOUT`] neighbouring runs of one level
//! are merged into one run of the next level, which keeps the number of runs (each is one
//! filter check per lookup) logarithmic in the number of records. A merge keeps the newest
//! record of each key and drops expired ones; a run whose records have all expired is
//! deleted whole; a run that long-lived records (a STOP kept forever) hold past its time is
//! rewritten alone, so expired marks do not stay on disk beside them. A rewrite keeps its
//! source's span and takes the next generation: its file has a name of its own, and a
//! crash that leaves it beside its source opens to the rewrite.
//!
//! Records expire no earlier than the records they supersede (the journal keeps that rule
//! when it writes), so dropping an expired record never brings an older value back.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use crate::run::{Record, Run, RunInfo, RunRecords, RunWriter};
use crate::Digest;
use crate::Error;
use disk_seam::Disk;

/// Runs of one level merged at once.
pub const FANOUT: usize = 4;

/// The runs of a store, oldest first.
pub struct Runs {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    /// Replaced whole on every change, so a lookup reads a snapshot without holding a lock
    /// across its disk reads.
    list: RwLock<Arc<Vec<Arc<Run>>>>,
    /// The next flush's number: above every run's span, also those deleted since.
    next_flush: AtomicU64,
    /// Runs a merge found damaged: merges leave them (each would fail at the damage
    /// again), reads of their damaged pages still fail.
    damaged: Mutex<HashSet<PathBuf>>,
}

impl Runs {
    /// Opens the runs in `dir` (created if absent). Unfinished runs (temporary files) are
    /// deleted, and so are runs that a finished merge or rewrite replaced.
    pub fn open(disk: Arc<dyn Disk>, dir: &Path) -> Result<Self, Error> {
        disk_seam::create_dir_all(&*disk, dir)?;
        // A run renamed into place whose folder's sync then failed is whole but its name
        // is not durable: made durable before the journal deletes the segments it holds.
        disk.sync_dir(dir)?;
        let mut runs = Vec::new();
        for name in disk.list(dir)? {
            let path = dir.join(name);
            match path.extension().and_then(|e| e.to_str()) {
                Some("run") => runs.push(Arc::new(Run::open(&*disk, &path)?)),
                Some("tmp") => disk.remove(&path)?,
                _ => {}
            }
        }
        let (kept, replaced) = replaced_apart(runs);
        for run in replaced {
            disk.remove(run.path())?;
        }
        let next_flush = kept.last().map_or(0, |r| r.info().last + 1);
        Ok(Self {
            disk,
            dir: dir.to_owned(),
            list: RwLock::new(Arc::new(kept)),
            next_flush: AtomicU64::new(next_flush),
            damaged: Mutex::default(),
        })
    }

    /// The runs now, oldest first.
    pub fn snapshot(&self) -> Arc<Vec<Arc<Run>>> {
        self.list
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether a run's filter says it may hold `key`. Read under the list's lock, without a
    /// snapshot: every lookup of a key the hot set lacks asks it first.
    pub fn may_contain(&self, key: &Digest) -> bool {
        self.list
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|run| run.may_contain(key))
    }

    /// The newest record of `key` on disk.
    pub fn get(&self, key: &Digest) -> Result<Option<Record>, Error> {
        for run in self.snapshot().iter().rev() {
            if let Some(record) = run.get(key)? {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }

    /// Journal batches below this are held by the runs.
    pub fn journal_below(&self) -> u64 {
        self.snapshot()
            .iter()
            .map(|r| r.info().journal_below)
            .max()
            .unwrap_or(0)
    }

    /// Records held on disk, superseded and expired ones included until a merge drops them.
    pub fn entries(&self) -> u64 {
        self.snapshot().iter().map(|r| r.info().entries).sum()
    }

    /// Bytes of memory held by the runs' filters and indexes.
    pub fn memory_bytes(&self) -> usize {
        self.snapshot().iter().map(|r| r.memory_bytes()).sum()
    }

    /// Writes `count` records (given in key order by `records`) as the newest run, holding
    /// the journal below `journal_below`; due for a rewrite at `rewrite_after_ms`.
    pub fn flush<'a>(
        &self,
        count: u64,
        records: impl Iterator<Item = (&'a Digest, i64, &'a [u8])>,
        journal_below: u64,
        rewrite_after_ms: i64,
    ) -> Result<(), Error> {
        let id = self.next_flush.fetch_add(1, Ordering::SeqCst);
        let info = RunInfo {
            first: id,
            last: id,
            level: 0,
            generation: 0,
            entries: 0,
            max_expires_ms: 0,
            journal_below,
            rewrite_after_ms,
        };
        let mut writer =
            RunWriter::create(self.disk.clone(), &self.dir, &format!("flush-{id}"), count)?;
        for (key, expires_ms, value) in records {
            if let Err(error) = writer.push_parts(key, expires_ms, value) {
                writer.discard();
                return Err(error);
            }
        }
        let run = Arc::new(Run::open(&*self.disk, &writer.finish(info)?)?);
        self.replace(&[], Some(run));
        Ok(())
    }

    /// Deletes the runs whose every record expired by `now_ms`; returns how many records
    /// went.
    pub fn drop_expired(&self, now_ms: i64) -> Result<u64, Error> {
        let expired: Vec<Arc<Run>> = self
            .snapshot()
            .iter()
            .filter(|r| r.info().max_expires_ms <= now_ms)
            .cloned()
            .collect();
        let records = expired.iter().map(|r| r.info().entries).sum();
        if !expired.is_empty() {
            for run in &expired {
                self.replace(std::slice::from_ref(run), None);
                self.disk.remove(run.path())?;
            }
            self.disk.sync_dir(&self.dir)?;
        }
        Ok(records)
    }

    /// Runs a merge found damaged and leaves from now on.
    pub fn damaged(&self) -> usize {
        lock(&self.damaged).len()
    }

    /// Does one merge or rewrite if one is due; returns whether it did. `ttl_ms` sets when
    /// the new run is due for a rewrite. A merge of many records gives up (leaving its
    /// sources as they were) once `stop` says so: a shutdown does not wait for it. A source
    /// found damaged fails the merge once and is left by every merge after it.
    pub fn merge_one(
        &self,
        now_ms: i64,
        ttl_ms: i64,
        stop: &dyn Fn() -> bool,
    ) -> Result<bool, Error> {
        let runs = self.snapshot();
        let damaged = lock(&self.damaged).clone();
        let group = due_group(&runs, now_ms, &|run| damaged.contains(run.path()));
        let Some((from, to)) = group else {
            return Ok(false);
        };
        let sources = &runs[from..to];
        let info = merged_info(sources, now_ms, ttl_ms)?;
        let merged = match self.write_merged(sources, info, now_ms, stop) {
            Err(Error::Damaged { file, offset, what }) => {
                if sources.iter().any(|s| s.path() == file) {
                    lock(&self.damaged).insert(file.clone());
                }
                return Err(Error::Damaged { file, offset, what });
            }
            other => other?,
        };
        self.replace(sources, merged);
        for source in sources {
            self.disk.remove(source.path())?;
        }
        self.disk.sync_dir(&self.dir)?;
        Ok(true)
    }

    /// Writes the records of `sources` that have not expired by `now_ms`, each key's newest,
    /// as the run `info` describes. `None` if no record is left: the sources just go (an
    /// empty run would only cost a check).
    fn write_merged(
        &self,
        sources: &[Arc<Run>],
        info: RunInfo,
        now_ms: i64,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<Arc<Run>>, Error> {
        let capacity = sources.iter().map(|r| r.info().entries).sum();
        let mut streams = sources
            .iter()
            .map(|r| r.records())
            .collect::<Result<Vec<_>, _>>()?;
        let mut writer = RunWriter::create(
            self.disk.clone(),
            &self.dir,
            &format!("merge-{}", info.first),
            capacity,
        )?;
        let merged = merge_newest(&mut streams, |record| {
            if writer.entries() % 65_536 == 0 && stop() {
                return Err(Error::Stopped("merge given up at shutdown".into()));
            }
            if record.expires_ms > now_ms {
                writer.push(&record)?;
            }
            Ok(())
        });
        if let Err(error) = merged {
            writer.discard();
            return Err(error);
        }
        if writer.entries() == 0 {
            writer.abandon()?;
            return Ok(None);
        }
        Ok(Some(Arc::new(Run::open(
            &*self.disk,
            &writer.finish(info)?,
        )?)))
    }

    /// Replaces `old` (neighbours in the list) with `new` at their place, or appends `new`
    /// as the newest run when `old` is empty.
    fn replace(&self, old: &[Arc<Run>], new: Option<Arc<Run>>) {
        let mut list = self.list.write().unwrap_or_else(PoisonError::into_inner);
        let mut next: Vec<Arc<Run>> = Vec::with_capacity(list.len() + 1);
        let mut placed = false;
        for run in list.iter() {
            if old.iter().any(|o| Arc::ptr_eq(o, run)) {
                if !placed {
                    next.extend(new.clone());
                    placed = true;
                }
            } else {
                next.push(run.clone());
            }
        }
        if !placed {
            next.extend(new);
        }
        *list = Arc::new(next);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The first group of runs due for work, as a range of `runs`: a run past its rewrite time
/// whose records have not all expired, or [`FANOUT`] neighbours of one level; none of them
/// `set_aside`.
fn due_group(
    runs: &[Arc<Run>],
    now_ms: i64,
    set_aside: &dyn Fn(&Run) -> bool,
) -> Option<(usize, usize)> {
    if let Some(i) = runs.iter().position(|r| {
        r.info().rewrite_after_ms <= now_ms && r.info().max_expires_ms > now_ms && !set_aside(r)
    }) {
        return Some((i, i + 1));
    }
    (0..runs.len().saturating_sub(FANOUT - 1)).find_map(|i| {
        let level = runs[i].info().level;
        runs[i..i + FANOUT]
            .iter()
            .all(|r| r.info().level == level && !set_aside(r))
            .then_some((i, i + FANOUT))
    })
}

/// The header of the run that replaces `sources`: a merge is one level up, a rewrite alone
/// keeps its source's span and level and takes the next generation, so its file has a name
/// of its own and deleting the source does not delete the rewrite.
fn merged_info(sources: &[Arc<Run>], now_ms: i64, ttl_ms: i64) -> Result<RunInfo, Error> {
    let (level, generation) = if let [source] = sources {
        let source = source.info();
        let generation = source.generation.checked_add(1).ok_or_else(|| {
            Error::Corrupt(format!("state run {}: generations exhausted", source.first).into())
        })?;
        (source.level, generation)
    } else {
        (sources[0].info().level + 1, 0)
    };
    Ok(RunInfo {
        first: sources[0].info().first,
        last: sources[sources.len() - 1].info().last,
        level,
        generation,
        entries: 0,
        max_expires_ms: 0,
        journal_below: sources
            .iter()
            .map(|r| r.info().journal_below)
            .max()
            .unwrap_or(0),
        rewrite_after_ms: now_ms.saturating_add(ttl_ms),
    })
}

/// Feeds `out` the records of `streams` (each sorted by key, oldest stream first) in key
/// order, the newest stream's record where several hold a key.
fn merge_newest(
    streams: &mut [RunRecords],
    mut out: impl FnMut(Record) -> Result<(), Error>,
) -> Result<(), Error> {
    // Smallest key first; for equal keys, the newest stream first.
    let mut heads = BinaryHeap::new();
    let mut pending: Vec<Option<Record>> = Vec::with_capacity(streams.len());
    for (i, stream) in streams.iter_mut().enumerate() {
        let head = stream.next().transpose()?;
        if let Some(r) = &head {
            heads.push(Reverse((r.key.0, Reverse(i))));
        }
        pending.push(head);
    }
    let mut last: Option<[u8; 16]> = None;
    while let Some(Reverse((key, Reverse(i)))) = heads.pop() {
        let Some(record) = pending[i].take() else {
            continue;
        };
        let next = streams[i].next().transpose()?;
        if let Some(r) = &next {
            heads.push(Reverse((r.key.0, Reverse(i))));
        }
        pending[i] = next;
        if last == Some(key) {
            continue; // an older stream's record of a key already written
        }
        last = Some(key);
        out(record)?;
    }
    Ok(())
}

/// `runs` split into those that count, oldest first, and those a finished merge or rewrite
/// replaced. A merge writes its run before it deletes its sources: a crash in between
/// leaves sources whose span lies inside the merged run's. A rewrite's source has the same
/// span and a lower generation: the rewrite comes first below and covers it.
pub(crate) fn replaced_apart(mut runs: Vec<Arc<Run>>) -> (Vec<Arc<Run>>, Vec<Arc<Run>>) {
    runs.sort_by_key(|r| (r.info().last, Reverse(r.info().first), r.info().generation));
    let mut kept: Vec<Arc<Run>> = Vec::with_capacity(runs.len());
    let mut replaced = Vec::new();
    for run in runs.into_iter().rev() {
        let covered = kept
            .iter()
            .any(|k| k.info().first <= run.info().first && run.info().last <= k.info().last);
        if covered {
            replaced.push(run);
        } else {
            kept.push(run);
        }
    }
    kept.reverse();
    (kept, replaced)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str, expires_ms: i64, value: &str) -> Record {
        Record {
            key: Digest::of(key.as_bytes()),
            expires_ms,
            value: value.as_bytes().to_vec(),
        }
    }

    fn sorted(mut records: Vec<Record>) -> Vec<Record> {
        records.sort_by_key(|r| r.key.0);
        records
    }

    fn flush(runs: &Runs, records: &[Record], journal_below: u64, rewrite_after_ms: i64) {
        let parts = records
            .iter()
            .map(|r| (&r.key, r.expires_ms, r.value.as_slice()));
        runs.flush(records.len() as u64, parts, journal_below, rewrite_after_ms)
            .expect("flush");
    }

    fn value(runs: &Runs, key: &str) -> Option<String> {
        runs.get(&Digest::of(key.as_bytes()))
            .expect("get")
            .map(|r| String::from_utf8(r.value).expect("utf8"))
    }

    #[test]
    fn the_newest_run_wins_and_merges_keep_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("open");
        for round in 0..FANOUT {
            let records = sorted(vec![
                record("shared", 1_000, &format!("v{round}")),
                record(&format!("own{round}"), 1_000, "x"),
                record(&format!("gone{round}"), 10, "x"),
            ]);
            flush(&runs, &records, round as u64 + 1, 5_000);
        }
        assert_eq!(runs.snapshot().len(), FANOUT);
        assert_eq!(value(&runs, "shared").as_deref(), Some("v3"));
        assert!(
            runs.merge_one(100, 5_000, &|| false).expect("merge"),
            "four level-0 runs merge"
        );
        let after = runs.snapshot();
        assert_eq!(after.len(), 1);
        assert_eq!(after[0].info().level, 1);
        assert_eq!(after[0].info().journal_below, FANOUT as u64);
        assert_eq!(
            after[0].info().entries,
            1 + FANOUT as u64,
            "one shared, four own"
        );
        assert_eq!(value(&runs, "shared").as_deref(), Some("v3"));
        assert_eq!(value(&runs, "own0").as_deref(), Some("x"));
        assert_eq!(
            value(&runs, "gone0"),
            None,
            "expired records are not merged"
        );
        assert!(
            !runs.merge_one(100, 5_000, &|| false).expect("merge"),
            "nothing due"
        );
        // Reopened, the merged run stands alone: its sources' files are gone.
        drop(runs);
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("reopen");
        assert_eq!(runs.snapshot().len(), 1);
        assert_eq!(value(&runs, "shared").as_deref(), Some("v3"));
    }

    #[test]
    fn a_damaged_run_a_merge_meets_is_set_aside_once_and_the_others_merge_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("open");
        for round in 0..=FANOUT {
            let records = sorted(vec![
                record(&format!("a{round}"), 1_000, "x"),
                record(&format!("b{round}"), 1_000, "y"),
            ]);
            flush(&runs, &records, round as u64 + 1, 5_000);
        }
        // A bit flips in the oldest run's page.
        let oldest = runs.snapshot()[0].path().to_owned();
        let mut bytes = std::fs::read(&oldest).expect("read");
        bytes[100] ^= 0x04;
        std::fs::write(&oldest, &bytes).expect("write");

        let first = runs.merge_one(100, 5_000, &|| false);
        assert!(
            matches!(first, Err(Error::Damaged { ref file, .. }) if *file == oldest),
            "{first:?}"
        );
        assert_eq!(runs.damaged(), 1);
        assert!(
            runs.merge_one(100, 5_000, &|| false)
                .expect("no retry of the damaged run"),
            "the four after it merge"
        );
        assert!(!runs.merge_one(100, 5_000, &|| false).expect("nothing due"));
        let after = runs.snapshot();
        assert_eq!(after.len(), 2);
        assert_eq!(after[0].path(), oldest, "kept, in its place");
        assert_eq!(value(&runs, "a4").as_deref(), Some("x"));
        assert!(runs.get(&Digest::of(b"a0")).is_err(), "never answered from");
    }

    #[test]
    fn merges_keep_their_place_and_reopens_keep_every_run() {
        let dir = tempfile::tempdir().expect("tempdir");
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("open");
        let levels = |runs: &Runs| {
            runs.snapshot()
                .iter()
                .map(|r| r.info().level)
                .collect::<Vec<_>>()
        };
        for round in 0..FANOUT {
            flush(
                &runs,
                &[record("k", 1_000, &format!("old{round}"))],
                0,
                5_000,
            );
        }
        flush(&runs, &[record("k", 1_000, "newest")], 0, 5_000);
        assert!(runs.merge_one(0, 5_000, &|| false).expect("merge"));
        // The merged run takes its sources' place, behind the newer run.
        assert_eq!(levels(&runs), vec![1, 0]);
        assert_eq!(value(&runs, "k").as_deref(), Some("newest"));
        for round in 0..FANOUT - 1 {
            flush(
                &runs,
                &[record(&format!("more{round}"), 1_000, "m")],
                0,
                5_000,
            );
        }
        // Four level-0 runs behind a level-1 run merge with each other, not with it.
        assert!(runs.merge_one(0, 5_000, &|| false).expect("merge"));
        assert_eq!(levels(&runs), vec![1, 1]);
        drop(runs);
        // Neither run's span lies inside the other's: both stay, and a new flush after the
        // reopen gets a span of its own, which the next reopen keeps too.
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("reopen");
        assert_eq!(levels(&runs), vec![1, 1]);
        flush(&runs, &[record("later", 1_000, "l")], 0, 5_000);
        drop(runs);
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("reopen");
        assert_eq!(levels(&runs), vec![1, 1, 0]);
        assert_eq!(value(&runs, "k").as_deref(), Some("newest"));
        assert_eq!(value(&runs, "more0").as_deref(), Some("m"));
        assert_eq!(value(&runs, "later").as_deref(), Some("l"));
    }

    #[test]
    fn sources_left_by_a_crash_during_a_merge_are_deleted_at_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("open");
        for round in 0..FANOUT {
            flush(&runs, &[record("k", 1_000, &format!("v{round}"))], 0, 5_000);
        }
        let copies = tempfile::tempdir().expect("tempdir");
        for run in runs.snapshot().iter() {
            let name = run.path().file_name().expect("name");
            std::fs::copy(run.path(), copies.path().join(name)).expect("copy");
        }
        runs.merge_one(0, 5_000, &|| false).expect("merge");
        drop(runs);
        // The merged run and its sources side by side, plus an unfinished run.
        for entry in std::fs::read_dir(copies.path()).expect("dir") {
            let path = entry.expect("entry").path();
            std::fs::copy(&path, dir.path().join(path.file_name().expect("name"))).expect("copy");
        }
        std::fs::write(dir.path().join("flush-9.tmp"), b"half").expect("tmp");
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("reopen");
        assert_eq!(runs.snapshot().len(), 1, "the merged run alone");
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
        assert_eq!(value(&runs, "k").as_deref(), Some("v3"));
    }

    #[test]
    fn expired_runs_go_whole_and_long_lived_records_are_rewritten_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("open");
        flush(&runs, &[record("short", 100, "s")], 1, 1_000);
        flush(
            &runs,
            &sorted(vec![
                record("forever", i64::MAX, "f"),
                record("mark", 1_500, "m"),
            ]),
            2,
            1_000,
        );
        assert_eq!(runs.drop_expired(100).expect("drop"), 1);
        assert_eq!(runs.snapshot().len(), 1);
        assert!(
            !runs.merge_one(999, 1_000, &|| false).expect("merge"),
            "not due yet"
        );
        assert!(
            runs.merge_one(1_000, 1_000, &|| false).expect("rewrite"),
            "due"
        );
        let after = runs.snapshot();
        assert_eq!(after.len(), 1);
        assert_eq!(after[0].info().entries, 2, "the mark lives until 1500");
        assert!(
            runs.merge_one(2_000, 1_000, &|| false).expect("rewrite"),
            "due again"
        );
        assert_eq!(runs.snapshot()[0].info().entries, 1);
        assert_eq!(value(&runs, "forever").as_deref(), Some("f"));
        assert_eq!(value(&runs, "mark"), None);
        assert_eq!(runs.journal_below(), 2);
    }

    #[test]
    fn a_failed_flush_or_merge_leaves_no_temporary_file() {
        use disk_seam::sim::{Fault, OpKind, SimDisk};
        let disk = SimDisk::new(1);
        let dir = Path::new("/store/state-runs");
        let runs = Runs::open(disk.handle(), dir).expect("open");
        let tmp_files = || {
            disk.files_under(dir)
                .into_iter()
                .filter(|p| p.extension().is_some_and(|e| e == "tmp"))
                .collect::<Vec<_>>()
        };
        let one = |i: usize| [record(&format!("k{i}"), 1_000, "v")];
        // A full disk at the write, a failing sync, a failing rename: each try fails, and
        // none leaves its file.
        for (i, (kind, fault)) in [
            (OpKind::Write, Fault::NoSpace),
            (OpKind::Sync, Fault::Io),
            (OpKind::Rename, Fault::Io),
        ]
        .into_iter()
        .enumerate()
        {
            disk.fail_next(kind, fault);
            let records = one(i);
            let parts = records
                .iter()
                .map(|r| (&r.key, r.expires_ms, r.value.as_slice()));
            let failed = runs.flush(1, parts, 0, 5_000);
            assert!(failed.is_err(), "{kind:?} {fault:?} injected");
            assert_eq!(
                tmp_files(),
                Vec::<PathBuf>::new(),
                "after {kind:?} {fault:?}"
            );
        }
        for i in 0..FANOUT {
            flush(&runs, &one(i), 0, 5_000);
        }
        disk.fail_next(OpKind::Sync, Fault::NoSpace);
        assert!(runs.merge_one(0, 5_000, &|| false).is_err());
        assert_eq!(tmp_files(), Vec::<PathBuf>::new(), "after a failed merge");
        assert!(runs.merge_one(0, 5_000, &|| false).expect("merge"));
        assert_eq!(value(&runs, "k3").as_deref(), Some("v"));
    }

    fn run_files(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .collect();
        files.sort();
        files
    }

    /// Runs in a folder of their own, holding one run: a record that never expires and one
    /// that expires at 1_500, the run due for a rewrite at 1_000.
    fn a_run_of_a_stop_and_a_mark() -> (tempfile::TempDir, Runs) {
        let dir = tempfile::tempdir().expect("tempdir");
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("open");
        let records = sorted(vec![
            record("stop", i64::MAX, "opted out"),
            record("mark", 1_500, "m"),
        ]);
        flush(&runs, &records, 1, 1_000);
        (dir, runs)
    }

    #[test]
    fn a_run_rewritten_alone_keeps_its_file_and_its_records_through_a_reopen() {
        let (dir, runs) = a_run_of_a_stop_and_a_mark();
        for (now, rewrites_left) in [(1_000, 2), (2_000, 1), (3_000, 0)] {
            assert!(
                runs.merge_one(now, 1_000, &|| false).expect("rewrite"),
                "due at {now}"
            );
            assert_eq!(
                run_files(dir.path()).len(),
                1,
                "one run file after a rewrite ({rewrites_left} to go): {:?}",
                run_files(dir.path())
            );
        }
        assert_eq!(value(&runs, "stop").as_deref(), Some("opted out"));
        drop(runs);
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("reopen");
        assert_eq!(
            value(&runs, "stop").as_deref(),
            Some("opted out"),
            "the long-lived record outlives its run's rewrites and a reopen"
        );
        assert_eq!(value(&runs, "mark"), None);
        assert_eq!(runs.journal_below(), 1);
    }

    #[test]
    fn a_crash_between_a_rewrite_and_the_deletion_of_its_source_opens_to_the_rewrite() {
        let (dir, runs) = a_run_of_a_stop_and_a_mark();
        let copies = tempfile::tempdir().expect("tempdir");
        for source in run_files(dir.path()) {
            let name = source.file_name().expect("name");
            std::fs::copy(&source, copies.path().join(name)).expect("copy");
        }
        assert!(runs.merge_one(2_000, 1_000, &|| false).expect("rewrite"));
        drop(runs);
        // The rewrite's file beside its source, as a crash before the unlink leaves them.
        for source in run_files(copies.path()) {
            let target = dir.path().join(source.file_name().expect("name"));
            assert!(!target.exists(), "the rewrite took its source's name");
            std::fs::copy(&source, target).expect("copy");
        }
        assert_eq!(run_files(dir.path()).len(), 2);
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("reopen");
        assert_eq!(runs.snapshot().len(), 1, "the rewrite alone");
        assert_eq!(
            runs.snapshot()[0].info().entries,
            1,
            "the rewrite, not its source"
        );
        assert_eq!(run_files(dir.path()).len(), 1, "the source is deleted");
        assert_eq!(value(&runs, "stop").as_deref(), Some("opted out"));
        // Rewritten again after the reopen, the run still gets a name of its own.
        assert!(runs.merge_one(3_000, 1_000, &|| false).expect("rewrite"));
        drop(runs);
        let runs = Runs::open(disk_seam::real(), dir.path()).expect("reopen");
        assert_eq!(value(&runs, "stop").as_deref(), Some("opted out"));
    }
}
