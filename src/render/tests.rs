//! Tests of the picture and trace renderers over hand-built reports: the SVG and HTML are
//! parsed as XML and their marks, axes and bands compared with the report; the trace export
//! is parsed as JSON and checked for what Perfetto needs.

use super::{html, svg, trace_export};
use crate::report::*;
use roxmltree::{Document, Node, ParsingOptions};
use std::collections::{HashMap, HashSet};

const S: i64 = 1_000_000;

fn stall(at_us: i64, duration_us: i64, kind: StallKind, class: Option<&str>, tid: u32) -> Stall {
    Stall {
        ts: format!("22:38:{:02}.{:06}", 50 + at_us / S, at_us % S),
        ts_iso: None,
        at_us,
        who: crate::report::ThreadRef {
            pid: 9380,
            tid,
            thread: if tid == 9380 {
                Role::Main
            } else {
                Role::BioAof
            },
        },
        kind,
        syscall: (kind == StallKind::SlowSyscall).then(|| "fdatasync".into()),
        target: crate::report::FdRef {
            fd: (kind == StallKind::SlowSyscall).then_some(12),
            path: class.map(|c| format!("/data/appendonlydir/{c}.file")),
            class: class.map(FileClass::from),
        },
        duration_us,
        line: Some(100 + at_us as u64 / 1000),
        cause: "the AOF fsync waited for the disk".into(),
        finding: Some(FindingId::AofFsyncAlways),
        waiting: crate::report::Waiting {
            commands: 1,
            by_command: [("SET".to_string(), 1)].into_iter().collect(),
            clients: 1,
            worst_us: Some(duration_us),
        },
        ..Stall::sample(at_us, duration_us)
    }
}

fn base(span_us: i64) -> Report {
    let mut r = Report {
        schema: SCHEMA,
        ..Default::default()
    };
    r.source.kind = "strace".into();
    r.source.files = vec!["rewrite-always-nofsync-no.strace".into()];
    r.source.format = "strace -f -tt -T".into();
    r.source.pid = Some(9380);
    r.summary.span_us = span_us;
    r.summary.threshold_us = 10_000;
    r.summary.start = Some("22:38:50.000000".into());
    r.summary.durations = Durations::Measured;
    r.threads = vec![
        ThreadInfo {
            pid: 9380,
            tid: 9380,
            role: Role::Main,
            name: Some("redis-server".into()),
            why: "tid==pid".into(),
            syscalls: 10,
        },
        ThreadInfo {
            pid: 9380,
            tid: 9383,
            role: Role::BioAof,
            name: Some("bio_aof_fsync".into()),
            why: "name".into(),
            syscalls: 3,
        },
    ];
    r
}

fn two_stalls() -> Report {
    let mut r = base(4 * S);
    r.stalls = vec![
        stall(
            1_500_000,
            446_900,
            StallKind::SlowSyscall,
            Some("aof"),
            9380,
        ),
        stall(3_000_000, 12_000, StallKind::Gap, None, 9380),
    ];
    r.summary.stalls = 2;
    r
}

/// A thousand stalls spread over 10 s, mixed classes, gaps and bounds; optionally two
/// phases (one still running at the end) and host samples every 100 ms.
fn many(phases: bool, host: bool) -> Report {
    let mut r = base(10 * S);
    let classes = [
        Some("aof"),
        Some("log"),
        Some("rdb_temp"),
        None,
        Some("client"),
    ];
    let mut x: u64 = 12345;
    for i in 0..1000i64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Mostly just over the threshold, with a long tail, like real traces.
        let tail = if i % 20 == 0 { 2_000_000 } else { 60_000 };
        let d = 10_000 + (x >> 33) as i64 % tail;
        let kind = if i % 7 == 0 {
            StallKind::Gap
        } else {
            StallKind::SlowSyscall
        };
        let class = if kind == StallKind::Gap {
            None
        } else {
            classes[i as usize % classes.len()]
        };
        let mut s = stall(
            i * 9_990,
            d,
            kind,
            class,
            if i % 3 == 0 { 9383 } else { 9380 },
        );
        if i % 11 == 0 {
            s.bound = Bound::AtLeast;
        }
        r.stalls.push(s);
    }
    if phases {
        r.phases = vec![
            Phase {
                kind: PhaseKind::Bgsave,
                child_pid: 9569,
                start_at_us: 2 * S,
                end_at_us: Some(5 * S),
                fork_us: Some(5_000),
                ts: "22:38:52.000000".into(),
                ended_by: Some("SIGCHLD".into()),
                wrote: vec!["rdb_temp".into()],
                redis_evidence: None,
            },
            Phase {
                kind: PhaseKind::AofRewrite,
                child_pid: 9600,
                start_at_us: 7 * S,
                end_at_us: None,
                fork_us: None,
                ts: "22:38:57.000000".into(),
                ended_by: None,
                wrote: vec![],
                redis_evidence: None,
            },
        ];
        // Stalls exactly at the phase edges, to check the bands line up with the marks.
        r.stalls.push(stall(
            2 * S,
            20_000,
            StallKind::SlowSyscall,
            Some("aof"),
            9380,
        ));
        r.stalls.push(stall(
            5 * S,
            20_000,
            StallKind::SlowSyscall,
            Some("aof"),
            9380,
        ));
    }
    if host {
        r.live.host = Some(HostContext {
            sample_interval_ms: 100,
            samples: (0..100)
                .map(|i| HostSample {
                    at_us: i * 100_000,
                    minflt_per_s: if (20..50).contains(&i) { 9300.0 } else { 570.0 },
                    iowait_pct: (i % 10) as f64,
                    ..Default::default()
                })
                .collect(),
            notes: vec!["during the BGSAVE: minor faults 9,300/s vs 570/s before".into()],
            pressure: None,
        });
    }
    r.summary.stalls = r.stalls.len() as u64;
    r
}

