//! HTTP: the accept loops, connection limits and timeouts, the request service (route,
//! method, body limit), and the mapping of an [`Outcome`] to status and body.
//! The only module that imports hyper.

pub mod admin;

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant as TokioInstant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::budget::{BodyBudget, Charge};
use crate::clock::Clock;
use crate::config::Limits;
use crate::config::Profile;
use crate::http::admin::{Admin, AdminRequest};
use crate::ingress::event::{Delivery, RequestId};
use crate::metrics::ReasonLabel;
use crate::pipeline::{Outcome, Pipeline};
use crate::ratelimit::PeerLimiter;
use crate::tls::TlsReloader;

/// Route label of requests that matched no route.
const UNMATCHED: &str = "unmatched";
/// Largest HTTP/2 stream and connection window: a window no larger than the body limit
/// (and this) bounds what hyper buffers for a stream nobody reads.
const H2_MAX_WINDOW: u64 = 256 * 1024;
/// HTTP/2 streams a client may reset before they were accepted (hyper's default, stated).
const H2_MAX_PENDING_RESETS: usize = 20;
/// HTTP/2 streams the server may reset for protocol errors before it closes the connection.
const H2_MAX_LOCAL_RESETS: usize = 256;
/// Bytes taken from the unverified body budget before each chunk is pulled off the
/// connection: an HTTP/2 DATA frame is at most 16 KiB (the default frame size).
const BODY_CHUNK_RESERVE: u64 = 16 * 1024;
/// The answer header that carries the delivery's request id, on every webhook answer.
const X_REQUEST_ID: &str = "x-request-id";

type Answer = Response<Full<Bytes>>;

/// What the webhook listener needs per request.
pub struct WebhookService {
    /// The request pipeline.
    pub pipeline: Arc<Pipeline>,
    /// Limits from config.
    pub limits: Limits,
    /// Failed verifications per peer address.
    peers: PeerLimiter,
    /// Body bytes held before verification, over all connections.
    budget: BodyBudget,
}

