//! Unit tests of the perf backend's record parsing and entry/exit pairing, on records built
//! by hand in the kernel's layout (no perf_event_open needed).

use super::*;
use crate::event::Ret;

const ENTER: u64 = 443;
const EXIT: u64 = 442;

fn sample(pid: u32, tid: u32, ts: u64, raw: &[u8]) -> Vec<u8> {
    let mut body = vec![];
    body.extend_from_slice(&pid.to_ne_bytes());
    body.extend_from_slice(&tid.to_ne_bytes());
    body.extend_from_slice(&ts.to_ne_bytes());
    body.extend_from_slice(&(raw.len() as u32).to_ne_bytes());
    body.extend_from_slice(raw);
    while (body.len() + 8) % 8 != 0 {
        body.push(0);
    }
    let mut r = vec![];
    r.extend_from_slice(&sys::bindings::PERF_RECORD_SAMPLE.to_ne_bytes());
    r.extend_from_slice(&0u16.to_ne_bytes());
    r.extend_from_slice(&((body.len() + 8) as u16).to_ne_bytes());
    r.extend_from_slice(&body);
    r
}

fn enter_raw(nr: i64, args: [u64; 6]) -> Vec<u8> {
    let mut raw = vec![];
    raw.extend_from_slice(&(ENTER as u16).to_ne_bytes());
    raw.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    raw.extend_from_slice(&nr.to_ne_bytes());
    for a in args {
        raw.extend_from_slice(&a.to_ne_bytes());
    }
    raw
}

fn exit_raw(nr: i64, ret: i64) -> Vec<u8> {
    let mut raw = vec![];
    raw.extend_from_slice(&(EXIT as u16).to_ne_bytes());
    raw.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    raw.extend_from_slice(&nr.to_ne_bytes());
    raw.extend_from_slice(&ret.to_ne_bytes());
    raw
}

fn task_record(typ: u32, pid: u32, ppid: u32, tid: u32, ts: u64) -> Vec<u8> {
    let mut r = vec![];
    r.extend_from_slice(&typ.to_ne_bytes());
    r.extend_from_slice(&0u16.to_ne_bytes());
    r.extend_from_slice(&32u16.to_ne_bytes());
    for v in [pid, ppid, tid, ppid] {
        r.extend_from_slice(&v.to_ne_bytes());
    }
    r.extend_from_slice(&ts.to_ne_bytes());
    r
}

fn parse(b: &[u8]) -> (Option<Rec>, u64) {
    let mut lost = 0;
    (parse_record(b, (ENTER, EXIT), None, &mut lost), lost)
}

fn tracer() -> PerfTracer {
    let mut t = PerfTracer::unattached(
        PerfConfig {
            pid: 100,
            follow_forks: true,
            pages: 1,
        },
        (ENTER, EXIT),
    );
    t.fed.stats.attach_mono = 1_000;
    t.threads.insert(100, Thread::new(100, true));
    t
}

fn feed(t: &mut PerfTracer, recs: &[Vec<u8>]) -> Vec<Event> {
    let mut lost = 0;
    for b in recs {
        if let Some(r) = parse_record(b, (ENTER, EXIT), None, &mut lost) {
            t.process(r);
        }
    }
    t.fed.queue.drain(..).collect()
}

fn nr(name: &str) -> i64 {
    super::super::sysnames::syscall_nr(name).expect("known syscall")
}

#[test]
fn enter_and_exit_samples_parse() {
    let (r, _) = parse(&sample(
        100,
        101,
        5_000,
        &enter_raw(1, [7, 0x1000, 12, 0, 0, 0]),
    ));
    let r = r.expect("a record");
    assert_eq!((r.pid, r.tid, r.ts), (100, 101, 5_000));
    assert!(matches!(r.kind, RecKind::Enter { nr: 1, args } if args[0] == 7 && args[2] == 12));
    let (r, _) = parse(&sample(100, 101, 6_000, &exit_raw(1, -11)));
    assert!(matches!(
        r.expect("a record").kind,
        RecKind::Exit { nr: 1, ret: -11 }
    ));
}

