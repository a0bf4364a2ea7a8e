//! The HTML report's per-thread timeline, next to the scatter plot of `svg`: one lane per
//! thread (the main thread, the io and bio threads, each save child), the stalls as bars on
//! their lane, and above them what redis itself said (`redis` section: its log lines,
//! LATENCY events, SLOWLOG entries) as marks on the same time axis. A main-thread AOF write
//! that waited for a bio thread's fsync of the AOF gets an arrow from the end of that fsync
//! to the end of the write: the cross-thread cause that neither lane shows alone.
//!
//! Hand-written SVG like `svg`: no script, every mark has a `<title>` and `data-*`
//! attributes, so tests parse it and check it against the report.

use super::markup::{class_color, dur, esc, nice_ticks, phase_style, tick_label};
use crate::report::{FileClass, LogLevel, Report, Role, Stall, StallKind};
use std::io::{self, Write};

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 170.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 16.0;
const LANE_H: f64 = 28.0;
const BAR_H: f64 = 14.0;
const MARK_LANE_H: f64 = 34.0;
const AXIS_H: f64 = 36.0;
/// Most thread lanes drawn: beyond that the threads with the fewest stalls are left out.
const MAX_LANES: usize = 24;
/// Most bars drawn (the longest first); the tables keep every stall.
const MAX_BARS: usize = 5_000;
const FONT: &str = "font-family=\"sans-serif\"";
const ARROW_COLOR: &str = "#6c3483";

struct Lane {
    pid: u32,
    tid: u32,
    label: String,
}

/// Lane order: the main thread first, then the threads that serve or back it, then children.
fn role_rank(role: Role) -> u8 {
    match role {
        Role::Main => 0,
        Role::IoThread => 1,
        Role::BioAof => 2,
        Role::BioCloseFile => 3,
        Role::BioLazyFree | Role::BioRdbSave | Role::BioTlsReload => 4,
        Role::JemallocBg | Role::Other => 5,
        Role::Child => 6,
    }
}

fn lanes(r: &Report) -> Vec<Lane> {
    let stalls_of = |tid: u32| r.stalls.iter().filter(|s| s.who.tid == tid).count();
    let mut ts: Vec<&crate::report::ThreadInfo> = r
        .threads
        .iter()
        .filter(|t| {
            stalls_of(t.tid) > 0
                || matches!(
                    t.role,
                    Role::Main
                        | Role::BioAof
                        | Role::BioCloseFile
                        | Role::BioLazyFree
                        | Role::Child
                )
        })
        .collect();
    ts.sort_by_key(|t| {
        (
            role_rank(t.role),
            std::cmp::Reverse(stalls_of(t.tid)),
            t.tid,
        )
    });
    ts.truncate(MAX_LANES);
    let mut out: Vec<Lane> = ts
        .iter()
        .map(|t| Lane {
            pid: t.pid,
            tid: t.tid,
            label: match (&t.name, t.role) {
                (_, Role::Child) => format!("child {}", t.pid),
                (Some(n), role) if n != role.as_str() && !n.starts_with("redis") => {
                    format!("{} {} ({n})", role.as_str(), t.tid)
                }
                (_, role) => format!("{} {}", role.as_str(), t.tid),
            },
        })
        .collect();
    // A stall whose thread is not in the thread list (tid 0 of a single-process trace).
    for s in &r.stalls {
        if !out.iter().any(|l| l.tid == s.who.tid) && out.len() < MAX_LANES {
            out.push(Lane {
                pid: s.who.pid,
                tid: s.who.tid,
                label: super::thread_label(s.who.thread.as_str(), s.who.tid, false),
            });
        }
    }
    out
}

/// A main-thread AOF write and the bio fsync of the AOF it waited for: the fsync began
/// first and the write ended when (or just after) the fsync did.
pub(crate) fn waits_for_fsync(r: &Report) -> Vec<(&Stall, &Stall)> {
    let mut out = vec![];
    for m in r.stalls.iter().filter(|s| {
        s.who.thread == Role::Main
            && s.syscall.as_deref() == Some("write")
            && s.target.class == Some(FileClass::Aof)
    }) {
        let m_end = m.at_us + m.duration_us;
        let bio = r
            .stalls
            .iter()
            .filter(|b| {
                matches!(b.who.thread, Role::BioAof | Role::BioCloseFile | Role::BioLazyFree)
                    && b.syscall.as_deref().is_some_and(|n| {
                        crate::syscalls::info(n).facts.has(crate::syscalls::Facts::FSYNC)
                    })
                    && b.target.class == Some(FileClass::Aof)
                    && b.at_us <= m.at_us
                    // The write is released by the fsync's end: the two ends meet (the
                    // main thread needs a moment to be scheduled again).
                    && (b.at_us + b.duration_us - m_end).abs() <= 50_000.max(m.duration_us / 20)
            })
            .min_by_key(|b| (b.at_us + b.duration_us - m_end).abs());
        if let Some(b) = bio {
            out.push((m, b));
        }
    }
    out
}

