//! `pdsim report DIR` and `pdsim run --html`: the page has every chart of
//! a run (each an SVG with drawn marks) or one chart per metric and axis of
//! a sweep, is self-contained and byte-identical for the same files, says
//! which file is missing in place of its charts, and bad input exits 2
//! naming the file and the place.

use std::path::{Path, PathBuf};

use crate::common::{Csv, outcome, pdsim, scenario_file, scratch, scratch_dir};

/// The charts of a disaggregated run with a multi-group model and a
/// timeline, by `data-chart` name.
pub const RUN_CHARTS: &[&str] = &[
    "ttft_cdf",
    "tpot_cdf",
    "e2e_cdf",
    "stage_breakdown",
    "ttft_over_time",
    "request_rates",
    "outcomes",
    "kv_used",
    "kv_groups_prefill",
    "kv_groups_decode",
    "waiting",
    "running",
    "held_sources",
    "rank_busy",
    "link_bytes",
    "link_busy",
    "link_transfers",
    "link_bytes_in_flight",
];

/// The charts that need timeline.csv.
const TIMELINE_CHARTS: &[&str] = &[
    "kv_used",
    "kv_cached",
    "kv_groups_prefill",
    "kv_groups_decode",
    "waiting",
    "running",
    "pending_reservations",
    "held_sources",
    "rank_busy",
    "link_busy",
    "link_transfers",
    "link_queued",
    "link_bytes_in_flight",
];

/// The charts that need requests.csv.
const REQUEST_CHARTS: &[&str] =
    &["ttft_cdf", "tpot_cdf", "e2e_cdf", "stage_breakdown", "ttft_over_time", "request_rates"];

/// Runs `pdsim` with `args`, asserting exit 0; returns stdout.
fn ok(args: &[&str]) -> String {
    let (code, stdout, stderr) = outcome(&pdsim(args));
    assert_eq!(code, 0, "{args:?}: {stderr}");
    stdout
}

/// Runs a shipped scenario with `--requests 120 --html` (and `extra`) into
/// a fresh folder `name`.
pub fn run_with_html(scenario: &str, name: &str, extra: &[&str]) -> PathBuf {
    let dir = scratch_dir(name);
    let path = scenario_file(scenario);
    let mut args = vec!["run", path.to_str().unwrap(), "--requests", "120", "--quiet", "--html", "--out"];
    args.push(dir.to_str().unwrap());
    args.extend_from_slice(extra);
    ok(&args);
    dir
}

/// A tiny sweep over the scratch scenario: 2 x 2 axis points x 2 seeds,
/// each point's report.json written (`--reports`).
pub fn tiny_sweep(name: &str) -> PathBuf {
    let scenario = scratch(&format!("{name}-scenario.toml"), &crate::common::base_scenario());
    let file = scratch(
        &format!("{name}.toml"),
        &format!(
            "scenario = {:?}\nseeds = [1, 2]\nrequests = 12\n[axes]\n\"decode.count\" = [1, 2]\n\"workload.arrival.rate_per_s\" = [2.0, 50.0]\n",
            scenario.display().to_string()
        ),
    );
    let dir = scratch_dir(name);
    ok(&["sweep", file.to_str().unwrap(), "--out", dir.to_str().unwrap(), "--quiet", "--reports"]);
    dir
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `<figure class="chart" ...>...</figure>` of the page: (name, body).
pub fn figures(html: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find("<figure class=\"chart\" data-chart=\"") {
        rest = &rest[i + "<figure class=\"chart\" data-chart=\"".len()..];
        let name = rest[..rest.find('"').unwrap()].to_owned();
        let end = rest.find("</figure>").expect("a figure is closed");
        out.push((name, rest[..end].to_owned()));
        rest = &rest[end..];
    }
    out
}

/// The page refers to nothing outside itself and runs no script.
fn self_contained(html: &str) {
    let without_ns = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    for bad in ["http://", "https://", "<script", "<link", "<img", "url(", "@import", "<iframe"] {
        assert!(!without_ns.contains(bad), "the page holds {bad:?}");
    }
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.ends_with("</html>\n"));
}

