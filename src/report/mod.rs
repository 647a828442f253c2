//! The files `pdsim run` writes: `report.json`, `requests.csv`,
//! `timeline.csv` and `trace.json`, and the formatting they share.
//!
//! Every file is a function of the scenario, the seed and the request count
//! only (no wall-clock time, no host names, maps in a fixed order), so that
//! the same run gives byte-identical files on every machine.
//!
//! Times are simulated. In the CSV files they are milliseconds with six
//! decimals, i.e. exact nanoseconds written as a decimal; in the report
//! they are the summary statistics of [`actors::metrics::Summary`]
//! (milliseconds, `f64`). `trace.json` uses microseconds, as the Chrome
//! trace-event format does.

use std::collections::BTreeMap;
use std::io::{self, Write};

use actors::bench::Bench;
use actors::config::LinkTopology;
use actors::metrics::{EntitySample, Metric, Summary};
use actors::model::Role;
use actors::request::{Outcome, Request};
use actors::sim::{LinkReport, RankReport};
use actors::workload::ArrivalMode;
use serde::Serialize;
use serde_json::{Value, json};
use sim_core::SimTime;

use crate::runner::Run;
use crate::scenario::Scenario;
use crate::workload::SourceStats;

mod rows;
mod trace_json;

pub use rows::*;
pub use trace_json::*;

/// The version written into `report.json`.
pub const PDSIM_VERSION: &str = env!("CARGO_PKG_VERSION");

/// `ns` nanoseconds as milliseconds with six decimals, exactly.
pub fn ms6(ns: u64) -> String {
    let mut s = String::with_capacity(24);
    push_fixed(&mut s, ns, 6);
    s
}

/// Appends `v` in decimal (the report files write millions of numbers;
/// `core::fmt` is the bulk of their cost).
fn push_u64(out: &mut String, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&buf[i..]).expect("ASCII digits"));
}

/// Appends `v / 10^decimals` with exactly `decimals` (at most 19) decimals.
fn push_fixed(out: &mut String, v: u64, decimals: u32) {
    let scale = 10u64.pow(decimals);
    push_u64(out, v / scale);
    out.push('.');
    let mut frac = v % scale;
    let mut buf = [b'0'; 19];
    let n = decimals as usize;
    for slot in buf[..n].iter_mut().rev() {
        *slot = b'0' + (frac % 10) as u8;
        frac /= 10;
    }
    out.push_str(std::str::from_utf8(&buf[..n]).expect("ASCII digits"));
}

/// A CSV field: quoted (quotes doubled) when it holds a comma, a quote or a
/// line break.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_owned() }
}

/// The digest of the per-request outcomes as 16 hex digits.
pub fn digest_hex(digest: u64) -> String {
    format!("{digest:016x}")
}

/// `outcome` column: `completed`, `failed` or `in_flight`.
pub fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Completed => "completed",
        Outcome::Failed(_) => "failed",
        Outcome::InFlight => "in_flight",
    }
}

/// The name of the link a request's transfer used (`link-p{i}-d{j}` per
/// pair, `link` shared), if it had both ranks.
pub fn link_name(topology: LinkTopology, r: &Request) -> Option<String> {
    let (p, d) = (r.prefill_rank?, r.decode_rank?);
    Some(match topology {
        LinkTopology::PerPair => format!("link-p{p}-d{d}"),
        LinkTopology::Shared => "link".to_owned(),
    })
}

/// The timeline metric's column name; group metrics use the rank's group
/// names (`kv_used_blocks[full attention]`).
pub fn metric_name(metric: Metric, groups: &[String]) -> String {
    match metric {
        Metric::KvUsed => "kv_used_blocks".into(),
        Metric::KvGroupUsed(i) => match groups.get(usize::from(i)) {
            Some(g) => format!("kv_used_blocks[{g}]"),
            None => format!("kv_used_blocks[{i}]"),
        },
        Metric::KvFree => "kv_free_blocks".into(),
        Metric::KvCachedFree => "kv_cached_free_blocks".into(),
        Metric::Waiting => "waiting".into(),
        Metric::Running => "running".into(),
        Metric::HeldSources => "held_sources".into(),
        Metric::PendingReservations => "pending_reservations".into(),
        Metric::Transferring => "transferring".into(),
        Metric::ActiveTransfers => "active_transfers".into(),
        Metric::QueuedTransfers => "queued_transfers".into(),
        Metric::BytesInFlight => "bytes_in_flight".into(),
        Metric::Busy => "busy".into(),
        Metric::Requests => "requests".into(),
    }
}

fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 / whole as f64 }
}

/// One rank in `report.json`.
#[derive(Debug, Serialize)]
pub struct RankSummary {
    /// `prefill0`, `decode1`, `aggregated0`.
    pub name: String,
    /// `prefill`, `decode` or `aggregated`.
    pub role: Role,
    /// Scheduler steps run.
    pub steps: u64,
    /// Step events (a fast-forwarded run of identical steps is one).
    pub step_runs: u64,
    /// Simulated seconds spent in steps.
    pub busy_s: f64,
    /// `busy_s` over the run's simulated time.
    pub busy_fraction: f64,
    /// Tokens computed (prefill and decode).
    pub tokens: u64,
    /// Output tokens generated.
    pub output_tokens: u64,
    /// Preemptions (recompute).
    pub preemptions: u64,
    /// Blocks in the KV pool.
    pub num_blocks: u64,
    /// Most blocks in use at once.
    pub peak_used_blocks: u64,
    /// `peak_used_blocks / num_blocks`.
    pub peak_used_fraction: f64,
    /// Cached (free) blocks evicted to make room.
    pub evicted_blocks: u64,
    /// The pool's cache groups, in the order of `kv_used_blocks[...]`.
    pub groups: Vec<String>,
    /// Handoff commands the rank refused, as text.
    pub refusals: Vec<String>,
    /// Prefill ranks: sources held, released, cancelled, expired, stale.
    pub sources: Option<BTreeMap<&'static str, u64>>,
    /// Decode ranks: reservations that waited for free blocks.
    pub reservations_waited: u64,
}

impl RankSummary {
    fn of(r: &RankReport, run_ns: u64) -> Self {
        let s = &r.stats;
        RankSummary {
            name: r.name.clone(),
            role: r.role,
            steps: s.steps,
            step_runs: s.runs,
            busy_s: s.busy.as_secs_f64(),
            busy_fraction: fraction(s.busy.as_nanos(), run_ns),
            tokens: s.tokens,
            output_tokens: s.output_tokens,
            preemptions: s.preemptions,
            num_blocks: r.num_blocks,
            peak_used_blocks: r.peak_used_blocks,
            peak_used_fraction: fraction(r.peak_used_blocks, r.num_blocks),
            evicted_blocks: r.evicted_blocks,
            groups: r.groups.clone(),
            refusals: r.refusals.clone(),
            sources: r.sources.map(|s| {
                BTreeMap::from([
                    ("held", s.held),
                    ("released", s.released),
                    ("cancelled", s.cancelled),
                    ("expired", s.expired),
                    ("stale", s.stale),
                ])
            }),
            reservations_waited: r.reservations_waited,
        }
    }
}

/// One link in `report.json`.
#[derive(Debug, Serialize)]
pub struct LinkSummary {
    /// `link-p0-d1`, or `link` when shared.
    pub name: String,
    /// Transfers started.
    pub transfers: u64,
    /// Bytes of the transfers started.
    pub bytes_started: u64,
    /// Bytes of the transfers completed.
    pub bytes_completed: u64,
    /// Simulated seconds with at least one transfer moving bytes.
    pub busy_s: f64,
    /// `busy_s` over the run's simulated time.
    pub busy_fraction: f64,
    /// Mean rate over the busy time, GB/s (10^9 bytes/s).
    pub mean_busy_gb_s: f64,
    /// Most transfers moving bytes at once.
    pub peak_active_transfers: u64,
    /// Most bytes in flight at the end of an instant (the timeline's largest
    /// `bytes_in_flight`).
    pub peak_sampled_bytes_in_flight: u64,
    /// Messages the link does not handle (a wiring bug if not 0).
    pub unexpected_messages: u64,
}

impl LinkSummary {
    fn of(l: &LinkReport, run_ns: u64) -> Self {
        let s = &l.stats;
        let busy = s.busy.as_secs_f64();
        LinkSummary {
            name: l.name.clone(),
            transfers: s.transfers,
            bytes_started: s.bytes_started,
            bytes_completed: s.bytes_completed,
            busy_s: busy,
            busy_fraction: fraction(s.busy.as_nanos(), run_ns),
            mean_busy_gb_s: if busy > 0.0 { s.bytes_completed as f64 / busy / 1e9 } else { 0.0 },
            peak_active_transfers: s.peak_active,
            peak_sampled_bytes_in_flight: s.peak_sampled_bytes_in_flight,
            unexpected_messages: s.unexpected,
        }
    }
}

