//! Reading a config: the file, the YAML parsed strictly with the key path of any error,
//! the senders' defaults filled in, former names renamed, then [`Config::validate`]; and
//! the effective config printed back, redacted.

use std::path::{Path, PathBuf};

use super::config_error::ConfigError;
use super::redact::redact_url;
use super::schema::Config;
use super::{amqp, sender_defaults, units};

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
