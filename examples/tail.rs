//! Prints what hookgate publishes: declares a temporary queue, binds it to the exchange with
//! `#`, and shows each message's routing key, properties, headers and body.
//!
//! `cargo run --example tail -- [AMQP_URL] [EXCHANGE]`
//! (defaults: the local broker and `webhooks`).

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Connection, ConnectionProperties, ExchangeKind};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let exchange = args.next().unwrap_or_else(|| "webhooks".into());
    let connection = Connection::connect(&url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    // Declared as hookgate declares it, so whichever starts first creates it.
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(
            ShortString::from(exchange.as_str()),
            ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await?;
    let exclusive = QueueDeclareOptions {
        exclusive: true,
        auto_delete: true,
        ..Default::default()
    };
    let queue = channel
        .queue_declare(ShortString::from(""), exclusive, FieldTable::default())
        .await?;
    let queue_name = queue.name().clone();
    channel
        .queue_bind(
            queue_name.clone(),
            ShortString::from(exchange.as_str()),
            ShortString::from("#"),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    eprintln!(
        "tailing exchange {exchange:?} (queue {}); Ctrl-C to stop",
        queue_name.as_str()
    );
    let mut consumer = channel
        .basic_consume(
            queue_name,
            ShortString::from("tail"),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(delivery) = consumer.next().await {
        let d = delivery?;
        let p = &d.properties;
        println!(
            "--- routing_key={} message_id={:?} delivery_mode={:?} timestamp={:?}",
            d.routing_key.as_str(),
            p.message_id().as_ref().map(|s| s.as_str()),
            p.delivery_mode(),
            p.timestamp()
        );
        if let Some(headers) = p.headers() {
            for (k, v) in headers.inner() {
                let text = match v {
                    AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                    other => format!("{other:?}"),
                };
                println!("    {}: {text}", k.as_str());
            }
        }
        println!("{}", String::from_utf8_lossy(&d.data));
        d.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}
