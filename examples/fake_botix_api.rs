//! A fake of the Botix public list API to try reconciliation against: the test suite's
//! fake (`tests/it/util/fake_botix.rs`) as a server, with generated messages, a small rate
//! limit, optional scripted answers, and its request log printed as requests arrive.
//!
//! ```sh
//! cargo run --example fake_botix_api -- --addr 127.0.0.1:8099 --key botix_demo_key \
//!     --messages 9 --limit 3 --window 10 --script 429:3
//! ```

use std::time::Duration;

use clap::Parser;

#[path = "../tests/it/util/fake_botix.rs"]
mod fake_botix;

use fake_botix::{message, FakeBotix, Scripted};

#[derive(Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8099")]
    addr: std::net::SocketAddr,
    /// The key the fake accepts (`Authorization: Bearer <key>`).
    #[arg(long, default_value = "botix_demo_key")]
    key: String,
    /// Messages to list: outbound statuses, inbound texts and one STOP, a minute old.
    #[arg(long, default_value_t = 9)]
    messages: usize,
    /// Requests per window.
    #[arg(long, default_value_t = 3)]
    limit: u64,
    /// Window length, seconds.
    #[arg(long, default_value_t = 10)]
    window: i64,
    /// Answers queued ahead of the normal ones, comma separated: `429:<retry-after>`,
    /// `<status>` (e.g. 503, 422), `bad-body`.
    #[arg(long, value_delimiter = ',')]
    script: Vec<String>,
}

fn scripted(text: &str) -> Option<Scripted> {
    if text == "bad-body" {
        return Some(Scripted::Body("<html>maintenance</html>".into()));
    }
    match text.split_once(':') {
        Some((status, retry_after)) => Some(Scripted::Status(
            status.parse().ok()?,
            Some(retry_after.to_owned()),
        )),
        None => Some(Scripted::Status(text.parse().ok()?, None)),
    }
}

fn rfc3339(unix_ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let fake = FakeBotix::start_on(args.addr, &args.key, args.limit, args.window).await;
    let at = rfc3339(now_ms() - 60_000);
    fake.push((0..args.messages).map(|i| {
        let id = format!("msg_demo_{i:03}");
        match i % 3 {
            0 => message(
                &id,
                "outbound",
                Some("delivered"),
                "+15550100",
                "+15550199",
                "your code is 1234",
                &at,
            ),
            1 => message(
                &id,
                "inbound",
                None,
                &format!("+1555020{i}"),
                "+15550100",
                "hello",
                &at,
            ),
            _ if i == 2 => message(&id, "inbound", None, "+15550299", "+15550100", "STOP", &at),
            _ => message(
                &id,
                "outbound",
                Some("failed"),
                "+15550100",
                "+15550198",
                "reminder",
                &at,
            ),
        }
    }));
    fake.script(args.script.iter().filter_map(|s| scripted(s)));
    println!(
        "fake Botix list API on {} (key {}), {} messages, {} requests per {} s",
        fake.url(),
        args.key,
        args.messages,
        args.limit,
        args.window
    );
    println!("time (UTC)               \tcursor\tstatus\tremaining\treset (UTC)\tretry-after");
    let mut shown = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let log = fake.log();
        for l in &log[shown..] {
            println!(
                "{}\t{}\t{}\t{}\t{}\t{}",
                rfc3339(l.at_ms),
                l.cursor.as_deref().unwrap_or("-"),
                l.status,
                l.remaining,
                rfc3339(l.reset_secs * 1000),
                l.retry_after.as_deref().unwrap_or("-"),
            );
        }
        shown = log.len();
    }
}
