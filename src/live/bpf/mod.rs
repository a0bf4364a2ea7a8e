//! The bpf backend of `attach`: kernel programs on the `raw_syscalls` and `sched` process
//! tracepoints (bpf/stallscope.bpf.c, embedded as a compiled object and loaded with aya),
//! turned into the same `Event`s as the perf and ptrace backends and the text sources.
//!
//! Why this shape: the programs filter by process in the kernel (a map of traced tgids, to
//! which a traced process's forked children are added as they are created, so threads and
//! children are followed from their first instruction), pair each call's entry and exit
//! there, and copy the first bytes of read and write buffers while the call's thread is
//! still in the kernel (`bpf_probe_read_user`), so command names are known without
//! stopping redis. One record per call goes through one BPF ring buffer, shared by every
//! CPU and ordered by when calls ended; records that find it full are counted in the kernel
//! (`drops`) and reported like the perf backend's lost records. A reader thread empties
//! the ring into memory so a slow analysis never makes the kernel drop. Calls still running
//! when tracing ends are read from the in-flight map.
//!
//! What it cannot see: signals (no signal tracepoint is attached), and paths of `open`-like
//! calls are read from the process's memory when the record is processed, as the perf
//! backend does.

mod arrivals;
pub mod cheap;
mod load;
mod ring;
pub(crate) mod shared;

use super::decode::{self, blocked_in_call, nr_info, Args};
use super::fed::Fed;
use super::reader::Reader;
use super::{AttachError, Tracer, TracerStats};
use crate::clock::{now_mono, now_wall};
use crate::event::{self, Data, Event, EventKind, InFlight, Nanos, Syscall, Tid};
use anyhow::Result;
use load::{errno_of, load_error, Link};
use ring::BpfRing;
use rustc_hash::FxHashMap;
pub use shared::BpfHost;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// The compiled programs (scripts/build-bpf.sh; .ci/run checks they match the source).
static OBJECT: &[u8] = aya::include_bytes_aligned!("../../../bpf/stallscope.bpf.o");

/// Default ring size in pages: 32 MiB holds about 250,000 calls (~130 bytes each), most of
/// a second of a saturated redis, while the reader empties it every few ms.
pub const DEFAULT_PAGES: usize = 8192;

/// Set to 1 to make the loader submit a program the verifier refuses (tests of the error
/// path and of `--backend auto`'s fallback; the refusal and its message are the kernel's).
pub const REFUSE_ENV: &str = "STALLSCOPE_BPF_TEST_REFUSE";

/// Set to 1 to run the classic tracepoint programs even where the tp_btf ones load (tests
/// of the fallback that kernels without BTF take).
pub const CLASSIC_ENV: &str = "STALLSCOPE_BPF_CLASSIC";

/// For measurement only (bench/bpf_decompose.sh), never for a report: `discard` makes the
/// reader empty the ring and throw the records away (counted by kind, said on stderr at the
/// end) instead of handing them to the analysis, so a benchmark sees what the kernel programs
/// and the ring cost without stallscope's decoding and analysis; `filter` also makes the
/// programs of the traced process's syscalls and receives return right after the process
/// filter (the cost of running them for every task of the machine, and nothing else). The
/// report of such a run has no calls in it.
pub const MEASURE_ENV: &str = "STALLSCOPE_BPF_MEASURE";

#[derive(Clone, Copy, PartialEq)]
enum Measure {
    Off,
    Discard,
    FilterOnly,
}

fn measure_mode() -> Result<Measure, AttachError> {
    match std::env::var(MEASURE_ENV).as_deref() {
        Err(_) | Ok("") => Ok(Measure::Off),
        Ok("discard") => Ok(Measure::Discard),
        Ok("filter") => Ok(Measure::FilterOnly),
        Ok(v) => Err(AttachError::Other(format!(
            "{MEASURE_ENV}={v}: expected discard or filter (benchmarks only)"
        ))),
    }
}

// Record kinds and syscall kinds, as in bpf/stallscope.bpf.c.
const REC_CALL: u32 = 1;
const REC_ENTER_ONLY: u32 = 2;
const REC_EXIT_ONLY: u32 = 3;
const REC_FORK: u32 = 4;
const REC_TASK_EXIT: u32 = 5;
const NR_MAX: i64 = 1024;
const NR_READ: u32 = 1;
const NR_WRITE: u32 = 2;
const NR_CLONE: u32 = 3;
const NR_CLONE3: u32 = 4;
/// Size of a record without its data bytes.
const REC_LEN: usize = 208;
/// The counters of `struct sched_snap`: on CPU ns, runnable ns, minor and major faults, ns
/// waited while the cgroup was throttled, ns spent reclaiming memory.
pub(super) const SNAP: usize = 6;
const DATA_MAX: usize = 64;