/// Whether the offered load exceeded what was served, in `report.json`
/// (and the summary's `overload` line when it did).
///
/// The rule ([`overload`]): with open-loop arrivals (a closed loop offers
/// only what is served), the run is overloaded when all three hold:
/// - the completion rate (completed requests over the run's duration) is
///   below [`SERVED_SHARE`] of the arrival rate (arrivals after the first
///   over the time from the first to the last);
/// - the requests in the system (entered, not ended) grew while requests
///   came: the least-squares slope of their count, as each request
///   arrived, against its arrival time is at least [`GROWTH_SHARE`] of
///   the arrival rate;
/// - the wait grew with them: the mean TTFT of the last 32 completed
///   requests is at least [`LATENCY_GROWTH`] times that of the first 32.
///
/// A stable run serves what comes (the completion rate falls short only
/// by the tail after the last arrival), its backlog does not trend, and
/// its late requests wait about as long as its early ones; an overloaded
/// one serves at its capacity while the backlog, and with it every later
/// request's wait, grows at the difference. A run too short to leave its
/// warm-up can meet the first two alone (the backlog fills from empty);
/// the third keeps it quiet (on the shipped scenarios cut to 50 to 2,000
/// requests, the late requests' TTFT is at most 1.9 times the early
/// ones'). An overload of a few per cent needs a long run to show: the
/// completion rate counts the tail.
///
/// The bottleneck is read from where the time goes, not from busy
/// shares: it is the role in front of which requests waited longest on
/// average ([`Overload::wait_ms`]): the prefill queue for prefill (or
/// aggregated) ranks, the transfer wait (routing and the decode rank's
/// reservation of blocks) plus the decode queue for decode ranks, the
/// transfer itself for links; each less the API server's legs inside it
/// (the way in, the proxy's hop), which are no rank's queue. A busy share cannot tell it: a decode rank
/// with anything to decode steps all the time, however small its batch,
/// so its busy share sits near 100 % below its capacity (a GLM 1P1D run
/// at 5 req/s with bursty arrivals: decode 95.0 % busy, prefill 79.2 %,
/// yet 2,914 ms of the 3,462 ms mean TTFT, 84 %, is the prefill queue).
/// With no wait anywhere (no request reached a stage), the busiest role.
#[derive(Debug, Serialize)]
pub struct Overload {
    /// The rule above holds.
    pub overloaded: bool,
    /// Arrivals after the first per second between the first and the last
    /// (null with fewer than two arrivals, or all at once).
    pub arrival_rate_per_s: Option<f64>,
    /// Completed requests per second over the run (`request_throughput`).
    pub completion_rate_per_s: f64,
    /// Requests in the system just after the last arrival.
    pub backlog_at_last_arrival: u64,
    /// Their mean over the arrivals.
    pub mean_backlog: f64,
    /// The slope of the backlog against arrival time, requests per second.
    pub backlog_growth_per_s: f64,
    /// The mean TTFT of the first 32 completed requests, ms.
    pub early_ttft_ms: f64,
    /// The mean TTFT of the last 32 completed requests, ms.
    pub late_ttft_ms: f64,
    /// The role requests waited longest in front of: `prefill`,
    /// `decode`, `aggregated` or `link`.
    pub bottleneck: Option<&'static str>,
    /// The bottleneck's wait over the mean TTFT of completed requests
    /// (null without a bottleneck or a TTFT).
    pub bottleneck_ttft_share: Option<f64>,
    /// Each role's mean wait in front of it, ms (the summary's stage
    /// means): prefill or aggregated, the prefill queue; decode, the
    /// transfer wait plus the decode queue; link, the transfer time; the
    /// API server's legs taken out.
    pub wait_ms: BTreeMap<&'static str, f64>,
    /// Each role's mean busy share (of its ranks, or of the links). A
    /// decode rank steps whenever it has anything to decode, so its share
    /// says little of how close it is to its capacity.
    pub busy_share: BTreeMap<&'static str, f64>,
}

/// [`Overload`]: the completion rate is below this share of the arrival rate.
pub const SERVED_SHARE: f64 = 0.95;
/// [`Overload`]: the backlog grows by at least this share of the arrival rate.
pub const GROWTH_SHARE: f64 = 0.05;
/// [`Overload`]: the late requests' mean TTFT is at least this many times
/// the early ones'.
pub const LATENCY_GROWTH: f64 = 3.0;

