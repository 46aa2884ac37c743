//! The source layout: every module of `src/` imports, through its `crate::` paths, only
//! modules on a lower floor of ARCHITECTURE.md's layers (so no two modules depend on each
//! other), the store's crates have the importers ARCHITECTURE.md names, and
//! ARCHITECTURE.md names only files that exist and stays short.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `.rs` files under `dir`, as paths relative to the repository root.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path.strip_prefix(root()).expect("under root").to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// The module path of a source file under the source root `src` (`src/state/mod.rs` →
/// `state`, `src/state/marks.rs` → `state::marks`); `None` for the crate roots.
fn module_of(file: &Path, src: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    let path = parts.join("::");
    (!path.is_empty() && path != "lib" && path != "main").then_some(path)
}

/// The non-test code of a source file: everything before its inline `#[cfg(test)] mod … {`
/// block, without comment lines.
fn code_of(text: &str) -> String {
    text[..test_block_start(text)]
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where a file's inline test module begins (`#[cfg(test)]` then `mod name {`), or its
/// length. A `#[cfg(test)] mod name;` declaration is not a test block: the code after it
/// still counts.
fn test_block_start(text: &str) -> usize {
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]\n") {
        let start = from + at;
        let next = text[start + "#[cfg(test)]\n".len()..]
            .lines()
            .next()
            .unwrap_or("");
        if next.starts_with("mod ") && next.trim_end().ends_with('{') {
            return start;
        }
        from = start + 1;
    }
    text.len()
}

/// The `crate::a::b::…` paths named in `code`, each as its segments.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    paths_after(code, "crate")
}

/// The paths that start with the path segment `first` (`first::a::b`) in `code`, each as the
/// segments after it; `first` must begin a path, not end one (`x::first::a` is not one). A
/// group (`first::a::{b, c::d}`) gives one path per item.
fn paths_after(code: &str, first: &str) -> Vec<Vec<String>> {
    let is_path_char = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
    let needle = format!("{first}::");
    let mut paths = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find(&needle) {
        let start = from + at;
        from = start + needle.len();
        // `$crate::…` in a macro names the path its expansion uses, at the call site.
        if code[..start]
            .chars()
            .next_back()
            .is_some_and(|c| is_path_char(c) || c == '$')
        {
            continue;
        }
        let rest = &code[from..];
        let end = rest.find(|c: char| !is_path_char(c)).unwrap_or(rest.len());
        let segments: Vec<String> = rest[..end]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let group = rest[end..]
            .strip_prefix('{')
            .and_then(|g| g.split_once('}'))
            .map(|(items, _)| items);
        let Some(items) = group else {
            paths.push(segments);
            continue;
        };
        for item in items.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let item: Vec<String> = item
                .split("::")
                .map(|s| s.split_whitespace().next().unwrap_or(s))
                .filter(|s| !s.is_empty() && *s != "self" && *s != "*")
                .map(str::to_owned)
                .collect();
            paths.push([segments.clone(), item].concat());
        }
    }
    paths
}

/// `code` cut at its inline modules (`mod name { … }`): each piece with the names of the
/// inline modules it is in, so a `super::` inside one is read from there.
fn inline_scopes(code: &str) -> Vec<(Vec<String>, String)> {
    let mut pieces: Vec<(Vec<String>, String)> = Vec::new();
    let mut open: Vec<(String, i64)> = Vec::new();
    let mut depth = 0i64;
    for line in code.lines() {
        let trimmed = line.trim_start();
        let declared = ["pub(crate) ", "pub(super) ", "pub "]
            .iter()
            .find_map(|p| trimmed.strip_prefix(p))
            .unwrap_or(trimmed);
        let inline = declared
            .strip_prefix("mod ")
            .and_then(|rest| rest.strip_suffix('{'))
            .map(str::trim);
        if let Some(name) = inline {
            open.push((name.to_owned(), depth));
        }
        let scope: Vec<String> = open.iter().map(|(name, _)| name.clone()).collect();
        match pieces.last_mut() {
            Some((last, text)) if *last == scope => {
                text.push_str(line);
                text.push('\n');
            }
            _ => pieces.push((scope, format!("{line}\n"))),
        }
        depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
        while open.last().is_some_and(|(_, at)| depth <= *at) {
            open.pop();
        }
    }
    pieces
}