#[test]
fn lost_records_are_counted_and_truncated_records_ignored() {
    let mut b = vec![];
    b.extend_from_slice(&sys::bindings::PERF_RECORD_LOST.to_ne_bytes());
    b.extend_from_slice(&0u16.to_ne_bytes());
    b.extend_from_slice(&24u16.to_ne_bytes());
    b.extend_from_slice(&9u64.to_ne_bytes());
    b.extend_from_slice(&1234u64.to_ne_bytes());
    let (r, lost) = parse(&b);
    assert!(r.is_none());
    assert_eq!(lost, 1234);
    let s = sample(1, 1, 1, &enter_raw(0, [0; 6]));
    assert!(parse(&s[..20]).0.is_none(), "a cut record is not a record");
    // A tracepoint that is not one of ours.
    let mut raw = enter_raw(0, [0; 6]);
    raw[0] = 1;
    raw[1] = 0;
    assert!(parse(&sample(1, 1, 1, &raw)).0.is_none());
}

#[test]
fn a_call_is_paired_into_one_timed_event_with_its_fd() {
    let mut t = tracer();
    let w = nr("fdatasync");
    let evs = feed(
        &mut t,
        &[
            sample(100, 100, 2_000, &enter_raw(w, [9, 0, 0, 0, 0, 0])),
            sample(100, 100, 52_000, &exit_raw(w, 0)),
        ],
    );
    assert_eq!(evs.len(), 1);
    let sc = evs[0].syscall().expect("syscall");
    assert_eq!(sc.name, "fdatasync");
    assert_eq!(sc.fd, Some(9));
    assert_eq!(sc.dur, Some(50_000));
    assert_eq!(sc.ret, Ret::Val(0));
    assert_eq!(evs[0].ts, 2_000);
    assert_eq!(t.fed.stats.main_syscalls, 1);
}

#[test]
fn errors_become_errno_names() {
    let mut t = tracer();
    let r = nr("read");
    let evs = feed(
        &mut t,
        &[
            sample(100, 100, 2_000, &enter_raw(r, [5, 0, 16, 0, 0, 0])),
            sample(100, 100, 3_000, &exit_raw(r, -11)),
        ],
    );
    assert_eq!(evs[0].syscall().map(|s| s.ret), Some(Ret::Err("EAGAIN")));
}

#[test]
fn an_exit_first_is_a_call_running_at_attach_known_from_the_attach() {
    let mut t = tracer();
    let f = nr("fdatasync");
    let evs = feed(&mut t, &[sample(100, 100, 9_000, &exit_raw(f, 0))]);
    assert_eq!(evs.len(), 1);
    let sc = evs[0].syscall().expect("syscall");
    assert_eq!(sc.in_flight, Some(InFlight::AtStart));
    assert_eq!(evs[0].ts, 1_000);
    assert_eq!(sc.dur, Some(8_000));
    assert_eq!(sc.fd, None, "its arguments were never seen");
    // A second lone exit is not: it is dropped (its entry was lost).
    let evs = feed(&mut t, &[sample(100, 100, 10_000, &exit_raw(f, 0))]);
    assert!(evs.is_empty());
}

/// A call already running at the attach gets the split of its traced part: the thread's
/// counters start at the attach (blocked until woken at 5 µs, runnable to 7, on a CPU to 9).
#[test]
fn a_call_running_at_attach_is_split_from_the_attach() {
    let mut t = tracer();
    t.sched = Some(sched_ids());
    let w = nr("epoll_wait");
    let evs = sched_feed(
        &mut t,
        &[
            sample(7, 7, 5_000, &wakeup_raw(100)),
            switch_record(100, 100, 7_000, false, false),
            sample(100, 100, 9_000, &exit_raw(w, 1)),
        ],
    );
    assert_eq!(evs.len(), 1);
    let sc = evs[0].syscall().expect("syscall");
    assert_eq!(sc.in_flight, Some(InFlight::AtStart));
    let s = sc.sched.as_deref().expect("a split of its traced part");
    assert!(s.before.is_none());
    assert_eq!(
        (s.during.on_cpu_ns, s.during.runnable_ns),
        (2_000, 2_000),
        "{s:?}"
    );
    let st = crate::report::StallSched::of(&s.during, sc.dur.unwrap());
    assert_eq!((st.on_cpu_us, st.runnable_us, st.blocked_us), (2, 2, 4));
}

