//! Stalls: which calls and gaps crossed the threshold. Each call is checked twice: the gap
//! since its thread's previous call ended, and its own duration. Candidates are decided as
//! stalls only at the end, once thread roles are final (`keep`). The store is bounded: past
//! its cap the shortest candidate makes room, and the rest are counted.

use super::call::{is_idle, PerThread, ResolvedCall, ThreadIdx};
use super::commands::Quiet;
use super::io_wait::IoHelpers;
use super::phases::Phases;
use super::roles::Role;
use crate::event::{DurSource, Extra, InFlight, Nanos, Tid};
use crate::fdtable::{FileId, ProcKey};
use crate::report::{Bound, DurationKnown, StallKind};
use crate::syscalls::Facts;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// A stall candidate: decided as a stall at `finish`, once thread roles are known.
#[derive(Clone)]
pub(crate) struct Cand {
    pub(crate) tid: Tid,
    pub(crate) proc: crate::fdtable::ProcKey,
    pub(crate) kind: StallKind,
    pub(crate) syscall: Option<&'static str>,
    pub(crate) fd: Option<i32>,
    pub(crate) file: Option<FileId>,
    pub(crate) start: Nanos,
    pub(crate) dur: Nanos,
    pub(crate) line: Option<u64>,
    pub(crate) dur_facts: DurFacts,
    /// Index of the phase (background child) running when it began.
    pub(crate) phase: Option<usize>,
    /// Events had been lost (live perf backend) when it was found: it may be incomplete.
    pub(crate) events_lost: bool,
    pub(crate) id: u64,
    /// What the scheduler did with the thread over the stall (live backends).
    pub(crate) sched: Option<crate::event::SchedDelta>,
    /// A gap's quiet calls: the thread's own housekeeping it ran through, and what the
    /// process's I/O threads did meanwhile.
    pub(crate) through: Through,
}

/// The futex wake a gap ended in (`Through::woke`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Woke {
    pub(crate) addr: u64,
    /// Another thread of the process waited on that futex through at least the threshold
    /// of the gap, until the wake: someone waited for the gap's work.
    pub(crate) waited: bool,
}

/// The futex of a call that woke a waiter (`futex(addr, FUTEX_WAKE_PRIVATE, 1) = 1`).
fn woke_by(cx: &ResolvedCall<'_>) -> Option<Woke> {
    match cx.sc.extra {
        Extra::Futex { addr, wake: true } if cx.sc.ret.val() > Some(0) => Some(Woke {
            addr,
            waited: false,
        }),
        _ => None,
    }
}

/// Futex waits of at least the threshold, and the gaps that ended in a futex wake, matched
/// in whichever order their lines come (a waiter's `<... futex resumed>` is printed after
/// the wake that ended it): a gap another thread waited through is someone's wait.
#[derive(Default)]
struct FutexWaits {
    /// (process, futex) -> (thread, start, end) of each long wait.
    waits: rustc_hash::FxHashMap<(ProcKey, u64), Vec<FutexWait>>,
    /// How many waits `waits` holds.
    stored: usize,
    /// The last gaps that ended in a wake and that no wait matched yet: (index, id).
    waking: VecDeque<(usize, u64)>,
}

/// One futex wait: (thread, start, end).
type FutexWait = (Tid, Nanos, Nanos);

/// Long futex waits kept (a trace of an idle thread pool has one per wait).
const FUTEX_WAITS_MAX: usize = 1 << 16;
/// Gaps ended by a wake kept for a wait printed after them.
const WAKING_GAPS_MAX: usize = 64;

/// The wait `(thread, start, end)`, on the futex whose wake ended the gap `c`, waited
/// through the gap: another thread's, from before the wake until it, through at least
/// `threshold` of the gap.
fn waited_through(c: &Cand, w: FutexWait, threshold: Nanos) -> bool {
    let wake = c.start + c.dur;
    let (tid, start, end) = w;
    tid != c.tid && start < wake && end >= wake && wake - start.max(c.start) >= threshold
}

/// The quiet calls (`Facts::QUIET`: memory management, futex, time and identity queries) a
/// gap ran through: a Lua script or a slow command whose allocator hands pages back with
/// madvise still keeps every client waiting for all of it, so such calls do not end a gap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Through {
    pub(crate) calls: u32,
    /// The first few distinct names, in order.
    pub(crate) names: [Option<&'static str>; 3],
    /// Some name did not fit.
    pub(crate) more: bool,
    /// Of the gap, the time outside any call: what the threshold is held against, so that
    /// quiet calls slowed by the tracer itself (strace's stops) make no stall of their sum.
    pub(crate) no_call: Nanos,
    /// What the process's I/O threads did over the gap (`io_wait`).
    pub(crate) io: Option<super::io_wait::IoCover>,
    /// The futex wake of a waiter the gap ended in: on which futex, and whether another
    /// thread waited through the gap for it.
    pub(crate) woke: Option<Woke>,
    /// Where the gap lay that no command runs in (`NoCommand`).
    pub(crate) no_command: Option<NoCommand>,
    /// No client request awaited its reply when the gap ended (`Commands::quiet_since`): from
    /// this time on (its start, or the last reply written in it) none did, and no command
    /// ran in it. redis runs a command between its request's read and its reply's write, and
    /// a request read after that time would still await its reply.
    pub(crate) answered_from: Option<Nanos>,
    /// Requests read by then awaited their replies with redis 8's own-loop I/O threads,
    /// not yet handed to the main thread (`commands::Quiet::io_held`).
    pub(crate) answered_io: bool,
}

