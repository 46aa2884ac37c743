//! The documents stay true to the repository: their links and `#anchors` resolve to files
//! and headings in it (a clone has nothing beside it), every document under `docs/` is
//! reachable from the README, and every test a document names exists.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

/// The Markdown documents a user reads, besides every `docs/*.md`.
const DOCUMENTS: [&str; 6] = [
    "README.md",
    "CONTRIBUTING.md",
    "ARCHITECTURE.md",
    "BENCHMARKS.md",
    "SECURITY.md",
    "deploy/kubernetes/README.md",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every document, as a path relative to the repository's root.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = DOCUMENTS.iter().map(PathBuf::from).collect();
    let dir = root().join("docs");
    let mut extra: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir:?}: {e}"))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .map(|path| Path::new("docs").join(path.file_name().expect("a file name")))
        .collect();
    extra.sort();
    docs.extend(extra);
    docs
}

fn read(doc: &Path) -> String {
    std::fs::read_to_string(root().join(doc)).unwrap_or_else(|e| panic!("{doc:?}: {e}"))
}

/// The text outside fenced code blocks: a `#` there is a shell comment, not a heading.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The targets of the inline links `[text](target)` of a Markdown text, without a title.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            targets.push(target.trim_matches(['<', '>']).to_owned());
        }
    }
    targets
}

/// The anchor GitHub gives a heading's text: lower case, letters, digits, `-` and `_`
/// kept, spaces made `-`, everything else (punctuation, backquotes) dropped.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings; a repeated one gets `-1`, `-2`, … as on
/// GitHub. A link in a heading counts by its text.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for line in prose(text).lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(title) = line.get(hashes..).and_then(|t| t.strip_prefix(' ')) else {
            continue;
        };
        if hashes == 0 || hashes > 6 {
            continue;
        }
        let base = slug(&link_texts(title.trim()));
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// `text` with each inline link `[words](target)` replaced by its words.
fn link_texts(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|i| open + i) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|i| close + i) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// `dir/target` with `.` and `..` resolved, relative to the repository's root; `None` when
/// it leaves the repository.
fn resolve(dir: &Path, target: &str) -> Option<PathBuf> {
    let mut path = PathBuf::new();
    for part in dir.join(target).components() {
        match part {
            Component::Normal(p) => path.push(p),
            Component::ParentDir => {
                if !path.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(path)
}

/// What is wrong with the links of `doc`: a file outside the repository or missing, or an
/// anchor no heading of its target has.
fn broken_links(doc: &Path) -> Vec<String> {
    let text = read(doc);
    let mut problems = Vec::new();
    if text.contains("../shared") {
        problems.push(format!("{} names ../shared", doc.display()));
    }
    let dir = doc.parent().unwrap_or(Path::new(""));
    for target in link_targets(&prose(&text)) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (target.as_str(), None),
        };
        let linked = if file.is_empty() {
            Some(doc.to_path_buf())
        } else {
            resolve(dir, file)
        };
        let Some(linked) = linked.filter(|p| root().join(p).exists()) else {
            problems.push(format!(
                "{} links to {target}, which is not in the repository",
                doc.display()
            ));
            continue;
        };
        let Some(anchor) = anchor else { continue };
        if linked.extension().is_some_and(|e| e == "md")
            && !anchors(&read(&linked)).iter().any(|a| a == anchor)
        {
            problems.push(format!(
                "{} links to {target}, but {} has no heading #{anchor}",
                doc.display(),
                linked.display()
            ));
        }
    }
    problems
}

#[test]
fn links_and_anchors_resolve_to_files_and_headings_in_the_repository() {
    let problems: Vec<String> = documents().iter().flat_map(|d| broken_links(d)).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_document_under_docs_is_linked_from_the_readme() {
    let readme = link_targets(&read(Path::new("README.md")));
    let unlinked: Vec<String> = documents()
        .iter()
        .filter(|d| d.starts_with("docs"))
        .map(|d| d.display().to_string())
        .filter(|d| {
            !readme
                .iter()
                .any(|t| t.split('#').next() == Some(d.as_str()))
        })
        .collect();
    assert!(
        unlinked.is_empty(),
        "not linked from README.md: {unlinked:?}"
    );
}

#[test]
fn the_link_reader_finds_links_outside_code_blocks() {
    let text = "see [a](docs/a.md#x) and [b](https://example.org \"t\") [c](../shared/x)\n\
                ```sh\n[d](not/a/link)\n```\n";
    assert_eq!(
        link_targets(&prose(text)),
        ["docs/a.md#x", "https://example.org", "../shared/x"]
    );
}

#[test]
fn anchors_follow_githubs_rules() {
    let text = "# hookgate\n## 3. Dedup\n## The sled backend's state (`src/state/`)\n\
                ```sh\n# a comment\n```\n## Tests\n### Tests\n## See [the contract](c.md)\n";
    assert_eq!(
        anchors(text),
        [
            "hookgate",
            "3-dedup",
            "the-sled-backends-state-srcstate",
            "tests",
            "tests-1",
            "see-the-contract"
        ]
    );
}

#[test]
fn link_paths_resolve_inside_the_repository_only() {
    assert_eq!(
        resolve(Path::new("docs"), "../README.md"),
        Some("README.md".into())
    );
    assert_eq!(
        resolve(Path::new("deploy/kubernetes"), "./../../docs/a.md"),
        Some("docs/a.md".into())
    );
    assert_eq!(resolve(Path::new(""), "../shared/SPEC.md"), None);
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
    let mut sources = String::new();
    for dir in ["src", "tests", "crates"] {
        let dir = root().join(dir);
        if dir.is_dir() {
            rust_sources(&dir, &mut sources);
        }
    }
    let mut missing = Vec::new();
    for doc in documents() {
        for name in named_tests(&read(&doc)) {
            if !sources.contains(&format!("fn {name}(")) {
                missing.push(format!(
                    "{} names {name}, which no test is called",
                    doc.display()
                ));
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
