//! Metrics: a latency histogram, summary statistics in vLLM `bench serve`
//! terms, and exact timelines.
//!
//! # Timelines
//!
//! A rank's or a link's timeline is change-driven: a row (time, series,
//! value) for each series at each instant at which its value changed,
//! with the value it had when the instant ended ([`Timeline`]). The value
//! of a series at any time is that of its last row at or before it (every
//! series has a row at time zero), so the rows are the exact step
//! function: time-weighted means over them (occupancy, busy share, KV use)
//! are the exact ones, the last change before an idle period is there, and
//! several changes in one instant give one row with the final value.
//!
//! Where the values come from:
//! - A rank sets every series at the end of each instant it got messages
//!   at (its `Msg::Kick`), and at a crash. A run of pure decode steps is
//!   one event, but its steps change the KV counts (a member crossing a
//!   block boundary): the scheduler keeps the pool's counts after each of
//!   the run's steps that changes them, with the step's start, as it plans
//!   the run (`scheduler::plan`), and the rank writes them as rows once the
//!   steps are known to have happened: at the run's end, or at whatever
//!   cuts it (the steps that a cut drops are dropped from them too). Those
//!   rows are older than the event that writes them, so a rank holds the
//!   run's slice of the log back from its first planned step on until they
//!   are written (`sim` streams out only the rows before the earliest
//!   hold); the held rows are those of a run in flight, bounded by its
//!   length.
//! - A link sets its series after every message it handles.
//!
//! Why change-driven rather than sampled: sampling can only be exact at
//! its sample instants, and a time-weighted mean over samples is not the
//! exact one; the rows a change-driven timeline writes are as few as the
//! changes, and writing them needs no event of its own. Nothing of a run
//! depends on its timeline: the runs of decode steps are not cut at sample
//! times (they were, when a timeline was sampled at `timeline_interval_ms`,
//! which now has no effect), so with the timeline off
//! ([`crate::sim::Deployment::set_keep_timelines`]) the events, the
//! records and every report number are the same, and no row is stored.
//!
//! What it costs: per instant a rank or link handles, a dozen or so
//! comparisons (and a row per changed series); per planned run of decode
//! steps, one snapshot of the KV counts per step that changes them (in a
//! buffer reused from run to run, so nothing is allocated per event); no
//! event. Rows follow the changes: on the shipped GLM 1P1D scenario
//! (2,176-token blocks) 51.2 rows a request, against 47.8 with the 100 ms
//! sampling this replaces; on Llama-3.1-8B 1P1D (16-token blocks, so a
//! decoding request changes the KV counts every 16 steps) 66 against 8.
//! Events go down (GLM 1P1D: 20.2 a request, from 29.5), since runs of
//! decode steps are no longer cut at sample times.

use std::collections::BTreeMap;

use serde::Serialize;
use sim_core::{SimDuration, SimTime};

pub use crate::bench::{Bench, Load, TokenWindows};
use crate::bench::{BenchBuilder, Dist, LoadBuilder};
use crate::config::SloSpec;
use crate::request::{Outcome, Request};
use crate::sketch::Sketch;

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

    /// [`Stat::of_nanos`] of values already sorted.
    /// The statistics of a sketch's values over `per_ms` (1e6 for
    /// nanoseconds), as [`Stat::of_sorted_nanos`] computes them from the
    /// exact values: the percentiles within [`crate::sketch::RELATIVE_ERROR`]
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

