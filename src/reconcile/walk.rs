//! One walk of a route's list: pages until `has_more` is false, each request paced by the
//! sender's rules, each item made into an event and handed to the pipeline, the position
//! stored once a page's events are answered for.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::reconcile::Reconcile;
use crate::ingress::event;
use crate::pipeline::{rfc3339, Outcome, Pipeline, RouteRuntime};
use crate::reconcile::api::{Client, ListAnswer, Page, RateLimit, RetryAfter};
use crate::reconcile::items::{self, Layout};
use crate::reconcile::key::ApiKey;
use crate::reconcile::metrics::RouteMetrics;
use crate::reconcile::pacing::{self, BeforeRequest, Retry};
use crate::reconcile::position::{Position, Positions, Walk};
use crate::source::RECONCILE_REQUEST_PREFIX;
use crate::store_error::StoreError;

/// Times one walk starts again from its `since` on 422 before it gives up.
const MAX_CURSOR_RESTARTS: u32 = 3;

/// How a walk ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalkEnd {
    /// The last page said `has_more: false`.
    Complete,
    /// Given up until the next interval; the position is where the last answered page left
    /// it.
    GaveUp(String),
    /// 401 or 403: the key is refused.
    KeyRefused(u16),
    /// Shutdown, or the lease was lost.
    Cancelled,
}

/// What one paced request got.
pub(super) enum Fetched {
    Page(Page),
    CursorInvalid,
    KeyRefused(u16),
    GiveUp(String),
    Cancelled,
}

/// Where a walk stands in the list.
pub(super) struct Cursors {
    /// The cursor of the next page; `None` for the first.
    pub(super) next: Option<String>,
    /// Every cursor this walk has met, so a page that repeats one ends it.
    seen: HashSet<String>,
    /// How often the API refused a cursor in this walk.
    restarts: u32,
}

impl Cursors {
    /// At `cursor`, where an unfinished walk stopped, or at the first page.
    pub(super) fn resume(cursor: Option<String>) -> Self {
        Self {
            seen: cursor.iter().cloned().collect(),
            next: cursor,
            restarts: 0,
        }
    }
}

/// Failed tries of one request in a row, by kind.
#[derive(Default)]
struct Tries {
    /// 429 answers.
    too_many: u32,
    /// 5xx answers, timeouts and connection failures.
    transient: u32,
}

/// Everything one route's walks use.
pub struct Walker {
    /// The route the events go in on.
    pub route: Arc<RouteRuntime>,
    /// The webhook's way: freshness, dedup, guard, publish or spool.
    pub pipeline: Arc<Pipeline>,
    /// The list API.
    pub client: Client,
    /// The route's `reconcile:` block.
    pub settings: Reconcile,
    /// Where the route reads an event's values.
    pub layout: Layout,
    /// The stored position.
    pub positions: Arc<Positions>,
    /// The route's reconciliation metrics.
    pub metrics: RouteMetrics,
    /// The wall clock (Unix ms).
    pub clock: Clock,
    /// What the last answer said about the rate limit; kept across walks, since the limit
    /// is the key's, not the walk's.
    pub rate: RateLimit,
}

impl Walker {
    pub(super) fn name(&self) -> &str {
        &self.route.config.name
    }

    /// Walks from where `position` stands (a new walk, from `requested` back if given, or
    /// the unfinished one), storing each step in it and in the store. A walk that published
    /// events logs one INFO line with how many; each event is a DEBUG line.
    pub async fn walk(
        &mut self,
        key: &ApiKey,
        position: &mut Position,
        requested: Option<Duration>,
        stop: &CancellationToken,
    ) -> Result<WalkEnd, StoreError> {
        let mut published = 0u64;
        let end = self
            .walk_pages(key, position, requested, stop, &mut published)
            .await;
        if published > 0 {
            tracing::info!(
                route = self.name(),
                published,
                "reconciliation published events the webhook missed"
            );
        }
        end
    }

