//! Group commits: records go to the open batch, and the writer writes every batch taken
//! from memory to the journal with one `fdatasync`, then tells the waiting callers.

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use super::batch::Open;
use super::progress::SyncPoint;
use super::shared::{lock, Shared, Writer};
use crate::wal::{Frame, Wal};
use crate::{Digest, Error};

impl Shared {
    pub(super) fn lock_open(&self) -> MutexGuard<'_, Open> {
        lock(&self.open)
    }

    /// Appends a durable record to the open batch and returns the batch's sequence number.
    /// The caller holds the key's shard lock.
    pub(super) fn append(&self, key: &Digest, expires_ms: i64, value: &[u8], now_ms: i64) -> u64 {
        let mut open = self.lock_open();
        let was_empty = open.is_empty();
        let seq = open.append(key, expires_ms, value, now_ms);
        // An idle writer sleeps until woken: wake it for the first record of a batch, so
        // that it commits the batch once a caller waits for it, or after `UNASKED_WAIT` if
        // none does. A writer that committed lately sleeps `UNASKED_WAIT` at most and needs
        // no wake-up for this record: only for the caller's wait.
        if was_empty && self.writer_idles.load(Ordering::Relaxed) {
            self.wake.notify_one();
        }
        seq
    }

    /// A caller waits for `point`: if the open batch is below it, the writer commits that
    /// batch as soon as its last commit ends. A request's records (its guard state, then
    /// its marks) thus share one commit, which starts when the request waits, not at its
    /// first record.
    pub(super) fn ask_commit(&self, point: SyncPoint) {
        let mut open = self.lock_open();
        if point.0 > open.seq && !open.is_empty() && !open.asked {
            open.asked = true;
            if self.writer_sleeps.load(Ordering::Relaxed) {
                self.wake.notify_one();
            }
        }
    }

    pub(super) fn write_now(&self) -> Result<(), Error> {
        let mut writer = lock(&self.writer);
        self.write_open(&mut writer)
    }

    /// Writes the open batch (and, first, any earlier one a failed write left) and syncs
    /// it; the caller holds `writer`. While a failed batch is kept, the open batch is not
    /// taken: records arriving during an outage go to that one batch, so the buffers held
    /// stay two however often the write is retried.
    fn write_open(&self, writer: &mut Writer) -> Result<(), Error> {
        let Writer {
            wal,
            pending,
            reusable,
        } = writer;
        loop {
            let retrying = !pending.is_empty();
            if !retrying {
                // The next batch's buffer is ready before the lock requests wait for.
                let mut next = match reusable.take() {
                    Some(buf) => Open::reusing(0, buf),
                    None => Open::new(0),
                };
                let mut open = self.lock_open();
                if open.is_empty() {
                    *reusable = next.into_reusable();
                } else {
                    next.seq = open.seq + 1;
                    pending.push(std::mem::replace(&mut *open, next));
                }
            }
            let Some(last) = pending.last() else { break };
            let written_below = last.seq + 1;
            let mut frames: Vec<Frame<'_>> = pending
                .iter_mut()
                .map(|batch| Frame {
                    seq: batch.seq,
                    bytes: &mut batch.buf,
                })
                .collect();
            if let Err(error) = wal.commit(&mut frames) {
                // The open batch was not tried, but cannot be written before the kept one:
                // its waiters learn of the failure too.
                let open = self.lock_open();
                let failed_below = if open.is_empty() {
                    written_below
                } else {
                    written_below.max(open.seq + 1)
                };
                drop(open);
                return Err(self.failed(error, failed_below));
            }
            *reusable = pending.drain(..).find_map(Open::into_reusable);
            self.progress.durable(written_below);
            if !retrying {
                break;
            }
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
    pub(super) fn prepare_spare(&self) -> Result<(), Error> {
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
        self.progress.failed(attempted_below);
        error
    }
}
