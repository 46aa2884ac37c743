//! The store folder: the spool's database (redb) and, in stores written by earlier
//! versions, the legacy sled database read once for migration; the only module that opens
//! either. [`StoreError`] is the failure type of every store.
//!
//! The spool lives in `spool.redb`: a durable redb commit ends with an `fdatasync` of that
//! file, so what a commit returned for survives a power cut. redb reads and writes it
//! through the disk seam ([`SeamFile`]), and each open first makes the file durable as it
//! reads ([`spool_file`]), so that nothing is built on pages a failed sync left in the
//! page cache. sled (0.34) is kept only to read what earlier versions left: its flush
//! returns after `sync_file_range`, which neither writes metadata nor flushes the device
//! cache, and its `fsync` runs every 500 ms on a thread of its own, so nothing a 200
//! depends on may rest on it.
//!
//! The legacy sled database is opened only when the folder holds one (its `conf` or `db`
//! file). Its trees are read by the spool's migration and by the state journal's replay of
//! batches written before the journal had files ([`Store::tree`]); once every tree in it
//! is empty, [`Store::retire_legacy_if_empty`] closes it and removes its files.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use disk_seam::Disk;

mod spool_file;

pub use spool_file::SeamFile;
use spool_file::{lock_spool, make_folder, open_spool, probe_room, Fence};

/// The page cache of the spool's database when the config does not say (`store.cache`).
pub const DEFAULT_CACHE_BYTES: u64 = 32 * 1024 * 1024;
/// The spool's database file, inside the store folder.
pub const SPOOL_FILE: &str = "spool.redb";
/// sled's page cache while a legacy store is read: it is read once, page by page.
const LEGACY_CACHE_BYTES: u64 = 8 * 1024 * 1024;
/// How long an open waits for a lock that may be on its way out (see [`Store::open`]).
const LOCK_WAIT: Duration = Duration::from_secs(1);
/// The files and folders sled keeps in a store folder. `conf` is removed last: a folder
/// that still has it is opened as a sled store (see [`Store::retire_legacy_if_empty`]).
const SLED_FILES: [&str; 3] = ["db", "blobs", "conf"];

/// `Retry-After` of a delivery that met a transient store fault.
pub const RETRY_AFTER_TRANSIENT_SECS: u64 = 5;
/// `Retry-After` of a delivery that met a store fault an operator must fix.
pub const RETRY_AFTER_FAULT_SECS: u64 = 30;

