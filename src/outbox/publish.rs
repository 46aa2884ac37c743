//! The RabbitMQ side: one connection, confirm-mode channels, reconnect with backoff.
//!
//! A background task owns the connection. Publishers take the current channels from a
//! shared slot; while there is none they fail at once, so the caller can spool without
//! waiting for a reconnect.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties, Event, ExchangeKind};
use tokio_util::sync::CancellationToken;

use crate::config::{redact_url, Amqp};
use crate::metrics::Metrics;
use crate::outbox::message::{fitted_message_id, Message, EVENT_ID_HEADER, SOURCE_HEADER};

/// Confirm-mode channels per connection. One channel serialises frames on the broker side;
/// a few spread the confirm work without multiplying broker resources.
const CHANNELS: usize = 4;
/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Heartbeat interval asked for when the URL does not set one.
const DEFAULT_HEARTBEAT_SECS: u32 = 10;
/// How long one connection attempt may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the broker did not take a message. Every kind is retried later (spool or 503).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    #[error("broker not connected")]
    NotConnected,
    #[error("broker has blocked the connection")]
    Blocked,
    #[error("broker nacked the message")]
    Nack,
    #[error("message unroutable: no queue bound for routing key {0}")]
    Unroutable(String),
    /// A field of this message can never be sent: retrying cannot help.
    #[error("{0} does not fit an AMQP short string (255 bytes)")]
    Unfit(&'static str),
    #[error("no confirm within the timeout")]
    Timeout,
    #[error("channel error: {0}")]
    Channel(String),
}

struct Live {
    connection: Connection,
    channels: Vec<lapin::Channel>,
    next: AtomicUsize,
}

struct Inner {
    config: Amqp,
    live: RwLock<Option<Arc<Live>>>,
    blocked: AtomicBool,
    metrics: Arc<Metrics>,
    /// Woken when a connection comes up, so the spool drainer need not poll.
    connected: tokio::sync::Notify,
    /// Woken when the broker blocks the connection, so publishes waiting for a confirm
    /// give up at once instead of at `confirm_timeout`.
    became_blocked: tokio::sync::Notify,
}

/// A handle to the broker connection; cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

impl Publisher {
    /// Starts the connection task. A broker that is down is not an error: the task keeps
    /// trying with capped, jittered backoff until `stop` is cancelled.
    pub fn start(config: Amqp, metrics: Arc<Metrics>, stop: CancellationToken) -> Self {
        let inner = Arc::new(Inner {
            config,
            live: RwLock::new(None),
            blocked: AtomicBool::new(false),
            metrics,
            connected: tokio::sync::Notify::new(),
            became_blocked: tokio::sync::Notify::new(),
        });
        tokio::spawn(run_connection(inner.clone(), stop));
        Self { inner }
    }

    /// Whether a connection is up and not blocked.
    pub fn is_connected(&self) -> bool {
        self.current().is_some() && !self.inner.blocked.load(Ordering::Relaxed)
    }

    /// Waits until a connection is up (or returns at once if it is).
    pub async fn wait_connected(&self) {
        let notified = self.inner.connected.notified();
        if self.is_connected() {
            return;
        }
        notified.await;
    }

    /// Publishes and waits for the broker's confirm. Only a plain ack is success: a
    /// returned (unroutable) message is an error even though the broker acks it.
    pub async fn publish(&self, exchange: &str, msg: &Message<'_>) -> Result<(), PublishError> {
        self.publish_with(exchange, msg, true).await
    }

    /// Publishes an audit copy: not `mandatory`, so an audit key nobody binds is not an error.
    pub async fn publish_audit(
        &self,
        exchange: &str,
        msg: &Message<'_>,
    ) -> Result<(), PublishError> {
        self.publish_with(exchange, msg, false).await
    }

