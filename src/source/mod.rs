//! Sources: the front of the pipeline. They turn saved traces (strace text in all its
//! variants, perf trace text; plain, gzip or stdin; one file or `strace -ff` per-process
//! files merged by time) into a pull iterator of `Event`s, detect the format from the first
//! lines, count every line they could not use by reason, and fill in durations the trace did
//! not print (an upper bound up to the thread's next event). Live tracers live in `live` and
//! produce the same events.

mod line;
pub mod perf;
pub(crate) mod scan;
pub mod strace;

use crate::event::{DurSource, Event, EventKind, Nanos, Tid};
use crate::report::{ClockKind, SourceKind};
use anyhow::{anyhow, bail, Context, Result};
use line::LineParser;
pub use line::{LineOutcome, SkipReason};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Read;
use std::path::{Path, PathBuf};
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

/// `--input-format`
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum InputFormat {
    Auto,
    Strace,
    Perf,
}

/// The trace's clock, as far as the source knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Clock {
    pub fmt: TimeFmt,
    /// perf trace: milliseconds since perf started.
    pub perf: bool,
    pub frac_digits: u8,
    /// First timestamp on the trace's scale.
    pub first: Nanos,
    /// For time-of-day clocks: the date of the first line and the UTC offset (seconds), from
    /// `--date`, to turn times into absolute ones.
    pub date: Option<(chrono::NaiveDate, i32)>,
    /// For live sources: wall-clock ns since the epoch of `first`.
    pub wall_at_first: Option<Nanos>,
}

impl Clock {
    pub fn none() -> Self {
        Clock {
            fmt: TimeFmt::None,
            perf: false,
            frac_digits: 6,
            first: 0,
            date: None,
            wall_at_first: None,
        }
    }

    /// A timestamp as the trace would have printed it.
    pub fn format(&self, ts: Nanos) -> String {
        let digits = if self.frac_digits == 0 {
            6
        } else {
            self.frac_digits.min(9)
        } as usize;
        let frac = |ns: i64| -> String {
            let s = format!("{:09}", ns.rem_euclid(1_000_000_000));
            s[..digits].to_string()
        };
        if let Some(iso) = self.iso(ts) {
            if self.fmt == TimeFmt::None || self.perf || self.wall_at_first.is_some() {
                return iso;
            }
        }
        match self.fmt {
            TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac => {
                let d = ts.rem_euclid(86_400 * 1_000_000_000);
                let s = d / 1_000_000_000;
                format!(
                    "{:02}:{:02}:{:02}.{}",
                    s / 3600,
                    (s % 3600) / 60,
                    s % 60,
                    frac(d)
                )
            }
            TimeFmt::Epoch => format!("{}.{}", ts.div_euclid(1_000_000_000), frac(ts)),
            _ => {
                let r = ts - self.first;
                format!("+{}.{}s", r.div_euclid(1_000_000_000), frac(r))
            }
        }
    }

    /// Wall-clock time in ns since the epoch, where the source allows it.
    pub fn wall_ns(&self, ts: Nanos) -> Option<Nanos> {
        if let Some(w) = self.wall_at_first {
            return Some(w + (ts - self.first));
        }
        if self.perf {
            return None;
        }
        match self.fmt {
            TimeFmt::Epoch => Some(ts),
            TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac => {
                let (date, off) = self.date?;
                let midnight = date.and_hms_opt(0, 0, 0)?.and_utc().timestamp();
                Some((midnight - off as i64) * 1_000_000_000 + ts)
            }
            _ => None,
        }
    }

    /// ISO 8601 with date and UTC offset, where the source allows it.
    pub fn iso(&self, ts: Nanos) -> Option<String> {
        let w = self.wall_ns(ts)?;
        let off = self.date.map(|d| d.1).unwrap_or(0);
        let tz = chrono::FixedOffset::east_opt(off)?;
        let t = chrono::DateTime::from_timestamp(
            w.div_euclid(1_000_000_000),
            w.rem_euclid(1_000_000_000) as u32,
        )?;
        Some(
            t.with_timezone(&tz)
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, false),
        )
    }

    /// What these timestamps can say (the report's `source.clock`).
    pub fn describe(&self) -> ClockKind {
        if self.wall_at_first.is_some() {
            return ClockKind::Absolute;
        }
        if self.perf {
            return ClockKind::Relative;
        }
        match self.fmt {
            TimeFmt::Epoch => ClockKind::Absolute,
            TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac if self.date.is_some() => {
                ClockKind::Absolute
            }
            TimeFmt::TimeOfDay | TimeFmt::TimeOfDayFrac => ClockKind::TimeOfDay,
            TimeFmt::Relative => ClockKind::Relative,
            TimeFmt::None => ClockKind::None,
        }
    }
}

