//! App layer: `stallscope attach`. Turns the command line into a live session (`session`),
//! consumes it with one analyzer and, with `--record`, a recording, prints each stall on
//! stderr as it ends, and renders the full report when tracing ends.

use crate::analyze::Analyzer;
use crate::cli::AttachArgs;
use crate::event::{Event, Nanos, SchedSpan, Tid};
use crate::evidence::LiveRedis;
use crate::live::{host, procctx};
use crate::live::{BackendChoice, TracerConfig};
use crate::recording::{FileStore, RecordingStart, RecordingWriter};
use crate::report::{Report, SourceKind};
use crate::session::{self, Enrichment, LiveSession, Sink, Threads, Tick};
use crate::source::{Counters, SourceInfo};
use anyhow::Result;
use std::io::Write;
use std::time::{Duration, Instant};

/// `stallscope attach`: trace a running process, print stalls as they are found, and the
/// full report when tracing ends. Returns the number of stalls (for the exit status).
pub fn run(args: &AttachArgs) -> Result<u64> {
    let pid = resolve_pid(args)?;
    let opts = crate::run::options(&args.out)?;
    let user_conf = match &args.out.redis_conf {
        Some(f) => std::fs::read_to_string(f).ok(),
        None => None,
    };
    crate::signals::install_stop_handlers();
    // Found before the attach: once traced, the one-off `CONFIG GET logfile` connection's
    // command would count as a client's.
    let asked_log = args.redis.as_deref().and_then(|addr| {
        crate::evidence::log_source_before_attach(
            pid,
            args.out.redis_log.as_deref(),
            Some(addr),
            opts.redis_conf.as_ref(),
        )
    });
    let mut s = LiveSession::start(&tracer_config(pid, args), &opts, user_conf)?;
    // The analysis may lag; redis and the tracer thread that resumes it must not. On a
    // small machine the analyzer would otherwise take CPU from them (nice is per thread).
    // SAFETY: setpriority of this thread only.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10) };
    let mut sink = AttachSink::new(&s, args)?;
    let interval = Duration::from_millis(100);
    let sampler = host::Sampler::start(pid, interval, host::Keep::All);
    let redis_side = LiveRedis::start(
        args.out.redis_log.as_deref(),
        args.redis.as_deref(),
        &s.ctx,
        s.opts.redis_conf.as_ref(),
        asked_log,
        args.record.is_some(),
    );
    say_attached(&s, args);
    sink.redis = Some(&redis_side);
    let (mut report, first_ts, record_err) = trace(&mut s, sink, args, Some(&sampler))?;
    let cgroup = sampler.cgroup().cloned();
    let raw = sampler.finish();
    add_host(
        &mut report,
        host::samples(&raw, s.clock.first),
        interval,
        first_ts,
        s.clock.first,
    );
    if let Some(cg) = &cgroup {
        let origin = first_ts.unwrap_or(s.clock.first);
        host::add_cgroup(&mut report, cg, cg.limits(), &raw, origin);
    }
    let log_text = redis_side.finish(&mut report)?;
    if let Some(path) = &args.record {
        let written = match record_err {
            Some(e) => Err(e),
            None => crate::recording::write_log(path, log_text.as_deref()),
        };
        written.map_err(|e| anyhow::anyhow!("--record {path}: cannot write it: {e}"))?;
    }
    crate::run::emit(&report, &args.out)?;
    Ok(report.summary.stalls)
}

