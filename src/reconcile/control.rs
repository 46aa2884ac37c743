//! What the admin endpoint sees of one route's reconciler, and how it asks: the route's
//! status, a manual walk asked for, a replay asked for and its progress, and the wake-up
//! that ends the reconciler's wait.

use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::reconcile::replay_walk::{self, Job, ReplayStatus};
use crate::reconcile::walk::WalkEnd;

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
pub(super) type Request = Option<Duration>;

/// One route's reconciler as the admin endpoint sees it.
pub struct Control {
    pub(super) status: Mutex<RouteStatus>,
    pub(super) requested: Mutex<Option<Request>>,
    pub(super) wake: Notify,
    /// The route's `lookback`, the furthest a replay may reach.
    pub(super) lookback: Duration,
    /// A replay asked for and not yet begun.
    pub(super) replay_asked: Mutex<Option<Job>>,
    /// The last replay asked for, underway or ended.
    pub(super) replay: Mutex<Option<ReplayStatus>>,
}

impl Control {
    pub(super) fn new(route: &str, lookback: Duration) -> Self {
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

    pub(super) fn update_replay(&self, change: impl FnOnce(&mut ReplayStatus)) {
        if let Ok(mut r) = self.replay.lock() {
            if let Some(status) = r.as_mut() {
                change(status);
            }
        }
    }

    pub(super) fn take_replay(&self) -> Option<Job> {
        self.replay_asked.lock().ok().and_then(|mut r| r.take())
    }

    /// Ends a replay asked for and not begun as `end` says: the reconciler stops before it
    /// could begin (the sender refused the key), and its caller is waiting.
    pub(super) fn end_asked_replay(&self, end: &WalkEnd) {
        if self.take_replay().is_some() {
            let (result, error) = replay_walk::ending(end);
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

    pub(super) fn update(&self, change: impl FnOnce(&mut RouteStatus)) {
        if let Ok(mut s) = self.status.lock() {
            change(&mut s);
        }
    }

    pub(super) fn take_request(&self) -> Option<Request> {
        self.requested.lock().ok().and_then(|mut r| r.take())
    }
}
