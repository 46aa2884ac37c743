//! Logging to stderr, in text or JSON, at a level the config can change once it is read;
//! a library's lines at the level their meaning has for an operator.

use std::io::IsTerminal;
use std::sync::OnceLock;

use clap::ValueEnum;
use tracing::callsite::DefaultCallsite;
use tracing::field::{Field, Value, Visit};
use tracing::metadata::Kind;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Dispatch, Event, Level, Metadata, Subscriber};
use tracing_core::dispatcher::WeakDispatch;
use tracing_subscriber::fmt::{self, MakeWriter};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use hookgate::ingress::trace::TraceId;
use hookgate::pipeline::log_scope;

use super::log_filter::{log_filter, LogLevel};
use super::span_fields::JsonSpanFields;

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Auto,
    Text,
    Json,
}

/// Logs to stderr: JSON when asked or when stderr is no terminal; text otherwise, with
/// colour only on a terminal, so a file or a pipe never gets escape codes.
pub fn init_logging(format: LogFormat) -> LogLevel {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let terminal = std::io::stderr().is_terminal();
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !terminal,
    };
    let (filter, level) = log_filter();
    tracing_subscriber::registry()
        .with(filter)
        .with(output(json, terminal, std::io::stderr))
        .init();
    level
}

type BoxedLayer<S> = Box<dyn Layer<S> + Send + Sync>;

/// The layer that writes the log (`Output`), in JSON or text.
fn output<S, W>(json: bool, ansi: bool, writer: W) -> BoxedLayer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let format = if json {
        fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .fmt_fields(JsonSpanFields)
            .with_writer(writer)
            .boxed()
    } else {
        fmt::layer().with_ansi(ansi).with_writer(writer).boxed()
    };
    Output {
        format,
        dispatch: OnceLock::new(),
    }
    .boxed()
}

/// Writes every event as it is, but lapin's ERROR lines, which go out at WARN: lapin logs
/// at ERROR what an operator meets at every broker restart (`Socket was readable but we
/// read 0…`, `error doing IO`, `Connection error`), while hookgate reports the lost
/// connection itself at WARN and reconnects, and ERROR is for data at risk or an operator
/// who must act (docs/operations.md). One layer, not a filtered one beside a second: a
/// per-layer filter looks the span up at every enter and exit.
///
/// A line written while a delivery is polled without a span of its own is written in the
/// delivery's span, made for it ([`log_scope`]).
struct Output<S> {
    format: BoxedLayer<S>,
    /// The subscriber this layer is part of, which makes a delivery's span: the macros
    /// make nothing while a line is being written.
    dispatch: OnceLock<WeakDispatch>,
}

fn is_lapin_error(meta: &Metadata<'_>) -> bool {
    *meta.level() == Level::ERROR
        && (meta.target() == "lapin" || meta.target().starts_with("lapin::"))
}

static DELIVERY_CALLSITE: DefaultCallsite = DefaultCallsite::new(&DELIVERY);
static DELIVERY: Metadata<'static> = tracing_core::metadata! {
    name: log_scope::DELIVERY_SPAN,
    target: log_scope::DELIVERY_TARGET,
    level: Level::INFO,
    fields: &["trace_id"],
    callsite: &DELIVERY_CALLSITE,
    kind: Kind::SPAN,
};

/// A delivery's span, made and entered for one line, left and closed after it.
struct LineSpan {
    dispatch: Dispatch,
    id: Id,
}

impl LineSpan {
    fn enter(dispatch: Dispatch, trace: TraceId) -> Option<Self> {
        let field = DELIVERY.fields().field("trace_id")?;
        let trace_id = trace.as_str();
        let values: [(&Field, Option<&dyn Value>); 1] = [(&field, Some(&trace_id as &dyn Value))];
        let id = dispatch.new_span(&Attributes::new(
            &DELIVERY,
            &DELIVERY.fields().value_set(&values),
        ));
        dispatch.enter(&id);
        Some(Self { dispatch, id })
    }
}

impl Drop for LineSpan {
    fn drop(&mut self) {
        self.dispatch.exit(&self.id);
        self.dispatch.try_close(self.id.clone());
    }
}