/// The run's summary, in the terms of vLLM's `bench serve`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Requests that entered.
    pub requests: u64,
    /// Requests that completed.
    pub completed: u64,
    /// Requests that failed.
    pub failed: u64,
    /// Failed requests by reason.
    pub failure_reasons: BTreeMap<String, u64>,
    /// From the first arrival to the last request's end, seconds.
    pub duration_s: f64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Output tokens of completed requests per second.
    pub output_token_throughput: f64,
    /// Prompt and output tokens of completed requests per second.
    pub total_token_throughput: f64,
    /// Completed requests meeting every SLO, per second.
    pub goodput: f64,
    /// Fraction of all requests that completed within every SLO.
    pub slo_attainment: f64,
    /// Time to first token.
    pub ttft_ms: Stat,
    /// Time per output token (after the first).
    pub tpot_ms: Stat,
    /// Inter-token latency, over every gap of every request.
    pub itl_ms: Stat,
    /// End-to-end latency.
    pub e2e_ms: Stat,
    /// Waiting for the prefill rank to start the request.
    pub prefill_queue_ms: Stat,
    /// From the first prefill step to the end of the prefill.
    pub prefill_time_ms: Stat,
    /// From the end of the prefill to the start of the transfer (routing and
    /// the decode rank's reservation).
    pub transfer_wait_ms: Stat,
    /// The transfer on the link.
    pub transfer_time_ms: Stat,
    /// From the end of the transfer to the first decode step.
    pub decode_queue_ms: Stat,
    /// Bytes moved over links.
    pub transfer_bytes: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Prompt tokens served from prefill-side (or aggregated) prefix caches.
    pub prefill_hit_tokens: u64,
    /// Prompt tokens served from decode-side prefix caches (not moved).
    pub decode_hit_tokens: u64,
    /// The same run in `vllm bench serve`'s terms (written on its own in
    /// `report.json`, as `bench`).
    #[serde(skip)]
    pub bench: Bench,
    /// The requests in the system over the arrivals, for the overload
    /// check (not written in `summary`).
    #[serde(skip)]
    pub load: Load,
}

fn ms(d: SimDuration) -> f64 {
    d.as_millis_f64()
}

/// Whether a completed request meets every bound of `slo`.
pub fn meets_slo(r: &Request, slo: &SloSpec) -> bool {
    if r.outcome != Outcome::Completed {
        return false;
    }
    let within = |bound: Option<f64>, v: Option<SimDuration>| match (bound, v) {
        (None, _) => true,
        (Some(b), Some(v)) => ms(v) <= b,
        (Some(_), None) => true, // TPOT of a one-token output: nothing to bound
    };
    within(slo.ttft_ms, r.ttft()) && within(slo.tpot_ms, r.tpot()) && within(slo.e2e_ms, r.e2e())
}

