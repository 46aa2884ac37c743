//! Pacing decisions, pure over plain data and an injected `now`: when the next request may
//! go, how long a 429 or a transient failure waits, when a walk is due and how far back it
//! reaches. The walk sleeps; nothing here does.

use std::time::Duration;

use crate::reconcile::api::RateLimit;

/// Share of a 429's wait added at most as jitter (30 %), so replicas sharing a key do not
/// retry in step.
pub const JITTER_SHARE: f64 = 0.30;
/// What a 429 without a usable `Retry-After` waits for at first.
pub const FALLBACK_RETRY_AFTER: Duration = Duration::from_secs(5);
/// What a 5xx or a timeout waits for at first (doubling like a 429's).
pub const TRANSIENT_BASE: Duration = Duration::from_secs(1);
/// The pause when `Remaining` is low and `Reset` is absent or already past: one second, so
/// a sender's bad clock slows the walk instead of letting it storm.
pub const UNKNOWN_RESET_PAUSE: Duration = Duration::from_secs(1);
/// How far before the last complete walk's start a later walk reaches: updates that land
/// while a walk runs, and a clock apart from the sender's by up to this, are not missed.
pub const OVERLAP: Duration = Duration::from_secs(300);

/// What to do before a request, given the last answer's rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeforeRequest {
    /// Send it now.
    Go,
    /// `Remaining` is below the threshold: wait this long, until `Reset`.
    UntilReset(Duration),
    /// `Remaining` is below the threshold and `Reset` is absent: pause
    /// [`UNKNOWN_RESET_PAUSE`] (logged).
    NoReset,
    /// `Remaining` is below the threshold and `Reset` is already past: pause
    /// [`UNKNOWN_RESET_PAUSE`] (logged).
    ResetInPast,
}

impl BeforeRequest {
    /// How long to wait.
    pub fn wait(self) -> Duration {
        match self {
            BeforeRequest::Go => Duration::ZERO,
            BeforeRequest::UntilReset(d) => d,
            BeforeRequest::NoReset | BeforeRequest::ResetInPast => UNKNOWN_RESET_PAUSE,
        }
    }
}

/// Whether the next request must wait for the window to reset: `Remaining` below
/// `min_remaining` means wait until `Reset` (Unix seconds), measured from `now_ms`.
pub fn before_request(rate: &RateLimit, min_remaining: u32, now_ms: i64) -> BeforeRequest {
    let Some(remaining) = rate.remaining else {
        return BeforeRequest::Go;
    };
    if remaining >= u64::from(min_remaining) {
        return BeforeRequest::Go;
    }
    let Some(reset_secs) = rate.reset_secs else {
        return BeforeRequest::NoReset;
    };
    let reset_ms = reset_secs.saturating_mul(1000);
    if reset_ms <= now_ms {
        return BeforeRequest::ResetInPast;
    }
    BeforeRequest::UntilReset(Duration::from_millis((reset_ms - now_ms) as u64))
}

/// What to do after a failed try of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Try again after this long.
    After(Duration),
    /// `max_retries` tries failed: give the walk up until the next interval.
    GiveUp,
}

/// The wait after the `failures`-th 429 in a row (1 for the first): `retry_after` ×
/// 2^(failures − 1), plus `jitter` (0 to 1) × 30 % of that, capped at `max_backoff`, and
/// never less than `retry_after` itself. After `max_retries` failed tries, give up.
pub fn after_too_many(
    retry_after: Duration,
    failures: u32,
    max_retries: u32,
    max_backoff: Duration,
    jitter: f64,
) -> Retry {
    if failures >= max_retries {
        return Retry::GiveUp;
    }
    let doubled = retry_after.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    let jitter = jitter.clamp(0.0, 1.0) * JITTER_SHARE;
    let with_jitter = doubled.saturating_add(doubled.mul_f64(jitter));
    Retry::After(with_jitter.min(max_backoff).max(retry_after))
}

/// The wait after the `failures`-th transient failure (5xx, timeout) in a row: like a 429
/// with a `Retry-After` of [`TRANSIENT_BASE`].
pub fn after_transient(
    failures: u32,
    max_retries: u32,
    max_backoff: Duration,
    jitter: f64,
) -> Retry {
    after_too_many(TRANSIENT_BASE, failures, max_retries, max_backoff, jitter)
}

