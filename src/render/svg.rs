//! `--svg FILE`: the report's timeline as a standalone SVG picture, at the end of the
//! pipeline next to the table and JSON renderers. Time since the first event runs along x,
//! syscall duration on a log y axis; every stall is one mark coloured by file class (gaps,
//! which have no syscall and no file, get a different shape), background-save phases are
//! shaded bands, the threshold is a dashed line, and live reports add a strip below with the
//! host's minor-fault rate and iowait. The HTML report embeds the same picture.
//!
//! Hand-written SVG with no scripts and no external fonts, so it opens anywhere and can be
//! attached to an incident ticket as is. Every mark carries a `<title>` (hover text) and
//! `data-*` attributes so the picture can be checked against the report.

use super::markup::{class_color, decade_label, dur, esc, nice_ticks, phase_style, tick_label};
use crate::report::{Bound, FileClass, PhaseKind, Report, StallKind};
use std::io::{self, Write};

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 56.0;
const PLOT_H: f64 = 380.0;
const AXIS_H: f64 = 48.0;
const STRIP_GAP: f64 = 22.0;
const STRIP_H: f64 = 120.0;
const GAP_COLOR: &str = "#4d4d4d";
const THRESHOLD_COLOR: &str = "#c0392b";
const MINFLT_COLOR: &str = "#8e44ad";
const IOWAIT_COLOR: &str = "#138d75";
const X_TICKS: usize = 10;
/// Above this many stalls only the longest get a time-extent line: a thousand overlapping
/// lines hide the marks they belong to.
const EXTENTS_ALL_UP_TO: usize = 300;
const EXTENTS_LONGEST: usize = 60;
/// Most stall marks drawn; the HTML tables and the JSON keep every stall.
pub const MAX_MARKS: usize = 20_000;
/// Most context dots (timeline calls under the threshold) drawn.
pub const MAX_CONTEXT: usize = 30_000;
const FONT: &str = "font-family=\"sans-serif\"";

/// Writes a standalone SVG document: the scatter plot and, below it, the per-thread lanes
/// with redis's own signals (`lanes`), as the HTML report shows them one after the other.
pub fn render(report: &Report, w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>")?;
    let top = Geometry::new(report).height.round();
    let mut lanes = Vec::new();
    let lanes_h = super::lanes::write_lanes_at(report, &mut lanes, Some(top))?;
    if lanes_h == 0.0 {
        return write_svg(report, w);
    }
    let h = top + lanes_h.round();
    writeln!(
        w,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"stallscope-report\" width=\"{WIDTH}\" height=\"{h:.0}\" viewBox=\"0 0 {WIDTH} {h:.0}\" {FONT}>"
    )?;
    write_svg(report, w)?;
    w.write_all(&lanes)?;
    writeln!(w, "</svg>")
}

/// Maps report times and durations to picture coordinates.
pub(crate) struct Geometry {
    pub t0: f64,
    pub t1: f64,
    /// log10 of the lowest and highest µs on the y axis (whole decades).
    pub lo_dec: i32,
    pub hi_dec: i32,
    pub plot_w: f64,
    pub has_host: bool,
    pub height: f64,
}

