//! JSON Pointers (RFC 6901) parsed once, when the config is loaded. `Value::pointer` splits
//! and unescapes the pointer text on every call, two new strings per token; a request looks
//! up five or six fields, so that was a dozen allocations per request for nothing.

use serde_json::Value;

/// A parsed JSON Pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPointer {
    /// Unescaped reference tokens; `None` for text that is not a pointer (it matches nothing,
    /// as with `Value::pointer`; config validation refuses such text before it gets here).
    tokens: Option<Vec<String>>,
}

impl JsonPointer {
    /// Parses pointer text: empty (the whole document) or `/`-separated tokens, with `~1`
    /// standing for `/` and `~0` for `~`.
    pub fn new(text: &str) -> Self {
        let tokens = if text.is_empty() {
            Some(Vec::new())
        } else {
            text.strip_prefix('/').map(|rest| {
                rest.split('/')
                    .map(|t| t.replace("~1", "/").replace("~0", "~"))
                    .collect()
            })
        };
        Self { tokens }
    }

    /// The value the pointer refers to in `root`, if there is one.
    pub fn lookup<'v>(&self, root: &'v Value) -> Option<&'v Value> {
        self.tokens
            .as_ref()?
            .iter()
            .try_fold(root, |value, token| match value {
                Value::Object(map) => map.get(token),
                Value::Array(items) => array_index(token).and_then(|i| items.get(i)),
                _ => None,
            })
    }
}

/// An array index token: decimal digits without a sign or a leading zero (RFC 6901 §4).
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() > 1) {
        return None;
    }
    token.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_what_value_pointer_finds() {
        let doc = json!({
            "id": "e1",
            "data": {"status": "sent", "items": [10, 11, {"x": true}]},
            "a/b": 1,
            "m~n": 2,
            "": 3,
            "01": 4,
        });
        for text in [
            "",
            "/id",
            "/data/status",
            "/data/items/0",
            "/data/items/2/x",
            "/data/items/01",
            "/data/items/+1",
            "/data/items/9",
            "/data/missing",
            "/id/deeper",
            "/a~1b",
            "/m~0n",
            "/",
            "/01",
            "no-slash",
        ] {
            assert_eq!(
                JsonPointer::new(text).lookup(&doc),
                doc.pointer(text),
                "{text:?}"
            );
        }
    }
}
