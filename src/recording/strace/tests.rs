//! The recording must read back through the strace parser to the same events.

use super::*;
use crate::event::{Data, DurSource, Syscall};
use crate::source::strace::StraceParser;

const FIRST: Nanos = 5_000_000_000;
const WALL: Nanos = 1_764_540_000_000_000_000;

fn sc(name: &'static str, fd: Option<i32>, ret: Ret, dur: Nanos) -> Syscall {
    let mut s = Syscall::new(name);
    s.fd = fd;
    s.ret = ret;
    s.dur = Some(dur);
    s.dur_src = DurSource::Measured;
    s
}

fn ev(tid: Tid, at: Nanos, s: Syscall) -> Event {
    Event {
        tid,
        ts: FIRST + at,
        line: 0,
        kind: EventKind::Syscall(s),
    }
}

/// What a live report of `stallscope attach (BACKEND)` on pid 100 says of its source.
fn live_info(backend: &str) -> crate::source::SourceInfo {
    crate::source::SourceInfo {
        kind: crate::report::SourceKind::Live,
        files: vec![],
        format: format!("stallscope attach ({backend})"),
        pid: Some(100),
        clock: crate::source::Clock {
            fmt: crate::source::TimeFmt::Epoch,
            perf: false,
            frac_digits: 6,
            first: FIRST,
            date: None,
            wall_at_first: Some(WALL),
        },
    }
}

fn read_back(text: &str) -> Vec<Event> {
    let mut p = StraceParser::new(0);
    let mut out = vec![];
    for l in text.lines() {
        p.feed(l.as_bytes(), &mut out);
    }
    p.finish(&mut out);
    out
}

