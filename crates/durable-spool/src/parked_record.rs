//! The record an entry is parked in: why and when, then the entry as it was; and the
//! listing of one for an operator.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::record;

/// Version byte of a parked record.
const PARKED_V1: u8 = 1;

/// One parked entry, as `hookgate spool parked` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParkedEntry {
    /// The id to name it by in `republish` and `delete`.
    pub id: u64,
    /// When it was parked, Unix seconds.
    pub parked_at_secs: u64,
    /// Why.
    pub reason: String,
    /// Its event id, when the entry can be decoded.
    pub event_id: Option<String>,
    /// Its routing key, when the entry can be decoded.
    pub routing_key: Option<String>,
    /// Its route, when the entry can be decoded.
    pub route: Option<String>,
    /// Size of the entry in bytes.
    pub bytes: u64,
}

/// Now, in Unix seconds: when an entry is parked.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Parked record: version byte, parked-at (u64 big-endian Unix seconds), reason length
/// (u16 big-endian), reason (UTF-8), then the entry as it was.
pub(crate) fn encode_parked(reason: &str, parked_at: u64, entry: &[u8]) -> Vec<u8> {
    let mut end = reason.len().min(u16::MAX as usize);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let reason = &reason.as_bytes()[..end];
    let mut out = Vec::with_capacity(11 + reason.len() + entry.len());
    out.push(PARKED_V1);
    out.extend_from_slice(&parked_at.to_be_bytes());
    out.extend_from_slice(&(reason.len() as u16).to_be_bytes());
    out.extend_from_slice(reason);
    out.extend_from_slice(entry);
    out
}

pub(crate) fn decode_parked(record: &[u8]) -> Option<(u64, String, &[u8])> {
    if *record.first()? != PARKED_V1 {
        return None;
    }
    let parked_at = u64::from_be_bytes(record.get(1..9)?.try_into().ok()?);
    let len = u16::from_be_bytes(record.get(9..11)?.try_into().ok()?) as usize;
    let reason = String::from_utf8_lossy(record.get(11..11 + len)?).into_owned();
    Some((parked_at, reason, record.get(11 + len..)?))
}

pub(crate) fn describe_parked(id: u64, parked: &[u8]) -> ParkedEntry {
    let (parked_at_secs, reason, entry) = decode_parked(parked).unwrap_or((
        0,
        "the parked record cannot be decoded".to_owned(),
        parked,
    ));
    let msg = record::decode(entry).ok();
    ParkedEntry {
        id,
        parked_at_secs,
        reason,
        event_id: msg.as_ref().map(|m| m.message_id.to_string()),
        routing_key: msg.as_ref().map(|m| m.routing_key.to_string()),
        route: msg.as_ref().map(|m| m.route.to_string()),
        bytes: entry.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_records_round_trip() {
        let record = encode_parked("why", 7, b"entry");
        assert_eq!(
            decode_parked(&record),
            Some((7, "why".to_owned(), &b"entry"[..]))
        );
        assert_eq!(decode_parked(b"\x02rest"), None);
        let listed = describe_parked(5, &record);
        assert_eq!(listed.id, 5);
        assert_eq!(listed.event_id, None, "the entry itself is not decodable");
    }
}