/// Writes the lanes picture (an inline `<svg>` element), or nothing when there is no stall
/// and nothing of redis's to show.
pub fn write_lanes(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    write_lanes_at(r, w, None).map(|_| ())
}

/// The same, placed at `y` inside an enclosing picture when given (`--svg` draws it below
/// the scatter plot); returns its height, 0 when nothing was written.
pub(crate) fn write_lanes_at(r: &Report, w: &mut dyn Write, y: Option<f64>) -> io::Result<f64> {
    let red = r.redis.as_ref();
    let log_lines = red.map(|x| x.lines.as_slice()).unwrap_or(&[]);
    let server = red.and_then(|x| x.server.as_ref());
    let has_marks = !log_lines.is_empty()
        || server.is_some_and(|s| !s.latency.is_empty() || !s.slowlog.is_empty());
    if r.stalls.is_empty() && !has_marks {
        return Ok(0.0);
    }
    // The LATENCY / SLOWLOG lane only when redis was asked (--redis): an empty lane would
    // read as "redis saw nothing".
    let mark_labels: Vec<&str> = match (has_marks, server.is_some()) {
        (false, _) => vec![],
        (true, false) => vec!["redis log"],
        (true, true) => vec!["redis log", "LATENCY / SLOWLOG"],
    };
    let f = Frame::new(r, mark_labels.len());
    write_open(w, y, f.height)?;
    write_phase_bands(r, w, &f)?;
    write_lane_labels(w, &f, &mark_labels)?;
    write_bars(r, w, &f)?;
    write_waits(r, w, &f)?;
    if has_marks {
        write_log_marks(w, &f, log_lines)?;
        if let Some(sv) = server {
            write_server_marks(r, w, &f, sv)?;
        }
    }
    write_time_axis(r, w, &f)?;
    writeln!(w, "</svg>")?;
    Ok(f.height)
}

/// The picture's geometry: the time scale, the thread lanes and where they start (below
/// the marks' lanes), and the whole height.
struct Frame {
    lanes: Vec<Lane>,
    span: f64,
    t0: f64,
    t1: f64,
    plot_w: f64,
    lanes_top: f64,
    height: f64,
}

impl Frame {
    fn new(r: &Report, mark_lanes: usize) -> Frame {
        let lanes = lanes(r);
        let span = r.summary.span_us.max(1) as f64;
        let lanes_top = TOP + mark_lanes as f64 * MARK_LANE_H;
        let height = lanes_top + lanes.len() as f64 * LANE_H + AXIS_H;
        Frame {
            lanes,
            span,
            t0: 0f64,
            t1: span,
            plot_w: WIDTH - LEFT - RIGHT,
            lanes_top,
            height,
        }
    }

    /// A time on the axis.
    fn x(&self, at: f64) -> f64 {
        LEFT + (at.clamp(self.t0, self.t1) - self.t0) / (self.t1 - self.t0) * self.plot_w
    }

    /// The top of a thread's lane, when it has one.
    fn lane_y(&self, tid: u32) -> Option<f64> {
        self.lanes
            .iter()
            .position(|l| l.tid == tid)
            .map(|i| self.lanes_top + i as f64 * LANE_H)
    }
}

/// The `<svg>` element (placed at `y` in an enclosing picture), its title and the arrow's
/// marker.
fn write_open(w: &mut dyn Write, y: Option<f64>, height: f64) -> io::Result<()> {
    writeln!(
        w,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"lanes\"{pos} width=\"{WIDTH}\" height=\"{height:.0}\" viewBox=\"0 0 {WIDTH} {height:.0}\" {FONT} font-size=\"11\">",
        pos = y.map(|y| format!(" x=\"0\" y=\"{y:.0}\"")).unwrap_or_default()
    )?;
    writeln!(
        w,
        "<title>Stalls per thread, with redis's own log and latency events</title>"
    )?;
    writeln!(
        w,
        "<defs><marker id=\"arrowhead\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"{ARROW_COLOR}\"/></marker></defs>"
    )?;
    Ok(())
}

