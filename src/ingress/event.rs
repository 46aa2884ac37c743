//! A delivery as received, the proof that it was verified, and the event read from it.

use crate::source::Source;
use std::borrow::Cow;

use bytes::Bytes;
use http::header::{AsHeaderName, HeaderName};
use http::{HeaderMap, HeaderValue};

use crate::config::{Fields, Profile, Route};
use crate::ingress::fields::{Extracted, Field, FieldPlan, Slot};
use crate::ingress::secrets::Secret;
use crate::ingress::trace::TraceContext;
use crate::providers::{NamedEvent, OwnEvents, Scheme, SignatureError};

/// Event type header of the botix profile.
pub const BOTIX_EVENT: &str = "x-botix-event";
/// Sender's attempt counter.
pub const DELIVERY_ATTEMPT: &str = "x-delivery-attempt";
/// [`DELIVERY_ATTEMPT`] checked when compiled: a lookup by text checks the name first.
const DELIVERY_ATTEMPT_HEADER: HeaderName = HeaderName::from_static(DELIVERY_ATTEMPT);
/// Optional copy of the body's event id.
pub const EVENT_ID: &str = "x-event-id";
/// Optional copy of the body's event type.
pub const EVENT_TYPE: &str = "x-event-type";
/// The type of an inbound message's event (botix), the one deduplicated by message id on
/// a route that reconciles.
pub const INBOUND_EVENT: &str = "message.received";
/// The content type of a form delivery that came without one.
const FORM_CONTENT_TYPE: &str = "application/x-www-form-urlencoded";

/// AMQP caps routing keys at 255 bytes; longer event types cannot be routed.
const MAX_EVENT_TYPE_BYTES: usize = 255;
/// Ids end up in store keys and AMQP headers; a sane bound keeps both small.
const MAX_ID_BYTES: usize = 512;

/// A request as it arrived, not yet authenticated.
#[derive(Debug)]
pub struct Delivery {
    /// Request headers.
    pub headers: HeaderMap,
    /// The raw body, byte for byte.
    pub body: Bytes,
    /// The request URL's query (without `?`), for schemes that sign it (Twilio).
    pub query: Option<String>,
}

/// A delivery whose signature matched an active secret. Only [`Delivery::verify`] makes one,
/// so nothing downstream can see an unauthenticated body.
#[derive(Debug)]
pub struct Verified(Delivery);

impl Delivery {
    /// Checks the signature; the only way to a [`Verified`] delivery.
    pub fn verify(
        self,
        scheme: &Scheme,
        secrets: &[Secret],
        now_secs: i64,
    ) -> Result<Verified, SignatureError> {
        scheme.verify_request(
            &self.headers,
            self.query.as_deref(),
            &self.body,
            secrets,
            now_secs,
        )?;
        Ok(Verified(self))
    }
}

/// Why a verified body is not a usable event; the text is safe to send to the sender.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("body is not a JSON object")]
    NotAnObject,
    #[error("event has no id")]
    NoEventId,
    #[error("event id is too long")]
    IdTooLong,
    #[error("event type is too long")]
    TypeTooLong,
    /// The routing key made from the route's template and the event type would be longer
    /// than AMQP allows (255 bytes).
    #[error("routing key made from the event type is too long")]
    RoutingKeyTooLong,
    #[error("timestamp is not RFC 3339 or a Unix time")]
    BadTimestamp,
}

/// One event, ready for freshness, dedup, guard and publish.
#[derive(Debug, Clone)]
pub struct Event {
    /// Event id: stable across retries and re-sends.
    pub id: String,
    /// Event type, e.g. `message.status`.
    pub event_type: String,
    /// Event time in Unix milliseconds, if the body has one.
    pub timestamp_ms: Option<i64>,
    /// Id of this delivery attempt; generated when the sender sent none.
    pub request_id: String,
    /// Whether `request_id` came from the sender (only then it is a dedup key).
    pub request_id_from_sender: bool,
    /// The sender's attempt counter, if sent.
    pub attempt: Option<i64>,
    /// The raw body.
    pub body: Bytes,
    /// The values of the route's pointers, for the guard.
    pub fields: Extracted,
    /// The body's content type when the sender names its events itself (a Twilio form),
    /// published with it.
    pub content_type: Option<String>,
    /// The W3C trace context it is published with: the sender's, or a new one.
    pub trace: TraceContext,
}

