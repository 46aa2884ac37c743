//! What the spool tells its owner as it runs: its counts after each change and each
//! restart of its drainer (the gateway turns them into metrics), and a thread that hangs
//! (the gateway's liveness check phrases it).

use std::time::Duration;

/// The spool's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Entries waiting in order.
    pub depth: u64,
    /// Bytes of the entries in main and held.
    pub bytes: u64,
    /// Entries held apart.
    pub held: u64,
    /// Entries parked.
    pub parked: u64,
}

/// Where the spool reports.
pub trait Report: Send + Sync {
    /// The counts changed.
    fn counts(&self, counts: Counts);
    /// The drainer failed (a panic) and is started again.
    fn drainer_restarted(&self);
}

/// A report nobody reads: for tools and tests.
pub struct Unreported;

impl Report for Unreported {
    fn counts(&self, _: Counts) {}
    fn drainer_restarted(&self) {}
}

/// A thread of the spool that has been in one step for longer than the deadline it was
/// asked about ([`crate::Spool::hung`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hung {
    /// Which thread: "spool's writer thread" or "spool's drainer".
    pub thread: &'static str,
    /// The step it is in: "commit" or "step".
    pub step: &'static str,
    /// How long it has been in it.
    pub busy: Duration,
}
