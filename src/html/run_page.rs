//! The report of one run folder: the summary tables from `report.json`,
//! the latency charts from `requests.csv`, and the KV, queue, busy and
//! link charts from `timeline.csv`.

use std::fmt::Write as _;
use std::path::Path;

use super::read::{self, Grid, Rank, Requests, RunReport, STAGES, Stat, StepSeries, Timeline};
use super::svg::{self, Axis, Bar, BarChart, LINE_STROKES, Series, Style, XyChart, esc};
use super::{Kind, Page, ReportError, document, figure, int, missing, num, pct, slug};

/// A run chart's size (viewBox units).
const W: f64 = 600.0;
const H: f64 = 270.0;

/// The CDFs draw at most this many quantile points.
const CDF_POINTS: usize = 1000;

/// The page under construction.
struct Body {
    html: String,
    charts: usize,
    missing: Vec<String>,
}

impl Body {
    fn chart(&mut self, name: &str, title: &str, sub: &str, svg: &str, legend: &str) {
        self.html.push_str(&figure(name, title, sub, svg, legend));
        self.charts += 1;
    }

    fn note(&mut self, text: &str) {
        let _ = writeln!(self.html, "<p class=\"note\">{}</p>", esc(text));
    }

    fn missing(&mut self, file: &str, what: &str) {
        self.html.push_str(&missing(file, what));
        if !self.missing.iter().any(|m| m == file) {
            self.missing.push(file.to_owned());
        }
    }

    fn open_charts(&mut self) {
        self.html.push_str("<div class=\"charts\">\n");
    }

    fn close_charts(&mut self) {
        self.html.push_str("</div>\n");
    }
}

/// Reads an optional file with `read` when it exists.
fn optional<T>(
    dir: &Path,
    file: &str,
    read: impl FnOnce(&Path, &str) -> Result<T, ReportError>,
) -> Result<Option<T>, ReportError> {
    let path = dir.join(file);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    read(&path, &path.display().to_string()).map(Some)
}

/// Renders the run folder `dir` (which holds `report.json`).
pub fn render(dir: &Path) -> Result<Page, ReportError> {
    let rp = dir.join("report.json");
    let report = read::run_report(&rp, &rp.display().to_string())?;
    let grid = Grid::new(report.final_time_ns);
    let requests = optional(dir, "requests.csv", |p, n| read::requests(p, n, &grid))?;
    // Only the ranks' and links' series are drawn: the others are not kept
    // (each costs a thousand buckets).
    let entities: Vec<&str> =
        report.ranks.iter().map(|r| r.name.as_str()).chain(report.links.iter().map(|l| l.name.as_str())).collect();
    let timeline = optional(dir, "timeline.csv", |p, n| read::timeline(p, n, &grid, &entities))?;
    let mut b = Body { html: String::new(), charts: 0, missing: Vec::new() };
    header(&mut b, &report);
    if let Some(t) = timeline.as_ref().filter(|t| !t.left_out.is_empty()) {
        let named: Vec<&str> = t.left_out.iter().take(8).map(String::as_str).collect();
        let more = if t.left_out.len() > named.len() { ", …" } else { "" };
        let n = t.left_out.len();
        b.note(&format!(
            "timeline.csv holds more series than a page draws ({} at most): the {n} {} past them {} left out of the charts over time ({}{more}).",
            read::MAX_SERIES,
            if n == 1 { "entity" } else { "entities" },
            if n == 1 { "is" } else { "are" },
            named.join(", ")
        ));
    }
    summary(&mut b, &report);
    latency(&mut b, &report, requests.as_ref(), &grid);
    kv(&mut b, &report, timeline.as_ref(), &grid);
    queues(&mut b, &report, timeline.as_ref(), &grid);
    links(&mut b, &report, timeline.as_ref(), &grid);
    let files: Vec<&str> =
        [("report.json", true), ("requests.csv", requests.is_some()), ("timeline.csv", timeline.is_some())]
            .iter()
            .filter(|f| f.1)
            .map(|f| f.0)
            .collect();
    let _ = writeln!(
        b.html,
        "<footer>Made by <code>pdsim report</code> (pdsim {}) from {} of this run. Times are simulated.</footer>",
        esc(crate::report::PDSIM_VERSION),
        esc(&files.join(", "))
    );
    let title = format!("pdsim report: {}", report.scenario.name.as_deref().unwrap_or(&report.scenario.label));
    Ok(Page { kind: Kind::Run, html: document(&title, &b.html), charts: b.charts, missing: b.missing })
}

fn header(b: &mut Body, r: &RunReport) {
    let name = r.scenario.name.as_deref().unwrap_or("unnamed scenario");
    let _ = writeln!(b.html, "<header><h1>pdsim report: {}</h1>", esc(name));
    let requests = r.requests_override.map(|n| format!(", --requests {n}")).unwrap_or_default();
    let _ = writeln!(
        b.html,
        "<p class=\"meta\">{} · seed {}{} · pdsim {} · digest <code>{}</code> · {} events, {} s simulated</p>",
        esc(&r.scenario.label),
        r.seed,
        esc(&requests),
        esc(&r.pdsim_version),
        esc(&r.digest),
        int(r.events),
        num(r.final_time_ns as f64 / 1e9)
    );
    if let Some(d) = &r.scenario.description {
        let _ = writeln!(b.html, "<p>{}</p>", esc(d.trim()));
    }
    b.html.push_str("</header>\n");
    if r.interrupted {
        let _ = writeln!(
            b.html,
            "<p class=\"banner warn\">Ctrl-C stopped this run at simulated {} s: it covers the requests that entered by then, and those in flight are unfinished.</p>",
            num(r.final_time_ns as f64 / 1e9)
        );
    }
    if !r.violations.is_empty() {
        let _ = writeln!(
            b.html,
            "<p class=\"banner bad\">The run broke {} conservation check(s), a bug in pdsim: {}</p>",
            r.violations.len(),
            esc(&r.violations.join("; "))
        );
    }
    if let Some(o) = r.overload.as_ref().filter(|o| o.overloaded) {
        let bottleneck = o.bottleneck.as_ref().map_or_else(String::new, |k| {
            let wait = o.wait_ms.get(k).copied().unwrap_or(0.0);
            let share = o.bottleneck_ttft_share.map(|x| format!(", {} of mean TTFT", pct(x))).unwrap_or_default();
            let busy: Vec<String> = o.busy_share.iter().map(|(r, b)| format!("{r} {}", pct(*b))).collect();
            format!(
                "; bottleneck: {k} (requests waited {} ms in front of it{share}; busy {})",
                num(wait),
                busy.join(", ")
            )
        });
        let _ = writeln!(
            b.html,
            "<p class=\"banner bad\" data-overload=\"1\"><b>Overloaded:</b> offered {} req/s &gt; served {} req/s; {} requests in the system at the last arrival, growing {}/s{}.</p>",
            num(o.arrival_rate_per_s.unwrap_or(0.0)),
            num(o.completion_rate_per_s),
            int(o.backlog_at_last_arrival),
            num(o.backlog_growth_per_s),
            esc(&bottleneck)
        );
    }
    b.html.push_str(
        "<nav><a href=\"#summary\">Summary</a><a href=\"#latency\">Latency</a><a href=\"#kv\">KV cache</a><a href=\"#queues\">Queues and busy</a><a href=\"#links\">Links</a></nav>\n",
    );
}

