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
//! processes, and when a thread ends. `PERF_RECORD_LOST` records count what the kernel
//! dropped when a buffer was full: they are reported, never silently absorbed.
//!
//! What this backend cannot see, because it never stops the tracee: the contents of
//! read/write buffers (no RESP command names: per-command latency and the commands held up
//! by a stall are not available), and signals. Paths of `open`-like calls and `rename`
//! are read from the process's memory when the record is processed (a few ms later):
//! racy, but the returned fd's `/proc/PID/fd` link is read too and preferred, as strace -y
//! does.

use super::decode::{decode_args, decodes_more};
use super::sysnames::{errno_name, syscall_name};
use super::{now_mono, now_wall, AttachError, Tracer, TracerStats};
use crate::event::{self, Event, EventKind, InFlight, Nanos, Ret, Syscall, Tid};
use crate::syscalls::{FdKind, SysInfo};
use anyhow::Result;
use perf_event_open_sys as sys;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::Duration;

/// Default ring-buffer size per CPU: 8 MiB holds about 50,000 syscalls (~150 bytes
/// each for the enter and exit records), a quarter of a second of a saturated redis.
pub const DEFAULT_PAGES: usize = 2048;

/// Records younger than this are left for the next read: another CPU may still be writing
/// an older record of the same thread (the time is taken before the record is committed).
const HOLD_BACK: Nanos = 3_000_000;

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

/// Where tracefs is and the ids of the two syscall tracepoints.
#[derive(Clone, Debug)]
pub struct Tracepoints {
    pub root: PathBuf,
    pub enter: u64,
    pub exit: u64,
}

/// Finds tracefs and the raw_syscalls tracepoint ids, or says why they cannot be used.
pub fn find_tracepoints() -> Result<Tracepoints, String> {
    let mut why = vec![];
    for root in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        let root = PathBuf::from(root);
        let ev = root.join("events");
        match std::fs::metadata(&ev) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                why.push(format!("{}: {e}", ev.display()));
                continue;
            }
        }
        let id = |name: &str| -> Result<u64, String> {
            let p = ev.join("raw_syscalls").join(name).join("id");
            let s = std::fs::read_to_string(&p).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    format!(
                        "{} is missing (a kernel without syscall tracepoints, CONFIG_FTRACE_SYSCALLS)",
                        p.display()
                    )
                } else {
                    format!("cannot read {}: {e}", p.display())
                }
            })?;
            s.trim()
                .parse()
                .map_err(|_| format!("{}: not a tracepoint id: {s:?}", p.display()))
        };
        match (id("sys_enter"), id("sys_exit")) {
            (Ok(enter), Ok(exit)) => return Ok(Tracepoints { root, enter, exit }),
            (Err(e), _) | (_, Err(e)) => why.push(e),
        }
    }
    if why.is_empty() {
        Err(
            "tracefs is mounted neither at /sys/kernel/tracing nor at /sys/kernel/debug/tracing \
             (as root: mount -t tracefs nodev /sys/kernel/tracing)"
                .into(),
        )
    } else {
        Err(why.join("; "))
    }
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

    /// Calls `f` on every record written since the last read, then frees their space.
    fn drain(&mut self, f: &mut impl FnMut(&[u8])) {
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
            if off + size <= self.data_size {
                f(unsafe { std::slice::from_raw_parts(data.add(off), size) });
            } else {
                let first = self.data_size - off;
                self.scratch.clear();
                self.scratch
                    .extend_from_slice(unsafe { std::slice::from_raw_parts(data.add(off), first) });
                self.scratch
                    .extend_from_slice(unsafe { std::slice::from_raw_parts(data, size - first) });
                f(&self.scratch);
            }
            tail += size as u64;
        }
        fence(Ordering::Release);
        tail_a.store(tail, Ordering::Release);
    }
}

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

