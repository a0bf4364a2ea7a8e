//! `perf trace` text -> `Event`s: the offline source for traces taken with perf instead of
//! strace. Lines look like
//! `  2272.992 ( 0.037 ms): redis-server/1370 fdatasync(fd: 7</data/appendonly.aof>) = 0`;
//! times are milliseconds since perf started (a relative clock), arguments are `name: value`.
//! A call interrupted by another thread's output is printed as `name(args) ...` and finished
//! later by `... [continued]: name()) = ret`; the two halves are stitched per thread.

use super::line::{LineOutcome, SkipReason};
use super::scan::{is_name_byte, lossy, skip_ws, trim_end, Piece, Quoted};
use super::strace::{extract_args_with, parse_tail, Name, NameCache};
use crate::event::{DurSource, Event, EventKind, InFlight, Nanos, Syscall, Tid};
use memchr::memmem;

#[derive(Default)]
pub struct PerfParser {
    pending: super::TidMap<(Nanos, u64, Syscall)>,
    pub line: u64,
    pub first: Option<Nanos>,
    pub last_ts: Nanos,
    pub seen_dur: bool,
    /// Calls before the first timestamp (`? (         ): ... [continued]`): they ended by
    /// then, so they are given that time once it is known.
    untimed: Vec<Event>,
    /// Syscall names with their argument shapes, cached per parser (no lock per line).
    names: NameCache,
    /// The argument text without its labels, reused from line to line.
    unlabeled: Vec<u8>,
    /// The last line that could not be read: no duration the parser reconstructs spans it.
    broken_line: u64,
    /// Past `Summary of events:` (`perf trace -S`/`--summary`, printed after the calls):
    /// its table is the trace's own summary, read as noise.
    in_summary: bool,
    /// `LOST N events!` lines so far, and the events they count: perf's ring overflowed,
    /// so what happened there is unknown.
    lost_marks: u32,
    pub lost: u64,
    /// After a loss: the `lost_marks` at each thread's last line. A thread's first call
    /// after a loss may have lost its entry, and perf then times it from an older one.
    seen_since_lost: super::TidMap<u32>,
    /// `minfault [...] => ...` / `majfault` lines (`perf trace -F`) read so far.
    pub faults: u64,
    /// A call line with no end, held for the next line, which may be its wrapped rest:
    /// (text, line).
    held: Option<(Vec<u8>, u64)>,
    /// A held line found damaged once the next line was read (`take_late`).
    late: Option<(u64, SkipReason, Vec<u8>)>,
    /// The comm each thread was last shown with, and the last line's thread and comm (a
    /// one-entry cache in front of the map).
    comms: super::TidMap<Box<[u8]>>,
    named_tid: Tid,
    named_comm: Vec<u8>,
    /// `EventKind::Program` events pushed: names, not events of the trace.
    pub named: u64,
}

/// The most bytes a call wrapped onto several lines is joined into.
const MAX_JOINED: usize = 1 << 16;

/// A line that may be the wrapped rest of a call line: no time, thread and call of its
/// own, not perf's own output (a loss, the summary) nor a callchain frame.
fn wrapped_rest(raw: &[u8]) -> bool {
    let t = skip_ws(raw);
    !t.is_empty()
        && prefix(raw).is_none()
        && lost_count(t).is_none()
        && !t.starts_with(b"Summary of events:")
        && !is_frame(t)
}

/// Glues a call line's wrapped rest to it. Wrapping in a mail or a book breaks at a blank,
/// which the break took: perf puts one after `,` and `:` and around `=`, so one goes back
/// there (or where either half kept it); a terminal cuts at a fixed width, mid-word.
fn join_wrapped(head: &mut Vec<u8>, rest: &[u8]) {
    let t = skip_ws(rest);
    let blank = head.last().is_some_and(|b| b.is_ascii_whitespace())
        || t.len() < rest.len()
        || matches!(trim_end(head).last(), Some(b',' | b':'))
        || t.starts_with(b"=");
    let keep = trim_end(head).len();
    head.truncate(keep);
    if blank {
        head.push(b' ');
    }
    head.extend_from_slice(t);
}

/// `   do_syscall_64 ([kernel.kallsyms])`, `   __libc_write (/usr/lib/libc.so.6)`: a frame
/// of a callchain under an event (`perf trace --call-graph`), its object in parentheses.
fn is_frame(t: &[u8]) -> bool {
    let t = trim_end(t);
    let Some(inner) = t.strip_suffix(b")") else {
        return false;
    };
    let Some(open) = memmem::rfind(inner, b" (") else {
        return false;
    };
    let dso = &inner[open + 2..];
    open > 0 && (dso.starts_with(b"/") || dso.starts_with(b"["))
}

/// Longer than any call a trace can show (about 104 days).
const MAX_PLAUSIBLE_NS: Nanos = 1 << 53;

/// (time ns, duration ns, tid, comm (empty when the column is left out), rest of the line)
type PerfPrefix<'a> = (Option<Nanos>, Option<Nanos>, Tid, &'a [u8], &'a [u8]);

