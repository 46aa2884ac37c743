//! The pause between polls of a key another request holds (a dedup claim, a Redis lock):
//! short at first, since most holders finish within milliseconds, then doubling to a cap so
//! a long hold costs few polls.

use std::time::Duration;

use backoff::Doubling;

/// Pauses of 2, 4, 8 … ms, at most 50 ms each.
pub struct Backoff(Doubling);

impl Default for Backoff {
    fn default() -> Self {
        Self(Doubling::new(
            Duration::from_millis(2),
            Duration::from_millis(50),
        ))
    }
}

impl Backoff {
    /// Sleeps for the next pause.
    pub async fn pause(&mut self) {
        tokio::time::sleep(self.0.next_pause()).await;
    }
}
