//! How events enter the analysis: `push` takes one (live tracers, `watch`), `push_all` a
//! parsed batch, in trace order either way. A call goes through `Analyzer::on_syscall`,
//! inlined into the batch's loop; the rare kinds (signals, exits, attaches, thread names,
//! unreadable lines) are dispatched out of line.

use super::Analyzer;
use crate::event::{Event, EventKind};
use crate::report;

impl Analyzer {
    // A batch of one: with a loop of its own here, every unit inlined into `on_syscall` had
    // two callers, and LLVM stopped inlining them (+145 Ir an event).
    pub fn push(&mut self, ev: &Event) {
        self.push_all(std::slice::from_ref(ev));
    }

    /// The same as `push` of each event in turn. A call of `push` per event cost its frame
    /// and register saves (~17 Ir an event); here they are paid once a batch.
    pub fn push_all(&mut self, evs: &[Event]) {
        for ev in evs {
            // Nearly every event is a call: its kind matched once (the coverage unit counts
            // it as an event in `on_call`).
            if let EventKind::Syscall(sc) = &ev.kind {
                self.on_syscall(ev, sc);
            } else {
                self.on_other(ev);
            }
        }
    }

    // Out of line: inlined into the batch's loop, these arms' registers and stack were the
    // loop's for every call too.
    #[inline(never)]
    fn on_other(&mut self, ev: &Event) {
        // An unreadable line is no event of the trace, but the timeline breaks there: what
        // it held is unknown, so no gap may span it, in any thread.
        if matches!(ev.kind, EventKind::Unreadable) {
            self.stalls.forget_all_last_ends(ev.ts);
            self.arrivals.forget(None);
            return;
        }
        // A comm names a thread and its program: no event of the trace.
        if let EventKind::Program(comm) = &ev.kind {
            self.world.set_program(ev.tid, comm);
            return;
        }
        self.coverage.on_event();
        match &ev.kind {
            EventKind::Syscall(_) | EventKind::Unreadable | EventKind::Program(_) => {}
            EventKind::Signal { name, si_pid } => {
                self.phases.on_signal(name, *si_pid, ev.ts);
                self.world.touch(ev.tid);
                if let ("SIGCHLD", Some(child)) = (*name, *si_pid) {
                    self.world.on_sigchld(child);
                }
            }
            EventKind::Exit { .. } => {
                if let Some(child) = self.world.exiting_child(ev.tid) {
                    self.phases.end(child, ev.ts, report::EndedBy::Exit);
                }
            }
            EventKind::Attach { threads } => {
                self.world.announce(*threads);
                if let Some(t) = self.world.on_attach(ev.tid) {
                    self.stalls.forget_last_end(t);
                    self.arrivals.forget(Some(t));
                }
            }
            EventKind::Detach => {
                if let Some(t) = self.world.known(ev.tid) {
                    self.stalls.forget_last_end(t);
                    self.arrivals.forget(Some(t));
                }
            }
            EventKind::ThreadName(name) => {
                self.world.touch(ev.tid);
                self.world.set_name(ev.tid, name);
            }
        }
    }
}
