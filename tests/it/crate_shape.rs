//! The whole crate keeps its shape: its modules sit in layers (vocabulary, inputs, analysis,
//! output, sessions, app) and import only from their own layer or those below; no function
//! is over 100 lines and no struct over 20 fields. Read from the sources (production code:
//! test modules and test files are left out), so a module that reaches up or a unit that
//! grows fails here rather than in review. What is still over the line is listed with why;
//! the lists may only shrink (a listed item that no longer needs to be fails the test).

use crate::analysis_shape::{after_qualifiers, block_end, code_only, fields, ident, rust_files};
use std::path::{Path, PathBuf};

const MAX_FN_LINES: usize = 100;
const MAX_FIELDS: usize = 20;

/// Each top-level module's layer. Lower numbers are lower layers.
const LAYERS: &[(&str, u8)] = &[
    // 0 vocabulary: the event, the syscall table, the report's schema, units and clocks.
    ("event", 0),
    ("syscalls", 0),
    ("report", 0),
    ("units", 0),
    ("clock", 0),
    ("signals", 0),
    ("handoff", 0),
    ("redis_conf", 0),
    // 1 inputs: trace text, live backends, what redis itself says.
    ("source", 1),
    ("live", 1),
    ("redis_log", 1),
    ("redis_client", 1),
    ("threads_file", 1),
    // 2 analysis.
    ("fdtable", 2),
    ("analyze", 2),
    ("redis_evidence", 2),
    ("evidence", 2),
    // 3 output.
    ("render", 3),
    ("recording", 3),
    // 4 sessions.
    ("session", 4),
    // 5 app: the only layer that sees the command line.
    ("cli", 5),
    ("app", 5),
    ("run", 5),
    ("watch", 5),
    ("docs", 5),
    ("progress", 5),
    ("main", 5),
];

/// Functions still over `MAX_FN_LINES`, with why they stay: (file, function, reason).
const LONG_FNS: &[(&str, &str, &str)] = &[];

/// Structs still over `MAX_FIELDS`: (file, struct, reason).
const WIDE_STRUCTS: &[(&str, &str, &str)] = &[];

/// Imports that still reach up a layer: (importing module, imported module, reason).
const UPWARD: &[(&str, &str, &str)] = &[];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The production code of every source file: test files left out, and `#[cfg(test)]` items
/// blanked (their lines kept, so line numbers still hold).
fn production_sources() -> Vec<(String, String)> {
    let mut files = vec![];
    rust_files(&src_dir(), &mut files);
    files.sort();
    files
        .into_iter()
        .filter(|f| {
            f.file_name().is_some_and(|n| n != "tests.rs")
                && !f.components().any(|c| c.as_os_str() == "tests")
        })
        .map(|f| {
            let rel = f
                .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")))
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let code = code_only(&std::fs::read_to_string(&f).unwrap());
            (rel, without_tests(&code))
        })
        .collect()
}

fn without_tests(code: &str) -> String {
    let lines: Vec<&str> = code.lines().collect();
    let mut keep = vec![true; lines.len()];
    for k in 0..lines.len() {
        if lines[k].trim() == "#[cfg(test)]" {
            let end = block_end(&lines, k + 1).unwrap_or(k + 1);
            keep[k..=end.min(lines.len() - 1)]
                .iter_mut()
                .for_each(|x| *x = false);
        }
    }
    lines
        .iter()
        .zip(keep)
        .map(|(l, k)| if k { *l } else { "" })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a source file belongs to (`src/live/bpf/mod.rs` -> `live`).
fn module_of(rel: &str) -> &str {
    let rest = rel.strip_prefix("src/").unwrap_or(rel);
    let first = rest.split('/').next().unwrap_or(rest);
    first.strip_suffix(".rs").unwrap_or(first)
}

fn layer(m: &str) -> Option<u8> {
    LAYERS.iter().find(|(n, _)| *n == m).map(|(_, l)| *l)
}

#[test]
fn every_module_has_a_layer() {
    for (rel, _) in production_sources() {
        let m = module_of(&rel);
        if m == "lib" {
            continue;
        }
        assert!(
            layer(m).is_some(),
            "{rel}: module `{m}` is in no layer (add it to LAYERS)"
        );
    }
}

#[test]
fn imports_run_down_the_layers() {
    let mut found = vec![];
    for (rel, code) in production_sources() {
        let from = module_of(&rel).to_string();
        let Some(lf) = layer(&from) else { continue };
        for (i, _) in code.match_indices("crate::") {
            let before = code[..i].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let to = ident(&code[i + "crate::".len()..]).to_string();
            if layer(&to).is_some_and(|lt| lt > lf) && !found.contains(&(from.clone(), to.clone()))
            {
                found.push((from.clone(), to));
            }
        }
    }
    let listed: Vec<(String, String)> = UPWARD
        .iter()
        .map(|(a, b, _)| (a.to_string(), b.to_string()))
        .collect();
    let new: Vec<_> = found.iter().filter(|x| !listed.contains(x)).collect();
    assert!(
        new.is_empty(),
        "modules importing from a higher layer: {new:?}"
    );
    let gone: Vec<_> = listed.iter().filter(|x| !found.contains(x)).collect();
    assert!(
        gone.is_empty(),
        "no longer upward, take them off UPWARD: {gone:?}"
    );
}

#[test]
fn no_long_function_or_wide_struct_anywhere() {
    let mut long = vec![];
    let mut wide = vec![];
    for (rel, code) in production_sources() {
        let lines: Vec<&str> = code.lines().collect();
        for (k, l) in lines.iter().enumerate() {
            let rest = after_qualifiers(l);
            if let Some(r) = rest.strip_prefix("fn ") {
                if let Some(end) = block_end(&lines, k) {
                    if end - k + 1 > MAX_FN_LINES {
                        long.push((rel.clone(), ident(r).to_string(), end - k + 1));
                    }
                }
            } else if let Some(r) = rest.strip_prefix("struct ") {
                let name = ident(r);
                let head = &r[name.len()..];
                if head.contains('(') || head.trim_end().ends_with(';') {
                    continue;
                }
                if let Some(end) = block_end(&lines, k) {
                    let n = fields(&lines, k, end);
                    if n > MAX_FIELDS {
                        wide.push((rel.clone(), name.to_string(), n));
                    }
                }
            }
        }
    }
    let check = |what: &str, found: &[(String, String, usize)], listed: &[(&str, &str, &str)]| {
        let new: Vec<_> = found
            .iter()
            .filter(|(f, n, _)| !listed.iter().any(|(lf, ln, _)| lf == f && ln == n))
            .collect();
        assert!(new.is_empty(), "{what}: {new:?}");
        let fixed: Vec<_> = listed
            .iter()
            .filter(|(lf, ln, _)| !found.iter().any(|(f, n, _)| lf == f && ln == n))
            .collect();
        assert!(
            fixed.is_empty(),
            "{what}: listed but no longer over the line, take them off the list: {fixed:?}"
        );
    };
    check(
        &format!("functions over {MAX_FN_LINES} lines"),
        &long,
        LONG_FNS,
    );
    check(
        &format!("structs over {MAX_FIELDS} fields"),
        &wide,
        WIDE_STRUCTS,
    );
}
