//! I/O-thread waits: whether a gap of the main thread was its wait for its I/O threads.
//! redis 6/7 hands the clients' reads and writes to `io_thd_N` every event-loop turn and
//! busy-waits until they are done; valkey 8/9 posts read, write and even `epoll_wait` jobs
//! and spins in user space until they finish. Either way the main thread makes no syscall
//! while its I/O threads work, which looks like a slow command. This unit keeps the recent
//! client I/O (and event-loop waits) of the other threads of each process, and for a gap
//! says how much of it those threads covered: a gap they covered from end to end, with no
//! stretch of the threshold's length that no I/O thread explains, was a wait for them.
//! redis 8's I/O threads run their own event loops and hand clients over through an
//! eventfd: its main thread waits in its `epoll_wait` (idle), and waits for them only when
//! it pauses them (clientsCron, every 100 ms, and wherever it touches their clients): it
//! pokes the I/O thread's eventfd and spins until the thread has finished the work in hand
//! and parked. Such a thread is busy whenever it is not blocked in its own loop's wait, so
//! its calls cover a gap from the end of its previous call (`OwnLoops`).
//!
//! Without the scheduler's split (strace offline) the trace still shows the hand-off: the
//! main thread's own share of a batch of reads or writes, then the I/O thread's share of
//! the same kind (nothing of the main thread's runs between the two in redis 6/7, so the
//! stretch before their share is their start, not a command); the main thread's futex wake
//! and the woken I/O thread's return (it waited for a CPU between); I/O work that ended just
//! as the gap began (the I/O threads spin for the next hand-off on a CPU the main thread
//! then waits for). Calls printed after the gap's end that began before it (strace's
//! `<unfinished ...>`, a hand-off wait woken in the gap) are added to it when they come.

use super::call::{Facts, PerThread, ResolvedCall, ThreadIdx};
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
    /// Of a thread with an event loop of its own (redis 8): the span is its busy time.
    own: bool,
    /// Where its thread's previous call ended (`Nanos::MIN`: not seen): the stretch its
    /// `runnable_before` and `on_cpu_before` were measured over is from there to its start.
    prev_end: Nanos,
    /// That previous call was a client read or write of the same kind as this one: the two
    /// are of one share of a batch, and the thread had work in hand between them.
    same_share: bool,
    /// Of `runnable_before`, the time a tracer that stops every call (ptrace) held the
    /// thread at this call's entry (`IoHelpers::tracer_stops`).
    held_before: Nanos,
}

impl HelperCall {
    /// Its thread spent the `hole` before it waiting for a CPU, by the scheduler's split: at
    /// least half of it, and no less than it ran on one (an idle I/O thread spins on a CPU).
    fn waited_through(&self, hole: Nanos) -> bool {
        self.sched && self.runnable_before * 2 >= hole && self.runnable_before >= self.on_cpu_before
    }

    /// Its thread had work in hand since its previous call and waited for a CPU: a thread
    /// with work makes its next call as soon as it has a CPU, so it spent no more of the
    /// stretch on one than the counter's lag (on-CPU time is updated at ticks: a tick at
    /// most) and waited for one through most of it (`waited_through`). An idle I/O thread
    /// spins whenever it has a CPU (redis 6/7, valkey): on a host short of CPUs it waits for
    /// one most of the time too, but runs its share (live valkey 9 beside three CPU hogs:
    /// 365 ms on a CPU and 562 ms waiting for one between a turn's replies and the next
    /// reply, an EVAL's, while the main thread ran the script).
    fn waited_with_work(&self, hole: Nanos) -> bool {
        self.on_cpu_before <= SCHED_TICK && self.waited_through(hole)
    }

    /// A client read or write its thread came to with work in hand through the stretch
    /// since its previous call (`waited_with_work`): the start of that stretch, when so.
    fn starved_since(&self) -> Option<Nanos> {
        (self.dir != Dir::Other
            && self.prev_end > Nanos::MIN
            && self.waited_with_work(self.start - self.prev_end))
        .then_some(self.prev_end)
    }
}

/// An I/O thread's last call: where it ended and what it did.
#[derive(Clone, Copy, Default)]
struct LastCall {
    end: Option<Nanos>,
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
    /// Each call with the latest end of any call pushed up to it: the calls come in the
    /// order their lines (or records) do, and one may end long before those pushed ahead of
    /// it (an own-loop thread's busy time before a long wait, known when the wait returns),
    /// so the scan back for a gap stops by that latest end, which never decreases.
    ring: VecDeque<(Nanos, HelperCall)>,
    main: MainSide,
}