#[derive(Clone, Debug)]
pub struct BpfConfig {
    pub pid: Tid,
    /// Trace forked children (the BGSAVE / AOF rewrite child).
    pub follow_forks: bool,
    /// Ring-buffer size in pages (a power of two).
    pub pages: usize,
}

/// A call in progress, as the kernel keeps it in `inflight`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KEntry {
    ts: u64,
    nr: i64,
    args: [u64; 6],
    sched: [u64; SNAP],
    arrival_first: u64,
    arrival_at: u64,
}
// SAFETY: plain old data, the layout of `struct entry` in the C source.
unsafe impl aya::Pod for KEntry {}

/// The attached process and whether it has forked children in `tgids` (`struct target`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KTarget {
    tgid: u32,
    children: u32,
}
// SAFETY: plain old data, the layout of `struct target` in the C source.
unsafe impl aya::Pod for KTarget {}

/// One ring record, copied out of the ring. Laid out as the kernel's `struct rec_data`
/// (`repr(C)`, every field an integer), so that the reader copies a record out in one move
/// (`push_parsed`) instead of field by field into a value that is then moved again.
#[derive(Clone, Copy)]
#[repr(C)]
struct Rec {
    kind: u32,
    tid: Tid,
    tgid: Tid,
    /// Bytes of `data` filled (at most `DATA_MAX`).
    data_len: u32,
    nr: i64,
    ret: i64,
    enter_ns: Nanos,
    exit_ns: Nanos,
    args: [u64; 6],
    /// The thread's scheduler counters (`SNAP`) at entry and at exit.
    sched_enter: [u64; SNAP],
    sched_exit: [u64; SNAP],
    /// The arrival a receive inside the call took, carried in the call's own record:
    /// (stamp, when the receive ended); `arrival_at` 0 if none (arrivals.rs).
    arrival_first: Nanos,
    arrival_at: Nanos,
    data: [u8; DATA_MAX],
}

// The layout `push_parsed` copies into: that of `struct rec_data` in the C source.
const _: () = {
    assert!(std::mem::offset_of!(Rec, data_len) == 12);
    assert!(std::mem::offset_of!(Rec, nr) == 16);
    assert!(std::mem::offset_of!(Rec, args) == 48);
    assert!(std::mem::offset_of!(Rec, sched_enter) == 96);
    assert!(std::mem::offset_of!(Rec, sched_exit) == 144);
    assert!(std::mem::offset_of!(Rec, arrival_first) == 192);
    assert!(std::mem::offset_of!(Rec, arrival_at) == 200);
    assert!(std::mem::offset_of!(Rec, data) == REC_LEN);
    assert!(std::mem::size_of::<Rec>() == REC_LEN + DATA_MAX);
};

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

#[cfg(test)]
fn parse(b: &[u8]) -> Option<Rec> {
    let mut v = Vec::with_capacity(1);
    push_parsed(b, &mut v);
    v.pop()
}

/// Appends ring record `b` to `batch` (which has room for it), copied in place: a call
/// record in one move of its bytes, an arrival record by `arrivals::parse`. Nothing is
/// appended for a record too short to be either.
#[inline(always)]
fn push_parsed(b: &[u8], batch: &mut Vec<Rec>) {
    if b.len() >= 4 && u32_at(b, 0) == arrivals::REC_ARRIVAL {
        if let Some(r) = arrivals::parse(b) {
            batch.push(r);
        }
        return;
    }
    if b.len() < REC_LEN {
        return;
    }
    batch.reserve(1);
    let size = std::mem::size_of::<Rec>();
    let n = b.len().min(size);
    let slot = batch.spare_capacity_mut()[0].as_mut_ptr();
    // SAFETY: `slot` is the vector's first unused element, room for one `Rec`; `Rec` is
    // `repr(C)` with only integer fields and no padding (the layout assertions above), so
    // any bytes are a valid value once all `size` of them are written: `n` from the
    // record, the rest (a data copy shorter than `DATA_MAX`) zeroed.
    unsafe {
        let p = slot.cast::<u8>();
        std::ptr::copy_nonoverlapping(b.as_ptr(), p, n);
        std::ptr::write_bytes(p.add(n), 0, size - n);
        let r = &mut *slot;
        r.data_len = r.data_len.min((n - REC_LEN) as u32);
        batch.set_len(batch.len() + 1);
    }
}

/// What the kernel programs need to know of a syscall number: whether its buffer is
/// filled by the kernel (read, pread64, recvfrom) or by the process (write, pwrite64,
/// sendto), and where a clone keeps its flags, by the syscall table.
fn kernel_kind(sys: &crate::syscalls::SysInfo) -> u32 {
    use crate::syscalls::{ArgKind, DataArg};
    match (sys.args, sys.data) {
        (ArgKind::Data, DataArg::In) => NR_READ,
        (ArgKind::Data, DataArg::Out) => NR_WRITE,
        (ArgKind::Clone, _) => NR_CLONE,
        (ArgKind::Clone3, _) => NR_CLONE3,
        _ => 0,
    }
}

