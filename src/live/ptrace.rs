//! The native ptrace backend of `attach`: the live counterpart of the strace parser. It
//! seizes every thread of a running process, follows new threads and (unless told not to)
//! forked children, and turns syscall-entry/exit stops into the same `Event`s the text
//! sources produce, timed on CLOCK_MONOTONIC.
//!
//! Safety of the traced redis comes first, as DESIGN.md "Live attach, safely" asks:
//! `PTRACE_SEIZE` (never `PTRACE_ATTACH`, which would send SIGSTOP), never
//! `PTRACE_O_EXITKILL` (a crash of stallscope must not kill redis: the kernel detaches the
//! tracees of a dead tracer), one blocking `waitpid(-1, __WALL)` loop, and on stop an
//! interrupt-and-detach of every thread that passes on any signal caught in flight.
//!
//! All ptrace requests must come from the one thread that seized the tracees, so the
//! tracer runs on its own thread and hands batches of events over a channel; the analysis
//! runs on the caller's thread and never delays a stopped redis thread.

pub(crate) mod sched;

use super::decode::{self, blocked_in_call, nr_info, Args};
use super::sysnames::{is_restart_errno, signal_name};
use super::{AttachError, Tracer, TracerStats};
use crate::clock::{now_mono, now_wall};
use crate::event::{self, Event, EventKind, InFlight, Nanos, Syscall, Tid};
use anyhow::Result;
use sched::{Counters, SchedFiles};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::Duration;

/// How the tracer is set up.
#[derive(Clone, Debug)]
pub struct PtraceConfig {
    pub pid: Tid,
    /// Follow `fork()`ed children (the BGSAVE / AOF rewrite child).
    pub follow_forks: bool,
    /// Longest wait for each thread to acknowledge the detach. A thread blocked in an
    /// uninterruptible call (fdatasync on a slow disk) cannot stop until the call ends;
    /// past this wait the tracer thread exits and the kernel detaches what is left.
    pub detach_wait: Duration,
    /// Read each thread's scheduler counters at its stops, for the split of its calls and
    /// gaps (`sched`): off only to measure what the reads cost (`sched::NO_SCHED_ENV`).
    pub split_sched: bool,
}

enum Msg {
    Attached {
        threads: u32,
        mono: Nanos,
        wall: Nanos,
        /// Its calls carry the scheduler's split.
        sched: bool,
    },
    Warning(String),
    Done(Box<TracerStats>),
    Failed(anyhow::Error),
}

/// Shared between the tracer thread and whoever asks it to stop.
struct StopCtl {
    flag: AtomicBool,
    /// Kernel tid of the tracer thread (for tgkill), 0 until it runs.
    tid: AtomicI32,
}

impl StopCtl {
    fn request(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let t = self.tid.load(Ordering::SeqCst);
        if t > 0 {
            // Wakes the blocking waitpid with EINTR (the handler does nothing, and is
            // installed without SA_RESTART).
            unsafe {
                libc::syscall(libc::SYS_tgkill, libc::getpid(), t, WAKE_SIGNAL);
            }
        }
    }
}

/// How often the consumer looks for new events: the live stall lines lag by at most this.
const POLL_MS: u64 = 20;

const WAKE_SIGNAL: libc::c_int = libc::SIGUSR1;

extern "C" fn wake_handler(_: libc::c_int) {}

fn install_wake_handler() {
    // No SA_RESTART: the tracer's blocking waitpid must return EINTR to be woken.
    crate::signals::install(WAKE_SIGNAL, wake_handler as *const () as usize, 0);
}

/// Handle on the tracer thread.
pub struct PtraceTracer {
    rx: Receiver<Msg>,
    shared: Arc<Shared>,
    ctl: Arc<StopCtl>,
    join: Option<std::thread::JoinHandle<()>>,
    queue: std::collections::VecDeque<Event>,
    stats: TracerStats,
    done: bool,
    warnings: Vec<String>,
    pub threads_at_attach: u32,
    splits_sched: bool,
}

