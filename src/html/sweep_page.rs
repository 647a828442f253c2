//! The report of a sweep folder: every numeric metric column of
//! `sweep.csv` against every axis, one small chart per metric and axis,
//! one line per combination of the other axes' values (the mean over the
//! seeds, each seed a faint dot behind it), and the table of every row.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use super::read::{self, SweepTable};
use super::svg::{self, Axis, LINE_STROKES, Series, Style, XyChart, esc};
use super::{Kind, Page, ReportError, document, figure, int, num};

/// A sweep chart's size (viewBox units).
const W: f64 = 380.0;
const H: f64 = 240.0;

/// Rows listed in the page's table at most.
const TABLE_ROWS: usize = 2000;

/// Lines (combinations of the other axes' values) drawn per chart at most:
/// the first ones seen; a note says how many are left out.
const MAX_LINES: usize = 20;

/// Points a line is drawn with dots (and hover texts, and each seed's
/// faint dots) at most; longer lines are drawn as lines only.
const MAX_DOTS: usize = 200;

/// An axis with more values than this gets nice ticks instead of a tick
/// per value.
const MAX_VALUE_TICKS: usize = 20;

/// One dimension of the grid: an axis column, or the columns of a
/// `[[zip]]` (whose values advance together: each determines the others);
/// its distinct values (joined by " / " for a zip) in the order they first
/// appear, and their numbers when it is one column of numbers.
struct AxisInfo {
    name: String,
    /// Its columns in words with their units ([`words`]).
    title: String,
    columns: Vec<usize>,
    values: Vec<String>,
    numbers: Option<Vec<f64>>,
    /// Each value's index in `values` (lookups only: the order is `values`').
    index: HashMap<String, usize>,
}

/// The value of dimension `columns` in a row's axis cells.
fn dim_value(cells: &[String], columns: &[usize]) -> String {
    columns.iter().map(|&c| cells[c].as_str()).collect::<Vec<_>>().join(" / ")
}

/// Whether the axis columns `a` and `b` advance together: each has two
/// values or more, and one's value determines the other's in every row (a
/// `[[zip]]`, even one with a repeated value such as fifo, ps, fifo with
/// three rates; independent axes of a full grid never do).
fn zipped(t: &SweepTable, a: usize, b: usize) -> bool {
    // For each value of one column, the other's value, or None once it
    // has had two.
    let mut a_to_b: HashMap<&str, Option<&str>> = HashMap::new();
    let mut b_to_a: HashMap<&str, Option<&str>> = HashMap::new();
    fn note<'a>(m: &mut HashMap<&'a str, Option<&'a str>>, k: &'a str, v: &'a str) {
        let e = m.entry(k).or_insert(Some(v));
        if *e != Some(v) {
            *e = None;
        }
    }
    for r in &t.rows {
        let (x, y) = (r.axes[a].as_str(), r.axes[b].as_str());
        note(&mut a_to_b, x, y);
        note(&mut b_to_a, y, x);
    }
    let determines = |m: &HashMap<&str, Option<&str>>| m.values().all(Option::is_some);
    a_to_b.len() >= 2 && b_to_a.len() >= 2 && (determines(&a_to_b) || determines(&b_to_a))
}

/// The grid's dimensions: axis columns, zipped ones joined.
fn dimensions(t: &SweepTable) -> Vec<AxisInfo> {
    let mut dims: Vec<Vec<usize>> = Vec::new();
    for c in 0..t.axes.len() {
        match dims.iter_mut().find(|d| zipped(t, d[0], c)) {
            Some(d) => d.push(c),
            None => dims.push(vec![c]),
        }
    }
    dims.into_iter()
        .map(|columns| {
            let mut values: Vec<String> = Vec::new();
            let mut index: HashMap<String, usize> = HashMap::new();
            for r in &t.rows {
                let v = dim_value(&r.axes, &columns);
                if !index.contains_key(&v) {
                    index.insert(v.clone(), values.len());
                    values.push(v);
                }
            }
            let numbers = if columns.len() == 1 { values.iter().map(|v| number(v)).collect() } else { None };
            let name = columns.iter().map(|&c| t.axes[c].as_str()).collect::<Vec<_>>().join(" / ");
            let title = columns.iter().map(|&c| words(&t.axes[c])).collect::<Vec<_>>().join(" / ");
            AxisInfo { name, title, columns, values, numbers, index }
        })
        .collect()
}

