//! Latency: how long calls take, per syscall name and per file. Every call counts; only
//! calls whose duration is known feed the distributions.

use super::call::ResolvedCall;
use super::stats::Agg;
use super::world::World;
use crate::fdtable::FileId;
use crate::report;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

#[derive(Default)]
pub(crate) struct Latency {
    /// Per syscall name, keyed by the interned name's address (a hash of a pointer, not of
    /// the string); equal names from different interners are merged at the end.
    by_name: HashMap<usize, (&'static str, Agg)>,
    by_file: HashMap<FileId, Agg>,
}

impl Latency {
    #[inline]
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>) {
        let sc = cx.sc;
        let agg = &mut self
            .by_name
            .entry(sc.name.as_ptr() as usize)
            .or_insert_with(|| (sc.name, Agg::default()))
            .1;
        if cx.timed {
            agg.add(cx.dur);
        } else {
            agg.count += 1;
        }
        if sc.ret.is_err() {
            agg.errors += 1;
        }
        if let (true, Some(f)) = (cx.timed, cx.file) {
            self.by_file.entry(f).or_default().add(cx.dur);
        }
    }

    pub(crate) fn syscalls(&self) -> Vec<report::SyscallStats> {
        let mut merged: BTreeMap<&str, Agg> = BTreeMap::new();
        for (n, a) in self.by_name.values() {
            merged.entry(n).or_default().merge(a);
        }
        let mut v: Vec<report::SyscallStats> = merged
            .iter()
            .map(|(n, a)| report::SyscallStats {
                name: n.to_string(),
                calls: a.count,
                errors: a.errors,
                total_us: a.total_us(),
                p50_us: a.pct_us(0.5),
                p99_us: a.pct_us(0.99),
                max_us: a.max_us(),
            })
            .collect();
        v.sort_by(|a, b| b.total_us.cmp(&a.total_us).then(a.name.cmp(&b.name)));
        v
    }

    pub(crate) fn fds(&self, world: &World) -> Vec<report::FdStats> {
        let mut v: Vec<report::FdStats> = self
            .by_file
            .iter()
            .map(|(f, a)| {
                let i = world.file(*f);
                report::FdStats {
                    pid: world.show_pid(i.proc),
                    fd: i.fd,
                    path: i.path.as_deref().map(str::to_string),
                    class: i.class,
                    calls: a.count,
                    total_us: a.total_us(),
                    p50_us: a.pct_us(0.5),
                    p99_us: a.pct_us(0.99),
                    max_us: a.max_us(),
                }
            })
            .collect();
        v.sort_by(|a, b| b.total_us.cmp(&a.total_us).then(a.fd.cmp(&b.fd)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::call::testing::{call, event};
    use crate::analyze::roles::Role;

    #[test]
    fn untimed_calls_count_but_do_not_time() {
        let mut l = Latency::default();
        let a = event(1, 0, 2_000_000, "write");
        let mut b = event(1, 0, 0, "write");
        if let crate::event::EventKind::Syscall(sc) = &mut b.kind {
            sc.dur = None;
            sc.ret = crate::event::Ret::Err("EAGAIN");
        }
        l.on_call(&call(&a, Role::Main, None));
        l.on_call(&call(&b, Role::Main, None));
        let s = l.syscalls();
        assert_eq!((s[0].calls, s[0].errors, s[0].max_us), (2, 1, 2000));
    }
}
