use super::*;
use crate::error::SpoolError;
use crate::parked_record::decode_parked;
use crate::record::SpooledMessage;
use crate::report::Unreported;
use crate::sink::{Sink, SinkError};
use crate::spool_file::SPOOL_FILE;
use crate::supervise;
use crate::tables::Op;
use crate::testkit::{self, power_cut, Recorded, TestSink};
use disk_seam::sim::{Fault, OpKind, SimDisk};
use std::sync::atomic::AtomicU64;
use tokio_util::sync::CancellationToken;

fn cfg(max_bytes: u64) -> Options {
    Options {
        max_bytes,
        ..testkit::options()
    }
}

fn msg(id: &str, body: &str) -> SpooledMessage<'static> {
    SpooledMessage {
        routing_key: "k".into(),
        message_id: id.to_owned().into(),
        timestamp_secs: 100,
        request_id: "r".into(),
        event_type: "t".into(),
        attempt: Some(2),
        route: "botix".into(),
        received_at: "2026-11-29T10:00:00Z".into(),
        order_key: None,
        body: bytes::Bytes::copy_from_slice(body.as_bytes()),
        content_type: None,
        traceparent: None,
        tracestate: None,
    }
}

/// The messages of `tests/data/spool/legacy-v0-records.json`, in its order.
fn legacy_fixture_messages() -> [SpooledMessage<'static>; 3] {
    let first = SpooledMessage {
        routing_key: "contact.created".into(),
        message_id: "evt_legacy_1".into(),
        timestamp_secs: 1_795_946_400,
        request_id: "req_legacy_1".into(),
        event_type: "contact.created".into(),
        attempt: Some(2),
        route: "botix".into(),
        received_at: "2026-11-29T10:00:00Z".into(),
        order_key: None,
        body: bytes::Bytes::from_static(
            br#"{"id":"evt_legacy_1","event":"contact.created","data":{"contact_id":1}}"#,
        ),
        content_type: None,
        traceparent: None,
        tracestate: None,
    };
    let second = SpooledMessage {
        routing_key: "message.status".into(),
        message_id: "evt_legacy_2".into(),
        timestamp_secs: 1_795_946_401,
        request_id: "req_legacy_2".into(),
        event_type: "message.status".into(),
        attempt: None,
        route: "botix".into(),
        received_at: "2026-11-29T10:00:01Z".into(),
        order_key: Some("botix\0status\0msg_1".into()),
        body: bytes::Bytes::from_static(
            "{\"id\":\"evt_legacy_2\",\"event\":\"message.status\",\"data\":{\"message_id\":\"msg_1\",\"status\":\"read\",\"text\":\"caf\u{e9} \u{20ac}\"}}"
                .as_bytes(),
        ),
        content_type: None,
        traceparent: None,
        tracestate: None,
    };
    let third = SpooledMessage {
        routing_key: "twilio.message.status".into(),
        message_id: "SM1:delivered".into(),
        timestamp_secs: 1_795_946_402,
        request_id: "req_legacy_3".into(),
        event_type: "message.status".into(),
        attempt: None,
        route: "twilio".into(),
        received_at: "2026-11-29T10:00:02Z".into(),
        order_key: Some("twilio\0status\0SM1".into()),
        body: bytes::Bytes::from_static(b"MessageSid=SM1&MessageStatus=delivered"),
        content_type: Some("application/x-www-form-urlencoded".into()),
        traceparent: None,
        tracestate: None,
    };
    [first, second, third]
}

/// The raw records of `tests/data/spool/legacy-v0-records.json`.
fn legacy_fixture_records() -> Vec<Vec<u8>> {
    let fixture: serde_json::Value = serde_json::from_str(include_str!(
        "../../../tests/data/spool/legacy-v0-records.json"
    ))
    .expect("fixture is JSON");
    let records = fixture["records"].as_array().expect("records");
    records
        .iter()
        .map(|r| {
            let record = hex::decode(r["hex"].as_str().expect("hex")).expect("hex digits");
            // The readable copies in the fixture say what the bytes hold.
            let (meta, body) = (r["meta"].as_str().expect("meta"), r["body"].as_str());
            let mut framed = (meta.len() as u32).to_be_bytes().to_vec();
            framed.extend_from_slice(meta.as_bytes());
            framed.extend_from_slice(body.expect("body").as_bytes());
            assert_eq!(
                framed, record,
                "the fixture's meta and body match its bytes"
            );
            record
        })
        .collect()
}

