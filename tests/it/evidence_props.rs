//! What a report may claim from a trace (issue 13), checked over every trace in fixtures/
//! (our captures, our perf captures, the peer traces written by others) and on traces made
//! from them: no critical finding rests only on upper bounds, no reconstructed duration or
//! gap spans a line that could not be read, a trace with no timestamps has no stall, and
//! nothing panics. Plus the perf trace shape with no fd paths.

use assert_cmd::Command;
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};

fn analyze(path: &Path, extra: &[&str]) -> (Option<i32>, Value, String) {
    let out = Command::cargo_bin("stallscope")
        .unwrap()
        .arg("analyze")
        .arg(path)
        .args(["--format", "json", "--date", "2026-11-30Z"])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), json, stderr)
}

/// Every trace file under fixtures/ (the shapes scripts/golden.sh reads); also the
/// property tests of `wild_shapes`.
pub(crate) fn traces() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
                continue;
            }
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let peer = p.to_string_lossy().contains("peer")
                && name.ends_with(".txt")
                && !name.starts_with("SOURCES")
                && !name.starts_with("README");
            let trace = name.ends_with(".strace")
                || name.ends_with(".strace.gz")
                || name.contains(".strace.")
                    && name.rsplit('.').next().unwrap().parse::<u32>().is_ok()
                || name.ends_with(".perf.txt")
                || name.ends_with(".perf.txt.gz");
            if peer || trace {
                out.push(p);
            }
        }
    }
    let mut out = vec![];
    walk(Path::new("fixtures"), &mut out);
    out.sort();
    out
}

/// A threshold low enough that a span across a cut shows as a stall.
const LOW: &[&str] = &["--threshold", "1ms"];

/// The text of a trace, gunzipped.
fn text(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap();
    if path.extension().is_some_and(|e| e == "gz") {
        let mut out = vec![];
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .unwrap();
        out
    } else {
        raw
    }
}

/// The properties every report must keep, whatever the trace.
fn check(name: &str, code: Option<i32>, r: &Value, stderr: &str) {
    assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    assert!(
        matches!(code, Some(0..=2)),
        "{name}: exit {code:?}: {stderr}"
    );
    if code == Some(2) {
        // An error (no event read, a summary-only file): said on stderr, ending in a newline.
        assert!(
            stderr.starts_with("stallscope: error: "),
            "{name}: {stderr}"
        );
        assert!(stderr.ends_with('\n'), "{name}: {stderr:?}");
        return;
    }
    let stalls = r["stalls"].as_array().unwrap();
    assert_eq!(
        code == Some(1),
        r["summary"]["stalls"].as_u64().unwrap() > 0,
        "{name}: the exit status is the verdict"
    );
    // No critical finding rests only on upper bounds.
    for f in r["findings"].as_array().unwrap() {
        if f["severity"] != "critical" || f["stalls"].as_u64().unwrap_or(0) == 0 {
            continue;
        }
        let known = stalls.iter().any(|s| {
            s["finding"] == f["id"]
                && matches!(s["duration_known"].as_str(), Some("measured" | "paired"))
        });
        assert!(known, "{name}: critical {} on upper bounds only", f["id"]);
    }
    // A finding whose stalls are all upper bounds (or unknown) says so in its evidence.
    for f in r["findings"].as_array().unwrap() {
        let mine: Vec<&Value> = stalls.iter().filter(|s| s["finding"] == f["id"]).collect();
        let only_bounds = !mine.is_empty()
            && mine.iter().all(|s| {
                matches!(
                    s["duration_known"].as_str(),
                    Some("upper_bound" | "unknown")
                )
            });
        if only_bounds {
            let ev = f["evidence"].as_str().unwrap_or("");
            assert!(
                ev.contains("upper bound"),
                "{name}: {} says not: {ev}",
                f["id"]
            );
        }
    }
    // Figures are marked as upper bounds only where some are: a trace of measured durations
    // with no upper-bound stall has no "≤" or "at most" in its findings.
    let bounded = stalls
        .iter()
        .chain(r["in_flight"].as_array().unwrap())
        .any(|s| s["bound"] == "at_most");
    if r["summary"]["durations"] == "measured" && !bounded {
        for f in r["findings"].as_array().unwrap() {
            let text = format!("{} {}", f["title"], f["evidence"]);
            assert!(
                !text.contains('≤') && !text.contains("at most"),
                "{name}: {} marks a measured figure: {text}",
                f["id"]
            );
        }
    }
    // No timestamps and no -T: nothing measured, no stall.
    if r["summary"]["durations"] == "none" {
        assert!(stalls.is_empty(), "{name}: {stalls:?}");
        assert_eq!(r["summary"]["stalls"], 0, "{name}");
    }
    if r["source"]["clock"] == "none" && r["summary"]["durations"] != "measured" {
        assert_eq!(r["summary"]["durations"], "none", "{name}");
    }
    // Each stall says how its duration is known.
    for s in stalls {
        assert!(
            matches!(
                s["duration_known"].as_str(),
                Some("measured" | "paired" | "upper_bound" | "unknown")
            ),
            "{name}: {s}"
        );
    }
}

