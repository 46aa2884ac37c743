//! The `redis:` section: one server, a Sentinel-watched master, or a Redis Cluster, and the
//! checks that make leases in Redis safe (every lease outlasts what its holder does).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::config_error::ConfigError;
use super::units::duration;
use durable_spool::FLUSH_TIMEOUT as SPOOL_FLUSH_WAIT;

/// A Redis call slower than this counts as a failure (the request answers 503). Part of
/// every lease bound below: a request may spend it on each call it makes while holding one.
pub const REDIS_OP_TIMEOUT: Duration = Duration::from_secs(2);

/// The Redis connection.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Redis {
    /// `redis://` or `rediss://` URL. Default `redis://127.0.0.1:6379/0`. Redacted when printed.
    /// With `sentinels` or `cluster_nodes`, only its scheme (TLS or not), user, password and
    /// database are used, for every data node. Parsed once, by `state::redis_link`, when the
    /// config is resolved (the URL may come from `url_env`).
    pub url: String,
    /// Environment variable holding the whole URL (password included); overrides `url`.
    /// Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url_env: Option<String>,
    /// Prefix of every key, so several gateways can share one Redis. Default `hookgate:`.
    pub key_prefix: String,
    /// Sentinels (`host:port`) that watch the master named `master_name`; hookgate asks them
    /// for the master and asks again after a failover. Default empty (no Sentinel).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sentinels: Vec<HostPort>,
    /// The master's name in the sentinels' configuration. Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub master_name: Option<String>,
    /// Environment variable holding the sentinels' password (separate from the data
    /// password, which `url` carries). Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sentinel_password_env: Option<String>,
    /// File holding the sentinels' password (a mounted Kubernetes Secret). Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sentinel_password_file: Option<PathBuf>,
    /// Seed nodes (`host:port`) of a Redis Cluster; the rest is discovered. Default empty
    /// (no cluster).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cluster_nodes: Vec<HostPort>,
    /// Replicas that must acknowledge a request's writes (`WAIT`) before its 200; 0 turns
    /// it off. Default 0.
    pub wait_replicas: u32,
    /// How long `WAIT` waits for them before the answer is 503. Default 500ms.
    #[serde(with = "duration")]
    pub wait_timeout: Duration,
}

impl Default for Redis {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379/0".into(),
            url_env: None,
            key_prefix: "hookgate:".into(),
            sentinels: Vec::new(),
            master_name: None,
            sentinel_password_env: None,
            sentinel_password_file: None,
            cluster_nodes: Vec::new(),
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(500),
        }
    }
}

impl Redis {
    /// The longest a request may hold a claim (or its guard-key lock) while its lock wait
    /// is `in_flight_wait` and a publish takes at most `confirm_timeout`: one bound, the
    /// longer of the two stretches a lease must cover.
    ///
    /// - From the claims to the publish: the event's claim after the request id's, the
    ///   wait for the guard-key lock (its last attempt included), the guard state's read,
    ///   and with `wait_replicas` the renewal of the leases with its `WAIT`
    ///   (`Redis::hold_to_renewal`).
    /// - From the publish on ([`Redis::hold_from_publish`]): the publish (the caller waits for
    ///   its confirm no longer than `confirm_timeout`, however the broker's channels fare),
    ///   the spool's fsync when it fails, the guard commit and the done marks, each with its
    ///   `WAIT`. With `wait_replicas` the renewal just before the publish starts the leases
    ///   anew, so the two stretches are bounded apart; without it, they add up.
    pub fn longest_hold(&self, in_flight_wait: Duration, confirm_timeout: Duration) -> Duration {
        let before = self.hold_to_renewal(in_flight_wait);
        let after = self.hold_from_publish(confirm_timeout);
        if self.wait_replicas > 0 {
            // The renewal's own call counts in both: it may land at its start or its end.
            before.max(self.renewal() + after)
        } else {
            before + after
        }
    }

    /// From the request id's claim to the leases' renewal (or, without `wait_replicas`,
    /// to the publish); see [`Redis::longest_hold`].
    fn hold_to_renewal(&self, in_flight_wait: Duration) -> Duration {
        REDIS_OP_TIMEOUT // the event's claim after the request id's
            + in_flight_wait
            + REDIS_OP_TIMEOUT // the lock's last attempt
            + REDIS_OP_TIMEOUT // the guard state's read
            + self.renewal()
    }

    /// The renewal of the leases before a publish, with its `WAIT` (none without
    /// `wait_replicas`).
    fn renewal(&self) -> Duration {
        if self.wait_replicas > 0 {
            REDIS_OP_TIMEOUT + self.wait_timeout
        } else {
            Duration::ZERO
        }
    }