/// `  2272.992 ( 0.037 ms): comm/tid ` -> (time ns, duration ns, tid, comm, rest)
fn prefix(line: &[u8]) -> Option<PerfPrefix<'_>> {
    let s = skip_ws(line);
    let (ts, mut s) = if let Some(r) = s.strip_prefix(b"?") {
        (None, r)
    } else {
        let (ms, n) = parse_ms(s)?;
        // A time printed wrapped around (`18446744073709.520`) is no time: like `?`.
        (Some(ms).filter(|t| *t < MAX_PLAUSIBLE_NS), &s[n..])
    };
    s = skip_ws(s);
    let mut dur = None;
    let mut dur_column = false;
    if let Some(r) = s.strip_prefix(b"(") {
        let close = memchr::memchr(b')', r)?;
        let inner = skip_ws(&r[..close]);
        if let Some((d, n)) = parse_ms(inner) {
            // perf prints a call whose exit it timed before its entry as a wrapped-around
            // u64 (`18446744073702.531 ms`): no duration at all.
            if skip_ws(&inner[n..]).starts_with(b"ms") && d < MAX_PLAUSIBLE_NS {
                dur = Some(d);
            }
        }
        s = &r[close + 1..];
        if let Some(t) = s.strip_prefix(b":") {
            dur_column = true;
            s = t;
        }
    }
    s = skip_ws(s);
    // `perf trace -p PID` of a single thread leaves the `comm/tid` column out: the call
    // follows the duration column. Which thread it is, the trace does not say.
    let n = s.iter().take_while(|b| is_name_byte(**b)).count();
    if dur_column && n > 0 && s.get(n) == Some(&b'(') {
        return Some((ts, dur, 0, &[], s));
    }
    let (tid, comm, rest) = comm_tid(s)?;
    Some((ts, dur, tid, comm, rest))
}

/// The kernel's comm is at most 15 bytes (`TASK_COMM_LEN` less its NUL).
const COMM_MAX: usize = 15;

