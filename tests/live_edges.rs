//! The edges of a live trace (issue 7), against a real redis-server whose data directory and
//! log file are on `../shared/slowfs`, a FUSE filesystem whose latencies are switched at run
//! time: stallscope attaches while redis's main thread is blocked in a multi-second
//! fdatasync of the AOF, and is stopped while the same thread is blocked in a multi-second
//! close() of the log file. Both calls must be in the report as lower bounds, one in flight
//! at the start and one at the end, and redis must come out unharmed. slowfs's own record of
//! every delay it injected (delays.csv) is the ground truth the durations are checked against.
//! The same disk also reproduces an incident at its real size: `appendfsync everysec` with a
//! 2.5 s fdatasync, where the main thread's AOF write() waits behind the background fsync.
//!
//! Each test runs with the ptrace and the bpf backends (`<test>::ptrace`, `<test>::bpf`).
//! Live tests run one at a time, across test binaries too (a file lock). Without
//! redis-server, python3 with fusepy, or FUSE the test is skipped, except under CI=true
//! where that is a failure.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;
use common::{ci, json, serial, Attach, Client, Redis};

/// What the test needs, or why it cannot run (a failure under CI=true).
fn missing() -> Option<String> {
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
    if !slowfs_script().is_file() {
        return Some(format!("{} not found", slowfs_script().display()));
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
    let shared = std::env::var_os("STALLSCOPE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    shared.join("slowfs/slowfs.py")
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

/// A slowfs mount, unmounted (and its daemon stopped by pid) when dropped, even when the
/// test failed.
struct SlowFs {
    daemon: Child,
    mnt: PathBuf,
    ctl: PathBuf,
    delays: PathBuf,
    events: PathBuf,
}

impl SlowFs {
    fn mount(dir: &Path) -> SlowFs {
        let back = dir.join("back");
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&back).expect("mkdir back");
        std::fs::create_dir_all(&mnt).expect("mkdir mnt");
        let ctl = dir.join("ctl.json");
        std::fs::write(&ctl, r#"{"rules": []}"#).expect("write ctl.json");
        let delays = dir.join("delays.csv");
        let events = dir.join("events.txt");
        let out = std::fs::File::create(dir.join("slowfs.out")).expect("slowfs.out");
        let daemon = Command::new("python3")
            .arg(slowfs_script())
            .arg(&back)
            .arg(&mnt)
            .arg("--ctl")
            .arg(&ctl)
            .arg("--log")
            .arg(&delays)
            .arg("--events")
            .arg(&events)
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start slowfs");
        let fs = SlowFs {
            daemon,
            mnt,
            ctl,
            delays,
            events,
        };
        let start = Instant::now();
        while !is_mountpoint(&fs.mnt) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "slowfs did not mount: {}",
                std::fs::read_to_string(dir.join("slowfs.out")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        fs
    }

    fn loads(&self) -> usize {
        std::fs::read_to_string(&self.events)
            .unwrap_or_default()
            .matches("ctl loaded")
            .count()
    }

    /// Replaces the rules, and waits until slowfs has read them.
    fn set_rules(&self, json: &str) {
        let before = self.loads();
        std::fs::write(&self.ctl, json).expect("write ctl.json");
        let start = Instant::now();
        while self.loads() == before {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "slowfs did not reload {json}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Rows of delays.csv: (start_epoch, end_epoch, op, base name, tid, delay_ms).
    fn delays(&self) -> Vec<(f64, f64, String, String, u32, f64)> {
        let text = std::fs::read_to_string(&self.delays).unwrap_or_default();
        text.lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                if f.len() < 6 {
                    return None;
                }
                let base = f[3].rsplit('/').next().unwrap_or("").to_string();
                Some((
                    f[0].parse().ok()?,
                    f[1].parse().ok()?,
                    f[2].to_string(),
                    base,
                    f[4].parse().ok()?,
                    f[5].parse().ok()?,
                ))
            })
            .collect()
    }
}

impl Drop for SlowFs {
    fn drop(&mut self) {
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
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.daemon.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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

/// How long slowfs holds the AOF's fdatasync, and then the log file's close().
const FSYNC_MS: u64 = 3000;
const FLUSH_MS: u64 = 4000;

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

/// Makes the AOF's fdatasync take `ms`, sends a SET (its reply waits for the fsync), and
/// returns once the main thread is blocked in that fdatasync; the thread returns the reply.
fn block_in_aof_fsync(
    fs: &SlowFs,
    redis: &Redis,
    ms: u64,
) -> std::thread::JoinHandle<std::io::Result<String>> {
    fs.set_rules(&format!(
        r#"{{"rules": [{{"op": "fsync", "match": "*.aof", "ms": {ms}}}]}}"#
    ));
    let port = redis.port;
    let set = std::thread::spawn(move || {
        Client::connect(port, Duration::from_secs(20))
            .and_then(|mut c| c.cmd(&["SET", "k", "v"]))
            .map(|r| r.text())
    });
    assert!(
        redis.wait_main_in(SYS_FDATASYNC, Duration::from_secs(3)),
        "redis's main thread never blocked in fdatasync (in {:?})",
        redis.main_syscall()
    );
    set
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

    // 1. The main thread is blocked in fdatasync of the AOF (appendfsync always: the SET's
    //    reply waits for it) when stallscope attaches.
    let set = block_in_aof_fsync(&fs, &redis, FSYNC_MS);
    let attach_started = epoch_now();
    let mut a = attach(backend, pid, &["--threshold", "200ms", "--format", "json"]);
    if backend == "ptrace" {
        assert_ne!(redis.tracer_pid(), 0, "traced while attached");
    }
    assert_eq!(
        redis.main_syscall(),
        Some(SYS_FDATASYNC),
        "the fdatasync was still running when the attach completed (make FSYNC_MS longer)"
    );
    let set_reply = set.join().expect("SET thread");
    assert_eq!(set_reply.as_deref().ok(), Some("+OK"), "{set_reply:?}");
    assert!(
        a.wait_line(|l| l.starts_with("stall:"), Duration::from_secs(5)),
        "the fdatasync that ended after the attach is printed live: {:?}",
        a.stderr
    );

    // 2. Every log line now blocks the main thread in close() of the log file; a SAVE logs
    //    one ("DB saved on disk") before its reply, so the SAVE waits for that close().
    //    stallscope is stopped while the close() runs.
    fs.set_rules(&format!(
        r#"{{"rules": [{{"op": "flush", "match": "redis.log", "ms": {FLUSH_MS}}}]}}"#
    ));
    let save = std::thread::spawn(move || {
        Client::connect(port, Duration::from_secs(20))
            .and_then(|mut c| c.cmd(&["SAVE"]))
            .map(|r| r.text())
    });
    assert!(
        redis.wait_main_in(SYS_CLOSE, Duration::from_secs(3)),
        "redis's main thread never blocked in close() of its log (in {:?})",
        redis.main_syscall()
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        redis.main_syscall(),
        Some(SYS_CLOSE),
        "still in close() when stallscope is stopped"
    );
    let stop_at = epoch_now();
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (code, out, stderr) = a.finish(Duration::from_secs(15));
    assert_eq!(code, Some(1), "stalls were found; stderr: {stderr:?}");
    let r = json(&out);

    eprintln!(
        "stalls: {}\nin_flight: {}\nstderr: {stderr:?}",
        r["stalls"], r["in_flight"]
    );

    // Redis is unharmed: the close() ends when slowfs lets it, the SAVE is answered, and
    // redis serves again (with a fast disk, so the log lines of its shutdown do not wait).
    fs.set_rules(r#"{"rules": []}"#);
    let save_reply = save.join().expect("SAVE thread");
    assert_eq!(save_reply.as_deref().ok(), Some("+OK"), "{save_reply:?}");
    redis.assert_unharmed(Duration::from_secs(2));

    // Ground truth: slowfs's record of the two delays it injected into the main thread.
    let delays = fs.delays();
    let truth = |op: &str, base: &dyn Fn(&str) -> bool| {
        delays
            .iter()
            .filter(|d| d.2 == op && base(&d.3) && d.4 == pid && d.5 > 0.0)
            .map(|d| (d.0, d.1))
            .next_back()
            .unwrap_or_else(|| panic!("no {op} delay of thread {pid} in delays.csv: {delays:?}"))
    };
    let (fsync_start, fsync_end) = truth("fsync", &|b| b.ends_with(".aof"));
    let (flush_start, _) = truth("flush", &|b| b == "redis.log");

    let at_start = edge_calls(&r, "at_start");
    let first = at_start
        .iter()
        .find(|s| s["syscall"] == "fdatasync")
        .unwrap_or_else(|| panic!("no fdatasync in flight at start: {at_start:?}"));
    assert_eq!(first["bound"], "at_least", "{first}");
    assert_eq!(first["class"], "aof", "{first}");
    assert_eq!(first["thread"], "main", "{first}");
    assert_eq!(first["kind"], "slow_syscall", "{first}");
    let d1 = first["duration_us"].as_i64().unwrap_or(0);
    // Known from the attach to its end: less than the whole call, more than what was left
    // of it once stallscope was started (minus the time attaching takes).
    let whole = ((fsync_end - fsync_start) * 1e6) as i64;
    let left = ((fsync_end - attach_started) * 1e6) as i64;
    assert!(
        d1 <= whole && d1 >= left - 1_000_000 && d1 >= 1_000_000,
        "fdatasync known part {d1} us; whole call {whole} us, {left} us left at attach: {first}"
    );
    assert!(
        r["stalls"]
            .as_array()
            .is_some_and(|v| v.iter().any(|s| std::ptr::eq(s, *first))),
        "over the threshold, it is a stall: {first}"
    );

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
    let d2 = last["duration_us"].as_i64().unwrap_or(0);
    // Known from its start to the detach: at least the half second waited before SIGINT,
    // at most the whole delay, and the stop came well before the call could end.
    let to_stop = ((stop_at - flush_start) * 1e6) as i64;
    assert!(
        d2 >= 400_000 && d2 < (FLUSH_MS as i64) * 1000 && d2 <= to_stop + 1_500_000,
        "close() known part {d2} us; {to_stop} us from its start to the SIGINT: {last}"
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
    let set = block_in_aof_fsync(&fs, &redis, FSYNC_MS);
    let a = attach(
        backend,
        redis.pid(),
        &["--threshold", "200ms", "--format", "json"],
    );
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        redis.main_syscall(),
        Some(SYS_FDATASYNC),
        "still in the fdatasync when stallscope is stopped (make FSYNC_MS longer)"
    );
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (code, out, stderr) = a.finish(Duration::from_secs(15));
    assert_eq!(code, Some(1), "a stall was found; stderr: {stderr:?}");
    let r = json(&out);
    fs.set_rules(r#"{"rules": []}"#);
    let reply = set.join().expect("SET thread");
    assert_eq!(reply.as_deref().ok(), Some("+OK"), "{reply:?}");
    redis.assert_unharmed(Duration::from_secs(2));

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
    let d = stall["duration_us"].as_i64().unwrap_or(0);
    assert!(
        d >= 500_000 && d < (FSYNC_MS as i64) * 1000,
        "known from the attach to the stop (~600 ms): {d} us: {stall}"
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
    fs.set_rules(&format!(
        r#"{{"rules": [{{"op": "fsync", "match": "*.aof", "ms": {SLOW_FSYNC_MS}}}]}}"#
    ));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || -> std::io::Result<u64> {
            let mut c = Client::connect(port, Duration::from_secs(20))?;
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
    let (code, out, stderr) = a.finish(Duration::from_secs(30));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sets = load.join().expect("load thread");
    assert!(sets.as_ref().is_ok_and(|n| *n > 100), "{sets:?}");
    fs.set_rules(r#"{"rules": []}"#);
    redis.assert_unharmed(Duration::from_secs(5));
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
    // The main thread's write() to the AOF, held until the fsync let go of the file.
    let write = stalls
        .iter()
        .find(|s| s["finding"] == "aof-write-pending-fsync" && s["in_flight"].is_null())
        .unwrap_or_else(|| panic!("no pending-fsync stall: {stalls:?}"));
    assert_eq!(write["thread"], "main", "{write}");
    assert_eq!(write["syscall"], "write", "{write}");
    assert_eq!(write["class"], "aof", "{write}");
    let d = write["duration_us"].as_i64().unwrap_or(0);
    assert!(
        (100_000..SLOW_FSYNC_MS as i64 * 1000).contains(&d),
        "write held {d} µs: {write}"
    );
    assert!(write["waiting_commands"].as_u64() >= Some(1), "{write}");
    // Its cause: the background thread's fdatasync, as long as slowfs made it.
    let fsync = stalls
        .iter()
        .find(|s| {
            s["thread"] == "bio_aof" && s["syscall"] == "fdatasync" && s["in_flight"].is_null()
        })
        .unwrap_or_else(|| panic!("no bio_aof fdatasync stall: {stalls:?}"));
    assert_eq!(fsync["class"], "aof", "{fsync}");
    let injected = fs
        .delays()
        .iter()
        .filter(|x| x.2 == "fsync" && x.3.ends_with(".aof") && x.4 != pid)
        .count();
    assert!(injected >= 1, "slowfs injected no fsync delay");
    let fd = fsync["duration_us"].as_i64().unwrap_or(0);
    assert!(
        fd >= SLOW_FSYNC_MS as i64 * 1000 && fd < SLOW_FSYNC_MS as i64 * 1000 + 500_000,
        "fdatasync {fd} µs for a {SLOW_FSYNC_MS} ms delay: {fsync}"
    );
}
