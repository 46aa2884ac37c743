//! The checks an event passes before its claim, each final: its routing keys fit an AMQP
//! short string, and it is neither older than the dedup window nor too far in the future.

use crate::config::fits_short_string;
use crate::ingress::event::{Event, ParseError};
use crate::pipeline::event_message::routing_key;
use crate::pipeline::outcome::{FreshnessDrop, Outcome};
use crate::pipeline::route::RouteRuntime;

use super::Pipeline;

impl Pipeline {
    /// The outcome of an event that fails a check before its claim: a routing key that
    /// does not fit, or a time outside the dedup window. `None` for an event that goes on
    /// to be deduplicated, guarded and delivered. A check and not an `async fn` around the
    /// steps after it: each `async fn` a delivery passes through is one more copy of the
    /// futures inside it.
    pub(super) fn refusal(
        &self,
        route: &RouteRuntime,
        event: &Event,
        now_ms: i64,
    ) -> Option<Outcome> {
        if !self.routing_keys_fit(route, event) {
            return Some(Outcome::BadRequest(ParseError::RoutingKeyTooLong));
        }
        let reason = self.freshness(event, now_ms)?;
        Some(Outcome::Dropped {
            event_id: event.id.clone(),
            reason: reason.as_str(),
        })
    }

    /// Whether every routing key the event may be published with (its own, and the drop
    /// copy's) fits an AMQP short string. Checked before anything is recorded, so the
    /// refusal is final and nothing is spooled that could never be sent.
    fn routing_keys_fit(&self, route: &RouteRuntime, event: &Event) -> bool {
        let name = route.config.name.as_str();
        std::iter::once(&self.settings.routing_key)
            .chain(self.settings.dropped_routing_key.as_ref())
            .all(|template| fits_short_string(&routing_key(template, name, &event.event_type)))
    }

    /// An event older than the dedup TTL could be a replay dedup no longer recognises; one
    /// far in the future would outlive its own dedup mark.
    fn freshness(&self, event: &Event, now_ms: i64) -> Option<FreshnessDrop> {
        let ts = event.timestamp_ms?;
        if ts < now_ms - self.settings.ttl.as_millis() as i64 {
            Some(FreshnessDrop::Expired)
        } else if ts > now_ms + self.settings.skew_ms {
            Some(FreshnessDrop::FutureTimestamp)
        } else {
            None
        }
    }
}
