//! End-to-end checks of `stallscope analyze` on the real captures in `fixtures/` (whole,
//! gzip-compressed; provenance in fixtures/README.md). Every figure asserted here comes from
//! the captures' ground truth (fixtures/CAPTURES.md), the capture's EXPECTED.md or its client
//! round-trip logs, never from stallscope's own output.

use assert_cmd::Command;
use serde_json::Value;
use std::io::Read;
use std::path::PathBuf;

fn fixture(name: &str, file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
        .join(file)
}

fn trace(name: &str) -> PathBuf {
    fixture(name, &format!("{name}.strace.gz"))
}

/// Runs analyze with JSON output; returns (exit code, report).
fn analyze(args: &[&str]) -> (i32, Value) {
    let out = Command::cargo_bin("stallscope")
        .unwrap()
        .arg("analyze")
        .args(args)
        .args(["--format", "json"])
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    assert!(
        code == 0 || code == 1,
        "exit {code}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        code,
        serde_json::from_slice(&out.stdout).expect("valid JSON report"),
    )
}

fn analyze_capture(name: &str) -> (i32, Value) {
    analyze(&[trace(name).to_str().unwrap()])
}

fn syscall<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in syscalls"))
}

fn finding_ids(r: &Value) -> Vec<String> {
    r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect()
}

fn stalls(r: &Value) -> Vec<&Value> {
    r["stalls"].as_array().unwrap().iter().collect()
}

/// The worst slow-syscall stall on a file.
fn worst_file_stall(r: &Value) -> &Value {
    stalls(r)
        .into_iter()
        .filter(|s| s["kind"] == "slow_syscall" && s["class"].is_string())
        .max_by_key(|s| s["duration_us"].as_i64().unwrap())
        .expect("a file stall")
}

fn within(actual: i64, expected: i64, tolerance: f64) -> bool {
    let d = (actual - expected).abs() as f64;
    d <= expected as f64 * tolerance
}

/// Client-side medians per command from a capture's `*.rtt.csv.gz`.
fn client_p50(name: &str) -> Vec<(String, i64)> {
    let f = std::fs::File::open(fixture(name, &format!("{name}.rtt.csv.gz"))).unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(f)
        .read_to_string(&mut text)
        .unwrap();
    let mut by: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for line in text.lines().skip(1) {
        let cols: Vec<&str> = line.split(',').collect();
        by.entry(cols[1].to_string())
            .or_default()
            .push(cols[2].parse().unwrap());
    }
    by.into_iter()
        .map(|(k, mut v)| {
            v.sort();
            (k, v[v.len() / 2])
        })
        .collect()
}

/// Reconstructed p50 within 25% of the client's own p50 for each command the client sent.
fn assert_command_p50s(name: &str, r: &Value) {
    for (cmd, client) in client_p50(name) {
        let ours = r["commands"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["command"] == cmd.as_str() && c["phase"] == "all")
            .unwrap_or_else(|| panic!("{name}: no {cmd} in commands"));
        let p50 = ours["p50_us"].as_i64().unwrap();
        let tol = 0.25;
        assert!(
            within(p50, client, tol),
            "{name}: {cmd} p50 {p50} µs vs client {client} µs (tolerance {tol})"
        );
    }
}

