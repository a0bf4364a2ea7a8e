//! Own connections (live only): which of the traced process's fds are stallscope's own
//! `--redis` poller connections. Their LATENCY/INFO/SLOWLOG are not client commands, and no
//! stall held them up, so the commands unit does not see their reads and writes. Fed by the
//! live driver (`mark`, when the poller's peer address is found) and by each call (a close
//! ends the mark).

use super::call::{Facts, ResolvedCall};
use crate::event::Nanos;

#[derive(Default)]
pub(crate) struct OwnConns {
    /// (fd, from when it was known), a handful at most.
    fds: Vec<(i32, Nanos)>,
}

impl OwnConns {
    /// fd `fd` of the traced process is stallscope's own connection from `since` on.
    pub(crate) fn mark(&mut self, fd: i32, since: Nanos) {
        self.fds.retain(|(f, _)| *f != fd);
        self.fds.push((fd, since));
    }

    /// Whether the call reads or writes one of them (a close ends the mark).
    #[inline]
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>) -> bool {
        if self.fds.is_empty() {
            return false;
        }
        let Some(fd) = cx.sc.fd else { return false };
        let Some(i) = self
            .fds
            .iter()
            .position(|(f, since)| *f == fd && cx.ts() >= *since)
        else {
            return false;
        };
        if !cx.proc.is_root() {
            return false;
        }
        if cx.facts.has(Facts::CLOSE) {
            self.fds.swap_remove(i);
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::call::testing::{call, event};
    use crate::analyze::roles::Role;
    use crate::event::EventKind;
    use crate::fdtable::ProcKey;

    fn on(o: &mut OwnConns, ts: Nanos, name: &'static str, fd: i32, proc: ProcKey) -> bool {
        let mut e = event(1, ts, 1_000, name);
        if let EventKind::Syscall(sc) = &mut e.kind {
            sc.fd = Some(fd);
        }
        let mut cx = call(&e, Role::Main, None);
        cx.proc = proc;
        o.on_call(&cx)
    }

    #[test]
    fn a_marked_fd_is_own_from_its_mark_until_it_is_closed() {
        let mut o = OwnConns::default();
        assert!(!on(&mut o, 0, "read", 9, ProcKey::Root));
        o.mark(9, 100);
        assert!(!on(&mut o, 50, "read", 9, ProcKey::Root), "before the mark");
        assert!(on(&mut o, 150, "write", 9, ProcKey::Root));
        assert!(
            !on(&mut o, 150, "write", 9, ProcKey::Pid(7)),
            "a child's fd 9"
        );
        assert!(!on(&mut o, 150, "read", 8, ProcKey::Root));
        assert!(!on(&mut o, 200, "close", 9, ProcKey::Root));
        assert!(
            !on(&mut o, 300, "read", 9, ProcKey::Root),
            "closed: a client's now"
        );
    }
}
