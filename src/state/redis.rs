//! Dedup marks, guard state and guard-key locks in a shared Redis, for several replicas.
//! With [`redis_link`](crate::state::redis_link), the only modules that import the redis crate.
//!
//! Every operation has a deadline; a slow or unreachable Redis is a [`StoreError`], which
//! the pipeline answers with 503 so the sender retries. Nothing is answered 200 unless its
//! mark was written.
//!
//! Claims and locks are leases that end by themselves, so a replica paused past its lease
//! (a frozen container) may wake up to find another replica holding the key. Every write
//! made under a lease is therefore fenced: a script writes it only if the writer's token
//! still holds the lease, in the same step, so a late writer cannot overwrite a newer
//! decision.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;

use crate::config::Redis as RedisConfig;
use crate::state::backoff::Backoff;
use crate::state::keys::{RedisSpace, StoreKey};
use crate::state::marks::{Claim, KeyState, StoredMark};
use crate::state::redis_link::{Conn, Link, Topology, OP_TIMEOUT};
use crate::store::StoreError;

/// First byte of a done mark's value, which its decision record follows (`state::decision`;
/// a mark written before records is this byte alone). A claim's value is its token in
/// decimal digits, so the two never meet.
const DONE: u8 = b'd';

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

/// The guard commit: writes the state `KEYS[2]` (`ARGV[2]`, expiring after `ARGV[3]` ms,
/// never when 0) and releases the lock `KEYS[1]`, only while token `ARGV[1]` holds that
/// lock; 0 otherwise. A lock that expired and was never taken again is lost too: another
/// request may have taken it, decided and released it in between.
const FENCED_COMMIT: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[3] == '0' then
  redis.call('SET', KEYS[2], ARGV[2])
else
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
redis.call('DEL', KEYS[1])
return 1
"#;

/// Writes `KEYS[2]` (`ARGV[2]`, never expiring) only while token `ARGV[1]` holds the lease
/// `KEYS[1]`; 0 otherwise. The lease stays: its holder renews and ends it.
const FENCED_PUT: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"#;

/// Marks every key `KEYS[i]` done with its value `ARGV[2 + i]` (a done mark and its
/// record) for `ARGV[2]` ms, all or none, unless one of them is claimed by another token
/// than `ARGV[1]`: then 0. A key that is free (its claim expired and nobody took it) or
/// done already is marked: the event was handled, and a done mark only ever keeps a
/// duplicate out.
const FENCED_DONE: &str = r#"
for _, key in ipairs(KEYS) do
  local held = redis.call('GET', key)
  if held and held ~= ARGV[1] and string.sub(held, 1, 1) ~= 'd' then
    return 0
  end
end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[2 + i], 'PX', ARGV[2])
end
return 1
"#;

/// Replaces the value of `KEYS[1]` by `ARGV[2]`, keeping its expiry, only while it is still
/// `ARGV[1]`: its remaining lifetime in ms; -3 otherwise (a concurrent update won; its
/// count stands).
const COMPARE_AND_SET: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  return redis.call('PTTL', KEYS[1])
end
return -3
"#;

/// The value of `KEYS[1]` and its remaining lifetime in ms, read at one point in time.
const GET_WITH_TTL: &str = r#"
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
"#;

/// A checked Redis configuration, parsed before any port is bound.
#[derive(Clone)]
pub struct RedisTarget {
    topology: Topology,
    prefix: String,
    /// `WAIT` for this many replicas, this long, after writes a 200 rests on.
    wait: Option<(u32, Duration)>,
}

