//! The webhook endpoint: matches the route, enforces the method, the per-peer limit and the
//! body limits, hands the [`Delivery`] to the pipeline, and maps its [`Outcome`] to status,
//! JSON body and `X-Request-Id`.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::budget::{BodyBudget, Charge};
use crate::clock::Clock;
use crate::config::{Limits, Profile};
use crate::http::connections::{accept_loop, Connections, FullResponse};
use crate::ingress::event::{Delivery, RequestId};
use crate::metrics::{Metrics, RefusalReason, RequestOutcome};
use crate::pipeline::{Outcome, Pipeline, RouteRuntime};
use crate::ratelimit::{PeerLimiter, PeerPrefixes};
use crate::tls::TlsReloader;

/// Bytes taken from the unverified body budget before each chunk is pulled off the
/// connection: an HTTP/2 DATA frame is at most 16 KiB (the default frame size).
const BODY_CHUNK_RESERVE: u64 = 16 * 1024;
/// The answer header that carries the delivery's request id, on every webhook answer.
const X_REQUEST_ID: &str = "x-request-id";

/// What the webhook listener needs per request.
pub struct WebhookService {
    /// The request pipeline.
    pipeline: Arc<Pipeline>,
    /// Connection, refusal and unmatched-request counters.
    metrics: Arc<Metrics>,
    /// Limits from config.
    pub limits: Limits,
    /// Failed verifications per peer address prefix.
    peers: PeerLimiter,
    /// Body bytes held before verification, over all connections.
    budget: BodyBudget,
}

impl WebhookService {
    /// The service of `pipeline` under `limits`; `clock` drives the per-peer limiter.
    pub fn new(
        pipeline: Arc<Pipeline>,
        metrics: Arc<Metrics>,
        limits: Limits,
        clock: Clock,
    ) -> Self {
        let per_peer = &limits.failed_verification_per_peer;
        let prefixes = PeerPrefixes {
            ipv4: limits.failed_verification_ipv4_prefix,
            ipv6: limits.failed_verification_ipv6_prefix,
        };
        let peers = PeerLimiter::new(per_peer, prefixes, clock);
        let budget = BodyBudget::new(
            limits.max_unverified_body_bytes,
            metrics.unverified_body_bytes.clone(),
        );
        Self {
            pipeline,
            metrics,
            limits,
            peers,
            budget,
        }
    }
}

/// Serves webhook connections until `stop`, then lets in-flight requests finish within
/// `grace`.
pub async fn serve_webhooks(
    listener: TcpListener,
    tls: Option<Arc<TlsReloader>>,
    service: Arc<WebhookService>,
    stop: CancellationToken,
    grace: Duration,
) {
    let limits = service.limits.clone();
    let metrics = &service.metrics;
    let closed = metrics.connections_closed.clone();
    let open = metrics.connections_open.clone();
    metrics
        .connections_max
        .set(i64::try_from(limits.max_connections.get()).unwrap_or(i64::MAX));
    let handler = move |peer: SocketAddr, req: Request<Incoming>| {
        let service = service.clone();
        async move {
            // Timed here so early answers (404, 405, 413, 408) count in the histogram too,
            // in the series of their route, made at start-up.
            let started = Instant::now();
            let route = service.pipeline.route(req.uri().path()).cloned();
            let duration = match &route {
                Some(route) => route.counters.duration.clone(),
                None => service.metrics.unmatched_duration(),
            };
            let answer = guarded(handle_webhook(&service, route, peer, req, started)).await;
            duration.observe(started.elapsed().as_secs_f64());
            Ok::<_, Infallible>(answer)
        }
    };
    let conns = Connections::new(limits, tls, closed, open, stop, handler);
    accept_loop(listener, conns, grace).await;
}

/// A panic in one request becomes a 500 for that request, never a dead process. A
/// combinator, not an `async fn`: that would hold `fut` twice, as its argument and as the
/// future it awaits.
fn guarded(fut: impl Future<Output = FullResponse>) -> impl Future<Output = FullResponse> {
    std::panic::AssertUnwindSafe(fut)
        .catch_unwind()
        .map(|caught| {
            caught.unwrap_or_else(|_| {
                tracing::error!("request handler panicked; answered 500");
                with_request_id(
                    json(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        r#"{"error":"internal"}"#.into(),
                        None,
                    ),
                    &RequestId::generated().value,
                )
            })
        })
}

