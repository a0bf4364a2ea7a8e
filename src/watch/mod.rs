//! `stallscope watch`: stays attached to a redis for days. The live tracer's events (the
//! same `Event`s `attach` reads) go three ways: into a live `Analyzer` that finds stalls as
//! they end (each one counted in the metrics, printed, written as a JSON line to
//! `--events`, and grouped into incidents), into the metrics' per-syscall histograms, and
//! into a byte-bounded history ring (`ring`) from which each incident's report is made by a
//! fresh `Analyzer` on the writer thread (`incident`). Memory stays bounded over days: the
//! live analyzer accumulates per-phase and per-file state, so it is replaced every
//! `WINDOW` by a new one that ran beside it for `OVERLAP` (stalls ending before the switch
//! are the old one's, after it the new one's), and everything else is bounded by count
//! (label sets, rate limit) or bytes (ring).

pub(crate) mod follow;
pub(crate) mod host;
pub(crate) mod incident;
pub(crate) mod metrics;
pub(crate) mod redis;
pub(crate) mod ring;

use crate::analyze::{Analyzer, Options, RedisConf};
use crate::cli::{AttachArgs, Backend, WatchArgs};
use crate::event::{Nanos, Tid};
use crate::live::{self, now_mono, procctx, Tracer};
use crate::report::{LiveBackend, Stall};
use crate::source::{Clock, TimeFmt};
use anyhow::{Context, Result};
use incident::{Grouper, Job, Outcome, RateLimit};
use metrics::{Metrics, Observer, StallLabels};
use ring::Ring;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long one live analyzer runs before it is replaced (its per-phase, per-file and
/// per-thread state is what would otherwise grow over days).
const WINDOW: Duration = Duration::from_secs(600);
/// How long the next analyzer runs beside the old one before it takes over: a gap or a
/// call that began before its start would otherwise be missed by both.
const OVERLAP_NS: Nanos = 30_000_000_000;
/// The ring keeps this much beyond --before: a stall is known only when it ends, and its
/// incident starts --before ahead of its start.
const LONG_STALL_NS: Nanos = 10_000_000_000;
/// Reports given to the writer at once: the one being written and one queued. With the
/// one waiting in the ring, at most three incidents' events exist besides the ring's.
const MAX_JOBS_OUT: usize = 2;
/// The writer runs this much nicer than the watch loop: the report can wait a little, but
/// at the old absolute nice 15 a loaded host gave it so little CPU (weight 36 against
/// 1024 for each nice-0 build) that a report of a full ring took tens of seconds while
/// incidents queued behind it and the ring dropped their stalls.
const WRITER_NICER_BY: libc::c_int = 2;
/// How long a restarted process is looked for between tries.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_stop_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// `--events`: where stall lines go.
enum EventLog {
    Stdout,
    File(std::fs::File, String),
}

impl EventLog {
    fn open(spec: &str) -> Result<EventLog> {
        if spec == "-" {
            return Ok(EventLog::Stdout);
        }
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o640)
            .open(spec)
            .with_context(|| format!("--events {spec}: cannot open it for appending"))?;
        Ok(EventLog::File(f, spec.to_string()))
    }

    fn write_line(&mut self, line: &str) -> std::io::Result<()> {
        match self {
            EventLog::Stdout => {
                let mut o = std::io::stdout().lock();
                o.write_all(line.as_bytes())?;
                o.write_all(b"\n")?;
                o.flush()
            }
            // One write per line: lines of concurrent writers (or a log shipper reading
            // mid-write) are never interleaved.
            EventLog::File(f, _) => f.write_all(format!("{line}\n").as_bytes()),
        }
    }
}

/// One stall as a log line for shippers: ISO 8601 time, who, what, how long, why, and the
/// names (never the keys) of the commands it held up.
pub(crate) fn event_line(s: &Stall) -> String {
    serde_json::json!({
        "time": s.ts_iso,
        "pid": s.pid,
        "tid": s.tid,
        "thread": s.thread,
        "kind": s.kind,
        "syscall": s.syscall,
        "file_class": s.class,
        "path": s.path,
        "duration_s": s.duration_us as f64 / 1e6,
        "bound": s.bound,
        "finding": s.finding,
        "cause": s.cause,
        "commands": s.waiting_by_command,
        "waiting_clients": s.waiting_clients,
        "events_lost": s.events_lost,
    })
    .to_string()
}

fn stall_labels(s: &Stall) -> StallLabels {
    StallLabels {
        role: s.thread.to_string(),
        kind: match s.kind {
            crate::report::StallKind::SlowSyscall => "slow_syscall".into(),
            crate::report::StallKind::Gap => "gap".into(),
        },
        file_class: s.class.map_or("none", |c| c.as_str()).to_string(),
        finding: s
            .finding
            .map_or_else(|| "none".to_string(), |f| f.as_str().to_string()),
    }
}

/// A live analyzer and what is needed to place its stalls in time.
struct Window {
    an: Analyzer,
    /// The smallest syscall start it was given: the origin of its stalls' `at_us`.
    first_ts: Option<Nanos>,
    born: Instant,
}

impl Window {
    fn new(
        opts: &Options,
        pid: Tid,
        ctx: &procctx::ProcContext,
        names: &HashMap<Tid, String>,
        own: &[(i32, Nanos)],
    ) -> Window {
        let mut an = Analyzer::new(opts.clone());
        for (fd, what) in &ctx.fds {
            an.seed_fd(pid, *fd, what);
        }
        for (fd, since) in own {
            an.mark_own_connection(*fd, *since);
        }
        for (t, n) in names {
            an.set_thread_name(*t, n);
        }
        Window {
            an,
            first_ts: None,
            born: Instant::now(),
        }
    }

    fn push(&mut self, ev: &crate::event::Event) {
        if ev.syscall().is_some() {
            self.first_ts = Some(self.first_ts.map_or(ev.ts, |f| f.min(ev.ts)));
        }
        self.an.push(ev);
    }

    /// New stalls with their start and end on the tracer clock.
    fn drain(&mut self, clock: &Clock) -> Vec<(Stall, Nanos, Nanos)> {
        let first = self.first_ts.unwrap_or(clock.first);
        self.an
            .drain_new_stalls(clock)
            .into_iter()
            .map(|s| {
                let start = first + s.at_us * 1000;
                let end = start + s.duration_us * 1000;
                (s, start, end)
            })
            .collect()
    }
}