impl Event {
    /// The text at a pointer added to the route's [`EventFields`], if present (numbers are
    /// turned into text).
    pub fn field(&self, slot: Slot) -> Option<Cow<'_, str>> {
        self.fields.get(slot)?.text()
    }
}

/// What a route reads from its events' bodies: the id, type and time (config `fields`), and
/// the pointers the guard adds.
#[derive(Debug, Clone)]
pub struct EventFields {
    plan: FieldPlan,
    event_id: Slot,
    event_type: Slot,
    timestamp: Slot,
    /// Whether `X-Event-Id`, `X-Botix-Event` and `X-Event-Type` stand in for a missing id or
    /// type (config `fields.unsigned_header_fallbacks`).
    header_fallbacks: bool,
    /// Set for a sender that names its events itself (Twilio), not by `fields`.
    own: Option<OwnFields>,
    /// Set for a route that reconciles: where an inbound event's message id is, the key
    /// that makes the webhook's event and reconciliation's of one message the same.
    message_id: Option<Slot>,
}

/// How a sender that names its events itself does it, and where its fields are read.
#[derive(Debug, Clone)]
struct OwnFields {
    events: OwnEvents,
    /// The slots of `events.pointers`, in their order.
    slots: Vec<Slot>,
}

impl EventFields {
    /// Starts with a route's `fields`.
    pub fn new(fields: &Fields) -> Self {
        let mut plan = FieldPlan::default();
        Self {
            event_id: plan.add(&fields.event_id),
            event_type: plan.add(&fields.event_type),
            timestamp: plan.add(&fields.timestamp),
            header_fallbacks: fields.unsigned_header_fallbacks,
            plan,
            own: None,
            message_id: None,
        }
    }

    /// What a route reads: its `fields`, or the fields its sender names its events by.
    pub fn for_route(route: &Route) -> Self {
        let mut fields = Self::new(route.fields.as_ref().unwrap_or(&Fields::default()));
        if let Some(events) = route.profile.sender().own_events() {
            let slots = events.pointers.iter().map(|p| fields.plan.add(p)).collect();
            fields.own = Some(OwnFields { events, slots });
        }
        if route.reconcile.is_some() {
            let default_fields = Fields::default();
            let pointer = &route.fields.as_ref().unwrap_or(&default_fields).message_id;
            fields.message_id = Some(fields.plan.add(pointer));
        }
        fields
    }

    /// The message id an inbound (`message.received`) event is about, on a route that
    /// reconciles; dedup keys such an event by it, whichever path brought it.
    pub fn inbound_message_id<'e>(&self, event: &'e Event) -> Option<Cow<'e, str>> {
        if event.event_type != INBOUND_EVENT {
            return None;
        }
        event.field(self.message_id?).filter(|id| !id.is_empty())
    }

    /// Also reads `pointer`; [`Event::field`] finds its value under the returned slot.
    pub fn add(&mut self, pointer: &str) -> Slot {
        self.plan.add(pointer)
    }
}

/// The id of one delivery attempt, read once per request: the sender's (the header its
/// profile names, `X-Botix-Request-Id` for botix) or a generated UUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId {
    /// The id echoed in `X-Request-Id` and sent as `x-request-id`.
    pub value: String,
    /// Whether the sender sent it (only then it is a dedup key and an event-id fallback).
    pub from_sender: bool,
    /// The sender's header, when it holds `value` byte for byte: echoed as it came.
    header: Option<HeaderValue>,
}

impl RequestId {
    /// The delivery's request id header for `profile`, or a generated id.
    pub fn of(headers: &HeaderMap, profile: Profile) -> Self {
        let Some(name) = profile.sender().request_id_header() else {
            return Self::generated();
        };
        // A sender's id that looks like reconciliation's or a replay's would make its
        // message say `x-source: reconcile` or `replay`; it is replaced like a missing one.
        let usable = |v: &&str| v.len() <= MAX_ID_BYTES && Source::of(v) == Source::Webhook;
        let header = headers.get(name);
        match header.and_then(visible_text).filter(usable) {
            Some(value) => Self {
                value: value.to_owned(),
                from_sender: true,
                header: header.filter(|h| h.as_bytes() == value.as_bytes()).cloned(),
            },
            None => Self::generated(),
        }
    }

