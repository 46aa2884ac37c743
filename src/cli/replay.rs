//! `hookgate reconcile replay --route R --since 6h [--until 1h] [--events …] [--dry-run]
//! [--yes] [--confirm-above N]`: a window of the sender's list published again, through
//! the running gateway's admin listener (the replay needs its outbox and guard).
//!
//! The rule for asking: unless `--yes`, the gateway first walks the window as a dry run
//! and answers how many events it would hand to the guard; above `--confirm-above` the
//! command asks at the terminal, and without one it refuses. Then the replay itself runs.

use std::io::{BufRead, IsTerminal, Write};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use hookgate::config::Config;
use hookgate::http::admin_endpoints::{RECONCILE_PATH, REPLAY};
use hookgate::http::token::AdminToken;
use hookgate::reconcile::replay_walk::{self, ReplayCounts, ReplayRequest, ReplayStatus};

use crate::cli::admin;

/// How often the command asks whether the replay ended.
const POLL: Duration = Duration::from_millis(500);

/// The arguments of `reconcile replay`.
#[derive(Args)]
pub struct ReplayArgs {
    /// The route's name; it needs a `reconcile:` block.
    #[arg(long)]
    route: String,
    /// The window starts this far back (e.g. `6h`); at most the route's lookback.
    #[arg(long, value_parser = hookgate::config::parse_duration)]
    since: Duration,
    /// The window ends this far back (e.g. `1h`); now when absent.
    #[arg(long, value_parser = hookgate::config::parse_duration)]
    until: Option<Duration>,
    /// Only these event types, a comma list: `message.status`, `message.received`.
    #[arg(long, value_delimiter = ',')]
    events: Vec<String>,
    /// Count the window's events and publish nothing.
    #[arg(long)]
    dry_run: bool,
    /// Publish without the dry run and the question.
    #[arg(long)]
    yes: bool,
    /// Ask before publishing more than this many events.
    #[arg(long, default_value_t = 100)]
    confirm_above: u64,
}

/// The request `args` make, checked against `config` before the gateway is asked: the
/// route, its `reconcile:` block, the window and the event types. An error here is a usage
/// error.
pub fn check(config: &Config, args: &ReplayArgs) -> anyhow::Result<ReplayRequest> {
    let route = config
        .routes
        .iter()
        .find(|r| r.name == args.route)
        .with_context(|| format!("no route {} in the config", args.route))?;
    let settings = route.reconcile.as_ref().with_context(|| {
        format!(
            "route {} has no reconcile: block; a replay lists the sender's API, which only a reconciling route reads",
            args.route
        )
    })?;
    let request = ReplayRequest {
        since: args.since,
        until: args.until,
        events: args.events.clone(),
        dry_run: args.dry_run,
    };
    // The gateway measures the window again when it takes the request; this is the same
    // check, made before any request.
    replay_walk::window(&request, settings.lookback, 0)?;
    Ok(request)
}

/// Runs the replay `request` against the gateway of `config`, asking first as
/// [`ReplayArgs`] says.
pub fn run(config: &Config, args: &ReplayArgs, request: &ReplayRequest) -> anyhow::Result<()> {
    let addr = admin::address(config);
    let token = admin::token(config)?;
    let gateway = Gateway {
        addr,
        token: token.as_ref(),
        route: &args.route,
    };
    if request.dry_run || !args.yes {
        let dry = ReplayRequest {
            dry_run: true,
            ..request.clone()
        };
        let counted = gateway.replay(&dry)?;
        print_end(&counted);
        ensure_complete(&counted)?;
        let n = counted.counts.selected;
        if request.dry_run {
            return Ok(());
        }
        if n == 0 {
            println!("nothing to replay");
            return Ok(());
        }
        if n > args.confirm_above && !confirm(n, args.confirm_above)? {
            anyhow::bail!("not confirmed; nothing published");
        }
    }
    let done = gateway.replay(request)?;
    print_end(&done);
    ensure_complete(&done)?;
    anyhow::ensure!(
        done.counts.failed == 0,
        "{} events could not be made or published",
        done.counts.failed
    );
    Ok(())
}

/// The gateway's admin listener, for one route's replays.
struct Gateway<'a> {
    addr: SocketAddr,
    token: Option<&'a AdminToken>,
    route: &'a str,
}

