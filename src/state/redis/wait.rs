//! `WAIT` in one pipeline with the writes it covers: the leases' renewal before a publish,
//! the fenced writes an answer rests on, and a duplicate's check of its mark. Each pipeline
//! runs on a connection of `WAIT`'s own ([`Link::exclusive`]).
//!
//! [`Link::exclusive`]: crate::state::redis_link::Link::exclusive

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{arg, millis, Access, RedisState};
use crate::state::keys::{RedisSpace, StoreKey};
use crate::state::redis_link::OP_TIMEOUT;
use crate::state::scripts::{RENEW, TOUCH_DONE};
use crate::store_error::StoreError;

impl RedisState {
    /// With `WAIT` configured: renews the request's leases (its claims, under `token`, and
    /// the guard-key lock it holds, under its own token) for `lease`, all only while each
    /// is still held, with a `WAIT` in the same pipeline (`RENEW`); in a cluster one per
    /// lease. A lease lost meanwhile is [`StoreError::LeaseLost`]; fewer acknowledgements
    /// than asked, a failure (503). Nothing is published under a lease that a failover
    /// could lose.
    pub async fn secure(
        &self,
        claims: &[&StoreKey],
        token: u64,
        lock: Option<(&StoreKey, u64)>,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        if self.wait.is_none() {
            return Ok(false);
        }
        let leases: Vec<(Vec<u8>, u64)> = claims
            .iter()
            .map(|k| (self.key(k, RedisSpace::Marks), token))
            .chain(lock.map(|(k, t)| (self.key(k, RedisSpace::Locks), t)))
            .collect();
        if leases.is_empty() {
            // Nothing is held (an unguarded event a replay publishes again): no WAIT.
            return Ok(false);
        }
        let groups: Vec<Vec<(Vec<u8>, u64)>> = if self.link.is_cluster() {
            leases.into_iter().map(|l| vec![l]).collect()
        } else {
            vec![leases]
        };
        for group in groups {
            let (keys, mut args): (Vec<Vec<u8>>, Vec<Vec<u8>>) =
                group.into_iter().map(|(k, t)| (k, arg(t))).unzip();
            args.push(arg(millis(lease)));
            if self.write_then_wait(RENEW, keys, args).await? != 1 {
                return Err(StoreError::LeaseLost(
                    "a claim or lock ended before the publish (paused past its lease, or lost in a failover); nothing was published",
                ));
            }
        }
        Ok(true)
    }

    /// With `WAIT` configured: a duplicate's 200 rests on a done mark that a concurrent
    /// request, or an attempt whose own `WAIT` failed, may have written moments ago. The
    /// marks of `keys` are read again and touched (`TOUCH_DONE`) with a `WAIT` in the same
    /// pipeline, on each node that holds one; a mark no longer there, or one the replicas
    /// did not acknowledge, is a failure (503).
    pub async fn replicated(&self, keys: &[&StoreKey]) -> Result<(), StoreError> {
        if self.wait.is_none() {
            return Ok(());
        }
        let keys: Vec<Vec<u8>> = keys
            .iter()
            .map(|k| self.key(k, RedisSpace::Marks))
            .collect();
        let groups: Vec<Vec<Vec<u8>>> = if self.link.is_cluster() {
            keys.into_iter().map(|k| vec![k]).collect()
        } else {
            vec![keys]
        };
        let mut done = 0;
        for group in groups {
            done += self.write_then_wait(TOUCH_DONE, group, Vec::new()).await?;
        }
        if done == 0 {
            self.healthy.store(false, Ordering::Relaxed);
            return Err(StoreError::Unreachable(
                "the done mark a duplicate rests on is not on the master (lost in a failover?)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Runs a script that writes (`source`, loaded as `script`) with `keys` and `args`:
    /// with `WAIT` configured, in one pipeline with its `WAIT`
    /// ([`RedisState::write_then_wait`]); else on the shared connection. The script's
    /// answer.
    pub(super) async fn eval_write(
        &self,
        script: &Arc<redis::Script>,
        source: &'static str,
        keys: Vec<Vec<u8>>,
        args: Vec<Vec<u8>>,
    ) -> Result<i64, StoreError> {
        if self.wait.is_some() {
            return self.write_then_wait(source, keys, args).await;
        }
        let script = script.clone();
        self.run(Access::Write, move |mut c| async move {
            let mut call = script.prepare_invoke();
            for key in &keys {
                call.key(key);
            }
            for arg in &args {
                call.arg(arg);
            }
            call.invoke_async::<i64>(&mut c).await
        })
        .await
    }

    /// The script `source` and `WAIT` for the configured replicas, as one pipeline on a
    /// connection of `WAIT`'s own: the `WAIT` covers the script's writes (Redis counts the
    /// calling connection's last write), and the connection is not shared, so the `WAIT`
    /// holds up no other request. `EVAL`, not `EVALSHA`: a pipeline cannot load a script
    /// the server lacks (a master just promoted) between its commands. A script that wrote
    /// (answered other than 0) with fewer acknowledgements than asked is a failure (503):
    /// a failover could lose the write. A failure of the connection closes it; nothing is
    /// sent again on another one.
    async fn write_then_wait(
        &self,
        source: &'static str,
        keys: Vec<Vec<u8>>,
        args: Vec<Vec<u8>>,
    ) -> Result<i64, StoreError> {
        let Some((replicas, timeout)) = self.wait else {
            return Err(StoreError::Unreachable("WAIT is not configured".into()));
        };
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(source)
            .arg(keys.len())
            .arg(&keys)
            .arg(&args)
            .cmd("WAIT")
            .arg(replicas)
            .arg(millis(timeout));
        let attempt = async {
            let mut lent = self.link.exclusive().await?;
            let reply: (i64, i64) = pipe.query_async(lent.conn()).await?;
            lent.give_back();
            Ok::<_, redis::RedisError>(reply)
        };
        let result = match tokio::time::timeout(OP_TIMEOUT + timeout, attempt).await {
            Ok(Ok((written, acked))) if written == 0 || acked >= i64::from(replicas) => {
                self.healthy.store(true, Ordering::Relaxed);
                return Ok(written);
            }
            Ok(Ok((_, acked))) => StoreError::Unreachable(
                format!("WAIT: {acked} of {replicas} replicas acknowledged the write in time")
                    .into(),
            ),
            Ok(Err(e)) => {
                self.link.exclusive_failed(Some(&e));
                StoreError::Unreachable(e.into())
            }
            Err(_) => {
                self.link.exclusive_failed(None);
                StoreError::Unreachable("no answer within the deadline".into())
            }
        };
        self.healthy.store(false, Ordering::Relaxed);
        Err(result)
    }
}