impl AxisInfo {
    fn position(&self, v: &str) -> f64 {
        let i = self.index.get(v).copied().unwrap_or(0);
        match &self.numbers {
            Some(n) => n[i],
            None => i as f64,
        }
    }

    /// The chart axis: ticks at the axis's values, as sweep.csv writes
    /// them; logarithmic when they are positive and span two decades.
    fn chart_axis(&self) -> Axis {
        match &self.numbers {
            Some(n) => {
                let (lo, hi) = n.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
                let ticks: Vec<(f64, String)> = n.iter().copied().zip(self.values.iter().cloned()).collect();
                let axis = if n.len() >= 3 && lo > 0.0 && hi / lo >= 100.0 {
                    Axis::log(format!("{} (log scale)", self.title))
                } else {
                    Axis::linear(self.title.clone())
                };
                // Many values: nice ticks (a tick and a grid line per value
                // would make each chart megabytes).
                if ticks.len() > MAX_VALUE_TICKS { axis } else { axis.ticks_at(ticks) }
            }
            None => Axis::categories(self.title.clone(), self.values.clone()),
        }
    }
}

/// Why a metric column is not drawn.
enum Skip {
    NotNumbers,
    Constant(String),
    SameAs(String),
}

/// A cell as a number (an empty cell, a null goodput, is none).
fn number(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|x| x.is_finite())
}

fn same(a: &[Option<f64>], b: &[Option<f64>]) -> bool {
    a.iter().zip(b).all(|(x, y)| match (x, y) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1e-12),
        (None, None) => true,
        _ => false,
    })
}

/// A latency or stage name in words.
fn latency_words(m: &str) -> Option<&'static str> {
    Some(match m {
        "ttft" => "TTFT",
        "tpot" => "TPOT",
        "itl" => "ITL",
        "e2e" | "e2el" => "E2E",
        "transfer_wait" => "transfer wait",
        "transfer_time" => "transfer time",
        "prefill_queue" => "prefill queue",
        "prefill_time" => "prefill time",
        "decode_queue" => "decode queue",
        _ => return None,
    })
}

/// A statistic's name in words (`p99`, `mean`, `p99.9`).
fn stat_words(s: &str) -> Option<String> {
    match s {
        "mean" | "median" | "std" | "max" => Some(s.to_owned()),
        "p50" => Some("median (p50)".to_owned()),
        p if p.strip_prefix('p').is_some_and(|n| n.parse::<f64>().is_ok()) => Some(p.to_owned()),
        _ => None,
    }
}

