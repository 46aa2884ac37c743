//! `hookgate sign`: signs a body as a sender of a profile would, for tests and for a first
//! delivery by hand.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use hookgate::config::{Config, Profile, Route};
use hookgate::providers::SignRequest;

use crate::cli::exit::{finish, EXIT_USAGE};

/// `hookgate sign`'s arguments.
#[derive(Args)]
pub struct SignArgs {
    /// Environment variable holding the secret (Telnyx: the base64 ed25519 private key).
    #[arg(long)]
    secret_env: String,
    /// The sender profile; ignored with --route.
    #[arg(long, value_enum, default_value_t = Profile::Botix)]
    profile: Profile,
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
}

/// Why `sign` failed, which decides its exit code as for `run`.
pub enum SignError {
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

/// Runs `hookgate sign`: 64 for what was asked, 1 for reading or writing, as `run`.
pub fn command(config_path: &Path, args: &SignArgs) -> ExitCode {
    match sign(config_path, args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(SignError::Usage(e)) => finish(Err(e), EXIT_USAGE),
        Err(SignError::Io(e)) => finish(Err(e), 1),
    }
}

/// Signs the body of the file (stdin when absent) with the secret in `--secret-env` and
/// prints the header lines a sender of the profile (or of `--route`) sends.
fn sign(config_path: &Path, args: &SignArgs) -> Result<(), SignError> {
    let secret_env = &args.secret_env;
    let secret = std::env::var(secret_env)
        .ok()
        .filter(|s| !s.is_empty())
        .with_context(|| format!("environment variable {secret_env} is not set or empty"))?;
    let route = match args.route.as_deref() {
        Some(name) => Some(load_route(config_path, name)?),
        None => None,
    };
    let profile = route.as_ref().map_or(args.profile, |r| r.profile);
    let body = read_body(args.file.as_deref()).map_err(SignError::Io)?;
    let fresh = uuid::Uuid::new_v4().simple().to_string();
    let signed = profile
        .sender()
        .sign(&SignRequest {
            secret: secret.as_bytes(),
            body: &body,
            route: route.as_ref().map(Route::sender_keys),
            url: args.url.as_deref(),
            id: args.id.as_deref(),
            fresh: &fresh,
            timestamp: args
                .timestamp
                .unwrap_or_else(|| hookgate::clock::now_secs() as i64),
        })
        .map_err(anyhow::Error::msg)?;
    if let Some(note) = &signed.note {
        eprintln!("{note}");
    }
    // A closed stdout is an I/O failure (exit 1), where the print macro would panic.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", signed.headers)
        .and_then(|()| stdout.flush())
        .context("cannot write to stdout")
        .map_err(SignError::Io)?;
    Ok(())
}

/// The route named `name` in the config at `config_path`.
fn load_route(config_path: &Path, name: &str) -> anyhow::Result<Route> {
    let config = Config::load(config_path).map_err(anyhow::Error::from)?;
    config
        .routes
        .into_iter()
        .find(|r| r.name == name)
        .with_context(|| format!("no route named {name} in {}", config_path.display()))
}

/// The body to sign: the file's bytes, or stdin's.
fn read_body(file: Option<&Path>) -> anyhow::Result<Vec<u8>> {
    match file {
        Some(path) => {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
        }
        None => {
            let mut body = Vec::new();
            std::io::stdin()
                .read_to_end(&mut body)
                .context("cannot read stdin")?;
            Ok(body)
        }
    }
}
