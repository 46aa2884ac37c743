//! The YAML configuration: schema, defaults, human durations and sizes, and `validate()`.
//!
//! Parsing is strict: every struct denies unknown keys, and the error names the key path
//! (`limits.max_body_byts`). Reading secrets from the environment or files happens in
//! [`crate::ingress::secrets`], not here, so a config can be checked without them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

mod amqp;
pub mod profiles;
pub mod reconcile;
pub mod redis;

pub use self::redis::Redis;

pub use amqp::split_urls;

/// The longest AMQP short string, in bytes: the limit of exchange names, routing keys and
/// `message_id`. Config checks the exchange against it; the outbox checks routing keys.
pub const AMQP_SHORT_STRING_MAX: usize = 255;
/// Longest `store.commit_interval`: every durable answer may wait this long for its commit.
const MAX_COMMIT_INTERVAL: Duration = Duration::from_millis(100);
/// The shortest `dedup.ttl`: the state store rewrites a run once a ttl has passed since it
/// was written, so a zero ttl rewrites in a loop.
const MIN_DEDUP_TTL: Duration = Duration::from_secs(1);
/// The longest a request waits for its spool entry's fsync before it answers 503: with the
/// guard-key lock wait and the publish, part of how long a request holds its claim.
pub const SPOOL_FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Whether `text` fits an AMQP short string.
pub fn fits_short_string(text: &str) -> bool {
    text.len() <= AMQP_SHORT_STRING_MAX
}

/// A configuration that cannot be used; the message names the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// The whole configuration file (contract §7).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The webhook listener.
    pub listen: Listen,
    /// The admin listener for probes and metrics.
    #[serde(default)]
    pub admin: AdminConfig,
    /// The embedded store (dedup marks, guard state, spool).
    #[serde(default)]
    pub store: StoreConfig,
    /// The RabbitMQ connection and message shape.
    #[serde(default)]
    pub amqp: Amqp,
    /// Duplicate detection.
    #[serde(default)]
    pub dedup: Dedup,
    /// The shared store, used when `dedup.backend` is `redis`.
    #[serde(default)]
    pub redis: Redis,
    /// The durable local buffer used while the broker cannot take messages.
    #[serde(default)]
    pub spool: SpoolConfig,
    /// Request limits.
    #[serde(default)]
    pub limits: Limits,
    /// How far in the future an event timestamp may be before it is dropped. Default 5m.
    #[serde(default = "default_clock_skew", with = "duration")]
    pub max_clock_skew: Duration,
    /// How long in-flight requests may take to finish after SIGTERM. Default 25s.
    #[serde(default = "default_shutdown_grace", with = "duration")]
    pub shutdown_grace: Duration,
    /// How often secret files and the TLS certificate files are compared with what is
    /// loaded; SIGHUP re-reads them at once. Default 2s.
    #[serde(default = "default_reload_poll", with = "duration")]
    pub reload_poll: Duration,
    /// Logging.
    #[serde(default)]
    pub log: Log,
    /// The webhook routes; at least one.
    pub routes: Vec<Route>,
    /// How each duration was written in the file, so `check-config` prints `72h` as `72h`.
    #[serde(skip)]
    written: duration::Written,
    /// Values read under a name they no longer have (see [`Config::deprecations`]).
    #[serde(skip)]
    deprecations: Vec<String>,
}

/// Where the webhook listener binds, and its TLS material.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Listen {
    /// Socket address, e.g. `0.0.0.0:8443`.
    pub addr: SocketAddr,
    /// PEM certificate chain and key; omitted for plain HTTP (e.g. behind a mesh).
    #[serde(default)]
    pub tls: Option<Tls>,
}

/// PEM files for the TLS listener.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// Certificate chain, PEM.
    pub cert: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1), PEM.
    pub key: PathBuf,
}

/// The admin listener.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Socket address for `/healthz`, `/readyz`, `/metrics`. Default `0.0.0.0:9090`.
    pub addr: SocketAddr,
    /// A file holding the token that changes to the spool (`hookgate spool republish`,
    /// `delete`) must present, read at start. Without it those changes are refused.
    pub token_file: Option<PathBuf>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([0, 0, 0, 0], 9090)),
            token_file: None,
        }
    }
}

/// The store folder: the spool's database and the local state journal.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// The store folder. Default `/var/lib/hookgate`.
    pub path: PathBuf,
    /// The spool database's page cache. Default 32MiB.
    #[serde(with = "size")]
    pub cache: u64,
    /// Dedup marks and guard entries held in memory before they are written to a run on
    /// disk (local backend). Default 65536.
    pub hot_entries: usize,
    /// Size of one state journal segment file, written in full before use (local backend).
    /// Default 4MiB.
    #[serde(with = "size")]
    pub journal_segment: u64,
    /// The state journal's group commits start at most this often (local backend): a longer
    /// interval means fewer `fdatasync`s (disk flushes a second), a shorter one a quicker 200
    /// under load. Default 1ms; at most 100ms.
    #[serde(with = "duration")]
    pub commit_interval: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("/var/lib/hookgate"),
            cache: 32 << 20,
            hot_entries: 65_536,
            journal_segment: 4 << 20,
            commit_interval: Duration::from_millis(1),
        }
    }
}

/// The RabbitMQ side.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Amqp {
    /// AMQP URL. Default `amqp://guest:guest@127.0.0.1:5672/%2f`. Redacted when printed.
    pub url: String,
    /// Environment variable holding the whole URL (credentials included); when set it
    /// overrides `url`, so a password can come from a Kubernetes Secret. Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url_env: Option<String>,
    /// The URLs of a cluster's nodes, tried in order; instead of `url`. Default empty.
    /// Redacted when printed.
    pub urls: Vec<String>,
    /// Environment variable holding the nodes' URLs separated by commas; overrides `urls`.
    /// Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub urls_env: Option<String>,
    /// Exchange accepted events are published to (type topic). Default `webhooks`.
    pub exchange: String,
    /// Routing key template; `{route}` and `{event}` are replaced. Default `{event}`.
    pub routing_key: String,
    /// Declare the exchange (durable, topic) at start. Default true.
    pub declare: bool,
    /// How long to wait for the broker's confirm. Default 5s.
    #[serde(with = "duration")]
    pub confirm_timeout: Duration,
    /// If set, every guard drop is also published with this routing key template.
    pub dropped_routing_key: Option<String>,
}

impl Default for Amqp {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            url_env: None,
            urls: Vec::new(),
            urls_env: None,
            exchange: "webhooks".into(),
            routing_key: "{event}".into(),
            declare: true,
            confirm_timeout: Duration::from_secs(5),
            dropped_routing_key: None,
        }
    }
}

/// Which store holds dedup marks and guard state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The state journal in `store.path`; one replica. `sled`, its former name, is still
    /// read, with a warning.
    #[default]
    Local,
    /// Shared Redis at `redis.url`; several replicas.
    Redis,
}

/// Duplicate detection (contract §3).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Dedup {
    /// `local` (default) or `redis`.
    pub backend: Backend,
    /// How long a done mark is remembered. Default 72h (longer than the sender's retry window).
    #[serde(with = "duration")]
    pub ttl: Duration,
    /// How long a second delivery of an in-flight event waits for the first. Default 5s.
    #[serde(with = "duration")]
    pub in_flight_wait: Duration,
    /// Age after which an in-flight mark is taken to be a crash leftover. Default 30s.
    #[serde(with = "duration")]
    pub in_flight_lease: Duration,
}

impl Default for Dedup {
    fn default() -> Self {
        Self {
            backend: Backend::default(),
            ttl: Duration::from_secs(72 * 3600),
            in_flight_wait: Duration::from_secs(5),
            in_flight_lease: Duration::from_secs(30),
        }
    }
}

