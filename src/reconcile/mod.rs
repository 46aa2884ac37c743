//! Reconciliation (contract §10): for each route with a `reconcile:` block, a task that
//! walks the sender's list API every `interval` and hands what it lists to the pipeline,
//! so what the webhook missed is published once. Holding the route's lease, it walks;
//! the status, a manual run and a replay are reached through [`Reconcilers`].
//!
//! `api` reads the API's answers, `pacing` decides waits (pure), `items` makes events of
//! listed messages (pure), `walk` walks, `replay` walks a window to publish it again,
//! `position` stores where a walk stands, `key` reads the API key and `metrics` counts.

pub mod api;
pub mod items;
pub mod key;
pub mod metrics;
pub mod pacing;
pub mod position;
pub mod replay;
pub mod walk;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::pipeline::{rfc3339, Pipeline, RouteRuntime};
use crate::reconcile::api::Client;
use crate::reconcile::key::{ApiKey, KeySource};
use crate::reconcile::metrics::WalkResult;
use crate::reconcile::position::{Position, Positions};
use crate::reconcile::replay::{Job, ReplayRequest, ReplayStatus, RequestError};
use crate::reconcile::walk::{WalkEnd, Walker};
use crate::state::StateStore;

/// How often a replica without the lease asks for it, and a holder renews it.
const LEASE_POLL: Duration = Duration::from_secs(10);
/// How often a refused key's file, or a missing key, is looked at again.
const KEY_POLL: Duration = Duration::from_secs(2);
/// A pause after the store failed, before the reconciler tries again.
const STORE_PAUSE: Duration = Duration::from_secs(5);

/// What `hookgate reconcile status` shows of one route.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RouteStatus {
    /// Route name.
    pub route: String,
    /// Whether this replica holds the route's lease (with Redis, one replica does).
    pub leader: bool,
    /// Whether a walk runs now.
    pub walking: bool,
    /// Whether the sender refuses the key (401/403): stopped until it changes.
    pub key_refused: bool,
    /// `since` of the unfinished walk, RFC 3339.
    pub since: Option<String>,
    /// Whether the unfinished walk resumes at a cursor.
    pub at_cursor: bool,
    /// Start of the last walk tried, RFC 3339.
    pub last_walk_start: Option<String>,
    /// End of the last complete walk, RFC 3339.
    pub last_complete: Option<String>,
    /// How the last walk ended: `complete`, `gave_up`, `key_refused`, `failed`.
    pub last_result: Option<String>,
    /// The last error, if the last walk did not complete.
    pub last_error: Option<String>,
}

/// A manual walk asked for: `Some(d)` reaches back `d`.
type Request = Option<Duration>;

/// One route's reconciler as the admin endpoint sees it.
pub struct Control {
    status: Mutex<RouteStatus>,
    requested: Mutex<Option<Request>>,
    wake: Notify,
    /// The route's `lookback`, the furthest a replay may reach.
    lookback: Duration,
    /// A replay asked for and not yet begun.
    replay_asked: Mutex<Option<Job>>,
    /// The last replay asked for, underway or ended.
    replay: Mutex<Option<ReplayStatus>>,
}

impl Control {
    fn new(route: &str, lookback: Duration) -> Self {
        Self {
            status: Mutex::new(RouteStatus {
                route: route.to_owned(),
                ..RouteStatus::default()
            }),
            requested: Mutex::new(None),
            wake: Notify::new(),
            lookback,
            replay_asked: Mutex::new(None),
            replay: Mutex::new(None),
        }
    }

    /// The last replay's status, if one was asked for.
    pub fn replay_status(&self) -> Option<ReplayStatus> {
        self.replay.lock().ok().and_then(|r| r.clone())
    }

    fn update_replay(&self, change: impl FnOnce(&mut ReplayStatus)) {
        if let Ok(mut r) = self.replay.lock() {
            if let Some(status) = r.as_mut() {
                change(status);
            }
        }
    }

    fn take_replay(&self) -> Option<Job> {
        self.replay_asked.lock().ok().and_then(|mut r| r.take())
    }

    /// Ends a replay asked for and not begun as `end` says: the reconciler stops before it
    /// could begin (the sender refused the key), and its caller is waiting.
    fn end_asked_replay(&self, end: &WalkEnd) {
        if self.take_replay().is_some() {
            let (result, error) = replay::ending(end);
            self.update_replay(|s| {
                s.running = false;
                s.result = Some(result.into());
                s.error = error;
            });
        }
    }

    /// The route's status now.
    pub fn status(&self) -> RouteStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn update(&self, change: impl FnOnce(&mut RouteStatus)) {
        if let Ok(mut s) = self.status.lock() {
            change(&mut s);
        }
    }

    fn take_request(&self) -> Option<Request> {
        self.requested.lock().ok().and_then(|mut r| r.take())
    }
}

/// Why a manual walk was not started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error("no route {0} reconciles")]
    NoSuchRoute(String),
    #[error("another replica holds the lease of route {0}; ask it")]
    NotLeader(String),
    #[error("the sender refuses route {0}'s key; replace the key file or restart")]
    KeyRefused(String),
}

/// Why a replay was not started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("a replay of route {0} is underway; wait for its end")]
    Underway(String),
}

/// The running reconcilers, by route.
#[derive(Default)]
pub struct Reconcilers {
    controls: Vec<(String, Arc<Control>)>,
    tasks: Mutex<JoinSet<()>>,
    /// The number of the last replay asked for.
    replays: AtomicU64,
}

