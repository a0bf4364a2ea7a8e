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

use super::decode::{self, blocked_in_call, nr_info, Args};
use super::sysnames::syscall_name;
use super::tracefs::{self, field_offset};
use super::{now_mono, now_wall, AttachError, Tracer, TracerStats};
use crate::event::{self, Data, Event, EventKind, InFlight, Nanos, Syscall, Tid};
use anyhow::Result;
use rustc_hash::FxHashMap;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
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
const REC_LEN: usize = 176;
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
    sched: [u64; 4],
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
    /// The thread's scheduler counters (on CPU ns, runnable ns, minor and major faults)
    /// at entry and at exit.
    sched_enter: [u64; 4],
    sched_exit: [u64; 4],
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
    assert!(std::mem::offset_of!(Rec, sched_exit) == 128);
    assert!(std::mem::offset_of!(Rec, arrival_first) == 160);
    assert!(std::mem::offset_of!(Rec, arrival_at) == 168);
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

/// Where tracefs is, for the format files.
fn tracefs_events() -> Result<std::path::PathBuf, String> {
    tracefs::find_tracepoints().map(|t| t.events())
}

/// Checks the layouts the programs assume and returns sched_process_fork's child_pid offset.
fn check_layouts() -> Result<u32, String> {
    let ev = tracefs_events()?;
    let read = |cat: &str, name: &str| {
        let p = ev.join(cat).join(name).join("format");
        std::fs::read_to_string(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))
    };
    for (cat, name, field, want) in [
        ("raw_syscalls", "sys_enter", "id", 8),
        ("raw_syscalls", "sys_enter", "args", 16),
        ("raw_syscalls", "sys_exit", "id", 8),
        ("raw_syscalls", "sys_exit", "ret", 16),
    ] {
        let f = read(cat, name)?;
        if field_offset(&f, field) != Some(want) {
            return Err(format!(
                "the kernel's {cat}:{name} tracepoint does not have `{field}` at offset {want} (its format file differs from what the programs read)"
            ));
        }
    }
    read("sched", "sched_process_exit")?;
    let f = read("sched", "sched_process_fork")?;
    field_offset(&f, "child_pid")
        .ok_or_else(|| "sched:sched_process_fork has no child_pid field".to_string())
}

/// Turns aya's load and attach errors into the reason a user can act on.
fn load_error(what: &str, e: &dyn std::fmt::Display, errno: Option<i32>) -> AttachError {
    let root = unsafe { libc::geteuid() } == 0;
    let hint = match errno {
        Some(libc::EPERM) | Some(libc::EACCES) if !root => {
            ": BPF needs root (or CAP_BPF and CAP_PERFMON)"
        }
        Some(libc::EPERM) | Some(libc::EACCES) => {
            ": refused even to root (kernel.unprivileged_bpf_disabled does not apply to root: a lockdown, a security module, or a container without CAP_BPF)"
        }
        Some(libc::ENOSYS) => ": this kernel has no bpf() system call (CONFIG_BPF_SYSCALL)",
        _ => "",
    };
    AttachError::Other(format!("{what}: {e}{hint}"))
}

/// The errno inside an aya error, if it carries one.
fn errno_of(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(x) = cur {
        if let Some(io) = x.downcast_ref::<std::io::Error>() {
            return io.raw_os_error();
        }
        cur = x.source();
    }
    None
}

/// The verifier's refusal in its own words: the last lines of its log say why.
fn verifier_refusal(prog: &str, e: &aya::programs::ProgramError) -> AttachError {
    if let aya::programs::ProgramError::LoadError {
        io_error,
        verifier_log,
    } = e
    {
        let log = verifier_log.to_string();
        let lines: Vec<&str> = log
            .lines()
            .map(str::trim)
            .filter(|l| {
                !l.is_empty()
                    && !l.starts_with("processed ")
                    && !l.starts_with("verification time")
                    && !l.starts_with("stack depth")
            })
            .collect();
        let tail = lines[lines.len().saturating_sub(2)..].join("; ");
        return AttachError::Other(format!(
            "the kernel refused BPF program {prog} ({io_error}); the verifier said: {}",
            if tail.is_empty() { "nothing" } else { &tail }
        ));
    }
    load_error(&format!("cannot load BPF program {prog}"), e, errno_of(e))
}

struct Thread {
    tgid: Tid,
    /// Traced since the attach: its first record may be the exit of a call already running.
    from_attach: bool,
    seen: bool,
    /// The call it slept in at the attach (from /proc): its arguments, for when it returns.
    at_attach: Option<(i64, [u64; 6])>,
    /// Its scheduler counters at the attach (from /proc): the split of that call from then.
    sched_at_attach: Option<[u64; 4]>,
    /// Its scheduler counters when its last call ended.
    last_exit: Option<[u64; 4]>,
}

use super::sched_delta as delta;