/// What a decode rank's busy share says, beside the ranks' table and the
/// busy chart.
const BUSY_NOTE: &str = "<p class=\"note\" data-note=\"busy\">Busy: the share of the run with a step in flight. A decode rank steps whenever it holds anything to decode, however small its batch, so its busy share is near 100 % well below its capacity; where requests wait (the stage breakdown, the queues) tells the bottleneck.</p>\n";

fn card(k: &str, v: &str, s: &str) -> String {
    format!(
        "<div class=\"card\"><div class=\"k\">{}</div><div class=\"v\">{}</div><div class=\"s\">{}</div></div>",
        esc(k),
        esc(v),
        esc(s)
    )
}

fn summary(b: &mut Body, r: &RunReport) {
    let s = &r.summary;
    b.html.push_str("<section id=\"summary\"><h2>Summary</h2>\n<div class=\"cards\">");
    b.html.push_str(&card(
        "Requests",
        &int(s.requests),
        &format!("{} completed, {} failed", int(s.completed), int(s.failed)),
    ));
    b.html.push_str(&card(
        "Throughput",
        &format!("{} req/s", num(s.request_throughput)),
        &format!("{} output tok/s, {} total tok/s", num(s.output_token_throughput), num(s.total_token_throughput)),
    ));
    b.html.push_str(&card("Duration", &format!("{} s", num(s.duration_s)), "first arrival to last end"));
    b.html.push_str(&card(
        "Goodput",
        &format!("{} req/s", num(s.goodput)),
        &format!("SLO attainment {}", pct(s.slo_attainment)),
    ));
    for (k, st) in [("TTFT", &s.ttft_ms), ("TPOT", &s.tpot_ms), ("E2E", &s.e2e_ms)] {
        b.html.push_str(&card(
            &format!("{k} median"),
            &format!("{} ms", num(st.median)),
            &format!("p99 {} ms", num(st.p99)),
        ));
    }
    if !r.links.is_empty() {
        b.html.push_str(&card(
            "Transferred",
            &format!("{} GB", num(s.transfer_bytes as f64 / 1e9)),
            &format!("wait mean {} ms, time mean {} ms", num(s.transfer_wait_ms.mean), num(s.transfer_time_ms.mean)),
        ));
    }
    b.html.push_str(&card(
        "Prefix-cache hits",
        &format!("{} tok", int(u128::from(s.prefill_hit_tokens) + u128::from(s.decode_hit_tokens))),
        &format!("{} prefill-side, {} decode-side", int(s.prefill_hit_tokens), int(s.decode_hit_tokens)),
    ));
    b.html.push_str(&card("Preemptions", &int(s.preemptions), "recomputed sequences"));
    b.html.push_str("</div>\n");

    b.html.push_str("<h3>Latency (ms)</h3><div class=\"scroll\"><table data-table=\"latency\"><tr><th>statistic</th><th>count</th><th>mean</th><th>median</th><th>p90</th><th>p95</th><th>p99</th><th>max</th></tr>\n");
    let rows: [(&str, &Stat); 9] = [
        ("TTFT (completed)", &s.ttft_ms),
        ("TPOT (completed, ≥ 2 tokens)", &s.tpot_ms),
        ("ITL (every gap)", &s.itl_ms),
        ("E2E (completed)", &s.e2e_ms),
        ("prefill queue", &s.prefill_queue_ms),
        ("prefill time", &s.prefill_time_ms),
        ("transfer wait", &s.transfer_wait_ms),
        ("transfer time", &s.transfer_time_ms),
        ("decode queue", &s.decode_queue_ms),
    ];
    for (name, st) in rows {
        let _ = write!(b.html, "<tr><td>{}</td><td>{}</td>", esc(name), int(st.count));
        for v in [st.mean, st.median, st.p90, st.p95, st.p99, st.max] {
            let cell = if st.count == 0 { "–".to_owned() } else { num(v) };
            let _ = write!(b.html, "<td>{cell}</td>");
        }
        b.html.push_str("</tr>\n");
    }
    b.html.push_str("</table></div>\n");

    // Narrow enough for a 1,200 px window: the cache groups (a list of
    // names) wrap in their cell, the peak is one cell of blocks and share.
    b.html.push_str("<h3>Ranks</h3><div class=\"scroll\"><table data-table=\"ranks\"><tr><th>rank</th><th>role</th><th>steps</th><th>tokens</th><th>busy</th><th>KV pool<br>(blocks)</th><th>peak KV<br>(blocks, share)</th><th>evicted<br>blocks</th><th>preemp&shy;tions</th><th class=\"t\">cache groups</th></tr>\n");
    for k in &r.ranks {
        let peak = if k.num_blocks > 0 { k.peak_used_blocks as f64 / k.num_blocks as f64 } else { 0.0 };
        let _ = writeln!(
            b.html,
            "<tr><td>{}</td><td class=\"t\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ({})</td><td>{}</td><td>{}</td><td class=\"t wrap\">{}</td></tr>",
            esc(&k.name),
            esc(&k.role),
            int(k.steps),
            int(k.tokens),
            pct(k.busy_fraction),
            int(k.num_blocks),
            int(k.peak_used_blocks),
            pct(peak),
            int(k.evicted_blocks),
            int(k.preemptions),
            esc(&k.groups.join(", "))
        );
    }
    b.html.push_str("</table></div>\n");
    if r.ranks.iter().any(|k| k.role == "decode") {
        b.html.push_str(BUSY_NOTE);
    }
    if !r.links.is_empty() {
        b.html.push_str("<h3>Links</h3><div class=\"scroll\"><table data-table=\"links\"><tr><th>link</th><th>transfers</th><th>GB started</th><th>GB completed</th><th>busy</th><th>mean GB/s while busy</th><th>peak transfers at once</th></tr>\n");
        for l in &r.links {
            let _ = writeln!(
                b.html,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&l.name),
                int(l.transfers),
                num(l.bytes_started as f64 / 1e9),
                num(l.bytes_completed as f64 / 1e9),
                pct(l.busy_fraction),
                num(l.mean_busy_gb_s),
                int(l.peak_active_transfers)
            );
        }
        b.html.push_str("</table></div>\n");
    }
    bench(b, r);
    b.html.push_str("</section>\n");
}

