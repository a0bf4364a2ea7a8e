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
/// records what it traced there, as `attach --record` does.
fn attach_replay(path: &str, record: Option<&str>) -> Report {
    let mut argv = vec!["attach", "--pid", "1", "--threshold", "10ms"];
    if let Some(r) = record {
        argv.extend(["--record", r]);
    }
    let args: AttachArgs = parse(&argv);
    let opts = crate::run::options(&args.out).unwrap();
    let (started, ctx) = ReplayTracer::open(path, true, false)
        .unwrap()
        .start(LiveBackend::Bpf)
        .unwrap();
    let mut s = LiveSession::around(started, ctx, &opts, None, None);
    let mut sink = AttachSink::new(&s, &args).unwrap();
    sink.out = Box::new(std::io::sink());
    let (report, _, err) = trace(&mut s, sink, &args).unwrap();
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
    let live = attach_replay(&fixture(), Some(rec));
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
    let again = attach_replay(rec, None);
    let c = comparable(&again);
    assert!(a == c, "{:?}", first_difference(&a, &c, ""));
}

#[test]
fn each_sidecar_is_needed_for_the_replay_to_give_the_live_report() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec.strace");
    let rec = rec.to_str().unwrap();
    let live = comparable(&attach_replay(&fixture(), Some(rec)));
    for suffix in [
        crate::recording::THREADS_SUFFIX,
        crate::recording::LOST_SUFFIX,
        crate::recording::SCHED_SUFFIX,
        crate::recording::ARRIVALS_SUFFIX,
    ] {
        let other = tempfile::tempdir().unwrap();
        let copy = other.path().join("rec.strace");
        let copy = copy.to_str().unwrap();
        std::fs::copy(rec, copy).unwrap();
        for s in [
            crate::recording::THREADS_SUFFIX,
            crate::recording::CONF_SUFFIX,
            crate::recording::LOST_SUFFIX,
            crate::recording::SCHED_SUFFIX,
            crate::recording::ARRIVALS_SUFFIX,
        ] {
            if s != suffix {
                std::fs::copy(format!("{rec}{s}"), format!("{copy}{s}")).unwrap();
            }
        }
        let back = comparable(&analyze(copy));
        assert!(
            back != live,
            "the replay without {suffix} still gave the live report: the test cannot see that sidecar"
        );
    }
}
