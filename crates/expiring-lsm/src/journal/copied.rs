//! A flush's copy of the hot set's entries on their way to a run.

use crate::Digest;

/// The value bytes a flush's copy keeps room for per entry: a dedup mark with its
/// decision record, or a message's guard state, takes 40 to 60.
const VALUE_BYTES_KEPT: usize = 64;

/// A copy of the hot set's entries for a run: one buffer of values and a small fixed entry
/// per record, so the copy is much smaller than the hot set's own entries. Both buffers are
/// kept for the next flush: grown afresh each time, they were copied at every doubling and
/// their megabytes of new pages faulted in at every flush.
#[derive(Default)]
pub(super) struct Copied {
    /// Each record's key, expiry, and its value's offset and length in `values`.
    entries: Vec<(Digest, i64, u32, u32)>,
    values: Vec<u8>,
}

impl Copied {
    /// Empties the copy left by the last flush, giving back the room a burst grew it to
    /// beyond twice what `hot_entries` records need.
    pub(super) fn clear(&mut self, hot_entries: usize) {
        self.entries.clear();
        self.values.clear();
        let kept = hot_entries.saturating_mul(2);
        self.entries.shrink_to(kept);
        self.values.shrink_to(kept.saturating_mul(VALUE_BYTES_KEPT));
    }

    pub(super) fn push(&mut self, key: &Digest, expires_ms: i64, value: &[u8]) {
        let at = self.values.len() as u32;
        self.entries
            .push((*key, expires_ms, at, value.len() as u32));
        self.values.extend_from_slice(value);
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The records in key order.
    pub(super) fn sorted_records(&mut self) -> impl Iterator<Item = (&Digest, i64, &[u8])> {
        self.entries.sort_unstable_by_key(|e| e.0 .0);
        let values = &self.values;
        self.entries.iter().map(move |(key, expires_ms, at, len)| {
            let at = *at as usize;
            (key, *expires_ms, &values[at..at + *len as usize])
        })
    }
}
