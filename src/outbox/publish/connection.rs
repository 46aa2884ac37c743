//! The connection task: connect to the first broker node that answers, open the channels
//! and start one owner per channel, watch the connection (blocked, lost), and reconnect
//! with capped, jittered backoff.
//!
//! With several nodes (`amqp.urls`) a round tries each once, in list order; a round in
//! which none answered waits out the backoff before the next. The round after a lost
//! connection starts with the node after the lost one, so a node that is gone does not
//! cost a connect timeout before the others are tried. Publishes whose confirms were
//! outstanding on the lost connection fail (their events are spooled, or answered 503):
//! a confirm is never assumed, and a new connection cannot deliver an old one's.

use std::sync::Arc;
use std::time::Duration;

use backoff::Doubling;
use futures_util::StreamExt;
use lapin::options::{QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ConnectionProperties, Event};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::exchange::declare_exchange;
use super::job::Job;
use super::link::Link;
use super::live::Live;
use super::nodes::BrokerNode;
use super::owner;
use super::properties::{short, short_constant};
use crate::config::{Amqp, QueueKind};

/// Confirm-mode channels per connection, each with its owner task. An owner publishes a
/// batch and waits for all of its confirms before the next, so while one waits the others
/// take what has queued meanwhile: enough of them keep the broker busy, few enough that
/// batches stay large (BENCHMARKS.md has the measurement).
const CHANNELS: usize = 4;
/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// How long one connection attempt may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Keeps a connection up until `stop` is cancelled.
pub(super) async fn run(link: Arc<Link>, stop: CancellationToken) {
    let nodes = &link.nodes;
    let mut backoff = Doubling::new(BACKOFF_MIN, BACKOFF_MAX);
    // Which nodes have had their warning in this outage.
    let mut warned = vec![false; nodes.len()];
    let mut first = 0;
    loop {
        let Some((node, attempt)) = connect_round(&link, first, &mut warned, &stop).await else {
            if stop.is_cancelled() {
                return;
            }
            let wait = jitter(backoff.next_pause());
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            continue;
        };
        let (live, channels, jobs) = attempt;
        let mut events = live.connection().events_listener();
        let live = Arc::new(live);
        let jobs = Arc::new(tokio::sync::Mutex::new(jobs));
        for channel in channels {
            tokio::spawn(owner::run(
                link.clone(),
                live.clone(),
                jobs.clone(),
                channel,
            ));
        }
        drop(jobs);
        link.replace(Some(live.clone()));
        link.connected.notify_waiters();
        tracing::info!(url = %nodes.shown(node), node, nodes = nodes.len(), "broker connected");
        backoff.reset();
        warned.fill(false);
        watch(&link, &live, &mut events, &stop).await;
        link.clear_if(&live);
        // Owners end and the queue goes; the close itself need not hold up a reconnect.
        tokio::spawn(async move { live.close(short_constant("reconnecting")).await });
        if stop.is_cancelled() {
            return;
        }
        first = (node + 1) % nodes.len();
        // A short pause even so: a node that drops every connection at once is not
        // hammered.
        let wait = jitter(BACKOFF_MIN);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// A connection's parts: the connection, its channels, and its queue of publishes.
type Attempt = (Live, Vec<Channel>, mpsc::UnboundedReceiver<Job>);

/// Tries each node once, in order from `first`: the first that answers, with its
/// position, or `None` when none did (or `stop`).
async fn connect_round(
    link: &Link,
    first: usize,
    warned: &mut [bool],
    stop: &CancellationToken,
) -> Option<(usize, Attempt)> {
    let nodes = &link.nodes;
    for (node, broker) in nodes.round(first) {
        let attempt = tokio::select! {
            _ = stop.cancelled() => return None,
            r = tokio::time::timeout(CONNECT_TIMEOUT, connect(&link.config, node, broker, stop)) => r,
        };
        let error = match attempt {
            Ok(Ok(parts)) => return Some((node, parts)),
            Ok(Err(error)) => error.to_string(),
            Err(_) => "connect timed out".to_owned(),
        };
        report_unreachable(&mut warned[node], &broker.shown, node, nodes.len(), &error);
    }
    None
}

/// Watches `live` until it fails, is taken out of the slot, or `stop`; blocked and
/// unblocked only pause publishing.
async fn watch(
    link: &Link,
    live: &Arc<Live>,
    events: &mut (impl futures_util::Stream<Item = Event> + Unpin),
    stop: &CancellationToken,
) {
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            e = events.next() => e,
            // The event stream is quiet on some failures; the status is the truth.
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                if live.connection().status().connected() && link.holds(live) {
                    continue;
                }
                None
            }
        };
        match event {
            Some(Event::ConnectionBlocked(reason)) => {
                tracing::warn!(%reason, "broker blocked the connection; spooling");
                link.set_blocked(true);
            }
            Some(Event::ConnectionUnblocked) => {
                tracing::info!("broker unblocked the connection");
                link.set_blocked(false);
            }
            Some(Event::Error(error)) => {
                tracing::warn!(%error, "broker connection lost");
                return;
            }
            Some(_) => {}
            None => {
                tracing::warn!("broker connection lost");
                return;
            }
        }
    }
}

fn report_unreachable(warned: &mut bool, url: &str, node: usize, nodes: usize, error: &str) {
    // One warning per node and outage, not one per attempt: a laptop without a broker
    // should not drown its terminal.
    if *warned {
        tracing::debug!(%url, node, %error, "broker still unreachable");
    } else if nodes > 1 {
        tracing::warn!(%url, node, nodes, %error, "broker node unreachable; trying the next, and accepted events are spooled while none answers");
    } else {
        tracing::warn!(%url, %error, "broker unreachable; accepted events are spooled until it is back");
    }
    *warned = true;
}

fn jitter(base: Duration) -> Duration {
    // Full jitter between half and all of the step spreads reconnects of many replicas.
    let half = base / 2;
    half + half.mul_f64(rand::random::<f64>())
}

/// A new connection to `broker` (position `node`) with its channels (confirm mode) and the
/// receiving end of its queue.
async fn connect(
    config: &Amqp,
    node: usize,
    broker: &BrokerNode,
    stop: &CancellationToken,
) -> Result<Attempt, lapin::Error> {
    let props = ConnectionProperties::default().with_connection_name(LongString::from("hookgate"));
    let connection = Connection::connect_uri(broker.uri.clone(), props).await?;
    let (jobs, queue) = mpsc::unbounded_channel();
    let live = Live::new(connection, node, jobs, stop.child_token());
    let mut channels = Vec::with_capacity(CHANNELS);
    for _ in 0..CHANNELS {
        channels.push(live.open_channel().await?);
    }
    if config.declare {
        declare_exchange(&channels[0], short(&config.exchange).unwrap_or_default()).await?;
    }
    if let Some(declared) = &config.queue {
        // A queue that exists with other arguments (a classic one of the same name) fails
        // the declare, and the connection with it: the node's warning names the reason.
        let name = short(&declared.name).unwrap_or_default();
        let mut arguments = FieldTable::default();
        if declared.kind == QueueKind::Quorum {
            arguments.insert(
                short_constant("x-queue-type"),
                AMQPValue::LongString(LongString::from("quorum")),
            );
        }
        channels[0]
            .queue_declare(
                name.clone(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await?;
        channels[0]
            .queue_bind(
                name,
                short(&config.exchange).unwrap_or_default(),
                short(declared.binding.as_deref().unwrap_or("#")).unwrap_or_default(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    Ok((live, channels, queue))
}
