//! HTTP: the accept loops, connection limits and timeouts, the request service (route,
//! method, body limit), and the mapping of an [`Outcome`] to status and body.
//! The only module that imports hyper.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::admin::{Admin, AdminRequest};
use crate::config::Limits;
use crate::event::Delivery;
use crate::pipeline::{Outcome, Pipeline};
use crate::tls::TlsReloader;

/// Concurrent HTTP/2 streams per connection; a sender needs few, an attacker wants many.
const H2_MAX_STREAMS: u32 = 256;
/// Route label of requests that matched no route.
const UNMATCHED: &str = "unmatched";

type Answer = Response<Full<Bytes>>;

/// What the webhook listener needs per request.
pub struct WebhookService {
    /// The request pipeline.
    pub pipeline: Arc<Pipeline>,
    /// Limits from config.
    pub limits: Limits,
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
    let handler = move |_peer: SocketAddr, req: Request<Incoming>| {
        let service = service.clone();
        async move {
            // Timed here so early answers (404, 405, 413, 408) count in the histogram too.
            let started = Instant::now();
            let answer = guarded(handle_webhook(&service, req)).await;
            service
                .pipeline
                .metrics()
                .request_duration
                .observe(started.elapsed().as_secs_f64());
            Ok::<_, Infallible>(answer)
        }
    };
    accept_loop(listener, tls, limits, stop, grace, handler).await;
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
    accept_loop(
        listener,
        None,
        limits,
        stop,
        Duration::from_secs(1),
        handler,
    )
    .await;
}

async fn accept_loop<F, Fut>(
    listener: TcpListener,
    tls: Option<Arc<TlsReloader>>,
    limits: Limits,
    stop: CancellationToken,
    grace: Duration,
    handler: F,
) where
    F: Fn(SocketAddr, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Answer, Infallible>> + Send + 'static,
{
    let builder = Arc::new(connection_builder(&limits));
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
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
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let handler = handler.clone();
        let handler = move |req| handler(peer, req);
        let tls = tls.clone();
        let watcher = graceful.watcher();
        let handshake_timeout = limits.header_read_timeout;
        tokio::spawn(
            async move {
                let _permit = permit;
                match tls {
                    None => serve_io(&builder, watcher, stream, handler).await,
                    Some(tls) => {
                        // Graceful shutdown does not cover handshakes, so they get a deadline.
                        match tokio::time::timeout(handshake_timeout, tls.accept(stream)).await {
                            Ok(Ok(s)) => serve_io(&builder, watcher, s, handler).await,
                            Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                            Err(_) => tracing::debug!("TLS handshake timed out"),
                        }
                    }
                }
            }
            .instrument(tracing::debug_span!("conn", client.addr = %peer)),
        );
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(grace = ?grace, "connections still open after the shutdown grace; closing them");
    }
}

async fn serve_io<I, F, Fut>(
    builder: &auto::Builder<TokioExecutor>,
    watcher: hyper_util::server::graceful::Watcher,
    io: I,
    handler: F,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Answer, Infallible>> + Send + 'static,
{
    let conn = builder.serve_connection(TokioIo::new(io), service_fn(handler));
    if let Err(error) = watcher.watch(conn.into_owned()).await {
        tracing::debug!(%error, "connection ended with an error");
    }
}

fn connection_builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's smallest read buffer is 8 KiB; a head larger than the buffer is answered 431.
    let head = usize::try_from(limits.max_header_bytes)
        .unwrap_or(usize::MAX)
        .max(8192);
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(head);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(Duration::from_secs(30));
    builder
}

/// A panic in one request becomes a 500 for that request, never a dead process.
async fn guarded(fut: impl Future<Output = Answer>) -> Answer {
    match std::panic::AssertUnwindSafe(fut).catch_unwind().await {
        Ok(answer) => answer,
        Err(_) => {
            tracing::error!("request handler panicked; answered 500");
            json(
                StatusCode::INTERNAL_SERVER_ERROR,
                r#"{"error":"internal"}"#.into(),
                None,
            )
        }
    }
}

async fn handle_webhook(service: &WebhookService, req: Request<Incoming>) -> Answer {
    let started = Instant::now();
    let pipeline = &service.pipeline;
    let path = req.uri().path();
    let Some(index) = pipeline.routes.iter().position(|r| r.config.path == path) else {
        pipeline.metrics().count_request(UNMATCHED, "not_found");
        return json(
            StatusCode::NOT_FOUND,
            r#"{"error":"not_found"}"#.into(),
            None,
        );
    };
    if req.method() != Method::POST {
        pipeline.count_request(index, "method_not_allowed");
        let mut resp = json(
            StatusCode::METHOD_NOT_ALLOWED,
            r#"{"error":"method_not_allowed"}"#.into(),
            None,
        );
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return resp;
    }
    let (parts, body) = req.into_parts();
    let body = match read_body(
        body,
        service.limits.max_body_bytes,
        service.limits.body_read_timeout,
    )
    .await
    {
        Ok(b) => b,
        Err(BodyError::TooLarge) => {
            pipeline.count_request(index, "too_large");
            return close(json(
                StatusCode::PAYLOAD_TOO_LARGE,
                r#"{"error":"payload_too_large"}"#.into(),
                None,
            ));
        }
        Err(BodyError::Timeout) => {
            pipeline.count_request(index, "timeout");
            return close(json(
                StatusCode::REQUEST_TIMEOUT,
                r#"{"error":"body_read_timeout"}"#.into(),
                None,
            ));
        }
        Err(BodyError::Aborted) => {
            pipeline.count_request(index, "aborted");
            return close(json(
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
    let (outcome, request_id) = match pipeline.spawn_handle(index, delivery).await {
        Ok(done) => done,
        // Raised again here, where `guarded` turns it into a 500.
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                r#"{"error":"unavailable"}"#.into(),
                Some(crate::pipeline::RETRY_AFTER_UNAVAILABLE),
            )
        }
    };
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

/// Reads the body up to `max` bytes; a declared or actual size over it stops at once.
async fn read_body(mut body: Incoming, max: u64, timeout: Duration) -> Result<Bytes, BodyError> {
    if body.size_hint().lower() > max {
        return Err(BodyError::TooLarge);
    }
    let read = async {
        let mut buf =
            BytesMut::with_capacity(body.size_hint().exact().unwrap_or(0).min(max) as usize);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| BodyError::Aborted)?;
            if let Ok(data) = frame.into_data() {
                if buf.len() as u64 + data.len() as u64 > max {
                    return Err(BodyError::TooLarge);
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(buf.freeze())
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or(Err(BodyError::Timeout))
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
    let mut resp = json(status, body, retry_after);
    if let Ok(v) = HeaderValue::from_str(request_id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
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
    use crate::event::ParseError;

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
