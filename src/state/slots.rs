//! Redis Cluster hash slots, pure: the slot a key falls in, and a key that falls in a given
//! range of slots (the readiness probe writes one on every master).

/// Slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The slot of `key` as Redis Cluster computes it: CRC16 (XMODEM) of the key's hash tag
/// (the bytes between the first `{` and the next `}`, when not empty) or of the whole key,
/// modulo [`SLOTS`].
pub fn slot_of(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// The bytes a key is hashed by, when it has a non-empty hash tag.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|b| *b == b'{')?;
    let close = key[open + 1..].iter().position(|b| *b == b'}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

/// CRC16, polynomial 0x1021, initial value 0 (XMODEM), as Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in bytes {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A key `<prefix>{<tag>}<name>` whose slot lies in `first..=last`, the tag found by
/// counting; `None` for an empty or inverted range. The prefix holds no `{` (checked at
/// start for a cluster), so the tag decides the slot.
pub fn key_in(prefix: &str, name: &str, first: u16, last: u16) -> Option<Vec<u8>> {
    if first > last || last >= SLOTS {
        return None;
    }
    // Each try hits the range with a chance of its share of the slots; a range of one slot
    // takes about 16,384 tries, far under this bound.
    (0u32..1 << 22)
        .map(|n| format!("{prefix}{{probe-{n:x}}}{name}").into_bytes())
        .find(|key| (first..=last).contains(&slot_of(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_ones_redis_answers_for_cluster_keyslot() {
        // `CLUSTER KEYSLOT` of these keys on a Redis 7 cluster.
        assert_eq!(slot_of(b"123456789"), 12739);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"bar"), 5061);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
    }

    #[test]
    fn a_probe_key_is_found_in_any_range_even_of_one_slot() {
        for (first, last) in [
            (0, 5460),
            (5461, 10922),
            (10923, 16383),
            (7, 7),
            (16383, 16383),
        ] {
            let key = key_in("hg:", "readiness-probe", first, last).expect("a key");
            assert!((first..=last).contains(&slot_of(&key)), "{first}..={last}");
            assert!(key.starts_with(b"hg:{probe-") && key.ends_with(b"}readiness-probe"));
        }
        assert_eq!(key_in("hg:", "p", 9, 8), None);
        assert_eq!(key_in("hg:", "p", 0, SLOTS), None);
    }
}