#[tokio::test]
async fn a_spool_of_legacy_records_opens_and_its_entries_decode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let records = legacy_fixture_records();
    let expected = legacy_fixture_messages();
    assert_eq!(records.len(), expected.len());
    {
        let store = Store::open(dir.path()).expect("open");
        let main = store.tree("spool").expect("tree");
        main.insert(&0u64.to_be_bytes(), &records[0])
            .expect("insert");
        main.insert(&1u64.to_be_bytes(), &records[1])
            .expect("insert");
        let held = store.tree("spool_held").expect("tree");
        held.insert(&2u64.to_be_bytes(), &records[2])
            .expect("insert");
        store.flush().await.expect("flush");
    }
    let store = Store::open(dir.path()).expect("reopen");
    let spool = Spool::open(&store, &cfg(1 << 20), Arc::new(Unreported)).expect("spool");
    let status = spool.status(1_795_946_460);
    assert_eq!((status.depth, status.held), (2, 1));
    assert_eq!(
        status.oldest_age_secs,
        Some(60),
        "the head's timestamp is read"
    );
    assert!(
        spool.holds_key("twilio\0status\0SM1"),
        "the held entry's order key is read"
    );
    let mut stored = Vec::new();
    for area in [Area::Main, Area::Held] {
        spool
            .tables
            .for_each(area, PAGE, |_, v| stored.push(record::decode(v)))
            .expect("read");
    }
    let expected: Vec<_> = expected.into_iter().map(Ok).collect();
    assert_eq!(stored, expected);

    // An entry pushed now is a current record, behind them.
    spool.push(&msg("e4", "{}")).await.expect("push");
    let last_seq = spool
        .tables
        .last_seq(Area::Main)
        .expect("read")
        .expect("an entry");
    let last = spool
        .tables
        .get(Area::Main, last_seq)
        .expect("read")
        .expect("an entry");
    assert_eq!(last.first(), Some(&record::VERSION));
    assert_eq!(record::decode(&last), Ok(msg("e4", "{}")));
}

#[tokio::test]
async fn push_counts_bounds_and_survives_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = Arc::new(Recorded::default());
    {
        let store = Store::open(dir.path()).expect("open");
        let spool = Spool::open(&store, &cfg(600), metrics.clone()).expect("spool");
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
    let spool = Spool::open(&store, &cfg(600), metrics).expect("spool");
    assert_eq!(spool.status(100).depth, 2);
    let disabled = Spool::open(
        &store,
        &Options {
            enabled: false,
            ..cfg(600)
        },
        Arc::new(Unreported),
    )
    .expect("spool");
    assert!(matches!(
        disabled.push(&msg("e", "{}")).await,
        Err(SpoolError::Disabled)
    ));
}

#[tokio::test]
async fn held_keys_survive_reopen_and_parked_entries_are_republished_or_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = Store::open(dir.path()).expect("open");
        let spool = Spool::open(&store, &cfg(1 << 20), Arc::new(Unreported)).expect("spool");
        let mut held = msg("e1", "{}");
        held.order_key = Some("botix\0status\0m1".into());
        spool.push_held(&held).await.expect("push held");
        assert!(spool.holds_key("botix\0status\0m1"));
        assert!(
            spool.is_empty(),
            "held entries are not in the ordered spool"
        );
        // What an earlier version set aside, and one entry it could not read at all.
        let legacy = store.tree("spool_corrupt").expect("tree");
        legacy
            .insert(
                &0u64.to_be_bytes(),
                &record::encode(&msg("e2", "{}")).expect("encode"),
            )
            .expect("insert");
        legacy
            .insert(&1u64.to_be_bytes(), b"garbage")
            .expect("insert");
    }
    let store = Store::open(dir.path()).expect("reopen");
    let metrics = Arc::new(Recorded::default());
    let spool = Spool::open(&store, &cfg(1 << 20), metrics.clone()).expect("spool");
    assert!(spool.holds_key("botix\0status\0m1"));
    let status = spool.status(100);
    assert_eq!((status.depth, status.held, status.parked), (0, 1, 2));
    assert_eq!(metrics.counts().parked, 2);
    let parked = spool.parked_entries().expect("list");
    assert_eq!(parked.len(), 2);
    assert!(parked[0].id > 0, "numbered after the held entry");
    assert_eq!(parked[0].event_id.as_deref(), Some("e2"));
    assert_eq!(parked[1].event_id, None);

    assert!(matches!(
        spool.republish(parked[1].id).await,
        Err(SpoolError::Undecodable(_))
    ));
    spool.republish(parked[0].id).await.expect("republish");
    assert!(matches!(
        spool.republish(parked[0].id).await,
        Err(SpoolError::NotParked(_))
    ));
    spool.delete_parked(parked[1].id).await.expect("delete");
    let status = spool.status(100);
    assert_eq!((status.depth, status.held, status.parked), (1, 1, 0));
    assert_eq!(metrics.counts().parked, 0);
}

