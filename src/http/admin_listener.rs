//! The admin listener: the admin endpoints' answers served over HTTP, with the webhook
//! listener's connection limits and deadlines, plain HTTP only.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Limits;
use crate::http::admin_endpoints::{Admin, AdminRequest};
use crate::http::connections::{accept_loop, Connections};
use crate::metrics::ReasonCounters;

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
                    query: req.uri().query(),
                    accept: req
                        .headers()
                        .get(http::header::ACCEPT)
                        .and_then(|v| v.to_str().ok()),
                    from_loopback: peer.ip().is_loopback(),
                    authorization: req
                        .headers()
                        .get(http::header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok()),
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
        ReasonCounters::new(),
        Gauge::default(),
        stop,
        handler,
    );
    accept_loop(listener, conns, Duration::from_secs(1)).await;
}
