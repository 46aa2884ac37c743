//! The store's failure type, by the kind of fault: whether waiting may cure it, and what an
//! operator looks at. A message names the path or the operation, never a stored value.

use std::path::PathBuf;

/// The error a file system or a legacy source reports, kept as the source of an [`Error`].
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A failure of the store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store cannot be opened: unreadable or corrupt.
    #[error("cannot open store at {path}: {reason}")]
    Open { path: PathBuf, reason: String },
    /// The disk refused a read or a write (full or failing).
    #[error("store I/O failed: {0}")]
    Disk(#[source] Cause),
    /// Writes did not reach the disk within the wait.
    #[error("{0}")]
    NotDurable(String),
    /// Writes keep failing (a full or failing disk): kept and retried, but only an
    /// operator ends it.
    #[error("{0}")]
    Unwritable(String),
    /// Stored bytes fail their check (a checksum, a bound): the file and the byte where the
    /// damage is, and what failed. Nothing is answered from them.
    #[error("store damaged: {} at byte {offset}: {what}; see \"A damaged state run\" in docs/guarantees.md", file.display())]
    Damaged {
        file: PathBuf,
        offset: u64,
        what: String,
    },
    /// Stored bytes could not be read in their format.
    #[error("stored data unreadable: {0}")]
    Corrupt(#[source] Cause),
    /// A background thread could not start, or has stopped.
    #[error("{0}")]
    Stopped(String),
}

/// A failed read or write of a file of the store is a disk fault.
impl From<std::io::Error> for Error {
    fn from(error: std::io::Error) -> Self {
        Error::Disk(Box::new(error))
    }
}
