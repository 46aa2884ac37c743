//! [`StoreError`], the failure type of every store the gateway uses (the spool, the local
//! state journal, Redis), by the kind of fault: whether waiting may cure it, what an
//! operator looks at, and the `Retry-After` a sender is given. The spool's and the state
//! journal's own errors convert into it, keeping their kind.

use std::path::PathBuf;

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

/// The state engine's failures keep their kind.
impl From<expiring_lsm::Error> for StoreError {
    fn from(error: expiring_lsm::Error) -> Self {
        use expiring_lsm::Error as E;
        match error {
            E::Open { path, reason } => StoreError::Open { path, reason },
            E::Disk(cause) => StoreError::Disk(cause),
            E::NotDurable(message) => StoreError::NotDurable(message),
            E::Unwritable(message) => StoreError::Unwritable(message),
            E::Corrupt(cause) => StoreError::Corrupt(cause),
            damaged @ E::Damaged { .. } => StoreError::Corrupt(Box::new(damaged)),
            E::Stopped(message) => StoreError::Stopped(message),
        }
    }
}

/// The spool's store failures keep their kind.
impl From<durable_spool::Error> for StoreError {
    fn from(error: durable_spool::Error) -> Self {
        use durable_spool::Error as E;
        match error {
            E::Open { path, reason } => StoreError::Open { path, reason },
            E::Disk(cause) => StoreError::Disk(cause),
            E::NotDurable(message) => StoreError::NotDurable(message),
            E::Corrupt(cause) => StoreError::Corrupt(cause),
            E::Stopped(message) => StoreError::Stopped(message),
        }
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
}
