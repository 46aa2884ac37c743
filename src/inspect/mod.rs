//! # `hookgate inspect`
//!
//! Answers the support question "what happened to my webhook?": what the state store knows
//! about one event, request, message or contact of a route, from the decision records of
//! the dedup marks (`state::decision`) and the guard state (`guard::stored`).
//!
//! ## What it promises
//!
//! The same reports come from the running gateway (the admin API reads its
//! [`StateStore`](crate::state::StateStore)) and from a stopped store read offline
//! ([`OfflineState`](crate::state::offline::OfflineState)); an id that cannot be one of the
//! route's is refused with the reason before anything is read.
//!
//! ## Where to start reading
//!
//! [`Inspector::answer`] (`inspector.rs`) builds a [`Report`] (`report.rs`) for a
//! [`Query`] (`query.rs`) from a [`Lookup`] (`lookup.rs`); `render.rs` writes it as text.

mod inspector;
mod lookup;
mod query;
mod render;
mod report;

pub use inspector::Inspector;
pub use lookup::Lookup;
pub use query::{InspectError, Query};
pub use render::render;
pub use report::{
    Answer, ContactReport, EventReport, GuardEventReport, MarkReport, MessageReport, RecordReport,
    Report, RequestReport,
};
