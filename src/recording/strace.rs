//! `attach --record FILE`: writes the live events as strace text in the shape of
//! `strace -f --timestamps=unix,ns -T --syscall-times=ns -y`, so `stallscope analyze FILE`
//! (or any strace reader) can read the incident again later, and `analyze` gives the report
//! `attach` gave. It sits beside the analyzer at the end of the live pipeline and sees the
//! same events in the same order (each call is written when it returns, stamped with its
//! start, as strace does for a call that no other thread interrupted).
//!
//! Times are written to the nanosecond, as the live clock has them: truncated to µs, a gap
//! between two calls could read back up to 2 µs longer than it was, and cross the threshold.
//!
//! `-y` annotations come from a small fd map of its own: seeded from /proc/PID/fd at attach
//! and kept up to date from open/close/dup results, so a file opened before the attach is
//! still named in the recording. Thread names, which strace text cannot hold, go to a
//! `FILE.threads` sidecar in the `--threads` format, and the redis config the live analysis
//! used (from /proc, or `--redis-conf`) to `FILE.redis.conf`, and the records the kernel
//! dropped (perf and bpf backends), with where in the stream, to `FILE.lost`, and the
//! scheduler's split of the longer calls and gaps (bpf and perf backends) to `FILE.sched`, and
//! when each socket read's data arrived (bpf backend) to `FILE.arrivals`; `analyze FILE` reads
//! them all.
//!
//! The edges of the trace carry what strace text has no words for. The attach is written as
//! strace's own `Process N attached` message, stamped, so a reader knows the traced process.
//! A call already running at attach is written as strace writes it, a resumed half with no
//! entry (`<... close resumed>`), with its fd inside it and its duration measured from the
//! attach. A call still running at detach is written as an entry half that never resumes
//! (`close(7</x> <unfinished ...>`), which readers treat as in flight at the end and time up
//! to the last timestamp of the trace; at the detach each such call gets one more line,
//! `<... close resumed> <unfinished ...>` stamped with the detach, so that last timestamp is
//! the moment tracing ended, which is how long the live side timed the call. The detach is
//! not written as a `Process N detached` message: a reader would put it before the calls it
//! leaves in flight (it only emits those at the end of input), and the gap before them would
//! be lost.

use crate::event::{
    Event, EventKind, Extra, InFlight, Nanos, Ret, SchedDelta, SchedSpan, Syscall, Tid,
};
use crate::syscalls::{fd_effect, ArgKind, FdEffect, FdKind};
use std::collections::HashMap;
use std::io::Write;

/// Beside a recording FILE: the redis config the live analysis used (`FILE.redis.conf`).
pub const CONF_SUFFIX: &str = ".redis.conf";

/// Beside a recording FILE: the records the kernel dropped while it was made (`FILE.lost`),
/// as `LINE COUNT` lines: COUNT were lost before the event on LINE of FILE. Where in the
/// stream matters as much as how many: the live analysis marks the stalls it finds after a
/// loss as possibly incomplete, and the replay must mark the same ones. A recording without
/// the file lost nothing (or was made before losses were recorded).
pub const LOST_SUFFIX: &str = ".lost";

/// Beside a recording FILE: what the scheduler did with the thread in each call and in the
/// gap before it (bpf and perf backends), as `LINE` and four numbers for the call (ns on a CPU, ns
/// runnable, minor and major faults), then four for the gap or `-`: kept for the calls and
/// gaps at least as long as a tenth of the threshold (the shortest the report lists), so that
/// the replay names the same causes (`cpu-starvation`, `cow-page-faults`) as the live run.
pub const SCHED_SUFFIX: &str = ".sched";

/// Beside a recording FILE: when the data of each socket read arrived on the socket (bpf
/// backend, `Syscall::arrived`), as `LINE NS`: the read on LINE started NS ns after its data
/// arrived (negative if the data came while it ran). Without it a replay would time the
/// recording's commands from the event loop, not from their arrival as the live report did.
pub const ARRIVALS_SUFFIX: &str = ".arrivals";

