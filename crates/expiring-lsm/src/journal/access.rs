//! A caller's reads and changes of keys: the hot set first, then the runs, newest first.

use std::collections::hash_map::Entry as MapEntry;
use std::sync::atomic::Ordering;

use super::change::Change;
use super::hot::{current_of, on_disk, Entry, Shard};
use super::settings::PageReads;
use super::Journal;
use crate::{Digest, Error};

impl Journal {
    /// The value of `key`, if any (expired values stay until a sweep; callers judge them).
    pub fn get(&self, key: &Digest) -> Result<Option<Vec<u8>>, Error> {
        let key = *key;
        let mut shard = self.shared.shard(&key);
        if let Some(entry) = shard.map.get(&key) {
            return Ok(Some(entry.value.as_slice().to_vec()));
        }
        // After the hot set: a flush registers its run before it forgets the entries. Read
        // under the shard lock, as `modify` does, so no write of the key comes between the
        // read and the answer it leaves in `looked_up`.
        let record = on_disk(
            &mut shard.looked_up,
            &key,
            &self.shared.runs,
            self.page_reads(),
        )?;
        Ok(record.map(|r| r.value.clone()))
    }

    fn page_reads(&self) -> PageReads {
        self.shared.settings.page_reads
    }

    /// Sets `key` durably.
    pub fn put(
        &self,
        key: &Digest,
        value: &[u8],
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<(), Error> {
        self.modify(key, now_ms, |_| {
            (
                Change::Put {
                    value,
                    expires_ms,
                    durable: true,
                },
                (),
            )
        })
    }

    /// Reads and changes `key` atomically: `decide` sees the current value and says what
    /// to do; its second result is returned.
    pub fn modify<'v, R>(
        &self,
        key: &Digest,
        now_ms: i64,
        decide: impl FnOnce(Option<&[u8]>) -> (Change<'v>, R),
    ) -> Result<R, Error> {
        let key = *key;
        let mut shard = self.shared.shard(&key);
        let Shard { map, looked_up } = &mut *shard;
        // One probe of the table for the read and the write.
        let slot = map.entry(key);
        // A key the hot set lacks is read from the runs under the shard lock, so a
        // concurrent claim of the same key waits for this one's decision.
        let on_disk = match &slot {
            MapEntry::Occupied(_) => None,
            MapEntry::Vacant(_) => on_disk(looked_up, &key, &self.shared.runs, self.page_reads())?,
        };
        let (current, current_expires) = current_of(&slot, on_disk);
        let (change, result) = decide(current);
        let Change::Put {
            value,
            expires_ms,
            durable,
        } = change
        else {
            return Ok(result);
        };
        if matches!(slot, MapEntry::Vacant(_)) && self.shared.refuses_new_keys() {
            return Err(Error::Unwritable(
                "state runs cannot be written and the hot set is full".into(),
            ));
        }
        // Never earlier than the record it supersedes (see the module's last paragraph).
        let expires_ms = expires_ms.max(current_expires);
        let batch = durable.then(|| self.shared.append(&key, expires_ms, value, now_ms));
        let entry = Entry::new(value, expires_ms, batch);
        match slot {
            MapEntry::Occupied(mut found) => {
                let replaced = found.insert(entry);
                // A memory-only value keeps the key's durable record (see `hot::Kind`).
                found.get_mut().cover(replaced);
            }
            MapEntry::Vacant(free) => {
                free.insert(entry);
                looked_up.retain(|(k, _)| *k != key);
                drop(shard);
                self.shared.count_one_more_hot();
            }
        }
        Ok(result)
    }

    /// Forgets `key` if its value is memory-only and `forget` says so: the key holds its
    /// latest durable value again. Durable values are only forgotten by expiry: a removed
    /// one would come back on replay.
    pub fn forget_volatile_if(&self, key: &Digest, forget: impl FnOnce(&[u8]) -> bool) {
        let key = *key;
        let mut shard = self.shared.shard(&key);
        let MapEntry::Occupied(mut found) = shard.map.entry(key) else {
            return;
        };
        let entry = found.get_mut();
        if entry.batch().is_some() || !forget(entry.value.as_slice()) {
            return;
        }
        match entry.uncovered() {
            // Not in a run yet: the hot set keeps it.
            Some(durable) => *entry = durable,
            // In a run, or none: the runs answer.
            None => {
                found.remove();
                self.shared.hot_count.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}