/// The paths `code` of `module` names, as full module paths of its crate: `crate::…`,
/// `super::…` and `self::…` (read from the inline module they are in), and the paths that
/// begin with one of its `children`.
fn named_paths(code: &str, module: &str, children: &[String]) -> Vec<Vec<String>> {
    let own: Vec<String> = module.split("::").map(str::to_owned).collect();
    let mut found = crate_paths(code);
    for (inline, piece) in inline_scopes(code) {
        let here = [own.clone(), inline.clone()].concat();
        for segments in paths_after(&piece, "super") {
            let mut base = here[..here.len() - 1].to_vec();
            let mut rest = segments.as_slice();
            while let Some(("super", tail)) = rest.split_first().map(|(h, t)| (h.as_str(), t)) {
                base.pop();
                rest = tail;
            }
            found.push([base, rest.to_vec()].concat());
        }
        for segments in paths_after(&piece, "self") {
            found.push([here.clone(), segments].concat());
        }
        if inline.is_empty() {
            for child in children {
                for segments in paths_after(&piece, child) {
                    found.push([own.clone(), vec![child.clone()], segments].concat());
                }
            }
        }
    }
    found
}

/// The child modules a file declares (`mod name;`, `pub mod name;`, `pub(crate) mod name;`).
fn declared_children(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line
                .strip_prefix("pub(crate) ")
                .or(line.strip_prefix("pub "))
                .unwrap_or(line);
            let name = line.strip_prefix("mod ")?.strip_suffix(';')?;
            (!name.contains(char::is_whitespace)).then(|| name.to_owned())
        })
        .collect()
}

/// The files of modules declared `#[cfg(test)] mod name;` (test kits and model tests).
fn test_only_files(src: &Path) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    for file in rust_files(&root().join(src)) {
        let text = std::fs::read_to_string(root().join(&file)).expect("source file");
        let dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => file.parent().map(Path::to_path_buf),
            _ => Some(file.with_extension("")),
        };
        let Some(dir) = dir else { continue };
        for part in text.split("#[cfg(test)]\n").skip(1) {
            let declared = part.trim_start().trim_start_matches("pub(crate) ");
            let name = declared
                .strip_prefix("mod ")
                .and_then(|rest| rest.split_once(';'))
                .map(|(name, _)| name.trim());
            if let Some(name) = name.filter(|n| !n.contains(char::is_whitespace)) {
                found.insert(dir.join(format!("{name}.rs")));
            }
        }
    }
    found
}

/// Module → the modules its non-test code names, for the crate whose sources are in `src`
/// (relative to the repository root).
fn dependency_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let test_only = test_only_files(src);
    let files: Vec<PathBuf> = rust_files(&root().join(src))
        .into_iter()
        .filter(|f| !test_only.contains(f))
        .collect();
    let modules: BTreeMap<String, PathBuf> = files
        .iter()
        .filter_map(|f| module_of(f, src).map(|m| (m, f.clone())))
        .collect();
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(root().join(file)).expect("source file");
        let code = code_of(&text);
        let mut deps = BTreeSet::new();
        for segments in named_paths(&code, module, &declared_children(&code)) {
            // The longest prefix of the path that is a module.
            let target = (1..=segments.len())
                .rev()
                .map(|n| segments[..n].join("::"))
                .find(|m| modules.contains_key(m));
            if let Some(target) = target.filter(|t| t != module) {
                deps.insert(target);
            }
        }
        graph.insert(module.clone(), deps);
    }
    graph
}

/// The source folders of the gateway and of each workspace crate.
fn source_roots() -> Vec<PathBuf> {
    let mut roots = vec![PathBuf::from("src")];
    let crates = std::fs::read_dir(root().join("crates")).expect("crates/");
    for entry in crates {
        let src = entry.expect("crates/ entry").path().join("src");
        if src.is_dir() {
            roots.push(src.strip_prefix(root()).expect("under root").to_path_buf());
        }
    }
    roots.sort();
    roots
}

/// Each cycle of `graph` as one of its paths, `a -> b -> a`.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut found = Vec::new();
    for start in graph.keys() {
        // Depth-first from `start`, looking for a way back to it through larger names only,
        // so each cycle is reported once (from its smallest module).
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((node, path)) = stack.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if next == start {
                    found.push(format!("{} -> {start}", path.join(" -> ")));
                } else if next > start && seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    found
}