/// A sweep.csv column (an axis's dotted scenario path, or a metric) as a
/// chart's title in words with its unit: `workload.arrival.rate_per_s` is
/// "arrival rate (req/s)", `p99_ttft_ms` "TTFT p99 (ms)". An unknown
/// column's last component, its underscores as spaces, with the unit its
/// suffix names.
pub(crate) fn words(column: &str) -> String {
    let known = match column {
        "workload.arrival.rate_per_s" => Some("arrival rate (req/s)"),
        "workload.arrival.cv" => Some("arrival gaps' coefficient of variation"),
        "workload.arrival.concurrency" => Some("requests in flight (closed loop)"),
        "workload.requests" | "requests" => Some("requests"),
        "link.bandwidth_gb_s" => Some("link bandwidth (GB/s)"),
        "link.latency_us" => Some("link latency (µs)"),
        "link.sharing" => Some("link sharing"),
        "link.topology" => Some("link topology"),
        "completed" => Some("completed requests"),
        "failed" => Some("failed requests"),
        "request_throughput" => Some("request throughput (req/s)"),
        "output_token_throughput" | "output_throughput" => Some("output throughput (tokens/s)"),
        "total_token_throughput" => Some("total throughput (tokens/s)"),
        "goodput" | "request_goodput" => Some("goodput (req/s)"),
        "slo_attainment" => Some("SLO attainment (share of requests)"),
        "preemptions" => Some("preemptions"),
        "transfer_bytes" => Some("bytes transferred"),
        "prefill_hit_tokens" => Some("prefill-side prefix hits (tokens)"),
        "decode_hit_tokens" => Some("decode-side prefix hits (tokens)"),
        "duration" => Some("duration (s)"),
        "total_input_tokens" => Some("input tokens"),
        "total_output_tokens" => Some("output tokens"),
        "max_output_tokens_per_s" => Some("most output tokens in 1 s"),
        "max_concurrent_requests" => Some("most requests in 1 s"),
        _ => None,
    };
    if let Some(k) = known {
        return k.to_owned();
    }
    // Metrics: {latency}_{stat}_ms (the summary's) or {stat}_{latency}_ms
    // (bench's, whose percentile may hold a point: p99.9_ttft_ms).
    if let Some(base) = column.strip_suffix("_ms") {
        for (i, _) in base.match_indices('_') {
            let (a, b) = (&base[..i], &base[i + 1..]);
            if let (Some(l), Some(st)) = (latency_words(a), stat_words(b)) {
                return format!("{l} {st} (ms)");
            }
            if let (Some(st), Some(l)) = (stat_words(a), latency_words(b)) {
                return format!("{l} {st} (ms)");
            }
        }
    }
    let parts: Vec<&str> = column.split('.').collect();
    let last = parts.last().copied().unwrap_or(column);
    // A role's field: `decode.count` "decode ranks".
    if parts.len() == 2 && ["prefill", "decode", "aggregated"].contains(&parts[0]) {
        let role = parts[0];
        let what = match last {
            "count" => Some(format!("{role} ranks")),
            "num_blocks" => Some(format!("{role} KV pool (blocks)")),
            "tp" => Some(format!("{role} TP size")),
            "max_num_batched_tokens" => Some(format!("{role} token budget per step (tokens)")),
            "max_num_seqs" => Some(format!("{role} sequences per step at most")),
            _ => None,
        };
        if let Some(w) = what {
            return w;
        }
    }
    // {role}_busy_share; {role}_peak_kv_used_fraction.
    if let Some(role) = last.strip_suffix("_busy_share") {
        return format!("{role} busy share");
    }
    if let Some(role) = last.strip_suffix("_peak_kv_used_fraction") {
        return format!("{role} peak KV use (share of pool)");
    }
    let units: [(&str, &str); 9] = [
        ("_per_s", "/s"),
        ("_gb_s", "GB/s"),
        ("_ms", "ms"),
        ("_us", "µs"),
        ("_s", "s"),
        ("_bytes", "bytes"),
        ("_tokens", "tokens"),
        ("_blocks", "blocks"),
        ("_fraction", "share"),
    ];
    for (suffix, unit) in units {
        if let Some(stem) = last.strip_suffix(suffix).filter(|s| !s.is_empty()) {
            return format!("{} ({unit})", stem.replace('_', " "));
        }
    }
    last.replace('_', " ")
}

