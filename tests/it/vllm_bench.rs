//! `report.json`'s `bench` object against `vllm bench serve`'s own
//! definitions (`vllm/benchmarks/serve.py`, `calculate_metrics` and the
//! result dict), recomputed here from `requests.csv` as vLLM computes them
//! from its request outputs: only successful requests, TPOT `(latency −
//! ttft) / (output − 1)` over outputs longer than one token, ITL every gap
//! flattened, `np.mean`, `np.std` (population), `np.median`,
//! `np.percentile` (linear), goodput against every SLO, peaks over 1 s
//! windows from the first successful start. numpy's arithmetic is written
//! out below.
//!
//! vLLM's ITL needs every token's time, which `requests.csv` does not hold,
//! so the scenarios make them known: in the first, every decode step takes
//! the same 1 ms, so a request's tokens come 1 ms apart from its first
//! (checked on every request); in the others, every output is two tokens,
//! its first and its last. Also: `--percentiles` and vLLM's names for
//! them, and the `overload` field.

use std::path::Path;

use serde_json::Value;

use crate::common::{Csv, outcome, pdsim, scenario_file, scratch, scratch_dir};

/// A `requests.csv` time (ms with six decimals) as exact nanoseconds.
fn ns(cell: &str) -> Option<u64> {
    if cell.is_empty() {
        return None;
    }
    let (whole, frac) = cell.split_once('.').expect("ms with six decimals");
    assert_eq!(frac.len(), 6, "{cell}");
    Some(whole.parse::<u64>().unwrap() * 1_000_000 + frac.parse::<u64>().unwrap())
}

/// One row of `requests.csv`.
struct Row {
    completed: bool,
    prompt: u64,
    generated: u64,
    arrival: u64,
    first_token: Option<u64>,
    last_token: Option<u64>,
    finished: Option<u64>,
}

fn read_rows(path: &Path) -> Vec<Row> {
    let csv = Csv::read(path);
    let c = |name: &str| csv.col(name);
    let (o, p, g, a, f, l, e) = (
        c("outcome"),
        c("prompt_tokens"),
        c("generated_tokens"),
        c("arrival_ms"),
        c("first_token_ms"),
        c("last_token_ms"),
        c("finished_ms"),
    );
    csv.rows
        .iter()
        .map(|r| Row {
            completed: r[o] == "completed",
            prompt: r[p].parse().unwrap(),
            generated: r[g].parse().unwrap(),
            arrival: ns(&r[a]).unwrap(),
            first_token: ns(&r[f]),
            last_token: ns(&r[l]),
            finished: ns(&r[e]),
        })
        .collect()
}

// numpy, as vLLM calls it (on an empty list, `np.mean(values or 0)` and the
// rest give 0).

/// `np.mean`.
fn np_mean(v: &[f64]) -> f64 {
    if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }
}

