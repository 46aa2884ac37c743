//! [`RouteGuard`]: a route's `guard` section compiled — which events it guards, the fields
//! they are read from, and the key whose events must keep their arrival order.

use crate::config::GuardConfig;
use crate::guard::decide::{KeywordLists, StatusRanks};
use crate::ingress::event::{Event, EventFields};
use crate::ingress::fields::Slot;
use crate::state::keys::guard_key;

/// The status rules of a route, compiled.
pub(super) struct StatusRules {
    /// A handful of event types, matched for every event: a scan compares fewer bytes
    /// than a hash set's SipHash of the type.
    pub(super) events: Vec<String>,
    pub(super) message_id: Slot,
    pub(super) status: Slot,
    pub(super) ranks: StatusRanks,
    pub(super) retention_ms: i64,
}

/// The keyword rules of a route, compiled.
pub(super) struct KeywordRules {
    /// As [`StatusRules::events`].
    pub(super) events: Vec<String>,
    pub(super) text: Slot,
    pub(super) contact: Slot,
    pub(super) channel: Slot,
    pub(super) lists: KeywordLists,
    pub(super) help_window_ms: i64,
    pub(super) retention_ms: Option<i64>,
}

/// The guard rules of one route, compiled from its config.
pub struct RouteGuard {
    pub(super) status: Option<StatusRules>,
    pub(super) keywords: Option<KeywordRules>,
}

impl RouteGuard {
    /// Compiles a route's `guard` section; the fields it reads are added to `fields`.
    pub fn new(cfg: &GuardConfig, fields: &mut EventFields) -> Self {
        let ms = |d: std::time::Duration| d.as_millis() as i64;
        Self {
            status: cfg.status.as_ref().map(|s| StatusRules {
                events: s.events.to_vec(),
                message_id: fields.add(&s.message_id),
                status: fields.add(&s.status),
                ranks: StatusRanks::new(s.ranks.iter().map(|(k, v)| (k.clone(), *v))),
                retention_ms: ms(s.retention),
            }),
            keywords: cfg.keywords.as_ref().map(|k| KeywordRules {
                events: k.events.to_vec(),
                text: fields.add(&k.text),
                contact: fields.add(&k.contact),
                channel: fields.add(&k.channel),
                lists: KeywordLists::new(&k.stop, &k.start, &k.help),
                help_window_ms: ms(k.help_window),
                retention_ms: k.retention.map(ms),
            }),
        }
    }
}

