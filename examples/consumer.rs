//! The other side of hookgate's contract: a RabbitMQ consumer to copy into a handler.
//!
//! It declares a durable queue bound to hookgate's exchange, consumes with manual acks and
//! a prefetch limit, skips messages whose `message_id` it has already handled, and
//! reconnects by itself when the broker restarts or drops the connection. As shipped it
//! prints every message (routing key, properties, headers, body), which also makes it the
//! way to watch what hookgate publishes while trying it out.
//!
//! ```text
//! cargo run --example consumer -- [--url URL] [--exchange NAME] [--queue NAME]
//!                                 [--binding PATTERN] [--prefetch N]
//! ```
//!
//! Defaults: the local broker, exchange `webhooks`, queue `hookgate.consumer`, binding `#`
//! (every routing key), prefetch 32. The queue outlives the consumer: events published
//! while it is stopped wait in the queue, and hookgate never finds its exchange without a
//! queue (which would leave accepted events in its spool).
//!
//! What a real handler must still do, beyond this file:
//!
//! - **Make its effects idempotent.** hookgate publishes an event once, except after a crash
//!   between the broker's confirm and its own dedup mark; the broker redelivers every
//!   message that was not acked when a consumer's connection ended. The in-memory set below
//!   only catches repeats within one run. The durable form is a unique key on `message_id`
//!   in the handler's own database, written in the same transaction as the effect.
//! - **Ack only after the effect is durable.** An ack before it loses the event if the
//!   handler dies in between; an ack after it can only cause a redelivery, which the
//!   idempotent effect absorbs.
//! - **Decide what a message it cannot handle becomes.** Here a failed handler nacks with
//!   requeue, so the message comes back; a message that can never succeed should be
//!   rejected without requeue into a dead-letter exchange (set `x-dead-letter-exchange` on
//!   the queue) rather than loop.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use clap::Parser;
use futures_util::StreamExt;
use hookgate::outbox::publish::declare_exchange;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Connection, ConnectionProperties};

/// Reconnect back-off: from the first to the last, doubling.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_LAST: Duration = Duration::from_secs(10);
/// Message ids remembered for the in-run dedup; the oldest are forgotten first.
const REMEMBERED_IDS: usize = 100_000;

#[derive(Parser)]
#[command(about = "Consume what hookgate publishes: durable queue, manual acks, dedup, reconnect")]
struct Args {
    /// Broker URL. `heartbeat=10` makes a silently dead broker noticed within seconds.
    #[arg(
        long,
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=10"
    )]
    url: String,
    /// hookgate's exchange (`amqp.exchange`).
    #[arg(long, default_value = "webhooks")]
    exchange: String,
    /// The consumer's own durable queue. Several processes with the same queue share the
    /// work; two different queues each get every message.
    #[arg(long, default_value = "hookgate.consumer")]
    queue: String,
    /// Binding pattern: `#` is every routing key, `message.*` the message events.
    #[arg(long, default_value = "#")]
    binding: String,
    /// Unacked messages the broker hands this consumer at once.
    #[arg(long, default_value_t = 32)]
    prefetch: u16,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let mut seen = SeenIds::default();
    let mut backoff = BACKOFF_FIRST;
    loop {
        let session = tokio::select! {
            ended = consume(&args, &mut seen, &mut backoff) => ended,
            _ = tokio::signal::ctrl_c() => {
                // Unacked messages go back to the queue when the connection closes.
                eprintln!("consumer: stopped");
                return;
            }
        };
        match session {
            Ok(()) => {
                eprintln!("consumer: the channel or connection closed; reconnecting in {backoff:?}")
            }
            Err(error) => eprintln!("consumer: {error}; reconnecting in {backoff:?}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = tokio::signal::ctrl_c() => return,
        }
        backoff = (backoff * 2).min(BACKOFF_LAST);
    }
}