/// Phases: bands across every lane.
fn write_phase_bands(r: &Report, w: &mut dyn Write, f: &Frame) -> io::Result<()> {
    let height = f.height;
    let x = |at: f64| f.x(at);
    for (i, p) in r.phases.iter().enumerate() {
        let (fill, label) = phase_style(p.kind);
        let x0 = x(p.start_at_us as f64);
        let x1 = x(p.end_at_us.unwrap_or(r.summary.span_us) as f64);
        writeln!(
            w,
            "<rect class=\"phase\" data-phase=\"{i}\" x=\"{x0:.1}\" y=\"{TOP}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\" opacity=\"0.18\"><title>{label} child {} ({})</title></rect>",
            (x1 - x0).max(1.0),
            height - TOP - AXIS_H,
            p.child_pid,
            dur(p.end_at_us.map_or(r.summary.span_us - p.start_at_us, |e| e - p.start_at_us))
        )?;
    }
    Ok(())
}

/// Lane labels and guides: the marks' lanes, then one lane per thread.
fn write_lane_labels(w: &mut dyn Write, f: &Frame, mark_labels: &[&str]) -> io::Result<()> {
    let (plot_w, lanes_top) = (f.plot_w, f.lanes_top);
    let lanes = &f.lanes;
    for (k, label) in mark_labels.iter().enumerate() {
        let y = TOP + k as f64 * MARK_LANE_H;
        writeln!(
            w,
            "<text x=\"{:.0}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#333\">{label}</text>",
            LEFT - 8.0,
            y + MARK_LANE_H / 2.0 + 4.0
        )?;
        writeln!(
            w,
            "<line x1=\"{LEFT}\" x2=\"{:.0}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>",
            WIDTH - RIGHT,
            y + MARK_LANE_H / 2.0,
            y + MARK_LANE_H / 2.0
        )?;
    }
    for (i, l) in lanes.iter().enumerate() {
        let y = lanes_top + i as f64 * LANE_H;
        writeln!(
            w,
            "<g class=\"lane\" data-tid=\"{}\" data-pid=\"{}\"><rect x=\"{LEFT}\" y=\"{y:.1}\" width=\"{plot_w:.1}\" height=\"{LANE_H}\" fill=\"{}\"/><text x=\"{:.0}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#333\">{}</text></g>",
            l.tid,
            l.pid,
            if i % 2 == 0 { "#fafafa" } else { "#f2f2f2" },
            LEFT - 8.0,
            y + LANE_H / 2.0 + 4.0,
            esc(&l.label)
        )?;
    }
    Ok(())
}

/// Stalls as bars on their thread's lane.
fn write_bars(r: &Report, w: &mut dyn Write, f: &Frame) -> io::Result<()> {
    let x = |at: f64| f.x(at);
    let lane_y = |tid: u32| f.lane_y(tid);
    // Stalls as bars, the longest drawn first so short ones stay visible on top.
    let mut order: Vec<usize> = (0..r.stalls.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(r.stalls[i].duration_us));
    order.truncate(MAX_BARS);
    for i in order {
        let s = &r.stalls[i];
        let Some(y) = lane_y(s.who.tid) else { continue };
        let x0 = x(s.at_us as f64);
        let x1 = x((s.at_us + s.duration_us) as f64);
        let (fill, extra) = match s.kind {
            StallKind::Gap => ("#4d4d4d", " stroke-dasharray=\"3,2\" fill-opacity=\"0.5\""),
            StallKind::SlowSyscall => (class_color(s.target.class), ""),
        };
        let what = match &s.syscall {
            Some(sc) => format!(
                "{sc}() {}",
                super::file_label(s.target.class, s.target.path.as_deref())
            ),
            None => "no syscall (gap)".into(),
        };
        writeln!(
            w,
            "<rect class=\"stall-bar\" data-stall=\"{i}\" data-tid=\"{}\" x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{BAR_H}\" fill=\"{fill}\" stroke=\"#fff\" stroke-width=\"1.5\"{extra}><title>{} {} {}: {}</title></rect>",
            s.who.tid,
            y + (LANE_H - BAR_H) / 2.0,
            (x1 - x0).max(2.0),
            esc(&s.ts),
            dur(s.duration_us),
            esc(&what),
            esc(&s.cause)
        )?;
    }
    Ok(())
}

