//! The local backend holding a dedup window of COUNT live marks: what it costs in memory,
//! on disk and per lookup, and how long a restart takes.
//!
//! Loads COUNT / 2 events as accepted deliveries leave them (a claim of the event key, the
//! event and request keys marked done, one status guard entry each), at the pace the
//! flush thread takes them. Then prints the resident size with the window settled, the
//! claim+done latency of new events and the claim latency of duplicates (p50, p99, max),
//! disk bytes per mark, and the time a reopen takes before the first lookup answers.
//!
//! `cargo run --release --example dedup_window -- COUNT [DIR]`
//!
//! `HOT_ENTRIES` and `CACHE_MIB` set `store.hot_entries` and `store.cache` (defaults as
//! the gateway's).
//!
//! With DIR the store is kept there, laid out as the gateway's `store.path`, with marks that
//! expire 72 h from now (a preloaded store for a load run); without, a temporary folder.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_spool::{Store, DEFAULT_CACHE_BYTES};
use expiring_lsm::journal::{Journal, Settings};
use hdrhistogram::Histogram;
use hookgate::source::Source;
use hookgate::state::decision::{Decided, EventRecord, RequestRecord};
use hookgate::state::keys::StoreKey;
use hookgate::state::marks::{Claim, JournalMarks, KeyState};
use hookgate::state::{LegacyJournal, JOURNAL_TREE};

// The gateway's allocator, so that resident sizes compare.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TTL: Duration = Duration::from_secs(72 * 3600);
const SAMPLES: u64 = 20_000;

/// Resident and peak resident size of this process, in MiB (Linux).
fn resident_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

