//! One webhook route: its signature profile, secrets, field pointers, rate limit, guard
//! rules and reconciliation, with the defaults of the keys it may leave out.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::reconcile;
use super::secret::SecretSource;
use super::units::{duration, opt_duration, positive};
use crate::providers::{CustomSignature, Profile, RouteKeys, Scheme};

/// The status ranks of a status guard whose route configures none and whose sender brings
/// none (contract §4).
pub const DEFAULT_RANKS: [(&str, u32); 8] = [
    ("queued", 0),
    ("accepted", 0),
    ("sending", 1),
    ("sent", 2),
    ("delivered", 3),
    ("undelivered", 3),
    ("failed", 3),
    ("read", 4),
];
/// The opt-out keywords of a keyword guard that lists none.
pub const DEFAULT_STOP: [&str; 6] = ["STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT"];
/// The opt-in keywords of a keyword guard that lists none.
pub const DEFAULT_START: [&str; 3] = ["START", "UNSTOP", "YES"];
/// The help keywords of a keyword guard that lists none.
pub const DEFAULT_HELP: [&str; 2] = ["HELP", "INFO"];

/// A token bucket per route.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Sustained requests per second.
    #[serde(deserialize_with = "positive::deserialize")]
    pub per_second: NonZeroU32,
    /// Bucket size: requests allowed in a burst.
    #[serde(deserialize_with = "positive::deserialize")]
    pub burst: NonZeroU32,
}

/// JSON Pointers (RFC 6901) to the fields hookgate reads from a body.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Fields {
    /// Event id, stable across retries. Default `/id`.
    pub event_id: String,
    /// Event type. Default `/event`.
    pub event_type: String,
    /// Event time (RFC 3339, Unix seconds or milliseconds). Default `/timestamp`.
    pub timestamp: String,
    /// When the body has no id or type: read the id from `X-Event-Id` and the type from
    /// `X-Botix-Event` or `X-Event-Type`. Off by default: the signature covers the body, not
    /// these headers, so anyone replaying a signed body could choose them.
    pub unsigned_header_fallbacks: bool,
    /// The message an inbound event is about. With a `reconcile:` block, an inbound
    /// message is deduplicated by it, so the webhook's event and the one reconciliation
    /// makes of the same message are one. Default `/data/message_id`.
    pub message_id: String,
}

impl Default for Fields {
    fn default() -> Self {
        Self {
            event_id: "/id".into(),
            event_type: "/event".into(),
            timestamp: "/timestamp".into(),
            unsigned_header_fallbacks: false,
            message_id: "/data/message_id".into(),
        }
    }
}

/// The out-of-order guard of one route (contract §4).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuardConfig {
    /// Delivery-status ordering.
    pub status: Option<StatusGuard>,
    /// STOP / START / HELP keywords.
    pub keywords: Option<KeywordGuard>,
}

/// Status-event ordering rules.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StatusGuard {
    /// Event types judged by these rules.
    pub events: Vec<String>,
    /// Pointer to the message id (the guard key). Default `/data/message_id`.
    #[serde(default = "default_message_id_ptr")]
    pub message_id: String,
    /// Pointer to the status; if absent, the event type's last segment is used. Default `/data/status`.
    #[serde(default = "default_status_ptr")]
    pub status: String,
    /// Status → rank. Default queued 0 … read 4 (contract §4).
    #[serde(default = "default_ranks")]
    pub ranks: BTreeMap<String, u32>,
    /// How long per-message state is kept. Default 7d.
    #[serde(default = "default_status_retention", with = "duration")]
    pub retention: Duration,
}

