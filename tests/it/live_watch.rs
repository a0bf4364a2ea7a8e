//! `stallscope watch` against a real redis-server (and, for the metrics, a real Prometheus
//! server): each test starts its own redis on a free loopback port in a temp dir, starts
//! the watcher with the perf backend, injects a stall with `DEBUG SLEEP`, and polls with
//! deadlines for what should follow: an incident directory, `--events` lines, metrics,
//! Prometheus's view of them, a restart followed, a clean exit on SIGTERM. Tests hold the
//! shared tracing lock (`serial()`). Without redis-server, tracefs or prometheus the tests
//! are skipped, except under CI=true where that is a failure.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{free_port, have, http_get, poll, serial, stop_child, Client, Redis};

fn have_perf() -> bool {
    crate::common::can_trace(
        "watch needs the perf backend: tracefs with raw_syscalls tracepoints, as root, under CI=true",
        "skipping: the perf backend is not available (tracefs, root)",
    )
}

fn can_run() -> bool {
    have("redis-server", "--version") && have_perf()
}

/// The value of one sample line of the watcher's metrics (`name{labels}` exactly as printed,
/// or the sum over every sample of the family when `name` has no labels).
pub(crate) fn metric(port: u16, name: &str) -> Option<f64> {
    let (code, body) = http_get(port, "/metrics")?;
    if code != 200 {
        return None;
    }
    let mut sum = None;
    for l in body.lines().filter(|l| !l.starts_with('#')) {
        let (k, v) = l.rsplit_once(' ')?;
        let family = k.split('{').next().unwrap_or(k);
        if k == name || (!name.contains('{') && family == name) {
            *sum.get_or_insert(0.0) += v.parse::<f64>().ok()?;
        }
    }
    sum
}

/// A running `stallscope watch`, its stderr collected on a thread.
pub(crate) struct Watch {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Watch {
    pub(crate) fn start(args: &[&str]) -> Watch {
        // These tests check the full tier's detail from a stall's first instant (commands
        // held, syscall histograms): the always-full mode. The default (cheap) mode has its
        // own tests (live_cheap.rs).
        if args.contains(&"--mode") {
            return Watch::start_as_given(args);
        }
        Watch::start_as_given(&[&["--mode", "full"], args].concat())
    }