    /// A fresh id for a delivery that came without one.
    pub fn generated() -> Self {
        Self::made(uuid::Uuid::new_v4().to_string())
    }

    /// An id the gateway made (a reconciliation walk's, a replay's).
    fn made(value: String) -> Self {
        Self {
            value,
            from_sender: false,
            header: None,
        }
    }

    /// The id as `X-Request-Id` echoes it: the sender's header itself when it is the id (a
    /// clone of its bytes' handle, not a copy), else a header made of the id.
    pub fn echo(&self) -> Option<HeaderValue> {
        self.header
            .clone()
            .or_else(|| HeaderValue::from_str(&self.value).ok())
    }
}

/// Reads the event out of a message the sender's list API gave (reconciliation), laid out
/// in the webhook's shape. The API answered over TLS to a request made with the route's
/// key, which authenticates it as a signature authenticates a delivery; it has no request
/// id from the sender, so `request_id` is the walk's.
pub fn parse_listed(
    body: Bytes,
    fields: &EventFields,
    request_id: String,
) -> Result<Event, ParseError> {
    let verified = Verified(Delivery {
        headers: HeaderMap::new(),
        body,
        query: None,
    });
    parse(
        verified,
        fields,
        RequestId::made(request_id),
        // No request brought it: a new trace, which its consumers can continue.
        TraceContext::new_root(),
    )
}

/// Reads the event out of a verified delivery.
pub fn parse(
    verified: Verified,
    fields: &EventFields,
    request_id: RequestId,
    trace: TraceContext,
) -> Result<Event, ParseError> {
    if let Some(own) = &fields.own {
        return parse_own(verified, fields, own, request_id, trace);
    }
    let Verified(delivery) = verified;
    let mut found = fields
        .plan
        .extract(&delivery.body)
        .map_err(|_| ParseError::NotAnObject)?;
    let headers = &delivery.headers;
    // The id and the type are moved out of their slots unless another pointer reads the
    // same slot (the guard's, say): nothing else reads them afterwards.
    let mut text = |slot| {
        if fields.plan.is_shared(slot) {
            found.get(slot).and_then(Field::text).map(Cow::into_owned)
        } else {
            found.take_text(slot)
        }
    };
    // Headers the signature does not cover are read only where the route opted in.
    let unsigned = |name| {
        fields
            .header_fallbacks
            .then(|| header_text(headers, name))
            .flatten()
            .map(str::to_owned)
    };
    let id = text(fields.event_id)
        .or_else(|| unsigned(EVENT_ID))
        .or_else(|| request_id.from_sender.then(|| request_id.value.clone()))
        .filter(|s| !s.is_empty())
        .ok_or(ParseError::NoEventId)?;
    if id.len() > MAX_ID_BYTES {
        return Err(ParseError::IdTooLong);
    }
    let event_type = text(fields.event_type)
        .or_else(|| unsigned(BOTIX_EVENT))
        .or_else(|| unsigned(EVENT_TYPE))
        .unwrap_or_else(|| "unknown".to_owned());
    if event_type.len() > MAX_EVENT_TYPE_BYTES {
        return Err(ParseError::TypeTooLong);
    }
    let timestamp_ms = match found.get(fields.timestamp) {
        None | Some(Field::Null) => None,
        Some(v) => Some(parse_timestamp(v).ok_or(ParseError::BadTimestamp)?),
    };
    let attempt = header_text(headers, &DELIVERY_ATTEMPT_HEADER).and_then(|v| v.parse().ok());
    Ok(Event {
        id,
        event_type,
        timestamp_ms,
        request_id: request_id.value,
        request_id_from_sender: request_id.from_sender,
        attempt,
        body: delivery.body,
        fields: found,
        content_type: None,
        trace,
    })
}

