//! The simulated disk behind the seam: the [`Disk`] calls the stores make, on files and
//! directories in memory, each counted, traced and possibly failed by [`State::begin`].

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard};

use super::change::Pending;
use super::faults::OpKind;
use super::file::SimFile;
use super::inode::Inode;
use super::paths::{absolute, not_found, parent};
use super::state::{lock, wait_while_held, Node, State};
use super::SimDisk;
use crate::{Disk, DiskFile};

impl SimDisk {
    /// A call that changes the disk: counted, traced, and failed if a fault or the power cut
    /// is due; the disk stays locked for it.
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
