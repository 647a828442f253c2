//! Step-time calibration: measured steps read from CSV files, a model fitted
//! to them, and its error point by point (`pdsim calibrate`); and the
//! batch a step of given counts makes (`pdsim steptime`, and the rows of a
//! step CSV), built as a run builds it.
//!
//! # CSV shapes
//!
//! A file's header says which of three it is (columns in any order):
//!
//! - steps: `prefill_tokens,decode_seqs,context_tokens,step_us`, optionally
//!   `prefill_seqs` and `prefill_cached`: one row per step, with the counts
//!   of [`StepCounts`].
//! - AIConfigurator prefill: `batch,isl,prefix,new_tokens,ms`: `batch`
//!   prompts of `isl` tokens, `prefix` of each cached, `new_tokens` =
//!   `batch × (isl − prefix)` computed.
//! - AIConfigurator decode: `batch,context,ms`: `batch` sequences decoding
//!   one token each with `context` tokens each in their cache before the
//!   step.
//!
//! # Fits
//!
//! - `linear`: the four coefficients of [`StepTimeSpec::Linear`], each ≥ 0,
//!   by least squares of the relative error (every step weighs the same
//!   whatever its length), exactly: the best of the unconstrained fits on
//!   every subset of the coefficients whose solution is non-negative.
//! - `table2d` ([`StepTimeSpec::Table2d`]): the prefill table from the
//!   prefill steps of one prompt on an empty cache; the two pair rates (≥ 0)
//!   that minimise the worst relative error on the other prefill steps; the
//!   decode grid from the decode steps, which must give every (batch,
//!   context) of their distinct batches and contexts (a missing cell is an
//!   error naming it, not filled in); and the composition of a mixed step
//!   ([`MixedStep`]): one forward pass, unless the mixed steps given are
//!   priced better with the two terms added. Repeated points are averaged.
//! - `roofline` ([`fit_roofline`]): the nine factors of
//!   [`StepTimeSpec::Roofline`] for a given rank (a scenario's: its
//!   model's layers, GPU, TP size, pool), by coordinate descent on the
//!   mean squared relative error over every step.
//!
//! The errors reported are those of the model as written (coefficients
//! rounded as printed), priced by the same code a run uses.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use actors::config::{DecodeGrid, MixedStep, StepTimeSpec};
use actors::steptime::roofline::{RankInputs, RooflineParams, RooflineStepTime};
use actors::steptime::{self, BatchShape, StepTimeModel};

/// The most sequences of one step a shape is built for, one by one.
pub const MAX_SEQS: u64 = 10_000_000;

/// The counts of one step, as `pdsim steptime` takes them and a step CSV
/// gives them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepCounts {
    /// N: tokens the prefill sequences compute.
    pub prefill_tokens: u64,
    /// P: prefill sequences (default 1 when N > 0, else 0).
    pub prefill_seqs: Option<u64>,
    /// X: of the context, the tokens the prefill sequences have cached
    /// (default: all of C when D = 0, else 0).
    pub prefill_cached: Option<u64>,
    /// D: decoding sequences, one token each.
    pub decode_seqs: u64,
    /// C: KV the step reads beyond the tokens it computes, summed over all
    /// its sequences (X of it the prefill sequences', C − X the decoding
    /// ones').
    pub context_tokens: u64,
}

/// A count refused: the count's name (`prefill_seqs`) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountError {
    /// The count, as [`StepCounts`] names its field.
    pub count: &'static str,
    /// What is wrong, one line.
    pub problem: String,
}

fn refuse(count: &'static str, problem: impl Into<String>) -> CountError {
    CountError { count, problem: problem.into() }
}

/// `n` spread over `k` parts, the remainder one each to the first ones: part `i`.
/// Adds `count` sequences to `b`, the i-th computing `share(tokens, count,
/// i)` tokens on `share(cached, count, i)` cached ones, as runs of alike
/// sequences (the boundaries are where each remainder ends).
fn spread(b: &mut BatchShape, count: u64, tokens: u64, cached: u64, decoding: bool) {
    if count == 0 {
        return;
    }
    let (rk, rc) = (tokens % count, cached % count);
    let mut cuts = [0, rk.min(rc), rk.max(rc), count];
    cuts.sort_unstable();
    for w in cuts.windows(2) {
        let (a, z) = (w[0], w[1]);
        if z > a {
            b.add_many(z - a, share(tokens, count, a), share(cached, count, a), decoding);
        }
    }
}

fn share(n: u64, k: u64, i: u64) -> u64 {
    n / k + u64::from(i < n % k)
}

