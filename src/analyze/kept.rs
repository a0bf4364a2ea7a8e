//! Kept stalls: the step from stored candidates to the report's stall rows, once roles are
//! final (`finish`) or as good as they get (live printing). A candidate is a stall if its
//! thread's role says so (`stalls::keep`) and a select/poll loop does not make it an idle
//! wait; a stall of a thread that serves no client held no command up. Each row joins the
//! candidate, what it held (the holds unit), its cause (findings) and the names of the
//! commands it held, looked up here and only here.

use super::commands::{CmdId, CmdNames};
use super::findings::{self, Evidence};
use super::holds::{Held, Holds};
use super::roles::Role;
use super::stalls::{self, Cand, Stalls};
use super::world::World;
use crate::event::{InFlight, Nanos, Tid};
use crate::report::{FindingId, Parked, Stall, StallKind};
use crate::source::Clock;

/// The stalls of a report, in order: `stalls[i]` is the row of `cands[i]`, which held
/// `held[i]`.
#[derive(Default)]
pub(crate) struct Rows<'s> {
    pub(crate) cands: Vec<&'s Cand>,
    pub(crate) held: Vec<Held>,
    pub(crate) stalls: Vec<Stall>,
}

/// What deciding and writing stall rows reads.
pub(crate) struct Kept<'a> {
    pub(crate) world: &'a World,
    pub(crate) holds: &'a Holds,
    /// Command ids to names, for what each stall held up.
    pub(crate) names: &'a CmdNames,
    pub(crate) evidence: &'a Evidence<'a>,
    pub(crate) clock: &'a Clock,
    /// The trace's first timestamp: rows are stamped from it.
    pub(crate) first: Nanos,
}