const ARRIVALS_HEADER: &str = "# stallscope attach --record: when each socket read's data arrived (bpf), as `LINE NS`: \
                               the read on LINE started NS ns after its data was queued on the socket\n";

/// Reads a `FILE.arrivals` sidecar: for each line, how long before the read's start its
/// data arrived.
pub fn parse_arrivals(text: &str) -> Result<HashMap<u64, Nanos>, String> {
    let mut out = HashMap::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let pair = l
            .split_once(' ')
            .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.trim().parse::<Nanos>().ok()?)));
        match pair {
            Some((line, ns)) => {
                out.insert(line, ns);
            }
            None => return Err(format!("line {}: not `LINE NS`: {l:?}", i + 1)),
        }
    }
    Ok(out)
}

/// Reads a `FILE.sched` sidecar: the split of the call that ends on each line.
pub fn parse_sched(text: &str) -> Result<HashMap<u64, SchedSpan>, String> {
    let mut out = HashMap::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let bad = || {
            format!(
                "line {}: not `LINE ON RUN MINOR MAJOR [ON RUN MINOR MAJOR | -] [t=THROTTLED/THROTTLED] [r=RECLAIM/RECLAIM]`: {l:?}",
                i + 1
            )
        };
        let mut f: Vec<&str> = l.split_whitespace().collect();
        // The parts measured only by bpf, last: `r=DURING/BEFORE` the reclaim times, before
        // it `t=DURING/BEFORE` the throttled ones (`-` for none; older lines lack either).
        let reclaim = measured_part(&mut f, "r=").ok_or_else(bad)?;
        let throttled = measured_part(&mut f, "t=").ok_or_else(bad)?;
        let num = |k: usize| f.get(k).and_then(|v| v.parse::<u64>().ok());
        let delta = |k: usize| -> Option<SchedDelta> {
            Some(SchedDelta {
                on_cpu_ns: num(k)?,
                runnable_ns: num(k + 1)?,
                minor_faults: num(k + 2)?,
                major_faults: num(k + 3)?,
                throttled_ns: None,
                reclaim_ns: None,
            })
        };
        let line = num(0).ok_or_else(bad)?;
        let mut during = delta(1).ok_or_else(bad)?;
        during.throttled_ns = throttled.0;
        during.reclaim_ns = reclaim.0;
        let before = match f.get(5) {
            Some(&"-") if f.len() == 6 => None,
            Some(_) if f.len() == 9 => Some(SchedDelta {
                throttled_ns: throttled.1,
                reclaim_ns: reclaim.1,
                ..delta(5).ok_or_else(bad)?
            }),
            _ => return Err(bad()),
        };
        out.insert(line, SchedSpan { during, before });
    }
    Ok(out)
}

/// A last field `PREFIX DURING/BEFORE` of a sidecar line, taken off `f`: (None, None) when
/// the line has none, None when it is malformed.
#[allow(clippy::type_complexity)]
fn measured_part(f: &mut Vec<&str>, prefix: &str) -> Option<(Option<u64>, Option<u64>)> {
    let Some(t) = f.last().and_then(|t| t.strip_prefix(prefix)) else {
        return Some((None, None));
    };
    let (d, b) = t.split_once('/')?;
    let n = |v: &str| -> Option<Option<u64>> {
        match v {
            "-" => Some(None),
            v => v.parse().ok().map(Some),
        }
    };
    let part = (n(d)?, n(b)?);
    f.pop();
    Some(part)
}

const SCHED_HEADER: &str = "# stallscope attach --record: the scheduler's split (bpf, perf), as `LINE` then, for the call on \
                            that line and for the gap before it (or -): ns on a CPU, ns runnable, minor faults, major faults; \
                            then, where measured (bpf), `t=` the ns of each runnable time its cgroup was throttled and `r=` the ns \
                            each spent reclaiming memory (- for none)\n";

