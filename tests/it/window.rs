//! The local backend's bounded state window (a hot set in memory, sorted runs on disk): a store
//! written by the previous state format keeps its marks and guard state, and the gateway's
//! memory stays flat while unique events flow through the real binary.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::require_broker;
use crate::util::*;

/// The store of `tests/data/state-v0/README.md`, written by the previous journal format.
fn state_v0_store() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/state-v0/store")
}

/// Copies the directory `from` to `to`, recursively (sled writes to a store it opens, and the
/// fixture must stay as it was written).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display()))
    {
        let entry = entry.expect("directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target)
                .unwrap_or_else(|e| panic!("copy {}: {e}", entry.path().display()));
        }
    }
}

/// The time the fixture was written at: its marks count for 72 hours after it, so the test
/// runs the app at this time, not the wall clock's.
const FIXTURE_NOW_MS: i64 = 1_800_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_written_by_the_previous_state_format_keeps_its_marks_and_guard_state() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    // The fixture's keys are route `botix`'s, and its guard state is keyed by the default
    // pointers `/data/message_id`, `/data/from` and `/data/to`, which the spec guard uses.
    copy_dir(&state_v0_store(), &cfg.store);
    let cfg = cfg.with_spec_guard();
    let parsed = hookgate::config::Config::parse(&cfg.yaml()).expect("the test config parses");
    assert_eq!(parsed.routes[0].name, "botix", "the fixture's route");
    let now = FIXTURE_NOW_MS + 3_600_000;
    let app = InProcess::start_at(&cfg.yaml(), now).await;
    let client = client(None);
    let event_at = |id: &str| {
        serde_json::json!({"id": id, "event": "contact.created", "timestamp": rfc3339_ms(now), "data": {}})
            .to_string()
    };

    // Event id evt_legacy_1 was marked done by the old journal: a new request id does not
    // make it new.
    let (s, a) = app
        .post(&client, &event_at("evt_legacy_1"), "req_after_upgrade_1")
        .await;
    assert_eq!(
        (s, outcome(&a)),
        (200, "duplicate".into()),
        "event id evt_legacy_1 from the previous format: {a}"
    );

    // Request id req_legacy_3 was marked done too: a new event id under it is a duplicate.
    let (s, a) = app
        .post(&client, &event_at("evt_under_req_legacy_3"), "req_legacy_3")
        .await;
    assert_eq!(
        (s, outcome(&a)),
        (200, "duplicate".into()),
        "request id req_legacy_3 from the previous format: {a}"
    );

    // msg_legacy_1 was `delivered` (rank 3): a `sent` is stale.
    let (s, a) = app
        .post(
            &client,
            &status_at("evt_sent", "msg_legacy_1", "sent", now),
            "req_sent",
        )
        .await;
    assert_eq!(
        (s, outcome(&a)),
        (200, "dropped:stale_status".into()),
        "status guard state of msg_legacy_1 from the previous format: {a}"
    );

    // +15550001111 opted out of +15550002222: a second STOP is a repeat.
    let stop = keyword_between("evt_stop", "+15550001111", "+15550002222", "STOP", now);
    let (s, a) = app.post(&client, &stop, "req_stop").await;
    assert_eq!(
        (s, outcome(&a)),
        (200, "dropped:repeated_stop".into()),
        "keyword guard state from the previous format: {a}"
    );

    // A fresh event goes through, and it is the only thing published before the sentinel.
    let (s, a) = app.post(&client, &event_at("evt_fresh"), "req_fresh").await;
    assert_eq!((s, outcome(&a)), (200, "accepted".into()), "{a}");
    let (s, _) = app
        .post(&client, &event_at("sentinel"), "req_sentinel")
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        ids(&broker.until("sentinel").await),
        vec!["evt_fresh"],
        "only the fresh event is published"
    );
    app.stop().await;
    broker.delete().await;
}

/// Entries the hot set holds before a flush writes them to a run: the smallest allowed, so
/// that flushes and merges run many times during the test.
const HOT_ENTRIES: usize = 1024;

/// How much the gateway's resident memory may grow between the end of the warm-up and the
/// end of the flow. The hot set is bounded by `store.hot_entries` (1,024 entries, well under
/// 1 MiB); the runs cost about one byte of filter per entry (two entries per event: event
/// id and request id, so well under 1 MiB for the events a minute brings); the rest is
/// allocator and cache noise. Threads added meanwhile are allowed for on top
/// ([`RSS_PER_ADDED_THREAD_KIB`]). Everything kept in memory instead grows by about 290
/// bytes an entry, 580 an event: 18.1 MiB for 35,555 events (`store.hot_entries: 100000000`).
const MAX_RSS_GROWTH_KIB: u64 = 8 * 1024;

/// Concurrent senders.
const CLIENTS: usize = 8;

/// The warm-up: this many events, and a tenth of the duration.
const WARM_UP_EVENTS: u64 = 2_000;

/// Events the flow must carry after the warm-up before it may stop: kept in memory, they
/// would grow the gateway by about 17 MiB (some 580 bytes an event), twice the bound. On a
/// slow machine the flow runs past the set duration to reach it, for three times as long
/// at most.
const MIN_EVENTS_AFTER_WARM_UP: u64 = 30_000;

/// What one thread the gateway adds during the flow may bring to its resident set: the
/// touched pages of its stack and its allocator heap. The runtime's blocking pool grows and
/// shrinks with the store's work (a worker that blocks on a run's read hands its tasks to a
/// new thread), at moments no warm-up can wait for; measured at about 0.9 MiB a thread.
const RSS_PER_ADDED_THREAD_KIB: u64 = 1024;

