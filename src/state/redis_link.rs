//! The connection to Redis in its three topologies: one server, a master found through
//! Sentinel, or a Redis Cluster. A connection that fails in a way a new one may cure (dropped,
//! refused, silent, or a master demoted to a read-only replica by a failover) is dropped, and
//! the next call connects anew: with Sentinel that asks the sentinels for the master again.
//!
//! Beside the shared connection, `WAIT` has connections of its own ([`Link::exclusive`]):
//! a `WAIT` blocks the connection it runs on until the replicas answer or its timeout
//! passes, so a pipeline that ends in one takes a connection nobody else sends on meanwhile,
//! and a lagging replica costs only the requests that wait for it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, IntoConnectionInfo, Pipeline, RedisFuture,
    RedisResult, Value,
};

use crate::config::redis::{HostPort, REDIS_OP_TIMEOUT};
use crate::config::Redis as RedisConfig;

/// How hookgate reaches Redis, checked before any port is bound.
#[derive(Clone)]
pub enum Topology {
    /// One server (or an endpoint that hides its failovers).
    Single(Box<Client>),
    /// A master watched by sentinels.
    Sentinel(Box<SentinelSettings>),
    /// A Redis Cluster, from its seed nodes.
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// What a Sentinel client is built from (a [`SentinelClient`] is not `Clone`).
#[derive(Clone)]
pub struct SentinelSettings {
    sentinels: Vec<ConnectionAddr>,
    master_name: String,
    sentinel_password: Option<String>,
    /// The data nodes' settings: TLS, user, password, database.
    data: redis::ConnectionInfo,
}

impl Topology {
    /// The topology `config` names; `sentinel_password` was read from its source.
    pub fn new(config: &RedisConfig, sentinel_password: Option<String>) -> Result<Self, String> {
        let info = parse_url(&config.url)?;
        let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        let addr = |node: &HostPort| {
            let (host, port) = (node.host.clone(), node.port);
            if tls {
                ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host, port)
            }
        };
        if !config.sentinels.is_empty() {
            let sentinels = config.sentinels.iter().map(addr).collect();
            let settings = SentinelSettings {
                sentinels,
                master_name: config.master_name.clone().unwrap_or_default(),
                sentinel_password,
                data: info,
            };
            // Fails now, not at the first request, if the settings do not make a client.
            settings.client()?;
            return Ok(Topology::Sentinel(Box::new(settings)));
        }
        if !config.cluster_nodes.is_empty() {
            let nodes: Vec<_> = config
                .cluster_nodes
                .iter()
                .map(|n| {
                    info.clone()
                        .set_addr(addr(n))
                        .set_redis_settings(info.redis_settings().clone())
                })
                .collect();
            // A pipeline that ends in `WAIT` may take a call's deadline and the WAIT's
            // timeout (under a call's deadline); each caller bounds its own call.
            let client = redis::cluster::ClusterClient::builder(nodes)
                .connection_timeout(REDIS_OP_TIMEOUT)
                .response_timeout(WAITED_CALL_TIMEOUT)
                .build()
                .map_err(|e| format!("redis.cluster_nodes: {e}"))?;
            return Ok(Topology::Cluster(Box::new(client)));
        }
        Client::open(info)
            .map(|c| Topology::Single(Box::new(c)))
            .map_err(|e| format!("redis.url: {e}"))
    }

    /// Whether keys that must be written together need a shared hash tag.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Topology::Cluster(_))
    }
}

/// The one reading of `redis.url` (or the URL `url_env` names): where the data nodes are
/// and how to talk to them.
fn parse_url(url: &str) -> Result<redis::ConnectionInfo, String> {
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err("redis.url: must start with redis:// or rediss://".into());
    }
    url.into_connection_info()
        .map_err(|e| format!("redis.url: {e}"))
}