/// The `since` (Unix ms) of a walk starting at `now_ms`: `lookback` back, or from the last
/// complete walk's start minus [`OVERLAP`] when that is later. `requested` (a manual
/// `--since`) reaches back that far instead, at most `lookback`.
pub fn since_of_walk(
    now_ms: i64,
    lookback: Duration,
    last_complete_start_ms: Option<i64>,
    requested: Option<Duration>,
) -> i64 {
    let floor = now_ms - lookback.as_millis() as i64;
    if let Some(back) = requested {
        return (now_ms - back.as_millis() as i64).max(floor);
    }
    match last_complete_start_ms {
        Some(start) => (start - OVERLAP.as_millis() as i64).max(floor),
        None => floor,
    }
}

/// How the last try of a walk ended, as [`until_due`] needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastTry {
    /// None was made, or it completed.
    Complete,
    /// It stopped short (a restart, a failing store): it resumes at its cursor at once.
    Unfinished,
    /// It was given up (a rate-limit reset after the next walk is due, an answer not as
    /// documented): it resumes at its cursor one `interval` after that try started, so a
    /// sender that keeps refusing costs one try, and one log line, per interval.
    GaveUp,
}

/// How long until the next walk is due at `now_ms`: at once for an unfinished walk or when
/// none was tried, else one `interval` after the last try started.
pub fn until_due(
    now_ms: i64,
    interval: Duration,
    last_try_start_ms: Option<i64>,
    last: LastTry,
) -> Duration {
    match (last, last_try_start_ms) {
        (LastTry::Unfinished, _) | (_, None) => Duration::ZERO,
        (LastTry::Complete | LastTry::GaveUp, Some(start)) => {
            let due = start + interval.as_millis() as i64;
            Duration::from_millis((due - now_ms).max(0) as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const NOW: i64 = 1_795_946_400_000;

    fn rate(remaining: Option<u64>, reset_secs: Option<i64>) -> RateLimit {
        RateLimit {
            limit: Some(30),
            remaining,
            reset_secs,
        }
    }

    #[test]
    fn low_remaining_waits_until_reset_exactly() {
        let reset = NOW / 1000 + 12;
        assert_eq!(
            before_request(&rate(Some(4), Some(reset)), 5, NOW),
            BeforeRequest::UntilReset(12 * S)
        );
        assert_eq!(
            before_request(&rate(Some(0), Some(reset)), 5, NOW + 500),
            BeforeRequest::UntilReset(Duration::from_millis(11_500))
        );
        assert_eq!(
            before_request(&rate(Some(5), Some(reset)), 5, NOW),
            BeforeRequest::Go,
            "at the threshold is not below it"
        );
        assert_eq!(
            before_request(&rate(None, Some(reset)), 5, NOW),
            BeforeRequest::Go
        );
        assert_eq!(
            before_request(&rate(Some(0), Some(reset)), 0, NOW),
            BeforeRequest::Go,
            "a threshold of 0 never waits"
        );
    }

    #[test]
    fn a_past_or_missing_reset_pauses_a_second_not_zero_and_not_forever() {
        let r = before_request(&rate(Some(0), Some(NOW / 1000 - 30)), 5, NOW);
        assert_eq!(r, BeforeRequest::ResetInPast);
        assert_eq!(r.wait(), UNKNOWN_RESET_PAUSE);
        let r = before_request(&rate(Some(0), Some(NOW / 1000)), 5, NOW);
        assert_eq!(r, BeforeRequest::ResetInPast, "reset now is past");
        let r = before_request(&rate(Some(1), None), 5, NOW);
        assert_eq!(r, BeforeRequest::NoReset);
        assert_eq!(r.wait(), UNKNOWN_RESET_PAUSE);
    }

    #[test]
    fn too_many_doubles_from_retry_after_with_at_most_30_percent_jitter() {
        let max = Duration::from_secs(60);
        let cases = [
            (1, 0.0, 2 * S),
            (2, 0.0, 4 * S),
            (3, 0.0, 8 * S),
            (1, 1.0, Duration::from_millis(2600)),
            (2, 0.5, Duration::from_millis(4600)),
        ];
        for (failures, jitter, want) in cases {
            assert_eq!(
                after_too_many(2 * S, failures, 5, max, jitter),
                Retry::After(want),
                "failures {failures}, jitter {jitter}"
            );
        }
    }

    #[test]
    fn too_many_is_capped_but_never_below_retry_after() {
        let max = Duration::from_secs(60);
        assert_eq!(
            after_too_many(20 * S, 3, 5, max, 1.0),
            Retry::After(max),
            "80 s plus jitter is capped at 60 s"
        );
        assert_eq!(
            after_too_many(90 * S, 1, 5, max, 0.0),
            Retry::After(90 * S),
            "the cap never cuts the sender's Retry-After"
        );
        assert_eq!(
            after_too_many(Duration::ZERO, 2, 5, max, 1.0),
            Retry::After(Duration::ZERO)
        );
    }

    #[test]
    fn the_fifth_failure_gives_up() {
        let max = Duration::from_secs(60);
        for failures in 1..5 {
            assert!(matches!(
                after_too_many(S, failures, 5, max, 0.3),
                Retry::After(_)
            ));
        }
        assert_eq!(after_too_many(S, 5, 5, max, 0.3), Retry::GiveUp);
        assert_eq!(after_transient(1, 1, max, 0.0), Retry::GiveUp);
        assert_eq!(after_transient(2, 5, max, 0.0), Retry::After(2 * S));
    }

    #[test]
    fn jitter_stays_within_its_share_for_any_draw() {
        let max = Duration::from_secs(600);
        for i in 0..=100 {
            let jitter = f64::from(i) / 100.0;
            let Retry::After(wait) = after_too_many(10 * S, 2, 5, max, jitter) else {
                panic!("gave up")
            };
            assert!(wait >= 20 * S && wait <= 26 * S, "{wait:?}");
        }
    }

    #[test]
    fn a_walk_reaches_back_lookback_or_to_the_last_complete_start_minus_overlap() {
        let h = 3_600_000;
        let lookback = Duration::from_secs(26 * 3600);
        assert_eq!(since_of_walk(NOW, lookback, None, None), NOW - 26 * h);
        assert_eq!(
            since_of_walk(NOW, lookback, Some(NOW - h), None),
            NOW - h - 300_000
        );
        assert_eq!(
            since_of_walk(NOW, lookback, Some(NOW - 40 * h), None),
            NOW - 26 * h,
            "never further than lookback"
        );
        assert_eq!(
            since_of_walk(
                NOW,
                lookback,
                Some(NOW - h),
                Some(Duration::from_secs(6 * 3600))
            ),
            NOW - 6 * h
        );
        assert_eq!(
            since_of_walk(NOW, lookback, None, Some(Duration::from_secs(30 * 3600))),
            NOW - 26 * h,
            "a manual since is held to lookback too"
        );
    }

    #[test]
    fn a_walk_is_due_an_interval_after_the_last_try() {
        let hour = Duration::from_secs(3600);
        assert_eq!(
            until_due(NOW, hour, None, LastTry::Complete),
            Duration::ZERO
        );
        assert_eq!(
            until_due(NOW, hour, Some(NOW - 600_000), LastTry::Unfinished),
            Duration::ZERO
        );
        assert_eq!(
            until_due(NOW, hour, Some(NOW - 600_000), LastTry::Complete),
            Duration::from_secs(3000)
        );
        assert_eq!(
            until_due(NOW, hour, Some(NOW - 2 * 3_600_000), LastTry::Complete),
            Duration::ZERO
        );
    }

    #[test]
    fn a_walk_given_up_waits_an_interval_from_its_try_however_often_it_is_asked() {
        let interval = Duration::from_secs(3);
        let start = NOW;
        // Asked every millisecond after a walk gave up (a reset 20 s away): not due until
        // the interval has passed, then due once.
        let mut due_at = Vec::new();
        for now in start..start + 4_000 {
            if until_due(now, interval, Some(start), LastTry::GaveUp).is_zero() {
                due_at.push(now - start);
            }
        }
        assert_eq!(due_at.first(), Some(&3_000));
        assert_eq!(
            until_due(start + 1_000, interval, Some(start), LastTry::GaveUp),
            Duration::from_secs(2)
        );
        // Unlike a walk cut short, which resumes at once.
        assert!(until_due(start + 1, interval, Some(start), LastTry::Unfinished).is_zero());
    }
}