/// Summarises finished requests; `itl` is the merged inter-token histogram,
/// `peak_tokens` the most output tokens in one 1 s window
/// ([`TokenWindows::peak`]).
pub fn summarise(records: &[Request], itl: &Histogram, peak_tokens: u64, slo: &SloSpec) -> Summary {
    let mut b = SummaryBuilder::new(slo.clone());
    for r in records {
        b.add(r);
    }
    b.finish(itl, peak_tokens)
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
/// come; its statistics are then the sketch's ([`Values::Sketch`], within
/// [`crate::sketch::RELATIVE_ERROR`]).
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

/// Builds a [`Summary`] one request at a time, in id order, keeping only
/// counters and one compact [`Column`] per latency statistic (4 or 8 bytes
/// a request each), so that a run need not keep its records. The result is
/// exactly [`summarise`]'s over the same records.
#[derive(Clone, Debug)]
pub struct SummaryBuilder {
    slo: SloSpec,
    s: Summary,
    output_tokens: u64,
    total_tokens: u64,
    good: u64,
    first: Option<SimTime>,
    last: Option<SimTime>,
    /// ttft, tpot, e2e, prefill queue, prefill time, transfer wait,
    /// transfer time, decode queue.
    cols: [Column; 8],
    bench: BenchBuilder,
    load: LoadBuilder,
}

impl SummaryBuilder {
    /// An empty summary with these SLOs.
    pub fn new(slo: SloSpec) -> Self {
        SummaryBuilder {
            slo,
            s: Summary::default(),
            output_tokens: 0,
            total_tokens: 0,
            good: 0,
            first: None,
            last: None,
            cols: Default::default(),
            bench: BenchBuilder::default(),
            load: LoadBuilder::default(),
        }
    }

    /// The percentiles of the `bench` statistics (default
    /// [`crate::bench::DEFAULT_PERCENTILES`]).
    pub fn set_percentiles(&mut self, ps: &[f64]) {
        self.bench.set_percentiles(ps);
    }

    /// Keeps at most `limit` values of each latency column exactly, then
    /// sketches them ([`Column::set_exact_limit`]): the summary's and
    /// `bench`'s percentiles are then within
    /// [`crate::sketch::RELATIVE_ERROR`] of the exact ones, and memory no
    /// longer grows with the requests. `None` (the default) keeps every
    /// value. Set it before the first request.
    pub fn set_exact_limit(&mut self, limit: Option<usize>) {
        for c in &mut self.cols {
            c.set_exact_limit(limit);
        }
        self.bench.set_exact_limit(limit);
    }

    /// Adds one request.
    pub fn add(&mut self, r: &Request) {
        self.bench.add(r, &self.slo);
        self.load.add(r);
        let s = &mut self.s;
        s.requests += 1;
        self.first = Some(self.first.map_or(r.t.arrival, |f| f.min(r.t.arrival)));
        if let Some(f) = r.t.finished {
            self.last = Some(self.last.map_or(f, |l| l.max(f)));
        }
        s.preemptions += u64::from(r.preemptions);
        s.prefill_hit_tokens += r.prefill_hit.get();
        s.decode_hit_tokens += r.decode_hit.get();
        s.transfer_bytes += r.transfer_bytes.get();
        let [ttft, tpot, e2e, pq, pt, tw, tt, dq] = &mut self.cols;
        match r.outcome {
            Outcome::Completed => {
                s.completed += 1;
                self.output_tokens += r.generated.get();
                self.total_tokens += r.generated.get() + r.prompt.get();
                if let Some(d) = r.ttft() {
                    ttft.push(d.as_nanos());
                }
                if let Some(d) = r.tpot() {
                    tpot.push(d.as_nanos());
                }
                if let Some(d) = r.e2e() {
                    e2e.push(d.as_nanos());
                }
                if meets_slo(r, &self.slo) {
                    self.good += 1;
                }
            }
            Outcome::Failed(reason) => {
                s.failed += 1;
                *s.failure_reasons.entry(reason.to_string()).or_default() += 1;
            }
            Outcome::InFlight => {}
        }
        let span = |col: &mut Column, a: Option<SimTime>, b: Option<SimTime>| {
            if let (Some(a), Some(b)) = (a, b) {
                col.push(b.saturating_since(a).as_nanos());
            }
        };
        let t = &r.t;
        span(pq, t.prefill_queued.map(|_| t.arrival), t.prefill_started);
        span(pt, t.prefill_started, t.prefill_done);
        span(tw, t.prefill_done, t.transfer_started);
        span(tt, t.transfer_started, t.transfer_done);
        span(dq, t.transfer_done, t.decode_started);
    }

    /// Requests added.
    pub fn requests(&self) -> u64 {
        self.s.requests
    }

    /// The summary; `itl` is the merged inter-token histogram, `peak_tokens`
    /// the most output tokens in one 1 s window ([`TokenWindows::peak`]).
    pub fn finish(mut self, itl: &Histogram, peak_tokens: u64) -> Summary {
        let mut s = std::mem::take(&mut self.s);
        s.itl_ms = itl.stat();
        let duration = match (self.first, self.last) {
            (Some(f), Some(l)) => (l.saturating_since(f)).as_secs_f64(),
            _ => 0.0,
        };
        s.duration_s = duration;
        if duration > 0.0 {
            s.request_throughput = s.completed as f64 / duration;
            s.output_token_throughput = self.output_tokens as f64 / duration;
            s.total_token_throughput = self.total_tokens as f64 / duration;
            s.goodput = self.good as f64 / duration;
        }
        if s.requests > 0 {
            s.slo_attainment = self.good as f64 / s.requests as f64;
        }
        let [ttft, tpot, e2e, pq, pt, tw, tt, dq] = &mut self.cols;
        // One column's values at a time, sorted, for both statistics.
        let ps = self.bench.percentiles();
        let both = |col: &mut Column| match col.take_values() {
            Values::Sorted(sorted) => (Stat::of_sorted_nanos(&sorted), Dist::of_sorted_nanos(&sorted, ps)),
            Values::Sketch(sk) => (Stat::of_sketch(&sk, 1e6), Dist::of_sketch(&sk, 1e6, ps)),
        };
        let (ttft_stat, bench_ttft) = both(ttft);
        s.ttft_ms = ttft_stat;
        let (e2e_stat, bench_e2e) = both(e2e);
        s.e2e_ms = e2e_stat;
        s.tpot_ms = tpot.take_stat();
        s.prefill_queue_ms = pq.take_stat();
        s.prefill_time_ms = pt.take_stat();
        s.transfer_wait_ms = tw.take_stat();
        s.transfer_time_ms = tt.take_stat();
        s.decode_queue_ms = dq.take_stat();
        s.bench = self.bench.finish(&s, &self.slo, bench_ttft, bench_e2e, itl, peak_tokens);
        s.load = self.load.finish();
        s
    }
}

/// What a timeline series measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// KV blocks in use.
    KvUsed,
    /// KV blocks in use by one cache group (index in the model's group list).
    KvGroupUsed(u16),
    /// KV blocks free (cached-but-unpinned included).
    KvFree,
    /// Free blocks still holding cached prefixes.
    KvCachedFree,
    /// Sequences waiting to be scheduled.
    Waiting,
    /// Sequences in the running batch.
    Running,
    /// Sources held for handoffs (prefill ranks).
    HeldSources,
    /// Handoffs waiting for their reservation, a decode rank's remote loads
    /// (decode ranks).
    PendingReservations,
    /// Transfers in flight to this rank (decode ranks).
    Transferring,
    /// Transfers in flight: waiting out the latency or on the wire (links).
    ActiveTransfers,
    /// Transfers queued behind another (FIFO links).
    QueuedTransfers,
    /// Bytes of the transfers in flight (links).
    BytesInFlight,
    /// 1 while a step is in flight (ranks) or bytes are moving (links), else
    /// 0: its time-weighted mean is the busy share.
    Busy,
    /// Requests in the system here: on a rank, every request it holds
    /// (waiting, running, and on a decode rank the handoffs waiting for
    /// their reservation or in transfer; not a prefill rank's held sources,
    /// whose requests are on their decode rank by then), so that the ranks'
    /// series add up to the requests in the whole system; on a link, the
    /// transfers in flight (a request in transfer counts on its decode rank
    /// as well).
    Requests,
}

