//! The broker link: the slot of the current connection, the broker's block on it, and the
//! gauges that follow both.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use super::live::Live;
use super::nodes::BrokerNodes;
use crate::config::Amqp;
use crate::metrics::Metrics;

/// What the connection task, the channel owners and the [`super::Publisher`] handles
/// share: the current connection and the broker's block.
pub(super) struct Link {
    pub(super) config: Amqp,
    pub(super) nodes: BrokerNodes,
    pub(super) live: RwLock<Option<Arc<Live>>>,
    pub(super) blocked: AtomicBool,
    pub(super) metrics: Arc<Metrics>,
    /// Woken when a connection comes up, so the spool drainer need not poll.
    pub(super) connected: tokio::sync::Notify,
    /// Woken when the broker blocks the connection, so owners waiting for confirms give up
    /// at once instead of at `confirm_timeout`.
    pub(super) became_blocked: tokio::sync::Notify,
    /// The next publish id (header `x-publish-id`): one counter for the process, so no two
    /// publishes in flight anywhere share one.
    pub(super) next_id: AtomicU64,
}

impl Link {
    /// The connection in the slot, if any.
    pub(super) fn current(&self) -> Option<Arc<Live>> {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts `live` in the slot and returns what was there; the `broker_connected` gauge
    /// follows the slot, so it cannot disagree with it. A block belongs to the connection
    /// it was sent on, so it ends with it.
    pub(super) fn replace(&self, live: Option<Arc<Live>>) -> Option<Arc<Live>> {
        let mut slot = self.live.write().unwrap_or_else(PoisonError::into_inner);
        self.metrics.broker_connected.set(i64::from(live.is_some()));
        self.metrics
            .broker_node
            .set(live.as_ref().map_or(-1, |l| node_gauge(l.node())));
        self.set_blocked(false);
        std::mem::replace(&mut *slot, live)
    }

    /// Empties the slot only if it still holds `failed`: the connection task may already
    /// have put a new connection there.
    pub(super) fn clear_if(&self, failed: &Arc<Live>) {
        let mut slot = self.live.write().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|l| Arc::ptr_eq(l, failed)) {
            *slot = None;
            self.metrics.broker_connected.set(0);
            self.metrics.broker_node.set(-1);
            self.set_blocked(false);
        }
    }

    /// Records whether the broker blocks publishing on the current connection.
    pub(super) fn set_blocked(&self, blocked: bool) {
        self.blocked.store(blocked, Ordering::Relaxed);
        self.metrics.broker_blocked.set(i64::from(blocked));
        if blocked {
            self.became_blocked.notify_waiters();
        }
    }

    pub(super) fn is_blocked(&self) -> bool {
        self.blocked.load(Ordering::Relaxed)
    }

    pub(super) fn holds(&self, live: &Arc<Live>) -> bool {
        self.current().is_some_and(|l| Arc::ptr_eq(&l, live))
    }
}

/// A node's position as a gauge value (a list of nodes is never that long).
fn node_gauge(node: usize) -> i64 {
    i64::try_from(node).unwrap_or(i64::MAX)
}
