//! The store keys an event is deduplicated under, made once per event.

use crate::ingress::event::Event;
use crate::pipeline::route::RouteRuntime;
use crate::state::decision::RequestRecord;
use crate::state::keys::StoreKey;

/// The store keys an event is deduplicated under: its own, and the sender's request id
/// when the route's profile says the sender sends one.
pub(super) struct DedupKeys {
    pub(super) event: StoreKey,
    pub(super) request: Option<StoreKey>,
    /// The id the event key is made of, and whether it is an inbound message's.
    event_id: (String, bool),
}

impl DedupKeys {
    pub(super) fn of(route: &RouteRuntime, event: &Event) -> Self {
        let name = route.config.name.as_str();
        // On a route that reconciles, an inbound message is one event whichever path
        // brought it: its dedup key is its message id, not the event id of either path.
        let (event_key, event_id) = match route.fields.inbound_message_id(event) {
            Some(message_id) => (
                StoreKey::message(name, &message_id),
                (message_id.into_owned(), true),
            ),
            None => (StoreKey::event(name, &event.id), (event.id.clone(), false)),
        };
        let request = event
            .request_id_from_sender
            .then(|| StoreKey::request(name, &event.request_id));
        Self {
            event: event_key,
            request,
            event_id,
        }
    }

    /// What the request id's mark records: the event key it was decided under.
    pub(super) fn request_record(&self) -> RequestRecord {
        RequestRecord {
            event_id: self.event_id.0.clone(),
            by_message: self.event_id.1,
        }
    }

    /// The keys, the event's first.
    pub(super) fn all(&self) -> Vec<&StoreKey> {
        std::iter::once(&self.event)
            .chain(self.request.as_ref())
            .collect()
    }
}
