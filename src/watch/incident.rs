//! `watch`'s incidents: which stalls make one incident (a stall opens it, or in the cheap
//! mode a sign from redis itself; stalls ending within `--after` of the last one join it),
//! when it is complete, the hourly rate limit,
//! and the writer thread that turns the incident's events (taken from the history ring)
//! into a report by running a fresh `Analyzer` over them: the same JSON and HTML as
//! `analyze`, plus the raw recording with `--record`. Files are created mode 0640 and
//! written under a temporary name, so a reader never sees half a report.

use crate::analyze::{Analyzer, Options};
use crate::event::{Event, Nanos, Tid};
use crate::report::Stall;
use crate::source::{Clock, Counters, SourceInfo};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// An incident never grows past this: a redis that stalls every second for an hour would
/// otherwise never get its report written (the ring is byte-bounded anyway).
pub(crate) const MAX_SPAN_NS: Nanos = 60_000_000_000;
/// Context before an incident's first stall that its report keeps at least, when the ring
/// cannot hold --before of it.
pub(crate) const KEEP_BEFORE_FIRST_NS: Nanos = 1_000_000_000;
/// Stalls remembered per incident (for its name and the summary line); all are counted.
const MAX_STALLS: usize = 64;

/// An incident being recorded.
pub(crate) struct Open {
    /// Start of its first stall and end of its last one (tracer clock).
    pub start: Nanos,
    pub end: Nanos,
    /// Write it when the tracer clock passes this.
    pub due: Nanos,
    pub stalls: Vec<Stall>,
    pub count: u64,
    /// It was opened by a sign from redis itself (`--mode cheap` with `--redis`), not a
    /// stall: it is written even if no tier saw a stall over the threshold.
    pub by_signal: bool,
}

impl Open {
    pub(crate) fn worst(&self) -> Option<&Stall> {
        self.stalls.iter().max_by_key(|s| s.duration_us)
    }

    /// An incident that finished while this one waited for the writer: one report for both.
    pub(crate) fn absorb(&mut self, o: Open) {
        self.end = self.end.max(o.end);
        self.due = self.due.max(o.due);
        self.count += o.count;
        self.by_signal |= o.by_signal;
        let room = MAX_STALLS.saturating_sub(self.stalls.len());
        self.stalls.extend(o.stalls.into_iter().take(room));
    }
}

/// Groups stalls into incidents.
pub(crate) struct Grouper {
    after: Nanos,
    pub open: Option<Open>,
}

impl Grouper {
    pub(crate) fn new(after: Nanos) -> Grouper {
        Grouper { after, open: None }
    }

    /// A stall that ran from `start` to `end` (tracer clock).
    pub(crate) fn add(&mut self, s: &Stall, start: Nanos, end: Nanos) {
        match &mut self.open {
            Some(o) => {
                o.end = o.end.max(end);
                o.due = (o.end + self.after).min(o.start + MAX_SPAN_NS).max(o.due);
                o.count += 1;
                if o.stalls.len() < MAX_STALLS {
                    o.stalls.push(s.clone());
                }
            }
            None => {
                self.open = Some(Open {
                    start,
                    end,
                    due: end + self.after,
                    stalls: vec![s.clone()],
                    count: 1,
                    by_signal: false,
                })
            }
        }
    }

    /// Opens an incident at `at` (tracer clock) for a sign from redis itself that it
    /// stalled, unless one is open (the sign joins it). It lasts `--after`; the stalls the
    /// full tier finds meanwhile join it as any do.
    pub(crate) fn open_by_signal(&mut self, at: Nanos) {
        self.open.get_or_insert(Open {
            start: at,
            end: at,
            due: at + self.after,
            stalls: vec![],
            count: 0,
            by_signal: true,
        });
    }

