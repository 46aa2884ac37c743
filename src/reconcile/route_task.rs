//! One route's reconciler task: it reads the API key, takes the route's lease, waits until
//! a walk is due or asked for, walks (or replays) while renewing the lease, and reports
//! how the walk ended in the status, the metrics and the log. A refused key stops it until
//! the key changes.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::pipeline::rfc3339;
use crate::reconcile::control::Control;
use crate::reconcile::key::{ApiKey, KeySource};
use crate::reconcile::metrics::WalkResult;
use crate::reconcile::pacing;
use crate::reconcile::position::{Position, Positions};
use crate::reconcile::replay_walk::{self, Job};
use crate::reconcile::walk::{WalkEnd, Walker};

/// How often a replica without the lease asks for it, and a holder renews it.
const LEASE_POLL: Duration = Duration::from_secs(10);
/// How often a refused key's file, or a missing key, is looked at again.
const KEY_POLL: Duration = Duration::from_secs(2);
/// A pause after the store failed, before the reconciler tries again.
const STORE_PAUSE: Duration = Duration::from_secs(5);

/// Shows `position` in the status.
fn show(control: &Control, position: &Position) {
    control.update(|s| {
        s.since = position.walk.as_ref().map(|w| rfc3339(w.since_ms));
        s.at_cursor = position.walk.as_ref().is_some_and(|w| w.cursor.is_some());
        s.last_walk_start = position.last_try_start_ms.map(rfc3339);
        s.last_complete = position.last_complete_end_ms.map(rfc3339);
    });
}

/// Sleeps `wait`, or less if a manual walk is asked for; false when stopped.
async fn wait(wait: Duration, control: &Control, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(wait) => true,
        _ = control.wake.notified() => true,
    }
}

/// Renews the lease until it is lost, then cancels `walk`.
async fn keep_lease(positions: Arc<Positions>, walk: CancellationToken, route: String) {
    loop {
        tokio::select! {
            _ = walk.cancelled() => return,
            _ = tokio::time::sleep(LEASE_POLL) => {}
        }
        match positions.lease().await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(route = %route, "reconciliation lease taken by another replica; this walk stops");
                walk.cancel();
                return;
            }
            // The lease outlives a few failed renewals; the walk's own store calls fail too
            // while the store is away.
            Err(error) => {
                tracing::warn!(route = %route, %error, "reconciliation lease not renewed")
            }
        }
    }
}

/// One route's reconciler: waits for its lease and its due time, walks, and reports.
pub(super) async fn run(walker: Walker, control: Arc<Control>, stop: CancellationToken) {
    let mut reconciler = Reconciler {
        name: walker.route.config.name.clone(),
        source: KeySource::of(&walker.settings),
        walker,
        control,
        stop,
        key_error_logged: false,
        gave_up: false,
    };
    while !reconciler.stop.is_cancelled() {
        if let Err(Next::Stop) = reconciler.turn().await {
            break;
        }
    }
    reconciler.walker.positions.end_lease().await;
    reconciler.control.update(|s| {
        s.leader = false;
        s.walking = false;
    });
}

/// One route's reconciler and what its turns carry.
struct Reconciler {
    walker: Walker,
    control: Arc<Control>,
    stop: CancellationToken,
    /// The route's name.
    name: String,
    /// Where the API key is read.
    source: KeySource,
    /// Whether the key's being unreadable is logged since it was last read.
    key_error_logged: bool,
    /// Whether the last walk was given up: it resumes an interval later, not at once.
    gave_up: bool,
}

/// What follows a turn that did not walk.
enum Next {
    /// Another turn.
    Again,
    /// Nothing: the reconciler stops.
    Stop,
}

impl Reconciler {
    /// One turn: reads the key, takes the lease, loads the position and, when a walk is
    /// due or asked for, walks.
    async fn turn(&mut self) -> Result<(), Next> {
        let key = self.read_key().await?;
        self.take_lease().await?;
        if let Some(job) = self.control.take_replay() {
            self.replay(&key, &job).await;
            return Ok(());
        }
        let mut position = self.load_position().await?;
        let requested = self.control.take_request();
        let last = if self.gave_up {
            pacing::LastTry::GaveUp
        } else if position.walk.is_some() {
            pacing::LastTry::Unfinished
        } else {
            pacing::LastTry::Complete
        };
        let due = pacing::until_due(
            (self.walker.clock)(),
            self.walker.settings.interval,
            position.last_try_start_ms,
            last,
        );
        if requested.is_none() && !due.is_zero() {
            // The lease is renewed at least every LEASE_POLL while waiting.
            return Err(self.wait(due.min(LEASE_POLL)).await);
        }
        self.walk(&key, &mut position, requested.flatten()).await
    }

    /// Sleeps `pause`, or less if a manual walk is asked for.
    async fn wait(&self, pause: Duration) -> Next {
        if wait(pause, &self.control, &self.stop).await {
            Next::Again
        } else {
            Next::Stop
        }
    }

    /// The API key; while it cannot be read, the error is logged once and shown.
    async fn read_key(&mut self) -> Result<ApiKey, Next> {
        match self.source.read() {
            Ok(key) => {
                self.key_error_logged = false;
                Ok(key)
            }
            Err(error) => {
                if !self.key_error_logged {
                    tracing::error!(route = %self.name, %error, "reconciliation API key unreadable; the reconciler waits for it");
                    self.key_error_logged = true;
                }
                self.control
                    .update(|s| s.last_error = Some(error.to_string()));
                Err(self.wait(KEY_POLL).await)
            }
        }
    }

