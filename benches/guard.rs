//! The pure out-of-order decisions (contract §4): status ranks and keywords.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use hookgate::guard::decide::{
    decide_keyword, decide_status, status_of, Keyword, KeywordLists, KeywordState, StatusRanks,
    StatusState,
};

fn bench(c: &mut Criterion) {
    let ranks = StatusRanks::default();
    let sent = StatusState {
        status: "sent".into(),
        rank: 2,
        timestamp_ms: 1_000,
    };
    let delivered = StatusState {
        status: "delivered".into(),
        rank: 3,
        timestamp_ms: 2_000,
    };
    let mut group = c.benchmark_group("guard/decide_status");
    group.bench_function("no_state", |b| {
        b.iter(|| decide_status(None, black_box("delivered"), 2_000, &ranks))
    });
    group.bench_function("advance", |b| {
        b.iter(|| {
            decide_status(
                Some(black_box(&sent)),
                black_box("delivered"),
                2_000,
                &ranks,
            )
        })
    });
    group.bench_function("stale", |b| {
        b.iter(|| {
            decide_status(
                Some(black_box(&delivered)),
                black_box("sent"),
                1_000,
                &ranks,
            )
        })
    });
    group.bench_function("status_of+decide", |b| {
        b.iter(|| {
            let s = status_of(black_box("message.status"), black_box(Some("Delivered")));
            decide_status(Some(&sent), &s, 2_000, &ranks)
        })
    });
    group.finish();

    let lists = KeywordLists::default();
    let opted_out = KeywordState {
        opted_out: true,
        opted_in_by_start: false,
        last_change_ms: Some(1_000),
        last_help_ms: None,
    };
    let mut group = c.benchmark_group("guard/decide_keyword");
    group.bench_function("stop_fresh", |b| {
        b.iter(|| decide_keyword(None, black_box(Keyword::Stop), 2_000, 60_000))
    });
    group.bench_function("stop_repeated", |b| {
        b.iter(|| decide_keyword(Some(black_box(&opted_out)), Keyword::Stop, 2_000, 60_000))
    });
    group.bench_function("start_after_stop", |b| {
        b.iter(|| decide_keyword(Some(black_box(&opted_out)), Keyword::Start, 2_000, 60_000))
    });
    group.bench_function("help", |b| {
        b.iter(|| decide_keyword(None, black_box(Keyword::Help), 2_000, 60_000))
    });
    group.finish();

    // What runs before decide_keyword on every inbound message: is the text a keyword?
    let mut group = c.benchmark_group("guard/classify");
    group.bench_function("keyword", |b| {
        b.iter(|| lists.classify(black_box("  Stop! ")))
    });
    group.bench_function("ordinary_text", |b| {
        b.iter(|| {
            lists.classify(black_box(
                "Hi, can you confirm my appointment for tomorrow at 10am? Thanks!",
            ))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