/// How long a runnable thread may wait for a CPU on a host with more runnable threads than
/// CPUs before the scheduler preempts one for it: a tick at HZ=100, the longest a kernel
/// ticks. A main thread that spins while its I/O threads compete with it (and with the
/// clients and the tracer) for too few CPUs loses about that much after every hand-off: a
/// stretch of the gap this short is read as scheduling, not as a command of its own.
pub(crate) const SCHED_TICK: Nanos = 10_000_000;

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
    /// Of the gap, the time the I/O threads waited for a CPU (live backends).
    pub(crate) runnable: Nanos,
    /// The scheduler measured every one of those calls.
    pub(crate) sched: bool,
    /// From the gap's start to the I/O threads' first call, when the main thread had just
    /// done its own share of the same batch (reads, or writes): their late start.
    pub(crate) late_start: Nanos,
    /// I/O-thread work ended as the gap began (`ADJOIN`).
    pub(crate) adjoining: bool,
    /// Some of them were of I/O threads with event loops of their own (redis 8): the main
    /// thread waited for them in a pause, not in a hand-off of every loop turn.
    pub(crate) own_loop: bool,
    /// Of the gap, the holes between their calls counted as their wait for a CPU (`sweep`).
    pub(crate) starved_holes: Nanos,
    /// Of the `tail`, what their next call (past the gap's end) says they spent waiting for
    /// a CPU, when that was most of the time since their last call (`finish_starved`).
    pub(crate) starved_after: Nanos,
    /// Of `starved_holes`, the holes between two calls of one I/O thread's share of a batch
    /// (two reads, or two writes, nothing of its own between): it lost its CPU with work in
    /// hand, which the main thread could not go on without.
    pub(crate) starved_mid_share: Nanos,
    /// No call of theirs in the gap, but one had work in hand through it and waited for a
    /// CPU: their next call past it, a client read or write, came after a stretch that began
    /// before the gap and that the thread spent mostly waiting for a CPU (valkey's main
    /// thread spins in its event loop while the jobs it posted wait). Of the gap, that wait.
    pub(crate) starved_through: Nanos,
    /// Of `runnable`, the time a tracer that stops every call held them (ptrace).
    pub(crate) held: Nanos,
    /// Of the `tail`, the stretch at its end after every request read had been answered
    /// (`Through::answered_from`): no command ran there, so it is not the main thread's own
    /// time a command could take.
    pub(crate) answered: Nanos,
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
        let tail = self.tail - self.spun_for(gap, main_runnable).max(self.answered);
        if self.calls == 0 {
            // Nothing of theirs in it, but their work ended as it began (the main thread
            // lost the CPU right after the hand-off, or spun for them while they waited for
            // one), or they had work in hand through it and waited for a CPU
            // (`starved_through`): the main thread's own time in it (the tail is the whole
            // gap then) no longer than scheduling explains.
            return (self.adjoining || self.starved_through > 0)
                && tail < own + main_runnable.unwrap_or(0);
        }
        // A hole between their calls is held to the same bound as the tail, the two
        // together: the main thread's wait for a CPU may lie in either, and a stretch
        // without their calls no longer than that wait and a tick is no command of its own
        // (valkey under a GET load on 2 CPUs, bpf: its I/O thread spun idle on a CPU 5.9 ms
        // of a 10.1 ms hole while the main thread waited 6.1 ms of its 13.6 ms gap for a
        // CPU; over half the gap, the hole was "a slow command, on a CPU"). Not when that
        // wait is half the gap or more: then the missing CPU is the cause, not the I/O
        // threads (ptrace under load: 674 ms of a 696 ms gap waiting for a CPU, a 648 ms
        // hole; `cpu-starvation`).
        let hole_ok = self.longest_hole < own.max(gap / 2)
            || main_runnable.is_some_and(|r| r * 2 < gap && self.longest_hole + tail < own + r);
        tail < tail_max
            && hole_ok
            && !self.own_loop_starved(gap, main_runnable)
            && !self.both_starved(gap, main_runnable)
    }

    /// redis 8's main thread spins for its I/O threads only in a pause, on a CPU: one that
    /// waited for a CPU through half the gap or more was starved, whatever its I/O threads
    /// did meanwhile (the scheduler's split says so: CPU starvation).
    fn own_loop_starved(&self, gap: Nanos, main_runnable: Option<Nanos>) -> bool {
        self.own_loop && main_runnable.is_some_and(|r| r * 2 >= gap)
    }

    /// The gap rests on holes the I/O threads spent waiting for a CPU while the main thread
    /// itself waited for one through half of it or more. An idle I/O thread spins for the
    /// next hand-off (redis 6/7, valkey) and, on a host that short of CPUs, waits for one
    /// most of that time too, so its wait says no more than the main thread's does: what
    /// held the main thread was the CPU (live valkey 9 under bpf on a load of 11: an EVAL's
    /// 807 ms gap, 130 ms on a CPU and 674 ms waiting for one, its I/O thread's one call
    /// at the end, was "waited for its I/O threads"). The gap rests on those holes only when
    /// they are a good part of it (a quarter: 48-100% in the starved gaps of that valkey
    /// recording): an I/O thread that waited microseconds for a CPU between two of its calls
    /// says nothing of the gap (live redis 7 at load 4: such gaps, the main thread spinning
    /// a tick and preempted a tick while its I/O thread wrote, were called slow commands).
    /// Holes in the middle of an I/O thread's share (`starved_mid_share`) say more: it had
    /// work in hand the main thread spins for, whatever the main thread's own wait for a
    /// CPU (live redis 7 under bpf beside three CPU hogs on 2 CPUs: the I/O thread wrote 13
    /// replies, waited 5.3 ms for a CPU, wrote 11 more; the main thread waited 4.9 of the
    /// gap's 9.6 ms for a CPU, and the gap was "a slow command").
    fn both_starved(&self, gap: Nanos, main_runnable: Option<Nanos>) -> bool {
        // A hole the tracer held them through (`held`) is no sign of a host short of CPUs.
        (self.starved_holes - self.starved_mid_share - self.held).max(0) * 4 >= gap
            && main_runnable.is_some_and(|r| r * 2 >= gap)
    }

    /// The stretch after the I/O threads' last call in the gap (`tail`), when that call
    /// was a reply's write and their next call (`after`, past the gap's end) says the thread
    /// waited for a CPU through most of it, by the same rule as a hole between their calls.
    /// After the replies of a turn the main thread runs no command (redis 6/7 and valkey run
    /// a turn's commands between its reads and its writes) but waits for the writes to be
    /// done, then for the next events; after a read it runs the commands read, and a long
    /// tail there is a command (valkey's EVAL under bpf on a starved host: its idle I/O
    /// thread waited for a CPU 172 of the EVAL's 299 ms). Known once that call comes
    /// (`IoHelpers::on_call` says from where it covers, and the gap is covered again).
    fn finish_starved(&mut self, after: HelperCall, to: Nanos) {
        let until = to - self.tail;
        let hole = after.start - until;
        if self.tail > 0 && after.waited_through(hole) {
            self.starved_after = after.runnable_before.min(self.tail);
        }
    }

    /// Of the tail, the part the main thread spun on a CPU for an I/O thread that waited for
    /// one (`starved_after`): their share of the hand-off was not finished (redis 7 live under
    /// bpf: the I/O thread preempted right at the hand-off, runnable 14.3 ms, while the main
    /// thread spun 12.5 ms on a CPU for it, "a slow command" before). Only when the main
    /// thread was on a CPU through most of the gap: a main thread that itself waited for
    /// one keeps the tail as its own (an idle I/O thread spinning for the next hand-off
    /// waits for a CPU too on such a host, whatever the main thread does).
    pub(crate) fn spun_for(&self, gap: Nanos, main_runnable: Option<Nanos>) -> Nanos {
        if main_runnable.is_some_and(|r| r * 2 < gap) {
            self.starved_after
        } else {
            0
        }
    }

    /// The longest stretch of the gap the main thread had to itself (the tail less what it
    /// spun for them, `spun_for`).
    pub(crate) fn longest_own(&self, spun_for: Nanos) -> Nanos {
        self.longest_hole
            .max(self.tail - spun_for.max(self.answered))
    }
}

