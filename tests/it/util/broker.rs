//! The real RabbitMQ: a random exchange and queue per test, read with basic.get.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lapin::options::{
    BasicAckOptions, BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use super::{unique, AMQP_URL, BROKER_TIMEOUT};

/// Declares the durable topic exchange `name` on `channel`, of the kind the gateway
/// publishes to; the caller bounds the wait.
pub async fn declare_topic_exchange(channel: &Channel, name: &str) -> lapin::Result<()> {
    channel
        .exchange_declare(
            ShortString::from(name),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
}

/// One message as a consumer sees it.
#[derive(Debug, Clone)]
pub struct Received {
    pub body: Vec<u8>,
    pub routing_key: String,
    pub message_id: Option<String>,
    pub delivery_mode: Option<u8>,
    pub content_type: Option<String>,
    pub app_id: Option<String>,
    pub timestamp: Option<u64>,
    pub headers: BTreeMap<String, AMQPValue>,
}

impl Received {
    /// A header as text (long strings) or number text (integers).
    pub fn header(&self, name: &str) -> Option<String> {
        match self.headers.get(name)? {
            AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
            AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
            AMQPValue::LongLongInt(n) => Some(n.to_string()),
            AMQPValue::LongInt(n) => Some(n.to_string()),
            other => Some(format!("{other:?}")),
        }
    }

    /// The JSON body.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("message body is JSON")
    }
}

/// A test's own exchange (declared as the gateway declares it) and queue. The exchange is
/// durable, so a test that fails before [`Broker::delete`] has it deleted on drop.
pub struct Broker {
    _connection: Connection,
    channel: Channel,
    pub exchange: String,
    pub queue: String,
    deleted: AtomicBool,
}

impl Broker {
    /// A new exchange with a queue bound to every routing key.
    pub async fn new() -> Self {
        let b = Self::unbound().await;
        b.bind("#").await;
        b
    }

    /// A new exchange with a queue bound to every routing key that holds at most `max`
    /// messages and has the broker nack publishes beyond that (`x-overflow: reject-publish`).
    pub async fn rejecting_beyond(max: i32) -> Self {
        let mut args = FieldTable::default();
        args.insert("x-max-length".into(), AMQPValue::LongInt(max));
        args.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        let b = Self::declare(args).await;
        b.bind("#").await;
        b
    }

    /// A new exchange with a queue bound to every routing key that keeps only the newest
    /// `max` messages (the broker drops the oldest), so a long flow of events leaves the
    /// broker's memory out of the picture.
    pub async fn keeping_newest(max: i32) -> Self {
        let mut args = FieldTable::default();
        args.insert("x-max-length".into(), AMQPValue::LongInt(max));
        let b = Self::declare(args).await;
        b.bind("#").await;
        b
    }

    /// A new exchange and queue, the queue not bound yet (so publishes are unroutable).
    pub async fn unbound() -> Self {
        Self::declare(FieldTable::default()).await
    }

    async fn declare(queue_args: FieldTable) -> Self {
        let connection = tokio::time::timeout(
            BROKER_TIMEOUT,
            Connection::connect(AMQP_URL, ConnectionProperties::default()),
        )
        .await
        .expect("broker connect timed out")
        .expect("broker connect");
        let channel = tokio::time::timeout(BROKER_TIMEOUT, connection.create_channel())
            .await
            .expect("channel timed out")
            .expect("channel");
        let exchange = unique("hg-test-x");
        let queue = unique("hg-test-q");
        tokio::time::timeout(BROKER_TIMEOUT, declare_topic_exchange(&channel, &exchange))
            .await
            .expect("declare timed out")
            .expect("declare exchange");
        tokio::time::timeout(
            BROKER_TIMEOUT,
            channel.queue_declare(
                ShortString::from(queue.as_str()),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
                queue_args,
            ),
        )
        .await
        .expect("queue timed out")
        .expect("declare queue");
        Self {
            _connection: connection,
            channel,
            exchange,
            queue,
            deleted: AtomicBool::new(false),
        }
    }

