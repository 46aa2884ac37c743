//! The spool's record of a message, as it lies on disk.
//!
//! Records outlive the code that writes them (entries wait across upgrades and restarts),
//! so their layout is fixed here, field by field, and does not follow the Rust shape of
//! [`SpooledMessage`]: a field of it can be renamed or moved without touching a record on
//! disk. The first byte is the format version.
//!
//! Version 3, which [`encode`] writes, is version 2 with a CRC-32 (big-endian) of the bytes
//! after it, checked at each read, so a damaged record is refused
//! ([`RecordError::Damaged`]; [`RecordError::DamagedVersion`] when only the version byte is)
//! instead of read as another message:
//!
//! | field          | encoding                     |
//! |----------------|------------------------------|
//! | version        | `u8`, 3                      |
//! | checksum       | `u32`, CRC-32 of the rest    |
//! | ...            | as version 2, from `routing_key` on |
//!
//! Version 2, still read, is version 1 with the W3C trace context after `content_type`, so
//! a spooled event is published with the trace it arrived with:
//!
//! | field          | encoding                     |
//! |----------------|------------------------------|
//! | version        | `u8`, 2                      |
//! | ...            | as version 1, up to and with `content_type` |
//! | traceparent    | optional text                |
//! | tracestate     | optional text                |
//! | body           | bytes                        |
//!
//! Version 1 (integers big-endian), still read (its messages have no trace context):
//!
//! | field          | encoding                     |
//! |----------------|------------------------------|
//! | version        | `u8`, 1                      |
//! | routing_key    | text                         |
//! | message_id     | text                         |
//! | timestamp_secs | `u64`                        |
//! | request_id     | text                         |
//! | event_type     | text                         |
//! | attempt        | optional `i64`               |
//! | route          | text                         |
//! | received_at    | text                         |
//! | order_key      | optional text                |
//! | content_type   | optional text                |
//! | body           | bytes                        |
//!
//! Bytes are a `u32` length and that many bytes; a text is bytes that are UTF-8. An optional
//! value is a `u8` flag, 0 (absent) or 1 (present), then the value when present. The record
//! ends with the body: a record that ends sooner, or goes on after it, is refused, so a torn
//! or damaged record is reported instead of read as a shorter message.
//!
//! Records written before the format had a version (legacy) are a `u32` length, that much
//! JSON metadata with the keys of [`LegacyMeta`], and the body to the end. They still
//! decode, so a spool left by such a version drains after an upgrade. Their first byte is 0
//! (the high byte of the length of metadata under 16 MiB); a record whose first byte is not
//! 0 and that does not decode as the version it names is also tried as legacy, for the
//! metadata of 16 MiB or more that a body limit in megabytes allows.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;

/// A message as the spool keeps it: what a broker is sent, and the guard key its order is
/// kept by. Its texts borrow where they can (a message read back from a record owns them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpooledMessage<'a> {
    /// Routing key.
    pub routing_key: Cow<'a, str>,
    /// The event id.
    pub message_id: Cow<'a, str>,
    /// Receipt time, Unix seconds.
    pub timestamp_secs: u64,
    /// The request that brought it.
    pub request_id: Cow<'a, str>,
    /// The event's type.
    pub event_type: Cow<'a, str>,
    /// The sender's delivery attempt, when it sent one.
    pub attempt: Option<i64>,
    /// The route that took it.
    pub route: Cow<'a, str>,
    /// Receipt time, RFC 3339 UTC.
    pub received_at: Cow<'a, str>,
    /// The guard key: messages with the same key reach the broker in arrival order.
    pub order_key: Option<Cow<'a, str>>,
    /// The raw body, byte for byte.
    pub body: Bytes,
    /// The body's content type, when it is not JSON.
    pub content_type: Option<Cow<'a, str>>,
    /// The W3C `traceparent`; absent in records of version 1 and older.
    pub traceparent: Option<Cow<'a, str>>,
    /// The W3C `tracestate`, carried with a valid `traceparent`.
    pub tracestate: Option<Cow<'a, str>>,
}

