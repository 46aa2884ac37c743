//! The pause between polls of a key another request holds (a dedup claim, a Redis lock):
//! short at first, since most holders finish within milliseconds, then doubling to a cap so
//! a long hold costs few polls.

use std::time::Duration;

const FIRST: Duration = Duration::from_millis(2);
const MAX: Duration = Duration::from_millis(50);

/// Pauses of 2, 4, 8 … ms, at most 50 ms each.
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: FIRST }
    }
}

impl Backoff {
    /// Sleeps for the next pause.
    pub async fn pause(&mut self) {
        tokio::time::sleep(self.next_pause()).await;
    }

    fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(MAX);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_cap() {
        let mut backoff = Backoff::default();
        let pauses: Vec<u128> = (0..7).map(|_| backoff.next_pause().as_millis()).collect();
        assert_eq!(pauses, [2, 4, 8, 16, 32, 50, 50]);
    }
}
