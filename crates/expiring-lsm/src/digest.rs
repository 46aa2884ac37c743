//! The store's keys: digests of the caller's keys.

use std::hash::{Hash, Hasher};

use nohash_hasher::IsEnabled;
use sha2::{Digest as _, Sha256};

/// The first 16 bytes of a key's SHA-256: a record held by digest costs the same small
/// memory whatever the length of its key. A collision needs about 2^64 chosen keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digest(pub [u8; 16]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        let full = Sha256::digest(bytes);
        let mut d = [0; 16];
        d.copy_from_slice(&full[..16]);
        Digest(d)
    }
}

/// The digest is already uniformly random, so its bytes are the hash; no second hash
/// function runs. Bytes 8..16, because bytes 0 and 1 pick the journal's shard and would be
/// alike for every key of one shard.
impl Hash for Digest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let mut half = [0; 8];
        half.copy_from_slice(&self.0[8..]);
        state.write_u64(u64::from_le_bytes(half));
    }
}

impl IsEnabled for Digest {}