impl Geometry {
    pub fn new(r: &Report) -> Self {
        let mut t0 = 0f64;
        let mut t1 = r.summary.span_us.max(0) as f64;
        let mut lo = r.summary.threshold_us.max(1) as f64;
        let mut hi = lo;
        for s in &r.stalls {
            t0 = t0.min(s.at_us as f64);
            t1 = t1.max((s.at_us + s.duration_us.max(0)) as f64);
            let d = s.duration_us.max(1) as f64;
            lo = lo.min(d);
            hi = hi.max(d);
        }
        for p in &r.phases {
            t0 = t0.min(p.start_at_us as f64);
            t1 = t1.max(p.end_at_us.unwrap_or(p.start_at_us) as f64);
        }
        for c in context_calls(r) {
            t0 = t0.min(c.at_us as f64);
            t1 = t1.max(c.at_us as f64);
            let d = c.duration_us.max(1) as f64;
            lo = lo.min(d);
            hi = hi.max(d);
        }
        let samples = r
            .live
            .host
            .as_ref()
            .map(|h| h.samples.as_slice())
            .unwrap_or(&[]);
        for s in samples {
            t1 = t1.max(s.at_us as f64);
        }
        if t1 - t0 < 1.0 {
            t1 = t0 + 1_000.0;
        }
        // End the axis on a tick so the last label sits at the plot's right edge.
        let (div, _) = unit_for(t1 - t0);
        let (_, step) = nice_ticks(t0 / div, t1 / div, X_TICKS);
        t1 = ((t1 / div / step - 1e-9).ceil() * step * div).max(t1);
        // A decade under the threshold always shows, so the threshold line never sits on
        // the frame and marks just over it stand clear of the axis.
        let th_dec = (r.summary.threshold_us.max(1) as f64).log10().floor() as i32;
        let mut lo_dec = (lo.log10().floor() as i32).min(th_dec - 1).max(0);
        let mut hi_dec = (hi.log10() + 1e-9).ceil() as i32;
        if hi_dec <= lo_dec {
            hi_dec = lo_dec + 1;
        }
        // At least three decades, so two stalls of similar size still sit on a readable scale
        // with the threshold between labelled ticks.
        while hi_dec - lo_dec < 3 {
            if lo_dec > 0 {
                lo_dec -= 1;
            }
            if hi_dec - lo_dec < 3 {
                hi_dec += 1;
            }
        }
        let has_host = !samples.is_empty();
        let mut height = TOP + PLOT_H + AXIS_H;
        if has_host {
            height += STRIP_GAP + STRIP_H + AXIS_H - 14.0;
        }
        Geometry {
            t0,
            t1,
            lo_dec,
            hi_dec,
            plot_w: WIDTH - LEFT - RIGHT,
            has_host,
            height,
        }
    }

    pub fn x(&self, at_us: f64) -> f64 {
        LEFT + (at_us - self.t0) / (self.t1 - self.t0) * self.plot_w
    }

    pub fn y(&self, dur_us: f64) -> f64 {
        let v = dur_us
            .max(1.0)
            .log10()
            .clamp(self.lo_dec as f64, self.hi_dec as f64);
        TOP + PLOT_H - (v - self.lo_dec as f64) / (self.hi_dec - self.lo_dec) as f64 * PLOT_H
    }

    /// The x unit that keeps tick labels short: (divisor from µs, name).
    fn unit(&self) -> (f64, &'static str) {
        unit_for(self.t1 - self.t0)
    }

    fn strip_top(&self) -> f64 {
        TOP + PLOT_H + AXIS_H + STRIP_GAP - 14.0
    }
}

/// The x unit for a time span in µs: (divisor from µs, name).
fn unit_for(span: f64) -> (f64, &'static str) {
    if span >= 2_000_000.0 {
        (1_000_000.0, "s")
    } else if span >= 2_000.0 {
        (1_000.0, "ms")
    } else {
        (1.0, "µs")
    }
}

/// Writes the `<svg>` element alone (the HTML report inlines it).
pub fn write_svg(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    let g = Geometry::new(r);
    let plot_b = TOP + PLOT_H;
    let plot_r = LEFT + g.plot_w;
    write_opening(r, w, &g)?;
    write_heading(r, w)?;
    // Plot frame background.
    writeln!(
        w,
        "<rect class=\"plot-area\" x=\"{LEFT}\" y=\"{TOP}\" width=\"{:.1}\" height=\"{PLOT_H}\" fill=\"#fbfbfb\" stroke=\"none\"/>",
        g.plot_w
    )?;

    write_phase_bands(r, w, &g)?;
    write_y_axis(w, &g, plot_r)?;

    // X axis.
    write_x_axis(w, &g, plot_b)?;

    // Frame.
    writeln!(
        w,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{:.1}\" height=\"{PLOT_H}\" fill=\"none\" stroke=\"#888\"/>",
        g.plot_w
    )?;

    write_threshold(r, w, &g, plot_r)?;
    write_context(r, w, &g)?;
    write_marks(r, w, &g)?;
    write_mark_notes(r, w, &g)?;
    if g.has_host {
        write_host_strip(r, w, &g)?;
    }
    write_legend(r, w, &g)?;
    writeln!(w, "</svg>")
}