impl RouteGuard {
    /// The key whose events must reach the broker in arrival order: a status event's
    /// message id, or the contact and channel of a keyword event type (whatever its text:
    /// a contact's messages keep their order around a STOP). `None` for events the route
    /// does not guard.
    pub fn order_key(&self, route: &str, event: &Event) -> Option<String> {
        if let Some(r) = self
            .status
            .as_ref()
            .filter(|r| r.events.contains(&event.event_type))
        {
            let message_id = event.field(r.message_id)?;
            return Some(guard_key(route, "status", &[&message_id]));
        }
        let r = self
            .keywords
            .as_ref()
            .filter(|r| r.events.contains(&event.event_type))?;
        let (contact, channel) = (event.field(r.contact)?, event.field(r.channel)?);
        Some(guard_key(route, "keyword", &[&contact, &channel]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::event::{parse, Delivery, RequestId};
    use crate::ingress::secrets::Secret;
    use crate::ingress::trace::TraceContext;
    use crate::providers as signature;

    /// The order key of a keyword event from `contact` on `channel`.
    fn keyword_order_key(contact: &str, channel: &str) -> Option<String> {
        let (guard, event) = keyword_event(contact, channel);
        guard.order_key("r", &event)
    }

    /// A route `r` that guards keywords, and a STOP from `contact` on `channel` to it.
    fn keyword_event(contact: &str, channel: &str) -> (RouteGuard, crate::ingress::event::Event) {
        let yaml = "listen: {addr: 127.0.0.1:0}\nroutes:\n  - name: r\n    path: /r\n    secrets: [{secret: x}]\n    guard: {keywords: {events: [message.received]}}\n";
        let config = crate::config::Config::parse(yaml).expect("config");
        let route = &config.routes[0];
        let mut fields = EventFields::for_route(route);
        let guard = RouteGuard::new(&route.guard, &mut fields);
        let body = serde_json::json!({
            "id": "e1",
            "event": "message.received",
            "data": {"from": contact, "to": channel, "text": "STOP"},
        });
        let body = body.to_string();
        let mut headers = http::HeaderMap::new();
        let signature = signature::botix_header(b"x", body.as_bytes());
        let value = http::HeaderValue::from_str(&signature).expect("header");
        headers.insert(signature::BOTIX_SIGNATURE, value);
        let delivery = Delivery {
            headers,
            body: body.into(),
            query: None,
        };
        let scheme = route.scheme().expect("scheme");
        let verified = delivery
            .verify(&scheme, &[Secret::new(b"x")], 0)
            .expect("signed");
        let event = parse(
            verified,
            &fields,
            RequestId::generated(),
            TraceContext::new_root(),
        )
        .expect("event");
        (guard, event)
    }

    /// The local state store in `dir`.
    fn local_state(dir: &std::path::Path) -> std::sync::Arc<crate::state::StateStore> {
        let store = durable_spool::Store::open(dir).expect("store");
        let config = crate::config::Config::parse(
            "listen: {addr: 127.0.0.1:0}\nroutes:\n  - name: r\n    path: /r\n    secrets: [{secret: x}]\n",
        )
        .expect("config");
        let state = crate::state::StateStore::open(
            &crate::state::BackendChoice::Local,
            &config,
            &store,
            std::sync::Arc::new(|| 0),
            &crate::liveness::Liveness::new(),
        )
        .expect("state");
        std::sync::Arc::new(state)
    }

    /// The held check of a contact's first STOP, which is accepted.
    async fn first_stop(
        guards: &crate::guard::GuardState,
        guard: &RouteGuard,
        event: &Event,
    ) -> crate::guard::Held {
        let check = guards
            .check("r", guard, event, 0, crate::guard::Judging::Delivery)
            .await
            .expect("check");
        let crate::guard::Check::Accept(held) = check else {
            panic!("a first STOP is accepted");
        };
        held
    }

    #[tokio::test]
    async fn the_local_store_keeps_guard_state_in_the_binary_form() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = local_state(dir.path());
        let guards = crate::guard::GuardState::new(state.clone());
        let (guard, event) = keyword_event("+15550001111", "+15550002222");
        let held = first_stop(&guards, &guard, &event).await;
        guards.commit(held, 0).await.expect("commit");
        let key =
            crate::state::keys::StoreKey::guard("r", "keyword", &["+15550001111", "+15550002222"]);
        let bytes = state.get(&key).await.expect("get").expect("state");
        assert_eq!(bytes.first(), Some(&2), "the keyword state's binary form");
        let stored = crate::guard::stored::read_keywords(&bytes).expect("reads");
        assert!(stored.state.opted_out);
    }

    #[tokio::test]
    async fn a_held_check_names_the_order_key_of_its_event() {
        let dir = tempfile::tempdir().expect("tempdir");
        let guards = crate::guard::GuardState::new(local_state(dir.path()));
        for (contact, channel) in [("+15550001111", "+15550002222"), ("a:b", "c\0d")] {
            let (guard, event) = keyword_event(contact, channel);
            let held = first_stop(&guards, &guard, &event).await;
            assert_eq!(held.key_text(), guard.order_key("r", &event).as_deref());
            guards.abandon(held).await;
        }
    }

    #[test]
    fn order_keys_of_different_contacts_and_channels_differ_whatever_their_characters() {
        let pairs = [
            (("a\0b", "c"), ("a", "b\0c")),
            (("a:b", "c"), ("a", "b:c")),
            (("a:b", "c"), ("a\0b", "c")),
        ];
        for ((c1, ch1), (c2, ch2)) in pairs {
            let (k1, k2) = (keyword_order_key(c1, ch1), keyword_order_key(c2, ch2));
            assert!(k1.is_some(), "{c1:?} on {ch1:?} is guarded");
            assert_ne!(k1, k2, "{c1:?} on {ch1:?} / {c2:?} on {ch2:?}");
        }
        // Plain parts keep the form spooled entries already hold.
        assert_eq!(
            keyword_order_key("+15550001111", "+15550002222").as_deref(),
            Some("r\0keyword\0+15550001111\0+15550002222")
        );
    }
}
