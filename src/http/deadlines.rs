//! When a connection is closed: the deadlines of one watched connection (setup, idle,
//! age, and the close it was asked for), measured from what it is doing: requests seen,
//! requests in flight, and when the last one ended.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant as TokioInstant;

use crate::config::Limits;
use crate::metrics::CloseReason;

/// The deadlines of one watched connection.
pub(super) struct Deadlines<'a> {
    pub(super) activity: &'a Activity,
    pub(super) limits: &'a Limits,
    /// When the connection reaches `max_connection_age`.
    pub(super) age: TokioInstant,
    /// Set once the connection was asked to close: by then it must have closed.
    pub(super) closing: Option<TokioInstant>,
}

/// What the watcher does when a deadline passes.
pub(super) enum Passed {
    /// The deadline moved since it was picked (it was a look-again, or a request started
    /// or ended meanwhile): wait for the next one.
    Moved,
    /// Drop the connection, counting the close under its reason if it has one.
    Drop(Option<CloseReason>),
    /// Ask the connection to close (and count it).
    AskToClose(CloseReason),
}

impl Deadlines<'_> {
    /// The next deadline and why the connection would be closed at it (`None`: it was
    /// asked to close and has not).
    pub(super) fn next_deadline(&self) -> (TokioInstant, Option<CloseReason>) {
        if let Some(hard) = self.closing {
            return (hard, None);
        }
        let (due, reason) = self.activity.due(self.limits);
        if self.age < due {
            (self.age, Some(CloseReason::MaxAge))
        } else {
            (due, Some(reason))
        }
    }

    /// What to do now that the deadline picked last has passed. The reason is read now:
    /// what the connection did since the deadline was picked may have moved it.
    pub(super) fn passed(&self) -> Passed {
        let (due, reason) = self.next_deadline();
        if due > TokioInstant::now() {
            return Passed::Moved;
        }
        match reason {
            None => {
                tracing::debug!("connection did not close after being asked; dropped");
                Passed::Drop(None)
            }
            Some(CloseReason::SetupTimeout) => {
                tracing::debug!("no complete request head within header_read_timeout; closed");
                Passed::Drop(Some(CloseReason::SetupTimeout))
            }
            Some(reason) => {
                tracing::debug!(reason = reason.as_str(), "asking the connection to close");
                Passed::AskToClose(reason)
            }
        }
    }

    /// Whether a connection that just ended did so without a request, past the setup
    /// deadline, without being asked to close. hyper's own header-read timer (HTTP/1) ends a
    /// silent connection just after the setup deadline; on a busy runtime both are ready in
    /// one poll and either branch may run. It is the same close, counted once.
    pub(super) fn ended_in_setup(&self) -> bool {
        let setup_due = self.activity.accepted + self.limits.header_read_timeout;
        self.closing.is_none()
            && self.activity.requests.load(Ordering::Acquire) == 0
            && TokioInstant::now() >= setup_due
    }

    /// The deadline of a connection asked to close now: one request head and body read.
    pub(super) fn after_asking(&self) -> TokioInstant {
        TokioInstant::now() + self.limits.header_read_timeout + self.limits.body_read_timeout
    }
}

/// A time no connection reaches.
pub(super) fn far_future() -> TokioInstant {
    TokioInstant::now() + Duration::from_secs(86_400 * 365)
}

/// What a connection is doing, as its watcher needs to know: requests seen, requests in
/// flight, and when the last one ended.
pub(super) struct Activity {
    pub(super) accepted: TokioInstant,
    pub(super) requests: AtomicU64,
    in_flight: AtomicUsize,
    /// Milliseconds from `accepted` to the end of the last request.
    last_end_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new(accepted: TokioInstant) -> Self {
        Self {
            accepted,
            requests: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            last_end_ms: AtomicU64::new(0),
        }
    }

    /// The next deadline of an open connection and what it means.
    ///
    /// Nothing wakes the watcher when a request starts or ends: a wake-up per request
    /// would poll the connection, and the request in it, once more for nothing. Instead
    /// no deadline picked here is later than the true one, whatever happens before it:
    /// a connection with a request in flight, or with none yet, is looked at again
    /// within `idle_timeout` of now, the earliest an idle deadline can fall. A watcher
    /// woken early finds the deadline moved ([`Passed::Moved`]) and picks the next.
    fn due(&self, limits: &Limits) -> (TokioInstant, CloseReason) {
        let look_again = TokioInstant::now() + limits.idle_timeout;
        if self.requests.load(Ordering::Acquire) == 0 {
            let setup_due = self.accepted + limits.header_read_timeout;
            (setup_due.min(look_again), CloseReason::SetupTimeout)
        } else if self.in_flight.load(Ordering::Acquire) == 0 {
            let last = Duration::from_millis(self.last_end_ms.load(Ordering::Acquire));
            (
                self.accepted + last + limits.idle_timeout,
                CloseReason::Idle,
            )
        } else {
            (look_again, CloseReason::Idle)
        }
    }
}

/// One request in flight on a connection; ends when dropped (answered or reset).
pub(super) struct InFlight(Arc<Activity>);

impl InFlight {
    pub(super) fn start(activity: Arc<Activity>) -> Self {
        // In flight first: a watcher that sees the request counted also sees it in flight,
        // and never takes a starting request for an idle connection.
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.requests.fetch_add(1, Ordering::AcqRel);
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        let since = a.accepted.elapsed().as_millis() as u64;
        a.last_end_ms.fetch_max(since, Ordering::AcqRel);
        a.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
