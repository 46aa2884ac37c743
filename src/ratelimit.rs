//! Token buckets: one per route for verified deliveries (`per_second` sustained, `burst` at
//! once), and one per peer address for requests that fail verification. Both read time
//! from an injected [`Clock`], so tests move time without sleeping.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

use crate::clock::Clock;

/// Peers remembered by a [`PeerLimiter`] at most; past it, peers whose bucket has refilled
/// are forgotten (they are indistinguishable from new ones), and if that frees nothing,
/// all are. Bounds the memory an attacker with many addresses can make it use.
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
    /// A full bucket refilled at `per_second`, holding at most `burst`.
    pub fn new(per_second: u32, burst: u32, clock: Clock) -> Self {
        let now = clock();
        Self {
            rate: f64::from(per_second),
            burst: f64::from(burst),
            clock,
            state: Mutex::new(Bucket::full(f64::from(burst), now)),
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

/// Failed verifications per peer address. A failure takes a token; a peer with no token left
/// is refused before its next body is read, until its bucket refills. Verified deliveries
/// take nothing, so a flood of forgeries from one address never spends a route's bucket.
pub struct PeerLimiter {
    rate: f64,
    burst: f64,
    clock: Clock,
    peers: Mutex<HashMap<IpAddr, Bucket>>,
}

impl PeerLimiter {
    /// `per_second` failures sustained per peer, `burst` at once.
    pub fn new(per_second: u32, burst: u32, clock: Clock) -> Self {
        Self {
            rate: f64::from(per_second),
            burst: f64::from(burst),
            clock,
            peers: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(retry_after_secs)` while `peer` has spent its failures.
    pub fn check(&self, peer: IpAddr) -> Result<(), u64> {
        let now = (self.clock)();
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(bucket) = peers.get_mut(&peer) else {
            return Ok(());
        };
        bucket.refill(self.rate, self.burst, now);
        if bucket.tokens >= 1.0 {
            Ok(())
        } else {
            Err(bucket.wait_secs(self.rate))
        }
    }

    /// Records one failed verification from `peer`.
    pub fn failed(&self, peer: IpAddr) {
        let now = (self.clock)();
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if peers.len() >= MAX_PEERS && !peers.contains_key(&peer) {
            let (rate, burst) = (self.rate, self.burst);
            peers.retain(|_, b| {
                b.refill(rate, burst, now);
                b.tokens < burst
            });
            if peers.len() >= MAX_PEERS {
                peers.clear();
            }
        }
        let bucket = peers
            .entry(peer)
            .or_insert_with(|| Bucket::full(self.burst, now));
        bucket.refill(self.rate, self.burst, now);
        bucket.tokens = (bucket.tokens - 1.0).max(0.0);
    }

    /// Peers remembered now.
    pub fn len(&self) -> usize {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Arc;

    /// A clock the test moves by hand.
    fn manual_clock() -> (Arc<AtomicI64>, Clock) {
        let now = Arc::new(AtomicI64::new(1_000_000));
        let read = now.clone();
        (now, Arc::new(move || read.load(Ordering::SeqCst)))
    }

    #[test]
    fn burst_then_refill() {
        let (now, clock) = manual_clock();
        let b = TokenBucket::new(2, 3, clock);
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
        let peers = PeerLimiter::new(1, 3, clock);
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

    #[test]
    fn many_peers_are_forgotten_once_refilled() {
        let (now, clock) = manual_clock();
        let peers = PeerLimiter::new(1, 2, clock);
        for i in 0..MAX_PEERS as u32 {
            peers.failed(IpAddr::from(i.to_be_bytes()));
        }
        assert_eq!(peers.len(), MAX_PEERS);
        now.fetch_add(5_000, Ordering::SeqCst);
        peers.failed([10, 0, 0, 1].into());
        assert_eq!(peers.len(), 1, "refilled peers were dropped");
        // Without any refilled peer, the map is cleared rather than grown.
        for i in 0..MAX_PEERS as u32 {
            peers.failed(IpAddr::from((i + 1).to_be_bytes()));
        }
        assert!(peers.len() <= MAX_PEERS);
    }
}
