//! Real request traces, streamed row by row.
//!
//! A [`TraceReader`] reads its file line by line through a `BufReader` and
//! makes one request per data row when asked, so memory stays bounded by the
//! one line it holds, whatever the trace's size. Three formats:
//!
//! - `mooncake` — JSON lines (Mooncake's FAST'25 traces):
//!   `{"timestamp": ms, "input_length": N, "output_length": M, "hash_ids": [..]}`;
//!   `hash_ids` are chained ids of 512-token prompt blocks and become the
//!   request's [`PrefixIds`] (block_tokens 512), so prefix caching sees the
//!   trace's real reuse. An optional integer `priority` (vLLM's request
//!   field, lower first; 0 when absent) is read by ranks that run vLLM's
//!   priority policy (`policy = "priority"`), in both JSON formats. Other
//!   keys are ignored.
//! - `timed_trace` — vLLM 0.33's `timed_trace` dataset (`vllm bench serve
//!   --dataset-name timed_trace`, `vllm/benchmarks/datasets/datasets.py`
//!   `TimedTrace`, lines 1417–1576, options at 1689–1733): the same JSON
//!   lines under field names and units the scenario chooses, with vLLM's
//!   defaults: `chunk_hash_size` 16 (tokens per `hash_ids` entry: 16 for
//!   the Qwen/Alibaba traces, 512 for Mooncake's),
//!   `sec_multiplier` 1 (timestamps × it are seconds: 0.001 for ms),
//!   `label_timestamp` `timestamp`, `label_input_length` `input_length`,
//!   `label_output_length` `output_length`, `label_hash_ids` `hash_ids`
//!   (vLLM's `--timed-trace-chunk-hash-size`, `--timed-trace-sec-multiplier`,
//!   `--timed-trace-label-*`). A `mooncake` trace takes the same options,
//!   with Mooncake's defaults (512, 0.001). One departure: vLLM builds a
//!   prompt of `chunk_hash_size` tokens per hash id and cuts it at
//!   `input_length`, so a row with too few ids (or none) sends a shorter
//!   (or empty) prompt; pdsim's prompt is always `input_length` tokens,
//!   its ids the prefix it shares.
//! - `azure` — Azure LLM inference CSV (2023):
//!   `TIMESTAMP,ContextTokens,GeneratedTokens` with wall-clock timestamps like
//!   `2023-11-16 18:17:03.9799600` (read exactly, to the nanosecond, as UTC).
//! - `burstgpt` — BurstGPT CSV:
//!   `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`,
//!   `Timestamp` in seconds. A row with 0 response tokens is a failed request
//!   in that dataset: it is skipped and counted (`skipped_failed`), never an
//!   error.
//!
//! CSV columns are found by header name (case-insensitive), so their order
//! may differ and extra columns are ignored; fields may be double-quoted.
//!
//! Arrivals: the first request arrives at 0 and each later one at
//! `(t − t_first) × time_scale` (so `time_scale = 2.0` replays twice as slow,
//! `0.5` twice as fast), computed in integer nanoseconds. Timestamps must not
//! decrease (an error even with `skip_malformed`: sort the trace). A closed
//! loop, or a workload that draws its own arrivals, ignores the timestamps.
//!
//! A malformed row (unparseable, a missing field, zero prompt tokens, zero
//! output tokens outside BurstGPT) is an error naming the file and line —
//! `traces/x.jsonl:17: malformed mooncake row: ...` — or, with
//! `skip_malformed = true`, skipped and counted.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

use actors::router::{MAX_ARRIVAL, MAX_REQUEST_TOKENS};
use actors::units::Tokens;
use actors::workload::{PrefixIds, RequestSource, RequestSpec, WorkloadError};
use serde::{Deserialize, Serialize};
use sim_core::SimTime;

use crate::check::{FieldError, at_least_one, positive};

/// The longest line of a trace file pdsim reads (a Mooncake row of a
/// 4M-token prompt is about 100 KB).
pub const MAX_LINE_BYTES: u64 = 4 << 20;

/// A UTF-8 byte-order mark, dropped from the start of a trace.
const BOM: &[u8] = b"\xef\xbb\xbf";

/// Tokens one Mooncake `hash_ids` entry covers.
pub const MOONCAKE_BLOCK_TOKENS: u64 = 512;

/// The `[workload.trace]` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceSpec {
    /// The file's format.
    pub format: TraceFormat,
    /// The file, relative to the scenario file that names it (the loader
    /// resolves it; a resolved scenario holds the joined path).
    pub path: PathBuf,
    /// Multiplies every gap between arrivals: 2.0 replays twice as slow.
    #[serde(default = "one")]
    pub time_scale: f64,
    /// Replay at most this many requests (skipped rows not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Skip and count malformed rows instead of stopping at the first.
    #[serde(default)]
    pub skip_malformed: bool,
    /// Tokens one `hash_ids` entry covers (`mooncake`, `timed_trace`;
    /// vLLM's `--timed-trace-chunk-hash-size`): default 512 for
    /// `mooncake`, 16 for `timed_trace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_hash_size: Option<u64>,
    /// Timestamps times this are seconds (vLLM's
    /// `--timed-trace-sec-multiplier`): default 0.001 for `mooncake`
    /// (ms), 1 for `timed_trace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sec_multiplier: Option<f64>,
    /// The field of the timestamp (default `timestamp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_timestamp: Option<String>,
    /// The field of the prompt's tokens (default `input_length`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_input_length: Option<String>,
    /// The field of the output's tokens (default `output_length`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_output_length: Option<String>,
    /// The field of the prompt's chained block ids (default `hash_ids`;
    /// a row without it shares no prefix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_hash_ids: Option<String>,
}