/// The `<svg>` element, its title (what the picture shows, for screen readers) and its
/// white background.
fn write_opening(r: &Report, w: &mut dyn Write, g: &Geometry) -> io::Result<()> {
    writeln!(
        w,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"stallscope-timeline\" width=\"{WIDTH}\" height=\"{h:.0}\" viewBox=\"0 0 {WIDTH} {h:.0}\" {FONT} font-size=\"12\" role=\"img\">",
        h = g.height
    )?;
    let slow = r
        .stalls
        .iter()
        .filter(|s| s.kind == StallKind::SlowSyscall)
        .count();
    let gaps = r.stalls.len() - slow;
    writeln!(
        w,
        "<title>{}</title>",
        esc(&format!(
            "stallscope timeline: {} stalls over {} ({slow} slow syscalls, {gaps} gaps)",
            r.stalls.len(),
            dur(r.summary.threshold_us)
        ))
    )?;
    writeln!(
        w,
        "<rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{:.0}\" fill=\"#ffffff\"/>",
        g.height
    )?;

    Ok(())
}

/// The heading: how many stalls over what, and from which trace.
fn write_heading(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    let heading = format!(
        "{} stall{} over {} in {} of trace",
        super::markup::count(r.stalls.len() as u64),
        crate::units::plural(r.stalls.len() as u64),
        dur(r.summary.threshold_us),
        dur(r.summary.span_us)
    );
    writeln!(
        w,
        "<text x=\"{LEFT}\" y=\"22\" font-size=\"16\" font-weight=\"bold\" fill=\"#222\">{}</text>",
        esc(&heading)
    )?;
    let mut sub = String::new();
    if !r.source.files.is_empty() {
        sub.push_str(&r.source.files.join(", "));
    } else {
        sub.push_str(r.source.kind.as_str());
    }
    if let Some(start) = r.summary.start_iso.as_ref().or(r.summary.start.as_ref()) {
        if !sub.is_empty() {
            sub.push_str(" · ");
        }
        sub.push_str("time 0 = ");
        sub.push_str(start);
    }
    if !sub.is_empty() {
        let sub: String = sub.chars().take(150).collect();
        writeln!(
            w,
            "<text x=\"{LEFT}\" y=\"40\" fill=\"#555\">{}</text>",
            esc(&sub)
        )?;
    }

    Ok(())
}

/// Background phases as bands, under everything else (and under the host strip).
fn write_phase_bands(r: &Report, w: &mut dyn Write, g: &Geometry) -> io::Result<()> {
    writeln!(w, "<g class=\"phases\">")?;
    for (i, p) in r.phases.iter().enumerate() {
        let end = p.end_at_us.map(|e| e as f64).unwrap_or(g.t1);
        let x0 = g.x(p.start_at_us as f64);
        let x1 = g.x(end).max(x0 + 1.0);
        let (fill, label) = phase_style(p.kind);
        let mut title = format!(
            "{label} (child {}): {} from {}",
            p.child_pid,
            if p.end_at_us.is_some() {
                dur(end as i64 - p.start_at_us)
            } else {
                "still running at trace end".into()
            },
            p.ts
        );
        if let Some(f) = p.fork_us {
            title.push_str(&format!(", fork took {}", dur(f)));
        }
        let mut bands = vec![(TOP, PLOT_H)];
        if g.has_host {
            bands.push((g.strip_top(), STRIP_H));
        }
        for (y, h) in bands {
            writeln!(
                w,
                "<rect class=\"phase-band\" data-phase=\"{i}\" data-kind=\"{}\" data-start-us=\"{}\" data-end-us=\"{}\" x=\"{x0:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{fill}\" fill-opacity=\"0.28\"><title>{}</title></rect>",
                esc(p.kind.as_str()),
                p.start_at_us,
                end as i64,
                x1 - x0,
                esc(&title)
            )?;
        }
        if x1 - x0 > 46.0 {
            writeln!(
                w,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"#6b5a2a\">{}</text>",
                x0 + 4.0,
                TOP + 13.0,
                esc(&format!("{label} {}", p.child_pid))
            )?;
        }
    }
    writeln!(w, "</g>")?;
    Ok(())
}

