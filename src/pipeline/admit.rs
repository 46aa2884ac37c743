//! The checks an event passes before its claim, each final: its routing keys fit an AMQP
//! short string, and it is neither older than the dedup window nor too far in the future.

use crate::config::fits_short_string;
use crate::ingress::event::{Event, ParseError};
use crate::pipeline::event_message::routing_key;
use crate::pipeline::outcome::{FreshnessDrop, Outcome};
use crate::pipeline::route::RouteRuntime;
use crate::store_error::StoreError;

use super::Pipeline;

impl Pipeline {
    /// The steps of an event past its signature: its routing keys must fit, it must be
    /// fresh, and then it is deduplicated, guarded and delivered.
    pub(super) async fn admit(
        &self,
        route: &RouteRuntime,
        event: &Event,
        now_ms: i64,
    ) -> Result<Outcome, StoreError> {
        if !self.routing_keys_fit(route, event) {
            return Ok(Outcome::BadRequest(ParseError::RoutingKeyTooLong));
        }
        if let Some(reason) = self.freshness(event, now_ms) {
            return Ok(Outcome::Dropped {
                event_id: event.id.clone(),
                reason: reason.as_str(),
            });
        }
        self.process(route, event, now_ms).await
    }

    /// Whether every routing key the event may be published with (its own, and the drop
    /// copy's) fits an AMQP short string. Checked before anything is recorded, so the
    /// refusal is final and nothing is spooled that could never be sent.
    pub(super) fn routing_keys_fit(&self, route: &RouteRuntime, event: &Event) -> bool {
        let name = route.config.name.as_str();
        std::iter::once(&self.settings.routing_key)
            .chain(self.settings.dropped_routing_key.as_ref())
            .all(|template| fits_short_string(&routing_key(template, name, &event.event_type)))
    }

    /// An event older than the dedup TTL could be a replay dedup no longer recognises; one
    /// far in the future would outlive its own dedup mark.
    pub(super) fn freshness(&self, event: &Event, now_ms: i64) -> Option<FreshnessDrop> {
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