#[test]
fn run_html_has_every_chart_and_is_deterministic() {
    let dir = run_with_html("glm-5.3-flash-1p1d.toml", "report-glm", &[]);
    let html = read(&dir.join("report.html"));
    self_contained(&html);
    let figs = figures(&html);
    let names: Vec<&str> = figs.iter().map(|f| f.0.as_str()).collect();
    for want in RUN_CHARTS {
        assert!(names.contains(want), "no chart {want} in {names:?}");
    }
    for (name, body) in &figs {
        assert_eq!(body.matches("<svg").count(), 1, "{name}: one svg");
        assert!(body.contains("class=\"mark"), "{name}: no data mark");
        assert!(!body.contains("NaN") && !body.contains("inf"), "{name}: a number that is not one");
    }
    // Unique names (they are the ids).
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "{names:?}");
    assert!(!html.contains("data-missing"), "nothing is missing");
    // The summary tables.
    for t in ["latency", "ranks", "links", "bench"] {
        assert!(html.contains(&format!("data-table=\"{t}\"")), "no {t} table");
    }
    assert!(html.contains("glm-5.3-flash-1p1d"));

    // The same files give the same bytes: `pdsim report` on the folder, and
    // a second run into another folder (no path is written into the page).
    let again = dir.join("again.html");
    let stdout = ok(&["report", dir.to_str().unwrap(), "--out", again.to_str().unwrap()]);
    assert!(stdout.contains("run report:") && stdout.contains("charts"), "{stdout}");
    assert!(read(&again) == html, "pdsim report gives other bytes than run --html");
    let other = run_with_html("glm-5.3-flash-1p1d.toml", "report-glm-again", &[]);
    assert!(read(&other.join("report.html")) == html, "two runs give different pages");
    // Bounded size: a 120-request run's page is well under a megabyte.
    assert!(html.len() < 1 << 20, "{} bytes", html.len());
}

#[test]
fn a_run_without_html_removes_a_stale_page() {
    let dir = run_with_html("llama-3.1-8b-aggregated.toml", "report-stale", &[]);
    assert!(dir.join("report.html").is_file());
    let path = scenario_file("llama-3.1-8b-aggregated.toml");
    ok(&["run", path.to_str().unwrap(), "--requests", "20", "--quiet", "--out", dir.to_str().unwrap()]);
    assert!(!dir.join("report.html").exists(), "report.html of the earlier run is left");
}

#[test]
fn aggregated_run_has_no_link_charts_and_says_so() {
    let dir = run_with_html("llama-3.1-8b-aggregated.toml", "report-agg", &[]);
    let html = read(&dir.join("report.html"));
    let names: Vec<String> = figures(&html).into_iter().map(|f| f.0).collect();
    for want in ["ttft_cdf", "e2e_cdf", "stage_breakdown", "kv_used", "waiting", "running", "rank_busy", "outcomes"] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    assert!(!names.iter().any(|n| n.starts_with("link")), "{names:?}");
    assert!(html.contains("No links: an aggregated deployment"));
}

#[test]
fn missing_files_give_notes_in_place_of_their_charts() {
    let dir = run_with_html("gpt-oss-1p1d.toml", "report-no-timeline", &["--no-timeline", "--no-trace"]);
    assert!(!dir.join("timeline.csv").exists());
    let html = read(&dir.join("report.html"));
    assert!(html.contains("data-missing=\"timeline.csv\""), "no note for the timeline");
    let names: Vec<String> = figures(&html).into_iter().map(|f| f.0).collect();
    for n in TIMELINE_CHARTS {
        assert!(!names.iter().any(|x| x == n), "{n} drawn without a timeline");
    }
    for n in REQUEST_CHARTS.iter().chain(&["outcomes", "link_bytes"]) {
        assert!(names.iter().any(|x| x == n), "no {n}");
    }
    // Without requests.csv as well: only report.json's charts remain (its
    // latency statistics and stage means, each rank's busy share and peak
    // KV, the outcomes, the links' bytes).
    std::fs::remove_file(dir.join("requests.csv")).unwrap();
    let stdout = ok(&["report", dir.to_str().unwrap()]);
    assert!(stdout.contains("no requests.csv, no timeline.csv"), "{stdout}");
    let html = read(&dir.join("report.html"));
    assert!(html.contains("data-missing=\"requests.csv\""));
    let names: Vec<String> = figures(&html).into_iter().map(|f| f.0).collect();
    assert_eq!(names, ["latency_stats", "stage_means", "outcomes", "rank_busy_share", "rank_peak_kv", "link_bytes"]);
}

