//! The section model of the text and HTML reports, between the report and those two
//! renderers: the one place that decides which sections a rendered report has, in which
//! order, and which rows of the report each one shows. `table` and `html` match on
//! [`Section`] and only format; a new section is added here once and the compiler then asks
//! both renderers for it.
//!
//! The two views differ on purpose: the terminal table fits 80 columns and a screen (the worst
//! incidents, a few rows per table), the page has room for every row and for the pictures.

use crate::report::{
    CommandPhase, CommandStats, FdStats, Finding, IdleStats, Incident, Parked, Phase, PhaseStats,
    Report, Skipped, SlowCall, Stall, SyscallStats, ThreadInfo,
};

/// Most stall rows the page writes out: beyond that it gets slow to open and the JSON report
/// is the better tool; the plot still shows every stall.
pub const MAX_STALL_ROWS: usize = 5_000;

/// Which report is being rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// `--format table`: an on-call engineer's 80-column terminal.
    Terminal,
    /// `--html`: a self-contained page.
    Page,
}

/// One section of a rendered report, with the rows it shows.
pub enum Section<'r> {
    /// The headline and what was read (source, span, durations, tracing cost).
    Header,
    /// Every finding; the renderer says "none" when there is none.
    Findings(&'r [Finding]),
    /// Page: the timeline picture.
    Timeline,
    /// Page: one lane per thread with redis's own signals, when there is anything to draw.
    Lanes,
    /// Terminal: the stalls grouped by incident, worst incident first.
    Incidents(Incidents<'r>),
    /// Page: every stall in trace order, up to [`MAX_STALL_ROWS`].
    Stalls(StallRows<'r>),
    /// Page: the overlapping stalls merged, in time order.
    IncidentList(&'r [Incident]),
    /// Calls running at the trace's edges whose known part is below the threshold, and how
    /// many calls were still blocked when it ended (idle waits too): a hang in which every
    /// thread is parked shows as exactly that.
    InFlight(InFlightRows<'r>),
    /// Background children, each with its before/during/after rows.
    Phases(Vec<PhaseBlock<'r>>),
    /// What /proc said over the trace (live).
    Host {
        interval_ms: u64,
        notes: &'r [String],
    },
    Commands(Vec<&'r CommandStats>),
    Slowest(&'r [SlowCall]),
    Idle(&'r [IdleStats]),
    Syscalls(&'r [SyscallStats]),
    Files(&'r [FdStats]),
    Threads(&'r [ThreadInfo]),
    /// Lines that could not be read: how many, and the first few.
    Skipped {
        lines: u64,
        first: &'r [Skipped],
    },
}

/// The terminal's incidents: at most `summary.top` (20 when unset), worst first.
pub struct Incidents<'r> {
    /// All the stalls (incidents index into them).
    pub stalls: &'r [Stall],
    pub total: usize,
    pub worst: Vec<&'r Incident>,
    /// Incidents not shown.
    pub more: usize,
}

pub struct StallRows<'r> {
    pub rows: &'r [Stall],
    pub total: usize,
}

pub struct PhaseBlock<'r> {
    pub phase: &'r Phase,
    pub stats: Vec<&'r PhaseStats>,
}

/// How many incidents and slow calls the terminal shows.
fn top(r: &Report) -> usize {
    if r.summary.top == 0 {
        20
    } else {
        r.summary.top
    }
}

/// The calls cut by the trace's edges, the first few of them, and the calls blocked at its end.
#[derive(Debug)]
pub struct InFlightRows<'r> {
    pub rows: &'r [Stall],
    /// Rows past `rows` (the JSON has them all).
    pub more: usize,
    /// Calls still blocked when the trace ended, idle waits included.
    pub blocked_at_end: u64,
    /// Of those, the ones listed here or as stalls.
    pub listed_at_end: usize,
    pub threads: u64,
    /// Threads strace attached to that made no call (`Summary::silent_threads`).
    pub silent: u64,
    /// The others, each a thread's wait for work: which thread waits in what (the first few).
    pub parked: &'r [Parked],
    /// Parked calls past `parked`.
    pub parked_more: usize,
    /// The trace has timestamps: without them "since" would date every wait at +0.
    pub timed: bool,
}

fn first<T>(rows: &[T], n: usize) -> &[T] {
    &rows[..rows.len().min(n)]
}

/// The sections of `r` in the order `view` shows them.
pub fn sections(r: &Report, view: View) -> Vec<Section<'_>> {
    match view {
        View::Terminal => terminal(r),
        View::Page => page(r),
    }
}

fn terminal(r: &Report) -> Vec<Section<'_>> {
    let mut out = vec![Section::Header, Section::Findings(&r.findings)];
    let mut worst: Vec<&Incident> = r.incidents.iter().collect();
    // Stable: incidents of equal length stay in time order.
    worst.sort_by_key(|i| std::cmp::Reverse(i.duration_us));
    let more = worst.len().saturating_sub(top(r));
    worst.truncate(top(r));
    out.push(Section::Incidents(Incidents {
        stalls: &r.stalls,
        total: r.incidents.len(),
        worst,
        more,
    }));
    if !r.in_flight.is_empty()
        || r.summary.in_flight_at_end > 0
        || !r.parked_at_end.is_empty()
        || r.summary.silent_threads > 0
    {
        out.push(Section::InFlight(InFlightRows {
            rows: first(&r.in_flight, 10),
            more: r.in_flight.len().saturating_sub(10),
            blocked_at_end: r.summary.in_flight_at_end,
            listed_at_end: r
                .in_flight
                .iter()
                .chain(&r.stalls)
                .filter(|s| s.in_flight == Some(crate::event::InFlight::AtEnd))
                .count(),
            threads: r.summary.threads,
            silent: r.summary.silent_threads,
            parked: first(&r.parked_at_end, 10),
            parked_more: r.parked_at_end.len().saturating_sub(10),
            timed: r.source.clock != crate::report::ClockKind::None,
        }));
    }
    if !r.phases.is_empty() {
        let blocks = r
            .phases
            .iter()
            .enumerate()
            .map(|(i, phase)| PhaseBlock {
                phase,
                // A row with no call in any of the three segments says nothing.
                stats: r
                    .phase_stats
                    .iter()
                    .filter(|s| {
                        s.phase == i && (s.before.count + s.during.count + s.after.count) > 0
                    })
                    .collect(),
            })
            .collect();
        out.push(Section::Phases(blocks));
    }
    out.extend(host(r));
    let all: Vec<_> = r
        .commands
        .iter()
        .filter(|c| c.phase == CommandPhase::All)
        .take(10)
        .collect();
    if !all.is_empty() {
        out.push(Section::Commands(all));
    }
    // A trace that measures nothing has no slowest calls, only calls.
    if super::timed(r) {
        out.push(Section::Slowest(first(&r.slowest, top(r).min(10))));
    }
    if !r.idle.is_empty() {
        out.push(Section::Idle(&r.idle));
    }
    out.push(Section::Syscalls(first(&r.syscalls, 12)));
    out.push(Section::Files(first(&r.fds, 12)));
    if r.summary.skipped_lines > 0 {
        out.push(Section::Skipped {
            lines: r.summary.skipped_lines,
            first: first(&r.skipped, 5),
        });
    }
    out
}

fn page(r: &Report) -> Vec<Section<'_>> {
    let mut out = vec![
        Section::Header,
        Section::Findings(&r.findings),
        Section::Timeline,
    ];
    if !r.stalls.is_empty() || r.redis.is_some() {
        out.push(Section::Lanes);
    }
    out.push(Section::Stalls(StallRows {
        rows: first(&r.stalls, MAX_STALL_ROWS),
        total: r.stalls.len(),
    }));
    if !r.slowest.is_empty() {
        out.push(Section::Slowest(&r.slowest));
    }
    if !r.incidents.is_empty() {
        out.push(Section::IncidentList(&r.incidents));
    }
    out.push(Section::Phases(
        r.phases
            .iter()
            .enumerate()
            .map(|(i, phase)| PhaseBlock {
                phase,
                stats: r.phase_stats.iter().filter(|s| s.phase == i).collect(),
            })
            .collect(),
    ));
    if !r.commands.is_empty() {
        out.push(Section::Commands(r.commands.iter().collect()));
    }
    if !r.idle.is_empty() {
        out.push(Section::Idle(&r.idle));
    }
    out.push(Section::Syscalls(&r.syscalls));
    out.push(Section::Files(&r.fds));
    if !r.threads.is_empty() {
        out.push(Section::Threads(&r.threads));
    }
    out.extend(host(r));
    if !r.skipped.is_empty() {
        out.push(Section::Skipped {
            lines: r.summary.skipped_lines,
            first: &r.skipped,
        });
    }
    out
}

fn host(r: &Report) -> Option<Section<'_>> {
    let h = r.live.host.as_ref().filter(|h| !h.notes.is_empty())?;
    Some(Section::Host {
        interval_ms: h.sample_interval_ms,
        notes: &h.notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Dist, PhaseKind, PhaseStatsOf};

    fn incident(start: i64, dur: i64) -> Incident {
        Incident {
            start_at_us: start,
            end_at_us: start + dur,
            ts: String::new(),
            duration_us: dur,
            stalls: vec![],
            waiting_commands: 0,
            waiting_clients: 0,
            worst_wait_us: None,
            finding: None,
        }
    }

    fn names(s: &[Section]) -> Vec<&'static str> {
        s.iter()
            .map(|s| match s {
                Section::Header => "header",
                Section::Findings(_) => "findings",
                Section::Timeline => "timeline",
                Section::Lanes => "lanes",
                Section::Incidents(_) => "incidents",
                Section::Stalls(_) => "stalls",
                Section::IncidentList(_) => "incident-list",
                Section::InFlight(_) => "in-flight",
                Section::Phases(_) => "phases",
                Section::Host { .. } => "host",
                Section::Commands(_) => "commands",
                Section::Slowest(_) => "slowest",
                Section::Idle(_) => "idle",
                Section::Syscalls(_) => "syscalls",
                Section::Files(_) => "files",
                Section::Threads(_) => "threads",
                Section::Skipped { .. } => "skipped",
            })
            .collect()
    }

    #[test]
    fn an_empty_report_still_says_findings_stalls_and_the_tallies() {
        let r = Report::default();
        assert_eq!(
            names(&sections(&r, View::Terminal)),
            [
                "header",
                "findings",
                "incidents",
                "slowest",
                "syscalls",
                "files"
            ]
        );
        assert_eq!(
            names(&sections(&r, View::Page)),
            ["header", "findings", "timeline", "stalls", "phases", "syscalls", "files"]
        );
    }

    #[test]
    fn the_terminal_shows_the_worst_incidents_first_up_to_top() {
        let mut r = Report::default();
        r.summary.top = 2;
        r.incidents = vec![
            incident(0, 5),
            incident(10, 9),
            incident(20, 5),
            incident(30, 7),
        ];
        let s = sections(&r, View::Terminal);
        let Some(Section::Incidents(i)) = s.iter().find(|s| matches!(s, Section::Incidents(_)))
        else {
            panic!("no incidents section");
        };
        let starts: Vec<i64> = i.worst.iter().map(|i| i.start_at_us).collect();
        assert_eq!(starts, [10, 30]);
        assert_eq!((i.total, i.more), (4, 2));
        // The page lists them all, in time order.
        let s = sections(&r, View::Page);
        let Some(Section::IncidentList(l)) =
            s.iter().find(|s| matches!(s, Section::IncidentList(_)))
        else {
            panic!("no incident list");
        };
        assert_eq!(l.len(), 4);
    }

    #[test]
    fn the_terminal_drops_phase_rows_with_no_call_and_keeps_them_on_the_page() {
        let mut r = Report::default();
        r.phases.push(Phase {
            kind: PhaseKind::Bgsave,
            child_pid: 7,
            start_at_us: 0,
            end_at_us: None,
            fork_us: None,
            ts: String::new(),
            ended_by: None,
            wrote: vec![],
            redis_evidence: None,
        });
        let seen = Dist {
            count: 1,
            ..Default::default()
        };
        r.phase_stats = vec![
            PhaseStats {
                phase: 0,
                what: PhaseStatsOf::MainFileSyscalls,
                during: seen,
                ..Default::default()
            },
            PhaseStats {
                phase: 0,
                what: PhaseStatsOf::Command("GET".into()),
                ..Default::default()
            },
        ];
        let rows = |v: View| {
            sections(&r, v)
                .into_iter()
                .find_map(|s| match s {
                    Section::Phases(b) => Some(b[0].stats.len()),
                    _ => None,
                })
                .unwrap()
        };
        assert_eq!(rows(View::Terminal), 1);
        assert_eq!(rows(View::Page), 2);
    }

    #[test]
    fn row_caps_are_the_views() {
        let mut r = Report {
            syscalls: (0..20).map(|_| SyscallStats::default()).collect(),
            ..Default::default()
        };
        r.summary.skipped_lines = 9;
        let count = |v: View| {
            sections(&r, v)
                .into_iter()
                .find_map(|s| match s {
                    Section::Syscalls(s) => Some(s.len()),
                    _ => None,
                })
                .unwrap()
        };
        assert_eq!((count(View::Terminal), count(View::Page)), (12, 20));
        // The terminal says lines were skipped even when none was kept for the report.
        assert!(names(&sections(&r, View::Terminal)).contains(&"skipped"));
        assert!(!names(&sections(&r, View::Page)).contains(&"skipped"));
    }
}