#[test]
fn no_module_depends_on_a_module_that_depends_back_on_it() {
    // Files of one folder count too: `super::` and `self::` paths are edges, and so are a
    // front door's re-exports of its children.
    let mut found = Vec::new();
    for src in source_roots() {
        let graph = dependency_graph(&src);
        if src == Path::new("src") {
            assert!(graph.len() > 20, "the scan found the modules: {graph:?}");
        }
        let in_crate = cycles(&graph);
        found.extend(
            in_crate
                .into_iter()
                .map(|c| format!("{}: {c}", src.display())),
        );
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

#[test]
fn no_folder_depends_on_a_folder_that_depends_back_on_it() {
    // The same check one level up: `state/` and `guard/` count as one module each.
    let top = |m: &str| m.split("::").next().unwrap_or(m).to_owned();
    let mut folders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, deps) in dependency_graph(Path::new("src")) {
        let entry = folders.entry(top(&module)).or_default();
        entry.extend(deps.iter().map(|d| top(d)).filter(|d| *d != top(&module)));
    }
    let found = cycles(&folders);
    assert!(
        found.is_empty(),
        "import cycles between folders:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, deps)| (m.to_owned(), deps.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(cycles(&graph), ["a -> b -> c -> a"]);
    assert_eq!(
        crate_paths("use crate::state::marks::{Claim};\nlet x = crate::clock::now();"),
        [vec!["state", "marks", "Claim"], vec!["clock", "now"]]
    );
}

/// The repository paths of Rust files that ARCHITECTURE.md names: in its code map block
/// and in backquotes.
fn mapped_files(text: &str) -> BTreeSet<String> {
    text.split(|c: char| c.is_whitespace() || "`(),|".contains(c))
        .filter(|word| word.ends_with(".rs") && word.contains('/'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_path_reader_finds_paths_in_blocks_and_backquotes() {
    let named = mapped_files("src/a.rs  what\n| `src/b/c.rs` (`f`) |\nsee lib.rs");
    assert_eq!(named, ["src/a.rs", "src/b/c.rs"].map(str::to_owned).into());
}

#[test]
fn architecture_names_only_existing_files_and_stays_short() {
    let text = architecture();
    let named = mapped_files(&text);
    let missing: Vec<_> = named.iter().filter(|f| !root().join(f).exists()).collect();
    assert!(missing.is_empty(), "named but absent: {missing:?}");
    assert!(
        text.len() <= 12 * 1024,
        "ARCHITECTURE.md is {} bytes; a newcomer reads it in one sitting at 12 KiB",
        text.len()
    );
}

fn architecture() -> String {
    std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md")
}

/// The floors of ARCHITECTURE.md's "Layers" table: module → floor.
fn floors(text: &str) -> BTreeMap<String, u32> {
    let mut floors = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, floor, modules, _] = cells[..] else {
            continue;
        };
        let Ok(floor) = floor.parse::<u32>() else {
            continue;
        };
        for module in modules.split('`').skip(1).step_by(2) {
            floors.insert(module.to_owned(), floor);
        }
    }
    floors
}

#[test]
fn the_floor_reader_reads_the_layers_table() {
    let table =
        "| floor | modules |\n|---|---|\n| 0 | `config`, `clock` |\n| 2 | `cli` (the binary) |\n";
    let read = floors(table);
    let expected: BTreeMap<String, u32> = [("cli", 2), ("clock", 0), ("config", 0)]
        .into_iter()
        .map(|(m, f)| (m.to_owned(), f))
        .collect();
    assert_eq!(read, expected);
}

#[test]
fn every_module_imports_only_modules_on_lower_floors() {
    let floors = floors(&architecture());
    assert!(floors.len() > 10, "the layers table was read: {floors:?}");
    let top = |m: &str| m.split("::").next().unwrap_or(m).to_owned();
    let mut problems = Vec::new();
    for (module, deps) in dependency_graph(Path::new("src")) {
        let Some(&floor) = floors.get(&top(&module)) else {
            problems.push(format!("{module} has no floor in ARCHITECTURE.md's layers"));
            continue;
        };
        for dep in deps.iter().filter(|d| top(d) != top(&module)) {
            match floors.get(&top(dep)) {
                Some(&below) if below < floor => {}
                Some(&other) => problems.push(format!(
                    "{module} (floor {floor}) imports {dep} (floor {other})"
                )),
                None => problems.push(format!("{dep} has no floor in ARCHITECTURE.md's layers")),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_store_crates_have_the_importers_architecture_names() {
    // Non-test code only: tests may use the simulated disk and the journal anywhere.
    let allowed: [(&str, &[&str]); 3] = [
        ("expiring_lsm", &["state", "store_error"]),
        ("disk_seam", &["state"]),
        (
            "durable_spool",
            &["state", "outbox", "app", "cli", "store_error", "config"],
        ),
    ];
    let test_only = test_only_files(Path::new("src"));
    let mut problems = Vec::new();
    for file in rust_files(&root().join("src")) {
        if test_only.contains(&file) {
            continue;
        }
        let Some(module) = module_of(&file, Path::new("src")) else {
            continue;
        };
        let top = module.split("::").next().unwrap_or(&module).to_owned();
        let text = std::fs::read_to_string(root().join(&file)).expect("source file");
        let code = code_of(&text);
        for (krate, importers) in allowed {
            if code.contains(&format!("{krate}::")) && !importers.contains(&top.as_str()) {
                problems.push(format!("{} uses {krate}", file.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_path_reader_resolves_paths_relative_to_their_module() {
    let code = "use super::owner::Job;\nuse super::super::clock;\npub use nodes::Node;\nlet x = self::a::b;";
    let named = named_paths(code, "outbox::publish::connection", &["nodes".to_owned()]);
    let joined: Vec<String> = named.iter().map(|s| s.join("::")).collect();
    assert_eq!(
        joined,
        [
            "outbox::publish::owner::Job",
            "outbox::clock",
            "outbox::publish::connection::a::b",
            "outbox::publish::connection::nodes::Node",
        ]
    );
    assert_eq!(
        paths_after("x::super::y", "super"),
        Vec::<Vec<String>>::new()
    );
    let grouped = "use super::{a, b::C};\nmod inner {\n    use super::d;\n}\nuse super::e;";
    let joined: Vec<String> = named_paths(grouped, "m::f", &[])
        .iter()
        .map(|s| s.join("::"))
        .collect();
    assert_eq!(joined, ["m::a", "m::b::C", "m::f::d", "m::e"]);
    let test_block =
        "fn a() {}\n#[cfg(test)]\nmod model;\nfn b() {}\n#[cfg(test)]\nmod tests {\n}\n";
    assert!(code_of(test_block).contains("fn b()"));
    assert!(!code_of(test_block).contains("mod tests"));
}

/// Lines a folder's `mod.rs` may hold before its tests: the doc, the `mod` lines, the
/// re-exports and the facade type a caller meets. Logic lives in files named for it.
const FRONT_DOOR_LINES: usize = 150;

#[test]
fn every_mod_rs_is_a_front_door() {
    let mut problems = Vec::new();
    for src in source_roots() {
        for file in rust_files(&root().join(&src)) {
            if file.file_name().is_none_or(|n| n != "mod.rs") {
                continue;
            }
            let text = std::fs::read_to_string(root().join(&file)).expect("source file");
            let lines = text[..test_block_start(&text)].lines().count();
            if lines > FRONT_DOOR_LINES {
                problems.push(format!("{}: {lines} lines", file.display()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "mod.rs files over {FRONT_DOOR_LINES} lines before their tests (move the logic into \
         a file named for it):\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_file_name_says_what_it_holds_in_one_folder_only() {
    // `config/` and `metrics/` name their files after the owner they configure or count.
    let exempt = ["src/config/", "src/metrics/"];
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in rust_files(&root().join("src")) {
        let path = file.display().to_string();
        let name = file
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        if name == "mod.rs" || exempt.iter().any(|e| path.starts_with(e)) {
            continue;
        }
        seen.entry(name).or_default().push(path);
    }
    let repeated: Vec<String> = seen
        .into_values()
        .filter(|paths| paths.len() > 1)
        .map(|paths| paths.join(" and "))
        .collect();
    assert!(
        repeated.is_empty(),
        "one name, two rooms:\n{}",
        repeated.join("\n")
    );
}