/// Reads the delivery of a sender that names its events itself (Twilio): its body is a form,
/// or JSON when its content type says so, and the sender makes the event's id and type of
/// the fields it names; without an id, the sender's request id stands in.
fn parse_own(
    verified: Verified,
    fields: &EventFields,
    own: &OwnFields,
    request_id: RequestId,
    trace: TraceContext,
) -> Result<Event, ParseError> {
    let Verified(delivery) = verified;
    let content_type = header_text(&delivery.headers, http::header::CONTENT_TYPE.as_str());
    let json = content_type.is_some_and(|t| t.to_ascii_lowercase().starts_with("application/json"));
    let found = if json {
        fields
            .plan
            .extract(&delivery.body)
            .map_err(|_| ParseError::NotAnObject)?
    } else {
        fields.plan.extract_form(&delivery.body)
    };
    let values: Vec<Option<Cow<'_, str>>> = own
        .slots
        .iter()
        .map(|slot| {
            found
                .get(*slot)
                .and_then(Field::text)
                .filter(|s| !s.is_empty())
        })
        .collect();
    let values: Vec<Option<&str>> = values.iter().map(Option::as_deref).collect();
    let NamedEvent { id, event_type } = (own.events.name)(&values);
    let id = id
        .or_else(|| request_id.from_sender.then(|| request_id.value.clone()))
        .ok_or(ParseError::NoEventId)?;
    if id.len() > MAX_ID_BYTES {
        return Err(ParseError::IdTooLong);
    }
    // A content type is an AMQP short string; one that cannot be one is replaced.
    let content_type = content_type
        .filter(|t| t.len() <= 255 && t.is_ascii())
        .unwrap_or(FORM_CONTENT_TYPE)
        .to_owned();
    Ok(Event {
        id,
        event_type: event_type.to_owned(),
        timestamp_ms: None,
        request_id: request_id.value,
        request_id_from_sender: request_id.from_sender,
        attempt: None,
        body: delivery.body,
        fields: found,
        content_type: Some(content_type),
        trace,
    })
}

/// Unix milliseconds from RFC 3339 text, or a number of Unix seconds or milliseconds.
pub fn parse_timestamp(value: Field<'_>) -> Option<i64> {
    match value {
        Field::Number(n) => unix_number_ms(n.as_f64()?),
        Field::Text(s) => {
            let t = s.trim();
            if let Ok(n) = t.parse::<f64>() {
                return unix_number_ms(n);
            }
            let dt = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                .ok()?;
            i64::try_from(dt.unix_timestamp_nanos() / 1_000_000).ok()
        }
        Field::Null | Field::Other => None,
    }
}

/// Unix milliseconds from a number of seconds or milliseconds. Seconds since 1970 stay below
/// 1e11 until the year 5138; milliseconds are above it for any date after 1973, so the
/// magnitude tells the unit.
fn unix_number_ms(f: f64) -> Option<i64> {
    if !f.is_finite() {
        None
    } else if f.abs() >= 1e11 {
        Some(f as i64)
    } else {
        Some((f * 1000.0) as i64)
    }
}

/// A header's text, trimmed; `None` when it is missing, empty or not visible ASCII.
fn header_text(headers: &HeaderMap, name: impl AsHeaderName) -> Option<&str> {
    headers.get(name).and_then(visible_text)
}