impl Through {
    /// No client request awaited its reply in the main thread's hands when the gap (from
    /// `from`) ended, since `q.since`.
    fn answered(&mut self, q: Quiet, from: Nanos) {
        self.answered_from = Some(q.since.max(from));
        self.answered_io = q.io_held;
        if q.since <= from {
            self.no_command.get_or_insert(NoCommand::Answered);
        }
    }

    /// Of a gap ending at `end`, the stretch at its end no command ran in (`answered_from`).
    pub(crate) fn answered_tail(&self, end: Nanos) -> Nanos {
        self.answered_from.map_or(0, |a| (end - a).max(0))
    }
}

/// Two calls between which redis runs no command, whatever the gap between them: a gap
/// there was the thread off its CPU (waiting for one, or held by a tracer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoCommand {
    /// Two calls on one /proc file (its open and its read, its read and its close): redis
    /// reads one (its RSS and CPU time from /proc/self/stat, smaps) open, read, close, back
    /// to back (`Last::proc_fd`).
    ProcFile,
    /// After every request read had been answered (`Through::answered_from` at the gap's
    /// start or before).
    Answered,
    /// Its event-loop wait's return and its read of a notification fd (an eventfd): the
    /// event loop runs only `afterSleep` (the time cache, the modules' lock) before the
    /// first ready event's handler, and a notification's handler reads its fd first (redis
    /// 8's I/O threads wake the main thread so, `handleClientsFromIOThread`); the commands
    /// of the clients it hands over run after that read (`Last::loop_returned`).
    Dispatch,
    /// Two writes to client connections: redis writes a turn's replies one after another
    /// once its commands have run (`handleClientsWithPendingWrites` in `beforeSleep`, its
    /// own share of them with I/O threads), and a command that runs later has its request
    /// read first, a call between (`Last::replied`).
    Replies,
}

impl Through {
    fn add(&mut self, name: &'static str) {
        self.calls += 1;
        if let Some(slot) = self
            .names
            .iter_mut()
            .find(|n| n.is_none() || **n == Some(name))
        {
            *slot = Some(name);
        } else {
            self.more = true;
        }
    }
    pub(crate) fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.names.iter().flatten().copied()
    }
}

/// A gap still open across quiet calls: where it began and what was known there.
#[derive(Clone, Copy)]
struct OpenGap {
    from: Nanos,
    known: bool,
    after_wait: bool,
    through: Through,
    /// The scheduler's counters summed over the pieces so far (None once a piece lacks them).
    sched: Option<crate::event::SchedDelta>,
}

/// How far a candidate's duration is known (the report's bound, duration_known and
/// in_flight), and, for a call, how it ended and what it waited for.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DurFacts {
    pub(crate) bound: Bound,
    pub(crate) known: DurationKnown,
    /// Cut by the trace's start or end.
    pub(crate) in_flight: Option<InFlight>,
    /// The errno a slow call returned (`connect() = -1 ETIMEDOUT`).
    pub(crate) error: Option<&'static str>,
    /// A wait for a lock or for a reply (`ResolvedCall::waits`): never a wait for work.
    pub(crate) waits: super::call::Waits,
}

/// A candidate just stored, for the holds unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Added {
    pub(crate) idx: usize,
    pub(crate) id: u64,
    pub(crate) start: Nanos,
    pub(crate) end: Nanos,
}

/// What one call did to the stall store.
#[derive(Default)]
pub(crate) struct StallStep {
    /// Time since the thread's previous call ended, when there was one.
    pub(crate) gap: Option<Nanos>,
    /// Candidates stored (a gap before the call, the call itself).
    pub(crate) added: [Option<Added>; 2],
}

/// What a thread's last call left for the next one's gap.
#[derive(Clone, Copy)]
struct Last {
    /// `NO_END` before the thread's first call and after a break: a plain maximum per
    /// call, where an `Option` was rebuilt on every one.
    end: Nanos,
    /// Whether the last end is known (its call's duration measured or paired): a gap from
    /// an end that is not is only an upper bound.
    end_known: bool,
    /// Whether the last call was a wait for work of unknown length (no -T, e.g.
    /// `restart_syscall(<... resuming interrupted nanosleep ...>)`): the time after its
    /// printed start is that wait's as far as the trace shows, not CPU work.
    wait_unknown: bool,
    /// A gap running through quiet calls.
    open: Option<OpenGap>,
    /// The /proc file its last call opened or read (its fd), not closed by it: redis reads
    /// one (its RSS and CPU time from /proc/self/stat, smaps) open, read, close, back to
    /// back, so no command runs between two of those calls.
    proc_fd: Option<i32>,
    /// Its last call was an event-loop wait (timed: it returned then).
    loop_returned: bool,
    /// Its last call wrote to a client connection.
    replied: bool,
    /// It has returned from an event-loop wait since the trace began: a command it runs
    /// after that had its request read in the trace (one read before the attach, still
    /// running, is not counted as awaiting its reply: `Through::answered_from` waits for
    /// this).
    loop_seen: bool,
}