/// The Y axis: decades with labels, minor grid lines between them.
fn write_y_axis(w: &mut dyn Write, g: &Geometry, plot_r: f64) -> io::Result<()> {
    writeln!(
        w,
        "<g class=\"axis y-axis\" data-lo-us=\"{}\" data-hi-us=\"{}\">",
        10f64.powi(g.lo_dec),
        10f64.powi(g.hi_dec)
    )?;
    let decades = g.hi_dec - g.lo_dec;
    for e in g.lo_dec..=g.hi_dec {
        let y = g.y(10f64.powi(e));
        writeln!(w, "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{plot_r:.1}\" y2=\"{y:.1}\" stroke=\"#d9d9d9\"/>")?;
        writeln!(
            w,
            "<text class=\"tick-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#333\">{}</text>",
            LEFT - 8.0,
            y + 4.0,
            esc(&decade_label(e))
        )?;
        if e < g.hi_dec && decades <= 6 {
            for m in 2..10 {
                let y = g.y(m as f64 * 10f64.powi(e));
                writeln!(w, "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{plot_r:.1}\" y2=\"{y:.1}\" stroke=\"#efefef\"/>")?;
            }
        }
    }
    writeln!(
        w,
        "<text x=\"18\" y=\"{:.1}\" transform=\"rotate(-90 18 {:.1})\" text-anchor=\"middle\" fill=\"#333\">duration (log scale)</text>",
        TOP + PLOT_H / 2.0,
        TOP + PLOT_H / 2.0
    )?;
    writeln!(w, "</g>")?;
    Ok(())
}

/// The threshold as a dashed line.
fn write_threshold(r: &Report, w: &mut dyn Write, g: &Geometry, plot_r: f64) -> io::Result<()> {
    let ty = g.y(r.summary.threshold_us.max(1) as f64);
    writeln!(
        w,
        "<g class=\"threshold\" data-threshold-us=\"{}\"><line x1=\"{LEFT}\" y1=\"{ty:.1}\" x2=\"{plot_r:.1}\" y2=\"{ty:.1}\" stroke=\"{THRESHOLD_COLOR}\" stroke-width=\"1.2\" stroke-dasharray=\"6 4\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\" fill=\"{THRESHOLD_COLOR}\">{}</text></g>",
        r.summary.threshold_us,
        plot_r - 4.0,
        ty - 4.0,
        esc(&format!("threshold {}", dur(r.summary.threshold_us)))
    )?;
    Ok(())
}

/// The stall marks.
fn write_marks(r: &Report, w: &mut dyn Write, g: &Geometry) -> io::Result<()> {
    // Marks. Big stalls are drawn last so they stay on top of a crowd of small ones; past
    // MAX_MARKS only the longest are drawn (the picture would not show more anyway).
    let n = r.stalls.len();
    let radius = if n <= 50 {
        5.5
    } else if n <= 400 {
        4.0
    } else {
        3.2
    };
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| r.stalls[i].duration_us);
    let order = order.split_off(n.saturating_sub(MAX_MARKS));
    let n = order.len();
    let extents_from = if n <= EXTENTS_ALL_UP_TO {
        0
    } else {
        n.saturating_sub(EXTENTS_LONGEST)
    };
    writeln!(w, "<g class=\"stalls\">")?;
    for (rank, i) in order.into_iter().enumerate() {
        write_mark(r, w, g, i, radius, rank >= extents_from)?;
    }
    writeln!(w, "</g>")
}