    /// Binds the queue with `pattern`.
    pub async fn bind(&self, pattern: &str) {
        tokio::time::timeout(
            BROKER_TIMEOUT,
            self.channel.queue_bind(
                ShortString::from(self.queue.as_str()),
                ShortString::from(self.exchange.as_str()),
                ShortString::from(pattern),
                QueueBindOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("bind timed out")
        .expect("bind");
    }

    /// The next message, waiting up to `timeout`.
    pub async fn next(&self, timeout: Duration) -> Option<Received> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let got = tokio::time::timeout(
                BROKER_TIMEOUT,
                self.channel.basic_get(
                    ShortString::from(self.queue.as_str()),
                    BasicGetOptions::default(),
                ),
            )
            .await
            .expect("basic.get timed out")
            .expect("basic.get");
            if let Some(m) = got {
                let d = m.delivery;
                let _ = d.acker.ack(BasicAckOptions::default()).await;
                let p = &d.properties;
                return Some(Received {
                    body: d.data.clone(),
                    routing_key: d.routing_key.as_str().to_owned(),
                    message_id: p.message_id().as_ref().map(|s| s.as_str().to_owned()),
                    delivery_mode: *p.delivery_mode(),
                    content_type: p.content_type().as_ref().map(|s| s.as_str().to_owned()),
                    app_id: p.app_id().as_ref().map(|s| s.as_str().to_owned()),
                    timestamp: *p.timestamp(),
                    headers: p
                        .headers()
                        .as_ref()
                        .map(|t| {
                            t.inner()
                                .iter()
                                .map(|(k, v)| (k.as_str().to_owned(), v.clone()))
                                .collect()
                        })
                        .unwrap_or_default(),
                });
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every message up to (not including) the one whose `message_id` is `sentinel`. A
    /// sentinel sent after the others got their 200 arrives after them, so this sees all
    /// of them without guessing how long to wait.
    pub async fn until(&self, sentinel: &str) -> Vec<Received> {
        self.until_within(sentinel, BROKER_TIMEOUT).await
    }

    /// [`Self::until`], waiting up to `patience` for each message (a drain after a
    /// reconnect can take longer than one [`BROKER_TIMEOUT`] to start).
    pub async fn until_within(&self, sentinel: &str, patience: Duration) -> Vec<Received> {
        let mut out = Vec::new();
        loop {
            let m = self.next(patience).await.unwrap_or_else(|| {
                panic!(
                    "sentinel {sentinel} never arrived; got {} messages before",
                    out.len()
                )
            });
            if m.message_id.as_deref() == Some(sentinel) {
                return out;
            }
            out.push(m);
        }
    }

    /// Messages ready in the queue (a passive declare on the owning connection).
    pub async fn message_count(&self) -> u32 {
        tokio::time::timeout(
            BROKER_TIMEOUT,
            self.channel.queue_declare(
                ShortString::from(self.queue.as_str()),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            ),
        )
        .await
        .expect("passive declare timed out")
        .expect("passive declare")
        .message_count()
    }

    /// Removes the exchange (the queue goes with the connection).
    pub async fn delete(&self) {
        let _ = tokio::time::timeout(
            BROKER_TIMEOUT,
            self.channel.exchange_delete(
                ShortString::from(self.exchange.as_str()),
                ExchangeDeleteOptions::default(),
            ),
        )
        .await;
        self.deleted.store(true, Ordering::SeqCst);
    }
}

impl Drop for Broker {
    /// A test that panicked never reached [`Broker::delete`]: delete its durable exchange
    /// here, on a thread with a runtime of its own (drop cannot await, and the test's
    /// runtime may be the one unwinding).
    fn drop(&mut self) {
        if self.deleted.load(Ordering::SeqCst) {
            return;
        }
        let exchange = self.exchange.clone();
        let cleanup = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let connect = Connection::connect(AMQP_URL, ConnectionProperties::default());
                let Ok(Ok(connection)) = tokio::time::timeout(BROKER_TIMEOUT, connect).await else {
                    return;
                };
                if let Ok(Ok(channel)) =
                    tokio::time::timeout(BROKER_TIMEOUT, connection.create_channel()).await
                {
                    let _ = tokio::time::timeout(
                        BROKER_TIMEOUT,
                        channel.exchange_delete(
                            ShortString::from(exchange.as_str()),
                            ExchangeDeleteOptions::default(),
                        ),
                    )
                    .await;
                }
                let _ = connection.close(0, "test cleanup".into()).await;
            });
        });
        let _ = cleanup.join();
    }
}
