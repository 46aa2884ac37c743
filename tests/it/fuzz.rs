//! Property tests over raw bytes for every parser an unauthenticated client reaches: the
//! signature headers of each profile, the JSON field reader, timestamps, keyword
//! normalisation, the config, and the whole request path through the real server.
//!
//! Bounded for `cargo test` (proptest's 256 cases, 48 for the request path); a longer run
//! sets `PROPTEST_CASES`, e.g. `PROPTEST_CASES=20000 cargo test --release --test it fuzz::`.
//! A failure proptest finds is shrunk to a small input; that input becomes a fixed test.

use std::io::{Read, Write};
use std::time::Duration;

use hookgate::config::{Config, Encoding};
use hookgate::guard::decide::normalise_keyword_text;
use hookgate::ingress::event::parse_timestamp;
use hookgate::ingress::fields::{Field, FieldPlan};
use hookgate::ingress::secrets::Secret;
use hookgate::providers::{
    botix_header, hmac_parts, BodyHmac, Scheme, StandardWebhooksScheme, BOTIX_SIGNATURE,
    WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP,
};
use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};

use crate::require_broker;
use crate::util::*;

const KEY: &[u8] = b"fuzz-secret-0123456789abcdef";

/// The signature schemes of the profiles: botix, Standard Webhooks, and custom in both
/// encodings, with and without a prefix.
fn schemes() -> Vec<Scheme> {
    vec![
        Scheme::new(BodyHmac {
            header: HeaderName::from_static(BOTIX_SIGNATURE),
            prefix: Some("sha256=".into()),
            encoding: Encoding::Hex,
        }),
        Scheme::new(StandardWebhooksScheme {
            tolerance_secs: 300,
        }),
        Scheme::new(BodyHmac {
            header: HeaderName::from_static("x-sig"),
            prefix: None,
            encoding: Encoding::Base64,
        }),
        Scheme::new(BodyHmac {
            header: HeaderName::from_static("x-sig"),
            prefix: Some("v1=".into()),
            encoding: Encoding::Hex,
        }),
    ]
}

/// Headers with the given raw values under every name a scheme reads (values that are not
/// valid header bytes are skipped: hyper refuses them before any scheme sees them).
fn headers_with(values: &[Vec<u8>]) -> HeaderMap {
    let names = [
        BOTIX_SIGNATURE,
        "x-sig",
        WEBHOOK_ID,
        WEBHOOK_TIMESTAMP,
        WEBHOOK_SIGNATURE,
    ];
    let mut h = HeaderMap::new();
    for (name, value) in names.iter().zip(values.iter().cycle()) {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            h.insert(*name, v);
        }
    }
    h
}

