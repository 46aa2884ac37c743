//! A fake of the Botix public list API (`GET /public/v1/messages`), a real HTTP server on
//! port 0 that follows the sender's documented rules: cursor pages, `since`, a per-key
//! fixed-window rate limit with `X-RateLimit-*` headers, 429 with `Retry-After`, 401 for a
//! wrong key. A script of answers can be queued (5xx, 422, 403, a bad body, a 429 with an
//! odd `Retry-After`). Every request is logged with its time, for tests to check pacing.
//! Also used by `examples/fake_botix_api.rs`.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// The list path.
pub const PATH: &str = "/public/v1/messages";

/// An answer queued ahead of the normal ones.
#[derive(Debug, Clone)]
pub enum Scripted {
    /// This status with an empty JSON body, and `Retry-After` if given.
    Status(u16, Option<String>),
    /// 200 with this body.
    Body(String),
    /// The normal page, but its `next_cursor` is the request's own cursor.
    RepeatCursor,
    /// The normal page after this delay.
    Slow(Duration),
}

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub struct Logged {
    /// Arrival, Unix ms.
    pub at_ms: i64,
    pub cursor: Option<String>,
    pub since: Option<String>,
    pub limit: Option<String>,
    /// Status answered.
    pub status: u16,
    /// `X-RateLimit-Remaining` answered.
    pub remaining: u64,
    /// `X-RateLimit-Reset` answered, Unix seconds.
    pub reset_secs: i64,
    /// `Retry-After` answered, as sent.
    pub retry_after: Option<String>,
}

/// What the fake holds.
pub struct State {
    /// The accepted key.
    pub key: String,
    /// Messages, in listing order.
    pub messages: Vec<serde_json::Value>,
    /// Requests per window.
    pub limit: u64,
    /// Window length in whole seconds; windows start at multiples of it.
    pub window_secs: i64,
    /// The current window's start (Unix s) and requests in it.
    window: (i64, u64),
    /// Answers queued ahead of the normal ones.
    pub script: VecDeque<Scripted>,
    /// Every request.
    pub log: Vec<Logged>,
    /// Cursors no longer valid (422).
    pub expired_cursors: Vec<String>,
}

/// The running fake.
#[derive(Clone)]
pub struct FakeBotix {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A message as the API lists it.
pub fn message(
    id: &str,
    direction: &str,
    status: Option<&str>,
    from: &str,
    to: &str,
    text: &str,
    at: &str,
) -> serde_json::Value {
    serde_json::json!({
        "id": id, "direction": direction, "status": status, "from": from, "to": to,
        "text": text, "created_at": at, "updated_at": at,
    })
}

impl FakeBotix {
    /// Starts on 127.0.0.1:0 (or `addr`) with `key`, `limit` requests per `window_secs`.
    pub async fn start(key: &str, limit: u64, window_secs: i64) -> Self {
        Self::start_on(
            "127.0.0.1:0".parse().expect("addr"),
            key,
            limit,
            window_secs,
        )
        .await
    }

    /// [`Self::start`] on `addr`.
    pub async fn start_on(addr: SocketAddr, key: &str, limit: u64, window_secs: i64) -> Self {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind fake");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(State {
            key: key.to_owned(),
            messages: Vec::new(),
            limit,
            window_secs: window_secs.max(1),
            window: (0, 0),
            script: VecDeque::new(),
            log: Vec::new(),
            expired_cursors: Vec::new(),
        }));
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(answer(&state, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, state }
    }

    /// The list URL.
    pub fn url(&self) -> String {
        format!("http://{}{PATH}", self.addr)
    }

    /// Adds messages.
    pub fn push(&self, messages: impl IntoIterator<Item = serde_json::Value>) {
        self.state.lock().expect("fake").messages.extend(messages);
    }

    /// Queues answers.
    pub fn script(&self, answers: impl IntoIterator<Item = Scripted>) {
        self.state.lock().expect("fake").script.extend(answers);
    }

    /// The request log so far.
    pub fn log(&self) -> Vec<Logged> {
        self.state.lock().expect("fake").log.clone()
    }

    /// Replaces the accepted key.
    pub fn set_key(&self, key: &str) {
        self.state.lock().expect("fake").key = key.to_owned();
    }
}