    /// The incident, once `now` is past its due time, or as soon as the history ring has
    /// had to drop (for lack of room) an event ending within `KEEP_BEFORE_FIRST_NS` of its
    /// first stall, `evicted_upto` being the newest such end: on a busy redis that stalls
    /// every few seconds, stalls would otherwise chain into one incident longer than the
    /// ring holds, and its report would miss how it began.
    pub(crate) fn take_due(&mut self, now: Nanos, evicted_upto: Option<Nanos>) -> Option<Open> {
        let due = self.open.as_ref().is_some_and(|o| {
            now >= o.due || evicted_upto.is_some_and(|t| t > o.start - KEEP_BEFORE_FIRST_NS)
        });
        if due {
            return self.open.take();
        }
        None
    }
}

/// `--max-incidents-per-hour`: the times of the reports written in the last hour.
pub(crate) struct RateLimit {
    max: u32,
    written: VecDeque<Instant>,
    /// Incidents not written since the last one that was.
    pub suppressed: u64,
}

impl RateLimit {
    pub(crate) fn new(max: u32) -> RateLimit {
        RateLimit {
            max,
            written: VecDeque::new(),
            suppressed: 0,
        }
    }

    /// Whether `allow` would let a report be written now (nothing is counted).
    pub(crate) fn would_allow(&mut self, now: Instant) -> bool {
        self.forget_older(now);
        self.written.len() < self.max as usize
    }

    fn forget_older(&mut self, now: Instant) {
        while self
            .written
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(3600))
        {
            self.written.pop_front();
        }
    }

    pub(crate) fn allow(&mut self, now: Instant) -> bool {
        self.forget_older(now);
        if self.written.len() >= self.max as usize {
            self.suppressed += 1;
            return false;
        }
        self.written.push_back(now);
        true
    }
}

/// What every incident of one attachment starts from: the session as the watcher holds it
/// (the process's fds and thread names kept up to date, the clock kept in step with the wall
/// clock, stallscope's own connections), cloned into each job.
#[derive(Clone)]
pub(crate) struct SessionView {
    pub pid: Tid,
    /// The session's analysis options (`LiveSession::opts`).
    pub opts: Options,
    pub fds: Vec<(i32, String)>,
    pub thread_names: HashMap<Tid, String>,
    pub cwd: Option<String>,
    /// The redis config the live analysis used, kept beside a recording.
    pub conf_text: Option<String>,
    pub clock: Clock,
    pub backend: crate::report::LiveBackend,
    pub caps: crate::live::Capabilities,
    pub follow_forks: bool,
    /// The traced redis's fds of stallscope's own poller connections.
    pub own_conns: Vec<(i32, Nanos)>,
    /// The container redis runs in, with the pids of the processes seen so far.
    pub container: Option<crate::report::Container>,
}

/// Everything the writer needs to make one incident's files.
pub(crate) struct Job {
    pub events: std::collections::VecDeque<Event>,
    /// Records the tracer lost before the event at each index (`ring::Taken`).
    pub lost: Vec<(usize, u64)>,
    pub session: SessionView,
    /// What the files are named (`base_name`, `signal_name`).
    pub base: String,
    pub count: u64,
    /// Incidents that finished while this one waited for the writer, and are in its report.
    pub joined: u64,
    /// Incidents not written (rate limit) since the previous report.
    pub suppressed: u64,
    /// Events the history ring dropped for lack of room before --before had passed.
    pub ring_short: bool,
    /// /proc readings over the events' span (`host`).
    pub host: Vec<super::host::Raw>,
    /// redis's log lines and the --redis poller (`redis`).
    pub redis: Option<super::redis::IncidentRedis>,
    pub dir: PathBuf,
    pub record: bool,
    /// `--mode cheap`: the cheap tier's stalls of this incident (not in `events`).
    pub cheap: Option<super::cheap::Seen>,
}

/// What became of a job.
pub(crate) enum Outcome {
    Written(PathBuf),
    Failed(String),
}

