//! App layer, `watch`'s default mode (`--mode cheap`): the cheap tier (`live::bpf::cheap`:
//! no syscall tracepoint, only scheduler switches and samples of the main thread's CPU
//! time) stays attached while nothing is wrong; each of its records becomes a `Stall` named
//! from the live process (the call from the saved registers, its fd from /proc, a close()
//! whose fd had left the table as redis's log file when that was just written), counted, printed and grouped like the full tier's; then, when incidents
//! are written (`--out`), the full tier is attached (`attached::escalate`) until the
//! incident's report is handed to the writer, and the cheap tier's stalls go into that
//! report beside what the full tier saw (`into_report`), with how exact each figure is.

use super::attached::{self, AttachCtx};
use super::incident::SessionView;
use super::Watcher;
use crate::analyze::RedisConf;
use crate::event::{Nanos, Tid};
use crate::live::bpf::cheap::{call_of, CheapConfig, CheapKind, CheapRecord, CheapTracer};
use crate::live::procctx;
use crate::report::{
    Bound, DurationKnown, FdRef, Role, Stall, StallKind, StallSched, ThreadRef, Waiting, WatchTiers,
};
use crate::source::Clock;
use anyhow::Result;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the cheap tier's ring is read: a stall is printed at most this late.
const POLL: Duration = Duration::from_millis(20);
/// How often the fd table is read again (a blocked call's fd is read when its record comes;
/// this is for an fd closed by then).
const FDS_EVERY: Duration = Duration::from_secs(5);

/// The programs' settings, from watch's flags.
pub(crate) fn config(args: &crate::cli::WatchArgs) -> CheapConfig {
    CheapConfig {
        threshold_ns: args.threshold,
        sample_period_ns: args.sample_period.max(10_000) as u64,
    }
}

/// The cheap tier's programs shared by every instance of a fleet watcher (`watch --all`):
/// one set in the kernel with the watched processes in its map; whichever instance polls
/// first reads the ring and sorts the records out by process. The kernel counts the records
/// it had no room for per CPU, not per process: each instance is told of every such loss,
/// as each may have been the one to lose a record.
pub(crate) struct SharedCheap {
    inner: Mutex<SharedInner>,
}

struct SharedInner {
    tracer: CheapTracer,
    /// Per watched process: its records not yet taken, and losses not yet told.
    queues: HashMap<Tid, (Vec<CheapRecord>, u64)>,
}

