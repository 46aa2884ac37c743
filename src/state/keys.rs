//! Store keys: the one place their formats are defined. A key is built once per request and
//! carries both forms a backend needs: its bytes (Redis, with the separators made readable)
//! and its digest (the sled journal holds digests, not keys).
//!
//! Formats, with NUL as the separator:
//! - dedup by event id: `{route}\0event:{id}`; by request id: `{route}\0request:{id}`;
//! - guard state: `{route}\0{kind}\0{part}\0{part}…`, or, when a part holds NUL or `:`,
//!   `{route}\0{kind}#\0{sha256 of the length-prefixed parts, hex}`.

use sha2::{Digest as _, Sha256};

pub use expiring_lsm::Digest;

/// A key of the state store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreKey {
    bytes: Vec<u8>,
    digest: Digest,
}

impl StoreKey {
    fn new(bytes: Vec<u8>) -> Self {
        let digest = Digest::of(&bytes);
        Self { bytes, digest }
    }

    /// The dedup key of an event id.
    pub fn event(route: &str, event_id: &str) -> Self {
        Self::new(joined(&[route, "\0event:", event_id]))
    }

    /// The dedup key of an inbound message, by its message id (routes that reconcile).
    pub fn message(route: &str, message_id: &str) -> Self {
        Self::new(joined(&[route, "\0message:", message_id]))
    }

    /// The dedup key of a request id.
    pub fn request(route: &str, request_id: &str) -> Self {
        Self::new(joined(&[route, "\0request:", request_id]))
    }

    /// The key of one guard key's state (`kind` is `status` or `keyword`): the bytes of
    /// [`guard_key`].
    pub fn guard(route: &str, kind: &str, parts: &[&str]) -> Self {
        Self::new(guard_key(route, kind, parts).into_bytes())
    }

    /// A key of the given bytes, for tools and tests that work below the formats above.
    pub fn raw(bytes: &[u8]) -> Self {
        Self::new(bytes.to_vec())
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The key's digest, computed when the key was built.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// The Redis form: `prefix`, the space's own prefix, then the key with NUL shown as
    /// `:`.
    pub fn redis_form(&self, prefix: &str, space: RedisSpace) -> Vec<u8> {
        let mut out = format!("{prefix}{}", space.prefix()).into_bytes();
        out.extend(self.bytes.iter().map(|b| if *b == 0 { b':' } else { *b }));
        out
    }

    /// The Redis Cluster form: `prefix`, a hash tag of the key's digest, then the rest of
    /// [`StoreKey::redis_form`]. A cluster places a key by its hash tag alone, so a guard
    /// key's lock and state (one store key in two spaces) share a slot, and a script may
    /// read the one and write the other. The tag is hex, so no `{` or `}` in the key itself
    /// can move it.
    pub fn redis_cluster_form(&self, prefix: &str, space: RedisSpace) -> Vec<u8> {
        let tag = hex::encode(&self.digest.0[..8]);
        let mut out = format!("{prefix}{{{tag}}}{}", space.prefix()).into_bytes();
        out.extend(self.bytes.iter().map(|b| if *b == 0 { b':' } else { *b }));
        out
    }
}

/// A guard key as text: the key its state is stored under and the order key its spooled
/// events carry.
///
/// Parts come from the sender's body and may hold any character, so joining them with a
/// separator alone is ambiguous (contact `a\0b` with channel `c` would share a key with
/// contact `a` and channel `b\0c`; in Redis, which shows the separator as `:`, so would
/// `a:b` + `c` and `a` + `b:c`). Parts free of NUL and `:` are joined with NUL, the form
/// stores and spools have always held, so existing state and spooled entries are found as
/// before; otherwise the parts are length-prefixed and hashed under a kind of their own
/// (`keyword#`), which no joined key can equal. Route names hold neither character (config
/// validation).
pub fn guard_key(route: &str, kind: &str, parts: &[&str]) -> String {
    let plain = parts.iter().all(|p| !p.contains(['\0', ':']));
    // Sized for its form up front: a guarded event makes its key on every delivery.
    let rest = if plain {
        parts.iter().map(|p| 1 + p.len()).sum()
    } else {
        2 + 64
    };
    let mut key = String::with_capacity(route.len() + 1 + kind.len() + rest);
    key.push_str(route);
    key.push('\0');
    key.push_str(kind);
    if plain {
        for part in parts {
            key.push('\0');
            key.push_str(part);
        }
    } else {
        let mut hash = Sha256::new();
        for part in parts {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part.as_bytes());
        }
        key.push_str("#\0");
        key.push_str(&hex::encode(hash.finalize()));
    }
    key
}

