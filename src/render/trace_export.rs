//! `--export-trace FILE`: the report as Chrome trace-event JSON, the format Perfetto
//! (ui.perfetto.dev) and chrome://tracing open, at the end of the pipeline next to the other
//! renderers. Engineers already know how to zoom, select and measure in those tools, so the
//! report hands its timeline over instead of re-inventing them.
//!
//! What goes in: one track per thread named by its role (`thread_name` metadata), the calls
//! of `report.timeline` as complete slices (`ph: X`) with fd, path and class in their args,
//! stalls as slices too when the timeline does not already hold the call (gaps always), each
//! stall also as an instant event (`ph: i`) carrying the cause, background phases and
//! incidents as async slices (`ph: b`/`e`) on the main thread's process, and live host samples
//! as counter tracks (`ph: C`). Timestamps are µs since the first event, as in the report.

use super::markup::{dur, phase_style};
use crate::report::{Bound, Report, Role, StallKind};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

/// One complete slice before nesting is enforced.
struct Slice {
    ts: i64,
    dur: i64,
    name: String,
    cat: &'static str,
    args: Map<String, Value>,
}

fn file_args(
    fd: Option<i32>,
    path: &Option<String>,
    class: &Option<crate::report::FileClass>,
    bound: Bound,
    line: Option<u64>,
) -> Map<String, Value> {
    let mut a = Map::new();
    a.insert("fd".into(), json!(fd));
    a.insert("path".into(), json!(path));
    a.insert("class".into(), json!(class));
    a.insert("bound".into(), json!(bound));
    if let Some(l) = line {
        a.insert("line".into(), json!(l));
    }
    a
}

/// Rank of a thread role in the track list: the main thread first, background threads next.
fn role_rank(role: Role) -> i64 {
    match role {
        Role::Main => 0,
        Role::BioAof
        | Role::BioCloseFile
        | Role::BioLazyFree
        | Role::BioRdbSave
        | Role::BioTlsReload
        | Role::JemallocBg => 1,
        Role::IoThread => 2,
        Role::Child => 5,
        Role::Other => 9,
    }
}

pub fn render(r: &Report, w: &mut dyn Write) -> io::Result<()> {
    let (tracks, main) = tracks(r);
    let mut events: Vec<Value> = Vec::new();
    track_names(r, &tracks, main, &mut events);
    call_events(r, &mut events);
    async_events(r, main, &mut events);
    counter_events(r, main, &mut events);
    write_events(r, &events, w)
}

/// A thread's track: its role and name.
type Tracks = BTreeMap<(u32, u32), (Role, Option<String>)>;

/// Every (pid, tid) that any event lands on, and the main thread's: the track the phases,
/// incidents and counters go on.
fn tracks(r: &Report) -> (Tracks, (u32, u32)) {
    // Tracks: every (pid, tid) that any event lands on gets a name, from the thread table
    // when the analyzer classified it, else from the stall's own role.
    let mut tracks: Tracks = BTreeMap::new();
    for t in &r.threads {
        tracks.insert((t.pid, t.tid), (t.role, t.name.clone()));
    }
    for s in &r.stalls {
        tracks
            .entry((s.who.pid, s.who.tid))
            .or_insert((s.who.thread, None));
    }
    if let Some(tl) = &r.timeline {
        for c in &tl.calls {
            tracks.entry((c.pid, c.tid)).or_insert((Role::Other, None));
        }
    }
    let main = tracks
        .iter()
        .find(|(_, (role, _))| *role == Role::Main)
        .map(|(k, _)| *k)
        .or_else(|| r.source.pid.map(|p| (p, p)))
        .or_else(|| tracks.keys().next().copied())
        .unwrap_or((0, 0));
    (tracks, main)
}

