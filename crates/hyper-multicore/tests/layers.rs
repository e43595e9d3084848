//! The core crate's layers point one way: every `crate::…` and `super::…` path in a module's
//! code names a module of its own layer or of a layer below it (docs/architecture.md draws the
//! picture this test holds the code to).
//!
//! ```text
//! fronts      launch (hmrun's job plan), the crate root
//! lifecycle   lifecycle
//! shmem       shmem (the runtime, its heap, data plane and collectives)
//! world       world (the launcher's environment, subgroups and their control planes)
//! transport   transport (routes, the shared-memory and network transports)
//! control     control (the control plane)
//! sys         sys, primitive (the only unsafe code; the atomics loom swaps)
//! base        config, error, logging
//! ```
//!
//! The test reads every source file of `src/`, takes the paths its code (not its comments nor
//! its unit tests) names — `use` trees expanded, `super::` resolved — and fails naming every
//! path that points up.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The layers, top first, and the top-level modules of each.
const LAYERS: &[(&str, &[&str])] = &[
    ("fronts", &["launch", ""]),
    ("lifecycle", &["lifecycle"]),
    ("shmem", &["shmem"]),
    ("world", &["world"]),
    ("transport", &["transport"]),
    ("control", &["control"]),
    ("sys", &["sys", "primitive"]),
    // The crate root re-exports the error types by name.
    (
        "base",
        &[
            "config",
            "error",
            "logging",
            "Error",
            "ErrorKind",
            "Recovery",
            "Result",
        ],
    ),
];

/// The index in [`LAYERS`] of the module at `path` (its components below the crate root).
fn layer_of(path: &[String]) -> usize {
    let top = path.first().map_or("", String::as_str);
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&top))
        .unwrap_or_else(|| panic!("module `{top}` is in no layer: add it to LAYERS"))
}

/// The module path of the source file `file` (relative to `src/`): `a/b.rs` and `a/b/mod.rs`
/// are `a::b`, `lib.rs` the root.
fn module_of(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// The code of a source file: comments, string and character literals blanked, and the unit
/// tests (from a `#[cfg(test)]` before a `mod`) cut off.
fn code_of(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        code.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                let mut previous = ' ';
                for c in chars.by_ref() {
                    if previous == '*' && c == '/' {
                        break;
                    }
                    previous = c;
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                code.push_str("\"\"");
            }
            _ => code.push(c),
        }
    }
    let mut kept = String::with_capacity(code.len());
    let mut lines = code.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]" {
            let next = lines.peek().map_or("", |l| l.trim());
            if next.starts_with("mod ") || next.starts_with("pub(crate) mod ") {
                break;
            }
        }
        kept.push_str(line);
        kept.push('\n');
    }
    kept
}

/// Every path a `use` tree names, its braces expanded: `a::{b, c::{d, e}}` gives `a::b`,
/// `a::c::d`, `a::c::e`.
fn expand_use(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').expect("a closing brace")];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|part| !part.is_empty())
        .flat_map(expand_use)
        .map(|path| format!("{prefix}{path}"))
        .collect()
}

/// The paths `code` names: each `use` declaration's, then every other `crate::…`,
/// `super::…` or `self::…` path.
fn paths_in(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code.to_string();
    // `use` declarations first (their trees may span lines), then blanked out.
    while let Some(start) = find_use(&rest) {
        let end = start + rest[start..].find(';').expect("a use declaration ends");
        let tree = rest[start..end].trim_start_matches(|c: char| c != ' ');
        paths.extend(expand_use(tree));
        rest.replace_range(start..end, &" ".repeat(end - start));
    }
    let bytes = rest.as_bytes();
    for root in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(found) = rest[from..].find(root) {
            let start = from + found;
            from = start + root.len();
            let preceded = start > 0
                && (bytes[start - 1].is_ascii_alphanumeric()
                    || bytes[start - 1] == b'_'
                    || bytes[start - 1] == b':');
            if preceded {
                continue;
            }
            let end = rest[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(rest.len(), |e| start + e);
            paths.push(rest[start..end].trim_end_matches(':').to_string());
        }
    }
    paths
}

