//! The commands of the `hookgate` binary besides `run`: `sign`, `spool`, `reconcile`
//! (with its `replay`) and `inspect`, the admin requests they make to a running gateway,
//! and logging.

pub mod admin;
pub mod inspect;
pub mod logging;
pub mod reconcile;
pub mod replay;
pub mod sign;
pub mod spool;
