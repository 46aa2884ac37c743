//! The admin endpoints: `/healthz`, `/readyz`, `/metrics`, and the spool's (`/spool`,
//! `/spool/parked`, for `hookgate spool`). Answers only; `http` serves them.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::http::token::AdminToken;
use crate::liveness::Liveness;
use crate::metrics::{Format, Metrics};
use crate::outbox::publish::Publisher;
use crate::outbox::spool::{Spool, SpoolError};
use crate::reconcile::{Reconcilers, RunError};
use crate::state::StateStore;

/// Path of the spool status endpoint.
pub const SPOOL_PATH: &str = "/spool";
/// Path of the parked entries: `GET` lists them, `POST {PARKED_PATH}/<id>/republish` puts
/// one back in the spool, `DELETE {PARKED_PATH}/<id>` deletes one.
pub const PARKED_PATH: &str = "/spool/parked";
/// Last path segment of a republish request.
pub const REPUBLISH: &str = "republish";
/// Path of the reconcilers' status: `GET` lists each route's; `POST
/// {RECONCILE_PATH}/<route>/run[/<seconds>]` asks for a walk now (reaching back that many
/// seconds).
pub const RECONCILE_PATH: &str = "/reconcile";

/// An answer: status code, content type, body.
pub type Answer = (u16, &'static str, String);

/// One admin request, as `http` hands it over.
pub struct AdminRequest<'a> {
    /// `GET`, `POST`, `DELETE`, ...
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The `Accept` header, if any: `/metrics` answers OpenMetrics when it asks for it.
    pub accept: Option<&'a str>,
    /// Whether the peer is on this host. Changing the spool is only allowed from there:
    /// the admin listener is often reachable from the whole cluster network.
    pub from_loopback: bool,
    /// The `Authorization` header, if any: changing the spool also needs the admin token,
    /// as every container of the pod and every port-forward is a loopback peer.
    pub authorization: Option<&'a str>,
}

/// The parts whose health the admin endpoints report.
pub struct Health {
    /// Dedup and guard state.
    pub state: Arc<StateStore>,
    /// The spool.
    pub spool: Arc<Spool>,
    /// The broker connection.
    pub publisher: Publisher,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// The clock of the spool's ages.
    pub clock: Clock,
    /// Whether a part needs a restart: `/healthz` fails then.
    pub liveness: Liveness,
}

/// What the admin endpoints look at.
pub struct Admin {
    /// The parts they report on.
    pub health: Health,
    /// Cancelled the moment shutdown starts: readiness goes 503 at once.
    pub shutdown: CancellationToken,
    /// The routes' reconcilers.
    pub reconcile: Arc<Reconcilers>,
    /// The token spool changes must present; `None` (no `admin.token_file`) refuses them.
    pub token: Option<AdminToken>,
}

impl Admin {
    /// Answers any admin request: `GET`s through [`Admin::respond`], and the operator's
    /// changes to parked spool entries.
    pub async fn handle(&self, req: AdminRequest<'_>) -> Answer {
        if req.method == "GET" {
            if req.path == "/metrics" {
                return self.metrics(Format::from_accept(req.accept));
            }
            return self.respond(req.path);
        }
        if let Some(rest) = req
            .path
            .strip_prefix(RECONCILE_PATH)
            .and_then(|r| r.strip_prefix('/'))
        {
            return self.run_reconcile(&req, rest);
        }
        let Some(rest) = req
            .path
            .strip_prefix(PARKED_PATH)
            .and_then(|r| r.strip_prefix('/'))
        else {
            return (405, "text/plain", "method not allowed\n".into());
        };
        let (id_text, action) = match rest.split_once('/') {
            Some((id, action)) => (id, Some(action)),
            None => (rest, None),
        };
        let republish = match (req.method, action) {
            ("POST", Some(REPUBLISH)) => true,
            ("DELETE", None) => false,
            _ => return (405, "text/plain", "method not allowed\n".into()),
        };
        if let Some(refused) = self.refuse_change(&req, "changing parked entries") {
            return refused;
        }
        let Ok(id) = id_text.parse::<u64>() else {
            return (400, "text/plain", "the entry id must be a number\n".into());
        };
        let spool = &self.health.spool;
        let done = if republish {
            spool.republish(id).await
        } else {
            spool.delete_parked(id).await
        };
        match done {
            Ok(()) => (200, "text/plain", "ok\n".into()),
            Err(e @ SpoolError::NotParked(_)) => (404, "text/plain", format!("{e}\n")),
            Err(e @ SpoolError::Undecodable(_)) => (409, "text/plain", format!("{e}\n")),
            Err(e) => (500, "text/plain", format!("{e}\n")),
        }
    }