/// An `AttachArgs` for the live module's backend choice, built through clap so that flags
/// added to `attach` later (a new backend's options) take their defaults here.
fn attach_args(pid: Tid, args: &WatchArgs) -> Result<AttachArgs> {
    use clap::{Args, FromArgMatches, ValueEnum};
    let backend = args
        .backend
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_else(|| "auto".into());
    let mut argv = vec![
        "watch".to_string(),
        "--pid".into(),
        pid.to_string(),
        "--backend".into(),
        backend,
    ];
    if args.no_follow_forks {
        argv.push("--no-follow-forks".into());
    }
    if let Some(p) = args.perf_pages {
        argv.push("--perf-pages".into());
        argv.push(p.to_string());
    }
    let m = AttachArgs::augment_args(clap::Command::new("watch"))
        .try_get_matches_from(argv)
        .map_err(|e| anyhow::anyhow!("internal: attach options: {e}"))?;
    AttachArgs::from_arg_matches(&m).map_err(|e| anyhow::anyhow!("internal: attach options: {e}"))
}

/// Starts the tracer. `auto` must never end up on ptrace: a watcher runs for days, and
/// ptrace would slow redis that whole time.
fn start(pid: Tid, args: &WatchArgs) -> Result<(Box<dyn Tracer>, LiveBackend, u32)> {
    if args.backend == Backend::Auto {
        // `live::start_tracer`'s auto tries bpf, then perf, then ptrace. bpf needs what perf
        // needs (tracefs and root or CAP_PERFMON) and more, so when perf cannot be used
        // neither can bpf, and auto would end on ptrace: refuse before touching redis.
        if let Err(why) = live::perf::available() {
            anyhow::bail!(
                "--backend auto: no backend that leaves redis running at full speed can be used: {why}; \
                 --backend ptrace works everywhere but stops redis at every syscall"
            );
        }
    }
    if args.backend == Backend::Ptrace {
        eprintln!(
            "stallscope: warning: --backend ptrace stops every redis thread twice per syscall: a busy redis \
             runs at a fraction of its throughput (about 0.07x under redis-benchmark -t set -c 50) for as \
             long as the watch lasts; use it for short watches only"
        );
    }
    let aargs = attach_args(pid, args)?;
    let (mut t, backend, n) = live::start_tracer(pid, &aargs)?;
    if args.backend == Backend::Auto && backend == LiveBackend::Ptrace {
        t.stop();
        while !t.is_done() {
            if t.next_event_timeout(Duration::from_millis(50)).is_err() {
                break;
            }
        }
        anyhow::bail!(
            "--backend auto: the cheap backends could not attach to process {pid} (see above); \
             refusing to watch with ptrace unless asked (--backend ptrace)"
        );
    }
    Ok((t, backend, n))
}

/// The process to watch now: `--pid`, or the one process named `--name` (None: none yet).
fn find_target(args: &WatchArgs) -> Result<Option<Tid>, String> {
    if let Some(p) = args.pid {
        return Ok(Some(p));
    }
    let name = args.name.as_deref().unwrap_or("redis-server");
    // A process that has exited but is not yet reaped keeps its name: not a candidate.
    let found: Vec<(Tid, String)> = live::find_by_name(name)
        .into_iter()
        .filter(|(p, _)| live::check_target(*p).is_ok())
        .collect();
    match found.len() {
        0 => Ok(None),
        1 => Ok(Some(found[0].0)),
        _ => {
            let list: Vec<String> = found.iter().map(|(p, c)| format!("  {p}  {c}")).collect();
            Err(format!(
                "--name {name}: {} processes match; choose one with --pid:\n{}",
                found.len(),
                list.join("\n")
            ))
        }
    }
}

/// State that lives across attachments.
struct Watcher<'a> {
    args: &'a WatchArgs,
    opts: Options,
    /// `--redis-conf`'s text, kept beside recordings.
    user_conf: Option<String>,
    metrics: Metrics,
    observer: Observer,
    ring: Ring,
    grouper: Grouper,
    limit: RateLimit,
    events: Option<EventLog>,
    event_err_said: bool,
    jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
    ring_evicted_seen: u64,
    deadline: Option<Instant>,
    /// Where the last incident report's events ended: the next one starts after it, so
    /// that no stall is in two reports.
    reported_upto: Option<Nanos>,
    /// The finished incident waiting (in the ring) for the writer (`hand_over`).
    pending: Option<Pending>,
    /// Jobs given to the writer and not yet written (0: it is idle).
    jobs_out: std::sync::Arc<AtomicUsize>,
    /// What the process attached last listened on and its pidfile: how `--pid` finds it
    /// again after a restart.
    identity: Option<follow::Identity>,
}

