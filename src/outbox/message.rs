//! The AMQP message as hookgate builds it from an event, and the `message_id` of an event
//! whose id is too long for one. Its mapping onto lapin's properties and headers is in
//! [`super::publish`], the one module that speaks lapin.

use std::borrow::Cow;

use bytes::Bytes;

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

/// One message as contract §5 describes it; also the unit stored in the spool, as a record of
/// its own layout (`durable_spool::record`), so this type's shape is free to change. Its texts
/// borrow from the event and the route where they can (a message read back from the spool
/// owns them), so building one on the request path copies only what it has to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    /// Routing key, templates already applied.
    pub routing_key: Cow<'a, str>,
    /// The event id. It is the `message_id` property when it fits an AMQP short string;
    /// otherwise see [`fitted_message_id`].
    pub message_id: Cow<'a, str>,
    /// Receipt time, Unix seconds (`timestamp` property).
    pub timestamp_secs: u64,
    /// `x-request-id`.
    pub request_id: Cow<'a, str>,
    /// `x-event-type`.
    pub event_type: Cow<'a, str>,
    /// `x-delivery-attempt`, absent when the sender sent none.
    pub attempt: Option<i64>,
    /// `x-route`.
    pub route: Cow<'a, str>,
    /// `x-received-at`, RFC 3339 UTC.
    pub received_at: String,
    /// The event's guard key (a message id's statuses, a contact's messages): events with
    /// the same key reach the broker in arrival order. Not published.
    pub order_key: Option<Cow<'a, str>>,
    /// The raw request body, byte for byte.
    pub body: Bytes,
    /// `content_type` when the body is not JSON (a Twilio form); `application/json` if unset.
    pub content_type: Option<Cow<'a, str>>,
    /// The `traceparent` header (W3C Trace Context); absent only in a message spooled by
    /// a version that did not carry it.
    pub traceparent: Option<Cow<'a, str>>,
    /// The `tracestate` header, when the sender sent one with a valid `traceparent`.
    pub tracestate: Option<Cow<'a, str>>,
}

impl Message<'_> {
    /// `x-source`: which path brought the event.
    pub fn source(&self) -> &'static str {
        Source::of(&self.request_id).as_str()
    }
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
        received_at: String::new(),
        order_key: None,
        body: Bytes::new(),
        content_type: None,
        traceparent: None,
        tracestate: None,
    }
}
