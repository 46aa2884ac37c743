//! How far the journal is on disk, as the writer publishes it, and the points in the
//! journal that callers wait for.

/// How far the journal is on disk, published by the writer to the waiting requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Progress {
    /// Every batch below this sequence number is on disk.
    pub(super) durable_below: u64,
    /// The last failed write or flush covered every batch below this sequence number.
    pub(super) failed_below: u64,
}

/// A point in the journal: the batches a request's answer depends on end below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncPoint(pub(super) u64);
