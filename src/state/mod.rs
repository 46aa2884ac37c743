//! Where dedup marks and guard state live: the local store (one replica; the
//! `expiring-lsm` journal in the store folder) or a
//! shared Redis (several). The backend is chosen here, once, from `dedup.backend`; the rest
//! of the code calls these methods and does not know which one runs.

pub mod backoff;
pub mod decision;
mod engine;
pub mod keys;
pub mod locks;
pub mod marks;
pub mod offline;
pub mod redis;
pub mod redis_link;
mod scripts;
pub mod slots;

use std::sync::Arc;
use std::time::{Duration, Instant};

use expiring_lsm::journal::{self, Journal};
use tokio::sync::OwnedMutexGuard;

use crate::clock::Clock;
use crate::config::{Backend, Config};
use crate::liveness::Liveness;
use crate::state::backoff::Backoff;
use crate::state::keys::StoreKey;
use crate::state::locks::KeyedLocks;
use crate::state::marks::{Claim, JournalMarks, KeyState, StoredMark};
use crate::state::redis::{RedisState, RedisTarget};
use crate::store::{Store, StoreError};

/// Name of the sled tree that held the state journal before it had files of its own; a
/// store written then is read from it once.
pub const JOURNAL_TREE: &str = "state";
pub use expiring_lsm::journal::{JOURNAL_DIR, RUNS_DIR};

/// How long a request waits for the group commit that puts its state on disk before it
/// answers 503 instead of 200 (a disk that stalls, or a full one).
pub const DURABLE_WAIT: Duration = Duration::from_secs(5);

/// The local backend: marks and guard state in the journal, guard keys locked in process.
pub struct LocalState {
    marks: JournalMarks,
    journal: Arc<Journal>,
    locks: KeyedLocks,
    /// How long a request waits for a guard-key lock.
    lock_wait: Duration,
}

impl LocalState {
    /// Runs `call`, a call of the journal about `keys`, on this thread; when it will read a
    /// run page from disk (a key the hot set lacks that a run's filter may hold) and the
    /// runtime has several workers, it runs as blocking: the runtime hands this worker's
    /// other tasks to another thread meanwhile, so a slow disk read (done under the key's
    /// shard lock) does not stall the requests queued behind it. The call and its locks are
    /// the same either way.
    fn off_worker<T>(&self, keys: &[&StoreKey], call: impl FnOnce() -> T) -> T {
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if multi_thread && keys.iter().any(|k| self.journal.may_read_disk(&k.digest())) {
            tokio::task::block_in_place(call)
        } else {
            call()
        }
    }

    /// Writes guard state that may be forgotten at `expires_ms` (never when `None`).
    fn put(
        &self,
        key: &StoreKey,
        value: &[u8],
        now_ms: i64,
        expires_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        self.off_worker(&[key], || {
            let expires_ms = expires_ms.unwrap_or(i64::MAX);
            Ok(self.journal.put(&key.digest(), value, expires_ms, now_ms)?)
        })
    }
}

/// The chosen backend.
pub enum StateStore {
    /// Embedded, single replica.
    Local(LocalState),
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
    Redis { key: StoreKey, token: u64 },
}

/// What [`StateStore::claim_or_wait`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// This request owns the event key and must finish with `mark_done` or `release`.
    Owned,
    /// The event (or, when `by_request`, the sender's request id) was handled before.
    Duplicate { by_request: bool },
    /// Another request still holds it after the whole wait.
    Busy,
}

/// A backend choice checked before any port is bound.
#[derive(Clone)]
pub enum BackendChoice {
    /// The local journal.
    Local,
    /// Redis at this target.
    Redis(Box<RedisTarget>),
}

impl BackendChoice {
    /// Checks the backend settings of a config (a bad Redis URL is a config error).
    pub fn from_config(config: &Config) -> Result<Self, String> {
        match config.dedup.backend {
            Backend::Local => Ok(BackendChoice::Local),
            Backend::Redis => Ok(BackendChoice::Redis(Box::new(RedisTarget::new(
                &config.redis,
                sentinel_password(&config.redis)?,
            )?))),
        }
    }
}