/// The line of `FILE.sched` that says the backend stopped the threads at every call
/// (ptrace): its split's time neither on a CPU nor waiting for one includes those stops.
/// Recordings of bpf and perf, and those made before ptrace had a split, lack it.
pub const STOPS_LINE: &str = "# the tracer stopped the threads at every call (ptrace)";

const LOST_HEADER: &str =
    "# stallscope attach --record: records the kernel dropped, as `LINE COUNT`: \
                           COUNT were lost before the event on LINE of the recording\n";

/// The losses of a recording, applied to the replay at the same places in the stream.
#[derive(Debug, Default)]
pub struct LostMarks {
    marks: Vec<(u64, u64)>,
    next: usize,
}

impl LostMarks {
    /// Reads a `FILE.lost` sidecar; `#` lines are comments.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut marks = vec![];
        for (i, l) in text.lines().enumerate() {
            let l = l.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let mark = l
                .split_once(' ')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.trim().parse().ok()?)));
            match mark {
                Some(m) => marks.push(m),
                None => return Err(format!("line {}: not `LINE COUNT`: {l:?}", i + 1)),
            }
        }
        marks.sort_by_key(|m: &(u64, u64)| m.0);
        Ok(LostMarks { marks, next: 0 })
    }
    /// Records lost before an event that ends on `line` (events come in the recording's
    /// order; each mark is given once).
    pub fn before(&mut self, line: u64) -> u64 {
        let mut n = 0;
        while let Some(&(at, c)) = self.marks.get(self.next) {
            if at > line {
                break;
            }
            n += c;
            self.next += 1;
        }
        n
    }
    /// Records lost after the last event.
    pub fn rest(&mut self) -> u64 {
        self.before(u64::MAX)
    }
}

pub struct Recorder<W: Write> {
    w: std::io::BufWriter<W>,
    first: Nanos,
    wall_at_first: Nanos,
    root: Tid,
    /// Process (tgid) of each thread seen; threads at attach belong to the root process.
    proc_of: HashMap<Tid, Tid>,
    /// Per process: fd -> what it is.
    fds: HashMap<Tid, HashMap<i32, String>>,
    cwd: Option<String>,
    line: String,
    /// Calls written as still running at the end, to be stamped again at the detach.
    at_end: Vec<(Tid, &'static str)>,
    /// Lines written so far.
    lines: u64,
    /// (line of the next event, records lost before it), for `FILE.lost`.
    lost: Vec<(u64, u64)>,
    /// `FILE.sched`, and the shortest call or gap whose split it keeps.
    sched: Option<(Box<dyn Write>, Nanos)>,
    /// When each thread's last call ended (for the length of the gap before the next).
    last_end: HashMap<Tid, Nanos>,
    /// The threads whose last call was quiet (`Facts::QUIET`): a gap may run on through it.
    after_quiet: HashMap<Tid, bool>,
    /// `FILE.arrivals`.
    arrivals: Option<Box<dyn Write>>,
}

impl<W: Write> Recorder<W> {
    /// `first`/`wall_at_first`: the live clock's origin and the wall time at that moment.
    pub fn new(w: W, root: Tid, first: Nanos, wall_at_first: Nanos, cwd: Option<String>) -> Self {
        let mut fds = HashMap::new();
        fds.insert(root, HashMap::new());
        Recorder {
            w: std::io::BufWriter::with_capacity(1 << 16, w),
            first,
            wall_at_first,
            root,
            proc_of: HashMap::new(),
            fds,
            cwd,
            line: String::with_capacity(256),
            at_end: vec![],
            lines: 0,
            lost: vec![],
            sched: None,
            last_end: HashMap::new(),
            after_quiet: HashMap::new(),
            arrivals: None,
        }
    }

    /// An fd open at attach (from /proc/PID/fd).
    pub fn seed_fd(&mut self, fd: i32, what: &str) {
        self.fds
            .entry(self.root)
            .or_default()
            .insert(fd, what.to_string());
    }

    fn proc_of(&self, tid: Tid) -> Tid {
        self.proc_of.get(&tid).copied().unwrap_or(self.root)
    }