/// `bench` as `vllm bench serve` prints it: the totals, then the latency
/// statistics (mean, median, std, the chosen percentiles).
fn bench(b: &mut Body, r: &RunReport) {
    let Some(serde_json::Value::Object(m)) = &r.bench else { return };
    let cell = |v: &serde_json::Value| match v {
        serde_json::Value::Number(n) if n.is_u64() || n.is_i64() => int(n.as_u64().unwrap_or(0)),
        serde_json::Value::Number(n) => num(n.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::Null => "–".to_owned(),
        other => esc(&other.to_string()),
    };
    b.html.push_str("<details data-table=\"bench\"><summary>The same run as <code>vllm bench serve</code> reports it (report.json <code>bench</code>)</summary>\n<div class=\"scroll\"><table><tr><th>field</th><th>value</th></tr>\n");
    let order = [
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
    ];
    let totals = order.iter().filter_map(|k| m.get(*k).map(|v| (*k, v))).chain(
        m.iter().filter(|(k, _)| !k.ends_with("_ms") && !order.contains(&k.as_str())).map(|(k, v)| (k.as_str(), v)),
    );
    for (k, v) in totals {
        let _ = writeln!(b.html, "<tr><td><code>{}</code></td><td>{}</td></tr>", esc(k), cell(v));
    }
    b.html.push_str("</table>\n");
    // Latency fields: {stat}_{metric}_ms, stat one of mean, median, std, pN.
    let mut stats: Vec<(f64, String)> = Vec::new();
    for k in m.keys() {
        if let Some(stat) = k.strip_suffix("_ttft_ms") {
            let order = match stat {
                "mean" => -3.0,
                "median" => -2.0,
                "std" => -1.0,
                p => p.strip_prefix('p').and_then(|x| x.parse::<f64>().ok()).unwrap_or(1000.0),
            };
            stats.push((order, stat.to_owned()));
        }
    }
    stats.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    if !stats.is_empty() {
        b.html.push_str("<table><tr><th>ms</th>");
        for (_, s) in &stats {
            let _ = write!(b.html, "<th>{}</th>", esc(s));
        }
        b.html.push_str("</tr>\n");
        for metric in ["ttft", "tpot", "itl", "e2el"] {
            let _ = write!(b.html, "<tr><td>{metric}</td>");
            for (_, s) in &stats {
                let v = m.get(&format!("{s}_{metric}_ms")).map_or_else(|| "–".to_owned(), cell);
                let _ = write!(b.html, "<td>{v}</td>");
            }
            b.html.push_str("</tr>\n");
        }
        b.html.push_str("</table>");
    }
    b.html.push_str("</div></details>\n");
}

/// `ns` as a duration label: `2 s`, `500 ms`, `20 µs`.
fn duration_label(ns: u64) -> String {
    if ns >= 1_000_000_000 && ns.is_multiple_of(1_000_000_000) {
        format!("{} s", ns / 1_000_000_000)
    } else if ns >= 1_000_000 && ns.is_multiple_of(1_000_000) {
        format!("{} ms", ns / 1_000_000)
    } else if ns >= 1_000 && ns.is_multiple_of(1_000) {
        format!("{} µs", ns / 1_000)
    } else {
        format!("{ns} ns")
    }
}

fn time_axis(grid: &Grid) -> Axis {
    Axis::linear("simulated time (s)").range(0.0, grid.end_ns as f64 / 1e9)
}

/// The empirical CDF of `values` (sorted here) as at most [`CDF_POINTS`]
/// quantile points, (value, % at or below).
fn cdf_points(values: &mut [f64]) -> Vec<(f64, f64)> {
    values.sort_unstable_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return Vec::new();
    }
    let m = CDF_POINTS.min(n);
    let mut pts = Vec::with_capacity(m + 2);
    pts.push((values[0], 0.0));
    let mut last = usize::MAX;
    for k in 0..=m {
        let i = (k * (n - 1)).checked_div(m).unwrap_or(0);
        if i != last {
            pts.push((values[i], 100.0 * (i + 1) as f64 / n as f64));
            last = i;
        }
    }
    pts
}

/// The nearest-rank `q` quantile of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn cdf_chart(b: &mut Body, name: &str, title: &str, mut values: Vec<f64>, what: &str) {
    let n = values.len();
    if n == 0 {
        b.note(&format!("{title}: no {what}."));
        return;
    }
    let pts = cdf_points(&mut values);
    let (min, med, max) = (values[0], quantile(&values, 0.5), values[n - 1]);
    let log = min > 0.0 && med > 0.0 && max / med > 20.0;
    let x = if log { Axis::log("ms (log scale)") } else { Axis::linear("ms") };
    let mut c = XyChart::new(x, Axis::linear(format!("{what} (%)")).range(0.0, 100.0).suffix("%"), W, H);
    c.push(Series::new(title, 0, Style::Line, pts));
    let sub = format!(
        "{} {what}: p50 {} ms, p90 {} ms, p99 {} ms, max {} ms",
        int(n as u64),
        num(med),
        num(quantile(&values, 0.9)),
        num(quantile(&values, 0.99)),
        num(max)
    );
    b.chart(name, &format!("{title}: cumulative distribution"), &sub, &c.svg(), "");
}

