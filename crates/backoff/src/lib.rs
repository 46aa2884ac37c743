//! The one back-off of the workspace: a pause that doubles after each failure, from a first
//! value up to a cap, and starts over after a success.
//!
//! It only counts; the caller sleeps (a thread or a task, as it runs), so the type serves
//! the store's background threads and the gateway's async loops alike.

use std::time::Duration;

/// Pauses of `first`, `2 × first`, `4 × first` … each at most `max`.
#[derive(Debug, Clone)]
pub struct Doubling {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Doubling {
    /// A back-off whose first pause is `first` (at most `max`) and whose pauses never exceed
    /// `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        let first = if first.as_nanos() > max.as_nanos() {
            max
        } else {
            first
        };
        Self {
            first,
            max,
            next: first,
        }
    }

    /// The pause to wait now; the one after it is twice as long, up to the cap.
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        pause
    }

    /// The pause [`next_pause`](Self::next_pause) would answer, without moving on.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// After a success: the next failure waits the first pause again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// Whether the pauses have reached the cap (a caller may then log less often).
    pub fn at_cap(&self) -> bool {
        self.next >= self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn pauses_double_up_to_the_cap() {
        let mut backoff = Doubling::new(ms(2), ms(50));
        let pauses: Vec<u128> = (0..7).map(|_| backoff.next_pause().as_millis()).collect();
        assert_eq!(pauses, [2, 4, 8, 16, 32, 50, 50]);
        assert!(backoff.at_cap());
    }

    #[test]
    fn a_reset_starts_over_at_the_first_pause() {
        let mut backoff = Doubling::new(ms(100), ms(1_000));
        backoff.next_pause();
        backoff.next_pause();
        assert_eq!(backoff.peek(), ms(400));
        backoff.reset();
        assert_eq!(backoff.next_pause(), ms(100));
    }

    #[test]
    fn a_first_pause_above_the_cap_is_the_cap() {
        let mut backoff = Doubling::new(ms(10), ms(3));
        assert_eq!(backoff.next_pause(), ms(3));
        assert_eq!(backoff.next_pause(), ms(3));
    }

    #[test]
    fn the_largest_pauses_do_not_overflow() {
        let mut backoff = Doubling::new(Duration::MAX / 2 + ms(1), Duration::MAX);
        backoff.next_pause();
        assert_eq!(backoff.next_pause(), Duration::MAX);
        assert_eq!(backoff.next_pause(), Duration::MAX);
    }
}