fn render_svg(r: &Report) -> String {
    let mut out = Vec::new();
    svg::render(r, &mut out).unwrap_or_else(|e| panic!("svg: {e}"));
    String::from_utf8(out).unwrap_or_else(|e| panic!("svg is not UTF-8: {e}"))
}

fn render_html(r: &Report) -> String {
    let mut out = Vec::new();
    html::render(r, &mut out).unwrap_or_else(|e| panic!("html: {e}"));
    String::from_utf8(out).unwrap_or_else(|e| panic!("html is not UTF-8: {e}"))
}

fn render_trace(r: &Report) -> serde_json::Value {
    let mut out = Vec::new();
    trace_export::render(r, &mut out).unwrap_or_else(|e| panic!("trace: {e}"));
    serde_json::from_slice(&out).unwrap_or_else(|e| panic!("trace is not JSON: {e}"))
}

fn parse(text: &str) -> Document<'_> {
    let opts = ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    Document::parse_with_options(text, opts).unwrap_or_else(|e| panic!("not well-formed XML: {e}"))
}

fn has_class(n: &Node, c: &str) -> bool {
    n.attribute("class")
        .is_some_and(|v| v.split_whitespace().any(|x| x == c))
}

fn num(n: &Node, attr: &str) -> f64 {
    n.attribute(attr)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("<{}> has no numeric {attr}", n.tag_name().name()))
}

fn by_class<'a>(doc: &'a Document, c: &str) -> Vec<Node<'a, 'a>> {
    doc.descendants().filter(|n| has_class(n, c)).collect()
}

fn tick_labels(doc: &Document, axis: &str) -> Vec<String> {
    by_class(doc, axis)
        .iter()
        .flat_map(|a| a.descendants().filter(|n| has_class(n, "tick-label")))
        .filter_map(|n| n.text().map(String::from))
        .collect()
}