impl WebhookService {
    /// The service of `pipeline` under `limits`; `clock` drives the per-peer limiter.
    pub fn new(pipeline: Arc<Pipeline>, limits: Limits, clock: Clock) -> Self {
        let per_peer = &limits.failed_verification_per_peer;
        let peers = PeerLimiter::new(per_peer.per_second, per_peer.burst, clock);
        let budget = BodyBudget::new(
            limits.max_unverified_body_bytes,
            pipeline.metrics().unverified_body_bytes.clone(),
        );
        Self {
            pipeline,
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
    let metrics = service.pipeline.metrics();
    let closed = metrics.connections_closed.clone();
    let open = metrics.connections_open.clone();
    metrics
        .connections_max
        .set(i64::try_from(limits.max_connections).unwrap_or(i64::MAX));
    let handler = move |peer: SocketAddr, req: Request<Incoming>| {
        let service = service.clone();
        async move {
            // Timed here so early answers (404, 405, 413, 408) count in the histogram too.
            let started = Instant::now();
            let answer = guarded(handle_webhook(&service, peer, req)).await;
            service
                .pipeline
                .metrics()
                .request_duration
                .observe(started.elapsed().as_secs_f64());
            Ok::<_, Infallible>(answer)
        }
    };
    let conns = Connections::new(limits, tls, closed, open, stop, handler);
    accept_loop(listener, conns, grace).await;
}

/// Serves the admin endpoints until `stop`.
pub async fn serve_admin(
    listener: TcpListener,
    admin: Arc<Admin>,
    limits: Limits,
    stop: CancellationToken,
) {
    let handler = move |peer: SocketAddr, req: Request<Incoming>| {
        let admin = admin.clone();
        async move {
            let (status, content_type, body) = admin
                .handle(AdminRequest {
                    method: req.method().as_str(),
                    path: req.uri().path(),
                    from_loopback: peer.ip().is_loopback(),
                })
                .await;
            let mut resp = Response::new(Full::new(Bytes::from(body)));
            *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            Ok::<_, Infallible>(resp)
        }
    };
    // The admin listener's closes are not webhook traffic: counted nowhere.
    let conns = Connections::new(
        limits,
        None,
        Family::default(),
        Gauge::default(),
        stop,
        handler,
    );
    accept_loop(listener, conns, Duration::from_secs(1)).await;
}

/// The HTTP/1 settings, applied alike to hyper's builder and to the auto builder's (two
/// types with the same methods).
macro_rules! configure_http1 {
    ($builder:expr, $limits:expr) => {{
        let limits: &Limits = $limits;
        // hyper's smallest read buffer is 8 KiB; a head larger than the buffer is answered 431.
        let head = usize::try_from(limits.max_header_bytes)
            .unwrap_or(usize::MAX)
            .max(8192);
        $builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(head);
    }};
}

/// The HTTP/2 settings, applied alike to hyper's builder and to the auto builder's.
macro_rules! configure_http2 {
    ($builder:expr, $limits:expr) => {{
        let limits: &Limits = $limits;
        let window = h2_window(limits.max_body_bytes);
        $builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.h2_max_concurrent_streams)
            .initial_stream_window_size(window)
            .initial_connection_window_size(window)
            .max_pending_accept_reset_streams(H2_MAX_PENDING_RESETS)
            .max_local_error_reset_streams(H2_MAX_LOCAL_RESETS)
            .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
            .keep_alive_interval(Duration::from_secs(30));
    }};
}

/// Everything a connection task needs, shared by all connections of one listener.
struct Connections<F> {
    limits: Limits,
    tls: Option<Arc<TlsReloader>>,
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    auto: auto::Builder<TokioExecutor>,
    closed: Family<ReasonLabel, Counter>,
    /// Connections open now (the webhook listener's is registered, the admin's is not).
    open: Gauge,
    stop: CancellationToken,
    handler: F,
}

impl<F, Fut> Connections<F>
where
    F: Fn(SocketAddr, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Answer, Infallible>> + Send + 'static,
{
    fn new(
        limits: Limits,
        tls: Option<Arc<TlsReloader>>,
        closed: Family<ReasonLabel, Counter>,
        open: Gauge,
        stop: CancellationToken,
        handler: F,
    ) -> Arc<Self> {
        let mut auto = auto::Builder::new(TokioExecutor::new());
        configure_http1!(auto.http1(), &limits);
        configure_http2!(auto.http2(), &limits);
        let mut http1 = http1::Builder::new();
        configure_http1!(http1, &limits);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        configure_http2!(http2, &limits);
        Arc::new(Self {
            limits,
            tls,
            http1,
            http2,
            auto,
            closed,
            open,
            stop,
            handler,
        })
    }

    fn count_close(&self, reason: &str) {
        self.closed
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Serves one accepted connection to its end. Everything from the accept to the
    /// first complete request head (TLS handshake, protocol detection, HTTP/2 preface)
    /// shares one deadline.
    async fn serve(self: Arc<Self>, stream: TcpStream, peer: SocketAddr) {
        let activity = Arc::new(Activity::new(TokioInstant::now()));
        let handler = self.handler.clone();
        let tracked = activity.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let in_flight = InFlight::start(tracked.clone());
            let answer = handler(peer, req);
            async move {
                let answer = answer.await;
                drop(in_flight);
                answer
            }
        });
        let Some(tls) = self.tls.clone() else {
            let conn = self
                .auto
                .serve_connection(TokioIo::new(stream), service)
                .into_owned();
            return self.watch(conn, &activity).await;
        };
        let setup_deadline = activity.accepted + self.limits.header_read_timeout;
        let stream = match tokio::time::timeout_at(setup_deadline, tls.accept(stream)).await {
            Ok(Ok(s)) => s,
            Ok(Err(error)) => {
                tracing::debug!(%error, "TLS handshake failed");
                return self.count_close("tls_error");
            }
            Err(_) => {
                tracing::debug!("TLS handshake not done within header_read_timeout");
                return self.count_close("setup_timeout");
            }
        };
        // ALPN has chosen the protocol: no detection, and no waiting for a preface that an
        // HTTP/1 client never sends.
        if crate::tls::negotiated_h2(&stream) {
            let conn = self.http2.serve_connection(TokioIo::new(stream), service);
            self.watch(conn, &activity).await;
        } else {
            let conn = self.http1.serve_connection(TokioIo::new(stream), service);
            self.watch(conn, &activity).await;
        }
    }

    /// Drives a connection and closes it when it outlives its limits: no complete request
    /// head by the setup deadline (dropped at once), idle for `idle_timeout` or older than
    /// `max_connection_age` (asked to close: GOAWAY, or `Connection: close` after the
    /// current answer; dropped if it has not closed within a body read), or the listener
    /// stopping (asked to close).
    async fn watch<C>(&self, conn: C, activity: &Activity)
    where
        C: GracefulConnection,
        C::Error: std::fmt::Display,
    {
        let limits = &self.limits;
        let mut conn = pin!(conn);
        let age_deadline = activity.accepted + limits.max_connection_age;
        // Set once the connection was asked to close; then it may only finish.
        let mut closing: Option<TokioInstant> = None;
        loop {
            let (deadline, reason) = match closing {
                Some(hard) => (hard, None),
                None => {
                    let (due, reason) = activity.due(limits);
                    if age_deadline < due {
                        (age_deadline, Some("max_age"))
                    } else {
                        (due, Some(reason))
                    }
                }
            };
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "connection ended with an error");
                    }
                    return;
                }
                _ = activity.changed.notified() => {}
                _ = self.stop.cancelled(), if closing.is_none() => {
                    conn.as_mut().graceful_shutdown();
                    // The listener's shutdown grace bounds the rest.
                    closing = Some(far_future());
                }
                _ = tokio::time::sleep_until(deadline) => match reason {
                    // A request started or ended as the deadline passed: pick again.
                    Some(_) if activity.due(limits).0.min(age_deadline) > TokioInstant::now() => {}
                    None => {
                        tracing::debug!("connection did not close after being asked; dropped");
                        return;
                    }
                    Some("setup_timeout") => {
                        tracing::debug!("no complete request head within header_read_timeout; closed");
                        return self.count_close("setup_timeout");
                    }
                    Some(reason) => {
                        tracing::debug!(reason, "asking the connection to close");
                        self.count_close(reason);
                        conn.as_mut().graceful_shutdown();
                        closing = Some(
                            TokioInstant::now() + limits.header_read_timeout + limits.body_read_timeout,
                        );
                    }
                },
            }
        }
    }
}

