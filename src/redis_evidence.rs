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

use crate::redis_client::Collected;
use crate::redis_log::{self, LogLevel, LogLine, LogRole, LogTime};
use crate::report::{
    EvidenceSource, FileClass, FindingId, LinePosition, LogFound, LogMeaning, PhaseKind,
};
use crate::report::{
    RedisEvidence, RedisInfoSample, RedisLatency, RedisLogInfo, RedisLogLine, RedisSection,
    RedisServerInfo, RedisSlow, Report, Stall, LOG_LINES_MAX,
};
use crate::units::{human, short};
use anyhow::{Context, Result};
use chrono::{NaiveDate, NaiveDateTime, NaiveTime};

/// Where the log to read is, and how it was found.
#[derive(Clone, Debug)]
pub struct LogSource {
    pub path: String,
    pub found: LogFound,
    /// The user named it (`--redis-log`): failing to read it is an error, not a note.
    pub explicit: bool,
}

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

/// Live: the log to follow is `--redis-log`, else the config's `logfile` (relative to the
/// process's working directory, which redis has changed to its `dir`), else what redis at
/// `--redis` says its logfile is.
pub fn live_log_source(
    explicit: Option<&str>,
    redis: Option<&str>,
    ctx: &crate::live::procctx::ProcContext,
    conf: Option<&crate::fdtable::RedisConf>,
) -> Option<LogSource> {
    let src = match explicit {
        Some(p) => Some(LogSource {
            path: p.to_string(),
            found: LogFound::Flag,
            explicit: true,
        }),
        None => conf
            .and_then(|c| c.logfile.as_deref())
            .filter(|l| !l.is_empty())
            .map(|l| {
                let p = std::path::Path::new(l);
                let full = match (&ctx.cwd, p.is_absolute()) {
                    (Some(cwd), false) => std::path::Path::new(cwd).join(p),
                    _ => p.to_path_buf(),
                };
                LogSource {
                    path: full.to_string_lossy().into_owned(),
                    found: LogFound::ConfLogfile,
                    explicit: false,
                }
            }),
    };
    // redis rewrites its argv, so /proc may not tell the config; redis itself can.
    src.or_else(|| {
        let addr = redis?;
        let mut c =
            crate::redis_client::Conn::connect(addr, std::time::Duration::from_secs(2)).ok()?;
        let r = c.cmd(&["CONFIG", "GET", "logfile"]).ok()?;
        let lf = r.items().get(1)?.as_text().filter(|l| !l.is_empty())?;
        let p = std::path::Path::new(&lf);
        let full = match (&ctx.cwd, p.is_absolute()) {
            (Some(cwd), false) => std::path::Path::new(cwd).join(p),
            _ => p.to_path_buf(),
        };
        Some(LogSource {
            path: full.to_string_lossy().into_owned(),
            found: LogFound::ConfigGet,
            explicit: false,
        })
    })
}

/// Which log to follow, found before the tracer attaches (`attach --redis`, `watch`): once
/// traced, the one-off `CONFIG GET logfile` connection's command would count as a client's.
/// `conf` is the user's config; without it, the one the process was started with.
pub fn log_source_before_attach(
    pid: u32,
    explicit: Option<&str>,
    redis: Option<&str>,
    conf: Option<&crate::fdtable::RedisConf>,
) -> Option<LogSource> {
    let pre = crate::live::procctx::gather(pid);
    let pre_conf =
        (!pre.redis_conf.is_empty()).then(|| crate::fdtable::RedisConf::parse(&pre.redis_conf));
    live_log_source(explicit, redis, &pre, conf.or(pre_conf.as_ref()))
}

/// Live (`attach`): the log followed while tracing and the `--redis` poller, started at
/// attach and joined onto the report at the end.
pub struct LiveRedis {
    follower: Option<(LogSource, redis_log::Follower)>,
    poller: Option<crate::redis_client::Poller>,
}

impl LiveRedis {
    /// The log is `--redis-log`, else the config's `logfile` (relative to the process's
    /// working directory, which redis has changed to its `dir`).
    /// `asked`: the log found before the attach (`log_source_before_attach`), if redis was
    /// asked.
    /// `redis_log`: `--redis-log`; `redis`: `--redis`'s address.
    pub fn start(
        redis_log: Option<&str>,
        redis: Option<&str>,
        ctx: &crate::live::procctx::ProcContext,
        conf: Option<&crate::fdtable::RedisConf>,
        asked: Option<LogSource>,
    ) -> LiveRedis {
        let src = asked.or_else(|| live_log_source(redis_log, None, ctx, conf));
        let follower = src.map(|s| {
            let f = redis_log::Follower::start(&s.path, std::time::Duration::from_millis(200));
            (s, f)
        });
        let poller = redis.map(|a| {
            crate::redis_client::Poller::start_for(
                a,
                std::time::Duration::from_secs(1),
                Some(ctx.pid),
            )
        });
        if let Some(a) = redis {
            eprintln!(
                "stallscope: asking redis at {a} for LATENCY, INFO and SLOWLOG once a second"
            );
        }
        LiveRedis { follower, poller }
    }

    /// The traced redis's fds of the poller's connections made since the last call (see
    /// `Poller::take_own_conns`), for `Analyzer::mark_own_connection`.
    pub fn take_own_conns(&self) -> Vec<(i32, i64)> {
        self.poller
            .as_ref()
            .map(|p| p.take_own_conns())
            .unwrap_or_default()
    }

    pub fn finish(self, report: &mut Report) -> Result<()> {
        let server = self.poller.map(|p| p.finish());
        let followed = self.follower.map(|(src, f)| {
            let got = f.finish(std::time::Duration::from_millis(400));
            FollowedLog {
                source: Some(src),
                lines: got.lines,
                stats: got.stats,
                dropped: got.dropped,
                error: got.error,
                followed: true,
            }
        });
        // No config named a log: the one the trace saw redis write, read whole (through the
        // helper too: this disk may be the one that stalls).
        let followed = followed.or_else(|| {
            let src = find_log(&[], None, report)?;
            let got = redis_log::Follower::read_whole(&src.path)
                .finish(std::time::Duration::from_secs(2));
            Some(FollowedLog {
                source: Some(src),
                lines: got.lines,
                stats: got.stats,
                dropped: got.dropped,
                error: got.error,
                followed: false,
            })
        });
        apply(
            report,
            Inputs {
                log: None,
                followed,
                server,
                date_given: false,
            },
        )
    }
}