#[test]
fn fork_records_make_clones_threads_or_processes_and_task_exits_end_them() {
    let mut t = tracer();
    let clone = nr("clone");
    let evs = feed(
        &mut t,
        &[
            sample(100, 100, 2_000, &enter_raw(clone, [0x11, 0, 0, 0, 0, 0])),
            task_record(sys::bindings::PERF_RECORD_FORK, 200, 100, 200, 2_500),
            sample(200, 200, 2_600, &exit_raw(clone, 0)), // the child's side: no entry
            sample(100, 100, 3_000, &exit_raw(clone, 200)),
            sample(
                200,
                200,
                4_000,
                &enter_raw(nr("exit_group"), [0, 0, 0, 0, 0, 0]),
            ),
            task_record(sys::bindings::PERF_RECORD_EXIT, 200, 100, 200, 4_100),
        ],
    );
    let clone_ev = evs
        .iter()
        .find(|e| e.syscall().is_some_and(|s| s.name == "clone"))
        .expect("the clone");
    assert_eq!(clone_ev.tid, 100);
    assert_eq!(
        clone_ev.syscall().map(|s| s.extra.clone()),
        Some(event::Extra::Clone { thread: false })
    );
    assert!(
        !evs.iter()
            .any(|e| e.tid == 200 && e.syscall().is_some_and(|s| s.name == "clone")),
        "the child's return from clone is not a call"
    );
    let exit = evs.last().expect("events");
    assert_eq!(exit.tid, 200);
    assert_eq!(
        exit.kind,
        EventKind::Exit {
            code: Some(0),
            signal: None
        }
    );
    let eg = &evs[evs.len() - 2];
    assert_eq!(eg.syscall().map(|s| s.name), Some("exit_group"));
}

#[test]
fn a_thread_clone_is_a_thread() {
    let mut t = tracer();
    let clone3 = nr("clone3");
    let evs = feed(
        &mut t,
        &[
            sample(100, 100, 2_000, &enter_raw(clone3, [0, 88, 0, 0, 0, 0])),
            task_record(sys::bindings::PERF_RECORD_FORK, 100, 100, 105, 2_500),
            sample(100, 100, 3_000, &exit_raw(clone3, 105)),
            sample(100, 105, 3_100, &enter_raw(nr("read"), [3, 0, 1, 0, 0, 0])),
            sample(100, 105, 3_200, &exit_raw(nr("read"), 1)),
        ],
    );
    assert_eq!(
        evs[0].syscall().map(|s| s.extra.clone()),
        Some(event::Extra::Clone { thread: true })
    );
    assert_eq!(evs[1].tid, 105);
    assert_eq!(evs[1].syscall().and_then(|s| s.fd), Some(3));
}

#[test]
fn without_follow_forks_children_are_dropped() {
    let mut t = tracer();
    t.cfg.follow_forks = false;
    let r = nr("read");
    let evs = feed(
        &mut t,
        &[
            sample(300, 300, 2_000, &enter_raw(r, [3, 0, 1, 0, 0, 0])),
            sample(300, 300, 2_100, &exit_raw(r, 1)),
        ],
    );
    assert!(evs.is_empty());
}

#[test]
fn calls_running_at_the_end_are_in_flight() {
    let mut t = tracer();
    let ew = nr("epoll_wait");
    feed(
        &mut t,
        &[sample(100, 100, 2_000, &enter_raw(ew, [4, 0, 0, 0, 0, 0]))],
    );
    t.finish();
    let evs: Vec<Event> = t.fed.queue.drain(..).collect();
    let sc = evs[0].syscall().expect("the call");
    assert_eq!(sc.in_flight, Some(InFlight::AtEnd));
    assert_eq!(sc.fd, Some(4));
    assert!(matches!(
        evs.last().map(|e| &e.kind),
        Some(EventKind::Detach)
    ));
    assert!(t.is_done() || !t.fed.queue.is_empty());
}