/// The sentinels' password from its source (`redis.sentinel_password_env` or `_file`),
/// trailing line breaks of a file removed.
fn sentinel_password(config: &crate::config::Redis) -> Result<Option<String>, String> {
    let password = if let Some(var) = &config.sentinel_password_env {
        std::env::var(var).map_err(|_| {
            format!("redis.sentinel_password_env: environment variable {var} is not set")
        })?
    } else if let Some(path) = &config.sentinel_password_file {
        std::fs::read_to_string(path)
            .map_err(|e| {
                format!(
                    "redis.sentinel_password_file: cannot read {}: {e}",
                    path.display()
                )
            })?
            .trim_end_matches(['\r', '\n'])
            .to_owned()
    } else {
        return Ok(None);
    };
    if password.is_empty() {
        return Err("redis: the sentinel password is empty".into());
    }
    Ok(Some(password))
}

impl StateStore {
    /// Opens the chosen backend (local: its runs, and the journal replayed at the clock's
    /// time). Must run inside the tokio runtime. A failure only a restart cures marks
    /// `liveness`.
    pub fn open(
        choice: &BackendChoice,
        config: &Config,
        store: &Store,
        clock: Clock,
        liveness: &Liveness,
    ) -> Result<Self, StoreError> {
        match choice {
            BackendChoice::Local => {
                let now_ms = clock();
                let settings = journal::Settings {
                    hot_entries: config.store.hot_entries,
                    ttl: config.dedup.ttl,
                    clock,
                    segment_bytes: config.store.journal_segment,
                    commit_interval: config.store.commit_interval,
                    needs_restart: {
                        let liveness = liveness.clone();
                        Arc::new(move |reason| liveness.needs_restart(reason))
                    },
                    disk: disk_seam::real(),
                    background: true,
                };
                let legacy = Arc::new(store.tree(JOURNAL_TREE)?);
                let journal = Journal::open(legacy, store.dir(), now_ms, settings)?;
                let watched = Arc::downgrade(&journal);
                let deadline = config.store.hung_after;
                liveness.watch(move || {
                    let busy = watched.upgrade()?.writer_busy_for()?;
                    crate::liveness::overdue(
                        "state journal's writer thread",
                        "commit",
                        busy,
                        deadline,
                    )
                });
                Ok(StateStore::Local(LocalState {
                    marks: JournalMarks::new(journal.clone(), config.dedup.in_flight_lease),
                    journal,
                    locks: KeyedLocks::default(),
                    lock_wait: config.dedup.in_flight_wait,
                }))
            }
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
            StateStore::Local(_) => "local",
            StateStore::Redis { .. } => "redis",
        }
    }

    /// Whether the backend answers (local: whether the state journal is being written).
    pub fn is_healthy(&self) -> bool {
        match self {
            StateStore::Local(s) => !s.journal.is_failing(),
            StateStore::Redis { redis, .. } => redis.is_healthy(),
        }
    }

