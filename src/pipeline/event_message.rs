//! The AMQP message of an event: its routing key and its fields.

use std::borrow::Cow;

use crate::ingress::event::Event;
use crate::outbox::message::Message;

use super::route::RouteRuntime;

/// The AMQP message of `event` on `route`, published with the routing key of `template`.
pub(super) fn message<'e>(
    route: &'e RouteRuntime,
    event: &'e Event,
    template: &str,
    now_ms: i64,
) -> Message<'e> {
    Message {
        routing_key: routing_key(template, &route.config.name, &event.event_type),
        message_id: Cow::Borrowed(&event.id),
        timestamp_secs: (now_ms / 1000).max(0) as u64,
        request_id: Cow::Borrowed(&event.request_id),
        event_type: Cow::Borrowed(&event.event_type),
        attempt: event.attempt,
        route: Cow::Borrowed(&route.config.name),
        received_at: rfc3339(now_ms).into(),
        order_key: None,
        body: event.body.clone(),
        content_type: event.content_type.as_deref().map(Cow::Borrowed),
        traceparent: Some(event.trace.traceparent()),
        tracestate: event.trace.tracestate.as_deref().map(Cow::Borrowed),
    }
}

/// Applies `{route}` and `{event}` to a routing key template.
pub fn routing_key<'e>(template: &str, route: &str, event_type: &'e str) -> Cow<'e, str> {
    if template == "{event}" {
        // The default: the event type itself, without searching the template.
        return Cow::Borrowed(event_type);
    }
    Cow::Owned(
        template
            .replace("{route}", route)
            .replace("{event}", event_type),
    )
}

/// Unix milliseconds as RFC 3339 UTC text (empty if out of range).
pub fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_key_template() {
        assert_eq!(
            routing_key("{route}.{event}", "botix", "message.status"),
            "botix.message.status"
        );
        assert_eq!(routing_key("fixed", "r", "e"), "fixed");
        assert_eq!(routing_key("{event}", "r", "e"), "e");
    }

    #[test]
    fn received_at_is_rfc3339_utc() {
        assert_eq!(rfc3339(1_795_946_403_250), "2026-11-29T10:00:03.25Z");
    }
}
