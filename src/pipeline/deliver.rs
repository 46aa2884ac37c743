//! An event the guard has judged, delivered: the leases secured, the publish (or spool)
//! and the guard's commit; or the guard's drop and its audit copy.

use std::borrow::Cow;

use crate::guard::{Check, Held};
use crate::ingress::event::Event;
use crate::outbox::spooling::SpoolError;
use crate::outbox::Delivered;
use crate::pipeline::event_message::message;
use crate::pipeline::outcome::Outcome;
use crate::pipeline::route::RouteRuntime;
use crate::state::keys::StoreKey;
use crate::store_error::StoreError;

use super::Pipeline;

impl Pipeline {
    /// Publishes (or spools) an event the guard accepted and commits its check, or answers
    /// the guard's drop; with how an accepted event went out. Before the publish, the
    /// leases it goes out under (`claims`, the claims their token holds, and the guard key's
    /// lock) are secured against a failover ([`StateStore::secure`]). A request that reaches
    /// its publish too late to finish within its leases (a stalled process) publishes
    /// nothing and answers 503.
    ///
    /// [`StateStore::secure`]: crate::state::StateStore::secure
    pub(super) async fn deliver_checked(
        &self,
        route: &RouteRuntime,
        event: &Event,
        check: Check,
        now_ms: i64,
        (claims, token, began): (&[&StoreKey], u64, tokio::time::Instant),
    ) -> Result<(Outcome, Option<Delivered>), Failure> {
        let name = route.config.name.as_str();
        let held = match check {
            Check::Drop(reason) => {
                self.publish_drop_copy(route, event, now_ms).await;
                let outcome = Outcome::Dropped {
                    event_id: event.id.clone(),
                    reason: reason.as_str(),
                };
                return Ok((outcome, None));
            }
            Check::Accept(held) => Some(held),
            Check::Unguarded => None,
        };
        let renewing = tokio::time::Instant::now();
        let secured = self
            .state
            .secure(claims, token, held.as_ref().map(|h| h.lock()))
            .await
            .and_then(|renewed| {
                let since = if renewed { renewing } else { began };
                if since.elapsed() > self.settings.publish_by {
                    return Err(StoreError::LeaseLost(
                        "the request reached its publish too late to finish within its lease (a stalled process?); nothing was published",
                    ));
                }
                Ok(())
            });
        if let Err(error) = secured {
            if let Some(held) = held {
                self.guards.abandon(held).await;
            }
            return Err(Failure::before(error));
        }
        let mut msg = message(route, event, &self.settings.routing_key, now_ms);
        // A held check's key is the order key already; it is made anew only otherwise.
        msg.order_key = match held.as_ref().and_then(Held::key_text) {
            Some(key) => Some(Cow::Borrowed(key)),
            None => route.guard.order_key(name, event).map(Cow::Owned),
        };
        match self.outbox.deliver(&msg).await {
            Ok(how) => {
                if let Some(held) = held {
                    self.guards
                        .commit(held, now_ms)
                        .await
                        .map_err(|error| Failure {
                            error,
                            left: Some(how),
                        })?;
                }
                if matches!(how, Delivered::Spooled | Delivered::Held) {
                    tracing::debug!(route = name, event_id = %event.id, "event spooled");
                }
                let outcome = Outcome::Accepted {
                    event_id: event.id.clone(),
                };
                Ok((outcome, Some(how)))
            }
            Err(error) => {
                if let Some(held) = held {
                    self.guards.abandon(held).await;
                }
                let SpoolError::Store(error) = error else {
                    return Ok((self.unavailable(name, event, error), None));
                };
                Err(Failure::before(error.into()))
            }
        }
    }

    fn unavailable(&self, name: &str, event: &Event, error: SpoolError) -> Outcome {
        tracing::warn!(route = name, event_id = %event.id, %error, "event not accepted; answering 503");
        Outcome::Unavailable {
            retry_after: crate::outbox::spooling::retry_after_secs(&error),
        }
    }

    /// The audit copy of a dropped event, when the config names a key for it.
    async fn publish_drop_copy(&self, route: &RouteRuntime, event: &Event, now_ms: i64) {
        if let Some(template) = &self.settings.dropped_routing_key {
            let msg = message(route, event, template, now_ms);
            self.outbox.publish_audit(&msg).await;
        }
    }
}

/// A store failure on the way of an event, and how the event had left (published or
/// spooled) before it, if it had: the claims of one that left are never released.
pub(super) struct Failure {
    pub(super) error: StoreError,
    pub(super) left: Option<Delivered>,
}

impl Failure {
    /// A failure before anything left.
    pub(super) fn before(error: StoreError) -> Self {
        Self { error, left: None }
    }
}
