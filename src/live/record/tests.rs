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
