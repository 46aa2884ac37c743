//! W3C Trace Context: the sender's `traceparent` and `tracestate`, checked against the
//! format of version 00, or a new `traceparent` when the sender sent none or an invalid
//! one, so a consumer of the published message can continue the trace.

use std::borrow::Cow;

use http::header::HeaderName;
use http::HeaderMap;

/// Header of the W3C trace position, `00-<trace id>-<parent id>-<flags>`, on the request
/// and on the message alike.
pub const TRACEPARENT: &str = "traceparent";
/// Header of the vendors' W3C trace state, carried along with a valid `traceparent`.
pub const TRACESTATE: &str = "tracestate";

/// The two names checked when compiled: a lookup by text checks the name first.
const TRACEPARENT_HEADER: HeaderName = HeaderName::from_static(TRACEPARENT);
const TRACESTATE_HEADER: HeaderName = HeaderName::from_static(TRACESTATE);

/// Longest `tracestate` carried; the W3C format asks that at least 512 characters be
/// propagated, and a longer one may be dropped whole.
const MAX_TRACESTATE_BYTES: usize = 512;
/// Length of a version 00 `traceparent`: 2 + 1 + 32 + 1 + 16 + 1 + 2.
const TRACEPARENT_LEN: usize = 55;

/// The trace context an event is published with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    parent: Parent,
    /// The sender's `tracestate`, kept only with the sender's own valid `traceparent`.
    pub tracestate: Option<String>,
}

/// Where the trace continues from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Parent {
    /// The sender's valid version 00 `traceparent`.
    Sent(String),
    /// A new trace: its ids are written out as text only when the event is published, or
    /// a line names the trace.
    New {
        trace_id: [u8; 16],
        parent_id: [u8; 8],
    },
}

impl TraceContext {
    /// The context of a request: its `traceparent` and `tracestate` when the
    /// `traceparent` is valid (exactly one), else a new trace with no state.
    pub fn of(headers: &HeaderMap) -> Self {
        let mut parents = headers.get_all(&TRACEPARENT_HEADER).iter();
        let parent = match (parents.next(), parents.next()) {
            (Some(value), None) => value.to_str().ok().filter(|v| is_valid_traceparent(v)),
            _ => None,
        };
        let Some(parent) = parent else {
            return Self::new_root();
        };
        Self {
            parent: Parent::Sent(parent.to_owned()),
            tracestate: tracestate(headers),
        }
    }

    /// A new trace: random trace and parent ids, flags `01` (sampled), so a consumer whose
    /// sampler follows its parent records it.
    pub fn new_root() -> Self {
        // From the thread's own generator, not the system's: a delivery makes no system
        // call for its ids. All-zero ids are invalid, hence at least 1.
        Self {
            parent: Parent::New {
                trace_id: rand::random::<u128>().max(1).to_be_bytes(),
                parent_id: rand::random::<u64>().max(1).to_be_bytes(),
            },
            tracestate: None,
        }
    }

    /// The version 00 `traceparent` the event is published with.
    pub fn traceparent(&self) -> Cow<'_, str> {
        match &self.parent {
            Parent::Sent(text) => Cow::Borrowed(text),
            Parent::New {
                trace_id,
                parent_id,
            } => {
                let mut text = *b"00-00000000000000000000000000000000-0000000000000000-01";
                hex_into(&mut text[3..35], trace_id);
                hex_into(&mut text[36..52], parent_id);
                // Hex digits and dashes: ASCII, which `from_utf8` takes on its fast path;
                // `from_utf8_lossy` would walk it in chunks, about 400 instructions.
                Cow::Owned(String::from_utf8(text.to_vec()).unwrap_or_default())
            }
        }
    }

    /// The trace id as 32 hex digits, for log lines: written out on the stack, so the
    /// delivery's span records it as a text as it is.
    pub fn trace_id(&self) -> TraceId {
        let mut digits = [b'0'; 32];
        match &self.parent {
            Parent::Sent(text) => {
                if let Some(id) = text.as_bytes().get(3..35) {
                    digits.copy_from_slice(id);
                }
            }
            Parent::New { trace_id, .. } => hex_into(&mut digits, trace_id),
        }
        TraceId(digits)
    }
}

/// The trace id of a [`TraceContext`]: 32 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceId([u8; 32]);

