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
use crate::redis_client::{Signal, SignalKind};
use crate::report::{
    Bound, DurationKnown, FdRef, RedisSignal, Role, Stall, StallKind, StallSched, ThreadRef,
    Waiting, WatchTiers,
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
        follow_forks: !args.no_follow_forks,
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
                    if let Some(q) = g.queues.get_mut(&r.owner) {
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
    /// The same, wall clock epoch ms.
    pub escalated_ms: Option<i64>,
    /// What opened the incident (and escalated): None while none is open.
    pub trigger: Option<Trigger>,
    /// `--threshold`, to say why the cheap tier did not see the stall redis signalled.
    pub threshold_ns: Nanos,
}

/// What opened an incident in the cheap mode.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Trigger {
    /// The cheap tier found a stall over the threshold.
    Stall,
    /// redis said it stalled (`--redis`): a new LATENCY event or slow log entry; `ended_ms`
    /// is when redis says the stall ended (epoch ms, to the second).
    Redis { signal: RedisSignal, ended_ms: i64 },
}

impl Trigger {
    /// The report's and the metric's word for it.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Trigger::Stall => "stall",
            Trigger::Redis { signal, .. } if signal.source == "slowlog" => "slowlog",
            Trigger::Redis { .. } => "latency-event",
        }
    }
}

impl Seen {
    /// What opened the incident when it was not a stall, for the report's title.
    pub(crate) fn opened_by(&self) -> Option<&'static str> {
        match self.trigger.as_ref()?.as_str() {
            "latency-event" => Some("redis's LATENCY event"),
            "slowlog" => Some("redis's slow log"),
            _ => None,
        }
    }

    /// The files' name of an incident a sign from redis opened.
    pub(crate) fn signal_name(&self) -> Option<String> {
        let Some(Trigger::Redis { signal, .. }) = &self.trigger else {
            return None;
        };
        let at = self.escalated_iso.as_deref().unwrap_or(&signal.seen);
        Some(super::incident::signal_name(at, signal))
    }
}