impl Watcher<'_> {
    /// A signal asked to stop, or (when `clock`: the clock may be read) `--duration` is up.
    fn want_stop(&self, clock: bool) -> bool {
        STOP.load(Ordering::SeqCst) || (clock && self.deadline.is_some_and(|d| Instant::now() >= d))
    }

    fn on_stall(&mut self, s: &Stall, start: Nanos, end: Nanos) {
        self.metrics.stalls.get_or_create(&stall_labels(s)).inc();
        eprintln!("stall: {}", crate::render::table::stall_line(s));
        if let Some(log) = &mut self.events {
            if let Err(e) = log.write_line(&event_line(s)) {
                self.metrics.event_log_errors.inc();
                if !self.event_err_said {
                    let what = match log {
                        EventLog::Stdout => "-".to_string(),
                        EventLog::File(_, p) => p.clone(),
                    };
                    eprintln!("stallscope: warning: --events {what}: cannot write: {e} (counted in stallscope_event_log_errors_total; watching goes on)");
                    self.event_err_said = true;
                }
            } else {
                self.event_err_said = false;
            }
        }
        self.grouper.add(s, start, end);
        self.ring.hold(start - self.args.before);
    }

    /// A finished incident: it waits in the ring (`pending`) until the writer is free, or
    /// is counted as not written (rate limit). One that finishes while another still waits
    /// joins it: the ring holds both anyway, and one report for the two keeps every stall
    /// in a report without a second copy of the events.
    fn incident_due(&mut self, o: incident::Open) {
        if self.args.out.is_none() || o.stalls.is_empty() {
            self.release_ring();
            return;
        }
        let cut = self.ring.next_seq();
        if let Some(p) = &mut self.pending {
            p.open.absorb(o);
            p.cut = cut;
            p.joined += 1;
            self.reported_upto = self.ring.newest();
            return;
        }
        if !self.limit.allow(Instant::now()) {
            self.metrics.incidents_suppressed.inc();
            self.unreported(metrics::RATE_LIMIT, o.count);
            let first = &o.stalls[0];
            eprintln!(
                "stallscope: incident at {} not written: {} already written in the last hour (--max-incidents-per-hour); counted in stallscope_incidents_suppressed_total",
                first.ts_iso.as_deref().unwrap_or(&first.ts),
                self.args.max_incidents_per_hour
            );
            self.release_ring();
            return;
        }
        let from = match self.reported_upto {
            // Its first stall began inside the previous report (a gap it could not see the
            // end of): this one starts at that stall, from the marks the ring kept of each
            // thread's last call (`Ring::take_upto`).
            Some(t) if o.start <= t => o.start,
            upto => (o.start - self.args.before).max(upto.map_or(Nanos::MIN, |t| t + 1)),
        };
        self.reported_upto = self.ring.newest();
        self.pending = Some(Pending {
            open: o,
            from,
            cut,
            joined: 0,
        });
    }

    /// Lets the ring go of what no incident wants: only the one being recorded, if any.
    fn release_ring(&mut self) {
        self.ring.release();
        if let Some(o) = &self.grouper.open {
            self.ring.hold(o.start - self.args.before);
        }
    }

    /// Gives the waiting incident to the writer once it is idle (`force`: at detach, even
    /// if it is busy; the job then waits in the channel). The writer takes one job at a
    /// time and the next waits in the ring, so the ring and one incident's events are
    /// held, not more: a writer starved by a loaded host (reports take seconds at nice 15)
    /// cannot pile up copies of the ring. Unless the ring, full, has begun to drop what
    /// came just before the waiting incident's first stall: its events then go to wait in
    /// the channel (two incidents outside the ring at most), or its stalls would be in no
    /// report (what most likely left 4 of 26 injected stalls of the 30-minute soak at load
    /// 13 in no report, before this).
    fn hand_over(&mut self, ctx: &AttachCtx, clock: &Clock, force: bool) {
        let Some(p) = &self.pending else { return };
        let out = self.jobs_out.load(Ordering::SeqCst);
        let at_risk = self
            .ring
            .evicted_upto()
            .is_some_and(|t| t > p.open.start - incident::KEEP_BEFORE_FIRST_NS);
        if !(force || out == 0 || (at_risk && out < MAX_JOBS_OUT)) {
            // The writer's queue is full. The incident waits in the ring while the ring
            // still holds its first stall; once the ring, full, drops that too, a report
            // would not show what it is named by: it is not written, and its stalls are
            // counted as in no report (never silently missing).
            if self.ring.evicted_upto().is_some_and(|t| t >= p.open.start) {
                let Some(p) = self.pending.take() else { return };
                self.metrics.incidents_suppressed.inc_by(1 + p.joined);
                self.limit.suppressed += 1 + p.joined;
                self.unreported(metrics::WRITER_BUSY, p.open.count);
                let first = &p.open.stalls[0];
                eprintln!(
                    "stallscope: incident at {} not written: the writer still had {out} reports to write when the history ring (--ring-size) dropped its first stall; its {} stall{} are counted in stallscope_stalls_not_reported_total{{reason=\"writer_busy\"}}",
                    first.ts_iso.as_deref().unwrap_or(&first.ts),
                    p.open.count,
                    crate::analyze::findings::plural(p.open.count),
                );
                self.release_ring();
            }
            return;
        }
        let Some(p) = self.pending.take() else { return };
        self.release_ring();
        let Some(dir) = &self.args.out else { return };
        let (Some(first), Some(worst)) = (p.open.stalls.first().cloned(), p.open.worst().cloned())
        else {
            return;
        };
        let from = p.from;
        let taken = self.ring.take_upto(from, p.cut);
        let events = taken.events;
        let host = match (&ctx.host, events.front(), events.back()) {
            (Some(h), Some(a), Some(b)) => h.window(a.ts, b.end()),
            _ => vec![],
        };
        let ring_short = events.front().is_some_and(|e| e.ts > from + 100_000_000)
            && self.ring.evicted_early > 0;
        let job = Job {
            events,
            lost: taken.lost,
            pid: ctx.pid,
            opts: self.opts.clone(),
            fds: ctx.ctx.fds.clone(),
            thread_names: ctx.names.iter().map(|(t, n)| (*t, n.clone())).collect(),
            cwd: ctx.ctx.cwd.clone(),
            conf_text: ctx.conf_text.clone(),
            clock: clock.clone(),
            backend: ctx.backend,
            splits_sched: ctx.splits_sched,
            command_start: ctx.command_start,
            follow_forks: !self.args.no_follow_forks,
            first,
            worst,
            count: p.open.count,
            joined: p.joined,
            suppressed: std::mem::take(&mut self.limit.suppressed),
            ring_short,
            host,
            redis: ctx.redis.as_ref().and_then(|r| r.for_incident(from)),
            own_conns: ctx.own.clone(),
            dir: dir.clone(),
            record: self.args.record,
        };
        if let Some(tx) = &self.jobs {
            self.jobs_out.fetch_add(1, Ordering::SeqCst);
            if let Err(std::sync::mpsc::TrySendError::Full(job)) = tx.try_send(job) {
                self.jobs_out.fetch_sub(1, Ordering::SeqCst);
                self.metrics.incidents_suppressed.inc();
                self.unreported(metrics::WRITER_BUSY, job.count);
                self.limit.suppressed += job.suppressed + 1;
                eprintln!("stallscope: incident not written: the previous one is still being written (counted in stallscope_incidents_suppressed_total)");
            }
        }
    }

    fn unreported(&self, reason: &'static str, stalls: u64) {
        self.metrics
            .unreported
            .get_or_create(&metrics::UnreportedLabels { reason })
            .inc_by(stalls);
    }

    /// At detach: lets the writer finish its report before the last one is given (not
    /// long when stopping: SIGTERM must end the watcher within 2 s).
    fn wait_writer_idle(&self, limit: Duration) {
        let t = Instant::now();
        while self.pending.is_some()
            && self.jobs_out.load(Ordering::SeqCst) > 0
            && t.elapsed() < limit
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn tick_metrics(&mut self) {
        self.observer.publish();
        let ev = self.ring.evicted_early;
        if ev > self.ring_evicted_seen {
            self.metrics
                .ring_evicted
                .inc_by(ev - self.ring_evicted_seen);
            self.ring_evicted_seen = ev;
        }
        self.metrics.ring_bytes.set(self.ring.bytes() as i64);
    }
}

/// When the watch loop looks for new stalls and finished incidents: every 200 ms, and
/// after every eighth of what the ring can hold. A watcher catching up on a backlog (it
/// was descheduled on a loaded host while the kernel buffered redis's calls) pushes events
/// much faster than they happened: by wall time alone, a whole ring could pass between two
/// looks, evicting a stall before its incident was opened and held.
struct DrainClock {
    last: Instant,
    since: usize,
    every: usize,
}

impl DrainClock {
    const PERIOD: Duration = Duration::from_millis(200);

    fn new(ring_bytes: usize, now: Instant) -> DrainClock {
        DrainClock {
            last: now,
            since: 0,
            every: (ring_bytes / std::mem::size_of::<crate::event::Event>() / 8).max(64),
        }
    }

    /// One turn of the loop (`event`: it brought one), at `now` when the loop read the
    /// clock (it reads it now and then, not at every event): true when it is time.
    fn due(&mut self, event: bool, now: Option<Instant>) -> bool {
        self.since += event as usize;
        if self.since >= self.every {
            self.last = now.unwrap_or_else(Instant::now);
            self.since = 0;
            return true;
        }
        if let Some(now) = now.filter(|n| n.duration_since(self.last) >= Self::PERIOD) {
            self.last = now;
            self.since = 0;
            return true;
        }
        false
    }
}

