//! The membership filter of one run of state on disk: answers "certainly absent" for most
//! keys the run does not hold, so a lookup of a new key reads no page from disk.
//!
//! A blocked Bloom filter: each key sets [`BITS_SET`] bits inside one 512-bit block, so a
//! check costs one cache line. Keys are digests (already uniformly random), so their bytes
//! are the hashes: bytes 0..8 pick the block, bytes 8..16 the bits inside it.

use crate::Digest;

/// Bits of filter per key held: about 3 % false "maybe" answers (each one reads a page).
pub const BITS_PER_KEY: u64 = 8;
/// Bits set per key inside its block.
const BITS_SET: u32 = 6;
/// Words of one block (512 bits, one cache line).
const BLOCK_WORDS: usize = 8;

/// A filter of a fixed size, filled once while its run is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bloom {
    words: Vec<u64>,
}

impl Bloom {
    /// An empty filter sized for `keys` keys.
    pub fn with_capacity(keys: u64) -> Self {
        let bits = keys.max(1).saturating_mul(BITS_PER_KEY);
        let blocks = bits.div_ceil(512).max(1);
        let words = usize::try_from(blocks).unwrap_or(usize::MAX / BLOCK_WORDS) * BLOCK_WORDS;
        Self {
            words: vec![0; words],
        }
    }

    /// A filter read back from its words; `None` unless they form whole blocks.
    pub fn from_words(words: Vec<u64>) -> Option<Self> {
        (!words.is_empty() && words.len().is_multiple_of(BLOCK_WORDS)).then_some(Self { words })
    }

    /// The filter's words, to be stored.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Records `key`.
    pub fn insert(&mut self, key: &Digest) {
        let (block, bits) = self.place(key);
        for (word, mask) in self.words[block..block + BLOCK_WORDS].iter_mut().zip(bits) {
            *word |= mask;
        }
    }

    /// Whether `key` may have been recorded (`false`: certainly not).
    pub fn may_contain(&self, key: &Digest) -> bool {
        let (block, bits) = self.place(key);
        self.words[block..block + BLOCK_WORDS]
            .iter()
            .zip(bits)
            .all(|(word, mask)| word & mask == mask)
    }

    /// The first word of `key`'s block and the bits it sets in each word of it.
    fn place(&self, key: &Digest) -> (usize, [u64; BLOCK_WORDS]) {
        let (pick, spread) = halves(key);
        let blocks = (self.words.len() / BLOCK_WORDS) as u64;
        // Multiply-shift maps the 64-bit value onto the blocks without a division.
        let block = ((u128::from(pick) * u128::from(blocks)) >> 64) as usize;
        let mut bits = [0u64; BLOCK_WORDS];
        for i in 0..BITS_SET {
            let bit = (spread >> (i * 9)) & 511;
            bits[(bit / 64) as usize] |= 1 << (bit % 64);
        }
        (block * BLOCK_WORDS, bits)
    }
}

fn halves(key: &Digest) -> (u64, u64) {
    let mut a = [0; 8];
    let mut b = [0; 8];
    a.copy_from_slice(&key.0[..8]);
    b.copy_from_slice(&key.0[8..]);
    (u64::from_le_bytes(a), u64::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_every_key_it_was_given_and_few_others() {
        let n = 100_000u32;
        let mut bloom = Bloom::with_capacity(u64::from(n));
        for i in 0..n {
            bloom.insert(&Digest::of(&i.to_le_bytes()));
        }
        for i in 0..n {
            assert!(bloom.may_contain(&Digest::of(&i.to_le_bytes())), "key {i}");
        }
        let false_maybe = (n..2 * n)
            .filter(|i| bloom.may_contain(&Digest::of(&i.to_le_bytes())))
            .count();
        // 8 bits a key in 512-bit blocks: about 3 %; 5 % would mean a broken hash.
        assert!(
            false_maybe < (n / 20) as usize,
            "{false_maybe} false answers of {n}"
        );
        assert!(false_maybe > 0, "a filter this small cannot be exact");
    }

    #[test]
    fn survives_being_stored() {
        let mut bloom = Bloom::with_capacity(10);
        bloom.insert(&Digest::of(b"k"));
        let back = Bloom::from_words(bloom.words().to_vec()).expect("whole blocks");
        assert!(back.may_contain(&Digest::of(b"k")));
        assert_eq!(back, bloom);
        assert!(Bloom::from_words(vec![0; 7]).is_none());
        assert!(Bloom::from_words(Vec::new()).is_none());
    }
}