pub struct BpfTracer {
    cfg: BpfConfig,
    bpf: Option<aya::Ebpf>,
    links: Vec<(&'static str, Link)>,
    reader: Option<std::thread::JoinHandle<()>>,
    reader_stop: Arc<AtomicBool>,
    rx: mpsc::Receiver<Vec<Rec>>,
    /// The batch being processed, and how far (`take_records` stops part way).
    part: Vec<Rec>,
    part_at: usize,
    /// Records the reader copied out and the analysis has not taken yet (`BACKLOG_MAX`).
    backlog: Arc<std::sync::atomic::AtomicUsize>,
    /// Emptied batches, back to the reader to be filled again (`read_ring`).
    spare: Spares,
    // Fx: looked up once per record (SipHash was a visible part of the tracer's CPU).
    threads: FxHashMap<Tid, Thread>,
    /// New tasks, with whether they are threads, from the fork records.
    forked: FxHashMap<Tid, bool>,
    exit_codes: FxHashMap<Tid, i32>,
    queue: VecDeque<Event>,
    stats: TracerStats,
    drops_seen: u64,
    lost_unreported: u64,
    stop_requested: bool,
    done: bool,
    warnings: Vec<String>,
    last_check: std::time::Instant,
    pub threads_at_attach: u32,
    /// When the requests that socket reads return arrived (arrivals.rs).
    arrivals: arrivals::Arrivals,
    spans: super::SpanPool,
}

/// An attached program, to detach it before the ring is emptied for the last time.
enum Link {
    Tp(aya::programs::trace_point::TracePointLinkId),
    Btf(aya::programs::tp_btf::BtfTracePointLinkId),
}

/// The syscall programs on the BTF-typed raw tracepoints (preferred: the kernel fills no
/// trace record for them, and they read the task's counters with plain loads), and the same
/// programs on the classic tracepoints (kernels without BTF or tp_btf).
const BTF_SYSCALL_PROGRAMS: [(&str, &str); 2] =
    [("btf_sys_enter", "sys_enter"), ("btf_sys_exit", "sys_exit")];
const SYSCALL_PROGRAMS: [(&str, &str, &str); 2] = [
    ("sys_enter", "raw_syscalls", "sys_enter"),
    ("sys_exit", "raw_syscalls", "sys_exit"),
];
const PROGRAMS: [(&str, &str, &str); 2] = [
    ("process_fork", "sched", "sched_process_fork"),
    ("process_exit", "sched", "sched_process_exit"),
];

/// Loads and attaches a classic tracepoint program.
fn attach_tp(
    bpf: &mut aya::Ebpf,
    prog: &'static str,
    cat: &str,
    name: &str,
) -> Result<Link, AttachError> {
    let p: &mut aya::programs::TracePoint = bpf
        .program_mut(prog)
        .ok_or_else(|| AttachError::Other(format!("the BPF object lacks {prog}")))?
        .try_into()
        .map_err(|e| load_error(prog, &e, None))?;
    p.load().map_err(|e| verifier_refusal(prog, &e))?;
    let id = p.attach(cat, name).map_err(|e| {
        load_error(
            &format!("cannot attach BPF program {prog} to {cat}:{name}"),
            &e,
            errno_of(&e),
        )
    })?;
    Ok(Link::Tp(id))
}

/// Loads and attaches the tp_btf syscall programs, or says why they cannot run here (then
/// neither is left attached).
fn attach_btf_syscalls(bpf: &mut aya::Ebpf) -> Result<Vec<(&'static str, Link)>, String> {
    let btf = aya::Btf::from_sys_fs().map_err(|e| format!("no kernel BTF: {e}"))?;
    let mut links = vec![];
    for (prog, tp) in BTF_SYSCALL_PROGRAMS {
        let p: &mut aya::programs::BtfTracePoint = bpf
            .program_mut(prog)
            .ok_or_else(|| format!("the BPF object lacks {prog}"))?
            .try_into()
            .map_err(|e| format!("{prog}: {e}"))?;
        let r = match p.load(tp, &btf) {
            Err(e) => Err(verifier_refusal(prog, &e).to_string()),
            Ok(()) => p
                .attach()
                .map_err(|e| format!("cannot attach {prog} to tp_btf/{tp}: {e}")),
        };
        match r {
            Ok(id) => links.push((prog, Link::Btf(id))),
            Err(e) => {
                for (prog, link) in links {
                    detach(bpf, prog, link);
                }
                return Err(e);
            }
        }
    }
    Ok(links)
}

fn detach(bpf: &mut aya::Ebpf, prog: &str, link: Link) {
    let Some(p) = bpf.program_mut(prog) else {
        return;
    };
    match link {
        Link::Tp(id) => {
            let p: Result<&mut aya::programs::TracePoint, _> = p.try_into();
            if let Ok(p) = p {
                let _ = p.detach(id);
            }
        }
        Link::Btf(id) => {
            let p: Result<&mut aya::programs::BtfTracePoint, _> = p.try_into();
            if let Ok(p) = p {
                let _ = p.detach(id);
            }
        }
    }
}

impl BpfTracer {
    /// Loads and attaches the programs, then starts tracing every thread of `cfg.pid` at
    /// once (putting its tgid in the filter map).
    pub fn attach(cfg: BpfConfig) -> Result<Self, AttachError> {
        super::check_target(cfg.pid)?;
        let child_off = check_layouts().map_err(AttachError::Other)?;
        let ring_bytes = (cfg.pages * crate::live::page_size()) as u32;
        let follow = cfg.follow_forks as u32;
        let arrival_layout = arrivals::layout();
        let listening = arrivals::Listening::of(cfg.pid);
        let ring_bytes64 = ring_bytes as u64;
        let measure = measure_mode()?;
        let filter_only = (measure == Measure::FilterOnly) as u32;
        let mut loader = aya::EbpfLoader::new();
        loader
            .set_global("measure_filter_only", &filter_only, true)
            .set_global("follow_forks", &follow, true)
            .set_global("fork_child_pid_off", &child_off, true)
            .set_global("ring_bytes", &ring_bytes64, true)
            .set_max_entries("events", ring_bytes);
        arrivals::set_globals(&mut loader, &arrival_layout);
        listening.set_globals(&mut loader);
        let mut bpf = loader
            .load(OBJECT)
            .map_err(|e| load_error("cannot load the BPF object", &e, errno_of(&e)))?;
        if std::env::var(REFUSE_ENV).is_ok_and(|v| v == "1") {
            let p: &mut aya::programs::TracePoint = bpf
                .program_mut("refused_by_verifier")
                .ok_or_else(|| {
                    AttachError::Other("the BPF object lacks refused_by_verifier".into())
                })?
                .try_into()
                .map_err(|e| load_error("refused_by_verifier", &e, None))?;
            if let Err(e) = p.load() {
                return Err(verifier_refusal("refused_by_verifier", &e));
            }
        }
        {
            let mut kinds: aya::maps::Array<_, u32> = aya::maps::Array::try_from(
                bpf.map_mut("nr_kinds")
                    .ok_or_else(|| AttachError::Other("the BPF object lacks nr_kinds".into()))?,
            )
            .map_err(|e| load_error("nr_kinds", &e, None))?;
            for nr in 0..NR_MAX {
                let k = kernel_kind(crate::syscalls::info(syscall_name(nr)));
                if k != 0 {
                    kinds
                        .set(nr as u32, k, 0)
                        .map_err(|e| load_error("cannot fill nr_kinds", &e, errno_of(&e)))?;
                }
            }
        }
        // The fork and exit programs first: a child forked once the syscall programs run is
        // then always seen.
        let mut links = vec![];
        for (prog, cat, name) in PROGRAMS {
            links.push((prog, attach_tp(&mut bpf, prog, cat, name)?));
        }
        let classic = std::env::var(CLASSIC_ENV).is_ok_and(|v| v == "1");
        let arrivals = arrivals::attach(&mut bpf, &arrival_layout, &mut links, classic);
        let btf = if classic {
            Err(format!("{CLASSIC_ENV}=1"))
        } else {
            attach_btf_syscalls(&mut bpf)
        };
        let programs = match btf {
            Ok(l) => {
                links.extend(l);
                "BTF-typed raw tracepoints (tp_btf/sys_enter, tp_btf/sys_exit)".to_string()
            }
            Err(why) => {
                for (prog, cat, name) in SYSCALL_PROGRAMS {
                    links.push((prog, attach_tp(&mut bpf, prog, cat, name)?));
                }
                format!("classic tracepoints (raw_syscalls:sys_enter, sys_exit), as tp_btf cannot be used: {why}")
            }
        };
        let arrival_programs = match &arrivals {
            Ok(flavour) => {
                let own = match (*flavour, listening.ports()) {
                    ("tp_btf", Some(p)) => format!(
                        ", skipping the data-ready of its own sends to local peers (listening ports {})",
                        if p.is_empty() {
                            "none".to_string()
                        } else {
                            p.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
                        }
                    ),
                    _ => String::new(),
                };
                format!("; arrival programs on {flavour}{own}")
            }
            Err(_) => String::new(),
        };
        eprintln!("stallscope: bpf syscall programs on {programs}{arrival_programs}");
        if measure != Measure::Off {
            eprintln!("stallscope: {MEASURE_ENV} is set: records are discarded, this run reports nothing (measurement only)");
        }
        let ring = bpf
            .take_map("events")
            .ok_or_else(|| AttachError::Other("the BPF object lacks events".into()))?;
        let ring = aya::maps::RingBuf::try_from(ring)
            .map_err(|e| load_error("cannot map the BPF ring buffer", &e, errno_of(&e)))?;
        let map = RingMap::new(std::os::fd::AsRawFd::as_raw_fd(&ring), ring_bytes as usize)
            .map_err(|e| AttachError::Other(format!("cannot map the BPF ring buffer: {e}")))?;
        let (tx, rx) = mpsc::channel();
        let spare = Spares::default();
        let spares = spare.clone();
        let reader_stop = Arc::new(AtomicBool::new(false));
        let stop = reader_stop.clone();
        let backlog = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let held = backlog.clone();
        let reader = std::thread::Builder::new()
            .name("stallscope-bpf".into())
            .spawn(move || {
                if measure == Measure::Off {
                    read_ring(ring, map, tx, spares, stop, held)
                } else {
                    discard_ring(ring, map, stop)
                }
            })
            .map_err(|e| AttachError::Other(format!("cannot start the ring reader: {e}")))?;
        let mut me = BpfTracer {
            cfg,
            bpf: Some(bpf),
            links,
            reader: Some(reader),
            reader_stop,
            rx,
            part: vec![],
            part_at: 0,
            backlog,
            spare,
            threads: FxHashMap::default(),
            forked: FxHashMap::default(),
            exit_codes: FxHashMap::default(),
            queue: VecDeque::new(),
            stats: TracerStats::default(),
            drops_seen: 0,
            lost_unreported: 0,
            stop_requested: false,
            done: false,
            warnings: vec![],
            last_check: std::time::Instant::now(),
            threads_at_attach: 0,
            arrivals: arrivals::Arrivals::default(),
            spans: super::SpanPool::default(),
        };
        me.arrivals.started(arrivals.map(|_| ()), &mut me.warnings);
        let pid = me.cfg.pid;
        me.stats.attach_mono = now_mono();
        me.stats.attach_wall = now_wall();
        // From here every thread of the process is traced, including those born meanwhile.
        {
            let bpf = me.bpf.as_mut().expect("loaded");
            let mut tgids: aya::maps::HashMap<_, u32, u32> = aya::maps::HashMap::try_from(
                bpf.map_mut("tgids")
                    .ok_or_else(|| AttachError::Other("the BPF object lacks tgids".into()))?,
            )
            .map_err(|e| load_error("tgids", &e, None))?;
            tgids
                .insert(pid, 1, 0)
                .map_err(|e| load_error("cannot start tracing", &e, errno_of(&e)))?;
            let mut target: aya::maps::Array<_, KTarget> = aya::maps::Array::try_from(
                bpf.map_mut("target")
                    .ok_or_else(|| AttachError::Other("the BPF object lacks target".into()))?,
            )
            .map_err(|e| load_error("target", &e, None))?;
            target
                .set(
                    0,
                    KTarget {
                        tgid: pid,
                        children: 0,
                    },
                    0,
                )
                .map_err(|e| load_error("cannot start tracing", &e, errno_of(&e)))?;
        }
        let tids = match super::list_tasks(pid) {
            Ok(t) if !t.is_empty() => t,
            _ => return Err(AttachError::NoSuchPid(pid)),
        };
        for tid in &tids {
            me.threads.insert(
                *tid,
                Thread {
                    tgid: pid,
                    from_attach: true,
                    seen: false,
                    at_attach: blocked_in_call(*tid),
                    sched_at_attach: super::sched_counters(pid, *tid),
                    last_exit: None,
                },
            );
        }
        me.threads_at_attach = tids.len() as u32;
        me.queue.push_back(Event {
            tid: pid,
            ts: me.stats.attach_mono,
            line: 0,
            kind: EventKind::Attach {
                threads: Some(me.threads_at_attach),
            },
        });
        Ok(me)
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
        self.queue.push_back(Event {
            tid: r.tid,
            ts: r.enter_ns,
            line: 0,
            kind: EventKind::Syscall(Syscall::with(info.name, info.sys)),
        });
        let sc = sc_of_back(&mut self.queue);
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
        let ok = sc.ret.val();
        if args_known && r.data_len > 0 {
            let avail = if kernel_kind(info.sys) == NR_READ {
                ok.unwrap_or(0).max(0) as u64
            } else {
                r.args[2]
            };
            let n = r.data_len as usize;
            Data::put_bytes(&mut sc.extra, &r.data[..n], avail > n as u64);
        }
    }