impl Gateway<'_> {
    fn path(&self) -> String {
        format!("{RECONCILE_PATH}/{}/{REPLAY}", self.route)
    }

    fn unreachable(&self) -> String {
        format!(
            "no gateway answered on the admin address {}; a replay runs inside the gateway",
            self.addr
        )
    }

    /// Asks for `request` and waits for its end, printing each page's counts.
    fn replay(&self, request: &ReplayRequest) -> anyhow::Result<ReplayStatus> {
        let (status, body) =
            admin::send(self.addr, "POST", &query(&self.path(), request), self.token)
                .with_context(|| self.unreachable())?;
        anyhow::ensure!(
            status == 202,
            "the gateway answered {status}: {}",
            body.trim()
        );
        let asked: ReplayStatus =
            serde_json::from_str(&body).context("unexpected answer from the admin endpoint")?;
        let what = if asked.dry_run { "dry run" } else { "replay" };
        let until = asked.until.as_deref().unwrap_or("now");
        println!(
            "{what} {} of route {} asked for: events from {} to {until}",
            asked.id, asked.route, asked.since
        );
        self.wait(asked.id)
    }

    /// Polls the replay numbered `id` until it ends.
    fn wait(&self, id: u64) -> anyhow::Result<ReplayStatus> {
        let mut pages = 0;
        loop {
            std::thread::sleep(POLL);
            let body =
                admin::ok(self.addr, "GET", &self.path()).with_context(|| self.unreachable())?;
            let now: ReplayStatus =
                serde_json::from_str(&body).context("unexpected answer from the admin endpoint")?;
            anyhow::ensure!(
                now.id == id,
                "the gateway shows replay {}, not {id}",
                now.id
            );
            if !now.running {
                return Ok(now);
            }
            if now.counts.pages > pages {
                pages = now.counts.pages;
                println!("  page {pages}: {}", counts_line(&now.counts));
            }
        }
    }
}

/// `path` with `request` as its query.
fn query(path: &str, request: &ReplayRequest) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("since", &request.since.as_secs().to_string());
    if let Some(until) = request.until {
        q.append_pair("until", &until.as_secs().to_string());
    }
    if !request.events.is_empty() {
        q.append_pair("events", &request.events.join(","));
    }
    q.append_pair("dry_run", if request.dry_run { "true" } else { "false" });
    format!("{path}?{}", q.finish())
}

fn counts_line(c: &ReplayCounts) -> String {
    let reasons: Vec<String> = c.dropped.iter().map(|(r, n)| format!("{r} {n}")).collect();
    let reasons = if reasons.is_empty() {
        String::new()
    } else {
        format!(" ({})", reasons.join(", "))
    };
    format!(
        "listed {}, selected {}, published {}, dropped {}{reasons}, failed {}",
        c.listed,
        c.selected,
        c.published,
        c.dropped_total(),
        c.failed
    )
}

fn print_end(s: &ReplayStatus) {
    let what = if s.dry_run { "dry run" } else { "replay" };
    println!(
        "{what} {} of route {}: {}\n  {}",
        s.id,
        s.route,
        s.result.as_deref().unwrap_or("-"),
        counts_line(&s.counts)
    );
    if s.dry_run && s.result.as_deref() == Some("complete") {
        println!(
            "  {} events would be handed to the guard (it drops those older than what it holds)",
            s.counts.selected
        );
    }
}

fn ensure_complete(s: &ReplayStatus) -> anyhow::Result<()> {
    match s.result.as_deref() {
        Some("complete") => Ok(()),
        other => anyhow::bail!(
            "the {} ended {}: {}",
            if s.dry_run { "dry run" } else { "replay" },
            other.unwrap_or("without a result"),
            s.error.as_deref().unwrap_or("")
        ),
    }
}

/// Asks at the terminal whether `n` events, above `threshold`, are published again; an
/// error without a terminal.
fn confirm(n: u64, threshold: u64) -> anyhow::Result<bool> {
    let stdin = std::io::stdin();
    anyhow::ensure!(
        stdin.is_terminal(),
        "{n} events are above --confirm-above {threshold} and there is no terminal to ask; add --yes to publish them"
    );
    eprint!("publish {n} events again? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    Ok(confirmed(&answer))
}

/// Whether an answer to the question is a yes.
fn confirmed(answer: &str) -> bool {
    matches!(answer.trim().to_lowercase().as_str(), "y" | "yes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_yes_confirms() {
        for yes in ["y", "Y\n", " yes "] {
            assert!(confirmed(yes), "{yes:?}");
        }
        for no in ["", "\n", "n", "no", "yess", "ja"] {
            assert!(!confirmed(no), "{no:?}");
        }
    }

    #[test]
    fn the_request_is_the_query_the_gateway_reads() {
        let request = ReplayRequest {
            since: Duration::from_secs(21_600),
            until: Some(Duration::from_secs(3600)),
            events: vec!["message.status".into(), "message.received".into()],
            dry_run: true,
        };
        assert_eq!(
            query("/reconcile/botix/replay", &request),
            "/reconcile/botix/replay?since=21600&until=3600&events=message.status%2Cmessage.received&dry_run=true"
        );
    }

    #[test]
    fn counts_read_as_one_line() {
        let mut c = ReplayCounts {
            pages: 2,
            listed: 4,
            selected: 3,
            published: 2,
            ..ReplayCounts::default()
        };
        c.dropped.insert("stale_status".into(), 1);
        assert_eq!(
            counts_line(&c),
            "listed 4, selected 3, published 2, dropped 1 (stale_status 1), failed 0"
        );
    }
}