/// Runs the session into `sink` to its end and makes the report: the analysis of what was
/// traced, enriched as a live report is. Also the smallest syscall start (the report's
/// origin) and the first error met while recording.
pub(crate) fn trace(
    s: &mut LiveSession,
    mut sink: AttachSink,
    args: &AttachArgs,
    sampler: Option<&host::Sampler>,
) -> Result<(Report, Option<Nanos>, Option<std::io::Error>)> {
    s.run(&mut sink)?;
    let stats = s.end();
    if let Some(sm) = sampler {
        LiveSession::cgroup_readings(&mut sink.an, sm);
    }
    eprintln!(
        "stallscope: traced {} syscalls ({} of the main thread {}); {} lost",
        stats.syscalls, stats.main_syscalls, s.pid, stats.lost_events
    );
    let container = s.container_now(&stats);
    let record_err = sink.finish_recording(s, container.as_ref());
    let mut report = sink.an.finish(source_info(s, args), Counters::default());
    session::enrich(
        &mut report,
        &Enrichment {
            backend: s.backend,
            caps: s.caps,
            stats: Some(&stats),
            watch: None,
            container,
        },
    );
    Ok((report, sink.first_ts, record_err))
}

fn tracer_config(pid: Tid, args: &AttachArgs) -> TracerConfig {
    TracerConfig {
        pid,
        backend: BackendChoice::from(args.backend),
        follow_forks: !args.no_follow_forks,
        pages: args.perf_pages,
        auto_may_stop: true,
    }
}

fn resolve_pid(args: &AttachArgs) -> Result<Tid> {
    if let Some(p) = args.pid {
        return Ok(p);
    }
    let name = args.name.as_deref().unwrap_or("redis-server");
    let found = crate::live::find_by_name(name);
    match found.len() {
        0 => anyhow::bail!("--name {name}: no running process has that name"),
        1 => Ok(found[0].0),
        _ => anyhow::bail!(
            "--name {name}: {} processes match; attach traces one: choose it with --pid PID \
             (`stallscope watch --name {name}` watches them all):\n{}",
            found.len(),
            crate::watch::fleet::list_matches(&found)
        ),
    }
}

fn say_attached(s: &LiveSession, args: &AttachArgs) {
    use crate::units::{human, plural};
    eprintln!(
        "stallscope: attached to {} ({} thread{}) with {}; stalls over {} are printed as they end; Ctrl-C to stop{}",
        s.pid,
        s.threads_at_attach,
        plural(s.threads_at_attach as u64),
        s.backend,
        human(args.out.threshold / 1000),
        match args.duration {
            Some(d) => format!(" (or after {})", human(d / 1000)),
            None => String::new(),
        }
    );
}

fn source_info(s: &LiveSession, args: &AttachArgs) -> SourceInfo {
    SourceInfo {
        kind: SourceKind::Live,
        files: vec![],
        format: format!(
            "stallscope attach ({}{})",
            s.backend,
            if args.no_follow_forks {
                ""
            } else {
                ", following forks"
            }
        ),
        pid: Some(s.pid),
        clock: s.clock.clone(),
    }
}

/// The /proc samples over the trace: stamped from the attach, while the report's axis
/// starts at its first call.
fn add_host(
    report: &mut Report,
    samples: Vec<crate::report::HostSample>,
    interval: Duration,
    first_ts: Option<Nanos>,
    attach_mono: Nanos,
) {
    let shift = (first_ts.unwrap_or(attach_mono) - attach_mono) / 1000;
    let samples = samples
        .into_iter()
        .map(|mut s| {
            s.at_us -= shift;
            s
        })
        .collect();
    procctx::attach_host_context(report, samples, interval);
}

/// `attach`'s consumer: one analyzer, the recording, the stall lines on stderr.
pub(crate) struct AttachSink<'a> {
    pub an: Analyzer,
    rec: Option<RecordingWriter<FileStore>>,
    record_err: Option<std::io::Error>,
    /// The poller and log follower of `--redis`, whose connections are ours.
    pub redis: Option<&'a LiveRedis>,
    /// The smallest syscall start seen: the origin of the report's axis.
    pub first_ts: Option<Nanos>,
    deadline: Option<Instant>,
    last_drain: Instant,
    clock: crate::source::Clock,
    #[allow(clippy::vec_box)]
    spent: Vec<Box<SchedSpan>>,
    /// Stall lines go here as they are found (stderr; a test's buffer).
    pub out: Box<dyn Write>,
}