/// Renders the sweep folder `dir` (which holds `sweep.csv`).
pub fn render(dir: &Path) -> Result<Page, ReportError> {
    let path = dir.join("sweep.csv");
    let t = read::sweep_table(&path, &path.display().to_string())?;
    let axes = dimensions(&t);
    // Each row's value on each dimension.
    let keys: Vec<Vec<String>> =
        t.rows.iter().map(|r| axes.iter().map(|a| dim_value(&r.axes, &a.columns)).collect()).collect();
    // Classify the metric columns.
    let columns: Vec<Vec<Option<f64>>> =
        (0..t.metrics.len()).map(|m| t.rows.iter().map(|r| number(&r.metrics[m])).collect()).collect();
    let mut drawn: Vec<usize> = Vec::new();
    let mut skipped: Vec<(usize, Skip)> = Vec::new();
    for (m, col) in columns.iter().enumerate() {
        let present: Vec<f64> = col.iter().flatten().copied().collect();
        // The digest is hex: a number only by accident.
        if present.is_empty() || t.metrics[m] == "digest" {
            skipped.push((m, Skip::NotNumbers));
        } else if t.rows.len() > 1 && col.iter().all(|x| *x == col[0]) {
            skipped.push((m, Skip::Constant(t.rows[0].metrics[m].clone())));
        } else if let Some(&d) = drawn.iter().find(|&&d| same(&columns[d], col)) {
            skipped.push((m, Skip::SameAs(t.metrics[d].clone())));
        } else {
            drawn.push(m);
        }
    }
    let seeds: Vec<&str> = {
        let mut s: Vec<&str> = Vec::new();
        let mut seen: HashSet<&str> = HashSet::new();
        for r in &t.rows {
            if seen.insert(r.seed.as_str()) {
                s.push(&r.seed);
            }
        }
        s
    };
    // Each row's overload flag, and the SLO bounds when each is one number
    // in every row.
    let col = |name: &str| t.metrics.iter().position(|m| m == name);
    let overloaded: Vec<bool> = match col("overloaded") {
        Some(c) => t.rows.iter().map(|r| r.metrics[c] == "true").collect(),
        None => vec![false; t.rows.len()],
    };
    let slo = ["slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms"].map(|name| {
        let c = col(name)?;
        let first = number(&t.rows.first()?.metrics[c])?;
        t.rows.iter().all(|r| number(&r.metrics[c]) == Some(first)).then_some(first)
    });
    let mut body = String::new();
    let mut charts = 0;
    let _ = writeln!(body, "<header><h1>pdsim sweep report</h1>");
    let points: usize = axes.iter().map(|a| a.values.len()).product::<usize>().max(1);
    let _ = writeln!(
        body,
        "<p class=\"meta\">{} rows of sweep.csv: {} axis point(s) × {} seed(s) · {} metric columns, {} drawn against each axis</p>",
        int(t.rows.len() as u64),
        int(points as u64),
        seeds.len(),
        t.metrics.len(),
        drawn.len()
    );
    body.push_str("<ul>");
    for a in &axes {
        let zip = if a.columns.len() > 1 { " (zipped: they advance together)" } else { "" };
        // The first values only: a sweep can have tens of thousands.
        let mut list = a.values.iter().take(MAX_VALUE_TICKS * 2).cloned().collect::<Vec<_>>().join(", ");
        if a.values.len() > MAX_VALUE_TICKS * 2 {
            let _ = write!(list, ", … ({} values)", a.values.len());
        }
        let _ = write!(body, "<li>{} (<code>{}</code>){zip}: {}</li>", esc(&a.title), esc(&a.name), esc(&list));
    }
    let _ = write!(body, "<li>seeds: {}</li>", esc(&seeds.join(", ")));
    body.push_str("</ul>\n");
    body.push_str("<nav>");
    for (i, a) in axes.iter().enumerate() {
        let _ = write!(body, "<a href=\"#axis-{i}\">against {}</a>", esc(&a.title));
    }
    body.push_str("<a href=\"#rows\">all rows</a></nav>\n</header>\n");
    if axes.is_empty() {
        body.push_str(
            "<p class=\"note\">The sweep has no axes: nothing to draw a metric against; its rows are below.</p>\n",
        );
    }
    if t.rows.is_empty() {
        body.push_str("<p class=\"note\">sweep.csv has no rows.</p>\n");
    }
    if !t.rows.is_empty() {
        for ai in 0..axes.len() {
            let d = Drawn {
                t: &t,
                axes: &axes,
                keys: &keys,
                drawn: &drawn,
                columns: &columns,
                seeds: seeds.len(),
                overloaded: &overloaded,
                slo,
            };
            charts += axis_section(&mut body, &d, ai);
        }
    }
    if !skipped.is_empty() {
        body.push_str("<h2>Columns not drawn</h2><ul data-skipped=\"1\">");
        let group = |f: &dyn Fn(&Skip) -> Option<String>| -> Vec<String> {
            skipped
                .iter()
                .filter_map(|(m, s)| f(s).map(|x| format!("<code>{}</code>{}", esc(&t.metrics[*m]), x)))
                .collect()
        };
        let constant = group(&|s| match s {
            Skip::Constant(v) => Some(format!(" ({})", esc(v))),
            _ => None,
        });
        let same = group(&|s| match s {
            Skip::SameAs(o) => Some(format!(" (= <code>{}</code>)", esc(o))),
            _ => None,
        });
        let text = group(&|s| matches!(s, Skip::NotNumbers).then(String::new));
        for (what, list) in
            [("the same in every row", constant), ("equal to an earlier column", same), ("not numbers", text)]
        {
            if !list.is_empty() {
                let _ = write!(body, "<li>{what}: {}</li>", list.join(", "));
            }
        }
        body.push_str("</ul>\n");
    }
    rows_table(&mut body, &t);
    let _ = writeln!(
        body,
        "<footer>Made by <code>pdsim report</code> (pdsim {}) from sweep.csv.</footer>",
        esc(crate::report::PDSIM_VERSION)
    );
    Ok(Page { kind: Kind::Sweep, html: document("pdsim sweep report", &body), charts, missing: Vec::new() })
}

