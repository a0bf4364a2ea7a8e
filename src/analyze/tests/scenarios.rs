//! Unit tests for each analysis rule on small synthetic event sequences, including the
//! false positives a naive tool reports (idle waits, sleeping bio threads, reused fds).
#![allow(clippy::too_many_arguments)]

use super::*;
use crate::event::{Data, DurSource, Event, EventKind, Extra, InFlight, Ret, Syscall};
use crate::report::{Bound, FileClass, FindingId, Role, StallKind};
use crate::source::{Clock, Counters, SourceInfo, TimeFmt};

const MS: i64 = 1_000_000;
const US: i64 = 1_000;
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";
const PONG: &[u8] = b"+PONG\r\n";
const GET: &[u8] = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
const SET: &[u8] = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n";
const OK: &[u8] = b"+OK\r\n";
const EVAL: &[u8] = b"*3\r\n$4\r\nEVAL\r\n$1\r\nx\r\n$1\r\n0\r\n";

struct Seq {
    a: Analyzer,
    line: u64,
    /// Where `next_call` puts the main thread's next call.
    at: i64,
}

impl Seq {
    fn new() -> Self {
        Self::with(Options {
            root_pid: Some(100),
            ..Default::default()
        })
    }
    /// Redis's process 100 with these threads named as `--threads` would name them.
    fn named(names: &[(Tid, &str)]) -> Self {
        Self::with(Options {
            root_pid: Some(100),
            thread_names: names.iter().map(|(t, n)| (*t, n.to_string())).collect(),
            ..Default::default()
        })
    }
    fn with(o: Options) -> Self {
        Seq {
            a: Analyzer::new(o),
            line: 0,
            at: 0,
        }
    }
    /// Redis with one I/O thread, both named as `--threads` would name them.
    fn with_io_thread() -> Self {
        Self::named(&[(100, "redis-server"), (102, "io_thd_1")])
    }
    fn ev(&mut self, tid: u32, ts: i64, kind: EventKind) {
        self.line += 1;
        self.a.push(&Event {
            tid,
            ts,
            line: self.line,
            kind,
        });
    }
    /// A finished call with a measured duration.
    fn call(
        &mut self,
        tid: u32,
        ts: i64,
        dur: i64,
        name: &'static str,
        fd: Option<i32>,
        ret: i64,
        extra: Extra,
    ) {
        let mut sc = Syscall::new(name);
        sc.fd = fd;
        sc.ret = Ret::Val(ret);
        sc.dur = Some(dur);
        sc.dur_src = DurSource::Measured;
        sc.extra = extra;
        self.ev(tid, ts, EventKind::Syscall(sc));
    }
    /// A wait of the event loop, whose epoll fd is 5 in these sequences.
    fn epoll_wait(&mut self, tid: u32, ts: i64, dur: i64, ready: i64) {
        self.call(tid, ts, dur, "epoll_wait", Some(5), ready, Extra::None);
    }
    /// A fork: a clone that makes a process (`child`), not a thread.
    fn fork(&mut self, tid: u32, ts: i64, dur: i64, child: i64) {
        let extra = Extra::Clone { thread: false };
        self.call(tid, ts, dur, "clone", None, child, extra);
    }
    /// A client's connection (`fd`) accepted on the listening socket, fd 6.
    fn accept(&mut self, tid: u32, ts: i64, dur: i64, fd: i64) {
        self.call(tid, ts, dur, "accept4", Some(6), fd, Extra::None);
    }
    fn fdatasync(&mut self, tid: u32, ts: i64, dur: i64, fd: i32) {
        self.call(tid, ts, dur, "fdatasync", Some(fd), 0, Extra::None);
    }
    /// A main-thread call that starts where the one before it ended (`at`), timed as `src`
    /// times it and returning `data`'s length (1 without data): a synchronous client's
    /// turns, whose timing rules depend on how each duration is known.
    fn next_call(&mut self, name: &'static str, fd: i32, dur: i64, src: DurSource, data: &[u8]) {
        let mut sc = Syscall::new(name);
        sc.fd = Some(fd);
        sc.ret = Ret::Val(data.len().max(1) as i64);
        (sc.dur, sc.dur_src) = (Some(dur), src);
        if !data.is_empty() {
            sc.extra = Extra::Data(Data::new(data, false));
        }
        self.ev(100, self.at, EventKind::Syscall(sc));
        self.at += dur;
    }
    /// A call the trace shows only part of: in flight at its start or end, `dur` long as
    /// far as the trace knows (no result).
    fn partial(
        &mut self,
        tid: u32,
        ts: i64,
        name: &'static str,
        fd: Option<i32>,
        dur: (i64, DurSource),
        in_flight: InFlight,
    ) {
        let mut sc = Syscall::new(name);
        sc.fd = fd;
        (sc.dur, sc.dur_src) = (Some(dur.0), dur.1);
        sc.in_flight = Some(in_flight);
        self.ev(tid, ts, EventKind::Syscall(sc));
    }
    fn open(&mut self, tid: u32, ts: i64, path: &str, fd: i64) {
        self.call(
            tid,
            ts,
            20 * US,
            "openat",
            None,
            fd,
            Extra::Path(path.into()),
        );
    }
    fn read(&mut self, tid: u32, ts: i64, fd: i32, data: &[u8]) {
        self.call(
            tid,
            ts,
            10 * US,
            "read",
            Some(fd),
            data.len() as i64,
            Extra::Data(Data::new(data, false)),
        );
    }
    fn write(&mut self, tid: u32, ts: i64, dur: i64, fd: i32, data: &[u8]) {
        self.call(
            tid,
            ts,
            dur,
            "write",
            Some(fd),
            data.len() as i64,
            Extra::Data(Data::new(data, false)),
        );
    }
    fn report(self) -> Report {
        self.report_with(Clock {
            fmt: TimeFmt::Epoch,
            perf: false,
            frac_digits: 6,
            first: 0,
            date: None,
            wall_at_first: None,
        })
    }
    fn report_with(self, clock: Clock) -> Report {
        let info = SourceInfo {
            kind: crate::report::SourceKind::Strace,
            files: vec![],
            format: "test".into(),
            pid: Some(100),
            clock,
        };
        self.a.finish(info, Counters::default())
    }
}

fn ids(r: &Report) -> Vec<&str> {
    r.findings.iter().map(|f| f.id.as_str()).collect()
}

fn assert_no_gap(r: &Report) {
    if let Some(gap) = r.stalls.iter().find(|x| x.kind == StallKind::Gap) {
        panic!("a gap: {gap:?}");
    }
}

/// The report as the table prints it.
fn table_text(r: &Report) -> String {
    let mut out = Vec::new();
    crate::render::table::render(r, &mut out, false).unwrap();
    String::from_utf8(out).unwrap()
}

/// The table's section of calls still running when the trace ended.
fn still_running(r: &Report) -> String {
    let text = table_text(r);
    text.split("STILL RUNNING")
        .nth(1)
        .unwrap_or_else(|| panic!("no in-flight section: {text}"))
        .to_string()
}

#[test]
fn idle_main_thread_is_not_a_stall() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 2_000 * MS, 0);
    s.call(100, 2_000 * MS, 20 * US, "getpid", None, 100, Extra::None);
    // A long exit_group is no stall, and no idle time either.
    s.call(100, 2_001 * MS, 50 * MS, "exit_group", None, 0, Extra::None);
    let r = s.report();
    assert!(r.stalls.is_empty(), "{:?}", r.stalls);
    assert_eq!(r.idle.len(), 1, "{:?}", r.idle);
    assert_eq!(r.idle[0].role, "main");
    assert_eq!(r.idle[0].syscall, "epoll_wait");
    assert_eq!(r.idle[0].total_us, 2_000_000);
}

#[test]
fn sleeping_bio_thread_is_not_a_stall_but_a_main_futex_is() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 0);
    s.call(101, 0, 5_000 * MS, "futex", None, 0, Extra::None);
    s.call(100, MS, 50 * MS, "futex", None, 0, Extra::None);
    let r = s.report();
    assert_eq!(r.stalls.len(), 1, "{:?}", r.stalls);
    assert_eq!(r.stalls[0].who.tid, 100);
    assert_eq!(r.stalls[0].who.thread, "main");
}

/// Sleeping is how background threads wait for work, but redis's main thread only ever
/// waits in epoll: a sleep or poll there (DEBUG SLEEP, MIGRATE) holds every client.
#[test]
fn sleep_is_idle_in_a_bio_thread_and_a_stall_in_main() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 0);
    s.call(101, 0, 1_000 * MS, "clock_nanosleep", None, 0, Extra::None);
    s.call(100, MS, 150 * MS, "clock_nanosleep", None, 0, Extra::None);
    s.call(100, 160 * MS, 40 * MS, "poll", None, 1, Extra::None);
    let r = s.report();
    assert_eq!(r.stalls.len(), 2, "{:?}", r.stalls);
    assert!(r.stalls.iter().all(|x| x.who.tid == 100));
    assert!(r
        .stalls
        .iter()
        .all(|x| x.finding.map(FindingId::as_str) == Some("command")));
    assert!(r
        .idle
        .iter()
        .any(|i| i.syscall == "clock_nanosleep" && i.total_us == 1_000_000));
}

/// io threads spin, without a syscall, until the main thread hands them clients: their
/// gaps are waits for work. A bio thread's gap is its own background work (lazy free). The
/// main thread's own gap still counts.
#[test]
fn io_and_bio_thread_gaps_are_not_stalls() {
    let mut s = Seq::named(&[(102, "io_thd_1"), (103, "bio_lazy_free")]);
    s.call(102, 0, 10 * US, "read", Some(9), 10, Extra::None);
    s.epoll_wait(100, 0, 10 * US, 1);
    s.call(102, 200 * MS, 10 * US, "write", Some(9), 5, Extra::None);
    // bio_lazy_free freeing a flushed keyspace: 250 ms of its own work, no client waits.
    s.call(103, 0, 10 * US, "futex", None, 0, Extra::None);
    s.call(103, 250 * MS, 10 * US, "munmap", None, 0, Extra::None);
    s.epoll_wait(100, 300 * MS, 10 * US, 1);
    let r = s.report();
    assert_eq!(r.stalls.len(), 1, "{:?}", r.stalls);
    assert_eq!(r.stalls[0].who.thread, "main");
    assert_eq!(r.stalls[0].kind, StallKind::Gap);
}

/// A call cut by the end of the trace is listed whatever the trace saw of it.
#[test]
fn calls_cut_by_the_trace_end_are_listed_whatever_their_known_part() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 0);
    s.partial(
        100,
        MS,
        "fdatasync",
        Some(7),
        (40 * US, DurSource::Measured),
        InFlight::AtEnd,
    );
    s.partial(
        101,
        MS,
        "close",
        Some(8),
        (3 * MS, DurSource::Measured),
        InFlight::AtEnd,
    );
    let r = s.report();
    assert!(r.stalls.is_empty(), "{:?}", r.stalls);
    // Issue 13: a call still running when strace let go can be the whole incident, even
    // with little of it known (the fdatasync is under a tenth of the threshold).
    let names: Vec<_> = r.in_flight.iter().map(|c| c.syscall.as_deref()).collect();
    assert_eq!(
        names,
        [Some("fdatasync"), Some("close")],
        "{:?}",
        r.in_flight
    );
}

#[test]
fn gap_in_main_thread_is_a_command_stall() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 0);
    s.call(100, 300 * MS, 10 * US, "write", Some(9), 5, Extra::None);
    let r = s.report();
    assert_eq!(r.stalls.len(), 1);
    let st = &r.stalls[0];
    assert_eq!(st.kind, StallKind::Gap);
    assert_eq!(st.duration_us, 299_990);
    assert_eq!(st.finding.map(FindingId::as_str), Some("command"));
    assert!(ids(&r).contains(&"command"));
}

#[test]
fn reused_fd_number_is_attributed_to_the_right_file() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 0);
    s.open(100, MS, "/proc/self/stat", 8);
    s.call(100, 2 * MS, 10 * US, "close", Some(8), 0, Extra::None);
    s.open(100, 3 * MS, "/data/redis.log", 8);
    s.call(100, 4 * MS, 4_000 * MS, "close", Some(8), 0, Extra::None);
    s.accept(100, 4_005 * MS, 10 * US, 8);
    let r = s.report();
    assert_eq!(r.stalls.len(), 1);
    assert_eq!(r.stalls[0].target.class, Some(FileClass::Log));
    assert_eq!(r.stalls[0].target.path.as_deref(), Some("/data/redis.log"));
    assert_eq!(
        r.stalls[0].finding.map(FindingId::as_str),
        Some("log-file-blocking")
    );
}

