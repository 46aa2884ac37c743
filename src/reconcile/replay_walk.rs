//! A replay: an operator's walk of a window of the sender's list that publishes every
//! listed event again, with `x-source: replay`, through the guard but past the dedup marks
//! ([`Pipeline::handle_replayed`](crate::pipeline::Pipeline::handle_replayed)). It asks the
//! API as a reconciliation walk does (the same paced requests, the same rate limit state),
//! stores no position, and counts what became of each event. A dry run walks the same
//! window and only counts the events it would hand to the guard.
//!
//! The window and the counts are pure; [`Walker::replay`] walks.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::ingress::event;
use crate::pipeline::{rfc3339, Outcome};
use crate::reconcile::api::{Listed, Page};
use crate::reconcile::items::{self, RECEIVED_EVENT, STATUS_EVENT};
use crate::reconcile::key::ApiKey;
use crate::reconcile::walk::{Cursors, Fetched, WalkEnd, Walker};

/// The event types a replay makes (those of [`items`]), the only ones `events` may name.
pub const REPLAYED_EVENTS: [&str; 2] = [STATUS_EVENT, RECEIVED_EVENT];

/// What an operator asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayRequest {
    /// How far back the window starts.
    pub since: Duration,
    /// How far back it ends; now when `None`.
    pub until: Option<Duration>,
    /// The event types to replay; all when empty.
    pub events: Vec<String>,
    /// Count only, publish nothing.
    pub dry_run: bool,
}

/// A window of event times, Unix ms, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The earliest event time; also the API's `since`.
    pub since_ms: i64,
    /// The latest event time, if the window ends before now.
    pub until_ms: Option<i64>,
}

impl Window {
    /// Whether an event of time `ts` (Unix ms) falls in the window. An event without a time
    /// does: the API listed it for `since`, and nothing places it after `until`.
    pub fn holds(&self, ts: Option<i64>) -> bool {
        let Some(ts) = ts else { return true };
        ts >= self.since_ms && self.until_ms.is_none_or(|until| ts <= until)
    }
}

/// Why a replay request is refused before anything is asked of the API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("since must reach back more than 0 s")]
    NoWindow,
    #[error(
        "since {since} reaches past the route's lookback {lookback}: the lookback is at most \
         dedup.ttl, and an older event would be dropped as expired"
    )]
    PastLookback { since: String, lookback: String },
    #[error("until {until} ago is not after since {since} ago: the window is empty")]
    UntilBeforeSince { since: String, until: String },
    #[error("a replay makes only message.status and message.received events, not {0:?}")]
    UnknownEvent(String),
}

fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Checks `request` against the route's `lookback` and makes its window, measured back
/// from `now_ms`. Pure.
pub fn window(
    request: &ReplayRequest,
    lookback: Duration,
    now_ms: i64,
) -> Result<Window, RequestError> {
    if request.since.is_zero() {
        return Err(RequestError::NoWindow);
    }
    if request.since > lookback {
        return Err(RequestError::PastLookback {
            since: human(request.since),
            lookback: human(lookback),
        });
    }
    if let Some(until) = request.until.filter(|until| *until >= request.since) {
        return Err(RequestError::UntilBeforeSince {
            since: human(request.since),
            until: human(until),
        });
    }
    if let Some(unknown) = request
        .events
        .iter()
        .find(|e| !REPLAYED_EVENTS.contains(&e.as_str()))
    {
        return Err(RequestError::UnknownEvent(unknown.clone()));
    }
    let back =
        |d: Duration| now_ms.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Ok(Window {
        since_ms: back(request.since),
        until_ms: request.until.map(back),
    })
}

/// What became of a replay's events so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayCounts {
    /// Pages the API answered.
    pub pages: u64,
    /// Items the API listed, all of them.
    pub listed: u64,
    /// Events in the window and of the asked types: what a dry run counts, and what a
    /// replay hands to the guard.
    pub selected: u64,
    /// Published (or spooled) again.
    pub published: u64,
    /// Dropped, by reason (the guard's `stale_*`, freshness's `expired`, ...).
    pub dropped: BTreeMap<String, u64>,
    /// Events that could not be made or published.
    pub failed: u64,
}

impl ReplayCounts {
    /// Counts one event's outcome; false when the replay cannot go on (neither the broker
    /// nor the spool took it: the next would fare no better).
    pub fn count(&mut self, outcome: &Outcome) -> bool {
        match outcome {
            Outcome::Accepted { .. } => self.published += 1,
            Outcome::Dropped { reason, .. } => {
                *self.dropped.entry((*reason).into()).or_default() += 1
            }
            // handle_replayed consults no dedup mark; counted where a reader looks for it.
            Outcome::Duplicate { .. } => *self.dropped.entry("duplicate".into()).or_default() += 1,
            Outcome::BadRequest(_) | Outcome::InvalidSignature => self.failed += 1,
            Outcome::Unavailable { .. } | Outcome::RateLimited { .. } => {
                self.failed += 1;
                return false;
            }
        }
        true
    }