impl StepCounts {
    /// The batch of the step: the N prefill tokens and X cached spread
    /// evenly over the P prefill sequences, the C − X decode context over
    /// the D decoding sequences (remainders to the first ones), each added
    /// as [`BatchShape::add`] adds them one by one in a run (runs of alike
    /// sequences at once, [`BatchShape::add_many`]).
    ///
    /// # Errors
    /// Counts no step has (more prefill sequences than tokens, cached
    /// tokens with no prefill sequence, decode context with no decoding
    /// sequence), or more than [`MAX_SEQS`] sequences.
    pub fn shape(&self) -> Result<BatchShape, CountError> {
        let (n, d, c) = (self.prefill_tokens, self.decode_seqs, self.context_tokens);
        let p = match self.prefill_seqs {
            Some(0) if n > 0 => return Err(refuse("prefill_seqs", format!("must be >= 1 with {n} prefill tokens"))),
            Some(p) if p > n => {
                return Err(refuse(
                    "prefill_seqs",
                    format!("{p} prefill sequences need at least {p} prefill tokens (one each), got {n}"),
                ));
            }
            Some(p) => p,
            None => u64::from(n > 0),
        };
        if p > MAX_SEQS {
            return Err(refuse("prefill_seqs", format!("at most {MAX_SEQS} sequences, got {p}")));
        }
        if d > MAX_SEQS {
            return Err(refuse("decode_seqs", format!("at most {MAX_SEQS} sequences, got {d}")));
        }
        let x = self.prefill_cached.unwrap_or(if d == 0 { c } else { 0 });
        if x > c {
            return Err(refuse("prefill_cached", format!("{x} is more than the {c} context tokens")));
        }
        if x > 0 && p == 0 {
            let why = if self.prefill_cached.is_some() { "prefill_cached" } else { "context_tokens" };
            return Err(refuse(why, format!("{x} tokens of context, but the step has no sequence to hold them")));
        }
        if c - x > 0 && d == 0 {
            return Err(refuse(
                "context_tokens",
                format!("{} tokens of decode context (context less prefill_cached), but no decoding sequence", c - x),
            ));
        }
        if n.checked_add(d).and_then(|t| t.checked_add(c)).is_none() {
            return Err(refuse("context_tokens", "the step's tokens overflow 64 bits"));
        }
        // Sequence i gets share(·, count, i): the first `total % count`
        // one more. At most three runs of alike sequences, added at once.
        let mut b = BatchShape::default();
        spread(&mut b, p, n, x, false);
        spread(&mut b, d, d, c - x, true);
        Ok(b)
    }
}

/// Which part of a step a measurement prices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Region {
    /// Prefill sequences only.
    Prefill,
    /// Decoding sequences only.
    Decode,
    /// Both.
    Mixed,
}

impl Region {
    /// Every region, in report order.
    pub const ALL: [Region; 3] = [Region::Prefill, Region::Decode, Region::Mixed];

    /// The region of `b` (an empty step counts as prefill; no row gives one).
    pub fn of(b: &BatchShape) -> Region {
        match (b.prefill_seqs > 0, b.decode_seqs() > 0) {
            (true, true) => Region::Mixed,
            (false, true) => Region::Decode,
            _ => Region::Prefill,
        }
    }

    /// Its name in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Region::Prefill => "prefill",
            Region::Decode => "decode",
            Region::Mixed => "mixed",
        }
    }
}

/// One measured step.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// The file it came from, as named.
    pub file: String,
    /// Its line (1-based).
    pub line: usize,
    /// Its row in words (`batch=8 isl=1024 prefix=0`).
    pub row: String,
    /// The step's batch.
    pub shape: BatchShape,
    /// Its measured time, µs.
    pub us: f64,
}

impl Point {
    /// Where it came from and what it is, for a report.
    pub fn place(&self) -> String {
        format!("{}:{} ({})", self.file, self.line, self.row)
    }
}

/// The three shapes of CSV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Steps,
    AicPrefill,
    AicDecode,
}

const STEPS_REQUIRED: &[&str] = &["prefill_tokens", "decode_seqs", "context_tokens", "step_us"];
const STEPS_OPTIONAL: &[&str] = &["prefill_seqs", "prefill_cached"];
const AIC_PREFILL: &[&str] = &["batch", "isl", "prefix", "new_tokens", "ms"];
const AIC_DECODE: &[&str] = &["batch", "context", "ms"];

/// Reads the measured steps of the CSV file at `path`.
///
/// # Errors
/// One line naming the file, and the line and column of a bad cell.
pub fn read_points(path: &Path) -> Result<Vec<Point>, String> {
    let label = path.display().to_string();
    let text = crate::files::read_text(path, crate::files::MAX_TEXT_BYTES).map_err(|e| format!("{label}: {e}"))?;
    parse_points(&label, &text)
}

