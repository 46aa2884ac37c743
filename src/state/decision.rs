//! The decision record kept with a done mark: what hookgate decided about an event and
//! how it came, in a versioned compact binary format of its own (never a serde form of a
//! runtime type), so `hookgate inspect` can answer for any event in the dedup window.
//!
//! Two records exist. An event's mark holds an [`EventRecord`]: first seen, outcome (and a
//! drop's reason), the source it first came by and every source it came by since, the
//! count of deliveries, and the first and last request ids it came under. A request id's
//! mark holds a [`RequestRecord`]: the event it brought. Integers are LEB128 varints;
//! request ids of the two common shapes (a UUID, `req_<ulid>`) take 16 bytes.
//!
//! Layout, version 1: `[1][kind]` then, for an event (kind 1): first seen (zigzag varint,
//! Unix ms), outcome byte, reason byte, sources byte (the first source in bits 0-1, the
//! set of sources in bits 2-4), deliveries (varint), the first request id, the last one
//! (kind 0 when it is the first). For a request (kind 2): whether the event key is an
//! inbound message id (byte), the id (varint length, bytes). A record of another version
//! or kind reads as none: the mark still counts, and inspect says it holds no record.

use super::wire::{put_id, put_signed, put_text, put_varint, Reader};
use crate::source::Source;

/// The format's version byte.
const VERSION: u8 = 1;
const KIND_EVENT: u8 = 1;
const KIND_REQUEST: u8 = 2;

/// The drop reasons by code (code = index + 1; 0 is a reason this table lacks). Append
/// only: a stored code keeps its meaning.
const REASONS: [&str; 8] = [
    "stale_status",
    "repeated_status",
    "repeated_stop",
    "repeated_start",
    "repeated_help",
    "stale_keyword",
    "expired",
    "future_timestamp",
];

/// How an event's first decided delivery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decided {
    /// Accepted: the broker confirmed it.
    Published,
    /// Accepted: durably in the spool, to be published once the broker takes it.
    Spooled,
    /// Accepted: durably in the spool's held area, unroutable or behind an unroutable event
    /// of its guard key, to be published once a queue takes it.
    Held,
    /// Dropped by the guard or the freshness check, with the reason.
    Dropped(&'static str),
}

/// The code a source is stored as, one byte of a decision record.
fn source_code(source: Source) -> u8 {
    match source {
        Source::Webhook => 0,
        Source::Reconcile => 1,
        Source::Replay => 2,
    }
}

/// What an event's done mark records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    /// When the delivery that decided it arrived (Unix ms).
    pub first_seen_ms: i64,
    /// What was decided.
    pub decided: Decided,
    /// The path of the deciding delivery.
    pub first_source: Source,
    /// Every path it came by, the first included, in the order webhook, reconcile, replay.
    pub sources: Vec<Source>,
    /// Deliveries counted: the deciding one and the duplicates after it.
    pub deliveries: u32,
    /// The request id of the deciding delivery.
    pub first_request: Option<String>,
    /// The request id of the latest counted duplicate, when it differs from the first.
    pub last_request: Option<String>,
}

impl EventRecord {
    /// The record of an event decided now, on its first delivery.
    pub fn first(
        first_seen_ms: i64,
        decided: Decided,
        source: Source,
        request: Option<&str>,
    ) -> Self {
        Self {
            first_seen_ms,
            decided,
            first_source: source,
            sources: vec![source],
            deliveries: 1,
            first_request: request.map(str::to_owned),
            last_request: None,
        }
    }

    /// Counts one more delivery (a duplicate, a replay) under `request`.
    pub fn count_delivery(&mut self, source: Source, request: Option<&str>) {
        self.deliveries = self.deliveries.saturating_add(1);
        if !self.sources.contains(&source) {
            self.sources.push(source);
            // A set, kept in the order the record reads it back in.
            self.sources.sort_by_key(|s| source_code(*s));
        }
        if let Some(request) = request {
            if self.first_request.as_deref() != Some(request) {
                self.last_request = Some(request.to_owned());
            }
        }
    }

    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let seen = self
            .sources
            .iter()
            .fold(0u8, |mask, s| mask | (1 << source_code(*s)));
        encode_event(
            EventHead::from(self),
            seen,
            self.first_request.as_deref(),
            self.last_request.as_deref(),
        )
    }

    /// The bytes of [`EventRecord::first`]'s record, made without the record: every
    /// decided delivery writes one.
    pub fn encode_first(
        first_seen_ms: i64,
        decided: Decided,
        source: Source,
        request: Option<&str>,
    ) -> Vec<u8> {
        let head = EventHead {
            first_seen_ms,
            decided,
            first_source: source,
            deliveries: 1,
        };
        encode_event(head, 1 << source_code(source), request, None)
    }

    /// Reads [`EventRecord::encode`]'s bytes; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        if (r.byte()?, r.byte()?) != (VERSION, KIND_EVENT) {
            return None;
        }
        let first_seen_ms = r.signed()?;
        let (outcome, reason) = (r.byte()?, r.byte()?);
        let decided = match outcome {
            1 => Decided::Published,
            2 => Decided::Spooled,
            3 => Decided::Dropped(reason_of(reason)),
            4 => Decided::Held,
            _ => return None,
        };
        let sources_byte = r.byte()?;
        let first_source = *Source::ALL.get(usize::from(sources_byte & 3))?;
        let sources = Source::ALL
            .into_iter()
            .filter(|s| (sources_byte >> 2) & (1 << source_code(*s)) != 0)
            .collect();
        let deliveries = u32::try_from(r.varint()?).ok()?;
        let first_request = r.id()?;
        let last_request = r.id()?;
        r.is_done().then_some(Self {
            first_seen_ms,
            decided,
            first_source,
            sources,
            deliveries,
            first_request,
            last_request,
        })
    }
}

