//! Tracer tests on small child processes (no redis needed). They ptrace, so they take a
//! lock: ptrace tests run one at a time.

use super::*;
use crate::event::Ret;
use crate::live::sysnames::syscall_name;
use crate::live::Tracer;
use std::process::{Command, Stdio};
use std::sync::Mutex;

pub(crate) static PTRACE_LOCK: Mutex<()> = Mutex::new(());

/// Kills the child when a test ends, pass or fail, so no loop outlives it.
struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        // The tracer's waitpid(-1) may already have reaped it: ECHILD is fine.
        let _ = self.0.wait();
    }
}

fn collect(t: &mut PtraceTracer, until: impl Fn(&[Event]) -> bool, max: Duration) -> Vec<Event> {
    let start = std::time::Instant::now();
    let mut v = vec![];
    while start.elapsed() < max {
        match t.next_event_timeout(Duration::from_millis(50)) {
            Ok(Some(e)) => v.push(e),
            Ok(None) if t.is_done() => break,
            Ok(None) => {}
            Err(e) => panic!("tracer failed: {e:#}"),
        }
        if until(&v) {
            break;
        }
    }
    v
}

fn d_of(s: &Syscall) -> Nanos {
    s.dur.unwrap_or(0)
}

fn cfg(pid: u32) -> PtraceConfig {
    PtraceConfig {
        pid,
        follow_forks: true,
        detach_wait: Duration::from_millis(500),
        split_sched: true,
    }
}

#[test]
fn traces_writes_with_data_fd_and_duration_then_detaches_cleanly() {
    let _g = PTRACE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // A shell loop writing a known line to a file every 20 ms.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.txt");
    let mut child = Kill(
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "exec >{}; while :; do echo '*1 hello'; sleep 0.02; done",
                out.display()
            ))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    std::thread::sleep(Duration::from_millis(100));
    let mut t = PtraceTracer::attach(cfg(pid)).unwrap();
    let evs = collect(
        &mut t,
        |v| {
            v.iter()
                .filter(|e| matches!(e.syscall(), Some(s) if s.name == "write" && s.fd == Some(1)))
                .count()
                >= 3
        },
        Duration::from_secs(5),
    );
    t.stop();
    let rest = collect(&mut t, |_| false, Duration::from_secs(5));
    assert!(t.is_done(), "tracer did not finish after stop");
    let writes: Vec<&Syscall> = evs
        .iter()
        .filter_map(|e| e.syscall())
        .filter(|s| s.name == "write" && s.fd == Some(1))
        .collect();
    assert!(
        writes.len() >= 3,
        "saw {} writes to fd 1 in {} events",
        writes.len(),
        evs.len()
    );
    let d = writes[0].data().expect("write carries its data");
    assert_eq!(d.head().bytes(), b"*1 hello\n");
    assert_eq!(writes[0].ret, Ret::Val(9));
    assert!(writes[0].dur.is_some_and(|d| d >= 0));
    // The shell forks `sleep`: the fork is followed and the child's execve seen.
    let names: Vec<&str> = evs
        .iter()
        .filter_map(|e| e.syscall())
        .map(|s| s.name)
        .collect();
    assert!(
        names
            .iter()
            .any(|n| *n == "clone" || *n == "clone3" || *n == "fork" || *n == "vfork"),
        "{names:?}"
    );
    assert!(
        names.contains(&"execve"),
        "the exec of the forked child is seen"
    );
    assert!(matches!(
        evs[0].kind,
        EventKind::Attach { threads: Some(1) }
    ));
    assert!(rest.iter().any(|e| matches!(e.kind, EventKind::Detach)));
    // Timestamps of one thread never go backwards.
    let mut last: HashMap<Tid, Nanos> = HashMap::new();
    for e in evs.iter().filter(|e| e.tid == pid) {
        if let Some(l) = last.get(&e.tid) {
            assert!(e.ts >= *l, "time went backwards");
        }
        last.insert(e.tid, e.end());
    }
    // Detached: no tracer, and the process keeps running.
    std::thread::sleep(Duration::from_millis(50));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("TracerPid:") && l.trim_end().ends_with("\t0")),
        "{status}"
    );
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "child died after detach"
    );
    assert!(t.stats().syscalls > 0);
}