/// The version [`encode`] writes.
pub const VERSION: u8 = 3;
/// The version before the checksum.
const VERSION_2: u8 = 2;
/// Bytes of a version-3 record before its version-2 fields: version and CRC-32.
const CHECKED_HEAD: usize = 5;
/// The version before the trace context.
const VERSION_1: u8 = 1;
/// The first byte of a legacy record whose metadata is under 16 MiB.
const LEGACY: u8 = 0;

/// Why a message cannot be written as a record, or a record cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("the record is empty")]
    Empty,
    #[error(
        "the record is damaged: its bytes have CRC-32 {computed:08x}, {stored:08x} was written"
    )]
    Damaged { stored: u32, computed: u32 },
    #[error("the record is damaged: its version byte reads {0}, and the rest checks as version 3")]
    DamagedVersion(u8),
    #[error(
        "the record is damaged, or of format version {0} unknown to this hookgate: the rest \
         checks as version 3"
    )]
    DamagedOrUnknownVersion(u8),
    #[error("record format version {0} is unknown to this hookgate (written by a newer one?)")]
    UnknownVersion(u8),
    #[error("the record ends inside its {0}")]
    Truncated(&'static str),
    #[error("{0} bytes follow the end of the record")]
    TrailingBytes(usize),
    #[error("the record's {0} is not UTF-8")]
    NotUtf8(&'static str),
    #[error("the record's {field} has presence flag {flag}, not 0 or 1")]
    BadFlag { field: &'static str, flag: u8 },
    #[error("the legacy record's metadata cannot be read: {0}")]
    LegacyMeta(String),
    #[error("the message's {0} is over 4 GiB, more than a record holds")]
    TooLong(&'static str),
}

/// The message as a record of the current version.
pub fn encode(msg: &SpooledMessage<'_>) -> Result<Vec<u8>, RecordError> {
    let texts = [
        &msg.routing_key,
        &msg.message_id,
        &msg.request_id,
        &msg.event_type,
        &msg.route,
    ];
    let size = 1
        + 8
        + 9
        + texts.iter().map(|t| 4 + t.len()).sum::<usize>()
        + 4
        + msg.received_at.len()
        + msg.order_key.as_ref().map_or(1, |k| 5 + k.len())
        + msg.content_type.as_ref().map_or(1, |c| 5 + c.len())
        + msg.traceparent.as_ref().map_or(1, |t| 5 + t.len())
        + msg.tracestate.as_ref().map_or(1, |t| 5 + t.len())
        + 4
        + msg.body.len();
    let mut out = Vec::with_capacity(size);
    out.push(VERSION);
    out.extend_from_slice(&[0; 4]);
    put_bytes(&mut out, "routing key", msg.routing_key.as_bytes())?;
    put_bytes(&mut out, "message id", msg.message_id.as_bytes())?;
    out.extend_from_slice(&msg.timestamp_secs.to_be_bytes());
    put_bytes(&mut out, "request id", msg.request_id.as_bytes())?;
    put_bytes(&mut out, "event type", msg.event_type.as_bytes())?;
    match msg.attempt {
        None => out.push(0),
        Some(n) => {
            out.push(1);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
    put_bytes(&mut out, "route", msg.route.as_bytes())?;
    put_bytes(&mut out, "received-at time", msg.received_at.as_bytes())?;
    put_optional(&mut out, "order key", msg.order_key.as_deref())?;
    put_optional(&mut out, "content type", msg.content_type.as_deref())?;
    put_optional(&mut out, "traceparent", msg.traceparent.as_deref())?;
    put_optional(&mut out, "tracestate", msg.tracestate.as_deref())?;
    put_bytes(&mut out, "body", &msg.body)?;
    let crc = crc32fast::hash(&out[CHECKED_HEAD..]);
    out[1..CHECKED_HEAD].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// The message a record holds, whatever version wrote it.
pub fn decode(record: &[u8]) -> Result<SpooledMessage<'static>, RecordError> {
    let Some(&first) = record.first() else {
        return Err(RecordError::Empty);
    };
    // A record of version 3 whose version byte alone was damaged would otherwise be read
    // as the version that byte names and fail as a short record of it, or as an unknown
    // version: its checksum still matches (a record of another version matches by chance
    // one time in 2^32). A newer format could keep the checksum where version 3 has it,
    // so an unknown version may be either.
    if first != VERSION && checks_as_version_3(record) {
        return Err(match first {
            LEGACY | VERSION_1 | VERSION_2 => RecordError::DamagedVersion(first),
            _ => RecordError::DamagedOrUnknownVersion(first),
        });
    }
    match first {
        LEGACY => decode_legacy(record),
        VERSION_1 | VERSION_2 => decode_versioned(record, first)
            .or_else(|error| decode_legacy(record).map_err(|_| error)),
        VERSION => decode_checked(record).or_else(|error| decode_legacy(record).map_err(|_| error)),
        version => decode_legacy(record).map_err(|_| RecordError::UnknownVersion(version)),
    }
}

/// Whether the bytes after the first carry a version 3 checksum that matches them.
fn checks_as_version_3(record: &[u8]) -> bool {
    match (record.get(1..CHECKED_HEAD), record.get(CHECKED_HEAD..)) {
        (Some(&[a, b, c, d]), Some(rest)) => {
            u32::from_be_bytes([a, b, c, d]) == crc32fast::hash(rest)
        }
        _ => false,
    }
}

/// A record of version 3: its CRC-32 checked, then its fields read as version 2's.
fn decode_checked(record: &[u8]) -> Result<SpooledMessage<'static>, RecordError> {
    let head = record
        .get(..CHECKED_HEAD)
        .ok_or(RecordError::Truncated("checksum"))?;
    let stored = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    let computed = crc32fast::hash(&record[CHECKED_HEAD..]);
    if stored != computed {
        return Err(RecordError::Damaged { stored, computed });
    }
    let mut fields = Vec::with_capacity(record.len() - CHECKED_HEAD + 1);
    fields.push(VERSION_2);
    fields.extend_from_slice(&record[CHECKED_HEAD..]);
    decode_versioned(&fields, VERSION_2)
}

/// A record of version 1 or 2 (`version`, its first byte).
fn decode_versioned(record: &[u8], version: u8) -> Result<SpooledMessage<'static>, RecordError> {
    let mut r = Reader(record);
    r.array::<1>("version")?;
    let routing_key = r.text("routing key")?;
    let message_id = r.text("message id")?;
    let timestamp_secs = u64::from_be_bytes(r.array("timestamp")?);
    let request_id = r.text("request id")?;
    let event_type = r.text("event type")?;
    let attempt = match r.flag("attempt")? {
        false => None,
        true => Some(i64::from_be_bytes(r.array("attempt")?)),
    };
    let route = r.text("route")?;
    let received_at = r.text("received-at time")?;
    let order_key = r.optional_text("order key")?;
    let content_type = r.optional_text("content type")?;
    let (traceparent, tracestate) = if version >= VERSION_2 {
        (
            r.optional_text("traceparent")?,
            r.optional_text("tracestate")?,
        )
    } else {
        (None, None)
    };
    let body = Bytes::copy_from_slice(r.bytes("body")?);
    if !r.0.is_empty() {
        return Err(RecordError::TrailingBytes(r.0.len()));
    }
    Ok(SpooledMessage {
        routing_key: Cow::Owned(routing_key),
        message_id: Cow::Owned(message_id),
        timestamp_secs,
        request_id: Cow::Owned(request_id),
        event_type: Cow::Owned(event_type),
        attempt,
        route: Cow::Owned(route),
        received_at: Cow::Owned(received_at),
        order_key: order_key.map(Cow::Owned),
        body,
        content_type: content_type.map(Cow::Owned),
        traceparent: traceparent.map(Cow::Owned),
        tracestate: tracestate.map(Cow::Owned),
    })
}

/// The metadata of a legacy record. The names are the JSON keys on disk, pinned so that
/// renaming a field here cannot make those records unreadable; keys it does not know are
/// ignored, as they were by the version that wrote them.
#[derive(Deserialize)]
struct LegacyMeta {
    #[serde(rename = "routing_key")]
    routing_key: String,
    #[serde(rename = "message_id")]
    message_id: String,
    #[serde(rename = "timestamp_secs")]
    timestamp_secs: u64,
    #[serde(rename = "request_id")]
    request_id: String,
    #[serde(rename = "event_type")]
    event_type: String,
    #[serde(rename = "attempt", default)]
    attempt: Option<i64>,
    #[serde(rename = "route")]
    route: String,
    #[serde(rename = "received_at")]
    received_at: String,
    #[serde(rename = "order_key", default)]
    order_key: Option<String>,
    #[serde(rename = "content_type", default)]
    content_type: Option<String>,
}

fn decode_legacy(record: &[u8]) -> Result<SpooledMessage<'static>, RecordError> {
    let mut r = Reader(record);
    let meta = r.bytes("legacy metadata")?;
    let meta: LegacyMeta =
        serde_json::from_slice(meta).map_err(|e| RecordError::LegacyMeta(e.to_string()))?;
    Ok(SpooledMessage {
        routing_key: Cow::Owned(meta.routing_key),
        message_id: Cow::Owned(meta.message_id),
        timestamp_secs: meta.timestamp_secs,
        request_id: Cow::Owned(meta.request_id),
        event_type: Cow::Owned(meta.event_type),
        attempt: meta.attempt,
        route: Cow::Owned(meta.route),
        received_at: Cow::Owned(meta.received_at),
        order_key: meta.order_key.map(Cow::Owned),
        body: Bytes::copy_from_slice(r.0),
        content_type: meta.content_type.map(Cow::Owned),
        traceparent: None,
        tracestate: None,
    })
}

fn put_bytes(out: &mut Vec<u8>, field: &'static str, bytes: &[u8]) -> Result<(), RecordError> {
    let len = u32::try_from(bytes.len()).map_err(|_| RecordError::TooLong(field))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

fn put_optional(
    out: &mut Vec<u8>,
    field: &'static str,
    text: Option<&str>,
) -> Result<(), RecordError> {
    match text {
        None => out.push(0),
        Some(text) => {
            out.push(1);
            put_bytes(out, field, text.as_bytes())?;
        }
    }
    Ok(())
}

/// The unread rest of a record.
struct Reader<'r>(&'r [u8]);

impl<'r> Reader<'r> {
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], RecordError> {
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(RecordError::Truncated(field))?;
        self.0 = rest;
        Ok(*head)
    }

    fn bytes(&mut self, field: &'static str) -> Result<&'r [u8], RecordError> {
        let len = u32::from_be_bytes(self.array(field)?);
        let len = usize::try_from(len).map_err(|_| RecordError::Truncated(field))?;
        if self.0.len() < len {
            return Err(RecordError::Truncated(field));
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(head)
    }

    fn text(&mut self, field: &'static str) -> Result<String, RecordError> {
        let bytes = self.bytes(field)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| RecordError::NotUtf8(field))
    }

    fn flag(&mut self, field: &'static str) -> Result<bool, RecordError> {
        match self.array::<1>(field)? {
            [0] => Ok(false),
            [1] => Ok(true),
            [flag] => Err(RecordError::BadFlag { field, flag }),
        }
    }

    fn optional_text(&mut self, field: &'static str) -> Result<Option<String>, RecordError> {
        if self.flag(field)? {
            self.text(field).map(Some)
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message whose record is pinned in `tests/data/spool/record-v2.hex`.
    fn golden() -> SpooledMessage<'static> {
        SpooledMessage {
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            tracestate: Some("congo=t61rcWkgMzE".into()),
            ..golden_v1()
        }
    }

    /// The message whose record is pinned in `tests/data/spool/record-v1.hex`.
    fn golden_v1() -> SpooledMessage<'static> {
        SpooledMessage {
            routing_key: "message.status".into(),
            message_id: "evt_1".into(),
            timestamp_secs: 1_795_946_400,
            request_id: "req_1".into(),
            event_type: "message.status".into(),
            attempt: Some(3),
            route: "botix".into(),
            received_at: "2026-11-29T10:00:00Z".into(),
            order_key: Some("botix\0status\0msg_1".into()),
            body: Bytes::from_static("{\"t\":\"caf\u{e9}\"}".as_bytes()),
            content_type: None,
            traceparent: None,
            tracestate: None,
        }
    }

    /// The bytes of a hex fixture: `#` starts a comment, whitespace is ignored.
    fn hex_fixture(text: &str) -> Vec<u8> {
        let digits: String = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or_default())
            .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
            .collect();
        hex::decode(digits).expect("the fixture is hex")
    }

    #[test]
    fn the_version_3_layout_is_version_2_behind_a_checksum_and_version_2_still_decodes() {
        let v2 = hex_fixture(include_str!("../../../tests/data/spool/record-v2.hex"));
        let v3 = encode(&golden()).expect("encodes");
        assert_eq!(v3[0], 3);
        assert_eq!(
            hex::encode(&v3[CHECKED_HEAD..]),
            hex::encode(&v2[1..]),
            "the record layout changed: old spools would not read back; add a version instead"
        );
        assert_eq!(v3[1..CHECKED_HEAD], crc32fast::hash(&v2[1..]).to_be_bytes());
        assert_eq!(decode(&v2), Ok(golden()));
        assert_eq!(decode(&v3), Ok(golden()));
    }

    #[test]
    fn any_bit_flipped_in_a_record_is_refused_not_read_as_another_message() {
        let record = encode(&golden()).expect("encodes");
        for bit in 0..record.len() * 8 {
            let mut damaged = record.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            let read = decode(&damaged);
            assert!(read.is_err(), "bit {bit} flipped read as {read:?}");
            // The version byte's too: it is reported as damage, not as a record of the
            // version it now names that ends too soon.
            let said = read.map_err(|e| e.to_string()).err().unwrap_or_default();
            assert!(
                said.starts_with("the record is damaged"),
                "bit {bit}: {said}"
            );
        }
    }

    #[test]
    fn a_version_1_record_still_decodes_without_trace_context() {
        let v1 = hex_fixture(include_str!("../../../tests/data/spool/record-v1.hex"));
        assert_eq!(decode(&v1), Ok(golden_v1()));
    }

    #[test]
    fn a_spooled_message_keeps_its_trace_context() {
        let m = golden();
        let back = decode(&encode(&m).expect("encodes")).expect("decodes");
        assert_eq!(
            (back.traceparent, back.tracestate),
            (m.traceparent, m.tracestate)
        );
    }

    #[test]
    fn records_round_trip_with_every_field_absent_or_present() {
        let mut m = golden();
        assert_eq!(decode(&encode(&m).expect("encodes")), Ok(m.clone()));
        m.attempt = None;
        m.order_key = None;
        m.content_type = None;
        m.traceparent = None;
        m.tracestate = None;
        m.body = Bytes::new();
        m.received_at = "".into();
        assert_eq!(decode(&encode(&m).expect("encodes")), Ok(m.clone()));
        m.attempt = Some(i64::MIN);
        m.content_type = Some("application/x-www-form-urlencoded".into());
        m.body = Bytes::from_static(b"\0\xff{not json");
        assert_eq!(decode(&encode(&m).expect("encodes")), Ok(m));
    }

    #[test]
    fn an_unknown_version_is_an_error_naming_it() {
        let mut record = encode(&golden()).expect("encodes");
        record[0] = 9;
        assert_eq!(
            decode(&record),
            Err(RecordError::DamagedOrUnknownVersion(9))
        );
        record[1] ^= 1;
        assert_eq!(decode(&record), Err(RecordError::UnknownVersion(9)));
        assert_eq!(
            decode(b"{\"routing_key\":\"k\"}"),
            Err(RecordError::UnknownVersion(b'{'))
        );
        assert_eq!(decode(b""), Err(RecordError::Empty));
    }

    #[test]
    fn a_truncated_or_extended_record_is_an_error_not_a_shorter_message() {
        let checked = encode(&golden()).expect("encodes");
        for len in 1..checked.len() {
            assert!(decode(&checked[..len]).is_err(), "cut at {len}");
        }
        let record = unchecked(&checked);
        for len in 1..record.len() {
            let error = decode(&record[..len]).expect_err("a cut record must not decode");
            assert!(
                matches!(error, RecordError::Truncated(_)),
                "cut at {len}: {error:?}"
            );
        }
        let mut longer = record.clone();
        longer.push(b'x');
        assert_eq!(decode(&longer), Err(RecordError::TrailingBytes(1)));
    }

    #[test]
    fn damaged_fields_are_errors() {
        let record = unchecked(&encode(&golden()).expect("encodes"));
        // The attempt's flag follows version, routing key, message id, timestamp, request
        // id and event type.
        let flag_at = 1 + (4 + 14) + (4 + 5) + 8 + (4 + 5) + (4 + 14);
        assert_eq!(record[flag_at], 1);
        let mut bad_flag = record.clone();
        bad_flag[flag_at] = 7;
        assert_eq!(
            decode(&bad_flag),
            Err(RecordError::BadFlag {
                field: "attempt",
                flag: 7
            })
        );
        let mut bad_text = record;
        bad_text[1 + 4] = 0xff;
        assert_eq!(decode(&bad_text), Err(RecordError::NotUtf8("routing key")));
    }

    /// The version-2 record of the same fields as version-3 `record`: what its checksum
    /// guards, for the tests of the fields' own checks.
    fn unchecked(record: &[u8]) -> Vec<u8> {
        let mut out = vec![VERSION_2];
        out.extend_from_slice(&record[CHECKED_HEAD..]);
        out
    }

    fn legacy(meta: &str, body: &[u8]) -> Vec<u8> {
        let mut record = u32::try_from(meta.len())
            .expect("short")
            .to_be_bytes()
            .to_vec();
        record.extend_from_slice(meta.as_bytes());
        record.extend_from_slice(body);
        record
    }

    #[test]
    fn legacy_records_decode_with_or_without_the_later_keys() {
        let oldest = legacy(
            r#"{"routing_key":"k","message_id":"e1","timestamp_secs":1,"request_id":"r","event_type":"t","attempt":null,"route":"botix","received_at":""}"#,
            b"{}",
        );
        let m = decode(&oldest).expect("decodes");
        assert_eq!((m.order_key, m.content_type), (None, None));
        assert_eq!(&m.body[..], b"{}");

        let later = legacy(
            r#"{"routing_key":"k","message_id":"e2","timestamp_secs":2,"request_id":"r","event_type":"t","attempt":4,"route":"twilio","received_at":"","order_key":"a\u0000b","content_type":"application/x-www-form-urlencoded","unknown":true}"#,
            b"A=1",
        );
        let m = decode(&later).expect("decodes");
        assert_eq!(m.attempt, Some(4));
        assert_eq!(m.order_key.as_deref(), Some("a\0b"));
        assert_eq!(
            m.content_type.as_deref(),
            Some("application/x-www-form-urlencoded")
        );

        assert!(matches!(
            decode(&legacy("{\"routing_key\":\"k\"}", b"")),
            Err(RecordError::LegacyMeta(_))
        ));
        assert_eq!(
            decode(b"\0\0\0\x09not"),
            Err(RecordError::Truncated("legacy metadata"))
        );
    }

    #[test]
    fn a_legacy_record_with_metadata_of_16_mib_or_more_is_not_taken_for_a_version() {
        let padding = "x".repeat(1 << 24);
        let meta = format!(
            r#"{{"routing_key":"k","message_id":"e1","timestamp_secs":1,"request_id":"{padding}","event_type":"t","attempt":null,"route":"botix","received_at":""}}"#
        );
        let record = legacy(&meta, b"{}");
        assert_eq!(
            record[0], VERSION_1,
            "the length's high byte reads as version 1"
        );
        let m = decode(&record).expect("decodes as legacy");
        assert_eq!(m.request_id.len(), 1 << 24);
    }
}