#[test]
fn tracefs_lookup_names_both_places_when_missing() {
    // On this machine tracefs may or may not be mounted: either the ids are found or the
    // reason names what to do.
    match find_tracepoints() {
        Ok(tp) => assert!(tp.enter != tp.exit),
        Err(e) => assert!(e.contains("tracing"), "{e}"),
    }
}

/// Under load the exit of an open is processed well after the call: redis has closed the fd
/// and an accepted client took its number. The fd's link then names a socket; the open must
/// still bind what it opened (the link read late must not name it), in this process, whose
/// memory holds the path and whose fd table holds the socket.
#[test]
fn an_open_processed_after_its_fd_was_reused_names_what_was_opened() {
    let me = std::process::id();
    let mut t = PerfTracer::unattached(
        PerfConfig {
            pid: me,
            follow_forks: true,
            pages: 1,
        },
        (ENTER, EXIT),
    );
    t.threads.insert(me, Thread::new(me, false));
    let path = std::ffi::CString::new("/proc/self/stat").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback socket");
    let reused = std::os::unix::io::AsRawFd::as_raw_fd(&listener) as i64;
    let o = nr("openat");
    let args = [(-100i64) as u64, path.as_ptr() as u64, 0, 0, 0, 0];
    let evs = feed(
        &mut t,
        &[
            sample(me, me, 2_000, &enter_raw(o, args)),
            sample(me, me, 9_000, &exit_raw(o, reused)),
        ],
    );
    let sc = evs[0].syscall().expect("the openat");
    assert_eq!(sc.path(), Some("/proc/self/stat"));
    assert_eq!(
        crate::syscalls::fd_effect(sc),
        crate::syscalls::FdEffect::Open {
            fd: reused as i32,
            path: Some("/proc/self/stat")
        },
        "ret_path {:?}",
        sc.ret_path
    );
    // Still open as what the call opened: the link names it.
    let f = std::fs::File::open("/proc/self/stat").unwrap();
    let fd = std::os::unix::io::AsRawFd::as_raw_fd(&f) as i64;
    let evs = feed(
        &mut t,
        &[
            sample(me, me, 10_000, &enter_raw(o, args)),
            sample(me, me, 11_000, &exit_raw(o, fd)),
        ],
    );
    let want = format!("/proc/{me}/stat");
    assert_eq!(
        evs[0].syscall().and_then(|s| s.ret_path.as_deref()),
        Some(want.as_str())
    );
    drop(listener);
}

const WAKEUP: u64 = 374;

fn sched_ids() -> SchedIds {
    SchedIds {
        wakeup: WAKEUP,
        wakeup_pid_off: 24,
        minor: [11].into_iter().collect(),
        major: [12].into_iter().collect(),
    }
}

/// A context-switch record of a per-task event: header, then the sample_id trailer.
fn switch_record(pid: u32, tid: u32, ts: u64, out: bool, preempt: bool) -> Vec<u8> {
    let mut misc = 0u16;
    if out {
        misc |= sys::bindings::PERF_RECORD_MISC_SWITCH_OUT as u16;
    }
    if preempt {
        misc |= sys::bindings::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT as u16;
    }
    let mut r = vec![];
    r.extend_from_slice(&sys::bindings::PERF_RECORD_SWITCH.to_ne_bytes());
    r.extend_from_slice(&misc.to_ne_bytes());
    r.extend_from_slice(&24u16.to_ne_bytes());
    r.extend_from_slice(&pid.to_ne_bytes());
    r.extend_from_slice(&tid.to_ne_bytes());
    r.extend_from_slice(&ts.to_ne_bytes());
    r
}

/// A page-fault sample: TID, TIME, ID.
fn fault_record(pid: u32, tid: u32, ts: u64, id: u64) -> Vec<u8> {
    let mut r = vec![];
    r.extend_from_slice(&sys::bindings::PERF_RECORD_SAMPLE.to_ne_bytes());
    r.extend_from_slice(&0u16.to_ne_bytes());
    r.extend_from_slice(&32u16.to_ne_bytes());
    r.extend_from_slice(&pid.to_ne_bytes());
    r.extend_from_slice(&tid.to_ne_bytes());
    r.extend_from_slice(&ts.to_ne_bytes());
    r.extend_from_slice(&id.to_ne_bytes());
    r
}

