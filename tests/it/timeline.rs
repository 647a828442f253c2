//! The timeline is exact: on a bursty trace (tests/fixtures/trace-bursts.toml:
//! idle gaps, same-instant arrivals, preemptions, 2 prefill and 2 decode
//! ranks), `pdsim run` writes a timeline.csv whose rows are the changes of
//! every series at their instants, so that what a reader computes from it
//! (occupancy, busy shares) is what requests.csv and report.json say.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::common::{Csv, fixture, outcome, pdsim, scratch_dir};

/// Exact nanoseconds of a time in ms with six decimals.
fn ns(cell: &str) -> u64 {
    let (whole, frac) = cell.split_once('.').unwrap_or((cell, "0"));
    assert_eq!(frac.len(), 6, "{cell}");
    whole.parse::<u64>().unwrap() * 1_000_000 + frac.parse::<u64>().unwrap()
}

/// A series' rows: (time ns, value), in time order.
type Rows = Vec<(u64, u64)>;

/// The value of a series at `t`: its last row at or before `t`.
fn at(rows: &Rows, t: u64) -> u64 {
    match rows.partition_point(|&(time, _)| time <= t) {
        0 => panic!("no row at or before {t} ns"),
        i => rows[i - 1].1,
    }
}

/// The integral of a series over [from, to), value × ns.
fn integral(rows: &Rows, from: u64, to: u64) -> u128 {
    let mut total = 0;
    for (i, &(t, v)) in rows.iter().enumerate() {
        let next = rows.get(i + 1).map_or(to, |r| r.0);
        let (a, b) = (t.max(from), next.min(to));
        if b > a {
            total += u128::from(v) * u128::from(b - a);
        }
    }
    total
}

struct Run {
    report: Value,
    /// (entity, metric) -> rows.
    series: BTreeMap<(String, String), Rows>,
    /// Per request: (arrival, end) ns at the engines.
    requests: Vec<(u64, u64)>,
    /// Per request: the span between its prefill's end and its decode
    /// rank's reservation, when it has one (the proxy's hop).
    hops: Vec<(u64, u64)>,
    ranks: Vec<String>,
    links: Vec<String>,
    trace: Value,
}

impl Run {
    fn rows(&self, entity: &str, metric: &str) -> &Rows {
        self.series.get(&(entity.to_owned(), metric.to_owned())).unwrap_or_else(|| panic!("no {entity} {metric}"))
    }

    /// Requests that had arrived and not ended at `t` (requests.csv).
    fn in_system(&self, t: u64) -> u64 {
        let between = |&(h0, h1): &(u64, u64)| h0 <= t && t < h1;
        self.requests.iter().zip(&self.hops).filter(|&(&(a, e), h)| a <= t && t < e && !between(h)).count() as u64
    }

    /// The ranks' `requests` added up at `t` (timeline.csv).
    fn held(&self, t: u64) -> u64 {
        self.ranks.iter().map(|r| at(self.rows(r, "requests"), t)).sum()
    }
}