/// Log lines kept around the trace for phases (a save's "terminated" line comes after its
/// child exits, maybe after the trace ended).
const KEEP_MARGIN_US: i64 = 60_000_000;
/// Log lines listed in `redis.lines`: the trace's window and this much either side.
const LIST_MARGIN_US: i64 = 1_000_000;
/// A line may be stamped this long before the syscall it caused: redis reads the clock,
/// formats the line, opens the log file, writes, closes (and under strace every step is
/// slower), or logs "taking too long" just before the AOF write that then blocks.
const LINE_BEFORE_US: i64 = 20_000;
/// How long after a stall the stalled process's next line may be stamped and still tell
/// what the blocked call was doing.
const LINE_AFTER_US: i64 = 20_000;
/// Most evidence items per stall: a long stall of a verbose redis overlaps many lines.
const MAX_PER_STALL: usize = 12;
/// For date inference: how far outside the trace's time of day a line may be.
const DATE_MARGIN_US: i64 = 2_000_000;

/// The trace's wall clock: epoch µs of `at_us` 0, and the zone assumed for log times that
/// carry none.
#[derive(Clone, Debug)]
struct Axis {
    base_us: i64,
    offset_s: i32,
    /// The year for redis 2.x lines, which print none.
    year: i32,
}

impl Axis {
    fn line_us(&self, l: &LogLine) -> Option<i64> {
        Some(match l.time {
            LogTime::Epoch { ms } => ms * 1000,
            LogTime::Local { t, year_known } => {
                let t = if year_known {
                    t
                } else {
                    NaiveDate::from_ymd_opt(self.year, t.month_(), t.day_())?.and_time(t.time())
                };
                (t.and_utc().timestamp_micros()) - self.offset_s as i64 * 1_000_000
            }
        })
    }

    fn iso(&self, epoch_us: i64) -> String {
        self.iso_with(epoch_us, chrono::SecondsFormat::Millis)
    }

    fn iso_with(&self, epoch_us: i64, f: chrono::SecondsFormat) -> String {
        let tz = chrono::FixedOffset::east_opt(self.offset_s)
            .unwrap_or_else(|| chrono::FixedOffset::east_opt(0).expect("UTC"));
        chrono::DateTime::from_timestamp_micros(epoch_us)
            .map(|t| t.with_timezone(&tz).to_rfc3339_opts(f, false))
            .unwrap_or_default()
    }

    fn at(&self, epoch_us: i64) -> i64 {
        epoch_us - self.base_us
    }
}

trait MonthDay {
    fn month_(&self) -> u32;
    fn day_(&self) -> u32;
}
impl MonthDay for NaiveDateTime {
    fn month_(&self) -> u32 {
        chrono::Datelike::month(self)
    }
    fn day_(&self) -> u32 {
        chrono::Datelike::day(self)
    }
}

fn offset_words(off: i32) -> String {
    let sign = if off < 0 { '-' } else { '+' };
    let a = off.abs();
    format!("{sign}{:02}:{:02}", a / 3600, (a % 3600) / 60)
}

/// This machine's UTC offset at an instant (redis prints its local time; when it ran here,
/// or on a machine in the same zone, this is its zone).
fn local_offset_at(epoch_us: i64) -> i32 {
    use chrono::{Local, Offset, TimeZone};
    Local
        .timestamp_micros(epoch_us)
        .single()
        .map(|t| t.offset().fix().local_minus_utc())
        .unwrap_or(0)
}

fn local_offset_on(date: NaiveDate) -> i32 {
    use chrono::{Local, Offset, TimeZone};
    date.and_hms_opt(12, 0, 0)
        .and_then(|noon| Local.from_local_datetime(&noon).single())
        .map(|t| t.offset().fix().local_minus_utc())
        .unwrap_or(0)
}

/// Whether the trace printed times of day only (`-t`/`-tt`): `summary.start` is then
/// `HH:MM:SS[.ffffff]`.
fn time_of_day(r: &Report) -> Option<NaiveTime> {
    let s = r.summary.start.as_deref()?;
    NaiveTime::parse_from_str(s, "%H:%M:%S%.f").ok()
}

