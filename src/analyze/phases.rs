//! Phases: which background children ran, when, doing what. A fork by the traced process
//! starts a phase (BGSAVE, AOF rewrite); SIGCHLD, wait4 or the child's exit ends it. What
//! the child writes and renames, or the incremental AOF redis opens just before forking,
//! tells the kind. Phases cut the trace into segments (before, during, after each) that
//! the file-time and commands units count by.

use super::call::{Facts, ResolvedCall};
use super::commands::Commands;
use super::file_time::FileTime;
use crate::event::{Extra, Nanos, Ret};
use crate::fdtable::{classify_path, FileClass, ProcKey};
use crate::redis_conf::RedisConf;
use crate::report::{self, EndedBy, PhaseKind, PhaseStatsOf};
use crate::source::Clock;
use rustc_hash::FxHashMap as HashMap;

struct PhaseState {
    child: u32,
    start: Nanos,
    fork_ns: Option<Nanos>,
    /// The fork's duration is only an upper bound (no -T: up to the thread's next event).
    fork_upper: bool,
    end: Option<Nanos>,
    ended_by: Option<EndedBy>,
    wrote: Vec<FileClass>,
    kind_hint: Option<PhaseKind>,
}

/// A stretch of the trace between background phases, the unit the before/during/after
/// statistics are kept by: before phase i (which is also after phase i-1), or during it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Segment(usize);

impl Segment {
    /// Before phase `i`: from the end of phase i-1 (or the trace's start) to its fork.
    pub(crate) fn before(i: usize) -> Self {
        Segment(2 * i)
    }
    pub(crate) fn during(i: usize) -> Self {
        Segment(2 * i + 1)
    }
    /// After phase `i`: until the next one starts.
    pub(crate) fn after(i: usize) -> Self {
        Segment(2 * i + 2)
    }
    /// Dense, from 0 in trace order: per-segment state in a `Vec`.
    #[inline]
    pub(crate) fn index(self) -> usize {
        self.0
    }
}

#[derive(Default)]
pub(crate) struct Phases {
    list: Vec<PhaseState>,
    /// Segment of the trace now.
    segment: Segment,
    /// The phase each forked child process runs.
    child_phase: HashMap<u32, usize>,
    /// When the root process last opened a new incremental AOF (redis 7 multi-part AOF).
    last_incr_open: Option<Nanos>,
    fork_durs: Vec<Nanos>,
}

impl Phases {
    pub(crate) fn end(&mut self, child: u32, at: Nanos, by: EndedBy) {
        if let Some(i) = self
            .list
            .iter()
            .rposition(|p| p.child == child && p.end.is_none())
        {
            self.list[i].end = Some(at);
            self.list[i].ended_by = Some(by);
            self.segment = Segment::after(i);
        }
    }

    /// A signal delivered at `at`: a SIGCHLD from a child ends its phase.
    pub(crate) fn on_signal(&mut self, name: &str, from: Option<u32>, at: Nanos) {
        if let ("SIGCHLD", Some(child)) = (name, from) {
            self.end(child, at, EndedBy::Sigchld);
        }
    }

    /// The phase running at `at`.
    pub(crate) fn active_at(&self, at: Nanos) -> Option<usize> {
        self.list
            .iter()
            .rposition(|p| p.start <= at && p.end.is_none_or(|e| at < e))
    }

    #[inline]
    pub(crate) fn segment(&self) -> Segment {
        self.segment
    }

    /// The child process of phase `i`.
    pub(crate) fn child(&self, i: usize) -> Option<u32> {
        self.list.get(i).map(|p| p.child)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// The longest phase that ended in the trace, how long it ran.
    pub(crate) fn longest_ended(&self) -> Option<Nanos> {
        self.list
            .iter()
            .filter_map(|p| p.end.map(|end| end - p.start))
            .max()
    }

    /// (fork duration, whether it is only an upper bound, child) of every phase whose fork
    /// was timed, in order.
    pub(crate) fn forks_bounded(&self) -> impl Iterator<Item = (Nanos, bool, u32)> + '_ {
        self.list
            .iter()
            .filter_map(|p| p.fork_ns.map(|f| (f, p.fork_upper, p.child)))
    }

    pub(crate) fn fork_durs(&self) -> &[Nanos] {
        &self.fork_durs
    }