#[tokio::test]
async fn a_failed_pass_is_counted_and_run_again() {
    let restarts = AtomicU64::new(0);
    let stop = CancellationToken::new();
    let passes = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let (p, f) = (passes.clone(), failures.clone());
    supervise::supervise(
        || {
            restarts.fetch_add(1, Ordering::SeqCst);
        },
        &stop,
        Duration::from_millis(1),
        move || {
            let n = p.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    panic!("pass {n} fails");
                }
            }
        },
        move || {
            f.fetch_add(1, Ordering::SeqCst);
        },
    )
    .await;
    assert_eq!(passes.load(Ordering::SeqCst), 3);
    assert_eq!(failures.load(Ordering::SeqCst), 2);
    assert_eq!(restarts.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_same_entry_failing_twice_is_marked_for_parking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let spool = Spool::open(&store, &cfg(1 << 20), Arc::new(Unreported)).expect("spool");
    let key = (Area::Main, 3u64);
    spool.set_in_progress(Some(key));
    spool.note_failure();
    assert_eq!(spool.failed_on.lock().expect("lock").to_park(), None);
    spool.set_in_progress(Some(key));
    spool.note_failure();
    assert_eq!(spool.failed_on.lock().expect("lock").to_park(), Some(key));
}

/// The event ids in `area`, in order.
fn ids_in(spool: &Spool, area: Area) -> Vec<String> {
    let mut ids = Vec::new();
    spool
        .tables
        .for_each(area, PAGE, |_, v| {
            let entry = match area {
                Area::Parked => decode_parked(v).map_or(v, |(_, _, e)| e),
                _ => v,
            };
            ids.push(record::decode(entry).map_or("?".into(), |m| m.message_id.into_owned()));
        })
        .expect("read");
    ids
}

/// Seeds of the simulated disk each power-cut test runs: each keeps its own prefix of
/// the unsynced writes.
const DISK_SEEDS: std::ops::Range<u64> = 0..6;

#[tokio::test]
async fn a_push_answered_ok_survives_a_power_cut_that_drops_unsynced_writes() {
    for seed in DISK_SEEDS {
        let disk = SimDisk::new(seed);
        let spool = testkit::open_on(&disk).expect("open");
        let events: Vec<_> = (0..8)
            .map(|i| testkit::event(&format!("e{i}"), None))
            .collect();
        let pushes = events.iter().map(|e| spool.push(e));
        for result in futures_util::future::join_all(pushes).await {
            result.expect("push");
            let last = disk.recent().pop().unwrap_or_default();
            assert!(
                last.contains("sync"),
                "a push returns after a sync, not {last}"
            );
        }
        let (_, spool) = power_cut(&disk, spool);
        let mut ids = ids_in(&spool, Area::Main);
        ids.sort();
        let expected: Vec<String> = (0..8).map(|i| format!("e{i}")).collect();
        assert_eq!(
            ids, expected,
            "every push that returned Ok, disk seed {seed}"
        );
        assert_eq!(spool.status(100).depth, 8);
    }
}

/// Flips a bit in every copy of the record of `spool`'s first entry in main on `disk`'s
/// platter, the live page's included.
fn flip_first_record(disk: &SimDisk, spool: &Spool) {
    let rows = spool.tables.page(Area::Main, None, 1).expect("read");
    let (_, record) = rows.first().expect("an entry");
    let file = std::path::Path::new("/store").join(SPOOL_FILE);
    let synced = disk.synced_data(&file).expect("the spool file");
    let copies: Vec<u64> = synced
        .windows(record.len())
        .enumerate()
        .filter(|(_, w)| *w == &record[..])
        .map(|(at, _)| at as u64)
        .collect();
    assert!(!copies.is_empty(), "the record is on the disk");
    for at in copies {
        disk.flip_synced_bit_in(&file, at..at + record.len() as u64)
            .expect("a synced byte to flip");
    }
}