/// The fixed part of an event record, for [`encode_event`].
struct EventHead {
    first_seen_ms: i64,
    decided: Decided,
    first_source: Source,
    deliveries: u32,
}

/// The fixed part of `record`.
impl From<&EventRecord> for EventHead {
    fn from(record: &EventRecord) -> Self {
        Self {
            first_seen_ms: record.first_seen_ms,
            decided: record.decided,
            first_source: record.first_source,
            deliveries: record.deliveries,
        }
    }
}

/// An event record's bytes: its fixed part, the set of its sources (a mask of their
/// codes) and its request ids.
fn encode_event(
    head: EventHead,
    seen: u8,
    first_request: Option<&str>,
    last_request: Option<&str>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    out.extend([VERSION, KIND_EVENT]);
    put_signed(&mut out, head.first_seen_ms);
    let (outcome, reason) = match head.decided {
        Decided::Published => (1, 0),
        Decided::Spooled => (2, 0),
        Decided::Dropped(reason) => (3, reason_code(reason)),
        Decided::Held => (4, 0),
    };
    out.extend([outcome, reason]);
    out.push(source_code(head.first_source) | (seen << 2));
    put_varint(&mut out, u64::from(head.deliveries));
    put_id(&mut out, first_request);
    put_id(&mut out, last_request);
    out
}

/// What a request id's done mark records: the event its delivery was decided as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// The id the event was deduplicated under.
    pub event_id: String,
    /// Whether that id is an inbound message's id (a route that reconciles), not an
    /// event id.
    pub by_message: bool,
}

impl RequestRecord {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        Self::encode_of(&self.event_id, self.by_message)
    }

    /// The bytes of the record of `event_id`, made without the record.
    pub fn encode_of(event_id: &str, by_message: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + event_id.len());
        out.extend([VERSION, KIND_REQUEST, u8::from(by_message)]);
        put_text(&mut out, event_id);
        out
    }

    /// Reads [`RequestRecord::encode`]'s bytes; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        if (r.byte()?, r.byte()?) != (VERSION, KIND_REQUEST) {
            return None;
        }
        let by_message = match r.byte()? {
            0 => false,
            1 => true,
            _ => return None,
        };
        let event_id = r.text()?;
        r.is_done().then_some(Self {
            event_id,
            by_message,
        })
    }
}

fn reason_code(reason: &str) -> u8 {
    REASONS
        .iter()
        .position(|r| *r == reason)
        .map_or(0, |i| i as u8 + 1)
}

