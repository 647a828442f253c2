//! Reading a run folder's files for the report: `report.json` (typed, the
//! parts the page shows), `requests.csv` and `timeline.csv` (streamed line
//! by line, reduced to what the charts draw as they are read, so a run of
//! any length is read in bounded memory, apart from three numbers and the
//! stage spans per completed request), and a sweep's `sweep.csv`.
//!
//! Every error is one line naming the file, the line and the column (or
//! the JSON field) and what is wrong with it.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::Deserialize;

use super::ReportError;

/// The longest line read from a CSV file (the widest real row is a few
/// hundred bytes).
const MAX_LINE_BYTES: usize = 1 << 20;

/// The largest `report.json` read (a real one is tens of KB).
const MAX_JSON_BYTES: u64 = 64 << 20;

/// The latest time read, ns (a little under `u64::MAX`, so that a window
/// past the run's end still fits).
pub const MAX_NS: u64 = 18_000_000_000_000_000_000;

/// Summary statistics of one latency, as `report.json` writes them.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Stat {
    pub count: u64,
    pub mean: f64,
    pub median: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// `report.json`'s `summary`.
#[derive(Clone, Debug, Deserialize)]
pub struct Summary {
    pub requests: u64,
    pub completed: u64,
    pub failed: u64,
    #[serde(default)]
    pub failure_reasons: BTreeMap<String, u64>,
    pub duration_s: f64,
    pub request_throughput: f64,
    pub output_token_throughput: f64,
    pub total_token_throughput: f64,
    pub goodput: f64,
    pub slo_attainment: f64,
    pub ttft_ms: Stat,
    pub tpot_ms: Stat,
    pub itl_ms: Stat,
    pub e2e_ms: Stat,
    pub prefill_queue_ms: Stat,
    pub prefill_time_ms: Stat,
    pub transfer_wait_ms: Stat,
    pub transfer_time_ms: Stat,
    pub decode_queue_ms: Stat,
    pub transfer_bytes: u64,
    pub preemptions: u64,
    pub prefill_hit_tokens: u64,
    pub decode_hit_tokens: u64,
}

/// `report.json`'s `overload`.
#[derive(Clone, Debug, Deserialize)]
pub struct Overload {
    pub overloaded: bool,
    pub arrival_rate_per_s: Option<f64>,
    pub completion_rate_per_s: f64,
    pub backlog_at_last_arrival: u64,
    pub backlog_growth_per_s: f64,
    pub bottleneck: Option<String>,
    #[serde(default)]
    pub bottleneck_ttft_share: Option<f64>,
    #[serde(default)]
    pub wait_ms: BTreeMap<String, f64>,
    #[serde(default)]
    pub busy_share: BTreeMap<String, f64>,
}

