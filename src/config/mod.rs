//! The YAML configuration: reading a file, its redacted print, and where each part lives.
//!
//! The schema of the file's sections is in `schema`, one route's in `route`, secret sources
//! in `secret`, durations and sizes in `units`, and the rules across fields in `validate`.
//! Parsing is strict: every struct denies unknown keys, and the error names the key path
//! (`limits.max_body_byts`). Reading secrets from the environment or files happens in
//! [`crate::ingress::secrets`], not here, so a config can be checked without them.

mod amqp;
mod config_error;
mod load;
pub mod reconcile;
mod redact;
pub mod redis;
mod route;
mod schema;
mod secret;
mod sender_defaults;
mod units;
mod validate;

pub use self::redis::Redis;
pub use crate::providers::{CustomSignature, Encoding, Profile};
pub use amqp::{fits_short_string, split_urls, AMQP_SHORT_STRING_MAX};
pub use config_error::ConfigError;
pub use redact::redact_url;
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

#[cfg(test)]
mod tests;
