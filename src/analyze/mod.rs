//! Analyzers: the stage between resolved events and the report. `Analyzer::push` takes
//! events in trace order from any source (saved traces or live tracers), keeps the process
//! and thread bookkeeping and the fd table up to date, and feeds the questions this tool
//! answers: latency statistics per syscall and per file, stalls (slow syscalls and per-thread
//! gaps), thread roles, background-save phases, per-command latency and which commands each
//! stall held up. `finish` turns the fixed-size state into a `Report`, where `findings` names
//! the causes and the advice. Memory is bounded by the number of threads, files, phases and
//! stalls, never by the number of events.

pub mod findings;
pub mod resp;
pub mod stats;

use crate::event::{DurSource, Event, EventKind, Extra, InFlight, Nanos, Ret, Syscall, Tid};
pub use crate::fdtable::RedisConf;
use crate::fdtable::{FdTable, FileClass, FileId};
use crate::report::{self, Bound, Report, Stall, StallKind};
use crate::source::{Counters, SourceInfo};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use stats::Agg;
use std::collections::{BTreeMap, VecDeque};

#[derive(Clone, Debug)]
pub struct Options {
    pub threshold_ns: i64,
    pub top: usize,
    /// tid -> thread name (from `--threads FILE`, or /proc live).
    pub thread_names: HashMap<Tid, String>,
    pub redis_conf: Option<RedisConf>,
    /// The traced redis-server's pid, when known (live, `--pid`).
    pub root_pid: Option<Tid>,
    /// Keep a per-thread sample of calls at least this long for timelines (plots, trace
    /// export); None when no output needs one.
    pub timeline_floor_ns: Option<i64>,
    /// Timestamps were taken by a ptrace tracer at its stops (strace, `attach --backend
    /// ptrace`), not by the kernel: a call is seen to end only once the tracer has handled
    /// the thread's exit stop.
    pub stamped_at_stops: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            threshold_ns: 10_000_000,
            top: 20,
            thread_names: HashMap::default(),
            redis_conf: None,
            root_pid: None,
            timeline_floor_ns: None,
            stamped_at_stops: false,
        }
    }
}

/// Thread roles (REPORT.md `thread`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Main,
    BioAof,
    BioCloseFile,
    BioLazyFree,
    IoThread,
    Child,
    Other,
}

impl Role {
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Main => "main",
            Role::BioAof => "bio_aof",
            Role::BioCloseFile => "bio_close_file",
            Role::BioLazyFree => "bio_lazy_free",
            Role::IoThread => "io_thread",
            Role::Child => "child",
            Role::Other => "other",
        }
    }

    fn from_name(name: &str) -> Option<Role> {
        let n = name.trim();
        Some(match n {
            _ if n.starts_with("bio_aof") => Role::BioAof,
            _ if n.starts_with("bio_close_file") => Role::BioCloseFile,
            _ if n.starts_with("bio_lazy_free") => Role::BioLazyFree,
            _ if n.starts_with("io_thd") => Role::IoThread,
            // Valkey, the redis fork, names its processes the same way; a comm is cut at
            // 15 bytes (`redis-rdb-bgsav`).
            _ if n
                .strip_prefix("redis-")
                .or(n.strip_prefix("valkey-"))
                .is_some_and(|r| {
                    ["rdb-bg", "aof-rew", "rdb-to"]
                        .iter()
                        .any(|c| r.starts_with(c))
                }) =>
            {
                Role::Child
            }
            _ if n.starts_with("redis-server")
                || n.starts_with("redis-check")
                || n.starts_with("valkey-server") =>
            {
                Role::Main
            }
            _ => Role::Other,
        })
    }
}

/// Waits that are idle time, not stalls: the event loop waiting for clients, background
/// threads waiting for work, sleeps. Role-aware: a futex wait in the main thread is
/// contention, in a bio thread it is "no job queued".
fn is_idle(name: &str, role: Role) -> bool {
    Facts::of(name).idle(role)
}

/// What the analysis asks about a syscall name, decided once per name (`Analyzer::facts`):
/// the hot path would otherwise compare strings a dozen times per event.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Facts(u16);

impl Facts {
    /// Waits that are idle in any thread (the event loop's), and exits: a process tearing
    /// down its address space holds no one up.
    const ALWAYS_IDLE: u16 = 1;
    /// Waits that are idle outside the main thread.
    const BG_WAIT: u16 = 1 << 1;
    const READ: u16 = 1 << 2;
    const EPOLL: u16 = 1 << 3;
    const FSYNC: u16 = 1 << 4;
    const CLOSE: u16 = 1 << 5;
    /// read/write/writev: evidence of a thread doing client I/O.
    const CLIENT_RW: u16 = 1 << 6;
    const EXIT: u16 = 1 << 7;
    const ACCEPT: u16 = 1 << 8;
    const OPEN: u16 = 1 << 9;
    const WAIT_CHILD: u16 = 1 << 10;
    /// Calls by which a child shows what it writes.
    const WRITES: u16 = 1 << 11;
    const RECV: u16 = 1 << 12;
    const SEND: u16 = 1 << 13;

    fn of(name: &str) -> Facts {
        let f = match name {
            "epoll_wait" | "epoll_pwait" | "epoll_pwait2" => Self::ALWAYS_IDLE | Self::EPOLL,
            // A continuation of a timed wait interrupted before tracing began.
            "restart_syscall" => Self::ALWAYS_IDLE,
            // In a background thread these wait for work; redis's main thread never sleeps
            // or polls while idle (its loop waits in epoll), so there they hold every client:
            // DEBUG SLEEP, a module's sleep, or synchronous I/O such as MIGRATE or a
            // replication handshake (poll with a timeout).
            "poll" | "ppoll" | "select" | "pselect6" | "nanosleep" | "clock_nanosleep"
            | "pause" | "rt_sigtimedwait" | "rt_sigsuspend" => Self::BG_WAIT,
            "exit" | "exit_group" => Self::ALWAYS_IDLE | Self::EXIT,
            "futex" => Self::BG_WAIT,
            "wait4" | "waitid" => Self::BG_WAIT | Self::WAIT_CHILD,
            "read" => Self::READ | Self::CLIENT_RW | Self::RECV,
            "recvfrom" | "readv" | "recvmsg" => Self::RECV,
            "write" | "writev" => Self::CLIENT_RW | Self::WRITES | Self::SEND,
            "sendto" | "sendmsg" => Self::SEND,
            "pwrite64" | "rename" | "renameat" => Self::WRITES,
            "fdatasync" | "fsync" => Self::FSYNC | Self::WRITES,
            "close" => Self::CLOSE,
            "accept" | "accept4" => Self::ACCEPT,
            "open" | "openat" | "openat2" | "creat" => Self::OPEN,
            _ => 0,
        };
        Facts(f)
    }
    fn has(self, bits: u16) -> bool {
        self.0 & bits != 0
    }
    /// Whether a call of this name is waiting for work, not holding anyone up, in a thread
    /// of this role.
    fn idle(self, role: Role) -> bool {
        self.has(Self::ALWAYS_IDLE)
            || (role != Role::Main
                && (self.has(Self::BG_WAIT) || (self.has(Self::READ) && role == Role::Other)))
    }
    /// Role-agnostic version for the "slowest calls" list, which is built before roles are
    /// known.
    fn wait_call(self) -> bool {
        self.has(Self::ALWAYS_IDLE | Self::BG_WAIT)
    }
}

#[derive(Default)]
struct ThreadState {
    /// (evidence epoch, role) of the last role decision: roles change rarely, the hot path
    /// asks for them on every event.
    role_cache: std::cell::Cell<Option<(u64, Role)>>,
    proc: u32,
    calls: u64,
    last_end: Option<Nanos>,
    name: Option<String>,
    // role evidence
    epoll: u64,
    aof_sync: u64,
    file_close: u64,
    client_io: u64,
    // event-loop timing for request-arrival estimates: the last wait (start, end, whether
    // it blocked)
    cur_wait: Option<(Nanos, Nanos, bool)>,
    prev_wait_end: Option<Nanos>,
    /// Running mean of this thread's non-waiting calls timed only as upper bounds (no `-T`):
    /// what the tracer adds to every call, so to a wait that did not block too.
    bound_call_ns: Nanos,
    /// Low decile of the time between two consecutive calls (or, without `-T`, of a call's
    /// upper bound): one tracer round trip with almost no work of the thread's own in it.
    trip: LowDecile,
    aof_ns: i64,
    log_ns: i64,
    idle: BTreeMap<&'static str, (u64, i64)>,
}

