//! The drainer: publishes main in order and held entries in passes with back-off, parks
//! what can never be published, and deletes what the broker confirmed. Supervised: a panic
//! in a pass is counted and the pass starts again.
//!
//! It works in batches: it publishes up to a batch of entries one by one, each with its
//! confirm, then deletes the confirmed ones (and moves or parks the others) in one durable
//! commit before it counts them as done. A crash republishes at most the batch in flight:
//! entries confirmed whose deletes had not committed. The batch starts at one entry and
//! doubles up to [`DRAIN_BATCH`] while commits succeed; a commit that fails sets it back
//! to one, so a store that refuses deletes holds one published entry, not a batch.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use tokio_util::sync::CancellationToken;

use crate::outbox::message::Message;
use crate::outbox::publish::{PublishError, Publisher};
use crate::outbox::record::{self, RecordError};

use super::changes::Changes;
use super::ledger::lock;
use super::tables::Area;
use super::{EntryRef, Spool};

/// The most entries published before their deletes commit: what a crash may republish.
pub const DRAIN_BATCH: usize = 64;
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// Back-off of the passes over held (unroutable) entries.
const HELD_RETRY_MIN: Duration = Duration::from_secs(1);
const HELD_RETRY_MAX: Duration = Duration::from_secs(30);
/// How often held (unroutable) entries are reported.
const UNROUTABLE_LOG_EVERY: Duration = Duration::from_secs(60);
/// Pause before the drainer is started again after a failure (doubling up to the max).
const RESTART_MIN: Duration = Duration::from_secs(1);
const RESTART_MAX: Duration = Duration::from_secs(30);
/// The longest the drainer sleeps without telling it is alive.
const BEAT: Duration = Duration::from_secs(1);

/// Where the drainer publishes: the broker ([`Publisher`]), or a test's stand-in.
pub trait Sink: Clone + Send + Sync + 'static {
    /// Whether a publish can be tried now.
    fn is_connected(&self) -> bool;
    /// Resolves when a connection is up.
    fn wait_connected(&self) -> impl Future<Output = ()> + Send;
    /// Publishes `msg` and waits for the broker's confirm.
    fn publish<'a>(
        &'a self,
        exchange: &'a str,
        msg: &'a Message<'a>,
    ) -> impl Future<Output = Result<(), PublishError>> + Send + 'a;
}

impl Sink for Publisher {
    fn is_connected(&self) -> bool {
        Publisher::is_connected(self)
    }

    fn wait_connected(&self) -> impl Future<Output = ()> + Send {
        Publisher::wait_connected(self)
    }

    fn publish<'a>(
        &'a self,
        exchange: &'a str,
        msg: &'a Message<'a>,
    ) -> impl Future<Output = Result<(), PublishError>> + Send + 'a {
        Publisher::publish(self, exchange, msg)
    }
}

/// Entries the drainer failed on.
#[derive(Default)]
pub(super) struct Failures {
    /// The entry of the last failure.
    last: Option<EntryRef>,
    /// An entry it failed on twice in a row, for the next pass to park.
    to_park: Option<EntryRef>,
}

impl Failures {
    /// The entry marked to be parked.
    #[cfg(test)]
    pub(super) fn to_park(&self) -> Option<EntryRef> {
        self.to_park
    }
}

/// What one attempt came to.
pub(super) enum Step {
    /// Entries left their place (published, held apart or parked), or none waited.
    Progress,
    /// The broker is away or blocked: not the drainer's fault.
    Wait,
    /// The broker refused an entry for now (nack, timeout, channel error).
    Failed(PublishError),
}

/// Lets a report through at most once per period.
#[derive(Default)]
pub(super) struct Every(Option<Instant>);

impl Every {
    fn due(&mut self, every: Duration) -> bool {
        let due = self.0.is_none_or(|t| t.elapsed() >= every);
        if due {
            self.0 = Some(Instant::now());
        }
        due
    }
}

