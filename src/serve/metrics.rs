//! `/metrics`: Prometheus text under vLLM's metric names, fed by the
//! simulation driver as tokens come out and requests end. Latencies are in
//! simulated seconds (wall seconds × `--speed`), as `pdsim run` reports
//! them.

use std::fmt::Write as _;

/// vLLM's buckets of `vllm:time_to_first_token_seconds`.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
/// vLLM's buckets of `vllm:inter_token_latency_seconds`.
pub const ITL_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// vLLM's buckets of `vllm:e2e_request_latency_seconds`.
pub const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];
/// Buckets of `pdsim:added_latency_seconds` (wall seconds).
pub const ADDED_BUCKETS: &[f64] =
    &[0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0];

/// A Prometheus histogram: cumulative counts per upper bound, sum, count.
#[derive(Clone, Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (increasing).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }

    /// Counts `x`.
    pub fn observe(&mut self, x: f64) {
        let i = self.bounds.partition_point(|&b| b < x);
        if i < self.counts.len() {
            self.counts[i] += 1;
        }
        self.sum += x;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The value under which a fraction `q` of the observations fall, as
    /// the least bucket bound that covers it (`+Inf`: past the last).
    pub fn quantile_bound(&self, q: f64) -> f64 {
        let want = (q * self.count as f64).ceil() as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return self.bounds[i];
            }
        }
        f64::INFINITY
    }

    fn write(&self, out: &mut String, name: &str, labels: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b:?}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// Everything `/metrics` shows.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Sequences running, over the ranks.
    pub running: u64,
    /// Sequences waiting, over the ranks.
    pub waiting: u64,
    /// KV blocks in use over all blocks, 0 to 1.
    pub kv_usage: f64,
    /// Time to first token, simulated seconds.
    pub ttft: Histogram,
    /// Gaps between output tokens, simulated seconds.
    pub itl: Histogram,
    /// Arrival to end, simulated seconds, of completed requests.
    pub e2e: Histogram,
    /// Prompt tokens of the requests that entered.
    pub prompt_tokens: u64,
    /// Output tokens generated.
    pub generation_tokens: u64,
    /// Requests completed.
    pub success: u64,
    /// Requests that failed in the simulation (after they entered).
    pub failed: u64,
    /// Requests refused with an HTTP error before they entered.
    pub refused: u64,
    /// Wall seconds a token was handed to its HTTP stream after its
    /// simulated time (mapped to the wall clock).
    pub added: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            prompt_tokens: 0,
            generation_tokens: 0,
            success: 0,
            failed: 0,
            refused: 0,
            added: Histogram::new(ADDED_BUCKETS),
        }
    }
}

impl Metrics {
    /// The Prometheus text exposition, labelled with the served model name.
    pub fn text(&self, model: &str) -> String {
        let labels = format!("engine=\"0\",model_name=\"{}\"", model.replace('\\', "\\\\").replace('"', "\\\""));
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {value}");
        };
        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", self.running.to_string());
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.waiting.to_string());
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", format!("{:?}", self.kv_usage));
        let mut counter = |name: &str, help: &str, extra: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{labels}{extra}}} {value}");
        };
        counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", "", self.prompt_tokens);
        counter("vllm:generation_tokens_total", "Number of generation tokens processed.", "", self.generation_tokens);
        counter(
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            ",finished_reason=\"length\"",
            self.success,
        );
        counter("pdsim:request_failed_total", "Requests that failed in the simulation.", "", self.failed);
        counter("pdsim:request_refused_total", "Requests refused with an HTTP error.", "", self.refused);
        self.ttft.write(
            &mut out,
            "vllm:time_to_first_token_seconds",
            &labels,
            "Histogram of time to first token in seconds (simulated).",
        );
        self.itl.write(
            &mut out,
            "vllm:inter_token_latency_seconds",
            &labels,
            "Histogram of inter-token latency in seconds (simulated).",
        );
        self.e2e.write(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            &labels,
            "Histogram of e2e request latency in seconds (simulated).",
        );
        self.added.write(
            &mut out,
            "pdsim:added_latency_seconds",
            &labels,
            "Wall seconds between a token's simulated time and its hand-over to the HTTP stream.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_cumulatively_under_its_bounds() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        for x in [0.05, 0.1, 0.5, 2.0] {
            h.observe(x);
        }
        let mut out = String::new();
        h.write(&mut out, "x", "a=\"b\"", "help");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.1\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{a=\"b\",le=\"1.0\"} 3\n"));
        assert!(out.contains("x_bucket{a=\"b\",le=\"+Inf\"} 4\n"));
        assert!(out.contains("x_count{a=\"b\"} 4\n"));
        assert_eq!(h.quantile_bound(0.5), 0.1);
        assert_eq!(h.quantile_bound(1.0), f64::INFINITY);
    }
}
