//! The statistics of vLLM's `vllm bench serve` (`vllm/benchmarks/serve.py`,
//! `calculate_metrics` and the result dict it writes), under its names and
//! with its definitions, and what the overload check reads.
//!
//! vLLM's definitions, which [`Bench`] follows:
//!
//! - Only requests that succeeded count, for everything but `failed` and
//!   `duration`: TTFT, E2EL, the tokens, the throughputs, the goodput, the
//!   1 s windows.
//! - TPOT of a request is `(e2el − ttft) / (output tokens − 1)`, over the
//!   requests with more than one output token (the first token excluded).
//! - ITL is every gap between two consecutive output tokens of every
//!   request, flattened into one list.
//! - `mean_` is the mean, `std_` numpy's `np.std` (population: divided by
//!   n), `median_` `np.median`, `pN_` `np.percentile(values, N)` (numpy's
//!   default, linear interpolation between order statistics); an empty
//!   list gives 0 for all of them (`np.mean(values or 0)`).
//! - `request_goodput` counts the requests within every SLO given (TPOT of
//!   a one-token output counts as 0), per second; `null` when no SLO is set.
//! - `max_output_tokens_per_s` and `max_concurrent_requests`: 1 s windows
//!   from the first successful request's start; a token counts in the
//!   window its time falls in, a request in every window from the one of
//!   its start to the one of its end, both included; the largest window.
//!
//! Where pdsim measures differently (each said again on the field):
//!
//! - ITL percentiles and median come from the run's inter-token histogram
//!   ([`Histogram`]): each order statistic is its bucket's midpoint (kept
//!   within the smallest and largest gap), within 2⁻⁸ (0.4 %) of the exact
//!   gap; exact below 256 ns. The histogram holds the gaps of every
//!   request, including those that failed after their second token (a
//!   decode rank crash, or a run cut short). ITL mean and std are exact and
//!   over completed requests only (from each request's first and last
//!   token and the sum of its squared gaps).
//! - `max_output_tokens_per_s` counts the tokens of every request at the
//!   step that produced it, including tokens of requests that failed later
//!   (the same two cases), in windows from the first arrival, which is the
//!   first successful request's start unless the first request failed.
//!
//! The statistics are computed one record at a time (`BenchBuilder`, in
//! [`crate::stats::summary::SummaryBuilder`]) from compact columns of exact
//! values (TTFT and E2EL share the summary's columns; TPOT adds one of 8
//! bytes a completed request), counters, and heaps bounded by the requests
//! in the system at once.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::ser::{Serialize, SerializeMap, Serializer};
use sim_core::{SimDuration, SimTime};

use crate::requests::request::{Outcome, Request};
use crate::stats::histogram::{Column, Histogram, Values};
use crate::stats::sketch::Sketch;
use crate::stats::slo::SloSpec;

/// pdsim's default `--percentiles`: the median and three tail percentiles.
/// (vLLM's `--metric-percentiles` defaults to `99` alone; pass
/// `--percentiles 99` for its set.)
pub const DEFAULT_PERCENTILES: &[f64] = &[50.0, 90.0, 95.0, 99.0];

/// The name vLLM gives percentile `p` in its keys (`p{name}_ttft_ms`):
/// Python's `str(int(p)) if int(p) == p else str(p)`, so `99` for 99.0,
/// `99.9` for 99.9 and `1e-05` for 0.00001.
pub fn percentile_name(p: f64) -> String {
    if p.fract() == 0.0 && p.abs() < 1e15 {
        return format!("{}", p as i64);
    }
    // Python's repr: the shortest digits that read back the same, in
    // positional notation unless the exponent is below -4 (or 16 and up),
    // where it writes `1.5e-05`.
    let a = p.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        let s = format!("{p:e}");
        let (mantissa, exp) = s.split_once('e').expect("{:e} writes an exponent");
        let (sign, digits) = match exp.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exp),
        };
        return format!("{mantissa}e{sign}{digits:0>2}");
    }
    format!("{p}")
}