    /// Events dropped, all reasons.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }
}

/// One replay as `GET /reconcile/<route>/replay` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayStatus {
    /// Its number, new for each replay the gateway takes.
    pub id: u64,
    /// Route name.
    pub route: String,
    /// A count only.
    pub dry_run: bool,
    /// The window's start, RFC 3339.
    pub since: String,
    /// The window's end, RFC 3339, if before now.
    pub until: Option<String>,
    /// The event types replayed; all when empty.
    pub events: Vec<String>,
    /// Whether the reconciler began it (it waits for a walk underway to end).
    pub started: bool,
    /// Whether it is asked for or underway.
    pub running: bool,
    /// How it ended: `complete`, `gave_up`, `key_refused`, `cancelled`.
    pub result: Option<String>,
    /// Why it did not complete.
    pub error: Option<String>,
    /// What became of its events.
    pub counts: ReplayCounts,
}

/// A replay the reconciler is to run.
#[derive(Debug, Clone)]
pub struct Job {
    /// The window.
    pub window: Window,
    /// The event types; all when empty.
    pub events: Vec<String>,
    /// Count only.
    pub dry_run: bool,
    /// The request id of its events, `replay:<route>:<id>`.
    pub request_id: String,
}

impl Job {
    /// Whether an event of `event_type` and time `ts` is replayed.
    fn selects(&self, event_type: &str, ts: Option<i64>) -> bool {
        (self.events.is_empty() || self.events.iter().any(|e| e == event_type))
            && self.window.holds(ts)
    }
}

/// A replay's status line for how it ended: (`result`, `error`).
pub fn ending(end: &WalkEnd) -> (&'static str, Option<String>) {
    match end {
        WalkEnd::Complete => ("complete", None),
        WalkEnd::GaveUp(reason) => ("gave_up", Some(reason.clone())),
        WalkEnd::KeyRefused(status) => (
            "key_refused",
            Some(format!("status {status}: the key is refused")),
        ),
        WalkEnd::Cancelled => (
            "cancelled",
            Some("the gateway is shutting down, or lost the route's lease".into()),
        ),
    }
}

impl Walker {
    /// Walks `job`'s window page by page, paced as a walk is, and hands each selected
    /// event to the pipeline (none in a dry run); `progress` sees the counts after each
    /// page. Stores no position: a replay stopped part-way is run again whole.
    pub async fn replay(
        &mut self,
        key: &ApiKey,
        job: &Job,
        stop: &CancellationToken,
        progress: &(dyn Fn(&ReplayCounts) + Send + Sync),
    ) -> (WalkEnd, ReplayCounts) {
        let mut counts = ReplayCounts::default();
        let since = rfc3339(job.window.since_ms);
        let mut cursors = Cursors::resume(None);
        loop {
            let page = match self.fetch(key, cursors.next.as_deref(), &since, stop).await {
                Fetched::Page(page) => page,
                // Without a position a walk again from `since` would publish the pages
                // already answered a second time; the operator runs the replay again.
                Fetched::CursorInvalid => {
                    return (WalkEnd::GaveUp("cursor refused (422)".into()), counts)
                }
                Fetched::KeyRefused(status) => return (WalkEnd::KeyRefused(status), counts),
                Fetched::GiveUp(reason) => return (WalkEnd::GaveUp(reason), counts),
                Fetched::Cancelled => return (WalkEnd::Cancelled, counts),
            };
            if let Some(end) = self.replay_page(&page, job, stop, &mut counts).await {
                return (end, counts);
            }
            progress(&counts);
            if !page.has_more {
                return (WalkEnd::Complete, counts);
            }
            match self.next_cursor(page.next_cursor, &mut cursors) {
                Ok(next) => cursors.next = Some(next),
                Err(end) => return (end, counts),
            }
        }
    }

    /// Replays the items of `page`; `Some` ends the replay.
    async fn replay_page(
        &self,
        page: &Page,
        job: &Job,
        stop: &CancellationToken,
        counts: &mut ReplayCounts,
    ) -> Option<WalkEnd> {
        counts.pages += 1;
        counts.listed += (page.items.len() + page.bad_items.len()) as u64;
        for error in &page.bad_items {
            tracing::warn!(route = self.name(), %error, "listed item left out of the replay");
        }
        for item in &page.items {
            if stop.is_cancelled() {
                return Some(WalkEnd::Cancelled);
            }
            if !self.replay_item(item, job, counts).await {
                return Some(WalkEnd::GaveUp(
                    "an event could not be published or spooled".into(),
                ));
            }
        }
        None
    }