    /// The longest a request holds its claims from the start of its publish: the publish,
    /// the spool's fsync when it fails, the guard commit and the done marks, each with its
    /// `WAIT`.
    pub fn hold_from_publish(&self, confirm_timeout: Duration) -> Duration {
        let wait = if self.wait_replicas > 0 {
            self.wait_timeout
        } else {
            Duration::ZERO
        };
        confirm_timeout
            + SPOOL_FLUSH_WAIT
            + (REDIS_OP_TIMEOUT + wait) // the guard commit
            + (REDIS_OP_TIMEOUT + wait) // the done marks
    }

    /// Checks the section for the Redis backend; `lease` is `dedup.in_flight_lease`.
    pub fn validate(
        &self,
        lease: Duration,
        in_flight_wait: Duration,
        confirm_timeout: Duration,
    ) -> Result<(), ConfigError> {
        if !self.sentinels.is_empty() && !self.cluster_nodes.is_empty() {
            return invalid(
                "redis: sentinels and cluster_nodes exclude each other (a Redis Cluster fails over by itself)".into(),
            );
        }
        self.validate_sentinel_keys()?;
        if !self.cluster_nodes.is_empty() && self.key_prefix.contains(['{', '}']) {
            return invalid(
                "redis.key_prefix: must not hold { or } with cluster_nodes (hookgate's hash tags place the keys)".into(),
            );
        }
        if self.wait_replicas > 0
            && (self.wait_timeout.is_zero() || self.wait_timeout >= REDIS_OP_TIMEOUT)
        {
            return invalid(format!(
                "redis.wait_timeout: must be positive and shorter than {REDIS_OP_TIMEOUT:?} (a Redis call's deadline) with wait_replicas"
            ));
        }
        self.validate_lease(lease, in_flight_wait, confirm_timeout)
    }

    /// `master_name` with the sentinels, and the keys only sentinels use only with them.
    fn validate_sentinel_keys(&self) -> Result<(), ConfigError> {
        let master = self.master_name.as_deref().unwrap_or("");
        if !self.sentinels.is_empty() && master.is_empty() {
            return invalid(
                "redis.master_name: required with redis.sentinels (the name the sentinels monitor)"
                    .into(),
            );
        }
        if self.sentinels.is_empty()
            && (self.master_name.is_some()
                || self.sentinel_password_env.is_some()
                || self.sentinel_password_file.is_some())
        {
            return invalid(
                "redis.sentinels: master_name and the sentinel password need the sentinels' addresses".into(),
            );
        }
        if self.sentinel_password_env.is_some() && self.sentinel_password_file.is_some() {
            return invalid(
                "redis: sentinel_password_env and sentinel_password_file exclude each other".into(),
            );
        }
        Ok(())
    }

    /// Every lease in Redis (the dedup claim, the guard-key lock) ends by itself; one that
    /// ends while its holder still works lets another replica decide on stale state. The
    /// writes under a lease are fenced either way, but a lease too short for
    /// [`Redis::longest_hold`] would turn ordinary slow requests into 503s and duplicate
    /// publishes.
    fn validate_lease(
        &self,
        lease: Duration,
        in_flight_wait: Duration,
        confirm_timeout: Duration,
    ) -> Result<(), ConfigError> {
        let held = self.longest_hold(in_flight_wait, confirm_timeout);
        if lease <= held {
            return invalid(format!(
                "dedup.in_flight_lease: must be longer than {held:?} with the Redis backend, the longest a request holds its claim: {}",
                if self.wait_replicas > 0 {
                    format!("the longer of dedup.in_flight_wait + {REDIS_OP_TIMEOUT:?} for each of the event's claim, the lock, the read and the renewal of the leases + redis.wait_timeout, and {REDIS_OP_TIMEOUT:?} + redis.wait_timeout for the renewal + amqp.confirm_timeout + {SPOOL_FLUSH_WAIT:?} for the spool's fsync + {REDIS_OP_TIMEOUT:?} + redis.wait_timeout for each of the guard commit and the done marks")
                } else {
                    format!("dedup.in_flight_wait + amqp.confirm_timeout + {SPOOL_FLUSH_WAIT:?} for the spool's fsync + {REDIS_OP_TIMEOUT:?} for each of the event's claim, the lock, the read, the guard commit and the done marks")
                }
            ));
        }
        Ok(())
    }
}

fn invalid(message: String) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid(message))
}

/// A node's address as `host:port` (an IPv6 host in brackets), read once from the file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostPort {
    /// A name or an address, without brackets.
    pub host: String,
    /// Never 0.
    pub port: u16,
}

impl TryFrom<String> for HostPort {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let not = || format!("{text:?} is not host:port");
        let (host, port) = text.rsplit_once(':').ok_or_else(not)?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || host.contains(['/', '@', ' ']) {
            return Err(not());
        }
        let port = port.parse().ok().filter(|p| *p > 0).ok_or_else(not)?;
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }
}

