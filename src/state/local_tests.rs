//! The local backend through the facade: a claim of an event under a request id, a
//! guard-key lock waited for within its bound, and values read from runs off the runtime's
//! workers.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::liveness::Liveness;
use crate::state::backend::BackendChoice;
use crate::state::keys::StoreKey;
use durable_spool::Store;

use super::local::{PageLookups, Ran};
use super::{Claimed, LeaseHolder, StateStore};

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

/// Claims `event` under `request` for `token` on `state`, waiting 50 ms at most.
async fn claim(state: &StateStore, event: &StoreKey, request: &StoreKey, token: u64) -> Claimed {
    let (wait, lease) = (Duration::from_millis(50), Duration::from_secs(30));
    state
        .claim_or_wait(event, Some(request), token, wait, lease, || 1_000)
        .await
        .expect("claim")
}

#[tokio::test]
async fn a_local_claim_under_a_done_request_id_is_its_duplicate_and_claims_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("store");
    let state = open_local(&store, "");
    let (request, first, second) = (
        StoreKey::raw(b"request"),
        StoreKey::raw(b"event-1"),
        StoreKey::raw(b"event-2"),
    );
    assert_eq!(claim(&state, &first, &request, 1).await, Claimed::Owned);
    // While the first holds the request id, a second event under it waits, then is busy.
    assert_eq!(claim(&state, &second, &request, 2).await, Claimed::Busy);
    let ttl = Duration::from_secs(60);
    state
        .mark_done(&[(&request, b""), (&first, b"")], 1, 1_000, None, ttl)
        .await
        .expect("marks");
    // The sender's retry under the same request id, whatever its body says, is a duplicate
    // of the request, and its own event stays free for a delivery under another id.
    assert_eq!(
        claim(&state, &second, &request, 3).await,
        Claimed::Duplicate { by_request: true }
    );
    let other = StoreKey::raw(b"request-2");
    assert_eq!(claim(&state, &second, &other, 4).await, Claimed::Owned);
    assert_eq!(
        claim(&state, &first, &StoreKey::raw(b"request-3"), 5).await,
        Claimed::Duplicate { by_request: false }
    );
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

/// Whether a lookup may wait for a future itself: only on a thread the runtime was told
/// blocks (on a worker `block_on` panics).
fn may_block(lookups: &PageLookups) -> (Ran, bool) {
    let mut blocking = false;
    let ran = lookups.run(&mut || {
        blocking = std::panic::catch_unwind(|| {
            tokio::runtime::Handle::current().block_on(async {});
        })
        .is_ok();
    });
    (ran, blocking)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_of_run_pages_run_in_place_until_the_disk_answers_them_then_as_blocking() {
    assert_eq!(may_block(&PageLookups::new()), (Ran::InPlace, false));
    let lookups = PageLookups::new();
    // A lookup the disk answered takes longer than the page cache ever does.
    let slow = || std::thread::sleep(Duration::from_millis(2));
    assert_eq!(
        lookups.run(&mut || {}),
        Ran::InPlace,
        "the page cache answers"
    );
    // One slow lookup (a thread preempted on a busy machine) changes nothing.
    assert_eq!(lookups.run(&mut { slow }), Ran::InPlace);
    for _ in 0..40 {
        assert_eq!(lookups.run(&mut || {}), Ran::InPlace);
    }
    // Slow ones, many and often (8 of 49 lookups): the disk answers.
    for _ in 1..8 {
        assert_eq!(lookups.run(&mut { slow }), Ran::InPlace);
    }
    assert_eq!(may_block(&lookups), (Ran::Blocking, true));
    assert_eq!(lookups.run(&mut || {}), Ran::Blocking);
}

#[tokio::test]
async fn a_lookup_of_run_pages_on_a_single_threaded_runtime_runs_in_place() {
    let mut ran = false;
    PageLookups::new().run(&mut || ran = true);
    assert!(ran);
}