fn latency(b: &mut Body, r: &RunReport, q: Option<&Requests>, grid: &Grid) {
    b.html.push_str("<section id=\"latency\"><h2>Latency and load</h2>\n");
    let Some(q) = q else {
        b.missing(
            "requests.csv",
            "requests.csv is not in this folder (a sweep point's folder holds report.json alone): the latency distributions, the stage breakdown by E2E band, and TTFT and the request rates over time need it. Below, what report.json gives: each latency's statistics and each stage's mean.",
        );
        b.open_charts();
        latency_stats(b, r);
        stage_means(b, r);
        outcomes(b, r);
        b.close_charts();
        b.html.push_str("</section>\n");
        return;
    };
    b.open_charts();
    cdf_chart(b, "ttft_cdf", "TTFT", q.done.iter().map(|d| d.ttft_ms).collect(), "completed requests");
    cdf_chart(
        b,
        "tpot_cdf",
        "TPOT",
        q.done.iter().filter_map(|d| d.tpot_ms).collect(),
        "completed requests with ≥ 2 tokens",
    );
    cdf_chart(b, "e2e_cdf", "E2E latency", q.done.iter().map(|d| d.e2e_ms).collect(), "completed requests");
    stage_breakdown(b, q);
    ttft_over_time(b, q, grid);
    rates_over_time(b, q, grid);
    outcomes(b, r);
    b.close_charts();
    b.html.push_str("</section>\n");
}

/// TTFT, TPOT, ITL and E2E at each of report.json's statistics (mean,
/// median, p90, p95, p99, max), on a log scale: a run's latencies without
/// its requests.csv (a sweep point's page).
fn latency_stats(b: &mut Body, r: &RunReport) {
    let s = &r.summary;
    let stats = ["mean", "median", "p90", "p95", "p99", "max"];
    let x = Axis::categories("statistic", stats.iter().map(|s| (*s).to_owned()).collect());
    let mut c = XyChart::new(x, Axis::log("ms (log scale)"), W, H);
    let mut legend = Vec::new();
    for (i, (name, st)) in
        [("TTFT", &s.ttft_ms), ("TPOT", &s.tpot_ms), ("ITL", &s.itl_ms), ("E2E", &s.e2e_ms)].into_iter().enumerate()
    {
        if st.count == 0 {
            continue;
        }
        let values = [st.mean, st.median, st.p90, st.p95, st.p99, st.max];
        let pts: Vec<(f64, f64)> = values.iter().enumerate().map(|(k, v)| (k as f64, *v)).collect();
        let titles = stats.iter().zip(values).map(|(k, v)| format!("{name} {k}: {} ms", num(v))).collect();
        // Lines that coincide (TPOT and ITL often do) stay apart: a wide
        // one under a narrower dashed one.
        let (width, dash) = LINE_STROKES[i % LINE_STROKES.len()];
        c.push(Series::new(name, i, Style::LineDots, pts).titles(titles).stroke(width, dash));
        legend.push((i, name.to_owned(), dash.is_some()));
    }
    if legend.is_empty() {
        return;
    }
    let sub = format!("{} completed requests (ITL: every gap), from report.json", int(s.ttft_ms.count));
    b.chart("latency_stats", "Latency statistics", &sub, &c.svg(), &svg::legend(&legend));
}

/// Each stage's mean (report.json's summary), one stacked bar, and what
/// is left of the mean E2E after them (the first token and the decode):
/// where the time goes without requests.csv.
fn stage_means(b: &mut Body, r: &RunReport) {
    let s = &r.summary;
    let stages: [(&str, &Stat); 5] = [
        ("prefill queue", &s.prefill_queue_ms),
        ("prefill", &s.prefill_time_ms),
        ("transfer wait", &s.transfer_wait_ms),
        ("transfer", &s.transfer_time_ms),
        ("decode queue", &s.decode_queue_ms),
    ];
    let used: Vec<(&str, f64)> = stages.iter().filter(|(_, st)| st.count > 0).map(|(n, st)| (*n, st.mean)).collect();
    if used.is_empty() || s.e2e_ms.count == 0 {
        return;
    }
    let before: f64 = used.iter().map(|u| u.1).sum();
    let rest = (s.e2e_ms.mean - before).max(0.0);
    let mut names: Vec<String> = used.iter().map(|u| u.0.to_owned()).collect();
    names.push("first token and decode".to_owned());
    let mut chart = BarChart::new("ms (mean)", names, W, 1);
    let mut values: Vec<f64> = used.iter().map(|u| u.1).collect();
    values.push(rest);
    chart.push(Bar { label: "mean request".to_owned(), values });
    let wait = r.overload.as_ref().and_then(|o| {
        let k = o.bottleneck.as_ref()?;
        Some(format!("; requests waited longest in front of the {k} ranks"))
    });
    let sub = format!(
        "each stage's mean over the requests that reached it, the rest of the mean E2E ({} ms) after them{}",
        num(s.e2e_ms.mean),
        wait.unwrap_or_default()
    );
    b.chart(
        "stage_means",
        "Where the time goes: stage means",
        &sub,
        &chart.svg(),
        &svg::block_legend(chart.segments()),
    );
}

