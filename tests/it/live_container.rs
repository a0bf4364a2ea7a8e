//! `stallscope attach` from the host to a redis-server in a container made without a
//! container runtime: `unshare` gives it its own mount, pid, network and UTS namespaces, a
//! tmpfs root it pivots into (so its `/data` does not exist on the host), a tmpfs at `/data`
//! for its config, log and data, loopback up inside and a hostname of its own. The load and
//! the `DEBUG SLEEP` stall come from inside its network namespace (`nsenter --net`), the
//! attach from the host. The report must name the container, read redis's log through
//! /proc/PID/root and join it (its pids mapped: redis is pid 1 inside), and poll redis
//! through its network namespace (`--redis 127.0.0.1:6379` is the container's loopback).
//! Needs root, the bpf backend, redis-server, redis-tools and util-linux's unshare,
//! nsenter and pivot_root, and iproute2's ip: skipped without them, a failure under CI=true.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{ci, json, serial, Attach, DEADLINE};
use crate::common::{free_port, http_get, poll};
use crate::live_watch::{wait_incident_reports, Watch};

/// The container's hostname (a pod's name).
const HOSTNAME: &str = "redis-pod-7f9c";
/// Inside its own network namespace, any port is free.
const PORT: &str = "6379";

/// Builds the container's root and runs redis in it: the script `unshare` runs, in the new
/// namespaces. `$1` is the directory that becomes its root.
const INNER: &str = r#"set -e
R=$1
mount --make-rprivate /
mount -t tmpfs tmpfs "$R"
for d in usr etc dev; do mkdir -p "$R/$d"; mount --rbind "/$d" "$R/$d"; done
for l in bin sbin lib lib32 lib64; do
  if [ -L "/$l" ]; then ln -s "$(readlink "/$l")" "$R/$l";
  elif [ -d "/$l" ]; then mkdir -p "$R/$l"; mount --rbind "/$l" "$R/$l"; fi
done
mkdir -p "$R/proc" "$R/data" "$R/tmp" "$R/.old"
mount -t tmpfs tmpfs "$R/data"
cat > "$R/data/redis.conf" <<EOF
port PORT
bind 127.0.0.1
dir /data
loglevel verbose
logfile /data/redis.log
save ""
enable-debug-command yes
latency-monitor-threshold 50
set-proc-title no
EOF
cd "$R"
pivot_root . .old
mount -t proc proc /proc
umount -l /.old
echo HOSTNAME > /proc/sys/kernel/hostname
ip link set lo up
exec redis-server /data/redis.conf
"#;

fn have(tool: &str, arg: &str) -> bool {
    Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Whether this machine can run the test (root, tracefs, the tools); under CI=true a
/// missing piece is a failure.
fn can_run() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    let tracefs = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|r| {
            Path::new(r)
                .join("events/raw_syscalls/sys_enter/id")
                .exists()
        });
    let tools = [
        ("redis-server", "--version"),
        ("redis-cli", "--version"),
        ("redis-benchmark", "--version"),
        ("unshare", "--version"),
        ("nsenter", "--version"),
        ("pivot_root", "--version"),
        ("ip", "-V"),
    ];
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(t, a)| !have(t, a))
        .map(|(t, _)| *t)
        .collect();
    let ok = root && tracefs && missing.is_empty();
    if !ok {
        let why = format!("root {root}, tracefs {tracefs}, missing tools {missing:?}");
        if ci() {
            panic!("the container test needs root, tracefs and its tools under CI=true: {why}");
        }
        eprintln!("skipping: {why}");
    }
    ok
}

/// The container: `unshare` (the test's child) and redis in it, by its host pid. Dropped:
/// redis, the pid namespace's init, is killed, which ends the namespaces and their mounts.
struct Container {
    unshare: Child,
    pid: u32,
    _dir: tempfile::TempDir,
}