    #[inline]
    /// `conf` by reference to the option: only a rename reads it, so the other calls do
    /// not test it (`Option::as_ref` on every call cost ~8 Ir per event).
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>, conf: &Option<RedisConf>) {
        let (sc, f) = (cx.sc, cx.facts);
        let is_root = cx.proc.is_root();
        // Nearly every call of the traced process (reads, writes, waits) starts, ends or
        // describes no phase: one test for them instead of five.
        if is_root
            && !f.has(Facts::OPEN | Facts::WAIT_CHILD)
            && !matches!(sc.extra, Extra::Clone { .. } | Extra::Rename(..))
        {
            return;
        }
        if is_root && f.has(Facts::OPEN) && sc.ret.val().is_some() {
            let p = sc.ret_path.as_deref().or(sc.path());
            if p.is_some_and(|p| p.contains(".incr.aof")) {
                self.last_incr_open = Some(cx.ts());
            }
        }
        if let (Extra::Clone { thread: false }, Ret::Val(child)) = (&sc.extra, sc.ret) {
            if child > 0 {
                self.on_fork(cx, child as u32, is_root);
            }
        }
        if f.has(Facts::WAIT_CHILD) {
            if let Ret::Val(child) = sc.ret {
                if child > 0 {
                    self.end(child as u32, cx.end, EndedBy::Wait4);
                }
            }
        }
        // What the child writes tells what kind of save it is.
        if let (Some(c), true) = (cx.class, f.has(Facts::WRITES)) {
            if let Some(&i) = cx.proc.child_pid().and_then(|p| self.child_phase.get(&p)) {
                if !self.list[i].wrote.contains(&c) {
                    self.list[i].wrote.push(c);
                }
            }
        }
        if let Extra::Rename(old, _) = &sc.extra {
            self.on_rename(cx.proc, classify_path(old, conf.as_ref()));
        }
    }

    fn on_fork(&mut self, cx: &ResolvedCall<'_>, child: u32, is_root: bool) {
        // A child of a child runs no phase of its own (and a reused pid forgets its old one).
        self.child_phase.remove(&child);
        if !is_root {
            return;
        }
        let at = cx.ts();
        let idx = self.list.len();
        self.list.push(PhaseState {
            child,
            start: at,
            fork_ns: cx.sc.dur,
            fork_upper: cx.dur_src() == crate::event::DurSource::UpperBound,
            end: None,
            ended_by: None,
            wrote: vec![],
            kind_hint: self.kind_hint_before_fork(at),
        });
        self.child_phase.insert(child, idx);
        self.segment = Segment::during(idx);
        if let Some(d) = cx.sc.dur {
            self.fork_durs.push(d);
        }
    }

    fn on_rename(&mut self, proc: ProcKey, c: FileClass) {
        let phase = proc
            .child_pid()
            .and_then(|p| self.child_phase.get(&p))
            .copied()
            .or_else(|| self.list.len().checked_sub(1));
        if let Some(i) = phase {
            let hint = match c {
                FileClass::AofRewriteTemp => Some(PhaseKind::AofRewrite),
                FileClass::RdbTemp => Some(PhaseKind::Bgsave),
                _ => None,
            };
            if hint.is_some() && self.list[i].kind_hint.is_none() {
                self.list[i].kind_hint = hint;
            }
        }
    }

    /// Redis 7 opens the next `NAME.N.incr.aof` just before it forks the AOF-rewrite child:
    /// that names the phase even when the child itself was not traced.
    fn kind_hint_before_fork(&self, at: Nanos) -> Option<PhaseKind> {
        match self.last_incr_open {
            Some(t) if at - t <= 200_000_000 && t <= at => Some(PhaseKind::AofRewrite),
            _ => None,
        }
    }

    /// The longest phase (a running one lasts until `last`, the trace's end).
    pub(crate) fn longest(&self, last: Nanos) -> Option<usize> {
        self.list
            .iter()
            .enumerate()
            .max_by_key(|(_, p)| p.end.unwrap_or(last) - p.start)
            .map(|(i, _)| i)
    }

    /// `aof`: whether an AOF was in use (from the files seen and the configuration).
    pub(crate) fn report(&self, clock: &Clock, first: Nanos, aof: AofUse) -> Vec<report::Phase> {
        self.list
            .iter()
            .map(|p| report::Phase {
                kind: kind(p, aof),
                child_pid: p.child,
                start_at_us: (p.start - first) / 1000,
                end_at_us: p.end.map(|e| (e - first) / 1000),
                fork_us: p.fork_ns.map(|f| f / 1000),
                ts: clock.format(p.start),
                ended_by: p.ended_by,
                wrote: p.wrote.clone(),
                redis_evidence: None,
            })
            .collect()
    }
}

/// Whether the traced redis used an AOF, for naming a child that was not traced.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AofUse {
    /// An AOF file was seen in the trace.
    pub(crate) seen: bool,
    /// `appendonly` in the configuration, when known.
    pub(crate) conf: Option<bool>,
}

fn kind(p: &PhaseState, aof: AofUse) -> PhaseKind {
    if p.wrote.contains(&FileClass::AofRewriteTemp) {
        return PhaseKind::AofRewrite;
    }
    if p.wrote.contains(&FileClass::RdbTemp) || p.wrote.contains(&FileClass::Rdb) {
        return PhaseKind::Bgsave;
    }
    if let Some(h) = p.kind_hint {
        return h;
    }
    // The child was not traced: no AOF in use means it can only be an RDB save.
    if aof.conf == Some(false) || (aof.conf.is_none() && !aof.seen) {
        return PhaseKind::Bgsave;
    }
    PhaseKind::Child
}

