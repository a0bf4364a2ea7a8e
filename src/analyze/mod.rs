//! Analyzers: the stage between resolved events and the report. `Analyzer::push` takes
//! events in trace order from any source (saved traces or live tracers); `World` resolves
//! each call once (thread, process, file, role) and the units, one per question, read that
//! context in a fixed order visible in `on_syscall`: coverage, idle time, samples,
//! stalls, holds, arrivals, file time, latency, commands, phases. `finish` asks each unit for its
//! part of the `Report`; `findings` names the causes and the advice from an explicit
//! evidence input. Memory is bounded by the number of threads, files, phases and stalls,
//! never by the number of events.

mod arrivals;
mod call;
mod commands;
mod coverage;
mod feed;
mod file_time;
pub mod findings;
mod holds;
mod idle;
mod incidents;
mod io_wait;
mod kept;
mod latency;
pub mod limits;
mod options;
mod own_conns;
mod phases;
pub mod resp;
mod roles;
mod samples;
mod stalls;
pub mod stats;
mod world;

use crate::event::{Event, Nanos, Syscall, Tid};
use crate::live::cgroup::CgRaw;
pub use crate::redis_conf::RedisConf;
use crate::report::{self, Report, Stall};
use crate::source::{Clock, Counters, SourceInfo};
pub use crate::threads_file::parse_thread_names;
use arrivals::Arrivals;
use commands::{CmdInputs, CommandCaps, Commands};
use coverage::{Coverage, GapVerdict};
use file_time::FileTime;
use findings::Evidence;
use holds::{DoneCmd, Holds};
use idle::Idle;
use kept::Kept;
use latency::Latency;
pub use options::Options;
use own_conns::OwnConns;
use phases::{AofUse, Phases};
use roles::Role;
use samples::Samples;
use stalls::Stalls;
use world::World;

/// Answered commands kept for stalls found after them.
const DONE_KEEP: usize = 1 << 16;
/// Recent stalls kept for commands answered after them.
const RECENT_STALLS: usize = 64;
/// Stalls kept in detail; past this the shortest are dropped (and counted), so memory stays
/// bounded on traces with hundreds of thousands of stalls.
const MAX_CANDS: usize = 5_000;

/// The caps that bound the analyzer's memory, as parameters so tests can use small ones.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caps {
    pub(crate) stalls: usize,
    pub(crate) done: usize,
    pub(crate) recent_stalls: usize,
    pub(crate) timeline_per_thread: usize,
    pub(crate) commands: CommandCaps,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            stalls: MAX_CANDS,
            done: DONE_KEEP,
            recent_stalls: RECENT_STALLS,
            timeline_per_thread: report::TIMELINE_MAX_PER_THREAD,
            commands: CommandCaps::default(),
        }
    }
}

pub struct Analyzer {
    opts: Options,
    world: World,
    coverage: Coverage,
    latency: Latency,
    idle: Idle,
    samples: Samples,
    stalls: Stalls,
    holds: Holds,
    arrivals: Arrivals,
    file_time: FileTime,
    commands: Commands,
    phases: Phases,
    /// Commands answered by the call being handled (reused: no allocation per event).
    answered: Vec<DoneCmd>,
    own_conns: OwnConns,
}

impl Analyzer {
    pub fn new(opts: Options) -> Self {
        Self::with_caps(opts, Caps::default())
    }

    pub(crate) fn with_caps(mut opts: Options, caps: Caps) -> Self {
        let names = std::mem::take(&mut opts.thread_names);
        let timeline = opts
            .timeline_floor_ns
            .map(|f| (f, caps.timeline_per_thread));
        Analyzer {
            world: World::new(opts.root_pid, names, opts.redis_conf.clone()),
            coverage: Coverage::new(),
            latency: Latency::default(),
            idle: Idle::default(),
            samples: Samples::new(opts.top.max(20), timeline),
            stalls: Stalls::new(opts.threshold_ns, caps.stalls).tracer_stops(opts.stamped_at_stops),
            holds: Holds::new(caps.done, caps.recent_stalls),
            arrivals: Arrivals::new(opts.stamped_at_stops, opts.threshold_ns),
            file_time: FileTime::default(),
            commands: Commands::new(caps.commands),
            phases: Phases::default(),
            answered: Vec::new(),
            own_conns: OwnConns::default(),
            opts,
        }
    }

    /// Live: fd `fd` of the traced process is stallscope's own connection (the `--redis`
    /// poller's, found by its peer address) from `since` on, until it is closed.
    pub fn mark_own_connection(&mut self, fd: i32, since: crate::event::Nanos) {
        self.own_conns.mark(fd, since);
    }

    /// Live: the fd table as /proc/PID/fd showed it at attach.
    pub fn seed_fd(&mut self, pid: Tid, fd: i32, path: &str) {
        self.world.seed_fd(pid, fd, path);
    }

    pub fn set_thread_name(&mut self, tid: Tid, name: &str) {
        self.world.set_name(tid, name);
    }