impl Container {
    fn start() -> Container {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("inner.sh");
        let text = INNER.replace("PORT", PORT).replace("HOSTNAME", HOSTNAME);
        std::fs::write(&script, text).expect("write the script");
        let root = dir.path().join("root");
        std::fs::create_dir(&root).expect("root dir");
        let unshare = Command::new("unshare")
            .args(["--mount", "--pid", "--net", "--uts", "--fork", "sh"])
            .arg(&script)
            .arg(&root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start unshare");
        let mut c = Container {
            pid: 0,
            unshare,
            _dir: dir,
        };
        c.pid = c.wait_redis();
        c
    }

    /// The host pid of redis: unshare's child once it has exec'd redis-server and answers.
    fn wait_redis(&mut self) -> u32 {
        let start = Instant::now();
        while start.elapsed() < DEADLINE {
            if let Ok(Some(st)) = self.unshare.try_wait() {
                panic!("the container ended before redis served: {st}");
            }
            let kids =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.unshare.id()))
                    .unwrap_or_default();
            for k in kids
                .split_whitespace()
                .filter_map(|k| k.parse::<u32>().ok())
            {
                let comm = std::fs::read_to_string(format!("/proc/{k}/comm")).unwrap_or_default();
                if comm.trim() == "redis-server" && self.cli(k, &["PING"]).contains("PONG") {
                    return k;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis did not serve in the container within {DEADLINE:?}");
    }

    /// redis-cli run in redis's network namespace (where 127.0.0.1:6379 is redis).
    fn cli(&self, pid: u32, args: &[&str]) -> String {
        let out = Command::new("nsenter")
            .arg(format!("--net=/proc/{pid}/ns/net"))
            .args(["redis-cli", "-p", PORT])
            .args(args)
            .output()
            .expect("nsenter redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A short SET load from inside the network namespace.
    fn load(&self) {
        let st = Command::new("nsenter")
            .arg(format!("--net=/proc/{}/ns/net", self.pid))
            .args([
                "redis-benchmark",
                "-p",
                PORT,
                "-q",
                "-t",
                "set",
                "-n",
                "5000",
            ])
            .args(["-c", "4", "-d", "512", "-r", "2000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("nsenter redis-benchmark");
        assert!(st.success(), "redis-benchmark in the container: {st}");
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if self.pid > 0 {
            // SAFETY: a signal to the redis this test started.
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        }
        let start = Instant::now();
        while start.elapsed() < DEADLINE {
            if let Ok(Some(_)) = self.unshare.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

/// A stall's log evidence written by redis's main process, named by its host pid.
fn joined_log_line(stall: &serde_json::Value, pid: u32) -> bool {
    let who = format!("master {pid}");
    stall["redis_evidence"]
        .as_array()
        .is_some_and(|ev| ev.iter().any(|e| e["source"] == "log" && e["who"] == *who))
}

/// The stall of the tests' `DEBUG SLEEP 0.3` in report `r` (at least 250 ms as measured);
/// `whose` says which report in the panic.
fn sleep_stall<'a>(r: &'a serde_json::Value, whose: &str) -> &'a serde_json::Value {
    r["stalls"]
        .as_array()
        .and_then(|s| {
            s.iter()
                .find(|s| s["duration_us"].as_i64() >= Some(250_000))
        })
        .unwrap_or_else(|| panic!("no DEBUG SLEEP stall{whose}: {}", r["stalls"]))
}

/// What redis told of the sleep, read through the container's namespaces: its log line
/// (by master `pid`, as the host sees it) and its LATENCY event, joined on the stall.
fn assert_log_and_latency(stall: &serde_json::Value, pid: u32) {
    assert!(
        joined_log_line(stall, pid),
        "no log line of master {pid} on the stall: {stall}"
    );
    assert!(
        has_source(stall, "latency"),
        "no LATENCY event on the stall: {stall}"
    );
}

fn has_source(stall: &serde_json::Value, source: &str) -> bool {
    stall["redis_evidence"]
        .as_array()
        .is_some_and(|ev| ev.iter().any(|e| e["source"] == source))
}

#[test]
fn attach_from_the_host_names_the_container_and_reads_its_log_and_server() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let c = Container::start();
    let rec_dir = tempfile::tempdir().expect("tempdir");
    let rec = rec_dir.path().join("c.strace");
    let rec_s = rec.to_string_lossy().into_owned();
    let redis_addr = format!("127.0.0.1:{PORT}");
    let args = [
        "--redis",
        &redis_addr,
        "--threshold",
        "100ms",
        "--format",
        "json",
    ];
    let a = Attach::start("bpf", c.pid, &[&args[..], &["--record", &rec_s]].concat());
    assert!(a.attached, "stallscope did not attach: {:?}", a.stderr);
    c.load();
    assert!(c.cli(c.pid, &["DEBUG", "SLEEP", "0.3"]).contains("OK"));
    assert!(c
        .cli(c.pid, &["BGSAVE"])
        .contains("Background saving started"));
    // The poller's next round (once a second) sees the LATENCY event; the save ends.
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: a signal to the stallscope this test started.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
    let (code, out, err) = a.finish(DEADLINE);
    assert_eq!(code, Some(1), "one stall at least; stderr: {err:?}");
    let r = json(&out);

    let ct = &r["container"];
    assert_eq!(ct["hostname"], HOSTNAME, "{ct}");
    for ns in ["mnt", "pid", "net", "uts"] {
        assert!(
            ct["namespaces"].as_array().unwrap().iter().any(|n| n == ns),
            "{ns} not among the container's own namespaces: {ct}"
        );
    }
    assert_eq!(ct["files_via"], format!("/proc/{}/root", c.pid), "{ct}");
    let pids = ct["pids"].as_array().cloned().unwrap_or_default();
    assert!(
        pids.iter().any(|p| p["host"] == c.pid && p["ns"] == 1),
        "redis is pid 1 inside: {ct}"
    );

    let log = &r["redis"]["log"];
    let log_path = log["path"].as_str().unwrap_or("");
    assert_eq!(
        log_path,
        format!("/proc/{}/root/data/redis.log", c.pid),
        "{log}"
    );
    assert_log_and_latency(sleep_stall(&r, ""), c.pid);
    assert!(
        r["redis"]["server"]["polls"].as_u64() > Some(0),
        "{}",
        r["redis"]
    );

    // The save child: its clone result and the log's "started by pid N" are the namespace's
    // pids; the phase names the host's and still finds the line.
    let phase = r["phases"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["kind"] == "bgsave"))
        .unwrap_or_else(|| panic!("no bgsave phase: {}", r["phases"]));
    let child = phase["child_pid"].as_u64().unwrap_or(0) as u32;
    assert!(
        pids.iter().any(|p| p["host"] == child && p["ns"] != child),
        "{ct}"
    );
    let started = phase["redis_evidence"].as_array().is_some_and(|ev| {
        ev.iter().any(|e| {
            e["text"]
                .as_str()
                .is_some_and(|t| t.contains("started by pid"))
        })
    });
    assert!(started, "the save's log line is not on its phase: {phase}");

    // The recording keeps the config read through the container's root, and reads back to
    // the same stalls and the same save child (the host's pid, as its calls are named).
    let conf = std::fs::read_to_string(format!("{rec_s}.redis.conf")).expect("conf sidecar");
    assert!(conf.contains("logfile /data/redis.log"), "{conf}");
    // So are redis's log lines, read while recording (`FILE.redis.log`): the replay finds
    // them by itself, once the container and its /data are gone too.
    let kept = std::fs::read_to_string(format!("{rec_s}.redis.log")).expect("log sidecar");
    assert!(
        kept.lines().any(|l| l.starts_with("1:M ")),
        "no line of redis (pid 1 inside) kept: {kept}"
    );
    let pid = c.pid;
    drop(c);
    let gone = format!("/proc/{pid}/root/data/redis.log");
    assert!(!Path::new(&gone).exists(), "{gone} still there");
    let back = Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args([
            "analyze",
            &rec_s,
            "--threshold",
            "100ms",
            "--format",
            "json",
        ])
        .output()
        .expect("run analyze");
    let b = json(&String::from_utf8_lossy(&back.stdout));
    assert_eq!(
        b["redis"]["log"]["path"],
        format!("{rec_s}.redis.log"),
        "{}",
        b["redis"]["log"]
    );
    assert_eq!(b["redis"]["log"]["found"], "beside the trace");
    assert_eq!(
        b["summary"]["stalls"], r["summary"]["stalls"],
        "{}",
        b["stalls"]
    );
    let kids = |r: &serde_json::Value| -> Vec<serde_json::Value> {
        let p = r["phases"].as_array().cloned().unwrap_or_default();
        p.iter().map(|p| p["child_pid"].clone()).collect()
    };
    assert_eq!(kids(&b), kids(&r), "the replay's phases: {}", b["phases"]);
    // The container as the live report named it, its pids inside included (`.container`);
    // they map the log's pid 1 to the host's, so the replay joins the log as attach did.
    assert_eq!(b["container"], r["container"], "the replay's container");
    let stall_b = sleep_stall(&b, " in the replay");
    assert!(
        joined_log_line(stall_b, pid),
        "the replay joined no log line of master {pid}: {stall_b}"
    );
}

/// `watch` from the host: an incident's report names the container and carries redis's log
/// and LATENCY, read through its mount and network namespaces.
#[test]
fn watch_from_the_host_writes_incidents_that_name_the_container() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let c = Container::start();
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("incidents");
    let addr = format!("127.0.0.1:{PORT}");
    let pid = c.pid.to_string();
    let args = [
        "--pid",
        &pid,
        "--backend",
        "bpf",
        "--redis",
        &addr,
        "--out",
        out.to_str().unwrap(),
        "--after",
        "1s",
        "--threshold",
        "100ms",
    ];
    let mut w = Watch::start_until(&args, "watching", DEADLINE);
    let log = format!("following redis's log /proc/{}/root/data/redis.log", c.pid);
    assert!(
        w.lines().iter().any(|l| l.contains(&log)),
        "{:?}",
        w.lines()
    );
    c.load();
    assert!(c.cli(c.pid, &["DEBUG", "SLEEP", "0.3"]).contains("OK"));
    let reports = wait_incident_reports(&out, &w);
    assert_eq!(w.terminate(DEADLINE), Some(0), "{:?}", w.lines());
    let r = json(&std::fs::read_to_string(&reports[0]).expect("incident report"));
    assert_eq!(r["container"]["hostname"], HOSTNAME, "{}", r["container"]);
    assert_log_and_latency(sleep_stall(&r, ""), c.pid);
}

/// `watch --all` finds the container's redis among the host's and labels it by its name
/// (the host name of its UTS namespace, a pod's name) before its address: in the metrics,
/// where its DEBUG SLEEP is counted, and in the incident directory.
#[test]
fn watch_all_labels_the_container_instance_by_its_name() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let c = Container::start();
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let mut w = Watch::start(&[
        "--all",
        "--backend",
        "bpf",
        "--metrics",
        &maddr,
        "--out",
        out.to_str().unwrap(),
        "--after",
        "1s",
        "--threshold",
        "100ms",
    ]);
    let label = format!("{HOSTNAME}/127.0.0.1:{PORT}");
    let of_it = format!("instance=\"{label}\"");
    let metrics = || {
        http_get(mport, "/metrics")
            .filter(|(code, _)| *code == 200)
            .map(|(_, body)| body)
    };
    let attached = format!("stallscope_attached{{{of_it}}} 1");
    assert!(
        poll(DEADLINE, || metrics().filter(|b| b.contains(&attached))).is_some(),
        "{attached} never scraped; watcher: {:?}",
        w.lines()
    );
    c.load();
    assert!(c.cli(c.pid, &["DEBUG", "SLEEP", "0.3"]).contains("OK"));
    let counted = poll(DEADLINE, || {
        let body = metrics()?;
        let n: f64 = body
            .lines()
            .filter(|l| l.starts_with("stallscope_stalls_total{") && l.contains(&of_it))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        (n >= 1.0).then_some(n)
    });
    assert!(
        counted.is_some(),
        "no stall counted under {label}; watcher: {:?}",
        w.lines()
    );
    let dir = out.join(label.replace('/', "_"));
    wait_incident_reports(&dir, &w);
    assert_eq!(w.terminate(DEADLINE), Some(0), "{:?}", w.lines());
}