#[derive(Default)]
pub(crate) struct IoHelpers {
    /// Per process with I/O threads (a handful at most: the traced one and its children).
    procs: Vec<Proc>,
    /// redis 8's I/O threads, which wait in event loops of their own.
    own: OwnLoops,
    /// Each other thread's last call (`HelperCall::prev_end`, `same_share`).
    last: PerThread<LastCall>,
    /// The tracer stops every call (ptrace): time an I/O thread spent neither on a CPU nor
    /// waiting for one before a call, with no call between, was the tracer holding it at
    /// that call's entry (`HelperCall::held_before`).
    pub(crate) tracer_stops: bool,
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

    /// Processes whose main thread's event-loop wait an I/O thread made (`OwnLoops::shared`).
    pub(crate) fn polls_shared(&self) -> &[ProcKey] {
        &self.own.shared
    }

    /// Whether the thread is an I/O thread seen waiting in an event loop of its own (redis
    /// 8), so far.
    #[inline]
    pub(crate) fn own_loop(&self, t: ThreadIdx) -> bool {
        self.own.threads.get(t).is_some_and(|o| o.own)
    }

    /// Notes a call when it is an I/O thread's (the start it covers from is returned, for
    /// gaps that ended before its line came), or the main thread's side of a hand-off.
    #[inline]
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>) -> Option<Nanos> {
        if !cx.timed {
            return None;
        }
        let mut own = [None; 2];
        if self.own.on_call(cx, &mut own) {
            let mut start = None;
            for c in own.into_iter().flatten() {
                start = Some(start.map_or(c.start, |s: Nanos| s.min(c.start)));
                self.push(cx.proc, c);
            }
            return start;
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
        let dir = Dir::of(cx);
        let prev = self.note_last(cx, dir);
        let before = sched.and_then(|s| s.before);
        let on_cpu_before = before.map_or(0, |b| b.on_cpu_ns as Nanos);
        let runnable = before.map_or(0, |b| b.runnable_ns as Nanos);
        let held_before = match (self.tracer_stops, prev.end, before) {
            // Neither on a CPU nor waiting for one since its last call, with no call
            // between: under ptrace, stopped at this call's entry until the tracer let it go.
            (true, Some(e), Some(_)) => (cx.ts() - e - on_cpu_before - runnable).max(0),
            _ => 0,
        };
        let call = HelperCall {
            start,
            end: cx.end,
            // A thread the tracer holds cannot run any more than one waiting for a CPU:
            // the rules read both as its wait.
            runnable_before: runnable + held_before,
            runnable_during: sched.map_or(0, |s| s.during.runnable_ns as Nanos),
            on_cpu_before,
            sched: before.is_some(),
            dir,
            own: false,
            prev_end: prev.end.unwrap_or(Nanos::MIN),
            same_share: dir != Dir::Other && prev.dir == dir,
            held_before,
        };
        self.push(cx.proc, call);
        // Its wait for a CPU before it may have been the end of a gap (`finish_starved`),
        // and work in hand it waited for a CPU with may have spanned gaps (`starved_through`).
        Some(call.starved_since().unwrap_or(start - call.runnable_before))
    }

    /// Notes a call of a thread other than the main one as its last; returns the one before.
    fn note_last(&mut self, cx: &ResolvedCall<'_>, dir: Dir) -> LastCall {
        let last = self.last.at(cx.thread);
        let prev = *last;
        *last = LastCall {
            end: Some(cx.end),
            dir,
        };
        prev
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
        let prev = self.note_last(cx, Dir::Other);
        let call = HelperCall {
            start,
            end: cx.end,
            runnable_before: before.map_or(0, |b| b.runnable_ns as Nanos),
            runnable_during: woken_wait,
            on_cpu_before: before.map_or(0, |b| b.on_cpu_ns as Nanos),
            sched: before.is_some(),
            dir: Dir::Other,
            own: false,
            prev_end: prev.end.unwrap_or(Nanos::MIN),
            same_share: false,
            held_before: 0,
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
        let latest = ring.back().map_or(call.end, |(l, _)| call.end.max(*l));
        ring.push_back((latest, call));
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
        // The first call after the gap whose measured wait for a CPU reaches back into it,
        // and the last one ending in it or as it began (end, kind).
        let mut after: Option<HelperCall> = None;
        // The first call past the gap that had work in hand through all of it, waiting for
        // a CPU (`IoCover::starved_through`).
        let mut through: Option<HelperCall> = None;
        let mut last = (Nanos::MIN, Dir::Other);
        let mut inside: Vec<HelperCall> = p
            .ring
            .iter()
            .rev()
            .take_while(|(latest, _)| *latest > from - (to - from).max(ADJOIN))
            .map(|(_, c)| c)
            .filter(|c| {
                adjoining |= c.end <= from && c.end > from - ADJOIN && c.dir != Dir::Other;
                let first = |a: Option<HelperCall>| {
                    Some(a.map_or(**c, |a| if c.start < a.start { **c } else { a }))
                };
                if c.start >= to && c.sched && c.start - c.runnable_before < to {
                    after = first(after);
                }
                if c.start >= to && c.starved_since().is_some_and(|s| s <= from) {
                    through = first(through);
                }
                if c.end <= to && c.end > from - ADJOIN && c.end > last.0 {
                    last = (c.end, c.dir);
                }
                c.end > from && c.start < to
            })
            .copied()
            .collect();
        if inside.is_empty() && !adjoining && through.is_none() {
            return None;
        }
        inside.sort_unstable_by_key(|c| c.start);
        let mut v = sweep(&inside, from, to, share);
        if let Some(t) = through.filter(|_| inside.is_empty()) {
            // Measured by that call's split, though none of theirs was in the gap.
            v.starved_through = t.runnable_before.min(to - from);
            (v.runnable, v.sched) = (v.starved_through, true);
        }
        if let Some(a) = after.filter(|_| last.1 == Dir::Write) {
            v.finish_starved(a, to);
        }
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
            if c.waited_through(hole) {
                cover.runnable += c.runnable_before.min(hole);
                cover.held += c.held_before.min(hole);
                cover.starved_holes += hole;
                if c.same_share && c.prev_end > from - ADJOIN && c.waited_with_work(hole) {
                    cover.starved_mid_share += hole;
                }
            } else {
                cover.longest_hole = cover.longest_hole.max(hole);
            }
        }
        // Of its wait for a CPU during the call, at most the part inside the gap: a call
        // begun before it or ended after it waited partly outside ("24 ms of the 17 ms").
        let inside = (c.end.min(to) - c.start.max(from)).max(0);
        cover.runnable += c.runnable_during.min(inside);
        cover.sched &= c.sched;
        cover.own_loop |= c.own;
        cover.calls += 1;
        until = until.max(c.end.min(to));
    }
    cover.tail = to - until;
    cover.runnable = cover.runnable.min(to - from);
    // Measured only of their calls: none, nothing measured.
    cover.sched &= cover.calls > 0;
    cover
}

