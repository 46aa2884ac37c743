//! The exposition formats `/metrics` answers in, chosen by the scraper's `Accept`.

/// The exposition formats `/metrics` answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4: what `curl` and most scrapers read.
    Text,
    /// OpenMetrics 1.0.0 text, for a scraper that asks for it.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when `accept` lists `application/openmetrics-text` with a non-zero
    /// quality (Prometheus sends that), else the text format.
    pub fn from_accept(accept: Option<&str>) -> Self {
        let wants_openmetrics = accept.unwrap_or_default().split(',').any(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f64>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
        });
        if wants_openmetrics {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// `text` (an exposition) with the samples of each family in the order of their labels:
/// a route's series stand together, whatever order the registry's maps hold them in. The
/// lines of one series (a histogram's buckets, sum and count) keep their order, and so do
/// the `#` lines that open each family.
pub fn group_series(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut family: Vec<&str> = Vec::new();
    let flush = |family: &mut Vec<&str>, out: &mut String| {
        family.sort_by_key(|line| series_labels(line));
        for line in family.drain(..) {
            out.push_str(line);
            out.push('\n');
        }
    };
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut family, &mut out);
            out.push_str(line);
            out.push('\n');
        } else {
            family.push(line);
        }
    }
    flush(&mut family, &mut out);
    out
}

/// The labels of a sample line that name its series: all but a histogram bucket's `le`.
fn series_labels(line: &str) -> Vec<&str> {
    let Some((_, rest)) = line.split_once('{') else {
        return Vec::new();
    };
    let labels = rest.split_once('}').map_or(rest, |(labels, _)| labels);
    labels
        .split(',')
        .filter(|label| !label.starts_with("le="))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_follows_accept_and_defaults_to_text() {
        let prometheus = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        for (accept, format) in [
            (None, Format::Text),
            (Some("*/*"), Format::Text),
            (Some("text/plain"), Format::Text),
            (Some(prometheus), Format::OpenMetrics),
            (Some("Application/OpenMetrics-Text"), Format::OpenMetrics),
            (
                Some("application/openmetrics-text;q=0, text/plain"),
                Format::Text,
            ),
        ] {
            assert_eq!(Format::from_accept(accept), format, "{accept:?}");
        }
    }

    #[test]
    fn each_routes_series_stand_together_and_a_histograms_lines_keep_their_order() {
        let text = "# HELP r Requests.\n# TYPE r counter\nr_total{route=\"twilio\",outcome=\"a\"} 1\nr_total{route=\"botix\",outcome=\"b\"} 2\nr_total{route=\"botix\",outcome=\"a\"} 3\n# HELP d Duration.\n# TYPE d histogram\nd_sum{route=\"z\"} 1\nd_bucket{route=\"z\",le=\"0.5\"} 1\nd_bucket{route=\"z\",le=\"+Inf\"} 1\nd_sum{route=\"a\"} 2\nd_bucket{route=\"a\",le=\"0.5\"} 2\nd_bucket{route=\"a\",le=\"+Inf\"} 2\n# EOF\n";
        let expected = "# HELP r Requests.\n# TYPE r counter\nr_total{route=\"botix\",outcome=\"a\"} 3\nr_total{route=\"botix\",outcome=\"b\"} 2\nr_total{route=\"twilio\",outcome=\"a\"} 1\n# HELP d Duration.\n# TYPE d histogram\nd_sum{route=\"a\"} 2\nd_bucket{route=\"a\",le=\"0.5\"} 2\nd_bucket{route=\"a\",le=\"+Inf\"} 2\nd_sum{route=\"z\"} 1\nd_bucket{route=\"z\",le=\"0.5\"} 1\nd_bucket{route=\"z\",le=\"+Inf\"} 1\n# EOF\n";
        assert_eq!(group_series(text), expected);
    }
}
