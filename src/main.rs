//! The `hookgate` command: parse arguments, set up logging, load the config, run.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use hookgate::config::{Config, Encoding, Profile};

mod cli;

// glibc's malloc and free were a large share of an accepted event's CPU under load;
// mimalloc spends less per call and keeps per-thread heaps.
// Built without transparent huge pages (feature no_thp): the kernel cleared a fresh 2 MiB
// page whenever the heap grew, about 3 % of the CPU under load, and RSS grew in 2 MiB steps.
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

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Auto,
    Text,
    Json,
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
        #[arg(long, value_enum, default_value_t = SignProfile::Botix)]
        profile: SignProfile,
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
}

/// The profiles `sign` knows without a config (`custom` needs its route's scheme: --route).
#[derive(Clone, Copy, ValueEnum)]
enum SignProfile {
    Botix,
    StandardWebhooks,
    Twilio,
    Telnyx,
}

#[derive(Subcommand)]
enum SpoolCommand {
    /// Depth, bytes, the oldest entry's age, held and parked entries, drainer stalled.
    Status,
    /// List the parked entries (those that cannot be published as they are).
    Parked,
    /// Put parked entries back at the tail of the spool, to be published again.
    Republish {
        /// Ids as `hookgate spool parked` lists them.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<u64>,
        /// Every parked entry.
        #[arg(long)]
        all: bool,
    },
    /// Delete parked entries for good (their events are lost): needs --yes.
    Delete {
        /// Ids as `hookgate spool parked` lists them.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<u64>,
        /// Every parked entry.
        #[arg(long)]
        all: bool,
        /// Confirms that the events of these entries are to be lost.
        #[arg(long)]
        yes: bool,
    },
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
        Command::Spool { command } => {
            if let SpoolCommand::Delete { yes: false, .. } = command {
                eprintln!("error: deleting parked entries loses their events for good; add --yes to do it");
                return ExitCode::from(EXIT_USAGE);
            }
            let config = match Config::load(&cli.config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {}", with_config_hint(&cli.config, &e.to_string()));
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            finish(spool_command(&config, command), 1)
        }
        Command::Reconcile { command } => {
            let config = match Config::load(&cli.config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            finish(cli::reconcile::run(&config, command), 1)
        }
        Command::Run => run(&cli),
    }
}

fn check_config(path: &Path, offline: bool) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {}", with_config_hint(path, &e.to_string()));
            return ExitCode::from(EXIT_USAGE);
        }
    };
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
    let result: anyhow::Result<()> = runtime.block_on(async {
        // Before the ports are bound: a SIGTERM from the moment a probe can see the gateway
        // starts a graceful shutdown, never the default action that kills the process.
        let mut signals = hookgate::shutdown::Signals::install();
        let webhooks = tokio::net::TcpListener::bind(config.listen.addr)
            .await
            .with_context(|| format!("cannot bind listen.addr {}", config.listen.addr))?;
        let admin = tokio::net::TcpListener::bind(config.admin.addr)
            .await
            .with_context(|| format!("cannot bind admin.addr {}", config.admin.addr))?;
        let shutdown = async move {
            signals.next().await;
            // A second signal means "now": skip the drain, and exit as a process killed by
            // that signal would (128 + its number), so a supervisor sees it was not clean.
            tokio::spawn(async move {
                let second = signals.next().await;
                eprintln!("second signal: exiting at once");
                std::process::exit(i32::from(second.exit_code()));
            });
        };
        let listeners = hookgate::app::Listeners { webhooks, admin };
        hookgate::app::serve(
            prepared,
            listeners,
            shutdown,
            hookgate::app::Options::default(),
        )
        .await?;
        Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "gateway failed");
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// lapin logs a returned message with its whole body at WARN; a body must never reach a log,
/// and hookgate reports unroutable messages itself.
const QUIET_LAPIN: &str = "lapin::returned_messages=off";

/// The log filter, set once the config is read. `RUST_LOG`, when set, wins over both the
/// first `info` and the config's `log.level`.
struct LogLevel(
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>,
);

impl LogLevel {
    fn set(&self, level: &str) {
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
fn init_logging(format: LogFormat) -> LogLevel {
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

/// `error` with a hint when the config file does not exist: the default path is relative
/// to the working directory, which outside the repository holds no `config/`.
fn with_config_hint(path: &Path, error: &str) -> String {
    if path.exists() {
        error.to_owned()
    } else {
        format!("{error} (give the config file with --config PATH or HOOKGATE_CONFIG)")
    }
}

/// What `sign` was asked for, apart from the secret and the body.
struct SignRequest<'a> {
    profile: SignProfile,
    route: Option<&'a str>,
    url: Option<&'a str>,
    id: Option<&'a str>,
    timestamp: Option<i64>,
}

/// Why `sign` failed, which decides its exit code as for `run`.
enum SignError {
    /// Arguments, the config, the secret or what the profile needs: exit 64.
    Usage(anyhow::Error),
    /// Reading the body or writing the headers: exit 1.
    Io(anyhow::Error),
}

impl From<anyhow::Error> for SignError {
    fn from(e: anyhow::Error) -> Self {
        SignError::Usage(e)
    }
}

fn sign(
    config_path: &Path,
    secret_env: &str,
    request: &SignRequest<'_>,
    file: Option<&Path>,
) -> Result<(), SignError> {
    let secret = std::env::var(secret_env)
        .ok()
        .filter(|s| !s.is_empty())
        .with_context(|| format!("environment variable {secret_env} is not set or empty"))?;
    let route = match request.route {
        Some(name) => {
            let config = Config::load(config_path).map_err(anyhow::Error::from)?;
            let route = config
                .routes
                .into_iter()
                .find(|r| r.name == name)
                .with_context(|| format!("no route named {name} in {}", config_path.display()))?;
            Some(route)
        }
        None => None,
    };
    let profile = match (&route, request.profile) {
        (Some(route), _) => route.profile,
        (None, SignProfile::Botix) => Profile::Botix,
        (None, SignProfile::StandardWebhooks) => Profile::StandardWebhooks,
        (None, SignProfile::Twilio) => Profile::Twilio,
        (None, SignProfile::Telnyx) => Profile::Telnyx,
    };
    let mut body = Vec::new();
    match file {
        Some(path) => {
            body = std::fs::read(path)
                .with_context(|| format!("cannot read {}", path.display()))
                .map_err(SignError::Io)?;
        }
        None => {
            std::io::stdin()
                .read_to_end(&mut body)
                .context("cannot read stdin")
                .map_err(SignError::Io)?;
        }
    }
    let secret = secret.as_bytes();
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
    };
    use hookgate::ingress::signature as sig;
    let headers = match profile {
        Profile::Botix => sig::botix_header(secret, &body),
        Profile::StandardWebhooks => {
            let id = request.id.map_or_else(
                || format!("msg_{}", uuid::Uuid::new_v4().simple()),
                str::to_owned,
            );
            let ts = request.timestamp.unwrap_or_else(now);
            let signature = sig::standard_webhooks_signature(secret, &id, ts, &body)
                .context("the secret is not whsec_ followed by base64")?;
            format!("webhook-id: {id}\nwebhook-timestamp: {ts}\nwebhook-signature: {signature}")
        }
        Profile::Twilio => {
            let url = request
                .url
                .or_else(|| route.as_ref().and_then(|r| r.public_url.as_deref()))
                .context("profile twilio signs a URL: give --url (with the query Twilio sends)")?;
            format!(
                "X-Twilio-Signature: {}",
                sig::twilio_signature(secret, url, &body)
            )
        }
        Profile::Telnyx => {
            let ts = request.timestamp.unwrap_or_else(now);
            let (signature, public) = sig::telnyx_signature(secret, ts, &body)
                .context("the key is not the base64 of a 32-byte ed25519 private key (seed)")?;
            eprintln!("public key (the route's secret): {public}");
            format!("telnyx-timestamp: {ts}\ntelnyx-signature-ed25519: {signature}")
        }
        Profile::Custom => {
            let scheme = route.as_ref().and_then(|r| r.signature.as_ref()).context(
                "profile custom: give --route, whose signature section says how to sign",
            )?;
            let mac = sig::hmac_parts(secret, &[&body]);
            let encoded = match scheme.encoding {
                Encoding::Hex => hex::encode(mac),
                Encoding::Base64 => {
                    use base64::Engine;
                    base64::engine::general_purpose::STANDARD.encode(mac)
                }
            };
            let prefix = scheme.prefix.as_deref().unwrap_or_default();
            format!("{}: {prefix}{encoded}", scheme.header)
        }
    };
    // A closed stdout is an I/O failure (exit 1), where the print macro would panic.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{headers}")
        .and_then(|()| stdout.flush())
        .context("cannot write to stdout")
        .map_err(SignError::Io)?;
    Ok(())
}

/// Where `hookgate spool` finds the spool: the running gateway (which holds the store's
/// lock) through its admin endpoint, or else the store itself.
enum SpoolAccess {
    Gateway(std::net::SocketAddr),
    Store(Box<hookgate::outbox::spool::Spool>, hookgate::store::Store),
}

fn spool_access(config: &Config) -> anyhow::Result<SpoolAccess> {
    let addr = cli::admin::address(config);
    let admin_error = match cli::admin::request(addr, "GET", hookgate::http::admin::SPOOL_PATH) {
        Ok(_) => return Ok(SpoolAccess::Gateway(addr)),
        Err(e) => e,
    };
    hookgate::tls::install_crypto_provider();
    let store = hookgate::store::Store::open_with_cache(&config.store.path, config.store.cache).with_context(|| {
        format!("no gateway answered on the admin address {addr} ({admin_error}), and the store cannot be opened")
    })?;
    let metrics = std::sync::Arc::new(hookgate::metrics::Metrics::new());
    let spool = hookgate::outbox::spool::Spool::open(&store, &config.spool, metrics)?;
    Ok(SpoolAccess::Store(Box::new(spool), store))
}

/// Which spool the command read: the gateway's admin address, or the store itself, and the
/// store's path, so a reader sees which gateway (which config) answered.
fn source_lines(config: &Config, access: &SpoolAccess) -> String {
    let gateway = match access {
        SpoolAccess::Gateway(addr) => format!("admin {addr} (the running gateway)"),
        SpoolAccess::Store(..) => format!(
            "none answered on admin {}; the store was read directly",
            cli::admin::address(config)
        ),
    };
    format!("gateway: {gateway}\nstore: {}", config.store.path.display())
}

fn spool_command(config: &Config, command: &SpoolCommand) -> anyhow::Result<()> {
    let access = spool_access(config)?;
    let source = source_lines(config, &access);
    match command {
        // The status names its source on stdout, next to the figures it explains; the
        // other commands keep stdout to their listing and name it on stderr.
        SpoolCommand::Status => {
            println!("{source}");
            print_status(&access)
        }
        _ => {
            eprintln!("{source}");
            spool_change_or_list(config, &access, command)
        }
    }
}

fn spool_change_or_list(
    config: &Config,
    access: &SpoolAccess,
    command: &SpoolCommand,
) -> anyhow::Result<()> {
    match command {
        SpoolCommand::Status => print_status(access),
        SpoolCommand::Parked => {
            let entries = parked_entries(access)?;
            if entries.is_empty() {
                println!("no parked entries");
            }
            for e in entries {
                let parked_at =
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(e.parked_at_secs);
                println!(
                    "{}\tparked {}\tevent {}\troute {}\trouting key {}\t{} bytes\t{}",
                    e.id,
                    humantime::format_rfc3339_seconds(parked_at),
                    e.event_id.as_deref().unwrap_or("?"),
                    e.route.as_deref().unwrap_or("?"),
                    e.routing_key.as_deref().unwrap_or("?"),
                    e.bytes,
                    e.reason
                );
            }
            Ok(())
        }
        SpoolCommand::Republish { ids, all } => change_parked(config, access, ids, *all, true),
        SpoolCommand::Delete { ids, all, .. } => change_parked(config, access, ids, *all, false),
    }
}

fn print_status(access: &SpoolAccess) -> anyhow::Result<()> {
    let status: hookgate::outbox::spool::SpoolStatus = match access {
        SpoolAccess::Gateway(addr) => {
            let body = cli::admin::ok(*addr, "GET", hookgate::http::admin::SPOOL_PATH)?;
            serde_json::from_str(&body).context("unexpected answer from the admin endpoint")?
        }
        SpoolAccess::Store(spool, _) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let mut status = spool.status(now);
            // No drainer runs here, so none is stalled.
            status.stalled = false;
            status
        }
    };
    let age = status.oldest_age_secs.map_or_else(
        || "-".to_owned(),
        |s| humantime::format_duration(std::time::Duration::from_secs(s)).to_string(),
    );
    println!(
        "depth: {}\nbytes: {}\noldest: {}\nheld: {}\nparked: {}\ndrainer stalled: {}",
        status.depth,
        status.bytes,
        age,
        status.held,
        status.parked,
        if status.stalled { "yes" } else { "no" }
    );
    Ok(())
}

fn parked_entries(
    access: &SpoolAccess,
) -> anyhow::Result<Vec<hookgate::outbox::spool::ParkedEntry>> {
    Ok(match access {
        SpoolAccess::Gateway(addr) => {
            let body = cli::admin::ok(*addr, "GET", hookgate::http::admin::PARKED_PATH)?;
            serde_json::from_str(&body).context("unexpected answer from the admin endpoint")?
        }
        SpoolAccess::Store(spool, _) => spool.parked_entries()?,
    })
}

/// Republishes (or deletes) the parked entries `ids`, or all of them; names each one done.
fn change_parked(
    config: &Config,
    access: &SpoolAccess,
    ids: &[u64],
    all: bool,
    republish: bool,
) -> anyhow::Result<()> {
    let token = cli::admin::token(config)?;
    let ids: Vec<u64> = if all {
        parked_entries(access)?.iter().map(|e| e.id).collect()
    } else {
        ids.to_vec()
    };
    let verb = if republish { "republished" } else { "deleted" };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    for id in ids {
        match access {
            SpoolAccess::Gateway(addr) => {
                let token = token.as_ref();
                let path = format!("{}/{id}", hookgate::http::admin::PARKED_PATH);
                if republish {
                    cli::admin::authorized(
                        *addr,
                        "POST",
                        &format!("{path}/{}", hookgate::http::admin::REPUBLISH),
                        token,
                    )?;
                } else {
                    cli::admin::authorized(*addr, "DELETE", &path, token)?;
                }
            }
            SpoolAccess::Store(spool, _) => runtime.block_on(async {
                if republish {
                    spool.republish(id).await
                } else {
                    spool.delete_parked(id).await
                }
            })?,
        }
        println!("{verb} parked entry {id}");
    }
    if let SpoolAccess::Store(_, store) = access {
        store.flush_blocking()?;
    }
    Ok(())
}
