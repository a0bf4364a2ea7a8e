//! The perf backend of `attach`: the kernel's `raw_syscalls:sys_enter`/`sys_exit`
//! tracepoints read through `perf_event_open` ring buffers, turned into the same `Event`s
//! as the ptrace backend and the text sources. Unlike ptrace it never stops the traced
//! process: the kernel writes a record at each syscall entry and exit and redis runs on.
//!
//! Layout (why, not what): one pair of tracepoint events per (thread, CPU), opened with
//! `inherit`, all writing into one ring buffer per CPU (`PERF_EVENT_IOC_SET_OUTPUT`).
//! `inherit` is what makes following threads and children exact: a thread or process
//! created by a traced thread carries the events from its first instruction, so nothing
//! it does is missed (opening events for a new tid after seeing its clone would lose its
//! first milliseconds). The kernel only allows `mmap` of inherited events per CPU, hence
//! the per-CPU buffers; records of one thread can then sit in two buffers (it migrated),
//! so each read gathers every buffer, sorts by time, and holds back the last few ms
//! (`HOLD_BACK`) in case a slower CPU has not committed an earlier record yet.
//! `task` records (fork and exit of traced tasks) say which tids are threads and which
//! processes, and when a thread ends. For the scheduler's split of each call and gap (the
//! `sched` the bpf backend reads from the kernel's task), the same per-thread events also
//! carry the thread's context switches, its `sched:sched_wakeup`s and one sample per page
//! fault, from which `SchedClock` rebuilds its time on a CPU and runnable, and its faults. `PERF_RECORD_LOST` records count what the kernel
//! dropped when a buffer was full: they are reported, never silently absorbed.
//!
//! What this backend cannot see, because it never stops the tracee: the contents of
//! read/write buffers (no RESP command names: per-command latency and the commands held up
//! by a stall are not available), and signals. Paths of `open`-like calls and `rename`
//! are read from the process's memory when the record is processed (a few ms later):
//! racy, and so is the returned fd's `/proc/PID/fd` link, read too and preferred as strace
//! -y does only while it still fits the call (`decode::open_name`).

use super::decode::{self, nr_info, Args};
use super::fed::Fed;
use super::reader::Reader;
use super::tracefs::{self, find_tracepoints};
use super::{AttachError, Tracer, TracerStats};
use crate::clock::{now_mono, now_wall};
use crate::event::{self, Event, EventKind, InFlight, Nanos, Syscall, Tid};
use anyhow::Result;
use perf_event_open_sys as sys;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::Duration;

/// Default ring-buffer size per CPU: 8 MiB holds about 50,000 syscalls (~150 bytes
/// each for the enter and exit records), a quarter of a second of a saturated redis.
pub const DEFAULT_PAGES: usize = 2048;

/// Records younger than this are left for the next read: another CPU may still be writing
/// an older record of the same thread (the time is taken before the record is committed).
const HOLD_BACK: Nanos = 3_000_000;

/// Most threads the wakeup filter names (a filter is at most a page of text).
const WAKEUP_FILTER_MAX: usize = 200;

/// Set to 1 to trace without the scheduler's records (no `sched` split): what those records
/// cost, measured against the same backend without them (bench/backends.sh).
pub const NO_SCHED_ENV: &str = "STALLSCOPE_PERF_NO_SCHED";

/// How often /proc/PID/task is rescanned for threads the events missed.
const RESCAN_EVERY: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct PerfConfig {
    pub pid: Tid,
    /// Trace forked children (the BGSAVE / AOF rewrite child).
    pub follow_forks: bool,
    /// Ring-buffer pages per CPU (a power of two).
    pub pages: usize,
}

fn paranoid() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn online_cpus() -> Vec<i32> {
    // "0-3,8-11"
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut v = vec![];
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
            v.extend(a..=b);
        }
    }
    if v.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        v.extend(0..n as i32);
    }
    v
}

/// One per-CPU ring buffer: the mmap of the first event opened on that CPU.
struct Ring {
    base: *mut u8,
    len: usize,
    data_off: usize,
    data_size: usize,
    fd: i32,
    /// A record that wraps around the end of the buffer is copied here.
    scratch: Vec<u8>,
}

impl Ring {
    fn page(&self) -> *mut sys::bindings::perf_event_mmap_page {
        self.base as *mut sys::bindings::perf_event_mmap_page
    }

    /// Calls `f` on every record written since the last read, then frees their space;
    /// stops after a record for which `f` says false (the rest stays for the next drain).
    fn drain(&mut self, f: &mut impl FnMut(&[u8]) -> bool) {
        let page = self.page();
        // SAFETY: the mapping lives as long as `self`; data_head/data_tail are u64 fields
        // of the control page that the kernel and this reader share as the perf ABI says
        // (acquire on head, release on tail).
        let (head_a, tail_a) = unsafe {
            (
                &*(std::ptr::addr_of_mut!((*page).data_head) as *const AtomicU64),
                &*(std::ptr::addr_of_mut!((*page).data_tail) as *const AtomicU64),
            )
        };
        let head = head_a.load(Ordering::Acquire);
        let mut tail = tail_a.load(Ordering::Relaxed);
        let data = unsafe { self.base.add(self.data_off) };
        let mask = self.data_size as u64 - 1;
        while tail < head {
            let off = (tail & mask) as usize;
            // Records are 8-byte aligned and the buffer a power of two: a header never wraps.
            let hdr = unsafe { std::slice::from_raw_parts(data.add(off), 8) };
            let size = u16::from_ne_bytes([hdr[6], hdr[7]]) as usize;
            if size < 8 || tail + size as u64 > head {
                break; // cannot happen with a sane kernel; never loop forever on it
            }
            let more = if off + size <= self.data_size {
                f(unsafe { std::slice::from_raw_parts(data.add(off), size) })
            } else {
                let first = self.data_size - off;
                self.scratch.clear();
                self.scratch
                    .extend_from_slice(unsafe { std::slice::from_raw_parts(data.add(off), first) });
                self.scratch
                    .extend_from_slice(unsafe { std::slice::from_raw_parts(data, size - first) });
                f(&self.scratch)
            };
            tail += size as u64;
            if !more {
                break;
            }
        }
        fence(Ordering::Release);
        tail_a.store(tail, Ordering::Release);
    }
}

// SAFETY: the mapping belongs to the process, not to a thread; a ring is read by one thread
// at a time (the attach's, then the reader's, which hands it back when it ends).
unsafe impl Send for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

