//! Which lines are written: `RUST_LOG` or the config's `log.level`, as a layer that the
//! config can change once it is read, and that leaves spans alone unless its directives
//! name spans.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Dispatch, Event, Metadata};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::{reload, EnvFilter, Registry};

use hookgate::pipeline::log_scope;

/// lapin logs a returned message with its whole body at WARN; a body must never reach a log,
/// and hookgate reports unroutable messages itself.
const QUIET_LAPIN: &str = "lapin::returned_messages=off";

/// The log filter, set once the config is read. `RUST_LOG`, when set, wins over both the
/// first `info` and the config's `log.level`.
pub struct LogLevel {
    handle: reload::Handle<EnvFilter, Registry>,
    spans_matter: Arc<AtomicBool>,
}

impl LogLevel {
    pub fn set(&self, level: &str) {
        if let Some(spans_matter) = self.apply(&directives(level)) {
            log_scope::make_spans_up_front(spans_matter);
        }
    }

    /// Sets the filter of `directives`; whether they name spans, if it was set.
    fn apply(&self, directives: &str) -> Option<bool> {
        let (filter, spans_matter) = parsed(directives);
        match self.handle.reload(filter) {
            Ok(()) => {
                self.spans_matter.store(spans_matter, Ordering::Release);
                Some(spans_matter)
            }
            Err(error) => {
                tracing::warn!(%error, "cannot apply log.level");
                None
            }
        }
    }
}

/// The filter layer, starting at `info`, and the handle that changes its level.
pub fn log_filter() -> (LogFilter, LogLevel) {
    let (filter, level) = log_filter_of(&directives("info"));
    log_scope::make_spans_up_front(level.spans_matter.load(Ordering::Acquire));
    (filter, level)
}

fn log_filter_of(directives: &str) -> (LogFilter, LogLevel) {
    let (filter, spans_matter) = parsed(directives);
    let (layer, handle) = reload::Layer::new(filter);
    let spans_matter = Arc::new(AtomicBool::new(spans_matter));
    let level = LogLevel {
        handle,
        spans_matter: spans_matter.clone(),
    };
    (
        LogFilter {
            inner: layer,
            spans_matter,
        },
        level,
    )
}

/// `RUST_LOG` if set, else `level`.
fn directives(level: &str) -> String {
    std::env::var("RUST_LOG").unwrap_or_else(|_| level.to_owned())
}

/// The filter of `directives` (`info` if they do not parse), and whether they name spans:
/// only such directives (`target[span{field=value}]=level`) make a line's level depend on
/// the spans it is in, and they all hold a `[`.
fn parsed(directives: &str) -> (EnvFilter, bool) {
    match EnvFilter::try_new(format!("{directives},{QUIET_LAPIN}")) {
        Ok(filter) => (filter, directives.contains('[')),
        Err(_) => (EnvFilter::new(format!("info,{QUIET_LAPIN}")), false),
    }
}

/// The filter as a layer that is told of spans being made, entered, left and closed only
/// while its directives name spans. `EnvFilter` keeps no state for a span otherwise, yet
/// each of these calls would take two read locks that every runtime worker shares (the
/// reload handle's and the filter's map of spans), and a delivery's span is entered and
/// left at every poll. A change of level replaces the whole filter, so one made with span
/// directives starts with no spans to forget.
pub struct LogFilter {
    inner: reload::Layer<EnvFilter, Registry>,
    spans_matter: Arc<AtomicBool>,
}

impl LogFilter {
    fn spans_matter(&self) -> bool {
        self.spans_matter.load(Ordering::Acquire)
    }
}

impl Layer<Registry> for LogFilter {
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        self.inner.on_register_dispatch(subscriber);
    }
    fn on_layer(&mut self, subscriber: &mut Registry) {
        self.inner.on_layer(subscriber);
    }
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        self.inner.register_callsite(metadata)
    }
    fn enabled(&self, metadata: &Metadata<'_>, ctx: Context<'_, Registry>) -> bool {
        self.inner.enabled(metadata, ctx)
    }
    fn event_enabled(&self, event: &Event<'_>, ctx: Context<'_, Registry>) -> bool {
        self.inner.event_enabled(event, ctx)
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        self.inner.max_level_hint()
    }
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, Registry>) {
        self.inner.on_event(event, ctx);
    }

    // The span calls, forwarded only while the directives name spans.
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, Registry>) {
        if self.spans_matter() {
            self.inner.on_new_span(attrs, id, ctx);
        }
    }
    fn on_record(&self, span: &Id, values: &Record<'_>, ctx: Context<'_, Registry>) {
        if self.spans_matter() {
            self.inner.on_record(span, values, ctx);
        }
    }
    fn on_follows_from(&self, span: &Id, follows: &Id, ctx: Context<'_, Registry>) {
        if self.spans_matter() {
            self.inner.on_follows_from(span, follows, ctx);
        }
    }
    fn on_enter(&self, id: &Id, ctx: Context<'_, Registry>) {
        if self.spans_matter() {
            self.inner.on_enter(id, ctx);
        }
    }
    fn on_exit(&self, id: &Id, ctx: Context<'_, Registry>) {
        if self.spans_matter() {
            self.inner.on_exit(id, ctx);
        }
    }
    fn on_close(&self, id: Id, ctx: Context<'_, Registry>) {
        if self.spans_matter() {
            self.inner.on_close(id, ctx);
        }
    }
    fn on_id_change(&self, old: &Id, new: &Id, ctx: Context<'_, Registry>) {
        if self.spans_matter() {
            self.inner.on_id_change(old, new, ctx);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// The targets of the lines that get through, in order.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> Layer<S> for Seen {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            if let Ok(mut seen) = self.0.lock() {
                seen.push(event.metadata().target().to_owned());
            }
        }
    }

    /// The lines `emit` writes under a filter of `directives`; `emit` may change them.
    fn written(directives: &str, emit: impl FnOnce(&LogLevel)) -> Vec<String> {
        let (filter, level) = log_filter_of(directives);
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry()
            .with(filter)
            .with(seen.clone());
        tracing::subscriber::with_default(subscriber, || emit(&level));
        let lines = seen.0.lock().map(|s| s.clone()).unwrap_or_default();
        lines
    }

    fn delivery() {
        tracing::debug!(target: "outside", "a debug line outside any span");
        let span = tracing::info_span!("delivery", trace_id = "0af7651916cd43dd8448eb211c80319c");
        let _in_span = span.enter();
        tracing::debug!(target: "inside", "a debug line within a delivery");
        tracing::info!(target: "info", "an info line");
    }

    #[test]
    fn levels_and_targets_filter_lines_with_spans_left_alone() {
        assert_eq!(written("info", |_| delivery()), ["info"]);
        assert_eq!(written("warn,outside=debug", |_| delivery()), ["outside"]);
    }

    #[test]
    fn directives_that_name_a_span_see_the_spans_entered() {
        let expected = ["inside", "info"];
        assert_eq!(written("info,[delivery]=debug", |_| delivery()), expected);
        // Set later, as the config's `log.level` is.
        let later = written("info", |level| {
            level.apply("info,[delivery]=debug");
            delivery();
        });
        assert_eq!(later, expected);
    }
}