/// No last end: below every call's end, so the next call's end is the maximum.
const NO_END: Nanos = Nanos::MIN;

impl Default for Last {
    fn default() -> Self {
        Last {
            end: NO_END,
            end_known: false,
            wait_unknown: false,
            open: None,
            proc_fd: None,
            loop_returned: false,
            replied: false,
            loop_seen: false,
        }
    }
}

impl Last {
    /// Notes a call's /proc file and event-loop wait, and says whether the gap before it lay
    /// where no command runs (`NoCommand`).
    /// Out of line: inlined into the per-event path its checks cost ~20 Ir an event in
    /// spilled registers elsewhere (callgrind, bench/ab.result.txt), out of line ~4.
    #[inline(never)]
    fn no_command(&mut self, cx: &ResolvedCall<'_>) -> Option<NoCommand> {
        use crate::fdtable::FileClass;
        let on_proc = cx.class == Some(FileClass::Proc);
        let mid_proc_file = on_proc && self.proc_fd.is_some() && self.proc_fd == cx.call_fd;
        self.proc_fd = cx.call_fd.filter(|_| on_proc && cx.sc.name != "close");
        let loop_returned = std::mem::replace(
            &mut self.loop_returned,
            cx.facts.has(Facts::EPOLL) && cx.timed,
        );
        let replies = cx.facts.has(Facts::SEND) && cx.class == Some(FileClass::Client);
        let replied = std::mem::replace(&mut self.replied, replies);
        if mid_proc_file {
            Some(NoCommand::ProcFile)
        } else if replied && replies {
            Some(NoCommand::Replies)
        } else if loop_returned
            && cx.class == Some(FileClass::AnonInode)
            && cx.facts.has(Facts::READ)
        {
            Some(NoCommand::Dispatch)
        } else {
            None
        }
    }

    /// A quiet call: the open gap extended in place (made here if none is open), where
    /// moving the ~130-byte gap out and back on every call cost ~30 Ir per event.
    #[inline(always)]
    fn extend(
        &mut self,
        cx: &ResolvedCall<'_>,
        gap_end: Option<Nanos>,
        known: bool,
        after_wait: bool,
        piece: Nanos,
    ) {
        if self.open.is_none() {
            self.open = gap_end.map(|pe| OpenGap {
                from: pe,
                known,
                after_wait,
                through: Through::default(),
                sched: Some(Default::default()),
            });
        }
        if let Some(o) = &mut self.open {
            o.through.add(cx.sc.name);
            o.through.no_call += piece;
            o.sched = sum_sched(o.sched, cx.sc.sched.as_ref().map(|s| (s.before, s.during)));
        }
    }
}

pub(crate) struct Stalls {
    threshold: Nanos,
    /// Most candidates kept in detail.
    cap: usize,
    /// Per thread, what its last call left (one vector: one index per event).
    last: PerThread<Last>,
    /// The time of the last break in the timeline: no gap starts before it.
    broken_at: Nanos,
    cands: Vec<Cand>,
    dropped: u64,
    seq: u64,
    /// Kept stalls by length (min-heap), to find the one that makes room when full.
    by_length: BinaryHeap<Reverse<(Nanos, usize)>>,
    /// Highest candidate id handed out by `take_fresh` (live printing): a cursor, where a
    /// list of new indices would grow with every stall of an offline trace.
    reported: u64,
    /// Calls still running at the trace's end, below the threshold (or of unknown length).
    in_flight_small: Vec<Cand>,
    /// Calls still running at the trace's end that were a wait for work when made.
    parked: Vec<Cand>,
    /// The I/O threads' recent calls, for the main thread's gaps.
    helpers: IoHelpers,
    /// The last gaps stored, for I/O-thread calls printed after them that began before
    /// their end (`recover`).
    recent: RecentGaps,
    /// Long futex waits and the gaps ended by a wake, for who waited for whom.
    futex: FutexWaits,
}

/// A gap just stored: (index, id, process, from, to, the main thread's share there).
type RecentGap = (
    usize,
    u64,
    crate::fdtable::ProcKey,
    Nanos,
    Nanos,
    Option<super::io_wait::Dir>,
);

/// The last few gaps stored: an I/O thread's call whose line comes after a gap's end (an
/// `<unfinished ...>` call resumed later, a hand-off wait woken in the gap, a bpf record
/// read after the main thread's next one) can only begin so long before, so a handful
/// within `RECENT_SPAN` of the newest call is enough.
#[derive(Default)]
struct RecentGaps {
    gaps: [Option<RecentGap>; 8],
    next: usize,
}

impl RecentGaps {
    fn push(&mut self, g: RecentGap) {
        self.gaps[self.next] = Some(g);
        self.next = (self.next + 1) % self.gaps.len();
    }
}

