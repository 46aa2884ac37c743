//! The documents link only to files in the repository: a clone has nothing beside it.

use std::path::{Path, PathBuf};

/// The Markdown documents a user reads.
const DOCUMENTS: [&str; 5] = [
    "README.md",
    "ARCHITECTURE.md",
    "BENCHMARKS.md",
    "docs/contract.md",
    "deploy/kubernetes/README.md",
];

/// The targets of the inline links `[text](target)` of a Markdown text.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            targets.push(rest[..end].to_owned());
        }
    }
    targets
}

#[test]
fn documents_link_only_to_files_in_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    for doc in DOCUMENTS {
        let path = root.join(doc);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{doc}: {e}"));
        if text.contains("../shared") {
            problems.push(format!("{doc} names ../shared"));
        }
        let dir = path.parent().map_or_else(PathBuf::new, Path::to_path_buf);
        for target in link_targets(&text) {
            let file = target.split('#').next().unwrap_or_default();
            if file.is_empty() || target.contains("://") {
                continue;
            }
            if !dir.join(file).exists() {
                problems.push(format!(
                    "{doc} links to {target}, which is not in the repository"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_link_reader_finds_links() {
    let targets =
        link_targets("see [a](docs/a.md#x) and [b](https://example.org) [c](../shared/x)");
    assert_eq!(
        targets,
        ["docs/a.md#x", "https://example.org", "../shared/x"]
    );
}

/// The snake_case names in backquotes of a text that look like test names: five words or
/// more, not a metric (`hookgate_…`), with any `module::` prefix dropped.
fn named_tests(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|quoted| quoted.rsplit("::").next().unwrap_or(quoted))
        .filter(|name| {
            name.split('_').count() >= 5
                && !name.starts_with("hookgate_")
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .map(str::to_owned)
        .collect()
}

/// The text of every Rust file under `dir`.
fn rust_sources(dir: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).expect("source"));
        }
    }
}

#[test]
fn every_test_a_document_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = String::new();
    for dir in ["src", "crates", "tests"] {
        rust_sources(&root.join(dir), &mut sources);
    }
    let mut missing = Vec::new();
    for doc in DOCUMENTS.iter().chain(&["SECURITY.md"]) {
        let text = std::fs::read_to_string(root.join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
        for name in named_tests(&text) {
            if !sources.contains(&format!("fn {name}(")) {
                missing.push(format!("{doc} names {name}, which no test is called"));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn the_test_name_reader_skips_metrics_and_short_names() {
    let names = named_tests(
        "`limits::a_slow_loris_is_cut_off_now` `hookgate_spool_drainer_restarts_total` `max_body_bytes`",
    );
    assert_eq!(names, ["a_slow_loris_is_cut_off_now"]);
}