/// One rank of `report.json`.
#[derive(Clone, Debug, Deserialize)]
pub struct Rank {
    pub name: String,
    pub role: String,
    pub steps: u64,
    pub busy_fraction: f64,
    pub tokens: u64,
    pub preemptions: u64,
    pub num_blocks: u64,
    pub peak_used_blocks: u64,
    pub evicted_blocks: u64,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// One link of `report.json`.
#[derive(Clone, Debug, Deserialize)]
pub struct Link {
    pub name: String,
    pub transfers: u64,
    pub bytes_started: u64,
    pub bytes_completed: u64,
    pub busy_fraction: f64,
    pub mean_busy_gb_s: f64,
    pub peak_active_transfers: u64,
}

/// `report.json`'s `scenario`.
#[derive(Clone, Debug, Deserialize)]
pub struct ScenarioInfo {
    pub label: String,
    pub name: Option<String>,
    pub description: Option<String>,
}

/// The parts of `report.json` the page shows.
#[derive(Clone, Debug, Deserialize)]
pub struct RunReport {
    pub pdsim_version: String,
    pub scenario: ScenarioInfo,
    pub seed: u64,
    pub requests_override: Option<u64>,
    pub summary: Summary,
    /// `vllm bench serve`'s fields (a `serde_json::Value` object, whose
    /// map is a `BTreeMap`: they come out sorted by name, not in file order).
    #[serde(default)]
    pub bench: Option<serde_json::Value>,
    #[serde(default)]
    pub overload: Option<Overload>,
    pub ranks: Vec<Rank>,
    pub links: Vec<Link>,
    pub events: u64,
    pub final_time_ns: u64,
    pub digest: String,
    #[serde(default)]
    pub interrupted: bool,
    #[serde(default)]
    pub violations: Vec<String>,
}

/// Reads `report.json` at `path`, named `name` in errors: one line with
/// the line and column, the field's path (`summary.ttft_ms.mean`) and what
/// is wrong.
pub fn run_report(path: &Path, name: &str) -> Result<RunReport, ReportError> {
    let text = crate::files::read_text(path, MAX_JSON_BYTES).map_err(|e| ReportError::new(format!("{name}: {e}")))?;
    let mut de = serde_json::Deserializer::from_str(&text);
    let place = |e: &serde_json::Error, field: String| {
        let at = if field.is_empty() || field == "." { String::new() } else { format!(" {field}:") };
        ReportError::new(format!("{name}:{}:{}:{at} {}", e.line(), e.column(), strip_position(&e.to_string())))
    };
    let report: RunReport =
        serde_path_to_error::deserialize(&mut de).map_err(|e| place(e.inner(), e.path().to_string()))?;
    de.end().map_err(|e| place(&e, String::new()))?;
    if report.final_time_ns > MAX_NS {
        // Past the times `ms_to_ns` reads: the grids' arithmetic would
        // overflow, and no run lasts 570 years.
        return Err(ReportError::new(format!(
            "{name}: final_time_ns: {} is past the largest run end pdsim reads ({MAX_NS} ns)",
            report.final_time_ns
        )));
    }
    Ok(report)
}

/// serde_json's message without its " at line L column C" (the caller
/// writes the place first).
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

/// A CSV file read line by line: each line split into fields (RFC 4180
/// quotes, no line breaks inside a field), with its line number for
/// errors.
pub struct CsvLines {
    name: String,
    reader: BufReader<std::io::Take<File>>,
    line: usize,
    buf: Vec<u8>,
    cells: String,
    ranges: Vec<(usize, usize)>,
}

/// One line's fields, borrowed from the reader.
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    cells: &'a str,
    ranges: &'a [(usize, usize)],
}

impl<'a> Row<'a> {
    /// Field `i` (empty past the last).
    pub fn get(&self, i: usize) -> &'a str {
        self.ranges.get(i).map_or("", |&(a, b)| &self.cells[a..b])
    }

    /// The number of fields.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Every field, owned.
    pub fn to_vec(self) -> Vec<String> {
        (0..self.len()).map(|i| self.get(i).to_owned()).collect()
    }
}

impl CsvLines {
    /// Opens the regular file `path`, named `name` in errors.
    pub fn open(path: &Path, name: &str) -> Result<Self, ReportError> {
        let (file, _) = crate::files::open_regular(path).map_err(|e| ReportError::new(format!("{name}: {e}")))?;
        Ok(CsvLines {
            name: name.to_owned(),
            reader: BufReader::with_capacity(1 << 16, file.take(u64::MAX)),
            line: 0,
            buf: Vec::new(),
            cells: String::new(),
            ranges: Vec::new(),
        })
    }

    /// An error at the current line.
    fn err(&self, what: impl std::fmt::Display) -> ReportError {
        ReportError::new(format!("{}:{}: {what}", self.name, self.line))
    }

