//! What a source counts while it reads: lines read, used and skipped (by reason, with the
//! first few kept, their quoted strings masked so no key or value reaches the report), events
//! made; and the error for an input from which nothing could be used.

use super::{scan, InputFormat, SkipReason};
use anyhow::anyhow;
use std::collections::BTreeMap;

/// Lines that could not be used, by reason, with the first few kept for the report.
#[derive(Clone, Debug, Default)]
pub struct Skips {
    pub total: u64,
    pub by_reason: BTreeMap<SkipReason, u64>,
    pub first: Vec<(String, u64, SkipReason, String)>,
}

const KEEP_SKIPPED: usize = 10;

impl Skips {
    pub(super) fn add(&mut self, file: &str, line: u64, reason: SkipReason, text: &[u8]) {
        self.total += 1;
        *self.by_reason.entry(reason).or_default() += 1;
        if self.first.len() < KEEP_SKIPPED {
            let cut = &text[..text.len().min(120)];
            self.first
                .push((file.to_string(), line, reason, redact(cut)));
        }
    }
    pub(super) fn merge(&mut self, o: &Skips) {
        self.total += o.total;
        for (k, v) in &o.by_reason {
            *self.by_reason.entry(*k).or_default() += v;
        }
        for f in &o.first {
            if self.first.len() < KEEP_SKIPPED {
                self.first.push(f.clone());
            }
        }
    }
}

/// A skipped line as the report shows it: strace's quoted strings are buffers that hold user
/// keys and values, so their contents are replaced by `…` (the shape of the line stays).
pub fn redact(line: &[u8]) -> String {
    let mut out = Vec::with_capacity(line.len());
    let mut q = scan::Quoted::new(line);
    for (_, piece) in q.by_ref() {
        match piece {
            scan::Piece::Code(b) => out.push(b),
            scan::Piece::Open => out.push(b'"'),
            scan::Piece::Close => out.extend_from_slice("…\"".as_bytes()),
            scan::Piece::Text(..) | scan::Piece::Escape(..) => {}
        }
    }
    if q.in_string() {
        out.extend_from_slice("…".as_bytes());
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Counters a source keeps while it runs.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub lines: u64,
    /// Lines the parser read (with or without an event); `used + skips.total == lines`.
    pub used: u64,
    pub skips: Skips,
    /// Events the parsers produced.
    pub events: u64,
    /// Events the tracer said it lost (`perf trace`'s `LOST N events!`).
    pub lost_events: u64,
}

/// Builds an error for an input that parses to nothing usable.
pub fn no_events_error(label: &str, c: &Counters, format: InputFormat) -> anyhow::Error {
    let first = c
        .skips
        .first
        .first()
        .map(|(_, l, r, t)| format!(" (line {l}: {r}: {t:?})"))
        .unwrap_or_default();
    let forced = match format {
        InputFormat::Auto => None,
        InputFormat::Strace => Some("strace"),
        InputFormat::Perf => Some("perf"),
    };
    match forced {
        Some(f) => anyhow!(
            "{label}: read as --input-format {f}, none of its {} lines is a {f} trace event{first}: \
             give the format the file is in, or --input-format auto",
            c.lines
        ),
        None => anyhow!(
            "{label}: not a strace or perf trace: none of its {} lines is a syscall{first}",
            c.lines
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn strings_are_masked_shape_is_kept() {
        assert_eq!(
            redact(br#"write(7, "*3\r\n$3\r\nSET\r\n$6\r\nsecret"..., 40) garbage"#),
            r#"write(7, "…"..., 40) garbage"#
        );
        assert_eq!(redact(br#"read(8, "cut off key"#), r#"read(8, "…"#);
        assert_eq!(redact(b"no strings here"), "no strings here");
    }
}
