//! redis and valkey with I/O threads, live, under every backend (issue 40): redis 7.0 with
//! `--io-threads 2 --io-threads-do-reads yes` and valkey 9 with `--io-threads 2` (both from
//! `scripts/test-deps.sh`), attached with bpf, perf and ptrace at `--threshold 2ms` under a
//! plain GET load that goes on until a DEBUG SLEEP 0.3 and a busy EVAL of about half a second
//! have run under it. The main thread's waits for its I/O threads are no slow command; the
//! two real slow commands are found, the EVAL named where the backend reads requests (bpf,
//! ptrace; perf reads no buffers, docs/BACKENDS.md), and every GET is counted. Stalls called
//! a slow command that the ground truth lacks are bounded where the backend splits a gap's
//! time by the scheduler: all three (see `verdicts`).
//! A server whose I/O threads come on and go off within one attach (`*_io_threads_on_and_off`)
//! stays right on both sides. `iothreads.rs` has the offline tests and the bpf figures (the
//! GET p50 against the client's and the wire's).

use super::common::{self, Client, DEADLINE};
use super::iothreads::Server;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A backend and what it can show of commands.
#[derive(Clone, Copy)]
struct Backend {
    name: &'static str,
    /// It reads request buffers: commands are named and counted.
    reads_requests: bool,
    /// GETs per redis-benchmark run: ptrace stops redis at every call (a tenth of its
    /// speed, less with I/O threads), so its runs are kept small.
    batch: u32,
}

const BPF: Backend = Backend {
    name: "bpf",
    reads_requests: true,
    batch: 10_000,
};
const PERF: Backend = Backend {
    name: "perf",
    reads_requests: false,
    batch: 10_000,
};
const PTRACE: Backend = Backend {
    name: "ptrace",
    reads_requests: true,
    batch: 1_000,
};

/// Whether this machine can trace with `b`: perf and bpf need root and tracefs; under
/// CI=true a missing one is a failure.
fn can_run(b: Backend) -> bool {
    b.name == "ptrace"
        || common::can_trace(
            "the perf and bpf backends need root and tracefs under CI=true",
            "skipping: the perf and bpf backends need root and tracefs",
        )
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// One `redis-benchmark -t get -n N -c CLIENTS -P PIPELINE` run against the port, to its end.
fn get_run(port: u16, n: u32, clients: u32, pipeline: u32) {
    let st = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-t", "get", "-n", &n.to_string()])
        .args([
            "-c",
            &clients.to_string(),
            "-P",
            &pipeline.to_string(),
            "-q",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("redis-benchmark (redis-tools)");
    assert!(st.success(), "redis-benchmark: {st}");
}

/// A plain GET load (`Busy`) that goes on (`batch` GETs a redis-benchmark run) until it is
/// stopped: the slow commands run under it however fast this machine serves. Its `finish`
/// gives the GETs sent.
struct Load {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<u64>,
}

impl Load {
    fn start(port: u16, batch: u32, busy: Busy) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut sent = 0u64;
            while !flag.load(Ordering::Relaxed) {
                get_run(port, batch, busy.clients, busy.pipeline);
                sent += u64::from(batch);
            }
            sent
        });
        Load { stop, handle }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap()
    }
}

/// A load's clients and the requests each sends before reading replies.
#[derive(Clone, Copy)]
struct Busy {
    clients: u32,
    pipeline: u32,
}

/// The plain load: 50 clients, one request at a time.
const PLAIN: Busy = Busy {
    clients: 50,
    pipeline: 1,
};