    fn count(&mut self, tid: Tid, dur: Option<Nanos>) {
        self.stats.count(tid, self.cfg.pid, dur);
    }

    fn process(&mut self, r: &Rec) {
        if r.kind == arrivals::REC_ARRIVAL {
            self.arrivals.on_record(r);
            return;
        }
        let tid = r.tid;
        let th = self.threads.entry(tid).or_insert(Thread {
            tgid: r.tgid,
            from_attach: false,
            seen: false,
            at_attach: None,
            sched_at_attach: None,
            last_exit: None,
        });
        let first = !th.seen && th.from_attach;
        let at_attach = th.at_attach.take();
        let sched_at_attach = th.sched_at_attach.take();
        // What the scheduler did in the call, and in the gap since the thread's last call.
        let sched = (r.kind == REC_CALL || r.kind == REC_ENTER_ONLY).then(|| {
            self.spans.boxed(event::SchedSpan {
                during: delta(&r.sched_enter, &r.sched_exit),
                before: th.last_exit.map(|l| delta(&l, &r.sched_enter)),
            })
        });
        if matches!(r.kind, REC_CALL | REC_EXIT_ONLY) {
            th.last_exit = Some(r.sched_exit);
        }
        match r.kind {
            REC_CALL => {
                th.seen = true;
                self.build(r, Some(r.ret), true, sched);
                self.arrivals.date(r, sc_of_back(&mut self.queue));
                self.count(tid, Some(r.exit_ns - r.enter_ns));
            }
            REC_ENTER_ONLY => {
                th.seen = true;
                // It never returned (exit, exit_group, or the task ended inside it): known
                // from its entry to when that was seen.
                let exits = nr_info(r.nr).sys.facts.has(crate::syscalls::Facts::EXIT);
                if exits {
                    self.exit_codes.insert(tid, r.args[0] as i32);
                }
                self.build(r, None, true, sched);
                self.count(tid, None);
            }
            REC_EXIT_ONLY => {
                th.seen = true;
                if !first {
                    // The child's side of a clone (returns 0 with no entry).
                    return;
                }
                let mut r = *r;
                r.enter_ns = self.stats.attach_mono;
                // Its arguments are known if /proc showed it sleeping in this call then.
                let known = match at_attach {
                    Some((nr, args)) if nr == r.nr => {
                        r.args = args;
                        true
                    }
                    _ => false,
                };
                // What the scheduler did in it from the attach (its entry was before).
                let sched = sched_at_attach.map(|a| {
                    Box::new(event::SchedSpan {
                        during: delta(&a, &r.sched_exit),
                        before: None,
                    })
                });
                self.build(&r, Some(r.ret), known, sched);
                sc_of_back(&mut self.queue).in_flight = Some(InFlight::AtStart);
                self.count(tid, None);
            }
            REC_FORK => {
                let child = r.nr as Tid;
                let thread = match r.ret {
                    1 => true,
                    0 => false,
                    // Created without a clone call the programs saw (a kernel-made worker):
                    // the same process means a thread.
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
                self.threads.insert(
                    child,
                    Thread {
                        tgid: if thread { r.tgid } else { child },
                        from_attach: false,
                        seen: false,
                        at_attach: None,
                        sched_at_attach: None,
                        last_exit: None,
                    },
                );
            }
            REC_TASK_EXIT => {
                self.threads.remove(&tid);
                let code = self.exit_codes.remove(&tid);
                self.queue.push_back(Event {
                    tid,
                    ts: r.exit_ns,
                    line: 0,
                    kind: EventKind::Exit { code, signal: None },
                });
            }
            _ => {}
        }
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
                    batch.clear();
                    self.spare.give(std::mem::take(&mut batch));
                }
                at = 0;
                let next = if got || !self.queue.is_empty() {
                    self.rx.try_recv().ok()
                } else {
                    self.rx.recv_timeout(wait).ok()
                };
                let Some(b) = next else { break };
                got = true;
                self.backlog.fetch_sub(b.len(), Ordering::Relaxed);
                batch = b;
                continue;
            }
            let room = TAKE.saturating_sub(self.queue.len());
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
        if got || self.stop_requested {
            self.read_drops();
        }
    }

