//! The drainer: publishes main in order and held entries in passes with back-off
//! ([`held`](crate::held)), parks what can never be published, and deletes what the broker
//! confirmed. Supervised ([`supervise`](crate::supervise)): a panic in a pass is counted and
//! the pass starts again.
//!
//! It works in batches: it publishes up to a batch of entries one by one, each with its
//! confirm, then deletes the confirmed ones (and moves or parks the others) in one durable
//! commit before it counts them as done. A crash republishes at most the batch in flight:
//! entries confirmed whose deletes had not committed. The batch starts at one entry and
//! doubles up to [`DRAIN_BATCH`] while commits succeed; a commit that fails sets it back
//! to one, so a store that refuses deletes holds one published entry, not a batch.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backoff::Doubling;
use tokio_util::sync::CancellationToken;

use crate::changes::Changes;
use crate::locks::lock;
use crate::record::{self, RecordError};
use crate::sink::{Sink, SinkError};
use crate::spool::Spool;
use crate::tables::{Area, EntryRef};

/// The most entries published before their deletes commit: what a crash may republish.
pub const DRAIN_BATCH: usize = 64;
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// Back-off of the passes over held (unroutable) entries.
const HELD_RETRY_MIN: Duration = Duration::from_secs(1);
const HELD_RETRY_MAX: Duration = Duration::from_secs(30);
/// How often held (unroutable) entries are reported.
pub(crate) const UNROUTABLE_LOG_EVERY: Duration = Duration::from_secs(60);
/// The longest the drainer sleeps without telling it is alive.
const BEAT: Duration = Duration::from_secs(1);

/// What one attempt came to.
pub(crate) enum Step {
    /// Entries left their place (published, held apart or parked), or none waited.
    Progress,
    /// The broker is away or blocked: not the drainer's fault.
    Wait,
    /// The broker refused an entry for now (nack, timeout, channel error).
    Failed(SinkError),
}

/// Lets a report through at most once per period.
#[derive(Default)]
pub(crate) struct Every(Option<Instant>);

impl Every {
    pub(crate) fn due(&mut self, every: Duration) -> bool {
        let due = self.0.is_none_or(|t| t.elapsed() >= every);
        if due {
            self.0 = Some(Instant::now());
        }
        due
    }
}

impl Spool {
    /// Republishes entries until `stop`: main in order, deleted in batches after their
    /// acks; held ones in passes with back-off; undecodable or unfit ones parked.
    pub(crate) async fn drain<S: Sink>(
        self: Arc<Self>,
        sink: S,
        exchange: String,
        stop: CancellationToken,
    ) {
        Drainer::new(self, sink, exchange, stop).run().await;
    }