    /// The next line's number and fields, or `None` at the end of the file
    /// (empty lines are skipped).
    pub fn next_numbered(&mut self) -> Result<Option<(usize, Row<'_>)>, ReportError> {
        loop {
            self.buf.clear();
            let n = (&mut self.reader)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| ReportError::new(format!("{}: {e}", self.name)))?;
            if n == 0 {
                return Ok(None);
            }
            self.line += 1;
            if self.buf.len() > MAX_LINE_BYTES {
                return Err(self.err(format_args!("a line over {MAX_LINE_BYTES} bytes")));
            }
            while matches!(self.buf.last(), Some(b'\n' | b'\r')) {
                self.buf.pop();
            }
            let text = match std::str::from_utf8(&self.buf) {
                Ok(t) => t,
                Err(e) => return Err(self.err(format_args!("not valid UTF-8 ({e})"))),
            };
            let text = if self.line == 1 { text.strip_prefix(crate::files::BOM).unwrap_or(text) } else { text };
            if text.is_empty() {
                continue;
            }
            if let Err(e) = split_fields(text, &mut self.cells, &mut self.ranges) {
                return Err(self.err(e));
            }
            return Ok(Some((self.line, Row { cells: &self.cells, ranges: &self.ranges })));
        }
    }

    /// The next line's fields (see [`CsvLines::next_numbered`]).
    pub fn next_row(&mut self) -> Result<Option<Row<'_>>, ReportError> {
        Ok(self.next_numbered()?.map(|(_, f)| f))
    }

    /// Reads the header line and the positions of `columns` in it.
    pub fn header(&mut self, columns: &[&str]) -> Result<Vec<usize>, ReportError> {
        let Some(header) = self.next_row()? else {
            return Err(ReportError::new(format!("{}: empty file (no header line)", self.name)));
        };
        let header = header.to_vec();
        columns
            .iter()
            .map(|c| {
                header
                    .iter()
                    .position(|h| h == c)
                    .ok_or_else(|| ReportError::new(format!("{}:1: no column {c} in the header", self.name)))
            })
            .collect()
    }
}

/// Splits one CSV line into fields: their text (quotes undone) goes into
/// `cells`, one after the other, and their places into `ranges`.
fn split_fields(line: &str, cells: &mut String, ranges: &mut Vec<(usize, usize)>) -> Result<(), String> {
    cells.clear();
    ranges.clear();
    if !line.contains('"') {
        cells.push_str(line);
        let mut start = 0;
        for (i, b) in line.bytes().enumerate() {
            if b == b',' {
                ranges.push((start, i));
                start = i + 1;
            }
        }
        ranges.push((start, line.len()));
        return Ok(());
    }
    let mut chars = line.chars().peekable();
    let (mut quoted, mut was_quoted, mut start) = (false, false, 0);
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cells.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cells.push(c),
            (false, '"') if cells.len() == start && !was_quoted => {
                quoted = true;
                was_quoted = true;
            }
            (false, ',') => {
                ranges.push((start, cells.len()));
                start = cells.len();
                was_quoted = false;
            }
            (false, c) => cells.push(c),
        }
    }
    if quoted {
        return Err("a quoted field is not closed".to_owned());
    }
    ranges.push((start, cells.len()));
    Ok(())
}

/// Milliseconds (as the CSV files write them) to whole nanoseconds.
fn ms_to_ns(s: &str) -> Option<u64> {
    let x: f64 = s.trim().parse().ok()?;
    if !(x.is_finite() && x >= 0.0) {
        return None;
    }
    let ns = (x * 1e6).round();
    (ns < MAX_NS as f64).then_some(ns as u64)
}

/// The time grids of the charts over simulated time: a fine one for the
/// shapes of step series (about a thousand buckets, one or two a pixel)
/// and a coarse one for rates and shares (about a hundred windows), both
/// of a round width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    /// The run's end, ns.
    pub end_ns: u64,
    /// The fine bucket's width, ns.
    pub fine_ns: u64,
    /// The window's width, ns.
    pub window_ns: u64,
}

/// The smallest 1, 2 or 5 times a power of ten (ns) at least `x`.
fn round_up_125(x: u64) -> u64 {
    let mut p = 1u64;
    loop {
        for m in [1u64, 2, 5] {
            let v = p.saturating_mul(m);
            if v >= x {
                return v.max(1);
            }
        }
        if p > u64::MAX / 10 {
            return u64::MAX;
        }
        p *= 10;
    }
}

impl Grid {
    /// The grids of a run that ended at `end_ns`.
    pub fn new(end_ns: u64) -> Grid {
        let end_ns = end_ns.max(1);
        Grid { end_ns, fine_ns: round_up_125(end_ns.div_ceil(1000)), window_ns: round_up_125(end_ns.div_ceil(100)) }
    }

    /// Fine buckets.
    pub fn fine_len(&self) -> usize {
        self.end_ns.div_ceil(self.fine_ns) as usize
    }