static LAPIN_WARN_CALLSITE: DefaultCallsite = DefaultCallsite::new(&LAPIN_WARN);
static LAPIN_WARN: Metadata<'static> = tracing_core::metadata! {
    name: "lapin",
    target: "lapin",
    level: Level::WARN,
    fields: &["message", "fields"],
    callsite: &LAPIN_WARN_CALLSITE,
    kind: Kind::EVENT,
};

impl<S: Subscriber> Output<S> {
    fn write(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if !is_lapin_error(event.metadata()) {
            return self.format.on_event(event, ctx);
        }
        let mut text = EventText::default();
        event.record(&mut text);
        let names = LAPIN_WARN.fields();
        let (Some(message), Some(fields)) = (names.field("message"), names.field("fields")) else {
            return;
        };
        let fields_text = tracing::field::display(&text.fields);
        let values: [(&Field, Option<&dyn Value>); 2] = [
            (&message, Some(&text.message as &dyn Value)),
            (
                &fields,
                (!text.fields.is_empty()).then_some(&fields_text as &dyn Value),
            ),
        ];
        self.format
            .on_event(&Event::new(&LAPIN_WARN, &names.value_set(&values)), ctx);
    }
}

impl<S: Subscriber> Layer<S> for Output<S> {
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let delivery = log_scope::current()
            .zip(self.dispatch.get().and_then(WeakDispatch::upgrade))
            .and_then(|(trace, dispatch)| LineSpan::enter(dispatch, trace));
        self.write(event, ctx);
        drop(delivery);
    }

    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        // A weak handle: the subscriber owns this layer.
        let _ = self.dispatch.set(subscriber.downgrade());
        self.format.on_register_dispatch(subscriber);
    }

    // Everything else goes to the writing layer as it is.
    fn on_layer(&mut self, subscriber: &mut S) {
        self.format.on_layer(subscriber);
    }
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        self.format.register_callsite(metadata)
    }
    fn enabled(&self, metadata: &Metadata<'_>, ctx: Context<'_, S>) -> bool {
        self.format.enabled(metadata, ctx)
    }
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        self.format.on_new_span(attrs, id, ctx);
    }
    fn on_record(&self, span: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        self.format.on_record(span, values, ctx);
    }
    fn on_follows_from(&self, span: &Id, follows: &Id, ctx: Context<'_, S>) {
        self.format.on_follows_from(span, follows, ctx);
    }
    fn event_enabled(&self, event: &Event<'_>, ctx: Context<'_, S>) -> bool {
        self.format.event_enabled(event, ctx)
    }
    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        self.format.on_enter(id, ctx);
    }
    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        self.format.on_exit(id, ctx);
    }
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        self.format.on_close(id, ctx);
    }
    fn on_id_change(&self, old: &Id, new: &Id, ctx: Context<'_, S>) {
        self.format.on_id_change(old, new, ctx);
    }
}

/// An event's message, and its other fields as `name=value` pairs.
#[derive(Default)]
struct EventText {
    message: String,
    fields: String,
}