fn one() -> f64 {
    1.0
}

/// The trace formats pdsim reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    /// Mooncake JSON lines.
    Mooncake,
    /// vLLM's `timed_trace` JSON lines.
    #[serde(rename = "timed_trace")]
    TimedTrace,
    /// Azure LLM inference CSV.
    Azure,
    /// BurstGPT CSV.
    Burstgpt,
}

impl TraceFormat {
    /// The name scenario files use.
    pub const fn as_str(self) -> &'static str {
        match self {
            TraceFormat::Mooncake => "mooncake",
            TraceFormat::TimedTrace => "timed_trace",
            TraceFormat::Azure => "azure",
            TraceFormat::Burstgpt => "burstgpt",
        }
    }
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TraceSpec {
    /// Checks the fields (not the file); paths are relative to the table.
    pub fn check(&self) -> Result<(), FieldError> {
        if self.path.as_os_str().is_empty() {
            return Err(FieldError::new("path", "must not be empty"));
        }
        positive("time_scale", self.time_scale)?;
        if let Some(limit) = self.limit {
            at_least_one("limit", limit)?;
        }
        let json = matches!(self.format, TraceFormat::Mooncake | TraceFormat::TimedTrace);
        let set = [
            ("chunk_hash_size", self.chunk_hash_size.is_some()),
            ("sec_multiplier", self.sec_multiplier.is_some()),
            ("label_timestamp", self.label_timestamp.is_some()),
            ("label_input_length", self.label_input_length.is_some()),
            ("label_output_length", self.label_output_length.is_some()),
            ("label_hash_ids", self.label_hash_ids.is_some()),
        ];
        if let Some((field, _)) = set.iter().find(|(_, given)| *given && !json) {
            return Err(FieldError::new(
                *field,
                format!("only the mooncake and timed_trace formats take it, not {}", self.format),
            ));
        }
        if let Some(c) = self.chunk_hash_size {
            at_least_one("chunk_hash_size", c)?;
        }
        if let Some(m) = self.sec_multiplier {
            positive("sec_multiplier", m)?;
        }
        for (field, label) in [
            ("label_timestamp", &self.label_timestamp),
            ("label_input_length", &self.label_input_length),
            ("label_output_length", &self.label_output_length),
            ("label_hash_ids", &self.label_hash_ids),
        ] {
            if label.as_deref().is_some_and(str::is_empty) {
                return Err(FieldError::new(field, "must not be empty"));
            }
        }
        Ok(())
    }

    /// A trace of `format` at `path` with every other field at its default.
    pub fn new(format: TraceFormat, path: impl Into<PathBuf>) -> Self {
        TraceSpec {
            format,
            path: path.into(),
            time_scale: 1.0,
            limit: None,
            skip_malformed: false,
            chunk_hash_size: None,
            sec_multiplier: None,
            label_timestamp: None,
            label_input_length: None,
            label_output_length: None,
            label_hash_ids: None,
        }
    }

    /// Tokens one `hash_ids` entry covers: `chunk_hash_size`, or the
    /// format's default (512 for `mooncake`, 16 for `timed_trace`).
    pub fn chunk_tokens(&self) -> u64 {
        self.chunk_hash_size.unwrap_or(match self.format {
            TraceFormat::TimedTrace => TIMED_TRACE_CHUNK_TOKENS,
            _ => MOONCAKE_BLOCK_TOKENS,
        })
    }

    /// Seconds per timestamp unit: `sec_multiplier`, or the format's
    /// default (0.001 for `mooncake`, 1 for `timed_trace`).
    pub fn seconds_per_unit(&self) -> f64 {
        self.sec_multiplier.unwrap_or(match self.format {
            TraceFormat::TimedTrace => 1.0,
            _ => 0.001,
        })
    }

    /// The JSON fields (timestamp, input length, output length, hash ids).
    fn labels(&self) -> [String; 4] {
        let or = |l: &Option<String>, d: &str| l.clone().unwrap_or_else(|| d.to_owned());
        [
            or(&self.label_timestamp, "timestamp"),
            or(&self.label_input_length, "input_length"),
            or(&self.label_output_length, "output_length"),
            or(&self.label_hash_ids, "hash_ids"),
        ]
    }
}

/// Tokens one `hash_ids` entry covers in a `timed_trace` by default
/// (vLLM's `--timed-trace-chunk-hash-size` default).
pub const TIMED_TRACE_CHUNK_TOKENS: u64 = 16;

/// How a JSON-lines trace's rows are read: the field names and the units.
#[derive(Clone, Debug)]
struct JsonRows {
    /// The fields (timestamp, input length, output length, hash ids), or
    /// `None` for the default names (read by a derived parser, faster).
    labels: Option<[String; 4]>,
    /// Nanoseconds per timestamp unit, when a whole number (exact).
    unit_ns: Option<u64>,
    /// Nanoseconds per timestamp unit as a float (otherwise).
    unit_ns_f64: f64,
    /// How a timestamp's unit is named in messages: `ms`, `s`, or
    /// `× 0.25 s`.
    unit_name: String,
}