    /// Windows.
    pub fn windows(&self) -> usize {
        self.end_ns.div_ceil(self.window_ns) as usize
    }

    /// The window of time `t_ns` (the last one for the run's end).
    pub fn window_of(&self, t_ns: u64) -> usize {
        ((t_ns / self.window_ns) as usize).min(self.windows().saturating_sub(1))
    }
}

/// The stages of a request, in time order, with the column that ends each
/// (the first starts at `arrival_ms`).
pub const STAGES: &[(&str, &str)] = &[
    ("prefill queue", "prefill_started_ms"),
    ("prefill", "prefill_done_ms"),
    ("transfer wait", "transfer_started_ms"),
    ("transfer", "transfer_done_ms"),
    ("decode queue", "decode_started_ms"),
    ("first token", "first_token_ms"),
    ("decode", "finished_ms"),
];

/// One completed request, as the charts need it.
#[derive(Clone, Debug)]
pub struct Done {
    pub ttft_ms: f64,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
    pub arrival_ns: u64,
    /// Time in each of [`STAGES`], ms: each from the previous stage's end
    /// that the request reached (so they add up to its E2E).
    pub stages_ms: [f64; 7],
}

/// `requests.csv`, reduced.
#[derive(Clone, Debug, Default)]
pub struct Requests {
    /// Rows read.
    pub rows: u64,
    /// The completed requests, in file (id) order.
    pub done: Vec<Done>,
    /// Arrivals per window.
    pub arrivals: Vec<u64>,
    /// Completions per window (by end time).
    pub completions: Vec<u64>,
    /// Failures per window (by end time).
    pub failures: Vec<u64>,
}

/// Reads `requests.csv`.
pub fn requests(path: &Path, name: &str, grid: &Grid) -> Result<Requests, ReportError> {
    let mut csv = CsvLines::open(path, name)?;
    let mut cols: Vec<&str> = vec!["outcome", "arrival_ms", "ttft_ms", "tpot_ms", "e2e_ms"];
    cols.extend(STAGES.iter().map(|s| s.1));
    let idx = csv.header(&cols)?;
    let mut out = Requests {
        arrivals: vec![0; grid.windows()],
        completions: vec![0; grid.windows()],
        failures: vec![0; grid.windows()],
        ..Requests::default()
    };
    let widest = idx.iter().copied().max().unwrap_or(0);
    while let Some((line, row)) = csv.next_numbered()? {
        let err = |col: &str, what: String| ReportError::new(format!("{name}:{line}: column {col}: {what}"));
        let cell = |k: usize| row.get(idx[k]);
        let time = |k: usize| -> Result<Option<u64>, ReportError> {
            let s = cell(k);
            if s.is_empty() {
                return Ok(None);
            }
            ms_to_ns(s).map(Some).ok_or_else(|| err(cols[k], format!("expected milliseconds >= 0, got {s:?}")))
        };
        if row.len() <= widest {
            let n = row.len();
            return Err(ReportError::new(format!("{name}:{line}: {n} fields, fewer than the header's")));
        }
        out.rows += 1;
        let arrival = time(1)?.ok_or_else(|| err("arrival_ms", "empty".to_owned()))?;
        out.arrivals[grid.window_of(arrival)] += 1;
        let end = time(5 + STAGES.len() - 1)?;
        match cell(0) {
            "completed" => {
                let need = |k: usize| time(k)?.ok_or_else(|| err(cols[k], "empty for a completed request".to_owned()));
                let (ttft, e2e) = (need(2)?, need(4)?);
                let tpot = time(3)?;
                let mut stages_ms = [0.0; 7];
                let mut prev = arrival;
                for (s, slot) in stages_ms.iter_mut().enumerate() {
                    if let Some(t) = time(5 + s)? {
                        let t = t.max(prev);
                        *slot = (t - prev) as f64 / 1e6;
                        prev = t;
                    }
                }
                out.done.push(Done {
                    ttft_ms: ttft as f64 / 1e6,
                    tpot_ms: tpot.map(|t| t as f64 / 1e6),
                    e2e_ms: e2e as f64 / 1e6,
                    arrival_ns: arrival,
                    stages_ms,
                });
                if let Some(e) = end {
                    out.completions[grid.window_of(e)] += 1;
                }
            }
            "failed" => {
                if let Some(e) = end {
                    out.failures[grid.window_of(e)] += 1;
                }
            }
            "in_flight" => {}
            other => return Err(err("outcome", format!("expected completed, failed or in_flight, got {other:?}"))),
        }
    }
    Ok(out)
}