/// A streaming estimate of a low quantile (the tenth percentile) in O(1) space: step up by
/// a tenth of a microsecond when a sample is above the estimate and down by nine tenths
/// when below, which settles where a tenth of the samples lie below. Deterministic, so the
/// same trace always gives the same report.
#[derive(Clone, Copy, Default)]
struct LowDecile {
    ns: Nanos,
    seen: bool,
}

impl LowDecile {
    const UP: Nanos = 100;
    const DOWN: Nanos = 900;
    fn add(&mut self, x: Nanos) {
        if !self.seen {
            self.ns = x;
            self.seen = true;
        } else if x > self.ns {
            self.ns += Self::UP;
        } else if x < self.ns {
            self.ns = (self.ns - Self::DOWN).max(0);
        }
    }
}

/// Why a thread has its role: its name, or a behaviour rule.
enum Why {
    Name,
    Rule(&'static str),
}

/// Thread states in a vector with a one-entry cache in front of the tid index: consecutive
/// events mostly come from the same thread, and the hot path asks for its state several
/// times per event.
#[derive(Default)]
struct Threads {
    v: Vec<(Tid, ThreadState)>,
    idx: HashMap<Tid, usize>,
    last: std::cell::Cell<(Tid, usize)>,
}

impl Threads {
    fn pos(&self, tid: Tid) -> Option<usize> {
        let (lt, li) = self.last.get();
        if lt == tid && li < self.v.len() && self.v[li].0 == tid {
            return Some(li);
        }
        let i = *self.idx.get(&tid)?;
        self.last.set((tid, i));
        Some(i)
    }
    fn get(&self, tid: &Tid) -> Option<&ThreadState> {
        self.pos(*tid).map(|i| &self.v[i].1)
    }
    fn get_mut(&mut self, tid: &Tid) -> Option<&mut ThreadState> {
        self.pos(*tid).map(|i| &mut self.v[i].1)
    }
    fn get_or_insert_with(
        &mut self,
        tid: Tid,
        f: impl FnOnce() -> ThreadState,
    ) -> &mut ThreadState {
        let i = match self.pos(tid) {
            Some(i) => i,
            None => {
                self.v.push((tid, f()));
                self.idx.insert(tid, self.v.len() - 1);
                self.v.len() - 1
            }
        };
        self.last.set((tid, i));
        &mut self.v[i].1
    }
    fn len(&self) -> usize {
        self.v.len()
    }
    fn is_empty(&self) -> bool {
        self.v.is_empty()
    }
    fn iter(&self) -> impl Iterator<Item = (&Tid, &ThreadState)> {
        self.v.iter().map(|(t, s)| (t, s))
    }
    fn values(&self) -> impl Iterator<Item = &ThreadState> {
        self.v.iter().map(|(_, s)| s)
    }
    fn values_mut(&mut self) -> impl Iterator<Item = &mut ThreadState> {
        self.v.iter_mut().map(|(_, s)| s)
    }
    fn keys(&self) -> impl Iterator<Item = &Tid> {
        self.v.iter().map(|(t, _)| t)
    }
}

impl std::ops::Index<&Tid> for Threads {
    type Output = ThreadState;
    fn index(&self, tid: &Tid) -> &ThreadState {
        self.get(tid).expect("known thread")
    }
}

#[derive(Default)]
struct ProcState {
    is_child: bool,
    phase: Option<usize>,
}

/// A stall candidate: decided as a stall at `finish`, once thread roles are known.
#[derive(Clone)]
struct Cand {
    tid: Tid,
    proc: u32,
    kind: StallKind,
    syscall: Option<&'static str>,
    fd: Option<i32>,
    file: Option<FileId>,
    start: Nanos,
    dur: Nanos,
    line: Option<u64>,
    bound: Bound,
    in_flight: Option<InFlight>,
    phase: Option<usize>,
    waiting: u64,
    /// Distinct connections it held (few per stall in practice; capped).
    clients: Vec<(u32, i32)>,
    worst_wait: Option<i64>,
    /// Commands (by sequence number) it held up, for merging into incidents.
    held: Vec<u64>,
    by_cmd: Vec<(std::rc::Rc<str>, u64)>,
    id: u64,
}

struct PendingCmd {
    seq: u64,
    name: std::rc::Rc<str>,
    req: Nanos,
    aof0: i64,
    log0: i64,
}

#[derive(Clone)]
struct DoneCmd {
    seq: u64,
    name: std::rc::Rc<str>,
    conn: (u32, i32),
    req: Nanos,
    reply: Nanos,
}

struct PhaseState {
    child: u32,
    start: Nanos,
    fork_ns: Option<Nanos>,
    end: Option<Nanos>,
    ended_by: Option<&'static str>,
    wrote: Vec<FileClass>,
    kind_hint: Option<&'static str>,
}

/// One of the slowest calls (kept whatever the threshold, for the "slowest calls" table).
struct SlowRec {
    dur: Nanos,
    tid: Tid,
    proc: u32,
    name: &'static str,
    fd: Option<i32>,
    file: Option<FileId>,
    ts: Nanos,
    line: u64,
    bound: Bound,
}

/// Per thread, the slowest calls above the timeline floor: a min-heap on duration so the
/// shortest kept call is the one that makes room.
#[derive(Default)]
struct TimelineSample {
    heap: std::collections::BinaryHeap<std::cmp::Reverse<(Nanos, u64)>>,
    calls: HashMap<u64, SlowRec>,
    dropped: u64,
}

/// An event-loop wait at least this long blocked (the request arrived at its end); a shorter
/// one returned at once because work was already queued. Without `-T` a wait's duration is
/// an upper bound that includes the tracer's own stop, so it must also exceed twice what
/// the thread's other calls take under the same bound.
const BLOCKED_WAIT: Nanos = 20_000;

const DONE_KEEP: usize = 1 << 16;
/// Stalls kept in detail; past this the shortest are dropped (and counted), so memory stays
/// bounded on traces with hundreds of thousands of stalls.
const MAX_CANDS: usize = 5_000;

pub struct Analyzer {
    opts: Options,
    fds: FdTable,
    threads: Threads,
    procs: HashMap<u32, ProcState>,
    /// Key of the traced process for tids whose origin the trace does not show.
    root: u32,
    root_known: bool,
    events: u64,
    syscalls: u64,
    first_ts: Option<Nanos>,
    last_ts: Nanos,
    measured: u64,
    /// The shortest measured call (a trace filtered by duration has no short one).
    min_measured: Nanos,
    reconstructed: u64,
    /// Per syscall name, keyed by the interned name's address (a hash of a pointer, not of
    /// the string); equal names from different interners are merged at the end.
    by_name: HashMap<usize, (&'static str, Agg)>,
    /// Bumped whenever evidence that decides thread roles changes.
    role_epoch: u64,
    /// The trace's clock, once `finish` knows it.
    clock: Option<crate::source::Clock>,
    by_file: HashMap<FileId, Agg>,
    slowest: Vec<SlowRec>,
    timeline: HashMap<Tid, TimelineSample>,
    timeline_seq: u64,
    cands: Vec<Cand>,
    cands_dropped: u64,
    cand_seq: u64,
    /// Kept stalls by length (min-heap), to find the one that makes room when full.
    by_length: std::collections::BinaryHeap<std::cmp::Reverse<(Nanos, usize)>>,
    /// The most recent stalls (index, id, latest end of it and of every stall before it),
    /// for matching commands as they complete. The running maximum lets a command that
    /// arrived after all of them stop at the newest entry instead of testing every one.
    recent: VecDeque<(usize, u64, Nanos)>,
    /// Requests answered by the reply being handled (reused: one reply per command).
    answered: Vec<PendingCmd>,
    /// Stalls added since the last `drain_new_stalls`.
    fresh: Vec<usize>,
    in_flight_small: Vec<Cand>,
    phases: Vec<PhaseState>,
    segment: usize,
    conns: HashMap<(u32, i32), VecDeque<PendingCmd>>,
    /// Connections accepted but not yet read from: when their connect was noticed.
    conn_open: HashMap<(u32, i32), Nanos>,
    last_reply: HashMap<(u32, i32), Nanos>,
    cmd_seq: u64,
    done: VecDeque<DoneCmd>,
    cmd_intern: HashMap<Box<[u8]>, std::rc::Rc<str>>,
    cmd_stats: HashMap<(std::rc::Rc<str>, usize), Agg>,
    cmd_all: BTreeMap<std::rc::Rc<str>, (Agg, i64, i64)>,
    main_file_seg: BTreeMap<usize, Agg>,
    bio_fsyncs: Vec<(Nanos, Nanos)>,
    main_fsync_by_file: HashMap<FileId, Agg>,
    /// When the root process last opened a new incremental AOF (redis 7 multi-part AOF).
    last_incr_open: Option<Nanos>,
    fork_durs: Vec<Nanos>,
    in_flight_start: u64,
    in_flight_end: u64,
    lost_events: u64,
    /// `Facts` by the address of the interned name, direct-mapped.
    facts: [(usize, Facts); 64],
}

fn bound_of(sc: &Syscall) -> Bound {
    if sc.in_flight.is_some() {
        Bound::AtLeast
    } else if sc.dur_src == DurSource::UpperBound {
        Bound::AtMost
    } else {
        Bound::Exact
    }
}

impl Analyzer {
    pub fn new(opts: Options) -> Self {
        let root = opts.root_pid.unwrap_or(u32::MAX);
        let fds = FdTable::new(opts.redis_conf.clone());
        let mut a = Analyzer {
            root,
            root_known: opts.root_pid.is_some(),
            opts,
            fds,
            threads: Threads::default(),
            procs: HashMap::default(),
            events: 0,
            syscalls: 0,
            first_ts: None,
            last_ts: 0,
            measured: 0,
            min_measured: Nanos::MAX,
            reconstructed: 0,
            by_name: HashMap::default(),
            role_epoch: 0,
            clock: None,
            by_file: HashMap::default(),
            slowest: vec![],
            timeline: HashMap::default(),
            timeline_seq: 0,
            cands: vec![],
            cands_dropped: 0,
            cand_seq: 0,
            by_length: Default::default(),
            recent: VecDeque::new(),
            answered: Vec::new(),
            fresh: vec![],
            in_flight_small: vec![],
            phases: vec![],
            segment: 0,
            conns: HashMap::default(),
            conn_open: HashMap::default(),
            last_reply: HashMap::default(),
            cmd_seq: 0,
            done: VecDeque::new(),
            cmd_intern: HashMap::default(),
            cmd_stats: HashMap::default(),
            cmd_all: BTreeMap::new(),
            main_file_seg: BTreeMap::new(),
            bio_fsyncs: vec![],
            main_fsync_by_file: HashMap::default(),
            last_incr_open: None,
            fork_durs: vec![],
            in_flight_start: 0,
            in_flight_end: 0,
            lost_events: 0,
            facts: [(0, Facts::default()); 64],
        };
        a.procs.insert(root, ProcState::default());
        a
    }