/// The measured steps of CSV `text`, which came from `file`.
///
/// # Errors
/// As [`read_points`].
pub fn parse_points(file: &str, text: &str) -> Result<Vec<Point>, String> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())).filter(|(_, l)| !l.is_empty());
    let Some((header_line, header)) = lines.next() else {
        return Err(format!("{file}: empty (expected a header line)"));
    };
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    let at = |line: usize| format!("{file}:{line}");
    let shape = shape_of(&columns).map_err(|e| format!("{}: header: {e}", at(header_line)))?;
    let index = |name: &str| columns.iter().position(|c| *c == name);
    let mut points = Vec::new();
    for (line, text) in lines {
        let cells: Vec<&str> = text.split(',').map(str::trim).collect();
        if cells.len() != columns.len() {
            return Err(format!("{}: {} fields, the header has {} ({header})", at(line), cells.len(), columns.len()));
        }
        let cell = |name: &'static str| index(name).map(|i| (name, cells[i]));
        let whole = |name: &'static str| -> Result<Option<u64>, String> {
            let Some((name, v)) = cell(name) else { return Ok(None) };
            v.parse::<u64>()
                .map(Some)
                .map_err(|_| format!("{}: column {name}: expected a whole number >= 0, got {v:?}", at(line)))
        };
        let need = |name: &'static str| whole(name).map(|v| v.expect("a required column"));
        // A time in the column's unit, as µs (× `to_us`): from 1 ns to 10^9
        // µs, the step times a model can hold.
        let time = |name: &'static str, to_us: f64| -> Result<f64, String> {
            let (name, v) = cell(name).expect("a required column");
            match v.parse::<f64>().map(|t| (t, t * to_us)) {
                Ok((_, us)) if (1e-3..=1e9).contains(&us) => Ok(us),
                Ok((t, _)) => Err(format!("{}: column {name}: must be a time from 1 ns to 10^9 µs, got {t}", at(line))),
                Err(_) => Err(format!("{}: column {name}: expected a number, got {v:?}", at(line))),
            }
        };
        let bad = |col: &str, why: String| format!("{}: column {col}: {why}", at(line));
        let (counts, us, row) = match shape {
            Shape::Steps => {
                let counts = StepCounts {
                    prefill_tokens: need("prefill_tokens")?,
                    prefill_seqs: whole("prefill_seqs")?,
                    prefill_cached: whole("prefill_cached")?,
                    decode_seqs: need("decode_seqs")?,
                    context_tokens: need("context_tokens")?,
                };
                if counts.prefill_tokens == 0 && counts.decode_seqs == 0 {
                    return Err(bad(
                        "prefill_tokens",
                        "an empty step (no prefill tokens, no decoding sequence)".into(),
                    ));
                }
                let row = STEPS_REQUIRED[..3]
                    .iter()
                    .chain(STEPS_OPTIONAL)
                    .filter_map(|&n| cell(n).map(|(n, v)| format!("{n}={v}")))
                    .collect::<Vec<_>>()
                    .join(" ");
                (counts, time("step_us", 1.0)?, row)
            }
            Shape::AicPrefill => {
                let (batch, isl, prefix, new) = (need("batch")?, need("isl")?, need("prefix")?, need("new_tokens")?);
                if batch == 0 {
                    return Err(bad("batch", "must be >= 1, got 0".into()));
                }
                if prefix >= isl {
                    return Err(bad(
                        "prefix",
                        format!("must be below isl {isl} (a prefill computes a token), got {prefix}"),
                    ));
                }
                let k = isl - prefix;
                if batch.checked_mul(isl).is_none() || batch * k != new {
                    return Err(bad(
                        "new_tokens",
                        format!("must be batch × (isl − prefix) = {batch} × {k}, got {new}"),
                    ));
                }
                let counts = StepCounts {
                    prefill_tokens: new,
                    prefill_seqs: Some(batch),
                    prefill_cached: Some(batch * prefix),
                    decode_seqs: 0,
                    context_tokens: batch * prefix,
                };
                (counts, time("ms", 1e3)?, format!("batch={batch} isl={isl} prefix={prefix}"))
            }
            Shape::AicDecode => {
                let (batch, context) = (need("batch")?, need("context")?);
                if batch == 0 {
                    return Err(bad("batch", "must be >= 1, got 0".into()));
                }
                let total =
                    batch.checked_mul(context).ok_or_else(|| bad("context", "batch × context overflows".into()))?;
                let counts = StepCounts { decode_seqs: batch, context_tokens: total, ..StepCounts::default() };
                (counts, time("ms", 1e3)?, format!("batch={batch} context={context}"))
            }
        };
        let shape = counts.shape().map_err(|e| bad(e.count, e.problem))?;
        points.push(Point { file: file.to_owned(), line, row, shape, us });
    }
    if points.is_empty() {
        return Err(format!("{}: no rows after the header", at(header_line)));
    }
    Ok(points)
}

fn shape_of(columns: &[&str]) -> Result<Shape, String> {
    for (i, c) in columns.iter().enumerate() {
        if columns[..i].contains(c) {
            return Err(format!("column {c} appears twice"));
        }
    }
    let exactly = |want: &[&str]| columns.len() == want.len() && want.iter().all(|w| columns.contains(w));
    if exactly(AIC_PREFILL) {
        return Ok(Shape::AicPrefill);
    }
    if exactly(AIC_DECODE) {
        return Ok(Shape::AicDecode);
    }
    if columns.contains(&"step_us") {
        if let Some(missing) = STEPS_REQUIRED.iter().find(|w| !columns.contains(w)) {
            return Err(format!("missing column {missing} (a step CSV has {})", STEPS_REQUIRED.join(",")));
        }
        if let Some(unknown) = columns.iter().find(|c| !STEPS_REQUIRED.contains(c) && !STEPS_OPTIONAL.contains(c)) {
            return Err(format!(
                "unknown column {unknown} (a step CSV has {}, and optionally {})",
                STEPS_REQUIRED.join(","),
                STEPS_OPTIONAL.join(",")
            ));
        }
        return Ok(Shape::Steps);
    }
    Err(format!(
        "expected the columns {} (with optional {}), or {}, or {}; got {}",
        STEPS_REQUIRED.join(","),
        STEPS_OPTIONAL.join(","),
        AIC_PREFILL.join(","),
        AIC_DECODE.join(","),
        columns.join(",")
    ))
}

/// The model forms a fit can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// [`StepTimeSpec::Linear`].
    Linear,
    /// [`StepTimeSpec::Table2d`].
    Table2d,
}

/// `x²`, by one multiplication (the same bits on every machine, which
/// `powi` does not promise).
fn sq(x: f64) -> f64 {
    x * x
}

/// Rounds `v` to multiples of `unit`.
fn round_to(v: f64, unit: f64) -> f64 {
    (v / unit).round() * unit
}

/// Rounds µs to whole ns, as written.
fn ns_round(us: f64) -> f64 {
    round_to(us, 1e-3)
}