/// The most exact changes kept per series before it is drawn from its
/// buckets and windows instead (more steps than this are a blur at a
/// chart's width of about 500 pixels).
const EXACT_CAP: usize = 250;

/// One fine bucket of a step series: the value on entering it and the
/// lowest, highest and last value in it.
#[derive(Clone, Copy, Debug)]
pub struct Bucket {
    pub enter: u64,
    pub min: u64,
    pub max: u64,
    pub last: u64,
    /// Whether the series changed in this bucket.
    pub changed: bool,
}

/// One series of `timeline.csv` (an entity's metric), reduced.
#[derive(Clone, Debug)]
pub struct StepSeries {
    pub entity: String,
    pub metric: String,
    /// Every change (time ns, value) while there are at most
    /// [`EXACT_CAP`]; `None` past that.
    exact: Option<Vec<(u64, u64)>>,
    fine: Vec<Bucket>,
    /// ∫ value dt per window, value·ns.
    window_integral: Vec<f64>,
    last_t: u64,
    last_v: u64,
    started: bool,
    peak: u64,
}

impl StepSeries {
    fn new(entity: &str, metric: &str, grid: &Grid) -> Self {
        StepSeries {
            entity: entity.to_owned(),
            metric: metric.to_owned(),
            exact: Some(Vec::new()),
            fine: Vec::new(),
            window_integral: vec![0.0; grid.windows()],
            last_t: 0,
            last_v: 0,
            started: false,
            peak: 0,
        }
    }

    /// Adds `v` over `[a, b)` to the window integrals.
    fn integrate(&mut self, a: u64, b: u64, v: u64, grid: &Grid) {
        if v == 0 || b <= a {
            return;
        }
        let mut t = a;
        while t < b {
            let w = grid.window_of(t);
            // Saturating: the window after the last one can end past u64::MAX.
            let w_end = (w as u64 + 1).saturating_mul(grid.window_ns).max(t.saturating_add(1));
            let seg_end = if w + 1 == grid.windows() { b } else { w_end.min(b) };
            self.window_integral[w] += v as f64 * (seg_end - t) as f64;
            t = seg_end;
        }
    }

    fn change(&mut self, t: u64, v: u64, grid: &Grid) {
        if self.started {
            self.integrate(self.last_t, t, self.last_v, grid);
        }
        let fine_len = grid.fine_len();
        if self.fine.is_empty() {
            self.fine = vec![Bucket { enter: v, min: v, max: v, last: v, changed: false }; fine_len];
        }
        let b = ((t / grid.fine_ns) as usize).min(fine_len - 1);
        let bucket = &mut self.fine[b];
        if !bucket.changed {
            let prev = if self.started { self.last_v } else { v };
            *bucket = Bucket { enter: prev, min: prev.min(v), max: prev.max(v), last: v, changed: true };
        } else {
            bucket.min = bucket.min.min(v);
            bucket.max = bucket.max.max(v);
            bucket.last = v;
        }
        if let Some(exact) = &mut self.exact {
            if exact.len() >= EXACT_CAP {
                self.exact = None;
            } else {
                exact.push((t, v));
            }
        }
        self.peak = self.peak.max(v);
        self.last_t = t;
        self.last_v = v;
        self.started = true;
    }

    fn finish(&mut self, grid: &Grid) {
        if self.started {
            let end = grid.end_ns.max(self.last_t);
            self.integrate(self.last_t, end, self.last_v, grid);
            self.last_t = end;
        }
    }