    /// Live: the fd table as /proc/PID/fd showed it at attach.
    pub fn seed_fd(&mut self, pid: Tid, fd: i32, path: &str) {
        let key = self.proc_key(pid);
        self.fds.bind(key, fd, Some(path), None, i64::MIN / 4);
    }

    pub fn set_thread_name(&mut self, tid: Tid, name: &str) {
        self.opts.thread_names.insert(tid, name.to_string());
        if let Some(t) = self.threads.get_mut(&tid) {
            t.name = Some(name.to_string());
            self.role_epoch += 1;
        }
    }

    /// Live perf backend: events lost to ring-buffer overflow so far.
    pub fn add_lost_events(&mut self, n: u64) {
        self.lost_events += n;
    }

    /// `watch` metrics: the class of the file behind `fd` of thread `tid` at `ts`, as the
    /// fd table knows it after the events pushed so far.
    pub fn file_class_at(&self, tid: Tid, fd: i32, ts: Nanos) -> Option<FileClass> {
        let proc = self.threads.get(&tid).map_or(self.root, |t| t.proc);
        self.fds.lookup(proc, fd, ts).map(|r| r.class)
    }

    fn proc_key(&self, pid: Tid) -> u32 {
        if self.procs.contains_key(&pid) && pid != self.root {
            pid
        } else {
            self.root
        }
    }

    fn thread(&mut self, tid: Tid) -> &mut ThreadState {
        let i = self.thread_idx(tid);
        &mut self.threads.v[i].1
    }

    /// Index of the thread's state, created on first sight. Indices are stable (states are
    /// only ever appended), so the hot path looks a thread up once per event.
    fn thread_idx(&mut self, tid: Tid) -> usize {
        if let Some(i) = self.threads.pos(tid) {
            return i;
        }
        self.role_epoch += 1;
        let root = self.root;
        let names = &self.opts.thread_names;
        self.threads.get_or_insert_with(tid, || ThreadState {
            proc: root,
            name: names.get(&tid).cloned(),
            ..Default::default()
        });
        self.threads.v.len() - 1
    }

    fn facts(&mut self, name: &'static str) -> Facts {
        let key = name.as_ptr() as usize;
        // Fibonacci hashing: names are neighbours in one static table, so low address bits
        // alone collide.
        let slot = &mut self.facts[(key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) & 63];
        if slot.0 != key {
            *slot = (key, Facts::of(name));
        }
        slot.1
    }

    /// The role a thread has on current evidence (final at `finish`).
    fn role(&self, tid: Tid) -> Role {
        let t = match self.threads.get(&tid) {
            Some(t) => t,
            None => return Role::Other,
        };
        if let Some((epoch, role)) = t.role_cache.get() {
            if epoch == self.role_epoch {
                return role;
            }
        }
        let role = self.role_and_why(tid, t).0;
        t.role_cache.set(Some((self.role_epoch, role)));
        role
    }

    fn role_why(&self, tid: Tid) -> String {
        let t = &self.threads[&tid];
        match self.role_and_why(tid, t) {
            (_, Why::Name) => format!("thread name {:?}", t.name.as_deref().unwrap_or("")),
            (_, Why::Rule(why)) => why.into(),
        }
    }

    /// A thread's role and the evidence for it, in order of trust: process, name, pid,
    /// behaviour (README: how thread roles are inferred).
    fn role_and_why(&self, tid: Tid, t: &ThreadState) -> (Role, Why) {
        if self.procs.get(&t.proc).is_some_and(|p| p.is_child) {
            return (Role::Child, Why::Rule("forked child process"));
        }
        if let Some(n) = &t.name {
            if let Some(r) = Role::from_name(n) {
                if r != Role::Other || !n.is_empty() {
                    return (r, Why::Name);
                }
            }
        }
        if self.root_known && tid == self.root {
            return (Role::Main, Why::Rule("tid == pid"));
        }
        if t.epoll > 0 {
            return (Role::Main, Why::Rule("runs the event loop (epoll_wait)"));
        }
        // No event loop in the trace (a filtered trace, a redis still starting or crashing):
        // the main thread is the process's first, whatever files it closes.
        if !self.root_known
            && tid == self.root_display()
            && self.threads.values().all(|t| t.epoll == 0)
        {
            return (
                Role::Main,
                Why::Rule("first thread of the process, and no thread runs the event loop"),
            );
        }
        // bio_close_file fsyncs a file only right before closing it (the old AOF after a
        // rewrite); the AOF fsync thread fsyncs the live AOF over and over and closes
        // rarely (redis 7.2 gives it the old AOF's close too).
        if t.file_close > 0 && t.file_close >= t.aof_sync {
            return (
                Role::BioCloseFile,
                Why::Rule("closes files outside the event loop"),
            );
        }
        if t.aof_sync > 0 {
            return (
                Role::BioAof,
                Why::Rule("fsyncs the AOF outside the event loop"),
            );
        }
        if t.client_io > 0 {
            return (
                Role::IoThread,
                Why::Rule("reads/writes client sockets outside the event loop"),
            );
        }
        (Role::Other, Why::Rule("no redis-specific behaviour seen"))
    }

    /// The pid shown for the traced process.
    fn root_display(&self) -> u32 {
        if self.root != u32::MAX {
            return self.root;
        }
        self.threads
            .iter()
            .filter(|(_, t)| t.proc == self.root)
            .map(|(tid, _)| *tid)
            .min()
            .unwrap_or(0)
    }

    fn active_phase(&self, at: Nanos) -> Option<usize> {
        self.phases
            .iter()
            .rposition(|p| p.start <= at && p.end.is_none_or(|e| at < e))
    }

