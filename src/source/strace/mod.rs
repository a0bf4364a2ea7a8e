//! strace text -> `Event`s: the first stage of the offline pipeline and its hot path.
//!
//! `StraceParser::feed` takes one physical line: `prefix` splits off the pid and timestamp,
//! `body` cuts the rest into a call, an unfinished or resumed half, a signal, an exit or
//! strace's own message, without allocating; the parser keeps the per-thread state the
//! grammar needs (`halves`: unfinished halves waiting for their resumed half; a line split by
//! strace's own "Process N attached" message; `clock`: midnight rollover under -t/-tt,
//! accumulation under -r) and turns body parts into events, with the arguments `args` takes.
//! Every line read is either used or skipped with a reason, never lost.

mod args;
mod body;
mod clock;
mod halves;
mod prefix;
mod shape;

pub use super::line::{LineOutcome, SkipReason};
pub(crate) use args::{extract_args_with, intern, NameCache};
pub use body::{fast_path_agrees, lazy_data_agrees};
pub(crate) use body::{parse_body, parse_tail};
pub use clock::ClockState;
pub(crate) use prefix::parse_prefix;
pub use prefix::TimeFmt;
pub use shape::Shape;

use crate::event::{Event, EventKind, Nanos, Tid};
use crate::source::scan::{is_name_byte, skip_ws, trim_end};
use body::{fast_call, is_process_message, is_summary_line, Body};
use halves::Pending;
use memchr::memmem;
use prefix::{looks_like_prefix, Prefix};

fn splice_finder() -> &'static memmem::Finder<'static> {
    static F: std::sync::OnceLock<memmem::Finder<'static>> = std::sync::OnceLock::new();
    F.get_or_init(|| memmem::Finder::new(b"strace: Process "))
}