/// The error a backend library reports, kept as the source of a [`StoreError`].
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A store failure, by the kind of fault: whether waiting may cure it, and what an operator
/// looks at. The message names the path or the operation, never a stored value.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be opened: locked by another process, unreadable or corrupt.
    #[error("cannot open store at {path}: {reason}")]
    Open { path: PathBuf, reason: String },
    /// The disk refused a read or a write (full or failing), or a database reported an
    /// I/O failure.
    #[error("store I/O failed: {0}")]
    Disk(#[source] Cause),
    /// Writes did not reach the disk within the wait.
    #[error("{0}")]
    NotDurable(String),
    /// Writes keep failing (a full or failing disk): kept and retried, but only an
    /// operator ends it.
    #[error("{0}")]
    Unwritable(String),
    /// The shared store did not answer within its deadline, or refused the call.
    #[error("redis: {0}")]
    Unreachable(#[source] Cause),
    /// Another request held the key for the whole wait: contention, not a failure.
    #[error("{0}")]
    Busy(&'static str),
    /// A lease (a claim or a guard-key lock) ended while its holder still worked, and
    /// another request took it: the holder's write was refused, its answer is 503, and the
    /// sender's retry is decided on the newer state.
    #[error("{0}")]
    LeaseLost(&'static str),
    /// Stored bytes could not be written or read in their format.
    #[error("stored data unreadable: {0}")]
    Corrupt(#[source] Cause),
    /// A background writer could not start, or has stopped.
    #[error("{0}")]
    Stopped(String),
}

impl StoreError {
    /// Whether the same call may succeed later without an operator: a busy key, a slow
    /// disk or an unreachable Redis pass; a full disk, corrupt data or a dead writer do not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::NotDurable(_)
                | StoreError::Unreachable(_)
                | StoreError::Busy(_)
                | StoreError::LeaseLost(_)
        )
    }

    /// Seconds a sender should wait before retrying a delivery that met this fault: a
    /// transient one passes within seconds; one that needs an operator does not, and
    /// retries every few seconds would only add load.
    pub fn retry_after_secs(&self) -> u64 {
        if self.is_transient() {
            RETRY_AFTER_TRANSIENT_SECS
        } else {
            RETRY_AFTER_FAULT_SECS
        }
    }

    /// The fault's name, for logs.
    pub fn fault(&self) -> &'static str {
        match self {
            StoreError::Open { .. } => "open",
            StoreError::Disk(_) => "disk",
            StoreError::NotDurable(_) => "not_durable",
            StoreError::Unwritable(_) => "unwritable",
            StoreError::Unreachable(_) => "unreachable",
            StoreError::Busy(_) => "busy",
            StoreError::LeaseLost(_) => "lease_lost",
            StoreError::Corrupt(_) => "corrupt",
            StoreError::Stopped(_) => "stopped",
        }
    }
}

/// A failed read or write of a file in the store folder is a disk fault.
impl From<std::io::Error> for StoreError {
    fn from(error: std::io::Error) -> Self {
        StoreError::Disk(Box::new(error))
    }
}

impl From<sled::Error> for StoreError {
    fn from(error: sled::Error) -> Self {
        StoreError::Disk(Box::new(error))
    }
}

impl From<redb::Error> for StoreError {
    fn from(error: redb::Error) -> Self {
        match error {
            redb::Error::Corrupted(_) => StoreError::Corrupt(Box::new(error)),
            other => StoreError::Disk(Box::new(other)),
        }
    }
}

/// Each of redb's error types, as the [`StoreError`] of its [`redb::Error`].
macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(error: $t) -> Self {
                StoreError::from(redb::Error::from(error))
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::SetDurabilityError
);

/// Whether sled failed to open because the directory's lock file is taken. sled reports it
/// as an I/O error of kind `Other` with the lock error in its text.
fn is_locked(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io)
        if io.kind() == std::io::ErrorKind::WouldBlock
            || io.to_string().contains("could not acquire lock"))
}

/// A reader's hold on a stopped store folder: while it lives, no gateway can open the
/// folder (its spool's database is open read-only, which a writer's open is refused).
pub struct ReadHold {
    _spool: Option<redb::ReadOnlyDatabase>,
}

impl ReadHold {
    /// Takes the hold on the store folder `path` without writing anything. A folder that
    /// holds no store, or one a running process holds, is an error that says so. A spool
    /// that needs the recovery a gateway's open does cannot be opened read-only: the hold
    /// is then taken without it.
    pub fn take(path: &Path) -> Result<Self, StoreError> {
        let open_err = |reason: String| StoreError::Open {
            path: path.to_owned(),
            reason,
        };
        let file = path.join(SPOOL_FILE);
        if !file.exists() {
            return Err(open_err(format!(
                "no hookgate store here (no {SPOOL_FILE}); --store names the folder of store.path"
            )));
        }
        match redb::ReadOnlyDatabase::open(&file) {
            Ok(db) => Ok(Self { _spool: Some(db) }),
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => Err(open_err(
                "it is held by another process (a running hookgate): ask that gateway instead, without --store".into(),
            )),
            Err(redb::DatabaseError::Storage(redb::StorageError::Io(e)))
                if e.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                Err(open_err(format!("{SPOOL_FILE} cannot be read: {e}")))
            }
            Err(_) => Ok(Self { _spool: None }),
        }
    }
}

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

/// The legacy sled database of the folder, opened when it holds one, or on the first
/// write into one of its trees (tests that write a store as an earlier version did).
struct Legacy {
    dir: PathBuf,
    db: Mutex<Option<sled::Db>>,
}

