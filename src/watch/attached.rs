//! App layer, `watch`: one attachment of the watcher to one process. A live session
//! (`session::LiveSession`) is consumed by a `WatchSink`: the live analyzers (a window
//! replaced every `WINDOW`, the next one running beside it for `OVERLAP_NS`), the metrics'
//! observer and the history ring; stalls go to the watcher as they end, and finished
//! incidents to its writer.

use super::{host, incident, redis, Watcher, LONG_STALL_NS};
use crate::analyze::Analyzer;
use crate::event::{Event, Nanos, SchedSpan, Tid};
use crate::live::procctx;
use crate::live::{BackendChoice, TracerConfig};
use crate::report::Stall;
use crate::session::{LiveSession, Sink, Threads, Tick};
use crate::source::Clock;
use anyhow::Result;
use incident::SessionView;
use std::time::{Duration, Instant};

/// How long one live analyzer runs before it is replaced (its per-phase, per-file and
/// per-thread state is what would otherwise grow over days).
const WINDOW: Duration = Duration::from_secs(600);
/// How long the next analyzer runs beside the old one before it takes over: a gap or a
/// call that began before its start would otherwise be missed by both.
const OVERLAP_NS: Nanos = 30_000_000_000;

/// A live analyzer and what is needed to place its stalls in time.
pub(super) struct Window {
    pub an: Analyzer,
    /// The smallest syscall start it was given: the origin of its stalls' `at_us`.
    first_ts: Option<Nanos>,
    born: Instant,
}

impl Window {
    fn new(v: &SessionView) -> Window {
        let mut an = Analyzer::new(v.opts.clone());
        crate::session::seed(&mut an, v.pid, &v.fds, &v.thread_names, &v.own_conns);
        Window {
            an,
            first_ts: None,
            born: Instant::now(),
        }
    }

