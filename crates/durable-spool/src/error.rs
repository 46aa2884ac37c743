//! The spool's failure types: [`Error`], a failure of its store by the kind of fault, and
//! [`SpoolError`], why a push or an operator's request was refused. A message names the
//! path or the operation, never a stored value.

pub use disk_seam::{Cause, StoreFault};

use crate::record::RecordError;

/// A failure of the spool's store: a fault of a store on disk. A type of the spool's own,
/// so that the errors of its database libraries convert into it.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Error(#[from] pub StoreFault);

impl Error {
    /// Whether the same call may succeed later without an operator
    /// ([`StoreFault::is_transient`]).
    pub fn is_transient(&self) -> bool {
        self.0.is_transient()
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
        Error(StoreFault::from(error))
    }
}

impl From<sled::Error> for Error {
    fn from(error: sled::Error) -> Self {
        Error(StoreFault::Disk(Box::new(error)))
    }
}

impl From<redb::Error> for Error {
    fn from(error: redb::Error) -> Self {
        Error(match error {
            redb::Error::Corrupted(_) => StoreFault::Corrupt(Box::new(error)),
            other => StoreFault::Disk(Box::new(other)),
        })
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
