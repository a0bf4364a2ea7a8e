//! One interface over the text parsers: a `FileSource` feeds each line to its `LineParser`
//! (strace or perf trace, chosen by format detection) and gets the same outcome back, used
//! or skipped with a reason, whichever tracer wrote the file.

use super::perf::PerfParser;
use super::strace::{StraceParser, TimeFmt};
use super::Clock;
use crate::event::Event;

/// Why a line was not used (the report's `skipped[].reason`).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
pub enum SkipReason {
    Empty,
    NoSyscall,
    BadReturn,
    ResumedWithoutName,
    TooLong,
    CutOff,
    BadTimestamp,
    /// A compressed input that ends early: the rest of the file (one line counted for it).
    CutShort,
    /// `perf trace`'s `LOST N events!`: its ring buffer dropped records there.
    Lost,
    /// A `perf trace` line that pairs an exit with an entry across lost events.
    AcrossLoss,
}

impl SkipReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            SkipReason::Empty => "empty line",
            SkipReason::NoSyscall => "not a syscall, signal, exit or strace message",
            SkipReason::BadReturn => "syscall line with an unreadable return value",
            SkipReason::ResumedWithoutName => "resumed line without a syscall name",
            SkipReason::TooLong => "line longer than the limit",
            SkipReason::CutOff => "cut-off line (no result, no <unfinished ...>)",
            SkipReason::BadTimestamp => "timestamp does not match the trace's format",
            SkipReason::CutShort => "compressed input ends early: the rest of the file is missing",
            SkipReason::Lost => "perf lost events here: what the threads did meanwhile is unknown",
            SkipReason::AcrossLoss => {
                "perf paired this exit with an entry across lost events: which call, and how long, is unknown"
            }
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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
