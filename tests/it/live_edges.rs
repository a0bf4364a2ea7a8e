//! The edges of a live trace (issue 7), against a real redis-server whose data directory and
//! log file are on `scripts/slowfs.py`, the project's FUSE passthrough whose delays are set
//! while it runs: stallscope attaches while redis's main thread is held in an fdatasync of
//! the AOF, and is stopped while the same thread is held in a close() of the log file. Both
//! calls must be in the report as lower bounds, one in flight at the start and one at the
//! end, and redis must come out unharmed. The calls are held until the test releases them,
//! so nothing depends on how fast a loaded machine is; slowfs's log of every delay (which
//! thread, when it began and ended) and the test's own observations bound the durations.
//! The same disk also reproduces an incident at its real size: `appendfsync everysec` with a
//! 2.5 s fdatasync, where the main thread's AOF write() waits behind the background fsync.
//!
//! Each test runs with the ptrace and the bpf backends (`<test>::ptrace`, `<test>::bpf`).
//! Live tests run one at a time, across test binaries too (a file lock). Without
//! redis-server, python3 with fusepy, or FUSE the test is skipped, except under CI=true
//! where that is a failure.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::{ci, json, serial, Attach, Client, Redis};

/// What the test needs, or why it cannot run (a failure under CI=true).
pub(crate) fn missing() -> Option<String> {
    let ok = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ok("redis-server", &["--version"]) {
        return Some("redis-server not installed".into());
    }
    if !ok("fusermount", &["-V"]) {
        return Some("fusermount not installed (apt-get install fuse libfuse2)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse does not exist".into());
    }
    if !ok("python3", &["-c", "import fuse"]) {
        return Some("python3 cannot import fuse (pip install fusepy; libfuse2)".into());
    }
    None
}

fn can_run(backend: &str) -> bool {
    if backend == "bpf" && unsafe { libc::geteuid() } != 0 {
        if ci() {
            panic!("the bpf backend's tests need root under CI=true");
        }
        eprintln!("skipping: the bpf backend needs root");
        return false;
    }
    match missing() {
        None => true,
        Some(why) if ci() => panic!("required under CI=true: {why}"),
        Some(why) => {
            eprintln!("skipping: {why}");
            false
        }
    }
}

fn slowfs_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slowfs.py")
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn is_mountpoint(p: &Path) -> bool {
    let want = p.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(&*want))
}

/// Long enough to mean "until the test releases it"; only a test that dies midway lets
/// one run out.
const HELD_MS: u64 = 120_000;

/// One delay slowfs injected: when it began and ended (epoch s; end None while it runs),
/// the operation, the file's base name, and the thread that waited.
#[derive(Debug)]
pub(crate) struct Delay {
    pub begin: f64,
    pub end: Option<f64>,
    pub op: String,
    pub base: String,
    pub tid: u32,
}

/// A slowfs mount, unmounted (and its daemon stopped by pid) when dropped, even when the
/// test failed.
pub(crate) struct SlowFs {
    daemon: Child,
    pub mnt: PathBuf,
    control: PathBuf,
    log: PathBuf,
}