/// A slow open of the log file (redis reopens it for every line) touched the log file: the
/// stall names it and the fd it returned, and the log-file finding explains it.
#[test]
fn slow_open_is_attributed_to_the_file_it_opens() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 0);
    s.call(
        100,
        MS,
        80 * MS,
        "openat",
        None,
        11,
        Extra::Path("/data/redis.log".into()),
    );
    s.call(100, 82 * MS, 10 * US, "close", Some(11), 0, Extra::None);
    let r = s.report();
    assert_eq!(r.stalls.len(), 1, "{:?}", r.stalls);
    let st = &r.stalls[0];
    assert_eq!(st.syscall.as_deref(), Some("openat"));
    assert_eq!(st.target.fd, Some(11));
    assert_eq!(st.target.class, Some(FileClass::Log));
    assert_eq!(st.target.path.as_deref(), Some("/data/redis.log"));
    assert_eq!(st.finding.map(FindingId::as_str), Some("log-file-blocking"));
}

#[test]
fn fsync_of_the_aof_in_main_is_aof_fsync_always_even_without_stalls() {
    let mut s = Seq::new();
    s.open(100, 0, "/data/appendonlydir/appendonly.aof.1.incr.aof", 7);
    for i in 0..20 {
        let t = MS + i * MS;
        s.epoll_wait(100, t, 10 * US, 1);
        // The request the wait returned (a loop that never reads is a filtered trace).
        s.read(100, t + 12 * US, 9, b"*3\r\n$4\r\nSADD\r\n");
        s.write(100, t + 20 * US, 10 * US, 7, b"*3\r\n$4\r\nSADD\r\n");
        s.fdatasync(100, t + 40 * US, 150 * US, 7);
    }
    let r = s.report();
    assert!(r.stalls.is_empty());
    assert_eq!(ids(&r), vec!["aof-fsync-always"]);
}

#[test]
fn aof_write_overlapping_background_fsync_is_pending_fsync() {
    let mut s = Seq::new();
    s.open(100, 0, "/data/appendonly.aof", 7);
    s.epoll_wait(100, MS, 499 * MS, 1);
    // bio thread: a slow fdatasync of the AOF, 10..1010 ms
    s.fdatasync(101, 10 * MS, 1_000 * MS, 7);
    // main: write to the AOF blocked 500..1010 ms, inside that fsync
    s.write(100, 500 * MS, 510 * MS, 7, b"*3\r\n$3\r\nSET\r\n");
    let r = s.report();
    let main = r.stalls.iter().find(|x| x.who.thread == "main").unwrap();
    assert_eq!(
        main.finding.map(FindingId::as_str),
        Some("aof-write-pending-fsync")
    );
    let bio = r.stalls.iter().find(|x| x.who.tid == 101).unwrap();
    assert_eq!(bio.who.thread, "bio_aof");
    assert_eq!(
        bio.finding.map(FindingId::as_str),
        Some("aof-fsync-background")
    );
    // A bio stall holds up no client by itself...
    assert_eq!(bio.waiting.commands, 0);
    // ...but its finding does not claim that clients were spared.
    let f = r
        .findings
        .iter()
        .find(|f| f.id == "aof-fsync-background")
        .unwrap();
    assert!(!f.title.contains("not blocked"), "{}", f.title);
}

#[test]
fn aof_write_alone_when_nothing_else_runs() {
    let mut s = Seq::new();
    s.open(100, 0, "/data/appendonly.aof", 7);
    s.epoll_wait(100, MS, 10 * US, 1);
    s.write(100, 2 * MS, 50 * MS, 7, b"*3\r\n$3\r\nSET\r\n");
    let r = s.report();
    assert_eq!(
        r.stalls[0].finding.map(FindingId::as_str),
        Some("aof-write-alone")
    );
    // Nothing in the trace says the disk is busy: a write() is held by the kernel's
    // throttling or writeback, a FUSE or network filesystem's round trip, or by redis being
    // descheduled (on a slow FUSE disk whose daemon was starved, writes took 11-56 ms).
    let cause = &r.stalls[0].cause;
    assert!(!cause.contains("the disk is saturated"), "{cause}");
    assert!(cause.contains("descheduled"), "{cause}");
}

#[test]
fn fork_starts_a_phase_that_sigchld_ends_and_aof_stalls_blame_the_child() {
    let mut s = Seq::new();
    s.open(100, 0, "/data/appendonly.aof", 7);
    s.epoll_wait(100, MS, 10 * US, 1);
    s.fork(100, 10 * MS, 25 * MS, 200);
    s.open(200, 40 * MS, "/data/temp-rewriteaof-200.aof", 9);
    s.write(200, 41 * MS, MS, 9, b"*2\r\n$6\r\nSELECT\r\n");
    s.fdatasync(100, 100 * MS, 300 * MS, 7);
    s.ev(
        200,
        900 * MS,
        EventKind::Exit {
            code: Some(0),
            signal: None,
        },
    );
    s.ev(
        100,
        901 * MS,
        EventKind::Signal {
            name: "SIGCHLD",
            si_pid: Some(200),
        },
    );
    s.fdatasync(100, 950 * MS, 10 * MS, 7);
    let r = s.report();
    assert_eq!(r.phases.len(), 1);
    let p = &r.phases[0];
    assert_eq!(p.kind, "aof_rewrite");
    assert_eq!(p.child_pid, 200);
    assert_eq!(p.fork_us, Some(25_000));
    assert_eq!(p.end_at_us, Some(900_000));
    assert_eq!(p.ended_by, Some(report::EndedBy::Exit));
    let during = r
        .stalls
        .iter()
        .find(|x| x.syscall.as_deref() == Some("fdatasync") && x.duration_us == 300_000)
        .unwrap();
    assert_eq!(
        during.finding.map(FindingId::as_str),
        Some("aof-write-active-child")
    );
    let after = r
        .stalls
        .iter()
        .find(|x| x.duration_us == 10_000 && x.syscall.as_deref() == Some("fdatasync"))
        .unwrap();
    assert_eq!(
        after.finding.map(FindingId::as_str),
        Some("aof-fsync-always")
    );
    assert!(r
        .stalls
        .iter()
        .any(|x| x.finding.map(FindingId::as_str) == Some("fork")));
    // The child's thread is a child, never main.
    assert!(r.threads.iter().any(|t| t.tid == 200 && t.role == "child"));
}

/// The save child's slow read of its own smaps (redis's copy-on-write report) is explained
/// as that, and a slow read of another /proc file in the child is not.
#[test]
fn child_reading_its_smaps_is_the_copy_on_write_report() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 1);
    s.fork(100, MS, 5 * MS, 200);
    s.open(200, 10 * MS, "/proc/self/smaps", 12);
    s.call(200, 11 * MS, 30 * MS, "read", Some(12), 1024, Extra::None);
    s.open(200, 50 * MS, "/proc/self/stat", 13);
    s.call(200, 51 * MS, 20 * MS, "read", Some(13), 300, Extra::None);
    let r = s.report();
    let by_fd = |fd| r.stalls.iter().find(|x| x.target.fd == Some(fd)).unwrap();
    assert_eq!(
        by_fd(12).finding.map(FindingId::as_str),
        Some("child-cow-report")
    );
    assert_eq!(by_fd(13).finding, None);
    let f = r
        .findings
        .iter()
        .find(|f| f.id == "child-cow-report")
        .unwrap();
    assert_eq!(f.severity, crate::report::Severity::Info);
    assert_eq!(f.stalls, 1);
}

#[test]
fn gap_during_a_child_is_copy_on_write() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 1);
    s.fork(100, MS, 5 * MS, 300);
    s.epoll_wait(100, 100 * MS, 10 * US, 1);
    let r = s.report();
    let gap = r.stalls.iter().find(|x| x.kind == StallKind::Gap).unwrap();
    assert_eq!(gap.finding.map(FindingId::as_str), Some("cow-page-faults"));
    assert_eq!(r.phases[0].kind, "bgsave", "no AOF in use: an RDB save");
}

#[test]
fn commands_are_timed_and_counted_as_held_by_a_stall() {
    let mut s = Seq::new();
    s.accept(100, 0, 10 * US, 9);
    s.open(100, MS, "/data/redis.log", 11);
    // epoll blocks until the request arrives at 10 ms
    s.epoll_wait(100, 2 * MS, 8 * MS, 1);
    s.read(
        100,
        10 * MS + 20 * US,
        9,
        b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n",
    );
    s.call(100, 11 * MS, 2_000 * MS, "close", Some(11), 0, Extra::None);
    s.write(100, 2_011 * MS, 10 * US, 9, b"$1\r\nv\r\n+PONG\r\n");
    let r = s.report();
    let get = r
        .commands
        .iter()
        .find(|c| c.command == "GET" && c.phase == "all")
        .unwrap();
    assert_eq!(get.calls, 1);
    // from arrival (end of the wait, 10 ms) to the end of the reply write
    assert_eq!(get.p50_us, 2_001_010);
    let st = &r.stalls[0];
    assert_eq!(st.waiting.commands, 2);
    assert_eq!(st.waiting.clients, 1);
    assert_eq!(st.waiting.by_command.get("PING"), Some(&1));
    assert!(
        get.log_us >= 2_000_000,
        "log time attributed: {}",
        get.log_us
    );
    // No key names anywhere in the report.
    let json = serde_json::to_string(&r).unwrap();
    assert!(!json.contains("\"k\""));
}

/// The main thread opens the log file, then closes it, the close cut by the trace.
fn log_close_cut(known: (i64, DurSource), in_flight: InFlight) -> Report {
    let mut s = Seq::new();
    s.open(100, 0, "/data/redis.log", 11);
    s.partial(100, MS, "close", Some(11), known, in_flight);
    s.report()
}

#[test]
fn call_still_running_at_the_end_is_listed_even_below_the_threshold() {
    let r = log_close_cut((2 * MS, DurSource::Paired), InFlight::AtEnd);
    assert!(r.stalls.is_empty());
    assert_eq!(r.in_flight.len(), 1);
    assert_eq!(r.in_flight[0].bound, Bound::AtLeast);
    assert_eq!(r.in_flight[0].target.class, Some(FileClass::Log));
}

#[test]
fn call_running_before_tracing_began_becomes_an_at_least_stall() {
    let r = log_close_cut((4_800 * MS, DurSource::Measured), InFlight::AtStart);
    assert_eq!(r.stalls.len(), 1);
    assert_eq!(r.stalls[0].bound, Bound::AtLeast);
    assert_eq!(r.stalls[0].in_flight, Some(InFlight::AtStart));
}

/// Without names: the thread that fsyncs the AOF over and over is bio_aof; the one that
/// fsyncs the old AOF only to close it (after a rewrite) is bio_close_file.
#[test]
fn fsync_then_close_is_bio_close_file_repeated_fsync_is_bio_aof() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 0);
    s.open(100, MS, "/data/appendonlydir/appendonly.aof.1.incr.aof", 7);
    s.open(
        100,
        2 * MS,
        "/data/appendonlydir/appendonly.aof.2.incr.aof",
        9,
    );
    for i in 0..3 {
        s.fdatasync(101, (10 + i) * MS, 100 * US, 9);
    }
    s.call(102, 20 * MS, 100 * US, "fsync", Some(7), 0, Extra::None);
    s.call(102, 21 * MS, 50 * US, "close", Some(7), 0, Extra::None);
    let r = s.report();
    let role = |t| r.threads.iter().find(|x| x.tid == t).unwrap().role;
    assert_eq!(role(101), "bio_aof");
    assert_eq!(role(102), "bio_close_file");
}

/// A thread that closes files is bio_close_file only beside redis's epoll loop: a worker of
/// any program waiting in poll() beside it does not make it one.
#[test]
fn closing_files_is_no_redis_role_without_an_epoll_loop_beside() {
    let closer = |loop_call: &'static str| {
        let mut s = Seq::new();
        s.call(101, 0, 10 * US, loop_call, Some(5), 1, Extra::None);
        s.open(102, MS, "/tmp/artifact.txt", 7);
        s.call(102, 2 * MS, 50 * US, "close", Some(7), 0, Extra::None);
        let r = s.report();
        r.threads.iter().find(|x| x.tid == 102).unwrap().role
    };
    assert_eq!(closer("epoll_wait"), "bio_close_file");
    assert_ne!(closer("poll"), "bio_close_file");
}

/// Names as /proc and `strace -Y` give them: cut at 15 bytes, redis or valkey.
#[test]
fn role_names_of_redis_and_valkey() {
    for (name, role) in [
        ("redis-server", Role::Main),
        ("valkey-server", Role::Main),
        ("bio_aof_fsync", Role::BioAof),
        ("bio_aof", Role::BioAof),
        ("bio_close_file", Role::BioCloseFile),
        ("bio_lazy_free", Role::BioLazyFree),
        ("io_thd_3", Role::IoThread),
        ("redis-rdb-bgsav", Role::Child),
        ("redis-aof-rewri", Role::Child),
        ("valkey-rdb-bgsa", Role::Child),
        ("jemalloc_bg_thd", Role::JemallocBg),
        ("bio_rdb_save", Role::BioRdbSave),
        ("bio_tls_reload", Role::BioTlsReload),
    ] {
        assert_eq!(Role::from_name(name), Some(role), "{name}");
    }
}