/// Where the next `use` declaration of `code` starts (`use`, `pub use`, `pub(crate) use`…).
fn find_use(code: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = code[from..].find("use ") {
        let start = from + found;
        from = start + 4;
        let line_start = code[..start].rfind('\n').map_or(0, |n| n + 1);
        let before = code[line_start..start].trim();
        if before.is_empty() || before.starts_with("pub") {
            return Some(start);
        }
    }
    None
}

/// The module a path names from module `at`, as components below the crate root; `None` for a
/// path outside the crate (`std::…`, a dependency).
fn resolve(path: &str, at: &[String]) -> Option<Vec<String>> {
    let mut parts = path.split("::").filter(|p| !p.is_empty());
    let mut module: Vec<String> = match parts.next()? {
        "crate" => Vec::new(),
        "self" => at.to_vec(),
        "super" => {
            let mut m = at.to_vec();
            m.pop();
            m
        }
        _ => return None,
    };
    for part in parts {
        if part == "super" {
            module.pop();
        } else {
            module.push(part.to_string());
        }
    }
    Some(module)
}

/// Every `.rs` file under `dir` but unit tests kept in a file of their own (`tests.rs`).
fn sources(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_stem().is_some_and(|s| s != "tests")
        {
            into.push(path);
        }
    }
}

/// Every path of the crate's code that points to a higher layer, as "file: path (from → to)".
fn back_arrows(src: &Path) -> BTreeSet<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut found = BTreeSet::new();
    for file in files {
        let relative = file.strip_prefix(src).expect("under src/");
        let module = module_of(relative);
        let from = layer_of(&module);
        let text = std::fs::read_to_string(&file).expect("read a source file");
        for path in paths_in(&code_of(&text)) {
            let Some(target) = resolve(&path, &module) else {
                continue;
            };
            let to = layer_of(&target);
            if to < from {
                found.insert(format!(
                    "{}: {path} ({} → {})",
                    relative.display(),
                    LAYERS[from].0,
                    LAYERS[to].0
                ));
            }
        }
    }
    found
}

#[test]
fn no_module_imports_a_higher_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let arrows = back_arrows(&src);
    assert!(
        arrows.is_empty(),
        "{} paths point up the layers (see docs/architecture.md, \"Layers\"):\n{}",
        arrows.len(),
        arrows.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn the_parser_sees_a_back_arrow_in_a_use_tree_and_in_a_path() {
    let code = code_of(
        "use crate::{error::Result, shmem::{Shmem, sync}};\n\
         // crate::lifecycle in a comment is no import\n\
         fn f() { let _ = \"crate::world\"; super::super::lifecycle::acquire(); }\n\
         #[cfg(test)]\nmod tests { use crate::launch; }\n",
    );
    let paths = paths_in(&code);
    assert_eq!(
        paths,
        [
            "crate::error::Result",
            "crate::shmem::Shmem",
            "crate::shmem::sync",
            "super::super::lifecycle::acquire",
        ]
    );
    let at: Vec<String> = vec!["sys".into(), "worker".into()];
    assert_eq!(
        resolve("super::super::lifecycle::acquire", &at),
        Some(vec!["lifecycle".to_string(), "acquire".to_string()])
    );
    assert!(layer_of(&["lifecycle".into()]) < layer_of(&at));
}

#[test]
fn the_runtime_handle_is_implemented_only_in_shmem() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let elsewhere: Vec<String> = files
        .iter()
        .filter(|file| file.parent() != Some(src.join("shmem").as_path()))
        .filter(|file| {
            let code = code_of(&std::fs::read_to_string(file).expect("read a source file"));
            code.lines().any(|line| {
                let line = line.trim_start();
                line.starts_with("impl ") && line.trim_end_matches(" {").ends_with("Shmem")
            })
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(
        elsewhere.is_empty(),
        "`impl Shmem` belongs in src/shmem/*.rs, found in: {elsewhere:?}"
    );
}
