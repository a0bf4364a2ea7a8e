//! `stallscope attach` against a real redis-server: each test starts its own redis on a free
//! loopback port in a temp dir, attaches, drives a bounded load, and checks the report and
//! that redis is unharmed. Each test runs with every backend (`<test>::ptrace`,
//! `<test>::perf`, `<test>::bpf`; tests of what only buffers show run with ptrace and bpf),
//! one at a time (a static lock and a file lock shared with the other ptrace test binaries).
//! Without redis-server (or, for perf and bpf, without tracefs; for bpf, without root) the
//! tests are skipped, except under CI=true where that is a failure.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{ci, json, serial, Attach, Client, Redis, Reply, DEADLINE};

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

/// The bpf backend loads kernel programs: root (or CAP_BPF and CAP_PERFMON) and tracefs.
fn have_bpf() -> bool {
    if !have_perf() {
        return false;
    }
    let ok = unsafe { libc::geteuid() } == 0;
    if !ok && ci() {
        panic!("the bpf backend's tests need root under CI=true");
    }
    if !ok {
        eprintln!("skipping: the bpf backend needs root");
    }
    ok
}

/// Whether this test can run with `backend`.
fn can_run(backend: &str) -> bool {
    have_redis()
        && match backend {
            "perf" => have_perf(),
            "bpf" => have_bpf(),
            _ => true,
        }
}

/// Runs a test body with the right to trace, if this machine can run it with `backend`.
fn gated(backend: &str, body: fn(&str)) {
    let _g = serial();
    if can_run(backend) {
        body(backend);
    }
}

/// Runs each test body once per backend listed, as `<name>::<backend>`
/// (`<name>::ptrace`, `<name>::perf`, `<name>::bpf`).
macro_rules! with_backends {
    ([$($backend:ident),*] $(,)?) => {};
    ([$($backend:ident),*] $name:ident $(, $rest:ident)* $(,)?) => {
        mod $name {
            $(
                #[test]
                fn $backend() {
                    super::gated(stringify!($backend), super::$name)
                }
            )*
        }
        with_backends!([$($backend),*] $($rest),*);
    };
}

// The backends that read request buffers (command names).
with_backends!(
    [ptrace, bpf]
    a_busy_eval_holds_up_the_commands_behind_it,
    every_command_is_counted,
);

with_backends!(
    [ptrace, perf, bpf]
    appendfsync_always_is_found_on_the_aof,
    a_busy_eval_is_a_main_thread_gap,
    bgsave_child_phase_with_fork_time,
    sigint_detaches_and_redis_keeps_serving,
    sigkill_of_stallscope_leaves_redis_serving,
    a_recording_reads_back_to_the_same_findings,
);

/// stallscope run with `args` to its end.
fn run_stallscope(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args(args)
        .output()
        .expect("run")
}

/// `Attach::finish`, failing the test on exit status 2 (an error).
fn finish(a: Attach, limit: Duration) -> (Option<i32>, String) {
    let (code, out, stderr) = a.finish(limit);
    assert_ne!(code, Some(2), "stallscope attach failed: {stderr:?}");
    (code, out)
}

/// SIGINT, as Ctrl-C stops an attach without `--duration`, then `finish`.
fn interrupt(a: Attach, limit: Duration) -> (Option<i32>, String) {
    // SAFETY: a signal to the stallscope this test started.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    finish(a, limit)
}

/// `Attach::start` with a JSON report (`--format json` added to `args`), which must have
/// attached.
fn attach_json(backend: &str, redis: &Redis, args: &[&str]) -> Attach {
    let args = [args, &["--format", "json"]].concat();
    let a = Attach::start(backend, redis.pid(), &args);
    assert!(a.attached, "stallscope did not attach: {:?}", a.stderr);
    a
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

/// SETs from 8 clients at once, 4000 each: enough load to overflow a one-page ring for
/// sure, even when the machine is slow.
fn flood(port: u16) {
    let loads: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(move || set_load(port, 4000)))
        .collect();
    for l in loads {
        let _ = l.join();
    }
}

/// A script that spins for `us` µs of redis's clock and returns 1: a busy EVAL, which makes
/// no syscall while it runs.
fn busy_script(us: u32) -> String {
    format!(
        "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] \
         while true do local n = redis.call('TIME') if n[1] * 1000000 + n[2] - s > {us} then break end end return 1"
    )
}

fn eval_returns_1(c: &mut Client, script: &str) {
    assert!(matches!(
        c.cmd(&["EVAL", script, "0"]).expect("EVAL"),
        Reply::Int(1)
    ));
}

/// Waits for the live stall line of a gap: printed once the gap has ended.
fn wait_gap_line(a: &mut Attach) {
    assert!(
        a.wait_line(|l| l.starts_with("stall:") && l.contains("gap"), DEADLINE),
        "no live stall line; stderr: {:?}",
        a.stderr
    );
}

fn bgsave(c: &mut Client) {
    let r = c.cmd(&["BGSAVE"]).expect("BGSAVE");
    assert!(
        matches!(&r, Reply::Simple(s) if s.contains("Background saving started")),
        "{r:?}"
    );
}