/// `2026-12-01T07-30-12.345Z-command`: the time (UTC, sortable, no `:` for the sake of
/// other file systems and tools) and the finding.
pub(crate) fn base_name(first: &Stall, worst: &Stall) -> String {
    let t = first
        .ts_iso
        .as_deref()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| {
            t.with_timezone(&chrono::Utc)
                .format("%Y-%m-%dT%H-%M-%S%.3fZ")
                .to_string()
        })
        .unwrap_or_else(|| {
            chrono::Utc::now()
                .format("%Y-%m-%dT%H-%M-%S%.3fZ")
                .to_string()
        });
    let what = worst
        .finding
        .map(|f| f.as_str().to_string())
        .unwrap_or_else(|| match worst.kind {
            crate::report::StallKind::Gap => "gap".into(),
            crate::report::StallKind::SlowSyscall => {
                format!("slow-{}", worst.syscall.as_deref().unwrap_or("syscall"))
            }
        });
    let what: String = what
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(48)
        .collect();
    format!("{t}-{what}")
}

/// The name of an incident that only a sign from redis opened (no tier saw a stall over the
/// threshold): `2026-12-01T07-30-12.345Z-redis-latency-command`, from when it was opened
/// (`at_iso`) and what redis said.
pub(crate) fn signal_name(at_iso: &str, signal: &crate::report::RedisSignal) -> String {
    let t = chrono::DateTime::parse_from_rfc3339(at_iso)
        .map(|t| t.with_timezone(&chrono::Utc))
        .unwrap_or_else(|_| chrono::Utc::now())
        .format("%Y-%m-%dT%H-%M-%S%.3fZ");
    let what: String = format!(
        "redis-{}-{}",
        signal.source,
        signal.name.to_ascii_lowercase()
    )
    .chars()
    .map(|c| {
        if c.is_ascii_alphanumeric() || c == '-' {
            c
        } else {
            '-'
        }
    })
    .take(48)
    .collect();
    format!("{t}-{what}")
}

/// Creates `path` for writing, mode 0640 (owner and group: an incident names files and
/// commands of the service, which is not for every user of the host).
fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .open(path)
}

/// Writes with `f` to `DIR/NAME.stallscope-tmp`, then renames it to `DIR/NAME`.
fn write_atomic(
    dir: &Path,
    name: &str,
    f: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<PathBuf> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.stallscope-tmp"));
    let res = (|| {
        let file = create_private(&tmp)?;
        let mut w = std::io::BufWriter::new(file);
        f(&mut w)?;
        w.flush()?;
        w.get_ref().sync_data()?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path)
}

/// The event as a recording may keep it: a buffer's bytes (bpf and ptrace read the first
/// bytes of requests and replies, keys and values included) become the command name alone,
/// or nothing.
fn redacted(ev: &Event) -> std::borrow::Cow<'_, Event> {
    use crate::event::{Data, EventKind, Extra};
    let EventKind::Syscall(sc) = &ev.kind else {
        return std::borrow::Cow::Borrowed(ev);
    };
    let Extra::Data(d) = &sc.extra else {
        return std::borrow::Cow::Borrowed(ev);
    };
    let mut e = ev.clone();
    if let EventKind::Syscall(sc2) = &mut e.kind {
        sc2.extra = match super::metrics::command_name(d.head().bytes()) {
            Some(name) => Extra::Data(Data::new(
                format!("*1\r\n${}\r\n{name}\r\n", name.len()).as_bytes(),
                true,
            )),
            None => Extra::None,
        };
    }
    std::borrow::Cow::Owned(e)
}

/// The incident's /proc samples and what they say, as `attach` puts them in its report,
/// plus the main thread's scheduling over the incident and over its longest stalls.
fn add_host(report: &mut crate::report::Report, raw: &[super::host::Raw], first_ts: Nanos) {
    if raw.len() < 2 {
        return;
    }
    let samples = super::host::samples(raw, first_ts);
    crate::live::procctx::attach_host_context(report, samples, super::host::INTERVAL);
    let mut notes = vec![];
    if let (Some(a), Some(b)) = (raw.first(), raw.last()) {
        notes.extend(super::host::sched_note(
            raw,
            a.mono,
            b.mono,
            "over the incident",
        ));
    }
    let mut longest: Vec<&Stall> = report.stalls.iter().collect();
    longest.sort_by_key(|s| std::cmp::Reverse(s.duration_us));
    for s in longest.into_iter().take(3) {
        let from = first_ts + s.at_us * 1000;
        let what = format!(
            "during the {:.1} ms {} stall of {} at {}",
            s.duration_us as f64 / 1000.0,
            s.syscall.as_deref().unwrap_or("gap"),
            s.who.thread,
            s.ts
        );
        notes.extend(super::host::sched_note(
            raw,
            from,
            from + s.duration_us * 1000,
            &what,
        ));
    }
    if let Some(h) = &mut report.live.host {
        h.notes.extend(notes);
    }
}

