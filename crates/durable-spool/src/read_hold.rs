//! A reader's hold on a stopped store folder, for tools that read it while no gateway runs.

use std::path::Path;

use crate::error::{Error, StoreFault};
use crate::spool_file::SPOOL_FILE;

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
    pub fn take(path: &Path) -> Result<Self, Error> {
        let open_err = |reason: String| {
            Error(StoreFault::Open {
                path: path.to_owned(),
                reason,
            })
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
