//! HMAC verification of the botix scheme (contract §2 step 3) for typical and maximum bodies.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hookgate::config::Encoding;
use hookgate::ingress::secrets::Secret;
use hookgate::providers::{botix_header, BodyHmac, Scheme, BOTIX_SIGNATURE};
use http::{HeaderMap, HeaderValue};

fn body(len: usize) -> Vec<u8> {
    let mut b = br#"{"id":"evt_1","event":"message.received","data":{"text":""#.to_vec();
    b.resize(len.saturating_sub(3), b'x');
    b.extend_from_slice(b"\"}}");
    b
}

fn bench(c: &mut Criterion) {
    let scheme = Scheme::new(BodyHmac {
        header: http::HeaderName::from_static(BOTIX_SIGNATURE),
        prefix: Some("sha256=".into()),
        encoding: Encoding::Hex,
    });
    let secret = b"bench-secret-0123456789";
    let mut group = c.benchmark_group("signature/verify");
    for (name, len) in [("1KiB", 1024), ("64KiB", 64 * 1024)] {
        let body = body(len);
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(&botix_header(secret, &body)).expect("header");
        headers.insert(BOTIX_SIGNATURE, value);
        group.throughput(Throughput::Bytes(len as u64));
        // One active secret (the usual case) and two (during a rotation, the match is the
        // second): every secret is always tried, so the cost doubles.
        let one = vec![Secret::new(secret)];
        let two = vec![Secret::new(b"previous-secret"), Secret::new(secret)];
        group.bench_function(format!("{name}/1-secret"), |b| {
            b.iter(|| scheme.verify(black_box(&headers), black_box(&body), &one, 0))
        });
        group.bench_function(format!("{name}/2-secrets"), |b| {
            b.iter(|| scheme.verify(black_box(&headers), black_box(&body), &two, 0))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
