//! Instruments for latencies: a histogram with under 1 % error
//! ([`Histogram`]), the exact values of a statistic in compact chunks
//! ([`Column`]), and the statistics made of them ([`Stat`]).

use serde::Serialize;
use sim_core::SimDuration;

use crate::stats::sketch::Sketch;

/// A histogram of durations with under 1% relative error: exact below 256
/// ns, then 128 sub-buckets per power of two. Exact count, sum and max.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum_ns: u128,
    max_ns: u64,
    /// The least value (meaningless while `count` is 0).
    min_ns: u64,
}

const SUB: u32 = 7; // 2^7 = 128 sub-buckets

impl Histogram {
    fn index(v: u64) -> usize {
        if v < 256 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // >= 8
        let shift = e - SUB;
        256 + ((e - 8) as usize) * 128 + ((v >> shift) as usize - 128)
    }

    /// The midpoint of bucket `i`'s range.
    fn value(i: usize) -> u64 {
        if i < 256 {
            return i as u64;
        }
        let e = (i - 256) / 128 + 8;
        let m = ((i - 256) % 128 + 128) as u64;
        let shift = e as u32 - SUB;
        (m << shift) + (1u64 << shift) / 2
    }

    /// Adds one observation.
    #[inline]
    pub fn record(&mut self, d: SimDuration) {
        self.record_n(d, 1);
    }

    /// Adds `n` observations of the same value.
    #[inline]
    pub fn record_n(&mut self, d: SimDuration, n: u64) {
        if n == 0 {
            return;
        }
        let v = d.as_nanos();
        let i = Self::index(v);
        if i >= self.counts.len() {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += n;
        self.min_ns = if self.count == 0 { v } else { self.min_ns.min(v) };
        self.count += n;
        self.sum_ns += u128::from(v) * u128::from(n);
        self.max_ns = self.max_ns.max(v);
    }

    /// Adds every observation of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        if other.counts.len() > self.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        if other.count > 0 {
            self.min_ns = if self.count == 0 { other.min_ns } else { self.min_ns.min(other.min_ns) };
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// Observations.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The q-quantile (0..=1), as the midpoint of its bucket, in ms.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(i).min(self.max_ns) as f64 / 1e6;
            }
        }
        self.max_ns as f64 / 1e6
    }

    /// The `k`-th smallest observation (from 0; the largest past the end),
    /// ns: the midpoint of its bucket, kept within the least and the
    /// largest observation, so within 2⁻⁸ of the exact value (exact below
    /// 256 ns, and when every observation is the same); 0 when empty.
    pub fn order_statistic_ns(&self, k: u64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen > k {
                return Self::value(i).clamp(self.min_ns, self.max_ns);
            }
        }
        self.max_ns
    }

    /// Summary statistics, ms.
    pub fn stat(&self) -> Stat {
        if self.count == 0 {
            return Stat::default();
        }
        Stat {
            count: self.count,
            mean: self.sum_ns as f64 / self.count as f64 / 1e6,
            median: self.quantile_ms(0.5),
            p90: self.quantile_ms(0.9),
            p95: self.quantile_ms(0.95),
            p99: self.quantile_ms(0.99),
            max: self.max_ns as f64 / 1e6,
        }
    }
}

/// Mean, median, tail percentiles and max of one metric, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Stat {
    /// Observations.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub median: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

impl Stat {
    /// Statistics of exact values (ms); percentiles interpolate linearly
    /// between order statistics, as numpy's default does.
    pub fn of(mut values: Vec<f64>) -> Stat {
        if values.is_empty() {
            return Stat::default();
        }
        values.sort_unstable_by(f64::total_cmp);
        let n = values.len();
        let pct = |q: f64| {
            let pos = q * (n - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            values[lo] + (values[hi] - values[lo]) * (pos - lo as f64)
        };
        Stat {
            count: n as u64,
            mean: values.iter().sum::<f64>() / n as f64,
            median: pct(0.5),
            p90: pct(0.9),
            p95: pct(0.95),
            p99: pct(0.99),
            max: values[n - 1],
        }
    }
}

impl Stat {
    /// [`Stat::of`] of these nanoseconds as milliseconds (`ns / 1e6`), to
    /// the last bit: sorting the integers orders the milliseconds alike,
    /// and the sum and the interpolation run over the same `f64`s in the
    /// same order.
    pub fn of_nanos(mut values: Vec<u64>) -> Stat {
        sort_nanos(&mut values);
        Stat::of_sorted_nanos(&values)
    }