/// Fits a model of `kind` to `points` (see the module's notes).
///
/// # Errors
/// Points that cannot make the model (no prefill or decode steps for a
/// `table2d`, a decode grid with a cell missing), named.
pub fn fit(kind: Kind, points: &[Point]) -> Result<StepTimeSpec, String> {
    if points.is_empty() {
        return Err("no steps to fit".into());
    }
    match kind {
        Kind::Linear => Ok(fit_linear(points)),
        Kind::Table2d => fit_table2d(points),
    }
}

/// The factors of a roofline fitted to `points`, given the rank it prices
/// (its layers, GPU, TP size and pool): coordinate descent, each factor in
/// turn by golden-section search within its range (efficiencies 0.05 to
/// 1, all-reduce latency 0 to 100 µs, per-layer costs 0 to 1,000 µs,
/// overhead 0 to 20,000 µs), eight
/// rounds from the defaults, minimising the mean squared relative error.
/// Deterministic: the same points give the same factors.
pub fn fit_roofline(points: &[Point], rank: RankInputs<'_>) -> RooflineParams {
    let cost = |p: &RooflineParams| {
        let m = RooflineStepTime::new(rank, *p);
        points.iter().map(|pt| sq(price_us(&m, &pt.shape) / pt.us - 1.0)).sum::<f64>() / points.len() as f64
    };
    type Field = fn(&mut RooflineParams) -> &mut f64;
    let fields: [(Field, f64, f64); 9] = [
        (|p| &mut p.gemm_efficiency, 0.05, 1.0),
        (|p| &mut p.attention_efficiency, 0.05, 1.0),
        (|p| &mut p.weight_memory_efficiency, 0.05, 1.0),
        (|p| &mut p.kv_memory_efficiency, 0.05, 1.0),
        (|p| &mut p.network_efficiency, 0.05, 1.0),
        (|p| &mut p.allreduce_latency_us, 0.0, 100.0),
        (|p| &mut p.layer_overhead_us, 0.0, 1_000.0),
        (|p| &mut p.prefill_attention_floor_us, 0.0, 1_000.0),
        (|p| &mut p.overhead_us, 0.0, 20_000.0),
    ];
    let mut best = RooflineParams::default();
    let g = (5f64.sqrt() - 1.0) / 2.0;
    for _ in 0..8 {
        for (field, lo, hi) in fields {
            let at = |x: f64| {
                let mut p = best;
                *field(&mut p) = x;
                cost(&p)
            };
            let (mut a, mut b) = (lo, hi);
            let (mut c, mut d) = (b - g * (b - a), a + g * (b - a));
            let (mut fc, mut fd) = (at(c), at(d));
            for _ in 0..40 {
                if fc < fd {
                    (b, d, fd) = (d, c, fc);
                    c = b - g * (b - a);
                    fc = at(c);
                } else {
                    (a, c, fc) = (c, d, fd);
                    d = a + g * (b - a);
                    fd = at(d);
                }
            }
            let x = (a + b) / 2.0;
            // Keep the current value unless the search found better.
            if at(x) < cost(&best) {
                *field(&mut best) = x;
            }
        }
    }
    // As written: six decimals.
    for (field, _, _) in fields {
        let v = field(&mut best);
        *v = round_to(*v, 1e-6);
    }
    best
}

/// The regressors of the linear model at `b`: fixed, tokens, sequences,
/// context tokens.
fn linear_terms(b: &BatchShape) -> [f64; 4] {
    [1.0, b.new_tokens as f64, b.seqs as f64, b.context_tokens as f64]
}

fn fit_linear(points: &[Point]) -> StepTimeSpec {
    // Relative least squares: rows x/y against 1.
    let rows: Vec<[f64; 4]> = points.iter().map(|p| linear_terms(&p.shape).map(|x| x / p.us)).collect();
    let mut scale = [0.0f64; 4];
    for r in &rows {
        for j in 0..4 {
            scale[j] = scale[j].max(r[j].abs());
        }
    }
    let cost = |beta: &[f64; 4]| {
        rows.iter().map(|r| sq(r.iter().zip(beta).map(|(x, b)| x * b).sum::<f64>() - 1.0)).sum::<f64>()
    };
    let mut best: Option<([f64; 4], f64)> = None;
    for mask in 1u32..16 {
        let cols: Vec<usize> = (0..4).filter(|&j| mask & (1 << j) != 0 && scale[j] > 0.0).collect();
        if cols.len() != mask.count_ones() as usize {
            continue;
        }
        let Some(sol) = least_squares(&rows, &cols, &scale) else { continue };
        if sol.iter().any(|&b| b < 0.0) {
            continue;
        }
        let mut beta = [0.0; 4];
        for (&j, &b) in cols.iter().zip(&sol) {
            beta[j] = b;
        }
        let c = cost(&beta);
        if best.is_none_or(|(_, bc)| c < bc) {
            best = Some((beta, c));
        }
    }
    // The fixed term alone always solves (its column is 1/y > 0).
    let (beta, _) = best.expect("a fixed term alone fits");
    let us = |v: f64| round_to(v, 1e-6);
    StepTimeSpec::Linear {
        fixed_us: us(beta[0]),
        per_token_us: us(beta[1]),
        per_seq_us: us(beta[2]),
        per_context_token_us: us(beta[3]),
    }
}

