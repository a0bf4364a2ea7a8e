//! Fuzz target for the trace line parsers: arbitrary bytes, split into lines, are fed to
//! both the strace and the perf trace parser, which must never panic and must account for
//! every line (used or skipped).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stallscope::source::{perf::PerfParser, strace::LineOutcome, strace::StraceParser};

fuzz_target!(|data: &[u8]| {
    let mut sp = StraceParser::default();
    let mut pp = PerfParser::default();
    let mut out = Vec::new();
    let mut n = 0u64;
    for line in data.split(|b| *b == b'\n') {
        n += 1;
        let _ = matches!(sp.feed(line, &mut out), LineOutcome::Used);
        let _ = pp.feed(line, &mut out);
        out.clear();
    }
    sp.finish(&mut out);
    pp.finish(&mut out);
    assert_eq!(sp.line, n);
    assert_eq!(pp.line, n);
});