/// What the source is, for the report's `source` block.
#[derive(Clone, Debug)]
pub struct SourceInfo {
    pub kind: SourceKind,
    pub files: Vec<String>,
    pub format: String,
    pub pid: Option<Tid>,
    pub clock: Clock,
}

/// Lines that could not be used, by reason, with the first few kept for the report.
#[derive(Clone, Debug, Default)]
pub struct Skips {
    pub total: u64,
    pub by_reason: BTreeMap<&'static str, u64>,
    pub first: Vec<(String, u64, &'static str, String)>,
}

const KEEP_SKIPPED: usize = 10;

impl Skips {
    fn add(&mut self, file: &str, line: u64, reason: &'static str, text: &[u8]) {
        self.total += 1;
        *self.by_reason.entry(reason).or_default() += 1;
        if self.first.len() < KEEP_SKIPPED {
            let cut = &text[..text.len().min(120)];
            self.first
                .push((file.to_string(), line, reason, redact(cut)));
        }
    }
    fn merge(&mut self, o: &Skips) {
        self.total += o.total;
        for (k, v) in &o.by_reason {
            *self.by_reason.entry(k).or_default() += v;
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
}

/// The skip reason for the end of a cut-short compressed input.
const CUT_SHORT: &str = "compressed input ends early: the rest of the file is missing";

/// Longest line kept whole; longer ones (a -s 1M write) are skipped, never buffered whole,
/// so memory stays bounded whatever the input.
const MAX_LINE: usize = 1 << 20;
const CHUNK: usize = 1 << 18;

/// A byte-line reader over any `Read`: lines are slices into one reusable buffer, so the
/// hot loop copies nothing and allocates nothing.
pub struct LineReader {
    inner: Box<dyn Read + Send>,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    /// Currently discarding the rest of an over-long line.
    skipping_long: bool,
    /// Set by `read_ahead`: chunks come from a reader thread instead of `inner`.
    ahead: Option<ReadAhead>,
    /// The input ended early (a truncated gzip stream).
    cut_short: bool,
}

/// Free room at the front of each read-ahead chunk, where the unfinished end of the previous
/// chunk is copied so that a line never has to be stitched from two buffers.
const PAD: usize = 4096;
/// Filled chunks waiting for the parser.
const AHEAD_DEPTH: usize = 2;

/// The reading end of a reader thread: filled chunks (`PAD` bytes of room, then the data
/// and its length), and a way to give spent chunks back for reuse.
struct ReadAhead {
    chunks: std::sync::mpsc::Receiver<std::io::Result<(Vec<u8>, usize)>>,
    spare: std::sync::mpsc::Sender<Vec<u8>>,
}

pub enum Line<'a> {
    Text(&'a [u8]),
    TooLong(&'a [u8]),
}

impl LineReader {
    pub fn new(inner: Box<dyn Read + Send>) -> Self {
        LineReader {
            inner,
            buf: vec![0; CHUNK],
            start: 0,
            end: 0,
            eof: false,
            skipping_long: false,
            ahead: None,
            cut_short: false,
        }
    }

    /// Moves the reading (the kernel's copy out of the page cache, or gunzip) to a thread of
    /// its own, so that it overlaps with parsing: for one big input the parser's thread is
    /// the slowest stage of the pipeline. Lines are unchanged; memory grows by a few chunks
    /// (about 1 MB).
    pub fn read_ahead(&mut self) {
        if self.ahead.is_some() || self.eof {
            return;
        }
        let mut inner: Box<dyn Read + Send> =
            std::mem::replace(&mut self.inner, Box::new(std::io::empty()));
        let (tx, chunks) = std::sync::mpsc::sync_channel(AHEAD_DEPTH);
        let (spare, spares) = std::sync::mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || loop {
            let mut c = spares.try_recv().unwrap_or_else(|_| vec![0; PAD + CHUNK]);
            let n = loop {
                match inner.read(&mut c[PAD..]) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => break r,
                }
            };
            let last = !matches!(n, Ok(n) if n > 0);
            // The receiver is gone when the reader was dropped early: stop quietly.
            if tx.send(n.map(|n| (c, n))).is_err() || last {
                return;
            }
        });
        self.ahead = Some(ReadAhead { chunks, spare });
    }

    /// `fill` from the reader thread: the next chunk becomes the buffer, with the unread
    /// rest of the current one copied into its front room.
    fn fill_ahead(&mut self) -> std::io::Result<bool> {
        let Some(a) = &self.ahead else {
            return Ok(false);
        };
        let rest = self.end - self.start;
        if rest >= MAX_LINE {
            return Ok(false);
        }
        let (mut c, n) = match a.chunks.recv() {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.cut_short = true;
                (Vec::new(), 0)
            }
            Ok(r) => r?,
            // The thread ended after its last chunk.
            Err(_) => (Vec::new(), 0),
        };
        if n == 0 {
            self.eof = true;
            return Ok(true);
        }
        if rest <= PAD {
            c[PAD - rest..PAD].copy_from_slice(&self.buf[self.start..self.end]);
            let old = std::mem::replace(&mut self.buf, c);
            self.start = PAD - rest;
            self.end = PAD + n;
            if old.len() == PAD + CHUNK {
                let _ = a.spare.send(old);
            }
        } else {
            // A line longer than the room: grow this buffer instead (rare, bounded by
            // MAX_LINE plus a chunk).
            self.buf.copy_within(self.start..self.end, 0);
            self.buf.truncate(rest);
            self.buf.extend_from_slice(&c[PAD..PAD + n]);
            self.start = 0;
            self.end = self.buf.len();
            let _ = a.spare.send(c);
        }
        Ok(true)
    }

