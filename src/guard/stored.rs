//! Guard state as stored: the decision's state, when it may be forgotten, the event that
//! set it and the latest events dropped against it (bounded), so `hookgate inspect` can say
//! since when and by which event a message holds its status or a contact is opted out,
//! and what was dropped as stale or repeated.
//!
//! In the local store, written in a compact binary form of its own ([`Form::Binary`]):
//! every guarded event reads and writes its key's state, and JSON cost several times the
//! instructions and allocations, and bytes enough that a status state no longer fit inline
//! in the hot set. In Redis, still JSON ([`Form::Json`]): while a rolling upgrade runs
//! replicas of a build before the binary form beside this one, they read each other's
//! state, and one that read no state could let a delayed START undo a newer STOP and write
//! its own state over it. Layout of the binary form: `[form][flags]`, the expiry (zigzag
//! varint, when flags bit 0), the state (a status: its text, rank and timestamp; keywords:
//! a flags byte and the timestamps it says are there), the event that set it (when flags
//! bit 1), the count of dropped events and each of them (id, time, what it carried,
//! whether a reason follows and the reason), in the pieces of `state::wire`. Both forms
//! read in either store: the local store's JSON state, as written before, is written in
//! the binary form at the key's next change.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::guard::decide::{GuardDrop, KeywordState, StatusState};
use crate::state::wire::{put_id, put_signed, put_text, put_varint, Reader};

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

/// A guard state's own part of the binary form: a status state's or a keyword state's.
pub trait StateForm: Sized + Serialize + DeserializeOwned {
    /// The form's first byte; never `{`, which starts the JSON written before it.
    const FORM: u8;
    fn put(&self, out: &mut Vec<u8>);
    fn read(r: &mut Reader<'_>) -> Option<Self>;
}

impl StateForm for StatusState {
    const FORM: u8 = 1;

    fn put(&self, out: &mut Vec<u8>) {
        put_text(out, &self.status);
        put_varint(out, u64::from(self.rank));
        put_signed(out, self.timestamp_ms);
    }

    fn read(r: &mut Reader<'_>) -> Option<Self> {
        Some(Self {
            status: r.text()?,
            rank: u32::try_from(r.varint()?).ok()?,
            timestamp_ms: r.signed()?,
        })
    }
}

const OPTED_OUT: u8 = 1;
const OPTED_IN_BY_START: u8 = 2;
const HAS_LAST_CHANGE: u8 = 4;
const HAS_LAST_HELP: u8 = 8;

impl StateForm for KeywordState {
    const FORM: u8 = 2;

    fn put(&self, out: &mut Vec<u8>) {
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        out.push(
            flag(self.opted_out, OPTED_OUT)
                | flag(self.opted_in_by_start, OPTED_IN_BY_START)
                | flag(self.last_change_ms.is_some(), HAS_LAST_CHANGE)
                | flag(self.last_help_ms.is_some(), HAS_LAST_HELP),
        );
        for ms in [self.last_change_ms, self.last_help_ms]
            .into_iter()
            .flatten()
        {
            put_signed(out, ms);
        }
    }

    fn read(r: &mut Reader<'_>) -> Option<Self> {
        let flags = r.byte()?;
        if flags > OPTED_OUT | OPTED_IN_BY_START | HAS_LAST_CHANGE | HAS_LAST_HELP {
            return None;
        }
        let mut timestamp = |bit: u8| -> Option<Option<i64>> {
            Some(if flags & bit != 0 {
                Some(r.signed()?)
            } else {
                None
            })
        };
        let last_change_ms = timestamp(HAS_LAST_CHANGE)?;
        let last_help_ms = timestamp(HAS_LAST_HELP)?;
        Some(Self {
            opted_out: flags & OPTED_OUT != 0,
            opted_in_by_start: flags & OPTED_IN_BY_START != 0,
            last_change_ms,
            last_help_ms,
        })
    }
}

const HAS_EXPIRY: u8 = 1;
const HAS_BY: u8 = 2;

impl GuardEvent {
    fn put(&self, out: &mut Vec<u8>) {
        put_id(out, Some(&self.event_id));
        put_signed(out, self.at_ms);
        put_text(out, &self.what);
        match &self.reason {
            Some(reason) => {
                out.push(1);
                put_text(out, reason);
            }
            None => out.push(0),
        }
    }

