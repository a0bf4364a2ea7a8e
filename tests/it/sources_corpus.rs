//! Every strace / perf trace text written by others (`fixtures/peer-strace`, sources and
//! licences in its SOURCES.md) and every bundled capture (`fixtures/*/*.strace.gz`) read
//! through `source::Inputs`: no panic, no line lost (used + skipped = lines = the file's line
//! count), and on the real captures no line skipped at all.

use stallscope::source::{InputFormat, Inputs};
use std::io::Read;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// The file's bytes, gunzipped when it is a `.gz`.
fn text_of(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap();
    if path.extension().is_some_and(|e| e == "gz") {
        let mut out = vec![];
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        out
    } else {
        raw
    }
}

/// Physical lines as a line reader sees them (a last line without newline counts).
fn line_count(path: &Path) -> u64 {
    let b = text_of(path);
    let n = b.iter().filter(|c| **c == b'\n').count() as u64;
    n + u64::from(!b.is_empty() && b.last() != Some(&b'\n'))
}

struct Drained {
    events: u64,
    lines: u64,
    used: u64,
    skipped: u64,
}

fn drain(path: &Path) -> anyhow::Result<Drained> {
    let mut inp = Inputs::open(
        &[path.to_string_lossy().into_owned()],
        InputFormat::Auto,
        false,
    )?;
    let mut events = 0;
    while inp.next_event()?.is_some() {
        events += 1;
    }
    let c = inp.counters();
    Ok(Drained {
        events,
        lines: c.lines,
        used: c.used,
        skipped: c.skips.total,
    })
}

#[test]
fn peer_strace_files_lose_no_line() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures().join("peer-strace"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 30,
        "expected the whole peer corpus, found {}",
        files.len()
    );
    let mut read = 0;
    for f in &files {
        let text = std::fs::read(f).unwrap();
        let summary = text.windows(6).any(|w| w == b"% time")
            || text.windows(18).any(|w| w == b"Summary of events:");
        match drain(f) {
            Ok(d) => {
                assert!(
                    !summary,
                    "{}: a summary table was read as a trace",
                    f.display()
                );
                assert_eq!(d.lines, line_count(f), "{}: lines read", f.display());
                assert_eq!(
                    d.used + d.skipped,
                    d.lines,
                    "{}: used + skipped",
                    f.display()
                );
                assert!(d.events > 0, "{}: no events", f.display());
                read += 1;
            }
            Err(e) => {
                // Only summaries are refused, with a message that names the file.
                let msg = format!("{e:#}");
                assert!(summary, "{}: refused: {msg}", f.display());
                assert!(msg.contains(&*f.to_string_lossy()), "{msg}");
            }
        }
    }
    assert!(read >= 30, "only {read} files read");
}

#[test]
fn captures_are_read_without_a_skipped_line() {
    let mut n = 0;
    for cap in std::fs::read_dir(fixtures()).unwrap() {
        let cap = cap.unwrap().path();
        let Ok(rd) = std::fs::read_dir(&cap) else {
            continue;
        };
        for f in rd {
            let f = f.unwrap().path();
            if f.to_string_lossy().ends_with(".strace.gz") {
                let d = drain(&f).unwrap();
                assert_eq!(d.lines, line_count(&f), "{}", f.display());
                assert_eq!((d.used, d.skipped), (d.lines, 0), "{}", f.display());
                assert!(
                    d.events > d.lines / 2,
                    "{}: {} events for {} lines",
                    f.display(),
                    d.events,
                    d.lines
                );
                n += 1;
            }
        }
    }
    assert!(n >= 8, "found {n} captures");
}

/// `strace -f -Y -i -n -tt -T` to stderr (strace 6.1, redis 7.0): every line read, the
/// format named, and the thread roles taken from the names `-Y` prints, without a
/// `--threads` file.
#[test]
fn comm_ip_and_syscall_number_columns_are_read_and_name_the_threads() {
    let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lines/options-Y-i-n.strace");
    let d = drain(&f).unwrap();
    assert_eq!(d.skipped, 0);
    assert_eq!(d.used, line_count(&f));
    let out = assert_cmd::Command::cargo_bin("stallscope")
        .unwrap()
        .args(["analyze", f.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        r["source"]["format"], "strace -f -tt -T -Y",
        "{}",
        r["source"]
    );
    let role = |name: &str| {
        r["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["role"].as_str().unwrap().to_string())
    };
    assert_eq!(role("redis-server").as_deref(), Some("main"));
    assert_eq!(role("bio_aof_fsync").as_deref(), Some("bio_aof"));
    assert_eq!(role("bio_close_file").as_deref(), Some("bio_close_file"));
    assert_eq!(role("bio_lazy_free").as_deref(), Some("bio_lazy_free"));
    let cmds: Vec<&str> = r["commands"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["phase"] == "all")
        .filter_map(|c| c["command"].as_str())
        .collect();
    assert!(cmds.contains(&"SET") && cmds.contains(&"GET"), "{cmds:?}");
}

/// A trace with neither timestamps nor -T (`strace -f` alone) measures no duration: the report
/// lists no "slowest" calls (each would claim an upper bound of 0 µs, which no call meets) and
/// its tables show `-` where a duration would be, not a measured-looking `0 µs`.
#[test]
fn a_trace_without_any_time_claims_no_duration() {
    let f = fixtures().join("peer-strace/pkmoore_CrashSimulator_curl_test.txt");
    let run = |format: &str| {
        assert_cmd::Command::cargo_bin("stallscope")
            .unwrap()
            .args(["analyze", f.to_str().unwrap(), "--format", format])
            .output()
            .unwrap()
    };
    let json = run("json");
    let r: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(r["summary"]["durations"], "none");
    assert!(r["summary"]["syscalls"].as_u64().unwrap() > 600);
    assert_eq!(
        r["slowest"].as_array().map(Vec::len),
        Some(0),
        "{}",
        r["slowest"]
    );
    let table = String::from_utf8(run("table").stdout).unwrap();
    assert!(!table.contains("SLOWEST CALLS"), "{table}");
    assert!(!table.contains("0 µs"), "{table}");
    let close = table
        .lines()
        .find(|l| l.trim_start().starts_with("close "))
        .unwrap_or_else(|| panic!("no close row in {table}"));
    assert!(close.trim_end().ends_with('-'), "{close}");
}