    /// The statistics of a sketch's values over `per_ms` (1e6 for
    /// nanoseconds), as [`Stat::of_sorted_nanos`] computes them from the
    /// exact values: the percentiles within [`crate::stats::sketch::RELATIVE_ERROR`]
    /// of the exact ones, the count and maximum exact, the mean exact up
    /// to float rounding.
    pub fn of_sketch(s: &Sketch, per_ms: f64) -> Stat {
        let n = s.count();
        if n == 0 {
            return Stat::default();
        }
        let pct = |q: f64| {
            let pos = q * (n - 1) as f64;
            let (lo, hi) = (pos.floor() as u64, pos.ceil() as u64);
            let (a, b) = (s.order_statistic(lo) / per_ms, s.order_statistic(hi) / per_ms);
            a + (b - a) * (pos - lo as f64)
        };
        Stat {
            count: n,
            mean: s.mean() / per_ms,
            median: pct(0.5),
            p90: pct(0.9),
            p95: pct(0.95),
            p99: pct(0.99),
            max: s.max() / per_ms,
        }
    }

    /// [`Stat::of_nanos`] of values already sorted.
    pub fn of_sorted_nanos(values: &[u64]) -> Stat {
        if values.is_empty() {
            return Stat::default();
        }
        let ms = |ns: u64| ns as f64 / 1e6;
        let n = values.len();
        let pct = |q: f64| {
            let pos = q * (n - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            let (a, b) = (ms(values[lo]), ms(values[hi]));
            a + (b - a) * (pos - lo as f64)
        };
        Stat {
            count: n as u64,
            mean: values.iter().map(|&v| ms(v)).sum::<f64>() / n as f64,
            median: pct(0.5),
            p90: pct(0.9),
            p95: pct(0.95),
            p99: pct(0.99),
            max: ms(values[n - 1]),
        }
    }
}

/// Values per chunk of a [`Column`].
const CHUNK: usize = 1 << 16;

/// One chunk of a column: 4 bytes a value while every value fits in them.
#[derive(Clone, Debug)]
enum Chunk {
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

/// The exact values (nanoseconds) of one summary statistic, one per
/// request that has it, compactly: in chunks of 65,536 (so that growing
/// never holds twice the column), each 4 bytes a value until a value
/// needs 8. The summary statistics are computed from them exactly as
/// [`Stat::of`] computes them from milliseconds.
///
/// Bounded: with [`Column::set_exact_limit`], once the column holds that
/// many values it moves them into a [`Sketch`] and from then on adds
/// each chunk to it as the chunk fills, so it holds at most the limit
/// (rounded up to a chunk) plus the sketch's buckets, however many values
/// come; its statistics are then the sketch's (`Values::Sketch`, within
/// [`crate::stats::sketch::RELATIVE_ERROR`]).
#[derive(Clone, Debug, Default)]
pub struct Column {
    chunks: Vec<Chunk>,
    len: usize,
    /// Values kept exactly at most, if bounded.
    limit: Option<usize>,
    /// The values are `f64` bits rather than nanoseconds.
    f64_bits: bool,
    /// The values past the limit (and those before it), once it was met.
    sketch: Option<Box<Sketch>>,
}

/// A column's values, taken for its statistics: every value sorted, or
/// the sketch they went into (each as the column reads its values:
/// nanoseconds, or the `f64` its bits are).
#[derive(Clone, Debug)]
pub enum Values {
    /// Every value, sorted.
    Sorted(Vec<u64>),
    /// The sketch of a bounded column that passed its limit.
    Sketch(Box<Sketch>),
}

impl Column {
    /// A column of `f64` values pushed as their bits (non-negative, so
    /// their bits order as they do).
    pub fn of_f64_bits() -> Self {
        Column { f64_bits: true, ..Column::default() }
    }

