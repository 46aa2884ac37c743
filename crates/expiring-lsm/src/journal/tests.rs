//! The journal's tests, and the kit the tests of its files share.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::batch::{decode_batch, Open};
use super::hot::{Entry, Value, HOT_SET_LIMIT_FACTOR};
use super::shared::{lock, Shared};
use super::threads::{merge_backoff, spawn_watched, NOTHING_TO_FLUSH_PAUSE};
use super::*;
use crate::wal::FRAME_HEAD;
use crate::{Digest, Error, LegacyBatches};
use disk_seam::sim::SimDisk;
use disk_seam::Disk;

const DAY: Duration = Duration::from_secs(86_400);

/// Legacy batches in memory, as a store written before the journal had files holds them.
#[derive(Default)]
pub(crate) struct MemTree(Mutex<std::collections::BTreeMap<Vec<u8>, Vec<u8>>>);

impl MemTree {
    pub(crate) fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        lock(&self.0).insert(key.to_vec(), value.to_vec());
        Ok(())
    }
}

impl LegacyBatches for MemTree {
    fn page(&self, after: Option<&[u8]>, limit: usize) -> Result<Vec<crate::Entry>, Error> {
        let map = lock(&self.0);
        let from = after.map_or(std::ops::Bound::Unbounded, |k| {
            std::ops::Bound::Excluded(k.to_vec())
        });
        let page = map.range((from, std::ops::Bound::Unbounded)).take(limit);
        Ok(page.map(|(k, v)| (k.clone(), v.clone())).collect())
    }
    fn remove(&self, key: &[u8]) -> Result<(), Error> {
        lock(&self.0).remove(key);
        Ok(())
    }
    fn len(&self) -> usize {
        lock(&self.0).len()
    }
}

/// The store folder beside the journal's: only its legacy batches matter here.
#[derive(Default)]
pub(crate) struct MemStore(Arc<MemTree>);

impl MemStore {
    pub(crate) fn tree(&self, _name: &str) -> Result<Arc<MemTree>, Error> {
        Ok(self.0.clone())
    }
}

pub(crate) fn temp_store() -> (tempfile::TempDir, MemStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    (dir, MemStore::default())
}

fn settings(hot_entries: usize, now: &Arc<AtomicI64>) -> Settings {
    let now = now.clone();
    Settings {
        hot_entries,
        ttl: DAY,
        clock: Arc::new(move || now.load(Ordering::SeqCst)),
        segment_bytes: 1 << 20,
        commit_interval: Duration::from_millis(1),
        durable_wait: Duration::from_secs(5),
        needs_restart: Arc::new(|_| {}),
        disk: disk_seam::real(),
        background: true,
        page_reads: crate::journal::read_here,
    }
}

/// A journal whose background clock stands at `now_ms` and whose hot set is flushed
/// only when asked.
pub(crate) fn open_at(store: &MemStore, dir: &Path, now_ms: i64) -> Arc<Journal> {
    let now = Arc::new(AtomicI64::new(now_ms));
    open_with(store, dir, now_ms, settings(usize::MAX, &now))
}

/// A journal with `settings`, opened at `now_ms`.
pub(crate) fn open_with(
    store: &MemStore,
    dir: &Path,
    now_ms: i64,
    settings: Settings,
) -> Arc<Journal> {
    Journal::open(store.tree("state").expect("tree"), dir, now_ms, settings).expect("open")
}

pub(crate) fn get(j: &Journal, key: &[u8]) -> Option<Vec<u8>> {
    j.get(&Digest::of(key)).expect("get")
}

pub(crate) fn put(j: &Journal, key: &[u8], value: &[u8], expires_ms: i64, now_ms: i64) {
    j.put(&Digest::of(key), value, expires_ms, now_ms)
        .expect("put");
}

#[test]
fn values_survive_a_reopen_and_expired_ones_do_not() {
    let (dir, store) = temp_store();
    {
        let j = open_at(&store, dir.path(), 0);
        put(&j, b"a", b"1", 1_000, 0);
        put(&j, b"b", b"2", 100, 0);
        put(&j, b"a", b"3", 2_000, 10); // supersedes the first record of a
        j.modify(&Digest::of(b"c"), 10, |_| {
            (
                Change::Put {
                    value: b"claim",
                    expires_ms: 5_000,
                    durable: false,
                },
                (),
            )
        })
        .expect("claim");
        assert_eq!(j.hot_len(), 3);
    }
    let j = open_at(&store, dir.path(), 500);
    assert_eq!(get(&j, b"a").as_deref(), Some(&b"3"[..]));
    assert_eq!(get(&j, b"b"), None, "expired before the reopen");
    assert_eq!(get(&j, b"c"), None, "claims are never written");
    assert_eq!(
        (j.hot_len(), j.runs()),
        (0, 1),
        "what the open replayed is in a run before it answers"
    );
}

