//! A route's `reconcile:` block (contract §10): where the sender's list API is, where its
//! key comes from, and how often and how far back to walk it; with the rules across fields.

use std::num::{NonZeroU16, NonZeroU32};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use url::Url;

use super::units::{duration, positive};

/// Most items the Botix list API gives in one page (`cursor_limit`).
pub const MAX_PAGE_SIZE: u16 = 200;
/// Most tries of one request on 429, 5xx or a timeout.
pub const MAX_RETRIES_LIMIT: u32 = 10;

/// Reconciliation of one route with its sender's list API. Off unless present.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Reconcile {
    /// The list endpoint, e.g. `https://api.botix.pro/public/v1/messages` (http or https),
    /// parsed as the file is read into the form the HTTP client takes.
    pub url: Url,
    /// Environment variable holding the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
    /// File holding the API key (a mounted Kubernetes secret); re-read when it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Time between the starts of two walks. Default 1h.
    #[serde(default = "default_interval", with = "duration")]
    pub interval: Duration,
    /// How far back a walk reaches; at most `dedup.ttl`. Default 26h (the sender's retry
    /// window and an hour more).
    #[serde(default = "default_lookback", with = "duration")]
    pub lookback: Duration,
    /// Items asked for per page (`cursor_limit`), 1 to 200. Default 200.
    #[serde(
        default = "default_page_size",
        deserialize_with = "positive::deserialize"
    )]
    pub page_size: NonZeroU16,
    /// Deadline of one request. Default 30s.
    #[serde(default = "default_timeout", with = "duration")]
    pub timeout: Duration,
    /// Below this `X-RateLimit-Remaining`, the next request waits for `X-RateLimit-Reset`.
    /// Default 5.
    #[serde(default = "default_min_remaining")]
    pub min_remaining: u32,
    /// Tries of one request on 429, 5xx or a timeout, 1 to 10. Default 5.
    #[serde(
        default = "default_max_retries",
        deserialize_with = "positive::deserialize"
    )]
    pub max_retries: NonZeroU32,
    /// Longest wait between two tries of one request. Default 60s.
    #[serde(default = "default_max_backoff", with = "duration")]
    pub max_backoff: Duration,
}

fn default_interval() -> Duration {
    Duration::from_secs(3600)
}
fn default_lookback() -> Duration {
    Duration::from_secs(26 * 3600)
}
fn default_page_size() -> NonZeroU16 {
    NonZeroU16::new(MAX_PAGE_SIZE).unwrap_or(NonZeroU16::MIN)
}
fn default_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_min_remaining() -> u32 {
    5
}
fn default_max_retries() -> NonZeroU32 {
    NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN)
}
fn default_max_backoff() -> Duration {
    Duration::from_secs(60)
}

