//! The embedded sled database and its named trees; the only module that imports sled.
//!
//! sled's writes are not durable when they return (it flushes every 500 ms), so callers
//! that promise durability call [`Store::flush`], which groups concurrent callers so one
//! fsync serves them all.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// sled's page cache when the config does not say (`store.cache`). sled's own default
/// (1 GiB) would let the process grow past a sidecar's memory limit; sled holds only the
/// state journal's recent batches and the spool, which fit in far less.
pub const DEFAULT_CACHE_BYTES: u64 = 32 * 1024 * 1024;
/// How long an open waits for a lock that may be on its way out (see [`Store::open`]).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

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
    /// The disk refused a read or a write (full or failing).
    #[error("store I/O failed: {0}")]
    Disk(#[from] sled::Error),
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
            StoreError::NotDurable(_) | StoreError::Unreachable(_) | StoreError::Busy(_)
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
            StoreError::Corrupt(_) => "corrupt",
            StoreError::Stopped(_) => "stopped",
        }
    }
}

/// A failed read or write of a file beside the database (the runs of state on disk) is a
/// disk fault like sled's own.
impl From<std::io::Error> for StoreError {
    fn from(error: std::io::Error) -> Self {
        StoreError::Disk(sled::Error::Io(error))
    }
}

/// Whether sled failed to open because the directory's lock file is taken. sled reports it
/// as an I/O error of kind `Other` with the lock error in its text.
fn is_locked(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io)
        if io.kind() == std::io::ErrorKind::WouldBlock
            || io.to_string().contains("could not acquire lock"))
}

/// The database handle; cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    dir: PathBuf,
    flush: Arc<GroupFlush>,
}

/// Group commit: a caller that wrote before a flush started needs no flush of its own.
struct GroupFlush {
    /// Bumped by every caller that needs its writes on disk.
    requested: AtomicU64,
    /// The highest request number known to be on disk.
    done: AtomicU64,
    /// Serialises the fsyncs themselves.
    lock: tokio::sync::Mutex<()>,
}

impl Store {
    /// Opens (or creates) the database directory with the default cache.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with_cache(path, DEFAULT_CACHE_BYTES)
    }

    /// Opens (or creates) the database directory with a page cache of `cache_bytes`. A
    /// locked, unreadable or corrupt store is an error naming the path.
    pub fn open_with_cache(path: &Path, cache_bytes: u64) -> Result<Self, StoreError> {
        let open_err = |reason: String| StoreError::Open {
            path: path.to_owned(),
            reason,
        };
        std::fs::create_dir_all(path).map_err(|e| open_err(e.to_string()))?;
        let open = || {
            sled::Config::new()
                .path(path)
                .cache_capacity(cache_bytes)
                .open()
        };
        // sled's write threads keep the directory locked for a moment after the last handle
        // of a store is dropped, so a store reopened in the same process (tests) may find
        // it still locked; another process's lock lasts, and is reported after the wait.
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        let db = loop {
            match open() {
                Err(e) if is_locked(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) if is_locked(&e) => {
                    return Err(open_err(
                        "it is locked by another process (is another hookgate running on it?)"
                            .into(),
                    ))
                }
                other => break other.map_err(|e| open_err(e.to_string()))?,
            }
        };
        Ok(Self {
            db,
            dir: path.to_owned(),
            flush: Arc::new(GroupFlush {
                requested: AtomicU64::new(0),
                done: AtomicU64::new(0),
                lock: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// The database directory (the state's runs live in a folder inside it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A named tree (created if absent).
    pub fn tree(&self, name: &str) -> Result<Tree, StoreError> {
        Ok(Tree(self.db.open_tree(name)?))
    }

    /// Makes every write that returned before this call durable.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let mine = self.flush.requested.fetch_add(1, Ordering::SeqCst) + 1;
        let _guard = self.flush.lock.lock().await;
        if self.flush.done.load(Ordering::SeqCst) >= mine {
            return Ok(());
        }
        // Everything requested up to here was written before this fsync starts.
        let covered = self.flush.requested.load(Ordering::SeqCst);
        self.db.flush_async().await?;
        self.flush.done.fetch_max(covered, Ordering::SeqCst);
        Ok(())
    }

    /// Blocking flush, for shutdown.
    pub fn flush_blocking(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    /// Bytes the database occupies on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

/// A key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// One named key space.
#[derive(Clone)]
pub struct Tree(sled::Tree);

impl Tree {
    /// The value at `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.0.get(key)?.map(|v| v.to_vec()))
    }

    /// Sets `key`.
    pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.0.insert(key, value)?;
        Ok(())
    }

    /// Removes `key`, returning the old value.
    pub fn remove(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.0.remove(key)?.map(|v| v.to_vec()))
    }

    /// The first entry in key order.
    pub fn first(&self) -> Result<Option<Entry>, StoreError> {
        Ok(self.0.first()?.map(|(k, v)| (k.to_vec(), v.to_vec())))
    }

    /// The last entry in key order.
    pub fn last(&self) -> Result<Option<Entry>, StoreError> {
        Ok(self.0.last()?.map(|(k, v)| (k.to_vec(), v.to_vec())))
    }

    /// Up to `limit` entries with keys greater than `after` (or from the start).
    pub fn page(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let iter = match after {
            Some(k) => self
                .0
                .range::<&[u8], _>((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded)),
            None => self.0.iter(),
        };
        iter.take(limit)
            .map(|r| {
                r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(StoreError::from)
            })
            .collect()
    }

    /// Writes everything sled holds in memory (of every tree) to disk and fsyncs; blocks.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.0.flush()?;
        Ok(())
    }

    /// Number of entries (walks the tree: for startup and tests).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the tree has no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
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
    async fn pages() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let t = store.tree("t").expect("tree");
        for i in 0u8..5 {
            t.insert(&[b'p', i], &[i]).expect("insert");
        }
        let p = t.page(Some(&[b'p', 1]), 2).expect("page");
        assert_eq!(p.iter().map(|(k, _)| k[1]).collect::<Vec<_>>(), vec![2, 3]);
        store.flush().await.expect("flush");
    }
}