/// Requests the I/O threads have read since the server started (INFO stats).
fn threaded_reads(c: &mut Client) -> u64 {
    c.info_field("stats", "io_threaded_reads_processed")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Stalls called a slow command that the ground truth lacks (neither within the client's
/// span of a real slow command, `real`, nor holding one of `held`), and the main thread's
/// waits for its I/O threads; asserts at most one of the first, plus one in ten of the
/// second (a few remain on a loaded machine, as in the bpf figures of iothreads.rs).
fn assert_few_false_commands(who: &str, r: &Value, real: &[(f64, f64)], held: &[&str]) {
    let false_cmd: Vec<&Value> = stalls(r)
        .iter()
        .filter(|s| s["finding"] == "command")
        .filter(|s| real.iter().all(|x| !overlaps(span(s), *x)))
        .filter(|s| {
            held.iter()
                .all(|n| s["waiting_by_command"].get(n).is_none())
        })
        .collect();
    let waits = stalls(r)
        .iter()
        .filter(|s| s["thread"] == "main" && s["finding"] == "io-threads")
        .count();
    eprintln!(
        "{who}: {waits} waits for the I/O threads, {} stalls called a slow command the ground truth lacks",
        false_cmd.len()
    );
    assert!(
        false_cmd.len() <= 1 + waits / 10,
        "{who}: {} false slow commands against {waits} I/O-thread waits: {false_cmd:?}",
        false_cmd.len()
    );
}

/// The EVAL's loop count (`EVAL_SCRIPT`): about 0.4 s on a quiet machine here.
const EVAL_LOOPS: &str = "60000000";
const EVAL_SCRIPT: &str = "local i=0 for j=1,tonumber(ARGV[1]) do i=i+j end return i";

/// One command, timed by the client on the wall clock: (sent, replied).
fn timed(c: &mut Client, args: &[&str]) -> (f64, f64) {
    let sent = now();
    let r = c.cmd(args).unwrap();
    assert!(!r.text().starts_with('-'), "{}: {r:?}", args[0]);
    (sent, now())
}

/// A stall's span on the wall clock (to the millisecond, as `ts_iso` has it).
fn span(s: &Value) -> (f64, f64) {
    let t = s["ts_iso"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|d| d.timestamp_micros() as f64 / 1e6)
        .unwrap_or_else(|| panic!("no ts_iso: {s}"));
    (t, t + s["duration_us"].as_f64().unwrap() / 1e6)
}

/// Two spans overlap, give or take 2 ms (`ts_iso`'s millisecond, the client's clock reads).
fn overlaps(a: (f64, f64), b: (f64, f64)) -> bool {
    a.0 <= b.1 + 0.002 && b.0 <= a.1 + 0.002
}

fn stalls(r: &Value) -> &Vec<Value> {
    r["stalls"].as_array().unwrap()
}

fn calls_of(r: &Value, cmd: &str) -> u64 {
    r["commands"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["command"] == cmd && c["phase"] == "all")
        .map_or(0, |c| c["calls"].as_u64().unwrap())
}

/// What one attach saw, with the client's own spans of the slow commands.
struct Run {
    report: Value,
    debug: (f64, f64),
    eval: (f64, f64),
    sent: u64,
    threaded_reads: u64,
}

/// Attaches `b` to a server with I/O threads, runs DEBUG SLEEP 0.3 and the EVAL under the
/// GET load, detaches.
fn run(s: &Server, b: Backend) -> Run {
    // valkey switches its I/O threads on with the load: load it before attaching.
    get_run(s.port, 20_000, 50, 1);
    let mut c = s.client();
    let threaded_before = threaded_reads(&mut c);
    let a = common::Attach::start(
        b.name,
        s.child.id(),
        &["--threshold", "2ms", "--format", "json"],
    );
    assert!(a.attached, "attach --backend {}: {:?}", b.name, a.stderr);
    let load = Load::start(s.port, b.batch, PLAIN);
    std::thread::sleep(Duration::from_millis(500));
    let debug = timed(&mut c, &["DEBUG", "SLEEP", "0.3"]);
    std::thread::sleep(Duration::from_millis(300));
    let eval = timed(
        &mut c,
        &[
            "EVAL",
            "local i=0 for j=1,tonumber(ARGV[1]) do i=i+j end return i",
            "0",
            // 20,000,000 took 0.5 s on a loaded machine and 0.13 s on a quiet one (under
            // the test's 200 ms floor): this many takes 0.4 s there.
            EVAL_LOOPS,
        ],
    );
    // The GETs queued behind the EVAL answered while still attached.
    std::thread::sleep(Duration::from_millis(300));
    let sent = load.finish();
    let threaded_reads = threaded_reads(&mut c) - threaded_before;
    // SAFETY: SIGINT to the stallscope this test started: it detaches and reports.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (code, out, err) = a.finish(DEADLINE);
    assert!(matches!(code, Some(0 | 1)), "exit {code:?}: {err:?}");
    Run {
        report: common::json(&out),
        debug,
        eval,
        sent,
        threaded_reads,
    }
}

/// The verdicts on one server under one backend.
fn verdicts(bin: &str, io_args: &[&str], b: Backend) {
    let _guard = common::serial();
    if !can_run(b) || !common::have("redis-benchmark", "--version") {
        return;
    }
    let Some(s) = Server::start(bin, io_args) else {
        return;
    };
    let x = run(&s, b);
    drop(s);
    let r = &x.report;
    let who = format!("{bin} --backend {}", b.name);
    assert!(
        x.threaded_reads > 0,
        "{who}: the I/O threads read nothing while attached (the test would prove nothing)"
    );
    // DEBUG SLEEP: the main thread's 300 ms sleep, a slow command.
    assert!(
        stalls(r).iter().any(|s| s["thread"] == "main"
            && s["syscall"]
                .as_str()
                .is_some_and(|n| n.contains("nanosleep"))
            && s["finding"] == "command"
            && s["duration_us"].as_i64().unwrap() >= 290_000),
        "{who}: DEBUG SLEEP 0.3 not found: {:?}",
        stalls(r)
    );
    // The EVAL: the main thread's longest gap, within the client's span of it, a slow
    // command (CPU starvation where the scheduler's split says the main thread mostly
    // waited for a CPU through it), named where the backend reads requests.
    let eval = stalls(r)
        .iter()
        .filter(|s| s["thread"] == "main" && s["kind"] == "gap")
        .max_by_key(|s| s["duration_us"].as_i64().unwrap())
        .unwrap_or_else(|| panic!("{who}: no main-thread gap"));
    assert!(
        eval["duration_us"].as_i64().unwrap() >= 200_000 && overlaps(span(eval), x.eval),
        "{who}: the EVAL's gap (the client's span {:.3}-{:.3}): {eval}",
        x.eval.0,
        x.eval.1
    );
    assert!(
        eval["finding"] == "command" || eval["finding"] == "cpu-starvation",
        "{who}: the EVAL is a slow command: {eval}"
    );
    if b.reads_requests {
        // Named: "a slow command (EVAL)", or on a loaded machine "... while EVAL ran: it was
        // waiting for a CPU". Where the gap held one other single command read with it (a
        // new redis-benchmark connection's CONFIG GET, read by the I/O thread right after
        // the EVAL, about 1 run in 8; a GET the main thread read just before the EVAL, both
        // answered after the gap, redis 7 about 1 run in 6), which of the two ran is not in
        // the calls, and both are named ("(EVAL or CONFIG)"); the other is never named
        // alone.
        let cause = eval["cause"].as_str().unwrap();
        let names = cause
            .split_once("a slow command (")
            .and_then(|(_, r)| r.split_once(')'))
            .or_else(|| {
                cause
                    .split_once("while ")
                    .and_then(|(_, r)| r.split_once(" ran"))
            })
            .map_or("", |(n, _)| n);
        assert!(
            names.split([',', ' ']).any(|w| w == "EVAL"),
            "{who}: the EVAL is named: {eval}"
        );
        assert_eq!(calls_of(r, "GET"), x.sent, "{who}: every GET counted");
    }
    // Stalls called a slow command besides the two real ones. Without the scheduler's
    // split a main thread that lost its CPU after a hand-off, its I/O thread's share done,
    // cannot be told from one that ran a command by the syscalls alone: under ptrace before
    // it split calls and gaps, on this loaded 2-vCPU VM, 5-17 of 86-123 gaps after a
    // hand-off came back 10-54 ms late (redis 7; valkey 5 of 17), "a slow command, or the
    // process was descheduled". With its split (from /proc at the stops) those are
    // `cpu-starvation`, and the gaps the tracer held the main thread stopped
    // `tracer-overhead`: every backend measures the split, and the bound holds for each.
    eprintln!("{who}: {} GETs", x.sent);
    assert_few_false_commands(&who, r, &[x.eval, x.debug], &["EVAL", "DEBUG"]);
}

const REDIS7_IO: &[&str] = &["--io-threads", "2", "--io-threads-do-reads", "yes"];
// valkey turns its I/O threads on only once the main thread is busy enough, which a GET
// load on this host does not reach untraced: keep them on, as a loaded server has.
const VALKEY9_IO: &[&str] = &["--io-threads", "2", "--io-threads-always-active", "yes"];

#[test]
fn redis7_bpf() {
    verdicts("redis-server", REDIS7_IO, BPF);
}

#[test]
fn redis7_perf() {
    verdicts("redis-server", REDIS7_IO, PERF);
}

#[test]
fn redis7_ptrace() {
    verdicts("redis-server", REDIS7_IO, PTRACE);
}

#[test]
fn valkey9_bpf() {
    verdicts("valkey-server", VALKEY9_IO, BPF);
}

#[test]
fn valkey9_perf() {
    verdicts("valkey-server", VALKEY9_IO, PERF);
}

#[test]
fn valkey9_ptrace() {
    verdicts("valkey-server", VALKEY9_IO, PTRACE);
}

/// One phase of `mode_switch`: the EVAL's span by the client's clock, the GETs sent, the
/// reads the I/O threads did meanwhile.
struct Phase {
    eval: (f64, f64),
    gets: u64,
    threaded: u64,
}

/// Runs one phase: a single client's sequential GETs (`busy` None: too few clients in flight
/// for the server to use its I/O threads), or a load of `busy` clients (they come on), with an
/// EVAL in the middle.
fn phase(s: &Server, c: &mut Client, busy: Option<Busy>) -> Phase {
    let before = threaded_reads(c);
    let load = busy.map(|b| Load::start(s.port, 10_000, b));
    let mut gets = 0;
    let mut seq = |c: &mut Client| {
        if load.is_none() {
            for _ in 0..1000 {
                c.cmd(&["GET", "k"]).unwrap();
            }
            gets += 1000;
        } else {
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    seq(c);
    let eval = timed(c, &["EVAL", EVAL_SCRIPT, "0", EVAL_LOOPS]);
    seq(c);
    if let Some(l) = load {
        std::thread::sleep(Duration::from_millis(300));
        gets += l.finish();
    }
    // The INFO itself is read by the main thread: it is no I/O-thread read.
    Phase {
        eval,
        gets,
        threaded: threaded_reads(c) - before,
    }
}

/// A server whose I/O threads come on with the load (redis 7 from two clients in flight per
/// thread, valkey by the ready clients per loop) and, `off_again`, go off without it (redis
/// 7), attached once across the three phases: quiet, busy, quiet, each with an EVAL. Each EVAL is found and named
/// whichever mode the server was in; no wait for the I/O threads of the busy phase, nor a
/// quiet phase judged as if its I/O were threaded, is a slow command; every GET counted.
fn mode_switch(bin: &str, io_args: &[&str], busy: Busy, off_again: bool) {
    let _guard = common::serial();
    if !can_run(BPF) || !common::have("redis-benchmark", "--version") {
        return;
    }
    let Some(s) = Server::start(bin, io_args) else {
        return;
    };
    let mut c = s.client();
    c.cmd(&["SET", "k", "v"]).unwrap();
    let a = common::Attach::start(
        "bpf",
        s.child.id(),
        &["--threshold", "2ms", "--format", "json"],
    );
    assert!(a.attached, "attach: {:?}", a.stderr);
    let phases = [
        phase(&s, &mut c, None),
        phase(&s, &mut c, Some(busy)),
        phase(&s, &mut c, None),
    ];
    // SAFETY: SIGINT to the stallscope this test started: it detaches and reports.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (code, out, err) = a.finish(DEADLINE);
    assert!(matches!(code, Some(0 | 1)), "exit {code:?}: {err:?}");
    drop(s);
    let r = &common::json(&out);
    let threaded: Vec<u64> = phases.iter().map(|p| p.threaded).collect();
    eprintln!("{bin}: I/O-thread reads per phase {threaded:?}");
    // The switch happened: off, on, and (redis) off again. valkey keeps them on after a load
    // (the single client's 2000 reads of the third phase all threaded, measured here).
    assert!(
        threaded[0] == 0 && threaded[1] > 0 && (threaded[2] == 0 || !off_again),
        "{bin}: the I/O threads' reads per phase {threaded:?} (the test would prove nothing)"
    );
    for (i, p) in phases.iter().enumerate() {
        let found = stalls(r).iter().any(|s| {
            s["thread"] == "main"
                && s["kind"] == "gap"
                && s["duration_us"].as_i64().unwrap() >= 200_000
                && overlaps(span(s), p.eval)
                && (s["finding"] == "command" || s["finding"] == "cpu-starvation")
                && s["cause"].as_str().unwrap().contains("EVAL")
        });
        assert!(
            found,
            "{bin}: phase {i}'s EVAL not found and named: {:?}",
            stalls(r)
        );
    }
    let sent: u64 = phases.iter().map(|p| p.gets).sum();
    if busy.pipeline == 1 {
        assert_eq!(calls_of(r, "GET"), sent, "{bin}: every GET counted");
    } else {
        // Pipelined reads are named by their first request only (docs/BACKENDS.md): the
        // quiet phases' GETs all, the busy phase's at least one per read.
        let quiet = phases[0].gets + phases[2].gets;
        let got = calls_of(r, "GET");
        assert!(
            got > quiet && got <= sent,
            "{bin}: GETs counted {got}, sent {sent} ({quiet} one at a time)"
        );
    }
    let evals: Vec<(f64, f64)> = phases.iter().map(|p| p.eval).collect();
    assert_few_false_commands(bin, r, &evals, &["EVAL"]);
}

#[test]
fn redis7_io_threads_on_and_off() {
    mode_switch("redis-server", REDIS7_IO, PLAIN, true);
}

#[test]
fn valkey9_io_threads_on_and_off() {
    // Without `--io-threads-always-active` valkey turns them on when one turn of its event
    // loop has enough ready clients (`events-per-io-thread`), which a plain GET load does
    // not give it on this 2-vCPU host (50 to 500 clients, quiet), and a pipelined one does.
    let busy = Busy {
        clients: 50,
        pipeline: 8,
    };
    mode_switch("valkey-server", &["--io-threads", "2"], busy, false);
}
