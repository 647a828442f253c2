//! A mergeable quantile sketch with a stated relative error bound, for
//! latency statistics of runs too long to keep every value.
//!
//! A value `x ≥ 0` (an `f64`: nanoseconds, or milliseconds) falls in the
//! bucket of the top [`MANTISSA_BITS`] bits of its mantissa and its
//! exponent: the bits of `x` shifted right by `52 − MANTISSA_BITS`, so the
//! bucket is found by integer arithmetic alone (no logarithm, whose last
//! bit may differ between machines: same values, same buckets, same
//! bytes). A bucket `[lo, hi)` is at most `lo · 2^−MANTISSA_BITS` wide and
//! reports its midpoint, so a value read back is within
//! [`RELATIVE_ERROR`] (`2^−(MANTISSA_BITS + 1)`, 0.195 %) of every value
//! in its bucket; zeros are counted apart and read back as 0. These are
//! DDSketch's log-spaced buckets (Masson, Rim and Lee, VLDB 2019) with a
//! base of `2^(1/256)` taken from the float's own layout.
//!
//! **The bound.** [`Sketch::order_statistic`]`(k)` is within
//! [`RELATIVE_ERROR`] of the exact `k`-th smallest value (0-based), and
//! within the smallest and largest values, which are kept exactly; a
//! linear interpolation between two order statistics (numpy's
//! `percentile`, the summary's `p90`) is then within the same relative
//! error of the exact interpolation, being a convex combination of two
//! values each within it. The count, minimum and maximum are exact; the
//! mean and the population standard deviation come from a running
//! (Welford) mean and sum of squared deviations, exact up to float
//! rounding.
//!
//! **Mergeable.** [`Sketch::merge`] adds another sketch's buckets: the
//! merged sketch is the one the two streams of values would have made
//! together (its buckets exactly; its moments by Chan's formula).
//!
//! **Size.** One `u64` count per bucket between the smallest and the
//! largest nonzero value's: 256 buckets per doubling, so nanoseconds from
//! 1 µs to one hour (32 doublings) take 8,192 buckets, 64 KiB, whatever
//! the number of values.

/// Mantissa bits that choose a value's bucket.
pub const MANTISSA_BITS: u32 = 8;

/// The bound on the relative error of a value read back,
/// `2^−(MANTISSA_BITS + 1)`.
pub const RELATIVE_ERROR: f64 = 1.0 / (1u64 << (MANTISSA_BITS + 1)) as f64;

/// The shift from a value's bits to its bucket key.
const SHIFT: u32 = 52 - MANTISSA_BITS;

/// A quantile sketch of non-negative values (see the module
/// documentation for its error bound).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sketch {
    /// Values that were 0.
    zeros: u64,
    /// The key of `counts[0]`.
    first_key: u64,
    /// Values per bucket, from `first_key` on.
    counts: Vec<u64>,
    count: u64,
    min: f64,
    max: f64,
    /// Welford's running mean and sum of squared deviations.
    mean: f64,
    m2: f64,
}

fn key(x: f64) -> u64 {
    x.to_bits() >> SHIFT
}

/// The midpoint of bucket `key`.
fn midpoint(key: u64) -> f64 {
    let lo = f64::from_bits(key << SHIFT);
    let hi = f64::from_bits((key + 1) << SHIFT);
    lo + (hi - lo) / 2.0
}

impl Sketch {
    /// An empty sketch.
    pub fn new() -> Self {
        Sketch::default()
    }

