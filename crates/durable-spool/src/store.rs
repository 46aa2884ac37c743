//! The store folder: the spool's database (redb) and, in stores written by earlier
//! versions, the legacy sled database read once for migration; the only module that opens
//! either. [`Error`] is its failure type.
//!
//! The spool lives in `spool.redb`: a durable redb commit ends with an `fdatasync` of that
//! file, so what a commit returned for survives a power cut. redb reads and writes it
//! through the disk seam ([`crate::spool_file::SeamFile`]), and each open first makes the file durable as it
//! reads ([`crate::spool_file`]), so that nothing is built on pages a failed sync left in the
//! page cache. sled (0.34) is kept only to read what earlier versions left: its flush
//! returns after `sync_file_range`, which neither writes metadata nor flushes the device
//! cache, and its `fsync` runs every 500 ms on a thread of its own, so nothing a 200
//! depends on may rest on it.
//!
//! The legacy sled database is opened only when the folder holds one (its `conf` or `db`
//! file). Its trees are read by the spool's migration and by the state journal's replay of
//! batches written before the journal had files ([`Store::tree`]); once every tree
//! in it is empty, [`Store::retire_legacy_if_empty`] closes it and removes its files.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use disk_seam::Disk;

use crate::error::{Error, StoreFault};
use crate::legacy::{Legacy, Tree};
use crate::locks::{lock, wait_for_lock};
use crate::spool_file::{lock_spool, make_folder, open_spool, probe_room, Fence, SPOOL_FILE};

/// The page cache of the spool's database when the config does not say (`store.cache`).
pub const DEFAULT_CACHE_BYTES: u64 = 32 * 1024 * 1024;

/// The store folder's handle; cheap to clone.
#[derive(Clone)]
pub struct Store {
    dir: PathBuf,
    spool: Arc<redb::Database>,
    /// What [`Store::reopen_spool`] opens the spool's database again with.
    spool_file: Arc<SpoolFile>,
    legacy: Arc<Legacy>,
}

/// The spool's database file as [`Store::reopen_spool`] opens it again: on which disk,
/// with what cache and lock, and the fence of the storage the database open now uses.
struct SpoolFile {
    disk: Arc<dyn Disk>,
    cache_bytes: u64,
    lock: Option<Arc<std::fs::File>>,
    fence: Mutex<Fence>,
}

impl Store {
    /// Opens (or creates) the store folder with the default cache.
    pub fn open(path: &Path) -> Result<Self, Error> {
        Self::open_with_cache(path, DEFAULT_CACHE_BYTES)
    }

    /// Opens (or creates) the store folder, with a page cache of `cache_bytes` for the
    /// spool's database. A locked, unreadable or corrupt store is an error naming the path.
    /// A legacy sled database in the folder is opened too, or removed if nothing in it is
    /// left to migrate. The spool's database is read and written through the disk seam
    /// ([`crate::spool_file::SeamFile`]), as in the tests that run it on a simulated disk.
    pub fn open_with_cache(path: &Path, cache_bytes: u64) -> Result<Self, Error> {
        let open_err = |reason: String| {
            Error(StoreFault::Open {
                path: path.to_owned(),
                reason,
            })
        };
        let disk = disk_seam::real();
        make_folder(&*disk, path).map_err(|e| open_err(e.to_string()))?;
        let lock =
            wait_for_lock(|| lock_spool(&path.join(SPOOL_FILE)), |e| e.is_none()).map_err(|e| {
                open_err(e.map_or_else(
                    || {
                        "it is locked by another process (is another hookgate running on it?)"
                            .into()
                    },
                    |e| e.to_string(),
                ))
            })?;
        let lock = Some(Arc::new(lock));
        let fence = Fence::default();
        let spool = open_spool(&*disk, path, cache_bytes, lock.clone(), fence.clone())?;
        let spool_file = SpoolFile {
            disk,
            cache_bytes,
            lock,
            fence: Mutex::new(fence),
        };
        let legacy = Legacy::open_if_present(path).map_err(|e| open_err(e.to_string()))?;
        let store = Self {
            dir: path.to_owned(),
            spool: Arc::new(spool),
            spool_file: Arc::new(spool_file),
            legacy: Arc::new(legacy),
        };
        store
            .retire_legacy_if_empty()
            .map_err(|e| open_err(e.to_string()))?;
        Ok(store)
    }

