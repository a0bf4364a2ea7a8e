//! I/O-thread waits: whether a gap of the main thread was its wait for its I/O threads.
//! redis 6/7 hands the clients' reads and writes to `io_thd_N` every event-loop turn and
//! busy-waits until they are done; valkey 8/9 posts read, write and even `epoll_wait` jobs
//! and spins in user space until they finish. Either way the main thread makes no syscall
//! while its I/O threads work, which looks like a slow command. This unit keeps the recent
//! client I/O (and event-loop waits) of the other threads of each process, and for a gap
//! says how much of it those threads covered: a gap they covered from end to end, with no
//! stretch of the threshold's length that no I/O thread explains, was a wait for them.
//! redis 8's I/O threads run their own event loops and hand clients over through an
//! eventfd: its main thread waits in `epoll_wait` (idle) and is not helped here.
//!
//! Without the scheduler's split (strace offline) the trace still shows the hand-off: the
//! main thread's own share of a batch of reads or writes, then the I/O thread's share of
//! the same kind (nothing of the main thread's runs between the two in redis 6/7, so the
//! stretch before their share is their start, not a command); the main thread's futex wake
//! and the woken I/O thread's return (it waited for a CPU between); I/O work that ended just
//! as the gap began (the I/O threads spin for the next hand-off on a CPU the main thread
//! then waits for). Calls printed after the gap's end that began before it (strace's
//! `<unfinished ...>`, a hand-off wait woken in the gap) are added to it when they come.

use super::call::{Facts, ResolvedCall};
use super::roles::Role;
use crate::event::Nanos;
use crate::fdtable::{FileClass, ProcKey};
use std::collections::VecDeque;

/// Recent helper calls kept per process: enough for a gap of many thousands of calls (a
/// gap longer than they cover is judged on the part they do).
const RING: usize = 8192;

/// Within this of a gap's start, I/O-thread work ended "as the gap began" and the main
/// thread's last client I/O was the call the gap starts at: a few of strace's stops
/// (tens of µs each) between two threads' interleaved calls.
const ADJOIN: Nanos = 1_000_000;

/// What a client call of a thread did, for a hand-off's two shares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Dir {
    #[default]
    Other,
    Read,
    Write,
}

impl Dir {
    fn of(cx: &ResolvedCall<'_>) -> Dir {
        if cx.facts.has(Facts::EPOLL) || !cx.facts.has(Facts::CLIENT_RW) {
            Dir::Other
        } else if cx.facts.has(Facts::READ) {
            Dir::Read
        } else {
            Dir::Write
        }
    }
}

/// One call of an I/O thread: its span and the time it waited for a CPU right before it
/// and during it (live bpf backend; 0 elsewhere).
#[derive(Clone, Copy, Debug)]
struct HelperCall {
    start: Nanos,
    end: Nanos,
    runnable_before: Nanos,
    runnable_during: Nanos,
    /// Time on a CPU between its thread's previous call and this one.
    on_cpu_before: Nanos,
    /// Its scheduler counters were measured.
    sched: bool,
    dir: Dir,
}

/// The main thread's last calls that a hand-off is read from: its last client read or
/// write (its own share of a batch), and its last futex call that woke a waiter.
#[derive(Clone, Copy, Debug)]
struct MainSide {
    io_end: Nanos,
    io_dir: Dir,
    woke_at: Nanos,
}

impl Default for MainSide {
    fn default() -> Self {
        MainSide {
            io_end: Nanos::MIN,
            io_dir: Dir::Other,
            woke_at: Nanos::MIN,
        }
    }
}

/// The I/O threads' recent calls of one process and its main thread's side.
struct Proc {
    key: ProcKey,
    ring: VecDeque<HelperCall>,
    main: MainSide,
}

/// How long a runnable thread may wait for a CPU on a host with more runnable threads than
/// CPUs before the scheduler preempts one for it: a tick at HZ=100, the longest a kernel
/// ticks. A main thread that spins while its I/O threads compete with it (and with the
/// clients and the tracer) for too few CPUs loses about that much after every hand-off: a
/// stretch of the gap this short is read as scheduling, not as a command of its own.
const SCHED_TICK: Nanos = 10_000_000;