#[test]
fn sweep_page_has_one_chart_per_metric_and_axis() {
    let dir = tiny_sweep("report-sweep");
    ok(&["report", dir.to_str().unwrap()]);
    let html = read(&dir.join("report.html"));
    self_contained(&html);
    let csv = Csv::read(&dir.join("sweep.csv"));
    let seed = csv.col("seed");
    let axes = &csv.header[1..seed];
    assert_eq!(axes, ["decode.count", "workload.arrival.rate_per_s"]);
    let metrics = &csv.header[seed + 1..];
    let figs = figures(&html);
    // Every metric column is drawn against every axis, or listed as not
    // drawn (constant, a copy of an earlier column, or not numbers).
    let skipped = &html[html.find("data-skipped").unwrap_or(html.len())..];
    let mut drawn = 0;
    for m in metrics {
        let charted: Vec<bool> = axes.iter().map(|a| figs.iter().any(|f| f.0 == format!("{m}@{a}"))).collect();
        if charted.iter().all(|c| *c) {
            drawn += 1;
        } else {
            assert!(charted.iter().all(|c| !c), "{m}: drawn against some axes only");
            assert!(skipped.contains(&format!("<code>{m}</code>")), "{m} neither drawn nor listed");
        }
    }
    assert!(drawn >= 10, "{drawn} metrics drawn");
    assert_eq!(figs.len(), drawn * axes.len());
    for key in ["mean_ttft_ms", "request_throughput", "mean_e2el_ms"] {
        for a in axes {
            assert!(figs.iter().any(|f| f.0 == format!("{key}@{a}")), "no {key}@{a}");
        }
    }
    for (name, body) in &figs {
        assert!(body.contains("class=\"mark"), "{name}: no data mark");
    }
    // Two seeds: each seed's value is drawn too.
    assert!(html.contains("fill-opacity=\"0.45\""));
    assert!(skipped.contains("<code>digest</code>"));
    // Deterministic.
    let again = dir.join("again.html");
    ok(&["report", dir.to_str().unwrap(), "--out", again.to_str().unwrap()]);
    assert!(read(&again) == html);
}

#[test]
fn zipped_axes_are_one_dimension_of_the_sweep_page() {
    let scenario = scratch("report-zip-scenario.toml", &crate::common::base_scenario());
    let file = scratch(
        "report-zip.toml",
        &format!(
            "scenario = {:?}\nrequests = 12\n[axes]\n\"workload.arrival.rate_per_s\" = [2.0, 50.0]\n[[zip]]\n\"prefill.count\" = [1, 2]\n\"decode.count\" = [2, 1]\n",
            scenario.display().to_string()
        ),
    );
    let dir = scratch_dir("report-zip");
    ok(&["sweep", file.to_str().unwrap(), "--out", dir.to_str().unwrap(), "--quiet"]);
    ok(&["report", dir.to_str().unwrap()]);
    let html = read(&dir.join("report.html"));
    let figs = figures(&html);
    let zip = "prefill.count / decode.count";
    assert!(figs.iter().any(|f| f.0 == format!("mean_ttft_ms@{zip}")), "no chart against the zip");
    assert!(figs.iter().any(|f| f.0 == "mean_ttft_ms@workload.arrival.rate_per_s"));
    assert!(!figs.iter().any(|f| f.0.ends_with("@prefill.count") || f.0.ends_with("@decode.count")));
    assert!(html.contains("1 / 2, 2 / 1"), "the zip's values, paired");
    // One line per value of the other dimension: two lines against the zip.
    assert!(html.contains("workload.arrival.rate_per_s=2.0") && html.contains("workload.arrival.rate_per_s=50.0"));
    assert!(!html.contains("prefill.count=1, decode.count=2"), "a zipped column is no line of its own");
}