/// A time no connection reaches.
fn far_future() -> TokioInstant {
    TokioInstant::now() + Duration::from_secs(86_400 * 365)
}

/// What a connection is doing, as its watcher needs to know: requests seen, requests in
/// flight, and when the last one ended.
struct Activity {
    accepted: TokioInstant,
    requests: AtomicU64,
    in_flight: AtomicUsize,
    /// Milliseconds from `accepted` to the end of the last request.
    last_end_ms: AtomicU64,
    /// Woken when a request starts or ends, so the watcher picks its next deadline.
    changed: Notify,
}

impl Activity {
    fn new(accepted: TokioInstant) -> Self {
        Self {
            accepted,
            requests: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            last_end_ms: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    /// The next deadline of an open connection and what it means.
    fn due(&self, limits: &Limits) -> (TokioInstant, &'static str) {
        if self.requests.load(Ordering::Acquire) == 0 {
            (self.accepted + limits.header_read_timeout, "setup_timeout")
        } else if self.in_flight.load(Ordering::Acquire) == 0 {
            let last = Duration::from_millis(self.last_end_ms.load(Ordering::Acquire));
            (self.accepted + last + limits.idle_timeout, "idle")
        } else {
            (far_future(), "idle")
        }
    }
}

/// One request in flight on a connection; ends when dropped (answered or reset).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: Arc<Activity>) -> Self {
        // In flight first: a watcher that sees the request counted also sees it in flight,
        // and never takes a starting request for an idle connection.
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.requests.fetch_add(1, Ordering::AcqRel);
        activity.changed.notify_one();
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        let since = a.accepted.elapsed().as_millis() as u64;
        a.last_end_ms.fetch_max(since, Ordering::AcqRel);
        a.in_flight.fetch_sub(1, Ordering::AcqRel);
        a.changed.notify_one();
    }
}

/// One open connection in the connections gauge, for as long as it lives.
struct OpenConnection(Gauge);

