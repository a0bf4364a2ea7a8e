//! Live sources: `stallscope attach`. A backend-neutral `Tracer` produces the same `Event`s
//! as the text sources, from a running process; `procctx` adds what only a live process can
//! tell (its open fds, thread names, redis config, page faults, I/O and iowait over time);
//! `record` writes what was traced as strace text so `analyze` can read it again. The events
//! go through the same `Analyzer` as `analyze`, stalls are printed as they are found, and
//! the report at the end is rendered by the same renderers.

pub(crate) mod bpf;
mod decode;
mod fed;
pub(crate) mod perf;
pub(crate) mod procctx;
pub(crate) mod ptrace;
pub(crate) mod record;
pub(crate) mod sysnames;

use crate::event::{Event, Nanos, Tid};
use anyhow::Result;
use std::time::Duration;

/// CLOCK_MONOTONIC in ns: the live clock (immune to wall-clock steps during a trace).
pub fn now_mono() -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// CLOCK_REALTIME in ns since the epoch, read once at attach to place the trace in time.
pub fn now_wall() -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Boxes of the scheduler's split (`Syscall::sched`), reused. The bpf and perf backends box
/// one per call, a whole queue of events at a time, and the consumer frees them a queue at
/// a time: that pattern misses malloc's per-thread cache, and malloc and free were about a
/// sixth of the tracer's CPU per record. The consumer hands the boxes of the events it is
/// done with back (`Tracer::reuse`).
// Boxes, not values: they are the events' own boxes (`Syscall::sched`), handed on as they are.
#[allow(clippy::vec_box)]
#[derive(Default)]
pub(crate) struct SpanPool(Vec<Box<crate::event::SchedSpan>>);

impl SpanPool {
    /// At most this many idle boxes are kept (about 2.5 MiB): two full event queues.
    const KEEP: usize = 2 * fed::QUEUE_KEEP;

    #[inline]
    pub(crate) fn boxed(&mut self, s: crate::event::SchedSpan) -> Box<crate::event::SchedSpan> {
        match self.0.pop() {
            Some(mut b) => {
                *b = s;
                b
            }
            None => Box::new(s),
        }
    }

    #[allow(clippy::vec_box)]
    pub(crate) fn take_back(&mut self, spans: &mut Vec<Box<crate::event::SchedSpan>>) {
        spans.truncate(Self::KEEP.saturating_sub(self.0.len()));
        self.0.append(spans);
    }
}

/// Puts the scheduler split of `ev`, an event the consumer is done with, into `spent` for
/// `Tracer::reuse`.
#[inline]
#[allow(clippy::vec_box)]
pub(crate) fn spend(ev: &mut Event, spent: &mut Vec<Box<crate::event::SchedSpan>>) {
    if let crate::event::EventKind::Syscall(sc) = &mut ev.kind {
        if let Some(b) = sc.sched.take() {
            spent.push(b);
        }
    }
}

/// What the scheduler did with a thread between two snapshots of its counters (ns on a
/// CPU, ns runnable, minor faults, major faults; cumulative), as the bpf and perf backends
/// take them at each call's entry and exit.
pub(crate) fn sched_delta(from: &[u64; 4], to: &[u64; 4]) -> crate::event::SchedDelta {
    crate::event::SchedDelta {
        on_cpu_ns: to[0].saturating_sub(from[0]),
        runnable_ns: to[1].saturating_sub(from[1]),
        minor_faults: to[2].saturating_sub(from[2]),
        major_faults: to[3].saturating_sub(from[3]),
    }
}

/// A thread's scheduler counters now, from /proc, in `sched_delta`'s order: the same task
/// fields the bpf programs read (`schedstat`: se.sum_exec_runtime, sched_info.run_delay;
/// `stat`: min_flt, maj_flt). For a call already running at the attach, whose entry no
/// backend saw: its split from the attach on.
pub(crate) fn sched_counters(tgid: Tid, tid: Tid) -> Option<[u64; 4]> {
    let dir = format!("/proc/{tgid}/task/{tid}");
    let schedstat = std::fs::read_to_string(format!("{dir}/schedstat")).ok()?;
    let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
    parse_sched_counters(&schedstat, &stat)
}