    /// `stallscope watch` with exactly `args`: its default mode unless they say one.
    pub(crate) fn start_as_given(args: &[&str]) -> Watch {
        let mut child = Command::new(env!("CARGO_BIN_EXE_stallscope"))
            .arg("watch")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start stallscope watch");
        let err = child.stderr.take().expect("stderr");
        let stderr = Arc::new(Mutex::new(vec![]));
        let s2 = stderr.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                s2.lock().unwrap().push(l);
            }
        });
        Watch { child, stderr }
    }

    /// `start`, then its "watching" line, which a test waits for before it acts.
    pub(crate) fn start_watching(args: &[&str]) -> Watch {
        Watch::start_until(args, "watching", Duration::from_secs(20))
    }

    /// `start`, then a line containing `what` within `limit` (a panic without it): for the
    /// tests that wait for a line of their own, or longer than `start_watching`.
    pub(crate) fn start_until(args: &[&str], what: &str, limit: Duration) -> Watch {
        let w = Watch::start(args);
        w.assert_line(what, limit);
        w
    }

    /// A line containing `what` within `limit`, or a panic that shows the lines so far.
    pub(crate) fn assert_line(&self, what: &str, limit: Duration) {
        assert!(self.wait_line(what, limit), "{:?}", self.lines());
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    pub(crate) fn wait_line(&self, what: &str, limit: Duration) -> bool {
        poll(limit, || {
            self.lines().iter().any(|l| l.contains(what)).then_some(())
        })
        .is_some()
    }

    /// SIGTERM: it exits 0 before the live tests' deadline.
    pub(crate) fn assert_sigterm_exits_0(&mut self) {
        assert_eq!(
            self.terminate(crate::common::DEADLINE),
            Some(0),
            "{:?}",
            self.lines()
        );
    }

    /// SIGTERM, then the exit status within `limit`.
    pub(crate) fn terminate(&mut self, limit: Duration) -> Option<i32> {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let code = poll(limit, || self.child.try_wait().ok().flatten());
        code.map(|c| c.code().unwrap_or(-1))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn debug_redis() -> Redis {
    Redis::start(&["--enable-debug-command", "yes"])
}

fn debug_sleep(port: u16) {
    let mut c = Client::connect(port, Duration::from_secs(20)).expect("connect");
    let r = c.cmd(&["DEBUG", "SLEEP", "0.3"]).expect("DEBUG SLEEP");
    assert_eq!(r.text(), "+OK");
}

/// The incident reports written to `out`, once there is one (a panic after a minute).
pub(crate) fn wait_incident_reports(out: &Path, w: &Watch) -> Vec<PathBuf> {
    poll(Duration::from_secs(60), || {
        let v = incident_reports(out);
        (!v.is_empty()).then_some(v)
    })
    .unwrap_or_else(|| {
        panic!(
            "no incident report in {}; watcher: {:?}",
            out.display(),
            w.lines()
        )
    })
}

pub(crate) fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The main thread's stall that `debug_sleep` made (300 ms, at least 250 ms as measured).
fn sleep_stall(r: &serde_json::Value) -> &serde_json::Value {
    let stalls = r["stalls"].as_array().expect("stalls");
    stalls
        .iter()
        .find(|s| s["thread"] == "main" && s["duration_us"].as_i64().unwrap_or(0) >= 250_000)
        .unwrap_or_else(|| panic!("no 300 ms main-thread stall in {stalls:?}"))
}

/// `stallscope analyze` of a recording, as JSON.
fn replay(recording: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args(["analyze", recording.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
}

/// A client's SETs of keys k0.. on a thread of its own: traffic while the test acts.
fn set_load(port: u16, n: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut c = Client::connect(port, Duration::from_secs(20)).unwrap();
        for i in 0..n {
            c.cmd(&["SET", &format!("k{i}"), "v"]).unwrap();
        }
    })
}

/// A watcher of `redis` that writes an incident to `out` a second after its stall, with
/// `extra` arguments.
fn watch_incidents(redis: &Redis, out: &Path, extra: &[&str]) -> Watch {
    let pid = redis.pid().to_string();
    let mut args = vec![
        "--pid",
        &pid,
        "--out",
        out.to_str().unwrap(),
        "--after",
        "1s",
    ];
    args.extend_from_slice(extra);
    Watch::start_watching(&args)
}

pub(crate) fn incident_reports(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    v
}

#[test]
fn prometheus_counts_an_injected_stall() {
    let _g = serial();
    if !(can_run() && have("prometheus", "--version")) {
        return;
    }
    let redis = debug_redis();
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let w = Watch::start_watching(&["--pid", &redis.pid().to_string(), "--metrics", &maddr]);
    let tmp = tempfile::tempdir().unwrap();
    let conf = tmp.path().join("prometheus.yml");
    std::fs::write(
        &conf,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: stallscope\n    \
             scrape_interval: 1s\n    static_configs:\n      - targets: [\"{maddr}\"]\n"
        ),
    )
    .unwrap();
    let pport = free_port();
    let mut prom = Command::new("prometheus")
        .arg(format!("--config.file={}", conf.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            tmp.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{pport}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus");
    struct Kill<'a>(&'a mut Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            if poll(Duration::from_secs(10), || self.0.try_wait().ok().flatten()).is_none() {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let _prom = Kill(&mut prom);
    let ready = poll(Duration::from_secs(60), || {
        http_get(pport, "/-/ready").and_then(|(c, _)| (c == 200).then_some(()))
    });
    assert!(ready.is_some(), "prometheus did not become ready");
    // The watcher is up as Prometheus sees it before the stall, so the counter's rise is
    // what the query shows.
    let up = poll(Duration::from_secs(60), || {
        let (_, body) = http_get(pport, "/api/v1/query?query=stallscope_attached")?;
        body.contains("\"1\"").then_some(())
    });
    assert!(
        up.is_some(),
        "prometheus never scraped stallscope_attached 1"
    );
    debug_sleep(redis.port);
    let seen = poll(Duration::from_secs(60), || {
        let (code, body) = http_get(pport, "/api/v1/query?query=sum(stallscope_stalls_total)")?;
        if code != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let n: f64 = v["data"]["result"][0]["value"][1].as_str()?.parse().ok()?;
        (n >= 1.0).then_some(n)
    });
    assert!(
        seen.is_some(),
        "Prometheus never saw stallscope_stalls_total >= 1; watcher: {:?}",
        w.lines()
    );
    // The stall's labels say what it was, from closed sets.
    let (_, body) = http_get(
        pport,
        "/api/v1/query?query=stallscope_stalls_total%7Brole%3D%22main%22%2Ckind%3D%22slow_syscall%22%7D",
    )
    .expect("query");
    assert!(body.contains("\"finding\""), "{body}");
}

#[test]
fn an_injected_stall_leaves_an_incident_report_and_an_event_line() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let redis = debug_redis();
    {
        let mut c = redis.client();
        c.cmd(&["SET", "secret-key-4242", "secret-value-4242"])
            .unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("incidents");
    let events = tmp.path().join("stalls.jsonl");
    let mport = free_port();
    let w = watch_incidents(
        &redis,
        &out,
        &[
            "--events",
            events.to_str().unwrap(),
            "--record",
            "--metrics",
            &format!(":{mport}"),
        ],
    );
    debug_sleep(redis.port);
    let reports = wait_incident_reports(&out, &w);
    assert_eq!(reports.len(), 1, "{reports:?}");
    let json_path = &reports[0];
    let name = json_path.file_name().unwrap().to_string_lossy().to_string();
    // Named by time and finding: 2026-12-01T07-43-54.360Z-command.json
    assert!(
        name.len() > 25 && name.as_bytes()[4] == b'-' && name.as_bytes()[10] == b'T',
        "{name}"
    );
    let r = read_json(json_path);
    assert_eq!(r["source"]["kind"], "live");
    // auto: bpf or perf, never ptrace.
    assert!(
        r["source"]["backend"] == "perf" || r["source"]["backend"] == "bpf",
        "{}",
        r["source"]
    );
    let sleep = sleep_stall(&r);
    let finding = sleep["finding"].as_str().expect("the stall has a finding");
    assert!(name.contains(finding), "{name} does not name {finding}");
    // The incident's own /proc samples, as attach has them, and the main thread's schedstat.
    let host = &r["host"];
    assert!(
        host["samples"].as_array().is_some_and(|s| s.len() >= 2),
        "no /proc samples in the incident: {host}"
    );
    let notes: Vec<&str> = host["notes"]
        .as_array()
        .map(|n| n.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("stall of main") && n.contains("schedstat")),
        "no schedstat note for the stall: {notes:?}"
    );
    let stem = json_path.to_str().unwrap().strip_suffix(".json").unwrap();
    let html = PathBuf::from(format!("{stem}.html"));
    let strace = PathBuf::from(format!("{stem}.strace"));
    for p in [json_path, &html, &strace] {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!(
            meta.permissions().mode() & 0o007,
            0,
            "{} is world-readable",
            p.display()
        );
        let text = std::fs::read_to_string(p).unwrap();
        assert!(
            !text.contains("secret-"),
            "{} holds a key or value",
            p.display()
        );
    }
    // The recording reads back to a report with the same stall.
    let again = replay(&strace);
    assert!(
        again["summary"]["stalls"].as_u64().unwrap_or(0) >= 1,
        "{}",
        again["summary"]
    );
    // One --events line for the stall, as it ended.
    let lines = std::fs::read_to_string(&events).unwrap();
    let ev: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let e = ev
        .iter()
        .find(|e| e["duration_s"].as_f64().unwrap_or(0.0) >= 0.25)
        .unwrap_or_else(|| panic!("no 300 ms stall line in {lines}"));
    assert_eq!(e["thread"], "main");
    assert_eq!(e["finding"], finding);
    assert!(
        chrono::DateTime::parse_from_rfc3339(e["time"].as_str().unwrap()).is_ok(),
        "{e}"
    );
    assert_eq!(metric(mport, "stallscope_incidents_total"), Some(1.0));
}

#[test]
fn unwritable_out_is_counted_and_rate_limit_too_and_watching_goes_on() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let redis = debug_redis();
    let tmp = tempfile::tempdir().unwrap();
    // A directory under a regular file cannot be created, even by root.
    let blocker = tmp.path().join("a-file");
    std::fs::write(&blocker, "x").unwrap();
    let bad = blocker.join("incidents");
    let mport = free_port();
    let w = Watch::start_watching(&[
        "--pid",
        &redis.pid().to_string(),
        "--out",
        bad.to_str().unwrap(),
        "--after",
        "200ms",
        "--max-incidents-per-hour",
        "1",
        "--metrics",
        &format!("127.0.0.1:{mport}"),
    ]);
    debug_sleep(redis.port);
    let err = poll(Duration::from_secs(60), || {
        metric(mport, "stallscope_incident_write_errors_total").filter(|n| *n >= 1.0)
    });
    assert!(err.is_some(), "write error not counted; {:?}", w.lines());
    // Its stall is counted as in no report, and why.
    let unrep = poll(Duration::from_secs(30), || {
        metric(
            mport,
            &format!(
                "stallscope_stalls_not_reported_total{{instance=\"127.0.0.1:{}\",reason=\"write_error\"}}",
                redis.port
            ),
        )
        .filter(|n| *n >= 1.0)
    });
    assert!(unrep.is_some(), "{:?}", w.lines());
    assert!(
        w.lines()
            .iter()
            .any(|l| l.contains("incident not written") && l.contains("--out")),
        "{:?}",
        w.lines()
    );
    // Still watching: the next stall is counted, and its incident is over the hourly limit.
    debug_sleep(redis.port);
    let n = poll(Duration::from_secs(60), || {
        metric(mport, "stallscope_stalls_total").filter(|n| *n >= 2.0)
    });
    assert!(n.is_some(), "{:?}", w.lines());
    let sup = poll(Duration::from_secs(60), || {
        metric(mport, "stallscope_incidents_suppressed_total").filter(|n| *n >= 1.0)
    });
    assert!(sup.is_some(), "rate limit not counted; {:?}", w.lines());
    let unrep = metric(
        mport,
        &format!(
            "stallscope_stalls_not_reported_total{{instance=\"127.0.0.1:{}\",reason=\"rate_limit\"}}",
            redis.port
        ),
    );
    assert!(unrep.is_some_and(|n| n >= 1.0), "{unrep:?}");
}

/// A copy of redis-server under a name of its own (`redis-server-XX`: the comm keeps its
/// role as main), so that `--name` finds this test's redis and no other on the machine.
fn named_redis(dir: &Path, bin: &Path, port: u16) -> Child {
    let child = Command::new(bin)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--save",
            "",
            "--daemonize",
            "no",
            "--enable-debug-command",
            "yes",
        ])
        .args(["--dir", dir.to_str().unwrap(), "--logfile", "redis.log"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the renamed redis-server");
    let ok = poll(Duration::from_secs(10), || {
        Client::connect(port, Duration::from_millis(500))
            .and_then(|mut c| c.cmd(&["PING"]))
            .ok()
            .filter(|r| r.text() == "+PONG")
    });
    assert!(ok.is_some(), "the renamed redis-server did not answer PING");
    child
}

/// The redis-server on PATH, to copy or run under another name.
fn redis_server_bin() -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", "command -v redis-server"])
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Whether the watcher's metrics on `mport` say `stallscope_attached` is `want` within 30 s.
fn attached_within_30s(mport: u16, want: f64) -> bool {
    poll(Duration::from_secs(30), || {
        metric(mport, "stallscope_attached").filter(|v| *v == want)
    })
    .is_some()
}

#[test]
fn name_follows_a_restart() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = redis_server_bin();
    let tag = format!("{:02}", std::process::id() % 100);
    let name = format!("redis-server-{tag}");
    let bin = tmp.path().join(&name);
    std::fs::copy(&src, &bin).unwrap();
    let port = free_port();
    let mut r1 = named_redis(tmp.path(), &bin, port);
    let mport = free_port();
    let w = Watch::start(&["--name", &name, "--metrics", &format!(":{mport}")]);
    let attached = |want: f64| attached_within_30s(mport, want);
    assert!(attached(1.0), "{:?}", w.lines());
    let pid1 = r1.id();
    stop_child(&mut r1);
    assert!(
        attached(0.0),
        "still attached after redis exited; {:?}",
        w.lines()
    );
    let mut r2 = named_redis(tmp.path(), &bin, port);
    assert_ne!(r2.id(), pid1);
    assert!(
        attached(1.0),
        "did not attach to the new redis; {:?}",
        w.lines()
    );
    assert_eq!(metric(mport, "stallscope_attaches_total"), Some(2.0));
    // The restarted redis, on the same address, goes on under the same instance label.
    assert_eq!(
        metric(
            mport,
            &format!("stallscope_attaches_total{{instance=\"127.0.0.1:{port}\"}}")
        ),
        Some(2.0),
        "{:?}",
        w.lines()
    );
    debug_sleep(port);
    let n = poll(Duration::from_secs(60), || {
        metric(mport, "stallscope_stalls_total").filter(|n| *n >= 1.0)
    });
    assert!(
        n.is_some(),
        "the new redis's stall was not counted; {:?}",
        w.lines()
    );
    assert!(
        w.lines()
            .iter()
            .any(|l| l.contains(&format!("watching {}", r2.id()))),
        "{:?}",
        w.lines()
    );
    drop(w);
    stop_child(&mut r2);
}

#[test]
fn incidents_carry_redis_latency_events_and_log_lines() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let redis = Redis::start(&[
        "--enable-debug-command",
        "yes",
        "--latency-monitor-threshold",
        "100",
    ]);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("incidents");
    let addr = format!("127.0.0.1:{}", redis.port);
    let w = watch_incidents(&redis, &out, &["--redis", &addr]);
    assert!(
        w.wait_line("following redis's log", Duration::from_secs(5)),
        "{:?}",
        w.lines()
    );
    // A log line in the incident's window: a BGSAVE logs its start and end.
    let mut c = redis.client();
    c.cmd(&["BGSAVE"]).unwrap();
    debug_sleep(redis.port);
    let reports = wait_incident_reports(&out, &w);
    let r = read_json(&reports[0]);
    let sec = &r["redis"];
    assert_eq!(sec["log"]["followed"], true, "{sec}");
    assert!(
        sec["lines"]
            .as_array()
            .is_some_and(|l| l.iter().any(|x| x["message"]
                .as_str()
                .is_some_and(|m| m.contains("Background saving")))),
        "no BGSAVE line in the incident: {sec}"
    );
    assert_eq!(sec["server"]["latency_monitor_threshold_ms"], 100, "{sec}");
    let sleep = sleep_stall(&r);
    let ev = sleep["redis_evidence"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        ev.iter().any(|e| e["source"] == "latency"
            && e["what"]
                .as_str()
                .is_some_and(|w| w.starts_with("LATENCY command"))),
        "the stall lacks LATENCY's command event: {ev:?}; redis: {sec}"
    );
    redis.assert_unharmed();
}

#[test]
fn pid_follows_a_restart_by_its_listening_port() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let bin = redis_server_bin();
    let port = free_port();
    let mut r1 = named_redis(tmp.path(), &bin, port);
    let pid1 = r1.id();
    let mport = free_port();
    let w = Watch::start(&[
        "--pid",
        &pid1.to_string(),
        "--metrics",
        &format!(":{mport}"),
    ]);
    let attached = |want: f64| attached_within_30s(mport, want);
    assert!(attached(1.0), "{:?}", w.lines());
    stop_child(&mut r1);
    assert!(
        attached(0.0),
        "still attached after redis exited; {:?}",
        w.lines()
    );
    assert!(
        w.wait_line(
            &format!("listening on 127.0.0.1:{port}"),
            Duration::from_secs(10)
        ),
        "{:?}",
        w.lines()
    );
    let mut r2 = named_redis(tmp.path(), &bin, port);
    assert_ne!(r2.id(), pid1);
    assert!(
        attached(1.0),
        "did not attach to the restarted redis; {:?}",
        w.lines()
    );
    assert!(
        w.wait_line(&format!("watching {}", r2.id()), Duration::from_secs(10)),
        "{:?}",
        w.lines()
    );
    drop(w);
    stop_child(&mut r2);
}