struct Thread {
    tgid: Tid,
    /// Traced since the attach: its first record may be the exit of a call already running.
    from_attach: bool,
    seen: bool,
    /// The call it slept in at the attach (from /proc): its arguments, for when it returns.
    at_attach: Option<(i64, [u64; 6])>,
    /// Its scheduler counters at the attach (from /proc): the split of that call from then.
    sched_at_attach: Option<[u64; SNAP]>,
    /// Its scheduler counters when its last call ended.
    last_exit: Option<[u64; SNAP]>,
}

impl Thread {
    fn new(tgid: Tid, from_attach: bool) -> Self {
        Thread {
            tgid,
            from_attach,
            seen: false,
            at_attach: None,
            sched_at_attach: None,
            last_exit: None,
        }
    }
}

/// Which of the optional programs run: their parts of a split are measured, else unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Extras {
    /// The throttle programs: the wait for a CPU while the cgroup was throttled.
    pub throttle: bool,
    /// The reclaim programs: the time spent reclaiming memory.
    pub reclaim: bool,
}

/// `super::sched_delta` of the bpf counters, with the throttled and reclaim parts where
/// their programs run.
fn delta(from: &[u64; SNAP], to: &[u64; SNAP], x: Extras) -> event::SchedDelta {
    let four = |a: &[u64; SNAP]| [a[0], a[1], a[2], a[3]];
    let mut d = super::sched_delta(&four(from), &four(to));
    d.throttled_ns = x.throttle.then(|| to[4].saturating_sub(from[4]));
    d.reclaim_ns = x.reclaim.then(|| to[5].saturating_sub(from[5]));
    d
}

/// /proc's counters (`super::sched_counters`) in the programs' order: the throttled and
/// reclaim times count from the attach, where the programs' own counts start.
fn counters_now(tgid: Tid, tid: Tid) -> Option<[u64; SNAP]> {
    super::sched_counters(tgid, tid).map(|c| [c[0], c[1], c[2], c[3], 0, 0])
}

/// Where a tracer's records come from: a ring of its own, or its route from a shared one.
enum Feed {
    Own(Reader<BpfRing>),
    Shared(shared::Route),
}

impl Feed {
    #[inline]
    fn next(&self, wait: Duration) -> Option<Vec<Rec>> {
        match self {
            Feed::Own(r) => r.next(wait),
            Feed::Shared(r) => r.next(wait),
        }
    }

    #[inline]
    fn give_back(&self, batch: Vec<Rec>) {
        if let Feed::Own(r) = self {
            r.give_back(batch);
        }
    }
}

pub struct BpfTracer {
    cfg: BpfConfig,
    bpf: Option<aya::Ebpf>,
    links: Vec<(&'static str, Link)>,
    /// The thread that empties the ring into batches of records, or this process's route
    /// from the ring that every watched process shares.
    reader: Feed,
    /// The batch being processed, and how far (`take_records` stops part way).
    part: Vec<Rec>,
    part_at: usize,
    // Fx: looked up once per record (SipHash was a visible part of the tracer's CPU).
    threads: FxHashMap<Tid, Thread>,
    /// New tasks, with whether they are threads, from the fork records.
    forked: FxHashMap<Tid, bool>,
    exit_codes: FxHashMap<Tid, i32>,
    /// The kernel's count of dropped records when last read.
    drops_seen: u64,
    /// The events ready, the counts, where tracing is (shared with the perf backend).
    fed: Fed,
    pub threads_at_attach: u32,
    /// When the requests that socket reads return arrived (arrivals.rs).
    arrivals: arrivals::Arrivals,
    /// Which optional programs run: calls' splits carry the throttled and reclaim times.
    extras: Extras,
}

impl BpfTracer {
    /// Loads and attaches the programs, then starts tracing every thread of `cfg.pid` at
    /// once (putting its tgid in the filter map).
    pub fn attach(cfg: BpfConfig) -> Result<Self, AttachError> {
        super::check_target(cfg.pid)?;
        let measure = measure_mode()?;
        let ring_bytes = (cfg.pages * crate::live::page_size()) as u32;
        let arrival_layout = arrivals::layout();
        let listening = arrivals::Listening::of(cfg.pid);
        let mut bpf = load::load(&cfg, measure, ring_bytes, &arrival_layout, &listening)?;
        let btf = load::kernel_btf();
        let (links, arrivals, extras) =
            load::attach_programs(&mut bpf, &arrival_layout, &listening, &btf)?;
        drop(btf);
        if measure != Measure::Off {
            eprintln!("stallscope: {MEASURE_ENV} is set: records are discarded, this run reports nothing (measurement only)");
        }
        let ring = bpf
            .take_map("events")
            .ok_or_else(|| AttachError::Other("the BPF object lacks events".into()))?;
        let ring = aya::maps::RingBuf::try_from(ring)
            .map_err(|e| load_error("cannot map the BPF ring buffer", &e, errno_of(&e)))?;
        let ring = BpfRing::new(ring, ring_bytes as usize, measure != Measure::Off)
            .map_err(|e| AttachError::Other(format!("cannot map the BPF ring buffer: {e}")))?;
        let reader = Reader::start("stallscope-bpf", ring)
            .map_err(|e| AttachError::Other(format!("cannot start the ring reader: {e}")))?;
        let mut me = BpfTracer {
            cfg,
            bpf: Some(bpf),
            links,
            reader: Feed::Own(reader),
            part: vec![],
            part_at: 0,
            threads: FxHashMap::default(),
            forked: FxHashMap::default(),
            exit_codes: FxHashMap::default(),
            drops_seen: 0,
            fed: Fed::new(),
            threads_at_attach: 0,
            arrivals: arrivals::Arrivals::default(),
            extras,
        };
        me.fed.pidns = super::container::PidNs::of(me.cfg.pid);
        me.arrivals
            .started(arrivals.map(|_| ()), &mut me.fed.warnings);
        me.start_tracing()?;
        Ok(me)
    }

