//! The connections of a listener: the accept loop under `max_connections`, one task per
//! connection, its protocol (HTTP/1 or HTTP/2, by ALPN or detection) under the configured
//! limits, and the watcher that closes it at its deadlines.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant as TokioInstant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::Limits;
use crate::http::close_requests::CloseRequests;
use crate::http::deadlines::{far_future, Activity, Deadlines, InFlight, Passed};
use crate::metrics::{CloseReason, ReasonCounters};
use crate::tls::TlsReloader;

/// Largest HTTP/2 stream and connection window: a window no larger than the body limit
/// (and this) bounds what hyper buffers for a stream nobody reads.
const H2_MAX_WINDOW: u64 = 256 * 1024;
/// HTTP/2 streams a client may reset before they were accepted (hyper's default, stated).
const H2_MAX_PENDING_RESETS: usize = 20;
/// HTTP/2 streams the server may reset for protocol errors before it closes the connection.
const H2_MAX_LOCAL_RESETS: usize = 256;
/// A response with its whole body, as both listeners send it.
pub type FullResponse = Response<Full<Bytes>>;

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
            .max_concurrent_streams(limits.h2_max_concurrent_streams.get())
            .initial_stream_window_size(window)
            .initial_connection_window_size(window)
            .max_pending_accept_reset_streams(H2_MAX_PENDING_RESETS)
            .max_local_error_reset_streams(H2_MAX_LOCAL_RESETS)
            .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
            .keep_alive_interval(Duration::from_secs(30));
    }};
}

/// Everything a connection task needs, shared by all connections of one listener.
pub(crate) struct Connections<F> {
    limits: Limits,
    tls: Option<Arc<TlsReloader>>,
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    auto: auto::Builder<TokioExecutor>,
    closed: ReasonCounters<CloseReason>,
    /// Connections open now (the webhook listener's is registered, the admin's is not).
    open: Gauge,
    stop: CancellationToken,
    /// Asked when `stop` is cancelled.
    close_requests: CloseRequests,
    handler: F,
}

impl<F, Fut> Connections<F>
where
    F: Fn(SocketAddr, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<FullResponse, Infallible>> + Send + 'static,
{
    pub(crate) fn new(
        limits: Limits,
        tls: Option<Arc<TlsReloader>>,
        closed: ReasonCounters<CloseReason>,
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
            close_requests: CloseRequests::default(),
            handler,
        })
    }

    fn count_close(&self, reason: CloseReason) {
        self.closed.count(reason);
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
            // A combinator, not an `async` block: a block would hold the handler's future
            // twice (as it was captured and as it is awaited), and hyper moves this future
            // by value for every request.
            handler(peer, req).inspect(move |_| drop(in_flight))
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
                return self.count_close(CloseReason::TlsError);
            }
            Err(_) => {
                tracing::debug!("TLS handshake not done within header_read_timeout");
                return self.count_close(CloseReason::SetupTimeout);
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
        let mut conn = pin!(conn);
        let mut deadlines = Deadlines {
            activity,
            limits: &self.limits,
            age: activity.accepted + self.limits.max_connection_age,
            closing: None,
        };
        // One timer and one close request for the connection's life: building them anew
        // would register a timer each time a deadline is picked.
        let stopped = self.close_requests.register();
        let mut stopped = pin!(stopped);
        let (mut deadline, _) = deadlines.next_deadline();
        let timer = tokio::time::sleep_until(deadline);
        let mut timer = pin!(timer);
        let mut timer_polled = false;
        loop {
            let woke = std::future::poll_fn(|cx| {
                if let Poll::Ready(result) = conn.as_mut().poll(cx) {
                    return Poll::Ready(Woke::Ended(result));
                }
                if deadlines.closing.is_none() && stopped.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Stopped);
                }
                // Polled once, and again only when it fired: it keeps this task's waker
                // across resets, and polling it at every wake-up of the connection (every
                // request) would only hand it the same waker again.
                if !timer_polled || timer.is_elapsed() {
                    timer_polled = true;
                    if timer.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Woke::Deadline);
                    }
                }
                Poll::Pending
            })
            .await;
            match woke {
                Woke::Ended(result) => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "connection ended with an error");
                    }
                    if deadlines.ended_in_setup() {
                        self.count_close(CloseReason::SetupTimeout);
                    }
                    return;
                }
                Woke::Stopped => {
                    conn.as_mut().graceful_shutdown();
                    // The listener's shutdown grace bounds the rest.
                    deadlines.closing = Some(far_future());
                }
                Woke::Deadline => match deadlines.passed() {
                    Passed::Moved => {}
                    Passed::Drop(reason) => {
                        if let Some(reason) = reason {
                            self.count_close(reason);
                        }
                        return;
                    }
                    Passed::AskToClose(reason) => {
                        self.count_close(reason);
                        conn.as_mut().graceful_shutdown();
                        deadlines.closing = Some(deadlines.after_asking());
                    }
                },
            }
            let (next, _) = deadlines.next_deadline();
            if next != deadline || timer.is_elapsed() {
                timer.as_mut().reset(next);
                deadline = next;
            }
        }
    }
}

/// What woke a watched connection.
enum Woke<E> {
    /// The connection ended.
    Ended(Result<(), E>),
    /// The listener stops.
    Stopped,
    /// The deadline picked last has passed.
    Deadline,
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
pub(crate) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    conns: Arc<Connections<F>>,
    grace: Duration,
) where
    F: Fn(SocketAddr, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<FullResponse, Infallible>> + Send + 'static,
{
    let max = conns.limits.max_connections.get();
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
            conns.count_close(CloseReason::OverCapacity);
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
    conns.close_requests.ask_all();
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
fn h2_window(max_body_bytes: NonZeroU64) -> u32 {
    u32::try_from(max_body_bytes.get().min(H2_MAX_WINDOW)).unwrap_or(u32::MAX)
}
