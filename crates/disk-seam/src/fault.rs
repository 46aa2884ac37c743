//! [`StoreFault`], the faults every store on disk can meet, by their kind: whether waiting
//! may cure one, and what an operator looks at. The stores' own errors are this type or
//! wrap it, so a fault keeps its kind from the file system up to the answer a sender gets.
//! A message names the path or the operation, never a stored value.

use std::path::PathBuf;

/// The error a file system or a backend library reports, kept as the source of a
/// [`StoreFault`].
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A fault of a store on disk.
#[derive(Debug, thiserror::Error)]
pub enum StoreFault {
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
    /// Stored bytes fail their check (a checksum, a bound): the file and the byte where the
    /// damage is, and what failed. Nothing is answered from them.
    #[error("store damaged: {} at byte {offset}: {what}; see \"A damaged state run\" in docs/guarantees.md", file.display())]
    Damaged {
        file: PathBuf,
        offset: u64,
        what: String,
    },
    /// Stored bytes could not be written or read in their format.
    #[error("stored data unreadable: {0}")]
    Corrupt(#[source] Cause),
    /// A background thread could not start, or has stopped.
    #[error("{0}")]
    Stopped(String),
}

impl StoreFault {
    /// Whether the same call may succeed later without an operator: a commit that was only
    /// late passes; a full or failing disk, damaged data or a dead thread do not.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreFault::NotDurable(_))
    }

    /// The fault's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            StoreFault::Open { .. } => "open",
            StoreFault::Disk(_) => "disk",
            StoreFault::NotDurable(_) => "not_durable",
            StoreFault::Unwritable(_) => "unwritable",
            StoreFault::Damaged { .. } => "damaged",
            StoreFault::Corrupt(_) => "corrupt",
            StoreFault::Stopped(_) => "stopped",
        }
    }
}

/// A failed read or write of a file of a store is a disk fault.
impl From<std::io::Error> for StoreFault {
    fn from(error: std::io::Error) -> Self {
        StoreFault::Disk(Box::new(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_late_commit_passes_by_itself() {
        assert!(StoreFault::NotDurable("slow fsync".into()).is_transient());
        assert!(!StoreFault::Unwritable("disk full".into()).is_transient());
        assert!(!StoreFault::Corrupt("bad bytes".into()).is_transient());
        assert!(!StoreFault::Stopped("writer gone".into()).is_transient());
        let io = StoreFault::from(std::io::Error::from(std::io::ErrorKind::StorageFull));
        assert_eq!(io.name(), "disk");
        assert!(!io.is_transient());
    }
}
