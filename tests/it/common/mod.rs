//! Harness shared by the live (ptrace/perf) integration tests: the lock that runs them one
//! at a time, a redis-server of the test's own, a small RESP client, and a running
//! `stallscope attach` whose stderr is read as it comes.

// Each test binary uses its own part of the harness.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

pub mod cgroup;
pub mod wire;

static SERIAL: Mutex<()> = Mutex::new(());

/// How long a live test waits for something that must happen (redis answering, stallscope
/// attaching or exiting): a deadline for a loaded machine, never a measurement.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Holds the right to trace: ptrace tests run one at a time within a test binary (the
/// mutex) and across test binaries and concurrent `cargo test` runs on the machine (an
/// flock, released when the file closes).
pub struct Serial {
    _m: std::sync::MutexGuard<'static, ()>,
    _f: Option<std::fs::File>,
}

pub fn serial() -> Serial {
    let m = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = std::env::temp_dir().join("stallscope-ptrace-tests.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok();
    if let Some(f) = &f {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on an fd this function owns for the guard's lifetime.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    }
    Serial { _m: m, _f: f }
}

/// Under CI=true a missing tool is a failure, not a skip.
pub fn ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Parses stallscope's JSON report.
pub fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// A tiny RESP client: enough for SET/EVAL/BGSAVE/SAVE/INFO/PING.
pub struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

// The payloads of errors and arrays are only read through Debug, in assertion messages.
#[derive(Debug)]
pub enum Reply {
    Simple(String),
    Err(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

impl Reply {
    /// The reply as one line, as redis-cli's raw output would start it (`+OK`, `:1`), or a
    /// bulk reply's payload.
    pub fn text(&self) -> String {
        match self {
            Reply::Simple(s) => format!("+{s}"),
            Reply::Err(s) => format!("-{s}"),
            Reply::Int(i) => format!(":{i}"),
            Reply::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            Reply::Bulk(None) => "$-1".into(),
            Reply::Array(v) => format!("{v:?}"),
        }
    }
}

impl Client {
    pub fn connect(port: u16, timeout: Duration) -> std::io::Result<Client> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(timeout))?;
        Ok(Client {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    pub fn cmd(&mut self, args: &[&str]) -> std::io::Result<Reply> {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.w.write_all(&b)?;
        self.read()
    }

    fn read(&mut self) -> std::io::Result<Reply> {
        let mut line = String::new();
        self.r.read_line(&mut line)?;
        let line = line.trim_end_matches("\r\n");
        let (t, rest) = line.split_at(1.min(line.len()));
        let bad = || {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad reply {line:?}"),
            )
        };
        Ok(match t {
            "+" => Reply::Simple(rest.to_string()),
            "-" => Reply::Err(rest.to_string()),
            ":" => Reply::Int(rest.parse().map_err(|_| bad())?),
            "$" => {
                let n: i64 = rest.parse().map_err(|_| bad())?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut b = vec![0; n as usize + 2];
                    self.r.read_exact(&mut b)?;
                    b.truncate(n as usize);
                    Reply::Bulk(Some(b))
                }
            }
            "*" => {
                let n: i64 = rest.parse().map_err(|_| bad())?;
                let mut v = vec![];
                for _ in 0..n.max(0) {
                    v.push(self.read()?);
                }
                Reply::Array(v)
            }
            _ => return Err(bad()),
        })
    }

    pub fn info_field(&mut self, section: &str, field: &str) -> Option<String> {
        let info = self.cmd(&["INFO", section]).ok()?.text();
        info.lines().find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_string())
        })
    }
}

/// A redis-server of the test's own on a free loopback port, stopped by pid at the end.
pub struct Redis {
    child: Child,
    pub port: u16,
    dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

impl Redis {
    /// In a temp dir of its own, logging to `redis.log` there, `extra` arguments added.
    pub fn start(extra: &[&str]) -> Redis {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_string_lossy().into_owned();
        let mut args = vec!["--dir", &dir, "--logfile", "redis.log"];
        args.extend_from_slice(extra);
        let mut r = Redis::start_in(tmp.path(), &args);
        r._tmp = Some(tmp);
        r
    }

