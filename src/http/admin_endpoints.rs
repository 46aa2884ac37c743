//! The admin endpoints: `/healthz`, `/readyz`, `/metrics`, the spool's (`/spool`,
//! `/spool/parked`, for `hookgate spool`), the reconcilers' (`/reconcile`, for
//! `hookgate reconcile`) and the state's (`/inspect`, for `hookgate inspect`). Answers
//! only; `admin_listener` serves them.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::http::token::AdminToken;
use crate::inspect::{InspectError, Inspector, Query};
use crate::liveness::Liveness;
use crate::metrics::{Format, Metrics};
use crate::outbox::publish::Publisher;
use crate::outbox::spooling::{Spool, SpoolError};
use crate::reconcile::replay_walk::ReplayRequest;
use crate::reconcile::{Reconcilers, ReplayError, RunError};
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
/// Last path segment of a route's replay: `POST {RECONCILE_PATH}/<route>/{REPLAY}?since=<s>
/// [&until=<s>][&events=<type>,…][&dry_run=true]` asks for one (202, its status), `GET`
/// shows the last one.
pub const REPLAY: &str = "replay";
/// Path of `hookgate inspect`'s questions: `GET {INSPECT_PATH}?route=<r>&kind=<event|
/// request|message|contact>&id=<id>[&to=<channel>]` answers the report as JSON. The
/// answer holds senders' data (numbers, ids), so it needs the admin token, from the
/// gateway's own host.
pub const INSPECT_PATH: &str = "/inspect";

/// An answer: status code, content type, body.
pub type Answer = (u16, &'static str, String);

/// One admin request, as `http` hands it over.
pub struct AdminRequest<'a> {
    /// `GET`, `POST`, `DELETE`, ...
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The query, without the `?`, if any.
    pub query: Option<&'a str>,
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
    /// Answers `/inspect` from the state store.
    pub inspector: Inspector,
    /// The token spool changes must present; `None` (no `admin.token_file`) refuses them.
    pub token: Option<AdminToken>,
}

