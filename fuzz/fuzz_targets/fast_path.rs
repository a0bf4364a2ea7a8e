//! Fuzz target for the parser's shortcuts: on arbitrary lines, the one-pass fast path for
//! finished calls reads what the general parser reads wherever it accepts a line, and a
//! string argument kept as printed decodes to what decoding it at once gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stallscope::source::strace::{fast_path_agrees, lazy_data_agrees};

fuzz_target!(|data: &[u8]| {
    for line in data.split(|b| *b == b'\n') {
        assert!(fast_path_agrees(line), "{:?}", String::from_utf8_lossy(line));
        assert!(lazy_data_agrees(line), "{:?}", String::from_utf8_lossy(line));
    }
});
