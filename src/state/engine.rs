//! Where the store folder meets `expiring-lsm`: the engine's failures as [`StoreError`]s,
//! and the legacy sled tree as the journal's source of batches written before it had files.

use crate::store::{Entry, StoreError, Tree};

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

/// The state journal's batches of a store written before the journal had files of its own.
impl expiring_lsm::LegacyBatches for Tree {
    fn page(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, expiring_lsm::Error> {
        Tree::page(self, after, limit).map_err(|e| expiring_lsm::Error::Disk(Box::new(e)))
    }
    fn remove(&self, key: &[u8]) -> Result<(), expiring_lsm::Error> {
        Tree::remove(self, key)
            .map(|_| ())
            .map_err(|e| expiring_lsm::Error::Disk(Box::new(e)))
    }
    fn len(&self) -> usize {
        Tree::len(self)
    }
}