#[test]
fn bad_folders_and_files_exit_2_naming_them() {
    let fail = |args: &[&str]| {
        let (code, stdout, stderr) = outcome(&pdsim(args));
        assert_eq!(code, 2, "{args:?}: {stdout} {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        stderr
    };
    let empty = scratch_dir("report-empty");
    let e = fail(&["report", empty.to_str().unwrap()]);
    assert!(e.contains(&format!("{}: no report.json or sweep.csv", empty.display())), "{e}");
    let nowhere = empty.join("nowhere");
    let e = fail(&["report", nowhere.to_str().unwrap()]);
    assert!(e.contains("nowhere: not a folder"), "{e}");
    std::fs::write(empty.join("sweep.shard-1-of-2.csv"), "point,seed\n").unwrap();
    let e = fail(&["report", empty.to_str().unwrap()]);
    assert!(e.contains("cat sweep.shard-*-of-N.csv > sweep.csv"), "{e}");

    // A report.json field of the wrong type: the file, line, column, field.
    let dir = run_with_html("llama-3.1-8b-aggregated.toml", "report-bad", &["--no-trace"]);
    let report = read(&dir.join("report.json"));
    let broken = report.replacen("\"p99\": ", "\"p99\": \"x\", \"was\": ", 1);
    std::fs::write(dir.join("report.json"), &broken).unwrap();
    let e = fail(&["report", dir.to_str().unwrap()]);
    assert!(e.contains("report.json:") && e.contains("summary.ttft_ms.p99: invalid type: string \"x\""), "{e}");
    std::fs::write(dir.join("report.json"), &report[..report.len() / 2]).unwrap();
    let e = fail(&["report", dir.to_str().unwrap()]);
    assert!(e.contains("report.json:") && e.contains("EOF"), "{e}");
    std::fs::write(dir.join("report.json"), &report).unwrap();

    // A timeline row with a bad value: the file, its line and the column.
    let timeline = read(&dir.join("timeline.csv"));
    let mut lines: Vec<String> = timeline.lines().map(str::to_owned).collect();
    let fields: Vec<&str> = lines[4].split(',').collect();
    lines[4] = format!("{},{},{},many", fields[0], fields[1], fields[2]);
    std::fs::write(dir.join("timeline.csv"), lines.join("\n") + "\n").unwrap();
    let e = fail(&["report", dir.to_str().unwrap()]);
    assert!(e.contains("timeline.csv:5: column value: expected a whole number >= 0, got \"many\""), "{e}");
    std::fs::write(dir.join("timeline.csv"), &timeline).unwrap();

    // requests.csv without a column it needs.
    let requests = read(&dir.join("requests.csv"));
    std::fs::write(dir.join("requests.csv"), requests.replacen("ttft_ms", "ttft", 1)).unwrap();
    let e = fail(&["report", dir.to_str().unwrap()]);
    assert!(e.contains("requests.csv:1: no column ttft_ms in the header"), "{e}");
    // ... or a time that is not one.
    let mut rows: Vec<String> = requests.lines().map(str::to_owned).collect();
    let header: Vec<&str> = rows[0].split(',').collect();
    let arrival = header.iter().position(|h| *h == "arrival_ms").unwrap();
    let mut cells: Vec<String> = rows[3].split(',').map(str::to_owned).collect();
    cells[arrival] = "soon".into();
    rows[3] = cells.join(",");
    std::fs::write(dir.join("requests.csv"), rows.join("\n") + "\n").unwrap();
    let e = fail(&["report", dir.to_str().unwrap()]);
    assert!(e.contains("requests.csv:4: column arrival_ms: expected milliseconds >= 0, got \"soon\""), "{e}");
    std::fs::write(dir.join("requests.csv"), &requests).unwrap();
    ok(&["report", dir.to_str().unwrap()]);

    // A sweep.csv whose rows do not fit its header.
    let sweep = scratch_dir("report-bad-sweep");
    std::fs::write(sweep.join("sweep.csv"), "point,a,seed,x\n0,1,1,2\n1,2,1\n").unwrap();
    let e = fail(&["report", sweep.to_str().unwrap()]);
    assert!(e.contains("sweep.csv:3: 3 fields, but the header has 4"), "{e}");
}

/// Runs `pdsim report` on a folder holding only `sweep.csv` = `csv`; the
/// outcome is a page (exit 0) or exit 2 with one line naming sweep.csv —
/// never a hang, panic or internal error.
fn report_sweep_csv(name: &str, csv: &str) -> (i32, String) {
    let dir = scratch_dir(name);
    std::fs::write(dir.join("sweep.csv"), csv).unwrap();
    let (code, stdout, stderr) = outcome(&pdsim(&["report", dir.to_str().unwrap()]));
    match code {
        0 => {
            let html = read(&dir.join("report.html"));
            assert!(!html.contains("NaN") && !html.contains("inf\""), "{name}: a number that is not one");
        }
        2 => assert!(stderr.lines().count() == 1 && stderr.contains("sweep.csv"), "{name}: {stderr}"),
        _ => panic!("{name}: exit {code}: {stdout} {stderr}"),
    }
    (code, stderr)
}

#[test]
fn extreme_sweep_values_give_a_page_not_a_hang_or_crash() {
    // An axis range that fits in f64 but whose padded span does not (this
    // hung in `thin` with NaN pixels), one whose span overflows outright
    // (an index out of bounds), and metrics whose tick labels would be
    // dozens of characters long (a `clamp` with min > max).
    let cases = [
        ("report-huge-range", "point,a,seed,x\n0,-1e308,1,1\n1,7.9e307,1,2\n2,0,1,3\n"),
        ("report-overflow-range", "point,a,seed,x\n0,1e308,1,1\n1,-1e308,1,2\n"),
        ("report-huge-metric", "point,a,seed,x\n0,1,1,1e70\n1,2,1,2\n"),
        ("report-tiny-metric", "point,a,seed,x\n0,1,1,1e-60\n1,2,1,2e-60\n"),
    ];
    for (name, csv) in cases {
        report_sweep_csv(name, csv);
    }
}

#[test]
fn a_timeline_of_many_series_is_not_kept_in_memory() {
    // 20,000 entities that are no rank or link of report.json: read and
    // checked, not kept (they cost 40 KB each: 443 MB before).
    let dir = run_with_html("llama-3.1-8b-aggregated.toml", "report-many-series", &["--no-trace"]);
    let mut text = String::from("time_ms,entity,metric,value\n");
    for i in 0..20_000 {
        text.push_str(&format!("0,e{i},m,1\n"));
    }
    std::fs::write(dir.join("timeline.csv"), &text).unwrap();
    ok(&["report", dir.to_str().unwrap()]);
    // A rank with more metrics than the cap: the page is made without its
    // series, and names it as left out (the series kept are bounded).
    let report = read(&dir.join("report.json"));
    let v: serde_json::Value = serde_json::from_str(&report).unwrap();
    let rank = v["ranks"][0]["name"].as_str().unwrap().to_owned();
    let mut text = String::from("time_ms,entity,metric,value\n");
    for i in 0..5_000 {
        text.push_str(&format!("0,{rank},m{i},1\n"));
    }
    std::fs::write(dir.join("timeline.csv"), &text).unwrap();
    ok(&["report", dir.to_str().unwrap()]);
    let page = read(&dir.join("report.html"));
    assert!(page.contains(&format!("the 1 entity past them is left out of the charts over time ({rank})")));
}

#[test]
fn huge_report_json_numbers_do_not_overflow() {
    let dir = run_with_html("llama-3.1-8b-aggregated.toml", "report-huge-numbers", &["--no-trace"]);
    let report = read(&dir.join("report.json"));
    let mut v: serde_json::Value = serde_json::from_str(&report).unwrap();
    // Hit tokens whose sum is past u64::MAX, and counts that overflow
    // completed + failed: a page, with the sum in full.
    v["summary"]["prefill_hit_tokens"] = u64::MAX.into();
    v["summary"]["decode_hit_tokens"] = (u64::MAX - 1).into();
    v["summary"]["completed"] = u64::MAX.into();
    v["summary"]["failed"] = u64::MAX.into();
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&v).unwrap()).unwrap();
    ok(&["report", dir.to_str().unwrap()]);
    let html = read(&dir.join("report.html"));
    assert!(html.contains("36,893,488,147,419,103,229 tok"), "the hit-token sum in full");
    // A run end at u64::MAX ns: exit 2 naming the file and the field.
    v["final_time_ns"] = u64::MAX.into();
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let (code, stdout, stderr) = outcome(&pdsim(&["report", dir.to_str().unwrap()]));
    assert_eq!(code, 2, "{stdout} {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("report.json: final_time_ns: 18446744073709551615 is past"), "{stderr}");
    // Just under the cap: a page.
    v["final_time_ns"] = 18_000_000_000_000_000_000u64.into();
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&v).unwrap()).unwrap();
    ok(&["report", dir.to_str().unwrap()]);
}

