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
/// transfer itself for links. A busy share cannot tell it: a decode rank
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
    /// transfer wait plus the decode queue; link, the transfer time.
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
    // The mean wait in front of each role, ms.
    let wait = |role: &str| match role {
        "prefill" | "aggregated" => s.prefill_queue_ms.mean,
        "decode" => s.transfer_wait_ms.mean + s.decode_queue_ms.mean,
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

/// The columns of `requests.csv`.
pub const REQUEST_COLUMNS: &[&str] = &[
    "id",
    "outcome",
    "fail_reason",
    "prompt_tokens",
    "output_tokens",
    "generated_tokens",
    "prefill_rank",
    "decode_rank",
    "transferred_tokens",
    "transfer_bytes",
    "prefill_hit_tokens",
    "decode_hit_tokens",
    "preemptions",
    "arrival_ms",
    "prefill_queued_ms",
    "prefill_started_ms",
    "prefill_done_ms",
    "reserve_requested_ms",
    "reserved_ms",
    "transfer_started_ms",
    "transfer_done_ms",
    "decode_started_ms",
    "first_token_ms",
    "last_token_ms",
    "finished_ms",
    "prefill_queue_ms",
    "prefill_time_ms",
    "transfer_wait_ms",
    "transfer_time_ms",
    "decode_queue_ms",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "max_itl_ms",
];

/// Writes `requests.csv`: one row per request, by id. Times in ms with six
/// decimals; a stage never reached is an empty cell. The derived spans are
/// those of the summary: prefill queue from arrival to the first prefill
/// step, prefill time to the end of the prefill, transfer wait to the start
/// of the transfer (routing and reservation), transfer time on the link,
/// decode queue from the end of the transfer to the first decode step.
///
/// # Errors
/// Writing fails.
pub fn write_requests_csv(w: &mut impl Write, records: &[Request], disaggregated: bool) -> io::Result<()> {
    let mut rows = RequestRows::new(disaggregated);
    w.write_all(rows.header())?;
    for r in records {
        w.write_all(rows.row(r))?;
    }
    Ok(())
}

/// The lines of `requests.csv`, formatted into one fixed buffer (a failed
/// request's line into a second, its reason spliced in; digits written by hand, no allocation or UTF-8 check per field), so
/// that rows can be written as requests end ([`write_requests_csv`] is
/// the same rows over a slice).
pub struct RequestRows {
    first_role: Role,
    /// The line as written, its failure reason left out ([`Line`]).
    buf: Box<[u8; LINE_ROOM]>,
    /// The header, or a line with its failure reason spliced in.
    line: Vec<u8>,
}

impl RequestRows {
    /// Rows of a run with (`disaggregated`) or without a handoff.
    pub fn new(disaggregated: bool) -> Self {
        RequestRows {
            first_role: if disaggregated { Role::Prefill } else { Role::Aggregated },
            buf: Box::new([0; LINE_ROOM]),
            line: Vec::new(),
        }
    }

    /// The header line, on its own.
    pub fn header_bytes(&self) -> Vec<u8> {
        let mut h = REQUEST_COLUMNS.join(",").into_bytes();
        h.push(b'\n');
        h
    }

    /// The header line.
    pub fn header(&mut self) -> &[u8] {
        self.line = self.header_bytes();
        &self.line
    }

    /// The line of `r`.
    pub fn row(&mut self, r: &Request) -> &[u8] {
        let mut l = Line { buf: &mut self.buf, len: 0 };
        let s = &r.t;
        l.u64(r.id);
        l.byte(b',');
        l.bytes(outcome_name(&r.outcome).as_bytes());
        l.byte(b',');
        // (A failed request's reason goes here: spliced in below. Any
        // other's is `none`, so that the column is text to a reader that
        // guesses types, pandas' read_csv among them, even in a run with
        // no failure.)
        let reason_at = l.len;
        if !matches!(r.outcome, Outcome::Failed(_)) {
            l.bytes(NO_FAILURE.as_bytes());
        }
        l.byte(b',');
        for v in [r.prompt.get(), r.output.get(), r.generated.get()] {
            l.u64(v);
            l.byte(b',');
        }
        for (role, index) in [(self.first_role, r.prefill_rank), (Role::Decode, r.decode_rank)] {
            if let Some(i) = index {
                l.bytes(role.as_str().as_bytes());
                l.u64(u64::from(i));
            }
            l.byte(b',');
        }
        for v in [
            r.transferred_tokens.get(),
            r.transfer_bytes.get(),
            r.prefill_hit.get(),
            r.decode_hit.get(),
            u64::from(r.preemptions),
        ] {
            l.u64(v);
            l.byte(b',');
        }
        for x in s.in_order() {
            if let Some(t) = x {
                l.ms6(t.as_nanos());
            }
            l.byte(b',');
        }
        let span = |a: Option<SimTime>, b: Option<SimTime>| a.zip(b).map(|(a, b)| b.saturating_since(a));
        let queued = s.prefill_queued.map(|_| s.arrival);
        let spans = [
            span(queued, s.prefill_started),
            span(s.prefill_started, s.prefill_done),
            span(s.prefill_done, s.transfer_started),
            span(s.transfer_started, s.transfer_done),
            span(s.transfer_done, s.decode_started),
            r.ttft(),
            r.tpot(),
            r.e2e(),
            (r.generated.get() >= 2).then_some(r.max_itl),
        ];
        for (i, x) in spans.into_iter().enumerate() {
            if i > 0 {
                l.byte(b',');
            }
            if let Some(d) = x {
                l.ms6(d.as_nanos());
            }
        }
        l.byte(b'\n');
        let n = l.len;
        // (Offsets are masked, the length is not: a line past the room
        // would have wrapped onto its own start.)
        assert!(n <= ROW_MAX, "a requests.csv line stays within ROW_MAX");
        let Outcome::Failed(why) = r.outcome else { return &self.buf[..n] };
        self.line.clear();
        self.line.extend_from_slice(&self.buf[..reason_at]);
        self.line.extend_from_slice(csv_field(&why.to_string()).as_bytes());
        self.line.extend_from_slice(&self.buf[reason_at..n]);
        &self.line
    }
}

/// `requests.csv`'s `fail_reason` of a request that did not fail.
pub const NO_FAILURE: &str = "none";

/// Room for a `requests.csv` line without its failure reason: 9 counts of
/// at most 20 digits, 21 times in ms of at most 21 bytes (14 digits, a
/// point, 6 decimals), two ranks (a role name and a `u32`, 20 bytes), the
/// outcome (9), [`NO_FAILURE`] (4), 33 commas and the newline, and the 7
/// bytes past the end that storing a number as a word may write: 715
/// bytes at most ([`ROW_MAX`]). A power of two, so that [`Line`] can mask
/// its offsets.
const ROW_ROOM: usize = 1024;

/// The most a `requests.csv` line without its failure reason writes (see
/// [`ROW_ROOM`]).
const ROW_MAX: usize = 715;
const _: () = assert!(ROW_MAX <= ROW_ROOM && ROW_ROOM.is_power_of_two());

/// A line's buffer: [`ROW_ROOM`] and the word a number stores past the
/// last offset a line can reach.
const LINE_ROOM: usize = ROW_ROOM + 8;

/// A line written in place into a fixed buffer, its failure reason left
/// out (the caller splices it in), so that no number checks or grows a
/// capacity or calls `memcpy` for a few digits (the outcome and a role name
/// are copied as slices). Offsets are masked to [`ROW_ROOM`], which a line
/// never reaches ([`ROW_MAX`]): the mask changes nothing, but it lets the
/// compiler see that a byte or a word stored at one is inside the buffer,
/// so that those stores check no bounds (slices of other lengths, the
/// outcome, a role name, a number of 10^8 or more, still do). The length
/// is not masked: a line that did pass the room (a column added without
/// raising [`ROW_MAX`]) is caught where it ends ([`RequestRows::row`]
/// asserts it), in release builds too.
struct Line<'a> {
    buf: &'a mut [u8; LINE_ROOM],
    len: usize,
}

