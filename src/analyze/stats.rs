//! Fixed-size latency aggregates for the analyzers: count, total, max and an HDR histogram
//! (µs, 2 significant digits) for percentiles, so that statistics over a 20 GB trace cost the
//! same memory as over a small one. No sorted copy of the samples is ever kept.

use crate::event::Nanos;
use crate::report::Dist;
use hdrhistogram::Histogram;

#[derive(Clone, Default)]
pub struct Agg {
    pub count: u64,
    pub errors: u64,
    pub total_ns: i64,
    pub max_ns: i64,
    /// Made at the first sample: the analyzers keep an `Agg` per file id and per syscall of
    /// the table, most of which never see one.
    hist: Option<Histogram<u64>>,
}

/// Auto-resizing: it only grows as far as the largest value recorded.
fn new_hist() -> Histogram<u64> {
    Histogram::new(2).expect("2 significant digits is a valid histogram")
}

impl Agg {
    #[inline]
    pub fn add(&mut self, ns: i64) {
        let ns = ns.max(0);
        self.count += 1;
        self.total_ns += ns;
        self.max_ns = self.max_ns.max(ns);
        // Histogram in µs; sub-µs calls count as 1 µs bucket 0..1.
        let _ = self
            .hist
            .get_or_insert_with(new_hist)
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
            None => self.hist = Some(h.clone()),
            Some(a) => {
                let _ = a.add(h);
            }
        }
    }

    /// Percentile in µs (the histogram's value for that quantile, never above the max).
    pub fn pct_us(&self, q: f64) -> i64 {
        match &self.hist {
            Some(h) if self.count > 0 => (h.value_at_quantile(q) as i64).min(self.max_ns / 1000),
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
            (Some(a), Some(b)) => {
                let _ = a.add(b);
            }
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

/// A file's aggregate (count, total, max; its histogram merged in at the end) and its
/// cells: one record per file, so a timed call on a file finds both with one index.
#[derive(Default)]
pub(crate) struct FileCells {
    pub(crate) agg: Agg,
    keys: Vec<u64>,
    hists: Vec<Histogram<u64>>,
}

/// No syscall-table slot: the cell counts toward its file and tag only (the syscall's
/// aggregate recorded the sample itself).
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

    /// The aggregate of a file (a default one for a file without a timed call).
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
    #[inline]
    pub(crate) fn record(&mut self, slot: u32, tag: u32, ns: i64) {
        let key = (u64::from(slot) << 32) | u64::from(tag);
        let i = match self.keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                self.keys.push(key);
                self.hists.push(new_hist());
                self.keys.len() - 1
            }
        };
        // As `Agg::add` records it.
        if let Some(h) = self.hists.get_mut(i) {
            let _ = h.record((ns.max(0) / 1000) as u64);
        }
    }

    /// Every cell: (syscall slot, tag, histogram), and the file's aggregate.
    pub(crate) fn cells(
        &mut self,
    ) -> (impl Iterator<Item = (u32, u32, &Histogram<u64>)>, &mut Agg) {
        let it = self
            .keys
            .iter()
            .zip(&self.hists)
            .map(|(k, h)| ((k >> 32) as u32, *k as u32, h));
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

    #[test]
    fn empty_is_zero() {
        assert_eq!(Agg::default().dist().p99_us, 0);
    }
}
