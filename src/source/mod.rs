//! Sources: the front of the pipeline. They turn saved traces (strace text in all its
//! variants, perf trace text; plain, gzip or stdin; one file or `strace -ff` per-process
//! files merged by time) into a pull iterator of `Event`s, detect the format from the first
//! lines, count every line they could not use by reason, and fill in durations the trace did
//! not print (an upper bound up to the thread's next event). Live tracers live in `live` and
//! produce the same events.
//!
//! One job per module: `reader` (bytes to lines, gzip, read-ahead), `pump` (read-ahead done
//! by whichever pipeline thread is free), `detect` (which format), `line` (one interface
//! over the parsers), `strace` and `perf` (lines to events), `file` (one input), `inputs`
//! (several merged, missing durations bounded), `counters` (used and skipped lines), `clock`
//! (the trace's clock for the report).

mod clock;
mod counters;
mod detect;
mod file;
mod inputs;
mod line;
pub mod perf;
mod pump;
mod reader;
pub(crate) mod scan;
pub mod strace;

use crate::event::Tid;
pub use clock::Clock;
pub use counters::{no_events_error, redact, Counters, Skips};
pub use file::FileSource;
pub use inputs::{expand_inputs, Inputs};
pub use line::{LineOutcome, SkipReason};
pub use reader::{open_input_counted, ByteCounter, Line, LineReader};
use std::collections::HashMap;
pub use strace::TimeFmt;

/// A map keyed by thread id. Tids are small integers chosen by the kernel, not by an
/// attacker of this process, so a multiply hash is enough and much cheaper than SipHash on
/// the per-event path.
pub type TidMap<V> = HashMap<Tid, V, std::hash::BuildHasherDefault<TidHasher>>;

#[derive(Default, Clone, Copy)]
pub struct TidHasher(u64);

impl std::hash::Hasher for TidHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ *b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (v as u64 ^ 0x5bd1_e995).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Which text format to read (`--input-format` in the app).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputFormat {
    Auto,
    Strace,
    Perf,
}

/// What the source is, for the report's `source` block.
#[derive(Clone, Debug)]
pub struct SourceInfo {
    pub kind: crate::report::SourceKind,
    pub files: Vec<String>,
    pub format: String,
    pub pid: Option<Tid>,
    pub clock: Clock,
}