/// Answers `req`, which arrived at `started` for `route` (none: no route has its path).
async fn handle_webhook(
    service: &WebhookService,
    route: Option<Arc<RouteRuntime>>,
    tcp_peer: SocketAddr,
    req: Request<Incoming>,
    started: Instant,
) -> FullResponse {
    let Some(route) = route else {
        service.metrics.count_not_found();
        return not_found(req.headers());
    };
    if req.method() != Method::POST {
        route.counters.count(RequestOutcome::MethodNotAllowed);
        return method_not_allowed(&route, req.headers());
    }
    let peer = peer_ip(
        tcp_peer,
        req.headers(),
        service.limits.peer_address_header.as_deref(),
    );
    if let Err(retry_after) = service.peers.check(peer) {
        // Cheap: the body is never read. Verified deliveries never spend this bucket, so
        // only an address that keeps failing verification meets it.
        service.metrics.refused(RefusalReason::PeerFailures);
        route.counters.count(RequestOutcome::RateLimited);
        return peer_refused(&route, req.headers(), retry_after);
    }
    let (parts, body) = req.into_parts();
    let mut charge = service.budget.charge();
    let body = match read_body(body, &service.limits, &mut charge, &service.metrics).await {
        Ok(b) => b,
        Err(error) => return body_refused(&route, &parts.headers, error),
    };
    let delivery = Delivery {
        headers: parts.headers,
        body,
        query: parts.uri.query().map(str::to_owned),
    };
    // Runs to the end even if the client goes away; a panic in it reaches `guarded`, which
    // turns it into a 500.
    let (outcome, request_id) = service
        .pipeline
        .handle_to_end(route.clone(), delivery, charge)
        .await;
    if outcome == Outcome::InvalidSignature {
        service.peers.failed(peer);
    }
    route.counters.count(outcome.label());
    // The fields are worked out only when the line is written: not a clock read per
    // request for a line that is off.
    tracing::debug!(
        route = %route.config.name,
        outcome = outcome.label().as_str(),
        request_id = request_id.as_ref().and_then(|v| v.to_str().ok()).unwrap_or_default(),
        elapsed_us = started.elapsed().as_micros() as u64,
        "request"
    );
    answer(&outcome, request_id)
}

/// The 404 of a path no route has.
fn not_found(headers: &HeaderMap) -> FullResponse {
    let resp = json(
        StatusCode::NOT_FOUND,
        r#"{"error":"not_found"}"#.into(),
        None,
    );
    with_request_id(resp, &unrouted_request_id(headers))
}

/// The 405 of a method other than POST. Answers given before the pipeline runs echo the
/// same request id the pipeline would.
fn method_not_allowed(route: &RouteRuntime, headers: &HeaderMap) -> FullResponse {
    let mut resp = json(
        StatusCode::METHOD_NOT_ALLOWED,
        r#"{"error":"method_not_allowed"}"#.into(),
        None,
    );
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    with_request_id(resp, &RequestId::of(headers, route.config.profile).value)
}

/// The 429 of a peer over its failed verifications; the body is left unread, so the
/// connection closes.
fn peer_refused(route: &RouteRuntime, headers: &HeaderMap, retry_after: u64) -> FullResponse {
    let resp = close(json(
        StatusCode::TOO_MANY_REQUESTS,
        r#"{"error":"rate_limited"}"#.into(),
        Some(retry_after),
    ));
    with_request_id(resp, &RequestId::of(headers, route.config.profile).value)
}

/// The answer to a body that could not be read whole, counted; the connection closes, so
/// the unread rest of the body is not read as the next request.
fn body_refused(route: &RouteRuntime, headers: &HeaderMap, error: BodyError) -> FullResponse {
    let (outcome, status, body) = match error {
        BodyError::TooLarge => (
            RequestOutcome::TooLarge,
            StatusCode::PAYLOAD_TOO_LARGE,
            r#"{"error":"payload_too_large"}"#,
        ),
        BodyError::Timeout => (
            RequestOutcome::Timeout,
            StatusCode::REQUEST_TIMEOUT,
            r#"{"error":"body_read_timeout"}"#,
        ),
        BodyError::Aborted => (
            RequestOutcome::Aborted,
            StatusCode::BAD_REQUEST,
            r#"{"error":"body_incomplete"}"#,
        ),
    };
    route.counters.count(outcome);
    let resp = json(status, body.into(), None);
    let id = RequestId::of(headers, route.config.profile).value;
    with_request_id(close(resp), &id)
}

enum BodyError {
    TooLarge,
    Timeout,
    Aborted,
}

/// The address `req` came from: the TCP peer, or, when a trusted proxy is configured, the
/// last entry of its header (the address the proxy saw). A missing or unparsable header
/// falls back to the TCP peer.
fn peer_ip(tcp_peer: SocketAddr, headers: &HeaderMap, trusted_header: Option<&str>) -> IpAddr {
    trusted_header
        .and_then(|name| forwarded_ip(headers, name))
        .unwrap_or(tcp_peer.ip())
}

