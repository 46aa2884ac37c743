//! Guard state as stored: the decision's state, when it may be forgotten, the event that
//! set it and the latest events dropped against it (bounded), so `hookgate inspect` can say
//! since when and by which event a message holds its status or a contact is opted out,
//! and what was dropped as stale or repeated.
//!
//! JSON, as guard state has always been stored; the fields added since are optional, so
//! state written before them reads as state that names no event.

use serde::{Deserialize, Serialize};

use crate::guard::decide::{GuardDrop, KeywordState, StatusState};

/// How many dropped events a key keeps: the latest ones.
pub const DROPPED_KEPT: usize = 4;

/// A guard key's stored state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stored<S> {
    /// When it may be forgotten (Unix ms); never when `None`.
    pub expires_ms: Option<i64>,
    /// The state the decisions read.
    pub state: S,
    /// The accepted event that set the state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<GuardEvent>,
    /// The latest events dropped against the state, oldest first, at most
    /// [`DROPPED_KEPT`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<GuardEvent>,
}

/// One event the guard decided on, as a key's state remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardEvent {
    /// Its event id.
    pub event_id: String,
    /// When it was decided (Unix ms, receipt).
    pub at_ms: i64,
    /// The status or keyword it carried (`delivered`, `STOP`); left out (empty) for the
    /// event that set a status state, whose `status` names it already.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub what: String,
    /// Why it was dropped; absent for the accepted event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl<S> Stored<S> {
    /// `self` with `event` remembered as dropped for `reason`, the oldest one forgotten
    /// beyond [`DROPPED_KEPT`].
    pub fn with_dropped(mut self, mut event: GuardEvent, reason: GuardDrop) -> Self {
        event.reason = Some(reason.as_str().to_owned());
        self.dropped.push(event);
        let extra = self.dropped.len().saturating_sub(DROPPED_KEPT);
        self.dropped.drain(..extra);
        self
    }
}

/// Reads stored status state; `None` when the bytes are not one.
pub fn read_status(bytes: &[u8]) -> Option<Stored<StatusState>> {
    serde_json::from_slice(bytes).ok()
}

/// Reads stored keyword state; `None` when the bytes are not one.
pub fn read_keywords(bytes: &[u8]) -> Option<Stored<KeywordState>> {
    serde_json::from_slice(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str) -> GuardEvent {
        GuardEvent {
            event_id: id.into(),
            at_ms: 1,
            what: "sent".into(),
            reason: None,
        }
    }

    #[test]
    fn state_written_before_the_history_reads_with_none() {
        let old = br#"{"expires_ms":5,"state":{"status":"delivered","rank":3,"timestamp_ms":2}}"#;
        let stored = read_status(old).expect("old state");
        assert_eq!(stored.state.status, "delivered");
        assert!(stored.by.is_none() && stored.dropped.is_empty());
        let old = br#"{"expires_ms":null,"state":{"opted_out":true,"opted_in_by_start":false,"last_change_ms":7,"last_help_ms":null}}"#;
        assert!(read_keywords(old).expect("old state").state.opted_out);
        assert!(read_status(b"junk").is_none());
    }

    #[test]
    fn only_the_latest_drops_are_kept() {
        let old = br#"{"expires_ms":5,"state":{"status":"delivered","rank":3,"timestamp_ms":2}}"#;
        let mut stored = read_status(old).expect("state");
        for i in 0..DROPPED_KEPT + 2 {
            stored = stored.with_dropped(event(&format!("e{i}")), GuardDrop::StaleStatus);
        }
        let ids: Vec<_> = stored.dropped.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["e2", "e3", "e4", "e5"]);
        assert_eq!(stored.dropped[0].reason.as_deref(), Some("stale_status"));
        let bytes = serde_json::to_vec(&stored).expect("json");
        assert_eq!(read_status(&bytes).expect("read").dropped, stored.dropped);
    }
}
