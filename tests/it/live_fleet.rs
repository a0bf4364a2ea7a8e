//! `stallscope watch --all` and `--name` with several matches (issue 42): one watcher for
//! several redis and valkey servers, each counted under its own `instance` label. The main
//! test runs a host redis-server, a valkey-server and a third server started after the
//! watcher, injects a `DEBUG SLEEP 0.3` in each, and checks through a real Prometheus's HTTP
//! API that each stall is counted under its own instance, that each instance has one incident
//! report under `--out/INSTANCE/`, that the one that exits reads `stallscope_attached 0`,
//! its cgroup's series gone and its other series no longer growing, and that every panel
//! query of the Grafana dashboard in contrib/ answers with data. The others: `attach --name` with several matches lists them
//! and says how to pick, `watch --name` with several watches each, ptrace is refused with
//! `--all`, and the alert rules pass `promtool check rules`. Live tests hold `serial()`,
//! start their own servers on free loopback ports, and stop them by pid; without the tools
//! they are skipped, except under CI=true where that is a failure.
//!
//! `--all` watches every redis on the machine, the test's and any other's: the assertions
//! are about the test's own instances, found by their ports.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{free_port, have, http_get, poll, serial, stop_child, Client};
use crate::live_watch::{incident_reports, read_json, wait_incident_reports, Watch};

/// Root and tracefs: what the bpf programs need.
fn can_trace() -> bool {
    crate::common::can_trace(
        "watch --all needs root and tracefs under CI=true",
        "skipping: not root, or no tracefs",
    )
}

