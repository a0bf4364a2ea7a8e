//! Fixed-size latency aggregates for the analyzers: count, total, max and an HDR histogram
//! (µs, 2 significant digits) for percentiles, so that statistics over a 20 GB trace cost the
//! same memory as over a small one. No sorted copy of the samples is ever kept.

use crate::event::Nanos;
use crate::report::Dist;
use hdrhistogram::Histogram;
use std::borrow::Cow;

#[derive(Clone, Default)]
pub struct Agg {
    pub count: u64,
    pub errors: u64,
    pub total_ns: i64,
    pub max_ns: i64,
    /// Made at the first sample: the analyzers keep an `Agg` per file id and per syscall of
    /// the table, most of which never see one.
    hist: Option<Hist>,
}

/// Auto-resizing: it only grows as far as the largest value recorded.
fn new_hist() -> Histogram<u64> {
    Histogram::new(2).expect("2 significant digits is a valid histogram")
}

/// The crate's histogram, fed a run of equal samples as one `record_n`: consecutive
/// durations of one call on one file (or of one command) often repeat at µs resolution
/// (bench/PROFILE.md's rounds on the analyzer's per-event path counted how often), and the
/// crate's checked `record`, one per timed call, cost as much as the rest of a call's
/// latency bookkeeping. Equal values land
/// at one index, so the counts are the ones a record per sample gives; the run held back
/// is recorded before the histogram is read (`get`, `settle`). A different value costs
/// the record it always did, and a compare.
#[derive(Clone)]
pub(crate) struct Hist {
    h: Histogram<u64>,
    /// The held-back run: its value (u64::MAX: none, no µs value is that large) and length.
    last: u64,
    n: u64,
}

impl Hist {
    pub(crate) fn new() -> Self {
        Hist {
            h: new_hist(),
            last: u64::MAX,
            n: 0,
        }
    }

    #[inline]
    pub(crate) fn record(&mut self, v: u64) {
        if v == self.last {
            self.n += 1;
        } else {
            self.start_run(v);
        }
    }

    /// A sample unlike the held-back run: the run is recorded, a new one begins.
    #[inline(never)]
    fn start_run(&mut self, v: u64) {
        self.settle();
        self.last = v;
        self.n = 1;
    }

    /// Records the run held back (its value is kept: the next sample may extend it).
    pub(crate) fn settle(&mut self) {
        if self.n > 0 {
            let _ = self.h.record_n(self.last, self.n);
            self.n = 0;
        }
    }

    /// The histogram with every sample recorded.
    pub(crate) fn get(&self) -> Cow<'_, Histogram<u64>> {
        if self.n == 0 {
            Cow::Borrowed(&self.h)
        } else {
            let mut h = self.h.clone();
            let _ = h.record_n(self.last, self.n);
            Cow::Owned(h)
        }
    }

    /// Adds the counts of another histogram.
    pub(crate) fn add(&mut self, o: &Histogram<u64>) {
        self.settle();
        let _ = self.h.add(o);
    }

    fn from_hist(h: Histogram<u64>) -> Self {
        Hist { h, ..Hist::new() }
    }
}

impl Agg {
    #[inline]
    pub fn add(&mut self, ns: i64) {
        let ns = ns.max(0);
        self.count += 1;
        self.total_ns += ns;
        self.max_ns = self.max_ns.max(ns);
        // Histogram in µs; sub-µs calls count as 1 µs bucket 0..1.
        self.hist
            .get_or_insert_with(Hist::new)
            .record((ns / 1000) as u64);
    }

    /// The count, total and max of a sample whose histogram record is kept elsewhere (a
    /// `Cells` cell) and merged in with `merge_hist` before any percentile is asked for.
    #[inline]
    pub(crate) fn add_unrecorded(&mut self, ns: i64) {
        let ns = ns.max(0);
        self.count += 1;
        self.total_ns += ns;
        self.max_ns = self.max_ns.max(ns);
    }

    /// Adds the counts of a histogram of samples already counted by `add_unrecorded`.
    pub(crate) fn merge_hist(&mut self, h: &Histogram<u64>) {
        match &mut self.hist {
            None => self.hist = Some(Hist::from_hist(h.clone())),
            Some(a) => a.add(h),
        }
    }

