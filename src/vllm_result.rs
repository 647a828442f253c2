//! `vllm-bench.json`: a run as the file `vllm bench serve --save-result
//! --save-detailed` writes, so that vLLM's plotting and comparison scripts
//! read a pdsim run as they read a real one.
//!
//! The keys, their order, units and types are those of vLLM 0.33.0's
//! `vllm/benchmarks/serve.py`: the setup (`date`, `endpoint_type`,
//! `backend`, `label`, `model_id`, `tokenizer_id`, `num_prompts`; lines
//! 2305–2312), the traffic (`request_rate`, a number or `"inf"`,
//! `burstiness`, `max_concurrency`; lines 2326–2330), then the benchmark's
//! result dict (lines 1318–1342: `duration`, `completed`, `failed`, the
//! token totals, the throughputs, the per-request lists `input_lens`,
//! `output_lens`, `ttfts`, `itls`, `latencies`, `start_times`,
//! `queue_times`, `generated_texts`, `errors`, then
//! `max_output_tokens_per_s`, `max_concurrent_requests`, `rtfx`), then
//! `mean_`, `median_`, `std_` and `pN_` of `ttft`, `tpot`, `itl` and
//! `e2el` in ms (`process_one_metric`, lines 1426–1432). Per-request
//! lists are in request (id) order, times in seconds, as vLLM's
//! `RequestFuncOutput` holds them (`vllm/benchmarks/lib/endpoint_request_func.py`
//! lines 89–107). The statistics are `report.json`'s `bench`, the same
//! numbers.
//!
//! Where pdsim cannot be a client of a real server:
//! - `date` is `19700101-000000` (vLLM's `%Y%m%d-%H%M%S`), the simulated
//!   clock's origin, not the wall clock, so the file depends only on the
//!   scenario and the seed;
//! - `backend` and `endpoint_type` are `"pdsim"`; `label` is the
//!   scenario's name; `model_id` and `tokenizer_id` the model's name;
//! - `request_rate` and `burstiness` are the workload's (Poisson: its
//!   rate, burstiness 1; gamma: its rate, burstiness `1/cv²`, the shape of
//!   vLLM's gamma gaps); a closed loop is vLLM's `--request-rate inf
//!   --max-concurrency N`; a trace replays its own times, `"inf"`;
//! - `start_times` are arrivals in simulated seconds from 0 (vLLM's are
//!   `time.perf_counter()` values, whose origin is arbitrary too);
//! - `itls`: pdsim keeps no time per token (a run of decode steps is priced
//!   without visiting its tokens), so each request's list holds its
//!   `generated − 1` gaps as their mean, `(last − first token) /
//!   (generated − 1)`, to the nanosecond: the count and the sum
//!   (`ttft + sum(itl)` is the latency, to a nanosecond a token) are
//!   exact, their spread is not (the file's `*_itl_ms` statistics are
//!   pdsim's own, as in `bench`); they make the file about 13 bytes an
//!   output token (`--no-vllm-bench` leaves it out);
//! - `generated_texts` are empty strings (no text is generated), `errors`
//!   empty for a completed request and the failure's reason otherwise;
//!   a failed request has `output_lens` 0 and `latencies` 0, and its
//!   `ttfts` 0 unless a first token came; `queue_times` (time waiting for
//!   the client's concurrency limit) are 0; `rtfx` is 0.
//!
//! Written from the run's `requests.csv` (so any run folder has what it
//! needs), one list at a time, each line of requests.csv read once per
//! list: memory stays bounded whatever the run's length.

use std::fmt::Write as _;

use std::io::{self, Write};
use std::path::Path;

use actors::bench::{Bench, Value};

use crate::html::read::CsvLines;
use crate::workload::{ArrivalSpec, WorkloadSpec};

/// The file's name in a run folder.
pub const FILE_NAME: &str = "vllm-bench.json";

/// `date`: vLLM's `%Y%m%d-%H%M%S` of the simulated clock's origin.
pub const DATE: &str = "19700101-000000";