fn reason_of(code: u8) -> &'static str {
    usize::from(code)
        .checked_sub(1)
        .and_then(|i| REASONS.get(i))
        .copied()
        .unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(decided: Decided, first: Option<&str>) -> EventRecord {
        EventRecord::first(1_780_000_000_123, decided, Source::Webhook, first)
    }

    #[test]
    fn event_records_round_trip_in_every_outcome_and_id_form() {
        let ids = [
            None,
            Some("3f1c2a9e-8b7d-4c6a-9f0e-1d2c3b4a5f60"),
            Some("req_01HZX3J8Q4K7M2N5P9R6S8T0VW"),
            Some("3F1C2A9E-8B7D-4C6A-9F0E-1D2C3B4A5F60"),
            Some("req_01hzx3j8q4k7m2n5p9r6s8t0vw"),
            Some("req_81HZX3J8Q4K7M2N5P9R6S8T0VW"),
            Some("a sender's own id: ünïcode / +15550001111"),
        ];
        let decided = [
            Decided::Published,
            Decided::Spooled,
            Decided::Held,
            Decided::Dropped("stale_status"),
            Decided::Dropped("future_timestamp"),
        ];
        for id in ids {
            for d in decided {
                let mut r = record(d, id);
                assert_eq!(EventRecord::decode(&r.encode()), Some(r.clone()), "{id:?}");
                r.count_delivery(Source::Replay, Some("req_01HZX3J8Q4K7M2N5P9R6S8T0VX"));
                r.count_delivery(Source::Reconcile, None);
                assert_eq!(EventRecord::decode(&r.encode()), Some(r.clone()), "{id:?}");
            }
        }
    }

    #[test]
    fn a_first_record_is_encoded_alike_with_or_without_the_record() {
        let ids = [
            None,
            Some("3f1c2a9e-8b7d-4c6a-9f0e-1d2c3b4a5f60"),
            Some("3F1C2A9E-8B7D-4C6A-9F0E-1D2C3B4A5F60"),
            Some("{3f1c2a9e-8b7d-4c6a-9f0e-1d2c3b4a5f60}"),
            Some("req_01HZX3J8Q4K7M2N5P9R6S8T0VW"),
        ];
        let decided = [Decided::Held, Decided::Dropped("repeated_stop")];
        for (id, d, source) in ids
            .into_iter()
            .flat_map(|id| decided.map(|d| (id, d)))
            .flat_map(|(id, d)| Source::ALL.map(|s| (id, d, s)))
        {
            let record = EventRecord::first(-5, d, source, id);
            let bytes = EventRecord::encode_first(-5, d, source, id);
            assert_eq!(bytes, record.encode(), "{id:?} {d:?} {source:?}");
            assert_eq!(EventRecord::decode(&bytes), Some(record));
        }
        let request = RequestRecord {
            event_id: "evt_1".into(),
            by_message: true,
        };
        assert_eq!(RequestRecord::encode_of("evt_1", true), request.encode());
    }

    #[test]
    fn an_event_record_with_the_common_request_id_takes_a_few_tens_of_bytes() {
        let r = record(
            Decided::Published,
            Some("3f1c2a9e-8b7d-4c6a-9f0e-1d2c3b4a5f60"),
        );
        assert_eq!(r.encode().len(), 30);
        let r = record(Decided::Published, Some("req_01HZX3J8Q4K7M2N5P9R6S8T0VW"));
        assert_eq!(r.encode().len(), 30);
        let mut r = r;
        r.count_delivery(Source::Webhook, Some("req_01HZX3J8Q4K7M2N5P9R6S8T0VX"));
        assert_eq!(r.encode().len(), 46, "a second request id adds 16 bytes");
    }

    #[test]
    fn counting_keeps_the_first_request_and_the_latest_other_one() {
        let mut r = record(Decided::Published, Some("a"));
        r.count_delivery(Source::Webhook, Some("a"));
        assert_eq!((r.deliveries, r.last_request.as_deref()), (2, None));
        r.count_delivery(Source::Webhook, Some("b"));
        r.count_delivery(Source::Webhook, Some("c"));
        assert_eq!(r.first_request.as_deref(), Some("a"));
        assert_eq!(r.last_request.as_deref(), Some("c"));
        assert_eq!(r.deliveries, 4);
        assert_eq!(r.sources, vec![Source::Webhook]);
        r.deliveries = u32::MAX;
        r.count_delivery(Source::Replay, None);
        assert_eq!(r.deliveries, u32::MAX, "the count saturates");
        assert_eq!(r.sources, vec![Source::Webhook, Source::Replay]);
    }

    #[test]
    fn a_reason_the_table_lacks_reads_as_unknown() {
        let r = record(Decided::Dropped("some_new_reason"), None);
        let read = EventRecord::decode(&r.encode()).expect("record");
        assert_eq!(read.decided, Decided::Dropped("unknown"));
    }

    #[test]
    fn request_records_round_trip() {
        for (event_id, by_message) in [("evt_1", false), ("msg_9", true), ("", false)] {
            let r = RequestRecord {
                event_id: event_id.into(),
                by_message,
            };
            assert_eq!(RequestRecord::decode(&r.encode()), Some(r));
        }
    }

    #[test]
    fn bytes_of_another_version_kind_or_length_read_as_no_record() {
        let event = record(Decided::Published, Some("x")).encode();
        let request = RequestRecord {
            event_id: "e".into(),
            by_message: false,
        }
        .encode();
        assert_eq!(EventRecord::decode(&request), None);
        assert_eq!(RequestRecord::decode(&event), None);
        let mut other_version = event.clone();
        other_version[0] = 2;
        assert_eq!(EventRecord::decode(&other_version), None);
        let mut longer = event.clone();
        longer.push(0);
        assert_eq!(EventRecord::decode(&longer), None);
        for cut in 0..event.len() {
            assert_eq!(EventRecord::decode(&event[..cut]), None, "cut at {cut}");
        }
        for cut in 0..request.len() {
            assert_eq!(RequestRecord::decode(&request[..cut]), None, "cut at {cut}");
        }
        assert_eq!(EventRecord::decode(b""), None);
    }
}