    /// Adds what the kernel counted as dropped since the last read.
    fn read_drops(&mut self) {
        let Some(bpf) = self.bpf.as_ref() else {
            return;
        };
        let Some(m) = bpf.map("drops") else { return };
        let Ok(arr) = aya::maps::PerCpuArray::<_, u64>::try_from(m) else {
            return;
        };
        let total: u64 = match arr.get(&0, 0) {
            Ok(v) => v.iter().sum(),
            Err(_) => return,
        };
        if total > self.drops_seen {
            let d = total - self.drops_seen;
            self.drops_seen = total;
            self.stats.lost_events += d;
            self.lost_unreported += d;
        }
    }

    fn process_gone(&self) -> bool {
        match std::fs::read_to_string(format!("/proc/{}/stat", self.cfg.pid)) {
            Ok(s) => s
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|st| st == "Z" || st == "X"),
            Err(_) => true,
        }
    }

    /// Ends tracing: detaches the programs, empties the ring, reports calls still running.
    fn finish(&mut self) {
        let end = now_mono();
        self.stats.detach_mono = end;
        if let Some(bpf) = self.bpf.as_mut() {
            for (prog, link) in self.links.drain(..) {
                detach(bpf, prog, link);
            }
        }
        // No program runs any more: what the reader finds now is everything.
        self.reader_stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
        // What is left of the batch in progress came before anything still in the channel.
        let part = std::mem::take(&mut self.part);
        for r in part.get(self.part_at..).unwrap_or_default() {
            self.process(r);
        }
        self.part_at = 0;
        while let Ok(batch) = self.rx.try_recv() {
            for r in &batch {
                self.process(r);
            }
        }
        self.read_drops();
        let mut running: Vec<(Tid, KEntry)> = vec![];
        if let Some(bpf) = self.bpf.as_ref() {
            if let Some(m) = bpf.map("inflight") {
                if let Ok(h) = aya::maps::HashMap::<_, u32, KEntry>::try_from(m) {
                    // A thread's entry outlives its calls: ts 0 is no call in progress.
                    running.extend(h.iter().flatten().filter(|(_, e)| e.ts != 0));
                }
            }
        }
        // A thread that made no call since the attach may be blocked in one that began
        // before it (the kernel saw neither edge): /proc says which, known from the attach.
        let mut quiet: Vec<Tid> = self
            .threads
            .iter()
            .filter(|(t, th)| th.from_attach && !th.seen && !running.iter().any(|(r, _)| r == *t))
            .map(|(t, _)| *t)
            .collect();
        quiet.sort_unstable();
        // Their split from the attach to now, both ends from /proc.
        let mut quiet_sched: HashMap<Tid, event::SchedDelta> = HashMap::new();
        for tid in quiet {
            if let Some((nr, args)) = blocked_in_call(tid) {
                let th = &self.threads[&tid];
                if let (Some(a), Some(now)) =
                    (th.sched_at_attach, super::sched_counters(th.tgid, tid))
                {
                    quiet_sched.insert(tid, delta(&a, &now));
                }
                running.push((
                    tid,
                    KEntry {
                        ts: self.stats.attach_mono as u64,
                        nr,
                        args,
                        sched: [0; 4],
                        arrival_first: 0,
                        arrival_at: 0,
                    },
                ));
            }
        }
        running.sort_by_key(|(t, _)| *t);
        for (tid, e) in running {
            let tgid = match self.threads.get(&tid) {
                Some(t) => t.tgid,
                None => continue,
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
            sc_of_back(&mut self.queue).in_flight = Some(InFlight::AtEnd);
            self.count(tid, None);
        }
        self.bpf = None;
        self.queue.push_back(Event {
            tid: self.cfg.pid,
            ts: end,
            line: 0,
            kind: EventKind::Detach,
        });
        self.done = true;
    }
}

