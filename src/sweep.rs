//! Sweep files: a base scenario, the axes to vary, and the points they make.
//!
//! ```toml
//! scenario = "../glm-5.3-flash-1p1d.toml"  # relative to the sweep file (required)
//! seeds = [1, 2]                           # default: [the scenario's seed]
//! requests = 500                           # default: the scenario's count
//! [axes]                                   # dotted scenario paths, in this order
//! "link.bandwidth_gb_s" = [25, 50, 100]
//! "workload.arrival.rate_per_s" = [2.0, 4.0]
//! [[zip]]                                  # lists that advance together: 1P3D, 2P2D
//! "prefill.count" = [1, 2]
//! "decode.count" = [3, 2]
//! ```
//!
//! The grid's dimensions are the axes of `[axes]`, each one dimension, and
//! the `[[zip]]` tables, each one dimension whose lists (of one length)
//! advance together: coordinate `j` of a zip sets each of its paths to the
//! `j`-th value of its list. The points are the cartesian product of the
//! dimensions, in the order the file gives them (an axis at its key, a zip
//! at its first key; the first varies slowest), times the seeds (varying
//! fastest): point `i` of `D₁ × … × Dₙ × seeds`. Each point is the base
//! scenario with [`Scenario::with_overrides`] of its values, checked as a
//! whole. A path is any dotted path of scenario keys (the resolved form
//! `pdsim validate` prints), in one place only (one axis or one zip); the
//! seed is not one (use `seeds`).
//!
//! Errors name the sweep file, the line and the key (`axes."decode.count"`,
//! or `zip[0]."decode.count"` for a key of the first `[[zip]]`; for a value
//! that makes a bad scenario, the axis or the zip coordinate and the value).

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use actors::bench::{Bench, Value};

use crate::report::Report;
use crate::scenario::{self, Scenario, ScenarioError};

/// The keys a sweep file may have.
pub const SWEEP_KEYS: &[&str] = &["scenario", "seeds", "requests", "axes", "zip"];

/// A sweep file refused: one line with the file, the line and the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct SweepError(pub String);

impl fmt::Display for SweepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One axis: a dotted scenario path and its values (one column of
/// `sweep.csv`).
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// The dotted path (`decode.count`).
    pub path: String,
    /// The values, in the file's order.
    pub values: Vec<toml::Value>,
    /// The line of the axis in the sweep file.
    pub line: usize,
    /// The `[[zip]]` it belongs to (its index in the file), if any.
    pub zip: Option<usize>,
}

impl Axis {
    /// The key as errors name it: `axes."decode.count"`, or
    /// `zip[0]."decode.count"`.
    pub fn key(&self) -> String {
        axis_key(self.zip, &self.path)
    }
}

/// One dimension of the grid: a plain axis, or the axes of one `[[zip]]`,
/// whose values advance together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dimension {
    /// Its axes, a range of [`Sweep::axes`].
    pub axes: Range<usize>,
    /// Its number of coordinates (the length of each of its axes' lists).
    pub len: usize,
    /// The `[[zip]]` (its index in the file), or `None` for a plain axis.
    pub zip: Option<usize>,
}

/// A checked sweep file.
#[derive(Clone, Debug)]
pub struct Sweep {
    /// The sweep file as named.
    pub file: String,
    /// The base scenario file, joined to the sweep file's folder.
    pub scenario_path: PathBuf,
    /// The base scenario.
    pub base: Scenario,
    /// The seeds of every axis point.
    pub seeds: Vec<u64>,
    /// The request count replacing the scenario's, if given.
    pub requests: Option<u64>,
    /// Every axis, plain or of a zip, in file order: the axis columns of
    /// `sweep.csv` (private: the dimensions index into it).
    axes: Vec<Axis>,
    /// The grid's dimensions, in file order (the first varies slowest).
    dims: Vec<Dimension>,
    /// The number of points (grid points times seeds), counted once.
    len: usize,
}