/// Keyword rules.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeywordGuard {
    /// Event types judged by these rules.
    pub events: Vec<String>,
    /// Pointer to the message text. Default `/data/text`.
    #[serde(default = "default_text_ptr")]
    pub text: String,
    /// Pointer to the contact (sender's number). Default `/data/from`.
    #[serde(default = "default_contact_ptr")]
    pub contact: String,
    /// Pointer to the channel (our number). Default `/data/to`.
    #[serde(default = "default_channel_ptr")]
    pub channel: String,
    /// Opt-out keywords.
    #[serde(default = "default_stop_words")]
    pub stop: Vec<String>,
    /// Opt-in keywords.
    #[serde(default = "default_start_words")]
    pub start: Vec<String>,
    /// Help keywords.
    #[serde(default = "default_help_words")]
    pub help: Vec<String>,
    /// A second HELP within this window is dropped. Default 60s.
    #[serde(default = "default_help_window", with = "duration")]
    pub help_window: Duration,
    /// How long opt-in/opt-out state is kept; forever when unset.
    #[serde(default, with = "opt_duration")]
    pub retention: Option<Duration>,
}

/// One webhook route.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Name: used in keys, metrics, the `x-route` header and `{route}`.
    pub name: String,
    /// Exact request path, e.g. `/webhooks/botix`.
    pub path: String,
    /// The sender (`providers::Profile`); `botix` when absent.
    #[serde(default)]
    pub profile: Profile,
    /// The scheme of a `custom` profile.
    #[serde(default)]
    pub signature: Option<CustomSignature>,
    /// `twilio` only, and required there: the URL the sender requests and signs (scheme,
    /// host, optional port, path; no query). Behind a proxy it is not the URL hookgate sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
    /// Accepted age of a `standard-webhooks` or `telnyx` timestamp. Default 5m.
    #[serde(default = "default_clock_skew", with = "duration")]
    pub timestamp_tolerance: Duration,
    /// Optional token bucket; over it → 429 with Retry-After.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    /// Active secrets; a delivery signed with any of them is accepted (rotation).
    pub secrets: Vec<SecretSource>,
    /// Where the event id, type and timestamp are in the body. Filled in when parsing for
    /// every profile but `twilio`, which reads its own fields and has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Fields>,
    /// Out-of-order guard rules.
    #[serde(default)]
    pub guard: GuardConfig,
    /// Reconciliation with the sender's list API (contract §10); off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile: Option<reconcile::Reconcile>,
}

impl Route {
    /// The keys of the route its sender reads.
    pub fn sender_keys(&self) -> RouteKeys<'_> {
        RouteKeys {
            signature: self.signature.as_ref(),
            public_url: self.public_url.as_deref(),
            timestamp_tolerance: self.timestamp_tolerance,
        }
    }

    /// The route's signature check, as its sender builds it.
    pub fn scheme(&self) -> Result<Scheme, String> {
        self.profile.sender().scheme(&self.sender_keys())
    }
}

// The keys of `Route`, `StatusGuard` and `KeywordGuard` that have defaults are given them per
// key: a section-wide `#[serde(default)]` would fill the required keys too.
fn default_message_id_ptr() -> String {
    "/data/message_id".into()
}
fn default_status_ptr() -> String {
    "/data/status".into()
}
fn default_ranks() -> BTreeMap<String, u32> {
    DEFAULT_RANKS
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}
fn default_status_retention() -> Duration {
    Duration::from_secs(7 * 24 * 3600)
}
fn default_text_ptr() -> String {
    "/data/text".into()
}
fn default_contact_ptr() -> String {
    "/data/from".into()
}
fn default_channel_ptr() -> String {
    "/data/to".into()
}
fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}
fn default_stop_words() -> Vec<String> {
    words(&DEFAULT_STOP)
}
fn default_start_words() -> Vec<String> {
    words(&DEFAULT_START)
}
fn default_help_words() -> Vec<String> {
    words(&DEFAULT_HELP)
}
fn default_help_window() -> Duration {
    Duration::from_secs(60)
}

/// How far an event's timestamp may be from the clock, for the config and for a route that
/// sets no skew of its own.
pub(super) fn default_clock_skew() -> Duration {
    Duration::from_secs(300)
}
