//! The sender's list API: one page request, and the pure reading of its answer (status,
//! `X-RateLimit-*` and `Retry-After` headers, the page body) into a [`ListAnswer`].

use std::num::NonZeroU16;
use std::time::Duration;

use serde_json::Value;

use crate::reconcile::key::ApiKey;

/// `X-RateLimit-Limit`.
pub const LIMIT_HEADER: &str = "x-ratelimit-limit";
/// `X-RateLimit-Remaining`.
pub const REMAINING_HEADER: &str = "x-ratelimit-remaining";
/// `X-RateLimit-Reset`: Unix seconds when the window resets.
pub const RESET_HEADER: &str = "x-ratelimit-reset";
/// `Retry-After` (seconds) of a 429.
pub const RETRY_AFTER_HEADER: &str = "retry-after";
/// Most body bytes read from one answer: 200 messages of at most a few KiB each.
const MAX_BODY_BYTES: usize = 8 << 20;

/// What the last answer said about the key's rate limit; a header that is absent or not a
/// number is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimit {
    /// `X-RateLimit-Limit`.
    pub limit: Option<u64>,
    /// `X-RateLimit-Remaining`.
    pub remaining: Option<u64>,
    /// `X-RateLimit-Reset`, Unix seconds.
    pub reset_secs: Option<i64>,
}

/// `Retry-After` as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryAfter {
    /// Whole seconds.
    Secs(u64),
    /// Absent.
    Missing,
    /// Present but not a number of seconds (the text, for the log).
    NotANumber(String),
}

/// Whether a message came in to us or went out from us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Sent to our number by a contact.
    Inbound,
    /// Sent by us.
    Outbound,
}

/// One message of a page, as the API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The message id (`id`).
    pub id: String,
    /// `direction`.
    pub direction: Direction,
    /// `status`, if any.
    pub status: Option<String>,
    /// `from`.
    pub from: Option<String>,
    /// `to`.
    pub to: Option<String>,
    /// `text`.
    pub text: Option<String>,
    /// `created_at` (RFC 3339).
    pub created_at: Option<String>,
    /// `updated_at` (RFC 3339).
    pub updated_at: Option<String>,
}

/// Why one item of a page was left out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ItemError {
    #[error("item is not an object")]
    NotAnObject,
    #[error("item has no id")]
    NoId,
    #[error("item has no direction, or one that is neither inbound nor outbound")]
    NoDirection,
}

/// A page of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The items that have the documented shape.
    pub items: Vec<Listed>,
    /// The items left out, with why (logged and counted by the walk).
    pub bad_items: Vec<ItemError>,
    /// `meta.next_cursor`.
    pub next_cursor: Option<String>,
    /// `meta.has_more`.
    pub has_more: bool,
}

/// A body that is not the documented shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("answer is not JSON: {0}")]
    NotJson(String),
    #[error("answer has no data array")]
    NoData,
    #[error("answer has no meta.has_more boolean")]
    NoHasMore,
    #[error("answer says has_more but gives no next_cursor")]
    NoNextCursor,
}

/// What one answer of the list API said, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListAnswer {
    /// 200 with a page.
    Page(Page),
    /// 200 whose body is not the documented shape.
    BadBody(BodyError),
    /// 429.
    TooMany(RetryAfter),
    /// 401 or 403: the key is refused; retrying cannot help.
    KeyRefused(u16),
    /// 422: the cursor is no longer valid.
    CursorInvalid,
    /// 5xx, a timeout or a connection failure: worth another try.
    Transient(String),
    /// Any other status: not retried.
    Refused(u16),
}

/// An answer with the rate limit its headers stated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// What it said.
    pub answer: ListAnswer,
    /// Its `X-RateLimit-*` headers.
    pub rate: RateLimit,
}

/// Reads an answer from its status, headers (lowercase name, value) and body. Pure.
pub fn read_answer<'h>(
    status: u16,
    headers: impl Iterator<Item = (&'h str, &'h str)> + Clone,
    body: &[u8],
) -> Reply {
    let rate = read_rate(headers.clone());
    let answer = match status {
        200 => match read_page(body) {
            Ok(page) => ListAnswer::Page(page),
            Err(e) => ListAnswer::BadBody(e),
        },
        429 => ListAnswer::TooMany(read_retry_after(headers)),
        401 | 403 => ListAnswer::KeyRefused(status),
        422 => ListAnswer::CursorInvalid,
        500..=599 => ListAnswer::Transient(format!("status {status}")),
        other => ListAnswer::Refused(other),
    };
    Reply { answer, rate }
}

