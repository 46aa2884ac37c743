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
mod file;
mod rng;
mod state;

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{Disk, DiskFile};
use file::SimFile;
pub use rng::Rng;
pub use state::WriteDamage;
use state::{Inode, Node, Pending, State};

/// Linux's number for "no space left on device".
pub const ENOSPC: i32 = 28;
/// Linux's number for "input/output error".
pub const EIO: i32 = 5;

/// The kinds of operation a fault can be injected into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// A write, a length change, or the creation of a file or directory.
    Write,
    /// A sync of a file's data or of a directory.
    Sync,
    /// A rename.
    Rename,
    /// A removal.
    Remove,
}

/// An injected error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// ENOSPC: the disk is full.
    NoSpace,
    /// EIO: the device failed.
    Io,
}

impl Fault {
    fn error(self) -> io::Error {
        io::Error::from_raw_os_error(match self {
            Fault::NoSpace => ENOSPC,
            Fault::Io => EIO,
        })
    }
}

/// A bit flipped in a file's synced data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flip {
    /// The file, as named when the bit flipped.
    pub path: PathBuf,
    /// The byte.
    pub offset: u64,
    /// The bit flipped, as a mask.
    pub mask: u8,
}

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

fn root() -> PathBuf {
    PathBuf::from("/")
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: not found", path.display()),
    )
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => root(),
    }
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

/// Waits while syncs are held ([`SimDisk::hold_syncs`]).
fn wait_while_held(state: &Mutex<State>) {
    let gate = lock(state).syncs_held.clone();
    let mut held = gate.0.lock().unwrap_or_else(PoisonError::into_inner);
    while *held {
        held = gate.1.wait(held).unwrap_or_else(PoisonError::into_inner);
    }
}

fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_owned()
    } else {
        root().join(path)
    }
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
mod tests {
    use super::*;
    use crate::{create_dir_all, read};

    fn write_file(disk: &SimDisk, path: &str, bytes: &[u8]) -> Arc<dyn DiskFile> {
        let file = disk.create(Path::new(path)).expect("create");
        file.write_all_at(bytes, 0).expect("write");
        file
    }

    #[test]
    fn synced_data_and_synced_entries_survive_a_crash() {
        let disk = SimDisk::new(1);
        create_dir_all(&disk, Path::new("/d")).expect("mkdir");
        let file = write_file(&disk, "/d/f", b"durable");
        file.sync_data().expect("sync");
        disk.sync_dir(Path::new("/d")).expect("sync dir");
        let disk = disk.crash();
        assert_eq!(read(&disk, Path::new("/d/f")).expect("read"), b"durable");
        assert!(
            file.len().is_err(),
            "a handle from before the crash is dead"
        );
    }

    #[test]
    fn an_entry_not_followed_by_a_sync_of_its_directory_is_undone() {
        let disk = SimDisk::new(2);
        create_dir_all(&disk, Path::new("/d")).expect("mkdir");
        write_file(&disk, "/d/old", b"x").sync_all().expect("sync");
        disk.sync_dir(Path::new("/d")).expect("sync dir");
        disk.rename(Path::new("/d/old"), Path::new("/d/new"))
            .expect("rename");
        write_file(&disk, "/d/created", b"y")
            .sync_all()
            .expect("sync");
        disk.create_dir(Path::new("/d/sub")).expect("mkdir");
        assert_eq!(
            disk.list(Path::new("/d")).expect("list"),
            ["created", "new", "sub"]
        );
        let disk = disk.crash();
        assert_eq!(disk.list(Path::new("/d")).expect("list"), ["old"]);
        assert_eq!(read(&disk, Path::new("/d/old")).expect("read"), b"x");
        // A removal is undone the same way.
        disk.remove(Path::new("/d/old")).expect("remove");
        let disk = disk.crash();
        assert_eq!(disk.list(Path::new("/d")).expect("list"), ["old"]);
        disk.remove(Path::new("/d/old")).expect("remove");
        disk.sync_dir(Path::new("/d")).expect("sync dir");
        let disk = disk.crash();
        assert!(disk.list(Path::new("/d")).expect("list").is_empty());
    }