#[test]
fn a_flushed_hot_set_is_read_from_its_run_and_not_replayed() {
    let (dir, store) = temp_store();
    {
        let j = open_at(&store, dir.path(), 0);
        for i in 0..10u8 {
            put(&j, &[i], &[i, i], 1_000, 0);
        }
        j.flush_to_run().expect("flush");
        assert_eq!((j.hot_len(), j.runs(), j.journal_segments()), (0, 1, 1));
        for i in 0..10u8 {
            assert_eq!(get(&j, &[i]), Some(vec![i, i]), "key {i} from the run");
        }
        put(&j, &[10], b"hot", 1_000, 0);
        put(&j, &[0], b"newer", 1_000, 0);
    }
    let j = open_at(&store, dir.path(), 0);
    assert_eq!(
        (j.hot_len(), j.runs()),
        (0, 2),
        "the open wrote what it replayed to a run of its own"
    );
    assert_eq!(
        get(&j, &[0]).as_deref(),
        Some(&b"newer"[..]),
        "hot before disk"
    );
    assert_eq!(get(&j, &[5]), Some(vec![5, 5]));
    assert_eq!(get(&j, &[10]).as_deref(), Some(&b"hot"[..]));
    assert_eq!(j.len(), 12, "the run's ten and the hot two");
}

#[test]
fn a_key_the_runs_answered_for_is_read_anew_once_a_newer_run_holds_it() {
    let (dir, store) = temp_store();
    let j = open_at(&store, dir.path(), 0);
    put(&j, b"old", b"v0", 1_000, 0);
    j.flush_to_run().expect("flush");
    // The runs' two kinds of answer, each remembered: a record, and none.
    assert_eq!(get(&j, b"old").as_deref(), Some(&b"v0"[..]));
    assert_eq!(get(&j, b"new"), None);
    put(&j, b"old", b"v1", 1_000, 1);
    put(&j, b"new", b"v1", 1_000, 1);
    // Through a run and out of the hot set: what the runs said before is stale now.
    j.flush_to_run().expect("flush");
    assert_eq!((j.hot_len(), j.runs()), (0, 2));
    assert_eq!(get(&j, b"old").as_deref(), Some(&b"v1"[..]));
    assert_eq!(get(&j, b"new").as_deref(), Some(&b"v1"[..]));
}

/// A batch as a store written before the journal had files holds it.
fn legacy_batch(seq: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut open = Open::new(seq);
    open.append(&Digest::of(key), 1_000, value, 0);
    open.buf[FRAME_HEAD..].to_vec()
}

#[test]
fn legacy_batches_are_replayed_then_moved_to_a_run() {
    let (dir, store) = temp_store();
    let tree = store.tree("state").expect("tree");
    tree.insert(&0u64.to_be_bytes(), &legacy_batch(0, b"a", b"1"))
        .expect("insert");
    tree.insert(&1u64.to_be_bytes(), &legacy_batch(1, b"b", b"2"))
        .expect("insert");
    {
        let j = open_at(&store, dir.path(), 0);
        assert_eq!(
            (get(&j, b"a"), get(&j, b"b")),
            (Some(b"1".to_vec()), Some(b"2".to_vec()))
        );
        assert_eq!(
            (j.legacy_batches(), j.hot_len(), j.runs()),
            (0, 0, 1),
            "the open moved them to a run"
        );
        put(&j, b"a", b"3", 1_000, 0);
        assert!(j.sync_point().0 > 1, "numbered after the legacy batches");
        j.flush_to_run().expect("flush");
    }
    let j = open_at(&store, dir.path(), 0);
    assert_eq!(get(&j, b"a").as_deref(), Some(&b"3"[..]));
    assert_eq!(get(&j, b"b").as_deref(), Some(&b"2"[..]));
}

#[test]
fn a_batch_a_run_holds_is_not_replayed_over_the_run() {
    let (dir, store) = temp_store();
    {
        let j = open_at(&store, dir.path(), 0);
        put(&j, b"k", b"new", 1_000, 0);
        j.flush_to_run().expect("flush");
    }
    // As if the flush had written its run but not deleted the legacy batch it holds.
    let tree = store.tree("state").expect("tree");
    tree.insert(&0u64.to_be_bytes(), &legacy_batch(0, b"k", b"old"))
        .expect("insert");
    let j = open_at(&store, dir.path(), 0);
    assert_eq!(get(&j, b"k").as_deref(), Some(&b"new"[..]));
    assert_eq!((j.legacy_batches(), j.hot_len()), (0, 0), "deleted at open");
}

#[test]
fn a_newer_record_keeps_the_later_expiry_of_the_one_it_supersedes() {
    let (dir, store) = temp_store();
    let j = open_at(&store, dir.path(), 0);
    put(&j, b"k", b"long", 9_000, 0);
    j.flush_to_run().expect("flush");
    put(&j, b"k", b"short", 500, 1);
    // Forgetting the newer record at 500 would bring "long" back from the run.
    assert_eq!(j.sweep(600).expect("sweep"), 0);
    assert_eq!(get(&j, b"k").as_deref(), Some(&b"short"[..]));
    j.flush_to_run().expect("flush");
    j.merge_now().expect("merge");
    assert_eq!(get(&j, b"k").as_deref(), Some(&b"short"[..]));
}