/// One stall: a circle (a slow call) or a diamond (a gap), hollow when its duration is a
/// bound, with its extent in time when `extent` and it is wide enough to see.
fn write_mark(
    r: &Report,
    w: &mut dyn Write,
    g: &Geometry,
    i: usize,
    radius: f64,
    extent: bool,
) -> io::Result<()> {
    let s = &r.stalls[i];
    let x = g.x(s.at_us as f64);
    let y = g.y(s.duration_us.max(1) as f64);
    let x_end = g.x((s.at_us + s.duration_us.max(0)) as f64);
    let (color, kind_class) = match s.kind {
        StallKind::SlowSyscall => (class_color(s.target.class), "slow"),
        StallKind::Gap => (GAP_COLOR, "gap"),
    };
    let exact = s.bound == Bound::Exact;
    let fill = if exact { color } else { "#ffffff" };
    let what = match (&s.kind, &s.syscall) {
        (StallKind::SlowSyscall, Some(sc)) => {
            let mut t = sc.clone();
            if let Some(fd) = s.target.fd {
                t.push_str(&format!("({fd})"));
            }
            t
        }
        (StallKind::SlowSyscall, None) => "syscall".into(),
        (StallKind::Gap, _) => "gap (no syscall)".into(),
    };
    let mut title = format!(
        "{what} {} in {} at {}",
        dur(s.duration_us),
        s.who.thread,
        s.ts
    );
    if let Some(p) = &s.target.path {
        title.push_str(&format!("\n{p}"));
    }
    if let Some(c) = &s.target.class {
        title.push_str(&format!(" [{c}]"));
    }
    match s.bound {
        Bound::Exact => {}
        Bound::AtLeast => title.push_str("\nat least (cut off by the trace)"),
        Bound::AtMost => title.push_str("\nat most (reconstructed)"),
    }
    if !s.cause.is_empty() {
        title.push_str(&format!("\n{}", s.cause));
    }
    writeln!(w, "<g class=\"stall\"><title>{}</title>", esc(&title))?;
    if x_end - x >= 2.0 && extent {
        writeln!(
            w,
            "<line class=\"extent\" x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{x_end:.1}\" y2=\"{y:.1}\" stroke=\"{color}\" stroke-opacity=\"0.55\" stroke-width=\"2\"/>"
        )?;
    }
    let data = format!(
        "data-i=\"{i}\" data-at-us=\"{}\" data-duration-us=\"{}\" data-class=\"{}\"",
        s.at_us,
        s.duration_us,
        esc(s.target.class.as_ref().map_or("", FileClass::as_str))
    );
    match s.kind {
        StallKind::SlowSyscall => writeln!(
            w,
            "<circle class=\"mark {kind_class}\" {data} cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"{radius}\" fill=\"{fill}\" fill-opacity=\"0.8\" stroke=\"{color}\" stroke-width=\"1.3\"/>"
        )?,
        StallKind::Gap => {
            let d = radius * 1.35;
            writeln!(
                w,
                "<path class=\"mark {kind_class}\" {data} d=\"M{x:.1} {:.1}L{:.1} {y:.1}L{x:.1} {:.1}L{:.1} {y:.1}Z\" fill=\"{fill}\" fill-opacity=\"0.7\" stroke=\"{color}\" stroke-width=\"1.3\"/>",
                y - d,
                x + d,
                y + d,
                x - d
            )?
        }
    }
    writeln!(w, "</g>")?;
    Ok(())
}

/// What the marks do not show: the stalls past `MAX_MARKS`, or that there is none.
fn write_mark_notes(r: &Report, w: &mut dyn Write, g: &Geometry) -> io::Result<()> {
    if r.stalls.len() > MAX_MARKS {
        writeln!(
            w,
            "<text class=\"marks-capped\" x=\"{:.1}\" y=\"40\" text-anchor=\"end\" fill=\"#a04000\">{}</text>",
            LEFT + g.plot_w,
            esc(&format!(
                "showing the {} longest of {} stalls",
                super::markup::count(MAX_MARKS as u64),
                super::markup::count(r.stalls.len() as u64)
            ))
        )?;
    }
    if r.stalls.is_empty() {
        writeln!(
            w,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"14\" fill=\"#666\">no stall over the threshold</text>",
            LEFT + g.plot_w / 2.0,
            TOP + PLOT_H / 2.0
        )?;
    }
    Ok(())
}

/// Timeline calls that are not stalls, drawn small and faint under the stall marks: they
/// show what the threshold hides (an fdatasync p50 rising during a rewrite). The longest
/// `MAX_CONTEXT` of them when there are more.
fn context_calls(r: &Report) -> Vec<&crate::report::TimelineCall> {
    let Some(tl) = &r.timeline else {
        return Vec::new();
    };
    let mut v: Vec<_> = tl
        .calls
        .iter()
        .filter(|c| c.duration_us < r.summary.threshold_us)
        .collect();
    if v.len() > MAX_CONTEXT {
        v.sort_by_key(|c| std::cmp::Reverse(c.duration_us));
        v.truncate(MAX_CONTEXT);
    }
    v
}

