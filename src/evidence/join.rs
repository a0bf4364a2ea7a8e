//! The join: redis's records placed on the trace's axis and given to the stalls and
//! background-save phases whose windows they fall in. One job: decide which line or record
//! belongs to which stall or phase, and where it sits (just before, being written, just
//! after); what it means comes from `signals::classify`.

use super::axis::Axis;
use super::signals::classify;
use super::KEEP_MARGIN_US;
use crate::redis_client::Collected;
use crate::redis_log::{LogLevel, LogLine, LogRole};
use crate::report::{
    EvidenceSource, FileClass, LinePosition, LogMeaning, PhaseKind, RedisEvidence, RedisInfoSample,
    RedisLatency, RedisLogLine, RedisServerInfo, RedisSlow, Report, Stall, LOG_LINES_MAX,
};
use crate::units::{human, short};

/// Log lines listed in `redis.lines`: the trace's window and this much either side.
pub(super) const LIST_MARGIN_US: i64 = 1_000_000;
/// A line may be stamped this long before the syscall it caused: redis reads the clock,
/// formats the line, opens the log file, writes, closes (and under strace every step is
/// slower), or logs "taking too long" just before the AOF write that then blocks.
pub(super) const LINE_BEFORE_US: i64 = 20_000;
/// How long after a stall the stalled process's next line may be stamped and still tell
/// what the blocked call was doing.
pub(super) const LINE_AFTER_US: i64 = 20_000;
/// Most evidence items per stall: a long stall of a verbose redis overlaps many lines.
pub(super) const MAX_PER_STALL: usize = 12;

/// What a log file holds over the trace, on its axis.
pub(super) struct Placed {
    /// (at_us, line), sorted by time.
    lines: Vec<(i64, LogLine)>,
    /// The first and last line of the log, on the axis.
    pub(super) first_last: (Option<i64>, Option<i64>),
}

pub(super) fn rank_level(l: Option<LogLevel>) -> u8 {
    match l {
        Some(LogLevel::Warning) => 0,
        Some(LogLevel::Notice) | None => 1,
        Some(LogLevel::Verbose) => 2,
        Some(LogLevel::Debug) => 3,
    }
}

/// A log line as evidence. Its `what` is `[role pid] message`, after where it sits relative
/// to the stall and what it means ("written just before the stall; AOF fsync too long: ...").
pub(super) fn log_evidence(
    at_us: i64,
    axis: &Axis,
    l: &LogLine,
    position: Option<LinePosition>,
) -> RedisEvidence {
    let who = match (l.role.as_str(), l.pid) {
        ("child", Some(p)) => format!("child {p}"),
        (r, Some(p)) => format!("{r} {p}"),
        (r, None) => r.to_string(),
    };
    let meaning = classify(&l.message);
    let text = short(&l.message, 200);
    let tags: Vec<&str> = [
        position.map(LinePosition::words),
        meaning.map(LogMeaning::words),
    ]
    .into_iter()
    .flatten()
    .collect();
    let head = if tags.is_empty() {
        String::new()
    } else {
        format!("{}: ", tags.join("; "))
    };
    RedisEvidence {
        source: EvidenceSource::Log,
        ts: axis.iso(axis.base_us + at_us),
        at_us,
        what: format!("{head}[{who}] {text}"),
        position,
        meaning,
        who: Some(who),
        text,
    }
}

/// One of the server's records as evidence: `what` is its source's name, `text`, and
/// `after` (the window it falls in, in words).
pub(super) fn server_evidence(
    source: EvidenceSource,
    epoch_us: i64,
    axis: &Axis,
    text: String,
    after: &str,
) -> RedisEvidence {
    let name = match source {
        EvidenceSource::Latency => "LATENCY",
        EvidenceSource::Slowlog => "SLOWLOG",
        EvidenceSource::Info => "INFO",
        EvidenceSource::Log => "log",
    };
    RedisEvidence {
        source,
        ts: axis.iso(epoch_us),
        at_us: axis.at(epoch_us),
        what: format!("{name} {text}{after}"),
        position: None,
        meaning: None,
        who: None,
        text,
    }
}

