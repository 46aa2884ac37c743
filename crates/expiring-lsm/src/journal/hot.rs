//! The hot set: recent entries in [`SHARDS`] maps chosen by digest, each behind its own
//! mutex, with what the runs said of the last keys a map lacked.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::HashMap;

use nohash_hasher::BuildNoHashHasher;

use super::settings::PageReads;
use crate::run::Record;
use crate::runs::Runs;
use crate::{Digest, Error};

/// The hot set is split so that two runtime workers rarely want the same lock and growing a
/// part (which rehashes it under its lock) is short.
pub(super) const SHARDS: usize = 1024;
/// While runs cannot be written, the hot set takes new keys up to this many times
/// `hot_entries`, then refuses them: its memory stays bounded, and so does the journal a
/// restart replays.
pub(super) const HOT_SET_LIMIT_FACTOR: usize = 4;
/// Runs lookups remembered per shard (see [`Shard::looked_up`]). The read and the write of
/// one request come close together, and a shard sees few lookups between them.
const LOOKUPS_KEPT: usize = 4;
/// Values up to this long are held inline in their entry: hookgate's dedup marks with
/// their decision records (39 bytes for an event's, 49 for a request id's naming a
/// 36-character event id) and a message's guard state (about 50). On the heap, each would
/// be an allocation by a request and a free by the flush thread, whose frees reach the
/// requests' threads' allocator pages from another core.
const INLINE: usize = 62;

pub(super) struct Entry {
    pub(super) value: Value,
    /// When the entry may be forgotten.
    pub(super) expires_ms: i64,
    /// Where its record is. One field for both kinds, so that an entry is no larger for
    /// what a memory-only value may cover.
    kind: Kind,
}

/// A durable record, or a memory-only value and what it covers.
enum Kind {
    /// The journal batch holding the record.
    Durable(u64),
    /// A memory-only value, over the key's latest durable record while no run holds it.
    /// That record is the key's value on disk, so a flush writes it in the entry's place
    /// (the journal batches below the run are no longer replayed) and a release of the
    /// memory-only value brings it back; a run's older record never stands in for it.
    MemoryOnly(Option<Box<Covered>>),
}

/// A durable record a memory-only value covers (see [`Kind::MemoryOnly`]).
pub(super) struct Covered {
    value: Value,
    expires_ms: i64,
    batch: u64,
}

impl Entry {
    /// A durable record of journal batch `batch`, or a memory-only value (`None`).
    pub(super) fn new(value: &[u8], expires_ms: i64, batch: Option<u64>) -> Self {
        Self {
            value: Value::new(value),
            expires_ms,
            kind: batch.map_or(Kind::MemoryOnly(None), Kind::Durable),
        }
    }

    /// The journal batch holding its record; `None` for a memory-only value.
    pub(super) fn batch(&self) -> Option<u64> {
        match self.kind {
            Kind::Durable(batch) => Some(batch),
            Kind::MemoryOnly(_) => None,
        }
    }

    /// The key's latest durable record (its value and expiry) if it is in a batch below
    /// `durable_below`: the record a run of those batches must hold for the key.
    pub(super) fn durable_below(&self, durable_below: u64) -> Option<(&[u8], i64)> {
        match &self.kind {
            Kind::Durable(batch) => {
                (*batch < durable_below).then(|| (self.value.as_slice(), self.expires_ms))
            }
            Kind::MemoryOnly(covered) => covered
                .as_ref()
                .filter(|c| c.batch < durable_below)
                .map(|c| (c.value.as_slice(), c.expires_ms)),
        }
    }

    /// Whether the entry stays once a run holds the batches below `durable_below`: not if
    /// the run holds its record; a memory-only value stays, without the record it covered
    /// if the run holds that.
    pub(super) fn stays_after_run(&mut self, durable_below: u64) -> bool {
        match &mut self.kind {
            Kind::Durable(batch) => *batch >= durable_below,
            Kind::MemoryOnly(covered) => {
                if covered.as_ref().is_some_and(|c| c.batch < durable_below) {
                    *covered = None;
                }
                true
            }
        }
    }

