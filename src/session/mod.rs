//! Sessions layer: one live session, whatever the command that runs it. `attach`, `watch`,
//! the watch's incident writer and the replay of a recording all need the same pieces, and
//! they are here once: starting a tracer and reading the process around it (`LiveSession`),
//! seeding an analyzer with what the process told (`seed`), the loop that consumes the
//! tracer's batches (`LiveSession::run` and its `Sink`), the live report's enrichment
//! (`enrich`), and a tracer that replays a recording (`replay::ReplayTracer`), through which
//! the loops are tested without root.

#[cfg(test)]
pub(crate) mod replay;
#[cfg(test)]
mod tests;

use crate::analyze::findings::{LiveEvidence, WatchWindow};
use crate::analyze::{Analyzer, Options, RedisConf};
use crate::event::{Event, EventKind, Nanos, SchedSpan, Tid};
use crate::live::container;
use crate::live::procctx::{self, ProcContext};
use crate::live::{Capabilities, Started, Tracer, TracerConfig, TracerStats};
use crate::report::{Container, LiveBackend, Overhead, Report};
use crate::source::{Clock, TimeFmt};
use anyhow::Result;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How many events the loop takes between two reads of the clock: at hundreds of thousands
/// of events a second, a read per event was a visible part of the tracer's own CPU, and
/// neither the drain period nor the stop needs it finer.
pub(crate) const CLOCK_EVERY: u32 = 64;

/// A traced process: the tracer, what it can see, and what /proc told at the attach.
pub(crate) struct LiveSession {
    pub tracer: Box<dyn Tracer>,
    pub backend: LiveBackend,
    pub caps: Capabilities,
    pub pid: Tid,
    pub threads_at_attach: u32,
    /// The fds, names, config and cwd of the process at the attach.
    pub ctx: ProcContext,
    /// Thread names: /proc's at the attach, the user's `--threads` over them, and those of
    /// threads born while tracing as they first appear.
    pub threads: Threads,
    /// The live clock: monotonic, placed in time by the wall clock read at the attach.
    pub clock: Clock,
    /// The analysis options for this process (the user's, completed from /proc).
    pub opts: Options,
    /// The redis config the analysis uses, as text (for a recording's sidecar).
    pub conf_text: Option<String>,
    /// The clock is this machine's monotonic one, now (a live tracer), which a long watch
    /// keeps in step with the wall clock; a replayed recording's is its own.
    pub live_clock: bool,
    /// The container the process runs in, read at the attach (None on a bare host, and
    /// for a replayed recording).
    pub container: Option<Container>,
}

impl LiveSession {
    /// Attaches to `cfg.pid` and reads the process around it. `base`: the user's options;
    /// `user_conf`: the text of `--redis-conf`, if given (it wins over what /proc tells).
    pub(crate) fn start(
        cfg: &TracerConfig,
        base: &Options,
        user_conf: Option<String>,
    ) -> Result<Self> {
        let started = crate::live::start_tracer(cfg)?;
        Ok(Self::live(started, cfg.pid, base, user_conf))
    }

    /// A session around a tracer that has just attached to live process `pid` (one of
    /// the programs every watched process shares, `live::start_on_host`).
    pub(crate) fn live(
        started: Started,
        pid: Tid,
        base: &Options,
        user_conf: Option<String>,
    ) -> Self {
        let ctx = procctx::gather(pid);
        let fault_copy = procctx::cow_fault_bytes(pid);
        let mut s = Self::around(started, ctx, base, user_conf, fault_copy);
        s.live_clock = true;
        s.container = container::describe(pid, &[]);
        s.opts.cgroup = cgroup_evidence(pid, s.caps.splits_throttle);
        s.opts.cpus = procctx::cpus(pid);
        s
    }

    /// The container as the report names it: as read at the attach, with the pids of its
    /// processes that the tracer mapped since (`stats`: the tracer's counts, read now).
    pub(crate) fn container_now(&self, stats: &TracerStats) -> Option<Container> {
        let mut c = self.container.clone()?;
        container::add_pids(&mut c, &stats.ns_pids);
        Some(c)
    }