/// One connection's life: set up the topology, then handle deliveries until the connection
/// or the channel ends. Returns `Ok` when the broker cancelled the consumer.
async fn consume(
    args: &Args,
    seen: &mut SeenIds,
    backoff: &mut Duration,
) -> Result<(), lapin::Error> {
    let properties = ConnectionProperties::default()
        .with_connection_name(LongString::from("hookgate-example-consumer"));
    let connection = Connection::connect(&args.url, properties).await?;
    let channel = connection.create_channel().await?;
    // Declared by hookgate's own call (durable topic), so whichever starts first creates it
    // and the other's declaration agrees.
    declare_exchange(&channel, ShortString::from(args.exchange.as_str())).await?;
    // Durable, not exclusive, not auto-delete: the queue and its messages survive this
    // process and a broker restart (hookgate publishes persistent messages). For
    // replicated storage across a RabbitMQ cluster, declare it with `x-queue-type: quorum`.
    channel
        .queue_declare(
            ShortString::from(args.queue.as_str()),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_bind(
            ShortString::from(args.queue.as_str()),
            ShortString::from(args.exchange.as_str()),
            ShortString::from(args.binding.as_str()),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    // At most this many unacked messages in flight: bounds memory and the work redone
    // after a crash.
    channel
        .basic_qos(args.prefetch, BasicQosOptions::default())
        .await?;
    let mut deliveries = channel
        .basic_consume(
            ShortString::from(args.queue.as_str()),
            ShortString::from(""),
            BasicConsumeOptions {
                no_ack: false,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    eprintln!(
        "consumer: queue {:?} bound to exchange {:?} with {:?}; Ctrl-C to stop",
        args.queue, args.exchange, args.binding
    );
    *backoff = BACKOFF_FIRST;
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        let id = message_id(&delivery);
        if let Some(id) = &id {
            if seen.contains(id) {
                // Handled before (a redelivery or a publish repeated after a crash): ack
                // without doing the work again.
                println!("--- duplicate message_id={id}: acked, not handled again");
                delivery.ack(BasicAckOptions::default()).await?;
                continue;
            }
        }
        match handle(&delivery) {
            Ok(()) => {
                // The ack comes after the handler's effect, never before.
                delivery.ack(BasicAckOptions::default()).await?;
                if let Some(id) = id {
                    seen.insert(id);
                }
            }
            Err(reason) => {
                eprintln!("consumer: handler failed ({reason}); message requeued");
                delivery
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    })
                    .await?;
            }
        }
    }
    Ok(())
}

/// The event's id: hookgate sets `message_id` to it on every message.
fn message_id(delivery: &Delivery) -> Option<String> {
    delivery
        .properties
        .message_id()
        .as_ref()
        .map(|s| s.as_str().to_owned())
}

/// The handler: here it prints the message. A real one does its work here and returns
/// `Err` when it could not, so the message is not acked.
fn handle(delivery: &Delivery) -> Result<(), String> {
    let p = &delivery.properties;
    let text = |s: Option<&ShortString>| s.map_or("-", ShortString::as_str).to_owned();
    println!(
        "--- routing_key={} message_id={} redelivered={}",
        delivery.routing_key.as_str(),
        text(p.message_id().as_ref()),
        delivery.redelivered
    );
    println!(
        "    content_type={} app_id={} delivery_mode={} timestamp={}",
        text(p.content_type().as_ref()),
        text(p.app_id().as_ref()),
        p.delivery_mode().map_or("-".to_owned(), |m| m.to_string()),
        p.timestamp().map_or("-".to_owned(), |t| t.to_string()),
    );
    if let Some(headers) = p.headers() {
        for (name, value) in headers.inner() {
            println!("    {}: {}", name.as_str(), header_text(value));
        }
    }
    println!("{}", String::from_utf8_lossy(&delivery.data));
    Ok(())
}

fn header_text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

/// The ids handled in this run, the most recent [`REMEMBERED_IDS`] of them.
#[derive(Default)]
struct SeenIds {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl SeenIds {
    fn contains(&self, id: &str) -> bool {
        self.ids.contains(id)
    }

    fn insert(&mut self, id: String) {
        if self.ids.insert(id.clone()) {
            self.order.push_back(id);
        }
        while self.order.len() > REMEMBERED_IDS {
            if let Some(oldest) = self.order.pop_front() {
                self.ids.remove(&oldest);
            }
        }
    }
}
