//! `stallscope attach` against a real redis-server: each test starts its own redis on a free
//! loopback port in a temp dir, attaches, drives a bounded load, and checks the report and
//! that redis is unharmed. Each test runs with both backends (`<test>::ptrace`,
//! `<test>::perf`), one at a time (a static lock and a file lock shared with the other ptrace
//! test binaries). Without redis-server (or, for perf, without tracefs) the tests are skipped,
//! except under CI=true where that is a failure.

use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{ci, json, serial, Attach, Client, Redis, Reply, DEADLINE};

fn have_redis() -> bool {
    let ok = Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && ci() {
        panic!("redis-server is required under CI=true");
    }
    if !ok {
        eprintln!("skipping: redis-server not installed");
    }
    ok
}

fn have_perf() -> bool {
    let ok = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|r| {
            std::path::Path::new(r)
                .join("events/raw_syscalls/sys_enter/id")
                .exists()
        });
    if !ok && ci() {
        panic!("the perf backend needs tracefs (mount -t tracefs nodev /sys/kernel/tracing) under CI=true");
    }
    if !ok {
        eprintln!("skipping: tracefs with raw_syscalls tracepoints is not available");
    }
    ok
}

/// Whether this test can run with `backend`.
fn can_run(backend: &str) -> bool {
    have_redis() && (backend != "perf" || have_perf())
}

/// Runs a test body with the right to trace, if this machine can run it with `backend`.
fn gated(backend: &str, body: fn(&str)) {
    let _g = serial();
    if can_run(backend) {
        body(backend);
    }
}

/// Runs a test body once per backend, as `<name>::ptrace` and `<name>::perf`.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn ptrace() {
                    super::gated("ptrace", super::$name)
                }
                #[test]
                fn perf() {
                    super::gated("perf", super::$name)
                }
            }
        )*
    };
}

both_backends!(
    appendfsync_always_is_found_on_the_aof,
    a_busy_eval_is_a_main_thread_gap,
    bgsave_child_phase_with_fork_time,
    sigint_detaches_and_redis_keeps_serving,
    sigkill_of_stallscope_leaves_redis_serving,
    a_recording_reads_back_to_the_same_findings,
);

/// `Attach::finish`, failing the test on exit status 2 (an error).
fn finish(a: Attach, limit: Duration) -> (Option<i32>, String) {
    let (code, out, stderr) = a.finish(limit);
    assert_ne!(code, Some(2), "stallscope attach failed: {stderr:?}");
    (code, out)
}