impl OpenConnection {
    fn count(open: &Gauge) -> Self {
        open.inc();
        Self(open.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Accepts until `stop`, one task per connection under `max_connections`; then waits up to
/// `grace` for the connections to finish.
async fn accept_loop<F, Fut>(listener: TcpListener, conns: Arc<Connections<F>>, grace: Duration)
where
    F: Fn(SocketAddr, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Answer, Infallible>> + Send + 'static,
{
    let max = conns.limits.max_connections;
    let permits = Arc::new(Semaphore::new(max));
    loop {
        let (stream, peer) = tokio::select! {
            _ = conns.stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(error) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::debug!(client.addr = %peer, "connection refused: max_connections reached");
            conns.count_close("over_capacity");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conns = conns.clone();
        let open = OpenConnection::count(&conns.open);
        tokio::spawn(
            async move {
                let _permit = permit;
                let _open = open;
                conns.serve(stream, peer).await;
            }
            .instrument(tracing::debug_span!("conn", client.addr = %peer)),
        );
    }
    drop(listener);
    // Every open connection holds a permit: all of them back means all closed.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    if tokio::time::timeout(grace, permits.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(grace = ?grace, "connections still open after the shutdown grace; closing them");
    }
}

/// The HTTP/2 stream and connection window: no larger than the body limit, so a peer
/// cannot park more than one body's bytes in hyper's buffers per connection.
fn h2_window(max_body_bytes: u64) -> u32 {
    u32::try_from(max_body_bytes.min(H2_MAX_WINDOW)).unwrap_or(u32::MAX)
}

/// A panic in one request becomes a 500 for that request, never a dead process.
async fn guarded(fut: impl Future<Output = Answer>) -> Answer {
    match std::panic::AssertUnwindSafe(fut).catch_unwind().await {
        Ok(answer) => answer,
        Err(_) => {
            tracing::error!("request handler panicked; answered 500");
            with_request_id(
                json(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    r#"{"error":"internal"}"#.into(),
                    None,
                ),
                &RequestId::generated().value,
            )
        }
    }
}

async fn handle_webhook(
    service: &WebhookService,
    tcp_peer: SocketAddr,
    req: Request<Incoming>,
) -> Answer {
    let started = Instant::now();
    let pipeline = &service.pipeline;
    let path = req.uri().path();
    let Some(index) = pipeline.routes.iter().position(|r| r.config.path == path) else {
        pipeline.metrics().count_request(UNMATCHED, "not_found");
        let resp = json(
            StatusCode::NOT_FOUND,
            r#"{"error":"not_found"}"#.into(),
            None,
        );
        return with_request_id(resp, &unrouted_request_id(req.headers()));
    };
    // Answers given before the pipeline runs echo the same id the pipeline would.
    let profile = pipeline.routes[index].config.profile;
    if req.method() != Method::POST {
        pipeline.count_request(index, "method_not_allowed");
        let mut resp = json(
            StatusCode::METHOD_NOT_ALLOWED,
            r#"{"error":"method_not_allowed"}"#.into(),
            None,
        );
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return with_request_id(resp, &RequestId::of(req.headers(), profile).value);
    }
    let peer = peer_ip(
        tcp_peer,
        req.headers(),
        service.limits.peer_address_header.as_deref(),
    );
    if let Err(retry_after) = service.peers.check(peer) {
        // Cheap: the body is never read. Verified deliveries never spend this bucket, so
        // only an address that keeps failing verification meets it.
        pipeline.metrics().refused("peer_failures");
        pipeline.count_request(index, "rate_limited");
        let resp = close(json(
            StatusCode::TOO_MANY_REQUESTS,
            r#"{"error":"rate_limited"}"#.into(),
            Some(retry_after),
        ));
        return with_request_id(resp, &RequestId::of(req.headers(), profile).value);
    }
    let (parts, body) = req.into_parts();
    let early = |resp: Answer| {
        let id = RequestId::of(&parts.headers, profile).value;
        with_request_id(close(resp), &id)
    };
    let mut charge = service.budget.charge();
    let body = match read_body(body, &service.limits, &mut charge, pipeline.metrics()).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => {
            pipeline.count_request(index, "too_large");
            return early(json(
                StatusCode::PAYLOAD_TOO_LARGE,
                r#"{"error":"payload_too_large"}"#.into(),
                None,
            ));
        }
        Err(BodyError::Timeout) => {
            pipeline.count_request(index, "timeout");
            return early(json(
                StatusCode::REQUEST_TIMEOUT,
                r#"{"error":"body_read_timeout"}"#.into(),
                None,
            ));
        }
        Err(BodyError::Aborted) => {
            pipeline.count_request(index, "aborted");
            return early(json(
                StatusCode::BAD_REQUEST,
                r#"{"error":"body_incomplete"}"#.into(),
                None,
            ));
        }
    };
    let delivery = Delivery {
        headers: parts.headers,
        body,
        query: parts.uri.query().map(str::to_owned),
    };
    // In a task of its own: the delivery runs to the end even if the client goes away.
    let (outcome, request_id) = match pipeline.spawn_handle(index, delivery, charge).await {
        Ok(done) => done,
        // Raised again here, where `guarded` turns it into a 500.
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => {
            let resp = json(
                StatusCode::SERVICE_UNAVAILABLE,
                r#"{"error":"unavailable"}"#.into(),
                Some(crate::pipeline::RETRY_AFTER_UNAVAILABLE),
            );
            return with_request_id(resp, &RequestId::generated().value);
        }
    };
    if outcome == Outcome::InvalidSignature {
        service.peers.failed(peer);
    }
    pipeline.count_request(index, outcome.label());
    let elapsed = started.elapsed();
    let route_name = &pipeline.routes[index].config.name;
    tracing::debug!(route = %route_name, outcome = outcome.label(), request_id = %request_id, elapsed_us = elapsed.as_micros() as u64, "request");
    answer(&outcome, &request_id)
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
    let max = limits.max_body_bytes;
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
    let result = tokio::time::timeout(limits.body_read_timeout, read)
        .await
        .unwrap_or(Err(BodyError::Timeout));
    if matches!(result, Err(BodyError::Timeout)) && waited.load(Ordering::Relaxed) {
        metrics.refused("body_budget");
    }
    result
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

/// Maps an outcome to the SPEC §2 answer.
fn answer(outcome: &Outcome, request_id: &str) -> Answer {
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
            serde_json::json!({ "error": reason.to_string() }).to_string(),
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
    with_request_id(json(status, body, retry_after), request_id)
}

/// Sets `X-Request-Id`. Ids from a sender are checked to be header-safe text when read, so
/// the fallback to a generated id only guards against a value this process never makes.
fn with_request_id(mut resp: Answer, request_id: &str) -> Answer {
    let value = HeaderValue::from_str(request_id)
        .or_else(|_| HeaderValue::from_str(&RequestId::generated().value));
    if let Ok(v) = value {
        resp.headers_mut().insert(X_REQUEST_ID, v);
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

fn status_body(status: &str, event_id: &str, reason: Option<&str>) -> String {
    serde_json::to_string(&StatusBody {
        event_id,
        reason,
        status,
    })
    .unwrap_or_default()
}

fn json(status: StatusCode, body: String, retry_after: Option<u64>) -> Answer {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
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
fn close(mut resp: Answer) -> Answer {
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::event::ParseError;

    async fn body_text(resp: Answer) -> String {
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        String::from_utf8(bytes.to_vec()).expect("utf8")
    }

    #[tokio::test]
    async fn outcomes_map_to_the_spec_answers() {
        let a = answer(
            &Outcome::Accepted {
                event_id: "e".into(),
            },
            "r1",
        );
        assert_eq!(a.status(), 200);
        assert_eq!(a.headers()["x-request-id"], "r1");
        assert_eq!(a.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(
            body_text(a).await,
            r#"{"event_id":"e","status":"accepted"}"#
        );
        let d = answer(
            &Outcome::Dropped {
                event_id: "e".into(),
                reason: "stale_status",
            },
            "r",
        );
        let v: serde_json::Value = serde_json::from_str(&body_text(d).await).expect("json");
        assert_eq!(v["reason"], "stale_status");
        assert_eq!(answer(&Outcome::InvalidSignature, "r").status(), 401);
        assert_eq!(
            answer(&Outcome::BadRequest(ParseError::NoEventId), "r").status(),
            400
        );
        let u = answer(&Outcome::Unavailable { retry_after: 5 }, "r");
        assert_eq!(
            (
                u.status().as_u16(),
                u.headers()[header::RETRY_AFTER].to_str().ok()
            ),
            (503, Some("5"))
        );
        assert_eq!(
            answer(&Outcome::RateLimited { retry_after: 1 }, "r").status(),
            429
        );
    }
}