/// The `X-RateLimit-*` headers.
pub fn read_rate<'h>(headers: impl Iterator<Item = (&'h str, &'h str)>) -> RateLimit {
    let mut rate = RateLimit::default();
    for (name, value) in headers {
        let value = value.trim();
        if name.eq_ignore_ascii_case(LIMIT_HEADER) {
            rate.limit = value.parse().ok();
        } else if name.eq_ignore_ascii_case(REMAINING_HEADER) {
            rate.remaining = value.parse().ok();
        } else if name.eq_ignore_ascii_case(RESET_HEADER) {
            rate.reset_secs = value.parse().ok();
        }
    }
    rate
}

/// `Retry-After`, in seconds.
pub fn read_retry_after<'h>(mut headers: impl Iterator<Item = (&'h str, &'h str)>) -> RetryAfter {
    match headers.find(|(n, _)| n.eq_ignore_ascii_case(RETRY_AFTER_HEADER)) {
        None => RetryAfter::Missing,
        Some((_, v)) => match v.trim().parse::<u64>() {
            Ok(secs) => RetryAfter::Secs(secs),
            Err(_) => RetryAfter::NotANumber(v.chars().take(64).collect()),
        },
    }
}

/// A page body: `{"data": [...], "meta": {"next_cursor", "has_more"}}`.
pub fn read_page(body: &[u8]) -> Result<Page, BodyError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| BodyError::NotJson(e.to_string()))?;
    let data = value
        .get("data")
        .and_then(Value::as_array)
        .ok_or(BodyError::NoData)?;
    let meta = value.get("meta");
    let has_more = meta
        .and_then(|m| m.get("has_more"))
        .and_then(Value::as_bool)
        .ok_or(BodyError::NoHasMore)?;
    let next_cursor = meta
        .and_then(|m| m.get("next_cursor"))
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .map(str::to_owned);
    if has_more && next_cursor.is_none() {
        return Err(BodyError::NoNextCursor);
    }
    let mut items = Vec::with_capacity(data.len());
    let mut bad_items = Vec::new();
    for item in data {
        match read_item(item) {
            Ok(listed) => items.push(listed),
            Err(e) => bad_items.push(e),
        }
    }
    Ok(Page {
        items,
        bad_items,
        next_cursor,
        has_more,
    })
}

fn read_item(item: &Value) -> Result<Listed, ItemError> {
    let object = item.as_object().ok_or(ItemError::NotAnObject)?;
    let text = |key: &str| {
        object
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    // An id may be a number in some APIs; it is an id all the same.
    let id = text("id")
        .or_else(|| {
            object
                .get("id")
                .and_then(Value::as_u64)
                .map(|n| n.to_string())
        })
        .ok_or(ItemError::NoId)?;
    let direction = match text("direction").as_deref() {
        Some("inbound") => Direction::Inbound,
        Some("outbound") => Direction::Outbound,
        _ => return Err(ItemError::NoDirection),
    };
    Ok(Listed {
        id,
        direction,
        status: text("status"),
        from: text("from"),
        to: text("to"),
        text: text("text"),
        created_at: text("created_at"),
        updated_at: text("updated_at"),
    })
}

/// A client of one route's list endpoint.
pub struct Client {
    http: reqwest::Client,
    url: reqwest::Url,
    page_size: NonZeroU16,
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the HTTP client of the list API: {0}")]
pub struct ClientError(String);

impl Client {
    /// A client of `url` asking for `page_size` items, each request under `timeout`.
    pub fn new(
        url: reqwest::Url,
        page_size: NonZeroU16,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!("hookgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ClientError(e.to_string()))?;
        Ok(Self {
            http,
            url,
            page_size,
        })
    }

    /// Asks for one page: from `cursor` if given, of messages updated at or after `since`.
    pub async fn list(&self, key: &ApiKey, cursor: Option<&str>, since: &str) -> Reply {
        let mut url = self.url.clone();
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("cursor_limit", &self.page_size.to_string());
            if let Some(cursor) = cursor {
                query.append_pair("cursor", cursor);
            }
            query.append_pair("since", since);
        }
        let sent = self.http.get(url).bearer_auth(key.expose()).send().await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                return Reply {
                    answer: ListAnswer::Transient(transport_reason(e)),
                    rate: RateLimit::default(),
                }
            }
        };
        let status = response.status().as_u16();
        let headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        let body = match read_limited(response).await {
            Ok(b) => b,
            Err(reason) => {
                return Reply {
                    answer: ListAnswer::Transient(reason),
                    rate: read_rate(headers.iter().map(|(n, v)| (n.as_str(), v.as_str()))),
                }
            }
        };
        read_answer(
            status,
            headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
            &body,
        )
    }
}

