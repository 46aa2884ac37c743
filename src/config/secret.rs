//! Where a route's secrets come from: a mapping with exactly one of `secret_env`,
//! `secret_file` and `secret`, printed with an inline value redacted.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::redact::REDACTED;

/// Where one secret comes from. The file writes it as a mapping with exactly one of the
/// keys `secret_env`, `secret_file` and `secret`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SecretKeys")]
pub enum SecretSource {
    /// `secret_env`: the name of an environment variable holding the secret.
    Env { var: String },
    /// `secret_file`: the path of a file holding the secret (a mounted Kubernetes secret);
    /// a trailing newline is ignored.
    File { path: PathBuf },
    /// `secret`: the secret inline; for development only, warned about at start.
    Inline { value: String },
}

/// The keys of a secret source as written in the file; [`SecretSource`] takes exactly one.
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with one of secret_env, secret_file, secret"
)]
struct SecretKeys {
    secret_env: Option<String>,
    secret_file: Option<PathBuf>,
    secret: Option<String>,
}

impl TryFrom<SecretKeys> for SecretSource {
    type Error = String;

    fn try_from(keys: SecretKeys) -> Result<Self, String> {
        match keys {
            SecretKeys {
                secret_env: Some(var),
                secret_file: None,
                secret: None,
            } => Ok(Self::Env { var }),
            SecretKeys {
                secret_env: None,
                secret_file: Some(path),
                secret: None,
            } => Ok(Self::File { path }),
            SecretKeys {
                secret_env: None,
                secret_file: None,
                secret: Some(value),
            } => Ok(Self::Inline { value }),
            keys => {
                let found: Vec<&str> = [
                    ("secret_env", keys.secret_env.is_some()),
                    ("secret_file", keys.secret_file.is_some()),
                    ("secret", keys.secret.is_some()),
                ]
                .into_iter()
                .filter_map(|(key, set)| set.then_some(key))
                .collect();
                let found = match found.split_last() {
                    None => "none".to_owned(),
                    Some((last, [])) => (*last).to_owned(),
                    Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                };
                Err(format!(
                    "exactly one of secret_env, secret_file, secret is required, found {found}"
                ))
            }
        }
    }
}

impl Serialize for SecretSource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        match self {
            Self::Env { var } => map.serialize_entry("secret_env", var)?,
            Self::File { path } => map.serialize_entry("secret_file", path)?,
            Self::Inline { .. } => map.serialize_entry("secret", REDACTED)?,
        }
        map.end()
    }
}

impl std::fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Env { var } => f.debug_struct("Env").field("var", var).finish(),
            Self::File { path } => f.debug_struct("File").field("path", path).finish(),
            Self::Inline { .. } => f.debug_struct("Inline").field("value", &REDACTED).finish(),
        }
    }
}