/// The checks every SVG must pass, whatever the report: one mark per stall with the
/// stall's own time and duration, inside the plot, with x growing with time and y with
/// duration; axes with labels; the threshold line between the right decades.
fn check_svg(r: &Report, doc: &Document) {
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    let marks = by_class(doc, "mark");
    if r.stalls.len() > svg::MAX_MARKS {
        check_capped(r, doc);
        return;
    }
    assert_eq!(marks.len(), r.stalls.len(), "one mark per stall");
    let slow = marks.iter().filter(|m| has_class(m, "slow")).count();
    let gaps = marks.iter().filter(|m| has_class(m, "gap")).count();
    assert_eq!(
        slow,
        r.stalls
            .iter()
            .filter(|s| s.kind == StallKind::SlowSyscall)
            .count()
    );
    assert_eq!(
        gaps,
        r.stalls.iter().filter(|s| s.kind == StallKind::Gap).count()
    );
    assert!(marks
        .iter()
        .filter(|m| has_class(m, "slow"))
        .all(|m| m.tag_name().name() == "circle"));
    assert!(marks
        .iter()
        .filter(|m| has_class(m, "gap"))
        .all(|m| m.tag_name().name() == "path"));

    let area = by_class(doc, "plot-area");
    assert_eq!(area.len(), 1);
    let (ax, ay, aw, ah) = (
        num(&area[0], "x"),
        num(&area[0], "y"),
        num(&area[0], "width"),
        num(&area[0], "height"),
    );
    // (at_us, duration, cx, cy) per mark, taken from the report through the mark's index.
    let mut pts = Vec::new();
    for m in &marks {
        let i = num(m, "data-i") as usize;
        let s = &r.stalls[i];
        assert_eq!(num(m, "data-at-us") as i64, s.at_us);
        assert_eq!(num(m, "data-duration-us") as i64, s.duration_us);
        let (cx, cy) = if m.tag_name().name() == "circle" {
            (num(m, "cx"), num(m, "cy"))
        } else {
            // The diamond's path starts at its top vertex: "M{x} {y-d}".
            let d = m.attribute("d").unwrap_or_default();
            let first: Vec<f64> = d[1..]
                .split('L')
                .next()
                .unwrap_or_default()
                .split(' ')
                .filter_map(|v| v.parse().ok())
                .collect();
            let rest: Vec<f64> = d
                .split('L')
                .nth(1)
                .unwrap_or_default()
                .split(' ')
                .filter_map(|v| v.parse().ok())
                .collect();
            (first[0], rest[1])
        };
        assert!(
            cx >= ax - 0.1 && cx <= ax + aw + 0.1,
            "mark {i} x {cx} outside plot"
        );
        assert!(
            cy >= ay - 0.1 && cy <= ay + ah + 0.1,
            "mark {i} y {cy} outside plot"
        );
        let title = m
            .parent()
            .and_then(|p| p.children().find(|c| c.tag_name().name() == "title"));
        assert!(
            title.is_some_and(|t| t.text().unwrap_or_default().contains(s.who.thread.as_str())),
            "mark {i} has a title"
        );
        pts.push((s.at_us, s.duration_us, cx, cy));
    }
    for a in &pts {
        for b in pts.iter().take(60) {
            if a.0 < b.0 {
                assert!(a.2 < b.2 + 0.11, "x grows with time");
            }
            if a.1 < b.1 {
                assert!(a.3 > b.3 - 0.11, "y grows with duration");
            }
        }
    }

    let x_labels = tick_labels(doc, "x-axis");
    assert!(x_labels.len() >= 3, "x axis ticks: {x_labels:?}");
    assert!(
        x_labels.iter().all(|l| l.parse::<f64>().is_ok()),
        "{x_labels:?}"
    );
    let y_labels = tick_labels(doc, "y-axis");
    assert!(y_labels.len() >= 4, "at least three decades: {y_labels:?}");
    assert!(y_labels.iter().any(|l| l == "10 ms"), "{y_labels:?}");
    let y_axis = &by_class(doc, "y-axis")[0];
    let max = r.stalls.iter().map(|s| s.duration_us).max().unwrap_or(0) as f64;
    assert!(
        num(y_axis, "data-hi-us") >= max,
        "y axis reaches the longest stall"
    );
    assert!(num(y_axis, "data-lo-us") <= r.summary.threshold_us as f64);

    let th = &by_class(doc, "threshold")[0];
    assert_eq!(num(th, "data-threshold-us") as i64, r.summary.threshold_us);
    let line = th
        .children()
        .find(|c| c.tag_name().name() == "line")
        .unwrap_or_else(|| panic!("threshold line"));
    let ty = num(&line, "y1");
    for &(_, d, _, cy) in &pts {
        if d > r.summary.threshold_us {
            assert!(
                cy <= ty + 0.11,
                "a stall over the threshold sits above the line"
            );
        }
    }
    assert!(!by_class(doc, "legend").is_empty());
    let no_script = doc
        .descendants()
        .all(|n| !matches!(n.tag_name().name(), "script" | "image" | "foreignObject"));
    assert!(no_script, "no scripts or external content");
}

#[test]
fn svg_two_stalls() {
    let r = two_stalls();
    let text = render_svg(&r);
    let doc = parse(&text);
    check_svg(&r, &doc);
    assert!(by_class(&doc, "phase-band").is_empty());
    assert!(by_class(&doc, "host").is_empty());
    // The legend names the class present and the gap shape, nothing else.
    let items: Vec<_> = by_class(&doc, "legend-item")
        .iter()
        .filter_map(|n| n.attribute("data-class").map(String::from))
        .collect();
    assert_eq!(items, ["aof"]);
    assert!(by_class(&doc, "legend-item")
        .iter()
        .any(|n| n.attribute("data-kind") == Some("gap")));
    // Readable scale: the 447 ms stall sits on an axis that reaches 1 s.
    assert!(tick_labels(&doc, "y-axis").iter().any(|l| l == "1 s"));
}

