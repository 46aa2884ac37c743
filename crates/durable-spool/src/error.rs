//! The spool's failure types: [`Error`], a failure of its store by the kind of fault, and
//! [`SpoolError`], why a push or an operator's request was refused. A message names the
//! path or the operation, never a stored value.

use std::path::PathBuf;

use crate::record::RecordError;

/// The error a backend library reports, kept as the source of an [`Error`].
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A failure of the spool's store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store cannot be opened: locked by another process, unreadable or corrupt.
    #[error("cannot open store at {path}: {reason}")]
    Open { path: PathBuf, reason: String },
    /// The disk refused a read or a write (full or failing), or the database reported an
    /// I/O failure.
    #[error("store I/O failed: {0}")]
    Disk(#[source] Cause),
    /// Writes did not reach the disk within the wait.
    #[error("{0}")]
    NotDurable(String),
    /// Stored bytes could not be written or read in their format.
    #[error("stored data unreadable: {0}")]
    Corrupt(#[source] Cause),
    /// The writer thread could not start, or has stopped.
    #[error("{0}")]
    Stopped(String),
}

impl Error {
    /// Whether the same call may succeed later without an operator: a commit that was only
    /// late; a failing disk, corrupt data or a dead writer do not pass.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::NotDurable(_))
    }
}

/// Why an event could not be spooled (the sender should retry), or why an operator's
/// request on a parked entry failed.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool is disabled")]
    Disabled,
    #[error("spool is full ({bytes} of {max} bytes)")]
    Full { bytes: u64, max: u64 },
    #[error("no parked entry {0}")]
    NotParked(u64),
    #[error("parked entry {0} cannot be decoded; it can only be deleted")]
    Undecodable(u64),
    #[error("the event cannot be written as a spool record: {0}")]
    Record(#[from] RecordError),
    #[error(transparent)]
    Store(#[from] Error),
}

/// A failed read or write of a file in the store folder is a disk fault.
impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        Error::Disk(Box::new(error))
    }
}

impl From<sled::Error> for Error {
    fn from(error: sled::Error) -> Self {
        Error::Disk(Box::new(error))
    }
}

impl From<redb::Error> for Error {
    fn from(error: redb::Error) -> Self {
        match error {
            redb::Error::Corrupted(_) => Error::Corrupt(Box::new(error)),
            other => Error::Disk(Box::new(other)),
        }
    }
}

/// Each of redb's error types, as the [`Error`] of its [`redb::Error`].
macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(error: $t) -> Self {
                Error::from(redb::Error::from(error))
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
