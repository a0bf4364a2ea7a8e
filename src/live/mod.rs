//! Live sources: `stallscope attach`. A backend-neutral `Tracer` produces the same `Event`s
//! as the text sources, from a running process; `procctx` adds what only a live process can
//! tell (its open fds, thread names, redis config, page faults, I/O and iowait over time);
//! `record` writes what was traced as strace text so `analyze` can read it again. The events
//! go through the same `Analyzer` as `analyze`, stalls are printed as they are found, and
//! the report at the end is rendered by the same renderers.

pub mod procctx;
pub mod ptrace;
pub mod record;
pub mod sysnames;

use crate::event::{Event, Nanos, Tid};
use anyhow::Result;
use std::time::Duration;

/// CLOCK_MONOTONIC in ns: the live clock (immune to wall-clock steps during a trace).
pub fn now_mono() -> Nanos {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as i64 * 1_000_000_000 + ts.tv_nsec as i64
}

/// CLOCK_REALTIME in ns since the epoch, read once at attach to place the trace in time.
pub fn now_wall() -> Nanos {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as i64 * 1_000_000_000 + ts.tv_nsec as i64
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
}

/// Why attaching failed, in words that say what to do.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("no such process: {0}")]
    NoSuchPid(Tid),
    #[error("process {pid} is already traced by process {tracer} ({tracer_name}): only one tracer can attach; stop it first")]
    AlreadyTraced { pid: Tid, tracer: Tid, tracer_name: String },
    #[error("permission denied to trace process {pid}: {}", permission_hint(*.scope, *.root))]
    Permission { pid: Tid, scope: Option<u32>, root: bool },
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
    /// Tracing has ended (stopped, or the process is gone) and every event was returned.
    fn is_done(&self) -> bool;
    /// Asks the tracer to let go of the process; events keep coming until `is_done`.
    fn stop(&mut self);
    fn stats(&self) -> TracerStats;
    /// Things the user should know that are not events (threads that could not be seized...).
    fn warnings(&mut self) -> Vec<String>;

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
