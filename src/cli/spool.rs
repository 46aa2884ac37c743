//! `hookgate spool`: the spool's status and its parked entries, through the running
//! gateway's admin endpoint, or from the store itself when no gateway runs.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use hookgate::config::Config;

use crate::cli;
use crate::cli::exit::{finish, load_config, EXIT_USAGE};

#[derive(Subcommand)]
pub enum SpoolCommand {
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

/// Runs `hookgate spool` on the store the config at `config_path` names.
pub fn command(config_path: &Path, command: &SpoolCommand) -> ExitCode {
    if let SpoolCommand::Delete { yes: false, .. } = command {
        eprintln!("error: deleting parked entries loses their events for good; add --yes to do it");
        return ExitCode::from(EXIT_USAGE);
    }
    let config = match load_config(config_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    finish(spool_command(&config, command), 1)
}

/// Where `hookgate spool` finds the spool: the running gateway (which holds the store's
/// lock) through its admin endpoint, or else the store itself.
enum SpoolAccess {
    Gateway(std::net::SocketAddr),
    Store(Box<hookgate::outbox::spooling::Spool>, durable_spool::Store),
}

fn spool_access(config: &Config) -> anyhow::Result<SpoolAccess> {
    let addr = cli::admin::address(config);
    let admin_error =
        match cli::admin::request(addr, "GET", hookgate::http::admin_endpoints::SPOOL_PATH) {
            Ok(_) => return Ok(SpoolAccess::Gateway(addr)),
            Err(e) => e,
        };
    hookgate::tls::install_crypto_provider();
    let store = durable_spool::Store::open_with_cache(&config.store.path, config.store.cache).with_context(|| {
        format!("no gateway answered on the admin address {addr} ({admin_error}), and the store cannot be opened")
    })?;
    let metrics = std::sync::Arc::new(hookgate::metrics::Metrics::new());
    let spool = hookgate::outbox::spooling::open(&store, &config.spool, metrics)?;
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

pub fn spool_command(config: &Config, command: &SpoolCommand) -> anyhow::Result<()> {
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
                    "{}\tparked {}\tevent {}\troute {}\trouting key {}\t{}\t{}",
                    e.id,
                    humantime::format_rfc3339_seconds(parked_at),
                    e.event_id.as_deref().unwrap_or("?"),
                    e.route.as_deref().unwrap_or("?"),
                    e.routing_key.as_deref().unwrap_or("?"),
                    size(e.bytes),
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
    let status: hookgate::outbox::spooling::SpoolStatus = match access {
        SpoolAccess::Gateway(addr) => {
            let body = cli::admin::ok(*addr, "GET", hookgate::http::admin_endpoints::SPOOL_PATH)?;
            serde_json::from_str(&body).context("unexpected answer from the admin endpoint")?
        }
        SpoolAccess::Store(spool, _) => {
            let now = hookgate::clock::now_secs() as i64;
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
        "depth: {}\nsize: {}\noldest: {}\nheld: {}\nparked: {}\ndrainer stalled: {}",
        status.depth,
        size(status.bytes),
        age,
        status.held,
        status.parked,
        if status.stalled { "yes" } else { "no" }
    );
    Ok(())
}

/// A byte count as people read it (`1.5 MiB`); the admin API's JSON keeps the exact count.
fn size(bytes: u64) -> String {
    bytesize::ByteSize::b(bytes).display().iec().to_string()
}

fn parked_entries(
    access: &SpoolAccess,
) -> anyhow::Result<Vec<hookgate::outbox::spooling::ParkedEntry>> {
    Ok(match access {
        SpoolAccess::Gateway(addr) => {
            let body = cli::admin::ok(*addr, "GET", hookgate::http::admin_endpoints::PARKED_PATH)?;
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
                let path = format!("{}/{id}", hookgate::http::admin_endpoints::PARKED_PATH);
                if republish {
                    cli::admin::authorized(
                        *addr,
                        "POST",
                        &format!("{path}/{}", hookgate::http::admin_endpoints::REPUBLISH),
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