impl Kept<'_> {
    /// Gaps can be trusted (no verdict against them).
    fn gaps_ok(&self) -> bool {
        self.evidence.gaps.is_none()
    }

    /// A stored candidate with what it held and the command it ran (`Held::ran`), if it is
    /// a stall on current roles.
    fn kept(&self, c: &Cand, held: Held) -> Option<(Held, Role)> {
        // Another program's waits (a whole-machine trace) are not redis's stalls.
        if self.world.other_program(c.tid).is_some() {
            return None;
        }
        let role = self.world.role(c.tid);
        // A trace missing some calls but not its event loop's waits: a main-thread gap that
        // client commands waited through is a stall whatever the thread did in it.
        let held_through = c.kind == StallKind::Gap
            && role == Role::Main
            && held.waiting > 0
            && self.evidence.gaps.is_some_and(|v| v.loop_traced());
        if !stalls::keep(c, role, self.gaps_ok() || held_through) {
            return None;
        }
        // An I/O thread parks on a mutex while there is no work (`World::observe` could
        // know its role only once it had done client I/O).
        if c.dur_facts.waits == super::call::Waits::Lock && role == Role::IoThread {
            return None;
        }
        // A gap of a thread that is no role of redis's and never served anyone (a language
        // runtime's helper: GC, JIT, timers) is its own work, unless another thread waited
        // through it for the futex wake that ended it (`Woke`).
        if c.kind == StallKind::Gap
            && role == Role::Other
            && !self.world.serves(c.tid)
            && !c.through.woke.is_some_and(|w| w.waited)
        {
            return None;
        }
        // A process that never waits in epoll waits for work in select/poll: idle there.
        if c.kind == StallKind::SlowSyscall
            && c.dur_facts.waits == super::call::Waits::AsNamed
            && c.syscall
                .is_some_and(|n| crate::syscalls::info(n).facts.has(super::call::Facts::POLL))
            && self.world.loop_is_poll(c.proc)
        {
            return None;
        }
        let mut held = held;
        // A command's read and reply, and the stall, are each known to a tick at best: that
        // one held the other is a guess (every command of the same second would match).
        let unknowable = self.evidence.gaps.is_some_and(|v| v.coarse());
        if unknowable || !matches!(role, Role::Main | Role::IoThread) {
            held.client_facing_only();
        }
        (held.ran, held.ran_or) = self.ran(c, &held);
        Some((held, role))
    }

    /// The stored candidates at these indices that are stalls, as rows (live printing).
    pub(crate) fn rows_at(&self, stalls: &Stalls, idx: &[usize]) -> Vec<Stall> {
        idx.iter()
            .filter_map(|i| {
                let c = stalls.get(*i);
                let (h, role) = self.kept(c, self.holds.held(*i))?;
                Some(self.row(c, &h, role))
            })
            .collect()
    }

    /// Every stored candidate that is a stall, with what it held (`held`, by index, as
    /// `Holds::take_all` gives it) and its row, sorted by (start, tid).
    pub(crate) fn all<'s>(&self, stalls: &'s Stalls, mut held: Vec<Held>) -> Rows<'s> {
        // The candidates are put in order as small keys first, so that each row is written
        // once, where it stays: sorting the rows (~750 bytes apiece) moved each a dozen
        // times, and reordering them after they were made moved each into fresh memory
        // again, whose page faults were most of the report's time. The index breaks ties
        // as the stable order of the stored candidates did.
        let mut order: Vec<(Nanos, Tid, usize)> =
            stalls.iter().map(|(i, c)| (c.start, c.tid, i)).collect();
        order.sort_unstable();
        let mut rows = Rows {
            cands: Vec::with_capacity(order.len()),
            held: Vec::with_capacity(order.len()),
            stalls: Vec::with_capacity(order.len()),
        };
        let mut named = Named::default();
        for (_, _, i) in order {
            let c = stalls.get(i);
            let h = held.get_mut(i).map(std::mem::take).unwrap_or_default();
            if let Some((h, role)) = self.kept(c, h) {
                named.note(rows.stalls.len(), c, &h);
                rows.stalls.push(self.row(c, &h, role));
                rows.held.push(h);
                rows.cands.push(c);
            }
        }
        for i in named.finished() {
            let (c, h) = (rows.cands[i], &mut rows.held[i]);
            (h.finished, h.ran) = (h.ran, None);
            h.ran_or.clear();
            rows.stalls[i] = self.row(c, h, self.world.role(c.tid));
        }
        rows
    }

    /// The calls cut by the trace's edges below the threshold that are stalls, as rows.
    pub(crate) fn in_flight(&self, stalls: &Stalls) -> Vec<Stall> {
        stalls
            .in_flight_small()
            .iter()
            .filter_map(|c| {
                let (h, role) = self.kept(c, Held::default())?;
                Some(self.row(c, &h, role))
            })
            .collect()
    }

    /// Calls still blocked at the end that are waits for work on the final roles (those
    /// that were waits when made, and those that were not but are now), as `parked_at_end`
    /// rows; and the waits when made that are not one on the final role, as in-flight rows.
    pub(crate) fn parked(&self, stalls: &Stalls) -> (Vec<Stall>, Vec<Parked>) {
        let mut in_flight = vec![];
        let mut parked: Vec<&Cand> = vec![];
        let ours = |c: &&Cand| self.world.other_program(c.tid).is_none();
        for c in stalls.parked().iter().filter(ours) {
            match self.kept(c, Held::default()) {
                Some((h, role)) => in_flight.push(self.row(c, &h, role)),
                None => parked.push(c),
            }
        }
        parked.extend(
            stalls
                .in_flight_small()
                .iter()
                .chain(stalls.iter().map(|(_, c)| c))
                .filter(|c| c.dur_facts.in_flight == Some(InFlight::AtEnd))
                .filter(|c| c.kind == StallKind::SlowSyscall)
                .filter(ours)
                .filter(|c| self.kept(c, Held::default()).is_none()),
        );
        parked.sort_by_key(|c| (c.tid, c.start));
        let rows = parked
            .into_iter()
            .map(|c| self.parked_row(c, self.world.role(c.tid)))
            .collect();
        (in_flight, rows)
    }

    /// The report's row for a call still blocked at the end in a wait for work.
    fn parked_row(&self, c: &Cand, role: Role) -> Parked {
        let info = c.file.map(|f| self.world.file(f));
        Parked {
            ts: self.clock.format(c.start),
            at_us: (c.start - self.first) / 1000,
            pid: self.world.pid_of(c.proc, c.tid),
            tid: c.tid,
            thread: role,
            syscall: c.syscall.unwrap_or("?").to_string(),
            fd: c.fd,
            path: info.and_then(|i| i.path.as_deref().map(str::to_string)),
            class: info.map(|i| i.class),
            known_us: c.dur / 1000,
            line: c.line,
        }
    }

    /// The command a stall's thread ran through it, when it can be told. With I/O threads
    /// the request of the command a gap ran may have been read inside it, by an I/O thread
    /// (`Held::across_threads`), with the others it may as well have run.
    fn ran(&self, c: &Cand, held: &Held) -> (Option<CmdId>, Vec<CmdId>) {
        // Every request read had been answered when it began, and none read later awaited
        // its reply when it ended: the commands it held came in during it, read after it.
        if c.through.no_command == Some(stalls::NoCommand::Answered)
            && findings::answered_holds(self.evidence, c)
        {
            return (None, vec![]);
        }
        // redis 8's I/O thread may have read the whole batch before the gap and slept in its
        // own loop through it (no cover): the batch is the same.
        if c.through.io.is_some() || self.world.has_io_threads(c.proc) {
            held.across_threads()
                .map_or((None, vec![]), |(n, or)| (Some(n), or))
        } else {
            (held.running(), vec![])
        }
    }

    /// The report's row for a kept stall.
    fn row(&self, c: &Cand, held: &Held, role: Role) -> Stall {
        let info = c.file.map(|f| self.world.file(f));
        // Cleared where it had finished before this stall began (`Named`).
        let running = held
            .ran
            .map(|k| super::holds::one_of(self.names, k, &held.ran_or));
        let (mut finding, mut cause) =
            findings::explain(self.evidence, c, role, running.as_deref());
        if let Some(k) = held
            .finished
            .filter(|_| finding == Some(FindingId::Command))
        {
            (finding, cause) = findings::after_its_command(c, self.names.name(k));
        }
        Stall {
            ts: self.clock.format(c.start),
            ts_iso: self.clock.iso(c.start),
            at_us: (c.start - self.first) / 1000,
            who: crate::report::ThreadRef {
                pid: self.world.pid_of(c.proc, c.tid),
                tid: c.tid,
                thread: role,
            },
            kind: c.kind,
            syscall: c.syscall.map(str::to_string),
            target: crate::report::FdRef {
                fd: c.fd,
                path: info.and_then(|i| i.path.as_deref().map(str::to_string)),
                class: info.map(|i| i.class),
            },
            duration_us: c.dur / 1000,
            line: c.line,
            cause,
            finding,
            bound: c.dur_facts.bound,
            duration_known: c.dur_facts.known,
            in_flight: c.dur_facts.in_flight,
            waiting: crate::report::Waiting {
                commands: held.waiting,
                by_command: held
                    .by_cmd
                    .iter()
                    .map(|(k, v, _)| (self.names.name(*k).to_string(), *v))
                    .collect(),
                clients: held.clients.len() as u64,
                worst_us: held.worst_wait.map(|w| w / 1000),
            },
            phase: c.phase,
            events_lost: c.events_lost,
            sched: c.sched.map(|d| crate::report::StallSched {
                since_attach: c.dur_facts.in_flight == Some(InFlight::AtStart),
                io_threads_runnable_us: findings::io_wait_of(self.evidence, c, role)
                    .filter(|v| v.sched)
                    .map(|v| v.runnable / 1000),
                ..crate::report::StallSched::of(&d, c.dur)
            }),
            quiet_calls: (c.through.calls > 0).then_some(c.through.calls),
            redis_evidence: None,
        }
    }
}