/// A replica's PSYNC is a command; once it is answered the connection carries the
/// replication stream out and REPLCONF ACKs in, which are no requests and replies.
#[test]
fn connection_becomes_a_replica_after_psync_is_answered() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 1);
    s.accept(100, MS, 10 * US, 9);
    s.epoll_wait(100, 2 * MS, 10 * US, 1);
    s.read(
        100,
        3 * MS,
        9,
        b"*3\r\n$5\r\nPSYNC\r\n$1\r\n?\r\n$2\r\n-1\r\n",
    );
    s.write(100, 4 * MS, 10 * US, 9, b"+FULLRESYNC 8de1 0\r\n");
    for i in 0..5 {
        let t = (10 + i * 1000) * MS;
        s.epoll_wait(100, t, 10 * US, 1);
        s.read(
            100,
            t + MS,
            9,
            b"*3\r\n$8\r\nREPLCONF\r\n$3\r\nACK\r\n$1\r\n0\r\n",
        );
        // The replication stream, 300 ms later: no reply to the ACK.
        s.write(100, t + 300 * MS, 10 * US, 9, PING);
    }
    let r = s.report();
    let cmds: Vec<&str> = r
        .commands
        .iter()
        .filter(|c| c.phase == "all")
        .map(|c| c.command.as_str())
        .collect();
    assert_eq!(cmds, ["PSYNC"]);
    assert!(r
        .fds
        .iter()
        .any(|f| f.fd == 9 && f.class == FileClass::Replica && f.calls >= 10));
}

#[test]
fn thread_names_decide_roles() {
    let mut s = Seq::named(&[(101, "bio_close_file"), (102, "io_thd_1")]);
    s.call(101, 0, 20 * MS, "close", Some(12), 0, Extra::None);
    s.call(102, 0, 10 * US, "read", Some(9), 0, Extra::None);
    let r = s.report();
    let role = |t| r.threads.iter().find(|x| x.tid == t).unwrap().role;
    assert_eq!(role(101), "bio_close_file");
    assert_eq!(role(102), "io_thread");
}

#[test]
fn close_running_before_the_trace_with_unknown_fd_says_what_it_likely_is() {
    let mut s = Seq::new();
    s.partial(
        100,
        0,
        "close",
        None,
        (4_800 * MS, DurSource::Measured),
        InFlight::AtStart,
    );
    s.epoll_wait(100, 4_801 * MS, 10 * US, 0);
    let r = s.report();
    assert_eq!(r.stalls.len(), 1);
    assert_eq!(r.stalls[0].bound, Bound::AtLeast);
    assert!(
        r.stalls[0].cause.contains("log file"),
        "{}",
        r.stalls[0].cause
    );
    assert!(r.stalls[0].finding.is_none());
}

/// Issue 13: a request found by a wait that returned at once right after a call already
/// running when tracing began is dated from that call's end: the trace cannot show it was
/// sent while the call ran (it was dated from the trace's start, held by the fdatasync).
#[test]
fn request_found_after_a_stall_at_the_start_is_not_dated_before_it() {
    let mut s = Seq::new();
    // fdatasync already running at attach, 0..3 s; then the loop finds a queued PING.
    s.partial(
        100,
        0,
        "fdatasync",
        Some(7),
        (3_000 * MS, DurSource::Measured),
        InFlight::AtStart,
    );
    s.epoll_wait(100, 3_000 * MS, 5 * US, 1);
    s.read(100, 3_001 * MS, 9, PING);
    s.write(100, 3_002 * MS, 10 * US, 9, PONG);
    let r = s.report();
    assert_eq!(r.stalls[0].waiting.commands, 0, "{:?}", r.stalls[0]);
    let ping = r.commands.iter().find(|c| c.command == "PING").unwrap();
    // From the fdatasync's end (the wait's start) to the end of the reply.
    assert_eq!(ping.p50_us, 2_010);
}

#[test]
fn untraced_child_forked_right_after_a_new_incr_aof_is_a_rewrite() {
    let mut s = Seq::new();
    s.open(100, 0, "/data/appendonlydir/appendonly.aof.1.incr.aof", 7);
    s.epoll_wait(100, MS, 10 * US, 1);
    s.open(
        100,
        500 * MS,
        "/data/appendonlydir/appendonly.aof.2.incr.aof",
        12,
    );
    s.fork(100, 501 * MS, 5 * MS, 400);
    s.epoll_wait(100, 600 * MS, 10 * US, 1);
    let r = s.report();
    assert_eq!(r.phases[0].kind, "aof_rewrite");
    // Without that open, an AOF in use leaves the kind open.
    let mut s = Seq::new();
    s.open(100, 0, "/data/appendonlydir/appendonly.aof.1.incr.aof", 7);
    s.fork(100, 501 * MS, 5 * MS, 400);
    assert_eq!(s.report().phases[0].kind, "child");
}

#[test]
fn a_filtered_trace_reports_no_gaps() {
    // `strace -e trace=fdatasync`: only the fsyncs, 100 ms apart.
    let mut s = Seq::new();
    s.open(100, 0, "/data/appendonly.aof", 7);
    for i in 0..1200 {
        s.fdatasync(100, MS + i * 100 * MS, 150 * US, 7);
    }
    let r = s.report();
    assert_no_gap(&r);
    assert!(ids(&r).contains(&"filtered-trace"));
}

/// `strace -e trace=epoll_wait,fdatasync`: the event loop is there, but not the reads and
/// accepts that serve what it returns, so the time between waits is not "no syscall".
#[test]
fn a_trace_filtered_to_the_waits_reports_no_gaps() {
    let trace = |serve: bool| {
        let mut s = Seq::new();
        s.open(100, 0, "/data/appendonly.aof", 7);
        for i in 0..20 {
            let t = MS + i * 100 * MS;
            s.epoll_wait(100, t, 50 * US, 1);
            if serve {
                s.read(100, t + 60 * US, 9, PING);
            }
            // 40 ms in untraced calls (or, served, in the command) before the next wait.
            s.fdatasync(100, t + 40 * MS, 150 * US, 7);
        }
        s.report()
    };
    let r = trace(false);
    assert_no_gap(&r);
    assert!(ids(&r).contains(&"filtered-trace"), "{:?}", ids(&r));
    // The same loop reading what it was told of: its 40 ms gaps are stalls.
    let r = trace(true);
    assert!(
        r.stalls.iter().any(|x| x.kind == StallKind::Gap),
        "{:?}",
        r.stalls
    );
    assert!(!ids(&r).contains(&"filtered-trace"), "{:?}", ids(&r));
}

/// strace -t's clock: time of day in whole seconds.
fn whole_seconds() -> Clock {
    Clock {
        fmt: TimeFmt::TimeOfDay,
        perf: false,
        frac_digits: 0,
        first: 0,
        date: None,
        wall_at_first: None,
    }
}

#[test]
fn whole_second_timestamps_report_no_gaps() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 0);
    s.call(100, 1_000 * MS, 10 * US, "write", Some(9), 5, Extra::None);
    let r = s.report_with(whole_seconds());
    assert!(r.stalls.is_empty(), "{:?}", r.stalls);
    assert!(ids(&r).contains(&"gaps-unmeasurable"));
}

/// With whole-second timestamps (strace -t) a command's read and its reply carry the seconds
/// they fell in: a GET read late in one second and answered early in the next would be timed
/// at about 1 s, and a client's wait through a stall likewise. Only each call's -T is
/// measured: the 20 ms close is still a stall, the command times and waits are not given.
#[test]
fn whole_second_timestamps_time_no_command_and_no_wait() {
    let mut s = Seq::new();
    s.accept(100, 0, 10 * US, 9);
    s.epoll_wait(100, 0, 10 * US, 1);
    s.read(100, 1_000 * MS, 9, GET);
    s.call(100, 1_000 * MS, 20 * MS, "close", Some(11), 0, Extra::None);
    s.write(100, 2_000 * MS, 10 * US, 9, b"$1\r\nv\r\n");
    let r = s.report_with(whole_seconds());
    assert!(r.commands.is_empty(), "{:?}", r.commands);
    let st = r
        .stalls
        .iter()
        .find(|s| s.syscall.as_deref() == Some("close"))
        .expect("the 20 ms close is measured by -T");
    assert_eq!(st.duration_us, 20_000);
    assert_eq!(st.waiting.worst_us, None);
    assert!(r.incidents.iter().all(|i| i.worst_wait_us.is_none()));
    let f = r
        .findings
        .iter()
        .find(|f| f.id == FindingId::GapsUnmeasurable)
        .unwrap();
    assert!(f.evidence.contains("read to reply"), "{}", f.evidence);
}

/// Without `-T` every duration is an upper bound that includes the tracer's own stop: a wait
/// "lasting" about what the thread's other calls take returned at once, so the request was
/// queued since the previous reply; a wait well above that blocked until the request came.
#[test]
fn wait_timed_as_an_upper_bound_blocked_only_if_it_beats_the_tracers_cost() {
    let mut s = Seq::new();
    let ub = DurSource::UpperBound;
    // A synchronous client under strace: every call "takes" 40 µs, the tracer's cost.
    for _ in 0..50 {
        s.next_call("epoll_wait", 5, 40 * US, ub, b"");
        s.next_call("read", 9, 40 * US, ub, GET);
        s.next_call("write", 9, 40 * US, ub, b"$1\r\nv\r\n");
    }
    // Then a client that paused: the wait blocked for 2 ms.
    s.next_call("epoll_wait", 5, 2 * MS, ub, b"");
    s.next_call("read", 9, 40 * US, ub, PING);
    s.next_call("write", 9, 40 * US, ub, PONG);
    let r = s.report();
    let p50 = |name: &str| {
        r.commands
            .iter()
            .find(|c| c.command == name && c.phase == "all")
            .unwrap()
            .p50_us
    };
    // Queued since the previous reply ended: wait, read and write.
    assert_eq!(p50("GET"), 120);
    // Arrived when the long wait ended: read and write.
    assert_eq!(p50("PING"), 80);
}

/// Under ptrace a blocked wait is stamped as ended only after the woken thread reached its
/// exit stop and the tracer ran, so the request is counted from one tracer round trip (the
/// thread's usual gap between calls) earlier. Kernel-stamped sources (perf) are not shifted.
#[test]
fn request_that_woke_the_loop_is_counted_from_a_tracer_round_trip_earlier_under_ptrace() {
    let p50_of_pings = |stamped_at_stops: bool| {
        let mut s = Seq::with(Options {
            stamped_at_stops,
            ..Default::default()
        });
        let call = |s: &mut Seq, name: &'static str, dur: i64, data: &[u8]| {
            let fd = if name == "epoll_wait" { 5 } else { 9 };
            s.next_call(name, fd, dur, DurSource::Measured, data);
            // 20 µs between calls: the tracer's two stops.
            s.at += 20 * US;
        };
        for _ in 0..60 {
            call(&mut s, "epoll_wait", 2 * MS, b"");
            call(&mut s, "read", 10 * US, PING);
            call(&mut s, "write", 10 * US, PONG);
        }
        let r = s.report();
        r.commands
            .iter()
            .find(|c| c.command == "PING" && c.phase == "all")
            .unwrap()
            .p50_us
    };
    // Wait end to reply end: gap, read, gap, write.
    assert_eq!(p50_of_pings(false), 60);
    assert_eq!(p50_of_pings(true), 80);
}

/// A trace where no call is shorter than half a millisecond was filtered by duration
/// (`perf trace --duration`): the time between two printed calls held unprinted ones, so
/// it is no gap, and the report says why gaps are missing.
#[test]
fn trace_filtered_by_duration_reports_no_gaps() {
    let mut s = Seq::new();
    let mut t = 0;
    for i in 0..25 {
        s.epoll_wait(100, t, 100 * MS, 0);
        t += 100 * MS;
        if i == 10 {
            // 40 ms between two calls the filter let through.
            s.fdatasync(100, t, 600 * US, 7);
            t += 40 * MS;
        }
    }
    let r = s.report();
    assert!(r.stalls.is_empty(), "{:?}", r.stalls);
    let f = r
        .findings
        .iter()
        .find(|f| f.id == "filtered-trace")
        .unwrap();
    assert!(f.evidence.contains("--duration"), "{}", f.evidence);
}