impl Store {
    /// Opens (or creates) the store folder with the default cache.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with_cache(path, DEFAULT_CACHE_BYTES)
    }

    /// Opens (or creates) the store folder, with a page cache of `cache_bytes` for the
    /// spool's database. A locked, unreadable or corrupt store is an error naming the path.
    /// A legacy sled database in the folder is opened too, or removed if nothing in it is
    /// left to migrate. The spool's database is read and written through the disk seam
    /// ([`SeamFile`]), as in the tests that run it on a simulated disk.
    pub fn open_with_cache(path: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        let open_err = |reason: String| StoreError::Open {
            path: path.to_owned(),
            reason,
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
        let legacy = Legacy {
            dir: path.to_owned(),
            db: Mutex::new(None),
        };
        if legacy_present(path) {
            let db = legacy.open().map_err(|e| open_err(e.to_string()))?;
            *lock_mutex(&legacy.db) = Some(db);
        }
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
    pub fn open_on(disk: Arc<dyn Disk>, path: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        make_folder(&*disk, path).map_err(|e| StoreError::Open {
            path: path.to_owned(),
            reason: e.to_string(),
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
            legacy: Arc::new(Legacy {
                dir: path.to_owned(),
                db: Mutex::new(None),
            }),
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

    /// Whether the disk has room for the spool's next commit ([`spool_file::probe_room`]).
    pub fn probe_room(&self) -> Result<(), StoreError> {
        Ok(probe_room(&*self.spool_file.disk, &self.dir)?)
    }

    /// Opens the spool's database again, as a process starting would (the file made
    /// durable as it reads first), after a commit met an I/O error: redb refuses every
    /// write from then on. The database open until now is fenced off its file first: any
    /// call it still makes fails. Not before the disk has room ([`spool_file::probe_room`]).
    pub fn reopen_spool(&self) -> Result<Arc<redb::Database>, StoreError> {
        self.probe_room()?;
        let file = &self.spool_file;
        let mut current = lock_mutex(&file.fence);
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
    pub fn tree(&self, name: &str) -> Result<Tree, StoreError> {
        Ok(Tree {
            legacy: self.legacy.clone(),
            name: name.to_owned(),
        })
    }

    /// Whether the folder holds a legacy sled database still open.
    pub fn has_legacy(&self) -> bool {
        lock_mutex(&self.legacy.db).is_some()
    }

    /// Closes the legacy sled database and removes its files once every tree in it is
    /// empty. Two readers empty it, each at its own pace: the spool's migration (at open)
    /// and the state journal, which deletes its legacy batches only once a run holds them
    /// (a flush after the start). So the files go at the first open after both are done;
    /// until then they stay, and a crash in between finds every entry still in one place.
    /// Returns whether the files were removed.
    pub fn retire_legacy_if_empty(&self) -> Result<bool, StoreError> {
        let mut slot = lock_mutex(&self.legacy.db);
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

    /// Makes the legacy sled database's writes durable, if one is open. The spool's
    /// commits are durable when they return and need no flush.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let legacy = self.legacy.clone();
        tokio::task::spawn_blocking(move || legacy.flush())
            .await
            .map_err(|e| StoreError::Stopped(format!("store flush did not run: {e}")))?
    }

    /// Blocking [`Store::flush`], for shutdown.
    pub fn flush_blocking(&self) -> Result<(), StoreError> {
        self.legacy.flush()
    }
}

impl Legacy {
    fn open(&self) -> Result<sled::Db, StoreError> {
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
        .map_err(StoreError::from)
    }

    /// The named tree, if a legacy database is open; with `create`, opening (creating)
    /// one first.
    fn tree(&self, name: &str, create: bool) -> Result<Option<sled::Tree>, StoreError> {
        let mut slot = lock_mutex(&self.db);
        if slot.is_none() && create {
            *slot = Some(self.open()?);
        }
        match slot.as_ref() {
            Some(db) => Ok(Some(db.open_tree(name)?)),
            None => Ok(None),
        }
    }

    fn flush(&self) -> Result<(), StoreError> {
        if let Some(db) = lock_mutex(&self.db).as_ref() {
            db.flush()?;
        }
        Ok(())
    }
}

/// Retries `open` while it fails with a lock `locked` says may be on its way out, up to
/// [`LOCK_WAIT`].
fn wait_for_lock<T, E>(
    mut open: impl FnMut() -> Result<T, E>,
    locked: impl Fn(&E) -> bool,
) -> Result<T, E> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match open() {
            Err(e) if locked(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

fn legacy_present(dir: &Path) -> bool {
    dir.join("conf").exists() || dir.join("db").exists()
}

fn lock_mutex<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
    /// The tree's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn read(&self) -> Result<Option<sled::Tree>, StoreError> {
        self.legacy.tree(&self.name, false)
    }

    /// The value at `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.read()? {
            Some(t) => Ok(t.get(key)?.map(|v| v.to_vec())),
            None => Ok(None),
        }
    }

    /// Sets `key`, creating the legacy database if the folder has none (for tests that
    /// write a store as an earlier version did). Not durable until [`Store::flush`].
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        if let Some(t) = self.legacy.tree(&self.name, true)? {
            t.insert(key, value)?;
        }
        Ok(())
    }

    /// Removes `key`, returning the old value.
    pub fn remove(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.read()? {
            Some(t) => Ok(t.remove(key)?.map(|v| v.to_vec())),
            None => Ok(None),
        }
    }

    /// The first entry in key order.
    pub fn first(&self) -> Result<Option<Entry>, StoreError> {
        match self.read()? {
            Some(t) => Ok(t.first()?.map(|(k, v)| (k.to_vec(), v.to_vec()))),
            None => Ok(None),
        }
    }

    /// The last entry in key order.
    pub fn last(&self) -> Result<Option<Entry>, StoreError> {
        match self.read()? {
            Some(t) => Ok(t.last()?.map(|(k, v)| (k.to_vec(), v.to_vec()))),
            None => Ok(None),
        }
    }

    /// Up to `limit` entries with keys greater than `after` (or from the start).
    pub fn page(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
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
                    .map_err(StoreError::from)
            })
            .collect()
    }

    /// Writes everything the legacy database holds in memory to disk; blocks.
    pub fn flush(&self) -> Result<(), StoreError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_that_waiting_cures_are_transient() {
        assert!(StoreError::Busy("held").is_transient());
        assert!(StoreError::NotDurable("slow fsync".into()).is_transient());
        assert!(StoreError::Unreachable("no answer".into()).is_transient());
        assert!(!StoreError::Corrupt("bad json".into()).is_transient());
        assert!(!StoreError::Stopped("writer gone".into()).is_transient());
        assert!(!StoreError::Unwritable("disk full".into()).is_transient());
        assert_eq!(StoreError::Busy("held").fault(), "busy");
        assert_eq!(StoreError::Busy("held").retry_after_secs(), 5);
        assert_eq!(
            StoreError::Unwritable("disk full".into()).retry_after_secs(),
            30
        );
    }

    #[tokio::test]
    async fn second_open_of_a_locked_store_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _first = Store::open(dir.path()).expect("first open");
        let err = Store::open(dir.path())
            .err()
            .expect("second open must fail");
        let text = err.to_string();
        assert!(text.contains(&dir.path().display().to_string()), "{text}");
        assert!(text.contains("locked by another process"), "{text}");
    }

    #[tokio::test]
    async fn legacy_pages_read_and_a_store_without_one_reads_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let t = store.tree("t").expect("tree");
        assert_eq!(t.first().expect("first"), None);
        assert!(!store.has_legacy(), "reads create no sled store");
        assert!(!dir.path().join("conf").exists());
        for i in 0u8..5 {
            t.insert(&[b'p', i], &[i]).expect("insert");
        }
        let p = t.page(Some(&[b'p', 1]), 2).expect("page");
        assert_eq!(p.iter().map(|(k, _)| k[1]).collect::<Vec<_>>(), vec![2, 3]);
        store.flush().await.expect("flush");
    }

    #[tokio::test]
    async fn a_legacy_store_is_removed_only_once_every_tree_in_it_is_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = Store::open(dir.path()).expect("open");
            store
                .tree("spool")
                .expect("tree")
                .insert(b"a", b"1")
                .expect("insert");
            store
                .tree("state")
                .expect("tree")
                .insert(b"b", b"2")
                .expect("insert");
            store.flush().await.expect("flush");
        }
        let store = Store::open(dir.path()).expect("reopen");
        assert!(store.has_legacy());
        store
            .tree("spool")
            .expect("tree")
            .remove(b"a")
            .expect("remove");
        assert!(
            !store.retire_legacy_if_empty().expect("retire"),
            "state is left"
        );
        assert!(dir.path().join("conf").exists());
        store
            .tree("state")
            .expect("tree")
            .remove(b"b")
            .expect("remove");
        assert!(store.retire_legacy_if_empty().expect("retire"));
        assert!(!store.has_legacy());
        for name in SLED_FILES {
            assert!(!dir.path().join(name).exists(), "{name} left behind");
        }
        assert!(dir.path().join(SPOOL_FILE).exists());
        assert_eq!(store.tree("state").expect("tree").len(), 0);
    }
}