    /// Percentile in µs (the histogram's value for that quantile, never above the max).
    pub fn pct_us(&self, q: f64) -> i64 {
        match &self.hist {
            Some(h) if self.count > 0 => {
                (h.get().value_at_quantile(q) as i64).min(self.max_ns / 1000)
            }
            _ => 0,
        }
    }

    pub fn merge(&mut self, o: &Agg) {
        self.count += o.count;
        self.errors += o.errors;
        self.total_ns += o.total_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
        match (&mut self.hist, &o.hist) {
            (_, None) => {}
            (None, Some(h)) => self.hist = Some(h.clone()),
            (Some(a), Some(b)) => a.add(&b.get()),
        }
    }

    pub fn total_us(&self) -> i64 {
        self.total_ns / 1000
    }

    pub fn max_us(&self) -> i64 {
        self.max_ns / 1000
    }

    pub fn dist(&self) -> Dist {
        Dist {
            count: self.count,
            p50_us: self.pct_us(0.5),
            p99_us: self.pct_us(0.99),
            max_us: self.max_us(),
        }
    }
}

/// The histograms of timed calls on files, one per (file, syscall slot, tag): a call on a
/// file counts toward its syscall's distribution, its file's and (the tag, from the
/// file-time unit) its phase segment's and the main thread's fsyncs of that file, all the
/// same duration, so it is recorded once, here, and each of those distributions is the
/// merge of its cells at the end (`Latency::fold`). Merging adds the same counts at the same
/// indices, so the percentiles are the ones four records per call gave. A file sees few
/// (syscall, tag) pairs: a short list per file, searched by one packed key.
#[derive(Default)]
pub(crate) struct Cells {
    by_file: Vec<FileCells>,
}

/// A file's aggregate (filled at the fold from its cells) and its cells: one record per
/// file, so a timed call on a file finds its cell with one index.
#[derive(Default)]
pub(crate) struct FileCells {
    pub(crate) agg: Agg,
    keys: Vec<u64>,
    cells: Vec<Cell>,
}

/// One (syscall slot, tag) of a file: the count, total and max of its calls as well as
/// their histogram, so a timed call on a file updates one record, and its syscall's and
/// its file's count/total/max are the sums of the cells at the fold (integer sums and a
/// max: the same in any order).
#[derive(Clone)]
pub(crate) struct Cell {
    pub(crate) count: u64,
    pub(crate) total_ns: i64,
    pub(crate) max_ns: i64,
    h: Hist,
}

impl Cell {
    /// Its histogram (settled by `FileCells::cells`).
    pub(crate) fn hist(&self) -> &Histogram<u64> {
        &self.h.h
    }
}

impl Agg {
    /// Adds a cell's count, total, max and histogram (its samples counted nowhere else).
    pub(crate) fn add_cell(&mut self, c: &Cell) {
        self.count += c.count;
        self.total_ns += c.total_ns;
        self.max_ns = self.max_ns.max(c.max_ns);
        self.merge_hist(&c.h.h);
    }
}

/// No syscall-table slot: the cell counts toward its file and tag only (the syscall's
/// aggregate counted and recorded the sample itself).
pub(crate) const NO_SLOT: u32 = u32::MAX;

