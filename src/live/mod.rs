//! Inputs layer: the live backends. A backend-neutral `Tracer` produces the same `Event`s as
//! the text sources, from a running process, and says what it can see (`Capabilities`);
//! `start_tracer` picks and starts one (`TracerConfig`); `procctx` adds what only a live
//! process can tell (its open fds, thread names, redis config, page faults, I/O and iowait
//! over time), `container` how the host reaches a process in its own namespaces (its files,
//! pids and network) and what its cgroup path names. The sessions layer (`session`) runs them; nothing here knows the commands.

pub(crate) mod bpf;
pub(crate) mod cgroup;
pub mod container;
mod decode;
mod fed;
pub(crate) mod host;
pub(crate) mod perf;
pub(crate) mod procctx;
pub(crate) mod ptrace;
mod reader;
pub(crate) mod sysnames;
pub(crate) mod tracefs;

use crate::event::{Event, Nanos, Tid};
use crate::report::LiveBackend;
use anyhow::Result;
use std::time::Duration;

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
        throttled_ns: None,
        reclaim_ns: None,
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
    parse_sched_bytes(schedstat.as_bytes(), stat.as_bytes())
}

/// `parse_sched_counters` of the files' bytes, allocating nothing (the ptrace backend reads
/// them at the stops of the traced threads, `ptrace::sched`, with the two parts below).
/// `stat` may be cut short after the major-fault field.
fn parse_sched_bytes(schedstat: &[u8], stat: &[u8]) -> Option<[u64; 4]> {
    let [on, run] = parse_schedstat(schedstat)?;
    let [minflt, majflt] = parse_stat_faults(stat)?;
    Some([on, run, minflt, majflt])
}

/// `schedstat`'s ns on a CPU and ns runnable.
pub(crate) fn parse_schedstat(schedstat: &[u8]) -> Option<[u64; 2]> {
    let mut ss = schedstat
        .split(u8::is_ascii_whitespace)
        .filter(|f| !f.is_empty());
    Some([parse_u64(ss.next()?)?, parse_u64(ss.next()?)?])
}

/// `stat`'s minor and major faults.
pub(crate) fn parse_stat_faults(stat: &[u8]) -> Option<[u64; 2]> {
    // After the command name: state ppid pgrp session tty tpgid flags minflt cminflt majflt.
    let close = stat.iter().rposition(|b| *b == b')')?;
    let mut f = stat[close + 1..]
        .split(u8::is_ascii_whitespace)
        .filter(|f| !f.is_empty());
    let minflt = parse_u64(f.nth(7)?)?;
    let majflt = parse_u64(f.nth(1)?)?;
    Some([minflt, majflt])
}