    pub fn push(&mut self, ev: &Event) {
        self.events += 1;
        // Only calls carry trustworthy times: strace's own messages may have none.
        if ev.syscall().is_some() {
            self.first_ts = Some(self.first_ts.map_or(ev.ts, |f| f.min(ev.ts)));
            self.last_ts = self.last_ts.max(ev.end());
        }
        match &ev.kind {
            EventKind::Syscall(sc) => self.on_syscall(ev, sc),
            EventKind::Signal { name, si_pid } => {
                if *name == "SIGCHLD" {
                    if let Some(pid) = si_pid {
                        self.end_phase(*pid, ev.ts, "SIGCHLD");
                    }
                }
                self.thread(ev.tid);
            }
            EventKind::Exit { .. } => {
                let proc = self.thread(ev.tid).proc;
                if proc == ev.tid && proc != self.root {
                    self.end_phase(ev.tid, ev.ts, "exit");
                }
            }
            EventKind::Attach { .. } => {
                if !self.root_known && self.threads.is_empty() {
                    // strace's first "Process N attached" names the traced process.
                    self.rename_root(ev.tid);
                }
                if let Some(t) = self.threads.get_mut(&ev.tid) {
                    t.last_end = None;
                }
            }
            EventKind::Detach => {
                if let Some(t) = self.threads.get_mut(&ev.tid) {
                    t.last_end = None;
                }
            }
            EventKind::ThreadName(name) => {
                self.thread(ev.tid);
                self.set_thread_name(ev.tid, name);
            }
        }
    }

    fn rename_root(&mut self, pid: Tid) {
        let old = self.root;
        if old == pid {
            return;
        }
        if let Some(p) = self.procs.remove(&old) {
            self.procs.insert(pid, p);
        }
        self.root = pid;
        self.root_known = true;
        for t in self.threads.values_mut() {
            if t.proc == old {
                t.proc = pid;
                self.role_epoch += 1;
            }
        }
    }

    fn end_phase(&mut self, child: u32, at: Nanos, by: &'static str) {
        if let Some(i) = self
            .phases
            .iter()
            .rposition(|p| p.child == child && p.end.is_none())
        {
            self.phases[i].end = Some(at);
            self.phases[i].ended_by = Some(by);
            self.segment = 2 * i + 2;
        }
    }

    fn on_syscall(&mut self, ev: &Event, sc: &Syscall) {
        self.syscalls += 1;
        let f = self.facts(sc.name);
        match sc.dur_src {
            // The edges of a trace, exits, and the calls an exit cut short (`= ?`) are timed
            // by pairing even under -T.
            _ if sc.in_flight.is_some()
                || f.has(Facts::EXIT)
                || (sc.dur_src == DurSource::Paired && sc.ret == Ret::Unknown) => {}
            DurSource::Measured => {
                self.measured += 1;
                self.min_measured = self.min_measured.min(sc.dur.unwrap_or(0));
            }
            DurSource::UpperBound | DurSource::Paired => self.reconstructed += 1,
            DurSource::Unknown => {}
        }
        let tid = ev.tid;
        let ti = self.thread_idx(tid);
        let proc = self.threads.v[ti].1.proc;
        let resolved = self.fds.apply(proc, ev.ts, sc);
        let class = resolved.map(|r| r.class);
        let file = resolved.map(|r| r.file);
        // An open touches the fd it returns (its file is what `resolved` names).
        let call_fd = if f.has(Facts::OPEN) {
            sc.ret.val().and_then(|v| i32::try_from(v).ok())
        } else {
            sc.fd
        };
        let dur = sc.dur.unwrap_or(0);
        let end = ev.ts + dur;
        match sc.in_flight {
            Some(InFlight::AtStart) => self.in_flight_start += 1,
            Some(InFlight::AtEnd) => self.in_flight_end += 1,
            None => {}
        }

        // Role evidence.
        {
            let t = &mut self.threads.v[ti].1;
            t.calls += 1;
            if f.has(Facts::EPOLL) {
                t.epoll += 1;
            } else if f.has(Facts::FSYNC) && class.is_some_and(|c| c.is_aof()) {
                t.aof_sync += 1;
            } else if f.has(Facts::CLOSE) && class.is_some_and(|c| c.is_disk_file()) {
                t.file_close += 1;
            } else if f.has(Facts::CLIENT_RW) && class == Some(FileClass::Client) {
                t.client_io += 1;
            }
            // New kinds of evidence (a first epoll_wait...) can change roles.
            if [t.epoll, t.aof_sync, t.file_close, t.client_io].contains(&1) {
                self.role_epoch += 1;
            }
        }
        let role = self.role(tid);

        // Statistics (only calls whose duration is known).
        if sc.dur.is_some() {
            let agg = &mut self
                .by_name
                .entry(sc.name.as_ptr() as usize)
                .or_insert_with(|| (sc.name, Agg::default()))
                .1;
            agg.add(dur);
            if sc.ret.is_err() {
                agg.errors += 1;
            }
            if let Some(f) = file {
                self.by_file.entry(f).or_default().add(dur);
            }
        } else {
            let agg = &mut self
                .by_name
                .entry(sc.name.as_ptr() as usize)
                .or_insert_with(|| (sc.name, Agg::default()))
                .1;
            agg.count += 1;
            if sc.ret.is_err() {
                agg.errors += 1;
            }
        }

        // Idle time.
        let idle = f.idle(role);
        // An exit is not a stall either, but no wait for work: it has no place in idle time.
        // Waits are kept whatever the role is so far: the report counts them as idle by the
        // thread's final role (a main thread is known as such only at its first epoll_wait).
        if (idle || f.wait_call()) && !f.has(Facts::EXIT) {
            let e = self.threads.v[ti].1.idle.entry(sc.name).or_default();
            e.0 += 1;
            e.1 += dur;
        }

        let rec = || SlowRec {
            dur,
            tid,
            proc,
            name: sc.name,
            fd: call_fd,
            file,
            ts: ev.ts,
            line: ev.line,
            bound: bound_of(sc),
        };

        // Slowest calls (non-waits), bounded.
        if !f.wait_call() && sc.dur.is_some() {
            let keep = self.opts.top.max(20);
            if self.slowest.len() < keep || self.slowest.last().is_some_and(|s| s.dur < dur) {
                self.slowest.push(rec());
                self.slowest.sort_by_key(|s| std::cmp::Reverse(s.dur));
                self.slowest.truncate(keep);
            }
        }

        if let Some(floor) = self.opts.timeline_floor_ns {
            if !idle && sc.dur.is_some() && dur >= floor {
                self.timeline_seq += 1;
                let rec = rec();
                let t = self.timeline.entry(tid).or_default();
                if t.calls.len() >= report::TIMELINE_MAX_PER_THREAD {
                    match t.heap.peek() {
                        Some(std::cmp::Reverse((d, _))) if *d < dur => {
                            if let Some(std::cmp::Reverse((_, k))) = t.heap.pop() {
                                t.calls.remove(&k);
                            }
                            t.dropped += 1;
                        }
                        _ => t.dropped += 1,
                    }
                }
                if t.calls.len() < report::TIMELINE_MAX_PER_THREAD {
                    t.heap.push(std::cmp::Reverse((dur, self.timeline_seq)));
                    t.calls.insert(self.timeline_seq, rec);
                }
            }
        }

        // Gap since this thread's previous call.
        let prev_end = self.threads.v[ti].1.last_end;
        if let Some(pe) = prev_end {
            let gap = ev.ts - pe;
            if sc.dur_src != DurSource::UpperBound && (0..1_000_000).contains(&gap) {
                self.threads.v[ti].1.trip.add(gap);
            }
            if gap >= self.opts.threshold_ns
                && role != Role::Child
                && sc.in_flight != Some(InFlight::AtStart)
            {
                self.add_cand(Cand {
                    tid,
                    proc,
                    kind: StallKind::Gap,
                    syscall: None,
                    fd: None,
                    file: None,
                    start: pe,
                    dur: gap,
                    line: (ev.line != 0).then_some(ev.line),
                    bound: Bound::Exact,
                    in_flight: None,
                    phase: self.active_phase(pe),
                    waiting: 0,
                    clients: vec![],
                    worst_wait: None,
                    held: vec![],
                    by_cmd: vec![],
                    id: 0,
                });
            }
        }
        {
            let t = &mut self.threads.v[ti].1;
            t.last_end = Some(t.last_end.map_or(end, |le| le.max(end)));
        }

        // Slow syscall.
        if !idle
            && sc.dur.is_some()
            && (dur >= self.opts.threshold_ns || sc.in_flight == Some(InFlight::AtEnd))
        {
            let c = Cand {
                tid,
                proc,
                kind: StallKind::SlowSyscall,
                syscall: Some(sc.name),
                fd: call_fd,
                file,
                start: ev.ts,
                dur,
                line: (ev.line != 0).then_some(ev.line),
                bound: bound_of(sc),
                in_flight: sc.in_flight,
                phase: self.active_phase(ev.ts),
                waiting: 0,
                clients: vec![],
                worst_wait: None,
                held: vec![],
                by_cmd: vec![],
                id: 0,
            };
            if dur >= self.opts.threshold_ns {
                self.add_cand(c);
            } else if self.in_flight_small.len() < 1000 && dur >= self.opts.threshold_ns / 10 {
                // Below a tenth of the threshold, a call cut by the trace's edge says nothing.
                self.in_flight_small.push(c);
            }
        }

        // Event loop: when did the requests read next arrive?
        if f.has(Facts::EPOLL) {
            let t = &mut self.threads.v[ti].1;
            t.prev_wait_end = t.cur_wait.map(|w| w.1);
            let floor = if sc.dur_src == DurSource::UpperBound {
                BLOCKED_WAIT.max(2 * t.bound_call_ns)
            } else {
                BLOCKED_WAIT
            };
            t.cur_wait = Some((ev.ts, end, dur >= floor));
        } else if sc.dur_src == DurSource::UpperBound && !idle && dur < 1_000_000 {
            // Stalls aside (they are not overhead): a slow mean of the tracer's cost.
            let t = &mut self.threads.v[ti].1;
            t.trip.add(dur);
            t.bound_call_ns = if t.bound_call_ns == 0 {
                dur
            } else {
                t.bound_call_ns + (dur - t.bound_call_ns) / 16
            };
        }

        // Main-thread file syscall time, for phases and per-command attribution.
        if role == Role::Main || role == Role::IoThread {
            if let Some(c) = class {
                if c.is_disk_file() && sc.dur.is_some() {
                    self.main_file_seg.entry(self.segment).or_default().add(dur);
                    let t = &mut self.threads.v[ti].1;
                    if c.is_aof() {
                        t.aof_ns += dur;
                    } else if c == FileClass::Log {
                        t.log_ns += dur;
                    }
                }
            }
        }

        if role == Role::Main && f.has(Facts::FSYNC) && sc.dur.is_some() {
            if let Some(f) = file {
                self.main_fsync_by_file.entry(f).or_default().add(dur);
            }
        }

        // Background fsyncs of the AOF (for aof-write-pending-fsync).
        if f.has(Facts::FSYNC)
            && class.is_some_and(|c| c.is_aof())
            && role != Role::Main
            && dur >= 1_000_000
            && self.bio_fsyncs.len() < 1 << 20
        {
            self.bio_fsyncs.push((ev.ts, end));
        }

        // Commands: requests read from, replies written to client connections.
        if class == Some(FileClass::Client) && !sc.ret.is_err() {
            if let Some(fd) = sc.fd {
                self.on_client_io(tid, (proc, fd), ev, sc, f, end);
            }
        }
        if f.has(Facts::CLOSE) {
            if let Some(fd) = sc.fd {
                self.conns.remove(&(proc, fd));
                self.conn_open.remove(&(proc, fd));
                self.last_reply.remove(&(proc, fd));
            }
        }
        if f.has(Facts::ACCEPT) {
            if let Ret::Val(newfd) = sc.ret {
                let req = self.request_time(tid, ev.ts);
                if self.conn_open.len() < 100_000 {
                    self.conn_open.insert((proc, newfd as i32), req);
                }
            }
        }

        if proc == self.root && f.has(Facts::OPEN) && sc.ret.val().is_some() {
            let p = sc.ret_path.as_deref().or(sc.path());
            if p.is_some_and(|p| p.contains(".incr.aof")) {
                self.last_incr_open = Some(ev.ts);
            }
        }

        // Children and phases.
        if let (Extra::Clone { thread }, Ret::Val(child)) = (&sc.extra, sc.ret) {
            if child > 0 {
                let child = child as u32;
                if *thread {
                    self.thread(child).proc = proc;
                    self.role_epoch += 1;
                } else {
                    self.fds.fork(proc, child, ev.ts);
                    self.procs.insert(
                        child,
                        ProcState {
                            is_child: true,
                            phase: None,
                        },
                    );
                    self.thread(child).proc = child;
                    self.role_epoch += 1;
                    if proc == self.root {
                        let idx = self.phases.len();
                        self.phases.push(PhaseState {
                            child,
                            start: ev.ts,
                            fork_ns: sc.dur,
                            end: None,
                            ended_by: None,
                            wrote: vec![],
                            kind_hint: self.kind_hint_before_fork(ev.ts),
                        });
                        if let Some(p) = self.procs.get_mut(&child) {
                            p.phase = Some(idx);
                        }
                        self.segment = 2 * idx + 1;
                        if let Some(d) = sc.dur {
                            self.fork_durs.push(d);
                        }
                    }
                }
            }
        }
        if f.has(Facts::WAIT_CHILD) {
            if let Ret::Val(child) = sc.ret {
                if child > 0 {
                    self.end_phase(child as u32, end, "wait4");
                }
            }
        }
        // What the child writes tells what kind of save it is.
        if let Some(c) = class {
            let is_write = f.has(Facts::WRITES);
            if is_write {
                if let Some(i) = self.procs.get(&proc).and_then(|p| p.phase) {
                    if !self.phases[i].wrote.contains(&c) {
                        self.phases[i].wrote.push(c);
                    }
                }
            }
        }
        if let Extra::Rename(old, _) = &sc.extra {
            let c = crate::fdtable::classify_path(old, self.fds.conf.as_ref());
            let phase = self
                .procs
                .get(&proc)
                .and_then(|p| p.phase)
                .or_else(|| self.phases.len().checked_sub(1));
            if let Some(i) = phase {
                let hint = match c {
                    FileClass::AofRewriteTemp => Some("aof_rewrite"),
                    FileClass::RdbTemp => Some("bgsave"),
                    _ => None,
                };
                if hint.is_some() && self.phases[i].kind_hint.is_none() {
                    self.phases[i].kind_hint = hint;
                }
            }
        }
    }