/// Mean time in each stage, for all completed requests and for the E2E
/// bands (fastest half, p50–p90, p90–p99, slowest 1 %): the stages of a
/// request add up to its E2E, so each bar's length is its band's mean E2E.
fn stage_breakdown(b: &mut Body, q: &Requests) {
    let n = q.done.len();
    if n == 0 {
        return;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &c| q.done[a].e2e_ms.total_cmp(&q.done[c].e2e_ms).then(a.cmp(&c)));
    let cut = |f: f64| ((f * n as f64).ceil() as usize).min(n);
    let bands = [
        ("all (mean)".to_owned(), 0, n),
        ("E2E ≤ p50".to_owned(), 0, cut(0.5)),
        ("p50 – p90".to_owned(), cut(0.5), cut(0.9)),
        ("p90 – p99".to_owned(), cut(0.9), cut(0.99)),
        ("slowest 1 %".to_owned(), cut(0.99), n),
    ];
    let mean = |lo: usize, hi: usize| {
        let mut m = [0.0f64; 7];
        for &i in &order[lo..hi] {
            for (s, v) in q.done[i].stages_ms.iter().enumerate() {
                m[s] += v;
            }
        }
        m.map(|x| x / (hi - lo).max(1) as f64)
    };
    let all = mean(0, n);
    let used: Vec<usize> = (0..STAGES.len()).filter(|&s| all[s] > 0.0).collect();
    let mut chart = BarChart::new("ms (mean per band)", used.iter().map(|&s| STAGES[s].0.to_owned()).collect(), W, 1);
    let mut max_total: f64 = 0.0;
    for (label, lo, hi) in bands {
        if hi <= lo {
            continue;
        }
        let m = mean(lo, hi);
        max_total = max_total.max(m.iter().sum());
        chart.push(Bar {
            label: format!("{label} ({})", int((hi - lo) as u64)),
            values: used.iter().map(|&s| m[s]).collect(),
        });
    }
    b.chart(
        "stage_breakdown",
        "Where the time goes: E2E by stage",
        "completed requests, banded by E2E; each stage from the end of the one before it that the request reached",
        &chart.svg(),
        &svg::block_legend(chart.segments()),
    );
}

fn ttft_over_time(b: &mut Body, q: &Requests, grid: &Grid) {
    let mut per: Vec<Vec<f64>> = vec![Vec::new(); grid.windows()];
    for d in &q.done {
        per[grid.window_of(d.arrival_ns)].push(d.ttft_ms);
    }
    let (mut mean, mut p99) = (Vec::new(), Vec::new());
    for (w, v) in per.iter_mut().enumerate() {
        if v.is_empty() {
            continue;
        }
        v.sort_unstable_by(f64::total_cmp);
        let mid = window_mid_s(grid, w);
        mean.push((mid, v.iter().sum::<f64>() / v.len() as f64));
        p99.push((mid, quantile(v, 0.99)));
    }
    if mean.is_empty() {
        return;
    }
    let mut c = XyChart::new(time_axis(grid), Axis::linear("TTFT (ms)").from_zero(), W, H);
    c.push(Series::new("mean", 0, Style::LineDots, mean));
    c.push(Series::new("p99", 1, Style::Line, p99).dashed());
    let legend = svg::legend(&[(0, "mean".into(), false), (1, "p99".into(), true)]);
    let sub = format!("completed requests by arrival time, per {} window", duration_label(grid.window_ns));
    b.chart("ttft_over_time", "TTFT over time", &sub, &c.svg(), &legend);
}

fn window_mid_s(grid: &Grid, w: usize) -> f64 {
    let (t0, t1) = window_bounds(grid, w);
    (t0 as f64 + t1 as f64) / 2.0 / 1e9
}

fn window_bounds(grid: &Grid, w: usize) -> (u64, u64) {
    // Saturating: near u64::MAX ns the last window's end would overflow.
    let t0 = (w as u64).saturating_mul(grid.window_ns);
    let t1 =
        if w + 1 == grid.windows() { grid.end_ns.max(t0.saturating_add(1)) } else { t0.saturating_add(grid.window_ns) };
    (t0, t1)
}

fn rates_over_time(b: &mut Body, q: &Requests, grid: &Grid) {
    let rate = |counts: &[u64]| -> Vec<(f64, f64)> {
        counts
            .iter()
            .enumerate()
            .map(|(w, &c)| {
                let (t0, t1) = window_bounds(grid, w);
                (window_mid_s(grid, w), c as f64 / ((t1 - t0) as f64 / 1e9))
            })
            .collect()
    };
    let mut c = XyChart::new(time_axis(grid), Axis::linear("requests per second").from_zero(), W, H);
    c.push(Series::new("arrivals", 0, Style::Line, rate(&q.arrivals)));
    c.push(Series::new("completions", 4, Style::Line, rate(&q.completions)));
    let mut legend = vec![(0, "arrivals".to_owned(), false), (4, "completions".to_owned(), false)];
    if q.failures.iter().any(|&f| f > 0) {
        c.push(Series::new("failures", 2, Style::Line, rate(&q.failures)));
        legend.push((2, "failures".to_owned(), false));
    }
    let sub = format!("per {} window; completions and failures at the request's end", duration_label(grid.window_ns));
    b.chart("request_rates", "Arrivals and completions over time", &sub, &c.svg(), &svg::legend(&legend));
}

/// Completed, failed by reason, and unfinished requests (report.json).
fn outcomes(b: &mut Body, r: &RunReport) {
    let s = &r.summary;
    let mut chart = BarChart::new("requests", vec!["completed".into(), "failed".into(), "in flight".into()], W, 0);
    chart.push(Bar { label: "completed".into(), values: vec![s.completed as f64, 0.0, 0.0] });
    let mut reasons: Vec<(&String, &u64)> = s.failure_reasons.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    for (reason, n) in reasons {
        chart.push(Bar { label: format!("failed: {reason}"), values: vec![0.0, *n as f64, 0.0] });
    }
    let in_flight = s.requests.saturating_sub(s.completed.saturating_add(s.failed));
    if in_flight > 0 {
        chart.push(Bar { label: "in flight (unfinished)".into(), values: vec![0.0, 0.0, in_flight as f64] });
    }
    let sub = format!("{} requests entered: {} completed, {} failed", int(s.requests), int(s.completed), int(s.failed));
    b.chart("outcomes", "Outcomes and failures by reason", &sub, &chart.svg(), "");
}

/// One line of a chart over time: its label and the series it adds up,
/// each times its scale.
type Line<'a> = (String, Vec<(&'a StepSeries, f64)>);