/// Checks percentiles as `--percentiles` takes them: at least one, each
/// within 0..=100 (what `np.percentile` accepts), no two with the same
/// name.
///
/// # Errors
/// The first problem, as a phrase.
pub fn check_percentiles(ps: &[f64]) -> Result<(), String> {
    if ps.is_empty() {
        return Err("expected at least one percentile".into());
    }
    let mut names = Vec::new();
    for &p in ps {
        if !(0.0..=100.0).contains(&p) {
            return Err(format!("percentile {p} is outside 0..=100"));
        }
        let name = percentile_name(p);
        if names.contains(&name) {
            return Err(format!("percentile {name} is given twice"));
        }
        names.push(name);
    }
    Ok(())
}

/// numpy's linear interpolation `a + (b − a)·t`, computed from `b` when
/// `t ≥ 0.5` as `np.lib._function_base_impl._lerp` does.
fn lerp(a: f64, b: f64, t: f64) -> f64 {
    let d = b - a;
    if t >= 0.5 { b - d * (1.0 - t) } else { a + d * t }
}

/// `np.percentile(values, p)` of the `n` sorted values `at(0..n)` (numpy's
/// default method, "linear": virtual index `(n − 1)·p/100`, interpolated
/// between its neighbours); 0 when there are none.
pub fn numpy_percentile(n: usize, at: impl Fn(usize) -> f64, p: f64) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let q = p / 100.0;
    let virtual_index = (n - 1) as f64 * q;
    if virtual_index >= (n - 1) as f64 {
        return at(n - 1);
    }
    if virtual_index < 0.0 {
        return at(0);
    }
    let below = virtual_index.floor();
    let i = below as usize;
    lerp(at(i), at(i + 1), virtual_index - below)
}

/// `np.median` of the `n` sorted values `at(0..n)`: the middle one, or the
/// mean of the middle two; 0 when there are none.
pub fn numpy_median(n: usize, at: impl Fn(usize) -> f64) -> f64 {
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => at(n / 2),
        _ => (at(n / 2 - 1) + at(n / 2)) / 2.0,
    }
}

/// One latency's statistics, in ms: `mean_`, `median_`, `std_` and the
/// chosen `pN_` of vLLM's result.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dist {
    /// Mean.
    pub mean: f64,
    /// `np.median`.
    pub median: f64,
    /// `np.std` (population).
    pub std: f64,
    /// (percentile, `np.percentile`), in the order asked for.
    pub percentiles: Vec<(f64, f64)>,
}

impl Dist {
    /// The statistics of `n` sorted values `at(0..n)` (ms) whose mean is
    /// `mean`; the std in two passes, as numpy's.
    fn of_sorted(n: usize, at: impl Fn(usize) -> f64, mean: f64, ps: &[f64]) -> Dist {
        if n == 0 {
            return Dist { percentiles: ps.iter().map(|&p| (p, 0.0)).collect(), ..Dist::default() };
        }
        let mut sq = Sum::default();
        for i in 0..n {
            let d = at(i) - mean;
            sq.add(d * d);
        }
        Dist {
            mean,
            median: numpy_median(n, &at),
            std: (sq.value() / n as f64).sqrt(),
            percentiles: ps.iter().map(|&p| (p, numpy_percentile(n, &at, p))).collect(),
        }
    }

    /// The statistics of a sketch's values over `per_ms` (1e6 for
    /// nanoseconds, 1 for milliseconds): the median and percentiles within
    /// [`crate::stats::sketch::RELATIVE_ERROR`] of numpy's over the exact values
    /// (each an interpolation of order statistics, each within it), the
    /// mean and std from the sketch's running moments.
    pub fn of_sketch(s: &Sketch, per_ms: f64, ps: &[f64]) -> Dist {
        let n = usize::try_from(s.count()).unwrap_or(usize::MAX);
        let at = |i: usize| s.order_statistic(i as u64) / per_ms;
        if n == 0 {
            return Dist { percentiles: ps.iter().map(|&p| (p, 0.0)).collect(), ..Dist::default() };
        }
        Dist {
            mean: s.mean() / per_ms,
            median: numpy_median(n, at),
            std: s.std() / per_ms,
            percentiles: ps.iter().map(|&p| (p, numpy_percentile(n, at, p))).collect(),
        }
    }