    /// Takes over, if this entry is a memory-only value, the durable record `replaced`
    /// (the entry it replaces) holds or covers itself.
    pub(super) fn cover(&mut self, replaced: Entry) {
        let Kind::MemoryOnly(covered) = &mut self.kind else {
            return;
        };
        *covered = match replaced.kind {
            Kind::Durable(batch) => Some(Box::new(Covered {
                value: replaced.value,
                expires_ms: replaced.expires_ms,
                batch,
            })),
            Kind::MemoryOnly(under) => under,
        };
    }

    /// The durable record this memory-only entry covers, as an entry of its own.
    pub(super) fn uncovered(&mut self) -> Option<Entry> {
        let Kind::MemoryOnly(covered) = &mut self.kind else {
            return None;
        };
        covered.take().map(|c| Entry {
            value: c.value,
            expires_ms: c.expires_ms,
            kind: Kind::Durable(c.batch),
        })
    }
}

/// A value held inline when it is small (a dedup mark is), on the heap otherwise.
pub(super) enum Value {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl Value {
    pub(super) fn new(value: &[u8]) -> Self {
        match u8::try_from(value.len()) {
            Ok(len) if value.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..value.len()].copy_from_slice(value);
                Value::Inline { len, bytes }
            }
            _ => Value::Heap(value.into()),
        }
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        match self {
            Value::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Value::Heap(b) => b,
        }
    }
}

/// One part of the hot set, with what the runs said of the last keys it lacked.
#[derive(Default)]
pub(super) struct Shard {
    /// A hash map: a lookup costs one or two cache misses.
    pub(super) map: HashMap<Digest, Entry, BuildNoHashHasher<Digest>>,
    /// The runs' answers for the last [`LOOKUPS_KEPT`] keys `map` lacked, oldest first: a
    /// request that reads a key and then writes it (guard state, a request id's mark)
    /// looks through the runs once, not twice. An answer goes when its key enters `map`;
    /// until then a run can only lose the record to a merge that finds it expired, and
    /// every reader checks expiry itself.
    pub(super) looked_up: Vec<(Digest, Option<Record>)>,
}

/// The map of the hot set that holds `key`.
pub(super) fn shard_of(key: &Digest) -> usize {
    usize::from(u16::from_le_bytes([key.0[0], key.0[1]])) % SHARDS
}

/// The runs' record of `key`, which the hot set lacks: remembered in `looked_up`, or read
/// and remembered there. A key a run's filter may hold is looked up through `page_reads`.
/// The caller holds the key's shard lock.
pub(super) fn on_disk<'a>(
    looked_up: &'a mut Vec<(Digest, Option<Record>)>,
    key: &Digest,
    runs: &Runs,
    page_reads: PageReads,
) -> Result<Option<&'a Record>, Error> {
    let at = match looked_up.iter().position(|(k, _)| k == key) {
        Some(at) => at,
        None => {
            let record = if runs.may_contain(key) {
                let mut found = None;
                page_reads(&mut || found = Some(runs.get(key)));
                found.unwrap_or_else(|| runs.get(key))?
            } else {
                None
            };
            if looked_up.len() == LOOKUPS_KEPT {
                looked_up.remove(0);
            }
            looked_up.push((*key, record));
            looked_up.len() - 1
        }
    };
    Ok(looked_up[at].1.as_ref())
}

/// The current value and expiry of a key: its entry in the hot set (`slot`), else its
/// record in the runs (`on_disk`), else none (and an expiry before any other).
pub(super) fn current_of<'a>(
    slot: &'a MapEntry<'_, Digest, Entry>,
    on_disk: Option<&'a Record>,
) -> (Option<&'a [u8]>, i64) {
    match (slot, on_disk) {
        (MapEntry::Occupied(found), _) => {
            let e = found.get();
            (Some(e.value.as_slice()), e.expires_ms)
        }
        (MapEntry::Vacant(_), Some(record)) => (Some(&record.value[..]), record.expires_ms),
        (MapEntry::Vacant(_), None) => (None, i64::MIN),
    }
}