/// Whether a log line was written by the stalled thread's process. A trace without a pid
/// column (one process, no -f) gives its stalls pid 0: its main thread is redis's master.
pub(super) fn same_process(l: &LogLine, s: &Stall) -> bool {
    l.pid == Some(s.who.pid)
        || (s.who.pid == 0
            && s.who.thread == crate::report::Role::Main
            && l.role == LogRole::Master)
}

/// What redis said in a stall's window: its log lines and, with `--redis`, the server's
/// records; the most telling first when there are more than `MAX_PER_STALL`, then in time
/// order.
pub(super) fn stall_evidence(
    s: &Stall,
    placed: &Placed,
    server: Option<&Collected>,
    axis: &Axis,
) -> Vec<RedisEvidence> {
    let mut items = stall_log_lines(s, placed, axis);
    if let Some(c) = server {
        let (a_ep, b_ep) = (axis.base_us + s.at_us, axis.base_us + stall_end(s));
        items.extend(
            stall_server_records(c, a_ep, b_ep, axis)
                .into_iter()
                .map(|e| (0, e)),
        );
    }
    items.sort_by_key(|(rank, e)| (*rank, e.at_us));
    items.truncate(MAX_PER_STALL);
    items.sort_by_key(|(_, e)| e.at_us);
    items.into_iter().map(|(_, e)| e).collect()
}

pub(super) fn stall_end(s: &Stall) -> i64 {
    s.at_us + s.duration_us.max(0)
}

/// The log lines in a stall's window, each with its rank (0: it names the stall or sits
/// right at it; then by level).
pub(super) fn stall_log_lines(s: &Stall, placed: &Placed, axis: &Axis) -> Vec<(u8, RedisEvidence)> {
    let (a, b) = (s.at_us, stall_end(s));
    let in_log: Vec<&(i64, LogLine)> = placed
        .lines
        .iter()
        .filter(|(at, l)| {
            let res = l.resolution_ms * 1000;
            // The stalled process's own lines just after it too: the first thing redis
            // does once a blocking call returns is often to log its outcome ("Background
            // saving started by pid N" after fork(), "DB saved on disk" after the fsync).
            let end = if same_process(l, s) {
                b + LINE_AFTER_US
            } else {
                b
            };
            *at <= end && *at + res >= a - LINE_BEFORE_US
        })
        .collect();
    // The line the stalled thread's process wrote last before the stall began: for a stall
    // on the log file, the line whose write or close blocked.
    let before = in_log
        .iter()
        .filter(|(at, l)| same_process(l, s) && *at <= a)
        .max_by_key(|(at, l)| (*at, l.line))
        .map(|(_, l)| l.line);
    in_log
        .iter()
        .map(|(at, l)| {
            let position = if Some(l.line) == before {
                Some(if s.target.class == Some(FileClass::Log) {
                    LinePosition::BeingWritten
                } else {
                    LinePosition::JustBefore
                })
            } else if *at > b && same_process(l, s) {
                Some(LinePosition::JustAfter)
            } else {
                None
            };
            let e = log_evidence(*at, axis, l, position);
            let rank = if e.meaning.is_some() || position.is_some() {
                0
            } else {
                rank_level(l.level) + 1
            };
            (rank, e)
        })
        .collect()
}