/// `np.std` (ddof 0): the root of the mean squared deviation from the mean.
fn np_std(v: &[f64]) -> f64 {
    let m = np_mean(v);
    let sq: Vec<f64> = v.iter().map(|x| (x - m) * (x - m)).collect();
    np_mean(&sq).sqrt()
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

/// `np.percentile(v, p)`, method "linear": the virtual index i = (n − 1) ·
/// p / 100 between the order statistics ⌊i⌋ and ⌊i⌋ + 1, weight i − ⌊i⌋.
fn np_percentile(v: &[f64], p: f64) -> f64 {
    let s = sorted(v);
    let n = s.len();
    if n == 0 {
        return 0.0;
    }
    let i = (n - 1) as f64 * (p / 100.0);
    if i >= (n - 1) as f64 {
        return s[n - 1];
    }
    let lo = i.floor();
    let (a, b, t) = (s[lo as usize], s[lo as usize + 1], i - lo);
    // numpy's _lerp: from the nearer end.
    if t >= 0.5 { b - (b - a) * (1.0 - t) } else { a + (b - a) * t }
}

/// `np.median`: the middle value, or the mean of the middle two.
fn np_median(v: &[f64]) -> f64 {
    let s = sorted(v);
    let n = s.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => s[n / 2],
        _ => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// What a field must be.
#[derive(Debug)]
enum Want {
    Int(u64),
    /// Equal within a relative 1e-9: the same exact nanoseconds, in another
    /// order of floating-point operations than pdsim's.
    Float(f64),
    /// Within this relative error (the inter-token histogram's).
    Near(f64, f64),
    Null,
}

/// The SLOs of a scenario, ms (vLLM's `--goodput ttft:… tpot:… e2el:…`).
#[derive(Clone, Copy, Default)]
struct Slo {
    ttft: Option<f64>,
    tpot: Option<f64>,
    e2el: Option<f64>,
}

/// The relative error of an inter-token percentile from the histogram.
const HISTOGRAM: f64 = 1.0 / 256.0;

/// vLLM's `calculate_metrics` and result dict over these requests, with
/// each completed request's token times (ns) given by `tokens`; `exact_itl`
/// when every gap is the same (the histogram's bucket is then pinned to
/// it).
fn vllm_bench(
    rows: &[Row],
    slo: Slo,
    ps: &[f64],
    tokens: impl Fn(&Row) -> Vec<u64>,
    exact_itl: bool,
) -> Vec<(String, Want)> {
    let s = |x: u64| x as f64 / 1e9;
    let ok: Vec<&Row> = rows.iter().filter(|r| r.completed).collect();
    // Benchmark duration: the first request sent to the last one back.
    let start = rows.iter().map(|r| r.arrival).min().unwrap();
    let end = rows.iter().filter_map(|r| r.finished).max().unwrap();
    let dur_s = s(end - start);
    let (mut ttfts, mut tpots, mut all_tpots, mut itls, mut e2els) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut total_input, mut total_output) = (0, 0);
    for r in &ok {
        let ttft = s(r.first_token.unwrap() - r.arrival);
        let latency = s(r.finished.unwrap() - r.arrival);
        total_input += r.prompt;
        total_output += r.generated;
        let mut tpot = 0.0;
        if r.generated > 1 {
            tpot = (latency - ttft) / (r.generated - 1) as f64;
            tpots.push(tpot);
        }
        all_tpots.push(tpot);
        let times = tokens(r);
        assert_eq!(times.len() as u64, r.generated);
        itls.extend(times.windows(2).map(|w| s(w[1] - w[0])));
        ttfts.push(ttft);
        e2els.push(latency);
    }
    let good = (0..ok.len())
        .filter(|&i| {
            let within = |bound: Option<f64>, v: f64| bound.is_none_or(|b| b / 1000.0 >= v);
            within(slo.ttft, ttfts[i]) && within(slo.tpot, all_tpots[i]) && within(slo.e2el, e2els[i])
        })
        .count();
    // 1 s windows from the first successful start; a token in the window of
    // its time, a request in every window from its start's to its end's.
    // (In exact nanoseconds: vLLM's int(t - t0) of float seconds.)
    let t0 = ok.iter().map(|r| r.arrival).min().unwrap();
    let last = ok.iter().map(|r| r.finished.unwrap()).max().unwrap();
    let windows = (last - t0).div_ceil(1_000_000_000) as usize + 1;
    let (mut tokens_per_s, mut concurrent) = (vec![0u64; windows], vec![0u64; windows]);
    for r in &ok {
        for t in tokens(r) {
            tokens_per_s[((t - t0) / 1_000_000_000) as usize] += 1;
        }
        for w in (r.arrival - t0) / 1_000_000_000..=(r.finished.unwrap() - t0) / 1_000_000_000 {
            concurrent[w as usize] += 1;
        }
    }
    let any_slo = slo.ttft.is_some() || slo.tpot.is_some() || slo.e2el.is_some();
    let mut want = vec![
        ("duration".to_owned(), Want::Float(dur_s)),
        ("completed".to_owned(), Want::Int(ok.len() as u64)),
        ("failed".to_owned(), Want::Int((rows.len() - ok.len()) as u64)),
        ("total_input_tokens".to_owned(), Want::Int(total_input)),
        ("total_output_tokens".to_owned(), Want::Int(total_output)),
        ("request_throughput".to_owned(), Want::Float(ok.len() as f64 / dur_s)),
        ("request_goodput".to_owned(), if any_slo { Want::Float(good as f64 / dur_s) } else { Want::Null }),
        ("output_throughput".to_owned(), Want::Float(total_output as f64 / dur_s)),
        ("total_token_throughput".to_owned(), Want::Float((total_input + total_output) as f64 / dur_s)),
        ("max_output_tokens_per_s".to_owned(), Want::Float(*tokens_per_s.iter().max().unwrap() as f64)),
        ("max_concurrent_requests".to_owned(), Want::Int(*concurrent.iter().max().unwrap())),
    ];
    for (name, values) in [("ttft", &ttfts), ("tpot", &tpots), ("itl", &itls), ("e2el", &e2els)] {
        let order_stat = |x: f64| {
            if name == "itl" && !exact_itl { Want::Near(x * 1000.0, HISTOGRAM) } else { Want::Float(x * 1000.0) }
        };
        want.push((format!("mean_{name}_ms"), Want::Float(np_mean(values) * 1000.0)));
        want.push((format!("median_{name}_ms"), order_stat(np_median(values))));
        want.push((format!("std_{name}_ms"), Want::Float(np_std(values) * 1000.0)));
        for &p in ps {
            // vLLM: p_word = str(int(p)) if int(p) == p else str(p)
            let word = if p.fract() == 0.0 { format!("{}", p as i64) } else { format!("{p}") };
            want.push((format!("p{word}_{name}_ms"), order_stat(np_percentile(values, p))));
        }
    }
    want
}

/// Compares `report.json`'s `bench` with `want`, key for key, in order.
fn check(report_text: &str, want: &[(String, Want)], case: &str) {
    let report: Value = serde_json::from_str(report_text).unwrap();
    let bench = report["bench"].as_object().unwrap_or_else(|| panic!("{case}: no bench object"));
    let names: Vec<&str> = want.iter().map(|(k, _)| k.as_str()).collect();
    let mut got_names: Vec<&str> = bench.keys().map(String::as_str).collect();
    let text = &report_text[report_text.find("\"bench\":").unwrap()..];
    got_names.sort_by_key(|k| text.find(&format!("\"{k}\":")).unwrap());
    assert_eq!(got_names, names, "{case}: bench keys, in vLLM's order");
    for (k, w) in want {
        let v = &bench[k];
        // (Plus 1e-12 absolute: a std of equal values is 0 here and a
        // rounding residue in a naive two-pass std.)
        let close = |x: f64, y: f64, rel: f64| (x - y).abs() <= rel * y.abs() + 1e-12;
        let fine = match *w {
            Want::Int(i) => v.as_u64() == Some(i),
            Want::Float(x) => v.as_f64().is_some_and(|y| close(y, x, 1e-9)),
            Want::Near(x, rel) => v.as_f64().is_some_and(|y| close(y, x, rel)),
            Want::Null => v.is_null(),
        };
        assert!(fine, "{case}: {k} = {v}, vLLM's definition gives {w:?}");
    }
}

/// A P/D scenario on the GLM-like model: prompts over max_model_len fail at
/// arrival (so `failed` and the successful-only rule matter), outputs of
/// 1 to 60 tokens, and every decode step 1 ms whatever its batch.
fn constant_decode_scenario() -> String {
    let model = scenario_file("models/glm-5.3-flash-tp4-fp8.toml");
    format!(
        r#"name = "bench-constant-decode"
include = [{model:?}]
vllm_version = "0.32.0"
seed = 7

[prefill]
num_blocks = 2000
max_model_len = 2500
step_time = {{ kind = "linear", fixed_us = 2000, per_token_us = 20 }}

[decode]
num_blocks = 2000
step_time = {{ kind = "linear", fixed_us = 1000 }}

[workload]
requests = 300
arrival = {{ kind = "poisson", rate_per_s = 20.0 }}
prompt_tokens = {{ kind = "uniform", min = 50, max = 3000 }}
output_tokens = {{ kind = "uniform", min = 1, max = 60 }}

[slo]
ttft_ms = 40.0
tpot_ms = 1.5
e2e_ms = 90.0
"#
    )
}

/// Decode steps that cost by batch and context, every output two tokens
/// (one gap each); P/D or aggregated; an SLO or none.
fn two_token_scenario(aggregated: bool, slo: bool) -> String {
    let model = scenario_file("models/glm-5.3-flash-tp4-fp8.toml");
    let decode = r#"step_time = { kind = "linear", fixed_us = 1000, per_token_us = 3, per_seq_us = 50, per_context_token_us = 0.01 }"#;
    let roles = if aggregated {
        format!("[aggregated]\nnum_blocks = 3000\nmax_model_len = 2500\n{decode}\n")
    } else {
        format!(
            "[prefill]\nnum_blocks = 2000\nmax_model_len = 2500\nstep_time = {{ kind = \"linear\", fixed_us = 2000, per_token_us = 20 }}\n\n[decode]\nnum_blocks = 2000\n{decode}\n"
        )
    };
    let slo = if slo { "[slo]\nttft_ms = 100.0\ntpot_ms = 1.5\n" } else { "" };
    format!(
        r#"name = "bench-two-tokens"
include = [{model:?}]
vllm_version = "0.32.0"
seed = 3

{roles}
[workload]
requests = 400
arrival = {{ kind = "poisson", rate_per_s = 30.0 }}
prompt_tokens = {{ kind = "uniform", min = 50, max = 3000 }}
output_tokens = {{ kind = "fixed", value = 2 }}

{slo}"#
    )
}

fn run(file: &Path, out: &Path, extra: &[&str]) -> (String, String) {
    let mut args = vec!["run", file.to_str().unwrap(), "--out", out.to_str().unwrap(), "--no-trace"];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = outcome(&pdsim(&args));
    assert_eq!(code, 0, "{args:?}: {stderr}");
    (std::fs::read_to_string(out.join("report.json")).unwrap(), stdout)
}

#[test]
fn bench_fields_are_vllms_definitions_recomputed_from_requests_csv() {
    let ps = [50.0, 90.0, 95.0, 99.0];
    // Every decode step 1 ms: a request's tokens are 1 ms apart.
    let file = scratch("bench-constant.toml", &constant_decode_scenario());
    let dir = scratch_dir("bench-constant");
    let (report, _) = run(&file, &dir, &[]);
    let rows = read_rows(&dir.join("requests.csv"));
    let step = 1_000_000;
    for (i, r) in rows.iter().enumerate().filter(|(_, r)| r.completed) {
        assert_eq!(r.last_token.unwrap() - r.first_token.unwrap(), (r.generated - 1) * step, "request {i}");
    }
    assert!(rows[0].completed, "the windows start at the first arrival, which must succeed");
    let failed = rows.iter().filter(|r| !r.completed).count();
    assert!(failed > 10 && rows.iter().any(|r| r.completed && r.generated == 1), "{failed} failed");
    let tokens = |r: &Row| (0..r.generated).map(|k| r.first_token.unwrap() + k * step).collect::<Vec<_>>();
    let slo = Slo { ttft: Some(40.0), tpot: Some(1.5), e2el: Some(90.0) };
    check(&report, &vllm_bench(&rows, slo, &ps, tokens, true), "constant decode");

    // Two tokens an output, gaps that vary with the batch and the context:
    // each request's one gap is last − first token.
    for (aggregated, with_slo) in [(false, true), (true, false)] {
        let case = if aggregated { "two tokens, aggregated" } else { "two tokens, P/D" };
        let file = scratch(&format!("bench-two-{aggregated}.toml"), &two_token_scenario(aggregated, with_slo));
        let dir = scratch_dir(&format!("bench-two-{aggregated}"));
        let (report, _) = run(&file, &dir, &[]);
        let rows = read_rows(&dir.join("requests.csv"));
        assert!(rows[0].completed, "{case}");
        let tokens = |r: &Row| vec![r.first_token.unwrap(), r.last_token.unwrap()];
        let gaps: Vec<u64> =
            rows.iter().filter(|r| r.completed).map(|r| r.last_token.unwrap() - r.first_token.unwrap()).collect();
        assert!(gaps.iter().max() > gaps.iter().min(), "{case}: the gaps vary");
        let slo = if with_slo { Slo { ttft: Some(100.0), tpot: Some(1.5), e2el: None } } else { Slo::default() };
        check(&report, &vllm_bench(&rows, slo, &ps, tokens, false), case);
    }
}

#[test]
fn percentiles_are_chosen_and_named_as_vllm_names_them() {
    let file = scratch("bench-names.toml", &constant_decode_scenario());
    let dir = scratch_dir("bench-names");
    let (report, _) = run(&file, &dir, &["--percentiles", "50,99.9", "--requests", "60"]);
    let v: Value = serde_json::from_str(&report).unwrap();
    let bench = v["bench"].as_object().unwrap();
    for m in ["ttft", "tpot", "itl", "e2el"] {
        for k in [format!("p50_{m}_ms"), format!("p99.9_{m}_ms"), format!("median_{m}_ms"), format!("std_{m}_ms")] {
            assert!(bench.contains_key(&k), "{k}");
        }
        assert!(!bench.contains_key(&format!("p99_{m}_ms")), "only the percentiles asked for");
    }
    // The percentiles of a sweep's columns, and the values of report.json.
    let sweep = scratch("bench-names-sweep.toml", &format!("scenario = {file:?}\nrequests = 60\n"));
    let sdir = scratch_dir("bench-names-sweep");
    let (code, _, stderr) = outcome(&pdsim(&[
        "sweep",
        sweep.to_str().unwrap(),
        "--out",
        sdir.to_str().unwrap(),
        "--percentiles",
        "50,99.9",
    ]));
    assert_eq!(code, 0, "{stderr}");
    let csv = Csv::read(&sdir.join("sweep.csv"));
    for (k, value) in bench {
        let i = csv.col(k);
        let cell = &csv.rows[0][i];
        match value {
            Value::Null => assert_eq!(cell, "", "{k}"),
            Value::Number(n) if n.is_u64() => assert_eq!(cell, &n.to_string(), "{k}"),
            // Six decimals of the value (serde_json may read a float back
            // one ulp off, which can move a sixth decimal on a tie).
            Value::Number(n) => {
                let (x, y) = (cell.parse::<f64>().unwrap(), n.as_f64().unwrap());
                assert!(cell.split_once('.').is_some_and(|(_, d)| d.len() == 6), "{k}: {cell}");
                assert!((x - y).abs() <= 5.01e-7 * y.abs().max(1.0), "{k}: {cell} against {y}");
            }
            other => panic!("{k}: {other}"),
        }
    }
    // A bad list: exit 2, one line naming the flag.
    for bad in ["", "abc", "50,,90", "101", "-1", "nan", "inf", "99,99.0"] {
        for verb in [&["run", file.to_str().unwrap()][..], &["sweep", sweep.to_str().unwrap()][..]] {
            let mut args = verb.to_vec();
            args.extend(["--out", sdir.to_str().unwrap(), "--percentiles", bad]);
            let (code, stdout, stderr) = outcome(&pdsim(&args));
            assert_eq!(code, 2, "{args:?}: {stderr}");
            assert!(stdout.is_empty(), "{stdout}");
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(stderr.contains("--percentiles"), "{stderr}");
        }
    }
}

#[test]
fn overload_is_reported_when_the_offered_load_exceeds_what_is_served() {
    // The GLM 1P1D scenario serves about 6.1 req/s (its prefill rank is the
    // limit); at 8 req/s the backlog grows for as long as requests come.
    let shipped = std::fs::read_to_string(scenario_file("glm-5.3-flash-1p1d.toml")).unwrap();
    let model = scenario_file("models/glm-5.3-flash-tp4-fp8.toml");
    let at_8 = shipped
        .replace(r#"include = ["models/glm-5.3-flash-tp4-fp8.toml"]"#, &format!("include = [{model:?}]"))
        .replace("rate_per_s = 4.0", "rate_per_s = 8.0");
    assert_ne!(at_8, shipped);
    let file = scratch("bench-overload.toml", &at_8);
    let dir = scratch_dir("bench-overload");
    let (report, stdout) = run(&file, &dir, &["--requests", "500", "--no-timeline"]);
    let v: Value = serde_json::from_str(&report).unwrap();
    let o = &v["overload"];
    assert_eq!(o["overloaded"], true, "{o}");
    assert_eq!(o["bottleneck"], "prefill", "{o}");
    let (lambda, mu) = (o["arrival_rate_per_s"].as_f64().unwrap(), o["completion_rate_per_s"].as_f64().unwrap());
    assert!(lambda > 7.0 && mu < 0.8 * lambda, "{o}");
    assert!(o["backlog_growth_per_s"].as_f64().unwrap() > 1.0, "{o}");
    assert!(o["late_ttft_ms"].as_f64().unwrap() > 3.0 * o["early_ttft_ms"].as_f64().unwrap(), "{o}");
    let line = stdout.lines().find(|l| l.starts_with("overload ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("req/s") && line.contains("bottleneck prefill"), "{line}");

    // At its own 4 req/s it serves what comes.
    let dir = scratch_dir("bench-stable");
    let (report, stdout) =
        run(&scenario_file("glm-5.3-flash-1p1d.toml"), &dir, &["--requests", "500", "--no-timeline"]);
    let v: Value = serde_json::from_str(&report).unwrap();
    let o = &v["overload"];
    assert_eq!(o["overloaded"], false, "{o}");
    assert!(o["backlog_growth_per_s"].as_f64().unwrap().abs() < 0.1, "{o}");
    let shares = o["busy_share"].as_object().unwrap();
    assert_eq!(shares.keys().collect::<Vec<_>>(), ["decode", "link", "prefill"]);
    assert!(!stdout.contains("overload"), "{stdout}");
}

/// The bottleneck is where requests wait, not the busiest role. The GLM
/// 1P1D scenario at 5 req/s with bursty (gamma, cv 3) arrivals: its decode
/// rank steps whenever it holds anything (busy 95.0 % of the time), its
/// prefill rank 79.2 %, and a busiest-role rule said "decode" (the old
/// one: decode was the only role at 95 % or more, so the busiest won).
/// Yet the requests queued in front of the prefill rank: mean prefill
/// queue 2,913.8 ms of a mean TTFT of 3,462.2 ms (84 %), against a transfer
/// wait of 2.1 ms plus a decode queue of 1.8 ms in front of the decode rank.
#[test]
fn the_bottleneck_is_where_the_time_goes_not_the_busiest_role() {
    let shipped = std::fs::read_to_string(scenario_file("glm-5.3-flash-1p1d.toml")).unwrap();
    let model = scenario_file("models/glm-5.3-flash-tp4-fp8.toml");
    let bursty = shipped
        .replace(r#"include = ["models/glm-5.3-flash-tp4-fp8.toml"]"#, &format!("include = [{model:?}]"))
        .replace(r#"{ kind = "poisson", rate_per_s = 4.0 }"#, r#"{ kind = "gamma", rate_per_s = 5.0, cv = 3.0 }"#);
    assert_ne!(bursty, shipped);
    let file = scratch("bench-bottleneck.toml", &bursty);
    let dir = scratch_dir("bench-bottleneck");
    let (report, _) = run(&file, &dir, &["--requests", "2000", "--no-timeline"]);
    let v: Value = serde_json::from_str(&report).unwrap();
    let (o, s) = (&v["overload"], &v["summary"]);
    let f = |x: &Value| x.as_f64().unwrap();
    let busy = &o["busy_share"];
    // The old answer: decode is the only role busy 95 % of the time or
    // more, and the busiest.
    assert!(f(&busy["decode"]) >= 0.95 && f(&busy["prefill"]) < 0.95, "{o}");
    assert!(f(&busy["decode"]) > f(&busy["prefill"]), "{o}");
    // Where the time went: the prefill queue holds most of the mean TTFT
    // (the API server's legs taken out: 3.6 ms in, a 7.2 ms hop).
    let front = &v["scenario"]["resolved"]["frontend"];
    let (way_in, way_out) = (f(&front["request_us"]) / 1e3, f(&front["response_us"]) / 1e3);
    let pq = f(&s["prefill_queue_ms"]["mean"]) - way_in;
    let decode_wait =
        (f(&s["transfer_wait_ms"]["mean"]) - (way_in + way_out)).max(0.0) + f(&s["decode_queue_ms"]["mean"]);
    let ttft = f(&s["ttft_ms"]["mean"]);
    assert!(
        pq > 0.5 * ttft && pq > 100.0 * decode_wait,
        "prefill queue {pq} ms, decode {decode_wait} ms, TTFT {ttft} ms"
    );
    assert_eq!(o["bottleneck"], "prefill", "{o}");
    assert_eq!(f(&o["wait_ms"]["prefill"]), pq);
    assert_eq!(f(&o["wait_ms"]["decode"]), decode_wait);
    assert_eq!(f(&o["wait_ms"]["link"]), f(&s["transfer_time_ms"]["mean"]));
    assert_eq!(f(&o["bottleneck_ttft_share"]), pq / ttft);
}

/// The JSON kind of a value, as Python's json gives it: `int` for a whole
/// number written without a point or exponent, `float` for other numbers.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_u64() || n.is_i64() => "int",
        Value::Number(_) => "float",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// `vllm-bench.json` has the keys of a file vLLM 0.33.0's `vllm bench
/// serve --save-result --save-detailed` wrote (tests/fixtures/vllm-bench/,
/// see its README), in the same order, each with a value of the same
/// type (lists' items too); its statistics are report.json's `bench`, and
/// its per-request lists are requests.csv's, in seconds.
#[test]
fn vllm_bench_json_is_the_file_vllm_writes() {
    let recorded: Value =
        serde_json::from_str(&std::fs::read_to_string(crate::common::fixture("vllm-bench/recorded.json")).unwrap())
            .unwrap();
    let dir = scratch_dir("bench-vllm-file");
    // With an SLO, as the recording's --goodput: request_goodput a number.
    let (report, _) = run(&scenario_file("glm-5.3-flash-2p2d.toml"), &dir, &["--requests", "40", "--no-timeline"]);
    let report: Value = serde_json::from_str(&report).unwrap();
    let ours: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("vllm-bench.json")).unwrap()).unwrap();
    let (r, o) = (recorded.as_object().unwrap(), ours.as_object().unwrap());
    assert_eq!(o.keys().collect::<Vec<_>>(), r.keys().collect::<Vec<_>>(), "the keys, in vLLM's order");
    for (k, rv) in r {
        let ov = &o[k];
        // vLLM's label is null unless --label is given; pdsim's is the
        // scenario's name.
        if k == "label" {
            assert_eq!(ov, "glm-5.3-flash-2p2d");
            continue;
        }
        assert_eq!(kind(ov), kind(rv), "{k}: {ov} against vLLM's {rv}");
        if let (Value::Array(oa), Value::Array(ra)) = (ov, rv) {
            assert_eq!(oa.len(), 40, "{k}: one item per request");
            for item in oa {
                assert_eq!(kind(item), kind(&ra[0]), "{k}: an item {item} against vLLM's {}", ra[0]);
                if let (Value::Array(inner), Value::Array(rinner)) = (item, &ra[0]) {
                    assert!(inner.iter().all(|x| kind(x) == kind(&rinner[0])), "{k}: {item}");
                }
            }
        }
    }
    assert_eq!(ours["date"], "19700101-000000");
    assert_eq!((ours["request_rate"].as_f64(), ours["burstiness"].as_f64()), (Some(8.0), Some(1.0)));
    // The statistics are bench's, bit for bit.
    for (k, v) in report["bench"].as_object().unwrap() {
        assert_eq!(&ours[k], v, "{k}");
    }
    assert_eq!(ours["num_prompts"], 40);
    // The lists are requests.csv's, in seconds: ttft + the gaps is the
    // latency, the gaps one fewer than the output tokens.
    let csv = Csv::read(&dir.join("requests.csv"));
    let f = |v: &Value| v.as_f64().unwrap();
    for (i, row) in csv.rows.iter().enumerate() {
        let cell = |c: &str| row[csv.col(c)].as_str();
        assert_eq!(ours["input_lens"][i].to_string(), cell("prompt_tokens"));
        assert_eq!(ours["output_lens"][i].to_string(), cell("generated_tokens"));
        let (a, first, end) =
            (ns(cell("arrival_ms")).unwrap(), ns(cell("first_token_ms")).unwrap(), ns(cell("finished_ms")).unwrap());
        assert_eq!(f(&ours["start_times"][i]), a as f64 / 1e9);
        assert_eq!(f(&ours["ttfts"][i]), (first - a) as f64 / 1e9);
        assert_eq!(f(&ours["latencies"][i]), (end - a) as f64 / 1e9);
        let gaps = ours["itls"][i].as_array().unwrap();
        assert_eq!(gaps.len() as u64 + 1, cell("generated_tokens").parse::<u64>().unwrap());
        let sum: f64 = gaps.iter().map(f).sum();
        // Each gap to the nanosecond: within half a nanosecond a gap.
        let within = 0.5e-9 * gaps.len() as f64 + 1e-12;
        assert!((f(&ours["ttfts"][i]) + sum - f(&ours["latencies"][i])).abs() <= within, "request {i}");
        assert_eq!(ours["errors"][i], "");
        assert_eq!(ours["generated_texts"][i], "");
    }
    // --no-vllm-bench leaves it out.
    let none = scratch_dir("bench-vllm-file-none");
    run(&scenario_file("glm-5.3-flash-2p2d.toml"), &none, &["--requests", "5", "--no-vllm-bench"]);
    assert!(!none.join("vllm-bench.json").exists());
}