/// Finds redis's log for an offline trace without being told: beside the trace
/// (`NAME.redis.log`, `redis.log`, gzipped or not), the file a redis.conf names (given with
/// --redis-conf, or `NAME.redis.conf` beside the trace), or the log file the trace itself
/// wrote, when it exists here.
pub fn find_log(
    trace_files: &[String],
    conf: Option<&crate::fdtable::RedisConf>,
    report: &Report,
) -> Option<LogSource> {
    let exists = |p: &std::path::Path| p.is_file();
    let found = |p: std::path::PathBuf, how: LogFound| LogSource {
        path: p.to_string_lossy().into_owned(),
        found: how,
        explicit: false,
    };
    let trace = trace_files.iter().find(|f| f.as_str() != "-");
    let mut side_conf = None;
    if let Some(t) = trace {
        let p = std::path::Path::new(t);
        let dir = p.parent().unwrap_or(std::path::Path::new("")).to_path_buf();
        let name = p.file_name()?.to_string_lossy().into_owned();
        let mut stem = name.trim_end_matches(".gz").to_string();
        // An `strace -ff` piece: NAME.PID.
        if let Some((head, tail)) = stem.rsplit_once('.') {
            if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) {
                stem = head.to_string();
            }
        }
        for ext in [".strace", ".txt", ".trace", ".log", ".perf"] {
            if let Some(s) = stem.strip_suffix(ext) {
                stem = s.to_string();
                break;
            }
        }
        for cand in [
            format!("{stem}.redis.log"),
            format!("{stem}.redis.log.gz"),
            "redis.log".to_string(),
            "redis.log.gz".to_string(),
        ] {
            let c = dir.join(&cand);
            if exists(&c) {
                return Some(found(c, LogFound::BesideTrace));
            }
        }
        let c = dir.join(format!("{stem}.redis.conf"));
        if let Ok(text) = std::fs::read_to_string(&c) {
            side_conf = Some((crate::fdtable::RedisConf::parse(&text), dir));
        }
    }
    let trace_dir = trace
        .and_then(|t| std::path::Path::new(t).parent())
        .map(|d| d.to_path_buf())
        .unwrap_or_default();
    let confs = conf
        .map(|c| (c.clone(), trace_dir.clone()))
        .into_iter()
        .chain(side_conf);
    for (c, here) in confs {
        let Some(lf) = c.logfile.as_deref().filter(|l| !l.is_empty()) else {
            continue;
        };
        let lp = std::path::Path::new(lf);
        let mut cands = vec![];
        if lp.is_absolute() {
            cands.push(lp.to_path_buf());
            // A capture moved off its machine: the same name beside the trace.
            if let Some(n) = lp.file_name() {
                cands.push(here.join(n));
            }
        } else {
            if let Some(d) = &c.dir {
                cands.push(std::path::Path::new(d).join(lp));
            }
            cands.push(here.join(lp));
        }
        if let Some(p) = cands.into_iter().find(|p| exists(p)) {
            return Some(found(p, LogFound::ConfLogfile));
        }
    }
    report
        .fds
        .iter()
        .filter(|f| f.class == FileClass::Log)
        .filter_map(|f| f.path.as_deref())
        .find(|p| exists(std::path::Path::new(p)))
        .map(|p| found(p.into(), LogFound::TraceLogFile))
}

/// What a log file holds over the trace, on its axis.
struct Placed {
    /// (at_us, line), sorted by time.
    lines: Vec<(i64, LogLine)>,
    first_last: (Option<i64>, Option<i64>),
}

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

/// Which lines of a log file are worth holding, decided before reading it (a log of months
/// of verbose logging must not be read into memory): the trace's window and a margin,
/// placed with the same clock rules as the join's; for a `-t/-tt` trace without a date, the
/// trace's span of the day on any date (the date is chosen among those afterwards).
fn prefilter(report: &Report, date_given: bool) -> impl Fn(&LogLine) -> bool {
    let span = report.summary.span_us.max(0);
    let tod = time_of_day(report);
    let iso = report
        .summary
        .start_iso
        .as_deref()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
    let abs = iso.map(|b| {
        let base = b.timestamp_micros();
        let off = if tod.is_some() {
            b.offset().local_minus_utc()
        } else {
            local_offset_at(base)
        };
        Axis {
            base_us: base,
            offset_s: off,
            year: chrono::Datelike::year(&b.naive_local()),
        }
    });
    let t0_us = tod.and_then(|t| t.signed_duration_since(NaiveTime::MIN).num_microseconds());
    move |l: &LogLine| {
        if let Some(a) = &abs {
            return a
                .line_us(l)
                .is_some_and(|w| (-KEEP_MARGIN_US..=span + KEEP_MARGIN_US).contains(&a.at(w)));
        }
        let (Some(t0), false) = (t0_us, date_given) else {
            return false;
        };
        let LogTime::Local { t, .. } = l.time else {
            return false;
        };
        const DAY: i64 = 86_400_000_000;
        if span + 2 * KEEP_MARGIN_US >= DAY {
            return true;
        }
        let tod = t
            .time()
            .signed_duration_since(NaiveTime::MIN)
            .num_microseconds()
            .unwrap_or(0);
        let into = (tod - t0 + KEEP_MARGIN_US).rem_euclid(DAY);
        into <= span + 2 * KEEP_MARGIN_US
    }
}

/// Picks the trace's date for a time-of-day trace: the date on which the most log lines
/// fall within the trace's span of the day.
fn infer_date(lines: &[LogLine], t0: NaiveTime, span_us: i64) -> Option<NaiveDate> {
    let mut votes: std::collections::BTreeMap<NaiveDate, u64> = Default::default();
    let t0_us = t0
        .signed_duration_since(NaiveTime::MIN)
        .num_microseconds()?;
    for l in lines {
        let LogTime::Local {
            t,
            year_known: true,
        } = l.time
        else {
            continue;
        };
        let tod = t
            .time()
            .signed_duration_since(NaiveTime::MIN)
            .num_microseconds()?;
        // The line's offset into the trace, for the trace starting on this line's date, the
        // day before (a trace that crossed midnight) or the day after.
        for (day_shift, base) in [(0i64, 0i64), (-1, 86_400_000_000), (1, -86_400_000_000)] {
            let into = tod + base - t0_us;
            if (-DATE_MARGIN_US..=span_us + DATE_MARGIN_US).contains(&into) {
                let d = t.date() + chrono::Duration::days(day_shift);
                *votes.entry(d).or_default() += 1;
            }
        }
    }
    votes
        .into_iter()
        .max_by_key(|(d, n)| (*n, *d))
        .map(|(d, _)| d)
}