/// What the I/O threads did over one gap of the main thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct IoCover {
    /// Their calls inside the gap.
    pub(crate) calls: u32,
    /// The longest stretch of the gap before their last call that no I/O-thread call or
    /// CPU wait of theirs explains (from the gap's start to their first call counts).
    pub(crate) longest_hole: Nanos,
    /// From their last call's end to the gap's end: the main thread's own time after the
    /// wait (running the commands the I/O threads read).
    pub(crate) tail: Nanos,
    /// Of the gap, the time the I/O threads waited for a CPU (live bpf backend).
    pub(crate) runnable: Nanos,
    /// The scheduler measured every one of those calls.
    pub(crate) sched: bool,
    /// From the gap's start to the I/O threads' first call, when the main thread had just
    /// done its own share of the same batch (reads, or writes): their late start.
    pub(crate) late_start: Nanos,
    /// I/O-thread work ended as the gap began (`ADJOIN`).
    pub(crate) adjoining: bool,
    /// Of the gap, the holes between their calls counted as their wait for a CPU (`sweep`).
    pub(crate) starved_holes: Nanos,
}

impl IoCover {
    /// The gap (`gap` long) was the main thread waiting for its I/O threads: they worked
    /// (or waited for a CPU) through it up to its end, and no stretch of it was the main
    /// thread's own beyond what scheduling explains. The stretch after their last call
    /// (`tail`) is where a slow command runs (its request is read before it, by them or by
    /// the main thread, its reply written after): with the scheduler's counters of the
    /// main thread (`main_runnable`: its wait for a CPU over the gap) it may be no longer
    /// than a scheduler tick (or the threshold) plus that wait. Without them, and for a
    /// hole between their calls, half the gap is allowed too: a tracer that stops every
    /// call (strace) stretches the I/O threads' work, the holes between and the main
    /// thread's way back alike, where a slow command still leaves nearly all of its gap to
    /// the main thread alone.
    pub(crate) fn is_wait(
        &self,
        threshold: Nanos,
        gap: Nanos,
        main_runnable: Option<Nanos>,
    ) -> bool {
        let own = threshold.max(SCHED_TICK);
        let tail_max = main_runnable.map_or(own.max(gap / 2), |r| own + r);
        if self.calls == 0 {
            // Nothing of theirs in it, but their work ended as it began: the main thread
            // lost the CPU right after the hand-off, for no longer than scheduling
            // explains (the tail is the whole gap then).
            return self.adjoining && self.tail < own + main_runnable.unwrap_or(0);
        }
        self.tail < tail_max
            && self.longest_hole < own.max(gap / 2)
            && !self.both_starved(gap, main_runnable)
    }

    /// The gap rests on holes the I/O threads spent waiting for a CPU while the main thread
    /// itself waited for one through half of it or more. An idle I/O thread spins for the
    /// next hand-off (redis 6/7, valkey) and, on a host that short of CPUs, waits for one
    /// most of that time too, so its wait says no more than the main thread's does: what
    /// held the main thread was the CPU (live valkey 9 under bpf on a load of 11: an EVAL's
    /// 807 ms gap, 130 ms on a CPU and 674 ms waiting for one, its I/O thread's one call
    /// at the end, was "waited for its I/O threads").
    fn both_starved(&self, gap: Nanos, main_runnable: Option<Nanos>) -> bool {
        self.starved_holes > 0 && main_runnable.is_some_and(|r| r * 2 >= gap)
    }

    /// The longest stretch of the gap the main thread had to itself.
    pub(crate) fn longest_own(&self) -> Nanos {
        self.longest_hole.max(self.tail)
    }
}

#[derive(Default)]
pub(crate) struct IoHelpers {
    /// Per process with I/O threads (a handful at most: the traced one and its children).
    procs: Vec<Proc>,
}

impl IoHelpers {
    /// Whether a call is an I/O thread's work for the main thread: client-socket I/O or an
    /// event-loop wait (valkey's offloaded `epoll_wait`) outside the main thread.
    #[inline]
    pub(crate) fn is_helper_call(cx: &ResolvedCall<'_>) -> bool {
        !matches!(cx.role, Role::Main | Role::Child)
            && (cx.facts.has(Facts::EPOLL)
                || (cx.facts.has(Facts::CLIENT_RW) && cx.class == Some(FileClass::Client)))
    }