/// One point of a sweep.
#[derive(Clone, Debug)]
pub struct Point {
    /// Its index in the sweep's order.
    pub index: usize,
    /// Its value on each axis, in axis order ([`Sweep::axes`]).
    pub values: Vec<toml::Value>,
    /// Its seed.
    pub seed: u64,
    /// The base scenario with the axis values, checked.
    pub scenario: Scenario,
}

/// Text of an axis value for a CSV cell or a message: strings bare, numbers
/// and booleans as TOML writes them, anything else as inline TOML.
pub fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The longest folder name [`point_folder`] makes (bytes); most file
/// systems allow 255.
pub const MAX_FOLDER_NAME: usize = 200;

/// The folder name of a sweep point (`--reports`' `points/<name>/`): its
/// value on each axis, then its seed, as `key=value` joined by `,`
/// (`count=1,rate_per_s=4.0,seed=1`), a function of those alone, so a
/// point keeps its name when the sweep grows. Each key is the shortest
/// tail of dotted components of the axis path that no other axis path
/// ends with (`rate_per_s` for `workload.arrival.rate_per_s`;
/// `prefill.count` beside `decode.count`). `paths` and `values` are the
/// axis columns of `sweep.csv` and a row's cells ([`value_text`]).
///
/// One plain path component: every byte but ASCII letters, digits, `.`,
/// `_`, `+` and `-` is written `%XX` (so `/`, `,`, `=` and `%` in a value
/// cannot split or mimic the name, and two different points never get one
/// name), and a name longer than [`MAX_FOLDER_NAME`] is cut and ends in
/// `~` and the 16 hex digits of the FNV-1a hash of the whole name.
pub fn point_folder(paths: &[&str], values: &[&str], seed: u64) -> String {
    let keys = short_keys(paths);
    let mut name = String::new();
    for (k, v) in keys.iter().zip(values) {
        escape_into(&mut name, k);
        name.push('=');
        escape_into(&mut name, v);
        name.push(',');
    }
    name.push_str(&format!("seed={seed}"));
    if name.len() > MAX_FOLDER_NAME {
        let hash =
            name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        // The escaped name is ASCII: any byte is a char boundary.
        name.truncate(MAX_FOLDER_NAME - 17);
        name.push_str(&format!("~{hash:016x}"));
    }
    name
}

/// Each path's shortest tail of dotted components that no other path
/// ends with (the whole path when another path ends with all of it).
fn short_keys(paths: &[&str]) -> Vec<String> {
    let tail = |p: &str, k: usize| -> String {
        let parts: Vec<&str> = p.split('.').collect();
        parts[parts.len().saturating_sub(k)..].join(".")
    };
    paths
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let n = p.split('.').count();
            (1..=n)
                .map(|k| tail(p, k))
                .find(|t| paths.iter().enumerate().all(|(j, q)| j == i || !(*q == t || q.ends_with(&format!(".{t}")))))
                .unwrap_or_else(|| (*p).to_owned())
        })
        .collect()
}

/// Appends `s` with every byte outside `[A-Za-z0-9._+-]` as `%XX`.
fn escape_into(out: &mut String, s: &str) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"._+-".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

struct Doc<'a> {
    file: &'a str,
    text: &'a str,
}

impl Doc<'_> {
    fn line(&self, span: &Range<usize>) -> usize {
        let end = span.start.min(self.text.len());
        self.text.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1
    }
    fn err(&self, span: Option<&Range<usize>>, key: Option<&str>, message: impl fmt::Display) -> SweepError {
        at_line(self.file, span.map(|s| self.line(s)), key, message)
    }
    fn get<T: for<'de> Deserialize<'de>>(&self, key: &str, v: &Spanned<DeValue<'_>>) -> Result<T, SweepError> {
        T::deserialize(ValueDeserializer::from(v.clone())).map_err(|e| {
            let span = e.span().unwrap_or_else(|| v.span());
            self.err(Some(&span), Some(key), e.message())
        })
    }
    /// The axes of a table of dotted paths to lists of values (`[axes]`,
    /// or the `[[zip]]` of index `zip`), each with where its key starts.
    fn axes(&self, table: &DeTable<'_>, zip: Option<usize>) -> Result<Vec<(usize, Axis)>, SweepError> {
        let mut axes = Vec::new();
        for (k, v) in table.iter() {
            let path: &str = k.get_ref();
            let key = axis_key(zip, path);
            if path == "seed" {
                return Err(self.err(
                    Some(&k.span()),
                    Some(&key),
                    "the seed is not an axis; list seeds in the top-level `seeds`",
                ));
            }
            let values: Vec<toml::Value> = self.get(&key, v)?;
            if values.is_empty() {
                return Err(self.err(Some(&k.span()), Some(&key), "must list at least one value"));
            }
            axes.push((k.span().start, Axis { path: path.to_owned(), values, line: self.line(&k.span()), zip }));
        }
        // The file's order (the parsed table's own order need not be it).
        axes.sort_by_key(|(start, _)| *start);
        Ok(axes)
    }
}