/// A finished incident whose events are still in the ring, up to sequence number `cut`.
struct Pending {
    open: incident::Open,
    /// Its report's events end at or after this.
    from: Nanos,
    cut: u64,
    /// Incidents that finished while it waited, and joined it.
    joined: u64,
}

/// What belongs to one attachment.
struct AttachCtx {
    pid: Tid,
    /// The redis config the analysis uses (`--redis-conf`, or from /proc), as text.
    conf_text: Option<String>,
    backend: LiveBackend,
    /// The tracer splits calls by the scheduler (`Tracer::splits_sched`).
    splits_sched: bool,
    /// Where per-command latency starts (`Tracer::dates_arrivals`).
    command_start: Option<crate::report::CommandStart>,
    ctx: procctx::ProcContext,
    names: HashMap<Tid, String>,
    /// /proc readings of the last minute or so, for the incidents' host sections.
    host: Option<host::HostRing>,
    /// redis's log and the --redis poller.
    redis: Option<redis::WatchRedis>,
    /// The traced redis's fds of the poller's connections (the last few), with when each
    /// became the poller's: marked in every analyzer (`Analyzer::mark_own_connection`).
    own: Vec<(i32, Nanos)>,
}

/// `stallscope watch`. Returns 0 (for the exit status) when stopped by a signal or
/// `--duration`; errors are setup errors (bad flags, no process, no backend).
pub fn run_watch(args: &WatchArgs) -> Result<u64> {
    let mut opts = Options {
        threshold_ns: args.threshold,
        ..Default::default()
    };
    let mut user_conf = None;
    if let Some(f) = &args.redis_conf {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("--redis-conf {f}: cannot read it"))?;
        opts.redis_conf = Some(RedisConf::parse(&text));
        user_conf = Some(text);
    }
    let follow = args.pid.is_none();
    let first_pid = match find_target(args) {
        Ok(Some(p)) => p,
        Ok(None) => anyhow::bail!(
            "--name {}: no running process has that name",
            args.name.as_deref().unwrap_or("redis-server")
        ),
        Err(e) => anyhow::bail!(e),
    };
    let metrics = Metrics::new();
    if let Some(addr) = &args.metrics {
        let a = metrics::parse_addr(addr).map_err(|e| anyhow::anyhow!("--metrics {e}"))?;
        let l = std::net::TcpListener::bind(a)
            .with_context(|| format!("--metrics {addr}: cannot listen on {a}"))?;
        eprintln!(
            "stallscope: metrics on http://{}/metrics",
            l.local_addr().unwrap_or(a)
        );
        metrics::serve(l, metrics.clone());
    }
    let events = args.events.as_deref().map(EventLog::open).transpose()?;
    if let Some(dir) = &args.out {
        if let Err(e) = std::fs::create_dir_all(dir) {
            // Reported, not fatal: the disk may come back, and metrics go on meanwhile.
            eprintln!(
                "stallscope: warning: --out {}: cannot create it: {e}; incidents will be counted as write errors until it can be",
                dir.display()
            );
        }
    }
    install_stop_handlers();
    let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(1);
    let m2 = metrics.clone();
    let jobs_out = std::sync::Arc::new(AtomicUsize::new(0));
    let out2 = jobs_out.clone();
    let writer = std::thread::Builder::new()
        .name("incidents".into())
        .spawn(move || {
            // The report can wait a little; redis and the event loop must not.
            // SAFETY: get/setpriority of this thread only.
            unsafe {
                let tid = libc::gettid() as libc::id_t;
                let now = libc::getpriority(libc::PRIO_PROCESS, tid);
                libc::setpriority(libc::PRIO_PROCESS, tid, (now + WRITER_NICER_BY).min(19));
            }
            for job in rx {
                let stalls = job.count;
                let (t0, c0) = (Instant::now(), metrics::thread_cpu_seconds());
                let outcome = incident::write(job);
                give_back_memory();
                m2.write_seconds.inc_by(t0.elapsed().as_secs_f64());
                m2.write_cpu_seconds
                    .inc_by((metrics::thread_cpu_seconds() - c0).max(0.0));
                // Before the message: the next incident need not wait for stderr.
                out2.fetch_sub(1, Ordering::SeqCst);
                match outcome {
                    Outcome::Written(p) => {
                        m2.incidents.inc();
                        eprintln!("stallscope: incident written: {}", p.display());
                    }
                    Outcome::Failed(e) => {
                        m2.incident_errors.inc();
                        m2.unreported
                            .get_or_create(&metrics::UnreportedLabels {
                                reason: metrics::WRITE_ERROR,
                            })
                            .inc_by(stalls);
                        eprintln!("stallscope: warning: incident not written: {e} (counted in stallscope_incident_write_errors_total; watching goes on)");
                    }
                }
            }
        })
        .context("cannot start the incident writer thread")?;
    let mut w = Watcher {
        args,
        opts,
        user_conf,
        observer: Observer::new(metrics.clone()),
        metrics,
        ring: Ring::new(args.ring_size, args.before + LONG_STALL_NS),
        grouper: Grouper::new(args.after),
        limit: RateLimit::new(args.max_incidents_per_hour),
        events,
        event_err_said: false,
        jobs: Some(tx),
        writer: Some(writer),
        ring_evicted_seen: 0,
        reported_upto: None,
        pending: None,
        jobs_out,
        identity: None,
        deadline: args
            .duration
            .map(|d| Instant::now() + Duration::from_nanos(d as u64)),
    };
    let mut pid = Some(first_pid);
    let mut first = true;
    let mut said_waiting = false;
    let mut gone_pid: Option<Tid> = None;
    while !w.want_stop(true) {
        let Some(p) = pid else {
            std::thread::sleep(FOLLOW_POLL);
            if follow {
                match find_target(args) {
                    Ok(Some(p)) if Some(p) != gone_pid => pid = Some(p),
                    Ok(_) => {}
                    Err(e) => {
                        if !said_waiting {
                            eprintln!("stallscope: waiting: {e}");
                            said_waiting = true;
                        }
                    }
                }
            } else if let (Some(id), Some(g)) = (&w.identity, gone_pid) {
                if let Some(np) = id.find(g) {
                    eprintln!(
                        "stallscope: process {np} is the restarted redis ({}); attaching",
                        id.describe()
                    );
                    pid = Some(np);
                }
            }
            continue;
        };
        said_waiting = false;
        match watch_one(&mut w, p) {
            Ok(()) => {}
            Err(e) if first => {
                shutdown(&mut w);
                return Err(e);
            }
            Err(e) => eprintln!("stallscope: warning: {e:#}; trying again"),
        }
        first = false;
        w.metrics.attached.set(0);
        if w.want_stop(true) {
            break;
        }
        gone_pid = Some(p);
        pid = None;
        if follow {
            eprintln!(
                "stallscope: process {p} is gone; stallscope_attached is 0 until a process named {} runs again",
                args.name.as_deref().unwrap_or("redis-server")
            );
        } else {
            match w.identity.as_ref().filter(|id| id.followable()) {
                Some(id) => eprintln!(
                    "stallscope: process {p} is gone; stallscope_attached is 0 until a {} {} runs again (--pid follows it by that)",
                    if id.comm.is_empty() { "process" } else { &id.comm },
                    id.describe()
                ),
                None => {
                    shutdown(&mut w);
                    anyhow::bail!(
                        "--pid {p}: the process exited, and it cannot be followed to its restart: it listened on no \
                         TCP port and its config names no pidfile; watch it with --name to follow restarts by name"
                    );
                }
            }
        }
    }
    shutdown(&mut w);
    eprintln!("stallscope: watch stopped");
    Ok(0)
}

