//! `stallscope watch`'s default mode (the cheap tier: no syscall tracepoint until a stall)
//! against a real redis-server whose data directory and log file are on slowfs: a few runs
//! each of a DEBUG SLEEP (a blocked syscall, named), an EVAL busy loop (a main-thread gap on
//! a CPU) and a close() of redis's log file held by slowfs (the call and the file named),
//! each found with a duration between what was injected (less a sampling period) and what
//! the client waited; then one incident written with `--out`: the full tier was attached for
//! it and the report says which tier saw what. Serial (`serial()`), deadlines everywhere;
//! needs root, BPF and slowfs (a failure under CI=true, a skip otherwise).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{ci, serial, Client, Redis};
use crate::live_edges::{missing, SlowFs};
use crate::live_watch::Watch;

const LONG: Duration = Duration::from_secs(60);
const RUNS: usize = 3;
/// The sampling period the tests run with (`--sample-period`), s.
const PERIOD: f64 = 0.002;

fn can_run() -> bool {
    let why = if unsafe { libc::geteuid() } != 0 {
        Some("the cheap tier's BPF programs need root".to_string())
    } else {
        missing()
    };
    match why {
        None => true,
        Some(w) if ci() => panic!("{w} (under CI=true)"),
        Some(w) => {
            eprintln!("skipping: {w}");
            false
        }
    }
}

/// A watcher in the cheap mode on `pid`, once it says it watches with the cheap tier.
fn watch_cheap(pid: u32, events: &Path, log: &Path, extra: &[&str]) -> Watch {
    let (pid_s, events, log) = (
        pid.to_string(),
        events.to_str().unwrap(),
        log.to_str().unwrap(),
    );
    let mut args = vec!["--mode", "cheap", "--pid", &pid_s, "--threshold", "50ms"];
    args.extend([
        "--sample-period",
        "2ms",
        "--events",
        events,
        "--redis-log",
        log,
    ]);
    args.extend(extra);
    Watch::start_until(&args, &format!("watching {pid} with the cheap tier"), LONG)
}