/// A decimal field of /proc; None if it is not one (or overflows).
fn parse_u64(b: &[u8]) -> Option<u64> {
    if b.is_empty() {
        return None;
    }
    b.iter().try_fold(0u64, |n, d| {
        if !d.is_ascii_digit() {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
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
    /// (host pid, pid in its own pid namespace) of the traced processes mapped so far
    /// (`container::PidNs`); empty on a bare host.
    pub ns_pids: Vec<(Tid, Tid)>,
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

/// What a backend can see and what it costs, as the analysis and the report need it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// It stops the traced thread at each call (ptrace): calls are stamped at the stops.
    pub stops_tracee: bool,
    /// It reads request and reply buffers: commands are named and timed.
    pub reads_buffers: bool,
    /// Its calls carry the scheduler's split.
    pub splits_sched: bool,
    /// When socket reads' data arrived: None when it has no means, Some(false) when this
    /// kernel lacks them.
    pub dates_arrivals: Option<bool>,
    /// Its split measures the time the cgroup's CPU quota throttled the thread.
    pub splits_throttle: bool,
}

impl Capabilities {
    /// Where per-command latency starts (`summary.command_start`): None when the backend
    /// sees no command at all.
    pub fn command_start(&self) -> Option<crate::report::CommandStart> {
        self.dates_arrivals.map(|on| {
            if on {
                crate::report::CommandStart::Arrival
            } else {
                crate::report::CommandStart::EventLoop
            }
        })
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
    /// Whether it stops the traced thread at each call (ptrace): its timestamps are taken at
    /// the stops, and tracing itself slows redis down.
    fn stops_tracee(&self) -> bool {
        false
    }
    /// Whether it reads the buffers of reads and writes (request and reply bytes), which
    /// name commands.
    fn reads_buffers(&self) -> bool {
        false
    }
    /// Whether its calls carry the scheduler's split (`Syscall::sched`).
    fn splits_sched(&self) -> bool {
        false
    }
    /// Everything above at once: what the session and the report ask of a backend, instead
    /// of asking which backend it is.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            stops_tracee: self.stops_tracee(),
            reads_buffers: self.reads_buffers(),
            splits_sched: self.splits_sched(),
            dates_arrivals: self.dates_arrivals(),
            splits_throttle: self.splits_throttle(),
        }
    }
    /// Whether its scheduler split says how much of the wait for a CPU was the cgroup's
    /// quota throttling the thread (`SchedDelta::throttled_ns`).
    fn splits_throttle(&self) -> bool {
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

/// `--name`: processes whose command name (comm, or argv[0]'s base name) is `name`.
pub fn find_by_name(name: &str) -> Vec<(Tid, String)> {
    find_by_names(&[name])
}

/// Processes whose comm, argv[0]'s base name or executable's base name is one of `names`.
pub fn find_by_names(names: &[&str]) -> Vec<(Tid, String)> {
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
        let exe = std::fs::read_link(e.path().join("exe")).ok();
        let exe = exe
            .as_ref()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .map(|n| n.trim_end_matches(" (deleted)"));
        let is = |n: Option<&str>| n.is_some_and(|n| names.contains(&n));
        if is(Some(comm.trim_end())) || is(argv0.as_deref()) || is(exe) {
            found.push((pid, args.join(" ")));
        }
    }
    found.sort();
    found
}

/// Which backend to start (`--backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// bpf if the kernel loads its programs, else perf if it allows the tracepoints, else
    /// ptrace (unless `TracerConfig::auto_may_stop` is false).
    Auto,
    Bpf,
    Perf,
    Ptrace,
}

/// How to trace a process: what `attach` and `watch` ask of the backends, free of how the
/// command line spelled it.
#[derive(Clone, Debug)]
pub struct TracerConfig {
    pub pid: Tid,
    pub backend: BackendChoice,
    pub follow_forks: bool,
    /// Ring-buffer pages (bpf, perf); None: the backend's default.
    pub pages: Option<usize>,
    /// Whether `Auto` may end on ptrace, which stops redis at every call: fine for a short
    /// attach, not for a watcher that runs for days.
    pub auto_may_stop: bool,
}

/// A tracer that has attached, with its name and how many threads it found.
pub struct Started {
    pub tracer: Box<dyn Tracer>,
    pub backend: LiveBackend,
    pub threads: u32,
}

/// Starts the tracer the config asks for (for `Auto`: bpf if the kernel loads its
/// programs, else perf if it allows the tracepoints, else ptrace), saying on stderr which
/// one and why.
pub fn start_tracer(cfg: &TracerConfig) -> Result<Started> {
    let pid = cfg.pid;
    let ptrace_cfg = ptrace::PtraceConfig {
        pid,
        follow_forks: cfg.follow_forks,
        detach_wait: Duration::from_millis(1000),
        split_sched: ptrace::sched::wanted(),
    };
    let start_ptrace = |why: &str| -> Result<Started> {
        eprintln!("stallscope: backend ptrace: {why}");
        let t = ptrace::PtraceTracer::attach(ptrace_cfg.clone())
            .map_err(|e| anyhow::anyhow!("cannot attach to process {pid}: {e}"))?;
        let threads = t.threads_at_attach;
        Ok(Started {
            tracer: Box::new(t),
            backend: LiveBackend::Ptrace,
            threads,
        })
    };
    match cfg.backend {
        BackendChoice::Ptrace => start_ptrace(
            "chosen with --backend ptrace (every syscall stops the traced thread twice)",
        ),
        BackendChoice::Bpf => start_bpf(cfg, "").map_err(|e| match e {
            Ok(e) => anyhow::anyhow!("cannot attach to process {pid} with bpf: {e}"),
            Err(e) => e,
        }),
        BackendChoice::Perf => start_perf(cfg, "").map_err(|e| match e {
            Ok(e) => anyhow::anyhow!("cannot attach to process {pid} with perf: {e}"),
            Err(e) => e,
        }),
        BackendChoice::Auto => {
            let bpf_not = match start_bpf(cfg, " (auto)") {
                Ok(s) => return Ok(s),
                Err(e) => e?,
            };
            let perf_not = match perf::available() {
                Ok(()) => {
                    let why = format!("; the bpf backend cannot be used: {bpf_not}");
                    match start_perf(cfg, &why) {
                        Ok(s) => return Ok(s),
                        Err(e) => e?,
                    }
                }
                Err(why) => why,
            };
            if !cfg.auto_may_stop {
                anyhow::bail!(
                    "--backend auto: no backend that leaves redis running at full speed can be used: the bpf \
                     backend: {bpf_not}; the perf backend: {perf_not}; --backend ptrace works everywhere but \
                     stops redis at every syscall"
                );
            }
            start_ptrace(&format!(
                "(auto) the bpf backend cannot be used: {bpf_not}; the perf backend cannot be used: {perf_not}"
            ))
        }
    }
}

/// The outcome of trying one backend: started; or why not, as words for `auto` to pass on
/// (`Err(Ok(why))`) or as an error that ends the attach whatever the choice (`Err(Err(e))`:
/// the process does not exist).
type Tried = std::result::Result<Started, Result<String>>;

fn why_not(pid: Tid, e: AttachError) -> Result<String> {
    match e {
        AttachError::NoSuchPid(p) => Err(anyhow::anyhow!(
            "cannot attach to process {pid}: {}",
            AttachError::NoSuchPid(p)
        )),
        e => Ok(e.to_string()),
    }
}

fn start_bpf(cfg: &TracerConfig, how: &str) -> Tried {
    let bpf_cfg = bpf::BpfConfig {
        pid: cfg.pid,
        follow_forks: cfg.follow_forks,
        pages: cfg.pages.unwrap_or(bpf::DEFAULT_PAGES),
    };
    let t = bpf::BpfTracer::attach(bpf_cfg).map_err(|e| why_not(cfg.pid, e))?;
    eprintln!(
        "stallscope: backend bpf{how}: BPF programs on the syscall tracepoints, filtered and paired in the \
         kernel: redis is never stopped, and command names are read from its requests"
    );
    let threads = t.threads_at_attach;
    Ok(Started {
        tracer: Box::new(t),
        backend: LiveBackend::Bpf,
        threads,
    })
}

/// Starts tracing `cfg.pid` with the programs `host` loaded once for every watched
/// process (`watch --all`).
pub fn start_on_host(host: &bpf::BpfHost, cfg: &TracerConfig) -> Result<Started> {
    let bpf_cfg = bpf::BpfConfig {
        pid: cfg.pid,
        follow_forks: cfg.follow_forks,
        pages: cfg.pages.unwrap_or(bpf::DEFAULT_PAGES),
    };
    let t = bpf::BpfTracer::on_host(host, bpf_cfg)
        .map_err(|e| anyhow::anyhow!("cannot attach to process {} with bpf: {e}", cfg.pid))?;
    let threads = t.threads_at_attach;
    Ok(Started {
        tracer: Box::new(t),
        backend: LiveBackend::Bpf,
        threads,
    })
}

fn start_perf(cfg: &TracerConfig, why_not_bpf: &str) -> Tried {
    let perf_cfg = perf::PerfConfig {
        pid: cfg.pid,
        follow_forks: cfg.follow_forks,
        pages: cfg.pages.unwrap_or(perf::DEFAULT_PAGES),
    };
    let t = perf::PerfTracer::attach(perf_cfg).map_err(|e| why_not(cfg.pid, e))?;
    let how = if why_not_bpf.is_empty() {
        ""
    } else {
        " (auto)"
    };
    eprintln!(
        "stallscope: backend perf{how}: syscall tracepoints through perf_event_open: redis is never \
         stopped{why_not_bpf}"
    );
    let threads = t.threads_at_attach;
    Ok(Started {
        tracer: Box::new(t),
        backend: LiveBackend::Perf,
        threads,
    })
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
        assert_eq!(parse_sched_counters("12 x", stat), None);
        // Cut short after the major faults (a read into a small buffer) is enough; before
        // them it is not.
        let cut = &stat[..stat.find(" 0 10").unwrap()];
        assert_eq!(parse_sched_counters("5 6", cut), Some([5, 6, 1234, 56]));
        assert_eq!(parse_sched_counters("5 6", &stat[..40]), None);
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        let me = std::process::id();
        let c = sched_counters(me, me).expect("this thread's counters");
        assert!(c[0] > 0, "it has run: {c:?}");
    }
}
