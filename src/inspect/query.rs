//! [`Query`]: what `hookgate inspect` is asked about, and whether its ids can be ids of a
//! route of the given profile; [`InspectError`]: why a question cannot be answered.

use crate::config::Profile;
use crate::providers::IdKind;
use crate::store_error::StoreError;

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

/// The longest id a delivery may carry (the ingress refuses longer request ids).
const MAX_ID_BYTES: usize = 512;

/// Whether `query`'s ids can be ids of a route of `profile`: not empty, not too long, no
/// control characters, and the shape its sender gives ids of that kind.
pub(super) fn check_shape(profile: Profile, query: &Query) -> Result<(), InspectError> {
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
}