    async fn publish_with(
        &self,
        exchange: &str,
        msg: &Message<'_>,
        mandatory: bool,
    ) -> Result<(), PublishError> {
        // Registered before the flag is read, so a block that comes in between is not missed.
        let blocked = self.inner.became_blocked.notified();
        tokio::pin!(blocked);
        blocked.as_mut().enable();
        if self.inner.blocked.load(Ordering::Relaxed) {
            return Err(PublishError::Blocked);
        }
        // Built before taking a channel: a message that cannot be encoded fails the same way
        // whether or not the broker is there.
        let routing_key =
            short(msg.routing_key.as_ref()).ok_or(PublishError::Unfit("the routing key"))?;
        let properties = properties(msg)?;
        // The exchange name is checked when the config is loaded; should it not fit, every
        // message fails alike, which is a broker-side fault and not one to park them for.
        let exchange = short(exchange)
            .ok_or_else(|| PublishError::Channel("the exchange name is too long".into()))?;
        let live = self.current().ok_or(PublishError::NotConnected)?;
        let i = live.next.fetch_add(1, Ordering::Relaxed) % live.channels.len();
        let channel = &live.channels[i];
        let started = std::time::Instant::now();
        let attempt = async {
            let confirm = channel
                .basic_publish(
                    exchange,
                    routing_key,
                    BasicPublishOptions {
                        mandatory,
                        ..Default::default()
                    },
                    &msg.body,
                    properties,
                )
                .await
                .map_err(|e| PublishError::Channel(e.to_string()))?;
            confirm
                .await
                .map_err(|e| PublishError::Channel(e.to_string()))
        };
        // A blocked connection holds the message unconfirmed until the broker's alarm
        // clears: give up now (the caller spools it; the broker may still route the held
        // copy later, so it can arrive twice).
        let confirmed = tokio::select! {
            confirmed = tokio::time::timeout(self.inner.config.confirm_timeout, attempt) => confirmed,
            () = &mut blocked => Ok(Err(PublishError::Blocked)),
        };
        let result = match confirmed {
            Err(_) => Err(PublishError::Timeout),
            Ok(Err(e)) => Err(e),
            Ok(Ok(Confirmation::Ack(None))) => Ok(()),
            Ok(Ok(Confirmation::Ack(Some(_)))) => {
                Err(PublishError::Unroutable(msg.routing_key.to_string()))
            }
            Ok(Ok(Confirmation::Nack(_))) => Err(PublishError::Nack),
            Ok(Ok(Confirmation::NotRequested)) => {
                Err(PublishError::Channel("channel not in confirm mode".into()))
            }
        };
        self.inner
            .metrics
            .publish_duration
            .observe(started.elapsed().as_secs_f64());
        if let Err(PublishError::Channel(_)) = &result {
            // A channel error closes the channel; take the whole connection down so the
            // task rebuilds it instead of failing every fourth publish.
            self.inner.clear_if(&live);
        }
        result
    }

    /// Closes the connection cleanly (at shutdown).
    pub async fn close(&self) {
        if let Some(live) = self.inner.replace(None) {
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                live.connection.close(200, short_constant("shutdown")),
            )
            .await;
        }
    }

    fn current(&self) -> Option<Arc<Live>> {
        self.inner.current()
    }
}

impl Inner {
    /// The connection in the slot, if any.
    fn current(&self) -> Option<Arc<Live>> {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts `live` in the slot and returns what was there; the `broker_connected` gauge
    /// follows the slot, so it cannot disagree with it. A block belongs to the connection
    /// it was sent on, so it ends with it.
    fn replace(&self, live: Option<Arc<Live>>) -> Option<Arc<Live>> {
        let mut slot = self.live.write().unwrap_or_else(PoisonError::into_inner);
        self.metrics.broker_connected.set(i64::from(live.is_some()));
        self.set_blocked(false);
        std::mem::replace(&mut *slot, live)
    }

    /// Empties the slot only if it still holds `failed`: the connection task may already
    /// have put a new connection there.
    fn clear_if(&self, failed: &Arc<Live>) {
        let mut slot = self.live.write().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|l| Arc::ptr_eq(l, failed)) {
            *slot = None;
            self.metrics.broker_connected.set(0);
            self.set_blocked(false);
        }
    }

    /// Records whether the broker blocks publishing on the current connection.
    fn set_blocked(&self, blocked: bool) {
        self.blocked.store(blocked, Ordering::Relaxed);
        self.metrics.broker_blocked.set(i64::from(blocked));
        if blocked {
            self.became_blocked.notify_waiters();
        }
    }

    fn holds(&self, live: &Arc<Live>) -> bool {
        self.current().is_some_and(|l| Arc::ptr_eq(&l, live))
    }
}

/// A short string, or `None` when `text` is longer than AMQP allows (255 bytes).
fn short(text: &str) -> Option<ShortString> {
    ShortString::try_new(text).ok()
}