    /// The statistics of these sorted nanoseconds, as milliseconds
    /// (`ns / 1e6`); the mean from their exact sum.
    pub fn of_sorted_nanos(ns: &[u64], ps: &[f64]) -> Dist {
        let n = ns.len();
        let sum: u128 = ns.iter().map(|&v| u128::from(v)).sum();
        let mean = if n == 0 { 0.0 } else { sum as f64 / n as f64 / 1e6 };
        Dist::of_sorted(n, |i| ns[i] as f64 / 1e6, mean, ps)
    }

    /// The statistics of these sorted milliseconds (the mean by a
    /// compensated sum).
    pub fn of_sorted_ms(ms: &[f64], ps: &[f64]) -> Dist {
        let n = ms.len();
        let mut sum = Sum::default();
        for &v in ms {
            sum.add(v);
        }
        let mean = if n == 0 { 0.0 } else { sum.value() / n as f64 };
        Dist::of_sorted(n, |i| ms[i], mean, ps)
    }
}

/// A compensated (Neumaier) sum.
#[derive(Clone, Copy, Debug, Default)]
struct Sum {
    s: f64,
    c: f64,
}

impl Sum {
    fn add(&mut self, x: f64) {
        let t = self.s + x;
        self.c += if self.s.abs() >= x.abs() { (self.s - t) + x } else { (x - t) + self.s };
        self.s = t;
    }
    fn value(self) -> f64 {
        self.s + self.c
    }
}

/// The `bench` object of `report.json`: `vllm bench serve`'s result under
/// its names (the module documentation has the definitions and where pdsim
/// measures differently). Latencies in ms, rates per second, `duration` in
/// seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bench {
    /// From the first arrival to the last request's end (failed ones
    /// too), s: vLLM's wall time of the whole benchmark.
    pub duration: f64,
    /// Requests that completed.
    pub completed: u64,
    /// Requests that failed.
    pub failed: u64,
    /// Prompt tokens of the completed requests.
    pub total_input_tokens: u64,
    /// Output tokens of the completed requests.
    pub total_output_tokens: u64,
    /// `completed / duration`.
    pub request_throughput: f64,
    /// Completed requests within every SLO per second; `None` (`null`)
    /// without an SLO.
    pub request_goodput: Option<f64>,
    /// `total_output_tokens / duration`.
    pub output_throughput: f64,
    /// `(total_input_tokens + total_output_tokens) / duration`.
    pub total_token_throughput: f64,
    /// The most output tokens in one 1 s window (see the module
    /// documentation for the tokens counted).
    pub max_output_tokens_per_s: f64,
    /// The most completed requests active in one 1 s window.
    pub max_concurrent_requests: u64,
    /// Time to first token, completed requests.
    pub ttft: Dist,
    /// Time per output token after the first, completed requests with
    /// more than one output token.
    pub tpot: Dist,
    /// Inter-token latency, every gap (mean and std exact over completed
    /// requests; median and percentiles from the histogram).
    pub itl: Dist,
    /// End-to-end latency, completed requests.
    pub e2el: Dist,
}

/// One value of [`Bench::entries`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// A count.
    Int(u64),
    /// A measure.
    Float(f64),
    /// Not measured (`request_goodput` without an SLO).
    Null,
}

impl Bench {
    /// The keys of [`Bench::entries`] for these percentiles.
    pub fn keys(percentiles: &[f64]) -> Vec<String> {
        let d = Dist { percentiles: percentiles.iter().map(|&p| (p, 0.0)).collect(), ..Dist::default() };
        let b = Bench { ttft: d.clone(), tpot: d.clone(), itl: d.clone(), e2el: d, ..Bench::default() };
        b.entries().into_iter().map(|(k, _)| k).collect()
    }