    fn ts_text(&self, ts: Nanos) -> String {
        let w = self.wall_at_first + (ts - self.first);
        format!(
            "{}.{:09}",
            w.div_euclid(1_000_000_000),
            w.rem_euclid(1_000_000_000)
        )
    }

    /// The fd as `-y` writes it: named from the recorder's own map, or else from the
    /// event's own annotation (an event read from an annotated trace, replayed: its fds
    /// opened before that trace began are known only from their annotations).
    fn fd_text(&self, tid: Tid, fd: i32, annotated: Option<&str>) -> String {
        match self
            .fds
            .get(&self.proc_of(tid))
            .and_then(|m| m.get(&fd))
            .map(String::as_str)
            .or(annotated)
        {
            Some(p) => format!("{fd}<{}>", escape_annotation(p)),
            None => fd.to_string(),
        }
    }

    fn absolute(&self, p: &str) -> String {
        if p.starts_with('/') {
            return p.to_string();
        }
        match &self.cwd {
            Some(c) => format!("{}/{}", c.trim_end_matches('/'), p),
            None => p.to_string(),
        }
    }

    /// Keeps the scheduler's split of calls and gaps of at least `floor` in `w` (`FILE.sched`).
    pub fn record_sched(
        &mut self,
        mut w: Box<dyn Write>,
        floor: Nanos,
        stops: bool,
    ) -> std::io::Result<()> {
        w.write_all(SCHED_HEADER.as_bytes())?;
        if stops {
            writeln!(w, "{STOPS_LINE}")?;
        }
        self.sched = Some((w, floor));
        Ok(())
    }

    /// The call about to be written on the next line: its split, if it is long enough, or
    /// the gap before it is.
    fn write_sched(&mut self, ev: &Event, sc: &Syscall) -> std::io::Result<()> {
        let Some((w, floor)) = self.sched.as_mut() else {
            return Ok(());
        };
        let dur = sc.dur.unwrap_or(0);
        let prev = if sc.in_flight == Some(InFlight::AtStart) {
            None
        } else {
            self.last_end.insert(ev.tid, ev.ts + dur)
        };
        // A gap through quiet calls is one stall whose split is the sum of every piece's,
        // however short: keep a quiet call's and the next call's (the one that ends it).
        let quiet = sc.sys.facts.has(crate::syscalls::Facts::QUIET);
        let after_quiet = self.after_quiet.insert(ev.tid, quiet).unwrap_or(false);
        let Some(s) = sc.sched.as_deref() else {
            return Ok(());
        };
        let gap = prev.map_or(0, |p| ev.ts - p);
        if dur < *floor && gap < *floor && !quiet && !after_quiet {
            return Ok(());
        }
        let d = |x: &SchedDelta| {
            format!(
                "{} {} {} {}",
                x.on_cpu_ns, x.runnable_ns, x.minor_faults, x.major_faults
            )
        };
        let before = s.before.as_ref().map_or_else(|| "-".to_string(), d);
        let t = |x: Option<u64>| x.map_or_else(|| "-".to_string(), |v| v.to_string());
        let part = |p: &str, a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => String::new(),
            (a, b) => format!(" {p}={}/{}", t(a), t(b)),
        };
        let b = s.before.as_ref();
        let throttled = part("t", s.during.throttled_ns, b.and_then(|b| b.throttled_ns));
        let reclaim = part("r", s.during.reclaim_ns, b.and_then(|b| b.reclaim_ns));
        writeln!(
            w,
            "{} {} {before}{throttled}{reclaim}",
            self.lines + 1,
            d(&s.during)
        )
    }

    /// Keeps when each socket read's data arrived in `w` (`FILE.arrivals`).
    pub fn record_arrivals(&mut self, mut w: Box<dyn Write>) -> std::io::Result<()> {
        w.write_all(ARRIVALS_HEADER.as_bytes())?;
        self.arrivals = Some(w);
        Ok(())
    }

