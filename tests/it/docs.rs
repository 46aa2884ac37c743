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