impl PtraceTracer {
    /// Seizes every thread of `cfg.pid`; returns once all are seized (or with the reason
    /// they could not be).
    pub fn attach(cfg: PtraceConfig) -> Result<Self, AttachError> {
        preflight(cfg.pid)?;
        install_wake_handler();
        let (tx, rx) = mpsc::sync_channel::<Msg>(1024);
        let shared: Arc<Shared> = Arc::new(Default::default());
        let shared2 = shared.clone();
        let ctl = Arc::new(StopCtl {
            flag: AtomicBool::new(false),
            tid: AtomicI32::new(0),
        });
        let ctl2 = ctl.clone();
        let join = std::thread::Builder::new()
            .name("ptrace".into())
            .spawn(move || {
                ctl2.tid.store(unsafe { libc::gettid() }, Ordering::SeqCst);
                let mut t = Inner::new(cfg, tx.clone(), ctl2, shared2);
                match t.seize_all() {
                    Ok(n) => {
                        let (mono, wall) = (t.stats.attach_mono, t.stats.attach_wall);
                        if tx
                            .send(Msg::Attached {
                                threads: n,
                                mono,
                                wall,
                                sched: t.cfg.split_sched,
                            })
                            .is_err()
                        {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Msg::Failed(e));
                        return;
                    }
                }
                let r = t.run();
                let mut stats = t.stats.clone();
                stats.ns_pids = t.pidns.pairs();
                match r {
                    Ok(()) => {
                        let _ = tx.send(Msg::Done(Box::new(stats)));
                    }
                    Err(e) => {
                        let _ = tx.send(Msg::Failed(e));
                    }
                }
            })
            .map_err(|e| AttachError::Other(format!("cannot start the tracer thread: {e}")))?;
        let mut me = PtraceTracer {
            rx,
            shared,
            ctl,
            join: Some(join),
            queue: Default::default(),
            stats: TracerStats::default(),
            done: false,
            warnings: vec![],
            threads_at_attach: 0,
            splits_sched: false,
        };
        match me.rx.recv() {
            Ok(Msg::Attached {
                threads,
                mono,
                wall,
                sched,
            }) => {
                me.threads_at_attach = threads;
                me.splits_sched = sched;
                me.stats.attach_mono = mono;
                me.stats.attach_wall = wall;
                Ok(me)
            }
            Ok(Msg::Failed(e)) => {
                me.join_thread();
                Err(match e.downcast::<AttachError>() {
                    Ok(a) => a,
                    Err(e) => AttachError::Other(format!("{e:#}")),
                })
            }
            _ => {
                me.join_thread();
                Err(AttachError::Other(
                    "the tracer thread ended before attaching".into(),
                ))
            }
        }
    }

    /// Moves what the tracer published into the local queue; true if there was any.
    fn take_shared(&mut self) -> bool {
        let (lock, cv) = &*self.shared;
        let mut buf = lock.lock().unwrap_or_else(|e| e.into_inner());
        if buf.events.is_empty() {
            return false;
        }
        self.queue.extend(buf.events.drain(..));
        cv.notify_all();
        true
    }

    fn join_thread(&mut self) {
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }

    /// Messages from the tracer that are not events (e.g. a thread that could not be seized).
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    fn handle(&mut self, m: Msg) -> Result<()> {
        match m {
            Msg::Warning(w) => self.warnings.push(w),
            Msg::Done(s) => {
                self.stats = *s;
                self.done = true;
                self.join_thread();
            }
            Msg::Failed(e) => {
                self.done = true;
                self.join_thread();
                return Err(e);
            }
            Msg::Attached { .. } => {}
        }
        Ok(())
    }
}

impl Tracer for PtraceTracer {
    fn stops_tracee(&self) -> bool {
        true
    }

    fn reads_buffers(&self) -> bool {
        true
    }

    /// Read from /proc at the stops (`sched`): the tracer's own time with a thread stopped
    /// counts as blocked in it, never as waiting for a CPU.
    fn splits_sched(&self) -> bool {
        self.splits_sched
    }

    fn next_event_timeout(&mut self, mut timeout: Duration) -> Result<Option<Event>> {
        loop {
            if let Some(e) = self.queue.pop_front() {
                return Ok(Some(e));
            }
            if self.take_shared() {
                continue;
            }
            if self.done {
                return Ok(None);
            }
            // Events are polled, not signalled (see `Inner::flush`): wait in short steps.
            let step = timeout.min(Duration::from_millis(POLL_MS));
            match self.rx.recv_timeout(step) {
                Ok(m) => self.handle(m)?,
                Err(RecvTimeoutError::Timeout) => {
                    if self.take_shared() {
                        continue;
                    }
                    if step >= timeout {
                        return Ok(None);
                    }
                    timeout -= step;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.done = true;
                    self.join_thread();
                }
            }
        }
    }

    fn is_done(&self) -> bool {
        self.done && self.queue.is_empty()
    }

    fn stop(&mut self) {
        if !self.done {
            self.ctl.request();
        }
    }

    fn stats(&self) -> TracerStats {
        self.stats.clone()
    }

    fn warnings(&mut self) -> Vec<String> {
        self.take_warnings()
    }
}

impl Drop for PtraceTracer {
    fn drop(&mut self) {
        {
            // The tracer must never wait for a consumer that is gone.
            let (lock, cv) = &*self.shared;
            lock.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
            cv.notify_all();
        }
        if !self.done {
            self.ctl.request();
            // Drain so the tracer thread is never blocked on a full channel while detaching.
            while !self.done {
                match self.rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(Msg::Done(_)) | Ok(Msg::Failed(_)) | Err(RecvTimeoutError::Disconnected) => {
                        self.done = true
                    }
                    Ok(_) => {}
                    Err(RecvTimeoutError::Timeout) => self.ctl.request(),
                }
            }
        }
        self.join_thread();
    }
}