#[derive(Clone, Copy, Debug)]
enum RecKind {
    Enter {
        nr: i64,
        args: [u64; 6],
    },
    Exit {
        nr: i64,
        ret: i64,
    },
    /// A traced task created a task: `pid` is the new task's process, `ppid` its parent's.
    Fork {
        pid: Tid,
        ppid: Tid,
    },
    /// A traced task ended.
    TaskExit,
    /// The task left a CPU (`out`; `preempt`: still runnable) or got one.
    Switch {
        out: bool,
        preempt: bool,
    },
    /// A task was woken (`woken`; the record's tid is the waker's).
    Wakeup {
        woken: Tid,
    },
    /// The task took a page fault.
    Fault {
        major: bool,
    },
}

/// What tells the scheduler's records apart (see `SchedClock`): the `sched:sched_wakeup`
/// tracepoint's id and where its `pid` field is, and the ids of the page-fault events (a
/// sample of an inherited event carries its parent's id).
#[derive(Clone, Debug, Default)]
pub(crate) struct SchedIds {
    pub wakeup: u64,
    pub wakeup_pid_off: usize,
    pub minor: HashSet<u64>,
    pub major: HashSet<u64>,
}

#[derive(Clone, Copy, Debug)]
struct Rec {
    ts: Nanos,
    pid: Tid,
    tid: Tid,
    kind: RecKind,
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4)
        .map_or(0, |s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    b.get(o..o + 8).map_or(0, |s| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_ne_bytes(a)
    })
}

/// Size of a page-fault sample (header, pid and tid, time, id): tracepoint samples, which
/// carry raw data, are always longer.
const FAULT_SAMPLE_LEN: usize = 32;

/// What a record says; `lost` gets the count of a LOST record. `sched`: the scheduler's
/// records are read too.
fn parse_record(
    b: &[u8],
    ids: (u64, u64),
    sched: Option<&SchedIds>,
    lost: &mut u64,
) -> Option<Rec> {
    let typ = u32_at(b, 0);
    match typ {
        sys::bindings::PERF_RECORD_SAMPLE if b.len() == FAULT_SAMPLE_LEN => {
            let s = sched?;
            let id = u64_at(b, 24);
            let major = s.major.contains(&id);
            if !major && !s.minor.contains(&id) {
                return None;
            }
            Some(Rec {
                ts: u64_at(b, 16) as Nanos,
                pid: u32_at(b, 8),
                tid: u32_at(b, 12),
                kind: RecKind::Fault { major },
            })
        }
        sys::bindings::PERF_RECORD_SWITCH => {
            sched?;
            // The sample_id trailer: pid, tid, time.
            let misc = u16::from_ne_bytes([*b.get(4)?, *b.get(5)?]) as u32;
            Some(Rec {
                ts: u64_at(b, 16) as Nanos,
                pid: u32_at(b, 8),
                tid: u32_at(b, 12),
                kind: RecKind::Switch {
                    out: misc & sys::bindings::PERF_RECORD_MISC_SWITCH_OUT != 0,
                    preempt: misc & sys::bindings::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT != 0,
                },
            })
        }
        sys::bindings::PERF_RECORD_SAMPLE => {
            // TID | TIME | RAW: pid, tid, time, raw size, raw (the tracepoint's fields).
            let pid = u32_at(b, 8);
            let tid = u32_at(b, 12);
            let ts = u64_at(b, 16) as Nanos;
            let raw_size = u32_at(b, 24) as usize;
            let raw = b.get(28..28 + raw_size)?;
            let common_type = u16::from_ne_bytes([*raw.first()?, *raw.get(1)?]) as u64;
            let nr = u64_at(raw, 8) as i64;
            let kind = if common_type == ids.0 {
                let mut args = [0u64; 6];
                for (i, a) in args.iter_mut().enumerate() {
                    *a = u64_at(raw, 16 + 8 * i);
                }
                RecKind::Enter { nr, args }
            } else if common_type == ids.1 {
                RecKind::Exit {
                    nr,
                    ret: u64_at(raw, 16) as i64,
                }
            } else if let Some(s) = sched.filter(|s| s.wakeup != 0 && common_type == s.wakeup) {
                RecKind::Wakeup {
                    woken: u32_at(raw, s.wakeup_pid_off),
                }
            } else {
                return None;
            };
            Some(Rec { ts, pid, tid, kind })
        }
        sys::bindings::PERF_RECORD_FORK | sys::bindings::PERF_RECORD_EXIT => {
            // pid, ppid, tid, ptid, time
            let pid = u32_at(b, 8);
            let ppid = u32_at(b, 12);
            let tid = u32_at(b, 16);
            let ts = u64_at(b, 24) as Nanos;
            let kind = if typ == sys::bindings::PERF_RECORD_FORK {
                RecKind::Fork { pid, ppid }
            } else {
                RecKind::TaskExit
            };
            Some(Rec { ts, pid, tid, kind })
        }
        sys::bindings::PERF_RECORD_LOST => {
            *lost += u64_at(b, 16);
            None
        }
        sys::bindings::PERF_RECORD_LOST_SAMPLES => {
            *lost += u64_at(b, 8);
            None
        }
        _ => None,
    }
}

/// The events opened per traced thread and CPU.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ev {
    Enter,
    Exit,
    Wakeup,
    Minor,
    Major,
}

#[derive(Clone, Copy)]
struct Entry {
    ts: Nanos,
    nr: i64,
    args: [u64; 6],
    /// The thread's scheduler counters at the entry (`SchedClock::snap`).
    sched: [u64; 4],
}

/// Where a thread is, for the scheduler's split.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum Run {
    /// Not known yet (traced since the attach, nothing seen of it).
    #[default]
    Unknown,
    /// On a CPU since.
    On(Nanos),
    /// Runnable (preempted, or woken) since, waiting for a CPU.
    Ready(Nanos),
    /// Asleep.
    Off,
}

/// A thread's scheduler counters, as the bpf backend reads them from the kernel's task
/// (ns on a CPU, ns runnable, minor faults, major faults, cumulative), rebuilt here from
/// the records perf gives: switches in and out of a CPU (`context_switch`, which says
/// whether the thread left it still runnable), `sched:sched_wakeup` of the thread (delivered
/// to the woken task's events), and one sample per page fault. They start at the attach.
#[derive(Clone, Copy, Debug, Default)]
struct SchedClock {
    cum: [u64; 4],
    run: Run,
}

impl SchedClock {
    /// The counters at `t` (no record older than the last one applied).
    fn snap(&self, t: Nanos) -> [u64; 4] {
        let mut c = self.cum;
        match self.run {
            Run::On(s) => c[0] += (t - s).max(0) as u64,
            Run::Ready(s) => c[1] += (t - s).max(0) as u64,
            Run::Unknown | Run::Off => {}
        }
        c
    }

    fn settle(&mut self, t: Nanos) {
        self.cum = self.snap(t);
        self.run = match self.run {
            Run::On(_) => Run::On(t),
            Run::Ready(_) => Run::Ready(t),
            r => r,
        };
    }

