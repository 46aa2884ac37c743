//! `hookgate sign`: signs a body as a sender of a profile would, for tests and for a first
//! delivery by hand.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::Context;
use hookgate::config::{Config, Profile, Route};
use hookgate::providers::SignRequest as Body;

/// What `sign` was asked for, apart from the secret and the body.
pub struct SignRequest<'a> {
    pub profile: Profile,
    pub route: Option<&'a str>,
    pub url: Option<&'a str>,
    pub id: Option<&'a str>,
    pub timestamp: Option<i64>,
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

/// Signs the body of `file` (stdin when absent) with the secret in `secret_env` and prints
/// the header lines a sender of the profile (or of `request.route`) sends.
pub fn sign(
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
        Some(name) => Some(load_route(config_path, name)?),
        None => None,
    };
    let profile = route.as_ref().map_or(request.profile, |r| r.profile);
    let body = read_body(file).map_err(SignError::Io)?;
    let fresh = uuid::Uuid::new_v4().simple().to_string();
    let signed = profile
        .sender()
        .sign(&Body {
            secret: secret.as_bytes(),
            body: &body,
            route: route.as_ref().map(Route::sender_keys),
            url: request.url,
            id: request.id,
            fresh: &fresh,
            timestamp: request
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
