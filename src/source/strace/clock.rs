//! The trace clock: per-line times (time of day, epoch, relative deltas) onto one ns
//! scale, with midnight rollovers under -t/-tt and the running sum under -r.

use super::prefix::{Prefix, TimeFmt};
use crate::event::Nanos;

/// The trace clock: turns per-line times into one monotonic-ish ns scale.
#[derive(Debug, Clone)]
pub struct ClockState {
    pub fmt: TimeFmt,
    pub frac_digits: u8,
    /// Days added for midnight rollovers (-t/-tt), in ns.
    day_ns: i64,
    /// Highest time seen so far, on the unified scale.
    high: Nanos,
    /// Running sum for -r.
    rel: Nanos,
    pub first: Option<Nanos>,
}

const DAY_NS: i64 = 86_400 * 1_000_000_000;

impl ClockState {
    pub(super) fn new() -> Self {
        ClockState {
            fmt: TimeFmt::None,
            frac_digits: 0,
            day_ns: 0,
            high: 0,
            rel: 0,
            first: None,
        }
    }

    /// Maps a line's timestamp onto the trace scale. `None` when the line has none.
    #[inline(always)]
    pub(super) fn map(&mut self, p: &Prefix) -> Option<Nanos> {
        let t = p.time?;
        // Nearly every line: in the trace's own format after its first time, where the
        // first-line tests of `map_first` are settled.
        if p.fmt == self.fmt && self.first.is_some() {
            let v = match p.fmt {
                TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac => self.time_of_day(t),
                TimeFmt::Relative => {
                    self.rel += t;
                    self.rel
                }
                _ => t,
            };
            self.high = self.high.max(v);
            return Some(v);
        }
        Some(self.map_first(p, t))
    }

    /// `map` of the first time, or of a time in another format than the trace's.
    #[inline(never)]
    fn map_first(&mut self, p: &Prefix, t: Nanos) -> Nanos {
        if self.fmt == TimeFmt::None {
            self.fmt = p.fmt;
            self.frac_digits = p.frac_digits;
        }
        let v = match p.fmt {
            TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac if self.first.is_some() => {
                self.time_of_day(t)
            }
            TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac => t + self.day_ns,
            TimeFmt::Relative => {
                self.rel += t;
                self.rel
            }
            _ => t,
        };
        if self.first.is_none() {
            self.first = Some(v);
        }
        if v > self.high || self.first == Some(v) {
            self.high = self.high.max(v);
        }
        v
    }

    /// A time of day on the trace scale once the trace has a first time: moved a day on
    /// when far behind the latest (midnight passed), a day back when far ahead of it (a
    /// late line from before midnight). The caller raises `high`.
    #[inline(always)]
    fn time_of_day(&mut self, t: Nanos) -> Nanos {
        let mut v = t + self.day_ns;
        // Nearly every line is within half a day of the latest: one unsigned compare says
        // so (both tests below fail exactly when `v - high` is in -DAY/2..=DAY/2).
        if (v - self.high + DAY_NS / 2) as u64 <= DAY_NS as u64 {
            return v;
        }
        if v < self.high - DAY_NS / 2 {
            self.day_ns += DAY_NS;
            v += DAY_NS;
        } else if v > self.high + DAY_NS / 2 && self.day_ns > 0 {
            v -= DAY_NS;
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn midnight_rollover_under_tt_and_t() {
        let got = run(&[
            "23:59:59.900000 fdatasync(7) = 0 <0.000100>",
            "00:00:00.100000 fdatasync(7) = 0 <0.000100>",
            // printed late, from before midnight
            "23:59:59.950000 getpid() = 1 <0.000001>",
            "00:00:01.000000 getpid() = 1 <0.000001>",
        ]);
        let ts: Vec<i64> = got.iter().map(|e| e.ts).collect();
        assert_eq!(
            ts,
            vec![
                tod(23, 59, 59, 900_000),
                DAY + 100 * MS,
                tod(23, 59, 59, 950_000),
                DAY + S
            ]
        );
        let got = run(&["23:59:59 fdatasync(7) = 0", "00:00:02 fdatasync(7) = 0"]);
        assert_eq!(
            got.iter().map(|e| e.ts).collect::<Vec<_>>(),
            vec![tod(23, 59, 59, 0), DAY + 2 * S]
        );
    }

    #[test]
    fn relative_times_accumulate() {
        let got = run(&[
            "     0.000000 epoll_wait(5, [], 10128, 81) = 0 <0.081163>",
            "     0.081200 getpid() = 7 <0.000003>",
            "     0.000151 close(8) = 0 <0.000057>",
        ]);
        assert_eq!(
            got.iter().map(|e| e.ts).collect::<Vec<_>>(),
            vec![0, 81_200 * US, 81_351 * US]
        );
    }

    /// Lines with a different timestamp format than the trace's are skipped, not misplaced.
    #[test]
    fn mixed_timestamp_formats_are_skipped() {
        let (got, skips) = run_lines(&[
            b"1000 1700000052.321000 openat(AT_FDCWD, \"/etc/passwd\", O_RDONLY) = 3",
            b"1000 14:32:01 read(3, \"root:x:0:0\"..., 1024) = 312",
            b"1000 1700000052.321100 write(1, \"hi\", 2) = 2",
        ]);
        assert_eq!(got.len(), 2);
        assert_eq!(skips, vec![(2, SkipReason::BadTimestamp)]);
    }

    /// Ten-digit epoch seconds past what ns can hold (found by fuzzing): no overflow, the line
    /// goes to the general path, which refuses the time.
    #[test]
    fn epoch_seconds_past_the_ns_range_do_not_overflow() {
        let (p, _) = parse_prefix(b"9716078611.649905 read(3, \"\", 1) = 0");
        assert_eq!(p.time, None);
        let (p, _) = parse_prefix(b"9223372035.000001 read(3, \"\", 1) = 0");
        assert_eq!(p.time, Some(9_223_372_035_000_001_000));
    }
}
