//! Which backend runs, decided once before any port is bound: `dedup.backend` read into a
//! [`BackendChoice`], with the Redis target and its sentinels' password checked, so
//! `check-config` and the start refuse the same settings.

use crate::config::{Backend, Config};
use crate::state::redis::RedisTarget;

/// A backend choice checked before any port is bound.
#[derive(Clone)]
pub enum BackendChoice {
    /// The local journal.
    Local,
    /// Redis at this target.
    Redis(Box<RedisTarget>),
}

impl BackendChoice {
    /// Checks the backend settings of a config (a bad Redis URL is a config error).
    pub fn from_config(config: &Config) -> Result<Self, String> {
        match config.dedup.backend {
            Backend::Local => Ok(BackendChoice::Local),
            Backend::Redis => Ok(BackendChoice::Redis(Box::new(RedisTarget::new(
                &config.redis,
                sentinel_password(&config.redis)?,
            )?))),
        }
    }
}

/// The sentinels' password from its source (`redis.sentinel_password_env` or `_file`),
/// trailing line breaks of a file removed.
fn sentinel_password(config: &crate::config::Redis) -> Result<Option<String>, String> {
    let password = if let Some(var) = &config.sentinel_password_env {
        std::env::var(var).map_err(|_| {
            format!("redis.sentinel_password_env: environment variable {var} is not set")
        })?
    } else if let Some(path) = &config.sentinel_password_file {
        std::fs::read_to_string(path)
            .map_err(|e| {
                format!(
                    "redis.sentinel_password_file: cannot read {}: {e}",
                    path.display()
                )
            })?
            .trim_end_matches(['\r', '\n'])
            .to_owned()
    } else {
        return Ok(None);
    };
    if password.is_empty() {
        return Err("redis: the sentinel password is empty".into());
    }
    Ok(Some(password))
}