/// The names and sort order of the processes and threads (metadata events).
fn track_names(r: &Report, tracks: &Tracks, main: (u32, u32), events: &mut Vec<Value>) {
    let child_pids: HashMap<u32, &str> = r
        .phases
        .iter()
        .map(|p| (p.child_pid, phase_style(p.kind).1))
        .collect();
    let mut pids: Vec<u32> = tracks.keys().map(|k| k.0).collect();
    pids.push(main.0);
    pids.sort_unstable();
    pids.dedup();
    for pid in &pids {
        let name = if *pid == main.0 {
            format!("redis-server {pid}")
        } else if let Some(kind) = child_pids.get(pid) {
            format!("{kind} child {pid}")
        } else {
            format!("process {pid}")
        };
        events.push(json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}));
        let sort = if *pid == main.0 { 0 } else { 1 };
        events.push(json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort}}));
    }
    for ((pid, tid), (role, name)) in tracks {
        let label = match name {
            Some(n) if n != role.as_str() => format!("{role} {tid} ({n})"),
            _ => format!("{role} {tid}"),
        };
        events.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}}));
        events.push(json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": role_rank(*role)}}));
    }
}

/// The timeline's calls and the stalls as slices per thread (nested as the viewers need),
/// and each stall as an instant carrying its cause.
fn call_events(r: &Report, events: &mut Vec<Value>) {
    // Slices per thread.
    let mut slices: BTreeMap<(u32, u32), Vec<Slice>> = BTreeMap::new();
    let mut in_timeline: std::collections::HashSet<(u32, i64, &str)> = Default::default();
    if let Some(tl) = &r.timeline {
        for c in &tl.calls {
            in_timeline.insert((c.tid, c.at_us, c.syscall.as_str()));
            slices.entry((c.pid, c.tid)).or_default().push(Slice {
                ts: c.at_us,
                dur: c.duration_us.max(0),
                name: c.syscall.clone(),
                cat: "syscall",
                args: file_args(
                    c.target.fd,
                    &c.target.path,
                    &c.target.class,
                    c.bound,
                    c.line,
                ),
            });
        }
    }
    for (i, s) in r.stalls.iter().enumerate() {
        let name = match s.kind {
            StallKind::SlowSyscall => s.syscall.clone().unwrap_or_else(|| "syscall".into()),
            StallKind::Gap => "gap (no syscall)".into(),
        };
        let mut args = file_args(
            s.target.fd,
            &s.target.path,
            &s.target.class,
            s.bound,
            s.line,
        );
        args.insert("stall".into(), json!(i));
        args.insert("cause".into(), json!(s.cause));
        args.insert("finding".into(), json!(s.finding));
        args.insert("duration_us".into(), json!(s.duration_us));
        args.insert("waiting_clients".into(), json!(s.waiting.clients));
        args.insert("waiting_commands".into(), json!(s.waiting.commands));
        args.insert("ts".into(), json!(s.ts));
        let already = s.kind == StallKind::SlowSyscall
            && in_timeline.contains(&(s.who.tid, s.at_us, name.as_str()));
        if !already {
            slices
                .entry((s.who.pid, s.who.tid))
                .or_default()
                .push(Slice {
                    ts: s.at_us,
                    dur: s.duration_us.max(0),
                    name: name.clone(),
                    cat: if s.kind == StallKind::Gap {
                        "gap"
                    } else {
                        "stall"
                    },
                    args: args.clone(),
                });
        }
        events.push(json!({
            "ph": "i", "s": "t", "cat": "stall",
            "name": format!("stall: {name} {}", dur(s.duration_us)),
            "ts": s.at_us, "pid": s.who.pid, "tid": s.who.tid, "args": Value::Object(args),
        }));
    }
    for ((pid, tid), list) in slices.iter_mut() {
        for s in nest(list) {
            let mut args = s.args;
            if s.clipped {
                args.insert("clipped_to_nest".into(), json!(true));
            }
            events.push(json!({
                "ph": "X", "cat": s.slice.cat, "name": s.slice.name, "ts": s.slice.ts, "dur": s.dur,
                "pid": pid, "tid": tid, "args": Value::Object(args),
            }));
        }
    }
}

