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
    let w = Watch::start(&args);
    assert!(
        w.wait_line(&format!("watching {pid} with the cheap tier"), LONG),
        "{:?}",
        w.lines()
    );
    w
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
        let e = event(&events, n);
        n += 1;
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
    let tmp = tempfile::tempdir().unwrap();
    let fs = SlowFs::mount(tmp.path());
    let (redis, log) = redis_on(&fs, tmp.path());
    let events = tmp.path().join("events.jsonl");
    let out = tmp.path().join("incidents");
    let w = watch_cheap(
        redis.pid(),
        &events,
        &log,
        &["--out", out.to_str().unwrap(), "--after", "2s"],
    );
    timed(redis.port, &["DEBUG", "SLEEP", "0.3"]);
    assert!(w.wait_line("escalating", LONG), "{:?}", w.lines());
    // What follows, seen by the full tier: a second sleep within --after.
    assert!(w.wait_line("watching", LONG), "{:?}", w.lines());
    std::thread::sleep(Duration::from_millis(300));
    timed(redis.port, &["DEBUG", "SLEEP", "0.2"]);
    assert!(w.wait_line("incident written", LONG), "{:?}", w.lines());
    assert!(
        w.wait_line("back to the cheap tier", LONG),
        "{:?}",
        w.lines()
    );
    let json = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .expect("an incident report");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
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
    drop(w);
    redis.assert_unharmed();
}

#[test]
fn past_the_incident_rate_limit_a_stall_is_counted_without_escalating() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fs = SlowFs::mount(tmp.path());
    let (redis, log) = redis_on(&fs, tmp.path());
    let events = tmp.path().join("events.jsonl");
    let out = tmp.path().join("incidents");
    let w = watch_cheap(
        redis.pid(),
        &events,
        &log,
        &[
            "--out",
            out.to_str().unwrap(),
            "--after",
            "1s",
            "--max-incidents-per-hour",
            "1",
        ],
    );
    timed(redis.port, &["DEBUG", "SLEEP", "0.3"]);
    assert!(w.wait_line("incident written", LONG), "{:?}", w.lines());
    assert!(
        w.wait_line("back to the cheap tier", LONG),
        "{:?}",
        w.lines()
    );
    // The hour's one incident is written: the next stall is counted by the cheap tier (an
    // events line, as every stall) and the full tier stays off.
    let seen = std::fs::read_to_string(&events).unwrap().lines().count();
    timed(redis.port, &["DEBUG", "SLEEP", "0.3"]);
    let sleep_seen = (seen..seen + 20).any(|n| {
        let e = event(&events, n);
        e["syscall"].as_str().unwrap_or("").contains("nanosleep")
    });
    assert!(sleep_seen, "{:?}", std::fs::read_to_string(&events));
    std::thread::sleep(Duration::from_millis(500));
    let escalations = w
        .lines()
        .iter()
        .filter(|l| l.contains("escalating"))
        .count();
    assert_eq!(escalations, 1, "{:?}", w.lines());
    drop(w);
    redis.assert_unharmed();
}