/// How long after a gap's end an I/O-thread call that began inside it is still looked for.
const RECENT_SPAN: Nanos = 1_000_000_000;

/// Calls cut by the trace's edge listed below the threshold, at most.
const IN_FLIGHT_SMALL_MAX: usize = 1000;

impl Stalls {
    /// The tracer stops every call (ptrace): the I/O threads' time held at a call's entry
    /// is read as their wait (`IoHelpers::tracer_stops`).
    pub(crate) fn tracer_stops(mut self, yes: bool) -> Self {
        self.helpers.tracer_stops = yes;
        self
    }

    /// Processes whose main thread's event-loop wait an I/O thread made (valkey's offloaded
    /// poll: `IoHelpers::polls_shared`).
    pub(crate) fn polls_shared(&self) -> &[ProcKey] {
        self.helpers.polls_shared()
    }

    /// Whether the thread is one of redis 8's I/O threads with an event loop of its own
    /// (`IoHelpers::own_loop`).
    #[inline]
    pub(crate) fn own_loop(&self, t: ThreadIdx) -> bool {
        self.helpers.own_loop(t)
    }

    pub(crate) fn new(threshold: Nanos, cap: usize) -> Self {
        Stalls {
            threshold,
            cap,
            last: PerThread::default(),
            broken_at: Nanos::MIN,
            cands: vec![],
            dropped: 0,
            seq: 0,
            by_length: BinaryHeap::new(),
            reported: 0,
            in_flight_small: vec![],
            parked: vec![],
            helpers: IoHelpers::default(),
            recent: RecentGaps::default(),
            futex: FutexWaits::default(),
        }
    }

    /// A gap just stored that ended in a futex wake: waited for by a wait seen already, or
    /// kept for one printed later.
    fn note_waking_gap(&mut self, a: Added) {
        let c = &self.cands[a.idx];
        let Some(w) = c.through.woke else {
            return;
        };
        let waits = self.futex.waits.get(&(c.proc, w.addr));
        if waits.is_some_and(|v| v.iter().any(|x| waited_through(c, *x, self.threshold))) {
            self.cands[a.idx].through.woke = Some(Woke { waited: true, ..w });
        } else {
            if self.futex.waking.len() == WAKING_GAPS_MAX {
                self.futex.waking.pop_front();
            }
            self.futex.waking.push_back((a.idx, a.id));
        }
    }

    /// A futex wait of at least the threshold (`over`) is kept, and the gaps ended by its
    /// wake that it waited through are marked.
    #[inline(always)]
    fn note_futex_wait(&mut self, cx: &ResolvedCall<'_>, over: bool) {
        if !over {
            return;
        }
        if let Extra::Futex { addr, wake: false } | Extra::LockWait(addr) = cx.sc.extra {
            self.long_futex_wait(cx, addr);
        }
    }

    #[inline(never)]
    fn long_futex_wait(&mut self, cx: &ResolvedCall<'_>, addr: u64) {
        let w = (cx.tid, cx.ts(), cx.end);
        if self.futex.stored < FUTEX_WAITS_MAX {
            self.futex.waits.entry((cx.proc, addr)).or_default().push(w);
            self.futex.stored += 1;
        }
        let (threshold, cands) = (self.threshold, &mut self.cands);
        // A gap whose candidate was replaced (the store full) is forgotten.
        self.futex.waking.retain(|&(idx, id)| {
            let Some(c) = cands.get_mut(idx).filter(|c| c.id == id) else {
                return false;
            };
            match c.through.woke {
                Some(k)
                    if c.proc == cx.proc && k.addr == addr && waited_through(c, w, threshold) =>
                {
                    c.through.woke = Some(Woke { waited: true, ..k });
                    false
                }
                Some(_) => true,
                None => false,
            }
        });
    }

    /// An I/O-thread call covering from `start` came: the recent gaps of its process that
    /// ended after that are covered again with it.
    fn recover(&mut self, proc: crate::fdtable::ProcKey, start: Nanos, now: Nanos) {
        for slot in self.recent.gaps.iter_mut() {
            let Some((idx, id, p, from, to, share)) = *slot else {
                continue;
            };
            if to + RECENT_SPAN < now || self.cands.get(idx).is_none_or(|c| c.id != id) {
                *slot = None;
            } else if p == proc && start < to {
                self.cands[idx].through.io = self.helpers.cover(proc, from, to, share);
            }
        }
    }

    /// The timeline broke at `at` (an unreadable line): no thread's gap may span the break,
    /// nor start at a call from before it that the source hands over later (an unfinished
    /// call whose resumed half was in what could not be read).
    pub(crate) fn forget_all_last_ends(&mut self, at: Nanos) {
        for l in self.last.iter_mut() {
            (l.end, l.end_known, l.open, l.loop_seen) = (NO_END, false, None, false);
        }
        self.broken_at = self.broken_at.max(at);
    }

    /// A thread attached or detached: the time before is no gap of its own.
    pub(crate) fn forget_last_end(&mut self, t: super::call::ThreadIdx) {
        let l = self.last.at(t);
        (l.end, l.open, l.loop_seen) = (NO_END, None, false);
    }