    async fn walk_pages(
        &mut self,
        key: &ApiKey,
        position: &mut Position,
        requested: Option<Duration>,
        stop: &CancellationToken,
        published: &mut u64,
    ) -> Result<WalkEnd, StoreError> {
        let Some(walk) = self.begin(position, requested).await? else {
            return Ok(WalkEnd::Complete);
        };
        let since = rfc3339(walk.since_ms);
        let request_id = format!(
            "{RECONCILE_REQUEST_PREFIX}{}:{}",
            self.name(),
            walk.started_ms
        );
        let mut cursors = Cursors::resume(walk.cursor.clone());
        loop {
            let page = match self.fetch(key, cursors.next.as_deref(), &since, stop).await {
                Fetched::Page(page) => page,
                Fetched::CursorInvalid => match self.walk_again(position, &mut cursors).await? {
                    Some(end) => return Ok(end),
                    None => continue,
                },
                Fetched::KeyRefused(status) => return Ok(WalkEnd::KeyRefused(status)),
                Fetched::GiveUp(reason) => return Ok(WalkEnd::GaveUp(reason)),
                Fetched::Cancelled => return Ok(WalkEnd::Cancelled),
            };
            self.count_page(&page);
            if let Some(end) = self.answer_page(&page, &request_id, stop, published).await {
                return Ok(end);
            }
            if !page.has_more {
                return self.complete(position, &walk).await;
            }
            let next = match self.next_cursor(page.next_cursor, &mut cursors) {
                Ok(next) => next,
                Err(end) => return Ok(end),
            };
            self.save_cursor(position, Some(next.clone())).await?;
            cursors.next = Some(next);
        }
    }

    /// Starts a new walk in `position` (from `requested` back if given), or resumes its
    /// unfinished one; notes the try and stores the position. The walk to go on with.
    async fn begin(
        &self,
        position: &mut Position,
        requested: Option<Duration>,
    ) -> Result<Option<Walk>, StoreError> {
        let now = (self.clock)();
        if position.walk.is_none() || requested.is_some() {
            position.walk = Some(Walk {
                since_ms: pacing::since_of_walk(
                    now,
                    self.settings.lookback,
                    position.last_complete_start_ms,
                    requested,
                ),
                cursor: None,
                started_ms: now,
            });
        }
        position.last_try_start_ms = Some(now);
        self.positions.save(position, now).await?;
        Ok(position.walk.clone())
    }

    /// The API refused the cursor (422): the walk starts again from its `since`, or, after
    /// [`MAX_CURSOR_RESTARTS`] times, ends.
    async fn walk_again(
        &self,
        position: &mut Position,
        cursors: &mut Cursors,
    ) -> Result<Option<WalkEnd>, StoreError> {
        cursors.restarts += 1;
        self.metrics.bad("cursor_invalid");
        if cursors.restarts > MAX_CURSOR_RESTARTS {
            return Ok(Some(WalkEnd::GaveUp(format!(
                "cursor refused (422) {} times in one walk",
                cursors.restarts
            ))));
        }
        tracing::warn!(
            route = self.name(),
            "cursor no longer valid (422); walking again from since"
        );
        cursors.next = None;
        cursors.seen.clear();
        self.save_cursor(position, None).await?;
        Ok(None)
    }

    /// Counts a page and its items, and logs the items left out.
    fn count_page(&self, page: &Page) {
        self.metrics.pages.inc();
        self.metrics
            .items
            .inc_by((page.items.len() + page.bad_items.len()) as u64);
        for error in &page.bad_items {
            self.metrics.bad("bad_item");
            tracing::warn!(route = self.name(), %error, "listed item left out");
        }
    }

    /// Hands each item of `page` to the pipeline. `Some` ends the walk, with the page not
    /// answered for: the position stays before it.
    async fn answer_page(
        &self,
        page: &Page,
        request_id: &str,
        stop: &CancellationToken,
        published: &mut u64,
    ) -> Option<WalkEnd> {
        for item in &page.items {
            if stop.is_cancelled() {
                return Some(WalkEnd::Cancelled);
            }
            if let Some(end) = self.answer_for(item, request_id, published).await {
                return Some(end);
            }
        }
        None
    }

    /// The last page is answered for: the walk is complete.
    async fn complete(&self, position: &mut Position, walk: &Walk) -> Result<WalkEnd, StoreError> {
        let end = (self.clock)();
        position.walk = None;
        position.last_complete_start_ms = Some(walk.started_ms);
        position.last_complete_end_ms = Some(end);
        self.positions.save(position, end).await?;
        self.metrics.last_complete.set(end / 1000);
        Ok(WalkEnd::Complete)
    }