/// The body, refusing one over [`MAX_BODY_BYTES`].
async fn read_limited(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_BODY_BYTES {
                    return Err("answer body over 8 MiB".into());
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) => return Err(transport_reason(e)),
        }
    }
}

fn transport_reason(e: reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connection failed".into()
    } else {
        // The URL may carry a cursor, never the key (it is in a header).
        e.without_url().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> Reply {
        read_answer(status, headers.iter().copied(), body.as_bytes())
    }

    #[test]
    fn a_page_is_read_with_its_cursor_and_rate() {
        let r = answer(
            200,
            &[
                ("x-ratelimit-limit", "30"),
                ("x-ratelimit-remaining", "4"),
                ("x-ratelimit-reset", "1795946460"),
            ],
            r#"{"data":[{"id":"m1","direction":"outbound","status":"delivered","from":"+1","to":"+2","text":"hi","created_at":"2026-11-29T10:00:00Z","updated_at":"2026-11-29T10:01:00Z"},{"id":"m2","direction":"inbound","text":"STOP"}],"meta":{"next_cursor":"c2","has_more":true}}"#,
        );
        assert_eq!(
            r.rate,
            RateLimit {
                limit: Some(30),
                remaining: Some(4),
                reset_secs: Some(1_795_946_460)
            }
        );
        let ListAnswer::Page(page) = r.answer else {
            panic!("{:?}", r.answer)
        };
        assert_eq!(page.items.len(), 2);
        assert_eq!(page.items[0].status.as_deref(), Some("delivered"));
        assert_eq!(page.items[1].direction, Direction::Inbound);
        assert_eq!(page.next_cursor.as_deref(), Some("c2"));
        assert!(page.has_more);
    }

    #[test]
    fn items_without_an_id_or_direction_are_left_out_not_the_page() {
        let ListAnswer::Page(page) = answer(
            200,
            &[],
            r#"{"data":[{"direction":"inbound"},7,{"id":"m","direction":"sideways"},{"id":3,"direction":"inbound"}],"meta":{"next_cursor":null,"has_more":false}}"#,
        )
        .answer
        else {
            panic!("not a page")
        };
        assert_eq!(
            page.bad_items,
            vec![
                ItemError::NoId,
                ItemError::NotAnObject,
                ItemError::NoDirection
            ]
        );
        assert_eq!(page.items[0].id, "3");
    }

    #[test]
    fn bodies_not_of_the_documented_shape() {
        for (body, want) in [
            ("<html>", "not JSON"),
            (r#"{"meta":{"has_more":false}}"#, "no data"),
            (r#"{"data":[]}"#, "has_more"),
            (r#"{"data":[],"meta":{"has_more":"yes"}}"#, "has_more"),
            (
                r#"{"data":[],"meta":{"has_more":true,"next_cursor":null}}"#,
                "next_cursor",
            ),
        ] {
            match answer(200, &[], body).answer {
                ListAnswer::BadBody(e) => assert!(e.to_string().contains(want), "{body}: {e}"),
                other => panic!("{body}: {other:?}"),
            }
        }
    }

    #[test]
    fn statuses_are_classified_by_the_senders_rules() {
        assert_eq!(
            answer(429, &[("Retry-After", "7")], "").answer,
            ListAnswer::TooMany(RetryAfter::Secs(7))
        );
        assert_eq!(
            answer(429, &[("retry-after", "Wed, 21 Oct 2026 07:28:00 GMT")], "").answer,
            ListAnswer::TooMany(RetryAfter::NotANumber(
                "Wed, 21 Oct 2026 07:28:00 GMT".into()
            ))
        );
        assert_eq!(
            answer(429, &[], "").answer,
            ListAnswer::TooMany(RetryAfter::Missing)
        );
        assert_eq!(answer(401, &[], "").answer, ListAnswer::KeyRefused(401));
        assert_eq!(answer(403, &[], "").answer, ListAnswer::KeyRefused(403));
        assert_eq!(answer(422, &[], "").answer, ListAnswer::CursorInvalid);
        assert!(matches!(
            answer(503, &[], "").answer,
            ListAnswer::Transient(_)
        ));
        assert_eq!(answer(404, &[], "").answer, ListAnswer::Refused(404));
        assert_eq!(answer(400, &[], "").answer, ListAnswer::Refused(400));
    }

    #[test]
    fn rate_headers_that_are_not_numbers_are_absent() {
        let r = read_rate(
            [
                ("x-ratelimit-remaining", "many"),
                ("x-ratelimit-reset", "-5"),
            ]
            .into_iter(),
        );
        assert_eq!(r.remaining, None);
        assert_eq!(
            r.reset_secs,
            Some(-5),
            "a past reset is read; pacing judges it"
        );
    }
}
