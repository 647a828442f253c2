//! Metrics: a latency histogram, summary statistics in vLLM `bench serve`
//! terms, and sampled timelines.

use std::collections::BTreeMap;

use serde::Serialize;
use sim_core::{SimDuration, SimTime};

use crate::config::SloSpec;
use crate::request::{Outcome, Request};

/// A histogram of durations with under 1% relative error: exact below 256
/// ns, then 128 sub-buckets per power of two. Exact count, sum and max.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum_ns: u128,
    max_ns: u64,
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
}

fn ms(d: SimDuration) -> f64 {
    d.as_millis_f64()
}

fn span(a: Option<SimTime>, b: Option<SimTime>) -> Option<f64> {
    Some(ms(b?.saturating_since(a?)))
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

/// Summarises finished requests; `itl` is the merged inter-token histogram.
pub fn summarise(records: &[Request], itl: &Histogram, slo: &SloSpec) -> Summary {
    let mut s = Summary { requests: records.len() as u64, itl_ms: itl.stat(), ..Summary::default() };
    let (mut output_tokens, mut total_tokens, mut good) = (0u64, 0u64, 0u64);
    let (mut first, mut last) = (None::<SimTime>, None::<SimTime>);
    let mut ttft = Vec::new();
    let mut tpot = Vec::new();
    let mut e2e = Vec::new();
    let (mut pq, mut pt, mut tw, mut tt, mut dq) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in records {
        first = Some(first.map_or(r.t.arrival, |f: SimTime| f.min(r.t.arrival)));
        if let Some(f) = r.t.finished {
            last = Some(last.map_or(f, |l: SimTime| l.max(f)));
        }
        s.preemptions += u64::from(r.preemptions);
        s.prefill_hit_tokens += r.prefill_hit.get();
        s.decode_hit_tokens += r.decode_hit.get();
        s.transfer_bytes += r.transfer_bytes.get();
        match r.outcome {
            Outcome::Completed => {
                s.completed += 1;
                output_tokens += r.generated.get();
                total_tokens += r.generated.get() + r.prompt.get();
                ttft.extend(r.ttft().map(ms));
                tpot.extend(r.tpot().map(ms));
                e2e.extend(r.e2e().map(ms));
                if meets_slo(r, slo) {
                    good += 1;
                }
            }
            Outcome::Failed(reason) => {
                s.failed += 1;
                *s.failure_reasons.entry(reason.to_string()).or_default() += 1;
            }
            Outcome::InFlight => {}
        }
        let queued = r.t.prefill_queued.map(|_| r.t.arrival);
        pq.extend(span(queued, r.t.prefill_started));
        pt.extend(span(r.t.prefill_started, r.t.prefill_done));
        tw.extend(span(r.t.prefill_done, r.t.transfer_started));
        tt.extend(span(r.t.transfer_started, r.t.transfer_done));
        dq.extend(span(r.t.transfer_done, r.t.decode_started));
    }
    let duration = match (first, last) {
        (Some(f), Some(l)) => (l.saturating_since(f)).as_secs_f64(),
        _ => 0.0,
    };
    s.duration_s = duration;
    if duration > 0.0 {
        s.request_throughput = s.completed as f64 / duration;
        s.output_token_throughput = output_tokens as f64 / duration;
        s.total_token_throughput = total_tokens as f64 / duration;
        s.goodput = good as f64 / duration;
    }
    if s.requests > 0 {
        s.slo_attainment = good as f64 / s.requests as f64;
    }
    s.ttft_ms = Stat::of(ttft);
    s.tpot_ms = Stat::of(tpot);
    s.e2e_ms = Stat::of(e2e);
    s.prefill_queue_ms = Stat::of(pq);
    s.prefill_time_ms = Stat::of(pt);
    s.transfer_wait_ms = Stat::of(tw);
    s.transfer_time_ms = Stat::of(tt);
    s.decode_queue_ms = Stat::of(dq);
    s
}

/// What a timeline sample measures.
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
    /// Share of the time since the previous sample that the link moved
    /// bytes, in thousandths (links).
    LinkBusyPermille,
}

/// One sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// When.
    pub time: SimTime,
    /// What.
    pub metric: Metric,
    /// The value.
    pub value: u64,
}

/// Samples of one actor, at most one batch per interval: an actor offers a
/// sample whenever its state changes, and it is kept if the interval since
/// the last kept one has passed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    interval: SimDuration,
    next: SimTime,
    /// The samples, in time order.
    pub samples: Vec<Sample>,
}

impl Timeline {
    /// A timeline sampled at most once per `interval`.
    pub fn new(interval: SimDuration) -> Self {
        Timeline { interval, next: SimTime::ZERO, samples: Vec::new() }
    }
    /// When the next sample will be kept.
    pub fn next_due(&self) -> SimTime {
        self.next
    }
    /// Whether a sample at `now` would be kept.
    #[inline]
    pub fn due(&self, now: SimTime) -> bool {
        now >= self.next
    }
    /// Records one value at `now` and closes the interval.
    pub fn push(&mut self, now: SimTime, metric: Metric, value: u64) {
        self.samples.push(Sample { time: now, metric, value });
        self.next = now.saturating_add(self.interval.max(SimDuration::from_nanos(1)));
    }
}
