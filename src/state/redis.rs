//! Dedup marks, guard state and guard-key locks in a shared Redis, for several replicas.
//! The only module that imports the redis crate.
//!
//! Every operation has a deadline; a slow or unreachable Redis is a [`StoreError`], which
//! the pipeline answers with 503 so the sender retries. Nothing is answered 200 unless its
//! mark was written.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::AsyncCommands;

use crate::state::backoff::Backoff;
use crate::state::keys::{RedisSpace, StoreKey};
use crate::state::marks::{Claim, KeyState};
use crate::store::StoreError;

/// A Redis call slower than this counts as a failure (the request answers 503).
const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// Value of a done mark.
const DONE: &str = "d";

/// Deletes a key only if it still holds our value: a claim or lock taken over after its
/// lease must not be released by the old owner.
const COMPARE_AND_DELETE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// Takes a lease for `ARGV[1]`, or extends it when `ARGV[1]` holds it already, for
/// `ARGV[2]` ms; 1 if held now.
const TAKE_OR_EXTEND: &str = r#"
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if held then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"#;

/// A checked Redis URL, parsed before any port is bound.
#[derive(Clone)]
pub struct RedisTarget {
    client: redis::Client,
    prefix: String,
}

impl RedisTarget {
    /// Parses the URL (`redis://`, `rediss://`, with password and database).
    pub fn new(url: &str, prefix: &str) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| format!("redis.url: {e}"))?;
        Ok(Self {
            client,
            prefix: prefix.to_owned(),
        })
    }
}

/// Whether a call changes Redis; see [`RedisState::run`].
#[derive(Clone, Copy)]
enum Access {
    Read,
    Write,
}

/// How long the readiness probe's key lives; it is rewritten every second.
const PROBE_TTL: Duration = Duration::from_secs(10);

/// The shared state store.
#[derive(Clone)]
pub struct RedisState {
    conn: ConnectionManager,
    prefix: String,
    release: Arc<redis::Script>,
    lease: Arc<redis::Script>,
    healthy: Arc<AtomicBool>,
}