    /// Run from `dir`, with exactly these arguments besides port, bind, save and daemonize.
    pub fn start_in(dir: &Path, args: &[&str]) -> Redis {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--daemonize", "no"])
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let r = Redis {
            child,
            port,
            dir: dir.to_path_buf(),
            _tmp: None,
        };
        if r.wait_serving(DEADLINE) {
            return r;
        }
        panic!("redis-server did not answer PING on port {port} within {DEADLINE:?}");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn client(&self) -> Client {
        Client::connect(self.port, DEADLINE).expect("connect to redis")
    }

    /// PING answered within `limit`.
    pub fn ping_within(&self, limit: Duration) -> bool {
        let port = self.port;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let ok = Client::connect(port, limit)
                .and_then(|mut c| c.cmd(&["PING"]))
                .is_ok_and(|r| r.text() == "+PONG");
            let _ = tx.send(ok);
        });
        rx.recv_timeout(limit + Duration::from_millis(100))
            .unwrap_or(false)
    }

    /// Redis serves again (answers PING before a generous deadline: how fast is not the
    /// question on a loaded machine) and nothing traces it any more.
    pub fn assert_unharmed(&self) {
        assert!(
            self.wait_serving(DEADLINE),
            "redis did not answer PING within {DEADLINE:?}"
        );
        assert_eq!(self.tracer_pid(), 0, "redis is still traced");
    }