/// The reader thread: copies records out of the ring as soon as they are there, so the
/// kernel finds room even while the analysis is busy. Sleeps in poll between wakeups (the
/// programs wake it when a quarter of the ring is used; the timeout bounds the delay).
/// Batches handed back to the reader at most (each of `BATCH_MAX` records, allocated at
/// that size once): the reader refills them instead of growing a new vector (copies, fresh
/// pages) per batch. 32 x 512 records is under 4 MiB kept idle.
const SPARE_BATCHES: usize = 32;
/// Records per batch: 512 of them (120 KiB) stay in the caches between the reader that
/// writes them and the analysis that reads them on the other CPU; batches of 2048, handed
/// back and refilled in turn through a queue of 8, went through 4 MiB and missed them.
const BATCH_MAX: usize = 512;

/// Emptied batches, from the analysis back to the reader: the last one given back is the
/// first one refilled (its lines are the likeliest to be cached still), where a channel
/// would cycle through every spare in turn.
#[derive(Clone, Default)]
struct Spares(Arc<std::sync::Mutex<Vec<Vec<Rec>>>>);

impl Spares {
    /// Keeps `batch` (emptied) for the reader, or frees it when enough are kept (the
    /// reader is behind).
    fn give(&self, mut batch: Vec<Rec>) {
        batch.clear();
        if let Ok(mut v) = self.0.lock() {
            if v.len() < SPARE_BATCHES {
                v.push(batch);
            }
        }
    }

