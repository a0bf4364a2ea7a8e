//! Table renderer: the report an on-call engineer reads in an 80-column terminal. One
//! headline per finding first (what is wrong and what to change), then the stalls merged into
//! incidents (who waited), then the supporting tables. Colour only on a TTY, never with
//! NO_COLOR.

use super::sections::{sections, InFlightRows, Incidents, PhaseBlock, Section, View};
use crate::report::{
    Bound, ClockKind, CommandStats, Durations, EvidenceSource, FdStats, Finding, IdleStats,
    LinePosition, LiveBackend, LogMeaning, PhaseStatsOf, RedisEvidence, Report, Role, Severity,
    Skipped, SlowCall, SourceKind, Stall, StallKind, SyscallStats,
};
use crate::units::{human, plural, short};
use comfy_table::{presets, Cell, CellAlignment, ContentArrangement, Table};
use std::io::{self, Write};

const WIDTH: usize = 80;

struct Paint {
    on: bool,
}

impl Paint {
    fn wrap(&self, code: &str, s: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn bold(&self, s: &str) -> String {
        self.wrap("1", s)
    }
    fn sev(&self, s: Severity) -> String {
        match s {
            Severity::Critical => self.wrap("1;31", "CRITICAL"),
            Severity::Warning => self.wrap("1;33", "WARNING "),
            Severity::Info => self.wrap("36", "INFO    "),
        }
    }
}

/// Wraps `text` at WIDTH with `indent` spaces before every line. A word too long for a line
/// on its own (an absolute path) is broken after a `/`.
fn wrap(text: &str, indent: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    let pad = " ".repeat(indent);
    let room = WIDTH.saturating_sub(indent).max(1);
    for word in text.split_whitespace().flat_map(|w| split_long(w, room)) {
        if !line.is_empty() && indent + line.chars().count() + 1 + word.chars().count() > WIDTH {
            out.push_str(&pad);
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&pad);
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Pieces of `word` no longer than `room` characters, cut after a `/` where there is one
/// (else anywhere), so a path wraps at its components.
fn split_long(word: &str, room: usize) -> Vec<&str> {
    let mut pieces = vec![];
    let mut rest = word;
    while rest.chars().count() > room {
        let limit = rest.char_indices().nth(room).map_or(rest.len(), |(i, _)| i);
        let cut = match rest[..limit].rfind('/') {
            Some(i) if i > 0 => i + 1,
            _ => limit,
        };
        pieces.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    pieces.push(rest);
    pieces
}

/// "held 3 clients (5 commands), worst wait 9.60 s"
fn impact(cmds: u64, clients: u64, worst: Option<i64>) -> Option<String> {
    if cmds == 0 {
        return None;
    }
    let w = worst
        .map(|w| format!(", worst wait {}", human(w)))
        .unwrap_or_default();
    Some(format!(
        "held {clients} client{} ({cmds} command{}){w}",
        plural(clients),
        plural(cmds)
    ))
}

/// One line per stall, for live printing and the stall list.
pub fn stall_line(s: &Stall) -> String {
    let what = match s.kind {
        StallKind::Gap => "no syscall (gap)".to_string(),
        StallKind::SlowSyscall => {
            let fd = s.target.fd.map(|f| f.to_string()).unwrap_or_default();
            let file = match (&s.target.class, &s.target.path) {
                (Some(c), Some(p)) => format!(" {c} {}", p.rsplit('/').next().unwrap_or(p)),
                (Some(c), None) => format!(" {c}"),
                _ => String::new(),
            };
            format!("{}({fd}){file}", s.syscall.as_deref().unwrap_or("?"))
        }
    };
    let mut line = format!(
        "{} {:>9} {:<8} {}",
        short_ts(&s.ts),
        format!("{}{}", super::bound_word(s.bound), human(s.duration_us)),
        s.who.thread,
        what
    );
    if let Some(i) = impact(s.waiting.commands, s.waiting.clients, s.waiting.worst_us) {
        line.push_str(&format!("  {i}"));
    }
    line
}

/// Live timestamps are ISO 8601 (with date and offset, in the JSON); in a table the time of
/// day is what fits and what is read.
fn short_ts(ts: &str) -> std::borrow::Cow<'_, str> {
    if let Some((_, t)) = ts.split_once('T') {
        return t.split(['+', 'Z']).next().unwrap_or(t).into();
    }
    // `-ttt` epoch seconds: the UTC time of day reads better (the header gives the date).
    if let Some((secs, frac)) = ts.split_once('.') {
        if let (Ok(secs), true) = (
            secs.parse::<i64>(),
            frac.bytes().all(|b| b.is_ascii_digit()),
        ) {
            if secs > 100_000_000 {
                if let Some(t) = chrono::DateTime::from_timestamp(secs, 0) {
                    return format!("{}.{frac}", t.format("%H:%M:%S")).into();
                }
            }
        }
    }
    ts.into()
}

/// A time of day to the millisecond: enough to place a call (its line number locates it
/// exactly), and three columns more for the file name beside it.
fn to_ms(t: &str) -> String {
    match t.split_once('.') {
        Some((whole, frac)) if frac.len() > 3 && frac.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{whole}.{}", &frac[..3])
        }
        _ => t.to_string(),
    }
}

fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_width(WIDTH as u16);
    t
}

fn right(s: impl ToString) -> Cell {
    Cell::new(s.to_string()).set_alignment(CellAlignment::Right)
}

pub fn render(r: &Report, w: &mut dyn Write, color: bool) -> io::Result<()> {
    let p = Paint { on: color };
    for s in sections(r, View::Terminal) {
        match s {
            Section::Header => header(r, w, &p)?,
            Section::Findings(f) => findings(f, w, &p)?,
            Section::Incidents(i) => incidents(r, &i, w, &p)?,
            Section::InFlight(s) => in_flight(&s, w, &p)?,
            Section::Phases(b) => phases(&b, w, &p)?,
            Section::Host { interval_ms, notes } => host(interval_ms, notes, w, &p)?,
            Section::Commands(c) => commands(&c, w, &p)?,
            Section::Slowest(s) => slowest(r, s, w, &p)?,
            Section::Idle(i) => idle(i, super::timed(r), w, &p)?,
            Section::Syscalls(s) => syscalls(s, super::timed(r), w, &p)?,
            Section::Files(f) => files(f, super::timed(r), w, &p)?,
            Section::Skipped { lines, first } => skipped(lines, first, w, &p)?,
            // The page's views of the same data: the terminal has its own above.
            Section::Timeline
            | Section::Lanes
            | Section::Stalls(_)
            | Section::IncidentList(_)
            | Section::Threads(_) => {}
        }
    }
    Ok(())
}

fn header(r: &Report, w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    headline(r, w, p)?;
    w.write_all(wrap(&source_line(r), 0).as_bytes())?;
    if let Some(c) = &r.live.container {
        w.write_all(wrap(&container_line(c, r.source.pid), 0).as_bytes())?;
    }
    if let Some(line) = cgroup_line(r) {
        w.write_all(wrap(&line, 0).as_bytes())?;
    }
    caveats(r, w, p)?;
    if let Some(line) = tracing_cost(r) {
        w.write_all(wrap(&line, 0).as_bytes())?;
    }
    Ok(())
}

/// The first line: how many stalls over the threshold, or that none can be known.
fn headline(r: &Report, w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    let span = human(r.summary.span_us);
    if r.summary.durations == Durations::None {
        // Not "0 stalls": a trace that measures nothing is not a clean one.
        let headline = format!(
            "stallscope: durations cannot be known in this {}: it has no timestamps and no \
             -T; {}.",
            r.source.format,
            crate::report::RERUN
        );
        for l in wrap(&headline, 0).lines() {
            writeln!(w, "{}", p.bold(l))?;
        }
    } else {
        writeln!(
            w,
            "{}",
            p.bold(&format!(
                "stallscope: {} stall{} over {} in {span} of {}",
                r.summary.stalls,
                plural(r.summary.stalls),
                human(r.summary.threshold_us),
                r.source.format
            ))
        )?;
    }
    Ok(())
}

/// What was read: the files (or the live process), their size, and when the trace starts.
fn source_line(r: &Report) -> String {
    // File names only: full paths are in the JSON, and a long one cannot wrap.
    let files = if r.source.files.is_empty() {
        "stdin".to_string()
    } else {
        r.source
            .files
            .iter()
            .map(|f| f.rsplit('/').next().unwrap_or(f))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut meta = if r.source.kind == SourceKind::Live {
        format!(
            "live pid {} ({}): {} syscalls, {} thread{}",
            r.source
                .pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "?".into()),
            r.source.backend.unwrap_or(LiveBackend::Ptrace),
            r.summary.syscalls,
            r.summary.threads,
            plural(r.summary.threads)
        )
    } else {
        format!(
            "{files}: {} lines, {} syscalls, {} thread{}; durations {}",
            r.summary.lines,
            r.summary.syscalls,
            r.summary.threads,
            plural(r.summary.threads),
            r.summary.durations
        )
    };
    if let Some(s) = r.summary.start_iso.as_ref().or(r.summary.start.as_ref()) {
        meta.push_str(&format!("; starts {s}"));
    }
    let dated_by_log = r.redis.as_ref().and_then(|x| x.date_from_log.as_ref());
    if let Some(d) = dated_by_log {
        meta.push_str(&format!(" (date {d} from redis's log; --date to set it)"));
    } else {
        meta.push_str(match r.source.clock {
            ClockKind::TimeOfDay => " (time of day only: give --date for absolute times)",
            ClockKind::Relative => " (relative times only)",
            ClockKind::None => " (no timestamps)",
            ClockKind::Absolute => "",
        });
    }
    meta
}

/// The container the live process runs in: what names it, and how it was reached.
fn container_line(c: &crate::report::Container, pid: Option<u32>) -> String {
    let mut names = vec![];
    if let Some(h) = &c.hostname {
        names.push(format!("hostname {h}"));
    }
    if let Some(id) = &c.id {
        let short = &id[..id.len().min(12)];
        names.push(format!("{} {short}", c.runtime.as_deref().unwrap_or("id")));
    }
    if let Some(uid) = &c.kubernetes_pod_uid {
        let qos = c.kubernetes_qos.as_deref().unwrap_or("?");
        names.push(format!("kubernetes pod {uid} ({qos})"));
    }
    if let Some(cg) = &c.cgroup {
        names.push(format!("cgroup {cg}"));
    }
    let mut line = format!("container: {}", names.join(", "));
    if !c.namespaces.is_empty() {
        line.push_str(&format!(
            "; namespaces of its own: {}",
            c.namespaces.join(", ")
        ));
    }
    let inside = c
        .pids
        .iter()
        .find(|x| Some(x.host) == pid && x.host != x.ns);
    if let Some(x) = inside {
        line.push_str(&format!("; pid {} inside (its log's)", x.ns));
    }
    if let Some(v) = &c.files_via {
        line.push_str(&format!("; its files read through {v}"));
    }
    line
}

/// "cgroup v1 /box: CPU quota 30 ms per 100 ms, memory.limit_in_bytes 1024 MiB; over the
/// trace throttled in 29 of 40 periods for 1.20 s, 3 memory.high events".
fn cgroup_line(r: &Report) -> Option<String> {
    let c = r.live.cgroup.as_ref()?;
    let version = match c.version {
        crate::report::CgroupVersion::V1 => "v1",
        crate::report::CgroupVersion::V2 => "v2",
    };
    let mut limits = vec![];
    if let Some((q, per)) = c.limits.quota() {
        limits.push(format!(
            "CPU quota {} per {}",
            human(q as i64),
            human(per as i64)
        ));
    }
    if let Some((name, b)) = c.limits.memory_limit() {
        limits.push(format!("{name} {:.0} MiB", b as f64 / (1u64 << 20) as f64));
    }
    if limits.is_empty() {
        limits.push("no CPU or memory limit".into());
    }
    let t = &c.totals;
    let mut over = vec![format!(
        "throttled in {} of {} period{} for {}",
        t.nr_throttled,
        t.nr_periods,
        plural(t.nr_periods),
        human(t.throttled_us as i64)
    )];
    for (n, what) in [
        (t.memory_high_events, "memory.high event"),
        (t.memory_max_events, "memory.max event"),
        (t.memory_oom_events, "OOM"),
        (t.memory_failcnt, "memory.failcnt charge"),
    ] {
        if n > 0 {
            over.push(format!("{n} {what}{}", plural(n)));
        }
    }
    Some(format!(
        "cgroup {version} {}: {}; over the trace {}",
        c.path,
        limits.join(", "),
        over.join(", ")
    ))
}

/// What the reader must know before trusting the figures: lost events, reconstructed
/// durations.
fn caveats(r: &Report, w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    if r.summary.lost_events > 0 {
        writeln!(
            w,
            "{}",
            p.wrap(
                "1;31",
                &format!(
                    "{} events were lost: the trace is incomplete",
                    r.summary.lost_events
                )
            )
        )?;
    }
    if !matches!(r.summary.durations, Durations::Measured | Durations::None) {
        w.write_all(
            wrap(
                "Durations without -T are reconstructed: a paired call is timed from its entry to its end, any other \
                 call up to the thread's next event (an upper bound, shown as ≤).",
                0,
            )
            .as_bytes(),
        )?;
    }
    if !r.summary.other_programs.is_empty() {
        let n = r.summary.other_programs.len();
        w.write_all(
            wrap(
                &format!(
                    "The trace holds {n} other program{} beside redis ({}): their calls are \
                     counted, their waits are theirs, not redis's stalls.",
                    plural(n as u64),
                    r.summary.other_programs.join(", ")
                ),
                0,
            )
            .as_bytes(),
        )?;
    }
    Ok(())
}

/// What tracing cost a live process.
fn tracing_cost(r: &Report) -> Option<String> {
    let o = r.live.overhead.as_ref()?;
    let mut line = if !o.stops_redis {
        format!(
            "Tracing cost: {:.0} syscalls/s traced; redis is never stopped",
            o.syscalls_per_s
        )
    } else {
        format!(
            "Tracing cost: {:.0} syscalls/s traced, {:.1} µs per tracer stop",
            o.syscalls_per_s, o.mean_stop_us
        )
    };
    if let Some(warn) = &o.warning {
        line.push_str(&format!(". {warn}"));
    }
    Some(line)
}

fn findings(fs: &[Finding], w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    writeln!(w)?;
    writeln!(w, "{}", p.bold("FINDINGS"))?;
    if fs.is_empty() {
        writeln!(w, "  none: no known redis latency pattern in this trace")?;
    }
    for f in fs {
        // The headline wraps under itself, clear of the severity column.
        for (i, line) in wrap(&f.title, 9).lines().enumerate() {
            let lead = if i == 0 {
                p.sev(f.severity)
            } else {
                " ".repeat(8)
            };
            writeln!(w, "{lead} {}", p.bold(line.trim_start()))?;
        }
        writeln!(w, "         [{}]", f.id)?;
        w.write_all(wrap(&f.evidence, 9).as_bytes())?;
        w.write_all(wrap(&format!("Fix: {}", f.advice), 9).as_bytes())?;
    }
    Ok(())
}

fn incidents(r: &Report, inc: &Incidents, w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    writeln!(w)?;
    writeln!(
        w,
        "{}",
        p.bold(&format!(
            "STALLS over {} ({} stall{}, {} incident{}, worst first)",
            human(r.summary.threshold_us),
            inc.stalls.len(),
            plural(inc.stalls.len() as u64),
            inc.total,
            plural(inc.total as u64)
        ))
    )?;
    if inc.stalls.is_empty() {
        writeln!(w, "  none")?;
    }
    for i in &inc.worst {
        // The incident spans its stalls: bounded the way they all are.
        let bounds = |b| i.stalls.iter().any(|si| inc.stalls[*si].bound == b);
        let mark = match (bounds(Bound::AtMost), bounds(Bound::AtLeast)) {
            (true, false) => super::bound_word(Bound::AtMost),
            (false, true) => super::bound_word(Bound::AtLeast),
            _ => "",
        };
        let mut head = format!("{}  {mark}{}", short_ts(&i.ts), human(i.duration_us));
        if i.stalls.len() > 1 {
            head.push_str(&format!(" ({} overlapping stalls)", i.stalls.len()));
        }
        if let Some(im) = impact(i.waiting_commands, i.waiting_clients, i.worst_wait_us) {
            head.push_str(&format!("  {im}"));
        }
        for l in wrap(&head, 0).lines() {
            writeln!(w, "{}", p.bold(l))?;
        }
        for si in &i.stalls {
            let s = &inc.stalls[*si];
            let mut line = s.line.map(|l| format!(" [line {l}]")).unwrap_or_default();
            if !s.waiting.by_command.is_empty() {
                let by: Vec<String> = s
                    .waiting
                    .by_command
                    .iter()
                    .map(|(k, v)| format!("{v} {k}"))
                    .collect();
                line.push_str(&format!(" Waiting: {}.", by.join(", ")));
            }
            w.write_all(wrap(&format!("{}{}", s.cause, line), 2).as_bytes())?;
            if let Some(ev) = &s.redis_evidence {
                if let Some(l) = redis_headline(ev) {
                    w.write_all(wrap(&l, 4).as_bytes())?;
                }
            }
        }
    }
    if inc.more > 0 {
        writeln!(
            w,
            "  ... {} more incidents (--top, or --format json for all)",
            inc.more
        )?;
    }
    Ok(())
}

/// The line of a stall's evidence a text report shows: the one that names the stall
/// (LATENCY, SLOWLOG, INFO, the log line written just before it, or one that names a cause),
/// never the background chatter (the save child's copy-on-write lines); the JSON and HTML
/// reports have them all.
fn redis_headline(ev: &[RedisEvidence]) -> Option<String> {
    let rank = |e: &RedisEvidence| -> u8 {
        match (e.source, e.position, e.meaning) {
            (EvidenceSource::Latency | EvidenceSource::Slowlog, _, _) => 0,
            (EvidenceSource::Info, _, _) => 1,
            // Where it sits names the stall: the line before, being written, or just after.
            (_, Some(_), _) => 0,
            (_, None, None | Some(LogMeaning::ChildCopyOnWrite)) => 9,
            _ => 2,
        }
    };
    let e = ev
        .iter()
        .filter(|e| rank(e) < 9)
        .min_by_key(|e| (rank(e), e.at_us))?;
    let t = e.ts.get(11..23).unwrap_or(&e.ts);
    let more = ev.len() - 1;
    // A log line: its own words, and where it sits, without the labels the JSON carries.
    let what = match e.source {
        EvidenceSource::Log => {
            let pos = match e.position {
                Some(LinePosition::JustBefore) => " (written just before)",
                Some(LinePosition::JustAfter) => " (written just after)",
                Some(LinePosition::BeingWritten) => " (being written)",
                None => "",
            };
            format!("{pos}: {}", short(&e.text, 100))
        }
        _ => format!(": {}", short(&e.what, 100)),
    };
    Some(format!(
        "redis {} {t}{what}{}",
        e.source,
        if more > 0 {
            format!(" (+{more} more)")
        } else {
            String::new()
        }
    ))
}

fn in_flight(f: &InFlightRows, w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    writeln!(w)?;
    writeln!(
        w,
        "{}",
        p.bold("STILL RUNNING at the edges of the trace (below the threshold)")
    )?;
    for s in f.rows {
        w.write_all(wrap(&s.cause, 2).as_bytes())?;
    }
    if f.more > 0 {
        writeln!(w, "  ... {} more (--format json for all)", f.more)?;
    }
    let (n, listed) = (f.blocked_at_end, f.listed_at_end);
    if n > 0 {
        let waits = n.saturating_sub(listed as u64);
        let what = match (listed, waits) {
            (0, _) if n == 1 => "a wait for work".to_string(),
            (0, _) => "each a wait for work".to_string(),
            (_, 0) => format!("{listed} listed here or as stalls"),
            _ => format!(
                "{listed} listed here or as stalls, {waits} wait{} for work",
                plural(waits)
            ),
        };
        let line = format!(
            "{n} call{} still blocked when the trace ended ({} thread{} traced): {what}",
            plural(n),
            f.threads,
            plural(f.threads)
        );
        w.write_all(wrap(&line, 2).as_bytes())?;
    }
    if f.silent > 0 {
        let line = format!(
            "{} thread{} strace attached to made no call the trace shows (silent: blocked in one \
             call since before it began, idle, or its calls filtered out)",
            f.silent,
            plural(f.silent)
        );
        w.write_all(wrap(&line, 2).as_bytes())?;
    }
    // Which thread waits in what: a hang in which every thread is parked names them all.
    for k in f.parked {
        w.write_all(wrap(&parked_words(k, f.timed), 4).as_bytes())?;
    }
    if f.parked_more > 0 {
        writeln!(w, "    ... {} more (--format json for all)", f.parked_more)?;
    }
    Ok(())
}

/// "main thread 100 waits in epoll_wait(5) (epoll) since 22:38:57.101, at least 12 ms"
/// (no thread number when the trace gave none, no length when nothing of it is known, no
/// start when the trace has no timestamps).
fn parked_words(k: &crate::report::Parked, timed: bool) -> String {
    let tid = if k.tid == 0 {
        String::new()
    } else {
        format!(" {}", k.tid)
    };
    let known = if k.known_us > 0 {
        format!(", at least {}", human(k.known_us))
    } else {
        String::new()
    };
    let fd = k.fd.map(|f| f.to_string()).unwrap_or_default();
    let on = match (&k.path, k.class) {
        (Some(path), _) => format!(" on {path}"),
        (None, Some(c)) if c != crate::report::FileClass::Unknown => format!(" ({c})"),
        _ => String::new(),
    };
    let since = if timed {
        format!(" since {}", short_ts(&k.ts))
    } else {
        String::new()
    };
    format!(
        "{} thread{tid} waits in {}({fd}){on}{since}{known}",
        k.thread.as_str(),
        k.syscall,
    )
}

fn phases(blocks: &[PhaseBlock], w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    writeln!(w)?;
    writeln!(w, "{}", p.bold("BACKGROUND CHILDREN"))?;
    for b in blocks {
        let ph = b.phase;
        let dur = ph
            .end_at_us
            .map(|e| human(e - ph.start_at_us))
            .unwrap_or_else(|| "still running at the end".into());
        let fork = ph
            .fork_us
            .map(|f| format!(", fork {}", human(f)))
            .unwrap_or_default();
        writeln!(
            w,
            "{} child {} at {}: {dur}{fork}",
            ph.kind,
            ph.child_pid,
            short_ts(&ph.ts)
        )?;
        let mut t = table();
        t.set_header(vec![
            Cell::new("main thread"),
            right("before p50/p99\nmax (count)"),
            right("during p50/p99\nmax (count)"),
            right("after p50/p99\nmax (count)"),
        ]);
        for st in &b.stats {
            let d = |x: &crate::report::Dist| {
                if x.count == 0 {
                    "-".to_string()
                } else {
                    format!(
                        "{}/{}\n{} ({})",
                        human(x.p50_us),
                        human(x.p99_us),
                        human(x.max_us),
                        x.count
                    )
                }
            };
            let what = match &st.what {
                PhaseStatsOf::MainFileSyscalls => "file syscalls",
                PhaseStatsOf::Command(c) => c,
            };
            t.add_row(vec![
                Cell::new(what),
                right(d(&st.before)),
                right(d(&st.during)),
                right(d(&st.after)),
            ]);
        }
        writeln!(w, "{t}")?;
    }
    Ok(())
}

fn host(interval_ms: u64, notes: &[String], w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    writeln!(w)?;
    writeln!(
        w,
        "{}",
        p.bold(&format!("HOST (sampled every {interval_ms} ms from /proc)"))
    )?;
    for n in notes {
        w.write_all(wrap(n, 2).as_bytes())?;
    }
    Ok(())
}

fn commands(rows: &[&CommandStats], w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    writeln!(w)?;
    // Live bpf dates a request's arrival on a TCP socket only (not a Unix socket's): the
    // table must not say "read to reply" of times that start earlier, nor "from arrival"
    // of those it could not date.
    let dated = rows.iter().any(|c| c.from_arrival > 0);
    let title = if dated {
        "COMMANDS (to the reply: from the request's arrival on redis's socket for the \
         `dated` ones, from redis's read for the others, Unix-socket clients' among them)"
    } else {
        "COMMANDS (read to reply, seen from redis)"
    };
    writeln!(w, "{}", p.bold(title))?;
    let mut t = table();
    let mut header = vec![
        Cell::new("command"),
        right("calls"),
        right("p50"),
        right("p99"),
        right("max"),
        right("AOF/call"),
        right("log/call"),
    ];
    if dated {
        header.insert(2, right("dated"));
    }
    t.set_header(header);
    for c in rows {
        let per = |x: i64| {
            if c.calls == 0 || x == 0 {
                "-".into()
            } else {
                human(x / c.calls as i64)
            }
        };
        let mut row = vec![
            Cell::new(&c.command),
            right(c.calls),
            right(human(c.p50_us)),
            right(human(c.p99_us)),
            right(human(c.max_us)),
            right(per(c.aof_us)),
            right(per(c.log_us)),
        ];
        if dated {
            row.insert(2, right(c.from_arrival));
        }
        t.add_row(row);
    }
    writeln!(w, "{t}")
}

fn slowest(r: &Report, rows: &[SlowCall], w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    writeln!(w)?;
    writeln!(w, "{}", p.bold("SLOWEST CALLS (idle waits excluded)"))?;
    let mut t = table();
    t.set_header(vec![
        Cell::new("time"),
        right("took"),
        Cell::new("thread"),
        Cell::new("call"),
        Cell::new("file"),
        right("line"),
    ]);
    // A thread that is alone in its role is named by the role: the line column already
    // points into the trace, and the narrow table leaves the room to the file.
    let alone = |role: Role| r.threads.iter().filter(|t| t.role == role).count() <= 1;
    for s in rows {
        let file = super::file_label(s.target.class, s.target.path.as_deref());
        let tid = if alone(s.who.thread) { 0 } else { s.who.tid };
        t.add_row(vec![
            Cell::new(to_ms(&short_ts(&s.ts))),
            right(format!(
                "{}{}",
                super::bound_word(s.bound),
                human(s.duration_us)
            )),
            Cell::new(super::thread_label(s.who.thread.as_str(), tid, false)),
            Cell::new(format!(
                "{}({})",
                s.syscall,
                s.target.fd.map(|f| f.to_string()).unwrap_or_default()
            )),
            Cell::new(file),
            right(s.line.map(|l| l.to_string()).unwrap_or_default()),
        ]);
    }
    writeln!(w, "{t}")
}

/// A duration cell, or `-` in a trace that measures nothing (its zeros are not measurements).
fn timed_human(timed: bool, us: i64) -> String {
    if timed {
        human(us)
    } else {
        "-".into()
    }
}

fn idle(rows: &[IdleStats], timed: bool, w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    let human = |us| timed_human(timed, us);
    writeln!(w)?;
    writeln!(
        w,
        "{}",
        p.bold("IDLE (waits for work, never stalls; by thread role)")
    )?;
    let mut t = table();
    t.set_header(vec![
        Cell::new("thread"),
        Cell::new("wait"),
        right("calls"),
        right("total"),
    ]);
    for i in rows {
        t.add_row(vec![
            Cell::new(i.role.as_str()),
            Cell::new(&i.syscall),
            right(i.calls),
            right(human(i.total_us)),
        ]);
    }
    writeln!(w, "{t}")
}

fn syscalls(rows: &[SyscallStats], timed: bool, w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    let human = |us| timed_human(timed, us);
    writeln!(w)?;
    writeln!(
        w,
        "{}",
        p.bold(if timed {
            "SYSCALLS (by total time)"
        } else {
            "SYSCALLS (no durations in this trace)"
        })
    )?;
    let mut t = table();
    t.set_header(vec![
        Cell::new("syscall"),
        right("calls"),
        right("errors"),
        right("total"),
        right("p50"),
        right("p99"),
        right("max"),
    ]);
    for s in rows {
        t.add_row(vec![
            Cell::new(&s.name),
            right(s.calls),
            right(s.errors),
            right(human(s.total_us)),
            right(human(s.p50_us)),
            right(human(s.p99_us)),
            right(human(s.max_us)),
        ]);
    }
    writeln!(w, "{t}")
}

fn files(rows: &[FdStats], timed: bool, w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    let human = |us| timed_human(timed, us);
    writeln!(w)?;
    writeln!(w, "{}", p.bold("FILES (by total time)"))?;
    let mut t = table();
    t.set_header(vec![
        Cell::new("pid/fd"),
        Cell::new("class"),
        Cell::new("path"),
        right("calls"),
        right("p99"),
        right("max"),
    ]);
    for f in rows {
        t.add_row(vec![
            // A trace without a pid column (no -f, no --pid) does not say whose fds these are.
            Cell::new(if f.pid == 0 {
                format!("?/{}", f.fd)
            } else {
                format!("{}/{}", f.pid, f.fd)
            }),
            Cell::new(f.class),
            Cell::new(f.path.clone().unwrap_or_else(|| "-".into())),
            right(f.calls),
            right(human(f.p99_us)),
            right(human(f.max_us)),
        ]);
    }
    writeln!(w, "{t}")
}

fn skipped(lines: u64, first: &[Skipped], w: &mut dyn Write, p: &Paint) -> io::Result<()> {
    writeln!(w)?;
    writeln!(w, "{}", p.bold(&format!("SKIPPED {lines} lines")))?;
    for s in first {
        writeln!(
            w,
            "  line {}: {}: {}",
            s.line,
            s.reason_text(),
            s.text.chars().take(50).collect::<String>()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_container_line_names_it_and_how_it_was_reached() {
        let c = crate::report::Container {
            cgroup: Some("/kubepods/burstable/podab12/3f6c2d9e8b7a6f5e".into()),
            id: Some("3f6c2d9e8b7a6f5e".into()),
            kubernetes_pod_uid: Some("ab12".into()),
            kubernetes_qos: Some("burstable".into()),
            hostname: Some("redis-0".into()),
            namespaces: vec!["mnt".into(), "pid".into(), "net".into()],
            files_via: Some("/proc/4242/root".into()),
            pids: vec![crate::report::NsPid { host: 4242, ns: 1 }],
            ..Default::default()
        };
        let l = container_line(&c, Some(4242));
        assert!(
            l.starts_with("container: hostname redis-0, id 3f6c2d9e8b7a,"),
            "{l}"
        );
        assert!(l.contains("kubernetes pod ab12 (burstable)"), "{l}");
        assert!(l.contains("namespaces of its own: mnt, pid, net"), "{l}");
        assert!(l.contains("pid 1 inside"), "{l}");
        assert!(l.ends_with("its files read through /proc/4242/root"), "{l}");
        // Its own pid namespace not in use: no pid to say.
        let bare = crate::report::Container {
            runtime: Some("docker".into()),
            id: Some("0123456789abcdef".into()),
            ..Default::default()
        };
        assert_eq!(
            container_line(&bare, Some(7)),
            "container: docker 0123456789ab"
        );
    }

    /// 200 SETs from a Unix-socket client and one over TCP (live bpf dates only the TCP
    /// one's arrival): the table says which were timed from where, not "read to reply" of
    /// a time that started at the arrival.
    #[test]
    fn commands_say_how_many_were_timed_from_their_arrival() {
        let row = |from_arrival| CommandStats {
            command: "SET".into(),
            calls: 201,
            p50_us: 13,
            p99_us: 135,
            max_us: 142_000,
            from_arrival,
            ..Default::default()
        };
        let text = |c: &CommandStats| {
            let mut out = vec![];
            commands(&[c], &mut out, &Paint { on: false }).unwrap();
            String::from_utf8(out).unwrap()
        };
        let dated = text(&row(1));
        assert!(!dated.contains("read to reply"), "{dated}");
        assert!(dated.contains("Unix-socket"), "{dated}");
        let set = dated.lines().find(|l| l.contains("SET")).unwrap();
        let cells: Vec<&str> = set.split_whitespace().collect();
        assert_eq!(&cells[..3], ["SET", "201", "1"], "{dated}");
        let undated = text(&row(0));
        assert!(undated.contains("read to reply"), "{undated}");
        assert!(!undated.contains("dated"), "{undated}");
    }

    #[test]
    fn long_paths_wrap_at_a_slash_and_nothing_is_lost() {
        let path = "/var/lib/redis-lab/s5/everysec-dd-yy/appendonlydir/appendonly.aof.1.incr.aof";
        let text = format!("1 stall over 10 ms, worst 28 ms on {path} (line 22810)");
        let out = wrap(&text, 9);
        assert!(out.lines().all(|l| l.chars().count() <= WIDTH), "{out}");
        assert!(out.lines().count() >= 2, "{out}");
        // The path's pieces end at a `/` and join back into it.
        let joined: String = out.lines().map(str::trim).collect::<Vec<_>>().join(" ");
        assert!(joined.replace("/ ", "/").contains(path), "{joined}");
        // A word without a slash is cut where it must be.
        let word = "x".repeat(150);
        let out = wrap(&word, 9);
        assert_eq!(out.lines().map(str::trim).collect::<String>(), word);
        assert!(out.lines().all(|l| l.chars().count() <= WIDTH));
    }
}