impl SharedCheap {
    pub(crate) fn start(args: &crate::cli::WatchArgs) -> Result<SharedCheap, String> {
        let cfg = config(args);
        let tracer = CheapTracer::attach(&cfg).map_err(|e| e.to_string())?;
        Ok(SharedCheap {
            inner: Mutex::new(SharedInner {
                tracer,
                queues: HashMap::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SharedInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Where an instance's records come from: programs of its own, or its share of a fleet's.
enum Feed {
    Own(Box<CheapTracer>),
    Shared(Arc<SharedCheap>, Tid),
}

impl Feed {
    fn start(w: &Watcher, pid: Tid) -> Result<Feed, String> {
        match &w.inst.cheap {
            Some(sh) => {
                let mut g = sh.lock();
                g.tracer.watch(pid, pid).map_err(|e| e.to_string())?;
                g.queues.insert(pid, (vec![], 0));
                Ok(Feed::Shared(sh.clone(), pid))
            }
            None => {
                let mut t = CheapTracer::attach(&config(w.args)).map_err(|e| e.to_string())?;
                t.watch(pid, pid).map_err(|e| e.to_string())?;
                Ok(Feed::Own(Box::new(t)))
            }
        }
    }

    /// Appends this process's records read since the last call; returns the records lost.
    fn poll(&mut self, out: &mut Vec<CheapRecord>) -> u64 {
        match self {
            Feed::Own(t) => {
                t.poll(out);
                t.take_drops()
            }
            Feed::Shared(sh, pid) => {
                let mut g = sh.lock();
                let g = &mut *g;
                let mut fresh = vec![];
                g.tracer.poll(&mut fresh);
                let lost = g.tracer.take_drops();
                for r in fresh {
                    // A process unwatched since its record was sent: nobody wants it.
                    if let Some(q) = g.queues.get_mut(&r.tgid) {
                        q.0.push(r);
                    }
                }
                for q in g.queues.values_mut() {
                    q.1 += lost;
                }
                let Some(q) = g.queues.get_mut(pid) else {
                    return 0;
                };
                out.append(&mut q.0);
                std::mem::take(&mut q.1)
            }
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        if let Feed::Shared(sh, pid) = self {
            let mut g = sh.lock();
            g.tracer.unwatch(*pid);
            g.queues.remove(pid);
        }
    }
}

/// The cheap tier's stalls waiting for their incident's report, and what the report says of
/// the tiers.
#[derive(Clone, Default)]
pub(crate) struct Seen {
    /// Each stall with its start on the monotonic clock.
    pub stalls: Vec<(Stall, Nanos)>,
    pub sample_period_ns: Nanos,
    /// When the full tier was attached for the incident.
    pub escalated_at: Option<Nanos>,
    pub escalated_iso: Option<String>,
}

/// What names a record's thread and file, read from the live process.
struct Names {
    pid: Tid,
    fds: HashMap<i32, String>,
    fds_at: Instant,
    comms: HashMap<Tid, String>,
    conf: Option<RedisConf>,
    cwd: Option<String>,
    /// `--redis-log`: redis's log file as the user named it (the config's otherwise).
    log: Option<String>,
}

impl Names {
    fn new(ctx: &procctx::ProcContext, conf: Option<RedisConf>) -> Names {
        Names {
            pid: ctx.pid,
            fds: ctx.fds.iter().cloned().collect(),
            fds_at: Instant::now(),
            comms: ctx.thread_names.clone(),
            conf,
            cwd: ctx.cwd.clone(),
            log: None,
        }
    }

    /// What fd `fd` is now, else what it was at the last reading of the table.
    fn fd(&mut self, fd: i32) -> Option<String> {
        if let Ok(p) = std::fs::read_link(format!("/proc/{}/fd/{fd}", self.pid)) {
            return Some(p.to_string_lossy().into_owned());
        }
        if self.fds_at.elapsed() >= FDS_EVERY {
            self.fds = procctx::gather(self.pid).fds.into_iter().collect();
            self.fds_at = Instant::now();
        }
        self.fds.get(&fd).cloned()
    }

    /// redis's log file (`--redis-log`, else the config's), if it was written within
    /// `window` (monotonic ns) and so may be the file a close() that blocked was flushing:
    /// redis opens and closes it for each line, and its fd is out of the table once close()
    /// begins to flush (a kernel probe on the flush would name it; none loads here).
    fn log_written_in(&self, window: (Nanos, Nanos)) -> Option<String> {
        let log = self.log_path()?;
        let mtime = std::fs::metadata(&log).ok()?.modified().ok()?;
        let age = std::time::SystemTime::now()
            .duration_since(mtime)
            .ok()?
            .as_nanos() as Nanos;
        let at = crate::clock::now_mono() - age;
        (at >= window.0 - 1_000_000_000 && at <= window.1).then_some(log)
    }

    fn log_path(&self) -> Option<String> {
        let l = self
            .log
            .clone()
            .or_else(|| self.conf.as_ref()?.logfile.clone())?;
        Some(match (&self.cwd, l.starts_with('/')) {
            (Some(cwd), false) => format!("{cwd}/{l}"),
            _ => l,
        })
    }

    fn role(&mut self, tid: Tid) -> Role {
        if tid == self.pid {
            return Role::Main;
        }
        let pid = self.pid;
        let name = self.comms.entry(tid).or_insert_with(|| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                .map(|c| c.trim_end().to_string())
                .unwrap_or_default()
        });
        Role::from_name(name).unwrap_or(Role::Other)
    }
}

/// A cheap record as the report's stall (its `at_us` from `first`).
fn stall_of(r: &CheapRecord, names: &mut Names, clock: &Clock, first: Nanos) -> Stall {
    let dur = r.end - r.start;
    let d = crate::live::sched_delta(&r.before, &r.after);
    let role = names.role(r.tid);
    let mut s = Stall {
        ts: clock.format(r.start),
        ts_iso: clock.iso(r.start),
        at_us: (r.start - first) / 1000,
        who: ThreadRef {
            pid: names.pid,
            tid: r.tid,
            thread: role,
        },
        kind: StallKind::Gap,
        syscall: None,
        target: FdRef::default(),
        duration_us: dur / 1000,
        line: None,
        cause: String::new(),
        finding: None,
        bound: Bound::Exact,
        duration_known: DurationKnown::Sampled,
        in_flight: None,
        waiting: Waiting::default(),
        phase: None,
        events_lost: false,
        sched: Some(StallSched::of(&d, dur)),
        quiet_calls: None,
        redis_evidence: None,
    };
    match &r.kind {
        CheapKind::Gap { samples } => {
            s.cause = format!(
                "cheap tier: the main thread made no read or write for {:.1} ms while on a CPU or waiting for one ({samples} samples of its CPU time saw none); its edges are known to a sampling period; which command ran is known only to the full tier",
                dur as f64 / 1e6
            );
        }
        CheapKind::Blocked {
            uninterruptible, ..
        } => name_blocked(&mut s, r, names, *uninterruptible),
    }
    s
}

/// A blocked call's stall: the call and its file, from the registers at the switch-out.
fn name_blocked(s: &mut Stall, r: &CheapRecord, names: &mut Names, uninterruptible: bool) {
    s.bound = Bound::AtLeast;
    let how = if uninterruptible {
        "in an uninterruptible wait (disk)"
    } else {
        "asleep"
    };
    let Some(sc) = call_of(r, names.pid) else {
        s.cause = format!("cheap tier: the thread was blocked {how} outside a syscall (a page fault) from its switch-out to its switch-in");
        return;
    };
    s.kind = StallKind::SlowSyscall;
    s.syscall = Some(sc.name.to_string());
    s.target.fd = sc.fd;
    let mut how_named = "";
    s.target.path = match sc.fd {
        Some(fd) => names.fd(fd).or_else(|| {
            let closing = sc.sys.facts.has(crate::syscalls::Facts::CLOSE);
            let log = closing.then(|| names.log_written_in((r.start, r.end))).flatten();
            if log.is_some() {
                how_named = "; the fd had left the table (close() takes it out before it flushes): named as redis's log file, which the config names and which was written just before";
            }
            log
        }),
        None => sc.fd_path.as_deref().map(str::to_string),
    };
    s.target.class = s
        .target
        .path
        .as_deref()
        .map(|p| crate::fdtable::classify_path(p, names.conf.as_ref()));
    s.cause = format!(
        "cheap tier: {}({}) blocked {how} from the thread's switch-out to its switch-in (the call itself began a little before and ended a little after: at least this long){how_named}; which commands waited is known only to the full tier",
        sc.name,
        s.target.fd.map(|f| f.to_string()).unwrap_or_default()
    );
}

/// Watches `pid` with the cheap tier until it is gone or a stop is asked for, escalating to
/// the full tier for each incident when incidents are written. False (said on stderr) when
/// the cheap tier cannot run here: the caller watches in full mode instead.
pub(super) fn watch_one(w: &mut Watcher, pid: Tid) -> Result<bool> {
    let cfg = config(w.args);
    let mut t = match Feed::start(w, pid) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("stallscope: warning: {}the cheap tier cannot run on process {pid}: {e}; watching in full mode (every syscall traced)", w.inst.say());
            return Ok(false);
        }
    };
    let ctx = procctx::gather(pid);
    let conf = w
        .opts
        .redis_conf
        .clone()
        .or_else(|| Some(RedisConf::parse(&ctx.redis_conf)));
    let mut names = Names::new(&ctx, conf);
    names.log = w.args.from_redis.redis_log.clone();
    let ac = cheap_ctx(w, &ctx);
    w.identity = Some(super::follow::Identity::of(
        pid,
        &ctx.redis_conf,
        ctx.cwd.as_deref(),
    ));
    w.metrics.attached.set(1);
    w.metrics.attaches.inc();
    w.cheap = Seen {
        sample_period_ns: cfg.sample_period_ns as Nanos,
        ..Seen::default()
    };
    say_watching(w, pid, &cfg);
    let mut recs = vec![];
    while !w.want_stop(true) && !gone(pid) {
        recs.clear();
        let lost = t.poll(&mut recs);
        if lost > 0 {
            w.metrics.lost_events.inc_by(lost);
        }
        let found = !recs.is_empty();
        for r in &recs {
            let s = stall_of(r, &mut names, &ac.view.clock, ac.view.clock.first);
            w.on_stall(&s, r.start, r.end);
            w.cheap.stalls.push((s, r.start));
        }
        // Past --max-incidents-per-hour the incident is only counted: the full tier would
        // cost redis its syscall path for a report nobody gets (a host starved of CPU stalls
        // redis every few seconds, and would keep the full tier attached for good).
        if found
            && w.args.out.is_some()
            && w.pending.is_none()
            && w.limit.has_room(std::time::Instant::now())
        {
            escalate(w, pid, &mut t);
        }
        let now = crate::clock::now_mono();
        if let Some(o) = w.grouper.take_due(now, w.ring.evicted_upto()) {
            w.incident_due(o);
        }
        w.hand_over(&ac, false);
        w.tick_metrics();
        std::thread::sleep(POLL);
    }
    if let Some(o) = w.grouper.open.take() {
        w.incident_due(o);
    }
    w.wait_writer_idle(Duration::from_millis(300));
    w.hand_over(&ac, true);
    eprintln!("stallscope: detached from {pid} (cheap tier)");
    Ok(true)
}

/// The full tier, attached until the open incident's report is handed to the writer. The
/// cheap tier's records of that time are dropped after it (the full tier saw those stalls).
fn escalate(w: &mut Watcher, pid: Tid, t: &mut Feed) {
    let at = crate::clock::now_mono();
    w.cheap.escalated_at = Some(at);
    w.cheap.escalated_iso = Some(
        chrono::Utc::now()
            .format("%Y-%m-%dT%H:%M:%S%.6fZ")
            .to_string(),
    );
    eprintln!(
        "stallscope: escalating: every syscall of {pid} traced until the incident is written"
    );
    if let Err(e) = attached::escalate(w, pid) {
        eprintln!("stallscope: warning: the full tier could not be attached: {e:#}; the incident's report will hold only the cheap tier's stalls");
        w.cheap.escalated_at = None;
        w.cheap.escalated_iso = None;
        return;
    }
    let mut during = vec![];
    t.poll(&mut during);
    eprintln!("stallscope: back to the cheap tier");
}

/// The cheap tier's own context for incidents it writes without the full tier (which could
/// not be attached): the session as /proc shows it.
fn cheap_ctx(w: &Watcher, ctx: &procctx::ProcContext) -> AttachCtx {
    let clock = crate::session::live_clock(crate::clock::now_mono(), crate::clock::now_wall());
    AttachCtx {
        view: SessionView {
            pid: ctx.pid,
            opts: w.opts.clone(),
            fds: ctx.fds.clone(),
            thread_names: ctx.thread_names.clone(),
            cwd: ctx.cwd.clone(),
            conf_text: w.user_conf.clone(),
            clock,
            backend: crate::report::LiveBackend::Bpf,
            caps: Default::default(),
            follow_forks: !w.args.no_follow_forks,
            own_conns: vec![],
            container: crate::live::container::describe(ctx.pid, &[]),
        },
        resync: true,
        host: None,
        redis: None,
    }
}

fn gone(pid: Tid) -> bool {
    crate::live::check_target(pid).is_err()
}

fn say_watching(w: &Watcher, pid: Tid, cfg: &CheapConfig) {
    use crate::units::human;
    eprintln!(
        "stallscope: watching {pid} with the cheap tier (sched_switch, main thread's CPU time sampled every {}; no syscall tracepoint) as instance {}; stalls over {}{}",
        human(cfg.sample_period_ns as i64 / 1000),
        w.inst.label,
        human(w.args.threshold / 1000),
        match &w.inst.out {
            Some(d) => format!(", incidents into {} (every syscall traced for each, until it is written)", d.display()),
            None => String::new(),
        }
    );
}

/// Puts the cheap tier's stalls of an incident into its report (`first`: the report's
/// origin), with `watch_tiers` saying which tier saw what.
pub(crate) fn into_report(report: &mut crate::report::Report, seen: &Seen, first: Nanos) {
    for (s, start) in &seen.stalls {
        let mut s = s.clone();
        s.at_us = (start - first) / 1000;
        report.stalls.push(s);
    }
    report.stalls.sort_by_key(|s| s.at_us);
    report.summary.stalls += seen.stalls.len() as u64;
    let period_us = seen.sample_period_ns / 1000;
    let mut notes = vec![
        format!("a gap's start and end are each known to about one sampling period ({period_us} µs of the main thread's CPU time, longer in wall time while it waits for a CPU); a gap shorter than about two periods is not seen"),
        "a blocked call is timed from the thread's switch-out to its switch-in: the call began a little before and ended a little after (duration: at least)".into(),
        "before the full tier was attached, which commands ran and which clients waited is not known".into(),
    ];
    notes.push("a close() that blocked had taken its fd out of the table: it is named only as redis's log file, when that was written just before".into());
    let full = match seen.escalated_at {
        Some(_) => "every syscall of the process from full_from until the report was written (the stalls without `cheap tier` in their cause, the commands, files and what followed)".to_string(),
        None => "nothing: the full tier was not attached (the stalls are the cheap tier's alone)".to_string(),
    };
    report.live.watch_tiers = Some(WatchTiers {
        cheap: "scheduler switches of every thread and the main thread's CPU time sampled: blocked syscalls and main-thread gaps over the threshold".into(),
        sample_period_us: period_us,
        cheap_stalls: seen.stalls.len() as u64,
        full_from: seen.escalated_iso.clone(),
        full,
        notes,
    });
}