/// Asserts that an open on `disk` refuses, naming the file and what to read.
fn assert_open_refuses_damage(disk: &SimDisk, seed: u64) {
    match testkit::open_on(disk) {
        Ok(spool) => panic!(
            "the spool opened on damage: main holds {:?}, seed {seed}",
            ids_in(&spool, Area::Main)
        ),
        Err(error) => {
            let said = error.to_string();
            assert!(said.contains(SPOOL_FILE), "{said}");
            assert!(said.contains("damaged"), "{said}");
            assert!(said.contains("docs/guarantees.md"), "{said}");
        }
    }
}

#[tokio::test]
async fn an_open_refuses_a_spool_whose_newest_commit_is_damaged_and_names_the_file() {
    for seed in DISK_SEEDS {
        let disk = SimDisk::new(seed);
        let spool = testkit::open_on(&disk).expect("open");
        spool.push(&testkit::event("e0", None)).await.expect("push");
        // Damage to the commit that answered the push Ok, then a power cut.
        flip_first_record(&disk, &spool);
        let next = disk.crash();
        drop(spool);
        assert_open_refuses_damage(&next, seed);
    }
}

#[tokio::test]
async fn an_open_refuses_a_spool_damaged_while_hookgate_was_stopped_cleanly() {
    for seed in DISK_SEEDS {
        let disk = SimDisk::new(seed);
        let spool = testkit::open_on(&disk).expect("open");
        spool.push(&testkit::event("e0", None)).await.expect("push");
        spool.push(&testkit::event("e1", None)).await.expect("push");
        let rows = spool.tables.page(Area::Main, None, 1).expect("read");
        // The spool closes its database: the next open has no crash to recover from.
        drop(spool);
        let next = disk.restart();
        let spool = testkit::open_on(&next).expect("open");
        assert_eq!(spool.tables.page(Area::Main, None, 1).expect("read"), rows);
        flip_first_record(&next, &spool);
        drop(spool);
        assert_open_refuses_damage(&next.restart(), seed);
    }
}

#[tokio::test]
async fn an_open_refuses_a_spool_whose_magic_number_is_damaged_as_damage() {
    for seed in DISK_SEEDS {
        let disk = SimDisk::new(seed);
        let spool = testkit::open_on(&disk).expect("open");
        spool.push(&testkit::event("e0", None)).await.expect("push");
        let next = disk.crash();
        drop(spool);
        // The file's first bytes name its format.
        let file = std::path::Path::new("/store").join(SPOOL_FILE);
        next.flip_synced_bit_in(&file, 0..9)
            .expect("a synced byte to flip");
        assert_open_refuses_damage(&next, seed);
    }
}

#[tokio::test]
async fn a_move_to_held_leaves_the_entry_in_exactly_one_area_at_any_power_cut() {
    for ops in 1..40 {
        for seed in DISK_SEEDS {
            // The drainer is told to stop once it has published, so a commit that the
            // power cut fails is not retried.
            let stop = CancellationToken::new();
            let stopping = stop.clone();
            let unroutable = testkit::TestSink::new(move |_| {
                stopping.cancel();
                Err(SinkError::Unroutable("k".into()))
            });
            let disk = SimDisk::new(seed);
            let spool = testkit::open_on(&disk).expect("open");
            spool
                .push(&testkit::event("e1", Some("key")))
                .await
                .expect("push");
            disk.cut_power_after(ops);
            let rows = spool.tables.page(Area::Main, None, 1).expect("head");
            let _ = spool
                .drain_batch(&unroutable, "x", rows, &mut Default::default(), &stop)
                .await;
            let (_, spool) = power_cut(&disk, spool);
            let main = ids_in(&spool, Area::Main);
            let held = ids_in(&spool, Area::Held);
            assert_eq!(
                main.len() + held.len(),
                1,
                "power cut at operation {ops}, disk seed {seed}: main {main:?}, held {held:?}"
            );
            assert_eq!(
                spool.holds_key("key"),
                held.len() == 1,
                "the guard key is held exactly while its entry is"
            );
        }
    }
}