/// Where strace's own `Process N ...` message starts in a line it was printed into: with
/// the `strace: ` prefix, or (strace 4.x) without it, then a pid.
fn splice_at(raw: &[u8]) -> Option<usize> {
    if let Some(at) = splice_finder().find(raw) {
        return Some(at);
    }
    let at = memmem::rfind(raw, b"Process ")?;
    let digits = raw[at + 8..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    (digits > 0 && raw[at + 8 + digits..].starts_with(b" ")).then_some(at)
}

/// Turns lines into events, keeping the per-thread state the strace grammar needs.
pub struct StraceParser {
    /// The pid for lines that carry none (single-process traces, `-ff` files).
    pub default_pid: Tid,
    pending: super::TidMap<Pending>,
    /// The start of a line that strace split by printing its own message into it.
    dangling: Option<(Vec<u8>, u64)>,
    pub clock: ClockState,
    /// Number of the line being parsed (1-based).
    pub line: u64,
    /// The options the lines show so far.
    pub shape: Shape,
    pub last_ts: Nanos,
    /// The parser's own copy of the name cache: the per-thread one sits behind a
    /// thread-local and a RefCell, which cost more than the lookup on every line.
    names: NameCache,
    /// Whether a line other than an attach message has made an event yet.
    any_event: bool,
    /// Thread names last given by `-Y`.
    comms: super::TidMap<Box<[u8]>>,
}

impl Default for StraceParser {
    fn default() -> Self {
        Self::new(0)
    }
}

impl StraceParser {
    pub fn new(default_pid: Tid) -> Self {
        StraceParser {
            default_pid,
            pending: Default::default(),
            dangling: None,
            clock: ClockState::new(),
            line: 0,
            shape: Shape::default(),
            last_ts: 0,
            names: NameCache::default(),
            comms: Default::default(),
            any_event: false,
        }
    }

    /// Parses one physical line (without its newline), pushing the events it completes.
    pub fn feed(&mut self, raw: &[u8], out: &mut Vec<Event>) -> LineOutcome {
        self.line += 1;
        let line_no = self.line;
        // strace's own message printed into the middle of an open line (stderr output):
        // `clone(...SIGCHLDstrace: Process 8335 attached`. Keep the start of the line, use
        // the message, and finish the line with the next bare continuation.
        // The message runs to the end of the line, so test the cheap suffix before
        // searching the whole line for it.
        let spliced = if is_process_message(raw) {
            splice_at(raw)
        } else {
            None
        };
        if let Some(at) = spliced {
            if at > 0 && is_process_message(&raw[at..]) {
                // A previous split line still waiting for its end never got it.
                if let Some((head, head_line)) = self.dangling.take() {
                    self.feed_full_line(&head, head_line, head_line, false, out);
                }
                let head = &raw[..at];
                // The message happened when the open line was printed: give it that time,
                // without moving the clock (the head is mapped again once it is finished).
                let (pfx, _) = parse_prefix(head);
                let ts = self.clock.clone().map(&pfx);
                self.dangling = Some((head.to_vec(), line_no));
                return self.feed_body_line(&raw[at..], ts, line_no, out);
            }
        }
        if let Some((mut head, head_line)) = self.dangling.take() {
            let t = skip_ws(raw);
            let continues = t.starts_with(b"<unfinished ...>")
                || t.starts_with(b"<detached ...>")
                || (raw.first() == Some(&b')') && memmem::find(raw, b" = ").is_some())
                || (!raw.is_empty()
                    && (raw[0] == b' ' || raw[0] == b',')
                    && !looks_like_prefix(raw));
            if continues {
                if !head.ends_with(b" ") && !raw.starts_with(b" ") && !raw.starts_with(b",") {
                    head.push(b' ');
                }
                head.extend_from_slice(raw);
                let outcome = self.feed_full_line(&head, head_line, line_no, false, out);
                return if outcome == LineOutcome::Used {
                    LineOutcome::Used
                } else {
                    outcome
                };
            }
            // The split line never got its end: its head alone is a call in flight.
            self.feed_full_line(&head, head_line, head_line, false, out);
        }
        self.feed_full_line(raw, line_no, line_no, true, out)
    }

    fn feed_body_line(
        &mut self,
        raw: &[u8],
        ts: Option<Nanos>,
        line_no: u64,
        out: &mut Vec<Event>,
    ) -> LineOutcome {
        match parse_body(raw) {
            Ok(body) => {
                let pfx = Prefix {
                    pid: None,
                    time: None,
                    fmt: TimeFmt::None,
                    frac_digits: 0,
                    comm: None,
                };
                self.apply(pfx, ts, body, line_no, line_no, out);
                LineOutcome::Used
            }
            Err(r) => LineOutcome::Skipped(r),
        }
    }

    /// One whole line (or a split line put back together). `defer`: a call cut off before
    /// its result may still get it on the next line, so keep it until then.
    fn feed_full_line(
        &mut self,
        raw: &[u8],
        start_line: u64,
        line_no: u64,
        defer: bool,
        out: &mut Vec<Event>,
    ) -> LineOutcome {
        let (pfx, body) = parse_prefix(raw);
        if pfx.pid.is_some() {
            self.shape.pid_column = true;
        }
        if self.clock.fmt != TimeFmt::None && pfx.fmt != self.clock.fmt && pfx.time.is_some() {
            // A different timestamp format mid-file: the times cannot be placed on one scale.
            let compatible = matches!(
                (self.clock.fmt, pfx.fmt),
                (TimeFmt::TimeOfDay, TimeFmt::TimeOfDayFrac)
                    | (TimeFmt::TimeOfDayFrac, TimeFmt::TimeOfDay)
            );
            if !compatible {
                if is_summary_line(raw) {
                    return LineOutcome::Used;
                }
                return LineOutcome::Skipped(SkipReason::BadTimestamp);
            }
        }
        let body = match fast_call(body).map_or_else(|| parse_body(body), Ok) {
            Ok(b) => b,
            Err(SkipReason::CutOff) => {
                // A call line with no result and no marker: the trace was cut off there (or
                // strace was killed). Keep it as a call in flight at the end.
                let (_, b) = parse_prefix(raw);
                let b = trim_end(b);
                let n = b.iter().take_while(|c| is_name_byte(**c)).count();
                if n > 0 && b.get(n) == Some(&b'(') && defer {
                    // The traced program's own output printed into the line (strace and
                    // the program share a terminal): `write(1, "hi\n", 3hi` then `) = 3`.
                    self.dangling = Some((raw.to_vec(), line_no));
                    return LineOutcome::Used;
                }
                if n > 0 && b.get(n) == Some(&b'(') {
                    let ts = self.clock.map(&pfx);
                    self.note_comm(&pfx, raw, ts, line_no, out);
                    let args = &b[n + 1..];
                    let body = Body::Detached {
                        name: &b[..n],
                        args,
                    };
                    self.apply(pfx, ts, body, start_line, line_no, out);
                    return LineOutcome::Used;
                }
                return LineOutcome::Skipped(SkipReason::CutOff);
            }
            Err(_) if is_summary_line(raw) => return LineOutcome::Used,
            Err(r) => return LineOutcome::Skipped(r),
        };
        let ts = if matches!(body, Body::Noise) {
            None
        } else {
            self.clock.map(&pfx)
        };
        self.note_comm(&pfx, raw, ts, line_no, out);
        self.apply(pfx, ts, body, start_line, line_no, out);
        LineOutcome::Used
    }

    /// `-Y` names each line's thread: an event when a thread's name is first seen or
    /// changes, so roles come from names without a `--threads` file.
    fn note_comm(
        &mut self,
        pfx: &Prefix,
        raw: &[u8],
        ts: Option<Nanos>,
        line_no: u64,
        out: &mut Vec<Event>,
    ) {
        let Some(name) = pfx.comm.and_then(|(a, b)| raw.get(a..b)) else {
            return;
        };
        let tid = pfx.pid.unwrap_or(self.default_pid);
        if self.comms.get(&tid).map(|n| &n[..]) != Some(name) {
            self.comms.insert(tid, name.into());
            self.shape.comm = true;
            out.push(Event {
                tid,
                ts: ts.unwrap_or(self.last_ts),
                line: line_no,
                kind: EventKind::ThreadName(String::from_utf8_lossy(name).into()),
            });
        }
    }

    fn apply(
        &mut self,
        pfx: Prefix,
        ts: Option<Nanos>,
        body: Body<'_>,
        start_line: u64,
        line_no: u64,
        out: &mut Vec<Event>,
    ) {
        let tid = pfx.pid.unwrap_or(self.default_pid);
        let ts = ts.unwrap_or(self.last_ts);
        if ts > self.last_ts {
            self.last_ts = ts;
        }
        if !matches!(body, Body::Attached { .. } | Body::Noise) {
            self.any_event = true;
        }
        match body {
            Body::Call { name, args, tail } => self.call(tid, ts, line_no, (name, args, tail), out),
            Body::Unfinished { name, args } => {
                self.unfinished(tid, ts, start_line, (name, args), out)
            }
            Body::Resumed { name, rest, tail } => {
                self.resumed(tid, ts, line_no, (name, rest, tail), out)
            }
            Body::Detached { name, args } => {
                self.detached(tid, ts, (start_line, line_no), (name, args), out)
            }
            Body::Signal { name, si_pid } => {
                out.push(Event {
                    tid,
                    ts,
                    line: line_no,
                    kind: EventKind::Signal {
                        name: intern(name),
                        si_pid,
                    },
                });
            }
            Body::Exit { code, signal } => {
                let kind = EventKind::Exit {
                    code,
                    signal: signal.map(intern),
                };
                self.exit(tid, ts, line_no, kind, out)
            }
            Body::Attached { pid, threads } => {
                if self.default_pid == 0 && !self.any_event {
                    // `strace -f -p N` leaves the `[pid N]` column out while N is the only
                    // tracee: those lines are N's, not a thread 0's.
                    self.default_pid = pid;
                }
                out.push(Event {
                    tid: pid,
                    ts,
                    line: line_no,
                    kind: EventKind::Attach { threads },
                });
            }
            Body::DetachedMsg { pid } => {
                out.push(Event {
                    tid: pid,
                    ts,
                    line: line_no,
                    kind: EventKind::Detach,
                });
            }
            Body::Noise => {}
        }
    }

    /// End of input: a split line with no end and calls that never resumed are kept as
    /// calls still in flight when the trace ended.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        if let Some((head, head_line)) = self.dangling.take() {
            self.feed_full_line(&head, head_line, head_line, false, out);
        }
        self.flush_pending(out);
    }
}

#[cfg(test)]
mod tests;
