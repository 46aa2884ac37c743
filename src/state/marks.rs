//! Duplicate detection: claim / in-flight / done marks per key and their expiry; a done
//! mark carries its decision record (`state::decision`).
//!
//! The decisions (what a stored mark means at a given time) are pure functions; the local
//! backend applies them under the state journal's per-key lock, so of two concurrent claims
//! exactly one wins (Redis: `state::redis`).

use std::sync::Arc;
use std::time::Duration;

use expiring_lsm::journal::{Change, Journal};

use crate::state::keys::StoreKey;
use crate::store_error::StoreError;

/// A stored mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// A request is processing the event; `token` identifies it, `since_ms` starts its lease.
    InFlight { token: u64, since_ms: i64 },
    /// The event was handled; the mark counts until `expires_ms`.
    Done { expires_ms: i64 },
}

/// What a mark means now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// Absent, expired, or an in-flight lease left over from a crash: may be claimed.
    Free,
    /// Another request holds a live claim.
    InFlight,
    /// Handled before and still remembered.
    Done,
}

/// Outcome of a claim attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This request owns the key and must finish with `done` or `release`.
    Claimed,
    /// Another request holds it.
    InFlight,
    /// Already handled.
    Done,
}

/// The meaning of `mark` at `now_ms` with in-flight leases of `lease_ms`.
pub fn classify(mark: Option<&Mark>, now_ms: i64, lease_ms: i64) -> KeyState {
    match mark {
        None => KeyState::Free,
        Some(Mark::Done { expires_ms }) if *expires_ms > now_ms => KeyState::Done,
        Some(Mark::Done { .. }) => KeyState::Free,
        Some(Mark::InFlight { since_ms, .. }) if now_ms - since_ms < lease_ms => KeyState::InFlight,
        Some(Mark::InFlight { .. }) => KeyState::Free,
    }
}

/// Tag of a done mark followed by its decision record: `[3][expires_ms i64 LE][record]`.
const DONE_WITH_RECORD: u8 = 3;

/// Binary form: tag byte then two little-endian i64s. A done mark with a decision record
/// is [`encode_done`]'s.
pub fn encode(mark: &Mark) -> [u8; 17] {
    let mut out = [0u8; 17];
    let (tag, a, b) = match *mark {
        Mark::InFlight { token, since_ms } => (1u8, token as i64, since_ms),
        Mark::Done { expires_ms } => (2u8, expires_ms, 0),
    };
    out[0] = tag;
    out[1..9].copy_from_slice(&a.to_le_bytes());
    out[9..17].copy_from_slice(&b.to_le_bytes());
    out
}

/// A done mark until `expires_ms` that carries `record`.
pub fn encode_done(expires_ms: i64, record: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + record.len());
    out.push(DONE_WITH_RECORD);
    out.extend_from_slice(&expires_ms.to_le_bytes());
    out.extend_from_slice(record);
    out
}

/// Calls `f` with [`encode_done`]'s bytes, made on the stack when they fit (a delivery's
/// marks do: every accepted event writes two, and the store copies them anyway).
fn with_done<R>(expires_ms: i64, record: &[u8], f: impl FnOnce(&[u8]) -> R) -> R {
    const ROOM: usize = 96;
    let len = 9 + record.len();
    if len > ROOM {
        return f(&encode_done(expires_ms, record));
    }
    let mut bytes = [0u8; ROOM];
    bytes[0] = DONE_WITH_RECORD;
    bytes[1..9].copy_from_slice(&expires_ms.to_le_bytes());
    bytes[9..len].copy_from_slice(record);
    f(&bytes[..len])
}

/// The decision record of a done mark's bytes; `None` for a claim or a done mark written
/// before marks carried records.
pub fn record_of(bytes: &[u8]) -> Option<&[u8]> {
    (bytes.first() == Some(&DONE_WITH_RECORD))
        .then(|| bytes.get(9..))
        .flatten()
}

/// Reads [`encode`]'s and [`encode_done`]'s forms; unknown bytes read as no mark (and get
/// overwritten).
pub fn decode(bytes: &[u8]) -> Option<Mark> {
    if bytes.first() == Some(&DONE_WITH_RECORD) {
        let expires_ms = i64::from_le_bytes(bytes.get(1..9)?.try_into().ok()?);
        return Some(Mark::Done { expires_ms });
    }
    if bytes.len() != 17 {
        return None;
    }
    let a = i64::from_le_bytes(bytes[1..9].try_into().ok()?);
    let b = i64::from_le_bytes(bytes[9..17].try_into().ok()?);
    match bytes[0] {
        1 => Some(Mark::InFlight {
            token: a as u64,
            since_ms: b,
        }),
        2 => Some(Mark::Done { expires_ms: a }),
        _ => None,
    }
}

