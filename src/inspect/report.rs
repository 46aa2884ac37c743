//! The reports `hookgate inspect` prints, as JSON (`--output json`, and the admin API's
//! answer) and as the text of `render`. Times are RFC 3339 in UTC with three digits of
//! milliseconds, so the times of one answer line up.

use serde::{Deserialize, Serialize};

use crate::guard::decide::{KeywordState, StatusState};
use crate::guard::stored::{GuardEvent, Stored};
use crate::state::decision::{Decided, EventRecord};
use crate::state::marks::{KeyState, StoredMark};

/// An answer: the route and window it is about, and the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The route asked about.
    pub route: String,
    /// The dedup window (`dedup.ttl`): how long an event's record is kept.
    pub window: String,
    /// What is known.
    pub answer: Answer,
}

/// What is known, by the kind of question.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// `inspect event`.
    Event(EventReport),
    /// `inspect request`.
    Request(RequestReport),
    /// `inspect message`.
    Message(MessageReport),
    /// `inspect contact`.
    Contact(ContactReport),
}

impl Answer {
    /// The answer about `route`, whose window is `window`.
    pub fn with_context(self, route: &str, window: &str) -> Report {
        Report {
            route: route.to_owned(),
            window: window.to_owned(),
            answer: self,
        }
    }
}

/// An event's mark and record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventReport {
    /// The id asked about.
    pub event_id: String,
    /// Whether it was found as an inbound message id (a route that reconciles
    /// deduplicates inbound messages by it).
    pub by_message_id: bool,
    /// Its mark; `None`: not seen within the window.
    pub mark: Option<MarkReport>,
    /// The decision its mark records; `None` with a mark: a mark written before marks
    /// carried records, or a delivery still in flight.
    pub record: Option<RecordReport>,
    /// Where a spooled event is now, when the running gateway's spool parked it (entry id
    /// and reason); `None` otherwise and offline.
    #[serde(default)]
    pub parked: Option<String>,
}

impl Report {
    /// The event report in the answer: an event's, or a request's event.
    pub fn event_mut(&mut self) -> Option<&mut EventReport> {
        match &mut self.answer {
            Answer::Event(e) => Some(e),
            Answer::Request(r) => r.event.as_mut(),
            _ => None,
        }
    }
}

/// A dedup mark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkReport {
    /// `done`, or `in_flight` (a delivery is being decided now).
    pub state: String,
    /// When the mark stops counting.
    pub kept_until: Option<String>,
}

impl MarkReport {
    /// The report of `mark`.
    pub fn of(mark: &StoredMark) -> Self {
        Self {
            state: match mark.state {
                KeyState::Done => "done",
                KeyState::InFlight => "in_flight",
                KeyState::Free => "free",
            }
            .to_owned(),
            kept_until: mark.expires_ms.map(at),
        }
    }
}

/// What an event's record says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordReport {
    /// When the delivery that decided it arrived.
    pub first_seen: String,
    /// `accepted` or `dropped`.
    pub outcome: String,
    /// An accepted event: `published` (the broker confirmed it) or `spooled` (durably in
    /// the spool, published once the broker takes it).
    pub delivery: Option<String>,
    /// A dropped event: the reason.
    pub reason: Option<String>,
    /// The `x-source` of the deciding delivery.
    pub source: String,
    /// Every `x-source` it came by.
    pub sources: Vec<String>,
    /// Deliveries counted: the deciding one and the duplicates (and replays) after it.
    pub deliveries: u32,
    /// The request id of the deciding delivery.
    pub first_request_id: Option<String>,
    /// The request id of the latest duplicate, when another.
    pub last_request_id: Option<String>,
}

impl RecordReport {
    /// The report of `record`.
    pub fn of(record: &EventRecord) -> Self {
        let (outcome, delivery, reason) = match record.decided {
            Decided::Published => ("accepted", Some("published"), None),
            Decided::Spooled => ("accepted", Some("spooled"), None),
            Decided::Held => ("accepted", Some("held"), None),
            Decided::Dropped(reason) => ("dropped", None, Some(reason)),
        };
        Self {
            first_seen: at(record.first_seen_ms),
            outcome: outcome.to_owned(),
            delivery: delivery.map(str::to_owned),
            reason: reason.map(str::to_owned),
            source: record.first_source.as_str().to_owned(),
            sources: record
                .sources
                .iter()
                .map(|s| s.as_str().to_owned())
                .collect(),
            deliveries: record.deliveries,
            first_request_id: record.first_request.clone(),
            last_request_id: record.last_request.clone(),
        }
    }
}