/// Checks that make the common failures clear before any ptrace request is made.
fn preflight(pid: Tid) -> Result<(), AttachError> {
    let status = super::check_target(pid)?;
    // Only one tracer per process: name the one already there.
    let tracer = status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(0);
    if tracer != 0 {
        let who = std::fs::read_to_string(format!("/proc/{tracer}/comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        return Err(AttachError::AlreadyTraced {
            pid,
            tracer,
            tracer_name: who,
        });
    }
    Ok(())
}

fn ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// What the tracer remembers about a syscall between its entry and exit stops.
#[derive(Clone, Copy)]
struct Entry {
    ts: Nanos,
    nr: i64,
    args: [u64; 6],
    in_flight: Option<InFlight>,
    /// The thread's scheduler counters at the entry (at the attach for a call running then).
    sched: Option<Counters>,
}

struct Thread {
    tgid: Tid,
    entry: Option<Entry>,
    /// Its counter files (`PtraceConfig::split_sched`), closed when it goes.
    files: Option<SchedFiles>,
    /// Its counters at the exit of its last call: where the gap before its next one starts.
    last_exit: Option<Counters>,
    /// Its counters at the seize, for a call running then.
    at_attach: Option<Counters>,
    /// Seized at attach (not created while tracing): its first stop may land inside a
    /// syscall that was already running.
    from_attach: bool,
    /// Still waiting for the first stop after seize/auto-attach.
    awaiting_first_stop: bool,
    /// The call it was in at attach was interrupted and will be restarted: the next entry
    /// is that same call, begun before the attach.
    restart_from: Option<Interrupted>,
}

/// A call running at the attach that the seize's stop interrupted (`-ERESTART*`).
#[derive(Clone, Copy)]
struct Interrupted {
    /// Begun before the attach: timed from it, in flight at the start.
    entry: Entry,
    errno: i64,
}

impl Thread {
    /// A thread to trace, with its counter files open when the split is read; one seized
    /// at the attach (`from_attach`) has its counters read now.
    fn new(tid: Tid, tgid: Tid, from_attach: bool, split_sched: bool) -> Thread {
        let mut files = split_sched.then(|| SchedFiles::open(tid)).flatten();
        Thread {
            tgid,
            entry: None,
            at_attach: files
                .as_mut()
                .filter(|_| from_attach)
                .and_then(|f| f.read(now_mono(), true)),
            files,
            last_exit: None,
            from_attach,
            awaiting_first_stop: true,
            restart_from: None,
        }
    }

    /// Its counters at a stop at `now`.
    #[inline]
    fn counters(&mut self, now: Nanos) -> Option<Counters> {
        self.files.as_mut()?.read(now, false)
    }

    /// Its counters as they stand, not stopped (a thread still in its call at the detach).
    fn counters_now(&mut self) -> Option<Counters> {
        self.files.as_mut()?.read(now_mono(), true)
    }

    /// At a syscall-entry stop: the call that begins, given what the attach interrupted.
    /// Only the kernel's restart of that call (the same number, or `restart_syscall`)
    /// continues it. Any other entry is a new call of its own, begun now: the interrupted
    /// call came back to user space (EINTR), and is returned to be reported as ended.
    fn enter(
        &mut self,
        nr: i64,
        args: [u64; 6],
        now: Nanos,
        sched: Option<Counters>,
    ) -> (Entry, Option<Interrupted>) {
        let fresh = Entry {
            ts: now,
            nr,
            args,
            in_flight: None,
            sched,
        };
        match self.restart_from.take() {
            Some(r)
                if nr == r.entry.nr
                    || nr_info(nr).sys.args == crate::syscalls::ArgKind::Restart =>
            {
                (
                    Entry {
                        args: if nr == r.entry.nr { args } else { r.entry.args },
                        ..r.entry
                    },
                    None,
                )
            }
            other => (fresh, other),
        }
    }
}

struct Inner {
    cfg: PtraceConfig,
    tx: SyncSender<Msg>,
    ctl: Arc<StopCtl>,
    shared: Arc<Shared>,
    threads: HashMap<Tid, Thread>,
    batch: Vec<Event>,
    stats: TracerStats,
    attach_ts: Nanos,
    /// Tids the tracer has already seen exit (so a late rescan does not re-seize them).
    /// Redis's threads are long-lived; bounded by the thread count of the process.
    gone: HashSet<Tid>,
    /// The traced process's pid namespace (its clone and wait results are mapped).
    pidns: super::container::PidNs,
}

const BATCH: usize = 512;
/// Events the consumer may lag behind before the tracer waits for it.
const MAX_PENDING: usize = 1 << 18;

/// Events handed from the tracer thread to the consumer.
#[derive(Default)]
struct Buffer {
    events: Vec<Event>,
    /// The consumer is gone: stop producing.
    closed: bool,
}

type Shared = (std::sync::Mutex<Buffer>, std::sync::Condvar);