impl JsonRows {
    fn of(spec: &TraceSpec) -> Self {
        let labels = spec.labels();
        let default = labels == ["timestamp", "input_length", "output_length", "hash_ids"];
        let per = spec.seconds_per_unit() * 1e9;
        let whole = per.round();
        let unit_ns = ((per - whole).abs() <= 1e-6 * whole.max(1.0) && whole >= 1.0 && whole < u64::MAX as f64)
            .then_some(whole as u64);
        let unit_name = match unit_ns {
            Some(1_000_000) => "ms".to_owned(),
            Some(1_000_000_000) => "s".to_owned(),
            _ => format!("× {} s", short_float(spec.seconds_per_unit())),
        };
        JsonRows { labels: (!default).then_some(labels), unit_ns, unit_ns_f64: per, unit_name }
    }

    fn time_ns(&self, n: &serde_json::Number) -> Option<u64> {
        match self.unit_ns {
            Some(u) => number_ns(n, u),
            None => {
                let ns = (n.as_f64()? * self.unit_ns_f64).round();
                (ns.is_finite() && ns >= 0.0 && ns < u64::MAX as f64).then_some(ns as u64)
            }
        }
    }
}

/// What a [`TraceReader`] has read so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TraceStats {
    /// Data rows read (blank lines and the CSV header not counted).
    pub rows_read: u64,
    /// Requests made.
    pub requests: u64,
    /// Malformed rows skipped (`skip_malformed = true`).
    pub skipped_malformed: u64,
    /// Failed-request rows skipped (BurstGPT, 0 response tokens).
    pub skipped_failed: u64,
    /// The first skipped malformed row's error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_malformed: Option<String>,
}

/// Column positions of a CSV trace.
#[derive(Clone, Copy, Debug)]
struct Columns {
    time: usize,
    prompt: usize,
    output: usize,
    /// Fields a row needs: 1 + the largest index used.
    needed: usize,
}

/// One data row, parsed.
enum Row {
    Request { time_ns: u64, time_text: String, prompt: u64, output: u64, ids: Vec<u64>, priority: i32 },
    Failed,
}

/// A streaming reader of one trace file; an
/// [`actors::workload::RequestSource`].
#[derive(Debug)]
pub struct TraceReader {
    path: String,
    format: TraceFormat,
    reader: BufReader<File>,
    buf: Vec<u8>,
    line: u64,
    columns: Option<Columns>,
    use_timestamps: bool,
    time_scale: f64,
    skip_malformed: bool,
    /// How JSON-lines rows are read (`mooncake`, `timed_trace`).
    json: JsonRows,
    /// Tokens per `hash_ids` entry.
    chunk: u64,
    limit: Option<u64>,
    first_ns: Option<u64>,
    prev: Option<(u64, String)>,
    stats: TraceStats,
}

impl TraceReader {
    /// Opens `spec.path` and, for a CSV format, reads and checks its header.
    /// With `use_timestamps = false` every arrival is 0 and timestamps need
    /// not be ordered (a closed loop, or arrivals drawn elsewhere); they must
    /// still parse.
    ///
    /// # Errors
    /// The file cannot be opened, is empty (CSV), or its header lacks a
    /// column; the text names the file (and line).
    pub fn open(spec: &TraceSpec, use_timestamps: bool) -> Result<TraceReader, WorkloadError> {
        let path = spec.path.display().to_string();
        let (file, _) =
            crate::files::open_regular(&spec.path).map_err(|e| WorkloadError(format!("cannot open {path}: {e}")))?;
        let mut reader = TraceReader {
            path,
            format: spec.format,
            reader: BufReader::new(file),
            buf: Vec::new(),
            line: 0,
            columns: None,
            use_timestamps,
            time_scale: spec.time_scale,
            skip_malformed: spec.skip_malformed,
            json: JsonRows::of(spec),
            chunk: spec.chunk_tokens(),
            limit: spec.limit,
            first_ns: None,
            prev: None,
            stats: TraceStats::default(),
        };
        let wanted: Option<[&str; 3]> = match spec.format {
            TraceFormat::Mooncake | TraceFormat::TimedTrace => None,
            TraceFormat::Azure => Some(["TIMESTAMP", "ContextTokens", "GeneratedTokens"]),
            TraceFormat::Burstgpt => Some(["Timestamp", "Request tokens", "Response tokens"]),
        };
        if let Some(wanted) = wanted {
            reader.columns = Some(reader.read_header(wanted)?);
        }
        Ok(reader)
    }

    /// What has been read so far.
    pub fn stats(&self) -> &TraceStats {
        &self.stats
    }

    /// Reads every remaining row and returns the final stats: what
    /// `pdsim validate` does to check a whole trace in bounded memory.
    ///
    /// # Errors
    /// The first malformed row (unless skipped) or decreasing timestamp.
    pub fn scan(mut self) -> Result<TraceStats, WorkloadError> {
        while self.next_request()?.is_some() {}
        Ok(self.stats)
    }