/// The durable spool (contract §6).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpoolConfig {
    /// Spool events the broker cannot take; when false every broker failure is a 503. Default true.
    pub enabled: bool,
    /// Upper bound of the spool; when full the answer is 503. Default 1GiB.
    #[serde(with = "size")]
    pub max_bytes: u64,
    /// How long the spool's head may go without progress, while the broker is connected,
    /// before `/readyz` answers 503 and `hookgate_spool_drainer_stalled` is 1. Must exceed
    /// `amqp.confirm_timeout`. Default 30s.
    #[serde(with = "duration")]
    pub stall_after: Duration,
}

impl Default for SpoolConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_bytes: 1 << 30,
            stall_after: Duration::from_secs(30),
        }
    }
}

/// Limits that protect the listener.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest accepted body; larger → 413. Default 64KiB.
    #[serde(with = "size")]
    pub max_body_bytes: u64,
    /// Concurrent connections; more are refused. Default 10000.
    pub max_connections: usize,
    /// Largest request head; larger → 431. Default 16KiB.
    #[serde(with = "size")]
    pub max_header_bytes: u64,
    /// Time allowed to send the request head. Default 10s.
    #[serde(with = "duration")]
    pub header_read_timeout: Duration,
    /// Time allowed to send the body. Default 30s.
    #[serde(with = "duration")]
    pub body_read_timeout: Duration,
    /// A kept-alive HTTP/1 connection, or an HTTP/2 connection with no open stream, is
    /// closed after this long without a request. Default 60s.
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    /// A connection is asked to close after this long (HTTP/2 GOAWAY, HTTP/1
    /// `Connection: close`); requests in flight finish. Default 10m.
    #[serde(with = "duration")]
    pub max_connection_age: Duration,
    /// Concurrent HTTP/2 streams per connection. Default 16.
    pub h2_max_concurrent_streams: u32,
    /// Bytes of request bodies held before their signature is checked, over all
    /// connections; beyond it reading waits (flow control) until bytes are freed or the
    /// body read times out. Default 32MiB.
    #[serde(with = "size")]
    pub max_unverified_body_bytes: u64,
    /// Requests that fail verification, per peer address: a peer over it is answered 429
    /// before its body is read. Default 5 per second, burst 20.
    pub failed_verification_per_peer: RateLimit,
    /// Leading bits of an IPv4 peer address that name one peer for
    /// `failed_verification_per_peer`, 1 to 32. Default 32 (the whole address).
    pub failed_verification_ipv4_prefix: u8,
    /// Leading bits of an IPv6 peer address that name one peer, 1 to 128. Default 64: a
    /// host is handed a whole /64 and can rotate through its addresses.
    pub failed_verification_ipv6_prefix: u8,
    /// Header holding the client address set by a trusted proxy in front (its last
    /// comma-separated entry is used, as in `X-Forwarded-For`). Default unset: the TCP
    /// peer address; never trusted unless configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_address_header: Option<String>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 * 1024,
            max_connections: 10_000,
            max_header_bytes: 16 * 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connection_age: Duration::from_secs(600),
            h2_max_concurrent_streams: 16,
            max_unverified_body_bytes: 32 << 20,
            failed_verification_per_peer: RateLimit {
                per_second: 5,
                burst: 20,
            },
            failed_verification_ipv4_prefix: 32,
            failed_verification_ipv6_prefix: 64,
            peer_address_header: None,
        }
    }
}

/// Log output.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Log {
    /// Filter directives when `RUST_LOG` is unset, e.g. `info` or `hookgate=debug`. Default `info`.
    pub level: String,
}

impl Default for Log {
    fn default() -> Self {
        Self {
            level: "info".into(),
        }
    }
}

/// Signature scheme of a route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// `X-Botix-Signature: sha256=<hex>` (or bare hex) over the raw body.
    #[default]
    Botix,
    /// Standard Webhooks: `webhook-signature: v1,<base64>` over `id.timestamp.body`.
    StandardWebhooks,
    /// Twilio: `X-Twilio-Signature`, HMAC-SHA1 over `public_url` and the form parameters.
    Twilio,
    /// Telnyx: `telnyx-signature-ed25519` over `timestamp|body`, checked with a public key.
    Telnyx,
    /// Spelled out in `signature`.
    Custom,
}

/// How a custom signature is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Lowercase or uppercase hex.
    Hex,
    /// Standard base64 with padding.
    Base64,
}

/// The scheme of a `custom` profile: HMAC-SHA256 over the raw body.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CustomSignature {
    /// Header carrying the signature.
    pub header: String,
    /// Optional prefix before the encoded MAC, e.g. `sha256=`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// `hex` or `base64`.
    pub encoding: Encoding,
}

/// Where one secret comes from. The file writes it as a mapping with exactly one of the
/// keys `secret_env`, `secret_file` and `secret`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SecretKeys")]
pub enum SecretSource {
    /// `secret_env`: the name of an environment variable holding the secret.
    Env { var: String },
    /// `secret_file`: the path of a file holding the secret (a mounted Kubernetes secret);
    /// a trailing newline is ignored.
    File { path: PathBuf },
    /// `secret`: the secret inline; for development only, warned about at start.
    Inline { value: String },
}

/// The keys of a secret source as written in the file; [`SecretSource`] takes exactly one.
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with one of secret_env, secret_file, secret"
)]
struct SecretKeys {
    secret_env: Option<String>,
    secret_file: Option<PathBuf>,
    secret: Option<String>,
}

impl TryFrom<SecretKeys> for SecretSource {
    type Error = String;

    fn try_from(keys: SecretKeys) -> Result<Self, String> {
        match keys {
            SecretKeys {
                secret_env: Some(var),
                secret_file: None,
                secret: None,
            } => Ok(Self::Env { var }),
            SecretKeys {
                secret_env: None,
                secret_file: Some(path),
                secret: None,
            } => Ok(Self::File { path }),
            SecretKeys {
                secret_env: None,
                secret_file: None,
                secret: Some(value),
            } => Ok(Self::Inline { value }),
            keys => {
                let found: Vec<&str> = [
                    ("secret_env", keys.secret_env.is_some()),
                    ("secret_file", keys.secret_file.is_some()),
                    ("secret", keys.secret.is_some()),
                ]
                .into_iter()
                .filter_map(|(key, set)| set.then_some(key))
                .collect();
                let found = match found.split_last() {
                    None => "none".to_owned(),
                    Some((last, [])) => (*last).to_owned(),
                    Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                };
                Err(format!(
                    "exactly one of secret_env, secret_file, secret is required, found {found}"
                ))
            }
        }
    }
}

impl Serialize for SecretSource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        match self {
            Self::Env { var } => map.serialize_entry("secret_env", var)?,
            Self::File { path } => map.serialize_entry("secret_file", path)?,
            Self::Inline { .. } => map.serialize_entry("secret", REDACTED)?,
        }
        map.end()
    }
}

impl std::fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Env { var } => f.debug_struct("Env").field("var", var).finish(),
            Self::File { path } => f.debug_struct("File").field("path", path).finish(),
            Self::Inline { .. } => f.debug_struct("Inline").field("value", &REDACTED).finish(),
        }
    }
}

/// What is printed in place of a secret or a password.
const REDACTED: &str = "[redacted]";

/// A token bucket per route.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Sustained requests per second.
    pub per_second: u32,
    /// Bucket size: requests allowed in a burst.
    pub burst: u32,
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
    /// `botix` (default), `standard-webhooks`, `twilio`, `telnyx` or `custom`.
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