#[tokio::test]
async fn entries_the_drainer_counted_as_done_stay_deleted_after_a_power_cut() {
    for seed in DISK_SEEDS {
        let disk = SimDisk::new(seed);
        let spool = testkit::open_on(&disk).expect("open");
        for i in 0..5 {
            spool
                .push(&testkit::event(&format!("e{i}"), None))
                .await
                .expect("push");
        }
        let sink = testkit::TestSink::acking();
        let rows = spool.tables.page(Area::Main, None, 5).expect("head");
        let (_, committed) = spool
            .drain_batch(
                &sink,
                "x",
                rows,
                &mut Default::default(),
                &CancellationToken::new(),
            )
            .await;
        assert!(committed);
        assert_eq!(spool.status(100).depth, 0, "counted as done");
        let (_, spool) = power_cut(&disk, spool);
        assert_eq!(
            ids_in(&spool, Area::Main),
            Vec::<String>::new(),
            "a power cut after the drainer counted the batch done republishes none of it"
        );
    }
}

#[tokio::test]
async fn a_power_cut_mid_drain_republishes_at_most_the_batch_in_flight() {
    for ops in 1..30 {
        let disk = SimDisk::new(ops);
        let spool = testkit::open_on(&disk).expect("open");
        for i in 0..12 {
            spool
                .push(&testkit::event(&format!("e{i:02}"), None))
                .await
                .expect("push");
        }
        // A first batch of 4 goes through; the power goes during the second, of 6,
        // after which the drainer is told to stop (so it does not retry the commit).
        let stop = CancellationToken::new();
        let (stopping, published) = (stop.clone(), Arc::new(AtomicU64::new(0)));
        let sink = testkit::TestSink::new(move |_| {
            if published.fetch_add(1, Ordering::SeqCst) + 1 == 10 {
                stopping.cancel();
            }
            Ok(())
        });
        let rows = spool.tables.page(Area::Main, None, 4).expect("head");
        spool
            .drain_batch(&sink, "x", rows, &mut Default::default(), &stop)
            .await;
        disk.cut_power_after(ops);
        let rows = spool.tables.page(Area::Main, None, 6).expect("head");
        spool
            .drain_batch(&sink, "x", rows, &mut Default::default(), &stop)
            .await;
        let (_, spool) = power_cut(&disk, spool);
        let left = ids_in(&spool, Area::Main);
        let acked = sink.acked();
        let again: Vec<&String> = left.iter().filter(|id| acked.contains(id)).collect();
        assert!(
            again.len() <= 6,
            "cut at operation {ops}: {again:?} would go out again"
        );
        assert!(
            again.iter().all(|id| id.as_str() >= "e04"),
            "the first batch, counted done, stays deleted: {again:?}"
        );
        for i in 0..12 {
            let id = format!("e{i:02}");
            assert!(left.contains(&id) || acked.contains(&id), "{id} lost");
        }
    }
}

#[tokio::test]
async fn after_an_io_error_the_spool_opens_its_database_again_and_takes_writes_with_no_restart() {
    for fault in [(OpKind::Write, Fault::NoSpace), (OpKind::Sync, Fault::Io)] {
        let disk = SimDisk::new(1);
        let spool = testkit::open_on(&disk).expect("open");
        spool.push(&testkit::event("e0", None)).await.expect("push");
        disk.fail_next(fault.0, fault.1);
        let refused = spool.push(&testkit::event("e1", None)).await;
        assert!(refused.is_err(), "{refused:?}");
        assert_eq!(spool.status(100).depth, 1, "refused pushes are not counted");
        // The writer opened the database again at once (the tests' pause is zero): no
        // restart.
        spool
            .push(&testkit::event("e2", None))
            .await
            .expect("push after the reopen");
        assert_eq!(spool.restart_needed(), None, "{fault:?}");
        assert!(spool.has_room());
        assert_eq!(
            ids_in(&spool, Area::Main),
            ["e0", "e2"],
            "the refused entry is set back, even where its pages reached the disk"
        );
        assert_eq!(spool.status(100).depth, 2);
        let (_, spool) = power_cut(&disk, spool);
        assert_eq!(ids_in(&spool, Area::Main), ["e0", "e2"], "{fault:?}");
    }
}

