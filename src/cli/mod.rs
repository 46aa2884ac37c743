//! The commands that work through the running gateway: the admin requests they make, and
//! `reconcile`.

pub mod admin;
pub mod reconcile;