/// Joins redis's signals onto the report. Errors only for a log the user named that
/// cannot be read; everything else that goes wrong is a note in `redis.notes`.
pub fn apply(report: &mut Report, inp: Inputs) -> Result<()> {
    if inp.log.is_none() && inp.followed.is_none() && inp.server.is_none() {
        return Ok(());
    }
    let mut sec = RedisSection::default();
    // 1. The log's lines.
    let mut lines: Vec<LogLine> = vec![];
    let mut log_info: Option<RedisLogInfo> = None;
    // A file's first and last records (its lines outside the trace are not kept).
    let mut file_ends: (Option<LogLine>, Option<LogLine>) = (None, None);
    if let Some(f) = inp.followed {
        if let Some(src) = &f.source {
            log_info = Some(RedisLogInfo {
                path: src.path.clone(),
                found: src.found,
                formats: f.stats.formats.iter().map(|(x, _)| *x).collect(),
                lines_read: f.stats.lines,
                unparsed_lines: f.stats.unparsed,
                first: None,
                last: None,
                followed: f.followed,
            });
            if let Some(e) = &f.error {
                sec.notes.push(format!("redis's log {}: {e}", src.path));
            }
            if f.dropped > 0 {
                sec.notes.push(format!(
                    "{} log lines were not kept while following the log (too many)",
                    f.dropped
                ));
            }
        }
        lines = f.lines;
    }
    if log_info.is_none() {
        if let Some(src) = &inp.log {
            match read_log_file(src, prefilter(report, inp.date_given)) {
                Ok((l, st)) => {
                    file_ends = (st.first.clone(), st.last.clone());
                    log_info = Some(RedisLogInfo {
                        path: src.path.clone(),
                        found: src.found,
                        formats: st.formats.iter().map(|(x, _)| *x).collect(),
                        lines_read: st.lines,
                        unparsed_lines: st.unparsed,
                        first: None,
                        last: None,
                        followed: false,
                    });
                    if st.lines > 0 && st.first.is_none() {
                        sec.notes.push(format!(
                            "{}: none of its {} lines is a redis log record",
                            src.path, st.lines
                        ));
                    }
                    lines = l;
                }
                Err(e) if src.explicit => {
                    return Err(e.context(format!("--redis-log {}", src.path)));
                }
                Err(e) => sec
                    .notes
                    .push(format!("redis's log {} ({}): {e:#}", src.path, src.found)),
            }
        }
    }
    // 2. The axis.
    let tod = time_of_day(report);
    let iso_base = report
        .summary
        .start_iso
        .as_deref()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
    let year_hint = log_info
        .as_ref()
        .and_then(|li| std::fs::metadata(&li.path).ok())
        .and_then(|m| m.modified().ok())
        .map(|t| chrono::Datelike::year(&chrono::DateTime::<chrono::Utc>::from(t)))
        .unwrap_or(1970);
    let axis = if let Some(b) = iso_base {
        let base_us = b.timestamp_micros();
        let (offset_s, words) = if tod.is_some() {
            let o = b.offset().local_minus_utc();
            (
                o,
                format!(
                    "the trace prints local times of day on the date given with --date; redis's log times are read in the same zone (UTC{})",
                    offset_words(o)
                ),
            )
        } else {
            let o = local_offset_at(base_us);
            (
                o,
                format!(
                    "the trace's clock is the epoch; redis's log prints local time without a zone, read as this machine's (UTC{})",
                    offset_words(o)
                ),
            )
        };
        sec.clock = words;
        sec.utc_offset = Some(offset_words(offset_s));
        Some(Axis {
            base_us,
            offset_s,
            year: chrono::Datelike::year(&b.naive_local()),
        })
    } else if let Some(t0) = tod {
        match infer_date(&lines, t0, report.summary.span_us) {
            Some(d) if !inp.date_given => {
                let o = local_offset_on(d);
                let base_naive = d.and_time(t0);
                let base_us = base_naive.and_utc().timestamp_micros() - o as i64 * 1_000_000;
                sec.date_from_log = Some(d.to_string());
                sec.utc_offset = Some(offset_words(o));
                sec.clock = format!(
                    "the trace prints only times of day (-t/-tt) and no --date was given: its date, {d}, was taken from redis's log, \
                     whose lines at those times of day carry it; trace and log are read as the same local clock, this machine's zone (UTC{})",
                    offset_words(o)
                );
                Some(Axis {
                    base_us,
                    offset_s: o,
                    year: chrono::Datelike::year(&d),
                })
            }
            _ => {
                sec.clock = "the trace prints only times of day and redis's log has no dated line at those times: \
                             redis's signals cannot be placed on the trace (give --date, or the log of that day)"
                    .into();
                None
            }
        }
    } else {
        sec.clock = "the trace has no wall clock (relative times, or none): redis's signals cannot be placed on it".into();
        None
    };
    let Some(axis) = axis else {
        sec.log = log_info;
        if let Some(c) = inp.server {
            sec.server = Some(server_info(&c, None));
        }
        report.redis = Some(sec);
        return Ok(());
    };
    let axis = Axis {
        year: if iso_base.is_some() || sec.date_from_log.is_some() {
            axis.year
        } else {
            year_hint
        },
        ..axis
    };
    if sec.date_from_log.is_some() {
        // The trace now has a date: say it where the report says times.
        // Micro-seconds, as the trace's own stamps and the analyzer's ISO times.
        let us = chrono::SecondsFormat::Micros;
        report.summary.start_iso = Some(axis.iso_with(axis.base_us, us));
        for s in report.stalls.iter_mut().chain(report.in_flight.iter_mut()) {
            s.ts_iso = Some(axis.iso_with(axis.base_us + s.at_us, us));
        }
    }
    let span = report.summary.span_us.max(0);
    let mut placed = Placed {
        lines: vec![],
        first_last: (None, None),
    };
    for l in file_ends.0.iter().chain(file_ends.1.iter()) {
        if let Some(w) = axis.line_us(l) {
            let at = axis.at(w);
            placed.first_last.0 = Some(placed.first_last.0.map_or(at, |f: i64| f.min(at)));
            placed.first_last.1 = Some(placed.first_last.1.map_or(at, |f: i64| f.max(at)));
        }
    }
    for l in lines {
        let Some(w) = axis.line_us(&l) else { continue };
        let at = axis.at(w);
        placed.first_last.0 = Some(placed.first_last.0.map_or(at, |f: i64| f.min(at)));
        placed.first_last.1 = Some(placed.first_last.1.map_or(at, |f: i64| f.max(at)));
        if (-KEEP_MARGIN_US..=span + KEEP_MARGIN_US).contains(&at) {
            placed.lines.push((at, l));
        }
    }
    placed.lines.sort_by_key(|(at, l)| (*at, l.line));
    if let Some(li) = &mut log_info {
        li.first = placed.first_last.0.map(|a| axis.iso(axis.base_us + a));
        li.last = placed.first_last.1.map(|a| axis.iso(axis.base_us + a));
        if placed.first_last.1.is_some_and(|l| l < 0) {
            sec.notes.push(format!(
                "redis's log ends before the trace begins (last line {}): it cannot tell what redis said during the trace",
                li.last.clone().unwrap_or_default()
            ));
        } else if placed.first_last.0.is_some_and(|f| f > span) {
            sec.notes
                .push("redis's log begins after the trace ended".into());
        }
    }
    // 3. The listed lines.
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
    sec.lines_not_listed = (listed.len() - keep.len()) as u64;
    sec.lines = keep
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
    // 4. Evidence per stall and phase.
    let server = inp.server.as_ref();
    for s in report.stalls.iter_mut().chain(report.in_flight.iter_mut()) {
        s.redis_evidence = Some(stall_evidence(s, &placed, server, &axis));
    }
    let parent = report.source.pid;
    let span_us = report.summary.span_us;
    for p in &mut report.phases {
        p.redis_evidence = Some(phase_evidence(p, parent, span_us, &placed, server, &axis));
    }
    // 5. Which signals agree, per finding.
    let log_span = if log_info.as_ref().is_some_and(|l| l.followed) {
        // Followed live: every line written while tracing was read.
        Some((i64::MIN, i64::MAX))
    } else {
        match placed.first_last {
            (Some(f), Some(l)) => Some((f, l)),
            _ => None,
        }
    };
    let server_cov = server.map(|c| coverage(c, &axis));
    let signals: Vec<Option<String>> = report
        .findings
        .iter()
        .map(|f| finding_signals(f, report, log_span, server, server_cov.as_ref()))
        .collect();
    for (f, sig) in report.findings.iter_mut().zip(signals) {
        if let Some(s) = &sig {
            f.evidence = format!(
                "{}. Redis's own signals: {s}",
                f.evidence.trim_end_matches('.')
            );
        }
        f.redis_signals = Some(sig);
    }
    sec.log = log_info;
    if let Some(c) = server {
        sec.server = Some(server_info(c, Some(&axis)));
        for e in &c.errors {
            sec.notes.push(e.clone());
        }
    }
    report.redis = Some(sec);
    Ok(())
}

