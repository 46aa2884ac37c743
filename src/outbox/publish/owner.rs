//! A channel's owner: the one task that publishes on its channel. It takes a batch of
//! queued publishes, sends them in order, waits until the broker has confirmed every one,
//! pairs each returned message with its publish by the `x-publish-id` header, and only
//! then answers each caller.
//!
//! Why this is exact with lapin 4: a `basic.return` carries no delivery tag; lapin queues
//! it on the channel and hands it to whichever confirm completes next, with acks of
//! `multiple` completed in hash order. So the return inside a confirm says nothing about
//! whose it is. But the broker sends a message's return before its ack, so once every
//! publish on the channel is confirmed, every return of them has been handed to one of
//! those confirms: gathering the returns of the whole batch and matching them by header
//! finds each. Acks and nacks themselves are exact per tag, because only this task
//! publishes on the channel, so tags reach the wire in the order lapin assigns them.
//! A channel whose confirms did not all come (timeout, blocked, error) is closed and
//! replaced: a confirm left pending there would take a later batch's return.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lapin::options::BasicPublishOptions;
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation};
use tokio::sync::futures::Notified;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::job::{Job, Jobs};
use super::link::Link;
use super::live::Live;
use super::properties::{publish_id, short_constant};
use super::publish_error::PublishError;

/// Most publishes one batch takes from the queue. Large enough that a few owners keep up
/// with hundreds of concurrent requests; a bound, so one batch's confirms come back soon.
const MAX_BATCH: usize = 128;
/// How long opening a replacement channel may take before the connection is given up.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an owner whose channel went while the broker blocks the connection checks
/// whether the block has ended (a channel cannot be opened before).
const BLOCKED_POLL: Duration = Duration::from_millis(200);

/// A publish sent and not yet answered.
struct Sent {
    id: u64,
    routing_key: ShortString,
    answer: oneshot::Sender<Result<(), PublishError>>,
}

/// Whether the channel can take the next batch.
enum Health {
    Healthy,
    /// Its confirms did not all come, or it failed: close it and open another.
    Replace,
}

/// Publishes on `channel` until `live` is left; replaces the channel when a batch leaves
/// it in doubt.
pub(super) async fn run(link: Arc<Link>, live: Arc<Live>, jobs: Jobs, mut channel: Channel) {
    loop {
        let batch = tokio::select! {
            () = live.gone().cancelled() => return,
            batch = take_batch(&jobs) => batch,
        };
        if batch.is_empty() {
            return;
        }
        match publish_batch(&link, &live, &channel, batch).await {
            Health::Healthy => {}
            Health::Replace => {
                retire(channel);
                match reopen(&link, &live).await {
                    Some(fresh) => channel = fresh,
                    None => {
                        // The connection cannot give a channel: have it replaced whole.
                        link.clear_if(&live);
                        return;
                    }
                }
            }
        }
    }
}