    /// Starts tracing `cfg.pid` with the programs of `host`, which every watched process
    /// shares: its tgid goes into their map and its records come through its route.
    pub fn on_host(host: &BpfHost, cfg: BpfConfig) -> Result<Self, AttachError> {
        super::check_target(cfg.pid)?;
        let route = shared::Route::open(&host.inner, cfg.pid)?;
        let mut me = BpfTracer {
            cfg,
            bpf: None,
            links: vec![],
            reader: Feed::Shared(route),
            part: vec![],
            part_at: 0,
            threads: FxHashMap::default(),
            forked: FxHashMap::default(),
            exit_codes: FxHashMap::default(),
            drops_seen: 0,
            fed: Fed::new(),
            threads_at_attach: 0,
            arrivals: arrivals::Arrivals::default(),
            extras: host.inner.extras,
        };
        me.cfg.pages = host.inner.pages;
        me.arrivals.started(
            host.inner.arrivals.clone().map(|_| ()),
            &mut me.fed.warnings,
        );
        // What the kernel dropped before this process was traced is not its loss.
        me.drops_seen = me.with_bpf(read_drop_total).flatten().unwrap_or(0);
        me.fed.stats.attach_mono = now_mono();
        me.fed.stats.attach_wall = now_wall();
        me.take_threads()?;
        Ok(me)
    }

    /// Runs `f` on the loaded object: this tracer's own, or the shared host's (locked).
    fn with_bpf<T>(&self, f: impl FnOnce(&aya::Ebpf) -> T) -> Option<T> {
        match (&self.bpf, &self.reader) {
            (Some(b), _) => Some(f(b)),
            (None, Feed::Shared(r)) => {
                Some(f(&r.host().bpf.lock().unwrap_or_else(|e| e.into_inner())))
            }
            (None, Feed::Own(_)) => None,
        }
    }

    /// Puts the process in the filter map, and takes its threads from /proc with the call
    /// each sleeps in now (the programs see no entry of those).
    fn start_tracing(&mut self) -> Result<(), AttachError> {
        let pid = self.cfg.pid;
        self.fed.stats.attach_mono = now_mono();
        self.fed.stats.attach_wall = now_wall();
        load::start_tracing(self.bpf.as_mut().expect("loaded"), pid)?;
        self.take_threads()
    }

    /// The process's threads from /proc, with the call each sleeps in now (the programs
    /// see no entry of those), and the attach event.
    fn take_threads(&mut self) -> Result<(), AttachError> {
        let pid = self.cfg.pid;
        let tids = match super::list_tasks(pid) {
            Ok(t) if !t.is_empty() => t,
            _ => return Err(AttachError::NoSuchPid(pid)),
        };
        for tid in &tids {
            let th = Thread {
                at_attach: blocked_in_call(*tid),
                sched_at_attach: counters_now(pid, *tid),
                ..Thread::new(pid, true)
            };
            self.threads.insert(*tid, th);
        }
        self.threads_at_attach = tids.len() as u32;
        self.fed.queue.push_back(Event {
            tid: pid,
            ts: self.fed.stats.attach_mono,
            line: 0,
            kind: EventKind::Attach {
                threads: Some(self.threads_at_attach),
            },
        });
        Ok(())
    }

