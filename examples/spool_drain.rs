//! Measures the spool: the latency of a 200 while the broker is away (each one waits for
//! the spool's fsync), and how long a backlog of spooled events takes to drain once the
//! broker is back.
//!
//! The gateway is hookgate's app served in this process, on a store in a temporary
//! directory. It first points at a port where no broker listens: `--sequential` deliveries
//! one after the other give the latency percentiles, then `--senders` concurrent senders
//! spool the rest up to `--total`. It stops cleanly and starts again on the same store with
//! the real broker (`--amqp-url`, a fresh exchange and queue of its own); the drain time is
//! from that start until the queue holds every event. Prints one `MEASURE` line per figure
//! and exits non-zero when a delivery is refused or the drain does not finish within
//! `--drain-deadline`.
//!
//! ```sh
//! cargo run --release --example spool_drain
//! cargo run --release --example spool_drain -- --total 50000 --senders 32
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use hookgate::outbox::publish::declare_exchange;
use lapin::options::{ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties};

const SECRET: &str = "whsec_spool_drain_5e1f0c2a9b";

#[derive(Parser, Debug)]
#[command(about = "Spooling latency and drain time of hookgate's spool")]
struct Cli {
    /// The broker the spool drains into.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp_url: String,
    /// Events spooled in all.
    #[arg(long, default_value_t = 10_000)]
    total: usize,
    /// Of those, delivered one after the other for the latency figures.
    #[arg(long, default_value_t = 2_000)]
    sequential: usize,
    /// Concurrent senders for the rest.
    #[arg(long, default_value_t = 16)]
    senders: usize,
    /// How long the drain may take.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    drain_deadline: Duration,
}

/// A gateway served in this process.
struct Gateway {
    addr: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), hookgate::app::AppError>>,
}

impl Gateway {
    async fn start(store: &std::path::Path, amqp_url: &str, exchange: &str) -> Result<Self> {
        let yaml = format!(
            "listen:\n  addr: 127.0.0.1:0\nadmin:\n  addr: 127.0.0.1:0\nstore:\n  path: {}\namqp:\n  url: {amqp_url}\n  exchange: {exchange}\nroutes:\n  - name: botix\n    path: /webhooks/botix\n    secrets:\n      - secret: {SECRET}\n",
            store.display()
        );
        let config = hookgate::config::Config::parse(&yaml).context("config")?;
        let prepared = hookgate::app::prepare(config).context("prepare")?;
        let webhooks = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let (addr, admin_addr) = (webhooks.local_addr()?, admin.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(hookgate::app::serve(
            prepared,
            hookgate::app::Listeners { webhooks, admin },
            async {
                let _ = stopped.await;
            },
            hookgate::app::Options::default(),
        ));
        Ok(Self {
            addr,
            admin: admin_addr,
            stop,
            server,
        })
    }

    /// Delivers a fresh event `id`; fails unless it is accepted.
    async fn accept(&self, client: &reqwest::Client, id: &str) -> Result<()> {
        let body = serde_json::json!({
            "id": id,
            "event": "contact.created",
            "timestamp": time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)?,
            "data": {"contact_id": 1}
        })
        .to_string();
        let resp = client
            .post(format!("http://{}/webhooks/botix", self.addr))
            .header(
                "x-botix-signature",
                hookgate::providers::botix_header(SECRET.as_bytes(), body.as_bytes()),
            )
            .header("x-botix-request-id", format!("req_{id}"))
            .body(body)
            .send()
            .await?;
        let status = resp.status();
        let answer = resp.text().await?;
        ensure!(status == 200, "{id}: {status} {answer}");
        Ok(())
    }

    /// The spool's depth, from the admin `/spool`.
    async fn spool_depth(&self, client: &reqwest::Client) -> Result<u64> {
        let v: serde_json::Value = client
            .get(format!("http://{}/spool", self.admin))
            .send()
            .await?
            .json()
            .await?;
        v["depth"].as_u64().context("no depth in /spool")
    }

    /// Shuts down (draining in-flight requests, flushing the store) and waits for the end.
    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        self.server.await??;
        Ok(())
    }
}

