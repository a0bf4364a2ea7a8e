//! The halves of calls strace prints in pieces: an unfinished entry waiting per thread for
//! its resumed half, a call strace let go of (`<detached ...>`), an exit that ends a pending
//! `exit_group`, and entries that never see their end. One small function per body shape.

use super::body::Tail;
use super::StraceParser;
use crate::event::{DurSource, Event, EventKind, InFlight, Nanos, Syscall, Tid};
use crate::source::scan::lossy;

/// A partial call waiting for its resumed half.
#[derive(Debug)]
pub(super) struct Pending {
    ts: Nanos,
    line: u64,
    sc: Syscall,
}

impl StraceParser {
    /// A finished call on one line.
    #[inline]
    pub(super) fn call(
        &mut self,
        tid: Tid,
        ts: Nanos,
        line_no: u64,
        (name, args, tail): (&[u8], &[u8], Tail<'_>),
        out: &mut Vec<Event>,
    ) {
        let facts = self.names.get(name);
        // Built in place in `out`: moving an event from the stack into the vector was a
        // visible share of the hot path.
        out.push(Event {
            tid,
            ts,
            line: line_no,
            kind: EventKind::Syscall(Syscall::with(facts.name, facts.sys)),
        });
        let Some(Event {
            kind: EventKind::Syscall(sc),
            ..
        }) = out.last_mut()
        else {
            return;
        };
        super::args::extract_args_named(sc, facts, args);
        finish(sc, &tail);
        self.opened(sc);
        self.shape.dur |= tail.dur.is_some();
    }

    /// What every call seen from its entry tells: a `restart_syscall` was blocked when
    /// tracing began; `-y`/`-yy` annotations name the trace's options.
    #[inline]
    fn opened(&mut self, sc: &mut Syscall) {
        if sc.name == "restart_syscall" {
            sc.in_flight = Some(InFlight::AtStart);
        }
        if let Some(p) = &sc.fd_path {
            self.shape.annotation = true;
            self.shape.yy |= p.contains("->");
        }
    }

    /// `name(args <unfinished ...>`: waits for its resumed half.
    pub(super) fn unfinished(
        &mut self,
        tid: Tid,
        ts: Nanos,
        start_line: u64,
        (name, args): (&[u8], &[u8]),
        out: &mut Vec<Event>,
    ) {
        let facts = self.names.get(name);
        let mut sc = Syscall::with(facts.name, facts.sys);
        super::args::extract_args_named(&mut sc, facts, args);
        self.opened(&mut sc);
        sc.start_line = Some(start_line);
        self.park(
            tid,
            Pending {
                ts,
                line: start_line,
                sc,
            },
            out,
        );
    }

    /// `name(args <detached ...>` (or a cut-off last line): strace let go while the call
    /// ran; like an unfinished half that never resumes, it is timed up to the last event.
    pub(super) fn detached(
        &mut self,
        tid: Tid,
        ts: Nanos,
        (start_line, line_no): (u64, u64),
        (name, args): (&[u8], &[u8]),
        out: &mut Vec<Event>,
    ) {
        let facts = self.names.get(name);
        let mut sc = Syscall::with(facts.name, facts.sys);
        super::args::extract_args_named(&mut sc, facts, args);
        sc.in_flight = Some(InFlight::AtEnd);
        sc.start_line = Some(start_line);
        self.park(
            tid,
            Pending {
                ts,
                line: line_no,
                sc,
            },
            out,
        );
    }

    /// Keeps a partial call for its thread. A thread whose previous call never resumed
    /// has started a new one: that one ended unseen, and is kept, marked in flight.
    fn park(&mut self, tid: Tid, p: Pending, out: &mut Vec<Event>) {
        let ts = p.ts;
        if let Some(prev) = self.pending.insert(tid, p) {
            out.push(dangling_event(tid, prev, ts));
        }
    }

    /// `<... name resumed>rest) = ret`: stitched to its entry half when the thread has one.
    pub(super) fn resumed(
        &mut self,
        tid: Tid,
        ts: Nanos,
        line_no: u64,
        (name, rest, tail): (&[u8], &[u8], Option<Tail<'_>>),
        out: &mut Vec<Event>,
    ) {
        let facts = self.names.get(name);
        let name = facts.name;
        let (mut sc, start_ts, entry_line) = match self.pending.remove(&tid) {
            Some(p) if p.sc.name == name => (p.sc, p.ts, Some(p.line)),
            other => {
                if let Some(p) = other {
                    out.push(dangling_event(tid, p, ts));
                }
                // No entry half: the call was already running when tracing began.
                // Whatever arguments the resumed half shows are all we know.
                let mut sc = Syscall::with(name, facts.sys);
                super::args::extract_args_named(&mut sc, facts, rest);
                sc.in_flight = Some(InFlight::AtStart);
                (sc, ts, None)
            }
        };
        if sc.data().is_none() && facts.sys.args == crate::syscalls::ArgKind::Data {
            super::args::data_from(&mut sc, rest);
        }
        let Some(tail) = tail else {
            // Resumed and interrupted again (`<... x resumed> <unfinished ...>`).
            self.pending.insert(
                tid,
                Pending {
                    ts: start_ts,
                    line: entry_line.unwrap_or(line_no),
                    sc,
                },
            );
            return;
        };
        finish(&mut sc, &tail);
        let start = match (entry_line, tail.dur) {
            (Some(_), _) => start_ts,
            // With -T strace times the call from the attach: place it there.
            (None, Some(d)) => ts - d,
            // No entry half and no -T: running at least since the trace began.
            (None, None) => self.clock.first.unwrap_or(ts).min(ts),
        };
        if tail.dur.is_some() {
            self.shape.dur = true;
        } else {
            sc.dur = Some((ts - start).max(0));
            sc.dur_src = DurSource::Paired;
        }
        sc.start_line = entry_line;
        out.push(Event {
            tid,
            ts: start,
            line: line_no,
            kind: EventKind::Syscall(sc),
        });
    }

    /// `+++ exited with N +++` / `+++ killed by SIG +++`: ends the thread's pending call.
    pub(super) fn exit(
        &mut self,
        tid: Tid,
        ts: Nanos,
        line_no: u64,
        kind: EventKind,
        out: &mut Vec<Event>,
    ) {
        if let Some(p) = self.pending.remove(&tid) {
            // `exit_group(0) <unfinished ...>` then `+++ exited`: the call ended here.
            let mut sc = p.sc;
            if sc.name == "exit_group" || sc.name == "exit" {
                sc.dur = Some((ts - p.ts).max(0));
                sc.dur_src = DurSource::Paired;
                sc.start_line = Some(p.line);
                out.push(Event {
                    tid,
                    ts: p.ts,
                    line: line_no,
                    kind: EventKind::Syscall(sc),
                });
            } else {
                out.push(dangling_event(tid, Pending { sc, ..p }, ts));
            }
        }
        out.push(Event {
            tid,
            ts,
            line: line_no,
            kind,
        });
    }

    /// End of input: calls that never resumed are in flight at the end, in line order.
    pub(super) fn flush_pending(&mut self, out: &mut Vec<Event>) {
        let mut rest: Vec<(Tid, Pending)> = self.pending.drain().collect();
        rest.sort_by_key(|(_, p)| p.line);
        let end = self.last_ts;
        for (tid, p) in rest {
            out.push(dangling_event(tid, p, end));
        }
    }
}

/// An entry half that never saw its end: in flight at the end, known part up to `until`.
fn dangling_event(tid: Tid, p: Pending, until: Nanos) -> Event {
    let mut sc = p.sc;
    sc.in_flight = Some(InFlight::AtEnd);
    sc.dur = Some((until - p.ts).max(0));
    sc.dur_src = DurSource::Paired;
    Event {
        tid,
        ts: p.ts,
        line: p.line,
        kind: EventKind::Syscall(sc),
    }
}

/// Result, `-T` duration and `-y` annotation of the result onto the call.
fn finish(sc: &mut Syscall, tail: &Tail<'_>) {
    sc.ret = tail.ret;
    if let Some(d) = tail.dur {
        sc.dur = Some(d);
        sc.dur_src = DurSource::Measured;
    }
    if let Some(p) = tail.ret_path {
        sc.ret_path = Some(lossy(p));
    }
}