/// A chart of `lines` over time. A line of one series is its exact step
/// function when it changed at most a few hundred times (so its steps can
/// be seen), else its time-weighted mean per window over a band of the
/// lowest to the highest value per fine bucket; a line of several series
/// is the sum of their means per window (exact: a mean is linear). Without
/// `bands` (many lines on one chart), no band is drawn. The flag says
/// whether any line was drawn per window.
fn lines_chart(grid: &Grid, y: Axis, lines: Vec<Line<'_>>, bands: bool) -> Option<(String, String, Coarse)> {
    if lines.is_empty() {
        return None;
    }
    let mut c = XyChart::new(time_axis(grid), y, W, H);
    let mut legend = Vec::new();
    let mut over = Vec::new();
    let mut coarse = false;
    let (mut banded, mut peaks) = (false, false);
    for (i, (label, parts)) in lines.into_iter().enumerate() {
        match parts.as_slice() {
            [] => continue,
            [(s, scale)] => match s.exact_steps(grid, *scale) {
                Some(pts) => over.push(Series::new(label.clone(), i, Style::Step, pts)),
                None => {
                    coarse = true;
                    if bands && s.peak() <= SMALL_COUNTS {
                        // A count of a few (sequences running, transfers)
                        // changes between its lowest and highest value in
                        // almost every bucket: its band would fill solid.
                        // Its highest per bucket, a thin line, instead.
                        peaks = true;
                        c.push(
                            Series::new(format!("{label}: highest"), i, Style::Step, window_highs(s, grid, *scale))
                                .thin(),
                        );
                    } else if bands {
                        banded = true;
                        c.push(Series::band(format!("{label}: lowest to highest"), i, &s.band(grid, *scale)));
                    }
                    over.push(Series::new(label.clone(), i, Style::Line, s.window_means(grid, *scale)));
                }
            },
            many => {
                coarse = true;
                let mut sum = many[0].0.window_means(grid, many[0].1);
                for (s, scale) in &many[1..] {
                    for (acc, (_, v)) in sum.iter_mut().zip(s.window_means(grid, *scale)) {
                        acc.1 += v;
                    }
                }
                over.push(Series::new(label.clone(), i, Style::Line, sum));
            }
        }
        legend.push((i, label, false));
    }
    if legend.is_empty() {
        return None;
    }
    // Lines over every band.
    for l in over {
        c.push(l);
    }
    Some((c.svg(), svg::legend(&legend), Coarse { means: coarse, bands: banded, peaks }))
}

/// A series' highest value per window (from its fine buckets' highest),
/// as a step function: (window start s, highest × `scale`), closed at the
/// run's end.
fn window_highs(s: &StepSeries, grid: &Grid, scale: f64) -> Vec<(f64, f64)> {
    let mut highs = vec![f64::NEG_INFINITY; grid.windows()];
    for (mid_s, _, hi) in s.band(grid, scale) {
        let w = grid.window_of((mid_s * 1e9) as u64).min(highs.len().saturating_sub(1));
        if let Some(h) = highs.get_mut(w) {
            *h = h.max(hi);
        }
    }
    let mut pts: Vec<(f64, f64)> = highs
        .iter()
        .enumerate()
        .filter(|(_, h)| h.is_finite())
        .map(|(w, &h)| (window_bounds(grid, w).0 as f64 / 1e9, h))
        .collect();
    if let Some(&(_, last)) = pts.last() {
        pts.push((grid.end_ns as f64 / 1e9, last));
    }
    pts
}

/// A series whose highest value is at most this is drawn, when coarse,
/// over its highest value per bucket rather than a band.
const SMALL_COUNTS: u64 = 32;

/// How a chart over time drew its lines: any as window means, any over a
/// band, any over its highest values.
#[derive(Clone, Copy, Debug, Default)]
struct Coarse {
    means: bool,
    bands: bool,
    peaks: bool,
}

/// [`lines_chart`] of one line per entity of `metric`, each times its
/// scale.
fn step_chart(
    tl: &Timeline,
    grid: &Grid,
    entities: &[(&str, f64)],
    metric: &str,
    y: Axis,
) -> Option<(String, String, Coarse)> {
    let lines: Vec<Line<'_>> = entities
        .iter()
        .filter_map(|(e, scale)| tl.get(e, metric).map(|s| ((*e).to_owned(), vec![(s, *scale)])))
        .collect();
    lines_chart(grid, y, lines, true)
}

/// One series per entity of `metric`'s time-weighted mean per window, ×100.
fn share_chart(tl: &Timeline, grid: &Grid, entities: &[&str], metric: &str, y: &str) -> Option<(String, String)> {
    let mut c = XyChart::new(time_axis(grid), Axis::linear(y).from_zero().suffix("%"), W, H);
    let mut legend = Vec::new();
    for (i, e) in entities.iter().enumerate() {
        let Some(s) = tl.get(e, metric) else { continue };
        c.push(Series::new(*e, i, Style::Line, s.window_means(grid, 100.0)));
        legend.push((i, (*e).to_owned(), false));
    }
    if legend.is_empty() {
        return None;
    }
    Some((c.svg(), svg::legend(&legend)))
}

fn resolution(grid: &Grid, coarse: Coarse) -> String {
    if !coarse.means {
        return String::new();
    }
    let mut s = format!("; line: time-weighted mean per {} window", duration_label(grid.window_ns));
    let fine = duration_label(grid.fine_ns);
    if coarse.bands {
        let _ = write!(s, ", band: lowest to highest per {fine}");
    }
    if coarse.peaks {
        let _ = write!(s, ", thin steps: highest per {} window", duration_label(grid.window_ns));
    }
    s
}

fn pool_scale(k: &Rank) -> f64 {
    if k.num_blocks > 0 { 100.0 / k.num_blocks as f64 } else { 0.0 }
}

