//! # The configuration
//!
//! One YAML file: its schema, its defaults, the rules across its fields, and its redacted
//! print.
//!
//! ## What it promises
//!
//! Parsing is strict: every struct denies unknown keys, and an error names the key path
//! (`limits.max_body_byts`). A config that loads is valid as a whole ([`Config::validate`]
//! runs at every load). No secret is read here (that is [`crate::ingress::secrets`]), so a
//! config can be checked where its secrets do not exist.
//!
//! ## Where to start reading
//!
//! `load.rs` (a file read, parsed and validated), then `schema.rs` (the sections and their
//! defaults), `route.rs` (one route), `validate.rs` (the rules across fields); durations
//! and sizes are read in `units.rs`, secret sources in `secret.rs`, a sender's defaults are
//! filled in by `sender_defaults.rs`.

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