/// The charts of every drawn metric against axis `ai`; returns how many.
/// What the charts of every axis draw from.
struct Drawn<'a> {
    t: &'a SweepTable,
    axes: &'a [AxisInfo],
    /// Each row's value on each dimension.
    keys: &'a [Vec<String>],
    /// The metric columns drawn.
    drawn: &'a [usize],
    /// Each metric column's numbers, row by row.
    columns: &'a [Vec<Option<f64>>],
    /// How many seeds.
    seeds: usize,
    /// Each row's `overloaded` cell (false when the column is absent).
    overloaded: &'a [bool],
    /// The SLO bounds (`slo_ttft_ms`, `slo_tpot_ms`, `slo_e2e_ms`), each
    /// when it is one number in every row.
    slo: [Option<f64>; 3],
}

impl Drawn<'_> {
    /// The SLO bound a latency column is held to: TTFT, TPOT or E2E
    /// statistics in ms (not their std).
    fn slo_for(&self, metric: &str) -> Option<f64> {
        let base = metric.strip_suffix("_ms")?;
        if base.starts_with("std_") || base.starts_with("slo_") {
            return None;
        }
        let parts: Vec<&str> = base.split('_').collect();
        let i = if parts.contains(&"ttft") {
            0
        } else if parts.contains(&"tpot") {
            1
        } else if parts.contains(&"e2e") || parts.contains(&"e2el") {
            2
        } else {
            return None;
        };
        self.slo[i]
    }
}

/// One x of a line: its position, its label, its values over the seeds,
/// and whether any seed's run was overloaded.
type At = (f64, String, Vec<f64>, bool);

