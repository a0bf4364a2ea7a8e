//! What a report may claim from a trace (issue 13), checked over every trace in fixtures/
//! (our captures, our perf captures, the peer traces written by others) and on traces made
//! from them: no critical finding rests only on upper bounds, no reconstructed duration or
//! gap spans a line that could not be read, a trace with no timestamps has no stall, and
//! nothing panics. Plus the perf trace shape with no fd paths.

use assert_cmd::Command;
use serde_json::Value;
use std::io::Read;
use std::path::Path;

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
    // All but the first write, made before the first fdatasync told what the file is.
    let aof: u64 = fd7
        .iter()
        .filter(|f| f["class"] == "aof")
        .map(|f| f["calls"].as_u64().unwrap())
        .sum();
    let all: u64 = fd7.iter().map(|f| f["calls"].as_u64().unwrap()).sum();
    assert!(aof > 0 && aof + 1 >= all, "{fd7:?}");
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