fn query_of(req: &Request<Incoming>) -> Vec<(String, String)> {
    req.uri()
        .query()
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

async fn answer(state: &Mutex<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let at_ms = now_ms();
    let query = query_of(&req);
    let get = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let (cursor, since, limit) = (get("cursor"), get("since"), get("cursor_limit"));
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (status, body, remaining, reset_secs, retry_after, delay) = {
        let mut s = state.lock().expect("fake");
        // The window: counted per key, reset at the next multiple of window_secs.
        let now_s = at_ms / 1000;
        let start = now_s - now_s.rem_euclid(s.window_secs);
        if s.window.0 != start {
            s.window = (start, 0);
        }
        let reset_secs = start + s.window_secs;
        let used = s.window.1;
        let over = used >= s.limit;
        if !over {
            s.window.1 += 1;
        }
        let remaining = s.limit.saturating_sub(s.window.1);
        let wait_secs = ((reset_secs * 1000 - at_ms) as f64 / 1000.0)
            .ceil()
            .max(1.0) as u64;
        let scripted = s.script.pop_front();
        let (status, body, retry_after, delay) =
            if auth.as_deref() != Some(&format!("Bearer {}", s.key)) {
                (401, r#"{"error":"unauthorized"}"#.to_owned(), None, None)
            } else if over {
                (
                    429,
                    r#"{"error":"rate_limited"}"#.to_owned(),
                    Some(wait_secs.to_string()),
                    None,
                )
            } else {
                match scripted {
                    Some(Scripted::Status(code, ra)) => (code, "{}".to_owned(), ra, None),
                    Some(Scripted::Body(b)) => (200, b, None, None),
                    Some(Scripted::RepeatCursor) => {
                        let (mut page, _) =
                            page(&s, cursor.as_deref(), since.as_deref(), limit.as_deref());
                        page["meta"]["next_cursor"] =
                            serde_json::json!(cursor.clone().unwrap_or_else(|| "c0".into()));
                        page["meta"]["has_more"] = serde_json::json!(true);
                        (200, page.to_string(), None, None)
                    }
                    other => {
                        let delay = match other {
                            Some(Scripted::Slow(d)) => Some(d),
                            _ => None,
                        };
                        if let Some(i) = cursor
                            .as_ref()
                            .and_then(|c| s.expired_cursors.iter().position(|e| e == c))
                        {
                            // Refused once; a later walk's cursor of the same name is new.
                            s.expired_cursors.remove(i);
                            (422, r#"{"error":"cursor_invalid"}"#.to_owned(), None, delay)
                        } else {
                            let (page, _) =
                                page(&s, cursor.as_deref(), since.as_deref(), limit.as_deref());
                            (200, page.to_string(), None, delay)
                        }
                    }
                }
            };
        s.log.push(Logged {
            at_ms,
            cursor: cursor.clone(),
            since: since.clone(),
            limit: limit.clone(),
            status,
            remaining,
            reset_secs,
            retry_after: retry_after.clone(),
        });
        (status, body, remaining, reset_secs, retry_after, delay)
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    let h = resp.headers_mut();
    h.insert("content-type", "application/json".parse().expect("value"));
    let limit_value = state.lock().expect("fake").limit;
    h.insert("x-ratelimit-limit", limit_value.into());
    h.insert("x-ratelimit-remaining", remaining.into());
    h.insert("x-ratelimit-reset", reset_secs.into());
    if let Some(ra) = retry_after {
        if let Ok(v) = ra.parse() {
            h.insert("retry-after", v);
        }
    }
    resp
}

/// The page at `cursor` (`c<offset>`) of messages updated at or after `since`.
fn page(
    s: &State,
    cursor: Option<&str>,
    since: Option<&str>,
    limit: Option<&str>,
) -> (serde_json::Value, usize) {
    let limit = limit
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(20)
        .clamp(1, 200);
    let since_ms = since.and_then(parse_ms).unwrap_or(i64::MIN);
    let listed: Vec<&serde_json::Value> = s
        .messages
        .iter()
        .filter(|m| {
            m["updated_at"]
                .as_str()
                .and_then(parse_ms)
                .is_none_or(|t| t >= since_ms)
        })
        .collect();
    let offset = cursor
        .and_then(|c| c.strip_prefix('c'))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    let end = (offset + limit).min(listed.len());
    let data: Vec<&serde_json::Value> = listed.get(offset..end).unwrap_or_default().to_vec();
    let has_more = end < listed.len();
    let page = serde_json::json!({
        "data": data,
        "meta": {"next_cursor": if has_more { Some(format!("c{end}")) } else { None }, "has_more": has_more},
    });
    (page, data.len())
}

fn parse_ms(text: &str) -> Option<i64> {
    let t =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}