    /// Every field under vLLM's key, in the order of vLLM's result dict:
    /// `duration`, the counts, the rates, the peaks, then `mean_`,
    /// `median_`, `std_` and each `pN_` of `ttft`, `tpot`, `itl` and
    /// `e2el` (`_ms`).
    pub fn entries(&self) -> Vec<(String, Value)> {
        use Value::{Float, Int, Null};
        let mut out: Vec<(String, Value)> = vec![
            ("duration".into(), Float(self.duration)),
            ("completed".into(), Int(self.completed)),
            ("failed".into(), Int(self.failed)),
            ("total_input_tokens".into(), Int(self.total_input_tokens)),
            ("total_output_tokens".into(), Int(self.total_output_tokens)),
            ("request_throughput".into(), Float(self.request_throughput)),
            ("request_goodput".into(), self.request_goodput.map_or(Null, Float)),
            ("output_throughput".into(), Float(self.output_throughput)),
            ("total_token_throughput".into(), Float(self.total_token_throughput)),
            ("max_output_tokens_per_s".into(), Float(self.max_output_tokens_per_s)),
            ("max_concurrent_requests".into(), Int(self.max_concurrent_requests)),
        ];
        for (name, d) in [("ttft", &self.ttft), ("tpot", &self.tpot), ("itl", &self.itl), ("e2el", &self.e2el)] {
            out.push((format!("mean_{name}_ms"), Float(d.mean)));
            out.push((format!("median_{name}_ms"), Float(d.median)));
            out.push((format!("std_{name}_ms"), Float(d.std)));
            for &(p, v) in &d.percentiles {
                out.push((format!("p{}_{name}_ms", percentile_name(p)), Float(v)));
            }
        }
        out
    }
}

impl Serialize for Bench {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let entries = self.entries();
        let mut map = serializer.serialize_map(Some(entries.len()))?;
        for (k, v) in &entries {
            match v {
                Value::Int(i) => map.serialize_entry(k, i)?,
                Value::Float(x) => map.serialize_entry(k, x)?,
                Value::Null => map.serialize_entry(k, &None::<f64>)?,
            }
        }
        map.end()
    }
}

const SECOND_NS: u64 = 1_000_000_000;

/// Output tokens per 1 s window of one rank, counted when their client
/// gets them (the end of the step that produced them, plus `delay`, the API
/// server's way out), in windows from `origin` (the run's first arrival). The steps of a rank end in time order, so the windows fill in
/// order: consecutive windows are kept as counts in segments, and a stretch
/// of more than [`TokenWindows::GAP`] empty windows starts a new segment,
/// so memory follows the seconds with tokens, not the simulated time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenWindows {
    origin: SimTime,
    /// From a step's end to its tokens' arrival at their clients.
    delay: SimDuration,
    /// (first window, tokens per window from it).
    segments: Vec<(u64, Vec<u64>)>,
    /// The window of the last count, as times: `[start, end)`.
    start: SimTime,
    end: SimTime,
}

impl TokenWindows {
    /// Empty windows a segment holds before a new one starts.
    pub const GAP: u64 = 64;

    /// No tokens yet, windows from `origin`, tokens counted when a step
    /// ends.
    pub fn new(origin: SimTime) -> Self {
        Self::delayed(origin, SimDuration::ZERO)
    }

    /// No tokens yet, windows from `origin`, tokens counted `delay` after
    /// the step that made them ends.
    pub fn delayed(origin: SimTime, delay: SimDuration) -> Self {
        TokenWindows { origin, delay, segments: Vec::new(), start: SimTime::MAX, end: SimTime::ZERO }
    }

    /// The same windows with no tokens yet.
    pub fn emptied(&self) -> Self {
        Self::delayed(self.origin, self.delay)
    }

    /// `n` output tokens came out of a step that ended at `at`.
    #[inline]
    pub fn add(&mut self, at: SimTime, n: u64) {
        if n == 0 {
            return;
        }
        let at = at.saturating_add(self.delay);
        if at >= self.start && at < self.end {
            let last = self.segments.last_mut().and_then(|(_, c)| c.last_mut()).expect("a window is open");
            *last += n;
            return;
        }
        self.add_new_window(at, n);
    }

    fn add_new_window(&mut self, at: SimTime, n: u64) {
        let w = at.saturating_since(self.origin).as_nanos() / SECOND_NS;
        match self.segments.last_mut() {
            Some((first, counts)) if w >= *first && w < *first + counts.len() as u64 => {
                // An earlier window of the last segment (steps end in time
                // order, so only after a clamp at the origin).
                counts[(w - *first) as usize] += n;
                return;
            }
            Some((first, counts))
                if w >= *first + counts.len() as u64 && w <= *first + counts.len() as u64 + Self::GAP =>
            {
                counts.resize((w - *first) as usize, 0);
                counts.push(n);
            }
            Some((first, _)) if w < *first => {
                // Out of order (never, as steps end in time order): kept
                // exact all the same.
                let i = self.segments.partition_point(|(f, c)| f + c.len() as u64 <= w);
                match self.segments.get_mut(i) {
                    Some((f, c)) if *f <= w => c[(w - *f) as usize] += n,
                    _ => self.segments.insert(i, (w, vec![n])),
                }
                return;
            }
            _ => self.segments.push((w, vec![n])),
        }
        let start = SimDuration::from_nanos(w.saturating_mul(SECOND_NS));
        self.start = self.origin.saturating_add(start);
        self.end = self.start.saturating_add(SimDuration::from_nanos(SECOND_NS));
    }