/// What the file says of the run beside its requests.
pub struct Setup<'a> {
    /// The scenario's name (`label`).
    pub label: Option<&'a str>,
    /// The model's name (`model_id`, `tokenizer_id`).
    pub model: &'a str,
    /// Requests that entered (`num_prompts`).
    pub num_prompts: u64,
    /// The workload (its arrivals give `request_rate`, `burstiness`,
    /// `max_concurrency`).
    pub workload: &'a WorkloadSpec,
    /// `report.json`'s `bench`.
    pub bench: &'a Bench,
}

/// The columns of requests.csv the lists are made from.
const COLUMNS: [&str; 8] = [
    "outcome",
    "fail_reason",
    "prompt_tokens",
    "generated_tokens",
    "arrival_ms",
    "first_token_ms",
    "last_token_ms",
    "finished_ms",
];

/// A JSON number of an `f64`: Rust's shortest round-trip form (never an
/// exponent, so always valid JSON), `null` when not finite.
fn float(out: &mut String, x: f64) {
    if x.is_finite() {
        let _ = write!(out, "{x:?}");
    } else {
        out.push_str("null");
    }
}

fn string(out: &mut String, s: &str) {
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned()));
}

/// Seconds between two cells of ms (as requests.csv writes them, six
/// decimals: whole nanoseconds), or `None` when either is empty.
fn seconds(from: &str, to: &str) -> Option<f64> {
    let ns = |s: &str| -> Option<i128> {
        let (whole, frac) = s.trim().split_once('.').unwrap_or((s.trim(), ""));
        if whole.is_empty() {
            return None;
        }
        let frac = format!("{frac:0<6}");
        Some(whole.parse::<i128>().ok()? * 1_000_000 + frac.get(..6)?.parse::<i128>().ok()?)
    };
    Some((ns(to)? - ns(from)?) as f64 / 1e9)
}

/// One list of the file: its key and how a request's row gives its item.
type Item = fn(&mut String, &[&str]);

