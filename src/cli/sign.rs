//! `hookgate sign`: signs a body as a sender of a profile would, for tests and for a first
//! delivery by hand.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::Context;
use clap::ValueEnum;
use hookgate::config::{Config, Encoding, Profile, Route};
use hookgate::providers as sig;

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
    let profile = match (&route, request.profile) {
        (Some(route), _) => route.profile,
        (None, SignProfile::Botix) => Profile::Botix,
        (None, SignProfile::StandardWebhooks) => Profile::StandardWebhooks,
        (None, SignProfile::Twilio) => Profile::Twilio,
        (None, SignProfile::Telnyx) => Profile::Telnyx,
    };
    let body = read_body(file).map_err(SignError::Io)?;
    let signer = Signer {
        secret: secret.as_bytes(),
        body: &body,
        request,
        route: route.as_ref(),
    };
    let headers = signer.headers(profile)?;
    // A closed stdout is an I/O failure (exit 1), where the print macro would panic.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{headers}")
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

/// One body to sign, with what the profiles sign along with it.
struct Signer<'a> {
    secret: &'a [u8],
    body: &'a [u8],
    request: &'a SignRequest<'a>,
    route: Option<&'a Route>,
}

impl Signer<'_> {
    /// The header lines a sender of `profile` sends with the body.
    fn headers(&self, profile: Profile) -> anyhow::Result<String> {
        match profile {
            Profile::Botix => Ok(sig::botix_header(self.secret, self.body)),
            Profile::StandardWebhooks => self.standard_webhooks(),
            Profile::Twilio => self.twilio(),
            Profile::Telnyx => self.telnyx(),
            Profile::Custom => self.custom(),
        }
    }

    /// The signed Unix time: the one asked for, or now.
    fn timestamp(&self) -> i64 {
        self.request
            .timestamp
            .unwrap_or_else(|| hookgate::clock::now_secs() as i64)
    }

    fn standard_webhooks(&self) -> anyhow::Result<String> {
        let id = self.request.id.map_or_else(
            || format!("msg_{}", uuid::Uuid::new_v4().simple()),
            str::to_owned,
        );
        let ts = self.timestamp();
        let signature = sig::standard_webhooks_signature(self.secret, &id, ts, self.body)
            .context("the secret is not whsec_ followed by base64")?;
        Ok(format!(
            "webhook-id: {id}\nwebhook-timestamp: {ts}\nwebhook-signature: {signature}"
        ))
    }

    fn twilio(&self) -> anyhow::Result<String> {
        let url = self
            .request
            .url
            .or_else(|| self.route.and_then(|r| r.public_url.as_deref()))
            .context("profile twilio signs a URL: give --url (with the query Twilio sends)")?;
        Ok(format!(
            "X-Twilio-Signature: {}",
            sig::twilio_signature(self.secret, url, self.body)
        ))
    }

    /// Also prints the public key a route must be configured with.
    fn telnyx(&self) -> anyhow::Result<String> {
        let ts = self.timestamp();
        let (signature, public) = sig::telnyx_signature(self.secret, ts, self.body)
            .context("the key is not the base64 of a 32-byte ed25519 private key (seed)")?;
        eprintln!("public key (the route's secret): {public}");
        Ok(format!(
            "telnyx-timestamp: {ts}\ntelnyx-signature-ed25519: {signature}"
        ))
    }

    fn custom(&self) -> anyhow::Result<String> {
        let scheme = self
            .route
            .and_then(|r| r.signature.as_ref())
            .context("profile custom: give --route, whose signature section says how to sign")?;
        let mac = sig::hmac_parts(self.secret, &[self.body]);
        let encoded = match scheme.encoding {
            Encoding::Hex => hex::encode(mac),
            Encoding::Base64 => {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.encode(mac)
            }
        };
        let prefix = scheme.prefix.as_deref().unwrap_or_default();
        Ok(format!("{}: {prefix}{encoded}", scheme.header))
    }
}