/// `comm/tid rest` -> (tid, comm, rest). A comm may hold spaces and slashes (`Web Content/219299`,
/// `JS Watchdog/947933`, `kworker/u8:2/77`): the tid is the first run of digits after a `/`
/// within a comm's length of the start that a blank follows.
#[inline(always)]
fn comm_tid(s: &[u8]) -> Option<(Tid, &[u8], &[u8])> {
    let mut from = 0;
    while let Some(i) = memchr::memchr(b'/', &s[from..]).map(|i| from + i) {
        if i > COMM_MAX {
            return None;
        }
        let digits = s[i + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
        let end = i + 1 + digits;
        if digits > 0 && matches!(s.get(end), Some(b' ' | b'\t')) {
            let tid: Tid = std::str::from_utf8(&s[i + 1..end]).ok()?.parse().ok()?;
            return Some((tid, &s[..i], skip_ws(&s[end..])));
        }
        from = i + 1;
    }
    None
}

/// `2272.992` (ms) -> ns
fn parse_ms(s: &[u8]) -> Option<(Nanos, usize)> {
    let n = s
        .iter()
        .take_while(|b| b.is_ascii_digit() || **b == b'.')
        .count();
    if n == 0 {
        return None;
    }
    let v: f64 = std::str::from_utf8(&s[..n]).ok()?.parse().ok()?;
    Some(((v * 1e6).round() as Nanos, n))
}

/// Drops perf's `name: ` argument labels into `out` so the strace argument extractor can
/// read them.
fn strip_labels(args: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let mut at_arg_start = true;
    let mut q = Quoted::new(args);
    while let Some((i, piece)) = q.next() {
        match piece {
            Piece::Code(b) => {
                if at_arg_start {
                    at_arg_start = false;
                    let n = args[i..].iter().take_while(|c| is_name_byte(**c)).count();
                    if n > 0 && args[i + n..].starts_with(b": ") {
                        q.pos = i + n + 2;
                        continue;
                    }
                }
                out.push(b);
                if b == b',' {
                    at_arg_start = true;
                    let blanks = args[i + 1..].iter().take_while(|c| **c == b' ').count();
                    out.extend_from_slice(&args[i + 1..i + 1 + blanks]);
                    q.pos = i + 1 + blanks;
                }
            }
            Piece::Open | Piece::Close => {
                at_arg_start = false;
                out.push(b'"');
            }
            Piece::Text(a, e) | Piece::Escape(a, e) => {
                out.extend_from_slice(&args[a..e.min(args.len())])
            }
        }
    }
}

impl PerfParser {
    /// Parses one line (without its newline), pushing the events it completes.
    pub fn feed(&mut self, raw: &[u8], out: &mut Vec<Event>) -> LineOutcome {
        self.line += 1;
        if self.held.is_some() {
            return self.feed_after_held(raw, out);
        }
        self.outcome(raw, self.line, out)
    }

    #[inline(always)]
    fn outcome(&mut self, raw: &[u8], line_no: u64, out: &mut Vec<Event>) -> LineOutcome {
        match self.feed_line(raw, line_no, out) {
            Ok(()) => LineOutcome::Used,
            // A call with no end may have been wrapped onto the next line (a book, a mail):
            // held until that line says (`feed_after_held`).
            Err(SkipReason::CutOff) => {
                self.held = Some((raw.to_vec(), line_no));
                LineOutcome::Used
            }
            Err(r) => {
                if r != SkipReason::Empty {
                    self.broken_line = line_no;
                }
                LineOutcome::Skipped(r)
            }
        }
    }

    /// The line after a call line with no end: its rest, wrapped (joined, as strace's
    /// wrapped lines are), or another line, and the held one was damaged: counted as
    /// skipped where it was (`late`), the timeline broken there.
    #[cold]
    #[inline(never)]
    fn feed_after_held(&mut self, raw: &[u8], out: &mut Vec<Event>) -> LineOutcome {
        let Some((mut head, head_line)) = self.held.take() else {
            return self.outcome(raw, self.line, out);
        };
        let line_no = self.line;
        if wrapped_rest(raw) && head.len() + raw.len() <= MAX_JOINED {
            join_wrapped(&mut head, raw);
            return match self.feed_line(&head, line_no, out) {
                Ok(()) => LineOutcome::Used,
                // Wrapped onto more lines still.
                Err(SkipReason::CutOff) => {
                    self.held = Some((head, head_line));
                    LineOutcome::Used
                }
                Err(r) => {
                    self.broken_line = line_no;
                    self.late = Some((head_line, r, head));
                    LineOutcome::Skipped(r)
                }
            };
        }
        self.drop_held(head, head_line, out);
        self.outcome(raw, line_no, out)
    }

    /// A held call line that nothing continued: damaged (a duration but no result: it
    /// returned) or cut off. No duration spans it, and it is counted where it was.
    fn drop_held(&mut self, head: Vec<u8>, head_line: u64, out: &mut Vec<Event>) {
        let reason = match prefix(&head) {
            Some((_, Some(_), ..)) => SkipReason::Damaged,
            _ => SkipReason::CutOff,
        };
        self.broken_line = self.broken_line.max(head_line);
        out.push(Event {
            tid: 0,
            ts: self.last_ts,
            line: head_line,
            kind: EventKind::Unreadable,
        });
        self.late = Some((head_line, reason, head));
    }

    /// A line skipped after it was handed back as used (a held line nothing continued):
    /// (line, reason, text), taken once.
    #[inline]
    pub fn take_late(&mut self) -> Option<(u64, SkipReason, Vec<u8>)> {
        self.late.take()
    }

    /// A line that the reader could not hand over (too long): it breaks the timeline too.
    pub fn skip_line(&mut self) {
        self.line += 1;
        self.broken_line = self.line;
    }

    fn feed_line(
        &mut self,
        raw: &[u8],
        line_no: u64,
        out: &mut Vec<Event>,
    ) -> Result<(), SkipReason> {
        let Some((ts, dur, tid, comm, body)) = self.event_prefix(raw)? else {
            return Ok(());
        };
        // Nearly every line is of the thread the last one was, by the same name.
        if !comm.is_empty() && (tid != self.named_tid || comm != &self.named_comm[..]) {
            self.note_comm(tid, comm, line_no, out);
        }
        let timed = ts.is_some();
        let ts = self.stamp(ts, out);
        if dur.is_some() {
            self.seen_dur = true;
        }
        let (continued, body) = match memmem::find(body, b"[continued]: ") {
            Some(i) => (true, &body[i + 13..]),
            None => (false, body),
        };
        let n = body
            .iter()
            .take_while(|b| is_name_byte(**b) || **b == b':')
            .count();
        if n == 0 || body.get(n) != Some(&b'(') {
            return self.not_a_call(body);
        }
        let name_b = &body[..n];
        if memchr::memchr(b':', name_b).is_some() {
            // A tracepoint event (`raw_syscalls:sys_enter(...)`), not a decoded syscall.
            return Ok(());
        }
        let facts = self.names.get(name_b);
        let rest = &body[n + 1..];
        self.break_at_loss(tid, facts.name, continued, rest, out)?;
        if !continued
            || self
                .pending
                .get(&tid)
                .is_some_and(|p| p.2.name != facts.name)
        {
            self.end_unfinished(tid, ts, out);
        }
        let trimmed = trim_end(rest);
        if !continued && trimmed.ends_with(b"...") && memmem::rfind(trimmed, b") = ").is_none() {
            let mut sc = Syscall::with(facts.name, facts.sys);
            self.read_args(&mut sc, facts, &trimmed[..trimmed.len() - 3]);
            sc.start_line = Some(line_no);
            self.pending.insert(tid, (ts, line_no, sc));
            return Ok(());
        }
        let close = memmem::rfind(rest, b") ").or_else(|| memmem::rfind(rest, b")="));
        let (args, tail) = match close {
            Some(c) => (&rest[..c], &rest[c + 1..]),
            None => return Err(SkipReason::CutOff),
        };
        let tail = match skip_ws(tail).strip_prefix(b"=") {
            Some(t) => parse_tail(t).ok_or(SkipReason::BadReturn)?,
            // `name(args)` and nothing after: the result may be on the next line.
            None if skip_ws(tail).is_empty() => return Err(SkipReason::CutOff),
            None => return Err(SkipReason::BadReturn),
        };
        let (mut sc, start, start_line) = if continued {
            self.entry_of(tid, facts, ts, timed)
        } else {
            let mut sc = Syscall::with(facts.name, facts.sys);
            self.read_args(&mut sc, facts, args);
            (sc, ts, None)
        };
        sc.ret = tail.ret;
        if let Some(p) = tail.ret_path {
            sc.ret_path = Some(lossy(p));
        }
        let exit = Exit {
            ts,
            dur,
            start,
            start_line,
            timed,
            continued,
        };
        self.complete(tid, line_no, sc, exit, out);
        Ok(())
    }

    /// The line's time, duration and thread, or what a line without them is: nothing to
    /// read (`Ok(None)`: the summary, callchain frames) or a line skipped for a reason.
    #[inline(always)]
    fn event_prefix<'a>(&mut self, raw: &'a [u8]) -> Result<Option<PerfPrefix<'a>>, SkipReason> {
        let t = skip_ws(raw);
        if t.is_empty() {
            return if self.in_summary {
                Ok(None)
            } else {
                Err(SkipReason::Empty)
            };
        }
        match prefix(raw) {
            Some(p) => Ok(Some(p)),
            None if self.in_summary => Ok(None),
            None if t.starts_with(b"Summary of events:") => {
                self.in_summary = true;
                Ok(None)
            }
            None if lost_count(t).is_some() => {
                self.lost_marks += 1;
                self.lost += lost_count(t).unwrap_or(0);
                Err(SkipReason::Lost)
            }
            // callchain frames under an event (`   do_syscall_64 ([kernel.kallsyms])`)
            None if raw.first() == Some(&b' ') && is_frame(t) => Ok(None),
            None => Err(SkipReason::NoSyscall),
        }
    }

    /// A thread's comm, new or changed: perf trace names no process, so the comm is what
    /// tells programs apart in a whole-machine trace (`EventKind::Program`).
    #[inline(never)]
    fn note_comm(&mut self, tid: Tid, comm: &[u8], line_no: u64, out: &mut Vec<Event>) {
        self.named_tid = tid;
        self.named_comm.clear();
        self.named_comm.extend_from_slice(comm);
        if self.comms.get(&tid).map(|c| &c[..]) == Some(comm) {
            return;
        }
        self.comms.insert(tid, comm.into());
        self.named += 1;
        out.push(Event {
            tid,
            ts: self.last_ts,
            line: line_no,
            kind: EventKind::Program(lossy(comm)),
        });
    }

    /// The time a line is placed at: its own, or the last one seen when it has none (`?`).
    /// The first timed line also dates the untimed events before it.
    #[inline(always)]
    fn stamp(&mut self, ts: Option<Nanos>, out: &mut Vec<Event>) -> Nanos {
        let Some(t) = ts else {
            return self.last_ts;
        };
        if self.first.is_none() {
            self.first = Some(t);
            for mut e in self.untimed.drain(..) {
                e.ts = t;
                out.push(e);
            }
        }
        // A continued call is printed at its entry's time, which may predate every line
        // before it: the trace starts at the earliest time it shows, so no event is before
        // its start (a header never shows `+-1.986s`).
        if self.first.is_some_and(|f| t < f) {
            self.first = Some(t);
        }
        self.last_ts = self.last_ts.max(t);
        t
    }

    /// A line with a thread but no `name(`: a page fault, or nothing this parser reads.
    fn not_a_call(&mut self, body: &[u8]) -> Result<(), SkipReason> {
        if is_fault(body) {
            // `perf trace -F`: a page fault of the thread, not a call (and no line to warn
            // about). Its time is often printed wrapped around.
            self.faults += 1;
            return Ok(());
        }
        Err(SkipReason::NoSyscall)
    }

    /// perf pairs a thread's exit with the last entry it saw of that thread. A thread's first
    /// exit after a loss may be paired with an entry before it (the name and arguments of one
    /// call, the result of another, the time across the lost ones); a continuation of another
    /// call's entry is one too. Neither line can be read as a call: the timeline breaks there.
    #[inline(always)]
    fn break_at_loss(
        &mut self,
        tid: Tid,
        name: &'static str,
        continued: bool,
        rest: &[u8],
        out: &mut Vec<Event>,
    ) -> Result<(), SkipReason> {
        let after_loss = self.lost_marks > 0
            && self.seen_since_lost.insert(tid, self.lost_marks) != Some(self.lost_marks);
        let mismatched = continued && self.pending.get(&tid).is_some_and(|p| p.2.name != name);
        if !(after_loss || mismatched) || is_entry_only(continued, rest) {
            return Ok(());
        }
        // The entry printed before, if any, ended somewhere in the loss: its length is
        // unknown (pushed before the break, so nothing bounds it across).
        if let Some((t0, l0, sc)) = self.pending.remove(&tid) {
            out.push(Event {
                tid,
                ts: t0,
                line: l0,
                kind: EventKind::Syscall(sc),
            });
        }
        Err(SkipReason::AcrossLoss)
    }

    /// A call printed as `name(args) ...` whose continuation never came: it ended before
    /// `ts`, the thread's next event (an upper bound, not a call in flight).
    fn end_unfinished(&mut self, tid: Tid, ts: Nanos, out: &mut Vec<Event>) {
        let Some((t0, l0, mut sc)) = self.pending.remove(&tid) else {
            return;
        };
        // Unless a line that could not be read came between: it may have been the
        // continuation. Then how long the call ran is unknown.
        if self.broken_line <= l0 {
            sc.dur = Some((ts - t0).max(0));
            sc.dur_src = DurSource::UpperBound;
        }
        out.push(Event {
            tid,
            ts: t0,
            line: l0,
            kind: EventKind::Syscall(sc),
        });
    }

    /// A call's arguments, their `name: ` labels taken off (one buffer, reused).
    #[inline(always)]
    fn read_args(&mut self, sc: &mut Syscall, facts: Name, args: &[u8]) {
        let mut a = std::mem::take(&mut self.unlabeled);
        strip_labels(args, &mut a);
        extract_args_with(sc, facts, &a);
        self.unlabeled = a;
    }

    /// The entry of a `[continued]` exit: the thread's pending call of that name, with its
    /// time and line, or a call without its arguments.
    fn entry_of(
        &mut self,
        tid: Tid,
        facts: Name,
        ts: Nanos,
        timed: bool,
    ) -> (Syscall, Nanos, Option<u64>) {
        match self.pending.remove(&tid) {
            Some((t0, l0, sc)) if sc.name == facts.name => (sc, t0, Some(l0)),
            _ => {
                let mut sc = Syscall::with(facts.name, facts.sys);
                // perf prints an exit line with the time of the entry it paired it with, `?`
                // when it saw none: only then was the call running before tracing began. A
                // timed line whose entry line is not here (cut from the text, or not
                // printed, as with --failure) began at its time and lasted its duration;
                // only its arguments are unknown.
                if !timed {
                    sc.in_flight = Some(InFlight::AtStart);
                }
                (sc, ts, None)
            }
        }
    }

    /// A call's exit read: its duration (measured, or paired with its entry line) and the
    /// event, held back while no line has had a time.
    #[inline(always)]
    fn complete(&mut self, tid: Tid, line_no: u64, mut sc: Syscall, x: Exit, out: &mut Vec<Event>) {
        match x.dur {
            Some(d) => {
                sc.dur = Some(d);
                sc.dur_src = DurSource::Measured;
            }
            None if x.start_line.is_some() => {
                sc.dur = Some((x.ts - x.start).max(0));
                sc.dur_src = DurSource::Paired;
            }
            None => {}
        }
        sc.start_line = x.start_line;
        let begin = if x.continued && x.start_line.is_none() && !x.timed {
            x.ts - sc.dur.unwrap_or(0)
        } else {
            x.start
        };
        let ev = Event {
            tid,
            ts: begin,
            line: line_no,
            kind: EventKind::Syscall(sc),
        };
        if !x.timed && self.first.is_none() {
            self.untimed.push(ev);
        } else {
            out.push(ev);
        }
    }

    pub fn finish(&mut self, out: &mut Vec<Event>) {
        if let Some((head, head_line)) = self.held.take() {
            self.drop_held(head, head_line, out);
        }
        out.append(&mut self.untimed);
        let mut rest: Vec<_> = self.pending.drain().collect();
        rest.sort_by_key(|(_, (_, l, _))| *l);
        for (tid, (ts, line, mut sc)) in rest {
            sc.in_flight = Some(InFlight::AtEnd);
            if self.broken_line <= line {
                sc.dur = Some((self.last_ts - ts).max(0));
                sc.dur_src = DurSource::Paired;
            }
            out.push(Event {
                tid,
                ts,
                line,
                kind: EventKind::Syscall(sc),
            });
        }
    }
}