/// One `<path>` per class, each call a zero-length segment drawn as a round dot: a few
/// bytes per call, so tens of thousands stay cheap.
fn write_context(r: &Report, w: &mut dyn Write, g: &Geometry) -> io::Result<()> {
    let calls = context_calls(r);
    if calls.is_empty() {
        return Ok(());
    }
    // By name: the order the paths are drawn in.
    let mut by_class: std::collections::BTreeMap<&str, (FileClass, usize, String)> =
        Default::default();
    for c in &calls {
        let class = c.target.class.unwrap_or(FileClass::Unknown);
        let e = by_class
            .entry(class.as_str())
            .or_insert((class, 0, String::new()));
        e.1 += 1;
        e.2.push_str(&format!(
            "M{:.1} {:.1}h0",
            g.x(c.at_us as f64),
            g.y(c.duration_us.max(1) as f64)
        ));
    }
    writeln!(w, "<g class=\"context\" data-calls=\"{}\">", calls.len())?;
    for (name, (class, n, d)) in by_class {
        writeln!(
            w,
            "<path class=\"context-dots\" data-class=\"{}\" data-calls=\"{n}\" d=\"{d}\" stroke=\"{}\" stroke-opacity=\"0.35\" stroke-width=\"3\" stroke-linecap=\"round\" fill=\"none\"><title>{}</title></path>",
            esc(name),
            class_color(Some(class)),
            esc(&format!("{n} {name} calls under the threshold"))
        )?;
    }
    writeln!(w, "</g>")
}

fn write_x_axis(w: &mut dyn Write, g: &Geometry, baseline: f64) -> io::Result<()> {
    let (div, unit) = g.unit();
    let (ticks, step) = nice_ticks(g.t0 / div, g.t1 / div, X_TICKS);
    writeln!(w, "<g class=\"axis x-axis\" data-unit=\"{unit}\">")?;
    for t in ticks {
        let x = g.x(t * div);
        writeln!(w, "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{baseline:.1}\" stroke=\"#ececec\"/>")?;
        writeln!(
            w,
            "<line x1=\"{x:.1}\" y1=\"{baseline:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>",
            baseline + 5.0
        )?;
        writeln!(
            w,
            "<text class=\"tick-label\" x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#333\">{}</text>",
            baseline + 18.0,
            tick_label(t, step)
        )?;
    }
    writeln!(
        w,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#333\">time since first event ({unit})</text>",
        LEFT + g.plot_w / 2.0,
        baseline + 36.0
    )?;
    writeln!(w, "</g>")
}