fn parse_sched_counters(schedstat: &str, stat: &str) -> Option<[u64; 4]> {
    let mut ss = schedstat.split_whitespace().map(|v| v.parse::<u64>().ok());
    let (on, run) = (ss.next()??, ss.next()??);
    // After the command name: state ppid pgrp session tty tpgid flags minflt cminflt majflt.
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some([on, run, f.get(7)?.parse().ok()?, f.get(9)?.parse().ok()?])
}

/// What a tracer counted while it ran.
#[derive(Clone, Debug, Default)]
pub struct TracerStats {
    /// CLOCK_MONOTONIC at attach, and the wall clock read at that same moment.
    pub attach_mono: Nanos,
    pub attach_wall: Nanos,
    /// CLOCK_MONOTONIC when tracing ended (0 while running).
    pub detach_mono: Nanos,
    pub syscalls: u64,
    /// Syscalls of the traced process's main thread (tid == pid).
    pub main_syscalls: u64,
    /// Tracee stops handled (ptrace backend).
    pub stops: u64,
    /// Time the tracer held stopped threads (from waitpid's return to the resume).
    pub stop_ns: u64,
    /// Shortest traced syscall (entry stop to exit stop): what one traced call costs at
    /// least, ptrace round trips included.
    pub min_call_ns: u64,
    /// Events the kernel dropped (perf backend ring-buffer overflow).
    pub lost_events: u64,
    /// Durations of the main thread's calls as seen under tracing, by power of two of ns.
    pub main_call_log2: [u64; 32],
}

impl TracerStats {
    /// Counts one syscall of `tid` (of the process whose pid is `main`), with its duration
    /// when the kernel measured one.
    pub(crate) fn count(&mut self, tid: Tid, main: Tid, dur: Option<Nanos>) {
        self.syscalls += 1;
        if let Some(d) = dur {
            let d = d.max(1) as u64;
            if self.min_call_ns == 0 || d < self.min_call_ns {
                self.min_call_ns = d;
            }
            if tid == main {
                self.main_call_log2[(63 - d.leading_zeros() as usize).min(31)] += 1;
            }
        }
        if tid == main {
            self.main_syscalls += 1;
        }
    }

    /// Median traced duration of the main thread's calls (ns), from the log2 histogram:
    /// most of redis's calls are non-blocking reads and writes whose traced duration is
    /// mostly the ptrace round trip itself.
    pub fn main_call_median_ns(&self) -> Option<f64> {
        let total: u64 = self.main_call_log2.iter().sum();
        if total == 0 {
            return None;
        }
        let mut seen = 0;
        for (i, n) in self.main_call_log2.iter().enumerate() {
            seen += n;
            if seen * 2 >= total {
                // Geometric middle of [2^i, 2^(i+1)).
                return Some((1u64 << i) as f64 * std::f64::consts::SQRT_2);
            }
        }
        None
    }
}

/// Why attaching failed, in words that say what to do.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("no such process: {0}")]
    NoSuchPid(Tid),
    #[error("process {pid} is already traced by process {tracer} ({tracer_name}): only one tracer can attach; stop it first")]
    AlreadyTraced {
        pid: Tid,
        tracer: Tid,
        tracer_name: String,
    },
    #[error("permission denied to trace process {pid}: {}", permission_hint(*.scope, *.root))]
    Permission {
        pid: Tid,
        scope: Option<u32>,
        root: bool,
    },
    #[error("{0}")]
    Other(String),
}

fn permission_hint(scope: Option<u32>, root: bool) -> String {
    match (scope, root) {
        (Some(3), _) => "kernel.yama.ptrace_scope is 3 (ptrace disabled until reboot)".into(),
        (Some(2), false) => "kernel.yama.ptrace_scope is 2 (admin only): run as root or with CAP_SYS_PTRACE".into(),
        (Some(1), false) => "kernel.yama.ptrace_scope is 1 (descendants only): run as root, with CAP_SYS_PTRACE, or set `sysctl kernel.yama.ptrace_scope=0`".into(),
        (_, false) => "run as the user that owns redis, or as root".into(),
        (_, true) => "denied even to root (a security module, a container without CAP_SYS_PTRACE, or seccomp)".into(),
    }
}