#[test]
fn pid_without_a_port_or_pidfile_exits_saying_why() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("r.sock");
    let mut r = Command::new("redis-server")
        .args(["--port", "0", "--unixsocket", sock.to_str().unwrap()])
        .args([
            "--save",
            "",
            "--daemonize",
            "no",
            "--dir",
            tmp.path().to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server");
    assert!(
        poll(Duration::from_secs(10), || sock.exists().then_some(())).is_some(),
        "redis did not create its socket"
    );
    let mut w = Watch::start_watching(&["--pid", &r.id().to_string()]);
    stop_child(&mut r);
    let code = poll(Duration::from_secs(20), || {
        w.child.try_wait().ok().flatten()
    });
    assert_eq!(code.and_then(|c| c.code()), Some(2), "{:?}", w.lines());
    let lines = w.lines();
    let err = lines
        .iter()
        .find(|l| l.starts_with("stallscope: error: --pid"))
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(
        err.contains("cannot be followed") && err.contains("--name"),
        "{err}"
    );
}

#[test]
fn sigterm_detaches_exits_0_and_redis_is_untouched() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let redis = debug_redis();
    let mut w = Watch::start_watching(&["--pid", &redis.pid().to_string()]);
    // Traffic while attached, so the tracer has something in flight when it is stopped.
    let load = set_load(redis.port, 2000);
    std::thread::sleep(Duration::from_millis(200));
    // How fast is measured by bench/watch.sh (the issue asks for 2 s); on a loaded machine a
    // test only asks that it exits, with 0, before a generous deadline.
    let t0 = Instant::now();
    let code = w.terminate(crate::common::DEADLINE);
    assert_eq!(
        code,
        Some(0),
        "did not exit 0 within {:?} of SIGTERM; {:?}",
        crate::common::DEADLINE,
        w.lines()
    );
    eprintln!("exited {:?} after SIGTERM", t0.elapsed());
    load.join().unwrap();
    redis.assert_unharmed();
    assert!(
        w.lines().iter().any(|l| l.contains("detached from")),
        "{:?}",
        w.lines()
    );
}

