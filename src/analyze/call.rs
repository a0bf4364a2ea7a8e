//! The per-event context of the analysis stage: `World::observe` resolves each finished
//! syscall once (which thread, which process, which file, what the thread is to redis) into a
//! `ResolvedCall`, and every unit reads that instead of asking the world again. Also the dense
//! thread index the units key their per-thread state by; the syscall facts come from the
//! shared syscall table.

use super::roles::Role;
use crate::event::{DurSource, Event, Nanos, Syscall, Tid};
use crate::fdtable::{FileClass, FileId, ProcKey};
use crate::report::Bound;

/// Dense, stable index of a thread (states are only appended), assigned by `World` on first
/// sight, so per-thread state lives in `Vec`s instead of hash maps.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub(crate) struct ThreadIdx(pub(crate) u32);

impl ThreadIdx {
    #[inline]
    pub(crate) fn get(self) -> usize {
        self.0 as usize
    }
}

/// Unit-private per-thread state indexed by `ThreadIdx`; grows only when a thread appears.
pub(crate) struct PerThread<T>(Vec<T>);

impl<T> Default for PerThread<T> {
    fn default() -> Self {
        PerThread(Vec::new())
    }
}

impl<T: Default> PerThread<T> {
    #[inline]
    pub(crate) fn at(&mut self, t: ThreadIdx) -> &mut T {
        let i = t.get();
        // The index checked once: after an out-of-line grow the compiler cannot know the
        // length, so `grow; &mut v[i]` checked it twice on every event.
        if i < self.0.len() {
            &mut self.0[i]
        } else {
            self.grow(i)
        }
    }
    /// A thread this unit sees for the first time: out of line, the per-event check stays
    /// a compare.
    #[cold]
    #[inline(never)]
    fn grow(&mut self, i: usize) -> &mut T {
        self.0.resize_with(i + 1, T::default);
        &mut self.0[i]
    }
    /// The state of a thread this unit may not have seen yet.
    #[inline]
    pub(crate) fn get(&self, t: ThreadIdx) -> Option<&T> {
        self.0.get(t.get())
    }
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.0.iter_mut()
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = (ThreadIdx, &T)> {
        self.0
            .iter()
            .enumerate()
            .map(|(i, s)| (ThreadIdx(i as u32), s))
    }
}

/// The analyzer's facts about a call come from the syscall table (`Syscall::sys`).
pub(crate) use crate::syscalls::Facts;

impl Facts {
    /// Whether a call of this name is waiting for work, not holding anyone up, in a thread
    /// of this role. A thread other than redis's main one parked in accept() (a
    /// thread-per-connection server's acceptor) waits for a connection, as one in read()
    /// waits for a request.
    #[inline]
    pub(crate) fn is_idle_in(self, role: Role) -> bool {
        self.has(Self::ALWAYS_IDLE)
            || (role != Role::Main
                && (self.has(Self::BG_WAIT)
                    || ((self.has(Self::READ) || self.has(Self::ACCEPT)) && role == Role::Other)))
    }
}

/// Waits that are idle time, not stalls, for a call name in a thread of this role (the
/// report builders ask by name at finish).
pub(crate) fn is_idle(name: &str, role: Role) -> bool {
    crate::syscalls::info(name).facts.is_idle_in(role)
}

/// The ResolvedEvent of DESIGN.md: one finished syscall with everything the units ask about
/// it, built once per event by `World::observe`. Copy, lives on the stack.
#[derive(Clone, Copy)]
pub(crate) struct ResolvedCall<'e> {
    pub(crate) ev: &'e Event,
    pub(crate) sc: &'e Syscall,
    pub(crate) tid: Tid,
    pub(crate) thread: ThreadIdx,
    /// Process key of the fd table and the report.
    pub(crate) proc: ProcKey,
    pub(crate) facts: Facts,
    /// As known at this event; report builders re-read final roles.
    pub(crate) role: Role,
    /// `facts.is_idle_in(role)`, unless the call waits for a lock or a reply (`waits`).
    pub(crate) idle: bool,
    /// What a wait waits for, when the trace shows it is not work.
    pub(crate) waits: Waits,
    pub(crate) file: Option<FileId>,
    pub(crate) class: Option<FileClass>,
    /// The fd it touched (an open: the one it returned).
    pub(crate) call_fd: Option<i32>,
    /// Duration, 0 when unknown (`timed` says which).
    pub(crate) dur: Nanos,
    pub(crate) timed: bool,
    pub(crate) end: Nanos,
}

/// What a call waits for, when the trace shows more than its name: a wait in a call that is
/// otherwise a wait for work (futex, poll, recv outside the main thread) can be neither.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Waits {
    /// As its name says.
    #[default]
    AsNamed,
    /// A lock another thread holds (`Extra::LockWait`).
    Lock,
    /// The reply to the request the thread had just sent on this fd (an outgoing
    /// connection): a wait in poll/select, or the read of the reply itself.
    Reply(i32),
}

impl ResolvedCall<'_> {
    #[inline]
    pub(crate) fn ts(&self) -> Nanos {
        self.ev.ts
    }
    #[inline]
    pub(crate) fn dur_src(&self) -> DurSource {
        self.sc.dur_src
    }
    pub(crate) fn bound(&self) -> Bound {
        bound_of(self.sc)
    }
    /// The input line, None when the source has none (live).
    pub(crate) fn line(&self) -> Option<u64> {
        (self.ev.line != 0).then_some(self.ev.line)
    }
}

pub(crate) fn bound_of(sc: &Syscall) -> Bound {
    if sc.in_flight.is_some() {
        Bound::AtLeast
    } else if sc.dur_src == DurSource::UpperBound {
        Bound::AtMost
    } else {
        Bound::Exact
    }
}

/// Test double in the style of ripgrep's `KitchenSink`: a resolved call built without a
/// `World`, so each unit is tested on its own.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::event::{EventKind, Ret};

    /// A measured call of thread `tid` (index `tid % 1000`) in the traced process.
    pub(crate) fn event(tid: Tid, ts: Nanos, dur: Nanos, name: &'static str) -> Event {
        let mut sc = Syscall::new(name);
        sc.dur = Some(dur);
        sc.dur_src = DurSource::Measured;
        sc.ret = Ret::Val(0);
        Event {
            tid,
            ts,
            line: 1,
            kind: EventKind::Syscall(sc),
        }
    }

    pub(crate) fn call<'e>(
        ev: &'e Event,
        role: Role,
        class: Option<FileClass>,
    ) -> ResolvedCall<'e> {
        let sc = ev.syscall().expect("a syscall event");
        let facts = sc.sys.facts;
        let dur = sc.dur.unwrap_or(0);
        ResolvedCall {
            ev,
            sc,
            tid: ev.tid,
            thread: ThreadIdx(ev.tid % 1000),
            proc: ProcKey::Root,
            facts,
            role,
            idle: facts.is_idle_in(role),
            waits: Waits::AsNamed,
            file: class.map(|c| c as FileId),
            class,
            call_fd: sc.fd,
            dur,
            timed: sc.dur.is_some(),
            end: ev.ts + dur,
        }
    }
}
