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