#[test]
fn every_fixture_and_peer_trace_keeps_the_reports_promises() {
    let all = traces();
    assert!(all.len() > 40, "fixtures found: {}", all.len());
    for path in &all {
        let name = path.display().to_string();
        let (code, r, stderr) = analyze(path, &[]);
        check(&name, code, &r, &stderr);
    }
}

/// Every fixture cut by an unreadable line (a block of lines from its middle replaced by a
/// pasted `...`, as people elide traces): no gap and no reconstructed call spans the cut.
/// Taking lines out merges each thread's time around them into one span, so every gap and
/// every upper-bound call of the cut trace must be one of the uncut trace, at the same time
/// and of the same length. A low threshold makes any such span show.
#[test]
fn no_gap_or_reconstructed_duration_spans_an_unreadable_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut cut_traces = 0;
    let key = |s: &Value| {
        (
            s["tid"].as_u64(),
            s["kind"].as_str().map(str::to_string),
            s["at_us"].as_i64(),
            s["duration_us"].as_i64(),
        )
    };
    for path in traces() {
        let t = text(&path);
        let lines: Vec<&[u8]> = t.split(|b| *b == b'\n').collect();
        if lines.len() < 3 {
            continue;
        }
        let (code0, r0, _) = analyze(&path, LOW);
        // strace -r times count from the previous line: lines taken out shift every later one.
        if code0 == Some(2)
            || (r0["source"]["kind"] == "strace" && r0["source"]["clock"] == "relative")
        {
            continue;
        }
        let mid = lines.len() / 2;
        let block = (lines.len() / 20).max(1);
        let mut out: Vec<u8> = vec![];
        for (i, l) in lines.iter().enumerate() {
            if i > mid && i < mid + block {
                continue;
            }
            out.extend_from_slice(if i == mid { b"..." } else { l });
            if i + 1 < lines.len() {
                out.push(b'\n');
            }
        }
        let name = path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".gz", "");
        let cut = dir.path().join(&name);
        std::fs::write(&cut, &out).unwrap();
        let (code, r, stderr) = analyze(&cut, LOW);
        let label = format!("{} cut at line {}", path.display(), mid + 1);
        check(&label, code, &r, &stderr);
        if code == Some(2) {
            continue;
        }
        cut_traces += 1;
        let before: std::collections::HashSet<_> =
            r0["stalls"].as_array().unwrap().iter().map(key).collect();
        for s in r["stalls"].as_array().unwrap() {
            let spans = s["kind"] == "gap" || s["duration_known"] == "upper_bound";
            assert!(
                !spans || before.contains(&key(s)),
                "{label}: spans the cut: {s}"
            );
        }
    }
    assert!(cut_traces > 20, "traces cut: {cut_traces}");
}