/// Returns what a finished incident analysis or a retired live analyzer freed to the
/// system: glibc keeps freed small blocks in per-thread arenas, which would otherwise show
/// as RSS that never comes down after the largest incident.
fn give_back_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Lets the writer finish what it was given (briefly: a stop must not hang).
fn shutdown(w: &mut Watcher) {
    w.jobs = None;
    if let Some(h) = w.writer.take() {
        // Redis is already detached; SIGTERM must still end the watcher within 2 s.
        let deadline = Instant::now() + Duration::from_millis(1000);
        while !h.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if h.is_finished() {
            let _ = h.join();
        } else {
            eprintln!("stallscope: warning: an incident report was still being written at exit; it is lost");
        }
    }
}

/// Keeps `clock`'s wall time of the attach in step with the wall clock. The live clock is
/// the monotonic one, which a wall-clock step does not move (NTP stepping it, a VM paused and
/// resumed: a 30-minute soak here ran 10 s behind after one), so a watcher attached for days
/// would stamp its `--events` lines, incident names and reports ever further from the wall
/// clock. Moved only past 1 ms, so that the jitter of two clock reads never changes a stall's
/// printed time between its `--events` line and its report. True when it moved.
fn resync_wall(clock: &mut Clock, mono_now: Nanos, wall_now: Nanos) -> bool {
    let wall_at_first = wall_now - (mono_now - clock.first);
    match clock.wall_at_first {
        Some(w) if (w - wall_at_first).abs() <= 1_000_000 => false,
        _ => {
            clock.wall_at_first = Some(wall_at_first);
            true
        }
    }
}

