//! `plan.html`: the page of a `pdsim plan` — the question, the best
//! deployment, the frontier of goodput per GPU against interactivity,
//! each candidate's rate against its GPUs, the table of candidates and
//! the launch lines. Self-contained and deterministic as `report.html` is
//! (the same style sheet and charts; no script, no time, no path beyond
//! the plan file's name).

use std::fmt::Write as _;

use super::svg::{self, Axis, Series, Style, XyChart, esc};
use super::{document, figure, int, missing, num, pct};
use crate::plan::output::{self, mode_name};
use crate::plan::search::{Outcome, PlanResult, Status};
use crate::plan::{Plan, SearchMode};

/// A chart's size (viewBox units).
const W: f64 = 600.0;
const H: f64 = 330.0;

/// Rows of the candidates table at most.
const TABLE_ROWS: usize = 3000;

fn card(k: &str, v: &str, sub: &str) -> String {
    format!(
        "<div class=\"card\"><div class=\"k\">{}</div><div class=\"v\">{}</div><div class=\"s\">{}</div></div>",
        esc(k),
        esc(v),
        esc(sub)
    )
}

fn point_title(o: &Outcome) -> String {
    format!(
        "#{} {}: {} req/s/GPU at {} tok/s/user",
        o.candidate.index,
        o.candidate.shape.label(),
        o.goodput_per_gpu().map_or("–".into(), num),
        o.interactivity().map_or("–".into(), num)
    )
}

