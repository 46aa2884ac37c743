//! Test parts for the spool's unit and model tests: a spool on the simulated disk, and a
//! broker stand-in that acknowledges or refuses each publish as the test says.

use std::sync::{Arc, Mutex, PoisonError};

use crate::config;
use crate::metrics::Metrics;
use crate::outbox::message::Message;
use crate::outbox::publish::PublishError;

use crate::store::Store;
use disk_seam::sim::SimDisk;

use super::drain::Sink;
use super::Spool;

/// How the stand-in answers a publish.
pub(super) type Answerer = dyn Fn(&Message<'_>) -> Result<(), PublishError> + Send + Sync;

/// A broker stand-in: answers through `answer`, and records the ids it acknowledged.
#[derive(Clone)]
pub(super) struct TestSink {
    answer: Arc<Answerer>,
    acked: Arc<Mutex<Vec<String>>>,
}

impl TestSink {
    pub(super) fn new(
        answer: impl Fn(&Message<'_>) -> Result<(), PublishError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            answer: Arc::new(answer),
            acked: Arc::default(),
        }
    }

    /// A broker that acknowledges everything.
    pub(super) fn acking() -> Self {
        Self::new(|_| Ok(()))
    }

    /// The ids acknowledged, in order, duplicates included.
    pub(super) fn acked(&self) -> Vec<String> {
        self.acked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Sink for TestSink {
    fn is_connected(&self) -> bool {
        true
    }

    async fn wait_connected(&self) {}

    fn publish<'a>(
        &'a self,
        _exchange: &'a str,
        msg: &'a Message<'a>,
    ) -> impl std::future::Future<Output = Result<(), PublishError>> + Send + 'a {
        let result = (self.answer)(msg);
        if result.is_ok() {
            self.acked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(msg.message_id.to_string());
        }
        std::future::ready(result)
    }
}

/// The spool's config in these tests: enabled, 64 MiB.
pub(super) fn cfg() -> config::SpoolConfig {
    config::SpoolConfig {
        enabled: true,
        max_bytes: 64 << 20,
        ..config::SpoolConfig::default()
    }
}

/// Opens a spool on `disk` as a process starting on it would.
pub(super) fn open_on(disk: &SimDisk) -> Result<Spool, crate::store::StoreError> {
    let store = Store::open_on(disk.handle(), std::path::Path::new("/store"), 1 << 20)?;
    Spool::open(&store, &cfg(), Arc::new(Metrics::new()))
}

/// A power cut: the spool's process is gone, and the disk keeps what was synced and, as
/// its seed says, a torn prefix of the rest. Returns the disk and the spool reopened.
pub(super) fn power_cut(disk: &SimDisk, spool: Spool) -> (SimDisk, Spool) {
    let next = disk.crash();
    drop(spool);
    let spool = open_on(&next).expect("reopen after the power cut");
    (next, spool)
}

/// A process restart that is no power cut: the page cache stays, so the next process
/// reads what was written, synced or not. Returns the disk and the spool reopened.
pub(super) fn restart(disk: &SimDisk, spool: Spool) -> (SimDisk, Spool) {
    let next = disk.restart();
    drop(spool);
    let spool = open_on(&next).expect("reopen after the restart");
    (next, spool)
}

/// A message with event id `id` and guard key `key`.
pub(super) fn event(id: &str, key: Option<&str>) -> Message<'static> {
    Message {
        routing_key: "k".into(),
        message_id: id.to_owned().into(),
        timestamp_secs: 100,
        request_id: format!("r-{id}").into(),
        event_type: "t".into(),
        attempt: None,
        route: "botix".into(),
        received_at: "2026-11-29T10:00:00Z".into(),
        order_key: key.map(|k| k.to_owned().into()),
        body: bytes::Bytes::from(format!("{{\"id\":\"{id}\"}}")),
        content_type: None,
        traceparent: None,
        tracestate: None,
    }
}