/// The `n`th line of the events file (0-based), once it is there.
fn event(path: &Path, n: usize) -> serde_json::Value {
    let t = Instant::now();
    while t.elapsed() < LONG {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(l) = text.lines().nth(n) {
            return serde_json::from_str(l).expect("an events line is JSON");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no event line {n} in {}", path.display());
}

/// Sends one command and returns how long the client waited for its reply, s.
fn timed(port: u16, args: &[&str]) -> f64 {
    let mut c = Client::connect(port, LONG).expect("connect");
    let t = Instant::now();
    let r = c.cmd(args).expect("reply");
    let waited = t.elapsed().as_secs_f64();
    assert!(!r.text().starts_with('-'), "{args:?}: {}", r.text());
    waited
}

const BUSY_EVAL: &str = "local t = redis.call('TIME') local s = t[1] + t[2] / 1e6 \
    while true do local n = redis.call('TIME') if n[1] + n[2] / 1e6 - s > 0.5 then break end end \
    return 1";

fn redis_on(fs: &SlowFs, dir: &Path) -> (Redis, std::path::PathBuf) {
    let data = fs.mnt.to_string_lossy().into_owned();
    let log = fs.mnt.join("redis.log");
    let redis = Redis::start_in(
        dir,
        &[
            "--dir",
            &data,
            "--logfile",
            log.to_str().unwrap(),
            "--appendonly",
            "no",
            "--enable-debug-command",
            "local",
        ],
    );
    (redis, log)
}

/// A redis on slowfs and a cheap-mode watcher of it writing incidents into `out` (fields
/// dropped in this order: the watcher first, the temporary directory last).
struct Rig {
    w: Watch,
    redis: Redis,
    events: std::path::PathBuf,
    out: std::path::PathBuf,
    _fs: SlowFs,
    _tmp: tempfile::TempDir,
}

impl Rig {
    fn start(extra: &[&str]) -> Rig {
        let tmp = tempfile::tempdir().unwrap();
        let fs = SlowFs::mount(tmp.path());
        let (redis, log) = redis_on(&fs, tmp.path());
        let events = tmp.path().join("events.jsonl");
        let out = tmp.path().join("incidents");
        let mut args = vec!["--out", out.to_str().unwrap()];
        args.extend(extra);
        let w = watch_cheap(redis.pid(), &events, &log, &args);
        Rig {
            w,
            redis,
            events,
            out,
            _fs: fs,
            _tmp: tmp,
        }
    }
}

/// Checks event `e` against a stall of at least `injected` s that the client waited
/// `waited` s for.
fn check_duration(e: &serde_json::Value, injected: f64, waited: f64) {
    let d = e["duration_s"].as_f64().unwrap_or(0.0);
    assert!(
        d >= injected - 2.0 * PERIOD && d <= waited + PERIOD,
        "{d} s for an injected {injected} s the client waited {waited} s for: {e}"
    );
}

#[test]
fn the_cheap_tier_finds_and_names_a_sleep_a_busy_script_and_a_slow_close() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fs = SlowFs::mount(tmp.path());
    let (redis, log) = redis_on(&fs, tmp.path());
    let events = tmp.path().join("events.jsonl");
    let w = watch_cheap(redis.pid(), &events, &log, &[]);
    let mut n = 0;
    for _ in 0..RUNS {
        let waited = timed(redis.port, &["DEBUG", "SLEEP", "0.3"]);
        let e = event(&events, n);
        n += 1;
        assert_eq!(e["kind"], "slow_syscall", "{e}");
        assert!(
            e["syscall"].as_str().unwrap_or("").contains("nanosleep"),
            "{e}"
        );
        assert_eq!(e["thread"], "main", "{e}");
        check_duration(&e, 0.3, waited);

        let waited = timed(redis.port, &["EVAL", BUSY_EVAL, "0"]);
        let e = event(&events, n);
        n += 1;
        assert_eq!(e["kind"], "gap", "{e}");
        assert_eq!(e["thread"], "main", "{e}");
        check_duration(&e, 0.5, waited);

        fs.send(r#"{"rules": [{"op": "flush", "match": "redis.log", "ms": 400}]}"#);
        let waited = timed(redis.port, &["DEBUG", "LOG", "cheap tier test"]);
        fs.send(r#"{"rules": []}"#);
        // On a loaded machine slowfs itself may hold the log's open() past the threshold:
        // that is a stall too, named, and not the one looked for here.
        let mut e = event(&events, n);
        n += 1;
        while e["syscall"] == "openat" && e["path"].is_null() {
            e = event(&events, n);
            n += 1;
        }
        assert_eq!(e["syscall"], "close", "{e}");
        assert!(
            e["path"].as_str().unwrap_or("").ends_with("/redis.log"),
            "{e}"
        );
        check_duration(&e, 0.4, waited);
    }
    assert!(
        !w.lines().iter().any(|l| l.contains("syscall programs")),
        "no escalation without --out: {:?}",
        w.lines()
    );
    drop(w);
    redis.assert_unharmed();
}

#[test]
fn a_cheap_stall_escalates_to_the_full_tier_for_its_incident() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let rig = Rig::start(&["--after", "2s"]);
    let (w, redis, out) = (&rig.w, &rig.redis, &rig.out);
    timed(redis.port, &["DEBUG", "SLEEP", "0.3"]);
    w.assert_line("escalating", LONG);
    // What follows, seen by the full tier (once it traces: its own "watching" line, not the
    // cheap tier's): a second sleep within --after.
    w.assert_line("with bpf as instance", LONG);
    std::thread::sleep(Duration::from_millis(300));
    timed(redis.port, &["DEBUG", "SLEEP", "0.2"]);
    w.assert_line("incident written", LONG);
    w.assert_line("back to the cheap tier", LONG);
    let (_, r) = reports(out).into_iter().next().expect("an incident report");
    let tiers = &r["watch_tiers"];
    assert_eq!(tiers["cheap_stalls"], 1, "{tiers}");
    assert_eq!(tiers["sample_period_us"], 2000, "{tiers}");
    assert!(tiers["full_from"].is_string(), "{tiers}");
    let stalls = r["stalls"].as_array().unwrap();
    let cheap: Vec<_> = stalls
        .iter()
        .filter(|s| s["cause"].as_str().unwrap_or("").starts_with("cheap tier"))
        .collect();
    assert_eq!(cheap.len(), 1, "{stalls:?}");
    assert!(cheap[0]["syscall"]
        .as_str()
        .unwrap_or("")
        .contains("nanosleep"));
    // The full tier's own stall names the command it held up.
    let full = stalls
        .iter()
        .find(|s| !s["cause"].as_str().unwrap_or("").starts_with("cheap tier"))
        .unwrap_or_else(|| panic!("the full tier saw the second sleep: {stalls:?}"));
    assert_eq!(full["waiting_by_command"]["DEBUG"], 1, "{full}");
    drop(rig.w);
    redis.assert_unharmed();
}

/// A sleep sent right after the one that escalates is under way when the full tier's
/// programs are attached: the full tier sees only its end. The cheap tier, read beside the
/// full tier, counts it whole, once, in --events and in the incident's report (before, its
/// record was dropped as the full tier's, and the stall was the full tier's part of it).
#[test]
fn a_stall_under_way_when_the_full_tier_attaches_is_counted_whole_and_once() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let rig = Rig::start(&["--after", "2s"]);
    let (w, redis, events, out) = (&rig.w, &rig.redis, &rig.events, &rig.out);
    let mut c = Client::connect(redis.port, LONG).expect("connect");
    c.cmd(&["DEBUG", "SLEEP", "0.1"]).expect("reply");
    // Sent at once: the cheap tier reads its ring every 20 ms, and escalating loads programs.
    c.cmd(&["DEBUG", "SLEEP", "0.6"]).expect("reply");
    w.assert_line("back to the cheap tier", LONG);
    let sleeps = |v: &[serde_json::Value]| -> Vec<f64> {
        v.iter()
            .filter(|e| e["thread"] == "main")
            .filter(|e| e["syscall"].as_str().unwrap_or("").contains("nanosleep"))
            .map(|e| e["duration_s"].as_f64().unwrap_or(0.0))
            .collect()
    };
    let text = std::fs::read_to_string(events).unwrap();
    let logged: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let got = sleeps(&logged);
    assert_eq!(got.len(), 2, "two sleeps, each once: {text}");
    assert!(got[1] >= 0.6 - 2.0 * PERIOD, "the second whole: {got:?}");
    let reps = reports(out);
    assert_eq!(reps.len(), 1, "one incident");
    let stalls: Vec<serde_json::Value> = reps[0].1["stalls"].as_array().unwrap().clone();
    let in_report: Vec<u64> = stalls
        .iter()
        .filter(|s| s["syscall"].as_str().unwrap_or("").contains("nanosleep"))
        .map(|s| s["duration_us"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(
        in_report.len(),
        2,
        "each sleep once in the report: {stalls:?}"
    );
    assert!(
        in_report
            .iter()
            .any(|d| *d as f64 >= (0.6 - 2.0 * PERIOD) * 1e6),
        "{in_report:?}"
    );
    drop(rig.w);
    redis.assert_unharmed();
}

/// Until redis lists a client whose last command was the poller's slow log peek: its first
/// round is done, and what redis signals from now on is new to it.
fn wait_poller_primed(port: u16) {
    let primed = crate::common::poll(LONG, || {
        let mut c = Client::connect(port, LONG).ok()?;
        let list = c.cmd(&["CLIENT", "LIST"]).ok()?.text();
        list.contains("cmd=slowlog").then_some(())
    });
    assert!(
        primed.is_some(),
        "the --redis poller never read the slow log"
    );
}

/// The incident reports written so far, parsed, oldest first.
fn reports(dir: &Path) -> Vec<(String, serde_json::Value)> {
    crate::live_watch::incident_reports(dir)
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                serde_json::from_str(&text).unwrap(),
            )
        })
        .collect()
}