fn write_host_strip(r: &Report, w: &mut dyn Write, g: &Geometry) -> io::Result<()> {
    let Some(host) = &r.live.host else {
        return Ok(());
    };
    let top = g.strip_top();
    let bottom = top + STRIP_H;
    let plot_r = LEFT + g.plot_w;
    let samples: Vec<_> = host
        .samples
        .iter()
        .filter(|s| s.minflt_per_s.is_finite() && s.iowait_pct.is_finite())
        .collect();
    let max_flt = samples
        .iter()
        .map(|s| s.minflt_per_s)
        .fold(0.0f64, f64::max)
        .max(1.0);
    let (mut flt_ticks, flt_step) = nice_ticks(0.0, max_flt, 4);
    let mut flt_top = flt_ticks.last().copied().unwrap_or(0.0);
    if flt_top < max_flt {
        flt_top += flt_step;
        flt_ticks.push(flt_top);
    }
    let max_io = samples.iter().map(|s| s.iowait_pct).fold(0.0f64, f64::max);
    let io_top = if max_io <= 10.0 {
        10.0
    } else if max_io <= 50.0 {
        50.0
    } else {
        100.0
    };
    let yf = |v: f64| bottom - (v / flt_top).clamp(0.0, 1.0) * STRIP_H;
    let yi = |v: f64| bottom - (v / io_top).clamp(0.0, 1.0) * STRIP_H;
    writeln!(w, "<g class=\"host\" data-samples=\"{}\">", samples.len())?;
    writeln!(
        w,
        "<rect x=\"{LEFT}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{STRIP_H}\" fill=\"none\" stroke=\"#888\"/>",
        g.plot_w
    )?;
    for t in &flt_ticks {
        let y = yf(*t);
        writeln!(w, "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{plot_r:.1}\" y2=\"{y:.1}\" stroke=\"#ececec\"/>")?;
        writeln!(
            w,
            "<text class=\"tick-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"{MINFLT_COLOR}\">{}</text>",
            LEFT - 8.0,
            y + 4.0,
            esc(&short_count(*t))
        )?;
    }
    for k in 0..=2 {
        let v = io_top * k as f64 / 2.0;
        writeln!(
            w,
            "<text class=\"tick-label\" x=\"{:.1}\" y=\"{:.1}\" fill=\"{IOWAIT_COLOR}\">{v:.0}%</text>",
            plot_r + 6.0,
            yi(v) + 4.0
        )?;
    }
    writeln!(
        w,
        "<text x=\"{LEFT}\" y=\"{:.1}\" font-size=\"11\" fill=\"#333\">{}</text>",
        top - 5.0,
        esc(&format!(
            "host, sampled every {} ms: minor faults/s (left), iowait % (right)",
            host.sample_interval_ms
        ))
    )?;
    let line = |pts: Vec<(f64, f64)>| -> String {
        pts.iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let flt: Vec<_> = samples
        .iter()
        .map(|s| (g.x(s.at_us as f64), yf(s.minflt_per_s)))
        .collect();
    let io: Vec<_> = samples
        .iter()
        .map(|s| (g.x(s.at_us as f64), yi(s.iowait_pct)))
        .collect();
    writeln!(
        w,
        "<polyline class=\"host-line minflt\" points=\"{}\" fill=\"none\" stroke=\"{MINFLT_COLOR}\" stroke-width=\"1.6\"/>",
        line(flt)
    )?;
    writeln!(
        w,
        "<polyline class=\"host-line iowait\" points=\"{}\" fill=\"none\" stroke=\"{IOWAIT_COLOR}\" stroke-width=\"1.6\" stroke-dasharray=\"5 3\"/>",
        line(io)
    )?;
    writeln!(w, "</g>")?;
    write_x_axis(w, g, bottom)
}

fn short_count(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{:.1}M", v / 1_000_000.0)
    } else if v >= 10_000.0 {
        format!("{:.0}k", v / 1_000.0)
    } else if v >= 1_000.0 {
        format!("{:.1}k", v / 1_000.0)
    } else {
        format!("{v:.0}")
    }
}

/// One legend row with its label's baseline at `y`: a glyph, then the (escaped) label.
fn legend_item(
    w: &mut dyn Write,
    x: f64,
    y: f64,
    data: &str,
    glyph: &str,
    label: &str,
) -> io::Result<()> {
    writeln!(
        w,
        "<g class=\"legend-item\"{data}>{glyph}<text x=\"{:.1}\" y=\"{y:.1}\" fill=\"#333\">{label}</text></g>",
        x + 18.0
    )
}

fn write_legend(r: &Report, w: &mut dyn Write, g: &Geometry) -> io::Result<()> {
    let x = LEFT + g.plot_w + 40.0;
    let y = TOP + 6.0;
    writeln!(w, "<g class=\"legend\">")?;
    let y = legend_stalls(r, w, x, y)?;
    legend_lines_and_phases(r, w, x, y)?;
    if g.has_host {
        let sy = g.strip_top() + 16.0;
        let glyph = legend_stroke(
            x,
            sy,
            &format!("stroke=\"{MINFLT_COLOR}\" stroke-width=\"1.6\""),
        );
        legend_item(w, x, sy, "", &glyph, "minor faults/s")?;
        let sy = sy + 18.0;
        let glyph = legend_stroke(
            x,
            sy,
            &format!("stroke=\"{IOWAIT_COLOR}\" stroke-width=\"1.6\" stroke-dasharray=\"5 3\""),
        );
        legend_item(w, x, sy, "", &glyph, "iowait %")?;
    }
    writeln!(w, "</g>")
}

/// A legend glyph left of its label: a dot centred 4 px above the label's baseline `y`.
fn legend_dot(x: f64, y: f64, r: f64, style: &str) -> String {
    format!(
        "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"{r}\" {style}/>",
        x + 6.0,
        y - 4.0
    )
}

/// A legend glyph left of its label: a stroke 4 px above the label's baseline `y`.
fn legend_stroke(x: f64, y: f64, style: &str) -> String {
    format!(
        "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" {style}/>",
        y - 4.0,
        x + 12.0,
        y - 4.0
    )
}