/// Waits for one job, then takes what else is queued, up to [`MAX_BATCH`]. Empty when the
/// queue is closed.
async fn take_batch(jobs: &Jobs) -> Vec<Job> {
    let mut queue = jobs.lock().await;
    let Some(first) = queue.recv().await else {
        return Vec::new();
    };
    let mut batch = Vec::with_capacity(queue.len().min(MAX_BATCH - 1) + 1);
    batch.push(first);
    while batch.len() < MAX_BATCH {
        match queue.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
    batch
}

/// Sends `batch` in order, waits for every confirm, pairs the returns, answers each job.
async fn publish_batch(link: &Link, live: &Live, channel: &Channel, batch: Vec<Job>) -> Health {
    // Registered before the flag is read, so a block that comes in between is not missed.
    let blocked = link.became_blocked.notified();
    tokio::pin!(blocked);
    blocked.as_mut().enable();
    let Outgoing {
        sent,
        heads,
        bodies,
    } = outgoing(link, batch);
    if sent.is_empty() {
        return Health::Healthy;
    }
    match confirm_all(link, live, channel, heads, &bodies, blocked).await {
        Ok(confirmations) => answer_all(link, sent, confirmations),
        Err(error) => {
            fail_all(sent, error);
            Health::Replace
        }
    }
}

/// What a publish goes out with, but its body.
type Head = (
    ShortString,
    ShortString,
    BasicPublishOptions,
    BasicProperties,
);

/// The publishes of a batch to send, in order: who waits for each, and its frames.
struct Outgoing {
    sent: Vec<Sent>,
    heads: Vec<Head>,
    bodies: Vec<Bytes>,
}

/// The jobs of `batch` to send. A job whose caller is gone is dropped; one the broker's
/// block or its deadline refuses is answered so at once.
fn outgoing(link: &Link, batch: Vec<Job>) -> Outgoing {
    let now = Instant::now();
    let mut out = Outgoing {
        sent: Vec::with_capacity(batch.len()),
        heads: Vec::with_capacity(batch.len()),
        bodies: Vec::with_capacity(batch.len()),
    };
    for job in batch {
        let Job {
            id,
            exchange,
            routing_key,
            mandatory,
            body,
            properties,
            deadline,
            answer,
        } = job;
        if answer.is_closed() {
            // The caller is gone (its request was dropped): nobody would learn the outcome.
            continue;
        }
        let refused = if link.is_blocked() {
            Some(PublishError::Blocked)
        } else if now >= deadline {
            Some(PublishError::Timeout)
        } else {
            None
        };
        if let Some(error) = refused {
            let _ = answer.send(Err(error));
            continue;
        }
        let options = BasicPublishOptions {
            mandatory,
            ..Default::default()
        };
        out.sent.push(Sent {
            id,
            routing_key: routing_key.clone(),
            answer,
        });
        out.heads.push((exchange, routing_key, options, properties));
        out.bodies.push(body);
    }
    out
}

/// Sends the publishes on `channel` and waits for every confirm, in send order; an error
/// when not all were decided within the confirm timeout, or the broker blocked the
/// connection, or it was left.
async fn confirm_all(
    link: &Link,
    live: &Live,
    channel: &Channel,
    heads: Vec<Head>,
    bodies: &[Bytes],
    blocked: Pin<&mut Notified<'_>>,
) -> Result<Vec<Result<Confirmation, lapin::Error>>, PublishError> {
    let decided = async {
        // All sent at once, so lapin writes them in a few socket writes. The first poll of
        // each publish takes its delivery tag and queues its frames in one step, and no
        // other task publishes on this channel, so tags reach the wire in order whatever
        // order the publishes are polled in.
        let sends = heads
            .into_iter()
            .zip(bodies)
            .map(|((e, r, o, p), b)| channel.basic_publish(e, r, o, b, p));
        let confirms = futures_util::future::join_all(sends).await;
        let waits = confirms.into_iter().map(|confirm| async move {
            match confirm {
                Ok(confirm) => confirm.await,
                Err(error) => Err(error),
            }
        });
        futures_util::future::join_all(waits).await
    };
    let timeout = link.config.confirm_timeout;
    tokio::select! {
        all = tokio::time::timeout(timeout, decided) => all.map_err(|_| PublishError::Timeout),
        () = blocked => Err(PublishError::Blocked),
        () = live.gone().cancelled() => Err(PublishError::NotConnected),
    }
}

/// Not all of the batch was decided: none of it may be answered as published, and the
/// channel keeps pending confirms that would take later returns.
fn fail_all(sent: Vec<Sent>, error: PublishError) {
    if matches!(error, PublishError::Timeout) {
        tracing::warn!(
            publishes = sent.len(),
            "confirms timed out; replacing the channel"
        );
    }
    for s in sent {
        let _ = s.answer.send(Err(error.clone()));
    }
}

/// Answers each sent publish with its outcome; the channel is replaced when one failed on
/// it.
fn answer_all(
    link: &Link,
    sent: Vec<Sent>,
    confirmations: Vec<Result<Confirmation, lapin::Error>>,
) -> Health {
    let results = pair(link, &sent, confirmations);
    let health = if results
        .iter()
        .any(|r| matches!(r, Err(PublishError::Channel(_))))
    {
        Health::Replace
    } else {
        Health::Healthy
    };
    for (s, result) in sent.into_iter().zip(results) {
        let _ = s.answer.send(result);
    }
    health
}

/// Each sent publish's outcome from the batch's confirmations (in send order): a nack or a
/// failed confirm is its own; a return is matched to its publish by header, whichever
/// confirm carried it.
fn pair(
    link: &Link,
    sent: &[Sent],
    confirmations: Vec<Result<Confirmation, lapin::Error>>,
) -> Vec<Result<(), PublishError>> {
    let position: HashMap<u64, usize> = sent.iter().enumerate().map(|(i, s)| (s.id, i)).collect();
    let mut results: Vec<Result<(), PublishError>> = Vec::with_capacity(sent.len());
    let mut returned = vec![false; sent.len()];
    for confirmation in confirmations {
        let (result, carried) = match confirmation {
            Ok(Confirmation::Ack(carried)) => (Ok(()), carried),
            Ok(Confirmation::Nack(carried)) => (Err(PublishError::Nack), carried),
            Ok(Confirmation::NotRequested) => (
                Err(PublishError::Channel("channel not in confirm mode".into())),
                None,
            ),
            Err(error) => (Err(PublishError::Channel(error.to_string())), None),
        };
        results.push(result);
        let Some(message) = carried else { continue };
        let id = publish_id(&message.delivery.properties);
        match id.and_then(|id| position.get(&id)) {
            Some(&i) => returned[i] = true,
            None => {
                // No publish of this batch sent it: the pairing is broken, and some earlier
                // publish may have been answered as published though it was returned.
                link.metrics.publish_unpaired_returns.inc();
                tracing::error!(
                    publish_id = ?id,
                    routing_key = %message.delivery.routing_key,
                    reply_code = message.reply_code,
                    "returned message matches no publish in flight; an unroutable event may have been answered as published"
                );
            }
        }
    }
    for (i, result) in results.iter_mut().enumerate() {
        if returned[i] && result.is_ok() {
            *result = Err(PublishError::Unroutable(sent[i].routing_key.to_string()));
        }
    }
    results
}

/// Closes a channel left in doubt, in the background: on a dead link the close itself
/// would wait.
fn retire(channel: Channel) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(OPEN_TIMEOUT, channel.close(200, short_constant("replaced")))
            .await;
    });
}

/// A fresh channel on `live`, once the broker no longer blocks it; `None` when the
/// connection cannot give one.
async fn reopen(link: &Link, live: &Live) -> Option<Channel> {
    while link.is_blocked() {
        tokio::select! {
            () = live.gone().cancelled() => return None,
            () = tokio::time::sleep(BLOCKED_POLL) => {}
        }
    }
    let opened = tokio::select! {
        () = live.gone().cancelled() => return None,
        opened = tokio::time::timeout(OPEN_TIMEOUT, live.open_channel()) => opened,
    };
    match opened {
        Ok(Ok(channel)) => Some(channel),
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot open a channel; reconnecting");
            None
        }
        Err(_) => {
            tracing::warn!("opening a channel timed out; reconnecting");
            None
        }
    }
}
