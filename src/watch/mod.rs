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

pub(crate) mod attached;
pub(crate) mod cheap;
pub(crate) mod fleet;
pub(crate) mod follow;
pub(crate) mod incident;
pub(crate) mod metrics;
pub(crate) mod redis;
pub(crate) mod ring;

use crate::analyze::{Options, RedisConf};
use crate::cli::WatchArgs;
use crate::event::{Nanos, Tid};
use crate::live::{self, host};
use crate::report::Stall;
use anyhow::{Context, Result};
use incident::{Grouper, Job, Outcome, RateLimit};
use metrics::{InstanceMetrics, Metrics, Observer, StallLabels};
use ring::Ring;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The ring keeps this much beyond --before: a stall is known only when it ends, and its
/// incident starts --before ahead of its start.
pub(crate) const LONG_STALL_NS: Nanos = 10_000_000_000;
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

/// `--events`: where stall lines go.
pub(crate) enum EventLog {
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

/// One stall as a log line for shippers: ISO 8601 time, which instance, who, what, how
/// long, why, and the names (never the keys) of the commands it held up.
pub(crate) fn event_line(s: &Stall, instance: &str) -> String {
    serde_json::json!({
        "time": s.ts_iso,
        "instance": instance,
        "pid": s.who.pid,
        "tid": s.who.tid,
        "thread": s.who.thread,
        "kind": s.kind,
        "syscall": s.syscall,
        "file_class": s.target.class,
        "path": s.target.path,
        "duration_s": s.duration_us as f64 / 1e6,
        "bound": s.bound,
        "finding": s.finding,
        "cause": s.cause,
        "commands": s.waiting.by_command,
        "waiting_clients": s.waiting.clients,
        "events_lost": s.events_lost,
    })
    .to_string()
}

fn stall_labels(s: &Stall) -> StallLabels {
    StallLabels {
        instance: String::new(),
        role: s.who.thread.to_string(),
        kind: match s.kind {
            crate::report::StallKind::SlowSyscall => "slow_syscall".into(),
            crate::report::StallKind::Gap => "gap".into(),
        },
        file_class: s.target.class.map_or("none", |c| c.as_str()).to_string(),
        finding: s
            .finding
            .map_or_else(|| "none".to_string(), |f| f.as_str().to_string()),
    }
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
        _ => Err(format!(
            "--name {name}: {} processes match; choose one with --pid PID:\n{}",
            found.len(),
            fleet::list_matches(&found)
        )),
    }
}

/// State that lives across attachments.
pub(crate) struct Watcher<'a> {
    args: &'a WatchArgs,
    opts: Options,
    /// `--redis-conf`'s text, kept beside recordings.
    user_conf: Option<String>,
    metrics: InstanceMetrics,
    observer: Observer,
    ring: Ring,
    grouper: Grouper,
    limit: RateLimit,
    /// `--events`, shared by every instance's watcher.
    events: Option<SharedLog>,
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
    /// Which instance this is, where its reports go, and its ring's share.
    inst: fleet::Instance,
    /// The cheap tier's stalls waiting for their incident's report (`--mode cheap`).
    cheap: cheap::Seen,
}

/// The `--events` log, written by every instance's watcher.
pub(crate) type SharedLog = std::sync::Arc<std::sync::Mutex<EventLog>>;

