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
//!
//! With `redis.wait_replicas`, every write an answer rests on is sent with its `WAIT` in one
//! pipeline, on a connection of `WAIT`'s own ([`Link::exclusive`]): the `WAIT` covers that
//! connection's last write, and a connection that fails is closed, never reconnected
//! between a write and its `WAIT`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;

mod wait;

use crate::config::Redis as RedisConfig;
use crate::state::backoff::Backoff;
use crate::state::keys::{LeaseHolder, RedisSpace, StoreKey};
use crate::state::marks::{Claim, KeyState, StoredMark};
use crate::state::redis_link::{Conn, Link, Topology, OP_TIMEOUT};
use crate::state::scripts::{
    COMPARE_AND_DELETE, COMPARE_AND_SET, DONE, FENCED_COMMIT, FENCED_DONE, FENCED_PUT,
    GET_WITH_TTL, TAKE_OR_EXTEND,
};
use crate::state::slots;
use crate::store_error::StoreError;

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
    ///
    /// In a cluster hookgate's keys lie on every master, so the probe writes one key on
    /// each master that `CLUSTER SLOTS` names, and Redis counts as taking writes only when
    /// all of them do.
    pub async fn ping(&self) -> Result<(), StoreError> {
        if !self.link.is_cluster() {
            let k = self.key(&StoreKey::raw(b"readiness-probe"), RedisSpace::Marks);
            return self
                .run(Access::Write, move |mut c| async move {
                    c.pset_ex::<_, _, ()>(k, 1, millis(PROBE_TTL)).await
                })
                .await;
        }
        let reply: redis::Value = self
            .run(Access::Read, |mut c| async move {
                redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut c).await
            })
            .await?;
        let masters = master_ranges(&reply);
        if masters.is_empty() {
            self.healthy.store(false, Ordering::Relaxed);
            return Err(StoreError::Unreachable(
                "CLUSTER SLOTS names no master".into(),
            ));
        }
        for (master, first, last) in masters {
            let Some(k) = slots::key_in(&self.prefix, "readiness-probe", first, last) else {
                continue;
            };
            // Read access: one master's success must not mark the store healthy while
            // another's write is still to come.
            self.run(Access::Read, move |mut c| async move {
                c.pset_ex::<_, _, ()>(k, 1, millis(PROBE_TTL)).await
            })
            .await
            .map_err(|e| StoreError::Unreachable(format!("master {master}: {e}").into()))?;
        }
        self.healthy.store(true, Ordering::Relaxed);
        Ok(())
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
    /// then a compare-and-set. The time the mark has left when written; `None` when there
    /// is no done mark with a record, `update` declines, or a concurrent update came first.
    pub async fn update_record(
        &self,
        key: &StoreKey,
        update: impl FnOnce(&[u8]) -> Option<Vec<u8>>,
    ) -> Result<Option<Duration>, StoreError> {
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
        Ok(u64::try_from(ttl_ms)
            .ok()
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis))
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
    /// event's key first), each with its `WAIT` when configured.
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
            let (keys, values): (Vec<Vec<u8>>, Vec<Vec<u8>>) = group.into_iter().unzip();
            let args = [arg(token), arg(millis(ttl))]
                .into_iter()
                .chain(values)
                .collect();
            let written = self.eval_write(&self.done, FENCED_DONE, keys, args).await?;
            if written != 1 {
                return Err(StoreError::LeaseLost(
                    "the event's claim was taken over by another request while this one held it (paused past its lease?)",
                ));
            }
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
    /// lock, in one script that does both only while `token` holds the lock, with its
    /// `WAIT` when configured. A lock lost meanwhile is [`StoreError::LeaseLost`]: the state
    /// stays as the lock's later holder left it.
    pub async fn commit_locked(
        &self,
        key: &StoreKey,
        token: u64,
        value: &[u8],
        ttl: Option<Duration>,
    ) -> Result<(), StoreError> {
        let keys = vec![
            self.key(key, RedisSpace::Locks),
            self.key(key, RedisSpace::Guard),
        ];
        let args = vec![arg(token), value.to_vec(), arg(ttl.map_or(0, millis))];
        let written = self
            .eval_write(&self.commit, FENCED_COMMIT, keys, args)
            .await;
        match written {
            Ok(1) => Ok(()),
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

    /// Takes, or extends while `holder` has it, the lease of its key for `ttl`: one holder
    /// at a time across replicas (a reconciler's walk of a route). True if held now.
    pub async fn lease(&self, holder: &LeaseHolder, ttl: Duration) -> Result<bool, StoreError> {
        let k = self.key(&holder.key, RedisSpace::Locks);
        let token = holder.token;
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

    /// Ends a lease `holder` has.
    pub async fn end_lease(&self, holder: &LeaseHolder) -> Result<(), StoreError> {
        self.compare_and_delete(self.key(&holder.key, RedisSpace::Locks), holder.token)
            .await
    }

    /// Reads guard state.
    pub async fn get(&self, key: &StoreKey) -> Result<Option<Vec<u8>>, StoreError> {
        let k = self.key(key, RedisSpace::Guard);
        self.run(Access::Read, move |mut c| async move { c.get(k).await })
            .await
    }

    /// Writes state that no guard lock covers but a lease does (a reconciler's position),
    /// never forgotten, under the key of `holder`'s lease and only while it has that lease
    /// ([`Self::lease`]): a replica paused past its lease cannot overwrite what the lease's
    /// next holder wrote.
    pub async fn put_leased(&self, holder: &LeaseHolder, value: &[u8]) -> Result<(), StoreError> {
        let keys = vec![
            self.key(&holder.key, RedisSpace::Locks),
            self.key(&holder.key, RedisSpace::Guard),
        ];
        let args = vec![arg(holder.token), value.to_vec()];
        let written = self
            .eval_write(&self.put_leased, FENCED_PUT, keys, args)
            .await?;
        if written == 1 {
            Ok(())
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

/// Each master's address and the first and last slot of one range it holds, from a
/// `CLUSTER SLOTS` reply (`[[first, last, [host, port, …], replicas…], …]`); a master with
/// several ranges is named once.
fn master_ranges(reply: &redis::Value) -> Vec<(String, u16, u16)> {
    let redis::Value::Array(ranges) = reply else {
        return Vec::new();
    };
    let mut masters: Vec<(String, u16, u16)> = Vec::new();
    for range in ranges {
        let redis::Value::Array(parts) = range else {
            continue;
        };
        let (Some(first), Some(last), Some(redis::Value::Array(node))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            continue;
        };
        let (Ok(first), Ok(last)) = (
            redis::from_redis_value_ref::<u16>(first),
            redis::from_redis_value_ref::<u16>(last),
        ) else {
            continue;
        };
        let host = node
            .first()
            .and_then(|h| redis::from_redis_value_ref::<String>(h).ok())
            .unwrap_or_default();
        let port = node
            .get(1)
            .and_then(|p| redis::from_redis_value_ref::<u16>(p).ok())
            .unwrap_or_default();
        let addr = format!("{host}:{port}");
        if !masters.iter().any(|(a, _, _)| *a == addr) {
            masters.push((addr, first, last));
        }
    }
    masters
}

/// A number as a script's argument.
fn arg(n: u64) -> Vec<u8> {
    n.to_string().into_bytes()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
