//! The schema of the file's sections (serde structs) and their defaults; one route's
//! schema is in `route.rs`.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::redis::Redis;
use super::route::{default_clock_skew, RateLimit, Route};
use super::units::{duration, positive, size};

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
    pub(super) written: duration::Written,
    /// Values read under a name they no longer have (see [`Config::deprecations`]).
    #[serde(skip)]
    pub(super) deprecations: Vec<String>,
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
    /// under load. Default 0s: each commit starts as the one before ends, which the figures
    /// in BENCHMARKS.md ("Group commit") chose. At most 100ms.
    #[serde(with = "duration")]
    pub commit_interval: Duration,
    /// A background thread of the stores that has been in one step this long (the state
    /// journal's writer or the spool's writer in one commit, a hung `fsync` say; the spool's
    /// drainer without a beat) makes `/healthz` answer 503, so the liveness probe restarts
    /// the process. Must exceed `amqp.confirm_timeout` and the longest `fsync` a loaded disk
    /// takes. Default 2m.
    #[serde(with = "duration")]
    pub hung_after: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("/var/lib/hookgate"),
            cache: 32 << 20,
            hot_entries: 65_536,
            journal_segment: 4 << 20,
            commit_interval: Duration::ZERO,
            hung_after: Duration::from_secs(120),
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
    /// A queue to declare (durable) at start and bind to the exchange, so the events have
    /// a queue to land in from the first one. Default unset: no queue is declared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<AmqpQueue>,
}

/// A queue hookgate declares at start and binds to its exchange (`amqp.queue`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpQueue {
    /// The queue's name. Required.
    pub name: String,
    /// `quorum` (replicated over the nodes of a RabbitMQ cluster, which a classic queue is
    /// not) or `classic`. Default `quorum`.
    #[serde(rename = "type", default)]
    pub kind: QueueKind,
    /// The binding key; unset binds `#`, every routing key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
}

/// The type of a declared queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueKind {
    /// A quorum queue: its messages live on a majority of the cluster's nodes.
    #[default]
    Quorum,
    /// A classic queue, on one node.
    Classic,
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
            queue: None,
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
    #[serde(with = "size::positive")]
    pub max_body_bytes: NonZeroU64,
    /// Concurrent connections; more are refused. Default 10000.
    #[serde(deserialize_with = "positive::deserialize")]
    pub max_connections: NonZeroUsize,
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
    #[serde(deserialize_with = "positive::deserialize")]
    pub h2_max_concurrent_streams: NonZeroU32,
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
            max_body_bytes: NonZeroU64::new(64 * 1024).unwrap_or(NonZeroU64::MIN),
            max_connections: NonZeroUsize::new(10_000).unwrap_or(NonZeroUsize::MIN),
            max_header_bytes: 16 * 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connection_age: Duration::from_secs(600),
            h2_max_concurrent_streams: NonZeroU32::new(16).unwrap_or(NonZeroU32::MIN),
            max_unverified_body_bytes: 32 << 20,
            failed_verification_per_peer: RateLimit {
                per_second: NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN),
                burst: NonZeroU32::new(20).unwrap_or(NonZeroU32::MIN),
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

// The defaults of `Config`'s keys are given per key: a section-wide `#[serde(default)]` would
// fill the required keys too. Every other section takes its defaults from its `Default`.
fn default_shutdown_grace() -> Duration {
    Duration::from_secs(25)
}
fn default_reload_poll() -> Duration {
    Duration::from_secs(2)
}
