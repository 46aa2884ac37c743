//! The entries the drainer failed on: the last one, and one it failed on twice in a row,
//! which the next pass parks ([`crate::supervise`]).

use crate::tables::EntryRef;

/// Entries the drainer failed on.
#[derive(Default)]
pub(crate) struct Failures {
    /// The entry of the last failure.
    last: Option<EntryRef>,
    /// An entry it failed on twice in a row, for the next pass to park.
    to_park: Option<EntryRef>,
}

impl Failures {
    /// Pins a failure on `entry`, the entry the pass was working on: the second failure in
    /// a row on the same entry marks it to be parked.
    pub(crate) fn note(&mut self, entry: Option<EntryRef>) {
        if entry.is_some() && entry == self.last {
            self.to_park = entry;
            self.last = None;
        } else {
            self.last = entry;
        }
    }

    /// The entry marked to be parked, if any; the mark is taken.
    pub(crate) fn take_marked(&mut self) -> Option<EntryRef> {
        self.to_park.take()
    }

    /// The entry marked to be parked.
    #[cfg(test)]
    pub(crate) fn to_park(&self) -> Option<EntryRef> {
        self.to_park
    }
}