/// A poller's signal as the report says it.
fn redis_signal(s: &Signal) -> RedisSignal {
    let iso = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
            .unwrap_or_default()
    };
    let (source, name) = match &s.kind {
        SignalKind::Latency(l) => ("latency", l.event.clone()),
        SignalKind::Slowlog(e) => ("slowlog", e.command.clone()),
    };
    RedisSignal {
        source: source.into(),
        name,
        ended: iso(s.ended_ms()),
        duration_us: s.duration_us(),
        seen: iso(s.seen_ms),
    }
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

    /// What fd `fd` of process `tgid` is now, else (the watched process's) what it was at
    /// the last reading of its table. A forked child's table is not kept: its fd is named
    /// only while the child lives.
    fn fd(&mut self, tgid: Tid, fd: i32) -> Option<String> {
        if let Ok(p) = std::fs::read_link(format!("/proc/{tgid}/fd/{fd}")) {
            return Some(p.to_string_lossy().into_owned());
        }
        if tgid != self.pid {
            return None;
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

    fn role(&mut self, tgid: Tid, tid: Tid) -> Role {
        if tgid != self.pid {
            return Role::Child;
        }
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
    let mut d = crate::live::sched_delta(&r.before, &r.after);
    d.reclaim_ns = r.reclaim_ns;
    let role = names.role(r.tgid, r.tid);
    let mut s = Stall {
        ts: clock.format(r.start),
        ts_iso: clock.iso(r.start),
        at_us: (r.start - first) / 1000,
        who: ThreadRef {
            pid: r.tgid,
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
    name_reclaim(&mut s, r.tgid);
    s
}

/// A client-facing thread's stall that was mostly its own memory reclaim (measured, as the
/// full tier measures it): `memory-reclaim`, with the limit it reached. The rule is the full
/// tier's (findings.rs, `SchedSplit::reclaimed`): at least half of the stall.
fn name_reclaim(s: &mut Stall, tgid: Tid) {
    let Some(reclaim_us) = s.sched.as_ref().and_then(|x| x.reclaim_us) else {
        return;
    };
    if !matches!(s.who.thread, Role::Main | Role::IoThread) || reclaim_us * 2 < s.duration_us {
        return;
    }
    let limits = crate::live::cgroup::Cgroup::of(std::path::Path::new("/"), tgid)
        .map(|c| c.limits())
        .unwrap_or_default();
    let limit = match limits.memory_limit() {
        Some((name, b)) => format!(
            "its cgroup's memory limit ({name} {}) reached",
            crate::analyze::limits::mib(b)
        ),
        None => "the host short of free memory, or a parent cgroup's memory limit reached (no limit on its own cgroup)".into(),
    };
    s.finding = Some(crate::report::FindingId::MemoryReclaim);
    s.cause.push_str(&format!(
        "; it reclaimed memory itself for {} of these {}, {limit}: memory reclaim (measured by the kernel's memcg and direct reclaim tracepoints)",
        crate::units::human(reclaim_us),
        crate::units::human(s.duration_us)
    ));
}

/// A blocked call's stall: the call and its file, from the registers at the switch-out.
fn name_blocked(s: &mut Stall, r: &CheapRecord, names: &mut Names, uninterruptible: bool) {
    s.bound = Bound::AtLeast;
    let how = if uninterruptible {
        "in an uninterruptible wait (disk)"
    } else {
        "asleep"
    };
    let Some(sc) = call_of(r, r.tgid) else {
        s.cause = format!("cheap tier: the thread was blocked {how} outside a syscall (a page fault) from its switch-out to its switch-in");
        return;
    };
    s.kind = StallKind::SlowSyscall;
    s.syscall = Some(sc.name.to_string());
    s.target.fd = sc.fd;
    let mut how_named = "";
    s.target.path = match sc.fd {
        Some(fd) => names.fd(r.tgid, fd).or_else(|| {
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
    let whose = match r.tgid == names.pid {
        true => String::new(),
        false => format!(" in redis's forked child {} (a BGSAVE or AOF rewrite: it holds up no client, but its disk writes compete with redis's own)", r.tgid),
    };
    s.cause = format!(
        "cheap tier: {}({}) blocked {how}{whose} from the thread's switch-out to its switch-in (the call itself began a little before and ended a little after: at least this long){how_named}; which commands waited is known only to the full tier",
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
    let mut ac = cheap_ctx(w, &ctx);
    // Nothing is traced yet: the poller's and the log's set-up commands are not seen.
    ac.redis = attached::start_redis(w, &ctx, names.conf.as_ref(), None, true);
    w.identity = Some(super::follow::Identity::of(
        pid,
        &ctx.redis_conf,
        ctx.cwd.as_deref(),
    ));
    w.metrics.attached.set(1);
    w.metrics.attaches.inc();
    w.cheap = Seen {
        sample_period_ns: cfg.sample_period_ns as Nanos,
        threshold_ns: w.args.threshold,
        ..Seen::default()
    };
    say_watching(w, pid, &cfg);
    let mut recs = vec![];
    let mut carried = vec![];
    // redis's signs of a stall that ended before this (epoch ms) were the full tier's to see.
    let mut covered_ms = 0;
    while !w.want_stop(true) && !gone(pid) {
        // Before the ring is read: a stall redis signals is then read from the ring too,
        // and escalates as the cheap tier's own (its record came before redis's reply).
        let signals = tick_redis(w, &mut ac);
        recs.clear();
        let lost = t.poll(&mut recs);
        if lost > 0 {
            w.metrics.lost_events.inc_by(lost);
        }
        // What the cheap tier saw beside the last escalation and the full tier did not.
        recs.append(&mut carried);
        for r in &recs {
            count(w, r, &mut names, &ac.view.clock);
        }
        if !recs.is_empty() {
            w.cheap.trigger.get_or_insert(Trigger::Stall);
            if may_escalate(w) {
                carried = escalate(w, pid, (&mut t, &mut names), &mut ac);
                covered_ms = crate::redis_client::wall_ms();
            }
        }
        for sig in signals {
            if open_by_signal(w, &sig, covered_ms) {
                carried = escalate(w, pid, (&mut t, &mut names), &mut ac);
                covered_ms = crate::redis_client::wall_ms();
            }
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
    if let Some(r) = ac.redis.take() {
        r.stop();
    }
    eprintln!("stallscope: detached from {pid} (cheap tier)");
    Ok(true)
}

/// redis's log and poller: new lines kept, the poller's new connections taken (its first
/// command waits for that), and what its polls found new in redis's own signals.
fn tick_redis(w: &Watcher, ac: &mut AttachCtx) -> Vec<Signal> {
    let Some(r) = &mut ac.redis else {
        return vec![];
    };
    r.tick(crate::clock::now_mono(), attached::keep_ns(w));
    let own = &mut ac.view.own_conns;
    for (fd, since) in r.take_own_conns() {
        own.retain(|(f, _)| *f != fd);
        if own.len() >= 8 {
            own.remove(0);
        }
        own.push((fd, since));
    }
    r.take_signals()
}

/// Whether the open incident is to be escalated: its report is to be written (`--out`, no
/// report waiting for the writer, the hourly limit not reached: the full tier would cost
/// redis for a report nobody gets).
fn may_escalate(w: &mut Watcher) -> bool {
    w.args.out.is_some() && w.pending.is_none() && w.limit.would_allow(Instant::now())
}

/// A sign from redis that it stalled: opens an incident (true: to escalate) unless the last
/// escalation's full tier saw its time (redis stamps it to the second: one stamped in the
/// second the full tier detached is taken as that incident's), an incident is being
/// recorded or waits for the writer (the sign is of it, or joins it), or no report is to
/// be written.
fn open_by_signal(w: &mut Watcher, sig: &Signal, covered_ms: i64) -> bool {
    if sig.ended_ms() < covered_ms || w.grouper.open.is_some() || !may_escalate(w) {
        return false;
    }
    let signal = redis_signal(sig);
    eprintln!(
        "stallscope: redis signalled a stall the cheap tier did not find: {} {} of {} ending {} (seen {})",
        match signal.source.as_str() {
            "slowlog" => "a slow log entry for",
            _ => "the LATENCY event",
        },
        signal.name,
        crate::units::human(signal.duration_us),
        signal.ended,
        signal.seen,
    );
    w.grouper.open_by_signal(crate::clock::now_mono());
    w.cheap.trigger = Some(Trigger::Redis {
        signal,
        ended_ms: sig.ended_ms(),
    });
    true
}

/// A cheap record counted as a stall, and kept for its incident's report.
fn count(w: &mut Watcher, r: &CheapRecord, names: &mut Names, clock: &Clock) {
    let s = stall_of(r, names, clock, clock.first);
    w.on_stall(&s, r.start, r.end);
    w.cheap.stalls.push((s, r.start));
}

/// The full tier, attached until the open incident's report is handed to the writer, with
/// the cheap tier read beside it (`Beside`). Returns the cheap tier's records the full tier
/// did not see (begun before its attach or after its detach, read once it was gone), to
/// be counted as new.
fn escalate(
    w: &mut Watcher,
    pid: Tid,
    (feed, names): (&mut Feed, &mut Names),
    ac: &mut AttachCtx,
) -> Vec<CheapRecord> {
    w.cheap.escalated_at = Some(crate::clock::now_mono());
    w.cheap.escalated_ms = Some(crate::redis_client::wall_ms());
    w.cheap.escalated_iso = Some(iso_z(chrono::Utc::now()));
    let trigger = w.cheap.trigger.as_ref().map_or("stall", Trigger::as_str);
    w.metrics.escalation(trigger).inc();
    eprintln!(
        "stallscope: escalating ({trigger}): every syscall of {pid} traced until the incident is written"
    );
    let mut beside = Beside {
        feed,
        names,
        clock: ac.view.clock.clone(),
        counted: vec![],
        later: vec![],
        seen_from: false,
    };
    let (from, until) = match attached::escalate(w, pid, ac, &mut beside) {
        Ok(span) => span,
        Err(e) => {
            eprintln!("stallscope: warning: the full tier could not be attached: {e:#}; the incident's report will hold only the cheap tier's stalls");
            w.cheap.escalated_at = None;
            w.cheap.escalated_iso = None;
            w.cheap.escalated_ms = None;
            // Nothing was the full tier's.
            (Nanos::MAX, Nanos::MAX)
        }
    };
    let mut after = std::mem::take(&mut beside.later);
    let lost = beside.feed.poll(&mut after);
    if lost > 0 {
        w.metrics.lost_events.inc_by(lost);
    }
    after.retain(|r| r.start < from || r.start >= until);
    if from != Nanos::MAX {
        eprintln!("stallscope: back to the cheap tier");
    }
    after
}

fn iso_z(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// The cheap tier read while the full tier is attached: it counts what was already under
/// way at the full tier's attach (a sleep, a spin), which the full tier sees only part of
/// or not at all.
struct Beside<'t> {
    feed: &'t mut Feed,
    names: &'t mut Names,
    clock: Clock,
    /// The stalls it counted: thread, start, end.
    counted: Vec<(Tid, Nanos, Nanos)>,
    /// The others, until the full tier's detach is known: what began after it is not its.
    later: Vec<CheapRecord>,
    /// The report's `full_from` is set to the full tier's attach (it was the ask till then).
    seen_from: bool,
}

impl attached::CheapBeside for Beside<'_> {
    fn poll(&mut self, w: &mut Watcher, full_from: Nanos) {
        if !self.seen_from {
            self.seen_from = true;
            w.cheap.escalated_at = Some(full_from);
            if let Some(wall) = self.clock.wall_ns(full_from) {
                let t = chrono::DateTime::from_timestamp_nanos(wall);
                w.cheap.escalated_iso = Some(iso_z(t));
            }
        }
        let mut recs = vec![];
        let lost = self.feed.poll(&mut recs);
        if lost > 0 {
            w.metrics.lost_events.inc_by(lost);
        }
        for r in recs {
            if r.start < full_from {
                count(w, &r, self.names, &self.clock);
                self.counted.push((r.tid, r.start, r.end));
            } else {
                self.later.push(r);
            }
        }
    }

    fn counted(&self, tid: Tid, start: Nanos, end: Nanos) -> bool {
        (self.counted.iter()).any(|&(t, s, e)| t == tid && s < end && e > start)
    }
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
    // The full tier's part of a call already running at its attach, when the cheap tier
    // has the whole of it.
    let whole = |s: &Stall| {
        let (a, b) = (s.at_us, s.at_us + s.duration_us);
        seen.stalls.iter().any(|(c, start)| {
            let ca = (start - first) / 1000;
            c.who.tid == s.who.tid && ca < b && ca + c.duration_us > a
        })
    };
    let before = report.stalls.len();
    report
        .stalls
        .retain(|s| s.in_flight != Some(crate::event::InFlight::AtStart) || !whole(s));
    report.summary.stalls =
        (report.summary.stalls).saturating_sub((before - report.stalls.len()) as u64);
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
    if seen.stalls.iter().any(|(s, _)| s.who.thread == Role::Child) {
        notes.push("a forked child's (BGSAVE, AOF rewrite) call is named from its fd table when its record is read: a call just before the child closed the file or exited stays unnamed".into());
    }
    let signal = match &seen.trigger {
        Some(Trigger::Redis { signal, ended_ms }) => {
            notes.extend(signal_notes(seen, signal, *ended_ms));
            Some(signal.clone())
        }
        _ => None,
    };
    let full = match seen.escalated_at {
        Some(_) => "every syscall of the process from full_from until the report was written (the stalls without `cheap tier` in their cause, the commands, files and what followed)".to_string(),
        None => "nothing: the full tier was not attached (the stalls are the cheap tier's alone)".to_string(),
    };
    report.live.watch_tiers = Some(WatchTiers {
        trigger: seen
            .trigger
            .as_ref()
            .map_or("stall", Trigger::as_str)
            .to_string(),
        redis_signal: signal,
        cheap: "scheduler switches of every thread and the main thread's CPU time sampled: blocked syscalls and main-thread gaps over the threshold".into(),
        sample_period_us: period_us,
        cheap_stalls: seen.stalls.len() as u64,
        full_from: seen.escalated_iso.clone(),
        full,
        notes,
    });
}

/// What the report must say of an incident a sign from redis opened: the stall it signalled
/// was not seen by the cheap tier, and the full tier, attached after the poll found it, saw
/// only what followed.
fn signal_notes(seen: &Seen, signal: &RedisSignal, ended_ms: i64) -> Vec<String> {
    use crate::units::human;
    let what = match signal.source.as_str() {
        "slowlog" => format!("the slow log's entry for {}", signal.name),
        _ => format!("redis's LATENCY event `{}`", signal.name),
    };
    let why = if signal.duration_us * 1000 < seen.threshold_ns {
        format!(
            "it was shorter than --threshold ({}), which is all the cheap tier reports; redis's own threshold (latency-monitor-threshold, slowlog-log-slower-than) is lower",
            human(seen.threshold_ns / 1000)
        )
    } else {
        format!(
            "it was over --threshold ({}), and the cheap tier did not find it: the main thread made a read or write during it (a gap is a stretch with none), or it blocked where the cheap tier does not look, or it was shorter than two sampling periods of the main thread's CPU time in wall time",
            human(seen.threshold_ns / 1000)
        )
    };
    let mut notes = vec![format!(
        "this incident was opened by {what} ({} as redis measured it, ending {} to the second; the poll, once a second, saw it at {}), not by the cheap tier: {why}",
        human(signal.duration_us),
        signal.ended,
        signal.seen
    )];
    notes.push(match seen.escalated_ms {
        Some(at) => format!(
            "the full tier was asked for about {} after that stall ended (redis's stamp is to the second; the report's events begin once its programs were attached), so it saw only what followed: which commands and clients that stall held up, and what it waited on, are not in this report; redis's own account of it is in the `redis` section",
            human((at - ended_ms).max(0) * 1000)
        ),
        None => "the full tier could not be attached: neither tier saw the stall redis signalled; redis's own account of it is in the `redis` section".into(),
    });
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::incident::tests::stall;

    /// The full tier's part of a call already running at its attach goes when the cheap tier
    /// has the whole call; a call of another thread, or one the cheap tier has not, stays.
    #[test]
    fn the_full_tiers_part_of_a_call_the_cheap_tier_has_whole_is_dropped() {
        let ms = 1_000_000;
        let first = 1_000 * ms;
        let part = |tid: Tid, at_ms: i64, dur_ms: i64| {
            let mut s = stall(dur_ms * 1000, None);
            s.who.tid = tid;
            s.at_us = at_ms * 1000;
            s.bound = Bound::AtLeast;
            s.in_flight = Some(crate::event::InFlight::AtStart);
            s
        };
        // Thread 1's sleep, attached 200 ms in; thread 2's call the cheap tier did not see.
        let mut report = crate::report::Report {
            stalls: vec![part(1, 0, 400), part(2, 0, 300), stall(50_000, None)],
            ..Default::default()
        };
        report.summary.stalls = 3;
        let mut whole = stall(600_000, None);
        whole.cause = "cheap tier: the whole sleep".into();
        let seen = Seen {
            stalls: vec![(whole, first - 200 * ms)],
            sample_period_ns: 2 * ms,
            ..Seen::default()
        };
        into_report(&mut report, &seen, first);
        let got: Vec<(Tid, i64)> = (report.stalls.iter())
            .map(|s| (s.who.tid, s.duration_us))
            .collect();
        assert_eq!(
            got,
            vec![(1, 600_000), (2, 300_000), (1, 50_000)],
            "{:?}",
            report.stalls
        );
        assert_eq!(report.summary.stalls, 3);
    }

    /// A process that does not exist: nothing is read of it from /proc.
    const PID: Tid = 999_999_999;

    fn names() -> Names {
        Names {
            pid: PID,
            fds: HashMap::new(),
            fds_at: Instant::now(),
            comms: HashMap::new(),
            conf: None,
            cwd: None,
            log: None,
        }
    }

    /// A main-thread gap of 50 ms, 45 of it on a CPU, with `reclaim` ms measured reclaiming.
    fn gap(tgid: Tid, reclaim: Option<u64>) -> CheapRecord {
        let ms = 1_000_000u64;
        CheapRecord {
            owner: PID,
            tid: tgid,
            tgid,
            kind: CheapKind::Gap { samples: 20 },
            start: 10 * ms as Nanos,
            end: 60 * ms as Nanos,
            before: [0, 0, 0, 0],
            after: [45 * ms, 5 * ms, 0, 0],
            reclaim_ns: reclaim.map(|r| r * ms),
        }
    }

    #[test]
    fn a_gap_spent_reclaiming_is_memory_reclaim_as_the_full_tier_would_say() {
        let clock = crate::session::live_clock(0, 1_700_000_000_000_000_000);
        let mut n = names();
        let s = stall_of(&gap(PID, Some(40)), &mut n, &clock, 0);
        assert_eq!(s.finding, Some(crate::report::FindingId::MemoryReclaim));
        assert_eq!(s.sched.as_ref().and_then(|x| x.reclaim_us), Some(40_000));
        assert!(
            s.cause
                .contains("reclaimed memory itself for 40 ms of these 50 ms"),
            "{}",
            s.cause
        );
        assert!(s
            .cause
            .starts_with("cheap tier: the main thread made no read or write"));
        // Under half of the stall: the reclaim is in the split, the stall is not named by it.
        let s = stall_of(&gap(PID, Some(20)), &mut n, &clock, 0);
        assert_eq!(
            (s.finding, s.sched.unwrap().reclaim_us),
            (None, Some(20_000))
        );
        // Not measured (no reclaim programs): no reclaim part at all.
        let s = stall_of(&gap(PID, None), &mut n, &clock, 0);
        assert_eq!((s.finding, s.sched.unwrap().reclaim_us), (None, None));
        // A forked child's stall holds up no client: its reclaim is not a finding.
        let s = stall_of(&gap(PID + 1, Some(45)), &mut n, &clock, 0);
        assert_eq!((s.who.thread, s.finding), (Role::Child, None));
    }
}