    /// Redis 7 opens the next `NAME.N.incr.aof` just before it forks the AOF-rewrite child:
    /// that names the phase even when the child itself was not traced.
    fn kind_hint_before_fork(&self, at: Nanos) -> Option<&'static str> {
        match self.last_incr_open {
            Some(t) if at - t <= 200_000_000 && t <= at => Some("aof_rewrite"),
            _ => None,
        }
    }

    /// `key` is the connection: (process, fd).
    fn on_client_io(
        &mut self,
        tid: Tid,
        key: (u32, i32),
        ev: &Event,
        sc: &Syscall,
        f: Facts,
        end: Nanos,
    ) {
        let is_read = f.has(Facts::RECV);
        let is_write = f.has(Facts::SEND);
        if is_read {
            let data = match sc.data() {
                Some(d) => d.head(),
                None => return,
            };
            let mut names: [Option<std::rc::Rc<str>>; 8] = Default::default();
            let mut n = 0;
            let intern = &mut self.cmd_intern;
            resp::for_each_command(data.bytes(), data.truncated, |raw| {
                if n < names.len() {
                    let mut up = [0u8; resp::NAME_MAX];
                    up[..raw.len()].copy_from_slice(raw);
                    up[..raw.len()].make_ascii_uppercase();
                    let key = &up[..raw.len()];
                    let name = match intern.get(key) {
                        Some(r) => r.clone(),
                        None => {
                            let r: std::rc::Rc<str> = String::from_utf8_lossy(key).into();
                            intern.insert(key.into(), r.clone());
                            r
                        }
                    };
                    names[n] = Some(name);
                    n += 1;
                }
            });
            if n == 0 {
                return;
            }
            let mut req = self.request_time(tid, ev.ts);
            // A client cannot have sent what it sends after a reply before that reply: for
            // synchronous clients this bounds the estimate tightly.
            if let Some(last) = self.last_reply.get(&key) {
                req = req.max((*last).min(ev.ts));
            }
            let (aof0, log0) = {
                let t = self.thread(tid);
                (t.aof_ns, t.log_ns)
            };
            // A new connection's first request, found by a wait that returned at once, may
            // have been queued since the connect: it waited for the accept too.
            let queued = self
                .thread(tid)
                .cur_wait
                .is_some_and(|(_, _, blocked)| !blocked);
            let req = match self.conn_open.remove(&key) {
                Some(t) if queued => req.min(t),
                _ => req,
            };
            let q = self.conns.entry(key).or_default();
            for name in names.into_iter().flatten() {
                self.cmd_seq += 1;
                if q.len() < 1024 {
                    q.push_back(PendingCmd {
                        seq: self.cmd_seq,
                        name,
                        req,
                        aof0,
                        log0,
                    });
                }
            }
        } else if is_write {
            let q = match self.conns.get_mut(&key) {
                Some(q) if !q.is_empty() => q,
                _ => return,
            };
            // One reply write answers every request read so far on this connection
            // (pipelined requests are answered together).
            let mut pending = std::mem::take(&mut self.answered);
            pending.extend(q.drain(..));
            self.last_reply.insert(key, end);
            let (aof1, log1) = {
                let t = self.thread(tid);
                (t.aof_ns, t.log_ns)
            };
            // Once a replica's PSYNC (or SYNC) is answered, the connection carries the
            // replication stream out and REPLCONF ACKs in, which are not requests and replies.
            let to_replica = pending.iter().any(|p| matches!(&*p.name, "PSYNC" | "SYNC"));
            for p in pending.drain(..) {
                let lat = end - p.req;
                let seg = self.segment;
                self.cmd_stats
                    .entry((p.name.clone(), seg))
                    .or_default()
                    .add(lat);
                let e = self
                    .cmd_all
                    .entry(p.name.clone())
                    .or_insert_with(|| (Agg::default(), 0, 0));
                e.0.add(lat);
                e.1 += aof1 - p.aof0;
                e.2 += log1 - p.log0;
                let d = DoneCmd {
                    seq: p.seq,
                    name: p.name.clone(),
                    conn: key,
                    req: p.req,
                    reply: end,
                };
                // Stalls already found that this command waited through.
                for (idx, id, max_end) in self.recent.iter().rev() {
                    if *max_end <= d.req {
                        break;
                    }
                    if let Some(c) = self.cands.get_mut(*idx) {
                        if c.id == *id {
                            hold(c, &d);
                        }
                    }
                }
                if self.done.len() == DONE_KEEP {
                    self.done.pop_front();
                }
                self.done.push_back(d);
            }
            self.answered = pending;
            if to_replica {
                self.fds.reclassify(key.0, key.1, FileClass::Replica);
                self.conns.remove(&key);
                self.last_reply.remove(&key);
            }
        }
    }