    fn fill(&mut self) -> std::io::Result<bool> {
        if self.ahead.is_some() {
            return self.fill_ahead();
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            if self.buf.len() >= MAX_LINE {
                return Ok(false);
            }
            self.buf.resize((self.buf.len() * 2).min(MAX_LINE), 0);
        }
        loop {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(true);
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    // A gzip stream that stops mid-member: the file was copied while it
                    // was being written. What came before is good; say where it ended.
                    self.cut_short = true;
                    self.eof = true;
                    return Ok(true);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The first bytes of the input, without consuming them (for format detection).
    pub fn peek(&mut self, want: usize) -> std::io::Result<&[u8]> {
        while self.end - self.start < want && !self.eof {
            if !self.fill()? {
                break;
            }
        }
        Ok(&self.buf[self.start..self.end])
    }

    pub fn next_line(&mut self) -> std::io::Result<Option<Line<'_>>> {
        loop {
            let avail = &self.buf[self.start..self.end];
            if let Some(nl) = memchr::memchr(b'\n', avail) {
                let s = self.start;
                self.start += nl + 1;
                if self.skipping_long {
                    self.skipping_long = false;
                    continue;
                }
                if nl >= MAX_LINE {
                    // Only a read-ahead buffer can hold one whole: the same verdict as when
                    // the buffer fills first.
                    return Ok(Some(Line::TooLong(&self.buf[s..s + 120])));
                }
                return Ok(Some(Line::Text(&self.buf[s..s + nl])));
            }
            if self.eof {
                if self.start == self.end {
                    return Ok(None);
                }
                let s = self.start;
                self.start = self.end;
                if self.skipping_long {
                    self.skipping_long = false;
                    return Ok(None);
                }
                return Ok(Some(Line::Text(&self.buf[s..self.end])));
            }
            if !self.fill()? {
                // Buffer full without a newline: report the line once, drop the rest of it.
                let keep = 120.min(self.end);
                let head_end = self.start + keep;
                self.skipping_long = true;
                let s = self.start;
                self.start = self.end;
                // The head is still in the buffer until the next fill.
                return Ok(Some(Line::TooLong(&self.buf[s..head_end])));
            }
        }
    }
}

/// Opens a file (or `-` for stdin), transparently gunzipping, counting the raw bytes read
/// from the file (under any gzip decoder) into `counter`, for a progress bar.
pub fn open_input_counted(path: &str, counter: Option<ByteCounter>) -> Result<LineReader> {
    let raw: Box<dyn Read + Send> = if path == "-" {
        Box::new(std::io::stdin())
    } else {
        let f = std::fs::File::open(path).with_context(|| format!("cannot open {path}"))?;
        match counter {
            Some(c) => Box::new(crate::progress::CountingRead::new(f, c)),
            None => Box::new(f),
        }
    };
    let mut r = LineReader::new(raw);
    let head = r.peek(2).with_context(|| format!("cannot read {path}"))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        // Hand the already-read bytes back to the decoder.
        let pre = head.to_vec();
        let rest = std::mem::replace(&mut r.inner, Box::new(std::io::empty()));
        let chained = std::io::Cursor::new(pre).chain(rest);
        return Ok(LineReader::new(Box::new(
            flate2::read::MultiGzDecoder::new(chained),
        )));
    }
    Ok(r)
}

/// Bytes read so far from the input files (shared with the progress bar).
pub type ByteCounter = std::sync::Arc<std::sync::atomic::AtomicU64>;

/// One input file read as a stream of events.
pub struct FileSource {
    pub label: String,
    reader: LineReader,
    parser: LineParser,
    queue: VecDeque<Event>,
    scratch: Vec<Event>,
    pub counters: Counters,
    strict: bool,
    done: bool,
    /// Detected shape, in strace's own words.
    pub format: String,
}

/// How much of an input format detection reads.
const DETECT_BYTES: usize = 64 * 1024;

/// What the first lines of an input look like.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Detected {
    Strace,
    Perf,
    StraceSummary,
    PerfSummary,
    Unknown,
    Empty,
}