    fn take(&self) -> Option<Vec<Rec>> {
        self.0.lock().ok()?.pop()
    }
}

/// Most records copied out and not yet taken by the analysis (about 128 MiB of them, a few
/// seconds of a saturated redis, as the perf backend's backlog): past it the reader leaves
/// the ring alone, so an analysis that never catches up makes the kernel drop records,
/// counted as lost, instead of memory growing without end.
const BACKLOG_MAX: usize = (128 << 20) / std::mem::size_of::<Rec>();

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

/// The ring's pages as the kernel lays them out (kernel/bpf/ringbuf.c): the consumer
/// position's page (written by us), then the producer position's page and the data pages
/// mapped twice, so a record that wraps reads on contiguously. Read here rather than
/// through aya's `RingBuf::next`, which publishes the consumer position with a full
/// barrier after every record: that store, on a line the kernel reads at every reserve,
/// was half of the reader thread's samples. Here it is published every `PUBLISH_EVERY`
/// records and when the ring is empty.
struct RingMap {
    consumer: *mut u8,
    meta: *mut u8,
    meta_len: usize,
    page: usize,
    mask: usize,
}

/// Records read between two publications of the consumer position (a few KiB of the ring
/// held back at most).
const PUBLISH_EVERY: usize = 64;
const RINGBUF_BUSY_BIT: u32 = 1 << 31;
const RINGBUF_DISCARD_BIT: u32 = 1 << 30;
const RINGBUF_HDR_SZ: usize = 8;