#[test]
fn svg_thousand_stalls_with_phases_and_host() {
    let r = many(true, true);
    let text = render_svg(&r);
    let doc = parse(&text);
    check_svg(&r, &doc);
    assert_eq!(by_class(&doc, "mark").len(), 1002);

    // One band per phase in the duration plot and one in the host strip, spanning exactly
    // the phase: the band's edges land where marks at the phase's start and end do.
    let bands = by_class(&doc, "phase-band");
    assert_eq!(bands.len(), 2 * r.phases.len());
    let mark_x = |at: i64| -> f64 {
        by_class(&doc, "mark")
            .iter()
            .find(|m| num(m, "data-at-us") as i64 == at)
            .map(|m| num(m, "cx"))
            .unwrap_or(f64::NAN)
    };
    let b0 = bands
        .iter()
        .find(|b| b.attribute("data-phase") == Some("0"))
        .unwrap_or_else(|| panic!("band 0"));
    assert_eq!(b0.attribute("data-kind"), Some("bgsave"));
    assert!((num(b0, "x") - mark_x(2 * S)).abs() < 0.11);
    assert!((num(b0, "x") + num(b0, "width") - mark_x(5 * S)).abs() < 0.11);
    // A phase still running at the end reaches the right edge of the plot.
    let area = &by_class(&doc, "plot-area")[0];
    let b1 = bands
        .iter()
        .find(|b| b.attribute("data-phase") == Some("1"))
        .unwrap_or_else(|| panic!("band 1"));
    assert!((num(b1, "x") + num(b1, "width") - (num(area, "x") + num(area, "width"))).abs() < 0.11);
    assert!(b1
        .descendants()
        .any(|n| n.text().is_some_and(|t| t.contains("still running"))));

    let host = &by_class(&doc, "host")[0];
    assert_eq!(num(host, "data-samples") as usize, 100);
    for c in ["minflt", "iowait"] {
        let line = by_class(&doc, c);
        assert_eq!(line.len(), 1, "{c} line");
        assert_eq!(
            line[0]
                .attribute("points")
                .unwrap_or_default()
                .split(' ')
                .count(),
            100
        );
    }
    // The strip is below the plot and the fault spike is higher (smaller y) than the baseline.
    let pts: Vec<(f64, f64)> = by_class(&doc, "minflt")[0]
        .attribute("points")
        .unwrap_or_default()
        .split(' ')
        .filter_map(|p| {
            p.split_once(',')
                .and_then(|(x, y)| Some((x.parse().ok()?, y.parse().ok()?)))
        })
        .collect();
    assert!(pts[30].1 < pts[10].1);
    assert!(pts
        .iter()
        .all(|p| p.1 > num(area, "y") + num(area, "height")));
    let legend: Vec<_> = by_class(&doc, "legend-item")
        .iter()
        .filter_map(|n| n.attribute("data-class").map(String::from))
        .collect();
    assert_eq!(legend, ["aof", "rdb_temp", "log", "client", "unknown"]);
}

#[test]
fn svg_thousand_stalls_without_phases_or_host() {
    let r = many(false, false);
    let doc_text = render_svg(&r);
    let doc = parse(&doc_text);
    check_svg(&r, &doc);
    assert!(by_class(&doc, "phase-band").is_empty());
    assert!(by_class(&doc, "host").is_empty());
    // Ten seconds of trace: ticks in seconds.
    assert_eq!(
        by_class(&doc, "x-axis")[0].attribute("data-unit"),
        Some("s")
    );
}

#[test]
fn svg_empty_report_still_has_axes() {
    let r = base(0);
    let text = render_svg(&r);
    let doc = parse(&text);
    check_svg(&r, &doc);
    assert!(text.contains("no stall over the threshold"));
}

#[test]
fn svg_and_html_escape_trace_text() {
    let mut r = two_stalls();
    let nasty = "/data/<script>alert(1)</script>&\"'\u{1}.aof";
    r.stalls[0].target.path = Some(nasty.into());
    r.stalls[0].cause = "a < b && c > d".into();
    r.source.files = vec!["x</title><script>.strace".into()];
    r.findings.push(Finding {
        id: FindingId::AofFsyncAlways,
        severity: Severity::Critical,
        title: "<b>bold</b>".into(),
        evidence: "e & e".into(),
        advice: "use \"everysec\"".into(),
        stalls: 1,
        redis_signals: None,
    });
    for text in [render_svg(&r), render_html(&r)] {
        let doc = parse(&text);
        assert!(doc
            .descendants()
            .all(|n| n.tag_name().name() != "script" && n.tag_name().name() != "b"));
        let expect = nasty.replace('\u{1}', "\u{FFFD}");
        assert!(
            doc.descendants()
                .any(|n| n.text().is_some_and(|t| t.contains(&expect))),
            "path round-trips as text"
        );
    }
}

fn table_rows<'a>(doc: &'a Document, id: &str) -> Vec<Node<'a, 'a>> {
    let t = doc
        .descendants()
        .find(|n| n.tag_name().name() == "table" && n.attribute("id") == Some(id))
        .unwrap_or_else(|| panic!("table #{id}"));
    t.descendants()
        .filter(|n| n.tag_name().name() == "tbody")
        .flat_map(|b| b.children().filter(|c| c.is_element()))
        .collect()
}

