//! The budget of request-body bytes held before their signature is checked, shared by all
//! connections. Reading a body takes bytes from it before each chunk is pulled off the
//! connection; beyond the budget the read waits, first come first served, so the sender's
//! socket and HTTP/2 flow control hold the data instead of our memory. The bytes go back
//! when the delivery is verified or refused.

use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The shared budget.
#[derive(Clone)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    held: Gauge,
}

impl BodyBudget {
    /// A budget of `capacity` bytes; `held` shows what is taken.
    pub fn new(capacity: u64, held: Gauge) -> Self {
        let capacity = usize::try_from(capacity)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Self {
            bytes: Arc::new(Semaphore::new(capacity)),
            held,
        }
    }

    /// An empty charge to grow while a body is read.
    pub fn charge(&self) -> Charge {
        Charge {
            budget: self.clone(),
            permit: None,
            bytes: 0,
        }
    }
}

/// Bytes one request holds from the budget; they go back when it is dropped.
pub struct Charge {
    budget: BodyBudget,
    permit: Option<OwnedSemaphorePermit>,
    bytes: u32,
}

impl Charge {
    /// Waits until `n` more bytes are free and takes them. Waiters are served in order.
    pub async fn grow(&mut self, n: u32) {
        if n == 0 {
            return;
        }
        // The semaphore is never closed, so acquiring only waits.
        let Ok(more) = self.budget.bytes.clone().acquire_many_owned(n).await else {
            return;
        };
        self.budget.held.inc_by(i64::from(n));
        self.bytes += n;
        match &mut self.permit {
            Some(p) => p.merge(more),
            None => self.permit = Some(more),
        }
    }

    /// Gives back all but `keep` bytes.
    pub fn shrink_to(&mut self, keep: u32) {
        if keep >= self.bytes {
            return;
        }
        let give = self.bytes - keep;
        if let Some(p) = &mut self.permit {
            if let Some(freed) = p.split(give as usize) {
                drop(freed);
                self.bytes = keep;
                self.budget.held.dec_by(i64::from(give));
            }
        }
    }

    /// Whether taking `n` more bytes would wait now.
    pub fn must_wait(&self, n: u32) -> bool {
        self.budget.bytes.available_permits() < n as usize
    }

    /// Bytes held.
    pub fn bytes(&self) -> u32 {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.held.dec_by(i64::from(self.bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn charges_wait_beyond_the_budget_and_free_it_when_dropped() {
        let held = Gauge::default();
        let budget = BodyBudget::new(100, held.clone());
        let mut a = budget.charge();
        a.grow(60).await;
        a.grow(30).await;
        assert_eq!((a.bytes(), held.get()), (90, 90));
        a.shrink_to(50);
        assert_eq!((a.bytes(), held.get()), (50, 50));
        let mut b = budget.charge();
        b.grow(50).await;
        let mut c = budget.charge();
        let blocked = tokio::time::timeout(Duration::from_millis(50), c.grow(1)).await;
        assert!(blocked.is_err(), "the budget is spent: the read waits");
        drop(a);
        assert_eq!(held.get(), 50);
        tokio::time::timeout(Duration::from_secs(5), c.grow(40))
            .await
            .expect("freed bytes are handed out");
        drop((b, c));
        assert_eq!(held.get(), 0);
    }
}