    fn read(r: &mut Reader<'_>) -> Option<Self> {
        Some(Self {
            event_id: r.id()??,
            at_ms: r.signed()?,
            what: r.text()?,
            reason: match r.byte()? {
                0 => None,
                1 => Some(r.text()?),
                _ => return None,
            },
        })
    }
}

/// How guard state is written; [`Stored::from_bytes`] reads both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// The compact binary form: the local store, one process per store.
    Binary,
    /// JSON, which every earlier build reads: a store replicas share.
    Json,
}

impl<S: StateForm> Stored<S> {
    /// The stored bytes, in `form`.
    pub fn encode(&self, form: Form) -> Vec<u8> {
        match form {
            Form::Binary => self.to_bytes(),
            // Serializing plain structs of strings and numbers cannot fail.
            Form::Json => serde_json::to_vec(self).unwrap_or_default(),
        }
    }

    /// The stored bytes, in the binary form.
    pub fn to_bytes(&self) -> Vec<u8> {
        // A status state set by an event with a UUID id takes about 60 bytes.
        let mut out = Vec::with_capacity(64);
        let flags = if self.expires_ms.is_some() {
            HAS_EXPIRY
        } else {
            0
        } | if self.by.is_some() { HAS_BY } else { 0 };
        out.extend([S::FORM, flags]);
        if let Some(expires_ms) = self.expires_ms {
            put_signed(&mut out, expires_ms);
        }
        self.state.put(&mut out);
        if let Some(by) = &self.by {
            by.put(&mut out);
        }
        put_varint(&mut out, self.dropped.len() as u64);
        for event in &self.dropped {
            event.put(&mut out);
        }
        out
    }

    /// Reads the binary form, or the JSON written before it; `None` when the bytes are
    /// neither (another kind of state, or damage), which the guard treats as no state.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        match *bytes.first()? {
            b'{' => serde_json::from_slice(bytes).ok(),
            form if form == S::FORM => Self::read(&mut Reader(&bytes[1..])),
            _ => None,
        }
    }

    fn read(r: &mut Reader<'_>) -> Option<Self> {
        let flags = r.byte()?;
        if flags > HAS_EXPIRY | HAS_BY {
            return None;
        }
        let expires_ms = if flags & HAS_EXPIRY != 0 {
            Some(r.signed()?)
        } else {
            None
        };
        let state = S::read(r)?;
        let by = if flags & HAS_BY != 0 {
            Some(GuardEvent::read(r)?)
        } else {
            None
        };
        let count = usize::try_from(r.varint()?).ok()?;
        // Each event takes at least four bytes: a count beyond that is damage, and no
        // allocation is made for it.
        if count > r.0.len() / 4 {
            return None;
        }
        let dropped = (0..count)
            .map(|_| GuardEvent::read(r))
            .collect::<Option<Vec<_>>>()?;
        r.is_done().then_some(Self {
            expires_ms,
            state,
            by,
            dropped,
        })
    }
}

/// Reads stored status state; `None` when the bytes are not one.
pub fn read_status(bytes: &[u8]) -> Option<Stored<StatusState>> {
    Stored::from_bytes(bytes)
}