fn rank_level(l: Option<LogLevel>) -> u8 {
    match l {
        Some(LogLevel::Warning) => 0,
        Some(LogLevel::Notice) | None => 1,
        Some(LogLevel::Verbose) => 2,
        Some(LogLevel::Debug) => 3,
    }
}

/// What a log line means, when redis's wording names a cause (the words differ a little
/// between redis and valkey, and across versions).
pub fn classify(msg: &str) -> Option<LogMeaning> {
    let m = msg;
    Some(
        if m.starts_with("Asynchronous AOF fsync is taking too long") {
            LogMeaning::AofFsyncTooLong
        } else if m.starts_with("Background saving started") {
            LogMeaning::SaveStarted
        } else if m.starts_with("Background saving terminated") {
            LogMeaning::SaveEnded
        } else if m.starts_with("Background saving error") {
            LogMeaning::SaveFailed
        } else if m.starts_with("Background append only file rewriting started") {
            LogMeaning::RewriteStarted
        } else if m.starts_with("Background AOF rewrite terminated")
            || m.starts_with("Background AOF rewrite finished")
        {
            LogMeaning::RewriteEnded
        } else if m.starts_with("Fork CoW") {
            LogMeaning::ChildCopyOnWrite
        } else if m.starts_with("DB saved on disk") {
            LogMeaning::ChildSaved
        } else if m.contains("fork") && m.contains("Cannot allocate memory") {
            LogMeaning::ForkFailed
        } else if m.starts_with("Error writing to the AOF") || m.contains("AOF write error") {
            LogMeaning::AofWriteError
        } else {
            return None;
        },
    )
}