/// Under -T, the calls a process exit cuts short (`<... futex resumed>) = ?`) carry no
/// duration of their own and are timed from their halves: the trace still counts as
/// measured, with no note that durations were reconstructed.
#[test]
fn calls_cut_short_by_exit_do_not_make_a_measured_trace_mixed() {
    let mut s = Seq::new();
    for i in 0..10 {
        s.epoll_wait(100, i * MS, 10 * US, 0);
    }
    let mut sc = Syscall::new("futex");
    sc.ret = Ret::Unknown;
    (sc.dur, sc.dur_src) = (Some(5 * MS), DurSource::Paired);
    s.ev(101, 5 * MS, EventKind::Syscall(sc));
    s.call(100, 11 * MS, 2 * MS, "exit_group", None, 0, Extra::None);
    let r = s.report();
    assert_eq!(r.summary.durations, "measured");
}

/// Idle time is counted by a thread's final role: a futex the main thread made before its
/// first epoll_wait (when it could not yet be told from a background thread) is no idle
/// wait of the main thread.
#[test]
fn idle_time_follows_the_final_role() {
    let mut s = Seq::with(Options::default());
    s.call(100, 0, 2 * MS, "futex", None, 0, Extra::None);
    s.epoll_wait(100, 3 * MS, 100 * MS, 0);
    s.call(101, 0, 500 * MS, "futex", None, 0, Extra::None);
    let r = s.report();
    let idle: Vec<(&str, &str)> = r
        .idle
        .iter()
        .map(|i| (i.role.as_str(), i.syscall.as_str()))
        .collect();
    assert_eq!(idle, [("main", "epoll_wait"), ("other", "futex")]);
}

/// With no event loop in the trace and no attach line to name the process, its first
/// thread is the main thread, even if it closes a file as bio_close_file would.
#[test]
fn without_an_event_loop_the_first_thread_is_main() {
    let mut s = Seq::with(Options::default());
    s.open(200, 0, "/data/redis.log", 9);
    s.call(200, MS, 10 * US, "close", Some(9), 0, Extra::None);
    s.call(205, 2 * MS, 10 * US, "futex", None, 0, Extra::None);
    s.call(200, 50 * MS, 10 * US, "getpid", None, 200, Extra::None);
    let r = s.report();
    let role = |t| r.threads.iter().find(|x| x.tid == t).unwrap().role;
    assert_eq!(role(200), "main");
    assert_eq!(role(205), "other");
    // Issue 13: but with no event-loop wait at all its 49 ms without a syscall is no gap
    // stall (the trace may be filtered), said once.
    assert!(r.stalls.is_empty(), "{:?}", r.stalls);
    assert!(ids(&r).contains(&"filtered-trace"), "{:?}", ids(&r));
}

/// Live perf: only stalls found after the first lost event say they may be incomplete.
#[test]
fn only_stalls_after_a_loss_are_marked_incomplete() {
    let mut s = Seq::new();
    s.fdatasync(100, 0, 50 * MS, 5);
    s.a.add_lost_events(3);
    s.fdatasync(100, 55 * MS, 50 * MS, 5);
    let r = s.report();
    let lost: Vec<bool> = r.stalls.iter().map(|x| x.events_lost).collect();
    assert_eq!(lost, vec![false, true]);
    assert_eq!(r.summary.lost_events, 3);
}

/// Live printing decides whether gaps can be trusted with the clock it is given, as the final
/// report does: a whole-second clock prints no gap as a stall.
#[test]
fn live_printing_judges_gaps_by_the_clock_it_is_given() {
    let coarse = whole_seconds();
    let mut s = Seq::new();
    s.call(100, 0, 10 * US, "epoll_wait", None, 1, Extra::None);
    s.call(100, 200 * MS, 10 * US, "getpid", None, 100, Extra::None);
    let live = s.a.drain_new_stalls(&coarse);
    assert!(live.iter().all(|x| x.kind != StallKind::Gap), "{live:?}");
    assert!(s.report_with(coarse).stalls.is_empty());
}

/// Issue 13: each stall says how its duration is known, and upper bounds carry no critical.
#[test]
fn stalls_say_how_their_duration_is_known_and_upper_bounds_cap_severity() {
    use crate::report::{DurationKnown, Severity};
    let bounded = |src: DurSource| {
        let mut s = Seq::new();
        s.open(100, 0, "/data/appendonly.aof", 7);
        s.epoll_wait(100, MS, 10 * US, 1);
        let mut sc = Syscall::new("fdatasync");
        sc.fd = Some(7);
        sc.ret = Ret::Val(0);
        (sc.dur, sc.dur_src) = (Some(500 * MS), src);
        s.ev(100, 2 * MS, EventKind::Syscall(sc));
        s.epoll_wait(100, 503 * MS, 10 * US, 1);
        s.report()
    };
    let r = bounded(DurSource::UpperBound);
    assert_eq!(r.stalls.len(), 1, "{:?}", r.stalls);
    assert_eq!(r.stalls[0].duration_known, DurationKnown::UpperBound);
    let f = r.findings.iter().find(|f| f.stalls > 0).expect("a finding");
    assert!(f.severity <= Severity::Warning, "{f:?}");
    assert!(f.evidence.contains("upper bound"), "{}", f.evidence);
    for (src, known) in [
        (DurSource::Measured, DurationKnown::Measured),
        (DurSource::Paired, DurationKnown::Paired),
    ] {
        let r = bounded(src);
        assert_eq!(r.stalls[0].duration_known, known);
        let f = r.findings.iter().find(|f| f.stalls > 0).expect("a finding");
        assert_eq!(f.severity, Severity::Critical, "{f:?}");
        assert!(!f.evidence.contains("upper bound"), "{}", f.evidence);
    }
    // A gap after a call of unknown duration is an upper bound; after a measured call it is
    // measured by its two timestamps.
    let gap_after = |src: DurSource| {
        let mut s = Seq::new();
        s.epoll_wait(100, 0, 10 * US, 1);
        let mut sc = Syscall::new("kill");
        sc.ret = Ret::Val(100);
        if src == DurSource::Measured {
            (sc.dur, sc.dur_src) = (Some(10 * US), src);
        }
        s.ev(100, MS, EventKind::Syscall(sc));
        s.epoll_wait(100, 300 * MS, 10 * US, 1);
        s.report()
    };
    let r = gap_after(DurSource::Unknown);
    let g = r.stalls.iter().find(|x| x.kind == StallKind::Gap).unwrap();
    assert_eq!(g.duration_known, DurationKnown::UpperBound);
    assert_eq!(g.bound, Bound::AtMost);
    assert!(r.findings.iter().all(|f| f.severity < Severity::Critical));
    let r = gap_after(DurSource::Measured);
    let g = r.stalls.iter().find(|x| x.kind == StallKind::Gap).unwrap();
    assert_eq!(g.duration_known, DurationKnown::Measured);
}

fn role_of(r: &Report, tid: u32) -> &str {
    r.threads
        .iter()
        .find(|t| t.tid == tid)
        .map(|t| t.role.as_str())
        .unwrap_or("?")
}

/// Issue 13: a short trace filtered to a few syscalls (`-e trace=fdatasync`) shows no gap
/// stall, says why once, and its only thread is not called main for being the only one.
#[test]
fn a_short_filtered_trace_has_no_gaps_and_no_main_by_default() {
    let mut s = Seq::with(Options::default());
    for i in 0..30 {
        s.fdatasync(300, i * 200 * MS, 150 * US, 7);
    }
    let r = s.report();
    assert_no_gap(&r);
    assert_eq!(
        ids(&r).iter().filter(|i| **i == "filtered-trace").count(),
        1,
        "{:?}",
        ids(&r)
    );
    assert_ne!(role_of(&r, 300), "main", "{:?}", r.threads);
    // One thread sleeping 1 s (`perf trace` of sleep(1)): not main, so not a command that
    // slept holding every client.
    let mut s = Seq::with(Options::default());
    s.call(400, 0, 7 * US, "openat", None, 3, Extra::None);
    s.call(400, 30 * US, 1_000 * MS, "nanosleep", None, 0, Extra::None);
    let r = s.report();
    assert!(r.stalls.is_empty(), "{:?}", r.stalls);
    // A process waiting in poll has an event loop: its first thread is not main by default.
    let mut s = Seq::with(Options::default());
    s.call(500, 0, 10 * US, "write", Some(1), 5, Extra::None);
    s.call(500, MS, 500 * MS, "clock_nanosleep", None, 0, Extra::None);
    s.call(501, 2 * MS, 900 * MS, "poll", None, 1, Extra::None);
    let r = s.report();
    assert_ne!(role_of(&r, 500), "main", "{:?}", r.threads);
    assert!(r.stalls.is_empty(), "{:?}", r.stalls);
}

/// Issue 13: a trace with no timestamps and no -T measures nothing: durations `none`, no
/// stall, the reason said once with how to rerun strace, and a table headline that is not
/// "0 stalls".
#[test]
fn a_trace_without_timestamps_or_t_measures_nothing() {
    let mut s = Seq::new();
    let plain = |name: &'static str, fd: Option<i32>| {
        let mut sc = Syscall::new(name);
        sc.fd = fd;
        sc.ret = Ret::Val(0);
        EventKind::Syscall(sc)
    };
    s.ev(100, 0, plain("epoll_wait", Some(5)));
    s.ev(100, 0, plain("read", Some(9)));
    s.ev(100, 0, plain("fdatasync", Some(7)));
    // The one thing such a trace can time is an unfinished/resumed pair: at 0 ns apart.
    let mut sc = Syscall::new("close");
    sc.fd = Some(8);
    (sc.dur, sc.dur_src) = (Some(0), DurSource::Paired);
    s.ev(100, 0, EventKind::Syscall(sc));
    let r = s.report_with(Clock::none());
    assert_eq!(r.summary.durations, crate::report::Durations::None);
    assert!(r.stalls.is_empty(), "{:?}", r.stalls);
    let f = r
        .findings
        .iter()
        .find(|f| f.id == FindingId::GapsUnmeasurable)
        .expect("said once");
    assert!(f.evidence.contains("-ttt -T"), "{}", f.evidence);
    assert!(!f.evidence.contains("strace -t)"), "{}", f.evidence);
    let text = table_text(&r);
    let head = text.lines().next().unwrap();
    assert!(head.contains("durations cannot be known"), "{head}");
    assert!(!head.contains("0 stalls"), "{head}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["summary"]["durations"], "none");
}

/// perf trace text prints milliseconds with three decimals: a resolution of 1 µs, never
/// "1 ms (strace -t)".
#[test]
fn perf_text_has_microsecond_resolution() {
    let mut s = Seq::with(Options {
        root_pid: Some(100),
        threshold_ns: MS,
        ..Default::default()
    });
    s.epoll_wait(100, 0, 10 * US, 0);
    s.call(100, 5 * MS, 10 * US, "write", Some(9), 5, Extra::None);
    let clock = Clock {
        fmt: TimeFmt::Relative,
        perf: true,
        frac_digits: 3,
        first: 0,
        date: None,
        wall_at_first: None,
    };
    let r = s.report_with(clock);
    assert!(!ids(&r).contains(&"gaps-unmeasurable"), "{:?}", r.findings);
    assert_eq!(r.stalls.len(), 1, "the 5 ms gap: {:?}", r.stalls);
}

/// Issue 13: one main thread per process; a second thread waiting in epoll (redis 8's io
/// threads run their own loops) is not main for that alone.
#[test]
fn a_second_epoll_thread_is_not_a_second_main() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 1);
    s.call(101, 10 * US, 10 * US, "epoll_wait", Some(6), 1, Extra::None);
    s.call(102, 20 * US, 10 * US, "epoll_wait", Some(7), 1, Extra::None);
    let r = s.report();
    assert_eq!(role_of(&r, 100), "main");
    assert_ne!(role_of(&r, 101), "main", "{:?}", r.threads);
    assert_ne!(role_of(&r, 102), "main", "{:?}", r.threads);
    // Pid not known: the lowest-tid thread of the loop is main, only it.
    let mut s = Seq::with(Options::default());
    s.call(201, 0, 10 * US, "epoll_wait", Some(6), 1, Extra::None);
    s.epoll_wait(200, 10 * US, 10 * US, 1);
    let r = s.report();
    let mains = r.threads.iter().filter(|t| t.role == "main").count();
    assert_eq!(mains, 1, "{:?}", r.threads);
    assert_eq!(role_of(&r, 200), "main");
}

