//! The list API's key: a newtype that never prints, read from an environment variable or a
//! file, and the check whether a refused key's file has changed since.

use std::path::PathBuf;

use crate::config::reconcile::Reconcile;

/// What is printed in place of the key.
const REDACTED: &str = "[redacted]";

/// An API key. `Debug` and `Display` print `[redacted]`; only [`ApiKey::expose`] gives
/// the text, for the `Authorization` header.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// The key's text, for the request header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

impl std::fmt::Display for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

/// Why the key cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("environment variable {0} is unset or empty")]
    Env(String),
    #[error("cannot read key file {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("key file {0} is empty")]
    EmptyFile(PathBuf),
}

/// Where a route's key comes from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// An environment variable, read once.
    Env(String),
    /// A file, read again when its contents change.
    File(PathBuf),
}

impl KeySource {
    /// The source a `reconcile:` block names (validation made sure it names one).
    pub fn of(config: &Reconcile) -> Self {
        match (&config.token_file, &config.token_env) {
            (Some(path), _) => KeySource::File(path.clone()),
            (None, Some(var)) => KeySource::Env(var.clone()),
            (None, None) => KeySource::Env(String::new()),
        }
    }

    /// Reads the key now. A file's trailing newline is not part of it.
    pub fn read(&self) -> Result<ApiKey, KeyError> {
        match self {
            KeySource::Env(var) => std::env::var(var)
                .ok()
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .map(ApiKey)
                .ok_or_else(|| KeyError::Env(var.clone())),
            KeySource::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| KeyError::File {
                    path: path.clone(),
                    source,
                })?;
                let key = text.trim();
                if key.is_empty() {
                    return Err(KeyError::EmptyFile(path.clone()));
                }
                Ok(ApiKey(key.to_owned()))
            }
        }
    }

    /// Whether a refused key may have been replaced: only a file's can, without a
    /// restart; true when the file now holds another key.
    pub fn changed_from(&self, refused: &ApiKey) -> bool {
        match self {
            KeySource::Env(_) => false,
            KeySource::File(_) => self.read().is_ok_and(|k| &k != refused),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_never_prints() {
        let key = ApiKey("sk_live_abcdef".into());
        assert_eq!(format!("{key:?} {key}"), "[redacted] [redacted]");
        assert_eq!(key.expose(), "sk_live_abcdef");
    }

    #[test]
    fn a_key_file_is_read_trimmed_and_its_change_seen() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("key");
        std::fs::write(&path, "k1\n").expect("write");
        let source = KeySource::File(path.clone());
        let first = source.read().expect("key");
        assert_eq!(first.expose(), "k1");
        assert!(!source.changed_from(&first));
        std::fs::write(&path, "k2\n").expect("write");
        assert!(source.changed_from(&first));
        std::fs::write(&path, "\n").expect("write");
        assert!(matches!(source.read(), Err(KeyError::EmptyFile(_))));
        assert!(!source.changed_from(&first), "an empty file is no new key");
    }

    #[test]
    fn an_unset_variable_is_an_error_naming_it() {
        let e = KeySource::Env("HOOKGATE_TEST_UNSET_KEY_VAR".into())
            .read()
            .expect_err("unset");
        assert!(e.to_string().contains("HOOKGATE_TEST_UNSET_KEY_VAR"));
    }
}