    fn push(&mut self, ev: &Event) {
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

/// What belongs to one attachment.
pub(super) struct AttachCtx {
    /// What each incident's analysis starts from, kept up to date.
    pub view: SessionView,
    /// The clock is kept in step with the wall clock (a live session's).
    pub resync: bool,
    /// /proc readings of the last minute or so, for the incidents' host sections.
    pub host: Option<host::Sampler>,
    /// redis's log and the --redis poller.
    pub redis: Option<redis::WatchRedis>,
}

/// The bpf ring of the full tier when `--mode cheap` attaches it for an incident (unless
/// --perf-pages says otherwise), in pages: 4 MiB, an eighth of the default. The ring is mapped
/// twice over (its data pages twice, by aya and by the reader) and all of it counts in RSS:
/// the default's 128 MiB would be most of the watcher's memory for seconds per incident,
/// where 4 MiB holds about 30,000 calls, a tenth of a second of a saturated redis, which the
/// reader empties every few ms (a drop is counted and reported, as always).
const ESCALATION_PAGES: usize = 1024;

/// Starts the tracer (`escalation`: for `--mode cheap`'s incident). `auto` must never end up
/// on ptrace: a watcher runs for days, and ptrace would slow redis that whole time.
fn start(w: &Watcher, pid: Tid, escalation: bool) -> Result<LiveSession> {
    // With one set of bpf programs for every instance, auto without them means perf; an
    // escalation of the cheap mode loads its own, for as long as its incident lasts.
    let backend = match (w.args.backend, w.inst.fleet) {
        (crate::cli::Backend::Auto, true) if w.inst.host.is_none() && !escalation => {
            BackendChoice::Perf
        }
        (b, _) => BackendChoice::from(b),
    };
    if backend == BackendChoice::Ptrace {
        eprintln!(
            "stallscope: warning: --backend ptrace stops every redis thread twice per syscall: a busy redis \
             runs at a fraction of its throughput (about 0.07x under redis-benchmark -t set -c 50) for as \
             long as the watch lasts; use it for short watches only"
        );
    }
    let cfg = TracerConfig {
        pid,
        backend,
        follow_forks: !w.args.no_follow_forks,
        pages: match escalation {
            true => w.args.perf_pages.or(Some(ESCALATION_PAGES)),
            false => w.args.perf_pages,
        },
        auto_may_stop: false,
    };
    if let Some(host) = &w.inst.host {
        let started = crate::live::start_on_host(host, &cfg)?;
        return Ok(LiveSession::live(
            started,
            pid,
            &w.opts,
            w.user_conf.clone(),
        ));
    }
    LiveSession::start(&cfg, &w.opts, w.user_conf.clone())
}

/// How long the host ring and the redis poller keep: what an incident can reach back to.
pub(super) fn keep_ns(w: &Watcher) -> Nanos {
    w.args.before + LONG_STALL_NS + incident::MAX_SPAN_NS + w.args.after
}

/// Traces process `pid` until it is gone or a stop is asked for.
pub(super) fn watch_one(w: &mut Watcher, pid: Tid) -> Result<()> {
    let log_src = log_before_attach(w, pid);
    let s = start(w, pid, false)?;
    watch_session(w, s, log_src, None).map(|_| ())
}

/// `--mode cheap`'s escalation: the full tier attached to `pid` until the open incident's
/// report is handed to the writer (or the process is gone, or a stop is asked for). The
/// cheap tier lends it its redis poller and log follower (`lent.redis`: one connection and
/// one follower across both tiers, so a log line or a latency sample from before the
/// escalation is still there for the report) and the fds of the poller's connections.
/// Returns when the full tier saw from and until (its attach and its detach, monotonic).
pub(super) fn escalate(
    w: &mut Watcher,
    pid: Tid,
    lent: &mut AttachCtx,
    beside: &mut dyn CheapBeside,
) -> Result<(Nanos, Nanos)> {
    let s = start(w, pid, true)?;
    watch_session(w, s, None, Some((lent, beside)))
}

/// The cheap tier beside an escalation's full tier. The full tier sees a call from its
/// entry and a gap from a syscall, so a stall already under way when its programs were
/// attached (the attach itself takes a while on a busy host) is the cheap tier's to count:
/// each drain of the full tier reads the cheap tier first.
pub(super) trait CheapBeside {
    /// Reads the cheap tier's new records: those begun before `full_from` are counted
    /// (`Watcher::on_stall`); the others are the full tier's.
    fn poll(&mut self, w: &mut Watcher, full_from: Nanos);
    /// Whether the cheap tier counted a stall of thread `tid` overlapping `start..end`: the
    /// full tier's part of a call already running at its attach is then not counted again.
    fn counted(&self, tid: Tid, start: Nanos, end: Nanos) -> bool;
}

/// What redis's log is, found before the attach: once traced, a `CONFIG GET` of our own
/// would count as a client's command.
fn log_before_attach(w: &Watcher, pid: Tid) -> Option<Option<crate::evidence::LogSource>> {
    let r = &w.args.from_redis;
    (r.redis.is_some() || r.redis_log.is_some()).then(|| {
        crate::evidence::log_source_before_attach(
            pid,
            r.redis_log.as_deref(),
            r.redis.as_deref(),
            w.opts.redis_conf.as_ref(),
        )
    })
}

/// Watches the session until its tracer is done (the process gone, or a stop asked for).
/// `lent`: the cheap tier's context, for an escalation (its redis sources are used and
/// given back).
pub(super) fn watch_session(
    w: &mut Watcher,
    mut s: LiveSession,
    log_src: Option<Option<crate::evidence::LogSource>>,
    escalation: Option<(&mut AttachCtx, &mut dyn CheapBeside)>,
) -> Result<(Nanos, Nanos)> {
    let (mut lent, beside) = match escalation {
        Some((l, b)) => (Some(l), Some(b)),
        None => (None, None),
    };
    let pid = s.pid;
    w.metrics.attached.set(1);
    w.metrics.attaches.inc();
    w.metrics.watch_cgroup(Some(pid));
    w.observer.reset_process();
    w.ring.clear();
    w.reported_upto = None;
    w.identity = Some(super::follow::Identity::of(
        pid,
        &s.ctx.redis_conf,
        s.ctx.cwd.as_deref(),
    ));
    let mut view = view_of(&s, w);
    let redis = match lent.as_deref_mut() {
        Some(l) => {
            view.own_conns.clone_from(&l.view.own_conns);
            l.redis.take()
        }
        None => start_redis(w, &s.ctx, s.opts.redis_conf.as_ref(), log_src, false),
    };
    let ac = AttachCtx {
        view,
        resync: s.live_clock,
        host: Some(host::Sampler::start(
            pid,
            host::INTERVAL,
            host::Keep::Last(Duration::from_nanos(keep_ns(w) as u64)),
        )),
        redis,
    };
    say_watching(w, &s);
    let mut sink = WatchSink::new(w, ac, s.clock.first);
    if let Some(b) = beside {
        sink.beside = Some(b);
    }
    let ran = s.run(&mut sink);
    let WatchSink { w, mut ac, .. } = sink;
    let st = s.end();
    // The process is gone or we are stopping: an incident being recorded is complete.
    if let Some(o) = w.grouper.open.take() {
        w.incident_due(o);
    }
    let stopping = w.want_stop(true);
    w.wait_writer_idle(Duration::from_millis(if stopping { 300 } else { 5000 }));
    w.hand_over(&ac, true);
    if let Some(h) = ac.host.take() {
        h.stop();
    }
    match lent {
        Some(l) => {
            l.redis = ac.redis.take();
            l.view.own_conns = std::mem::take(&mut ac.view.own_conns);
        }
        None => {
            if let Some(r) = ac.redis.take() {
                r.stop();
            }
        }
    }
    ran?;
    eprintln!(
        "stallscope: detached from {pid}: traced {} syscalls; {} lost",
        st.syscalls, st.lost_events
    );
    Ok((st.attach_mono, st.detach_mono))
}

/// What every incident of this attachment starts from.
fn view_of(s: &LiveSession, w: &Watcher) -> SessionView {
    SessionView {
        pid: s.pid,
        opts: s.opts.clone(),
        fds: s.ctx.fds.clone(),
        thread_names: s.threads.names.clone(),
        cwd: s.ctx.cwd.clone(),
        conf_text: s.conf_text.clone(),
        clock: s.clock.clone(),
        backend: s.backend,
        caps: s.caps,
        follow_forks: !w.args.no_follow_forks,
        own_conns: vec![],
        container: s.container.clone(),
    }
}

/// redis's log, followed, and the `--redis` poller, when asked for or when the config
/// (`conf`) names a log file. `log_src`: the log found before the attach (else found now,
/// from `ctx`); `signalling`: the cheap tier's poller, whose polls also look for redis's own
/// signs of a stall (`WatchRedis::take_signals`).
pub(super) fn start_redis(
    w: &Watcher,
    ctx: &procctx::ProcContext,
    conf: Option<&crate::analyze::RedisConf>,
    log_src: Option<Option<crate::evidence::LogSource>>,
    signalling: bool,
) -> Option<redis::WatchRedis> {
    let wanted = w.args.from_redis.redis.is_some()
        || w.args.from_redis.redis_log.is_some()
        || conf.is_some_and(|c| c.logfile.is_some());
    if !wanted {
        return None;
    }
    let src = log_src.unwrap_or_else(|| {
        redis::WatchRedis::log_source(
            w.args.from_redis.redis_log.as_deref(),
            w.args.from_redis.redis.as_deref(),
            ctx,
            conf,
        )
    });
    let r = redis::WatchRedis::start(w.args.from_redis.redis.as_deref(), ctx, src, signalling);
    if let Some(src) = r.followed() {
        eprintln!(
            "stallscope: following redis's log {} ({})",
            src.path, src.found
        );
    }
    if let Some(a) = &w.args.from_redis.redis {
        match signalling {
            true => eprintln!("stallscope: asking redis at {a} for LATENCY, INFO and the slow log's newest entries once a second (a new LATENCY event or slow log entry escalates to the full tier, as a stall does), SLOWLOG and LATENCY HISTORY once per incident"),
            false => eprintln!("stallscope: asking redis at {a} for LATENCY and INFO once a second, SLOWLOG and LATENCY HISTORY once per incident"),
        }
    }
    Some(r)
}

fn say_watching(w: &Watcher, s: &LiveSession) {
    use crate::units::{human, plural};
    eprintln!(
        "stallscope: watching {} ({} thread{}) with {} as instance {}; stalls over {}{}",
        s.pid,
        s.threads_at_attach,
        plural(s.threads_at_attach as u64),
        s.backend,
        w.inst.label,
        human(w.args.threshold / 1000),
        match &w.inst.out {
            Some(d) => format!(", incidents into {}", d.display()),
            None => String::new(),
        }
    );
}

/// Keeps `clock`'s wall time of the attach in step with the wall clock. The live clock is
/// the monotonic one, which a wall-clock step does not move (NTP stepping it, a VM paused and
/// resumed: a 30-minute soak here ran 10 s behind after one), so a watcher attached for days
/// would stamp its `--events` lines, incident names and reports ever further from the wall
/// clock. Moved only past 1 ms, so that the jitter of two clock reads never changes a stall's
/// printed time between its `--events` line and its report. True when it moved.
pub(super) fn resync_wall(clock: &mut Clock, mono_now: Nanos, wall_now: Nanos) -> bool {
    let wall_at_first = wall_now - (mono_now - clock.first);
    match clock.wall_at_first {
        Some(w) if (w - wall_at_first).abs() <= 1_000_000 => false,
        _ => {
            clock.wall_at_first = Some(wall_at_first);
            true
        }
    }
}

/// When the watch loop looks for new stalls and finished incidents: every 200 ms, and
/// after every eighth of what the ring can hold. A watcher catching up on a backlog (it
/// was descheduled on a loaded host while the kernel buffered redis's calls) pushes events
/// much faster than they happened: by wall time alone, a whole ring could pass between two
/// looks, evicting a stall before its incident was opened and held.
pub(super) struct DrainClock {
    last: Instant,
    since: usize,
    every: usize,
}

impl DrainClock {
    const PERIOD: Duration = Duration::from_millis(200);

    pub(super) fn new(ring_bytes: usize, now: Instant) -> DrainClock {
        DrainClock {
            last: now,
            since: 0,
            every: (ring_bytes / std::mem::size_of::<Event>() / 8).max(64),
        }
    }

    /// One turn of the loop (`event`: it brought one), at `now` when the loop read the
    /// clock (it reads it now and then, not at every event): true when it is time.
    pub(super) fn due(&mut self, event: bool, now: Option<Instant>) -> bool {
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

/// The watcher's consumer of one attachment.
pub(super) struct WatchSink<'w, 'a> {
    pub w: &'w mut Watcher<'a>,
    pub ac: AttachCtx,
    cur: Window,
    /// The analyzer being replaced, and when the new one takes over from it.
    prev: Option<(Window, Nanos)>,
    drains: DrainClock,
    /// The latest end of any event: the ring's clock.
    latest: Nanos,
    /// The full tier attached by `--mode cheap` for one incident (done once its report is
    /// handed to the writer): the cheap tier beside it.
    pub beside: Option<&'w mut dyn CheapBeside>,
    attach_mono: Nanos,
}

impl<'w, 'a> WatchSink<'w, 'a> {
    pub(super) fn new(w: &'w mut Watcher<'a>, ac: AttachCtx, attach_mono: Nanos) -> Self {
        WatchSink {
            cur: Window::new(&ac.view),
            prev: None,
            drains: DrainClock::new(w.args.ring_bytes(), Instant::now()),
            latest: attach_mono,
            beside: None,
            attach_mono,
            w,
            ac,
        }
    }

    /// Each window's new stalls, in order, those of the old one up to the switch and those
    /// of the new one after it.
    fn drain_stalls(&mut self) {
        // Before the full tier's stalls: a cheap record of a call is sent at the thread's
        // switch-in, before the call's exit reaches the full tier.
        if let Some(b) = self.beside.as_deref_mut() {
            b.poll(self.w, self.attach_mono);
        }
        let clock = &self.ac.view.clock;
        let mut found = vec![];
        let switch_at = self.prev.as_ref().map(|(_, s)| *s);
        if let Some((p, s)) = &mut self.prev {
            found.extend(p.drain(clock).into_iter().filter(|x| x.2 < *s));
        }
        found.extend(
            self.cur
                .drain(clock)
                .into_iter()
                .filter(|x| switch_at.is_none_or(|s| x.2 >= s)),
        );
        found.sort_by_key(|x| x.1);
        for (s, start, end) in &found {
            let cheap_has_it = s.in_flight == Some(crate::event::InFlight::AtStart)
                && (self.beside.as_deref()).is_some_and(|b| b.counted(s.who.tid, *start, *end));
            if !cheap_has_it {
                self.w.on_stall(s, *start, *end);
            }
        }
    }

    /// The --redis poller's connections since the last look: ours, not a client's.
    fn mark_own_conns(&mut self, now: Nanos) {
        let Some(r) = &mut self.ac.redis else { return };
        r.tick(now, keep_ns(self.w));
        for (fd, since) in r.take_own_conns() {
            self.cur.an.mark_own_connection(fd, since);
            if let Some((p, _)) = &mut self.prev {
                p.an.mark_own_connection(fd, since);
            }
            let own = &mut self.ac.view.own_conns;
            own.retain(|(f, _)| *f != fd);
            if own.len() >= 8 {
                own.remove(0);
            }
            own.push((fd, since));
        }
    }

    /// The old analyzer has handed over once every stall ending before the switch has
    /// surely been drained (a perf tracer holds records back briefly to order them); the
    /// current one is replaced once it has run for `WINDOW`.
    fn rotate(&mut self, now: Nanos, threads: &mut Threads) {
        if self
            .prev
            .as_ref()
            .is_some_and(|(_, s)| now > *s + 2_000_000_000)
        {
            self.prev = None;
            super::give_back_memory();
        }
        if self.prev.is_none() && self.cur.born.elapsed() >= WINDOW {
            let v = &mut self.ac.view;
            v.fds = procctx::gather(v.pid).fds;
            threads.refresh();
            v.thread_names = threads.names.clone();
            let next = Window::new(v);
            self.prev = Some((std::mem::replace(&mut self.cur, next), now + OVERLAP_NS));
        }
    }
}

impl Sink for WatchSink<'_, '_> {
    fn lost(&mut self, n: u64) {
        self.w.metrics.lost_events.inc_by(n);
        self.w.ring.note_lost(n);
        self.cur.an.add_lost_events(n);
        if let Some((p, _)) = &mut self.prev {
            p.an.add_lost_events(n);
        }
    }

    fn new_thread(&mut self, tid: Tid, name: &str) {
        self.cur.an.set_thread_name(tid, name);
        if let Some((p, _)) = &mut self.prev {
            p.an.set_thread_name(tid, name);
        }
        self.ac.view.thread_names.insert(tid, name.to_string());
        if let Some(c) = &mut self.ac.view.container {
            crate::live::container::learn_pid(c, tid);
        }
    }

    fn event(&mut self, slot: &mut Event, _threads: &Threads) {
        let ev = &*slot;
        self.cur.push(ev);
        if let Some((p, _)) = &mut self.prev {
            p.push(ev);
        }
        if let Some(sc) = ev.syscall() {
            let class = sc
                .fd
                .and_then(|fd| self.cur.an.file_class_at(ev.tid, fd, ev.ts));
            self.w.observer.observe(ev, class);
        }
        self.latest = self.latest.max(ev.end());
        // The ring takes what the event owns and copies the rest, compact, out of the
        // batch (cleared as a whole later).
        self.w.ring.push_from(slot, self.latest);
    }

    fn tick(&mut self, t: &mut Tick, threads: &mut Threads) {
        if t.look.is_some() && self.ac.resync {
            resync_wall(
                &mut self.ac.view.clock,
                crate::clock::now_mono(),
                crate::clock::now_wall(),
            );
        }
        if !(self.drains.due(t.got_event, t.look) || t.done) {
            return;
        }
        self.drain_stalls();
        let now = crate::clock::now_mono();
        self.mark_own_conns(now);
        if let Some(o) = self.w.grouper.take_due(now, self.w.ring.evicted_upto()) {
            self.w.incident_due(o);
        }
        self.w.hand_over(&self.ac, false);
        self.w.tick_metrics();
        if !t.done {
            self.rotate(now, threads);
        } else if self
            .prev
            .as_ref()
            .is_some_and(|(_, s)| now > *s + 2_000_000_000)
        {
            self.prev = None;
        }
    }

    fn want_stop(&mut self, look: bool) -> bool {
        self.w.want_stop(look)
            || (self.beside.is_some() && self.w.grouper.open.is_none() && self.w.pending.is_none())
    }

    fn spent(&mut self) -> &mut Vec<Box<SchedSpan>> {
        &mut self.w.ring.spent
    }
}