    /// Where the windows start.
    pub fn origin(&self) -> SimTime {
        self.origin
    }

    /// Tokens counted.
    pub fn total(&self) -> u64 {
        self.segments.iter().flat_map(|(_, c)| c).sum()
    }

    /// (window, tokens) of every window with tokens, in window order.
    pub fn windows(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.segments
            .iter()
            .flat_map(|(first, c)| c.iter().enumerate().map(move |(i, &n)| (first + i as u64, n)))
            .filter(|&(_, n)| n > 0)
    }

    /// The most tokens in one window over all of `ranks` together (their
    /// windows from the same origin).
    pub fn peak(ranks: &[&TokenWindows]) -> u64 {
        let mut iters: Vec<_> = ranks.iter().map(|r| r.windows().peekable()).collect();
        let mut peak = 0;
        while let Some(w) = iters.iter_mut().filter_map(|it| it.peek().map(|&(w, _)| w)).min() {
            let mut sum = 0u64;
            for it in &mut iters {
                if let Some(&(v, n)) = it.peek()
                    && v == w
                {
                    sum = sum.saturating_add(n);
                    it.next();
                }
            }
            peak = peak.max(sum);
        }
        peak
    }
}

/// How the load went, for the overload check: the requests in the system
/// (entered, not ended) as each request arrived, itself included.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    /// Requests that entered.
    pub entered: u64,
    /// The first arrival.
    pub first_arrival: Option<SimTime>,
    /// The last arrival.
    pub last_arrival: Option<SimTime>,
    /// Requests in the system just after the last arrival.
    pub backlog_at_last_arrival: u64,
    /// The most requests in the system at an arrival.
    pub peak_backlog: u64,
    /// The mean of the requests in the system over the arrivals.
    pub mean_backlog: f64,
    /// The least-squares slope of the requests in the system against the
    /// arrival time, requests per second: how fast the backlog grew while
    /// requests came.
    pub backlog_growth_per_s: f64,
    /// The mean TTFT of the first [`LATENCY_SAMPLE`] completed requests
    /// (in id order), ms: the wait before any backlog built up.
    pub early_ttft_ms: f64,
    /// The mean TTFT of the last [`LATENCY_SAMPLE`] completed requests, ms.
    pub late_ttft_ms: f64,
}

/// Completed requests [`Load::early_ttft_ms`] and [`Load::late_ttft_ms`]
/// average over.
pub const LATENCY_SAMPLE: usize = 32;

/// Builds [`Load`] one record at a time in id order (which is arrival
/// order): a heap of the end times of the requests still in the system at
/// the latest arrival, so memory follows the requests in the system.
#[derive(Clone, Debug, Default)]
pub(crate) struct LoadBuilder {
    ends: BinaryHeap<Reverse<SimTime>>,
    load: Load,
    /// Σ TTFT of the first completed requests, ns, and how many.
    early: (u128, u64),
    /// The TTFT of the last completed requests (a ring), ns, and how many
    /// completed in all.
    late: [u64; LATENCY_SAMPLE],
    completed: u64,
    // Welford's running means and co-moments of (arrival s, backlog).
    mean_x: f64,
    mean_y: f64,
    m2_x: f64,
    c_xy: f64,
}