    /// The tracer dropped `n` records before the next event written.
    pub fn note_lost(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        let at = self.lines + 1;
        match self.lost.last_mut() {
            Some((l, c)) if *l == at => *c += n,
            _ => self.lost.push((at, n)),
        }
    }

    /// The `FILE.lost` sidecar's text, if anything was lost.
    pub fn lost_text(&self) -> Option<String> {
        if self.lost.is_empty() {
            return None;
        }
        let mut s = LOST_HEADER.to_string();
        for (l, n) in &self.lost {
            s.push_str(&format!("{l} {n}\n"));
        }
        Some(s)
    }

    /// Writes one event.
    pub fn write_event(&mut self, ev: &Event) -> std::io::Result<()> {
        self.line.clear();
        match &ev.kind {
            EventKind::Syscall(sc) => {
                self.write_sched(ev, sc)?;
                if let (Some(w), Some(at)) = (self.arrivals.as_mut(), sc.arrived) {
                    writeln!(w, "{} {}", self.lines + 1, ev.ts - at)?;
                }
                self.syscall_line(ev, sc)
            }
            EventKind::Signal { name, si_pid } => {
                let extra = si_pid.map(|p| format!(", si_pid={p}")).unwrap_or_default();
                self.line = format!(
                    "{} {} --- {name} {{si_signo={name}{extra}}} ---",
                    ev.tid,
                    self.ts_text(ev.ts)
                );
            }
            EventKind::Exit { code, signal } => {
                let what = match (code, signal) {
                    (Some(c), _) => format!("exited with {c}"),
                    (None, Some(s)) => format!("killed by {s}"),
                    (None, None) => "exited with 0".to_string(),
                };
                self.line = format!("{} {} +++ {what} +++", ev.tid, self.ts_text(ev.ts));
                let p = self.proc_of(ev.tid);
                if p == ev.tid && p != self.root {
                    self.fds.remove(&p);
                }
            }
            EventKind::Attach { threads } => {
                let with = threads
                    .map(|n| format!(" with {n} thread{}", if n == 1 { "" } else { "s" }))
                    .unwrap_or_default();
                self.line = format!(
                    "{} {} strace: Process {} attached{with}",
                    ev.tid,
                    self.ts_text(ev.ts),
                    ev.tid
                );
            }
            EventKind::Detach => {
                // The moment tracing ended, on the calls it left running (see above).
                let at = self.ts_text(ev.ts);
                for (tid, name) in std::mem::take(&mut self.at_end) {
                    self.line.push_str(&format!(
                        "{tid} {at} <... {name} resumed> <unfinished ...>\n"
                    ));
                    self.lines += 1;
                }
                return self.w.write_all(self.line.as_bytes());
            }
            // Names go beside the recording (`.threads`).
            EventKind::ThreadName(_) | EventKind::Program(_) => return Ok(()),
            // Live tracers read no lines.
            EventKind::Unreadable => return Ok(()),
        }
        self.line.push('\n');
        self.lines += 1;
        self.w.write_all(self.line.as_bytes())
    }

    fn syscall_line(&mut self, ev: &Event, sc: &Syscall) {
        let tid = ev.tid;
        let args = self.args_text(tid, sc);
        let ret = self.ret_text(tid, sc);
        let dur = sc
            .dur
            .map(|d| format!(" <{}.{:09}>", d / 1_000_000_000, d % 1_000_000_000))
            .unwrap_or_default();
        self.line = match sc.in_flight {
            Some(InFlight::AtStart) => {
                // Stamped when it returned, as strace stamps a resumed half; readers place
                // its start `dur` earlier, at the attach.
                let end = ev.ts + sc.dur.unwrap_or(0);
                format!(
                    "{tid} {} <... {} resumed>{args}) = {ret}{dur}",
                    self.ts_text(end),
                    sc.name
                )
            }
            Some(InFlight::AtEnd) => {
                self.at_end.push((tid, sc.name));
                format!(
                    "{tid} {} {}({args} <unfinished ...>",
                    self.ts_text(ev.ts),
                    sc.name
                )
            }
            None => format!(
                "{tid} {} {}({args}) = {ret}{dur}",
                self.ts_text(ev.ts),
                sc.name
            ),
        };
        self.apply_effects(tid, sc);
    }

