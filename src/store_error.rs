//! [`StoreError`], the failure type of every store the gateway uses (the spool, the local
//! state journal, Redis), by the kind of fault: whether waiting may cure it, what an
//! operator looks at, and the `Retry-After` a sender is given. The faults of the stores on
//! disk are one type, [`StoreFault`], that the state journal's error is and the spool's
//! wraps; each converts into a [`StoreError`] keeping its kind.

pub use expiring_lsm::StoreFault;

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
    /// A fault of a store on disk (the spool, the state journal): it cannot be opened, the
    /// disk refuses or delays writes, stored bytes are damaged, a writer has stopped.
    #[error(transparent)]
    OnDisk(#[from] StoreFault),
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
}

impl StoreError {
    /// Whether the same call may succeed later without an operator: a busy key, a slow
    /// disk or an unreachable Redis pass; a full disk, corrupt data or a dead writer do not.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::OnDisk(fault) => fault.is_transient(),
            StoreError::Unreachable(_) | StoreError::Busy(_) | StoreError::LeaseLost(_) => true,
        }
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
            StoreError::OnDisk(fault) => fault.name(),
            StoreError::Unreachable(_) => "unreachable",
            StoreError::Busy(_) => "busy",
            StoreError::LeaseLost(_) => "lease_lost",
        }
    }
}

/// A failed read or write of a file in the store folder is a disk fault.
impl From<std::io::Error> for StoreError {
    fn from(error: std::io::Error) -> Self {
        StoreError::OnDisk(error.into())
    }
}

/// The spool's store failures keep their kind.
impl From<durable_spool::Error> for StoreError {
    fn from(error: durable_spool::Error) -> Self {
        StoreError::OnDisk(error.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_that_waiting_cures_are_transient() {
        let on_disk = |fault: StoreFault| StoreError::from(fault);
        assert!(StoreError::Busy("held").is_transient());
        assert!(on_disk(StoreFault::NotDurable("slow fsync".into())).is_transient());
        assert!(StoreError::Unreachable("no answer".into()).is_transient());
        assert!(!on_disk(StoreFault::Corrupt("bad json".into())).is_transient());
        assert!(!on_disk(StoreFault::Stopped("writer gone".into())).is_transient());
        assert!(!on_disk(StoreFault::Unwritable("disk full".into())).is_transient());
        assert_eq!(StoreError::Busy("held").fault(), "busy");
        assert_eq!(StoreError::Busy("held").retry_after_secs(), 5);
        let full = on_disk(StoreFault::Unwritable("disk full".into()));
        assert_eq!((full.fault(), full.retry_after_secs()), ("unwritable", 30));
    }
}