/// Issue 13: in a process that never waits in epoll, select/poll is its event loop: idle.
#[test]
fn select_is_the_event_loop_of_a_process_without_epoll() {
    let mut s = Seq::new();
    for i in 0..5 {
        let t = i * 1_000 * MS;
        s.call(100, t, 990 * MS, "select", None, 0, Extra::None);
        s.call(100, t + 995 * MS, 10 * US, "write", Some(9), 5, Extra::None);
    }
    let r = s.report();
    assert!(
        r.stalls
            .iter()
            .all(|x| x.syscall.as_deref() != Some("select")),
        "{:?}",
        r.stalls
    );
    // With an epoll loop, a select in the main thread still holds every client.
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 1);
    s.call(100, MS, 500 * MS, "select", None, 0, Extra::None);
    let r = s.report();
    assert!(r
        .stalls
        .iter()
        .any(|x| x.syscall.as_deref() == Some("select")));
}

/// Issue 13: `close(8 <detached ...>` as the last line of its thread is in flight at the end
/// with nothing known of its duration: listed, and named in the table (thread and file), as
/// is the count of calls still blocked when the trace ended.
#[test]
fn a_detached_call_of_unknown_duration_is_listed_and_named_in_the_table() {
    let mut s = Seq::new();
    s.open(100, 0, "/var/log/redis/redis-server.log", 8);
    s.epoll_wait(100, MS, 10 * US, 1);
    s.write(
        100,
        2 * MS,
        10 * US,
        8,
        b"1:M 01 Dec 2026 08:00:00.000 * saved\n",
    );
    let mut sc = Syscall::new("close");
    sc.fd = Some(8);
    sc.in_flight = Some(InFlight::AtEnd);
    s.ev(100, 3 * MS, EventKind::Syscall(sc));
    // A thread parked in its wait for work when the trace ended: counted, not listed.
    s.partial(
        101,
        3 * MS,
        "futex",
        None,
        (0, DurSource::Paired),
        InFlight::AtEnd,
    );
    let r = s.report();
    assert_eq!(r.in_flight.len(), 1, "{:?}", r.in_flight);
    let c = &r.in_flight[0];
    assert_eq!(c.syscall.as_deref(), Some("close"));
    assert_eq!(
        c.target.path.as_deref(),
        Some("/var/log/redis/redis-server.log")
    );
    let section = still_running(&r);
    assert!(
        section.contains("close()") && section.contains("redis-server.log"),
        "{section}"
    );
    assert!(section.contains("main thread"), "{section}");
    assert!(
        section.contains("2 calls still blocked when the trace ended"),
        "{section}"
    );
}

/// Issue 13: a line that could not be read breaks the timeline: `close(3) = 0`, a pasted
/// `...`, then a line 5 s later is no 5 s gap (nor a 5 s close(): the source's part).
#[test]
fn no_gap_spans_an_unreadable_line() {
    let trace = |cut: bool| {
        let mut s = Seq::new();
        s.epoll_wait(100, 0, 10 * US, 1);
        s.call(100, MS, 10 * US, "close", Some(3), 0, Extra::None);
        if cut {
            s.ev(0, MS, EventKind::Unreadable);
        }
        s.call(100, 5_000 * MS, 10 * US, "getpid", None, 100, Extra::None);
        s.epoll_wait(100, 5_001 * MS, 10 * US, 1);
        s.report()
    };
    assert_eq!(trace(false).stalls.len(), 1, "without the cut: a 5 s gap");
    let r = trace(true);
    assert!(r.stalls.is_empty(), "{:?}", r.stalls);
}

/// Issue 13: a command's latency starts when its request could have arrived. A new
/// connection's first request found by a wait that returned at once may have been queued
/// since the connect, but only if no wait came between: the connection was registered for
/// the wait after its accept, so a request already there would have been returned by it.
/// It never starts before a stall that ended before that wait.
#[test]
fn a_first_request_is_not_dated_before_a_wait_that_would_have_returned_it() {
    // Client 9 connects at 5 ms, then an fdatasync of `fsync`.
    let accept_then_fsync = |fsync: i64| {
        let mut s = Seq::new();
        s.epoll_wait(100, 0, 5 * MS, 1);
        s.accept(100, 5 * MS, 10 * US, 9);
        s.fdatasync(100, 6 * MS, fsync, 7);
        s
    };
    // A wait at `at` that returns at once with client 9's first request, a PING.
    let ping_found_at = |mut s: Seq, at: i64| {
        s.epoll_wait(100, at, 5 * US, 1);
        s.read(100, at + 10 * US, 9, PING);
        s.write(100, at + MS, 10 * US, 9, PONG);
        s.report()
    };
    let mut s = accept_then_fsync(500 * MS);
    // Blocked until another client's request at 600 ms; the new connection was registered.
    s.epoll_wait(100, 506 * MS, 94 * MS, 1);
    let r = ping_found_at(s, 700 * MS);
    let fsync = r
        .stalls
        .iter()
        .find(|x| x.syscall.as_deref() == Some("fdatasync"))
        .expect("the fdatasync stall");
    assert_eq!(fsync.waiting.commands, 0, "{fsync:?}");
    let ping = r.commands.iter().find(|c| c.command == "PING").unwrap();
    // The main thread made no syscall from 600 to 700 ms (a gap stall) before the wait that
    // found the PING: from that wait's start to the reply.
    assert_eq!(ping.p50_us, 1_010);
    // With no wait between the accept and the one that found it, it may have been queued
    // since the connect, but never before the fdatasync that ended before that wait: the
    // trace cannot show it was sent while the fdatasync ran.
    let r = ping_found_at(accept_then_fsync(500 * MS), 506 * MS);
    let fsync = r
        .stalls
        .iter()
        .find(|x| x.syscall.as_deref() == Some("fdatasync"))
        .unwrap();
    assert_eq!(fsync.waiting.commands, 0, "{fsync:?}");
    let ping = r.commands.iter().find(|c| c.command == "PING").unwrap();
    assert_eq!(ping.p50_us, 1_010, "from the fdatasync's end at 506 ms");
    // With nothing stall-long between, from the connect (the accept's wait at 5 ms).
    let r = ping_found_at(accept_then_fsync(2 * MS), 8 * MS);
    let ping = r.commands.iter().find(|c| c.command == "PING").unwrap();
    assert_eq!(ping.p50_us, 4_010);
}

/// Issue 13: across a line that could not be read, the wait before it says nothing of when
/// a request read after it arrived: its latency starts no earlier than the break.
#[test]
fn no_latency_spans_an_unreadable_line() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, MS, 1);
    s.ev(0, MS, EventKind::Unreadable);
    s.read(100, 5_000 * MS, 9, PING);
    s.write(100, 5_001 * MS, 10 * US, 9, PONG);
    let r = s.report();
    let ping = r.commands.iter().find(|c| c.command == "PING").unwrap();
    assert!(ping.p50_us < 5_000_000, "{ping:?}");
}

/// An unfinished call whose resumed half was in the unreadable part reaches the analyzer
/// after the break (the source hands it over when it gives up on it): no gap starts there.
#[test]
fn no_gap_starts_at_a_call_from_before_the_break() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 1);
    s.ev(0, 2 * MS, EventKind::Unreadable);
    // wait4 entered at 1 ms, its end lost in the cut.
    let mut sc = Syscall::new("wait4");
    sc.ret = Ret::Unknown;
    s.ev(100, MS, EventKind::Syscall(sc));
    s.call(100, 200 * MS, 10 * US, "getpid", None, 100, Extra::None);
    let r = s.report();
    assert_no_gap(&r);
}

/// The same with the call handed over with a duration: strace paired its unfinished half,
/// from before the break, with a resumed half after it (maybe another call's), so its end
/// is not known to be its own, and no gap starts there either (redis8-io2 cut in half had a
/// 128 ms gap from such an epoll_wait).
#[test]
fn no_gap_starts_at_a_call_from_before_the_break_paired_after_it() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 1);
    s.ev(0, 2 * MS, EventKind::Unreadable);
    s.epoll_wait(100, MS, 3 * MS, 1);
    s.call(100, 200 * MS, 10 * US, "getpid", None, 100, Extra::None);
    let r = s.report();
    assert_no_gap(&r);
}

/// Issue 13: a request found by a wait that returned at once is dated from the end of the
/// thread's call before that wait, never from the previous wait's end, and never before a
/// stall (a slow call, or a gap with no syscall) that ended before it: the stall held no
/// such request as far as the trace shows. On every path: -T or perf durations (measured,
/// as live backends give them too), upper bounds without -T, ptrace-stamped times.
#[test]
fn a_queued_request_is_never_dated_before_a_stall_on_every_path() {
    for stamped_at_stops in [false, true] {
        for src in [DurSource::Measured, DurSource::UpperBound] {
            // Without -T a call's upper bound runs to the thread's next call: no gap shows.
            let stalls: &[bool] = if src == DurSource::Measured {
                &[true, false]
            } else {
                &[true]
            };
            for &slow_call in stalls {
                let label = format!("{stamped_at_stops} {src:?} slow call {slow_call}");
                let mut s = Seq::with(Options {
                    root_pid: Some(100),
                    stamped_at_stops,
                    ..Default::default()
                });
                s.next_call("epoll_wait", 5, 5 * MS, src, b"");
                s.next_call("read", 9, 10 * US, src, GET);
                s.next_call("write", 9, 10 * US, src, b"$1\r\nv\r\n");
                if slow_call {
                    s.next_call("fdatasync", 7, 200 * MS, src, b"");
                } else {
                    s.at += 200 * MS;
                }
                // Returned at once: a request was queued, on another connection.
                s.next_call("epoll_wait", 5, 5 * US, src, b"");
                s.next_call("read", 10, 10 * US, src, GET);
                s.next_call("write", 10, 10 * US, src, b"$1\r\nv\r\n");
                let r = s.report();
                let stall = r
                    .stalls
                    .iter()
                    .find(|x| x.duration_us >= 200_000)
                    .unwrap_or_else(|| panic!("{label}: {:?}", r.stalls));
                assert_eq!(stall.waiting.commands, 0, "{label}: {stall:?}");
                let get = r
                    .commands
                    .iter()
                    .find(|c| c.command == "GET" && c.phase == "all")
                    .unwrap();
                assert!(get.max_us < 1_000, "{label}: {get:?}");
            }
        }
    }
}

/// Issue 13: the first request of a trace found by a wait that returned at once is dated
/// from that wait (the thread's first call), not from the trace's first timestamp.
#[test]
fn the_first_request_of_a_trace_is_not_dated_from_the_trace_start() {
    let mut s = Seq::new();
    // Another thread's call starts the trace; the main thread is first seen 80 ms later.
    s.call(101, 0, 10 * US, "futex", None, 0, Extra::None);
    s.epoll_wait(100, 80 * MS, 5 * US, 1);
    s.read(100, 80 * MS + 10 * US, 9, PING);
    s.write(100, 80 * MS + 30 * US, 10 * US, 9, PONG);
    let r = s.report();
    let ping = r.commands.iter().find(|c| c.command == "PING").unwrap();
    assert_eq!(ping.p50_us, 40, "{ping:?}");
}

/// appendfsync always with SADDs, traced with durations of `src`; with `slow`, one fsync of
/// 300 ms (the others 150 µs).
fn aof_always_sadds(src: DurSource, slow: bool) -> Report {
    aof_always_fsyncs(src, &|i| {
        if slow && i == 10 {
            300 * MS
        } else {
            150 * US
        }
    })
}

/// 20 SADDs under appendfsync always, the `i`th one's fdatasync taking `fsync(i)`.
fn aof_always_fsyncs(src: DurSource, fsync: &dyn Fn(i64) -> i64) -> Report {
    let mut s = Seq::new();
    s.open(100, 0, "/data/appendonlydir/appendonly.aof.1.incr.aof", 7);
    s.at = MS;
    let sadd = b"*3\r\n$4\r\nSADD\r\n$1\r\nk\r\n$1\r\nm\r\n";
    for i in 0..20 {
        s.next_call("epoll_wait", 5, 2 * MS, src, b"");
        s.next_call("read", 9, 10 * US, src, sadd);
        s.next_call("write", 7, 10 * US, src, b"*3\r\n$4\r\nSADD\r\n");
        s.next_call("fdatasync", 7, fsync(i), src, b"");
        s.next_call("write", 9, 10 * US, src, b":1\r\n");
    }
    s.report()
}

/// Every write command waits for its fsync under appendfsync always: a median fsync over the
/// threshold makes the typical write a stall, which is critical even when no single one
/// reaches the 100 ms that makes a stall critical by itself; the same median only as an upper
/// bound, or one slow fsync among fast ones, is not.
#[test]
fn fsync_always_with_a_median_fsync_over_the_threshold_is_critical() {
    use crate::report::Severity;
    let sev = |src, fsync: &dyn Fn(i64) -> i64| {
        fsync_always_finding(&aof_always_fsyncs(src, fsync)).severity
    };
    assert_eq!(sev(DurSource::Measured, &|_| 40 * MS), Severity::Critical);
    assert_eq!(
        sev(DurSource::Measured, &|i| if i == 3 {
            60 * MS
        } else {
            5 * MS
        }),
        Severity::Warning
    );
    assert_eq!(sev(DurSource::UpperBound, &|_| 40 * MS), Severity::Warning);
    assert_eq!(sev(DurSource::Measured, &|_| 150 * US), Severity::Warning);
}