impl Config {
    /// Reads, parses and validates a file. No secret is read and nothing is bound.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })
    }

    /// Parses and validates YAML text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let parse_error = |message: String| ConfigError::Parse {
            path: PathBuf::new(),
            message,
        };
        // YAML syntax errors come from the YAML parser (with a line); schema errors come from
        // a second pass over the parsed tree, where serde_path_to_error records the key path
        // of the failing field, so a typo is reported as `limits.max_body_byts`.
        // Strict booleans: in the untyped first pass a YAML 1.1 `YES` or `ON` would become
        // `true`, and `YES` is a default START keyword.
        let mut options = serde_saphyr::Options::default();
        options.strict_booleans = true;
        let mut tree: serde_json::Value = serde_saphyr::from_str_with_options(text, options)
            .map_err(|e| parse_error(e.to_string()))?;
        // What a route leaves out, its profile fills in (Twilio's and Telnyx's fields and
        // guard rules); the generic defaults below apply only where no profile has one.
        profiles::fill_route_defaults(&mut tree).map_err(parse_error)?;
        let deprecations = rename_deprecated(&mut tree);
        amqp::check_written(&tree).map_err(parse_error)?;
        let written = duration::Written::from_tree(&tree);
        let mut config: Config = serde_path_to_error::deserialize(tree).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            parse_error(if path.is_empty() || path == "." {
                inner
            } else {
                format!("{path}: {inner}")
            })
        })?;
        config.written = written;
        config.deprecations = deprecations;
        config.validate()?;
        Ok(config)
    }

    /// Warnings about values read under a former name: the config works, and should be
    /// changed before the name is no longer read.
    pub fn deprecations(&self) -> &[String] {
        &self.deprecations
    }

    /// Rules that span fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if self.routes.is_empty() {
            return invalid("routes: at least one route is required".into());
        }
        let mut paths = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for (i, route) in self.routes.iter().enumerate() {
            let at = format!("routes[{i}]");
            if !route.path.starts_with('/') {
                return invalid(format!("{at}.path: must start with '/'"));
            }
            if !paths.insert(route.path.as_str()) {
                return invalid(format!("{at}.path: {} is used twice", route.path));
            }
            if route.name.is_empty() || !names.insert(route.name.as_str()) {
                return invalid(format!("{at}.name: must be non-empty and unique"));
            }
            // The name starts every store key; in Redis `:` separates a key's parts, and
            // `guard` and `lock` begin the guard state's and the guard locks' keys.
            if route.name.contains(['\0', ':']) || ["guard", "lock"].contains(&route.name.as_str())
            {
                return invalid(format!(
                    "{at}.name: may not contain ':' or NUL, nor be `guard` or `lock`"
                ));
            }
            if route.secrets.is_empty() {
                return invalid(format!("{at}.secrets: at least one secret is required"));
            }
            for (j, s) in route.secrets.iter().enumerate() {
                if matches!(s, SecretSource::Inline { value } if value.is_empty()) {
                    return invalid(format!(
                        "{at}.secrets[{j}].secret: route {}: an empty secret lets anyone sign",
                        route.name
                    ));
                }
            }
            match (route.profile, &route.signature) {
                (Profile::Custom, None) => {
                    return invalid(format!("{at}.signature: required with profile custom"))
                }
                (profile, Some(_)) if profile != Profile::Custom => {
                    return invalid(format!("{at}.signature: only allowed with profile custom"))
                }
                _ => {}
            }
            match (route.profile, &route.public_url) {
                (Profile::Twilio, None) => {
                    return invalid(format!(
                        "{at}.public_url: required with profile twilio (the URL Twilio signs)"
                    ))
                }
                (Profile::Twilio, Some(url)) => {
                    if let Err(reason) = profiles::check_public_url(url) {
                        return invalid(format!("{at}.public_url: {reason}"));
                    }
                }
                (_, Some(_)) => {
                    return invalid(format!("{at}.public_url: only allowed with profile twilio"))
                }
                (_, None) => {}
            }
            if let Some(fields) = &route.fields {
                for (name, ptr) in [
                    ("fields.event_id", &fields.event_id),
                    ("fields.event_type", &fields.event_type),
                    ("fields.timestamp", &fields.timestamp),
                    ("fields.message_id", &fields.message_id),
                ] {
                    check_pointer(&format!("{at}.{name}"), ptr)?;
                }
            }
            if let Some(rl) = &route.rate_limit {
                if rl.per_second == 0 || rl.burst == 0 {
                    return invalid(format!(
                        "{at}.rate_limit: per_second and burst must be positive"
                    ));
                }
            }
            if let Some(st) = &route.guard.status {
                check_pointer(&format!("{at}.guard.status.message_id"), &st.message_id)?;
                check_pointer(&format!("{at}.guard.status.status"), &st.status)?;
            }
            if let Some(kw) = &route.guard.keywords {
                check_pointer(&format!("{at}.guard.keywords.text"), &kw.text)?;
                check_pointer(&format!("{at}.guard.keywords.contact"), &kw.contact)?;
                check_pointer(&format!("{at}.guard.keywords.channel"), &kw.channel)?;
            }
            if let Some(rc) = &route.reconcile {
                if route.profile != Profile::Botix {
                    return invalid(format!(
                        "{at}.reconcile: only with profile botix (the list API it reads)"
                    ));
                }
                rc.validate(&format!("{at}.reconcile"), self.dedup.ttl)
                    .map_err(ConfigError::Invalid)?;
            }
        }
        if self.limits.max_body_bytes == 0 {
            return invalid("limits.max_body_bytes: must be positive".into());
        }
        if self.limits.max_connections == 0 {
            return invalid("limits.max_connections: must be positive".into());
        }
        if self.limits.max_header_bytes < 1024 {
            return invalid("limits.max_header_bytes: must be at least 1KiB".into());
        }
        if self.store.hot_entries < 1024 {
            return invalid("store.hot_entries: must be at least 1024".into());
        }
        if self.store.cache < 1 << 20 {
            return invalid("store.cache: must be at least 1MiB".into());
        }
        if self.store.journal_segment < 64 << 10 {
            return invalid("store.journal_segment: must be at least 64KiB".into());
        }
        if self.store.commit_interval > MAX_COMMIT_INTERVAL {
            return invalid("store.commit_interval: must be at most 100ms".into());
        }
        self.validate_hardening()?;
        if self.dedup.ttl < MIN_DEDUP_TTL {
            return invalid(format!(
                "dedup.ttl: must be at least {MIN_DEDUP_TTL:?} (the state store rewrites its runs once a ttl has passed)"
            ));
        }
        // A request holds its claim while it waits for the guard-key lock (at most
        // `in_flight_wait`), publishes (at most `confirm_timeout`) and, when the publish
        // fails, waits for its spool entry's fsync: a shorter lease lets a second request take
        // a claim whose publish is still under way.
        let held = self.dedup.in_flight_wait + self.amqp.confirm_timeout + SPOOL_FLUSH_WAIT;
        if self.dedup.in_flight_lease <= held {
            return invalid(format!(
                "dedup.in_flight_lease: must be longer than {held:?} (dedup.in_flight_wait + amqp.confirm_timeout + {SPOOL_FLUSH_WAIT:?} for the spool's fsync), or a claim still publishing could be taken over"
            ));
        }
        if self.spool.stall_after <= self.amqp.confirm_timeout {
            return invalid(
                "spool.stall_after: must be longer than amqp.confirm_timeout, or one slow publish would look like a stall".into(),
            );
        }
        if !fits_short_string(&self.amqp.exchange) {
            return invalid(
                "amqp.exchange: must be at most 255 bytes (an AMQP short string)".into(),
            );
        }
        if self.listen.addr == self.admin.addr && self.listen.addr.port() != 0 {
            return invalid("admin.addr: must differ from listen.addr".into());
        }
        self.amqp.validate().map_err(ConfigError::Invalid)?;
        if self.dedup.backend == Backend::Redis {
            self.redis.validate(
                self.dedup.in_flight_lease,
                self.dedup.in_flight_wait,
                self.amqp.confirm_timeout,
            )?;
        }
        Ok(())
    }

    /// Limits that keep unauthenticated clients small (SECURITY.md).
    fn validate_hardening(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        let invalid = |m: &str| Err(ConfigError::Invalid(m.to_owned()));
        if l.h2_max_concurrent_streams == 0 {
            return invalid("limits.h2_max_concurrent_streams: must be positive");
        }
        if l.max_unverified_body_bytes < l.max_body_bytes {
            return invalid(
                "limits.max_unverified_body_bytes: must hold at least one body of limits.max_body_bytes",
            );
        }
        if l.header_read_timeout.is_zero()
            || l.body_read_timeout.is_zero()
            || l.idle_timeout.is_zero()
            || l.max_connection_age.is_zero()
        {
            return invalid("limits: timeouts and max_connection_age must be positive");
        }
        let peer = &l.failed_verification_per_peer;
        if peer.per_second == 0 || peer.burst == 0 {
            return invalid(
                "limits.failed_verification_per_peer: per_second and burst must be positive",
            );
        }
        if !(1..=32).contains(&l.failed_verification_ipv4_prefix) {
            return invalid("limits.failed_verification_ipv4_prefix: must be 1 to 32");
        }
        if !(1..=128).contains(&l.failed_verification_ipv6_prefix) {
            return invalid("limits.failed_verification_ipv6_prefix: must be 1 to 128");
        }
        if let Some(h) = &l.peer_address_header {
            if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                return invalid("limits.peer_address_header: not a valid header name");
            }
        }
        Ok(())
    }

    /// The effective config as YAML with every secret and URL password redacted. Durations
    /// appear as the file wrote them, defaults as docs/configuration.md writes them.
    pub fn redacted_yaml(&self) -> String {
        let mut copy = self.clone();
        copy.amqp = copy.amqp.redacted();
        copy.redis.url = redact_url(&copy.redis.url);
        self.written
            .while_serializing(|| serde_saphyr::to_string(&copy))
            .unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }

    /// The effective config as a JSON tree (durations as in [`Config::redacted_yaml`], sizes
    /// in bytes), secrets included: for comparing the config with its documentation.
    pub fn to_tree(&self) -> Result<serde_json::Value, serde_json::Error> {
        self.written
            .while_serializing(|| serde_json::to_value(self))
    }
}

