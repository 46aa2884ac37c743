//! Dedup cost per request: claim the event key, then record it done (what an accepted
//! delivery does in the local backend's journal), each iteration with a new event id.
//!
//! `cargo bench --bench dedup`

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use durable_spool::Store;
use expiring_lsm::journal::{Journal, Settings};
use hookgate::state::keys::StoreKey;
use hookgate::state::marks::{Claim, JournalMarks};
use hookgate::state::LegacyJournal;

const TTL_MS: i64 = 72 * 3600 * 1000;
/// A decision record of the size a published event's mark carries (30 bytes).
const RECORD: [u8; 30] = [1; 30];

fn claim_and_done(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open store");
    let now = 1_800_000_000_000_i64;
    let settings = Settings {
        hot_entries: 65_536,
        ttl: Duration::from_secs(72 * 3600),
        clock: std::sync::Arc::new(move || now),
        segment_bytes: 4 << 20,
        commit_interval: Duration::from_millis(1),
        durable_wait: Duration::from_secs(5),
        needs_restart: std::sync::Arc::new(|_| {}),
        disk: disk_seam::real(),
        background: true,
        page_reads: expiring_lsm::journal::read_here,
    };
    let journal = Journal::open(
        std::sync::Arc::new(LegacyJournal(store.tree("state").expect("tree"))),
        dir.path(),
        now,
        settings,
    )
    .expect("journal");
    let marks = JournalMarks::new(journal, Duration::from_secs(30));
    let mut n: u64 = 0;

    c.bench_function("dedup claim+done (event and request key)", |b| {
        b.iter(|| {
            n += 1;
            let ev = StoreKey::event("botix", &format!("evt_{n}"));
            let req = StoreKey::request("botix", &format!("req_{n}"));
            let claim = marks.try_claim(&ev, n, now).expect("claim");
            assert_eq!(claim, Claim::Claimed);
            marks
                .mark_done(
                    &[(&ev, &RECORD[..]), (&req, &RECORD[..])],
                    now + TTL_MS,
                    now,
                )
                .expect("done");
            black_box(claim)
        })
    });

    c.bench_function("dedup claim of a done key (duplicate)", |b| {
        let ev = StoreKey::event("botix", "evt_dup");
        marks
            .mark_done(&[(&ev, &RECORD[..])], now + TTL_MS, now)
            .expect("done");
        b.iter(|| {
            let claim = marks.try_claim(black_box(&ev), 1, now).expect("claim");
            assert_eq!(claim, Claim::Done);
            claim
        })
    });
}

criterion_group!(benches, claim_and_done);
criterion_main!(benches);