    /// The readings of the cgroup's rules (`analyze::limits`) go to `an` before its report
    /// is made: those of `sampler` so far.
    pub(crate) fn cgroup_readings(an: &mut Analyzer, sampler: &crate::live::host::Sampler) {
        let raw = sampler.window(Nanos::MIN / 2, Nanos::MAX / 2);
        let host = crate::live::host::steal_readings(&raw);
        an.host_readings(crate::live::host::cg_readings(&raw), host);
    }

    /// A session around a tracer that has already attached, with the process's context as
    /// it was read (live: from /proc; a replay: from the recording).
    pub(crate) fn around(
        started: Started,
        ctx: ProcContext,
        base: &Options,
        user_conf: Option<String>,
        fault_copy_bytes: Option<u64>,
    ) -> Self {
        let Started {
            tracer,
            backend,
            threads,
        } = started;
        let caps = tracer.capabilities();
        let st = tracer.stats();
        let pid = ctx.pid;
        let mut opts = base.clone();
        opts.root_pid = Some(pid);
        opts.stamped_at_stops = caps.stops_tracee;
        opts.fault_copy_bytes = fault_copy_bytes;
        if opts.redis_conf.is_none() && !ctx.redis_conf.is_empty() {
            opts.redis_conf = Some(RedisConf::parse(&ctx.redis_conf));
        }
        let conf_text =
            user_conf.or_else(|| Some(ctx.redis_conf.clone()).filter(|t| !t.is_empty()));
        let mut names = ctx.thread_names.clone();
        for (t, n) in &base.thread_names {
            names.insert(*t, n.clone());
        }
        LiveSession {
            tracer,
            backend,
            caps,
            pid,
            threads_at_attach: threads,
            clock: live_clock(st.attach_mono, st.attach_wall),
            threads: Threads::new(pid, names),
            ctx,
            opts,
            conf_text,
            live_clock: false,
            container: None,
        }
    }

    /// A new analyzer for this process, seeded with what the process told (`seed`).
    pub(crate) fn analyzer(&self, own_conns: &[(i32, Nanos)]) -> Analyzer {
        let mut an = Analyzer::new(self.opts.clone());
        seed(
            &mut an,
            self.pid,
            &self.ctx.fds,
            &self.threads.names,
            own_conns,
        );
        an
    }

    /// Consumes the tracer's events until it is done, handing each to `sink`. Asks the
    /// tracer to stop when the sink wants it (again every 100 ms until it does: a stop
    /// request can race a thread being born).
    pub(crate) fn run(&mut self, sink: &mut impl Sink) -> Result<()> {
        let mut batch = std::collections::VecDeque::new();
        // The events of `batch` before `at` are done with: used in place, not popped (a pop
        // moved each ~300-byte event out of the queue once more), and dropped together.
        let mut at = 0usize;
        let mut since_clock = 0u32;
        let mut last_stop_req: Option<Instant> = None;
        loop {
            if at >= batch.len() {
                batch.clear();
                at = 0;
                self.tracer.reuse(sink.spent());
                self.tracer
                    .next_batch(Duration::from_millis(100), &mut batch)?;
            }
            let ev = batch.get_mut(at);
            at += 1;
            let got_event = ev.is_some();
            since_clock += 1;
            let look = !got_event || since_clock >= CLOCK_EVERY;
            if look {
                since_clock = 0;
            }
            let lost = self.tracer.take_lost();
            if lost > 0 {
                sink.lost(lost);
            }
            if let Some(ev) = ev {
                if ev.syscall().is_some() {
                    if let Some(name) = self.threads.born(ev.tid) {
                        sink.new_thread(ev.tid, name);
                    }
                }
                sink.event(ev, &self.threads);
                crate::live::spend(ev, sink.spent());
            }
            let done = at >= batch.len() && self.tracer.is_done();
            sink.tick(
                &mut Tick {
                    got_event,
                    look: look.then(Instant::now),
                    done,
                },
                &mut self.threads,
            );
            if done {
                return Ok(());
            }
            if (look || last_stop_req.is_none())
                && sink.want_stop(look)
                && last_stop_req.is_none_or(|t| t.elapsed() >= Duration::from_millis(100))
            {
                self.tracer.stop();
                last_stop_req = Some(Instant::now());
            }
        }
    }