impl Metric {
    /// A dense index, for a timeline's series table.
    fn slot(self) -> usize {
        match self {
            Metric::KvUsed => 0,
            Metric::KvFree => 1,
            Metric::KvCachedFree => 2,
            Metric::Waiting => 3,
            Metric::Running => 4,
            Metric::HeldSources => 5,
            Metric::PendingReservations => 6,
            Metric::Transferring => 7,
            Metric::ActiveTransfers => 8,
            Metric::QueuedTransfers => 9,
            Metric::BytesInFlight => 10,
            Metric::Busy => 11,
            Metric::Requests => 12,
            Metric::KvGroupUsed(g) => 13 + usize::from(g),
        }
    }
}

/// One row of a timeline: from `time` on, `metric` is `value` (until the
/// series' next row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// When.
    pub time: SimTime,
    /// What.
    pub metric: Metric,
    /// The value.
    pub value: u64,
}

/// One sample of one entity (a rank or a link, by its index in report
/// order: the ranks as `SimOutput::ranks` lists them, then the links).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntitySample {
    /// The entity's index.
    pub entity: u32,
    /// The sample.
    pub sample: Sample,
}

/// The samples of every timeline of a run, in the order they were
/// committed (each entity's in time order; across entities, rows a rank
/// writes when a run of decode steps ends can be older than other
/// entities' rows: see [`Timeline`]), shared by the timelines that log
/// into it. (A mutex, not a `RefCell`, so that reports holding timelines
/// can cross threads; it is taken once per committed instant, not per
/// event, and never contended: a run is one thread.)
pub type SampleLog = std::sync::Arc<std::sync::Mutex<Vec<EntitySample>>>;

/// The log's rows (a poisoned lock only means a panic elsewhere; the rows
/// are still whole).
pub(crate) fn log_rows(log: &SampleLog) -> std::sync::MutexGuard<'_, Vec<EntitySample>> {
    log.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where a timeline's samples go.
#[derive(Clone, Debug)]
enum Store {
    /// Its own `samples`.
    Own,
    /// Nowhere.
    Discard,
    /// A run's shared log, under this entity index.
    Log(SampleLog, u32),
}

