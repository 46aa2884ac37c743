//! A simulated disk for tests: files and directories in memory, a power cut that keeps only
//! what was synced, and injected faults (ENOSPC, EIO) on writes, syncs, renames and
//! removals, all driven by a seed so that a failing run replays.
//!
//! What a power cut ([`SimDisk::crash`]) keeps, the way LevelDB's and RocksDB's
//! fault-injection environments model it:
//! - of a file's data, what its last successful sync covered, then any prefix of the writes
//!   made since (the last of them possibly cut short): a torn, unsynced tail;
//! - of a directory, the entries its last successful sync saw: a file created, renamed or
//!   removed, or a directory made, since then is undone (a renamed file is back under its
//!   old name, a removed one is back, a created one is gone with its data).
//!
//! Damage, beside loss, injected on demand and drawn from the same seed:
//! - a bit flipped in a file's synced data ([`SimDisk::flip_synced_bit`]), seen by reads at
//!   once and kept by power cuts, and undone by [`SimDisk::repair_flips`] (an operator's
//!   restore) where no write has covered it since;
//! - a torn or misdirected write ([`SimDisk::damage_next_write`]): its sync succeeds and
//!   reads see it whole where it was aimed (the page cache), but the platter got only a
//!   prefix of it, or got it at another offset of the file, which the next power cut shows;
//! - unsynced writes reordered ([`SimDisk::reorder_at_next_power_cut`]): the next power cut
//!   keeps any subset of each file's unsynced writes, a later one without an earlier.
//!
//! A file holds data in blocks of 4 KiB that writes take, and holes elsewhere, as `SEEK_DATA`
//! and `SEEK_HOLE` report them ([`DiskFile::data_ranges`]); what a power cut keeps of them
//! follows what it keeps of the writes.
//!
//! A failed sync of a file keeps the data readable but drops it from what a power cut
//! keeps, as Linux does after a failed writeback. A failed write, rename or removal
//! changes nothing. A process restart ([`SimDisk::restart`]) is not a power cut: the page
//! cache stays, so the next process reads what a failed sync left there, and a later power
//! cut still takes it away.
//!
//! The simulated disk is public, not behind a feature, so that unit tests and the
//! integration tests (another crate, which sees no `cfg(test)` item) use the same one: it
//! is plain `std`, and the binary, which never names it, does not carry it.

mod blocks;
mod change;
mod faults;
mod file;
mod inode;
mod paths;
mod rng;
mod state;

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{Disk, DiskFile};
use change::Pending;
pub use faults::{Fault, Flip, OpKind, WriteDamage, EIO, ENOSPC};
use file::SimFile;
use inode::Inode;
use paths::{absolute, not_found, parent};
pub use rng::Rng;
use state::{lock, wait_while_held, Node, State};

/// Tries of [`SimDisk::flip_synced_bit`] for a byte whose synced and cached copies agree.
const FLIP_TRIES: usize = 16;

/// A simulated disk; clones are handles to the same disk. A handle belongs to one
/// "process": after [`SimDisk::crash`], the handles and open files from before it fail
/// every call with EIO, and the returned handle sees what the power cut kept.
#[derive(Clone)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
    generation: u64,
}