    fn cand(&self, cx: &ResolvedCall<'_>, kind: StallKind, start: Nanos, dur: Nanos) -> Cand {
        let call = kind == StallKind::SlowSyscall;
        Cand {
            tid: cx.tid,
            proc: cx.proc,
            kind,
            syscall: call.then_some(cx.sc.name),
            fd: if call { cx.call_fd } else { None },
            file: if call { cx.file } else { None },
            start,
            dur,
            line: cx.line(),
            dur_facts: if call {
                DurFacts {
                    bound: cx.bound(),
                    known: call_known(cx),
                    in_flight: cx.sc.in_flight,
                    error: match cx.sc.ret {
                        crate::event::Ret::Err(e) => Some(e),
                        _ => None,
                    },
                    waits: cx.waits,
                }
            } else {
                DurFacts {
                    bound: Bound::Exact,
                    known: DurationKnown::Measured,
                    ..Default::default()
                }
            },
            phase: None,
            events_lost: false,
            id: 0,
            sched: cx
                .sc
                .sched
                .as_ref()
                .and_then(|s| if call { Some(s.during) } else { s.before }),
            through: Through::default(),
        }
    }

    #[inline]
    /// `lost`: events were lost before this call (live perf backend). `answered`: since when
    /// no client request has awaited its reply, if none does (`Commands::quiet_since`), asked
    /// only when a gap ends here: it cost ~6 Ir on every event when passed as a value.
    pub(crate) fn on_call(
        &mut self,
        cx: &ResolvedCall<'_>,
        phases: &Phases,
        lost: bool,
        answered: impl FnOnce() -> Option<Quiet>,
    ) -> StallStep {
        let mut step = StallStep::default();
        let (ts, dur) = (cx.ts(), cx.dur);
        let last = self.last.at(cx.thread);
        let prev_end = last.end;
        // A call begun before the last break but handed over after it (its unfinished half
        // before the unreadable lines, a resumed half after them, maybe another call's) has
        // no end known to be its own: no gap starts at it.
        if ts >= self.broken_at {
            last.end = prev_end.max(cx.end);
        }
        let prev_known = std::mem::replace(&mut last.end_known, call_known(cx).is_known());
        let after_wait = std::mem::replace(&mut last.wait_unknown, cx.idle && !cx.timed);
        let no_command = last.no_command(cx);
        let loop_seen = last.loop_seen;
        // `no_command` noted whether this call is an event-loop wait that returned.
        last.loop_seen |= last.loop_returned;
        let quiet = cx.facts.has(Facts::QUIET)
            && !cx.idle
            && cx.sc.in_flight.is_none()
            && !(cx.timed && dur >= self.threshold);
        let gap_end = (prev_end != NO_END && prev_end >= self.broken_at).then_some(prev_end);
        step.gap = gap_end.map(|pe| ts - pe);
        let piece = step.gap.unwrap_or(0).max(0);
        if quiet {
            // The gap runs on through this call; it began at the last call that was not
            // quiet.
            last.extend(cx, gap_end, prev_known, after_wait, piece);
        } else {
            // Most calls end no open gap: it is only moved out when there is one.
            let open = if last.open.is_some() {
                last.open.take()
            } else {
                None
            };
            let (from, known, after_wait, no_call) = match &open {
                Some(o) => (
                    Some(o.from),
                    o.known,
                    o.after_wait,
                    o.through.no_call + piece,
                ),
                None => (gap_end, prev_known, after_wait, piece),
            };
            if let Some(from) = from.filter(|_| {
                no_call >= self.threshold
                    && !after_wait
                    && cx.role != Role::Child
                    && cx.sc.in_flight != Some(InFlight::AtStart)
            }) {
                let mut c = self.cand(cx, StallKind::Gap, from, ts - from);
                if !known {
                    // From the start of a call of unknown length: the gap is what is left
                    // of that time once the call is taken out, at most this.
                    c.dur_facts.known = DurationKnown::UpperBound;
                    c.dur_facts.bound = Bound::AtMost;
                }
                if let Some(o) = open {
                    c.through = Through {
                        no_call,
                        ..o.through
                    };
                    c.sched = o.sched.zip(c.sched).map(|(a, b)| add_sched(a, b));
                }
                c.through.woke = woke_by(cx);
                c.through.no_command = no_command.filter(|_| open.is_none());
                // A gap that ends in a write may end in a reply whose request the trace
                // lacks (read before the attach, or on an fd of no class): a command ran.
                if let Some(q) = (loop_seen && !cx.facts.has(Facts::SEND))
                    .then(answered)
                    .flatten()
                {
                    c.through.answered(q, from);
                }
                c.phase = phases.active_at(from);
                c.events_lost = lost;
                let share = self.helpers.share(cx.proc, from);
                c.through.io = self.helpers.cover(cx.proc, from, ts, share);
                step.added[0] = self.add(c);
                if let Some(a) = step.added[0] {
                    self.note_waking_gap(a);
                    self.recent.push((a.idx, a.id, cx.proc, from, ts, share));
                }
            }
        }
        let over = cx.timed && dur >= self.threshold;
        self.note_futex_wait(cx, over);
        step.added[1] = self.slow_call(cx, phases, lost, over);
        // After the gap it ends: the main thread's call moves its side of the hand-off on.
        self.note_helper(cx);
        step
    }