    /// Replays one item if the job selects its event; false when the replay cannot go on.
    async fn replay_item(&self, item: &Listed, job: &Job, counts: &mut ReplayCounts) -> bool {
        // An outbound message without a status has nothing to report.
        let Ok(made) = items::make(item, &self.layout) else {
            return true;
        };
        let request_id = job.request_id.clone();
        let event = match event::parse_listed(made.body, &self.route.fields, request_id) {
            Ok(event) => event,
            Err(error) => {
                counts.failed += 1;
                tracing::warn!(route = self.name(), message_id = %item.id, %error, "listed item makes no usable event; not replayed");
                return true;
            }
        };
        if !job.selects(&event.event_type, event.timestamp_ms) {
            return true;
        }
        counts.selected += 1;
        if job.dry_run {
            return true;
        }
        let outcome = self.pipeline.handle_replayed(&self.route, &event).await;
        tracing::debug!(route = self.name(), event_id = %event.id, outcome = outcome.label().as_str(), "replayed event");
        counts.count(&outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_795_946_400_000;
    const H: Duration = Duration::from_secs(3600);

    fn request(since: Duration, until: Option<Duration>, events: &[&str]) -> ReplayRequest {
        ReplayRequest {
            since,
            until,
            events: events.iter().map(|e| (*e).to_owned()).collect(),
            dry_run: false,
        }
    }

    #[test]
    fn a_window_reaches_back_since_and_ends_at_until() {
        let w = window(&request(6 * H, Some(2 * H), &[]), 26 * H, NOW).expect("window");
        assert_eq!(w.since_ms, NOW - 6 * 3_600_000);
        assert_eq!(w.until_ms, Some(NOW - 2 * 3_600_000));
        assert!(w.holds(Some(NOW - 3 * 3_600_000)));
        assert!(w.holds(Some(w.since_ms)) && w.holds(Some(NOW - 2 * 3_600_000)));
        assert!(!w.holds(Some(w.since_ms - 1)), "before since");
        assert!(!w.holds(Some(NOW - 3_600_000)), "after until");
        assert!(w.holds(None), "the API listed it");
        let open = window(&request(6 * H, None, &[]), 26 * H, NOW).expect("window");
        assert!(open.holds(Some(NOW + 1_000)), "no until: up to now and on");
    }

    #[test]
    fn a_window_past_the_lookback_or_empty_is_refused() {
        assert_eq!(
            window(&request(26 * H, None, &[]), 26 * H, NOW).map(|w| w.since_ms),
            Ok(NOW - 26 * 3_600_000),
            "the lookback itself is allowed"
        );
        let e = window(&request(27 * H, None, &[]), 26 * H, NOW).expect_err("past lookback");
        assert!(
            e.to_string()
                .contains("since 1day 3h reaches past the route's lookback 1day 2h"),
            "{e}"
        );
        for until in [6 * H, 7 * H] {
            let e = window(&request(6 * H, Some(until), &[]), 26 * H, NOW).expect_err("empty");
            assert!(matches!(e, RequestError::UntilBeforeSince { .. }), "{e}");
        }
        assert_eq!(
            window(&request(Duration::ZERO, None, &[]), 26 * H, NOW),
            Err(RequestError::NoWindow)
        );
    }

    #[test]
    fn only_the_event_types_a_replay_makes_may_be_asked_for() {
        let e = window(
            &request(H, None, &["message.status", "message.sent"]),
            26 * H,
            NOW,
        );
        assert_eq!(e, Err(RequestError::UnknownEvent("message.sent".into())));
        assert!(window(&request(H, None, &REPLAYED_EVENTS), 26 * H, NOW).is_ok());
    }

    #[test]
    fn a_job_selects_by_type_and_time() {
        let window = Window {
            since_ms: 100,
            until_ms: Some(200),
        };
        let job = |events: &[&str]| Job {
            window,
            events: events.iter().map(|e| (*e).to_owned()).collect(),
            dry_run: false,
            request_id: "replay:botix:1".into(),
        };
        assert!(job(&[]).selects(STATUS_EVENT, Some(150)));
        assert!(!job(&[]).selects(STATUS_EVENT, Some(201)));
        assert!(job(&[RECEIVED_EVENT]).selects(RECEIVED_EVENT, Some(150)));
        assert!(!job(&[RECEIVED_EVENT]).selects(STATUS_EVENT, Some(150)));
    }

    #[test]
    fn outcomes_are_counted_and_an_unavailable_one_ends_the_replay() {
        let mut c = ReplayCounts::default();
        let id = || "evt".to_owned();
        assert!(c.count(&Outcome::Accepted { event_id: id() }));
        for reason in ["stale_status", "stale_status", "expired"] {
            assert!(c.count(&Outcome::Dropped {
                event_id: id(),
                reason
            }));
        }
        assert!(!c.count(&Outcome::Unavailable { retry_after: 1 }));
        assert_eq!((c.published, c.failed, c.dropped_total()), (1, 1, 3));
        assert_eq!(c.dropped.get("stale_status"), Some(&2));
    }

    #[test]
    fn each_ending_has_its_result() {
        assert_eq!(ending(&WalkEnd::Complete), ("complete", None));
        assert_eq!(ending(&WalkEnd::GaveUp("x".into())).0, "gave_up");
        assert_eq!(ending(&WalkEnd::KeyRefused(401)).0, "key_refused");
        assert_eq!(ending(&WalkEnd::Cancelled).0, "cancelled");
    }
}