/// Runs the analysis over the incident's events and writes its files. Returns the JSON
/// report's path.
pub(crate) fn write(job: Job) -> Outcome {
    let out = match write_inner(job) {
        Ok(p) => Outcome::Written(p),
        Err(e) => Outcome::Failed(e),
    };
    give_back_freed_memory();
    out
}

/// The incident's events, analysis and report are freed by now, mostly below live
/// allocations, where glibc keeps the pages: an incident of a saturated redis left the
/// watcher's RSS tens of MB above its floor until the next one reused them. Trimming hands
/// the free pages back (a few milliseconds, once per incident).
fn give_back_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory of glibc's heap to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn write_inner(mut job: Job) -> Result<PathBuf, String> {
    let base = job.base.clone();
    let dir = job.dir.clone();
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("--out {}: cannot create it: {e}", dir.display()))?;
    let report = analyse(&mut job);
    let fail = |what: &str, e: std::io::Error| {
        format!("--out {}: cannot write {base}.{what}: {e}", dir.display())
    };
    write_atomic(&dir, &format!("{base}.html"), |w| {
        crate::render::html::render(&report, w)
    })
    .map_err(|e| fail("html", e))?;
    if job.record {
        record(&job, &dir.join(format!("{base}.strace"))).map_err(|e| fail("strace", e))?;
    }
    // The JSON is written last: whoever picks incidents up by their .json (a script, an
    // alert's runbook, the tests) finds the HTML and the recording already beside it.
    let json = write_atomic(&dir, &format!("{base}.json"), |w| {
        crate::render::json::render(&report, w)
    })
    .map_err(|e| fail("json", e))?;
    Ok(json)
}

/// The incident's report: its events analysed as the live session was (seeded the same
/// way, losses where they happened, as a replay of the recording reads them from its
/// `.lost` sidecar), enriched as `attach` enriches its own, with the incident's window.
fn analyse(job: &mut Job) -> crate::report::Report {
    let v = &job.session;
    let mut opts = v.opts.clone();
    // The report's plot wants its context calls, as `attach --html` keeps them.
    opts.timeline_floor_ns = Some((opts.threshold_ns / 10).max(100_000));
    let mut an = Analyzer::new(opts);
    crate::session::seed(&mut an, v.pid, &v.fds, &v.thread_names, &v.own_conns);
    let mut marks = job.lost.iter().peekable();
    for (i, ev) in job.events.iter().enumerate() {
        while let Some((_, n)) = marks.next_if(|(at, _)| *at <= i) {
            an.add_lost_events(*n);
        }
        an.push(ev);
    }
    for (_, n) in marks {
        an.add_lost_events(*n);
    }
    let first_ts = job
        .events
        .iter()
        .filter(|e| e.syscall().is_some())
        .map(|e| e.ts)
        .min()
        .unwrap_or(v.clock.first);
    let forks = if v.follow_forks {
        ", following forks"
    } else {
        ""
    };
    let info = SourceInfo {
        kind: crate::report::SourceKind::Live,
        files: vec![],
        format: format!("stallscope watch ({}{forks})", v.backend),
        pid: Some(v.pid),
        clock: v.clock.clone(),
    };
    let steal = super::host::steal_readings(&job.host);
    an.host_readings(super::host::cg_readings(&job.host), steal);
    let mut report = an.finish(info, Counters::default());
    let span = job.events.back().map_or(0, |e| e.end()) - first_ts;
    // The watcher does not measure its own cost per incident (its metrics do).
    crate::session::enrich(
        &mut report,
        &crate::session::Enrichment {
            backend: v.backend,
            caps: v.caps,
            stats: None,
            container: v.container.clone(),
            watch: Some(crate::analyze::findings::WatchWindow {
                stalls: job.count,
                threshold_ns: v.opts.threshold_ns,
                span_ns: span,
                ring_short: job.ring_short,
                suppressed: job.suppressed,
                joined: job.joined,
                opened_by: job.cheap.as_ref().and_then(super::cheap::Seen::opened_by),
            }),
        },
    );
    if let Some(seen) = &job.cheap {
        super::cheap::into_report(&mut report, seen, first_ts);
    }
    add_host(&mut report, &job.host, first_ts);
    let root = std::path::Path::new("/");
    if let Some(cg) = crate::live::cgroup::Cgroup::of(root, v.pid) {
        super::host::add_cgroup(&mut report, &cg, cg.limits(), &job.host, first_ts);
    }
    if let Some(r) = job.redis.take() {
        // A log that cannot be read is a note in the report, never a lost incident.
        if let Err(e) = r.apply(&mut report) {
            eprintln!("stallscope: warning: incident: redis's own signals not joined: {e:#}");
        }
    }
    report
}

