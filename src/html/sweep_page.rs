//! The report of a sweep folder: every numeric metric column of
//! `sweep.csv` against every axis, one small chart per metric and axis,
//! one line per combination of the other axes' values (the mean over the
//! seeds, each seed a faint dot behind it), and the table of every row.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use super::read::{self, SweepTable};
use super::svg::{self, Axis, Series, Style, XyChart, esc};
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
            AxisInfo { name, columns, values, numbers, index }
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
                    Axis::log(format!("{} (log scale)", self.name))
                } else {
                    Axis::linear(self.name.clone())
                };
                // Many values: nice ticks (a tick and a grid line per value
                // would make each chart megabytes).
                if ticks.len() > MAX_VALUE_TICKS { axis } else { axis.ticks_at(ticks) }
            }
            None => Axis::categories(self.name.clone(), self.values.clone()),
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

/// The label of a metric's values, from its name.
fn unit(metric: &str) -> String {
    if metric.ends_with("_ms") { format!("{metric} (ms)") } else { metric.to_owned() }
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
        let _ = write!(body, "<li><code>{}</code>{zip}: {}</li>", esc(&a.name), esc(&list));
    }
    let _ = write!(body, "<li>seeds: {}</li>", esc(&seeds.join(", ")));
    body.push_str("</ul>\n");
    body.push_str("<nav>");
    for (i, a) in axes.iter().enumerate() {
        let _ = write!(body, "<a href=\"#axis-{i}\">against {}</a>", esc(&a.name));
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
            let d = Drawn { t: &t, axes: &axes, keys: &keys, drawn: &drawn, columns: &columns, seeds: seeds.len() };
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
}

fn axis_section(body: &mut String, d: &Drawn<'_>, ai: usize) -> usize {
    let Drawn { t, axes, keys, drawn, columns, seeds } = *d;
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
            others.iter().zip(k).map(|(&o, v)| format!("{}={v}", axes[o].name)).collect::<Vec<_>>().join(", ")
        }
    };
    let _ = writeln!(body, "<section id=\"axis-{ai}\"><h2>Metrics against <code>{}</code></h2>", esc(&a.name));
    let legend: Vec<(usize, String, bool)> = lines.iter().enumerate().map(|(i, k)| (i, line_name(k), false)).collect();
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
    body.push_str(".</p>\n");
    body.push_str(&svg::legend(&legend));
    body.push_str("<div class=\"charts small\">\n");
    let mut n = 0;
    for &m in drawn {
        let metric = &t.metrics[m];
        let mut c = XyChart::new(a.chart_axis(), Axis::linear(unit(metric)), W, H);
        let mut dots_left_out = false;
        let mut seeds_cut = false;
        for (li, key) in lines.iter().enumerate() {
            // (x, values over seeds) in the axis's value order; an x whose
            // rows have no value (an empty cell) leaves a gap in the line.
            let mut at: Vec<(f64, String, Vec<f64>)> = Vec::new();
            let mut at_index: HashMap<u64, usize> = HashMap::new();
            for &r in &rows_of[li] {
                let key = &keys[r];
                let x = a.position(&key[ai]);
                // By bits, with -0 as 0 (the positions are finite).
                let bits = if x == 0.0 { 0 } else { x.to_bits() };
                let i = *at_index.entry(bits).or_insert_with(|| {
                    at.push((x, key[ai].clone(), Vec::new()));
                    at.len() - 1
                });
                if let Some(v) = columns[m][r] {
                    at[i].2.push(v);
                }
            }
            if at.iter().all(|p| p.2.is_empty()) {
                continue;
            }
            at.sort_by(|p, q| p.0.total_cmp(&q.0));
            let name = line_name(key);
            let mean = |v: &[f64]| if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
            let pts: Vec<(f64, f64)> = at.iter().map(|p| (p.0, mean(&p.2))).collect();
            if pts.len() > MAX_DOTS {
                // A line only (thinned to the pixels when drawn).
                dots_left_out = true;
                c.push(Series::new(name, li, Style::Line, pts));
                continue;
            }
            let titles: Vec<String> = at
                .iter()
                .zip(&pts)
                .map(|(p, q)| {
                    let seeds = if p.2.len() > 1 { format!(" (mean of {})", p.2.len()) } else { String::new() };
                    let others = if others.is_empty() { String::new() } else { format!(", {name}") };
                    format!("{}={}{others}: {metric} = {}{seeds}", a.name, p.1, num(q.1))
                })
                .collect();
            if seeds > 1 {
                // At most MAX_DOTS faint dots a line: past that, at each x
                // the seeds' values at evenly spaced ranks (the lowest and
                // highest among them), so the page does not grow with the
                // seeds.
                let per_x = (MAX_DOTS / pts.len()).max(2);
                let mut faint: Vec<(f64, f64)> = Vec::new();
                for p in &at {
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
            c.push(Series::new(name, li, Style::LineDots, pts).titles(titles));
        }
        let id = format!("{metric}@{}", a.name);
        let mut cuts = Vec::new();
        if dots_left_out {
            cuts.push(format!("lines of over {MAX_DOTS} points are drawn without dots"));
        }
        if seeds_cut {
            cuts.push(format!(
                "at most {MAX_DOTS} seed dots a line: where a point has more seeds, those at evenly spaced ranks, lowest and highest included"
            ));
        }
        let sub = cuts.join("; ");
        body.push_str(&figure(&id, metric, &sub, &c.svg(), ""));
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
