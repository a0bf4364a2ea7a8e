//! Fixed-size latency aggregates for the analyzers: count, total, max and a log-linear
//! histogram (µs, 2 significant digits) for percentiles, so that statistics over a 20 GB trace
//! cost the same memory as over a small one. No sorted copy of the samples is ever kept.

use crate::event::Nanos;
use crate::report::Dist;

#[derive(Clone, Default)]
pub struct Agg {
    pub count: u64,
    pub errors: u64,
    pub total_ns: i64,
    pub max_ns: i64,
    hist: Hist,
}

impl Agg {
    #[inline]
    pub fn add(&mut self, ns: i64) {
        let ns = ns.max(0);
        self.count += 1;
        self.total_ns += ns;
        self.max_ns = self.max_ns.max(ns);
        // Histogram in µs; sub-µs calls count as 1 µs bucket 0..1.
        self.hist.record((ns / 1000) as u64);
    }

    /// Percentile in µs (the histogram's value for that quantile, never above the max).
    pub fn pct_us(&self, q: f64) -> i64 {
        if self.count == 0 {
            return 0;
        }
        let v = self.hist.value_at_quantile(q) as i64;
        v.min(self.max_ns / 1000)
    }

    pub fn merge(&mut self, o: &Agg) {
        self.count += o.count;
        self.errors += o.errors;
        self.total_ns += o.total_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
        self.hist.add(&o.hist);
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

/// Sub-buckets per power of two: 2 significant digits need 200 distinct values at unit
/// resolution, rounded up to a power of two.
const SUB_MAG: u32 = 8;
const HALF_MAG: u32 = SUB_MAG - 1;
const SUB_MASK: u64 = (1 << SUB_MAG) - 1;

/// The counts of an HDR histogram of 2 significant digits with unit resolution (the layout of
/// `hdrhistogram::Histogram::new(2)`: the same bucket for every value, so the same
/// percentiles), recorded inline: the analyzers add two or three samples per event, and the
/// general crate's checked, resizable recording path was a tenth of the analyzer's time.
/// Grows only as far as the largest value recorded.
#[derive(Clone, Default)]
struct Hist {
    counts: Vec<u64>,
    total: u64,
}

/// Index of the bucket that counts `v`.
#[inline]
fn index_for(v: u64) -> usize {
    let bucket = (64 - SUB_MAG) - (v | SUB_MASK).leading_zeros();
    let sub = v >> bucket;
    (((bucket + 1) << HALF_MAG) as u64 + sub - (1 << HALF_MAG)) as usize
}

/// The lowest value counted at `index`, and the width of its range.
fn value_for(index: usize) -> (u64, u64) {
    let mut bucket = (index >> HALF_MAG) as i64 - 1;
    let mut sub = (index as u64 & ((1 << HALF_MAG) - 1)) + (1 << HALF_MAG);
    if bucket < 0 {
        sub -= 1 << HALF_MAG;
        bucket = 0;
    }
    (sub << bucket, 1 << bucket)
}

impl Hist {
    #[inline]
    fn record(&mut self, v: u64) {
        let i = index_for(v);
        if i >= self.counts.len() {
            self.grow(i);
        }
        self.counts[i] += 1;
        self.total += 1;
    }

    #[cold]
    fn grow(&mut self, i: usize) {
        // Whole powers of two at a time, as the histogram's own auto-resize does.
        let len = ((i >> HALF_MAG) + 1) << HALF_MAG;
        self.counts.resize(len.max(1 << SUB_MAG), 0);
    }

    fn add(&mut self, o: &Hist) {
        if o.counts.len() > self.counts.len() {
            self.counts.resize(o.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.total += o.total;
    }

    /// `hdrhistogram::Histogram::value_at_quantile`: the highest value equivalent to the
    /// bucket where the cumulative count first reaches the quantile's share (0 when empty).
    fn value_at_quantile(&self, q: f64) -> u64 {
        let q = q.min(1.0);
        let want = ((q * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                let (low, width) = value_for(i);
                return if q == 0.0 { low } else { low + (width - 1) };
            }
        }
        0
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

    /// The inline histogram gives the percentiles `hdrhistogram` gives for the same samples
    /// (it replaced that crate on the hot path; reports must not move by a microsecond),
    /// across bucket edges, merges and huge values.
    #[test]
    fn percentiles_are_those_of_hdrhistogram() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..40 {
            let mut ours = Hist::default();
            let mut other = Hist::default();
            let mut theirs = hdrhistogram::Histogram::<u64>::new(2).unwrap();
            let n = 1 + next() % 3000;
            for k in 0..n {
                let r = next();
                // Mostly small values, some at bucket edges, a few huge.
                let v = match r % 7 {
                    // (µs of an i64 of ns stay below 2^54.)
                    0 => (r >> 10) >> (r % 54),
                    1 => (1u64 << (r % 40)).saturating_sub(r >> 62),
                    _ => (r >> 20) % (1 << (4 + round % 20)),
                };
                theirs.record(v).unwrap();
                if k % 3 == 0 {
                    other.record(v);
                } else {
                    ours.record(v);
                }
            }
            ours.add(&other);
            for q in [0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0] {
                assert_eq!(
                    ours.value_at_quantile(q),
                    theirs.value_at_quantile(q),
                    "round {round}, q {q}"
                );
            }
        }
        let empty = hdrhistogram::Histogram::<u64>::new(2).unwrap();
        assert_eq!(
            Hist::default().value_at_quantile(0.5),
            empty.value_at_quantile(0.5)
        );
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(Agg::default().dist().p99_us, 0);
    }
}