/// Before/during/after each phase: the serving threads' file syscalls, then each command.
pub(crate) fn phase_stats(
    phases: &Phases,
    file_time: &FileTime,
    commands: &Commands,
) -> Vec<report::PhaseStats> {
    fn row(
        phase: usize,
        what: PhaseStatsOf,
        d: impl Fn(Segment) -> report::Dist,
    ) -> report::PhaseStats {
        report::PhaseStats {
            phase,
            what,
            before: d(Segment::before(phase)),
            during: d(Segment::during(phase)),
            after: d(Segment::after(phase)),
        }
    }
    let mut out = vec![];
    for i in 0..phases.len() {
        out.push(row(i, PhaseStatsOf::MainFileSyscalls, |s| {
            file_time.segment(s)
        }));
        for n in commands.in_name_order() {
            let name = commands.names().name(n).to_string();
            out.push(row(i, PhaseStatsOf::Command(name), |s| {
                commands.segment(n, s)
            }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::call::testing::{call, event};
    use crate::analyze::roles::Role;
    use crate::event::{Event, EventKind};

    const MS: Nanos = 1_000_000;

    fn with(mut e: Event, ret: i64, extra: Extra) -> Event {
        if let EventKind::Syscall(sc) = &mut e.kind {
            sc.ret = Ret::Val(ret);
            sc.extra = extra;
        }
        e
    }

    #[test]
    fn a_fork_starts_a_phase_and_wait4_ends_it() {
        let mut p = Phases::default();
        let fork = with(
            event(100, 10 * MS, 3 * MS, "clone"),
            200,
            Extra::Clone { thread: false },
        );
        p.on_call(&call(&fork, Role::Main, None), &None);
        assert_eq!(
            (p.segment(), p.active_at(20 * MS)),
            (Segment::during(0), Some(0))
        );
        let wait = with(event(100, 50 * MS, MS, "wait4"), 200, Extra::None);
        p.on_call(&call(&wait, Role::Main, None), &None);
        assert_eq!(
            (p.segment(), p.active_at(60 * MS)),
            (Segment::after(0), None)
        );
        assert_eq!(p.fork_durs(), &[3 * MS]);
        let aof = AofUse {
            seen: true,
            conf: None,
        };
        let r = p.report(&Clock::none(), 0, aof);
        assert_eq!(
            (r[0].kind, r[0].ended_by),
            (PhaseKind::Child, Some(EndedBy::Wait4))
        );
        let no_aof = AofUse {
            seen: false,
            conf: None,
        };
        assert_eq!(
            p.report(&Clock::none(), 0, no_aof)[0].kind,
            PhaseKind::Bgsave
        );
    }

    #[test]
    fn a_sigchld_from_the_child_ends_its_phase() {
        let mut p = Phases::default();
        let fork = with(
            event(100, 10 * MS, MS, "clone"),
            200,
            Extra::Clone { thread: false },
        );
        p.on_call(&call(&fork, Role::Main, None), &None);
        p.on_signal("SIGUSR1", Some(200), 20 * MS);
        p.on_signal("SIGCHLD", Some(300), 20 * MS);
        assert_eq!(p.active_at(30 * MS), Some(0), "not its child's SIGCHLD");
        p.on_signal("SIGCHLD", Some(200), 40 * MS);
        assert_eq!(
            (p.active_at(50 * MS), p.longest_ended()),
            (None, Some(30 * MS))
        );
        assert_eq!(
            p.forks_bounded().collect::<Vec<_>>(),
            vec![(MS, false, 200)]
        );
    }

    #[test]
    fn a_new_incremental_aof_just_before_the_fork_names_a_rewrite() {
        let mut p = Phases::default();
        let open = with(
            event(100, 0, 10_000, "openat"),
            9,
            Extra::Path("appendonly.aof.2.incr.aof".into()),
        );
        p.on_call(&call(&open, Role::Main, None), &None);
        let fork = with(
            event(100, 100 * MS, MS, "clone"),
            200,
            Extra::Clone { thread: false },
        );
        p.on_call(&call(&fork, Role::Main, None), &None);
        let aof = AofUse {
            seen: true,
            conf: None,
        };
        assert_eq!(
            p.report(&Clock::none(), 0, aof)[0].kind,
            PhaseKind::AofRewrite
        );
        // A fork by someone else's process is no phase.
        let other = with(
            event(300, 0, MS, "clone"),
            301,
            Extra::Clone { thread: false },
        );
        let mut cx = call(&other, Role::Other, None);
        cx.proc = ProcKey::Pid(300);
        p.on_call(&cx, &None);
        assert_eq!(p.len(), 1);
    }
}