    /// A call over the threshold (a stall), still running at the end (listed), or a wait
    /// for work still parked at the end (named, no stall).
    fn slow_call(
        &mut self,
        cx: &ResolvedCall<'_>,
        phases: &Phases,
        lost: bool,
        over: bool,
    ) -> Option<Added> {
        let (ts, dur) = (cx.ts(), cx.dur);
        let at_end = cx.sc.in_flight == Some(InFlight::AtEnd);
        if !cx.idle && (over || at_end) {
            let mut c = self.cand(cx, StallKind::SlowSyscall, ts, dur);
            c.phase = phases.active_at(ts);
            c.events_lost = lost;
            if over {
                return self.add(c);
            } else if self.in_flight_small.len() < IN_FLIGHT_SMALL_MAX {
                // Listed whatever its known part: a close() of the log still running when
                // strace detached (`<detached ...>`, nothing known of it) can be the whole
                // incident.
                self.in_flight_small.push(c);
            }
        } else if at_end && self.parked.len() < IN_FLIGHT_SMALL_MAX {
            // A thread parked in its wait for work when the trace ended: no stall, but a
            // hang in which every thread is parked is exactly that, so it is named.
            let mut c = self.cand(cx, StallKind::SlowSyscall, ts, dur);
            c.phase = phases.active_at(ts);
            self.parked.push(c);
        }
        None
    }

    /// The call as the I/O threads' unit sees it; one of theirs covers the recent gaps it
    /// began in again.
    #[inline]
    fn note_helper(&mut self, cx: &ResolvedCall<'_>) {
        if let Some(start) = self.helpers.on_call(cx) {
            if self.recent.gaps.iter().any(Option::is_some) {
                self.recover(cx.proc, start, cx.end);
            }
        }
    }

    fn add(&mut self, mut c: Cand) -> Option<Added> {
        self.seq += 1;
        c.id = self.seq;
        let idx = if self.cands.len() < self.cap {
            self.cands.push(c);
            self.cands.len() - 1
        } else {
            // Full: the shortest kept stall makes room, or the new one is the shortest.
            self.dropped += 1;
            match self.by_length.peek() {
                Some(Reverse((min_dur, min_idx))) if c.dur > *min_dur => {
                    let i = *min_idx;
                    self.by_length.pop();
                    self.cands[i] = c;
                    i
                }
                _ => return None,
            }
        };
        let c = &self.cands[idx];
        self.by_length.push(Reverse((c.dur, idx)));
        Some(Added {
            idx,
            id: c.id,
            start: c.start,
            end: c.start + c.dur,
        })
    }

    /// Indices of the candidates added since the last call and still stored, oldest first
    /// (live printing, a few times a second: one pass over the bounded store).
    pub(crate) fn take_fresh(&mut self) -> Vec<usize> {
        let mut fresh: Vec<(u64, usize)> = self
            .cands
            .iter()
            .enumerate()
            .filter(|(_, c)| c.id > self.reported)
            .map(|(i, c)| (c.id, i))
            .collect();
        fresh.sort_unstable();
        self.reported = self.seq;
        fresh.into_iter().map(|(_, i)| i).collect()
    }

    pub(crate) fn get(&self, idx: usize) -> &Cand {
        &self.cands[idx]
    }

    /// Candidates stored, by index (the holds unit keeps a `Held` per index).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &Cand)> {
        self.cands.iter().enumerate()
    }

    pub(crate) fn in_flight_small(&self) -> &[Cand] {
        &self.in_flight_small
    }

    /// Calls still running at the trace's end that were idle waits when made.
    pub(crate) fn parked(&self) -> &[Cand] {
        &self.parked
    }

    /// Candidates that made no room in the full store.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// How a call's duration is known, from the source's own account of it.
fn call_known(cx: &ResolvedCall<'_>) -> DurationKnown {
    if !cx.timed {
        return DurationKnown::Unknown;
    }
    match cx.dur_src() {
        DurSource::Measured => DurationKnown::Measured,
        DurSource::Paired => DurationKnown::Paired,
        DurSource::UpperBound => DurationKnown::UpperBound,
        DurSource::Unknown => DurationKnown::Unknown,
    }
}

fn add_sched(a: crate::event::SchedDelta, b: crate::event::SchedDelta) -> crate::event::SchedDelta {
    crate::event::SchedDelta {
        on_cpu_ns: a.on_cpu_ns + b.on_cpu_ns,
        runnable_ns: a.runnable_ns + b.runnable_ns,
        minor_faults: a.minor_faults + b.minor_faults,
        major_faults: a.major_faults + b.major_faults,
        // The empty sum a gap starts from (`Default`) knows no throttled part: measured
        // pieces make it known.
        throttled_ns: match (a.throttled_ns, b.throttled_ns) {
            (None, None) => None,
            (x, y) => Some(x.unwrap_or(0) + y.unwrap_or(0)),
        },
        reclaim_ns: match (a.reclaim_ns, b.reclaim_ns) {
            (None, None) => None,
            (x, y) => Some(x.unwrap_or(0) + y.unwrap_or(0)),
        },
    }
}