fn finding_ids(r: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = r["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["id"].as_str().map(String::from))
        .collect();
    v.sort();
    v
}

/// `n` SETs, one round trip each (every one waits for its fsync under `always`).
fn set_load(port: u16, n: usize) {
    let mut c = Client::connect(port, DEADLINE).expect("connect");
    for i in 0..n {
        c.cmd(&[
            "SET",
            &format!("key:{i}"),
            "some value that is not too short",
        ])
        .expect("SET");
    }
}

fn appendfsync_always_is_found_on_the_aof(backend: &str) {
    let redis = Redis::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let a = Attach::start(
        backend,
        redis.pid(),
        &[
            "--duration",
            "2s",
            "--threshold",
            "100us",
            "--format",
            "json",
        ],
    );
    set_load(redis.port, 300);
    let (code, out) = finish(a, DEADLINE);
    assert_eq!(code, Some(1), "stalls over 100us are expected");
    let r = json(&out);
    assert_eq!(r["source"]["kind"], "live");
    let aof_fsync = r["fds"].as_array().into_iter().flatten().any(|f| {
        f["class"] == "aof" && f["path"].as_str().is_some_and(|p| p.contains("appendonly"))
    });
    assert!(aof_fsync, "no AOF in fds: {}", r["fds"]);
    let fdatasync_on_aof = r["stalls"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["syscall"] == "fdatasync" && s["class"] == "aof")
        || r["slowest"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["syscall"] == "fdatasync" && s["class"] == "aof");
    assert!(
        fdatasync_on_aof,
        "no fdatasync on the AOF among stalls/slowest calls"
    );
    assert!(
        finding_ids(&r).contains(&"aof-fsync-always".to_string()),
        "findings: {:?}",
        finding_ids(&r)
    );
    assert!(r["overhead"]["syscalls_per_s"]
        .as_f64()
        .is_some_and(|v| v > 0.0));
    assert!(r["host"]["samples"]
        .as_array()
        .is_some_and(|s| !s.is_empty()));
    redis.assert_unharmed();
}

fn a_busy_eval_is_a_main_thread_gap(backend: &str) {
    let redis = Redis::start(&[]);
    // No --duration: the trace goes on until the stall line has come, so the line can only
    // have been printed live, while tracing, however slow the machine.
    let mut a = Attach::start(
        backend,
        redis.pid(),
        &["--threshold", "50ms", "--format", "json"],
    );
    assert!(a.attached, "stallscope did not attach: {:?}", a.stderr);
    let script = "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] \
                  while true do local n = redis.call('TIME') if n[1] * 1000000 + n[2] - s > 300000 then break end end return 1";
    let mut c = redis.client();
    let r = c.cmd(&["EVAL", script, "0"]).expect("EVAL");
    assert!(matches!(r, Reply::Int(1)), "{r:?}");
    // The stall line is printed live, once the gap has ended (at redis's next call).
    assert!(
        a.wait_line(|l| l.starts_with("stall:") && l.contains("gap"), DEADLINE),
        "no live stall line; stderr: {:?}",
        a.stderr
    );
    // SAFETY: a signal to the stallscope this test started.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (code, out) = finish(a, DEADLINE);
    assert_eq!(code, Some(1));
    let r = json(&out);
    let gap = r["stalls"].as_array().into_iter().flatten().find(|s| {
        s["kind"] == "gap"
            && s["thread"] == "main"
            && s["duration_us"].as_i64().unwrap_or(0) >= 250_000
    });
    assert!(
        gap.is_some(),
        "no main-thread gap >= 250ms: {}",
        r["stalls"]
    );
}

fn bgsave_child_phase_with_fork_time(backend: &str) {
    let redis = Redis::start(&[]);
    {
        // ~20 MB of data, pipelined in MSET batches.
        let mut c = redis.client();
        let val = "v".repeat(200);
        for b in 0..100 {
            let mut args: Vec<String> = vec!["MSET".into()];
            for i in 0..1000 {
                args.push(format!("k:{b}:{i}"));
                args.push(val.clone());
            }
            let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
            c.cmd(&refs).expect("MSET");
        }
    }
    // Traced until the save is over (no --duration: a slow machine makes the save slower).
    let a = Attach::start(
        backend,
        redis.pid(),
        &["--threshold", "10ms", "--format", "json"],
    );
    assert!(a.attached, "stallscope did not attach: {:?}", a.stderr);
    let mut c = redis.client();
    let r = c.cmd(&["BGSAVE"]).expect("BGSAVE");
    assert!(
        matches!(&r, Reply::Simple(s) if s.contains("Background saving started")),
        "{r:?}"
    );
    // Redis reaps the child (and says the save is over) after the child's exit, which the
    // tracer has seen by then.
    let start = Instant::now();
    while c
        .info_field("persistence", "rdb_bgsave_in_progress")
        .as_deref()
        != Some("0")
    {
        assert!(start.elapsed() < DEADLINE, "the BGSAVE did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: a signal to the stallscope this test started.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (_, out) = finish(a, DEADLINE);
    let r = json(&out);
    let phases = r["phases"].as_array().cloned().unwrap_or_default();
    let bg = phases
        .iter()
        .find(|p| p["kind"] == "bgsave")
        .unwrap_or_else(|| panic!("no bgsave phase: {phases:?}"));
    assert!(
        bg["fork_us"].as_i64().is_some_and(|f| f > 0),
        "fork duration: {bg}"
    );
    assert!(bg["child_pid"].as_i64().is_some_and(|p| p > 0));
    assert!(
        bg["end_at_us"].as_i64().is_some(),
        "the child's end is seen: {bg}"
    );
    redis.assert_unharmed();
}

fn sigint_detaches_and_redis_keeps_serving(backend: &str) {
    let redis = Redis::start(&[]);
    let a = Attach::start(backend, redis.pid(), &["--threshold", "10ms"]);
    if backend == "ptrace" {
        assert_ne!(redis.tracer_pid(), 0, "traced while attached");
    }
    set_load(redis.port, 50);
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (code, out) = finish(a, DEADLINE);
    assert!(matches!(code, Some(0) | Some(1)), "exit code {code:?}");
    assert!(
        out.contains("live") || out.contains("stall"),
        "a report is printed: {out}"
    );
    redis.assert_unharmed();
}

fn sigkill_of_stallscope_leaves_redis_serving(backend: &str) {
    let redis = Redis::start(&[]);
    let mut a = Attach::start(backend, redis.pid(), &["--threshold", "10ms"]);
    assert!(a.attached, "stallscope did not attach: {:?}", a.stderr);
    // Keep redis busy while the tracer dies, so threads are stopped mid-syscall: the kill
    // comes once the load is under way (some SETs answered under tracing).
    let port = redis.port;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let load = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut c = Client::connect(port, DEADLINE).expect("connect");
            for i in 0..2000 {
                if c.cmd(&["SET", &format!("key:{i}"), "v"]).is_err() {
                    break;
                }
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    let start = Instant::now();
    while done.load(std::sync::atomic::Ordering::Relaxed) < 50 {
        assert!(
            start.elapsed() < DEADLINE,
            "no SET was answered under tracing"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    a.child.kill().expect("kill stallscope");
    let _ = a.child.wait();
    // Nothing stops redis any more: it serves, and no thread is left in a stop.
    redis.assert_unharmed();
    let _ = load.join();
    assert_eq!(
        done.load(std::sync::atomic::Ordering::Relaxed),
        2000,
        "the load ran to its end"
    );
    for t in std::fs::read_dir(format!("/proc/{}/task", redis.pid())).expect("tasks") {
        let stat =
            std::fs::read_to_string(t.expect("task").path().join("stat")).unwrap_or_default();
        let state = stat.rsplit(") ").next().and_then(|r| r.chars().next());
        assert!(
            !matches!(state, Some('t') | Some('T')),
            "a redis thread is still stopped: {stat}"
        );
    }
}

fn a_recording_reads_back_to_the_same_findings(backend: &str) {
    let redis = Redis::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let rec = redis.dir().join("rec.strace");
    let rec_s = rec.to_string_lossy().into_owned();
    let a = Attach::start(
        backend,
        redis.pid(),
        &[
            "--duration",
            "2s",
            "--threshold",
            "200us",
            "--format",
            "json",
            "--record",
            &rec_s,
        ],
    );
    set_load(redis.port, 200);
    let (_, out) = finish(a, DEADLINE);
    let live = json(&out);
    let threads = format!("{rec_s}.threads");
    let back = Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args([
            "analyze",
            &rec_s,
            "--threshold",
            "200us",
            "--format",
            "json",
            "--threads",
            &threads,
        ])
        .output()
        .expect("run analyze");
    assert!(
        matches!(back.status.code(), Some(0) | Some(1)),
        "{}",
        String::from_utf8_lossy(&back.stderr)
    );
    let back = json(&String::from_utf8_lossy(&back.stdout));
    // Findings about the live tracer itself (its cost, what the backend cannot see) are not
    // in the recording; every finding about redis must be.
    let about_redis = |r: &serde_json::Value| -> Vec<String> {
        finding_ids(r)
            .into_iter()
            .filter(|f| f != "tracer-overhead" && f != "backend-limits")
            .collect()
    };
    assert_eq!(about_redis(&live), about_redis(&back));
    assert!(finding_ids(&back).contains(&"aof-fsync-always".to_string()));
    for k in [
        "stalls",
        "syscalls",
        "events",
        "threads",
        "span_us",
        "in_flight_at_start",
        "in_flight_at_end",
    ] {
        assert_eq!(live["summary"][k], back["summary"][k], "summary.{k}");
    }
    // The same stalls, to the microsecond, in the same order.
    let stalls = |r: &serde_json::Value| -> Vec<String> {
        ["stalls", "in_flight"]
            .iter()
            .flat_map(|k| r[*k].as_array().cloned().unwrap_or_default())
            .map(|s| {
                format!(
                    "{} {} {} {} at {} for {} {} {}",
                    s["tid"],
                    s["thread"],
                    s["kind"],
                    s["syscall"],
                    s["at_us"],
                    s["duration_us"],
                    s["bound"],
                    s["in_flight"]
                )
            })
            .collect()
    };
    assert_eq!(stalls(&live), stalls(&back));
    // Files named and classed alike (the config the live side read is beside the recording).
    let fds = |r: &serde_json::Value| -> Vec<String> {
        let mut v: Vec<String> = r["fds"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| format!("{} {} {} {}", f["pid"], f["fd"], f["path"], f["class"]))
            .collect();
        v.sort();
        v
    };
    assert_eq!(fds(&live), fds(&back));
}

#[test]
fn attach_errors_exit_2_with_a_clear_message() {
    let _g = serial();
    let out = Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args(["attach", "--pid", "4000000"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stallscope: error:") && err.contains("no such process"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args(["attach", "--name", "no-such-program-anywhere"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no running process"));
    // Already traced: a second attach is refused while the first holds the process.
    if !have_redis() {
        return;
    }
    let redis = Redis::start(&[]);
    let a = Attach::start("ptrace", redis.pid(), &["--threshold", "10ms"]);
    let out = Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args([
            "attach",
            "--backend",
            "ptrace",
            "--pid",
            &redis.pid().to_string(),
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already traced"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    unsafe { libc::kill(a.child.id() as i32, libc::SIGTERM) };
    let _ = finish(a, DEADLINE);
    assert_eq!(redis.tracer_pid(), 0);
}

#[test]
fn perf_backend_errors_and_the_auto_choice() {
    let _g = serial();
    if !can_run("perf") {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args(["attach", "--backend", "perf", "--pid", "4000000"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stallscope: error:") && err.contains("no such process"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args(["attach", "--perf-pages", "3", "--pid", "1"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "3 pages is not a power of two");
    // auto picks perf here (tracefs, root) and says so.
    let redis = Redis::start(&[]);
    let out = Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args([
            "attach",
            "--pid",
            &redis.pid().to_string(),
            "--duration",
            "300ms",
            "--format",
            "json",
        ])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("backend perf (auto)"), "{err}");
    let r = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(r["source"]["backend"], "perf");
    redis.assert_unharmed();
}

/// Every request of a synchronous client shows up as one read and one write of the main
/// thread: nothing is lost at a modest load with the default ring buffers.
#[test]
fn perf_backend_sees_every_call_of_the_main_thread() {
    let _g = serial();
    if !can_run("perf") {
        return;
    }
    let redis = Redis::start(&[]);
    let mut c = redis.client();
    // Traced until every request was answered (no --duration), however slow the machine.
    let a = Attach::start(
        "perf",
        redis.pid(),
        &["--threshold", "1s", "--format", "json"],
    );
    assert!(a.attached, "stallscope did not attach: {:?}", a.stderr);
    let n = 2000;
    for i in 0..n {
        c.cmd(&["SET", &format!("k{i}"), "v"]).expect("SET");
    }
    // SAFETY: a signal to the stallscope this test started.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (_, out) = finish(a, DEADLINE);
    let r = json(&out);
    assert_eq!(r["summary"]["lost_events"], 0);
    let calls = |name: &str| {
        r["syscalls"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == name)
            .and_then(|s| s["calls"].as_u64())
            .unwrap_or(0)
    };
    assert!(
        calls("read") >= n,
        "reads: {} for {n} requests",
        calls("read")
    );
    assert!(
        calls("write") >= n,
        "writes: {} for {n} requests",
        calls("write")
    );
}

/// A one-page ring buffer under load overflows: the loss is counted, in the summary, on the
/// stalls found after it, and said in the table.
#[test]
fn perf_backend_reports_lost_events_with_a_tiny_ring() {
    let _g = serial();
    if !can_run("perf") {
        return;
    }
    let redis = Redis::start(&[]);
    let run = |format: &str| -> String {
        let a = Attach::start(
            "perf",
            redis.pid(),
            &[
                "--duration",
                "2s",
                "--threshold",
                "1us",
                "--perf-pages",
                "1",
                "--format",
                format,
                "--color",
                "never",
            ],
        );
        // Enough load to overflow a one-page ring for sure, even when the machine is slow.
        let loads: Vec<_> = (0..8)
            .map(|_| {
                let port = redis.port;
                std::thread::spawn(move || set_load(port, 4000))
            })
            .collect();
        for l in loads {
            let _ = l.join();
        }
        let (_, out) = finish(a, DEADLINE);
        out
    };
    let out = run("json");
    let r = json(&out);
    let lost = r["summary"]["lost_events"].as_u64().unwrap_or(0);
    assert!(
        lost > 0,
        "no lost events with a one-page ring: {}",
        r["summary"]
    );
    assert!(
        r["stalls"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["events_lost"] == true),
        "no stall says events were lost"
    );
    assert!(r["overhead"]["warning"]
        .as_str()
        .is_some_and(|w| w.contains("dropped")));
    let table = run("table");
    assert!(
        table.contains("events were lost"),
        "the table does not say so: {table}"
    );
    redis.assert_unharmed();
}