impl From<HostPort> for String {
    fn from(node: HostPort) -> String {
        if node.host.contains(':') {
            format!("[{}]:{}", node.host, node.port)
        } else {
            format!("{}:{}", node.host, node.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(text: &str) -> HostPort {
        HostPort::try_from(text.to_owned()).expect("host:port")
    }

    #[test]
    fn a_node_address_is_read_once_and_printed_as_written() {
        for text in ["s1:26379", "[::1]:26380", "10.0.0.1:7000"] {
            assert_eq!(String::from(node(text)), text);
        }
        let v6 = node("[::1]:26380");
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 26380));
        for bad in ["s1", ":1", "s1:0", "s1:x", "a/b:1", "u@h:1"] {
            let e = HostPort::try_from(bad.to_owned()).expect_err(bad);
            assert_eq!(e, format!("{bad:?} is not host:port"));
        }
        let text = "listen: {addr: 127.0.0.1:0}\nroutes: [{name: r, path: /r, secrets: [{secret_env: A}]}]\ndedup: {backend: redis}\nredis: {sentinels: [s1], master_name: m}\n";
        let e = crate::config::Config::parse(text)
            .expect_err("not host:port")
            .to_string();
        assert!(
            e.contains("redis.sentinels[0]: \"s1\" is not host:port"),
            "{e}"
        );
    }

    fn lease_ok(r: &Redis, lease: u64) -> Result<(), ConfigError> {
        r.validate(
            Duration::from_secs(lease),
            Duration::from_secs(5),
            Duration::from_secs(5),
        )
    }

    #[test]
    fn the_lease_must_outlast_everything_a_request_does_while_holding_it() {
        let mut r = Redis::default();
        // 2 s event claim + 5 s wait + 2 s lock + 2 s read + 5 s publish + 5 s fsync + 2 s
        // commit + 2 s marks.
        assert_eq!(
            r.longest_hold(Duration::from_secs(5), Duration::from_secs(5)),
            Duration::from_secs(25)
        );
        assert!(lease_ok(&r, 26).is_ok());
        let e = lease_ok(&r, 25).expect_err("too short").to_string();
        assert!(
            e.contains("in_flight_lease: must be longer than 25s"),
            "{e}"
        );
        // With WAIT the renewal before the publish starts the leases anew: the longer of
        // 2 + 5 + 2 + 2 + (2 + 1) = 14 s and (2 + 1) + 5 + 5 + (2 + 1) + (2 + 1) = 19 s.
        r.wait_replicas = 1;
        r.wait_timeout = Duration::from_secs(1);
        assert_eq!(
            r.longest_hold(Duration::from_secs(5), Duration::from_secs(5)),
            Duration::from_secs(19)
        );
        let e = lease_ok(&r, 19).expect_err("WAIT counts").to_string();
        assert!(e.contains("19s") && e.contains("wait_timeout"), "{e}");
        assert!(
            r.longest_hold(Duration::from_secs(20), Duration::from_secs(1))
                == Duration::from_secs(29),
            "a long lock wait makes the first stretch the bound"
        );
        r.wait_timeout = Duration::from_secs(2);
        let e = lease_ok(&r, 60)
            .expect_err("WAIT within a call")
            .to_string();
        assert!(
            e.contains("redis.wait_timeout: must be positive and shorter"),
            "{e}"
        );
    }

    #[test]
    fn sentinel_and_cluster_settings_are_checked() {
        let base = Redis::default();
        let check = |f: &dyn Fn(&mut Redis)| {
            let mut r = base.clone();
            f(&mut r);
            lease_ok(&r, 30).err().map(|e| e.to_string())
        };
        assert_eq!(check(&|_| {}), None);
        type Change<'a> = &'a dyn Fn(&mut Redis);
        let cases: [(Change, &str); 4] = [
            (
                &|r| r.sentinels = vec![node("s1:26379")],
                "redis.master_name",
            ),
            (
                &|r| {
                    r.sentinels = vec![node("s1:1")];
                    r.cluster_nodes = vec![node("c1:1")];
                },
                "exclude each other",
            ),
            (&|r| r.master_name = Some("m".into()), "redis.sentinels"),
            (
                &|r| {
                    r.cluster_nodes = vec![node("c1:7000")];
                    r.key_prefix = "{hg}:".into();
                },
                "redis.key_prefix",
            ),
        ];
        for (change, needle) in cases {
            let e = check(change).expect("invalid");
            assert!(e.contains(needle), "{e} lacks {needle}");
        }
        let ok = check(&|r| {
            r.sentinels = vec![node("s1:26379"), node("[::1]:26380")];
            r.master_name = Some("main".into());
            r.sentinel_password_env = Some("SENTINEL_PASSWORD".into());
        });
        assert_eq!(ok, None);
    }
}