/// Sets a memory-only value (a claim) on `key`, whatever it holds.
fn claim(j: &Journal, key: &[u8], value: &[u8], now_ms: i64) {
    j.modify(&Digest::of(key), now_ms, |_| {
        let change = Change::Put {
            value,
            expires_ms: now_ms + 1_000,
            durable: false,
        };
        (change, ())
    })
    .expect("claim");
}

#[test]
fn a_durable_value_under_a_claim_goes_to_the_run_of_its_batch_and_outlives_restarts() {
    let mut folder = SimFolder::new(11, "/var/lib/hookgate", 4096);
    let j = folder.open(0);
    put(&j, b"k", b"older", i64::MAX, 0);
    j.flush_to_run().expect("flush");
    put(&j, b"k", b"newer", i64::MAX, 1);
    put(&j, b"other", b"v", i64::MAX, 1);
    j.write_now().expect("commit");
    claim(&j, b"k", b"claim", 2);
    // The run holds every batch so far (it is written for "other"), the one of "newer"
    // included: the journal no longer replays it, so the run must hold "newer" though
    // a claim covers it.
    j.flush_to_run().expect("flush");
    let j = folder.reopen_after_restart(j, 2);
    assert_eq!(
        get(&j, b"k").as_deref(),
        Some(&b"newer"[..]),
        "a process restart read the value before it"
    );
    let j = folder.reopen_after_power_cut(j, 2);
    assert_eq!(
        get(&j, b"k").as_deref(),
        Some(&b"newer"[..]),
        "a power cut read the value before it"
    );
}

#[test]
fn a_hot_entry_takes_no_room_for_the_durable_record_a_claim_may_cover() {
    // The hot set holds up to four times `hot_entries` of them: the record a claim
    // covers is boxed inside the field that tells the two kinds apart, so an entry is its
    // inline value, its expiry and that field.
    assert!(std::mem::size_of::<Entry>() <= 88);
    // A dedup mark with its decision record or a message's guard state (up to about 60
    // bytes) needs no allocation of its own.
    assert!(matches!(Value::new(&[7; 60]), Value::Inline { .. }));
    assert!(matches!(Value::new(&[7; 63]), Value::Heap(_)));
    assert_eq!(Value::new(&[7; 60]).as_slice(), &[7; 60]);
}

#[test]
fn a_released_claim_gives_back_the_durable_value_it_covered_not_an_older_one() {
    let (dir, store) = temp_store();
    let j = open_at(&store, dir.path(), 0);
    put(&j, b"k", b"older", i64::MAX, 0);
    j.flush_to_run().expect("flush");
    put(&j, b"k", b"newer", i64::MAX, 1);
    claim(&j, b"k", b"claim", 2);
    assert_eq!(get(&j, b"k").as_deref(), Some(&b"claim"[..]));
    j.forget_volatile_if(&Digest::of(b"k"), |v| v == b"claim");
    assert_eq!(get(&j, b"k").as_deref(), Some(&b"newer"[..]));
    // Released again after the run took the covered value: the run answers.
    claim(&j, b"k", b"claim", 3);
    j.flush_to_run().expect("flush");
    assert_eq!(get(&j, b"k").as_deref(), Some(&b"claim"[..]));
    j.forget_volatile_if(&Digest::of(b"k"), |v| v == b"claim");
    assert_eq!(get(&j, b"k").as_deref(), Some(&b"newer"[..]));
    assert_eq!((j.hot_len(), j.runs()), (0, 2));
}