#[test]
fn a_big_sweep_csv_gives_a_bounded_page() {
    // 60,000 rows: axis a with 30,000 values, b with 2 (a full grid). This
    // took 28 s (linear lookups per row) and made an 18 MB page (a tick per
    // value, a dot per point).
    let mut csv = String::from("point,a,b,seed,x,y\n");
    for i in 0..60_000u64 {
        let _ = std::fmt::Write::write_fmt(
            &mut csv,
            format_args!("{i},{},{},1,{},{}\n", i / 2, i % 2, i % 1000, (i * 7) % 13),
        );
    }
    let dir = scratch_dir("report-big-sweep");
    std::fs::write(dir.join("sweep.csv"), &csv).unwrap();
    ok(&["report", dir.to_str().unwrap()]);
    let html = read(&dir.join("report.html"));
    assert!(html.len() < 3 << 20, "{} bytes", html.len());
    let figs = figures(&html);
    assert!(figs.iter().any(|f| f.0 == "x@a") && figs.iter().any(|f| f.0 == "x@b"));
    // Against b: one line per value of a, capped; against a: two lines of
    // 30,000 points, drawn without dots.
    assert!(html.contains("only the first 20 of its 30000 lines are drawn"), "no note on the lines left out");
    assert!(html.contains("drawn without dots"), "no note on the dots left out");
    assert!(html.contains("… (30000 values)"));
}