    /// Keeps at most `limit` values exactly (rounded up to a whole chunk
    /// of 65,536), then sketches them; `None` keeps every value. Set it
    /// before the first value.
    pub fn set_exact_limit(&mut self, limit: Option<usize>) {
        self.limit = limit;
    }

    /// Adds one value.
    #[inline]
    pub fn push(&mut self, ns: u64) {
        // Into the last chunk while it has room and the value its width.
        if !self.len.is_multiple_of(CHUNK) {
            match self.chunks.last_mut() {
                Some(Chunk::Narrow(v)) if ns <= u64::from(u32::MAX) => {
                    v.push(ns as u32);
                    self.len += 1;
                    return;
                }
                Some(Chunk::Wide(v)) => {
                    v.push(ns);
                    self.len += 1;
                    return;
                }
                _ => {}
            }
        }
        self.push_new_chunk_or_wider(ns);
    }

    /// A value as a number.
    fn number(&self, v: u64) -> f64 {
        if self.f64_bits { f64::from_bits(v) } else { v as f64 }
    }

    /// Moves every chunk's values into the sketch.
    fn drain_into_sketch(&mut self) {
        let mut sketch = self.sketch.take().unwrap_or_default();
        for c in std::mem::take(&mut self.chunks) {
            match c {
                Chunk::Narrow(v) => v.iter().for_each(|&n| sketch.add(self.number(u64::from(n)))),
                Chunk::Wide(v) => v.iter().for_each(|&n| sketch.add(self.number(n))),
            }
        }
        self.sketch = Some(sketch);
    }

    /// [`Column::push`] of a value that starts a chunk or needs a narrow
    /// chunk widened.
    #[inline(never)]
    fn push_new_chunk_or_wider(&mut self, ns: u64) {
        if self.len.is_multiple_of(CHUNK) {
            // A bounded column past its limit: the full chunks go into
            // the sketch.
            if self.limit.is_some_and(|l| self.len >= l) && !self.chunks.is_empty() {
                self.drain_into_sketch();
            }
            self.chunks.push(Chunk::Narrow(Vec::with_capacity(CHUNK)));
        }
        self.len += 1;
        let last = self.chunks.last_mut().expect("a chunk was just made");
        match last {
            Chunk::Narrow(v) => match u32::try_from(ns) {
                Ok(n) => v.push(n),
                Err(_) => {
                    let mut w = Vec::with_capacity(CHUNK);
                    w.extend(v.iter().map(|&n| u64::from(n)));
                    w.push(ns);
                    *last = Chunk::Wide(w);
                }
            },
            Chunk::Wide(v) => v.push(ns),
        }
    }

    /// Its values (the column is emptied): sorted, or, when it passed its
    /// limit, the sketch of every value.
    pub fn take_values(&mut self) -> Values {
        if self.sketch.is_some() {
            self.drain_into_sketch();
            self.len = 0;
            return Values::Sketch(self.sketch.take().expect("drained into it"));
        }
        Values::Sorted(self.take_sorted())
    }

    /// Values held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The statistics of its values (nanoseconds), in ms (the column is
    /// emptied).
    pub fn take_stat(&mut self) -> Stat {
        match self.take_values() {
            Values::Sorted(v) => Stat::of_sorted_nanos(&v),
            Values::Sketch(s) => Stat::of_sketch(&s, 1e6),
        }
    }