#[test]
fn the_flush_thread_writes_a_run_once_the_hot_set_is_full() {
    let (dir, store) = temp_store();
    let now = Arc::new(AtomicI64::new(0));
    let j = open_with(&store, dir.path(), 0, settings(8, &now));
    for i in 0..20u8 {
        put(&j, &[i], b"v", 1_000, 0);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while j.runs() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(j.runs() >= 1, "no run written");
    assert!(j.hot_len() < 20);
    for i in 0..20u8 {
        assert_eq!(get(&j, &[i]).as_deref(), Some(&b"v"[..]), "key {i}");
    }
}

#[tokio::test]
async fn a_change_is_durable_once_the_group_commit_flushed_its_batch() {
    let (dir, store) = temp_store();
    let j = open_at(&store, dir.path(), 0);
    // Nothing appended: nothing to wait for.
    let idle = j.sync_point();
    j.durable(idle).await.expect("nothing pending");
    put(&j, b"a", b"1", 1_000, 0);
    let point = j.sync_point();
    assert!(point.0 > idle.0, "a change moves the point");
    j.durable(point)
        .await
        .expect("flushed by the writer thread");
    assert!(j.shared.progress.get().durable_below >= point.0);
}

/// Waits, at most 30 s, until `condition` holds.
pub(crate) fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn while_runs_cannot_be_written_the_hot_set_refuses_new_keys_past_four_times_its_size() {
    let (dir, store) = temp_store();
    let now = Arc::new(AtomicI64::new(0));
    let hot = 16;
    let j = open_with(&store, dir.path(), 0, settings(hot, &now));
    // A file where the runs' folder was: every run write fails.
    let runs = dir.path().join(RUNS_DIR);
    std::fs::remove_dir_all(&runs).expect("remove the runs' folder");
    std::fs::write(&runs, b"not a folder").expect("a file in its place");
    let key = |i: usize| format!("k{i}").into_bytes();
    let expires_ms = DAY.as_millis() as i64;
    for i in 0..hot {
        put(&j, &key(i), b"v", expires_ms, 0);
    }
    wait_until("a run write failed", || {
        j.shared.flush_failing.load(Ordering::Relaxed)
    });
    let mut taken = hot;
    let refused = loop {
        match j.put(&Digest::of(&key(taken)), b"v", expires_ms, 0) {
            Ok(()) => taken += 1,
            Err(error) => break error,
        }
        assert!(taken <= 100 * hot, "the hot set kept growing: {taken}");
    };
    assert_eq!(
        taken,
        HOT_SET_LIMIT_FACTOR * hot,
        "refused at {taken}: {refused}"
    );
    assert!(matches!(refused, Error::Unwritable(_)), "{refused:?}");
    assert!(j.is_failing(), "readiness reports it");
    // A key the hot set holds is still written.
    put(&j, &key(0), b"w", expires_ms, 0);
    assert_eq!(j.hot_len(), taken);

    std::fs::remove_file(&runs).expect("remove the file");
    std::fs::create_dir(&runs).expect("the runs' folder again");
    wait_until("runs are written again", || !j.is_failing());
    // New keys are taken again.
    put(&j, &key(taken), b"v", expires_ms, 0);
    assert_eq!(get(&j, b"k0").as_deref(), Some(&b"w"[..]));
}

#[test]
fn while_the_journal_cannot_be_written_the_flush_thread_rests_and_the_hot_set_refuses_new_keys() {
    let (dir, store) = temp_store();
    let now = Arc::new(AtomicI64::new(0));
    let hot = 16;
    // Segments of a few batches: the journal soon needs a new one.
    let settings = Settings {
        segment_bytes: 512,
        ..settings(hot, &now)
    };
    let j = open_with(&store, dir.path(), 0, settings);
    // A file where the journal's folder was: no new segment can be made.
    let journal = dir.path().join(JOURNAL_DIR);
    // Moved aside, not deleted: the flush thread may be making a spare segment in it.
    std::fs::rename(&journal, dir.path().join("aside")).expect("move the journal's folder");
    std::fs::write(&journal, b"not a folder").expect("a file in its place");
    let key = |i: usize| format!("k{i}").into_bytes();
    let expires_ms = DAY.as_millis() as i64;
    let mut taken = 0;
    while !j.shared.failing.load(Ordering::SeqCst) {
        put(&j, &key(taken), b"v", expires_ms, 0);
        let _ = j.write_now();
        taken += 1;
        assert!(taken < 1_000, "the journal never failed");
    }
    // What reached the journal before it failed goes to a run; what follows cannot.
    j.shared.flush_to_run().expect("flush what is on disk");
    while j.hot_len() < hot {
        put(&j, &key(taken), b"v", expires_ms, 0);
        taken += 1;
    }
    // The hot set is full and nothing in it is on disk: the flush thread finds nothing
    // to write, and rests between its looks instead of locking every map again at once.
    wait_until("the flush thread looked", || {
        j.shared.flush_passes.load(Ordering::SeqCst) > 0
    });
    let before = j.shared.flush_passes.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(500));
    let passes = j.shared.flush_passes.load(Ordering::SeqCst) - before;
    assert!(
        passes <= 500 / NOTHING_TO_FLUSH_PAUSE.as_millis() as u64 + 2,
        "{passes} flush passes in 500 ms with nothing to flush"
    );
    let refused = loop {
        match j.put(&Digest::of(&key(taken)), b"v", expires_ms, 0) {
            Ok(()) => taken += 1,
            Err(error) => break error,
        }
        assert!(
            j.hot_len() <= 100 * hot,
            "the hot set kept growing: {taken}"
        );
    };
    assert_eq!(
        j.hot_len(),
        HOT_SET_LIMIT_FACTOR * hot,
        "refused at {}: {refused}",
        j.hot_len()
    );
    assert!(matches!(refused, Error::Unwritable(_)), "{refused:?}");
    assert!(j.is_failing(), "readiness reports it");
}

#[test]
fn a_thread_of_the_journal_that_ends_before_it_is_dropped_marks_the_process_for_a_restart() {
    let (dir, store) = temp_store();
    let now = Arc::new(AtomicI64::new(0));
    let reason = Arc::new(Mutex::new(None));
    let kept = reason.clone();
    let watched = Settings {
        needs_restart: Arc::new(move |why| *lock(&kept) = Some(why)),
        ..settings(16, &now)
    };
    let j = open_with(&store, dir.path(), 0, watched);
    fn dies(_: &Shared) {
        panic!("a thread of the journal panics");
    }
    let thread = spawn_watched("state-test", &j.shared, dies).expect("spawn");
    assert!(thread.join().is_err(), "the thread panicked");
    assert_eq!(
        lock(&reason).as_deref(),
        Some("the state store's state-test thread ended")
    );
    // The journal's own threads end at its drop without marking anything.
    let quiet = Arc::new(Mutex::new(None::<String>));
    let marked = quiet.clone();
    let (j2_dir, j2_store) = temp_store();
    let j2 = open_with(
        &j2_store,
        j2_dir.path(),
        0,
        Settings {
            needs_restart: Arc::new(move |why| *lock(&marked) = Some(why)),
            ..settings(16, &now)
        },
    );
    drop(j2);
    assert_eq!(*lock(&quiet), None);
}