/// What an exit line says beyond its call: its time and duration, where its entry began
/// (time and line), whether it had a time of its own and whether it continues an entry.
struct Exit {
    ts: Nanos,
    dur: Option<Nanos>,
    start: Nanos,
    start_line: Option<u64>,
    timed: bool,
    continued: bool,
}

/// `name(args) ...`: an entry perf printed before its exit (the exit comes as a
/// `[continued]` line).
fn is_entry_only(continued: bool, rest: &[u8]) -> bool {
    let trimmed = trim_end(rest);
    !continued && trimmed.ends_with(b"...") && memmem::rfind(trimmed, b") = ").is_none()
}

/// `LOST 94 events!`: perf's count of the records its ring buffer dropped there.
fn lost_count(t: &[u8]) -> Option<u64> {
    let n = t.strip_prefix(b"LOST ")?;
    let digits = n.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || !n[digits..].starts_with(b" events!") {
        return None;
    }
    std::str::from_utf8(&n[..digits]).ok()?.parse().ok()
}

/// `minfault [sym+0x69] => 0x7faf687cd158 (?.)`: a page fault that `perf trace -F` printed.
fn is_fault(body: &[u8]) -> bool {
    body.starts_with(b"minfault [") || body.starts_with(b"majfault [")
}

/// True when a line has the perf trace shape (used by format detection).
pub fn looks_like_perf(line: &[u8]) -> bool {
    match prefix(line) {
        Some((_, _, _, _, body)) => {
            let n = body
                .iter()
                .take_while(|b| is_name_byte(**b) || **b == b':')
                .count();
            n > 0 && body.get(n) == Some(&b'(')
                || memmem::find(body, b"[continued]").is_some()
                || is_fault(body)
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Extra, Ret};

    /// `PerfParser::feed`, the comms it names left out (`comms_are_said_when_new_or_changed`).
    fn feed(p: &mut PerfParser, raw: &[u8], out: &mut Vec<Event>) -> LineOutcome {
        let o = p.feed(raw, out);
        out.retain(|e| !matches!(e.kind, EventKind::Program(_)));
        o
    }

    fn one(line: &str) -> Vec<Event> {
        let mut p = PerfParser::default();
        let mut out = vec![];
        assert_eq!(feed(&mut p, line.as_bytes(), &mut out), LineOutcome::Used);
        p.finish(&mut out);
        out
    }

    #[test]
    fn reads_a_decoded_call_with_fd_annotation() {
        let ev = one(
            "  2272.992 ( 0.037 ms): redis-server/1370 fdatasync(fd: 7</data/appendonly.aof>) = 0",
        );
        let sc = ev[0].syscall().unwrap();
        assert_eq!(ev[0].tid, 1370);
        assert_eq!(ev[0].ts, 2_272_992_000);
        assert_eq!(sc.name, "fdatasync");
        assert_eq!(sc.fd, Some(7));
        assert_eq!(sc.fd_path.as_deref(), Some("/data/appendonly.aof"));
        assert_eq!(sc.dur, Some(37_000));
        assert_eq!(sc.ret, Ret::Val(0));
    }

    #[test]
    fn reads_errors_and_four_digit_durations() {
        let ev = one(
            "       0.241 (1000.421 ms): sleep/28042 nanosleep(rqtp: 0x7ffd6c3e6ed0)         = 0",
        );
        assert_eq!(ev[0].syscall().unwrap().dur, Some(1_000_421_000));
        let ev = one("     0.045 ( 0.002 ms): ls/145954 access(filename: 0xd6f5b2c0, mode: R)   = -1 ENOENT (No such file or directory)");
        assert_eq!(ev[0].syscall().unwrap().ret, Ret::Err("ENOENT"));
    }

    #[test]
    fn continued_line_without_start_is_in_flight_at_start() {
        let ev =
            one("         ? (         ): ls/145954  ... [continued]: execve())             = 0");
        let sc = ev[0].syscall().unwrap();
        assert_eq!(sc.name, "execve");
        assert_eq!(sc.in_flight, Some(InFlight::AtStart));
    }

    /// perf times an exit line from the entry it paired it with: a `[continued]` line whose
    /// entry line is missing (cut from a pasted trace, or never printed) mid-trace began at
    /// its printed time and lasted its printed duration. It was not running before tracing
    /// began, and nothing says it was: its bounds are exact, only its arguments are unknown.
    #[test]
    fn timed_continued_line_without_its_entry_starts_at_its_time() {
        let mut p = PerfParser::default();
        let mut out = vec![];
        for l in [
            "  1324.225 ( 5.414 ms): redis-server/7514 fdatasync(fd: 7) = 0",
            "  1329.797 ( 6.213 ms): redis-server/7514 fdatasync(fd: 7) = 0",
            "  1312.368 (31.627 ms): redis-benchmar/8888  ... [continued]: epoll_wait()) = 4",
        ] {
            assert_eq!(feed(&mut p, l.as_bytes(), &mut out), LineOutcome::Used);
        }
        p.finish(&mut out);
        let e = out.iter().find(|e| e.tid == 8888).unwrap();
        let sc = e.syscall().unwrap();
        assert_eq!(e.ts, 1_312_368_000);
        assert_eq!(sc.dur, Some(31_627_000));
        assert_eq!(sc.dur_src, DurSource::Measured);
        assert_eq!(sc.in_flight, None);
    }

    /// `perf trace -T` prints times since boot: a call already running at the start, with
    /// no time of its own, gets the first time seen (it ended by then), never 0.
    #[test]
    fn call_without_a_time_before_the_first_one_takes_that_time() {
        let mut p = PerfParser::default();
        let mut out = vec![];
        assert_eq!(
            feed(
                &mut p,
                b"         ? (         ): redis-server/28471  ... [continued]: epoll_wait())   = 0",
                &mut out,
            ),
            LineOutcome::Used
        );
        assert!(out.is_empty());
        assert_eq!(feed(&mut p,
            b"19274896.686 ( 0.027 ms): redis-server/28471 openat(dfd: CWD, filename: 0xd29888c5) = 8",
            &mut out,
        ), LineOutcome::Used);
        p.finish(&mut out);
        let names: Vec<(&str, Nanos)> = out
            .iter()
            .map(|e| (e.syscall().unwrap().name, e.ts))
            .collect();
        assert_eq!(
            names,
            [
                ("epoll_wait", 19_274_896_686_000),
                ("openat", 19_274_896_686_000)
            ]
        );
    }

    #[test]
    fn stitches_interrupted_call_with_its_continuation() {
        let mut p = PerfParser::default();
        let mut out = vec![];
        assert_eq!(
            feed(
                &mut p,
                b"   10.000 (         ): redis-server/7 fdatasync(fd: 7) ...",
                &mut out,
            ),
            LineOutcome::Used
        );
        assert_eq!(
            feed(
                &mut p,
                b"   10.100 ( 0.010 ms): redis-server/8 read(fd: 9, buf: 0x1, count: 5) = 5",
                &mut out,
            ),
            LineOutcome::Used
        );
        assert_eq!(
            feed(
                &mut p,
                b"   10.000 (50.000 ms): redis-server/7  ... [continued]: fdatasync()) = 0",
                &mut out,
            ),
            LineOutcome::Used
        );
        let f = out
            .iter()
            .find(|e| e.syscall().unwrap().name == "fdatasync")
            .unwrap();
        assert_eq!(f.syscall().unwrap().fd, Some(7));
        assert_eq!(f.syscall().unwrap().dur, Some(50_000_000));
        assert_eq!(f.ts, 10_000_000);
    }

    /// `perf trace -F all --syscalls`: page-fault lines among the calls (their time printed
    /// wrapped around) are read, not skipped as lines that could not be read, and a trace
    /// that begins with them is still a perf trace.
    #[test]
    fn page_fault_lines_are_read_and_counted() {
        let fault = "18446663986604.598 ( 0.000 ms): redis-server/2014 minfault [hdr_record_values+0x69] => 0x7faf687cd5d8 (?.)";
        assert!(looks_like_perf(fault.as_bytes()));
        let mut p = PerfParser::default();
        let mut out = vec![];
        for l in [
            fault,
            "   642.506 ( 0.004 ms): redis-server/2014 read(fd: 9, buf: 0x1, count: 5) = 5",
            "   642.600 ( 0.000 ms): redis-server/2014 majfault [call+0x272] => 0x55b251f80e98 (?.)",
        ] {
            assert_eq!(feed(&mut p, l.as_bytes(), &mut out), LineOutcome::Used, "{l}");
        }
        p.finish(&mut out);
        assert_eq!(p.faults, 2);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].ts, 642_506_000);
    }

    #[test]
    fn callchain_frames_are_noise_not_errors() {
        let mut p = PerfParser::default();
        let mut out = vec![];
        assert_eq!(
            feed(
                &mut p,
                b"                                   do_syscall_64 ([kernel.kallsyms])",
                &mut out
            ),
            LineOutcome::Used
        );
        assert_eq!(
            feed(
                &mut p,
                b"     0.011 pipewire/2290 raw_syscalls:sys_enter(id: 16, args: 1)",
                &mut out
            ),
            LineOutcome::Used
        );
        assert!(out.is_empty());
    }

    /// A call printed with an empty duration and `...` that is never continued ended before
    /// its thread's next event: an upper bound to it, not a call in flight at the end. Only a
    /// call with nothing after it in its thread is still running when tracing ended.
    #[test]
    fn uncontinued_call_is_bounded_by_the_threads_next_event() {
        let mut p = PerfParser::default();
        let mut out = vec![];
        for l in [
            "   10.000 (         ): redis-server/7 fdatasync(fd: 7) ...",
            "   10.100 ( 0.010 ms): redis-server/8 read(fd: 9, buf: 0x1, count: 5) = 5",
            "   12.500 ( 0.002 ms): redis-server/7 getpid() = 7",
            "   13.000 (         ): redis-server/8 epoll_wait(epfd: 5, events: 0x1, maxevents: 128) ...",
        ] {
            assert_eq!(feed(&mut p, l.as_bytes(), &mut out), LineOutcome::Used, "{l}");
        }
        p.finish(&mut out);
        let by_name = |n: &str| out.iter().find(|e| e.syscall().unwrap().name == n).unwrap();
        let f = by_name("fdatasync");
        let sc = f.syscall().unwrap();
        assert_eq!((f.tid, f.ts), (7, 10_000_000));
        assert_eq!(
            (sc.dur, sc.dur_src, sc.in_flight),
            (Some(2_500_000), DurSource::UpperBound, None)
        );
        let w = by_name("epoll_wait").syscall().unwrap();
        assert_eq!(w.in_flight, Some(InFlight::AtEnd));
    }

    /// A duration perf printed wrapped around (exit timed before entry) is no duration.
    #[test]
    fn a_wrapped_duration_is_unknown() {
        let ev = one(
            "   484.128 (18446744073702.531 ms): redis-server/7514 fdatasync(fd: 7</a.aof>)   = 0",
        );
        let sc = ev[0].syscall().unwrap();
        assert_eq!((sc.name, sc.dur), ("fdatasync", None));
        assert_eq!(ev[0].end(), ev[0].ts);
        let mut p = PerfParser::default();
        let mut out = vec![];
        for l in [
            "     0.026 ( 0.003 ms): oomd/972 newfstatat(dfd: 12, filename: \"\", statbuf: 0x1, flag: 4096) = 0",
            "18446744073709.520 ( 0.044 ms): cg/36478 openat(dfd: 4, filename: \".\", flags: RDONLY) = 5",
        ] {
            assert_eq!(feed(&mut p, l.as_bytes(), &mut out), LineOutcome::Used);
        }
        assert_eq!(
            out[1].ts, 26_000,
            "a wrapped time is no time: the last one seen"
        );
    }

    /// A continued call timed before the first line starts the trace.
    #[test]
    fn the_trace_starts_at_its_earliest_time() {
        let mut p = PerfParser::default();
        let mut out = vec![];
        for l in [
            "  1000.000 ( 0.010 ms): redis-server/42 epoll_wait(epfd: 5, maxevents: 10) = 0",
            "   998.014 ( 5.000 ms): redis-server/43  ... [continued]: fdatasync()) = 0",
        ] {
            feed(&mut p, l.as_bytes(), &mut out);
        }
        assert_eq!(p.first, Some(998_014_000));
        assert!(out.iter().all(|e| e.ts >= p.first.unwrap()));
    }

    /// `perf trace -a` prints every program's threads: a comm with spaces or slashes is one.
    #[test]
    fn a_comm_with_spaces_or_slashes_is_read() {
        for (line, tid) in [
            (
                "  10.000 ( 0.010 ms): Web Content/219299 recvmsg(fd: 12) = -1 EAGAIN",
                219299,
            ),
            (
                "  10.000 ( 0.010 ms): JS Watchdog/947933 futex(uaddr: 0x7f, op: WAIT) = 0",
                947933,
            ),
            ("  10.000 ( 0.010 ms): kworker/u8:2/77 read(fd: 3) = 0", 77),
            (
                "  10.000 ( 0.010 ms): redis-server/4242 fdatasync(fd: 7) = 0",
                4242,
            ),
        ] {
            let ev = one(line);
            assert_eq!(ev.len(), 1, "{line}");
            assert_eq!(ev[0].tid, tid, "{line}");
        }
    }

    /// perf trace prints clone's flags without their `CLONE_` prefix: `THREAD` among them
    /// makes a thread of the caller's process; without it, a new process.
    #[test]
    fn a_perf_clone_of_a_thread_is_a_thread() {
        let clone = |line: &str| one(line)[0].syscall().unwrap().extra.clone();
        assert_eq!(
            clone(
                "  10.000 ( 0.050 ms): redis-server/4242 clone(clone_flags: VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|PARENT_SETTID|CHILD_CLEARTID, newsp: 0x7f) = 4243"
            ),
            Extra::Clone { thread: true }
        );
        assert_eq!(
            clone(
                "  10.000 ( 0.050 ms): redis-server/4242 clone(clone_flags: CHILD_CLEARTID|CHILD_SETTID|0x11, newsp: 0) = 5001"
            ),
            Extra::Clone { thread: false }
        );
    }

    /// A futex call keeps its address, so that a wake is tied to the wait it ended; glibc's
    /// contended-lock value 2 makes a lock wait.
    #[test]
    fn a_futex_keeps_its_address() {
        let extra = |line: &str| one(line)[0].syscall().unwrap().extra.clone();
        assert_eq!(
            extra("  10.000 ( 0.003 ms): JS Watchdog/219311 futex(uaddr: 0x7f1c, op: WAKE_PRIVATE, val: 1) = 1"),
            Extra::Futex { addr: 0x7f1c, wake: true }
        );
        assert_eq!(
            extra("  10.000 (300.000 ms): Web Content/219299 futex(uaddr: 0x7f1c, op: WAIT_PRIVATE, val: 0) = 0"),
            Extra::Futex { addr: 0x7f1c, wake: false }
        );
        assert_eq!(
            extra("  10.000 (300.000 ms): Web Content/219299 futex(uaddr: 0x7f20, op: WAIT_PRIVATE, val: 2) = 0"),
            Extra::LockWait(0x7f20)
        );
    }

    /// `perf trace -p PID` of a single thread prints no `comm/tid` column.
    #[test]
    fn lines_without_the_comm_column_are_read() {
        let ev = one("     0.046 ( 0.014 ms): gettimeofday(tv: 0x707d30      ) = 0");
        let sc = ev[0].syscall().unwrap();
        assert_eq!(
            (ev[0].ts, sc.name, sc.dur),
            (46_000, "gettimeofday", Some(14_000))
        );
        let ev = one("     1.250 ( 0.004 ms): write(fd: 9, buf: 0x7f, count: 12) = 12");
        assert_eq!(ev[0].syscall().unwrap().fd, Some(9));
        assert!(looks_like_perf(
            b"     0.046 ( 0.014 ms): gettimeofday(tv: 0x707d30      ) = 0"
        ));
        // strace -ttt and -r lines have no duration column: never taken for perf.
        assert!(!looks_like_perf(
            b"1796078610.545264 fdatasync(7) = 0 <0.000311>"
        ));
        assert!(!looks_like_perf(b"     0.000123 read(3, \"\", 1) = 0"));
    }

    /// A call wrapped onto two lines (a mail, a book) is joined; a call line that nothing
    /// continues is damaged, said once the next line is read (`take_late`), and a result
    /// line of its own is no callchain frame.
    #[test]
    fn wrapped_calls_are_joined_and_damaged_ones_said() {
        let mut p = PerfParser::default();
        let mut out = vec![];
        let mut late = vec![];
        for l in [
            "  10.000 ( 0.004 ms): redis-server/7 write(fd: 9, buf: 0x7f,",
            " count: 5) = 5",
            "  10.100 ( 0.004 ms): redis-server/7 read(fd: 9, buf: 0x7f, coun",
            "t: 5)",
            " = 5",
            "  10.200 ( 0.004 ms): redis-server/7 read(fd: 9, buf: 0x7f, count:",
            "  10.300 ( 0.004 ms): redis-server/7 getpid() = 7",
            "                 do_syscall_64 ([kernel.kallsyms])",
        ] {
            assert_eq!(
                feed(&mut p, l.as_bytes(), &mut out),
                LineOutcome::Used,
                "{l}"
            );
            late.extend(p.take_late().map(|(l, r, _)| (l, r)));
        }
        assert_eq!(
            feed(
                &mut p,
                b" = -1 ENOENT (No such file or directory)",
                &mut out
            ),
            LineOutcome::Skipped(SkipReason::NoSyscall)
        );
        p.finish(&mut out);
        assert_eq!(late, [(6, SkipReason::Damaged)]);
        let calls: Vec<(&str, Option<i32>)> = out
            .iter()
            .filter_map(|e| e.syscall().map(|s| (s.name, s.fd)))
            .collect();
        assert_eq!(
            calls,
            [("write", Some(9)), ("read", Some(9)), ("getpid", None)]
        );
        assert!(out
            .iter()
            .any(|e| e.line == 6 && e.kind == EventKind::Unreadable));
    }

    /// Each thread's comm is said once, before its first call, and again when it changes.
    #[test]
    fn comms_are_said_when_new_or_changed() {
        let mut p = PerfParser::default();
        let mut out = vec![];
        for l in [
            "  10.000 ( 0.004 ms): redis-server/7 getpid() = 7",
            "  10.100 ( 0.004 ms): Web Content/9 getpid() = 9",
            "  10.200 ( 0.004 ms): redis-server/7 getpid() = 7",
            "  10.300 ( 0.004 ms): bio_aof/7 getpid() = 7",
        ] {
            p.feed(l.as_bytes(), &mut out);
        }
        let names: Vec<(Tid, &str)> = out
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Program(n) => Some((e.tid, &n[..])),
                _ => None,
            })
            .collect();
        assert_eq!(
            names,
            [(7, "redis-server"), (9, "Web Content"), (7, "bio_aof")]
        );
        assert_eq!(p.named, 3);
        assert!(matches!(out[0].kind, EventKind::Program(_)));
    }
}
