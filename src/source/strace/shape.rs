//! What the lines read so far say about how strace was run (`-f`, the clock, `-T`, `-y`,
//! `-yy`, `-Y`), for the report's `source.format`: the tracer command line this output most
//! likely came from.

use super::clock::ClockState;
use super::prefix::TimeFmt;

/// The options seen in the trace so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shape {
    /// A pid column (`-f`).
    pub pid_column: bool,
    /// Durations (`-T`).
    pub dur: bool,
    /// fd annotations (`-y`).
    pub annotation: bool,
    /// Socket annotations with both ends (`-yy`).
    pub yy: bool,
    /// Thread names beside the pid (`-Y`).
    pub comm: bool,
    /// Stack frames under the calls (`-k`): strace unwinds the stack at every call it
    /// prints, which makes each call far slower than without.
    pub stack: bool,
}

impl Shape {
    /// The strace command line, for `files` input files read with this clock.
    pub fn describe(&self, clock: &ClockState, files: usize) -> String {
        let mut s = String::from("strace");
        if files > 1 {
            s.push_str(" -ff");
        } else if self.pid_column {
            s.push_str(" -f");
        }
        s.push_str(match clock.fmt {
            TimeFmt::None => "",
            TimeFmt::TimeOfDay => " -t",
            TimeFmt::TimeOfDayFrac if clock.frac_digits > 6 => " -tt (ns)",
            TimeFmt::TimeOfDayFrac => " -tt",
            TimeFmt::Epoch if clock.frac_digits > 6 => " --timestamps=unix,ns",
            TimeFmt::Epoch if clock.frac_digits == 0 => " --timestamps=unix,s",
            TimeFmt::Epoch => " -ttt",
            TimeFmt::Relative => " -r",
        });
        if self.dur {
            s.push_str(" -T");
        }
        if self.yy {
            s.push_str(" -yy");
        } else if self.annotation {
            s.push_str(" -y");
        }
        if self.comm {
            s.push_str(" -Y");
        }
        if self.stack {
            s.push_str(" -k");
        }
        s
    }
}

/// A `-k` frame line: ` > /usr/lib/x86_64-linux-gnu/libc.so.6(epoll_wait+0x56) [0x108f36]`.
pub(super) fn is_stack_frame(raw: &[u8]) -> bool {
    let t = super::super::scan::skip_ws(raw);
    t.starts_with(b"> ") && super::super::scan::trim_end(t).ends_with(b"]")
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn describe_state_after_lines() {
        let mut p = StraceParser::default();
        let mut out = vec![];
        p.feed(b"11461 22:41:05.800513 read(8<TCP:[127.0.0.1:6394->127.0.0.1:50418]>, \"\", 1) = 0 <0.000028>", &mut out);
        assert!(p.shape.pid_column && p.shape.dur && p.shape.annotation && p.shape.yy);
        assert_eq!(p.clock.fmt, TimeFmt::TimeOfDayFrac);
    }

    /// `-k`: the frames under each call say how strace was run (and why every call of the
    /// trace is slow: strace unwound the stack at each).
    #[test]
    fn stack_frames_are_minus_k() {
        let mut p = StraceParser::default();
        let mut out = vec![];
        p.feed(
            b"2014  05:22:55.362688 getpid() = 2014 <0.000010>",
            &mut out,
        );
        assert!(!p.shape.stack);
        p.feed(
            b" > /usr/lib/x86_64-linux-gnu/libc.so.6(epoll_wait+0x56) [0x108f36]",
            &mut out,
        );
        assert!(p.shape.stack);
        assert!(p.shape.describe(&p.clock, 1).ends_with(" -T -k"));
    }
}