fn check_html_self_contained(text: &str, doc: &Document) {
    for n in doc.descendants().filter(|n| n.is_element()) {
        assert!(
            !matches!(
                n.tag_name().name(),
                "script" | "link" | "img" | "iframe" | "object"
            ),
            "<{}>",
            n.tag_name().name()
        );
        for a in n.attributes() {
            assert!(
                !matches!(a.name(), "src" | "href"),
                "{} on <{}>",
                a.name(),
                n.tag_name().name()
            );
        }
    }
    assert!(
        !text.contains("@import") && !text.contains("url("),
        "no fetched CSS resources"
    );
}

#[test]
fn html_two_stalls_has_plot_and_tables() {
    let mut r = two_stalls();
    r.findings.push(Finding {
        id: FindingId::AofFsyncAlways,
        severity: Severity::Critical,
        title: "AOF fsync in the main thread".into(),
        evidence: "1 fdatasync over 10 ms".into(),
        advice: "set `appendfsync everysec`, or a faster disk".into(),
        stalls: 1,
        redis_signals: None,
    });
    r.syscalls.push(SyscallStats {
        name: "fdatasync".into(),
        calls: 10,
        max_us: 446_900,
        ..Default::default()
    });
    r.fds.push(FdStats {
        pid: 9380,
        fd: 12,
        path: Some("/data/a.aof".into()),
        class: "aof".into(),
        ..Default::default()
    });
    r.commands.push(CommandStats {
        command: "SET".into(),
        phase: CommandPhase::All,
        calls: 5,
        ..Default::default()
    });
    let text = render_html(&r);
    let doc = parse(&text);
    check_html_self_contained(&text, &doc);
    assert_eq!(doc.root_element().tag_name().name(), "html");
    // The scatter plot, and the per-thread lanes (render::lanes) after it.
    let svgs: Vec<_> = doc
        .descendants()
        .filter(|n| n.tag_name().name() == "svg" && n.attribute("id") != Some("lanes"))
        .collect();
    assert_eq!(svgs.len(), 1);
    assert!(doc
        .descendants()
        .any(|n| n.attribute("id") == Some("lanes")));
    assert_eq!(
        svgs[0]
            .descendants()
            .filter(|n| has_class(n, "mark"))
            .count(),
        2
    );
    assert_eq!(table_rows(&doc, "stalls").len(), 2);
    assert_eq!(table_rows(&doc, "findings").len(), 1);
    assert_eq!(table_rows(&doc, "syscalls").len(), 1);
    assert_eq!(table_rows(&doc, "fds").len(), 1);
    assert_eq!(table_rows(&doc, "commands").len(), 1);
    // The first stall row shows the stall's time, syscall, class and duration.
    let first: Vec<String> = table_rows(&doc, "stalls")[0]
        .children()
        .filter(|c| c.is_element())
        .map(|c| {
            c.descendants()
                .filter(|d| d.is_text())
                .filter_map(|d| d.text())
                .collect::<String>()
        })
        .collect();
    assert_eq!(first[1], r.stalls[0].ts);
    assert_eq!(first[4], "fdatasync");
    assert_eq!(first[6], "aof");
    assert_eq!(first[8], "446.9 ms");
    assert_eq!(first[10], "1 client: SET; worst wait 446.9 ms");
    // Backquoted settings in advice become <code>, the rest stays text.
    let code: Vec<_> = doc
        .descendants()
        .filter(|n| n.tag_name().name() == "code")
        .filter_map(|n| n.text())
        .collect();
    assert_eq!(code, ["appendfsync everysec"]);
    assert!(
        doc.descendants()
            .all(|n| n.attribute("id") != Some("phases")),
        "no phase table without phases"
    );
}

#[test]
fn html_thousand_stalls_with_phases_and_host() {
    let r = many(true, true);
    let text = render_html(&r);
    let doc = parse(&text);
    check_html_self_contained(&text, &doc);
    assert_eq!(table_rows(&doc, "stalls").len(), r.stalls.len());
    assert_eq!(table_rows(&doc, "phases").len(), 2);
    assert_eq!(
        doc.descendants()
            .filter(|n| has_class(n, "phase-band"))
            .count(),
        4
    );
    assert!(text.contains("minor faults 9,300/s"));
    assert_eq!(table_rows(&doc, "threads").len(), 2);
}