impl Visit for EventText {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let gap = if self.fields.is_empty() { "" } else { " " };
            let _ = write!(self.fields, "{gap}{}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'w self) -> Buffer {
            self.clone()
        }
    }

    /// The lines written while `emit` runs under the gateway's output layers.
    fn lines(json: bool, emit: impl FnOnce()) -> Vec<String> {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::registry().with(output(json, false, buffer.clone()));
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = buffer.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn lapin_disconnect() {
        // What lapin's I/O loop logs when the broker goes away.
        tracing::error!(target: "lapin::io_loop", error = ?"connection reset", "error doing IO");
        tracing::error!(target: "lapin::io_loop", "Socket was readable but we read 0.");
        tracing::warn!(target: "lapin::channel", "a warning stays a warning");
        tracing::error!(target: "lapinator", "another crate's error stays an error");
        tracing::error!(target: "hookgate::outbox", "hookgate's own error stays an error");
    }

    #[test]
    fn lapin_errors_are_written_at_warn_with_their_message_and_fields_and_others_stay() {
        let text = lines(false, lapin_disconnect);
        assert_eq!(text.len(), 5, "{text:#?}");
        assert!(
            text[0].contains("WARN") && text[0].contains("error doing IO"),
            "{}",
            text[0]
        );
        assert!(
            text[0].contains(r#"error="connection reset""#),
            "{}",
            text[0]
        );
        assert!(
            text[1].contains("WARN") && text[1].contains("read 0"),
            "{}",
            text[1]
        );
        assert!(text[2].contains("WARN") && text[2].contains("stays a warning"));
        assert!(text[3].contains("ERROR") && text[3].contains("lapinator"));
        assert!(text[4].contains("ERROR") && text[4].contains("hookgate::outbox"));
        assert!(
            text.iter().take(3).all(|l| !l.contains("ERROR")),
            "{text:#?}"
        );
    }

    #[test]
    fn in_json_a_lapin_error_is_a_warn_line_of_target_lapin() {
        let json = lines(true, lapin_disconnect);
        assert_eq!(json.len(), 5, "{json:#?}");
        let first: serde_json::Value = serde_json::from_str(&json[0]).unwrap_or_default();
        assert_eq!(first["level"], "WARN", "{}", json[0]);
        assert_eq!(first["target"], "lapin", "{}", json[0]);
        assert_eq!(first["message"], "error doing IO", "{}", json[0]);
        let last: serde_json::Value = serde_json::from_str(&json[4]).unwrap_or_default();
        assert_eq!(last["level"], "ERROR", "{}", json[4]);
    }

    #[test]
    fn in_json_a_line_lists_its_spans_with_their_fields_recorded_early_or_late() {
        let json = lines(true, || {
            let span = tracing::info_span!(
                "delivery",
                trace_id = "0af7651916cd43dd8448eb211c80319c",
                quoted = "a \"b\"\n",
                count = 3u64,
                later = tracing::field::Empty,
            );
            span.record("later", true);
            let _in_span = span.enter();
            tracing::info!("inside");
        });
        assert_eq!(json.len(), 1, "{json:#?}");
        let line: serde_json::Value = serde_json::from_str(&json[0]).unwrap_or_default();
        assert_eq!(
            line["spans"],
            serde_json::json!([{
                "name": "delivery",
                "trace_id": "0af7651916cd43dd8448eb211c80319c",
                "quoted": "a \"b\"\n",
                "count": 3,
                "later": true,
            }]),
            "{}",
            json[0]
        );
    }

    /// Counts the spans made.
    struct CountSpans(Arc<std::sync::atomic::AtomicUsize>);

    impl<S: Subscriber> Layer<S> for CountSpans {
        fn on_new_span(&self, _: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn a_delivery_makes_its_span_only_for_a_line_which_names_its_trace() {
        use futures_util::FutureExt;
        use hookgate::ingress::trace::TraceContext;
        use hookgate::pipeline::log_scope::InTrace;

        let trace = TraceContext::new_root().trace_id();
        let spans = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let made = || spans.load(std::sync::atomic::Ordering::SeqCst);
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::registry()
            .with(output(true, false, buffer.clone()))
            .with(CountSpans(spans.clone()));
        tracing::subscriber::with_default(subscriber, || {
            assert!(InTrace::new(trace, async {}).now_or_never().is_some());
            assert_eq!(made(), 0, "a delivery that writes nothing makes no span");
            let loud = InTrace::new(trace, async {
                tracing::warn!(target: "hookgate::pipeline", "inside");
            });
            assert!(loud.now_or_never().is_some());
            assert_eq!(made(), 1, "one span, for the line");
            tracing::warn!("outside");
        });
        let bytes = buffer.0.lock().map(|b| b.clone()).unwrap_or_default();
        let json: Vec<serde_json::Value> = String::from_utf8_lossy(&bytes)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_default())
            .collect();
        assert_eq!(json.len(), 2, "{json:#?}");
        assert_eq!(
            json[0]["spans"],
            serde_json::json!([{"name": "delivery", "trace_id": trace.as_str()}]),
            "{}",
            json[0]
        );
        assert_eq!(json[0]["message"], "inside");
        assert!(
            json[1]
                .get("spans")
                .is_none_or(|s| s == &serde_json::json!([])),
            "{}",
            json[1]
        );
    }
}