fn fsync_always_finding(r: &Report) -> crate::report::Finding {
    r.findings
        .iter()
        .find(|f| f.id == FindingId::AofFsyncAlways)
        .cloned()
        .unwrap()
}

/// Issue 13: figures reconstructed as upper bounds are marked so in findings and causes, and
/// only there; a finding built only on upper bounds says so in its evidence. appendfsync
/// always traced without -T (every duration up to the thread's next event) against the same
/// trace with -T.
#[test]
fn upper_bound_figures_are_marked_in_findings_and_only_there() {
    let run = aof_always_sadds;
    let fsync = fsync_always_finding;
    // Without -T, no stall: built on the fsyncs alone, every one an upper bound.
    let f = fsync(&run(DurSource::UpperBound, false));
    assert!(
        f.evidence.contains("p50 ≤150 µs, p99 ≤150 µs, max ≤150 µs"),
        "{}",
        f.evidence
    );
    assert!(
        f.evidence.contains("(≤160 µs per call in AOF syscalls)"),
        "{}",
        f.evidence
    );
    assert!(f.evidence.contains("upper bound"), "{}", f.evidence);
    // With -T: the same figures, unmarked.
    let f = fsync(&run(DurSource::Measured, false));
    assert!(f.evidence.contains("p50 150 µs"), "{}", f.evidence);
    assert!(
        !f.evidence.contains('≤') && !f.evidence.contains("upper bound"),
        "{}",
        f.evidence
    );
}

/// Issue 13: a 300 ms fsync timed only up to the next event is at most 300 ms in the
/// finding, the stall's cause and the table's incident; measured, it is 300 ms everywhere.
#[test]
fn an_upper_bound_stall_is_at_most_in_its_finding_cause_and_incident() {
    let run = aof_always_sadds;
    let fsync = fsync_always_finding;
    // A 300 ms fsync: the stall's figures are at most, in the evidence and the cause.
    let r = run(DurSource::UpperBound, true);
    let f = fsync(&r);
    assert!(f.evidence.contains("max ≤300 ms"), "{}", f.evidence);
    assert!(
        f.evidence
            .contains("at most 300 ms in total, worst at most 300 ms"),
        "{}",
        f.evidence
    );
    assert!(f.evidence.contains("upper bound"), "{}", f.evidence);
    assert!(
        r.stalls[0].cause.contains("blocked at most 300 ms"),
        "{}",
        r.stalls[0].cause
    );
    // And the table's incident, which spans only that stall.
    let table = |r: &Report| {
        table_text(r)
            .split("STALLS over")
            .nth(1)
            .unwrap()
            .to_string()
    };
    assert!(table(&r).contains("  ≤300 ms"), "{}", table(&r));
    let r = run(DurSource::Measured, true);
    assert!(
        table(&r).contains("  300 ms") && !table(&r).contains('≤'),
        "{}",
        table(&r)
    );
    let f = fsync(&r);
    assert!(
        f.evidence.contains("300 ms in total, worst 300 ms") && !f.evidence.contains("at most"),
        "{}",
        f.evidence
    );
    assert!(
        !r.stalls[0].cause.contains("at most"),
        "{}",
        r.stalls[0].cause
    );
}

/// Issue 13: a gap from a call of unknown length is at most what it says, in its cause; the
/// stalls no rule explains say when they are all upper bounds; a fork timed only up to the
/// next event is at most what the fork finding says.
#[test]
fn gaps_forks_and_unexplained_stalls_say_their_upper_bounds() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 1);
    let mut sc = Syscall::new("kill");
    sc.ret = Ret::Val(100);
    s.ev(100, MS, EventKind::Syscall(sc));
    s.epoll_wait(100, 300 * MS, 10 * US, 1);
    let r = s.report();
    let g = r.stalls.iter().find(|x| x.kind == StallKind::Gap).unwrap();
    assert!(
        g.cause.contains("made no syscall for at most 299 ms"),
        "{}",
        g.cause
    );
    // A socket write of 50 ms no rule explains, timed as an upper bound.
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 1);
    let mut sc = Syscall::new("sendto");
    sc.fd = Some(40);
    sc.ret = Ret::Val(1);
    (sc.dur, sc.dur_src) = (Some(50 * MS), DurSource::UpperBound);
    s.ev(100, MS, EventKind::Syscall(sc));
    s.epoll_wait(100, 51 * MS, 10 * US, 1);
    let r = s.report();
    let f = r
        .findings
        .iter()
        .find(|f| f.id == FindingId::Unexplained)
        .unwrap_or_else(|| panic!("{:?} {:?}", r.findings, r.stalls));
    assert!(f.evidence.contains("upper bound"), "{}", f.evidence);
    // A fork of 30 ms without -T.
    let fork = |src: DurSource| {
        let mut s = Seq::new();
        s.epoll_wait(100, 0, 10 * US, 1);
        let mut sc = Syscall::new("clone");
        sc.ret = Ret::Val(200);
        sc.extra = Extra::Clone { thread: false };
        (sc.dur, sc.dur_src) = (Some(30 * MS), src);
        s.ev(100, MS, EventKind::Syscall(sc));
        s.epoll_wait(100, 31 * MS, 10 * US, 1);
        let r = s.report();
        r.findings
            .iter()
            .find(|f| f.id == FindingId::Fork)
            .cloned()
            .unwrap_or_else(|| panic!("{:?}", r.findings))
    };
    let f = fork(DurSource::UpperBound);
    assert!(f.title.ends_with("at most 30 ms"), "{}", f.title);
    assert!(f.evidence.contains("≤30 ms (child 200)"), "{}", f.evidence);
    assert!(f.evidence.contains("upper bound"), "{}", f.evidence);
    let f = fork(DurSource::Measured);
    assert!(f.title.ends_with("main thread 30 ms"), "{}", f.title);
    assert!(
        !f.evidence.contains('≤') && !f.evidence.contains("upper bound"),
        "{}",
        f.evidence
    );
}

/// Issue 13: calls still blocked when the trace ends are shown in the table, not only
/// counted: in a hang in which every thread is parked, each thread is named with what it
/// waits in (syscall, fd and file), in the JSON's `parked_at_end` and the table.
#[test]
fn every_thread_parked_at_the_end_is_named_with_what_it_waits_in() {
    let parked = || {
        let mut s = Seq::new();
        s.epoll_wait(100, 0, 5 * MS, 1);
        s.read(100, 5 * MS, 9, PING);
        s.write(100, 6 * MS, 10 * US, 9, PONG);
        s.partial(
            100,
            7 * MS,
            "epoll_wait",
            Some(5),
            (900 * MS, DurSource::Paired),
            InFlight::AtEnd,
        );
        for tid in [101, 102] {
            s.partial(
                tid,
                2 * MS,
                "futex",
                None,
                (905 * MS, DurSource::Paired),
                InFlight::AtEnd,
            );
        }
        s
    };
    let r = parked().report();
    assert!(r.stalls.is_empty() && r.in_flight.is_empty(), "{r:?}");
    let got: Vec<(u32, &str, Option<i32>)> = r
        .parked_at_end
        .iter()
        .map(|p| (p.tid, p.syscall.as_str(), p.fd))
        .collect();
    assert_eq!(
        got,
        vec![
            (100, "epoll_wait", Some(5)),
            (101, "futex", None),
            (102, "futex", None)
        ]
    );
    assert_eq!(r.parked_at_end[0].class, Some(FileClass::Epoll));
    assert_eq!(r.parked_at_end[0].known_us, 900_000);
    let section = still_running(&r);
    assert!(
        section.contains("3 calls still blocked when the trace ended (3 threads traced)"),
        "{section}"
    );
    assert!(
        section.contains("main thread 100 waits in epoll_wait(5) (epoll) since"),
        "{section}"
    );
    for tid in [101, 102] {
        assert!(
            section.contains(&format!("thread {tid} waits in futex() since")),
            "{section}"
        );
    }
    // Without timestamps nothing dates a wait: no "since +0" as if all began at the start.
    let r = parked().report_with(Clock::none());
    let text = table_text(&r);
    assert!(text.contains("thread 101 waits in futex()"), "{text}");
    assert!(!text.contains(" since "), "{text}");
}

/// Issue 13: `restart_syscall(<... resuming interrupted nanosleep ...>)` is that wait
/// resumed: idle time for its thread, not CPU work, with or without -T. Without -T its
/// length is not known (it was running when tracing began), and the time to the thread's
/// next call was a 950 ms gap stall.
#[test]
fn a_resumed_sleep_is_idle_time_with_or_without_t() {
    for measured in [true, false] {
        let mut s = Seq::new();
        s.epoll_wait(100, 0, 100 * MS, 0);
        for (tid, at, wait) in [(101, 50 * MS, 950 * MS), (100, 101 * MS, 500 * MS)] {
            let mut sc = Syscall::new("restart_syscall");
            sc.ret = Ret::Val(0);
            sc.extra = Extra::Resumes("clock_nanosleep");
            sc.in_flight = Some(InFlight::AtStart);
            if measured {
                (sc.dur, sc.dur_src) = (Some(wait), DurSource::Measured);
            }
            s.ev(tid, at, EventKind::Syscall(sc));
            s.call(
                tid,
                at + wait + 100 * US,
                5 * US,
                "getpid",
                None,
                100,
                Extra::None,
            );
        }
        s.epoll_wait(100, 602 * MS, 100 * MS, 0);
        let r = s.report();
        assert!(r.stalls.is_empty(), "-T {measured}: {:?}", r.stalls);
    }
}

/// A busy main thread whose allocator hands pages back (madvise) and wakes its background
/// thread (futex) mid-script served no client for the whole script: one gap, not pieces
/// under the threshold, and its cause says which calls it ran through.
#[test]
fn a_script_cut_by_the_allocators_own_calls_is_one_gap() {
    let mut s = Seq::new();
    s.epoll_wait(100, 0, 10 * US, 1);
    s.call(100, 8 * MS, 5 * US, "madvise", None, 0, Extra::None);
    s.call(100, 16 * MS, 5 * US, "futex", None, 1, Extra::None);
    s.epoll_wait(100, 30 * MS, 10 * US, 0);
    let r = s.report();
    let gaps: Vec<_> = r
        .stalls
        .iter()
        .filter(|x| x.kind == StallKind::Gap)
        .collect();
    assert_eq!(gaps.len(), 1, "{:?}", r.stalls);
    assert_eq!(gaps[0].duration_us, 29_990);
    assert_eq!(gaps[0].quiet_calls, Some(2));
    assert!(
        gaps[0]
            .cause
            .starts_with("main thread served no client for 30 ms (no syscall for 30 ms of it; 2 calls of its own: madvise, futex)"),
        "{}",
        gaps[0].cause
    );
}

/// Issue 40, offline: redis 6/7 with I/O threads under strace. Main (100) accepts clients
/// 9 and 10; io_thd_1 is 102.
/// At `--threshold 2ms`, io_thd_1 already seen at work (an earlier turn).
fn io_seq() -> Seq {
    io_seq_with(Options::default())
}

/// `io_seq` with what a live attach adds to the options (`cpus`, `cgroup`).
fn io_seq_with(live: Options) -> Seq {
    let mut s = Seq::with(Options {
        root_pid: Some(100),
        thread_names: [(102, "io_thd_1".to_string())].into_iter().collect(),
        threshold_ns: 2 * MS,
        ..live
    });
    s.accept(100, 0, 10 * US, 9);
    s.accept(100, 100 * US, 10 * US, 10);
    s.read(102, 200 * US, 10, SET);
    s.write(102, 300 * US, 10 * US, 10, OK);
    s.epoll_wait(100, 400 * US, 10 * US, 0);
    s
}

/// A turn of `io_seq`'s clients, a SET each answered `+OK`: the main thread serves client 9,
/// io_thd_1 client 10; `read` and `reply` are (main thread, io_thd_1) times. Pushed in the
/// order of their times, as a trace prints them.
fn set_turn(s: &mut Seq, read: (i64, i64), reply: (i64, i64)) {
    let mut calls = [
        (read.0, 100, 9, true),
        (read.1, 102, 10, true),
        (reply.0, 100, 9, false),
        (reply.1, 102, 10, false),
    ];
    calls.sort_by_key(|c| c.0);
    for (at, tid, fd, is_read) in calls {
        if is_read {
            s.read(tid, at, fd, SET);
        } else {
            s.write(tid, at, 10 * US, fd, OK);
        }
    }
}

