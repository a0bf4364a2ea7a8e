//! redis's own signals joined to the stalls, end to end. Offline on the captures in
//! `fixtures/` that carry redis's log (`NAME.redis.log`, found beside the trace without a
//! flag); live with `attach --redis` against a redis-server of the test's own. The expected
//! figures come from the log files and slowfs's record of what it injected, read here
//! independently of stallscope.

use assert_cmd::Command;
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::{ci, json, serial, Attach, Redis};

fn fixture(name: &str, file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
        .join(file)
}

fn run(args: &[&str]) -> (i32, Value, String) {
    let out = Command::cargo_bin("stallscope")
        .unwrap()
        .arg("analyze")
        .args(args)
        .args(["--format", "json"])
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(code == 0 || code == 1, "exit {code}: {err}");
    (
        code,
        serde_json::from_slice(&out.stdout).expect("JSON"),
        err,
    )
}

fn capture(name: &str, extra: &[&str]) -> Value {
    let t = fixture(name, &format!("{name}.strace.gz"));
    let mut args = vec![t.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(&args).1
}

fn stalls(r: &Value) -> &Vec<Value> {
    r["stalls"].as_array().unwrap()
}

fn evidence(s: &Value) -> Vec<&Value> {
    s["redis_evidence"]
        .as_array()
        .unwrap_or_else(|| panic!("no redis_evidence on {s}"))
        .iter()
        .collect()
}

/// `HH:MM:SS.mmm` of a redis 3+ log line, in ms of the day.
fn log_ms(line: &str) -> Option<(String, i64)> {
    let mut it = line.split(' ');
    let _pid_role = it.next()?;
    let (d, m, y, t) = (it.next()?, it.next()?, it.next()?, it.next()?);
    let (hms, ms) = t.split_once('.')?;
    let p: Vec<i64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
    Some((
        format!("{d} {m} {y}"),
        ((p[0] * 60 + p[1]) * 60 + p[2]) * 1000 + ms.parse::<i64>().ok()?,
    ))
}

/// ms of the day of an ISO 8601 time (`2026-12-01T07:44:24.001166+00:00`).
fn iso_ms(s: &str) -> i64 {
    let t = &s[11..23];
    let p: Vec<f64> = t.split(':').map(|x| x.parse().unwrap()).collect();
    ((p[0] * 3600.0 + p[1] * 60.0 + p[2]) * 1000.0).floor() as i64
}

#[test]
fn everysec_taking_too_long_lines_sit_on_the_main_threads_aof_write_stalls() {
    let name = "everysec-slowfs";
    let threads = fixture(name, &format!("{name}.threads.txt"));
    let r = capture(name, &["--threads", threads.to_str().unwrap()]);
    let log = std::fs::read_to_string(fixture(name, &format!("{name}.redis.log"))).unwrap();
    let too_long: Vec<i64> = log
        .lines()
        .filter(|l| l.contains("Asynchronous AOF fsync is taking too long"))
        .filter_map(|l| log_ms(l).map(|x| x.1))
        .collect();
    assert!(
        too_long.len() >= 3,
        "the fixture has the lines: {too_long:?}"
    );
    // The trace is -tt without --date: the date came from the log.
    assert_eq!(r["redis"]["date_from_log"], "2026-12-01");
    assert!(r["summary"]["start_iso"]
        .as_str()
        .unwrap()
        .starts_with("2026-12-01T07:44:"));
    assert!(r["redis"]["clock"]
        .as_str()
        .unwrap()
        .contains("taken from redis's log"));
    assert_eq!(r["redis"]["log"]["found"], "beside the trace");
    let start = iso_ms(r["summary"]["start_iso"].as_str().unwrap());
    let end = start + r["summary"]["span_us"].as_i64().unwrap() / 1000;
    let in_trace: Vec<i64> = too_long
        .iter()
        .copied()
        .filter(|t| (start..=end).contains(t))
        .collect();
    // Every main-thread AOF write stall has the line, stamped within 20 ms before it
    // began; and every such line in the trace's window is on one of those stalls.
    let writes: Vec<&Value> = stalls(&r)
        .iter()
        .filter(|s| s["thread"] == "main" && s["syscall"] == "write" && s["class"] == "aof")
        .collect();
    assert!(!writes.is_empty());
    let mut matched = vec![];
    for s in &writes {
        let begin = iso_ms(s["ts_iso"].as_str().unwrap());
        let ev: Vec<&Value> = evidence(s)
            .into_iter()
            .filter(|e| {
                e["source"] == "log" && e["what"].as_str().unwrap().contains("taking too long")
            })
            .collect();
        assert_eq!(ev.len(), 1, "stall at {}: {:?}", s["ts"], evidence(s));
        let at = iso_ms(ev[0]["ts"].as_str().unwrap());
        assert!(
            begin - 20 <= at && at <= begin,
            "line at {at} for a stall at {begin}"
        );
        assert!(ev[0]["what"]
            .as_str()
            .unwrap()
            .starts_with("written just before the stall"));
        matched.push(at);
    }
    matched.sort();
    assert_eq!(matched, in_trace, "every in-window line on a write stall");
    // And the finding says so.
    let f = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "aof-write-pending-fsync")
        .expect("the pending-fsync finding");
    let sig = f["redis_signals"].as_str().unwrap();
    assert!(
        sig.contains("Asynchronous AOF fsync is taking too long"),
        "{sig}"
    );
    assert!(
        sig.contains(&format!("{} of {} stalls", writes.len(), writes.len())),
        "{sig}"
    );
    // Offline nothing asked LATENCY or SLOWLOG: no claim about them.
    assert!(
        !sig.contains("LATENCY") && !sig.contains("SLOWLOG"),
        "{sig}"
    );
}

