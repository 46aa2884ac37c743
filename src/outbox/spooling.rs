//! The gateway's side of the durable spool (the `durable-spool` crate): its options from
//! the config, its counts as metrics, the publisher as its drainer's sink, a message as the
//! spool keeps it, and the `Retry-After` of a refused push.

use std::sync::Arc;

use durable_spool::{Counts, Report, Sink, SinkError, SpooledMessage, Store};

use crate::config::SpoolConfig;
use crate::metrics::Metrics;
use crate::outbox::publish::{PublishError, Publisher};
use crate::store_error::{StoreError, RETRY_AFTER_FAULT_SECS, RETRY_AFTER_TRANSIENT_SECS};

pub use durable_spool::{ParkedEntry, Spool, SpoolError, SpoolStatus, FLUSH_TIMEOUT};

/// `Retry-After` of a delivery refused because the spool is full: the broker has been away
/// a while and will not be back in seconds.
pub const RETRY_AFTER_FULL_SECS: u64 = 60;

/// Opens the spool in `store` with the config's settings, its counts mirrored into
/// `metrics`.
pub fn open(store: &Store, cfg: &SpoolConfig, metrics: Arc<Metrics>) -> Result<Spool, StoreError> {
    let options = durable_spool::Options {
        enabled: cfg.enabled,
        max_bytes: cfg.max_bytes,
        stall_after: cfg.stall_after,
    };
    Ok(Spool::open(
        store,
        &options,
        Arc::new(SpoolMetrics(metrics)),
    )?)
}

/// Seconds a sender should wait before retrying a delivery that met `error`.
pub fn retry_after_secs(error: &SpoolError) -> u64 {
    match error {
        SpoolError::Full { .. } => RETRY_AFTER_FULL_SECS,
        SpoolError::Store(e) if !e.is_transient() => RETRY_AFTER_FAULT_SECS,
        _ => RETRY_AFTER_TRANSIENT_SECS,
    }
}

/// The spool's drainer publishes through the gateway's publisher.
impl Sink for Publisher {
    fn is_connected(&self) -> bool {
        Publisher::is_connected(self)
    }

    fn wait_connected(&self) -> impl std::future::Future<Output = ()> + Send {
        Publisher::wait_connected(self)
    }

    async fn publish<'a>(
        &'a self,
        exchange: &'a str,
        msg: &'a SpooledMessage<'a>,
    ) -> Result<(), SinkError> {
        Publisher::publish(self, exchange, msg)
            .await
            .map_err(sink_error)
    }
}

/// What the drainer does with a failed publish.
fn sink_error(error: PublishError) -> SinkError {
    match error {
        PublishError::NotConnected | PublishError::Blocked => SinkError::Away(error.to_string()),
        PublishError::Unroutable(key) => SinkError::Unroutable(key),
        PublishError::Unfit(_) => SinkError::Unfit(error.to_string()),
        PublishError::Nack | PublishError::Timeout | PublishError::Channel(_) => {
            SinkError::Refused(error.to_string())
        }
    }
}

/// The spool's counts as the `hookgate_spool_*` metrics.
struct SpoolMetrics(Arc<Metrics>);

impl Report for SpoolMetrics {
    fn counts(&self, counts: Counts) {
        let m = &self.0;
        m.spool_depth.set(counts.depth as i64);
        m.spool_bytes.set(counts.bytes as i64);
        m.spool_held.set(counts.held as i64);
        m.spool_parked.set(counts.parked as i64);
    }

    fn drainer_restarted(&self) {
        self.0.spool_drainer_restarts.inc();
    }
}