/// A mark as [`JournalMarks::read`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMark {
    /// What it means now.
    pub state: KeyState,
    /// When a done mark stops counting (Unix ms).
    pub expires_ms: Option<i64>,
    /// A done mark's decision record, when it carries one.
    pub record: Option<Vec<u8>>,
}

/// What stored `bytes` mean at `now_ms`; `None` when they count as no mark.
pub fn stored_mark(bytes: &[u8], now_ms: i64, lease_ms: i64) -> Option<StoredMark> {
    let mark = decode(bytes)?;
    let state = classify(Some(&mark), now_ms, lease_ms);
    if state == KeyState::Free {
        return None;
    }
    let expires_ms = match mark {
        Mark::Done { expires_ms } => Some(expires_ms),
        Mark::InFlight { .. } => None,
    };
    Some(StoredMark {
        state,
        expires_ms,
        record: record_of(bytes).map(<[u8]>::to_vec),
    })
}

/// Dedup marks of the local backend, kept in the state [`Journal`].
#[derive(Clone)]
pub struct JournalMarks {
    journal: Arc<Journal>,
    lease_ms: i64,
}

impl JournalMarks {
    /// Marks in `journal`, with in-flight leases of `lease`.
    pub fn new(journal: Arc<Journal>, lease: Duration) -> Self {
        Self {
            journal,
            lease_ms: lease.as_millis() as i64,
        }
    }

    /// The key's state now.
    pub fn state(&self, key: &StoreKey, now_ms: i64) -> Result<KeyState, StoreError> {
        let mark = self.journal.get(&key.digest())?.as_deref().and_then(decode);
        Ok(classify(mark.as_ref(), now_ms, self.lease_ms))
    }

    /// Claims `key` for `token` if it is free (absent, expired or a stale lease). The check
    /// and the claim happen under one lock, so of two concurrent claims exactly one wins.
    pub fn try_claim(&self, key: &StoreKey, token: u64, now_ms: i64) -> Result<Claim, StoreError> {
        let claim = encode(&Mark::InFlight {
            token,
            since_ms: now_ms,
        });
        Ok(self.journal.modify(&key.digest(), now_ms, |current| {
            let mark = current.and_then(decode);
            match classify(mark.as_ref(), now_ms, self.lease_ms) {
                KeyState::Done => (Change::Keep, Claim::Done),
                KeyState::InFlight => (Change::Keep, Claim::InFlight),
                KeyState::Free => {
                    // Claims stay in memory: after a crash nothing is in flight.
                    let change = Change::Put {
                        value: &claim,
                        expires_ms: now_ms + 2 * self.lease_ms,
                        durable: false,
                    };
                    (change, Claim::Claimed)
                }
            }
        })?)
    }

    /// Records the keys as done until `expires_ms`, each with its decision record.
    pub fn mark_done(
        &self,
        marks: &[(&StoreKey, &[u8])],
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        for (key, record) in marks {
            with_done(expires_ms, record, |done| {
                self.journal.put(&key.digest(), done, expires_ms, now_ms)
            })?;
        }
        Ok(())
    }

    /// The key's mark as stored, if one counts at `now_ms`: its state, expiry (done marks)
    /// and decision record (done marks that carry one).
    pub fn read(&self, key: &StoreKey, now_ms: i64) -> Result<Option<StoredMark>, StoreError> {
        let Some(bytes) = self.journal.get(&key.digest())? else {
            return Ok(None);
        };
        Ok(stored_mark(&bytes, now_ms, self.lease_ms))
    }