/// The cross-thread cause: an arrow from a bio fsync's end to the AOF write it released.
fn write_waits(r: &Report, w: &mut dyn Write, f: &Frame) -> io::Result<()> {
    let x = |at: f64| f.x(at);
    let lane_y = |tid: u32| f.lane_y(tid);
    for (m, b) in waits_for_fsync(r) {
        let (Some(ym), Some(yb)) = (lane_y(m.who.tid), lane_y(b.who.tid)) else {
            continue;
        };
        let xb = x((b.at_us + b.duration_us) as f64);
        let xm = x((m.at_us + m.duration_us) as f64);
        let (y_from, y_to) = (yb + LANE_H / 2.0, ym + LANE_H / 2.0);
        writeln!(
            w,
            "<path class=\"waits-for\" data-from-tid=\"{}\" data-to-tid=\"{}\" d=\"M {xb:.1} {y_from:.1} C {:.1} {y_from:.1}, {:.1} {y_to:.1}, {xm:.1} {:.1}\" fill=\"none\" stroke=\"{ARROW_COLOR}\" stroke-width=\"1.6\" marker-end=\"url(#arrowhead)\"><title>the main thread's write() to the AOF waited {} for this fdatasync() of the bio thread to end</title></path>",
            b.who.tid,
            m.who.tid,
            xb + 18.0,
            xm + 18.0,
            y_to + if y_to > y_from { -BAR_H / 2.0 } else { BAR_H / 2.0 },
            dur(m.duration_us)
        )?;
    }
    Ok(())
}

/// redis's log lines as ticks on their lane, taller for a warning or a line that names a
/// cause.
fn write_log_marks(
    w: &mut dyn Write,
    f: &Frame,
    log_lines: &[crate::report::RedisLogLine],
) -> io::Result<()> {
    let x = |at: f64| f.x(at);
    let y = TOP + MARK_LANE_H / 2.0;
    for l in log_lines {
        let big = l.meaning.is_some() || l.level == Some(LogLevel::Warning);
        let color = match l.level {
            Some(LogLevel::Warning) => "#c0392b",
            Some(LogLevel::Notice) => "#1f618d",
            _ => "#95a5a6",
        };
        let xx = x(l.at_us as f64);
        let (h, sw) = if big { (12.0, 2.0) } else { (7.0, 1.0) };
        writeln!(
            w,
            "<line class=\"log-mark\" data-line=\"{}\" data-at=\"{}\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-width=\"{sw}\"><title>{} [{} {}] {}</title></line>",
            l.line,
            l.at_us,
            y - h,
            y + h,
            esc(&l.ts),
            esc(l.role.as_str()),
            l.pid.map(|p| p.to_string()).unwrap_or_default(),
            esc(&l.message)
        )?;
    }
    Ok(())
}

/// LATENCY and SLOWLOG records on their lane.
fn write_server_marks(
    r: &Report,
    w: &mut dyn Write,
    f: &Frame,
    sv: &crate::report::RedisServerInfo,
) -> io::Result<()> {
    let x = |at: f64| f.x(at);
    let y = TOP + MARK_LANE_H * 1.5;
    // Both are stamped to the second (the event ended somewhere in it): each is a
    // bar over its second, LATENCY above the line, SLOWLOG below.
    let second = |at: i64| {
        (
            x(at as f64),
            (x((at + 1_000_000) as f64) - x(at as f64)).max(3.0),
        )
    };
    for l in &sv.latency {
        if !(-1_000_000..=r.summary.span_us).contains(&l.at_us) {
            continue;
        }
        let (xx, wd) = second(l.at_us);
        writeln!(
            w,
            "<rect class=\"latency-mark\" data-event=\"{}\" data-at=\"{}\" x=\"{xx:.1}\" y=\"{:.1}\" width=\"{wd:.1}\" height=\"7\" fill=\"#8e44ad\" fill-opacity=\"0.75\"><title>LATENCY {} {} ms, in this second (redis stamps events to the second)</title></rect>",
            esc(&l.event),
            l.at_us,
            y - 8.0,
            esc(&l.event),
            l.latency_ms
        )?;
    }
    for e in &sv.slowlog {
        if !(-1_000_000..=r.summary.span_us).contains(&e.at_us) {
            continue;
        }
        let (xx, wd) = second(e.at_us);
        writeln!(
            w,
            "<rect class=\"slowlog-mark\" data-at=\"{}\" x=\"{xx:.1}\" y=\"{:.1}\" width=\"{wd:.1}\" height=\"7\" fill=\"#16a085\" fill-opacity=\"0.75\"><title>SLOWLOG #{} {} {}, in this second</title></rect>",
            e.at_us,
            y + 1.0,
            e.id,
            esc(&e.command),
            dur(e.duration_us)
        )?;
    }
    Ok(())
}