    /// The next non-blank line, without its line ending; `None` at the end.
    fn next_line(&mut self) -> Result<Option<Result<String, String>>, WorkloadError> {
        loop {
            self.buf.clear();
            // One byte past the cap: a line that long is refused, whatever
            // the file (one without line breaks would fill the memory).
            let n = (&mut self.reader)
                .take(MAX_LINE_BYTES + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| WorkloadError(format!("{}:{}: cannot read: {e}", self.path, self.line + 1)))?;
            if n == 0 {
                return Ok(None);
            }
            self.line += 1;
            if n as u64 > MAX_LINE_BYTES {
                return Err(WorkloadError(format!(
                    "{}:{}: line longer than {MAX_LINE_BYTES} bytes; is this a {} trace?",
                    self.path, self.line, self.format
                )));
            }
            let bytes = if self.line == 1 { self.buf.strip_prefix(BOM).unwrap_or(&self.buf) } else { &self.buf };
            let text = match std::str::from_utf8(bytes) {
                Ok(t) => t,
                Err(e) => return Ok(Some(Err(format!("not valid UTF-8 ({e})")))),
            };
            let text = text.trim_end_matches(['\n', '\r']);
            if !text.trim().is_empty() {
                return Ok(Some(Ok(text.to_owned())));
            }
        }
    }

    fn read_header(&mut self, wanted: [&str; 3]) -> Result<Columns, WorkloadError> {
        let header = match self.next_line()? {
            None => {
                return Err(WorkloadError(format!(
                    "{}: empty file, expected a {} header line ({})",
                    self.path,
                    self.format,
                    wanted.join(",")
                )));
            }
            Some(Err(problem)) => return Err(WorkloadError(format!("{}:{}: header: {problem}", self.path, self.line))),
            Some(Ok(h)) => h,
        };
        let names = split_csv(&header)
            .map_err(|(i, p)| WorkloadError(format!("{}:{}: header: column {}: {p}", self.path, self.line, i + 1)))?;
        let find = |want: &str| names.iter().position(|n| n.trim().eq_ignore_ascii_case(want));
        let mut idx = [0usize; 3];
        for (slot, want) in idx.iter_mut().zip(wanted) {
            *slot = find(want).ok_or_else(|| {
                WorkloadError(format!(
                    "{}:{}: {} header lacks column `{want}` (found: {})",
                    self.path,
                    self.line,
                    self.format,
                    names.join(",")
                ))
            })?;
        }
        Ok(Columns { time: idx[0], prompt: idx[1], output: idx[2], needed: idx.iter().max().map_or(0, |m| m + 1) })
    }

    fn parse_row(&self, text: &str) -> Result<Row, String> {
        match (self.format, self.columns) {
            (TraceFormat::Mooncake | TraceFormat::TimedTrace, _) => parse_json_row(text, &self.json),
            (format, Some(cols)) => parse_csv_row(format, cols, text),
            (format, None) => Err(format!("{format} trace read without its header")),
        }
    }

    fn arrival(&mut self, time_ns: u64, time_text: String) -> Result<SimTime, WorkloadError> {
        if !self.use_timestamps {
            return Ok(SimTime::ZERO);
        }
        if let Some((prev, prev_text)) = &self.prev
            && time_ns < *prev
        {
            return Err(WorkloadError(format!(
                "{}:{}: timestamp {time_text} is earlier than the previous row's {prev_text}; \
                 trace arrivals must not decrease (sort the trace by time)",
                self.path, self.line
            )));
        }
        let first = *self.first_ns.get_or_insert(time_ns);
        self.prev = Some((time_ns, time_text));
        let offset = time_ns - first;
        let scaled = if self.time_scale == 1.0 {
            offset
        } else {
            let x = (offset as f64 * self.time_scale).round();
            if x >= u64::MAX as f64 { u64::MAX } else { x as u64 }
        };
        if scaled > MAX_ARRIVAL.as_nanos() {
            let text = self.prev.as_ref().map_or("", |(_, t)| t.as_str());
            return Err(WorkloadError(format!(
                "{}:{}: timestamp {text}: {} s after the first row, times time_scale {} is past the end of \
                 simulated time (arrivals must come within {:.0} s, about 146 years, of the first)",
                self.path,
                self.line,
                offset as f64 / 1e9,
                short_float(self.time_scale),
                MAX_ARRIVAL.as_secs_f64()
            )));
        }
        Ok(SimTime::from_nanos(scaled))
    }
}

impl RequestSource for TraceReader {
    fn next_request(&mut self) -> Result<Option<RequestSpec>, WorkloadError> {
        loop {
            if self.limit.is_some_and(|l| self.stats.requests >= l) {
                return Ok(None);
            }
            let parsed = match self.next_line()? {
                None => return Ok(None),
                Some(Ok(text)) => {
                    self.stats.rows_read += 1;
                    self.parse_row(&text)
                }
                Some(Err(problem)) => {
                    self.stats.rows_read += 1;
                    Err(problem)
                }
            };
            match parsed {
                Ok(Row::Request { time_ns, time_text, prompt, output, ids, priority }) => {
                    let arrival = self.arrival(time_ns, time_text)?;
                    self.stats.requests += 1;
                    let prefix = if ids.is_empty() {
                        PrefixIds::none()
                    } else {
                        PrefixIds { block_tokens: Tokens::new(self.chunk), ids }
                    };
                    return Ok(Some(RequestSpec {
                        arrival,
                        prompt: Tokens::new(prompt),
                        output: Tokens::new(output),
                        prefix,
                        priority,
                    }));
                }
                Ok(Row::Failed) => self.stats.skipped_failed += 1,
                Err(problem) => {
                    let msg = format!("{}:{}: malformed {} row: {problem}", self.path, self.line, self.format);
                    if !self.skip_malformed {
                        return Err(WorkloadError(msg));
                    }
                    self.stats.skipped_malformed += 1;
                    self.stats.first_malformed.get_or_insert(msg);
                }
            }
        }
    }
}