/// The incident's events as a recording (`attach --record`'s shape and sidecars), so that
/// `analyze` of it gives this report: buffers reduced to command names (`redacted`).
fn record(job: &Job, path: &Path) -> std::io::Result<()> {
    let v = &job.session;
    let store = crate::recording::FileStore::private(path.to_string_lossy().into_owned());
    let mut r = crate::recording::RecordingWriter::start(
        store,
        &crate::recording::RecordingStart {
            pid: v.pid,
            first: v.clock.first,
            wall_at_first: v.clock.wall_at_first.unwrap_or(0),
            cwd: v.cwd.clone(),
            fds: &v.fds,
            sched_floor: v.caps.splits_sched.then_some(v.opts.threshold_ns / 10),
            arrivals: v.caps.dates_arrivals == Some(true),
            stops_tracee: v.caps.stops_tracee,
        },
    )?;
    let mut marks = job.lost.iter().peekable();
    for (i, ev) in job.events.iter().enumerate() {
        while let Some((_, n)) = marks.next_if(|(at, _)| *at <= i) {
            r.note_lost(*n);
        }
        r.write_event(&redacted(ev))?;
    }
    for (_, n) in marks {
        r.note_lost(*n);
    }
    r.finish(
        &v.thread_names,
        v.conf_text.as_deref(),
        v.container.as_ref(),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn stall(dur_us: i64, finding: Option<&str>) -> Stall {
        Stall {
            ts: "07:30:12.345678".into(),
            ts_iso: Some("2026-12-01T08:30:12.345678+01:00".into()),
            who: crate::report::ThreadRef {
                pid: 1,
                tid: 1,
                thread: "main".into(),
            },
            syscall: Some("nanosleep".into()),
            finding: finding.map(crate::report::FindingId::from),
            ..Stall::sample(0, dur_us)
        }
    }

    #[test]
    fn overlapping_stalls_make_one_incident() {
        let s = 1_000_000_000;
        let mut g = Grouper::new(5 * s);
        g.add(&stall(300_000, None), 10 * s, 10 * s + 300_000_000);
        assert!(g.take_due(14 * s, None).is_none());
        // Within --after of the first: joins it and pushes the due time.
        g.add(
            &stall(500_000, Some("command")),
            14 * s,
            14 * s + 500_000_000,
        );
        assert!(g.take_due(16 * s, None).is_none());
        let o = g.take_due(20 * s, None).expect("due");
        assert_eq!(o.count, 2);
        assert_eq!(o.worst().unwrap().duration_us, 500_000);
        assert!(g.take_due(100 * s, None).is_none());
        // A later stall opens a new one.
        g.add(&stall(300_000, None), 30 * s, 30 * s + 300_000_000);
        assert_eq!(g.take_due(36 * s, None).unwrap().count, 1);
    }

    #[test]
    fn an_incident_that_never_ends_is_still_written() {
        let s = 1_000_000_000;
        let mut g = Grouper::new(5 * s);
        let mut written = 0;
        for t in 0..200 {
            g.add(&stall(100_000, None), t * s, t * s + 100_000_000);
            if g.take_due(t * s + 200_000_000, None).is_some() {
                written += 1;
            }
        }
        assert!(written >= 2, "{written}");
    }

    #[test]
    fn an_incident_is_written_before_the_ring_loses_its_start() {
        let s = 1_000_000_000;
        let mut g = Grouper::new(5 * s);
        g.add(&stall(100_000, None), 10 * s, 10 * s + 100_000_000);
        g.add(&stall(100_000, None), 13 * s, 13 * s + 100_000_000);
        // The ring has dropped only what ended 2 s before the first stall: not yet.
        assert!(g.take_due(14 * s, Some(8 * s)).is_none());
        // It dropped an event ending within 1 s of the first stall: write what it holds.
        assert_eq!(g.take_due(14 * s, Some(9 * s + s / 2)).unwrap().count, 2);
    }

    #[test]
    fn rate_limit_counts_what_it_drops() {
        let mut r = RateLimit::new(2);
        let t0 = Instant::now();
        assert!(r.allow(t0));
        assert!(r.allow(t0 + Duration::from_secs(1)));
        assert!(!r.would_allow(t0 + Duration::from_secs(2)));
        assert_eq!(r.suppressed, 0, "asking is not suppressing");
        assert!(!r.allow(t0 + Duration::from_secs(2)));
        assert_eq!(r.suppressed, 1);
        assert!(r.allow(t0 + Duration::from_secs(3601)));
    }

    #[test]
    fn names_sort_by_utc_time_and_say_the_finding() {
        assert_eq!(
            base_name(&stall(1, None), &stall(1, Some("command"))),
            "2026-12-01T07-30-12.345Z-command"
        );
        assert_eq!(
            base_name(&stall(1, None), &stall(1, None)),
            "2026-12-01T07-30-12.345Z-slow-nanosleep"
        );
    }

    #[test]
    fn unwritable_dir_is_an_error_not_a_panic() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("not-a-dir");
        std::fs::write(&file, "x").unwrap();
        let err = write_atomic(&file, "a.json", |w| w.write_all(b"{}")).unwrap_err();
        assert!(err.kind() != std::io::ErrorKind::Other || !err.to_string().is_empty());
        let p = write_atomic(tmp.path(), "b.json", |w| w.write_all(b"{}")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o007, 0, "{mode:o}");
    }

    /// A job of three calls of the main thread, the middle one slow, with records lost
    /// before it and (bpf) its scheduler split.
    fn job(dir: &Path, backend: crate::report::LiveBackend) -> Job {
        use crate::event::{EventKind, SchedDelta, SchedSpan, Syscall};
        let ms = 1_000_000;
        let call = |name: &'static str, ts: Nanos, dur: Nanos, sched: bool| {
            let mut sc = Syscall::new(name);
            sc.dur = Some(dur);
            sc.ret = crate::event::Ret::Val(0);
            if sched {
                let d = SchedDelta {
                    on_cpu_ns: 1_000,
                    runnable_ns: dur as u64 - 1_000,
                    minor_faults: 0,
                    major_faults: 0,
                    throttled_ns: None,
                    reclaim_ns: None,
                };
                sc.sched = Some(Box::new(SchedSpan {
                    during: d,
                    before: None,
                }));
            }
            Event {
                tid: 100,
                ts,
                line: 0,
                kind: EventKind::Syscall(sc),
            }
        };
        let events = [
            call("getpid", 10 * ms, ms / 10, false),
            call("getppid", 11 * ms, ms / 10, false),
            call("sched_yield", 12 * ms, 300 * ms, true),
            call("getpid", 313 * ms, ms / 10, false),
        ]
        .into();
        let bpf = backend == crate::report::LiveBackend::Bpf;
        Job {
            events,
            lost: vec![(2, 5)],
            session: SessionView {
                pid: 100,
                opts: Options::default(),
                fds: vec![],
                thread_names: [(100, "redis-server".to_string())].into_iter().collect(),
                cwd: None,
                conf_text: None,
                clock: Clock {
                    fmt: crate::source::TimeFmt::Epoch,
                    perf: false,
                    frac_digits: 6,
                    first: 0,
                    date: None,
                    wall_at_first: Some(1_700_000_000_000_000_000),
                },
                backend,
                caps: crate::live::Capabilities {
                    stops_tracee: false,
                    reads_buffers: bpf,
                    splits_sched: bpf,
                    dates_arrivals: bpf.then_some(true),
                    splits_throttle: false,
                },
                follow_forks: true,
                own_conns: vec![],
                container: None,
            },
            base: base_name(&stall(300_000, None), &stall(300_000, None)),
            count: 1,
            joined: 0,
            suppressed: 0,
            ring_short: false,
            host: vec![],
            redis: None,
            dir: dir.to_path_buf(),
            record: true,
            cheap: None,
        }
    }

    #[test]
    fn the_cheap_tiers_stalls_go_into_the_report_with_what_each_tier_saw() {
        let tmp = tempfile::tempdir().unwrap();
        let mut j = job(tmp.path(), crate::report::LiveBackend::Bpf);
        let ms = 1_000_000;
        // A 400 ms gap the cheap tier found 500 ms before the full tier's first call.
        let mut gap = stall(400_000, None);
        gap.cause = "cheap tier: a gap".into();
        gap.duration_known = crate::report::DurationKnown::Sampled;
        j.cheap = Some(super::super::cheap::Seen {
            stalls: vec![(gap, 10 * ms - 500 * ms)],
            sample_period_ns: 2 * ms,
            escalated_at: Some(10 * ms - 50 * ms),
            escalated_iso: Some("2026-12-06T21:00:00.000000Z".into()),
            trigger: Some(super::super::cheap::Trigger::Stall),
            ..Default::default()
        });
        j.record = false;
        let Outcome::Written(json) = write(j) else {
            panic!("not written")
        };
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let stalls = r["stalls"].as_array().unwrap();
        assert_eq!(stalls.len(), 2, "{stalls:?}");
        // In time order: the cheap tier's first, placed 500 ms before the first call.
        assert_eq!(stalls[0]["cause"], "cheap tier: a gap");
        assert_eq!(stalls[0]["at_us"], -500_000);
        assert_eq!(stalls[0]["duration_known"], "sampled");
        assert_eq!(stalls[1]["syscall"], "sched_yield");
        assert_eq!(r["summary"]["stalls"], 2);
        let t = &r["watch_tiers"];
        assert_eq!(t["cheap_stalls"], 1);
        assert_eq!(t["trigger"], "stall");
        assert!(t.get("redis_signal").is_none(), "{t}");
        assert_eq!(t["sample_period_us"], 2000);
        assert_eq!(t["full_from"], "2026-12-06T21:00:00.000000Z");
        assert!(t["notes"].as_array().unwrap().len() >= 3, "{t}");
        // A full-mode report has no watch_tiers.
        let Outcome::Written(json) = write(job(tmp.path(), crate::report::LiveBackend::Perf))
        else {
            panic!("not written")
        };
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert!(r.get("watch_tiers").is_none());
    }

    /// An incident a LATENCY event opened, in which neither tier saw a stall over the
    /// threshold: written, named after the event, and saying that the full tier saw only
    /// what followed.
    #[test]
    fn an_incident_opened_by_redis_says_so() {
        use super::super::cheap::{Seen, Trigger};
        let tmp = tempfile::tempdir().unwrap();
        let mut j = job(tmp.path(), crate::report::LiveBackend::Bpf);
        j.events
            .retain(|e| e.syscall().is_some_and(|s| s.name != "sched_yield"));
        j.count = 0;
        j.record = false;
        j.session.opts.threshold_ns = 2_000_000_000;
        let signal = crate::report::RedisSignal {
            source: "latency".into(),
            name: "command".into(),
            ended: "2026-12-06T21:00:00.000Z".into(),
            duration_us: 300_000,
            seen: "2026-12-06T21:00:00.400Z".into(),
        };
        let seen = Seen {
            sample_period_ns: 2_000_000,
            escalated_at: Some(0),
            escalated_iso: Some("2026-12-06T21:00:00.420000Z".into()),
            escalated_ms: Some(1_796_590_800_420),
            trigger: Some(Trigger::Redis {
                signal,
                ended_ms: 1_796_590_800_000,
            }),
            threshold_ns: 2_000_000_000,
            ..Default::default()
        };
        let name = seen.signal_name().unwrap();
        assert_eq!(name, "2026-12-06T21-00-00.420Z-redis-latency-command");
        j.base = name;
        j.cheap = Some(seen);
        let Outcome::Written(json) = write(j) else {
            panic!("not written")
        };
        assert!(json.ends_with("2026-12-06T21-00-00.420Z-redis-latency-command.json"));
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let t = &r["watch_tiers"];
        assert_eq!(t["trigger"], "latency-event");
        assert_eq!(t["redis_signal"]["duration_us"], 300_000);
        assert_eq!(t["cheap_stalls"], 0);
        let notes = t["notes"].to_string();
        assert!(
            notes.contains("shorter than --threshold (2.00 s)"),
            "{notes}"
        );
        assert!(notes.contains("about 420 ms after"), "{notes}");
        assert!(notes.contains("saw only what followed"), "{notes}");
        let titles: Vec<&str> = r["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["title"].as_str())
            .collect();
        assert!(
            titles.contains(
                &"Incident caught by stallscope watch on redis's LATENCY event: 0 stalls over 2.00 s"
            ),
            "{titles:?}"
        );
    }

    #[test]
    fn a_recording_has_its_losses_and_scheduler_split_at_their_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let Outcome::Written(json) = write(job(tmp.path(), crate::report::LiveBackend::Bpf)) else {
            panic!("not written")
        };
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(report["summary"]["lost_events"], 5);
        // Where its command latencies start, as `attach` says it.
        assert_eq!(report["summary"]["command_start"], "arrival");
        let stem = json.to_str().unwrap().strip_suffix(".json").unwrap();
        let rec = std::fs::read_to_string(format!("{stem}.strace")).unwrap();
        let line_of = |what: &str| {
            rec.lines()
                .position(|l| l.contains(what))
                .unwrap_or_else(|| panic!("no {what} in {rec}")) as u64
                + 1
        };
        let lost = std::fs::read_to_string(format!("{stem}.strace.lost")).unwrap();
        let mut marks = crate::recording::LostMarks::parse(&lost).unwrap();
        // The five lost records came before the slow call, after the second.
        let at = line_of("sched_yield(");
        assert_eq!(marks.before(at - 1), 0, "{lost}");
        assert_eq!(marks.before(at), 5, "{lost}");
        let sched = std::fs::read_to_string(format!("{stem}.strace.sched")).unwrap();
        let split = crate::recording::strace::parse_sched(&sched).unwrap();
        assert_eq!(
            split.keys().copied().collect::<Vec<_>>(),
            vec![at],
            "{sched}"
        );
        // A tracer that does not split calls leaves no .sched, and without losses no .lost.
        let mut j = job(tmp.path(), crate::report::LiveBackend::Perf);
        j.lost.clear();
        let mut first = stall(300_000, None);
        first.ts_iso = Some("2026-12-01T09:30:12.345678+01:00".into());
        j.base = base_name(&first, &first);
        let Outcome::Written(json) = write(j) else {
            panic!("not written")
        };
        let stem = json.to_str().unwrap().strip_suffix(".json").unwrap();
        assert!(Path::new(&format!("{stem}.strace")).exists());
        assert!(!Path::new(&format!("{stem}.strace.lost")).exists());
        assert!(!Path::new(&format!("{stem}.strace.sched")).exists());
    }
}
