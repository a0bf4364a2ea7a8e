//! strace variants made on this machine (fixtures/variants/README.md says how): every line
//! read, the injected DEBUG SLEEP found with its length and thread, and a trace whose gaps
//! cannot be trusted said so instead of reported as stalls.

use assert_cmd::Command;

fn report(name: &str) -> serde_json::Value {
    report_as(name, &[], 1)
}

/// The JSON report of a variant analyzed with `args` added, which must exit with `code`.
fn report_as(name: &str, args: &[&str], code: i32) -> serde_json::Value {
    let path = format!("{}/fixtures/variants/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::cargo_bin("stallscope")
        .unwrap()
        .args(["analyze", &path, "--format", "json"])
        .args(args)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The report's `filtered-trace` finding.
fn filtered_finding(r: &serde_json::Value) -> &serde_json::Value {
    r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "filtered-trace")
        .expect("the filtered-trace finding")
}

/// The report's gap stalls (a thread that made no syscall), in the report's order.
fn gap_stalls(r: &serde_json::Value) -> Vec<&serde_json::Value> {
    r["stalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "gap")
        .collect()
}

/// The stall of the DEBUG SLEEP 0.3: a 300 ms clock_nanosleep of the main thread.
fn sleep_stall(r: &serde_json::Value) -> &serde_json::Value {
    r["stalls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["syscall"] == "clock_nanosleep")
        .expect("the DEBUG SLEEP's stall")
}

/// `-i`: strace printed "Process N attached" (the BGSAVE child) into the main thread's open
/// epoll_wait line, whose rest starts with the ready-events array; the child's exit line has
/// `[????????????????]` for its instruction pointer. Both lines are read.
#[test]
fn splice_inside_an_argument_and_unknown_instruction_pointer() {
    let r = report("splice-epoll-i.strace");
    assert_eq!(r["summary"]["skipped_lines"], 0, "{}", r["skipped"]);
    let s = sleep_stall(&r);
    assert_eq!(
        (s["tid"].as_u64(), s["thread"].as_str(), s["line"].as_u64()),
        (Some(30873), Some("main"), Some(249))
    );
    assert_eq!(s["duration_us"], 300_088);
    // The epoll_wait that the message split is finished by the next line, not a call
    // parked until the end of the trace.
    let parked = r["parked_at_end"].as_array().unwrap();
    assert!(!parked.iter().any(|p| p["line"] == 282), "{parked:?}");
    assert_eq!(parked.len(), 5, "{parked:?}");
    // The save child's exit is seen, not only the parent's SIGCHLD.
    let child = &r["phases"][0];
    assert_eq!(child["child_pid"], 30890, "{child}");
    assert_eq!(child["ended_by"], "exit", "{child}");
}

/// `strace -Z` prints only failed calls: the time between them is not time without a
/// syscall, so no gap is a stall, and the report says why.
#[test]
fn failed_only_trace_reports_no_gaps() {
    let r = report_as("failed-only-Z.strace", &[], 0);
    assert_eq!(r["summary"]["skipped_lines"], 0);
    assert_eq!(r["stalls"].as_array().unwrap().len(), 0, "{}", r["stalls"]);
    let f = filtered_finding(&r);
    assert!(f["evidence"].as_str().unwrap().contains("-Z"), "{f}");
}

/// `strace -e trace=%file,%desc` has no accept and no clock_nanosleep: client fds appear
/// after their number's close with no call creating them, which marks the trace as missing
/// calls. Its gaps then are no longer "no syscall", but the event loop's waits are traced, so
/// the DEBUG SLEEP's gap, which DEBUG waited through, is still a stall (said to be a gap in
/// traced calls only), and a gap no command waited through is not.
#[test]
fn trace_without_fd_creating_calls_keeps_only_gaps_commands_waited_through() {
    let r = report_as("desc-file-e.strace", &["--threshold", "2ms"], 1);
    assert_eq!(r["summary"]["skipped_lines"], 0, "{}", r["skipped"]);
    let f = filtered_finding(&r);
    let evidence = f["evidence"].as_str().unwrap();
    assert!(
        evidence.starts_with("9 times a thread read or wrote an fd it had closed itself"),
        "{f}"
    );
    let gaps = gap_stalls(&r);
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    let g = gaps[0];
    assert_eq!(
        (
            g["line"].as_u64(),
            g["thread"].as_str(),
            g["duration_us"].as_u64()
        ),
        (Some(230), Some("main"), Some(300_519))
    );
    assert_eq!(g["waiting_by_command"]["DEBUG"], 1, "{g}");
    assert_eq!(g["finding"], "command", "{g}");
    let cause = g["cause"].as_str().unwrap();
    assert!(
        cause.contains("no traced syscall") && cause.contains("while DEBUG ran"),
        "{cause}"
    );
}

/// `strace -f -e trace=%network,%desc` follows the BGSAVE child but leaves out the clone
/// that made it (and the fork's own time): the child's calls look like a thread of redis's
/// until the parent's SIGCHLD names it. The trace is then one missing calls (only the gaps
/// commands waited through are stalls, said to be gaps in traced calls only), the child is
/// a child process in the report (its slow fsync of the RDB is the save child's, not a
/// background thread's), and the traced process has two processes.
#[test]
fn trace_without_process_calls_finds_the_child_by_its_sigchld() {
    let r = report_as("network-desc-bgsave-e.strace", &["--threshold", "2ms"], 1);
    assert_eq!(r["summary"]["skipped_lines"], 0, "{}", r["skipped"]);
    let f = filtered_finding(&r);
    let evidence = f["evidence"].as_str().unwrap();
    assert!(
        evidence.starts_with("1 child process of redis ran in the trace (a SIGCHLD named it)"),
        "{f}"
    );
    assert_eq!(r["summary"]["processes"], 2, "{}", r["summary"]);
    let child = r["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == 20415)
        .expect("the child's thread");
    assert_eq!(
        (child["pid"].as_u64(), child["role"].as_str()),
        (Some(20415), Some("child"))
    );
    let stalls = r["stalls"].as_array().unwrap();
    let fsync = stalls
        .iter()
        .find(|s| s["syscall"] == "fsync")
        .expect("the child's fsync");
    assert_eq!(
        (
            fsync["pid"].as_u64(),
            fsync["tid"].as_u64(),
            fsync["thread"].as_str(),
            fsync["line"].as_u64(),
            fsync["class"].as_str()
        ),
        (
            Some(20415),
            Some(20415),
            Some("child"),
            Some(2193),
            Some("rdb_temp")
        )
    );
    assert!(
        fsync["cause"]
            .as_str()
            .unwrap()
            .starts_with("background child 20415 blocked"),
        "{fsync}"
    );
    let gaps = gap_stalls(&r);
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    let g = gaps[0];
    assert_eq!(
        (g["line"].as_u64(), g["thread"].as_str()),
        (Some(223), Some("main"))
    );
    assert_eq!(g["waiting_by_command"]["DEBUG"], 1, "{g}");
    let cause = g["cause"].as_str().unwrap();
    assert!(
        cause.contains("no traced syscall") && cause.contains("while DEBUG ran"),
        "{cause}"
    );
}

/// `strace -e trace=epoll_wait,read,write` has no open or close: /proc/self/stat's start
/// read again and again through one fd shows the untraced reopens, and only the gaps that
/// commands waited through (the DEBUG SLEEP's, a GET's) are stalls.
#[test]
fn trace_without_opens_keeps_only_gaps_commands_waited_through() {
    let r = report_as("read-write-epoll-e.strace", &["--threshold", "2ms"], 1);
    let f = filtered_finding(&r);
    assert!(
        f["evidence"]
            .as_str()
            .unwrap()
            .starts_with("14 reads returned the start of /proc/PID/stat again"),
        "{f}"
    );
    let gaps: Vec<(u64, u64)> = r["stalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "gap")
        .map(|s| {
            (
                s["line"].as_u64().unwrap(),
                s["waiting_commands"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(gaps, vec![(131, 1), (139, 1)]);
}

/// A trace pasted through something that wraps at 80 columns (`fold -w 80`): the pieces are
/// glued back, so the DEBUG SLEEP is found as in the unwrapped trace, and nearly every line
/// is read (a piece cut inside a `-T` duration, `<0` then `.000036>`, is still skipped).
#[test]
fn lines_wrapped_at_80_columns_are_glued_back() {
    let whole = report("wrapped-80.unwrapped.strace");
    let wrapped = report("wrapped-80.strace");
    let (a, b) = (sleep_stall(&whole), sleep_stall(&wrapped));
    assert_eq!(a["duration_us"], 300_111);
    assert_eq!(
        (&a["duration_us"], &a["tid"], &a["duration_known"]),
        (&b["duration_us"], &b["tid"], &b["duration_known"])
    );
    assert_eq!(whole["summary"]["syscalls"], wrapped["summary"]["syscalls"]);
    let skipped = wrapped["summary"]["skipped_lines"].as_u64().unwrap();
    let lines = wrapped["summary"]["lines"].as_u64().unwrap();
    assert!(skipped * 5 < lines, "{skipped} of {lines} lines skipped");
}

/// `perf trace -S` prints its summary table after the calls: the trace's own, read as noise
/// (not 25 unreadable lines), and the DEBUG SLEEP as perf timed it.
#[test]
fn perf_summary_after_the_calls_is_not_skipped() {
    let r = report("perf-summary-S.perf.txt");
    // Only the blank line perf prints before the table (a blank line is counted as such).
    assert_eq!(r["summary"]["skipped_lines"], 1, "{}", r["skipped"]);
    assert_eq!(r["skipped"][0]["reason"], "empty line", "{}", r["skipped"]);
    let s = sleep_stall(&r);
    assert_eq!(
        (s["tid"].as_u64(), s["line"].as_u64()),
        (Some(13459), Some(714))
    );
    assert_eq!(s["duration_us"], 303_692);
}

/// `perf trace -m 1` under a pipelined load: perf's ring overflowed 11 times (`LOST N
/// events!`, 814 events). perf pairs each thread's next exit with the last entry it saw,
/// so the first line after a loss is the time of an older call (`1335.264 (10.107 ms):
/// ... [continued]: fdatasync()` starts at the previous read's entry) or another call's
/// continuation. Before, those lines made "blocked at least 10 ms in fdatasync() (already
/// running when tracing began)" and "made no syscall for 10 ms" stalls, three of each, and
/// the report did not say events were lost.
#[test]
fn perf_lost_events_make_no_stall_and_are_counted() {
    let path = format!(
        "{}/fixtures/variants/perf-lost-m1.perf.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let out = Command::cargo_bin("stallscope")
        .unwrap()
        .args(["analyze", &path, "--format", "json"])
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["summary"]["lost_events"], 814);
    let stalls = r["stalls"].as_array().unwrap();
    for s in stalls {
        assert_ne!(s["kind"], "gap", "a gap measured across lost events: {s}");
        assert_ne!(s["in_flight"], "at_start", "mid-trace: {s}");
    }
    assert_eq!(out.status.code(), Some(0), "{stalls:?}");
    // Each LOST line, and each thread's line after it that perf paired across it.
    assert_eq!(r["summary"]["skipped_lines"], 22, "{}", r["skipped"]);
    let first = &r["skipped"][0];
    assert_eq!(first["text"], "LOST 95 events!", "{first}");
    assert!(
        first["reason"]
            .as_str()
            .unwrap()
            .starts_with("perf lost events here"),
        "{first}"
    );
    let table = Command::cargo_bin("stallscope")
        .unwrap()
        .args(["analyze", &path, "--color", "never"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("814 events were lost"), "{text}");
}

/// `strace -t`: whole-second timestamps. The DEBUG SLEEP is still found (its -T), but a
/// command's read and reply carry only their seconds: no command time and no client wait is
/// given (the capture's SETs around the BGSAVE read as 1.02 s, answered in microseconds),
/// nor which commands a stall held, nor which stalls overlapped.
#[test]
fn whole_second_timestamps_measure_calls_only() {
    let r = report("whole-seconds-t.strace");
    assert_eq!(r["summary"]["skipped_lines"], 0, "{}", r["skipped"]);
    let s = sleep_stall(&r);
    assert_eq!(
        (s["tid"].as_u64(), s["thread"].as_str(), s["line"].as_u64()),
        (Some(2014), Some("main"), Some(242))
    );
    assert_eq!(s["duration_us"], 311_768);
    assert!(s["worst_wait_us"].is_null(), "{s}");
    assert_eq!(r["commands"].as_array().map(Vec::len), Some(0));
    assert!(r["incidents"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["worst_wait_us"].is_null()));
    // Which commands a stall held, and which stalls overlap, span two calls too: the
    // stalls of one second would all overlap and hold every command of that second.
    let stalls = r["stalls"].as_array().unwrap();
    assert!(
        stalls
            .iter()
            .all(|s| s["waiting_commands"] == 0 && s["waiting_clients"] == 0),
        "{stalls:?}"
    );
    let incidents = r["incidents"].as_array().unwrap();
    assert_eq!(incidents.len(), stalls.len());
    assert!(incidents
        .iter()
        .all(|i| i["stalls"].as_array().map(Vec::len) == Some(1) && i["waiting_commands"] == 0));
    let ids: Vec<&str> = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["id"].as_str())
        .collect();
    assert!(ids.contains(&"gaps-unmeasurable"), "{ids:?}");
    assert!(!r["stalls"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["kind"] == "gap"));
}

/// `perf trace -F all --syscalls`: the page-fault lines among the calls are perf's own
/// events, read as such (not 101 lines that "could not be read"), and the calls around them
/// are timed as usual.
#[test]
fn perf_page_fault_lines_are_not_skipped() {
    let r = report("perf-faults-F.perf.txt");
    assert_eq!(r["summary"]["skipped_lines"], 0, "{}", r["skipped"]);
    let s = sleep_stall(&r);
    assert_eq!(
        (s["tid"].as_u64(), s["thread"].as_str(), s["line"].as_u64()),
        (Some(2014), Some("main"), Some(284))
    );
    assert_eq!(s["duration_us"], 303_601);
}