#[test]
fn auto_never_falls_back_to_ptrace_and_ptrace_warns() {
    let _g = serial();
    if !have("redis-server", "--version") {
        return;
    }
    let redis = Redis::start(&[]);
    // As an unprivileged user perf is refused (paranoid >= 0, no CAP_PERFMON): auto must say
    // so rather than stop redis at every syscall. Root runs it as `nobody` to see that.
    if unsafe { libc::geteuid() } == 0 {
        let paranoid: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(2);
        let have_setpriv = Command::new("setpriv").arg("--version").output().is_ok();
        if paranoid > -1 && have_setpriv {
            let out = Command::new("setpriv")
                .args([
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "--inh-caps=-all",
                ])
                .arg(env!("CARGO_BIN_EXE_stallscope"))
                .args(["watch", "--pid", &redis.pid().to_string()])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{err}");
            assert!(err.contains("--backend ptrace"), "{err}");
            assert!(!err.contains("backend ptrace:"), "auto chose ptrace: {err}");
            assert_eq!(redis.tracer_pid(), 0);
        }
    }
    // Asked for: it warns about the cost, then watches, and sees commands.
    let mport = free_port();
    let mut w = Watch::start_watching(&[
        "--pid",
        &redis.pid().to_string(),
        "--backend",
        "ptrace",
        "--metrics",
        &format!(":{mport}"),
    ]);
    assert!(
        w.lines()
            .iter()
            .any(|l| l.contains("warning") && l.contains("fraction of its throughput")),
        "{:?}",
        w.lines()
    );
    let mut c = redis.client();
    for i in 0..50 {
        c.cmd(&["SET", &format!("k{i}"), "v"]).unwrap();
    }
    let sets = poll(Duration::from_secs(30), || {
        metric(
            mport,
            &format!(
                "stallscope_command_duration_seconds_count{{instance=\"127.0.0.1:{}\",command=\"SET\"}}",
                redis.port
            ),
        )
        .filter(|n| *n >= 50.0)
    });
    assert!(sets.is_some(), "SETs not timed; {:?}", w.lines());
    w.assert_sigterm_exits_0();
    redis.assert_unharmed();
}