impl TraceId {
    pub fn as_str(&self) -> &str {
        // Hex digits only: never the empty fallback.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// Writes `bytes` into `out` as lowercase hex, two digits a byte.
fn hex_into(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
}

/// Whether `value` is a version 00 `traceparent`: `00-` then 32 lowercase hex digits not
/// all zero, `-`, 16 lowercase hex digits not all zero, `-`, 2 lowercase hex digits.
pub fn is_valid_traceparent(value: &str) -> bool {
    let b = value.as_bytes();
    if b.len() != TRACEPARENT_LEN || !value.starts_with("00-") || b[35] != b'-' || b[52] != b'-' {
        return false;
    }
    let hex = |s: &[u8]| s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let zero = |s: &[u8]| s.iter().all(|&c| c == b'0');
    let (trace_id, parent_id, flags) = (&b[3..35], &b[36..52], &b[53..55]);
    hex(trace_id) && hex(parent_id) && hex(flags) && !zero(trace_id) && !zero(parent_id)
}

/// The request's `tracestate` (several headers joined with `,`, as the format allows),
/// when it is printable ASCII of at most [`MAX_TRACESTATE_BYTES`]; else none.
fn tracestate(headers: &HeaderMap) -> Option<String> {
    let mut joined = String::new();
    for value in headers.get_all(&TRACESTATE_HEADER) {
        let text = value.to_str().ok()?.trim();
        if text.is_empty() {
            continue;
        }
        if !joined.is_empty() {
            joined.push(',');
        }
        joined.push_str(text);
    }
    let printable = joined.bytes().all(|c| (0x20..=0x7e).contains(&c));
    (!joined.is_empty() && printable && joined.len() <= MAX_TRACESTATE_BYTES).then_some(joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                http::HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    #[test]
    fn a_valid_traceparent_is_recognised() {
        assert!(is_valid_traceparent(VALID));
        assert!(is_valid_traceparent(
            "00-00000000000000000000000000000001-0000000000000001-00"
        ));
    }

    #[test]
    fn every_broken_rule_makes_a_traceparent_invalid() {
        let cases = [
            ("", "empty"),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version 01",
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version ff",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "zero trace id",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "zero parent id",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "upper case",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                "31-digit trace id",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
                "15-digit parent id",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
                "1-digit flags",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
                "non-hex flags",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
                "trailing dash",
            ),
            (
                "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
                "wrong separators",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e47z6-00f067aa0ba902b7-01",
                "non-hex trace id",
            ),
        ];
        for (value, why) in cases {
            assert!(!is_valid_traceparent(value), "{why}: {value}");
        }
    }

    #[test]
    fn the_senders_context_is_kept_with_its_state() {
        let t = TraceContext::of(&headers(&[
            ("traceparent", VALID),
            ("tracestate", "congo=t61rcWkgMzE"),
            ("tracestate", "rojo=00f067aa0ba902b7"),
        ]));
        assert_eq!(t.traceparent(), VALID);
        assert_eq!(
            t.tracestate.as_deref(),
            Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
        );
        assert_eq!(t.trace_id().as_str(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn a_missing_invalid_or_repeated_traceparent_starts_a_new_trace_without_state() {
        let invalid = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        for h in [
            headers(&[]),
            headers(&[("tracestate", "congo=t61rcWkgMzE")]),
            headers(&[
                ("traceparent", invalid),
                ("tracestate", "congo=t61rcWkgMzE"),
            ]),
            headers(&[("traceparent", VALID), ("traceparent", VALID)]),
        ] {
            let t = TraceContext::of(&h);
            assert!(
                is_valid_traceparent(&t.traceparent()),
                "{}",
                t.traceparent()
            );
            assert_ne!(t.traceparent(), VALID);
            assert_eq!(t.tracestate, None);
            assert!(t.traceparent().ends_with("-01"));
        }
        let root = TraceContext::new_root();
        assert_ne!(
            root.trace_id().as_str(),
            TraceContext::new_root().trace_id().as_str(),
            "each new trace has its own id"
        );
        assert_eq!(
            root.traceparent().get(3..35),
            Some(root.trace_id().as_str()),
            "a line names the trace the message continues"
        );
    }

    #[test]
    fn ids_are_written_as_lowercase_hex_two_digits_a_byte() {
        let mut out = [b'.'; 8];
        hex_into(&mut out, &[0x00, 0x0f, 0xa5, 0xff]);
        assert_eq!(&out, b"000fa5ff");
    }

    #[test]
    fn an_oversize_or_unprintable_tracestate_is_dropped() {
        let long = format!("k={}", "v".repeat(MAX_TRACESTATE_BYTES));
        for state in [long.as_str(), "k=\tv"] {
            let t = TraceContext::of(&headers(&[("traceparent", VALID), ("tracestate", state)]));
            assert_eq!(t.traceparent(), VALID);
            assert_eq!(t.tracestate, None, "{state}");
        }
    }
}