#[test]
fn a_call_running_at_attach_is_kept_as_in_flight_at_start() {
    let _g = PTRACE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // sleep(1) is in nanosleep (restartable) for the whole attach.
    let spawned = crate::clock::now_mono();
    let child = Kill(Command::new("sleep").arg("0.6").spawn().unwrap());
    let pid = child.0.id();
    // Attach once it sleeps (clock_nanosleep is 230, nanosleep 35 on x86_64), however long
    // a loaded machine takes to start it.
    let in_sleep = || {
        std::fs::read_to_string(format!("/proc/{pid}/syscall"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<i64>().ok())
            .is_some_and(|nr| nr == 230 || nr == 35)
    };
    let start = std::time::Instant::now();
    while !in_sleep() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "sleep never slept"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let seen = crate::clock::now_mono();
    let mut t = PtraceTracer::attach(cfg(pid)).unwrap();
    let attached = crate::clock::now_mono();
    let evs = collect(&mut t, |_| false, Duration::from_secs(30));
    let done = crate::clock::now_mono();
    assert!(t.is_done());
    let sleeps: Vec<&Syscall> = evs
        .iter()
        .filter_map(|e| e.syscall())
        .filter(|s| s.name == "clock_nanosleep" || s.name == "nanosleep")
        .collect();
    assert_eq!(sleeps.len(), 1, "{evs:?}");
    assert_eq!(sleeps[0].in_flight, Some(InFlight::AtStart));
    // Its split counts from the attach; the gap before it is not known.
    let s = sleeps[0]
        .sched
        .as_deref()
        .expect("the split since the attach");
    assert!(
        s.before.is_none() && (s.during.on_cpu_ns as Nanos) < d_of(sleeps[0]) / 2,
        "{s:?}"
    );
    // Known from the attach to its end: it began after `spawned` and lasts 0.6 s, the
    // attach began after `seen` and was over by `attached`, its end was handled by `done`.
    let d = sleeps[0].dur.unwrap_or(0);
    let lo = (spawned + 600_000_000 - attached).max(0);
    assert!(
        d >= lo - 1_000_000 && d <= done - seen,
        "dur {d}, not in [{lo}, {}]",
        done - seen
    );
    assert!(evs
        .iter()
        .any(|e| matches!(e.kind, EventKind::Exit { code: Some(0), .. })));
}

#[test]
fn a_call_running_at_detach_is_kept_as_in_flight_at_end() {
    let _g = PTRACE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let child = Kill(
        Command::new("sh")
            .arg("-c")
            .arg("sleep 0.05; exec sleep 3")
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let mut t = PtraceTracer::attach(cfg(pid)).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    t.stop();
    let evs = collect(&mut t, |_| false, Duration::from_secs(5));
    assert!(t.is_done());
    let last = evs
        .iter()
        .filter_map(|e| e.syscall())
        .find(|s| {
            (s.name == "clock_nanosleep" || s.name == "nanosleep")
                && s.in_flight == Some(InFlight::AtEnd)
        })
        .unwrap_or_else(|| panic!("no in-flight sleep in {evs:?}"));
    assert!(last.dur.unwrap_or(0) > 100_000_000);
    let s = last.sched.as_deref().expect("the split up to the detach");
    assert!((s.during.on_cpu_ns as Nanos) < d_of(last) / 2, "{s:?}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status
        .lines()
        .any(|l| l.starts_with("TracerPid:") && l.trim_end().ends_with("\t0")));
}

#[test]
fn attach_errors_are_clear() {
    let _g = PTRACE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    match PtraceTracer::attach(cfg(4_000_000)) {
        Err(AttachError::NoSuchPid(4_000_000)) => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("attached to a pid that cannot exist"),
    }
    let child = Kill(Command::new("sleep").arg("2").spawn().unwrap());
    let t = PtraceTracer::attach(cfg(child.0.id())).unwrap();
    match PtraceTracer::attach(cfg(child.0.id())) {
        Err(AttachError::AlreadyTraced { .. }) => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("second tracer attached"),
    }
    drop(t);
}

/// The seize's stop interrupts a call running at the attach (`-ERESTARTSYS`); a signal can
/// come before the kernel restarts it, and the thread's next entry is then its handler's
/// `rt_sigreturn` (or any call after an EINTR): a call of its own, begun now. Taking it for
/// the restarted call timed an `rt_sigreturn` from the attach, "already running", placed
/// before the signal that preceded it (the flaky "time went backwards" of the test above
/// under load). Only the same call, or `restart_syscall`, continues the interrupted one.
#[test]
fn only_the_restart_of_the_interrupted_call_continues_it() {
    let nr = |n: &str| -> i64 { (0..512).find(|i| syscall_name(*i) == n).expect(n) };
    let (wait4, sigreturn, restart) = (nr("wait4"), nr("rt_sigreturn"), nr("restart_syscall"));
    let interrupted = |orig: i64| Thread {
        tgid: 1,
        entry: None,
        files: None,
        last_exit: None,
        at_attach: Some([1; 4]),
        from_attach: true,
        awaiting_first_stop: false,
        restart_from: Some(Interrupted {
            entry: Entry {
                ts: 100,
                nr: orig,
                args: [7; 6],
                in_flight: Some(InFlight::AtStart),
                sched: Some([1; 4]),
            },
            errno: crate::live::sysnames::ERESTARTSYS,
        }),
    };
    let mut t = interrupted(wait4);
    let (e, ended) = t.enter(sigreturn, [0; 6], 500, Some([9; 4]));
    assert_eq!((e.ts, e.nr, e.in_flight), (500, sigreturn, None));
    assert_eq!(
        e.sched,
        Some([9; 4]),
        "a new call's split starts at its entry"
    );
    let ended = ended.expect("the interrupted call is handed back to be reported");
    assert_eq!((ended.entry.ts, ended.entry.nr), (100, wait4));
    assert!(t.restart_from.is_none());

    let mut t = interrupted(wait4);
    let (e, ended) = t.enter(wait4, [1; 6], 500, Some([9; 4]));
    assert_eq!(
        (e.ts, e.nr, e.in_flight),
        (100, wait4, Some(InFlight::AtStart))
    );
    assert_eq!(
        e.sched,
        Some([1; 4]),
        "the restarted call's split starts at the attach"
    );
    assert!(ended.is_none());

    let mut t = interrupted(nr("clock_nanosleep"));
    let (e, ended) = t.enter(restart, [0; 6], 500, None);
    assert_eq!(
        (e.ts, e.nr, e.args, e.in_flight),
        (100, nr("clock_nanosleep"), [7; 6], Some(InFlight::AtStart))
    );
    assert!(ended.is_none());

    let mut t = interrupted(wait4);
    t.restart_from = None;
    let (e, ended) = t.enter(wait4, [1; 6], 500, None);
    assert_eq!((e.ts, e.in_flight), (500, None));
    assert!(ended.is_none());
}

/// Every call carries the scheduler's split read at the stops (`sched`): a shell that
/// spins in its own loop (no syscall) between sleeps shows that loop on a CPU in the gap
/// before its next call, its waits for the `sleep` it forks as off the CPU, and no split
/// counts more than the span stamped at the stops around it.
#[test]
fn calls_and_gaps_carry_the_split_read_at_the_stops() {
    let _g = PTRACE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let child = Kill(
        Command::new("sh")
            .arg("-c")
            .arg("while :; do i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 0.03; done")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    std::thread::sleep(Duration::from_millis(100));
    let mut t = PtraceTracer::attach(cfg(pid)).unwrap();
    assert!(t.capabilities().splits_sched);
    let wait4s = |v: &[Event]| {
        v.iter()
            .filter(|e| e.tid == pid)
            .filter_map(|e| e.syscall())
            .filter(|s| s.name == "wait4" && s.dur.unwrap_or(0) >= 20_000_000)
            .count()
    };
    let evs = collect(&mut t, |v| wait4s(v) >= 5, Duration::from_secs(30));
    t.stop();
    collect(&mut t, |_| false, Duration::from_secs(5));
    assert!(wait4s(&evs) >= 5, "too few loops traced: {}", evs.len());
    // Span and split of each call and the gap before it, in the shell's own thread.
    let mut prev_end = None;
    let (mut spins, mut waits) = (0, 0);
    for e in evs.iter().filter(|e| e.tid == pid) {
        let Some(sc) = e.syscall() else { continue };
        let dur = sc.dur.unwrap_or(0);
        let s = sc
            .sched
            .as_deref()
            .unwrap_or_else(|| panic!("no split: {e:?}"));
        // The counters move only between the stops' reads, inside the stamped span (with
        // room for the two clocks' rounding).
        let within = |d: &event::SchedDelta, span: Nanos| {
            ((d.on_cpu_ns + d.runnable_ns) as Nanos) <= span + span / 50 + 200_000
        };
        assert!(within(&s.during, dur), "{e:?}");
        if let (Some(b), Some(p)) = (s.before, prev_end) {
            let gap = e.ts - p;
            assert!(within(&b, gap), "gap {gap}: {e:?}");
            // The shell's own loop: 20 ms or so on a CPU, the rest of the gap (on a loaded
            // machine) waiting for one, not blocked.
            let ran = (b.on_cpu_ns + b.runnable_ns) as Nanos;
            spins += usize::from(b.on_cpu_ns >= 5_000_000 && ran * 2 >= gap);
        }
        if sc.name == "wait4" && dur >= 20_000_000 {
            waits += 1;
            assert!(s.during.on_cpu_ns as Nanos * 2 < dur, "{e:?}");
        }
        prev_end = Some(e.ts + dur);
    }
    assert!(spins >= 3 && waits >= 3, "{spins} spins, {waits} waits");
}
