//! `hookgate inspect`: what the state store knows about one event, request, message or
//! contact of a route, from the decision records of the dedup marks (`state::decision`)
//! and the guard state (`guard::stored`). The same reports come from the running gateway
//! (the admin API reads its [`StateStore`]) and from a stopped store read offline
//! ([`OfflineState`]); the shapes of ids are checked here, the text is in `render`.

mod render;
mod report;

use std::future::Future;
use std::time::Duration;

use crate::config::{Config, Profile};
use crate::guard::stored::{read_keywords, read_status};
use crate::providers::IdKind;
use crate::state::decision::{EventRecord, RequestRecord};
use crate::state::keys::StoreKey;
use crate::state::marks::StoredMark;
use crate::state::offline::OfflineState;
use crate::state::StateStore;
use crate::store::StoreError;

pub use render::render;
pub use report::{
    Answer, ContactReport, EventReport, GuardEventReport, MarkReport, MessageReport, RecordReport,
    Report, RequestReport,
};

/// What is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// An event, by its id.
    Event(String),
    /// A delivery, by the request id the sender sent (and `X-Request-Id` echoed).
    Request(String),
    /// A message's status, by its message id.
    Message(String),
    /// A contact's opt-in state on a channel.
    Contact { from: String, to: String },
}

impl Query {
    /// The query named by `kind` (`event`, `request`, `message`, `contact`), `id` and,
    /// for a contact, `to`.
    pub fn new(kind: &str, id: &str, to: Option<&str>) -> Result<Self, InspectError> {
        let id = id.to_owned();
        Ok(match (kind, to) {
            ("event", None) => Query::Event(id),
            ("request", None) => Query::Request(id),
            ("message", None) => Query::Message(id),
            ("contact", Some(to)) => Query::Contact {
                from: id,
                to: to.to_owned(),
            },
            ("contact", None) => return Err(InspectError::NoChannel),
            (_, Some(_)) => return Err(InspectError::Shape("only a contact takes a second id")),
            _ => return Err(InspectError::UnknownKind(kind.to_owned())),
        })
    }

    /// The kind's name, as [`Query::new`] reads it.
    pub fn kind(&self) -> &'static str {
        match self {
            Query::Event(_) => "event",
            Query::Request(_) => "request",
            Query::Message(_) => "message",
            Query::Contact { .. } => "contact",
        }
    }
}