impl SimDisk {
    /// An empty disk (only `/`) whose torn tails and random faults follow `seed`. Relative
    /// paths are read as under `/`.
    pub fn new(seed: u64) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::new(seed))),
            generation: 0,
        }
    }

    /// This disk as the stores take it.
    pub fn handle(&self) -> Arc<dyn Disk> {
        Arc::new(self.clone())
    }

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

    /// Flips one bit of synced data in a file under `dir` (at any depth), both picked at
    /// random: in a byte whose cached copy is the synced one, so reads see the flip at
    /// once, as after the page cache dropped the page. `None` if no file there holds such
    /// a byte.
    pub fn flip_synced_bit(&self, dir: &Path) -> Option<Flip> {
        let dir = absolute(dir);
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        let files: Vec<(PathBuf, u64)> = state
            .live
            .iter()
            .filter_map(|(p, n)| match n {
                Node::File(id) if p.starts_with(&dir) => Some((p.clone(), *id)),
                _ => None,
            })
            .filter(|(_, id)| state.inodes.get(id).is_some_and(|f| !f.durable.is_empty()))
            .collect();
        if files.is_empty() {
            return None;
        }
        let (path, id) = files[state.rng.below(files.len() as u64) as usize].clone();
        flip_in(state, path, id, 0..u64::MAX)
    }

    /// Flips one bit, picked at random, of the synced data of the file at `path` within
    /// the bytes `within`, as [`SimDisk::flip_synced_bit`] does. `None` if the file holds
    /// no such byte there.
    pub fn flip_synced_bit_in(&self, path: &Path, within: Range<u64>) -> Option<Flip> {
        let path = absolute(path);
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        let Some(Node::File(id)) = state.live.get(&path) else {
            return None;
        };
        let id = *id;
        flip_in(state, path, id, within)
    }

    /// What a power cut now keeps for certain of the file at `path`: its synced data.
    /// `None` if no file is there.
    pub fn synced_data(&self, path: &Path) -> Option<Vec<u8>> {
        let path = absolute(path);
        let state = lock(&self.state);
        match state.live.get(&path) {
            Some(Node::File(id)) => state.inodes.get(id).map(|f| f.durable.clone()),
            _ => None,
        }
    }

    /// Undoes the bits [`SimDisk::flip_synced_bit`] flipped that no write or length change
    /// has covered since (an operator restoring the damaged bytes). Returns how many.
    pub fn repair_flips(&self) -> usize {
        let mut state = lock(&self.state);
        let mut repaired = 0;
        for file in state.inodes.values_mut() {
            for (at, mask) in std::mem::take(&mut file.flipped) {
                let at = at as usize;
                if let (Some(d), Some(c)) = (file.durable.get_mut(at), file.data.get_mut(at)) {
                    *d ^= mask;
                    *c ^= mask;
                    repaired += 1;
                }
            }
        }
        state.note(format_args!("{repaired} flipped bits repaired"));
        repaired
    }

    /// The next write to a file whose path (at the write) contains `text` suffers
    /// `damage` (after those scheduled before it): torn or misdirected on the platter,
    /// whatever its sync says.
    pub fn damage_next_write(&self, damage: WriteDamage, text: &str) {
        lock(&self.state)
            .write_damage
            .push_back((damage, text.to_owned()));
    }

    /// The next power cut keeps any subset of each file's unsynced writes, not only a
    /// prefix: a device that wrote its cache back out of order.
    pub fn reorder_at_next_power_cut(&self) {
        lock(&self.state).reorder_next_cut = true;
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

    fn begin(
        &self,
        kind: Option<OpKind>,
        what: std::fmt::Arguments<'_>,
    ) -> io::Result<MutexGuard<'_, State>> {
        let mut state = lock(&self.state);
        state.begin(self.generation, kind, what)?;
        Ok(state)
    }

    /// A read-only call: fails once the power went or the handle is stale.
    fn look(&self) -> io::Result<MutexGuard<'_, State>> {
        let state = lock(&self.state);
        state.alive(self.generation)?;
        Ok(state)
    }

    fn open_file(
        &self,
        path: &Path,
        create: bool,
        truncate: bool,
    ) -> io::Result<Arc<dyn DiskFile>> {
        let path = absolute(path);
        let writable = create || truncate;
        let mut state = if writable {
            self.begin(
                Some(OpKind::Write),
                format_args!(
                    "open {} (create {create}, truncate {truncate})",
                    path.display()
                ),
            )?
        } else {
            self.look()?
        };
        let inode = match state.live.get(&path) {
            Some(Node::File(i)) => *i,
            Some(Node::Dir) => {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    format!("{}: a directory", path.display()),
                ))
            }
            None if create => {
                if !matches!(state.live.get(&parent(&path)), Some(Node::Dir)) {
                    return Err(not_found(&parent(&path)));
                }
                let id = state.next_inode;
                state.next_inode += 1;
                state.inodes.insert(id, Inode::default());
                state.live.insert(path.clone(), Node::File(id));
                id
            }
            None => return Err(not_found(&path)),
        };
        if truncate {
            let file = state.inode(inode)?;
            let change = Pending::SetLen(0);
            file.data.clear();
            file.blocks.follow(&change);
            file.pending.push(change);
        }
        Ok(Arc::new(SimFile {
            state: self.state.clone(),
            generation: self.generation,
            inode,
            writable,
        }))
    }
}

