//! The time axis: where the trace sits in wall-clock time, and in which zone redis's log
//! times are read. One job: turn a log line's stamp into the report's `at_us` (and back into
//! ISO 8601), from the trace's own clock, `--date`, or the date the log gives a `-t/-tt`
//! trace; and decide, before a log is read, which of its lines can fall near the trace.

use super::KEEP_MARGIN_US;
use crate::redis_log::{LogLine, LogTime};
use crate::report::{RedisSection, Report};
use chrono::{NaiveDate, NaiveDateTime, NaiveTime};

/// For date inference: how far outside the trace's time of day a line may be.
pub(super) const DATE_MARGIN_US: i64 = 2_000_000;

/// The trace's wall clock: epoch µs of `at_us` 0, and the zone assumed for log times that
/// carry none.
#[derive(Clone, Debug)]
pub(super) struct Axis {
    pub(super) base_us: i64,
    offset_s: i32,
    /// The year for redis 2.x lines, which print none.
    year: i32,
}

impl Axis {
    pub(super) fn line_us(&self, l: &LogLine) -> Option<i64> {
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

    pub(super) fn iso(&self, epoch_us: i64) -> String {
        self.iso_with(epoch_us, chrono::SecondsFormat::Millis)
    }

    fn iso_with(&self, epoch_us: i64, f: chrono::SecondsFormat) -> String {
        let tz = chrono::FixedOffset::east_opt(self.offset_s)
            .unwrap_or_else(|| chrono::FixedOffset::east_opt(0).expect("UTC"));
        chrono::DateTime::from_timestamp_micros(epoch_us)
            .map(|t| t.with_timezone(&tz).to_rfc3339_opts(f, false))
            .unwrap_or_default()
    }

    pub(super) fn at(&self, epoch_us: i64) -> i64 {
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

pub(super) fn offset_words(off: i32) -> String {
    let sign = if off < 0 { '-' } else { '+' };
    let a = off.abs();
    format!("{sign}{:02}:{:02}", a / 3600, (a % 3600) / 60)
}

/// This machine's UTC offset at an instant (redis prints its local time; when it ran here,
/// or on a machine in the same zone, this is its zone).
pub(super) fn local_offset_at(epoch_us: i64) -> i32 {
    use chrono::{Local, Offset, TimeZone};
    Local
        .timestamp_micros(epoch_us)
        .single()
        .map(|t| t.offset().fix().local_minus_utc())
        .unwrap_or(0)
}

pub(super) fn local_offset_on(date: NaiveDate) -> i32 {
    use chrono::{Local, Offset, TimeZone};
    date.and_hms_opt(12, 0, 0)
        .and_then(|noon| Local.from_local_datetime(&noon).single())
        .map(|t| t.offset().fix().local_minus_utc())
        .unwrap_or(0)
}

/// Whether the trace printed times of day only (`-t`/`-tt`): `summary.start` is then
/// `HH:MM:SS[.ffffff]`.
pub(super) fn time_of_day(r: &Report) -> Option<NaiveTime> {
    let s = r.summary.start.as_deref()?;
    NaiveTime::parse_from_str(s, "%H:%M:%S%.f").ok()
}

/// Which lines of a log file are worth holding, decided before reading it (a log of months
/// of verbose logging must not be read into memory): the trace's window and a margin,
/// placed with the same clock rules as the join's; for a `-t/-tt` trace without a date, the
/// trace's span of the day on any date (the date is chosen among those afterwards).
pub(super) fn prefilter(report: &Report, date_given: bool) -> impl Fn(&LogLine) -> bool {
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
pub(super) fn infer_date(lines: &[LogLine], t0: NaiveTime, span_us: i64) -> Option<NaiveDate> {
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

/// Places the trace in wall-clock time and says how in `sec.clock` (and `utc_offset`, and
/// `date_from_log` when a `-t/-tt` trace took its date from the log's `lines`). None when
/// nothing can be placed: the trace has no wall clock, or no date and no dated line at its
/// times of day.
pub(super) fn place(
    report: &Report,
    lines: &[LogLine],
    date_given: bool,
    sec: &mut RedisSection,
) -> Option<Axis> {
    let tod = time_of_day(report);
    let iso_base = report
        .summary
        .start_iso
        .as_deref()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
    match (iso_base, tod) {
        (Some(b), _) => Some(from_trace_date(b, tod.is_some(), sec)),
        (None, Some(t0)) if !date_given => from_log_date(lines, t0, report.summary.span_us, sec),
        (None, Some(_)) => {
            sec.clock = NO_DATED_LINE.into();
            None
        }
        (None, None) => {
            sec.clock = "the trace has no wall clock (relative times, or none): redis's signals cannot be placed on it".into();
            None
        }
    }
}

const NO_DATED_LINE: &str = "the trace prints only times of day and redis's log has no dated line at those times: \
                             redis's signals cannot be placed on the trace (give --date, or the log of that day)";

/// A trace with a date (its own, or `--date` for a time-of-day trace): the log's local
/// times are read in the trace's zone, or, for an epoch trace, in this machine's.
fn from_trace_date(
    b: chrono::DateTime<chrono::FixedOffset>,
    time_of_day: bool,
    sec: &mut RedisSection,
) -> Axis {
    let base_us = b.timestamp_micros();
    let (offset_s, words) = if time_of_day {
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
    Axis {
        base_us,
        offset_s,
        year: chrono::Datelike::year(&b.naive_local()),
    }
}

/// A time-of-day trace without `--date`: its date is the one on which most of the log's
/// dated lines fall in its span of the day.
fn from_log_date(
    lines: &[LogLine],
    t0: NaiveTime,
    span_us: i64,
    sec: &mut RedisSection,
) -> Option<Axis> {
    let Some(d) = infer_date(lines, t0, span_us) else {
        sec.clock = NO_DATED_LINE.into();
        return None;
    };
    let o = local_offset_on(d);
    let base_us = d.and_time(t0).and_utc().timestamp_micros() - o as i64 * 1_000_000;
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

impl Axis {
    /// The trace took its date from the log: say it where the report says times, in
    /// micro-seconds as the trace's own stamps and the analyzer's ISO times.
    pub(super) fn date_the_report(&self, report: &mut Report) {
        let us = chrono::SecondsFormat::Micros;
        report.summary.start_iso = Some(self.iso_with(self.base_us, us));
        for s in report.stalls.iter_mut().chain(report.in_flight.iter_mut()) {
            s.ts_iso = Some(self.iso_with(self.base_us + s.at_us, us));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis_log;

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
}
