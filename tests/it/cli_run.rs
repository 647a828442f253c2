//! `pdsim run` (and `pdsim` with no arguments): the four files it writes
//! agree with each other and with the summary, runs are deterministic, and
//! bad input exits 2 naming the place.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

use crate::common::{Csv, names_in, outcome, pdsim, pdsim_in, pdsim_with_small_files, scenario_file, scratch_dir};

/// Runs `pdsim run <scenario> --out <dir> <extra...>` and asserts exit 0.
fn run_into(scenario: &str, dir: &Path, extra: &[&str]) -> String {
    let path = scenario_file(scenario);
    let mut args = vec!["run", path.to_str().unwrap(), "--out", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = outcome(&pdsim(&args));
    assert_eq!(code, 0, "{scenario}: {stderr}");
    assert!(stderr.is_empty(), "no progress bar off a terminal: {stderr:?}");
    stdout
}

fn json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ms(cell: &str) -> f64 {
    cell.parse().unwrap_or_else(|e| panic!("{cell:?}: {e}"))
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// Checks report.json, requests.csv, timeline.csv and trace.json of one run
/// against each other; returns (report, requests).
fn check_files(dir: &Path, requests: u64, disaggregated: bool) -> (Value, Csv) {
    let report = json(&dir.join("report.json"));
    for key in [
        "pdsim_version",
        "scenario",
        "seed",
        "workload",
        "summary",
        "ranks",
        "links",
        "events",
        "final_time_ns",
        "digest",
        "violations",
    ] {
        assert!(report.get(key).is_some(), "report.json has no {key}");
    }
    assert_eq!(report["pdsim_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(report["violations"], serde_json::json!([]));
    assert!(report["scenario"]["resolved"]["model"].is_object());
    assert_eq!(report["scenario"]["resolved"]["seed"], report["seed"]);
    let digest = report["digest"].as_str().unwrap();
    assert_eq!(digest.len(), 16, "{digest}");
    assert!(digest.chars().all(|c| c.is_ascii_hexdigit()));
    assert!(report["workload"]["rows_read"].is_u64());
    let s = &report["summary"];
    for stat in [
        "ttft_ms",
        "tpot_ms",
        "itl_ms",
        "e2e_ms",
        "prefill_queue_ms",
        "prefill_time_ms",
        "transfer_wait_ms",
        "transfer_time_ms",
        "decode_queue_ms",
    ] {
        for q in ["count", "mean", "median", "p90", "p95", "p99", "max"] {
            assert!(s[stat][q].is_number(), "summary.{stat}.{q}");
        }
    }
    for key in ["request_throughput", "output_token_throughput", "total_token_throughput", "goodput", "slo_attainment"]
    {
        assert!(s[key].is_number(), "summary.{key}");
    }
    assert!(s["failure_reasons"].is_object());
    for r in report["ranks"].as_array().unwrap() {
        for key in ["steps", "busy_fraction", "peak_used_blocks", "peak_used_fraction", "evicted_blocks", "refusals"] {
            assert!(r.get(key).is_some(), "rank {}: {key}", r["name"]);
        }
        let f = r["busy_fraction"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&f), "{f}");
    }

    // requests.csv: one row per request, consistent with the summary.
    let csv = Csv::read(&dir.join("requests.csv"));
    assert_eq!(csv.rows.len() as u64, requests);
    assert_eq!(s["requests"], requests);
    let ids: Vec<u64> = csv.column("id").iter().map(|c| c.parse().unwrap()).collect();
    assert_eq!(ids, (0..requests).collect::<Vec<_>>());
    let outcomes = csv.column("outcome");
    let completed = outcomes.iter().filter(|o| **o == "completed").count() as u64;
    assert_eq!(s["completed"], completed);
    assert_eq!(s["failed"], requests - completed);
    let ttft: Vec<f64> = csv.column("ttft_ms").iter().filter(|c| !c.is_empty()).map(|c| ms(c)).collect();
    assert_eq!(ttft.len() as u64, completed);
    let want = s["ttft_ms"]["mean"].as_f64().unwrap();
    assert!((mean(&ttft) - want).abs() < 1e-6, "TTFT mean {} vs report {want}", mean(&ttft));
    let e2e: Vec<f64> = csv.column("e2e_ms").iter().filter(|c| !c.is_empty()).map(|c| ms(c)).collect();
    assert!((mean(&e2e) - s["e2e_ms"]["mean"].as_f64().unwrap()).abs() < 1e-6);
    let bytes: u64 = csv.column("transfer_bytes").iter().map(|c| c.parse::<u64>().unwrap()).sum();
    assert_eq!(s["transfer_bytes"], bytes);
    // Exact nanoseconds: e2e = finished - arrival to the digit.
    for row in &csv.rows {
        let (a, f, e) = (&row[csv.col("arrival_ms")], &row[csv.col("finished_ms")], &row[csv.col("e2e_ms")]);
        let ns = |c: &str| -> u64 {
            let (whole, frac) = c.split_once('.').unwrap();
            assert_eq!(frac.len(), 6, "{c}");
            whole.parse::<u64>().unwrap() * 1_000_000 + frac.parse::<u64>().unwrap()
        };
        assert_eq!(ns(f) - ns(a), ns(e));
    }

    // timeline.csv: the header, samples of known entities, in time order.
    let timeline = Csv::read(&dir.join("timeline.csv"));
    assert_eq!(timeline.header, ["time_ms", "entity", "metric", "value"]);
    assert!(!timeline.rows.is_empty());
    let names: BTreeSet<String> = report["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .chain(report["links"].as_array().unwrap())
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect();
    let entities: BTreeSet<String> = timeline.column("entity").iter().map(|s| (*s).to_owned()).collect();
    assert!(entities.is_subset(&names), "{entities:?} vs {names:?}");
    let metrics: BTreeSet<&str> = timeline.column("metric").into_iter().collect();
    assert!(metrics.contains("kv_used_blocks") && metrics.contains("waiting"), "{metrics:?}");
    let times: Vec<f64> = timeline.column("time_ms").iter().map(|c| ms(c)).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));

    // trace.json: a track per rank and link, and one slice per stage.
    let trace = json(&dir.join("trace.json"));
    let events = trace["traceEvents"].as_array().unwrap();
    let tracks: BTreeSet<String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(tracks, names);
    let mut begins: BTreeMap<(String, String, u64), f64> = BTreeMap::new();
    let mut per_cat: BTreeMap<String, u64> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "b" || e["ph"] == "e") {
        let key =
            (e["cat"].as_str().unwrap().to_owned(), e["id"].as_str().unwrap().to_owned(), e["pid"].as_u64().unwrap());
        let ts = e["ts"].as_f64().unwrap();
        if e["ph"] == "b" {
            assert!(begins.insert(key.clone(), ts).is_none(), "{key:?} begins twice");
            *per_cat.entry(key.0).or_default() += 1;
        } else {
            let b = begins.remove(&key).unwrap_or_else(|| panic!("{key:?} ends without a begin"));
            assert!(ts >= b);
        }
    }
    assert!(begins.is_empty(), "slices never ended: {begins:?}");
    let moved = csv.column("transfer_bytes").iter().filter(|c| **c != "0").count() as u64;
    assert_eq!(per_cat.get("prefill").copied().unwrap_or(0), completed, "{per_cat:?}");
    assert_eq!(per_cat.get("decode").copied().unwrap_or(0), completed, "{per_cat:?}");
    assert_eq!(per_cat.get("transfer").copied().unwrap_or(0), if disaggregated { moved } else { 0 }, "{per_cat:?}");
    if disaggregated {
        assert!(moved > 0);
    }
    assert!(events.iter().any(|e| e["ph"] == "C"), "KV counters");
    (report, csv)
}

#[test]
fn files_agree_with_each_other_and_the_summary() {
    let dir = scratch_dir("run-glm-1p1d");
    let stdout = run_into("glm-5.3-flash-1p1d.toml", &dir, &["--requests", "40"]);
    assert!(stdout.contains("TTFT") && stdout.contains("40 entered"), "{stdout}");
    assert!(stdout.contains(dir.to_str().unwrap()), "{stdout}");
    let (report, _) = check_files(&dir, 40, true);
    assert_eq!(report["seed"], 1);
    assert_eq!(report["requests_override"], 40);
    assert_eq!(report["scenario"]["resolved"]["workload"]["requests"], 40);
    assert_eq!(report["links"][0]["name"], "link-p0-d0");
}

#[test]
fn every_shipped_scenario_runs() {
    for (name, disaggregated) in [
        ("glm-5.3-flash-2p2d.toml", true),
        ("gpt-oss-1p1d.toml", true),
        ("mamba2-hybrid-1p1d.toml", true),
        ("llama-3.1-8b-1p1d.toml", true),
        ("llama-3.1-8b-aggregated.toml", false),
        ("glm-5.3-flash-2p1d-pressure.toml", true),
    ] {
        let dir = scratch_dir(&format!("run-shipped-{name}"));
        run_into(name, &dir, &["--requests", "25", "--quiet"]);
        check_files(&dir, 25, disaggregated);
    }
}

#[test]
fn aggregated_runs_have_no_links_and_no_transfers() {
    let dir = scratch_dir("run-aggregated");
    run_into("llama-3.1-8b-aggregated.toml", &dir, &["--requests", "30", "--quiet"]);
    let (report, csv) = check_files(&dir, 30, false);
    assert_eq!(report["links"], serde_json::json!([]));
    assert!(csv.column("decode_rank").iter().all(|c| c.is_empty()));
    assert!(csv.column("prefill_rank").iter().all(|c| c.starts_with("aggregated")));
    let trace = std::fs::read_to_string(dir.join("trace.json")).unwrap();
    assert!(!trace.contains("\"cat\":\"transfer\""));
}

#[test]
fn same_seed_same_bytes_other_seed_other_digest() {
    let (a, b, c) = (scratch_dir("det-a"), scratch_dir("det-b"), scratch_dir("det-c"));
    for dir in [&a, &b] {
        run_into("glm-5.3-flash-2p2d.toml", dir, &["--requests", "30", "--seed", "11", "--quiet"]);
    }
    run_into("glm-5.3-flash-2p2d.toml", &c, &["--requests", "30", "--seed", "12", "--quiet"]);
    for file in ["report.json", "requests.csv", "timeline.csv", "trace.json"] {
        let (x, y) = (std::fs::read(a.join(file)).unwrap(), std::fs::read(b.join(file)).unwrap());
        assert!(x == y, "{file} differs between two runs with the same seed");
    }
    let (ra, rc) = (json(&a.join("report.json")), json(&c.join("report.json")));
    assert_eq!(ra["seed"], 11);
    assert_eq!(rc["seed"], 12);
    assert_ne!(ra["digest"], rc["digest"]);
}

#[test]
fn no_arguments_runs_the_default_scenario_into_out_default() {
    let cwd = scratch_dir("run-no-args");
    let (code, stdout, stderr) = outcome(&pdsim_in(&cwd, &[]));
    assert_eq!(code, 0, "{stderr}");
    for want in ["default", "completed", "TTFT", "TPOT", "ITL", "E2E", "req/s", "wall", "out/default"] {
        assert!(stdout.contains(want), "{want:?} missing from {stdout}");
    }
    let report = json(&cwd.join("out/default/report.json"));
    assert_eq!(report["scenario"]["label"], "scenarios/default.toml (embedded)");
    assert_eq!(report["summary"]["requests"], 2000);
    for file in ["requests.csv", "timeline.csv", "trace.json"] {
        assert!(cwd.join("out/default").join(file).is_file(), "{file}");
    }
}

#[test]
fn quiet_prints_nothing() {
    let dir = scratch_dir("run-quiet");
    let stdout = run_into("llama-3.1-8b-1p1d.toml", &dir, &["--requests", "10", "-q"]);
    assert_eq!(stdout, "");
    assert!(dir.join("report.json").is_file());
}

/// `--no-trace` and `--no-timeline` leave those files out, and remove the
/// ones an earlier run left in the folder, so nothing stale survives.
#[test]
fn big_files_can_be_left_out() {
    let dir = scratch_dir("run-no-trace");
    run_into("llama-3.1-8b-1p1d.toml", &dir, &["--requests", "10", "-q"]);
    assert!(dir.join("trace.json").is_file() && dir.join("timeline.csv").is_file());
    let stdout = run_into("llama-3.1-8b-1p1d.toml", &dir, &["--requests", "10", "--no-trace", "--no-timeline"]);
    assert!(stdout.contains("/{report.json, requests.csv, vllm-bench.json}"), "{stdout}");
    assert!(dir.join("report.json").is_file() && dir.join("requests.csv").is_file());
    assert!(!dir.join("trace.json").exists() && !dir.join("timeline.csv").exists());
}

#[test]
fn replicas_are_written_in_seed_order() {
    let dir = scratch_dir("run-replicas");
    let stdout = run_into(
        "glm-5.3-flash-1p1d.toml",
        &dir,
        &["--requests", "15", "--seed", "7", "--replicas", "4", "--jobs", "3"],
    );
    assert!(stdout.contains("4 replicas"), "{stdout}");
    let csv = Csv::read(&dir.join("replicas.csv"));
    assert_eq!(csv.column("replica"), ["0", "1", "2", "3"]);
    assert_eq!(csv.column("seed"), ["7", "8", "9", "10"]);
    for (k, row) in csv.rows.iter().enumerate() {
        let report = json(&dir.join(format!("replica-{k}/report.json")));
        assert_eq!(report["seed"], 7 + k as u64);
        assert_eq!(report["digest"].as_str().unwrap(), row[csv.col("digest")]);
        assert_eq!(report["summary"]["completed"].to_string(), row[csv.col("completed")]);
    }
    // replicas_summary.csv: mean, sample std and the 95 % interval of the
    // mean over the 4 replicas, per column (t(0.975, 3) = 3.182).
    let sum = Csv::read(&dir.join("replicas_summary.csv"));
    assert_eq!(sum.column("statistic"), ["mean", "std", "ci95_low", "ci95_high"]);
    assert_eq!(sum.column("replicas"), ["4", "4", "4", "4"]);
    assert_eq!(sum.column("digest"), ["", "", "", ""]);
    let ttft: Vec<f64> = csv.column("mean_ttft_ms").iter().map(|v| v.parse().unwrap()).collect();
    let mean = ttft.iter().sum::<f64>() / 4.0;
    let std = (ttft.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / 3.0).sqrt();
    let got: Vec<f64> = sum.column("mean_ttft_ms").iter().map(|v| v.parse().unwrap()).collect();
    assert!((got[0] - mean).abs() < 1e-5 && (got[1] - std).abs() < 1e-5, "{got:?} vs {mean} {std}");
    assert!((got[2] - (mean - 3.182 * std / 2.0)).abs() < 1e-5, "{got:?}");
    assert!((got[3] - (mean + 3.182 * std / 2.0)).abs() < 1e-5, "{got:?}");
    assert!(std > 0.0, "the seeds differ");
    // A replica is the plain run of its seed.
    let single = scratch_dir("run-replica-single");
    run_into("glm-5.3-flash-1p1d.toml", &single, &["--requests", "15", "--seed", "9", "--quiet"]);
    assert_eq!(json(&single.join("report.json"))["digest"].as_str().unwrap(), csv.column("digest")[2]);
    // Streamed the same way, byte for byte (the wall time aside).
    for f in ["requests.csv", "timeline.csv", "trace.json"] {
        let (a, b) = (std::fs::read(dir.join("replica-2").join(f)).unwrap(), std::fs::read(single.join(f)).unwrap());
        assert!(a == b, "replica-2/{f} differs from the single run's");
    }
}

/// A folder never mixes two runs: fewer replicas into it remove the
/// replica folders past them, a single run removes the replicas' files,
/// and replicas remove a single run's; files pdsim did not write stay.
#[test]
fn replica_folders_are_replaced_as_a_set() {
    let dir = scratch_dir("run-replica-set");
    run_into("default.toml", &dir, &["--requests", "5", "--replicas", "4", "--no-trace", "--quiet"]);
    std::fs::write(dir.join("replica-3").join("notes.txt"), "mine").unwrap();
    run_into("default.toml", &dir, &["--requests", "5", "--replicas", "2", "--no-trace", "--quiet"]);
    assert_eq!(names_in(&dir), ["replica-0", "replica-1", "replica-3", "replicas.csv", "replicas_summary.csv"]);
    assert_eq!(names_in(&dir.join("replica-3")), ["notes.txt"], "only pdsim's files are removed");
    assert_eq!(Csv::read(&dir.join("replicas.csv")).column("replica"), ["0", "1"]);
    run_into("default.toml", &dir, &["--requests", "5", "--no-trace", "--quiet"]);
    assert_eq!(names_in(&dir), ["replica-3", "report.json", "requests.csv", "timeline.csv", "vllm-bench.json"]);
    run_into("default.toml", &dir, &["--requests", "5", "--replicas", "1", "--no-trace", "--quiet"]);
    assert_eq!(names_in(&dir), ["replica-0", "replica-3", "replicas.csv", "replicas_summary.csv"]);
    // A replicas run that stops early (here its first replica cannot write
    // its requests.csv past the file-size limit, as on a full disk) leaves
    // none of an earlier run's replicas either.
    run_into("default.toml", &dir, &["--requests", "5", "--replicas", "3", "--no-trace", "--quiet"]);
    let default = scenario_file("default.toml");
    let (code, _, err) = outcome(&pdsim_with_small_files(&[
        "run",
        default.to_str().unwrap(),
        "--requests",
        "200",
        "--replicas",
        "3",
        "--jobs",
        "1",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("replica-0") && err.contains("requests.csv"), "{err}");
    for k in 0..3 {
        assert!(!dir.join(format!("replica-{k}/report.json")).exists(), "replica-{k} is an earlier run's");
    }
    assert_eq!(Csv::read(&dir.join("replicas.csv")).rows.len(), 0);
}

#[test]
fn bad_input_exits_2_naming_the_place() {
    let glm = scenario_file("glm-5.3-flash-1p1d.toml");
    let glm = glm.to_str().unwrap();
    for (args, want) in [
        (vec!["run", glm, "--requests", "0"], "--requests"),
        (vec!["run", glm, "--replicas", "0"], "--replicas"),
        (vec!["run", glm, "--seed=-1"], "--seed"),
        (vec!["run", glm, "--jobs", "2"], "--replicas"),
        (vec!["run", "no/such/scenario.toml"], "no/such/scenario.toml"),
    ] {
        let (code, stdout, stderr) = outcome(&pdsim(&args));
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stdout.is_empty());
        assert!(stderr.starts_with("pdsim: ") && stderr.contains(want), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

/// `pdsim run` writes its files as the run goes (requests.csv and
/// timeline.csv directly, trace.json joined from spill files); they are
/// byte for byte the files written from a run kept in memory, and no
/// spill or partial file is left.
#[test]
fn streamed_files_are_those_written_from_memory() {
    use std::sync::atomic::AtomicBool;

    use pdsim::{report, runner, scenario};
    for file in ["glm-5.3-flash-2p1d-pressure.toml", "llama-3.1-8b-aggregated.toml"] {
        let dir = scratch_dir(&format!("streamed-{file}"));
        run_into(file, &dir, &["--requests", "300", "--quiet"]);
        let s = scenario::load(scenario_file(file)).unwrap();
        let run = runner::simulate(&s, s.seed(), Some(300), |_| {}, &AtomicBool::new(false)).unwrap();
        let label = scenario_file(file).display().to_string();
        let d = s.deployment();
        let disaggregated = d.prefill.is_some();
        let (mut req, mut tl, mut tr) = (Vec::new(), Vec::new(), Vec::new());
        report::write_requests_csv(&mut req, &run.output.records, disaggregated).unwrap();
        report::write_timeline_csv(&mut tl, &run.output.ranks, &run.output.links).unwrap();
        let way_out = s.front_end().response;
        report::write_trace_json(&mut tr, &label, &run, d.link.topology, disaggregated, way_out).unwrap();
        for (name, want) in [("requests.csv", req), ("timeline.csv", tl), ("trace.json", tr)] {
            assert!(std::fs::read(dir.join(name)).unwrap() == want, "{file}: {name} differs");
        }
        let mut names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, ["report.json", "requests.csv", "timeline.csv", "trace.json", "vllm-bench.json"], "{file}");
    }
}

/// `--sketch-above N`: report.json says so (`latency_sketch`, with the
/// sketch's bound, 2^-9), and a run whose statistics hold fewer values
/// than a chunk (65,536) is still exact: every field of the summary and
/// of `bench`, the digest and requests.csv are those of the exact run.
#[test]
fn a_bounded_run_below_its_limit_is_the_exact_run() {
    let exact = scratch_dir("run-sketch-exact");
    let bounded = scratch_dir("run-sketch-bounded");
    let s = "glm-5.3-flash-1p1d.toml";
    run_into(s, &exact, &["--requests", "200", "--no-trace", "--no-timeline"]);
    run_into(s, &bounded, &["--requests", "200", "--no-trace", "--no-timeline", "--sketch-above", "0"]);
    let (e, b) = (json(&exact.join("report.json")), json(&bounded.join("report.json")));
    assert!(e.get("latency_sketch").is_none());
    assert_eq!(b["latency_sketch"]["exact_up_to"], 0);
    assert_eq!(b["latency_sketch"]["relative_error"].as_f64(), Some(0.001953125));
    for k in ["summary", "bench", "digest", "overload", "ranks"] {
        assert_eq!(e[k], b[k], "{k}");
    }
    let csv = |d: &Path| std::fs::read(d.join("requests.csv")).unwrap();
    assert!(csv(&exact) == csv(&bounded));
}