#[test]
fn aof_always_getsadd_names_the_fsync_without_calling_idle_waits_stalls() {
    let (code, r) = analyze_capture("aof-always-getsadd");
    // README: "none over 10 ms" for non-wait syscalls; epoll_wait and futex are idle.
    assert_eq!(code, 0, "{:?}", r["stalls"]);
    assert_eq!(r["summary"]["stalls"], 0);
    let f = syscall(&r, "fdatasync");
    assert_eq!(f["calls"], 8313);
    assert!(within(f["p50_us"].as_i64().unwrap(), 153, 0.10), "{f}");
    assert!(within(f["max_us"].as_i64().unwrap(), 4200, 0.05), "{f}");
    assert!(finding_ids(&r).contains(&"aof-fsync-always".to_string()));
    let fd7 = r["fds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["fd"] == 7)
        .unwrap();
    assert_eq!(fd7["class"], "aof");
    assert_command_p50s("aof-always-getsadd", &r);
    // Slowest non-wait calls: fdatasync on the AOF and one write.
    let slowest = &r["slowest"][0];
    assert!(
        slowest["syscall"] == "fdatasync" || slowest["syscall"] == "write",
        "{slowest}"
    );
}

#[test]
fn relative_timestamps_trace_reads_the_same_incident() {
    let (code, r) = analyze_capture("aof-always-getsadd-r");
    assert_eq!(code, 0);
    assert_eq!(r["source"]["clock"], "relative");
    assert!(r["source"]["format"].as_str().unwrap().contains("-r"));
    let f = syscall(&r, "fdatasync");
    assert_eq!(f["calls"], 4665);
    assert!(within(f["p50_us"].as_i64().unwrap(), 144, 0.10), "{f}");
    assert!(within(f["max_us"].as_i64().unwrap(), 2600, 0.05), "{f}");
    assert!(finding_ids(&r).contains(&"aof-fsync-always".to_string()));
    assert_command_p50s("aof-always-getsadd-r", &r);
}

#[test]
fn trace_without_durations_is_reconstructed_and_says_so() {
    let (_, r) = analyze_capture("aof-always-getsadd-tt-noT");
    assert_eq!(r["summary"]["durations"], "reconstructed");
    assert!(r["summary"]["skipped_lines"] == 0, "{:?}", r["skipped"]);
    assert!(finding_ids(&r).contains(&"aof-fsync-always".to_string()));
    assert_command_p50s("aof-always-getsadd-tt-noT", &r);
}

#[test]
fn strace_summary_is_refused_with_advice_to_use_dash_t() {
    let out = Command::cargo_bin("stallscope")
        .unwrap()
        .args([
            "analyze",
            fixture("aof-always-summary-c", "aof-always-summary-c.strace-c.txt")
                .to_str()
                .unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("stallscope: error: "), "{err}");
    assert!(err.contains("strace -c") && err.contains("-T"), "{err}");
    assert!(err.contains("aof-always-summary-c.strace-c.txt"), "{err}");
}

#[test]
fn verbose_log_during_bgsave_blames_the_log_file() {
    let (code, r) = analyze_capture("log-verbose-bgsave-dd-y");
    assert_eq!(code, 1);
    assert!(
        finding_ids(&r).contains(&"log-file-blocking".to_string()),
        "{:?}",
        finding_ids(&r)
    );
    let w = worst_file_stall(&r);
    // README: two newfstatat on redis.log of 77.6 ms and 54.0 ms are the slowest log calls.
    assert_eq!(w["class"], "log");
    assert_eq!(w["syscall"], "newfstatat");
    assert!(
        within(w["duration_us"].as_i64().unwrap(), 77_600, 0.01),
        "{w}"
    );
    assert_eq!(w["thread"], "main");
    assert_command_p50s("log-verbose-bgsave-dd-y", &r);
    let phases = r["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 1);
    assert_eq!(phases[0]["kind"], "bgsave");
    assert_eq!(phases[0]["child_pid"], 8335);
    assert!(within(phases[0]["fork_us"].as_i64().unwrap(), 12_726, 0.01));
    // README: the child ran 22:38:13.800 to 22:38:17.051 (3.25 s).
    let span =
        phases[0]["end_at_us"].as_i64().unwrap() - phases[0]["start_at_us"].as_i64().unwrap();
    assert!(within(span, 3_250_000, 0.05), "child lifetime {span} µs");
}

#[test]
fn aof_rewrite_with_always_blames_the_active_child() {
    let (code, r) = analyze_capture("rewrite-always-nofsync-no");
    assert_eq!(code, 1);
    assert!(
        finding_ids(&r).contains(&"aof-write-active-child".to_string()),
        "{:?}",
        finding_ids(&r)
    );
    let w = worst_file_stall(&r);
    assert_eq!(w["class"], "aof");
    assert_eq!(w["syscall"], "fdatasync");
    assert_eq!(w["fd"], 12);
    assert!(
        within(w["duration_us"].as_i64().unwrap(), 446_900, 0.01),
        "{w}"
    );
    assert_eq!(w["finding"], "aof-write-active-child");
    // README: 4 non-wait syscalls over 10 ms, all main-thread fdatasync of the AOF.
    let s = stalls(&r);
    assert_eq!(s.len(), 4, "{s:?}");
    assert!(s
        .iter()
        .all(|s| s["syscall"] == "fdatasync" && s["thread"] == "main" && s["class"] == "aof"));
    let p = &r["phases"][0];
    assert_eq!(p["kind"], "aof_rewrite");
    assert_eq!(p["child_pid"], 9569);
    assert!(within(p["fork_us"].as_i64().unwrap(), 4986, 0.01));
    let span = p["end_at_us"].as_i64().unwrap() - p["start_at_us"].as_i64().unwrap();
    assert!(within(span, 2_280_000, 0.05), "rewrite lifetime {span} µs");
    assert_command_p50s("rewrite-always-nofsync-no", &r);
}

#[test]
fn bgsave_copy_on_write_reports_fork_and_child_phase() {
    let (code, r) = analyze_capture("bgsave-cow-ttt");
    assert_eq!(code, 1);
    assert_eq!(r["source"]["clock"], "absolute");
    let p = &r["phases"][0];
    assert_eq!(p["kind"], "bgsave");
    assert_eq!(p["child_pid"], 13504);
    assert_eq!(p["fork_us"], 17751);
    assert!(finding_ids(&r).contains(&"fork".to_string()));
    // README: 4 non-wait syscalls over 10 ms: the clone and three socket writes.
    let s = stalls(&r);
    assert_eq!(
        s.iter().filter(|s| s["kind"] == "slow_syscall").count(),
        4,
        "{s:?}"
    );
    let clone = s.iter().find(|s| s["syscall"] == "clone").unwrap();
    assert_eq!(clone["finding"], "fork");
    assert_eq!(clone["line"], 18643);
    assert!(r["summary"]["start_iso"]
        .as_str()
        .unwrap()
        .starts_with("2026-11-30T"));
    assert_command_p50s("bgsave-cow-ttt", &r);
}

#[test]
fn everysec_on_this_disk_did_not_block_the_main_thread() {
    let (_, r) = analyze_capture("everysec-dd-yy");
    let ids = finding_ids(&r);
    // README: the main thread's write() to the AOF never blocked.
    assert!(!ids.iter().any(|i| i.starts_with("aof-write")), "{ids:?}");
    assert!(stalls(&r).iter().all(|s| s["thread"] != "main"));
    // The bio thread's slowest fdatasync of the AOF: 28.4 ms.
    let w = worst_file_stall(&r);
    assert_eq!(w["thread"], "bio_aof");
    assert_eq!(w["class"], "aof");
    assert!(
        within(w["duration_us"].as_i64().unwrap(), 28_400, 0.01),
        "{w}"
    );
    assert!(w["path"]
        .as_str()
        .unwrap()
        .ends_with("appendonly.aof.1.incr.aof"));
    assert_command_p50s("everysec-dd-yy", &r);
}

#[test]
fn slow_log_close_matches_expected_md() {
    let (code, r) = analyze_capture("slow-log-close-bgsave-f");
    assert_eq!(code, 1);
    let main: Vec<&Value> = stalls(&r)
        .into_iter()
        .filter(|s| s["thread"] == "main")
        .collect();
    // EXPECTED.md: three main-thread close(13) of the log file: 4.226 s, 4.828 s, 4.767 s.
    let expected = [
        ("22:55:12.655727", 4_225_682),
        ("22:55:16.884579", 4_827_551),
        ("22:55:21.713921", 4_767_423),
    ];
    assert_eq!(main.len(), 3, "{main:?}");
    for (s, (ts, dur)) in main.iter().zip(expected) {
        assert_eq!(s["ts"], ts);
        assert_eq!(s["syscall"], "close");
        assert_eq!(s["fd"], 13);
        assert_eq!(s["class"], "log");
        assert!(s["path"].as_str().unwrap().ends_with("/redis.log"));
        assert_eq!(s["duration_us"], dur);
        assert_eq!(s["finding"], "log-file-blocking");
    }
    // The child's fsync of temp-28169.rdb, 88.8 ms, is a stall of the child, not of main.
    let child: Vec<&Value> = stalls(&r)
        .into_iter()
        .filter(|s| s["thread"] == "child")
        .collect();
    assert_eq!(child.len(), 1);
    assert_eq!(child[0]["syscall"], "fsync");
    assert_eq!(child[0]["class"], "rdb_temp");
    assert_eq!(child[0]["line"], 30221);
    let p = &r["phases"][0];
    assert_eq!(p["kind"], "bgsave");
    assert_eq!(p["child_pid"], 28169);
    assert_eq!(finding_ids(&r)[0], "log-file-blocking");
    assert_command_p50s("slow-log-close-bgsave-f", &r);
}

#[test]
fn slow_log_close_says_who_waited_for_each_stall() {
    // Client logs: SET sent 22:55:12.654804 (4.23 s) and 22:55:16.884790 (9.60 s); health
    // checks sent 22:55:12.654615 (4.23 s) and 22:55:17.033128 (9.45 s). The report claims
    // only what the trace shows (issue 13: a latency never starts before a stall that ended
    // before the wait that found the request). Stall 1 held the SET that the wait before it
    // returned (fd 8); the health check's PING, on a connection accepted just before it, was
    // found only by the wait after it. Stall 2 held the INFO read just before it; the second
    // SET and health check were found only by waits after it (the client logs show them sent
    // during it, which the trace cannot). Stall 3 held that SET, read just before it.
    let (_, r) = analyze_capture("slow-log-close-bgsave-f");
    let main: Vec<&Value> = stalls(&r)
        .into_iter()
        .filter(|s| s["thread"] == "main")
        .collect();
    for (i, cmd) in ["SET", "INFO", "SET"].iter().enumerate() {
        let s = main[i];
        assert_eq!(s["waiting_by_command"][cmd], 1, "stall {i}: {s}");
        assert_eq!(s["waiting_commands"], 1, "stall {i}: {s}");
    }
    let worst = |i: usize| main[i]["worst_wait_us"].as_i64().unwrap();
    assert!(within(worst(0), 4_228_000, 0.02), "{}", worst(0));
    assert!(within(worst(1), 4_829_000, 0.02), "{}", worst(1));
    assert!(within(worst(2), 4_771_000, 0.02), "{}", worst(2));
}

#[test]
fn table_output_leads_with_the_finding_and_fits_80_columns() {
    let out = Command::cargo_bin("stallscope")
        .unwrap()
        .args([
            "analyze",
            trace("slow-log-close-bgsave-f").to_str().unwrap(),
        ])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    let findings_at = text.find("FINDINGS").unwrap();
    assert!(
        text[findings_at..]
            .lines()
            .nth(1)
            .unwrap()
            .contains("log file"),
        "{text}"
    );
    assert!(text.contains("held 1 client (1 command)"), "{text}");
    assert!(!text.contains('\x1b'), "no colour with NO_COLOR");
    for l in text.lines() {
        assert!(l.chars().count() <= 80, "line over 80 columns: {l:?}");
    }
}

#[test]
fn ff_per_process_files_merge_into_one_trace() {
    // Split a real -f capture into strace -ff files (PREFIX.PID, no pid column) and check the
    // merged analysis finds the same stalls.
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(trace("rewrite-always-nofsync-no")).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut files: std::collections::BTreeMap<String, String> = Default::default();
    for line in text.lines() {
        let (pid, rest) = line.split_once(' ').unwrap();
        files
            .entry(pid.to_string())
            .or_default()
            .push_str(&format!("{}\n", rest.trim_start()));
    }
    for (pid, body) in &files {
        std::fs::write(dir.path().join(format!("tr.{pid}")), body).unwrap();
    }
    let prefix = dir.path().join("tr");
    let (_, merged) = analyze(&[prefix.to_str().unwrap()]);
    assert!(merged["source"]["format"].as_str().unwrap().contains("-ff"));
    let (_, whole) = analyze_capture("rewrite-always-nofsync-no");
    let key = |r: &Value| -> Vec<(i64, String)> {
        stalls(r)
            .iter()
            .map(|s| (s["duration_us"].as_i64().unwrap(), s["syscall"].to_string()))
            .collect()
    };
    assert_eq!(key(&merged), key(&whole));
    assert_eq!(
        syscall(&merged, "fdatasync")["calls"],
        syscall(&whole, "fdatasync")["calls"]
    );
    assert_eq!(merged["phases"][0]["kind"], "aof_rewrite");
}

#[test]
fn stdin_and_bad_inputs() {
    let body = std::fs::read(trace("everysec-dd-yy")).unwrap();
    let out = Command::cargo_bin("stallscope")
        .unwrap()
        .args(["analyze", "-", "--format", "json"])
        .write_stdin(body)
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["source"]["files"].as_array().unwrap().len(), 0);
    assert!(r["summary"]["syscalls"].as_u64().unwrap() > 40_000);

    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let notrace = dir.path().join("notes.txt");
    std::fs::write(&notrace, "hello\nthis is not a trace\n").unwrap();
    for (path, needle) in [
        (empty.to_str().unwrap(), "empty"),
        (notrace.to_str().unwrap(), "not a strace"),
        ("/nonexistent/x", "cannot open"),
    ] {
        let out = Command::cargo_bin("stallscope")
            .unwrap()
            .args(["analyze", path])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{path}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("stallscope: error: ") && err.contains(needle) && err.contains(path),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "one-line error: {err}");
    }
}

#[test]
fn strict_mode_fails_on_a_bad_line_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.txt");
    std::fs::write(&p, "1796078610.545264 getpid() = 5 <0.000010>\ngarbage here\n1796078610.645264 getpid() = 5 <0.000010>\n").unwrap();
    let (_, r) = analyze(&[p.to_str().unwrap()]);
    assert_eq!(r["summary"]["skipped_lines"], 1);
    assert_eq!(r["skipped"][0]["line"], 2);
    let out = Command::cargo_bin("stallscope")
        .unwrap()
        .args(["analyze", "--strict", p.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(":2:"));
}

/// The table report of a capture, without colour.
fn table_report(name: &str) -> String {
    let out = Command::cargo_bin("stallscope")
        .unwrap()
        .args(["analyze", trace(name).to_str().unwrap(), "--color", "never"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// The whole table report of two captures, as an on-call engineer reads it: any change to
/// the wording, layout or figures shows up as a reviewed snapshot diff.
#[test]
fn table_report_snapshots() {
    for name in ["slow-log-close-bgsave-f", "rewrite-always-nofsync-no"] {
        insta::assert_snapshot!(name, table_report(name));
    }
}

/// Every capture's table report fits an 80-column terminal: headlines and evidence wrap,
/// long paths break at a `/`, tables wrap their cells.
#[test]
fn table_reports_fit_80_columns() {
    let names = [
        "aof-always-getsadd",
        "aof-always-getsadd-r",
        "aof-always-getsadd-tt-noT",
        "bgsave-cow-ttt",
        "everysec-dd-yy",
        "log-verbose-bgsave-dd-y",
        "rewrite-always-nofsync-no",
        "slow-log-close-bgsave-f",
    ];
    for name in names {
        let text = table_report(name);
        assert!(text.lines().count() > 20, "{name}: {text}");
        for line in text.lines() {
            assert!(
                line.chars().count() <= 80,
                "{name}: {} columns: {line}",
                line.chars().count()
            );
        }
    }
}

/// Roles inferred from behaviour alone (no `--threads`) never contradict the thread names
/// recorded at capture time: a thread is either given its named role or left as `other`.
/// The main thread is always found.
#[test]
fn inferred_roles_agree_with_the_recorded_thread_names() {
    let named_role = |comm: &str| match comm {
        "redis-server" => "main",
        "bio_aof_fsync" => "bio_aof",
        "bio_close_file" => "bio_close_file",
        "bio_lazy_free" => "bio_lazy_free",
        c if c.starts_with("io_thd") => "io_thread",
        _ => "other",
    };
    let names = [
        "aof-always-getsadd",
        "aof-always-getsadd-r",
        "everysec-dd-yy",
        "log-verbose-bgsave-dd-y",
        "rewrite-always-nofsync-no",
        "slow-log-close-bgsave-f",
    ];
    for name in names {
        let text = std::fs::read_to_string(fixture(name, &format!("{name}.threads.txt"))).unwrap();
        let recorded: std::collections::HashMap<u64, &str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (tid, comm) = l.trim().split_once(' ')?;
                Some((tid.parse().ok()?, named_role(comm.trim())))
            })
            .collect();
        let (_, r) = analyze(&[trace(name).to_str().unwrap()]);
        let mut main_found = false;
        for t in r["threads"].as_array().unwrap() {
            let tid = t["tid"].as_u64().unwrap();
            let role = t["role"].as_str().unwrap();
            if tid == 0 {
                // No pid column (strace without -f): the one traced thread.
                main_found |= role == "main";
                continue;
            }
            let Some(want) = recorded.get(&tid) else {
                continue; // started after the names were taken (the save child, ...)
            };
            main_found |= role == "main";
            assert!(
                role == *want || role == "other",
                "{name}: thread {tid} inferred {role}, named {want} ({})",
                t["why"]
            );
        }
        assert!(main_found, "{name}: no main thread");
    }
}
