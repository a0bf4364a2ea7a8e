//! The trace clock: per-line times (time of day, epoch, relative deltas) onto one ns
//! scale, with midnight rollovers under -t/-tt and the running sum under -r.

use super::prefix::{Prefix, TimeFmt};
use crate::event::Nanos;

/// The trace clock: turns per-line times into one monotonic-ish ns scale.
#[derive(Debug, Clone)]
pub struct ClockState {
    pub fmt: TimeFmt,
    pub frac_digits: u8,
    /// Days added for midnight rollovers (-t/-tt).
    day: i64,
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
            day: 0,
            high: 0,
            rel: 0,
            first: None,
        }
    }

    /// Maps a line's timestamp onto the trace scale. `None` when the line has none.
    pub(super) fn map(&mut self, p: &Prefix) -> Option<Nanos> {
        let t = p.time?;
        if self.fmt == TimeFmt::None {
            self.fmt = p.fmt;
            self.frac_digits = p.frac_digits;
        }
        let v = match p.fmt {
            TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac => {
                let mut v = t + self.day * DAY_NS;
                if self.first.is_some() && v < self.high - DAY_NS / 2 {
                    // Far behind the latest time: the clock passed midnight.
                    self.day += 1;
                    v += DAY_NS;
                } else if v > self.high + DAY_NS / 2 && self.day > 0 {
                    // A late line printed out of order from before midnight.
                    v -= DAY_NS;
                }
                v
            }
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
        Some(v)
    }
}