/// sched_wakeup's raw fields: common header, comm, then the woken pid at 24.
fn wakeup_raw(woken: u32) -> Vec<u8> {
    let mut raw = vec![];
    raw.extend_from_slice(&(WAKEUP as u16).to_ne_bytes());
    raw.extend_from_slice(&[0; 6]);
    raw.extend_from_slice(&[b'x'; 16]);
    raw.extend_from_slice(&woken.to_ne_bytes());
    raw.extend_from_slice(&[0; 8]);
    raw
}

fn sched_feed(t: &mut PerfTracer, recs: &[Vec<u8>]) -> Vec<Event> {
    let mut lost = 0;
    let ids = t.sched.clone();
    for b in recs {
        if let Some(r) = parse_record(b, (ENTER, EXIT), ids.as_ref(), &mut lost) {
            t.process(r);
        }
    }
    t.fed.queue.drain(..).collect()
}

#[test]
fn scheduler_records_parse_only_when_read() {
    let ids = sched_ids();
    let p = |b: &[u8], s: Option<&SchedIds>| parse_record(b, (ENTER, EXIT), s, &mut 0);
    let sw = switch_record(100, 101, 7_000, true, true);
    assert!(matches!(
        p(&sw, Some(&ids)).map(|r| (r.tid, r.ts, r.kind)),
        Some((
            101,
            7_000,
            RecKind::Switch {
                out: true,
                preempt: true
            }
        ))
    ));
    assert!(p(&sw, None).is_none(), "no split asked for: ignored");
    let sw = switch_record(100, 101, 8_000, false, false);
    assert!(matches!(
        p(&sw, Some(&ids)).map(|r| r.kind),
        Some(RecKind::Switch { out: false, .. })
    ));
    for (id, major) in [(11, false), (12, true)] {
        let f = fault_record(100, 101, 9_000, id);
        assert!(
            matches!(p(&f, Some(&ids)).map(|r| r.kind), Some(RecKind::Fault { major: m }) if m == major),
            "{id}"
        );
    }
    assert!(p(&fault_record(100, 101, 9_000, 13), Some(&ids)).is_none());
    // Woken 101 by a task of another process (5000).
    let w = sample(5_000, 5_000, 9_500, &wakeup_raw(101));
    assert!(matches!(
        p(&w, Some(&ids)).map(|r| (r.pid, r.kind)),
        Some((5_000, RecKind::Wakeup { woken: 101 }))
    ));
    assert!(p(&w, None).is_none());
}

/// The split the bpf backend reads from the kernel's task, rebuilt from the records: a call
/// that slept and was woken (blocked, then runnable, then on a CPU), then a gap with page
/// faults and a preemption.
#[test]
fn switches_wakeups_and_faults_split_calls_and_gaps() {
    let mut t = tracer();
    t.sched = Some(sched_ids());
    let w = nr("epoll_wait");
    let r = nr("read");
    let evs = sched_feed(
        &mut t,
        &[
            sample(100, 100, 10_000, &enter_raw(w, [5, 0, 0, 0, 0, 0])),
            // On a CPU 10..12 µs, asleep to 50, woken (by another process), runnable to 58.
            switch_record(100, 100, 12_000, true, false),
            sample(7, 7, 50_000, &wakeup_raw(100)),
            switch_record(100, 100, 58_000, false, false),
            sample(100, 100, 60_000, &exit_raw(w, 1)),
            // The gap: on a CPU 60..70, preempted 70..90, on again; three minor faults and
            // a major one.
            fault_record(100, 100, 62_000, 11),
            fault_record(100, 100, 63_000, 11),
            switch_record(100, 100, 70_000, true, true),
            switch_record(100, 100, 90_000, false, false),
            fault_record(100, 100, 91_000, 11),
            fault_record(100, 100, 92_000, 12),
            sample(100, 100, 100_000, &enter_raw(r, [8, 0, 0, 0, 0, 0])),
            sample(100, 100, 103_000, &exit_raw(r, 10)),
        ],
    );
    assert_eq!(evs.len(), 2);
    let s = |e: &Event| *e.syscall().and_then(|s| s.sched.as_deref()).expect("split");
    let first = s(&evs[0]);
    let d = first.during;
    assert_eq!(
        (d.on_cpu_ns, d.runnable_ns, d.minor_faults, d.major_faults),
        (4_000, 8_000, 0, 0),
        "2 µs on a CPU before it slept, 2 after; 8 µs runnable"
    );
    assert!(first.before.is_none(), "no call before it");
    let second = s(&evs[1]);
    let g = second.before.expect("the gap before the read");
    assert_eq!(
        (g.on_cpu_ns, g.runnable_ns, g.minor_faults, g.major_faults),
        (20_000, 20_000, 3, 1)
    );
    assert_eq!(second.during.on_cpu_ns, 3_000);
    // The split reaches the report's `sched` through the same path as bpf's.
    let gap_ns = 100_000 - 60_000;
    let st = crate::report::StallSched::of(&g, gap_ns);
    assert_eq!((st.on_cpu_us, st.runnable_us, st.blocked_us), (20, 20, 0));
}