fn axis_section(body: &mut String, d: &Drawn<'_>, ai: usize) -> usize {
    let Drawn { t, axes, keys, drawn, columns, seeds, .. } = *d;
    let a = &axes[ai];
    let others: Vec<usize> = (0..axes.len()).filter(|&o| o != ai).collect();
    // One line per combination of the other axes' values, in first-seen order.
    let mut lines: Vec<Vec<&str>> = Vec::new();
    let mut line_index: HashMap<Vec<&str>, usize> = HashMap::new();
    // The rows of each line, in file order.
    let mut rows_of: Vec<Vec<usize>> = Vec::new();
    for (r, row) in keys.iter().enumerate() {
        let key: Vec<&str> = others.iter().map(|&o| row[o].as_str()).collect();
        let i = *line_index.entry(key.clone()).or_insert_with(|| {
            lines.push(key);
            rows_of.push(Vec::new());
            lines.len() - 1
        });
        rows_of[i].push(r);
    }
    let all_lines = lines.len();
    lines.truncate(MAX_LINES);
    let line_name = |k: &[&str]| -> String {
        if others.is_empty() {
            "every point".to_owned()
        } else {
            others.iter().zip(k).map(|(&o, v)| format!("{} = {v}", axes[o].title)).collect::<Vec<_>>().join(", ")
        }
    };
    let _ = writeln!(
        body,
        "<section id=\"axis-{ai}\"><h2>Metrics against {} (<code>{}</code>)</h2>",
        esc(&a.title),
        esc(&a.name)
    );
    let legend: Vec<(usize, String, bool)> = lines
        .iter()
        .enumerate()
        .map(|(i, k)| (i, line_name(k), LINE_STROKES[i % LINE_STROKES.len()].1.is_some()))
        .collect();
    if others.is_empty() {
        body.push_str("<p class=\"note\">One axis: a dot per point");
    } else {
        body.push_str("<p class=\"note\">One line per value of the other axes");
    }
    if seeds > 1 {
        body.push_str(&format!(", the mean over its {seeds} seeds; each seed's value is a faint dot"));
    }
    if all_lines > lines.len() {
        let _ = write!(body, "; only the first {} of its {all_lines} lines are drawn", lines.len());
    }
    if d.overloaded.iter().any(|&o| o) {
        body.push_str(
            "; a ring marks a point where a seed's run was overloaded (report.json's <code>overload</code>: it served less than came, its backlog and wait growing), so its numbers are those of a run that would not settle",
        );
    }
    body.push_str(".</p>\n");
    body.push_str(&svg::legend(&legend));
    body.push_str("<div class=\"charts small\">\n");
    let mut n = 0;
    for &m in drawn {
        let metric = &t.metrics[m];
        let title = words(metric);
        let mut per_line: Vec<Vec<At>> = Vec::new();
        for rows in rows_of.iter().take(lines.len()) {
            // (x, values over seeds) in the axis's value order; an x whose
            // rows have no value (an empty cell) leaves a gap in the line.
            let mut at: Vec<At> = Vec::new();
            let mut at_index: HashMap<u64, usize> = HashMap::new();
            for &r in rows {
                let key = &keys[r];
                let x = a.position(&key[ai]);
                // By bits, with -0 as 0 (the positions are finite).
                let bits = if x == 0.0 { 0 } else { x.to_bits() };
                let i = *at_index.entry(bits).or_insert_with(|| {
                    at.push((x, key[ai].clone(), Vec::new(), false));
                    at.len() - 1
                });
                if let Some(v) = columns[m][r] {
                    at[i].2.push(v);
                }
                at[i].3 |= d.overloaded.get(r).copied().unwrap_or(false);
            }
            at.sort_by(|p, q| p.0.total_cmp(&q.0));
            per_line.push(at);
        }
        let mean = |v: &[f64]| if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
        // A log scale when the values span over 20 times (an overloaded
        // point's TTFT beside stable ones'), so the stable ones are not
        // squashed at the bottom; the SLO bound counts.
        // Latencies only (a share or a rate reads better on its linear
        // axis).
        let slo = d.slo_for(metric);
        let values: Vec<f64> = per_line.iter().flatten().flat_map(|p| p.2.iter().copied()).collect();
        let span = |v: &mut dyn Iterator<Item = f64>| {
            v.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)))
        };
        let (lo, hi) = span(&mut values.iter().copied().chain(slo));
        let log = metric.ends_with("_ms") && lo > 0.0 && hi / lo >= 20.0;
        // An SLO far above every point on a linear axis would squash them:
        // it is then said, not drawn.
        let (_, top) = span(&mut values.iter().copied());
        let slo_drawn = slo.filter(|&v| log || v <= 2.0 * top);
        let y = if log { Axis::log(format!("{title} (log scale)")) } else { Axis::linear(title.clone()) };
        let mut c = XyChart::new(a.chart_axis(), y, W, H);
        if let Some(v) = slo_drawn {
            c.hline(v, format!("SLO {}", num(v)));
        }
        let mut dots_left_out = false;
        let mut seeds_cut = false;
        let mut any_overloaded = false;
        for (li, key) in lines.iter().enumerate() {
            let at = &per_line[li];
            if at.iter().all(|p| p.2.is_empty()) {
                continue;
            }
            let name = line_name(key);
            // Lines that coincide stay apart: wide and solid under narrow
            // and dashed.
            let (width, dash) = LINE_STROKES[li % LINE_STROKES.len()];
            let pts: Vec<(f64, f64)> = at.iter().map(|p| (p.0, mean(&p.2))).collect();
            if pts.len() > MAX_DOTS {
                // A line only (thinned to the pixels when drawn).
                dots_left_out = true;
                c.push(Series::new(name, li, Style::Line, pts).stroke(width, dash));
                continue;
            }
            let text = |p: &At, y: f64| {
                let seeds = if p.2.len() > 1 { format!(" (mean of {})", p.2.len()) } else { String::new() };
                let others = if others.is_empty() { String::new() } else { format!(", {name}") };
                let over = if p.3 { "; overloaded" } else { "" };
                format!("{}={}{others}: {metric} = {}{seeds}{over}", a.name, p.1, num(y))
            };
            if seeds > 1 {
                // At most MAX_DOTS faint dots a line: past that, at each x
                // the seeds' values at evenly spaced ranks (the lowest and
                // highest among them), so the page does not grow with the
                // seeds.
                let per_x = (MAX_DOTS / pts.len()).max(2);
                let mut faint: Vec<(f64, f64)> = Vec::new();
                for p in at {
                    if p.2.len() <= per_x {
                        faint.extend(p.2.iter().map(|v| (p.0, *v)));
                    } else {
                        seeds_cut = true;
                        let mut v = p.2.clone();
                        v.sort_by(f64::total_cmp);
                        let last = v.len() - 1;
                        faint.extend((0..per_x).map(|i| (p.0, v[(i * last + (per_x - 1) / 2) / (per_x - 1)])));
                    }
                }
                c.push(Series::new(format!("{name}: each seed"), li, Style::FaintDots, faint));
            }
            c.push(Series::new(name.clone(), li, Style::Line, pts.clone()).stroke(width, dash));
            // Stable points filled, overloaded ones as rings.
            for over in [false, true] {
                let (p, titles): (Vec<(f64, f64)>, Vec<String>) = at
                    .iter()
                    .zip(&pts)
                    .filter(|(p, q)| p.3 == over && q.1.is_finite())
                    .map(|(p, q)| (*q, text(p, q.1)))
                    .unzip();
                if p.is_empty() {
                    continue;
                }
                any_overloaded |= over;
                let dots = Series::new(name.clone(), li, Style::Dots, p).titles(titles);
                c.push(if over { dots.hollow() } else { dots });
            }
        }
        let id = format!("{metric}@{}", a.name);
        let mut sub = vec![metric.clone()];
        if dots_left_out {
            sub.push(format!("lines of over {MAX_DOTS} points are drawn without dots"));
        }
        if seeds_cut {
            sub.push(format!(
                "at most {MAX_DOTS} seed dots a line: where a point has more seeds, those at evenly spaced ranks, lowest and highest included"
            ));
        }
        if any_overloaded {
            sub.push("rings: overloaded".to_owned());
        }
        match (slo, slo_drawn) {
            (Some(v), Some(_)) => sub.push(format!("dashed: the SLO, {} ms", num(v))),
            (Some(v), None) => sub.push(format!("the SLO, {} ms, is far above every point", num(v))),
            _ => {}
        }
        body.push_str(&figure(&id, &title, &sub.join("; "), &c.svg(), ""));
        n += 1;
    }
    body.push_str("</div></section>\n");
    n
}

