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
    /// A finished call on one line, out of line (the general path's two callers).
    #[inline(never)]
    pub(super) fn call_general(
        &mut self,
        tid: Tid,
        ts: Nanos,
        line_no: u64,
        parts: (&[u8], &[u8], Tail<'_>),
        out: &mut Vec<Event>,
    ) {
        self.call(tid, ts, line_no, parts, out)
    }

    /// A finished call on one line: inline in the fast path.
    #[inline(always)]
    pub(super) fn call(
        &mut self,
        tid: Tid,
        ts: Nanos,
        line_no: u64,
        (name, args, tail): (&[u8], &[u8], Tail<'_>),
        out: &mut Vec<Event>,
    ) {
        let facts = self.names.get(name);
        if out.len() == out.capacity() {
            out.reserve(1);
        }
        let len = out.len();
        // Built in place in the batch's spare room: `push` built the ~280-byte event on the
        // stack and copied it into the vector, a visible share of the hot path.
        let ev = out.spare_capacity_mut()[0].write(Event {
            tid,
            ts,
            line: line_no,
            kind: EventKind::Syscall(Syscall::with(facts.name, facts.sys)),
        });
        if let EventKind::Syscall(sc) = &mut ev.kind {
            super::args::extract_args_hot(sc, facts, args);
            finish(sc, &tail);
            self.opened(sc);
        }
        // SAFETY: the slot at `len` is inside the capacity reserved above and was
        // initialized by `write`; a panic before this line leaks the event, never drops it
        // twice.
        unsafe { out.set_len(len + 1) };
        self.shape.dur |= tail.dur.is_some();
    }

    /// What every call seen from its entry tells: a `restart_syscall` was blocked when
    /// tracing began; `-y`/`-yy` annotations name the trace's options.
    #[inline]
    fn opened(&mut self, sc: &mut Syscall) {
        if sc.sys.args == crate::syscalls::ArgKind::Restart {
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
            out.push(dangling_event(tid, prev, ts, self.broken_line));
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
                    out.push(dangling_event(tid, p, ts, self.broken_line));
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
            // No entry half and no -T: running at least since the trace began, or since
            // the last line that could not be read (which may have been its entry).
            (None, None) => self
                .clock
                .first
                .unwrap_or(ts)
                .max(self.broken_at.unwrap_or(Nanos::MIN))
                .min(ts),
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
            if sc.sys.facts.has(crate::syscalls::Facts::EXIT) {
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
                out.push(dangling_event(
                    tid,
                    Pending { sc, ..p },
                    ts,
                    self.broken_line,
                ));
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
            out.push(dangling_event(tid, p, end, self.broken_line));
        }
    }
}

/// An entry half that never saw its end: in flight at the end, known part up to `until`,
/// unless a line that could not be read (`broken_line`) came after it: that line may have
/// been its end, so how long it ran is unknown.
fn dangling_event(tid: Tid, p: Pending, until: Nanos, broken_line: u64) -> Event {
    let mut sc = p.sc;
    sc.in_flight = Some(InFlight::AtEnd);
    if broken_line <= p.line {
        sc.dur = Some((until - p.ts).max(0));
        sc.dur_src = DurSource::Paired;
    }
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

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    /// `-o FILE -f` pair: fd/args from the first half, result and duration from the second.
    #[test]
    fn unfinished_and_resumed_are_stitched() {
        let got = run(&[
            "9380  22:38:54.938004 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD <unfinished ...>",
            "9380  22:38:54.942997 <... clone resumed>, child_tidptr=0x7fbbb94d6510) = 9569 <0.004986>",
        ]);
        assert_eq!(
            got,
            vec![
                call(9380, tod(22, 38, 54, 938_004), 2, "clone")
                    .extra(Extra::Clone { thread: false })
                    .val(9569)
                    .measured(4_986 * US)
                    .start_line(1)
                    .0
            ]
        );
    }

    /// Two threads interleaved on the same fd (everysec-dd-yy lines 131-136), -yy.
    #[test]
    fn pairs_are_stitched_per_thread() {
        let got = run(&[
            r#"11461 22:41:06.814855 write(9<TCP:[127.0.0.1:6394->127.0.0.1:36610]>, "+OK\r\n", 5 <unfinished ...>"#,
            "11467 22:41:06.814891 fdatasync(7</var/lib/redis-lab/s5/everysec-dd-yy/appendonlydir/appendonly.aof.1.incr.aof> <unfinished ...>",
            "11461 22:41:06.815026 <... write resumed>) = 5 <0.000152>",
            "11461 22:41:06.815047 epoll_wait(5<anon_inode:[eventpoll]>,  <unfinished ...>",
            "11467 22:41:06.815345 <... fdatasync resumed>) = 0 <0.000423>",
        ]);
        assert_eq!(
            got,
            vec![
                call(11461, tod(22, 41, 6, 814_855), 3, "write")
                    .fd(9)
                    .fd_path("TCP:[127.0.0.1:6394->127.0.0.1:36610]")
                    .data(b"+OK\r\n", false)
                    .val(5)
                    .measured(152 * US)
                    .start_line(1)
                    .0,
                call(11467, tod(22, 41, 6, 814_891), 5, "fdatasync")
                    .fd(7)
                    .fd_path(
                        "/var/lib/redis-lab/s5/everysec-dd-yy/appendonlydir/appendonly.aof.1.incr.aof"
                    )
                    .val(0)
                    .measured(423 * US)
                    .start_line(2)
                    .0,
                // Never resumed: in flight at the end, known part up to the last event.
                call(11461, tod(22, 41, 6, 815_047), 4, "epoll_wait")
                    .fd(5)
                    .fd_path("anon_inode:[eventpoll]")
                    .dur(
                        tod(22, 41, 6, 815_345) - tod(22, 41, 6, 815_047),
                        DurSource::Paired
                    )
                    .in_flight(InFlight::AtEnd)
                    .start_line(4)
                    .0,
            ]
        );
    }

    /// Without -T a pair still has a duration: entry line to resumed line.
    #[test]
    fn pair_without_dur_is_timed_from_its_halves() {
        let got = run(&[
            "[pid  8169] 22:38:13.918972 wait4(-1,  <unfinished ...>",
            "[pid  8169] 22:38:13.921731 <... wait4 resumed>0x7ffd6cafbe94, WNOHANG, NULL) = 0",
        ]);
        assert_eq!(
            got,
            vec![
                call(8169, tod(22, 38, 13, 918_972), 2, "wait4")
                    .val(0)
                    .dur(2_759 * US, DurSource::Paired)
                    .start_line(1)
                    .0
            ]
        );
    }

    /// Aligned resumed half with a blank before `)` and a comment after the result.
    #[test]
    fn aligned_resumed_half() {
        let got = run(&[
            "[pid  1905] select(0, NULL, NULL, NULL, {0, 198904} <unfinished ...>",
            "[pid 23966] ftruncate(28, 25165824)     = 0",
            "[pid  1905] <... select resumed> )      = 0 (Timeout)",
        ]);
        assert_eq!(
            got,
            vec![
                call(23966, 0, 2, "ftruncate").fd(28).val(0).0,
                call(1905, 0, 3, "select")
                    .val(0)
                    .dur(0, DurSource::Paired)
                    .start_line(1)
                    .0,
            ]
        );
    }

    /// README lines 11-12: a thread blocked when strace attached starts with restart_syscall.
    #[test]
    fn restart_syscall_is_in_flight_at_start() {
        let got = run(&[
            "[pid  8176] 22:38:10.039239 restart_syscall(<... resuming interrupted read ...> <unfinished ...>",
            "[pid  8176] 22:38:19.531396 <... restart_syscall resumed>) = -1 ETIMEDOUT (Connection timed out) <9.492123>",
        ]);
        assert_eq!(
            got,
            vec![
                call(8176, tod(22, 38, 10, 39_239), 2, "restart_syscall")
                    .extra(Extra::Resumes("read"))
                    .ret(Ret::Err("ETIMEDOUT"))
                    .measured(9_492_123 * US)
                    .in_flight(InFlight::AtStart)
                    .start_line(1)
                    .0
            ]
        );
    }

    /// A resumed half with no entry half: the call was running when tracing began. With -T it
    /// is placed at resumed time minus its duration.
    #[test]
    fn resumed_without_entry_is_in_flight_at_start() {
        let got = run(&["[pid  7313] 22:37:41.094130 <... write resumed>) = 915 <0.000032>"]);
        assert_eq!(
            got,
            vec![
                call(7313, tod(22, 37, 41, 94_098), 1, "write")
                    .val(915)
                    .measured(32 * US)
                    .in_flight(InFlight::AtStart)
                    .0
            ]
        );
        // Without -T: known to run at least from the start of the trace.
        let got = run(&[
            "230473 02:47:48 getpid() = 230473",
            "230473 02:47:49 <... futex resumed>)    = ? <unavailable>",
        ]);
        assert_eq!(
            got,
            vec![
                call(230473, tod(2, 47, 48, 0), 1, "getpid").val(230473).0,
                call(230473, tod(2, 47, 48, 0), 2, "futex")
                    .dur(S, DurSource::Paired)
                    .in_flight(InFlight::AtStart)
                    .0,
            ]
        );
    }

    /// `<... x resumed> ... <unfinished ...>`: resumed and interrupted again.
    #[test]
    fn resumed_then_unfinished_again() {
        let got = run(&[
            "1700000052.321000 epoll_wait(4, <unfinished ...>",
            "1700000052.321500 <... epoll_wait resumed> {}, 64, 100 <unfinished ...>",
            "1700000052.322000 <... epoll_wait resumed> {}, 64, 100) = 1",
        ]);
        assert_eq!(
            got,
            vec![
                call(0, 1_700_000_052_321_000_000, 3, "epoll_wait")
                    .fd(4)
                    .val(1)
                    .dur(MS, DurSource::Paired)
                    .start_line(1)
                    .0
            ]
        );
    }

    /// `exit_group(0) <unfinished ...>` then `+++ exited`: the call ends with the process.
    #[test]
    fn exit_ends_a_pending_exit_group() {
        let got = run(&[
            "9569  22:38:57.152000 exit_group(0) <unfinished ...>",
            "9569  22:38:57.152275 +++ exited with 0 +++",
        ]);
        assert_eq!(
            got,
            vec![
                call(9569, tod(22, 38, 57, 152_000), 2, "exit_group")
                    .dur(275 * US, DurSource::Paired)
                    .start_line(1)
                    .0,
                ev(
                    9569,
                    tod(22, 38, 57, 152_275),
                    2,
                    EventKind::Exit {
                        code: Some(0),
                        signal: None
                    }
                ),
            ]
        );
    }

    /// A cut-off last line (strace killed mid-write): kept as a call in flight at the end.
    #[test]
    fn cut_off_last_line_is_in_flight_at_end() {
        let (got, skips) = run_lines(&[
            b"[pid  7313] 22:37:40.811000 getpid() = 7313 <0.000003>",
            b"[pid  7313] 22:37:40.811837 write(8, \"$4\\r\\ngo",
        ]);
        assert!(skips.is_empty());
        assert_eq!(
            got[1],
            call(7313, tod(22, 37, 40, 811_837), 2, "write")
                .fd(8)
                .data(b"$4\r\ngo", false)
                .in_flight(InFlight::AtEnd)
                .dur(0, DurSource::Paired)
                .start_line(2)
                .0
        );
        // Cut inside the timestamp or the name: nothing to read.
        let (got, skips) = run_lines(&[b"[pid  7313] 22:37:4"]);
        assert_eq!(got, vec![]);
        assert_eq!(skips.len(), 1);
    }
}
