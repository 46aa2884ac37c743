//! Per-key locks of the local backend: guard keys are serialised in process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use nohash_hasher::BuildNoHashHasher;
use tokio::sync::OwnedMutexGuard;

use crate::state::keys::Digest;

/// One async mutex per key, created on demand and forgotten when unused, so different keys
/// never wait for each other and the map does not grow without bound.
#[derive(Default)]
pub struct KeyedLocks {
    // A std mutex: it is held only to look up or insert an entry, never across an await.
    map: Mutex<HashMap<Digest, Weak<tokio::sync::Mutex<()>>, BuildNoHashHasher<Digest>>>,
}

impl KeyedLocks {
    /// Waits for and takes the lock of `key`.
    pub async fn lock(&self, key: Digest) -> OwnedMutexGuard<()> {
        let mutex = {
            let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(m) = map.get(&key).and_then(Weak::upgrade) {
                m
            } else {
                // Prune before growing: entries whose locks nobody holds are dead.
                if map.len() >= 1024 && map.len().is_power_of_two() {
                    map.retain(|_, w| w.strong_count() > 0);
                }
                let m = Arc::new(tokio::sync::Mutex::new(()));
                map.insert(key, Arc::downgrade(&m));
                m
            }
        };
        mutex.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn same_key_waits_other_keys_do_not() {
        let locks = Arc::new(KeyedLocks::default());
        let a = locks.lock(Digest::of(b"a")).await;
        let other =
            tokio::time::timeout(Duration::from_secs(1), locks.lock(Digest::of(b"b"))).await;
        assert!(other.is_ok(), "a different key must not wait");
        let l2 = locks.clone();
        let waiter = tokio::spawn(async move { l2.lock(Digest::of(b"a")).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(a);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("released lock is taken")
            .expect("task");
    }
}