    /// A record the thread made itself (a syscall's edge, a fault): it is on a CPU.
    fn running(&mut self, t: Nanos) {
        self.settle(t);
        self.run = Run::On(t);
    }

    fn switch(&mut self, t: Nanos, out: bool, preempt: bool) {
        if !out {
            return self.running(t);
        }
        self.settle(t);
        self.run = if preempt { Run::Ready(t) } else { Run::Off };
    }

    /// Woken while on a CPU (before it slept): nothing changes.
    fn wake(&mut self, t: Nanos) {
        if matches!(self.run, Run::Off | Run::Unknown) {
            self.run = Run::Ready(t);
        }
    }

    fn fault(&mut self, t: Nanos, major: bool) {
        self.running(t);
        self.cum[if major { 3 } else { 2 }] += 1;
    }
}

struct Thread {
    tgid: Tid,
    entry: Option<Entry>,
    /// Traced since the attach (not created while tracing): its first record may be the
    /// exit of a call that was already running.
    from_attach: bool,
    seen: bool,
    clock: SchedClock,
    /// Its scheduler counters when its last call ended.
    last_exit: Option<[u64; 4]>,
}

impl Thread {
    fn new(tgid: Tid, from_attach: bool) -> Self {
        Thread {
            tgid,
            entry: None,
            from_attach,
            seen: false,
            clock: SchedClock::default(),
            last_exit: None,
        }
    }
}

pub struct PerfTracer {
    cfg: PerfConfig,
    /// What was opened: the events per thread and CPU, and the wakeups per CPU.
    events: Events,
    /// The per-CPU rings and the thread that reads them.
    rings: Rings,
    /// The scheduler's records are read (the split of calls and gaps, `SchedClock`).
    sched: Option<SchedIds>,
    /// Tids the kernel gave the events to through inheritance, with whether they are
    /// threads (true) or processes (false).
    forked: HashMap<Tid, bool>,
    threads: HashMap<Tid, Thread>,
    /// Records read and not yet turned into events (`fill`).
    pending: Vec<Rec>,
    /// `fill`'s buffers, kept between fills: the sort keys, and the other record buffer
    /// (the records held back are copied into it and the two swap).
    order: Vec<(Nanos, u32)>,
    held: Vec<Rec>,
    /// Time of the newest record processed, and how many records came older than it
    /// (committed more than `HOLD_BACK` after their time: their pairing may be wrong).
    processed_upto: Nanos,
    late_records: u64,
    /// The events ready, the counts, where tracing is (shared with the bpf backend).
    fed: Fed,
    last_rescan: std::time::Instant,
    pub threads_at_attach: u32,
}

/// The events a tracer opened.
struct Events {
    /// The ids of the raw_syscalls tracepoints (enter, exit).
    ids: (u64, u64),
    cpus: Vec<i32>,
    /// Every event fd (2 per traced thread per CPU, 5 with the scheduler's events).
    fds: Vec<i32>,
    /// The per-CPU `sched:sched_wakeup` events and the tids their filter keeps.
    wakeup_fds: Vec<i32>,
    wakeup_tids: Vec<Tid>,
    /// Tids with events of their own (opened at attach or by a rescan).
    opened: HashSet<Tid>,
    /// The kernel knows `inherit_thread` (used for --no-follow-forks).
    inherit_thread: bool,
}

/// The per-CPU rings: read by the attach itself until the reader thread takes them, and
/// again once it gave them back (`stop_reader`).
#[derive(Default)]
struct Rings {
    own: Vec<Ring>,
    /// The rings' fds (one per CPU), whoever holds the rings.
    fds: Vec<i32>,
    reader: Option<Reader<PerfRings>>,
}

/// The errno of the last failed call.
fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