/// The server's records that overlap a stall from `a_ep` to `b_ep` (epoch µs): LATENCY and
/// SLOWLOG are stamped to the second when the event ended, INFO changes are known between
/// two polls.
pub(super) fn stall_server_records(
    c: &Collected,
    a_ep: i64,
    b_ep: i64,
    axis: &Axis,
) -> Vec<RedisEvidence> {
    let mut out = vec![];
    for l in &c.latency {
        // Stamped to the second when the event ended; it began `latency` earlier.
        let end_hi = (l.ts + 1) * 1_000_000;
        let start_lo = l.ts * 1_000_000 - l.latency_ms * 1000;
        if start_lo <= b_ep && end_hi >= a_ep {
            out.push(server_evidence(
                EvidenceSource::Latency,
                l.ts * 1_000_000,
                axis,
                format!("{} {} ms", l.event, l.latency_ms),
                " in the same second (redis stamps events to the second)",
            ));
        }
    }
    for e in &c.slowlog {
        let end_hi = (e.ts + 1) * 1_000_000;
        let start_lo = e.ts * 1_000_000 - e.duration_us;
        if start_lo <= b_ep && end_hi >= a_ep {
            out.push(server_evidence(
                EvidenceSource::Slowlog,
                e.ts * 1_000_000,
                axis,
                format!("#{} {} took {}", e.id, e.command, human(e.duration_us)),
                " in the same second",
            ));
        }
    }
    for (field, from, to, lo_ms, hi_ms) in info_changes(c) {
        if lo_ms * 1000 <= b_ep && hi_ms * 1000 >= a_ep {
            let polls = format!(
                " between polls at {} and {}",
                axis.iso(lo_ms * 1000),
                axis.iso(hi_ms * 1000)
            );
            out.push(server_evidence(
                EvidenceSource::Info,
                hi_ms * 1000,
                axis,
                format!("{field} {from} -> {to}"),
                &polls,
            ));
        }
    }
    out
}

/// Changes of the INFO fields that name causes, between consecutive polls:
/// (field, from, to, previous poll sent (epoch ms), this poll answered (epoch ms)).
pub(super) fn info_changes(c: &Collected) -> Vec<(String, i64, i64, i64, i64)> {
    const WATCHED: &[&str] = &[
        "aof_delayed_fsync",
        "latest_fork_usec",
        "rdb_bgsave_in_progress",
        "aof_rewrite_in_progress",
    ];
    let mut out = vec![];
    for w in c.info.windows(2) {
        for f in WATCHED {
            let get = |s: &crate::redis_client::InfoSample| {
                s.fields.iter().find(|(k, _)| k == f).map(|(_, v)| *v)
            };
            if let (Some(x), Some(y)) = (get(&w[0]), get(&w[1])) {
                if x != y {
                    out.push((f.to_string(), x, y, w[0].sent_ms, w[1].at_ms));
                }
            }
        }
    }
    out
}

/// `child_in_log`: the phase's child as redis's log numbers it (its pid in redis's own pid
/// namespace: "Background saving started by pid N" is redis's text, not mapped).
pub(super) fn phase_evidence(
    p: &crate::report::Phase,
    parent: Option<u32>,
    child_in_log: u32,
    span_us: i64,
    placed: &Placed,
    server: Option<&Collected>,
    axis: &Axis,
) -> Vec<RedisEvidence> {
    let by_pid = format!("by pid {child_in_log}");
    let start = p.start_at_us;
    let mut out: Vec<RedisEvidence> = vec![];
    let mut ended = false;
    for (at, l) in &placed.lines {
        let own = l.pid == Some(p.child_pid) || l.message.contains(&by_pid);
        // The parent's "terminated" line names no pid: the first one after the fork whose
        // kind matches this phase.
        let end_line = !ended
            && *at >= start
            && l.pid != Some(p.child_pid)
            && parent.is_none_or(|pp| l.pid == Some(pp))
            && classify(&l.message).is_some_and(|m| ends_phase(p.kind, m));
        if end_line {
            ended = true;
        }
        if own || end_line {
            out.push(log_evidence(*at, axis, l, None));
        }
    }
    if let Some(c) = server {
        for (field, from, to, lo, hi) in info_changes(c) {
            let at = axis.at(hi * 1000);
            let end = p.end_at_us.unwrap_or(span_us);
            let lo_at = axis.at(lo * 1000);
            if at >= start && lo_at <= end + 2_000_000 {
                out.push(server_evidence(
                    EvidenceSource::Info,
                    hi * 1000,
                    axis,
                    format!("{field} {from} -> {to}"),
                    "",
                ));
            }
        }
        for l in c.latency.iter().filter(|l| l.event == "fork") {
            let at = axis.at(l.ts * 1_000_000);
            if (start - 1_000_000..=start + 1_000_000).contains(&at) {
                out.push(server_evidence(
                    EvidenceSource::Latency,
                    l.ts * 1_000_000,
                    axis,
                    format!("fork {} ms", l.latency_ms),
                    "",
                ));
            }
        }
    }
    out.sort_by_key(|e| e.at_us);
    out
}