impl LoadBuilder {
    pub(crate) fn add(&mut self, r: &Request) {
        let a = r.t.arrival;
        let first = *self.load.first_arrival.get_or_insert(a);
        self.load.last_arrival = Some(a);
        while self.ends.peek().is_some_and(|&Reverse(e)| e <= a) {
            self.ends.pop();
        }
        self.ends.push(Reverse(r.t.finished.unwrap_or(SimTime::MAX)));
        if r.outcome == Outcome::Completed
            && let Some(ttft) = r.ttft()
        {
            let ns = ttft.as_nanos();
            if self.early.1 < LATENCY_SAMPLE as u64 {
                self.early.0 += u128::from(ns);
                self.early.1 += 1;
            }
            self.late[(self.completed % LATENCY_SAMPLE as u64) as usize] = ns;
            self.completed += 1;
        }
        let backlog = self.ends.len() as u64;
        let l = &mut self.load;
        l.entered += 1;
        l.backlog_at_last_arrival = backlog;
        l.peak_backlog = l.peak_backlog.max(backlog);
        let n = l.entered as f64;
        let (x, y) = (a.saturating_since(first).as_secs_f64(), backlog as f64);
        let dx = x - self.mean_x;
        self.mean_x += dx / n;
        self.mean_y += (y - self.mean_y) / n;
        self.m2_x += dx * (x - self.mean_x);
        self.c_xy += dx * (y - self.mean_y);
    }

    pub(crate) fn finish(self) -> Load {
        let mut l = self.load;
        l.mean_backlog = self.mean_y;
        l.backlog_growth_per_s = if self.m2_x > 0.0 { self.c_xy / self.m2_x } else { 0.0 };
        if self.early.1 > 0 {
            l.early_ttft_ms = self.early.0 as f64 / self.early.1 as f64 / 1e6;
            let n = self.completed.min(LATENCY_SAMPLE as u64) as usize;
            let late: u128 = self.late[..n].iter().map(|&v| u128::from(v)).sum();
            l.late_ttft_ms = late as f64 / n as f64 / 1e6;
        }
        l
    }
}

/// What the summary counts that the statistics need.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunTotals {
    /// From the first arrival to the last completion, s.
    pub(crate) duration_s: f64,
    /// Requests completed.
    pub(crate) completed: u64,
    /// Requests failed.
    pub(crate) failed: u64,
}

/// Builds [`Bench`] one record at a time in id order, beside the summary
/// (which gives it the TTFT and E2EL columns it keeps anyway).
#[derive(Clone, Debug)]
pub(crate) struct BenchBuilder {
    percentiles: Vec<f64>,
    input_tokens: u64,
    output_tokens: u64,
    good: u64,
    /// TPOT of each completed request with two tokens or more, ms, as
    /// `f64` bits (which order as the values do, all being ≥ 0).
    tpot: Column,
    /// Σ over completed requests of their gaps (last − first token), ns.
    itl_sum: u128,
    /// Σ over completed requests of their squared gaps, ns²; `None` once
    /// it passed 2¹²⁸.
    itl_sq_sum: Option<u128>,
    /// The same sum in `f64`, for when the exact one passed 2¹²⁸.
    itl_sq_sum_f64: f64,
    /// Gaps of completed requests.
    itl_count: u64,
    /// The first completed request's arrival: the windows' origin.
    origin: Option<SimTime>,
    /// The end windows of completed requests still active in the window of
    /// the latest start.
    active: BinaryHeap<Reverse<u64>>,
    max_concurrent: u64,
}

impl Default for BenchBuilder {
    fn default() -> Self {
        BenchBuilder {
            percentiles: DEFAULT_PERCENTILES.to_vec(),
            input_tokens: 0,
            output_tokens: 0,
            good: 0,
            tpot: Column::of_f64_bits(),
            itl_sum: 0,
            itl_sq_sum: Some(0),
            itl_sq_sum_f64: 0.0,
            itl_count: 0,
            origin: None,
            active: BinaryHeap::new(),
            max_concurrent: 0,
        }
    }
}

fn window_of(t: SimTime, origin: SimTime) -> u64 {
    t.saturating_since(origin).as_nanos() / SECOND_NS
}

impl BenchBuilder {
    pub(crate) fn set_percentiles(&mut self, ps: &[f64]) {
        self.percentiles = ps.to_vec();
    }

    /// As [`crate::stats::summary::SummaryBuilder::set_exact_limit`], for the
    /// TPOT column.
    pub(crate) fn set_exact_limit(&mut self, limit: Option<usize>) {
        self.tpot.set_exact_limit(limit);
    }

