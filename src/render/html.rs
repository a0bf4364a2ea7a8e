//! `--html FILE`: the whole report as one self-contained HTML page, at the end of the
//! pipeline next to the other renderers. It holds the timeline SVG inline and the text
//! report's tables (findings, stalls, incidents, phases, commands, syscalls, fds, threads),
//! with its style sheet inline and no script, font or image fetched from anywhere, so the
//! file can be mailed or attached to a ticket and opened offline.
//!
//! The markup is written as well-formed XML (every element closed, every text escaped, no
//! named entities) so that it is also valid XHTML and tests can parse it with an XML parser.

use super::markup::{count, dur, esc, offset};
use super::sections::{sections, PhaseBlock, Section, StallRows, View};
use crate::report::{
    Bound, CommandStats, FdStats, FileClass, Finding, IdleStats, Incident, PhaseStats, Report,
    Severity, Skipped, SlowCall, StallKind, SyscallStats, ThreadInfo,
};
use std::io::{self, Write};

const STYLE: &str = r#"
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px 32px; color: #222; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px 0; }
h2 { font-size: 17px; margin: 28px 0 8px 0; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
p.meta { color: #555; margin: 2px 0; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; margin: 4px 0 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; font-weight: 600; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.path { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; word-break: break-all; max-width: 420px; }
td.nowrap { white-space: nowrap; }
td.path { min-width: 180px; }
code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; background: #f2f2f2; padding: 0 3px; border-radius: 2px; }
td.mono { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; white-space: nowrap; }
tr:nth-child(even) td { background: #fafafa; }
.sev { font-weight: 600; padding: 1px 6px; border-radius: 3px; color: #fff; white-space: nowrap; }
.sev-critical { background: #c0392b; }
.sev-warning { background: #d68910; }
.sev-info { background: #5d6d7e; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 5px; margin-right: 5px; vertical-align: baseline; }
.plot { overflow-x: auto; }
.note { color: #666; font-size: 12px; }
footer { margin-top: 32px; color: #888; font-size: 12px; }
"#;

/// A table cell: text and how to align/format it.
enum Cell {
    Text(String),
    Num(String),
    Path(String),
    Mono(String),
    /// Pre-escaped markup (severity badges, colour swatches).
    Raw(String),
    /// Prose from the analyzer: `backquoted` spans become <code>.
    Prose(String),
    /// Text that should not wrap (thread names).
    NoWrap(String),
}

/// Escapes prose and turns `backquoted` spans (config settings in advice) into <code>.
fn prose(s: &str) -> String {
    let parts: Vec<&str> = s.split('`').collect();
    if parts.len() < 3 {
        return esc(s).into_owned();
    }
    let mut out = String::new();
    for (i, p) in parts.iter().enumerate() {
        // An unmatched trailing backquote is kept as text.
        if i % 2 == 1 && i + 1 < parts.len() {
            out.push_str(&format!("<code>{}</code>", esc(p)));
        } else {
            if i % 2 == 1 {
                out.push('`');
            }
            out.push_str(&esc(p));
        }
    }
    out
}

fn text(s: impl Into<String>) -> Cell {
    Cell::Text(s.into())
}
fn num(s: impl Into<String>) -> Cell {
    Cell::Num(s.into())
}
fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "–".into())
}

fn table(w: &mut dyn Write, id: &str, head: &[&str], rows: Vec<Vec<Cell>>) -> io::Result<()> {
    writeln!(w, "<table id=\"{id}\"><thead><tr>")?;
    for h in head {
        // Column headers ending in a unit or a count are numeric: align them with their cells.
        let numeric = matches!(
            *h,
            "calls"
                | "errors"
                | "total"
                | "p50"
                | "p99"
                | "max"
                | "duration"
                | "stalls"
                | "fd"
                | "pid"
                | "tid"
                | "count"
                | "syscalls"
                | "fork"
                | "clients"
                | "commands"
                | "worst wait"
                | "at"
                | "start"
                | "end"
                | "AOF time"
                | "log time"
                | "#"
                | "child"
        );
        writeln!(
            w,
            "<th{}>{}</th>",
            if numeric { " class=\"n\"" } else { "" },
            esc(h)
        )?;
    }
    writeln!(w, "</tr></thead><tbody>")?;
    for row in rows {
        write!(w, "<tr>")?;
        for c in row {
            match c {
                Cell::Text(s) => write!(w, "<td>{}</td>", esc(&s))?,
                Cell::Num(s) => write!(w, "<td class=\"n\">{}</td>", esc(&s))?,
                Cell::Path(s) => write!(w, "<td class=\"path\">{}</td>", esc(&s))?,
                Cell::Mono(s) => write!(w, "<td class=\"mono\">{}</td>", esc(&s))?,
                Cell::Raw(s) => write!(w, "<td>{s}</td>")?,
                Cell::Prose(s) => write!(w, "<td>{}</td>", prose(&s))?,
                Cell::NoWrap(s) => write!(w, "<td class=\"nowrap\">{}</td>", esc(&s))?,
            }
        }
        writeln!(w, "</tr>")?;
    }
    writeln!(w, "</tbody></table>")
}

/// A duration with its bound: `≥ 4.2 s`, `≤ 80 µs`, `12 ms`.
fn bounded(us: i64, b: Bound) -> String {
    match super::bound_word(b) {
        "" => dur(us),
        w => format!("{w} {}", dur(us)),
    }
}

fn severity(s: Severity) -> &'static str {
    match s {
        Severity::Critical => "critical",
        Severity::Warning => "warning",
        Severity::Info => "info",
    }
}

pub fn render(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    let title = match r.source.files.first() {
        Some(f) => format!("stallscope report: {f}"),
        None => format!("stallscope report: {} source", r.source.kind),
    };
    writeln!(w, "<!DOCTYPE html>")?;
    writeln!(
        w,
        "<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">"
    )?;
    writeln!(
        w,
        "<head><meta charset=\"utf-8\"/><title>{}</title>",
        esc(&title)
    )?;
    writeln!(
        w,
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>"
    )?;
    writeln!(w, "<style>{STYLE}</style></head>")?;
    writeln!(w, "<body>")?;
    for s in sections(r, View::Page) {
        match s {
            Section::Header => write_header(r, w)?,
            Section::Findings(f) => findings(f, w)?,
            Section::Timeline => timeline(r, w)?,
            Section::Lanes => super::lanes::write_section(r, w)?,
            Section::Stalls(s) => write_stalls(r, &s, w)?,
            Section::Slowest(s) => slowest(s, w)?,
            Section::IncidentList(i) => incidents(i, w)?,
            Section::Phases(b) => phases(&b, w)?,
            Section::Commands(c) => commands(&c, w)?,
            Section::Idle(i) => idle(i, super::timed(r), w)?,
            Section::Syscalls(s) => syscalls(s, super::timed(r), w)?,
            Section::Files(f) => files(f, super::timed(r), w)?,
            Section::Threads(t) => threads(t, w)?,
            Section::Host { notes, .. } => host(notes, w)?,
            Section::Skipped { first, .. } => skipped(first, w)?,
            // The terminal's views of the same data: the page has its own above.
            Section::Incidents(_) | Section::InFlight(_) => {}
        }
    }
    writeln!(
        w,
        "<footer>Generated by stallscope {} ({}). Times are offsets from the first event of the trace.</footer>",
        esc(env!("CARGO_PKG_VERSION")),
        esc(r.schema)
    )?;
    writeln!(w, "</body></html>")
}

fn findings(fs: &[Finding], w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "<section id=\"findings-section\"><h2>Findings</h2>")?;
    if fs.is_empty() {
        writeln!(w, "<p class=\"note\">No finding.</p>")?;
    } else {
        let rows = fs
            .iter()
            .map(|f| {
                vec![
                    Cell::Raw(format!(
                        "<span class=\"sev sev-{0}\">{0}</span>",
                        severity(f.severity)
                    )),
                    Cell::Mono(f.id.to_string()),
                    Cell::Prose(f.title.clone()),
                    Cell::Prose(f.evidence.clone()),
                    Cell::Prose(f.advice.clone()),
                    num(count(f.stalls)),
                ]
            })
            .collect();
        table(
            w,
            "findings",
            &["severity", "id", "finding", "evidence", "advice", "stalls"],
            rows,
        )?;
    }
    writeln!(w, "</section>")
}

fn timeline(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    writeln!(
        w,
        "<section id=\"timeline-section\"><h2>Timeline</h2><div class=\"plot\">"
    )?;
    super::svg::write_svg(r, w)?;
    writeln!(w, "</div>")?;
    writeln!(
        w,
        "<p class=\"note\">One mark per stall (hover for details): circles are slow syscalls coloured by file class, diamonds are gaps with no syscall, hollow marks are bounds rather than exact durations. Shaded bands are background saves.</p></section>"
    )
}

fn slowest(rows: &[SlowCall], w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "<section id=\"slowest-section\"><h2>Slowest calls</h2>")?;
    writeln!(w, "<p class=\"note\">The slowest calls of the trace, whatever the threshold (idle waits excluded).</p>")?;
    let rows = rows
        .iter()
        .map(|s| {
            let d = bounded(s.duration_us, s.bound);
            vec![
                Cell::Mono(s.ts.clone()),
                num(offset(s.at_us)),
                Cell::NoWrap(super::thread_label(s.who.thread.as_str(), s.who.tid, true)),
                Cell::Mono(s.syscall.clone()),
                num(opt(s.target.fd)),
                Cell::Raw(swatch(s.target.class)),
                Cell::Path(opt(s.target.path.as_ref())),
                num(d),
            ]
        })
        .collect();
    table(
        w,
        "slowest",
        &[
            "time", "at", "thread", "syscall", "fd", "class", "path", "duration",
        ],
        rows,
    )?;
    writeln!(w, "</section>")
}

fn incidents(list: &[Incident], w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "<section id=\"incidents-section\"><h2>Incidents</h2>")?;
    writeln!(w, "<p class=\"note\">Stalls that overlap in time, merged: what a client saw as one freeze.</p>")?;
    let rows = list
        .iter()
        .map(|i| {
            vec![
                Cell::Mono(i.ts.clone()),
                num(offset(i.start_at_us)),
                num(dur(i.duration_us)),
                num(i.stalls.len().to_string()),
                num(count(i.waiting_clients)),
                num(count(i.waiting_commands)),
                num(i.worst_wait_us.map(dur).unwrap_or_else(|| "–".into())),
                Cell::Mono(opt(i.finding.as_ref())),
            ]
        })
        .collect();
    table(
        w,
        "incidents",
        &[
            "time",
            "at",
            "duration",
            "stalls",
            "clients",
            "commands",
            "worst wait",
            "finding",
        ],
        rows,
    )?;
    writeln!(w, "</section>")
}

fn phases(blocks: &[PhaseBlock], w: &mut dyn Write) -> io::Result<()> {
    writeln!(
        w,
        "<section id=\"phases-section\"><h2>Background phases</h2>"
    )?;
    if blocks.is_empty() {
        writeln!(
            w,
            "<p class=\"note\">No background save or rewrite in the trace.</p>"
        )?;
    } else {
        let rows = blocks
            .iter()
            .map(|b| {
                let p = b.phase;
                vec![
                    text(super::markup::phase_style(p.kind).1),
                    num(p.child_pid.to_string()),
                    Cell::Mono(p.ts.clone()),
                    num(offset(p.start_at_us)),
                    num(p
                        .end_at_us
                        .map(offset)
                        .unwrap_or_else(|| "running at end".into())),
                    num(p
                        .end_at_us
                        .map(|e| dur(e - p.start_at_us))
                        .unwrap_or_else(|| "–".into())),
                    num(p.fork_us.map(dur).unwrap_or_else(|| "–".into())),
                    text(opt(p.ended_by.as_ref())),
                    text(
                        p.wrote
                            .iter()
                            .map(|c| c.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    ),
                ]
            })
            .collect();
        table(
            w,
            "phases",
            &[
                "kind", "child", "time", "start", "end", "duration", "fork", "ended by", "wrote",
            ],
            rows,
        )?;
    }
    let stats: Vec<&PhaseStats> = blocks
        .iter()
        .flat_map(|b| b.stats.iter().copied())
        .collect();
    if !stats.is_empty() {
        writeln!(
            w,
            "<p class=\"note\">Main-thread latency before, during and after each phase.</p>"
        )?;
        let rows = stats
            .iter()
            .map(|s| {
                let d = |d: &crate::report::Dist| {
                    format!(
                        "{} · {} · {} (n={})",
                        dur(d.p50_us),
                        dur(d.p99_us),
                        dur(d.max_us),
                        count(d.count)
                    )
                };
                vec![
                    num(s.phase.to_string()),
                    text(s.what.to_string()),
                    num(d(&s.before)),
                    num(d(&s.during)),
                    num(d(&s.after)),
                ]
            })
            .collect();
        table(
            w,
            "phase-stats",
            &["#", "what", "before p50 · p99 · max", "during", "after"],
            rows,
        )?;
    }
    writeln!(w, "</section>")
}

fn commands(list: &[&CommandStats], w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "<section id=\"commands-section\"><h2>Commands</h2>")?;
    let rows = list
        .iter()
        .map(|c| {
            vec![
                Cell::Mono(c.command.clone()),
                text(c.phase.as_str()),
                num(count(c.calls)),
                num(dur(c.p50_us)),
                num(dur(c.p99_us)),
                num(dur(c.max_us)),
                num(dur(c.aof_us)),
                num(dur(c.log_us)),
            ]
        })
        .collect();
    table(
        w,
        "commands",
        &[
            "command", "phase", "calls", "p50", "p99", "max", "AOF time", "log time",
        ],
        rows,
    )?;
    writeln!(w, "</section>")
}

/// A duration cell, or `-` in a trace that measures nothing (its zeros are not measurements).
fn timed_dur(timed: bool, us: i64) -> String {
    if timed {
        dur(us)
    } else {
        "-".into()
    }
}

fn idle(list: &[IdleStats], timed: bool, w: &mut dyn Write) -> io::Result<()> {
    let dur = |us| timed_dur(timed, us);
    writeln!(
        w,
        "<section id=\"idle-section\"><h2>Idle waits</h2>\
         <p class=\"note\">Time threads spent waiting for work: never counted as stalls.</p>"
    )?;
    let rows = list
        .iter()
        .map(|i| {
            vec![
                text(i.role.as_str()),
                Cell::Mono(i.syscall.clone()),
                num(count(i.calls)),
                num(dur(i.total_us)),
            ]
        })
        .collect();
    table(w, "idle", &["role", "wait", "calls", "total"], rows)?;
    writeln!(w, "</section>")
}

fn syscalls(list: &[SyscallStats], timed: bool, w: &mut dyn Write) -> io::Result<()> {
    let dur = |us| timed_dur(timed, us);
    writeln!(w, "<section id=\"syscalls-section\"><h2>Syscalls</h2>")?;
    let rows = list
        .iter()
        .map(|s| {
            vec![
                Cell::Mono(s.name.clone()),
                num(count(s.calls)),
                num(count(s.errors)),
                num(dur(s.total_us)),
                num(dur(s.p50_us)),
                num(dur(s.p99_us)),
                num(dur(s.max_us)),
            ]
        })
        .collect();
    table(
        w,
        "syscalls",
        &["syscall", "calls", "errors", "total", "p50", "p99", "max"],
        rows,
    )?;
    writeln!(w, "</section>")
}

fn files(list: &[FdStats], timed: bool, w: &mut dyn Write) -> io::Result<()> {
    let dur = |us| timed_dur(timed, us);
    writeln!(w, "<section id=\"fds-section\"><h2>File descriptors</h2>")?;
    let rows = list
        .iter()
        .map(|f| {
            vec![
                // 0: a trace without a pid column does not say whose fds these are.
                num(if f.pid == 0 {
                    "?".to_string()
                } else {
                    f.pid.to_string()
                }),
                num(f.fd.to_string()),
                Cell::Raw(swatch(Some(f.class))),
                Cell::Path(opt(f.path.as_ref())),
                num(count(f.calls)),
                num(dur(f.total_us)),
                num(dur(f.p50_us)),
                num(dur(f.p99_us)),
                num(dur(f.max_us)),
            ]
        })
        .collect();
    table(
        w,
        "fds",
        &[
            "pid", "fd", "class", "path", "calls", "total", "p50", "p99", "max",
        ],
        rows,
    )?;
    writeln!(w, "</section>")
}

fn threads(list: &[ThreadInfo], w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "<section id=\"threads-section\"><h2>Threads</h2>")?;
    let rows = list
        .iter()
        .map(|t| {
            vec![
                num(t.pid.to_string()),
                num(t.tid.to_string()),
                text(t.role.as_str()),
                text(opt(t.name.as_ref())),
                text(&t.why),
                num(count(t.syscalls)),
            ]
        })
        .collect();
    table(
        w,
        "threads",
        &["pid", "tid", "role", "name", "why", "syscalls"],
        rows,
    )?;
    writeln!(w, "</section>")
}

fn host(notes: &[String], w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "<section id=\"host-section\"><h2>Host</h2><ul>")?;
    for n in notes {
        writeln!(w, "<li>{}</li>", esc(n))?;
    }
    writeln!(w, "</ul></section>")
}

fn skipped(list: &[Skipped], w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "<section id=\"skipped-section\"><h2>Skipped lines</h2>")?;
    let rows = list
        .iter()
        .map(|s| {
            vec![
                num(s.line.to_string()),
                text(s.reason_text().as_ref()),
                Cell::Mono(s.text.clone()),
            ]
        })
        .collect();
    table(w, "skipped", &["line", "reason", "text"], rows)?;
    writeln!(w, "</section>")
}