impl Line<'_> {
    /// The offset of the next byte.
    #[inline(always)]
    fn at(&self) -> usize {
        debug_assert!(self.len < ROW_ROOM, "a line stays within ROW_MAX");
        self.len & (ROW_ROOM - 1)
    }

    #[inline]
    fn byte(&mut self, b: u8) {
        let i = self.at();
        self.buf[i] = b;
        self.len += 1;
    }

    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        let i = self.at();
        self.buf[i..i + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    /// `v` in decimal. Below 10^8 (nearly every count and time in ms) the
    /// digits are made the same way whatever their number, eight at once
    /// ([`eight_digits`]), and stored as one word whose leading zeros are
    /// shifted out: no loop whose length the processor must guess at every
    /// field, and no digit count to work out apart.
    #[inline(always)]
    fn u64(&mut self, v: u64) {
        if v < 100_000_000 {
            let raw = eight_digits(v as u32);
            // Leading zeros are the low bytes (the first in memory); one
            // digit stays for 0.
            let zeros = (raw.trailing_zeros() / 8).min(7) as usize;
            let word = (raw | ASCII_ZEROS) >> (8 * zeros);
            let i = self.at();
            self.buf[i..i + 8].copy_from_slice(&word.to_le_bytes());
            self.len += 8 - zeros;
        } else {
            let width = v.ilog10() as usize + 1;
            let i = self.at();
            digits_into(&mut self.buf[i..i + width], v);
            self.len += width;
        }
    }

    /// `ns` as milliseconds with six decimals.
    #[inline(always)]
    fn ms6(&mut self, ns: u64) {
        self.u64(ns / 1_000_000);
        let frac = (ns % 1_000_000) as u32;
        // ".dddddd": the point, then the last six of eight digits.
        let word = ((eight_digits(frac) | ASCII_ZEROS) & !0xffff) | u64::from(b'.') << 8;
        let i = self.at();
        self.buf[i..i + 8].copy_from_slice(&(word >> 8).to_le_bytes());
        self.len += 7;
    }
}