/// Header-ish bytes: random, or a plausible shape with random parts.
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200),
        "(sha256=|v1,|v1=|)[0-9a-fA-F+/=]{0,80}( v1,[A-Za-z0-9+/=]{0,60}){0,3}"
            .prop_map(String::into_bytes),
        "-?[0-9]{0,20}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #[test]
    fn signature_headers_of_every_profile_never_panic_and_never_verify_at_random(
        values in proptest::collection::vec(header_bytes(), 1..6),
        body in proptest::collection::vec(any::<u8>(), 0..512),
        now in any::<i64>(),
    ) {
        let headers = headers_with(&values);
        let secrets = [Secret::new(KEY)];
        for scheme in schemes() {
            prop_assert!(scheme.verify(&headers, &body, &secrets, now).is_err());
        }
    }

    #[test]
    fn a_signed_body_verifies_and_any_changed_byte_fails(
        body in proptest::collection::vec(any::<u8>(), 0..512),
        flip in any::<prop::sample::Index>(),
    ) {
        let scheme = &schemes()[0];
        let secrets = [Secret::new(KEY)];
        let mut h = HeaderMap::new();
        h.insert(BOTIX_SIGNATURE, HeaderValue::from_str(&botix_header(KEY, &body)).expect("ascii"));
        prop_assert!(scheme.verify(&h, &body, &secrets, 0).is_ok());
        if !body.is_empty() {
            let mut changed = body.clone();
            changed[flip.index(body.len())] ^= 0x01;
            prop_assert!(scheme.verify(&h, &changed, &secrets, 0).is_err());
        }
        // Standard Webhooks over the same body.
        let sw = &schemes()[1];
        let mac = hmac_parts(KEY, &[b"msg_1", b".", b"1000", b".", &body]);
        let mut h = HeaderMap::new();
        h.insert(WEBHOOK_ID, HeaderValue::from_static("msg_1"));
        h.insert(WEBHOOK_TIMESTAMP, HeaderValue::from_static("1000"));
        use base64::Engine;
        let sig = format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac));
        h.insert(WEBHOOK_SIGNATURE, HeaderValue::from_str(&sig).expect("ascii"));
        prop_assert!(sw.verify(&h, &body, &secrets, 1000).is_ok());
    }

    #[test]
    fn the_field_reader_takes_any_bytes(
        body in proptest::collection::vec(any::<u8>(), 0..1024),
        pointers in proptest::collection::vec("(/[a-z0-9~]{0,4}){0,4}", 1..5),
    ) {
        let mut plan = FieldPlan::default();
        for p in &pointers {
            plan.add(p);
        }
        let _ = plan.extract(&body.into());
    }

    #[test]
    fn the_field_reader_agrees_with_serde_json_pointers(
        value in json_object(),
        pointers in proptest::collection::vec("(/(a|b|c|0|1|x~1y|~0))(/(a|b|c|0|1|x~1y|~0)){0,3}", 1..6),
    ) {
        let body = serde_json::to_vec(&value).expect("json");
        // Compared with the document as serde_json reads the same text back (its float
        // parsing may differ from the generated value in the last digit).
        let value: serde_json::Value = serde_json::from_slice(&body).expect("json");
        let mut plan = FieldPlan::default();
        let slots: Vec<_> = pointers.iter().map(|p| plan.add(p)).collect();
        let got = plan.extract(&body.into()).expect("a JSON object is read");
        for (p, slot) in pointers.iter().zip(slots) {
            let expected = value.pointer(p).map(|v| match v {
                serde_json::Value::String(s) => Field::Text(s),
                serde_json::Value::Number(n) => Field::Number(n),
                serde_json::Value::Null => Field::Null,
                _ => Field::Other,
            });
            prop_assert_eq!(got.get(slot), expected, "pointer {}", p);
        }
    }

    #[test]
    fn timestamps_in_any_text_never_panic(text in any::<String>(), n in any::<f64>()) {
        let _ = parse_timestamp(Field::Text(&text));
        if let Some(number) = serde_json::Number::from_f64(n) {
            let _ = parse_timestamp(Field::Number(&number));
        }
    }

    #[test]
    fn timestamps_read_back_in_every_form(secs in 0_i64..10_000_000_000, millis in 0_i64..1000) {
        let ms = secs * 1000 + millis;
        let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).expect("time");
        let text = t.format(&time::format_description::well_known::Rfc3339).expect("format");
        prop_assert_eq!(parse_timestamp(Field::Text(&text)), Some(ms));
        prop_assert_eq!(parse_timestamp(Field::Number(&serde_json::Number::from(ms.max(100_000_000_000)))), Some(ms.max(100_000_000_000)));
        if secs >= 1 {
            prop_assert_eq!(parse_timestamp(Field::Number(&serde_json::Number::from(secs))), Some(secs * 1000));
        }
    }

    #[test]
    fn keyword_normalisation_is_total_and_stable(text in any::<String>()) {
        let once = normalise_keyword_text(&text);
        prop_assert_eq!(normalise_keyword_text(&once), once.clone());
        prop_assert_eq!(once.trim_start(), once.as_str());
    }

    #[test]
    fn config_text_of_any_shape_is_accepted_or_refused_never_a_panic(
        noise in proptest::collection::vec(any::<u8>(), 0..64),
        at in any::<prop::sample::Index>(),
        raw in any::<String>(),
    ) {
        let _ = Config::parse(&raw);
        let base = GatewayConfig::new(std::path::Path::new("/nonexistent"), "x").yaml();
        let mut bytes = base.into_bytes();
        let i = at.index(bytes.len());
        bytes.splice(i..i, noise);
        let _ = Config::parse(&String::from_utf8_lossy(&bytes));
    }
}

/// Small JSON objects over a few keys, nested a little.
fn json_object() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        "[a-z\\u{e9}\\u{43f} \"\\\\]{0,8}".prop_map(serde_json::Value::from),
    ];
    let key = prop_oneof![
        Just("a"),
        Just("b"),
        Just("c"),
        Just("0"),
        Just("1"),
        Just("x/y"),
        Just("~")
    ];
    let value = leaf.prop_recursive(3, 24, 4, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map(key.clone().prop_map(str::to_owned), inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    });
    proptest::collection::btree_map(
        prop_oneof![Just("a"), Just("b"), Just("0"), Just("x/y"), Just("~")]
            .prop_map(str::to_owned),
        value,
        0..4,
    )
    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))
}

