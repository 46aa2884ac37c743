//! Token buckets: one per route for verified deliveries (`per_second` sustained, `burst` at
//! once), and one per peer address prefix for requests that fail verification. Both read time
//! from an injected [`Clock`], so tests move time without sleeping.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

use crate::clock::Clock;
use crate::config::RateLimit;

/// Peer prefixes remembered by a [`PeerLimiter`] at most; past it, the least recently used
/// are forgotten, one per new peer. Bounds the memory an attacker with many prefixes can
/// make it use, while a peer that keeps failing stays remembered and limited.
const MAX_PEERS: usize = 65_536;

/// The arithmetic of one bucket, without a lock or a clock.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last_ms: i64,
}

impl Bucket {
    fn full(burst: f64, now_ms: i64) -> Self {
        Self {
            tokens: burst,
            last_ms: now_ms,
        }
    }

    /// Adds what accrued since the last look; time going backwards adds nothing.
    fn refill(&mut self, rate: f64, burst: f64, now_ms: i64) {
        let elapsed = (now_ms - self.last_ms).max(0) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.last_ms = self.last_ms.max(now_ms);
    }

    /// Whole seconds until one token is there.
    fn wait_secs(&self, rate: f64) -> u64 {
        ((1.0 - self.tokens) / rate).ceil().max(1.0) as u64
    }
}

/// A thread-safe token bucket.
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    clock: Clock,
    // A std mutex: held for a few arithmetic operations, never across an await.
    state: Mutex<Bucket>,
}

impl TokenBucket {
    /// A full bucket refilled at `limit.per_second`, holding at most `limit.burst`.
    pub fn new(limit: &RateLimit, clock: Clock) -> Self {
        let now = clock();
        let burst = f64::from(limit.burst.get());
        Self {
            rate: f64::from(limit.per_second.get()),
            burst,
            clock,
            state: Mutex::new(Bucket::full(burst, now)),
        }
    }

    /// Takes a token, or says how many whole seconds until one is available.
    pub fn try_take(&self) -> Result<(), u64> {
        let now = (self.clock)();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.refill(self.rate, self.burst, now);
        if state.tokens >= 1.0 {
            state.tokens -= 1.0;
            Ok(())
        } else {
            Err(state.wait_secs(self.rate))
        }
    }
}

/// How many leading bits of a peer address name the peer: every address under one prefix
/// shares a bucket. A host is handed a whole IPv6 /64, so keying by the full address would
/// let it rotate through 2^64 fresh buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerPrefixes {
    /// Prefix length of an IPv4 peer, 1 to 32.
    pub ipv4: u8,
    /// Prefix length of an IPv6 peer, 1 to 128.
    pub ipv6: u8,
}

impl PeerPrefixes {
    /// The key of `peer`: its address with the bits past the prefix cleared. An
    /// IPv4-mapped IPv6 address (a dual-stack listener) counts as the IPv4 address.
    pub fn key(&self, peer: IpAddr) -> IpAddr {
        match peer.to_canonical() {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4)
                    & u32::MAX
                        .checked_shl(32 - u32::from(self.ipv4.min(32)))
                        .unwrap_or(0);
                IpAddr::V4(bits.into())
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6)
                    & u128::MAX
                        .checked_shl(128 - u32::from(self.ipv6.min(128)))
                        .unwrap_or(0);
                IpAddr::V6(bits.into())
            }
        }
    }
}

impl Default for PeerPrefixes {
    fn default() -> Self {
        Self { ipv4: 32, ipv6: 64 }
    }
}

/// One remembered peer: its bucket and when it was last looked at.
struct Entry {
    bucket: Bucket,
    /// Position in [`Peers::by_use`]; larger is more recent.
    used: u64,
}

/// The table of peers with its order of use, so the least recently used is found at once.
#[derive(Default)]
struct Peers {
    entries: HashMap<IpAddr, Entry>,
    /// `used` → key, oldest first.
    by_use: BTreeMap<u64, IpAddr>,
    /// The next `used` value.
    tick: u64,
}

impl Peers {
    /// Marks `key` as just used and returns its bucket, if it has one.
    fn touch(&mut self, key: IpAddr) -> Option<&mut Bucket> {
        let entry = self.entries.get_mut(&key)?;
        self.by_use.remove(&entry.used);
        entry.used = self.tick;
        self.by_use.insert(self.tick, key);
        self.tick += 1;
        Some(&mut entry.bucket)
    }