/// Without the scheduler's records (tracefs without sched_wakeup, or its events refused),
/// calls carry no split rather than a wrong one.
#[test]
fn without_the_scheduler_records_calls_have_no_split() {
    let mut t = tracer();
    let r = nr("read");
    let evs = sched_feed(
        &mut t,
        &[
            sample(100, 100, 1_000, &enter_raw(r, [8, 0, 0, 0, 0, 0])),
            sample(100, 100, 2_000, &exit_raw(r, 1)),
            sample(100, 100, 5_000, &enter_raw(r, [8, 0, 0, 0, 0, 0])),
            sample(100, 100, 6_000, &exit_raw(r, 1)),
        ],
    );
    assert!(evs
        .iter()
        .all(|e| e.syscall().is_some_and(|s| s.sched.is_none())));
}

/// A ring in anonymous memory, laid out as the kernel's (control page, then data), holding
/// `recs`: what the reader thread sees of a perf ring.
fn fake_ring(recs: &[Vec<u8>]) -> Ring {
    let ps = super::super::page_size();
    let len = 2 * ps;
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let base = p as *mut u8;
    let mut off = 0;
    for r in recs {
        unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), base.add(ps + off), r.len()) };
        off += r.len();
    }
    let page = base as *mut sys::bindings::perf_event_mmap_page;
    unsafe { (*page).data_head = off as u64 };
    Ring {
        base,
        len,
        data_off: ps,
        data_size: ps,
        fd: -1,
        scratch: vec![],
    }
}

/// The reader thread's pass copies whole records out of every ring into one chunk, and
/// leaves the rings empty (the backlog's bound is the reader's own, tested in reader.rs).
#[test]
fn the_reader_copies_whole_records_out_of_the_rings() {
    use crate::live::reader::Source;
    let r = nr("read");
    let recs = vec![
        sample(100, 100, 1_000, &enter_raw(r, [8, 0, 0, 0, 0, 0])),
        sample(100, 100, 2_000, &exit_raw(r, 1)),
    ];
    let other = vec![sample(100, 101, 1_500, &exit_raw(r, 1))];
    let mut rings = PerfRings::new(vec![fake_ring(&recs), fake_ring(&other)]);
    let mut chunk = vec![];
    assert!(!rings.fill(&mut chunk), "everything fits one chunk");
    let mut kinds = vec![];
    for_each_record(&chunk, &mut |b| {
        kinds.push(parse_record(b, (ENTER, EXIT), None, &mut 0).map(|r| (r.tid, r.kind)))
    });
    assert!(
        matches!(
            kinds[..],
            [
                Some((100, RecKind::Enter { .. })),
                Some((100, RecKind::Exit { .. })),
                Some((101, RecKind::Exit { .. }))
            ]
        ),
        "{kinds:?}"
    );
    let mut left = 0;
    for ring in &mut rings.rings {
        ring.drain(&mut |_| {
            left += 1;
            true
        });
    }
    assert_eq!(left, 0);
}