fn run_fixture(dir: &Path) -> Run {
    let scenario = fixture("trace-bursts.toml");
    let (code, _, stderr) =
        outcome(&pdsim(&["run", scenario.to_str().unwrap(), "--quiet", "--out", dir.to_str().unwrap()]));
    assert_eq!(code, 0, "{stderr}");
    let json = |f: &str| -> Value { serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap() };
    let report = json("report.json");
    let names = |k: &str| -> Vec<String> {
        report[k].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap().to_owned()).collect()
    };
    let (ranks, links) = (names("ranks"), names("links"));
    let timeline = Csv::read(&dir.join("timeline.csv"));
    assert_eq!(timeline.header, ["time_ms", "entity", "metric", "value"]);
    let mut series: BTreeMap<(String, String), Rows> = BTreeMap::new();
    let mut last_time = 0;
    for row in &timeline.rows {
        let t = ns(&row[0]);
        assert!(t >= last_time, "timeline.csv is in time order");
        last_time = t;
        let rows = series.entry((row[1].clone(), row[2].clone())).or_default();
        let v: u64 = row[3].parse().unwrap();
        if let Some(&(pt, pv)) = rows.last() {
            assert!(pt < t, "two rows of {} {} at {t} ns", row[1], row[2]);
            assert_ne!(pv, v, "a row of {} {} at {t} ns that changes nothing", row[1], row[2]);
        } else {
            assert_eq!(t, 0, "{} {} starts at time zero", row[1], row[2]);
        }
        rows.push((t, v));
    }
    // The ranks hold a request from its arrival at an engine core (one
    // way in through the API server after its arrival) to its end there
    // (one way out before its client sees the end), but not between its
    // prefill's end and its decode rank's reservation (one way out of the
    // prefill server and one way into the decode server).
    let front = &report["scenario"]["resolved"]["frontend"];
    let us = |k: &str| (front[k].as_f64().unwrap() * 1e3) as u64;
    let (request, response) = (us("request_us"), us("response_us"));
    let csv = Csv::read(&dir.join("requests.csv"));
    let (a, q, f) = (csv.col("arrival_ms"), csv.col("prefill_queued_ms"), csv.col("finished_ms"));
    let requests = csv
        .rows
        .iter()
        .map(|r| {
            assert_eq!(ns(&r[q]), ns(&r[a]) + request, "{r:?}");
            (ns(&r[q]), ns(&r[f]) - response)
        })
        .collect();
    let (d, rr) = (csv.col("prefill_done_ms"), csv.col("reserve_requested_ms"));
    let hops = csv
        .rows
        .iter()
        .map(|r| match (r[d].as_str(), r[rr].as_str()) {
            ("", _) | (_, "") => (0, 0),
            (d, rr) => {
                assert_eq!(ns(rr), ns(d) + response + request, "{r:?}");
                (ns(d), ns(rr))
            }
        })
        .collect();
    Run { report, series, requests, hops, ranks, links, trace: json("trace.json") }
}

