//! The redis-evidence join: a post-processing step on the finished `Report`, after the
//! analyzer and before the renderers (for `analyze` and `attach` alike). One job: put what
//! redis itself said — its log (`redis_log`), and live, `LATENCY`, `INFO` and `SLOWLOG`
//! (`redis_client`) — on the trace's time axis, give each stall and background-save phase
//! the records that fall in its window (`redis_evidence`), and say for each finding which of
//! redis's signals agree and which were silent (`redis_signals`).
//!
//! Each source has its own clock: the log prints local wall time to the millisecond without
//! a zone, LATENCY and SLOWLOG stamp epoch seconds (so "in the same second" is as close as
//! they can say), INFO has no time at all (a change is known to have happened between two
//! polls). A source is called silent only when it was actually read over the stall's time.
//!
//! `discover` finds the log, `axis` places the trace and the log in time, `join` gives each
//! stall and phase its records, `signals` words what they say per finding; `apply` runs them
//! in that order. `live` follows the log and polls the server while `attach` traces.

mod axis;
mod discover;
mod join;
mod live;
mod signals;

pub use discover::{
    find_log, live_log_source, log_source_before_attach, LogSource, RECORDED_LOG_SUFFIX,
};
pub use live::LiveRedis;

use crate::redis_client::Collected;
use crate::redis_log::{self, LogLine};
use crate::report::{RedisLogInfo, RedisSection, Report};
use anyhow::{Context, Result};

/// Lines already read live by a follower.
#[derive(Clone, Debug, Default)]
pub struct FollowedLog {
    pub source: Option<LogSource>,
    pub lines: Vec<LogLine>,
    pub stats: redis_log::ReadStats,
    pub dropped: u64,
    pub error: Option<String>,
    /// Followed while tracing (else read whole at the end).
    pub followed: bool,
}

#[derive(Default)]
pub struct Inputs {
    /// A log file to read whole (offline, or live when only the fd table named it).
    pub log: Option<LogSource>,
    /// Live: a log followed while tracing.
    pub followed: Option<FollowedLog>,
    pub server: Option<Collected>,
    /// `--date` was given (so the trace's date is not to be taken from the log).
    pub date_given: bool,
}

/// Log lines kept around the trace for phases (a save's "terminated" line comes after its
/// child exits, maybe after the trace ended).
const KEEP_MARGIN_US: i64 = 60_000_000;

fn read_log_file(
    src: &LogSource,
    keep: impl Fn(&LogLine) -> bool,
) -> Result<(Vec<LogLine>, redis_log::ReadStats)> {
    let r = redis_log::open(&src.path)?;
    let mut kept = vec![];
    let st = redis_log::read(r, |l| {
        if keep(&l) {
            kept.push(l)
        }
    })
    .with_context(|| format!("cannot read {}", src.path))?;
    Ok((kept, st))
}

/// What was read of the log: its lines near the trace, what the file was, and its first and
/// last record (a file read whole keeps only its lines near the trace).
#[derive(Default)]
struct LogRead {
    lines: Vec<LogLine>,
    info: Option<RedisLogInfo>,
    file_ends: (Option<LogLine>, Option<LogLine>),
}

fn log_info(src: &LogSource, st: &redis_log::ReadStats, followed: bool) -> RedisLogInfo {
    RedisLogInfo {
        path: src.path.clone(),
        found: src.found,
        formats: st.formats.iter().map(|(x, _)| *x).collect(),
        lines_read: st.lines,
        unparsed_lines: st.unparsed,
        first: None,
        last: None,
        followed,
    }
}