/// Whether a line of this meaning ends a phase of this kind (for a child of unknown kind,
/// whichever end or failure comes first).
pub(super) fn ends_phase(kind: PhaseKind, m: LogMeaning) -> bool {
    use LogMeaning::*;
    match kind {
        PhaseKind::Bgsave => matches!(m, SaveEnded | SaveFailed),
        PhaseKind::AofRewrite => m == RewriteEnded,
        PhaseKind::Child => matches!(m, SaveEnded | SaveFailed | RewriteEnded | ForkFailed),
    }
}

pub(super) fn server_info(c: &Collected, axis: Option<&Axis>) -> RedisServerInfo {
    let at = |us: i64| axis.map_or(0, |a| a.at(us));
    RedisServerInfo {
        addr: c.addr.clone(),
        polls: c.polls,
        latency_monitor_threshold_ms: c.latency_threshold_ms,
        slowlog_log_slower_than_us: c.slowlog_threshold_us,
        latency: c
            .latency
            .iter()
            .map(|l| RedisLatency {
                event: l.event.clone(),
                ts: l.ts,
                at_us: at(l.ts * 1_000_000),
                latency_ms: l.latency_ms,
            })
            .collect(),
        slowlog: c
            .slowlog
            .iter()
            .map(|e| RedisSlow {
                id: e.id,
                ts: e.ts,
                at_us: at(e.ts * 1_000_000),
                duration_us: e.duration_us,
                command: e.command.clone(),
            })
            .collect(),
        info: c
            .info
            .iter()
            .map(|s| RedisInfoSample {
                at_us: at(s.at_ms * 1000),
                fields: s.fields.iter().cloned().collect(),
            })
            .collect(),
        errors: c.errors.clone(),
    }
}

/// The log's lines on the axis: those within `KEEP_MARGIN_US` of the trace kept, in time
/// order, and the log's first and last line (of the whole file when `file_ends` has them).
pub(super) fn place_lines(
    lines: Vec<LogLine>,
    file_ends: &(Option<LogLine>, Option<LogLine>),
    axis: &Axis,
    span: i64,
) -> Placed {
    let mut placed = Placed {
        lines: vec![],
        first_last: (None, None),
    };
    let mut seen = |at: i64| {
        let (f, l) = &mut placed.first_last;
        *f = Some(f.map_or(at, |f: i64| f.min(at)));
        *l = Some(l.map_or(at, |l: i64| l.max(at)));
    };
    let mut kept = vec![];
    for l in file_ends.0.iter().chain(file_ends.1.iter()) {
        if let Some(w) = axis.line_us(l) {
            seen(axis.at(w));
        }
    }
    for l in lines {
        let Some(w) = axis.line_us(&l) else { continue };
        let at = axis.at(w);
        seen(at);
        if (-KEEP_MARGIN_US..=span + KEEP_MARGIN_US).contains(&at) {
            kept.push((at, l));
        }
    }
    kept.sort_by_key(|(at, l)| (*at, l.line));
    placed.lines = kept;
    placed
}