/// What a reconciler needs, handed over by `app`.
pub struct Parts {
    /// The webhook's way.
    pub pipeline: Arc<Pipeline>,
    /// Where positions and leases are.
    pub state: Arc<StateStore>,
    /// The registry.
    pub metrics: Arc<Metrics>,
    /// The wall clock.
    pub clock: Clock,
}

/// Why reconcilers could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("route {route}: {source}")]
    Client {
        route: String,
        source: api::ClientError,
    },
}

impl Reconcilers {
    /// Starts a reconciler for each route with a `reconcile:` block; they stop when `stop`
    /// is cancelled (see [`Reconcilers::finish`]).
    pub fn start(
        routes: &[Arc<RouteRuntime>],
        parts: &Parts,
        stop: &CancellationToken,
    ) -> Result<Self, StartError> {
        let mut controls = Vec::new();
        let mut tasks = JoinSet::new();
        for route in routes {
            let Some(settings) = route.config.reconcile.clone() else {
                continue;
            };
            let name = route.config.name.clone();
            let client = Client::new(settings.url.clone(), settings.page_size, settings.timeout)
                .map_err(|source| StartError::Client {
                    route: name.clone(),
                    source,
                })?;
            let control = Arc::new(Control::new(&name, settings.lookback));
            let walker = Walker {
                layout: items::Layout::of(&route.config),
                route: route.clone(),
                pipeline: parts.pipeline.clone(),
                client,
                positions: Arc::new(Positions::new(parts.state.clone(), &name)),
                metrics: metrics::RouteMetrics::new(&parts.metrics, &name),
                clock: parts.clock.clone(),
                rate: api::RateLimit::default(),
                settings,
            };
            tasks.spawn(run(walker, control.clone(), stop.clone()));
            controls.push((name, control));
        }
        Ok(Self {
            controls,
            tasks: Mutex::new(tasks),
            replays: AtomicU64::new(0),
        })
    }

    /// The reconciler of `route` that may be asked for a walk now.
    fn ready_control(&self, route: &str) -> Result<&Arc<Control>, RunError> {
        let Some((_, control)) = self.controls.iter().find(|(n, _)| n == route) else {
            return Err(RunError::NoSuchRoute(route.to_owned()));
        };
        let status = control.status();
        if status.key_refused {
            return Err(RunError::KeyRefused(route.to_owned()));
        }
        if !status.leader {
            return Err(RunError::NotLeader(route.to_owned()));
        }
        Ok(control)
    }

    /// Asks `route`'s reconciler for a replay of `request`'s window, measured back from
    /// `now_ms`; it begins once a walk underway ends. Its status as asked for.
    pub fn replay(
        &self,
        route: &str,
        request: &ReplayRequest,
        now_ms: i64,
    ) -> Result<ReplayStatus, ReplayError> {
        let control = self.ready_control(route)?;
        let window = replay::window(request, control.lookback, now_ms)?;
        // A panic while the status was held leaves it readable: the status is plain data.
        let mut last = control
            .replay
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.as_ref().is_some_and(|r| r.running) {
            return Err(ReplayError::Underway(route.to_owned()));
        }
        let id = self.replays.fetch_add(1, Ordering::Relaxed) + 1;
        let status = ReplayStatus {
            id,
            route: route.to_owned(),
            dry_run: request.dry_run,
            since: rfc3339(window.since_ms),
            until: window.until_ms.map(rfc3339),
            events: request.events.clone(),
            running: true,
            ..ReplayStatus::default()
        };
        let job = Job {
            window,
            events: request.events.clone(),
            dry_run: request.dry_run,
            request_id: format!(
                "{}{route}:{now_ms}:{id}",
                crate::outbox::message::REPLAY_REQUEST_PREFIX
            ),
        };
        if let Ok(mut asked) = control.replay_asked.lock() {
            *asked = Some(job);
        }
        *last = Some(status.clone());
        drop(last);
        control.wake.notify_one();
        Ok(status)
    }

    /// The last replay of `route`: `Err` when no route of that name reconciles, `None`
    /// when none was asked for.
    pub fn replay_status(&self, route: &str) -> Result<Option<ReplayStatus>, RunError> {
        self.controls
            .iter()
            .find(|(n, _)| n == route)
            .map(|(_, c)| c.replay_status())
            .ok_or_else(|| RunError::NoSuchRoute(route.to_owned()))
    }

    /// Each reconciling route's status, in config order.
    pub fn statuses(&self) -> Vec<RouteStatus> {
        self.controls.iter().map(|(_, c)| c.status()).collect()
    }

    /// Asks `route`'s reconciler for a walk now, reaching back `since` if given.
    pub fn run_now(&self, route: &str, since: Option<Duration>) -> Result<(), RunError> {
        let control = self.ready_control(route)?;
        if let Ok(mut r) = control.requested.lock() {
            *r = Some(since);
        }
        control.wake.notify_one();
        Ok(())
    }

    /// Waits, at most `grace`, for the reconcilers to stop after `stop` was cancelled: a
    /// walk ends between two events, never between an event's publish and its marks.
    pub async fn finish(&self, grace: Duration) {
        let Some(mut tasks) = self.tasks.lock().ok().map(|mut t| std::mem::take(&mut *t)) else {
            return;
        };
        let all = async { while tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, all).await.is_err() {
            tracing::warn!("reconcilers still running at the end of the shutdown grace");
        }
    }
}

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
async fn run(walker: Walker, control: Arc<Control>, stop: CancellationToken) {
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
        let progress = move |counts: &replay::ReplayCounts| {
            control.update_replay(|s| s.counts = counts.clone());
        };
        let (end, counts) = self.walker.replay(key, job, &replay_stop, &progress).await;
        replay_stop.cancel();
        keeper.abort();
        let (result, error) = replay::ending(&end);
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
