//! Where the journal finds batches written before it had segment files of its own.

use crate::Error;

/// A key and its value, as a legacy source pages them.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Journal batches kept by an older store, keyed by their sequence number (big-endian
/// `u64`): the journal replays them at open and removes each once a run holds it.
pub trait LegacyBatches: Send + Sync {
    /// Up to `limit` entries after the key `after` (from the first when `None`), in key
    /// order.
    fn page(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<Entry>, Error>;
    /// Removes one entry.
    fn remove(&self, key: &[u8]) -> Result<(), Error>;
    /// How many entries are left.
    fn len(&self) -> usize;
    /// Whether none are left.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A store with no legacy batches.
pub struct NoLegacy;

impl LegacyBatches for NoLegacy {
    fn page(&self, _after: Option<&[u8]>, _limit: usize) -> Result<Vec<Entry>, Error> {
        Ok(Vec::new())
    }
    fn remove(&self, _key: &[u8]) -> Result<(), Error> {
        Ok(())
    }
    fn len(&self) -> usize {
        0
    }
}