/// One series of a timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Series {
    metric: Metric,
    /// Its value as of the last committed instant (none before its first).
    committed: Option<u64>,
    /// Its value as of the open instant.
    value: u64,
}

/// The exact timeline of one actor: change-driven rows, one per series
/// per instant at which its value changed, with the value it had when the
/// instant ended.
///
/// The actor sets its values (`set`) whenever they may have changed, at
/// the instant they changed; the values set at one instant stay open
/// until the actor sets values at a later instant (or the run commits
/// them, [`Timeline::commit_before`]), and are then committed: a row for
/// each series whose value differs from its last row. So several changes
/// in one instant give one row with the final value, a series that did
/// not change gives none, and every change, the last before an idle
/// period included, has its row at its instant: the value of a series at
/// any time is that of its last row at or before it, and time-weighted
/// means over the rows are exact.
///
/// Where the rows go is set when it is made (`sampling`): its own
/// `samples` (the default), nowhere (nothing is stored, and nothing of the
/// run depends on the timeline), or a run's shared [`SampleLog`], from
/// which `sim` streams them out in slices.
#[derive(Clone, Debug)]
pub struct Timeline {
    store: Store,
    /// The open instant.
    at: SimTime,
    /// Values were set at `at` and not committed yet.
    open: bool,
    /// The series in the order they first appeared (the order of their rows
    /// within an instant).
    series: Vec<Series>,
    /// `Metric::slot` -> position in `series` + 1 (0: not seen yet).
    index: Vec<u8>,
    /// The rows, in time order.
    pub samples: Vec<Sample>,
}

impl PartialEq for Timeline {
    /// Equal rows (wherever the rows are sent).
    fn eq(&self, other: &Self) -> bool {
        self.samples == other.samples
    }
}

impl Eq for Timeline {}

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            store: Store::Own,
            at: SimTime::ZERO,
            open: false,
            series: Vec::new(),
            index: Vec::new(),
            samples: Vec::new(),
        }
    }
}

/// Where timelines made now send their samples (see [`sampling`]).
#[derive(Clone, Debug)]
pub(crate) enum Sampling {
    /// Each keeps its own.
    Own,
    /// None is stored.
    Discard,
    /// Into this log, under the entity index last given to [`next_entity`].
    Log(SampleLog),
}

thread_local! {
    static SAMPLING: std::cell::RefCell<(Sampling, u32)> = const { std::cell::RefCell::new((Sampling::Own, 0)) };
}

/// Restores the previous [`sampling`] when dropped.
pub(crate) struct SamplingGuard(Option<(Sampling, u32)>);

impl Drop for SamplingGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.0.take() {
            SAMPLING.with(|s| *s.borrow_mut() = prev);
        }
    }
}

/// While the returned guard lives, timelines made on this thread store
/// their samples as `mode` says. [`crate::sim::build`] holds it while it
/// makes the actors: the ranks make their timelines with no arguments
/// (ranks.rs), so the setting rides beside it.
pub(crate) fn sampling(mode: Sampling) -> SamplingGuard {
    SamplingGuard(Some(SAMPLING.with(|s| std::mem::replace(&mut *s.borrow_mut(), (mode, 0)))))
}

/// The entity index of the next timeline made into a log.
pub(crate) fn next_entity(index: u32) {
    SAMPLING.with(|s| s.borrow_mut().1 = index);
}

impl Timeline {
    /// An empty timeline, storing its rows as the current `sampling` scope says.
    pub fn new() -> Self {
        let store = SAMPLING.with(|s| match &*s.borrow() {
            (Sampling::Own, _) => Store::Own,
            (Sampling::Discard, _) => Store::Discard,
            (Sampling::Log(log), e) => Store::Log(std::sync::Arc::clone(log), *e),
        });
        Timeline { store, ..Timeline::default() }
    }

    /// Stops logging (a run's report holds its timelines on their own).
    pub(crate) fn detach(&mut self) {
        if matches!(self.store, Store::Log(..)) {
            self.store = Store::Own;
        }
    }