    /// The largest value.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// The exact step function, (time s, value × `scale`), ending at the
    /// run's end, when it changed at most [`EXACT_CAP`] times.
    pub fn exact_steps(&self, grid: &Grid, scale: f64) -> Option<Vec<(f64, f64)>> {
        let exact = self.exact.as_ref()?;
        let mut pts: Vec<(f64, f64)> = exact.iter().map(|&(t, v)| (t as f64 / 1e9, v as f64 * scale)).collect();
        if let Some(&(_, v)) = exact.last() {
            pts.push((grid.end_ns.max(self.last_t) as f64 / 1e9, v as f64 * scale));
        }
        Some(pts)
    }

    /// The lowest and highest value in each fine bucket, (bucket middle s,
    /// low × `scale`, high × `scale`).
    pub fn band(&self, grid: &Grid, scale: f64) -> Vec<(f64, f64, f64)> {
        let Some(first) = self.fine.first() else { return Vec::new() };
        let mut cur = first.enter;
        let mut out = Vec::with_capacity(self.fine.len());
        for (i, b) in self.fine.iter().enumerate() {
            let t0 = (i as u64).saturating_mul(grid.fine_ns);
            let t1 = t0.saturating_add(grid.fine_ns).min(grid.end_ns.max(t0));
            let mid = (t0 as f64 + t1 as f64) / 2.0 / 1e9;
            let (lo, hi) = if b.changed { (b.min, b.max) } else { (cur, cur) };
            if b.changed {
                cur = b.last;
            }
            out.push((mid, lo as f64 * scale, hi as f64 * scale));
        }
        out
    }

    /// The time-weighted mean per window, (window middle s, mean × `scale`).
    pub fn window_means(&self, grid: &Grid, scale: f64) -> Vec<(f64, f64)> {
        let n = grid.windows();
        (0..n)
            .map(|w| {
                let t0 = (w as u64).saturating_mul(grid.window_ns);
                let t1 =
                    if w + 1 == n { grid.end_ns.max(t0.saturating_add(1)) } else { t0.saturating_add(grid.window_ns) };
                let mid = (t0 as f64 + t1 as f64) / 2.0 / 1e9;
                (mid, self.window_integral[w] / t1.saturating_sub(t0).max(1) as f64 * scale)
            })
            .collect()
    }
}

/// `timeline.csv`, reduced: every series, in the order they first appear.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub series: Vec<StepSeries>,
    /// Entities whose series were left out, in the order the file first
    /// names them: past [`MAX_SERIES`] series, an entity met with a new
    /// series is left out whole (rows of its series already kept too).
    pub left_out: Vec<String>,
}

impl Timeline {
    /// The series of `entity`'s `metric`.
    pub fn get(&self, entity: &str, metric: &str) -> Option<&StepSeries> {
        self.series.iter().find(|s| s.entity == entity && s.metric == metric)
    }
}

/// The most series of drawn entities the page keeps from `timeline.csv`:
/// each keeps about a thousand fine buckets (some 40 KB), so this bounds
/// the memory to a few hundred MB; a real run has a dozen or so per rank
/// and link. A deployment with more (hundreds of ranks, or per-pair links
/// between dozens of ranks) has the series of its first entities drawn
/// and the rest named as left out.
pub const MAX_SERIES: usize = 4096;