#[derive(Deserialize)]
struct MooncakeRow {
    timestamp: serde_json::Number,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
    /// (`null` is absent, as in the labelled path.)
    #[serde(default)]
    priority: Option<i32>,
}

fn parse_json_row(text: &str, how: &JsonRows) -> Result<Row, String> {
    let row = match &how.labels {
        None => parse_mooncake(text)?,
        Some(labels) => parse_labelled(text, labels)?,
    };
    let [time_label, input_label, output_label] = match &how.labels {
        None => ["timestamp", "input_length", "output_length"],
        Some(l) => [l[0].as_str(), l[1].as_str(), l[2].as_str()],
    };
    let unit = &how.unit_name;
    let time_ns = how.time_ns(&row.timestamp).ok_or_else(|| {
        if row.timestamp.as_f64().is_some_and(|t| t >= 0.0) {
            format!("{time_label}: {} {unit} is 2^64 ns or more", row.timestamp)
        } else {
            format!("{time_label}: must be a non-negative number ({unit}), got {}", row.timestamp)
        }
    })?;
    if row.input_length == 0 {
        return Err(format!("{input_label}: must be >= 1, got 0"));
    }
    if row.output_length == 0 {
        return Err(format!("{output_label}: must be >= 1, got 0"));
    }
    token_cap(input_label, output_label, row.input_length, row.output_length)?;
    Ok(Row::Request {
        time_ns,
        time_text: format!("{} {unit}", row.timestamp),
        prompt: row.input_length,
        output: row.output_length,
        ids: row.hash_ids,
        priority: row.priority.unwrap_or(0),
    })
}

/// A row under the default field names, by the derived parser.
fn parse_mooncake(text: &str) -> Result<MooncakeRow, String> {
    serde_json::from_str(text).map_err(|e| {
        let msg = e.to_string();
        let msg = msg.rfind(" at line ").map_or(msg.as_str(), |i| &msg[..i]).to_owned();
        // The field the error is in, when it is in one (`timestamp: expected
        // value`): parsed again, only now, with the path tracked.
        let mut de = serde_json::Deserializer::from_str(text);
        let path = match serde_path_to_error::deserialize::<_, MooncakeRow>(&mut de) {
            Err(e) => e.path().to_string(),
            Ok(_) => String::new(),
        };
        let field = if matches!(path.as_str(), "" | "." | "?") { String::new() } else { format!("{path}: ") };
        format!("{field}{msg} (column {})", e.column())
    })
}

/// A row under the fields `labels` (timestamp, input length, output
/// length, hash ids) names; other fields are ignored.
fn parse_labelled(text: &str, labels: &[String; 4]) -> Result<MooncakeRow, String> {
    let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text).map_err(|e| format!("{e}"))?;
    let missing = |l: &str| format!("{l}: missing (the row has {})", map_keys(text));
    let number = |map: &mut serde_json::Map<String, serde_json::Value>, l: &str| match map.remove(l) {
        Some(serde_json::Value::Number(n)) => Ok(n),
        Some(other) => Err(format!("{l}: expected a number, got {other}")),
        None => Err(missing(l)),
    };
    let count = |map: &mut serde_json::Map<String, serde_json::Value>, l: &str| -> Result<u64, String> {
        let n = number(map, l)?;
        n.as_u64().ok_or_else(|| format!("{l}: expected a whole number of tokens, got {n}"))
    };
    let timestamp = number(&mut map, &labels[0])?;
    let input_length = count(&mut map, &labels[1])?;
    let output_length = count(&mut map, &labels[2])?;
    let hash_ids = match map.remove(&labels[3]) {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_u64().ok_or_else(|| format!("{}[{i}]: expected a block id (u64), got {v}", labels[3])))
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(format!("{}: expected a list of block ids, got {other}", labels[3])),
    };
    let priority = match map.remove("priority") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(v.as_i64().and_then(|p| i32::try_from(p).ok()).ok_or_else(|| {
            format!("priority: expected a whole number (a 32-bit integer, vLLM's request priority), got {v}")
        })?),
    };
    Ok(MooncakeRow { timestamp, input_length, output_length, hash_ids, priority })
}

/// The keys of a JSON object row, for a message.
fn map_keys(text: &str) -> String {
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text) {
        Ok(m) => m.keys().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "),
        Err(_) => "no fields".to_owned(),
    }
}

/// `x` as a scenario file would spell it briefly: `2.5`, `1e308`.
fn short_float(x: f64) -> String {
    if x != 0.0 && !(1e-4..1e9).contains(&x.abs()) { format!("{x:e}") } else { format!("{x}") }
}

