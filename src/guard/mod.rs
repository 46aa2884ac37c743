//! The guard around the pure decisions of [`crate::guard`]: which events a route guards,
//! their keys, per-key serialisation, and the stored state with its expiry.
//!
//! A check takes the key's lock and holds it until the caller commits (after the broker or
//! the spool took the event) or drops the check (a failed publish leaves state unchanged).

pub mod decide;
pub mod stored;

use std::collections::HashSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::GuardConfig;
use crate::guard::decide::{
    decide_keyword, decide_status, status_of, GuardDrop, Keyword, KeywordLists, KeywordState,
    StatusRanks, StatusState, Verdict,
};
use crate::guard::stored::{GuardEvent, Stored};
use crate::ingress::event::{Event, EventFields};
use crate::ingress::fields::Slot;
use crate::state::keys::{guard_key, StoreKey};
use crate::state::{KeyLock, StateStore};
use crate::store::StoreError;

struct StatusRules {
    events: HashSet<String>,
    message_id: Slot,
    status: Slot,
    ranks: StatusRanks,
    retention_ms: i64,
}

struct KeywordRules {
    events: HashSet<String>,
    text: Slot,
    contact: Slot,
    channel: Slot,
    lists: KeywordLists,
    help_window_ms: i64,
    retention_ms: Option<i64>,
}

/// The guard rules of one route, compiled from its config.
pub struct RouteGuard {
    status: Option<StatusRules>,
    keywords: Option<KeywordRules>,
}