    /// Notes a call when it is an I/O thread's (the start it covers from is returned, for
    /// gaps that ended before its line came), or the main thread's side of a hand-off.
    #[inline]
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>) -> Option<Nanos> {
        if !cx.timed {
            return None;
        }
        if !Self::is_helper_call(cx) {
            if cx.role == Role::IoThread {
                return Some(self.on_handoff(cx));
            }
            if cx.role == Role::Main {
                self.on_main(cx);
            }
            return None;
        }
        let sched = cx.sc.sched.as_deref();
        // An event-loop wait is work for the main thread only where it returns (valkey's
        // offloaded poll has a timeout of 0); the time it blocked is no one's wait (redis
        // 8's I/O threads block in their own loops while the main thread runs a command).
        let start = if cx.facts.has(Facts::EPOLL) {
            cx.end
        } else {
            cx.ts()
        };
        let call = HelperCall {
            start,
            end: cx.end,
            runnable_before: sched
                .and_then(|s| s.before)
                .map_or(0, |b| b.runnable_ns as Nanos),
            runnable_during: sched.map_or(0, |s| s.during.runnable_ns as Nanos),
            on_cpu_before: sched
                .and_then(|s| s.before)
                .map_or(0, |b| b.on_cpu_ns as Nanos),
            sched: sched.is_some_and(|s| s.before.is_some()),
            dir: Dir::of(cx),
        };
        self.push(cx.proc, call);
        Some(start)
    }

    /// The main thread's client I/O (its share of a hand-off's batch) and its futex wakes
    /// that woke a waiter, in a process known to have I/O threads.
    fn on_main(&mut self, cx: &ResolvedCall<'_>) {
        let client_io = cx.facts.has(Facts::CLIENT_RW) && cx.class == Some(FileClass::Client);
        let woke = cx.sc.name == "futex" && matches!(cx.sc.ret, crate::event::Ret::Val(n) if n > 0);
        if !(client_io || woke) || (client_io && self.procs.is_empty()) {
            return;
        }
        // A wake may be the first sign of I/O threads (valkey switching them on, a woken
        // thread's first call coming after); client I/O only matters once they are seen.
        let i = match self.procs.iter().position(|p| p.key == cx.proc) {
            Some(i) => i,
            None if woke => self.entry(cx.proc),
            None => return,
        };
        let m = &mut self.procs[i].main;
        if woke {
            m.woke_at = cx.ts();
        } else {
            (m.io_end, m.io_dir) = (cx.end, Dir::of(cx));
        }
    }

    /// The index of `proc`'s entry, made when missing.
    fn entry(&mut self, proc: ProcKey) -> usize {
        self.procs
            .iter()
            .position(|p| p.key == proc)
            .unwrap_or_else(|| {
                self.procs.push(Proc {
                    key: proc,
                    ring: VecDeque::new(),
                    main: MainSide::default(),
                });
                self.procs.len() - 1
            })
    }

    /// Another call of an I/O thread (the hand-off wait in `futex` of redis 6/7 and valkey,
    /// an eventfd read): it blocked until the main thread woke it for work, then waited
    /// for a CPU before it returned. The blocked part is no one's wait; the part after the
    /// wake (its runnable time, at the call's end) is the I/O thread's, on work the main
    /// thread spins for, so it covers that stretch of a gap like a call of its own. Without
    /// the scheduler's split, a futex wait the main thread's wake fell into (strace offline)
    /// was woken there and waited for a CPU from the wake to its return; else only its
    /// return is known: a point. Returns the start it covers from.
    fn on_handoff(&mut self, cx: &ResolvedCall<'_>) -> Nanos {
        let sched = cx.sc.sched.as_deref();
        let before = sched.and_then(|s| s.before);
        let woken_wait = sched.map_or(0, |s| s.during.runnable_ns as Nanos);
        let mut start = (cx.end - woken_wait).max(cx.ts());
        if cx.sc.name == "futex" {
            let woke_at = self
                .procs
                .iter()
                .find(|p| p.key == cx.proc)
                .map_or(Nanos::MIN, |p| p.main.woke_at);
            if woke_at >= cx.ts() && woke_at < cx.end {
                start = start.min(woke_at);
            }
        }
        let call = HelperCall {
            start,
            end: cx.end,
            runnable_before: before.map_or(0, |b| b.runnable_ns as Nanos),
            runnable_during: woken_wait,
            on_cpu_before: before.map_or(0, |b| b.on_cpu_ns as Nanos),
            sched: before.is_some(),
            dir: Dir::Other,
        };
        self.push(cx.proc, call);
        start
    }

    fn push(&mut self, proc: ProcKey, call: HelperCall) {
        let i = self.entry(proc);
        let ring = &mut self.procs[i].ring;
        if ring.len() == RING {
            ring.pop_front();
        }
        ring.push_back(call);
    }

    /// The kind of the main thread's own share of a batch when its last client I/O ended
    /// the gap starting at `from` (asked at the gap's end: its next call moves it on).
    pub(crate) fn share(&self, proc: ProcKey, from: Nanos) -> Option<Dir> {
        let p = self.procs.iter().find(|p| p.key == proc)?;
        (p.main.io_end > from - ADJOIN && p.main.io_end <= from)
            .then_some(p.main.io_dir)
            .filter(|d| *d != Dir::Other)
    }

    /// What the I/O threads of `proc` did over the gap `[from, to]`; None when they did
    /// nothing in it (or the process has none). `share`: `Self::share` at the gap's end.
    pub(crate) fn cover(
        &self,
        proc: ProcKey,
        from: Nanos,
        to: Nanos,
        share: Option<Dir>,
    ) -> Option<IoCover> {
        let p = self.procs.iter().find(|p| p.key == proc)?;
        // Newest first until the calls end before the gap; out-of-order lines (an
        // unfinished call printed before its neighbours ended) are sorted below.
        let mut adjoining = false;
        let mut inside: Vec<HelperCall> = p
            .ring
            .iter()
            .rev()
            .take_while(|c| c.end > from - (to - from).max(ADJOIN))
            .filter(|c| {
                adjoining |= c.end <= from && c.end > from - ADJOIN && c.dir != Dir::Other;
                c.end > from && c.start < to
            })
            .copied()
            .collect();
        if inside.is_empty() && !adjoining {
            return None;
        }
        inside.sort_unstable_by_key(|c| c.start);
        let mut v = sweep(&inside, from, to, share);
        v.adjoining = adjoining;
        Some(v)
    }
}