impl Spool {
    /// Runs the drainer until `stop`, supervised: a panic in it is logged at ERROR, counted
    /// in `hookgate_spool_drainer_restarts_total`, and the drainer starts again after a
    /// pause. An entry it failed on twice in a row is parked, so one bad entry cannot keep
    /// it failing.
    pub async fn run_drainer<S: Sink>(
        self: Arc<Self>,
        publisher: S,
        exchange: String,
        stop: CancellationToken,
    ) {
        let restarts = self.ledger.metrics().spool_drainer_restarts.clone();
        let spool = self.clone();
        let pass_stop = stop.clone();
        supervise(
            &restarts,
            &stop,
            RESTART_MIN,
            move || {
                spool
                    .clone()
                    .drain(publisher.clone(), exchange.clone(), pass_stop.clone())
            },
            || self.note_failure(),
        )
        .await;
    }

    /// Pins a drainer failure on the entry it was working on; the second failure in a row
    /// on the same entry marks it to be parked by the next pass. The guard keys held are
    /// counted again from disk: the failed pass may have marked keys for moves it never
    /// committed.
    pub(super) fn note_failure(&self) {
        let current = lock(&self.in_progress).take();
        {
            let mut failed = lock(&self.failed_on);
            if current.is_some() && current == failed.last {
                failed.to_park = current;
                failed.last = None;
            } else {
                failed.last = current;
            }
        }
        if let Err(error) = self.recount_held_keys() {
            tracing::warn!(%error, "cannot count the held spool entries' guard keys");
        }
    }

