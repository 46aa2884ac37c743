//! Field extraction (`event::parse`, contract §2 step 4) of a status event and an inbound message.
//! A `Verified` can only come from `Delivery::verify`, so each iteration's input is verified
//! in the untimed setup.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use hookgate::config::Fields;
use hookgate::ingress::event::{self, Delivery, Verified};
use hookgate::ingress::secrets::Secret;
use hookgate::providers::{botix_header, BodyHmac, Scheme, BOTIX_REQUEST_ID, BOTIX_SIGNATURE};
use http::{HeaderMap, HeaderValue};

const SECRET: &[u8] = b"bench-secret";

const STATUS: &str = r#"{"id":"evt_01JD8Z6Q3R7W","event":"message.status","timestamp":"2026-11-29T10:00:03.250Z","data":{"message_id":"msg_01JD8Z5XK2","status":"delivered","to":"+15551234567","from":"+15557654321","error_code":null,"segments":1,"price":{"amount":"0.0075","currency":"USD"}}}"#;
const INBOUND: &str = r#"{"id":"evt_01JD8Z7A9B2C","event":"message.received","timestamp":1795946403,"data":{"message_id":"msg_01JD8Z7A9B","from":"+15557654321","to":"+15551234567","text":"Hi, can you confirm my appointment for tomorrow at 10am? Thanks!","media":[],"channel":"sms"}}"#;

fn verified(scheme: &Scheme, body: &'static str) -> Verified {
    let mut headers = HeaderMap::new();
    let sig = botix_header(SECRET, body.as_bytes());
    headers.insert(BOTIX_SIGNATURE, HeaderValue::from_str(&sig).expect("sig"));
    headers.insert(
        BOTIX_REQUEST_ID,
        HeaderValue::from_static("req_01JD8Z6Q3R7W"),
    );
    headers.insert(event::DELIVERY_ATTEMPT, HeaderValue::from_static("1"));
    Delivery {
        headers,
        body: Bytes::from_static(body.as_bytes()),
        query: None,
    }
    .verify(scheme, &[Secret::new(SECRET)], 0)
    .expect("verified")
}

fn bench(c: &mut Criterion) {
    let scheme = Scheme::new(BodyHmac {
        header: http::HeaderName::from_static(BOTIX_SIGNATURE),
        prefix: Some("sha256=".into()),
        encoding: hookgate::config::Encoding::Hex,
    });
    let fields = event::EventFields::new(&Fields::default());
    let mut group = c.benchmark_group("event/parse");
    for (name, body) in [("status", STATUS), ("inbound", INBOUND)] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    (
                        verified(&scheme, body),
                        event::RequestId::generated(),
                        hookgate::ingress::trace::TraceContext::new_root(),
                    )
                },
                |(v, request_id, trace)| event::parse(v, black_box(&fields), request_id, trace),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