/// The sweep over a gap's helper calls, sorted by start. A hole counts as an I/O thread's
/// wait for a CPU when, since its previous call, it waited for one for at least half the
/// hole and no less than it ran on one: an idle I/O thread spins on a CPU without a call
/// (redis 6/7, valkey) while the main thread runs a command, mostly running.
fn sweep(calls: &[HelperCall], from: Nanos, to: Nanos, share: Option<Dir>) -> IoCover {
    let mut cover = IoCover {
        sched: true,
        ..Default::default()
    };
    let mut until = from;
    for c in calls {
        let hole = c.start.min(to) - until;
        if hole > 0 && cover.calls == 0 && share == Some(c.dir) {
            // Their share of the batch the main thread had just done its own share of:
            // nothing of the main thread's runs before it, the wait is their start.
            cover.late_start = hole;
        } else if hole > 0 {
            // A hole the I/O thread spent waiting for a CPU (at least half of it) is still
            // the main thread waiting for it.
            let starved =
                c.sched && c.runnable_before * 2 >= hole && c.runnable_before >= c.on_cpu_before;
            if starved {
                cover.runnable += c.runnable_before.min(hole);
                cover.starved_holes += hole;
            } else {
                cover.longest_hole = cover.longest_hole.max(hole);
            }
        }
        cover.runnable += c.runnable_during;
        cover.sched &= c.sched;
        cover.calls += 1;
        until = until.max(c.end.min(to));
    }
    cover.tail = to - until;
    cover
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn c(start_ms: i64, end_ms: i64, runnable_before_ms: i64) -> HelperCall {
        HelperCall {
            start: start_ms * MS,
            end: end_ms * MS,
            runnable_before: runnable_before_ms * MS,
            runnable_during: 0,
            on_cpu_before: 0,
            sched: true,
            dir: Dir::Other,
        }
    }

    #[test]
    fn a_gap_covered_by_io_thread_work_is_a_wait_for_it() {
        // 10 ms gap, the io thread reading and writing all through it.
        let v = sweep(&[c(0, 3, 0), c(3, 6, 0), c(7, 10, 0)], 0, 10 * MS, None);
        assert!(v.is_wait(2 * MS, 10 * MS, Some(0)), "{v:?}");
        assert_eq!(v.tail, 0);
    }

    #[test]
    fn a_slow_command_between_hand_offs_is_not() {
        // The read handed off at the start, a 500 ms script, the write at the end: the
        // hole between is the main thread's own.
        let v = sweep(&[c(0, 1, 0), c(500, 501, 0)], 0, 501 * MS, None);
        assert!(!v.is_wait(2 * MS, 501 * MS, Some(0)), "{v:?}");
        assert_eq!(v.longest_own(), 499 * MS);
        // Work at the start only: the tail is the main thread's.
        let v = sweep(&[c(0, 1, 0)], 0, 300 * MS, None);
        assert!(!v.is_wait(2 * MS, 300 * MS, Some(0)));
        assert_eq!(v.tail, 299 * MS);
        // A hole of half the gap between their calls is a stretched hand-off; the same
        // stretch after their last call is the main thread's.
        assert!(
            sweep(&[c(0, 1, 0), c(50, 100, 0)], 0, 100 * MS, None).is_wait(
                2 * MS,
                100 * MS,
                Some(0)
            )
        );
        assert!(!sweep(&[c(0, 50, 0)], 0, 100 * MS, None).is_wait(2 * MS, 100 * MS, Some(0)));
        // Without the scheduler's counters a tail of under half the gap is the tracer's
        // stretch; with them, it is the main thread's unless it waited for a CPU.
        let v = sweep(&[c(0, 70, 0)], 0, 100 * MS, None);
        assert!(v.is_wait(2 * MS, 100 * MS, None));
        assert!(!v.is_wait(2 * MS, 100 * MS, Some(0)));
        assert!(v.is_wait(2 * MS, 100 * MS, Some(25 * MS)));
        // A slow command after the hand-off keeps most of the gap: never a wait.
        assert!(!sweep(&[c(0, 20, 0)], 0, 500 * MS, None).is_wait(2 * MS, 500 * MS, None));
        // A hand-off, a wait of a scheduler tick, the I/O work, another tick: a wait.
        let v = sweep(&[c(4, 5, 0), c(5, 6, 0)], 0, 10 * MS, None);
        assert!(v.is_wait(2 * MS, 10 * MS, Some(0)), "{v:?}");
        // No I/O-thread call in the gap: nothing to wait for.
        assert!(!sweep(&[], 0, 10 * MS, None).is_wait(2 * MS, 10 * MS, Some(0)));
    }

    #[test]
    fn a_host_short_of_cpus_is_no_wait_for_the_io_threads() {
        // The I/O thread waited for a CPU through the gap before its one call at the end:
        // a wait for it while the main thread spun on a CPU, CPU starvation when the main
        // thread waited for one through most of the gap as well.
        let v = sweep(&[c(799, 800, 760)], 0, 800 * MS, None);
        assert!(v.is_wait(2 * MS, 800 * MS, Some(20 * MS)), "{v:?}");
        assert!(!v.is_wait(2 * MS, 800 * MS, Some(670 * MS)), "{v:?}");
        // Covered by their calls, not by their wait for a CPU: a wait whatever the main
        // thread's own share of the CPU.
        let v = sweep(&[c(0, 400, 0), c(400, 800, 0)], 0, 800 * MS, None);
        assert!(v.is_wait(2 * MS, 800 * MS, Some(670 * MS)), "{v:?}");
    }

    #[test]
    fn an_io_thread_waiting_for_a_cpu_still_holds_the_main_thread() {
        // The io thread was runnable for 9 of the 10 ms before its first call.
        let v = sweep(&[c(30, 31, 29)], 0, 31 * MS, None);
        assert!(v.is_wait(2 * MS, 31 * MS, Some(0)), "{v:?}");
        assert_eq!(v.runnable, 29 * MS);
        // Without the scheduler's word the same hole is the main thread's.
        let mut x = c(30, 31, 29);
        x.sched = false;
        assert!(!sweep(&[x], 0, 31 * MS, None).is_wait(2 * MS, 31 * MS, Some(0)));
        // An I/O thread that spun on a CPU through the hole had nothing to do: the hole is
        // the main thread's (a command), whatever it also waited for a CPU.
        let mut x = c(30, 31, 20);
        x.on_cpu_before = 25 * MS;
        assert!(!sweep(&[x], 0, 31 * MS, None).is_wait(2 * MS, 31 * MS, Some(0)));
        // Woken for the hand-off, it waited for a CPU about as long as it ran: a wait.
        let mut x = c(10, 11, 4);
        x.on_cpu_before = 3 * MS;
        assert!(sweep(&[x], 4 * MS, 11 * MS, None).is_wait(2 * MS, 7 * MS, Some(0)));
    }
}