    /// The tracer's warnings, said on stderr, and its counts.
    pub(crate) fn end(&mut self) -> TracerStats {
        for w in self.tracer.warnings() {
            eprintln!("stallscope: warning: {w}");
        }
        self.tracer.stats()
    }
}

/// The live clock: CLOCK_MONOTONIC from the attach, placed by the wall time read then.
pub(crate) fn live_clock(attach_mono: Nanos, attach_wall: Nanos) -> Clock {
    Clock {
        fmt: TimeFmt::Epoch,
        perf: false,
        frac_digits: 6,
        first: attach_mono,
        date: None,
        wall_at_first: Some(attach_wall),
    }
}

/// One round of the loop, as the sink sees it.
pub(crate) struct Tick {
    /// An event came this round (none: the tracer had nothing within its timeout).
    pub got_event: bool,
    /// The clock, when it was read this round (every `CLOCK_EVERY` events, or when none came).
    pub look: Option<Instant>,
    /// The tracer has ended and every event was handed on.
    pub done: bool,
}

/// What consumes a live session's events: `attach`'s one analyzer and recorder, or the
/// watcher's windows, ring and metrics.
pub(crate) trait Sink {
    /// The kernel dropped `n` records before the next event.
    fn lost(&mut self, n: u64);
    /// A thread first seen now, with its name from /proc.
    fn new_thread(&mut self, tid: Tid, name: &str);
    /// The next event (the sink may take what it owns; it is dropped with its batch).
    fn event(&mut self, ev: &mut Event, threads: &Threads);
    /// Called once a round, after the event: the sink's periodic work (draining stalls).
    fn tick(&mut self, t: &mut Tick, threads: &mut Threads);
    /// Whether to ask the tracer to stop; `look`: the clock was read this round.
    fn want_stop(&mut self, look: bool) -> bool;
    /// Where the scheduler splits of used events go, for the tracer to reuse.
    #[allow(clippy::vec_box)]
    fn spent(&mut self) -> &mut Vec<Box<SchedSpan>>;
}

/// The traced process's thread names, completed as threads are born.
pub(crate) struct Threads {
    pid: Tid,
    pub names: HashMap<Tid, String>,
    seen: rustc_hash::FxHashSet<Tid>,
    last: Option<Tid>,
}

impl Threads {
    pub(crate) fn new(pid: Tid, names: HashMap<Tid, String>) -> Threads {
        Threads {
            pid,
            names,
            seen: Default::default(),
            last: None,
        }
    }

    /// For a thread not seen before and not named yet: its name, read from /proc now (a
    /// thread born while tracing). Cheap for the common case, the same thread again.
    fn born(&mut self, tid: Tid) -> Option<&str> {
        if self.last == Some(tid) {
            return None;
        }
        self.last = Some(tid);
        if !self.seen.insert(tid) || self.names.contains_key(&tid) {
            return None;
        }
        let n = std::fs::read_to_string(format!("/proc/{}/task/{tid}/comm", self.pid)).ok()?;
        self.names.insert(tid, n.trim_end().to_string());
        self.names.get(&tid).map(String::as_str)
    }

    /// Reads every name again from /proc (a long watch: threads come and go).
    pub(crate) fn refresh(&mut self) {
        self.names = procctx::thread_names(self.pid);
        self.seen.clear();
        self.last = None;
    }
}

/// Gives a fresh analyzer what the process told at the attach: its open fds (named, so a
/// call on a file opened before tracing began is still placed), its thread names, and the
/// connections that are stallscope's own (`--redis`'s poller: its commands are not a
/// client's).
pub(crate) fn seed(
    an: &mut Analyzer,
    pid: Tid,
    fds: &[(i32, String)],
    names: &HashMap<Tid, String>,
    own_conns: &[(i32, Nanos)],
) {
    for (fd, what) in fds {
        an.seed_fd(pid, *fd, what);
    }
    for (fd, since) in own_conns {
        an.mark_own_connection(*fd, *since);
    }
    for (t, n) in names {
        an.set_thread_name(*t, n);
    }
}