/// A stall's time in µs since the epoch: a live report has it in ISO 8601, the replay of
/// a recording (epoch timestamps) as the recording's text.
fn micros(t: &serde_json::Value) -> i64 {
    let t = t.as_str().unwrap_or_default();
    match chrono::DateTime::parse_from_rfc3339(t) {
        Ok(d) => d.timestamp_micros(),
        Err(_) => {
            let (s, f) = t.split_once('.').unwrap_or((t, "0"));
            let f = format!("{f:0<6}");
            s.parse::<i64>().unwrap_or(0) * 1_000_000 + f[..6].parse::<i64>().unwrap_or(0)
        }
    }
}

/// What a report says of its stalls and findings, to compare an incident with its replay.
fn stalls_and_findings(r: &serde_json::Value) -> (Vec<String>, Vec<String>) {
    let stalls = r["stalls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            format!(
                "{} {} {} {} {} {} lost={}",
                micros(&s["ts"]),
                s["thread"],
                s["kind"],
                s["duration_us"],
                s["syscall"],
                s["finding"],
                s["events_lost"]
            )
        })
        .collect();
    // The watcher's own findings (the incident's window, what the backend cannot see) and
    // those from its /proc samples are not in the recording.
    let mut findings: Vec<String> = r["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["id"].as_str())
        .filter(|id| !matches!(*id, "watch-incident" | "backend-limits"))
        .map(str::to_string)
        .collect();
    findings.sort();
    (stalls, findings)
}