/// A live event source, whatever the kernel mechanism behind it.
pub trait Tracer {
    /// The next event, waiting at most `timeout`. `Ok(None)` when none came in time or when
    /// tracing has ended (see `is_done`).
    fn next_event_timeout(&mut self, timeout: Duration) -> Result<Option<Event>>;
    /// Every event ready now, waiting at most `timeout` for the first, appended to `out`
    /// in order (nothing appended: none came in time, or tracing has ended). What the
    /// consumers use: a backend that has a batch ready hands it on whole instead of
    /// returning it one event (and one clock read) at a time.
    fn next_batch(
        &mut self,
        timeout: Duration,
        out: &mut std::collections::VecDeque<Event>,
    ) -> Result<()> {
        if let Some(e) = self.next_event_timeout(timeout)? {
            out.push_back(e);
        }
        Ok(())
    }
    /// Tracing has ended (stopped, or the process is gone) and every event was returned.
    fn is_done(&self) -> bool;
    /// Asks the tracer to let go of the process; events keep coming until `is_done`.
    fn stop(&mut self);
    fn stats(&self) -> TracerStats;
    /// Things the user should know that are not events (threads that could not be seized...).
    fn warnings(&mut self) -> Vec<String>;
    /// Events the kernel dropped since the last call (perf ring-buffer overflow), so that
    /// the analysis can mark what it finds after them as incomplete.
    fn take_lost(&mut self) -> u64 {
        0
    }
    /// Whether its calls carry the scheduler's split (`Syscall::sched`).
    fn splits_sched(&self) -> bool {
        false
    }
    /// Whether its socket reads carry when their data arrived (`Syscall::arrived`): None
    /// when the backend has no such means, Some(false) when this kernel lacks them.
    fn dates_arrivals(&self) -> Option<bool> {
        None
    }
    /// Takes back the scheduler splits (`spend`) of events the consumer is done with, for
    /// the next events; what it does not keep is freed.
    #[allow(clippy::vec_box)]
    fn reuse(&mut self, spent: &mut Vec<Box<crate::event::SchedSpan>>) {
        spent.clear();
    }

    /// The next event, blocking until there is one or tracing has ended.
    fn next_event(&mut self) -> Result<Option<Event>> {
        loop {
            if let Some(e) = self.next_event_timeout(Duration::from_millis(200))? {
                return Ok(Some(e));
            }
            if self.is_done() {
                return Ok(None);
            }
        }
    }
}

/// The checks every backend makes before it touches a process: not ourselves, still there,
/// not a zombie. Returns `/proc/PID/status` for backend-specific checks (a ptrace tracer
/// already attached).
pub(crate) fn check_target(pid: Tid) -> Result<String, AttachError> {
    if pid as i32 == unsafe { libc::getpid() } {
        return Err(AttachError::Other(
            "refusing to trace stallscope itself".into(),
        ));
    }
    let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(AttachError::NoSuchPid(pid))
        }
        Err(e) => {
            return Err(AttachError::Other(format!(
                "cannot read /proc/{pid}/status: {e}"
            )))
        }
    };
    let zombie = status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .is_some_and(|v| v.trim_start().starts_with('Z'));
    if zombie {
        return Err(AttachError::Other(format!(
            "process {pid} is a zombie: it has exited and has no threads to trace"
        )));
    }
    Ok(status)
}

/// The process's threads, from /proc/PID/task, in tid order.
pub(crate) fn list_tasks(pid: Tid) -> std::io::Result<Vec<Tid>> {
    let mut v = vec![];
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        if let Some(t) = e?.file_name().to_str().and_then(|s| s.parse().ok()) {
            v.push(t);
        }
    }
    v.sort_unstable();
    Ok(v)
}

use crate::analyze::findings::LiveEvidence;
use crate::analyze::{Analyzer, RedisConf};
use crate::cli::AttachArgs;
use crate::report::{LiveBackend, Overhead, Report};
use crate::source::{Clock, Counters, SourceInfo, TimeFmt};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGINT/SIGTERM: stop tracing, detach, report.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_stop_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// `--name`: processes whose command name (comm, or argv[0]'s base name) is `name`.
pub fn find_by_name(name: &str) -> Vec<(Tid, String)> {
    let me = std::process::id();
    let mut found = vec![];
    let rd = match std::fs::read_dir("/proc") {
        Ok(r) => r,
        Err(_) => return found,
    };
    for e in rd.flatten() {
        let pid: Tid = match e.file_name().to_str().and_then(|s| s.parse().ok()) {
            Some(p) => p,
            None => continue,
        };
        if pid == me {
            continue;
        }
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let argv0 = args.first().map(|a| {
            a.split(' ')
                .next()
                .unwrap_or("")
                .rsplit('/')
                .next()
                .unwrap_or("")
                .to_string()
        });
        if comm.trim_end() == name || argv0.as_deref() == Some(name) {
            found.push((pid, args.join(" ")));
        }
    }
    found.sort();
    found
}

