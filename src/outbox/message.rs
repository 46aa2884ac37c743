//! The AMQP message as hookgate builds it from an event, and the `message_id` of an event
//! whose id is too long for one. Its mapping onto lapin's properties and headers is in
//! [`super::publish`], the one module that speaks lapin.

use crate::source::Source;

/// Header naming the path that brought the event ([`Source`]).
pub const SOURCE_HEADER: &str = "x-source";
/// Header carrying the full event id when it is too long for `message_id`.
pub const EVENT_ID_HEADER: &str = "x-event-id";
/// Header carrying the per-publish id: unique for each publish of this process (a retry, a
/// drain and an audit copy each get their own), so a message the broker returns is paired
/// with the publish it came from. Not `message_id`, which repeats across those.
pub const PUBLISH_ID_HEADER: &str = "x-publish-id";
/// Bytes of an oversize id kept readable at the start of its fitted `message_id`.
const FITTED_PREFIX_BYTES: usize = 128;
/// Between the kept prefix and the digest of a fitted `message_id`.
const FITTED_MARK: &str = "~sha256:";

/// One message as contract §5 describes it: the spool's message type
/// ([`durable_spool::record::SpooledMessage`]), so the request path hands the spool what
/// it publishes, with no copy. Its fields map onto the AMQP message as `routing_key`,
/// `message_id` ([`fitted_message_id`] when too long), `timestamp`, and the headers
/// `x-request-id`, `x-event-type`, `x-delivery-attempt`, `x-route`, `x-received-at`,
/// `traceparent` and `tracestate`; `order_key` is not published. Its texts borrow from the
/// event and the route where they can (a message read back from the spool owns them).
pub use durable_spool::record::SpooledMessage as Message;

/// `x-source`: which path brought the event of `msg`.
pub fn source(msg: &Message<'_>) -> &'static str {
    Source::of(&msg.request_id).as_str()
}

/// The `message_id` of an event whose id is too long for one: the id's first bytes (cut
/// at a character boundary), `~sha256:` and the hex SHA-256 of the whole id. The same id
/// always gives the same value, so consumers can still dedup on it; the full id travels
/// in the `x-event-id` header.
pub fn fitted_message_id(id: &str) -> String {
    use sha2::Digest;
    let mut cut = FITTED_PREFIX_BYTES.min(id.len());
    while !id.is_char_boundary(cut) {
        cut -= 1;
    }
    let digest = sha2::Sha256::digest(id.as_bytes());
    format!("{}{FITTED_MARK}{}", &id[..cut], hex::encode(digest))
}

/// A message of the route `botix` with `message_id` and `routing_key` and nothing else
/// set, for the tests of the modules that read messages.
#[cfg(test)]
pub(crate) fn sample(message_id: &str, routing_key: &str) -> Message<'static> {
    Message {
        routing_key: routing_key.to_owned().into(),
        message_id: message_id.to_owned().into(),
        timestamp_secs: 1,
        request_id: "r".into(),
        event_type: "t".into(),
        attempt: None,
        route: "botix".into(),
        received_at: "".into(),
        order_key: None,
        body: bytes::Bytes::new(),
        content_type: None,
        traceparent: None,
        tracestate: None,
    }
}