/// Every fixture with its timestamps and `-T` durations taken away measures nothing: no
/// stall, `durations` none, and a headline that says so.
#[test]
fn a_trace_with_no_timestamps_has_no_stall() {
    let dir = tempfile::tempdir().unwrap();
    let stamp = regex::bytes::Regex::new(
        r"(?m)^((?:\[pid +\d+\] |\d+ +)?)(?:\d+:\d\d:\d\d(?:\.\d+)?|\d{9,}\.\d+|\d+\.\d{6}) ",
    )
    .unwrap();
    let dur = regex::bytes::Regex::new(r" <\d+\.\d+>(\s*)$").unwrap();
    let mut stripped = 0;
    for path in traces() {
        let name = path.to_string_lossy();
        if name.contains(".perf.") || name.contains("perf-trace") {
            continue; // perf trace always prints times
        }
        let t = text(&path);
        let mut out = vec![];
        for l in t.split(|b| *b == b'\n') {
            let l = stamp.replace(l, &b"$1"[..]);
            let l = dur.replace(&l, &b"$1"[..]);
            out.extend_from_slice(&l);
            out.push(b'\n');
        }
        let file = dir.path().join(
            path.file_name()
                .unwrap()
                .to_string_lossy()
                .replace(".gz", ""),
        );
        std::fs::write(&file, &out).unwrap();
        let (code, r, stderr) = analyze(&file, &[]);
        let label = format!("{name} without timestamps");
        check(&label, code, &r, &stderr);
        if code == Some(2) || r["source"]["clock"] != "none" {
            continue;
        }
        stripped += 1;
        assert_eq!(r["summary"]["durations"], "none", "{label}");
        assert!(r["stalls"].as_array().unwrap().is_empty(), "{label}");
        assert_eq!(code, Some(0), "{label}");
        let table = Command::cargo_bin("stallscope")
            .unwrap()
            .arg("analyze")
            .arg(&file)
            .output()
            .unwrap();
        let head = String::from_utf8_lossy(&table.stdout);
        let head = head.lines().next().unwrap_or("");
        assert!(
            head.contains("durations cannot be known"),
            "{label}: {head}"
        );
    }
    assert!(stripped > 20, "traces stripped: {stripped}");
}

/// `perf trace` without fd paths (no augmentation: `fd: 7` alone): the file the main thread
/// writes and then fdatasyncs is the AOF, as for strace without -y, so appendfsync always is
/// named. Made from our own capture (fixtures/README.md: the AOF is fd 7, appendfsync always)
/// by cutting every `<path>` after an fd number.
#[test]
fn perf_fds_without_paths_are_classed_by_behaviour() {
    let src = Path::new("fixtures/perf-captures/redis-always-p-T.perf.txt.gz");
    let t = String::from_utf8(text(src)).unwrap();
    let paths = regex::Regex::new(r"(fd: \d+)<[^>]*>").unwrap();
    let bare = paths.replace_all(&t, "$1");
    assert!(!bare.contains(".aof>"), "paths left");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bare.perf.txt");
    std::fs::write(&file, bare.as_bytes()).unwrap();
    let (code, r, stderr) = analyze(&file, &[]);
    check("bare perf", code, &r, &stderr);
    let ids: Vec<&str> = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["id"].as_str())
        .collect();
    assert!(ids.contains(&"aof-fsync-always"), "{ids:?}");
    let fd7: Vec<&Value> = r["fds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["fd"] == 7)
        .collect();
    // Every call, the writes before the first fdatasync too: once that fdatasync tells what
    // the file is, the earlier calls of the same fd lifetime are the AOF's (issue 13).
    let aof: u64 = fd7
        .iter()
        .filter(|f| f["class"] == "aof")
        .map(|f| f["calls"].as_u64().unwrap())
        .sum();
    let all: u64 = fd7.iter().map(|f| f["calls"].as_u64().unwrap()).sum();
    assert!(aof > 0 && aof == all, "{fd7:?}");
    // No client socket became the AOF.
    assert!(
        r["fds"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["class"] == "aof")
            .all(|f| f["fd"] == 7),
        "{:?}",
        r["fds"]
    );
}