/// The least-squares solution of `rows` (on the columns `cols`) against a
/// target of 1 in every row, through the normal equations on columns
/// divided by `scale`; `None` if singular.
fn least_squares(rows: &[[f64; 4]], cols: &[usize], scale: &[f64; 4]) -> Option<Vec<f64>> {
    let k = cols.len();
    let mut a = vec![vec![0.0f64; k + 1]; k];
    for r in rows {
        let x: Vec<f64> = cols.iter().map(|&j| r[j] / scale[j]).collect();
        for i in 0..k {
            for j in 0..k {
                a[i][j] += x[i] * x[j];
            }
            a[i][k] += x[i];
        }
    }
    let size = (0..k).map(|i| a[i][i]).fold(0.0f64, f64::max);
    for c in 0..k {
        let pivot = (c..k).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        if a[pivot][c].abs() <= 1e-12 * size {
            return None;
        }
        a.swap(c, pivot);
        let prow = a[c].clone();
        for (i, row) in a.iter_mut().enumerate() {
            if i != c {
                let f = row[c] / prow[c];
                for (x, p) in row[c..].iter_mut().zip(&prow[c..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|i| a[i][k] / a[i][i] / scale[cols[i]]).collect())
}

/// Means of repeated points, by key.
fn means<K: Ord>(items: impl Iterator<Item = (K, f64)>) -> BTreeMap<K, f64> {
    let mut acc: BTreeMap<K, (f64, u32)> = BTreeMap::new();
    for (k, v) in items {
        let e = acc.entry(k).or_insert((0.0, 0));
        e.0 += v;
        e.1 += 1;
    }
    acc.into_iter().map(|(k, (s, n))| (k, s / f64::from(n))).collect()
}

fn fit_table2d(points: &[Point]) -> Result<StepTimeSpec, String> {
    let prefill: Vec<&Point> = points.iter().filter(|p| Region::of(&p.shape) == Region::Prefill).collect();
    let decode: Vec<&Point> = points.iter().filter(|p| Region::of(&p.shape) == Region::Decode).collect();
    let single = |b: &BatchShape| b.prefill_seqs == 1 && b.prefill_cached == 0;
    let table: Vec<[f64; 2]> =
        means(prefill.iter().filter(|p| single(&p.shape)).map(|p| (p.shape.prefill_tokens, p.us)))
            .into_iter()
            .map(|(tokens, us)| [tokens as f64, ns_round(us)])
            .collect();
    if table.is_empty() {
        return Err("table2d needs prefill steps of one prompt on an empty cache (AIConfigurator prefill rows \
                    with batch 1 and prefix 0), for its prefill table; none given"
            .into());
    }
    if decode.is_empty() {
        return Err("table2d needs decode steps (AIConfigurator decode rows, or steps with decode_seqs > 0 and no \
                    prefill tokens), for its decode grid; none given"
            .into());
    }
    let mut cells = Vec::with_capacity(decode.len());
    for p in &decode {
        let (d, x) = (p.shape.decode_seqs(), p.shape.decode_context);
        if x % d != 0 {
            return Err(format!(
                "{}: table2d needs decode steps at a whole context per sequence, got {x} tokens over {d} sequences",
                p.place()
            ));
        }
        cells.push(((d, x / d), p.us));
    }
    let cells = means(cells.into_iter());
    let seqs: Vec<u64> = cells.keys().map(|&(d, _)| d).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let context: Vec<u64> =
        cells.keys().map(|&(_, c)| c).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let mut us = Vec::with_capacity(seqs.len());
    for &d in &seqs {
        let mut row = Vec::with_capacity(context.len());
        for &c in &context {
            let v = cells.get(&(d, c)).ok_or_else(|| {
                format!(
                    "no decode step at batch {d} and context {c}: table2d needs one at every batch × context of \
                     the decode steps ({} batches × {} contexts)",
                    seqs.len(),
                    context.len()
                )
            })?;
            row.push(ns_round(*v));
        }
        us.push(row);
    }
    let grid = DecodeGrid { seqs, context, us };
    let (a, b) = fit_pairs(&prefill, &table, &grid)?;
    let (a, b) = (round_to(a, 1e-6), round_to(b, 1e-6));
    let mixed = fit_mixed(points, &table, a, b, &grid);
    Ok(StepTimeSpec::Table2d {
        prefill: table,
        prefill_self_pair_ns: a,
        prefill_cached_pair_ns: b,
        decode: grid,
        mixed,
    })
}

/// How the fitted table2d prices mixed steps: the composition with the
/// smaller mean relative error on the mixed steps given, one forward pass
/// when none is (or on a tie): the table and grid were measured a part at
/// a time, so only mixed steps can tell the compositions apart.
fn fit_mixed(points: &[Point], table: &[[f64; 2]], a: f64, b: f64, grid: &DecodeGrid) -> MixedStep {
    let mixed: Vec<&Point> = points.iter().filter(|p| Region::of(&p.shape) == Region::Mixed).collect();
    let Some(model) = steptime::Table2dStepTime::from_spec(table, a, b, grid) else {
        return MixedStep::OneForwardPass;
    };
    if mixed.is_empty() {
        return MixedStep::OneForwardPass;
    }
    let error = |m: &steptime::Table2dStepTime| {
        mixed.iter().map(|p| (price_us(m, &p.shape) / p.us - 1.0).abs()).sum::<f64>() / mixed.len() as f64
    };
    let one = error(&model.clone().with_mixed(MixedStep::OneForwardPass));
    let sum = error(&model.with_mixed(MixedStep::PrefillPlusDecode));
    if sum < one { MixedStep::PrefillPlusDecode } else { MixedStep::OneForwardPass }
}

/// The pair rates (ns, each ≥ 0) that minimise the worst relative error
/// on the prefill steps not in the table (several prompts, or a cache).
fn fit_pairs(prefill: &[&Point], table: &[[f64; 2]], grid: &DecodeGrid) -> Result<(f64, f64), String> {
    let bare = steptime::Table2dStepTime::from_spec(table, 0.0, 0.0, grid)
        .ok_or_else(|| "the fitted table2d is out of range (a time past 1e9 µs?)".to_owned())?;
    // (P(N) µs, fewer self pairs than one prompt's, cached pairs, measured µs).
    let rows: Vec<[f64; 4]> = prefill
        .iter()
        .filter(|p| !(p.shape.prefill_seqs == 1 && p.shape.prefill_cached == 0))
        .map(|p| {
            let b = &p.shape;
            let n = u128::from(b.prefill_tokens);
            let fewer = (n * (n + 1) / 2).saturating_sub(b.prefill_self_pairs);
            [bare.terms(b)[0].1, fewer as f64, b.prefill_cached_pairs as f64, p.us]
        })
        .collect();
    // The worst error, ties (a worst error that no rate moves, set by a
    // row of its own) broken by the mean: still convex.
    let objective = |a: f64, b: f64| {
        let (mut worst, mut sum) = (0.0f64, 0.0);
        for &[p, fewer, cached, y] in &rows {
            let e = ((p - a * fewer * 1e-3 + b * cached * 1e-3) - y).abs() / y;
            worst = worst.max(e);
            sum += e;
        }
        worst + 1e-3 * sum / rows.len().max(1) as f64
    };
    // A rate's natural size: what explains a row's whole gap to the table.
    let size = |col: usize| {
        rows.iter()
            .filter(|r| r[col] > 0.0)
            .map(|r| (r[0] - r[3]).abs().max(1e-3 * r[3]) * 1e3 / r[col])
            .fold(0.0, f64::max)
    };
    let (sa, sb) = (size(1), size(2));
    let best_b = |a: f64| minimize(|b| objective(a, b), sb);
    let a = minimize(|a| objective(a, best_b(a)), sa);
    Ok((a, best_b(a)))
}

/// The minimum over `[0, ∞)` of a convex `f`, searched from `size` (0:
/// the minimum is taken at 0): the bracket doubled while `f` falls, then
/// golden sections. Deterministic.
fn minimize(f: impl Fn(f64) -> f64, size: f64) -> f64 {
    if !(size > 0.0 && size.is_finite()) {
        return 0.0;
    }
    let mut hi = size;
    for _ in 0..200 {
        if f(2.0 * hi) >= f(hi) {
            break;
        }
        hi *= 2.0;
    }
    let (mut lo, mut hi) = (0.0, 2.0 * hi);
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut m1, mut m2) = (hi - g * (hi - lo), lo + g * (hi - lo));
    let (mut f1, mut f2) = (f(m1), f(m2));
    for _ in 0..100 {
        if f1 <= f2 {
            hi = m2;
            (m2, f2) = (m1, f1);
            m1 = hi - g * (hi - lo);
            f1 = f(m1);
        } else {
            lo = m1;
            (m1, f1) = (m2, f2);
            m2 = lo + g * (hi - lo);
            f2 = f(m2);
        }
    }
    let x = (lo + hi) / 2.0;
    if f(0.0) <= f(x) { 0.0 } else { x }
}

/// How well a model prices the points of one region.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionFit {
    /// The region.
    pub region: Region,
    /// Points in it.
    pub steps: usize,
    /// Mean of |model − measured| / measured.
    pub mean_error: f64,
    /// The largest of them.
    pub worst_error: f64,
    /// The point with the largest error, its model time in µs.
    pub worst: Option<(Point, f64)>,
}

/// The model's time for `b`, µs.
pub fn price_us(model: &dyn StepTimeModel, b: &BatchShape) -> f64 {
    model.step_time(b).as_nanos() as f64 / 1e3
}

/// The relative error of `model` at every point, by region.
pub fn fit_errors(model: &dyn StepTimeModel, points: &[Point]) -> Vec<RegionFit> {
    Region::ALL
        .iter()
        .map(|&region| {
            let mut fit = RegionFit { region, steps: 0, mean_error: 0.0, worst_error: 0.0, worst: None };
            let mut sum = 0.0;
            for p in points.iter().filter(|p| Region::of(&p.shape) == region) {
                let us = price_us(model, &p.shape);
                let e = (us - p.us).abs() / p.us;
                fit.steps += 1;
                sum += e;
                if fit.worst.is_none() || e > fit.worst_error {
                    fit.worst_error = e;
                    fit.worst = Some((p.clone(), us));
                }
            }
            if fit.steps > 0 {
                fit.mean_error = sum / fit.steps as f64;
            }
            fit
        })
        .collect()
}

/// The fit-error table, as TOML comment lines.
pub fn error_table(fits: &[RegionFit]) -> String {
    let mut out = String::from("# region   steps  mean err  worst err  worst step\n");
    for f in fits {
        let region = f.region.as_str();
        match &f.worst {
            None => writeln!(out, "# {region:<8} {:>5}         -          -", 0),
            Some((p, us)) => {
                let signed = (us - p.us) / p.us * 100.0;
                writeln!(
                    out,
                    "# {region:<8} {:>5}  {:>6.2} %   {:>6.2} %  {}: measured {:.3} µs, model {:.3} µs ({signed:+.2} %)",
                    f.steps,
                    f.mean_error * 100.0,
                    f.worst_error * 100.0,
                    p.place(),
                    p.us,
                    us
                )
            }
        }
        .expect("writing to a String");
    }
    out
}

/// `step_time = { … }` on one line: a TOML inline table that pastes into a
/// role's table of a scenario.
pub fn step_time_toml(spec: &StepTimeSpec) -> String {
    let list = |v: &[f64]| v.iter().map(|x| num(*x)).collect::<Vec<_>>().join(", ");
    let body = match spec {
        StepTimeSpec::Linear { fixed_us, per_token_us, per_seq_us, per_context_token_us } => format!(
            "kind = \"linear\", fixed_us = {}, per_token_us = {}, per_seq_us = {}, per_context_token_us = {}",
            num(*fixed_us),
            num(*per_token_us),
            num(*per_seq_us),
            num(*per_context_token_us)
        ),
        StepTimeSpec::Table { points, per_context_token_us } => {
            let points: Vec<String> = points.iter().map(|p| format!("[{}]", list(p))).collect();
            format!(
                "kind = \"table\", points = [{}], per_context_token_us = {}",
                points.join(", "),
                num(*per_context_token_us)
            )
        }
        StepTimeSpec::Roofline(p) => format!(
            "kind = \"roofline\", gemm_efficiency = {}, attention_efficiency = {}, weight_memory_efficiency = {}, \
             kv_memory_efficiency = {}, network_efficiency = {}, allreduce_latency_us = {}, layer_overhead_us = {}, \
             prefill_attention_floor_us = {}, overhead_us = {}",
            num(p.gemm_efficiency),
            num(p.attention_efficiency),
            num(p.weight_memory_efficiency),
            num(p.kv_memory_efficiency),
            num(p.network_efficiency),
            num(p.allreduce_latency_us),
            num(p.layer_overhead_us),
            num(p.prefill_attention_floor_us),
            num(p.overhead_us)
        ),
        StepTimeSpec::Table2d { prefill, prefill_self_pair_ns, prefill_cached_pair_ns, decode, mixed } => {
            let points: Vec<String> = prefill.iter().map(|p| format!("[{}]", list(p))).collect();
            let ints = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
            let rows: Vec<String> = decode.us.iter().map(|r| format!("[{}]", list(r))).collect();
            // The default composition goes unsaid.
            let mixed = match mixed {
                MixedStep::OneForwardPass => "",
                MixedStep::PrefillPlusDecode => ", mixed = \"prefill_plus_decode\"",
            };
            format!(
                "kind = \"table2d\", prefill = [{}], prefill_self_pair_ns = {}, prefill_cached_pair_ns = {}, \
                 decode = {{ seqs = [{}], context = [{}], us = [{}] }}{mixed}",
                points.join(", "),
                num(*prefill_self_pair_ns),
                num(*prefill_cached_pair_ns),
                ints(&decode.seqs),
                ints(&decode.context),
                rows.join(", ")
            )
        }
    };
    format!("step_time = {{ {body} }}\n")
}

/// A number as written: at most 6 decimals (every fitted value is rounded
/// to 1e-6 of its unit or coarser), trailing zeros dropped, never an
/// exponent.
fn num(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".to_owned() } else { s.to_owned() }
}

/// The `step_time` of a [`step_time_toml`] line, read back as a scenario
/// reads it (the model a user who pastes it gets).
///
/// # Errors
/// Text that is not such a line (a bug of the writer).
pub fn read_step_time_toml(text: &str) -> Result<StepTimeSpec, String> {
    #[derive(serde::Deserialize)]
    struct Line {
        step_time: StepTimeSpec,
    }
    toml::from_str::<Line>(text).map(|l| l.step_time).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_spread_evenly_with_remainders_first() {
        // 10 tokens over 3 prompts: 4, 3, 3; 5 cached: 2, 2, 1.
        let c = StepCounts {
            prefill_tokens: 10,
            prefill_seqs: Some(3),
            prefill_cached: Some(5),
            context_tokens: 5,
            ..StepCounts::default()
        };
        let b = c.shape().unwrap();
        assert_eq!((b.prefill_seqs, b.prefill_tokens, b.prefill_cached), (3, 10, 5));
        // 4·5/2 + 2 × 3·4/2 = 10 + 12 = 22 pairs; cached 4·2 + 3·2 + 3·1 = 17.
        assert_eq!((b.prefill_self_pairs, b.prefill_cached_pairs), (22, 17));
        // D = 0: the context is the prefill's by default.
        let c = StepCounts { prefill_tokens: 4, context_tokens: 8, ..StepCounts::default() };
        assert_eq!(c.shape().unwrap().prefill_cached, 8);
        // D > 0: the decoding sequences', 7 over 2: 4 and 3.
        let c = StepCounts { prefill_tokens: 4, decode_seqs: 2, context_tokens: 7, ..StepCounts::default() };
        let b = c.shape().unwrap();
        assert_eq!((b.prefill_cached, b.decode_context, b.decode_seqs()), (0, 7, 2));
        assert_eq!(b.new_tokens, 6);
    }

    #[test]
    fn impossible_counts_name_the_count() {
        let e = |c: StepCounts| c.shape().unwrap_err().count;
        assert_eq!(e(StepCounts { prefill_tokens: 2, prefill_seqs: Some(3), ..StepCounts::default() }), "prefill_seqs");
        assert_eq!(e(StepCounts { prefill_tokens: 2, prefill_seqs: Some(0), ..StepCounts::default() }), "prefill_seqs");
        assert_eq!(
            e(StepCounts { decode_seqs: 1, prefill_cached: Some(3), context_tokens: 2, ..StepCounts::default() }),
            "prefill_cached"
        );
        assert_eq!(e(StepCounts { context_tokens: 2, ..StepCounts::default() }), "context_tokens");
        assert_eq!(
            e(StepCounts { prefill_tokens: 2, prefill_cached: Some(0), context_tokens: 2, ..StepCounts::default() }),
            "context_tokens"
        );
    }

    #[test]
    fn csv_shapes_are_told_apart_by_their_header() {
        let p = parse_points("p.csv", "batch,isl,prefix,new_tokens,ms\n2,1024,256,1536,10.5\n").unwrap();
        let b = &p[0].shape;
        assert_eq!((b.prefill_seqs, b.prefill_tokens, b.prefill_cached), (2, 1536, 512));
        assert_eq!((p[0].us, p[0].line, p[0].row.as_str()), (10_500.0, 2, "batch=2 isl=1024 prefix=256"));
        let d = parse_points("d.csv", "batch,context,ms\n\n8,100,5\n").unwrap();
        assert_eq!((d[0].shape.decode_seqs(), d[0].shape.decode_context, d[0].line), (8, 800, 3));
        let s =
            parse_points("s.csv", "step_us,prefill_tokens,decode_seqs,context_tokens,prefill_seqs\n100,10,2,40,2\n")
                .unwrap();
        let b = &s[0].shape;
        assert_eq!((b.prefill_seqs, b.decode_seqs(), b.decode_context), (2, 2, 40));
    }

    #[test]
    fn bad_csv_names_the_file_line_and_column() {
        let e = |t: &str| parse_points("x.csv", t).unwrap_err();
        assert_eq!(e(""), "x.csv: empty (expected a header line)");
        assert!(e("a,b\n1,2\n").starts_with("x.csv:1: header: expected the columns"));
        assert_eq!(e("batch,context,ms\n1,2,x\n"), "x.csv:2: column ms: expected a number, got \"x\"");
        assert_eq!(
            e("batch,context,ms\n1,2,5\n1,-2,5\n"),
            "x.csv:3: column context: expected a whole number >= 0, got \"-2\""
        );
        assert_eq!(e("batch,context,ms\n1,2\n"), "x.csv:2: 2 fields, the header has 3 (batch,context,ms)");
        assert_eq!(e("batch,context,ms\n0,2,1\n"), "x.csv:2: column batch: must be >= 1, got 0");
        assert_eq!(e("batch,context,ms\n1,2,0\n"), "x.csv:2: column ms: must be a time from 1 ns to 10^9 µs, got 0");
        assert!(
            e("batch,isl,prefix,new_tokens,ms\n2,1024,0,1024,1\n")
                .starts_with("x.csv:2: column new_tokens: must be batch")
        );
        assert!(
            e("step_us,prefill_tokens,decode_seqs,context_tokens\n1,0,0,5\n")
                .starts_with("x.csv:2: column prefill_tokens: an empty step")
        );
        assert!(e("step_us,prefill_tokens,decode_seqs,context_tokens,bogus\n").contains("unknown column bogus"));
        assert_eq!(e("batch,context,ms\n"), "x.csv:1: no rows after the header");
    }

    #[test]
    fn a_linear_fit_recovers_a_linear_model() {
        // Steps priced by 1,000 + 20 × tokens + 0.01 × context µs exactly.
        let mut points = Vec::new();
        for (i, (n, d, c)) in
            [(100u64, 0u64, 0u64), (2000, 0, 0), (0, 8, 8000), (0, 64, 64_000), (500, 4, 4000), (0, 1, 10)]
                .into_iter()
                .enumerate()
        {
            let shape = StepCounts { prefill_tokens: n, decode_seqs: d, context_tokens: c, ..StepCounts::default() }
                .shape()
                .unwrap();
            let us = 1000.0 + 20.0 * shape.new_tokens as f64 + 0.01 * shape.context_tokens as f64;
            points.push(Point { file: "f".into(), line: i + 2, row: String::new(), shape, us });
        }
        let StepTimeSpec::Linear { fixed_us, per_token_us, per_seq_us, per_context_token_us } =
            fit(Kind::Linear, &points).unwrap()
        else {
            panic!()
        };
        assert!((fixed_us - 1000.0).abs() < 1e-3, "{fixed_us}");
        assert!((per_token_us - 20.0).abs() < 1e-6, "{per_token_us}");
        assert!(per_seq_us.abs() < 1e-6, "{per_seq_us}");
        assert!((per_context_token_us - 0.01).abs() < 1e-6, "{per_context_token_us}");
    }

    #[test]
    fn minimize_finds_a_convex_minimum_and_zero_at_the_edge() {
        assert!((minimize(|x| (x - 3.7).abs(), 0.01) - 3.7).abs() < 1e-9);
        assert_eq!(minimize(|x| x + 1.0, 1.0), 0.0);
        assert_eq!(minimize(|x| x, 0.0), 0.0);
    }

    #[test]
    fn a_table2d_fit_needs_a_full_decode_grid() {
        let mut points = parse_points("p.csv", "batch,isl,prefix,new_tokens,ms\n1,1024,0,1024,20\n").unwrap();
        points.extend(parse_points("d.csv", "batch,context,ms\n1,100,5\n2,200,6\n").unwrap());
        let e = fit(Kind::Table2d, &points).unwrap_err();
        assert!(e.starts_with("no decode step at batch 1 and context 200"), "{e}");
    }
}