impl Watcher<'_> {
    /// A signal asked to stop, or (when `clock`: the clock may be read) `--duration` is up.
    fn want_stop(&self, clock: bool) -> bool {
        crate::signals::stop_requested()
            || (clock && self.deadline.is_some_and(|d| Instant::now() >= d))
    }

    fn on_stall(&mut self, s: &Stall, start: Nanos, end: Nanos) {
        self.metrics.count_stall(stall_labels(s));
        eprintln!(
            "stall: {}{}",
            self.inst.say(),
            crate::render::table::stall_line(s)
        );
        if let Some(log) = &self.events {
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = log.write_line(&event_line(s, &self.inst.label)) {
                self.metrics.event_log_errors.inc();
                if !self.event_err_said {
                    let what = match &*log {
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
        if self.inst.out.is_none() || (o.stalls.is_empty() && !o.by_signal) {
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
            eprintln!(
                "stallscope: incident {} not written: {} already written in the last hour (--max-incidents-per-hour); counted in stallscope_incidents_suppressed_total",
                began(&o),
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
    fn hand_over(&mut self, ctx: &attached::AttachCtx, force: bool) {
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
                eprintln!(
                    "stallscope: incident {} not written: the writer still had {out} reports to write when the history ring (--ring-size) dropped its first stall; its {} stall{} are counted in stallscope_stalls_not_reported_total{{reason=\"writer_busy\"}}",
                    began(&p.open),
                    p.open.count,
                    crate::analyze::findings::plural(p.open.count),
                );
                self.release_ring();
            }
            return;
        }
        let Some(p) = self.pending.take() else { return };
        self.release_ring();
        let Some(dir) = self.inst.out.clone() else {
            return;
        };
        let cheap = self.take_cheap(p.open.start);
        let base = match (p.open.stalls.first(), p.open.worst()) {
            (Some(first), Some(worst)) => incident::base_name(first, worst),
            _ => match cheap.as_ref().and_then(cheap::Seen::signal_name) {
                Some(n) => n,
                None => return,
            },
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
            session: ctx.view.clone(),
            base,
            count: p.open.count,
            joined: p.joined,
            suppressed: std::mem::take(&mut self.limit.suppressed),
            ring_short,
            host,
            redis: ctx.redis.as_ref().and_then(|r| r.for_incident(from)),
            dir,
            record: self.args.record,
            cheap,
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

    /// The cheap tier's stalls for the report being handed over (those from the incident's
    /// `start` on; earlier ones were of incidents not written), and what it says of the
    /// tiers; None in full mode.
    fn take_cheap(&mut self, start: Nanos) -> Option<cheap::Seen> {
        self.cheap.stalls.retain(|(_, s)| *s >= start);
        if self.cheap.stalls.is_empty() && self.cheap.trigger.is_none() {
            return None;
        }
        let seen = self.cheap.clone();
        self.cheap.stalls.clear();
        self.cheap.escalated_at = None;
        self.cheap.escalated_iso = None;
        self.cheap.trigger = None;
        Some(seen)
    }

    fn unreported(&self, reason: &'static str, stalls: u64) {
        self.metrics.unreported(reason).inc_by(stalls);
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
        self.ring.set_max_bytes(self.inst.budget.share());
    }
}

/// When an incident began, for messages: its first stall's time.
fn began(o: &incident::Open) -> String {
    match o.stalls.first() {
        Some(f) => format!("at {}", f.ts_iso.as_deref().unwrap_or(&f.ts)),
        None => "opened by a sign from redis".into(),
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

/// `stallscope watch`. Returns 0 (for the exit status) when stopped by a signal or
/// `--duration`; errors are setup errors (bad flags, no process, no backend).
pub fn run_watch(args: &WatchArgs) -> Result<u64> {
    one_malloc_arena();
    let (opts, user_conf) = options(args)?;
    let mode = Mode::of(args)?;
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
    let events = args
        .events
        .as_deref()
        .map(EventLog::open)
        .transpose()?
        .map(|l| std::sync::Arc::new(std::sync::Mutex::new(l)));
    if let Some(dir) = &args.out {
        if let Err(e) = std::fs::create_dir_all(dir) {
            // Reported, not fatal: the disk may come back, and metrics go on meanwhile.
            eprintln!(
                "stallscope: warning: --out {}: cannot create it: {e}; incidents will be counted as write errors until it can be",
                dir.display()
            );
        }
    }
    crate::signals::install_stop_handlers();
    let sh = fleet::Shared {
        args,
        opts,
        user_conf,
        metrics,
        events,
        budget: std::sync::Arc::new(fleet::Budget::new(args.ring_bytes())),
    };
    match mode {
        Mode::One(first_pid) => watch_alone(&sh, first_pid)?,
        Mode::Fleet(names) => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            fleet::run(&sh, &names)?
        }
    }
    eprintln!("stallscope: watch stopped");
    Ok(0)
}

/// Before any thread starts: glibc gives each thread a malloc arena of its own, and an arena
/// keeps what was freed in it for reuse by its thread. The watcher's threads hand events and
/// reports to one another (the ring reader decodes, the main thread holds, the incident
/// writer analyses), so each arena grew to the largest incident that passed through it and
/// stayed there: one arena shared by all keeps one such peak, not one per thread
/// (bench/watch_rss.result.txt [R1]). Each thread's small-object cache still spares it the
/// arena's lock on most calls.
fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a tunable of glibc's allocator; called before the watcher
    // starts any thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// The analysis options, with `--redis-conf` read, and that file's text.
fn options(args: &WatchArgs) -> Result<(Options, Option<String>)> {
    let mut opts = Options {
        threshold_ns: args.threshold,
        ..Default::default()
    };
    let mut user_conf = None;
    if let Some(f) = &args.from_redis.redis_conf {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("--redis-conf {f}: cannot read it"))?;
        opts.redis_conf = Some(RedisConf::parse(&text));
        user_conf = Some(text);
    }
    Ok((opts, user_conf))
}

/// One process followed across its restarts, or every process of some names.
enum Mode {
    One(Tid),
    Fleet(Vec<String>),
}

impl Mode {
    /// `--pid`, and `--name` with flags about one redis (`--redis`, `--redis-log`,
    /// `--redis-conf`), watch one process; `--all`, and `--name` otherwise, every match.
    fn of(args: &WatchArgs) -> Result<Mode> {
        let one_redis = args.from_redis.redis.is_some()
            || args.from_redis.redis_log.is_some()
            || args.from_redis.redis_conf.is_some();
        let fleet = args.all || (args.pid.is_none() && !one_redis);
        if fleet && args.backend == crate::cli::Backend::Ptrace {
            anyhow::bail!(
                "--backend ptrace: cannot watch every instance ({}): ptrace stops every thread of each redis twice per syscall; watch one with --pid, or use --backend bpf or perf",
                if args.all { "--all" } else { "--name" }
            );
        }
        if args.all {
            return Ok(Mode::Fleet(
                fleet::ALL_NAMES.iter().map(|n| n.to_string()).collect(),
            ));
        }
        if fleet {
            let name = args.name.as_deref().unwrap_or("redis-server");
            if fleet::discover(&[name]).is_empty() {
                anyhow::bail!("--name {name}: no running process has that name (--all waits for instances to start)");
            }
            return Ok(Mode::Fleet(vec![name.to_string()]));
        }
        match find_target(args) {
            Ok(Some(p)) => Ok(Mode::One(p)),
            Ok(None) => anyhow::bail!(
                "--name {}: no running process has that name",
                args.name.as_deref().unwrap_or("redis-server")
            ),
            Err(e) => anyhow::bail!(
                "{e}\n(--redis, --redis-log and --redis-conf are about one redis: drop them to watch every match)"
            ),
        }
    }
}

/// Watches one process and its successors (`follow`), labelled by its address.
fn watch_alone(sh: &fleet::Shared, first_pid: Tid) -> Result<()> {
    let label = fleet::label_of(first_pid).unwrap_or_else(|| "redis".to_string());
    sh.budget.join();
    let inst = fleet::Instance {
        label: label.clone(),
        out: sh.args.out.clone(),
        budget: sh.budget.clone(),
        fleet: false,
        host: None,
        cheap: None,
    };
    let mut w = Watcher::new(sh, sh.metrics.instance(&label), inst)?;
    sh.metrics.instances.set(1);
    let result = follow(&mut w, first_pid);
    shutdown(&mut w);
    result
}

impl<'a> Watcher<'a> {
    /// A watcher of one instance, its incident writer started.
    pub(crate) fn new(
        sh: &fleet::Shared<'a>,
        metrics: InstanceMetrics,
        inst: fleet::Instance,
    ) -> Result<Watcher<'a>> {
        let args = sh.args;
        let (tx, writer, jobs_out) = start_writer(&metrics)?;
        Ok(Watcher {
            args,
            opts: sh.opts.clone(),
            user_conf: sh.user_conf.clone(),
            observer: Observer::new(metrics.clone()),
            metrics,
            ring: Ring::new(inst.budget.share(), args.before + LONG_STALL_NS),
            grouper: Grouper::new(args.after),
            limit: RateLimit::new(args.max_incidents_per_hour),
            events: sh.events.clone(),
            event_err_said: false,
            jobs: Some(tx),
            writer: Some(writer),
            ring_evicted_seen: 0,
            reported_upto: None,
            pending: None,
            jobs_out,
            identity: None,
            cheap: cheap::Seen::default(),
            deadline: args
                .duration
                .map(|d| Instant::now() + Duration::from_nanos(d as u64)),
            inst,
        })
    }
}

type Writer = (
    std::sync::mpsc::SyncSender<Job>,
    std::thread::JoinHandle<()>,
    std::sync::Arc<AtomicUsize>,
);

/// The incident writer: a thread that makes each incident's files, nicer than the watch
/// loop, counting what it wrote and what it could not. Returns where to send it jobs, its
/// handle, and the count of jobs given and not yet written.
fn start_writer(metrics: &InstanceMetrics) -> Result<Writer> {
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
                        m2.unreported(metrics::WRITE_ERROR).inc_by(stalls);
                        eprintln!("stallscope: warning: incident not written: {e} (counted in stallscope_incident_write_errors_total; watching goes on)");
                    }
                }
            }
        })
        .context("cannot start the incident writer thread")?;
    Ok((tx, writer, jobs_out))
}