fn resolve_pid(args: &AttachArgs) -> Result<Tid> {
    if let Some(p) = args.pid {
        return Ok(p);
    }
    let name = args.name.as_deref().unwrap_or("redis-server");
    let found = find_by_name(name);
    match found.len() {
        0 => anyhow::bail!("--name {name}: no running process has that name"),
        1 => Ok(found[0].0),
        _ => {
            let list: Vec<String> = found.iter().map(|(p, c)| format!("  {p}  {c}")).collect();
            anyhow::bail!(
                "--name {name}: {} processes match; choose one with --pid:\n{}",
                found.len(),
                list.join("\n")
            )
        }
    }
}

/// Starts the tracer `--backend` asks for (for `auto`: bpf if the kernel loads its
/// programs, else perf if it allows the tracepoints, else ptrace), saying on stderr which
/// one and why. Returns it, its name, and how many threads it traced at attach.
pub(crate) fn start_tracer(
    pid: Tid,
    args: &AttachArgs,
) -> Result<(Box<dyn Tracer>, LiveBackend, u32)> {
    use crate::cli::Backend;
    let bpf_cfg = bpf::BpfConfig {
        pid,
        follow_forks: !args.no_follow_forks,
        pages: args.perf_pages.unwrap_or(bpf::DEFAULT_PAGES),
    };
    let perf_cfg = perf::PerfConfig {
        pid,
        follow_forks: !args.no_follow_forks,
        pages: args.perf_pages.unwrap_or(perf::DEFAULT_PAGES),
    };
    let ptrace_cfg = ptrace::PtraceConfig {
        pid,
        follow_forks: !args.no_follow_forks,
        detach_wait: Duration::from_millis(1000),
    };
    let start_ptrace = |why: &str| -> Result<(Box<dyn Tracer>, LiveBackend, u32)> {
        eprintln!("stallscope: backend ptrace: {why}");
        let t = ptrace::PtraceTracer::attach(ptrace_cfg.clone())
            .map_err(|e| anyhow::anyhow!("cannot attach to process {pid}: {e}"))?;
        let n = t.threads_at_attach;
        Ok((Box::new(t), LiveBackend::Ptrace, n))
    };
    let bpf_why = "BPF programs on the syscall tracepoints, filtered and paired in the kernel: \
                   redis is never stopped, and command names are read from its requests";
    let perf_why = "syscall tracepoints through perf_event_open: redis is never stopped";
    let no_such = |e: AttachError| match e {
        AttachError::NoSuchPid(p) => Err(anyhow::anyhow!(
            "cannot attach to process {pid}: {}",
            AttachError::NoSuchPid(p)
        )),
        e => Ok(e.to_string()),
    };
    match args.backend {
        Backend::Ptrace => start_ptrace(
            "chosen with --backend ptrace (every syscall stops the traced thread twice)",
        ),
        Backend::Bpf => {
            eprintln!("stallscope: backend bpf: {bpf_why}");
            let t = bpf::BpfTracer::attach(bpf_cfg)
                .map_err(|e| anyhow::anyhow!("cannot attach to process {pid} with bpf: {e}"))?;
            let n = t.threads_at_attach;
            Ok((Box::new(t), LiveBackend::Bpf, n))
        }
        Backend::Perf => {
            eprintln!("stallscope: backend perf: {perf_why}");
            let t = perf::PerfTracer::attach(perf_cfg)
                .map_err(|e| anyhow::anyhow!("cannot attach to process {pid} with perf: {e}"))?;
            let n = t.threads_at_attach;
            Ok((Box::new(t), LiveBackend::Perf, n))
        }
        Backend::Auto => {
            let bpf_not = match bpf::BpfTracer::attach(bpf_cfg) {
                Ok(t) => {
                    eprintln!("stallscope: backend bpf (auto): {bpf_why}");
                    let n = t.threads_at_attach;
                    return Ok((Box::new(t), LiveBackend::Bpf, n));
                }
                Err(e) => no_such(e)?,
            };
            let perf_not = match perf::available() {
                Ok(()) => match perf::PerfTracer::attach(perf_cfg) {
                    Ok(t) => {
                        eprintln!(
                            "stallscope: backend perf (auto): {perf_why}; the bpf backend cannot be used: {bpf_not}"
                        );
                        let n = t.threads_at_attach;
                        return Ok((Box::new(t), LiveBackend::Perf, n));
                    }
                    Err(e) => no_such(e)?,
                },
                Err(why) => why,
            };
            start_ptrace(&format!(
                "(auto) the bpf backend cannot be used: {bpf_not}; the perf backend cannot be used: {perf_not}"
            ))
        }
    }
}

