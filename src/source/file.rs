//! One input file as a stream of events: opens it, detects its format, and feeds each line
//! to the matching parser, counting every line as used or skipped (a skipped line also
//! becomes an `Unreadable` event, where the timeline breaks).

use super::counters::Counters;
use super::detect::{detect, Detected, DETECT_BYTES};
use super::line::{LineParser, SkipReason};
use super::reader::{open_input_counted, ByteCounter, Line, LineReader};
use super::{perf, strace, Clock, InputFormat};
use crate::event::{Event, EventKind, Tid};
use anyhow::{bail, Context, Result};
use std::collections::VecDeque;

/// One input file read as a stream of events.
pub struct FileSource {
    pub label: String,
    pub(super) reader: LineReader,
    parser: LineParser,
    pub(super) queue: VecDeque<Event>,
    pub(super) scratch: Vec<Event>,
    /// Events parsed ahead for the merge of several files (`Inputs::merge_batch`).
    pub(super) staged: Staged,
    pub counters: Counters,
    strict: bool,
    pub(super) done: bool,
    /// Detected shape, in strace's own words.
    pub format: String,
    /// `Unreadable` marks pushed so far (no events of the trace: not in `counters.events`).
    unreadable: u64,
}

impl FileSource {
    /// Opens and identifies one input. `default_pid` is the pid for lines without one
    /// (from a `-ff` file name); bytes read are counted into `counter`; `buffer` is the
    /// reading buffer's size (see `LineReader::with_chunk`).
    pub fn open_counted(
        path: &str,
        format: InputFormat,
        default_pid: Option<Tid>,
        strict: bool,
        counter: Option<ByteCounter>,
        buffer: usize,
    ) -> Result<Self> {
        let mut reader = open_input_counted(path, counter, buffer)?;
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
        // A file of a set of hundreds keeps a small buffer, not the detection's read.
        reader.release_peek();
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
            staged: Staged::default(),
            counters: Counters::default(),
            strict,
            done: false,
            format: String::new(),
            unreadable: 0,
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
    pub(super) fn pump_into(&mut self, out: &mut Vec<Event>, want: usize) -> Result<()> {
        let before = (out.len(), self.unreadable, self.parser.named());
        let r = self.pump_lines(out, want);
        // Counted as they are pushed: a second pass over the batch cost more than the count.
        // Unreadable lines and perf's comms are no events of the trace.
        self.counters.events += (out.len() - before.0) as u64
            - (self.unreadable - before.1)
            - (self.parser.named() - before.2);
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
                    if let Some(late) = self.parser.take_late() {
                        self.late_skip(late)?;
                    }
                    self.counters.lost_events = self.parser.lost();
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
                        self.counters
                            .skips
                            .add(&self.label, at + 1, SkipReason::CutShort, b"");
                    }
                    break;
                }
            };
            self.counters.lines += 1;
            let line_no = self.counters.lines;
            let (skip, text): (Option<SkipReason>, &[u8]) = match line {
                Line::TooLong(head) => {
                    // Keep the parser's line numbering in step.
                    self.parser.skip_line();
                    (Some(SkipReason::TooLong), head)
                }
                Line::Text(t) => (self.parser.feed(t, out).skipped(), t),
            };
            if let Some(reason) = skip {
                if reason != SkipReason::Empty {
                    self.unreadable += 1;
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
            if let Some(late) = self.parser.take_late() {
                self.late_skip(late)?;
            }
        }
        Ok(())
    }

    /// A line counted as used that the parser found skipped later (its `Unreadable` event
    /// already pushed, where the timeline breaks).
    #[cold]
    fn late_skip(&mut self, (line, reason, text): (u64, SkipReason, Vec<u8>)) -> Result<()> {
        self.counters.used -= 1;
        self.unreadable += 1;
        if self.strict {
            bail!(
                "{}:{}: {} (--strict): {}",
                self.label,
                line,
                reason,
                String::from_utf8_lossy(&text[..text.len().min(120)])
            );
        }
        self.counters.skips.add(&self.label, line, reason, &text);
        Ok(())
    }

    /// When nothing is staged, parses up to `n` more events into the stage (none at the
    /// end of input): the merge of several files takes its heads from the stages.
    pub(super) fn refill(&mut self, n: usize) -> Result<()> {
        if !self.staged.is_empty() || self.done {
            return Ok(());
        }
        let mut v = std::mem::take(&mut self.staged.v);
        let r = self.pump_into(&mut v, n);
        self.staged.v = v;
        r
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

/// Events parsed ahead of a merge, taken from the front one by one or a run at a time. A
/// run moves as one copy into the batch: through a `VecDeque` each event was moved twice
/// more, and those copies were a quarter of a two-file merge's parser thread.
#[derive(Default)]
pub(super) struct Staged {
    /// `v[pos..]` are the staged events; `v[..pos]` have been moved out (their slots are
    /// not dropped again). Once all are taken, `v` is emptied and `pos` is 0, so events are
    /// parsed into an empty `v` only.
    v: Vec<Event>,
    pos: usize,
}

impl Staged {
    pub(super) fn is_empty(&self) -> bool {
        self.pos == self.v.len()
    }

    pub(super) fn pending(&self) -> &[Event] {
        &self.v[self.pos..]
    }

    pub(super) fn front(&self) -> Option<&Event> {
        self.v.get(self.pos)
    }

    /// Moves the first `n` staged events (at most all of them) onto the end of `out`.
    pub(super) fn move_into(&mut self, out: &mut Vec<Event>, n: usize) {
        let n = n.min(self.v.len() - self.pos);
        out.reserve(n);
        // SAFETY: `v[pos..pos + n]` are live events (n is clamped above), `out` has room
        // for n more after `reserve`, and the two buffers are distinct. Ownership moves to
        // `out`: `pos` passes them, so they are never read or dropped from `v` again.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.v.as_ptr().add(self.pos),
                out.as_mut_ptr().add(out.len()),
                n,
            );
            out.set_len(out.len() + n);
        }
        self.pos += n;
        self.reset_if_taken();
    }

    pub(super) fn pop_front(&mut self) -> Option<Event> {
        if self.is_empty() {
            return None;
        }
        // SAFETY: `v[pos]` is live; `pos` passes it, so it is not read or dropped again.
        let e = unsafe { std::ptr::read(self.v.as_ptr().add(self.pos)) };
        self.pos += 1;
        self.reset_if_taken();
        Some(e)
    }

    fn reset_if_taken(&mut self) {
        if self.pos == self.v.len() {
            // SAFETY: every slot has been moved out; none may be dropped.
            unsafe { self.v.set_len(0) };
            self.pos = 0;
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let live = self.v.len() - self.pos;
        // SAFETY: only `v[pos..]` are live: `v` forgets all its slots, and those are
        // dropped in place, once.
        unsafe {
            let rest = std::ptr::slice_from_raw_parts_mut(self.v.as_mut_ptr().add(self.pos), live);
            self.v.set_len(0);
            std::ptr::drop_in_place(rest);
        }
    }
}