/// Traces process `pid` until it is gone or a stop is asked for.
fn watch_one(w: &mut Watcher, pid: Tid) -> Result<()> {
    // What redis's log is, found before the attach.
    let log_src = (w.args.redis.is_some() || w.args.redis_log.is_some()).then(|| {
        crate::redis_evidence::log_source_before_attach(
            pid,
            w.args.redis_log.as_deref(),
            w.args.redis.as_deref(),
            w.opts.redis_conf.as_ref(),
        )
    });
    let (mut tracer, backend, nthreads) = start(pid, w.args)?;
    w.metrics.attached.set(1);
    w.metrics.attaches.inc();
    w.observer.reset_process();
    w.ring.clear();
    w.reported_upto = None;
    let st = tracer.stats();
    let mut clock = Clock {
        fmt: TimeFmt::Epoch,
        perf: false,
        frac_digits: 6,
        first: st.attach_mono,
        date: None,
        wall_at_first: Some(st.attach_wall),
    };
    let ctx = procctx::gather(pid);
    w.identity = Some(follow::Identity::of(
        pid,
        &ctx.redis_conf,
        ctx.cwd.as_deref(),
    ));
    // What one copy-on-write fault copies here: the live windows and the incident reports
    // (which take the watcher's options) both word the cow-page-faults cause by it.
    w.opts.fault_copy_bytes = procctx::cow_fault_bytes(pid);
    let mut opts = w.opts.clone();
    opts.root_pid = Some(pid);
    opts.stamped_at_stops = backend == LiveBackend::Ptrace;
    if opts.redis_conf.is_none() && !ctx.redis_conf.is_empty() {
        opts.redis_conf = Some(RedisConf::parse(&ctx.redis_conf));
    }
    let conf_text = w
        .user_conf
        .clone()
        .or_else(|| (!ctx.redis_conf.is_empty()).then(|| ctx.redis_conf.clone()));
    let mut ac = AttachCtx {
        pid,
        conf_text,
        backend,
        splits_sched: tracer.splits_sched(),
        command_start: crate::live::command_start(tracer.dates_arrivals()),
        names: ctx.thread_names.clone(),
        ctx,
        host: Some(host::HostRing::start(
            pid,
            Duration::from_nanos(
                (w.args.before + LONG_STALL_NS + incident::MAX_SPAN_NS + w.args.after) as u64,
            ),
        )),
        redis: None,
        own: vec![],
    };
    if w.args.redis.is_some()
        || w.args.redis_log.is_some()
        || opts
            .redis_conf
            .as_ref()
            .is_some_and(|c| c.logfile.is_some())
    {
        let src = log_src.unwrap_or_else(|| {
            redis::WatchRedis::log_source(w.args, &ac.ctx, opts.redis_conf.as_ref())
        });
        let r = redis::WatchRedis::start(w.args, &ac.ctx, src);
        if let Some(src) = r.followed() {
            eprintln!(
                "stallscope: following redis's log {} ({})",
                src.path, src.found
            );
        }
        if let Some(a) = &w.args.redis {
            eprintln!("stallscope: asking redis at {a} for LATENCY and INFO once a second, SLOWLOG and LATENCY HISTORY once per incident");
        }
        ac.redis = Some(r);
    }
    let mut cur = Window::new(&opts, pid, &ac.ctx, &ac.names, &ac.own);
    let mut prev: Option<(Window, Nanos)> = None;
    eprintln!(
        "stallscope: watching {pid} ({nthreads} thread{}) with {backend}; stalls over {}{}",
        crate::analyze::findings::plural(nthreads as u64),
        crate::analyze::findings::human(w.args.threshold / 1000),
        match &w.args.out {
            Some(d) => format!(", incidents into {}", d.display()),
            None => String::new(),
        }
    );
    let mut seen_tids: rustc_hash::FxHashSet<Tid> = Default::default();
    let mut last_tid: Option<Tid> = None;
    let mut drains = DrainClock::new(w.args.ring_size, Instant::now());
    let mut last_stop_req: Option<Instant> = None;
    let mut latest: Nanos = st.attach_mono;
    let mut batch = std::collections::VecDeque::new();
    // The events of `batch` before `at` are done with: analysed in place and copied,
    // compact, into the ring from there (a pop first moved each ~300-byte event out once
    // more).
    let mut at = 0usize;
    let mut since_clock = 0u32;
    loop {
        if at >= batch.len() {
            batch.clear();
            at = 0;
            tracer.reuse(&mut w.ring.spent);
            tracer.next_batch(Duration::from_millis(100), &mut batch)?;
        }
        let ev = batch.get_mut(at);
        at += 1;
        let got_event = ev.is_some();
        // The clock once every CLOCK_EVERY events, or when none came (as in `run_attach`).
        since_clock += 1;
        let look = !got_event || since_clock >= live::CLOCK_EVERY;
        if look {
            since_clock = 0;
            resync_wall(&mut clock, live::now_mono(), live::now_wall());
        }
        let lost = tracer.take_lost();
        if lost > 0 {
            w.metrics.lost_events.inc_by(lost);
            w.ring.note_lost(lost);
            cur.an.add_lost_events(lost);
            if let Some((p, _)) = &mut prev {
                p.an.add_lost_events(lost);
            }
        }
        if let Some(slot) = ev {
            let ev = &*slot;
            if let Some(sc) = ev.syscall() {
                if last_tid != Some(ev.tid)
                    && seen_tids.insert(ev.tid)
                    && !ac.names.contains_key(&ev.tid)
                {
                    // A thread born while tracing: its name is in /proc now.
                    if let Ok(n) =
                        std::fs::read_to_string(format!("/proc/{pid}/task/{}/comm", ev.tid))
                    {
                        let n = n.trim_end().to_string();
                        cur.an.set_thread_name(ev.tid, &n);
                        if let Some((p, _)) = &mut prev {
                            p.an.set_thread_name(ev.tid, &n);
                        }
                        ac.names.insert(ev.tid, n);
                    }
                }
                last_tid = Some(ev.tid);
                cur.push(ev);
                if let Some((p, _)) = &mut prev {
                    p.push(ev);
                }
                let class = sc.fd.and_then(|fd| cur.an.file_class_at(ev.tid, fd, ev.ts));
                w.observer.observe(ev, class);
            } else {
                cur.push(ev);
                if let Some((p, _)) = &mut prev {
                    p.push(ev);
                }
            }
            latest = latest.max(ev.end());
            // The ring takes what the event owns and copies the rest, compact, out of the
            // batch (cleared as a whole later).
            w.ring.push_from(slot, latest);
        }
        let done = at >= batch.len() && tracer.is_done();
        if drains.due(got_event, look.then(Instant::now)) || done {
            let mut found = vec![];
            let switch_at = prev.as_ref().map(|(_, s)| *s);
            if let Some((p, s)) = &mut prev {
                found.extend(p.drain(&clock).into_iter().filter(|x| x.2 < *s));
            }
            found.extend(
                cur.drain(&clock)
                    .into_iter()
                    .filter(|x| switch_at.is_none_or(|s| x.2 >= s)),
            );
            found.sort_by_key(|x| x.1);
            for (s, start, end) in &found {
                w.on_stall(s, *start, *end);
            }
            let now = now_mono();
            if let Some(r) = &mut ac.redis {
                r.tick(
                    now,
                    w.args.before + LONG_STALL_NS + incident::MAX_SPAN_NS + w.args.after,
                );
                for (fd, since) in r.take_own_conns() {
                    cur.an.mark_own_connection(fd, since);
                    if let Some((p, _)) = &mut prev {
                        p.an.mark_own_connection(fd, since);
                    }
                    ac.own.retain(|(f, _)| *f != fd);
                    if ac.own.len() >= 8 {
                        ac.own.remove(0);
                    }
                    ac.own.push((fd, since));
                }
            }
            if let Some(o) = w.grouper.take_due(now, w.ring.evicted_upto()) {
                w.incident_due(o);
            }
            w.hand_over(&ac, &clock, false);
            w.tick_metrics();
            // The old analyzer has handed over once every stall ending before the switch
            // has surely been drained (a perf tracer holds records back briefly to order them).
            if prev.as_ref().is_some_and(|(_, s)| now > *s + 2_000_000_000) {
                prev = None;
                give_back_memory();
            }
            if prev.is_none() && cur.born.elapsed() >= WINDOW && !done {
                ac.ctx = procctx::gather(pid);
                ac.names = procctx::thread_names(pid);
                seen_tids.clear();
                last_tid = None;
                let next = Window::new(&opts, pid, &ac.ctx, &ac.names, &ac.own);
                prev = Some((std::mem::replace(&mut cur, next), now + OVERLAP_NS));
            }
        }
        if done {
            break;
        }
        if (look || last_stop_req.is_none())
            && w.want_stop(look)
            && last_stop_req.is_none_or(|t| t.elapsed() >= Duration::from_millis(100))
        {
            tracer.stop();
            last_stop_req = Some(Instant::now());
        }
    }
    for warning in tracer.warnings() {
        eprintln!("stallscope: warning: {warning}");
    }
    // The process is gone or we are stopping: an incident being recorded is complete.
    if let Some(o) = w.grouper.open.take() {
        w.incident_due(o);
    }
    w.wait_writer_idle(Duration::from_millis(if w.want_stop(true) {
        300
    } else {
        5000
    }));
    w.hand_over(&ac, &clock, true);
    if let Some(h) = ac.host.take() {
        h.stop();
    }
    if let Some(r) = ac.redis.take() {
        r.stop();
    }
    let st = tracer.stats();
    eprintln!(
        "stallscope: detached from {pid}: traced {} syscalls; {} lost",
        st.syscalls, st.lost_events
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, EventKind, Syscall};
    use std::sync::mpsc::Receiver;

    /// A wall-clock step of 10 s (a VM resumed) moves the attach's wall time; the jitter of
    /// reading two clocks (well under 1 ms) does not.
    #[test]
    fn the_wall_time_follows_a_step_of_the_wall_clock_not_the_jitter() {
        let mut clock = Clock {
            fmt: TimeFmt::Epoch,
            perf: false,
            frac_digits: 6,
            first: 5_000_000_000,
            date: None,
            wall_at_first: Some(1_700_000_000_000_000_000),
        };
        let at = |c: &Clock| c.wall_at_first.unwrap();
        // 60 s later on both clocks, 300 µs of read jitter: unchanged.
        assert!(!resync_wall(
            &mut clock,
            65_000_000_000,
            1_700_000_060_000_300_000
        ));
        assert_eq!(at(&clock), 1_700_000_000_000_000_000);
        // The wall clock stepped 10 s ahead of the monotonic one.
        assert!(resync_wall(
            &mut clock,
            125_000_000_000,
            1_700_000_130_000_000_000
        ));
        assert_eq!(at(&clock), 1_700_000_010_000_000_000);
        // And a step back (NTP) moves it back.
        assert!(resync_wall(
            &mut clock,
            126_000_000_000,
            1_700_000_120_000_000_000
        ));
        assert_eq!(at(&clock), 1_699_999_999_000_000_000);
    }

    fn args(extra: &[&str]) -> WatchArgs {
        use clap::{Args, FromArgMatches};
        let mut argv = vec!["watch", "--pid", "1", "--out", "/nonexistent"];
        argv.extend_from_slice(extra);
        let m = WatchArgs::augment_args(clap::Command::new("watch"))
            .try_get_matches_from(argv)
            .unwrap();
        WatchArgs::from_arg_matches(&m).unwrap()
    }

    /// A watcher with no writer thread: the test takes the jobs and says when it is idle.
    fn watcher(args: &WatchArgs) -> (Watcher<'_>, Receiver<Job>) {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(1);
        let metrics = Metrics::new();
        let w = Watcher {
            args,
            opts: Options::default(),
            user_conf: None,
            observer: Observer::new(metrics.clone()),
            metrics,
            ring: Ring::new(args.ring_size, args.before + LONG_STALL_NS),
            grouper: Grouper::new(args.after),
            limit: RateLimit::new(args.max_incidents_per_hour),
            events: None,
            event_err_said: false,
            jobs: Some(tx),
            writer: None,
            ring_evicted_seen: 0,
            deadline: None,
            reported_upto: None,
            pending: None,
            jobs_out: std::sync::Arc::new(AtomicUsize::new(0)),
            identity: None,
        };
        (w, rx)
    }

    fn ctx() -> AttachCtx {
        AttachCtx {
            pid: 1,
            conf_text: None,
            backend: LiveBackend::Perf,
            splits_sched: false,
            command_start: None,
            ctx: procctx::ProcContext::default(),
            names: HashMap::new(),
            host: None,
            redis: None,
            own: vec![],
        }
    }

    fn call(ts: Nanos, dur: Nanos) -> Event {
        let mut sc = Syscall::new("read");
        sc.dur = Some(dur);
        Event {
            tid: 1,
            ts,
            line: 0,
            kind: EventKind::Syscall(sc),
        }
    }

    const S: Nanos = 1_000_000_000;

    /// Runs the watch loop's incident steps over `secs` seconds of 1000 calls a second with
    /// a 300 ms stall every `every` seconds; `writer_busy_for` is how many seconds the
    /// (simulated) writer takes per report. Returns the jobs written, the stalls still
    /// waiting at the end, and the most incidents' events that were ever held outside the
    /// ring at once.
    fn run(secs: i64, every: i64, writer_busy_for: i64, ring: &str) -> (Vec<Job>, u64, usize) {
        let a = args(&["--ring-size", ring, "--max-incidents-per-hour", "1000"]);
        let (mut w, rx) = watcher(&a);
        let ac = ctx();
        let clock = Clock {
            fmt: TimeFmt::Epoch,
            perf: false,
            frac_digits: 6,
            first: 0,
            date: None,
            wall_at_first: Some(0),
        };
        let mut done: Vec<Job> = vec![];
        let mut writing: Option<(Job, Nanos)> = None;
        let mut queued: std::collections::VecDeque<Job> = Default::default();
        let mut most_out = 0;
        for t in 0..secs * 1000 {
            let now = t * S / 1000;
            w.ring.push(call(now, 1000), now + 1000);
            if t % (every * 1000) == every * 500 {
                let s = crate::watch::incident::tests::stall(300_000, None);
                w.on_stall(&s, now - 300_000_000, now);
            }
            if t % 200 == 0 {
                if let Some(o) = w.grouper.take_due(now, w.ring.evicted_upto()) {
                    w.incident_due(o);
                }
                w.hand_over(&ac, &clock, false);
                // The writer: finishes its report, then takes the next one.
                if writing.as_ref().is_some_and(|(_, until)| now >= *until) {
                    done.push(writing.take().unwrap().0);
                    w.jobs_out.fetch_sub(1, Ordering::SeqCst);
                }
                queued.extend(rx.try_iter());
                if writing.is_none() {
                    if let Some(j) = queued.pop_front() {
                        writing = Some((j, now + writer_busy_for * S));
                    }
                }
                most_out = most_out.max(writing.is_some() as usize + queued.len());
            }
        }
        let waiting = w.pending.as_ref().map_or(0, |p| p.open.count)
            + w.grouper.open.as_ref().map_or(0, |o| o.count);
        done.extend(writing.map(|(j, _)| j));
        done.extend(queued);
        (done, waiting, most_out)
    }

    fn unreported(w: &Watcher, reason: &'static str) -> u64 {
        w.metrics
            .unreported
            .get_or_create(&metrics::UnreportedLabels { reason })
            .get()
    }

    #[test]
    fn a_stall_whose_report_cannot_be_written_is_counted_never_silently_missing() {
        // A ring of about 4 s (1 MiB at 1000 calls a second), a stall every 3 s, and a
        // writer that takes 20 s per report: most incidents cannot be written. Each stall is
        // either in a report that holds its events, still waiting, or counted as not
        // reported because the writer was busy; and no more than two incidents' events
        // are ever outside the ring.
        let a = args(&["--ring-size", "1MiB", "--max-incidents-per-hour", "1000"]);
        let (mut w, rx) = watcher(&a);
        let ac = ctx();
        let clock = Clock {
            fmt: TimeFmt::Epoch,
            perf: false,
            frac_digits: 6,
            first: 0,
            date: None,
            wall_at_first: Some(0),
        };
        let mut done: Vec<Job> = vec![];
        let mut writing: Option<(Job, Nanos)> = None;
        let mut queued: std::collections::VecDeque<Job> = Default::default();
        let mut most_out = 0;
        let mut stalls: Vec<(Nanos, Nanos)> = vec![];
        for t in 0..120_000 {
            let now = t * S / 1000;
            w.ring.push(call(now, 1000), now + 1000);
            if t % 3000 == 1500 {
                let s = crate::watch::incident::tests::stall(300_000, None);
                w.on_stall(&s, now - 300_000_000, now);
                stalls.push((now - 300_000_000, now));
            }
            if t % 200 == 0 {
                if let Some(o) = w.grouper.take_due(now, w.ring.evicted_upto()) {
                    w.incident_due(o);
                }
                w.hand_over(&ac, &clock, false);
                if writing.as_ref().is_some_and(|(_, until)| now >= *until) {
                    done.push(writing.take().unwrap().0);
                    w.jobs_out.fetch_sub(1, Ordering::SeqCst);
                }
                queued.extend(rx.try_iter());
                if writing.is_none() {
                    if let Some(j) = queued.pop_front() {
                        writing = Some((j, now + 20 * S));
                    }
                }
                most_out = most_out.max(writing.is_some() as usize + queued.len());
            }
        }
        let waiting = w.pending.as_ref().map_or(0, |p| p.open.count)
            + w.grouper.open.as_ref().map_or(0, |o| o.count);
        done.extend(writing.map(|(j, _)| j));
        done.extend(queued);
        assert!(
            most_out <= MAX_JOBS_OUT,
            "{most_out} incidents outside the ring"
        );
        let busy = unreported(&w, metrics::WRITER_BUSY);
        assert!(busy > 0, "a writer this slow must lose some");
        let in_a_report = stalls
            .iter()
            .filter(|(a, b)| {
                done.iter().any(|j| {
                    j.events.front().is_some_and(|e| e.ts <= *a)
                        && j.events.back().is_some_and(|e| e.end() >= *b)
                })
            })
            .count() as u64;
        assert_eq!(
            in_a_report + busy + waiting,
            stalls.len() as u64,
            "{in_a_report} in a report, {busy} counted, {waiting} waiting, of {}",
            stalls.len()
        );
        // What the written reports count is what they hold.
        let written: u64 = done.iter().map(|j| j.count).sum();
        assert_eq!(written, in_a_report);
        assert_eq!(
            w.metrics.incidents_suppressed.get(),
            w.limit.suppressed + done.iter().map(|j| j.suppressed).sum::<u64>()
        );
    }

    #[test]
    fn a_stall_that_began_inside_the_previous_report_is_in_the_next() {
        // Incident A (a stall ending at 10 s) is written at 10.5 s; the main thread's last
        // call ended at 10.4 s and its next comes at 10.9 s: a gap found only then, which
        // began inside A's report. B's report must hold the call the gap began at.
        let a = args(&["--after", "500ms"]);
        let (mut w, rx) = watcher(&a);
        let ac = ctx();
        let clock = Clock {
            fmt: TimeFmt::Epoch,
            perf: false,
            frac_digits: 6,
            first: 0,
            date: None,
            wall_at_first: Some(0),
        };
        let ms = 1_000_000;
        for t in (9_000..=10_400).step_by(100) {
            w.ring.push(call(t * ms, 1000), t * ms + 1000);
        }
        let s = crate::watch::incident::tests::stall(300_000, None);
        w.on_stall(&s, 9_700 * ms, 10_000 * ms);
        let o = w.grouper.take_due(10_500 * ms, None).expect("due");
        w.incident_due(o);
        w.hand_over(&ac, &clock, false);
        let ja = rx.try_recv().expect("A handed over");
        w.jobs_out.fetch_sub(1, Ordering::SeqCst);
        let gap_from = 10_400 * ms + 1000;
        w.ring.push(call(10_900 * ms, 1000), 10_900 * ms + 1000);
        w.on_stall(&s, gap_from, 10_900 * ms);
        let o = w.grouper.take_due(11_500 * ms, None).expect("due");
        w.incident_due(o);
        w.hand_over(&ac, &clock, false);
        let jb = rx.try_recv().expect("B handed over");
        assert!(ja.events.back().unwrap().end() >= gap_from);
        let first = jb.events.front().unwrap();
        assert_eq!(
            (first.ts, first.end()),
            (gap_from, gap_from),
            "B starts at the gap"
        );
        assert_eq!(jb.events.back().unwrap().ts, 10_900 * ms);
    }

    #[test]
    fn a_backlog_is_drained_by_count_not_only_by_time() {
        // 1 MiB of ring: a look at least every eighth of the events it can hold, however
        // fast they come; and every 200 ms when they are few.
        let t0 = Instant::now();
        let mut d = DrainClock::new(1 << 20, t0);
        let every = (1 << 20) / std::mem::size_of::<Event>() / 8;
        let looks: Vec<usize> = (1..=every * 3).filter(|_| d.due(true, Some(t0))).collect();
        assert_eq!(looks, vec![every, 2 * every, 3 * every]);
        assert!(!d.due(false, Some(t0 + Duration::from_millis(100))));
        assert!(d.due(false, Some(t0 + Duration::from_millis(201))));
    }

    #[test]
    fn a_rate_limited_incident_counts_its_stalls_as_not_reported() {
        let a = args(&["--max-incidents-per-hour", "1"]);
        let (mut w, _rx) = watcher(&a);
        for k in 0..3 {
            let at = (k * 20 + 12) * S;
            let s = crate::watch::incident::tests::stall(300_000, None);
            w.on_stall(&s, at - 300_000_000, at);
            w.ring.push(call(at, 1000), at + 1000);
            let o = w.grouper.take_due(at + 6 * S, None).expect("due");
            w.incident_due(o);
            w.pending = None;
        }
        assert_eq!(unreported(&w, metrics::RATE_LIMIT), 2);
        assert_eq!(w.metrics.incidents_suppressed.get(), 2);
    }

    #[test]
    fn a_slow_writer_never_holds_more_than_one_incident_and_loses_no_stall() {
        // Reports take 25 s while stalls come every 20 s (a starved writer on a loaded host).
        let (jobs, waiting, most_out) = run(400, 20, 25, "64MiB");
        assert_eq!(most_out, 1, "incidents held outside the ring at once");
        let written: u64 = jobs.iter().map(|j| j.count).sum();
        assert_eq!(
            written + waiting,
            20,
            "every stall is in one report or still waiting"
        );
        assert!(
            jobs.iter().any(|j| j.joined > 0),
            "incidents that waited joined the next report"
        );
        // No event is in two reports.
        for pair in jobs.windows(2) {
            let a = pair[0].events.back().unwrap().end();
            let b = pair[1].events.front().unwrap().ts;
            assert!(b >= a, "{a} {b}");
        }
    }

    #[test]
    fn a_writer_that_keeps_up_writes_one_report_per_incident() {
        let (jobs, waiting, most_out) = run(400, 20, 2, "64MiB");
        assert_eq!(most_out, 1);
        assert_eq!(waiting, 0);
        assert_eq!(jobs.len(), 20);
        assert!(jobs.iter().all(|j| j.count == 1 && j.joined == 0));
        // Each report keeps --before of context and --after after its stall.
        for j in &jobs {
            let span = j.events.back().unwrap().end() - j.events.front().unwrap().ts;
            assert!(span >= 14 * S, "{span}");
        }
    }

    #[test]
    fn a_waiting_incident_goes_to_the_writer_before_a_full_ring_drops_its_stall() {
        // A ring of a few seconds (1 MiB of 1000 calls a second), shorter than an incident's
        // --before + --after: waiting in it for a writer busy for 25 s, an incident would
        // lose its stall. (A writer slower than incidents for ever loses some whatever is
        // done, with memory bounded: --max-incidents-per-hour is for that.)
        let (jobs, waiting, most_out) = run(100, 20, 25, "1MiB");
        assert!(most_out <= 2, "{most_out} incidents outside the ring");
        for k in 0..5 {
            let at = (k * 20 + 10) * S;
            assert!(
                jobs.iter().any(|j| {
                    j.events.front().is_some_and(|e| e.ts <= at - 300_000_000)
                        && j.events.back().is_some_and(|e| e.end() >= at)
                }),
                "the stall at {}s is in no report",
                at / S
            );
        }
        let written: u64 = jobs.iter().map(|j| j.count).sum();
        assert_eq!(written + waiting, 5);
    }
}