    /// Polls PING until redis answers (true) or `limit` passes (false).
    pub fn wait_serving(&self, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            let left = limit.saturating_sub(start.elapsed());
            if self.ping_within(left.min(Duration::from_secs(5))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Who traces redis (0: nobody).
    pub fn tracer_pid(&self) -> u32 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(u32::MAX)
    }

    /// The syscall number the main thread is blocked in, if it is in one
    /// (/proc/PID/syscall: "running", "-1 ..." in user space, "NR args..." in a call).
    pub fn main_syscall(&self) -> Option<i64> {
        let s = std::fs::read_to_string(format!("/proc/{}/syscall", self.pid())).ok()?;
        s.split_whitespace().next()?.parse().ok()
    }

    /// Waits until the main thread is inside syscall `nr`.
    pub fn wait_main_in(&self, nr: i64, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.main_syscall() == Some(nr) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Waits for a background AOF rewrite (the one redis starts to create its first AOF)
    /// to be over, so no child runs during the test.
    pub fn wait_no_rewrite(&self) {
        let start = Instant::now();
        while start.elapsed() < DEADLINE {
            let busy = Client::connect(self.port, Duration::from_secs(5))
                .and_then(|mut c| c.cmd(&["INFO", "persistence"]))
                .map(|info| {
                    let info = info.text();
                    info.contains("aof_rewrite_in_progress:1")
                        || info.contains("aof_rewrite_scheduled:1")
                })
                .unwrap_or(true);
            if !busy {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis's initial AOF rewrite did not end");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        // SAFETY: a signal to the child this harness started and has not reaped.
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

/// A running `stallscope attach`, its stderr read line by line on a thread.
pub struct Attach {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub stderr: Vec<String>,
    /// It said "attached to" before the deadline.
    pub attached: bool,
}

impl Attach {
    pub fn start(backend: &str, pid: u32, extra: &[&str]) -> Attach {
        Attach::start_with_env(backend, pid, extra, &[])
    }

    /// `start`, with variables added to stallscope's environment (test switches).
    pub fn start_with_env(backend: &str, pid: u32, extra: &[&str], env: &[(&str, &str)]) -> Attach {
        let mut child = Command::new(env!("CARGO_BIN_EXE_stallscope"))
            .args(["attach", "--backend", backend, "--pid", &pid.to_string()])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start stallscope");
        let err = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut a = Attach {
            child,
            lines: rx,
            stderr: vec![],
            attached: false,
        };
        a.attached = a.wait_line(|l| l.contains("attached to"), DEADLINE);
        a
    }

    /// Reads stderr until a line satisfies `f` (true) or `limit` passes (false).
    pub fn wait_line(&mut self, f: impl Fn(&str) -> bool, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            match self.lines.recv_timeout(Duration::from_millis(20)) {
                Ok(l) => {
                    let hit = f(&l);
                    self.stderr.push(l);
                    if hit {
                        return true;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(_) => return false,
            }
        }
        false
    }

    /// Waits for the exit; returns (exit code, stdout, stderr lines).
    pub fn finish(mut self, limit: Duration) -> (Option<i32>, String, Vec<String>) {
        let mut out = self.child.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let start = Instant::now();
        let code = loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                break st.code();
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "stallscope attach did not exit within {limit:?}; stderr: {:?}",
                    self.stderr
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The rest of stderr, up to the end of the pipe (the reader thread then hangs up).
        let start = Instant::now();
        while let Ok(l) = self
            .lines
            .recv_timeout(DEADLINE.saturating_sub(start.elapsed()))
        {
            self.stderr.push(l);
        }
        let stdout = reader.join().unwrap_or_default();
        (code, stdout, std::mem::take(&mut self.stderr))
    }
}

impl Drop for Attach {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether `tool arg` runs; under CI=true a missing tool is a failure, not a skip.
pub fn have(tool: &str, arg: &str) -> bool {
    let ok = Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok && ci() {
        panic!("{tool} is required under CI=true (scripts/test-deps.sh installs it)");
    }
    if !ok {
        eprintln!("skipping: {tool} is not installed");
    }
    ok
}

/// Whether each of `tools` runs and answers `--version` (no skip or CI failure said: the
/// caller says what its experiment needs).
pub fn all_run(tools: &[&str]) -> bool {
    tools.iter().all(|t| {
        Command::new(t)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The thread ids of process `pid` (none once it is gone).
pub fn threads_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A `redis-benchmark` load on a redis, killed when dropped.
pub struct Benchmark(pub Child);

impl Benchmark {
    /// `redis-benchmark -p PORT` with `args` (split at spaces), its output discarded.
    pub fn start(port: u16, args: &str) -> Benchmark {
        let c = Command::new("redis-benchmark")
            .args(["-p", &port.to_string()])
            .args(args.split_whitespace())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-benchmark");
        Benchmark(c)
    }

    /// Waits for it to finish, at most `limit`.
    pub fn wait(&mut self, limit: Duration) {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Benchmark {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// SIGTERM, then SIGKILL if the child has not exited 10 s later.
pub fn stop_child(c: &mut Child) {
    // SAFETY: a signal to a child the caller started and has not reaped.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    if poll(Duration::from_secs(10), || c.try_wait().ok().flatten()).is_none() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Polls `f` until it gives Some or `limit` passes.
pub fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A plain HTTP/1.0 GET on loopback: (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf.split_once("\r\n\r\n").map(|x| x.1.to_string())?;
    Some((status, body))
}

/// Root and tracefs with the raw_syscalls tracepoints (what the live backends need): a
/// panic with `ci_msg` under CI=true when missing, else a skip said with `skip_msg`.
pub fn can_trace(ci_msg: &str, skip_msg: &str) -> bool {
    let ok = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|r| {
            std::path::Path::new(r)
                .join("events/raw_syscalls/sys_enter/id")
                .exists()
        })
        && unsafe { libc::geteuid() } == 0;
    if !ok && ci() {
        panic!("{ci_msg}");
    }
    if !ok {
        eprintln!("{skip_msg}");
    }
    ok
}