impl Inner {
    fn new(cfg: PtraceConfig, tx: SyncSender<Msg>, ctl: Arc<StopCtl>, shared: Arc<Shared>) -> Self {
        Inner {
            pidns: super::container::PidNs::of(cfg.pid),
            cfg,
            tx,
            ctl,
            shared,
            threads: HashMap::new(),
            batch: Vec::with_capacity(BATCH),
            stats: TracerStats::default(),
            attach_ts: 0,
            gone: HashSet::new(),
        }
    }

    fn options(&self) -> libc::c_int {
        let mut o =
            libc::PTRACE_O_TRACESYSGOOD | libc::PTRACE_O_TRACECLONE | libc::PTRACE_O_TRACEEXEC;
        if self.cfg.follow_forks {
            o |= libc::PTRACE_O_TRACEFORK | libc::PTRACE_O_TRACEVFORK;
        }
        // Never PTRACE_O_EXITKILL: see the module comment.
        o
    }

    /// Seizes every thread in /proc/PID/task, rescanning until a pass finds no new one
    /// (threads can be created between the listing and the seize).
    fn seize_all(&mut self) -> Result<u32> {
        let pid = self.cfg.pid;
        self.attach_ts = now_mono();
        self.stats.attach_mono = self.attach_ts;
        self.stats.attach_wall = now_wall();
        let mut first = true;
        loop {
            let tids = super::list_tasks(pid).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    anyhow::Error::new(AttachError::NoSuchPid(pid))
                } else {
                    anyhow::anyhow!("cannot list /proc/{pid}/task: {e}")
                }
            })?;
            let mut added = 0;
            for tid in tids {
                if self.threads.contains_key(&tid) || self.gone.contains(&tid) {
                    continue;
                }
                let r = unsafe {
                    libc::ptrace(
                        libc::PTRACE_SEIZE,
                        tid as libc::pid_t,
                        0usize,
                        self.options() as usize,
                    )
                };
                if r != 0 {
                    let err = std::io::Error::last_os_error();
                    match err.raw_os_error() {
                        Some(libc::ESRCH) => continue, // the thread exited meanwhile
                        Some(libc::EPERM) if !first => {
                            // Already ours: created by a seized thread and auto-attached
                            // through PTRACE_O_TRACECLONE. Its first stop will register it.
                            continue;
                        }
                        Some(libc::EPERM) => {
                            return Err(anyhow::Error::new(AttachError::Permission {
                                pid,
                                scope: ptrace_scope(),
                                root: unsafe { libc::geteuid() } == 0,
                            }))
                        }
                        _ => {
                            return Err(anyhow::anyhow!(
                                "PTRACE_SEIZE of thread {tid} failed: {err}"
                            ))
                        }
                    }
                }
                first = false;
                let t = Thread::new(tid, pid, true, self.cfg.split_sched);
                self.threads.insert(tid, t);
                // Brings the thread to a stop so that syscall tracing can be switched on.
                unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid as libc::pid_t, 0usize, 0usize) };
                added += 1;
            }
            if first {
                return Err(anyhow::Error::new(AttachError::NoSuchPid(pid)));
            }
            if added == 0 {
                break;
            }
        }
        let n = self.threads.len() as u32;
        if self.cfg.split_sched && self.threads.get(&pid).is_none_or(|t| t.at_attach.is_none()) {
            self.cfg.split_sched = false;
            self.warn(format!(
                "no scheduler split of calls and gaps (sched): /proc/{pid}/task/{pid}/schedstat and stat could not be read"
            ));
        }
        self.batch.push(Event {
            tid: pid,
            ts: self.attach_ts,
            line: 0,
            kind: EventKind::Attach { threads: Some(n) },
        });
        Ok(n)
    }

    /// Publishes the batch to the shared buffer: an uncontended lock, no syscall and no
    /// wakeup of the consumer (which polls), so it is cheap enough to do before every
    /// blocking wait. Only when the consumer falls far behind does the tracer wait for it,
    /// so memory stays bounded.
    fn flush(&mut self) -> bool {
        if self.batch.is_empty() {
            return true;
        }
        let (lock, cv) = &*self.shared;
        let mut buf = lock.lock().unwrap_or_else(|e| e.into_inner());
        while buf.events.len() >= MAX_PENDING && !buf.closed {
            buf = cv
                .wait_timeout(buf, Duration::from_millis(100))
                .map(|r| r.0)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        if buf.closed {
            return false;
        }
        buf.events.append(&mut self.batch);
        true
    }

    fn warn(&mut self, w: String) {
        let _ = self.tx.send(Msg::Warning(w));
    }

    fn run(&mut self) -> Result<()> {
        let result = self.trace_loop();
        // Whatever ended the loop (stop request, error), let go of every thread.
        self.detach_all();
        self.flush();
        result
    }

    fn trace_loop(&mut self) -> Result<()> {
        loop {
            if self.ctl.flag.load(Ordering::SeqCst) {
                return Ok(());
            }
            if self.threads.is_empty() {
                return Ok(());
            }
            // Hand the events over before blocking: the wait may last long (idle redis).
            if !self.flush() {
                return Ok(());
            }
            let mut status: libc::c_int = 0;
            let r = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ECHILD) => {
                        // Every tracee is gone (the process exited).
                        self.threads.clear();
                        return Ok(());
                    }
                    _ => return Err(anyhow::anyhow!("waitpid failed: {e}")),
                }
            }
            let t0 = now_mono();
            self.on_status(r as Tid, status, t0);
            self.stats.stop_ns += (now_mono() - t0).max(0) as u64;
        }
    }

    /// Handles one wait status of the tracing loop and resumes the thread.
    fn on_status(&mut self, tid: Tid, status: libc::c_int, now: Nanos) {
        self.stats.stops += 1;
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            self.on_exit(tid, status, now);
            return;
        }
        if !libc::WIFSTOPPED(status) {
            return;
        }
        if !self.threads.contains_key(&tid) {
            // A new thread or child whose first stop came before its parent's clone event.
            self.register_new(tid, None);
        }
        let sig = libc::WSTOPSIG(status);
        let event = (status >> 16) & 0xff;
        if sig == (libc::SIGTRAP | 0x80) {
            self.on_syscall_stop(tid, now);
            self.resume(tid, 0);
            return;
        }
        if event != 0 {
            self.on_ptrace_event(tid, sig, event, now);
            return;
        }
        // Signal-delivery stop: record it and deliver it (or pass it on with the detach).
        if let Some(r) = self
            .threads
            .get_mut(&tid)
            .and_then(|t| t.restart_from.take())
        {
            // A signal came before the restart of the call the attach interrupted: that call
            // ends here (strace's `= ? ERESTARTSYS`), and whatever the handler or the restart
            // does next is a call of its own, begun after this signal.
            let end = self.threads.get_mut(&tid).and_then(|t| t.counters(now));
            self.end_interrupted(tid, r, now, event::DurSource::Measured, end);
        }
        let si_pid = if sig == libc::SIGCHLD {
            siginfo_pid(tid)
        } else {
            None
        };
        self.batch.push(Event {
            tid,
            ts: now,
            line: 0,
            kind: EventKind::Signal {
                name: signal_name(sig),
                si_pid,
            },
        });
        self.resume(tid, sig);
    }

    /// Resumes `tid` to its next syscall stop, delivering `sig`. An error (ESRCH: killed by
    /// SIGKILL while stopped) needs no handling: its exit status follows.
    fn resume(&mut self, tid: Tid, sig: libc::c_int) {
        unsafe {
            libc::ptrace(
                libc::PTRACE_SYSCALL,
                tid as libc::pid_t,
                0usize,
                sig as usize,
            )
        };
    }

    fn register_new(&mut self, tid: Tid, tgid: Option<Tid>) {
        let tgid = tgid.unwrap_or_else(|| read_tgid(tid).unwrap_or(tid));
        let t = Thread::new(tid, tgid, false, self.cfg.split_sched);
        self.threads.insert(tid, t);
    }

    fn on_ptrace_event(&mut self, tid: Tid, sig: libc::c_int, event: libc::c_int, now: Nanos) {
        match event {
            libc::PTRACE_EVENT_STOP => {
                let first = self
                    .threads
                    .get(&tid)
                    .is_some_and(|t| t.awaiting_first_stop);
                if first {
                    if let Some(t) = self.threads.get_mut(&tid) {
                        t.awaiting_first_stop = false;
                    }
                    let from_attach = self.threads.get(&tid).is_some_and(|t| t.from_attach);
                    if from_attach {
                        self.check_in_flight_at_attach(tid, now);
                    }
                    return self.resume(tid, 0);
                }
                if matches!(
                    sig,
                    libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                ) {
                    // A group stop (someone sent SIGSTOP): keep it stopped, as it would be
                    // without us, but stay notified of the SIGCONT.
                    unsafe {
                        libc::ptrace(libc::PTRACE_LISTEN, tid as libc::pid_t, 0usize, 0usize)
                    };
                    return;
                }
                // A stale PTRACE_INTERRUPT.
                self.resume(tid, 0)
            }
            libc::PTRACE_EVENT_CLONE | libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK => {
                let msg = event_msg(tid);
                let child = msg as Tid;
                if child != 0 {
                    let tgid = if event == libc::PTRACE_EVENT_CLONE {
                        self.threads.get(&tid).map(|t| t.tgid)
                    } else {
                        Some(child)
                    };
                    match self.threads.get_mut(&child) {
                        Some(t) => {
                            // Its first stop came first; now we know its process.
                            if let Some(g) = tgid {
                                t.tgid = g;
                            }
                        }
                        None => self.register_new(child, tgid),
                    }
                }
                self.resume(tid, 0)
            }
            libc::PTRACE_EVENT_EXEC => {
                // After a non-leader thread execs, it takes the process's tid: the old
                // leader is gone and the former tid must be forgotten.
                let msg = event_msg(tid);
                let former = msg as Tid;
                if former != tid {
                    // The execve entry was seen on the former tid: carry it over, with where
                    // its gap began, and read the counters of the thread that now has this
                    // tid (files open on the old leader's are not its own).
                    let (entry, last_exit) = self
                        .threads
                        .remove(&former)
                        .map_or((None, None), |t| (t.entry, t.last_exit));
                    let split = self.cfg.split_sched;
                    if let Some(t) = self.threads.get_mut(&tid) {
                        t.entry = entry;
                        t.last_exit = last_exit;
                        t.files = split.then(|| SchedFiles::open(tid)).flatten();
                    }
                }
                self.resume(tid, 0)
            }
            _ => self.resume(tid, 0),
        }
    }

    /// The first stop of a thread seized at attach: if it was inside a syscall, that call
    /// was already running when tracing began.
    #[cfg(target_arch = "x86_64")]
    fn check_in_flight_at_attach(&mut self, tid: Tid, now: Nanos) {
        let regs = match nix::sys::ptrace::getregs(nix::unistd::Pid::from_raw(tid as i32)) {
            Ok(r) => r,
            Err(_) => return,
        };
        let nr = regs.orig_rax as i64;
        if nr < 0 {
            return; // stopped in user space
        }
        let rax = regs.rax as i64;
        let Some(t) = self.threads.get_mut(&tid) else {
            return;
        };
        // Timed from the attach, its scheduler split too.
        let entry = Entry {
            ts: self.attach_ts,
            nr,
            args: [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9],
            in_flight: Some(InFlight::AtStart),
            sched: t.at_attach,
        };
        if rax < 0 && is_restart_errno(-rax) {
            // Interrupted by our stop; the kernel restarts it on resume, and the restarted
            // call's entry stop comes next.
            t.restart_from = Some(Interrupted { entry, errno: -rax });
            return;
        }
        // It returned while we were stopping it (an uninterruptible call, e.g. fdatasync or
        // close on a slow disk): known part is from the attach to now.
        let end = t.counters(now);
        let mut ev = self.build(tid, entry, Some(rax), now);
        self.split(&mut ev, &entry, end);
        self.stats.syscalls += 1;
        self.batch.push(ev);
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn check_in_flight_at_attach(&mut self, _tid: Tid, _now: Nanos) {}

    fn on_syscall_stop(&mut self, tid: Tid, now: Nanos) {
        let info = match get_syscall_info(tid) {
            Some(i) => i,
            None => return,
        };
        match info.op {
            libc::PTRACE_SYSCALL_INFO_ENTRY => {
                let (nr, args) = unsafe { (info.u.entry.nr as i64, info.u.entry.args) };
                let (ended, at) = match self.threads.get_mut(&tid) {
                    Some(t) => {
                        let at = t.counters(now);
                        let (entry, ended) = t.enter(nr, args, now, at);
                        t.entry = Some(entry);
                        (ended, at)
                    }
                    None => (None, None),
                };
                if let Some(r) = ended {
                    // It returned to user space somewhere since the attach's stop.
                    self.end_interrupted(tid, r, now, event::DurSource::UpperBound, at);
                }
            }
            libc::PTRACE_SYSCALL_INFO_EXIT => {
                // `is_error` is the kernel's IS_ERR_VALUE of `sval`: `decode::is_errno`.
                let sval = unsafe { info.u.exit.sval };
                let (entry, end) = match self.threads.get_mut(&tid) {
                    Some(t) => match t.entry.take() {
                        Some(e) => (e, t.counters(now)),
                        None => {
                            // An exit with no entry seen (e.g. right after exec): the next
                            // gap starts here all the same.
                            t.last_exit = t.counters(now);
                            return;
                        }
                    },
                    None => return,
                };
                let mut ev = self.build(tid, entry, Some(sval), now);
                self.split(&mut ev, &entry, end);
                self.stats.syscalls += 1;
                if entry.in_flight.is_none() {
                    let d = now - entry.ts;
                    if d >= 0
                        && (self.stats.min_call_ns == 0 || (d as u64) < self.stats.min_call_ns)
                    {
                        self.stats.min_call_ns = d as u64;
                    }
                }
                let main = self
                    .threads
                    .get(&tid)
                    .is_some_and(|t| t.tgid == tid && tid == self.cfg.pid);
                if main {
                    self.stats.main_syscalls += 1;
                    if entry.in_flight.is_none() {
                        let d = (now - entry.ts).max(1) as u64;
                        self.stats.main_call_log2[(63 - d.leading_zeros() as usize).min(31)] += 1;
                    }
                }
                self.batch.push(ev);
            }
            _ => {}
        }
    }

    /// Reports the call the attach interrupted, which did not go on after it: from the
    /// attach to `now` (the thread's counters then: `end`), with the restart errno the
    /// kernel had set.
    fn end_interrupted(
        &mut self,
        tid: Tid,
        r: Interrupted,
        now: Nanos,
        src: event::DurSource,
        end: Option<Counters>,
    ) {
        let mut ev = self.build(tid, r.entry, Some(-r.errno), now);
        self.split(&mut ev, &r.entry, end);
        if let EventKind::Syscall(sc) = &mut ev.kind {
            sc.dur_src = src;
        }
        self.stats.syscalls += 1;
        self.batch.push(ev);
    }

    /// Gives `ev`, the call `e` of its thread that ended with the counters `end`, the
    /// scheduler's split of it and (unless it was running at the attach) of the gap before
    /// it; the thread's next gap starts at `end`.
    #[inline]
    fn split(&mut self, ev: &mut Event, e: &Entry, end: Option<Counters>) {
        let Some(t) = self.threads.get_mut(&ev.tid) else {
            return;
        };
        let last = std::mem::replace(&mut t.last_exit, end);
        let (Some(from), Some(end)) = (e.sched, end) else {
            return;
        };
        let last = last.filter(|_| e.in_flight != Some(InFlight::AtStart));
        if let EventKind::Syscall(sc) = &mut ev.kind {
            sc.sched = Some(Box::new(sched::span(from, end, last)));
        }
    }

    /// Turns an entry and its result (`None`: it did not return) into an event, the thread
    /// still stopped at the call's exit (or gone).
    fn build(&mut self, tid: Tid, e: Entry, ret: Option<i64>, now: Nanos) -> Event {
        let info = nr_info(e.nr);
        let ret = self.pidns.host_ret(info.sys, ret, tid);
        let mut sc = Syscall::with(info.name, info.sys);
        sc.in_flight = e.in_flight;
        let args = Args::Stopped { args: &e.args, tid };
        decode::call(&mut sc, &info, ret, now - e.ts, args);
        Event {
            tid,
            ts: e.ts,
            line: 0,
            kind: EventKind::Syscall(sc),
        }
    }

    fn on_exit(&mut self, tid: Tid, status: libc::c_int, now: Nanos) {
        let th = self.threads.remove(&tid);
        self.gone.insert(tid);
        if let Some(e) = th.as_ref().and_then(|t| t.entry) {
            // The call it was in never returned (exit_group, or killed inside a call).
            let ev = self.build(tid, e, None, now);
            self.batch.push(ev);
        }
        let kind = if libc::WIFEXITED(status) {
            EventKind::Exit {
                code: Some(libc::WEXITSTATUS(status)),
                signal: None,
            }
        } else {
            EventKind::Exit {
                code: None,
                signal: Some(signal_name(libc::WTERMSIG(status))),
            }
        };
        self.batch.push(Event {
            tid,
            ts: now,
            line: 0,
            kind,
        });
    }

    /// Lets go of every thread: interrupt each, and detach it at the stop that follows,
    /// delivering any signal caught there. Calls still running are reported as in flight
    /// at the end, timed up to this moment.
    fn detach_all(&mut self) {
        let detach_ts = now_mono();
        self.stats.detach_mono = detach_ts;
        let tids: Vec<Tid> = self.threads.keys().copied().collect();
        for tid in &tids {
            self.end_running_call(*tid, detach_ts);
            unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, *tid as libc::pid_t, 0usize, 0usize) };
        }
        let deadline = std::time::Instant::now() + self.cfg.detach_wait;
        // Only statuses of tracees end up here; the loop is bounded by the deadline
        // because a thread in an uninterruptible call cannot stop before the call ends.
        while !self.threads.is_empty() && std::time::Instant::now() < deadline {
            let mut status = 0;
            let r = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::WNOHANG) };
            if r == 0 {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            if r < 0 {
                break;
            }
            let tid = r as Tid;
            let known = self.threads.contains_key(&tid);
            let now = now_mono();
            if libc::WIFSTOPPED(status) && known {
                self.detach_stopped(tid, status, now.min(detach_ts));
            } else if libc::WIFSTOPPED(status) {
                // An auto-attached child we had not heard of yet.
                unsafe { libc::ptrace(libc::PTRACE_DETACH, tid as libc::pid_t, 0usize, 0usize) };
            } else if known {
                self.on_exit(tid, status, now);
            }
        }
        if !self.threads.is_empty() {
            let left: Vec<String> = self.threads.keys().map(|t| t.to_string()).collect();
            self.warn(format!(
                "thread(s) {} did not stop within {} ms (blocked in an uninterruptible call); the kernel detaches them when stallscope exits",
                left.join(", "),
                self.cfg.detach_wait.as_millis()
            ));
        }
        self.batch.push(Event {
            tid: self.cfg.pid,
            ts: detach_ts,
            line: 0,
            kind: EventKind::Detach,
        });
    }

    /// Reports the call `tid` is in as tracing ends, if any: in flight at the end, timed up
    /// to `detach_ts`.
    fn end_running_call(&mut self, tid: Tid, detach_ts: Nanos) {
        let entry = match self.threads.get_mut(&tid) {
            Some(t) if t.entry.is_some() => t.entry.take(),
            Some(t) if t.from_attach && t.awaiting_first_stop => {
                // Never stopped since the seize: blocked in an uninterruptible call for the
                // whole trace (a close() or fdatasync on a stalled disk). It must not be
                // silent; the kernel still knows which call it is.
                let e = blocked_since_attach(tid, self.attach_ts, t.at_attach);
                if e.is_some() {
                    // Its stop, when it comes, ends a call that was already reported.
                    t.awaiting_first_stop = false;
                }
                e
            }
            _ => None,
        };
        if let Some(e) = entry {
            let e = Entry {
                in_flight: Some(InFlight::AtEnd),
                ..e
            };
            // Still in its call, not stopped: its counters as they stand at the detach.
            let end = self.threads.get_mut(&tid).and_then(Thread::counters_now);
            let mut ev = self.build(tid, e, None, detach_ts);
            self.split(&mut ev, &e, end);
            self.batch.push(ev);
        }
    }

    /// Detaches a thread at its stop during the detach (`at`: when, no later than the
    /// detach), passing on the signal it stopped for. Anything that completes now is past
    /// the end of the trace: it becomes no event, except the signal, stamped at `at`.
    fn detach_stopped(&mut self, tid: Tid, status: libc::c_int, at: Nanos) {
        let sig = libc::WSTOPSIG(status);
        let event = (status >> 16) & 0xff;
        let first = self
            .threads
            .get(&tid)
            .is_some_and(|t| t.from_attach && t.awaiting_first_stop);
        if first && event == libc::PTRACE_EVENT_STOP {
            // The first stop after the seize, queued before the detach: it was not in a
            // call at detach (that case was reported then), but may just have left one that
            // began before the attach.
            self.check_in_flight_at_attach(tid, at);
        }
        let pass = if sig == (libc::SIGTRAP | 0x80) || event != 0 {
            0
        } else {
            sig
        };
        if event == libc::PTRACE_EVENT_CLONE
            || event == libc::PTRACE_EVENT_FORK
            || event == libc::PTRACE_EVENT_VFORK
        {
            // A child born during the detach is ours too until detached.
            let msg = event_msg(tid);
            if msg != 0 && !self.threads.contains_key(&(msg as Tid)) {
                self.register_new(msg as Tid, None);
            }
        }
        if pass != 0 {
            // Delivered as the trace ends: stamped at the detach, not later, so no event of
            // the trace (nor of its recording) lies past its end.
            self.batch.push(Event {
                tid,
                ts: at,
                line: 0,
                kind: EventKind::Signal {
                    name: signal_name(pass),
                    si_pid: None,
                },
            });
        }
        unsafe {
            libc::ptrace(
                libc::PTRACE_DETACH,
                tid as libc::pid_t,
                0usize,
                pass as usize,
            )
        };
        self.threads.remove(&tid);
    }
}