    /// Takes or renews the route's lease; without it, waits.
    async fn take_lease(&self) -> Result<(), Next> {
        match self.walker.positions.lease().await {
            Ok(true) => {
                self.control.update(|s| s.leader = true);
                Ok(())
            }
            Ok(false) => {
                self.control.update(|s| s.leader = false);
                Err(self.wait(LEASE_POLL).await)
            }
            Err(error) => {
                tracing::warn!(route = %self.name, %error, "reconciliation lease unavailable");
                Err(self.wait(STORE_PAUSE).await)
            }
        }
    }

    /// The stored position, shown in the status.
    async fn load_position(&self) -> Result<Position, Next> {
        let position = match self.walker.positions.load(&self.name).await {
            Ok(p) => p,
            Err(error) => {
                tracing::warn!(route = %self.name, %error, "reconciliation position unreadable now");
                return Err(self.wait(STORE_PAUSE).await);
            }
        };
        show(&self.control, &position);
        // A restarted replica reports the stored last walk, not none.
        if let Some(end) = position.last_complete_end_ms {
            self.walker.metrics.last_complete.set(end / 1000);
        }
        Ok(position)
    }

    /// Runs a replay while the lease is kept, and shows how it ended.
    async fn replay(&mut self, key: &ApiKey, job: &Job) {
        self.control.update_replay(|s| s.started = true);
        let replay_stop = self.stop.child_token();
        let keeper = tokio::spawn(keep_lease(
            self.walker.positions.clone(),
            replay_stop.clone(),
            self.name.clone(),
        ));
        let control = self.control.clone();
        let progress = move |counts: &replay_walk::ReplayCounts| {
            control.update_replay(|s| s.counts = counts.clone());
        };
        let (end, counts) = self.walker.replay(key, job, &replay_stop, &progress).await;
        replay_stop.cancel();
        keeper.abort();
        let (result, error) = replay_walk::ending(&end);
        tracing::info!(
            route = %self.name,
            dry_run = job.dry_run,
            result,
            listed = counts.listed,
            selected = counts.selected,
            published = counts.published,
            dropped = counts.dropped_total(),
            failed = counts.failed,
            "replay ended"
        );
        self.control.update_replay(|s| {
            s.running = false;
            s.result = Some(result.into());
            s.error = error;
            s.counts = counts;
        });
    }

    /// Walks while the lease is kept, reports how the walk ended, and after a refused key
    /// waits for another.
    async fn walk(
        &mut self,
        key: &ApiKey,
        position: &mut Position,
        requested: Option<Duration>,
    ) -> Result<(), Next> {
        self.control.update(|s| s.walking = true);
        let walk_stop = self.stop.child_token();
        let keeper = tokio::spawn(keep_lease(
            self.walker.positions.clone(),
            walk_stop.clone(),
            self.name.clone(),
        ));
        let end = self.walker.walk(key, position, requested, &walk_stop).await;
        walk_stop.cancel();
        keeper.abort();
        show(&self.control, position);
        self.control.update(|s| s.walking = false);
        self.gave_up = matches!(end, Ok(WalkEnd::GaveUp(_)));
        let refused = report(&self.walker, &self.control, &self.name, end);
        if let Some(status) = refused {
            self.control.end_asked_replay(&WalkEnd::KeyRefused(status));
            let (walker, control, source) = (&self.walker, &self.control, &self.source);
            if !wait_for_new_key(walker, control, source, key, &self.stop, &self.name, status).await
            {
                return Err(Next::Stop);
            }
        }
        Ok(())
    }
}

/// Counts and logs how a walk ended; the status of a refused key, if it was.
fn report(
    walker: &Walker,
    control: &Control,
    name: &str,
    end: Result<WalkEnd, crate::store_error::StoreError>,
) -> Option<u16> {
    let (result, error) = match end {
        Ok(WalkEnd::Complete) => (WalkResult::Complete, None),
        Ok(WalkEnd::GaveUp(reason)) => {
            tracing::warn!(route = name, %reason, "reconciliation walk given up until the next interval");
            (WalkResult::GaveUp, Some(reason))
        }
        Ok(WalkEnd::KeyRefused(status)) => {
            walker.metrics.walk(WalkResult::KeyRefused);
            walker.metrics.key_refused.set(1);
            tracing::error!(route = name, status, "the sender refuses the reconciliation API key; reconciliation of this route stops until the key changes or a restart");
            control.update(|s| {
                s.key_refused = true;
                s.last_result = Some(WalkResult::KeyRefused.as_str().into());
                s.last_error = Some(format!("status {status}: the key is refused"));
            });
            return Some(status);
        }
        Ok(WalkEnd::Cancelled) => return None,
        Err(error) => {
            tracing::warn!(route = name, %error, "reconciliation walk failed on the store; tried again next interval");
            (WalkResult::Failed, Some(error.to_string()))
        }
    };
    walker.metrics.walk(result);
    control.update(|s| {
        s.last_result = Some(result.as_str().into());
        s.last_error = error;
    });
    None
}

/// Waits until the key file holds another key; false when stopped first.
async fn wait_for_new_key(
    walker: &Walker,
    control: &Control,
    source: &KeySource,
    refused: &ApiKey,
    stop: &CancellationToken,
    name: &str,
    _status: u16,
) -> bool {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = tokio::time::sleep(KEY_POLL) => {}
        }
        if source.changed_from(refused) {
            walker.metrics.key_refused.set(0);
            control.update(|s| s.key_refused = false);
            tracing::info!(
                route = name,
                "reconciliation API key changed; reconciliation resumes"
            );
            return true;
        }
    }
}
