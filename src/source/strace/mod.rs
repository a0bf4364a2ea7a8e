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
pub(crate) use args::{extract_args_with, intern, Name, NameCache};
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
use prefix::{looks_like_prefix, parse_prefix_memo, PidMemo, Prefix};

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

/// Whether `raw` continues the open line `head` from inside an argument: a line with no
/// pid or time of its own that is not strace's own output, after a head that has one (in a
/// trace with neither column every line looks like a continuation), while the head is short
/// enough to be one line (a run of stray lines must not grow it without end).
fn wraps(head: &[u8], raw: &[u8]) -> bool {
    const MAX_LINE: usize = 1 << 20;
    !raw.is_empty()
        && head.len() + raw.len() <= MAX_LINE
        && !looks_like_prefix(raw)
        && looks_like_prefix(head)
        && !is_process_message(raw)
        && ![&b"strace: "[..], b"+++ ", b"--- ", b"<... "]
            .iter()
            .any(|p| raw.starts_with(p))
        && !is_summary_line(raw)
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
    /// The `[pid N]` column of the last `-f` line the fast path read.
    pid_memo: PidMemo,
    /// The last line that could not be read, and the trace time then: no duration the
    /// parser reconstructs spans it.
    broken_line: u64,
    broken_at: Option<Nanos>,
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

/// A line of its own that marks lines left out: `[...]`, `...`, `…` (UTF-8 e2 80 a6),
/// `[…]`, `[snip]`.
fn is_elision(raw: &[u8]) -> bool {
    let t = trim_end(skip_ws(raw));
    let inner = t
        .strip_prefix(b"[")
        .and_then(|r| r.strip_suffix(b"]"))
        .map_or(t, |r| trim_end(skip_ws(r)));
    matches!(
        inner,
        b"..." | b"...." | b"\xe2\x80\xa6" | b"snip" | b"<snip>"
    ) || t == b"<snip>"
}

/// A call's text ends in a `-T` duration (`... <0.000010>`).
fn ends_in_duration(b: &[u8]) -> bool {
    let Some(r) = b.strip_suffix(b">") else {
        return false;
    };
    let Some(i) = memmem::rfind(r, b" <") else {
        return false;
    };
    let d = &r[i + 2..];
    !d.is_empty() && d.iter().all(|c| c.is_ascii_digit() || *c == b'.') && d.contains(&b'.')
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
            pid_memo: PidMemo::default(),
            comms: Default::default(),
            any_event: false,
            broken_line: 0,
            broken_at: None,
        }
    }

    /// Parses one physical line (without its newline), pushing the events it completes.
    pub fn feed(&mut self, raw: &[u8], out: &mut Vec<Event>) -> LineOutcome {
        let outcome = self.feed_line(raw, out);
        if matches!(outcome, LineOutcome::Skipped(r) if r != SkipReason::Empty) {
            self.broken_line = self.line;
            self.broken_at = Some(self.last_ts);
        }
        outcome
    }

    /// A line that the reader could not hand over (too long): it breaks the timeline too.
    pub fn skip_line(&mut self) {
        self.line += 1;
        self.broken_line = self.line;
        self.broken_at = Some(self.last_ts);
    }

    fn feed_line(&mut self, raw: &[u8], out: &mut Vec<Event>) -> LineOutcome {
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
            if wraps(&head, raw) {
                // The rest of a line cut at a fixed width (pasted through a terminal, a
                // mail, a ticket) or of one strace split with its own message, starting
                // inside an argument (`[{events=...`, `c=300000000}, NULL) = 0`): glued
                // back as it was cut, without a blank. Still no result: keep waiting.
                head.extend_from_slice(raw);
                let outcome = self.feed_full_line(&head, head_line, line_no, true, out);
                if let Some((_, l)) = self.dangling.as_mut() {
                    *l = head_line;
                }
                return outcome;
            }
            // The split line never got its end: its head alone is a call in flight.
            self.feed_full_line(&head, head_line, head_line, false, out);
        }
        if self.feed_fast(raw, line_no, out) {
            return LineOutcome::Used;
        }
        self.feed_full_line(raw, line_no, line_no, true, out)
    }

    /// Nearly every line: a call with its result on one line, in the trace's one timestamp
    /// format, read by the fast paths and built in place, all in one function (the general
    /// `feed_full_line` reads it again when this says no, which costs nothing it kept).
    #[inline(always)]
    fn feed_fast(&mut self, raw: &[u8], line_no: u64, out: &mut Vec<Event>) -> bool {
        let (pfx, body) = parse_prefix_memo(raw, &mut self.pid_memo);
        if pfx.fmt != self.clock.fmt || pfx.comm.is_some() {
            return false;
        }
        let Some(call) = fast_call(body, &mut self.names) else {
            return false;
        };
        if pfx.pid.is_some() {
            self.shape.pid_column = true;
        }
        let ts = self.clock.map(&pfx);
        let (tid, ts) = self.stamp(&pfx, ts, true);
        self.call(tid, ts, line_no, call, out);
        true
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
        if let Some(call) = fast_call(body, &mut self.names) {
            // Nearly every line: straight to `call` (the steps of the `Body::Call` case below).
            let ts = self.clock.map(&pfx);
            self.note_comm(&pfx, raw, ts, line_no, out);
            let (tid, ts) = self.stamp(&pfx, ts, true);
            self.call_general(tid, ts, line_no, call, out);
            return LineOutcome::Used;
        }
        let body = match parse_body(body) {
            Ok(b) => b,
            Err(SkipReason::CutOff) => {
                // A call line with no result and no marker: the trace was cut off there (or
                // strace was killed). Keep it as a call in flight at the end.
                let (_, b) = parse_prefix(raw);
                let b = trim_end(b);
                // ...unless it ends in a duration: it returned, and a paste ate its end.
                if ends_in_duration(b) {
                    return LineOutcome::Skipped(SkipReason::Damaged);
                }
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
            Err(_) if is_elision(raw) => return LineOutcome::Skipped(SkipReason::Elided),
            Err(r) => return LineOutcome::Skipped(r),
        };
        let ts = if matches!(body, Body::Noise) {
            if !self.shape.stack && shape::is_stack_frame(raw) {
                self.shape.stack = true;
            }
            None
        } else {
            self.clock.map(&pfx)
        };
        self.note_comm(&pfx, raw, ts, line_no, out);
        if let Body::Call { name, args, tail } = body {
            // Without moving the body through the general `apply` (its `Call` arm's steps).
            let (tid, ts) = self.stamp(&pfx, ts, true);
            self.call_general(tid, ts, line_no, (name, args, tail), out);
            return LineOutcome::Used;
        }
        self.apply(pfx, ts, body, start_line, line_no, out);
        LineOutcome::Used
    }

    /// The thread and time of a line's event (the last time seen when the line has none),
    /// moving the clock forward; `event`: the line is more than an attach message or noise.
    #[inline(always)]
    fn stamp(&mut self, pfx: &Prefix, ts: Option<Nanos>, event: bool) -> (Tid, Nanos) {
        let tid = pfx.pid.unwrap_or(self.default_pid);
        let ts = ts.unwrap_or(self.last_ts);
        if ts > self.last_ts {
            self.last_ts = ts;
        }
        if event {
            self.any_event = true;
        }
        (tid, ts)
    }

    /// `-Y` names each line's thread: an event when a thread's name is first seen or
    /// changes, so roles come from names without a `--threads` file.
    #[inline]
    fn note_comm(
        &mut self,
        pfx: &Prefix,
        raw: &[u8],
        ts: Option<Nanos>,
        line_no: u64,
        out: &mut Vec<Event>,
    ) {
        // Most traces have no `-Y` column: test for it without a call.
        if pfx.comm.is_some() {
            self.note_named(pfx, raw, ts, line_no, out);
        }
    }

    #[inline(never)]
    fn note_named(
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
        let event = !matches!(body, Body::Attached { .. } | Body::Noise);
        let (tid, ts) = self.stamp(&pfx, ts, event);
        match body {
            Body::Call { name, args, tail } => {
                self.call_general(tid, ts, line_no, (name, args, tail), out)
            }
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
                if self.default_pid == 0 && !self.any_event && threads.is_none_or(|n| n <= 1) {
                    // `strace -f -p N` leaves the `[pid N]` column out while N is the only
                    // tracee: those lines are N's, not a thread 0's. (Attached with several
                    // threads, strace prints the column on every line.)
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
mod testing;

#[cfg(test)]
mod tests {
    use super::testing::*;

    /// README lines: "Process N attached" spliced into the parent's clone line, finished by a
    /// bare ` <unfinished ...>` line; the resumed half comes later.
    #[test]
    fn attach_message_spliced_then_bare_unfinished() {
        let got = run(&[
            "[pid  8169] 22:38:13.774789 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLDstrace: Process 8335 attached",
            " <unfinished ...>",
            "[pid  8335] 22:38:13.787511 set_robust_list(0x7f3723efe520, 24 <unfinished ...>",
            "[pid  8169] 22:38:13.787530 <... clone resumed>, child_tidptr=0x7f3723efe510) = 8335 <0.012726>",
        ]);
        assert_eq!(
            got,
            vec![
                ev(
                    8335,
                    tod(22, 38, 13, 774_789),
                    1,
                    EventKind::Attach { threads: None }
                ),
                call(8169, tod(22, 38, 13, 774_789), 4, "clone")
                    .extra(Extra::Clone { thread: false })
                    .val(8335)
                    .measured(12_726 * US)
                    .start_line(1)
                    .0,
                call(8335, tod(22, 38, 13, 787_511), 3, "set_robust_list")
                    .dur(19 * US, DurSource::Paired)
                    .in_flight(InFlight::AtEnd)
                    .start_line(3)
                    .0,
            ]
        );
    }

    /// The trial-run variant: the split clone line is finished by the rest of the call.
    #[test]
    fn attach_message_spliced_then_bare_rest_of_call() {
        let got = run(&[
            "[pid  7040] 22:30:00.100000 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLDstrace: Process 7049 attached",
            ", child_tidptr=0x7f604bcf2510) = 7049 <0.006527>",
            "[pid  7049] 22:30:00.106000 set_robust_list(0x7f604bcf2520, 24) = 0 <0.000010>",
        ]);
        assert_eq!(
            got,
            vec![
                ev(
                    7049,
                    tod(22, 30, 0, 100_000),
                    1,
                    EventKind::Attach { threads: None }
                ),
                call(7040, tod(22, 30, 0, 100_000), 2, "clone")
                    .extra(Extra::Clone { thread: false })
                    .val(7049)
                    .measured(6_527 * US)
                    .0,
                call(7049, tod(22, 30, 0, 106_000), 3, "set_robust_list")
                    .val(0)
                    .measured(10 * US)
                    .0,
            ]
        );
    }

    /// Detach on SIGINT: the message is spliced into the open line, then ` <detached ...>`.
    #[test]
    fn detach_message_spliced_then_detached_marker() {
        let got = run(&[
            "[pid  8169] 22:38:25.561000 getpid() = 8169 <0.000005>",
            "[pid  8169] 22:38:25.561404 epoll_wait(5<anon_inode:[eventpoll]>, strace: Process 8169 detached",
            " <detached ...>",
        ]);
        assert_eq!(
            got,
            vec![
                call(8169, tod(22, 38, 25, 561_000), 1, "getpid")
                    .val(8169)
                    .measured(5 * US)
                    .0,
                ev(8169, tod(22, 38, 25, 561_404), 2, EventKind::Detach),
                call(8169, tod(22, 38, 25, 561_404), 3, "epoll_wait")
                    .fd(5)
                    .fd_path("anon_inode:[eventpoll]")
                    .in_flight(InFlight::AtEnd)
                    .dur(0, DurSource::Paired)
                    .start_line(2)
                    .0,
            ]
        );
    }

    /// A split line whose end never comes is kept as a call in flight, and a second split line
    /// does not lose the first.
    #[test]
    fn two_splits_in_a_row_lose_nothing() {
        let got = run(&[
            "[pid  1] 10:00:00.000000 clone(flags=SIGCHLDstrace: Process 2 attached",
            "[pid  1] 10:00:00.000100 clone(flags=SIGCHLDstrace: Process 3 attached",
            " <unfinished ...>",
        ]);
        let names: Vec<_> = got
            .iter()
            .map(|e| match &e.kind {
                EventKind::Syscall(s) => (e.line, s.name, s.in_flight),
                EventKind::Attach { .. } => (e.line, "attach", None),
                _ => (e.line, "?", None),
            })
            .collect();
        assert_eq!(
            names,
            vec![
                (1, "attach", None),
                (2, "attach", None),
                // The first split line never ended: in flight, emitted when the thread's next
                // call shows it was over.
                (1, "clone", Some(InFlight::AtEnd)),
                (2, "clone", Some(InFlight::AtEnd)),
            ]
        );
    }

    /// strace 4.x's `Process N attached` (no prefix) spliced into a clone line, the rest of the
    /// call on the next line: stitched back, the child tid from the clone's return.
    #[test]
    fn strace4_attach_message_spliced_into_clone() {
        let got = run(&[
            "[pid  7040] 22:30:00.100000 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLDProcess 7049 attached",
            ", child_tidptr=0x7f604bcf2510) = 7049 <0.006527>",
        ]);
        assert_eq!(
            got,
            vec![
                ev(
                    7049,
                    tod(22, 30, 0, 100_000),
                    1,
                    EventKind::Attach { threads: None }
                ),
                call(7040, tod(22, 30, 0, 100_000), 2, "clone")
                    .extra(Extra::Clone { thread: false })
                    .val(7049)
                    .measured(6_527 * US)
                    .0,
            ]
        );
    }

    /// The traced program's own output printed into its `write(1, ...` line (strace and the
    /// program share a terminal): the `) = N` on the next line closes that write, which is
    /// neither a call in flight nor a skipped line.
    #[test]
    fn program_output_spliced_into_a_write_is_stitched() {
        let (got, skips) = run_lines(&[
            b"10:00:00.000100 write(1, \"hello world\\n\", 12hello world",
            b") = 12 <0.000020>",
            b"10:00:00.000300 getpid() = 77 <0.000002>",
        ]);
        assert!(skips.is_empty(), "{skips:?}");
        assert_eq!(got.len(), 2);
        let w = got[0].syscall().unwrap();
        assert_eq!(
            (w.name, w.fd, w.ret, w.in_flight),
            ("write", Some(1), Ret::Val(12), None)
        );
        assert_eq!((w.dur, w.dur_src), (Some(20 * US), DurSource::Measured));
        assert_eq!(w.data().unwrap().head().bytes(), b"hello world\n");
        // Without its end the line is still a call in flight, and the next line is read.
        let (got, skips) = run_lines(&[
            b"10:00:00.000100 write(1, \"hello\\n\", 6hello",
            b"10:00:00.000300 getpid() = 77 <0.000002>",
        ]);
        assert!(skips.is_empty(), "{skips:?}");
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].syscall().unwrap().name, "getpid");
        assert_eq!(got[1].syscall().unwrap().in_flight, Some(InFlight::AtEnd));
    }

    /// strace 4.x prints its own messages without the `strace: ` prefix; they are the same
    /// attach and detach, not skipped lines. Until a second tracee exists strace leaves the
    /// `[pid N]` column out: those lines are the attached pid's, not a thread 0's.
    #[test]
    fn strace4_messages_and_the_attached_pid() {
        let (got, skips) = run_lines(&[
            b"Process 4321 attached - interrupt to quit",
            b"read(3, \"x\", 1) = 1",
            b"Process 4321 detached",
        ]);
        assert!(skips.is_empty(), "{skips:?}");
        let kinds: Vec<(Tid, &str)> = got
            .iter()
            .map(|e| {
                let k = match &e.kind {
                    EventKind::Attach { .. } => "attach",
                    EventKind::Detach => "detach",
                    EventKind::Syscall(sc) => sc.name,
                    _ => "other",
                };
                (e.tid, k)
            })
            .collect();
        assert_eq!(kinds, [(4321, "attach"), (4321, "read"), (4321, "detach")]);
        let got = run(&[
            "strace: Process 4321 attached",
            "10:00:00.000100 epoll_wait(5, [], 128, 100) = 0",
            "10:00:00.000200 clone(child_stack=NULL, flags=CLONE_VM|CLONE_THREAD) = 4322",
            "[pid  4322] 10:00:00.000300 futex(0x1, FUTEX_WAIT, 0, NULL) = 0",
            "[pid  4321] 10:00:00.000400 getpid() = 4321",
        ]);
        let tids: Vec<Tid> = got.iter().map(|e| e.tid).collect();
        assert_eq!(tids, [4321, 4321, 4321, 4322, 4321]);
        // Attached with several threads, strace prints the pid column: no default is taken
        // (a line without one, from another trace pasted below, stays thread 0's).
        let got = run(&[
            "strace: Process 4321 attached with 3 threads",
            "10:00:00.000100 epoll_wait(5, [], 128, 100) = 0",
        ]);
        assert_eq!(got[1].tid, 0);
        // An attach message printed into a line is the new child's: it names no default.
        let got = run(&[
            "read(3, \"x\", 1) = 1",
            "clone(child_stack=NULL, flags=SIGCHLDstrace: Process 7049 attached",
            ", child_tidptr=0x7f60) = 7049",
        ]);
        assert_eq!(got[0].tid, 0);
        assert_eq!(got.last().unwrap().tid, 0);
    }

    /// Under -f, lines come in the order strace handled them, not by time: each event keeps
    /// its own printed time.
    #[test]
    fn out_of_order_lines_keep_their_times() {
        let got = run(&[
            "[pid  7313] 22:37:41.094130 getpid() = 7313 <0.000003>",
            "[pid  7320] 22:37:41.094120 futex(0x7fb99d016678, FUTEX_WAKE_PRIVATE, 1) = 0 <0.000087>",
        ]);
        assert_eq!(got[0].ts, tod(22, 37, 41, 94_130));
        assert_eq!(got[1].ts, tod(22, 37, 41, 94_120));
    }
}
