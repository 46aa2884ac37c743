//! Work a caller asks for at once rather than leave to the threads: sweeps, commits,
//! flushes, merges and spare segments (shutdown, tests and the dedup benchmark).

use super::Journal;
use crate::Error;

impl Journal {
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
}