    /// Live perf backend: events lost to ring-buffer overflow so far.
    pub fn add_lost_events(&mut self, n: u64) {
        self.coverage.add_lost(n);
    }

    /// `watch` metrics: the class of the file behind `fd` of thread `tid` at `ts`, as the
    /// fd table knows it after the events pushed so far.
    pub fn file_class_at(
        &self,
        tid: Tid,
        fd: i32,
        ts: crate::event::Nanos,
    ) -> Option<crate::fdtable::FileClass> {
        self.world.file_class_at(tid, fd, ts)
    }

    /// One call through every unit, in this order. Inlined into `push` and `push_all`
    /// (feed.rs) whatever LLVM's estimate: as a call of its own its register saves and frame
    /// cost ~12 Ir per event.
    #[inline(always)]
    fn on_syscall(&mut self, ev: &Event, sc: &Syscall) {
        let cx = self.world.observe(ev, sc);
        self.coverage.on_call(&cx);
        self.idle.on_call(&cx);
        self.samples.on_call(&cx);
        // Events lost (live perf) may be reads: whether one awaits its reply is not known.
        let lost = self.coverage.lost() > 0;
        let answered = || self.commands.quiet_since().filter(|_| !lost);
        let step = self.stalls.on_call(&cx, &self.phases, lost, answered);
        // Slot by slot: iterating the array (even by reference, flattened) cost ~11 Ir per
        // event, for the one call in thousands that adds a candidate.
        if let Some(a) = step.added[0] {
            self.holds.on_stall(a);
        }
        if let Some(a) = step.added[1] {
            self.holds.on_stall(a);
        }
        self.arrivals.on_call(&cx, step.gap);
        // The latency unit records the duration once for both (`stats::Cells`).
        let tag = self.file_time.on_call(&cx, self.phases.segment());
        self.latency.on_call(&cx, tag);
        let own = self.own_conns.on_call(&cx);
        let inputs = CmdInputs {
            arrivals: &self.arrivals,
            file_time: &self.file_time,
            segment: self.phases.segment(),
            own,
            own_loop: cx.role == Role::IoThread && self.stalls.own_loop(cx.thread),
        };
        let replica = self.commands.on_call(&cx, &inputs, &mut self.answered);
        // Most calls answer nothing: no drain set up for them.
        if !self.answered.is_empty() {
            for d in self.answered.drain(..) {
                self.holds.on_answered(d);
            }
        }
        if let Some(conn) = replica {
            self.world.became_replica(conn);
        }
        self.phases.on_call(&cx, self.world.conf());
        self.world.after(&cx);
    }

    fn gap_verdict(&self, clock: &Clock) -> Option<GapVerdict> {
        let mut v = self.coverage.gap_verdict(
            clock,
            self.opts.threshold_ns,
            self.world.no_event_loop(),
            self.world.untraced_opens(),
            self.world.untraced_children(),
            self.world.thread_count(),
            self.latency.errors(),
        );
        if let Some(GapVerdict::Filtered { kinds, .. }) = &mut v {
            *kinds = self.latency.kinds();
        }
        v
    }

    fn evidence<'a>(&'a self, gaps: Option<&'a GapVerdict>) -> Evidence<'a> {
        Evidence {
            phases: &self.phases,
            file_time: &self.file_time,
            world: &self.world,
            gaps,
            conf: self.opts.redis_conf.as_ref(),
            threshold_us: self.opts.threshold_ns / 1000,
            fault_copy: self.opts.fault_copy_bytes,
            quota: self.opts.cgroup.as_ref().and_then(|c| c.limits.quota()),
            cgroup: self.opts.cgroup.as_ref(),
            cpus: self.opts.cpus.as_ref(),
            stopped_by_tracer: self.opts.stamped_at_stops,
            host_steal: &self.opts.host_steal,
            polls_shared: self.stalls.polls_shared(),
        }
    }

    fn kept<'a>(&'a self, ev: &'a Evidence<'a>, clock: &'a Clock) -> Kept<'a> {
        Kept {
            world: &self.world,
            holds: &self.holds,
            names: self.commands.names(),
            evidence: ev,
            clock,
            first: self.coverage.first().unwrap_or(0),
        }
    }

    /// Stalls found since the last call (live printing). Roles are the current best guess.
    pub fn drain_new_stalls(&mut self, clock: &Clock) -> Vec<Stall> {
        let fresh = self.stalls.take_fresh();
        // Once per drain, with the caller's clock: the same verdict `finish` will reach.
        let gaps = self.gap_verdict(clock);
        let ev = self.evidence(gaps.as_ref());
        self.kept(&ev, clock).rows_at(&self.stalls, &fresh)
    }

    /// Live: the /proc sampler's readings: the cgroup's (for `limits`, when its cgroup is
    /// known) and the host's steal time (ns: a gap neither on a CPU nor waiting for one).
    pub fn host_readings(&mut self, cg: Vec<(Nanos, CgRaw)>, steal: Vec<(Nanos, u64)>) {
        if let Some(c) = &mut self.opts.cgroup {
            c.readings = cg;
        }
        self.opts.host_steal = steal;
    }