/// How many events the live loops take between two reads of the clock (see `run_attach`).
pub(crate) const CLOCK_EVERY: u32 = 64;

/// `stallscope attach`: trace a running process, print stalls as they are found, and the
/// full report when tracing ends. Returns the number of stalls (for the exit status).
pub fn run_attach(args: &AttachArgs) -> Result<u64> {
    let pid = resolve_pid(args)?;
    let mut opts = crate::run::options(&args.out)?;
    opts.root_pid = Some(pid);
    let user_conf = opts.redis_conf.is_some();
    install_stop_handlers();
    let asked_log = args.redis.as_deref().and_then(|addr| {
        crate::redis_evidence::log_source_before_attach(
            pid,
            args.out.redis_log.as_deref(),
            Some(addr),
            opts.redis_conf.as_ref(),
        )
    });
    let (mut tracer, backend, threads_at_attach) = start_tracer(pid, args)?;
    // The analysis may lag; redis and the tracer thread that resumes it must not. On a
    // small machine the analyzer would otherwise take CPU from them (nice is per thread).
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10) };
    let attach_mono = tracer.stats().attach_mono;
    let wall_at_first = tracer.stats().attach_wall;
    let ctx = procctx::gather(pid);
    if !user_conf && !ctx.redis_conf.is_empty() {
        opts.redis_conf = Some(RedisConf::parse(&ctx.redis_conf));
    }
    // The config the analysis used (it names the AOF, RDB and log files), for the recording.
    let conf_text = match &args.out.redis_conf {
        Some(f) => std::fs::read_to_string(f).ok(),
        None => Some(ctx.redis_conf.clone()).filter(|t| !t.is_empty()),
    };
    let mut thread_names = ctx.thread_names.clone();
    for (t, n) in &opts.thread_names {
        thread_names.insert(*t, n.clone());
    }
    opts.stamped_at_stops = backend == LiveBackend::Ptrace;
    opts.fault_copy_bytes = procctx::cow_fault_bytes(pid);
    let redis_conf = opts.redis_conf.clone();
    let mut an = Analyzer::new(opts);
    for (fd, what) in &ctx.fds {
        an.seed_fd(pid, *fd, what);
    }
    for (t, n) in &thread_names {
        an.set_thread_name(*t, n);
    }
    let mut rec = match &args.record {
        Some(path) => {
            let f = std::fs::File::create(path)
                .map_err(|e| anyhow::anyhow!("--record {path}: cannot create it: {e}"))?;
            let mut r = record::Recorder::new(f, pid, attach_mono, wall_at_first, ctx.cwd.clone());
            for (fd, what) in &ctx.fds {
                r.seed_fd(*fd, what);
            }
            // Only bpf and perf split calls by the scheduler; no stale split of another
            // recording.
            let spath = format!("{path}{}", record::SCHED_SUFFIX);
            if tracer.splits_sched() {
                let f = std::fs::File::create(&spath)
                    .map_err(|e| anyhow::anyhow!("--record {path}: cannot create {spath}: {e}"))?;
                r.record_sched(
                    Box::new(std::io::BufWriter::new(f)),
                    args.out.threshold / 10,
                )
                .map_err(|e| anyhow::anyhow!("--record {path}: cannot write {spath}: {e}"))?;
            } else if let Err(e) = std::fs::remove_file(&spath) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    anyhow::bail!("--record {path}: cannot remove the stale {spath}: {e}");
                }
            }
            // The same for when each read's data arrived (bpf, where the kernel stamps it).
            let apath = format!("{path}{}", record::ARRIVALS_SUFFIX);
            if tracer.dates_arrivals() == Some(true) {
                let f = std::fs::File::create(&apath)
                    .map_err(|e| anyhow::anyhow!("--record {path}: cannot create {apath}: {e}"))?;
                r.record_arrivals(Box::new(std::io::BufWriter::new(f)))
                    .map_err(|e| anyhow::anyhow!("--record {path}: cannot write {apath}: {e}"))?;
            } else if let Err(e) = std::fs::remove_file(&apath) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    anyhow::bail!("--record {path}: cannot remove the stale {apath}: {e}");
                }
            }
            Some(r)
        }
        None => None,
    };
    let interval = Duration::from_millis(100);
    let sampler = procctx::Sampler::start(pid, attach_mono, interval);
    let redis_side =
        crate::redis_evidence::LiveRedis::start(args, &ctx, redis_conf.as_ref(), asked_log);
    let clock = Clock {
        fmt: TimeFmt::Epoch,
        perf: false,
        frac_digits: 6,
        first: attach_mono,
        date: None,
        wall_at_first: Some(wall_at_first),
    };
    let deadline = args
        .duration
        .map(|d| std::time::Instant::now() + Duration::from_nanos(d as u64));
    let stderr = std::io::stderr();
    eprintln!(
        "stallscope: attached to {pid} ({} thread{}) with {backend}; stalls over {} are printed as they end; Ctrl-C to stop{}",
        threads_at_attach,
        crate::analyze::findings::plural(threads_at_attach as u64),
        crate::analyze::findings::human(args.out.threshold / 1000),
        match args.duration {
            Some(d) => format!(" (or after {})", crate::analyze::findings::human(d / 1000)),
            None => String::new(),
        }
    );
    let mut first_syscall_ts: Option<Nanos> = None;
    let mut last_drain = std::time::Instant::now();
    let mut last_stop_req: Option<std::time::Instant> = None;
    let mut record_err: Option<std::io::Error> = None;
    let mut seen_tids: rustc_hash::FxHashSet<Tid> = Default::default();
    let mut last_tid: Option<Tid> = None;
    let mut batch = std::collections::VecDeque::new();
    // The events of `batch` before `at` are done with: analysed in place, not popped (a
    // pop moved each ~300-byte event out of the queue once more), and dropped together.
    let mut at = 0usize;
    let mut spent = vec![];
    let mut since_clock = 0u32;
    loop {
        if at >= batch.len() {
            batch.clear();
            at = 0;
            tracer.reuse(&mut spent);
            tracer.next_batch(Duration::from_millis(100), &mut batch)?;
        }
        let ev = batch.get_mut(at);
        at += 1;
        // The clock is read once every CLOCK_EVERY events, or when none came: at hundreds of
        // thousands of events a second, a read per event was a visible part of the
        // tracer's own CPU, and neither the drain period nor the stop needs it finer.
        since_clock += 1;
        let look = ev.is_none() || since_clock >= CLOCK_EVERY;
        if look {
            since_clock = 0;
        }
        let lost = tracer.take_lost();
        if lost > 0 {
            an.add_lost_events(lost);
            if let Some(r) = rec.as_mut() {
                r.note_lost(lost);
            }
        }
        if let Some(ev) = ev.as_deref() {
            if ev.syscall().is_some() {
                first_syscall_ts = Some(first_syscall_ts.map_or(ev.ts, |f| f.min(ev.ts)));
                if last_tid != Some(ev.tid)
                    && seen_tids.insert(ev.tid)
                    && !thread_names.contains_key(&ev.tid)
                {
                    // A thread born while tracing: its name is in /proc now.
                    if let Ok(n) =
                        std::fs::read_to_string(format!("/proc/{pid}/task/{}/comm", ev.tid))
                    {
                        let n = n.trim_end().to_string();
                        an.set_thread_name(ev.tid, &n);
                        thread_names.insert(ev.tid, n);
                    }
                }
                last_tid = Some(ev.tid);
            }
            // The end of tracing changes nothing in the analysis (no call comes after it),
            // and a recording cannot hold it as an event (record.rs): left out, the live
            // report and that of the recording count the same events.
            if !matches!(ev.kind, crate::event::EventKind::Detach) {
                an.push(ev);
            }
            if let (Some(r), None) = (rec.as_mut(), &record_err) {
                if let Err(e) = r.write_event(ev) {
                    record_err = Some(e);
                }
            }
        }
        let got = ev.is_some();
        if let Some(ev) = ev {
            spend(ev, &mut spent);
        }
        let done = at >= batch.len() && tracer.is_done();
        if done || !got || (look && last_drain.elapsed() >= Duration::from_millis(200)) {
            last_drain = std::time::Instant::now();
            // The --redis poller's commands are ours, not a client's.
            for (fd, since) in redis_side.take_own_conns() {
                an.mark_own_connection(fd, since);
            }
            let fresh = an.drain_new_stalls(&clock);
            if !fresh.is_empty() {
                let mut w = stderr.lock();
                for s in &fresh {
                    let _ = writeln!(w, "stall: {}", crate::render::table::stall_line(s));
                }
            }
        }
        if done {
            break;
        }
        let want_stop = STOP.load(Ordering::SeqCst)
            || (look && deadline.is_some_and(|d| std::time::Instant::now() >= d))
            || record_err.is_some();
        if want_stop
            && (look || last_stop_req.is_none())
            && last_stop_req.is_none_or(|t| t.elapsed() >= Duration::from_millis(100))
        {
            tracer.stop();
            last_stop_req = Some(std::time::Instant::now());
        }
    }
    for w in tracer.warnings() {
        eprintln!("stallscope: warning: {w}");
    }
    let stats = tracer.stats();
    eprintln!(
        "stallscope: traced {} syscalls ({} of the main thread {pid}); {} lost",
        stats.syscalls, stats.main_syscalls, stats.lost_events
    );
    let samples = sampler.finish();
    let lost_text = rec.as_ref().and_then(|r| r.lost_text());
    if let Some(r) = rec {
        if record_err.is_none() {
            if let Err(e) = r.finish() {
                record_err = Some(e);
            }
        }
    }
    let mut lost_err = None;
    if let (Some(path), None) = (&args.record, &record_err) {
        let tpath = format!("{path}.threads");
        if let Err(e) = record::Recorder::<std::fs::File>::write_threads(&tpath, &thread_names) {
            eprintln!("stallscope: warning: --record: cannot write {tpath}: {e}");
        }
        // Without losses no sidecar, and none left from an earlier recording to this name.
        let lpath = format!("{path}{}", record::LOST_SUFFIX);
        let written = match &lost_text {
            Some(text) => std::fs::write(&lpath, text),
            None => std::fs::remove_file(&lpath).or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            }),
        };
        if let Err(e) = written {
            // A replay without it would not say what the live report said was lost.
            lost_err = Some(std::io::Error::new(
                e.kind(),
                format!("{lpath} (the lost-records sidecar): {e}"),
            ));
        }
        if let Some(text) = &conf_text {
            let cpath = format!("{path}{}", record::CONF_SUFFIX);
            if let Err(e) = std::fs::write(&cpath, text) {
                eprintln!("stallscope: warning: --record: cannot write {cpath}: {e}");
            }
        }
    }
    let info = SourceInfo {
        kind: crate::report::SourceKind::Live,
        files: vec![],
        format: format!(
            "stallscope attach ({backend}{})",
            if args.no_follow_forks {
                ""
            } else {
                ", following forks"
            }
        ),
        pid: Some(pid),
        clock,
    };
    let mut report = an.finish(info, Counters::default());
    report.source.backend = Some(backend);
    report.summary.command_start = command_start(tracer.dates_arrivals());
    // Samples were stamped from the attach; the report's axis starts at its first call.
    let shift = (first_syscall_ts.unwrap_or(attach_mono) - attach_mono) / 1000;
    let samples = samples.into_iter().map(|mut s| {
        s.at_us -= shift;
        s
    });
    procctx::attach_host_context(&mut report, samples.collect(), interval);
    add_overhead(&mut report, &stats, backend);
    let tracing_cost = report.overhead.as_ref().and_then(|o| o.warning.clone());
    report
        .findings
        .extend(crate::analyze::findings::live_findings(&LiveEvidence {
            sees_commands: backend != LiveBackend::Perf,
            // Only ptrace stops redis; the other backends' warning is about lost records.
            tracing_cost: tracing_cost
                .as_deref()
                .filter(|_| backend == LiveBackend::Ptrace),
            watch: None,
        }));
    redis_side.finish(&mut report)?;
    if let Some(e) = record_err.or(lost_err) {
        let path = args.record.as_deref().unwrap_or("");
        return Err(anyhow::anyhow!("--record {path}: cannot write it: {e}"));
    }
    crate::run::emit(&report, &args.out)?;
    Ok(report.summary.stalls)
}