impl Admin {
    /// Answers any admin request: `GET`s through [`Admin::respond`], and the operator's
    /// changes to parked spool entries.
    pub async fn handle(&self, req: AdminRequest<'_>) -> Answer {
        if let Some(route) = replay_route(req.path) {
            return self.replay(&req, route);
        }
        if req.path == INSPECT_PATH {
            return self.inspect(&req).await;
        }
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

    /// `GET` or `POST <route>/replay`: the last replay of `route`, or a new one.
    fn replay(&self, req: &AdminRequest<'_>, route: &str) -> Answer {
        match req.method {
            "GET" => match self.reconcile.replay_status(route) {
                Ok(Some(status)) => json_answer(&status),
                Ok(None) => (
                    404,
                    "text/plain",
                    format!("no replay of route {route} yet\n"),
                ),
                Err(e) => (404, "text/plain", format!("{e}\n")),
            },
            "POST" => {
                if let Some(refused) = self.refuse_change(req, "asking for a replay") {
                    return refused;
                }
                let request = match replay_request(req.query.unwrap_or("")) {
                    Ok(r) => r,
                    Err(why) => return (400, "text/plain", format!("{why}\n")),
                };
                let now_ms = (self.health.clock)();
                match self.reconcile.replay(route, &request, now_ms) {
                    Ok(status) => {
                        let (_, content_type, body) = json_answer(&status);
                        (202, content_type, body)
                    }
                    Err(e @ ReplayError::Run(RunError::NoSuchRoute(_))) => {
                        (404, "text/plain", format!("{e}\n"))
                    }
                    Err(e @ ReplayError::Request(_)) => (400, "text/plain", format!("{e}\n")),
                    Err(e) => (409, "text/plain", format!("{e}\n")),
                }
            }
            _ => (405, "text/plain", "method not allowed\n".into()),
        }
    }

    /// `GET /inspect?…`: what the state store knows about one event, request, message or
    /// contact. 400 for a question that cannot be asked (an id of the wrong shape), 404
    /// for an unknown route; what the store does not know is an answer (200), said as such.
    async fn inspect(&self, req: &AdminRequest<'_>) -> Answer {
        if req.method != "GET" {
            return (405, "text/plain", "method not allowed\n".into());
        }
        if let Some(refused) = self.refuse_change(req, "inspecting the state") {
            return refused;
        }
        let (mut route, mut kind, mut id, mut to) = (None, None, None, None);
        for (name, value) in form_urlencoded::parse(req.query.unwrap_or("").as_bytes()) {
            let slot = match name.as_ref() {
                "route" => &mut route,
                "kind" => &mut kind,
                "id" => &mut id,
                "to" => &mut to,
                other => return (400, "text/plain", format!("unknown parameter {other:?}\n")),
            };
            *slot = Some(value.into_owned());
        }
        let (Some(route), Some(kind), Some(id)) = (route, kind, id) else {
            return (
                400,
                "text/plain",
                "route, kind and id are required\n".into(),
            );
        };
        let query = match Query::new(&kind, &id, to.as_deref()) {
            Ok(query) => query,
            Err(e) => return (400, "text/plain", format!("{e}\n")),
        };
        let now_ms = (self.health.clock)();
        match self
            .inspector
            .answer(&*self.health.state, &route, &query, now_ms)
            .await
        {
            Ok(mut report) => {
                self.note_parked(&mut report);
                json_answer(&report)
            }
            Err(e @ InspectError::NoRoute(_)) => (404, "text/plain", format!("{e}\n")),
            Err(e @ InspectError::Store(_)) => (503, "text/plain", format!("{e}\n")),
            Err(e) => (400, "text/plain", format!("{e}\n")),
        }
    }

    /// Names the parked spool entry of a spooled event in `report`, if the spool parked
    /// it (the record says only that it was spooled).
    fn note_parked(&self, report: &mut crate::inspect::Report) {
        let Some(event) = report.event_mut() else {
            return;
        };
        let spooled = event
            .record
            .as_ref()
            .is_some_and(|r| r.delivery.as_deref() == Some("spooled"));
        if !spooled {
            return;
        }
        if let Ok(entries) = self.health.spool.parked_entries() {
            event.parked = entries
                .iter()
                .find(|p| p.event_id.as_deref() == Some(event.event_id.as_str()))
                .map(|p| format!("entry {} ({})", p.id, p.reason));
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
        if let Some(n) = self.health.state.damaged_runs() {
            metrics.state_runs_damaged.set(n as i64);
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

/// The route of a `{RECONCILE_PATH}/<route>/{REPLAY}` path.
fn replay_route(path: &str) -> Option<&str> {
    let rest = path.strip_prefix(RECONCILE_PATH)?.strip_prefix('/')?;
    let route = rest.strip_suffix(REPLAY)?.strip_suffix('/')?;
    (!route.is_empty() && !route.contains('/')).then_some(route)
}

/// A replay request of a query: `since` and `until` in seconds back from now, `events` a
/// comma list, `dry_run` `true` or `false`. Pure.
fn replay_request(query: &str) -> Result<ReplayRequest, String> {
    let secs = |name: &str, v: &str| {
        v.parse::<u64>()
            .map(std::time::Duration::from_secs)
            .map_err(|_| format!("{name} must be a number of seconds"))
    };
    let (mut since, mut until, mut events, mut dry_run) = (None, None, Vec::new(), false);
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        match name.as_ref() {
            "since" => since = Some(secs("since", &value)?),
            "until" => until = Some(secs("until", &value)?),
            "events" => events.extend(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .map(str::to_owned),
            ),
            "dry_run" => {
                dry_run = value
                    .parse()
                    .map_err(|_| "dry_run must be true or false".to_owned())?
            }
            other => return Err(format!("unknown parameter {other:?}")),
        }
    }
    Ok(ReplayRequest {
        since: since.ok_or("since is required")?,
        until,
        events,
        dry_run,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_replay_path_names_its_route() {
        assert_eq!(replay_route("/reconcile/botix/replay"), Some("botix"));
        for other in [
            "/reconcile/replay",
            "/reconcile//replay",
            "/reconcile/a/b/replay",
            "/reconcile/botix/run",
            "/reconcile/botixreplay",
        ] {
            assert_eq!(replay_route(other), None, "{other}");
        }
    }

    #[test]
    fn a_replay_query_is_read_and_a_bad_one_refused() {
        let r = replay_request(
            "since=21600&until=3600&events=message.status,%20message.received&dry_run=true",
        )
        .expect("request");
        assert_eq!(
            r,
            ReplayRequest {
                since: Duration::from_secs(21_600),
                until: Some(Duration::from_secs(3600)),
                events: vec!["message.status".into(), "message.received".into()],
                dry_run: true,
            }
        );
        let r = replay_request("since=60").expect("request");
        assert_eq!((r.until, r.events.len(), r.dry_run), (None, 0, false));
        for (query, why) in [
            ("", "since is required"),
            ("since=6h", "since must be a number of seconds"),
            ("since=60&until=-1", "until must be a number of seconds"),
            ("since=60&dry_run=yes", "dry_run must be true or false"),
            ("since=60&force=1", "unknown parameter \"force\""),
        ] {
            assert_eq!(replay_request(query), Err(why.to_owned()), "{query}");
        }
    }
}