/// The time axis under the lanes, and when time 0 is.
fn write_time_axis(r: &Report, w: &mut dyn Write, f: &Frame) -> io::Result<()> {
    let (span, t0, t1, lanes_top) = (f.span, f.t0, f.t1, f.lanes_top);
    let lanes = &f.lanes;
    let x = |at: f64| f.x(at);
    let base = lanes_top + lanes.len() as f64 * LANE_H;
    writeln!(
        w,
        "<line x1=\"{LEFT}\" x2=\"{:.0}\" y1=\"{base:.1}\" y2=\"{base:.1}\" stroke=\"#444\"/>",
        WIDTH - RIGHT
    )?;
    let (unit, name) = if span >= 10_000_000.0 {
        (1e6, "s")
    } else if span >= 10_000.0 {
        (1e3, "ms")
    } else {
        (1.0, "µs")
    };
    let (ticks, step) = nice_ticks(t0 / unit, t1 / unit, 10);
    for t in ticks {
        let xx = x(t * unit);
        writeln!(
            w,
            "<line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{base:.1}\" y2=\"{:.1}\" stroke=\"#444\"/><text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#333\">{}</text>",
            base + 4.0,
            base + 16.0,
            tick_label(t, step)
        )?;
    }
    let start = r
        .summary
        .start_iso
        .as_deref()
        .or(r.summary.start.as_deref())
        .unwrap_or("");
    writeln!(
        w,
        "<text x=\"{:.0}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">{name} since {}</text>",
        WIDTH - RIGHT,
        base + 32.0,
        esc(start)
    )?;
    Ok(())
}

