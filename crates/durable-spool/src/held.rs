//! The drainer's passes over held entries: each tries them in arrival order, and an entry
//! goes only when no earlier held entry of its guard key, and none with its routing key,
//! was unroutable in the same pass.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

use crate::changes::Changes;
use crate::drain::{undecodable, Every, DRAIN_BATCH, UNROUTABLE_LOG_EVERY};
use crate::record;
use crate::sink::{Sink, SinkError};
use crate::spool::Spool;
use crate::tables::Area;

impl Spool {
    /// One pass over held entries in arrival order; returns whether any was published. An
    /// entry is skipped while an earlier one of its guard key, or one with its routing key,
    /// was unroutable in this pass. A broker failure ends the pass. Changes are committed
    /// every [`DRAIN_BATCH`] entries and at the end.
    pub(crate) async fn retry_held<S: Sink>(
        &self,
        sink: &S,
        exchange: &str,
        unroutable_log: &mut Every,
        stop: &CancellationToken,
    ) -> bool {
        HeldPass {
            spool: self,
            sink,
            exchange,
            unroutable_log,
            stop,
            published: false,
            blocked_keys: HashSet::new(),
            blocked_routes: HashSet::new(),
            changes: Changes::default(),
        }
        .run()
        .await
    }
}

/// One pass over the held entries and what it has found so far.
struct HeldPass<'a, S> {
    spool: &'a Spool,
    sink: &'a S,
    exchange: &'a str,
    unroutable_log: &'a mut Every,
    stop: &'a CancellationToken,
    /// Whether an entry was published.
    published: bool,
    /// Guard keys an earlier entry of which is still held after this pass tried it.
    blocked_keys: HashSet<String>,
    /// Routing keys that were unroutable in this pass.
    blocked_routes: HashSet<String>,
    /// What the entries since the last commit came to.
    changes: Changes,
}

impl<S: Sink> HeldPass<'_, S> {
    /// Tries the held entries a page at a time, committing after each page; returns whether
    /// any was published.
    async fn run(mut self) -> bool {
        let mut after: Option<u64> = None;
        loop {
            let page = match self.spool.tables.page(Area::Held, after, DRAIN_BATCH) {
                Ok(page) => page,
                Err(error) => {
                    tracing::error!(%error, "cannot read the held spool entries");
                    break;
                }
            };
            let Some((last, _)) = page.last() else {
                break;
            };
            after = Some(*last);
            let goes_on = self.try_page(page).await;
            let changes = std::mem::take(&mut self.changes);
            if !self.spool.commit_changes(changes, self.stop).await || !goes_on {
                return self.published;
            }
        }
        self.spool.commit_changes(self.changes, self.stop).await;
        self.published
    }

    /// Tries the entries of one page; false when the pass ends (shutdown, or the broker
    /// gone or failing).
    async fn try_page(&mut self, page: Vec<(u64, Vec<u8>)>) -> bool {
        for (seq, value) in page {
            self.spool.beat();
            if self.stop.is_cancelled() || !self.sink.is_connected() {
                return false;
            }
            if !self.try_entry(seq, &value).await {
                return false;
            }
        }
        true
    }

    /// Publishes held entry `seq` unless an earlier entry blocks it, or parks it if it can
    /// never go; false when the broker failed and the pass ends.
    async fn try_entry(&mut self, seq: u64, value: &[u8]) -> bool {
        let msg = match record::decode(value) {
            Ok(msg) => msg,
            Err(error) => {
                let reason = undecodable(&error);
                self.changes.parked(Area::Held, seq, value, None, &reason);
                return true;
            }
        };
        let order_key = msg.order_key.as_deref();
        if order_key.is_some_and(|k| self.blocked_keys.contains(k)) {
            return true;
        }
        if self.blocked_routes.contains(msg.routing_key.as_ref()) {
            self.blocked_keys.extend(order_key.map(str::to_owned));
            return true;
        }
        self.spool.set_in_progress(Some((Area::Held, seq)));
        let result = self.sink.publish(self.exchange, &msg).await;
        self.spool.set_in_progress(None);
        match result {
            Ok(()) => {
                let size = value.len() as u64;
                self.changes.published(Area::Held, seq, size, order_key);
                self.published = true;
            }
            Err(error @ SinkError::Unroutable(_)) => {
                if self.unroutable_log.due(UNROUTABLE_LOG_EVERY) {
                    let held = self.spool.ledger.held_depth.load(Ordering::SeqCst);
                    tracing::error!(%error, event_id = %msg.message_id, held, "held spool entries are still unroutable; bind a queue to the exchange");
                }
                self.blocked_routes.insert(msg.routing_key.to_string());
                self.blocked_keys.extend(order_key.map(str::to_owned));
            }
            Err(SinkError::Unfit(reason)) => {
                self.changes
                    .parked(Area::Held, seq, value, order_key, &reason);
            }
            Err(_) => return false,
        }
        true
    }
}