    /// Publishes `rows` (the head of main) in order until one fails, then commits what
    /// became of them in one durable commit. Returns how the batch ended, and whether its
    /// commit went through at the first try.
    pub(crate) async fn drain_batch<S: Sink>(
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
            let entry = (seq, value);
            if let Some(end) = self
                .drain_entry(sink, exchange, entry, &mut changes, unroutable_log)
                .await
            {
                step = end;
                break;
            }
        }
        self.set_in_progress(None);
        let committed = self.commit_changes(changes, stop).await;
        (step, committed)
    }

    /// Publishes main entry `seq`, or moves it to held behind its guard key or because no
    /// queue takes it, or parks it if it can never go; notes which in `changes`. `Some`
    /// ends the batch: the broker is away or refused the entry.
    async fn drain_entry<S: Sink>(
        &self,
        sink: &S,
        exchange: &str,
        (seq, value): (u64, Vec<u8>),
        changes: &mut Changes,
        unroutable_log: &mut Every,
    ) -> Option<Step> {
        let msg = match record::decode(&value) {
            Ok(msg) => msg,
            Err(error) => {
                changes.parked(Area::Main, seq, &value, None, &undecodable(&error));
                return None;
            }
        };
        let order_key = msg.order_key.as_deref();
        if order_key.is_some_and(|k| self.ledger.holds_key(k)) {
            // An earlier event of its guard key waits in held: this one goes behind it.
            // Marked held before it leaves main: a request that finds main empty then also
            // finds the key held, and goes behind this entry.
            self.ledger.hold_key(order_key);
            changes.moved_to_held(seq, value.clone(), order_key);
            return None;
        }
        match sink.publish(exchange, &msg).await {
            Ok(()) => changes.published(Area::Main, seq, value.len() as u64, None),
            Err(error @ SinkError::Unroutable(_)) => {
                if unroutable_log.due(UNROUTABLE_LOG_EVERY) {
                    // Kept safe, and no longer in the way of the rest; but it arrives only
                    // once a queue is bound: an operator must act.
                    let held = self.ledger.held_depth.load(Ordering::SeqCst) + 1;
                    tracing::error!(%error, event_id = %msg.message_id, held, "spooled event is unroutable; held apart until a queue is bound to the exchange");
                }
                self.ledger.hold_key(order_key);
                changes.moved_to_held(seq, value.clone(), order_key);
            }
            Err(SinkError::Unfit(reason)) => {
                changes.parked(Area::Main, seq, &value, order_key, &reason);
            }
            Err(SinkError::Away(_)) => return Some(Step::Wait),
            Err(error) => return Some(Step::Failed(error)),
        }
        None
    }

    /// Commits `changes` durably, then counts them. While the store refuses, it retries the
    /// commit, not the publishes: publishing the head again on every failed delete flooded
    /// the broker with copies (thousands a second on a full disk). The entries behind wait;
    /// only a shutdown in the meantime leaves them to be published once more after a
    /// restart. Returns whether the first try went through.
    pub(crate) async fn commit_changes(&self, changes: Changes, stop: &CancellationToken) -> bool {
        if changes.ops.is_empty() {
            return true;
        }
        let mut retry = Doubling::new(RETRY_MIN, RETRY_MAX);
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
                    if self.restart_needed().is_some() || self.reopening() {
                        // Retrying cannot help: the database refuses writes until it is
                        // opened again (by the writer, or by a restart). The entries go
                        // out once more after that: at most this batch twice. The guard keys
                        // marked held for its moves are taken back with it.
                        changes.abandon(&self.ledger);
                        return false;
                    }
                    if stop.is_cancelled() {
                        tracing::warn!("shutting down with published spool entries not deleted; they will be published again after the restart");
                        changes.abandon(&self.ledger);
                        return false;
                    }
                    self.pause(stop, retry.next_pause()).await;
                }
            }
        }
        if let Err(error) = self.refresh_oldest() {
            tracing::warn!(%error, "cannot read the spool head");
        }
        self.ledger.publish_gauges();
        !reported
    }

    pub(crate) fn set_in_progress(&self, entry: Option<EntryRef>) {
        *lock(&self.in_progress) = entry;
    }

    pub(crate) fn clock_ms(&self) -> i64 {
        self.epoch.elapsed().as_millis() as i64
    }

    pub(crate) fn beat(&self) {
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

/// The drainer's loop and what it carries from one step to the next.
struct Drainer<S> {
    spool: Arc<Spool>,
    sink: S,
    exchange: String,
    stop: CancellationToken,
    /// Entries taken from main at once: doubles while commits go through (see the module).
    batch: usize,
    /// The pause after the broker refused the head.
    retry: Doubling,
    /// Whether the broker refused the head last time: the pause is logged once, and the
    /// end of it too.
    failing: bool,
    /// The pause after a pass over held entries.
    held_retry: Doubling,
    /// When the next pass over held entries is due.
    held_due: Instant,
    unroutable_log: Every,
    /// Whether the store's need of a restart has been logged.
    broken_reported: bool,
    backlog: Backlog,
}

impl<S: Sink> Drainer<S> {
    fn new(spool: Arc<Spool>, sink: S, exchange: String, stop: CancellationToken) -> Self {
        // The pause after a pass that published is the first; after one that published
        // nothing it is twice the pause before. A drainer starts as after a pass that
        // published: a first pass that publishes nothing waits twice the first pause.
        let mut held_retry = Doubling::new(HELD_RETRY_MIN, HELD_RETRY_MAX);
        held_retry.next_pause();
        Self {
            spool,
            sink,
            exchange,
            stop,
            batch: 1,
            retry: Doubling::new(RETRY_MIN, RETRY_MAX),
            failing: false,
            held_retry,
            held_due: Instant::now(),
            unroutable_log: Every::default(),
            broken_reported: false,
            backlog: Backlog::default(),
        }
    }

    /// Takes one step at a time until `stop`: waits out a store that needs a restart,
    /// parks an entry marked for it, passes over held entries when due, else drains main.
    async fn run(mut self) {
        self.spool.beat();
        self.spool.drainer_started.store(true, Ordering::SeqCst);
        loop {
            self.spool.beat();
            if self.stop.is_cancelled() {
                return;
            }
            if let Some(reason) = self.spool.restart_needed() {
                self.wait_for_restart(&reason).await;
            } else if self.spool.reopening() {
                // Publishing now would publish entries it cannot delete; the writer opens
                // the database again as soon as the disk lets it.
                self.spool.refused_since_ms.store(-1, Ordering::SeqCst);
                self.spool.pause(&self.stop, BEAT).await;
            } else if let Some((area, seq)) = self.take_marked() {
                let reason = "the drainer failed on it twice";
                self.spool.park_entry(area, seq, reason, &self.stop).await;
            } else if self.held_pass_due() {
                self.pass_over_held().await;
            } else {
                self.drain_main().await;
            }
        }
    }

    /// Publishing now would publish entries it cannot delete: every one of them would go
    /// out again after the restart. So nothing is drained.
    async fn wait_for_restart(&mut self, reason: &str) {
        if !self.broken_reported {
            tracing::error!(%reason, "the spool cannot write until hookgate restarts; nothing is drained until then");
            self.broken_reported = true;
        }
        self.spool.refused_since_ms.store(-1, Ordering::SeqCst);
        self.spool.pause(&self.stop, BEAT).await;
    }

    /// The entry marked to be parked, if any; the mark is taken.
    fn take_marked(&self) -> Option<EntryRef> {
        lock(&self.spool.failed_on).take_marked()
    }

    fn held_pass_due(&self) -> bool {
        self.spool.ledger.held_depth.load(Ordering::SeqCst) > 0
            && Instant::now() >= self.held_due
            && self.sink.is_connected()
    }

    /// One pass over held entries, and when the next is due.
    async fn pass_over_held(&mut self) {
        let published = self
            .spool
            .retry_held(
                &self.sink,
                &self.exchange,
                &mut self.unroutable_log,
                &self.stop,
            )
            .await;
        if published {
            self.held_retry.reset();
        }
        self.held_due = Instant::now() + self.held_retry.next_pause();
    }

    /// Publishes a batch from the head of main, or waits for entries or for the broker.
    async fn drain_main(&mut self) {
        let rows = match self.spool.tables.page(Area::Main, None, self.batch) {
            Ok(rows) => rows,
            Err(error) => {
                tracing::error!(%error, "cannot read the spool; retrying");
                self.spool.pause(&self.stop, RETRY_MAX).await;
                return;
            }
        };
        if rows.is_empty() {
            self.wait_for_entries().await;
            return;
        }
        if !self.sink.is_connected() {
            self.wait_for_broker().await;
            return;
        }
        let depth = self.spool.ledger.depth.load(Ordering::SeqCst);
        let (step, committed) = self
            .spool
            .drain_batch(
                &self.sink,
                &self.exchange,
                rows,
                &mut self.unroutable_log,
                &self.stop,
            )
            .await;
        self.batch = if committed {
            (self.batch * 2).min(DRAIN_BATCH)
        } else {
            1
        };
        self.after_batch(step, depth).await;
    }

    /// Main is empty: reports the end of a backlog, then sleeps until an entry is added,
    /// held entries are due, or a beat passed.
    async fn wait_for_entries(&mut self) {
        let spool = &self.spool;
        spool.refused_since_ms.store(-1, Ordering::SeqCst);
        let added = spool.added.notified();
        let wake = if spool.is_empty() {
            self.backlog.ended();
            if spool.ledger.held_depth.load(Ordering::SeqCst) > 0 {
                self.held_due
                    .saturating_duration_since(Instant::now())
                    .min(BEAT)
            } else {
                BEAT
            }
        } else {
            // Counted but not committed yet: a push on its way in.
            RETRY_MIN
        };
        tokio::select! {
            _ = self.stop.cancelled() => {}
            _ = added => {}
            _ = tokio::time::sleep(wake) => {}
        }
    }

    /// Sleeps until the broker is connected, or a beat passed.
    async fn wait_for_broker(&self) {
        self.spool.refused_since_ms.store(-1, Ordering::SeqCst);
        tokio::select! {
            _ = self.stop.cancelled() => {}
            _ = self.sink.wait_connected() => {}
            _ = tokio::time::sleep(BEAT) => {}
        }
    }

    /// Notes how a batch ended (`depth` entries were waiting before it), pausing when the
    /// broker is away or refused the head.
    async fn after_batch(&mut self, step: Step, depth: u64) {
        let spool = &self.spool;
        match step {
            Step::Progress => {
                self.backlog.started(depth);
                spool.refused_since_ms.store(-1, Ordering::SeqCst);
                if self.failing {
                    let depth = spool.ledger.depth.load(Ordering::SeqCst);
                    tracing::info!(depth, "spool draining again");
                }
                self.retry.reset();
                self.failing = false;
            }
            Step::Wait => {
                spool.refused_since_ms.store(-1, Ordering::SeqCst);
                spool.pause(&self.stop, RETRY_MIN).await;
            }
            Step::Failed(error) => {
                let now = spool.clock_ms();
                let _ = spool.refused_since_ms.compare_exchange(
                    -1,
                    now,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
                if !self.failing {
                    tracing::warn!(%error, "spool drain paused");
                }
                self.failing = true;
                spool.pause(&self.stop, self.retry.next_pause()).await;
            }
        }
    }
}

/// When the spool started draining and how deep it was then: reported once it is empty, so
/// an operator sees the end of an outage's backlog.
#[derive(Default)]
struct Backlog(Option<(Instant, u64)>);

impl Backlog {
    fn started(&mut self, depth: u64) {
        self.0.get_or_insert_with(|| (Instant::now(), depth));
    }

    fn ended(&mut self) {
        if let Some((since, depth)) = self.0.take() {
            tracing::info!(
                depth_at_start = depth,
                elapsed_ms = since.elapsed().as_millis() as u64,
                "spool drained"
            );
        }
    }
}

/// The reason an entry that cannot be decoded is parked with.
pub(crate) fn undecodable(error: &RecordError) -> String {
    format!("the entry cannot be decoded: {error}")
}
