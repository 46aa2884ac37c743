//! The legacy sled database a store folder of an earlier version holds: opened only when
//! the folder has one (its `conf` or `db` file), read once by the spool's migration and by
//! the state journal's replay of batches written before the journal had files ([`Tree`]),
//! and removed once every tree in it is empty ([`Legacy::retire_if_empty`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::Error;
use crate::locks::{lock, wait_for_lock};

/// sled's page cache while a legacy store is read: it is read once, page by page.
const LEGACY_CACHE_BYTES: u64 = 8 * 1024 * 1024;
/// The files and folders sled keeps in a store folder. `conf` is removed last: a folder
/// that still has it is opened as a sled store (see [`Legacy::retire_if_empty`]).
pub(crate) const SLED_FILES: [&str; 3] = ["db", "blobs", "conf"];

/// Whether sled failed to open because the directory's lock file is taken. sled reports it
/// as an I/O error of kind `Other` with the lock error in its text.
fn is_locked(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io)
        if io.kind() == std::io::ErrorKind::WouldBlock
            || io.to_string().contains("could not acquire lock"))
}

/// The legacy sled database of the folder, opened when it holds one, or on the first
/// write into one of its trees (tests that write a store as an earlier version did).
pub(crate) struct Legacy {
    dir: PathBuf,
    db: Mutex<Option<sled::Db>>,
}

impl Legacy {
    /// The folder's legacy database, opened when the folder holds one.
    pub(crate) fn open_if_present(dir: &Path) -> Result<Self, Error> {
        let legacy = Self::absent(dir);
        if dir.join("conf").exists() || dir.join("db").exists() {
            *lock(&legacy.db) = Some(legacy.open()?);
        }
        Ok(legacy)
    }

    /// No legacy database open (a simulated disk, which sled cannot read).
    pub(crate) fn absent(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            db: Mutex::new(None),
        }
    }

    /// Whether a legacy database is open.
    pub(crate) fn is_open(&self) -> bool {
        lock(&self.db).is_some()
    }

    fn open(&self) -> Result<sled::Db, Error> {
        // sled's write threads keep the directory locked for a moment after the last
        // handle of a store is dropped, so a store reopened in the same process (tests) may
        // find it still locked.
        wait_for_lock(
            || {
                sled::Config::new()
                    .path(&self.dir)
                    .cache_capacity(LEGACY_CACHE_BYTES)
                    .open()
            },
            is_locked,
        )
        .map_err(Error::from)
    }

    /// The named tree, if a legacy database is open; with `create`, opening (creating)
    /// one first.
    fn tree(&self, name: &str, create: bool) -> Result<Option<sled::Tree>, Error> {
        let mut slot = lock(&self.db);
        if slot.is_none() && create {
            *slot = Some(self.open()?);
        }
        match slot.as_ref() {
            Some(db) => Ok(Some(db.open_tree(name)?)),
            None => Ok(None),
        }
    }

    pub(crate) fn flush(&self) -> Result<(), Error> {
        if let Some(db) = lock(&self.db).as_ref() {
            db.flush()?;
        }
        Ok(())
    }

    /// Closes the legacy sled database and removes its files once every tree in it is
    /// empty. Two readers empty it, each at its own pace: the spool's migration (at open)
    /// and the state journal, which deletes its legacy batches only once a run holds them
    /// (a flush after the start). So the files go at the first open after both are done;
    /// until then they stay, and a crash in between finds every entry still in one place.
    /// Returns whether the files were removed.
    pub(crate) fn retire_if_empty(&self) -> Result<bool, Error> {
        let mut slot = lock(&self.db);
        let Some(db) = slot.as_ref() else {
            return Ok(false);
        };
        if !db.is_empty() {
            return Ok(false);
        }
        for name in db.tree_names() {
            if !db.open_tree(&name)?.is_empty() {
                return Ok(false);
            }
        }
        db.flush()?;
        drop(slot.take());
        // Files first and `conf` last: a crash halfway leaves a folder that is either
        // still a (empty) sled store or none at all.
        for name in SLED_FILES {
            let path = self.dir.join(name);
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            match removed {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with("snap.") {
                std::fs::remove_file(entry.path())?;
            }
        }
        disk_seam::real().sync_dir(&self.dir)?;
        tracing::info!(path = %self.dir.display(), "legacy sled store migrated and removed");
        Ok(true)
    }
}

/// A key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// One named key space of the legacy sled database; cheap to clone.
#[derive(Clone)]
pub struct Tree {
    legacy: Arc<Legacy>,
    name: String,
}

impl Tree {
    pub(crate) fn new(legacy: Arc<Legacy>, name: &str) -> Self {
        Self {
            legacy,
            name: name.to_owned(),
        }
    }

    /// The tree's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn read(&self) -> Result<Option<sled::Tree>, Error> {
        self.legacy.tree(&self.name, false)
    }

    /// The value at `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        match self.read()? {
            Some(t) => Ok(t.get(key)?.map(|v| v.to_vec())),
            None => Ok(None),
        }
    }

    /// Sets `key`, creating the legacy database if the folder has none (for tests that
    /// write a store as an earlier version did). Not durable until [`Store::flush`].
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        if let Some(t) = self.legacy.tree(&self.name, true)? {
            t.insert(key, value)?;
        }
        Ok(())
    }

    /// Removes `key`, returning the old value.
    pub fn remove(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        match self.read()? {
            Some(t) => Ok(t.remove(key)?.map(|v| v.to_vec())),
            None => Ok(None),
        }
    }

    /// The first entry in key order.
    pub fn first(&self) -> Result<Option<Entry>, Error> {
        match self.read()? {
            Some(t) => Ok(t.first()?.map(|(k, v)| (k.to_vec(), v.to_vec()))),
            None => Ok(None),
        }
    }

    /// The last entry in key order.
    pub fn last(&self) -> Result<Option<Entry>, Error> {
        match self.read()? {
            Some(t) => Ok(t.last()?.map(|(k, v)| (k.to_vec(), v.to_vec()))),
            None => Ok(None),
        }
    }

    /// Up to `limit` entries with keys greater than `after` (or from the start).
    pub fn page(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, Error> {
        let Some(tree) = self.read()? else {
            return Ok(Vec::new());
        };
        let iter = match after {
            Some(k) => {
                tree.range::<&[u8], _>((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded))
            }
            None => tree.iter(),
        };
        iter.take(limit)
            .map(|r| {
                r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(Error::from)
            })
            .collect()
    }

    /// Writes everything the legacy database holds in memory to disk; blocks.
    pub fn flush(&self) -> Result<(), Error> {
        self.legacy.flush()
    }

    /// Number of entries (walks the tree: for startup and tests).
    pub fn len(&self) -> usize {
        self.read().ok().flatten().map_or(0, |t| t.len())
    }

    /// Whether the tree has no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