/// The concatenation of `pieces`, in one allocation of its exact size: a key is made for
/// every delivery, and `format!` would grow it two or three times.
fn joined(pieces: &[&str]) -> Vec<u8> {
    let mut out = Vec::with_capacity(pieces.iter().map(|p| p.len()).sum());
    for piece in pieces {
        out.extend_from_slice(piece.as_bytes());
    }
    out
}

/// What a Redis key holds: marks, locks and guard state of one store key live apart.
#[derive(Clone, Copy, Debug)]
pub enum RedisSpace {
    /// Dedup marks (and the readiness probe).
    Marks,
    /// Guard-key locks.
    Locks,
    /// Guard state.
    Guard,
}

impl RedisSpace {
    fn prefix(self) -> &'static str {
        match self {
            RedisSpace::Marks => "",
            RedisSpace::Locks => "lock:",
            RedisSpace::Guard => "guard:",
        }
    }
}

/// Who holds a lease ([`StateStore::lease`](crate::state::StateStore::lease)): its key, and the token of the process that
/// takes and renews it and writes under it.
#[derive(Debug, Clone)]
pub struct LeaseHolder {
    /// The leased key.
    pub key: StoreKey,
    /// The holder's token, random per process.
    pub token: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_keys_keep_their_stored_form() {
        assert_eq!(
            StoreKey::event("botix", "evt_1").as_bytes(),
            b"botix\0event:evt_1"
        );
        assert_eq!(
            StoreKey::request("botix", "req_1").as_bytes(),
            b"botix\0request:req_1"
        );
        assert_eq!(
            StoreKey::event("botix", "evt_1").redis_form("hg:", RedisSpace::Marks),
            b"hg:botix:event:evt_1".to_vec()
        );
        assert_eq!(
            StoreKey::guard("botix", "status", &["m"]).redis_form("hg:", RedisSpace::Locks),
            b"hg:lock:botix:status:m".to_vec()
        );
        assert_eq!(
            StoreKey::guard("botix", "status", &["m"]).redis_form("hg:", RedisSpace::Guard),
            b"hg:guard:botix:status:m".to_vec()
        );
        let key = StoreKey::event("botix", "evt_1");
        assert_eq!(key.digest(), Digest::of(key.as_bytes()));
        let tag = hex::encode(&key.digest().0[..8]);
        assert_eq!(
            key.redis_cluster_form("hg:", RedisSpace::Marks),
            format!("hg:{{{tag}}}botix:event:evt_1").into_bytes()
        );
    }

    #[test]
    fn a_guard_keys_lock_and_state_share_a_hash_tag_in_a_cluster() {
        let tag = |k: &[u8]| {
            let open = k.iter().position(|b| *b == b'{').expect("{");
            let close = open + k[open..].iter().position(|b| *b == b'}').expect("}");
            k[open + 1..close].to_vec()
        };
        let key = StoreKey::guard("botix", "keyword", &["{a}", "b}"]);
        let lock = key.redis_cluster_form("hg:", RedisSpace::Locks);
        let state = key.redis_cluster_form("hg:", RedisSpace::Guard);
        assert_eq!(tag(&lock), tag(&state));
        assert_eq!(tag(&lock).len(), 16);
        let other = StoreKey::guard("botix", "keyword", &["c", "d"]);
        assert_ne!(
            tag(&other.redis_cluster_form("hg:", RedisSpace::Guard)),
            tag(&state)
        );
    }

    #[test]
    fn guard_keys_of_different_parts_differ_in_sled_and_in_redis() {
        let pairs: [(&[&str], &[&str]); 4] = [
            (&["a\0b", "c"], &["a", "b\0c"]),
            (&["a:b", "c"], &["a", "b:c"]),
            (&["a:b", "c"], &["a\0b", "c"]),
            (&["a", "b"], &["a\0b"]),
        ];
        for (one, other) in pairs {
            let (k1, k2) = (
                StoreKey::guard("r", "keyword", one),
                StoreKey::guard("r", "keyword", other),
            );
            assert_ne!(k1, k2, "{one:?} / {other:?}");
            assert_ne!(
                k1.redis_form("", RedisSpace::Guard),
                k2.redis_form("", RedisSpace::Guard),
                "{one:?} / {other:?} in Redis"
            );
        }
        // Keys without NUL or ':' keep the form existing stores hold.
        assert_eq!(
            StoreKey::guard("botix", "keyword", &["+15550001111", "+15550002222"]).as_bytes(),
            b"botix\0keyword\0+15550001111\0+15550002222"
        );
        assert_eq!(
            StoreKey::guard("botix", "status", &["msg_1"]).as_bytes(),
            b"botix\0status\0msg_1"
        );
    }
}