#[test]
fn a_zip_with_a_repeated_value_is_one_dimension() {
    // link.sharing = [fifo, processor_sharing, fifo] zipped with three
    // rates: the rate determines the sharing (not the other way round).
    // Crossed with an independent axis `n`, which stays its own dimension.
    let mut csv = String::from("point,n,link.sharing,workload.arrival.rate_per_s,seed,x\n");
    let mut p = 0;
    for n in [1, 2] {
        for (s, r) in [("fifo", "2.0"), ("processor_sharing", "5.0"), ("fifo", "9.0")] {
            csv.push_str(&format!("{p},{n},{s},{r},1,{}\n", p * 3 + 1));
            p += 1;
        }
    }
    let dir = scratch_dir("report-zip-repeated");
    std::fs::write(dir.join("sweep.csv"), &csv).unwrap();
    ok(&["report", dir.to_str().unwrap()]);
    let html = read(&dir.join("report.html"));
    let names: Vec<String> = figures(&html).into_iter().map(|f| f.0).collect();
    let zip = "link.sharing / workload.arrival.rate_per_s";
    assert_eq!(names, ["x@n".to_owned(), format!("x@{zip}")], "{names:?}");
    assert!(html.contains("fifo / 2.0, processor_sharing / 5.0, fifo / 9.0"), "the zip's values, paired");
}