#[tokio::test]
async fn a_commit_whose_sync_failed_read_back_by_a_restart_does_not_corrupt_the_spool_at_a_power_cut(
) {
    for seed in 0..8 {
        let disk = SimDisk::new(seed);
        let spool = testkit::open_on(&disk).expect("open");
        spool.push(&testkit::event("e0", None)).await.expect("push");
        // The failed commit writes a table the next one does not, so the next one
        // points at pages only the failed one wrote.
        disk.fail_next(OpKind::Sync, Fault::Io);
        assert!(spool
            .push_held(&testkit::event("e1", Some("k")))
            .await
            .is_err());
        // The process restarts (a kill, or a liveness probe for another reason); the
        // failed commit's pages are still in the page cache, and the next commits are
        // answered Ok.
        let (disk, spool) = testkit::restart(&disk, spool);
        spool
            .push(&testkit::event("e2", None))
            .await
            .expect("push after the restart");
        let (_, spool) = power_cut(&disk, spool);
        let ids = ids_in(&spool, Area::Main);
        assert_eq!(
            ids,
            ["e0", "e2"],
            "seed {seed}: every entry answered Ok is kept"
        );
        let held = ids_in(&spool, Area::Held);
        assert!(
            held.len() <= 1,
            "seed {seed}: the refused entry at most: {held:?}"
        );
    }
}

/// What the outbox does with an event (`Outbox::deliver`): to the broker at once while
/// nothing waits in order and its guard key is not held, else into the spool.
async fn deliver(
    spool: &Spool,
    sink: &TestSink,
    msg: &SpooledMessage<'_>,
) -> Result<(), SpoolError> {
    let key_held = msg.order_key.as_deref().is_some_and(|k| spool.holds_key(k));
    if spool.is_empty() {
        if key_held {
            return spool.push_held(msg).await;
        }
        if sink.publish("x", msg).await.is_ok() {
            return Ok(());
        }
    }
    spool.push(msg).await
}

#[tokio::test]
async fn a_push_whose_commit_failed_never_reaches_the_broker_after_a_later_event_of_its_key() {
    let disk = SimDisk::new(1);
    // The push's second sync (of the header that points at its pages) fails, and so do
    // the syncs of the reopens that would set it back (at once, at the next request, while
    // idle): the whole commit stays in the page cache. The restart forgets the faults left.
    let spool = testkit::open_arming_sync(&disk, 2, |disk| {
        disk.fail_next(OpKind::Sync, Fault::NoSpace);
        for _ in 0..8 {
            disk.fail_next(OpKind::Sync, Fault::Io);
        }
    })
    .expect("open");
    let sink = TestSink::acking();
    let refused = spool.push(&testkit::event("e0", Some("k"))).await;
    assert!(refused.is_err(), "answered 503: {refused:?}");
    let later = deliver(&spool, &sink, &testkit::event("e1", Some("k"))).await;
    // Other guard keys, and events without one, are not held up.
    for (id, key) in [("x0", Some("other")), ("x1", None)] {
        deliver(&spool, &sink, &testkit::event(id, key))
            .await
            .expect("to the broker");
    }
    // A kill before the database is set back: the next open reads the refused commit
    // from the page cache, and makes it durable.
    let (_disk, spool) = testkit::restart(&disk, spool);
    assert_eq!(
        ids_in(&spool, Area::Main),
        ["e0"],
        "the refused entry is back"
    );
    let stop = CancellationToken::new();
    let rows = spool.tables.page(Area::Main, None, 8).expect("read");
    spool
        .drain_batch(&sink, "x", rows, &mut Default::default(), &stop)
        .await;
    if later.is_err() {
        // Refused too: the sender retries it.
        deliver(&spool, &sink, &testkit::event("e1", Some("k")))
            .await
            .expect("the retry is taken");
    }
    assert_eq!(
        sink.acked(),
        ["x0", "x1", "e0", "e1"],
        "e0 came back and reached the broker after e1, a later event of its key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_sync_hangs_is_reported_past_the_deadline_and_not_after_it_returns() {
    let disk = SimDisk::new(1);
    let spool = Arc::new(testkit::open_on(&disk).expect("open"));
    let deadline = Duration::from_millis(1);
    assert_eq!(spool.hung(deadline), None, "an idle writer is no hung one");
    disk.hold_syncs();
    // Released however the test ends: a held sync would keep the writer from closing.
    struct Release(SimDisk);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.release_syncs();
        }
    }
    let release = Release(disk.clone());
    let pushing = {
        let spool = spool.clone();
        tokio::spawn(async move { spool.push(&testkit::event("e0", None)).await })
    };
    let end = Instant::now() + Duration::from_secs(10);
    let hung = loop {
        if let Some(hung) = spool.hung(deadline) {
            break hung;
        }
        assert!(Instant::now() < end, "a hung sync was never reported");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(hung.thread, "spool's writer thread", "{hung:?}");
    drop(release);
    pushing
        .await
        .expect("join")
        .expect("push once the sync returns");
    assert_eq!(spool.hung(deadline), None);
}