fn detect(head: &[u8], whole: bool) -> Detected {
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

impl FileSource {
    /// Opens and identifies one input. `default_pid` is the pid for lines without one
    /// (from a `-ff` file name); bytes read are counted into `counter`.
    pub fn open_counted(
        path: &str,
        format: InputFormat,
        default_pid: Option<Tid>,
        strict: bool,
        counter: Option<ByteCounter>,
    ) -> Result<Self> {
        let mut reader = open_input_counted(path, counter)?;
        let label = if path == "-" {
            "<stdin>".to_string()
        } else {
            path.to_string()
        };
        let head = reader
            .peek(DETECT_BYTES)
            .with_context(|| format!("cannot read {label}"))?
            .to_vec();
        let detected = detect(&head, head.len() < DETECT_BYTES);
        let first_line = head
            .split(|b| *b == b'\n')
            .find(|l| !l.iter().all(|b| b.is_ascii_whitespace()));
        let first_line = first_line
            .map(|l| String::from_utf8_lossy(&l[..l.len().min(80)]).into_owned())
            .unwrap_or_default();
        match detected {
            Detected::Empty => bail!("{label}: empty input: no trace lines to read"),
            Detected::StraceSummary => bail!(
                "{label}: this is a `strace -c` summary, which has no per-call timings: rerun strace with -T \
                 (e.g. `strace -f -tt -T -y -p PID -o trace.txt`)"
            ),
            Detected::PerfSummary => bail!(
                "{label}: this is a `perf trace -s` summary, which has no per-call timings: rerun `perf trace -p PID` without -s"
            ),
            _ => {}
        }
        let use_perf = match format {
            InputFormat::Perf => true,
            InputFormat::Strace => false,
            InputFormat::Auto => match detected {
                Detected::Perf => true,
                Detected::Strace => false,
                _ => bail!(
                    "{label}: not a strace or perf trace output (first line: {first_line:?}); \
                     if it is one, name it with --input-format strace|perf"
                ),
            },
        };
        let parser = if use_perf {
            LineParser::Perf(perf::PerfParser::default())
        } else {
            LineParser::Strace(strace::StraceParser::new(default_pid.unwrap_or(0)))
        };
        Ok(FileSource {
            label,
            reader,
            parser,
            queue: VecDeque::new(),
            scratch: Vec::with_capacity(8),
            counters: Counters::default(),
            strict,
            done: false,
            format: String::new(),
        })
    }

    pub fn is_perf(&self) -> bool {
        self.parser.is_perf()
    }

    /// Reads lines until at least one event is queued or input ends.
    fn pump(&mut self) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let r = self.pump_into(&mut scratch, 1);
        self.scratch = scratch;
        r
    }

    /// Parses lines straight into `out` until it holds `want` events or input ends: the
    /// batch path, where each event is built once in its final place.
    fn pump_into(&mut self, out: &mut Vec<Event>, want: usize) -> Result<()> {
        let before = out.len();
        let r = self.pump_lines(out, want);
        self.counters.events += out[before..]
            .iter()
            .filter(|e| !matches!(e.kind, EventKind::Unreadable))
            .count() as u64;
        r
    }

    fn pump_lines(&mut self, out: &mut Vec<Event>, want: usize) -> Result<()> {
        while out.len() < want && !self.done {
            let line = match self
                .reader
                .next_line()
                .with_context(|| format!("cannot read {}", self.label))?
            {
                Some(l) => l,
                None => {
                    self.parser.finish(out);
                    self.done = true;
                    if self.reader.cut_short {
                        // The report of what was read, and where it ended.
                        let at = self.counters.lines;
                        eprintln!(
                            "stallscope: warning: {}: compressed stream ends early (copied while it was being written?): read up to line {at}, the report covers only that",
                            self.label
                        );
                        // Counted as one more line (the missing rest), so that every line
                        // is still either used or skipped.
                        self.counters.lines += 1;
                        self.counters.skips.add(&self.label, at + 1, CUT_SHORT, b"");
                    }
                    break;
                }
            };
            self.counters.lines += 1;
            let line_no = self.counters.lines;
            let (skip, text): (Option<&'static str>, &[u8]) = match line {
                Line::TooLong(head) => {
                    // Keep the parser's line numbering in step.
                    self.parser.skip_line();
                    (Some(SkipReason::TooLong.as_str()), head)
                }
                Line::Text(t) => (self.parser.feed(t, out).skipped().map(|r| r.as_str()), t),
            };
            if let Some(reason) = skip {
                if reason != SkipReason::Empty.as_str() {
                    out.push(Event {
                        tid: 0,
                        ts: self.parser.last_ts(),
                        line: line_no,
                        kind: EventKind::Unreadable,
                    });
                }
                if self.strict {
                    bail!(
                        "{}:{}: {} (--strict): {}",
                        self.label,
                        line_no,
                        reason,
                        String::from_utf8_lossy(&text[..text.len().min(120)])
                    );
                }
                self.counters.skips.add(&self.label, line_no, reason, text);
            } else {
                self.counters.used += 1;
            }
        }
        Ok(())
    }

    pub fn next_event(&mut self) -> Result<Option<Event>> {
        if let Some(e) = self.queue.pop_front() {
            return Ok(Some(e));
        }
        self.pump()?;
        // Most lines make one event: hand it over without a trip through the queue.
        if self.scratch.len() <= 1 {
            return Ok(self.scratch.pop());
        }
        self.queue.extend(self.scratch.drain(..));
        Ok(self.queue.pop_front())
    }

    /// The clock and shape seen so far (complete once the input is drained).
    pub fn clock(&self) -> Clock {
        self.parser.clock()
    }

    /// The tracer command line this output most likely came from.
    pub fn describe(&self, files: usize) -> String {
        self.parser.describe(files)
    }
}