fn kv(b: &mut Body, r: &RunReport, tl: Option<&Timeline>, grid: &Grid) {
    b.html.push_str("<section id=\"kv\"><h2>KV cache</h2>\n");
    let Some(tl) = tl else {
        b.missing(
            "timeline.csv",
            "timeline.csv is not in this folder (a run with --no-timeline writes none, a sweep point's folder holds report.json alone): the KV use by rank and cache group over time needs it; the ranks table above has each rank's peak.",
        );
        b.html.push_str("</section>\n");
        return;
    };
    b.open_charts();
    let ranks: Vec<(&str, f64)> = r.ranks.iter().map(|k| (k.name.as_str(), pool_scale(k))).collect();
    if let Some((svg, legend, coarse)) = step_chart(
        tl,
        grid,
        &ranks,
        "kv_used_blocks",
        Axis::linear("KV blocks in use (% of pool)").from_zero().suffix("%"),
    ) {
        let peaks: Vec<String> = r
            .ranks
            .iter()
            .map(|k| format!("{} {}", k.name, pct(k.peak_used_blocks as f64 / k.num_blocks.max(1) as f64)))
            .collect();
        let sub = format!("each rank's pool; peak {}{}", peaks.join(", "), resolution(grid, coarse));
        b.chart("kv_used", "KV use by rank", &sub, &svg, &legend);
    }
    let cached = r.ranks.iter().any(|k| tl.get(&k.name, "kv_cached_free_blocks").is_some_and(|s| s.peak() > 0));
    if !cached {
        b.note("No free block held a cached prefix (prefix caching off, or nothing left to reuse).");
    } else if let Some((svg, legend, coarse)) = step_chart(
        tl,
        grid,
        &ranks,
        "kv_cached_free_blocks",
        Axis::linear("cached free blocks (% of pool)").from_zero().suffix("%"),
    ) {
        let sub = format!(
            "free blocks still holding prefixes a later request can hit (evicted when blocks are needed){}",
            resolution(grid, coarse)
        );
        b.chart("kv_cached", "Prefix cache held in free blocks", &sub, &svg, &legend);
    }
    // Per cache group, when a pool has more than one: per role, each
    // group's blocks as a share of the role's pools.
    if r.ranks.iter().any(|k| k.groups.len() > 1) {
        let mut roles: Vec<&str> = Vec::new();
        for k in &r.ranks {
            if !roles.contains(&k.role.as_str()) {
                roles.push(&k.role);
            }
        }
        for role in roles {
            let of: Vec<&Rank> = r.ranks.iter().filter(|k| k.role == role).collect();
            let pool: u64 = of.iter().map(|k| k.num_blocks).sum();
            let scale = if pool > 0 { 100.0 / pool as f64 } else { 0.0 };
            let mut groups: Vec<&str> = Vec::new();
            for k in &of {
                for g in &k.groups {
                    if !groups.contains(&g.as_str()) {
                        groups.push(g);
                    }
                }
            }
            let lines: Vec<Line<'_>> = groups
                .iter()
                .map(|g| {
                    let metric = format!("kv_used_blocks[{g}]");
                    ((*g).to_owned(), of.iter().filter_map(|k| tl.get(&k.name, &metric).map(|s| (s, scale))).collect())
                })
                .collect();
            let y = Axis::linear("blocks in use (% of pool)").from_zero().suffix("%");
            let Some((svg, legend, coarse)) = lines_chart(grid, y, lines, false) else { continue };
            let (who, sub) = if of.len() == 1 {
                let how = if coarse.means {
                    format!("; time-weighted mean per {} window", duration_label(grid.window_ns))
                } else {
                    String::new()
                };
                (of[0].name.clone(), format!("each group's blocks as a share of the pool{how}"))
            } else {
                (
                    format!("{role} ranks"),
                    format!(
                        "each group's blocks on the {} {role} ranks as a share of their pools; time-weighted mean per {} window",
                        of.len(),
                        duration_label(grid.window_ns)
                    ),
                )
            };
            b.chart(
                &format!("kv_groups_{}", slug(role)),
                &format!("KV use by cache group: {who}"),
                &sub,
                &svg,
                &legend,
            );
        }
    } else if let Some(g) = r.ranks.first().and_then(|k| k.groups.first()) {
        b.note(&format!("One cache group ({g}): its use is the rank's KV use above."));
    }
    b.close_charts();
    b.html.push_str("</section>\n");
}

fn queues(b: &mut Body, r: &RunReport, tl: Option<&Timeline>, grid: &Grid) {
    b.html.push_str("<section id=\"queues\"><h2>Queues and busy</h2>\n");
    let Some(tl) = tl else {
        b.missing(
            "timeline.csv",
            "timeline.csv is not in this folder (a run with --no-timeline writes none, a sweep point's folder holds report.json alone): the queue lengths and busy shares over time need it. Below, each rank's busy share and peak KV use over the whole run (report.json).",
        );
        b.open_charts();
        rank_bars(b, r);
        b.close_charts();
        b.html.push_str("</section>\n");
        return;
    };
    b.open_charts();
    let ranks: Vec<(&str, f64)> = r.ranks.iter().map(|k| (k.name.as_str(), 1.0)).collect();
    let names: Vec<&str> = r.ranks.iter().map(|k| k.name.as_str()).collect();
    let charts: [(&str, &str, &str, &str); 4] = [
        ("waiting", "waiting", "Queue: sequences waiting by rank", "sequences waiting to be scheduled"),
        ("running", "running", "Batch: sequences running by rank", "sequences in the running batch"),
        (
            "pending_reservations",
            "pending_reservations",
            "Handoffs waiting on decode ranks",
            "handoffs waiting for their reservation of decode blocks",
        ),
        (
            "held_sources",
            "held_sources",
            "KV held for handoffs on prefill ranks",
            "prefilled requests whose KV waits to be pulled",
        ),
    ];
    for (name, metric, title, what) in charts {
        let with: Vec<(&str, f64)> = ranks.iter().copied().filter(|(e, _)| tl.get(e, metric).is_some()).collect();
        if with.is_empty() {
            continue;
        }
        if metric == "pending_reservations" && with.iter().all(|(e, _)| tl.get(e, metric).is_none_or(|s| s.peak() == 0))
        {
            b.note("No handoff waited for a decode rank's reservation.");
            continue;
        }
        if let Some((svg, legend, coarse)) =
            step_chart(tl, grid, &with, metric, Axis::linear(what_axis(metric)).from_zero())
        {
            b.chart(name, title, &format!("{what}{}", resolution(grid, coarse)), &svg, &legend);
        }
    }
    if let Some((svg, legend)) = share_chart(tl, grid, &names, "busy", "busy (%)") {
        let decode = if r.ranks.iter().any(|k| k.role == "decode") {
            " (a decode rank steps whenever it holds anything to decode: near 100 % is not saturation)"
        } else {
            ""
        };
        let sub = format!("share of each {} window with a step in flight{decode}", duration_label(grid.window_ns));
        b.chart("rank_busy", "Busy share by rank", &sub, &svg, &legend);
    }
    b.close_charts();
    b.html.push_str("</section>\n");
}