/// What a live report gets beyond the analysis of its events.
pub(crate) struct Enrichment<'a> {
    pub backend: LiveBackend,
    pub caps: Capabilities,
    /// What the tracer counted (attach: its cost goes in the report; a watch incident's
    /// cost is in the watcher's metrics instead).
    pub stats: Option<&'a TracerStats>,
    /// A watch incident: the window its report covers.
    pub watch: Option<WatchWindow>,
    /// The container the process runs in (`LiveSession::container_now`).
    pub container: Option<Container>,
}

/// Adds to a live report what only the session knows: the backend, where command latency
/// starts, what tracing cost, and the findings of the live rules (what the backend could
/// not see, what tracing itself did to redis, a watch incident's window).
pub(crate) fn enrich(report: &mut Report, e: &Enrichment) {
    report.source.backend = Some(e.backend);
    report.summary.command_start = e.caps.command_start();
    report.live.container = e.container.clone();
    if let Some(st) = e.stats {
        add_overhead(report, st, e.caps.stops_tracee);
    }
    // Only a tracer that stops redis slows it down; the others' warning is about lost
    // records, said in the overhead section.
    let tracing_cost = report
        .live
        .overhead
        .as_ref()
        .and_then(|o| o.warning.clone())
        .filter(|_| e.caps.stops_tracee);
    let live = LiveEvidence {
        sees_commands: e.caps.reads_buffers,
        tracing_cost: tracing_cost.as_deref(),
        watch: e.watch,
    };
    for f in crate::analyze::findings::live_findings(&live) {
        // The stalls the tracer held stopped (`tracer-overhead` from the trace) and what
        // tracing cost over all of it are one finding.
        match report.findings.iter_mut().find(|g| g.id == f.id) {
            Some(g) => {
                g.evidence = format!("{}; {}", g.evidence, f.evidence);
                g.severity = g.severity.max(f.severity);
            }
            None => report.findings.push(f),
        }
    }
}

/// What the analysis knows of `pid`'s cgroup from the start: its limits; None in the root
/// cgroup with no limits, or when its cgroup cannot be read.
fn cgroup_evidence(pid: Tid, exact_throttle: bool) -> Option<crate::analyze::limits::CgEvidence> {
    let cg = crate::live::cgroup::Cgroup::of(std::path::Path::new("/"), pid)?;
    let limits = cg.limits();
    if cg.is_root() && !limits.any() {
        return None;
    }
    Some(crate::analyze::limits::CgEvidence {
        limits,
        readings: vec![],
        exact_throttle,
        burst_file: cg.burst_file(),
    })
}

/// Above this share of the main thread's time spent in ptrace round trips, the report warns
/// that tracing itself is slowing redis down.
const OVERHEAD_WARN_SHARE: f64 = 0.10;

/// Fills `report.overhead`; its warning, when tracing cost substantially, is the evidence of
/// the `tracer-overhead` finding (`analyze::findings::live_findings`).
pub(crate) fn add_overhead(report: &mut Report, st: &TracerStats, stops_tracee: bool) {
    let span_ns = (st.detach_mono - st.attach_mono).max(1) as f64;
    let per_s = st.syscalls as f64 / (span_ns / 1e9);
    if !stops_tracee {
        // Nothing is stopped: the cost is the kernel writing two records per syscall,
        // not something a traced duration shows. What can go wrong is losing records.
        let warning = (st.lost_events > 0).then(|| {
            format!(
                "the kernel dropped {} syscall records because the ring buffers filled up: the trace is incomplete \
                 (stalls found after the first loss say so); trace again with a larger --perf-pages (ring-buffer pages)",
                st.lost_events
            )
        });
        report.live.overhead = Some(Overhead {
            syscalls_per_s: per_s,
            stops_redis: false,
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
    report.live.overhead = Some(Overhead {
        syscalls_per_s: per_s,
        stops_redis: true,
        mean_stop_us,
        warning,
    });
}

/// Whether `ev` is the end of tracing, which changes nothing in the analysis (no call comes
/// after it) and which a recording cannot hold as an event: left out, the live report and
/// that of the recording count the same events.
pub(crate) fn is_detach(ev: &Event) -> bool {
    matches!(ev.kind, EventKind::Detach)
}
