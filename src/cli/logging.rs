//! Logging to stderr, in text or JSON, at a level the config can change once it is read.

use std::io::IsTerminal;

use clap::ValueEnum;

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Auto,
    Text,
    Json,
}

/// lapin logs a returned message with its whole body at WARN; a body must never reach a log,
/// and hookgate reports unroutable messages itself.
const QUIET_LAPIN: &str = "lapin::returned_messages=off";

/// The log filter, set once the config is read. `RUST_LOG`, when set, wins over both the
/// first `info` and the config's `log.level`.
pub struct LogLevel(
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>,
);

impl LogLevel {
    pub fn set(&self, level: &str) {
        if let Err(error) = self.0.reload(filter(level)) {
            tracing::warn!(%error, "cannot apply log.level");
        }
    }
}

fn filter(level: &str) -> tracing_subscriber::EnvFilter {
    let directives = std::env::var("RUST_LOG").unwrap_or_else(|_| level.to_owned());
    tracing_subscriber::EnvFilter::try_new(format!("{directives},{QUIET_LAPIN}"))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("info,{QUIET_LAPIN}")))
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
    let (level, handle) = tracing_subscriber::reload::Layer::new(filter("info"));
    let json_layer = json.then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_writer(std::io::stderr)
    });
    let text_layer = (!json).then(|| {
        tracing_subscriber::fmt::layer()
            .with_ansi(terminal)
            .with_writer(std::io::stderr)
    });
    tracing_subscriber::registry()
        .with(level)
        .with(json_layer)
        .with(text_layer)
        .init();
    LogLevel(handle)
}