/// Each rank's busy share and peak KV use over the run, from report.json.
fn rank_bars(b: &mut Body, r: &RunReport) {
    if r.ranks.is_empty() {
        return;
    }
    let mut busy = BarChart::new("% of the run", vec!["busy".into()], W, 1);
    let mut kv = BarChart::new("% of the pool", vec!["peak KV blocks in use".into()], W, 1);
    for k in &r.ranks {
        busy.push(Bar { label: k.name.clone(), values: vec![100.0 * k.busy_fraction] });
        let peak = if k.num_blocks > 0 { 100.0 * k.peak_used_blocks as f64 / k.num_blocks as f64 } else { 0.0 };
        kv.push(Bar { label: k.name.clone(), values: vec![peak] });
    }
    let decode = if r.ranks.iter().any(|k| k.role == "decode") {
        " (a decode rank steps whenever it holds anything to decode: near 100 % is not saturation)"
    } else {
        ""
    };
    b.chart(
        "rank_busy_share",
        "Busy share by rank",
        &format!("share of the run with a step in flight{decode}"),
        &busy.svg(),
        "",
    );
    b.chart(
        "rank_peak_kv",
        "Peak KV use by rank",
        "the most KV blocks in use at once, as a share of the pool",
        &kv.svg(),
        "",
    );
}

fn what_axis(metric: &str) -> &'static str {
    match metric {
        "waiting" | "running" => "sequences",
        "pending_reservations" => "handoffs",
        "held_sources" => "requests",
        "active_transfers" | "queued_transfers" => "transfers",
        _ => "count",
    }
}

fn links(b: &mut Body, r: &RunReport, tl: Option<&Timeline>, grid: &Grid) {
    b.html.push_str("<section id=\"links\"><h2>Links</h2>\n");
    if r.links.is_empty() {
        b.note("No links: an aggregated deployment hands nothing off.");
        b.html.push_str("</section>\n");
        return;
    }
    b.open_charts();
    let open = r.links.iter().any(|l| l.bytes_started > l.bytes_completed);
    let segments =
        if open { vec!["completed".into(), "started, not completed".into()] } else { vec!["completed".into()] };
    let mut bytes = BarChart::new("GB", segments, W, 2);
    for l in &r.links {
        let done = l.bytes_completed as f64 / 1e9;
        let rest = l.bytes_started.saturating_sub(l.bytes_completed) as f64 / 1e9;
        bytes.push(Bar { label: l.name.clone(), values: if open { vec![done, rest] } else { vec![done] } });
    }
    let total: u64 = r.links.iter().map(|l| l.bytes_completed).sum();
    let transfers: u64 = r.links.iter().map(|l| l.transfers).sum();
    let sub = format!("{} transfers, {} GB in all (10^9 bytes)", int(transfers), num(total as f64 / 1e9));
    let legend = if open { svg::block_legend(bytes.segments()) } else { String::new() };
    b.chart("link_bytes", "Bytes moved by link", &sub, &bytes.svg(), &legend);
    match tl {
        None => {
            b.close_charts();
            b.missing(
                "timeline.csv",
                "timeline.csv is not in this folder (a run with --no-timeline writes none): the link use, transfers and bytes in flight over time need it.",
            );
            b.html.push_str("</section>\n");
            return;
        }
        Some(tl) => {
            let names: Vec<&str> = r.links.iter().map(|l| l.name.as_str()).collect();
            if let Some((svg, legend)) = share_chart(tl, grid, &names, "busy", "busy (%)") {
                let sub = format!("share of each {} window with bytes moving", duration_label(grid.window_ns));
                b.chart("link_busy", "Link use", &sub, &svg, &legend);
            }
            let ones: Vec<(&str, f64)> = names.iter().map(|n| (*n, 1.0)).collect();
            if let Some((svg, legend, coarse)) =
                step_chart(tl, grid, &ones, "active_transfers", Axis::linear("transfers").from_zero())
            {
                let sub = format!("transfers waiting out the latency or on the wire{}", resolution(grid, coarse));
                b.chart("link_transfers", "Transfers in flight by link", &sub, &svg, &legend);
            }
            let queued = names.iter().any(|n| tl.get(n, "queued_transfers").is_some_and(|s| s.peak() > 0));
            if queued
                && let Some((svg, legend, coarse)) =
                    step_chart(tl, grid, &ones, "queued_transfers", Axis::linear("transfers").from_zero())
            {
                let sub = format!("transfers queued behind another{}", resolution(grid, coarse));
                b.chart("link_queued", "Transfers queued by link", &sub, &svg, &legend);
            }
            let mb: Vec<(&str, f64)> = names.iter().map(|n| (*n, 1e-6)).collect();
            if let Some((svg, legend, coarse)) =
                step_chart(tl, grid, &mb, "bytes_in_flight", Axis::linear("MB in flight").from_zero())
            {
                let sub = format!("bytes of the transfers in flight (10^6 bytes){}", resolution(grid, coarse));
                b.chart("link_bytes_in_flight", "Bytes in flight by link", &sub, &svg, &legend);
            }
            b.close_charts();
            if !queued {
                b.note("No transfer queued behind another on any link.");
            }
        }
    }
    b.html.push_str("</section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_points_are_bounded_and_end_at_100() {
        let mut v: Vec<f64> = (0..100_000).map(|i| ((i * 7919) % 100_000) as f64).collect();
        let pts = cdf_points(&mut v);
        assert!(pts.len() <= CDF_POINTS + 2);
        assert_eq!(pts.last().unwrap(), &(99_999.0, 100.0));
        assert_eq!(pts[0], (0.0, 0.0));
        assert!(pts.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
    }

    #[test]
    fn durations_label_in_round_units() {
        assert_eq!(duration_label(2_000_000_000), "2 s");
        assert_eq!(duration_label(500_000_000), "500 ms");
        assert_eq!(duration_label(20_000), "20 µs");
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
    }
}