/// The measurement's own exchange and queue (bound to every key), deleted at the end.
struct Broker {
    _connection: Connection,
    channel: Channel,
    exchange: String,
    queue: String,
}

impl Broker {
    async fn new(url: &str) -> Result<Self> {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .with_context(|| format!("connect to {url}"))?;
        let channel = connection.create_channel().await?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (exchange, queue) = (format!("spool-drain-x-{id}"), format!("spool-drain-q-{id}"));
        declare_exchange(&channel, ShortString::from(exchange.as_str())).await?;
        channel
            .queue_declare(
                ShortString::from(queue.as_str()),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_bind(
                ShortString::from(queue.as_str()),
                ShortString::from(exchange.as_str()),
                ShortString::from("#"),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(Self {
            _connection: connection,
            channel,
            exchange,
            queue,
        })
    }

    /// Messages ready in the queue.
    async fn message_count(&self) -> Result<u32> {
        let q = self
            .channel
            .queue_declare(
                ShortString::from(self.queue.as_str()),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok(q.message_count())
    }

    async fn delete(&self) -> Result<()> {
        self.channel
            .exchange_delete(
                ShortString::from(self.exchange.as_str()),
                ExchangeDeleteOptions::default(),
            )
            .await?;
        Ok(())
    }
}

/// An AMQP URL to a port of this machine that nothing listens on.
fn unreachable_amqp_url() -> Result<String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    Ok(format!("amqp://guest:guest@127.0.0.1:{port}/%2f"))
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    ensure!(
        cli.sequential <= cli.total && cli.senders > 0,
        "--sequential must not exceed --total, and --senders must be at least 1"
    );
    hookgate::tls::install_crypto_provider();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let broker = Broker::new(&cli.amqp_url).await?;
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");

    let gw = Gateway::start(&store, &unreachable_amqp_url()?, &broker.exchange).await?;
    let mut latencies = Vec::with_capacity(cli.sequential);
    for i in 0..cli.sequential {
        let started = Instant::now();
        gw.accept(&client, &format!("evt_s_{i:06}")).await?;
        latencies.push(started.elapsed());
    }
    latencies.sort();
    if let Some(max) = latencies.last() {
        let pct =
            |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
        println!(
            "MEASURE spooling 200 latency over {} sequential deliveries: p50 {:?}, p99 {:?}, max {max:?}",
            cli.sequential,
            pct(0.50),
            pct(0.99),
        );
    }

    let gw = Arc::new(gw);
    let rest = cli.total - cli.sequential;
    let fill_started = Instant::now();
    let mut senders = tokio::task::JoinSet::new();
    for t in 0..cli.senders {
        let (gw, client, step) = (gw.clone(), client.clone(), cli.senders);
        senders.spawn(async move {
            for i in (t..rest).step_by(step) {
                gw.accept(&client, &format!("evt_c_{i:06}")).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(sent) = senders.join_next().await {
        sent??;
    }
    println!(
        "MEASURE {rest} more spooled by {} concurrent senders in {:?}",
        cli.senders,
        fill_started.elapsed()
    );
    let depth = gw.spool_depth(&client).await?;
    ensure!(
        depth == cli.total as u64,
        "spool depth {depth}, expected {}",
        cli.total
    );
    let Ok(gw) = Arc::try_unwrap(gw) else {
        bail!("a sender still holds the gateway");
    };
    gw.stop().await?;

    let started = Instant::now();
    let gw = Gateway::start(&store, &cli.amqp_url, &broker.exchange).await?;
    let serving = started.elapsed();
    let deadline = started + cli.drain_deadline;
    let mut count = broker.message_count().await?;
    while count < cli.total as u32 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        count = broker.message_count().await?;
    }
    let drained = started.elapsed();
    println!(
        "MEASURE drain of {}: {count} in the queue {drained:?} after start ({serving:?} to serving), {:.0} events/s",
        cli.total,
        f64::from(count) / drained.as_secs_f64()
    );
    gw.stop().await?;
    broker.delete().await?;
    ensure!(
        count == cli.total as u32,
        "the drain did not finish within {:?}",
        cli.drain_deadline
    );
    Ok(())
}
