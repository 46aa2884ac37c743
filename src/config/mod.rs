//! The YAML configuration: reading a file, its redacted print, and where each part lives.
//!
//! The schema of the file's sections is in `schema`, one route's in `route`, secret sources
//! in `secret`, durations and sizes in `units`, and the rules across fields in `validate`.
//! Parsing is strict: every struct denies unknown keys, and the error names the key path
//! (`limits.max_body_byts`). Reading secrets from the environment or files happens in
//! [`crate::ingress::secrets`], not here, so a config can be checked without them.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod amqp;
pub mod reconcile;
pub mod redis;
mod route;
mod schema;
mod secret;
mod sender_defaults;
mod units;
mod validate;

pub use self::redis::Redis;
pub use crate::providers::{CustomSignature, Encoding, Profile};
pub use amqp::split_urls;
pub use route::{
    Fields, GuardConfig, KeywordGuard, RateLimit, Route, StatusGuard, DEFAULT_HELP, DEFAULT_RANKS,
    DEFAULT_START, DEFAULT_STOP,
};
pub use schema::{
    AdminConfig, Amqp, AmqpQueue, Backend, Config, Dedup, Limits, Listen, Log, QueueKind,
    SpoolConfig, StoreConfig, Tls,
};
pub use secret::SecretSource;
pub use units::{parse_duration, parse_size};

/// The longest AMQP short string, in bytes: the limit of exchange names, routing keys and
/// `message_id`. Config checks the exchange against it; the outbox checks routing keys.
pub const AMQP_SHORT_STRING_MAX: usize = 255;
/// The longest a request waits for its spool entry's fsync before it answers 503: with the
/// guard-key lock wait and the publish, part of how long a request holds its claim.
pub const SPOOL_FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Whether `text` fits an AMQP short string.
pub fn fits_short_string(text: &str) -> bool {
    text.len() <= AMQP_SHORT_STRING_MAX
}

/// A configuration that cannot be used; the message names the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: {0}")]
    Invalid(String),
}

impl Config {
    /// Reads, parses and validates a file. No secret is read and nothing is bound.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })
    }

    /// Parses and validates YAML text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let parse_error = |message: String| ConfigError::Parse {
            path: PathBuf::new(),
            message,
        };
        // YAML syntax errors come from the YAML parser (with a line); schema errors come from
        // a second pass over the parsed tree, where serde_path_to_error records the key path
        // of the failing field, so a typo is reported as `limits.max_body_byts`.
        // Strict booleans: in the untyped first pass a YAML 1.1 `YES` or `ON` would become
        // `true`, and `YES` is a default START keyword.
        let mut options = serde_saphyr::Options::default();
        options.strict_booleans = true;
        let mut tree: serde_json::Value = serde_saphyr::from_str_with_options(text, options)
            .map_err(|e| parse_error(e.to_string()))?;
        // What a route leaves out, its sender fills in (Twilio's and Telnyx's fields and
        // guard rules); the generic defaults below apply only where no sender has one.
        sender_defaults::fill_route_defaults(&mut tree).map_err(parse_error)?;
        let deprecations = rename_deprecated(&mut tree);
        amqp::check_written(&tree).map_err(parse_error)?;
        let written = units::duration::Written::from_tree(&tree);
        let mut config: Config = serde_path_to_error::deserialize(tree).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            parse_error(if path.is_empty() || path == "." {
                inner
            } else {
                format!("{path}: {inner}")
            })
        })?;
        config.written = written;
        config.deprecations = deprecations;
        config.validate()?;
        Ok(config)
    }

    /// Warnings about values read under a former name: the config works, and should be
    /// changed before the name is no longer read.
    pub fn deprecations(&self) -> &[String] {
        &self.deprecations
    }

    /// The effective config as YAML with every secret and URL password redacted. Durations
    /// appear as the file wrote them, defaults as docs/configuration.md writes them.
    pub fn redacted_yaml(&self) -> String {
        let mut copy = self.clone();
        copy.amqp = copy.amqp.redacted();
        copy.redis.url = redact_url(&copy.redis.url);
        self.written
            .while_serializing(|| serde_saphyr::to_string(&copy))
            .unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }

    /// The effective config as a JSON tree (durations as in [`Config::redacted_yaml`], sizes
    /// in bytes), secrets included: for comparing the config with its documentation.
    pub fn to_tree(&self) -> Result<serde_json::Value, serde_json::Error> {
        self.written
            .while_serializing(|| serde_json::to_value(self))
    }
}

/// Replaces the password of a URL (`scheme://user:pass@host`) with `[redacted]`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:{REDACTED}@{host}"),
        None => url.to_owned(),
    }
}

/// What is printed in place of a secret or a password.
const REDACTED: &str = "[redacted]";

/// Rewrites values the schema reads under a former name to their name, and says which.
fn rename_deprecated(tree: &mut serde_json::Value) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(backend) = tree.pointer_mut("/dedup/backend") {
        if backend == "sled" {
            *backend = "local".into();
            found.push("dedup.backend: `sled` is now called `local`; write `local`".to_owned());
        }
    }
    found
}

#[cfg(test)]
mod tests;