/// Watches `first_pid`, then, each time the process is gone, waits for its successor: by
/// name (`--name`), or by what it listened on and its pidfile (`--pid`). Ends when a stop
/// is asked for; an error only when the first attach fails or a `--pid` cannot be followed.
fn follow(w: &mut Watcher, first_pid: Tid) -> Result<()> {
    let by_name = w.args.pid.is_none();
    let mut pid = Some(first_pid);
    let mut first = true;
    let mut said_waiting = false;
    let mut gone_pid: Option<Tid> = None;
    while !w.want_stop(true) {
        let Some(p) = pid else {
            std::thread::sleep(FOLLOW_POLL);
            pid = successor(w, by_name, gone_pid, &mut said_waiting);
            continue;
        };
        said_waiting = false;
        let tiered = w.args.mode == crate::cli::WatchMode::Cheap
            && matches!(
                w.args.backend,
                crate::cli::Backend::Auto | crate::cli::Backend::Bpf
            );
        let watched = match tiered {
            true => match cheap::watch_one(w, p) {
                Ok(false) => attached::watch_one(w, p),
                other => other.map(|_| ()),
            },
            false => attached::watch_one(w, p),
        };
        match watched {
            Ok(()) => {}
            Err(e) if first => return Err(e),
            Err(e) => eprintln!("stallscope: warning: {e:#}; trying again"),
        }
        first = false;
        w.metrics.attached.set(0);
        w.metrics.watch_cgroup(None);
        if w.want_stop(true) {
            break;
        }
        gone_pid = Some(p);
        pid = None;
        if by_name {
            eprintln!(
                "stallscope: process {p} is gone; stallscope_attached is 0 until a process named {} runs again",
                w.args.name.as_deref().unwrap_or("redis-server")
            );
            continue;
        }
        match w.identity.as_ref().filter(|id| id.followable()) {
            Some(id) => eprintln!(
                "stallscope: process {p} is gone; stallscope_attached is 0 until a {} {} runs again (--pid follows it by that)",
                if id.comm.is_empty() { "process" } else { &id.comm },
                id.describe()
            ),
            None => anyhow::bail!(
                "--pid {p}: the process exited, and it cannot be followed to its restart: it listened on no \
                 TCP port and its config names no pidfile; watch it with --name to follow restarts by name"
            ),
        }
    }
    Ok(())
}