/// `'0'` in every byte of a word.
const ASCII_ZEROS: u64 = 0x3030_3030_3030_3030;

/// The eight decimal digits of `v` (below 10^8), zero-padded, as the bytes
/// of a little-endian word, the first digit lowest (values 0 to 9; add
/// [`ASCII_ZEROS`] for text). All eight at once, in lanes of one `u64`: the
/// two halves of four digits in 32-bit lanes, each split into pairs by a
/// multiply-shift division by 100 (exact below 10^4), the pairs in 16-bit
/// lanes split into digits by one by 10 (exact below 179). No lane's product
/// reaches the next lane: 9,999 x 10,486 < 2^27 and 99 x 103 < 2^16.
#[inline]
fn eight_digits(v: u32) -> u64 {
    debug_assert!(v < 100_000_000);
    let x = u64::from(v / 10_000) | u64::from(v % 10_000) << 32;
    let hundreds = ((x * 10_486) >> 20) & 0x0000_007f_0000_007f;
    let pairs = hundreds | (x - hundreds * 100) << 16;
    let tens = ((pairs * 103) >> 10) & 0x000f_000f_000f_000f;
    tens | (pairs - tens * 10) << 8
}

/// Two decimal digits of every number below 100.
const PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Writes the last `buf.len()` decimal digits of `v`, zero-padded, into `buf`:
/// four digits a division of `v` (half the chain of dependent divisions of
/// two at a time), each four as two pairs apart.
#[inline]
fn digits_into(buf: &mut [u8], mut v: u64) {
    let mut k = buf.len();
    while k >= 4 {
        let c = (v % 10_000) as u32;
        v /= 10_000;
        let (hi, lo) = ((c / 100) as usize * 2, (c % 100) as usize * 2);
        buf[k - 4..k - 2].copy_from_slice(&PAIRS[hi..hi + 2]);
        buf[k - 2..k].copy_from_slice(&PAIRS[lo..lo + 2]);
        k -= 4;
    }
    if k >= 2 {
        let r = (v % 100) as usize * 2;
        v /= 100;
        buf[k - 2..k].copy_from_slice(&PAIRS[r..r + 2]);
        k -= 2;
    }
    if k == 1 {
        buf[0] = b'0' + (v % 10) as u8;
    }
}

/// Appends `v` in decimal. The digits are copied as the whole fixed-size
/// buffer and the tail cut off: a copy of constant length is a few moves,
/// one of the digits' length a call of `memcpy`.
#[inline]
fn bytes_u64(out: &mut Vec<u8>, v: u64) {
    let width = if v == 0 { 1 } else { v.ilog10() as usize + 1 };
    let mut buf = [0u8; 20];
    digits_into(&mut buf[..width], v);
    let end = out.len() + width;
    out.extend_from_slice(&buf);
    out.truncate(end);
}

