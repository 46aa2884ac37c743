//! What the tests of every sender share: a header map of one header, and the senders'
//! published vectors in `tests/data/providers/`.

use http::{HeaderMap, HeaderValue};

pub(super) fn headers(name: &str, value: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
        HeaderValue::from_str(value).expect("value"),
    );
    h
}

pub(super) fn provider_vectors(name: &str) -> serde_json::Value {
    let path = format!("{}/tests/data/providers/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("provider vectors");
    serde_json::from_str(&text).expect("vectors parse")
}

pub(super) fn text(v: &serde_json::Value) -> &str {
    v.as_str().expect("text")
}