    /// Pushes the event of call record `r` onto the queue, built where it is kept (built on
    /// the stack and moved, each ~300-byte event was copied twice more), with the
    /// scheduler's split `sched`; `sc_of_back` then reaches it.
    fn build(
        &mut self,
        r: &Rec,
        ret: Option<i64>,
        args_known: bool,
        sched: Option<Box<event::SchedSpan>>,
    ) {
        let info = nr_info(r.nr);
        self.fed.queue.push_back(Event {
            tid: r.tid,
            ts: r.enter_ns,
            line: 0,
            kind: EventKind::Syscall(Syscall::with(info.name, info.sys)),
        });
        let ret = self.fed.pidns.host_ret(info.sys, ret, r.tgid);
        let sc = sc_of_back(&mut self.fed.queue);
        sc.sched = sched;
        let args = if args_known {
            Args::Late {
                args: &r.args,
                tgid: r.tgid,
                forked: &self.forked,
            }
        } else {
            Args::Unknown
        };
        decode::call(sc, &info, ret, r.exit_ns - r.enter_ns, args);
        if args_known && r.data_len > 0 {
            let avail = if kernel_kind(info.sys) == NR_READ {
                sc.ret.val().unwrap_or(0).max(0) as u64
            } else {
                r.args[2]
            };
            let n = r.data_len as usize;
            Data::put_bytes(&mut sc.extra, &r.data[..n], avail > n as u64);
        }
    }

    fn count(&mut self, tid: Tid, dur: Option<Nanos>) {
        self.fed.count(tid, self.cfg.pid, dur);
    }

    /// Turns one record into its events. Per record: the other kinds than a whole call
    /// (`REC_CALL`) are rare and each has its function.
    #[inline]
    fn process(&mut self, r: &Rec) {
        if r.kind == arrivals::REC_ARRIVAL {
            self.arrivals.on_record(r);
            return;
        }
        let tid = r.tid;
        let x = self.extras;
        let th = self
            .threads
            .entry(tid)
            .or_insert_with(|| Thread::new(r.tgid, false));
        let first = !th.seen && th.from_attach;
        let at_attach = th.at_attach.take();
        let sched_at_attach = th.sched_at_attach.take();
        // What the scheduler did in the call, and in the gap since the thread's last call.
        let sched = (r.kind == REC_CALL || r.kind == REC_ENTER_ONLY).then(|| {
            self.fed.spans.boxed(event::SchedSpan {
                during: delta(&r.sched_enter, &r.sched_exit, x),
                before: th.last_exit.map(|l| delta(&l, &r.sched_enter, x)),
            })
        });
        if matches!(r.kind, REC_CALL | REC_EXIT_ONLY) {
            th.last_exit = Some(r.sched_exit);
        }
        if matches!(r.kind, REC_CALL | REC_ENTER_ONLY | REC_EXIT_ONLY) {
            th.seen = true;
        }
        match r.kind {
            REC_CALL => {
                self.build(r, Some(r.ret), true, sched);
                self.arrivals.date(r, sc_of_back(&mut self.fed.queue));
                self.count(tid, Some(r.exit_ns - r.enter_ns));
            }
            REC_ENTER_ONLY => self.on_enter_only(r, sched),
            // Otherwise the child's side of a clone (returns 0 with no entry).
            REC_EXIT_ONLY if first => self.on_running_at_attach(r, at_attach, sched_at_attach),
            REC_FORK => self.on_fork(r),
            REC_TASK_EXIT => self.on_task_exit(r),
            _ => {}
        }
    }

    /// A call that never returned (exit, exit_group, or the task ended inside it): known
    /// from its entry to when that was seen.
    fn on_enter_only(&mut self, r: &Rec, sched: Option<Box<event::SchedSpan>>) {
        if nr_info(r.nr).sys.facts.has(crate::syscalls::Facts::EXIT) {
            self.exit_codes.insert(r.tid, r.args[0] as i32);
        }
        self.build(r, None, true, sched);
        self.count(r.tid, None);
    }

    /// The exit of a call that was running at the attach: timed from the attach, its
    /// arguments known if /proc showed the thread sleeping in this call then (`at_attach`),
    /// the scheduler's split from the counters /proc gave then (`sched_at_attach`).
    fn on_running_at_attach(
        &mut self,
        r: &Rec,
        at_attach: Option<(i64, [u64; 6])>,
        sched_at_attach: Option<[u64; SNAP]>,
    ) {
        let mut r = *r;
        r.enter_ns = self.fed.stats.attach_mono;
        let known = match at_attach {
            Some((nr, args)) if nr == r.nr => {
                r.args = args;
                true
            }
            _ => false,
        };
        let sched = sched_at_attach.map(|a| {
            Box::new(event::SchedSpan {
                during: delta(&a, &r.sched_exit, self.extras),
                before: None,
            })
        });
        self.build(&r, Some(r.ret), known, sched);
        sc_of_back(&mut self.fed.queue).in_flight = Some(InFlight::AtStart);
        self.count(r.tid, None);
    }

