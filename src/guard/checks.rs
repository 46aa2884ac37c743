//! [`GuardState`]: decides an event against the stored state of its key, holding the key's
//! lock until the caller commits or abandons the [`Held`] check.

use std::sync::Arc;

use crate::guard::decide::{
    self, decide_keyword, decide_status, status_of, GuardDrop, Keyword, KeywordState, StatusState,
    Verdict,
};
use crate::guard::rules::RouteGuard;
use crate::guard::stored::{Form, GuardEvent, StateForm, Stored};
use crate::ingress::event::Event;
use crate::state::keys::StoreKey;
use crate::state::{KeyLock, StateStore};
use crate::store_error::StoreError;

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

    /// The guard key as text: the event's order key ([`RouteGuard::order_key`]), which is
    /// made of the same parts.
    ///
    /// [`RouteGuard::order_key`]: crate::guard::RouteGuard::order_key
    pub fn key_text(&self) -> Option<&str> {
        std::str::from_utf8(self.key.as_bytes()).ok()
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judging {
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
    /// How state is written: JSON where replicas of earlier builds may read it.
    form: Form,
}

impl GuardState {
    /// Guard state kept in `store`.
    pub fn new(store: Arc<StateStore>) -> Self {
        let form = match *store {
            StateStore::Local(_) => Form::Binary,
            StateStore::Redis { .. } => Form::Json,
        };
        Self { store, form }
    }

    /// Decides an event as `judging` says; events with the same key are decided one at a
    /// time, until the returned check is committed or dropped. A replay's event
    /// ([`Judging::Replay`]) passes as a repeat of the newest state, the state unchanged
    /// ([`decide::for_replay`]).
    pub async fn check(
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
            let status_field = event.field(r.status);
            let status = status_of(&event.event_type, status_field.as_deref());
            let key = StoreKey::guard(route, "status", &[&message_id]);
            let (lock, stored) = self.lock_and_load::<StatusState>(&key, now_ms).await?;
            let state = stored.as_ref().map(|s| &s.state);
            let verdict = judging.apply(decide_status(state, &status, ts, &r.ranks));
            let seen = GuardEvent {
                event_id: event.id.clone(),
                at_ms: now_ms,
                // `status_of` lowercased it already.
                what: status.into_owned(),
                reason: None,
            };
            let expires_ms = Some(now_ms + r.retention_ms);
            return Ok(self
                .held(key, lock, verdict, stored, seen, expires_ms, true)
                .await);
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
            let (lock, stored) = self.lock_and_load::<KeywordState>(&key, now_ms).await?;
            let state = stored.as_ref().map(|s| &s.state);
            let verdict = judging.apply(decide_keyword(state, keyword, ts, r.help_window_ms));
            let seen = GuardEvent {
                event_id: event.id.clone(),
                at_ms: now_ms,
                what: keyword_name(keyword).to_owned(),
                reason: None,
            };
            let expires_ms = r.retention_ms.map(|d| now_ms + d);
            return Ok(self
                .held(key, lock, verdict, stored, seen, expires_ms, false)
                .await);
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
    async fn held<S: StateForm>(
        &self,
        key: StoreKey,
        lock: KeyLock,
        verdict: Verdict<S>,
        stored: Option<Stored<S>>,
        seen: GuardEvent,
        expires_ms: Option<i64>,
        state_says_what: bool,
    ) -> Check {
        let update = match verdict {
            Verdict::Accept(new_state) => {
                // The drops remembered so far stay with the new state.
                let dropped = stored.map(|s| s.dropped).unwrap_or_default();
                new_state.map(|state| {
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
                    (new.encode(self.form), expires_ms)
                })
            }
            Verdict::Drop(reason) => {
                // Boxed: drops are the rare way out, and every accepted event's future
                // would otherwise carry the kilobyte of this one's state.
                Box::pin(self.remember_drop(key, lock, stored, seen, reason)).await;
                return Check::Drop(reason);
            }
        };
        Check::Accept(Held { key, update, lock })
    }

    /// Writes `stored` back with `seen` among its dropped events and releases the key. A
    /// failure only loses the entry, never the drop, so it is logged at debug.
    async fn remember_drop<S: StateForm>(
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
        let written = self
            .store
            .commit_locked(
                lock,
                &key,
                &stored.encode(self.form),
                now_ms,
                stored.expires_ms,
            )
            .await;
        if let Err(error) = written {
            tracing::debug!(%error, "a dropped event not remembered in its guard state");
        }
    }

    /// Takes `key`'s lock and reads its state; the lock is given back when the read fails.
    async fn lock_and_load<S: StateForm>(
        &self,
        key: &StoreKey,
        now_ms: i64,
    ) -> Result<(KeyLock, Option<Stored<S>>), StoreError> {
        let lock = self.store.lock(key).await?;
        match self.load::<S>(key, now_ms).await {
            Ok(stored) => Ok((lock, stored)),
            Err(e) => {
                self.store.unlock(lock).await;
                Err(e)
            }
        }
    }

    async fn load<S: StateForm>(
        &self,
        key: &StoreKey,
        now_ms: i64,
    ) -> Result<Option<Stored<S>>, StoreError> {
        let Some(bytes) = self.store.get(key).await? else {
            return Ok(None);
        };
        // State that does not read (another kind, damage) is treated as absent, not as an
        // error that would block the key forever.
        let stored = Stored::<S>::from_bytes(&bytes);
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
