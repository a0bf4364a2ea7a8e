//! Format detection: what the first lines of an input are (strace text, perf trace text, a
//! summary table with no per-call timings, or nothing known), read before any line is parsed.

use super::line::SkipReason;
use super::{perf, strace};

/// How much of an input format detection reads.
pub(super) const DETECT_BYTES: usize = 64 * 1024;

/// What the first lines of an input look like.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(super) enum Detected {
    Strace,
    Perf,
    StraceSummary,
    PerfSummary,
    Unknown,
    Empty,
}

pub(super) fn detect(head: &[u8], whole: bool) -> Detected {
    let mut strace_hits = 0;
    let mut perf_hits = 0;
    let mut lines = 0;
    // The last piece of a full read-ahead is a line cut by the read (`strace -s 65536`
    // writes lines longer than what is read here): its start is all there is to go by.
    let cut = if whole {
        None
    } else {
        memchr::memrchr(b'\n', head).map_or(Some(0), |i| Some(i + 1))
    };
    for line in head.split(|b| *b == b'\n').take(200) {
        let t = line
            .iter()
            .skip_while(|b| b.is_ascii_whitespace())
            .copied()
            .collect::<Vec<u8>>();
        if t.is_empty() {
            continue;
        }
        lines += 1;
        if t.starts_with(b"% time") && memchr::memmem::find(&t, b"syscall").is_some() {
            return Detected::StraceSummary;
        }
        if t.starts_with(b"Summary of events:") {
            return Detected::PerfSummary;
        }
        if perf::looks_like_perf(line) {
            perf_hits += 1;
            continue;
        }
        let is_cut = cut == Some(line.as_ptr() as usize - head.as_ptr() as usize);
        let (_, body) = strace::parse_prefix(line);
        match strace::parse_body(body) {
            Ok(_) => strace_hits += 1,
            Err(SkipReason::CutOff) if is_cut => strace_hits += 1,
            Err(_) => {}
        }
    }
    if lines == 0 {
        return Detected::Empty;
    }
    if perf_hits > strace_hits && perf_hits > 0 {
        Detected::Perf
    } else if strace_hits > 0 {
        Detected::Strace
    } else {
        Detected::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{InputFormat, Inputs};

    /// A first line longer than what detection reads (`strace -s 65536`) is still strace.
    #[test]
    fn a_first_line_longer_than_the_detector_reads_is_detected() {
        let mut line = b"1796078610.545264 write(8, \"".to_vec();
        line.extend(std::iter::repeat_n(b'x', 2 * DETECT_BYTES));
        line.extend_from_slice(b"\", 131072) = 131072 <0.000311>\n");
        assert_eq!(detect(&line[..DETECT_BYTES], false), Detected::Strace);
        // A whole input that is only a cut line is no trace.
        assert_eq!(detect(&line[..100], true), Detected::Unknown);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("long.strace");
        std::fs::write(&path, &line).unwrap();
        let mut inp = Inputs::open(
            &[path.to_string_lossy().into_owned()],
            InputFormat::Auto,
            false,
        )
        .unwrap();
        let e = inp.next_event().unwrap().unwrap();
        assert_eq!(e.syscall().unwrap().name, "write");
    }
}