    /// A traced task made a task (`r.nr` the child, `r.ret` 1 for a thread, 0 for a process).
    fn on_fork(&mut self, r: &Rec) {
        let child = r.nr as Tid;
        let thread = match r.ret {
            1 => true,
            0 => false,
            // Created without a clone call the programs saw (a kernel-made worker): the same
            // process means a thread.
            _ => std::fs::read_to_string(format!("/proc/{child}/status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("Tgid:"))
                        .and_then(|v| v.trim().parse::<Tid>().ok())
                })
                .is_some_and(|t| t == r.tgid),
        };
        if !thread && !self.cfg.follow_forks {
            return;
        }
        self.forked.insert(child, thread);
        let tgid = if thread { r.tgid } else { child };
        self.threads.insert(child, Thread::new(tgid, false));
    }

    fn on_task_exit(&mut self, r: &Rec) {
        self.threads.remove(&r.tid);
        let code = self.exit_codes.remove(&r.tid);
        self.fed.queue.push_back(Event {
            tid: r.tid,
            ts: r.exit_ns,
            line: 0,
            kind: EventKind::Exit { code, signal: None },
        });
    }

    /// Turns what the reader has copied out of the ring into events, about `TAKE` at a
    /// time: the rest of a batch, and later batches, wait for the next call. The events
    /// are then analysed while they are still in the cache; taking whole batches (up to
    /// `QUEUE_KEEP` events, megabytes of them) wrote them all out to memory and read them
    /// back, and the records' own loads (written by the reader on the other CPU) were half
    /// of `process`'s samples. Those are prefetched a few records ahead.
    fn take_records(&mut self, wait: Duration) {
        let mut got = false;
        let mut batch = std::mem::take(&mut self.part);
        let mut at = self.part_at;
        loop {
            if at >= batch.len() {
                if batch.capacity() > 0 {
                    self.reader.give_back(std::mem::take(&mut batch));
                }
                at = 0;
                let now = got || !self.fed.queue.is_empty();
                let Some(b) = self.reader.next(if now { Duration::ZERO } else { wait }) else {
                    break;
                };
                got = true;
                batch = b;
                continue;
            }
            let room = TAKE.saturating_sub(self.fed.queue.len());
            if room == 0 {
                break;
            }
            let end = (at + room).min(batch.len());
            for i in at..end {
                prefetch_rec(&batch, i + PREFETCH_AHEAD);
                self.process(&batch[i]);
            }
            at = end;
        }
        self.part = batch;
        self.part_at = at;
        if got || self.fed.stop_requested {
            self.read_drops();
        }
    }

    /// Adds what the kernel counted as dropped since the last read.
    fn read_drops(&mut self) {
        if let Feed::Shared(r) = &self.reader {
            let own = r.take_lost();
            if own > 0 {
                self.fed.lost(own);
            }
        }
        let Some(Some(total)) = self.with_bpf(read_drop_total) else {
            return;
        };
        if total > self.drops_seen {
            self.fed.lost(total - self.drops_seen);
            self.drops_seen = total;
        }
    }

    /// Ends tracing: detaches the programs, empties the ring, reports calls still running.
    fn finish(&mut self) {
        let end = now_mono();
        self.fed.stats.detach_mono = end;
        if let Some(bpf) = self.bpf.as_mut() {
            for (prog, link) in self.links.drain(..) {
                load::detach(bpf, prog, link);
            }
        }
        if let Feed::Shared(r) = &self.reader {
            r.stop_tracing();
        }
        // No program runs any more: what the reader finds now is everything.
        self.stop_reader();
        // What is left of the batch in progress came before anything still in the channel.
        let part = std::mem::take(&mut self.part);
        for r in part.get(self.part_at..).unwrap_or_default() {
            self.process(r);
        }
        self.part_at = 0;
        while let Some(batch) = self.reader.next(Duration::ZERO) {
            for r in &batch {
                self.process(r);
            }
        }
        self.read_drops();
        let (running, mut quiet_sched) = self.still_running();
        for (tid, e) in running {
            let Some(tgid) = self.threads.get(&tid).map(|t| t.tgid) else {
                continue;
            };
            let r = Rec {
                kind: REC_ENTER_ONLY,
                tid,
                tgid,
                data_len: 0,
                nr: e.nr,
                ret: 0,
                enter_ns: e.ts as Nanos,
                exit_ns: end,
                args: e.args,
                sched_enter: e.sched,
                sched_exit: e.sched,
                arrival_first: 0,
                arrival_at: 0,
                data: [0; DATA_MAX],
            };
            let sched = quiet_sched.remove(&tid).map(|d| {
                Box::new(event::SchedSpan {
                    during: d,
                    before: None,
                })
            });
            self.build(&r, None, true, sched);
            sc_of_back(&mut self.fed.queue).in_flight = Some(InFlight::AtEnd);
            self.count(tid, None);
        }
        self.bpf = None;
        self.fed.queue.push_back(Event {
            tid: self.cfg.pid,
            ts: end,
            line: 0,
            kind: EventKind::Detach,
        });
        self.fed.done = true;
    }