/// The commands that stalls named as the one their thread ran, one command each (its
/// sequence number), for `finished`: a command is named for its own stall (the longest
/// that named it), not for a gap of the same thread that began after that stall had ended
/// (valkey 9: the 28 ms the main thread took after DEBUG SLEEP's 329 ms `clock_nanosleep`
/// was "a slow command (DEBUG)"), since nothing shows it still ran there: its reply,
/// written after, shows no more (every command's reply is). A script that makes a slow
/// call of its own midway is what this misses (its gap after the call is no longer named);
/// quiet calls (`Through`) do not split its gap.
#[derive(Default)]
struct Named {
    /// (row, thread, command's sequence number, the stall's start and end, it is a gap).
    rows: Vec<(usize, Tid, u64, Nanos, Nanos, bool)>,
}

impl Named {
    /// Row `row`, of `c`, named `held.ran`.
    fn note(&mut self, row: usize, c: &Cand, held: &Held) {
        // A name the trace cannot tell from others stands for no one command.
        let sure = held.ran.filter(|_| held.ran_or.is_empty());
        if let Some(seq) = sure.and_then(|k| held.lone_seq(k)) {
            let gap = c.kind == StallKind::Gap;
            self.rows
                .push((row, c.tid, seq, c.start, c.start + c.dur, gap));
        }
    }