    /// Checks the backend now (for readiness while idle).
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            StateStore::Local(_) => Ok(()),
            StateStore::Redis { redis, .. } => redis.ping().await,
        }
    }

    /// The state of a dedup key at `now_ms`.
    async fn mark_state(&self, key: &StoreKey, now_ms: i64) -> Result<KeyState, StoreError> {
        match self {
            StateStore::Local(s) => s.off_worker(&[key], || s.marks.state(key, now_ms)),
            StateStore::Redis { redis, .. } => redis.state(key).await,
        }
    }

    /// Claims a dedup key for `token`.
    async fn try_claim(
        &self,
        key: &StoreKey,
        token: u64,
        now_ms: i64,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        match self {
            StateStore::Local(s) => s.off_worker(&[key], || s.marks.try_claim(key, token, now_ms)),
            StateStore::Redis { redis, .. } => redis.try_claim(key, token, lease).await,
        }
    }

    /// Claims the event key for `token`, or waits, at most `wait`, for the request that
    /// holds it to finish. A request id the sender set is checked first: a retry under the
    /// same request id is a duplicate even when its body says otherwise. `now_ms` is read
    /// anew for every attempt.
    pub async fn claim_or_wait(
        &self,
        event: &StoreKey,
        request: Option<&StoreKey>,
        token: u64,
        wait: Duration,
        lease: Duration,
        now_ms: impl Fn() -> i64,
    ) -> Result<Claimed, StoreError> {
        let deadline = Instant::now() + wait;
        let mut backoff = Backoff::default();
        loop {
            let now = now_ms();
            // The request id is claimed like the event: of two concurrent retries under one
            // request id, whatever their bodies, one goes on and the other waits for it.
            if let Some(request) = request {
                // A read first: the common retry (the request id done) is answered without
                // a write, also by a Redis that refuses writes.
                if self.mark_state(request, now).await? == KeyState::Done {
                    return Ok(Claimed::Duplicate { by_request: true });
                }
                match self.try_claim(request, token, now, lease).await? {
                    Claim::Claimed => {}
                    Claim::Done => return Ok(Claimed::Duplicate { by_request: true }),
                    Claim::InFlight if Instant::now() >= deadline => return Ok(Claimed::Busy),
                    Claim::InFlight => {
                        backoff.pause().await;
                        continue;
                    }
                }
            }
            let claim = self.try_claim(event, token, now, lease).await;
            if let (Some(request), Ok(Claim::Done | Claim::InFlight) | Err(_)) = (request, &claim) {
                self.release(request, token).await?;
            }
            match claim? {
                Claim::Claimed => return Ok(Claimed::Owned),
                Claim::Done => return Ok(Claimed::Duplicate { by_request: false }),
                Claim::InFlight if Instant::now() >= deadline => return Ok(Claimed::Busy),
                Claim::InFlight => backoff.pause().await,
            }
        }
    }

    /// Marks keys done, each with its decision record, until `ttl` after the later of
    /// `now_ms` (receipt) and `event_ms` (the event's own time): a future-dated event's
    /// replay must still find its mark.
    pub async fn mark_done(
        &self,
        marks: &[(&StoreKey, &[u8])],
        token: u64,
        now_ms: i64,
        event_ms: Option<i64>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let from_ms = event_ms.map_or(now_ms, |e| e.max(now_ms));
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let expires_ms = from_ms.saturating_add(ttl_ms);
        match self {
            StateStore::Local(s) => {
                let keys: Vec<&StoreKey> = marks.iter().map(|(k, _)| *k).collect();
                s.off_worker(&keys, || s.marks.mark_done(marks, expires_ms, now_ms))
            }
            StateStore::Redis { redis, .. } => {
                let lifetime =
                    Duration::from_millis(expires_ms.saturating_sub(now_ms).max(1) as u64);
                redis.mark_done(marks, token, lifetime).await
            }
        }
    }

    /// The mark of a dedup key as stored, if one counts at `now_ms`: its state, expiry and
    /// decision record (`hookgate inspect`).
    pub async fn read_mark(
        &self,
        key: &StoreKey,
        now_ms: i64,
    ) -> Result<Option<StoredMark>, StoreError> {
        match self {
            StateStore::Local(s) => s.off_worker(&[key], || s.marks.read(key, now_ms)),
            StateStore::Redis { redis, .. } => redis.read_mark(key, now_ms).await,
        }
    }

    /// Rewrites the decision record of `key`'s done mark with `update`, keeping the mark
    /// and its expiry (a duplicate or a replay counted): that expiry when written, `None`
    /// when nothing was. Nobody waits for it to be durable: a crash may lose a count, never
    /// a mark.
    pub async fn update_record(
        &self,
        key: &StoreKey,
        now_ms: i64,
        update: impl FnOnce(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<Option<i64>, StoreError> {
        match self {
            StateStore::Local(s) => {
                s.off_worker(&[key], || s.marks.update_record(key, now_ms, update))
            }
            StateStore::Redis { redis, .. } => redis.update_record(key, now_ms, update).await,
        }
    }

    /// Marks `key` done with `record` until `expires_ms` unless a mark holds it: the request
    /// id a duplicate came under, kept as long as its event's mark, so `inspect request`
    /// finds it and its retries are answered from it. True when written.
    pub async fn mark_done_if_free(
        &self,
        key: &StoreKey,
        record: &[u8],
        now_ms: i64,
        expires_ms: i64,
    ) -> Result<bool, StoreError> {
        match self {
            StateStore::Local(s) => s.off_worker(&[key], || {
                s.marks.mark_done_if_free(key, record, expires_ms, now_ms)
            }),
            StateStore::Redis { redis, .. } => {
                let ttl = Duration::from_millis(expires_ms.saturating_sub(now_ms).max(1) as u64);
                redis.mark_done_if_free(key, record, ttl).await
            }
        }
    }

    /// Waits until every change made so far (and every value read so far) is durable, so
    /// an answer that depends on them may go out. Local: the journal's group commit, at most
    /// [`DURABLE_WAIT`]. Redis: its writes were acknowledged; how durable they are is
    /// Redis's own `appendfsync` setting.
    pub async fn sync(&self) -> Result<(), StoreError> {
        match self {
            StateStore::Local(s) => {
                let point = s.journal.sync_point();
                Ok(s.journal.durable(point, DURABLE_WAIT).await?)
            }
            StateStore::Redis { .. } => Ok(()),
        }
    }

    /// Waits until the current records of `keys` are durable: for an answer that rests on
    /// these keys alone (a duplicate), which are on disk already unless a concurrent request
    /// wrote one moments ago. Local: at most [`DURABLE_WAIT`]; Redis: as [`StateStore::sync`],
    /// and with `redis.wait_replicas` until that many replicas have the marks.
    pub async fn sync_keys(&self, keys: &[&StoreKey]) -> Result<(), StoreError> {
        match self {
            StateStore::Local(s) => {
                let digests: Vec<_> = keys.iter().map(|k| k.digest()).collect();
                let point = s.journal.point_of(&digests.iter().collect::<Vec<_>>());
                Ok(s.journal.durable(point, DURABLE_WAIT).await?)
            }
            StateStore::Redis { redis, .. } => redis.replicated(keys).await,
        }
    }

    /// Before a publish: makes the leases it is published under (the claims `token` holds,
    /// and `lock`) safe from a failover. Redis with `redis.wait_replicas`: renewed and
    /// acknowledged by the replicas ([`RedisState::secure`]); otherwise nothing to do.
    /// True when the leases were renewed (they run anew from before the call).
    pub async fn secure(
        &self,
        claims: &[&StoreKey],
        token: u64,
        lock: Option<&KeyLock>,
    ) -> Result<bool, StoreError> {
        match self {
            StateStore::Local(_) => Ok(false),
            StateStore::Redis {
                redis, lock_lease, ..
            } => {
                let lock = match lock {
                    Some(KeyLock::Redis { key, token }) => Some((key, *token)),
                    _ => None,
                };
                redis.secure(claims, token, lock, *lock_lease).await
            }
        }
    }

    /// Releases a claim still held by `token`.
    pub async fn release(&self, key: &StoreKey, token: u64) -> Result<(), StoreError> {
        match self {
            StateStore::Local(s) => {
                s.marks.release(key, token);
                Ok(())
            }
            StateStore::Redis { redis, .. } => redis.release(key, token).await,
        }
    }

    /// Takes the lock of a guard key; events of one key are decided one at a time.
    pub async fn lock(&self, key: &StoreKey) -> Result<KeyLock, StoreError> {
        match self {
            StateStore::Local(s) => {
                match tokio::time::timeout(s.lock_wait, s.locks.lock(key.digest())).await {
                    Ok(guard) => Ok(KeyLock::Local(guard)),
                    Err(_) => Err(StoreError::Busy(
                        "guard key is locked by another request for too long",
                    )),
                }
            }
            StateStore::Redis {
                redis,
                lock_lease,
                lock_wait,
            } => {
                let token: u64 = rand::random();
                redis.lock(key, token, *lock_lease, *lock_wait).await?;
                Ok(KeyLock::Redis {
                    key: key.clone(),
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

    /// Takes, or extends while `token` holds it, the lease of `key` for `ttl`: one holder
    /// across replicas. The local store serves one process, which holds the store's lock: always true.
    pub async fn lease(
        &self,
        key: &StoreKey,
        token: u64,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        match self {
            StateStore::Local(_) => Ok(true),
            StateStore::Redis { redis, .. } => redis.lease(key, token, ttl).await,
        }
    }

    /// Ends a lease `token` holds (a no-op for the local store).
    pub async fn end_lease(&self, key: &StoreKey, token: u64) -> Result<(), StoreError> {
        match self {
            StateStore::Local(_) => Ok(()),
            StateStore::Redis { redis, .. } => redis.end_lease(key, token).await,
        }
    }

    /// Writes the guard state of a key whose lock this request holds, and releases the
    /// lock. Redis: only while the lock is still this request's ([`StoreError::LeaseLost`]
    /// otherwise; see [`RedisState::commit_locked`]).
    pub async fn commit_locked(
        &self,
        lock: KeyLock,
        key: &StoreKey,
        value: &[u8],
        now_ms: i64,
        expires_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        match (self, lock) {
            (StateStore::Redis { redis, .. }, KeyLock::Redis { key: locked, token }) => {
                debug_assert_eq!(&locked, key);
                let ttl = expires_ms.map(|e| Duration::from_millis((e - now_ms).max(1) as u64));
                redis.commit_locked(key, token, value, ttl).await
            }
            (StateStore::Local(s), lock) => {
                let result = s.put(key, value, now_ms, expires_ms);
                self.unlock(lock).await;
                result
            }
            (StateStore::Redis { .. }, lock) => {
                self.unlock(lock).await;
                Err(StoreError::LeaseLost(
                    "the guard key's lock is not a Redis lock; nothing was written",
                ))
            }
        }
    }

    /// Reads guard state.
    pub async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            StateStore::Local(s) => s.off_worker(&[key], || Ok(s.journal.get(&key.digest())?)),
            StateStore::Redis { redis, .. } => redis.get(key).await,
        }
    }

    /// Writes state a lease covers ([`Self::lease`] of the same key), never forgotten, only
    /// while `token` holds that lease; [`StoreError::LeaseLost`] otherwise. The local store
    /// serves one process, which holds every lease.
    pub async fn put_leased(
        &self,
        key: &StoreKey,
        token: u64,
        value: &[u8],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        match self {
            StateStore::Local(s) => s.put(key, value, now_ms, None),
            StateStore::Redis { redis, .. } => redis.put_leased(key, token, value).await,
        }
    }

    /// Forgets expired marks and guard state (local: those in memory now, and the runs on
    /// disk by the merge thread; Redis expires keys by itself). Returns how many entries
    /// went from memory.
    pub fn sweep(&self, now_ms: i64) -> Result<usize, StoreError> {
        match self {
            StateStore::Local(s) => Ok(s.journal.sweep(now_ms)?),
            StateStore::Redis { .. } => Ok(0),
        }
    }

    /// Dedup marks and guard states held (local only: Redis keeps its own count).
    pub fn entries(&self) -> Option<usize> {
        match self {
            StateStore::Local(s) => Some(s.journal.len()),
            StateStore::Redis { .. } => None,
        }
    }

    /// State runs a merge found damaged (local only).
    pub fn damaged_runs(&self) -> Option<usize> {
        match self {
            StateStore::Local(s) => Some(s.journal.damaged_runs()),
            StateStore::Redis { .. } => None,
        }
    }

    /// The local backend's journal (benchmarks and tests look inside it).
    pub fn journal(&self) -> Option<&Arc<Journal>> {
        match self {
            StateStore::Local(s) => Some(&s.journal),
            StateStore::Redis { .. } => None,
        }
    }

    /// Hands every journaled change to the store now (before the store's last flush).
    pub fn write_now(&self) -> Result<(), StoreError> {
        match self {
            StateStore::Local(s) => Ok(s.journal.write_now()?),
            StateStore::Redis { .. } => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The local backend on `store`, with one route and `extra` config (whole YAML lines).
    fn open_local(store: &Store, extra: &str) -> StateStore {
        let config = Config::parse(&format!(
            "listen:\n  addr: 127.0.0.1:0\n{extra}routes:\n  - name: r\n    path: /r\n    secrets:\n      - secret_env: S\n"
        ))
        .expect("config");
        StateStore::open(
            &BackendChoice::Local,
            &config,
            store,
            Arc::new(|| 0),
            &Liveness::new(),
        )
        .expect("state")
    }

    #[tokio::test]
    async fn a_local_guard_lock_is_waited_for_at_most_in_flight_wait() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("store");
        let state = open_local(&store, "dedup:\n  in_flight_wait: 50ms\n");
        let held = state
            .lock(&StoreKey::raw(b"key"))
            .await
            .expect("first lock");
        // Bounded by the test too, so a lock wait without a bound fails here instead of hanging.
        let second =
            tokio::time::timeout(Duration::from_secs(10), state.lock(&StoreKey::raw(b"key")))
                .await
                .expect("the wait for a held guard lock is bounded");
        assert!(second.is_err(), "a held lock was taken twice");
        assert!(
            state.lock(&StoreKey::raw(b"other")).await.is_ok(),
            "other keys do not wait"
        );
        state.unlock(held).await;
        assert!(
            state.lock(&StoreKey::raw(b"key")).await.is_ok(),
            "a released lock is taken"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn values_read_from_runs_off_the_workers_are_the_values_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("store");
        let state = open_local(&store, "");
        let StateStore::Local(local) = &state else {
            panic!("local backend");
        };
        let key = StoreKey::raw(b"guard");
        state
            .put_leased(&key, 0, b"opted out", 0)
            .await
            .expect("put");
        local.journal.flush_to_run().expect("flush");
        assert!(
            local.journal.may_read_disk(&key.digest()),
            "the value is in a run"
        );
        assert_eq!(
            state.get(&key).await.expect("get").as_deref(),
            Some(&b"opted out"[..])
        );
        state
            .put_leased(&key, 0, b"opted in", 0)
            .await
            .expect("put");
        assert_eq!(
            state.get(&key).await.expect("get").as_deref(),
            Some(&b"opted in"[..])
        );
    }
}