fn swatch(class: Option<FileClass>) -> String {
    let c = class.unwrap_or(FileClass::Unknown);
    format!(
        "<span class=\"swatch\" style=\"background:{}\"></span>{}",
        super::markup::class_color(Some(c)),
        esc(c.as_str())
    )
}

fn write_header(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    let s = &r.summary;
    writeln!(w, "<header><h1>stallscope report</h1>")?;
    let mut src = String::new();
    if r.source.files.is_empty() {
        src.push_str(r.source.kind.as_str());
    } else {
        src.push_str(&r.source.files.join(", "));
    }
    if !r.source.format.is_empty() {
        src.push_str(&format!(" ({})", r.source.format));
    }
    if let Some(pid) = r.source.pid {
        src.push_str(&format!(", pid {pid}"));
    }
    writeln!(w, "<p class=\"meta\">Source: {}</p>", esc(&src))?;
    let start = s
        .start_iso
        .as_ref()
        .or(s.start.as_ref())
        .cloned()
        .unwrap_or_else(|| "unknown".into());
    writeln!(
        w,
        "<p class=\"meta\">Start {} · span {} · {} lines, {} syscalls, {} threads · durations {}</p>",
        esc(&start),
        esc(&dur(s.span_us)),
        esc(&count(s.lines)),
        esc(&count(s.syscalls)),
        esc(&count(s.threads)),
        esc(s.durations.as_str())
    )?;
    let mut line = format!(
        "<strong>{} stall{} over {}</strong>",
        count(s.stalls),
        crate::units::plural(s.stalls),
        esc(&dur(s.threshold_us))
    );
    if s.skipped_lines > 0 {
        line.push_str(&format!(" · {} lines skipped", count(s.skipped_lines)));
    }
    if s.lost_events > 0 {
        line.push_str(&format!(" · {} events lost", count(s.lost_events)));
    }
    if s.in_flight_at_start + s.in_flight_at_end > 0 {
        line.push_str(&format!(
            " · calls in flight: {} at the start, {} at the end",
            count(s.in_flight_at_start),
            count(s.in_flight_at_end)
        ));
    }
    writeln!(w, "<p class=\"meta\">{line}</p>")?;
    if let Some(o) = &r.live.overhead {
        if let Some(warn) = &o.warning {
            writeln!(w, "<p class=\"meta\">Tracer overhead: {}</p>", esc(warn))?;
        }
    }
    writeln!(w, "</header>")
}

