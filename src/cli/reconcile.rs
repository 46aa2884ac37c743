//! `hookgate reconcile status` and `hookgate reconcile run --route NAME [--since 6h]`:
//! through the running gateway's admin listener, since the reconcilers run inside it.
//! `hookgate reconcile replay` is in [`crate::cli::replay`].

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Subcommand;
use hookgate::config::Config;
use hookgate::http::admin_endpoints::RECONCILE_PATH;
use hookgate::http::token::AdminToken;
use hookgate::reconcile::RouteStatus;

use crate::cli::admin;
use crate::cli::exit::{finish, EXIT_USAGE};

/// How often `run` asks whether its walk ended.
const POLL: Duration = Duration::from_millis(500);
/// How long `run` waits for the gateway to start the walk it asked for.
const START_WAIT: Duration = Duration::from_secs(30);

/// The `reconcile` subcommands.
#[derive(Subcommand)]
pub enum ReconcileCommand {
    /// Each reconciling route: its position, last walk, last error.
    Status,
    /// Run one walk of a route now and wait for its end.
    Run {
        /// The route's name.
        #[arg(long)]
        route: String,
        /// Reach back this far (e.g. `6h`) instead of from the last complete walk; at most
        /// the route's lookback.
        #[arg(long, value_parser = hookgate::config::parse_duration)]
        since: Option<Duration>,
    },
    /// Publish a window of the sender's list again, with `x-source: replay`: through the
    /// guard (an event older than what it holds is still dropped) but past the dedup
    /// marks. Asks first above --confirm-above events.
    Replay(crate::cli::replay::ReplayArgs),
}

/// Runs `hookgate reconcile` through the admin listener the config at `config_path` names.
pub fn command(config_path: &Path, command: &ReconcileCommand) -> ExitCode {
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // A replay the config already refuses (its route, its window) is a usage error.
    if let ReconcileCommand::Replay(args) = command {
        if let Err(e) = crate::cli::replay::check(&config, args) {
            return finish(Err(e), EXIT_USAGE);
        }
    }
    finish(run(&config, command), 1)
}

/// Runs a `reconcile` subcommand against the gateway of `config`.
fn run(config: &Config, command: &ReconcileCommand) -> anyhow::Result<()> {
    let addr = admin::address(config);
    match command {
        ReconcileCommand::Status => {
            let statuses = statuses(addr)?;
            if statuses.is_empty() {
                println!("no route reconciles (add a reconcile: block to a route)");
            }
            for s in &statuses {
                print_status(s);
            }
            Ok(())
        }
        ReconcileCommand::Run { route, since } => {
            let token = admin::token(config)?;
            run_walk(addr, token.as_ref(), route, *since)
        }
        ReconcileCommand::Replay(args) => {
            let request = crate::cli::replay::check(config, args)?;
            crate::cli::replay::run(config, args, &request)
        }
    }
}

fn statuses(addr: std::net::SocketAddr) -> anyhow::Result<Vec<RouteStatus>> {
    let body = admin::ok(addr, "GET", RECONCILE_PATH).with_context(|| {
        format!("no gateway answered on the admin address {addr}; reconciliation runs inside the gateway")
    })?;
    serde_json::from_str(&body).context("unexpected answer from the admin endpoint")
}

fn print_status(s: &RouteStatus) {
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let position = match (&s.since, s.at_cursor) {
        (Some(since), true) => format!("unfinished walk since {since}, resumes at its cursor"),
        (Some(since), false) => format!("walk since {since}, at its first page"),
        (None, _) => "no walk underway".into(),
    };
    let role = if s.key_refused {
        "stopped: the sender refuses the key"
    } else if s.walking {
        "walking"
    } else if s.leader {
        "waiting for the next interval"
    } else {
        "another replica holds the lease"
    };
    println!(
        "route {}: {role}\n  position: {position}\n  last walk started: {}\n  last result: {}\n  last complete walk ended: {}\n  last error: {}",
        s.route,
        dash(&s.last_walk_start),
        dash(&s.last_result),
        dash(&s.last_complete),
        dash(&s.last_error),
    );
}

fn run_walk(
    addr: std::net::SocketAddr,
    token: Option<&AdminToken>,
    route: &str,
    since: Option<Duration>,
) -> anyhow::Result<()> {
    let find = |list: Vec<RouteStatus>| list.into_iter().find(|s| s.route == route);
    let before = find(statuses(addr)?).with_context(|| format!("no route {route} reconciles"))?;
    let path = match since {
        Some(d) => format!("{RECONCILE_PATH}/{route}/run/{}", d.as_secs()),
        None => format!("{RECONCILE_PATH}/{route}/run"),
    };
    admin::authorized(addr, "POST", &path, token)?;
    println!("walk of route {route} asked for");
    let asked = Instant::now();
    let mut started = false;
    loop {
        std::thread::sleep(POLL);
        let Some(now) = find(statuses(addr)?) else {
            anyhow::bail!("route {route} no longer reconciles");
        };
        started |= now.walking || now.last_walk_start != before.last_walk_start;
        if started && !now.walking {
            print_status(&now);
            return match now.last_result.as_deref() {
                Some("complete") => Ok(()),
                other => anyhow::bail!(
                    "the walk ended {}: {}",
                    other.unwrap_or("without a result"),
                    now.last_error.unwrap_or_default()
                ),
            };
        }
        if !started && asked.elapsed() > START_WAIT {
            anyhow::bail!("the gateway did not start the walk within {START_WAIT:?}");
        }
    }
}
