//! The `hookgate` command: parse arguments, set up logging, load the config, run; the other
//! commands are in `cli/`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use hookgate::config::Config;

mod cli;

use cli::logging::{init_logging, LogFormat};
use cli::sign::{sign, SignError, SignRequest};
use cli::spool::{spool_command, SpoolCommand};

// An accepted event allocates and frees often: mimalloc spends less per call than glibc's
// allocator and keeps per-thread heaps. Without transparent huge pages (feature no_thp),
// so a growing heap does not make the kernel clear a fresh 2 MiB page each time.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code for a bad config or bad arguments (sysexits EX_USAGE); nothing was bound.
const EXIT_USAGE: u8 = 64;

#[derive(Parser)]
#[command(
    name = "hookgate",
    version,
    about = "Webhook receiver gateway: verify, dedup, guard, publish to RabbitMQ"
)]
struct Cli {
    /// Config file.
    #[arg(
        long,
        global = true,
        env = "HOOKGATE_CONFIG",
        default_value = "config/hookgate.yaml"
    )]
    config: PathBuf,
    /// Log format; `auto` is text on a terminal and JSON otherwise.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "HOOKGATE_LOG_FORMAT",
        default_value_t = LogFormat::Auto
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (the default).
    Run,
    /// Check the config as `run` does, short of opening the store and binding ports, and
    /// print it with secrets redacted. Exit codes as `run`.
    CheckConfig {
        /// Read no environment variable, secret file or TLS file (for CI on manifests).
        #[arg(long)]
        offline: bool,
    },
    /// Sign a body read from FILE or stdin as a sender of a profile would: botix prints the
    /// X-Botix-Signature value; every other profile prints `Name: value` header lines.
    Sign {
        /// Environment variable holding the secret (Telnyx: the base64 ed25519 private key).
        #[arg(long)]
        secret_env: String,
        /// The sender profile; ignored with --route.
        #[arg(long, value_enum, default_value_t = hookgate::config::Profile::Botix)]
        profile: hookgate::config::Profile,
        /// Sign for this route of the config: its profile, public_url and custom scheme.
        #[arg(long)]
        route: Option<String>,
        /// Twilio: the URL the sender requests, with its query (default: the route's public_url).
        #[arg(long)]
        url: Option<String>,
        /// Standard Webhooks: the webhook-id (default: a new msg_<uuid>).
        #[arg(long)]
        id: Option<String>,
        /// Standard Webhooks, Telnyx: the signed Unix time in seconds (default: now).
        #[arg(long)]
        timestamp: Option<i64>,
        /// Body file; stdin when absent.
        file: Option<PathBuf>,
    },
    /// Inspect the spool.
    Spool {
        #[command(subcommand)]
        command: SpoolCommand,
    },
    /// Reconciliation with the senders' list APIs, in the running gateway.
    Reconcile {
        #[command(subcommand)]
        command: cli::reconcile::ReconcileCommand,
    },
    /// What the state store knows about one event, request id, message or contact: asks
    /// the running gateway (admin API and token), or reads a stopped one's store.
    Inspect(cli::inspect::InspectArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command.as_ref().unwrap_or(&Command::Run) {
        Command::Sign {
            secret_env,
            profile,
            route,
            url,
            id,
            timestamp,
            file,
        } => {
            let request = SignRequest {
                profile: *profile,
                route: route.as_deref(),
                url: url.as_deref(),
                id: id.as_deref(),
                timestamp: *timestamp,
            };
            match sign(&cli.config, secret_env, &request, file.as_deref()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(SignError::Usage(e)) => finish(Err(e), EXIT_USAGE),
                Err(SignError::Io(e)) => finish(Err(e), 1),
            }
        }
        Command::CheckConfig { offline } => check_config(&cli.config, *offline),
        Command::Spool { command } => spool(&cli.config, command),
        Command::Reconcile { command } => reconcile(&cli.config, command),
        Command::Inspect(args) => inspect(&cli.config, args),
        Command::Run => run(&cli),
    }
}

/// `hookgate spool`: on the store the config names.
fn spool(config_path: &Path, command: &SpoolCommand) -> ExitCode {
    if let SpoolCommand::Delete { yes: false, .. } = command {
        eprintln!("error: deleting parked entries loses their events for good; add --yes to do it");
        return ExitCode::from(EXIT_USAGE);
    }
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {}", with_config_hint(config_path, &e.to_string()));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    finish(spool_command(&config, command), 1)
}

/// `hookgate reconcile`: through the admin listener the config names.
fn reconcile(config_path: &Path, command: &cli::reconcile::ReconcileCommand) -> ExitCode {
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // A replay the config already refuses (its route, its window) is a usage error.
    if let cli::reconcile::ReconcileCommand::Replay(args) = command {
        if let Err(e) = cli::replay::check(&config, args) {
            return finish(Err(e), EXIT_USAGE);
        }
    }
    finish(cli::reconcile::run(&config, command), 1)
}

/// `hookgate inspect`: a question the config refuses (its route, an id of the wrong shape)
/// is a usage error; a gateway or store that cannot answer is a failure.
fn inspect(config_path: &Path, args: &cli::inspect::InspectArgs) -> ExitCode {
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {}", with_config_hint(config_path, &e.to_string()));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let checked = match cli::inspect::check(&config, args) {
        Ok(checked) => checked,
        Err(e) => return finish(Err(e), EXIT_USAGE),
    };
    finish(cli::inspect::run(&config, args, &checked), 1)
}

fn check_config(path: &Path, offline: bool) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {}", with_config_hint(path, &e.to_string()));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    for deprecation in config.deprecations() {
        eprintln!("warning: {deprecation}");
    }
    let lookups = if offline {
        hookgate::app::Lookups::Offline
    } else {
        hookgate::app::Lookups::Resolve
    };
    match hookgate::app::check(config, lookups) {
        Ok(effective) => {
            print!("{}", effective.redacted_yaml());
            if offline {
                eprintln!(
                    "config {} is valid (offline: environment variables, secret files and TLS files not read)",
                    path.display()
                );
            } else {
                eprintln!("config {} is valid", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(if e.is_config() { EXIT_USAGE } else { 1 })
        }
    }
}

fn finish(result: anyhow::Result<()>, code: u8) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(code)
        }
    }
}

/// `hookgate run`: logging, the config, the runtime, the store; then the gateway until a
/// signal.
fn run(cli: &Cli) -> ExitCode {
    // Logging first, at `info` until the config names its level: a config that cannot be
    // read is logged in the format a log collector reads too.
    let level = init_logging(cli.log_format);
    let config = match Config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            let error = with_config_hint(&cli.config, &e.to_string());
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

/// `error` with a hint when the config file does not exist: the default path is relative
/// to the working directory, which outside the repository holds no `config/`.
fn with_config_hint(path: &Path, error: &str) -> String {
    if path.exists() {
        error.to_owned()
    } else {
        format!("{error} (give the config file with --config PATH or HOOKGATE_CONFIG)")
    }
}
