//! The commands of the `hookgate` binary, a file each with its arguments and its body:
//! `run`, `check-config`, `sign`, `spool`, `reconcile` (with its `replay`) and `inspect`;
//! the admin requests they make to a running gateway, how they exit, and logging.

pub mod admin;
pub mod check_config;
pub mod exit;
pub mod inspect;
pub mod logging;
pub mod reconcile;
pub mod replay;
pub mod run;
pub mod sign;
pub mod spool;
