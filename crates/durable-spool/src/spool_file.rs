//! The spool's database file: the store folder made and synced, the lock against a second
//! process, the file made durable as it reads before redb opens it, and redb's storage
//! over the disk seam ([`SeamFile`]).

use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};

use disk_seam::{Disk, DiskFile};

use crate::error::{Error, StoreFault};

/// The spool's database file, inside the store folder.
pub const SPOOL_FILE: &str = "spool.redb";

/// Closed (true) once the database that uses a storage is replaced: every call of that
/// storage then fails, so the replaced database can neither write over the new one's
/// pages nor read them half-written. A read-write lock, so fencing waits for the calls
/// under way.
pub(crate) type Fence = Arc<RwLock<bool>>;

/// Creates the store folder (and its parents) and syncs the folder's own entry into its
/// parent: a power cut that takes the folder back takes the spool with it, and a sync of
/// that entry that failed in an earlier run must not stay failed.
pub(crate) fn make_folder(disk: &dyn Disk, dir: &Path) -> std::io::Result<()> {
    if let Some(e) = disk_seam::create_store_folder(disk, dir)? {
        let parent = disk_seam::parent_of(dir);
        tracing::warn!(error = %e, dir = %parent.display(), "store folder's parent not synced");
    }
    Ok(())
}

/// Takes the lock that keeps a second process off the spool's database (`flock`, as redb's
/// own file backend and earlier versions take it). `Err(None)` when another process holds
/// it.
pub(crate) fn lock_spool(file: &Path) -> Result<std::fs::File, Option<std::io::Error>> {
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(file)
        .map_err(Some)?;
    match handle.try_lock() {
        Ok(()) => Ok(handle),
        Err(std::fs::TryLockError::WouldBlock) => Err(None),
        Err(std::fs::TryLockError::Error(e)) => Err(Some(e)),
    }
}

/// Opens the spool's database in `dir` on `disk`. Before redb reads it, its name is synced
/// into the folder and its data is written again and synced
/// ([`disk_seam::rewrite_as_read`]): what the next commits build on is then on the disk,
/// not only in the page cache.
pub(crate) fn open_spool(
    disk: &dyn Disk,
    dir: &Path,
    cache_bytes: u64,
    lock: Option<Arc<std::fs::File>>,
    fence: Fence,
) -> Result<redb::Database, Error> {
    let open_err = |reason: String| {
        Error(StoreFault::Open {
            path: dir.to_owned(),
            reason,
        })
    };
    let file = disk
        .open_rw(&dir.join(SPOOL_FILE))
        .map_err(|e| open_err(e.to_string()))?;
    // The name of a file created by an earlier run whose sync of the folder failed must
    // survive a power cut with the commits in it.
    disk.sync_dir(dir).map_err(|e| open_err(e.to_string()))?;
    // After a failed `fdatasync` the kernel may keep the failed pages in the page cache,
    // marked clean: a process restarted without a power cut reads them, redb opens on them
    // and later commits point into them, yet a power cut takes them away and with them
    // every root (redb then cannot open the file at all).
    disk_seam::rewrite_as_read(&*file)
        .map_err(|e| open_err(format!("{SPOOL_FILE} not made durable: {e}")))?;
    let cache = usize::try_from(cache_bytes).unwrap_or(usize::MAX);
    redb::Database::builder()
        .set_cache_size(cache)
        // Every page's checksum is verified at each open, not only after a crash: a file
        // damaged while hookgate was stopped cleanly is refused with an error, where a plain
        // open trusts it (and may panic on it).
        .set_check_integrity_on_open(true)
        .create_with_backend(SeamFile {
            file,
            fence,
            _lock: lock,
        })
        .map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => open_err(
                "it is locked by another process (is another hookgate running on it?)".into(),
            ),
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(found)) => {
                open_err(damaged(&found))
            }
            // redb's word for a file whose first bytes do not name its format: for the file
            // the spool made, damage.
            redb::DatabaseError::Storage(redb::StorageError::Io(e))
                if e.kind() == std::io::ErrorKind::InvalidData =>
            {
                open_err(damaged(&e.to_string()))
            }
            // redb asks for an upgrade of a file of its formats 1 and 2; the spool has only
            // ever written format 3, so such a header is a damaged one.
            redb::DatabaseError::UpgradeRequired(version) => open_err(damaged(&format!(
                "its header names redb's file format {version}, which the spool never wrote"
            ))),
            other => open_err(format!("{SPOOL_FILE}: {other}")),
        })
}

/// What an open says of damage redb found in the file: with two-phase commits, pages that
/// fail their checksums at a recovery are damage, not a commit cut short, and rolling back
/// past them would lose pushes answered Ok. The file is left as it is for the operator.
fn damaged(found: &str) -> String {
    format!(
        "{SPOOL_FILE} is damaged ({found}); it is left as it is and nothing is read from it: \
         see \"A damaged spool\" in docs/guarantees.md"
    )
}

/// The file [`probe_room`] writes, inside the store folder.
const PROBE_FILE: &str = "spool.room-probe";
/// Bytes [`probe_room`] writes: a block of the file system.
const PROBE_BYTES: usize = 4096;

/// Writes and syncs a block in a file of its own, then removes it: whether the disk has
/// room, asked before the database is opened again after an error. Opened again on a full
/// disk, the database would take the small commit that sets back what the failed one
/// touched and count as taking writes, while every event it is given is refused.
pub(crate) fn probe_room(disk: &dyn Disk, dir: &Path) -> std::io::Result<()> {
    let path = dir.join(PROBE_FILE);
    let file = disk.create(&path)?;
    let written = file
        .write_all_at(&[0xa5; PROBE_BYTES], 0)
        .and_then(|()| file.sync_data());
    let removed = disk.remove(&path);
    written.and(removed)
}

/// redb's storage in a file of the disk seam: every read, write, resize and sync of the
/// spool's database goes through [`DiskFile`], in production and in tests alike.
pub struct SeamFile {
    file: Arc<dyn DiskFile>,
    /// Closed when the database is opened again ([`crate::store::Store::reopen_spool`]).
    fence: Fence,
    /// The `flock` that keeps a second process off the file (real disks only), held as long
    /// as redb holds its storage.
    _lock: Option<Arc<std::fs::File>>,
}

impl SeamFile {
    /// Runs `op` on the file unless the fence is closed.
    fn guarded<T>(
        &self,
        op: impl FnOnce(&dyn DiskFile) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let closed = self.fence.read().unwrap_or_else(PoisonError::into_inner);
        if *closed {
            return Err(std::io::Error::other(
                "the spool's database was opened again; this handle is closed",
            ));
        }
        op(&*self.file)
    }
}

impl std::fmt::Debug for SeamFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SeamFile")
    }
}

impl redb::StorageBackend for SeamFile {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.guarded(|f| f.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.guarded(|f| f.read_exact_at(out, offset))
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.guarded(|f| f.set_len(len))
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.guarded(|f| f.sync_data())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.guarded(|f| f.write_all_at(data, offset))
    }
}