/// A request id's mark and the event it brought.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestReport {
    /// The request id asked about.
    pub request_id: String,
    /// Its mark; `None`: not seen within the window.
    pub mark: Option<MarkReport>,
    /// The event it brought, by the id it was deduplicated under.
    pub event_id: Option<String>,
    /// That event's report.
    pub event: Option<EventReport>,
}

/// An event the guard decided on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardEventReport {
    /// Its event id.
    pub event_id: String,
    /// When it was decided.
    pub at: String,
    /// The status or keyword it carried.
    pub what: String,
    /// Why it was dropped, for a dropped one.
    pub reason: Option<String>,
}

impl GuardEventReport {
    fn of(event: &GuardEvent) -> Self {
        Self {
            event_id: event.event_id.clone(),
            at: at(event.at_ms),
            what: event.what.clone(),
            reason: event.reason.clone(),
        }
    }
}

/// A message's status as the guard holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageReport {
    /// The message id asked about.
    pub message_id: String,
    /// The status held; `None`: no status event within `guard.status.retention`.
    pub status: Option<String>,
    /// Its rank.
    pub rank: Option<u32>,
    /// The status event's own timestamp.
    pub status_time: Option<String>,
    /// The accepted event that set it, and when; `None` for state written before the
    /// guard named it.
    pub set_by: Option<GuardEventReport>,
    /// The latest status events dropped against it (stale or repeated), oldest first.
    pub dropped: Vec<GuardEventReport>,
    /// When the state may be forgotten.
    pub kept_until: Option<String>,
}

impl MessageReport {
    /// The report of `stored`, the state of message `id`.
    pub fn of(id: &str, stored: Option<Stored<StatusState>>) -> Self {
        let mut report = Self {
            message_id: id.to_owned(),
            status: None,
            rank: None,
            status_time: None,
            set_by: None,
            dropped: Vec::new(),
            kept_until: None,
        };
        if let Some(s) = stored {
            report.status = Some(s.state.status.clone());
            report.rank = Some(s.state.rank);
            report.status_time = Some(at(s.state.timestamp_ms));
            report.set_by = s.by.as_ref().map(|by| GuardEventReport {
                what: s.state.status.clone(),
                ..GuardEventReport::of(by)
            });
            report.dropped = s.dropped.iter().map(GuardEventReport::of).collect();
            report.kept_until = s.expires_ms.map(at);
        }
        report
    }
}

/// A contact's keyword state on a channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContactReport {
    /// The contact (the sender's number).
    pub from: String,
    /// The channel (our number).
    pub to: String,
    /// Whether any keyword state is kept for the pair.
    pub known: bool,
    /// `opted_out`, `opted_in` (by a START), or `None`: no keyword kept for the pair, so
    /// opted in by default.
    pub opt: Option<String>,
    /// The timestamp of the STOP or START that set it.
    pub changed_at: Option<String>,
    /// The last accepted keyword event, and when it was decided.
    pub last_keyword: Option<GuardEventReport>,
    /// The last accepted HELP's timestamp.
    pub last_help: Option<String>,
    /// The latest keyword events dropped (repeated or stale), oldest first.
    pub dropped: Vec<GuardEventReport>,
    /// When the state may be forgotten; `None`: kept until changed.
    pub kept_until: Option<String>,
}

impl ContactReport {
    /// The report of `stored`, the state of `from` on `to`.
    pub fn of(from: &str, to: &str, stored: Option<Stored<KeywordState>>) -> Self {
        let mut report = Self {
            from: from.to_owned(),
            to: to.to_owned(),
            known: stored.is_some(),
            opt: None,
            changed_at: None,
            last_keyword: None,
            last_help: None,
            dropped: Vec::new(),
            kept_until: None,
        };
        if let Some(s) = stored {
            report.opt = if s.state.opted_out {
                Some("opted_out".to_owned())
            } else if s.state.opted_in_by_start {
                Some("opted_in".to_owned())
            } else {
                None
            };
            report.changed_at = s.state.last_change_ms.map(at);
            report.last_keyword = s.by.as_ref().map(GuardEventReport::of);
            report.last_help = s.state.last_help_ms.map(at);
            report.dropped = s.dropped.iter().map(GuardEventReport::of).collect();
            report.kept_until = s.expires_ms.map(at);
        }
        report
    }
}
/// `ms` (Unix milliseconds) as RFC 3339 in UTC, always with three digits of milliseconds.
fn at(ms: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
        ),
        Err(_) => format!("{ms} ms after the Unix epoch"),
    }
}

#[cfg(test)]
mod tests {
    use super::at;

    #[test]
    fn times_keep_three_digits_of_milliseconds() {
        assert_eq!(at(1_795_946_403_250), "2026-11-29T10:00:03.250Z");
        assert_eq!(at(1_795_946_403_007), "2026-11-29T10:00:03.007Z");
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
    }
}