    fn args_text(&self, tid: Tid, sc: &Syscall) -> String {
        let fd = |s: &Self| sc.fd.map(|f| s.fd_text(tid, f, sc.fd_path.as_deref()));
        let dirfd = |s: &Self| fd(s).unwrap_or_else(|| "AT_FDCWD".to_string());
        match &sc.extra {
            Extra::Path(p) if sc.sys.args == ArgKind::Path1 => {
                format!("{}, {}", dirfd(self), quote(p.as_bytes(), false))
            }
            Extra::Path(p) => quote(p.as_bytes(), false),
            Extra::Rename(a, b) if sc.sys.args == ArgKind::Rename => format!(
                "{}, {}",
                quote(a.as_bytes(), false),
                quote(b.as_bytes(), false)
            ),
            Extra::Rename(a, b) => format!(
                "AT_FDCWD, {}, AT_FDCWD, {}",
                quote(a.as_bytes(), false),
                quote(b.as_bytes(), false)
            ),
            Extra::FdPair(a, b) if sc.sys.args == ArgKind::Socketpair => {
                format!("AF_UNIX, SOCK_STREAM, 0, [{a}, {b}]")
            }
            Extra::FdPair(a, b) => format!("[{a}, {b}]"),
            Extra::NewFd(n) => format!("{}, {n}", fd(self).unwrap_or_default()),
            Extra::DupFd => format!("{}, F_DUPFD, 0", fd(self).unwrap_or_default()),
            Extra::CloseRange(a, b) => format!("{a}, {b}, 0"),
            Extra::Clone { thread } if sc.sys.args == ArgKind::Clone3 => {
                format!(
                    "{{flags={}}}, 88",
                    if *thread {
                        "CLONE_VM|CLONE_THREAD"
                    } else {
                        "0"
                    }
                )
            }
            Extra::Clone { thread } => format!(
                "flags={}",
                if *thread {
                    "CLONE_VM|CLONE_THREAD"
                } else {
                    "SIGCHLD"
                }
            ),
            Extra::Socket(d) => format!("{d}, SOCK_STREAM, 0"),
            Extra::Data(d) => {
                let d = d.head();
                let n = sc.ret.val().unwrap_or(d.bytes().len() as i64).max(0);
                format!(
                    "{}, {}, {n}",
                    fd(self).unwrap_or_default(),
                    quote(d.bytes(), d.truncated)
                )
            }
            Extra::Resumes(n) => format!("<... resuming interrupted {n} ...>"),
            Extra::LockWait(a) => format!("{a:#x}, FUTEX_WAIT_PRIVATE, 2, NULL"),
            Extra::Futex { addr, wake: true } => format!("{addr:#x}, FUTEX_WAKE_PRIVATE, 1"),
            Extra::Futex { addr, wake: false } => {
                format!("{addr:#x}, FUTEX_WAIT_PRIVATE, 0, NULL")
            }
            Extra::None => fd(self).unwrap_or_default(),
        }
    }

    fn ret_text(&self, tid: Tid, sc: &Syscall) -> String {
        match sc.ret {
            Ret::Val(v) => {
                // strace -y annotates a returned fd too.
                if sc.sys.fd == FdKind::Open {
                    if let Some(p) = self.opened_name(sc) {
                        return format!("{v}<{}>", escape_annotation(&p));
                    }
                }
                if matches!(sc.sys.fd, FdKind::Dup | FdKind::Fcntl)
                    || matches!(sc.extra, Extra::NewFd(_))
                {
                    if let Some(p) = sc
                        .fd
                        .and_then(|f| self.fds.get(&self.proc_of(tid)).and_then(|m| m.get(&f)))
                    {
                        return format!("{v}<{}>", escape_annotation(p));
                    }
                }
                v.to_string()
            }
            Ret::Err(e) => {
                format!("-1 {e} ({})", crate::live::sysnames::errno_desc(e))
            }
            Ret::Unknown => "?".to_string(),
        }
    }