/// The main thread's gaps at `at_ms` (start, ms): (finding, cause).
fn main_gap_at(r: &Report, at_ms: i64) -> (Option<&'static str>, String) {
    let st = r
        .stalls
        .iter()
        .find(|x| x.who.tid == 100 && x.kind == StallKind::Gap && x.at_us / 1000 == at_ms)
        .unwrap_or_else(|| panic!("no main gap at {at_ms} ms: {:?}", r.stalls));
    (st.finding.map(FindingId::as_str), st.cause.clone())
}

/// The main thread reads its share of a batch, io_thd_1 its share 15 ms later (it waited
/// for a CPU), the main thread writes the replies 8 ms after that: nothing of the main
/// thread's runs before the I/O thread's share, so the 15 ms are their late start, not a
/// command (before: the hole was over half the gap, "a slow command"). An EVAL run after
/// both shares in the same trace is still a slow command, named.
#[test]
fn a_late_io_thread_share_of_a_batch_is_no_slow_command() {
    let mut s = io_seq();
    s.epoll_wait(100, 9 * MS, 10 * US, 2);
    set_turn(&mut s, (10 * MS, 25 * MS), (33 * MS, 33 * MS + 20 * US));
    s.epoll_wait(100, 34 * MS, 10 * US, 2);
    s.read(100, 100 * MS, 9, EVAL);
    s.read(102, 100 * MS + 50 * US, 10, SET);
    s.write(100, 600 * MS, 10 * US, 9, b":1\r\n");
    s.write(102, 600 * MS + 20 * US, 10 * US, 10, OK);
    s.epoll_wait(100, 601 * MS, 10 * US, 0);
    let r = s.report();
    let (id, why) = main_gap_at(&r, 10);
    assert_eq!(id, Some("io-threads"), "{why}");
    assert!(why.contains("began their share 15 ms after"), "{why}");
    let (id, why) = main_gap_at(&r, 100);
    assert_eq!(id, Some("command"), "{why}");
    assert!(why.contains("(EVAL)"), "{why}");
}

/// valkey switching its I/O thread on: the main thread wakes it (futex = 1) inside its gap,
/// the woken thread returns from its futex wait 12 ms later (waiting for a CPU) and does
/// the clients' I/O. Without the scheduler's split the wake is what says when the I/O
/// thread's wait for a CPU began (before: a 12 ms hole of the main thread's own).
#[test]
fn a_futex_wake_starts_the_io_threads_wait_for_a_cpu() {
    let r = io_thread_woken_late(Options::default());
    let (id, why) = main_gap_at(&r, 10);
    assert_eq!(id, Some("io-threads"), "{why}");
}

/// The scenario of `a_futex_wake_starts_the_io_threads_wait_for_a_cpu`, traced with `live`.
fn io_thread_woken_late(live: Options) -> Report {
    let mut s = io_seq_with(live);
    s.epoll_wait(100, 9 * MS, MS, 1);
    let wake = 10 * MS + 50 * US;
    s.call(100, wake, 10 * US, "futex", None, 1, Extra::None);
    // Its hand-off wait, from before the gap to 12 ms after the wake.
    s.call(102, 5 * MS, 17 * MS, "futex", None, 0, Extra::None);
    s.read(102, 22 * MS + 100 * US, 10, SET);
    s.write(102, 22 * MS + 200 * US, 10 * US, 10, OK);
    s.epoll_wait(100, 23 * MS, 10 * US, 0);
    s.report()
}

/// An I/O thread's call that began in the main thread's gap but whose line comes after the
/// gap's end (strace's `<unfinished ...>` resumed later, a bpf record read late) still
/// covers the gap: the gap is covered again when it comes (before: judged without it).
#[test]
fn an_io_thread_call_printed_after_the_gap_still_covers_it() {
    let mut s = io_seq();
    s.epoll_wait(100, 9 * MS, 10 * US, 1);
    s.read(100, 10 * MS, 9, SET);
    s.write(100, 25 * MS, 10 * US, 9, OK);
    // Begun at 11 ms, ended at 24.5 ms, printed after the main thread's write.
    s.call(
        102,
        11 * MS,
        13_500 * US,
        "read",
        Some(10),
        SET.len() as i64,
        Extra::Data(Data::new(SET, false)),
    );
    s.write(102, 25 * MS + 20 * US, 10 * US, 10, OK);
    s.epoll_wait(100, 26 * MS, 10 * US, 0);
    let r = s.report();
    let (id, why) = main_gap_at(&r, 10);
    assert_eq!(id, Some("io-threads"), "{why}");
}

/// valkey under a GET load (issue 40): io_thd_1 reads three GETs before the main thread's
/// last call, then (its offloaded `epoll_wait` spinning with a timeout of 0) an EVAL inside
/// the main thread's gap; the main thread runs the GETs and the 500 ms EVAL without a call,
/// and every reply goes out after its next one. The GETs were in before the gap and out
/// after it, as a command run through it would be; the EVAL, the odd one of what the gap
/// held, is the one named (before: "a slow command (GET)").
#[test]
fn a_script_read_by_an_io_thread_inside_the_gap_is_named_not_the_batch_before_it() {
    let mut s = io_seq();
    for fd in [11, 12, 13] {
        s.accept(100, 500 * US + fd * 10 * US, 10 * US, fd);
    }
    s.epoll_wait(102, MS, 10 * US, 3);
    for fd in [11, 12, 13] {
        s.read(102, MS + fd as i64 * 20 * US, fd, GET);
    }
    s.epoll_wait(100, 2 * MS, 10 * US, 0);
    s.epoll_wait(102, 2_500 * US, 10 * US, 0);
    s.epoll_wait(102, 2_900 * US, 10 * US, 1);
    s.read(102, 2_950 * US, 9, EVAL);
    s.epoll_wait(100, 504 * MS, 10 * US, 0);
    s.write(102, 504_100 * US, 10 * US, 9, b":1\r\n");
    for fd in [11, 12, 13] {
        s.write(
            102,
            504_100 * US + fd as i64 * 20 * US,
            10 * US,
            fd,
            b"$1\r\nv\r\n",
        );
    }
    s.epoll_wait(100, 505 * MS, 10 * US, 0);
    let r = s.report();
    let (id, why) = main_gap_at(&r, 2);
    assert_eq!(id, Some("command"), "{why}");
    assert!(why.contains("(EVAL)"), "{why}");
}

/// Both threads write their shares side by side; the main thread's next call comes 6 ms
/// after both ended: less than a scheduler tick right after the hand-off (the I/O thread
/// spins on a CPU for the next one). 30 ms is not scheduling: that stays the main thread's
/// own, which holds no command when every request read had been answered; one that ends in
/// a reply whose request the trace lacks, or with a request read and not answered, may
/// hold one.
#[test]
fn a_short_gap_right_after_the_io_threads_share_is_scheduling() {
    let run = |ends_in_wait: bool, unanswered: bool| {
        let mut s = io_seq();
        s.epoll_wait(100, 9 * MS, 10 * US, 2);
        set_turn(
            &mut s,
            (9_500 * US, 9_600 * US),
            (10 * MS + 5 * US, 10 * MS),
        );
        s.epoll_wait(100, 16 * MS, 10 * US, 2);
        set_turn(
            &mut s,
            (16_500 * US, 16_600 * US),
            (17 * MS + 5 * US, 17 * MS),
        );
        if unanswered {
            s.read(102, 17_100 * US, 10, SET);
        }
        if ends_in_wait {
            s.epoll_wait(100, 47 * MS, 10 * US, 0);
        } else {
            s.write(100, 47 * MS, 10 * US, 11, OK);
        }
        s.report()
    };
    let r = run(true, false);
    let (id, why) = main_gap_at(&r, 10);
    assert_eq!(id, Some("io-threads"), "{why}");
    assert!(why.contains("lost the CPU right after"), "{why}");
    let (id, why) = main_gap_at(&r, 17);
    assert_eq!(id, Some("own-work"), "{why}");
    assert!(
        why.contains("after every request it had read was answered"),
        "{why}"
    );
    let r = run(false, false);
    assert_eq!(main_gap_at(&r, 17).0, Some("command"));
    let r = run(true, true);
    assert_eq!(main_gap_at(&r, 17).0, Some("command"));
}

/// A call of redis8-io2's shapes (`redis8_own_loop_io_thread_pause_eval_and_eventfd`): fds
/// 7 and 13 are epoll fds, 14 and 15 eventfds, 20 and up clients (20 sent the EVAL at 100 ms).
fn redis8_call(s: &mut Seq, tid: u32, ts: i64, dur: i64, name: &'static str, fd: i32, ret: i64) {
    let mut sc = Syscall::new(name);
    sc.fd = Some(fd);
    sc.fd_path = Some(
        match fd {
            7 | 13 => "anon_inode:[eventpoll]",
            14 | 15 => "anon_inode:[eventfd]",
            _ => "TCP:[127.0.0.1:6379->127.0.0.1:50000]",
        }
        .into(),
    );
    sc.ret = Ret::Val(ret);
    (sc.dur, sc.dur_src) = (Some(dur), DurSource::Measured);
    if fd >= 20 {
        let data: &[u8] = match name {
            "read" if fd == 20 && ts >= 100 * MS => b"*3\r\n$4\r\nEVAL\r\n$3\r\n...",
            "read" => GET,
            _ => b"$1\r\nv\r\n",
        };
        sc.extra = Extra::Data(Data::new(data, false));
    }
    s.ev(tid, ts, EventKind::Syscall(sc));
}

/// redis 8 (issue 40; the shapes of fixtures/io-threads/redis8-io2): the I/O thread runs an
/// event loop of its own (epoll fd 13; the main thread's is 7) and the two hand clients to
/// each other through eventfds (the main thread reads 15, writes 14). A pause (the main
/// thread pokes 14 and spins while the I/O thread finishes its reads and parks) is a wait
/// for the I/O thread, the EVAL the main thread runs while its I/O thread sleeps in its loop
/// is a slow command, and a slow call on an eventfd is no disk wait.
#[test]
fn redis8_own_loop_io_thread_pause_eval_and_eventfd() {
    let mut s = Seq::with_io_thread();
    let on = redis8_call;
    on(&mut s, 100, 0, MS, "epoll_wait", 7, 1);
    on(&mut s, 102, 0, MS, "epoll_wait", 13, 1);
    on(&mut s, 100, 1990 * US, 10 * US, "write", 14, 8);
    for t in [3, 5, 7] {
        on(&mut s, 102, t * MS, 10 * US, "read", 20, 20);
    }
    on(&mut s, 102, 55 * MS, 10 * US, "write", 15, 8);
    on(&mut s, 102, 56 * MS, 44 * MS, "epoll_wait", 13, 1);
    on(&mut s, 100, 60 * MS, 40 * MS, "epoll_wait", 7, 1);
    // The EVAL and three GETs: read and handed over by the I/O thread, which then sleeps
    // in its loop until the main thread hands them back (no call of it in the gap).
    for fd in [21, 22, 23] {
        on(
            &mut s,
            102,
            99 * MS + fd as i64 * 10 * US,
            10 * US,
            "read",
            fd,
            20,
        );
    }
    on(&mut s, 102, 100 * MS, 10 * US, "read", 20, 20);
    on(&mut s, 102, 100 * MS + 100 * US, 10 * US, "write", 15, 8);
    let woken = 600 * MS;
    on(&mut s, 102, 100 * MS + 200 * US, woken, "epoll_wait", 13, 1);
    on(&mut s, 100, 100 * MS + 250 * US, 10 * US, "read", 15, 8);
    on(&mut s, 100, 700 * MS, 10 * US, "write", 14, 8);
    for fd in [20, 21, 22, 23] {
        on(
            &mut s,
            102,
            700 * MS + fd as i64 * 20 * US,
            10 * US,
            "write",
            fd,
            7,
        );
    }
    // A read of its eventfd held 30 ms (the tracer, the scheduler): no disk behind it.
    on(&mut s, 100, 701 * MS, 30 * MS, "read", 15, 8);
    on(&mut s, 100, 732 * MS, MS, "epoll_wait", 7, 0);
    let r = s.report();
    let gap = |from_ms: i64| {
        r.stalls
            .iter()
            .find(|st| st.kind == StallKind::Gap && (st.at_us / 1000 - from_ms).abs() <= 1)
            .unwrap_or_else(|| panic!("no gap at {from_ms} ms: {:?}", r.stalls))
    };
    let pause = gap(2);
    assert_eq!(pause.finding, Some(FindingId::IoThreads), "{}", pause.cause);
    assert!(
        pause.cause.contains("redis 8 pauses them"),
        "{}",
        pause.cause
    );
    let eval = gap(100);
    assert_eq!(eval.finding, Some(FindingId::Command), "{}", eval.cause);
    // Named: the odd one of the batch the I/O thread handed over before the gap.
    assert!(eval.cause.contains("(EVAL)"), "{}", eval.cause);
    let efd = r
        .stalls
        .iter()
        .find(|st| st.kind == StallKind::SlowSyscall)
        .expect("the slow eventfd read");
    assert_eq!(efd.target.class, Some(FileClass::AnonInode), "{efd:?}");
    assert!(
        !matches!(
            efd.finding,
            Some(FindingId::SlowFileIo | FindingId::DiskContention)
        ),
        "{}",
        efd.cause
    );
    assert!(!efd.cause.contains("disk"), "{}", efd.cause);
}