/// The marks' legend from `y` down: file classes with their counts, gaps, bounds, extents
/// and the calls under the threshold. Returns where the next item goes.
fn legend_stalls(r: &Report, w: &mut dyn Write, x: f64, mut y: f64) -> io::Result<f64> {
    let mut classes: Vec<(FileClass, usize)> = Vec::new();
    for s in r.stalls.iter().filter(|s| s.kind == StallKind::SlowSyscall) {
        let c = s.target.class.unwrap_or(FileClass::Unknown);
        match classes.iter_mut().find(|(k, _)| *k == c) {
            Some((_, n)) => *n += 1,
            None => classes.push((c, 1)),
        }
    }
    // The palette's order, which is the enum's.
    classes.sort_by_key(|c| c.0);
    let gaps = r.stalls.iter().filter(|s| s.kind == StallKind::Gap).count();
    if !classes.is_empty() || gaps > 0 {
        writeln!(
            w,
            "<text x=\"{x:.1}\" y=\"{y:.1}\" font-weight=\"bold\" fill=\"#333\">stalls</text>"
        )?;
        y += 18.0;
    }
    for (c, n) in classes.iter().take(16) {
        let color = class_color(Some(*c));
        let glyph = legend_dot(
            x,
            y,
            5.0,
            &format!("fill=\"{color}\" fill-opacity=\"0.8\" stroke=\"{color}\""),
        );
        let data = format!(" data-class=\"{}\"", esc(c.as_str()));
        legend_item(
            w,
            x,
            y,
            &data,
            &glyph,
            &format!("{} ({n})", esc(c.as_str())),
        )?;
        y += 18.0;
    }
    if gaps > 0 {
        let glyph = format!(
            "<path d=\"M{:.1} {:.1}l6 6l-6 6l-6 -6Z\" fill=\"{GAP_COLOR}\" fill-opacity=\"0.7\" stroke=\"{GAP_COLOR}\"/>",
            x + 6.0,
            y - 10.0
        );
        let label = format!("gap, no syscall ({gaps})");
        legend_item(w, x, y, " data-kind=\"gap\"", &glyph, &label)?;
        y += 18.0;
    }
    if r.stalls.iter().any(|s| s.bound != Bound::Exact) {
        let glyph = legend_dot(x, y, 5.0, "fill=\"#ffffff\" stroke=\"#555\"");
        legend_item(w, x, y, "", &glyph, "bound, not exact")?;
        y += 18.0;
    }
    if r.stalls.iter().any(|s| s.duration_us > 0) {
        let glyph = legend_stroke(
            x,
            y,
            "stroke=\"#555\" stroke-opacity=\"0.55\" stroke-width=\"2\"",
        );
        legend_item(w, x, y, "", &glyph, "extent in time")?;
        y += 18.0;
    }
    let ctx = context_calls(r).len();
    if ctx > 0 {
        let glyph = legend_dot(x, y, 1.5, "fill=\"#777\" fill-opacity=\"0.5\"");
        let label = format!("{} calls under threshold", super::markup::count(ctx as u64));
        legend_item(w, x, y, "", &glyph, &label)?;
        y += 18.0;
    }
    Ok(y)
}

/// The threshold's line and the phases' bands, from `y` down.
fn legend_lines_and_phases(r: &Report, w: &mut dyn Write, x: f64, mut y: f64) -> io::Result<()> {
    y += 6.0;
    let glyph = legend_stroke(
        x,
        y,
        &format!("stroke=\"{THRESHOLD_COLOR}\" stroke-width=\"1.2\" stroke-dasharray=\"6 4\""),
    );
    legend_item(w, x, y, "", &glyph, "threshold")?;
    y += 18.0;
    let mut kinds: Vec<PhaseKind> = Vec::new();
    for p in &r.phases {
        if !kinds.contains(&p.kind) {
            kinds.push(p.kind);
        }
    }
    for k in kinds {
        let (fill, label) = phase_style(k);
        let glyph = format!(
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{fill}\" fill-opacity=\"0.45\"/>",
            y - 10.0
        );
        let data = format!(" data-phase-kind=\"{}\"", esc(k.as_str()));
        legend_item(w, x, y, &data, &glyph, &esc(label))?;
        y += 18.0;
    }
    Ok(())
}