/// What a record says; `lost` gets the count of a LOST record.
fn parse_record(b: &[u8], ids: (u64, u64), lost: &mut u64) -> Option<Rec> {
    let typ = u32_at(b, 0);
    match typ {
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

#[derive(Clone, Copy)]
struct Entry {
    ts: Nanos,
    nr: i64,
    args: [u64; 6],
}

struct Thread {
    tgid: Tid,
    entry: Option<Entry>,
    /// Traced since the attach (not created while tracing): its first record may be the
    /// exit of a call that was already running.
    from_attach: bool,
    seen: bool,
}

/// Per syscall number: its name, its table entry and whether its arguments need more than
/// the fd.
#[derive(Clone, Copy)]
struct NrInfo {
    name: &'static str,
    sys: &'static SysInfo,
    decode: bool,
}

pub struct PerfTracer {
    cfg: PerfConfig,
    ids: (u64, u64),
    cpus: Vec<i32>,
    rings: Vec<Ring>,
    /// Every event fd (2 per traced thread per CPU).
    fds: Vec<i32>,
    /// Tids with events of their own (opened at attach or by a rescan).
    opened: HashSet<Tid>,
    /// Tids the kernel gave the events to through inheritance, with whether they are
    /// threads (true) or processes (false).
    forked: HashMap<Tid, bool>,
    threads: HashMap<Tid, Thread>,
    pending: Vec<Rec>,
    queue: VecDeque<Event>,
    stats: TracerStats,
    lost_unreported: u64,
    /// Time of the newest record processed, and how many records came older than it
    /// (committed more than `HOLD_BACK` after their time: their pairing may be wrong).
    processed_upto: Nanos,
    late_records: u64,
    /// The kernel knows `inherit_thread` (used for --no-follow-forks).
    inherit_thread: bool,
    nr_info: Vec<Option<NrInfo>>,
    stop_requested: bool,
    done: bool,
    warnings: Vec<String>,
    last_check: std::time::Instant,
    last_rescan: std::time::Instant,
    pub threads_at_attach: u32,
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
        me.stats.attach_mono = now_mono();
        me.stats.attach_wall = now_wall();
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
                if me.opened.contains(&tid) || me.forked.contains_key(&tid) {
                    continue;
                }
                match me.open_thread(tid) {
                    Ok(()) => {
                        added += 1;
                        me.threads.insert(
                            tid,
                            Thread {
                                tgid: pid,
                                entry: None,
                                from_attach: true,
                                seen: false,
                            },
                        );
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
        me.threads_at_attach = me.opened.len() as u32;
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

    /// A tracer with nothing opened yet.
    fn unattached(cfg: PerfConfig, ids: (u64, u64)) -> Self {
        PerfTracer {
            ids,
            cpus: online_cpus(),
            rings: vec![],
            fds: vec![],
            opened: HashSet::new(),
            forked: HashMap::new(),
            threads: HashMap::new(),
            pending: vec![],
            queue: VecDeque::new(),
            stats: TracerStats::default(),
            lost_unreported: 0,
            processed_upto: 0,
            late_records: 0,
            inherit_thread: true,
            nr_info: vec![],
            stop_requested: false,
            done: false,
            warnings: vec![],
            last_check: std::time::Instant::now(),
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
                self.fds.len() + 1
            )),
            libc::ENOENT | libc::EINVAL if first => AttachError::Other(format!(
                "the kernel does not accept the raw_syscalls tracepoints through perf_event_open ({err})"
            )),
            _ => AttachError::Other(format!("perf_event_open failed: {err}")),
        }
    }

    fn attr(&self, config: u64, task: bool) -> sys::bindings::perf_event_attr {
        let mut a = sys::bindings::perf_event_attr {
            size: std::mem::size_of::<sys::bindings::perf_event_attr>() as u32,
            type_: sys::bindings::PERF_TYPE_TRACEPOINT,
            config,
            sample_type: (sys::bindings::PERF_SAMPLE_TID
                | sys::bindings::PERF_SAMPLE_TIME
                | sys::bindings::PERF_SAMPLE_RAW) as u64,
            clockid: libc::CLOCK_MONOTONIC,
            ..Default::default()
        };
        a.__bindgen_anon_1.sample_period = 1;
        a.set_inherit(1);
        if !self.cfg.follow_forks && self.inherit_thread {
            // Only threads inherit the events; a forked child runs untraced (Linux 5.13+;
            // before that children inherit them and their records are dropped here).
            a.set_inherit_thread(1);
        }
        a.set_use_clockid(1);
        a.set_sample_id_all(1);
        a.set_task(task as u64);
        a.set_watermark(1);
        // Wake the reader when a quarter of the buffer is used.
        a.__bindgen_anon_2.wakeup_watermark =
            (self.cfg.pages * super::page_size() / 4).max(1) as u32;
        a
    }

    /// Opens the enter and exit events of `tid` on every CPU, into the CPUs' rings.
    fn open_thread(&mut self, tid: Tid) -> Result<(), i32> {
        let mut new_fds = vec![];
        let result = (|| {
            for (i, &cpu) in self.cpus.clone().iter().enumerate() {
                for (config, task) in [(self.ids.0, true), (self.ids.1, false)] {
                    let mut attr = self.attr(config, task);
                    let fd = match open_event(&mut attr, tid, cpu) {
                        Err(libc::EINVAL) if attr.inherit_thread() != 0 => {
                            self.inherit_thread = false;
                            let mut attr = self.attr(config, task);
                            open_event(&mut attr, tid, cpu)?
                        }
                        r => r?,
                    };
                    new_fds.push(fd);
                    if i >= self.rings.len() {
                        self.rings.push(self.map_ring(fd)?);
                    } else {
                        let r =
                            unsafe { sys::ioctls::SET_OUTPUT(fd, self.rings[i].fd as libc::c_int) };
                        if r != 0 {
                            return Err(std::io::Error::last_os_error()
                                .raw_os_error()
                                .unwrap_or(libc::EINVAL));
                        }
                    }
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                self.fds.extend(new_fds);
                self.opened.insert(tid);
                Ok(())
            }
            Err(e) => {
                // A ring mapped on one of these fds must go before its fd.
                self.rings.retain(|r| !new_fds.contains(&r.fd));
                for fd in new_fds {
                    unsafe { libc::close(fd) };
                }
                Err(e)
            }
        }
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

    /// Moves every committed record of every ring into `pending`.
    fn read_rings(&mut self) {
        let ids = self.ids;
        let mut lost = 0;
        let pending = &mut self.pending;
        let forked = &mut self.forked;
        for r in &mut self.rings {
            r.drain(&mut |b| {
                if let Some(rec) = parse_record(b, ids, &mut lost) {
                    if let RecKind::Fork { pid, ppid } = rec.kind {
                        forked.insert(rec.tid, pid == ppid);
                    }
                    pending.push(rec);
                }
            });
        }
        if lost > 0 {
            self.stats.lost_events += lost;
            self.lost_unreported += lost;
        }
    }

    /// Reads the rings and turns every record older than `upto` into events, in time order.
    fn fill(&mut self, upto: Nanos) {
        self.read_rings();
        if self.pending.is_empty() {
            return;
        }
        // Each ring is nearly sorted already: the stable sort merges the runs cheaply.
        self.pending.sort_by_key(|r| r.ts);
        let n = self.pending.partition_point(|r| r.ts <= upto);
        let ready: Vec<Rec> = self.pending.drain(..n).collect();
        // As the event queue (`fed::QUEUE_KEEP`): no room kept for the largest backlog.
        if self.pending.capacity() > 4 * super::fed::QUEUE_KEEP
            && self.pending.len() < super::fed::QUEUE_KEEP
        {
            self.pending.shrink_to(super::fed::QUEUE_KEEP);
        }
        for r in ready {
            if r.ts < self.processed_upto {
                self.late_records += 1;
            } else {
                self.processed_upto = r.ts;
            }
            self.process(r);
        }
    }

    fn info(&mut self, nr: i64) -> NrInfo {
        let i = nr as usize;
        if nr >= 0 && i < 4096 {
            if let Some(Some(x)) = self.nr_info.get(i) {
                return *x;
            }
        }
        let name = syscall_name(nr);
        let sys = crate::syscalls::info(name);
        let x = NrInfo {
            name,
            sys,
            decode: decodes_more(sys),
        };
        if nr >= 0 && i < 4096 {
            if self.nr_info.len() <= i {
                self.nr_info.resize(i + 1, None);
            }
            self.nr_info[i] = Some(x);
        }
        x
    }

    /// A call from its entry (and its result, if it returned).
    fn build(&mut self, tid: Tid, tgid: Tid, e: Entry, ret: Option<i64>, end: Nanos) -> Event {
        self.build_with(tid, tgid, e, ret, end, true)
    }

    fn build_with(
        &mut self,
        tid: Tid,
        tgid: Tid,
        e: Entry,
        ret: Option<i64>,
        end: Nanos,
        args_known: bool,
    ) -> Event {
        let info = self.info(e.nr);
        let mut sc = Syscall::with(info.name, info.sys);
        sc.ret = match ret {
            Some(r) if (-4095..0).contains(&r) => Ret::Err(errno_name(-r)),
            Some(r) => Ret::Val(r),
            None => Ret::Unknown,
        };
        sc.dur = Some((end - e.ts).max(0));
        sc.dur_src = event::DurSource::Measured;
        let ok = sc.ret.val();
        if !args_known {
            // Only the result of a call already running at attach is known.
        } else if info.decode {
            decode_args(tgid, &mut sc, &e.args, ok, false);
            if let Some(r) = ok.filter(|r| *r > 0) {
                match info.sys.fd {
                    FdKind::Open => {
                        // What strace -y shows: the file the new fd names, if still open.
                        if let Ok(p) = std::fs::read_link(format!("/proc/{tgid}/fd/{r}")) {
                            sc.ret_path = Some(p.to_string_lossy().into_owned().into_boxed_str());
                        }
                    }
                    FdKind::Clone => {
                        if let Some(thread) = self.forked.get(&(r as Tid)) {
                            sc.extra = event::Extra::Clone { thread: *thread };
                        }
                    }
                    _ => {}
                }
            }
        } else if info.sys.fd_first {
            let fd = e.args[0] as i64;
            if (0..=i32::MAX as i64).contains(&fd) {
                sc.fd = Some(fd as i32);
            }
        }
        Event {
            tid,
            ts: e.ts,
            line: 0,
            kind: EventKind::Syscall(sc),
        }
    }

    fn count(&mut self, tid: Tid, dur: Option<Nanos>) {
        self.stats.count(tid, self.cfg.pid, dur);
    }

    fn process(&mut self, r: Rec) {
        if !self.cfg.follow_forks && r.pid != self.cfg.pid {
            return;
        }
        let tid = r.tid;
        match r.kind {
            RecKind::Fork { pid, ppid } => {
                self.forked.insert(tid, pid == ppid);
                self.threads.insert(
                    tid,
                    Thread {
                        tgid: pid,
                        entry: None,
                        from_attach: false,
                        seen: false,
                    },
                );
            }
            RecKind::Enter { nr, args } => {
                let th = self.threads.entry(tid).or_insert(Thread {
                    tgid: r.pid,
                    entry: None,
                    from_attach: false,
                    seen: false,
                });
                th.seen = true;
                let prev = th.entry.replace(Entry { ts: r.ts, nr, args });
                let tgid = th.tgid;
                if let Some(p) = prev {
                    // It never returned (records were lost, or a call like execve that
                    // does not come back): known from its entry to the next one.
                    let ev = self.build(tid, tgid, p, None, r.ts);
                    self.count(tid, None);
                    self.queue.push_back(ev);
                }
            }
            RecKind::Exit { nr, ret } => {
                let (entry, tgid, in_flight) = match self.threads.get_mut(&tid) {
                    Some(th) => {
                        let first = !th.seen && th.from_attach;
                        th.seen = true;
                        match th.entry.take() {
                            Some(e) if e.nr == nr => (Some(e), th.tgid, None),
                            Some(e) => {
                                // Mismatched pair (records lost in between): keep neither guess.
                                th.entry = None;
                                let tgid = th.tgid;
                                let ev = self.build(tid, tgid, e, None, r.ts);
                                self.count(tid, None);
                                self.queue.push_back(ev);
                                return;
                            }
                            None if first => (
                                Some(Entry {
                                    ts: self.stats.attach_mono,
                                    nr,
                                    args: [0; 6],
                                }),
                                th.tgid,
                                Some(InFlight::AtStart),
                            ),
                            // The child's side of a clone (returns 0 with no entry), or
                            // a call whose entry was lost.
                            None => return,
                        }
                    }
                    None => return,
                };
                if let Some(e) = entry {
                    let mut ev =
                        self.build_with(tid, tgid, e, Some(ret), r.ts, in_flight.is_none());
                    if let EventKind::Syscall(sc) = &mut ev.kind {
                        sc.in_flight = in_flight;
                    }
                    self.count(tid, in_flight.is_none().then(|| r.ts - e.ts));
                    self.queue.push_back(ev);
                }
            }
            RecKind::TaskExit => {
                let th = match self.threads.remove(&tid) {
                    Some(t) => t,
                    None => return,
                };
                let mut code = None;
                if let Some(e) = th.entry {
                    let name = self.info(e.nr).name;
                    if matches!(name, "exit" | "exit_group") {
                        code = Some(e.args[0] as i32);
                    }
                    let ev = self.build(tid, th.tgid, e, None, r.ts);
                    self.count(tid, None);
                    self.queue.push_back(ev);
                }
                self.queue.push_back(Event {
                    tid,
                    ts: r.ts,
                    line: 0,
                    kind: EventKind::Exit { code, signal: None },
                });
            }
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
            if self.opened.contains(&tid) || self.forked.contains_key(&tid) {
                continue;
            }
            if self.open_thread(tid).is_ok() {
                self.threads.entry(tid).or_insert(Thread {
                    tgid: self.cfg.pid,
                    entry: None,
                    from_attach: true,
                    seen: false,
                });
                self.warnings.push(format!(
                    "thread {tid} was found untraced by a rescan of /proc/{}/task; its calls before then are missing",
                    self.cfg.pid
                ));
            }
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

    /// Ends tracing: reads what is left, closes every event, reports calls still running.
    fn finish(&mut self) {
        let end = now_mono();
        self.stats.detach_mono = end;
        // Closing the events stops the records (inherited copies go with their parent);
        // the rings stay mapped until read once more.
        for fd in self.fds.drain(..) {
            if !self.rings.iter().any(|r| r.fd == fd) {
                unsafe { libc::close(fd) };
            }
        }
        self.read_rings();
        self.fill(end);
        self.pending.clear();
        let mut tids: Vec<Tid> = self.threads.keys().copied().collect();
        tids.sort_unstable();
        for tid in tids {
            let (e, tgid) = match self.threads.get_mut(&tid) {
                Some(t) => (t.entry.take(), t.tgid),
                None => continue,
            };
            if let Some(e) = e {
                let mut ev = self.build(tid, tgid, e, None, end);
                if let EventKind::Syscall(sc) = &mut ev.kind {
                    sc.in_flight = Some(InFlight::AtEnd);
                }
                self.count(tid, None);
                self.queue.push_back(ev);
            }
        }
        let fds: Vec<i32> = self.rings.iter().map(|r| r.fd).collect();
        self.rings.clear();
        for fd in fds {
            unsafe { libc::close(fd) };
        }
        self.queue.push_back(Event {
            tid: self.cfg.pid,
            ts: end,
            line: 0,
            kind: EventKind::Detach,
        });
        self.done = true;
    }

    fn poll(&self, timeout: Duration) {
        let mut pfds: Vec<libc::pollfd> = self
            .rings
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

impl super::fed::KernelFed for PerfTracer {
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
        PerfTracer::finish(self)
    }
    fn last_check(&mut self) -> &mut std::time::Instant {
        &mut self.last_check
    }
    /// Also looks for threads the events missed, now and then.
    fn check(&mut self) -> bool {
        if self.process_gone() {
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
        if self.queue.is_empty() && !wait.is_zero() {
            self.poll(wait);
            self.fill(now_mono() - HOLD_BACK);
        }
    }
}

impl Tracer for PerfTracer {
    fn next_event_timeout(&mut self, timeout: Duration) -> Result<Option<Event>> {
        Ok(super::fed::next_event_timeout(self, timeout))
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

    fn stats(&self) -> TracerStats {
        self.stats.clone()
    }

    fn warnings(&mut self) -> Vec<String> {
        let mut w = std::mem::take(&mut self.warnings);
        if self.late_records > 0 {
            w.push(format!(
                "{} syscall records were committed more than {} ms after their time (a CPU held up): calls around them may be mispaired",
                self.late_records,
                HOLD_BACK / 1_000_000
            ));
        }
        if self.stats.lost_events > 0 {
            w.push(format!(
                "the kernel dropped {} syscall records (ring buffers of {} pages per CPU filled up): the trace is incomplete; \
                 give --perf-pages a larger power of two",
                self.stats.lost_events, self.cfg.pages
            ));
        }
        w
    }
}

impl Drop for PerfTracer {
    fn drop(&mut self) {
        // Unmap before closing; `fds` holds the rings' fds too (after `finish` both are empty).
        self.rings.clear();
        for fd in self.fds.drain(..) {
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
