//! The Prometheus text exposition as tests read it: parsed samples, not grepped constants.

use std::collections::BTreeMap;

use super::Gateway;

/// One sample: metric name, labels, value.
#[derive(Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parsed `/metrics` output.
#[derive(Debug)]
pub struct Exposition(pub Vec<Sample>);

impl Exposition {
    /// Parses `name{label="value",...} value [timestamp]` lines; panics on anything else.
    pub fn parse(text: &str) -> Self {
        let mut samples = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let name_end = line
                .find(['{', ' '])
                .unwrap_or_else(|| panic!("bad line {line:?}"));
            let name = line[..name_end].to_owned();
            let mut labels = BTreeMap::new();
            let mut rest = &line[name_end..];
            if let Some(after) = rest.strip_prefix('{') {
                let mut chars = after.char_indices().peekable();
                let end = loop {
                    let (i, c) = chars.next().unwrap_or_else(|| panic!("unclosed {line:?}"));
                    match c {
                        '}' => break i,
                        ',' | ' ' => continue,
                        _ => {}
                    }
                    let mut key = String::from(c);
                    for (_, c) in chars.by_ref() {
                        if c == '=' {
                            break;
                        }
                        key.push(c);
                    }
                    assert_eq!(chars.next().map(|x| x.1), Some('"'), "quote in {line:?}");
                    let mut value = String::new();
                    loop {
                        let (_, c) = chars.next().unwrap_or_else(|| panic!("bad value {line:?}"));
                        match c {
                            '"' => break,
                            '\\' => match chars.next().map(|x| x.1) {
                                Some('n') => value.push('\n'),
                                Some(e) => value.push(e),
                                None => panic!("bad escape in {line:?}"),
                            },
                            c => value.push(c),
                        }
                    }
                    labels.insert(key, value);
                };
                rest = &after[end + 1..];
            }
            let value_text = rest
                .split_whitespace()
                .next()
                .unwrap_or_else(|| panic!("no value in {line:?}"));
            let value = value_text
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("bad value {value_text:?} in {line:?}"));
            samples.push(Sample {
                name,
                labels,
                value,
            });
        }
        Self(samples)
    }

    /// The sample with exactly these labels, if present.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0
            .iter()
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
    }

    /// Like [`Self::find`], with 0 for a labelled counter not created yet.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels).unwrap_or(0.0)
    }

    /// The `hookgate_dropped_events_total` of route botix for `reason` (0 before the first).
    pub fn dropped_total(&self, reason: &str) -> f64 {
        self.get(
            "hookgate_dropped_events_total",
            &[("route", "botix"), ("reason", reason)],
        )
    }
}

#[test]
pub fn exposition_parser_reads_labels_escapes_and_values() {
    let e = Exposition::parse(
        "# HELP x_total help\n# TYPE x counter\nx_total{a=\"1\",b=\"q\\\"u,o}te\"} 3\nh_bucket{le=\"+Inf\"} 7\ng 0.5\n# EOF\n",
    );
    assert_eq!(
        e.find("x_total", &[("a", "1"), ("b", "q\"u,o}te")]),
        Some(3.0)
    );
    assert_eq!(
        e.find("x_total", &[("a", "1")]),
        None,
        "labels must match exactly"
    );
    assert_eq!(e.find("h_bucket", &[("le", "+Inf")]), Some(7.0));
    assert_eq!(e.find("g", &[]), Some(0.5));
    assert_eq!(e.get("missing_total", &[("route", "r")]), 0.0);
}

/// The gateway's `/metrics`, parsed.
pub async fn scrape(client: &reqwest::Client, gw: &Gateway) -> Exposition {
    let resp = client
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(resp.status(), 200);
    Exposition::parse(&resp.text().await.expect("metrics body"))
}