/// Background phases and incidents as async slices on the redis process.
fn async_events(r: &Report, main: (u32, u32), events: &mut Vec<Value>) {
    for (i, p) in r.phases.iter().enumerate() {
        let (_, label) = phase_style(p.kind);
        let end = p.end_at_us.unwrap_or(p.start_at_us.max(r.summary.span_us));
        let name = format!("{label} (child {})", p.child_pid);
        let id = format!("phase-{i}");
        let args = json!({"kind": p.kind, "child_pid": p.child_pid, "fork_us": p.fork_us, "ended_by": p.ended_by,
                          "wrote": p.wrote, "still_running_at_end": p.end_at_us.is_none()});
        events.push(json!({"ph": "b", "cat": "phase", "name": name, "id": id, "ts": p.start_at_us, "pid": main.0, "tid": main.1, "args": args}));
        events.push(json!({"ph": "e", "cat": "phase", "name": name, "id": id, "ts": end, "pid": main.0, "tid": main.1}));
    }
    for (i, inc) in r.incidents.iter().enumerate() {
        let name = format!(
            "incident {} ({} stalls)",
            dur(inc.duration_us),
            inc.stalls.len()
        );
        let id = format!("incident-{i}");
        let args = json!({"stalls": inc.stalls, "waiting_clients": inc.waiting_clients,
                          "waiting_commands": inc.waiting_commands, "worst_wait_us": inc.worst_wait_us, "finding": inc.finding});
        events.push(json!({"ph": "b", "cat": "incident", "name": name, "id": id, "ts": inc.start_at_us, "pid": main.0, "tid": main.1, "args": args}));
        events.push(json!({"ph": "e", "cat": "incident", "name": name, "id": id, "ts": inc.end_at_us, "pid": main.0, "tid": main.1}));
    }
}

/// Live host samples as counter tracks.
fn counter_events(r: &Report, main: (u32, u32), events: &mut Vec<Value>) {
    if let Some(h) = &r.live.host {
        for s in &h.samples {
            if s.minflt_per_s.is_finite() {
                events.push(json!({"ph": "C", "name": "minor faults/s", "ts": s.at_us, "pid": main.0, "args": {"minflt": s.minflt_per_s, "majflt": s.majflt_per_s}}));
            }
            if s.iowait_pct.is_finite() {
                events.push(json!({"ph": "C", "name": "iowait %", "ts": s.at_us, "pid": main.0, "args": {"iowait": s.iowait_pct}}));
            }
        }
    }
}

/// The document: what it was made from (`otherData`), then the events.
fn write_events(r: &Report, events: &[Value], w: &mut dyn Write) -> io::Result<()> {
    let other = json!({
        "generator": format!("stallscope {}", env!("CARGO_PKG_VERSION")),
        "schema": r.schema,
        "source_kind": r.source.kind,
        "source_files": r.source.files,
        "format": r.source.format,
        "start": r.summary.start,
        "start_iso": r.summary.start_iso,
        "threshold_us": r.summary.threshold_us,
        "timeline_floor_us": r.timeline.as_ref().map(|t| t.floor_us),
        "timeline_dropped": r.timeline.as_ref().map(|t| t.dropped),
        "ts_unit": "µs since the first event of the trace",
    });
    // Written event by event so a 20 000-call timeline never becomes one big string.
    write!(w, "{{\"displayTimeUnit\":\"ms\",\"otherData\":")?;
    serde_json::to_writer(&mut *w, &other).map_err(io::Error::other)?;
    write!(w, ",\"traceEvents\":[")?;
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            w.write_all(b",\n")?;
        } else {
            w.write_all(b"\n")?;
        }
        serde_json::to_writer(&mut *w, e).map_err(io::Error::other)?;
    }
    writeln!(w, "\n]}}")
}

struct Nested<'a> {
    slice: &'a Slice,
    dur: i64,
    clipped: bool,
    args: Map<String, Value>,
}

/// Orders a thread's slices and clips any that would overlap the one before without being
/// inside it: trace viewers need slices on one track to nest. Syscalls of one thread never
/// overlap, but reconstructed (upper-bound) durations and gaps can.
fn nest(list: &mut [Slice]) -> Vec<Nested<'_>> {
    list.sort_by(|a, b| a.ts.cmp(&b.ts).then(b.dur.cmp(&a.dur)));
    let mut out = Vec::with_capacity(list.len());
    let mut open: Vec<i64> = Vec::new();
    for s in list.iter() {
        while open.last().is_some_and(|&end| end <= s.ts) {
            open.pop();
        }
        let mut d = s.dur;
        let mut clipped = false;
        if let Some(&end) = open.last() {
            if s.ts + d > end {
                d = end - s.ts;
                clipped = true;
            }
        }
        open.push(s.ts + d);
        out.push(Nested {
            slice: s,
            dur: d,
            clipped,
            args: s.args.clone(),
        });
    }
    out
}
