//! The command line on inputs the parsers cannot fully read: a forced format that reads no
//! event is an error (exit 2), never an empty report; a truncated gzip is reported as far
//! as it goes, with a warning; a file cut while it is read is an error.

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

fn report(path: &str) -> serde_json::Value {
    let out = stallscope()
        .args(["analyze", path, "--format", "json"])
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Our own `perf trace` captures of a redis with appendfsync always under redis-benchmark
/// (fixtures/README.md has their ground truth): read whole, the AOF named, the fsyncs found.
#[test]
fn own_perf_captures() {
    let dir = "fixtures/perf-captures";
    for (file, calls, durations) in [
        ("redis-always-p-dur0.perf.txt.gz", 1013, "mixed"),
        ("redis-always-p-T.perf.txt.gz", 1272, "measured"),
        ("redis-always-p-dur5.perf.txt.gz", 89, "measured"),
        ("redis-always-a-dur5.perf.txt.gz", 230, "mixed"),
    ] {
        let r = report(&format!("{dir}/{file}"));
        let s = &r["summary"];
        assert_eq!(s["skipped_lines"], 0, "{file}");
        assert_eq!(s["syscalls"], calls, "{file}");
        assert_eq!(s["durations"], durations, "{file}");
        // Calls printed `...` and never continued ended before their thread's next event:
        // none of this redis's calls was still running when perf stopped.
        assert_eq!(s["in_flight_at_end"], 0, "{file}");
        let ids: Vec<&str> = r["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["id"].as_str())
            .collect();
        assert!(ids.contains(&"aof-fsync-always"), "{file}: {ids:?}");
    }
}

/// An `strace -ff` set of more files than the soft limit on open files (a redis watched for
/// days leaves one per save child): every file is read, none refused for want of fds.
#[test]
fn ff_set_larger_than_the_open_files_soft_limit() {
    let files = 300u64;
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    assert!(
        hard >= files + 64,
        "hard limit on open files {hard} is below the test's set"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut calls = 0u64;
    for f in 0..files {
        let mut text = String::new();
        for i in 0..20u64 {
            let ts = 1_700_000_000_000_000u64 + (i * files + f) * 1000;
            text.push_str(&format!(
                "{}.{:06} epoll_wait(5, [], 128, 100) = 0 <0.000010>\n",
                ts / 1_000_000,
                ts % 1_000_000
            ));
            calls += 1;
        }
        std::fs::write(dir.path().join(format!("t.{}", 1000 + f)), text).unwrap();
    }
    let prefix = dir.path().join("t");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn 128 && exec \"$0\" analyze {} --format json",
            prefix.display()
        ))
        .arg(assert_cmd::cargo::cargo_bin("stallscope"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["summary"]["syscalls"].as_u64(), Some(calls), "{err}");
    assert_eq!(v["summary"]["threads"].as_u64(), Some(files), "{err}");
}

/// A big trace file truncated while it is read (a log rotated with `copytruncate`): an
/// error naming the file and the cause, exit 2, never a report that passes for the whole
/// trace nor the shell's bare "Bus error" of a mapped page that is gone.
#[test]
fn file_truncated_while_it_is_read_is_an_error() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use std::io::BufWriter;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.strace");
    let name = path.to_str().unwrap().to_owned();
    // Enough lines (about 100 MB) that the run is far from its end when it is stopped.
    let write = || {
        let mut w = BufWriter::new(std::fs::File::create(&path).unwrap());
        for i in 0..1_500_000u64 {
            let us = 1_700_000_000_000_000u64 + i * 50;
            writeln!(
                w,
                "{}.{:06} read(8, \"*1\\r\\n$4\\r\\nPING\\r\\n\", 16384) = 14 <0.000011>",
                us / 1_000_000,
                us % 1_000_000
            )
            .unwrap();
        }
        w.flush().unwrap();
    };
    // A run that got to its end before it could be stopped (a machine that descheduled this
    // test for the whole run) is tried again.
    for attempt in 0..3 {
        write();
        let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("stallscope"))
            .args(["analyze", &name, "--format", "json"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        let maps = format!("/proc/{}/maps", child.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        // Stopped as soon as the file is mapped, truncated, then let go on.
        let stopped = loop {
            if std::fs::read_to_string(&maps).is_ok_and(|m| m.contains(&name)) {
                break kill(pid, Signal::SIGSTOP).is_ok();
            }
            if child.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        if stopped {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(0)
                .unwrap();
            kill(pid, Signal::SIGCONT).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if !stopped || matches!(out.status.code(), Some(0 | 1)) && attempt < 2 {
            eprintln!("attempt {attempt}: the run ended before the file was cut ({err})");
            continue;
        }
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.starts_with(&format!("stallscope: error: cannot read {name}: ")),
            "{err}"
        );
        assert!(err.contains("shrank"), "{err}");
        assert!(err.ends_with('\n'), "{err:?}");
        return;
    }
    panic!("every run ended before the file could be cut");
}

/// `analyze - < trace`: stdin that is a regular file is read as that file (and a big one
/// is mapped, window by window), from the offset the redirect is at: the report is the one
/// of the same lines given by name. A trace of more than 4 MiB, so that it is mapped.
#[test]
fn stdin_redirected_from_a_file_reads_it_from_its_offset() {
    use std::io::{Seek, SeekFrom};
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::new();
    let mut half_at = 0;
    let mut t = 1_796_078_610_000_000u64;
    for i in 0..120_000u64 {
        if i == 60_000 {
            half_at = text.len() as u64;
        }
        // Every thousandth write waits 30 ms: stalls in both halves.
        let dur = if i % 1000 == 999 { 30_000 } else { 40 };
        text.push_str(&format!(
            "{}.{:06} write(7, \"*3\\r\\n$3\\r\\nSET\\r\\n\"..., 40) = 40 <0.{:06}>\n",
            t / 1_000_000,
            t % 1_000_000,
            dur
        ));
        t += dur + 10;
    }
    assert!(
        text.len() > 4 << 20,
        "{} bytes: under the mapping bound",
        text.len()
    );
    let whole = dir.path().join("whole.strace");
    let second = dir.path().join("second.strace");
    std::fs::write(&whole, &text).unwrap();
    std::fs::write(&second, &text[half_at as usize..]).unwrap();
    // The report without its `source` block, which names the input.
    let report = |out: &std::process::Output| -> serde_json::Value {
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_object_mut().unwrap().remove("source");
        v
    };
    let by_name = |p: &std::path::Path| {
        report(
            &stallscope()
                .args(["analyze", p.to_str().unwrap(), "--format", "json"])
                .output()
                .unwrap(),
        )
    };
    let by_stdin = |offset: u64| {
        let mut f = std::fs::File::open(&whole).unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("stallscope"))
            .args(["analyze", "-", "--format", "json"])
            .stdin(f)
            .output()
            .unwrap();
        report(&out)
    };
    let all = by_stdin(0);
    assert_eq!(all["summary"]["lines"], 120_000);
    assert_eq!(all, by_name(&whole));
    let rest = by_stdin(half_at);
    assert_eq!(rest["summary"]["lines"], 60_000);
    assert_eq!(rest, by_name(&second));
}

/// Module commands are command names like any other (one decoder for the report, the
/// metrics and recordings): a trace of `FT.SEARCH`, `JSON.SET` and `GET` requests counts all
/// three in the command table, and a name that only looks like one (`1X`) is not counted.
#[test]
fn module_commands_are_in_the_command_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("modules.strace");
    let mut text = String::new();
    let fd = "8<TCP:[127.0.0.1:6379->127.0.0.1:50000]>";
    let mut us = 1_700_000_000_000_000u64;
    for _ in 0..5 {
        for name in ["FT.SEARCH", "json.set", "GET", "1X"] {
            let req = format!("*2\\r\\n${}\\r\\n{name}\\r\\n$3\\r\\nidx\\r\\n", name.len());
            let len = 4 + 1 + name.len().to_string().len() + 2 + name.len() + 2 + 9;
            let t = |us: u64| format!("{}.{:06}", us / 1_000_000, us % 1_000_000);
            us += 1000;
            text += &format!(
                "{} epoll_wait(5<anon_inode:[eventpoll]>, [{{events=EPOLLIN, data={{u32=8, u64=8}}}}], 10128, 100) = 1 <0.000010>\n",
                t(us)
            );
            us += 100;
            text += &format!(
                "{} read({fd}, \"{req}\", 16384) = {len} <0.000005>\n",
                t(us)
            );
            us += 200;
            text += &format!("{} write({fd}, \"+OK\\r\\n\", 5) = 5 <0.000005>\n", t(us));
        }
    }
    std::fs::write(&path, text).unwrap();
    let r = report(path.to_str().unwrap());
    let names: Vec<(&str, u64)> = r["commands"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["phase"] == "all")
        .map(|c| (c["command"].as_str().unwrap(), c["calls"].as_u64().unwrap()))
        .collect();
    assert_eq!(names, [("FT.SEARCH", 5), ("GET", 5), ("JSON.SET", 5)]);
}