    /// The cursor of the next page; the walk ends instead when there is none, or when the
    /// API gave one this walk has met before (it would go round for ever).
    pub(super) fn next_cursor(
        &self,
        next: Option<String>,
        cursors: &mut Cursors,
    ) -> Result<String, WalkEnd> {
        let Some(next) = next else {
            // read_page refuses has_more without a cursor; kept total all the same.
            return Err(WalkEnd::GaveUp("has_more without next_cursor".into()));
        };
        if !cursors.seen.insert(next.clone()) {
            self.metrics.bad("repeated_cursor");
            tracing::warn!(
                route = self.name(),
                "page repeats a cursor of this walk; giving the walk up until the next interval"
            );
            return Err(WalkEnd::GaveUp("the API repeated a cursor".into()));
        }
        Ok(next)
    }

    /// Hands one listed item to the pipeline. `Some` ends the walk: an event that could
    /// not be answered for must not let the position move past its page.
    async fn answer_for(
        &self,
        item: &crate::reconcile::api::Listed,
        request_id: &str,
        published: &mut u64,
    ) -> Option<WalkEnd> {
        let made = match items::make(item, &self.layout) {
            Ok(made) => made,
            Err(items::Skip::NoStatus) => return None,
        };
        let event = match event::parse_listed(made.body, &self.route.fields, request_id.to_owned())
        {
            Ok(event) => event,
            Err(error) => {
                self.metrics.bad("bad_item");
                tracing::warn!(route = self.name(), message_id = %item.id, %error, "listed item makes no usable event");
                return None;
            }
        };
        let outcome = self.pipeline.handle_listed(&self.route, event).await;
        self.metrics.event(&outcome);
        match &outcome {
            Outcome::Accepted { event_id } => {
                *published += 1;
                tracing::debug!(route = self.name(), event_id = %event_id, message_id = %item.id, "reconciliation published an event the webhook missed");
                None
            }
            Outcome::Duplicate { .. } => None,
            Outcome::Dropped { event_id, reason } => {
                tracing::debug!(route = self.name(), event_id = %event_id, reason, "listed event dropped");
                None
            }
            Outcome::BadRequest(error) => {
                tracing::warn!(route = self.name(), message_id = %item.id, %error, "listed item refused");
                None
            }
            Outcome::Unavailable { .. }
            | Outcome::RateLimited { .. }
            | Outcome::InvalidSignature => Some(WalkEnd::GaveUp(
                "an event could not be published or spooled".into(),
            )),
        }
    }

    async fn save_cursor(
        &self,
        position: &mut Position,
        cursor: Option<String>,
    ) -> Result<(), StoreError> {
        if let Some(walk) = position.walk.as_mut() {
            walk.cursor = cursor;
        }
        self.positions.save(position, (self.clock)()).await
    }

    /// One page, paced: waits for `Reset` when the last answer left too few requests, and
    /// tries again on 429, 5xx and timeouts as the sender's rules say.
    pub(super) async fn fetch(
        &mut self,
        key: &ApiKey,
        cursor: Option<&str>,
        since: &str,
        stop: &CancellationToken,
    ) -> Fetched {
        let mut tries = Tries::default();
        loop {
            if let Some(end) = self.wait_for_rate_limit(stop).await {
                return end;
            }
            let reply = self.client.list(key, cursor, since).await;
            self.rate = reply.rate;
            let (wait, rate_limited) = match self.judge(reply.answer, &mut tries) {
                ControlFlow::Continue(retry) => retry,
                ControlFlow::Break(fetched) => return fetched,
            };
            if !self.pause(wait, stop, rate_limited).await {
                return Fetched::Cancelled;
            }
        }
    }

    /// Waits before a request as the last answer's rate limit says; `Some` when the walk
    /// ends instead (shutdown, or a reset after the next walk is due).
    async fn wait_for_rate_limit(&self, stop: &CancellationToken) -> Option<Fetched> {
        let before =
            pacing::before_request(&self.rate, self.settings.min_remaining, (self.clock)());
        match before {
            BeforeRequest::Go => {}
            BeforeRequest::UntilReset(wait) if wait > self.settings.interval => {
                self.metrics.bad("reset_too_far");
                return Some(Fetched::GiveUp(format!(
                    "rate limit resets in {}, after the next walk is due",
                    humantime::format_duration(wait)
                )));
            }
            BeforeRequest::UntilReset(_) => {
                tracing::debug!(
                    route = self.name(),
                    wait_ms = before.wait().as_millis() as u64,
                    "waiting for the rate limit to reset"
                );
            }
            BeforeRequest::NoReset => {
                self.metrics.bad("no_reset");
                tracing::warn!(
                    route = self.name(),
                    "rate limit low and no X-RateLimit-Reset; pausing 1 s"
                );
            }
            BeforeRequest::ResetInPast => {
                self.metrics.bad("reset_in_past");
                tracing::warn!(route = self.name(), reset = ?self.rate.reset_secs, "rate limit low and X-RateLimit-Reset already past; pausing 1 s");
            }
        }
        if !self.pause(before.wait(), stop, true).await {
            return Some(Fetched::Cancelled);
        }
        None
    }