/// A finished call whose duration the trace did not print: it waits for the thread's next
/// event, which bounds it.
fn needs_hold(e: &Event) -> bool {
    matches!(&e.kind, EventKind::Syscall(sc) if sc.dur.is_none() && sc.in_flight.is_none())
}

/// Several `strace -ff` files (or any several inputs) merged by time into one stream.
pub struct Inputs {
    files: Vec<FileSource>,
    heads: Vec<Option<Event>>,
    started: bool,
    /// Per-thread hold-back for calls without a printed duration (see `next`).
    held: TidMap<Event>,
    ready: VecDeque<Event>,
    finished: bool,
}

/// Expands the command line's inputs: a prefix whose `PREFIX.PID` files exist stands for
/// them all; each such file gets its pid from its name.
pub fn expand_inputs(args: &[String]) -> Result<Vec<(String, Option<Tid>)>> {
    let mut out = vec![];
    for a in args {
        if a == "-" || Path::new(a).is_file() {
            out.push((a.clone(), pid_suffix(a)));
            continue;
        }
        let p = PathBuf::from(a);
        let dir = p
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let base = p
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut found = vec![];
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(rest) = name.strip_prefix(&format!("{base}.")) {
                    if let Ok(pid) = rest.parse::<Tid>() {
                        found.push((dir.join(&name).to_string_lossy().into_owned(), Some(pid)));
                    }
                }
            }
        }
        if found.is_empty() {
            // Neither a file nor an -ff prefix: let opening it report why.
            out.push((a.clone(), None));
            continue;
        }
        found.sort();
        out.extend(found);
    }
    if out.is_empty() {
        bail!("no input: give a trace file, `-` for stdin, or an `strace -ff` prefix");
    }
    Ok(out)
}

