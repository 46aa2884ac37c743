//! How far the journal is on disk, as the writer publishes it, and the points in the
//! journal that callers wait for.
//!
//! A waiter is woken when its own point is reached, not at every commit: a request whose
//! record went to the batch after the one being written sleeps through that commit. With
//! one wake-up channel for all, each group commit would also wake every request waiting
//! for the next one, and each of those would be polled for nothing (a thread hand-off and
//! a poll of its connection).

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

/// A point in the journal: the batches a request's answer depends on end below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncPoint(pub(super) u64);

/// How far the journal is on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Progress {
    /// Every batch below this sequence number is on disk.
    pub(super) durable_below: u64,
    /// The last failed write or flush covered every batch below this sequence number.
    pub(super) failed_below: u64,
    /// The journal made no progress for the durable wait while a point below this sequence
    /// number was waited for (see `threads::watch_loop`).
    pub(super) stalled_below: u64,
}

impl Progress {
    /// Whether a waiter for `point` has its answer: on disk, failed, or given up on.
    pub(super) fn settles(&self, point: SyncPoint) -> bool {
        self.durable_below >= point.0
            || self.failed_below >= point.0
            || self.stalled_below >= point.0
    }
}

/// Points waited for at once lie within a few batches of each other (the batch being
/// written, the open one, and those a failed write keeps), so waiters share a channel
/// only with points this far apart.
const CHANNELS: u64 = 8;

/// The journal's progress, published by the writer, with a wake-up channel per point
/// modulo [`CHANNELS`].
pub(super) struct Published {
    durable_below: AtomicU64,
    failed_below: AtomicU64,
    stalled_below: AtomicU64,
    channels: [Notify; CHANNELS as usize],
}

impl Published {
    pub(super) fn new(durable_below: u64) -> Self {
        Self {
            durable_below: AtomicU64::new(durable_below),
            failed_below: AtomicU64::new(0),
            stalled_below: AtomicU64::new(0),
            channels: std::array::from_fn(|_| Notify::new()),
        }
    }

    pub(super) fn get(&self) -> Progress {
        Progress {
            durable_below: self.durable_below.load(Ordering::SeqCst),
            failed_below: self.failed_below.load(Ordering::SeqCst),
            stalled_below: self.stalled_below.load(Ordering::SeqCst),
        }
    }

    /// Everything below `below` is on disk: wakes the waiters of the points it reaches.
    pub(super) fn durable(&self, below: u64) {
        let before = self.durable_below.fetch_max(below, Ordering::SeqCst);
        self.wake(before, below);
    }

    /// The write or flush of everything below `below` failed: wakes its waiters.
    pub(super) fn failed(&self, below: u64) {
        let before = self.failed_below.fetch_max(below, Ordering::SeqCst);
        // Points a failure reaches may lie below the durable mark's waiters' points only
        // if they are settled already; from the lower of the two marks is enough.
        let from = before.min(self.durable_below.load(Ordering::SeqCst));
        self.wake(from, below);
    }

    /// The journal made no progress for the durable wait while the points below `below`
    /// were waited for: wakes their waiters, who give up.
    pub(super) fn stalled(&self, below: u64) {
        let before = self.stalled_below.fetch_max(below, Ordering::SeqCst);
        // Waiters at or below either mark have their answer already.
        let from = before.max(self.durable_below.load(Ordering::SeqCst));
        self.wake(from, below);
    }

    /// Wakes the channels of the points in `after + 1..=up_to`.
    fn wake(&self, after: u64, up_to: u64) {
        if up_to <= after {
            return;
        }
        if up_to - after >= CHANNELS {
            self.channels.iter().for_each(Notify::notify_waiters);
            return;
        }
        for point in after + 1..=up_to {
            self.channels[(point % CHANNELS) as usize].notify_waiters();
        }
    }

    /// The progress once `point` is on disk or has failed.
    pub(super) async fn settled(&self, point: SyncPoint) -> Progress {
        let channel = &self.channels[(point.0 % CHANNELS) as usize];
        loop {
            // Registered before the progress is read: a wake-up between the read and the
            // wait is not missed.
            let woken = channel.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let progress = self.get();
            if progress.settles(point) {
                return progress;
            }
            woken.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// A wait for `point` in a task of its own, registered by the time this returns.
    async fn pending(published: &Arc<Published>, point: u64) -> tokio::task::JoinHandle<Progress> {
        let p = published.clone();
        let task = tokio::spawn(async move { p.settled(SyncPoint(point)).await });
        tokio::task::yield_now().await;
        task
    }

    #[tokio::test]
    async fn a_waiter_is_answered_when_its_point_is_reached_or_has_failed() {
        let published = Arc::new(Published::new(5));
        assert_eq!(published.settled(SyncPoint(5)).await.durable_below, 5);

        let next = pending(&published, 6).await;
        let after = pending(&published, 7).await;
        let far = pending(&published, 6 + CHANNELS).await;
        published.durable(6);
        let got = tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("woken")
            .expect("task");
        assert_eq!(got.durable_below, 6);
        tokio::task::yield_now().await;
        assert!(!after.is_finished(), "woken before its batch was on disk");
        assert!(
            !far.is_finished(),
            "a point sharing the channel answered early"
        );

        published.failed(8);
        let got = tokio::time::timeout(Duration::from_secs(5), after)
            .await
            .expect("woken")
            .expect("task");
        assert_eq!(got.failed_below, 8);
        published.durable(100);
        tokio::time::timeout(Duration::from_secs(5), far)
            .await
            .expect("woken by a jump past every channel")
            .expect("task");
    }
}
