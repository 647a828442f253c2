//! Synthetic workloads: determinism per seed, sample means near their
//! targets, closed loops, shared prefixes.
//!
//! Tolerances: a sample mean of n = 4,000 draws with standard deviation σ
//! has a standard error σ/√n = σ/63.2; each check allows 5 standard errors
//! or more, so a correct sampler fails it with probability < 10⁻⁶ (and the
//! seeds are fixed, so the tests are deterministic anyway).

use actors::workload::{ArrivalMode, RequestSource, RequestSpec};
use pdsim::scenario::{self, Scenario};
use pdsim::workload::{ArrivalSpec, LengthSpec, SHARED_PREFIX_BLOCK_TOKENS, shared_prefix_ids};

use crate::common::{base_with_lines, scratch};

const N: u64 = 4_000;

/// The base scenario with `arrival`, `prompt` and `output` for [workload]
/// (lines 15–17), and `extra` lines after them.
fn scenario_with(name: &str, arrival: &str, prompt: &str, output: &str, extra: &str) -> Scenario {
    let requests = format!("requests = {N}");
    let output = format!("{output}\n{extra}");
    let text = base_with_lines(&[(14, &requests), (15, arrival), (16, prompt), (17, &output)]);
    scenario::load(scratch(name, &text)).unwrap()
}

fn draw(s: &Scenario, seed: u64) -> Vec<RequestSpec> {
    let mut src = s.workload().source(seed, None).unwrap();
    let mut out = Vec::new();
    while let Some(r) = src.next_request().unwrap() {
        out.push(r);
    }
    out
}

fn mean(xs: impl Iterator<Item = f64>) -> (f64, f64) {
    let v: Vec<f64> = xs.collect();
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64;
    (m, var.sqrt())
}

fn gaps_s(reqs: &[RequestSpec]) -> impl Iterator<Item = f64> + '_ {
    reqs.windows(2).map(|w| (w[1].arrival.as_nanos() - w[0].arrival.as_nanos()) as f64 / 1e9)
}

fn poisson_lognormal() -> Scenario {
    scenario_with(
        "wl-poisson.toml",
        "arrival = { kind = \"poisson\", rate_per_s = 4.0 }",
        "prompt_tokens = { kind = \"lognormal\", mean = 4000, std = 3000 }",
        "output_tokens = { kind = \"normal\", mean = 500, std = 100 }",
        "",
    )
}

#[test]
fn same_seed_same_stream_other_seed_other_stream() {
    let s = poisson_lognormal();
    let a = draw(&s, 1);
    let b = draw(&s, 1);
    let c = draw(&s, 2);
    assert_eq!(a.len() as u64, N);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_ne!(a.iter().map(|r| r.prompt).collect::<Vec<_>>(), c.iter().map(|r| r.prompt).collect::<Vec<_>>());
    // The first request arrives at 0; arrivals never decrease.
    assert_eq!(a[0].arrival.as_nanos(), 0);
    assert!(a.windows(2).all(|w| w[0].arrival <= w[1].arrival));
}

#[test]
fn poisson_and_length_means_are_near_their_targets() {
    let reqs = draw(&poisson_lognormal(), 1);
    // Exponential gaps: mean 1/4 s, σ = 0.25 → s.e. 0.0040; allow 0.02.
    let (gap, gap_sd) = mean(gaps_s(&reqs));
    assert!((gap - 0.25).abs() < 0.02, "mean gap {gap}");
    // An exponential's standard deviation equals its mean (cv 1).
    assert!((gap_sd / gap - 1.0).abs() < 0.1, "cv {}", gap_sd / gap);
    // Log-normal with mean 4,000 and σ 3,000 (of the tokens): s.e. 47; allow 250.
    let (p, p_sd) = mean(reqs.iter().map(|r| r.prompt.get() as f64));
    assert!((p - 4000.0).abs() < 250.0, "mean prompt {p}");
    assert!((p_sd - 3000.0).abs() < 600.0, "sd prompt {p_sd}");
    // Normal 500 ± 100: s.e. 1.6; allow 8.
    let (o, _) = mean(reqs.iter().map(|r| r.output.get() as f64));
    assert!((o - 500.0).abs() < 8.0, "mean output {o}");
    assert!(reqs.iter().all(|r| r.prompt.get() >= 1 && r.output.get() >= 1));
}

