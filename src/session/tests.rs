//! The session layer through the replay tracer: attach's loop run on a real recording
//! (`fixtures/recording-bpf-lost`: bpf, with lost records, the scheduler's split and the
//! reads' arrivals), what it records read back by `analyze` to the same report, and that
//! parity lost when any sidecar is dropped, so the test shows each sidecar is needed.

use super::replay::ReplayTracer;
use super::LiveSession;
use crate::app::attach::{trace, AttachSink};
use crate::cli::{AnalyzeArgs, AttachArgs};
use crate::report::{LiveBackend, Report};
use serde_json::Value;

fn fixture() -> String {
    format!(
        "{}/fixtures/recording-bpf-lost/rec.strace.gz",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn parse<T: clap::Args + clap::FromArgMatches>(argv: &[&str]) -> T {
    let m = T::augment_args(clap::Command::new("stallscope"))
        .try_get_matches_from(argv)
        .unwrap();
    T::from_arg_matches(&m).unwrap()
}

/// Attach's loop over the recording at `path`, as if bpf traced it now; with `record`, it
/// records what it traced there, as `attach --record` does; with `conf`, the redis.conf
/// given as `--redis-conf`.
fn attach_replay(path: &str, record: Option<&str>, conf: Option<&str>) -> Report {
    let mut argv = vec!["attach", "--pid", "1", "--threshold", "10ms"];
    if let Some(r) = record {
        argv.extend(["--record", r]);
    }
    if let Some(c) = conf {
        argv.extend(["--redis-conf", c]);
    }
    let args: AttachArgs = parse(&argv);
    let opts = crate::run::options(&args.out).unwrap();
    let conf = conf.map(|c| std::fs::read_to_string(c).unwrap());
    let (started, ctx) = ReplayTracer::open(path, true, false)
        .unwrap()
        .start(LiveBackend::Bpf)
        .unwrap();
    let mut s = LiveSession::around(started, ctx, &opts, conf, None);
    let mut sink = AttachSink::new(&s, &args).unwrap();
    sink.out = Box::new(std::io::sink());
    let (report, _, err) = trace(&mut s, sink, &args, None).unwrap();
    assert!(err.is_none(), "{err:?}");
    report
}

/// `stallscope analyze PATH --threshold 10ms`'s report.
fn analyze(path: &str) -> Report {
    let args: AnalyzeArgs = parse(&["analyze", path, "--threshold", "10ms"]);
    crate::run::report_of(&args).unwrap()
}

/// The report as the JSON a user reads, without what only a live session has: where the
/// events came from, what tracing cost, the host's samples, and the live rules' findings
/// (about the backend, not about redis); and with times of day left out: a live report
/// prints them in its wall clock's words, a reread recording in the trace's (epoch).
fn comparable(r: &Report) -> Value {
    fn untimed(v: &mut Value) {
        match v {
            Value::Object(o) => {
                o.retain(|k, _| k != "ts" && k != "ts_iso");
                o.values_mut().for_each(untimed);
            }
            Value::Array(a) => a.iter_mut().for_each(untimed),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(r).unwrap();
    untimed(&mut v);
    let o = v.as_object_mut().unwrap();
    for k in ["source", "overhead", "host"] {
        o.remove(k);
    }
    // What the text source counted of its lines (a live tracer has no lines), and the
    // start in the source's words.
    if let Some(Value::Object(s)) = o.get_mut("summary") {
        for k in ["lines", "skipped_lines", "start", "start_iso", "durations"] {
            s.remove(k);
        }
    }
    let live_ids = crate::analyze::findings::live_rule_ids();
    if let Some(Value::Array(f)) = o.get_mut("findings") {
        f.retain(|x| !live_ids.contains(&x["id"].as_str().unwrap_or("")));
    }
    v
}

/// The first differing key path of two JSON values, for a readable failure.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<_> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                first_difference(
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    &format!("{at}.{k}"),
                )
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, &format!("{at}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!("{at}: {a} != {b}")),
    }
}

#[test]
fn a_replayed_session_records_what_analyze_reads_back_to_the_same_report() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec.strace");
    let rec = rec.to_str().unwrap();
    let live = attach_replay(&fixture(), Some(rec), None);
    // What the fixture exercises: each sidecar's part of the report.
    assert!(live.summary.lost_events > 0, "records lost");
    assert_eq!(
        live.summary.command_start,
        Some(crate::report::CommandStart::Arrival)
    );
    assert!(
        live.stalls.iter().any(|s| s.sched.is_some()),
        "stalls with the scheduler's split"
    );
    assert!(
        live.stalls
            .iter()
            .any(|s| s.syscall.as_deref() == Some("clock_nanosleep")),
        "the DEBUG SLEEP"
    );
    // `analyze` joins redis's log when it finds the one the trace wrote to; the live side
    // here follows none. The recording's log lived on the machine that made it.
    for f in live
        .fds
        .iter()
        .filter(|f| f.class == crate::report::FileClass::Log)
    {
        let p = f.path.as_deref().unwrap_or("");
        assert!(
            !std::path::Path::new(p).exists(),
            "{p} exists here: analyze would join it and the reports could not compare"
        );
    }
    let back = analyze(rec);
    let (a, b) = (comparable(&live), comparable(&back));
    assert!(a == b, "{:?}", first_difference(&a, &b, ""));
    // And the replay of the recording through the loop again: the same live report.
    let again = attach_replay(rec, None, None);
    let c = comparable(&again);
    assert!(a == c, "{:?}", first_difference(&a, &c, ""));
}

/// The fixture with redis's log renamed to a path that only the config can class (no `.log`
/// in it), beside its sidecars, in `dir`; and the config file that names it.
fn renamed_log_variant(dir: &std::path::Path) -> (String, String) {
    use std::io::Read;
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(fixture()).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let renamed = "/tmp/mkrec/server.out";
    assert!(text.contains("/tmp/mkrec/redis.log"));
    let path = dir.join("variant.strace");
    std::fs::write(&path, text.replace("/tmp/mkrec/redis.log", renamed)).unwrap();
    let path = path.to_str().unwrap().to_string();
    for s in [
        crate::recording::THREADS_SUFFIX,
        crate::recording::LOST_SUFFIX,
        crate::recording::SCHED_SUFFIX,
        crate::recording::ARRIVALS_SUFFIX,
    ] {
        std::fs::copy(format!("{}{s}", fixture()), format!("{path}{s}")).unwrap();
    }
    let conf = dir.join("redis.conf");
    std::fs::write(&conf, format!("dir /tmp/mkrec\nlogfile {renamed}\n")).unwrap();
    (path, conf.to_str().unwrap().to_string())
}

#[test]
fn each_sidecar_is_needed_for_the_replay_to_give_the_live_report() {
    let dir = tempfile::tempdir().unwrap();
    let (variant, conf) = renamed_log_variant(dir.path());
    let rec = dir.path().join("rec.strace");
    let rec = rec.to_str().unwrap();
    let live = attach_replay(&variant, Some(rec), Some(&conf));
    // The config is what classes the renamed log: without it the conf sidecar could go
    // unnoticed.
    assert!(
        live.fds
            .iter()
            .any(|f| f.class == crate::report::FileClass::Log
                && f.path.as_deref() == Some("/tmp/mkrec/server.out")),
        "the config's logfile classes the renamed log"
    );
    let live = comparable(&live);
    assert_eq!(
        comparable(&analyze(rec)),
        live,
        "the whole recording reads back"
    );
    let all = [
        crate::recording::THREADS_SUFFIX,
        crate::recording::CONF_SUFFIX,
        crate::recording::LOST_SUFFIX,
        crate::recording::SCHED_SUFFIX,
        crate::recording::ARRIVALS_SUFFIX,
    ];
    for suffix in all {
        let other = tempfile::tempdir().unwrap();
        let copy = other.path().join("rec.strace");
        let copy = copy.to_str().unwrap();
        std::fs::copy(rec, copy).unwrap();
        for s in all.iter().filter(|s| **s != suffix) {
            std::fs::copy(format!("{rec}{s}"), format!("{copy}{s}")).unwrap();
        }
        let back = comparable(&analyze(copy));
        assert!(
            back != live,
            "the replay without {suffix} still gave the live report: the test cannot see that sidecar"
        );
    }
}
