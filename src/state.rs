//! Where dedup marks and guard state live: the embedded sled store (one replica) or a
//! shared Redis (several). The backend is chosen here, once, from `dedup.backend`; the rest
//! of the code calls these methods and does not know which one runs.

use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use crate::config::{Backend, Config};
use crate::dedup::{Claim, KeyState, SledMarks};
use crate::guard_state::KeyedLocks;
use crate::redis_store::{RedisState, RedisTarget};
use crate::store::{Store, StoreError, Tree};

/// The sled backend: marks and guard state in two trees, guard keys locked in process.
pub struct SledState {
    marks: SledMarks,
    guards: Tree,
    locks: KeyedLocks,
}

/// The chosen backend.
pub enum StateStore {
    /// Embedded, single replica.
    Sled(SledState),
    /// Shared by replicas.
    Redis {
        redis: RedisState,
        /// Lease of a guard-key lock: a dead replica's lock expires after it.
        lock_lease: Duration,
        /// How long a request waits for a guard-key lock.
        lock_wait: Duration,
    },
}

/// A held guard-key lock; released on [`StateStore::unlock`] (or by its lease in Redis).
pub enum KeyLock {
    /// An in-process lock, released when dropped.
    Local(OwnedMutexGuard<()>),
    /// A Redis lock owned by `token`.
    Redis { key: Vec<u8>, token: u64 },
}

/// A backend choice checked before any port is bound.
#[derive(Clone)]
pub enum BackendChoice {
    /// sled.
    Sled,
    /// Redis at this target.
    Redis(Box<RedisTarget>),
}

impl BackendChoice {
    /// Checks the backend settings of a config (a bad Redis URL is a config error).
    pub fn from_config(config: &Config) -> Result<Self, String> {
        match config.dedup.backend {
            Backend::Sled => Ok(BackendChoice::Sled),
            Backend::Redis => Ok(BackendChoice::Redis(Box::new(RedisTarget::new(
                &config.redis.url,
                &config.redis.key_prefix,
            )?))),
        }
    }
}

impl StateStore {
    /// Opens the chosen backend. Must run inside the tokio runtime.
    pub fn open(
        choice: &BackendChoice,
        config: &Config,
        store: &Store,
    ) -> Result<Self, StoreError> {
        match choice {
            BackendChoice::Sled => Ok(StateStore::Sled(SledState {
                marks: SledMarks::new(store.tree("dedup")?, config.dedup.in_flight_lease),
                guards: store.tree("guard")?,
                locks: KeyedLocks::default(),
            })),
            BackendChoice::Redis(target) => Ok(StateStore::Redis {
                redis: RedisState::connect(target)?,
                // Held across decide → publish → commit: the publish may take a whole
                // confirm timeout, so the lease is the in-flight lease.
                lock_lease: config.dedup.in_flight_lease,
                lock_wait: config.dedup.in_flight_wait,
            }),
        }
    }

    /// Name of the backend, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            StateStore::Sled(_) => "sled",
            StateStore::Redis { .. } => "redis",
        }
    }

    /// Whether the backend answers (always true for sled).
    pub fn is_healthy(&self) -> bool {
        match self {
            StateStore::Sled(_) => true,
            StateStore::Redis { redis, .. } => redis.is_healthy(),
        }
    }

    /// Checks the backend now (for readiness while idle).
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            StateStore::Sled(_) => Ok(()),
            StateStore::Redis { redis, .. } => redis.ping().await,
        }
    }

    /// The state of a dedup key at `now_ms`.
    pub async fn mark_state(&self, key: &[u8], now_ms: i64) -> Result<KeyState, StoreError> {
        match self {
            StateStore::Sled(s) => s.marks.state(key, now_ms),
            StateStore::Redis { redis, .. } => redis.state(key).await,
        }
    }

    /// Claims a dedup key for `token`.
    pub async fn try_claim(
        &self,
        key: &[u8],
        token: u64,
        now_ms: i64,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        match self {
            StateStore::Sled(s) => s.marks.try_claim(key, token, now_ms),
            StateStore::Redis { redis, .. } => redis.try_claim(key, token, lease).await,
        }
    }

    /// Marks keys done for `ttl` from `now_ms`.
    pub async fn mark_done(
        &self,
        keys: &[&[u8]],
        now_ms: i64,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        match self {
            StateStore::Sled(s) => s.marks.mark_done(keys, now_ms + ttl.as_millis() as i64),
            StateStore::Redis { redis, .. } => redis.mark_done(keys, ttl).await,
        }
    }

    /// Releases a claim still held by `token`.
    pub async fn release(&self, key: &[u8], token: u64) -> Result<(), StoreError> {
        match self {
            StateStore::Sled(s) => s.marks.release(key, token),
            StateStore::Redis { redis, .. } => redis.release(key, token).await,
        }
    }

    /// Takes the lock of a guard key; events of one key are decided one at a time.
    pub async fn lock(&self, key: &[u8]) -> Result<KeyLock, StoreError> {
        match self {
            StateStore::Sled(s) => Ok(KeyLock::Local(s.locks.lock(key).await)),
            StateStore::Redis {
                redis,
                lock_lease,
                lock_wait,
            } => {
                let token: u64 = rand::random();
                redis.lock(key, token, *lock_lease, *lock_wait).await?;
                Ok(KeyLock::Redis {
                    key: key.to_vec(),
                    token,
                })
            }
        }
    }

    /// Releases a guard-key lock.
    pub async fn unlock(&self, lock: KeyLock) {
        if let (StateStore::Redis { redis, .. }, KeyLock::Redis { key, token }) = (self, lock) {
            // A failed unlock is not an error for the request: the lease frees the key.
            if let Err(error) = redis.unlock(&key, token).await {
                tracing::warn!(%error, "guard lock not released; its lease will free it");
            }
        }
    }

    /// Reads guard state.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            StateStore::Sled(s) => s.guards.get(key),
            StateStore::Redis { redis, .. } => redis.get(key).await,
        }
    }

    /// Writes guard state that may be forgotten at `expires_ms` (never when `None`).
    pub async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        now_ms: i64,
        expires_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        match self {
            StateStore::Sled(s) => s.guards.insert(key, value),
            StateStore::Redis { redis, .. } => {
                let ttl = expires_ms.map(|e| Duration::from_millis((e - now_ms).max(1) as u64));
                redis.put(key, value, ttl).await
            }
        }
    }

    /// Deletes expired marks and guard state (sled; Redis expires keys by itself).
    /// `guard_expired` says whether a stored guard value has expired at `now_ms`.
    pub fn sweep(
        &self,
        now_ms: i64,
        guard_expired: impl Fn(&[u8]) -> bool,
    ) -> Result<usize, StoreError> {
        match self {
            StateStore::Sled(s) => {
                let mut removed = s.marks.sweep(now_ms)?;
                let mut after: Option<Vec<u8>> = None;
                loop {
                    let page = s.guards.page(after.as_deref(), 10_000)?;
                    let Some((last, _)) = page.last() else {
                        return Ok(removed);
                    };
                    after = Some(last.clone());
                    for (key, value) in &page {
                        if guard_expired(value)
                            && s.guards.compare_and_swap(key, Some(value), None)?
                        {
                            removed += 1;
                        }
                    }
                }
            }
            StateStore::Redis { .. } => Ok(0),
        }
    }
}
