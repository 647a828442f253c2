//! What a new user meets first, as the README's tour shows it: a sweep
//! prints its points, sweep.csv names each statistic once, a clean run's
//! `fail_reason` column is text, `steptime`'s terms add up to its step,
//! `calibrate --out` makes its folder and its file serves a role, and the
//! flags' help says what vLLM's defaults are.

use crate::common::{Csv, base_with_lines, fixture, outcome, pdsim, scenario_file, scratch, scratch_dir};

fn ok(args: &[&str]) -> String {
    let (code, stdout, stderr) = outcome(&pdsim(args));
    assert_eq!(code, 0, "{args:?}: {stderr}");
    stdout
}

/// A sweep prints a table of its points (the first and last 20 of a
/// larger one, the rest counted), each with its axis values and what it
/// served.
#[test]
fn a_sweep_prints_its_points() {
    let dir = scratch_dir("newcomer-sweep-table");
    let sweep = fixture("repros/22-sweep-writes-through-symlinks/sweep.toml");
    let out = ok(&["sweep", sweep.to_str().unwrap(), "--out", dir.to_str().unwrap()]);
    let lines: Vec<&str> = out.lines().collect();
    let head = lines.iter().position(|l| l.trim_start().starts_with("point ")).expect("a table header");
    assert!(lines[head].contains("bandwidth_gb_s") && lines[head].contains("TTFT p99 ms"), "{out}");
    // 2 bandwidths x 2 seeds: four rows, in point order, with the seed.
    let rows: Vec<Vec<&str>> = lines[head + 1..head + 5].iter().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.iter().map(|r| r[0]).collect::<Vec<_>>(), ["0", "1", "2", "3"]);
    assert_eq!(rows.iter().map(|r| r[1]).collect::<Vec<_>>(), ["10.0", "10.0", "100.0", "100.0"]);
    assert_eq!(rows.iter().map(|r| r[2]).collect::<Vec<_>>(), ["1", "2", "1", "2"]);
    assert!(rows.iter().all(|r| r[3] == "2/2"), "{out}");
    // 45 points: 20, a line for the 5 between, 20.
    let base = fixture("repros/22-sweep-writes-through-symlinks/base.toml");
    let values: Vec<String> = (1..=45).map(|i| format!("{i}.0")).collect();
    let text =
        format!("scenario = {:?}\n[axes]\n\"link.latency_us\" = [{}]\n", base.to_str().unwrap(), values.join(", "));
    let big = scratch("newcomer-sweep-45.toml", &text);
    let out = ok(&["sweep", big.to_str().unwrap(), "--out", dir.join("big").to_str().unwrap()]);
    assert!(out.contains("  ... 5 more points (every point is in sweep.csv) ...\n"), "{out}");
    let numbered: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.chars().all(|c| c.is_ascii_digit()))
        .collect();
    let want: Vec<String> = (0..20).chain(25..45).map(|i| i.to_string()).collect();
    assert_eq!(numbered, want);
}

/// sweep.csv (and replicas.csv) name each statistic once, in vLLM's
/// scheme: `<statistic>_<metric>_ms` (`mean_ttft_ms`, `p99_ttft_ms`), the
/// counts and rates under vLLM's result keys, pdsim's own quantities
/// under names of the same form (the summary's copies of the same
/// statistics under a second scheme, `ttft_p99_ms`, are gone).
#[test]
fn sweep_csv_names_each_statistic_once() {
    let dir = scratch_dir("newcomer-sweep-names");
    let sweep = fixture("repros/22-sweep-writes-through-symlinks/sweep.toml");
    ok(&["sweep", sweep.to_str().unwrap(), "--quiet", "--out", dir.to_str().unwrap()]);
    let csv = Csv::read(&dir.join("sweep.csv"));
    let metrics = &csv.header[3..];
    for old in ["ttft_mean_ms", "ttft_p99_ms", "tpot_p50_ms", "e2e_p99_ms", "output_token_throughput", "goodput"] {
        assert!(!metrics.iter().any(|h| h == old), "{old} is back");
    }
    for h in metrics.iter().filter(|h| h.ends_with("_ms")) {
        let stat = h.split('_').next().unwrap();
        // (The scenario's SLO bounds, `slo_<metric>_ms`, are bounds, not statistics.)
        let known = ["mean", "median", "std", "slo"].contains(&stat) || stat.starts_with('p');
        assert!(known, "{h}: not <statistic>_<metric>_ms");
    }
    for want in ["requests", "completed", "request_throughput", "mean_ttft_ms", "p99_e2el_ms", "mean_transfer_wait_ms"]
    {
        csv.col(want);
    }
    // One column per name.
    let mut names: Vec<&String> = csv.header.iter().collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), csv.header.len(), "a column named twice");
}