    #[test]
    fn a_directory_whose_parent_was_not_synced_is_lost_with_its_files() {
        let disk = SimDisk::new(3);
        disk.create_dir(Path::new("/a")).expect("mkdir");
        disk.create_dir(Path::new("/a/b")).expect("mkdir");
        write_file(&disk, "/a/b/f", b"z").sync_all().expect("sync");
        disk.sync_dir(Path::new("/a/b")).expect("sync b");
        disk.sync_dir(Path::new("/a")).expect("sync a");
        // `/a` itself is not durable in `/`.
        let disk = disk.crash();
        assert!(!disk.is_dir(Path::new("/a")));
        create_dir_all(&disk, Path::new("/a/b")).expect("mkdir -p syncs each parent");
        let disk = disk.crash();
        assert!(disk.is_dir(Path::new("/a/b")));
    }

    #[test]
    fn unsynced_writes_survive_only_as_a_prefix() {
        // Over many seeds, every outcome is a prefix of the write sequence, and both the
        // whole and nothing occur.
        let (mut whole, mut none) = (false, false);
        for seed in 0..200 {
            let disk = SimDisk::new(seed);
            let file = disk.create(Path::new("/f")).expect("create");
            file.write_all_at(b"aaaa", 0).expect("write");
            file.sync_data().expect("sync");
            disk.sync_dir(Path::new("/")).expect("sync dir");
            file.write_all_at(b"bbbb", 4).expect("write");
            file.write_all_at(b"cccc", 8).expect("write");
            let disk = disk.crash();
            let bytes = read(&disk, Path::new("/f")).expect("read");
            let full = b"aaaabbbbcccc";
            assert!(
                bytes.len() >= 4 && full.starts_with(&bytes),
                "seed {seed}: {bytes:?}"
            );
            whole |= bytes.len() == 12;
            none |= bytes.len() == 4;
        }
        assert!(whole && none);
    }

    #[test]
    fn a_failed_sync_loses_the_data_at_a_crash_though_it_reads_back() {
        let disk = SimDisk::new(4);
        let file = write_file(&disk, "/f", b"first");
        file.sync_data().expect("sync");
        disk.sync_dir(Path::new("/")).expect("sync dir");
        file.write_all_at(b"SECOND", 0).expect("write");
        disk.fail_next(OpKind::Sync, Fault::Io);
        let error = file.sync_data().expect_err("injected");
        assert_eq!(error.raw_os_error(), Some(EIO));
        assert_eq!(read(&disk, Path::new("/f")).expect("read"), b"SECOND");
        file.sync_data()
            .expect("a later sync succeeds, but has nothing left to write");
        let disk = disk.crash();
        assert_eq!(read(&disk, Path::new("/f")).expect("read"), b"first");
    }

    #[test]
    fn a_restart_keeps_what_a_failed_sync_left_until_a_power_cut() {
        let disk = SimDisk::new(8);
        let file = write_file(&disk, "/f", b"first");
        file.sync_data().expect("sync");
        disk.sync_dir(Path::new("/")).expect("sync dir");
        file.write_all_at(b"SECOND", 0).expect("write");
        disk.fail_next(OpKind::Sync, Fault::Io);
        assert!(file.sync_data().is_err());
        write_file(&disk, "/unsynced", b"u");
        let disk = disk.restart();
        assert!(
            file.len().is_err(),
            "a handle from before the restart is dead"
        );
        assert_eq!(read(&disk, Path::new("/f")).expect("read"), b"SECOND");
        assert_eq!(disk.list(Path::new("/")).expect("list"), ["f", "unsynced"]);
        let disk = disk.crash();
        assert_eq!(read(&disk, Path::new("/f")).expect("read"), b"first");
        assert_eq!(disk.list(Path::new("/")).expect("list"), ["f"]);
    }

    #[test]
    fn scheduled_faults_hit_their_kind_and_change_nothing() {
        let disk = SimDisk::new(5);
        disk.fail_next(OpKind::Write, Fault::NoSpace);
        disk.fail_next(OpKind::Rename, Fault::Io);
        disk.fail_next(OpKind::Remove, Fault::Io);
        let error = disk.create(Path::new("/f")).err().expect("ENOSPC");
        assert_eq!(error.raw_os_error(), Some(ENOSPC));
        assert!(disk.list(Path::new("/")).expect("list").is_empty());
        write_file(&disk, "/f", b"v");
        assert!(disk.rename(Path::new("/f"), Path::new("/g")).is_err());
        assert!(disk.remove(Path::new("/f")).is_err());
        assert_eq!(disk.list(Path::new("/")).expect("list"), ["f"]);
        assert_eq!(disk.faults_injected(), 3);
    }