fn bytes_under(path: &Path) -> u64 {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => bytes_under(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

struct Window {
    store: Store,
    journal: Arc<Journal>,
    marks: JournalMarks,
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn hot_entries() -> usize {
    env_or("HOT_ENTRIES", 65_536) as usize
}

fn open(dir: &Path, now: &Arc<AtomicI64>) -> anyhow::Result<Window> {
    let cache = env_or("CACHE_MIB", DEFAULT_CACHE_BYTES >> 20) << 20;
    let store = Store::open_with_cache(dir, cache)?;
    let clock_now = now.clone();
    let settings = Settings {
        hot_entries: hot_entries(),
        ttl: TTL,
        clock: Arc::new(move || clock_now.load(Ordering::SeqCst)),
        segment_bytes: 4 << 20,
        commit_interval: Duration::from_millis(1),
        durable_wait: Duration::from_secs(5),
        needs_restart: std::sync::Arc::new(|_| {}),
        disk: disk_seam::real(),
        background: true,
        page_reads: expiring_lsm::journal::read_here,
    };
    let journal = Journal::open(
        Arc::new(LegacyJournal(store.tree(JOURNAL_TREE)?)),
        dir,
        now.load(Ordering::SeqCst),
        settings,
    )?;
    let marks = JournalMarks::new(journal.clone(), Duration::from_secs(30));
    Ok(Window {
        store,
        journal,
        marks,
    })
}

fn keys(event: u64) -> (StoreKey, StoreKey, StoreKey) {
    (
        StoreKey::event("botix", &format!("evt_{event:012}")),
        StoreKey::request("botix", &format!("req_{event:012}")),
        StoreKey::guard("botix", "status", &[&format!("msg_{event:012}")]),
    )
}

/// What an accepted delivery leaves: a claim, two done marks and its status state.
fn accept(w: &Window, event: u64, now_ms: i64) -> anyhow::Result<()> {
    let (ev, req, status) = keys(event);
    anyhow::ensure!(
        w.marks.state(&req, now_ms)? == KeyState::Free,
        "request {event} known"
    );
    anyhow::ensure!(
        w.marks.try_claim(&ev, event, now_ms)? == Claim::Claimed,
        "event {event} taken"
    );
    let expires = now_ms + TTL.as_millis() as i64;
    // The decision records a delivery's marks carry: a published event that came under a
    // sender's UUID request id, and the request id pointing to it.
    let request_id = uuid::Uuid::from_u128(u128::from(event)).to_string();
    let event_record = EventRecord::first(
        now_ms,
        Decided::Published,
        Source::Webhook,
        Some(&request_id),
    )
    .encode();
    let request_record = RequestRecord {
        event_id: format!("evt_{event:012}"),
        by_message: false,
    }
    .encode();
    w.marks.mark_done(
        &[(&ev, &event_record), (&req, &request_record)],
        expires,
        now_ms,
    )?;
    let guard = format!(
        r#"{{"expires_ms":{e},"state":{{"status":"delivered","rank":3,"timestamp_ms":{now_ms}}},"by":{{"event_id":"evt_{event:012}","at_ms":{now_ms}}}}}"#,
        e = now_ms + 7 * 86_400_000
    );
    w.journal.put(
        &status.digest(),
        guard.as_bytes(),
        now_ms + 7 * 86_400_000,
        now_ms,
    )?;
    Ok(())
}

fn micros(h: &Histogram<u64>) -> String {
    format!(
        "p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0
    )
}

fn main() -> anyhow::Result<()> {
    let count: u64 = std::env::args()
        .nth(1)
        .map(|a| a.replace('_', "").parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let kept = std::env::args().nth(2);
    let temp = tempfile::tempdir()?;
    let dir = kept.as_deref().map_or(temp.path(), Path::new).to_owned();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let now = Arc::new(AtomicI64::new(wall));
    let events = count / 2;
    let (idle, _) = resident_mib();
    println!(
        "window of {count} marks ({events} events, {events} status entries) in {}",
        dir.display()
    );
    println!("idle: RSS {idle:.1} MiB");

    let w = open(&dir, &now)?;
    let started = Instant::now();
    let mut last = Instant::now();
    for event in 0..events {
        // A sender's pace, not a loop's: new entries wait while the flush thread catches up.
        while w.journal.hot_len() > 2 * hot_entries() {
            std::thread::sleep(Duration::from_millis(1));
        }
        accept(&w, event, wall)?;
        if (event + 1) % 5_000_000 == 0 {
            let (rss, peak) = resident_mib();
            println!(
                "  {:>3} M marks  {:>6.1} s  {:>7.0} events/s last 5 M  RSS {rss:.1} MiB (peak {peak:.1})  runs {}",
                (event + 1) * 2 / 1_000_000,
                started.elapsed().as_secs_f64(),
                5_000_000.0 / last.elapsed().as_secs_f64(),
                w.journal.runs()
            );
            last = Instant::now();
        }
    }
    w.journal.flush_to_run()?;
    w.journal.merge_now()?;
    let load_s = started.elapsed().as_secs_f64();
    let (rss, peak) = resident_mib();
    let disk = bytes_under(&dir);
    println!(
        "loaded in {load_s:.1} s ({:.0} events/s)",
        events as f64 / load_s
    );
    println!(
        "settled: RSS {rss:.1} MiB (peak while loading {peak:.1}), runs {}, run filters and indexes {:.1} MiB, hot set {}",
        w.journal.runs(),
        w.journal.runs_memory_bytes() as f64 / 1048576.0,
        w.journal.hot_len()
    );
    println!(
        "growth over idle: {:.2} bytes a mark; disk {:.1} MiB, {:.1} bytes a mark (status entries included)",
        (rss - idle) * 1048576.0 / count as f64,
        disk as f64 / 1048576.0,
        disk as f64 / count as f64
    );

    let mut new = Histogram::<u64>::new(3)?;
    let mut duplicate = Histogram::<u64>::new(3)?;
    for i in 0..SAMPLES {
        let t = Instant::now();
        accept(&w, events + i, wall)?;
        new.record(t.elapsed().as_nanos() as u64)?;
        // A duplicate of a random event of the window.
        let old = rand::random::<u64>() % events.max(1);
        let (ev, req, _) = keys(old);
        let t = Instant::now();
        let seen = w.marks.state(&req, wall)? == KeyState::Done
            || w.marks.try_claim(&ev, u64::MAX, wall)? == Claim::Done;
        duplicate.record(t.elapsed().as_nanos() as u64)?;
        anyhow::ensure!(seen, "event {old} not found as a duplicate");
    }
    println!(
        "claim+done of a new event (request check, claim, two marks, status entry): {}",
        micros(&new)
    );
    println!(
        "claim of a duplicate (request check): {}",
        micros(&duplicate)
    );

    w.journal.write_now()?;
    w.store.flush_blocking()?;
    drop(w);
    let t = Instant::now();
    let w = open(&dir, &now)?;
    let (ev, _, _) = keys(events / 3);
    let found = w.marks.try_claim(&ev, u64::MAX, wall)? == Claim::Done;
    let reopen = t.elapsed();
    let (rss_after, _) = resident_mib();
    anyhow::ensure!(found, "a mark of the window is missing after the reopen");
    println!(
        "reopen to first answer: {:.2} s (hot set replayed: {} entries); RSS after {rss_after:.1} MiB",
        reopen.as_secs_f64(),
        w.journal.hot_len()
    );
    if kept.is_some() {
        w.journal.write_now()?;
        w.store.flush_blocking()?;
    }
    Ok(())
}
