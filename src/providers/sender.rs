//! What a sender answers for a route: the trait each sender's file implements, and the plain
//! values it is asked with (a route's keys, a body to sign, the kind of an id).

use std::time::Duration;

use serde_json::{Map, Value};

use super::body_hmac::CustomSignature;
use super::scheme::Scheme;

/// All a sender brings to a route. Each file of the wing implements it for one sender, and
/// `Profile::sender` picks the file; the methods with a default are what most senders share.
pub trait Sender: Sync {
    /// The signature check of a route of this sender; the error names what is missing.
    fn scheme(&self, keys: &RouteKeys<'_>) -> Result<Scheme, String>;

    /// The header lines the sender sends with a body (botix: the signature value alone),
    /// and a note for the person signing; the error says what is missing.
    fn sign(&self, request: &SignRequest<'_>) -> Result<Signed, String>;

    /// The header that carries the sender's id of one delivery attempt, if it sends one.
    fn request_id_header(&self) -> Option<&'static str>;

    /// Checks the route keys one sender owns (`signature`, `public_url`): those this sender
    /// needs, and none of another's. The error starts with the key's name.
    fn check_keys(&self, keys: &RouteKeys<'_>) -> Result<(), String> {
        keys.refuse_signature()?;
        keys.refuse_public_url()
    }

    /// The `fields` section a route of this sender starts with, as config keys (empty: the
    /// schema's defaults); or, for a sender that names its events itself, why a route of it
    /// takes no `fields`.
    fn fields(&self) -> Result<Value, &'static str> {
        Ok(Value::Object(Map::new()))
    }

    /// The `guard` section a route of this sender starts with, if any.
    fn guard(&self) -> Option<Value> {
        None
    }

    /// How the sender names its events, when it does not use a route's `fields`.
    fn own_events(&self) -> Option<OwnEvents> {
        None
    }

    /// Whether `id` can be an id of `kind` this sender sends (`hookgate inspect`); the
    /// reason when it cannot.
    fn check_id(&self, _kind: IdKind, _id: &str) -> Result<(), &'static str> {
        Ok(())
    }

    /// Whether reconciliation can read the sender's messages: its list API is the one the
    /// `reconcile` module reads.
    fn lists_messages(&self) -> bool {
        false
    }
}

/// The keys of a route a sender reads, besides its secrets.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteKeys<'a> {
    /// `signature`: the scheme of a custom route.
    pub signature: Option<&'a CustomSignature>,
    /// `public_url`: the URL a Twilio route's sender requests and signs.
    pub public_url: Option<&'a str>,
    /// `timestamp_tolerance`: the accepted age of a signed time.
    pub timestamp_tolerance: Duration,
}

impl RouteKeys<'_> {
    /// The accepted age of a signed time, in seconds.
    pub fn tolerance_secs(&self) -> i64 {
        i64::try_from(self.timestamp_tolerance.as_secs()).unwrap_or(i64::MAX)
    }

    /// `signature` belongs to custom routes.
    pub fn refuse_signature(&self) -> Result<(), String> {
        match self.signature {
            Some(_) => Err("signature: only allowed with profile custom".into()),
            None => Ok(()),
        }
    }

    /// `public_url` belongs to Twilio routes.
    pub fn refuse_public_url(&self) -> Result<(), String> {
        match self.public_url {
            Some(_) => Err("public_url: only allowed with profile twilio".into()),
            None => Ok(()),
        }
    }
}

/// A body to sign as a sender would (`hookgate sign`), with what senders sign along with it.
#[derive(Debug, Clone, Copy)]
pub struct SignRequest<'a> {
    /// The secret, or the private key of a sender that signs with one.
    pub secret: &'a [u8],
    /// The body, byte for byte.
    pub body: &'a [u8],
    /// The keys of the route signed for, when one was named.
    pub route: Option<RouteKeys<'a>>,
    /// The URL the sender requests, with its query, for a sender that signs it.
    pub url: Option<&'a str>,
    /// The delivery's id, for a sender that signs one; made up from `fresh` when absent.
    pub id: Option<&'a str>,
    /// A new unique text (a UUID) for an id the sender makes up.
    pub fresh: &'a str,
    /// The signed Unix time in seconds, for a sender that signs one.
    pub timestamp: i64,
}

/// What signing printed: header lines for stdout, and a note for stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// `Name: value` lines (botix: the signature value alone).
    pub headers: String,
    /// Something the person signing needs besides the headers (Telnyx: the public key).
    pub note: Option<String>,
}

impl Signed {
    /// Header lines without a note.
    pub fn headers(headers: String) -> Self {
        Self {
            headers,
            note: None,
        }
    }
}

/// How a sender that takes no `fields` names its events. Its body is a form, or JSON when
/// its content type says so; either way `/Name` reads the top-level field `Name`.
#[derive(Debug, Clone, Copy)]
pub struct OwnEvents {
    /// The fields an event's id and type are made of.
    pub pointers: &'static [&'static str],
    /// The event from the non-empty values at `pointers`, in their order.
    pub name: fn(&[Option<&str>]) -> NamedEvent,
}

/// The id and type a sender gives one of its events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedEvent {
    /// The event id; none lets the sender's request id stand in.
    pub id: Option<String>,
    /// The event type.
    pub event_type: &'static str,
}

/// The kind of id `hookgate inspect` is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// An event's id.
    Event,
    /// The sender's id of one delivery attempt.
    Request,
    /// A message's id.
    Message,
}

/// A status guard's `ranks` as config keys, from a sender's table of its statuses.
pub(super) fn ranks(table: &[(&str, u32)]) -> Value {
    Value::Object(
        table
            .iter()
            .map(|(name, rank)| ((*name).to_owned(), Value::from(*rank)))
            .collect(),
    )
}