/// A short string from a constant of this module; the unit test `constants_fit` proves
/// each one fits, so the empty fallback is never sent.
fn short_constant(text: &'static str) -> ShortString {
    short(text).unwrap_or_default()
}

/// The properties and headers `msg` is published with (contract §5). Public so the load
/// tool's publish baseline sends messages of the same shape, and the broker does the same
/// work for both.
pub fn properties(msg: &Message<'_>) -> Result<BasicProperties, PublishError> {
    let mut headers = FieldTable::default();
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    headers.insert(short_constant("x-request-id"), text(&msg.request_id));
    headers.insert(short_constant("x-event-type"), text(&msg.event_type));
    if let Some(n) = msg.attempt {
        headers.insert(
            short_constant("x-delivery-attempt"),
            AMQPValue::LongLongInt(n),
        );
    }
    headers.insert(short_constant("x-route"), text(&msg.route));
    headers.insert(short_constant("x-received-at"), text(&msg.received_at));
    headers.insert(short_constant(SOURCE_HEADER), text(msg.source()));
    let message_id = match short(&msg.message_id) {
        Some(id) => id,
        None => {
            headers.insert(short_constant(EVENT_ID_HEADER), text(&msg.message_id));
            short(&fitted_message_id(&msg.message_id))
                .ok_or(PublishError::Unfit("the fitted message_id"))?
        }
    };
    Ok(BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type(
            msg.content_type
                .as_deref()
                .and_then(short)
                .unwrap_or_else(|| short_constant("application/json")),
        )
        .with_message_id(message_id)
        .with_timestamp(msg.timestamp_secs)
        .with_app_id(short_constant("hookgate"))
        .with_headers(headers))
}

