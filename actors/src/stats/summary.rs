//! The run's summary in vLLM `bench serve`'s terms ([`Summary`]), made one
//! request at a time as requests end ([`SummaryBuilder`]).

use std::collections::BTreeMap;

use serde::Serialize;
use sim_core::SimTime;

use crate::requests::request::{Outcome, Request};
use crate::stats::bench::{Bench, BenchBuilder, Dist, Load, LoadBuilder, RunTotals};
use crate::stats::histogram::{Column, Histogram, Stat, Values};
use crate::stats::slo::{SloSpec, meets_slo};

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
    /// From arrival to the first prefill step: the API server's way in,
    /// then waiting for the prefill rank.
    pub prefill_queue_ms: Stat,
    /// From the first prefill step to the end of the prefill.
    pub prefill_time_ms: Stat,
    /// From the end of the prefill to the start of the transfer (the
    /// proxy's hop through the API servers, routing and the decode rank's
    /// reservation).
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

/// Summarises finished requests; `itl` is the merged inter-token histogram,
/// `peak_tokens` the most output tokens in one 1 s window
/// ([`TokenWindows::peak`](crate::stats::bench::TokenWindows::peak)).
pub fn summarise(records: &[Request], itl: &Histogram, peak_tokens: u64, slo: &SloSpec) -> Summary {
    let mut b = SummaryBuilder::new(slo.clone());
    for r in records {
        b.add(r);
    }
    b.finish(itl, peak_tokens)
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
    /// [`crate::stats::bench::DEFAULT_PERCENTILES`]).
    pub fn set_percentiles(&mut self, ps: &[f64]) {
        self.bench.set_percentiles(ps);
    }

    /// Keeps at most `limit` values of each latency column exactly, then
    /// sketches them ([`Column::set_exact_limit`]): the summary's and
    /// `bench`'s percentiles are then within
    /// [`crate::stats::sketch::RELATIVE_ERROR`] of the exact ones, and memory no
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
    /// the most output tokens in one 1 s window ([`TokenWindows::peak`](crate::stats::bench::TokenWindows::peak)).
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
        let run = RunTotals { duration_s: s.duration_s, completed: s.completed, failed: s.failed };
        s.bench = self.bench.finish(run, &self.slo, bench_ttft, bench_e2e, itl, peak_tokens);
        s.load = self.load.finish();
        s
    }
}
