//! The store's failure type: the faults of a store on disk that [`disk_seam`] names, by
//! their kind. A message names the path or the operation, never a stored value.

pub use disk_seam::{Cause, StoreFault};

/// A failure of the store: nothing it meets is not a fault of a store on disk.
pub type Error = StoreFault;
