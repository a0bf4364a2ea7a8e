//! Latency: how long calls take, per syscall name and per file. Every call counts; only
//! calls whose duration is known feed the distributions.

use super::call::ResolvedCall;
use super::stats::Agg;
use super::world::World;
use crate::fdtable::FileId;
use crate::report;
use crate::syscalls::{self, SysInfo};
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

#[derive(Default)]
pub(crate) struct Latency {
    /// Per syscall of the table, by its index there (`syscalls::index_of`): no hash probe
    /// per event. A slot holds the name it was first used with; another name (a parser that
    /// named a call differently) and names not in the table go to `other`.
    by_sys: Vec<Option<(&'static str, Agg)>>,
    /// Per syscall name, keyed by the interned name's address (a hash of a pointer, not of
    /// the string); equal names from different interners are merged at the end.
    other: HashMap<usize, (&'static str, Agg)>,
    /// Per file, by its dense id (count 0: no timed call on it).
    by_file: Vec<Agg>,
    /// The files in the order of their first timed call: the report's rows of equal time
    /// and fd come in the order a map filled in that order gives them.
    file_order: Vec<FileId>,
}

impl Latency {
    #[inline]
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>) {
        let sc = cx.sc;
        let agg = self.agg(sc.name, sc.sys);
        if cx.timed {
            agg.add(cx.dur);
        } else {
            agg.count += 1;
        }
        if sc.ret.is_err() {
            agg.errors += 1;
        }
        if let (true, Some(f)) = (cx.timed, cx.file) {
            let f = f as usize;
            if f >= self.by_file.len() {
                self.by_file.resize_with(f + 1, Agg::default);
            }
            if self.by_file[f].count == 0 {
                self.file_order.push(f as FileId);
            }
            self.by_file[f].add(cx.dur);
        }
    }

    #[inline]
    fn agg(&mut self, name: &'static str, sys: &'static SysInfo) -> &mut Agg {
        if let Some(i) = syscalls::index_of(sys) {
            if i >= self.by_sys.len() {
                self.by_sys.resize_with(i + 1, || None);
            }
            let slot = self.by_sys[i].get_or_insert_with(|| (name, Agg::default()));
            if std::ptr::eq(slot.0, name) {
                return &mut self.by_sys[i].as_mut().expect("just filled").1;
            }
        }
        &mut self
            .other
            .entry(name.as_ptr() as usize)
            .or_insert_with(|| (name, Agg::default()))
            .1
    }

    pub(crate) fn syscalls(&self) -> Vec<report::SyscallStats> {
        let mut merged: BTreeMap<&str, Agg> = BTreeMap::new();
        let table = self.by_sys.iter().flatten();
        for (n, a) in table.chain(self.other.values()) {
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
        // Rows of equal total and fd keep the order the per-file map of earlier versions
        // gave them (the same keys inserted in the same order: the same iteration order),
        // so reports stay byte-identical.
        // One insert at a time, as the map grew (`collect` would reserve at once).
        let mut order: HashMap<FileId, &Agg> = HashMap::default();
        for f in &self.file_order {
            order.insert(*f, &self.by_file[*f as usize]);
        }
        let mut v: Vec<report::FdStats> = order
            .iter()
            .map(|(f, a)| {
                let f = *f;
                let i = world.file(f);
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
