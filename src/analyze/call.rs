//! The per-event context of the analysis stage: `World::observe` resolves each finished
//! syscall once (which thread, which process, which file, what the thread is to redis) into a
//! `ResolvedCall`, and every unit reads that instead of asking the world again. Also the dense
//! thread index the units key their per-thread state by, and the syscall name facts (until
//! the shared syscall table replaces them).

use super::roles::Role;
use crate::event::{DurSource, Event, Nanos, Syscall, Tid};
use crate::fdtable::{FileClass, FileId};
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
        if i >= self.0.len() {
            self.0.resize_with(i + 1, T::default);
        }
        &mut self.0[i]
    }
    /// The state of a thread this unit may not have seen yet.
    #[inline]
    pub(crate) fn get(&self, t: ThreadIdx) -> Option<&T> {
        self.0.get(t.get())
    }
    pub(crate) fn iter(&self) -> impl Iterator<Item = (ThreadIdx, &T)> {
        self.0
            .iter()
            .enumerate()
            .map(|(i, s)| (ThreadIdx(i as u32), s))
    }
}

/// What the analysis asks about a syscall name, decided once per name (`World` caches it by
/// the interned name's address): the hot path would otherwise compare strings a dozen times
/// per event.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) struct Facts(u16);

impl Facts {
    /// Waits that are idle in any thread (the event loop's), and exits: a process tearing
    /// down its address space holds no one up.
    pub(crate) const ALWAYS_IDLE: u16 = 1;
    /// Waits that are idle outside the main thread.
    pub(crate) const BG_WAIT: u16 = 1 << 1;
    pub(crate) const READ: u16 = 1 << 2;
    pub(crate) const EPOLL: u16 = 1 << 3;
    pub(crate) const FSYNC: u16 = 1 << 4;
    pub(crate) const CLOSE: u16 = 1 << 5;
    /// read/write/writev: evidence of a thread doing client I/O.
    pub(crate) const CLIENT_RW: u16 = 1 << 6;
    pub(crate) const EXIT: u16 = 1 << 7;
    pub(crate) const ACCEPT: u16 = 1 << 8;
    pub(crate) const OPEN: u16 = 1 << 9;
    pub(crate) const WAIT_CHILD: u16 = 1 << 10;
    /// Calls by which a child shows what it writes.
    pub(crate) const WRITES: u16 = 1 << 11;
    pub(crate) const RECV: u16 = 1 << 12;
    pub(crate) const SEND: u16 = 1 << 13;

    pub(crate) fn of(name: &str) -> Facts {
        let f = match name {
            "epoll_wait" | "epoll_pwait" | "epoll_pwait2" => Self::ALWAYS_IDLE | Self::EPOLL,
            // A continuation of a timed wait interrupted before tracing began.
            "restart_syscall" => Self::ALWAYS_IDLE,
            // In a background thread these wait for work; redis's main thread never sleeps
            // or polls while idle (its loop waits in epoll), so there they hold every client:
            // DEBUG SLEEP, a module's sleep, or synchronous I/O such as MIGRATE or a
            // replication handshake (poll with a timeout).
            "poll" | "ppoll" | "select" | "pselect6" | "nanosleep" | "clock_nanosleep"
            | "pause" | "rt_sigtimedwait" | "rt_sigsuspend" => Self::BG_WAIT,
            "exit" | "exit_group" => Self::ALWAYS_IDLE | Self::EXIT,
            "futex" => Self::BG_WAIT,
            "wait4" | "waitid" => Self::BG_WAIT | Self::WAIT_CHILD,
            "read" => Self::READ | Self::CLIENT_RW | Self::RECV,
            "recvfrom" | "readv" | "recvmsg" => Self::RECV,
            "write" | "writev" => Self::CLIENT_RW | Self::WRITES | Self::SEND,
            "sendto" | "sendmsg" => Self::SEND,
            "pwrite64" | "rename" | "renameat" => Self::WRITES,
            "fdatasync" | "fsync" => Self::FSYNC | Self::WRITES,
            "close" => Self::CLOSE,
            "accept" | "accept4" => Self::ACCEPT,
            "open" | "openat" | "openat2" | "creat" => Self::OPEN,
            _ => 0,
        };
        Facts(f)
    }
    #[inline]
    pub(crate) fn has(self, bits: u16) -> bool {
        self.0 & bits != 0
    }
    /// Whether a call of this name is waiting for work, not holding anyone up, in a thread
    /// of this role.
    #[inline]
    pub(crate) fn is_idle_in(self, role: Role) -> bool {
        self.has(Self::ALWAYS_IDLE)
            || (role != Role::Main
                && (self.has(Self::BG_WAIT) || (self.has(Self::READ) && role == Role::Other)))
    }
    /// Role-agnostic version for the "slowest calls" list, which is built before roles are
    /// known.
    #[inline]
    pub(crate) fn is_wait(self) -> bool {
        self.has(Self::ALWAYS_IDLE | Self::BG_WAIT)
    }
}

/// Waits that are idle time, not stalls, for a call name in a thread of this role (the
/// report builders ask by name at finish).
pub(crate) fn is_idle(name: &str, role: Role) -> bool {
    Facts::of(name).is_idle_in(role)
}

/// The ResolvedEvent of DESIGN.md: one finished syscall with everything the units ask about
/// it, built once per event by `World::observe`. Copy, lives on the stack.
#[derive(Clone, Copy)]
pub(crate) struct ResolvedCall<'e> {
    pub(crate) ev: &'e Event,
    pub(crate) sc: &'e Syscall,
    pub(crate) tid: Tid,
    pub(crate) thread: ThreadIdx,
    /// Process key of the fd table and the report (`u32::MAX`: the traced process while its
    /// pid is unknown).
    pub(crate) proc: u32,
    pub(crate) facts: Facts,
    /// As known at this event; report builders re-read final roles.
    pub(crate) role: Role,
    /// `facts.is_idle_in(role)`.
    pub(crate) idle: bool,
    pub(crate) file: Option<FileId>,
    pub(crate) class: Option<FileClass>,
    /// The fd it touched (an open: the one it returned).
    pub(crate) call_fd: Option<i32>,
    /// Duration, 0 when unknown (`timed` says which).
    pub(crate) dur: Nanos,
    pub(crate) timed: bool,
    pub(crate) end: Nanos,
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

    /// A measured call of thread `tid` (index `tid % 1000`) in process 100.
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
        let facts = Facts::of(sc.name);
        let dur = sc.dur.unwrap_or(0);
        ResolvedCall {
            ev,
            sc,
            tid: ev.tid,
            thread: ThreadIdx(ev.tid % 1000),
            proc: 100,
            facts,
            role,
            idle: facts.is_idle_in(role),
            file: class.map(|c| c as FileId),
            class,
            call_fd: sc.fd,
            dur,
            timed: sc.dur.is_some(),
            end: ev.ts + dur,
        }
    }
}