/// The call a thread has been blocked in since before `attach_ts`, from /proc (the thread
/// cannot be stopped to read its registers). None unless it sleeps inside a syscall now:
/// a thread already in a tracing stop has left its call, and its stop says how.
fn blocked_since_attach(tid: Tid, attach_ts: Nanos, sched: Option<Counters>) -> Option<Entry> {
    let (nr, args) = blocked_in_call(tid)?;
    Some(Entry {
        ts: attach_ts,
        nr,
        args,
        in_flight: Some(InFlight::AtEnd),
        sched,
    })
}

/// PTRACE_GETEVENTMSG: the new tid of a clone/fork, the former tid after an exec.
fn event_msg(tid: Tid) -> libc::c_ulong {
    let mut msg: libc::c_ulong = 0;
    // SAFETY: the kernel writes one c_ulong to `msg`, which outlives the call.
    unsafe {
        libc::ptrace(
            libc::PTRACE_GETEVENTMSG,
            tid as libc::pid_t,
            0usize,
            &mut msg as *mut libc::c_ulong,
        )
    };
    msg
}

fn read_tgid(tid: Tid) -> Option<Tid> {
    let s = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

fn get_syscall_info(tid: Tid) -> Option<libc::ptrace_syscall_info> {
    let mut info: libc::ptrace_syscall_info = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GET_SYSCALL_INFO,
            tid as libc::pid_t,
            std::mem::size_of::<libc::ptrace_syscall_info>(),
            &mut info as *mut libc::ptrace_syscall_info,
        )
    };
    if r <= 0 {
        return None;
    }
    Some(info)
}

fn siginfo_pid(tid: Tid) -> Option<u32> {
    let mut si: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETSIGINFO,
            tid as libc::pid_t,
            0usize,
            &mut si as *mut libc::siginfo_t,
        )
    };
    if r != 0 {
        return None;
    }
    let p = unsafe { si.si_pid() };
    (p > 0).then_some(p as u32)
}

#[cfg(test)]
mod tests;