/// Above this share of the main thread's time spent in ptrace round trips, the report warns
/// that tracing itself is slowing redis down.
const OVERHEAD_WARN_SHARE: f64 = 0.10;

/// Fills `report.overhead`; its warning, when tracing cost substantially, is the evidence of
/// the `tracer-overhead` finding (`analyze::findings::live_findings`).
pub fn add_overhead(report: &mut Report, st: &TracerStats, backend: LiveBackend) {
    let span_ns = (st.detach_mono - st.attach_mono).max(1) as f64;
    let per_s = st.syscalls as f64 / (span_ns / 1e9);
    if backend != LiveBackend::Ptrace {
        // Nothing is stopped: the cost is the kernel writing two records per syscall,
        // not something a traced duration shows. What can go wrong is losing records.
        let warning = (st.lost_events > 0).then(|| {
            format!(
                "the kernel dropped {} syscall records because the ring buffers filled up: the trace is incomplete \
                 (stalls found after the first loss say so); trace again with a larger --perf-pages (ring-buffer pages)",
                st.lost_events
            )
        });
        report.overhead = Some(Overhead {
            syscalls_per_s: per_s,
            mean_stop_us: 0.0,
            warning,
        });
        return;
    }
    let mean_stop_us = if st.stops == 0 {
        0.0
    } else {
        st.stop_ns as f64 / st.stops as f64 / 1000.0
    };
    // The typical traced call of the main thread (median; mostly ptrace round trip for
    // redis's non-blocking reads and writes) times how many it made: the share of its time
    // spent being traced. The fastest call is the floor when the median is not known.
    let per_call_ns = st.main_call_median_ns().unwrap_or(st.min_call_ns as f64);
    let share = st.main_syscalls as f64 * per_call_ns / span_ns;
    let warning = (share >= OVERHEAD_WARN_SHARE).then(|| {
        format!(
            "tracing is slowing redis down: its main thread made {:.0} syscalls/s and a typical one took {:.1} µs under ptrace, \
             about {:.0}% of its time; latencies in this report include that cost",
            st.main_syscalls as f64 / (span_ns / 1e9),
            per_call_ns / 1000.0,
            share * 100.0
        )
    });
    report.overhead = Some(Overhead {
        syscalls_per_s: per_s,
        mean_stop_us,
        warning,
    });
}

