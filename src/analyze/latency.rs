//! Latency: how long calls take, per syscall name and per file. Every call counts; only
//! calls whose duration is known feed the distributions.

use super::call::ResolvedCall;
use super::file_time::FileTime;
use super::stats::{Agg, Cells, NO_SLOT};
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
    /// The files in the order of their first timed call: the report's rows of equal time
    /// and fd come in the order a map filled in that order gives them.
    file_order: Vec<FileId>,
    /// Per file, by its dense id: its aggregate (filled at `fold`) and the cells of timed
    /// calls on it (count, total, max and histogram for their syscall's and their file's
    /// distributions at once, the histogram for the file-time unit's), added into those
    /// at `fold`.
    cells: Cells,
}

impl Latency {
    /// `tag`: the file-time unit's distributions this call also belongs to.
    #[inline]
    pub(crate) fn on_call(&mut self, cx: &ResolvedCall<'_>, tag: u32) {
        let sc = cx.sc;
        let file = cx.file.filter(|_| cx.timed);
        let (agg, slot) = self.agg(sc.name, sc.sys);
        // A timed call on a file is counted in its cell only (its syscall's and its
        // file's count, total and max are the cells' sums at the fold); without a slot
        // the syscall's aggregate counts it itself.
        if cx.timed {
            if file.is_none() || slot.is_none() {
                agg.add(cx.dur);
            }
        } else {
            agg.count += 1;
        }
        if sc.ret.is_err() {
            agg.errors += 1;
        }
        if let Some(f) = file {
            let fc = self.cells.file(f);
            if fc.is_empty() {
                self.file_order.push(f);
            }
            let slot = slot.map_or(NO_SLOT, |i| i as u32);
            fc.record(slot, tag, cx.dur);
        }
    }

    /// How many calls of the syscall table the trace holds (of its first 256 entries; names
    /// not in the table are not counted): few are the evidence that `-e trace=` filtered
    /// the trace (`GapVerdict::Filtered`).
    pub(crate) fn kinds(&self) -> u32 {
        self.by_sys.iter().take(256).filter(|s| s.is_some()).count() as u32
    }

    /// The aggregate of a call's syscall, and its slot in `by_sys` when it is there.
    #[inline]
    fn agg(&mut self, name: &'static str, sys: &'static SysInfo) -> (&mut Agg, Option<usize>) {
        if let Some(i) = syscalls::index_of(sys) {
            if i >= self.by_sys.len() {
                self.by_sys.resize_with(i + 1, || None);
            }
            // One look at the slot: filled on first use, then its name compared.
            let mine = match &self.by_sys[i] {
                Some((n, _)) => std::ptr::eq(*n, name),
                None => {
                    self.by_sys[i] = Some((name, Agg::default()));
                    true
                }
            };
            if mine {
                if let Some((_, a)) = &mut self.by_sys[i] {
                    return (a, Some(i));
                }
            }
        }
        let a = &mut self
            .other
            .entry(name.as_ptr() as usize)
            .or_insert_with(|| (name, Agg::default()))
            .1;
        (a, None)
    }

    /// Adds every cell into the distributions it counts toward: its count, total, max and
    /// histogram to its syscall's and its file's, its histogram to the file-time unit's the
    /// tag names. Once, before the report reads any count of a timed call on a file.
    pub(crate) fn fold(&mut self, file_time: &mut FileTime) {
        let by_sys = &mut self.by_sys;
        for (f, fc) in self.cells.files_mut() {
            let (cells, agg) = fc.cells();
            for (slot, tag, c) in cells {
                if slot != NO_SLOT {
                    let s = by_sys[slot as usize].as_mut().expect("a used slot");
                    s.1.add_cell(c);
                }
                agg.add_cell(c);
                if tag != 0 {
                    file_time.merge_cell(f, tag, c.hist());
                }
            }
        }
    }

    /// Calls that returned an error, of every name.
    pub(crate) fn errors(&self) -> u64 {
        let table = self.by_sys.iter().flatten();
        table
            .chain(self.other.values())
            .map(|(_, a)| a.errors)
            .sum()
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
        // Lifetimes given records of their own (`FdTable::record_for`) fold into the row
        // of their identity.
        let mut order: HashMap<FileId, std::borrow::Cow<'_, Agg>> = HashMap::default();
        for f in &self.file_order {
            let a = self.cells.agg(*f).expect("a file with a timed call");
            match order.entry(world.canonical_file(*f)) {
                std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().to_mut().merge(a),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(std::borrow::Cow::Borrowed(a));
                }
            }
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
        l.on_call(&call(&a, Role::Main, None), 0);
        l.on_call(&call(&b, Role::Main, None), 0);
        let s = l.syscalls();
        assert_eq!((s[0].calls, s[0].errors, s[0].max_us), (2, 1, 2000));
    }

    /// One record per call in its cell, folded at the end, gives every distribution the
    /// percentiles that recording the call into each of them directly gives.
    #[test]
    fn folded_cells_give_the_percentiles_of_direct_records() {
        use crate::analyze::file_time::FileTime;
        use crate::analyze::phases::Segment;
        use crate::fdtable::FileClass;
        let mut l = Latency::default();
        let mut ft = FileTime::default();
        let (mut by_name, mut by_file, mut seg) = (
            Agg::default(),
            [Agg::default(), Agg::default()],
            Agg::default(),
        );
        let mut x: u64 = 12345;
        for i in 0..5000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let dur = ((x >> 33) % 50_000_000) as i64 >> ((x >> 20) % 16);
            let name = if i % 3 == 0 { "fdatasync" } else { "write" };
            let e = event(1, i as i64 * 1000, dur, name);
            let file = (i % 2) as u32;
            let mut cx = call(&e, Role::Main, Some(FileClass::Aof));
            cx.file = Some(file);
            let s = Segment::during((i / 1000) as usize);
            let tag = ft.on_call(&cx, s);
            l.on_call(&cx, tag);
            if name == "write" {
                by_name.add(dur);
            }
            by_file[file as usize].add(dur);
            if i / 1000 == 2 {
                seg.add(dur);
            }
        }
        l.fold(&mut ft);
        let q = |a: &Agg| {
            (
                a.count,
                a.pct_us(0.5),
                a.pct_us(0.9),
                a.pct_us(0.99),
                a.max_us(),
            )
        };
        let w = l
            .syscalls()
            .into_iter()
            .find(|s| s.name == "write")
            .unwrap();
        assert_eq!(
            (w.calls, w.p50_us, w.p99_us, w.max_us),
            (
                by_name.count,
                by_name.pct_us(0.5),
                by_name.pct_us(0.99),
                by_name.max_us()
            )
        );
        for (f, direct) in by_file.iter().enumerate() {
            assert_eq!(q(l.cells.agg(f as u32).unwrap()), q(direct), "file {f}");
        }
        let d = ft.segment(Segment::during(2));
        assert_eq!(
            (d.count, d.p50_us, d.p99_us, d.max_us),
            (seg.count, seg.pct_us(0.5), seg.pct_us(0.99), seg.max_us())
        );
    }
}
