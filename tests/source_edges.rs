//! The command line on inputs the parsers cannot fully read: a forced format that reads no
//! event is an error (exit 2), never an empty report; a truncated gzip is reported as far
//! as it goes, with a warning.

use assert_cmd::Command;
use std::io::Write;

fn stallscope() -> Command {
    Command::cargo_bin("stallscope").unwrap()
}

#[test]
fn forced_format_reading_no_event_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.strace");
    // Every line is a syscall line for strace; read as perf, the second is "used" (it looks
    // like a callchain frame) and none is an event.
    std::fs::write(
        &path,
        "1796078610.545264 fdatasync(7) = 0 <0.000311>\n 1796078610.6 ( x\n",
    )
    .unwrap();
    for strict in [false, true] {
        let mut cmd = stallscope();
        cmd.args(["analyze", path.to_str().unwrap(), "--input-format", "perf"]);
        if strict {
            cmd.arg("--strict");
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "strict {strict}: {err}");
        assert!(err.starts_with("stallscope: error: "), "{err}");
        assert!(err.ends_with('\n'), "{err:?}");
    }
}

#[test]
fn truncated_gzip_reports_what_was_read() {
    let mut text = Vec::new();
    for i in 0..20_000u64 {
        writeln!(
            text,
            "1796078610.{:06} epoll_wait(5, [], 128, 100) = 0 <0.000002>",
            i * 10
        )
        .unwrap();
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&text).unwrap();
    let gz = gz.finish().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.strace.gz");
    std::fs::write(&path, &gz[..gz.len() / 2]).unwrap();
    let out = stallscope()
        .args(["analyze", path.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{err}");
    assert!(
        err.contains("stallscope: warning: ") && err.contains("cut.strace.gz"),
        "{err}"
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["summary"]["syscalls"].as_u64().unwrap() > 1000);
}
