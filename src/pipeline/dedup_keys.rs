//! The store keys an event is deduplicated under, made once per event.

use std::borrow::Cow;

use crate::ingress::event::Event;
use crate::pipeline::route::RouteRuntime;
use crate::state::decision::RequestRecord;
use crate::state::keys::StoreKey;

/// The store keys an event is deduplicated under: its own, and the sender's request id
/// when the route's profile says the sender sends one.
pub(super) struct DedupKeys<'e> {
    pub(super) event: StoreKey,
    pub(super) request: Option<StoreKey>,
    /// The id the event key is made of, and whether it is an inbound message's.
    event_id: (Cow<'e, str>, bool),
}

impl<'e> DedupKeys<'e> {
    pub(super) fn of(route: &RouteRuntime, event: &'e Event) -> Self {
        let name = route.config.name.as_str();
        // On a route that reconciles, an inbound message is one event whichever path
        // brought it: its dedup key is its message id, not the event id of either path.
        let (event_key, event_id) = match route.fields.inbound_message_id(event) {
            Some(message_id) => (StoreKey::message(name, &message_id), (message_id, true)),
            None => (
                StoreKey::event(name, &event.id),
                (Cow::Borrowed(event.id.as_str()), false),
            ),
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

    /// The bytes of what the request id's mark records: the event key it was decided
    /// under.
    pub(super) fn request_record(&self) -> Vec<u8> {
        RequestRecord::encode_of(&self.event_id.0, self.event_id.1)
    }

    /// The keys, the event's first.
    pub(super) fn all(&self) -> KeyRefs<'_> {
        match &self.request {
            Some(request) => KeyRefs {
                keys: [&self.event, request],
                len: 2,
            },
            None => KeyRefs {
                keys: [&self.event; 2],
                len: 1,
            },
        }
    }
}

/// An event's keys by reference, kept where they are used: a list of them for every
/// delivery need not be on the heap.
pub(super) struct KeyRefs<'a> {
    keys: [&'a StoreKey; 2],
    len: usize,
}

impl<'a> std::ops::Deref for KeyRefs<'a> {
    type Target = [&'a StoreKey];

    fn deref(&self) -> &Self::Target {
        &self.keys[..self.len]
    }
}