    /// Republishes entries until `stop`: main in order, deleted in batches after their
    /// acks; held ones in passes with back-off; undecodable or unfit ones parked.
    async fn drain<S: Sink>(self: Arc<Self>, sink: S, exchange: String, stop: CancellationToken) {
        let mut retry = RETRY_MIN;
        let mut failing = false;
        let mut held_retry = HELD_RETRY_MIN;
        let mut held_due = Instant::now();
        let mut unroutable_log = Every::default();
        let mut broken_reported = false;
        let mut batch = 1;
        // When the spool started draining and how deep it was then: reported once it is
        // empty, so an operator sees the end of an outage's backlog.
        let mut draining: Option<(Instant, u64)> = None;
        loop {
            self.beat();
            if stop.is_cancelled() {
                return;
            }
            if let Some(reason) = self.restart_needed() {
                if !broken_reported {
                    // Publishing now would publish entries it cannot delete: every one of
                    // them would go out again after the restart.
                    tracing::error!(%reason, "the spool cannot write until hookgate restarts; nothing is drained until then");
                    broken_reported = true;
                }
                self.stuck_since_ms.store(-1, Ordering::SeqCst);
                self.pause(&stop, BEAT).await;
                continue;
            }
            let poisoned = lock(&self.failed_on).to_park.take();
            if let Some((area, seq)) = poisoned {
                self.park_entry(area, seq, "the drainer failed on it twice", &stop)
                    .await;
                continue;
            }
            if self.ledger.held_depth.load(Ordering::SeqCst) > 0
                && Instant::now() >= held_due
                && sink.is_connected()
            {
                let published = self
                    .retry_held(&sink, &exchange, &mut unroutable_log, &stop)
                    .await;
                held_retry = if published {
                    HELD_RETRY_MIN
                } else {
                    (held_retry * 2).min(HELD_RETRY_MAX)
                };
                held_due = Instant::now() + held_retry;
                continue;
            }
            let rows = match self.tables.page(Area::Main, None, batch) {
                Ok(rows) => rows,
                Err(error) => {
                    tracing::error!(%error, "cannot read the spool; retrying");
                    self.pause(&stop, RETRY_MAX).await;
                    continue;
                }
            };
            if rows.is_empty() {
                self.stuck_since_ms.store(-1, Ordering::SeqCst);
                let added = self.added.notified();
                if self.is_empty() {
                    if let Some((since, depth)) = draining.take() {
                        tracing::info!(
                            depth_at_start = depth,
                            elapsed_ms = since.elapsed().as_millis() as u64,
                            "spool drained"
                        );
                    }
                    let wake = if self.ledger.held_depth.load(Ordering::SeqCst) > 0 {
                        held_due.saturating_duration_since(Instant::now()).min(BEAT)
                    } else {
                        BEAT
                    };
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = added => {}
                        _ = tokio::time::sleep(wake) => {}
                    }
                } else {
                    // Counted but not committed yet: a push on its way in.
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = added => {}
                        _ = tokio::time::sleep(RETRY_MIN) => {}
                    }
                }
                continue;
            }
            if !sink.is_connected() {
                self.stuck_since_ms.store(-1, Ordering::SeqCst);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = sink.wait_connected() => {}
                    _ = tokio::time::sleep(BEAT) => {}
                }
                continue;
            }
            let depth = self.ledger.depth.load(Ordering::SeqCst);
            let (step, committed) = self
                .drain_batch(&sink, &exchange, rows, &mut unroutable_log, &stop)
                .await;
            batch = if committed {
                (batch * 2).min(DRAIN_BATCH)
            } else {
                1
            };
            match step {
                Step::Progress => {
                    draining.get_or_insert_with(|| (Instant::now(), depth));
                    self.stuck_since_ms.store(-1, Ordering::SeqCst);
                    if failing {
                        tracing::info!(
                            depth = self.ledger.depth.load(Ordering::SeqCst),
                            "spool draining again"
                        );
                    }
                    retry = RETRY_MIN;
                    failing = false;
                }
                Step::Wait => {
                    self.stuck_since_ms.store(-1, Ordering::SeqCst);
                    self.pause(&stop, RETRY_MIN).await;
                }
                Step::Failed(error) => {
                    let _ = self.stuck_since_ms.compare_exchange(
                        -1,
                        self.clock_ms(),
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    );
                    if !failing {
                        tracing::warn!(%error, "spool drain paused");
                    }
                    failing = true;
                    self.pause(&stop, retry).await;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Publishes `rows` (the head of main) in order until one fails, then commits what
    /// became of them in one durable commit. Returns how the batch ended, and whether its
    /// commit went through at the first try.
    pub(super) async fn drain_batch<S: Sink>(
        &self,
        sink: &S,
        exchange: &str,
        rows: Vec<(u64, Vec<u8>)>,
        unroutable_log: &mut Every,
        stop: &CancellationToken,
    ) -> (Step, bool) {
        let mut changes = Changes::default();
        let mut step = Step::Progress;
        for (seq, value) in rows {
            self.beat();
            if stop.is_cancelled() {
                break;
            }
            self.set_in_progress(Some((Area::Main, seq)));
            let msg = match record::decode(&value) {
                Ok(msg) => msg,
                Err(error) => {
                    changes.parked(Area::Main, seq, &value, None, &undecodable(&error));
                    continue;
                }
            };
            let order_key = msg.order_key.as_deref();
            if order_key.is_some_and(|k| self.ledger.holds_key(k)) {
                // An earlier event of its guard key waits in held: this one goes behind
                // it. Marked held before it leaves main: a request that finds main empty
                // then also finds the key held, and goes behind this entry.
                self.ledger.hold_key(order_key);
                changes.moved_to_held(seq, value.clone());
                continue;
            }
            match sink.publish(exchange, &msg).await {
                Ok(()) => changes.published(Area::Main, seq, value.len() as u64, None),
                Err(error @ PublishError::Unroutable(_)) => {
                    if unroutable_log.due(UNROUTABLE_LOG_EVERY) {
                        // Kept safe, and no longer in the way of the rest; but it arrives
                        // only once a queue is bound: an operator must act.
                        tracing::error!(%error, event_id = %msg.message_id, held = self.ledger.held_depth.load(Ordering::SeqCst) + 1, "spooled event is unroutable; held apart until a queue is bound to the exchange");
                    }
                    self.ledger.hold_key(order_key);
                    changes.moved_to_held(seq, value.clone());
                }
                Err(error @ PublishError::Unfit(_)) => {
                    changes.parked(Area::Main, seq, &value, order_key, &error.to_string());
                }
                Err(PublishError::NotConnected | PublishError::Blocked) => {
                    step = Step::Wait;
                    break;
                }
                Err(error) => {
                    step = Step::Failed(error);
                    break;
                }
            }
        }
        self.set_in_progress(None);
        let committed = self.commit_changes(changes, stop).await;
        (step, committed)
    }

    /// One pass over held entries in arrival order; returns whether any was published. An
    /// entry is skipped while an earlier one of its guard key, or one with its routing key,
    /// was unroutable in this pass. A broker failure ends the pass. Changes are committed
    /// every [`DRAIN_BATCH`] entries and at the end.
    pub(super) async fn retry_held<S: Sink>(
        &self,
        sink: &S,
        exchange: &str,
        unroutable_log: &mut Every,
        stop: &CancellationToken,
    ) -> bool {
        let mut published = false;
        let mut blocked_keys: HashSet<String> = HashSet::new();
        let mut blocked_routes: HashSet<String> = HashSet::new();
        let mut after: Option<u64> = None;
        let mut changes = Changes::default();
        loop {
            let page = match self.tables.page(Area::Held, after, DRAIN_BATCH) {
                Ok(p) => p,
                Err(error) => {
                    tracing::error!(%error, "cannot read the held spool entries");
                    break;
                }
            };
            let Some((last, _)) = page.last() else {
                break;
            };
            after = Some(*last);
            let mut ended = false;
            for (seq, value) in page {
                self.beat();
                if stop.is_cancelled() || !sink.is_connected() {
                    ended = true;
                    break;
                }
                let msg = match record::decode(&value) {
                    Ok(msg) => msg,
                    Err(error) => {
                        changes.parked(Area::Held, seq, &value, None, &undecodable(&error));
                        continue;
                    }
                };
                let order_key = msg.order_key.as_deref();
                if order_key.is_some_and(|k| blocked_keys.contains(k)) {
                    continue;
                }
                if blocked_routes.contains(msg.routing_key.as_ref()) {
                    blocked_keys.extend(order_key.map(str::to_owned));
                    continue;
                }
                self.set_in_progress(Some((Area::Held, seq)));
                let result = sink.publish(exchange, &msg).await;
                self.set_in_progress(None);
                match result {
                    Ok(()) => {
                        changes.published(Area::Held, seq, value.len() as u64, order_key);
                        published = true;
                    }
                    Err(error @ PublishError::Unroutable(_)) => {
                        if unroutable_log.due(UNROUTABLE_LOG_EVERY) {
                            tracing::error!(%error, event_id = %msg.message_id, held = self.ledger.held_depth.load(Ordering::SeqCst), "held spool entries are still unroutable; bind a queue to the exchange");
                        }
                        blocked_routes.insert(msg.routing_key.to_string());
                        blocked_keys.extend(order_key.map(str::to_owned));
                    }
                    Err(error @ PublishError::Unfit(_)) => {
                        changes.parked(Area::Held, seq, &value, order_key, &error.to_string());
                    }
                    Err(_) => {
                        ended = true;
                        break;
                    }
                }
            }
            if !self
                .commit_changes(std::mem::take(&mut changes), stop)
                .await
                || ended
            {
                return published;
            }
        }
        self.commit_changes(changes, stop).await;
        published
    }

    /// Parks entry `seq` of `area`, if it is still there.
    pub(super) async fn park_entry(
        &self,
        area: Area,
        seq: u64,
        reason: &str,
        stop: &CancellationToken,
    ) {
        match self.tables.get(area, seq) {
            Ok(Some(value)) => {
                let order_key = record::decode(&value)
                    .ok()
                    .and_then(|m| m.order_key.map(|k| k.into_owned()));
                let mut changes = Changes::default();
                changes.parked(area, seq, &value, order_key.as_deref(), reason);
                self.commit_changes(changes, stop).await;
            }
            Ok(None) => {}
            Err(error) => tracing::error!(%error, "cannot read a spool entry to park it"),
        }
    }

    /// Commits `changes` durably, then counts them. While the store refuses, it retries the
    /// commit, not the publishes: publishing the head again on every failed delete flooded
    /// the broker with copies (thousands a second on a full disk). The entries behind wait;
    /// only a shutdown in the meantime leaves them to be published once more after a
    /// restart. Returns whether the first try went through.
    async fn commit_changes(&self, changes: Changes, stop: &CancellationToken) -> bool {
        if changes.ops.is_empty() {
            return true;
        }
        let mut retry = RETRY_MIN;
        let mut reported = false;
        loop {
            match self.writer.commit(changes.ops.clone()).await {
                Ok(()) => {
                    changes.apply(&self.ledger);
                    if reported {
                        tracing::info!("published spool entries deleted; the spool drains again");
                    }
                    break;
                }
                Err(error) => {
                    if !reported {
                        tracing::error!(%error, "cannot delete published spool entries; the spool waits until the store takes writes again");
                        reported = true;
                    }
                    if self.restart_needed().is_some() {
                        // Retrying cannot help: the database refuses writes until it is
                        // opened again. The entries go out once more after the restart.
                        return false;
                    }
                    if stop.is_cancelled() {
                        tracing::warn!("shutting down with published spool entries not deleted; they will be published again after the restart");
                        return false;
                    }
                    self.pause(stop, retry).await;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
        if let Err(error) = self.refresh_oldest() {
            tracing::warn!(%error, "cannot read the spool head");
        }
        self.ledger.publish_gauges();
        !reported
    }

    pub(super) fn set_in_progress(&self, entry: Option<EntryRef>) {
        *lock(&self.in_progress) = entry;
    }

    pub(super) fn clock_ms(&self) -> i64 {
        self.epoch.elapsed().as_millis() as i64
    }

    fn beat(&self) {
        self.beat_ms.store(self.clock_ms(), Ordering::SeqCst);
    }

    /// Sleeps `d` (or until `stop`), telling every second that the drainer is alive.
    async fn pause(&self, stop: &CancellationToken, d: Duration) {
        let end = Instant::now() + d;
        loop {
            self.beat();
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() || stop.is_cancelled() {
                return;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(left.min(BEAT)) => {}
            }
        }
    }
}

/// Runs `pass` until it returns. A panic in it is logged at ERROR, counted in `restarts`,
/// reported to `failed`, and followed by a new pass after a pause that doubles (from
/// `first_pause` up to 30 s) while passes keep failing.
pub(super) async fn supervise<F, Fut>(
    restarts: &Counter,
    stop: &CancellationToken,
    first_pause: Duration,
    mut pass: F,
    mut failed: impl FnMut(),
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut pause = first_pause;
    loop {
        let started = Instant::now();
        let error = match tokio::spawn(pass()).await {
            Ok(()) => return,
            Err(e) if e.is_cancelled() => return,
            Err(e) => e,
        };
        let panic = error.into_panic();
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        restarts.inc();
        failed();
        if started.elapsed() > RESTART_MAX {
            pause = first_pause;
        }
        // Events keep being spooled but none is published until it runs again.
        tracing::error!(panic = %what, restart_in = ?pause, "the spool drainer failed; restarting it");
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(RESTART_MAX);
    }
}

/// The reason an entry that cannot be decoded is parked with.
fn undecodable(error: &RecordError) -> String {
    format!("the entry cannot be decoded: {error}")
}