#[test]
fn everysec_write_stalls_match_what_slowfs_injected() {
    // Ground truth of the harness: each main-thread write stall lies inside one 3 s fsync
    // delay that slowfs applied to the bio thread.
    let name = "everysec-slowfs";
    let threads = fixture(name, &format!("{name}.threads.txt"));
    let r = capture(name, &["--threads", threads.to_str().unwrap()]);
    let csv = std::fs::read_to_string(fixture(name, &format!("{name}.slowfs-delays.csv"))).unwrap();
    let delays: Vec<(f64, f64)> = csv
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[2] == "fsync" && f[5].parse::<f64>().ok()? >= 2999.0)
                .then(|| (f[0].parse().unwrap(), f[1].parse().unwrap()))
        })
        .collect();
    let day0 = 1_796_083_200.0; // 2026-12-01T00:00:00Z
    for s in stalls(&r)
        .iter()
        .filter(|s| s["thread"] == "main" && s["syscall"] == "write")
    {
        let b = day0 + iso_ms(s["ts_iso"].as_str().unwrap()) as f64 / 1000.0;
        let e = b + s["duration_us"].as_f64().unwrap() / 1e6;
        assert!(
            delays.iter().any(|(d0, d1)| *d0 <= b && e <= *d1 + 0.05),
            "write stall {b}..{e} inside no injected fsync delay {delays:?}"
        );
    }
}

#[test]
fn log_file_stalls_carry_the_line_redis_was_writing() {
    let name = "slow-log-close-bgsave-f";
    let r = capture(name, &[]);
    let log = std::fs::read_to_string(fixture(name, &format!("{name}.redis.log"))).unwrap();
    let lines: Vec<(i64, &str)> = log
        .lines()
        .filter_map(|l| log_ms(l).map(|(_, ms)| (ms, l)))
        .collect();
    let log_stalls: Vec<&Value> = stalls(&r).iter().filter(|s| s["class"] == "log").collect();
    assert_eq!(
        log_stalls.len(),
        3,
        "EXPECTED.md: three close() stalls on redis.log"
    );
    for s in log_stalls {
        let begin = iso_ms(s["ts_iso"].as_str().unwrap());
        let ev = evidence(s);
        let written: Vec<&&Value> = ev
            .iter()
            .filter(|e| {
                e["what"]
                    .as_str()
                    .unwrap()
                    .starts_with("the line being written")
            })
            .collect();
        assert_eq!(written.len(), 1, "{ev:?}");
        // The main process's last line stamped at or before the stall's start (ms truncated).
        let want = lines
            .iter()
            .rfind(|(ms, l)| *ms <= begin && l.starts_with("27995:M"))
            .unwrap();
        let msg = want.1.splitn(7, ' ').nth(6).unwrap();
        let what = written[0]["what"].as_str().unwrap();
        assert!(what.contains(&msg[..msg.len().min(40)]), "{what} vs {msg}");
        assert!(
            begin - want.0 <= 1,
            "the line is the one written just before"
        );
    }
    let f = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "log-file-blocking")
        .unwrap();
    assert!(f["redis_signals"]
        .as_str()
        .unwrap()
        .contains("the line it was writing when the stall began (3 of 3 stalls)"));
    assert!(f["evidence"]
        .as_str()
        .unwrap()
        .contains("Redis's own signals"));
}