/// A stall the cheap tier cannot report (a 0.3 s sleep under a 2 s threshold) that redis's
/// latency monitor (threshold 50 ms) records: the LATENCY event escalates the cheap tier,
/// and the incident's report says what triggered it and that the full tier saw only what
/// followed; then a 30 ms command, under the latency monitor's threshold and over the slow
/// log's, escalates by the slow log.
#[test]
fn redis_signals_escalate_the_cheap_tier() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let redis = Redis::start(&[
        "--enable-debug-command",
        "local",
        "--latency-monitor-threshold",
        "50",
        "--slowlog-log-slower-than",
        "20000",
    ]);
    let tmp = tempfile::tempdir().unwrap();
    let (events, out) = (tmp.path().join("events.jsonl"), tmp.path().join("out"));
    let addr = format!("127.0.0.1:{}", redis.port);
    let mport = crate::common::free_port();
    let args = [
        "--mode",
        "cheap",
        "--pid",
        &redis.pid().to_string(),
        "--threshold",
        "2s",
        "--after",
        "1s",
        "--redis",
        &addr,
        "--out",
        out.to_str().unwrap(),
        "--events",
        events.to_str().unwrap(),
        "--metrics",
        &format!("127.0.0.1:{mport}"),
    ];
    let mut w = Watch::start_until(&args, "with the cheap tier", LONG);
    wait_poller_primed(redis.port);
    let waited = timed(redis.port, &["DEBUG", "SLEEP", "0.3"]);
    assert!(waited >= 0.3, "{waited}");
    w.assert_line("escalating (latency-event)", LONG);
    w.assert_line("back to the cheap tier", LONG);
    let all = reports(&out);
    assert_eq!(all.len(), 1, "{:?}", w.lines());
    let (name, r) = &all[0];
    assert!(name.contains("redis-latency-command"), "{name}");
    let t = &r["watch_tiers"];
    assert_eq!(t["trigger"], "latency-event", "{t}");
    assert_eq!(t["cheap_stalls"], 0, "{t}");
    let sig = &t["redis_signal"];
    assert_eq!(sig["source"], "latency", "{sig}");
    assert_eq!(sig["name"], "command", "{sig}");
    let d = sig["duration_us"].as_i64().unwrap();
    assert!(
        d >= 300_000 && d as f64 <= waited * 1e6 + 1000.0,
        "{sig}: the client waited {waited} s"
    );
    assert!(t["full_from"].is_string(), "{t}");
    let notes = t["notes"].to_string();
    assert!(notes.contains("shorter than --threshold"), "{notes}");
    assert!(notes.contains("saw only what followed"), "{notes}");
    // No stall over the threshold: no --events line.
    assert_eq!(std::fs::read_to_string(&events).unwrap_or_default(), "");
    let esc = |trigger: &str| {
        crate::live_watch::metric(
            mport,
            &format!("stallscope_escalations_total{{instance=\"{addr}\",trigger=\"{trigger}\"}}"),
        )
    };
    assert_eq!(esc("latency-event"), Some(1.0));
    assert_eq!(esc("stall"), Some(0.0));

    // Redis stamps its signals to the second: a stall in the second the full tier let go
    // is taken as that incident's.
    std::thread::sleep(Duration::from_millis(1100));
    timed(redis.port, &["DEBUG", "SLEEP", "0.03"]);
    w.assert_line("escalating (slowlog)", LONG);
    let got = crate::common::poll(LONG, || {
        let all = reports(&out);
        (all.len() == 2).then_some(all)
    })
    .unwrap_or_else(|| panic!("no second report: {:?}", w.lines()));
    let t = &got[1].1["watch_tiers"];
    assert_eq!(t["trigger"], "slowlog", "{t}");
    assert_eq!(t["redis_signal"]["name"], "DEBUG", "{t}");
    assert_eq!(esc("slowlog"), Some(1.0));
    assert_eq!(w.terminate(LONG), Some(0));
    redis.assert_unharmed();
}