#[test]
fn an_incident_recording_replays_to_the_incident_findings() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let redis = debug_redis();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("incidents");
    let w = watch_incidents(
        &redis,
        &out,
        &[
            "--record",
            // Small per-CPU buffers under traffic: records may be lost, and the replay must
            // place the losses where the incident's analysis had them.
            "--perf-pages",
            "1",
        ],
    );
    let load = set_load(redis.port, 3000);
    debug_sleep(redis.port);
    load.join().unwrap();
    let reports = wait_incident_reports(&out, &w);
    let json_path = &reports[0];
    let r = read_json(json_path);
    let stem = json_path.to_str().unwrap().strip_suffix(".json").unwrap();
    let strace = format!("{stem}.strace");
    let lost = r["summary"]["lost_events"].as_u64().unwrap_or(0);
    assert_eq!(
        Path::new(&format!("{strace}.lost")).exists(),
        lost > 0,
        "a .lost sidecar exactly when the incident lost records ({lost})"
    );
    if r["source"]["backend"] == "bpf" {
        assert!(
            Path::new(&format!("{strace}.sched")).exists(),
            "a bpf incident's recording has the scheduler's split"
        );
    }
    let again = replay(Path::new(&strace));
    assert_eq!(again["summary"]["lost_events"].as_u64().unwrap_or(0), lost);
    let (s1, f1) = stalls_and_findings(&r);
    let (s2, f2) = stalls_and_findings(&again);
    assert!(!s1.is_empty());
    assert_eq!(s1, s2, "the replay's stalls differ from the incident's");
    assert_eq!(f1, f2, "the replay's findings differ from the incident's");
    redis.assert_unharmed();
}

