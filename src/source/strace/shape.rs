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
        s
    }
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
}
