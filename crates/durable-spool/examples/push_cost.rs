//! Measures what a push into the spool costs on a real disk: the latency of pushes one
//! after the other (each waits for its commit's syncs), and the throughput of concurrent
//! pushes (which the writer groups into shared commits). The store is a temporary
//! directory under `--dir`, so the figures are those of that directory's disk.
//!
//! ```sh
//! cargo run --release -p durable-spool --example push_cost -- --dir /var/tmp
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_spool::{Options, Spool, SpooledMessage, Store, Unreported};

fn arg(name: &str) -> Option<String> {
    let mut args = std::env::args().skip_while(|a| a != name);
    args.next()?;
    args.next()
}

fn message(i: usize) -> SpooledMessage<'static> {
    SpooledMessage {
        routing_key: "botix.message.status".into(),
        message_id: format!("evt_{i:08}").into(),
        timestamp_secs: 1_764_000_000,
        request_id: format!("req_{i}").into(),
        event_type: "message.status".into(),
        attempt: Some(1),
        route: "botix".into(),
        received_at: "2026-12-03T10:00:00Z".into(),
        order_key: Some(format!("contact_{}", i % 64).into()),
        body: bytes::Bytes::from(vec![b'x'; 600]),
        content_type: Some("application/json".into()),
        traceparent: None,
        tracestate: None,
    }
}

/// The `p`th percentile of `sorted`; zero when nothing was measured.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    let at = (sorted.len() * p / 100).min(sorted.len().saturating_sub(1));
    sorted.get(at).copied().unwrap_or_default()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let parent = PathBuf::from(arg("--dir").unwrap_or_else(|| "/var/tmp".into()));
    let sequential: usize = arg("--sequential").map_or(Ok(500), |n| n.parse())?;
    let concurrent: usize = arg("--concurrent").map_or(Ok(5000), |n| n.parse())?;
    let senders: usize = arg("--senders").map_or(Ok(32), |n| n.parse())?;
    let dir = tempfile::tempdir_in(parent)?;
    let store = Store::open(dir.path())?;
    let options = Options {
        enabled: true,
        max_bytes: 1 << 30,
        stall_after: Duration::from_secs(30),
    };
    let spool = Arc::new(Spool::open(&store, &options, Arc::new(Unreported))?);

    let mut took = Vec::with_capacity(sequential);
    for i in 0..sequential {
        let msg = message(i);
        let start = Instant::now();
        spool.push(&msg).await?;
        took.push(start.elapsed());
    }
    took.sort();
    println!(
        "MEASURE sequential pushes={sequential} p50_us={} p99_us={}",
        percentile(&took, 50).as_micros(),
        percentile(&took, 99).as_micros()
    );

    let start = Instant::now();
    let mut tasks = Vec::with_capacity(senders);
    for s in 0..senders {
        let spool = spool.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = sequential + s;
            while i < sequential + concurrent {
                spool.push(&message(i)).await?;
                i += senders;
            }
            Ok::<(), durable_spool::SpoolError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "MEASURE concurrent pushes={concurrent} senders={senders} per_sec={:.0}",
        concurrent as f64 / secs.max(f64::MIN_POSITIVE)
    );
    Ok(())
}
