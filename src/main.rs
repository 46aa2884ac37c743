//! The `hookgate` command: the top-level parser, the subcommands and their dispatch. Each
//! command's arguments and body are in its file of `cli/`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

use cli::exit::EXIT_USAGE;
use cli::logging::LogFormat;

// An accepted event allocates and frees often: mimalloc spends less per call than glibc's
// allocator and keeps per-thread heaps. Without transparent huge pages (feature no_thp),
// so a growing heap does not make the kernel clear a fresh 2 MiB page each time.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    CheckConfig(cli::check_config::CheckConfigArgs),
    /// Sign a body read from FILE or stdin as a sender of a profile would: botix prints the
    /// X-Botix-Signature value; every other profile prints `Name: value` header lines.
    Sign(cli::sign::SignArgs),
    /// Inspect the spool.
    Spool {
        #[command(subcommand)]
        command: cli::spool::SpoolCommand,
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
        Command::Run => cli::run::command(&cli.config, cli.log_format),
        Command::CheckConfig(args) => cli::check_config::command(&cli.config, args),
        Command::Sign(args) => cli::sign::command(&cli.config, args),
        Command::Spool { command } => cli::spool::command(&cli.config, command),
        Command::Reconcile { command } => cli::reconcile::command(&cli.config, command),
        Command::Inspect(args) => cli::inspect::command(&cli.config, args),
    }
}