    /// Its values, sorted (the column is emptied; a sketched column's
    /// values are those it has not sketched: use [`Column::take_values`]).
    pub fn take_sorted(&mut self) -> Vec<u64> {
        let mut all: Vec<u64> = Vec::with_capacity(self.len);
        for c in std::mem::take(&mut self.chunks) {
            match c {
                Chunk::Narrow(v) => all.extend(v.iter().map(|&n| u64::from(n))),
                Chunk::Wide(v) => all.extend_from_slice(&v),
            }
        }
        self.len = 0;
        sort_nanos(&mut all);
        all
    }
}

/// Up to this many values the comparison sort is kept: its adaptive paths
/// (runs, many equal values) make it as quick as the radix sort's passes
/// on the columns of runs this size (the end-to-end benchmark's 10^4
/// requests: 35 instructions a value, against the radix sort's 60), and
/// the radix sort wins from there on (20k requests of the
/// shipped Llama scenario: 220 a value, against 60; a comparison sort's
/// cost grows as log n).
const RADIX_MIN: usize = 1 << 14;

/// Digits of a radix sort pass: 2^11 counts (16 KiB) stay in the L1 cache.
const RADIX_BITS: u32 = 11;

/// Sorts `v` ascending: a comparison sort up to [`RADIX_MIN`] values, a
/// radix sort above ([`radix_sort`]). The result is the same sequence
/// either way (equal `u64`s are indistinguishable).
fn sort_nanos(v: &mut Vec<u64>) {
    if v.len() <= RADIX_MIN {
        v.sort_unstable();
    } else if !v.is_sorted() {
        radix_sort(v);
    }
}

/// Sorts `v` ascending with a least-significant-digit radix sort, 11 bits
/// a pass. A column holds nanoseconds below 2^44 (4.9 hours) for most
/// runs, so four passes over the values, and a pass whose digit every
/// value shares is skipped: a summary of 10^6 requests costs a few stores
/// a value instead of a comparison sort's 20 comparisons.
fn radix_sort(v: &mut Vec<u64>) {
    const R: usize = 1 << RADIX_BITS;
    const PASSES: usize = 64usize.div_ceil(RADIX_BITS as usize);
    let top = v.iter().fold(0u64, |m, &x| m | x);
    let passes = (64 - top.leading_zeros() as usize).div_ceil(RADIX_BITS as usize);
    // Every pass's counts in one read of the values.
    let mut counts = vec![[0usize; R]; passes.min(PASSES)];
    for &x in v.iter() {
        for (p, c) in counts.iter_mut().enumerate() {
            c[((x >> (p as u32 * RADIX_BITS)) as usize) & (R - 1)] += 1;
        }
    }
    let n = v.len();
    let mut from = std::mem::take(v);
    let mut to = vec![0u64; n];
    for (p, c) in counts.iter_mut().enumerate() {
        if c.contains(&n) {
            continue; // every value has this digit: the order stands
        }
        let mut at = 0;
        for k in c.iter_mut() {
            (*k, at) = (at, at + *k);
        }
        let shift = p as u32 * RADIX_BITS;
        for &x in &from {
            let d = ((x >> shift) as usize) & (R - 1);
            to[c[d]] = x;
            c[d] += 1;
        }
        std::mem::swap(&mut from, &mut to);
    }
    *v = from;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_column_keeps_every_value_across_chunks_and_widenings() {
        // Four chunks of 65,536; values past u32::MAX at the first's first
        // and last places, at the third's first and in the fourth: those
        // chunks are widened, the second stays narrow.
        let n = 3 * CHUNK + 5_000;
        let wide = [0, CHUNK - 1, 2 * CHUNK, 3 * CHUNK + 17];
        let values: Vec<u64> = (0..n as u64)
            .map(|i| {
                if wide.contains(&(i as usize)) { (1 << 40) + i } else { i.wrapping_mul(2_654_435_761) % 3_000_000_000 }
            })
            .collect();
        let mut c = Column::default();
        for &v in &values {
            c.push(v);
        }
        assert_eq!(c.len(), n);
        let kinds: Vec<bool> = c.chunks.iter().map(|k| matches!(k, Chunk::Wide(_))).collect();
        assert_eq!(kinds, [true, false, true, true]);
        let mut expected = values;
        expected.sort_unstable();
        assert_eq!(c.take_sorted(), expected);
        assert!(c.is_empty());
        // A column of narrow values stays narrow.
        let mut c = Column::default();
        for v in 0..(CHUNK as u64 + 3) {
            c.push(v * 3);
        }
        assert!(c.chunks.iter().all(|k| matches!(k, Chunk::Narrow(_))));
        assert_eq!(c.take_sorted(), (0..(CHUNK as u64 + 3)).map(|v| v * 3).collect::<Vec<_>>());
    }

    /// A bounded column holds at most its limit (a whole chunk) plus one
    /// chunk exactly, and its statistics are within the sketch's bound of
    /// the exact column's: 5 chunks of values over six decades, limit one
    /// chunk.
    #[test]
    fn a_bounded_column_sketches_past_its_limit_within_the_bound() {
        let n = 5 * CHUNK + 123;
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let values: Vec<u64> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (1e3 * 10f64.powf((s >> 11) as f64 / (1u64 << 53) as f64 * 6.0)) as u64
            })
            .collect();
        let (mut exact, mut bounded) = (Column::default(), Column::default());
        bounded.set_exact_limit(Some(CHUNK));
        for &v in &values {
            exact.push(v);
            bounded.push(v);
            assert!(bounded.chunks.len() <= 2, "at most the limit and one chunk exact");
        }
        assert!(bounded.sketch.is_some());
        let (e, b) = (exact.take_stat(), bounded.take_stat());
        assert_eq!((b.count, b.max), (e.count, e.max));
        assert!((b.mean - e.mean).abs() <= 1e-9 * e.mean, "{} {}", b.mean, e.mean);
        for (x, y) in [(b.median, e.median), (b.p90, e.p90), (b.p95, e.p95), (b.p99, e.p99)] {
            assert!((x - y).abs() <= crate::stats::sketch::RELATIVE_ERROR * y, "{x} against {y}");
            assert_ne!(x, 0.0);
        }
        // Below its limit a bounded column is exact, bit for bit.
        let mut small = Column::default();
        small.set_exact_limit(Some(CHUNK));
        let mut plain = Column::default();
        for &v in &values[..CHUNK] {
            small.push(v);
            plain.push(v);
        }
        assert_eq!(small.take_stat(), plain.take_stat());
        // An f64 column (bench's TPOT, ms as bits) sketches the values, not
        // the bits.
        let mut tpot = Column::of_f64_bits();
        tpot.set_exact_limit(Some(0));
        for i in 0..(2 * CHUNK as u64) {
            tpot.push((4.0 + (i % 100) as f64 / 100.0).to_bits());
        }
        match tpot.take_values() {
            Values::Sketch(sk) => {
                assert_eq!(sk.count(), 2 * CHUNK as u64);
                assert_eq!((sk.min(), sk.max()), (4.0, 4.99));
            }
            Values::Sorted(_) => panic!("a column past its limit is sketched"),
        }
    }

