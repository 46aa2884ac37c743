//! The drainer's supervision: a pass that panics is counted and started again after a
//! pause that doubles while passes keep failing. Each failure is pinned on the entry the
//! pass was working on; an entry failed on twice in a row is marked for the next pass to
//! park, so one bad entry cannot keep the drainer failing.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backoff::Doubling;
use tokio_util::sync::CancellationToken;

use crate::locks::lock;
use crate::sink::Sink;
use crate::spool::Spool;

/// Pause before the drainer is started again after a failure (doubling up to the max).
const RESTART_MIN: Duration = Duration::from_secs(1);
const RESTART_MAX: Duration = Duration::from_secs(30);

impl Spool {
    /// Runs the drainer until `stop`, supervised: a panic in it is logged at ERROR, reported
    /// ([`crate::Report::drainer_restarted`]), and the drainer starts again after a
    /// pause. An entry it failed on twice in a row is parked, so one bad entry cannot keep
    /// it failing.
    pub async fn run_drainer<S: Sink>(
        self: Arc<Self>,
        publisher: S,
        exchange: String,
        stop: CancellationToken,
    ) {
        let report = self.ledger.report().clone();
        let spool = self.clone();
        let pass_stop = stop.clone();
        supervise(
            || report.drainer_restarted(),
            &stop,
            RESTART_MIN,
            move || {
                spool
                    .clone()
                    .drain(publisher.clone(), exchange.clone(), pass_stop.clone())
            },
            || self.note_failure(),
        )
        .await;
    }

    /// Pins a drainer failure on the entry it was working on; the second failure in a row
    /// on the same entry marks it to be parked by the next pass. The guard keys held are
    /// counted again from disk: the failed pass may have marked keys for moves it never
    /// committed.
    pub(crate) fn note_failure(&self) {
        let current = lock(&self.in_progress).take();
        lock(&self.failed_on).note(current);
        if let Err(error) = self.recount_held_keys() {
            tracing::warn!(%error, "cannot count the held spool entries' guard keys");
        }
    }
}

/// Runs `pass` until it returns. A panic in it is logged at ERROR, counted by `restarted`,
/// reported to `failed`, and followed by a new pass after a pause that doubles (from
/// `first_pause` up to 30 s) while passes keep failing.
pub(crate) async fn supervise<F, Fut>(
    restarted: impl Fn(),
    stop: &CancellationToken,
    first_pause: Duration,
    mut pass: F,
    mut failed: impl FnMut(),
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut pause = Doubling::new(first_pause, RESTART_MAX);
    loop {
        let started = Instant::now();
        let error = match tokio::spawn(pass()).await {
            Ok(()) => return,
            Err(e) if e.is_cancelled() => return,
            Err(e) => e,
        };
        let panic = error.into_panic();
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        restarted();
        failed();
        if started.elapsed() > RESTART_MAX {
            pause.reset();
        }
        let restart_in = pause.next_pause();
        // Events keep being spooled but none is published until it runs again.
        tracing::error!(panic = %what, ?restart_in, "the spool drainer failed; restarting it");
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(restart_in) => {}
        }
    }
}
