//! Where the store folder meets `expiring-lsm`: the legacy sled tree as the journal's
//! source of batches written before it had files.

use durable_spool::{Entry, Tree};

/// The state journal's batches of a store written before the journal had files of its own:
/// a tree of the store folder's legacy sled database.
pub struct LegacyJournal(pub Tree);

impl expiring_lsm::LegacyBatches for LegacyJournal {
    fn page(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, expiring_lsm::Error> {
        self.0
            .page(after, limit)
            .map_err(|e| expiring_lsm::Error::Disk(Box::new(e)))
    }
    fn remove(&self, key: &[u8]) -> Result<(), expiring_lsm::Error> {
        self.0
            .remove(key)
            .map(|_| ())
            .map_err(|e| expiring_lsm::Error::Disk(Box::new(e)))
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}