impl RingMap {
    fn new(fd: i32, data_bytes: usize) -> std::io::Result<RingMap> {
        let page = crate::live::page_size();
        let meta_len = page + 2 * data_bytes;
        // SAFETY: fresh shared mappings of the ring's fd, unmapped in Drop.
        unsafe {
            let consumer = libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            if consumer == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            let meta = libc::mmap(
                std::ptr::null_mut(),
                meta_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                page as libc::off_t,
            );
            if meta == libc::MAP_FAILED {
                let e = std::io::Error::last_os_error();
                libc::munmap(consumer, page);
                return Err(e);
            }
            Ok(RingMap {
                consumer: consumer.cast(),
                meta: meta.cast(),
                meta_len,
                page,
                mask: data_bytes - 1,
            })
        }
    }

    fn consumer_pos(&self) -> &std::sync::atomic::AtomicUsize {
        // SAFETY: the page starts with the kernel's consumer position (unsigned long).
        unsafe { &*(self.consumer as *const std::sync::atomic::AtomicUsize) }
    }

    fn producer_pos(&self) -> &std::sync::atomic::AtomicUsize {
        // SAFETY: as consumer_pos, for the producer's page.
        unsafe { &*(self.meta as *const std::sync::atomic::AtomicUsize) }
    }

    /// Calls `each` with every record committed now, in order, up to `limit` of them (the
    /// discarded ones skipped); returns how many were given. Stops at a record still being
    /// written.
    fn drain(&self, limit: usize, mut each: impl FnMut(&[u8])) -> usize {
        let cons_at = self.consumer_pos();
        let mut cons = cons_at.load(Ordering::Relaxed);
        let mut prod = self.producer_pos().load(Ordering::Acquire);
        let mut given = 0;
        let mut unpublished = 0;
        // SAFETY: the data pages follow the producer's page; offsets are masked into the
        // first copy, and a record (at most the ring's size) ends inside the second.
        let data = unsafe { self.meta.add(self.page) };
        while given < limit {
            if cons == prod {
                prod = self.producer_pos().load(Ordering::Acquire);
                if cons == prod {
                    break;
                }
            }
            let off = cons & self.mask;
            // SAFETY: the header is 8-byte aligned inside the data pages; the kernel writes
            // its length word with release order once the record is committed.
            let hdr = unsafe { &*(data.add(off) as *const std::sync::atomic::AtomicU32) }
                .load(Ordering::Acquire);
            if hdr & RINGBUF_BUSY_BIT != 0 {
                break;
            }
            let len = (hdr & !(RINGBUF_BUSY_BIT | RINGBUF_DISCARD_BIT)) as usize;
            if hdr & RINGBUF_DISCARD_BIT == 0 {
                // SAFETY: the record's bytes follow its header, contiguous (double mapping).
                let rec =
                    unsafe { std::slice::from_raw_parts(data.add(off + RINGBUF_HDR_SZ), len) };
                each(rec);
                given += 1;
            }
            cons += (RINGBUF_HDR_SZ + len).next_multiple_of(8);
            unpublished += 1;
            if unpublished >= PUBLISH_EVERY {
                cons_at.store(cons, Ordering::Release);
                unpublished = 0;
            }
        }
        cons_at.store(cons, Ordering::Release);
        given
    }
}

impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: the mappings made in new, used by nothing once this is dropped.
        unsafe {
            libc::munmap(self.consumer.cast(), self.page);
            libc::munmap(self.meta.cast(), self.meta_len);
        }
    }
}

// SAFETY: the mappings are used only by the one thread that owns the RingMap.
unsafe impl Send for RingMap {}

fn read_ring(
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    map: RingMap,
    tx: mpsc::Sender<Vec<Rec>>,
    spares: Spares,
    stop: Arc<AtomicBool>,
    backlog: Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::os::fd::AsRawFd;
    // aya's ring keeps the map (and its fd) open; records are read through `map`.
    let fd = ring.as_raw_fd();
    let fresh = || {
        spares
            .take()
            .unwrap_or_else(|| Vec::with_capacity(BATCH_MAX))
    };
    let send = |batch: Vec<Rec>| {
        backlog.fetch_add(batch.len(), Ordering::Relaxed);
        tx.send(batch).is_err()
    };
    let mut batch = fresh();
    loop {
        // Read after the flag: once it is set no program runs, so this pass is the last
        // (and reads everything: the ring is bounded, and the attach's side drains it).
        let last = stop.load(Ordering::SeqCst);
        if !last && backlog.load(Ordering::Relaxed) >= BACKLOG_MAX {
            std::thread::sleep(std::time::Duration::from_millis(5));
            continue;
        }
        loop {
            let room = BATCH_MAX - batch.len();
            let n = map.drain(room, |item| push_parsed(item, &mut batch));
            if batch.len() < BATCH_MAX {
                // n < room: the ring is empty (or the next record is being written).
                let _ = n;
                break;
            }
            if send(std::mem::replace(&mut batch, fresh())) {
                return;
            }
            if !last && backlog.load(Ordering::Relaxed) >= BACKLOG_MAX {
                break;
            }
        }
        if !batch.is_empty() && send(std::mem::replace(&mut batch, fresh())) {
            return;
        }
        if last {
            return;
        }
        wait_readable(fd);
    }
}