/// A request holds at most [`MAX_REQUEST_TOKENS`] prompt and output tokens
/// together: the field named is the prompt's when it alone leaves no room
/// for an output token, else the output's.
fn token_cap(prompt_name: &str, output_name: &str, prompt: u64, output: u64) -> Result<(), String> {
    if prompt.saturating_add(output) <= MAX_REQUEST_TOKENS {
        return Ok(());
    }
    let field = if prompt >= MAX_REQUEST_TOKENS { prompt_name } else { output_name };
    Err(format!(
        "{field}: {prompt} prompt and {output} output tokens are more than a request may hold \
         ({MAX_REQUEST_TOKENS} together)"
    ))
}

/// A JSON number of `unit_ns`-nanosecond units as whole nanoseconds:
/// integers exactly, fractions rounded; `None` if negative or too large.
fn number_ns(n: &serde_json::Number, unit_ns: u64) -> Option<u64> {
    if let Some(u) = n.as_u64() {
        return u.checked_mul(unit_ns);
    }
    float_ns(n.as_f64()?, unit_ns)
}

fn float_ns(x: f64, unit_ns: u64) -> Option<u64> {
    let ns = (x * unit_ns as f64).round();
    if ns.is_finite() && ns >= 0.0 && ns < u64::MAX as f64 { Some(ns as u64) } else { None }
}

/// A non-negative decimal (`12`, `12.345`) of `unit_ns`-nanosecond units as
/// whole nanoseconds, exactly when the digits allow (`5.000000001` s is
/// 5,000,000,001 ns); other float forms (`1e3`) through `f64`.
fn decimal_ns(s: &str, unit_ns: u64) -> Option<u64> {
    let s = s.trim();
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if !int.is_empty() && digits(int) && digits(frac) {
        let whole = int.parse::<u64>().ok()?.checked_mul(unit_ns)?;
        // Fractional digits beyond the nanosecond are truncated.
        let mut part = 0u64;
        let mut scale = unit_ns;
        for b in frac.bytes() {
            if scale < 10 {
                break;
            }
            scale /= 10;
            part += u64::from(b - b'0') * scale;
        }
        return whole.checked_add(part);
    }
    float_ns(s.parse::<f64>().ok()?, unit_ns)
}

fn parse_csv_row(format: TraceFormat, cols: Columns, text: &str) -> Result<Row, String> {
    let (time_name, prompt_name, output_name) = match format {
        TraceFormat::Azure => ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
        _ => ("Timestamp", "Request tokens", "Response tokens"),
    };
    let named = [(cols.time, time_name), (cols.prompt, prompt_name), (cols.output, output_name)];
    let fields = split_csv(text).map_err(|(i, problem)| match named.iter().find(|(c, _)| *c == i) {
        Some((_, name)) => format!("{name}: {problem}"),
        None => format!("column {}: {problem}", i + 1),
    })?;
    if fields.len() < cols.needed {
        // The first column (in the file's order) the row does not reach.
        let missing =
            named.into_iter().filter(|(i, _)| *i >= fields.len()).min_by_key(|(i, _)| *i).map_or("", |(_, name)| name);
        return Err(format!("{missing}: missing (expected at least {} fields, got {})", cols.needed, fields.len()));
    }
    let time_text = fields[cols.time].trim();
    let time_ns = match format {
        TraceFormat::Azure => parse_wall_clock_ns(time_text),
        _ => decimal_ns(time_text, 1_000_000_000),
    }
    .ok_or_else(|| format!("{time_name}: invalid timestamp `{time_text}`"))?;
    let int = |name: &str, i: usize| {
        let f = fields[i].trim();
        f.parse::<u64>().map_err(|_| format!("{name}: invalid token count `{f}`"))
    };
    let prompt = int(prompt_name, cols.prompt)?;
    let output = int(output_name, cols.output)?;
    if prompt == 0 {
        return Err(format!("{prompt_name}: must be >= 1, got 0"));
    }
    if output == 0 {
        if format == TraceFormat::Burstgpt {
            return Ok(Row::Failed);
        }
        return Err(format!("{output_name}: must be >= 1, got 0"));
    }
    token_cap(prompt_name, output_name, prompt, output)?;
    Ok(Row::Request { time_ns, time_text: time_text.to_owned(), prompt, output, ids: Vec::new(), priority: 0 })
}

/// Splits one CSV line: fields separated by commas, a field in double
/// quotes may hold commas and `""` for a quote. An error gives the index
/// of the field it is in.
fn split_csv(line: &str) -> Result<Vec<String>, (usize, String)> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    None => return Err((fields.len(), "unterminated quoted field".into())),
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                }
            }
            match chars.next() {
                None => {
                    fields.push(field);
                    return Ok(fields);
                }
                Some(',') => fields.push(field),
                Some(c) => return Err((fields.len(), format!("unexpected `{c}` after a quoted field"))),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        fields.push(field);
                        return Ok(fields);
                    }
                    Some(',') => break,
                    Some(c) => field.push(c),
                }
            }
            fields.push(field);
        }
    }
}

