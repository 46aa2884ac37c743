//! The mapping of a [`Message`] onto lapin's properties and headers (contract §5), with the
//! per-publish id its confirm and return are paired by.

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;

use super::publish_error::PublishError;
use crate::ingress::trace::{TRACEPARENT, TRACESTATE};
use crate::outbox::message::{
    fitted_message_id, source, Message, EVENT_ID_HEADER, PUBLISH_ID_HEADER, SOURCE_HEADER,
};

/// A short string, or `None` when `text` is longer than AMQP allows (255 bytes).
pub(super) fn short(text: &str) -> Option<ShortString> {
    ShortString::try_new(text).ok()
}

/// A short string from a constant of this module; the unit test `constants_fit` proves
/// each one fits, so the empty fallback is never sent.
pub(super) fn short_constant(text: &'static str) -> ShortString {
    short(text).unwrap_or_default()
}

/// The properties and headers `msg` is published with (contract §5), `publish_id` in the
/// `x-publish-id` header: unique per publish within this process, so a message the broker
/// returns names the publish it belongs to.
pub fn properties(msg: &Message<'_>, publish_id: u64) -> Result<BasicProperties, PublishError> {
    let mut headers = FieldTable::default();
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    headers.insert(short_constant("x-request-id"), text(&msg.request_id));
    headers.insert(short_constant("x-event-type"), text(&msg.event_type));
    if let Some(n) = msg.attempt {
        headers.insert(
            short_constant("x-delivery-attempt"),
            AMQPValue::LongLongInt(n),
        );
    }
    headers.insert(short_constant("x-route"), text(&msg.route));
    headers.insert(short_constant("x-received-at"), text(&msg.received_at));
    headers.insert(short_constant(SOURCE_HEADER), text(source(msg)));
    if let Some(parent) = &msg.traceparent {
        headers.insert(short_constant(TRACEPARENT), text(parent));
    }
    if let Some(state) = &msg.tracestate {
        headers.insert(short_constant(TRACESTATE), text(state));
    }
    // An id beyond i64 would take 2^63 publishes; wrapping keeps it unique far past that.
    headers.insert(
        short_constant(PUBLISH_ID_HEADER),
        AMQPValue::LongLongInt(publish_id as i64),
    );
    let message_id = match short(&msg.message_id) {
        Some(id) => id,
        None => {
            headers.insert(short_constant(EVENT_ID_HEADER), text(&msg.message_id));
            short(&fitted_message_id(&msg.message_id))
                .ok_or(PublishError::Unfit("the fitted message_id"))?
        }
    };
    Ok(BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type(
            msg.content_type
                .as_deref()
                .and_then(short)
                .unwrap_or_else(|| short_constant("application/json")),
        )
        .with_message_id(message_id)
        .with_timestamp(msg.timestamp_secs)
        .with_app_id(short_constant("hookgate"))
        .with_headers(headers))
}

/// The publish id a returned message carries, if it carries one.
pub(super) fn publish_id(properties: &BasicProperties) -> Option<u64> {
    match properties
        .headers()
        .as_ref()?
        .inner()
        .get(PUBLISH_ID_HEADER)?
    {
        AMQPValue::LongLongInt(n) => Some(*n as u64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str, routing_key: &str) -> Message<'static> {
        crate::outbox::message::sample(id, routing_key)
    }

    #[test]
    fn constants_fit() {
        for c in [
            "x-request-id",
            "x-event-type",
            "x-delivery-attempt",
            "x-route",
            "x-received-at",
            EVENT_ID_HEADER,
            PUBLISH_ID_HEADER,
            SOURCE_HEADER,
            TRACEPARENT,
            TRACESTATE,
            "application/json",
            "hookgate",
            "shutdown",
            "replaced",
            "reconnecting",
        ] {
            assert!(short(c).is_some(), "{c}");
        }
    }

    #[test]
    fn the_publish_id_travels_in_its_header_and_reads_back() {
        for id in [0, 7, u64::MAX] {
            let p = properties(&message("e", "k"), id).expect("fits");
            assert_eq!(publish_id(&p), Some(id));
        }
        assert_eq!(publish_id(&BasicProperties::default()), None);
    }

    #[test]
    fn an_id_that_fits_is_the_message_id_and_a_longer_one_is_fitted_stably() {
        let p = properties(&message(&"a".repeat(255), "k"), 1).expect("fits");
        assert_eq!(p.message_id().as_ref().map(|s| s.as_str().len()), Some(255));
        let headers = p.headers().clone().unwrap_or_default();
        assert!(!headers.inner().contains_key(EVENT_ID_HEADER));

        // Multi-byte characters across the cut must not split.
        let long = format!("{}{}", "é".repeat(100), "x".repeat(200));
        let p = properties(&message(&long, "k"), 1).expect("fitted");
        let id = p.message_id().clone().expect("message_id");
        assert!(id.as_str().len() <= 255, "{}", id.as_str().len());
        assert!(id.as_str().starts_with(&"é".repeat(64)), "{}", id.as_str());
        assert_eq!(id.as_str(), fitted_message_id(&long), "stable");
        assert_ne!(
            fitted_message_id(&long),
            fitted_message_id(&format!("{long}y"))
        );
        let headers = p.headers().clone().unwrap_or_default();
        assert_eq!(
            headers.inner().get(EVENT_ID_HEADER),
            Some(&AMQPValue::LongString(LongString::from(long.as_str())))
        );
        // The largest id hookgate takes fits too.
        assert!(fitted_message_id(&"z".repeat(100_000)).len() <= 255);
    }

    #[test]
    fn a_routing_key_that_does_not_fit_is_unfit_not_a_panic() {
        // The config's limit is the client library's.
        use crate::config::{fits_short_string, AMQP_SHORT_STRING_MAX};
        assert_eq!(AMQP_SHORT_STRING_MAX, lapin::types::MAX_SHORT_STRING_LENGTH);
        assert!(fits_short_string(&"k".repeat(255)));
        assert!(!fits_short_string(&"k".repeat(256)));
        assert!(short(&"k".repeat(256)).is_none());
    }
}