fn pid_suffix(path: &str) -> Option<Tid> {
    let ext = Path::new(path).extension()?.to_str()?;
    ext.parse().ok()
}

impl Inputs {
    pub fn open(args: &[String], format: InputFormat, strict: bool) -> Result<Self> {
        Self::open_counted(args, format, strict, None)
    }

    /// `open`, counting bytes read from the files into `counter` (see `ByteCounter`).
    pub fn open_counted(
        args: &[String],
        format: InputFormat,
        strict: bool,
        counter: Option<ByteCounter>,
    ) -> Result<Self> {
        let expanded = expand_inputs(args)?;
        let many = expanded.len() > 1;
        let mut files = vec![];
        for (path, pid) in expanded {
            // A pid suffix only names the process for -ff sets; a lone `trace.1234` file
            // may well have a pid column of its own, which wins anyway.
            files.push(FileSource::open_counted(
                &path,
                format,
                if many || pid.is_some() { pid } else { None },
                strict,
                counter.clone(),
            )?);
        }
        let n = files.len();
        if let [one] = &mut files[..] {
            one.reader.read_ahead();
        }
        Ok(Inputs {
            files,
            heads: vec![None; n],
            started: false,
            held: TidMap::default(),
            ready: VecDeque::new(),
            finished: false,
        })
    }