/// The overload check of `run` of `scenario` (see [`Overload`]).
pub fn overload(scenario: &Scenario, run: &Run) -> Overload {
    let out = &run.output;
    let s = &out.summary;
    let l = &s.load;
    let run_ns = out.final_time.as_nanos();
    let arrival_rate = match (l.first_arrival, l.last_arrival) {
        (Some(a), Some(b)) if b > a && l.entered >= 2 => Some((l.entered - 1) as f64 / (b - a).as_secs_f64()),
        _ => None,
    };
    let mut shares: BTreeMap<&'static str, (f64, u32)> = BTreeMap::new();
    for r in &out.ranks {
        let e = shares.entry(r.role.as_str()).or_default();
        e.0 += fraction(r.stats.busy.as_nanos(), run_ns);
        e.1 += 1;
    }
    for l in &out.links {
        let e = shares.entry("link").or_default();
        e.0 += fraction(l.stats.busy.as_nanos(), run_ns);
        e.1 += 1;
    }
    let busy_share: BTreeMap<&'static str, f64> =
        shares.into_iter().map(|(k, (sum, n))| (k, sum / f64::from(n.max(1)))).collect();
    // The mean wait in front of each role, ms, less the API server's
    // legs every request crosses there (the way in before the prefill
    // queue, the proxy's hop inside the transfer wait): time spent in the
    // front end is no role's queue.
    let front = scenario.front_end();
    let ms = |d: sim_core::SimDuration| d.as_nanos() as f64 / 1e6;
    let (way_in, hop) = (ms(front.request), ms(front.request) + ms(front.response));
    let wait = |role: &str| match role {
        "prefill" | "aggregated" => (s.prefill_queue_ms.mean - way_in).max(0.0),
        "decode" => (s.transfer_wait_ms.mean - hop).max(0.0) + s.decode_queue_ms.mean,
        _ => s.transfer_time_ms.mean,
    };
    let wait_ms: BTreeMap<&'static str, f64> = busy_share.keys().map(|&k| (k, wait(k))).collect();
    let bottleneck = bottleneck(&busy_share, &wait_ms);
    let bottleneck_ttft_share = bottleneck
        .filter(|_| s.ttft_ms.count > 0 && s.ttft_ms.mean > 0.0)
        .map(|b| wait_ms.get(b).copied().unwrap_or(0.0) / s.ttft_ms.mean);
    let open = matches!(scenario.workload().arrival_mode(), ArrivalMode::Open);
    let overloaded = open
        && arrival_rate.is_some_and(|lambda| {
            s.request_throughput < SERVED_SHARE * lambda
                && l.backlog_growth_per_s >= GROWTH_SHARE * lambda
                && l.late_ttft_ms >= LATENCY_GROWTH * l.early_ttft_ms
        });
    Overload {
        overloaded,
        arrival_rate_per_s: arrival_rate,
        completion_rate_per_s: s.request_throughput,
        backlog_at_last_arrival: l.backlog_at_last_arrival,
        mean_backlog: l.mean_backlog,
        backlog_growth_per_s: l.backlog_growth_per_s,
        early_ttft_ms: l.early_ttft_ms,
        late_ttft_ms: l.late_ttft_ms,
        bottleneck,
        bottleneck_ttft_share,
        wait_ms,
        busy_share,
    }
}

/// [`Overload::bottleneck`]: the role with the longest mean wait in front
/// of it, or, when no role has a wait, the busiest; on a tie, the first of
/// prefill, aggregated, decode, link.
pub fn bottleneck(
    busy_share: &BTreeMap<&'static str, f64>,
    wait_ms: &BTreeMap<&'static str, f64>,
) -> Option<&'static str> {
    let order = ["prefill", "aggregated", "decode", "link"];
    let pick = |of: &BTreeMap<&'static str, f64>| {
        order.iter().filter_map(|k| of.get(k).map(|&x| (*k, x))).fold(
            None,
            |best: Option<(&'static str, f64)>, (k, x)| match best {
                Some((_, bx)) if bx >= x => best,
                _ => Some((k, x)),
            },
        )
    };
    match pick(wait_ms) {
        Some((k, w)) if w > 0.0 => Some(k),
        _ => pick(busy_share).map(|(k, _)| k),
    }
}

/// Where the scenario came from, in `report.json`.
#[derive(Debug, Serialize)]
pub struct ScenarioInfo<'a> {
    /// The file as named on the command line, or the embedded default's
    /// label.
    pub label: &'a str,
    /// The scenario's `name`, if any.
    pub name: Option<&'a str>,
    /// The scenario's `description`, if any.
    pub description: Option<&'a str>,
    /// The resolved scenario (includes and defaults filled in) with the
    /// run's seed and request count: a scenario file that reproduces the run.
    pub resolved: Value,
}