impl RouteGuard {
    /// Compiles a route's `guard` section; the fields it reads are added to `fields`.
    pub fn new(cfg: &GuardConfig, fields: &mut EventFields) -> Self {
        let ms = |d: std::time::Duration| d.as_millis() as i64;
        Self {
            status: cfg.status.as_ref().map(|s| StatusRules {
                events: s.events.iter().cloned().collect(),
                message_id: fields.add(&s.message_id),
                status: fields.add(&s.status),
                ranks: StatusRanks::new(s.ranks.iter().map(|(k, v)| (k.clone(), *v))),
                retention_ms: ms(s.retention),
            }),
            keywords: cfg.keywords.as_ref().map(|k| KeywordRules {
                events: k.events.iter().cloned().collect(),
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

/// A decided check that still holds its key's lock: finish it with
/// [`GuardState::commit`] or [`GuardState::abandon`].
pub struct Held {
    key: StoreKey,
    update: Option<(Vec<u8>, Option<i64>)>,
    lock: KeyLock,
}

impl Held {
    /// The guard key's lock this check holds until its commit.
    pub fn lock(&self) -> &KeyLock {
        &self.lock
    }
}

/// What the guard says about an event.
pub enum Check {
    /// The route does not guard this event (or it has no key): publish it.
    Unguarded,
    /// Publish it, then [`GuardState::commit`] the held check.
    Accept(Held),
    /// Drop it; the state is unchanged (its key remembers the drop, `guard::stored`).
    Drop(GuardDrop),
}

/// Whose event a check judges.
#[derive(Clone, Copy)]
enum Judging {
    /// A delivery's or a reconciliation walk's: the rules as they are.
    Delivery,
    /// A replay's: repeats of the newest state pass ([`decide::for_replay`]).
    Replay,
}

impl Judging {
    fn apply<S>(self, verdict: Verdict<S>) -> Verdict<S> {
        match self {
            Judging::Delivery => verdict,
            Judging::Replay => decide::for_replay(verdict),
        }
    }
}

/// Guard state of every route, with per-key locks, in the chosen state store.
pub struct GuardState {
    store: Arc<StateStore>,
}

impl GuardState {
    /// Guard state kept in `store`.
    pub fn new(store: Arc<StateStore>) -> Self {
        Self { store }
    }

    /// Decides an event; events with the same key are decided one at a time, until the
    /// returned check is committed or dropped.
    pub async fn check(
        &self,
        route: &str,
        rules: &RouteGuard,
        event: &Event,
        now_ms: i64,
    ) -> Result<Check, StoreError> {
        self.check_as(route, rules, event, now_ms, Judging::Delivery)
            .await
    }

    /// [`GuardState::check`] for an event a replay publishes again: a repeat of the newest
    /// state is accepted, the state unchanged ([`decide::for_replay`]).
    pub async fn check_replayed(
        &self,
        route: &str,
        rules: &RouteGuard,
        event: &Event,
        now_ms: i64,
    ) -> Result<Check, StoreError> {
        self.check_as(route, rules, event, now_ms, Judging::Replay)
            .await
    }

    async fn check_as(
        &self,
        route: &str,
        rules: &RouteGuard,
        event: &Event,
        now_ms: i64,
        judging: Judging,
    ) -> Result<Check, StoreError> {
        let ts = event.timestamp_ms.unwrap_or(now_ms);
        if let Some(r) = rules
            .status
            .as_ref()
            .filter(|r| r.events.contains(&event.event_type))
        {
            let Some(message_id) = event.field(r.message_id) else {
                return Ok(Check::Unguarded);
            };
            let status = status_of(&event.event_type, event.field(r.status).as_deref());
            let key = StoreKey::guard(route, "status", &[&message_id]);
            let lock = self.store.lock(&key).await?;
            let stored = match self.load::<StatusState>(&key, now_ms).await {
                Ok(stored) => stored,
                Err(e) => {
                    self.store.unlock(lock).await;
                    return Err(e);
                }
            };
            let state = stored.as_ref().map(|s| &s.state);
            let verdict = judging.apply(decide_status(state, &status, ts, &r.ranks));
            let seen = GuardEvent {
                event_id: event.id.clone(),
                at_ms: now_ms,
                what: status.to_lowercase(),
                reason: None,
            };
            let expires_ms = Some(now_ms + r.retention_ms);
            return self
                .held(key, lock, verdict, stored, seen, expires_ms, true)
                .await;
        }
        if let Some(r) = rules
            .keywords
            .as_ref()
            .filter(|r| r.events.contains(&event.event_type))
        {
            let keyword = event.field(r.text).and_then(|t| r.lists.classify(&t));
            let (Some(keyword), Some(contact), Some(channel)) =
                (keyword, event.field(r.contact), event.field(r.channel))
            else {
                return Ok(Check::Unguarded);
            };
            let key = StoreKey::guard(route, "keyword", &[&contact, &channel]);
            let lock = self.store.lock(&key).await?;
            let stored = match self.load::<KeywordState>(&key, now_ms).await {
                Ok(stored) => stored,
                Err(e) => {
                    self.store.unlock(lock).await;
                    return Err(e);
                }
            };
            let state = stored.as_ref().map(|s| &s.state);
            let verdict = judging.apply(decide_keyword(state, keyword, ts, r.help_window_ms));
            let seen = GuardEvent {
                event_id: event.id.clone(),
                at_ms: now_ms,
                what: keyword_name(keyword).to_owned(),
                reason: None,
            };
            let expires_ms = r.retention_ms.map(|d| now_ms + d);
            return self
                .held(key, lock, verdict, stored, seen, expires_ms, false)
                .await;
        }
        Ok(Check::Unguarded)
    }

    /// Stores the new state of an accepted event and releases its key.
    pub async fn commit(&self, held: Held, now_ms: i64) -> Result<(), StoreError> {
        match held.update {
            Some((value, expires_ms)) => {
                self.store
                    .commit_locked(held.lock, &held.key, &value, now_ms, expires_ms)
                    .await
            }
            None => {
                self.store.unlock(held.lock).await;
                Ok(())
            }
        }
    }

    /// Releases the key of an event that was not accepted; its state stays as it was.
    pub async fn abandon(&self, held: Held) {
        self.store.unlock(held.lock).await;
    }

    /// The check of a verdict on `seen` against `stored`. An accepted event's state will
    /// name it (without what it carried when `state_says_what`: a status state holds its
    /// status); a drop is remembered in the key's state at once (a write under the lock
    /// held, then the lock released), so `inspect` can list it.
    #[allow(clippy::too_many_arguments)]
    async fn held<S: Serialize>(
        &self,
        key: StoreKey,
        lock: KeyLock,
        verdict: Verdict<S>,
        stored: Option<Stored<S>>,
        seen: GuardEvent,
        expires_ms: Option<i64>,
        state_says_what: bool,
    ) -> Result<Check, StoreError> {
        let update = match verdict {
            Verdict::Accept(new_state) => {
                // The drops remembered so far stay with the new state.
                let dropped = stored.map(|s| s.dropped).unwrap_or_default();
                new_state
                    .map(|state| {
                        let by = GuardEvent {
                            what: if state_says_what {
                                String::new()
                            } else {
                                seen.what
                            },
                            ..seen
                        };
                        let new = Stored {
                            expires_ms,
                            state,
                            by: Some(by),
                            dropped,
                        };
                        serde_json::to_vec(&new)
                            .map(|v| (v, expires_ms))
                            .map_err(|e| StoreError::Corrupt(e.into()))
                    })
                    .transpose()
            }
            Verdict::Drop(reason) => {
                self.remember_drop(key, lock, stored, seen, reason).await;
                return Ok(Check::Drop(reason));
            }
        };
        match update {
            Ok(update) => Ok(Check::Accept(Held { key, update, lock })),
            Err(e) => {
                self.store.unlock(lock).await;
                Err(e)
            }
        }
    }

    /// Writes `stored` back with `seen` among its dropped events and releases the key. A
    /// failure only loses the entry, never the drop, so it is logged at debug.
    async fn remember_drop<S: Serialize>(
        &self,
        key: StoreKey,
        lock: KeyLock,
        stored: Option<Stored<S>>,
        seen: GuardEvent,
        reason: GuardDrop,
    ) {
        let Some(stored) = stored else {
            self.store.unlock(lock).await;
            return;
        };
        let now_ms = seen.at_ms;
        let stored = stored.with_dropped(seen, reason);
        let written = match serde_json::to_vec(&stored) {
            Ok(value) => {
                self.store
                    .commit_locked(lock, &key, &value, now_ms, stored.expires_ms)
                    .await
            }
            Err(e) => {
                self.store.unlock(lock).await;
                Err(StoreError::Corrupt(e.into()))
            }
        };
        if let Err(error) = written {
            tracing::debug!(%error, "a dropped event not remembered in its guard state");
        }
    }

    async fn load<S: for<'de> Deserialize<'de>>(
        &self,
        key: &StoreKey,
        now_ms: i64,
    ) -> Result<Option<Stored<S>>, StoreError> {
        let Some(bytes) = self.store.get(key).await? else {
            return Ok(None);
        };
        // State that no longer parses (an older format) is treated as absent, not as an error
        // that would block the key forever.
        let stored: Option<Stored<S>> = serde_json::from_slice(&bytes).ok();
        Ok(stored.filter(|s| s.expires_ms.is_none_or(|e| e > now_ms)))
    }
}

/// The name a keyword kind is shown by.
fn keyword_name(keyword: Keyword) -> &'static str {
    match keyword {
        Keyword::Stop => "STOP",
        Keyword::Start => "START",
        Keyword::Help => "HELP",
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
        guard.order_key("r", &event)
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
