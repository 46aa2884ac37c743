//! A read-only look at a stopped store: its runs and the journal batches they do not hold,
//! read without writing, renaming or deleting anything, so a tool can answer from a store
//! no process holds (and from one on a read-only file system).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use disk_seam::Disk;

use super::batch::decode_batch;
use super::{JOURNAL_DIR, RUNS_DIR};
use crate::run::Run;
use crate::runs::replaced_apart;
use crate::{Digest, Error};

/// The records of a store as its last open would have found them.
pub struct Snapshot {
    /// The journal's records the runs do not hold: key → (expiry, value), the newest.
    journal: HashMap<Digest, (i64, Vec<u8>)>,
    /// The runs that count, oldest first.
    runs: Vec<Arc<Run>>,
}

impl Snapshot {
    /// Reads the store folder `dir`. A folder without runs or a journal is an empty
    /// store; nothing in it is changed.
    pub fn open(disk: Arc<dyn Disk>, dir: &Path) -> Result<Self, Error> {
        let runs = read_runs(&*disk, &dir.join(RUNS_DIR))?;
        let held_by_runs = runs
            .iter()
            .map(|r| r.info().journal_below)
            .max()
            .unwrap_or(0);
        let mut journal = HashMap::new();
        super::super::wal::read_only(&*disk, &dir.join(JOURNAL_DIR), |seq, batch| {
            if seq < held_by_runs {
                return;
            }
            if let Some((_, records)) = decode_batch(batch) {
                for (key, expires_ms, value) in records {
                    journal.insert(key, (expires_ms, value.to_vec()));
                }
            }
        })?;
        Ok(Self { journal, runs })
    }

    /// The value of `key`, unless it expired by `now_ms`.
    pub fn get(&self, key: &Digest, now_ms: i64) -> Result<Option<Vec<u8>>, Error> {
        if let Some((expires_ms, value)) = self.journal.get(key) {
            return Ok((*expires_ms > now_ms).then(|| value.clone()));
        }
        for run in self.runs.iter().rev() {
            if !run.may_contain(key) {
                continue;
            }
            if let Some(record) = run.get(key)? {
                return Ok((record.expires_ms > now_ms).then_some(record.value));
            }
        }
        Ok(None)
    }
}

/// The runs in `dir` that count, oldest first: those a finished merge or rewrite replaced
/// (a crash left them) are passed over, as an open would delete them.
fn read_runs(disk: &dyn Disk, dir: &Path) -> Result<Vec<Arc<Run>>, Error> {
    if !disk.is_dir(dir) {
        return Ok(Vec::new());
    }
    let mut runs = Vec::new();
    for name in disk.list(dir)? {
        let path = dir.join(name);
        if path.extension().and_then(|e| e.to_str()) == Some("run") {
            runs.push(Arc::new(Run::open(disk, &path)?));
        }
    }
    Ok(replaced_apart(runs).0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Journal, Settings};
    use std::time::Duration;

    fn settings(disk: Arc<dyn Disk>) -> Settings {
        Settings {
            hot_entries: usize::MAX,
            ttl: Duration::from_secs(3600),
            clock: Arc::new(|| 0),
            segment_bytes: 1 << 16,
            commit_interval: Duration::from_millis(1),
            durable_wait: Duration::from_secs(5),
            needs_restart: Arc::new(|_| {}),
            disk,
            background: false,
            page_reads: crate::journal::read_here,
        }
    }

    fn files(dir: &Path) -> Vec<(std::path::PathBuf, u64)> {
        let mut out = Vec::new();
        for sub in [RUNS_DIR, JOURNAL_DIR] {
            for e in std::fs::read_dir(dir.join(sub)).expect("dir") {
                let e = e.expect("entry");
                out.push((e.path(), e.metadata().expect("meta").len()));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_snapshot_reads_runs_and_journal_newest_first_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = disk_seam::real();
        let key = |i: u8| Digest::of(&[i]);
        {
            let journal = Journal::open(
                Arc::new(crate::NoLegacy),
                dir.path(),
                0,
                settings(disk.clone()),
            )
            .expect("open");
            journal.put(&key(1), b"in a run", 100, 0).expect("put");
            journal.put(&key(2), b"old", 100, 0).expect("put");
            journal.write_now().expect("commit");
            journal.flush_to_run().expect("flush");
            journal.put(&key(2), b"new", 100, 0).expect("put");
            journal.put(&key(3), b"expires", 10, 0).expect("put");
            journal.write_now().expect("commit");
        }
        let before = files(dir.path());
        let snapshot = Snapshot::open(disk, dir.path()).expect("snapshot");
        assert_eq!(
            snapshot.get(&key(1), 5).expect("get").as_deref(),
            Some(&b"in a run"[..])
        );
        assert_eq!(
            snapshot.get(&key(2), 5).expect("get").as_deref(),
            Some(&b"new"[..])
        );
        assert_eq!(
            snapshot.get(&key(3), 5).expect("get").as_deref(),
            Some(&b"expires"[..])
        );
        assert_eq!(snapshot.get(&key(3), 10).expect("get"), None, "expired");
        assert_eq!(snapshot.get(&key(4), 5).expect("get"), None);
        assert_eq!(files(dir.path()), before, "the snapshot changed the store");
    }

    #[test]
    fn an_empty_folder_is_an_empty_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let snapshot = Snapshot::open(disk_seam::real(), dir.path()).expect("snapshot");
        assert_eq!(snapshot.get(&Digest::of(b"k"), 0).expect("get"), None);
        assert!(std::fs::read_dir(dir.path()).expect("dir").next().is_none());
    }
}
