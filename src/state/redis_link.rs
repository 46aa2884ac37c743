//! The connection to Redis in its three topologies: one server, a master found through
//! Sentinel, or a Redis Cluster. A connection that fails in a way a new one may cure (dropped,
//! refused, silent, or a master demoted to a read-only replica by a failover) is dropped, and
//! the next call connects anew: with Sentinel that asks the sentinels for the master again.

use std::sync::atomic::{AtomicU64, Ordering};
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
            let client = redis::cluster::ClusterClient::builder(nodes)
                .connection_timeout(REDIS_OP_TIMEOUT)
                .response_timeout(REDIS_OP_TIMEOUT)
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

/// The current connection, made on first use and again after one is dropped.
pub struct Link {
    topology: Topology,
    /// The Sentinel client keeps its connections to the sentinels between look-ups.
    sentinel: tokio::sync::Mutex<Option<SentinelClient>>,
    current: Mutex<Option<(u64, Conn)>>,
    /// Callers that find no connection wait here, so one connects for all.
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
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
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(REDIS_OP_TIMEOUT))
            .set_response_timeout(Some(REDIS_OP_TIMEOUT));
        let conn = match &self.topology {
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
                tracing::info!(master = %settings.master_name, "redis: connected to the master the sentinels name");
                Conn::Node(conn)
            }
            Topology::Cluster(client) => Conn::Cluster(client.get_async_connection().await?),
        };
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.lock() = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// Records that a call on connection `generation` failed with `error` (`None`: no
    /// answer within the deadline); drops the connection when a new one may do better.
    pub fn failed(&self, generation: u64, error: Option<&redis::RedisError>) {
        let reconnect = match error {
            None => true,
            Some(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout()
                    || is_read_only(e)
            }
        };
        if !reconnect {
            return;
        }
        let mut current = self.lock();
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            if error.is_some_and(is_read_only) {
                tracing::warn!(
                    "redis: the server is a read-only replica now (a failover?); reconnecting"
                );
            }
            *current = None;
        }
    }

    fn cached(&self) -> Option<(u64, Conn)> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(u64, Conn)>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }
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