/// The last comma-separated entry of `name`, as an IP address.
fn forwarded_ip(headers: &HeaderMap, name: &str) -> Option<IpAddr> {
    let value = headers.get_all(name).iter().next_back()?.to_str().ok()?;
    value.rsplit(',').next()?.trim().parse().ok()
}

/// Reads the body up to `max_body_bytes`; a declared or actual size over it stops at once.
/// Bytes are taken from the unverified body budget before they are pulled off the
/// connection, so beyond the budget the read waits and the peer's data stays in its socket
/// (HTTP/1) or behind flow control (HTTP/2). All of it is bounded by `body_read_timeout`.
async fn read_body(
    mut body: Incoming,
    limits: &Limits,
    charge: &mut Charge,
    metrics: &crate::metrics::Metrics,
) -> Result<Bytes, BodyError> {
    let max = limits.max_body_bytes.get();
    if body.size_hint().lower() > max {
        return Err(BodyError::TooLarge);
    }
    let waited = AtomicBool::new(false);
    let read = async {
        let declared = body.size_hint().exact().unwrap_or(0).min(max);
        reserve(charge, declared, &waited, metrics).await;
        let mut buf = BytesMut::with_capacity(declared as usize);
        loop {
            let next = (buf.len() as u64 + BODY_CHUNK_RESERVE).min(max + 1);
            reserve(charge, next, &waited, metrics).await;
            let Some(frame) = body.frame().await else {
                break;
            };
            let frame = frame.map_err(|_| BodyError::Aborted)?;
            if let Ok(data) = frame.into_data() {
                let len = buf.len() as u64 + data.len() as u64;
                if len > max {
                    return Err(BodyError::TooLarge);
                }
                reserve(charge, len, &waited, metrics).await;
                buf.extend_from_slice(&data);
            }
        }
        charge.shrink_to(buf.len() as u32);
        Ok(buf.freeze())
    };
    let result = within(limits.body_read_timeout, read)
        .await
        .unwrap_or(Err(BodyError::Timeout));
    if matches!(result, Err(BodyError::Timeout)) && waited.load(Ordering::Relaxed) {
        metrics.refused(RefusalReason::BodyBudget);
    }
    result
}

/// `read`'s output if it ends within `limit`. A body that came with its request head is
/// read whole at the first poll, and then no timer is made (a clock read and a handle to
/// the runtime's timer, per request, for nothing).
async fn within<F: Future>(limit: Duration, read: F) -> Option<F::Output> {
    let started = tokio::time::Instant::now();
    let mut read = std::pin::pin!(read);
    let first = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
    match first {
        Poll::Ready(output) => Some(output),
        Poll::Pending => tokio::time::timeout_at(started + limit, read).await.ok(),
    }
}

/// Grows `charge` to `want` bytes, waiting for the budget if it must; the first wait of a
/// body is counted.
async fn reserve(
    charge: &mut Charge,
    want: u64,
    waited: &AtomicBool,
    metrics: &crate::metrics::Metrics,
) {
    let want = u32::try_from(want).unwrap_or(u32::MAX);
    let missing = want.saturating_sub(charge.bytes());
    if missing > 0 && charge.must_wait(missing) && !waited.swap(true, Ordering::Relaxed) {
        metrics.body_budget_waits.inc();
    }
    charge.grow(missing).await;
}

/// Maps an outcome to the contract §2 answer.
fn answer(outcome: &Outcome, request_id: Option<HeaderValue>) -> FullResponse {
    let (status, body, retry_after) = match outcome {
        Outcome::Accepted { event_id } => (
            StatusCode::OK,
            status_body("accepted", event_id, None),
            None,
        ),
        Outcome::Duplicate { event_id } => (
            StatusCode::OK,
            status_body("duplicate", event_id, None),
            None,
        ),
        Outcome::Dropped { event_id, reason } => (
            StatusCode::OK,
            status_body("dropped", event_id, Some(reason)),
            None,
        ),
        Outcome::InvalidSignature => (
            StatusCode::UNAUTHORIZED,
            r#"{"error":"invalid_signature"}"#.into(),
            None,
        ),
        Outcome::BadRequest(reason) => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({ "error": reason.to_string() })
                .to_string()
                .into(),
            None,
        ),
        Outcome::RateLimited { retry_after } => (
            StatusCode::TOO_MANY_REQUESTS,
            r#"{"error":"rate_limited"}"#.into(),
            Some(*retry_after),
        ),
        Outcome::Unavailable { retry_after } => (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":"unavailable"}"#.into(),
            Some(*retry_after),
        ),
    };
    with_echo(json(status, body, retry_after), request_id)
}

/// Sets `X-Request-Id`.
fn with_request_id(resp: FullResponse, request_id: &str) -> FullResponse {
    with_echo(resp, HeaderValue::from_str(request_id).ok())
}