/// Flips a random bit of a random byte of file `id` (at `path`) within `within` whose
/// synced and cached copies agree.
fn flip_in(state: &mut State, path: PathBuf, id: u64, within: Range<u64>) -> Option<Flip> {
    let mask = 1u8 << state.rng.below(8);
    let file = state.inodes.get(&id)?;
    let end = within
        .end
        .min(file.durable.len().min(file.data.len()) as u64);
    if within.start >= end {
        return None;
    }
    for _ in 0..FLIP_TRIES {
        let at = (within.start + state.rng.below(end - within.start)) as usize;
        let file = state.inodes.get_mut(&id)?;
        // A hole has no block a bit could flip in.
        let in_hole = !file.durable_blocks.holds(at as u64);
        if in_hole || file.data.get(at) != file.durable.get(at) {
            continue;
        }
        file.durable[at] ^= mask;
        file.data[at] ^= mask;
        file.flipped.push((at as u64, mask));
        let flip = Flip {
            path,
            offset: at as u64,
            mask,
        };
        state.note(format_args!("bit flipped: {flip:?}"));
        return Some(flip);
    }
    None
}

impl Disk for SimDisk {
    fn open(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>> {
        self.open_file(path, false, false)
    }

    fn open_rw(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>> {
        self.open_file(path, true, false)
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>> {
        self.open_file(path, true, true)
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        let path = absolute(path);
        let mut state = self.begin(
            Some(OpKind::Write),
            format_args!("mkdir {}", path.display()),
        )?;
        if state.live.contains_key(&path) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        if !matches!(state.live.get(&parent(&path)), Some(Node::Dir)) {
            return Err(not_found(&parent(&path)));
        }
        state.live.insert(path, Node::Dir);
        Ok(())
    }

    fn is_dir(&self, path: &Path) -> bool {
        let path = absolute(path);
        self.look()
            .is_ok_and(|state| matches!(state.live.get(&path), Some(Node::Dir)))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let dir = absolute(dir);
        let state = self.look()?;
        if !matches!(state.live.get(&dir), Some(Node::Dir)) {
            return Err(not_found(&dir));
        }
        Ok(state
            .live
            .keys()
            .filter(|p| **p != dir && parent(p) == dir)
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let dir = absolute(dir);
        wait_while_held(&self.state);
        let mut guard = self.begin(
            Some(OpKind::Sync),
            format_args!("sync dir {}", dir.display()),
        )?;
        let state = &mut *guard;
        if !matches!(state.live.get(&dir), Some(Node::Dir)) {
            return Err(not_found(&dir));
        }
        let child = |p: &PathBuf| *p != dir && parent(p) == dir;
        state.durable.retain(|p, _| !child(p));
        for (path, node) in state.live.iter().filter(|(p, _)| child(p)) {
            state.durable.insert(path.clone(), *node);
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (from, to) = (absolute(from), absolute(to));
        let mut state = self.begin(
            Some(OpKind::Rename),
            format_args!("rename {} -> {}", from.display(), to.display()),
        )?;
        match state.live.get(&from) {
            Some(Node::File(_)) => {}
            Some(Node::Dir) => return Err(io::ErrorKind::Unsupported.into()),
            None => return Err(not_found(&from)),
        }
        if !matches!(state.live.get(&parent(&to)), Some(Node::Dir)) {
            return Err(not_found(&parent(&to)));
        }
        if let Some(node) = state.live.remove(&from) {
            state.live.insert(to, node);
        }
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let path = absolute(path);
        let mut state = self.begin(
            Some(OpKind::Remove),
            format_args!("remove {}", path.display()),
        )?;
        match state.live.get(&path) {
            Some(Node::File(_)) => {
                state.live.remove(&path);
                Ok(())
            }
            Some(Node::Dir) => Err(io::ErrorKind::IsADirectory.into()),
            None => Err(not_found(&path)),
        }
    }
}

#[cfg(test)]
mod tests;