async fn run_connection(inner: Arc<Inner>, stop: CancellationToken) {
    let mut backoff = BACKOFF_MIN;
    let mut warned = false;
    let url = redact_url(&inner.config.url);
    loop {
        let attempt = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(CONNECT_TIMEOUT, connect(&inner.config)) => r,
        };
        match attempt {
            Ok(Ok(live)) => {
                let mut events = live.connection.events_listener();
                let live = Arc::new(live);
                inner.replace(Some(live.clone()));
                inner.connected.notify_waiters();
                tracing::info!(url = %url, "broker connected");
                backoff = BACKOFF_MIN;
                warned = false;
                // Watch the connection until it fails; blocked/unblocked only pause publishing.
                loop {
                    let event = tokio::select! {
                        _ = stop.cancelled() => return,
                        e = events.next() => e,
                        // The event stream is quiet on some failures; the status is the truth.
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {
                            if live.connection.status().connected() && inner.holds(&live) {
                                continue;
                            }
                            None
                        }
                    };
                    match event {
                        Some(Event::ConnectionBlocked(reason)) => {
                            tracing::warn!(%reason, "broker blocked the connection; spooling");
                            inner.set_blocked(true);
                        }
                        Some(Event::ConnectionUnblocked) => {
                            tracing::info!("broker unblocked the connection");
                            inner.set_blocked(false);
                        }
                        Some(Event::Error(error)) => {
                            tracing::warn!(%error, "broker connection lost");
                            break;
                        }
                        Some(_) => {}
                        None => {
                            tracing::warn!("broker connection lost");
                            break;
                        }
                    }
                }
                inner.replace(None);
            }
            Ok(Err(error)) => {
                report_unreachable(&mut warned, &url, &error.to_string());
            }
            Err(_) => report_unreachable(&mut warned, &url, "connect timed out"),
        }
        let wait = jitter(backoff);
        backoff = (backoff * 2).min(BACKOFF_MAX);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

fn report_unreachable(warned: &mut bool, url: &str, error: &str) {
    // One warning per outage, not one per attempt: a laptop without a broker should not
    // drown its terminal.
    if *warned {
        tracing::debug!(%url, %error, "broker still unreachable");
    } else {
        tracing::warn!(%url, %error, "broker unreachable; accepted events are spooled until it is back");
        *warned = true;
    }
}

fn jitter(base: Duration) -> Duration {
    // Full jitter between half and all of the step spreads reconnects of many replicas.
    let half = base / 2;
    half + half.mul_f64(rand::random::<f64>())
}

/// Adds a 10 s heartbeat unless the URL sets one. The broker's default (60 s) would take
/// about two minutes to notice a black-holed link; until then every confirm times out.
fn with_heartbeat(url: &str) -> String {
    if url.contains("heartbeat=") {
        return url.to_owned();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}heartbeat={DEFAULT_HEARTBEAT_SECS}")
}

async fn connect(config: &Amqp) -> Result<Live, lapin::Error> {
    let props = ConnectionProperties::default().with_connection_name(LongString::from("hookgate"));
    let connection = Connection::connect(&with_heartbeat(&config.url), props).await?;
    let mut channels = Vec::with_capacity(CHANNELS);
    for _ in 0..CHANNELS {
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        channels.push(channel);
    }
    if config.declare {
        channels[0]
            .exchange_declare(
                short(&config.exchange).unwrap_or_default(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
    }
    Ok(Live {
        connection,
        channels,
        next: AtomicUsize::new(0),
    })
}

/// Checks that `url` is an AMQP URL a connection can be made from, without connecting.
/// The reason never holds the password.
pub fn check_url(url: &str) -> Result<(), String> {
    url.parse::<lapin::uri::AMQPUri>()
        .map(|_| ())
        .map_err(|reason| reason.replace(url, &redact_url(url)))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn message(id: &str, routing_key: &str) -> Message<'static> {
        Message {
            routing_key: routing_key.to_owned().into(),
            message_id: id.to_owned().into(),
            timestamp_secs: 1,
            request_id: "r".into(),
            event_type: "t".into(),
            attempt: None,
            route: "botix".into(),
            received_at: String::new(),
            order_key: None,
            body: Bytes::new(),
            content_type: None,
        }
    }

    #[test]
    fn constants_fit() {
        for c in [
            "x-request-id",
            "x-event-type",
            "x-delivery-attempt",
            "x-route",
            "x-received-at",
            EVENT_ID_HEADER,
            "application/json",
            "hookgate",
            "shutdown",
        ] {
            assert!(short(c).is_some(), "{c}");
        }
    }

    #[test]
    fn an_id_that_fits_is_the_message_id_and_a_longer_one_is_fitted_stably() {
        let p = properties(&message(&"a".repeat(255), "k")).expect("fits");
        assert_eq!(p.message_id().as_ref().map(|s| s.as_str().len()), Some(255));
        let headers = p.headers().clone().unwrap_or_default();
        assert!(!headers.inner().contains_key(EVENT_ID_HEADER));

        // Multi-byte characters across the cut must not split.
        let long = format!("{}{}", "é".repeat(100), "x".repeat(200));
        let p = properties(&message(&long, "k")).expect("fitted");
        let id = p.message_id().clone().expect("message_id");
        assert!(id.as_str().len() <= 255, "{}", id.as_str().len());
        assert!(id.as_str().starts_with(&"é".repeat(64)), "{}", id.as_str());
        assert_eq!(id.as_str(), fitted_message_id(&long), "stable");
        assert_ne!(
            fitted_message_id(&long),
            fitted_message_id(&format!("{long}y"))
        );
        let headers = p.headers().clone().unwrap_or_default();
        assert_eq!(
            headers.inner().get(EVENT_ID_HEADER),
            Some(&AMQPValue::LongString(LongString::from(long.as_str())))
        );
        // The largest id hookgate takes fits too.
        assert!(fitted_message_id(&"z".repeat(100_000)).len() <= 255);
    }

    #[test]
    fn a_routing_key_that_does_not_fit_is_unfit_not_a_panic() {
        // The config's limit is the client library's.
        use crate::config::{fits_short_string, AMQP_SHORT_STRING_MAX};
        assert_eq!(AMQP_SHORT_STRING_MAX, lapin::types::MAX_SHORT_STRING_LENGTH);
        assert!(fits_short_string(&"k".repeat(255)));
        assert!(!fits_short_string(&"k".repeat(256)));
        assert!(short(&"k".repeat(256)).is_none());
    }

    #[test]
    fn heartbeat_is_added_only_when_missing() {
        assert_eq!(with_heartbeat("amqp://h/%2f"), "amqp://h/%2f?heartbeat=10");
        assert_eq!(
            with_heartbeat("amqp://h/%2f?frame_max=8192"),
            "amqp://h/%2f?frame_max=8192&heartbeat=10"
        );
        assert_eq!(
            with_heartbeat("amqp://h/%2f?heartbeat=2"),
            "amqp://h/%2f?heartbeat=2"
        );
    }
}