    /// Opens (or creates) the store folder `path` on `disk`, as [`Store::open_with_cache`]
    /// does on the real file system: how tests run the spool on a simulated disk that a
    /// power cut takes unsynced writes from. No legacy sled store is opened (sled reads the
    /// real file system only), and no lock is taken (a simulated disk has one process).
    pub fn open_on(disk: Arc<dyn Disk>, path: &Path, cache_bytes: u64) -> Result<Self, Error> {
        make_folder(&*disk, path).map_err(|e| {
            Error(StoreFault::Open {
                path: path.to_owned(),
                reason: e.to_string(),
            })
        })?;
        let fence = Fence::default();
        let spool = open_spool(&*disk, path, cache_bytes, None, fence.clone())?;
        Ok(Self {
            dir: path.to_owned(),
            spool: Arc::new(spool),
            spool_file: Arc::new(SpoolFile {
                disk,
                cache_bytes,
                lock: None,
                fence: Mutex::new(fence),
            }),
            legacy: Arc::new(Legacy::absent(path)),
        })
    }

    /// The store folder (the state's runs and journal live in folders inside it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The spool's database, as the open opened it.
    pub fn spool_db(&self) -> Arc<redb::Database> {
        self.spool.clone()
    }

    /// Whether the disk has room for the spool's next commit ([`probe_room`]).
    pub fn probe_room(&self) -> Result<(), Error> {
        Ok(probe_room(&*self.spool_file.disk, &self.dir)?)
    }

    /// Opens the spool's database again, as a process starting would (the file made
    /// durable as it reads first), after a commit met an I/O error: redb refuses every
    /// write from then on. The database open until now is fenced off its file first: any
    /// call it still makes fails. Not before the disk has room ([`probe_room`]).
    pub fn reopen_spool(&self) -> Result<Arc<redb::Database>, Error> {
        self.probe_room()?;
        let file = &self.spool_file;
        let mut current = lock(&file.fence);
        *current.write().unwrap_or_else(PoisonError::into_inner) = true;
        let fence = Fence::default();
        let db = open_spool(
            &*file.disk,
            &self.dir,
            file.cache_bytes,
            file.lock.clone(),
            fence.clone(),
        )?;
        *current = fence;
        Ok(Arc::new(db))
    }

    /// A tree of the legacy sled database. Reads of a store that has none find it empty;
    /// the first write creates one.
    pub fn tree(&self, name: &str) -> Result<Tree, Error> {
        Ok(Tree::new(self.legacy.clone(), name))
    }

    /// Whether the folder holds a legacy sled database still open.
    pub fn has_legacy(&self) -> bool {
        self.legacy.is_open()
    }

    /// Closes the legacy sled database and removes its files once every tree in it is
    /// empty (see [`Legacy::retire_if_empty`]). Returns whether the files were removed.
    pub fn retire_legacy_if_empty(&self) -> Result<bool, Error> {
        self.legacy.retire_if_empty()
    }

    /// Makes the legacy sled database's writes durable, if one is open. The spool's
    /// commits are durable when they return and need no flush.
    pub async fn flush(&self) -> Result<(), Error> {
        let legacy = self.legacy.clone();
        tokio::task::spawn_blocking(move || legacy.flush())
            .await
            .map_err(|e| Error(StoreFault::Stopped(format!("store flush did not run: {e}"))))?
    }

    /// Blocking [`Store::flush`], for shutdown.
    pub fn flush_blocking(&self) -> Result<(), Error> {
        self.legacy.flush()
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