#[test]
fn a_group_commit_gives_its_buffer_to_the_batch_after_the_next() {
    let (dir, store) = temp_store();
    let j = open_at(&store, dir.path(), 0);
    let open_buffer = |j: &Journal| j.shared.lock_open().buf.as_ptr();
    let first = open_buffer(&j);
    put(&j, b"a", b"v", i64::MAX, 0);
    j.write_now().expect("commit");
    put(&j, b"b", b"v", i64::MAX, 0);
    j.write_now().expect("commit");
    assert_eq!(
        open_buffer(&j),
        first,
        "the first batch's buffer, written, holds the third batch"
    );
    assert_eq!(get(&j, b"a").as_deref(), Some(&b"v"[..]));
    assert_eq!(get(&j, b"b").as_deref(), Some(&b"v"[..]));
}

thread_local! {
    /// Lookups this thread ran through [`counted_page_reads`].
    static PAGE_READS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn counted_page_reads(lookup: &mut dyn FnMut()) {
    PAGE_READS.with(|n| n.set(n.get() + 1));
    lookup();
}

/// A journal with `page_reads` whose key `on disk` is in a run.
fn on_disk_with(page_reads: PageReads) -> (tempfile::TempDir, MemStore, Arc<Journal>) {
    let (dir, store) = temp_store();
    let now = Arc::new(AtomicI64::new(0));
    let settings = Settings {
        page_reads,
        ..settings(usize::MAX, &now)
    };
    let j = open_with(&store, dir.path(), 0, settings);
    put(&j, b"on disk", b"v", i64::MAX, 0);
    j.flush_to_run().expect("flush");
    (dir, store, j)
}

#[test]
fn only_a_key_a_run_may_hold_that_is_neither_hot_nor_remembered_is_looked_up_through_page_reads() {
    let (_dir, _store, j) = on_disk_with(counted_page_reads);
    put(&j, b"on disk and hot", b"v", i64::MAX, 0);
    j.flush_to_run().expect("flush");
    put(&j, b"hot", b"v", i64::MAX, 0);
    put(&j, b"on disk and hot", b"w", i64::MAX, 0);
    let reads_of = |key: &[u8]| {
        let before = PAGE_READS.with(|n| n.get());
        let value = get(&j, key);
        (value, PAGE_READS.with(|n| n.get()) - before)
    };
    assert_eq!(reads_of(b"never written"), (None, 0), "no filter holds it");
    assert_eq!(
        reads_of(b"on disk and hot"),
        (Some(b"w".to_vec()), 0),
        "a run may hold it, but the hot set answers"
    );
    assert_eq!(reads_of(b"on disk"), (Some(b"v".to_vec()), 1));
    assert_eq!(
        reads_of(b"on disk"),
        (Some(b"v".to_vec()), 0),
        "the runs' answer is remembered"
    );
}

/// A `page_reads` that does not run the lookup it is given.
fn dropped_page_reads(_: &mut dyn FnMut()) {}

#[test]
fn a_lookup_page_reads_did_not_run_is_run_by_the_caller() {
    let (_dir, _store, j) = on_disk_with(dropped_page_reads);
    assert_eq!(get(&j, b"on disk").as_deref(), Some(&b"v"[..]));
}

#[tokio::test]
async fn records_nobody_waits_for_are_committed_all_the_same() {
    let (dir, store) = temp_store();
    let j = open_at(&store, dir.path(), 0);
    // The first record finds the writer idle; the second comes while it sleeps a timed
    // wait after that commit, which nothing wakes; the third after it has idled again.
    for (key, pause) in [(b"a", 0), (b"b", 0), (b"c", 400)] {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        put(&j, key, b"1", 1_000, 0);
        let point = j.sync_point();
        // Polled, not waited for with `durable`, which would ask for the commit.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !j.shared.progress.get().settles(point) {
            assert!(
                Instant::now() < deadline,
                "the open batch of {key:?} was never committed"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(j.shared.progress.get().durable_below, point.0);
    }
}

#[tokio::test]
async fn a_mark_on_disk_is_not_held_up_by_other_keys_open_batch() {
    let (dir, store) = temp_store();
    let now = Arc::new(AtomicI64::new(0));
    // After the first commit the writer starts the next one 2 s later at the earliest,
    // so `b` stays in the open batch for the rest of the test.
    let settings = Settings {
        commit_interval: Duration::from_secs(2),
        ..settings(usize::MAX, &now)
    };
    let j = open_with(&store, dir.path(), 0, settings);
    let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
    put(&j, b"a", b"1", 1_000, 0);
    j.durable(j.sync_point())
        .await
        .expect("the first commit starts at once");
    put(&j, b"b", b"1", 1_000, 0);
    let soon = Duration::from_millis(1);
    tokio::time::timeout(soon, j.durable(j.point_of(&[&a])))
        .await
        .expect("a is on disk: its answer waits for no commit")
        .expect("on disk");
    assert!(
        tokio::time::timeout(soon, j.durable(j.point_of(&[&a, &b])))
            .await
            .is_err(),
        "b is still in the open batch"
    );
    assert_eq!(j.point_of(&[&Digest::of(b"absent")]), SyncPoint(0));
}

#[tokio::test]
async fn commits_start_no_more_often_than_the_interval() {
    let (dir, store) = temp_store();
    let now = Arc::new(AtomicI64::new(0));
    let interval = Duration::from_millis(300);
    let settings = Settings {
        commit_interval: interval,
        ..settings(usize::MAX, &now)
    };
    let j = open_with(&store, dir.path(), 0, settings);
    // The first commit starts after this instant; the next one an interval after the
    // first started, at the earliest.
    let first_asked = Instant::now();
    put(&j, b"a", b"1", 1_000, 0);
    j.durable(j.sync_point()).await.expect("first commit");
    put(&j, b"b", b"1", 1_000, 0);
    j.durable(j.sync_point()).await.expect("second commit");
    let between = first_asked.elapsed();
    assert!(
        between >= interval,
        "two commits {between:?} apart, closer than the {interval:?} interval"
    );
}

#[test]
fn a_failing_merge_waits_twice_as_long_each_time_up_to_five_minutes() {
    let mut retry = merge_backoff();
    let waits: Vec<u64> = (0..11).map(|_| retry.next_pause().as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
}

#[test]
fn a_background_pause_ends_when_the_journal_closes() {
    let (dir, store) = temp_store();
    let j = open_at(&store, dir.path(), 0);
    let shared = j.shared.clone();
    let (ended, pause_ended) = std::sync::mpsc::channel();
    let pausing = std::thread::spawn(move || {
        shared.pause(Duration::from_secs(3600));
        let _ = ended.send(());
    });
    drop(j);
    // A bound only so that a pause that ignores the close fails instead of hanging.
    pause_ended
        .recv_timeout(Duration::from_secs(60))
        .expect("the pause ended when the journal closed");
    pausing.join().expect("pausing thread");
}

#[test]
fn a_truncated_batch_is_skipped_not_fatal() {
    assert!(decode_batch(&[0; 5]).is_none());
    let mut open = Open::new(0);
    open.append(&Digest::of(b"key"), 7, b"value", 1);
    let full = &open.buf[FRAME_HEAD..];
    let (created, records) = decode_batch(full).expect("whole batch");
    assert_eq!((created, records.len()), (1, 1));
    assert!(decode_batch(&full[..full.len() - 1]).is_none());
}

/// Settings of a journal on the simulated `disk`, whose threads' work the test does.
pub(crate) fn on_sim(disk: &SimDisk, segment_bytes: u64) -> Settings {
    Settings {
        disk: disk.handle(),
        background: false,
        page_reads: crate::journal::read_here,
        segment_bytes,
        ..settings(usize::MAX, &Arc::new(AtomicI64::new(0)))
    }
}

/// A store folder on a simulated disk, opened again after each restart or power cut: the
/// disk handle each of those returns replaces the one before.
pub(crate) struct SimFolder {
    pub(crate) disk: SimDisk,
    pub(crate) dir: &'static Path,
    store: MemStore,
    segment_bytes: u64,
}

impl SimFolder {
    /// An empty disk made from `seed`, the store folder at `dir`, segments of
    /// `segment_bytes`.
    pub(crate) fn new(seed: u64, dir: &'static str, segment_bytes: u64) -> Self {
        Self {
            disk: SimDisk::new(seed),
            dir: Path::new(dir),
            store: MemStore::default(),
            segment_bytes,
        }
    }

    /// Settings of a journal on the disk as it is now ([`on_sim`]).
    pub(crate) fn settings(&self) -> Settings {
        on_sim(&self.disk, self.segment_bytes)
    }

    /// Opens the journal at `now_ms` with `settings`, or says why it cannot.
    pub(crate) fn try_open_with(
        &self,
        now_ms: i64,
        settings: Settings,
    ) -> Result<Arc<Journal>, Error> {
        Journal::open(
            self.store.tree("state").expect("tree"),
            self.dir,
            now_ms,
            settings,
        )
    }

    /// Opens the journal at `now_ms`.
    pub(crate) fn open(&self, now_ms: i64) -> Arc<Journal> {
        self.try_open_with(now_ms, self.settings()).expect("open")
    }

    /// A power cut ([`SimDisk::crash`]): the journals open before it write nothing more.
    pub(crate) fn cut_power(&mut self) {
        self.disk = self.disk.crash();
    }

    /// Cuts the power while `j` is open, then opens the journal again at `now_ms`.
    pub(crate) fn reopen_after_power_cut(&mut self, j: Arc<Journal>, now_ms: i64) -> Arc<Journal> {
        self.cut_power();
        drop(j);
        self.open(now_ms)
    }

    /// Ends the process `j` runs in without a power cut ([`SimDisk::restart`]: the page
    /// cache stays), then opens the journal again at `now_ms`.
    pub(crate) fn reopen_after_restart(&mut self, j: Arc<Journal>, now_ms: i64) -> Arc<Journal> {
        self.disk = self.disk.restart();
        drop(j);
        self.open(now_ms)
    }
}

#[test]
fn a_damaged_run_keeps_the_store_from_opening_and_names_it() {
    let folder = SimFolder::new(1, "/var/lib/hookgate", 1 << 20);
    let disk = &folder.disk;
    let j = folder.open(0);
    put(&j, b"stop", b"forever", i64::MAX, 0);
    j.flush_to_run().expect("flush");
    drop(j);
    let runs = disk.files_under(&folder.dir.join(RUNS_DIR));
    let [run] = runs.as_slice() else {
        panic!("one run: {runs:?}");
    };
    let flip = |at: usize| {
        let mut bytes = disk_seam::read(disk, run).expect("read");
        bytes[at] ^= 4;
        let file = disk.open_rw(run).expect("open");
        file.write_all_at(&bytes, 0).expect("write");
        file.sync_data().expect("sync");
    };
    // A bit of the header: the run's span, say.
    flip(12);
    let refused = folder.try_open_with(0, folder.settings());
    let error = refused.err().expect("refused");
    assert!(
        matches!(&error, Error::Damaged { file, offset: 0, .. } if file == run),
        "{error}"
    );
    flip(12);
    // A bit of the page that holds the record: found when it is read.
    flip(88 + 20);
    let j = folder.open(0);
    let read = j.get(&Digest::of(b"stop"));
    assert!(
        matches!(&read, Err(Error::Damaged { file, .. }) if file == run),
        "{read:?}"
    );
}

#[test]
fn a_store_made_on_a_fresh_disk_keeps_its_runs_after_a_power_cut() {
    let mut folder = SimFolder::new(1, "/var/lib/hookgate", 1 << 20);
    let j = folder.open(0);
    put(&j, b"stop", b"forever", i64::MAX, 0);
    // In a run, and out of the journal: the run is all that holds it.
    j.flush_to_run().expect("flush");
    assert_eq!((j.runs(), j.hot_len()), (1, 0));
    let j = folder.reopen_after_power_cut(j, 0);
    assert_eq!(
        get(&j, b"stop").as_deref(),
        Some(&b"forever"[..]),
        "the run's folder was not synced into the store's, nor the store's into its parent"
    );
}

#[test]
fn a_run_whose_folder_sync_failed_is_made_durable_before_a_restart_relies_on_it() {
    use disk_seam::sim::{Fault, OpKind};
    let mut folder = SimFolder::new(2, "/var/lib/hookgate", 4096);
    let j = folder.open(0);
    put(&j, b"stop", b"forever", i64::MAX, 0);
    j.write_now().expect("commit");
    // The run is renamed into place, then its folder's sync fails: the flush fails and
    // the run's name is not durable.
    folder.disk.fail_next_matching(
        OpKind::Sync,
        Fault::Io,
        "sync dir /var/lib/hookgate/state-runs",
    );
    assert!(j.flush_to_run().is_err());
    drop(j);
    // A clean restart finds the run and deletes the journal segments it holds.
    let j = folder.open(0);
    assert_eq!(get(&j, b"stop").as_deref(), Some(&b"forever"[..]));
    let j = folder.reopen_after_power_cut(j, 0);
    assert_eq!(
        get(&j, b"stop").as_deref(),
        Some(&b"forever"[..]),
        "a power cut after the restart took the run back, and the segments were gone"
    );
}

#[test]
fn a_journal_outage_grows_neither_segments_nor_buffers_with_its_retries() {
    use disk_seam::sim::{Fault, OpKind};
    let mut folder = SimFolder::new(5, "/store", 1 << 16);
    let j = folder.open(0);
    put(&j, b"before", b"kept", i64::MAX, 0);
    j.write_now().expect("commit");
    let segments = lock(&j.shared.writer).wal.segments();
    // Fifty commits in a row fail at their fdatasync, with one key changing between.
    for i in 0..50u8 {
        put(&j, b"key", &[i], i64::MAX, 0);
        folder
            .disk
            .fail_next_matching(OpKind::Sync, Fault::Io, "sync_data");
        assert!(j.write_now().is_err(), "retry {i}");
    }
    {
        let writer = lock(&j.shared.writer);
        assert!(
            writer.wal.segments() <= segments + 1,
            "{} segments after 50 failed retries, {segments} before",
            writer.wal.segments()
        );
        assert!(
            writer.pending.len() <= 1,
            "{} batches kept in memory",
            writer.pending.len()
        );
    }
    j.write_now().expect("the disk is back");
    drop(j);
    let j = folder.open(0);
    assert_eq!(get(&j, b"before").as_deref(), Some(&b"kept"[..]));
    assert_eq!(get(&j, b"key").as_deref(), Some(&[49u8][..]));
    drop(j);
    folder.cut_power();
    let j = folder.open(0);
    assert_eq!(get(&j, b"key").as_deref(), Some(&[49u8][..]), "durable");
}

#[test]
fn a_ttl_of_zero_is_refused_at_open() {
    let (dir, store) = temp_store();
    let now = Arc::new(AtomicI64::new(0));
    let settings = Settings {
        ttl: Duration::ZERO,
        ..settings(1024, &now)
    };
    let error = Journal::open(store.tree("state").expect("tree"), dir.path(), 0, settings)
        .err()
        .expect("a zero ttl would rewrite a run forever");
    assert!(error.to_string().contains("ttl"), "{error}");
}

#[test]
fn a_commit_whose_sync_hangs_shows_as_the_writer_busy_until_it_returns() {
    let folder = SimFolder::new(9, "/store", 4096);
    let disk = &folder.disk;
    let settings = Settings {
        background: true,
        page_reads: crate::journal::read_here,
        ..folder.settings()
    };
    let j = folder.try_open_with(0, settings).expect("open");
    assert_eq!(j.writer_busy_for(), None, "waiting for records is not busy");
    disk.hold_syncs();
    put(&j, b"k", b"v", i64::MAX, 0);
    let wait = |busy: bool| {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while j.writer_busy_for().is_some() != busy {
            assert!(std::time::Instant::now() < end, "busy never became {busy}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait(true);
    disk.release_syncs();
    wait(false);
}

#[tokio::test]
async fn a_wait_for_a_journal_whose_sync_hangs_gives_up_after_the_durable_wait() {
    let folder = SimFolder::new(11, "/store", 4096);
    let disk = &folder.disk;
    let wait = Duration::from_millis(300);
    let settings = Settings {
        background: true,
        page_reads: crate::journal::read_here,
        durable_wait: wait,
        ..folder.settings()
    };
    let j = folder.try_open_with(0, settings).expect("open");
    let answer = |point| tokio::time::timeout(Duration::from_secs(30), j.durable(point));
    put(&j, b"before", b"v", i64::MAX, 0);
    answer(j.sync_point())
        .await
        .expect("answered")
        .expect("on disk");

    disk.hold_syncs();
    // Should an assertion fail, the held sync is let go before the journal is dropped:
    // dropping it waits for its writer.
    struct LetGo<'a>(&'a SimDisk);
    impl Drop for LetGo<'_> {
        fn drop(&mut self) {
            self.0.release_syncs();
        }
    }
    let _let_go = LetGo(disk);
    put(&j, b"first", b"v", i64::MAX, 0);
    let asked = std::time::Instant::now();
    let error = answer(j.sync_point())
        .await
        .expect("a stalled wait is given up on")
        .expect_err("its sync never returned");
    let waited = asked.elapsed();
    assert!(matches!(error, Error::NotDurable(_)), "{error}");
    // The watchdog looks five times per wait: it cannot give up sooner than one look short
    // of the wait.
    assert!(
        waited >= wait * 4 / 5,
        "given up after {waited:?}, before the {wait:?} wait"
    );
    // A wait that begins while the journal is stalled is given up on too, at the
    // watchdog's next look: the journal has made no progress for longer than the wait.
    put(&j, b"second", b"v", i64::MAX, 0);
    let error = answer(j.sync_point())
        .await
        .expect("given up on")
        .expect_err("still stalled");
    assert!(matches!(error, Error::NotDurable(_)), "{error}");

    disk.release_syncs();
    // The journal has made no progress for longer than the wait until the writer's held
    // sync returns: a wait the watchdog looks at before then is given up on too (on a busy
    // machine the writer may need more than a look to run). Later ones are answered.
    let back = std::time::Instant::now();
    loop {
        put(&j, b"after", b"v", i64::MAX, 0);
        match answer(j.sync_point()).await.expect("answered") {
            Ok(()) => break,
            Err(Error::NotDurable(_)) if back.elapsed() < Duration::from_secs(30) => {}
            Err(error) => panic!("the disk is back: {error}"),
        }
    }
    assert_eq!(get(&j, b"first").as_deref(), Some(&b"v"[..]));
}

#[test]
fn a_batch_whose_sync_failed_and_that_a_clean_restart_read_back_outlives_a_power_cut() {
    use disk_seam::sim::{Fault, OpKind};
    let mut folder = SimFolder::new(3, "/var/lib/hookgate", 4096);
    let j = folder.open(0);
    put(&j, b"first", b"kept", i64::MAX, 0);
    j.write_now().expect("commit");
    put(&j, b"stop", b"forever", i64::MAX, 0);
    // The commit's fdatasync fails, and so does the write when the journal closes: the
    // batch is in the page cache only, where a power cut loses it.
    folder.disk.fail_next(OpKind::Sync, Fault::Io);
    assert!(j.write_now().is_err());
    folder.disk.fail_next(OpKind::Sync, Fault::Io);
    drop(j);
    // A clean restart reads it back, and from then on answers from it.
    let j = folder.open(0);
    assert_eq!(get(&j, b"stop").as_deref(), Some(&b"forever"[..]));
    put(&j, b"later", b"value", i64::MAX, 0);
    j.write_now().expect("commit");
    let j = folder.reopen_after_power_cut(j, 0);
    assert_eq!(
        get(&j, b"stop").as_deref(),
        Some(&b"forever"[..]),
        "a value the restart answered from was lost at the power cut"
    );
    assert_eq!(get(&j, b"later").as_deref(), Some(&b"value"[..]));
}
