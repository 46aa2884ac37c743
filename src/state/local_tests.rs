//! The local backend through the facade: a guard-key lock waited for within its bound, and
//! values read from runs off the runtime's workers.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::liveness::Liveness;
use crate::state::backend::BackendChoice;
use crate::state::keys::StoreKey;
use durable_spool::Store;

use super::{LeaseHolder, StateStore};

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
    let second = tokio::time::timeout(Duration::from_secs(10), state.lock(&StoreKey::raw(b"key")))
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
    let holder = LeaseHolder {
        key: key.clone(),
        token: 0,
    };
    state
        .put_leased(&holder, b"opted out", 0)
        .await
        .expect("put");
    local.journal.flush_to_run().expect("flush");
    assert_eq!(
        (local.journal.hot_len(), local.journal.runs()),
        (0, 1),
        "the value is in a run"
    );
    assert_eq!(
        state.get(&key).await.expect("get").as_deref(),
        Some(&b"opted out"[..])
    );
    state
        .put_leased(&holder, b"opted in", 0)
        .await
        .expect("put");
    assert_eq!(
        state.get(&key).await.expect("get").as_deref(),
        Some(&b"opted in"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_of_run_pages_on_a_worker_runs_as_blocking() {
    let mut waited_on_the_thread = false;
    super::local::off_worker(&mut || {
        // Only a thread the runtime was told blocks may wait for a future itself: on a
        // worker this panics.
        tokio::runtime::Handle::current().block_on(async {});
        waited_on_the_thread = true;
    });
    assert!(waited_on_the_thread);
}

#[tokio::test]
async fn a_lookup_of_run_pages_on_a_single_threaded_runtime_runs_in_place() {
    let mut ran = false;
    super::local::off_worker(&mut || ran = true);
    assert!(ran);
}