/// The lines `redis.lines` lists (within `LIST_MARGIN_US` of the trace, at most
/// `LOG_LINES_MAX`: warnings and notices first) and how many were left out.
pub(super) fn listed_lines(placed: &Placed, span: i64, axis: &Axis) -> (Vec<RedisLogLine>, u64) {
    let listed: Vec<&(i64, LogLine)> = placed
        .lines
        .iter()
        .filter(|(at, _)| (-LIST_MARGIN_US..=span + LIST_MARGIN_US).contains(at))
        .collect();
    let mut keep: Vec<&(i64, LogLine)> = listed.clone();
    if keep.len() > LOG_LINES_MAX {
        // Warnings and notices first, then the verbose chatter, each in time order.
        keep.sort_by_key(|(at, l)| (rank_level(l.level), *at));
        keep.truncate(LOG_LINES_MAX);
        keep.sort_by_key(|(at, l)| (*at, l.line));
    }
    let lines = keep
        .iter()
        .map(|(at, l)| RedisLogLine {
            at_us: *at,
            ts: axis.iso(axis.base_us + at),
            line: l.line,
            pid: l.pid,
            role: l.role.clone(),
            level: l.level,
            message: short(&l.message, 300),
            meaning: classify(&l.message),
        })
        .collect();
    (lines, (listed.len() - keep.len()) as u64)
}

/// Each stall (and call in flight) and each phase gets what redis said in its window.
pub(super) fn give_evidence(
    report: &mut Report,
    placed: &Placed,
    server: Option<&Collected>,
    axis: &Axis,
) {
    for s in report.stalls.iter_mut().chain(report.in_flight.iter_mut()) {
        s.redis_evidence = Some(stall_evidence(s, placed, server, axis));
    }
    let parent = report.source.pid;
    let span_us = report.summary.span_us;
    let pids = report
        .live
        .container
        .as_ref()
        .map(|c| c.pids.clone())
        .unwrap_or_default();
    for p in &mut report.phases {
        let in_log = pids
            .iter()
            .find(|x| x.host == p.child_pid)
            .map_or(p.child_pid, |x| x.ns);
        p.redis_evidence = Some(phase_evidence(
            p, parent, in_log, span_us, placed, server, axis,
        ));
    }
}

/// A container's log lines carry the pids of its own pid namespace (pid 1 for redis):
/// each is given the host's pid of the same process, which the trace and the report use.
/// A pid not mapped (a process not traced) is left as redis wrote it.
pub(super) fn map_pids(lines: &mut [LogLine], pids: &[crate::report::NsPid]) {
    if pids.iter().all(|p| p.host == p.ns) {
        return;
    }
    for l in lines {
        if let Some(m) = l.pid.and_then(|n| pids.iter().find(|p| p.ns == n)) {
            l.pid = Some(m.host);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::NsPid;

    fn line(pid: u32) -> LogLine {
        crate::redis_log::parse_line(
            &format!("{pid}:M 06 Dec 2026 21:47:32.655 * Background saving started by pid 29"),
            1,
        )
        .unwrap()
        .0
    }

    #[test]
    fn a_container_s_log_pids_become_the_host_s() {
        let pids = [NsPid { host: 5680, ns: 1 }, NsPid { host: 5778, ns: 29 }];
        let mut lines = vec![line(1), line(29), line(3)];
        map_pids(&mut lines, &pids);
        let got: Vec<Option<u32>> = lines.iter().map(|l| l.pid).collect();
        // A pid not mapped is left as redis wrote it; the text is redis's, never rewritten.
        assert_eq!(got, [Some(5680), Some(5778), Some(3)]);
        assert!(lines[0].message.ends_with("by pid 29"));
        // A bare host's identity pairs change nothing.
        let mut same = vec![line(1)];
        map_pids(&mut same, &[NsPid { host: 1, ns: 1 }]);
        assert_eq!(same[0].pid, Some(1));
    }
}
