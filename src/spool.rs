//! The durable FIFO of events the broker could not take, and the task that drains it.
//!
//! An entry is written and flushed to disk before the sender gets its 200; the drainer
//! deletes it only after the broker's confirm. A crash between the confirm and the delete
//! republishes that entry once (consumers dedup on `message_id`).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config;
use crate::metrics::Metrics;
use crate::publish::{Message, PublishError, Publisher};
use crate::store::{Store, StoreError, Tree};

/// The longest a request waits for its spool entry's fsync. A disk that takes longer is
/// treated as failing: the sender gets a 503 rather than waiting on a stuck store (the
/// entry may still reach the disk and be published; consumers dedup on message_id).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How often a spool head that no queue takes is reported.
const UNROUTABLE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Why an event could not be spooled; the request answers 503 and the sender retries.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool is disabled")]
    Disabled,
    #[error("spool is full ({bytes} of {max} bytes)")]
    Full { bytes: u64, max: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Depth, size and age of the spool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpoolStatus {
    /// Entries waiting.
    pub depth: u64,
    /// Bytes waiting (encoded entries).
    pub bytes: u64,
    /// Age of the oldest entry in seconds, if any.
    pub oldest_age_secs: Option<u64>,
}

/// The spool.
pub struct Spool {
    tree: Tree,
    store: Store,
    enabled: bool,
    max_bytes: u64,
    depth: AtomicU64,
    bytes: AtomicU64,
    next_seq: AtomicU64,
    /// Depth and bytes are mirrored into its gauges.
    metrics: Arc<Metrics>,
    /// Receipt time (Unix seconds) of the oldest entry, or -1.
    oldest_secs: AtomicI64,
    /// Wakes the drainer when an entry is added.
    added: tokio::sync::Notify,
    /// Set when an event was refused for lack of room, cleared when an entry leaves:
    /// `bytes < max_bytes` alone would call a spool ready that refuses every event.
    refused: AtomicBool,
    /// Set when the store refused to write or delete an entry (a full disk, say), cleared
    /// when it takes one again.
    store_failing: AtomicBool,
}

impl Spool {
    /// Opens the spool tree and counts what a previous run left in it.
    pub fn open(
        store: &Store,
        cfg: &config::Spool,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StoreError> {
        let tree = store.tree("spool")?;
        let (depth, bytes) = count(&tree)?;
        let next_seq = tree
            .last()?
            .and_then(|(k, _)| k.try_into().ok().map(u64::from_be_bytes))
            .map_or(0, |s| s + 1);
        let spool = Self {
            tree,
            store: store.clone(),
            enabled: cfg.enabled,
            max_bytes: cfg.max_bytes,
            depth: AtomicU64::new(depth),
            bytes: AtomicU64::new(bytes),
            next_seq: AtomicU64::new(next_seq),
            metrics,
            oldest_secs: AtomicI64::new(-1),
            added: tokio::sync::Notify::new(),
            refused: AtomicBool::new(false),
            store_failing: AtomicBool::new(false),
        };
        spool.refresh_oldest()?;
        spool.publish_gauges();
        Ok(spool)
    }

    /// Whether nothing is waiting. While something is, new events queue behind it.
    pub fn is_empty(&self) -> bool {
        self.depth.load(Ordering::SeqCst) == 0
    }

    /// Whether the spool takes events: enabled, not at its bound, no event refused for lack
    /// of room since an entry last left, and the store taking writes.
    pub fn has_room(&self) -> bool {
        self.enabled
            && !self.refused.load(Ordering::SeqCst)
            && !self.store_failing.load(Ordering::SeqCst)
            && self.bytes.load(Ordering::SeqCst) < self.max_bytes
    }

    /// Whether entries wait behind one the store will not delete: new events queue behind
    /// them, so none can be taken even while the broker is connected.
    pub fn is_stuck(&self) -> bool {
        self.store_failing.load(Ordering::SeqCst) && !self.is_empty()
    }

    /// Appends the message and makes it durable.
    pub async fn push(&self, msg: &Message<'_>) -> Result<(), SpoolError> {
        if !self.enabled {
            return Err(SpoolError::Disabled);
        }
        let entry = encode(msg);
        let size = entry.len() as u64;
        let before = self.bytes.fetch_add(size, Ordering::SeqCst);
        if before + size > self.max_bytes {
            self.bytes.fetch_sub(size, Ordering::SeqCst);
            self.refused.store(true, Ordering::SeqCst);
            return Err(SpoolError::Full {
                bytes: before,
                max: self.max_bytes,
            });
        }
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.tree.insert(&seq.to_be_bytes(), &entry) {
            self.bytes.fetch_sub(size, Ordering::SeqCst);
            self.store_failing.store(true, Ordering::SeqCst);
            return Err(e.into());
        }
        self.depth.fetch_add(1, Ordering::SeqCst);
        let _ = self.oldest_secs.compare_exchange(
            -1,
            msg.timestamp_secs as i64,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        self.publish_gauges();
        self.added.notify_one();
        // The 200 promises the event survives a crash: it must be on disk first. An entry
        // whose flush failed stays queued (the sender's retry may then be published twice,
        // which consumers dedup on message_id), but its sender gets a 503.
        let flushed = tokio::time::timeout(FLUSH_TIMEOUT, self.store.flush())
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Io(format!(
                    "the spool's fsync took longer than {FLUSH_TIMEOUT:?}"
                )))
            });
        self.store_failing.store(flushed.is_err(), Ordering::SeqCst);
        Ok(flushed?)
    }

    /// Depth, bytes and the oldest entry's age.
    pub fn status(&self, now_secs: i64) -> SpoolStatus {
        let oldest = self.oldest_secs.load(Ordering::SeqCst);
        SpoolStatus {
            depth: self.depth.load(Ordering::SeqCst),
            bytes: self.bytes.load(Ordering::SeqCst),
            oldest_age_secs: (oldest >= 0).then(|| (now_secs - oldest).max(0) as u64),
        }
    }

    /// Republishes entries in order until `stop`; each is deleted only after its ack.
    pub async fn drain(
        self: Arc<Self>,
        publisher: Publisher,
        exchange: String,
        stop: CancellationToken,
    ) {
        let mut retry = RETRY_MIN;
        let mut failing = false;
        let mut last_unroutable_log: Option<std::time::Instant> = None;
        loop {
            if stop.is_cancelled() {
                return;
            }
            let head = match self.tree.first() {
                Ok(h) => h,
                Err(error) => {
                    tracing::error!(%error, "cannot read the spool; retrying");
                    sleep_or_stop(&stop, RETRY_MAX).await;
                    continue;
                }
            };
            let Some((key, value)) = head else {
                let added = self.added.notified();
                if self.is_empty() {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = added => {}
                    }
                }
                continue;
            };
            if !publisher.is_connected() {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = publisher.wait_connected() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            let Some(msg) = decode(&value) else {
                // An entry this version cannot read would block the queue forever; keep a
                // copy in a side tree for an operator and move on.
                tracing::error!(key = ?key, "unreadable spool entry moved to spool_corrupt");
                if let Ok(side) = self.store.tree("spool_corrupt") {
                    let _ = side.insert(&key, &value);
                }
                self.remove(&key, value.len() as u64, &stop).await;
                continue;
            };
            match publisher.publish(&exchange, &msg).await {
                Ok(()) => {
                    self.remove(&key, value.len() as u64, &stop).await;
                    if failing {
                        tracing::info!(
                            depth = self.depth.load(Ordering::SeqCst),
                            "spool draining again"
                        );
                    }
                    retry = RETRY_MIN;
                    failing = false;
                }
                Err(error) => {
                    let unroutable = matches!(error, PublishError::Unroutable(_));
                    if unroutable
                        && last_unroutable_log.is_none_or(|t| t.elapsed() >= UNROUTABLE_LOG_EVERY)
                    {
                        // Data stays safe in the spool, but nothing drains until an operator
                        // binds a queue: that is an ERROR by our logging rule. Once a minute
                        // is loud enough without flooding the log.
                        tracing::error!(%error, event_id = %msg.message_id, depth = self.depth.load(Ordering::SeqCst), "spooled event is unroutable; bind a queue to the exchange");
                        last_unroutable_log = Some(std::time::Instant::now());
                    } else if !unroutable && !failing {
                        tracing::warn!(%error, "spool drain paused");
                    }
                    failing = true;
                    sleep_or_stop(&stop, retry).await;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Deletes a published (or unreadable) entry. While the store refuses, it retries the
    /// delete, not the publish: publishing the head again on every failed delete flooded the
    /// broker with copies (thousands a second on a full disk). The entries behind it wait;
    /// only a shutdown in the meantime leaves it to be published once more after a restart.
    async fn remove(&self, key: &[u8], size: u64, stop: &CancellationToken) {
        let mut retry = RETRY_MIN;
        let mut reported = false;
        loop {
            match self.tree.remove(key) {
                Ok(removed) => {
                    if removed.is_some() {
                        self.depth.fetch_sub(1, Ordering::SeqCst);
                        self.bytes.fetch_sub(size, Ordering::SeqCst);
                        self.refused.store(false, Ordering::SeqCst);
                    }
                    self.store_failing.store(false, Ordering::SeqCst);
                    if reported {
                        tracing::info!("published spool entry deleted; the spool drains again");
                    }
                    break;
                }
                Err(error) => {
                    self.store_failing.store(true, Ordering::SeqCst);
                    if !reported {
                        tracing::error!(%error, "cannot delete a published spool entry; the spool waits until the store takes writes again");
                        reported = true;
                    }
                    if stop.is_cancelled() {
                        tracing::warn!("shutting down with a published spool entry not deleted; it will be published again after the restart");
                        return;
                    }
                    sleep_or_stop(stop, retry).await;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
        if let Err(error) = self.refresh_oldest() {
            tracing::warn!(%error, "cannot read the spool head");
        }
        self.publish_gauges();
    }

    fn refresh_oldest(&self) -> Result<(), StoreError> {
        let oldest = self
            .tree
            .first()?
            .and_then(|(_, v)| decode(&v))
            .map_or(-1, |m| m.timestamp_secs as i64);
        self.oldest_secs.store(oldest, Ordering::SeqCst);
        Ok(())
    }

    fn publish_gauges(&self) {
        self.metrics
            .spool_depth
            .set(self.depth.load(Ordering::SeqCst) as i64);
        self.metrics
            .spool_bytes
            .set(self.bytes.load(Ordering::SeqCst) as i64);
    }
}

/// Reads the spool of a store directly (for `hookgate spool status` when no gateway runs).
pub fn status_of_store(store: &Store, now_secs: i64) -> Result<SpoolStatus, StoreError> {
    let tree = store.tree("spool")?;
    let (depth, bytes) = count(&tree)?;
    let oldest = tree.first()?.and_then(|(_, v)| decode(&v));
    Ok(SpoolStatus {
        depth,
        bytes,
        oldest_age_secs: oldest.map(|m| (now_secs - m.timestamp_secs as i64).max(0) as u64),
    })
}

fn count(tree: &Tree) -> Result<(u64, u64), StoreError> {
    let mut depth = 0;
    let mut bytes = 0;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = tree.page(after.as_deref(), 10_000)?;
        let Some((last, _)) = page.last() else {
            return Ok((depth, bytes));
        };
        after = Some(last.clone());
        depth += page.len() as u64;
        bytes += page.iter().map(|(_, v)| v.len() as u64).sum::<u64>();
    }
}

async fn sleep_or_stop(stop: &CancellationToken, d: Duration) {
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = tokio::time::sleep(d) => {}
    }
}

/// Entry format: 4-byte big-endian length of the JSON metadata, the metadata, the raw body.
fn encode(msg: &Message<'_>) -> Vec<u8> {
    let meta = serde_json::to_vec(msg).unwrap_or_default();
    let mut out = Vec::with_capacity(4 + meta.len() + msg.body.len());
    out.extend_from_slice(&(meta.len() as u32).to_be_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(&msg.body);
    out
}

fn decode(entry: &[u8]) -> Option<Message<'static>> {
    let len = u32::from_be_bytes(entry.get(..4)?.try_into().ok()?) as usize;
    let meta = entry.get(4..4 + len)?;
    let mut msg: Message<'static> = serde_json::from_slice(meta).ok()?;
    msg.body = bytes::Bytes::copy_from_slice(entry.get(4 + len..)?);
    Some(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: &str, body: &str) -> Message<'static> {
        Message {
            routing_key: "k".into(),
            message_id: id.to_owned().into(),
            timestamp_secs: 100,
            request_id: "r".into(),
            event_type: "t".into(),
            attempt: Some(2),
            route: "botix".into(),
            received_at: "2026-11-29T10:00:00Z".into(),
            body: bytes::Bytes::copy_from_slice(body.as_bytes()),
        }
    }

    #[test]
    fn entries_round_trip_byte_for_byte() {
        let m = msg("e1", "{\"a\": \"\u{20ac}\"}  ");
        assert_eq!(decode(&encode(&m)), Some(m));
        assert_eq!(decode(b"\0\0"), None);
    }

    #[tokio::test]
    async fn push_counts_bounds_and_survives_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let metrics = Arc::new(Metrics::new());
        let cfg = config::Spool {
            enabled: true,
            max_bytes: 600,
        };
        {
            let store = Store::open(dir.path()).expect("open");
            let spool = Spool::open(&store, &cfg, metrics.clone()).expect("spool");
            spool.push(&msg("e1", "{}")).await.expect("push");
            spool.push(&msg("e2", "{}")).await.expect("push");
            let full = spool.push(&msg("e3", &"x".repeat(500))).await;
            assert!(matches!(full, Err(SpoolError::Full { .. })), "{full:?}");
            assert!(
                !spool.has_room(),
                "a spool that refused an event is not ready"
            );
            assert_eq!(spool.status(160).depth, 2);
            assert_eq!(spool.status(160).oldest_age_secs, Some(60));
        }
        let store = Store::open(dir.path()).expect("reopen");
        let spool = Spool::open(&store, &cfg, metrics).expect("spool");
        assert_eq!(spool.status(100).depth, 2);
        assert_eq!(status_of_store(&store, 100).expect("status").depth, 2);
        let disabled = Spool::open(
            &store,
            &config::Spool {
                enabled: false,
                max_bytes: 600,
            },
            Arc::new(Metrics::new()),
        )
        .expect("spool");
        assert!(matches!(
            disabled.push(&msg("e", "{}")).await,
            Err(SpoolError::Disabled)
        ));
    }
}