fn rows_table(body: &mut String, t: &SweepTable) {
    let _ = writeln!(
        body,
        "<section id=\"rows\"><h2>All rows</h2><details><summary>sweep.csv: {} rows × {} columns</summary><div class=\"scroll\"><table><tr><th>point</th>",
        int(t.rows.len() as u64),
        2 + t.axes.len() + t.metrics.len()
    );
    for h in t.axes.iter().chain(std::iter::once(&"seed".to_owned())).chain(&t.metrics) {
        let _ = write!(body, "<th>{}</th>", esc(h));
    }
    body.push_str("</tr>\n");
    for r in t.rows.iter().take(TABLE_ROWS) {
        let _ = write!(body, "<tr><td>{}</td>", r.point);
        for c in r.axes.iter().chain(std::iter::once(&r.seed)).chain(&r.metrics) {
            let _ = write!(body, "<td>{}</td>", esc(c));
        }
        body.push_str("</tr>\n");
    }
    body.push_str("</table></div>");
    if t.rows.len() > TABLE_ROWS {
        let _ = write!(body, "<p class=\"note\">The first {TABLE_ROWS} rows; sweep.csv has them all.</p>");
    }
    body.push_str("</details></section>\n");
}

#[cfg(test)]
mod tests {
    use super::words;

    #[test]
    fn columns_read_as_words_with_units() {
        for (column, want) in [
            ("workload.arrival.rate_per_s", "arrival rate (req/s)"),
            ("link.bandwidth_gb_s", "link bandwidth (GB/s)"),
            ("decode.count", "decode ranks"),
            ("prefill.num_blocks", "prefill KV pool (blocks)"),
            ("ttft_mean_ms", "TTFT mean (ms)"),
            ("p99_ttft_ms", "TTFT p99 (ms)"),
            ("p99.9_e2el_ms", "E2E p99.9 (ms)"),
            ("median_tpot_ms", "TPOT median (ms)"),
            ("transfer_wait_mean_ms", "transfer wait mean (ms)"),
            ("decode_busy_share", "decode busy share"),
            ("prefill_peak_kv_used_fraction", "prefill peak KV use (share of pool)"),
            ("request_throughput", "request throughput (req/s)"),
            // Unknown: the last component, with the unit its suffix names.
            ("faults.source_hold_s", "source hold (s)"),
            ("model.foo_bar", "foo bar"),
        ] {
            assert_eq!(words(column), want, "{column}");
        }
    }
}