    /// Next event in merged time order (across files), with durations the trace did not
    /// print reconstructed as an upper bound: up to the next event of the same thread.
    pub fn next_event(&mut self) -> Result<Option<Event>> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(Some(e));
            }
            if self.finished {
                return Ok(None);
            }
            let ev = match self.next_merged()? {
                Some(e) => e,
                None => {
                    let mut rest: Vec<Event> = self.held.drain().map(|(_, e)| e).collect();
                    rest.sort_by_key(|e| (e.ts, e.line));
                    self.ready.extend(rest);
                    self.finished = true;
                    continue;
                }
            };
            // Most events need no hold-back: hand them over without the queue.
            if self.held.is_empty() && self.ready.is_empty() && !needs_hold(&ev) {
                return Ok(Some(ev));
            }
            self.route(ev);
        }
    }

    /// Appends up to `max` events to `out` (fewer only at the end of input); false once
    /// the input is exhausted. The same events, in the same order, as `next_event`, but a
    /// single input with printed durations is parsed straight into `out`.
    pub fn next_batch(&mut self, out: &mut Vec<Event>, max: usize) -> Result<bool> {
        let fast = self.files.len() == 1
            && self.held.is_empty()
            && self.ready.is_empty()
            && !self.finished;
        if fast && self.files[0].queue.is_empty() && self.files[0].scratch.is_empty() {
            let start = out.len();
            self.files[0].pump_into(out, start + max)?;
            if let Some(first) = out[start..].iter().position(needs_hold) {
                // A call without a printed duration: from here on, the per-thread hold-back
                // of `next_event` decides the order.
                let tail: Vec<Event> = out.drain(start + first..).collect();
                for ev in tail {
                    self.route(ev);
                }
                while let Some(e) = self.ready.pop_front() {
                    out.push(e);
                }
            }
            if self.files[0].done
                && self.files[0].queue.is_empty()
                && self.files[0].scratch.is_empty()
            {
                // Flush what is held (nothing, unless durations were missing).
                while let Some(e) = self.next_event()? {
                    out.push(e);
                }
                return Ok(false);
            }
            return Ok(true);
        }
        let target = out.len() + max;
        while out.len() < target {
            match self.next_event()? {
                Some(e) => out.push(e),
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The hold-back step of `next_event` for one event taken from the parser.
    fn route(&mut self, ev: Event) {
        if matches!(ev.kind, EventKind::Unreadable) {
            // What the unreadable line held is unknown: no call held for its bound may
            // take it across. Their durations stay unknown.
            let mut rest: Vec<Event> = self.held.drain().map(|(_, e)| e).collect();
            rest.sort_by_key(|e| (e.ts, e.line));
            self.ready.extend(rest);
            self.ready.push_back(ev);
            return;
        }
        if let Some(mut prev) = self.held.remove(&ev.tid) {
            if let EventKind::Syscall(sc) = &mut prev.kind {
                sc.dur = Some((ev.ts - prev.ts).max(0));
                sc.dur_src = DurSource::UpperBound;
            }
            self.ready.push_back(prev);
        }
        if needs_hold(&ev) {
            self.held.insert(ev.tid, ev);
        } else {
            self.ready.push_back(ev);
        }
    }

    fn next_merged(&mut self) -> Result<Option<Event>> {
        if self.files.len() == 1 {
            return self.files[0].next_event();
        }
        if !self.started {
            for i in 0..self.files.len() {
                self.heads[i] = self.files[i].next_event()?;
            }
            self.started = true;
        }
        // Few files (one per thread): a scan beats a heap.
        let mut best: Option<usize> = None;
        for (i, h) in self.heads.iter().enumerate() {
            if let Some(e) = h {
                if best.is_none_or(|b| self.heads[b].as_ref().is_some_and(|be| e.end() < be.end()))
                {
                    best = Some(i);
                }
            }
        }
        match best {
            None => Ok(None),
            Some(i) => {
                let e = self.heads[i].take();
                self.heads[i] = self.files[i].next_event()?;
                Ok(e)
            }
        }
    }

    /// Everything the report's `source` block needs; call after draining.
    pub fn info(&self) -> SourceInfo {
        let f = &self.files[0];
        let mut clock = f.clock();
        clock.first = self
            .files
            .iter()
            .map(|f| f.clock().first)
            .filter(|v| *v != 0)
            .min()
            .unwrap_or(clock.first);
        SourceInfo {
            kind: if f.is_perf() {
                SourceKind::Perf
            } else {
                SourceKind::Strace
            },
            files: self
                .files
                .iter()
                .filter(|f| f.label != "<stdin>")
                .map(|f| f.label.clone())
                .collect(),
            format: f.describe(self.files.len()),
            pid: None,
            clock,
        }
    }

    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for f in &self.files {
            c.lines += f.counters.lines;
            c.used += f.counters.used;
            c.events += f.counters.events;
            c.skips.merge(&f.counters.skips);
        }
        c
    }
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
mod redact_tests {
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

#[cfg(test)]
mod line_reader_tests {
    use super::*;

    /// A reader that hands out its bytes in uneven pieces, as pipes and decoders do.
    struct Pieces {
        data: Vec<u8>,
        at: usize,
        n: usize,
    }

    impl Read for Pieces {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            self.n = (self.n * 7 + 3) % 70_000 + 1;
            let k = self.n.min(out.len()).min(self.data.len() - self.at);
            out[..k].copy_from_slice(&self.data[self.at..self.at + k]);
            self.at += k;
            Ok(k)
        }
    }

    fn lines(data: &[u8], ahead: bool) -> Vec<(bool, Vec<u8>)> {
        let mut r = LineReader::new(Box::new(Pieces {
            data: data.to_vec(),
            at: 0,
            n: 1,
        }));
        r.peek(100).unwrap();
        if ahead {
            r.read_ahead();
        }
        let mut out = vec![];
        while let Some(l) = r.next_line().unwrap() {
            out.push(match l {
                Line::Text(t) => (true, t.to_vec()),
                Line::TooLong(h) => (false, h.to_vec()),
            });
        }
        out
    }

    /// The read-ahead reader yields exactly the lines of the plain one: across chunk ends,
    /// lines longer than its front room, over-long lines and a last line with no newline.
    #[test]
    fn read_ahead_yields_the_same_lines() {
        let mut data = vec![];
        let lens = [
            0,
            1,
            80,
            PAD - 1,
            PAD,
            PAD + 1,
            CHUNK - 1,
            CHUNK + 7,
            MAX_LINE - 1,
            MAX_LINE,
            MAX_LINE + 5,
            3 * CHUNK,
        ];
        for (i, len) in lens.iter().cycle().take(40).enumerate() {
            data.extend((0..*len).map(|j| b'a' + ((i + j) % 26) as u8));
            data.push(b'\n');
        }
        data.extend_from_slice(b"last line without a newline");
        let plain = lines(&data, false);
        let ahead = lines(&data, true);
        assert_eq!(plain.len(), 41);
        assert!(
            plain.iter().any(|(text, _)| !text),
            "some lines are too long"
        );
        assert!(plain == ahead, "the read-ahead reader changed the lines");
        assert_eq!(lines(b"", true), vec![]);
    }
}

#[cfg(test)]
mod input_tests {
    use super::*;
    use std::io::Write;

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

    /// A gzip file cut short (copied while it was being written): what was read is kept,
    /// and the missing rest is a skipped line that names the file and where it ended.
    #[test]
    fn a_truncated_gzip_gives_what_was_read() {
        let mut text = Vec::new();
        for i in 0..20_000 {
            writeln!(
                text,
                "1796078610.{:06} getpid() = 7 <0.000002>",
                i % 1_000_000
            )
            .unwrap();
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&text).unwrap();
        let gz = gz.finish().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.strace.gz");
        std::fs::write(&path, &gz[..gz.len() / 2]).unwrap();
        let name = path.to_string_lossy().into_owned();
        let mut inp = Inputs::open(std::slice::from_ref(&name), InputFormat::Auto, false).unwrap();
        let mut n = 0;
        while inp.next_event().unwrap().is_some() {
            n += 1;
        }
        let c = inp.counters();
        assert!(n > 1000 && n < 20_000, "{n} events");
        assert_eq!(c.used + c.skips.total, c.lines);
        let (file, line, reason, _) = c.skips.first.last().unwrap();
        assert_eq!((file, *line, *reason), (&name, c.lines, CUT_SHORT));
    }

    /// A forced --input-format that reads no event from the file says so.
    #[test]
    fn a_forced_format_that_reads_nothing_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.strace");
        std::fs::write(
            &path,
            "1796078610.545264 fdatasync(7) = 0 <0.000311>\n 1796078610.6 ( x\n",
        )
        .unwrap();
        let name = path.to_string_lossy().into_owned();
        let mut inp = Inputs::open(std::slice::from_ref(&name), InputFormat::Perf, false).unwrap();
        while inp.next_event().unwrap().is_some() {}
        let c = inp.counters();
        assert_eq!((c.lines, c.events), (2, 0));
        let e = no_events_error(&name, &c, InputFormat::Perf).to_string();
        assert!(e.contains("--input-format perf"), "{e}");
    }
}

#[cfg(test)]
mod unreadable_tests {
    use super::*;

    fn events(text: &str) -> Vec<Event> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.strace");
        std::fs::write(&path, text).unwrap();
        let mut inp = Inputs::open(
            &[path.to_string_lossy().into_owned()],
            InputFormat::Auto,
            false,
        )
        .unwrap();
        let mut out = vec![];
        while let Some(e) = inp.next_event().unwrap() {
            out.push(e);
        }
        out
    }

    /// `close(3) = 0`, then a pasted `...`, then a line 5 s later: not a 5 s close(). The
    /// unreadable line is an event of its own, where the timeline breaks.
    #[test]
    fn no_upper_bound_spans_an_unreadable_line() {
        let got = events(
            "1796078610.000000 close(3) = 0\n...\n1796078615.000000 getpid() = 7\n1796078615.100000 getpid() = 7\n",
        );
        let kinds: Vec<String> = got
            .iter()
            .map(|e| match &e.kind {
                EventKind::Syscall(sc) => format!("{} {:?} {:?}", sc.name, sc.dur, sc.dur_src),
                k => format!("{k:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "close None Unknown",
                "Unreadable",
                "getpid Some(100000000) UpperBound",
                "getpid None Unknown",
            ]
        );
        assert_eq!(got[1].line, 2);
        // Without the pasted line the bound is what it was.
        let got = events("1796078610.000000 close(3) = 0\n1796078615.000000 getpid() = 7\n");
        assert_eq!(got[0].syscall().unwrap().dur, Some(5_000_000_000));
    }

    /// The parsers' own reconstructions stop at an unreadable line too: an unfinished call
    /// whose resumed half may have been that line has no known duration.
    #[test]
    fn no_paired_duration_spans_an_unreadable_line() {
        let got = events(
            "1796078610.000000 close(3 <unfinished ...>\n1796078610.5 <... close resu\n1796078615.000000 close(4) = 0 <0.000010>\n",
        );
        let c = got
            .iter()
            .find(|e| e.syscall().is_some_and(|s| s.fd == Some(3)))
            .unwrap()
            .syscall()
            .unwrap();
        assert_eq!(
            (c.dur, c.in_flight),
            (None, Some(crate::event::InFlight::AtEnd))
        );
        let mut p = perf::PerfParser::default();
        let mut out = vec![];
        for l in [
            "   10.000 (         ): redis-server/7 fdatasync(fd: 7) ...",
            "   10.5 garbage",
            "   12.500 ( 0.002 ms): redis-server/7 getpid() = 7",
        ] {
            p.feed(l.as_bytes(), &mut out);
        }
        let f = out[0].syscall().unwrap();
        assert_eq!((f.name, f.dur, f.in_flight), ("fdatasync", None, None));
    }
}
