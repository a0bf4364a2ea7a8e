//! One interface over the text parsers: a `FileSource` feeds each line to its `LineParser`
//! (strace or perf trace, chosen by format detection) and gets the same outcome back, used
//! or skipped with a reason, whichever tracer wrote the file.

use super::perf::PerfParser;
use super::strace::{StraceParser, TimeFmt};
use super::Clock;
use crate::event::Event;

pub use crate::report::SkipReason;

/// What one line produced.
#[derive(Debug, PartialEq)]
pub enum LineOutcome {
    /// Used; zero or more events were pushed.
    Used,
    Skipped(SkipReason),
}

impl LineOutcome {
    /// The reason the line was skipped, if it was.
    pub fn skipped(&self) -> Option<SkipReason> {
        match self {
            LineOutcome::Used => None,
            LineOutcome::Skipped(r) => Some(*r),
        }
    }
}

/// The parser of one input, whichever format it is in.
pub(crate) enum LineParser {
    Strace(StraceParser),
    Perf(PerfParser),
}

impl LineParser {
    /// Parses one physical line (without its newline), pushing the events it completes.
    #[inline]
    pub(crate) fn feed(&mut self, raw: &[u8], out: &mut Vec<Event>) -> LineOutcome {
        match self {
            LineParser::Strace(p) => p.feed(raw, out),
            LineParser::Perf(p) => p.feed(raw, out),
        }
    }

    /// A line handed back as used that turned out skipped (perf: a held call line nothing
    /// continued): (line, reason, text).
    #[inline]
    pub(crate) fn take_late(&mut self) -> Option<(u64, super::SkipReason, Vec<u8>)> {
        match self {
            LineParser::Strace(_) => None,
            LineParser::Perf(p) => p.take_late(),
        }
    }

    /// Name events pushed (perf's comms), which are no events of the trace.
    #[inline]
    pub(crate) fn named(&self) -> u64 {
        match self {
            LineParser::Strace(_) => 0,
            LineParser::Perf(p) => p.named,
        }
    }

    /// A line the reader did not hand over (too long): counted, to keep line numbers.
    pub(crate) fn skip_line(&mut self) {
        match self {
            LineParser::Strace(p) => p.skip_line(),
            LineParser::Perf(p) => p.skip_line(),
        }
    }

    /// End of input: what is still pending becomes events.
    pub(crate) fn finish(&mut self, out: &mut Vec<Event>) {
        match self {
            LineParser::Strace(p) => p.finish(out),
            LineParser::Perf(p) => p.finish(out),
        }
    }

    /// The latest time the parser has seen.
    pub(crate) fn last_ts(&self) -> crate::event::Nanos {
        match self {
            LineParser::Strace(p) => p.last_ts,
            LineParser::Perf(p) => p.last_ts,
        }
    }

    /// Events perf's `LOST N events!` lines counted so far (0 for strace).
    pub(crate) fn lost(&self) -> u64 {
        match self {
            LineParser::Strace(_) => 0,
            LineParser::Perf(p) => p.lost,
        }
    }

    pub(crate) fn is_perf(&self) -> bool {
        matches!(self, LineParser::Perf(_))
    }

    /// The clock seen so far (complete once the input is drained).
    pub(crate) fn clock(&self) -> Clock {
        match self {
            LineParser::Strace(p) => Clock {
                fmt: p.clock.fmt,
                perf: false,
                frac_digits: p.clock.frac_digits,
                first: p.clock.first.unwrap_or(0),
                date: None,
                wall_at_first: None,
            },
            LineParser::Perf(p) => Clock {
                fmt: TimeFmt::Relative,
                perf: true,
                frac_digits: 3,
                first: p.first.unwrap_or(0),
                date: None,
                wall_at_first: None,
            },
        }
    }

    /// The tracer command line this output most likely came from.
    pub(crate) fn describe(&self, files: usize) -> String {
        match self {
            LineParser::Perf(_) => "perf trace".to_string(),
            LineParser::Strace(p) => p.shape.describe(&p.clock, files),
        }
    }
}