#[test]
fn round_trips_through_the_strace_parser() {
    let mut buf = vec![];
    let mut r = Recorder::new(&mut buf, 100, FIRST, WALL, Some("/data".into()));
    r.seed_fd(7, "/data/appendonlydir/appendonly.aof.1.incr.aof");
    let mut w = sc("write", Some(7), Ret::Val(37), 12_000);
    w.extra = Extra::Data(Data::new(b"*3\r\n$3\r\nSET\r\n$1\r\nk\"\\\x01", true));
    let mut o = sc("openat", None, Ret::Val(9), 5_000);
    o.extra = Extra::Path("redis.log".into());
    let c = sc("close", Some(9), Ret::Val(0), 2_000);
    let f = sc("fdatasync", Some(7), Ret::Err("EIO"), 30_000_000);
    let mut start = sc("close", Some(8), Ret::Val(0), 4_800_000_000);
    start.in_flight = Some(InFlight::AtStart);
    let mut cl = sc("clone", None, Ret::Val(222), 900_000);
    cl.extra = Extra::Clone { thread: false };
    let mut end = sc("fdatasync", Some(7), Ret::Unknown, 2_000_000_000);
    end.in_flight = Some(InFlight::AtEnd);
    let events = vec![
        Event {
            tid: 100,
            ts: FIRST,
            line: 0,
            kind: EventKind::Attach { threads: Some(1) },
        },
        ev(100, 1_000, w),
        ev(100, 2_000_000, o),
        ev(100, 3_000_000, c),
        ev(100, 4_000_000, f),
        ev(101, 0, start),
        ev(100, 5_000_000_000, cl),
        Event {
            tid: 100,
            ts: FIRST + 5_100_000_000,
            line: 0,
            kind: EventKind::Signal {
                name: "SIGCHLD",
                si_pid: Some(222),
            },
        },
        Event {
            tid: 222,
            ts: FIRST + 5_200_000_000,
            line: 0,
            kind: EventKind::Exit {
                code: Some(0),
                signal: None,
            },
        },
        ev(100, 5_250_000_000, sc("getpid", None, Ret::Val(100), 1_000)),
        ev(100, 5_300_000_000, end),
        // Another thread's call, later than the detach-time entry above.
        ev(101, 5_400_000_000, sc("getpid", None, Ret::Val(100), 1_000)),
    ];
    for e in &events {
        r.write_event(e).unwrap();
    }
    r.finish().unwrap();
    let text = String::from_utf8(buf).unwrap();
    assert!(
        text.contains(
            "write(7</data/appendonlydir/appendonly.aof.1.incr.aof>, \"*3\\r\\n$3\\r\\nSET"
        ),
        "{text}"
    );
    assert!(text.contains("= 9</data/redis.log>"), "{text}");
    assert!(text.contains("close(9</data/redis.log>)"), "{text}");
    assert!(text.contains("-1 EIO (Input/output error)"), "{text}");
    let back = read_back(&text);
    let calls: Vec<(&Event, &Syscall)> = back
        .iter()
        .filter_map(|e| e.syscall().map(|s| (e, s)))
        .collect();
    let orig: Vec<(&Event, &Syscall)> = events
        .iter()
        .filter_map(|e| e.syscall().map(|s| (e, s)))
        .collect();
    assert_eq!(calls.len(), orig.len(), "{text}\n{back:?}");
    let mut used = vec![false; calls.len()];
    for o in &orig {
        // A call left unfinished is only emitted at the end of input: match by identity.
        let i = (0..calls.len())
            .find(|i| {
                !used[*i]
                    && calls[*i].0.tid == o.0.tid
                    && calls[*i].1.name == o.1.name
                    && calls[*i].1.in_flight == o.1.in_flight
            })
            .unwrap_or_else(|| panic!("{} of {} not read back", o.1.name, o.0.tid));
        used[i] = true;
        let b = &calls[i];
        // Wall-clock µs, on the same axis.
        let want_ts = (WALL + (o.0.ts - FIRST)) / 1000;
        let (name, tid) = (o.1.name, o.0.tid);
        assert_eq!(b.1.name, name);
        assert_eq!(b.0.tid, tid);
        assert_eq!(b.1.in_flight, o.1.in_flight, "{name}");
        if o.1.in_flight != Some(InFlight::AtEnd) {
            assert_eq!(b.0.ts / 1000, want_ts, "{name} start");
            assert_eq!(
                b.1.dur.map(|d| d / 1000),
                o.1.dur.map(|d| d / 1000),
                "{name} dur"
            );
            assert_eq!(b.1.ret, o.1.ret, "{name} ret");
        }
        if o.1.in_flight.is_none() {
            assert_eq!(b.1.fd, o.1.fd, "{name} fd");
            assert_eq!(b.1.extra, o.1.extra, "{name} extra");
        }
    }
    assert!(back.iter().any(|e| matches!(
        e.kind,
        EventKind::Signal {
            name: "SIGCHLD",
            si_pid: Some(222)
        }
    )));
    assert!(back
        .iter()
        .any(|e| e.tid == 222 && matches!(e.kind, EventKind::Exit { code: Some(0), .. })));
}

#[test]
fn quoting_matches_strace() {
    assert_eq!(quote(b"a\"b\\\n\x00", false), "\"a\\\"b\\\\\\n\\x00\"");
    assert_eq!(quote(b"abc", true), "\"abc\"...");
}