impl RedisTarget {
    /// Checks the `redis:` section (its URL: `redis://`, `rediss://`, with password and
    /// database); `sentinel_password` was read from its source.
    pub fn new(config: &RedisConfig, sentinel_password: Option<String>) -> Result<Self, String> {
        Ok(Self {
            topology: Topology::new(config, sentinel_password)?,
            prefix: config.key_prefix.clone(),
            wait: (config.wait_replicas > 0).then_some((config.wait_replicas, config.wait_timeout)),
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
    link: Arc<Link>,
    prefix: String,
    wait: Option<(u32, Duration)>,
    release: Arc<redis::Script>,
    lease: Arc<redis::Script>,
    commit: Arc<redis::Script>,
    put_leased: Arc<redis::Script>,
    done: Arc<redis::Script>,
    compare_and_set: Arc<redis::Script>,
    get_with_ttl: Arc<redis::Script>,
    healthy: Arc<AtomicBool>,
}

impl RedisState {
    /// Prepares the connection; it is made at the first call and again whenever one
    /// fails, so a Redis that is down at start is not fatal.
    pub fn connect(target: &RedisTarget) -> Result<Self, StoreError> {
        Ok(Self {
            link: Arc::new(Link::new(target.topology.clone())),
            prefix: target.prefix.clone(),
            wait: target.wait,
            release: Arc::new(redis::Script::new(COMPARE_AND_DELETE)),
            lease: Arc::new(redis::Script::new(TAKE_OR_EXTEND)),
            commit: Arc::new(redis::Script::new(FENCED_COMMIT)),
            put_leased: Arc::new(redis::Script::new(FENCED_PUT)),
            done: Arc::new(redis::Script::new(FENCED_DONE)),
            compare_and_set: Arc::new(redis::Script::new(COMPARE_AND_SET)),
            get_with_ttl: Arc::new(redis::Script::new(GET_WITH_TTL)),
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
        self.run(Access::Write, move |mut c| async move {
            c.pset_ex::<_, _, ()>(k, 1, millis(PROBE_TTL)).await
        })
        .await
    }

    /// The state of a dedup key.
    pub async fn state(&self, key: &StoreKey) -> Result<KeyState, StoreError> {
        let k = self.key(key, RedisSpace::Marks);
        let v: Option<Vec<u8>> = self
            .run(Access::Read, move |mut c| async move { c.get(k).await })
            .await?;
        Ok(match v.as_deref() {
            None => KeyState::Free,
            Some([DONE, ..]) => KeyState::Done,
            Some(_) => KeyState::InFlight,
        })
    }

    /// The mark of a dedup key as stored: its state, expiry and decision record (`now_ms`
    /// turns Redis's remaining lifetime into a time).
    pub async fn read_mark(
        &self,
        key: &StoreKey,
        now_ms: i64,
    ) -> Result<Option<StoredMark>, StoreError> {
        let k = self.key(key, RedisSpace::Marks);
        let script = self.get_with_ttl.clone();
        let (value, ttl_ms): (Option<Vec<u8>>, i64) = self
            .run(Access::Read, move |mut c| async move {
                script.key(k).invoke_async(&mut c).await
            })
            .await?;
        Ok(value.map(|v| match v.split_first() {
            Some((&DONE, record)) => StoredMark {
                state: KeyState::Done,
                expires_ms: (ttl_ms >= 0).then(|| now_ms.saturating_add(ttl_ms)),
                record: (!record.is_empty()).then(|| record.to_vec()),
            },
            _ => StoredMark {
                state: KeyState::InFlight,
                expires_ms: None,
                record: None,
            },
        }))
    }

    /// Rewrites the record of `key`'s done mark with `update`, keeping its expiry: a read,
    /// then a compare-and-set. The mark's expiry (from `now_ms`) when written; `None` when
    /// there is no done mark with a record, `update` declines, or a concurrent update came
    /// first.
    pub async fn update_record(
        &self,
        key: &StoreKey,
        now_ms: i64,
        update: impl FnOnce(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<Option<i64>, StoreError> {
        let k = self.key(key, RedisSpace::Marks);
        let read = k.clone();
        let current: Option<Vec<u8>> = self
            .run(Access::Read, move |mut c| async move { c.get(read).await })
            .await?;
        let Some(current) = current else {
            return Ok(None);
        };
        let new = match current.split_first() {
            Some((&DONE, record)) if !record.is_empty() => update(record),
            _ => None,
        };
        let Some(new) = new else {
            return Ok(None);
        };
        let mut value = vec![DONE];
        value.extend_from_slice(&new);
        let script = self.compare_and_set.clone();
        let ttl_ms: i64 = self
            .run(Access::Write, move |mut c| async move {
                script
                    .key(k)
                    .arg(current)
                    .arg(value)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok((ttl_ms > 0).then(|| now_ms.saturating_add(ttl_ms)))
    }

    /// Marks `key` done with `record` for `ttl` unless a mark holds it (`SET NX`); true
    /// when written.
    pub async fn mark_done_if_free(
        &self,
        key: &StoreKey,
        record: &[u8],
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let k = self.key(key, RedisSpace::Marks);
        let mut value = vec![DONE];
        value.extend_from_slice(record);
        let opts = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(millis(ttl)));
        let reply: Option<String> = self
            .run(Access::Write, move |mut c| async move {
                c.set_options(k, value, opts).await
            })
            .await?;
        Ok(reply.is_some())
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
            if self.set_nx(k.clone(), token, lease).await? {
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

    /// Marks keys done for `ttl`, each with its decision record, fenced by the claim
    /// `token` took: all of them in one script (in a cluster, one script per hash slot, the
    /// event's key first), then `WAIT` when configured.
    pub async fn mark_done(
        &self,
        marks: &[(&StoreKey, &[u8])],
        token: u64,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let marks: Vec<(Vec<u8>, Vec<u8>)> = marks
            .iter()
            .map(|(k, record)| {
                let mut value = vec![DONE];
                value.extend_from_slice(record);
                (self.key(k, RedisSpace::Marks), value)
            })
            .collect();
        // Each key is its own slot in a cluster (a request id and an event id share
        // nothing to tag them with); elsewhere one script writes them all.
        let groups: Vec<Vec<(Vec<u8>, Vec<u8>)>> = if self.link.is_cluster() {
            marks.into_iter().map(|m| vec![m]).collect()
        } else {
            vec![marks]
        };
        for group in groups {
            let first = group.first().map(|(k, _)| k.clone()).unwrap_or_default();
            let script = self.done.clone();
            let written = self
                .run(Access::Write, move |mut c| async move {
                    let mut call = script.prepare_invoke();
                    for (key, _) in &group {
                        call.key(key);
                    }
                    call.arg(token.to_string()).arg(millis(ttl));
                    for (_, value) in &group {
                        call.arg(value);
                    }
                    call.invoke_async::<i64>(&mut c).await
                })
                .await?;
            if written != 1 {
                return Err(StoreError::LeaseLost(
                    "the event's claim was taken over by another request while this one held it (paused past its lease?)",
                ));
            }
            self.replicate(first).await?;
        }
        Ok(())
    }

    /// Releases a claim if `token` still holds it.
    pub async fn release(&self, key: &StoreKey, token: u64) -> Result<(), StoreError> {
        self.release_or_later(self.key(key, RedisSpace::Marks), token)
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
            if self.set_nx(lock_key.clone(), token, lease).await? {
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
        self.release_or_later(lock_key, token).await
    }

    /// Releases `key` if `token` holds it; when Redis does not answer, keeps trying in the
    /// background, so the key is free as soon as Redis answers again rather than after its
    /// lease.
    async fn release_or_later(&self, key: Vec<u8>, token: u64) -> Result<(), StoreError> {
        let result = self.compare_and_delete(key.clone(), token).await;
        if result.is_err() {
            self.release_later(key, token);
        }
        result
    }

    /// Writes the guard state of `key` (forgotten after `ttl` when given) and releases its
    /// lock, in one script that does both only while `token` holds the lock; then `WAIT`
    /// when configured. A lock lost meanwhile is [`StoreError::LeaseLost`]: the state
    /// stays as the lock's later holder left it.
    pub async fn commit_locked(
        &self,
        key: &StoreKey,
        token: u64,
        value: &[u8],
        ttl: Option<Duration>,
    ) -> Result<(), StoreError> {
        let lock_key = self.key(key, RedisSpace::Locks);
        let state_key = self.key(key, RedisSpace::Guard);
        let script = self.commit.clone();
        let value = value.to_vec();
        let ttl_ms = ttl.map_or(0, millis);
        let first = state_key.clone();
        let written = self
            .run(Access::Write, move |mut c| async move {
                script
                    .key(lock_key)
                    .key(state_key)
                    .arg(token.to_string())
                    .arg(value)
                    .arg(ttl_ms)
                    .invoke_async::<i64>(&mut c)
                    .await
            })
            .await;
        match written {
            Ok(1) => self.replicate(first).await,
            Ok(_) => Err(StoreError::LeaseLost(
                "the guard key's lock was taken over by another request while this one held it (paused past its lease?); its state was left as that request wrote it",
            )),
            Err(e) => {
                // The script may still run when Redis answers again: it then finds the lock
                // released (and writes nothing) or still ours (and commits). Either is
                // consistent; releasing now only keeps the key from blocking for a lease.
                self.release_later(self.key(key, RedisSpace::Locks), token);
                Err(e)
            }
        }
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
        let script = self.lease.clone();
        self.run(Access::Write, move |mut c| async move {
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
        self.compare_and_delete(self.key(key, RedisSpace::Locks), token)
            .await
    }

    /// Reads guard state.
    pub async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        let k = self.key(key, RedisSpace::Guard);
        self.run(Access::Read, move |mut c| async move { c.get(k).await })
            .await
    }

    /// Writes state that no guard lock covers but a lease does (a reconciler's position),
    /// never forgotten, only while `token` holds the lease of the same key ([`Self::lease`]):
    /// a replica paused past its lease cannot overwrite what the lease's next holder wrote.
    pub async fn put_leased(
        &self,
        key: &StoreKey,
        token: u64,
        value: &[u8],
    ) -> Result<(), StoreError> {
        let lease_key = self.key(key, RedisSpace::Locks);
        let state_key = self.key(key, RedisSpace::Guard);
        let script = self.put_leased.clone();
        let value = value.to_vec();
        let first = state_key.clone();
        let written = self
            .run(Access::Write, move |mut c| async move {
                script
                    .key(lease_key)
                    .key(state_key)
                    .arg(token.to_string())
                    .arg(value)
                    .invoke_async::<i64>(&mut c)
                    .await
            })
            .await?;
        if written == 1 {
            self.replicate(first).await
        } else {
            Err(StoreError::LeaseLost(
                "the lease was taken over by another replica while this one held it (paused past its lease?); what it wrote stays",
            ))
        }
    }

    /// `SET NX PX`. When the reply does not come, the SET may still be applied once Redis
    /// answers again, and would then hold the key for a whole lease with nobody to finish
    /// it; so it is released by token in the background.
    async fn set_nx(&self, k: Vec<u8>, token: u64, ttl: Duration) -> Result<bool, StoreError> {
        let opts = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(millis(ttl)));
        let key = k.clone();
        let reply: Result<Option<String>, StoreError> = self
            .run(Access::Write, move |mut c| async move {
                c.set_options(key, token.to_string(), opts).await
            })
            .await;
        match reply {
            Ok(reply) => Ok(reply.is_some()),
            Err(e) => {
                self.release_later_within(k, token, ttl);
                Err(e)
            }
        }
    }

    /// Releases `key` if `token` holds it, retrying in the background for a lock lease.
    fn release_later(&self, key: Vec<u8>, token: u64) {
        self.release_later_within(key, token, OP_TIMEOUT * 15);
    }

    /// Releases `key` if `token` holds it, retrying in the background until it is done or
    /// `within` has passed (after which the lease has freed the key anyway).
    fn release_later_within(&self, key: Vec<u8>, token: u64, within: Duration) {
        let this = self.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + within;
            let mut backoff = Backoff::default();
            loop {
                match this.compare_and_delete(key.clone(), token).await {
                    Ok(()) => return,
                    Err(_) if tokio::time::Instant::now() < deadline => backoff.pause().await,
                    Err(error) => {
                        tracing::warn!(%error, "a lease whose reply was lost was not released; it ends by itself");
                        return;
                    }
                }
            }
        });
    }

    async fn compare_and_delete(&self, key: Vec<u8>, token: u64) -> Result<(), StoreError> {
        let script = self.release.clone();
        self.run(Access::Write, move |mut c| async move {
            script
                .key(key)
                .arg(token.to_string())
                .invoke_async::<i64>(&mut c)
                .await
        })
        .await
        .map(|_| ())
    }

    /// With `WAIT` configured: waits until the configured replicas have every write made
    /// so far on the nodes holding `keys` (a duplicate's 200 rests on a mark that a
    /// concurrent request, or an attempt whose own `WAIT` failed, may have written).
    pub async fn replicated(&self, keys: &[&StoreKey]) -> Result<(), StoreError> {
        if self.wait.is_none() {
            return Ok(());
        }
        let nodes: Vec<&StoreKey> = if self.link.is_cluster() {
            keys.to_vec()
        } else {
            keys.iter().take(1).copied().collect()
        };
        for key in nodes {
            self.replicate(self.key(key, RedisSpace::Marks)).await?;
        }
        Ok(())
    }

    /// `WAIT` for the configured replicas after a write on the node holding `key`: fewer
    /// acknowledgements within the timeout is a failure (503), since a failover could then
    /// lose the write.
    async fn replicate(&self, key: Vec<u8>) -> Result<(), StoreError> {
        let Some((replicas, timeout)) = self.wait else {
            return Ok(());
        };
        let acked: i64 = self
            .run(Access::Write, move |c| async move {
                let mut cmd = redis::cmd("WAIT");
                cmd.arg(replicas).arg(millis(timeout));
                match c {
                    Conn::Node(mut c) => cmd.query_async(&mut c).await,
                    Conn::Cluster(mut c) => {
                        use redis::cluster_routing::{
                            Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
                        };
                        let at = Route::with_key(&key, SlotAddr::Master);
                        let routing =
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(at));
                        let value = c.route_command(cmd, routing).await?;
                        redis::from_redis_value(value).map_err(redis::RedisError::from)
                    }
                }
            })
            .await?;
        if acked < i64::from(replicas) {
            self.healthy.store(false, Ordering::Relaxed);
            return Err(StoreError::Unreachable(
                format!("WAIT: {acked} of {replicas} replicas acknowledged the write in time")
                    .into(),
            ));
        }
        Ok(())
    }

    /// Runs a call on the current connection under the deadline (connecting first if
    /// there is none) and records the store's health: any failure makes it unhealthy, and
    /// only a write that succeeds makes it healthy again (a Redis that refuses writes still
    /// serves reads). A connection that failed in a way a new one may cure is dropped.
    async fn run<T, F, Fut>(&self, access: Access, op: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let mut used = None;
        let attempt = async {
            let (generation, conn) = self.link.get().await?;
            used = Some(generation);
            op(conn).await
        };
        let result = match tokio::time::timeout(OP_TIMEOUT, attempt).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if let Some(generation) = used {
                    self.link.failed(generation, Some(&e));
                }
                Err(StoreError::Unreachable(e.into()))
            }
            Err(_) => {
                if let Some(generation) = used {
                    self.link.failed(generation, None);
                }
                Err(StoreError::Unreachable(
                    "no answer within the deadline".into(),
                ))
            }
        };
        match (&result, access) {
            (Err(_), _) => self.healthy.store(false, Ordering::Relaxed),
            (Ok(_), Access::Write) => self.healthy.store(true, Ordering::Relaxed),
            (Ok(_), Access::Read) => {}
        }
        result
    }

    /// The Redis key of a store key in `space` (hash-tagged in a cluster).
    fn key(&self, key: &StoreKey, space: RedisSpace) -> Vec<u8> {
        if self.link.is_cluster() {
            key.redis_cluster_form(&self.prefix, space)
        } else {
            key.redis_form(&self.prefix, space)
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