/// The sum of the watcher's samples whose line starts with `prefix` (a name and labels).
fn scrape_sum(port: u16, prefix: &str) -> Option<f64> {
    let (code, body) = http_get(port, "/metrics")?;
    (code == 200).then_some(())?;
    Some(
        body.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum(),
    )
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A PromQL query against Prometheus on `port`: its result vector (None: an error).
fn prom_query(port: u16, q: &str) -> Option<Vec<serde_json::Value>> {
    let (code, body) = http_get(port, &format!("/api/v1/query?query={}", urlencode(q)))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    (code == 200 && v["status"] == "success").then_some(())?;
    v["data"]["result"].as_array().cloned()
}

/// The first value of a query's result, as a number.
fn prom_value(port: u16, q: &str) -> Option<f64> {
    prom_query(port, q)?.first()?["value"][1]
        .as_str()?
        .parse()
        .ok()
}

/// A server process of the test's own, stopped by pid at the end.
struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    /// `bin` (redis-server, valkey-server or a renamed copy) on a free loopback port.
    fn start(bin: &str, extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
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
            .args([
                "--dir",
                dir.path().to_str().unwrap(),
                "--logfile",
                "server.log",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {bin}: {e}"));
        let ok = poll(Duration::from_secs(20), || {
            Client::connect(port, Duration::from_millis(500))
                .and_then(|mut c| c.cmd(&["PING"]))
                .ok()
                .filter(|r| r.text() == "+PONG")
        });
        assert!(ok.is_some(), "{bin} did not answer PING on {port}");
        Server {
            child,
            port,
            _dir: dir,
        }
    }

    fn label(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn debug_sleep(&self) {
        let mut c = Client::connect(self.port, Duration::from_secs(20)).expect("connect");
        let r = c.cmd(&["DEBUG", "SLEEP", "0.3"]).expect("DEBUG SLEEP");
        assert_eq!(r.text(), "+OK");
    }

    fn stop(&mut self) {
        stop_child(&mut self.child);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

/// A child stopped (SIGTERM, then SIGKILL) when dropped.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        stop_child(&mut self.0);
    }
}

/// Each of `servers` attached, said by the watcher within 30 s.
fn assert_instances(w: &Watch, servers: &[&Server]) {
    for s in servers {
        let l = format!("as instance {}", s.label());
        assert!(
            w.wait_line(&l, Duration::from_secs(30)),
            "{l}: {:?}",
            w.lines()
        );
    }
}

/// Prometheus scraping the watcher every second, keeping stallscope's `instance` labels
/// (honor_labels) and naming the watcher's address `node`, as contrib/ configures it.
fn prometheus(dir: &Path, target: &str) -> (Stopped, u16) {
    let conf = dir.join("prometheus.yml");
    std::fs::write(
        &conf,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: stallscope\n    \
             scrape_interval: 1s\n    honor_labels: true\n    static_configs:\n      - targets: [\"{target}\"]\n    \
             relabel_configs:\n      - source_labels: [__address__]\n        target_label: node\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let p = Command::new("prometheus")
        .arg(format!("--config.file={}", conf.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus");
    let ready = poll(Duration::from_secs(60), || {
        http_get(port, "/-/ready").and_then(|(c, _)| (c == 200).then_some(()))
    });
    assert!(ready.is_some(), "prometheus did not become ready");
    (Stopped(p), port)
}

/// Every panel query of contrib/grafana/stallscope-dashboard.json, with the dashboard's
/// variables set to "all" and its rate interval to a minute.
fn dashboard_queries() -> Vec<(String, String)> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/grafana/stallscope-dashboard.json");
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = vec![];
    for p in d["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            let q = t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
                .replace("$node", ".*")
                .replace("$instance", ".*");
            out.push((p["title"].as_str().unwrap().to_string(), q));
        }
    }
    out
}

#[test]
fn all_counts_each_instance_under_its_own_label_through_prometheus() {
    let _g = serial();
    if !(can_trace()
        && have("redis-server", "--version")
        && have("valkey-server", "--version")
        && have("prometheus", "--version"))
    {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let events = tmp.path().join("events.jsonl");
    // The host redis writes an AOF (the dashboard's disk panel has calls to show).
    let a = Server::start("redis-server", &["--appendonly", "yes"]);
    let b = Server::start("valkey-server", &[]);
    let mport = free_port();
    let maddr = format!("127.0.0.1:{mport}");
    // The full mode: every syscall traced, so that each dashboard panel (syscall latency
    // included) has data; the default mode's sharing is `all_in_the_cheap_mode_...` below.
    let w = Watch::start_as_given(&[
        "--all",
        "--mode",
        "full",
        "--metrics",
        &maddr,
        "--out",
        out.to_str().unwrap(),
        "--events",
        events.to_str().unwrap(),
        "--threshold",
        "100ms",
        "--before",
        "2s",
        "--after",
        "1s",
    ]);
    assert_instances(&w, &[&a, &b]);
    assert!(
        w.wait_line("one set of bpf programs", Duration::from_secs(1)),
        "{:?}",
        w.lines()
    );
    let (_prom, pport) = prometheus(tmp.path(), &maddr);
    let mut c = Server::start("redis-server", &[]);
    let l = format!("as instance {}", c.label());
    assert!(
        w.wait_line(&l, Duration::from_secs(30)),
        "the server started after the watcher was not attached: {:?}",
        w.lines()
    );
    let mut cl = Client::connect(a.port, Duration::from_secs(10)).unwrap();
    for k in 0..200 {
        cl.cmd(&["SET", &format!("k{k}"), "v"]).unwrap();
    }
    for s in [&a, &b, &c] {
        s.debug_sleep();
    }
    for s in [&a, &b, &c] {
        let q = format!(
            "sum(stallscope_stalls_total{{instance=\"{}\",role=\"main\"}})",
            s.label()
        );
        let n = poll(Duration::from_secs(60), || {
            prom_value(pport, &q).filter(|n| *n >= 1.0)
        });
        assert!(n.is_some(), "{q}: {:?}", w.lines());
        wait_incident_reports(&out.join(s.label()), &w);
    }
    // One report of the sleep each, after the writer had time for any other (a loaded
    // machine may add a stall of its own: those are not the question).
    std::thread::sleep(Duration::from_secs(2));
    let sleeps = |j: &serde_json::Value| {
        j["stalls"]
            .as_array()
            .is_some_and(|v| v.iter().any(|s| s["syscall"] == "clock_nanosleep"))
    };
    for s in [&a, &b, &c] {
        let r: Vec<PathBuf> = incident_reports(&out.join(s.label()))
            .into_iter()
            .filter(|p| sleeps(&read_json(p)))
            .collect();
        assert_eq!(r.len(), 1, "{}: {r:?}", s.label());
    }
    let lines = std::fs::read_to_string(&events).unwrap();
    for s in [&a, &b, &c] {
        let n = lines
            .lines()
            .filter(|l| l.contains(&format!("\"instance\":\"{}\"", s.label())))
            .filter(|l| l.contains("\"syscall\":\"clock_nanosleep\""))
            .count();
        assert_eq!(n, 1, "{}: {lines}", s.label());
    }
    // A forked child's calls are routed with its parent's: a BGSAVE's writes of the
    // temporary RDB are counted under the instance. bpf names an fd from /proc when its
    // records are read: by then the child may have renamed temp-PID.rdb to the RDB's own
    // name, so its calls are classed either way.
    let mut cl = Client::connect(a.port, Duration::from_secs(10)).unwrap();
    assert!(cl
        .cmd(&["BGSAVE"])
        .unwrap()
        .text()
        .contains("Background saving started"));
    let prefix = format!(
        "stallscope_syscall_duration_seconds_count{{instance=\"{}\"",
        a.label()
    );
    let child_writes = poll(Duration::from_secs(30), || {
        let (_, body) = http_get(mport, "/metrics")?;
        body.lines()
            .any(|l| {
                l.starts_with(&prefix)
                    && (l.contains("file_class=\"rdb_temp\"") || l.contains("file_class=\"rdb\""))
            })
            .then_some(())
    });
    assert!(child_writes.is_some(), "no RDB calls under {}", a.label());
    // Every panel of the dashboard has data to show.
    poll(Duration::from_secs(20), || {
        prom_query(pport, "stallscope_instances").filter(|r| !r.is_empty())
    });
    for (title, q) in dashboard_queries() {
        let r = poll(Duration::from_secs(30), || {
            prom_query(pport, &q).filter(|r| !r.is_empty())
        });
        assert!(r.is_some(), "panel {title:?}: {q} has no data");
    }
    // The third one exits: attached 0, its cgroup's series dropped (it had them while
    // attached), its other series no longer growing; the others keep theirs.
    let of = |label: &str| -> Vec<String> {
        let i = format!("instance=\"{label}\"");
        http_get(mport, "/metrics")
            .map(|(_, body)| {
                body.lines()
                    .filter(|l| l.contains(&i))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(
        of(&c.label())
            .iter()
            .any(|l| l.starts_with("stallscope_cgroup_cpu_periods_total")),
        "{:?}",
        of(&c.label())
    );
    c.stop();
    let q = format!("stallscope_attached{{instance=\"{}\"}}", c.label());
    let zero = poll(Duration::from_secs(30), || {
        prom_value(pport, &q).filter(|v| *v == 0.0)
    });
    assert_eq!(zero, Some(0.0), "{q}: {:?}", w.lines());
    let left = poll(Duration::from_secs(30), || {
        Some(of(&c.label())).filter(|l| !l.iter().any(|l| l.starts_with("stallscope_cgroup_")))
    });
    assert!(
        left.is_some(),
        "left of {}: {:?}",
        c.label(),
        of(&c.label())
    );
    let calls = format!(
        "stallscope_syscall_duration_seconds_count{{instance=\"{}\"",
        c.label()
    );
    let before = scrape_sum(mport, &calls).expect("scrape");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(scrape_sum(mport, &calls), Some(before), "still growing");
    assert!(
        of(&a.label())
            .iter()
            .any(|l| l.starts_with("stallscope_cgroup_cpu_periods_total")),
        "{:?}",
        of(&a.label())
    );
    // The others are still attached.
    for s in [&a, &b] {
        let q = format!("stallscope_attached{{instance=\"{}\"}}", s.label());
        assert_eq!(prom_value(pport, &q), Some(1.0), "{q}");
    }
    // SIGTERM lets go of every instance and exits 0, promptly.
    let mut w = w;
    let code = w.terminate(Duration::from_secs(5));
    assert_eq!(code, Some(0), "{:?}", w.lines());
    for s in [&a, &b] {
        let mut c = Client::connect(s.port, Duration::from_secs(5)).unwrap();
        assert_eq!(c.cmd(&["PING"]).unwrap().text(), "+PONG");
    }
}

/// The default mode with several instances: one cheap tier for all (no syscall tracepoint
/// while nothing is wrong), each instance's stall counted and reported under its own label
/// by the cheap tier's record, its incident escalating that instance alone to the full tier
/// (which sees its second sleep, with the command named) while the other stays cheap.
#[test]
fn all_in_the_cheap_mode_shares_one_cheap_tier_and_escalates_each_instance_alone() {
    let _g = serial();
    if !(can_trace() && have("redis-server", "--version")) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let events = tmp.path().join("events.jsonl");
    let a = Server::start("redis-server", &[]);
    let b = Server::start("redis-server", &[]);
    let mport = free_port();
    let w = Watch::start_as_given(&[
        "--all",
        "--metrics",
        &format!("127.0.0.1:{mport}"),
        "--out",
        out.to_str().unwrap(),
        "--events",
        events.to_str().unwrap(),
        "--threshold",
        "100ms",
        "--after",
        "2s",
    ]);
    assert!(
        w.wait_line("with one cheap tier for all", Duration::from_secs(30)),
        "{:?}",
        w.lines()
    );
    assert_instances(&w, &[&a, &b]);
    assert!(
        !w.lines().iter().any(|l| l.contains("escalating")
            && (l.contains(&a.child.id().to_string()) || l.contains(&b.child.id().to_string()))),
        "escalated before any stall: {:?}",
        w.lines()
    );
    // a's stall: the cheap tier sees the first sleep and escalates a only; the full tier,
    // attached within --after, sees the second with the command named.
    a.debug_sleep();
    let esc_a = format!("every syscall of {} traced", a.child.id());
    assert!(
        w.wait_line(&esc_a, Duration::from_secs(30)),
        "{:?}",
        w.lines()
    );
    let full_a = format!("watching {} (", a.child.id());
    assert!(
        w.wait_line(&full_a, Duration::from_secs(30)),
        "{:?}",
        w.lines()
    );
    std::thread::sleep(Duration::from_millis(300));
    a.debug_sleep();
    let j = read_json(&wait_incident_reports(&out.join(a.label()), &w)[0]);
    assert!(
        j["watch_tiers"]["full_from"].is_string(),
        "{}",
        j["watch_tiers"]
    );
    let stalls = j["stalls"].as_array().unwrap();
    assert!(
        stalls
            .iter()
            .any(|s| s["syscall"] == "clock_nanosleep" && s["waiting_by_command"]["DEBUG"] == 1),
        "the full tier saw a's second sleep: {stalls:?}"
    );
    let esc_b = format!("every syscall of {} traced", b.child.id());
    assert!(
        !w.lines().iter().any(|l| l.contains(&esc_b)),
        "b escalated with a: {:?}",
        w.lines()
    );
    // b's stall, seen by the same cheap tier, under b's label only.
    b.debug_sleep();
    wait_incident_reports(&out.join(b.label()), &w);
    let lines = std::fs::read_to_string(&events).unwrap();
    for s in [&a, &b] {
        let sleeps = lines
            .lines()
            .filter(|l| l.contains(&format!("\"instance\":\"{}\"", s.label())))
            .filter(|l| l.contains("nanosleep"))
            .count();
        assert!(sleeps >= 1, "{}: {lines}", s.label());
    }
    let attached = poll(Duration::from_secs(10), || {
        let body = http_get(mport, "/metrics")?.1;
        let n = [&a, &b]
            .iter()
            .filter(|s| {
                body.contains(&format!(
                    "stallscope_attached{{instance=\"{}\"}} 1",
                    s.label()
                ))
            })
            .count();
        (n == 2).then_some(n)
    });
    assert_eq!(attached, Some(2), "{:?}", w.lines());
}

#[test]
fn several_matches_attach_asks_for_one_and_watch_name_takes_them_all() {
    let _g = serial();
    if !(can_trace() && have("redis-server", "--version")) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = Command::new("sh")
        .args(["-c", "command -v redis-server"])
        .output()
        .unwrap();
    let src = String::from_utf8_lossy(&src.stdout).trim().to_string();
    let name = format!("redis-fl-{:02}", std::process::id() % 100);
    let bin = tmp.path().join(&name);
    std::fs::copy(&src, &bin).unwrap();
    let a = Server::start(bin.to_str().unwrap(), &[]);
    let b = Server::start(bin.to_str().unwrap(), &[]);
    let o = Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args(["attach", "--name", &name, "-d", "1s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for s in [&a, &b] {
        assert!(err.contains(&s.child.id().to_string()), "{err}");
        assert!(
            err.contains(&format!("listening on {}", s.label())),
            "{err}"
        );
    }
    assert!(err.contains("--pid"), "{err}");
    let mport = free_port();
    let w = Watch::start_as_given(&["--name", &name, "--metrics", &format!(":{mport}")]);
    assert_instances(&w, &[&a, &b]);
    let attached = poll(Duration::from_secs(10), || {
        scrape_sum(mport, "stallscope_attached{").filter(|n| *n == 2.0)
    });
    assert_eq!(attached, Some(2.0));
}

#[test]
fn all_with_ptrace_is_refused() {
    let o = Command::new(env!("CARGO_BIN_EXE_stallscope"))
        .args(["watch", "--all", "--backend", "ptrace"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("stallscope: error: --backend ptrace") && err.contains("--pid"),
        "{err}"
    );
}

#[test]
fn alert_rules_pass_promtool() {
    if !have("promtool", "--version") {
        return;
    }
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/stallscope-alerts.yml");
    let o = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let say = String::from_utf8_lossy(&o.stdout);
    assert!(say.contains("SUCCESS"), "{say}");
}