    /// Stops the reader thread once it has emptied the ring.
    fn stop_reader(&mut self) {
        if let Feed::Own(reader) = &mut self.reader {
            if let Some(ring) = reader.stop() {
                ring.tell_discarded();
            }
        }
    }

    /// The calls running as tracing ends, in tid order: those in the kernel's in-flight
    /// map, and those of threads that made no call since the attach but sleep in one that
    /// began before it (the kernel saw neither edge: /proc says which, known from the
    /// attach), with the latter's scheduler split from the attach to now (both ends from
    /// /proc).
    fn still_running(&self) -> (Vec<(Tid, KEntry)>, HashMap<Tid, event::SchedDelta>) {
        let mut running: Vec<(Tid, KEntry)> = vec![];
        self.with_bpf(|bpf| {
            if let Some(m) = bpf.map("inflight") {
                if let Ok(h) = aya::maps::HashMap::<_, u32, KEntry>::try_from(m) {
                    // A thread's entry outlives its calls: ts 0 is no call in progress.
                    // Only this tracer's threads: the map may be shared.
                    running.extend(
                        h.iter()
                            .flatten()
                            .filter(|(t, e)| e.ts != 0 && self.threads.contains_key(t)),
                    );
                }
            }
        });
        if let Feed::Shared(r) = &self.reader {
            let tids: Vec<Tid> = self.threads.keys().copied().collect();
            r.forget_threads(&tids);
        }
        let mut quiet: Vec<Tid> = self
            .threads
            .iter()
            .filter(|(t, th)| th.from_attach && !th.seen && !running.iter().any(|(r, _)| r == *t))
            .map(|(t, _)| *t)
            .collect();
        quiet.sort_unstable();
        let mut quiet_sched: HashMap<Tid, event::SchedDelta> = HashMap::new();
        for tid in quiet {
            let Some((nr, args)) = blocked_in_call(tid) else {
                continue;
            };
            let th = &self.threads[&tid];
            if let (Some(a), Some(now)) = (th.sched_at_attach, counters_now(th.tgid, tid)) {
                quiet_sched.insert(tid, delta(&a, &now, self.extras));
            }
            let e = KEntry {
                ts: self.fed.stats.attach_mono as u64,
                nr,
                args,
                ..KEntry::default()
            };
            running.push((tid, e));
        }
        running.sort_by_key(|(t, _)| *t);
        (running, quiet_sched)
    }
}

/// The kernel's count of records the ring had no room for, over every CPU.
fn read_drop_total(bpf: &aya::Ebpf) -> Option<u64> {
    let arr = aya::maps::PerCpuArray::<_, u64>::try_from(bpf.map("drops")?).ok()?;
    arr.get(&0, 0).ok().map(|v| v.iter().sum())
}

/// The call of the event `BpfTracer::build` just pushed.
#[inline(always)]
fn sc_of_back(queue: &mut VecDeque<Event>) -> &mut Syscall {
    match queue.back_mut().map(|e| &mut e.kind) {
        Some(EventKind::Syscall(sc)) => sc,
        _ => unreachable!("build pushed a call"),
    }
}

/// Records turned into events per `take_records` call, about: their events (~300 bytes
/// each) stay in the cache until the consumer has analysed them.
const TAKE: usize = 512;
/// How many records ahead `take_records` prefetches.
const PREFETCH_AHEAD: usize = 4;

/// Asks for record `i` of `batch` (if there is one) to be brought into the cache.
#[inline(always)]
fn prefetch_rec(batch: &[Rec], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(r) = batch.get(i) {
        let p = (r as *const Rec).cast::<i8>();
        // SAFETY: a prefetch is only a hint; every address is inside the record.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            for off in (0..std::mem::size_of::<Rec>()).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(p.add(off));
            }
            // The last line, when the record does not start on one.
            _mm_prefetch::<_MM_HINT_T0>(p.add(std::mem::size_of::<Rec>() - 1));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (batch, i);
}

impl super::fed::KernelFed for BpfTracer {
    fn fed(&mut self) -> &mut super::fed::Fed {
        &mut self.fed
    }
    fn finish(&mut self) {
        BpfTracer::finish(self)
    }
    fn check(&mut self) -> bool {
        super::fed::process_gone(self.cfg.pid)
    }
    fn gather(&mut self, wait: Duration) {
        self.take_records(wait)
    }
}

impl Tracer for BpfTracer {
    fn reads_buffers(&self) -> bool {
        true
    }

    fn next_event_timeout(&mut self, timeout: Duration) -> Result<Option<Event>> {
        Ok(super::fed::next_event_timeout(self, timeout))
    }

    fn next_batch(&mut self, timeout: Duration, out: &mut VecDeque<Event>) -> Result<()> {
        super::fed::next_batch(self, timeout, out);
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.fed.is_done()
    }

