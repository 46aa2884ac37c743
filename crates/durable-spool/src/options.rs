//! What the spool's owner sets: whether it takes events, its bound, and when a drainer
//! that makes no progress counts as stalled.

use std::time::Duration;

/// The spool's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Whether events are taken; when false every push is refused.
    pub enabled: bool,
    /// The most bytes of entries in main and held; a push past it is refused.
    pub max_bytes: u64,
    /// How long entries may wait in order without the drainer making progress before the
    /// spool reports itself stalled.
    pub stall_after: Duration,
}