    /// The name an open's new fd is written with: the one the live fd table bound (the
    /// backend's `ret_path`, see `decode::open_name`), so that the replay binds the same;
    /// else the path it opened, made absolute as strace -y shows it.
    fn opened_name(&self, sc: &Syscall) -> Option<String> {
        match (&sc.ret_path, &sc.extra) {
            (Some(p), _) => Some(p.to_string()),
            (None, Extra::Path(p)) => Some(self.absolute(p)),
            _ => None,
        }
    }

    /// Keeps the recorder's own fd map and process map in step with the call's result.
    fn apply_effects(&mut self, tid: Tid, sc: &Syscall) {
        let p = self.proc_of(tid);
        let ok = sc.ret.val();
        match fd_effect(sc) {
            FdEffect::Open { fd, .. } => {
                if let Some(name) = self.opened_name(sc) {
                    self.fds.entry(p).or_default().insert(fd, name);
                }
            }
            FdEffect::Close(fd) => {
                if ok.is_some() {
                    if let Some(m) = self.fds.get_mut(&p) {
                        m.remove(&fd);
                    }
                }
            }
            FdEffect::Dup { src, dst } => {
                let m = self.fds.entry(p).or_default();
                match m.get(&src).cloned() {
                    Some(what) => m.insert(dst, what),
                    None => m.remove(&dst),
                };
            }
            FdEffect::Clone { child, thread } => {
                if thread {
                    self.proc_of.insert(child, p);
                } else {
                    self.proc_of.insert(child, child);
                    let copy = self.fds.get(&p).cloned().unwrap_or_default();
                    self.fds.insert(child, copy);
                }
            }
            // Any other call returning a new fd (socket, accept, pipe...) replaces whatever
            // that number was: forget the old name rather than mislabel it.
            FdEffect::New { fd, .. } => {
                if let Some(m) = self.fds.get_mut(&p) {
                    m.remove(&fd);
                }
            }
            FdEffect::Pair { a, b, .. } => {
                if let Some(m) = self.fds.get_mut(&p) {
                    m.remove(&a);
                    m.remove(&b);
                }
            }
            FdEffect::CloseRange(..)
            | FdEffect::Listen(_)
            | FdEffect::Connect(_)
            | FdEffect::None => {}
        }
    }

    pub fn finish(mut self) -> std::io::Result<()> {
        if let Some((w, _)) = self.sched.as_mut() {
            w.flush()?;
        }
        if let Some(w) = self.arrivals.as_mut() {
            w.flush()?;
        }
        self.w.flush()
    }
}

/// A C string literal as strace prints it; `...` after the quote when cut short.
fn quote(b: &[u8], truncated: bool) -> String {
    let mut s = String::with_capacity(b.len() + 2);
    s.push('"');
    for &c in b {
        match c {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            0x20..=0x7e => s.push(c as char),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s.push('"');
    if truncated {
        s.push_str("...");
    }
    s
}

/// strace escapes `>` and non-printables inside `-y` annotations of paths; a socket's
/// (`TCP:[127.0.0.1:6379->127.0.0.1:50418]`, `-yy`) it prints as it is, arrow and all,
/// and that is how the parser classes a connection (escaped, a replay lost the commands of
/// the clients connected before the attach).
fn escape_annotation(p: &str) -> String {
    let socket = p.contains(":[") && p.ends_with(']') && !p.starts_with('/');
    let mut s = String::with_capacity(p.len());
    for c in p.chars() {
        match c {
            '>' if socket => s.push(c),
            '>' | '\\' | '\n' | '\r' | '\t' => s.push_str(&format!("\\x{:02x}", c as u32)),
            _ => s.push(c),
        }
    }
    s
}

#[cfg(test)]
mod tests;
