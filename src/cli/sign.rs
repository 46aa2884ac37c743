//! `hookgate sign`: signs a body as a sender of a profile would, for tests and for a first
//! delivery by hand.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::Context;
use clap::ValueEnum;
use hookgate::config::{Config, Encoding, Profile};

/// The profiles `sign` knows without a config (`custom` needs its route's scheme: --route).
#[derive(Clone, Copy, ValueEnum)]
pub enum SignProfile {
    Botix,
    StandardWebhooks,
    Twilio,
    Telnyx,
}

/// What `sign` was asked for, apart from the secret and the body.
pub struct SignRequest<'a> {
    pub profile: SignProfile,
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
    let now = || hookgate::clock::now_secs() as i64;
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