/// Sets `X-Request-Id` to `echo`. Ids from a sender are checked to be header-safe text when
/// read, so the fallback to a generated id only guards against a value this process never
/// makes.
fn with_echo(mut resp: FullResponse, echo: Option<HeaderValue>) -> FullResponse {
    let value = echo.or_else(|| HeaderValue::from_str(&RequestId::generated().value).ok());
    if let Some(v) = value {
        // From a constant: a name neither parsed nor allocated per answer.
        resp.headers_mut()
            .insert(HeaderName::from_static(X_REQUEST_ID), v);
    }
    resp
}

/// The request id of a request on no route: whichever request id header a built-in
/// profile knows, else a generated one, so a sender posting to a wrong path can still
/// find the answer in its logs.
fn unrouted_request_id(headers: &http::HeaderMap) -> String {
    let botix = RequestId::of(headers, Profile::Botix);
    if botix.from_sender {
        return botix.value;
    }
    RequestId::of(headers, Profile::StandardWebhooks).value
}

/// The body of a 200. A struct of borrowed fields, not a `json!` map: one allocation for
/// the text instead of one per key and value.
#[derive(serde::Serialize)]
struct StatusBody<'a> {
    event_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    status: &'a str,
}

/// The body of a 200, as `serde_json` writes [`StatusBody`]. Texts that need no escape (the
/// ids of every sender hookgate knows) are copied in place into a buffer of the body's
/// exact size, which the answer keeps without a second allocation.
fn status_body(status: &str, event_id: &str, reason: Option<&str>) -> Bytes {
    // JSON escapes the bytes below space, the quote and the backslash, nothing else.
    let plain = |text: &str| text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\');
    if !(plain(status) && plain(event_id) && reason.is_none_or(plain)) {
        let body = StatusBody {
            event_id,
            reason,
            status,
        };
        return serde_json::to_string(&body).unwrap_or_default().into();
    }
    let mut parts = [
        r#"{"event_id":""#,
        event_id,
        "",
        "",
        r#"","status":""#,
        status,
        r#""}"#,
    ];
    if let Some(reason) = reason {
        parts[2] = r#"","reason":""#;
        parts[3] = reason;
    }
    let mut body = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        body.extend_from_slice(part.as_bytes());
    }
    Bytes::from(body)
}

fn json(status: StatusCode, body: Bytes, retry_after: Option<u64>) -> FullResponse {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(secs) = retry_after {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// Asks HTTP/1 to close the connection after this answer: the unread rest of the body must
/// not be read as the next request.
fn close(mut resp: FullResponse) -> FullResponse {
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::event::ParseError;

    async fn body_text(resp: FullResponse) -> String {
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        String::from_utf8(bytes.to_vec()).expect("utf8")
    }

    #[test]
    fn a_200_body_is_the_text_serde_json_writes() {
        for (status, event_id, reason) in [
            ("accepted", "evt_1", None),
            ("dropped", "evt_2", Some("stale_status")),
            ("duplicate", "", None),
            ("accepted", "quote \" back \\ tab \t é \u{7f}", None),
            ("dropped", "evt\n3", Some("stale_status")),
        ] {
            let serde = serde_json::to_string(&StatusBody {
                event_id,
                reason,
                status,
            })
            .expect("serializes");
            assert_eq!(status_body(status, event_id, reason), serde.as_bytes());
        }
    }

    #[tokio::test]
    async fn outcomes_map_to_the_spec_answers() {
        let a = answer(
            &Outcome::Accepted {
                event_id: "e".into(),
            },
            Some(HeaderValue::from_static("r1")),
        );
        assert_eq!(a.status(), 200);
        assert_eq!(a.headers()["x-request-id"], "r1");
        assert_eq!(a.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(
            body_text(a).await,
            r#"{"event_id":"e","status":"accepted"}"#
        );
        let echo = |id: &'static str| Some(HeaderValue::from_static(id));
        let d = answer(
            &Outcome::Dropped {
                event_id: "e".into(),
                reason: "stale_status",
            },
            Some(HeaderValue::from_static("r")),
        );
        let v: serde_json::Value = serde_json::from_str(&body_text(d).await).expect("json");
        assert_eq!(v["reason"], "stale_status");
        assert_eq!(answer(&Outcome::InvalidSignature, echo("r")).status(), 401);
        assert_eq!(
            answer(&Outcome::BadRequest(ParseError::NoEventId), echo("r")).status(),
            400
        );
        let u = answer(&Outcome::Unavailable { retry_after: 5 }, echo("r"));
        assert_eq!(
            (
                u.status().as_u16(),
                u.headers()[header::RETRY_AFTER].to_str().ok()
            ),
            (503, Some("5"))
        );
        assert_eq!(
            answer(&Outcome::RateLimited { retry_after: 1 }, echo("r")).status(),
            429
        );
    }
}