#[test]
fn the_redis_pollers_connections_are_not_client_commands() {
    let _g = serial();
    if !can_run() {
        return;
    }
    // redis rewrites its argv, so the watcher asks it for its logfile (CONFIG GET) on a
    // connection of its own: neither that nor the poller's LATENCY/INFO is a client's.
    let redis = debug_redis();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("incidents");
    let addr = format!("127.0.0.1:{}", redis.port);
    // ptrace: the backend that sees every request buffer on any machine.
    let w = watch_incidents(&redis, &out, &["--backend", "ptrace", "--redis", &addr]);
    assert!(
        w.wait_line("(CONFIG GET logfile)", Duration::from_secs(5)),
        "the log was not found through CONFIG GET: {:?}",
        w.lines()
    );
    {
        let mut c = redis.client();
        for i in 0..50 {
            c.cmd(&["SET", &format!("k{i}"), "v"]).unwrap();
        }
    }
    // A few poller rounds before the stall.
    std::thread::sleep(Duration::from_millis(2500));
    debug_sleep(redis.port);
    let reports = wait_incident_reports(&out, &w);
    let r = read_json(&reports[0]);
    let cmds: Vec<String> = r["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["command"].as_str())
        .map(|c| c.to_ascii_uppercase())
        .collect();
    assert!(
        cmds.iter().any(|c| c == "SET"),
        "the client's SETs: {cmds:?}"
    );
    for ours in ["CONFIG", "LATENCY", "INFO", "SLOWLOG", "AUTH"] {
        assert!(
            !cmds.iter().any(|c| c == ours),
            "{ours} is the watcher's, not a client's: {cmds:?}"
        );
    }
    let mut w = w;
    w.assert_sigterm_exits_0();
    redis.assert_unharmed();
}