fn check_pointer(at: &str, ptr: &str) -> Result<(), ConfigError> {
    if ptr.is_empty() || ptr.starts_with('/') {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "{at}: a JSON Pointer must be empty or start with '/', got {ptr:?}"
        )))
    }
}

/// Replaces the password of a URL (`scheme://user:pass@host`) with `[redacted]`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:{REDACTED}@{host}"),
        None => url.to_owned(),
    }
}

/// Parses `250ms`, `5s`, `10m`, `72h`, `7d` (and combinations such as `1h 30m`).
/// Rewrites values the schema reads under a former name to their name, and says which.
fn rename_deprecated(tree: &mut serde_json::Value) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(backend) = tree.pointer_mut("/dedup/backend") {
        if backend == "sled" {
            *backend = "local".into();
            found.push("dedup.backend: `sled` is now called `local`; write `local`".to_owned());
        }
    }
    found
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| format!("invalid duration {text:?}: {e}"))
}

/// Parses `64KiB`, `1GiB`, `500kB` or a plain number of bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    t.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("invalid size {text:?}: {e}"))
}

/// Durations in and out of the file. Out, a duration prints as the file wrote it (`72h`
/// stays `72h`, where a canonical form would say `3days`); a default prints as the configuration
/// table writes it; anything else in the largest unit that keeps it whole.
mod duration {
    use super::*;
    use std::cell::RefCell;

    /// How the defaults are written in docs/configuration.md and `config/`.
    const DEFAULT_TEXTS: [&str; 8] = ["5s", "30s", "10s", "25s", "60s", "5m", "72h", "7d"];

    thread_local! {
        /// The written forms in force while one config serializes on this thread. serde
        /// hands a `with` function only the value, so this is how the texts reach it.
        static IN_FORCE: RefCell<BTreeMap<Duration, String>> = const { RefCell::new(BTreeMap::new()) };
    }

    /// Each duration value of a file with the text it was first written as.
    #[derive(Debug, Clone, Default)]
    pub struct Written(BTreeMap<Duration, String>);

    impl Written {
        /// Collects every string of the parsed file that reads as a duration.
        pub fn from_tree(tree: &serde_json::Value) -> Self {
            let mut texts = BTreeMap::new();
            for text in DEFAULT_TEXTS {
                if let Ok(d) = parse_duration(text) {
                    texts.insert(d, text.to_owned());
                }
            }
            let mut written = BTreeMap::new();
            collect(tree, &mut written);
            // What the file wrote wins over how the docs write a default of equal value.
            texts.extend(written);
            Self(texts)
        }

        /// Runs `render` with these texts in force for [`serialize`].
        pub fn while_serializing<T>(&self, render: impl FnOnce() -> T) -> T {
            let texts = if self.0.is_empty() {
                Self::from_tree(&serde_json::Value::Null).0
            } else {
                self.0.clone()
            };
            let previous = IN_FORCE.with(|m| std::mem::replace(&mut *m.borrow_mut(), texts));
            let out = render();
            IN_FORCE.with(|m| *m.borrow_mut() = previous);
            out
        }
    }

    fn collect(tree: &serde_json::Value, into: &mut BTreeMap<Duration, String>) {
        match tree {
            serde_json::Value::String(text) => {
                if let Ok(d) = parse_duration(text) {
                    into.entry(d).or_insert_with(|| text.trim().to_owned());
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| collect(v, into)),
            serde_json::Value::Object(map) => map.values().for_each(|v| collect(v, into)),
            _ => {}
        }
    }

    /// The text of `d`: as written, else in the largest unit that keeps it whole.
    pub fn text(d: Duration) -> String {
        if let Some(t) = IN_FORCE.with(|m| m.borrow().get(&d).cloned()) {
            return t;
        }
        if !d.subsec_nanos().is_multiple_of(1_000_000) {
            return humantime::format_duration(d).to_string();
        }
        let ms = d.as_millis();
        for (unit, per) in [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1000),
        ] {
            if ms > 0 && ms.is_multiple_of(per) {
                return format!("{}{unit}", ms / per);
            }
        }
        format!("{ms}ms")
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s).map_err(de::Error::custom)
    }
    pub fn serialize<S: serde::Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&text(*v))
    }
}

mod opt_duration {
    use super::*;
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        s.map(|s| parse_duration(&s).map_err(de::Error::custom))
            .transpose()
    }
    pub fn serialize<S: serde::Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_str(&duration::text(*v)),
            None => s.serialize_none(),
        }
    }
}

mod size {
    use super::*;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(u64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(n),
            Raw::Text(s) => parse_size(&s).map_err(de::Error::custom),
        }
    }
    /// Out, a size prints in the largest unit that keeps it whole, binary (`64KiB`, `1GiB`)
    /// before decimal (`5MB`), as sizes are written in files; otherwise as a number of bytes.
    pub fn serialize<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        match unit_text(*v) {
            Some(text) => s.serialize_str(&text),
            None => s.serialize_u64(*v),
        }
    }

    /// `v` in the largest unit that divides it, if one does.
    fn unit_text(v: u64) -> Option<String> {
        const UNITS: [(u64, &str); 8] = [
            (1 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
            (1_000_000_000_000, "TB"),
            (1_000_000_000, "GB"),
            (1_000_000, "MB"),
            (1_000, "kB"),
        ];
        if v == 0 {
            return None;
        }
        UNITS
            .iter()
            .find(|(unit, _)| v.is_multiple_of(*unit))
            .map(|(unit, name)| format!("{}{name}", v / unit))
    }

    /// How `v` prints: [`unit_text`], else the number of bytes.
    #[cfg(test)]
    pub fn text(v: u64) -> String {
        unit_text(v).unwrap_or_else(|| v.to_string())
    }
}