/// The kernel's page size, in which perf and BPF ring buffers are sized.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the running kernel.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Where a report's per-command latency starts (`summary.command_start`), from
/// `Tracer::dates_arrivals`: None for backends that see no command's arrival at all.
pub(crate) fn command_start(dates_arrivals: Option<bool>) -> Option<crate::report::CommandStart> {
    dates_arrivals.map(|on| {
        if on {
            crate::report::CommandStart::Arrival
        } else {
            crate::report::CommandStart::EventLoop
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sched_counters_read_schedstat_and_the_fault_fields_of_stat() {
        let stat = "4242 (redis-server) S 1 4242 4242 0 -1 4194560 1234 0 56 0 10 5 0 0 20 0 5 0";
        assert_eq!(
            parse_sched_counters("123456789 2345 17\n", stat),
            Some([123_456_789, 2345, 1234, 56])
        );
        // A command name with a ") " in it is skipped whole.
        let odd = "7 (a) b) R 1 7 7 0 -1 0 9 0 3 0";
        assert_eq!(parse_sched_counters("1 2 3", odd), Some([1, 2, 9, 3]));
        assert_eq!(parse_sched_counters("", stat), None);
        let me = std::process::id();
        let c = sched_counters(me, me).expect("this thread's counters");
        assert!(c[0] > 0, "it has run: {c:?}");
    }
}