    /// Rewrites the record of `key`'s live done mark with `update` (same expiry), under the
    /// key's lock; the mark's expiry when written, `None` when the key holds no done mark
    /// with a record, or `update` declines. A durable write, though nobody waits for it: a
    /// crash may lose the count, never the mark.
    pub fn update_record(
        &self,
        key: &StoreKey,
        now_ms: i64,
        update: impl FnOnce(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<Option<i64>, StoreError> {
        let mut buffer = Vec::new();
        let buffer_ref = &mut buffer;
        Ok(self.journal.modify(&key.digest(), now_ms, move |current| {
            let live = current.and_then(|bytes| match decode(bytes) {
                Some(Mark::Done { expires_ms }) if expires_ms > now_ms => {
                    record_of(bytes).map(|r| (expires_ms, r))
                }
                _ => None,
            });
            let Some((expires_ms, Some(new))) = live.map(|(e, r)| (e, update(r))) else {
                return (Change::Keep, None);
            };
            *buffer_ref = encode_done(expires_ms, &new);
            // The new value lives in the caller's buffer, beyond this call.
            let value: &Vec<u8> = buffer_ref;
            let change = Change::Put {
                value,
                expires_ms,
                durable: true,
            };
            (change, Some(expires_ms))
        })?)
    }

    /// Marks `key` done until `expires_ms` with `record` if nothing holds it (a request id
    /// a duplicate came under); false when a mark counts there already.
    pub fn mark_done_if_free(
        &self,
        key: &StoreKey,
        record: &[u8],
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let done = encode_done(expires_ms, record);
        Ok(self.journal.modify(&key.digest(), now_ms, |current| {
            let mark = current.and_then(decode);
            match classify(mark.as_ref(), now_ms, self.lease_ms) {
                KeyState::Free => {
                    let change = Change::Put {
                        value: &done,
                        expires_ms,
                        durable: true,
                    };
                    (change, true)
                }
                _ => (Change::Keep, false),
            }
        })?)
    }

    /// Gives a claim back, if `token` still holds it, so the sender's retry can claim it.
    pub fn release(&self, key: &StoreKey, token: u64) {
        self.journal.forget_volatile_if(
            &key.digest(),
            |value| matches!(decode(value), Some(Mark::InFlight { token: t, .. }) if t == token),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_covers_every_state() {
        let lease = 30_000;
        assert_eq!(classify(None, 0, lease), KeyState::Free);
        let done = Mark::Done { expires_ms: 100 };
        assert_eq!(classify(Some(&done), 99, lease), KeyState::Done);
        assert_eq!(classify(Some(&done), 100, lease), KeyState::Free);
        let inflight = Mark::InFlight {
            token: 7,
            since_ms: 1000,
        };
        assert_eq!(
            classify(Some(&inflight), 1000 + lease - 1, lease),
            KeyState::InFlight
        );
        assert_eq!(
            classify(Some(&inflight), 1000 + lease, lease),
            KeyState::Free
        );
    }

    #[test]
    fn encoding_round_trips() {
        for m in [
            Mark::InFlight {
                token: u64::MAX,
                since_ms: -5,
            },
            Mark::Done {
                expires_ms: 1 << 50,
            },
        ] {
            assert_eq!(decode(&encode(&m)), Some(m));
        }
        assert_eq!(decode(b"junk"), None);
    }

    /// The journal in `dir`, on the real disk, with or without its threads.
    fn open_journal(dir: &std::path::Path, background: bool) -> Arc<Journal> {
        let settings = expiring_lsm::journal::Settings {
            hot_entries: usize::MAX,
            ttl: Duration::from_secs(86_400),
            clock: Arc::new(|| 0),
            segment_bytes: 1 << 20,
            commit_interval: Duration::from_millis(1),
            durable_wait: Duration::from_secs(5),
            needs_restart: Arc::new(|_| {}),
            disk: disk_seam::real(),
            background,
            page_reads: expiring_lsm::journal::read_here,
        };
        let legacy = Arc::new(expiring_lsm::NoLegacy);
        Journal::open(legacy, dir, 0, settings).expect("open")
    }

    #[test]
    fn a_claim_stays_in_memory_and_a_done_mark_outlives_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lease = Duration::from_secs(30);
        let marks = JournalMarks::new(open_journal(dir.path(), false), lease);
        let (claimed, done) = (
            StoreKey::event("r", "claimed"),
            StoreKey::event("r", "done"),
        );
        for (key, token) in [(&claimed, 1), (&done, 2)] {
            assert_eq!(
                marks.try_claim(key, token, 0).expect("claim"),
                Claim::Claimed
            );
        }
        marks
            .mark_done(&[(&done, b"record")], 60_000, 0)
            .expect("done");
        marks.journal.write_now().expect("commit");
        drop(marks);
        let marks = JournalMarks::new(open_journal(dir.path(), false), lease);
        let state = |key| marks.state(key, 1).expect("state");
        assert_eq!(state(&claimed), KeyState::Free, "a claim reached the disk");
        assert_eq!(state(&done), KeyState::Done, "a done mark was lost");
    }

    #[test]
    fn claim_done_release_and_expiry_in_memory_and_on_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let journal = open_journal(dir.path(), true);
        let marks = JournalMarks::new(journal.clone(), Duration::from_secs(30));
        let key = StoreKey::event("r", "e1");
        let claim = |token, now| marks.try_claim(&key, token, now).expect("claim");
        let state = |now| marks.state(&key, now).expect("state");
        assert_eq!(claim(1, 0), Claim::Claimed);
        assert_eq!(claim(2, 10), Claim::InFlight);
        // A lease older than 30 s is a leftover and can be taken over.
        assert_eq!(claim(2, 30_000), Claim::Claimed);
        // The first owner's release must not free the new owner's claim.
        marks.release(&key, 1);
        assert_eq!(state(30_001), KeyState::InFlight);
        marks.release(&key, 2);
        assert_eq!(state(30_001), KeyState::Free);

        let ttl_end = 72 * 3600 * 1000;
        marks
            .mark_done(&[(&key, b"r")], ttl_end, 30_002)
            .expect("done");
        assert_eq!(claim(3, ttl_end - 1), Claim::Done);
        // On disk, the mark counts the same.
        journal.flush_to_run().expect("flush");
        assert_eq!((journal.hot_len(), journal.runs()), (0, 1));
        assert_eq!(claim(3, ttl_end - 1), Claim::Done);
        assert_eq!(claim(3, ttl_end), Claim::Claimed, "expired on disk");
        // A released claim leaves the expired mark on disk, which is free.
        marks.release(&key, 3);
        assert_eq!(state(ttl_end), KeyState::Free);
        assert_eq!(claim(4, ttl_end), Claim::Claimed);
        marks
            .mark_done(&[(&key, b"r")], 2 * ttl_end, ttl_end)
            .expect("done");
        assert_eq!(claim(5, 2 * ttl_end - 1), Claim::Done);
    }

    #[test]
    fn a_done_mark_made_on_the_stack_is_the_one_encode_done_makes() {
        for len in [0, 36, 87, 88, 200] {
            let record = vec![b'r'; len];
            let made = with_done(-7, &record, <[u8]>::to_vec);
            assert_eq!(made, encode_done(-7, &record), "a record of {len} bytes");
        }
    }

    #[test]
    fn a_done_mark_carries_its_record_and_one_written_before_records_still_counts() {
        let with = encode_done(500, b"the record");
        assert_eq!(decode(&with), Some(Mark::Done { expires_ms: 500 }));
        assert_eq!(record_of(&with), Some(&b"the record"[..]));
        let old = encode(&Mark::Done { expires_ms: 500 });
        assert_eq!(record_of(&old), None);
        let read = stored_mark(&old, 499, 30_000).expect("an old done mark counts");
        assert_eq!(
            (read.state, read.expires_ms, read.record),
            (KeyState::Done, Some(500), None)
        );
        assert_eq!(stored_mark(&old, 500, 30_000), None, "expired");
        let claim = encode(&Mark::InFlight {
            token: 1,
            since_ms: 0,
        });
        assert_eq!(record_of(&claim), None);
        assert_eq!(
            stored_mark(&claim, 1, 30_000).map(|m| m.state),
            Some(KeyState::InFlight)
        );
        assert_eq!(decode(&[DONE_WITH_RECORD, 1, 2]), None, "cut short");
    }

    #[test]
    fn a_record_is_updated_in_place_and_a_free_request_key_is_marked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let journal = open_journal(dir.path(), true);
        let marks = JournalMarks::new(journal.clone(), Duration::from_secs(30));
        let (event, request) = (StoreKey::event("r", "e"), StoreKey::request("r", "q"));
        let append = |r: &[u8]| Some([r, b"+"].concat());
        let updated = |now| marks.update_record(&event, now, append).expect("update");
        assert_eq!(updated(0), None, "no mark");
        assert_eq!(
            marks.try_claim(&event, 1, 0).expect("claim"),
            Claim::Claimed
        );
        assert_eq!(updated(0), None, "a claim");
        marks.mark_done(&[(&event, b"r")], 1000, 0).expect("done");
        assert_eq!(updated(10), Some(1000));
        let read = marks.read(&event, 10).expect("read").expect("mark");
        assert_eq!(
            (read.expires_ms, read.record),
            (Some(1000), Some(b"r+".to_vec()))
        );
        assert_eq!(updated(1000), None, "expired");
        // A mark from before records is left as it is.
        journal
            .put(
                &event.digest(),
                &encode(&Mark::Done { expires_ms: 2000 }),
                2000,
                0,
            )
            .expect("put");
        assert_eq!(updated(10), None);

        assert!(marks
            .mark_done_if_free(&request, b"q", 1000, 0)
            .expect("mark"));
        assert!(!marks
            .mark_done_if_free(&request, b"other", 1000, 0)
            .expect("mark"));
        let read = marks.read(&request, 1).expect("read").expect("mark");
        assert_eq!(read.record, Some(b"q".to_vec()));
        assert_eq!(marks.state(&request, 1).expect("state"), KeyState::Done);
    }
}