#[test]
fn gamma_arrivals_have_the_rate_and_the_cv() {
    let s = scenario_with(
        "wl-gamma.toml",
        "arrival = { kind = \"gamma\", rate_per_s = 4.0, cv = 2.0 }",
        "prompt_tokens = { kind = \"uniform\", min = 100, max = 300 }",
        "output_tokens = { kind = \"empirical\", values = [10, 20, 60] }",
        "",
    );
    let reqs = draw(&s, 3);
    // Gamma gaps with mean 0.25 s and cv 2: σ = 0.5 → s.e. 0.0079; allow 0.04.
    let (gap, sd) = mean(gaps_s(&reqs));
    assert!((gap - 0.25).abs() < 0.04, "mean gap {gap}");
    // Shape k = 1/cv² = 0.25 has excess kurtosis 6/k = 24, so the sample
    // variance has relative s.e. √(26/n) ≈ 0.08 and the cv ≈ 0.04; allow 0.4.
    assert!((sd / gap - 2.0).abs() < 0.4, "cv {}", sd / gap);
    // Uniform 100..=300: mean 200, σ = 57.7 → s.e. 0.9; allow 5.
    let (p, _) = mean(reqs.iter().map(|r| r.prompt.get() as f64));
    assert!((p - 200.0).abs() < 5.0, "mean prompt {p}");
    assert!(reqs.iter().all(|r| (100..=300).contains(&r.prompt.get())));
    // Empirical {10, 20, 60}: mean 30, σ = 21.6 → s.e. 0.34; allow 2.
    let (o, _) = mean(reqs.iter().map(|r| r.output.get() as f64));
    assert!((o - 30.0).abs() < 2.0, "mean output {o}");
    assert!(reqs.iter().all(|r| [10, 20, 60].contains(&r.output.get())));
}

#[test]
fn max_clamps_and_rounding() {
    let s = scenario_with(
        "wl-clamp.toml",
        "arrival = { kind = \"poisson\", rate_per_s = 4.0 }",
        "prompt_tokens = { kind = \"lognormal\", mean = 4000, std = 8000, max = 5000 }",
        "output_tokens = { kind = \"normal\", mean = 2, std = 10 }",
        "",
    );
    let reqs = draw(&s, 1);
    assert!(reqs.iter().all(|r| r.prompt.get() <= 5000));
    assert!(reqs.iter().any(|r| r.prompt.get() == 5000), "the clamp is reached");
    // Normal(2, 10) is below 0.5 about 44% of the time; those clamp to 1.
    assert!(reqs.iter().all(|r| r.output.get() >= 1));
    assert!(reqs.iter().filter(|r| r.output.get() == 1).count() > 1000);
}

#[test]
fn closed_loop_has_a_concurrency_and_no_arrival_times() {
    let s = scenario_with(
        "wl-closed.toml",
        "arrival = { kind = \"closed_loop\", concurrency = 8 }",
        "prompt_tokens = { kind = \"fixed\", value = 100 }",
        "output_tokens = { kind = \"fixed\", value = 10 }",
        "",
    );
    assert_eq!(s.workload().arrival_mode(), ArrivalMode::Closed { concurrency: 8 });
    let reqs = draw(&s, 1);
    assert_eq!(reqs.len() as u64, N);
    assert!(reqs.iter().all(|r| r.arrival.as_nanos() == 0 && r.prompt.get() == 100 && r.output.get() == 10));
    assert_eq!(poisson_lognormal().workload().arrival_mode(), ArrivalMode::Open);
}

#[test]
fn request_count_can_be_overridden() {
    let s = poisson_lognormal();
    let mut src = s.workload().source(1, Some(5)).unwrap();
    let mut n = 0;
    while src.next_request().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 5);
    assert_eq!(src.stats().requests, 5);
}

#[test]
fn changing_the_rate_keeps_every_length() {
    // Each quantity has its own random stream: a sweep over the arrival
    // rate sees the same prompts and outputs at every point.
    let s = poisson_lognormal();
    let t = s.with_overrides(&[("workload.arrival.rate_per_s", toml::Value::Float(8.0))]).unwrap();
    let a = draw(&s, 1);
    let b = draw(&t, 1);
    assert!(a.iter().zip(&b).all(|(x, y)| x.prompt == y.prompt && x.output == y.output));
    // And the gaps halve, up to the rounding of each gap to 1 ns.
    let end_a = a.last().unwrap().arrival.as_nanos() as f64;
    let end_b = b.last().unwrap().arrival.as_nanos() as f64;
    assert!((end_a / end_b - 2.0).abs() < 1e-6, "{end_a} {end_b}");
}

