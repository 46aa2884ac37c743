//! A file of the simulated disk, as an open handle sees it: reads and writes of its data,
//! and syncs that decide what a power cut keeps.

use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use super::change::{apply, Pending};
use super::faults::OpKind;
use super::state::{lock, wait_while_held, State};
use crate::DiskFile;

/// Linux's number for "bad file descriptor" (a write to a file opened for reading).
const EBADF: i32 = 9;

/// An open file of the simulated disk.
pub(super) struct SimFile {
    pub(super) state: Arc<Mutex<State>>,
    pub(super) generation: u64,
    pub(super) inode: u64,
    pub(super) writable: bool,
}

impl SimFile {
    fn look(&self) -> io::Result<MutexGuard<'_, State>> {
        let state = lock(&self.state);
        state.alive(self.generation)?;
        Ok(state)
    }

    fn change(
        &self,
        kind: OpKind,
        what: std::fmt::Arguments<'_>,
    ) -> io::Result<MutexGuard<'_, State>> {
        let mut state = lock(&self.state);
        state.begin(self.generation, Some(kind), what)?;
        if kind == OpKind::Write && !self.writable {
            return Err(io::Error::from_raw_os_error(EBADF));
        }
        Ok(state)
    }

    fn sync(&self, what: &str) -> io::Result<()> {
        wait_while_held(&self.state);
        let inode = self.inode;
        let mut state = lock(&self.state);
        // A dead handle changes nothing, not even what a failed sync would drop.
        state.alive(self.generation)?;
        let synced = state.begin(
            self.generation,
            Some(OpKind::Sync),
            format_args!("{what} inode {inode}"),
        );
        let cut = state.cut;
        let file = state.inode(inode)?;
        match synced {
            Ok(()) => {
                // What the cache holds from writes since the last sync; pages a failed sync
                // dropped are not written again. A damaged write lands as its damage says.
                for change in std::mem::take(&mut file.pending) {
                    file.land(&change);
                }
                Ok(())
            }
            Err(error) => {
                // An injected fault: the pages stay readable, but a power cut loses them,
                // as Linux marks them clean after a failed writeback. A new length is the
                // inode's, not a page's: it stays to be written by the next sync that
                // succeeds, as the file system's journal keeps it. (At the power cut
                // itself the crash decides what stays.)
                if !cut {
                    file.pending
                        .retain(|change| matches!(change, Pending::SetLen(_)));
                }
                Err(error)
            }
        }
    }
}

impl DiskFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut state = self.look()?;
        let data = &state.inode(self.inode)?.data;
        let at = (offset as usize).min(data.len());
        let n = buf.len().min(data.len() - at);
        buf[..n].copy_from_slice(&data[at..at + n]);
        Ok(n)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let inode = self.inode;
        let mut state = self.change(
            OpKind::Write,
            format_args!("write inode {inode} at {offset}, {} bytes", buf.len()),
        )?;
        state.inode(inode)?;
        let lands = state.landing(inode, offset, buf.len());
        let file = state.inode(inode)?;
        let change = Pending::Write {
            offset,
            bytes: buf.to_vec(),
            lands,
        };
        apply(&mut file.data, &change);
        file.blocks.follow(&change);
        file.covered(&change);
        file.pending.push(change);
        Ok(buf.len())
    }

    fn len(&self) -> io::Result<u64> {
        let mut state = self.look()?;
        Ok(state.inode(self.inode)?.data.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let inode = self.inode;
        let mut state = self.change(
            OpKind::Write,
            format_args!("set_len inode {inode} to {len}"),
        )?;
        let file = state.inode(inode)?;
        let change = Pending::SetLen(len);
        apply(&mut file.data, &change);
        file.blocks.follow(&change);
        file.covered(&change);
        file.pending.push(change);
        Ok(())
    }

    fn data_ranges(&self) -> io::Result<Vec<Range<u64>>> {
        let mut state = self.look()?;
        let file = state.inode(self.inode)?;
        Ok(file.blocks.ranges(file.data.len() as u64))
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync("sync_data")
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync("sync_all")
    }
}