/// The HTML section: the lanes, how redis's clock was read, and each stall's evidence
/// (`sections` writes it when there is a stall or something redis said).
pub fn write_section(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    writeln!(
        w,
        "<section id=\"lanes-section\"><h2>Threads and redis's own signals</h2><div class=\"plot\">"
    )?;
    write_lanes(r, w)?;
    writeln!(w, "</div>")?;
    writeln!(
        w,
        "<p class=\"note\">One lane per thread, stalls as bars coloured by file class (dashed grey: a gap with no syscall); shaded bands are background saves. Above: redis's log lines (tall marks: warnings and lines that name a cause) and, with --redis, LATENCY events (purple, above) and SLOWLOG entries (green, below), each over the second redis stamped it with. An arrow runs from the end of a bio thread's fsync of the AOF to the end of the main thread's write that waited for it.</p>"
    )?;
    let Some(red) = &r.redis else {
        return writeln!(w, "</section>");
    };
    writeln!(w, "<p class=\"note\">{}</p>", esc(&red.clock))?;
    if let Some(l) = &red.log {
        writeln!(
            w,
            "<p class=\"note\">redis's log: <code>{}</code> ({}; {} lines, {} in the trace's window{})</p>",
            esc(&l.path),
            esc(l.found.as_str()),
            l.lines_read,
            red.lines.len() as u64 + red.lines_not_listed,
            if l.followed { "; followed while tracing" } else { "" }
        )?;
    }
    for n in &red.notes {
        writeln!(w, "<p class=\"note\">{}</p>", esc(n))?;
    }
    let rows: Vec<(usize, &crate::report::RedisEvidence)> = r
        .stalls
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.redis_evidence.iter().flatten().map(move |e| (i, e)))
        .take(2_000)
        .collect();
    if rows.is_empty() {
        return writeln!(
            w,
            "<p class=\"note\">No stall has any of redis's signals in its window.</p></section>"
        );
    }
    writeln!(
        w,
        "<table id=\"redis-evidence\"><thead><tr><th class=\"n\">stall</th><th>stall time</th><th>source</th><th>time</th><th>what redis said</th></tr></thead><tbody>"
    )?;
    for (i, e) in rows {
        let s = &r.stalls[i];
        writeln!(
            w,
            "<tr><td class=\"n\">{}</td><td class=\"mono\">{}</td><td>{}</td><td class=\"mono\">{}</td><td>{}</td></tr>",
            i + 1,
            esc(&s.ts),
            e.source,
            esc(&e.ts),
            esc(&e.what)
        )?;
    }
    writeln!(w, "</tbody></table></section>")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::*;

    fn stall(
        at_us: i64,
        duration_us: i64,
        tid: u32,
        thread: &str,
        syscall: &str,
        class: &str,
    ) -> Stall {
        Stall {
            ts: format!("+{at_us}"),
            who: crate::report::ThreadRef {
                pid: 100,
                tid,
                thread: thread.into(),
            },
            syscall: Some(syscall.into()),
            target: crate::report::FdRef {
                fd: Some(7),
                path: Some("/d/appendonly.aof".into()),
                class: Some(class.into()),
            },
            cause: "c".into(),
            ..Stall::sample(at_us, duration_us)
        }
    }

    fn report() -> Report {
        let mut r = Report {
            schema: SCHEMA,
            ..Default::default()
        };
        r.summary.span_us = 10_000_000;
        for (tid, role) in [(100, "main"), (103, "bio_aof"), (104, "bio_lazy_free")] {
            r.threads.push(ThreadInfo {
                pid: 100,
                tid,
                role: role.into(),
                name: None,
                why: "name".into(),
                syscalls: 1,
            });
        }
        // bio fsync 1.0-4.0 s; the main write 3.0-4.01 s waits for it.
        r.stalls.push(stall(
            1_000_000,
            3_000_000,
            103,
            "bio_aof",
            "fdatasync",
            "aof",
        ));
        r.stalls
            .push(stall(3_000_000, 1_010_000, 100, "main", "write", "aof"));
        // An unrelated main-thread write that ends long after any fsync.
        r.stalls
            .push(stall(7_000_000, 500_000, 100, "main", "write", "aof"));
        r.redis = Some(RedisSection {
            lines: vec![RedisLogLine {
                meaning: None,
                at_us: 2_999_000,
                ts: "x".into(),
                line: 9,
                pid: Some(100),
                role: LogRole::Master,
                level: Some(LogLevel::Notice),
                message: "Asynchronous AOF fsync is taking too long (disk is busy?).".into(),
            }],
            server: Some(RedisServerInfo {
                latency: vec![RedisLatency {
                    event: "aof-write-pending-fsync".into(),
                    ts: 0,
                    at_us: 4_000_000,
                    latency_ms: 1010,
                }],
                ..Default::default()
            }),
            ..Default::default()
        });
        r
    }

    #[test]
    fn lanes_bars_marks_and_the_arrow() {
        let r = report();
        let mut out = vec![];
        write_lanes(&r, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
        let class = |c: &str| -> Vec<roxmltree::Node> {
            doc.descendants()
                .filter(|n| n.attribute("class") == Some(c))
                .collect()
        };
        let lanes: Vec<&str> = class("lane")
            .iter()
            .map(|n| n.attribute("data-tid").unwrap())
            .collect();
        // The main thread first, then the bio threads.
        assert_eq!(lanes, vec!["100", "103", "104"]);
        let bars = class("stall-bar");
        assert_eq!(bars.len(), 3);
        // Each bar sits in its thread's lane.
        let lane_y = |tid: &str| -> f64 {
            class("lane")
                .iter()
                .find(|n| n.attribute("data-tid") == Some(tid))
                .unwrap()
                .first_element_child()
                .unwrap()
                .attribute("y")
                .unwrap()
                .parse()
                .unwrap()
        };
        for b in &bars {
            let tid = b.attribute("data-tid").unwrap();
            let y: f64 = b.attribute("y").unwrap().parse().unwrap();
            assert!(y > lane_y(tid) && y < lane_y(tid) + LANE_H, "{tid}");
        }
        // One arrow: bio 103 to main 100, for the write that ended with the fsync only.
        let arrows = class("waits-for");
        assert_eq!(arrows.len(), 1);
        assert_eq!(arrows[0].attribute("data-from-tid"), Some("103"));
        assert_eq!(arrows[0].attribute("data-to-tid"), Some("100"));
        assert_eq!(class("log-mark").len(), 1);
        assert_eq!(class("latency-mark").len(), 1);
        // The log mark is left of the main write bar's start, as its time is.
        let lx: f64 = class("log-mark")[0]
            .attribute("x1")
            .unwrap()
            .parse()
            .unwrap();
        let wx: f64 = bars
            .iter()
            .find(|b| b.attribute("data-stall") == Some("1"))
            .unwrap()
            .attribute("x")
            .unwrap()
            .parse()
            .unwrap();
        assert!(lx < wx && wx - lx < 1.0);
    }

    #[test]
    fn nothing_to_draw_draws_nothing() {
        let mut r = report();
        r.stalls.clear();
        r.redis = None;
        let mut out = vec![];
        write_lanes(&r, &mut out).unwrap();
        assert!(out.is_empty());
    }
}