    /// What an answer comes to: what the request fetched (`Break`), or the wait before it
    /// is tried again and whether that wait is the rate limit's (`Continue`).
    fn judge(
        &self,
        answer: ListAnswer,
        tries: &mut Tries,
    ) -> ControlFlow<Fetched, (Duration, bool)> {
        match answer {
            ListAnswer::Page(page) => ControlFlow::Break(Fetched::Page(page)),
            ListAnswer::CursorInvalid => ControlFlow::Break(Fetched::CursorInvalid),
            ListAnswer::KeyRefused(status) => ControlFlow::Break(Fetched::KeyRefused(status)),
            ListAnswer::BadBody(error) => {
                self.metrics.bad("bad_body");
                tracing::warn!(route = self.name(), %error, "list answer not as documented; giving the walk up until the next interval");
                ControlFlow::Break(Fetched::GiveUp(format!("bad answer: {error}")))
            }
            ListAnswer::Refused(status) => {
                self.metrics.bad("refused");
                tracing::warn!(
                    route = self.name(),
                    status,
                    "list request refused; not retried"
                );
                ControlFlow::Break(Fetched::GiveUp(format!("status {status}")))
            }
            ListAnswer::TooMany(retry_after) => {
                self.metrics.rate_limited.inc();
                tries.too_many += 1;
                let base = self.retry_after(retry_after);
                match pacing::after_too_many(
                    base,
                    tries.too_many,
                    self.settings.max_retries.get(),
                    self.settings.max_backoff,
                    rand::random::<f64>(),
                ) {
                    Retry::After(wait) => ControlFlow::Continue((wait, true)),
                    Retry::GiveUp => ControlFlow::Break(Fetched::GiveUp(format!(
                        "429 on {} tries",
                        tries.too_many
                    ))),
                }
            }
            ListAnswer::Transient(reason) => self.after_transient(reason, tries),
        }
    }

    /// The wait a 429 asks for; a missing or unreadable `Retry-After` is counted and logged,
    /// and waits [`pacing::FALLBACK_RETRY_AFTER`].
    fn retry_after(&self, retry_after: RetryAfter) -> Duration {
        match retry_after {
            RetryAfter::Secs(secs) => Duration::from_secs(secs),
            RetryAfter::Missing => {
                self.metrics.bad("no_retry_after");
                tracing::warn!(
                    route = self.name(),
                    "429 without Retry-After; waiting 5 s doubled"
                );
                pacing::FALLBACK_RETRY_AFTER
            }
            RetryAfter::NotANumber(text) => {
                self.metrics.bad("bad_retry_after");
                tracing::warn!(route = self.name(), retry_after = %text, "429 with a Retry-After that is not a number; waiting 5 s doubled");
                pacing::FALLBACK_RETRY_AFTER
            }
        }
    }

    /// The wait after a 5xx, a timeout or a connection failure, or the end of the walk
    /// after `max_retries` of them.
    fn after_transient(
        &self,
        reason: String,
        tries: &mut Tries,
    ) -> ControlFlow<Fetched, (Duration, bool)> {
        tries.transient += 1;
        tracing::debug!(route = self.name(), %reason, tries = tries.transient, "list request failed; trying again");
        match pacing::after_transient(
            tries.transient,
            self.settings.max_retries.get(),
            self.settings.max_backoff,
            rand::random::<f64>(),
        ) {
            Retry::After(wait) => ControlFlow::Continue((wait, false)),
            Retry::GiveUp => ControlFlow::Break(Fetched::GiveUp(format!(
                "{reason} on {} tries",
                tries.transient
            ))),
        }
    }

    /// Sleeps `wait` unless stopped first (false then); time waited for the rate limit is
    /// counted.
    async fn pause(&self, wait: Duration, stop: &CancellationToken, rate_limit: bool) -> bool {
        if wait.is_zero() {
            return !stop.is_cancelled();
        }
        if rate_limit {
            self.metrics.waited(wait);
        }
        tokio::select! {
            _ = stop.cancelled() => false,
            _ = tokio::time::sleep(wait) => true,
        }
    }
}