impl Reconcile {
    /// The rules across fields; `at` is the block's key path, `ttl` is `dedup.ttl`. The
    /// message names the key.
    pub fn validate(&self, at: &str, ttl: Duration) -> Result<(), String> {
        if !["https", "http"].contains(&self.url.scheme()) {
            return Err(format!("{at}.url: must be an http:// or https:// URL"));
        }
        match (&self.token_env, &self.token_file) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{at}: give the API key by token_env or token_file, not both"
                ))
            }
            (None, None) => {
                return Err(format!(
                    "{at}: the API key is required: token_env or token_file"
                ))
            }
            (Some(var), None) if var.is_empty() => {
                return Err(format!("{at}.token_env: must name a variable"))
            }
            _ => {}
        }
        if self.interval < Duration::from_secs(1) {
            return Err(format!("{at}.interval: must be at least 1s"));
        }
        if self.lookback.is_zero() {
            return Err(format!("{at}.lookback: must be positive"));
        }
        // Dedup must still recognise what a walk lists: an item older than its marks would
        // be published again (and the freshness check would drop it as expired anyway).
        if self.lookback > ttl {
            return Err(format!(
                "{at}.lookback: {} is longer than dedup.ttl ({}); dedup could not recognise what a walk finds",
                humantime::format_duration(self.lookback),
                humantime::format_duration(ttl)
            ));
        }
        if self.page_size.get() > MAX_PAGE_SIZE {
            return Err(format!("{at}.page_size: must be 1 to {MAX_PAGE_SIZE}"));
        }
        if self.timeout.is_zero() {
            return Err(format!("{at}.timeout: must be positive"));
        }
        if self.max_retries.get() > MAX_RETRIES_LIMIT {
            return Err(format!(
                "{at}.max_retries: must be 1 to {MAX_RETRIES_LIMIT}"
            ));
        }
        if self.max_backoff < Duration::from_secs(1) {
            return Err(format!("{at}.max_backoff: must be at least 1s"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn config(block: &str, extra: &str) -> Result<Config, String> {
        let text = format!(
            "listen:\n  addr: 127.0.0.1:0\n{extra}routes:\n  - name: botix\n    path: /b\n    secrets: [{{secret_env: S}}]\n    reconcile:\n{block}"
        );
        Config::parse(&text).map_err(|e| e.to_string())
    }

    fn refused(block: &str, extra: &str) -> String {
        match config(block, extra) {
            Ok(_) => panic!("accepted: {block}"),
            Err(e) => e,
        }
    }

    const MINIMAL: &str =
        "      url: https://api.example/public/v1/messages\n      token_env: KEY\n";

    #[test]
    fn defaults_are_the_contracts() {
        let c = config(MINIMAL, "").expect("config");
        let r = c.routes[0].reconcile.as_ref().expect("block");
        assert_eq!(r.interval.as_secs(), 3600);
        assert_eq!(r.lookback.as_secs(), 26 * 3600);
        assert_eq!(r.page_size.get(), 200);
        assert_eq!(r.timeout.as_secs(), 30);
        assert_eq!(r.min_remaining, 5);
        assert_eq!(r.max_retries.get(), 5);
        assert_eq!(r.max_backoff.as_secs(), 60);
    }

    #[test]
    fn a_route_without_the_block_does_not_reconcile() {
        let c = Config::parse(
            "listen:\n  addr: 127.0.0.1:0\nroutes:\n  - name: b\n    path: /b\n    secrets: [{secret_env: S}]\n",
        )
        .expect("config");
        assert!(c.routes[0].reconcile.is_none());
    }

    #[test]
    fn lookback_longer_than_the_dedup_ttl_is_refused() {
        let e = refused(&format!("{MINIMAL}      lookback: 73h\n"), "");
        assert!(e.contains("routes[0].reconcile.lookback"), "{e}");
        assert!(e.contains("dedup.ttl"), "{e}");
        let e = refused(
            &format!("{MINIMAL}      lookback: 26h\n"),
            "dedup:\n  ttl: 24h\n",
        );
        assert!(e.contains("lookback"), "{e}");
        assert!(config(&format!("{MINIMAL}      lookback: 72h\n"), "").is_ok());
    }

    #[test]
    fn each_bad_value_is_named() {
        let cases = [
            ("      url: ftp://x\n      token_env: K\n", "reconcile.url"),
            ("      url: https://x\n", "token_env or token_file"),
            (
                "      url: https://x\n      token_env: K\n      token_file: /k\n",
                "not both",
            ),
            ("      url: https://x\n      token_env: ''\n", "token_env"),
            (&format!("{MINIMAL}      page_size: 201\n"), "page_size"),
            (&format!("{MINIMAL}      page_size: 0\n"), "page_size"),
            (&format!("{MINIMAL}      interval: 0s\n"), "interval"),
            (&format!("{MINIMAL}      timeout: 0s\n"), "timeout"),
            (&format!("{MINIMAL}      max_retries: 0\n"), "max_retries"),
            (&format!("{MINIMAL}      max_retries: 11\n"), "max_retries"),
            (
                &format!("{MINIMAL}      max_backoff: 10ms\n"),
                "max_backoff",
            ),
            (&format!("{MINIMAL}      lookback: 0s\n"), "lookback"),
            (&format!("{MINIMAL}      token: inline\n"), "token"),
        ];
        for (block, named) in cases {
            let e = refused(block, "");
            assert!(e.contains(named), "{block}: {e}");
        }
    }

    #[test]
    fn only_the_botix_profile_reconciles() {
        let text = format!(
            "listen:\n  addr: 127.0.0.1:0\nroutes:\n  - name: t\n    path: /t\n    profile: telnyx\n    secrets: [{{secret_env: S}}]\n    reconcile:\n{MINIMAL}"
        );
        let e = Config::parse(&text)
            .expect_err("telnyx refused")
            .to_string();
        assert!(e.contains("profile botix"), "{e}");
    }

    #[test]
    fn every_key_is_read() {
        let c = config(
            "      url: http://127.0.0.1:9/m\n      token_file: /run/key\n      interval: 10m\n      lookback: 2h\n      page_size: 50\n      timeout: 5s\n      min_remaining: 2\n      max_retries: 3\n      max_backoff: 20s\n",
            "",
        )
        .expect("config");
        let r = c.routes[0].reconcile.as_ref().expect("block");
        assert_eq!(
            r.token_file.as_deref(),
            Some(std::path::Path::new("/run/key"))
        );
        assert_eq!(
            (
                r.interval.as_secs(),
                r.lookback.as_secs(),
                r.page_size.get(),
                r.timeout.as_secs()
            ),
            (600, 7200, 50, 5)
        );
        assert_eq!(
            (
                r.min_remaining,
                r.max_retries.get(),
                r.max_backoff.as_secs()
            ),
            (2, 3, 20)
        );
        let printed = c.redacted_yaml();
        assert!(printed.contains("token_file: /run/key"), "{printed}");
    }
}