/// The page of a plan's answer.
pub fn plan_page(plan: &Plan, result: &PlanResult) -> String {
    let t = &result.traffic;
    let mut b = String::new();
    let title = format!("pdsim plan: {}", plan.base.source());
    let _ = writeln!(b, "<h1>{}</h1>", esc(&title));
    let slo = plan.base.slo();
    let bounds: Vec<String> = [("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms), ("E2E", slo.e2e_ms)]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k} ≤ {v} ms")))
        .collect();
    let _ = writeln!(
        b,
        "<p class=\"meta\">At most {} GPUs; {} req/s, {} requests a trial; {} for {} of requests; search {}.</p>",
        plan.spec.max_gpus,
        num(t.target),
        int(t.requests),
        esc(&bounds.join(", ")),
        pct(plan.spec.attainment),
        if plan.spec.search == SearchMode::MaxRate { "highest rate (bisection)" } else { "fixed rate" }
    );
    let count = |st: &str| result.outcomes.iter().filter(|o| o.status.name() == st).count();
    b.push_str("<div class=\"cards\">");
    match result.best.map(|i| &result.outcomes[i]) {
        Some(best) => {
            let tr = &best.trials[0];
            b.push_str(&card("best", &best.candidate.shape.label(), mode_name(&best.candidate.shape)));
            b.push_str(&card("GPUs", &best.candidate.gpus().to_string(), "the fewest that meet the target"));
            b.push_str(&card("SLO attainment", &pct(tr.attainment), &format!("at {} req/s", num(t.target))));
            b.push_str(&card(
                "goodput per GPU",
                &num(tr.goodput / f64::from(best.candidate.gpus())),
                "req/s meeting every bound, at the target",
            ));
            if let Some(m) = best.max_rate {
                b.push_str(&card("highest rate", &num(m), "req/s meeting the SLO"));
            }
            b.push_str(&card("TTFT p99", &num(tr.ttft_p99_ms), "ms at the target"));
            b.push_str(&card("TPOT p99", &num(tr.tpot_p99_ms), "ms at the target"));
        }
        None => b.push_str(&card("best", "none", "no candidate meets the target")),
    }
    b.push_str(&card(
        "candidates",
        &result.outcomes.len().to_string(),
        &format!("{} simulated, {} pruned, {} infeasible", count("simulated"), count("pruned"), count("infeasible")),
    ));
    b.push_str("</div>\n");

    // The frontier.
    let meeting: Vec<&Outcome> = result
        .outcomes
        .iter()
        .filter(|o| o.meets && o.goodput_per_gpu().is_some() && o.interactivity().is_some())
        .collect();
    b.push_str("<h2 id=\"frontier\">Goodput per GPU against interactivity</h2>\n");
    if meeting.is_empty() {
        b.push_str(&missing("candidates.csv", "No candidate meets the target, so there is no frontier to draw."));
    } else {
        let xy = |o: &Outcome| (o.interactivity().unwrap_or(0.0), o.goodput_per_gpu().unwrap_or(0.0));
        let mut chart = XyChart::new(
            Axis::linear("interactivity (output tok/s per user: 1000 / mean TPOT)"),
            Axis::linear("goodput per GPU (req/s)").from_zero(),
            W,
            H,
        );
        for (color, mode) in [(0, "aggregated"), (1, "disaggregated")] {
            let pts: Vec<&&Outcome> = meeting.iter().filter(|o| mode_name(&o.candidate.shape) == mode).collect();
            if !pts.is_empty() {
                chart.push(
                    Series::new(mode, color, Style::Dots, pts.iter().map(|o| xy(o)).collect())
                        .titles(pts.iter().map(|o| point_title(o)).collect()),
                );
            }
        }
        let mut front: Vec<&Outcome> = result.frontier.iter().map(|&i| &result.outcomes[i]).collect();
        front.sort_by(|a, b| xy(a).0.total_cmp(&xy(b).0));
        chart.push(
            Series::new("Pareto frontier", 3, Style::LineDots, front.iter().map(|o| xy(o)).collect())
                .titles(front.iter().map(|o| point_title(o)).collect()),
        );
        if let Some(best) = result.best.map(|i| &result.outcomes[i]) {
            chart.push(Series::new("best", 2, Style::Dots, vec![xy(best)]).titles(vec![point_title(best)]));
        }
        let legend =
            svg::legend(&chart.series().iter().map(|s| (s.color(), s.name().to_owned(), false)).collect::<Vec<_>>());
        let sub = if plan.spec.search == SearchMode::MaxRate {
            "candidates meeting the target, each at its highest rate meeting the SLO"
        } else {
            "candidates meeting the target, at the target rate"
        };
        b.push_str("<div class=\"charts\">");
        b.push_str(&figure("frontier", "Frontier", sub, &chart.svg(), &legend));
        // Rate (or attainment) against GPUs.
        let simulated: Vec<&Outcome> = result.outcomes.iter().filter(|o| o.at.is_some()).collect();
        let (ylabel, value): (&str, fn(&Outcome) -> Option<f64>) = if plan.spec.search == SearchMode::MaxRate {
            ("highest rate meeting the SLO (req/s)", |o| o.max_rate)
        } else {
            ("SLO attainment at the target", |o| o.at.as_ref().map(|t| t.attainment))
        };
        let mut chart = XyChart::new(Axis::linear("GPUs").from_zero(), Axis::linear(ylabel).from_zero(), W, H);
        for (color, mode) in [(0, "aggregated"), (1, "disaggregated")] {
            let pts: Vec<&&Outcome> =
                simulated.iter().filter(|o| mode_name(&o.candidate.shape) == mode && value(o).is_some()).collect();
            if !pts.is_empty() {
                chart.push(
                    Series::new(
                        mode,
                        color,
                        Style::Dots,
                        pts.iter().map(|o| (f64::from(o.candidate.gpus()), value(o).unwrap_or(0.0))).collect(),
                    )
                    .titles(
                        pts.iter().map(|o| format!("#{} {}", o.candidate.index, o.candidate.shape.label())).collect(),
                    ),
                );
            }
        }
        if plan.spec.search == SearchMode::MaxRate {
            chart.hline(t.target, format!("target {} req/s", num(t.target)));
        } else {
            chart.hline(plan.spec.attainment, format!("asked {}", pct(plan.spec.attainment)));
        }
        let legend =
            svg::legend(&chart.series().iter().map(|s| (s.color(), s.name().to_owned(), false)).collect::<Vec<_>>());
        b.push_str(&figure("rate-by-gpus", "Each simulated candidate by its GPUs", ylabel, &chart.svg(), &legend));
        b.push_str("</div>\n");
    }

    // Launch lines.
    if let Some(best) = result.best.map(|i| &result.outcomes[i]) {
        b.push_str("<h2 id=\"launch\">Launch lines (vLLM 0.33)</h2>\n");
        let _ =
            writeln!(b, "<div class=\"scroll\"><pre>{}</pre></div>", esc(&output::launch_lines(plan, &best.candidate)));
    }

    // The candidates.
    b.push_str("<h2 id=\"candidates\">Candidates</h2>\n");
    let _ = writeln!(
        b,
        "<p class=\"note\">Cheapest first. Pruned: the analytic bound (the busiest role's capacity at its best \
         batch, or the link's bytes) is below the target, so it was not simulated. {}</p>",
        if result.outcomes.len() > TABLE_ROWS {
            format!("The first {TABLE_ROWS} of {} are listed.", result.outcomes.len())
        } else {
            String::new()
        }
    );
    b.push_str("<div class=\"scroll\"><table><thead><tr><th>#</th><th>shape</th><th>GPUs</th><th>status</th><th>bound req/s</th><th>meets</th><th>highest req/s</th><th>attainment</th><th>goodput/GPU</th><th>tok/s/user</th><th>TTFT p99 ms</th><th>TPOT p99 ms</th><th>bottleneck</th><th>trials</th><th>note</th></tr></thead><tbody>\n");
    for o in result.outcomes.iter().take(TABLE_ROWS) {
        let tr = o.at.as_ref();
        let note = match &o.status {
            Status::Infeasible(why) => why.as_str(),
            _ => "",
        };
        let mark = if result.best == Some(o.candidate.index) {
            " ★"
        } else if result.frontier.contains(&o.candidate.index) {
            " ◆"
        } else {
            ""
        };
        let _ = writeln!(
            b,
            "<tr><td>{}</td><td class=\"t\">{}{}</td><td>{}</td><td class=\"t\">{}</td><td>{}</td><td class=\"t\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"t\">{}</td><td>{}</td><td class=\"t\">{}</td></tr>",
            o.candidate.index,
            esc(&o.candidate.shape.label()),
            mark,
            o.candidate.gpus(),
            o.status.name(),
            o.bound.map_or("–".into(), |b| num(b.rate)),
            if o.meets { "yes" } else { "no" },
            o.max_rate.map_or("–".into(), num),
            tr.map_or("–".into(), |t| pct(t.attainment)),
            o.goodput_per_gpu().map_or("–".into(), num),
            o.interactivity().map_or("–".into(), num),
            tr.map_or("–".into(), |t| num(t.ttft_p99_ms)),
            tr.map_or("–".into(), |t| num(t.tpot_p99_ms)),
            o.bottleneck.unwrap_or("–"),
            o.trials.len(),
            esc(note)
        );
    }
    b.push_str("</tbody></table></div>\n");
    b.push_str("<p class=\"note\">★ best, ◆ on the frontier. candidates.csv has every column.</p>\n");
    let _ = writeln!(b, "<footer>pdsim {} plan</footer>", env!("CARGO_PKG_VERSION"));
    document(&title, &b)
}