/// The process's resident set in KiB and its thread count, from `/proc/<pid>/status`.
fn rss_and_threads(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().trim_end_matches("kB").trim())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status:\n{status}"))
    };
    (field("VmRSS:"), field("Threads:"))
}

/// The gateway's `hookgate_state_entries` (hot set and runs).
async fn state_entries(client: &reqwest::Client, gw: &Gateway) -> f64 {
    scrape(client, gw)
        .await
        .find("hookgate_state_entries", &[])
        .expect("hookgate_state_entries in /metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_flat_while_unique_events_flow_through_the_binary() {
    require_broker!();
    let secs: u64 = std::env::var("HOOKGATE_SOAK_SECS")
        .ok()
        .map(|s| {
            s.parse()
                .expect("HOOKGATE_SOAK_SECS is a number of seconds")
        })
        .unwrap_or(60);
    let duration = Duration::from_secs(secs);
    let broker = Broker::keeping_newest(1_000).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    cfg.store_extra = format!("  hot_entries: {HOT_ENTRIES}\n");
    let parsed = hookgate::config::Config::parse(&cfg.yaml()).expect("the test config parses");
    assert_eq!(
        parsed.store.hot_entries, HOT_ENTRIES,
        "store.hot_entries reaches the config"
    );
    let gw = Arc::new(Gateway::start(&cfg).await);
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    let pid = gw.pid();

    let run = unique("soak");
    let next = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (gw, client, run) = (gw.clone(), client.clone(), run.clone());
        let (next, accepted, stop) = (next.clone(), accepted.clone(), stop.clone());
        senders.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let n = next.fetch_add(1, Ordering::SeqCst);
                let id = format!("{run}-{n}");
                let (status, answer) = gw
                    .deliver(&client, &event_body(&id), &format!("req-{id}"))
                    .await;
                assert_eq!(
                    (status, outcome(&answer)),
                    (200, "accepted".to_owned()),
                    "{id}: {answer}"
                );
                accepted.fetch_add(1, Ordering::SeqCst);
            }
        });
    }

    // Warm-up: a tenth of the duration and the first 2,000 events (runs written, merged,
    // sled's cache and the threads' stacks in place), then the first sample.
    let deadline = started + duration;
    let warm_up = duration / 10;
    while started.elapsed() < warm_up || accepted.load(Ordering::SeqCst) < WARM_UP_EVENTS {
        assert!(
            Instant::now() < deadline,
            "only {} events accepted in {secs} s, fewer than the {WARM_UP_EVENTS} of the warm-up",
            accepted.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (rss_start, threads_start) = rss_and_threads(pid);
    let events_at_start = accepted.load(Ordering::SeqCst);
    let entries_at_start = state_entries(&client, &gw).await;
    let (mut rss_max, mut threads_max) = (rss_start, threads_start);
    let cap = started + 3 * duration;
    let enough = || accepted.load(Ordering::SeqCst) - events_at_start >= MIN_EVENTS_AFTER_WARM_UP;
    while Instant::now() < cap && (Instant::now() < deadline || !enough()) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (rss, threads) = rss_and_threads(pid);
        rss_max = rss_max.max(rss);
        threads_max = threads_max.max(threads);
    }
    stop.store(true, Ordering::SeqCst);
    while let Some(r) = senders.join_next().await {
        r.expect("sender task");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (rss_end, threads_end) = rss_and_threads(pid);
    rss_max = rss_max.max(rss_end);
    threads_max = threads_max.max(threads_end);
    let bound =
        MAX_RSS_GROWTH_KIB + RSS_PER_ADDED_THREAD_KIB * threads_max.saturating_sub(threads_start);
    let events = accepted.load(Ordering::SeqCst);
    let entries_at_end = state_entries(&client, &gw).await;
    let growth = rss_end.saturating_sub(rss_start);
    let figures = format!(
        "hot_entries {HOT_ENTRIES}: {events} events in {elapsed:.1} s ({:.0} events/s, {} after the warm-up); \
         VmRSS start {rss_start} KiB, end {rss_end} KiB, max {rss_max} KiB, growth {growth} KiB \
         (bound {bound} KiB: {MAX_RSS_GROWTH_KIB} KiB and {RSS_PER_ADDED_THREAD_KIB} KiB for each of the \
         threads added, {threads_start} -> {threads_max}); \
         hookgate_state_entries {entries_at_start} -> {entries_at_end}",
        events as f64 / elapsed,
        events - events_at_start,
    );
    println!("{figures}");

    assert!(
        growth < bound,
        "resident memory grew beyond the bound: {figures}"
    );
    // Flat because the marks went to disk, not because they were forgotten: the first
    // events are still duplicates, under new request ids.
    for n in [0, 1, events / 2] {
        let id = format!("{run}-{n}");
        let (s, a) = gw.deliver(&client, &event_body(&id), &unique("req")).await;
        assert_eq!(
            (s, outcome(&a)),
            (200, "duplicate".into()),
            "{id} after the flow: {a}"
        );
    }
    // The duplicates were not published again: the queue keeps the newest thousand
    // messages, the originals of these ids are far older, so none of them may stand
    // before the sentinel.
    let newest = ids_before_sentinel(&client, &gw, &broker).await;
    let resent: Vec<String> = [0, 1, events / 2]
        .iter()
        .map(|n| format!("{run}-{n}"))
        .filter(|id| newest.contains(id))
        .collect();
    assert!(resent.is_empty(), "duplicates published again: {resent:?}");
    broker.delete().await;
}