/// Copies the sled spool of `tests/data/spool/README.md` ("sled-v0") into `dir`.
fn copy_sled_v0(dir: &std::path::Path) {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/spool/sled-v0/store");
    for entry in std::fs::read_dir(fixture).expect("fixture") {
        let entry = entry.expect("fixture file");
        std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copy");
    }
}

#[tokio::test]
async fn a_sled_spool_is_migrated_in_order_once_even_when_the_migration_runs_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_sled_v0(dir.path());
    let expected_main = ["evt_sled_main_1", "evt_sled_main_2", "evt_sled_main_3"];
    let expected_held = ["evt_sled_held_1", "evt_sled_held_2", "evt_sled_main_4"];
    for run in 0..2 {
        let store = Store::open(dir.path()).expect("open");
        let spool = Spool::open(&store, &cfg(1 << 20), Arc::new(Unreported)).expect("spool");
        assert_eq!(ids_in(&spool, Area::Main), expected_main, "run {run}");
        assert_eq!(ids_in(&spool, Area::Held), expected_held, "run {run}");
        assert_eq!(ids_in(&spool, Area::Parked), ["?"], "run {run}");
        let status = spool.status(1_796_032_900);
        assert_eq!((status.depth, status.held, status.parked), (3, 3, 1));
        assert!(spool.holds_key("botix\0status\0msg_1"));
        assert_eq!(spool.parked_entries().expect("list")[0].id, 6);
        assert!(!store.has_legacy(), "the sled store is closed and removed");
        assert!(!dir.path().join("conf").exists() && !dir.path().join("db").exists());
        let next = spool
            .writer
            .submit_numbered(|_| Vec::new(), None)
            .expect("seq")
            .0;
        assert_eq!(next, 7, "numbers go on above the migrated ones");
        drop(spool);
        drop(store);
        // The sled files back, entries and all, beside the migrated tables: what a crash
        // after the migration's commit and before its removals from sled leaves.
        copy_sled_v0(dir.path());
    }
}

#[tokio::test]
async fn entries_drained_after_a_migration_are_not_migrated_again_when_sled_loses_its_removals() {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_sled_v0(dir.path());
    {
        let store = Store::open(dir.path()).expect("open");
        let spool = Spool::open(&store, &cfg(1 << 20), Arc::new(Unreported)).expect("spool");
        // The drainer publishes main and an operator deletes the parked entry.
        let drained: Vec<Op> = spool
            .tables
            .page(Area::Main, None, 100)
            .expect("main")
            .into_iter()
            .map(|(seq, _)| Op::Remove {
                area: Area::Main,
                seq,
            })
            .collect();
        spool.writer.commit(drained).await.expect("drained");
        spool.delete_parked(6).await.expect("deleted");
    }
    // A power cut in sled's flush window: its removals were never synced, so its files
    // come back with every entry.
    copy_sled_v0(dir.path());
    let store = Store::open(dir.path()).expect("open");
    let spool = Spool::open(&store, &cfg(1 << 20), Arc::new(Unreported)).expect("spool");
    assert!(
        ids_in(&spool, Area::Main).is_empty(),
        "published entries came back: {:?}",
        ids_in(&spool, Area::Main)
    );
    assert!(
        ids_in(&spool, Area::Parked).is_empty(),
        "a deleted entry came back"
    );
    assert_eq!(
        ids_in(&spool, Area::Held),
        ["evt_sled_held_1", "evt_sled_held_2", "evt_sled_main_4"]
    );
    assert!(!store.has_legacy());
}
