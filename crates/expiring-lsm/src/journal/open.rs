//! Opening the store: its folders, the runs, the replay of the journal batches the runs do
//! not hold (legacy batches first, then the segments), and the threads.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::batch::{decode_batch, decode_seq, Open, LEGACY_PAGE};
use super::copied::Copied;
use super::hot::{shard_of, Entry, Shard, SHARDS};
use super::progress::Published;
use super::settings::Settings;
use super::shared::{Asked, Shared, Writer};
use super::{threads, Journal};
use super::{JOURNAL_DIR, RUNS_DIR};
use crate::runs::Runs;
use crate::wal::Wal;
use crate::{Error, LegacyBatches};
use disk_seam::Disk;

impl Journal {
    /// Opens the runs and the journal in the store folder `dir`, replays the journal
    /// batches the runs do not hold (values that expired by `now_ms` are dropped) and
    /// starts the threads. Batches of a store written before the journal had files are
    /// read from `legacy` first; a store written before runs existed holds
    /// its whole state there: the replay reads it, and the first flush moves it to runs.
    /// A `ttl` of zero is refused.
    pub fn open(
        legacy: Arc<dyn LegacyBatches>,
        dir: &Path,
        now_ms: i64,
        settings: Settings,
    ) -> Result<Arc<Self>, Error> {
        if settings.ttl.is_zero() {
            // A run is rewritten `ttl` after it was written: with zero, every rewrite
            // would be due again at once, and the merge thread would never stop.
            return Err(Error::Open {
                path: dir.to_owned(),
                reason: "ttl must be longer than zero".into(),
            });
        }
        sync_store_folder(&*settings.disk, dir)?;
        let runs = Runs::open(settings.disk.clone(), &dir.join(RUNS_DIR))?;
        let mut replay = Replay::new(runs.journal_below());
        replay.legacy(&*legacy)?;
        let journal_dir = dir.join(JOURNAL_DIR);
        let wal = replay.segments(&settings, &journal_dir)?;
        let shared = Arc::new(Shared::new(
            replay,
            wal,
            legacy,
            runs,
            journal_dir,
            settings,
        ));
        shared.forget_expired(now_ms);
        shared.make_replay_durable()?;
        let owes = shared.owes();
        if owes {
            shared.failing.store(true, Ordering::SeqCst);
            tracing::error!("state journal opened without a segment to write to (a full disk?): nothing is durable until it has one (retried every second)");
        }
        let threads = threads::start(&shared)?;
        shared.ask_flush_if_full();
        shared.ask(|a| {
            a.merge = true;
            a.spare = true;
            a.recover = owes;
        });
        Ok(Arc::new(Self { shared, threads }))
    }
}

/// Creates the store folder `dir` and syncs its own entry: a power cut that takes the
/// folder back takes every run and segment in it. Its subfolders are synced into it as
/// they are made.
fn sync_store_folder(disk: &dyn Disk, dir: &Path) -> Result<(), Error> {
    if let Some(e) = disk_seam::create_store_folder(disk, dir)? {
        let parent = disk_seam::parent_of(dir);
        tracing::warn!(error = %e, dir = %parent.display(), "store folder's parent not synced");
    }
    Ok(())
}

/// The hot set as the replay of the journal rebuilds it.
struct Replay {
    shards: Vec<Shard>,
    /// Journal batches below it are held by runs: they are not replayed.
    held_by_runs: u64,
    /// The sequence number of the first batch written after the open.
    next_seq: u64,
}

impl Replay {
    fn new(held_by_runs: u64) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            held_by_runs,
            next_seq: held_by_runs,
        }
    }

    /// Puts the records of batch `seq` in the hot set, over those of earlier batches.
    fn batch(&mut self, seq: u64, batch: &[u8]) {
        let Some((_, records)) = decode_batch(batch) else {
            tracing::warn!(batch = seq, "unreadable state batch ignored");
            return;
        };
        for (key, expires_ms, value) in records {
            let entry = Entry::new(value, expires_ms, Some(seq));
            self.shards[shard_of(&key)].map.insert(key, entry);
        }
    }

    /// Replays the legacy batches no run holds, and removes those a run holds.
    fn legacy(&mut self, legacy: &dyn LegacyBatches) -> Result<(), Error> {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = legacy.page(after.as_deref(), LEGACY_PAGE)?;
            let Some((last, _)) = page.last() else {
                return Ok(());
            };
            after = Some(last.clone());
            for (key, value) in page {
                let Some(seq) = decode_seq(&key) else {
                    continue;
                };
                if seq < self.held_by_runs {
                    // Its records are in a run; the flush that wrote it did not get to
                    // delete the batch.
                    legacy.remove(&key)?;
                    continue;
                }
                self.next_seq = seq + 1;
                self.batch(seq, &value);
            }
        }
    }

    /// Opens the journal's segments in `journal_dir`, replays the batches no run holds and
    /// deletes the segments runs hold whole.
    fn segments(&mut self, settings: &Settings, journal_dir: &Path) -> Result<Wal, Error> {
        let held_by_runs = self.held_by_runs;
        let (mut wal, highest) = Wal::open(
            settings.disk.clone(),
            journal_dir,
            settings.segment_bytes,
            held_by_runs,
            |seq, batch| {
                // Batches a run holds are left for the run (see `a_batch_a_run_holds…`).
                if seq >= held_by_runs {
                    self.batch(seq, batch);
                }
            },
        )?;
        wal.forget_below(held_by_runs)?;
        self.next_seq = highest.map_or(self.next_seq, |h| self.next_seq.max(h + 1));
        Ok(wal)
    }
}

impl Shared {
    /// What the journal's callers and threads share, from the replayed hot set and the
    /// opened journal.
    fn new(
        replay: Replay,
        wal: Wal,
        legacy: Arc<dyn LegacyBatches>,
        runs: Runs,
        journal_dir: PathBuf,
        settings: Settings,
    ) -> Self {
        let hot_count = replay.shards.iter().map(|s| s.map.len()).sum();
        Self {
            shards: replay.shards.into_iter().map(Mutex::new).collect(),
            open: Mutex::new(Open::new(replay.next_seq)),
            wake: Condvar::new(),
            writer_sleeps: AtomicBool::new(false),
            writer_idles: AtomicBool::new(false),
            writer: Mutex::new(Writer {
                wal,
                pending: Vec::new(),
                reusable: None,
            }),
            journal_dir,
            spares: AtomicU64::new(0),
            legacy,
            runs,
            settings,
            hot_count: AtomicUsize::new(hot_count),
            asked: Mutex::new(Asked::default()),
            flushing: Mutex::new(Copied::default()),
            merging: Mutex::new(()),
            asked_wake: Condvar::new(),
            stop: AtomicBool::new(false),
            failing: AtomicBool::new(false),
            flush_failing: AtomicBool::new(false),
            writing_since: Mutex::new(None),
            #[cfg(test)]
            flush_passes: AtomicU64::new(0),
            progress: Published::new(replay.next_seq),
            waited_below: AtomicU64::new(0),
        }
    }
}