/// Appends `v / 10^decimals` with exactly `decimals` (at most 19) decimals,
/// in one copy (the divisions by a constant `decimals` where it is inlined).
#[inline(always)]
fn bytes_fixed(out: &mut Vec<u8>, v: u64, decimals: u32) {
    let scale = 10u64.pow(decimals);
    let (whole, frac) = (v / scale, v % scale);
    let width = if whole == 0 { 1 } else { whole.ilog10() as usize + 1 };
    let n = decimals as usize;
    let mut buf = [0u8; 40];
    digits_into(&mut buf[..width], whole);
    buf[width] = b'.';
    digits_into(&mut buf[width + 1..width + 1 + n], frac);
    // (As in `bytes_u64`: the whole buffer, then the tail cut off.)
    let end = out.len() + width + 1 + n;
    out.extend_from_slice(&buf);
    out.truncate(end);
}

/// Writes `timeline.csv` in long format, `time_ms,entity,metric,value`:
/// every sample of every rank and link, ordered by time, then entity (ranks
/// in report order, then links), then the order the entity recorded them.
///
/// # Errors
/// Writing fails.
pub fn write_timeline_csv(w: &mut impl Write, ranks: &[RankReport], links: &[LinkReport]) -> io::Result<()> {
    let entities: Vec<(String, Vec<String>)> = ranks
        .iter()
        .map(|r| (r.name.clone(), r.groups.clone()))
        .chain(links.iter().map(|l| (l.name.clone(), Vec::new())))
        .collect();
    let timelines: Vec<&actors::metrics::Timeline> =
        ranks.iter().map(|r| &r.timeline).chain(links.iter().map(|l| &l.timeline)).collect();
    // (time, entity, position in the entity's samples): a total order.
    let mut rows: Vec<(u64, usize, usize)> = Vec::new();
    for (e, tl) in timelines.iter().enumerate() {
        rows.extend(tl.samples.iter().enumerate().map(|(i, s)| (s.time.as_nanos(), e, i)));
    }
    rows.sort_unstable();
    let mut out = TimelineRows::new(&entities);
    w.write_all(TimelineRows::HEADER)?;
    let mut buf = Vec::new();
    for chunk in rows.chunks(4096) {
        buf.clear();
        for &(_, e, i) in chunk {
            out.push(&mut buf, &EntitySample { entity: e as u32, sample: timelines[e].samples[i] });
        }
        w.write_all(&buf)?;
    }
    Ok(())
}

/// The lines of `timeline.csv`, formatted by hand into a caller's buffer,
/// so that samples can be written as a run takes them (in the order
/// [`actors::sim::Built::set_sample_sink`] hands them over, which is the
/// file's) or all at once ([`write_timeline_csv`]).
pub struct TimelineRows {
    /// Entity names, CSV-quoted.
    names: Vec<String>,
    groups: Vec<Vec<String>>,
    metric_names: BTreeMap<(u32, Metric), String>,
}

impl TimelineRows {
    /// The header line.
    pub const HEADER: &'static [u8] = b"time_ms,entity,metric,value\n";

    /// Rows of these entities (name, cache-group names), in report order.
    pub fn new(entities: &[(String, Vec<String>)]) -> Self {
        TimelineRows {
            names: entities.iter().map(|(n, _)| csv_field(n)).collect(),
            groups: entities.iter().map(|(_, g)| g.clone()).collect(),
            metric_names: BTreeMap::new(),
        }
    }

    /// Appends the line of `s` to `out`.
    pub fn push(&mut self, out: &mut Vec<u8>, s: &EntitySample) {
        let e = s.entity as usize;
        let no_groups: &[String] = &[];
        let groups = self.groups.get(e).map_or(no_groups, Vec::as_slice);
        let metric = self
            .metric_names
            .entry((s.entity, s.sample.metric))
            .or_insert_with(|| csv_field(&metric_name(s.sample.metric, groups)));
        bytes_fixed(out, s.sample.time.as_nanos(), 6);
        out.push(b',');
        out.extend_from_slice(self.names.get(e).map_or("", String::as_str).as_bytes());
        out.push(b',');
        out.extend_from_slice(metric.as_bytes());
        out.push(b',');
        bytes_u64(out, s.sample.value);
        out.push(b'\n');
    }
}