#[test]
fn bgsave_start_and_end_lines_are_on_the_phase() {
    for (name, child) in [
        ("slow-log-close-bgsave-f", 28169),
        ("bgsave-cow-ttt", 13504),
    ] {
        let r = capture(name, &[]);
        let p = r["phases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["child_pid"] == child)
            .unwrap_or_else(|| panic!("{name}: no phase of child {child}"));
        let whats: Vec<&str> = evidence(p)
            .iter()
            .map(|e| e["what"].as_str().unwrap())
            .collect();
        let has = |s: &str| whats.iter().any(|w| w.contains(s));
        assert!(
            has(&format!("Background saving started by pid {child}")),
            "{name}: {whats:?}"
        );
        assert!(
            has("Background saving terminated with success"),
            "{name}: {whats:?}"
        );
        assert!(has("DB saved on disk"), "{name}: {whats:?}");
        // In time order, the start first.
        assert!(whats[0].contains("started by pid"), "{name}: {whats:?}");
        let ats: Vec<i64> = evidence(p)
            .iter()
            .map(|e| e["at_us"].as_i64().unwrap())
            .collect();
        assert!(ats.windows(2).all(|w| w[0] <= w[1]));
        // The parent logs the start once fork() has returned: after the clone began, within
        // the fork's own time plus the ms the stamp is truncated to (and 20 ms of slack).
        let start = p["start_at_us"].as_i64().unwrap();
        let fork = p["fork_us"].as_i64().unwrap();
        assert!(
            ats[0] >= start - 1_000 && ats[0] <= start + fork + 20_000,
            "{name}: {} vs {start} + {fork}",
            ats[0]
        );
    }
    // -ttt: the epoch clock, no date to infer.
    let r = capture("bgsave-cow-ttt", &[]);
    assert!(r["redis"]["date_from_log"].is_null());
    assert!(r["redis"]["clock"].as_str().unwrap().contains("epoch"));
}

#[test]
fn an_explicit_date_wins_and_an_explicit_log_must_exist() {
    let name = "slow-log-close-bgsave-f";
    let r = capture(name, &["--date", "2026-11-30Z"]);
    assert!(r["redis"]["date_from_log"].is_null());
    assert!(r["redis"]["clock"].as_str().unwrap().contains("--date"));
    let with = |r: &Value| -> Vec<usize> { stalls(r).iter().map(|s| evidence(s).len()).collect() };
    assert_eq!(
        with(&r),
        with(&capture(name, &[])),
        "the same join as with the inferred date"
    );
    // The child's 89 ms fsync of its RDB is followed by its "DB saved on disk".
    let child = stalls(&r).iter().find(|s| s["thread"] == "child").unwrap();
    assert!(evidence(child).iter().any(|e| e["what"]
        .as_str()
        .unwrap()
        .starts_with("written just after the stall; the save child finished writing")));
    // A wrong date: the log lies outside the trace, and nothing is joined.
    let r = capture(name, &["--date", "2026-11-29Z"]);
    assert!(stalls(&r).iter().all(|s| evidence(s).is_empty()));
    assert!(r["redis"]["notes"][0]
        .as_str()
        .unwrap()
        .contains("begins after the trace ended"));
    let t = fixture(name, &format!("{name}.strace.gz"));
    let out = Command::cargo_bin("stallscope")
        .unwrap()
        .args([
            "analyze",
            t.to_str().unwrap(),
            "--redis-log",
            "/nonexistent/redis.log",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("stallscope: error: --redis-log /nonexistent/redis.log"),
        "{err}"
    );
    assert!(err.ends_with('\n'));
}

#[test]
fn a_gzipped_log_given_with_the_flag_reads_the_same() {
    use std::io::Write;
    let name = "slow-log-close-bgsave-f";
    let dir = tempfile::tempdir().unwrap();
    let gz = dir.path().join("elsewhere.log.gz");
    let mut w = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::fast(),
    );
    w.write_all(&std::fs::read(fixture(name, &format!("{name}.redis.log"))).unwrap())
        .unwrap();
    w.finish().unwrap();
    let a = capture(name, &[]);
    let b = capture(name, &["--redis-log", gz.to_str().unwrap()]);
    assert_eq!(b["redis"]["log"]["found"], "--redis-log");
    assert_eq!(a["redis"]["lines"], b["redis"]["lines"]);
    for (x, y) in stalls(&a).iter().zip(stalls(&b)) {
        assert_eq!(x["redis_evidence"], y["redis_evidence"]);
    }
}

fn have_redis() -> bool {
    let ok = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && ci() {
        panic!("redis-server is required under CI=true");
    }
    if !ok {
        eprintln!("skipping: redis-server not installed");
    }
    ok
}

fn stop(a: &Attach) {
    // SAFETY: a signal to the stallscope child this test started.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGINT) };
}

#[test]
fn live_debug_sleep_carries_latencys_command_event() {
    let _g = serial();
    if !have_redis() {
        return;
    }
    let redis = Redis::start(&[
        "--latency-monitor-threshold",
        "100",
        "--enable-debug-command",
        "yes",
    ]);
    let addr = format!("127.0.0.1:{}", redis.port);
    let mut a = Attach::start(
        "ptrace",
        redis.pid(),
        &["--redis", &addr, "--format", "json", "--threshold", "100ms"],
    );
    assert!(a.attached, "{:?}", a.stderr);
    let mut c = redis.client();
    let r = c.cmd(&["DEBUG", "SLEEP", "0.3"]).unwrap();
    assert_eq!(r.text(), "+OK");
    assert!(
        a.wait_line(|l| l.starts_with("stall:"), Duration::from_secs(30)),
        "no stall printed: {:?}",
        a.stderr
    );
    // Let one poll of LATENCY LATEST see it (HISTORY at the end would anyway).
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1500) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop(&a);
    let (code, out, err) = a.finish(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{err:?}");
    let r = json(&out);
    let server = &r["redis"]["server"];
    assert_eq!(server["latency_monitor_threshold_ms"], 100, "{server}");
    assert!(server["polls"].as_u64().unwrap() >= 1);
    assert!(server["latency"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l["event"] == "command" && l["latency_ms"].as_i64().unwrap() >= 300));
    let sleep = stalls(&r)
        .iter()
        .find(|s| s["thread"] == "main" && s["duration_us"].as_i64().unwrap() >= 290_000)
        .unwrap_or_else(|| panic!("no DEBUG SLEEP stall: {}", r["stalls"]));
    let ev = evidence(sleep);
    assert!(
        ev.iter().any(|e| e["source"] == "latency"
            && e["what"].as_str().unwrap().starts_with("LATENCY command")),
        "{ev:?}"
    );
    assert!(
        ev.iter()
            .any(|e| e["source"] == "slowlog" && e["what"].as_str().unwrap().contains("DEBUG")),
        "{ev:?}"
    );
    // The log (logfile redis.log in redis's dir) was found, from the config or from redis
    // itself, and followed.
    let found = r["redis"]["log"]["found"].as_str().unwrap_or_default();
    assert!(
        ["redis.conf logfile", "CONFIG GET logfile"].contains(&found),
        "{}",
        r["redis"]
    );
    assert!(r["redis"]["log"]["path"]
        .as_str()
        .unwrap()
        .ends_with("/redis.log"));
    assert_eq!(r["redis"]["log"]["followed"], true);
    redis.assert_unharmed();
}

#[test]
fn live_the_pollers_own_commands_are_not_clients_waiting() {
    let _g = serial();
    if !have_redis() {
        return;
    }
    let redis = Redis::start(&["--enable-debug-command", "yes"]);
    let addr = format!("127.0.0.1:{}", redis.port);
    let mut a = Attach::start(
        "ptrace",
        redis.pid(),
        &["--redis", &addr, "--format", "json", "--threshold", "100ms"],
    );
    assert!(a.attached, "{:?}", a.stderr);
    // The poller asks once a second: during a 2 s sleep one of its commands is queued
    // behind it, and so is this client's PING, sent once redis is seen sleeping (both
    // clients are served once before, so that redis has accepted them).
    let mut pinger = redis.client();
    assert_eq!(pinger.cmd(&["PING"]).unwrap().text(), "+PONG");
    let mut c = redis.client();
    assert_eq!(c.cmd(&["PING"]).unwrap().text(), "+PONG");
    let sleeper = std::thread::spawn(move || c.cmd(&["DEBUG", "SLEEP", "2"]).unwrap().text());
    let t = Instant::now();
    while !matches!(redis.main_syscall(), Some(n) if n == libc::SYS_clock_nanosleep || n == libc::SYS_nanosleep)
    {
        assert!(t.elapsed() < Duration::from_secs(20), "redis never slept");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(pinger.cmd(&["PING"]).unwrap().text(), "+PONG");
    assert_eq!(sleeper.join().unwrap(), "+OK");
    assert!(
        a.wait_line(|l| l.starts_with("stall:"), Duration::from_secs(30)),
        "no stall printed: {:?}",
        a.stderr
    );
    stop(&a);
    let (code, out, err) = a.finish(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{err:?}");
    let r = json(&out);
    assert!(
        r["redis"]["server"]["polls"].as_u64().unwrap() >= 2,
        "{}",
        r["redis"]
    );
    let sleep = stalls(&r)
        .iter()
        .find(|s| s["thread"] == "main" && s["duration_us"].as_i64().unwrap() >= 1_900_000)
        .unwrap_or_else(|| panic!("no DEBUG SLEEP stall: {}", r["stalls"]));
    let waiting = sleep["waiting_by_command"].as_object().unwrap();
    // The DEBUG SLEEP, read before the sleep and answered after it, waited through it. The
    // PING sent during it was found by the wait after it, which returned at once: the trace
    // shows it queued only from the end of the call before that wait, so the stall is not
    // said to have held it (issue 13), nor any poller command queued meanwhile.
    assert!(waiting.contains_key("DEBUG"), "{waiting:?}");
    assert!(!waiting.contains_key("PING"), "{waiting:?}");
    for own in ["LATENCY", "INFO", "SLOWLOG", "CONFIG"] {
        assert!(
            !waiting.contains_key(own),
            "the poller's {own} is counted as waiting: {waiting:?}"
        );
    }
    let names: Vec<&str> = r["commands"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["command"].as_str())
        .collect();
    assert!(names.contains(&"DEBUG"), "{names:?}");
    // CONFIG: the one-off CONFIG GET logfile that finds redis's log.
    for own in ["LATENCY", "INFO", "SLOWLOG", "CONFIG"] {
        assert!(
            !names.contains(&own),
            "the poller's {own} is in the client stats: {names:?}"
        );
    }
    redis.assert_unharmed();
}

#[test]
fn live_a_redis_that_cannot_be_reached_never_stops_tracing() {
    let _g = serial();
    if !have_redis() {
        return;
    }
    let redis = Redis::start(&[]);
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{closed}");
    let a = Attach::start(
        "ptrace",
        redis.pid(),
        &["--redis", &addr, "--format", "json", "--duration", "2s"],
    );
    assert!(a.attached, "{:?}", a.stderr);
    let (code, out, err) = a.finish(Duration::from_secs(60));
    assert!(code == Some(0) || code == Some(1), "{err:?}");
    let r = json(&out);
    assert_eq!(r["redis"]["server"]["polls"], 0);
    assert!(r["redis"]["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n.as_str().unwrap().contains("cannot connect")));
    redis.assert_unharmed();
}

#[test]
fn html_lanes_draw_each_write_waiting_for_the_bio_fsync() {
    let name = "everysec-slowfs";
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("r.html");
    let t = fixture(name, &format!("{name}.strace.gz"));
    let threads = fixture(name, &format!("{name}.threads.txt"));
    let (_, r, _) = run(&[
        t.to_str().unwrap(),
        "--threads",
        threads.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&html).unwrap();
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&text, opts).expect("well-formed XHTML");
    let lanes = doc
        .descendants()
        .find(|n| n.attribute("id") == Some("lanes"))
        .expect("the lanes picture");
    let class = |c: &str| -> Vec<roxmltree::Node> {
        lanes
            .descendants()
            .filter(|n| n.attribute("class") == Some(c))
            .collect()
    };
    let tid_of = |role: &str| -> String {
        r["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["role"] == role)
            .unwrap()["tid"]
            .to_string()
    };
    let (main, bio) = (tid_of("main"), tid_of("bio_aof"));
    // The main thread's lane first; one bar per stall, on its thread's lane.
    assert_eq!(class("lane")[0].attribute("data-tid"), Some(main.as_str()));
    assert_eq!(class("stall-bar").len(), stalls(&r).len());
    // One arrow from the bio thread to the main thread per main-thread AOF write stall.
    let writes = stalls(&r)
        .iter()
        .filter(|s| s["thread"] == "main" && s["syscall"] == "write")
        .count();
    let arrows = class("waits-for");
    assert_eq!(arrows.len(), writes);
    assert!(arrows
        .iter()
        .all(|a| a.attribute("data-from-tid") == Some(bio.as_str())
            && a.attribute("data-to-tid") == Some(main.as_str())));
    // Every log line of the trace's window is a mark; offline there is no LATENCY lane.
    assert_eq!(
        class("log-mark").len(),
        r["redis"]["lines"].as_array().unwrap().len()
    );
    assert!(!text.contains("LATENCY / SLOWLOG"));
    // And the evidence table lists what each stall got.
    let rows = doc
        .descendants()
        .find(|n| n.attribute("id") == Some("redis-evidence"))
        .unwrap()
        .descendants()
        .filter(|n| n.tag_name().name() == "tr")
        .count();
    let items: usize = stalls(&r).iter().map(|s| evidence(s).len()).sum();
    assert_eq!(rows, items + 1);
}

#[test]
fn svg_draws_the_lanes_below_the_scatter_plot() {
    let name = "everysec-slowfs";
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("r.svg");
    let t = fixture(name, &format!("{name}.strace.gz"));
    let threads = fixture(name, &format!("{name}.threads.txt"));
    let (_, r, _) = run(&[
        t.to_str().unwrap(),
        "--threads",
        threads.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
    let root = doc.root_element();
    let kids: Vec<roxmltree::Node> = root.children().filter(|n| n.is_element()).collect();
    assert_eq!(kids.len(), 2, "the plot and the lanes");
    assert_eq!(kids[0].attribute("class"), Some("stallscope-timeline"));
    assert_eq!(kids[1].attribute("id"), Some("lanes"));
    let h = |n: &roxmltree::Node, a: &str| -> f64 { n.attribute(a).unwrap().parse().unwrap() };
    // Stacked: the lanes start where the plot ends, and the whole is both.
    assert_eq!(h(&kids[1], "y"), h(&kids[0], "height"));
    assert_eq!(
        h(&root, "height"),
        h(&kids[0], "height") + h(&kids[1], "height")
    );
    let in_lanes = |c: &str| {
        kids[1]
            .descendants()
            .filter(|n| n.attribute("class") == Some(c))
            .count()
    };
    assert_eq!(in_lanes("stall-bar"), stalls(&r).len());
    let writes = stalls(&r)
        .iter()
        .filter(|s| s["thread"] == "main" && s["syscall"] == "write")
        .count();
    assert!(writes > 0);
    assert_eq!(in_lanes("waits-for"), writes);
    assert_eq!(
        in_lanes("log-mark"),
        r["redis"]["lines"].as_array().unwrap().len()
    );
}
