//! The admin token: the shared secret that, with a loopback peer, allows changing the
//! spool through the admin listener. Read from `admin.token_file`, compared in constant
//! time, never printed.

use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq;

/// What is printed in place of the token.
const REDACTED: &str = "[redacted]";

/// The admin token. `Debug` and `Display` print `[redacted]`; only [`AdminToken::expose`]
/// gives the text, for the CLI's `Authorization` header.
#[derive(Clone)]
pub struct AdminToken(String);

/// Why the token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read admin.token_file {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("admin.token_file {0} is empty")]
    Empty(PathBuf),
}

impl AdminToken {
    /// Reads the token from `path`; surrounding whitespace (a trailing newline) is not part
    /// of it. An empty file is an error: anyone would match it.
    pub fn read(path: &Path) -> Result<Self, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::File {
            path: path.to_owned(),
            source,
        })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(TokenError::Empty(path.to_owned()));
        }
        Ok(Self(token.to_owned()))
    }

    /// The token's text, for the request header only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether an `Authorization` header value is `Bearer <this token>`. The token bytes
    /// are compared in constant time, so the answer's timing does not tell how many leading
    /// bytes of a guess were right (only whether its length was).
    pub fn allows(&self, authorization: Option<&str>) -> bool {
        let Some(given) = authorization.and_then(|v| v.strip_prefix("Bearer ")) else {
            return false;
        };
        bool::from(given.trim().as_bytes().ct_eq(self.0.as_bytes()))
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

impl std::fmt::Display for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token_in(dir: &Path, text: &str) -> Result<AdminToken, TokenError> {
        let path = dir.join("token");
        std::fs::write(&path, text).expect("write");
        AdminToken::read(&path)
    }

    #[test]
    fn the_token_never_prints_and_is_read_trimmed() {
        let dir = tempfile::tempdir().expect("dir");
        let token = token_in(dir.path(), "s3cret-admin\n").expect("token");
        assert_eq!(format!("{token:?} {token}"), "[redacted] [redacted]");
        assert_eq!(token.expose(), "s3cret-admin");
    }

    #[test]
    fn only_the_bearer_of_the_same_token_is_allowed() {
        let dir = tempfile::tempdir().expect("dir");
        let token = token_in(dir.path(), "s3cret-admin").expect("token");
        assert!(token.allows(Some("Bearer s3cret-admin")));
        for refused in [
            None,
            Some(""),
            Some("s3cret-admin"),
            Some("Basic s3cret-admin"),
            Some("Bearer s3cret-admiN"),
            Some("Bearer s3cret-admin2"),
            Some("Bearer s3cret"),
            Some("Bearer "),
        ] {
            assert!(!token.allows(refused), "{refused:?}");
        }
    }

    #[test]
    fn an_empty_or_missing_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("dir");
        let e = token_in(dir.path(), " \n").expect_err("empty");
        assert!(e.to_string().contains("is empty"), "{e}");
        let e = AdminToken::read(&dir.path().join("absent")).expect_err("missing");
        assert!(e.to_string().contains("absent"), "{e}");
    }
}
