//! Duplicate detection: claim / in-flight / done marks per key, their expiry and sweep.
//!
//! The decisions (what a stored mark means at a given time) are pure functions; the sled
//! I/O wraps them with compare-and-swap so of two concurrent claims exactly one wins.

use std::time::Duration;

use crate::store::{StoreError, Tree};

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

/// Whether a sweep at `now_ms` may delete the mark. In-flight marks are kept for twice the
/// lease so a slow publisher's `done` still finds its own claim.
pub fn is_garbage(mark: &Mark, now_ms: i64, lease_ms: i64) -> bool {
    match mark {
        Mark::Done { expires_ms } => *expires_ms <= now_ms,
        Mark::InFlight { since_ms, .. } => now_ms - since_ms >= 2 * lease_ms,
    }
}

/// Binary form: tag byte then two little-endian i64s.
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

/// Reads [`encode`]'s form; unknown bytes read as no mark (and get overwritten).
pub fn decode(bytes: &[u8]) -> Option<Mark> {
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

/// The store key of an event id.
pub fn event_key(route: &str, event_id: &str) -> Vec<u8> {
    format!("{route}\0event:{event_id}").into_bytes()
}

/// The store key of a request id.
pub fn request_key(route: &str, request_id: &str) -> Vec<u8> {
    format!("{route}\0request:{request_id}").into_bytes()
}

/// Dedup marks in a sled tree.
#[derive(Clone)]
pub struct SledMarks {
    tree: Tree,
    lease_ms: i64,
}

impl SledMarks {
    /// Marks in `tree`, with in-flight leases of `lease`.
    pub fn new(tree: Tree, lease: Duration) -> Self {
        Self {
            tree,
            lease_ms: lease.as_millis() as i64,
        }
    }

    /// The key's state now.
    pub fn state(&self, key: &[u8], now_ms: i64) -> Result<KeyState, StoreError> {
        let mark = self.tree.get(key)?.as_deref().and_then(decode);
        Ok(classify(mark.as_ref(), now_ms, self.lease_ms))
    }

    /// Claims `key` for `token` if it is free (absent, expired or a stale lease).
    pub fn try_claim(&self, key: &[u8], token: u64, now_ms: i64) -> Result<Claim, StoreError> {
        let claim = encode(&Mark::InFlight {
            token,
            since_ms: now_ms,
        });
        // Most keys are new: swap from absent first, and read the mark only on a miss.
        let mut expected: Option<Vec<u8>> = None;
        loop {
            let current = match self
                .tree
                .swap_or_current(key, expected.as_deref(), Some(&claim))?
            {
                Ok(()) => return Ok(Claim::Claimed),
                Err(current) => current,
            };
            let mark = current.as_deref().and_then(decode);
            match classify(mark.as_ref(), now_ms, self.lease_ms) {
                KeyState::Done => return Ok(Claim::Done),
                KeyState::InFlight => return Ok(Claim::InFlight),
                // Expired or left over: swap again against what is there now.
                KeyState::Free => expected = current,
            }
        }
    }

    /// Records the keys as done until `expires_ms`.
    pub fn mark_done(&self, keys: &[&[u8]], expires_ms: i64) -> Result<(), StoreError> {
        let done = encode(&Mark::Done { expires_ms });
        for key in keys {
            self.tree.insert(key, &done)?;
        }
        Ok(())
    }

    /// Gives a claim back, if `token` still holds it, so the sender's retry can claim it.
    pub fn release(&self, key: &[u8], token: u64) -> Result<(), StoreError> {
        let current = self.tree.get(key)?;
        if let Some(Mark::InFlight { token: t, .. }) = current.as_deref().and_then(decode) {
            if t == token {
                self.tree.compare_and_swap(key, current.as_deref(), None)?;
            }
        }
        Ok(())
    }

    /// Deletes garbage marks, a page at a time so the tree is never held for long.
    /// Returns how many were removed.
    pub fn sweep(&self, now_ms: i64) -> Result<usize, StoreError> {
        const PAGE: usize = 10_000;
        let mut removed = 0;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = self.tree.page(after.as_deref(), PAGE)?;
            let Some((last, _)) = page.last() else {
                return Ok(removed);
            };
            after = Some(last.clone());
            for (key, value) in &page {
                let garbage = decode(value).is_none_or(|m| is_garbage(&m, now_ms, self.lease_ms));
                // Compare-and-swap: a mark rewritten since the read (a new claim) is kept.
                if garbage && self.tree.compare_and_swap(key, Some(value), None)? {
                    removed += 1;
                }
            }
        }
    }

    /// Number of marks (walks the tree).
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    /// Whether there are no marks.
    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
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

    #[test]
    fn claim_done_release_and_sweep_with_an_injected_clock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = crate::store::Store::open(dir.path()).expect("open");
        let marks = SledMarks::new(store.tree("d").expect("tree"), Duration::from_secs(30));
        let key = event_key("r", "e1");
        assert_eq!(marks.try_claim(&key, 1, 0).expect("claim"), Claim::Claimed);
        assert_eq!(
            marks.try_claim(&key, 2, 10).expect("claim"),
            Claim::InFlight
        );
        // A lease older than 30 s is a crash leftover and can be taken over.
        assert_eq!(
            marks.try_claim(&key, 2, 30_000).expect("claim"),
            Claim::Claimed
        );
        // The first owner's release must not free the new owner's claim.
        marks.release(&key, 1).expect("release");
        assert_eq!(
            marks.state(&key, 30_001).expect("state"),
            KeyState::InFlight
        );
        marks.release(&key, 2).expect("release");
        assert_eq!(marks.state(&key, 30_001).expect("state"), KeyState::Free);

        let ttl_end = 72 * 3600 * 1000;
        marks.mark_done(&[&key], ttl_end).expect("done");
        assert_eq!(
            marks.try_claim(&key, 3, ttl_end - 1).expect("claim"),
            Claim::Done
        );
        assert_eq!(marks.sweep(ttl_end - 1).expect("sweep"), 0);
        assert_eq!(
            marks.try_claim(&key, 3, ttl_end).expect("claim"),
            Claim::Claimed
        );
        marks.release(&key, 3).expect("release");
        marks.mark_done(&[&key], ttl_end).expect("done");
        assert_eq!(marks.sweep(ttl_end).expect("sweep"), 1);
        assert!(marks.is_empty());
    }
}