/// `attach --record FILE` promises that `analyze FILE` gives the report `attach` gave. The
/// live side analyzes the tracer's events (as `run_attach` does: the attach's fds and names
/// seeded, the final detach left out); the replay reads the recording back as `analyze`
/// does. Two things the strace text used to lose are in here: times below a microsecond
/// (a 199.999 µs gap read back as 200 µs, a stall live did not have) and the moment tracing
/// ended (a call still running then read back as lasting 0 instead of up to the detach).
#[test]
fn a_recording_analyzes_to_the_live_report() {
    use crate::analyze::{parse_thread_names, Analyzer, Options};
    use crate::source::{Counters, InputFormat, Inputs};
    let threshold_ns = 200_000;
    let attach = Event {
        tid: 100,
        ts: FIRST,
        line: 0,
        kind: EventKind::Attach { threads: Some(2) },
    };
    let epoll = |at: Nanos, dur: Nanos| {
        let mut s = sc("epoll_wait", Some(5), Ret::Val(1), dur);
        s.extra = Extra::None;
        ev(100, at, s)
    };
    let mut main_end = sc("fdatasync", Some(7), Ret::Unknown, 5_000_000);
    main_end.in_flight = Some(InFlight::AtEnd);
    let mut bio_end = sc("futex", None, Ret::Unknown, 7_000_000);
    bio_end.in_flight = Some(InFlight::AtEnd);
    let events = vec![
        attach,
        epoll(1_000, 999_000),
        // Ends at 1_001_000 ns; the next call starts 199_999 ns later: no gap stall.
        ev(100, 1_000_900, sc("read", Some(8), Ret::Val(20), 100)),
        ev(100, 1_200_999, sc("write", Some(8), Ret::Val(5), 1_000)),
        epoll(1_300_000, 600_000),
        ev(100, 1_950_000, sc("write", Some(7), Ret::Val(30), 10_000)),
        // In flight at the detach, 5 ms after it began; the bio thread since the attach.
        ev(100, 2_000_000, main_end),
        ev(101, 0, bio_end),
        Event {
            tid: 100,
            ts: FIRST + 7_000_000,
            line: 0,
            kind: EventKind::Detach,
        },
    ];
    let names: HashMap<Tid, String> = [(100, "redis-server"), (101, "bio_aof_fsync")]
        .into_iter()
        .map(|(t, n)| (t, n.to_string()))
        .collect();
    let fds = [
        (5, "anon_inode:[eventpoll]"),
        (7, "/data/appendonlydir/appendonly.aof.1.incr.aof"),
        (8, "socket:[1234]"),
    ];

    // Live.
    let opts = Options {
        threshold_ns,
        top: 20,
        root_pid: Some(100),
        stamped_at_stops: true,
        ..Default::default()
    };
    let mut an = Analyzer::new(opts);
    for (fd, what) in fds {
        an.seed_fd(100, fd, what);
    }
    for (t, n) in &names {
        an.set_thread_name(*t, n);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rec.strace");
    let mut r = Recorder::new(
        std::fs::File::create(&path).unwrap(),
        100,
        FIRST,
        WALL,
        Some("/data".into()),
    );
    for (fd, what) in fds {
        r.seed_fd(fd, what);
    }
    for e in &events {
        if !matches!(e.kind, EventKind::Detach) {
            an.push(e);
        }
        r.write_event(e).unwrap();
    }
    r.finish().unwrap();
    let side = format!("{}.threads", path.display());
    std::fs::write(&side, crate::recording::threads_text(&names)).unwrap();
    let info = live_info("ptrace");
    let live = an.finish(info, Counters::default());

    // Replay, as `stallscope analyze rec.strace` reads it.
    let mut inp = Inputs::open(
        &[path.to_string_lossy().into_owned()],
        InputFormat::Auto,
        false,
    )
    .unwrap();
    let opts = Options {
        threshold_ns,
        top: 20,
        thread_names: parse_thread_names(&std::fs::read_to_string(&side).unwrap()),
        stamped_at_stops: inp.info().kind == "strace",
        ..Default::default()
    };
    let mut an = Analyzer::new(opts);
    while let Some(e) = inp.next_event().unwrap() {
        an.push(&e);
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let back = an.finish(inp.info(), inp.counters());

    let stalls = |r: &crate::report::Report| -> Vec<String> {
        r.stalls
            .iter()
            .chain(&r.in_flight)
            .map(|s| {
                format!(
                    "{} {:?} {:?} at {} for {} {:?} {:?}",
                    s.who.tid, s.kind, s.syscall, s.at_us, s.duration_us, s.bound, s.in_flight
                )
            })
            .collect()
    };
    assert_eq!(stalls(&live), stalls(&back), "{text}");
    assert_eq!(
        stalls(&live),
        ["100 SlowSyscall Some(\"fdatasync\") at 2000 for 5000 AtLeast Some(AtEnd)"],
        "the call still running at the detach is the only stall"
    );
    let counts = |r: &crate::report::Report| {
        let s = &r.summary;
        (
            s.stalls,
            s.events,
            s.syscalls,
            s.span_us,
            s.in_flight_at_start,
            s.in_flight_at_end,
        )
    };
    assert_eq!(counts(&live), counts(&back), "{text}");
    let roles = |r: &crate::report::Report| -> Vec<(u32, String)> {
        r.threads
            .iter()
            .map(|t| (t.tid, t.role.to_string()))
            .collect()
    };
    assert_eq!(roles(&live), roles(&back));
    let ids = |r: &crate::report::Report| -> Vec<String> {
        r.findings.iter().map(|f| f.id.to_string()).collect()
    };
    assert_eq!(ids(&live), ids(&back));
}

/// Losses are written beside the recording at the line of the event that followed them, and
/// read back to be applied before the event read from that line: the replay marks the same
/// stalls as found after a loss, and counts the same total.
#[test]
fn lost_records_are_placed_at_the_event_that_followed_them() {
    let mut buf = vec![];
    let mut r = Recorder::new(&mut buf, 100, FIRST, WALL, None);
    let attach = Event {
        tid: 100,
        ts: FIRST,
        line: 0,
        kind: EventKind::Attach { threads: Some(1) },
    };
    assert_eq!(r.lost_text(), None, "nothing lost, no sidecar");
    r.write_event(&attach).unwrap();
    r.write_event(&ev(100, 1_000, sc("read", Some(8), Ret::Val(3), 100)))
        .unwrap();
    r.note_lost(5);
    r.write_event(&ev(100, 2_000, sc("write", Some(8), Ret::Val(3), 100)))
        .unwrap();
    // Two reports before the same event are one mark; the last is after every event.
    r.note_lost(1);
    r.note_lost(2);
    let text = r.lost_text().expect("losses");
    r.finish().unwrap();
    let rec = String::from_utf8(buf).unwrap();
    assert_eq!(rec.lines().count(), 3, "{rec}");
    let body: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(body, ["3 5", "4 3"], "{text}");
    // Read back: each event gets what was lost before its line, once.
    let events = read_back(&rec);
    let mut marks = LostMarks::parse(&text).unwrap();
    let got: Vec<(u64, u64)> = events
        .iter()
        .map(|e| (e.line, marks.before(e.line)))
        .collect();
    assert_eq!(got, [(1, 0), (2, 0), (3, 5)]);
    assert_eq!(marks.rest(), 3);
    assert_eq!(marks.rest(), 0, "given once");
    assert!(LostMarks::parse("3 five\n").is_err());
    assert_eq!(LostMarks::parse("# only a comment\n\n").unwrap().rest(), 0);
}

/// A recorder into `buf` with its scheduler sidecar in a temp dir (kept alive by the first
/// value), writing the splits of at least `floor`.
fn recorder_with_sched(
    buf: &mut Vec<u8>,
    floor: Nanos,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Recorder<&mut Vec<u8>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let side = dir.path().join("rec.strace.sched");
    let mut r = Recorder::new(buf, 100, FIRST, WALL, None);
    r.record_sched(
        Box::new(std::fs::File::create(&side).unwrap()),
        floor,
        false,
    )
    .unwrap();
    (dir, side, r)
}

/// The bpf split of a call and of the gap before it goes beside the recording when either is
/// at least the floor, at the call's line, and reads back to the same split.
#[test]
fn the_scheduler_split_of_long_calls_and_gaps_reads_back_at_their_lines() {
    use crate::event::{SchedDelta, SchedSpan};
    let mut buf = vec![];
    let (_dir, side, mut r) = recorder_with_sched(&mut buf, 1_000_000);
    let split = |on: u64, run: u64, minor: u64| SchedDelta {
        on_cpu_ns: on,
        runnable_ns: run,
        minor_faults: minor,
        major_faults: 0,
        throttled_ns: None,
        reclaim_ns: None,
    };
    let with = |at: Nanos, dur: Nanos, during, before| {
        let mut s = sc("read", Some(8), Ret::Val(3), dur);
        s.sched = Some(Box::new(SchedSpan { during, before }));
        ev(100, at, s)
    };
    // Line 1: short, no gap known; line 2: a 5 ms gap before it; line 3: short after a short
    // gap; line 4: a 2 ms call.
    r.write_event(&with(0, 1_000, split(1, 0, 0), None))
        .unwrap();
    r.write_event(&with(
        5_001_000,
        1_000,
        split(1, 0, 0),
        Some(split(1_000_000, 4_000_000, 7)),
    ))
    .unwrap();
    r.write_event(&with(
        5_003_000,
        1_000,
        split(1, 0, 0),
        Some(split(2_000, 0, 0)),
    ))
    .unwrap();
    r.write_event(&with(
        5_005_000,
        2_000_000,
        split(500_000, 1_500_000, 0),
        Some(split(1_000, 0, 0)),
    ))
    .unwrap();
    r.finish().unwrap();
    let got = parse_sched(&std::fs::read_to_string(&side).unwrap()).unwrap();
    let mut lines: Vec<u64> = got.keys().copied().collect();
    lines.sort();
    assert_eq!(lines, [2, 4]);
    assert_eq!(got[&2].before, Some(split(1_000_000, 4_000_000, 7)));
    assert_eq!(got[&4].during, split(500_000, 1_500_000, 0));
    // The lines are those the strace reader gives the calls.
    let events = read_back(&String::from_utf8(buf).unwrap());
    assert_eq!(
        events.iter().map(|e| e.line).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert!(parse_sched("2 1 2 3\n").is_err());
    assert!(parse_sched("2 1 2 3 4 -\n").unwrap()[&2].before.is_none());
}

/// The throttled parts (bpf) go beside the split where measured and read back; a line
/// without them (perf, or a recording from before) reads as not measured.
#[test]
fn the_throttled_parts_of_a_split_read_back() {
    use crate::event::{SchedDelta, SchedSpan};
    let mut buf = vec![];
    let (_dir, side, mut r) = recorder_with_sched(&mut buf, 1_000_000);
    let split = |run: u64, throttled: Option<u64>| SchedDelta {
        runnable_ns: run,
        throttled_ns: throttled,
        ..Default::default()
    };
    r.write_event(&ev(100, 0, sc("read", Some(8), Ret::Val(3), 1_000)))
        .unwrap();
    let mut s = sc("read", Some(8), Ret::Val(3), 1_000);
    s.sched = Some(Box::new(SchedSpan {
        during: split(0, Some(0)),
        before: Some(split(70_000_000, Some(62_000_000))),
    }));
    r.write_event(&ev(100, 70_001_000, s)).unwrap();
    r.finish().unwrap();
    let text = std::fs::read_to_string(&side).unwrap();
    assert!(text.contains(" t=0/62000000\n"), "{text}");
    let got = parse_sched(&text).unwrap();
    assert_eq!(got[&2].during, split(0, Some(0)));
    assert_eq!(got[&2].before, Some(split(70_000_000, Some(62_000_000))));
    let old = parse_sched("2 1 2 3 4 5 6 7 8\n").unwrap();
    assert_eq!(old[&2].during.throttled_ns, None);
    let none = parse_sched("2 1 2 3 4 - t=5/-\n").unwrap();
    assert_eq!(none[&2].during.throttled_ns, Some(5));
    assert!(parse_sched("2 1 2 3 4 - t=5\n").is_err());
    assert!(parse_sched("2 1 2 3 4 - t=x/-\n").is_err());
}

/// The reclaim parts (bpf on the vmscan tracepoints) go after the throttled ones and read
/// back, with or without them; a line without (perf, or an older recording) is not measured.
#[test]
fn the_reclaim_parts_of_a_split_read_back() {
    use crate::event::{SchedDelta, SchedSpan};
    let mut buf = vec![];
    let (_dir, side, mut r) = recorder_with_sched(&mut buf, 1_000_000);
    let split = |on: u64, throttled: Option<u64>, reclaim: Option<u64>| SchedDelta {
        on_cpu_ns: on,
        throttled_ns: throttled,
        reclaim_ns: reclaim,
        ..Default::default()
    };
    r.write_event(&ev(100, 0, sc("write", Some(9), Ret::Val(3), 1_000)))
        .unwrap();
    let mut s = sc("write", Some(9), Ret::Val(3), 48_000_000);
    s.sched = Some(Box::new(SchedSpan {
        during: split(30_000_000, Some(0), Some(41_000_000)),
        before: Some(split(1_000, Some(0), Some(0))),
    }));
    r.write_event(&ev(100, 50_000_000, s)).unwrap();
    r.finish().unwrap();
    let text = std::fs::read_to_string(&side).unwrap();
    assert!(text.contains(" t=0/0 r=41000000/0\n"), "{text}");
    let got = parse_sched(&text).unwrap();
    assert_eq!(got[&2].during, split(30_000_000, Some(0), Some(41_000_000)));
    assert_eq!(got[&2].before, Some(split(1_000, Some(0), Some(0))));
    let only = parse_sched("2 1 2 3 4 - r=7/-\n").unwrap();
    assert_eq!(
        (only[&2].during.throttled_ns, only[&2].during.reclaim_ns),
        (None, Some(7))
    );
    let old = parse_sched("2 1 2 3 4 - t=5/-\n").unwrap();
    assert_eq!(old[&2].during.reclaim_ns, None);
    assert!(parse_sched("2 1 2 3 4 - r=5\n").is_err());
    assert!(parse_sched("2 1 2 3 4 - r=5/- t=1/2\n").is_err());
}

/// The live analysis of `events` (seeded with `fds`, as `run_attach` does) and the analysis
/// of their recording read back, as `analyze FILE` does; with the recording's text.
fn live_and_replayed(
    events: &[Event],
    fds: &[(i32, &str)],
) -> (crate::report::Report, crate::report::Report, String) {
    use crate::analyze::{Analyzer, Options};
    use crate::source::{Counters, InputFormat, Inputs};
    let opts = || Options {
        threshold_ns: 200_000,
        top: 20,
        root_pid: Some(100),
        stamped_at_stops: true,
        ..Default::default()
    };
    let mut an = Analyzer::new(opts());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rec.strace");
    let mut r = Recorder::new(
        std::fs::File::create(&path).unwrap(),
        100,
        FIRST,
        WALL,
        Some("/data".into()),
    );
    for (fd, what) in fds {
        an.seed_fd(100, *fd, what);
        r.seed_fd(*fd, what);
    }
    for e in events {
        if !matches!(e.kind, EventKind::Detach) {
            an.push(e);
        }
        r.write_event(e).unwrap();
    }
    r.finish().unwrap();
    let info = live_info("perf");
    let live = an.finish(info, Counters::default());
    let mut inp = Inputs::open(
        &[path.to_string_lossy().into_owned()],
        InputFormat::Auto,
        false,
    )
    .unwrap();
    let mut an = Analyzer::new(Options {
        root_pid: None,
        ..opts()
    });
    while let Some(e) = inp.next_event().unwrap() {
        an.push(&e);
    }
    let back = an.finish(inp.info(), inp.counters());
    (live, back, std::fs::read_to_string(&path).unwrap())
}

/// redis opens /proc/self/stat every 100 ms on its lowest free fd and closes it at once;
/// the next client accepted gets that number. The live fd table binds each open to the
/// name the backend gave it (`ret_path`: the fd's /proc link, absolute, which may differ
/// from the path the call passed); the recording must carry that name, not the path, or
/// the replay files the same calls under another file.
#[test]
fn an_fd_reused_between_an_open_and_a_client_reads_back_to_the_same_files() {
    let open = |at: Nanos, path: &str, fd: i64, name: Option<&str>| {
        let mut s = sc("openat", None, Ret::Val(fd), 30_000);
        s.extra = Extra::Path(path.into());
        s.ret_path = name.map(Into::into);
        ev(100, at, s)
    };
    let mut accept = sc("accept4", Some(6), Ret::Val(8), 5_000);
    accept.extra = Extra::None;
    let events = vec![
        open(1_000_000, "/proc/self/stat", 8, Some("/proc/100/stat")),
        ev(100, 1_100_000, sc("read", Some(8), Ret::Val(300), 5_000)),
        ev(100, 1_200_000, sc("close", Some(8), Ret::Val(0), 2_000)),
        ev(100, 1_300_000, accept),
        ev(100, 1_400_000, sc("read", Some(8), Ret::Val(40), 3_000)),
        ev(100, 1_500_000, sc("write", Some(8), Ret::Val(5), 4_000)),
        // A relative open named by the backend against the cwd; one it could not name.
        open(1_600_000, "redis.log", 9, Some("/data/redis.log")),
        ev(100, 1_700_000, sc("write", Some(9), Ret::Val(60), 9_000)),
        ev(100, 1_800_000, sc("close", Some(9), Ret::Val(0), 2_000)),
        open(1_900_000, "/proc/self/stat", 9, None),
        ev(100, 2_000_000, sc("close", Some(9), Ret::Val(0), 2_000)),
    ];
    let fds = [
        (5, "anon_inode:[eventpoll]"),
        (6, "TCP:[127.0.0.1:7000]"),
        (7, "/data/appendonlydir/appendonly.aof.1.incr.aof"),
    ];
    let (live, back, text) = live_and_replayed(&events, &fds);
    let files = |r: &crate::report::Report| -> Vec<String> {
        let mut v: Vec<String> = r
            .fds
            .iter()
            .map(|f| format!("{} {} {:?} {:?} {}", f.pid, f.fd, f.path, f.class, f.calls))
            .collect();
        v.sort();
        v
    };
    assert_eq!(files(&live), files(&back), "{text}");
    let shown: Vec<String> = live
        .fds
        .iter()
        .map(|f| format!("{} {}", f.fd, f.path.as_deref().unwrap_or("-")))
        .collect();
    for want in [
        "8 /proc/100/stat",
        "8 client connections",
        "9 /data/redis.log",
        "9 /proc/self/stat",
    ] {
        assert!(shown.iter().any(|s| s == want), "{want} in {shown:?}");
    }
}

/// When each socket read's data arrived (bpf) goes beside the recording at the read's line,
/// as the time from the arrival to the read's start, and reads back to the same arrival.
#[test]
fn the_arrival_of_a_reads_data_reads_back_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let side = dir.path().join("rec.strace.arrivals");
    let mut buf = vec![];
    let mut r = Recorder::new(&mut buf, 100, FIRST, WALL, None);
    r.record_arrivals(Box::new(std::fs::File::create(&side).unwrap()))
        .unwrap();
    let read = |at: Nanos, arrived: Option<Nanos>| {
        let mut s = sc("read", Some(8), Ret::Val(3), 1_000);
        s.arrived = arrived;
        ev(100, at, s)
    };
    r.write_event(&read(10_000, None)).unwrap();
    // Queued 250 µs before redis read it, and a read whose data came while it ran.
    r.write_event(&read(500_000, Some(FIRST + 250_000)))
        .unwrap();
    r.write_event(&read(900_000, Some(FIRST + 900_400)))
        .unwrap();
    r.finish().unwrap();
    let got = parse_arrivals(&std::fs::read_to_string(&side).unwrap()).unwrap();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[&2], 250_000);
    assert_eq!(got[&3], -400);
    let events = read_back(&String::from_utf8(buf).unwrap());
    assert_eq!(events.iter().map(|e| e.line).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(parse_arrivals("2 soon\n").is_err());
    assert!(parse_arrivals("# only a comment\n").unwrap().is_empty());
}

/// A gap that runs through a quiet call (getpeername, futex...) is the sum of the pieces
/// before and after it, and its split is the sum of theirs; a piece shorter than the floor
/// was left out of `FILE.sched`, so the replay had no split for the whole gap and called
/// a CPU wait "a slow command, or the process was descheduled" (the replay named one more
/// `command` finding than the live report, now and then under load). The split of a quiet
/// call and of the call after it are kept whatever their length.
#[test]
fn a_gap_through_a_quiet_call_reads_back_with_its_split() {
    use crate::analyze::{Analyzer, Options};
    use crate::event::{SchedDelta, SchedSpan};
    use crate::source::Counters;
    let split = |on: u64, run: u64| SchedDelta {
        on_cpu_ns: on,
        runnable_ns: run,
        minor_faults: 0,
        major_faults: 0,
        throttled_ns: None,
        reclaim_ns: None,
    };
    let with = |name: &'static str, fd: i32, at: Nanos, before: Option<SchedDelta>| {
        let mut s = sc(name, Some(fd), Ret::Val(0), 1_000);
        s.sched = Some(Box::new(SchedSpan {
            during: split(1_000, 0),
            before,
        }));
        ev(100, at, s)
    };
    // 1 ms waiting for a CPU before getpeername (quiet), then 5 µs to the accept4 (under
    // the 20 µs floor): one 1 ms gap, through getpeername, all of it runnable.
    let events = vec![
        with("epoll_wait", 5, 0, None),
        with("read", 8, 10_000, Some(split(9_000, 0))),
        with("getpeername", 8, 1_011_000, Some(split(10_000, 990_000))),
        with("accept4", 6, 1_017_000, Some(split(5_000, 0))),
        with("read", 8, 1_030_000, Some(split(12_000, 0))),
        with("epoll_wait", 5, 1_050_000, Some(split(19_000, 0))),
    ];
    let mut buf = vec![];
    let (_dir, side, mut r) = recorder_with_sched(&mut buf, 20_000);
    let opts = || Options {
        threshold_ns: 200_000,
        top: 20,
        root_pid: Some(100),
        stamped_at_stops: true,
        ..Default::default()
    };
    let info = || live_info("bpf");
    let mut live = Analyzer::new(opts());
    for e in &events {
        live.push(e);
        r.write_event(e).unwrap();
    }
    r.finish().unwrap();
    let live = live.finish(info(), Counters::default());
    // The replay, as `analyze FILE` gives each call its split from the sidecar.
    let mut splits = parse_sched(&std::fs::read_to_string(&side).unwrap()).unwrap();
    let mut back = Analyzer::new(opts());
    for mut e in read_back(&String::from_utf8(buf).unwrap()) {
        let line = e.line;
        if let EventKind::Syscall(s) = &mut e.kind {
            s.sched = splits.remove(&line).map(Box::new);
        }
        back.push(&e);
    }
    let back = back.finish(info(), Counters::default());
    let causes = |r: &crate::report::Report| -> Vec<String> {
        r.stalls.iter().map(|s| s.cause.clone()).collect()
    };
    assert_eq!(causes(&live).len(), 1, "{:?}", causes(&live));
    assert!(
        causes(&live)[0].contains("waiting for a CPU"),
        "{:?}",
        causes(&live)
    );
    assert_eq!(causes(&live), causes(&back));
}

/// A socket's `-yy` annotation is written as strace prints it, arrow and all (the parser
/// classes a client connection by it); a path's `>` is escaped as strace escapes it.
#[test]
fn a_sockets_annotation_keeps_its_arrow() {
    let tcp = "TCP:[127.0.0.1:37111->127.0.0.1:36502]";
    assert_eq!(super::escape_annotation(tcp), tcp);
    assert_eq!(super::escape_annotation("/tmp/a>b"), "/tmp/a\\x3eb");
    assert_eq!(
        crate::fdtable::classify_path(tcp, None),
        crate::fdtable::FileClass::Client
    );
}