fn lists() -> [(&'static str, Item); 9] {
    // Row cells in COLUMNS order.
    fn completed(r: &[&str]) -> bool {
        r[0] == "completed"
    }
    [
        ("input_lens", |o, r| o.push_str(r[2])),
        ("output_lens", |o, r| o.push_str(if completed(r) { r[3] } else { "0" })),
        ("ttfts", |o, r| float(o, seconds(r[4], r[5]).unwrap_or(0.0))),
        ("itls", |o, r| {
            o.push('[');
            let n: u64 = r[3].parse().unwrap_or(0);
            if n >= 2
                && let Some(span) = seconds(r[5], r[6])
            {
                // To the nanosecond, as the run's times are: 11 characters
                // a token instead of up to 21.
                let gap = span / (n - 1) as f64;
                let g = if gap.is_finite() { format!("{gap:.9}") } else { "null".to_owned() };
                for i in 0..n - 1 {
                    if i > 0 {
                        o.push_str(", ");
                    }
                    o.push_str(&g);
                }
            }
            o.push(']');
        }),
        ("latencies", |o, r| float(o, if completed(r) { seconds(r[4], r[7]).unwrap_or(0.0) } else { 0.0 })),
        ("start_times", |o, r| float(o, seconds("0", r[4]).unwrap_or(0.0))),
        ("queue_times", |o, _| o.push_str("0.0")),
        ("generated_texts", |o, _| o.push_str("\"\"")),
        ("errors", |o, r| string(o, if completed(r) { "" } else { r[1] })),
    ]
}

/// The traffic fields: `request_rate` (a JSON value), `burstiness`,
/// `max_concurrency` (JSON).
fn traffic(w: &WorkloadSpec) -> (String, f64, String) {
    let mut rate = String::new();
    match w.arrival {
        Some(ArrivalSpec::Poisson { rate_per_s }) => {
            float(&mut rate, rate_per_s);
            (rate, 1.0, "null".into())
        }
        Some(ArrivalSpec::Gamma { rate_per_s, cv }) => {
            float(&mut rate, rate_per_s);
            (rate, 1.0 / (cv * cv), "null".into())
        }
        Some(ArrivalSpec::ClosedLoop { concurrency }) => ("\"inf\"".into(), 1.0, concurrency.to_string()),
        Some(ArrivalSpec::Trace) | None => ("\"inf\"".into(), 1.0, "null".into()),
    }
}

/// Writes the file to `out` from the run's `requests.csv` (`requests`).
///
/// # Errors
/// requests.csv cannot be read (or lacks a column), or `out` cannot be
/// written.
pub fn write(out: &mut impl Write, requests: &Path, setup: &Setup<'_>) -> io::Result<()> {
    let bad = |e: crate::html::ReportError| io::Error::new(io::ErrorKind::InvalidData, e.message().to_owned());
    let entries = setup.bench.entries();
    let get = |k: &str| entries.iter().find(|(n, _)| n == k).map(|(_, v)| v);
    let value = |s: &mut String, v: Option<&Value>| match v {
        Some(Value::Int(i)) => {
            let _ = write!(s, "{i}");
        }
        Some(Value::Float(x)) => float(s, *x),
        _ => s.push_str("null"),
    };
    let mut head = String::new();
    head.push('{');
    let _ = write!(head, "\"date\": \"{DATE}\", \"endpoint_type\": \"pdsim\", \"backend\": \"pdsim\", \"label\": ");
    match setup.label {
        Some(l) => string(&mut head, l),
        None => head.push_str("null"),
    }
    head.push_str(", \"model_id\": ");
    string(&mut head, setup.model);
    head.push_str(", \"tokenizer_id\": ");
    string(&mut head, setup.model);
    let (rate, burstiness, concurrency) = traffic(setup.workload);
    let _ = write!(head, ", \"num_prompts\": {}, \"request_rate\": {rate}, \"burstiness\": ", setup.num_prompts);
    float(&mut head, burstiness);
    let _ = write!(head, ", \"max_concurrency\": {concurrency}");
    for k in [
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
    ] {
        let _ = write!(head, ", \"{k}\": ");
        value(&mut head, get(k));
    }
    out.write_all(head.as_bytes())?;
    let mut buf = String::new();
    for (key, item) in lists() {
        out.write_all(format!(", \"{key}\": [").as_bytes())?;
        let mut csv = CsvLines::open(requests, &requests.display().to_string()).map_err(bad)?;
        let cols = csv.header(&COLUMNS).map_err(bad)?;
        let mut first = true;
        while let Some(row) = csv.next_row().map_err(bad)? {
            let cells: [&str; COLUMNS.len()] = std::array::from_fn(|i| row.get(cols[i]));
            buf.clear();
            if !first {
                buf.push_str(", ");
            }
            first = false;
            item(&mut buf, &cells);
            out.write_all(buf.as_bytes())?;
        }
        out.write_all(b"]")?;
    }
    let mut tail = String::new();
    for k in ["max_output_tokens_per_s", "max_concurrent_requests"] {
        let _ = write!(tail, ", \"{k}\": ");
        value(&mut tail, get(k));
    }
    tail.push_str(", \"rtfx\": 0.0");
    for (k, v) in &entries {
        if k.ends_with("_ms") {
            let _ = write!(tail, ", \"{k}\": ");
            value(&mut tail, Some(v));
        }
    }
    tail.push_str("}\n");
    out.write_all(tail.as_bytes())
}

/// Writes `dir/vllm-bench.json` from `dir/requests.csv`, as a partial file
/// renamed into place when whole ([`crate::output::TempFile`]: never
/// through a link).
///
/// # Errors
/// As [`write()`]; the file cannot be created or placed.
pub fn write_file(dir: &Path, setup: &Setup<'_>) -> io::Result<()> {
    let target = dir.join(FILE_NAME);
    let mut f = crate::output::TempFile::create(&target).map_err(io::Error::other)?;
    write(f.writer(), &dir.join("requests.csv"), setup)?;
    f.commit().map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_between_cells_are_exact_nanoseconds() {
        assert_eq!(seconds("70.463820", "144.209743"), Some(0.073745923));
        assert_eq!(seconds("0", "1.5"), Some(0.0015));
        assert_eq!(seconds("", "1.5"), None);
        let mut s = String::new();
        float(&mut s, 1e-7);
        assert_eq!(s, "1e-7");
    }
}