/// A run with no failure writes `none` in requests.csv's `fail_reason`,
/// so that pandas reads the column as text; a failed request has its
/// reason there.
#[test]
fn fail_reason_is_text_in_a_clean_run() {
    let dir = scratch_dir("newcomer-fail-reason");
    let default = scenario_file("default.toml");
    ok(&[
        "run",
        default.to_str().unwrap(),
        "--requests",
        "20",
        "--quiet",
        "--no-trace",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let csv = Csv::read(&dir.join("requests.csv"));
    assert!(csv.column("outcome").iter().all(|o| *o == "completed"));
    assert!(csv.column("fail_reason").iter().all(|r| *r == "none"), "{:?}", csv.column("fail_reason"));
    // Every decode aborts: each request failed, with its reason.
    let s = scratch(
        "newcomer-aborts.toml",
        &base_with_lines(&[(
            17,
            "output_tokens = { kind = \"fixed\", value = 10 }\n\n[faults]\ndecode_abort_probability = 1.0",
        )]),
    );
    let dir = scratch_dir("newcomer-fail-reason-aborts");
    ok(&["run", s.to_str().unwrap(), "--quiet", "--no-trace", "--out", dir.to_str().unwrap()]);
    let csv = Csv::read(&dir.join("requests.csv"));
    let reasons = csv.column("fail_reason");
    assert!(csv.column("outcome").iter().all(|o| *o == "failed"), "{:?}", csv.column("outcome"));
    assert!(reasons.iter().all(|r| !r.is_empty() && *r != "none"), "{reasons:?}");
}

/// `steptime`'s printed terms add up to its printed step: a step lasts a
/// whole number of nanoseconds, and what the exact terms leave to it is
/// a line of its own. The TP 1 table prices 1,000 prefill tokens at
/// 20,750.2724… µs (its table alone), which the engine's clock makes
/// 20,750.273 µs.
#[test]
fn steptime_terms_add_up_to_the_step() {
    let s = scenario_file("llama-3.1-8b-h200-tp1.toml");
    let s = s.to_str().unwrap();
    let out = ok(&["steptime", s, "--prefill-tokens", "1000"]);
    let milli = |l: &str| -> i64 {
        let v = l.split_whitespace().rev().nth(1).unwrap();
        (v.parse::<f64>().unwrap() * 1e3).round() as i64
    };
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "20750.273 µs", "{out}");
    assert!(out.contains("rounded up to whole ns"), "{out}");
    let terms: i64 = lines[1..].iter().map(|l| milli(l)).sum();
    assert_eq!(terms, 20_750_273, "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["steptime", s, "--prefill-tokens", "1000", "--json"])).unwrap();
    let sum: f64 = v["terms"].as_object().unwrap().values().map(|x| x.as_f64().unwrap()).sum();
    let rounding = v["rounding_us"].as_f64().unwrap();
    assert!((0.0..0.001).contains(&rounding), "{v}");
    assert!((sum + rounding - v["step_us"].as_f64().unwrap()).abs() < 1e-6, "{v}");
}

/// `calibrate --out` makes the folder it writes into, and a role reads
/// the file it wrote with `step_time = { file = … }`, pricing steps as
/// the printed fit does.
#[test]
fn a_calibrated_file_serves_a_role() {
    let dir = scratch_dir("newcomer-calibrate");
    let data = fixture("aic-llama-3.1-8b-h200");
    let out = dir.join("new/folder/step_time.toml");
    ok(&[
        "calibrate",
        data.join("aic_prefill_tp2.csv").to_str().unwrap(),
        data.join("aic_decode_tp2.csv").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let shipped = std::fs::read_to_string(scenario_file("steptimes/llama-3.1-8b-h200-tp2.toml")).unwrap();
    let line = |t: &str| t.lines().find(|l| l.starts_with("step_time = ")).unwrap().to_owned();
    assert_eq!(line(&std::fs::read_to_string(&out).unwrap()), line(&shipped));
    let text = std::fs::read_to_string(scenario_file("llama-3.1-8b-h200-tp2.toml"))
        .unwrap()
        .replace("steptimes/llama-3.1-8b-h200-tp2.toml", out.to_str().unwrap());
    let s = scratch("newcomer-calibrated.toml", &text);
    let mine = ok(&["steptime", s.to_str().unwrap(), "--prefill-tokens", "4096"]);
    let theirs =
        ok(&["steptime", scenario_file("llama-3.1-8b-h200-tp2.toml").to_str().unwrap(), "--prefill-tokens", "4096"]);
    assert_eq!(mine, theirs);
}

/// `--percentiles`' help gives pdsim's default and vLLM's, which differ.
#[test]
fn percentiles_help_says_vllms_default() {
    for verb in ["run", "sweep"] {
        let help = ok(&[verb, "--help"]);
        assert!(help.contains("50,90,95,99") && help.contains("vLLM's is 99 alone"), "{verb}: {help}");
    }
}