    /// When a request (or connection) read at `at` most likely arrived. A wait that blocked
    /// ended when the request arrived; one that returned at once means the request was
    /// already queued, at the latest since the previous wait ended.
    fn request_time(&mut self, tid: Tid, at: Nanos) -> Nanos {
        let first = self.first_ts.unwrap_or(at);
        let stamped_at_stops = self.opts.stamped_at_stops;
        let t = self.thread(tid);
        let req = match t.cur_wait {
            // Under ptrace the wait is seen to end only after the woken thread reached its
            // exit stop and the tracer ran: the request came about one round trip earlier.
            Some((s, e, true)) if stamped_at_stops => e - t.trip.ns.min(e - s),
            Some((_, e, true)) => e,
            // Returned at once with no earlier wait in the trace: queued since before the
            // trace began, as far as it can tell.
            Some((s, _, false)) => t.prev_wait_end.unwrap_or(first.min(s)),
            None => at,
        };
        req.min(at)
    }

    fn add_cand(&mut self, mut c: Cand) {
        // Commands already answered that waited through this stall.
        for d in self.done.iter().rev() {
            if d.reply < c.start {
                break;
            }
            hold(&mut c, d);
        }
        self.cand_seq += 1;
        c.id = self.cand_seq;
        let idx = if self.cands.len() < MAX_CANDS {
            self.cands.push(c);
            self.cands.len() - 1
        } else {
            // Full: the shortest kept stall makes room, or the new one is the shortest.
            self.cands_dropped += 1;
            match self.by_length.peek() {
                Some(std::cmp::Reverse((min_dur, min_idx))) if c.dur > *min_dur => {
                    let i = *min_idx;
                    self.by_length.pop();
                    self.cands[i] = c;
                    i
                }
                _ => return,
            }
        };
        self.by_length
            .push(std::cmp::Reverse((self.cands[idx].dur, idx)));
        if self.recent.len() == 64 {
            self.recent.pop_front();
        }
        let end = self.cands[idx].start + self.cands[idx].dur;
        let max_end = self.recent.back().map_or(end, |r| r.2.max(end));
        self.recent.push_back((idx, self.cand_seq, max_end));
        self.fresh.push(idx);
    }

    /// Stalls found since the last call (live printing). Roles are the current best guess.
    pub fn drain_new_stalls(&mut self, clock: &crate::source::Clock) -> Vec<Stall> {
        let fresh = std::mem::take(&mut self.fresh);
        let first = self.first_ts.unwrap_or(0);
        fresh
            .into_iter()
            .filter(|i| self.keep_cand(&self.cands[*i]))
            .map(|i| {
                let mut c = self.cands[i].clone();
                self.client_facing_only(&mut c);
                self.stall_of(&c, clock, first)
            })
            .collect()
    }

    /// Only the threads that serve clients hold them up: a child or bio thread's stall that
    /// overlaps a command did not delay it (had it, the main thread would have stalled too).
    fn client_facing_only(&self, c: &mut Cand) {
        if !matches!(self.role(c.tid), Role::Main | Role::IoThread) {
            c.waiting = 0;
            c.clients.clear();
            c.worst_wait = None;
            c.held.clear();
            c.by_cmd.clear();
        }
    }

    /// A redis trace without a single event-loop wait was filtered (`strace -e trace=...`):
    /// the time between two traced calls then hides untraced ones, so it is no gap.
    fn looks_filtered(&self) -> bool {
        self.syscalls >= 1000 && self.threads.values().all(|t| t.epoll == 0)
    }

    /// A trace with no short call at all was filtered by duration (`perf trace --duration`):
    /// redis makes calls of a few microseconds every 100 ms even when idle (serverCron reads
    /// /proc), so between two printed calls there were unprinted ones.
    fn duration_filter(&self) -> Option<Nanos> {
        (self.measured >= 20 && self.min_measured >= 100_000).then_some(self.min_measured)
    }

    /// Why gaps between syscalls cannot be trusted in this trace, if they cannot: a filtered
    /// trace, a clock coarser than the threshold (`-t` prints whole seconds), or `-r` times
    /// across threads (strace's relative time is per printed line, not per thread).
    pub(crate) fn gaps_unreliable(&self) -> Option<String> {
        if self.looks_filtered() {
            return Some("the trace looks filtered (-e trace=...)".into());
        }
        if let Some(min) = self.duration_filter() {
            return Some(format!(
                "no call in the trace is shorter than {}: it was filtered by duration \
                 (perf trace --duration), so calls are missing between the ones shown",
                findings::human(min / 1000)
            ));
        }
        let clock = self.clock.as_ref()?;
        let resolution = 10i64.pow(9u32.saturating_sub(clock.frac_digits as u32).min(9));
        let precise = clock.frac_digits > 0 || clock.wall_at_first.is_some();
        if !precise || resolution * 2 > self.opts.threshold_ns {
            return Some(format!(
                "timestamps have a resolution of {} (strace -t): use -tt or -ttt",
                findings::human(resolution / 1000)
            ));
        }
        if clock.fmt == crate::source::TimeFmt::Relative && !clock.perf && self.threads.len() > 1 {
            return Some(
                "-r times are relative to the previous line, not to the thread's previous call"
                    .into(),
            );
        }
        None
    }

    fn keep_cand(&self, c: &Cand) -> bool {
        let role = self.role(c.tid);
        match c.kind {
            // A gap is time no client's request can move: that holds for the main thread
            // (and a thread whose role is not known). A child's or a bio thread's gap is its
            // own work (saving, freeing memory for UNLINK/FLUSHALL ASYNC); io threads spin
            // without a syscall while they wait for the main thread's hand-off.
            StallKind::Gap => {
                matches!(role, Role::Main | Role::Other) && self.gaps_unreliable().is_none()
            }
            StallKind::SlowSyscall => !c.syscall.is_some_and(|n| is_idle(n, role)),
        }
    }

    fn stall_of(&self, c: &Cand, clock: &crate::source::Clock, first: Nanos) -> Stall {
        let info = c.file.map(|f| self.fds.file(f));
        let role = self.role(c.tid);
        let (finding, cause) = findings::explain(self, c, role);
        Stall {
            ts: clock.format(c.start),
            ts_iso: clock.iso(c.start),
            at_us: (c.start - first) / 1000,
            pid: if c.proc == u32::MAX {
                self.root_display()
            } else {
                c.proc
            },
            tid: c.tid,
            thread: role.as_str().to_string(),
            kind: c.kind,
            syscall: c.syscall.map(str::to_string),
            fd: c.fd,
            path: info.and_then(|i| i.path.as_deref().map(str::to_string)),
            class: info.map(|i| i.class.as_str().to_string()),
            duration_us: c.dur / 1000,
            line: c.line,
            cause,
            finding,
            bound: c.bound,
            in_flight: c.in_flight,
            waiting_commands: c.waiting,
            waiting_by_command: c.by_cmd.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            waiting_clients: c.clients.len() as u64,
            worst_wait_us: c.worst_wait.map(|w| w / 1000),
            phase: c.phase,
            events_lost: self.lost_events > 0,
        }
    }

