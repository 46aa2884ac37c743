//! The trace of the delivery a thread is running, for the log. Every line logged for a
//! delivery names its trace, yet most deliveries log nothing, and a span made for each
//! (formatted, entered and left at every poll, closed) cost about 4 % of a delivery's CPU
//! (BENCHMARKS.md). A delivery's future sets its trace here while it is polled, and the
//! log makes the delivery's span only for a line written meanwhile (`cli::logging`).
//!
//! A log filter whose directives name spans decides a line's level by the spans it is in,
//! so the span must exist before the line: while such a filter is set, deliveries make
//! their span up front, as [`tracing::Instrument`] would.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tracing::Span;

use crate::ingress::trace::TraceId;

/// The name and target of a delivery's span, made up front or for a line.
pub const DELIVERY_SPAN: &str = "delivery";
pub const DELIVERY_TARGET: &str = "hookgate::pipeline::delivery";

thread_local! {
    static CURRENT: Cell<Option<TraceId>> = const { Cell::new(None) };
}

static SPANS_UP_FRONT: AtomicBool = AtomicBool::new(false);

/// Whether deliveries made from now on make their span up front (see the module's doc).
pub fn make_spans_up_front(up_front: bool) {
    SPANS_UP_FRONT.store(up_front, Ordering::Relaxed);
}

/// The trace of the delivery being polled on this thread, unless it has its span already.
pub fn current() -> Option<TraceId> {
    CURRENT.with(Cell::get)
}

pin_project! {
    /// A delivery's future, polled in its trace's scope.
    pub struct InTrace<F> {
        #[pin]
        inner: F,
        scope: Scope,
    }
}

enum Scope {
    /// Set on the thread at each poll.
    Trace(TraceId),
    /// Entered at each poll.
    Span(Span),
}

impl<F> InTrace<F> {
    pub fn new(trace: TraceId, inner: F) -> Self {
        let scope = if SPANS_UP_FRONT.load(Ordering::Relaxed) {
            Scope::Span(tracing::info_span!(
                target: DELIVERY_TARGET,
                DELIVERY_SPAN,
                trace_id = trace.as_str()
            ))
        } else {
            Scope::Trace(trace)
        };
        Self { inner, scope }
    }
}

impl<F: Future> Future for InTrace<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        match this.scope {
            Scope::Trace(trace) => {
                let _set = SetTrace::new(*trace);
                this.inner.poll(cx)
            }
            Scope::Span(span) => {
                let _entered = span.enter();
                this.inner.poll(cx)
            }
        }
    }
}

/// The thread's trace while it lives; the one before it after, even when the poll panics.
struct SetTrace(Option<TraceId>);

impl SetTrace {
    fn new(trace: TraceId) -> Self {
        Self(CURRENT.with(|current| current.replace(Some(trace))))
    }
}

impl Drop for SetTrace {
    fn drop(&mut self) {
        CURRENT.with(|current| current.set(self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::trace::TraceContext;

    #[test]
    fn the_trace_is_set_only_while_its_future_is_polled() {
        let trace = TraceContext::new_root().trace_id();
        let seen = InTrace::new(trace, async { current() });
        assert_eq!(current(), None);
        let inside = futures_util::FutureExt::now_or_never(seen).flatten();
        assert_eq!(inside.as_ref().map(TraceId::as_str), Some(trace.as_str()));
        assert_eq!(current(), None);
    }
}