// The defaults of keys in sections that also have required keys (`Config`, `Route`,
// `StatusGuard`, `KeywordGuard`) are given per key: a section-wide `#[serde(default)]` would
// fill the required keys too. Every other section takes its defaults from its `Default`.
fn default_clock_skew() -> Duration {
    Duration::from_secs(300)
}
fn default_shutdown_grace() -> Duration {
    Duration::from_secs(25)
}
fn default_reload_poll() -> Duration {
    Duration::from_secs(2)
}
fn default_message_id_ptr() -> String {
    "/data/message_id".into()
}
fn default_status_ptr() -> String {
    "/data/status".into()
}
fn default_ranks() -> BTreeMap<String, u32> {
    profiles::DEFAULT_RANKS
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
    words(&profiles::DEFAULT_STOP)
}
fn default_start_words() -> Vec<String> {
    words(&profiles::DEFAULT_START)
}
fn default_help_words() -> Vec<String> {
    words(&profiles::DEFAULT_HELP)
}
fn default_help_window() -> Duration {
    Duration::from_secs(60)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "
listen:
  addr: 127.0.0.1:8080
routes:
  - name: botix
    path: /webhooks/botix
    secrets:
      - secret_env: BOTIX_WEBHOOK_SECRET
";

    fn err(text: &str) -> String {
        match Config::parse(text) {
            Ok(_) => panic!("config was accepted: {text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn minimal_config_gets_spec_defaults() {
        let c = Config::parse(MINIMAL).expect("minimal config parses");
        assert_eq!(c.limits.max_body_bytes, 65536);
        assert_eq!(c.dedup.ttl, Duration::from_secs(72 * 3600));
        assert_eq!(c.amqp.exchange, "webhooks");
        assert_eq!(c.amqp.routing_key, "{event}");
        assert_eq!(c.max_clock_skew, Duration::from_secs(300));
        assert_eq!(c.shutdown_grace, Duration::from_secs(25));
        assert_eq!(c.reload_poll, Duration::from_secs(2));
        assert_eq!(c.spool.max_bytes, 1 << 30);
        assert_eq!(c.routes[0].fields.as_ref().expect("fields").event_id, "/id");
        assert_eq!(c.routes[0].profile, Profile::Botix);
    }

    #[test]
    fn unknown_key_is_named_with_its_path() {
        let text = format!("{MINIMAL}limits:\n  max_body_byts: 10\n");
        let e = err(&text);
        assert!(e.contains("limits.max_body_byts"), "{e}");
    }

    #[test]
    fn unknown_nested_route_key_is_named() {
        let text = MINIMAL.replace("    path:", "    pth: x\n    path:");
        let e = err(&text);
        assert!(e.contains("routes[0].pth"), "{e}");
    }

    #[test]
    fn durations_and_sizes_in_human_form() {
        let text = format!(
            "{MINIMAL}limits:\n  max_body_bytes: 1KiB\n  header_read_timeout: 250ms\ndedup:\n  ttl: 7d\nspool:\n  max_bytes: 2048\n"
        );
        let c = Config::parse(&text).expect("parses");
        assert_eq!(c.limits.max_body_bytes, 1024);
        assert_eq!(c.limits.header_read_timeout, Duration::from_millis(250));
        assert_eq!(c.dedup.ttl, Duration::from_secs(7 * 86400));
        assert_eq!(c.spool.max_bytes, 2048);
    }

    #[test]
    fn spool_stall_after_and_exchange_length_are_checked() {
        let c = Config::parse(MINIMAL).expect("minimal config parses");
        assert_eq!(c.spool.stall_after, Duration::from_secs(30));
        let c = Config::parse(&format!("{MINIMAL}spool:\n  stall_after: 2m\n")).expect("parses");
        assert_eq!(c.spool.stall_after, Duration::from_secs(120));
        let e = err(&format!("{MINIMAL}spool:\n  stall_after: 5s\n"));
        assert!(e.contains("spool.stall_after"), "{e}");
        let long = "x".repeat(256);
        let e = err(&format!("{MINIMAL}amqp:\n  exchange: {long}\n"));
        assert!(e.contains("amqp.exchange"), "{e}");
    }

    #[test]
    fn bad_duration_is_rejected_with_its_key() {
        let e = err(&format!("{MINIMAL}dedup:\n  ttl: forever\n"));
        assert!(e.contains("dedup.ttl"), "{e}");
    }

    #[test]
    fn secret_source_needs_exactly_one_key() {
        for (source, found) in [
            (
                "- secret_env: A\n        secret_file: /b",
                "found secret_env and secret_file",
            ),
            ("- {}", "found none"),
            ("- secret: ~", "found none"),
        ] {
            let text = MINIMAL.replace("- secret_env: BOTIX_WEBHOOK_SECRET", source);
            let e = err(&text);
            assert!(
                e.contains("routes[0].secrets[0]: exactly one of secret_env, secret_file, secret")
                    && e.contains(found),
                "{e}"
            );
        }
    }

    #[test]
    fn secret_sources_read_and_print_as_written_but_an_inline_value_never_prints() {
        let text = MINIMAL.replace(
            "- secret_env: BOTIX_WEBHOOK_SECRET",
            "- secret_env: A\n      - secret_file: /b\n      - secret: topsecretvalue",
        );
        let c = Config::parse(&text).expect("parses");
        assert_eq!(
            c.routes[0].secrets,
            [
                SecretSource::Env { var: "A".into() },
                SecretSource::File { path: "/b".into() },
                SecretSource::Inline {
                    value: "topsecretvalue".into()
                },
            ]
        );
        let out = c.redacted_yaml();
        for line in ["secret_env: A", "secret_file: /b", "secret: \"[redacted]\""] {
            assert!(out.contains(line), "{line} missing in:\n{out}");
        }
        let debug = format!("{:?}", c.routes[0].secrets);
        assert!(
            !debug.contains("topsecretvalue") && debug.contains("/b"),
            "{debug}"
        );
    }

    #[test]
    fn route_names_cannot_make_store_keys_ambiguous() {
        for name in ["bo:tix", "guard", "lock", r"a\0b"] {
            let text = MINIMAL.replace("name: botix", &format!("name: \"{name}\""));
            assert!(err(&text).contains("routes[0].name"), "{name}");
        }
    }

    #[test]
    fn hardening_limits_have_defaults_and_are_checked() {
        let c = Config::parse(MINIMAL).expect("parses");
        let l = &c.limits;
        assert_eq!(l.idle_timeout, Duration::from_secs(60));
        assert_eq!(l.max_connection_age, Duration::from_secs(600));
        assert_eq!(l.h2_max_concurrent_streams, 16);
        assert_eq!(l.max_unverified_body_bytes, 32 << 20);
        assert_eq!(
            (
                l.failed_verification_per_peer.per_second,
                l.failed_verification_per_peer.burst
            ),
            (5, 20)
        );
        assert_eq!(
            (
                l.failed_verification_ipv4_prefix,
                l.failed_verification_ipv6_prefix
            ),
            (32, 64)
        );
        assert_eq!(
            l.peer_address_header, None,
            "no proxy is trusted by default"
        );
        for (extra, named) in [
            (
                "  max_unverified_body_bytes: 1KiB\n",
                "max_unverified_body_bytes",
            ),
            (
                "  h2_max_concurrent_streams: 0\n",
                "h2_max_concurrent_streams",
            ),
            ("  idle_timeout: 0s\n", "timeouts"),
            (
                "  peer_address_header: \"bad header\"\n",
                "peer_address_header",
            ),
            (
                "  failed_verification_per_peer: {per_second: 0, burst: 1}\n",
                "failed_verification_per_peer",
            ),
            (
                "  failed_verification_ipv4_prefix: 0\n",
                "failed_verification_ipv4_prefix: must be 1 to 32",
            ),
            (
                "  failed_verification_ipv4_prefix: 33\n",
                "failed_verification_ipv4_prefix: must be 1 to 32",
            ),
            (
                "  failed_verification_ipv6_prefix: 0\n",
                "failed_verification_ipv6_prefix: must be 1 to 128",
            ),
            (
                "  failed_verification_ipv6_prefix: 129\n",
                "failed_verification_ipv6_prefix: must be 1 to 128",
            ),
        ] {
            let e = err(&format!("{MINIMAL}limits:\n{extra}"));
            assert!(e.contains(named), "{e}");
        }
    }

    #[test]
    fn unsigned_header_fallbacks_are_opt_in() {
        let c = Config::parse(MINIMAL).expect("parses");
        assert!(
            !c.routes[0]
                .fields
                .as_ref()
                .expect("fields")
                .unsigned_header_fallbacks
        );
        let text = MINIMAL.replace(
            "    secrets:",
            "    fields:\n      unsigned_header_fallbacks: true\n    secrets:",
        );
        let c = Config::parse(&text).expect("parses");
        assert!(
            c.routes[0]
                .fields
                .as_ref()
                .expect("fields")
                .unsigned_header_fallbacks
        );
    }

    #[test]
    fn an_empty_inline_secret_is_refused_naming_route_and_source() {
        let text = MINIMAL.replace(
            "- secret_env: BOTIX_WEBHOOK_SECRET",
            "- secret: long-enough-secret-1234\n      - secret: \"\"",
        );
        let e = err(&text);
        assert!(
            e.contains("routes[0].secrets[1].secret") && e.contains("route botix"),
            "{e}"
        );
    }

    #[test]
    fn custom_profile_needs_its_scheme() {
        let text = MINIMAL.replace("    secrets:", "    profile: custom\n    secrets:");
        assert!(err(&text).contains("signature"));
    }

    #[test]
    fn twilio_needs_a_public_url_and_only_twilio_takes_one() {
        let twilio = MINIMAL.replace("    secrets:", "    profile: twilio\n    secrets:");
        assert!(err(&twilio).contains("public_url: required"));
        let bad = twilio.replace(
            "    secrets:",
            "    public_url: https://h.example/t?x=1\n    secrets:",
        );
        assert!(err(&bad).contains("public_url"));
        let ok = twilio.replace(
            "    secrets:",
            "    public_url: https://h.example/t\n    secrets:",
        );
        let c = Config::parse(&ok).expect("parses");
        let route = &c.routes[0];
        assert_eq!(route.profile, Profile::Twilio);
        assert!(route.fields.is_none(), "Twilio reads its own fields");
        assert!(
            !c.redacted_yaml().contains("fields"),
            "{}",
            c.redacted_yaml()
        );
        let status = route.guard.status.as_ref().expect("Twilio's status rules");
        assert_eq!(
            (status.message_id.as_str(), status.status.as_str()),
            ("/MessageSid", "/MessageStatus")
        );
        assert_eq!(status.ranks["sent"], 3);
        assert_eq!(status.ranks["delivered"], 4);
        let keywords = route
            .guard
            .keywords
            .as_ref()
            .expect("Twilio's keyword rules");
        assert_eq!(keywords.text, "/Body");
        assert_eq!(keywords.stop, profiles::DEFAULT_STOP.to_vec());
        let elsewhere = MINIMAL.replace(
            "    secrets:",
            "    public_url: https://h.example/t\n    secrets:",
        );
        assert!(err(&elsewhere).contains("only allowed with profile twilio"));
    }

    #[test]
    fn telnyx_routes_read_telnyx_fields_unless_told_otherwise() {
        let telnyx = MINIMAL.replace("    secrets:", "    profile: telnyx\n    secrets:");
        let c = Config::parse(&telnyx).expect("parses");
        let route = &c.routes[0];
        let fields = route.fields.as_ref().expect("fields");
        assert_eq!(fields.event_id, "/data/id");
        assert_eq!(fields.timestamp, "/data/occurred_at");
        let status = route.guard.status.as_ref().expect("status rules");
        assert_eq!(status.status, "/data/payload/to/0/status");
        assert_eq!(status.ranks["delivery_failed"], 3);
        let own = telnyx.replace(
            "    secrets:",
            "    fields:\n      event_id: /data/payload/id\n    guard: {}\n    secrets:",
        );
        let c = Config::parse(&own).expect("parses");
        let fields = c.routes[0].fields.as_ref().expect("fields");
        assert_eq!(fields.event_id, "/data/payload/id");
        assert_eq!(fields.event_type, "/data/event_type");
        assert!(c.routes[0].guard.status.is_none() && c.routes[0].guard.keywords.is_none());
    }

    /// Each refusal of `validate`, one config a row: what is wrong, and the key the error
    /// must name. A row whose config is accepted, or refused for another key, fails.
    #[test]
    fn each_refusal_names_its_key() {
        let route = |extra: &str| MINIMAL.replace("    secrets:", &format!("{extra}    secrets:"));
        let second_route = |name: &str, path: &str| {
            format!("{MINIMAL}  - name: \"{name}\"\n    path: {path}\n    secrets:\n      - secret: x\n")
        };
        let rows: Vec<(&str, String, &str)> = vec![
            (
                "empty route name",
                MINIMAL.replace("name: botix", "name: \"\""),
                "routes[0].name",
            ),
            (
                "a second route with the first's name",
                second_route("botix", "/other"),
                "routes[1].name",
            ),
            (
                "a path without a leading slash",
                MINIMAL.replace("path: /webhooks/botix", "path: webhooks"),
                "routes[0].path",
            ),
            (
                "a signature block with the botix profile",
                route("    signature: {header: x-sig, encoding: hex}\n"),
                "routes[0].signature",
            ),
            (
                "a public_url with the botix profile",
                route("    public_url: https://example.org/hook\n"),
                "routes[0].public_url",
            ),
            (
                "a rate limit of zero per second",
                route("    rate_limit: {per_second: 0, burst: 5}\n"),
                "routes[0].rate_limit",
            ),
            (
                "a rate limit with no burst",
                route("    rate_limit: {per_second: 5, burst: 0}\n"),
                "routes[0].rate_limit",
            ),
            (
                "a zero body limit",
                format!("{MINIMAL}limits: {{max_body_bytes: 0}}\n"),
                "limits.max_body_bytes",
            ),
            (
                "no connections",
                format!("{MINIMAL}limits: {{max_connections: 0}}\n"),
                "limits.max_connections",
            ),
            (
                "a hot set under 1024 entries",
                format!("{MINIMAL}store: {{hot_entries: 1023}}\n"),
                "store.hot_entries",
            ),
            (
                "a sled cache under 1MiB",
                format!("{MINIMAL}store: {{cache: 1000KiB}}\n"),
                "store.cache",
            ),
            (
                "a journal segment under 64KiB",
                format!("{MINIMAL}store: {{journal_segment: 63KiB}}\n"),
                "store.journal_segment",
            ),
            (
                "a commit interval over 100ms",
                format!("{MINIMAL}store: {{commit_interval: 101ms}}\n"),
                "store.commit_interval",
            ),
            (
                "a header limit under 1KiB",
                format!("{MINIMAL}limits: {{max_header_bytes: 1000}}\n"),
                "limits.max_header_bytes",
            ),
            (
                "a lease no longer than the confirm timeout",
                format!("{MINIMAL}dedup: {{in_flight_lease: 5s}}\namqp: {{confirm_timeout: 5s}}\n"),
                "dedup.in_flight_lease",
            ),
            (
                "a lease no longer than the lock wait, the publish and the spool's fsync",
                format!("{MINIMAL}dedup: {{in_flight_lease: 15s, in_flight_wait: 5s}}\namqp: {{confirm_timeout: 5s}}\n"),
                "dedup.in_flight_lease: must be longer than 15s",
            ),
            (
                "a zero dedup ttl",
                format!("{MINIMAL}dedup: {{ttl: 0s}}\n"),
                "dedup.ttl: must be at least 1s",
            ),
            (
                "a dedup ttl under a second",
                format!("{MINIMAL}dedup: {{ttl: 999ms}}\n"),
                "dedup.ttl",
            ),
            (
                "the admin listener on the webhook address",
                format!("{MINIMAL}admin: {{addr: 127.0.0.1:8080}}\n"),
                "admin.addr",
            ),
            (
                "a broker URL of another scheme",
                format!("{MINIMAL}amqp: {{url: http://x}}\n"),
                "amqp.url",
            ),
            ("no HTTP/2 streams", format!("{MINIMAL}limits: {{h2_max_concurrent_streams: 0}}\n"), "limits.h2_max_concurrent_streams"),
            (
                "an unverified budget smaller than one body",
                format!("{MINIMAL}limits: {{max_body_bytes: 2KiB, max_unverified_body_bytes: 1KiB}}\n"),
                "limits.max_unverified_body_bytes",
            ),
            ("no header read time", format!("{MINIMAL}limits: {{header_read_timeout: 0s}}\n"), "limits: timeouts"),
            ("no body read time", format!("{MINIMAL}limits: {{body_read_timeout: 0s}}\n"), "limits: timeouts"),
            ("no idle time", format!("{MINIMAL}limits: {{idle_timeout: 0s}}\n"), "limits: timeouts"),
            ("no connection age", format!("{MINIMAL}limits: {{max_connection_age: 0s}}\n"), "limits: timeouts"),
            (
                "no failed verifications per second",
                format!("{MINIMAL}limits: {{failed_verification_per_peer: {{per_second: 0, burst: 5}}}}\n"),
                "limits.failed_verification_per_peer",
            ),
            (
                "no burst of failed verifications",
                format!("{MINIMAL}limits: {{failed_verification_per_peer: {{per_second: 5, burst: 0}}}}\n"),
                "limits.failed_verification_per_peer",
            ),
            (
                "a Redis URL of another scheme",
                format!("{MINIMAL}dedup: {{backend: redis}}\nredis: {{url: http://x}}\n"),
                "redis.url",
            ),
        ];
        for (what, text, key) in rows {
            let error = match Config::parse(&text) {
                Ok(_) => panic!("{what}: accepted"),
                Err(e) => e.to_string(),
            };
            assert!(error.contains(key), "{what}: {error}");
        }
        // The limits' edges are allowed.
        let header_at_limit = format!("{MINIMAL}limits: {{max_header_bytes: 1024}}\n");
        assert!(Config::parse(&header_at_limit).is_ok());
        let store_at_limits =
            format!("{MINIMAL}store: {{hot_entries: 1024, cache: 1MiB, journal_segment: 64KiB, commit_interval: 100ms}}\n");
        assert!(Config::parse(&store_at_limits).is_ok());
        let shortest_ttl = format!("{MINIMAL}dedup: {{ttl: 1s}}\n");
        assert!(Config::parse(&shortest_ttl).is_ok());
        let shortest_lease = format!(
            "{MINIMAL}dedup: {{in_flight_lease: 15001ms, in_flight_wait: 5s}}\namqp: {{confirm_timeout: 5s}}\n"
        );
        assert!(Config::parse(&shortest_lease).is_ok());
        let commits_back_to_back = format!("{MINIMAL}store: {{commit_interval: 0s}}\n");
        assert!(Config::parse(&commits_back_to_back).is_ok());
        let budget_of_one_body =
            format!("{MINIMAL}limits: {{max_body_bytes: 2KiB, max_unverified_body_bytes: 2KiB}}\n");
        assert!(Config::parse(&budget_of_one_body).is_ok());
        // `sled`, the local backend's former name, is read as `local`, with a warning.
        let former = Config::parse(&format!("{MINIMAL}dedup: {{backend: sled}}\n")).expect("sled");
        assert_eq!(former.dedup.backend, Backend::Local);
        assert_eq!(
            former.deprecations().len(),
            1,
            "{:?}",
            former.deprecations()
        );
        let current =
            Config::parse(&format!("{MINIMAL}dedup: {{backend: local}}\n")).expect("local");
        assert_eq!(current.dedup.backend, Backend::Local);
        assert!(current.deprecations().is_empty());
        // A Redis URL is checked only where Redis is used, and both of its schemes pass.
        for (backend, url) in [
            ("local", "http://x"),
            ("redis", "redis://r:6379"),
            ("redis", "rediss://r:6380"),
        ] {
            let text =
                format!("{MINIMAL}dedup: {{backend: {backend}}}\nredis: {{url: \"{url}\"}}\n");
            assert!(Config::parse(&text).is_ok(), "{backend} with {url}");
        }
        // The admin listener may share port 0 (tests bind both on any free port).
        let both_any =
            MINIMAL.replace("127.0.0.1:8080", "127.0.0.1:0") + "admin: {addr: 127.0.0.1:0}\n";
        assert!(Config::parse(&both_any).is_ok());
    }

    #[test]
    fn duplicate_paths_and_empty_routes_are_rejected() {
        assert!(err("listen:\n  addr: 127.0.0.1:1\nroutes: []\n").contains("at least one"));
        let twice = format!(
            "{MINIMAL}  - name: other\n    path: /webhooks/botix\n    secrets:\n      - secret: x\n"
        );
        assert!(err(&twice).contains("used twice"));
    }

    #[test]
    fn yaml_1_1_booleans_in_keyword_lists_stay_words() {
        let text = format!(
            "{MINIMAL}    guard:\n      keywords:\n        events: [message.received]\n        start: [YES, ON, Si]\n"
        );
        let c = Config::parse(&text).expect("parses");
        let kw = c.routes[0].guard.keywords.as_ref().expect("keywords");
        assert_eq!(kw.start, vec!["YES", "ON", "Si"]);
        assert_eq!(kw.stop, profiles::DEFAULT_STOP.to_vec());
    }

    #[test]
    fn redacted_yaml_hides_secrets_and_passwords() {
        let text = MINIMAL.replace(
            "- secret_env: BOTIX_WEBHOOK_SECRET",
            "- secret: topsecretvalue",
        );
        let c = Config::parse(&text).expect("parses");
        let out = c.redacted_yaml();
        assert!(!out.contains("topsecretvalue"), "{out}");
        assert!(!out.contains("guest:guest"), "{out}");
        assert!(out.contains("[redacted]"), "{out}");
    }

    #[test]
    fn durations_print_as_written_and_defaults_as_documented() {
        let text =
            format!("{MINIMAL}dedup:\n  ttl: 72h\n  in_flight_lease: 1m\nmax_clock_skew: 90s\n");
        let out = Config::parse(&text).expect("parses").redacted_yaml();
        for line in [
            "ttl: 72h",
            "in_flight_lease: 1m",
            "max_clock_skew: 90s",
            "shutdown_grace: 25s",
            "confirm_timeout: 5s",
        ] {
            assert!(out.contains(line), "{line} missing in:\n{out}");
        }
        assert!(!out.contains("days"), "{out}");
        assert_eq!(duration::text(Duration::from_millis(1500)), "1500ms");
        assert_eq!(duration::text(Duration::from_secs(2 * 86400)), "2d");
    }

    #[test]
    fn sizes_print_in_the_units_they_are_written_in() {
        let text = format!(
            "{MINIMAL}limits:\n  max_body_bytes: 64KiB\n  max_header_bytes: 1500\nspool:\n  max_bytes: 1GiB\nstore:\n  cache: 5MB\n"
        );
        let out = Config::parse(&text).expect("parses").redacted_yaml();
        for line in [
            "max_body_bytes: 64KiB",
            "max_header_bytes: 1500",
            "max_bytes: 1GiB",
            "cache: 5MB",
            "max_unverified_body_bytes: 32MiB",
        ] {
            assert!(out.contains(line), "{line} missing in:\n{out}");
        }
        // What is printed reads back as the same value.
        for bytes in [0, 1, 1023, 1024, 3 << 30, 5_000_000, 1_000_000_000_000] {
            assert_eq!(parse_size(&size::text(bytes)), Ok(bytes), "{bytes}");
        }
    }

    /// Every optional section set, so that every key of the schema is in the tree.
    const EVERY_KEY: &str = "
listen:
  addr: 127.0.0.1:8443
  tls: {cert: /tls/crt, key: /tls/key}
amqp: {url_env: AMQP_URL, dropped_routing_key: 'dropped.{event}'}
limits: {peer_address_header: x-forwarded-for}
redis: {url_env: REDIS_URL, sentinels: [s1.example:26379], master_name: main, sentinel_password_env: SENTINEL_PASSWORD, sentinel_password_file: /run/sentinel, cluster_nodes: [c1.example:7000]}
routes:
  - name: r
    path: /r
    profile: custom
    signature: {header: x-sig, prefix: 'sha256=', encoding: hex}
    rate_limit: {per_second: 1, burst: 1}
    secrets: [{secret_env: A}, {secret_file: /f}, {secret: s}]
    guard:
      status: {events: [a]}
      keywords: {events: [b], retention: 30d}
  - name: t
    path: /t
    profile: twilio
    public_url: https://hooks.example.com/t
    secrets: [{secret_env: T}]
  - name: e
    path: /e
    secrets: [{secret_env: E}]
    reconcile: {url: 'https://api.example/m', token_env: K}
  - name: f
    path: /f
    secrets: [{secret_env: F}]
    reconcile: {url: 'https://api.example/m', token_file: /k}
";

    /// Only what is required, plus the sections whose keys have defaults of their own.
    const DEFAULTS: &str = "
listen:
  addr: 127.0.0.1:8443
routes:
  - name: r
    path: /r
    secrets: [{secret_env: A}]
    guard:
      status: {events: [a]}
      keywords: {events: [b]}
    reconcile: {url: 'https://api.example/m', token_env: K}
";

    /// (key, default cell) of each row of the table of docs/configuration.md.
    fn documented_rows() -> Vec<(String, String)> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
        let doc = std::fs::read_to_string(path).expect("docs/configuration.md");
        let start = doc.find("\n## Every key").expect("an Every key section");
        let section = &doc[start + 1..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        section
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
            })
            .collect()
    }

    /// The keys (paths such as `routes[].guard.status.ranks`) of a config tree; a documented
    /// key is not descended into (ranks is a map of free keys).
    fn keys_of(tree: &serde_json::Value, path: &str, documented: &[String], out: &mut Vec<String>) {
        use serde_json::Value;
        if !path.is_empty() && documented.iter().any(|k| k == path) {
            out.push(path.to_owned());
            return;
        }
        match tree {
            Value::Object(map) => {
                for (k, v) in map {
                    let sub = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    keys_of(v, &sub, documented, out);
                }
            }
            Value::Array(items) if items.iter().any(Value::is_object) => {
                for item in items {
                    keys_of(item, &format!("{path}[]"), documented, out);
                }
            }
            // Unset here; EVERY_KEY sets every optional key in some route.
            Value::Null => {}
            _ => out.push(path.to_owned()),
        }
    }

    /// The value at a documented key path; `[]` takes the first element.
    fn at<'a>(tree: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
        key.split('.')
            .try_fold(tree, |node, part| match part.strip_suffix("[]") {
                Some(name) => node.get(name)?.get(0),
                None => node.get(part),
            })
    }

    /// Whether the `documented` default (the text between backticks) is `actual`.
    fn same_default(documented: &str, actual: &serde_json::Value) -> bool {
        use serde_json::Value;
        if actual.as_str() == Some(documented) {
            return true;
        }
        let mut options = serde_saphyr::Options::default();
        options.strict_booleans = true;
        let Ok(written) = serde_saphyr::from_str_with_options::<Value>(documented, options) else {
            return false;
        };
        match (&written, actual) {
            (Value::String(w), Value::String(a)) => match (parse_duration(w), parse_duration(a)) {
                (Ok(w), Ok(a)) => w == a,
                _ => false,
            },
            (Value::String(w), Value::Number(a)) => parse_size(w).ok() == a.as_u64(),
            _ => written == *actual,
        }
    }

    /// The configuration table and the schema cannot drift: every key of the schema
    /// has a row, every row is a key, and every default in the table is the default the code
    /// applies.
    #[test]
    fn the_configuration_table_matches_the_schema_and_its_defaults() {
        let rows = documented_rows();
        let documented: Vec<String> = rows.iter().map(|(k, _)| k.clone()).collect();
        let every = Config::parse(EVERY_KEY)
            .expect("EVERY_KEY parses")
            .to_tree()
            .expect("tree");
        let mut keys = Vec::new();
        keys_of(&every, "", &documented, &mut keys);
        // Several broker nodes exclude one: their keys come from a config of their own.
        let cluster = Config::parse(
            "listen: {addr: 127.0.0.1:8443}\namqp: {urls_env: AMQP_URLS}\nroutes: [{name: r, path: /r, secrets: [{secret_env: A}]}]\n",
        )
        .expect("the cluster keys parse")
        .to_tree()
        .expect("tree");
        keys_of(&cluster, "", &documented, &mut keys);
        keys.sort();
        keys.dedup();
        let mut problems = Vec::new();
        for key in &keys {
            if !documented.contains(key) {
                problems.push(format!("{key}: in the schema, not in the table"));
            }
        }
        let defaults = Config::parse(DEFAULTS)
            .expect("DEFAULTS parses")
            .to_tree()
            .expect("tree");
        for (key, cell) in &rows {
            if !keys.contains(key) {
                problems.push(format!("{key}: in the table, not in the schema"));
                continue;
            }
            let actual = at(&defaults, key).filter(|v| !v.is_null());
            match (cell.as_str(), actual) {
                ("required" | "one of two" | "one of three", _) | ("unset", None) => {}
                ("unset", Some(v)) => problems.push(format!("{key}: documented unset, code {v}")),
                (cell, actual) => match (cell.strip_prefix('`').and_then(|c| c.strip_suffix('`')), actual) {
                    (Some(doc), Some(v)) if same_default(doc, v) => {}
                    (Some(doc), v) => problems.push(format!("{key}: documented {doc}, code {v:?}")),
                    (None, _) => problems.push(format!(
                        "{key}: the default cell must be required, unset, one of three or one `value`, not {cell:?}"
                    )),
                },
            }
        }
        assert!(
            problems.is_empty(),
            "docs/configuration.md:\n{}",
            problems.join("\n")
        );
        assert!(rows.len() > 40, "only {} rows found", rows.len());
    }

    #[test]
    fn every_shipped_config_file_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("config dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                seen += 1;
            }
        }
        assert!(seen >= 1, "no config files found in {}", dir.display());
    }
}