impl SentinelSettings {
    fn client(&self) -> Result<SentinelClient, String> {
        let redis = self.data.redis_settings();
        let mut builder = SentinelClientBuilder::new(
            self.sentinels.clone(),
            &self.master_name,
            SentinelServerType::Master,
        )
        .map_err(|e| format!("redis.sentinels: {e}"))?
        .set_client_to_redis_db(redis.db());
        if let Some(user) = redis.username() {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = redis.password() {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(password) = &self.sentinel_password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if matches!(self.data.addr(), ConnectionAddr::TcpTls { .. }) {
            builder = builder
                .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
        }
        builder.build().map_err(|e| format!("redis.sentinels: {e}"))
    }
}

/// One connection of any topology; the redis crate's commands and scripts run on it.
#[derive(Clone)]
pub enum Conn {
    /// A server's (or the current master's) connection.
    Node(MultiplexedConnection),
    /// A cluster's: it follows MOVED and ASK and refreshes its slot map by itself.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The current connection, made on first use and again after one is dropped; and the
/// connections of `WAIT`'s own.
pub struct Link {
    topology: Topology,
    /// The Sentinel client keeps its connections to the sentinels between look-ups.
    sentinel: tokio::sync::Mutex<Option<SentinelClient>>,
    current: Mutex<Option<(u64, Conn)>>,
    /// Callers that find no connection wait here, so one connects for all.
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    /// Idle connections of `WAIT`'s own, each with the epoch it was made in.
    idle: Mutex<Vec<(u64, Conn)>>,
    /// One permit per connection of `WAIT`'s own in use: at most [`WAIT_CONNECTIONS`]
    /// pipelines wait at once, the others queue here.
    slots: tokio::sync::Semaphore,
    /// Moves when a connection fails in a way a new one may cure (a failover, a server
    /// gone): idle connections of an older epoch point at that server and are closed
    /// instead of reused.
    epoch: AtomicU64,
    /// Connections of `WAIT`'s own open now (in use or idle).
    open: AtomicUsize,
}

/// Most connections of `WAIT`'s own open at once, per replica of hookgate. A `WAIT` that
/// succeeds takes well under a millisecond on a network of one data centre, so a replica
/// answering thousands of requests a second keeps a handful busy (docs/replicas.md has
/// the figures); the bound matters only while replicas lag, when each waiting request
/// holds one for up to `redis.wait_timeout` and the requests beyond it queue for one.
pub const WAIT_CONNECTIONS: usize = 64;

/// The deadline of a call whose pipeline ends in `WAIT`: a call's own and the longest
/// `redis.wait_timeout` (which is shorter than a call's deadline).
pub const WAITED_CALL_TIMEOUT: Duration = Duration::from_secs(2 * REDIS_OP_TIMEOUT.as_secs());

/// A connection of `WAIT`'s own, lent to one pipeline: nobody else sends on it while its
/// `WAIT` blocks it. [`Exclusive::give_back`] after a success returns it to the idle ones;
/// dropped otherwise, it is closed, so a pipeline never runs on a connection that failed.
pub struct Exclusive<'a> {
    link: &'a Link,
    conn: Conn,
    epoch: u64,
    _slot: tokio::sync::SemaphorePermit<'a>,
}

impl Exclusive<'_> {
    /// The connection, for one pipeline.
    pub fn conn(&mut self) -> &mut Conn {
        &mut self.conn
    }

    /// Returns the connection to the idle ones, unless a failure since it was made has
    /// moved the epoch.
    pub fn give_back(self) {
        if self.link.epoch.load(Ordering::Relaxed) == self.epoch {
            let conn = self.conn.clone();
            lock(&self.link.idle).push((self.epoch, conn));
            // The idle list holds its own handle now; this one's drop does not count.
            self.link.open.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        self.link.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Link {
    /// A link that connects lazily: a Redis down at start is not fatal.
    pub fn new(topology: Topology) -> Self {
        Self {
            topology,
            sentinel: tokio::sync::Mutex::new(None),
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
            idle: Mutex::new(Vec::new()),
            slots: tokio::sync::Semaphore::new(WAIT_CONNECTIONS),
            epoch: AtomicU64::new(0),
            open: AtomicUsize::new(0),
        }
    }

    /// Whether keys that must be written together need a shared hash tag.
    pub fn is_cluster(&self) -> bool {
        self.topology.is_cluster()
    }

    /// The current connection and its generation (for [`Link::failed`]).
    pub async fn get(&self) -> RedisResult<(u64, Conn)> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let _one = self.connecting.lock().await;
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let conn = self.connect(REDIS_OP_TIMEOUT).await?;
        if let Topology::Sentinel(settings) = &self.topology {
            tracing::info!(master = %settings.master_name, "redis: connected to the master the sentinels name");
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *lock(&self.current) = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// A connection of `WAIT`'s own for one pipeline: an idle one, or a new one; waits
    /// while [`WAIT_CONNECTIONS`] are in use.
    pub async fn exclusive(&self) -> RedisResult<Exclusive<'_>> {
        let slot =
            self.slots.acquire().await.map_err(|_| {
                redis::RedisError::from((redis::ErrorKind::Io, "the link is closed"))
            })?;
        let epoch = self.epoch.load(Ordering::Relaxed);
        let reused = {
            let mut idle = lock(&self.idle);
            let mut found = None;
            while let Some((made, conn)) = idle.pop() {
                if made == epoch {
                    found = Some(conn);
                    break;
                }
                // Made before a failure: closed (dropped) rather than reused.
                self.open.fetch_sub(1, Ordering::Relaxed);
            }
            found
        };
        let conn = match reused {
            Some(conn) => conn,
            None => {
                let conn = self.connect(WAITED_CALL_TIMEOUT).await?;
                self.open.fetch_add(1, Ordering::Relaxed);
                conn
            }
        };
        Ok(Exclusive {
            link: self,
            conn,
            epoch,
            _slot: slot,
        })
    }

    /// Connections of `WAIT`'s own open now, in use or idle.
    pub fn wait_connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// A new connection of the topology, whose replies may take `response_timeout`.
    async fn connect(&self, response_timeout: Duration) -> RedisResult<Conn> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(REDIS_OP_TIMEOUT))
            .set_response_timeout(Some(response_timeout));
        Ok(match &self.topology {
            Topology::Single(client) => Conn::Node(
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            ),
            Topology::Sentinel(settings) => {
                let mut slot = self.sentinel.lock().await;
                let client = match &mut *slot {
                    Some(client) => client,
                    empty => empty.insert(settings.client().map_err(|e| {
                        redis::RedisError::from((
                            redis::ErrorKind::InvalidClientConfig,
                            "sentinel",
                            e,
                        ))
                    })?),
                };
                let conn = client.get_async_connection_with_config(&config).await?;
                Conn::Node(conn)
            }
            Topology::Cluster(client) => Conn::Cluster(client.get_async_connection().await?),
        })
    }

    /// Records that a call on connection `generation` failed with `error` (`None`: no
    /// answer within the deadline); drops the connection when a new one may do better.
    pub fn failed(&self, generation: u64, error: Option<&redis::RedisError>) {
        if !needs_reconnect(error) {
            return;
        }
        self.epoch.fetch_add(1, Ordering::Relaxed);
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            if error.is_some_and(is_read_only) {
                tracing::warn!(
                    "redis: the server is a read-only replica now (a failover?); reconnecting"
                );
            }
            *current = None;
        }
    }

    /// Records that a pipeline on a connection of `WAIT`'s own failed with `error` (`None`:
    /// no answer within the deadline). That connection is closed by its caller; when a new
    /// one may do better, the idle ones and the shared one go too, since they reach the
    /// same server.
    pub fn exclusive_failed(&self, error: Option<&redis::RedisError>) {
        if let Some((generation, _)) = self.cached() {
            self.failed(generation, error);
        } else if needs_reconnect(error) {
            self.epoch.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn cached(&self) -> Option<(u64, Conn)> {
        lock(&self.current).clone()
    }
}

/// Whether a call's failure (`None`: no answer within the deadline) may be cured by a new
/// connection.
fn needs_reconnect(error: Option<&redis::RedisError>) -> bool {
    match error {
        None => true,
        Some(e) => {
            e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_timeout()
                || is_read_only(e)
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A write refused by a replica: the connection points at a demoted master. Inside a
/// script, Redis reports it in the script error's text.
fn is_read_only(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
    ) || e.to_string().contains("READONLY")
}

/// How long a connection attempt or a call may take; see [`REDIS_OP_TIMEOUT`].
pub const OP_TIMEOUT: Duration = REDIS_OP_TIMEOUT;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_is_read_once_and_a_bad_one_is_named() {
        let info = parse_url("rediss://:pw@cache.example:6380/3").expect("parses");
        assert!(matches!(
            info.addr(),
            ConnectionAddr::TcpTls { port: 6380, .. }
        ));
        assert_eq!(info.redis_settings().db(), 3);
        for bad in ["http://x", "cache.example:6379", "redis://h:port/0"] {
            let e = parse_url(bad).expect_err(bad);
            assert!(e.starts_with("redis.url: "), "{bad}: {e}");
        }
    }
}