#[test]
fn trace_export_has_what_perfetto_needs() {
    let mut r = many(true, true);
    // A timeline holding the first stall's call (the stall must not be duplicated) and
    // overlapping reconstructed calls (they must be nested).
    let s0 = r
        .stalls
        .iter()
        .find(|s| s.kind == StallKind::SlowSyscall)
        .cloned()
        .unwrap_or_else(|| panic!("a slow stall"));
    let call = |at_us: i64, duration_us: i64, name: &str| TimelineCall {
        at_us,
        pid: 9380,
        tid: 9380,
        syscall: name.into(),
        target: crate::report::FdRef {
            fd: Some(12),
            path: Some("/data/appendonlydir/appendonly.aof.2.incr.aof".into()),
            class: Some("aof".into()),
        },
        duration_us,
        bound: Bound::AtMost,
        line: Some(7),
    };
    r.timeline = Some(Timeline {
        floor_us: 1_000,
        max_per_thread: TIMELINE_MAX_PER_THREAD,
        dropped: 0,
        calls: vec![
            TimelineCall {
                tid: s0.who.tid,
                at_us: s0.at_us,
                duration_us: s0.duration_us,
                syscall: "fdatasync".into(),
                ..call(0, 0, "x")
            },
            call(10_000_000, 5_000, "write"),
            call(10_002_000, 9_000, "write"),
        ],
    });
    let v = render_trace(&r);
    let events = v["traceEvents"]
        .as_array()
        .unwrap_or_else(|| panic!("traceEvents array"));
    assert_eq!(v["displayTimeUnit"], "ms");
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("ph in {e}"));
        assert!(e["pid"].is_u64(), "pid in {e}");
        assert!(
            !e["name"].as_str().unwrap_or_default().is_empty(),
            "name in {e}"
        );
        match ph {
            "M" => assert!(
                e["args"]["name"].is_string() || e["args"]["sort_index"].is_i64(),
                "{e}"
            ),
            "X" => {
                assert!(e["ts"].is_i64() && e["tid"].is_u64(), "{e}");
                assert!(e["dur"].as_i64().is_some_and(|d| d >= 0), "dur in {e}");
                for k in ["fd", "path", "class"] {
                    assert!(e["args"].get(k).is_some(), "{k} in args of {e}");
                }
            }
            "i" => assert!(
                e["ts"].is_i64() && e["tid"].is_u64() && e["s"] == "t",
                "{e}"
            ),
            "b" | "e" => assert!(
                e["ts"].is_i64() && e["id"].is_string() && e["cat"].is_string(),
                "{e}"
            ),
            "C" => assert!(e["ts"].is_i64() && e["args"].is_object(), "{e}"),
            other => panic!("unexpected ph {other}"),
        }
    }
    fn pick<'a>(
        events: &'a [serde_json::Value],
        ph: &'a str,
    ) -> impl Iterator<Item = &'a serde_json::Value> + 'a {
        events.iter().filter(move |e| e["ph"] == ph)
    }
    let of = |ph: &'static str| pick(events, ph);
    // Every thread that has events is named after its role.
    let named: HashMap<u64, String> = of("M")
        .filter(|e| e["name"] == "thread_name")
        .map(|e| {
            (
                e["tid"].as_u64().unwrap_or(0),
                e["args"]["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    for e in of("X").chain(of("i")) {
        assert!(
            named.contains_key(&e["tid"].as_u64().unwrap_or(0)),
            "unnamed track for {e}"
        );
    }
    assert!(named[&9380].starts_with("main 9380"));
    assert!(named[&9383].starts_with("bio_aof 9383"));
    // Stalls: one instant each; slices for every stall plus the timeline minus the one shared.
    assert_eq!(of("i").count(), r.stalls.len());
    assert_eq!(of("X").count(), r.stalls.len() + 3 - 1);
    let stall_x = of("X").filter(|e| e["args"]["stall"].is_u64()).count();
    assert_eq!(stall_x, r.stalls.len() - 1);
    assert_eq!(
        of("X").filter(|e| e["cat"] == "gap").count(),
        r.stalls.iter().filter(|s| s.kind == StallKind::Gap).count()
    );
    // Phases: matched begin/end pairs at the phase times.
    let begins: Vec<_> = of("b").filter(|e| e["cat"] == "phase").collect();
    let ends: HashSet<(String, i64)> = of("e")
        .filter(|e| e["cat"] == "phase")
        .map(|e| {
            (
                e["id"].as_str().unwrap_or_default().to_string(),
                e["ts"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(begins.len(), 2);
    assert_eq!(begins[0]["ts"], 2 * S);
    assert!(ends.contains(&("phase-0".to_string(), 5 * S)));
    assert!(
        ends.contains(&("phase-1".to_string(), 10 * S)),
        "a running phase ends at the trace end: {ends:?}"
    );
    assert_eq!(of("C").count(), 200);
    // Slices on one track nest: each starts after the previous ends or ends inside it.
    let mut per_tid: HashMap<u64, Vec<(i64, i64)>> = HashMap::new();
    for e in of("X") {
        let ts = e["ts"].as_i64().unwrap_or(0);
        per_tid
            .entry(e["tid"].as_u64().unwrap_or(0))
            .or_default()
            .push((ts, ts + e["dur"].as_i64().unwrap_or(0)));
    }
    for (tid, mut v) in per_tid {
        v.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut open: Vec<i64> = Vec::new();
        for (s, e) in v {
            while open.last().is_some_and(|&end| end <= s) {
                open.pop();
            }
            if let Some(&end) = open.last() {
                assert!(
                    e <= end,
                    "tid {tid}: slice {s}..{e} overlaps one ending at {end}"
                );
            }
            open.push(e);
        }
    }
    let clipped = of("X")
        .filter(|e| e["args"]["clipped_to_nest"] == true)
        .count();
    assert!(
        clipped >= 1,
        "the overlapping reconstructed write was clipped"
    );
}

#[test]
fn trace_export_of_two_stalls_without_timeline() {
    let r = two_stalls();
    let v = render_trace(&r);
    let events = v["traceEvents"]
        .as_array()
        .unwrap_or_else(|| panic!("traceEvents"));
    let x: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(x.len(), 2);
    assert_eq!(x[0]["name"], "fdatasync");
    assert_eq!(x[0]["ts"], 1_500_000);
    assert_eq!(x[0]["dur"], 446_900);
    assert_eq!(x[0]["args"]["class"], "aof");
    assert_eq!(x[0]["args"]["fd"], 12);
    assert!(events.iter().any(|e| e["ph"] == "M"
        && e["name"] == "process_name"
        && e["args"]["name"] == "redis-server 9380"));
}

/// Past `MAX_MARKS`, the longest stalls are the ones drawn, and the picture says so.
fn check_capped(r: &Report, doc: &Document) {
    let marks = by_class(doc, "mark");
    assert_eq!(marks.len(), svg::MAX_MARKS);
    let drawn: HashSet<usize> = marks.iter().map(|m| num(m, "data-i") as usize).collect();
    assert_eq!(drawn.len(), svg::MAX_MARKS);
    let min_drawn = drawn
        .iter()
        .map(|&i| r.stalls[i].duration_us)
        .min()
        .unwrap_or(0);
    let max_left = (0..r.stalls.len())
        .filter(|i| !drawn.contains(i))
        .map(|i| r.stalls[i].duration_us)
        .max()
        .unwrap_or(0);
    assert!(min_drawn >= max_left, "the longest stalls are drawn");
    let note = by_class(doc, "marks-capped");
    assert!(note[0]
        .text()
        .unwrap_or_default()
        .contains("20,000 longest of"));
}

#[test]
fn svg_caps_marks_past_max_and_draws_timeline_context() {
    let mut r = base(60 * S);
    for i in 0..(svg::MAX_MARKS as i64 + 500) {
        r.stalls.push(stall(
            i * 2_500,
            10_001 + (i * 7919) % 300_000,
            StallKind::SlowSyscall,
            Some("aof"),
            9380,
        ));
    }
    let text = render_svg(&r);
    check_svg(&r, &parse(&text));

    // Context: timeline calls under the threshold are faint dots, one path per class;
    // calls at or over the threshold are stalls already and are not repeated.
    let mut r = two_stalls();
    let call = |at_us: i64, duration_us: i64, class: &str| TimelineCall {
        at_us,
        duration_us,
        target: crate::report::FdRef {
            class: Some(class.into()),
            ..Default::default()
        },
        syscall: "fdatasync".into(),
        ..Default::default()
    };
    r.timeline = Some(Timeline {
        floor_us: 100,
        max_per_thread: TIMELINE_MAX_PER_THREAD,
        dropped: 0,
        calls: vec![
            call(10, 150, "aof"),
            call(20, 300, "aof"),
            call(30, 900, "log"),
            call(1_500_000, 446_900, "aof"),
        ],
    });
    let text = render_svg(&r);
    let doc = parse(&text);
    check_svg(&r, &doc);
    let ctx = &by_class(&doc, "context")[0];
    assert_eq!(num(ctx, "data-calls") as usize, 3);
    let dots: Vec<(String, usize)> = by_class(&doc, "context-dots")
        .iter()
        .map(|n| {
            (
                n.attribute("data-class").unwrap_or_default().to_string(),
                num(n, "data-calls") as usize,
            )
        })
        .collect();
    assert_eq!(dots, [("aof".to_string(), 2), ("log".to_string(), 1)]);
    // The y axis reaches down to the fastest context call.
    assert!(num(&by_class(&doc, "y-axis")[0], "data-lo-us") <= 150.0);
}

/// Table cells name a thread by role (and tid when known) and a file by class and name,
/// without repeating the class when the label already says it.
#[test]
fn thread_and_file_labels() {
    use super::{file_label, thread_label};
    assert_eq!(thread_label("main", 0, false), "main");
    assert_eq!(thread_label("bio_aof", 7605, false), "bio_aof 7605");
    assert_eq!(thread_label("main", 7602, true), "main (7602)");
    let cases = [
        (
            Some("aof"),
            Some("/var/lib/redis/appendonly.aof"),
            "appendonly.aof",
        ),
        (
            Some("client"),
            Some("client connections"),
            "client connections",
        ),
        (
            Some("client"),
            Some("TCP:[127.0.0.1:6394] clients"),
            "client connections",
        ),
        (
            Some("listener"),
            Some("TCP:[127.0.0.1:6394]"),
            "listener TCP:[127.0.0.1:6394]",
        ),
        (Some("pipe"), Some("pipe:[1234]"), "pipe:[1234]"),
        (
            Some("other"),
            Some("anon_inode:[eventfd]"),
            "other anon_inode:[eventfd]",
        ),
        (
            Some("aof"),
            Some("appendonlydir/appendonly.aof.2.incr.aof"),
            "appendonly.aof.2.incr.aof",
        ),
        (Some("log"), Some("redis.log"), "redis.log"),
        (
            Some("log"),
            Some("/var/log/redis/server.txt"),
            "log server.txt",
        ),
        (Some("aof"), None, "aof"),
        (None, None, ""),
    ];
    for (class, path, label) in cases {
        assert_eq!(
            file_label(class.map(FileClass::from), path),
            label,
            "{class:?} {path:?}"
        );
    }
}

/// The tracing-cost line names the cost the backend has: ptrace stops redis at every
/// syscall, perf never does (so no "µs per tracer stop" for it).
#[test]
fn tracing_cost_line_follows_the_backend() {
    let line = |backend: &str| {
        let mut r = base(1_000_000);
        r.source.kind = "live".into();
        r.source.backend = Some(backend.into());
        r.live.overhead = Some(Overhead {
            syscalls_per_s: 3000.0,
            stops_redis: backend == "ptrace",
            mean_stop_us: 9.7,
            warning: None,
        });
        let mut out = vec![];
        super::table::render(&r, &mut out, false).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .find(|l| l.starts_with("Tracing cost"))
            .unwrap()
            .to_string()
    };
    assert_eq!(
        line("ptrace"),
        "Tracing cost: 3000 syscalls/s traced, 9.7 µs per tracer stop"
    );
    assert_eq!(
        line("perf"),
        "Tracing cost: 3000 syscalls/s traced; redis is never stopped"
    );
}

/// The JSON is written by one writer whether or not redis's evidence was joined (it went
/// through a `serde_json::Value`, whose map sorted every key): the report's keys keep their
/// order, and the evidence only adds its own (`redis_evidence` last in a stall, `redis` last
/// at the top).
#[test]
fn json_keys_keep_their_order_with_redis_evidence() {
    let json = |r: &Report| {
        let mut out = Vec::new();
        super::json::render(r, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    };
    // The keys of the top level (indent 2) and of the stalls (indent 6), in order.
    let keys = |text: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| {
                let indent = l.len() - l.trim_start().len();
                let key = l.trim_start().strip_prefix('"')?.split_once("\": ")?.0;
                [2, 6].contains(&indent).then(|| key.to_string())
            })
            .collect()
    };
    let plain = two_stalls();
    let mut joined = plain.clone();
    joined.redis = Some(RedisSection::default());
    joined.stalls[0].redis_evidence = Some(vec![RedisEvidence {
        source: EvidenceSource::Log,
        ts: "2026-11-30T22:55:12.655+00:00".into(),
        at_us: 1,
        what: "written just before the stall: [master 1] Accepted".into(),
        position: Some(LinePosition::JustBefore),
        meaning: None,
        who: Some("master 1".into()),
        text: "Accepted".into(),
    }]);
    joined.stalls[1].redis_evidence = Some(vec![]);
    let (p, j) = (keys(&json(&plain)), keys(&json(&joined)));
    assert_eq!(&p[..2], ["schema", "source"], "{p:?}");
    // Each stall's evidence comes after its last key (`events_lost`: no sched, no quiet calls).
    let after: Vec<&str> = j
        .windows(2)
        .filter(|w| w[1] == "redis_evidence")
        .map(|w| w[0].as_str())
        .collect();
    assert_eq!(after, ["events_lost", "events_lost"], "{j:?}");
    assert_eq!(j.last().map(String::as_str), Some("redis"), "{j:?}");
    let without = |v: &[String]| -> Vec<String> {
        v.iter()
            .filter(|k| *k != "redis_evidence" && *k != "redis")
            .cloned()
            .collect()
    };
    assert_eq!(without(&j), without(&p));
}