    /// The bucket of `key`, made `fresh` if it has none, marked as just used. A new key
    /// first forgets the least recently used peers while the table holds `capacity`.
    fn slot(&mut self, key: IpAddr, fresh: Bucket, capacity: usize) -> &mut Bucket {
        if !self.entries.contains_key(&key) {
            while self.entries.len() >= capacity.max(1) {
                let Some((_, oldest)) = self.by_use.pop_first() else {
                    break;
                };
                self.entries.remove(&oldest);
            }
        }
        let used = self.tick;
        self.tick += 1;
        let entry = self.entries.entry(key).or_insert(Entry {
            bucket: fresh,
            used,
        });
        self.by_use.remove(&entry.used);
        entry.used = used;
        self.by_use.insert(used, key);
        &mut entry.bucket
    }
}

/// Failed verifications per peer prefix. A failure takes a token; a peer with no token left
/// is refused before its next body is read, until its bucket refills. Verified deliveries
/// take nothing, so a flood of forgeries from one address never spends a route's bucket.
pub struct PeerLimiter {
    rate: f64,
    burst: f64,
    prefixes: PeerPrefixes,
    /// Peers remembered at most; a new peer past it evicts the least recently used one.
    capacity: usize,
    clock: Clock,
    // A std mutex: held for a few map operations, never across an await.
    peers: Mutex<Peers>,
}

impl PeerLimiter {
    /// `limit.per_second` failures sustained per peer prefix, `limit.burst` at once.
    pub fn new(limit: &RateLimit, prefixes: PeerPrefixes, clock: Clock) -> Self {
        Self::with_capacity(limit, prefixes, MAX_PEERS, clock)
    }

    fn with_capacity(
        limit: &RateLimit,
        prefixes: PeerPrefixes,
        capacity: usize,
        clock: Clock,
    ) -> Self {
        Self {
            rate: f64::from(limit.per_second.get()),
            burst: f64::from(limit.burst.get()),
            prefixes,
            capacity,
            clock,
            peers: Mutex::new(Peers::default()),
        }
    }

    /// `Err(retry_after_secs)` while `peer`'s prefix has spent its failures. Looking counts
    /// as a use: a peer that keeps knocking stays in the table.
    pub fn check(&self, peer: IpAddr) -> Result<(), u64> {
        let now = (self.clock)();
        let key = self.prefixes.key(peer);
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(bucket) = peers.touch(key) else {
            return Ok(());
        };
        bucket.refill(self.rate, self.burst, now);
        if bucket.tokens >= 1.0 {
            Ok(())
        } else {
            Err(bucket.wait_secs(self.rate))
        }
    }

    /// Records one failed verification from `peer`'s prefix.
    pub fn failed(&self, peer: IpAddr) {
        let now = (self.clock)();
        let key = self.prefixes.key(peer);
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = peers.slot(key, Bucket::full(self.burst, now), self.capacity);
        bucket.refill(self.rate, self.burst, now);
        bucket.tokens = (bucket.tokens - 1.0).max(0.0);
    }

    /// Peers remembered now.
    pub fn len(&self) -> usize {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entries
            .len()
    }

    /// Whether no peer is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Arc;

    fn limit(per_second: u32, burst: u32) -> RateLimit {
        let positive = |n| NonZeroU32::new(n).expect("a positive test limit");
        RateLimit {
            per_second: positive(per_second),
            burst: positive(burst),
        }
    }

    /// A clock the test moves by hand.
    fn manual_clock() -> (Arc<AtomicI64>, Clock) {
        let now = Arc::new(AtomicI64::new(1_000_000));
        let read = now.clone();
        (now, Arc::new(move || read.load(Ordering::SeqCst)))
    }

    #[test]
    fn burst_then_refill() {
        let (now, clock) = manual_clock();
        let b = TokenBucket::new(&limit(2, 3), clock);
        for _ in 0..3 {
            assert_eq!(b.try_take(), Ok(()));
        }
        assert_eq!(b.try_take(), Err(1));
        now.fetch_add(500, Ordering::SeqCst);
        assert_eq!(b.try_take(), Ok(()));
        assert!(b.try_take().is_err());
        // A clock stepping back gives nothing and takes nothing.
        now.fetch_sub(10_000, Ordering::SeqCst);
        assert!(b.try_take().is_err());
        now.fetch_add(10_000 + 5_000, Ordering::SeqCst);
        for _ in 0..3 {
            assert_eq!(b.try_take(), Ok(()));
        }
        assert!(b.try_take().is_err(), "never more than the burst");
    }

    #[test]
    fn a_peer_is_refused_after_its_failures_and_others_are_not() {
        let (now, clock) = manual_clock();
        let peers = PeerLimiter::new(&limit(1, 3), PeerPrefixes::default(), clock);
        let attacker: IpAddr = [192, 0, 2, 1].into();
        let sender: IpAddr = [198, 51, 100, 7].into();
        for _ in 0..3 {
            assert_eq!(peers.check(attacker), Ok(()));
            peers.failed(attacker);
        }
        assert_eq!(peers.check(attacker), Err(1));
        assert_eq!(peers.check(sender), Ok(()), "another address is untouched");
        assert_eq!(peers.len(), 1, "a peer with no failure is not remembered");
        now.fetch_add(1000, Ordering::SeqCst);
        assert_eq!(peers.check(attacker), Ok(()), "refilled after a second");
    }