/// Sleeps until the ring has records or 5 ms have passed (a stop is seen within that).
fn wait_readable(fd: i32) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, 5) };
}

/// `STALLSCOPE_BPF_MEASURE`'s reader: empties the ring through the same `RingMap` as
/// `read_ring`, so that it measures the same reading, keeping only a count of records by
/// kind and of their bytes, said on stderr when tracing ends.
fn discard_ring(ring: aya::maps::RingBuf<aya::maps::MapData>, map: RingMap, stop: Arc<AtomicBool>) {
    use std::os::fd::AsRawFd;
    // aya's ring keeps the map (and its fd) open; records are read through `map`.
    let fd = ring.as_raw_fd();
    let mut kinds = [0u64; 17];
    let mut bytes = 0u64;
    loop {
        let last = stop.load(Ordering::SeqCst);
        map.drain(usize::MAX, |item| {
            let k = if item.len() >= 4 { u32_at(item, 0) } else { 0 };
            kinds[(k as usize).min(kinds.len() - 1)] += 1;
            bytes += item.len() as u64;
        });
        if last {
            break;
        }
        wait_readable(fd);
    }
    let total: u64 = kinds.iter().sum();
    let by_kind: Vec<String> = kinds
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("kind {k}: {n}"))
        .collect();
    eprintln!(
        "stallscope: {MEASURE_ENV}: discarded {total} records, {bytes} bytes ({})",
        by_kind.join(", ")
    );
}

impl super::fed::KernelFed for BpfTracer {
    fn queue(&mut self) -> &mut VecDeque<Event> {
        &mut self.queue
    }
    fn ended(&self) -> bool {
        self.done
    }
    fn stop_requested(&self) -> bool {
        self.stop_requested
    }
    fn finish(&mut self) {
        BpfTracer::finish(self)
    }
    fn last_check(&mut self) -> &mut std::time::Instant {
        &mut self.last_check
    }
    fn check(&mut self) -> bool {
        self.process_gone()
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
        self.done && self.queue.is_empty()
    }

    fn stop(&mut self) {
        self.stop_requested = true;
    }

    fn take_lost(&mut self) -> u64 {
        std::mem::take(&mut self.lost_unreported)
    }

    fn splits_sched(&self) -> bool {
        true
    }

    fn dates_arrivals(&self) -> Option<bool> {
        Some(self.arrivals.on())
    }

    #[allow(clippy::vec_box)]
    fn reuse(&mut self, spent: &mut Vec<Box<event::SchedSpan>>) {
        self.spans.take_back(spent);
    }

    fn stats(&self) -> TracerStats {
        self.stats.clone()
    }

    fn warnings(&mut self) -> Vec<String> {
        let mut w = std::mem::take(&mut self.warnings);
        if self.stats.lost_events > 0 {
            w.push(format!(
                "the kernel dropped {} syscall records (the BPF ring buffer of {} pages filled up): the trace is incomplete; \
                 give --perf-pages a larger power of two",
                self.stats.lost_events, self.cfg.pages
            ));
        }
        w
    }
}

impl Drop for BpfTracer {
    fn drop(&mut self) {
        self.reader_stop.store(true, Ordering::SeqCst);
        // Dropping the object detaches and unloads every program.
        self.bpf = None;
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
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
        let d = delta(&[1_000, 500, 10, 1], &[31_000, 60_500, 12, 1]);
        assert_eq!(
            (d.on_cpu_ns, d.runnable_ns, d.minor_faults, d.major_faults),
            (30_000, 60_000, 2, 0)
        );
        let s = crate::report::StallSched::of(&d, 100_000);
        assert_eq!((s.on_cpu_us, s.runnable_us, s.blocked_us), (30, 60, 10));
        // On-CPU time trails by up to a tick: never more than the stall, never a negative rest.
        let s = crate::report::StallSched::of(&d, 50_000);
        assert_eq!((s.on_cpu_us, s.runnable_us, s.blocked_us), (30, 20, 0));
        // Counters that went backwards (a reused tid) give zero, not a wrap.
        assert_eq!(
            delta(&[5, 5, 5, 5], &[1, 1, 1, 1]),
            event::SchedDelta::default()
        );
    }
}