/// A count of a few (sequences running on a rank) that changes hundreds of
/// times is drawn over its highest value per window, thin steps, not a
/// lowest-to-highest band: between 0 and 3 in every bucket, the band filled
/// the chart solid. A large count (KV blocks) keeps its band.
#[test]
fn small_counts_are_not_drawn_as_solid_bands() {
    let dir = scratch_dir("report-small-bands");
    let f = scenario_file("glm-5.3-flash-1p1d.toml");
    let args =
        ["run", f.to_str().unwrap(), "--requests", "600", "--no-trace", "-q", "--html", "--out", dir.to_str().unwrap()];
    let (code, _, stderr) = outcome(&pdsim(&args));
    assert_eq!(code, 0, "{stderr}");
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    let charts = figures(&html);
    let chart = |name: &str| &charts.iter().find(|f| f.0 == name).unwrap_or_else(|| panic!("no {name}")).1;
    let running = chart("running");
    assert!(running.contains("time-weighted mean per"), "the running chart is coarse here: {running:.300}");
    assert!(!running.contains("mark band"), "no band for a small count");
    assert!(running.contains("thin steps: highest per") && running.contains(r#"stroke-opacity="0.5""#));
    assert!(chart("kv_used").contains("mark band"), "KV blocks keep their band");
}

/// A sweep point's folder holds report.json alone; its page draws what
/// that gives (each latency's statistics, the stage means, each rank's busy
/// share and peak KV, outcomes, the links' bytes) beside the notes of what
/// needs requests.csv or timeline.csv.
#[test]
fn a_sweep_points_page_draws_what_its_report_gives() {
    let dir = tiny_sweep("report-point-page");
    let point = dir.join("points").join("count=2,rate_per_s=50.0,seed=1");
    ok(&["report", point.to_str().unwrap(), "--quiet"]);
    let html = read(&point.join("report.html"));
    let names: Vec<String> = figures(&html).into_iter().map(|f| f.0).collect();
    assert_eq!(
        names,
        ["latency_stats", "stage_means", "outcomes", "rank_busy_share", "rank_peak_kv", "link_bytes"],
        "the point's charts"
    );
    for file in ["requests.csv", "timeline.csv"] {
        assert!(html.contains(&format!("data-missing=\"{file}\"")), "{file} said missing");
    }
    assert!(
        html.contains("a sweep point&#39;s folder holds report.json alone")
            || html.contains("a sweep point's folder holds report.json alone")
    );
}

/// The sweep page: titles in words with units, lines that coincide kept
/// apart, overloaded points marked, a log scale where an overloaded
/// point's TTFT dwarfs the others', and the scenario's SLO drawn. The GLM
/// 1P1D scenario (TTFT SLO 2 s) serves about 6 req/s: at 12 req/s it is
/// overloaded, at 4 it is not.
#[test]
fn sweep_page_marks_overload_and_the_slo_in_words() {
    let base = scenario_file("glm-5.3-flash-1p1d.toml");
    let file = scratch(
        "report-sweep-overload.toml",
        &format!(
            "scenario = {:?}\nrequests = 300\n[axes]\n\"workload.arrival.rate_per_s\" = [4.0, 12.0]\n\"link.sharing\" = [\"fifo\", \"processor_sharing\"]\n",
            base.display().to_string()
        ),
    );
    let dir = scratch_dir("report-sweep-overload");
    ok(&["sweep", file.to_str().unwrap(), "--out", dir.to_str().unwrap(), "--quiet"]);
    let csv = Csv::read(&dir.join("sweep.csv"));
    assert_eq!(csv.column("overloaded"), ["false", "false", "true", "true"]);
    assert_eq!(csv.column("bottleneck")[2], "prefill");
    assert_eq!(csv.column("slo_ttft_ms"), ["2000.000000"; 4]);
    ok(&["report", dir.to_str().unwrap(), "--quiet"]);
    let html = read(&dir.join("report.html"));
    // Axes and metrics in words with units.
    assert!(html.contains("Metrics against arrival rate (req/s) (<code>workload.arrival.rate_per_s</code>)"));
    let charts = figures(&html);
    let chart = |name: &str| &charts.iter().find(|f| f.0 == name).unwrap_or_else(|| panic!("no {name}")).1;
    let ttft = chart("mean_ttft_ms@workload.arrival.rate_per_s");
    assert!(ttft.contains("<figcaption>TTFT mean (ms)"), "{ttft:.200}");
    // fifo and processor sharing give the same numbers on an idle link:
    // two lines on the same points, one wide and solid, one narrow and
    // dashed over it.
    assert!(ttft.contains(r#"stroke-width="3.4""#) && ttft.contains(r#"stroke-dasharray="7 3""#));
    // The overloaded point (about 30 s of TTFT against 0.4 s) is a ring,
    // on a log scale, and the 2 s SLO is drawn.
    assert!(ttft.contains("(log scale)") && ttft.contains(r##"fill="#fff""##), "{ttft}");
    assert!(ttft.contains(r#"class="ref""#) && ttft.contains("SLO 2000.0"), "{ttft}");
    assert!(
        html.contains("a ring marks a point where a seed&#39;s run was overloaded")
            || html.contains("a ring marks a point where a seed's run was overloaded")
    );
    // A share keeps its linear axis.
    assert!(!chart("slo_attainment@workload.arrival.rate_per_s").contains("log scale"));
}
