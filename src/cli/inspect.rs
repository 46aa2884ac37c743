//! `hookgate inspect event|request|message|contact`: what the state store knows about one
//! event, request id, message or contact of a route. Asks the running gateway through its
//! admin API (with the admin token), or reads a stopped gateway's store read-only
//! (`--store PATH`, or the config's `store.path` when no gateway answers).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use hookgate::config::{Backend, Config};
use hookgate::http::admin_endpoints::INSPECT_PATH;
use hookgate::inspect::{render, Inspector, Query, Report};
use hookgate::state::offline::OfflineState;

use crate::cli::admin;
use crate::cli::exit::{finish, load_config, EXIT_USAGE};

/// Runs `hookgate inspect`: a question the config refuses (its route, an id of the wrong
/// shape) is a usage error; a gateway or store that cannot answer is a failure.
pub fn command(config_path: &Path, args: &InspectArgs) -> ExitCode {
    let config = match load_config(config_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let checked = match check(&config, args) {
        Ok(checked) => checked,
        Err(e) => return finish(Err(e), EXIT_USAGE),
    };
    finish(run(&config, args, &checked), 1)
}

/// `hookgate inspect`'s arguments.
#[derive(Args)]
pub struct InspectArgs {
    /// Read this stopped gateway's store folder (its `store.path`), read-only, instead of
    /// asking the running gateway.
    #[arg(long, global = true)]
    store: Option<PathBuf>,
    /// `text` for people, `json` for scripts.
    #[arg(long, value_enum, default_value_t = Output::Text, global = true)]
    output: Output,
    #[command(subcommand)]
    what: InspectCommand,
}

/// How the report is printed.
#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// What to inspect.
#[derive(Subcommand)]
pub enum InspectCommand {
    /// An event, by its id: outcome, first seen, deliveries, request ids, source.
    Event {
        /// The event id (the body's `id`).
        id: String,
        /// The route (default: the config's only route).
        #[arg(long)]
        route: Option<String>,
    },
    /// A delivery, by its request id (`X-Request-Id` of hookgate's answer, the sender's
    /// request id header), and the event it brought.
    Request {
        /// The request id.
        id: String,
        /// The route (default: the config's only route).
        #[arg(long)]
        route: Option<String>,
    },
    /// A message's status as the guard holds it: since when, set by which event, and the
    /// status events dropped against it.
    Message {
        /// The message id (`data.message_id`).
        id: String,
        /// The route (default: the config's only route).
        #[arg(long)]
        route: Option<String>,
    },
    /// A contact's opt-out on a channel: opted out or in, since when, by which event, and
    /// the keywords dropped as repeated or stale.
    Contact {
        /// The contact's number (`data.from`).
        from: String,
        /// The channel, the number it wrote to (`data.to`).
        to: Option<String>,
        /// The route (default: the config's only route).
        #[arg(long)]
        route: Option<String>,
    },
}

/// A question checked against the config, before anything is asked.
pub struct Checked {
    route: String,
    query: Query,
}

/// Checks the question: its route, and ids of the shape of that route's sender. An error
/// here is a usage error.
fn check(config: &Config, args: &InspectArgs) -> anyhow::Result<Checked> {
    let (kind, id, to, route) = match &args.what {
        InspectCommand::Event { id, route } => ("event", id, None, route),
        InspectCommand::Request { id, route } => ("request", id, None, route),
        InspectCommand::Message { id, route } => ("message", id, None, route),
        InspectCommand::Contact { from, to, route } => ("contact", from, to.as_deref(), route),
    };
    let route = match route {
        Some(route) => route.clone(),
        None => match config.routes.as_slice() {
            [only] => only.name.clone(),
            _ => anyhow::bail!(
                "the config has several routes: name one with --route ({})",
                config
                    .routes
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    };
    let query = Query::new(kind, id, to)?;
    Inspector::new(config).check(&route, &query)?;
    Ok(Checked { route, query })
}

/// Asks, and prints the report.
fn run(config: &Config, args: &InspectArgs, checked: &Checked) -> anyhow::Result<()> {
    let report = match &args.store {
        Some(path) => offline(config, path, checked)?,
        None => online_or_offline(config, checked)?,
    };
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Text => print!("{}", render(&report)),
    }
    Ok(())
}

/// Through the running gateway; when none answers and the state is local, from the
/// config's store folder.
fn online_or_offline(config: &Config, checked: &Checked) -> anyhow::Result<Report> {
    let addr = admin::address(config);
    let token = admin::token(config)?;
    let Checked { route, query } = checked;
    let mut path = form_urlencoded::Serializer::new(format!("{INSPECT_PATH}?"));
    path.append_pair("route", route)
        .append_pair("kind", query.kind());
    match query {
        Query::Event(id) | Query::Request(id) | Query::Message(id) => {
            path.append_pair("id", id);
        }
        Query::Contact { from, to } => {
            path.append_pair("id", from).append_pair("to", to);
        }
    }
    let path = path.finish();
    match admin::send(addr, "GET", &path, token.as_ref()) {
        Ok((200, body)) => {
            eprintln!("gateway: admin {addr} (the running gateway)");
            serde_json::from_str(&body).context("unexpected answer from the admin endpoint")
        }
        Ok((403, body)) if token.is_none() => anyhow::bail!(
            "the gateway answered 403: {} (inspect needs admin.token_file in the config)",
            body.trim()
        ),
        Ok((status, body)) => anyhow::bail!("the gateway answered {status}: {}", body.trim()),
        Err(unreachable) if config.dedup.backend == Backend::Local => {
            eprintln!(
                "gateway: none answered on admin {addr} ({unreachable}); reading the store {} read-only",
                config.store.path.display()
            );
            offline(config, &config.store.path, checked)
        }
        Err(unreachable) => Err(unreachable.context(format!(
            "no gateway answered on admin {addr}, and the state is in Redis: ask a running replica"
        ))),
    }
}

/// From a stopped gateway's store folder, read-only.
fn offline(config: &Config, path: &std::path::Path, checked: &Checked) -> anyhow::Result<Report> {
    anyhow::ensure!(
        config.dedup.backend == Backend::Local,
        "--store reads the local backend's store; this config keeps its state in Redis (dedup.backend: redis): ask a running replica"
    );
    let state = OfflineState::open(path, config.dedup.in_flight_lease)?;
    let now_ms = hookgate::clock::now_ms();
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let report = runtime.block_on(Inspector::new(config).answer(
        &state,
        &checked.route,
        &checked.query,
        now_ms,
    ))?;
    eprintln!("store: {} (read-only)", path.display());
    Ok(report)
}
