//! Webhook secrets: loading them from the environment or files, and swapping them on reload.

use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};

use crate::config::SecretSource;
pub use crate::providers::Secret;

/// A secret that cannot be read; the message names the variable or file, never a value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("environment variable {0} is not set or empty")]
    Env(String),
    #[error("cannot read secret file {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("secret file {0} is empty")]
    EmptyFile(PathBuf),
    #[error("inline secret secrets[{0}] is empty")]
    EmptyInline(usize),
}

/// Secrets shorter than this are accepted with a warning: HMAC keys should have at least
/// 128 bits.
pub const MIN_SECRET_BYTES: usize = 16;

/// Reads every source of one route, in order. An empty secret from any source is an error:
/// anyone could sign with it.
pub fn load(sources: &[SecretSource]) -> Result<Vec<Secret>, SecretError> {
    sources
        .iter()
        .enumerate()
        .map(|(i, s)| load_one(i, s))
        .collect()
}

/// Names a source for logs and errors, never its value.
pub fn describe(index: usize, source: &SecretSource) -> String {
    match source {
        SecretSource::Env { var } => format!("secret_env {var}"),
        SecretSource::File { path } => format!("secret_file {}", path.display()),
        SecretSource::Inline { .. } => format!("inline secret secrets[{index}]"),
    }
}

fn load_one(index: usize, source: &SecretSource) -> Result<Secret, SecretError> {
    match source {
        SecretSource::Env { var } => match std::env::var(var) {
            Ok(v) if !v.is_empty() => Ok(Secret::new(v.as_bytes())),
            _ => Err(SecretError::Env(var.clone())),
        },
        SecretSource::File { path } => {
            let bytes = std::fs::read(path).map_err(|source| SecretError::File {
                path: path.clone(),
                source,
            })?;
            // Kubernetes secrets and `echo > file` often end in a newline that is not part of
            // the key.
            let trimmed = trim_trailing_newlines(&bytes);
            if trimmed.is_empty() {
                return Err(SecretError::EmptyFile(path.clone()));
            }
            Ok(Secret::new(trimmed))
        }
        SecretSource::Inline { value } if !value.is_empty() => Ok(Secret::new(value.as_bytes())),
        SecretSource::Inline { .. } => Err(SecretError::EmptyInline(index)),
    }
}

fn trim_trailing_newlines(bytes: &[u8]) -> &[u8] {
    let end = bytes
        .iter()
        .rposition(|b| *b != b'\n' && *b != b'\r')
        .map_or(0, |i| i + 1);
    &bytes[..end]
}

/// The active secrets of one route, replaced as a whole on reload so a request always sees
/// one consistent list.
#[derive(Debug)]
pub struct RouteSecrets {
    sources: Vec<SecretSource>,
    current: RwLock<Arc<Vec<Secret>>>,
}

impl RouteSecrets {
    /// Loads the route's secrets; fails if any source cannot be read.
    pub fn new(sources: Vec<SecretSource>) -> Result<Self, SecretError> {
        let loaded = load(&sources)?;
        Ok(Self {
            sources,
            current: RwLock::new(Arc::new(loaded)),
        })
    }

    /// The secrets in force now.
    pub fn current(&self) -> Arc<Vec<Secret>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Re-reads every source. On failure the old secrets stay in force. Returns whether
    /// anything changed.
    pub fn reload(&self) -> Result<bool, SecretError> {
        let fresh = load(&self.sources)?;
        let mut guard = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let changed = **guard != fresh;
        if changed {
            *guard = Arc::new(fresh);
        }
        Ok(changed)
    }

    /// The sources whose secret is shorter than [`MIN_SECRET_BYTES`], described for a
    /// warning.
    pub fn short(&self) -> Vec<String> {
        let current = self.current();
        self.sources
            .iter()
            .zip(current.iter())
            .enumerate()
            .filter(|(_, (_, secret))| secret.expose().len() < MIN_SECRET_BYTES)
            .map(|(i, (source, _))| describe(i, source))
            .collect()
    }

    /// Files among the sources, to watch for in-place rotation.
    pub fn files(&self) -> impl Iterator<Item = &PathBuf> {
        self.sources.iter().filter_map(|s| match s {
            SecretSource::File { path } => Some(path),
            _ => None,
        })
    }

    /// Whether any secret is written inline in the config (development only).
    pub fn has_inline(&self) -> bool {
        self.sources
            .iter()
            .any(|s| matches!(s, SecretSource::Inline { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_secret_drops_trailing_newline_and_reloads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        std::fs::write(&path, "first\n").expect("write");
        let rs = RouteSecrets::new(vec![SecretSource::File { path: path.clone() }]).expect("loads");
        assert_eq!(rs.current()[0].expose(), b"first");
        std::fs::write(&path, "second").expect("write");
        assert!(rs.reload().expect("reload"));
        assert_eq!(rs.current()[0].expose(), b"second");
        std::fs::remove_file(&path).expect("rm");
        assert!(rs.reload().is_err());
        assert_eq!(
            rs.current()[0].expose(),
            b"second",
            "old secret stays on failure"
        );
    }

    #[test]
    fn an_empty_secret_from_any_source_is_refused_and_reload_keeps_the_old_set() {
        let inline = load(&[SecretSource::Inline {
            value: String::new(),
        }])
        .expect_err("empty inline");
        assert!(inline.to_string().contains("secrets[0]"), "{inline}");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        std::fs::write(&path, "a-long-enough-secret-value\n").expect("write");
        let rs = RouteSecrets::new(vec![SecretSource::File { path: path.clone() }]).expect("loads");
        assert!(rs.short().is_empty());
        std::fs::write(&path, "\n").expect("write");
        let e = rs.reload().expect_err("an emptied file is refused");
        assert!(e.to_string().contains("is empty"), "{e}");
        assert_eq!(rs.current()[0].expose(), b"a-long-enough-secret-value");
        std::fs::write(&path, "short").expect("write");
        assert!(rs.reload().expect("a short secret loads"));
        assert_eq!(rs.short(), vec![format!("secret_file {}", path.display())]);
    }

    #[test]
    fn missing_env_is_named_and_debug_is_redacted() {
        let e = load(&[SecretSource::Env {
            var: "HOOKGATE_TEST_SURELY_UNSET".into(),
        }])
        .expect_err("unset");
        assert!(e.to_string().contains("HOOKGATE_TEST_SURELY_UNSET"));
        assert_eq!(format!("{:?}", Secret::new(b"abc")), "[redacted]");
    }
}
