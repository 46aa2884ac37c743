//! What a printed config shows in place of secrets and URL passwords.

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
pub(super) const REDACTED: &str = "[redacted]";
