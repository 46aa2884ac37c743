//! `hookgate run`, the default command: logging, the config, the runtime, the store; then
//! the gateway until a signal, and a graceful shutdown.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use hookgate::config::Config;

use crate::cli::exit::{with_config_hint, EXIT_USAGE};
use crate::cli::logging::{init_logging, LogFormat};

/// `hookgate run`: logging, the config, the runtime, the store; then the gateway until a
/// signal.
pub fn command(config_path: &Path, log_format: LogFormat) -> ExitCode {
    // Logging first, at `info` until the config names its level: a config that cannot be
    // read is logged in the format a log collector reads too.
    let level = init_logging(log_format);
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            let error = with_config_hint(config_path, &e.to_string());
            tracing::error!(%error, "invalid config");
            eprintln!("error: {error}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    for deprecation in config.deprecations() {
        tracing::warn!(%deprecation, "config value under a former name");
    }
    level.set(&config.log.level);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // SIGHUP's default action ends the process; take it over before the (possibly slow)
    // store opening, so a rotation signal sent during start-up is not fatal.
    runtime.block_on(hookgate::shutdown::claim_sighup());
    let prepared = match hookgate::app::prepare(config.clone()) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            eprintln!("error: {e}");
            return ExitCode::from(if e.is_config() { EXIT_USAGE } else { 1 });
        }
    };
    match runtime.block_on(serve(prepared, &config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "gateway failed");
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Binds the listeners and serves until a signal, then shuts down gracefully.
async fn serve(prepared: hookgate::app::Prepared, config: &Config) -> anyhow::Result<()> {
    // Before the ports are bound: a SIGTERM from the moment a probe can see the gateway
    // starts a graceful shutdown, never the default action that kills the process.
    let signals = hookgate::shutdown::Signals::install();
    let webhooks = tokio::net::TcpListener::bind(config.listen.addr)
        .await
        .with_context(|| format!("cannot bind listen.addr {}", config.listen.addr))?;
    let admin = tokio::net::TcpListener::bind(config.admin.addr)
        .await
        .with_context(|| format!("cannot bind admin.addr {}", config.admin.addr))?;
    let listeners = hookgate::app::Listeners { webhooks, admin };
    hookgate::app::serve(
        prepared,
        listeners,
        first_signal(signals),
        hookgate::app::Options::default(),
    )
    .await?;
    Ok(())
}

/// Ends at the first signal. A second signal means "now": skip the drain, and exit as a
/// process killed by that signal would (128 + its number), so a supervisor sees it was not
/// clean.
async fn first_signal(mut signals: hookgate::shutdown::Signals) {
    signals.next().await;
    tokio::spawn(async move {
        let second = signals.next().await;
        eprintln!("second signal: exiting at once");
        std::process::exit(i32::from(second.exit_code()));
    });
}