/// The first line of the events file that `pred` accepts, once it is there.
fn event_where(path: &Path, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    crate::common::poll(LONG, || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|e| pred(e))
    })
    .unwrap_or_else(|| {
        panic!(
            "no such event in {}:\n{}",
            path.display(),
            std::fs::read_to_string(path).unwrap_or_default()
        )
    })
}

/// A BGSAVE child's write of its temporary RDB, held 400 ms by slowfs, is seen by the cheap
/// tier (the child is followed from its fork) and named: the child's thread, the call, the
/// file. slowfs then holds the child's fsync until the test lets it go, so the child still
/// has the file open when its write's record is read (a child's fds are read from /proc
/// while it lives).
#[test]
fn the_cheap_tier_follows_a_bgsave_child() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fs = SlowFs::mount(tmp.path());
    let (redis, log) = redis_on(&fs, tmp.path());
    let mut c = redis.client();
    for i in 0..100 {
        c.cmd(&["SET", &format!("k{i}"), "v"]).unwrap();
    }
    let events = tmp.path().join("events.jsonl");
    let w = watch_cheap(redis.pid(), &events, &log, &[]);
    fs.send(
        r#"{"rules": [{"op": "write", "match": "temp-*.rdb", "ms": 400},
                      {"op": "fsync", "match": "temp-*.rdb", "ms": 60000}]}"#
            .replace('\n', " ")
            .as_str(),
    );
    assert!(c
        .cmd(&["BGSAVE"])
        .unwrap()
        .text()
        .contains("Background saving started"));
    let e = event_where(&events, |e| e["thread"] == "child");
    fs.send(r#"{"rules": [], "release": true}"#);
    assert_eq!(e["syscall"], "write", "{e}");
    assert_ne!(e["pid"], redis.pid(), "{e}");
    let path = e["path"].as_str().unwrap_or("");
    assert!(
        path.contains("temp-") && path.ends_with(".rdb"),
        "the child's temporary RDB: {e}"
    );
    assert!(
        e["cause"].as_str().unwrap_or("").contains("forked child"),
        "{e}"
    );
    check_duration(&e, 0.4, 60.0);
    let done = crate::common::poll(LONG, || {
        (c.info_field("persistence", "rdb_bgsave_in_progress")
            .as_deref()
            == Some("0"))
        .then_some(())
    });
    assert!(done.is_some(), "the BGSAVE did not end");
    drop(w);
    redis.assert_unharmed();
}

#[test]
fn past_the_incident_rate_limit_a_stall_is_counted_without_escalating() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let rig = Rig::start(&["--after", "1s", "--max-incidents-per-hour", "1"]);
    let (w, redis, events) = (&rig.w, &rig.redis, &rig.events);
    timed(redis.port, &["DEBUG", "SLEEP", "0.3"]);
    w.assert_line("incident written", LONG);
    w.assert_line("back to the cheap tier", LONG);
    // The hour's one incident is written: the next stall is counted by the cheap tier (an
    // events line, as every stall) and the full tier stays off.
    let seen = std::fs::read_to_string(events).unwrap().lines().count();
    timed(redis.port, &["DEBUG", "SLEEP", "0.3"]);
    let sleep_seen = (seen..seen + 20).any(|n| {
        let e = event(events, n);
        e["syscall"].as_str().unwrap_or("").contains("nanosleep")
    });
    assert!(sleep_seen, "{:?}", std::fs::read_to_string(events));
    std::thread::sleep(Duration::from_millis(500));
    let escalations = w
        .lines()
        .iter()
        .filter(|l| l.contains("escalating"))
        .count();
    assert_eq!(escalations, 1, "{:?}", w.lines());
    drop(rig.w);
    redis.assert_unharmed();
}