impl Cells {
    /// The record of file `file`, made on its first timed call.
    #[inline]
    pub(crate) fn file(&mut self, file: u32) -> &mut FileCells {
        let f = file as usize;
        if f < self.by_file.len() {
            &mut self.by_file[f]
        } else {
            self.grow(f)
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, f: usize) -> &mut FileCells {
        self.by_file.resize_with(f + 1, FileCells::default);
        &mut self.by_file[f]
    }

    /// The aggregate of a file: None past the last file with a timed call (those before it
    /// without one have count 0).
    pub(crate) fn agg(&self, file: u32) -> Option<&Agg> {
        self.by_file.get(file as usize).map(|c| &c.agg)
    }

    /// Every file's record, by file id.
    pub(crate) fn files_mut(&mut self) -> impl Iterator<Item = (u32, &mut FileCells)> {
        self.by_file
            .iter_mut()
            .enumerate()
            .map(|(f, c)| (f as u32, c))
    }
}

impl FileCells {
    /// No timed call on this file yet (its first one puts it in the report's order).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    #[inline]
    pub(crate) fn record(&mut self, slot: u32, tag: u32, ns: i64) {
        let key = (u64::from(slot) << 32) | u64::from(tag);
        let i = match self.keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                self.keys.push(key);
                self.cells.push(Cell {
                    count: 0,
                    total_ns: 0,
                    max_ns: 0,
                    h: Hist::new(),
                });
                self.keys.len() - 1
            }
        };
        // As `Agg::add` counts and records it.
        if let Some(c) = self.cells.get_mut(i) {
            let ns = ns.max(0);
            c.count += 1;
            c.total_ns += ns;
            c.max_ns = c.max_ns.max(ns);
            c.h.record((ns / 1000) as u64);
        }
    }

    /// Every cell: (syscall slot, tag, the cell with all its samples recorded), and the
    /// file's aggregate.
    pub(crate) fn cells(&mut self) -> (impl Iterator<Item = (u32, u32, &Cell)>, &mut Agg) {
        for c in &mut self.cells {
            c.h.settle();
        }
        let it = self
            .keys
            .iter()
            .zip(&self.cells)
            .map(|(k, c)| ((k >> 32) as u32, *k as u32, c));
        (it, &mut self.agg)
    }
}

/// A streaming estimate of a low quantile (the tenth percentile) in O(1) space: step up by
/// a tenth of a microsecond when a sample is above the estimate and down by nine tenths
/// when below, which settles where a tenth of the samples lie below. Deterministic, so the
/// same trace always gives the same report.
#[derive(Clone, Copy, Default)]
pub(crate) struct LowDecile {
    pub(crate) ns: Nanos,
    seen: bool,
}

impl LowDecile {
    const UP: Nanos = 100;
    const DOWN: Nanos = 900;
    pub(crate) fn add(&mut self, x: Nanos) {
        if !self.seen {
            self.ns = x;
            self.seen = true;
        } else if x > self.ns {
            self.ns += Self::UP;
        } else if x < self.ns {
            self.ns = (self.ns - Self::DOWN).max(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_follow_the_samples() {
        let mut a = Agg::default();
        for i in 1..=1000 {
            a.add(i * 1000);
        }
        assert_eq!(a.count, 1000);
        let p50 = a.pct_us(0.5);
        assert!((495..=505).contains(&p50), "{p50}");
        let p99 = a.pct_us(0.99);
        assert!((985..=995).contains(&p99), "{p99}");
        assert_eq!(a.max_us(), 1000);
        assert_eq!(a.total_us(), 500_500);
    }

    /// Runs held back and recorded as one `record_n` leave the crate's histogram with the
    /// counts of one record per sample: every quantile, the count, the max, and a merge.
    #[test]
    fn held_back_runs_give_the_histogram_of_one_record_per_sample() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut held = Hist::new();
        let mut direct = new_hist();
        let mut v = 0u64;
        for i in 0..20_000 {
            // Runs of repeated and nearby values (same bucket or not), at every magnitude.
            let r = next();
            if r % 4 != 0 {
                v = match (r >> 8) % 5 {
                    0 => next() % 300,
                    1 => 250 + next() % 20,
                    2 => 1000 + next() % 50,
                    3 => next() % 5_000_000,
                    _ => v + (next() % 3),
                };
            }
            held.record(v);
            direct.record(v).unwrap();
            if i % 7000 == 0 {
                // A read in the middle (live) sees every sample so far.
                assert_eq!(held.get().len(), direct.len());
            }
        }
        let got = held.get();
        assert_eq!(got.len(), direct.len());
        assert_eq!(got.max(), direct.max());
        assert_eq!(got.min_nz(), direct.min_nz());
        for q in [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(
                got.value_at_quantile(q),
                direct.value_at_quantile(q),
                "q {q}"
            );
        }
        let mut a = Agg::default();
        let mut b = Agg::default();
        for v in [5u64, 5, 5, 7, 300, 301, 300] {
            a.add(v as i64 * 1000);
            b.add(v as i64 * 1000);
        }
        let mut m = Agg::default();
        m.merge(&a);
        m.merge(&b);
        assert_eq!((m.count, m.pct_us(0.5), m.pct_us(0.99)), (14, 7, 301));
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(Agg::default().dist().p99_us, 0);
    }
}