/// Reads `timeline.csv`, keeping the series of `entities` only (the ranks
/// and links of report.json, which the page draws), at most
/// [`MAX_SERIES`] of them, whole entities at a time; every row is still
/// checked.
pub fn timeline(path: &Path, name: &str, grid: &Grid, entities: &[&str]) -> Result<Timeline, ReportError> {
    let entities: std::collections::HashSet<&str> = entities.iter().copied().collect();
    let mut csv = CsvLines::open(path, name)?;
    let idx = csv.header(&["time_ms", "entity", "metric", "value"])?;
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out = Timeline::default();
    let mut key = String::new();
    let mut last_t = 0u64;
    let mut dropped: std::collections::HashSet<String> = std::collections::HashSet::new();
    while let Some((line, row)) = csv.next_numbered()? {
        let get = |k: usize| row.get(idx[k]);
        let (t, entity, metric, value) = (get(0), get(1), get(2), get(3));
        let t_ns = ms_to_ns(t);
        let v = value.trim().parse::<u64>();
        let line_err = |col: &str, what: String| ReportError::new(format!("{name}:{line}: column {col}: {what}"));
        let Some(t_ns) = t_ns else {
            return Err(line_err("time_ms", format!("expected milliseconds >= 0, got {t:?}")));
        };
        let Ok(v) = v else {
            return Err(line_err("value", format!("expected a whole number >= 0, got {value:?}")));
        };
        if entity.is_empty() || metric.is_empty() {
            return Err(line_err(if entity.is_empty() { "entity" } else { "metric" }, "empty".to_owned()));
        }
        if t_ns < last_t {
            return Err(line_err("time_ms", format!("{t} is before the row above it (rows are in time order)")));
        }
        last_t = t_ns;
        if !entities.contains(entity) || dropped.contains(entity) {
            continue;
        }
        key.clear();
        key.push_str(entity);
        key.push('\u{1f}');
        key.push_str(metric);
        let i = match index.get(key.as_str()) {
            Some(&i) => i,
            None => {
                if out.series.len() >= MAX_SERIES {
                    dropped.insert(entity.to_owned());
                    out.left_out.push(entity.to_owned());
                    continue;
                }
                out.series.push(StepSeries::new(entity, metric, grid));
                index.insert(key.clone(), out.series.len() - 1);
                out.series.len() - 1
            }
        };
        out.series[i].change(t_ns, v, grid);
    }
    out.series.retain(|s| !dropped.contains(&s.entity));
    for s in &mut out.series {
        s.finish(grid);
    }
    Ok(out)
}

/// `sweep.csv`: the axis columns (between `point` and `seed`), the metric
/// columns after `seed`, and the rows.
#[derive(Clone, Debug)]
pub struct SweepTable {
    pub axes: Vec<String>,
    pub metrics: Vec<String>,
    /// Per row: the point, its axis values (text), its seed (text), its
    /// metric cells (text).
    pub rows: Vec<SweepRow>,
}

/// One row of `sweep.csv`.
#[derive(Clone, Debug)]
pub struct SweepRow {
    pub point: u64,
    pub axes: Vec<String>,
    pub seed: String,
    pub metrics: Vec<String>,
}