// ---------------------------------------------------------------------------------------
// The whole request path, through the real server over TCP.

/// One request as bytes: a request line and headers made of plausible and random parts,
/// a body, or plain noise.
fn raw_request() -> impl Strategy<Value = Vec<u8>> {
    let method = prop_oneof![
        Just(b"POST".to_vec()),
        Just(b"GET".to_vec()),
        Just(b"PRI".to_vec()),
        "[A-Z]{0,8}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..8),
    ];
    let target = prop_oneof![
        Just(b"/webhooks/botix".to_vec()),
        Just(b"*".to_vec()),
        "/[ -~]{0,40}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..40),
    ];
    let version = prop_oneof![
        Just(b"HTTP/1.1".to_vec()),
        Just(b"HTTP/1.0".to_vec()),
        Just(b"HTTP/2.0".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..10),
    ];
    let name = prop_oneof![
        Just(b"content-length".to_vec()),
        Just(b"transfer-encoding".to_vec()),
        Just(b"x-botix-signature".to_vec()),
        Just(b"x-botix-request-id".to_vec()),
        Just(b"host".to_vec()),
        Just(b"connection".to_vec()),
        Just(b"expect".to_vec()),
        "[a-z-]{1,12}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..12),
    ];
    let value = prop_oneof![
        "[0-9]{0,12}".prop_map(String::into_bytes),
        Just(b"chunked".to_vec()),
        Just(b"100-continue".to_vec()),
        "sha256=[0-9a-f]{0,70}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..40),
    ];
    let line_end = prop_oneof![
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(Vec::new())
    ];
    let request = (
        method,
        target,
        version,
        proptest::collection::vec((name, value, line_end.clone()), 0..8),
        line_end,
        proptest::collection::vec(any::<u8>(), 0..2048),
    )
        .prop_map(|(m, t, v, headers, end, body)| {
            let mut out = m;
            out.push(b' ');
            out.extend(t);
            out.push(b' ');
            out.extend(v);
            out.extend_from_slice(b"\r\n");
            for (n, val, e) in headers {
                out.extend(n);
                out.extend_from_slice(b": ");
                out.extend(val);
                out.extend(e);
            }
            out.extend(end);
            out.extend(body);
            out
        });
    prop_oneof![
        4 => request,
        1 => proptest::collection::vec(any::<u8>(), 0..4096),
    ]
}

/// Sends `bytes`, half-closes, and reads until the server closes; `None` if it did not
/// within `deadline` (a hang).
fn exchange(addr: std::net::SocketAddr, bytes: &[u8], deadline: Duration) -> Option<Vec<u8>> {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(deadline)).expect("timeout");
    // The server may answer and close before everything is written: not a failure.
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let started = std::time::Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(out),
            Err(_) => return None,
        }
        if started.elapsed() > deadline {
            return None;
        }
    }
}

#[tokio::test]
async fn arbitrary_bytes_through_the_server_never_hang_or_crash_it() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    cfg.extra = "limits:\n  header_read_timeout: 2s\n  body_read_timeout: 2s\n  idle_timeout: 2s\n  failed_verification_per_peer:\n    per_second: 1000\n    burst: 100000\n".into();
    let gw = Gateway::start(&cfg).await;
    let addr = gw.addr;
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(48);
    let started = std::time::Instant::now();
    let result = tokio::task::spawn_blocking(move || {
        let mut runner = TestRunner::new(RunnerConfig {
            cases,
            failure_persistence: None,
            ..RunnerConfig::default()
        });
        runner.run(&raw_request(), |bytes| {
            let answer = exchange(addr, &bytes, Duration::from_secs(10));
            prop_assert!(answer.is_some(), "the server neither answered nor closed");
            let answer = answer.unwrap_or_default();
            // A panic in a request is answered 500: it must never happen.
            prop_assert!(
                !answer.starts_with(b"HTTP/1.1 500") && !answer.starts_with(b"HTTP/1.0 500"),
                "{}",
                String::from_utf8_lossy(&answer)
            );
            Ok(())
        })
    })
    .await
    .expect("join");
    eprintln!(
        "request-path fuzz: {cases} cases in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        panic!("{e}\nlogs:\n{}", gw.logs().join("\n"));
    }
    // Still up, and still serving the real sender.
    let client = client(None);
    let (status, answer) = gw
        .deliver(&client, &event_body(&unique("evt")), "req_after")
        .await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        !gw.logs().iter().any(|l| l.contains("panicked")),
        "a request panicked"
    );
    broker.delete().await;
}
