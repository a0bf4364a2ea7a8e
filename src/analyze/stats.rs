//! Fixed-size latency aggregates for the analyzers: count, total, max and an HDR histogram
//! (µs, 2 significant digits) for percentiles, so that statistics over a 20 GB trace cost the
//! same memory as over a small one. No sorted copy of the samples is ever kept.

use crate::event::Nanos;
use crate::report::Dist;
use hdrhistogram::Histogram;

/// Where the samples wait for the `hdrhistogram` crate: counts in the crate's own bucket
/// layout for 2 significant digits from 1 µs (256 sub-buckets, the upper 128 used past the
/// first bucket), folded into a crate `Histogram` whenever percentiles are asked for (at
/// finish), so the percentiles and their arithmetic stay the crate's. Recording here is one
/// index computation and an increment: the crate's checked, auto-resizing `record` cost ~57
/// instructions, and the analyzer records 2.8 samples per event.
#[derive(Clone, Default)]
struct Pending {
    counts: Vec<u64>,
}

/// log2 of the used half of a bucket's sub-buckets.
const HALF_MAG: u32 = 7;
/// Values below this share bucket 0, which uses all its sub-buckets.
const SUB_MASK: u64 = (1 << (HALF_MAG + 1)) - 1;
/// 64 - log2(sub-bucket count): `leading_zeros` of a bucket-0 value.
const LZ_BASE: u32 = 64 - (HALF_MAG + 1);

impl Pending {
    #[inline]
    fn index(v: u64) -> usize {
        let b = LZ_BASE - (v | SUB_MASK).leading_zeros();
        ((b as usize) << HALF_MAG) + (v >> b) as usize
    }

    /// The lowest value counted at `index` (one the crate counts in the same bucket).
    fn value_at(index: usize) -> u64 {
        let half = 1usize << HALF_MAG;
        let b = (index >> HALF_MAG) as i64 - 1;
        let sub = (index & (half - 1)) + half;
        if b < 0 {
            (sub - half) as u64
        } else {
            (sub as u64) << b
        }
    }

    #[inline]
    fn record(&mut self, v: u64) {
        let i = Self::index(v);
        match self.counts.get_mut(i) {
            Some(c) => *c += 1,
            None => self.grow_record(i),
        }
    }

    #[cold]
    #[inline(never)]
    fn grow_record(&mut self, i: usize) {
        self.counts.resize(i + 1, 0);
        self.counts[i] += 1;
    }

    fn merge(&mut self, o: &Pending) {
        if self.counts.len() < o.counts.len() {
            self.counts.resize(o.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
    }

    /// The crate's histogram of these samples.
    fn histogram(&self) -> Histogram<u64> {
        let mut h = Histogram::new(2).expect("2 significant digits is a valid histogram");
        for (i, &c) in self.counts.iter().enumerate() {
            if c > 0 {
                // Auto-resizing: it grows as far as the largest value, as when recorded.
                let _ = h.record_n(Self::value_at(i), c);
            }
        }
        h
    }
}

#[derive(Clone, Default)]
pub struct Agg {
    pub count: u64,
    pub errors: u64,
    pub total_ns: i64,
    pub max_ns: i64,
    hist: Pending,
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
        self.pct_of(&self.hist.histogram(), q)
    }

    fn pct_of(&self, h: &Histogram<u64>, q: f64) -> i64 {
        (h.value_at_quantile(q) as i64).min(self.max_ns / 1000)
    }

    pub fn merge(&mut self, o: &Agg) {
        self.count += o.count;
        self.errors += o.errors;
        self.total_ns += o.total_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
        self.hist.merge(&o.hist);
    }

    pub fn total_us(&self) -> i64 {
        self.total_ns / 1000
    }

    pub fn max_us(&self) -> i64 {
        self.max_ns / 1000
    }

    pub fn dist(&self) -> Dist {
        if self.count == 0 {
            return Dist::default();
        }
        let h = self.hist.histogram();
        Dist {
            count: self.count,
            p50_us: self.pct_of(&h, 0.5),
            p99_us: self.pct_of(&h, 0.99),
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

    /// Samples folded from the pending counts give the percentiles of the same samples
    /// recorded into the crate directly, on spread-out samples (µs from 0 to hours), merged
    /// or not: the pending layout is the crate's.
    #[test]
    fn percentiles_are_the_hdr_crates() {
        use hdrhistogram::Histogram;
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..40u32 {
            let (mut a, mut b) = (Agg::default(), Agg::default());
            let mut h = Histogram::<u64>::new(2).unwrap();
            let n = 1 + next() % 3000;
            for i in 0..n {
                // Durations of every magnitude from 0 to ~2^(14+round/2) µs (5 hours).
                let us = next() >> (next() % 64).max(50 - u64::from(round / 2));
                let ns = (us * 1000 + next() % 1000) as i64;
                if i % 3 == 0 { &mut b } else { &mut a }.add(ns);
                h.record(ns as u64 / 1000).unwrap();
            }
            a.merge(&b);
            for q in [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0] {
                let want = (h.value_at_quantile(q) as i64).min(a.max_ns / 1000);
                assert_eq!(a.pct_us(q), want, "round {round} q {q} n {n}");
            }
        }
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(Agg::default().dist().p99_us, 0);
    }
}