/// "2 clients: INFO, SET" — who waited through a stall.
fn held_up(s: &crate::report::Stall) -> String {
    if s.waiting.clients == 0 && s.waiting.commands == 0 {
        return "–".into();
    }
    let mut t = format!(
        "{} client{}",
        s.waiting.clients,
        crate::units::plural(s.waiting.clients)
    );
    if !s.waiting.by_command.is_empty() {
        let cmds: Vec<String> = s
            .waiting
            .by_command
            .iter()
            .map(|(c, n)| {
                if *n == 1 {
                    c.clone()
                } else {
                    format!("{c}×{n}")
                }
            })
            .collect();
        t.push_str(": ");
        t.push_str(&cmds.join(", "));
    }
    if let Some(w) = s.waiting.worst_us {
        t.push_str(&format!("; worst wait {}", dur(w)));
    }
    t
}

fn write_stalls(r: &Report, st: &StallRows, w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "<section id=\"stalls-section\"><h2>Stalls</h2>")?;
    if st.total == 0 {
        writeln!(
            w,
            "<p class=\"note\">No stall over {}.</p></section>",
            esc(&dur(r.summary.threshold_us))
        )?;
        return Ok(());
    }
    if st.total > st.rows.len() {
        writeln!(
            w,
            "<p class=\"note\">The first {} of {} stalls, in trace order; the JSON report has them all.</p>",
            count(st.rows.len() as u64),
            count(st.total as u64)
        )?;
    }
    let rows = st
        .rows
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let what = match s.kind {
                StallKind::SlowSyscall => s.syscall.clone().unwrap_or_else(|| "syscall".into()),
                StallKind::Gap => "gap".into(),
            };
            let d = bounded(s.duration_us, s.bound);
            vec![
                num((i + 1).to_string()),
                Cell::Mono(s.ts.clone()),
                num(offset(s.at_us)),
                Cell::NoWrap(super::thread_label(s.who.thread.as_str(), s.who.tid, true)),
                Cell::Mono(what),
                num(opt(s.target.fd)),
                Cell::Raw(if s.kind == StallKind::Gap {
                    String::new()
                } else {
                    swatch(s.target.class)
                }),
                Cell::Path(opt(s.target.path.as_ref())),
                num(d),
                Cell::Prose(s.cause.clone()),
                text(held_up(s)),
                Cell::Mono(opt(s.finding.as_ref())),
            ]
        })
        .collect();
    table(
        w,
        "stalls",
        &[
            "#", "time", "at", "thread", "syscall", "fd", "class", "path", "duration", "cause",
            "held up", "finding",
        ],
        rows,
    )?;
    writeln!(w, "</section>")
}