#[test]
fn the_timeline_is_exact_on_a_bursty_trace() {
    let dir = scratch_dir("timeline-bursts");
    let run = run_fixture(&dir);
    let summary = &run.report["summary"];
    assert_eq!(summary["completed"], 300, "{summary}");
    assert!(summary["preemptions"].as_u64().unwrap() > 0, "the bursts preempt");

    // Little's law over [first arrival, last end]: the time-averaged number
    // of requests in the system from timeline.csv is λ·W from requests.csv.
    let t0 = run.requests.iter().map(|r| r.0).min().unwrap();
    let t1 = run.requests.iter().map(|r| r.1).max().unwrap();
    let span = (t1 - t0) as f64;
    let area: u128 = run.ranks.iter().map(|r| integral(run.rows(r, "requests"), t0, t1)).sum();
    let occupancy = area as f64 / span;
    let lambda = run.requests.len() as f64 / span;
    let held = |(r, h): (&(u64, u64), &(u64, u64))| (r.1 - r.0 - (h.1 - h.0)) as f64;
    let w = run.requests.iter().zip(&run.hops).map(held).sum::<f64>() / run.requests.len() as f64;
    assert!((occupancy / (lambda * w) - 1.0).abs() < 0.005, "L = {occupancy}, λW = {}", lambda * w);
    // Exactly so, at every instant any rank's count changed.
    for rows in run.ranks.iter().map(|r| run.rows(r, "requests")) {
        for &(t, _) in rows {
            assert_eq!(run.held(t), run.in_system(t), "requests in the system at {t} ns");
        }
    }

    // Busy shares: the time-weighted mean of `busy` is report.json's.
    let end = run.report["final_time_ns"].as_u64().unwrap();
    for (kind, names) in [("ranks", &run.ranks), ("links", &run.links)] {
        for (i, name) in names.iter().enumerate() {
            let share = integral(run.rows(name, "busy"), 0, end) as f64 / end as f64;
            let exact = run.report[kind][i]["busy_fraction"].as_f64().unwrap();
            assert_eq!(share, exact, "{name}");
        }
    }
    let decode_busy = run.report["ranks"][2]["busy_fraction"].as_f64().unwrap();
    assert!(decode_busy > 0.3 && decode_busy < 0.95, "decode0 is busy, and idle between bursts: {decode_busy}");

    // Idle periods: the system empties between bursts; the last change
    // before each gap is there, at its instant: every rank is empty and
    // idle from the last end on, and some rank's `running` went to 0 then.
    let mut ends: Vec<u64> = run.requests.iter().map(|r| r.1).collect();
    ends.sort_unstable();
    let gaps: Vec<u64> = ends
        .iter()
        .copied()
        .filter(|&e| {
            run.in_system(e) == 0
                && run.requests.iter().filter(|r| r.0 > e).map(|r| r.0).min().is_some_and(|a| a - e > 300_000_000)
        })
        .collect();
    assert_eq!(gaps.len(), 5, "an idle gap before each burst but the first: {gaps:?}");
    for &e in &gaps {
        for r in &run.ranks {
            for m in ["requests", "running", "waiting", "busy", "kv_used_blocks"] {
                assert_eq!(at(run.rows(r, m), e), 0, "{r} {m} at {e} ns, before the gap");
            }
        }
        assert!(
            run.ranks.iter().any(|r| run.rows(r, "running").contains(&(e, 0))),
            "a rank's running goes to 0 at {e} ns"
        );
    }

    // Same-instant arrivals: one row per series at the instant, with the
    // final value (all four arrivals counted).
    let mut arrivals: BTreeMap<u64, u64> = BTreeMap::new();
    for r in &run.requests {
        *arrivals.entry(r.0).or_default() += 1;
    }
    let groups: Vec<(u64, u64)> = arrivals.into_iter().filter(|&(_, n)| n >= 4).collect();
    assert_eq!(groups.len(), 30, "30 groups of 4 arrivals in one instant");
    for &(t, n) in &groups {
        let ended = run.requests.iter().filter(|r| r.1 == t).count() as u64;
        let before = t.checked_sub(1).map_or(0, |b| run.held(b));
        assert_eq!(run.held(t) + ended, before + n, "{n} arrivals at {t} ns");
        for r in &run.ranks {
            assert!(run.rows(r, "requests").iter().filter(|row| row.0 == t).count() <= 1);
        }
    }

    // trace.json's counters are the timeline's rows.
    let events = run.trace["traceEvents"].as_array().unwrap();
    for (pid, name) in run.ranks.iter().chain(&run.links).enumerate() {
        for (counter, key, metric) in [("seqs", "running", "running"), ("requests", "in_system", "requests")] {
            let got: Rows = events
                .iter()
                .filter(|e| {
                    e["ph"] == "C" && e["name"] == counter && e["pid"] == pid + 1 && e["args"].get(key).is_some()
                })
                .map(|e| ((e["ts"].as_f64().unwrap() * 1000.0).round() as u64, e["args"][key].as_u64().unwrap()))
                .collect();
            let want = run.series.get(&(name.clone(), metric.to_owned())).cloned().unwrap_or_default();
            assert_eq!(got, want, "{name}: trace.json's {counter} {key}");
        }
    }
}