/// A log line as evidence. Its `what` is `[role pid] message`, after where it sits relative
/// to the stall and what it means ("written just before the stall; AOF fsync too long: ...").
fn log_evidence(
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
fn server_evidence(
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
fn same_process(l: &LogLine, s: &Stall) -> bool {
    l.pid == Some(s.pid)
        || (s.pid == 0 && s.thread == crate::report::Role::Main && l.role == LogRole::Master)
}

/// What redis said in a stall's window: its log lines and, with `--redis`, the server's
/// records; the most telling first when there are more than `MAX_PER_STALL`, then in time
/// order.
fn stall_evidence(
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

fn stall_end(s: &Stall) -> i64 {
    s.at_us + s.duration_us.max(0)
}

/// The log lines in a stall's window, each with its rank (0: it names the stall or sits
/// right at it; then by level).
fn stall_log_lines(s: &Stall, placed: &Placed, axis: &Axis) -> Vec<(u8, RedisEvidence)> {
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
                Some(if s.class == Some(FileClass::Log) {
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
fn stall_server_records(c: &Collected, a_ep: i64, b_ep: i64, axis: &Axis) -> Vec<RedisEvidence> {
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
fn info_changes(c: &Collected) -> Vec<(String, i64, i64, i64, i64)> {
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

fn phase_evidence(
    p: &crate::report::Phase,
    parent: Option<u32>,
    span_us: i64,
    placed: &Placed,
    server: Option<&Collected>,
    axis: &Axis,
) -> Vec<RedisEvidence> {
    let by_pid = format!("by pid {}", p.child_pid);
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
fn ends_phase(kind: PhaseKind, m: LogMeaning) -> bool {
    use LogMeaning::*;
    match kind {
        PhaseKind::Bgsave => matches!(m, SaveEnded | SaveFailed),
        PhaseKind::AofRewrite => m == RewriteEnded,
        PhaseKind::Child => matches!(m, SaveEnded | SaveFailed | RewriteEnded | ForkFailed),
    }
}

/// The span (on the axis) over which the server's sources were read.
struct Coverage {
    /// INFO: first and last answered poll.
    info: Option<(i64, i64)>,
    /// LATENCY and SLOWLOG: read at the end too (HISTORY, GET), so they cover everything
    /// since the first successful connection, back to what redis still remembers.
    history_from: Option<i64>,
}

fn coverage(c: &Collected, axis: &Axis) -> Coverage {
    // INFO only tells a change between two answered polls: covered from the first poll sent
    // to the last answered.
    let info = match (c.info.first(), c.info.last()) {
        (Some(f), Some(l)) if c.info.len() >= 2 => {
            Some((axis.at(f.sent_ms * 1000), axis.at(l.at_ms * 1000)))
        }
        _ => None,
    };
    let history_from = if c.final_ok {
        Some(i64::MIN)
    } else {
        c.first_ok_ms.map(|f| axis.at(f * 1000))
    };
    Coverage { info, history_from }
}

fn join_names(v: &[&str]) -> String {
    match v.len() {
        0 => String::new(),
        1 => v[0].to_string(),
        n => format!("{} and {}", v[..n - 1].join(", "), v[n - 1]),
    }
}

/// The stalls a finding explains, over their span: what its signals are judged on.
struct FindingStalls<'a> {
    stalls: Vec<&'a Stall>,
    first: i64,
    last: i64,
    worst_ms: i64,
}

impl<'a> FindingStalls<'a> {
    fn of(f: &crate::report::Finding, r: &'a Report) -> Option<FindingStalls<'a>> {
        let stalls: Vec<&Stall> = r
            .stalls
            .iter()
            .filter(|s| s.finding == Some(f.id))
            .collect();
        Some(FindingStalls {
            first: stalls.iter().map(|s| s.at_us).min()?,
            last: stalls.iter().map(|s| s.at_us + s.duration_us).max()?,
            worst_ms: stalls.iter().map(|s| s.duration_us).max()? / 1000,
            stalls,
        })
    }

    fn evidence(&self) -> impl Iterator<Item = &'a RedisEvidence> + '_ {
        self.stalls
            .iter()
            .flat_map(|s| s.redis_evidence.iter().flatten())
    }

    /// How many of the stalls have an item that passes `pick`.
    fn count(&self, pick: impl Fn(&RedisEvidence) -> bool) -> usize {
        self.stalls
            .iter()
            .filter(|s| s.redis_evidence.iter().flatten().any(&pick))
            .count()
    }

    /// " (k of n stalls)", or nothing for a finding of one stall.
    fn of_n(&self, k: usize) -> String {
        match self.stalls.len() {
            1 => String::new(),
            n => format!(" ({k} of {n} stalls)"),
        }
    }
}

/// A log line agrees with a stall when it names it: a cause redis logs, or the line a
/// log-file stall was writing. Other lines in the window are listed as evidence but are not
/// agreement.
fn names_the_stall(x: &RedisEvidence) -> bool {
    x.source == EvidenceSource::Log
        && (x.position == Some(LinePosition::BeingWritten) || x.meaning.is_some())
}

/// What redis's log says about a finding's stalls: Ok(agreement) or Err(silent) when it was
/// read over them and has nothing in their windows; None when it cannot say.
fn log_signal(fs: &FindingStalls, log_span: Option<(i64, i64)>) -> Option<Result<String, ()>> {
    let (lf, ll) = log_span?;
    let k = fs.count(names_the_stall);
    let any = fs.count(|x| x.source == EvidenceSource::Log);
    if k == 0 && any > 0 {
        return Some(Ok(format!(
            "redis's log has lines in the window but none that names the stall{}",
            fs.of_n(any)
        )));
    }
    if k > 0 {
        return Some(Ok(format!("{}{}", log_agreement(fs), fs.of_n(k))));
    }
    (any == 0 && lf <= fs.first && ll >= fs.last).then_some(Err(()))
}

/// The most telling of the lines that name the stalls: "taking too long" first, then the
/// line redis was writing, then what it logged right after, then any other named cause.
fn log_agreement(fs: &FindingStalls) -> String {
    let named: Vec<&RedisEvidence> = fs.evidence().filter(|x| names_the_stall(x)).collect();
    let at = |p: LinePosition| named.iter().filter(move |x| x.position == Some(p));
    if named
        .iter()
        .any(|x| x.meaning == Some(LogMeaning::AofFsyncTooLong))
    {
        return "redis's log says \"Asynchronous AOF fsync is taking too long\"".to_string();
    }
    if at(LinePosition::BeingWritten).next().is_some() {
        return "redis's log has the line it was writing when the stall began".to_string();
    }
    if let Some(m) = at(LinePosition::JustAfter).find_map(|x| x.meaning) {
        return format!("redis's log, just after: {}", m.words());
    }
    // A named line is a classified one here: its labels, up to the meaning's own colon.
    match named.first() {
        Some(x) => {
            let label: Vec<&str> = [
                x.position.map(LinePosition::words),
                x.meaning.map(LogMeaning::words),
            ]
            .into_iter()
            .flatten()
            .collect();
            let label = label.join("; ");
            format!("redis's log: {}", label.split(": ").next().unwrap_or(""))
        }
        None => "redis's log has lines in the stall's window".to_string(),
    }
}

/// The signals a finding gets from the server (`--redis`): agreements, and the sources read
/// over its stalls that saw nothing.
fn server_signals<'s>(
    fs: &FindingStalls,
    cov: &Coverage,
    agree: &mut Vec<String>,
    silent: &mut Vec<&'s str>,
) {
    let hist = cov.history_from.is_some_and(|h| h <= fs.first);
    let k = fs.count(|x| x.source == EvidenceSource::Latency);
    if k > 0 {
        let mut ev: Vec<&str> = fs
            .evidence()
            .filter(|x| x.source == EvidenceSource::Latency)
            .map(|x| x.text.as_str())
            .collect();
        ev.dedup();
        let shown: Vec<&str> = ev.iter().take(3).copied().collect();
        agree.push(format!(
            "LATENCY {}{} in the same second{}",
            join_names(&shown),
            if ev.len() > 3 { ", ..." } else { "" },
            fs.of_n(k)
        ));
    } else if hist {
        silent.push("LATENCY");
    }
    let k = fs.count(|x| x.source == EvidenceSource::Slowlog);
    if k > 0 {
        agree.push(format!(
            "SLOWLOG has an entry in the same second{}",
            fs.of_n(k)
        ));
    } else if hist {
        silent.push("SLOWLOG");
    }
    let k = fs.count(|x| x.source == EvidenceSource::Info);
    if k > 0 {
        agree.push(format!(
            "INFO counters changed across the stall{}",
            fs.of_n(k)
        ));
    } else if cov
        .info
        .is_some_and(|(f0, l0)| f0 <= fs.first && l0 >= fs.last)
    {
        silent.push("INFO");
    }
}

/// The sentence a finding gets: which of redis's signals agree, which were silent and why
/// that is expected. None when the finding has no stalls or nothing of redis's was read.
fn finding_signals(
    f: &crate::report::Finding,
    r: &Report,
    log_span: Option<(i64, i64)>,
    server: Option<&Collected>,
    cov: Option<&Coverage>,
) -> Option<String> {
    let fs = FindingStalls::of(f, r)?;
    let mut agree = vec![];
    let mut silent: Vec<&str> = vec![];
    match log_signal(&fs, log_span) {
        Some(Ok(a)) => agree.push(a),
        Some(Err(())) => silent.push("redis's log"),
        None => {}
    }
    if let Some(cov) = cov {
        server_signals(&fs, cov, &mut agree, &mut silent);
    }
    if agree.is_empty() && silent.is_empty() {
        return None;
    }
    let mut s = agree.join("; ");
    if !silent.is_empty() {
        if !s.is_empty() {
            s.push_str("; ");
        }
        s.push_str(&format!("{} saw nothing", join_names(&silent)));
        let why = silence_reason(f.id, &silent, server, fs.worst_ms);
        if !why.is_empty() {
            s.push_str(": ");
            s.push_str(&why);
        }
    }
    Some(s)
}

/// Why a silent source is expected to be silent for this kind of stall.
fn silence_reason(
    id: FindingId,
    silent: &[&str],
    server: Option<&Collected>,
    worst_ms: i64,
) -> String {
    use FindingId::*;
    let lat = silent.contains(&"LATENCY");
    let log = silent.contains(&"redis's log");
    let mut why = vec![];
    if lat {
        match server.and_then(|c| c.latency_threshold_ms) {
            Some(0) => {
                why.push("the latency monitor is off (latency-monitor-threshold 0)".to_string())
            }
            Some(t) if worst_ms < t => why.push(format!(
                "the worst stall, {worst_ms} ms, is under latency-monitor-threshold {t} ms"
            )),
            _ => {}
        }
    }
    if silent.contains(&"INFO") {
        why.push("INFO only counts delayed AOF fsyncs and forks".into());
    }
    match id {
        LogFileBlocking if lat => {
            why.push("a log-file stall is not a latency event in redis".into())
        }
        ChildDiskIo if lat => {
            why.push("redis does not time its save child's disk writes".into())
        }
        ChildDiskIo if log => {
            why.push("redis logs nothing about its save child's disk waits".into())
        }
        AofWriteAlone | AofWriteActiveChild | AofWritePendingFsync | AofFsyncAlways if log => {
            why.push(
                "redis logs \"taking too long\" only when the background fsync has been pending for 2 s".into(),
            )
        }
        _ => {}
    }
    why.join("; ")
}

fn server_info(c: &Collected, axis: Option<&Axis>) -> RedisServerInfo {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str, n: u64) -> LogLine {
        redis_log::parse_line(text, n).unwrap().0
    }

    #[test]
    fn date_is_taken_from_the_lines_at_the_traces_time_of_day() {
        let lines = vec![
            line(
                "1:M 29 Nov 2026 22:55:00.000 * yesterday, before the window",
                1,
            ),
            line("1:M 30 Nov 2026 22:55:12.655 - in the window", 2),
            line("1:M 30 Nov 2026 22:55:13.000 - in the window", 3),
            line("1:M 01 Dec 2026 08:00:00.000 - next morning", 4),
        ];
        let t0 = NaiveTime::from_hms_milli_opt(22, 55, 9, 513).unwrap();
        assert_eq!(
            infer_date(&lines, t0, 20_000_000),
            NaiveDate::from_ymd_opt(2026, 11, 30)
        );
        // A trace that began before midnight: a line just after midnight votes for the day before.
        let lines = vec![line("1:M 01 Dec 2026 00:00:01.000 - after midnight", 1)];
        let t0 = NaiveTime::from_hms_opt(23, 59, 59).unwrap();
        assert_eq!(
            infer_date(&lines, t0, 5_000_000),
            NaiveDate::from_ymd_opt(2026, 11, 30)
        );
        // No dated line at that time of day: no date.
        assert_eq!(
            infer_date(
                &lines,
                NaiveTime::from_hms_opt(12, 0, 0).unwrap(),
                1_000_000
            ),
            None
        );
    }

    fn stall(at_us: i64, duration_us: i64, class: &str, finding: &str) -> Stall {
        Stall {
            sched: None,
            quiet_calls: None,
            redis_evidence: None,
            ts: String::new(),
            ts_iso: None,
            at_us,
            pid: 1,
            tid: 1,
            thread: "main".into(),
            kind: crate::report::StallKind::SlowSyscall,
            syscall: Some("close".into()),
            fd: Some(9),
            path: None,
            class: Some(class.into()),
            duration_us,
            line: None,
            cause: String::new(),
            finding: Some(finding.into()),
            bound: crate::report::Bound::Exact,
            duration_known: crate::report::DurationKnown::Measured,
            in_flight: None,
            waiting_commands: 0,
            waiting_by_command: Default::default(),
            waiting_clients: 0,
            worst_wait_us: None,
            phase: None,
            events_lost: false,
        }
    }

    /// A live report on the epoch axis, 30 s long, with one log-file stall at 10 s and one
    /// DEBUG SLEEP-like gap at 20 s; redis was polled over the whole trace.
    fn live_report(threshold_ms: i64) -> (Report, Collected) {
        let base_s = 1_796_079_300;
        let mut r = Report::default();
        r.summary.start_iso = Some("2026-11-30T22:55:00.000000+00:00".into());
        r.summary.start = Some(format!("{base_s}.000000"));
        r.summary.span_us = 30_000_000;
        r.source.pid = Some(1);
        r.stalls
            .push(stall(10_000_000, 4_000_000, "log", "log-file-blocking"));
        r.stalls
            .push(stall(20_000_000, 300_000, "unknown", "command"));
        for id in ["log-file-blocking", "command"] {
            r.findings.push(crate::report::Finding {
                id: id.into(),
                severity: crate::report::Severity::Critical,
                title: String::new(),
                evidence: "e".into(),
                advice: String::new(),
                stalls: 1,
                redis_signals: None,
            });
        }
        let c = Collected {
            addr: "127.0.0.1:1".into(),
            latency_threshold_ms: Some(threshold_ms),
            latency: vec![crate::redis_client::LatencySample {
                event: "command".into(),
                ts: base_s + 20,
                latency_ms: 301,
            }],
            first_ok_ms: Some(base_s * 1000 - 500),
            last_ok_ms: Some((base_s + 31) * 1000),
            final_ok: true,
            polls: 31,
            ..Default::default()
        };
        (r, c)
    }

    #[test]
    fn findings_say_which_signals_agree_and_which_were_silent() {
        let (mut r, c) = live_report(100);
        apply(
            &mut r,
            Inputs {
                server: Some(c),
                ..Default::default()
            },
        )
        .unwrap();
        let sig: Vec<Option<String>> = r
            .findings
            .iter()
            .map(|f| f.redis_signals.clone().unwrap())
            .collect();
        let log = sig[0].as_deref().unwrap();
        assert!(log.contains("LATENCY and SLOWLOG saw nothing"), "{log}");
        assert!(
            log.contains("a log-file stall is not a latency event in redis"),
            "{log}"
        );
        // The log was not read: nothing is claimed about it.
        assert!(
            !log.contains("log:") && !log.contains("redis's log"),
            "{log}"
        );
        let cmd = sig[1].as_deref().unwrap();
        assert!(
            cmd.starts_with("LATENCY command 301 ms in the same second"),
            "{cmd}"
        );
        assert!(cmd.contains("SLOWLOG saw nothing"), "{cmd}");
        assert!(r.findings[0]
            .evidence
            .contains("Redis's own signals: LATENCY and SLOWLOG"));
        let ev = |i: usize| r.stalls[i].redis_evidence.as_deref().unwrap();
        assert!(ev(0).is_empty());
        assert_eq!(ev(1).len(), 1);
        assert_eq!(ev(1)[0].source, "latency");
        // Typed: the server's record in its own words, no log position or meaning.
        assert_eq!(ev(1)[0].text, "command 301 ms");
        assert_eq!((ev(1)[0].position, ev(1)[0].meaning), (None, None));
    }

    #[test]
    fn a_latency_monitor_that_is_off_is_named_as_the_reason() {
        let (mut r, mut c) = live_report(0);
        c.latency.clear();
        apply(
            &mut r,
            Inputs {
                server: Some(c),
                ..Default::default()
            },
        )
        .unwrap();
        let cmd = r.findings[1].redis_signals.clone().flatten().unwrap();
        assert!(
            cmd.contains("the latency monitor is off (latency-monitor-threshold 0)"),
            "{cmd}"
        );
    }

    #[test]
    fn a_server_never_reached_is_not_called_silent() {
        let (mut r, mut c) = live_report(100);
        c.first_ok_ms = None;
        c.last_ok_ms = None;
        c.final_ok = false;
        c.polls = 0;
        c.latency.clear();
        c.errors
            .push("--redis 127.0.0.1:1: cannot connect: refused".into());
        apply(
            &mut r,
            Inputs {
                server: Some(c),
                ..Default::default()
            },
        )
        .unwrap();
        let red = r.redis.as_ref().unwrap();
        assert!(
            r.findings.iter().all(|f| f.redis_signals == Some(None)),
            "{:?}",
            r.findings
        );
        assert!(red.notes.iter().any(|n| n.contains("cannot connect")));
        assert_eq!(r.findings[0].evidence, "e");
    }

    #[test]
    fn only_lines_near_the_trace_are_held() {
        let mut r = Report::default();
        r.summary.start = Some("22:55:09.513307".into());
        r.summary.span_us = 20_000_000;
        let keep = prefilter(&r, false);
        // Time of day only: the trace's span of the day, on any date, with a minute's margin.
        assert!(keep(&line("1:M 30 Nov 2026 22:55:12.655 - in", 1)));
        assert!(keep(&line(
            "1:M 29 Nov 2026 22:55:12.655 - same time, other day",
            2
        )));
        assert!(keep(&line(
            "1:M 30 Nov 2026 22:54:20.000 - within the margin",
            3
        )));
        assert!(!keep(&line("1:M 30 Nov 2026 10:00:00.000 - far", 4)));
        // With a date: that day only.
        r.summary.start_iso = Some("2026-11-30T22:55:09.513307+00:00".into());
        let keep = prefilter(&r, true);
        assert!(keep(&line("1:M 30 Nov 2026 22:55:12.655 - in", 1)));
        assert!(!keep(&line(
            "1:M 29 Nov 2026 22:55:12.655 - a day early",
            2
        )));
        assert!(keep(&line(
            "1:signal-handler (1796079330) Received SIGTERM",
            3
        )));
        // No wall clock: nothing can be placed, nothing is held.
        r.summary.start_iso = None;
        r.summary.start = Some("+0.000000s".into());
        assert!(!prefilter(&r, false)(&line(
            "1:M 30 Nov 2026 22:55:12.655 - in",
            1
        )));
    }

    #[test]
    fn classified_lines() {
        assert_eq!(classify("Asynchronous AOF fsync is taking too long (disk is busy?). Writing the AOF buffer without waiting for fsync to complete, this may slow down Redis."), Some(LogMeaning::AofFsyncTooLong));
        assert_eq!(
            classify("Background saving started by pid 28169"),
            Some(LogMeaning::SaveStarted)
        );
        assert_eq!(
            classify("Background saving terminated with success"),
            Some(LogMeaning::SaveEnded)
        );
        assert_eq!(classify("Accepted 127.0.0.1:47826"), None);
    }
}