/// Writes `trace.json` in the Chrome trace-event format (JSON object form),
/// for Perfetto (ui.perfetto.dev) or chrome://tracing.
///
/// - One process per rank and per link (`process_name` and `thread_name`
///   metadata, in report order), so each gets its own track.
/// - Per request, async slices (`ph` `b`/`e`, `id` = the request id in
///   hex, `cat` and `name` = the stage, the request id in `args`): `prefill` on its prefill rank (from the first prefill
///   step to the end of the prefill; on an aggregated rank, to the first
///   token), `transfer` on its link (from the start to the end of the
///   transfer; none when nothing moved), `decode` on its decode rank (from
///   the first decode step to the end; on an aggregated rank, from the
///   first token to the end). Overlapping requests get their own rows
///   under the rank's track. A request that failed mid-stage ends that
///   stage at its failure. Slice args carry the request's numbers.
/// - Counters (`ph` `C`), one per timeline row of the series shown (so at
///   each change, with the instant's final value): per rank `kv
///   used_blocks`, `seqs waiting`, `seqs running`, `requests in_system` and
///   `state busy`; per link `transfers active`, `bytes in_flight`,
///   `requests in_system` and `state busy`.
///
/// Timestamps are simulated microseconds.
///
/// # Errors
/// Writing fails.
pub fn write_trace_json(
    w: &mut impl Write,
    scenario_label: &str,
    run: &Run,
    topology: LinkTopology,
    disaggregated: bool,
) -> io::Result<()> {
    let out = &run.output;
    let entities: Vec<String> =
        out.ranks.iter().map(|r| r.name.clone()).chain(out.links.iter().map(|l| l.name.clone())).collect();
    write_trace_head(w, scenario_label, run.seed, out.digest, &entities)?;
    let mut buf = Vec::new();
    let mut slices = TraceSlices::new(&entities, topology, disaggregated);
    for chunk in out.records.chunks(1024) {
        buf.clear();
        for r in chunk {
            slices.push(&mut buf, r);
        }
        w.write_all(&buf)?;
    }
    let no_groups: Vec<String> = Vec::new();
    let timelines =
        out.ranks.iter().map(|r| (&r.timeline, &r.groups)).chain(out.links.iter().map(|l| (&l.timeline, &no_groups)));
    for (i, (tl, groups)) in timelines.enumerate() {
        for chunk in tl.samples.chunks(4096) {
            buf.clear();
            for sample in chunk {
                trace_counter(&mut buf, i as u32, sample, groups);
            }
            w.write_all(&buf)?;
        }
    }
    w.write_all(TRACE_TAIL)
}

/// The end of `trace.json`.
pub const TRACE_TAIL: &[u8] = b"\n]}\n";