/// The timeline metric a trace.json counter (event name, arg key) stands
/// for: Perfetto's track "`<name> <key>`"; a cache group's
/// `kv used_blocks[<group>]` is timeline.csv's `kv_used_blocks[<group>]`.
fn counter_metric(name: &str, key: &str) -> String {
    let metric = match (name, key) {
        ("kv", k) if k.starts_with("used_blocks[") => return format!("kv_{k}"),
        ("kv", "used_blocks") => "kv_used_blocks",
        ("kv", "free_blocks") => "kv_free_blocks",
        ("kv", "cached_free_blocks") => "kv_cached_free_blocks",
        ("seqs", "waiting") => "waiting",
        ("seqs", "running") => "running",
        ("handoffs", "held_sources") => "held_sources",
        ("handoffs", "pending_reservations") => "pending_reservations",
        ("handoffs", "transferring") => "transferring",
        ("transfers", "active") => "active_transfers",
        ("transfers", "queued") => "queued_transfers",
        ("bytes", "in_flight") => "bytes_in_flight",
        ("requests", "in_system") => "requests",
        ("state", "busy") => "busy",
        other => panic!("a counter no timeline metric stands for: {other:?}"),
    };
    metric.to_owned()
}

/// trace.json's counters are timeline.csv's rows, every series of every
/// metric (cache groups, handoffs held and waiting, FIFO queues included):
/// a run of the GLM 2P1D scenario under memory pressure (sources held,
/// reservations waiting, six cache groups) on FIFO links.
#[test]
fn trace_counters_are_every_timeline_row() {
    let dir = scratch_dir("timeline-trace-counters");
    let base = crate::common::scenario_file("glm-5.3-flash-2p1d-pressure.toml");
    let text = std::fs::read_to_string(&base).unwrap();
    let model = crate::common::scenario_file("models/glm-5.3-flash-tp4-fp8.toml");
    let text = text
        .replace(r#"include = ["models/glm-5.3-flash-tp4-fp8.toml"]"#, &format!("include = [{model:?}]"))
        .replace(r#"sharing = "processor_sharing""#, r#"sharing = "fifo""#);
    assert!(text.contains(r#"sharing = "fifo""#), "the scenario's link shares FIFO");
    let file = crate::common::scratch("timeline-trace-counters.toml", &text);
    let args = ["run", file.to_str().unwrap(), "--requests", "300", "--quiet", "--out", dir.to_str().unwrap()];
    let (code, _, stderr) = outcome(&pdsim(&args));
    assert_eq!(code, 0, "{stderr}");
    let timeline = Csv::read(&dir.join("timeline.csv"));
    let mut want: BTreeMap<(String, String), Rows> = BTreeMap::new();
    for row in &timeline.rows {
        want.entry((row[1].clone(), row[2].clone())).or_default().push((ns(&row[0]), row[3].parse().unwrap()));
    }
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    // pid -> entity, from the metadata events.
    let names: BTreeMap<u64, String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_owned()))
        .collect();
    let mut got: BTreeMap<(String, String), Rows> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "C") {
        let entity = names[&e["pid"].as_u64().unwrap()].clone();
        let args = e["args"].as_object().unwrap();
        assert_eq!(args.len(), 1, "one value per counter event: {e}");
        let (key, value) = args.iter().next().unwrap();
        let t = (e["ts"].as_f64().unwrap() * 1000.0).round() as u64;
        got.entry((entity, counter_metric(e["name"].as_str().unwrap(), key)))
            .or_default()
            .push((t, value.as_u64().unwrap()));
    }
    let metrics = |m: &BTreeMap<(String, String), Rows>| -> std::collections::BTreeSet<String> {
        m.keys().map(|k| k.1.clone()).collect()
    };
    // Every metric of the timeline, the groups' among them.
    let all = metrics(&want);
    for m in ["kv_free_blocks", "held_sources", "pending_reservations", "transferring", "queued_transfers"] {
        assert!(all.contains(m), "the run's timeline has {m}: {all:?}");
    }
    assert!(all.iter().filter(|m| m.starts_with("kv_used_blocks[")).count() >= 5, "{all:?}");
    assert_eq!(metrics(&got), all);
    for (k, rows) in &want {
        assert_eq!(got.get(k), Some(rows), "{k:?}: trace.json's counter against timeline.csv");
    }
    assert_eq!(got.len(), want.len());
}