impl RedisState {
    /// Creates the connection manager; it connects lazily and reconnects by itself, so a
    /// Redis that is down at start is not fatal.
    pub fn connect(target: &RedisTarget) -> Result<Self, StoreError> {
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(OP_TIMEOUT))
            .set_response_timeout(Some(OP_TIMEOUT))
            .set_max_delay(Duration::from_secs(2))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_lazy_with_config(target.client.clone(), config)
            .map_err(|e| StoreError::Unreachable(e.into()))?;
        Ok(Self {
            conn,
            prefix: target.prefix.clone(),
            release: Arc::new(redis::Script::new(COMPARE_AND_DELETE)),
            lease: Arc::new(redis::Script::new(TAKE_OR_EXTEND)),
            healthy: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Whether Redis takes writes: no call failed since the last write succeeded.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Checks that Redis takes writes (for readiness while no traffic flows): a Redis out
    /// of memory (`maxmemory` with `noeviction`) or a read-only replica still answers PING
    /// and GET, but refuses every claim, so only a write tells.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let k = self.key(&StoreKey::raw(b"readiness-probe"), RedisSpace::Marks);
        let mut c = self.conn.clone();
        self.run(Access::Write, async move {
            c.pset_ex::<_, _, ()>(k, 1, millis(PROBE_TTL)).await
        })
        .await
    }

    /// The state of a dedup key.
    pub async fn state(&self, key: &StoreKey) -> Result<KeyState, StoreError> {
        let k = self.key(key, RedisSpace::Marks);
        let mut c = self.conn.clone();
        let v: Option<String> = self
            .run(Access::Read, async move { c.get(k).await })
            .await?;
        Ok(match v.as_deref() {
            None => KeyState::Free,
            Some(DONE) => KeyState::Done,
            Some(_) => KeyState::InFlight,
        })
    }

    /// Claims a dedup key with `SET NX PX lease`: the lease expires by itself if this
    /// replica dies, so a crash leftover is taken over without a sweep.
    pub async fn try_claim(
        &self,
        key: &StoreKey,
        token: u64,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let k = self.key(key, RedisSpace::Marks);
        loop {
            if self.set_nx(k.clone(), &token.to_string(), lease).await? {
                return Ok(Claim::Claimed);
            }
            match self.state(key).await? {
                KeyState::Done => return Ok(Claim::Done),
                KeyState::InFlight => return Ok(Claim::InFlight),
                // Expired between the SET and the GET: try again.
                KeyState::Free => continue,
            }
        }
    }

    /// Marks keys done for `ttl`.
    pub async fn mark_done(&self, keys: &[&StoreKey], ttl: Duration) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.set_options(
                self.key(key, RedisSpace::Marks),
                DONE,
                redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(millis(ttl))),
            )
            .ignore();
        }
        let mut c = self.conn.clone();
        self.run(Access::Write, async move {
            pipe.query_async::<()>(&mut c).await
        })
        .await
    }

    /// Releases a claim if `token` still holds it.
    pub async fn release(&self, key: &StoreKey, token: u64) -> Result<(), StoreError> {
        self.compare_and_delete(self.key(key, RedisSpace::Marks), token.to_string())
            .await
    }

    /// Takes the lock of a guard key, polling with backoff until `wait` passes. The lock
    /// expires after `lease` if this replica dies holding it.
    pub async fn lock(
        &self,
        key: &StoreKey,
        token: u64,
        lease: Duration,
        wait: Duration,
    ) -> Result<(), StoreError> {
        let lock_key = self.key(key, RedisSpace::Locks);
        let deadline = tokio::time::Instant::now() + wait;
        let mut backoff = Backoff::default();
        loop {
            if self
                .set_nx(lock_key.clone(), &token.to_string(), lease)
                .await?
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Busy(
                    "guard key is locked by another request for too long",
                ));
            }
            backoff.pause().await;
        }
    }

    /// Releases a guard-key lock taken with `token`.
    pub async fn unlock(&self, key: &StoreKey, token: u64) -> Result<(), StoreError> {
        let lock_key = self.key(key, RedisSpace::Locks);
        self.compare_and_delete(lock_key, token.to_string()).await
    }

    /// Takes, or extends while `token` holds it, the lease of `key` for `ttl`: one holder
    /// at a time across replicas (a reconciler's walk of a route). True if held now.
    pub async fn lease(
        &self,
        key: &StoreKey,
        token: u64,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let k = self.key(key, RedisSpace::Locks);
        let mut c = self.conn.clone();
        let script = self.lease.clone();
        self.run(Access::Write, async move {
            script
                .key(k)
                .arg(token.to_string())
                .arg(millis(ttl))
                .invoke_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|held| held == 1)
    }

    /// Ends a lease `token` holds.
    pub async fn end_lease(&self, key: &StoreKey, token: u64) -> Result<(), StoreError> {
        self.compare_and_delete(self.key(key, RedisSpace::Locks), token.to_string())
            .await
    }

    /// Reads guard state.
    pub async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        let k = self.key(key, RedisSpace::Guard);
        let mut c = self.conn.clone();
        self.run(Access::Read, async move { c.get(k).await }).await
    }

    /// Writes guard state, forgotten after `ttl` when given.
    pub async fn put(
        &self,
        key: &StoreKey,
        value: &[u8],
        ttl: Option<Duration>,
    ) -> Result<(), StoreError> {
        let k = self.key(key, RedisSpace::Guard);
        let mut c = self.conn.clone();
        let value = value.to_vec();
        match ttl {
            Some(ttl) => {
                self.run(Access::Write, async move {
                    c.pset_ex::<_, _, ()>(k, value, millis(ttl)).await
                })
                .await
            }
            None => {
                self.run(
                    Access::Write,
                    async move { c.set::<_, _, ()>(k, value).await },
                )
                .await
            }
        }
    }

    async fn set_nx(&self, k: Vec<u8>, value: &str, ttl: Duration) -> Result<bool, StoreError> {
        let mut c = self.conn.clone();
        let value = value.to_owned();
        let opts = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(millis(ttl)));
        let reply: Option<String> = self
            .run(
                Access::Write,
                async move { c.set_options(k, value, opts).await },
            )
            .await?;
        Ok(reply.is_some())
    }

    async fn compare_and_delete(&self, key: Vec<u8>, value: String) -> Result<(), StoreError> {
        let mut c = self.conn.clone();
        let script = self.release.clone();
        self.run(Access::Write, async move {
            script.key(key).arg(value).invoke_async::<i64>(&mut c).await
        })
        .await
        .map(|_| ())
    }

    /// Runs a call under the deadline and records the store's health: any failure makes it
    /// unhealthy, and only a write that succeeds makes it healthy again (a Redis that
    /// refuses writes still serves reads).
    async fn run<T>(
        &self,
        access: Access,
        op: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let result = match tokio::time::timeout(OP_TIMEOUT, op).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::Unreachable(e.into())),
            Err(_) => Err(StoreError::Unreachable(
                "no answer within the deadline".into(),
            )),
        };
        match (&result, access) {
            (Err(_), _) => self.healthy.store(false, Ordering::Relaxed),
            (Ok(_), Access::Write) => self.healthy.store(true, Ordering::Relaxed),
            (Ok(_), Access::Read) => {}
        }
        result
    }

    /// The Redis key of a store key in `space`.
    fn key(&self, key: &StoreKey, space: RedisSpace) -> Vec<u8> {
        key.redis_form(&self.prefix, space)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
