//! The analyzer's configuration, fixed before the first event: the threshold, what the
//! outputs need kept, and what is known about the traced redis from outside the trace.

use crate::event::{Nanos, Tid};
use crate::redis_conf::RedisConf;
use rustc_hash::FxHashMap as HashMap;

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
    /// The most bytes one copy-on-write page fault copies on the traced machine (live, from
    /// the kernel: a base page, or a huge page before Linux 5.8); None when not known.
    pub fault_copy_bytes: Option<u64>,
    /// Live: the traced process's cgroup (limits from the start; readings added before the
    /// report is made, `Analyzer::host_readings`).
    pub cgroup: Option<super::limits::CgEvidence>,
    /// Live: the host's steal time (monotonic ns, cumulative ns of all CPUs) at each /proc
    /// reading (`Analyzer::host_readings`); empty elsewhere.
    pub host_steal: Vec<(Nanos, u64)>,
    /// Live: the CPUs the traced process may run on (read at the attach).
    pub cpus: Option<crate::report::Cpus>,
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
            fault_copy_bytes: None,
            cgroup: None,
            host_steal: vec![],
            cpus: None,
        }
    }
}