/// `YYYY-MM-DD HH:MM:SS[.fffffffff]` (or with `T`), read as UTC, in
/// nanoseconds since 1970-01-01; `None` if malformed or before 1970.
///
/// 1970-01-02 00:00:01.5 → 86,401,500,000,000 ns.
pub fn parse_wall_clock_ns(s: &str) -> Option<u64> {
    let s = s.trim();
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.splitn(3, '-');
    let year: i64 = parse_digits(d.next()?, 4)?;
    let month: i64 = parse_digits(d.next()?, 2)?;
    let day: i64 = parse_digits(d.next()?, 2)?;
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':');
    let h: i64 = parse_digits(t.next()?, 2)?;
    let m: i64 = parse_digits(t.next()?, 2)?;
    let sec: i64 = parse_digits(t.next()?, 2)?;
    if h > 23 || m > 59 || sec > 60 || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days.checked_mul(86_400)? + h * 3_600 + m * 60 + sec;
    let secs = u64::try_from(secs).ok()?;
    let frac_ns = if frac.is_empty() { 0 } else { frac.parse::<u64>().ok()? * 10u64.pow(9 - frac.len() as u32) };
    secs.checked_mul(1_000_000_000)?.checked_add(frac_ns)
}

/// Exactly `len` ASCII digits as a number.
fn parse_digits(s: &str, len: usize) -> Option<i64> {
    if s.len() == len && s.bytes().all(|b| b.is_ascii_digit()) { s.parse().ok() } else { None }
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the civil date (proleptic Gregorian; Howard
/// Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_clock() {
        assert_eq!(parse_wall_clock_ns("1970-01-01 00:00:00"), Some(0));
        assert_eq!(parse_wall_clock_ns("1970-01-02 00:00:01.5"), Some(86_401_500_000_000));
        // 2023-11-16 is day 19,677 since 1970 (53 years incl. 13 leap days
        // = 19,358 days to 2023-01-01, + 319 days to Nov 16).
        assert_eq!(
            parse_wall_clock_ns("2023-11-16 18:17:03.9799600"),
            Some((19_677 * 86_400 + 18 * 3_600 + 17 * 60 + 3) * 1_000_000_000 + 979_960_000)
        );
        assert_eq!(parse_wall_clock_ns("2024-02-29T00:00:00"), Some(19_782 * 86_400 * 1_000_000_000));
        for bad in ["2023-02-29 00:00:00", "2023-11-16", "2023-13-01 00:00:00", "23-11-16 00:00:00", "x", ""] {
            assert_eq!(parse_wall_clock_ns(bad), None, "{bad}");
        }
    }

    #[test]
    fn decimals_are_exact() {
        assert_eq!(decimal_ns("5", 1_000_000_000), Some(5_000_000_000));
        assert_eq!(decimal_ns("5.000000001", 1_000_000_000), Some(5_000_000_001));
        assert_eq!(decimal_ns("0.25", 1_000_000), Some(250_000));
        assert_eq!(decimal_ns("1e3", 1_000_000), Some(1_000_000_000));
        assert_eq!(decimal_ns("-1", 1_000_000), None);
        assert_eq!(decimal_ns("abc", 1_000_000), None);
    }

    #[test]
    fn csv_split() {
        assert_eq!(split_csv("a,b,,c").unwrap(), ["a", "b", "", "c"]);
        assert_eq!(split_csv(r#""x, y",2,"say ""hi""""#).unwrap(), ["x, y", "2", r#"say "hi""#]);
        assert_eq!(split_csv(r#"1,"open,1"#).unwrap_err().0, 1);
        assert_eq!(split_csv(r#""a"b,1"#).unwrap_err().0, 0);
    }

    /// vLLM's timed_trace options: other field names, seconds (or any
    /// unit), 16-token hash chunks; the errors name the scenario's labels.
    #[test]
    fn timed_trace_rows_follow_their_labels_and_units() {
        let mut spec = TraceSpec::new(TraceFormat::TimedTrace, "t.jsonl");
        assert_eq!((spec.chunk_tokens(), spec.seconds_per_unit()), (16, 1.0));
        spec.label_timestamp = Some("ts".into());
        spec.label_input_length = Some("in".into());
        spec.label_output_length = Some("out".into());
        spec.label_hash_ids = Some("hashes".into());
        let how = JsonRows::of(&spec);
        let row = |t: &str| match parse_json_row(t, &how) {
            Ok(Row::Request { time_ns, prompt, output, ids, .. }) => Ok((time_ns, prompt, output, ids)),
            Ok(Row::Failed) => Err("failed".to_owned()),
            Err(e) => Err(e),
        };
        // 1.25 s, exactly; other fields ignored, hash ids optional.
        assert_eq!(
            row(r#"{"ts": 1.25, "in": 40, "out": 3, "hashes": [7, 8, 9], "x": 1}"#),
            Ok((1_250_000_000, 40, 3, vec![7, 8, 9]))
        );
        assert_eq!(row(r#"{"ts": 2, "in": 1, "out": 1}"#), Ok((2_000_000_000, 1, 1, vec![])));
        assert!(row(r#"{"timestamp": 2, "in": 1, "out": 1}"#).unwrap_err().starts_with("ts: missing"));
        assert!(row(r#"{"ts": 2, "in": 0, "out": 1}"#).unwrap_err().starts_with("in: must be >= 1"));
        assert!(row(r#"{"ts": 2, "in": 1.5, "out": 1}"#).unwrap_err().starts_with("in: expected a whole number"));
        assert!(row(r#"{"ts": 2, "in": 1, "out": 1, "hashes": [1, -2]}"#).unwrap_err().starts_with("hashes[1]: "));
        assert!(row(r#"{"ts": -1, "in": 1, "out": 1}"#).unwrap_err().contains("non-negative"));
        // A unit of 0.25 s (not whole nanoseconds per unit: float, rounded).
        spec.sec_multiplier = Some(0.25);
        let how = JsonRows::of(&spec);
        match parse_json_row(r#"{"ts": 3, "in": 1, "out": 1}"#, &how) {
            Ok(Row::Request { time_ns, time_text, .. }) => {
                assert_eq!(time_ns, 750_000_000);
                assert_eq!(time_text, "3 × 0.25 s");
            }
            _ => panic!("a row"),
        }
        // Mooncake's defaults: ms and 512-token chunks.
        let m = TraceSpec::new(TraceFormat::Mooncake, "t.jsonl");
        assert_eq!((m.chunk_tokens(), m.seconds_per_unit()), (512, 0.001));
        assert_eq!(JsonRows::of(&m).unit_ns, Some(1_000_000));
        assert!(JsonRows::of(&m).labels.is_none(), "the default names take the derived parser");
        // The options belong to the JSON formats only.
        let mut azure = TraceSpec::new(TraceFormat::Azure, "a.csv");
        azure.chunk_hash_size = Some(512);
        let e = azure.check().unwrap_err();
        assert_eq!(e.field, "chunk_hash_size", "{e:?}");
        let mut zero = TraceSpec::new(TraceFormat::TimedTrace, "t.jsonl");
        zero.chunk_hash_size = Some(0);
        assert_eq!(zero.check().unwrap_err().field, "chunk_hash_size");
        zero.chunk_hash_size = None;
        zero.sec_multiplier = Some(0.0);
        assert_eq!(zero.check().unwrap_err().field, "sec_multiplier");
        zero.sec_multiplier = None;
        zero.label_hash_ids = Some(String::new());
        assert_eq!(zero.check().unwrap_err().field, "label_hash_ids");
    }

    /// vLLM's request `priority`, optional in both JSON formats: an
    /// integer of 32 bits, 0 when absent or null.
    #[test]
    fn json_rows_carry_an_optional_priority() {
        for spec in [TraceSpec::new(TraceFormat::Mooncake, "t.jsonl"), {
            let mut t = TraceSpec::new(TraceFormat::TimedTrace, "t.jsonl");
            t.label_timestamp = Some("ts".into());
            t
        }] {
            let how = JsonRows::of(&spec);
            let time = if how.labels.is_some() { "ts" } else { "timestamp" };
            let row = |extra: &str| {
                let t = format!(r#"{{"{time}": 1, "input_length": 4, "output_length": 2{extra}}}"#);
                match parse_json_row(&t, &how) {
                    Ok(Row::Request { priority, .. }) => Ok(priority),
                    Ok(Row::Failed) => Err("failed".to_owned()),
                    Err(e) => Err(e),
                }
            };
            assert_eq!(row(""), Ok(0));
            assert_eq!(row(r#", "priority": null"#), Ok(0));
            assert_eq!(row(r#", "priority": -3"#), Ok(-3));
            assert_eq!(row(r#", "priority": 7"#), Ok(7));
            assert!(row(r#", "priority": 1.5"#).unwrap_err().starts_with("priority: "));
            assert!(row(r#", "priority": 4294967296"#).unwrap_err().starts_with("priority: "));
        }
    }

    /// A malformed row's error names the field it is in.
    #[test]
    fn row_errors_name_their_field() {
        let how = JsonRows::of(&TraceSpec::new(TraceFormat::Mooncake, "t.jsonl"));
        let mooncake = |t: &str| parse_json_row(t, &how).err().unwrap();
        assert!(mooncake(r#"{"timestamp": NaN, "input_length": 1, "output_length": 1}"#).starts_with("timestamp: "));
        assert!(mooncake(r#"{"timestamp": 1, "input_length": -3, "output_length": 1}"#).starts_with("input_length: "));
        assert!(
            mooncake(r#"{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1, "x"]}"#)
                .starts_with("hash_ids[1]: ")
        );
        // Not in a field: no name.
        assert!(mooncake(r#"{"timestamp": 1"#).starts_with("EOF while parsing"));
        assert!(mooncake(r#"{"timestamp": -1, "input_length": 1, "output_length": 1}"#).contains("non-negative"));
        assert!(mooncake(r#"{"timestamp": 1e30, "input_length": 1, "output_length": 1}"#).contains("is 2^64 ns"));
        // Azure: TIMESTAMP, ContextTokens, GeneratedTokens in columns 3, 1, 2.
        let cols = Columns { time: 2, prompt: 0, output: 1, needed: 3 };
        let azure = |t: &str| parse_csv_row(TraceFormat::Azure, cols, t).err().unwrap();
        assert_eq!(azure(r#"10,5,"2023-11-16"#), "TIMESTAMP: unterminated quoted field");
        assert_eq!(azure(r#""10"x,5,2023-11-16"#), "ContextTokens: unexpected `x` after a quoted field");
        let cols = Columns { time: 0, prompt: 1, output: 2, needed: 3 };
        assert_eq!(
            parse_csv_row(TraceFormat::Azure, cols, r#"2023-11-16 00:00:00,10,5,"x"y"#).err().unwrap(),
            "column 4: unexpected `y` after a quoted field"
        );
    }
}