impl AttachSink<'_> {
    pub(crate) fn new(s: &LiveSession, args: &AttachArgs) -> Result<Self> {
        let rec = match &args.record {
            Some(path) => Some(start_recording(s, path, args.out.threshold)?),
            None => None,
        };
        Ok(AttachSink {
            an: s.analyzer(&[]),
            rec,
            record_err: None,
            redis: None,
            first_ts: None,
            deadline: args
                .duration
                .map(|d| Instant::now() + Duration::from_nanos(d as u64)),
            last_drain: Instant::now(),
            clock: s.clock.clone(),
            spent: vec![],
            out: Box::new(std::io::stderr()),
        })
    }

    /// Ends the recording with its sidecars; the first error met while recording, if any.
    pub(crate) fn finish_recording(
        &mut self,
        s: &LiveSession,
        container: Option<&crate::report::Container>,
    ) -> Option<std::io::Error> {
        let rec = self.rec.take()?;
        if let Some(e) = self.record_err.take() {
            return Some(e);
        }
        rec.finish(&s.threads.names, s.conf_text.as_deref(), container)
            .err()
    }

    fn drain(&mut self) {
        if let Some(r) = self.redis {
            for (fd, since) in r.take_own_conns() {
                self.an.mark_own_connection(fd, since);
            }
        }
        for s in self.an.drain_new_stalls(&self.clock) {
            let _ = writeln!(self.out, "stall: {}", crate::render::table::stall_line(&s));
        }
    }
}

/// `--record PATH`: the trace as the events come, and the scheduler's split (of calls and
/// gaps of a tenth of the threshold or more) and the arrivals where the backend has them.
pub(crate) fn start_recording(
    s: &LiveSession,
    path: &str,
    threshold: Nanos,
) -> Result<RecordingWriter<FileStore>> {
    let st = s.tracer.stats();
    RecordingWriter::start(
        FileStore::in_place(path),
        &RecordingStart {
            pid: s.pid,
            first: st.attach_mono,
            wall_at_first: st.attach_wall,
            cwd: s.ctx.cwd.clone(),
            fds: &s.ctx.fds,
            sched_floor: s.caps.splits_sched.then_some(threshold / 10),
            arrivals: s.caps.dates_arrivals == Some(true),
            stops_tracee: s.caps.stops_tracee,
        },
    )
    .map_err(|e| anyhow::anyhow!("--record {path}: cannot create it: {e}"))
}

impl Sink for AttachSink<'_> {
    fn lost(&mut self, n: u64) {
        self.an.add_lost_events(n);
        if let Some(r) = self.rec.as_mut() {
            r.note_lost(n);
        }
    }

    fn new_thread(&mut self, tid: Tid, name: &str) {
        self.an.set_thread_name(tid, name);
    }

    fn event(&mut self, ev: &mut Event, _threads: &Threads) {
        if ev.syscall().is_some() {
            self.first_ts = Some(self.first_ts.map_or(ev.ts, |f| f.min(ev.ts)));
        }
        if !session::is_detach(ev) {
            self.an.push(ev);
        }
        if let (Some(r), None) = (self.rec.as_mut(), &self.record_err) {
            if let Err(e) = r.write_event(ev) {
                self.record_err = Some(e);
            }
        }
    }

    fn tick(&mut self, t: &mut Tick, _threads: &mut Threads) {
        let due = t
            .look
            .is_some_and(|now| now.duration_since(self.last_drain) >= Duration::from_millis(200));
        if t.done || !t.got_event || due {
            self.last_drain = Instant::now();
            self.drain();
        }
    }

    fn want_stop(&mut self, look: bool) -> bool {
        crate::signals::stop_requested()
            || (look && self.deadline.is_some_and(|d| Instant::now() >= d))
            || self.record_err.is_some()
    }

    fn spent(&mut self) -> &mut Vec<Box<SchedSpan>> {
        &mut self.spent
    }
}
