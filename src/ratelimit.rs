//! A token bucket per route: `per_second` sustained, `burst` at once.

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// A thread-safe token bucket.
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    // A std mutex: held for a few arithmetic operations, never across an await.
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket refilled at `per_second`, holding at most `burst`.
    pub fn new(per_second: u32, burst: u32, now: Instant) -> Self {
        Self {
            rate: f64::from(per_second),
            burst: f64::from(burst),
            state: Mutex::new((f64::from(burst), now)),
        }
    }

    /// Takes a token, or says how many whole seconds until one is available.
    pub fn try_take(&self, now: Instant) -> Result<(), u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (tokens, last) = *state;
        let elapsed = now.saturating_duration_since(last).as_secs_f64();
        let tokens = (tokens + elapsed * self.rate).min(self.burst);
        if tokens >= 1.0 {
            *state = (tokens - 1.0, now);
            Ok(())
        } else {
            *state = (tokens, now);
            Err(((1.0 - tokens) / self.rate).ceil().max(1.0) as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_refill() {
        let t0 = Instant::now();
        let b = TokenBucket::new(2, 3, t0);
        for _ in 0..3 {
            assert_eq!(b.try_take(t0), Ok(()));
        }
        assert_eq!(b.try_take(t0), Err(1));
        assert_eq!(b.try_take(t0 + Duration::from_millis(500)), Ok(()));
        assert!(b.try_take(t0 + Duration::from_millis(500)).is_err());
    }
}