    pub fn finish(mut self, info: SourceInfo, counters: Counters) -> Report {
        self.report(info, counters)
    }

    /// `finish` for a process that exits right after: the analyzer's tables are left to the
    /// exit, which frees them at once. Dropping them one by one cost 1.7 ms of a 6M-line
    /// run, at its end, where nothing else runs.
    pub fn finish_at_exit(mut self, info: SourceInfo, counters: Counters) -> Report {
        let r = self.report(info, counters);
        std::mem::forget(self);
        r
    }

    /// The report; what the stall rows take is moved out of the analyzer, which is spent.
    fn report(&mut self, info: SourceInfo, counters: Counters) -> Report {
        self.latency.fold(&mut self.file_time);
        self.world.finish();
        let unanswered = self.commands.unanswered(self.coverage.last());
        self.holds.unanswered(&unanswered);
        let first = self.coverage.first().unwrap_or(0);
        let mut clock = info.clock.clone();
        if clock.first == 0 {
            clock.first = first;
        }
        let mut r = Report {
            schema: report::SCHEMA,
            source: self.source_block(&info, &clock),
            summary: self.summary(&counters, &clock),
            skipped: coverage::skipped(&counters, &info),
            syscalls: self.latency.syscalls(),
            fds: self.latency.fds(&self.world),
            slowest: self
                .samples
                .slowest(&self.world, &clock, first, self.opts.top),
            timeline: self.samples.timeline(&self.world, first),
            threads: self.world.threads_report(),
            phases: self.phases.report(&clock, first, self.aof_use()),
            phase_stats: phases::phase_stats(&self.phases, &self.file_time, &self.commands),
            commands: self
                .commands
                .report(self.phases.longest(self.coverage.last())),
            idle: self.idle.report(&self.world),
            live: report::LiveContext {
                cpus: self.opts.cpus.clone(),
                ..Default::default()
            },
            ..Default::default()
        };
        // Without timestamps or -T no call is known to be slow: each "slowest" call would
        // claim an upper bound of 0, which no call meets.
        if self.coverage.measures_nothing(&clock) {
            r.slowest.clear();
        }
        let gaps = self.gap_verdict(&info.clock);
        // Under a clock coarser than the threshold nothing that spans two calls is timed.
        let coarse = matches!(gaps, Some(GapVerdict::CoarseClock { .. }));
        if coarse {
            coverage::without_command_times(&mut r);
        }
        self.stalls_into(&mut r, &clock, gaps.as_ref());
        if coarse {
            coverage::without_waits(&mut r);
        }
        r
    }

    /// Stalls, calls cut by the edges, incidents and findings.
    fn stalls_into(&mut self, r: &mut Report, clock: &Clock, gaps: Option<&GapVerdict>) {
        let held = self.holds.take_all();
        let ev = self.evidence(gaps);
        let kept = self.kept(&ev, clock);
        // Without timestamps or -T every duration is a guess at 0: no stall can be shown.
        let rows = if self.coverage.measures_nothing(clock) {
            kept::Rows::default()
        } else {
            kept.all(&self.stalls, held)
        };
        r.in_flight = kept.in_flight(&self.stalls);
        let (waits_no_more, parked) = kept.parked(&self.stalls);
        r.in_flight.extend(waits_no_more);
        r.parked_at_end = parked;
        let dropped = self.stalls.dropped();
        r.summary.stalls = rows.stalls.len() as u64 + dropped;
        r.summary.stalls_not_listed = dropped;
        // Under a coarse clock stalls that start in the same tick would all overlap.
        let merge = !gaps.is_some_and(|v| v.coarse());
        r.incidents = incidents::incidents(&rows, clock, kept.first, merge);
        let kept::Rows { held, stalls, .. } = rows;
        r.stalls = stalls;
        r.findings = findings::findings(&ev, &held, &r.commands, &r.stalls, self.commands.names());
        incidents::name_findings(&mut r.incidents, &r.stalls);
    }

    fn source_block(&self, info: &SourceInfo, clock: &Clock) -> report::Source {
        report::Source {
            kind: info.kind,
            files: info.files.clone(),
            format: info.format.clone(),
            pid: info.pid.or(self.world.root_pid()),
            clock: clock.describe(),
            backend: None,
        }
    }

    fn summary(&self, counters: &Counters, clock: &Clock) -> report::Summary {
        report::Summary {
            threads: self.world.thread_count() as u64,
            processes: self.world.process_count() as u64,
            silent_threads: self.world.silent_threads(),
            other_programs: self.world.other_programs(),
            threshold_us: self.opts.threshold_ns / 1000,
            top: self.opts.top,
            ..self.coverage.summary(counters, clock)
        }
    }

    fn aof_use(&self) -> AofUse {
        AofUse {
            seen: self.world.aof_seen(),
            conf: self.opts.redis_conf.as_ref().and_then(|c| c.appendonly),
        }
    }
}

/// The whole-stage contract: small synthetic traces through `push` and `finish`.
#[cfg(test)]
#[path = "tests/scenarios.rs"]
mod scenarios;
