//! The running reconcilers, one per route with a `reconcile:` block: started by `app`, asked
//! by the admin endpoint for a walk now, a replay or their status, and waited for at
//! shutdown.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::pipeline::{rfc3339, Pipeline, RouteRuntime};
use crate::reconcile::api::{self, Client};
use crate::reconcile::control::{Control, RouteStatus};
use crate::reconcile::items;
use crate::reconcile::metrics;
use crate::reconcile::position::Positions;
use crate::reconcile::replay_walk::{self, Job, ReplayRequest, ReplayStatus, RequestError};
use crate::reconcile::route_task::run;
use crate::reconcile::walk::Walker;
use crate::state::StateStore;

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
        let window = replay_walk::window(request, control.lookback, now_ms)?;
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
                crate::source::REPLAY_REQUEST_PREFIX
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