/// Reads stored keyword state; `None` when the bytes are not one.
pub fn read_keywords(bytes: &[u8]) -> Option<Stored<KeywordState>> {
    Stored::from_bytes(bytes)
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

    /// Every shape the binary form has: with and without expiry, setting event, reason,
    /// drops, and each keyword flag.
    fn states() -> (Vec<Stored<StatusState>>, Vec<Stored<KeywordState>>) {
        let by = GuardEvent {
            event_id: "3f1c2a9e-8b7d-4c6a-9f0e-1d2c3b4a5f60".into(),
            at_ms: 1_780_000_000_123,
            what: String::new(),
            reason: None,
        };
        let status = |expires_ms, by: Option<GuardEvent>, drops: usize| Stored {
            expires_ms,
            state: StatusState {
                status: "delivered".into(),
                rank: 3,
                timestamp_ms: -2,
            },
            by,
            dropped: (0..drops).map(|i| event(&format!("evt_{i}"))).collect(),
        };
        let statuses = vec![
            status(None, None, 0),
            status(Some(1_780_000_000_000), Some(by.clone()), 0),
            status(Some(5), Some(by.clone()), 2).with_dropped(event("e"), GuardDrop::StaleStatus),
        ];
        let keywords = (0..16u8)
            .map(|bits| Stored {
                expires_ms: (bits & 1 != 0).then_some(9),
                state: KeywordState {
                    opted_out: bits & 1 != 0,
                    opted_in_by_start: bits & 2 != 0,
                    last_change_ms: (bits & 4 != 0).then_some(-7),
                    last_help_ms: (bits & 8 != 0).then_some(i64::MAX),
                },
                by: (bits & 2 != 0).then(|| GuardEvent {
                    what: "STOP".into(),
                    ..by.clone()
                }),
                dropped: Vec::new(),
            })
            .collect();
        (statuses, keywords)
    }

    fn same<S: StateForm + PartialEq + std::fmt::Debug>(a: &Stored<S>, b: &Stored<S>) {
        assert_eq!(
            (a.expires_ms, &a.state, &a.by, &a.dropped),
            (b.expires_ms, &b.state, &b.by, &b.dropped)
        );
    }

    /// `stored` reads back with `read` from both forms, the JSON being the one earlier
    /// builds write and read, and its binary form is no state for `read_other`.
    fn reads_back<S: StateForm + PartialEq + std::fmt::Debug, O>(
        stored: &Stored<S>,
        read: fn(&[u8]) -> Option<Stored<S>>,
        read_other: fn(&[u8]) -> Option<Stored<O>>,
    ) {
        same(&read(&stored.encode(Form::Binary)).expect("binary"), stored);
        let json = stored.encode(Form::Json);
        assert_eq!(json, serde_json::to_vec(stored).expect("json"));
        same(&read(&json).expect("json"), stored);
        assert!(
            read_other(&stored.to_bytes()).is_none(),
            "not the other kind of state"
        );
    }

    #[test]
    fn state_reads_back_as_written_in_the_binary_form_and_from_json() {
        let (statuses, keywords) = states();
        for stored in &statuses {
            reads_back(stored, read_status, read_keywords);
        }
        for stored in &keywords {
            reads_back(stored, read_keywords, read_status);
        }
    }

    #[test]
    fn a_status_state_set_by_an_event_fits_inline_in_the_local_stores_hot_set() {
        // `expiring_lsm` holds values of up to 62 bytes in their entry.
        let (statuses, _) = states();
        let bytes = statuses[1].to_bytes();
        assert!(bytes.len() <= 62, "{} bytes", bytes.len());
        let json = serde_json::to_vec(&statuses[1]).expect("json");
        assert!(json.len() > 2 * bytes.len(), "JSON {} bytes", json.len());
    }

    #[test]
    fn cut_short_lengthened_or_flipped_bytes_never_read_as_another_state() {
        let (statuses, keywords) = states();
        let all: Vec<Vec<u8>> = statuses
            .iter()
            .map(Stored::to_bytes)
            .chain(keywords.iter().map(Stored::to_bytes))
            .collect();
        for bytes in &all {
            for len in 0..bytes.len() {
                assert!(
                    read_status(&bytes[..len]).is_none() && read_keywords(&bytes[..len]).is_none()
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(read_status(&longer).is_none() && read_keywords(&longer).is_none());
            // A flipped bit reads as no state or as a state of the same shape, never a
            // panic; the flags bytes reject bits they do not know.
            for at in 0..bytes.len() {
                for bit in 0..8 {
                    let mut flipped = bytes.clone();
                    flipped[at] ^= 1 << bit;
                    let _ = (read_status(&flipped), read_keywords(&flipped));
                }
            }
        }
        let mut unknown_flag = all[1].clone();
        unknown_flag[1] |= 4;
        assert!(read_status(&unknown_flag).is_none());
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