/// redis 8 (issue 40; fixtures/io-threads/redis8-io2 lines 28901 and 37126): the main thread
/// hands its clients back (its write of the I/O thread's eventfd 14), then makes no call
/// for 80 ms while the I/O thread writes their replies, reads new requests and hands them
/// over (its write of 15). Those requests are not the main thread's until it reads 15, so no
/// command ran in the gap (before: "a slow command (GET)"). Taken before the gap (the main
/// thread read 15 at 12 ms), the same requests make it a slow command.
#[test]
fn a_redis8_gap_after_the_hand_back_holds_no_command_until_the_hand_over_is_read() {
    let run = |taken_early: bool| {
        let mut s = Seq::with_io_thread();
        let on = redis8_call;
        // The I/O thread reads two requests at `at`, hands them over (15), sleeps `sleep`.
        let hand_over = |s: &mut Seq, at: i64, sleep: i64| {
            on(s, 102, at, 10 * US, "read", 20, 20);
            on(s, 102, at + 100 * US, 10 * US, "read", 21, 20);
            on(s, 102, at + 500 * US, 10 * US, "write", 15, 8);
            on(s, 102, at + 600 * US, sleep, "epoll_wait", 13, 1);
        };
        on(&mut s, 100, 0, MS, "epoll_wait", 7, 1);
        on(&mut s, 102, 0, MS, "epoll_wait", 13, 1);
        hand_over(&mut s, 2 * MS, 900 * US);
        on(&mut s, 100, 3 * MS, 10 * US, "epoll_wait", 7, 1);
        on(&mut s, 100, 3 * MS + 100 * US, 10 * US, "read", 15, 8);
        on(&mut s, 100, 3 * MS + 500 * US, 10 * US, "write", 14, 8);
        on(&mut s, 102, 3 * MS + 600 * US, 10 * US, "read", 14, 8);
        on(&mut s, 102, 3 * MS + 700 * US, 10 * US, "write", 20, 7);
        on(&mut s, 102, 3 * MS + 800 * US, 10 * US, "write", 21, 7);
        hand_over(&mut s, 10 * MS, 80 * MS);
        if taken_early {
            on(&mut s, 100, 11 * MS, 10 * US, "epoll_wait", 7, 1);
            on(&mut s, 100, 12 * MS, 10 * US, "read", 15, 8);
        }
        on(&mut s, 100, 83 * MS + 500 * US, 10 * US, "epoll_wait", 7, 1);
        on(&mut s, 100, 83 * MS + 600 * US, 10 * US, "read", 15, 8);
        s.report()
    };
    let r = run(false);
    let (finding, cause) = main_gap_at(&r, 3);
    assert_eq!(finding, Some("own-work"), "{cause}");
    assert!(cause.contains("still with its I/O threads"), "{cause}");
    assert!(!cause.contains("slow command (GET)"), "{cause}");
    let r = run(true);
    let (finding, cause) = main_gap_at(&r, 12);
    assert_eq!(finding, Some("command"), "{cause}");
    assert!(cause.contains("(GET)"), "{cause}");
}

/// A main-thread gap between two of its replies holds no command (redis writes a turn's
/// replies back to back once their commands ran: fixtures/io-threads/redis7-io2 line 8460),
/// where the trace shows every thread and none waits in the main thread's event loop. Not
/// beside valkey's offloaded poll (an I/O thread waits in the main thread's epoll fd 7, and
/// the main thread runs the commands that thread read with no call of its own), nor in a
/// trace of the main thread alone.
#[test]
fn a_gap_between_two_replies_holds_no_command_where_the_trace_shows_it() {
    let run = |other: Option<i32>| {
        let mut s = Seq::with_io_thread();
        let on = redis8_call;
        on(&mut s, 100, 0, MS, "epoll_wait", 7, 1);
        if let Some(epfd) = other {
            on(&mut s, 102, 0, MS, "epoll_wait", epfd, 1);
        }
        on(&mut s, 100, MS, 10 * US, "read", 20, 20);
        on(&mut s, 100, MS + 100 * US, 10 * US, "read", 21, 20);
        on(&mut s, 100, MS + 500 * US, 10 * US, "write", 20, 7);
        on(&mut s, 100, 20 * MS, 10 * US, "write", 21, 7);
        on(&mut s, 100, 21 * MS, MS, "epoll_wait", 7, 0);
        s.report()
    };
    let r = run(Some(13));
    let (finding, cause) = main_gap_at(&r, 1);
    assert_eq!(finding, Some("off-cpu"), "{cause}");
    assert!(
        cause.contains("between two of its writes to clients"),
        "{cause}"
    );
    for other in [Some(7), None] {
        let r = run(other);
        let (finding, cause) = main_gap_at(&r, 1);
        assert_eq!(finding, Some("command"), "{other:?}: {cause}");
    }
}

/// Issue 40: the `io-threads` finding weighs the I/O threads against the CPUs the process
/// may use, from evidence only. Live, pinned to 1 CPU of 2 (or 2 CPUs under a quota of half
/// a CPU), the main thread and io_thd_1 are more threads than CPUs: a warning that says so;
/// on 2 CPUs, no more than them: info. Offline the CPUs are not in the trace, and said not
/// to be. Without the scheduler's split the I/O threads' own wait for a CPU is said to be
/// unmeasured.
#[test]
fn the_io_threads_finding_weighs_its_threads_against_the_cpus() {
    use crate::report::{CgroupLimits, Cpus, Severity};
    let run = |live: Options| {
        let r = io_thread_woken_late(live);
        assert_eq!(main_gap_at(&r, 10).0, Some("io-threads"));
        r.findings
            .into_iter()
            .find(|f| f.id == FindingId::IoThreads)
            .expect("the io-threads finding")
    };
    let cpus = |allowed: u32, list: &str| {
        Some(Cpus {
            allowed_list: list.into(),
            allowed,
            online: 2,
        })
    };
    let unmeasured = "how long the I/O threads themselves waited for a CPU is not measured";
    let f = run(Options::default());
    assert_eq!(f.severity, Severity::Info, "{f:?}");
    assert!(
        f.evidence.contains("1 I/O thread and the main thread")
            && f.evidence
                .contains("the CPUs they may use are not in a trace")
            && f.evidence.contains(unmeasured),
        "{}",
        f.evidence
    );
    let f = run(Options {
        cpus: cpus(1, "1"),
        ..Default::default()
    });
    assert_eq!(f.severity, Severity::Warning, "{f:?}");
    assert!(f.title.contains("may use 1 CPU"), "{}", f.title);
    assert!(
        f.evidence.contains(
            "2 threads on 1 CPU (1 of 2 online, by their affinity): more threads than CPUs"
        ),
        "{}",
        f.evidence
    );
    let f = run(Options {
        cpus: cpus(2, "0-1"),
        ..Default::default()
    });
    assert_eq!(f.severity, Severity::Info, "{f:?}");
    assert!(
        f.evidence.contains(
            "2 threads on 2 CPUs (0-1 of 2 online, by their affinity): no more threads than CPUs"
        ),
        "{}",
        f.evidence
    );
    let f = run(Options {
        cpus: cpus(2, "0-1"),
        cgroup: Some(crate::analyze::limits::CgEvidence {
            limits: CgroupLimits {
                cpu_quota_us: Some(50_000),
                cpu_period_us: Some(100_000),
                ..Default::default()
            },
            readings: vec![],
            exact_throttle: false,
            burst_file: None,
        }),
        ..Default::default()
    });
    assert_eq!(f.severity, Severity::Warning, "{f:?}");
    assert!(f.title.contains("may use 0.5 CPUs"), "{}", f.title);
    assert!(
        f.evidence
            .contains("0.5 CPUs by the cgroup's quota of 50 ms per 100 ms: more threads than CPUs"),
        "{}",
        f.evidence
    );
}

/// The trace began inside a command whose request was read before it (a script that hands
/// pages back with madvise, its reply then posted to an I/O thread): no request is seen
/// awaiting its reply, yet one ran through the gap up to the event-loop wait. A gap is read
/// as after every reply only once the main thread has come back from an event-loop wait in
/// the trace, and only in a trace of all its threads (`strace -p` without -f shows none of
/// the reads valkey's I/O threads make).
#[test]
fn a_gap_before_the_first_loop_wait_is_never_after_the_replies() {
    let run_followed = |waited_first: bool, followed: bool| {
        let mut s = Seq::new();
        if followed {
            // A bio thread's wait: the trace follows the process's threads.
            s.call(101, 0, 10 * US, "futex", None, 0, Extra::None);
        }
        if waited_first {
            s.epoll_wait(100, 0, 10 * US, 0);
        }
        s.call(100, MS, 10 * US, "madvise", None, 0, Extra::None);
        s.epoll_wait(100, 300 * MS, 10 * US, 0);
        let r = s.report();
        let gap = r.stalls.iter().find(|x| x.kind == StallKind::Gap).cloned();
        gap.map(|g| (g.finding.map(FindingId::as_str), g.cause))
    };
    let run = |waited_first: bool| run_followed(waited_first, true);
    let (id, why) = run(false).expect("the gap");
    assert_eq!(id, Some("command"), "{why}");
    let (id, why) = run(true).expect("the gap");
    assert_eq!(id, Some("own-work"), "{why}");
    assert!(why.contains("after every request"), "{why}");
    let (id, why) = run_followed(true, false).expect("the gap");
    assert_eq!(id, Some("command"), "the main thread alone: {why}");
}

/// A client-facing thread's call that returns at once in redis (a non-blocking client
/// socket or eventfd, /proc/PID/stat, a socket option) and took long was the thread off its
/// CPU: `off-cpu`, a warning however long, where no scheduler split says more. A pipe (redis
/// logs to stdout through one, which blocks), smaps (the kernel walks the mappings), a
/// background child's call, or the same call with a split that puts it on a CPU are not.
#[test]
fn a_call_that_returns_at_once_and_took_long_was_the_thread_off_its_cpu() {
    let run = |tid: u32, name: &'static str, path: &str, on_cpu: Option<u64>| {
        let mut s = Seq::with_io_thread();
        s.call(100, 0, 10 * US, "epoll_wait", Some(7), 1, Extra::None);
        let mut sc = Syscall::new(name);
        sc.fd = Some(20);
        sc.fd_path = Some(path.into());
        sc.ret = Ret::Val(5);
        (sc.dur, sc.dur_src) = (Some(300 * MS), DurSource::Measured);
        sc.sched = on_cpu.map(|on| {
            Box::new(crate::event::SchedSpan {
                during: crate::event::SchedDelta {
                    on_cpu_ns: on,
                    ..Default::default()
                },
                before: None,
            })
        });
        s.ev(tid, MS, EventKind::Syscall(sc));
        s.call(
            100,
            302 * MS,
            10 * US,
            "epoll_wait",
            Some(7),
            0,
            Extra::None,
        );
        let r = s.report();
        let st = r
            .stalls
            .iter()
            .find(|x| x.kind == StallKind::SlowSyscall)
            .unwrap_or_else(|| panic!("{:?}", r.stalls));
        let sev = r
            .findings
            .iter()
            .find(|f| Some(f.id) == st.finding)
            .map(|f| f.severity);
        (st.finding.map(FindingId::as_str), st.cause.clone(), sev)
    };
    let client = "TCP:[127.0.0.1:6379->127.0.0.1:50000]";
    for (tid, name, path) in [
        (100, "write", client),
        (102, "read", client),
        (100, "getpeername", client),
        (102, "read", "anon_inode:[eventfd]"),
        (100, "read", "/proc/100/stat"),
    ] {
        let (id, why, sev) = run(tid, name, path, None);
        assert_eq!(id, Some("off-cpu"), "{name} {path}: {why}");
        assert!(why.contains("returns at once in redis"), "{why}");
        assert_eq!(sev, Some(crate::report::Severity::Warning), "{why}");
    }
    for (tid, name, path, on_cpu) in [
        (100, "write", "pipe:[4242]", None),
        (100, "read", "/proc/100/smaps", None),
        (100, "write", client, Some(290 * MS as u64)),
    ] {
        let (id, why, _) = run(tid, name, path, on_cpu);
        assert_ne!(id, Some("off-cpu"), "{name} {path}: {why}");
    }
}