/// A gap's summed counters after one more quiet call (the piece before it and the call):
/// unknown from the first piece the backend did not measure.
fn sum_sched(
    acc: Option<crate::event::SchedDelta>,
    call: Option<(Option<crate::event::SchedDelta>, crate::event::SchedDelta)>,
) -> Option<crate::event::SchedDelta> {
    let (before, during) = call?;
    Some(add_sched(add_sched(acc?, before?), during))
}

/// Whether a candidate is a stall for a thread of this role; `gaps_ok`: the trace's gaps
/// can be trusted.
pub(crate) fn keep(c: &Cand, role: Role, gaps_ok: bool) -> bool {
    match c.kind {
        // A gap is time no client's request can move: that holds for the main thread (and a
        // thread whose role is not known). A child's or a bio thread's gap is its own work
        // (saving, freeing memory for UNLINK/FLUSHALL ASYNC); io threads spin without a
        // syscall while they wait for the main thread's hand-off.
        StallKind::Gap => matches!(role, Role::Main | Role::Other) && gaps_ok,
        StallKind::SlowSyscall => {
            c.dur_facts.waits != super::call::Waits::AsNamed
                || !c.syscall.is_some_and(|n| is_idle(n, role))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::call::testing::{call, event};

    const MS: Nanos = 1_000_000;

    /// Pushes `(ts_ms, dur_ms, name)` calls of the main thread; the gaps stored.
    fn gaps_of(calls: &[(i64, i64, &'static str)]) -> Vec<(Nanos, Nanos, Through)> {
        let mut s = Stalls::new(100 * MS, 8);
        let p = Phases::default();
        let mut out = vec![];
        for &(ts, dur, name) in calls {
            let e = event(1, ts * MS, dur * MS, name);
            let step = s.on_call(&call(&e, Role::Main, None), &p, false, || None);
            if let Some(a) = step.added[0] {
                let c = s.get(a.idx);
                out.push((c.start / MS, c.dur / MS, c.through));
            }
        }
        out
    }

    #[test]
    fn a_gap_runs_through_the_threads_own_quiet_calls() {
        // A 300 ms script cut at 80 and 170 ms by the allocator's madvise and futex wake:
        // one 300 ms gap (each piece is under the 100 ms threshold).
        let g = gaps_of(&[
            (0, 1, "epoll_wait"),
            (81, 0, "madvise"),
            (171, 0, "futex"),
            (200, 0, "madvise"),
            (301, 0, "write"),
        ]);
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!((g[0].0, g[0].1), (1, 300));
        assert_eq!(g[0].2.calls, 3);
        assert_eq!(g[0].2.names().collect::<Vec<_>>(), vec!["madvise", "futex"]);
        assert_eq!(g[0].2.no_call, 300 * MS);
        // Quiet calls slowed by the tracer (40 ms each, 5 ms between): the time outside
        // calls (20 ms) is what counts, so their sum makes no stall.
        let g = gaps_of(&[
            (0, 1, "epoll_wait"),
            (6, 40, "getpeername"),
            (51, 40, "getpid"),
            (96, 40, "getpid"),
            (141, 0, "write"),
        ]);
        assert!(g.is_empty(), "{g:?}");
        // A call that serves a client (or touches a file) ends the gap: two short gaps.
        let g = gaps_of(&[(0, 1, "epoll_wait"), (81, 0, "read"), (171, 0, "write")]);
        assert!(g.is_empty(), "{g:?}");
        // A quiet call over the threshold is its own slow call: the gap ends at it.
        let g = gaps_of(&[
            (0, 1, "epoll_wait"),
            (150, 120, "madvise"),
            (271, 0, "write"),
        ]);
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!((g[0].0, g[0].1, g[0].2.calls), (1, 149, 0));
    }

    /// redis 8 (fixtures/io-threads/redis8-io2, line 8014): the main thread's epoll_wait
    /// returned its I/O thread's eventfd, then 40 ms passed before its read of that eventfd
    /// (the handler's first call), under strace: no command runs there. The same gap
    /// before a client socket's read, or before an eventfd read that follows no loop wait,
    /// may hold one. Nor does a gap between two replies.
    #[test]
    fn gaps_between_calls_redis_runs_no_command_between_hold_none() {
        use crate::fdtable::FileClass as C;
        let gap = |calls: &[(i64, &'static str, Option<C>)]| {
            let mut s = Stalls::new(10 * MS, 8);
            let p = Phases::default();
            let mut out = None;
            for &(ts, name, class) in calls {
                let e = event(1, ts * MS, 0, name);
                let step = s.on_call(&call(&e, Role::Main, class), &p, false, || None);
                if let Some(a) = step.added[0] {
                    out = Some(s.get(a.idx).through.no_command);
                }
            }
            out.expect("a gap")
        };
        let eventfd = Some(C::AnonInode);
        assert_eq!(
            gap(&[(0, "epoll_wait", eventfd), (40, "read", eventfd)]),
            Some(NoCommand::Dispatch)
        );
        assert_eq!(
            gap(&[(0, "epoll_wait", eventfd), (40, "read", Some(C::Client))]),
            None
        );
        assert_eq!(
            gap(&[(0, "write", Some(C::Client)), (40, "read", eventfd)]),
            None
        );
        // Between two replies (redis 7's main thread writing its share: fixtures/io-threads/
        // redis7-io2 line 8460, 4 ms): no command. Between a request's read and its reply,
        // or a reply and the next read, one may run.
        let client = Some(C::Client);
        assert_eq!(
            gap(&[(0, "write", client), (40, "write", client)]),
            Some(NoCommand::Replies)
        );
        assert_eq!(gap(&[(0, "read", client), (40, "write", client)]), None);
        assert_eq!(gap(&[(0, "write", client), (40, "read", client)]), None);
        let aof = Some(C::Aof);
        assert_eq!(gap(&[(0, "write", client), (40, "write", aof)]), None);
    }

    #[test]
    fn a_gap_and_a_slow_call_over_the_threshold_are_candidates() {
        let mut s = Stalls::new(10 * MS, 8);
        let p = Phases::default();
        let a = event(1, 0, MS, "write");
        assert!(s
            .on_call(&call(&a, Role::Main, None), &p, false, || None)
            .gap
            .is_none());
        // 20 ms after the first call ended, a 15 ms write.
        let b = event(1, 21 * MS, 15 * MS, "write");
        let step = s.on_call(&call(&b, Role::Main, None), &p, false, || None);
        assert_eq!(step.gap, Some(20 * MS));
        let kinds: Vec<StallKind> = step
            .added
            .iter()
            .flatten()
            .map(|a| s.get(a.idx).kind)
            .collect();
        assert_eq!(kinds, vec![StallKind::Gap, StallKind::SlowSyscall]);
        // Idle waits and children's gaps are no candidates.
        let w = event(1, 100 * MS, 50 * MS, "epoll_wait");
        assert!(s
            .on_call(&call(&w, Role::Main, None), &p, false, || None)
            .added[1]
            .is_none());
        let c = event(2, 0, MS, "write");
        s.on_call(&call(&c, Role::Child, None), &p, false, || None);
        let c = event(2, 50 * MS, MS, "write");
        assert!(s
            .on_call(&call(&c, Role::Child, None), &p, false, || None)
            .added[0]
            .is_none());
    }

    #[test]
    fn a_full_store_keeps_the_longest_and_counts_the_rest() {
        let mut s = Stalls::new(10 * MS, 4);
        let p = Phases::default();
        let mut added = 0;
        for (i, d) in [11, 30, 12, 40, 13, 50, 10].iter().enumerate() {
            // One call per thread: no gaps.
            let e = event(i as u32 + 1, 0, d * MS, "fsync");
            added += s
                .on_call(&call(&e, Role::Main, None), &p, false, || None)
                .added
                .iter()
                .flatten()
                .count();
        }
        let mut kept: Vec<Nanos> = s.iter().map(|(_, c)| c.dur / MS).collect();
        kept.sort();
        assert_eq!(kept, vec![13, 30, 40, 50]);
        assert_eq!(s.dropped(), 3);
        assert_eq!(
            added, 6,
            "11, 30, 12, 40 fill it; 13 and 50 make room; 10 does not"
        );
    }

    #[test]
    fn fresh_stalls_are_each_handed_out_once_and_only_while_stored() {
        let mut s = Stalls::new(10 * MS, 4);
        let p = Phases::default();
        let slow = |s: &mut Stalls, tid: u32, d: Nanos| {
            let e = event(tid, 0, d * MS, "fsync");
            s.on_call(&call(&e, Role::Main, None), &p, false, || None);
        };
        for (i, d) in [11, 30, 12, 40, 13, 50, 10].iter().enumerate() {
            slow(&mut s, i as u32 + 1, *d);
        }
        // Never drained (offline): what is handed out is what is stored, no more.
        let ids: Vec<u64> = s.take_fresh().iter().map(|i| s.get(*i).id).collect();
        assert_eq!(ids, vec![2, 4, 5, 6]);
        assert!(s.take_fresh().is_empty());
        slow(&mut s, 20, 60);
        let fresh = s.take_fresh();
        assert_eq!(fresh.len(), 1);
        assert_eq!(s.get(fresh[0]).dur, 60 * MS);
    }

    #[test]
    fn gaps_are_kept_only_for_serving_threads_of_a_trustworthy_trace() {
        let mut s = Stalls::new(10 * MS, 4);
        let p = Phases::default();
        let a = event(1, 0, MS, "write");
        s.on_call(&call(&a, Role::Main, None), &p, false, || None);
        let b = event(1, 30 * MS, MS, "write");
        let step = s.on_call(&call(&b, Role::Main, None), &p, false, || None);
        let gap = s.get(step.added[0].unwrap().idx);
        assert!(keep(gap, Role::Main, true));
        assert!(!keep(gap, Role::Main, false));
        assert!(!keep(gap, Role::BioLazyFree, true));
    }
}