    /// Adds one request (its outcome decided).
    pub(crate) fn add(&mut self, r: &Request, slo: &SloSpec) {
        if r.outcome != Outcome::Completed {
            return;
        }
        let t = &r.t;
        let (Some(first), Some(end)) = (t.first_token, t.finished) else { return };
        let generated = r.generated.get();
        self.input_tokens += r.prompt.get();
        self.output_tokens += generated;
        let ttft_ms = (first - t.arrival).as_nanos() as f64 / 1e6;
        let e2e_ms = (end - t.arrival).as_nanos() as f64 / 1e6;
        // vLLM: (latency − ttft) / (output_len − 1), and 0 for goodput when
        // there is one token.
        let tpot_ms = if generated > 1 {
            let tpot = (end - first).as_nanos() as f64 / 1e6 / (generated - 1) as f64;
            self.tpot.push(tpot.to_bits());
            tpot
        } else {
            0.0
        };
        if let Some(last) = t.last_token
            && generated > 1
        {
            self.itl_sum += u128::from((last - first).as_nanos());
            self.itl_count += generated - 1;
            self.itl_sq_sum = self.itl_sq_sum.and_then(|s| s.checked_add(r.itl_sq_sum));
            self.itl_sq_sum_f64 += r.itl_sq_sum as f64;
        }
        let within = |bound: Option<f64>, v: f64| bound.is_none_or(|b| v <= b);
        if within(slo.ttft_ms, ttft_ms) && within(slo.tpot_ms, tpot_ms) && within(slo.e2e_ms, e2e_ms) {
            self.good += 1;
        }
        // Records come in arrival order, so the first completed one starts
        // the windows, and starts come in window order.
        let origin = *self.origin.get_or_insert(t.arrival);
        let (from, to) = (window_of(t.arrival, origin), window_of(end, origin));
        while self.active.peek().is_some_and(|&Reverse(e)| e < from) {
            self.active.pop();
        }
        self.active.push(Reverse(to));
        self.max_concurrent = self.max_concurrent.max(self.active.len() as u64);
    }

    /// The percentiles asked for.
    pub(crate) fn percentiles(&self) -> &[f64] {
        &self.percentiles
    }

    /// The statistics. `run` is the summary's duration (s) and its
    /// completed and failed requests; `ttft` and `e2e` are
    /// [`Dist::of_sorted_nanos`] of the summary's columns, `itl` the run's
    /// inter-token histogram, `peak_tokens` the most output tokens in a
    /// window ([`TokenWindows::peak`]).
    pub(crate) fn finish(
        mut self,
        run: RunTotals,
        slo: &SloSpec,
        ttft: Dist,
        e2e: Dist,
        itl: &Histogram,
        peak_tokens: u64,
    ) -> Bench {
        let ps = &self.percentiles;
        let duration = run.duration_s;
        let per_s = |x: f64| if duration > 0.0 { x / duration } else { 0.0 };
        let any_slo = slo.ttft_ms.is_some() || slo.tpot_ms.is_some() || slo.e2e_ms.is_some();
        let tpot = match self.tpot.take_values() {
            Values::Sorted(tpot_bits) => Dist::of_sorted(
                tpot_bits.len(),
                |i| f64::from_bits(tpot_bits[i]),
                {
                    let mut sum = Sum::default();
                    for &b in &tpot_bits {
                        sum.add(f64::from_bits(b));
                    }
                    if tpot_bits.is_empty() { 0.0 } else { sum.value() / tpot_bits.len() as f64 }
                },
                ps,
            ),
            Values::Sketch(sk) => Dist::of_sketch(&sk, 1.0, ps),
        };
        Bench {
            duration,
            completed: run.completed,
            failed: run.failed,
            total_input_tokens: self.input_tokens,
            total_output_tokens: self.output_tokens,
            request_throughput: per_s(run.completed as f64),
            request_goodput: any_slo.then(|| per_s(self.good as f64)),
            output_throughput: per_s(self.output_tokens as f64),
            total_token_throughput: per_s((self.input_tokens + self.output_tokens) as f64),
            max_output_tokens_per_s: peak_tokens as f64,
            max_concurrent_requests: self.max_concurrent,
            ttft,
            tpot,
            itl: self.itl_dist(itl),
            e2el: e2e,
        }
    }