/// The contents of `report.json`.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    /// The pdsim that wrote it.
    pub pdsim_version: &'static str,
    /// The scenario.
    pub scenario: ScenarioInfo<'a>,
    /// The seed of every random stream.
    pub seed: u64,
    /// `--requests`, if given.
    pub requests_override: Option<u64>,
    /// What the workload read and made.
    pub workload: &'a SourceStats,
    /// The metrics of `actors::metrics::Summary`.
    pub summary: &'a Summary,
    /// The same run in `vllm bench serve`'s terms: its result's names and
    /// definitions (`actors::bench`).
    pub bench: &'a Bench,
    /// Whether the offered load exceeded what was served ([`overload`]).
    pub overload: Overload,
    /// Every rank, prefill (or aggregated) ranks first.
    pub ranks: Vec<RankSummary>,
    /// Every link.
    pub links: Vec<LinkSummary>,
    /// Engine events delivered.
    pub events: u64,
    /// Simulated time of the last event, ns (exact) and s.
    pub final_time_ns: u64,
    /// Simulated time of the last event, s.
    pub final_time_s: f64,
    /// FNV-1a digest of every request's outcome, counts and times, hex.
    pub digest: String,
    /// Ctrl-C stopped the run: it covers only the requests that entered by
    /// `final_time`, and those in flight then are unfinished.
    pub interrupted: bool,
    /// Broken conservation invariants (empty unless pdsim has a bug).
    pub violations: &'a [String],
    /// With `--sketch-above N`: the latency statistics over more than N
    /// values come from a quantile sketch (absent: every one exact).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_sketch: Option<LatencySketch>,
}

/// `report.json`'s `latency_sketch`: how the latency statistics were
/// bounded (`pdsim run --sketch-above N`).
#[derive(Debug, Serialize)]
pub struct LatencySketch {
    /// Values each latency statistic kept exactly (a statistic over at
    /// most this many, rounded up to 65,536, is exact).
    pub exact_up_to: u64,
    /// The bound on the relative error of each percentile, median and
    /// (in `bench`) `pN_` field of a sketched statistic; count, mean and
    /// max are exact, std up to float rounding.
    pub relative_error: f64,
}

/// The resolved scenario as JSON, with `seed` and (when given) the request
/// count of the run written in, and its paths relative to the scenario's
/// folder.
pub fn resolved_scenario(scenario: &Scenario, seed: u64, requests: Option<u64>) -> Value {
    // Paths relative to the scenario's own folder, as in its file: the
    // same bytes whatever folder the run was started in.
    let mut v = serde_json::to_value(scenario.beside_its_file()).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert("seed".into(), json!(seed));
        // The front end in effect, each field the file left out the
        // version's.
        let f = scenario.front_end();
        let us = |d: sim_core::SimDuration| d.as_nanos() as f64 / 1e3;
        m.insert("frontend".into(), json!({"request_us": us(f.request), "response_us": us(f.response)}));
        if let (Some(n), Some(Value::Object(w))) = (requests, m.get_mut("workload")) {
            w.insert("requests".into(), json!(n));
        }
    }
    v
}

/// Builds the report of `run` of `scenario`, named `label`.
pub fn report<'a>(scenario: &'a Scenario, label: &'a str, run: &'a Run) -> Report<'a> {
    let out = &run.output;
    let run_ns = out.final_time.as_nanos();
    Report {
        pdsim_version: PDSIM_VERSION,
        scenario: ScenarioInfo {
            label,
            name: scenario.name(),
            description: scenario.description(),
            resolved: resolved_scenario(scenario, run.seed, run.requests),
        },
        seed: run.seed,
        requests_override: run.requests,
        workload: &run.workload,
        summary: &out.summary,
        bench: &out.summary.bench,
        overload: overload(scenario, run),
        ranks: out.ranks.iter().map(|r| RankSummary::of(r, run_ns)).collect(),
        links: out.links.iter().map(|l| LinkSummary::of(l, run_ns)).collect(),
        events: out.events,
        final_time_ns: run_ns,
        final_time_s: out.final_time.as_secs_f64(),
        digest: digest_hex(out.digest),
        interrupted: run.interrupted,
        violations: &out.violations,
        latency_sketch: run
            .sketch_above
            .map(|n| LatencySketch { exact_up_to: n, relative_error: actors::sketch::RELATIVE_ERROR }),
    }
}

/// Writes `report.json` (pretty-printed, ending with a newline).
///
/// # Errors
/// Writing fails.
pub fn write_report(w: &mut impl Write, report: &Report<'_>) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *w, report)?;
    w.write_all(b"\n")
}
