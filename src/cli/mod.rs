//! # The `hookgate` commands
//!
//! A file per command, with its clap arguments beside its body: `run`, `check-config`,
//! `sign`, `spool`, `reconcile` (with its `replay`) and `inspect`; the admin requests they
//! make to a running gateway (`admin`), how they exit (`exit`), and logging (`logging`, with
//! `span_fields`).
//!
//! ## What it promises
//!
//! A bad argument or config exits 64 with a message naming it; a command that reads the
//! store asks a running gateway first and opens the store itself only when none answers.
//!
//! ## Where to start reading
//!
//! `main.rs` parses and dispatches; `run.rs` starts the gateway.

pub mod admin;
pub mod check_config;
pub mod exit;
pub mod inspect;
mod log_filter;
pub mod logging;
pub mod reconcile;
pub mod replay;
pub mod run;
pub mod sign;
mod span_fields;
pub mod spool;
