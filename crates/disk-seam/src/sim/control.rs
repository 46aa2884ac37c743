//! What a test does to the simulated disk besides the stores' calls: schedule faults,
//! hold syncs, cut the power, restart the process; and what it reads back of what happened.

use std::path::{Path, PathBuf};
use std::sync::PoisonError;

use super::faults::{Fault, OpKind};
use super::paths::absolute;
use super::state::{lock, Node};
use super::SimDisk;

impl SimDisk {
    /// The next operation of kind `kind` fails with `fault` (after those scheduled
    /// before it).
    pub fn fail_next(&self, kind: OpKind, fault: Fault) {
        lock(&self.state).scheduled.push_back((kind, fault, None));
    }

    /// The next operation of kind `kind` whose description (as [`SimDisk::recent`] shows
    /// it, e.g. `sync dir /store/state-runs`) contains `text` fails with `fault`.
    pub fn fail_next_matching(&self, kind: OpKind, fault: Fault, text: &str) {
        lock(&self.state)
            .scheduled
            .push_back((kind, fault, Some(text.to_owned())));
    }

    /// Every write, sync, rename and removal from now on fails with this chance in a
    /// million, the fault (ENOSPC or EIO) picked at random; 0 stops it.
    pub fn fail_randomly(&self, per_million: u32) {
        lock(&self.state).random_faults = per_million;
    }

    /// Every sync from now on waits, as on a device that stopped answering, until
    /// [`SimDisk::release_syncs`].
    pub fn hold_syncs(&self) {
        let gate = lock(&self.state).syncs_held.clone();
        *gate.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
    }

    /// The syncs held by [`SimDisk::hold_syncs`] go on.
    pub fn release_syncs(&self) {
        let gate = lock(&self.state).syncs_held.clone();
        *gate.0.lock().unwrap_or_else(PoisonError::into_inner) = false;
        gate.1.notify_all();
    }

    /// Forgets faults scheduled with [`SimDisk::fail_next`] or
    /// [`SimDisk::damage_next_write`] and not yet met.
    pub fn clear_faults(&self) {
        let mut state = lock(&self.state);
        state.scheduled.clear();
        state.write_damage.clear();
        state.random_faults = 0;
    }

    /// The power goes before the `n`th operation from now that changes the disk (1: the
    /// next one): it and every call after it fail with EIO until [`SimDisk::crash`].
    pub fn cut_power_after(&self, n: u64) {
        let mut state = lock(&self.state);
        state.cut_at = Some(state.ops + n.max(1));
    }

    /// Whether the power went (a point set by [`SimDisk::cut_power_after`] was reached).
    pub fn power_is_cut(&self) -> bool {
        lock(&self.state).cut
    }

    /// A power cut now, or the end of the one [`SimDisk::cut_power_after`] set: every file
    /// keeps its synced data and a random prefix of its unsynced writes, every directory
    /// its synced entries. Returns the handle of the next "process"; every earlier handle
    /// and open file fails from now on.
    pub fn crash(&self) -> SimDisk {
        let generation = lock(&self.state).power_cut();
        Self {
            state: self.state.clone(),
            generation,
        }
    }

    /// A process restart without a power cut (a crash of the process, `kill -9`, a restart
    /// a liveness probe asked for): the page cache stays, so everything written reads back,
    /// synced or not, pages a failed sync left behind included; what a later power cut
    /// keeps is unchanged. Faults scheduled for the old process are forgotten. Returns the
    /// handle of the next "process"; every earlier handle and open file fails from now on,
    /// as a dead process writes nothing more. A power cut set by
    /// [`SimDisk::cut_power_after`] that was reached stays a power cut: call
    /// [`SimDisk::crash`] instead.
    pub fn restart(&self) -> SimDisk {
        let generation = lock(&self.state).restart();
        Self {
            state: self.state.clone(),
            generation,
        }
    }

    /// Operations that changed (or tried to change) the disk so far.
    pub fn ops(&self) -> u64 {
        lock(&self.state).ops
    }

    /// Faults injected so far.
    pub fn faults_injected(&self) -> u64 {
        lock(&self.state).faults_injected
    }

    /// The last operations, oldest first, for a failing test's message.
    pub fn recent(&self) -> Vec<String> {
        lock(&self.state).trace.iter().cloned().collect()
    }

    /// The names of files (not directories) under `dir`, at any depth, as a listing would
    /// show them now.
    pub fn files_under(&self, dir: &Path) -> Vec<PathBuf> {
        let dir = absolute(dir);
        lock(&self.state)
            .live
            .iter()
            .filter(|(p, n)| matches!(n, Node::File(_)) && p.starts_with(&dir))
            .map(|(p, _)| p.clone())
            .collect()
    }
}
