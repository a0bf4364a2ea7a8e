//! The analysis stage keeps the shape issue 12 gave it: no function in `src/analyze/` over
//! 100 lines, no struct there with more than 15 fields, and `analyze/mod.rs` (orchestration
//! only) under 400 lines outside its tests. Read from the sources, so a unit that grows past
//! these fails here rather than in review.

use std::path::{Path, PathBuf};

const MAX_FN_LINES: usize = 100;
const MAX_FIELDS: usize = 15;
const MAX_MOD_LINES: usize = 400;

/// The source with comments, string and char literals blanked (newlines kept), so that
/// braces are only the code's.
pub(crate) fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, s: &[u8]| {
        out.extend(s.iter().map(|c| if *c == b'\n' { b'\n' } else { b' ' }))
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let end = if rest.starts_with(b"//") {
            rest.iter().position(|c| *c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            find(rest, b"*/").map_or(rest.len(), |e| e + 2)
        } else if rest[0] == b'r'
            && (!ident_before || byte_prefix(b, i))
            && raw_open(rest).is_some()
        {
            let hashes = raw_open(rest).unwrap();
            let mut close = b"\"".to_vec();
            close.extend(std::iter::repeat_n(b'#', hashes));
            let start = 2 + hashes;
            find(&rest[start..], &close).map_or(rest.len(), |e| start + e + close.len())
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            j + 1
        } else if rest[0] == b'\'' && rest.get(1) == Some(&b'\\') {
            // The escaped character may be the quote itself (`'\''`).
            3 + rest[3..]
                .iter()
                .position(|c| *c == b'\'')
                .map_or(0, |e| e + 1)
        } else if rest[0] == b'\'' && rest.len() > 2 && closes_char(rest) {
            2 + char_len(&rest[1..])
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        let end = end.min(rest.len());
        blank(&mut out, &rest[..end]);
        i += end;
    }
    String::from_utf8(out).expect("blanking keeps ASCII and the code's own bytes")
}

/// A `b` right before `i` that is itself not part of an identifier: `br"..."` is a raw string.
fn byte_prefix(b: &[u8], i: usize) -> bool {
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    i >= 1 && b[i - 1] == b'b' && (i < 2 || !ident(b[i - 2]))
}

/// `r"` or `r#..#"`: the number of hashes.
fn raw_open(s: &[u8]) -> Option<usize> {
    let h = s[1..].iter().take_while(|c| **c == b'#').count();
    (s.get(1 + h) == Some(&b'"')).then_some(h)
}

/// `'x'` (a char literal) rather than `'a` (a lifetime).
fn closes_char(s: &[u8]) -> bool {
    s.get(1 + char_len(&s[1..])) == Some(&b'\'')
}

/// Bytes of the UTF-8 character starting `s`.
fn char_len(s: &[u8]) -> usize {
    match s[0] {
        c if c < 0x80 => 1,
        c if c >= 0xf0 => 4,
        c if c >= 0xe0 => 3,
        _ => 2,
    }
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// After any `pub`, `pub(crate)`, `const`, `unsafe`, `async`: the rest of the line.
pub(crate) fn after_qualifiers(line: &str) -> &str {
    let mut l = line.trim_start();
    loop {
        let before = l;
        for q in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "unsafe ",
            "async ",
        ] {
            l = l.strip_prefix(q).unwrap_or(l);
        }
        if l == before {
            return l;
        }
    }
}

pub(crate) fn ident(s: &str) -> &str {
    let n = s
        .bytes()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
        .count();
    &s[..n]
}

/// Lines from `start` to the line that closes the first `{` opened from there, or None when
/// a `;` comes first (a declaration without a body).
pub(crate) fn block_end(lines: &[&str], start: usize) -> Option<usize> {
    let mut depth = 0i32;
    let mut opened = false;
    for (k, l) in lines.iter().enumerate().skip(start) {
        for c in l.bytes() {
            match c {
                b'{' => {
                    depth += 1;
                    opened = true;
                }
                b'}' => depth -= 1,
                b';' if !opened => return None,
                _ => {}
            }
            if opened && depth == 0 {
                return Some(k);
            }
        }
    }
    None
}

/// Fields of the struct whose `{` opens on line `start`: names at depth one followed by `:`.
pub(crate) fn fields(lines: &[&str], start: usize, end: usize) -> usize {
    let mut depth = 0i32;
    let mut n = 0;
    for l in &lines[start..=end] {
        if depth == 1 {
            let rest = after_qualifiers(l);
            let name = ident(rest);
            if !name.is_empty() && rest[name.len()..].trim_start().starts_with(':') {
                n += 1;
            }
        }
        depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
    }
    n
}

struct Shape {
    /// (file, line, name, lines)
    long_fns: Vec<(PathBuf, usize, String, usize)>,
    /// (file, line, name, fields)
    wide_structs: Vec<(PathBuf, usize, String, usize)>,
}

fn shape_of(file: &Path, src: &str, out: &mut Shape) {
    let code = code_only(src);
    let lines: Vec<&str> = code.lines().collect();
    for (k, l) in lines.iter().enumerate() {
        let rest = after_qualifiers(l);
        if let Some(r) = rest.strip_prefix("fn ") {
            if let Some(end) = block_end(&lines, k) {
                let n = end - k + 1;
                if n > MAX_FN_LINES {
                    out.long_fns.push((file.into(), k + 1, ident(r).into(), n));
                }
            }
        } else if let Some(r) = rest.strip_prefix("struct ") {
            let name = ident(r);
            // A tuple or unit struct has no named fields.
            let head = &r[name.len()..];
            if head.contains('(') || head.trim_end().ends_with(';') {
                continue;
            }
            if let Some(end) = block_end(&lines, k) {
                let n = fields(&lines, k, end);
                if n > MAX_FIELDS {
                    out.wide_structs.push((file.into(), k + 1, name.into(), n));
                }
            }
        }
    }
}

pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("the source tree is readable") {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn analyze_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/analyze")
}

#[test]
fn no_long_function_or_wide_struct_in_the_analysis_stage() {
    let mut files = vec![];
    rust_files(&analyze_dir(), &mut files);
    files.sort();
    assert!(files.len() > 10, "{files:?}");
    let mut shape = Shape {
        long_fns: vec![],
        wide_structs: vec![],
    };
    for f in &files {
        shape_of(f, &std::fs::read_to_string(f).unwrap(), &mut shape);
    }
    assert!(
        shape.long_fns.is_empty(),
        "functions over {MAX_FN_LINES} lines: {:?}",
        shape.long_fns
    );
    assert!(
        shape.wide_structs.is_empty(),
        "structs over {MAX_FIELDS} fields: {:?}",
        shape.wide_structs
    );
}

#[test]
fn the_orchestration_stays_short() {
    let src = std::fs::read_to_string(analyze_dir().join("mod.rs")).unwrap();
    // Its unit tests are in their own files; a `#[cfg(test)]` block here would not count.
    let code = code_only(&src);
    let lines: Vec<&str> = code.lines().collect();
    let mut skip = vec![false; lines.len()];
    for k in 0..lines.len() {
        if lines[k].trim() == "#[cfg(test)]" {
            let end = block_end(&lines, k + 1).unwrap_or(k + 1);
            skip[k..=end].iter_mut().for_each(|s| *s = true);
        }
    }
    let n = skip.iter().filter(|s| !**s).count();
    assert!(n < MAX_MOD_LINES, "analyze/mod.rs: {n} lines outside tests");
}

/// The scanner itself: braces in strings, chars and comments are not the code's, and a
/// long function or a wide struct is found.
#[test]
fn the_scanner_sees_only_code() {
    let body = "    x += 1;\n".repeat(MAX_FN_LINES);
    let src = format!(
        "fn short() {{ let s = \"}}}}\"; let c = '}}'; let q = '\\''; // }}\n}}\n\
         pub(crate) fn long<'a>(x: &'a str) {{\n{body}}}\n\
         struct Wide {{\n{}}}\nstruct Tuple(u8);\nfn decl();\n",
        (0..=MAX_FIELDS)
            .map(|i| format!("    pub(crate) f{i}: u8,\n"))
            .collect::<String>()
    );
    let mut shape = Shape {
        long_fns: vec![],
        wide_structs: vec![],
    };
    shape_of(Path::new("t.rs"), &src, &mut shape);
    let fns: Vec<(&str, usize)> = shape.long_fns.iter().map(|f| (f.2.as_str(), f.3)).collect();
    assert_eq!(fns, [("long", MAX_FN_LINES + 2)]);
    let structs: Vec<(&str, usize)> = shape
        .wide_structs
        .iter()
        .map(|s| (s.2.as_str(), s.3))
        .collect();
    assert_eq!(structs, [("Wide", MAX_FIELDS + 1)]);
}