    /// Whether it stores anything: off, [`Timeline::set`] does nothing.
    #[inline]
    pub fn keeps(&self) -> bool {
        !matches!(self.store, Store::Discard)
    }

    /// `metric` is `value` at `now` (the end of the instant decides; `now`
    /// never goes back).
    #[inline]
    pub fn set(&mut self, now: SimTime, metric: Metric, value: u64) {
        if !self.keeps() {
            return;
        }
        debug_assert!(now >= self.at || !self.open, "a timeline goes forward: {now} after {}", self.at);
        if now != self.at {
            self.commit();
            self.at = now;
        }
        self.open = true;
        let slot = metric.slot();
        if slot >= self.index.len() {
            self.index.resize(slot + 1, 0);
        }
        match self.index[slot] {
            0 => {
                self.series.push(Series { metric, committed: None, value });
                self.index[slot] = u8::try_from(self.series.len()).expect("fewer than 256 series");
            }
            i => self.series[usize::from(i) - 1].value = value,
        }
    }

    /// The value `metric` was last set to, if ever.
    pub fn last(&self, metric: Metric) -> Option<u64> {
        let i = *self.index.get(metric.slot())?;
        (i > 0).then(|| self.series[usize::from(i) - 1].value)
    }

    /// Commits the open instant if it is before `before` (every instant:
    /// `None`): its rows are written.
    pub fn commit_before(&mut self, before: Option<SimTime>) {
        if before.is_none_or(|t| self.at < t) {
            self.commit();
        }
    }

    /// Writes the rows of the open instant: one per series whose value
    /// changed since its last row.
    fn commit(&mut self) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        let at = self.at;
        let changed = self.series.iter_mut().filter(|s| s.committed != Some(s.value)).map(|s| {
            s.committed = Some(s.value);
            Sample { time: at, metric: s.metric, value: s.value }
        });
        match &self.store {
            Store::Own => self.samples.extend(changed),
            Store::Discard => {}
            Store::Log(log, entity) => {
                let entity = *entity;
                log_rows(log).extend(changed.map(|sample| EntitySample { entity, sample }));
            }
        }
    }
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
            assert!((x - y).abs() <= crate::sketch::RELATIVE_ERROR * y, "{x} against {y}");
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

    fn t(ns: u64) -> SimTime {
        SimTime::from_nanos(ns)
    }

    #[test]
    fn a_timeline_writes_each_change_once_with_the_instants_final_value() {
        let mut tl = Timeline::default();
        tl.set(t(0), Metric::Waiting, 0);
        tl.set(t(0), Metric::Running, 0);
        // Three arrivals in one nanosecond: one row, the final value.
        tl.set(t(5), Metric::Waiting, 1);
        tl.set(t(5), Metric::Waiting, 2);
        tl.set(t(5), Metric::Waiting, 3);
        tl.set(t(5), Metric::Running, 0);
        // A change and its undoing in one instant: no row.
        tl.set(t(7), Metric::Running, 1);
        tl.set(t(7), Metric::Running, 0);
        assert_eq!(tl.last(Metric::Running), Some(0));
        assert_eq!(tl.last(Metric::Busy), None);
        tl.set(t(9), Metric::Waiting, 0);
        // The open instant is written only once it is over...
        tl.commit_before(Some(t(9)));
        let row = |ns, metric, value| Sample { time: t(ns), metric, value };
        let want = [row(0, Metric::Waiting, 0), row(0, Metric::Running, 0), row(5, Metric::Waiting, 3)];
        assert_eq!(tl.samples, want);
        // ... or the run ends: the last change before an idle period is kept.
        tl.commit_before(None);
        assert_eq!(tl.samples[3..], [row(9, Metric::Waiting, 0)]);
        tl.commit_before(None);
        assert_eq!(tl.samples.len(), 4);
    }

    #[test]
    fn a_timeline_that_keeps_nothing_stores_nothing() {
        let _scope = sampling(Sampling::Discard);
        let mut tl = Timeline::new();
        assert!(!tl.keeps());
        tl.set(t(1), Metric::KvUsed, 3);
        tl.commit_before(None);
        assert!(tl.samples.is_empty());
        assert_eq!(tl.last(Metric::KvUsed), None);
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