fn open_event(attr: &mut sys::bindings::perf_event_attr, tid: Tid, cpu: i32) -> Result<i32, i32> {
    let fd = unsafe {
        sys::perf_event_open(
            attr,
            tid as libc::pid_t,
            cpu,
            -1,
            sys::bindings::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(fd)
    }
}

impl PerfTracer {
    /// Opens the tracepoints for every thread of `cfg.pid`; returns once all are traced.
    pub fn attach(cfg: PerfConfig) -> Result<Self, AttachError> {
        super::check_target(cfg.pid)?;
        let tp = find_tracepoints().map_err(AttachError::Other)?;
        let mut me = Self::unattached(cfg, (tp.enter, tp.exit));
        me.fed.pidns = super::container::PidNs::of(me.cfg.pid);
        let wakeup = if std::env::var_os(NO_SCHED_ENV).is_some_and(|v| v == "1") {
            Err(format!("{NO_SCHED_ENV}=1 is set"))
        } else {
            tracefs::id_and_offset(&tp.events(), "sched", "sched_wakeup", "pid")
        };
        match wakeup {
            Ok((wakeup, wakeup_pid_off)) => {
                me.sched = Some(SchedIds {
                    wakeup,
                    wakeup_pid_off,
                    ..Default::default()
                })
            }
            Err(why) => me.fed.warnings.push(format!(
                "no scheduler split of calls and gaps (sched): {why}"
            )),
        }
        me.fed.stats.attach_mono = now_mono();
        me.fed.stats.attach_wall = now_wall();
        let pid = me.cfg.pid;
        let mut first = true;
        // Rescan until a pass finds no new thread: a thread created by one whose events were
        // not open yet is not inherited and must be opened itself.
        loop {
            let tids = match super::list_tasks(pid) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(AttachError::NoSuchPid(pid))
                }
                Err(e) => {
                    return Err(AttachError::Other(format!(
                        "cannot list /proc/{pid}/task: {e}"
                    )))
                }
            };
            // Threads born from already traced ones carry the events: their fork record
            // is in the buffers already.
            me.read_rings();
            let mut added = 0;
            for tid in tids {
                if me.events.opened.contains(&tid) || me.forked.contains_key(&tid) {
                    continue;
                }
                match me.open_thread(tid) {
                    Ok(()) => {
                        added += 1;
                        me.threads.insert(tid, Thread::new(pid, true));
                    }
                    Err(libc::ESRCH) => continue, // exited meanwhile
                    Err(e) => return Err(me.open_error(e, first)),
                }
                first = false;
            }
            if first {
                return Err(AttachError::NoSuchPid(pid));
            }
            if added == 0 {
                break;
            }
        }
        me.threads_at_attach = me.events.opened.len() as u32;
        me.open_wakeups();
        me.start_reader()?;
        me.fed.queue.push_back(Event {
            tid: pid,
            ts: me.fed.stats.attach_mono,
            line: 0,
            kind: EventKind::Attach {
                threads: Some(me.threads_at_attach),
            },
        });
        Ok(me)
    }

    /// A tracer with nothing opened yet.
    fn unattached(cfg: PerfConfig, ids: (u64, u64)) -> Self {
        PerfTracer {
            events: Events {
                ids,
                cpus: online_cpus(),
                fds: vec![],
                wakeup_fds: vec![],
                wakeup_tids: vec![],
                opened: HashSet::default(),
                inherit_thread: true,
            },
            rings: Rings::default(),
            forked: HashMap::default(),
            threads: HashMap::default(),
            pending: vec![],
            order: vec![],
            held: vec![],
            processed_upto: 0,
            late_records: 0,
            sched: None,
            fed: Fed::new(),
            last_rescan: std::time::Instant::now(),
            threads_at_attach: 0,
            cfg,
        }
    }

    fn open_error(&self, errno: i32, first: bool) -> AttachError {
        if errno < 0 {
            return AttachError::Other(format!(
                "cannot map a perf ring buffer of {} pages ({}): give --perf-pages a smaller power of two, \
                 or raise kernel.perf_event_mlock_kb / RLIMIT_MEMLOCK",
                self.cfg.pages,
                std::io::Error::from_raw_os_error(-errno)
            ));
        }
        let err = std::io::Error::from_raw_os_error(errno);
        match errno {
            libc::EACCES | libc::EPERM => AttachError::Other(format!(
                "perf_event_open of the syscall tracepoints was refused ({err}): kernel.perf_event_paranoid is {}; \
                 tracepoints with raw data need root or CAP_PERFMON (or perf_event_paranoid -1)",
                paranoid().map_or("unknown".to_string(), |p| p.to_string())
            )),
            libc::EMFILE | libc::ENFILE => AttachError::Other(format!(
                "out of file descriptors opening {} perf events ({err}): raise `ulimit -n`",
                self.events.fds.len() + 1
            )),
            libc::ENOENT | libc::EINVAL if first => AttachError::Other(format!(
                "the kernel does not accept the raw_syscalls tracepoints through perf_event_open ({err})"
            )),
            _ => AttachError::Other(format!("perf_event_open failed: {err}")),
        }
    }

    fn attr(&self, ev: Ev) -> sys::bindings::perf_event_attr {
        let (type_, config, sample_type) = match ev {
            Ev::Enter | Ev::Exit | Ev::Wakeup => (
                sys::bindings::PERF_TYPE_TRACEPOINT,
                match ev {
                    Ev::Enter => self.events.ids.0,
                    Ev::Exit => self.events.ids.1,
                    _ => self.sched.as_ref().map_or(0, |s| s.wakeup),
                },
                sys::bindings::PERF_SAMPLE_TID
                    | sys::bindings::PERF_SAMPLE_TIME
                    | sys::bindings::PERF_SAMPLE_RAW,
            ),
            // The id tells minor from major (see FAULT_SAMPLE_LEN).
            Ev::Minor | Ev::Major => (
                sys::bindings::PERF_TYPE_SOFTWARE,
                if ev == Ev::Minor {
                    sys::bindings::PERF_COUNT_SW_PAGE_FAULTS_MIN
                } else {
                    sys::bindings::PERF_COUNT_SW_PAGE_FAULTS_MAJ
                } as u64,
                sys::bindings::PERF_SAMPLE_TID
                    | sys::bindings::PERF_SAMPLE_TIME
                    | sys::bindings::PERF_SAMPLE_ID,
            ),
        };
        let mut a = sys::bindings::perf_event_attr {
            size: std::mem::size_of::<sys::bindings::perf_event_attr>() as u32,
            type_,
            config,
            sample_type: sample_type as u64,
            clockid: libc::CLOCK_MONOTONIC,
            ..Default::default()
        };
        a.__bindgen_anon_1.sample_period = 1;
        // The wakeup event is per CPU, not per task (see `open_wakeups`).
        a.set_inherit((ev != Ev::Wakeup) as u64);
        if ev != Ev::Wakeup && !self.cfg.follow_forks && self.events.inherit_thread {
            // Only threads inherit the events; a forked child runs untraced (Linux 5.13+;
            // before that children inherit them and their records are dropped here).
            a.set_inherit_thread(1);
        }
        a.set_use_clockid(1);
        a.set_sample_id_all(1);
        // One event per thread and CPU says when tasks are created and end, and when the
        // thread gets and leaves a CPU.
        a.set_task((ev == Ev::Enter) as u64);
        a.set_context_switch((ev == Ev::Enter && self.sched.is_some()) as u64);
        a.set_watermark(1);
        // Wake the reader when a quarter of the buffer is used.
        a.__bindgen_anon_2.wakeup_watermark =
            (self.cfg.pages * super::page_size() / 4).max(1) as u32;
        a
    }

    /// Opens the events of `tid` on every CPU, into the CPUs' rings: the syscall enter and
    /// exit tracepoints, and for the scheduler's split its page faults. If those
    /// cannot be opened the trace goes on without the split, and the user is told.
    fn open_thread(&mut self, tid: Tid) -> Result<(), i32> {
        let mut new_fds = vec![];
        let mut sched_fds = vec![];
        let mut sched_err = None;
        let result = (|| {
            for (i, &cpu) in self.events.cpus.clone().iter().enumerate() {
                for ev in [Ev::Enter, Ev::Exit, Ev::Minor, Ev::Major] {
                    let for_sched = matches!(ev, Ev::Minor | Ev::Major);
                    if for_sched && (self.sched.is_none() || sched_err.is_some()) {
                        continue;
                    }
                    let fd = match self.open_ev(ev, tid, cpu) {
                        Ok(fd) => fd,
                        Err(e) if for_sched => {
                            sched_err = Some(e);
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    if for_sched {
                        sched_fds.push(fd);
                    } else {
                        new_fds.push(fd);
                    }
                    let r = self.output_to_ring(i, fd);
                    let r = r.and_then(|()| {
                        if for_sched {
                            self.note_fault_id(ev, fd)
                        } else {
                            Ok(())
                        }
                    });
                    match r {
                        Err(e) if for_sched => sched_err = Some(e),
                        Err(e) => return Err(e),
                        Ok(()) => {}
                    }
                }
            }
            Ok(())
        })();
        if let Some(e) = sched_err.filter(|_| result.is_ok()) {
            for fd in sched_fds.drain(..) {
                unsafe { libc::close(fd) };
            }
            self.sched = None;
            self.fed.warnings.push(format!(
                "no scheduler split of calls and gaps (sched): the page-fault events of thread {tid} could not be opened ({})",
                std::io::Error::from_raw_os_error(e)
            ));
        }
        match result {
            Ok(()) => {
                self.events.fds.extend(new_fds);
                self.events.fds.extend(sched_fds);
                self.events.opened.insert(tid);
                Ok(())
            }
            Err(e) => {
                // A ring mapped on one of these fds must go before its fd.
                self.rings
                    .own
                    .retain(|r| !new_fds.contains(&r.fd) && !sched_fds.contains(&r.fd));
                self.rings
                    .fds
                    .retain(|fd| !new_fds.contains(fd) && !sched_fds.contains(fd));
                for fd in new_fds.into_iter().chain(sched_fds) {
                    unsafe { libc::close(fd) };
                }
                Err(e)
            }
        }
    }

    /// Opens event `ev` of `tid` on `cpu` (without `inherit_thread` from the first time
    /// the kernel says it does not know it).
    fn open_ev(&mut self, ev: Ev, tid: Tid, cpu: i32) -> Result<i32, i32> {
        let mut attr = self.attr(ev);
        match open_event(&mut attr, tid, cpu) {
            Err(libc::EINVAL) if attr.inherit_thread() != 0 => {
                self.events.inherit_thread = false;
                let mut attr = self.attr(ev);
                open_event(&mut attr, tid, cpu)
            }
            r => r,
        }
    }

    /// Points event `fd` at the ring of the `i`th CPU, or maps that ring on it (the CPU's
    /// first event).
    fn output_to_ring(&mut self, i: usize, fd: i32) -> Result<(), i32> {
        if i >= self.rings.fds.len() {
            self.rings.own.push(self.map_ring(fd)?);
            self.rings.fds.push(fd);
            return Ok(());
        }
        match unsafe { sys::ioctls::SET_OUTPUT(fd, self.rings.fds[i] as libc::c_int) } {
            0 => Ok(()),
            _ => Err(last_errno()),
        }
    }

    /// Notes the id of page-fault event `fd`, by which its samples say minor or major.
    fn note_fault_id(&mut self, ev: Ev, fd: i32) -> Result<(), i32> {
        let mut id = 0u64;
        if unsafe { sys::ioctls::ID(fd, &mut id) } != 0 {
            return Err(last_errno());
        }
        if let Some(s) = self.sched.as_mut() {
            if ev == Ev::Major {
                s.major.insert(id);
            } else {
                s.minor.insert(id);
            }
        }
        Ok(())
    }

    /// The thread's wakeups, for the time it then waits for a CPU. `sched:sched_wakeup` of a
    /// per-task event only fires while that task runs (Linux 6.18 delivers no wakeup of the
    /// task itself to it: `perf record -e sched:sched_wakeup -p PID` shows only the wakeups
    /// PID makes), so it is opened once per CPU for every task, and a tracepoint filter on
    /// the woken pid keeps only the traced threads' (`refresh_wakeup_filter`). Without it
    /// the split still has each thread's switches: time runnable after a wakeup counts as
    /// blocked, and the user is told.
    fn open_wakeups(&mut self) {
        if self.sched.is_none() {
            return;
        }
        let mut err = None;
        for (i, &cpu) in self.events.cpus.clone().iter().enumerate() {
            let mut attr = self.attr(Ev::Wakeup);
            let fd = match open_event(&mut attr, -1i32 as Tid, cpu) {
                Ok(fd) => fd,
                Err(e) => {
                    err = Some(e);
                    break;
                }
            };
            self.events.wakeup_fds.push(fd);
            let r = match self.rings.fds.get(i) {
                Some(&ring) => unsafe { sys::ioctls::SET_OUTPUT(fd, ring as libc::c_int) },
                None => -1,
            };
            if r != 0 {
                err = Some(
                    std::io::Error::last_os_error()
                        .raw_os_error()
                        .unwrap_or(libc::EINVAL),
                );
                break;
            }
        }
        if err.is_none() && !self.refresh_wakeup_filter() {
            err = Some(libc::EINVAL);
        }
        if let Some(e) = err {
            self.close_wakeups();
            self.fed.warnings.push(format!(
                "the scheduler split counts time runnable after a wakeup as blocked: sched:sched_wakeup could not be opened per CPU with a pid filter ({})",
                std::io::Error::from_raw_os_error(e)
            ));
        }
    }

    fn close_wakeups(&mut self) {
        for fd in self.events.wakeup_fds.drain(..) {
            unsafe { libc::close(fd) };
        }
        self.events.wakeup_tids.clear();
    }

    /// Sets the wakeup events' filter to the traced threads, when they changed. False if
    /// the kernel refused it (the events would record every wakeup of the machine).
    fn refresh_wakeup_filter(&mut self) -> bool {
        if self.events.wakeup_fds.is_empty() {
            return true;
        }
        let mut tids: Vec<Tid> = self.threads.keys().copied().collect();
        tids.sort_unstable();
        // A filter is at most a page: past that many threads the list stays as it was.
        tids.truncate(WAKEUP_FILTER_MAX);
        if tids == self.events.wakeup_tids {
            return true;
        }
        let text = if tids.is_empty() {
            "pid == 0".to_string()
        } else {
            tids.iter()
                .map(|t| format!("pid == {t}"))
                .collect::<Vec<_>>()
                .join(" || ")
        };
        let Ok(c) = std::ffi::CString::new(text) else {
            return false;
        };
        for &fd in &self.events.wakeup_fds {
            if unsafe { sys::ioctls::SET_FILTER(fd, c.as_ptr() as *mut libc::c_char) } != 0 {
                return false;
            }
        }
        self.events.wakeup_tids = tids;
        true
    }

    fn map_ring(&self, fd: i32) -> Result<Ring, i32> {
        let ps = super::page_size();
        let len = (1 + self.cfg.pages) * ps;
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            // Negative: an mmap failure, told apart from perf_event_open's in `open_error`.
            return Err(-std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM));
        }
        let base = p as *mut u8;
        let page = base as *mut sys::bindings::perf_event_mmap_page;
        // Kernels before 4.1 leave these 0: the data starts after the control page.
        let (off, size) = unsafe { ((*page).data_offset, (*page).data_size) };
        let (data_off, data_size) = if size == 0 {
            (ps, self.cfg.pages * ps)
        } else {
            (off as usize, size as usize)
        };
        Ok(Ring {
            base,
            len,
            data_off,
            data_size,
            fd,
            scratch: vec![],
        })
    }

    /// Starts the reader thread, which takes the rings from here on.
    fn start_reader(&mut self) -> Result<(), AttachError> {
        let rings = PerfRings::new(std::mem::take(&mut self.rings.own));
        let reader = Reader::start("stallscope-perf", rings)
            .map_err(|e| AttachError::Other(format!("cannot start the ring reader: {e}")))?;
        self.rings.reader = Some(reader);
        Ok(())
    }

    /// Stops the reader thread once it has read everything committed, and takes the rings
    /// back.
    fn stop_reader(&mut self) {
        if let Some(rings) = self.rings.reader.as_mut().and_then(|r| r.stop()) {
            self.rings.own = rings.rings;
        }
    }

    /// Moves every committed record into `pending`: what the reader thread copied out, or,
    /// while there is none, what the rings hold. `wait`: how long to wait for the reader's
    /// next batch if it has none ready.
    fn read_rings_wait(&mut self, wait: Duration) {
        let ids = self.events.ids;
        let mut lost = 0;
        let pending = &mut self.pending;
        let forked = &mut self.forked;
        let sched = self.sched.as_ref();
        let mut take = |b: &[u8]| {
            if let Some(rec) = parse_record(b, ids, sched, &mut lost) {
                if let RecKind::Fork { pid, ppid } = rec.kind {
                    forked.insert(rec.tid, pid == ppid);
                }
                pending.push(rec);
            }
        };
        for r in &mut self.rings.own {
            r.drain(&mut |b| {
                take(b);
                true
            });
        }
        if let Some(reader) = &self.rings.reader {
            let mut wait = wait;
            while let Some(chunk) = reader.next(wait) {
                wait = Duration::ZERO;
                for_each_record(&chunk, &mut take);
                reader.give_back(chunk);
            }
        }
        if lost > 0 {
            self.fed.lost(lost);
        }
    }

    fn read_rings(&mut self) {
        self.read_rings_wait(Duration::ZERO)
    }

    /// Reads the rings and turns every record older than `upto` into events, in time order.
    fn fill(&mut self, upto: Nanos) {
        self.read_rings();
        if self.pending.is_empty() {
            return;
        }
        // Sorted by (time, place): the order of a stable sort by time, with 16-byte keys
        // moved instead of whole records (each ring is nearly sorted already).
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend(
            self.pending
                .iter()
                .enumerate()
                .map(|(i, r)| (r.ts, i as u32)),
        );
        order.sort_unstable();
        let n = order.partition_point(|(ts, _)| *ts <= upto);
        // Processed where they are (taken out of self for the loop): no copy of the ready
        // records at every fill; those held back go, in order, to the other buffer.
        let pending = std::mem::take(&mut self.pending);
        for &(_, i) in &order[..n] {
            let r = pending[i as usize];
            if r.ts < self.processed_upto {
                self.late_records += 1;
            } else {
                self.processed_upto = r.ts;
            }
            self.process(r);
        }
        debug_assert!(self.pending.is_empty(), "process() does not add records");
        let mut held = std::mem::take(&mut self.held);
        held.clear();
        held.extend(order[n..].iter().map(|&(_, i)| pending[i as usize]));
        let mut spare = pending;
        spare.clear();
        // As the event queue (`fed::QUEUE_KEEP`): no room kept for the largest backlog.
        for v in [&mut held, &mut spare] {
            if v.capacity() > 4 * super::fed::QUEUE_KEEP && v.len() < super::fed::QUEUE_KEEP {
                v.shrink_to(super::fed::QUEUE_KEEP);
            }
        }
        if order.capacity() > 4 * super::fed::QUEUE_KEEP {
            order.shrink_to(super::fed::QUEUE_KEEP);
        }
        self.pending = held;
        self.held = spare;
        self.order = order;
        // Threads come and go: the wakeups kept follow them.
        if !self.refresh_wakeup_filter() {
            self.close_wakeups();
            self.fed.warnings.push(
                "the scheduler split counts time runnable after a wakeup as blocked from here: the kernel refused the sched_wakeup filter for the new threads".into(),
            );
        }
    }

    /// A call from its entry (and its result, if it returned).
    fn build(&mut self, tid: Tid, tgid: Tid, e: Entry, ret: Option<i64>, end: Nanos) -> Event {
        self.build_with(tid, tgid, e, ret, end, true)
    }

    /// `build`; `args_known` false for a call already running at the attach, whose entry
    /// was not seen (only its result is known).
    fn build_with(
        &mut self,
        tid: Tid,
        tgid: Tid,
        e: Entry,
        ret: Option<i64>,
        end: Nanos,
        args_known: bool,
    ) -> Event {
        let info = nr_info(e.nr);
        let ret = self.fed.pidns.host_ret(info.sys, ret, tgid);
        let mut sc = Syscall::with(info.name, info.sys);
        let args = if args_known {
            Args::Late {
                args: &e.args,
                tgid,
                forked: &self.forked,
            }
        } else {
            Args::Unknown
        };
        decode::call(&mut sc, &info, ret, end - e.ts, args);
        Event {
            tid,
            ts: e.ts,
            line: 0,
            kind: EventKind::Syscall(sc),
        }
    }

    fn count(&mut self, tid: Tid, dur: Option<Nanos>) {
        self.fed.stats.count(tid, self.cfg.pid, dur);
    }

    /// Turns one record into its events (or into the state of its thread).
    #[inline]
    fn process(&mut self, r: Rec) {
        let tid = r.tid;
        // The scheduler's records. A wakeup is the waker's record (any process's) about
        // the woken thread.
        match r.kind {
            RecKind::Wakeup { woken } => {
                if let Some(th) = self.threads.get_mut(&woken) {
                    th.clock.wake(r.ts);
                }
                return;
            }
            RecKind::Switch { out, preempt } => {
                if let Some(th) = self.threads.get_mut(&tid) {
                    th.clock.switch(r.ts, out, preempt);
                }
                return;
            }
            RecKind::Fault { major } => {
                if let Some(th) = self.threads.get_mut(&tid) {
                    th.clock.fault(r.ts, major);
                }
                return;
            }
            _ => {}
        }
        if !self.cfg.follow_forks && r.pid != self.cfg.pid {
            return;
        }
        match r.kind {
            RecKind::Fork { pid, ppid } => {
                self.forked.insert(tid, pid == ppid);
                self.threads.insert(tid, Thread::new(pid, false));
            }
            RecKind::Enter { nr, args } => self.on_enter(&r, nr, args),
            RecKind::Exit { nr, ret } => self.on_exit(&r, nr, ret),
            RecKind::TaskExit => self.on_task_exit(&r),
            RecKind::Wakeup { .. } | RecKind::Switch { .. } | RecKind::Fault { .. } => {}
        }
    }

    /// A call's entry: kept until its exit. An entry still kept is a call that never
    /// returned (records were lost, or a call like execve that does not come back): known
    /// from its entry to this one.
    #[inline]
    fn on_enter(&mut self, r: &Rec, nr: i64, args: [u64; 6]) {
        let tid = r.tid;
        let th = self
            .threads
            .entry(tid)
            .or_insert_with(|| Thread::new(r.pid, false));
        th.seen = true;
        th.clock.running(r.ts);
        let sched = th.clock.snap(r.ts);
        let prev = th.entry.replace(Entry {
            ts: r.ts,
            nr,
            args,
            sched,
        });
        let tgid = th.tgid;
        if let Some(p) = prev {
            let mut ev = self.build(tid, tgid, p, None, r.ts);
            self.split(&mut ev, &p, sched);
            self.count(tid, None);
            self.fed.queue.push_back(ev);
        }
    }

    /// A call's exit: the call from its entry, or, for the first record of a thread traced
    /// since the attach, a call that was running then.
    #[inline]
    fn on_exit(&mut self, r: &Rec, nr: i64, ret: i64) {
        let tid = r.tid;
        let Some(th) = self.threads.get_mut(&tid) else {
            return;
        };
        let first = !th.seen && th.from_attach;
        th.seen = true;
        th.clock.running(r.ts);
        let at_exit = th.clock.snap(r.ts);
        let tgid = th.tgid;
        let (e, in_flight) = match th.entry.take() {
            Some(e) if e.nr == nr => (e, None),
            Some(e) => {
                // Mismatched pair (records lost in between): keep neither guess.
                th.last_exit = None;
                let ev = self.build(tid, tgid, e, None, r.ts);
                self.count(tid, None);
                self.fed.queue.push_back(ev);
                return;
            }
            None if first => {
                // Running at the attach: what the scheduler did in it before is not known,
                // its part since then is (the counters start at the attach), and the next
                // gap starts here.
                th.last_exit = Some(at_exit);
                let e = Entry {
                    ts: self.fed.stats.attach_mono,
                    nr,
                    args: [0; 6],
                    sched: [0; 4],
                };
                (e, Some(InFlight::AtStart))
            }
            // The child's side of a clone (returns 0 with no entry), or a call whose entry
            // was lost.
            None => {
                th.last_exit = Some(at_exit);
                return;
            }
        };
        let mut ev = self.build_with(tid, tgid, e, Some(ret), r.ts, in_flight.is_none());
        if let EventKind::Syscall(sc) = &mut ev.kind {
            sc.in_flight = in_flight;
            if in_flight.is_some() && self.sched.is_some() {
                sc.sched = Some(Box::new(event::SchedSpan {
                    during: super::sched_delta(&e.sched, &at_exit),
                    before: None,
                }));
            }
        }
        if in_flight.is_none() {
            self.split(&mut ev, &e, at_exit);
            if let Some(th) = self.threads.get_mut(&tid) {
                th.last_exit = Some(at_exit);
            }
        }
        self.count(tid, in_flight.is_none().then(|| r.ts - e.ts));
        self.fed.queue.push_back(ev);
    }

    /// A traced task ended: the call it was in, if any, never returned.
    fn on_task_exit(&mut self, r: &Rec) {
        let tid = r.tid;
        let Some(th) = self.threads.remove(&tid) else {
            return;
        };
        let mut code = None;
        if let Some(e) = th.entry {
            if nr_info(e.nr).sys.facts.has(crate::syscalls::Facts::EXIT) {
                code = Some(e.args[0] as i32);
            }
            let mut ev = self.build(tid, th.tgid, e, None, r.ts);
            if self.sched.is_some() {
                let before = th.last_exit.map(|l| super::sched_delta(&l, &e.sched));
                if let EventKind::Syscall(sc) = &mut ev.kind {
                    sc.sched = Some(Box::new(event::SchedSpan {
                        during: super::sched_delta(&e.sched, &th.clock.snap(r.ts)),
                        before,
                    }));
                }
            }
            self.count(tid, None);
            self.fed.queue.push_back(ev);
        }
        self.fed.queue.push_back(Event {
            tid,
            ts: r.ts,
            line: 0,
            kind: EventKind::Exit { code, signal: None },
        });
    }

    /// Gives a call of `ev`'s thread, from entry `e` to counters `end`, the scheduler's
    /// split of it and of the gap before it (when the scheduler's records are read).
    fn split(&mut self, ev: &mut Event, e: &Entry, end: [u64; 4]) {
        if self.sched.is_none() {
            return;
        }
        let before = self
            .threads
            .get(&ev.tid)
            .and_then(|t| t.last_exit)
            .map(|l| super::sched_delta(&l, &e.sched));
        if let EventKind::Syscall(sc) = &mut ev.kind {
            sc.sched = Some(self.fed.spans.boxed(event::SchedSpan {
                during: super::sched_delta(&e.sched, &end),
                before,
            }));
        }
    }

    /// Threads of the process that have no events (neither opened nor inherited): created
    /// in the instant between a listing and the open. Opened now; what they did before is
    /// missing, and the user is told.
    fn rescan(&mut self) {
        let tids = match super::list_tasks(self.cfg.pid) {
            Ok(t) => t,
            Err(_) => return,
        };
        for tid in tids {
            if self.events.opened.contains(&tid) || self.forked.contains_key(&tid) {
                continue;
            }
            if self.open_thread(tid).is_ok() {
                self.threads
                    .entry(tid)
                    .or_insert_with(|| Thread::new(self.cfg.pid, true));
                self.fed.warnings.push(format!(
                    "thread {tid} was found untraced by a rescan of /proc/{}/task; its calls before then are missing",
                    self.cfg.pid
                ));
            }
        }
    }

    /// Ends tracing: reads what is left, closes every event, reports calls still running.
    fn finish(&mut self) {
        let end = now_mono();
        self.fed.stats.detach_mono = end;
        // Closing the events stops the records (inherited copies go with their parent);
        // the rings' own events are disabled, and the rings stay mapped until read once more.
        self.close_wakeups();
        for fd in self.events.fds.drain(..) {
            if !self.rings.fds.contains(&fd) {
                unsafe { libc::close(fd) };
            }
        }
        for &fd in &self.rings.fds {
            unsafe { sys::ioctls::DISABLE(fd, 0) };
        }
        self.stop_reader();
        self.read_rings();
        self.fill(end);
        self.pending.clear();
        let mut tids: Vec<Tid> = self.threads.keys().copied().collect();
        tids.sort_unstable();
        for tid in tids {
            let (e, tgid, at_end) = match self.threads.get_mut(&tid) {
                Some(t) => (t.entry.take(), t.tgid, t.clock.snap(end)),
                None => continue,
            };
            if let Some(e) = e {
                let mut ev = self.build(tid, tgid, e, None, end);
                self.split(&mut ev, &e, at_end);
                if let EventKind::Syscall(sc) = &mut ev.kind {
                    sc.in_flight = Some(InFlight::AtEnd);
                }
                self.count(tid, None);
                self.fed.queue.push_back(ev);
            }
        }
        self.rings.own.clear();
        for fd in self.rings.fds.drain(..) {
            unsafe { libc::close(fd) };
        }
        self.fed.queue.push_back(Event {
            tid: self.cfg.pid,
            ts: end,
            line: 0,
            kind: EventKind::Detach,
        });
        self.fed.done = true;
    }

    /// Waits for the rings (while the attach reads them itself).
    fn poll(&self, timeout: Duration) {
        let mut pfds: Vec<libc::pollfd> = self
            .rings
            .own
            .iter()
            .map(|r| libc::pollfd {
                fd: r.fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        unsafe {
            libc::poll(
                pfds.as_mut_ptr(),
                pfds.len() as libc::nfds_t,
                timeout.as_millis().min(i32::MAX as u128) as i32,
            )
        };
    }
}

/// Calls `f` on each record of `chunk`, whole records as the reader copied them.
fn for_each_record(chunk: &[u8], f: &mut impl FnMut(&[u8])) {
    let mut off = 0;
    while off + 8 <= chunk.len() {
        let size = u16::from_ne_bytes([chunk[off + 6], chunk[off + 7]]) as usize;
        if size < 8 || off + size > chunk.len() {
            return;
        }
        f(&chunk[off..off + size]);
        off += size;
    }
}

/// Most bytes the reader sends at once: the analysis starts on a backlog before all of it
/// is copied.
const CHUNK_MAX: usize = 1 << 20;

/// Chunks handed back to the reader at most, and the room a new one starts with: the
/// reader refills them instead of growing a fresh vector (by doubling, each growth a copy)
/// at every pass, and the analysis's side does not free the reader's allocations.
const SPARE_CHUNKS: usize = 8;
const CHUNK_START: usize = 64 << 10;

/// The rings, as the reader thread reads them: their records' bytes copied out whole, in
/// chunks. Sleeps in poll between passes (the kernel wakes it when a quarter of a ring is
/// used; the timeout bounds the delay).
struct PerfRings {
    rings: Vec<Ring>,
    pfds: Vec<libc::pollfd>,
    /// The ring a pass goes on from, when the last chunk filled up part way through it.
    next: usize,
}

impl PerfRings {
    fn new(rings: Vec<Ring>) -> Self {
        let pfds = rings
            .iter()
            .map(|r| libc::pollfd {
                fd: r.fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        PerfRings {
            rings,
            pfds,
            next: 0,
        }
    }
}

impl super::reader::Source for PerfRings {
    type Item = u8;
    const BATCH_START: usize = CHUNK_START;
    const SPARES: usize = SPARE_CHUNKS;

    fn fill(&mut self, chunk: &mut Vec<u8>) -> bool {
        while let Some(r) = self.rings.get_mut(self.next) {
            r.drain(&mut |b| {
                chunk.extend_from_slice(b);
                chunk.len() < CHUNK_MAX
            });
            if chunk.len() >= CHUNK_MAX {
                return true;
            }
            self.next += 1;
        }
        self.next = 0;
        false
    }

    fn wait(&mut self) {
        unsafe { libc::poll(self.pfds.as_mut_ptr(), self.pfds.len() as libc::nfds_t, 5) };
    }
}

impl super::fed::KernelFed for PerfTracer {
    fn fed(&mut self) -> &mut super::fed::Fed {
        &mut self.fed
    }
    fn finish(&mut self) {
        PerfTracer::finish(self)
    }
    /// Also looks for threads the events missed, now and then.
    fn check(&mut self) -> bool {
        if super::fed::process_gone(self.cfg.pid) {
            return true;
        }
        if self.last_rescan.elapsed() >= RESCAN_EVERY {
            self.last_rescan = std::time::Instant::now();
            self.read_rings();
            self.rescan();
        }
        false
    }
    /// Records are taken up to `HOLD_BACK` ago (see the module's comment).
    fn gather(&mut self, wait: Duration) {
        self.fill(now_mono() - HOLD_BACK);
        if self.fed.queue.is_empty() && !wait.is_zero() {
            if self.rings.reader.is_some() {
                self.read_rings_wait(wait);
            } else {
                self.poll(wait);
            }
            self.fill(now_mono() - HOLD_BACK);
        }
    }
}

impl Tracer for PerfTracer {
    fn next_event_timeout(&mut self, timeout: Duration) -> Result<Option<Event>> {
        Ok(super::fed::next_event_timeout(self, timeout))
    }

    fn next_batch(&mut self, timeout: Duration, out: &mut VecDeque<Event>) -> Result<()> {
        super::fed::next_batch(self, timeout, out);
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.fed.done && self.fed.queue.is_empty()
    }

    fn stop(&mut self) {
        self.fed.stop_requested = true;
    }

    fn take_lost(&mut self) -> u64 {
        std::mem::take(&mut self.fed.lost_unreported)
    }

    #[allow(clippy::vec_box)]
    fn reuse(&mut self, spent: &mut Vec<Box<event::SchedSpan>>) {
        self.fed.spans.take_back(spent);
    }

    fn splits_sched(&self) -> bool {
        self.sched.is_some()
    }

    fn stats(&self) -> TracerStats {
        let mut s = self.fed.stats.clone();
        s.ns_pids = self.fed.pidns.pairs();
        s
    }

    fn warnings(&mut self) -> Vec<String> {
        let mut w = std::mem::take(&mut self.fed.warnings);
        if self.late_records > 0 {
            w.push(format!(
                "{} syscall records were committed more than {} ms after their time (a CPU held up): calls around them may be mispaired",
                self.late_records,
                HOLD_BACK / 1_000_000
            ));
        }
        if self.fed.stats.lost_events > 0 {
            w.push(format!(
                "the kernel dropped {} syscall records (ring buffers of {} pages per CPU filled up): the trace is incomplete; \
                 give --perf-pages a larger power of two",
                self.fed.stats.lost_events, self.cfg.pages
            ));
        }
        w
    }
}

impl Drop for PerfTracer {
    fn drop(&mut self) {
        // Unmap before closing; `fds` holds the rings' fds too (after `finish` both are empty).
        self.stop_reader();
        self.rings.own.clear();
        self.close_wakeups();
        for fd in self.events.fds.drain(..) {
            unsafe { libc::close(fd) };
        }
    }
}

/// The checks that make common failures clear before any event is opened.
/// Whether the perf backend can be used here, and if not why (for `--backend auto`).
pub fn available() -> Result<(), String> {
    find_tracepoints()?;
    let root = unsafe { libc::geteuid() } == 0;
    if !root && paranoid().is_some_and(|p| p > -1) && !has_cap_perfmon() {
        return Err(format!(
            "not root, no CAP_PERFMON, and kernel.perf_event_paranoid is {} (raw tracepoint data needs -1)",
            paranoid().unwrap_or(2)
        ));
    }
    Ok(())
}

/// CAP_PERFMON (38) or CAP_SYS_ADMIN (21) in the effective set.
fn has_cap_perfmon() -> bool {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = s
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    eff & (1 << 38) != 0 || eff & (1 << 21) != 0
}

#[cfg(test)]
mod tests;