    proptest! {
        /// The radix sort gives the comparison sort's sequence, on values of
        /// every width (a shared digit's skipped pass included).
        #[test]
        fn the_radix_sort_sorts_as_sort_unstable_does(
            mut v in prop::collection::vec(
                prop_oneof![0u64..1 << 11, 0u64..1 << 33, any::<u64>(), (0u64..4).prop_map(|k| k << 40)],
                0..3000,
            ),
            shift in 0u32..20,
        ) {
            for x in &mut v {
                *x <<= shift;
            }
            let mut expected = v.clone();
            expected.sort_unstable();
            let mut w = v.clone();
            radix_sort(&mut v);
            prop_assert_eq!(&v, &expected);
            sort_nanos(&mut w);
            prop_assert_eq!(w, expected);
        }
    }

    #[test]
    fn column_stats_are_those_of_the_milliseconds() {
        // Values on both sides of 2^32 ns, so a chunk widens mid-way, and
        // more than one chunk.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut col = Column::default();
        let mut ms = Vec::new();
        for i in 0..(CHUNK as u64 * 2 + 77) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let ns = if i % 1000 == 999 { x % (1 << 40) } else { x % 3_000_000_000 };
            col.push(ns);
            ms.push(SimDuration::from_nanos(ns).as_millis_f64());
        }
        assert_eq!(col.len(), ms.len());
        let a = col.take_stat();
        let b = Stat::of(ms);
        assert_eq!(a, b);
        assert_eq!(a.mean.to_bits(), b.mean.to_bits());
        assert!(col.is_empty());
        assert_eq!(Column::default().take_stat(), Stat::default());
    }
}