    /// `POST <route>/run[/<seconds>]`: a walk of `route` now.
    fn run_reconcile(&self, req: &AdminRequest<'_>, rest: &str) -> Answer {
        let mut parts = rest.split('/');
        let (Some(route), Some("run"), since, None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return (404, "text/plain", "not found\n".into());
        };
        if req.method != "POST" {
            return (405, "text/plain", "method not allowed\n".into());
        }
        if let Some(refused) = self.refuse_change(req, "asking for a walk") {
            return refused;
        }
        let since = match since.map(str::parse::<u64>) {
            None => None,
            Some(Ok(secs)) => Some(std::time::Duration::from_secs(secs)),
            Some(Err(_)) => {
                return (
                    400,
                    "text/plain",
                    "since must be a number of seconds\n".into(),
                )
            }
        };
        match self.reconcile.run_now(route, since) {
            Ok(()) => (200, "text/plain", "walk asked for\n".into()),
            Err(e @ RunError::NoSuchRoute(_)) => (404, "text/plain", format!("{e}\n")),
            Err(e) => (409, "text/plain", format!("{e}\n")),
        }
    }

    /// The answer refusing `action` (changing the spool's parked entries, asking for a
    /// reconcile walk), unless it comes from the gateway's own host with the admin token.
    fn refuse_change(&self, req: &AdminRequest<'_>, action: &str) -> Option<Answer> {
        let refusal = if !req.from_loopback {
            format!("{action} is allowed only from the gateway's own host\n")
        } else {
            match &self.token {
                None => format!("{action} is refused: no admin.token_file is configured\n"),
                Some(token) if !token.allows(req.authorization) => format!(
                    "{action} needs the admin token (Authorization: Bearer, from admin.token_file)\n"
                ),
                Some(_) => return None,
            }
        };
        Some((403, "text/plain", refusal))
    }

    /// Status code, content type and body for a GET of `path`.
    pub fn respond(&self, path: &str) -> Answer {
        match path {
            "/healthz" => match self
                .health
                .liveness
                .restart_reason()
                .or_else(|| self.health.spool.restart_needed())
            {
                None => (200, "text/plain", "ok\n".into()),
                Some(reason) => (503, "text/plain", format!("needs a restart: {reason}\n")),
            },
            "/readyz" => {
                let (ready, why) = self.readiness();
                (
                    if ready { 200 } else { 503 },
                    "text/plain",
                    format!("{why}\n"),
                )
            }
            "/metrics" => self.metrics(Format::Text),
            RECONCILE_PATH => json_answer(&self.reconcile.statuses()),
            SPOOL_PATH => json_answer(&self.health.spool.status((self.health.clock)() / 1000)),
            PARKED_PATH => match self.health.spool.parked_entries() {
                Ok(entries) => json_answer(&entries),
                Err(e) => (500, "text/plain", format!("{e}\n")),
            },
            _ => (404, "text/plain", "not found\n".into()),
        }
    }

    /// `/metrics` in `format`, with the gauges that are set when scraped brought up to date.
    fn metrics(&self, format: Format) -> Answer {
        let metrics = &self.health.metrics;
        if let Some(n) = self.health.state.entries() {
            metrics.state_entries.set(n as i64);
        }
        metrics
            .spool_drainer_stalled
            .set(i64::from(self.health.spool.is_stalled()));
        (200, format.content_type(), metrics.render_as(format))
    }

    /// Ready while not shutting down and either the broker is connected or the spool can
    /// still take events, and the spool drains: while its drainer makes no progress, new
    /// events would only queue behind what it cannot move.
    pub fn readiness(&self) -> (bool, &'static str) {
        if self.shutdown.is_cancelled() {
            return (false, "shutting down");
        }
        if !self.health.state.is_healthy() {
            return (false, "not ready: state store unreachable");
        }
        let spool = &self.health.spool;
        if spool.waits_on_store() {
            return (false, "not ready: the spool cannot be written");
        }
        if spool.is_stalled() {
            return (false, "not ready: the spool drainer is not making progress");
        }
        if self.health.publisher.is_connected() {
            return (true, "ready: broker connected");
        }
        if spool.has_room() {
            return (true, "ready: broker unavailable, spooling");
        }
        (
            false,
            "not ready: broker unavailable and spool full or disabled",
        )
    }
}

/// `value` as a JSON answer; a value that cannot be encoded is a 500 that says so, never an
/// empty 200.
fn json_answer(value: &impl serde::Serialize) -> Answer {
    match serde_json::to_string(value) {
        Ok(body) => (200, "application/json", body),
        Err(e) => (
            500,
            "text/plain",
            format!("cannot encode the answer: {e}\n"),
        ),
    }
}
