//! The hot set to runs: a flush writes the entries whose records are on disk as a run and
//! forgets them and the journal batches the run holds; merges keep the runs few.

use std::sync::atomic::Ordering;

use super::batch::{decode_seq, Open, LEGACY_PAGE};
use super::copied::Copied;
use super::shared::{lock, Shared};
use crate::wal::Frame;
use crate::Error;

impl Shared {
    /// Writes what the open replayed from the journal to a run before anything is answered
    /// from it. A batch whose `fdatasync` failed still reads back from the page cache after a
    /// clean restart, yet a power cut loses it (Linux marks such pages clean), and a request
    /// answered from its values would then rest on nothing. The run is synced; the segments
    /// below it are no longer read. Without room for the run (a full disk), the segments
    /// replayed are written again where they are ([`Shared::rewrite_replayed`]). So are
    /// they when the replay read batches no run holds but kept nothing of them (a batch of
    /// no records, values that expired): the next batch is numbered after them, and were
    /// they lost at a power cut, the gap before it would read as damage. Batches replayed
    /// from elsewhere (legacy batches, a segment whose damage an operator accepted) have no
    /// such place: without room for their run the store does not open.
    pub(super) fn make_replay_durable(&self) -> Result<(), Error> {
        let read_past_runs = self.lock_open().seq > self.runs.journal_below();
        if self.hot_count.load(Ordering::Relaxed) == 0 && !read_past_runs {
            return Ok(());
        }
        match self.flush_to_run() {
            Ok(0) if read_past_runs && self.legacy.is_empty() => {
                self.rewrite_replayed()?;
                Ok(())
            }
            Err(Error::Disk(error)) if self.legacy.is_empty() => {
                if !self.rewrite_replayed()? {
                    return Err(Error::Disk(error));
                }
                tracing::warn!(%error, "replayed state journal not written to a run; its segments were made durable where they are");
                Ok(())
            }
            other => other.map(drop),
        }
    }

    /// Writes the replayed segments again as they read and syncs them, which needs no
    /// room, followed by a batch of no records that takes the next number, so that damage
    /// to the last batch replayed reads as damage, not as a commit a crash cut short
    /// ([`crate::wal::Wal::rewrite_sealed`]). False, writing nothing, if the open read a
    /// segment whose damage an operator accepted.
    fn rewrite_replayed(&self) -> Result<bool, Error> {
        // The writer's lock before the open batch's, as a commit takes them.
        let mut writer = lock(&self.writer);
        let mut open = self.lock_open();
        let mut mark = Open::reusing(open.seq, Vec::new());
        let mut frame = Frame {
            seq: mark.seq,
            bytes: &mut mark.buf,
        };
        if !writer.wal.rewrite_sealed(&mut frame)? {
            return Ok(false);
        }
        // Nothing was appended yet: the first batch takes the number after the mark.
        open.seq += 1;
        let durable_below = open.seq;
        self.progress.durable(durable_below);
        Ok(true)
    }

    /// Writes the hot entries whose records are on disk in the journal as a run, then
    /// forgets them and deletes the journal batches the run holds. Returns how many went.
    pub(super) fn flush_to_run(&self) -> Result<usize, Error> {
        let mut copy = lock(&self.flushing);
        let below = self.progress.get().durable_below;
        self.copy_written(below, &mut copy);
        if copy.is_empty() {
            return Ok(0);
        }
        let written = copy.len();
        let rewrite_after_ms = (self.settings.clock)().saturating_add(self.settings.ttl_ms());
        self.runs.flush(
            written as u64,
            copy.sorted_records(),
            below,
            rewrite_after_ms,
        )?;
        // The run is registered: lookups find these values there from now on.
        self.forget_written(below);
        lock(&self.writer).wal.forget_below(below)?;
        self.forget_legacy_below(below)?;
        self.ask(|a| a.merge = true);
        Ok(written)
    }

    /// Copies the hot entries' durable records that are in batches below `durable_below`,
    /// one map at a time: those a memory-only value covers too, since the journal no longer
    /// replays their batches once the run holds them.
    fn copy_written(&self, durable_below: u64, copy: &mut Copied) {
        copy.clear(self.settings.hot_entries);
        for shard in &self.shards {
            let shard = lock(shard);
            let written = shard
                .map
                .iter()
                .filter_map(|(key, e)| Some((key, e.durable_below(durable_below)?)));
            for (key, (value, expires_ms)) in written {
                copy.push(key, expires_ms, value);
            }
        }
    }

    /// Removes the legacy batches below `seq`: a run holds their records.
    fn forget_legacy_below(&self, seq: u64) -> Result<(), Error> {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = self.legacy.page(after.as_deref(), LEGACY_PAGE)?;
            let Some((last, _)) = page.last() else {
                return Ok(());
            };
            after = Some(last.clone());
            for (key, _) in page {
                if decode_seq(&key).is_some_and(|s| s >= seq) {
                    return Ok(());
                }
                self.legacy.remove(&key)?;
            }
        }
    }

    /// Deletes expired runs, then merges until nothing is due.
    pub(super) fn merge_due(&self) -> Result<(), Error> {
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
}