    fn limiter(prefixes: PeerPrefixes, capacity: usize) -> (Arc<AtomicI64>, PeerLimiter) {
        let (now, clock) = manual_clock();
        (
            now,
            PeerLimiter::with_capacity(&limit(1, 3), prefixes, capacity, clock),
        )
    }

    fn v6(text: &str) -> IpAddr {
        text.parse().expect("address")
    }

    #[test]
    fn addresses_rotated_within_one_ipv6_64_share_a_bucket() {
        let (_now, peers) = limiter(PeerPrefixes::default(), MAX_PEERS);
        // A forger walks its /64, a new address for every try.
        for i in 0..3u32 {
            let from = v6(&format!("2001:db8:7:1:{i:x}::{:x}", i + 1));
            assert_eq!(peers.check(from), Ok(()), "try {i}");
            peers.failed(from);
        }
        for from in ["2001:db8:7:1::ffff", "2001:db8:7:1:ffff:ffff:ffff:ffff"] {
            assert_eq!(
                peers.check(v6(from)),
                Err(1),
                "{from} is in the limited /64"
            );
        }
        assert_eq!(peers.len(), 1);
        assert_eq!(
            peers.check(v6("2001:db8:7:2::1")),
            Ok(()),
            "the next /64 is another peer"
        );
    }

    #[test]
    fn ipv4_peers_are_whole_addresses_unless_configured_wider() {
        let (_now, exact) = limiter(PeerPrefixes::default(), MAX_PEERS);
        let (_now, wide) = limiter(PeerPrefixes { ipv4: 24, ipv6: 64 }, MAX_PEERS);
        for i in 1..=3u8 {
            exact.failed([192, 0, 2, i].into());
            wide.failed([192, 0, 2, i].into());
        }
        assert_eq!(exact.check([192, 0, 2, 1].into()), Ok(()));
        assert_eq!(exact.len(), 3);
        assert_eq!(wide.check([192, 0, 2, 200].into()), Err(1), "one /24");
        assert_eq!(wide.check([192, 0, 3, 1].into()), Ok(()));
        // A dual-stack listener sees an IPv4 peer as ::ffff:a.b.c.d: the same peer.
        assert_eq!(wide.check(v6("::ffff:192.0.2.9")), Err(1));
    }

    #[test]
    fn prefix_keys_clear_the_host_bits() {
        let p = PeerPrefixes { ipv4: 20, ipv6: 48 };
        assert_eq!(p.key([10, 1, 255, 7].into()), IpAddr::from([10, 1, 240, 0]));
        assert_eq!(p.key(v6("2001:db8:7:1::9")), v6("2001:db8:7::"));
        let whole = PeerPrefixes {
            ipv4: 32,
            ipv6: 128,
        };
        assert_eq!(whole.key(v6("2001:db8::9")), v6("2001:db8::9"));
        assert_eq!(whole.key([10, 1, 2, 3].into()), IpAddr::from([10, 1, 2, 3]));
    }

    #[test]
    fn a_full_table_forgets_the_least_recently_used_peer_only() {
        let (_now, peers) = limiter(PeerPrefixes::default(), 4);
        let limited: IpAddr = [198, 51, 100, 7].into();
        for _ in 0..3 {
            peers.failed(limited);
        }
        assert_eq!(peers.check(limited), Err(1));
        // Another forger rotates through many addresses, far more than the table holds,
        // while the limited peer keeps knocking.
        for i in 0..1_000u32 {
            peers.failed(IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
            assert!(peers.len() <= 4);
            assert_eq!(peers.check(limited), Err(1), "after {i} rotations");
        }
        assert_eq!(peers.len(), 4, "full, never cleared");
        // The three most recent rotations are still there; older ones were evicted.
        for i in 997..1_000u32 {
            peers.failed(IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
        }
        for i in 997..1_000u32 {
            let from = IpAddr::from((0x0a00_0000 + i).to_be_bytes());
            assert_eq!(peers.check(from), Ok(()), "one token left");
            peers.failed(from);
            assert_eq!(peers.check(from), Err(1), "three failures at {from}");
        }
        assert_eq!(
            peers.check(IpAddr::from(0x0a00_0000u32.to_be_bytes())),
            Ok(()),
            "the oldest rotation was forgotten"
        );
        assert_eq!(peers.check(limited), Err(1));
    }
}