    /// ITL: mean and std exact from the sums over completed requests,
    /// median and percentiles from the histogram's order statistics.
    fn itl_dist(&self, itl: &Histogram) -> Dist {
        let ps = &self.percentiles;
        let n = itl.count();
        let at = |i: usize| itl.order_statistic_ns(i as u64) as f64 / 1e6;
        let count = self.itl_count;
        let (mean, std) = if count == 0 {
            (0.0, 0.0)
        } else {
            let mean = self.itl_sum as f64 / count as f64 / 1e6;
            let c = u128::from(count);
            // var = (n·Σg² − (Σg)²) / n², exactly while it fits in 128 bits.
            let exact = self.itl_sq_sum.and_then(|s2| {
                let num = c.checked_mul(s2)?.checked_sub(self.itl_sum.checked_mul(self.itl_sum)?)?;
                Some(num as f64 / (count as f64 * count as f64))
            });
            let var_ns2 = exact.unwrap_or_else(|| {
                let m = self.itl_sum as f64 / count as f64;
                let s2 = self.itl_sq_sum.map_or(self.itl_sq_sum_f64, |s| s as f64);
                (s2 / count as f64 - m * m).max(0.0)
            });
            (mean, var_ns2.sqrt() / 1e6)
        };
        let Ok(n) = usize::try_from(n) else { return Dist { mean, std, ..Dist::default() } };
        Dist {
            mean,
            std,
            median: numpy_median(n, at),
            percentiles: ps.iter().map(|&p| (p, numpy_percentile(n, at, p))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_names_are_pythons() {
        assert_eq!(percentile_name(99.0), "99");
        assert_eq!(percentile_name(50.0), "50");
        assert_eq!(percentile_name(0.0), "0");
        assert_eq!(percentile_name(100.0), "100");
        assert_eq!(percentile_name(99.9), "99.9");
        assert_eq!(percentile_name(99.99), "99.99");
        assert_eq!(percentile_name(0.5), "0.5");
        assert_eq!(percentile_name(0.0001), "0.0001");
        assert_eq!(percentile_name(0.00001), "1e-05");
        assert_eq!(percentile_name(0.000015), "1.5e-05");
        assert_eq!(percentile_name(33.3), "33.3");
        assert!(check_percentiles(&[50.0, 99.9]).is_ok());
        assert!(check_percentiles(&[]).is_err());
        assert!(check_percentiles(&[101.0]).is_err());
        assert!(check_percentiles(&[-1.0]).is_err());
        assert!(check_percentiles(&[f64::NAN]).is_err());
        assert!(check_percentiles(&[99.0, 99.0]).is_err());
    }

    #[test]
    fn percentiles_interpolate_as_numpy() {
        // np.percentile([1, 2, 3, 4], [0, 25, 50, 90, 100]) = [1, 1.75, 2.5, 3.7, 4]
        let v = [1.0, 2.0, 3.0, 4.0];
        let at = |i: usize| v[i];
        let got: Vec<f64> = [0.0, 25.0, 50.0, 90.0, 100.0].iter().map(|&p| numpy_percentile(4, at, p)).collect();
        assert_eq!(got, vec![1.0, 1.75, 2.5, 3.7, 4.0]);
        assert_eq!(numpy_median(4, at), 2.5);
        assert_eq!(numpy_median(3, at), 2.0);
        assert_eq!(numpy_percentile(0, at, 50.0), 0.0);
        // np.std([1, 2, 3, 4]) = sqrt(1.25)
        let d = Dist::of_sorted_ms(&v, &[50.0]);
        assert_eq!(d.std, 1.25f64.sqrt());
        assert_eq!(d.mean, 2.5);
    }

    #[test]
    fn token_windows_add_up_per_window() {
        let s = |x: f64| SimTime::ZERO.saturating_add(SimDuration::from_secs_f64(x));
        let mut a = TokenWindows::new(s(0.5));
        for (t, n) in [(0.6, 3), (1.4, 2), (1.6, 5), (200.0, 7), (200.2, 1)] {
            a.add(s(t), n);
        }
        assert_eq!(a.windows().collect::<Vec<_>>(), vec![(0, 5), (1, 5), (199, 8)]);
        assert_eq!(a.segments.len(), 2);
        let mut b = TokenWindows::new(s(0.5));
        b.add(s(1.7), 4);
        assert_eq!(TokenWindows::peak(&[&a, &b]), 9);
        assert_eq!(a.total() + b.total(), 22);
    }
}