/// The log's lines: those a follower read live, else the file read whole (through
/// `axis::prefilter`). Errors only for a log the user named that cannot be read.
fn read_log(report: &Report, inp: &mut Inputs, notes: &mut Vec<String>) -> Result<LogRead> {
    let mut out = LogRead::default();
    if let Some(f) = inp.followed.take() {
        if let Some(src) = &f.source {
            out.info = Some(log_info(src, &f.stats, f.followed));
            if let Some(e) = &f.error {
                notes.push(format!("redis's log {}: {e}", src.path));
            }
            if f.dropped > 0 {
                notes.push(format!(
                    "{} log lines were not kept while following the log (too many)",
                    f.dropped
                ));
            }
        }
        out.lines = f.lines;
    }
    let (None, Some(src)) = (&out.info, &inp.log) else {
        return Ok(out);
    };
    match read_log_file(src, axis::prefilter(report, inp.date_given)) {
        Ok((l, st)) => {
            out.file_ends = (st.first.clone(), st.last.clone());
            out.info = Some(log_info(src, &st, false));
            if st.lines > 0 && st.first.is_none() {
                notes.push(format!(
                    "{}: none of its {} lines is a redis log record",
                    src.path, st.lines
                ));
            }
            out.lines = l;
        }
        Err(e) if src.explicit => return Err(e.context(format!("--redis-log {}", src.path))),
        Err(e) => notes.push(format!("redis's log {} ({}): {e:#}", src.path, src.found)),
    }
    Ok(out)
}

/// The log file's first and last record, and a note when the log does not cover the trace.
fn note_log_ends(
    li: &mut RedisLogInfo,
    placed: &join::Placed,
    axis: &axis::Axis,
    span: i64,
    notes: &mut Vec<String>,
) {
    let (first, last) = placed.first_last;
    li.first = first.map(|a| axis.iso(axis.base_us + a));
    li.last = last.map(|a| axis.iso(axis.base_us + a));
    if last.is_some_and(|l| l < 0) {
        notes.push(format!(
            "redis's log ends before the trace begins (last line {}): it cannot tell what redis said during the trace",
            li.last.clone().unwrap_or_default()
        ));
    } else if first.is_some_and(|f| f > span) {
        notes.push("redis's log begins after the trace ended".into());
    }
}

/// Joins redis's signals onto the report. Errors only for a log the user named that
/// cannot be read; everything else that goes wrong is a note in `redis.notes`.
pub fn apply(report: &mut Report, mut inp: Inputs) -> Result<()> {
    if inp.log.is_none() && inp.followed.is_none() && inp.server.is_none() {
        return Ok(());
    }
    let mut sec = RedisSection::default();
    let log = read_log(report, &mut inp, &mut sec.notes)?;
    let server = inp.server.as_ref();
    let Some(axis) = axis::place(report, &log.lines, inp.date_given, &mut sec) else {
        sec.log = log.info;
        sec.server = server.map(|c| join::server_info(c, None));
        report.redis = Some(sec);
        return Ok(());
    };
    if sec.date_from_log.is_some() {
        axis.date_the_report(report);
    }
    let span = report.summary.span_us.max(0);
    let mut lines = log.lines;
    if let Some(c) = &report.live.container {
        join::map_pids(&mut lines, &c.pids);
    }
    let placed = join::place_lines(lines, &log.file_ends, &axis, span);
    let mut log_info = log.info;
    if let Some(li) = &mut log_info {
        note_log_ends(li, &placed, &axis, span, &mut sec.notes);
    }
    (sec.lines, sec.lines_not_listed) = join::listed_lines(&placed, span, &axis);
    join::give_evidence(report, &placed, server, &axis);
    let log_span = if log_info.as_ref().is_some_and(|l| l.followed) {
        // Followed live: every line written while tracing was read.
        Some((i64::MIN, i64::MAX))
    } else {
        match placed.first_last {
            (Some(f), Some(l)) => Some((f, l)),
            _ => None,
        }
    };
    let cov = server.map(|c| signals::coverage(c, &axis));
    signals::give_signals(report, log_span, server, cov.as_ref());
    sec.log = log_info;
    if let Some(c) = server {
        sec.server = Some(join::server_info(c, Some(&axis)));
        sec.notes.extend(c.errors.iter().cloned());
    }
    report.redis = Some(sec);
    Ok(())
}