/// The process that took over from `gone`, if one runs now.
fn successor(
    w: &Watcher,
    by_name: bool,
    gone: Option<Tid>,
    said_waiting: &mut bool,
) -> Option<Tid> {
    if by_name {
        return match find_target(w.args) {
            Ok(Some(p)) if Some(p) != gone => Some(p),
            Ok(_) => None,
            Err(e) => {
                if !*said_waiting {
                    eprintln!("stallscope: waiting: {e}");
                    *said_waiting = true;
                }
                None
            }
        };
    }
    let (Some(id), Some(g)) = (&w.identity, gone) else {
        return None;
    };
    let np = id.find(g)?;
    eprintln!(
        "stallscope: process {np} is the restarted redis ({}); attaching",
        id.describe()
    );
    Some(np)
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
pub(crate) fn shutdown(w: &mut Watcher) {
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

#[cfg(test)]
mod tests {
    use super::attached::{resync_wall, AttachCtx, DrainClock};
    use super::incident::SessionView;
    use super::*;
    use crate::event::{Event, EventKind, Syscall};
    use crate::report::LiveBackend;
    use crate::source::{Clock, TimeFmt};
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
        let metrics = Metrics::new().instance("127.0.0.1:6379");
        let w = Watcher {
            args,
            opts: Options::default(),
            user_conf: None,
            observer: Observer::new(metrics.clone()),
            metrics,
            ring: Ring::new(args.ring_bytes(), args.before + LONG_STALL_NS),
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
            inst: fleet::Instance {
                label: "127.0.0.1:6379".into(),
                out: args.out.clone(),
                budget: std::sync::Arc::new(fleet::Budget::new(args.ring_bytes())),
                fleet: false,
                host: None,
                cheap: None,
            },
            cheap: cheap::Seen::default(),
        };
        (w, rx)
    }

    fn ctx() -> AttachCtx {
        AttachCtx {
            view: SessionView {
                pid: 1,
                opts: Options::default(),
                fds: vec![],
                thread_names: Default::default(),
                cwd: None,
                conf_text: None,
                clock: Clock {
                    fmt: TimeFmt::Epoch,
                    perf: false,
                    frac_digits: 6,
                    first: 0,
                    date: None,
                    wall_at_first: Some(0),
                },
                backend: LiveBackend::Perf,
                caps: Default::default(),
                follow_forks: true,
                own_conns: vec![],
                container: None,
            },
            resync: false,
            host: None,
            redis: None,
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
                w.hand_over(&ac, false);
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
        w.metrics.unreported(reason).get()
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
                w.hand_over(&ac, false);
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
        let ms = 1_000_000;
        for t in (9_000..=10_400).step_by(100) {
            w.ring.push(call(t * ms, 1000), t * ms + 1000);
        }
        let s = crate::watch::incident::tests::stall(300_000, None);
        w.on_stall(&s, 9_700 * ms, 10_000 * ms);
        let o = w.grouper.take_due(10_500 * ms, None).expect("due");
        w.incident_due(o);
        w.hand_over(&ac, false);
        let ja = rx.try_recv().expect("A handed over");
        w.jobs_out.fetch_sub(1, Ordering::SeqCst);
        let gap_from = 10_400 * ms + 1000;
        w.ring.push(call(10_900 * ms, 1000), 10_900 * ms + 1000);
        w.on_stall(&s, gap_from, 10_900 * ms);
        let o = w.grouper.take_due(11_500 * ms, None).expect("due");
        w.incident_due(o);
        w.hand_over(&ac, false);
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

    /// The watch loop itself (`attached::watch_session`, as `watch` runs it), on a replayed
    /// bpf recording (`fixtures/recording-bpf-lost`): its two stalls (a DEBUG SLEEP and a Lua
    /// loop) are counted and make one incident, handed to the writer at the detach with the
    /// session's view; the incident's report names the sleep and says what was lost, and its
    /// own recording reads back to the same stalls.
    #[test]
    fn the_watch_loop_on_a_replayed_recording_writes_its_incident() {
        use crate::session::{replay::ReplayTracer, LiveSession};
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().to_str().unwrap();
        let a: WatchArgs = {
            use clap::{Args, FromArgMatches};
            let argv = [
                "watch", "--pid", "1", "--out", out, "--record", "--before", "1s",
            ];
            let m = WatchArgs::augment_args(clap::Command::new("watch"))
                .try_get_matches_from(argv)
                .unwrap();
            WatchArgs::from_arg_matches(&m).unwrap()
        };
        let (mut w, rx) = watcher(&a);
        let fixture = format!(
            "{}/fixtures/recording-bpf-lost/rec.strace.gz",
            env!("CARGO_MANIFEST_DIR")
        );
        let (started, ctx) = ReplayTracer::open(&fixture, true, false)
            .unwrap()
            .start(LiveBackend::Bpf)
            .unwrap();
        let s = LiveSession::around(started, ctx, &w.opts, None, None);
        attached::watch_session(&mut w, s, None, None).unwrap();
        let jobs: Vec<Job> = rx.try_iter().collect();
        assert_eq!(jobs.len(), 1, "one incident");
        let job = jobs.into_iter().next().unwrap();
        assert_eq!(
            job.count, 2,
            "both stalls went through on_stall into the incident"
        );
        assert_eq!(job.session.pid, 2450);
        let Outcome::Written(json) = incident::write(job) else {
            panic!("not written")
        };
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let syscalls = |r: &serde_json::Value| -> Vec<String> {
            r["stalls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| format!("{} {} {}", s["syscall"], s["duration_us"], s["finding"]))
                .collect()
        };
        assert!(
            syscalls(&report)[0].starts_with("\"clock_nanosleep\""),
            "{:?}",
            syscalls(&report)
        );
        assert!(report["summary"]["lost_events"].as_u64().unwrap() > 0);
        assert_eq!(report["summary"]["command_start"], "arrival");
        let stem = json.to_str().unwrap().strip_suffix(".json").unwrap();
        let back = crate::run::report_of(&{
            use clap::{Args, FromArgMatches};
            let argv = ["analyze", &format!("{stem}.strace")];
            let m = crate::cli::AnalyzeArgs::augment_args(clap::Command::new("analyze"))
                .try_get_matches_from(argv)
                .unwrap();
            crate::cli::AnalyzeArgs::from_arg_matches(&m).unwrap()
        })
        .unwrap();
        let back = serde_json::to_value(&back).unwrap();
        assert_eq!(syscalls(&report), syscalls(&back));
    }
}
