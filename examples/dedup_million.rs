//! Stores one million distinct dedup marks (claim, then done, as an accepted delivery does)
//! in the state journal of a temporary sled store, reports the slowest single mark (a shard
//! of the in-memory map growing holds its lock), its size on disk and how long a restart's
//! replay takes, then moves the clock past the TTL and reports how long the sweep
//! takes and what is left, then stores as many new marks to show whether the swept space is
//! reused.
//!
//! `cargo run --release --example dedup_million [-- COUNT]`

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hookgate::state::journal::Journal;
use hookgate::state::keys::StoreKey;
use hookgate::state::marks::{Claim, SledMarks};
use hookgate::store::Store;

const TTL_MS: i64 = 72 * 3600 * 1000;

fn du(path: &Path) -> String {
    Command::new("du")
        .arg("-sh")
        .arg(path)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "du failed".into())
}

/// Current and peak resident size (Linux), for the memory a million marks take.
fn resident() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .map(|l| l[name.len()..].trim().to_owned())
            .unwrap_or_else(|| "?".into())
    };
    format!("RSS {}, peak {}", field("VmRSS:"), field("VmHWM:"))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() -> anyhow::Result<()> {
    let count: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path())?;
    let now = 1_800_000_000_000_i64;
    let ttl = Duration::from_millis(TTL_MS as u64);
    let journal = Journal::open(store.tree("state")?, now, ttl)?;
    let marks = SledMarks::new(journal.clone(), Duration::from_secs(30));

    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for n in 0..count {
        // A realistic id: `evt_` and a UUID, as senders use.
        let key = StoreKey::event(
            "botix",
            &format!("evt_{}", uuid::Uuid::from_u128(u128::from(n))),
        );
        let one = Instant::now();
        anyhow::ensure!(marks.try_claim(&key, n, now) == Claim::Claimed, "claim {n}");
        marks.mark_done(&[&key], now + TTL_MS, now);
        slowest = slowest.max(one.elapsed());
    }
    journal.write_now()?;
    let insert = started.elapsed();
    store.flush_blocking()?;
    println!("marks stored:        {count} in {insert:.2?}; slowest claim+done {slowest:.2?}");
    println!("marks held:          {}; {}", journal.len(), resident());
    println!(
        "size_on_disk:        {} bytes ({:.1} MiB)",
        store.size_on_disk(),
        mib(store.size_on_disk())
    );
    println!("du -sh:              {}", du(dir.path()));

    // The sweep that runs every minute while the gateway serves: nothing has expired yet.
    let started = Instant::now();
    let removed = journal.sweep(now + 1)?;
    println!(
        "sweep, none expired: removed {removed} in {:.2?}",
        started.elapsed()
    );

    // A restart: the journal is replayed into memory.
    drop(marks);
    drop(journal);
    let started = Instant::now();
    let journal = Journal::open(store.tree("state")?, now, ttl)?;
    println!(
        "replay at restart:   {} marks in {:.2?}; {}",
        journal.len(),
        started.elapsed(),
        resident()
    );
    let marks = SledMarks::new(journal.clone(), Duration::from_secs(30));

    let started = Instant::now();
    let removed = journal.sweep(now + TTL_MS)?;
    let sweep = started.elapsed();
    store.flush_blocking()?;
    println!("sweep past the TTL:  removed {removed} in {sweep:.2?}");
    println!("marks left:          {}", journal.len());
    println!(
        "size_on_disk after:  {} bytes ({:.1} MiB)",
        store.size_on_disk(),
        mib(store.size_on_disk())
    );
    println!("du -sh after:        {}", du(dir.path()));

    // A second generation of marks: does the space freed by the sweep get reused?
    let later = now + TTL_MS;
    for n in count..2 * count {
        let key = StoreKey::event(
            "botix",
            &format!("evt_{}", uuid::Uuid::from_u128(u128::from(n))),
        );
        anyhow::ensure!(
            marks.try_claim(&key, n, later) == Claim::Claimed,
            "claim {n}"
        );
        marks.mark_done(&[&key], later + TTL_MS, later);
    }
    journal.write_now()?;
    store.flush_blocking()?;
    println!(
        "after {count} more:   {} bytes ({:.1} MiB), du -sh {}",
        store.size_on_disk(),
        mib(store.size_on_disk()),
        du(dir.path())
    );
    Ok(())
}
