//! `pdsim plan`: the shipped plan files answered and their claims checked
//! with `pdsim run` (best.toml meets the SLO at the claimed rate; the best
//! shape with one rank less, or half the TP, misses it), the answer the
//! same whatever `--jobs`, and a wrong `[plan]` refused in one placed line.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{Csv, outcome, pdsim, scenario_file, scratch, scratch_dir};

/// Runs `pdsim plan` on `scenarios/plans/<file>` into a fresh folder.
pub fn plan(file: &str, dir: &str, extra: &[&str]) -> PathBuf {
    let out = scratch_dir(dir);
    let path = scenario_file(&format!("plans/{file}"));
    let mut args = vec!["plan", path.to_str().unwrap(), "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = outcome(&pdsim(&args));
    assert_eq!(code, 0, "pdsim plan {file}: {stderr}");
    assert!(extra.contains(&"--quiet") || stdout.contains("candidates   "), "{stdout}");
    out
}

/// `pdsim run SCENARIO` into `dir/name`, and its report.json.
fn run(scenario: &Path, dir: &Path, name: &str) -> Value {
    let out = dir.join(name);
    let (code, stdout, stderr) = outcome(&pdsim(&[
        "run",
        scenario.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--no-trace",
        "--no-timeline",
        "--quiet",
    ]));
    assert_eq!(code, 0, "pdsim run {}: {stderr}{stdout}", scenario.display());
    let text = std::fs::read_to_string(out.join("report.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The best candidate's row of candidates.csv.
fn best_row(csv: &Csv) -> &Vec<String> {
    let best: Vec<&Vec<String>> = csv.rows.iter().filter(|r| r[csv.col("best")] == "true").collect();
    assert_eq!(best.len(), 1, "one best row");
    best[0]
}

/// best.toml with one rank less (the prefill role's first, then the
/// decode role's), or, where every role has one rank, half the largest TP.
fn fewer_gpus(best: &toml::Table) -> toml::Table {
    let mut t = best.clone();
    let roles: Vec<&str> = ["aggregated", "prefill", "decode"].into_iter().filter(|r| t.contains_key(*r)).collect();
    let get = |t: &toml::Table, role: &str, key: &str| t[role][key].as_integer().unwrap();
    if let Some(role) = roles.iter().find(|r| get(&t, r, "count") > 1) {
        let c = get(&t, role, "count");
        t.get_mut(*role).unwrap().as_table_mut().unwrap().insert("count".into(), toml::Value::Integer(c - 1));
    } else {
        let role = roles.iter().max_by_key(|r| get(&t, r, "tp")).unwrap();
        let tp = get(&t, role, "tp");
        assert!(tp > 1, "the best uses one GPU: no deployment has fewer");
        t.get_mut(*role).unwrap().as_table_mut().unwrap().insert("tp".into(), toml::Value::Integer(tp / 2));
    }
    t
}

fn gpus(t: &toml::Table) -> i64 {
    ["aggregated", "prefill", "decode"]
        .iter()
        .filter_map(|r| t.get(*r))
        .map(|r| r["count"].as_integer().unwrap() * r["tp"].as_integer().unwrap())
        .sum()
}

/// The plan's claims, checked as a user would: best.toml under `pdsim run`
/// meets the SLO at the target rate (with the digest best.toml names), a
/// deployment with fewer GPUs misses it, and every cheaper candidate in
/// candidates.csv misses it too.
fn check_claims(file: &str, dir: &str, mode: &str, attainment: f64) {
    let out = plan(file, dir, &[]);
    let csv = Csv::read(&out.join("candidates.csv"));
    let best = best_row(&csv);
    assert_eq!(best[csv.col("mode")], mode, "{file}: {best:?}");
    assert_eq!(best[csv.col("meets_slo")], "true");
    let best_gpus: u32 = best[csv.col("gpus")].parse().unwrap();
    for r in &csv.rows {
        let g: u32 = r[csv.col("gpus")].parse().unwrap();
        if g < best_gpus {
            assert_eq!(r[csv.col("meets_slo")], "false", "{file}: a cheaper candidate meets the SLO: {r:?}");
        }
    }
    let target: f64 = best[csv.col("target_rate_per_s")].parse().unwrap();

    // best.toml runs as it is and reproduces the claim.
    let best_toml = out.join("best.toml");
    let text = std::fs::read_to_string(&best_toml).unwrap();
    let claimed_digest = text.split("(digest ").nth(1).and_then(|s| s.split(')').next()).unwrap().to_owned();
    let report = run(&best_toml, &out, "best-run");
    let got = report["summary"]["slo_attainment"].as_f64().unwrap();
    assert!(got >= attainment, "{file}: best.toml attains {got} < {attainment}");
    assert_eq!(report["digest"].as_str().unwrap(), claimed_digest, "{file}: best.toml's run is the plan's trial");
    // At the claimed rate: the offered rate of the run is the target's
    // (Poisson arrivals: within 10 % over the trial's requests).
    let offered = report["overload"]["arrival_rate_per_s"].as_f64().unwrap();
    assert!((offered / target - 1.0).abs() < 0.1, "{file}: offered {offered} req/s, target {target}");

    // One rank less (or half the TP) misses it.
    let table: toml::Table = toml::from_str(&text).unwrap();
    let fewer = fewer_gpus(&table);
    assert!(gpus(&fewer) < i64::from(best_gpus), "{file}: {} GPUs", gpus(&fewer));
    let fewer_file = out.join("fewer.toml");
    std::fs::write(&fewer_file, toml::to_string(&fewer).unwrap()).unwrap();
    let report = run(&fewer_file, &out, "fewer-run");
    let got = report["summary"]["slo_attainment"].as_f64().unwrap();
    assert!(got < attainment, "{file}: {} GPUs attain {got} >= {attainment}", gpus(&fewer));
}

#[test]
fn aggregated_wins_and_its_claim_holds() {
    check_claims("llama-8b-aggregated-wins.toml", "plan-aggregated", "aggregated", 0.99);
}

#[test]
fn pd_wins_and_its_claim_holds() {
    check_claims("llama-8b-pd-wins.toml", "plan-pd", "disaggregated", 0.99);
}

#[test]
fn a_hybrid_model_on_a_trace_and_its_claim_holds() {
    check_claims("gpt-oss-mooncake-trace.toml", "plan-trace", "disaggregated", 0.99);
    // The trace is replayed, not drawn: best.toml names it relative to
    // itself, so it runs from anywhere.
    let text = std::fs::read_to_string(scratch_dir_path("plan-trace").join("best.toml")).unwrap();
    assert!(text.contains("mooncake-conversation-2000.jsonl"), "{text}");
    assert!(text.contains("time_scale"), "{text}");
}

fn scratch_dir_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("pdsim-it-dirs").join(name)
}

#[test]
fn the_answer_does_not_depend_on_the_jobs() {
    let one = plan_quiet("llama-8b-pd-wins.toml", "plan-jobs-1", &["--jobs", "1"]);
    let three = plan_quiet("llama-8b-pd-wins.toml", "plan-jobs-3", &["--jobs", "3"]);
    for f in ["candidates.csv", "best.toml", "launch.sh", "plan.html"] {
        let a = std::fs::read(one.join(f)).unwrap();
        let b = std::fs::read(three.join(f)).unwrap();
        assert!(a == b, "{f} differs between --jobs 1 and --jobs 3");
    }
}

/// [`plan`] with `--quiet` (prints nothing).
fn plan_quiet(file: &str, dir: &str, extra: &[&str]) -> PathBuf {
    let out = scratch_dir(dir);
    let path = scenario_file(&format!("plans/{file}"));
    let mut args = vec!["plan", path.to_str().unwrap(), "--out", out.to_str().unwrap(), "--quiet"];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = outcome(&pdsim(&args));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, "");
    out
}

#[test]
fn what_a_plan_writes() {
    let out = plan("llama-8b-pd-wins.toml", "plan-files", &[]);
    let csv = Csv::read(&out.join("candidates.csv"));
    // 8 GPUs, TP 1, 2, 4: aggregated 8 + 4 + 2 = 14 shapes; P/D pairs
    // (P TP, D TP) with p·P + d·D <= 8, p, d >= 1: (1,1) 28, (1,2) 12,
    // (1,4) 4, (2,1) 12, (2,2) 6, (2,4) 2, (4,1) 4, (4,2) 2, (4,4) 1 = 71.
    assert_eq!(csv.rows.len(), 14 + 71);
    // Cheapest first, numbered in order.
    let gpus: Vec<u32> = csv.column("gpus").iter().map(|g| g.parse().unwrap()).collect();
    assert!(gpus.windows(2).all(|w| w[0] <= w[1]), "{gpus:?}");
    let idx: Vec<String> = (0..csv.rows.len()).map(|i| i.to_string()).collect();
    assert_eq!(csv.column("candidate"), idx);
    // Pruned rows were not simulated, and their bound is below the target.
    for r in &csv.rows {
        let status = &r[csv.col("status")];
        let trials: u32 = r[csv.col("trials")].parse().unwrap();
        match status.as_str() {
            "pruned" => {
                assert_eq!(trials, 0);
                let bound: f64 = r[csv.col("bound_rate_per_s")].parse().unwrap();
                assert!(bound < 12.0, "{r:?}");
            }
            "simulated" => assert!(trials >= 1, "{r:?}"),
            other => panic!("unexpected status {other}: {r:?}"),
        }
        // A candidate that meets the target has a highest rate at least it.
        if r[csv.col("meets_slo")] == "true" {
            let m: f64 = r[csv.col("max_rate_per_s")].parse().unwrap();
            assert!(m >= 12.0, "{r:?}");
        }
    }
    // The launch lines: one vllm serve per rank, TP and batch limits, NIXL.
    let best = best_row(&csv);
    let launch = std::fs::read_to_string(out.join("launch.sh")).unwrap();
    let serves: Vec<&str> = launch.lines().filter(|l| !l.starts_with('#') && l.contains("vllm serve")).collect();
    let ranks: usize =
        ["prefill_ranks", "decode_ranks"].iter().map(|c| best[csv.col(c)].parse::<usize>().unwrap()).sum();
    assert_eq!(serves.len(), ranks, "{launch}");
    for l in &serves {
        assert!(l.contains("vllm serve meta-llama/Llama-3.1-8B"), "{l}");
        assert!(l.contains("--max-num-batched-tokens 8192 --max-num-seqs 256"), "{l}");
        assert!(l.contains(r#"--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'"#), "{l}");
    }
    let prefill_tp = &best[csv.col("prefill_tp")];
    assert!(serves[0].contains(&format!("--tensor-parallel-size {prefill_tp}")), "{}", serves[0]);
    // The page: the frontier and the rate chart.
    let html = std::fs::read_to_string(out.join("plan.html")).unwrap();
    for chart in ["frontier", "rate-by-gpus"] {
        assert!(html.contains(&format!("data-chart=\"{chart}\"")), "{chart}");
    }
    assert!(!html.contains("<script"), "no script");
}

#[test]
fn a_fixed_rate_plan_only_asks_whether_each_meets_it() {
    let base = std::fs::read_to_string(scenario_file("plans/llama-8b-aggregated-wins.toml")).unwrap();
    let text = base.replace("max_gpus = 8", "max_gpus = 3\nsearch = \"fixed\"\nrequests = 500");
    let file = scratch("plan-fixed.toml", &text);
    let out = scratch_dir("plan-fixed");
    let (code, stdout, stderr) =
        outcome(&pdsim(&["plan", file.to_str().unwrap(), "--out", out.to_str().unwrap(), "--jobs", "2"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("500 requests a trial"), "{stdout}");
    let csv = Csv::read(&out.join("candidates.csv"));
    for r in &csv.rows {
        let trials: u32 = r[csv.col("trials")].parse().unwrap();
        assert!(trials <= 1, "one trial at most in a fixed plan: {r:?}");
        assert_eq!(r[csv.col("max_rate_per_s")], "");
    }
    // Two GPUs meet 50 req/s (one does not), aggregated: 2 x TP1 or 1 x TP2.
    let best = best_row(&csv);
    assert_eq!((best[csv.col("gpus")].as_str(), best[csv.col("mode")].as_str()), ("2", "aggregated"));
}

/// A plan file with `[plan]` replaced by `plan_table`, and its error.
fn refused(name: &str, plan_table: &str, extra_edit: Option<(&str, &str)>) -> String {
    let base = std::fs::read_to_string(scenario_file("plans/llama-8b-aggregated-wins.toml")).unwrap();
    let mut text = base[..base.find("[plan]").unwrap()].to_owned();
    if let Some((from, to)) = extra_edit {
        text = text.replace(from, to);
    }
    text.push_str(plan_table);
    let file = scratch(name, &text);
    let out = scratch_dir(&format!("{name}-out"));
    let (code, stdout, stderr) = outcome(&pdsim(&["plan", file.to_str().unwrap(), "--out", out.to_str().unwrap()]));
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(name), "names the file: {stderr}");
    stderr
}

#[test]
fn a_wrong_plan_is_refused_in_one_placed_line() {
    // The file's [plan] starts at line `at`.
    let base = std::fs::read_to_string(scenario_file("plans/llama-8b-aggregated-wins.toml")).unwrap();
    let at = base[..base.find("[plan]").unwrap()].lines().count() + 1;
    let e = refused("plan-bad-missing.toml", "[plan]\nattainment = 0.9\n", None);
    assert!(e.contains(&format!(":{at}: plan: missing field `max_gpus`")), "{e}");
    let e = refused("plan-bad-attain.toml", "[plan]\nmax_gpus = 4\nattainment = 1.5\n", None);
    assert!(e.contains(&format!(":{}: plan.attainment: must be in (0, 1], got 1.5", at + 2)), "{e}");
    let e = refused("plan-bad-zero.toml", "[plan]\nmax_gpus = 0\n", None);
    assert!(e.contains(&format!(":{}: plan.max_gpus: must be from 1", at + 1)), "{e}");
    let e = refused("plan-bad-key.toml", "[plan]\nmax_gpus = 4\nmax_gpu = 3\n", None);
    assert!(e.contains(&format!(":{}: plan.max_gpu: unknown field `max_gpu`", at + 2)), "{e}");
    let e = refused("plan-bad-tp.toml", "[plan]\nmax_gpus = 4\ntp = [1, 1]\n", None);
    assert!(e.contains("plan.tp[1]: 1 is listed twice"), "{e}");
    let e = refused("plan-bad-mode.toml", "[plan]\nmax_gpus = 4\nmodes = [\"pd\"]\n", None);
    assert!(e.contains("plan.modes"), "{e}");
    let e = refused(
        "plan-bad-loop.toml",
        "[plan]\nmax_gpus = 4\n",
        Some((
            "arrival = { kind = \"poisson\", rate_per_s = 50.0 }",
            "arrival = { kind = \"closed_loop\", concurrency = 8 }",
        )),
    );
    assert!(e.contains("workload.arrival.kind: pdsim plan searches on the request rate"), "{e}");
    let e =
        refused("plan-bad-slo.toml", "[plan]\nmax_gpus = 4\n", Some(("[slo]\nttft_ms = 500.0\ntpot_ms = 50.0\n", "")));
    assert!(e.contains("slo: pdsim plan needs at least one bound"), "{e}");
    // A table step time holds at its TP size only.
    let e = refused(
        "plan-bad-table.toml",
        "[plan]\nmax_gpus = 4\ntp = [1, 2]\n",
        Some((
            "step_time = { kind = \"roofline\" }",
            "step_time = { kind = \"table\", points = [[1, 3000], [8192, 80000]] }",
        )),
    );
    assert!(e.contains("plan.tp[1]: tp 2 cannot be tried"), "{e}");
    // No [plan] at all; and `pdsim run` on a plan file points to the verb.
    let base_no_plan = base[..base.find("[plan]").unwrap()].to_owned();
    let file = scratch("plan-none.toml", &base_no_plan);
    let (code, _, e) =
        outcome(&pdsim(&["plan", file.to_str().unwrap(), "--out", scratch_dir("plan-none").to_str().unwrap()]));
    assert_eq!(code, 2);
    assert!(e.contains("plan-none.toml: plan: missing table [plan]"), "{e}");
    let path = scenario_file("plans/llama-8b-aggregated-wins.toml");
    let (code, _, e) = outcome(&pdsim(&["validate", path.to_str().unwrap()]));
    assert_eq!(code, 2);
    assert!(e.contains(&format!(":{at}: plan: unknown field `plan`")) && e.contains("pdsim plan"), "{e}");
}

#[test]
fn help_documents_the_plan_table() {
    let (code, stdout, _) = outcome(&pdsim(&["plan", "--help"]));
    assert_eq!(code, 0);
    for want in
        ["max_gpus", "attainment", "rate_per_s", "candidates.csv", "best.toml", "launch.sh", "plan.html", "--jobs"]
    {
        assert!(stdout.contains(want), "{want} not in:\n{stdout}");
    }
}

#[test]
fn axes_multiply_the_shapes() {
    let base = std::fs::read_to_string(scenario_file("plans/llama-8b-aggregated-wins.toml")).unwrap();
    let text = base.replace(
        "max_gpus = 8",
        "max_gpus = 3\nrequests = 200\nmax_num_batched_tokens = [2048, 8192]\nmax_num_seqs = [64, 256]\n\
         link_bandwidth_gb_s = [25.0, 50.0]\nrouter_policy = [\"round_robin\", \"least_outstanding\"]\n\
         step_time = [{ kind = \"roofline\" }, { kind = \"roofline\", gemm_efficiency = 0.5 }]",
    );
    let file = scratch("plan-axes.toml", &text);
    let out = scratch_dir("plan-axes");
    let (code, stdout, stderr) = outcome(&pdsim(&["plan", file.to_str().unwrap(), "--out", out.to_str().unwrap()]));
    assert_eq!(code, 0, "{stderr}");
    let csv = Csv::read(&out.join("candidates.csv"));
    // 3 GPUs, TP 1 and 2: aggregated 3 + 1 = 4 shapes, P/D 3 (TP 1/1) + 1
    // (1/2) + 1 (2/1) = 5. Each takes 2 x 2 x 2 x 2 = 16 axis values, a P/D
    // one also 2 link bandwidths: 4 x 16 + 5 x 16 x 2 = 224.
    assert_eq!(csv.rows.len(), 224);
    let mut seen: Vec<String> = csv
        .rows
        .iter()
        .map(|r| {
            ["shape", "max_num_batched_tokens", "max_num_seqs", "link_bandwidth_gb_s", "router_policy", "step_time"]
                .iter()
                .map(|c| r[csv.col(c)].clone())
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 224, "every candidate distinct");
    assert!(stdout.contains("candidate #"), "{stdout}");
}