    /// The rows of gaps that began after their named command's own stall had ended.
    fn finished(&self) -> Vec<usize> {
        // Each command's longest stall: (duration, end).
        let mut own: rustc_hash::FxHashMap<(Tid, u64), (Nanos, Nanos)> = Default::default();
        for r in &self.rows {
            let e = own.entry((r.1, r.2)).or_insert((r.4 - r.3, r.4));
            if r.4 - r.3 > e.0 {
                *e = (r.4 - r.3, r.4);
            }
        }
        self.rows
            .iter()
            .filter(|r| r.5 && own.get(&(r.1, r.2)).is_some_and(|o| o.1 <= r.3))
            .map(|r| r.0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::call::testing::event;
    use crate::analyze::commands::CmdNames;
    use crate::analyze::file_time::FileTime;
    use crate::analyze::holds::DoneCmd;
    use crate::analyze::phases::Phases;
    use crate::event::Event;
    use crate::fdtable::ProcKey;

    const MS: Nanos = 1_000_000;

    /// Pushes calls through the world, the stall store and the holds join, as `on_syscall`
    /// does, and returns the rows kept at the end.
    fn rows(calls: &[Event], names: &[(u32, &str)], answered: &[DoneCmd]) -> Vec<Stall> {
        let mut world = World::new(Some(100), Default::default(), None);
        for (tid, n) in names {
            world.set_name(*tid, n);
        }
        let (phases, file_time) = (Phases::default(), FileTime::default());
        let mut stalls = Stalls::new(10 * MS, 8);
        let mut holds = Holds::new(16, 4);
        for e in calls {
            let cx = world.observe(e, e.syscall().unwrap());
            let step = stalls.on_call(&cx, &phases, false, || None);
            for a in step.added.into_iter().flatten() {
                holds.on_stall(a);
            }
        }
        for d in answered {
            holds.on_answered(d.clone());
        }
        world.finish();
        let held = holds.take_all();
        let ev = Evidence::plain(&phases, &file_time, &world);
        let clock = Clock::none();
        // The commands unit's names: SET is the first one read.
        let mut names = CmdNames::default();
        names.intern(b"SET");
        let kept = Kept {
            world: &world,
            holds: &holds,
            names: &names,
            evidence: &ev,
            clock: &clock,
            first: 0,
        };
        kept.all(&stalls, held).stalls
    }

    /// A command's own stall (DEBUG SLEEP's 300 ms sleep), then a 30 ms gap of the same
    /// thread before its next call, both before the command's reply: the gap is not
    /// named after the command whose stall had ended (valkey9-io2: "a slow command
    /// (DEBUG)" twice after the sleep), nor called a slow command.
    #[test]
    fn a_gap_after_a_commands_own_stall_is_not_named_after_it() {
        let set = CmdNames::default().intern(b"SET");
        let slept = DoneCmd {
            seq: 1,
            name: set,
            conn: (ProcKey::Root, 9),
            req: 0,
            read: 0,
            reply: 400 * MS,
        };
        let calls = [
            event(100, 0, MS, "epoll_wait"),
            event(100, MS, 300 * MS, "clock_nanosleep"),
            event(100, 331 * MS, MS, "getpeername"),
            event(100, 332 * MS, MS, "epoll_wait"),
        ];
        let got = rows(&calls, &[], &[slept]);
        let gap = got
            .iter()
            .find(|s| s.kind == StallKind::Gap)
            .expect("the gap");
        assert_eq!(gap.finding, None, "{}", gap.cause);
        assert!(
            gap.cause.contains("after SET's own stall had ended"),
            "{}",
            gap.cause
        );
        let sleep = got
            .iter()
            .find(|s| s.kind == StallKind::SlowSyscall)
            .unwrap();
        assert_eq!(sleep.waiting.commands, 1);
    }

    #[test]
    fn a_slow_poll_is_idle_where_poll_is_the_event_loop() {
        let slow_poll = event(100, 0, 50 * MS, "poll");
        // The process waits in poll and never in epoll: poll is where it waits for work.
        assert!(rows(std::slice::from_ref(&slow_poll), &[], &[]).is_empty());
        // Beside an epoll loop, the main thread's poll is a stall (synchronous I/O).
        let epoll = event(100, 55 * MS, MS, "epoll_wait");
        let got = rows(&[slow_poll, epoll], &[], &[]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].syscall.as_deref(), Some("poll"));
    }

    #[test]
    fn only_client_facing_threads_hold_commands_up() {
        let set = CmdNames::default().intern(b"SET");
        let during = DoneCmd {
            seq: 1,
            name: set,
            conn: (ProcKey::Root, 9),
            req: 5 * MS,
            read: 5 * MS,
            reply: 40 * MS,
        };
        let calls = [
            event(100, 0, 30 * MS, "fdatasync"),
            event(101, 0, 30 * MS, "fdatasync"),
        ];
        let got = rows(&calls, &[(101, "bio_aof")], &[during]);
        let held: Vec<(u32, u64)> = got
            .iter()
            .map(|s| (s.who.tid, s.waiting.commands))
            .collect();
        assert_eq!(held, vec![(100, 1), (101, 0)]);
    }
}