/// A header value as trimmed text; `None` when it is empty or not visible ASCII.
fn visible_text(value: &HeaderValue) -> Option<&str> {
    value.to_str().ok().map(str::trim).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::{BOTIX_REQUEST_ID as REQUEST_ID, TWILIO_IDEMPOTENCY_TOKEN};

    fn verified(body: &str, headers: &[(&'static str, &str)]) -> Verified {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, HeaderValue::from_str(v).expect("value"));
        }
        Verified(Delivery {
            headers: h,
            body: Bytes::copy_from_slice(body.as_bytes()),
            query: None,
        })
    }

    fn parse_one(body: &str, headers: &[(&'static str, &str)]) -> Result<Event, ParseError> {
        parse_with(&Fields::default(), body, headers)
    }

    fn parse_with(
        fields: &Fields,
        body: &str,
        headers: &[(&'static str, &str)],
    ) -> Result<Event, ParseError> {
        let v = verified(body, headers);
        let mut request_id = RequestId::of(&v.0.headers, Profile::Botix);
        if !request_id.from_sender {
            request_id.value = "gen".into();
        }
        parse(
            v,
            &EventFields::new(fields),
            request_id,
            TraceContext::new_root(),
        )
    }

    #[test]
    fn a_senders_request_id_that_looks_like_reconciliations_or_a_replays_is_replaced() {
        for taken in ["reconcile:botix:1", "replay:botix:1"] {
            let v = verified("{}", &[(REQUEST_ID, taken)]);
            let id = RequestId::of(&v.0.headers, Profile::Botix);
            assert!(!id.from_sender, "{taken}");
            assert_ne!(id.value, taken);
        }
        let v = verified("{}", &[(REQUEST_ID, "req_replay:1")]);
        assert!(RequestId::of(&v.0.headers, Profile::Botix).from_sender);
    }

    #[test]
    fn the_echo_is_the_senders_header_as_it_came_or_the_id_it_was_read_as() {
        let v = verified("{}", &[(REQUEST_ID, "req_01")]);
        let sent = RequestId::of(&v.0.headers, Profile::Botix);
        assert_eq!(sent.echo(), v.0.headers.get(REQUEST_ID).cloned());
        let v = verified("{}", &[(REQUEST_ID, "  req_02 ")]);
        let padded = RequestId::of(&v.0.headers, Profile::Botix);
        assert_eq!(padded.value, "req_02");
        assert_eq!(padded.echo(), Some(HeaderValue::from_static("req_02")));
        let made = RequestId::generated();
        let echo = made.echo().expect("a generated id is header text");
        assert_eq!(echo.to_str().ok(), Some(made.value.as_str()));
    }

    #[test]
    fn an_id_and_type_another_pointer_reads_too_stay_in_their_slots() {
        let mut fields = EventFields::new(&Fields::default());
        let id_again = fields.add(&Fields::default().event_id);
        let body = r#"{"id":"e9","event":"message.status"}"#;
        let v = verified(body, &[]);
        let request_id = RequestId::generated();
        let e = parse(v, &fields, request_id, TraceContext::new_root()).expect("ok");
        assert_eq!(
            (e.id.as_str(), e.event_type.as_str()),
            ("e9", "message.status")
        );
        assert_eq!(e.field(id_again).as_deref(), Some("e9"));
    }

    fn twilio_fields() -> EventFields {
        let yaml = "listen:\n  addr: 127.0.0.1:0\nroutes:\n  - name: t\n    path: /t\n    profile: twilio\n    public_url: https://h.example/t\n    secrets: [{secret: x}]\n";
        let config = crate::config::Config::parse(yaml).expect("config");
        EventFields::for_route(&config.routes[0])
    }

    fn parse_twilio_body(
        body: &str,
        headers: &[(&'static str, &str)],
    ) -> Result<Event, ParseError> {
        let v = verified(body, headers);
        let request_id = RequestId::of(&v.0.headers, Profile::Twilio);
        parse(v, &twilio_fields(), request_id, TraceContext::new_root())
    }

    #[test]
    fn twilio_status_callbacks_are_keyed_by_message_and_status() {
        let body = "SmsSid=SM1&SmsStatus=delivered&MessageStatus=delivered&To=%2B1555&MessageSid=SM1&From=%2B1666";
        let e = parse_twilio_body(
            body,
            &[(
                "content-type",
                "application/x-www-form-urlencoded; charset=utf-8",
            )],
        )
        .expect("parses");
        assert_eq!(e.id, "SM1:delivered");
        assert_eq!(e.event_type, "message.status");
        assert_eq!(e.timestamp_ms, None);
        assert!(!e.request_id_from_sender);
        assert_eq!(e.body.as_ref(), body.as_bytes(), "the raw form, untouched");
        assert_eq!(
            e.content_type.as_deref(),
            Some("application/x-www-form-urlencoded; charset=utf-8")
        );
        let e = parse_twilio_body(
            "MessageSid=SM2&Body=STOP&From=%2B1666&To=%2B1555",
            &[(TWILIO_IDEMPOTENCY_TOKEN, "tok-1")],
        )
        .expect("inbound");
        assert_eq!(
            (e.id.as_str(), e.event_type.as_str()),
            ("SM2", "message.received")
        );
        assert_eq!(e.request_id, "tok-1");
        assert!(
            e.request_id_from_sender,
            "the idempotency token is a dedup key"
        );
        assert_eq!(
            e.content_type.as_deref(),
            Some("application/x-www-form-urlencoded"),
            "a form without a content type"
        );
        let e = parse_twilio_body("SmsSid=SM3&MessageStatus=sent", &[]).expect("SmsSid");
        assert_eq!(e.id, "SM3:sent");
        assert_eq!(
            parse_twilio_body("Body=hello", &[]).err(),
            Some(ParseError::NoEventId)
        );
        let e = parse_twilio_body(
            r#"{"MessageSid":"SM4","MessageStatus":"read"}"#,
            &[("content-type", "application/json")],
        )
        .expect("json");
        assert_eq!(e.id, "SM4:read");
        assert_eq!(e.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            parse_twilio_body("[1]", &[("content-type", "application/json")]).err(),
            Some(ParseError::NotAnObject)
        );
    }

    #[test]
    fn reads_id_type_timestamp_and_headers() {
        let e = parse_one(
            r#"{"id":"evt_1","event":"message.status","timestamp":"2026-11-29T10:00:03.250Z"}"#,
            &[(REQUEST_ID, "req_1"), (DELIVERY_ATTEMPT, "3")],
        )
        .expect("parses");
        assert_eq!(e.id, "evt_1");
        assert_eq!(e.event_type, "message.status");
        assert_eq!(e.timestamp_ms, Some(1_795_946_403_250));
        assert_eq!(e.request_id, "req_1");
        assert!(e.request_id_from_sender);
        assert_eq!(e.attempt, Some(3));
    }

    #[test]
    fn unsigned_headers_stand_in_only_where_the_route_opted_in() {
        let headers = [
            (EVENT_ID, "h1"),
            (BOTIX_EVENT, "message.status"),
            (EVENT_TYPE, "other"),
        ];
        let e = parse_one("{}", &headers).err();
        assert_eq!(e, Some(ParseError::NoEventId), "X-Event-Id is not signed");
        let e = parse_one(r#"{"id":"b1"}"#, &headers).expect("ok");
        assert_eq!(e.event_type, "unknown", "X-Botix-Event is not signed");
        let opted_in = Fields {
            unsigned_header_fallbacks: true,
            ..Fields::default()
        };
        let e = parse_with(&opted_in, "{}", &headers).expect("ok");
        assert_eq!(
            (e.id.as_str(), e.event_type.as_str()),
            ("h1", "message.status")
        );
        let e = parse_with(&opted_in, r#"{"id":"b1"}"#, &[(EVENT_TYPE, "t")]).expect("ok");
        assert_eq!(e.event_type, "t");
        // The body wins over the headers.
        let e = parse_with(&opted_in, r#"{"id":"b1","event":"x"}"#, &headers).expect("ok");
        assert_eq!((e.id.as_str(), e.event_type.as_str()), ("b1", "x"));
    }

    #[test]
    fn id_falls_back_to_the_request_id_then_fails() {
        let e = parse_one(r#"{"event":"x"}"#, &[(EVENT_ID, "h1"), (REQUEST_ID, "r")]).expect("ok");
        assert_eq!(e.id, "r");
        let e = parse_one(r#"{"event":"x"}"#, &[(REQUEST_ID, "r")]).expect("ok");
        assert_eq!(e.id, "r");
        assert_eq!(
            parse_one(r#"{"event":"x"}"#, &[]).err(),
            Some(ParseError::NoEventId)
        );
        let e = parse_one(r#"{"id":42}"#, &[]).expect("numeric id");
        assert_eq!((e.id.as_str(), e.request_id.as_str()), ("42", "gen"));
        assert!(!e.request_id_from_sender);
    }

    #[test]
    fn non_objects_and_deep_nesting_are_rejected() {
        for body in [
            "[1]",
            "\"s\"",
            "not json",
            "",
            "{\"id\":",
            &"[".repeat(10_000),
        ] {
            assert_eq!(
                parse_one(body, &[]).err(),
                Some(ParseError::NotAnObject),
                "{body:.20}"
            );
        }
    }

    #[test]
    fn timestamps_in_every_supported_form() {
        let (secs, millis) = (1_764_410_400_i64.into(), 1_764_410_400_123_i64.into());
        let text = |s: &'static str| Field::Text(s);
        assert_eq!(
            parse_timestamp(Field::Number(&secs)),
            Some(1_764_410_400_000)
        );
        assert_eq!(
            parse_timestamp(Field::Number(&millis)),
            Some(1_764_410_400_123)
        );
        assert_eq!(
            parse_timestamp(text(" 1764410400.5 ")),
            Some(1_764_410_400_500)
        );
        assert_eq!(
            parse_timestamp(text("2026-11-29T10:01:00Z")),
            Some(1_795_946_460_000)
        );
        assert_eq!(
            parse_timestamp(text("2026-11-29T11:01:00+01:00")),
            Some(1_795_946_460_000)
        );
        assert_eq!(parse_timestamp(text("yesterday")), None);
        assert_eq!(parse_timestamp(text("inf")), None);
        assert_eq!(parse_timestamp(Field::Other), None);
        assert_eq!(
            parse_one(r#"{"id":"a","timestamp":"soon"}"#, &[]).err(),
            Some(ParseError::BadTimestamp)
        );
    }

    #[test]
    fn a_pointer_the_guard_adds_is_read_as_text() {
        let mut fields = EventFields::new(&Fields::default());
        let status = fields.add("/data/status");
        let count = fields.add("/data/count");
        let absent = fields.add("/data/absent");
        let v = verified(
            r#"{"id":"e1","data":{"status":"delivered","count":7}}"#,
            &[],
        );
        let e =
            parse(v, &fields, RequestId::generated(), TraceContext::new_root()).expect("parses");
        assert_eq!(e.field(status).as_deref(), Some("delivered"));
        assert_eq!(e.field(count).as_deref(), Some("7"), "a number as text");
        assert_eq!(e.field(absent), None);
    }

    #[test]
    fn ids_and_types_up_to_their_limits_are_read_and_longer_ones_refused() {
        let body = |id: &str, event_type: &str| {
            serde_json::json!({"id": id, "event": event_type}).to_string()
        };
        let read = |id: &str, event_type: &str| {
            parse_one(&body(id, event_type), &[]).map(|e| (e.id.len(), e.event_type.len()))
        };
        let (id, event_type) = ("i".repeat(MAX_ID_BYTES), "t".repeat(MAX_EVENT_TYPE_BYTES));
        assert_eq!(read(&id, &event_type), Ok((512, 255)));
        assert_eq!(read(&(id + "i"), "t"), Err(ParseError::IdTooLong));
        assert_eq!(read("e", &(event_type + "t")), Err(ParseError::TypeTooLong));
    }

    #[test]
    fn twilio_ids_fall_back_to_the_idempotency_token_and_are_bounded() {
        let e = parse_twilio_body("Body=hello", &[(TWILIO_IDEMPOTENCY_TOKEN, "tok-9")])
            .expect("the token stands in");
        assert_eq!((e.id.as_str(), e.request_id.as_str()), ("tok-9", "tok-9"));
        let sid = "S".repeat(MAX_ID_BYTES);
        let e = parse_twilio_body(&format!("MessageSid={sid}"), &[]).expect("512 bytes");
        assert_eq!(e.id, sid);
        assert_eq!(
            parse_twilio_body(&format!("MessageSid={sid}S"), &[]).err(),
            Some(ParseError::IdTooLong)
        );
    }

    #[test]
    fn a_twilio_content_type_that_cannot_be_an_amqp_short_string_is_replaced() {
        let content_type = |value: &str| {
            parse_twilio_body("MessageSid=SM1", &[("content-type", value)])
                .expect("parses")
                .content_type
        };
        let longest = format!("application/x-www-form-urlencoded; x={}", "a".repeat(218));
        assert_eq!(longest.len(), 255);
        assert_eq!(content_type(&longest), Some(longest.clone()));
        assert_eq!(
            content_type(&(longest + "a")).as_deref(),
            Some(FORM_CONTENT_TYPE)
        );
    }
}