/// Writes the start of `trace.json`: the header (with the run's digest)
/// and the metadata events of every entity (`entities`: the ranks in report
/// order, then the links). Every event after them ([`TraceSlices`],
/// [`trace_counter`]) starts with its separator.
///
/// # Errors
/// Writing fails.
pub fn write_trace_head(
    w: &mut impl Write,
    label: &str,
    seed: u64,
    digest: u64,
    entities: &[String],
) -> io::Result<()> {
    let meta = json!({
        "pdsim_version": PDSIM_VERSION,
        "scenario": label,
        "seed": seed,
        "digest": digest_hex(digest),
        "time_unit": "simulated microseconds",
    });
    writeln!(w, "{{\"displayTimeUnit\":\"ms\",\"otherData\":{meta},\"traceEvents\":[")?;
    for (i, name) in entities.iter().enumerate() {
        let pid = i + 1;
        let name = serde_json::to_string(name)?;
        if i > 0 {
            w.write_all(b",\n")?;
        }
        write!(w, r#"{{"ph":"M","name":"process_name","pid":{pid},"tid":1,"args":{{"name":{name}}}}}"#)?;
        w.write_all(b",\n")?;
        write!(w, r#"{{"ph":"M","name":"process_sort_index","pid":{pid},"tid":1,"args":{{"sort_index":{pid}}}}}"#)?;
        w.write_all(b",\n")?;
        write!(w, r#"{{"ph":"M","name":"thread_name","pid":{pid},"tid":1,"args":{{"name":{name}}}}}"#)?;
    }
    Ok(())
}

/// The counter of each timeline metric in `trace.json`: (event name, arg
/// key); Perfetto names its track "`<event name> <arg key>`". Every
/// metric of timeline.csv has one, so the trace's counters are the
/// timeline's rows; a cache group's is `kv used_blocks[<group>]` (the
/// group named as timeline.csv names it, [`metric_name`]).
pub const TRACE_COUNTERS: [(Metric, &str, &str); 13] = [
    (Metric::KvUsed, "kv", "used_blocks"),
    (Metric::KvFree, "kv", "free_blocks"),
    (Metric::KvCachedFree, "kv", "cached_free_blocks"),
    (Metric::Waiting, "seqs", "waiting"),
    (Metric::Running, "seqs", "running"),
    (Metric::HeldSources, "handoffs", "held_sources"),
    (Metric::PendingReservations, "handoffs", "pending_reservations"),
    (Metric::Transferring, "handoffs", "transferring"),
    (Metric::ActiveTransfers, "transfers", "active"),
    (Metric::QueuedTransfers, "transfers", "queued"),
    (Metric::BytesInFlight, "bytes", "in_flight"),
    (Metric::Requests, "requests", "in_system"),
    (Metric::Busy, "state", "busy"),
];

/// Appends the counter event of one timeline row of entity `entity`
/// (pid `entity + 1`, whose cache groups are `groups`), as
/// [`TRACE_COUNTERS`] names it.
pub fn trace_counter(out: &mut Vec<u8>, entity: u32, sample: &actors::metrics::Sample, groups: &[String]) {
    let group_key;
    let (name, key): (&str, &str) = match sample.metric {
        Metric::KvGroupUsed(i) => {
            let g = groups.get(usize::from(i)).map_or_else(|| i.to_string(), Clone::clone);
            // A JSON string's inside: the group's name escaped.
            let quoted = serde_json::to_string(&format!("used_blocks[{g}]")).unwrap_or_default();
            group_key = quoted.trim_matches('"').to_owned();
            ("kv", &group_key)
        }
        m => match TRACE_COUNTERS.iter().find(|c| c.0 == m) {
            Some(&(_, name, key)) => (name, key),
            None => return,
        },
    };
    out.extend_from_slice(b",\n{\"ph\":\"C\",\"name\":\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\",\"pid\":");
    bytes_u64(out, u64::from(entity) + 1);
    out.extend_from_slice(b",\"tid\":1,\"ts\":");
    bytes_fixed(out, sample.time.as_nanos(), 3);
    out.extend_from_slice(b",\"args\":{\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    bytes_u64(out, sample.value);
    out.extend_from_slice(b"}}");
}

/// A stage of a request on a track: (stage, pid, start, end).
type Slice = (&'static str, Option<usize>, Option<SimTime>, Option<SimTime>);

/// The async slices of each request in `trace.json`, formatted by hand
/// (the args object's keys in the sorted order serde_json writes them).
pub struct TraceSlices {
    pid_of: BTreeMap<String, usize>,
    topology: LinkTopology,
    disaggregated: bool,
    name: String,
}

impl TraceSlices {
    /// Slices on these entities (the ranks in report order, then the links).
    pub fn new(entities: &[String], topology: LinkTopology, disaggregated: bool) -> Self {
        let pid_of = entities.iter().enumerate().map(|(i, n)| (n.clone(), i + 1)).collect();
        TraceSlices { pid_of, topology, disaggregated, name: String::new() }
    }

    /// The pid of rank `index` of `role`, or of `r`'s link.
    fn pid(&mut self, what: Option<Role>, index: Option<u32>, r: &Request) -> Option<usize> {
        self.name.clear();
        match what {
            Some(role) => {
                self.name.push_str(role.as_str());
                push_u64(&mut self.name, u64::from(index?));
            }
            None => {
                let (p, d) = (r.prefill_rank?, r.decode_rank?);
                match self.topology {
                    LinkTopology::PerPair => {
                        self.name.push_str("link-p");
                        push_u64(&mut self.name, u64::from(p));
                        self.name.push_str("-d");
                        push_u64(&mut self.name, u64::from(d));
                    }
                    LinkTopology::Shared => self.name.push_str("link"),
                }
            }
        }
        self.pid_of.get(self.name.as_str()).copied()
    }

    /// Appends the slices of `r`.
    pub fn push(&mut self, out: &mut Vec<u8>, r: &Request) {
        let s = &r.t;
        let end_or_failure = |end: Option<SimTime>| end.or(s.finished);
        // (stage, pid, start, end)
        let mut slices: [Slice; 3] = [("", None, None, None); 3];
        if self.disaggregated {
            slices[0] = (
                "prefill",
                self.pid(Some(Role::Prefill), r.prefill_rank, r),
                s.prefill_started,
                end_or_failure(s.prefill_done),
            );
            if r.transfer_bytes.get() > 0 {
                slices[1] = ("transfer", self.pid(None, None, r), s.transfer_started, end_or_failure(s.transfer_done));
            }
            slices[2] = ("decode", self.pid(Some(Role::Decode), r.decode_rank, r), s.decode_started, s.finished);
        } else {
            let pid = self.pid(Some(Role::Aggregated), r.prefill_rank, r);
            slices[0] = ("prefill", pid, s.prefill_started, end_or_failure(s.first_token));
            slices[1] = ("decode", pid, s.first_token, s.finished);
        }
        for (stage, pid, start, end) in slices {
            let (Some(pid), Some(start), Some(end)) = (pid, start, end) else { continue };
            let head = |out: &mut Vec<u8>, ph: &[u8]| {
                out.extend_from_slice(b",\n{\"ph\":\"");
                out.extend_from_slice(ph);
                out.extend_from_slice(b"\",\"cat\":\"");
                out.extend_from_slice(stage.as_bytes());
                out.extend_from_slice(b"\",\"name\":\"");
                out.extend_from_slice(stage.as_bytes());
                out.extend_from_slice(b"\",\"id\":\"0x");
                bytes_hex(out, r.id);
                out.extend_from_slice(b"\",\"pid\":");
                bytes_u64(out, pid as u64);
                out.extend_from_slice(b",\"tid\":1,\"ts\":");
            };
            head(out, b"b");
            bytes_fixed(out, start.as_nanos(), 3);
            out.extend_from_slice(b",\"args\":{\"decode_hit_tokens\":");
            bytes_u64(out, r.decode_hit.get());
            out.extend_from_slice(b",\"outcome\":\"");
            out.extend_from_slice(outcome_name(&r.outcome).as_bytes());
            out.extend_from_slice(b"\",\"output_tokens\":");
            bytes_u64(out, r.output.get());
            out.extend_from_slice(b",\"preemptions\":");
            bytes_u64(out, u64::from(r.preemptions));
            out.extend_from_slice(b",\"prefill_hit_tokens\":");
            bytes_u64(out, r.prefill_hit.get());
            out.extend_from_slice(b",\"prompt_tokens\":");
            bytes_u64(out, r.prompt.get());
            out.extend_from_slice(b",\"request\":");
            bytes_u64(out, r.id);
            out.extend_from_slice(b",\"transfer_bytes\":");
            bytes_u64(out, r.transfer_bytes.get());
            out.extend_from_slice(b",\"transferred_tokens\":");
            bytes_u64(out, r.transferred_tokens.get());
            out.extend_from_slice(b"}}");
            head(out, b"e");
            bytes_fixed(out, end.max(start).as_nanos(), 3);
            out.push(b'}');
        }
    }
}

/// Appends `v` in lower-case hexadecimal.
fn bytes_hex(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 16];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(v & 15) as usize];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_point_is_exact() {
        assert_eq!(ms6(0), "0.000000");
        assert_eq!(ms6(7), "0.000007");
        assert_eq!(ms6(1_234_567_890), "1234.567890");
        assert_eq!(ms6(u64::MAX), "18446744073709.551615");
        let us3 = |ns| {
            let mut b = Vec::new();
            bytes_fixed(&mut b, ns, 3);
            String::from_utf8(b).unwrap()
        };
        assert_eq!(us3(1_000_001), "1000.001");
        assert_eq!(us3(999), "0.999");
        let mut b = Vec::new();
        bytes_fixed(&mut b, u64::MAX, 6);
        assert_eq!(b, ms6(u64::MAX).as_bytes());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for v in [x, x >> 20, x >> 40, x % 1000, x % 10] {
                let mut b = Vec::new();
                bytes_u64(&mut b, v);
                assert_eq!(b, v.to_string().as_bytes());
                b.clear();
                bytes_fixed(&mut b, v, 6);
                assert_eq!(b, format!("{}.{:06}", v / 1_000_000, v % 1_000_000).as_bytes());
                b.clear();
                bytes_fixed(&mut b, v, 3);
                assert_eq!(b, format!("{}.{:03}", v / 1_000, v % 1_000).as_bytes());
            }
        }
        // The row writer's own paths: below 10^8 (one word, shifted), at
        // and above it, and every width on either side.
        let mut buf = [0; LINE_ROOM];
        let mut l = Line { buf: &mut buf, len: 0 };
        let mut want = String::new();
        let mut edges: Vec<u64> = (0..20).flat_map(|e| [10u64.pow(e) - 1, 10u64.pow(e)]).collect();
        edges.extend([u64::MAX, 99_999_999, 100_000_000, 100_000_001]);
        for v in edges.into_iter().chain((0..200).map(|k| 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(k + 1) >> (k % 64))) {
            if l.len > ROW_ROOM - 64 {
                assert_eq!(&l.buf[..l.len], want.as_bytes());
                l.len = 0;
                want.clear();
            }
            l.u64(v);
            l.byte(b',');
            l.ms6(v);
            l.byte(b',');
            want.push_str(&format!("{v},{}.{:06},", v / 1_000_000, v % 1_000_000));
        }
        assert_eq!(&l.buf[..l.len], want.as_bytes());
        // Every value below 10^6 and a stride through the rest below 10^8:
        // the eight lanes' digits are the number's.
        for v in (0..1_000_000).chain((1_000_000..100_000_000).step_by(9_973)).chain([99_999_999]) {
            let word = (eight_digits(v) | ASCII_ZEROS).to_le_bytes();
            assert_eq!(&word, format!("{v:08}").as_bytes(), "{v}");
        }
        let mut h = Vec::new();
        bytes_hex(&mut h, 0x1f);
        bytes_hex(&mut h, 0);
        assert_eq!(h, b"1f0");
    }

    /// A row as long as rows get (every count at its largest, both ranks,
    /// a failure, every stamp after the arrival at 2^64 − 1 ns, so the
    /// queue, TTFT and E2E spans too) stays within the bound [`ROW_ROOM`]
    /// states ([`ROW_MAX`], with the 7 a word store may write past its end),
    /// and has its fields where `format!` would put them.
    #[test]
    fn the_longest_row_fits_its_room() {
        use actors::request::FailReason;
        use actors::units::{Bytes, Tokens};
        use sim_core::SimDuration;
        let big = SimTime::from_nanos(u64::MAX);
        let mut r =
            Request::new(u64::MAX, Tokens::new(u64::MAX), Tokens::new(u64::MAX), Default::default(), SimTime::ZERO);
        let t = &mut r.t;
        for x in [
            &mut t.prefill_queued,
            &mut t.prefill_started,
            &mut t.prefill_done,
            &mut t.reserve_requested,
            &mut t.reserved,
            &mut t.transfer_started,
            &mut t.transfer_done,
            &mut t.decode_started,
            &mut t.first_token,
            &mut t.last_token,
        ] {
            *x = Some(big);
        }
        (r.prefill_rank, r.decode_rank) = (Some(u32::MAX), Some(u32::MAX));
        (r.transferred_tokens, r.transfer_bytes) = (Tokens::new(u64::MAX), Bytes::new(u64::MAX));
        (r.prefill_hit, r.decode_hit, r.preemptions) = (Tokens::new(u64::MAX), Tokens::new(u64::MAX), u32::MAX);
        (r.generated, r.max_itl) = (Tokens::new(u64::MAX), SimDuration::from_nanos(u64::MAX));
        r.fail(FailReason::DecodeAborted, big);
        let reason = csv_field(&FailReason::DecodeAborted.to_string());
        let mut rows = RequestRows::new(true);
        let line = rows.row(&r).to_vec();
        assert!(line.len() + 7 <= ROW_MAX + reason.len(), "{} bytes", line.len());
        let text = String::from_utf8(line).unwrap();
        let m = "18446744073709.551615";
        assert!(text.starts_with(&format!("{},failed,{reason},", u64::MAX)), "{text}");
        assert!(text.contains(&format!(",prefill{},decode{},", u32::MAX, u32::MAX)), "{text}");
        assert!(text.contains(&format!(",0.000000,{m},")), "{text}");
        assert_eq!(text.split(',').count(), REQUEST_COLUMNS.len());
    }

    #[test]
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a, b"), "\"a, b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