impl SlowFs {
    pub(crate) fn mount(dir: &Path) -> SlowFs {
        let back = dir.join("back");
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&back).expect("mkdir back");
        std::fs::create_dir_all(&mnt).expect("mkdir mnt");
        let control = dir.join("slowfs.sock");
        let log = dir.join("delays.tsv");
        let out = std::fs::File::create(dir.join("slowfs.out")).expect("slowfs.out");
        let daemon = Command::new("python3")
            .arg(slowfs_script())
            .arg(&back)
            .arg(&mnt)
            .arg("--control")
            .arg(&control)
            .arg("--log")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start slowfs");
        let mut fs = SlowFs {
            daemon,
            mnt,
            control,
            log,
        };
        let start = Instant::now();
        while !is_mountpoint(&fs.mnt) {
            let exited = fs.daemon.try_wait().ok().flatten().is_some();
            assert!(
                !exited && start.elapsed() < Duration::from_secs(30),
                "slowfs did not mount: {}",
                std::fs::read_to_string(dir.join("slowfs.out")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        fs
    }

    /// Sends a rule set; returns once slowfs has it in force (it answers after the swap).
    pub(crate) fn send(&self, req: &str) {
        let mut s = UnixStream::connect(&self.control).expect("connect to slowfs's control socket");
        s.set_read_timeout(Some(Duration::from_secs(30))).ok();
        writeln!(s, "{req}").expect("send rules");
        let mut ans = String::new();
        BufReader::new(&s)
            .read_line(&mut ans)
            .expect("slowfs's answer");
        assert!(ans.contains(r#""ok": true"#), "slowfs refused {req}: {ans}");
    }

    /// Holds every `op` on files matching `glob` until `release`.
    fn hold(&self, op: &str, glob: &str) {
        self.send(&format!(
            r#"{{"rules": [{{"op": "{op}", "match": "{glob}", "ms": {HELD_MS}}}]}}"#
        ));
    }

    /// No more delays, and the ones running end now.
    fn release(&self) {
        self.send(r#"{"rules": [], "release": true}"#);
    }

    /// slowfs's log, begin and end rows joined.
    pub(crate) fn delays(&self) -> Vec<Delay> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut v: Vec<(u64, Delay)> = vec![];
        for l in text.lines().skip(1) {
            let f: Vec<&str> = l.splitn(7, '\t').collect();
            let (Some(seq), Some(at)) = (
                f.first().and_then(|x| x.parse::<u64>().ok()),
                f.get(2).and_then(|x| x.parse::<f64>().ok()),
            ) else {
                continue;
            };
            match f.get(1) {
                Some(&"begin") if f.len() == 7 => v.push((
                    seq,
                    Delay {
                        begin: at,
                        end: None,
                        op: f[3].to_string(),
                        base: f[6].rsplit('/').next().unwrap_or("").to_string(),
                        tid: f[4].parse().unwrap_or(0),
                    },
                )),
                Some(&"end") => {
                    if let Some((_, d)) = v.iter_mut().find(|(s, _)| *s == seq) {
                        d.end = Some(at);
                    }
                }
                _ => {}
            }
        }
        v.into_iter().map(|(_, d)| d).collect()
    }

    /// The last delay of `op` on `base` that thread `tid` waited in, waiting up to `limit`
    /// for it to be logged (its begin row comes a moment after the syscall's entry).
    fn last_delay(
        &self,
        op: &str,
        base: &dyn Fn(&str) -> bool,
        tid: u32,
        limit: Duration,
    ) -> Delay {
        let start = Instant::now();
        loop {
            let mut all = self.delays();
            if let Some(i) = all
                .iter()
                .rposition(|d| d.op == op && base(&d.base) && d.tid == tid)
            {
                return all.swap_remove(i);
            }
            assert!(
                start.elapsed() < limit,
                "no {op} delay of thread {tid} in slowfs's log: {all:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for SlowFs {
    fn drop(&mut self) {
        // Whatever the test left held would keep redis (and the unmount) waiting.
        if let Ok(mut s) = UnixStream::connect(&self.control) {
            let _ = writeln!(s, r#"{{"rules": [], "release": true}}"#);
            let mut ans = String::new();
            s.set_read_timeout(Some(Duration::from_secs(5))).ok();
            let _ = BufReader::new(&s).read_line(&mut ans);
        }
        let mut unmounted = false;
        for _ in 0..50 {
            let ok = Command::new("fusermount")
                .arg("-u")
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok || !is_mountpoint(&self.mnt) {
                unmounted = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if !unmounted {
            // Still busy (a process holds a file): detach it from the tree lazily.
            let _ = Command::new("fusermount")
                .arg("-uz")
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status();
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.daemon.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: a signal to the daemon this harness started and has not reaped.
        unsafe { libc::kill(self.daemon.id() as i32, libc::SIGTERM) };
        let _ = self.daemon.wait();
    }
}

/// `stallscope attach` with `backend`: ptrace (a stopped thread's registers at attach, the
/// detach of a thread blocked in a call) and bpf (the kernel's in-flight map, /proc for a
/// call that began before the attach) each have their own way to these edges.
fn attach(backend: &str, pid: u32, extra: &[&str]) -> Attach {
    let a = Attach::start(backend, pid, extra);
    assert!(a.attached, "stallscope did not attach: {:?}", a.stderr);
    a
}

const SYS_CLOSE: i64 = 3;
const SYS_FDATASYNC: i64 = 75;

/// How long a held call goes on once the moment under test (the attach, the stop) has come:
/// the incident's size, over the 200 ms threshold, not a margin for a slow machine.
const HOLD: Duration = Duration::from_millis(1000);

/// Generous deadlines for what a loaded machine may make slow (polling, never asserted on).
const LONG: Duration = Duration::from_secs(60);

/// The µs a duration can lose to the recording's rounding and the two clocks compared.
const CLOCK_SLOP_US: i64 = 2_000;

/// The stalls and in-flight calls of a report, whichever list they are in.
fn edge_calls<'a>(r: &'a serde_json::Value, which: &str) -> Vec<&'a serde_json::Value> {
    ["stalls", "in_flight"]
        .iter()
        .flat_map(|k| r[*k].as_array().into_iter().flatten())
        .filter(|s| s["in_flight"] == which)
        .collect()
}

/// A slowfs mount and a redis-server on it (AOF with this `appendfsync`, log file on the
/// mount), its first AOF written.
fn redis_on_slowfs(tmp: &Path, appendfsync: &str) -> (SlowFs, Redis) {
    let fs = SlowFs::mount(tmp);
    let data = fs.mnt.to_string_lossy().into_owned();
    let log = fs.mnt.join("redis.log").to_string_lossy().into_owned();
    let redis = Redis::start_in(
        tmp,
        &[
            "--dir",
            &data,
            "--logfile",
            &log,
            "--appendonly",
            "yes",
            "--appendfsync",
            appendfsync,
        ],
    );
    redis.wait_no_rewrite();
    (fs, redis)
}

/// Holds the AOF's fdatasync, sends a SET (its reply waits for the fsync), and returns once
/// the main thread is blocked in that fdatasync; the thread returns the reply.
fn block_in_aof_fsync(
    fs: &SlowFs,
    redis: &Redis,
) -> std::thread::JoinHandle<std::io::Result<String>> {
    fs.hold("fsync", "*.aof");
    let port = redis.port;
    let set = std::thread::spawn(move || {
        Client::connect(port, LONG)
            .and_then(|mut c| c.cmd(&["SET", "k", "v"]))
            .map(|r| r.text())
    });
    assert!(
        redis.wait_main_in(SYS_FDATASYNC, LONG),
        "redis's main thread never blocked in fdatasync (in {:?})",
        redis.main_syscall()
    );
    set
}

/// µs between two epoch times.
fn us(from: f64, to: f64) -> i64 {
    ((to - from) * 1e6) as i64
}

#[cfg(target_arch = "x86_64")]
mod calls_in_flight_at_attach_and_at_detach_are_reported_as_lower_bounds {
    #[test]
    fn ptrace() {
        let _g = super::serial();
        if super::can_run("ptrace") {
            super::calls_in_flight_at_attach_and_at_detach_are_reported_as_lower_bounds("ptrace");
        }
    }
    #[test]
    fn bpf() {
        let _g = super::serial();
        if super::can_run("bpf") {
            super::calls_in_flight_at_attach_and_at_detach_are_reported_as_lower_bounds("bpf");
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn calls_in_flight_at_attach_and_at_detach_are_reported_as_lower_bounds(backend: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (fs, redis) = redis_on_slowfs(tmp.path(), "always");
    let (pid, port) = (redis.pid(), redis.port);

    // 1. The main thread is held in fdatasync of the AOF (appendfsync always: the SET's
    //    reply waits for it) when stallscope attaches; HOLD after the attach it is let go.
    let set = block_in_aof_fsync(&fs, &redis);
    let attach_started = epoch_now();
    let mut a = attach(backend, pid, &["--threshold", "200ms", "--format", "json"]);
    let attach_seen = epoch_now();
    if backend == "ptrace" {
        assert_ne!(redis.tracer_pid(), 0, "traced while attached");
    }
    assert_eq!(
        redis.main_syscall(),
        Some(SYS_FDATASYNC),
        "the fdatasync is held until the test lets it go"
    );
    std::thread::sleep(HOLD);
    let released_at = epoch_now();
    fs.release();
    let set_reply = set.join().expect("SET thread");
    let set_answered = epoch_now();
    assert_eq!(set_reply.as_deref().ok(), Some("+OK"), "{set_reply:?}");
    assert!(
        a.wait_line(|l| l.starts_with("stall:"), LONG),
        "the fdatasync that ended after the attach is printed live: {:?}",
        a.stderr
    );

    // 2. Every log line now blocks the main thread in close() of the log file; a SAVE logs
    //    one ("DB saved on disk") before its reply, so the SAVE waits for that close().
    //    stallscope is stopped HOLD into the close().
    fs.hold("flush", "redis.log");
    let save_sent = epoch_now();
    let save = std::thread::spawn(move || {
        Client::connect(port, LONG)
            .and_then(|mut c| c.cmd(&["SAVE"]))
            .map(|r| r.text())
    });
    assert!(
        redis.wait_main_in(SYS_CLOSE, LONG),
        "redis's main thread never blocked in close() of its log (in {:?})",
        redis.main_syscall()
    );
    let flush = fs.last_delay("flush", &|b| b == "redis.log", pid, LONG);
    let into = Duration::from_secs_f64((epoch_now() - flush.begin).max(0.0));
    std::thread::sleep(HOLD.saturating_sub(into));
    assert_eq!(
        redis.main_syscall(),
        Some(SYS_CLOSE),
        "the close() is held until the test lets it go"
    );
    let stop_at = epoch_now();
    // SAFETY: a signal to the stallscope this test started.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (code, out, stderr) = a.finish(LONG);
    let finished_at = epoch_now();
    assert_eq!(code, Some(1), "stalls were found; stderr: {stderr:?}");
    let r = json(&out);

    eprintln!(
        "stalls: {}\nin_flight: {}\nstderr: {stderr:?}",
        r["stalls"], r["in_flight"]
    );

    // Redis is unharmed: the close() ends once let go, the SAVE is answered, and redis
    // serves again (with a fast disk, so the log lines of its shutdown do not wait).
    fs.release();
    let save_reply = save.join().expect("SAVE thread");
    assert_eq!(save_reply.as_deref().ok(), Some("+OK"), "{save_reply:?}");
    redis.assert_unharmed();

    let at_start = edge_calls(&r, "at_start");
    let first = at_start
        .iter()
        .find(|s| s["syscall"] == "fdatasync")
        .unwrap_or_else(|| panic!("no fdatasync in flight at start: {at_start:?}"));
    assert_eq!(first["bound"], "at_least", "{first}");
    assert_eq!(first["class"], "aof", "{first}");
    assert_eq!(first["thread"], "main", "{first}");
    assert_eq!(first["kind"], "slow_syscall", "{first}");
    // Known from the attach to its return: the attach was over by `attach_seen` and the
    // call returned after the release; it began after `attach_started` and the call
    // returned before the SET's reply.
    let d1 = first["duration_us"].as_i64().unwrap_or(0);
    let (lo, hi) = (
        us(attach_seen, released_at),
        us(attach_started, set_answered),
    );
    assert!(
        d1 >= lo - CLOCK_SLOP_US && d1 <= hi + CLOCK_SLOP_US,
        "fdatasync known part {d1} us, not within [{lo}, {hi}]: {first}"
    );
    assert!(
        r["stalls"]
            .as_array()
            .is_some_and(|v| v.iter().any(|s| std::ptr::eq(s, *first))),
        "over the threshold, it is a stall: {first}"
    );
    // slowfs's record of it: the main thread's, and over by now.
    let fsync = fs.last_delay("fsync", &|b| b.ends_with(".aof"), pid, LONG);
    assert!(fsync.end.is_some(), "{fsync:?}");

    let at_end = edge_calls(&r, "at_end");
    let last = at_end
        .iter()
        .find(|s| s["syscall"] == "close")
        .unwrap_or_else(|| panic!("no close() in flight at end: {at_end:?}"));
    assert_eq!(last["bound"], "at_least", "{last}");
    assert_eq!(last["class"], "log", "{last}");
    assert_eq!(last["thread"], "main", "{last}");
    assert!(
        last["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("redis.log")),
        "{last}"
    );
    // Known from its start to the detach: it began before slowfs logged its delay and the
    // detach came after the SIGINT; it began after the SAVE was sent and the detach before
    // stallscope exited.
    let d2 = last["duration_us"].as_i64().unwrap_or(0);
    let (lo, hi) = (us(flush.begin, stop_at), us(save_sent, finished_at));
    assert!(
        d2 >= lo - CLOCK_SLOP_US && d2 <= hi + CLOCK_SLOP_US,
        "close() known part {d2} us, not within [{lo}, {hi}]: {last}"
    );
    // Who waited: the SAVE, read before the close() began and not answered by the detach.
    assert_eq!(last["waiting_by_command"]["SAVE"], 1, "{last}");
    assert!(
        last["waiting_clients"].as_u64() >= Some(1) && last["worst_wait_us"].as_i64() >= Some(d2),
        "{last}"
    );
    assert!(
        r["summary"]["in_flight_at_start"].as_u64() >= Some(1)
            && r["summary"]["in_flight_at_end"].as_u64() >= Some(1),
        "{}",
        r["summary"]
    );
}

/// The worst case of both edges at once: stallscope attaches during a call and is stopped
/// before that call ends, so the thread never stops while traced. The call is still
/// reported, known for the whole trace, rather than being silently missed.
#[cfg(target_arch = "x86_64")]
mod a_call_blocked_for_the_whole_trace_is_reported {
    #[test]
    fn ptrace() {
        let _g = super::serial();
        if super::can_run("ptrace") {
            super::a_call_blocked_for_the_whole_trace_is_reported("ptrace");
        }
    }
    #[test]
    fn bpf() {
        let _g = super::serial();
        if super::can_run("bpf") {
            super::a_call_blocked_for_the_whole_trace_is_reported("bpf");
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn a_call_blocked_for_the_whole_trace_is_reported(backend: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (fs, redis) = redis_on_slowfs(tmp.path(), "always");
    let set = block_in_aof_fsync(&fs, &redis);
    let attach_started = epoch_now();
    let a = attach(
        backend,
        redis.pid(),
        &["--threshold", "200ms", "--format", "json"],
    );
    let attach_seen = epoch_now();
    std::thread::sleep(HOLD);
    assert_eq!(
        redis.main_syscall(),
        Some(SYS_FDATASYNC),
        "the fdatasync is held until the test lets it go"
    );
    let stop_at = epoch_now();
    // SAFETY: a signal to the stallscope this test started.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (code, out, stderr) = a.finish(LONG);
    let finished_at = epoch_now();
    assert_eq!(code, Some(1), "a stall was found; stderr: {stderr:?}");
    let r = json(&out);
    fs.release();
    let reply = set.join().expect("SET thread");
    assert_eq!(reply.as_deref().ok(), Some("+OK"), "{reply:?}");
    redis.assert_unharmed();

    let stall = r["stalls"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["syscall"] == "fdatasync")
        .unwrap_or_else(|| panic!("no fdatasync stall: {}", r["stalls"]));
    assert_eq!(stall["bound"], "at_least", "{stall}");
    assert_eq!(stall["in_flight"], "at_end", "{stall}");
    assert_eq!(stall["class"], "aof", "{stall}");
    assert_eq!(stall["thread"], "main", "{stall}");
    assert_eq!(stall["at_us"], 0, "known from the attach: {stall}");
    // Known from the attach to the detach.
    let d = stall["duration_us"].as_i64().unwrap_or(0);
    let (lo, hi) = (us(attach_seen, stop_at), us(attach_started, finished_at));
    assert!(
        d >= lo - CLOCK_SLOP_US && d <= hi + CLOCK_SLOP_US,
        "known from the attach to the stop: {d} us, not within [{lo}, {hi}]: {stall}"
    );
}

/// Incident 5 at its real size: `appendfsync everysec` with an AOF whose fdatasync takes
/// 2.5 s. Redis postpones its AOF write for up to 2 s while the background fsync runs, then
/// writes anyway, and that write() waits for the fsync: the main thread stalls about half a
/// second per fsync. stallscope, attached live, must name that cause on the main thread's
/// write (not just the background fsync, which blocks no client by itself).
#[cfg(target_arch = "x86_64")]
mod everysec_on_a_slow_disk_is_a_write_pending_fsync {
    #[test]
    fn ptrace() {
        let _g = super::serial();
        if super::can_run("ptrace") {
            super::everysec_on_a_slow_disk_is_a_write_pending_fsync("ptrace");
        }
    }
    #[test]
    fn bpf() {
        let _g = super::serial();
        if super::can_run("bpf") {
            super::everysec_on_a_slow_disk_is_a_write_pending_fsync("bpf");
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn everysec_on_a_slow_disk_is_a_write_pending_fsync(backend: &str) {
    const SLOW_FSYNC_MS: u64 = 2500;
    let tmp = tempfile::tempdir().expect("tempdir");
    let (fs, redis) = redis_on_slowfs(tmp.path(), "everysec");
    let (pid, port) = (redis.pid(), redis.port);
    fs.send(&format!(
        r#"{{"rules": [{{"op": "fsync", "match": "*.aof", "ms": {SLOW_FSYNC_MS}}}]}}"#
    ));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || -> std::io::Result<u64> {
            let mut c = Client::connect(port, LONG)?;
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.cmd(&["SET", "k", "v"])?;
                n += 1;
            }
            Ok(n)
        })
    };
    let a = attach(
        backend,
        pid,
        &[
            "--threshold",
            "100ms",
            "--duration",
            "7s",
            "--format",
            "json",
        ],
    );
    let (code, out, stderr) = a.finish(LONG);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sets = load.join().expect("load thread");
    assert!(sets.as_ref().is_ok_and(|n| *n > 100), "{sets:?}");
    fs.release();
    redis.assert_unharmed();
    assert_eq!(code, Some(1), "stalls were found; stderr: {stderr:?}");
    let r = json(&out);

    let stalls = r["stalls"].as_array().expect("stalls");
    let ids: Vec<&str> = r["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["id"].as_str())
        .collect();
    assert!(ids.contains(&"aof-write-pending-fsync"), "{ids:?}");
    // The background thread's fdatasync, as long as slowfs made it: at least the delay,
    // and less than two of them (the thread fsyncs one call after the other).
    let fsyncs: Vec<&serde_json::Value> = stalls
        .iter()
        .filter(|s| {
            s["thread"] == "bio_aof" && s["syscall"] == "fdatasync" && s["in_flight"].is_null()
        })
        .collect();
    assert!(!fsyncs.is_empty(), "no bio_aof fdatasync stall: {stalls:?}");
    for f in &fsyncs {
        assert_eq!(f["class"], "aof", "{f}");
        let fd = f["duration_us"].as_i64().unwrap_or(0);
        assert!(
            fd >= SLOW_FSYNC_MS as i64 * 1000 && fd < 2 * SLOW_FSYNC_MS as i64 * 1000,
            "fdatasync {fd} µs for a {SLOW_FSYNC_MS} ms delay: {f}"
        );
    }
    let longest_fsync = fsyncs
        .iter()
        .filter_map(|f| f["duration_us"].as_i64())
        .max()
        .unwrap_or(0);
    let injected = fs
        .delays()
        .iter()
        .filter(|x| x.op == "fsync" && x.base.ends_with(".aof") && x.tid != pid)
        .count();
    assert!(injected >= 1, "slowfs injected no fsync delay");
    // The main thread's write() to the AOF, held until the fsync let go of the file: over
    // the threshold, and no longer than the fsync it waited behind.
    let write = stalls
        .iter()
        .find(|s| s["finding"] == "aof-write-pending-fsync" && s["in_flight"].is_null())
        .unwrap_or_else(|| panic!("no pending-fsync stall: {stalls:?}"));
    assert_eq!(write["thread"], "main", "{write}");
    assert_eq!(write["syscall"], "write", "{write}");
    assert_eq!(write["class"], "aof", "{write}");
    let d = write["duration_us"].as_i64().unwrap_or(0);
    assert!(
        (100_000..=longest_fsync).contains(&d),
        "write held {d} µs, fdatasyncs up to {longest_fsync} µs: {write}"
    );
    assert!(write["waiting_commands"].as_u64() >= Some(1), "{write}");
}