    #[test]
    fn after_the_power_cut_point_every_call_fails_until_the_crash() {
        let disk = SimDisk::new(6);
        let file = write_file(&disk, "/f", b"v");
        file.sync_data().expect("sync");
        disk.sync_dir(Path::new("/")).expect("sync dir");
        disk.cut_power_after(2);
        disk.rename(Path::new("/f"), Path::new("/g"))
            .expect("the first still runs");
        assert!(disk.remove(Path::new("/g")).is_err(), "the second does not");
        assert!(disk.power_is_cut());
        assert!(
            disk.list(Path::new("/")).is_err(),
            "nor does anything after it"
        );
        let disk = disk.crash();
        assert_eq!(disk.list(Path::new("/")).expect("list"), ["f"]);
        assert!(disk
            .recent()
            .iter()
            .any(|l| l.contains("power cut before: remove /g")));
    }

    #[test]
    fn random_faults_follow_the_seed() {
        let run = |seed| {
            let disk = SimDisk::new(seed);
            disk.fail_randomly(300_000);
            (0..50)
                .map(|i| disk.create(Path::new(&format!("/f{i}"))).is_ok())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert!(run(7).contains(&false) && run(7).contains(&true));
    }

    /// A synced file `/d/f` of `bytes` on a disk of `seed`.
    fn synced(seed: u64, bytes: &[u8]) -> (SimDisk, Arc<dyn DiskFile>) {
        let disk = SimDisk::new(seed);
        create_dir_all(&disk, Path::new("/d")).expect("mkdir");
        let file = write_file(&disk, "/d/f", bytes);
        file.sync_data().expect("sync");
        disk.sync_dir(Path::new("/d")).expect("sync dir");
        (disk, file)
    }

    #[test]
    fn a_flipped_bit_in_synced_data_reads_back_survives_a_power_cut_and_repairs() {
        let (disk, _file) = synced(11, &[0u8; 64]);
        let flip = disk
            .flip_synced_bit(Path::new("/d"))
            .expect("a byte to flip");
        assert_eq!(flip.path, Path::new("/d/f"));
        let differs = |bytes: Vec<u8>| {
            bytes
                .iter()
                .enumerate()
                .filter(|(_, b)| **b != 0)
                .map(|(i, b)| (i as u64, *b))
                .collect::<Vec<_>>()
        };
        let seen = differs(read(&disk, Path::new("/d/f")).expect("read"));
        assert_eq!(seen, [(flip.offset, flip.mask)], "reads see it at once");
        let disk = disk.crash();
        let kept = differs(read(&disk, Path::new("/d/f")).expect("read"));
        assert_eq!(kept, [(flip.offset, flip.mask)], "a power cut keeps it");
        assert_eq!(disk.repair_flips(), 1);
        assert!(differs(read(&disk, Path::new("/d/f")).expect("read")).is_empty());
        let again = synced(11, &[0u8; 64]).0.flip_synced_bit(Path::new("/d"));
        assert_eq!(again, Some(flip), "the seed picks the same bit");
        assert_eq!(SimDisk::new(1).flip_synced_bit(Path::new("/")), None);
        let within = disk.flip_synced_bit_in(Path::new("/d/f"), 10..12);
        assert!(within.is_some_and(|f| (10..12).contains(&f.offset)));
        assert_eq!(disk.flip_synced_bit_in(Path::new("/d/f"), 64..90), None);
        assert_eq!(disk.flip_synced_bit_in(Path::new("/d/g"), 0..9), None);
        let file = disk.open_rw(Path::new("/d/f")).expect("open");
        file.write_all_at(b"unsynced", 0).expect("write");
        let synced = disk.synced_data(Path::new("/d/f")).expect("a file");
        assert_eq!(synced.len(), 64);
        assert_ne!(&synced[..8], b"unsynced");
    }

    #[test]
    fn a_bit_a_write_covered_since_is_not_undone() {
        let (disk, file) = synced(12, &[0u8; 8]);
        let flip = disk
            .flip_synced_bit(Path::new("/d"))
            .expect("a byte to flip");
        file.write_all_at(&[7u8; 8], 0).expect("write");
        assert_eq!(disk.repair_flips(), 0, "{flip:?}");
        assert_eq!(read(&disk, Path::new("/d/f")).expect("read"), [7u8; 8]);
    }

    #[test]
    fn a_torn_write_reads_whole_until_a_power_cut_keeps_only_a_prefix_though_synced() {
        let (disk, file) = synced(13, b"aaaaaaaa");
        disk.damage_next_write(WriteDamage::Tear, "/d/f");
        file.write_all_at(b"bbbbbbbb", 0).expect("write");
        file.sync_data().expect("the sync succeeds");
        assert_eq!(read(&disk, Path::new("/d/f")).expect("read"), b"bbbbbbbb");
        let disk = disk.crash();
        let bytes = read(&disk, Path::new("/d/f")).expect("read");
        let kept = bytes.iter().take_while(|b| **b == b'b').count();
        assert!(kept < 8, "{bytes:?}");
        assert!(bytes[kept..].iter().all(|b| *b == b'a'), "{bytes:?}");
        assert!(disk.recent().iter().any(|l| l.contains("Tear injected")));
    }

    #[test]
    fn a_misdirected_write_lands_at_another_offset_though_synced() {
        let (disk, file) = synced(14, &[b'a'; 32]);
        disk.damage_next_write(WriteDamage::Misdirect, "/d/");
        file.write_all_at(b"bbbb", 8).expect("write");
        file.sync_data().expect("the sync succeeds");
        let mut expected = vec![b'a'; 32];
        expected[8..12].copy_from_slice(b"bbbb");
        assert_eq!(read(&disk, Path::new("/d/f")).expect("read"), expected);
        let disk = disk.crash();
        let bytes = read(&disk, Path::new("/d/f")).expect("read");
        assert_eq!(&bytes[8..12], b"aaaa", "not where it was aimed: {bytes:?}");
        let at = bytes
            .windows(4)
            .position(|w| w == b"bbbb")
            .expect("the bytes landed somewhere");
        assert_ne!(at, 8);
        // A write to another file is not the one damaged.
        let (disk, file) = synced(14, b"aaaa");
        disk.damage_next_write(WriteDamage::Misdirect, "/elsewhere");
        file.write_all_at(b"bb", 0).expect("write");
        file.sync_data().expect("sync");
        assert_eq!(
            read(&disk.crash(), Path::new("/d/f")).expect("read"),
            b"bbaa"
        );
    }

    #[test]
    fn reordered_unsynced_writes_can_land_without_the_earlier_ones() {
        let outcome = |seed| {
            let (disk, file) = synced(seed, b"aaaaaaaa");
            file.write_all_at(b"bb", 0).expect("write");
            file.write_all_at(b"cc", 2).expect("write");
            file.write_all_at(b"dd", 4).expect("write");
            disk.reorder_at_next_power_cut();
            read(&disk.crash(), Path::new("/d/f")).expect("read")
        };
        let outcomes: Vec<Vec<u8>> = (0..64).map(outcome).collect();
        assert!(
            outcomes
                .iter()
                .any(|b| b == b"aaccaaaa" || b == b"aaaaddaa"),
            "a later write without the earlier: {outcomes:?}"
        );
        assert_eq!(outcome(5), outcome(5), "the seed decides");
        // Only the next power cut reorders: the one after it keeps a prefix again.
        for seed in 0..64 {
            let (disk, _) = synced(seed, b"aa");
            disk.reorder_at_next_power_cut();
            let disk = disk.crash();
            let file = disk.open_rw(Path::new("/d/f")).expect("open");
            file.write_all_at(b"b", 0).expect("write");
            file.write_all_at(b"c", 1).expect("write");
            let bytes = read(&disk.crash(), Path::new("/d/f")).expect("read");
            assert_ne!(bytes, b"ac", "seed {seed}");
        }
    }
}