    /// Adds one value (negative values and NaN count as 0: latencies are
    /// never negative).
    pub fn add(&mut self, x: f64) {
        let x = if x > 0.0 { x } else { 0.0 };
        if x == 0.0 {
            self.zeros += 1;
        } else {
            let k = key(x);
            if self.counts.is_empty() {
                self.first_key = k;
                self.counts.push(0);
            } else if k < self.first_key {
                let grow = (self.first_key - k) as usize;
                self.counts.splice(0..0, std::iter::repeat_n(0, grow));
                self.first_key = k;
            } else if k - self.first_key >= self.counts.len() as u64 {
                self.counts.resize((k - self.first_key) as usize + 1, 0);
            }
            self.counts[(k - self.first_key) as usize] += 1;
        }
        if self.count == 0 {
            (self.min, self.max) = (x, x);
        } else {
            self.min = self.min.min(x);
            self.max = self.max.max(x);
        }
        self.count += 1;
        let d = x - self.mean;
        self.mean += d / self.count as f64;
        self.m2 += d * (x - self.mean);
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Sketch) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = other.clone();
            return;
        }
        if !other.counts.is_empty() {
            if self.counts.is_empty() {
                self.first_key = other.first_key;
            }
            let lo = self.first_key.min(other.first_key);
            let hi = (self.first_key + self.counts.len() as u64).max(other.first_key + other.counts.len() as u64);
            let mut counts = vec![0u64; (hi - lo) as usize];
            for (from, first) in [(&self.counts, self.first_key), (&other.counts, other.first_key)] {
                let at = (first - lo) as usize;
                for (c, n) in counts[at..at + from.len()].iter_mut().zip(from) {
                    *c += n;
                }
            }
            self.counts = counts;
            self.first_key = lo;
        }
        self.zeros += other.zeros;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        let (na, nb) = (self.count as f64, other.count as f64);
        let n = na + nb;
        let d = other.mean - self.mean;
        self.mean += d * nb / n;
        self.m2 += other.m2 + d * d * na * nb / n;
        self.count += other.count;
    }

    /// Values added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The smallest value (0 when empty).
    pub fn min(&self) -> f64 {
        self.min
    }

    /// The largest value (0 when empty).
    pub fn max(&self) -> f64 {
        self.max
    }

    /// The mean (0 when empty).
    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// The population standard deviation (0 when empty).
    pub fn std(&self) -> f64 {
        if self.count == 0 { 0.0 } else { (self.m2 / self.count as f64).max(0.0).sqrt() }
    }

    /// The `k`-th smallest value (0-based, below [`Sketch::count`]) as
    /// the sketch knows it: within [`RELATIVE_ERROR`] of the exact one,
    /// and within the minimum and maximum.
    pub fn order_statistic(&self, k: u64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        if k == 0 {
            return self.min;
        }
        if k + 1 >= self.count {
            return self.max;
        }
        if k < self.zeros {
            return 0.0;
        }
        let mut seen = self.zeros;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if k < seen {
                return midpoint(self.first_key + i as u64).clamp(self.min, self.max);
            }
        }
        self.max
    }

    /// The buckets held (for memory accounting and tests).
    pub fn buckets(&self) -> usize {
        self.counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed xorshift64 stream of latencies spread over six decades
    /// (1 µs to 1 s in ns), some zeros among them.
    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                if s.is_multiple_of(50) {
                    0.0
                } else {
                    (1e3 * 10f64.powf((s >> 11) as f64 / (1u64 << 53) as f64 * 6.0)).round()
                }
            })
            .collect()
    }

    #[test]
    fn every_order_statistic_is_within_the_bound() {
        let v = values(20_000, 0x9E37_79B9_7F4A_7C15);
        let mut s = Sketch::new();
        for &x in &v {
            s.add(x);
        }
        let mut sorted = v.clone();
        sorted.sort_by(f64::total_cmp);
        for (k, &exact) in sorted.iter().enumerate() {
            let got = s.order_statistic(k as u64);
            assert!((got - exact).abs() <= RELATIVE_ERROR * exact, "k {k}: {got} against {exact}");
        }
        assert_eq!(s.count(), 20_000);
        assert_eq!((s.min(), s.max()), (sorted[0], sorted[sorted.len() - 1]));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let std = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64).sqrt();
        assert!((s.mean() - mean).abs() <= 1e-9 * mean);
        assert!((s.std() - std).abs() <= 1e-9 * std);
        // 0.195 %: 2^-9.
        assert_eq!(RELATIVE_ERROR, 0.001953125);
    }

    #[test]
    fn a_merge_is_the_sketch_of_both_streams() {
        let (a, b) = (values(5_000, 1), values(7_000, 2));
        let (mut sa, mut sb, mut both) = (Sketch::new(), Sketch::new(), Sketch::new());
        for &x in &a {
            sa.add(x);
            both.add(x);
        }
        for &x in &b {
            sb.add(x);
            both.add(x);
        }
        sa.merge(&sb);
        assert_eq!((sa.zeros, sa.first_key, &sa.counts), (both.zeros, both.first_key, &both.counts));
        assert_eq!((sa.count(), sa.min(), sa.max()), (both.count(), both.min(), both.max()));
        assert!((sa.mean() - both.mean()).abs() <= 1e-9 * both.mean());
        assert!((sa.std() - both.std()).abs() <= 1e-9 * both.std());
        for k in (0..12_000).step_by(97) {
            assert_eq!(sa.order_statistic(k), both.order_statistic(k));
        }
        // Merging into and from an empty sketch.
        let mut e = Sketch::new();
        e.merge(&both);
        assert_eq!(e, both);
        both.merge(&Sketch::new());
        assert_eq!(e, both);
    }

    #[test]
    fn buckets_are_found_by_integer_arithmetic() {
        // 1000 = 1.953125 × 2^9: exponent 9, mantissa 0.953125 × 256 = 244
        // exactly, so its bucket is [1000, 1000 + 2^9/256 = 1002) and
        // reads back 1001 (0.1 % off).
        assert_eq!(midpoint(key(1000.0)), 1001.0);
        let mut s = Sketch::new();
        for x in [0.0, 0.0, 1000.0, 1001.5, 5.0e9] {
            s.add(x);
        }
        assert_eq!(s.order_statistic(1), 0.0);
        assert_eq!(s.order_statistic(2), 1001.0);
        assert_eq!(s.order_statistic(3), 1001.0);
        assert_eq!(s.order_statistic(4), 5.0e9);
        // 1000 to 5e9: 22.25 doublings of 256 buckets.
        assert_eq!(s.buckets() as u64, key(5.0e9) - key(1000.0) + 1);
        assert!(s.buckets() <= 23 * 256);
    }
}