    fn stop(&mut self) {
        self.fed.stop_requested = true;
    }

    fn take_lost(&mut self) -> u64 {
        self.fed.take_lost()
    }

    fn splits_sched(&self) -> bool {
        true
    }

    fn dates_arrivals(&self) -> Option<bool> {
        Some(self.arrivals.on())
    }

    fn splits_throttle(&self) -> bool {
        self.extras.throttle
    }

    #[allow(clippy::vec_box)]
    fn reuse(&mut self, spent: &mut Vec<Box<event::SchedSpan>>) {
        self.fed.spans.take_back(spent);
    }

    fn stats(&self) -> TracerStats {
        let mut s = self.fed.stats.clone();
        s.ns_pids = self.fed.pidns.pairs();
        s
    }

    fn warnings(&mut self) -> Vec<String> {
        let mut w = std::mem::take(&mut self.fed.warnings);
        if self.fed.stats.lost_events > 0 {
            w.push(format!(
                "the kernel dropped {} syscall records (the BPF ring buffer of {} pages filled up): the trace is incomplete; \
                 give --perf-pages a larger power of two",
                self.fed.stats.lost_events, self.cfg.pages
            ));
        }
        w
    }
}

impl Drop for BpfTracer {
    fn drop(&mut self) {
        // Dropping the object detaches and unloads every program; the reader's last pass
        // then finds everything there is.
        self.bpf = None;
        self.stop_reader();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_with_data_keeps_its_bytes_and_nothing_past_them() {
        let mut b = vec![0u8; REC_LEN + DATA_MAX];
        b[0..4].copy_from_slice(&REC_CALL.to_ne_bytes());
        b[4..8].copy_from_slice(&7u32.to_ne_bytes());
        b[12..16].copy_from_slice(&14u32.to_ne_bytes());
        b[24..32].copy_from_slice(&14i64.to_ne_bytes());
        b[32..40].copy_from_slice(&100u64.to_ne_bytes());
        b[40..48].copy_from_slice(&250u64.to_ne_bytes());
        b[REC_LEN..REC_LEN + 14].copy_from_slice(b"*1\r\n$4\r\nPING\r\n");
        let r = parse(&b).expect("parsed");
        assert_eq!((r.kind, r.tid, r.ret), (REC_CALL, 7, 14));
        assert_eq!((r.enter_ns, r.exit_ns), (100, 250));
        assert_eq!(&r.data[..r.data_len as usize], b"*1\r\n$4\r\nPING\r\n");
        // A record without data space claims none, whatever data_len says.
        let short = parse(&b[..REC_LEN]).expect("parsed");
        assert_eq!(short.data_len, 0);
        assert!(parse(&b[..REC_LEN - 1]).is_none());
    }

    #[test]
    fn scheduler_counters_become_a_stall_split_that_adds_up() {
        let none = Extras::default();
        let d = delta(
            &[1_000, 500, 10, 1, 0, 0],
            &[31_000, 60_500, 12, 1, 0, 0],
            none,
        );
        assert_eq!(
            (d.on_cpu_ns, d.runnable_ns, d.minor_faults, d.major_faults),
            (30_000, 60_000, 2, 0)
        );
        assert_eq!(
            d.throttled_ns, None,
            "not measured without the throttle programs"
        );
        assert_eq!(
            d.reclaim_ns, None,
            "not measured without the reclaim programs"
        );
        let both = Extras {
            throttle: true,
            reclaim: true,
        };
        let t = delta(
            &[0, 0, 0, 0, 7_000, 1_000],
            &[20_000, 60_000, 0, 0, 47_000, 31_000],
            both,
        );
        assert_eq!(t.throttled_ns, Some(40_000));
        assert_eq!(t.reclaim_ns, Some(30_000));
        let s = crate::report::StallSched::of(&t, 100_000);
        assert_eq!((s.runnable_us, s.throttled_us), (60, Some(40)));
        assert_eq!(s.reclaim_us, Some(30));
        let s = crate::report::StallSched::of(&d, 100_000);
        assert_eq!((s.on_cpu_us, s.runnable_us, s.blocked_us), (30, 60, 10));
        // On-CPU time is a tick off either way, the runnable time exact: on-CPU gets what the
        // runnable time leaves of the stall, never a negative rest.
        let s = crate::report::StallSched::of(&d, 50_000);
        assert_eq!((s.on_cpu_us, s.runnable_us, s.blocked_us), (0, 50, 0));
        let s = crate::report::StallSched::of(&d, 80_000);
        assert_eq!((s.on_cpu_us, s.runnable_us, s.blocked_us), (20, 60, 0));
        // Counters that went backwards (a reused tid) give zero, not a wrap.
        assert_eq!(
            delta(&[5, 5, 5, 5, 5, 5], &[1, 1, 1, 1, 1, 1], none),
            event::SchedDelta::default()
        );
    }
}