/// redis 8's I/O threads: each waits in an epoll fd of its own (not its main thread's), and
/// is busy whenever it is not blocked there: reading, parsing, writing, handing clients over,
/// or parked in a pause its main thread spins for. Its time between two calls is that work
/// (redis 6/7's and valkey's I/O threads spin idle between calls instead), and its loop's
/// wait is no one's, up to its wake.
#[derive(Default)]
struct OwnLoops {
    /// Per process, the epoll fd its main thread waits in.
    main_epfd: Vec<(ProcKey, i32)>,
    threads: PerThread<OwnLoopThread>,
    /// Processes an I/O thread of which waited in the main thread's epoll fd: valkey's
    /// offloaded poll, where the main thread makes no event-loop call of its own.
    shared: Vec<ProcKey>,
}

#[derive(Clone, Copy, Default)]
struct OwnLoopThread {
    /// It waited in an epoll fd other than its main thread's.
    own: bool,
    /// Where its last call ended.
    last_end: Option<Nanos>,
}

impl OwnLoops {
    /// Notes a call; true when it was an own-loop I/O thread's, with the spans it covers in
    /// `out`: its busy time since its last call (up to a loop wait's start, or through any
    /// other call), and a loop wait's wake (its wait for a CPU after it, by the scheduler's
    /// split; without it, the wait's return, a point).
    fn on_call(&mut self, cx: &ResolvedCall<'_>, out: &mut [Option<HelperCall>; 2]) -> bool {
        let epoll = cx.facts.has(Facts::EPOLL);
        if epoll && cx.role == Role::Main {
            if let Some(fd) = cx.call_fd {
                match self.main_epfd.iter_mut().find(|(p, _)| *p == cx.proc) {
                    Some(m) => m.1 = fd,
                    None => self.main_epfd.push((cx.proc, fd)),
                }
            }
            return false;
        }
        if cx.role != Role::IoThread {
            return false;
        }
        let main = self
            .main_epfd
            .iter()
            .find(|(p, _)| *p == cx.proc)
            .map(|m| m.1);
        let t = self.threads.at(cx.thread);
        if epoll && !t.own {
            let same = cx.call_fd.zip(main).map(|(fd, m)| fd == m);
            t.own = same == Some(false);
            if same == Some(true) && !self.shared.contains(&cx.proc) {
                self.shared.push(cx.proc);
            }
        }
        if !t.own {
            return false;
        }
        let ts = cx.ts();
        let from = t.last_end.map_or(ts, |e| e.min(ts));
        t.last_end = Some(cx.end);
        let sched = cx.sc.sched.as_deref();
        let before = sched
            .and_then(|s| s.before)
            .map_or(0, |b| b.runnable_ns as Nanos);
        let during = sched.map_or(0, |s| s.during.runnable_ns as Nanos);
        let span = |start: Nanos, end: Nanos, runnable: Nanos| HelperCall {
            start,
            end,
            runnable_before: 0,
            runnable_during: runnable,
            on_cpu_before: 0,
            sched: sched.is_some_and(|s| s.before.is_some()),
            // Not a share of a hand-off batch, and no spin for the next one after it: such
            // a thread blocks in its own loop (no late start, no adjoining work).
            dir: Dir::Other,
            own: true,
            prev_end: Nanos::MIN,
            same_share: false,
            held_before: 0,
        };
        if epoll {
            out[0] = (ts > from).then(|| span(from, ts, before));
            out[1] = Some(span((cx.end - during).max(ts), cx.end, during));
        } else {
            out[0] = Some(span(from, cx.end, before + during));
        }
        true
    }
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
            own: false,
            prev_end: Nanos::MIN,
            same_share: false,
            held_before: 0,
        }
    }

    #[test]
    fn a_gap_covered_by_io_thread_work_is_a_wait_for_it() {
        // 10 ms gap, the io thread reading and writing all through it.
        let v = sweep(&[c(0, 3, 0), c(3, 6, 0), c(7, 10, 0)], 0, 10 * MS, None);
        assert!(v.is_wait(2 * MS, 10 * MS, Some(0)), "{v:?}");
        assert_eq!(v.tail, 0);
    }

    /// A hole where the I/O thread spun idle on a CPU is no wait for it, but the main
    /// thread's own time in it is bounded by its wait for a CPU, as the tail's is (numbers
    /// of a valkey 9 bpf recording under a GET load: a 13.6 ms gap, a 10.1 ms hole of
    /// which the I/O thread ran 5.9 ms, the main thread waiting 6.1 ms for a CPU).
    #[test]
    fn a_hole_no_longer_than_the_main_threads_cpu_wait_and_a_tick_is_a_wait() {
        let us = |n: i64| n * 1000;
        let mut spun = c(0, 0, 0);
        (spun.start, spun.end, spun.runnable_before) = (us(13_550), us(13_560), us(4_350));
        let v = sweep(&[c(0, 3, 0), spun], 0, us(13_600), None);
        assert_eq!((v.longest_hole, v.tail), (us(10_550), us(40)));
        assert!(v.is_wait(2 * MS, us(13_600), Some(us(6_100))), "{v:?}");
        // Longer than that wait and a tick: the main thread's own (a command, maybe).
        assert!(!v.is_wait(2 * MS, us(13_600), Some(us(500))), "{v:?}");
        // Without the scheduler's split, over half the gap and a tick.
        assert!(!v.is_wait(2 * MS, us(13_600), None), "{v:?}");
        // The main thread waiting for a CPU through half of it: starved, not the I/O threads.
        assert!(!v.is_wait(2 * MS, us(13_600), Some(us(6_800))), "{v:?}");
    }

    #[test]
    fn a_slow_command_between_hand_offs_is_not() {
        // The read handed off at the start, a 500 ms script, the write at the end: the
        // hole between is the main thread's own.
        let v = sweep(&[c(0, 1, 0), c(500, 501, 0)], 0, 501 * MS, None);
        assert!(!v.is_wait(2 * MS, 501 * MS, Some(0)), "{v:?}");
        assert_eq!(v.longest_own(0), 499 * MS);
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

    /// A call of `tid` (1: the main thread, others I/O threads) on `fd`, `ts`/`dur` in µs.
    fn ev(tid: u32, ts_us: i64, dur_us: i64, name: &'static str, fd: i32) -> crate::event::Event {
        let mut e = crate::analyze::call::testing::event(tid, ts_us * 1000, dur_us * 1000, name);
        if let crate::event::EventKind::Syscall(sc) = &mut e.kind {
            sc.fd = Some(fd);
        }
        e
    }

    /// Feeds the calls, in order, to the helpers: tid 1 is the main thread.
    fn helpers(calls: &[(u32, i64, i64, &'static str, i32)]) -> IoHelpers {
        use crate::fdtable::FileClass as C;
        let mut h = IoHelpers::default();
        for &(tid, ts, dur, name, fd) in calls {
            let e = ev(tid, ts, dur, name, fd);
            let role = if tid == 1 { Role::Main } else { Role::IoThread };
            let class = match fd {
                7 | 13 => C::Epoll,
                14 | 15 => C::AnonInode,
                _ => C::Client,
            };
            h.on_call(&crate::analyze::call::testing::call(&e, role, Some(class)));
        }
        h
    }

    /// redis 8 (fixtures/io-threads/redis8-io2): the main thread pokes its I/O thread's
    /// eventfd (14) for a pause and spins; the I/O thread finishes its reads, then makes no
    /// call until it has parked and been resumed (48 ms on a host short of CPUs), hands its
    /// clients over (15) and goes back to its own `epoll_wait` (13). Its time between calls
    /// was work the main thread waited for: the gap is a wait, where the hole between its
    /// calls (redis 6/7's reading: an idle spin) made it the main thread's own before.
    #[test]
    fn a_redis8_pause_is_a_wait_for_the_own_loop_io_thread() {
        let h = helpers(&[
            (1, 0, 1000, "epoll_wait", 7),
            (2, 0, 1000, "epoll_wait", 13),
            (1, 1990, 10, "write", 14),
            (2, 3000, 10, "read", 20),
            (2, 5000, 10, "read", 21),
            (2, 7000, 10, "read", 22),
            (2, 55000, 10, "write", 15),
            (2, 56000, 44000, "epoll_wait", 13),
        ]);
        let v = h
            .cover(ProcKey::Root, 2 * MS, 60 * MS, None)
            .expect("a cover");
        assert!(v.own_loop, "{v:?}");
        assert!(v.is_wait(2 * MS, 58 * MS, None), "{v:?}");
        assert_eq!(v.tail, 4 * MS);
        // With the scheduler's split: spinning on a CPU is the pause; a main thread that
        // waited for a CPU through most of the gap was starved (redis8-io2-bpf: 109 of 122 ms).
        assert!(v.is_wait(2 * MS, 58 * MS, Some(5 * MS)), "{v:?}");
        assert!(!v.is_wait(2 * MS, 58 * MS, Some(50 * MS)), "{v:?}");
        // Its loop is its own: the main thread's event-loop wait is not shared.
        assert!(h.polls_shared().is_empty());
        // valkey's I/O thread waits in the main thread's epoll fd (its offloaded poll).
        let valkey = helpers(&[(1, 0, 1000, "epoll_wait", 7), (2, 0, 10, "epoll_wait", 7)]);
        assert_eq!(valkey.polls_shared(), &[ProcKey::Root]);
        // The same calls of a thread that waits in its main thread's epoll fd (valkey's
        // offloaded poll) keep the idle-spin reading: the 48 ms hole is the main thread's.
        let h = helpers(&[
            (1, 0, 1000, "epoll_wait", 7),
            (2, 0, 1000, "epoll_wait", 7),
            (1, 1990, 10, "write", 14),
            (2, 3000, 10, "read", 20),
            (2, 5000, 10, "read", 21),
            (2, 7000, 10, "read", 22),
            (2, 55000, 10, "write", 15),
        ]);
        let v = h
            .cover(ProcKey::Root, 2 * MS, 60 * MS, None)
            .expect("a cover");
        assert!(!v.own_loop);
        assert!(!v.is_wait(2 * MS, 58 * MS, None), "{v:?}");
    }

    /// redis 8 running an EVAL: its I/O thread read the request, handed it over and sleeps
    /// in its own loop until the reply; the main thread's gap is its own, a slow command.
    #[test]
    fn a_slow_command_while_the_own_loop_io_thread_sleeps_in_its_loop_is_not() {
        let h = helpers(&[
            (1, 0, 1000, "epoll_wait", 7),
            (2, 0, 1000, "epoll_wait", 13),
            (2, 1000, 10, "read", 20),
            (2, 1100, 10, "write", 15),
            (2, 1200, 898_800, "epoll_wait", 13),
            (1, 1000, 150, "epoll_wait", 7),
            (1, 1190, 10, "read", 15),
        ]);
        let v = h
            .cover(ProcKey::Root, 1200, 850 * MS, None)
            .expect("a cover");
        assert!(v.own_loop);
        assert!(!v.is_wait(2 * MS, 850 * MS - 1200, None), "{v:?}");
        assert!(v.longest_own(0) > 840 * MS, "{v:?}");
    }

    /// redis8-io4 (the gap at its line 13240): io_thd_3 read a client through the main
    /// thread's 11.6 ms gap; io_thd_1's wait of 46 ms returned after it, and its busy time
    /// before that wait, pushed then, ended long before the gap. The scan back for the gap
    /// went on past it (it stopped there, and the gap was "a slow command").
    #[test]
    fn a_call_pushed_behind_one_that_ended_long_before_still_covers_its_gap() {
        let h = helpers(&[
            (1, 0, 1000, "epoll_wait", 7),
            (2, 0, 1000, "epoll_wait", 13),
            (3, 0, 1000, "epoll_wait", 13),
            (3, 1500, 10, "read", 21),
            (1, 29_990, 10, "read", 15),
            (2, 30_000, 11_500, "read", 20),
            (3, 1600, 46_000, "epoll_wait", 13),
        ]);
        let v = h
            .cover(ProcKey::Root, 30 * MS, 41_600_000, None)
            .expect("a cover");
        assert!(v.is_wait(2 * MS, 11_600_000, None), "{v:?}");
        assert_eq!(v.tail, 100_000);
    }

    /// valkey 9 live under ptrace (a full-split recording, its line 363): the main thread's
    /// 39 ms gap, 24.5 ms on a CPU, spinning for its I/O thread's writes; the I/O thread's
    /// last call (its offloaded poll) had ended 9 ms before the gap, its next one, the first
    /// write, came 38.8 ms into it, after 3.8 ms on a CPU, 8.0 ms waiting for one, and 36 ms
    /// neither: held at that write's entry stop by the tracer. "A slow command (GET), on a
    /// CPU" before; the tracer's hold read as its wait, it is the main thread waiting for it.
    #[test]
    fn an_io_thread_held_at_a_stop_by_the_tracer_is_waited_for() {
        use crate::event::{SchedDelta, SchedSpan};
        let us = |n: i64| n * 1000;
        let feed = |stops: bool| {
            let mut h = IoHelpers {
                tracer_stops: stops,
                ..Default::default()
            };
            for (tid, ts, dur, name, fd, before) in [
                (1, 0, 10, "epoll_wait", 7, None),
                (2, -9_076, 1, "epoll_wait", 7, None),
                (2, 38_782, 10, "write", 9, Some((3_826, 8_002))),
                (2, 38_900, 10, "write", 11, Some((6, 0))),
            ] {
                let mut e = ev(tid, ts, dur, name, fd);
                if let (crate::event::EventKind::Syscall(sc), Some((on, run))) =
                    (&mut e.kind, before)
                {
                    sc.sched = Some(Box::new(SchedSpan {
                        during: SchedDelta::default(),
                        before: Some(SchedDelta {
                            on_cpu_ns: on * 1000,
                            runnable_ns: run * 1000,
                            ..Default::default()
                        }),
                    }));
                }
                let role = if tid == 1 { Role::Main } else { Role::IoThread };
                let class = if fd == 7 {
                    FileClass::Epoll
                } else {
                    FileClass::Client
                };
                h.on_call(&crate::analyze::call::testing::call(&e, role, Some(class)));
            }
            h.cover(ProcKey::Root, us(10), us(39_009), None)
                .expect("a cover")
        };
        let (gap, main_runnable) = (us(38_999), Some(us(8_053)));
        let held = feed(true);
        assert!(held.is_wait(2 * MS, gap, main_runnable), "{held:?}");
        assert!(held.held > us(26_000), "{held:?}");
        // Without a tracer that stops calls, that time is not its wait: the hole is the
        // main thread's own.
        let free = feed(false);
        assert!(!free.is_wait(2 * MS, gap, main_runnable), "{free:?}");
        assert_eq!(free.held, 0);
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

    /// valkey9-io2-bpf: the I/O thread's futex wait, woken inside a 5.6 ms gap, waited
    /// for a CPU 7.6 ms from its wake, past the gap's end; the cause quoted all of it ("the
    /// I/O threads waited for a CPU 7.6 ms of it"). Only the part inside the gap counts.
    #[test]
    fn the_io_threads_wait_for_a_cpu_is_clipped_to_the_gap() {
        let mut x = c(1, 9, 0);
        x.runnable_during = 8 * MS;
        let v = sweep(&[x], 0, 5 * MS, None);
        assert_eq!(v.runnable, 4 * MS, "{v:?}");
        let mut y = c(0, 1, 0);
        y.runnable_during = MS;
        let v = sweep(&[y, x], 0, 5 * MS, None);
        assert!(v.runnable <= 5 * MS, "{v:?}");
    }

    #[test]
    fn a_few_microseconds_of_cpu_wait_between_io_calls_are_no_starved_host() {
        // redis 7 live under bpf at load 4: the main thread wrote its share and spun 4 ms on
        // a CPU, lost it for 4 ms (a tick each way); the I/O thread began its share 5.2 ms
        // in and waited 16 µs for a CPU between two of its writes. That is a wait for the
        // I/O thread, not a host so short of CPUs that both waited on it (it was called a
        // slow command: the 16 µs made the gap "rest on" starved holes).
        let us = |n: i64| n * 1000;
        let mut first = c(0, 0, 0);
        (first.start, first.end, first.dir) = (us(5192), us(5225), Dir::Write);
        let mut second = first;
        (second.start, second.end) = (us(5235), us(5240));
        second.runnable_before = us(16);
        let v = sweep(&[first, second], 0, us(7912), Some(Dir::Write));
        assert_eq!(v.late_start, us(5192));
        assert!(v.is_wait(2 * MS, us(7912), Some(us(4005))), "{v:?}");
    }

    #[test]
    fn a_main_thread_spinning_for_an_io_thread_that_lost_its_cpu_waits_for_it() {
        // redis 7 live under bpf: the I/O thread's last write 8 µs before the gap, then no
        // call for 14.3 ms while the main thread spun 12.5 ms on a CPU; its next call, after
        // the gap, says it waited for a CPU 14.29 ms of that.
        let us = |n: i64| n * 1000;
        let mut last = c(0, 0, 0);
        (last.start, last.end, last.dir) = (us(5), us(10), Dir::Write);
        let mut next = c(0, 0, 0);
        (next.start, next.end, next.runnable_before) = (us(14_425), us(14_430), us(14_290));
        let gap = us(14_319);
        let mut v = sweep(&[last], us(10), us(10) + gap, None);
        assert!(
            !v.is_wait(2 * MS, gap, Some(us(1_776))),
            "before its next call: {v:?}"
        );
        v.finish_starved(next, us(10) + gap);
        assert!(v.is_wait(2 * MS, gap, Some(us(1_776))), "{v:?}");
        assert!(v.longest_own(v.spun_for(gap, Some(us(1_776)))) < us(100));
        // An idle I/O thread that spun on a CPU for the next hand-off says nothing of it.
        let mut idle = next;
        idle.on_cpu_before = us(14_300);
        let mut w = sweep(&[last], us(10), us(10) + gap, None);
        w.finish_starved(idle, us(10) + gap);
        assert!(!w.is_wait(2 * MS, gap, Some(us(1_776))), "{w:?}");
        // Nor does it when the main thread itself waited for a CPU through most of the gap
        // (the tail stays its own; the rule for that is the main thread's own wait).
        assert_eq!(v.spun_for(gap, Some(us(12_000))), 0);
    }

    /// A client write of an I/O thread, `µs` from a gap's start: its thread's previous call
    /// ended at `prev_end`, and it waited `runnable` for a CPU and ran `on_cpu` since.
    fn write(start: i64, end: i64, prev_end: i64, runnable: i64, on_cpu: i64) -> HelperCall {
        let us = |n: i64| n * 1000;
        HelperCall {
            start: us(start),
            end: us(end),
            runnable_before: us(runnable),
            on_cpu_before: us(on_cpu),
            dir: Dir::Write,
            prev_end: us(prev_end),
            same_share: true,
            ..c(0, 0, 0)
        }
    }

    #[test]
    fn an_io_thread_preempted_in_the_middle_of_its_share_is_waited_for() {
        // redis 7 live under bpf beside three CPU hogs on 2 CPUs (bench/RESULTS.md [V41a]):
        // the main thread wrote its share of 25 replies; the I/O thread wrote one before the
        // gap, 11 and 2 in it, waited 5.33 ms for a CPU (none on one), wrote 11 more. The
        // main thread's next call came 9.63 ms after its last, 4.92 ms of them waiting for
        // a CPU: "a slow command (GET), on a CPU" (the hole was read as an idle spin).
        let us = |n: i64| n * 1000;
        let calls = [
            write(93, 271, -91, 183, 0),
            write(282, 299, 271, 0, 0),
            write(5632, 5677, 299, 5329, 0),
        ];
        let (gap, main_runnable) = (us(9630), Some(us(4923)));
        let v = sweep(&calls, 0, gap, Some(Dir::Write));
        assert_eq!(v.starved_mid_share, us(5333));
        assert!(v.is_wait(2 * MS, gap, main_runnable), "{v:?}");
        // The same hole between two shares (a read, then the write) was an idle spin: the
        // host starved both threads.
        let mut idle = calls;
        idle[2].same_share = false;
        let v = sweep(&idle, 0, gap, Some(Dir::Write));
        assert!(!v.is_wait(2 * MS, gap, main_runnable), "{v:?}");
        // An I/O thread that ran 365 ms in the hole had no work in hand: it spun (valkey 9
        // live beside the hogs: a turn's 45 replies, 928.6 ms, the EVAL's reply; the main
        // thread ran the script, 560 of its 951 ms waiting for a CPU).
        let mut eval = [
            write(20466, 22742, 5902, 10952, 3657),
            write(951_334, 951_391, 22742, 562_078, 364_864),
        ];
        // Its call before the first was its event-loop wait (valkey's offloaded poll).
        eval[0].same_share = false;
        let gap = us(951_379);
        let v = sweep(&eval, 0, gap, None);
        assert_eq!(v.starved_mid_share, 0);
        assert!(!v.is_wait(2 * MS, gap, Some(us(559_766))), "{v:?}");
    }

    #[test]
    fn a_main_thread_spinning_while_its_io_thread_waits_with_work_waits_for_it() {
        // valkey 9 live under bpf beside three CPU hogs on 2 CPUs: its event loop's wait
        // returned 50 clients, whose reads it posted to its I/O thread; it made no call for
        // 8.08 ms (3.38 of them waiting for a CPU) up to its cron. The I/O thread's last call
        // had ended 11.75 ms before the gap, its next one (the first of the 50 reads) came
        // 16 ms into it, after 24.7 ms waiting for a CPU and 3.2 on one (a tick's lag).
        let us = |n: i64| n * 1000;
        let mut h = IoHelpers::default();
        let mut read = write(16_014, 16_047, -11_753, 24_686, 3_245);
        (read.dir, read.same_share) = (Dir::Read, false);
        h.push(ProcKey::Root, read);
        let (gap, main_runnable) = (us(8079), Some(us(3377)));
        let v = h.cover(ProcKey::Root, 0, gap, None).expect("a cover");
        assert_eq!((v.calls, v.starved_through, v.runnable), (0, gap, gap));
        assert!(v.sched);
        assert!(v.is_wait(2 * MS, gap, main_runnable), "{v:?}");
        // The main thread's own time in it is what bounds it: a command on a CPU for 300 ms
        // while the I/O thread waited is the command.
        let v = h
            .cover(ProcKey::Root, 0, us(300_000), None)
            .expect("a cover");
        assert!(!v.is_wait(2 * MS, us(300_000), Some(us(12_000))), "{v:?}");
        // A thread that ran through the stretch had no work in hand: nothing covers the gap.
        let mut h = IoHelpers::default();
        read.on_cpu_before = us(20_000);
        h.push(ProcKey::Root, read);
        assert!(h.cover(ProcKey::Root, 0, gap, None).is_none());
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
