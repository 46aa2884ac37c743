//! The admin endpoints: `/healthz`, `/readyz`, `/metrics`, and `/spool` (for
//! `hookgate spool status`). Pure answers; `http` serves them.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::pipeline::Pipeline;

/// Path of the spool status endpoint.
pub const SPOOL_PATH: &str = "/spool";

/// What the admin endpoints look at.
pub struct Admin {
    /// The request pipeline (publisher, spool, metrics).
    pub pipeline: Arc<Pipeline>,
    /// Cancelled the moment shutdown starts: readiness goes 503 at once.
    pub shutdown: CancellationToken,
}

impl Admin {
    /// Status code, content type and body for a GET of `path`.
    pub fn respond(&self, path: &str) -> (u16, &'static str, String) {
        match path {
            "/healthz" => (200, "text/plain", "ok\n".into()),
            "/readyz" => {
                let (ready, why) = self.readiness();
                (
                    if ready { 200 } else { 503 },
                    "text/plain",
                    format!("{why}\n"),
                )
            }
            "/metrics" => {
                let metrics = self.pipeline.metrics();
                if let Some(n) = self.pipeline.state().entries() {
                    metrics.state_entries.set(n as i64);
                }
                (
                    200,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    metrics.render(),
                )
            }
            SPOOL_PATH => {
                let status = self.pipeline.spool().status(self.pipeline.now_ms() / 1000);
                (
                    200,
                    "application/json",
                    serde_json::to_string(&status).unwrap_or_default(),
                )
            }
            _ => (404, "text/plain", "not found\n".into()),
        }
    }

    /// Ready while not shutting down and either the broker is connected or the spool can
    /// still take events.
    pub fn readiness(&self) -> (bool, &'static str) {
        if self.shutdown.is_cancelled() {
            return (false, "shutting down");
        }
        if !self.pipeline.state().is_healthy() {
            return (false, "not ready: state store unreachable");
        }
        if self.pipeline.spool().is_stuck() {
            return (false, "not ready: the spool cannot be written");
        }
        if self.pipeline.publisher().is_connected() {
            return (true, "ready: broker connected");
        }
        if self.pipeline.spool().has_room() {
            return (true, "ready: broker unavailable, spooling");
        }
        (
            false,
            "not ready: broker unavailable and spool full or disabled",
        )
    }
}
