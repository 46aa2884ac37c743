//! A disk in memory for redb that keeps, at a simulated power cut, only what was synced:
//! the writes since the last `sync_data` are dropped, except a prefix of them that may
//! survive, the last one possibly torn. Writes and syncs can be made to fail (EIO, ENOSPC),
//! and the power cut off after a number of writes, mid-commit. Test code only.
//!
//! The state store's tests have a file seam with the same idea for their own files; this
//! one should move onto it once both stores share one.

use std::sync::{Arc, Mutex, PoisonError};

use redb::StorageBackend;

/// An unsynced change, in the order it was made.
#[derive(Debug, Clone)]
enum Change {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    /// The next write fails with EIO.
    WriteEio,
    /// The next write fails with ENOSPC.
    WriteFull,
    /// The next sync fails with EIO.
    SyncEio,
}

#[derive(Debug, Default)]
struct State {
    /// What survives a power cut.
    synced: Vec<u8>,
    /// What reads see.
    current: Vec<u8>,
    /// Changes since the last sync.
    unsynced: Vec<Change>,
    /// Handles of an earlier power-on fail every call.
    generation: u64,
    /// Every call fails until the next power-on.
    off: bool,
    fault: Option<Fault>,
    /// Writes left before the power goes off.
    writes_left: Option<u64>,
    syncs: u64,
}

/// The disk; clones share it.
#[derive(Debug, Clone, Default)]
pub(super) struct PowerCutDisk {
    state: Arc<Mutex<State>>,
}

/// A redb backend over the disk, valid until the next power cut.
#[derive(Debug)]
pub(super) struct Handle {
    state: Arc<Mutex<State>>,
    generation: u64,
}

fn eio() -> std::io::Error {
    std::io::Error::from_raw_os_error(5)
}

fn enospc() -> std::io::Error {
    std::io::Error::from_raw_os_error(28)
}

impl PowerCutDisk {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A backend for a database opened now.
    pub(super) fn handle(&self) -> Handle {
        Handle {
            state: self.state.clone(),
            generation: self.lock().generation,
        }
    }

    /// Makes the next write or sync fail.
    pub(super) fn inject(&self, fault: Fault) {
        self.lock().fault = Some(fault);
    }

    /// Cuts the power after `n` more writes: that write and every call after it fail.
    pub(super) fn cut_after_writes(&self, n: u64) {
        self.lock().writes_left = Some(n);
    }

    /// Cuts the power now: every call fails until [`PowerCutDisk::restart`].
    pub(super) fn cut(&self) {
        self.lock().off = true;
    }

    /// Syncs so far.
    pub(super) fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// Powers the disk on again after a cut (cutting it first if it is still on): what was
    /// synced stays; of the changes since, the first `keep` (of `unsynced_len`) survive,
    /// and with `torn` the last of those only in part. Handles from before fail from now on.
    pub(super) fn restart(&self, keep: usize, torn: bool) {
        let mut s = self.lock();
        let kept: Vec<Change> = s.unsynced.iter().take(keep).cloned().collect();
        let mut disk = std::mem::take(&mut s.synced);
        let last = kept.len().saturating_sub(1);
        for (i, change) in kept.into_iter().enumerate() {
            match change {
                Change::SetLen(len) => disk.resize(len as usize, 0),
                Change::Write { offset, data } => {
                    let data = if torn && i == last {
                        &data[..data.len() / 2]
                    } else {
                        &data[..]
                    };
                    write_at(&mut disk, offset, data);
                }
            }
        }
        s.current = disk.clone();
        s.synced = disk;
        s.unsynced.clear();
        s.generation += 1;
        s.off = false;
        s.fault = None;
        s.writes_left = None;
    }

    /// Changes not synced yet.
    pub(super) fn unsynced_len(&self) -> usize {
        self.lock().unsynced.len()
    }
}

fn write_at(disk: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if disk.len() < end {
        disk.resize(end, 0);
    }
    disk[offset as usize..end].copy_from_slice(data);
}

impl Handle {
    /// The state, or EIO when the power is off or this handle is from before a cut.
    fn on(&self) -> Result<std::sync::MutexGuard<'_, State>, std::io::Error> {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.off || s.generation != self.generation {
            return Err(eio());
        }
        Ok(s)
    }
}

impl StorageBackend for Handle {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.on()?.current.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let s = self.on()?;
        let end = offset as usize + out.len();
        let data = s.current.get(offset as usize..end).ok_or_else(eio)?;
        out.copy_from_slice(data);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut s = self.on()?;
        s.current.resize(len as usize, 0);
        s.unsynced.push(Change::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        let mut s = self.on()?;
        if s.fault == Some(Fault::SyncEio) {
            s.fault = None;
            return Err(eio());
        }
        s.synced = s.current.clone();
        s.unsynced.clear();
        s.syncs += 1;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut s = self.on()?;
        match s.fault {
            Some(Fault::WriteEio) => {
                s.fault = None;
                return Err(eio());
            }
            Some(Fault::WriteFull) => {
                s.fault = None;
                return Err(enospc());
            }
            _ => {}
        }
        if let Some(left) = s.writes_left {
            if left == 0 {
                s.off = true;
                return Err(eio());
            }
            s.writes_left = Some(left - 1);
        }
        write_at(&mut s.current, offset, data);
        s.unsynced.push(Change::Write {
            offset,
            data: data.to_vec(),
        });
        Ok(())
    }
}