/// Why a question cannot be answered.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The config has no route of that name.
    #[error("no route named {0:?} in the config")]
    NoRoute(String),
    /// Not a kind of question.
    #[error("unknown kind {0:?}: event, request, message or contact")]
    UnknownKind(String),
    /// A contact's state is kept per channel.
    #[error("a contact's state is kept per channel: give TO, the number the contact wrote to")]
    NoChannel,
    /// An id that cannot be one of this route's.
    #[error("{0}")]
    Shape(&'static str),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where the reports read: the running gateway's state store, or a stopped one.
pub trait Lookup {
    /// A dedup key's mark, if one counts at `now_ms`.
    fn mark(
        &self,
        key: &StoreKey,
        now_ms: i64,
    ) -> impl Future<Output = Result<Option<StoredMark>, StoreError>> + Send;
    /// A guard key's stored state.
    fn guard(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send;
}

impl Lookup for StateStore {
    fn mark(
        &self,
        key: &StoreKey,
        now_ms: i64,
    ) -> impl Future<Output = Result<Option<StoredMark>, StoreError>> + Send {
        self.read_mark(key, now_ms)
    }
    fn guard(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send {
        self.get(key)
    }
}

impl Lookup for OfflineState {
    async fn mark(&self, key: &StoreKey, now_ms: i64) -> Result<Option<StoredMark>, StoreError> {
        self.read_mark(key, now_ms)
    }
    async fn guard(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        self.get(key)
    }
}

/// One route as inspect needs it.
#[derive(Debug, Clone)]
struct RouteFacts {
    name: String,
    profile: Profile,
}

/// Answers questions about the routes of a config.
#[derive(Debug, Clone)]
pub struct Inspector {
    routes: Vec<RouteFacts>,
    /// The dedup window: how long an event's marks and record are kept.
    window: Duration,
}

impl Inspector {
    /// The inspector of `config`'s routes.
    pub fn new(config: &Config) -> Self {
        Self {
            routes: config
                .routes
                .iter()
                .map(|r| RouteFacts {
                    name: r.name.clone(),
                    profile: r.profile,
                })
                .collect(),
            window: config.dedup.ttl,
        }
    }

    /// Whether `query` can be asked of `route`: the route exists and the ids have the
    /// shape of its sender's.
    pub fn check(&self, route: &str, query: &Query) -> Result<(), InspectError> {
        let facts = self
            .routes
            .iter()
            .find(|r| r.name == route)
            .ok_or_else(|| InspectError::NoRoute(route.to_owned()))?;
        check_shape(facts.profile, query)
    }

    /// Answers `query` about `route` from `store` at `now_ms`.
    pub async fn answer(
        &self,
        store: &impl Lookup,
        route: &str,
        query: &Query,
        now_ms: i64,
    ) -> Result<Report, InspectError> {
        self.check(route, query)?;
        let window = window_text(self.window);
        let body = match query {
            Query::Event(id) => Answer::Event(event_report(store, route, id, now_ms).await?),
            Query::Request(id) => {
                let key = StoreKey::request(route, id);
                let mark = store.mark(&key, now_ms).await?;
                let pointer = mark
                    .as_ref()
                    .and_then(|m| m.record.as_deref())
                    .and_then(RequestRecord::decode);
                let event = match &pointer {
                    Some(p) => Some(event_report(store, route, &p.event_id, now_ms).await?),
                    None => None,
                };
                Answer::Request(RequestReport {
                    request_id: id.clone(),
                    mark: mark.as_ref().map(MarkReport::of),
                    event_id: pointer.map(|p| p.event_id),
                    event,
                })
            }
            Query::Message(id) => {
                let key = StoreKey::guard(route, "status", &[id]);
                let stored = store.guard(&key).await?;
                let stored = stored
                    .as_deref()
                    .and_then(read_status)
                    .filter(|s| s.expires_ms.is_none_or(|e| e > now_ms));
                Answer::Message(MessageReport::of(id, stored))
            }
            Query::Contact { from, to } => {
                let key = StoreKey::guard(route, "keyword", &[from, to]);
                let stored = store.guard(&key).await?;
                let stored = stored
                    .as_deref()
                    .and_then(read_keywords)
                    .filter(|s| s.expires_ms.is_none_or(|e| e > now_ms));
                Answer::Contact(ContactReport::of(from, to, stored))
            }
        };
        Ok(body.with_context(route, &window))
    }
}

/// The report of the event `id`: its mark under its event id, or, on a route that
/// reconciles, under the inbound message id the event may have been deduplicated by.
async fn event_report(
    store: &impl Lookup,
    route: &str,
    id: &str,
    now_ms: i64,
) -> Result<EventReport, InspectError> {
    let mut by_message = false;
    let mut mark = store.mark(&StoreKey::event(route, id), now_ms).await?;
    if mark.is_none() {
        mark = store.mark(&StoreKey::message(route, id), now_ms).await?;
        by_message = mark.is_some();
    }
    let record = mark
        .as_ref()
        .and_then(|m| m.record.as_deref())
        .and_then(EventRecord::decode);
    Ok(EventReport {
        event_id: id.to_owned(),
        by_message_id: by_message,
        mark: mark.as_ref().map(MarkReport::of),
        record: record.as_ref().map(RecordReport::of),
        parked: None,
    })
}

/// The longest id a delivery may carry (the ingress refuses longer request ids).
const MAX_ID_BYTES: usize = 512;

/// Whether `query`'s ids can be ids of a route of `profile`: not empty, not too long, no
/// control characters, and the shape its sender gives ids of that kind.
fn check_shape(profile: Profile, query: &Query) -> Result<(), InspectError> {
    let ids: Vec<&str> = match query {
        Query::Event(id) | Query::Request(id) | Query::Message(id) => vec![id],
        Query::Contact { from, to } => vec![from, to],
    };
    for id in ids {
        if id.is_empty() {
            return Err(InspectError::Shape("the id is empty"));
        }
        if id.len() > MAX_ID_BYTES {
            return Err(InspectError::Shape(
                "the id is longer than any id a delivery may carry (512 bytes)",
            ));
        }
        if id.chars().any(char::is_control) {
            return Err(InspectError::Shape("the id holds control characters"));
        }
    }
    let (kind, id) = match query {
        Query::Event(id) => (IdKind::Event, id),
        Query::Request(id) => (IdKind::Request, id),
        Query::Message(id) => (IdKind::Message, id),
        Query::Contact { .. } => return Ok(()),
    };
    profile
        .sender()
        .check_id(kind, id)
        .map_err(InspectError::Shape)
}

/// The dedup window as an operator writes it: `72h`, `90m`, `45s`.
fn window_text(window: Duration) -> String {
    let secs = window.as_secs();
    if secs.is_multiple_of(3600) {
        format!("{}h", secs / 3600)
    } else if secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_the_wrong_shape_are_refused_with_the_reason() {
        let uuid = "3f1c2a9e-8b7d-4c6a-9f0e-1d2c3b4a5f60";
        let ulid = "req_01HZX3J8Q4K7M2N5P9R6S8T0VW";
        for ok in [Query::Request(uuid.into()), Query::Request(ulid.into())] {
            assert!(check_shape(Profile::Botix, &ok).is_ok(), "{ok:?}");
        }
        assert!(check_shape(Profile::Botix, &Query::Event("evt_1".into())).is_ok());
        let refused = |profile, query: Query| match check_shape(profile, &query) {
            Err(InspectError::Shape(why)) => why,
            other => panic!("{query:?} gave {other:?}"),
        };
        assert!(refused(Profile::Botix, Query::Request("evt_1".into())).contains("UUID"));
        assert!(refused(Profile::Botix, Query::Event(ulid.into())).contains("inspect request"));
        assert!(refused(Profile::Telnyx, Query::Request("x".into())).contains("inspect event"));
        assert!(refused(Profile::Custom, Query::Event(String::new())).contains("empty"));
        assert!(refused(Profile::Custom, Query::Event("a\nb".into())).contains("control"));
        assert!(refused(Profile::Custom, Query::Event("x".repeat(513))).contains("512"));
        // Other profiles' request ids have no fixed shape.
        assert!(check_shape(Profile::StandardWebhooks, &Query::Request("msg_2x".into())).is_ok());
    }

    #[test]
    fn queries_are_read_by_kind() {
        assert_eq!(
            Query::new("contact", "+1555", Some("+1666")).expect("contact"),
            Query::Contact {
                from: "+1555".into(),
                to: "+1666".into()
            }
        );
        assert!(matches!(
            Query::new("contact", "+1555", None),
            Err(InspectError::NoChannel)
        ));
        assert!(matches!(
            Query::new("events", "e", None),
            Err(InspectError::UnknownKind(_))
        ));
        assert!(matches!(
            Query::new("event", "e", Some("x")),
            Err(InspectError::Shape(_))
        ));
    }

    #[test]
    fn the_window_is_written_as_an_operator_writes_it() {
        assert_eq!(window_text(Duration::from_secs(72 * 3600)), "72h");
        assert_eq!(window_text(Duration::from_secs(90 * 60)), "90m");
        assert_eq!(window_text(Duration::from_secs(45)), "45s");
    }
}