/// Reads `sweep.csv`: its header must start with `point`, and have a
/// `seed` column after the axes.
pub fn sweep_table(path: &Path, name: &str) -> Result<SweepTable, ReportError> {
    let mut csv = CsvLines::open(path, name)?;
    let Some(header) = csv.next_row()? else {
        return Err(ReportError::new(format!("{name}: empty file (no header line)")));
    };
    let header = header.to_vec();
    if header.first().map(String::as_str) != Some("point") {
        return Err(ReportError::new(format!(
            "{name}:1: the first column is {:?}, expected point (a sweep.csv header)",
            header.first().map_or("", String::as_str)
        )));
    }
    let Some(seed) = header.iter().position(|h| h == "seed") else {
        return Err(ReportError::new(format!("{name}:1: no column seed in the header")));
    };
    let axes = header[1..seed].to_vec();
    let metrics = header[seed + 1..].to_vec();
    let mut rows = Vec::new();
    while let Some((line, row)) = csv.next_numbered()? {
        if row.len() != header.len() {
            let n = row.len();
            return Err(ReportError::new(format!("{name}:{line}: {n} fields, but the header has {}", header.len())));
        }
        let row = row.to_vec();
        let Ok(point) = row[0].trim().parse::<u64>() else {
            return Err(ReportError::new(format!(
                "{name}:{line}: column point: expected a whole number, got {:?}",
                row[0]
            )));
        };
        rows.push(SweepRow {
            point,
            axes: row[1..seed].to_vec(),
            seed: row[seed].clone(),
            metrics: row[seed + 1..].to_vec(),
        });
    }
    Ok(SweepTable { axes, metrics, rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_split_with_quotes() {
        let (mut cells, mut ranges) = (String::new(), Vec::new());
        let fields = |line: &str, cells: &mut String, ranges: &mut Vec<(usize, usize)>| {
            split_fields(line, cells, ranges).map(|()| Row { cells, ranges }.to_vec())
        };
        assert_eq!(fields(r#"1,"a, ""b""",,x"#, &mut cells, &mut ranges).unwrap(), vec!["1", "a, \"b\"", "", "x"]);
        assert_eq!(fields("1,,x,", &mut cells, &mut ranges).unwrap(), vec!["1", "", "x", ""]);
        assert!(split_fields(r#"1,"open"#, &mut cells, &mut ranges).is_err());
    }

    #[test]
    fn grids_are_round() {
        // A run of 103.46 s. Fine: 103_461_733_735 / 1000 rounds up to
        // 103_461_734 ns, and the next 1-2-5 step is 2e8 (0.2 s). Windows:
        // / 100 = 1_034_617_338 ns, up to 2e9 (2 s); 103.46 / 2 = 51.73, so
        // 52 windows, and the end falls in window 51 (the last).
        let g = Grid::new(103_461_733_735);
        assert_eq!(g.fine_ns, 200_000_000);
        assert_eq!(g.window_ns, 2_000_000_000);
        assert_eq!(g.windows(), 52);
        assert_eq!(g.window_of(g.end_ns), 51);
        assert_eq!(round_up_125(3), 5);
        assert_eq!(round_up_125(1), 1);
    }

    #[test]
    fn window_means_are_exact() {
        let g = Grid { end_ns: 10, fine_ns: 1, window_ns: 5 };
        let mut s = StepSeries::new("r", "busy", &g);
        s.change(0, 1, &g);
        s.change(2, 0, &g);
        s.change(6, 1, &g);
        s.finish(&g);
        // 1 on [0, 2), 0 on [2, 6), 1 on [6, 10). Window [0, 5): 2 ns of 1
        // in 5 = 0.4, middle 2.5 ns; window [5, 10): 4 ns of 1 in 5 = 0.8,
        // middle 7.5 ns.
        let m = s.window_means(&g, 1.0);
        assert_eq!(m, vec![(2.5e-9, 0.4), (7.5e-9, 0.8)]);
    }

    #[test]
    fn grids_near_the_largest_time_do_not_overflow() {
        // The window after the last ends past u64::MAX: these overflowed
        // (a panic in debug builds).
        let g = Grid::new(u64::MAX);
        let mut s = StepSeries::new("r", "busy", &g);
        s.change(0, 1, &g);
        s.change(u64::MAX - 5, 2, &g);
        s.finish(&g);
        assert_eq!(s.window_means(&g, 1.0).len(), g.windows());
        assert_eq!(s.band(&g, 1.0).len(), g.fine_len());
    }

    #[test]
    fn timelines_keep_the_drawn_entities_only_and_are_capped() {
        let dir = std::env::temp_dir().join(format!("pdsim-timeline-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("timeline.csv");
        let g = Grid::new(1_000_000);
        let mut text = String::from("time_ms,entity,metric,value\n");
        for i in 0..20 {
            text.push_str(&format!("0,e{i},m,1\n"));
        }
        std::fs::write(&path, &text).unwrap();
        let t = timeline(&path, "timeline.csv", &g, &["e3", "e7"]).unwrap();
        let names: Vec<&str> = t.series.iter().map(|s| s.entity.as_str()).collect();
        assert_eq!(names, ["e3", "e7"]);
        // More series than the page keeps: whole entities past the cap
        // are left out and named, not a memory blow-up nor a refusal.
        // Entity a has MAX_SERIES - 1 series, b two (one past the cap), c one.
        let mut text = String::from("time_ms,entity,metric,value\n");
        for i in 0..MAX_SERIES - 1 {
            text.push_str(&format!("0,a,m{i},1\n"));
        }
        text.push_str("0,b,m0,1\n0,b,m1,1\n0,c,m0,1\n1,b,m0,2\n");
        std::fs::write(&path, &text).unwrap();
        let t = timeline(&path, "timeline.csv", &g, &["a", "b", "c"]).unwrap();
        assert_eq!(t.series.len(), MAX_SERIES - 1);
        assert!(t.series.iter().all(|s| s.entity == "a"));
        assert_eq!(t.left_out, ["b", "c"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn milliseconds_parse_to_nanoseconds() {
        assert_eq!(ms_to_ns("12.550920"), Some(12_550_920));
        assert_eq!(ms_to_ns("0"), Some(0));
        assert_eq!(ms_to_ns("-1"), None);
        assert_eq!(ms_to_ns("x"), None);
    }
}