/// One line: `file:line: key: message`, the message's white space folded.
fn at_line(file: &str, line: Option<usize>, key: Option<&str>, message: impl fmt::Display) -> SweepError {
    let mut s = file.to_owned();
    if let Some(line) = line {
        s.push_str(&format!(":{line}"));
    }
    s.push_str(": ");
    if let Some(k) = key {
        s.push_str(k);
        s.push_str(": ");
    }
    let message = message.to_string();
    s.push_str(&message.split_whitespace().collect::<Vec<_>>().join(" "));
    SweepError(s)
}

/// A path's key as the file writes it: `axes."decode.count"`, or
/// `zip[0]."decode.count"` in the first `[[zip]]`.
fn axis_key(zip: Option<usize>, path: &str) -> String {
    match zip {
        None => format!("axes.{path:?}"),
        Some(z) => format!("zip[{z}].{path:?}"),
    }
}

impl Sweep {
    /// Reads and checks the sweep file at `path` and the scenario it names;
    /// every value of every axis (every coordinate of every zip) is tried
    /// on the base scenario alone.
    ///
    /// # Errors
    /// The first problem, naming the file, line and key.
    pub fn load(path: impl AsRef<Path>) -> Result<Sweep, SweepError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let text = crate::files::read_text(path, crate::files::MAX_TEXT_BYTES)
            .map_err(|e| SweepError(format!("{file}: cannot read the sweep file: {e}")))?;
        Sweep::load_str(&text, &file, path.parent().unwrap_or(Path::new("")))
    }

    /// [`Sweep::load`] of a sweep given as TOML text, named `file` in
    /// errors; its `scenario` is relative to the folder `dir`.
    ///
    /// # Errors
    /// As [`Sweep::load`].
    pub fn load_str(text: &str, file: &str, dir: &Path) -> Result<Sweep, SweepError> {
        let text = text.strip_prefix(crate::files::BOM).unwrap_or(text);
        let file = file.to_owned();
        let doc = Doc { file: &file, text };
        let table = DeTable::parse(text).map_err(|e| doc.err(e.span().as_ref(), None, e.message()))?;
        let mut scenario_rel: Option<(String, Range<usize>)> = None;
        let mut seeds: Option<(Vec<u64>, Range<usize>)> = None;
        let mut requests = None;
        // Each dimension with where it starts in the file: a plain axis,
        // or the axes of one zip.
        let mut dims: Vec<(usize, Vec<Axis>)> = Vec::new();
        for (key, value) in table.get_ref().iter() {
            let name: &str = key.get_ref();
            match name {
                "scenario" => scenario_rel = Some((doc.get::<String>("scenario", value)?, key.span())),
                "seeds" => {
                    let list: Vec<u64> = doc.get("seeds", value)?;
                    if list.is_empty() {
                        return Err(doc.err(Some(&key.span()), Some("seeds"), "must list at least one seed"));
                    }
                    seeds = Some((list, key.span()));
                }
                "requests" => {
                    let n: u64 = doc.get("requests", value)?;
                    if n == 0 {
                        return Err(doc.err(Some(&key.span()), Some("requests"), "must be >= 1, got 0"));
                    }
                    requests = Some(n);
                }
                "axes" => {
                    let DeValue::Table(t) = value.get_ref() else {
                        return Err(doc.err(
                            Some(&value.span()),
                            Some("axes"),
                            "must be a table of dotted scenario paths to arrays of values",
                        ));
                    };
                    dims.extend(doc.axes(t, None)?.into_iter().map(|(start, a)| (start, vec![a])));
                }
                "zip" => {
                    let DeValue::Array(list) = value.get_ref() else {
                        return Err(doc.err(
                            Some(&value.span()),
                            Some("zip"),
                            "must be an array of tables: one [[zip]] per group of lists that advance together",
                        ));
                    };
                    for (z, entry) in list.iter().enumerate() {
                        let zkey = format!("zip[{z}]");
                        let DeValue::Table(t) = entry.get_ref() else {
                            return Err(doc.err(
                                Some(&entry.span()),
                                Some(&zkey),
                                "must be a table of dotted scenario paths to arrays of values",
                            ));
                        };
                        let axes = doc.axes(t, Some(z))?;
                        let Some((start, first)) = axes.first() else {
                            return Err(doc.err(
                                Some(&entry.span()),
                                Some(&zkey),
                                "is empty; give it the dotted scenario paths whose lists advance together",
                            ));
                        };
                        for (_, a) in &axes[1..] {
                            if a.values.len() != first.values.len() {
                                return Err(at_line(
                                    &file,
                                    Some(a.line),
                                    Some(&a.key()),
                                    format!(
                                        "lists {} value(s), but {} (line {}) lists {}; the lists of one [[zip]] \
                                         advance together, so they must have the same length",
                                        a.values.len(),
                                        first.key(),
                                        first.line,
                                        first.values.len()
                                    ),
                                ));
                            }
                        }
                        let start = *start;
                        dims.push((start, axes.into_iter().map(|(_, a)| a).collect()));
                    }
                }
                other => {
                    return Err(doc.err(
                        Some(&key.span()),
                        Some(other),
                        format!(
                            "unknown key `{other}`, expected one of {}",
                            SWEEP_KEYS.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
            }
        }
        // The file's order (the parsed table's own order need not be it).
        dims.sort_by_key(|(start, _)| *start);
        let mut axes: Vec<Axis> = Vec::new();
        let mut grid = Vec::new();
        for (_, group) in dims {
            let zip = group[0].zip;
            let len = group[0].values.len();
            let from = axes.len();
            axes.extend(group);
            grid.push(Dimension { axes: from..axes.len(), len, zip });
        }
        // A path varies in one place only, and not inside a path that
        // varies elsewhere (`workload.arrival` replaces the whole table its
        // `workload.arrival.rate_per_s` would vary; which one won would
        // depend on the order the overrides are applied in).
        let within = |inner: &str, outer: &str| {
            inner.len() > outer.len() && inner.starts_with(outer) && inner.as_bytes()[outer.len()] == b'.'
        };
        for (i, a) in axes.iter().enumerate() {
            if let Some(b) = axes[..i].iter().find(|b| b.path == a.path) {
                return Err(at_line(
                    &file,
                    Some(a.line),
                    Some(&a.key()),
                    format!(
                        "{} (line {}) already varies this path; a path may vary in one place only",
                        b.key(),
                        b.line
                    ),
                ));
            }
            if let Some(b) = axes[..i].iter().find(|b| within(&a.path, &b.path) || within(&b.path, &a.path)) {
                let (inner, outer) = if within(&a.path, &b.path) { (a, b) } else { (b, a) };
                return Err(at_line(
                    &file,
                    Some(a.line),
                    Some(&a.key()),
                    format!(
                        "overlaps {} (line {}): `{}` holds `{}`; a path may not vary inside another that varies",
                        b.key(),
                        b.line,
                        outer.path,
                        inner.path
                    ),
                ));
            }
        }
        let Some((rel, rel_span)) = scenario_rel else {
            return Err(doc.err(None, Some("scenario"), "missing key (the base scenario file, relative to this file)"));
        };
        let scenario_path = dir.join(&rel);
        let base = scenario::load(&scenario_path)
            .map_err(|e| doc.err(Some(&rel_span), Some("scenario"), format!("base scenario: {e}")))?;
        if requests.is_some()
            && let Some(a) = axes.iter().find(|a| a.path == "workload.requests")
        {
            return Err(at_line(
                &file,
                Some(a.line),
                Some(&a.key()),
                "conflicts with the top-level `requests`; give one of them",
            ));
        }
        let seeds = seeds.map_or_else(|| vec![base.seed()], |(s, _)| s);
        // Counted with checked arithmetic: a grid too large to count
        // (2^64 points or more) is refused rather than wrapped to a
        // small number.
        let len = grid.iter().map(|d| d.len).chain([seeds.len()]).try_fold(1usize, usize::checked_mul);
        let Some(len) = len else {
            let sizes: Vec<String> = grid.iter().map(|d| d.len.to_string()).chain([seeds.len().to_string()]).collect();
            return Err(at_line(
                &file,
                None,
                Some("axes"),
                format!(
                    "the grid has {} points (dimensions x seeds), more than pdsim can count (2^64 - 1); split \
                     it into several sweep files",
                    sizes.join(" x ")
                ),
            ));
        };
        let sweep = Sweep { file, scenario_path, base, seeds, requests, axes, dims: grid, len };
        // Each value of an axis alone, each coordinate of a zip as a
        // whole, so that an error names its key and value.
        for dim in &sweep.dims {
            for j in 0..dim.len {
                let axes = &sweep.axes[dim.axes.clone()];
                let overrides: Vec<(&str, toml::Value)> =
                    axes.iter().map(|a| (a.path.as_str(), a.values[j].clone())).collect();
                sweep.base.with_overrides(&overrides).map_err(|e| sweep.value_error(axes, j, &e))?;
            }
        }
        Ok(sweep)
    }

    /// Coordinate `j` of the dimension of `axes` (one plain axis, or a
    /// zip's) makes a bad scenario: the error names the axis whose path
    /// the scenario's field lies in (else the first), and the value(s).
    fn value_error(&self, axes: &[Axis], j: usize, e: &ScenarioError) -> SweepError {
        let within = |a: &&Axis| {
            e.field()
                .is_some_and(|f| f == a.path || f.strip_prefix(a.path.as_str()).is_some_and(|r| r.starts_with('.')))
        };
        let axis = axes.iter().find(within).unwrap_or(&axes[0]);
        let value = if axes.len() == 1 {
            format!("value {}", axis.values[j])
        } else {
            let described: Vec<String> = axes.iter().map(|a| format!("{:?} = {}", a.path, a.values[j])).collect();
            format!("coordinate {j} ({})", described.join(", "))
        };
        let field = e.field().map(|f| format!("{f}: ")).unwrap_or_default();
        at_line(
            &self.file,
            Some(axis.line),
            Some(&axis.key()),
            format!("{value} does not make a valid scenario: {field}{}", e.message()),
        )
    }

    /// Every axis, plain or of a zip, in file order: the axis columns of
    /// `sweep.csv`.
    pub fn axes(&self) -> &[Axis] {
        &self.axes
    }

    /// The axis columns of `sweep.csv`'s header, each followed by a comma.
    pub fn axes_header(&self) -> String {
        self.axes.iter().map(|a| crate::report::csv_field(&a.path) + ",").collect()
    }

    /// `sweep.csv`'s header (no newline): `point`, the axes, `seed`, then
    /// [`metric_header`]'s columns for these percentiles.
    pub fn header(&self, percentiles: &[f64]) -> String {
        format!("point,{}seed,{}", self.axes_header(), metric_header(percentiles))
    }

    /// The grid's dimensions, in file order (the first varies slowest),
    /// each a range of [`Sweep::axes`].
    pub fn dims(&self) -> &[Dimension] {
        &self.dims
    }

    /// The number of grid points (the product of the dimensions' lengths)
    /// times the number of seeds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The number of grid points, each run once per seed.
    pub fn grid_len(&self) -> usize {
        self.len / self.seeds.len()
    }

    /// Whether the sweep has no point (never, for a loaded sweep).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The axis values (one per [`Sweep::axes`]) and seed of point `index`
    /// (below [`Sweep::len`]). Points `g·S .. (g + 1)·S` (S seeds) are
    /// grid point `g` with each seed.
    pub fn coordinates(&self, index: usize) -> (Vec<toml::Value>, u64) {
        let seed = self.seeds[index % self.seeds.len()];
        let mut rest = index / self.seeds.len();
        let mut values = vec![toml::Value::Boolean(false); self.axes.len()];
        for dim in self.dims.iter().rev() {
            let j = rest % dim.len;
            for a in dim.axes.clone() {
                values[a] = self.axes[a].values[j].clone();
            }
            rest /= dim.len;
        }
        (values, seed)
    }

    /// Point `index`, its scenario built and checked.
    ///
    /// # Errors
    /// The axis values together make a scenario that fails a check; the
    /// message names the sweep file and the point's values.
    pub fn point(&self, index: usize) -> Result<Point, SweepError> {
        let (values, seed) = self.coordinates(index);
        let overrides: Vec<(&str, toml::Value)> =
            self.axes.iter().zip(&values).map(|(a, v)| (a.path.as_str(), v.clone())).collect();
        let mut scenario = if overrides.is_empty() {
            self.base.clone()
        } else {
            self.base.with_overrides(&overrides).map_err(|e| {
                let described: Vec<String> =
                    self.axes.iter().zip(&values).map(|(a, v)| format!("{} = {v}", a.key())).collect();
                let field = e.field().map(|f| format!("{f}: ")).unwrap_or_default();
                SweepError(format!(
                    "{}: point {index} ({}) does not make a valid scenario: {field}{}",
                    self.file,
                    described.join(", "),
                    e.message()
                ))
            })?
        };
        scenario.set_seed(seed);
        Ok(Point { index, values, seed, scenario })
    }

    /// The folder name of point `index` under `--reports`' `points/`
    /// ([`point_folder`] of its axis values and seed).
    pub fn point_folder(&self, index: usize) -> String {
        let (values, seed) = self.coordinates(index);
        let paths: Vec<&str> = self.axes.iter().map(|a| a.path.as_str()).collect();
        let texts: Vec<String> = values.iter().map(value_text).collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        point_folder(&paths, &texts, seed)
    }

    /// Every point, built and checked, in order (each holds its
    /// scenario: for a large grid, build them one at a time with
    /// [`Sweep::point`]).
    ///
    /// # Errors
    /// The first point that fails, as [`Sweep::point`].
    pub fn points(&self) -> Result<Vec<Point>, SweepError> {
        (0..self.len()).map(|i| self.point(i)).collect()
    }
}

/// The metric columns of `sweep.csv` (and `replicas.csv`) that are
/// pdsim's own, after `requests` and the `bench` fields: one naming scheme
/// with those, vLLM's `<statistic>_<metric>_<unit>` (`mean_transfer_wait_ms`
/// as `mean_ttft_ms`), or the quantity's name (`transfer_bytes`).
pub const OWN_COLUMNS: &[&str] = &[
    "slo_attainment",
    "mean_transfer_wait_ms",
    "mean_transfer_time_ms",
    "preemptions",
    "transfer_bytes",
    "prefill_hit_tokens",
    "decode_hit_tokens",
    "prefill_busy_share",
    "decode_busy_share",
    "aggregated_busy_share",
    "link_busy_share",
    "prefill_peak_kv_used_fraction",
    "decode_peak_kv_used_fraction",
    "aggregated_peak_kv_used_fraction",
    "overloaded",
    "bottleneck",
    "slo_ttft_ms",
    "slo_tpot_ms",
    "slo_e2e_ms",
    "digest",
];

/// The roles of the `<role>_busy_share` and `<role>_peak_kv_used_fraction`
/// columns, in column order.
const ROLES: [&str; 3] = ["prefill", "decode", "aggregated"];

/// A point's axis cells in `sweep.csv`, each followed by a comma.
pub fn axis_cells(values: &[toml::Value]) -> String {
    values.iter().map(|v| crate::report::csv_field(&value_text(v)) + ",").collect()
}

/// A point's `sweep.csv` row (no newline): its index, its axis cells
/// ([`axis_cells`]), its seed and its metric cells ([`metrics_cells`]).
pub fn row(index: usize, axis_cells: &str, seed: u64, metrics: &str) -> String {
    format!("{index},{axis_cells}{seed},{metrics}")
}

/// Rates, fractions and milliseconds with six decimals (the statistics
/// come from nanoseconds, so more digits would be rounding noise).
pub fn f6(x: f64) -> String {
    format!("{x:.6}")
}

/// Every metric column: `requests` (the requests that entered), the
/// `bench` fields under their report.json names (vLLM's result keys:
/// `completed`, `request_throughput`, `mean_ttft_ms`, `p99_ttft_ms`, …)
/// for these percentiles, then [`OWN_COLUMNS`]. Each statistic is in one
/// column under one name.
pub fn metric_header(percentiles: &[f64]) -> String {
    let mut cols: Vec<String> = vec!["requests".to_owned()];
    cols.extend(Bench::keys(percentiles));
    cols.extend(OWN_COLUMNS.iter().map(|c| (*c).to_owned()));
    cols.join(",")
}

/// The cells of [`metric_header`]'s columns (no newline), taken from the
/// run's report (so that every cell is the number report.json holds, to
/// six decimals).
pub fn metrics_cells(rep: &Report<'_>) -> String {
    let mut cells = rep.summary.requests.to_string();
    for (_, v) in rep.bench.entries() {
        cells.push(',');
        match v {
            Value::Int(i) => cells.push_str(&i.to_string()),
            Value::Float(x) => cells.push_str(&f6(x)),
            Value::Null => {}
        }
    }
    cells.push(',');
    cells.push_str(&own_cells(rep));
    cells
}

/// The cells of [`OWN_COLUMNS`].
fn own_cells(rep: &Report<'_>) -> String {
    let s = rep.summary;
    let mut cells = vec![
        f6(s.slo_attainment),
        f6(s.transfer_wait_ms.mean),
        f6(s.transfer_time_ms.mean),
        s.preemptions.to_string(),
        s.transfer_bytes.to_string(),
        s.prefill_hit_tokens.to_string(),
        s.decode_hit_tokens.to_string(),
    ];
    // A role the deployment does not have leaves its cells empty.
    let busy = |role: &str| rep.overload.busy_share.get(role).map_or_else(String::new, |b| f6(*b));
    cells.extend(ROLES.iter().chain(&["link"]).map(|r| busy(r)));
    cells.extend(ROLES.iter().map(|&role| {
        rep.ranks
            .iter()
            .filter(|r| r.role.as_str() == role)
            .map(|r| r.peak_used_fraction)
            .reduce(f64::max)
            .map_or_else(String::new, f6)
    }));
    // The overload check and its bottleneck (report.json's `overload`),
    // and the scenario's SLO bounds (empty when it sets none), so that a
    // sweep's page can mark overloaded points and draw the bounds.
    cells.push(rep.overload.overloaded.to_string());
    cells.push(rep.overload.bottleneck.unwrap_or("").to_owned());
    let slo = rep.scenario.resolved.get("slo");
    for bound in ["ttft_ms", "tpot_ms", "e2e_ms"] {
        cells.push(slo.and_then(|s| s.get(bound)).and_then(serde_json::Value::as_f64).map_or_else(String::new, f6));
    }
    cells.push(rep.digest.clone());
    cells.join(",")
}

/// What a sweep point's row is made from: the run of `scenario` with
/// `seed`, serving `requests` when given, with no record or timeline
/// sample kept (neither changes another number, so a point holds only
/// what is in flight), and the `bench` statistics at `percentiles`.
/// `stop`, once set, ends the run at its next progress slice
/// ([`crate::runner::Run::interrupted`]).
///
/// # Errors
/// As [`crate::runner::simulate`].
pub fn run_point(
    scenario: &Scenario,
    seed: u64,
    requests: Option<u64>,
    percentiles: &[f64],
    stop: &std::sync::atomic::AtomicBool,
) -> Result<crate::runner::Run, crate::runner::RunError> {
    let keep = crate::runner::Keep {
        timelines: false,
        record_sink: Some(Box::new(|_| {})),
        sample_sink: None,
        percentiles: percentiles.to_vec(),
        sketch_above: None,
    };
    crate::runner::simulate_with(scenario, seed, requests, |_| {}, stop, keep)
}

/// `K/N` of `--shard`: this is shard `k` (1-based) of `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// 1-based index, `1..=n`.
    pub k: usize,
    /// Number of shards, at least 1.
    pub n: usize,
}

impl Shard {
    /// The points of a `total`-point sweep this shard runs: the k-th of n
    /// contiguous slices, `(k − 1)·total/n .. k·total/n` (sizes differ by
    /// at most one), so that the shards' CSVs concatenated in shard order
    /// are the whole sweep's, row for row.
    pub fn range(&self, total: usize) -> std::ops::Range<usize> {
        let at = |k: usize| (k as u128 * total as u128 / self.n as u128) as usize;
        at(self.k - 1)..at(self.k)
    }
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("expected K/N with 1 <= K <= N (e.g. 2/8), got {s:?}");
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let (k, n): (usize, usize) = (k.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if n == 0 || k == 0 || k > n {
            return Err(bad());
        }
        Ok(Shard { k, n })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.k, self.n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_folders_name_their_values() {
        // A zip of two counts and a rate: the counts keep a component to
        // tell them apart, the rate its last one.
        let paths = ["prefill.count", "decode.count", "workload.arrival.rate_per_s"];
        assert_eq!(point_folder(&paths, &["1", "3", "4.0"], 2), "prefill.count=1,decode.count=3,rate_per_s=4.0,seed=2");
        // No axes: the seed alone.
        assert_eq!(point_folder(&[], &[], 7), "seed=7");
        // A path that is another's whole tail keeps all of itself.
        assert_eq!(short_keys(&["count", "decode.count"]), ["count", "decode.count"]);
        // Separators, slashes and dots-only values are escaped, so the name
        // is one component and different values give different names.
        let odd = point_folder(&["link.sharing"], &["../a/b,c=d%"], 1);
        assert_eq!(odd, "sharing=..%2Fa%2Fb%2Cc%3Dd%25,seed=1");
        assert!(!odd.contains('/'));
        assert_ne!(point_folder(&["x"], &["a b"], 1), point_folder(&["x"], &["a_b"], 1));
        assert_eq!(point_folder(&["x"], &["a b"], 1), "x=a%20b,seed=1");
        // Too long: cut, with the hash of the whole name.
        let long = "v".repeat(400);
        let a = point_folder(&["x"], &[&long], 1);
        let b = point_folder(&["x"], &[&long], 2);
        assert_eq!(a.len(), MAX_FOLDER_NAME);
        assert!(a.starts_with("x=vvv") && a.as_bytes()[MAX_FOLDER_NAME - 17] == b'~');
        assert_ne!(a, b);
    }

    #[test]
    fn shards_parse() {
        assert_eq!("2/3".parse::<Shard>(), Ok(Shard { k: 2, n: 3 }));
        for bad in ["0/3", "4/3", "1/0", "x/2", "3", ""] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        // 7 points in 3 shards: 7/3 = 2.33, so the cuts fall at 2 and 4.
        let ranges: Vec<_> = (1..=3).map(|k| Shard { k, n: 3 }.range(7)).collect();
        assert_eq!(ranges, vec![0..2, 2..4, 4..7]);
        // More shards than points: some shards run nothing.
        let ranges: Vec<_> = (1..=4).map(|k| Shard { k, n: 4 }.range(2)).collect();
        assert_eq!(ranges, vec![0..0, 0..1, 1..1, 1..2]);
    }
}