    pub fn finish(mut self, info: SourceInfo, counters: Counters) -> Report {
        self.clock = Some(info.clock.clone());
        // Requests never answered before the trace ended waited through every stall after them.
        let end = self.last_ts;
        let unanswered: Vec<DoneCmd> = self
            .conns
            .iter()
            .flat_map(|(k, q)| {
                q.iter().map(|p| DoneCmd {
                    seq: p.seq,
                    name: p.name.clone(),
                    conn: *k,
                    req: p.req,
                    reply: end + 1,
                })
            })
            .collect();
        for d in &unanswered {
            for c in self.cands.iter_mut() {
                hold(c, d);
            }
        }
        let first = self.first_ts.unwrap_or(0);
        let mut clock = info.clock.clone();
        if clock.first == 0 {
            clock.first = first;
        }
        let mut r = Report {
            schema: report::SCHEMA,
            ..Default::default()
        };
        r.source = report::Source {
            kind: info.kind.to_string(),
            files: info.files.clone(),
            format: info.format.clone(),
            pid: info.pid.or(if self.root != u32::MAX {
                Some(self.root)
            } else {
                None
            }),
            clock: clock.describe().to_string(),
            backend: None,
        };
        let durations = match (self.measured, self.reconstructed) {
            (_, 0) => "measured",
            (0, _) => "reconstructed",
            _ => "mixed",
        };
        r.summary = report::Summary {
            lines: counters.lines,
            events: self.events,
            syscalls: self.syscalls,
            threads: self.threads.len() as u64,
            processes: self
                .threads
                .values()
                .map(|t| t.proc)
                .collect::<HashSet<_>>()
                .len() as u64,
            start: self.first_ts.map(|_| clock.format(first)),
            start_iso: clock.iso(first),
            span_us: (self.last_ts - first).max(0) / 1000,
            skipped_lines: counters.skips.total,
            durations: durations.to_string(),
            threshold_us: self.opts.threshold_ns / 1000,
            top: self.opts.top,
            stalls: 0,
            stalls_not_listed: 0,
            lost_events: self.lost_events,
            in_flight_at_end: self.in_flight_end,
            in_flight_at_start: self.in_flight_start,
        };
        r.skipped = counters
            .skips
            .first
            .iter()
            .map(|(file, line, reason, text)| report::Skipped {
                line: *line,
                reason: if info.files.len() > 1 {
                    format!("{file}: {reason}")
                } else {
                    reason.to_string()
                },
                text: text.clone(),
            })
            .collect();
        let mut merged: BTreeMap<&str, Agg> = BTreeMap::new();
        for (n, a) in self.by_name.values() {
            merged.entry(n).or_default().merge(a);
        }
        r.syscalls = merged
            .iter()
            .map(|(n, a)| report::SyscallStats {
                name: n.to_string(),
                calls: a.count,
                errors: a.errors,
                total_us: a.total_us(),
                p50_us: a.pct_us(0.5),
                p99_us: a.pct_us(0.99),
                max_us: a.max_us(),
            })
            .collect();
        r.syscalls
            .sort_by(|a, b| b.total_us.cmp(&a.total_us).then(a.name.cmp(&b.name)));
        let root_display = self.root_display();
        let show_pid = |p: u32| if p == u32::MAX { root_display } else { p };
        r.fds = self
            .by_file
            .iter()
            .map(|(f, a)| {
                let i = self.fds.file(*f);
                report::FdStats {
                    pid: show_pid(i.pid),
                    fd: i.fd,
                    path: i.path.as_deref().map(str::to_string),
                    class: i.class.as_str().to_string(),
                    calls: a.count,
                    total_us: a.total_us(),
                    p50_us: a.pct_us(0.5),
                    p99_us: a.pct_us(0.99),
                    max_us: a.max_us(),
                }
            })
            .collect();
        r.fds
            .sort_by(|a, b| b.total_us.cmp(&a.total_us).then(a.fd.cmp(&b.fd)));
        r.slowest = self
            .slowest
            .iter()
            .take(self.opts.top)
            .map(|s| {
                let fi = s.file.map(|f| self.fds.file(f));
                report::SlowCall {
                    ts: clock.format(s.ts),
                    at_us: (s.ts - first) / 1000,
                    pid: show_pid(s.proc),
                    tid: s.tid,
                    thread: self.role(s.tid).as_str().to_string(),
                    syscall: s.name.to_string(),
                    fd: s.fd,
                    path: fi.and_then(|i| i.path.as_deref().map(str::to_string)),
                    class: fi.map(|i| i.class.as_str().to_string()),
                    duration_us: s.dur / 1000,
                    line: (s.line != 0).then_some(s.line),
                    bound: s.bound,
                }
            })
            .collect();
        if let Some(floor) = self.opts.timeline_floor_ns {
            let mut calls: Vec<report::TimelineCall> = self
                .timeline
                .values()
                .flat_map(|t| t.calls.values())
                .map(|s| {
                    let fi = s.file.map(|f| self.fds.file(f));
                    report::TimelineCall {
                        at_us: (s.ts - first) / 1000,
                        pid: show_pid(s.proc),
                        tid: s.tid,
                        syscall: s.name.to_string(),
                        fd: s.fd,
                        path: fi.and_then(|i| i.path.as_deref().map(str::to_string)),
                        class: fi.map(|i| i.class.as_str().to_string()),
                        duration_us: s.dur / 1000,
                        bound: s.bound,
                        line: if s.line == 0 { None } else { Some(s.line) },
                    }
                })
                .collect();
            calls.sort_by_key(|c| (c.at_us, c.tid));
            r.timeline = Some(report::Timeline {
                floor_us: floor / 1000,
                max_per_thread: report::TIMELINE_MAX_PER_THREAD,
                dropped: self.timeline.values().map(|t| t.dropped).sum(),
                calls,
            });
        }
        // Threads.
        let mut tids: Vec<Tid> = self.threads.keys().copied().collect();
        tids.sort();
        r.threads = tids
            .iter()
            .map(|t| report::ThreadInfo {
                pid: show_pid(self.threads[t].proc),
                tid: *t,
                role: self.role(*t).as_str().to_string(),
                name: self.threads[t].name.clone(),
                why: self.role_why(*t),
                syscalls: self.threads[t].calls,
            })
            .collect();
        // Phases.
        r.phases = self
            .phases
            .iter()
            .map(|p| report::Phase {
                kind: phase_kind(p, &self).to_string(),
                child_pid: p.child,
                start_at_us: (p.start - first) / 1000,
                end_at_us: p.end.map(|e| (e - first) / 1000),
                fork_us: p.fork_ns.map(|f| f / 1000),
                ts: clock.format(p.start),
                ended_by: p.ended_by.map(str::to_string),
                wrote: p.wrote.iter().map(|c| c.as_str().to_string()).collect(),
            })
            .collect();
        for i in 0..self.phases.len() {
            let seg = |s: usize| {
                self.main_file_seg
                    .get(&s)
                    .map(|a| a.dist())
                    .unwrap_or_default()
            };
            r.phase_stats.push(report::PhaseStats {
                phase: i,
                what: "main_file_syscalls".into(),
                before: seg(2 * i),
                during: seg(2 * i + 1),
                after: seg(2 * i + 2),
            });
            let names: Vec<std::rc::Rc<str>> = self.cmd_all.keys().cloned().collect();
            for n in names {
                let d = |s: usize| {
                    self.cmd_stats
                        .get(&(n.clone(), s))
                        .map(|a| a.dist())
                        .unwrap_or_default()
                };
                r.phase_stats.push(report::PhaseStats {
                    phase: i,
                    what: format!("command:{n}"),
                    before: d(2 * i),
                    during: d(2 * i + 1),
                    after: d(2 * i + 2),
                });
            }
        }
        // Commands: all, and before/during/after the longest phase.
        let main_phase = self
            .phases
            .iter()
            .enumerate()
            .max_by_key(|(_, p)| p.end.unwrap_or(self.last_ts) - p.start)
            .map(|(i, _)| i);
        for (n, (a, aof, log)) in &self.cmd_all {
            r.commands.push(report::CommandStats {
                command: n.to_string(),
                phase: "all".into(),
                calls: a.count,
                p50_us: a.pct_us(0.5),
                p99_us: a.pct_us(0.99),
                max_us: a.max_us(),
                aof_us: aof / 1000,
                log_us: log / 1000,
            });
            if let Some(i) = main_phase {
                for (label, s) in [
                    ("before", 2 * i),
                    ("during", 2 * i + 1),
                    ("after", 2 * i + 2),
                ] {
                    if let Some(a) = self.cmd_stats.get(&(n.clone(), s)) {
                        r.commands.push(report::CommandStats {
                            command: n.to_string(),
                            phase: label.into(),
                            calls: a.count,
                            p50_us: a.pct_us(0.5),
                            p99_us: a.pct_us(0.99),
                            max_us: a.max_us(),
                            aof_us: 0,
                            log_us: 0,
                        });
                    }
                }
            }
        }
        r.commands
            .sort_by(|a, b| b.calls.cmp(&a.calls).then(a.command.cmp(&b.command)));
        // Idle.
        // In role order: the main thread's waits first.
        let mut idle: BTreeMap<(Role, &'static str), (u64, i64)> = BTreeMap::new();
        for (tid, t) in self.threads.iter() {
            let role = self.role(*tid);
            for (name, (n, d)) in t.idle.iter().filter(|(name, _)| is_idle(name, role)) {
                let e = idle.entry((role, name)).or_default();
                e.0 += n;
                e.1 += d;
            }
        }
        r.idle = idle
            .into_iter()
            .map(|((role, syscall), (calls, total))| report::IdleStats {
                role: role.as_str().to_string(),
                syscall: syscall.to_string(),
                calls,
                total_us: total / 1000,
            })
            .collect();
        // Stalls.
        let mut cands: Vec<Cand> = self
            .cands
            .iter()
            .filter(|c| self.keep_cand(c))
            .cloned()
            .collect();
        for c in &mut cands {
            self.client_facing_only(c);
        }
        let mut stalls: Vec<(Cand, Stall)> = cands
            .into_iter()
            .map(|c| {
                let s = self.stall_of(&c, &clock, first);
                (c, s)
            })
            .collect();
        stalls.sort_by_key(|(c, _)| (c.start, c.tid));
        r.in_flight = self
            .in_flight_small
            .iter()
            .filter(|c| self.keep_cand(c))
            .map(|c| self.stall_of(c, &clock, first))
            .collect();
        r.summary.stalls = stalls.len() as u64 + self.cands_dropped;
        r.summary.stalls_not_listed = self.cands_dropped;
        r.incidents = incidents(&stalls, &clock, first);
        let (cands, stalls): (Vec<Cand>, Vec<Stall>) = stalls.into_iter().unzip();
        r.stalls = stalls;
        r.findings = findings::findings(&self, &cands, &r);
        for inc in &mut r.incidents {
            inc.finding = inc
                .stalls
                .iter()
                .filter_map(|i| r.stalls[*i].finding.clone())
                .next();
        }
        r
    }
}

/// A command counts as held by a stall if its request was in (read or queued) before the
/// stall ended and its reply went out after the stall began.
fn hold(c: &mut Cand, d: &DoneCmd) {
    let (s, e) = (c.start, c.start + c.dur);
    if d.req < e && d.reply > s {
        c.waiting += 1;
        if c.clients.len() < 4096 && !c.clients.contains(&d.conn) {
            c.clients.push(d.conn);
        }
        let w = d.reply - d.req;
        c.worst_wait = Some(c.worst_wait.map_or(w, |x| x.max(w)));
        if c.held.len() < 4096 {
            c.held.push(d.seq);
        }
        match c.by_cmd.iter_mut().find(|(n, _)| *n == d.name) {
            Some(e) => e.1 += 1,
            None => c.by_cmd.push((d.name.clone(), 1)),
        }
    }
}

fn phase_kind(p: &PhaseState, a: &Analyzer) -> &'static str {
    if p.wrote.contains(&FileClass::AofRewriteTemp) {
        return "aof_rewrite";
    }
    if p.wrote.contains(&FileClass::RdbTemp) || p.wrote.contains(&FileClass::Rdb) {
        return "bgsave";
    }
    if let Some(h) = p.kind_hint {
        return h;
    }
    // The child was not traced: no AOF in use means it can only be an RDB save.
    let aof_in_use = a.fds.files().iter().any(|f| f.class == FileClass::Aof);
    let conf_aof = a.opts.redis_conf.as_ref().and_then(|c| c.appendonly);
    if conf_aof == Some(false) || (conf_aof.is_none() && !aof_in_use) {
        return "bgsave";
    }
    "child"
}

/// Overlapping stalls merged: what clients saw as one freeze.
fn incidents(
    stalls: &[(Cand, Stall)],
    clock: &crate::source::Clock,
    first: Nanos,
) -> Vec<report::Incident> {
    // Each incident with the distinct commands and connections its stalls held.
    type Open = (report::Incident, HashSet<u64>, HashSet<(u32, i32)>);
    let mut out: Vec<Open> = vec![];
    for (i, (c, s)) in stalls.iter().enumerate() {
        let (start, end) = (c.start, c.start + c.dur);
        let merge = out
            .last()
            .is_some_and(|(inc, _, _)| start < first + inc.end_at_us * 1000);
        if !merge {
            out.push((
                report::Incident {
                    start_at_us: (start - first) / 1000,
                    end_at_us: (end - first) / 1000,
                    ts: clock.format(start),
                    duration_us: 0,
                    stalls: vec![],
                    waiting_commands: 0,
                    waiting_clients: 0,
                    worst_wait_us: None,
                    finding: None,
                },
                HashSet::default(),
                HashSet::default(),
            ));
        }
        let (inc, held, clients) = out.last_mut().expect("pushed above");
        inc.end_at_us = inc.end_at_us.max((end - first) / 1000);
        inc.stalls.push(i);
        held.extend(c.held.iter().copied());
        clients.extend(c.clients.iter().copied());
        inc.worst_wait_us = match (inc.worst_wait_us, s.worst_wait_us) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    out.into_iter()
        .map(|(mut inc, held, clients)| {
            inc.duration_us = inc.end_at_us - inc.start_at_us;
            inc.waiting_commands = held.len() as u64;
            inc.waiting_clients = clients.len() as u64;
            inc
        })
        .collect()
}

/// Reads a thread-name file. Accepted shapes, mixed freely with blank and `# comment` lines:
/// - `TID NAME` lines (what `stallscope attach --record` writes beside a recording);
/// - `ps` or `top -H` output with its header: the tid is the `LWP`, `TID` or `SPID` column
///   (else `PID`, which is the tid in `top -H`), the name is everything from the `CMD`,
///   `COMMAND` or `COMM` column on, so `ps -L -p PID`, `ps -T -p PID` and
///   `ps -L -o tid,comm -p PID` all read right;
/// - `grep . /proc/PID/task/*/comm`: `/proc/PID/task/TID/comm:NAME`.
pub fn parse_thread_names(text: &str) -> HashMap<Tid, String> {
    let mut m = HashMap::default();
    // (tid column, name column) from the last header line seen.
    let mut columns: Option<(usize, usize)> = None;
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        if let Some((tid, name)) = proc_comm_line(l) {
            m.insert(tid, name.to_string());
            continue;
        }
        let cols: Vec<&str> = l.split_whitespace().collect();
        if cols[0].parse::<Tid>().is_err() {
            columns = header_columns(&cols).or(columns);
            continue;
        }
        let headerless_pid_tid = cols.len() >= 3 && cols[1].parse::<Tid>().is_ok();
        let (tid_col, name_col) =
            columns.unwrap_or(if headerless_pid_tid { (1, 2) } else { (0, 1) });
        let tid = cols.get(tid_col).and_then(|c| c.parse::<Tid>().ok());
        if let (Some(tid), Some(_)) = (tid, cols.get(name_col)) {
            m.insert(tid, cols[name_col..].join(" "));
        }
    }
    m
}

fn header_columns(cols: &[&str]) -> Option<(usize, usize)> {
    let find = |names: &[&str]| {
        cols.iter()
            .position(|c| names.iter().any(|n| c.eq_ignore_ascii_case(n)))
    };
    let tid = find(&["LWP", "TID", "SPID"]).or_else(|| find(&["PID"]))?;
    let name = find(&["CMD", "COMMAND", "COMM"])?;
    Some((tid, name))
}

/// `/proc/PID/task/TID/comm:NAME`, as `grep . /proc/PID/task/*/comm` prints it.
fn proc_comm_line(l: &str) -> Option<(Tid, &str)> {
    let (path, name) = l.split_once("/comm:")?;
    let tid = path.rsplit_once("/task/")?.1.parse().ok()?;
    Some((tid, name.trim()))
}

#[cfg(test)]
mod tests;