/// Waits for redis to say its BGSAVE is over: it reaps the child (and says so) after the
/// child's exit, which the tracer has seen by then.
fn wait_bgsave_over(c: &mut Client) {
    let start = Instant::now();
    while c
        .info_field("persistence", "rdb_bgsave_in_progress")
        .as_deref()
        != Some("0")
    {
        assert!(start.elapsed() < DEADLINE, "the BGSAVE did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a stall began (its `ts_iso`) between `sent` and `replied`, epoch seconds, with a
/// millisecond of slack before `sent` for the clocks' rounding.
fn began_between(s: &serde_json::Value, sent: f64, replied: f64) -> bool {
    s["ts_iso"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|d| d.timestamp_micros() as f64 / 1e6)
        .is_some_and(|t| t >= sent - 0.001 && t <= replied)
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
    let r = json(&out);
    // Whether an fsync passes 100 µs is the disk's business (a tmpfs never does, and the
    // perf backend adds nothing to it); the exit status must say what the report says.
    let stalls = r["summary"]["stalls"].as_u64().unwrap_or(0);
    assert_eq!(
        code,
        Some(i32::from(stalls > 0)),
        "exit status for {stalls} stalls"
    );
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

/// Wall-clock seconds since the epoch (the clock of the report's `ts_iso`).
fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn a_busy_eval_is_a_main_thread_gap(backend: &str) {
    let redis = Redis::start(&[]);
    // No --duration: the trace goes on until the stall line has come, so the line can only
    // have been printed live, while tracing, however slow the machine.
    let mut a = attach_json(backend, &redis, &["--threshold", "10ms"]);
    let script = &busy_script(300_000);
    let mut c = redis.client();
    let sent = epoch_now();
    let r = c.cmd(&["EVAL", script, "0"]).expect("EVAL");
    let replied = epoch_now();
    assert!(matches!(r, Reply::Int(1)), "{r:?}");
    // The stall line is printed live, once the gap has ended (at redis's next call).
    wait_gap_line(&mut a);
    let (code, out) = interrupt(a, DEADLINE);
    assert_eq!(code, Some(1));
    let r = json(&out);
    // The script's 300 ms are main-thread gaps between the request and the reply: one, or a
    // few when the allocator made a syscall (an mmap for Lua's tables) in the middle.
    let gaps: Vec<&serde_json::Value> = main_gaps(&r)
        .into_iter()
        .filter(|s| began_between(s, sent, replied))
        .collect();
    let held: i64 = gaps.iter().filter_map(|s| s["duration_us"].as_i64()).sum();
    assert!(
        held >= 250_000,
        "main-thread gaps during the EVAL: {held} µs in all: {}",
        r["stalls"]
    );
    // A busy script is a command; with the bpf and perf backends' scheduler split, a gap the
    // machine's load kept mostly waiting for a CPU is CPU starvation instead.
    let starved = |s: &serde_json::Value| {
        backend != "ptrace"
            && s["sched"]["runnable_us"].as_i64().unwrap_or(0) * 2
                >= s["duration_us"].as_i64().unwrap_or(0) - 2
    };
    assert!(
        gaps.iter()
            .all(|s| s["finding"] == "command" || (s["finding"] == "cpu-starvation" && starved(s))),
        "{gaps:?}"
    );
    if backend == "ptrace" {
        // Only ptrace reads the request: the EVAL is named as what waited, its 300 ms.
        assert!(
            gaps.iter().any(|s| s["waiting_by_command"]["EVAL"] == 1
                && s["worst_wait_us"].as_i64() >= Some(300_000)),
            "the EVAL waited its 300 ms: {gaps:?}"
        );
    }
}

/// The commands that waited through a gap are named: the EVAL that made it.
fn a_busy_eval_holds_up_the_commands_behind_it(backend: &str) {
    let redis = Redis::start(&[]);
    let a = attach_json(
        backend,
        &redis,
        &["--duration", "2s", "--threshold", "50ms"],
    );
    let mut pinger = redis.client();
    let script = busy_script(400_000);
    let port = redis.port;
    let eval = std::thread::spawn(move || {
        let mut c = Client::connect(port, Duration::from_secs(20)).expect("connect");
        c.cmd(&["EVAL", &script, "0"]).expect("EVAL")
    });
    // PINGs go out until the EVAL has replied: those sent while it ran waited for it. (A
    // PING that merely took long is no sign that the EVAL runs: on a loaded machine, under
    // ptrace, one can take 100 ms before the EVAL is even read.)
    let start = Instant::now();
    while !eval.is_finished() {
        pinger.cmd(&["PING"]).expect("PING");
        assert!(start.elapsed() < DEADLINE, "the EVAL did not reply");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(matches!(eval.join().expect("EVAL thread"), Reply::Int(1)));
    let (code, out) = finish(a, Duration::from_secs(20));
    assert_eq!(code, Some(1));
    let r = json(&out);
    let gap = main_gaps(&r)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no main-thread gap: {}", r["stalls"]));
    assert!(
        gap["waiting_by_command"]["EVAL"].as_u64() >= Some(1),
        "the EVAL itself waited: {gap}"
    );
    // A PING sent during the EVAL is held only if the trace shows it was in before the gap
    // ended (returned by the wait that returned the EVAL); one found by the wait after it,
    // which returned at once, is shown queued only from the end of the call before that
    // wait (issue 13). Which of the two happens depends on timing, so neither is asserted.
    assert!(gap["worst_wait_us"].as_i64() >= gap["duration_us"].as_i64().map(|d| d / 2));
    assert_eq!(r["summary"]["lost_events"], 0);
}

// The backends that split calls and gaps by the scheduler.
with_backends!(
    [perf, bpf]
    splits_a_busy_eval_gap_into_cpu_and_runnable_time,
    names_a_gap_spent_waiting_for_a_cpu,
    counts_the_copy_on_write_faults_after_a_bgsave_fork,
    counts_the_wait_for_a_cpu_after_a_wakeup_as_runnable,
    splits_a_call_already_running_at_the_attach_from_the_attach,
    a_script_that_asks_for_info_is_one_gap_through_its_getrusage_calls,
    a_stopped_process_is_no_slow_command_nor_the_hypervisors,
);

/// redis stopped by a signal for 300 ms under a GET load (`kill -STOP`, as a debugger or a
/// cgroup freezer such as `docker pause` stops it): its main thread's gap is neither on a
/// CPU nor waiting for one, with no call in it. That is not a slow command, and the host's
/// steal time over the /proc readings around it (none here) says it was not the
/// hypervisor either (the split alone, without those readings, said "the hypervisor").
fn a_stopped_process_is_no_slow_command_nor_the_hypervisors(backend: &str) {
    let redis = Redis::start(&[]);
    let a = attach_json(
        backend,
        &redis,
        &["--duration", "3s", "--threshold", "50ms"],
    );
    let port = redis.port.to_string();
    let load = std::thread::spawn(move || {
        Command::new("redis-benchmark")
            .args(["-p", &port, "-t", "get", "-n", "1000000", "-c", "20", "-q"])
            .output()
    });
    std::thread::sleep(Duration::from_millis(500));
    let signal = |s: &str| {
        let st = Command::new("kill")
            .args([s, &redis.pid().to_string()])
            .status()
            .expect("kill");
        assert!(st.success(), "kill {s}");
    };
    signal("-STOP");
    std::thread::sleep(Duration::from_millis(300));
    signal("-CONT");
    let (_, out) = finish(a, Duration::from_secs(30));
    let r = json(&out);
    // Stopping the server by its pid ends the benchmark's run too.
    drop(redis);
    let _ = load.join();
    let stopped: Vec<&serde_json::Value> = r["stalls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["thread"] == "main" && s["duration_us"].as_i64().unwrap_or(0) >= 250_000)
        .collect();
    assert!(!stopped.is_empty(), "no stall of the stop: {}", r["stalls"]);
    for s in stopped {
        let cause = s["cause"].as_str().unwrap();
        assert!(s["finding"].is_null(), "{s}");
        assert!(cause.contains("stopped or frozen"), "{cause}");
        assert!(cause.contains("not the hypervisor"), "{cause}");
    }
}

/// A 400 ms script that asks INFO every 40 ms (each INFO calls getrusage: a quiet call that
/// serves no client) kept every client waiting for all of it: one main-thread gap of about
/// 400 ms that ran through those calls, where each piece between them is under the 100 ms
/// threshold (before quiet calls ran through gaps, the report had no stall at all).
fn a_script_that_asks_for_info_is_one_gap_through_its_getrusage_calls(backend: &str) {
    let redis = Redis::start(&[]);
    let a = attach_json(backend, &redis, &["--threshold", "100ms"]);
    let script = "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] local last = 0 \
                  while true do local n = redis.call('TIME') local e = n[1] * 1000000 + n[2] - s \
                  if e - last > 40000 then redis.call('INFO', 'cpu') last = e end \
                  if e > 400000 then break end end return 1";
    let r = eval_until_a_gap(&redis, a, script);
    let g = main_gaps(&r)
        .into_iter()
        .max_by_key(|g| g["duration_us"].as_i64())
        .unwrap_or_else(|| panic!("no main-thread gap: {}", r["stalls"]));
    assert!(g["duration_us"].as_i64().unwrap_or(0) >= 390_000, "{g}");
    assert!(g["quiet_calls"].as_u64().unwrap_or(0) >= 1, "{g}");
    let cause = g["cause"].as_str().unwrap_or("");
    assert!(cause.contains("served no client for"), "{cause}");
    assert!(cause.contains("getrusage"), "{cause}");
    redis.assert_unharmed();
}

/// The scheduler's view of a gap (bpf, perf): a busy EVAL never blocks, so the gap is time
/// on a CPU or waiting for one (which of the two depends on how loaded the machine is), and
/// the parts add up to the gap.
fn splits_a_busy_eval_gap_into_cpu_and_runnable_time(backend: &str) {
    let redis = Redis::start(&[]);
    let a = attach_json(
        backend,
        &redis,
        &["--duration", "2s", "--threshold", "20ms"],
    );
    let script = &busy_script(300_000);
    let mut c = redis.client();
    eval_returns_1(&mut c, script);
    let (_, out) = finish(a, Duration::from_secs(20));
    let r = json(&out);
    let gaps = main_gaps(&r);
    assert!(!gaps.is_empty(), "no main-thread gap: {}", r["stalls"]);
    for g in gaps {
        let (on, run, blocked) = sched_parts(g);
        let d = g["duration_us"].as_i64().unwrap_or(0);
        // Each part is rounded down to a whole µs on its own: up to 3 µs go missing in the sum.
        assert!((on + run + blocked - d).abs() <= 3, "parts add up: {g}");
        assert!(
            on + run >= d * 8 / 10,
            "a busy EVAL is on a CPU or waiting for one: {g}"
        );
        // The finding follows the split (each part is rounded down: a few µs of slack).
        if run * 2 > d + 2 {
            assert_eq!(g["finding"], "cpu-starvation", "{g}");
        } else if run * 2 < d - 2 {
            assert_eq!(g["finding"], "command", "{g}");
        }
    }
}

/// The bpf programs share the syscall tracepoints with other perf users: while they run, a
/// second stallscope with the perf backend still sees every call (a tracepoint program that
/// returned 0 would make the kernel drop the event for everyone else).
#[test]
fn bpf_backend_leaves_the_tracepoints_to_other_perf_users() {
    let _g = serial();
    if !can_run("bpf") {
        return;
    }
    let redis = Redis::start(&[]);
    let mut c = redis.client();
    // Both stopped once the client is done (perf first), never after a fixed window that a
    // loaded machine may not fit the SETs into.
    let b = attach_json("bpf", &redis, &["--threshold", "1s"]);
    let p = attach_json("perf", &redis, &["--threshold", "1s"]);
    let n = 500;
    for i in 0..n {
        c.cmd(&["SET", &format!("k{i}"), "v"]).expect("SET");
    }
    unsafe { libc::kill(p.child.id() as i32, libc::SIGINT) };
    unsafe { libc::kill(b.child.id() as i32, libc::SIGINT) };
    let writes = |out: &str| syscall_calls(&json(out), "write");
    let (_, perf_out) = finish(p, Duration::from_secs(20));
    let (_, bpf_out) = finish(b, Duration::from_secs(20));
    assert!(
        writes(&perf_out) >= n,
        "perf saw {} writes",
        writes(&perf_out)
    );
    assert!(writes(&bpf_out) >= n, "bpf saw {} writes", writes(&bpf_out));
}

/// Every request of a synchronous client is a command in the per-command table.
fn every_command_is_counted(backend: &str) {
    let redis = Redis::start(&[]);
    let mut c = redis.client();
    // Stopped once the client is done, not after a --duration: under ptrace on a loaded
    // machine 3000 round trips can take longer than any fixed window.
    let a = attach_json(backend, &redis, &["--threshold", "1s"]);
    let n = 1500;
    for i in 0..n {
        c.cmd(&["SET", &format!("k{i}"), "v"]).expect("SET");
        c.cmd(&["GET", &format!("k{i}")]).expect("GET");
    }
    let (_, out) = interrupt(a, Duration::from_secs(60));
    let r = json(&out);
    assert_eq!(r["summary"]["lost_events"], 0);
    let calls = |name: &str| {
        r["commands"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["command"] == name && c["phase"] == "all")
            .filter_map(|c| c["calls"].as_u64())
            .sum::<u64>()
    };
    assert_eq!(calls("SET"), n, "{}", r["commands"]);
    assert_eq!(calls("GET"), n, "{}", r["commands"]);
    // Keys and values never reach the report.
    assert!(!out.contains("k1499"), "a key is in the report");
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
    let a = attach_json(backend, &redis, &["--threshold", "10ms"]);
    let mut c = redis.client();
    bgsave(&mut c);
    // Redis reaps the child (and says the save is over) after the child's exit, which the
    // tracer has seen by then.
    wait_bgsave_over(&mut c);
    let (_, out) = interrupt(a, DEADLINE);
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
    let (code, out) = interrupt(a, DEADLINE);
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
    // Ten clients one after another: each takes the lowest free fd, the one redis also
    // opens /proc/self/stat on every 100 ms, so fd numbers are reused between files and
    // clients throughout (what a late /proc read used to get wrong, issue 16).
    for _ in 0..10 {
        set_load(redis.port, 20);
    }
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
    // This has failed now and then on a loaded machine (the replay naming one more finding):
    // keep both reports and the recording where the failure message says, to find out why.
    let keep = std::env::temp_dir().join(format!("stallscope-readback-{backend}"));
    if about_redis(&live) != about_redis(&back) {
        let _ = std::fs::create_dir_all(&keep);
        let _ = std::fs::write(keep.join("live.json"), live.to_string());
        let _ = std::fs::write(keep.join("back.json"), back.to_string());
        let _ = std::fs::copy(&rec, keep.join("rec.strace"));
    }
    assert_eq!(
        about_redis(&live),
        about_redis(&back),
        "both reports and the recording are kept in {}",
        keep.display()
    );
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
                // With bpf and perf, the scheduler's split and the cause it names, too.
                format!(
                    "{} {} {} {} at {} for {} {} {} {} {}",
                    s["tid"],
                    s["thread"],
                    s["kind"],
                    s["syscall"],
                    s["at_us"],
                    s["duration_us"],
                    s["bound"],
                    s["in_flight"],
                    s["finding"],
                    s["sched"]
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
    // The same command latencies, timed from the same start (with bpf, from each request's
    // arrival, which the recording keeps beside it in FILE.arrivals).
    let commands = |r: &serde_json::Value| -> Vec<String> {
        r["commands"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                format!(
                    "{} {} {} {} {} {} {}",
                    c["command"],
                    c["phase"],
                    c["calls"],
                    c["p50_us"],
                    c["p99_us"],
                    c["max_us"],
                    c["from_arrival"]
                )
            })
            .collect()
    };
    assert_eq!(commands(&live), commands(&back));
    assert_eq!(
        live["summary"]["command_start"],
        back["summary"]["command_start"]
    );
}

#[test]
fn attach_errors_exit_2_with_a_clear_message() {
    let _g = serial();
    let out = run_stallscope(&["attach", "--pid", "4000000"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stallscope: error:") && err.contains("no such process"),
        "{err}"
    );
    let out = run_stallscope(&["attach", "--name", "no-such-program-anywhere"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no running process"));
    // Already traced: a second attach is refused while the first holds the process.
    if !have_redis() {
        return;
    }
    let redis = Redis::start(&[]);
    let a = Attach::start("ptrace", redis.pid(), &["--threshold", "10ms"]);
    let out = run_stallscope(&[
        "attach",
        "--backend",
        "ptrace",
        "--pid",
        &redis.pid().to_string(),
    ]);
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
    let out = run_stallscope(&["attach", "--backend", "perf", "--pid", "4000000"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stallscope: error:") && err.contains("no such process"),
        "{err}"
    );
    let out = run_stallscope(&["attach", "--perf-pages", "3", "--pid", "1"]);
    assert_eq!(out.status.code(), Some(2), "3 pages is not a power of two");
    // auto picks bpf here (tracefs, root) and says so; when the kernel refuses a bpf
    // program, it says why and takes perf.
    let redis = Redis::start(&[]);
    let auto = |refuse: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stallscope"));
        cmd.args([
            "attach",
            "--pid",
            &redis.pid().to_string(),
            "--duration",
            "300ms",
            "--format",
            "json",
        ]);
        if refuse {
            cmd.env("STALLSCOPE_BPF_TEST_REFUSE", "1");
        }
        let out = cmd.output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (json(&String::from_utf8_lossy(&out.stdout)), err)
    };
    if have_bpf() {
        let (r, err) = auto(false);
        assert!(err.contains("backend bpf (auto)"), "{err}");
        assert_eq!(r["source"]["backend"], "bpf");
    }
    let (r, err) = auto(true);
    assert!(err.contains("backend perf (auto)"), "{err}");
    if have_bpf() {
        assert!(
            err.contains("the bpf backend cannot be used")
                && err.contains("the verifier said")
                && err.contains("invalid mem access"),
            "the verifier's reason is given: {err}"
        );
    }
    assert_eq!(r["source"]["backend"], "perf");
    redis.assert_unharmed();
}

/// The classic tracepoint programs (what a kernel without BTF runs; forced here) see the
/// same calls and commands as the tp_btf ones that this kernel prefers, and a busy EVAL as
/// the same main-thread gap.
#[test]
fn bpf_backend_on_classic_tracepoints_sees_the_same() {
    let _g = serial();
    if !can_run("bpf") {
        return;
    }
    // What a short attach to a redis of its own says of the programs it loaded.
    fn attach_says() -> String {
        let redis = Redis::start(&[]);
        let a = Attach::start("bpf", redis.pid(), &["--duration", "200ms"]);
        assert!(a.attached, "{:?}", a.stderr);
        let err = a.stderr.join("\n");
        finish(a, DEADLINE);
        err
    }
    let err = attach_says();
    assert!(
        err.contains("syscall programs on BTF-typed raw tracepoints"),
        "{err}"
    );
    // The test processes hold the serial lock: no other live test spawns meanwhile.
    std::env::set_var("STALLSCOPE_BPF_CLASSIC", "1");
    let r = std::panic::catch_unwind(|| {
        let err = attach_says();
        assert!(
            err.contains("syscall programs on classic tracepoints")
                && err.contains("STALLSCOPE_BPF_CLASSIC=1"),
            "{err}"
        );
        every_command_is_counted("bpf");
        a_busy_eval_is_a_main_thread_gap("bpf");
    });
    std::env::remove_var("STALLSCOPE_BPF_CLASSIC");
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}

/// A program the kernel refuses (forced: a deliberately invalid one) makes `--backend bpf`
/// exit 2 with the verifier's own message, and leaves redis untouched.
#[test]
fn bpf_backend_refused_by_the_verifier_exits_2_with_the_reason() {
    let _g = serial();
    if !can_run("bpf") {
        return;
    }
    let redis = Redis::start(&[]);
    let out = Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args([
            "attach",
            "--backend",
            "bpf",
            "--pid",
            &redis.pid().to_string(),
        ])
        .env("STALLSCOPE_BPF_TEST_REFUSE", "1")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stallscope: error: cannot attach to process")
            && err.contains("the kernel refused BPF program refused_by_verifier")
            && err.contains("invalid mem access")
            && err.ends_with('\n'),
        "{err}"
    );
    let out = run_stallscope(&["attach", "--backend", "bpf", "--pid", "4000000"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such process"));
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
    let a = attach_json("perf", &redis, &["--threshold", "1s"]);
    let n = 2000;
    for i in 0..n {
        c.cmd(&["SET", &format!("k{i}"), "v"]).expect("SET");
    }
    let (_, out) = interrupt(a, DEADLINE);
    let r = json(&out);
    assert_eq!(r["summary"]["lost_events"], 0);
    let calls = |name: &str| syscall_calls(&r, name);
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
    gated("perf", lost_events_with_a_tiny_ring);
}

#[test]
fn bpf_backend_reports_lost_events_with_a_tiny_ring() {
    gated("bpf", lost_events_with_a_tiny_ring);
}

fn lost_events_with_a_tiny_ring(backend: &str) {
    let redis = Redis::start(&[]);
    let run = |format: &str| -> String {
        let a = Attach::start(
            backend,
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
        flood(redis.port);
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

/// A busy loop pinned to one CPU (`sh`, killed by pid when dropped).
struct Hog(std::process::Child);

impl Hog {
    fn on_cpu(cpu: usize) -> Hog {
        let child = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("start a CPU hog");
        let hog = Hog(child);
        pin(hog.0.id(), cpu);
        // Running: it has used CPU time (utime in /proc/PID/stat).
        let start = Instant::now();
        loop {
            let stat =
                std::fs::read_to_string(format!("/proc/{}/stat", hog.0.id())).unwrap_or_default();
            let utime: u64 = stat
                .rsplit(") ")
                .next()
                .and_then(|r| r.split_whitespace().nth(11))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if utime > 0 {
                return hog;
            }
            assert!(start.elapsed() < DEADLINE, "the CPU hog does not run");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first CPU this test may run on.
fn a_cpu() -> usize {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .find(|c| libc::CPU_ISSET(*c, &set))
            .expect("a CPU")
    }
}

/// Pins one thread (a tid; a process's main thread is its pid) to `cpu`.
fn pin(tid: u32, cpu: usize) {
    // SAFETY: a set with one CPU, for a thread this test started.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        )
    };
    assert_eq!(
        r,
        0,
        "sched_setaffinity({tid}): {}",
        std::io::Error::last_os_error()
    );
}

/// Sets one thread's nice value.
fn renice(tid: u32, nice: i32) {
    // SAFETY: PRIO_PROCESS with a tid sets that one thread's priority (Linux).
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    assert_eq!(
        r,
        0,
        "setpriority({tid}, {nice}): {}",
        std::io::Error::last_os_error()
    );
}

/// Puts one thread in the real-time class (SCHED_FIFO, lowest priority): it runs whenever it
/// is ready, ahead of every ordinary task of the machine (nice alone does not do that across
/// sessions: autogroups share the CPU between sessions first). Its children are forked back
/// into the ordinary class (SCHED_RESET_ON_FORK).
fn realtime(tid: u32) {
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: a valid sched_param, for a thread this test started.
    let r = unsafe {
        libc::sched_setscheduler(
            tid as libc::pid_t,
            libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK,
            &p,
        )
    };
    assert_eq!(
        r,
        0,
        "sched_setscheduler({tid}, SCHED_FIFO): {}",
        std::io::Error::last_os_error()
    );
}

/// Main-thread gaps of a report, with their `sched` parts (µs) and duration.
/// Runs `script` with EVAL (it returns 1), waits for the live stall line of a gap, stops
/// the attach with SIGINT and returns its report.
fn eval_until_a_gap(redis: &Redis, mut a: Attach, script: &str) -> serde_json::Value {
    let mut c = redis.client();
    eval_returns_1(&mut c, script);
    wait_gap_line(&mut a);
    let (_, out) = interrupt(a, DEADLINE);
    json(&out)
}

fn main_gaps(r: &serde_json::Value) -> Vec<&serde_json::Value> {
    r["stalls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["kind"] == "gap" && s["thread"] == "main")
        .collect()
}

fn sched_part(g: &serde_json::Value, k: &str) -> i64 {
    g["sched"][k]
        .as_i64()
        .unwrap_or_else(|| panic!("no sched.{k}: {g}"))
}

/// A stall's scheduler split: (on a CPU, waiting for one, blocked), µs.
fn sched_parts(s: &serde_json::Value) -> (i64, i64, i64) {
    (
        sched_part(s, "on_cpu_us"),
        sched_part(s, "runnable_us"),
        sched_part(s, "blocked_us"),
    )
}

/// The calls of syscall `name` in a report's syscall table (0 when it has no row).
fn syscall_calls(r: &serde_json::Value, name: &str) -> u64 {
    r["syscalls"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == name)
        .and_then(|s| s["calls"].as_u64())
        .unwrap_or(0)
}

/// A report's per-command row of `command` over the whole trace (phase `all`).
fn command_row<'a>(r: &'a serde_json::Value, command: &str) -> &'a serde_json::Value {
    r["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["command"] == command && c["phase"] == "all")
        .unwrap_or_else(|| panic!("no {command} row: {}", r["commands"]))
}

/// A gap mostly on a CPU is a slow command, named when the backend reads requests (bpf):
/// the busy EVAL's gap says EVAL in its cause, and the command finding names it. The main
/// thread runs in the real-time class so that, on a busy machine, the gap is still mostly on
/// a CPU (mostly waiting for one would be CPU starvation).
#[test]
fn bpf_backend_names_the_command_a_busy_gap_ran() {
    let _g = serial();
    if !can_run("bpf") {
        return;
    }
    let redis = Redis::start(&[]);
    realtime(redis.pid());
    let a = attach_json("bpf", &redis, &["--threshold", "20ms"]);
    let script = &busy_script(300_000);
    let r = eval_until_a_gap(&redis, a, script);
    let gaps = main_gaps(&r);
    let g = gaps
        .iter()
        .max_by_key(|g| g["duration_us"].as_i64())
        .unwrap_or_else(|| panic!("no main-thread gap: {}", r["stalls"]));
    assert_eq!(g["finding"], "command", "{g}");
    let cause = g["cause"].as_str().unwrap_or("");
    assert!(cause.contains("a slow command (EVAL), on a CPU"), "{cause}");
    let f = r["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["id"] == "command")
        .unwrap_or_else(|| panic!("no command finding: {}", r["findings"]));
    assert!(
        f["evidence"]
            .as_str()
            .is_some_and(|e| e.contains("running through them: EVAL")),
        "{f}"
    );
    redis.assert_unharmed();
}

/// A thread waiting for a CPU (bpf, perf): redis's main thread, niced, shares one CPU with
/// a busy loop that is not, so a script that spins for 300 ms of wall time gets a few ms of
/// CPU in them and waits for the rest. The gap says so in its `sched` and its cause, and
/// the cpu-starvation finding explains it.
fn names_a_gap_spent_waiting_for_a_cpu(backend: &str) {
    let redis = Redis::start(&[]);
    let cpu = a_cpu();
    pin(redis.pid(), cpu);
    renice(redis.pid(), 19);
    let hog = Hog::on_cpu(cpu);
    let mut a = attach_json(backend, &redis, &["--threshold", "20ms"]);
    let script = &busy_script(300_000);
    let mut c = redis.client();
    eval_returns_1(&mut c, script);
    wait_gap_line(&mut a);
    drop(hog);
    let (_, out) = interrupt(a, DEADLINE);
    let r = json(&out);
    let gaps = main_gaps(&r);
    let g = gaps
        .iter()
        .max_by_key(|g| g["duration_us"].as_i64())
        .unwrap_or_else(|| panic!("no main-thread gap: {}", r["stalls"]));
    let d = g["duration_us"].as_i64().unwrap_or(0);
    assert!(d >= 100_000, "the script's gap: {g}");
    let run = sched_part(g, "runnable_us");
    assert!(run * 2 >= d, "mostly waiting for a CPU: {g}");
    assert_eq!(g["finding"], "cpu-starvation", "{g}");
    let cause = g["cause"].as_str().unwrap_or("");
    assert!(
        cause.contains("waiting for a CPU") && cause.contains("CPU starvation"),
        "{cause}"
    );
    assert!(
        finding_ids(&r).contains(&"cpu-starvation".to_string()),
        "{:?}",
        finding_ids(&r)
    );
    redis.assert_unharmed();
}

/// A call that sleeps and is woken while its CPU is busy (bpf, perf): `DEBUG SLEEP` puts the
/// main thread in nanosleep; the timer wakes it while a busy loop that is not niced holds
/// the one CPU it may use, so it waits for the CPU before it returns. That wait is runnable
/// time in the call's split, not blocked time (perf sees it only through sched_wakeup of
/// the thread, whoever wakes it).
fn counts_the_wait_for_a_cpu_after_a_wakeup_as_runnable(backend: &str) {
    let redis = Redis::start(&["--enable-debug-command", "yes"]);
    let cpu = a_cpu();
    pin(redis.pid(), cpu);
    renice(redis.pid(), 19);
    // Whether a woken nice-19 thread waits behind the hog is the scheduler's choice (it may
    // run it at once on some wakeups, and on a loaded machine three tries in a row were
    // seen to run at once): try again, up to six attaches, until one of its sleeps waited.
    // Every sleep's split must add up and be mostly blocked, in every try.
    let mut waited = false;
    let mut seen = vec![];
    for _ in 0..6 {
        let hog = Hog::on_cpu(cpu);
        let a = attach_json(backend, &redis, &["--threshold", "50ms"]);
        let mut c = redis.client();
        for _ in 0..3 {
            let r = c.cmd(&["DEBUG", "SLEEP", "0.2"]).expect("DEBUG SLEEP");
            assert_eq!(r.text(), "+OK");
        }
        drop(hog);
        let (_, out) = interrupt(a, DEADLINE);
        let r = json(&out);
        let sleeps: Vec<serde_json::Value> = r["stalls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| {
                s["thread"] == "main" && s["syscall"].as_str().is_some_and(|n| n.contains("sleep"))
            })
            .cloned()
            .collect();
        assert!(!sleeps.is_empty(), "no sleep among {}", r["stalls"]);
        for s in &sleeps {
            let d = s["duration_us"].as_i64().unwrap_or(0);
            let (on, run, blocked) = sched_parts(s);
            assert!((on + run + blocked - d).abs() <= 3, "parts add up: {s}");
            assert!(blocked >= 150_000, "asleep for most of it: {s}");
        }
        waited = sleeps.iter().any(|s| sched_part(s, "runnable_us") > 0);
        seen.extend(sleeps);
        if waited {
            break;
        }
    }
    assert!(
        waited,
        "woken on a busy CPU, it waited for it (in one of six tries): {seen:?}"
    );
    redis.assert_unharmed();
}

/// A call already running when the tracer attaches (bpf, perf): `DEBUG SLEEP 4` is under way
/// in the main thread's clock_nanosleep when the tracer attaches. Its stall, known from the
/// attach, gets the split of that traced part: it says so (`since_attach`), its parts add up
/// to the traced duration, and the thread was asleep for most of it (a split counted from
/// the thread's start instead would put its whole life on a CPU).
fn splits_a_call_already_running_at_the_attach_from_the_attach(backend: &str) {
    const SYS_NANOSLEEP: i64 = libc::SYS_nanosleep;
    const SYS_CLOCK_NANOSLEEP: i64 = libc::SYS_clock_nanosleep;
    let redis = Redis::start(&["--enable-debug-command", "yes"]);
    let in_sleep = || {
        matches!(
            redis.main_syscall(),
            Some(SYS_NANOSLEEP | SYS_CLOCK_NANOSLEEP)
        )
    };
    // The attach must land inside the sleep; on a slow machine it may not: try again.
    for attempt in 0..3 {
        let port = redis.port;
        let sleep = std::thread::spawn(move || {
            Client::connect(port, DEADLINE)
                .and_then(|mut c| c.cmd(&["DEBUG", "SLEEP", "4"]))
                .map(|r| r.text())
        });
        let start = std::time::Instant::now();
        while !in_sleep() && start.elapsed() < DEADLINE {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(in_sleep(), "the main thread never slept");
        let a = attach_json(backend, &redis, &["--threshold", "100ms"]);
        let landed = in_sleep();
        assert_eq!(
            sleep.join().expect("DEBUG SLEEP").ok().as_deref(),
            Some("+OK")
        );
        let (_, out) = interrupt(a, DEADLINE);
        if !landed {
            eprintln!("attempt {attempt}: the attach came after the sleep");
            continue;
        }
        let r = json(&out);
        let s = r["stalls"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| {
                s["thread"] == "main"
                    && s["in_flight"] == "at_start"
                    && s["syscall"].as_str().is_some_and(|n| n.contains("sleep"))
            })
            .unwrap_or_else(|| panic!("no sleep in flight at the start: {}", r["stalls"]));
        assert_eq!(s["sched"]["since_attach"], true, "{s}");
        let d = s["duration_us"].as_i64().unwrap_or(0);
        let (on, run, blocked) = sched_parts(s);
        assert!((on + run + blocked - d).abs() <= 3, "parts add up: {s}");
        assert!(blocked * 2 >= d, "asleep for most of its traced part: {s}");
        assert!(
            s["cause"]
                .as_str()
                .is_some_and(|c| c.contains("already running when tracing began")),
            "{s}"
        );
        redis.assert_unharmed();
        return;
    }
    panic!("three attaches all came after the 4 s sleep");
}

/// Copy-on-write after a fork (bpf, perf): with a few hundred MB in redis and a BGSAVE child
/// running, a script that writes one byte into each of 40,000 values (each on pages of its
/// own) makes the main thread take a minor fault per value, all in one gap; the faults are
/// counted in its `sched` and the cause names copy-on-write. The main thread runs in the
/// real-time class so that, on a busy machine, the gap is still mostly on a CPU (a gap mostly
/// spent waiting for one is CPU starvation, whatever else happened in it).
fn counts_the_copy_on_write_faults_after_a_bgsave_fork(backend: &str) {
    const KEYS: i64 = 40_000;
    let redis = Redis::start(&["--enable-debug-command", "yes", "--rdbcompression", "no"]);
    realtime(redis.pid());
    let mut c = redis.client();
    // 8000-byte values: each takes two pages of its own.
    let r = c
        .cmd(&["DEBUG", "POPULATE", &KEYS.to_string(), "key", "8000"])
        .expect("DEBUG POPULATE");
    assert_eq!(r.text(), "+OK");
    // The child lives long enough for the script to run while it does.
    let r = c
        .cmd(&["CONFIG", "SET", "rdb-key-save-delay", "50"])
        .expect("CONFIG SET");
    assert_eq!(r.text(), "+OK");
    let a = attach_json(backend, &redis, &["--threshold", "5ms"]);
    bgsave(&mut c);
    let script = "for i = 0, tonumber(ARGV[1]) - 1 do redis.call('SETRANGE', 'key:' .. i, 0, 'x') end return 1";
    let sent = epoch_now();
    let r = c
        .cmd(&["EVAL", script, "0", &KEYS.to_string()])
        .expect("EVAL");
    let replied = epoch_now();
    assert!(matches!(r, Reply::Int(1)), "{r:?}");
    let r = c
        .cmd(&["CONFIG", "SET", "rdb-key-save-delay", "0"])
        .expect("CONFIG SET");
    assert_eq!(r.text(), "+OK");
    wait_bgsave_over(&mut c);
    let (_, out) = interrupt(a, DEADLINE);
    let r = json(&out);
    let gaps: Vec<&serde_json::Value> = main_gaps(&r)
        .into_iter()
        .filter(|s| began_between(s, sent, replied))
        .collect();
    // A fault per value written, nearly all in gaps: the few taken inside the script's short
    // syscalls (memory the allocator asks for) are in no stall.
    let faults: i64 = gaps.iter().map(|g| sched_part(g, "minor_faults")).sum();
    assert!(
        faults >= KEYS * 3 / 4,
        "a fault per value written: {faults} in {gaps:?}"
    );
    let g = gaps
        .iter()
        .max_by_key(|g| g["sched"]["minor_faults"].as_i64())
        .expect("a gap");
    assert!(g["phase"].as_i64().is_some(), "during the child: {g}");
    assert_eq!(g["finding"], "cow-page-faults", "{g}");
    let cause = g["cause"].as_str().unwrap_or("");
    assert!(
        cause.contains("copy-on-write") && cause.contains("minor page faults"),
        "{cause}"
    );
    redis.assert_unharmed();
}

/// A lossy trace recorded reads back with the same losses: the count in the summary, and
/// the same stalls marked as found after a loss (a one-page ring under load loses records;
/// a busy script after the load is a stall found after it).
#[test]
fn perf_backend_recording_keeps_its_lost_events() {
    gated("perf", lost_events_read_back_from_a_recording);
}

#[test]
fn bpf_backend_recording_keeps_its_lost_events() {
    gated("bpf", lost_events_read_back_from_a_recording);
}

fn lost_events_read_back_from_a_recording(backend: &str) {
    let redis = Redis::start(&[]);
    let rec = redis.dir().join("rec.strace");
    let rec_s = rec.to_string_lossy().into_owned();
    let mut a = Attach::start(
        backend,
        redis.pid(),
        &[
            "--threshold",
            "10ms",
            "--perf-pages",
            "1",
            "--format",
            "json",
            "--record",
            &rec_s,
        ],
    );
    assert!(a.attached, "{:?}", a.stderr);
    flood(redis.port);
    let script = &busy_script(50_000);
    let mut c = redis.client();
    // The script's gap is seen whole once the ring keeps up again: while the analysis works
    // through the load's backlog a one-page ring may still drop the calls around it, so the
    // script is run again until its gap is printed.
    let start = Instant::now();
    loop {
        eval_returns_1(&mut c, script);
        if a.wait_line(
            |l| l.starts_with("stall:") && l.contains("gap"),
            Duration::from_secs(10),
        ) {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no live stall line; stderr: {:?}",
            a.stderr
        );
    }
    let (_, out) = interrupt(a, DEADLINE);
    let live = json(&out);
    let lost = live["summary"]["lost_events"].as_u64().unwrap_or(0);
    assert!(
        lost > 0,
        "no lost events with a one-page ring: {}",
        live["summary"]
    );
    let side = format!("{rec_s}.lost");
    assert!(std::path::Path::new(&side).exists(), "no {side}");
    let analyze = |format: &str| -> String {
        let o = Command::new(env!("CARGO_BIN_EXE_stallscope"))
            .args(["analyze", &rec_s, "--threshold", "10ms", "--color", "never"])
            .args(["--format", format])
            .output()
            .expect("run analyze");
        assert!(
            matches!(o.status.code(), Some(0) | Some(1)),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let back = json(&analyze("json"));
    assert_eq!(back["summary"]["lost_events"], lost, "summary.lost_events");
    let stalls = |r: &serde_json::Value| -> Vec<String> {
        r["stalls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                format!(
                    "{} {} {} at {} for {} lost {}",
                    s["tid"],
                    s["kind"],
                    s["syscall"],
                    s["at_us"],
                    s["duration_us"],
                    s["events_lost"]
                )
            })
            .collect()
    };
    assert_eq!(stalls(&live), stalls(&back));
    assert!(
        live["stalls"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["events_lost"] == true),
        "no stall found after a loss: {}",
        live["stalls"]
    );
    assert!(
        analyze("table").contains("events were lost"),
        "the replay's table does not say so"
    );
    redis.assert_unharmed();
}

/// bpf: a command's latency starts when its request reached redis's socket, so a GET that
/// queued behind a DEBUG SLEEP on another connection shows the wait its client saw (without
/// the kernel's arrival stamps it would start when the event loop found it, after the sleep,
/// and look instant).
#[test]
fn bpf_a_command_queued_behind_a_sleep_is_timed_from_its_arrival() {
    let _g = serial();
    if can_run("bpf") {
        queued_behind_a_sleep(true);
    }
}

/// On a kernel without the tracepoints (forced) the bpf backend traces as before and says
/// where per-command latency starts instead.
#[test]
fn bpf_without_arrival_stamps_says_latency_starts_in_the_event_loop() {
    let _g = serial();
    if can_run("bpf") {
        queued_behind_a_sleep(false);
    }
}

/// A GET sent while redis sleeps in DEBUG SLEEP 1 on another connection: its latency in
/// redis against its client's round trip.
fn queued_behind_a_sleep(stamps: bool) {
    let redis = Redis::start(&["--enable-debug-command", "yes"]);
    let env: &[(&str, &str)] = if stamps {
        &[]
    } else {
        &[("STALLSCOPE_BPF_TEST_NO_ARRIVALS", "1")]
    };
    let a = Attach::start_with_env(
        "bpf",
        redis.pid(),
        &["--threshold", "100ms", "--format", "json"],
        env,
    );
    assert!(a.attached, "{:?}", a.stderr);
    // Connected and served once before the sleep: the GET then needs no accept.
    let mut getter = redis.client();
    getter.cmd(&["PING"]).expect("PING");
    // Sent only once redis's main thread is inside the sleep, so it waits for the rest of it.
    let sleeper = debug_sleep_1s_under_way(&redis);
    let sent = Instant::now();
    getter.cmd(&["GET", "k"]).expect("GET");
    let client_us = sent.elapsed().as_micros() as i64;
    assert_eq!(sleeper.join().expect("sleeper thread"), "+OK");
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (code, out, stderr) = a.finish(Duration::from_secs(20));
    assert_eq!(code, Some(1), "the sleep is a stall: {stderr:?}");
    let r = json(&out);
    assert_eq!(r["summary"]["lost_events"], 0);
    let start = if stamps { "arrival" } else { "event_loop" };
    assert_eq!(r["summary"]["command_start"], start, "{}", r["summary"]);
    let get = command_row(&r, "GET");
    let max = get["max_us"].as_i64().expect("max_us");
    if stamps {
        assert_eq!(get["from_arrival"], 1, "{get}");
        // The GET's own round trip is the rest of the sleep plus a few syscalls on each
        // side: seen from redis, at least half of it (hundreds of ms; without the stamps, µs).
        assert!(
            2 * max >= client_us,
            "GET: {max} µs in redis, {client_us} µs at the client: {get}"
        );
    } else {
        assert!(get.get("from_arrival").is_none(), "{get}");
        assert!(
            stderr.iter().any(|l| l.contains(
                "warning: per-command latency starts when redis's event loop found the request"
            ) && l.contains("STALLSCOPE_BPF_TEST_NO_ARRIVALS")),
            "{stderr:?}"
        );
    }
    redis.assert_unharmed();
}

/// `DEBUG SLEEP 1` sent on a connection of its own, returned once redis's main thread is
/// inside the sleep; the thread answers the sleep's reply.
fn debug_sleep_1s_under_way(redis: &Redis) -> std::thread::JoinHandle<String> {
    let port = redis.port;
    let sleeper = std::thread::spawn(move || {
        let mut c = Client::connect(port, Duration::from_secs(20)).expect("connect");
        c.cmd(&["DEBUG", "SLEEP", "1"]).expect("DEBUG SLEEP").text()
    });
    let start = Instant::now();
    while !matches!(
        redis.main_syscall(),
        Some(libc::SYS_clock_nanosleep) | Some(libc::SYS_nanosleep)
    ) {
        assert!(start.elapsed() < DEADLINE, "redis never slept");
        assert!(
            !sleeper.is_finished(),
            "DEBUG SLEEP returned before it was seen"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    sleeper
}

/// bpf: a pipelined burst larger than one read of redis's (16 KB) queued behind a DEBUG
/// SLEEP: the reads after the first find the rest of the same arrival and are timed from it
/// too (the first read leaves the socket's stamp for the data it left).
#[test]
fn bpf_a_burst_read_in_several_reads_is_timed_from_its_one_arrival() {
    use std::io::{Read, Write};
    let _g = serial();
    if !can_run("bpf") {
        return;
    }
    let redis = Redis::start(&["--enable-debug-command", "yes"]);
    let a = attach_json("bpf", &redis, &["--threshold", "100ms"]);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", redis.port)).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let ping = b"*1\r\n$4\r\nPING\r\n";
    let pong = b"+PONG\r\n";
    s.write_all(ping).expect("PING");
    let mut first = [0u8; 7];
    s.read_exact(&mut first).expect("PONG");
    let sleeper = debug_sleep_1s_under_way(&redis);
    // 42 KB in one write: one arrival, read by redis in three reads or more.
    let n = 3000;
    let sent = Instant::now();
    s.write_all(&ping.repeat(n)).expect("burst");
    let mut replies = vec![0u8; pong.len() * n];
    s.read_exact(&mut replies[..1]).expect("PONGs");
    // What the client waited for its first reply: the rest of the sleep, and more.
    let client_us = sent.elapsed().as_micros() as i64;
    s.read_exact(&mut replies[1..]).expect("PONGs");
    assert!(replies.chunks(pong.len()).all(|c| c == pong));
    assert_eq!(sleeper.join().expect("sleeper thread"), "+OK");
    let (_, out) = interrupt(a, Duration::from_secs(20));
    let r = json(&out);
    assert_eq!(r["summary"]["lost_events"], 0);
    // Only the first commands of each read are named (64 bytes are copied): some of every
    // read, so more than one read's worth when the burst took several.
    let reads = syscall_calls(&r, "read");
    let p = command_row(&r, "PING");
    assert!(reads >= 3, "{reads} reads");
    assert_eq!(p["from_arrival"], p["calls"], "{p}");
    // Every read of the burst waited for the rest of the sleep, as its client did: none is
    // timed as if it came after it (as from the event loop, a few µs).
    let p50 = p["p50_us"].as_i64().expect("p50_us");
    assert!(
        2 * p50 >= client_us,
        "PING p50 {p50} µs in redis, first reply after {client_us} µs at the client: {p}"
    );
    redis.assert_unharmed();
}
