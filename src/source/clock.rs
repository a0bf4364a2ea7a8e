//! The trace's clock as the report shows it: which timestamp format the lines had, where
//! the trace starts, and how a time on that scale is printed or turned into wall-clock time
//! (with `--date` for time-of-day traces). Sources fill it in; the analysis and renderers
//! only read it.

use super::strace::TimeFmt;
use crate::event::Nanos;
use crate::report::ClockKind;

/// The trace's clock, as far as the source knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Clock {
    pub fmt: TimeFmt,
    /// perf trace: milliseconds since perf started.
    pub perf: bool,
    pub frac_digits: u8,
    /// First timestamp on the trace's scale.
    pub first: Nanos,
    /// For time-of-day clocks: the date of the first line and the UTC offset (seconds), from
    /// `--date`, to turn times into absolute ones.
    pub date: Option<(chrono::NaiveDate, i32)>,
    /// For live sources: wall-clock ns since the epoch of `first`.
    pub wall_at_first: Option<Nanos>,
}

impl Clock {
    pub fn none() -> Self {
        Clock {
            fmt: TimeFmt::None,
            perf: false,
            frac_digits: 6,
            first: 0,
            date: None,
            wall_at_first: None,
        }
    }

    /// A timestamp as the trace would have printed it.
    pub fn format(&self, ts: Nanos) -> String {
        let digits = if self.frac_digits == 0 {
            6
        } else {
            self.frac_digits.min(9)
        } as usize;
        // The ISO form only where it is the one printed: made and dropped for every
        // epoch time, it was half the cost of each stall row of the report.
        if self.fmt == TimeFmt::None || self.perf || self.wall_at_first.is_some() {
            if let Some(iso) = self.iso(ts) {
                return iso;
            }
        }
        // Written piece by piece with itoa: `format!` allocated and cost several times more
        // (bench/PROFILE.md, eighth round), and each stall row prints two.
        let mut out = String::with_capacity(24);
        let mut num = itoa::Buffer::new();
        // The fraction: the first `digits` digits of the nanoseconds padded to nine.
        let cut = 10i64.pow(9 - digits as u32);
        let mut frac = |out: &mut String, ns: i64| {
            let f = num.format(ns.rem_euclid(1_000_000_000) / cut);
            out.extend(std::iter::repeat_n('0', digits.saturating_sub(f.len())));
            out.push_str(f);
        };
        let two = |out: &mut String, v: i64| {
            out.push(char::from(b'0' + (v / 10) as u8));
            out.push(char::from(b'0' + (v % 10) as u8));
        };
        match self.fmt {
            TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac => {
                let d = ts.rem_euclid(86_400 * 1_000_000_000);
                let s = d / 1_000_000_000;
                two(&mut out, s / 3600);
                out.push(':');
                two(&mut out, (s % 3600) / 60);
                out.push(':');
                two(&mut out, s % 60);
                out.push('.');
                frac(&mut out, d);
            }
            TimeFmt::Epoch => {
                out.push_str(itoa::Buffer::new().format(ts.div_euclid(1_000_000_000)));
                out.push('.');
                frac(&mut out, ts);
            }
            _ => {
                let r = ts - self.first;
                out.push('+');
                out.push_str(itoa::Buffer::new().format(r.div_euclid(1_000_000_000)));
                out.push('.');
                frac(&mut out, r);
                out.push('s');
            }
        }
        out
    }

    /// Wall-clock time in ns since the epoch, where the source allows it.
    pub fn wall_ns(&self, ts: Nanos) -> Option<Nanos> {
        if let Some(w) = self.wall_at_first {
            return Some(w + (ts - self.first));
        }
        if self.perf {
            return None;
        }
        match self.fmt {
            TimeFmt::Epoch => Some(ts),
            TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac => {
                let (date, off) = self.date?;
                let midnight = date.and_hms_opt(0, 0, 0)?.and_utc().timestamp();
                Some((midnight - off as i64) * 1_000_000_000 + ts)
            }
            _ => None,
        }
    }

    /// ISO 8601 with date and UTC offset, where the source allows it.
    pub fn iso(&self, ts: Nanos) -> Option<String> {
        let w = self.wall_ns(ts)?;
        let off = self.date.map(|d| d.1).unwrap_or(0);
        let tz = chrono::FixedOffset::east_opt(off)?;
        let t = chrono::DateTime::from_timestamp(
            w.div_euclid(1_000_000_000),
            w.rem_euclid(1_000_000_000) as u32,
        )?;
        Some(
            t.with_timezone(&tz)
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, false),
        )
    }

    /// What these timestamps can say (the report's `source.clock`).
    pub fn describe(&self) -> ClockKind {
        if self.wall_at_first.is_some() {
            return ClockKind::Absolute;
        }
        if self.perf {
            return ClockKind::Relative;
        }
        match self.fmt {
            TimeFmt::Epoch => ClockKind::Absolute,
            TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac if self.date.is_some() => {
                ClockKind::Absolute
            }
            TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac => ClockKind::TimeOfDay,
            TimeFmt::Relative => ClockKind::Relative,
            TimeFmt::None => ClockKind::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fraction as it was first written: the nanoseconds padded to nine digits, cut.
    fn padded_cut(ns: i64, digits: usize) -> String {
        format!("{:09}", ns.rem_euclid(1_000_000_000))[..digits].to_string()
    }

    #[test]
    fn times_print_with_the_traces_digits() {
        let times: [i64; 10] = [
            0,
            1,
            999,
            1_000,
            123_456_789,
            999_999_999,
            1_700_000_000_000_000_001,
            86_399_999_999_999,
            -1,
            -1_500_000_000,
        ];
        for digits in 0..=9u8 {
            for fmt in [TimeFmt::Epoch, TimeFmt::TimeOfDayFrac, TimeFmt::Relative] {
                let c = Clock {
                    fmt,
                    frac_digits: digits,
                    first: 1_000_000_000,
                    ..Clock::none()
                };
                let shown = if digits == 0 { 6 } else { digits as usize };
                for ts in times {
                    let want = match fmt {
                        TimeFmt::Epoch => {
                            format!("{}.{}", ts.div_euclid(1_000_000_000), padded_cut(ts, shown))
                        }
                        TimeFmt::TimeOfDayFrac => {
                            let d = ts.rem_euclid(86_400 * 1_000_000_000);
                            let s = d / 1_000_000_000;
                            format!(
                                "{:02}:{:02}:{:02}.{}",
                                s / 3600,
                                (s % 3600) / 60,
                                s % 60,
                                padded_cut(d, shown)
                            )
                        }
                        _ => {
                            let r = ts - c.first;
                            format!("+{}.{}s", r.div_euclid(1_000_000_000), padded_cut(r, shown))
                        }
                    };
                    assert_eq!(c.format(ts), want, "{fmt:?} {digits} {ts}");
                }
            }
        }
    }
}