#[test]
fn shared_prefix_groups() {
    let s = scenario_with(
        "wl-prefix.toml",
        "arrival = { kind = \"poisson\", rate_per_s = 4.0 }",
        "prompt_tokens = { kind = \"uniform\", min = 1, max = 2000 }",
        "output_tokens = { kind = \"fixed\", value = 10 }",
        "shared_prefix = { groups = 4, tokens = 100 }",
    );
    let reqs = draw(&s, 1);
    let b = SHARED_PREFIX_BLOCK_TOKENS;
    // 100 shared tokens = 6 whole blocks of 16 (96 tokens); block 6 straddles
    // the end of the prefix and holds the request's own tokens, so it and
    // every later block get no id. A prompt inside the prefix has an id for
    // each of its blocks, the partial last one included.
    for r in &reqs {
        assert_eq!(r.prefix.block_tokens.get(), b);
        let expected = if r.prompt.get() <= 100 { r.prompt.get().div_ceil(b) } else { 6 };
        assert_eq!(r.prefix.ids.len() as u64, expected, "prompt {}", r.prompt);
    }
    // Requests past the prefix share their 6 ids with their group, and
    // there are 4 groups.
    let long: Vec<&RequestSpec> = reqs.iter().filter(|r| r.prompt.get() > 100).collect();
    let mut firsts: Vec<&[u64]> = long.iter().map(|r| &r.prefix.ids[..6]).collect();
    firsts.sort();
    firsts.dedup();
    assert_eq!(firsts.len(), 4);
    // Each group gets about a quarter of the requests: σ of a count is
    // √(n·¼·¾) ≈ 27 for n = 4,000; allow 150.
    let g0 = long.iter().filter(|r| r.prefix.ids[..6] == *firsts[0]).count() as f64;
    assert!((g0 - long.len() as f64 / 4.0).abs() < 150.0, "{g0} of {}", long.len());
    // Every request's ids are one group's, as made for its own prompt
    // (the source keeps a group's whole-prefix ids made once).
    for r in &reqs {
        let ok = (0..4).any(|g| shared_prefix_ids(g, 100, r.prompt) == r.prefix);
        assert!(ok, "prompt {}: ids of no group", r.prompt);
    }
}

#[test]
fn length_spec_means() {
    assert_eq!(LengthSpec::Uniform { min: 1, max: 3 }.mean(), 2.0);
    assert_eq!(LengthSpec::Empirical { values: vec![1, 2, 6] }.mean(), 3.0);
    assert!(matches!(poisson_lognormal().workload().arrival, Some(ArrivalSpec::Poisson { .. })));
}

/// `priorities`: each drawn by its weight's share (3:1 over 4,000 draws:
/// 3,000 ± 5 × √(4000 × 0.75 × 0.25) = ± 137), from a stream of its own,
/// so the arrivals and lengths are those of the same workload without it;
/// a weight that is not positive is refused at its field.
#[test]
fn priorities_are_drawn_by_weight_from_their_own_stream() {
    let mix = "priorities = [{ value = 0, weight = 3.0 }, { value = 7, weight = 1.0 }]";
    let with = scenario_with(
        "wl-prio.toml",
        "arrival = { kind = \"poisson\", rate_per_s = 4.0 }",
        "prompt_tokens = { kind = \"lognormal\", mean = 4000, std = 3000 }",
        "output_tokens = { kind = \"normal\", mean = 500, std = 100 }",
        mix,
    );
    let a = draw(&with, 1);
    let zeros = a.iter().filter(|r| r.priority == 0).count() as i64;
    assert!(a.iter().all(|r| r.priority == 0 || r.priority == 7));
    assert!((zeros - 3_000).abs() < 137, "{zeros} of 4000 at priority 0");
    let without = draw(&poisson_lognormal(), 1);
    let strip = |v: &[RequestSpec]| v.iter().map(|r| (r.arrival, r.prompt, r.output)).collect::<Vec<_>>();
    assert_eq!(strip(&a), strip(&without));
    assert!(without.iter().all(|r| r.priority == 0));

    let bad = base_with_lines(&[(
        17,
        "output_tokens = { kind = \"fixed\", value = 10 }\npriorities = [{ value = 1, weight = 0.0 }]",
    )]);
    let err = scenario::load(scratch("wl-prio-bad.toml", &bad)).unwrap_err();
    assert_eq!(err.field(), Some("workload.priorities[0].weight"), "{err}");
}
