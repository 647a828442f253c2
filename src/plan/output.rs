//! What a plan writes: `candidates.csv`, `best.toml`, the vLLM launch
//! lines (`launch.sh`) and the terminal summary. Every byte depends only
//! on the plan file (no time, no thread count); `best.toml` names its
//! trace and model files relative to its own folder, so it runs where it
//! is written.

use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

use actors::config::{Policy, StepTimeSpec};

use super::search::{Outcome, PlanResult, Status};
use super::space::{self, Candidate, Shape};
use super::{Plan, SearchMode};
use crate::report::csv_field;

/// The header of `candidates.csv`.
pub const CSV_HEADER: &str = "candidate,mode,shape,aggregated_ranks,aggregated_tp,prefill_ranks,prefill_tp,\
decode_ranks,decode_tp,gpus,max_num_batched_tokens,max_num_seqs,link_bandwidth_gb_s,router_policy,step_time,\
status,bound_rate_per_s,bound_role,target_rate_per_s,meets_slo,max_rate_per_s,min_failing_rate_per_s,\
rate_per_s,attainment,goodput_per_s,goodput_per_gpu,output_tok_s_per_gpu,interactivity_tok_s_user,\
ttft_p99_ms,tpot_p99_ms,bottleneck,pareto,best,trials,simulated_requests,note";

fn f(x: f64, decimals: usize) -> String {
    format!("{x:.decimals$}")
}

fn opt(x: Option<f64>, decimals: usize) -> String {
    x.map(|x| f(x, decimals)).unwrap_or_default()
}

fn policy_name(p: Policy) -> String {
    toml::Value::try_from(p).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

fn step_time_name(s: &StepTimeSpec) -> &'static str {
    match s {
        StepTimeSpec::Linear { .. } => "linear",
        StepTimeSpec::Table { .. } => "table",
        StepTimeSpec::Table2d { .. } => "table2d",
        StepTimeSpec::Roofline(_) => "roofline",
    }
}

/// The axis values a candidate runs with: its own, else the base
/// scenario's (its first role's).
pub struct Effective {
    /// `max_num_batched_tokens`.
    pub max_num_batched_tokens: u64,
    /// `max_num_seqs`.
    pub max_num_seqs: u32,
    /// The link's bandwidth (P/D only).
    pub link_bandwidth_gb_s: Option<f64>,
    /// The prefill (and aggregated) routing policy.
    pub router_policy: String,
    /// The step-time kind (with its index when the plan lists several).
    pub step_time: String,
}

/// [`Effective`] of `c`.
pub fn effective(plan: &Plan, c: &Candidate) -> Effective {
    let d = plan.base.deployment();
    let first = d.aggregated.as_ref().or(d.prefill.as_ref());
    let k = &c.knobs;
    let tp = match c.shape {
        Shape::Aggregated { tp, .. } => tp,
        Shape::Disaggregated { prefill_tp, .. } => prefill_tp,
    };
    let step_time = match (k.step_time, &plan.spec.step_time, &plan.spec.step_time_by_tp) {
        (Some(i), Some(list), _) => format!("{}[{i}]", step_time_name(&list[i])),
        (_, _, Some(by_tp)) => by_tp.get(&tp.to_string()).map_or("", step_time_name).to_owned(),
        _ => first.map_or("", |r| step_time_name(&r.step_time)).to_owned(),
    };
    Effective {
        max_num_batched_tokens: k.max_num_batched_tokens.or(first.map(|r| r.max_num_batched_tokens)).unwrap_or(0),
        max_num_seqs: k.max_num_seqs.or(first.map(|r| r.max_num_seqs)).unwrap_or(0),
        link_bandwidth_gb_s: match c.shape {
            Shape::Disaggregated { .. } => Some(k.link_bandwidth_gb_s.unwrap_or(d.link.bandwidth_gb_s)),
            Shape::Aggregated { .. } => None,
        },
        router_policy: policy_name(k.router_policy.unwrap_or(d.router.prefill_policy)),
        step_time,
    }
}

/// `aggregated` or `disaggregated`.
pub fn mode_name(shape: &Shape) -> &'static str {
    match shape {
        Shape::Aggregated { .. } => "aggregated",
        Shape::Disaggregated { .. } => "disaggregated",
    }
}

/// One row of `candidates.csv`.
pub fn csv_row(plan: &Plan, result: &PlanResult, o: &Outcome) -> String {
    let c = &o.candidate;
    let e = effective(plan, c);
    let (ar, at, pr, pt, dr, dt) = match c.shape {
        Shape::Aggregated { ranks, tp } => {
            (ranks.to_string(), tp.to_string(), "".into(), "".into(), "".into(), "".into())
        }
        Shape::Disaggregated { prefill, prefill_tp, decode, decode_tp } => (
            String::new(),
            String::new(),
            prefill.to_string(),
            prefill_tp.to_string(),
            decode.to_string(),
            decode_tp.to_string(),
        ),
    };
    let gpus = f64::from(c.gpus());
    let t = o.at.as_ref();
    let note = match &o.status {
        Status::Infeasible(why) => why.clone(),
        Status::Pruned => format!(
            "bound {} req/s ({}) below the target",
            opt(o.bound.map(|b| b.rate), 3),
            o.bound.map_or("", |b| b.role)
        ),
        Status::Simulated if plan.spec.search == SearchMode::MaxRate && o.max_rate.is_none() => {
            "meets the SLO at no rate tried (down to 1/64 of the target)".to_owned()
        }
        Status::Simulated if o.min_failing.is_none() && plan.spec.search == SearchMode::MaxRate => {
            "passed every rate tried: the highest rate is a lower bound".to_owned()
        }
        Status::Simulated => String::new(),
    };
    let cells: Vec<String> = vec![
        c.index.to_string(),
        mode_name(&c.shape).to_owned(),
        c.shape.label(),
        ar,
        at,
        pr,
        pt,
        dr,
        dt,
        c.gpus().to_string(),
        e.max_num_batched_tokens.to_string(),
        e.max_num_seqs.to_string(),
        opt(e.link_bandwidth_gb_s, 3),
        e.router_policy,
        e.step_time,
        o.status.name().to_owned(),
        opt(o.bound.map(|b| b.rate), 4),
        o.bound.map_or("", |b| b.role).to_owned(),
        f(result.traffic.target, 4),
        o.meets.to_string(),
        opt(o.max_rate, 4),
        opt(o.min_failing, 4),
        opt(t.map(|t| t.rate), 4),
        opt(t.map(|t| t.attainment), 5),
        opt(t.map(|t| t.goodput), 4),
        opt(t.map(|t| t.goodput / gpus), 4),
        opt(t.map(|t| t.output_tokens_per_s / gpus), 2),
        opt(o.interactivity(), 3),
        opt(t.map(|t| t.ttft_p99_ms), 3),
        opt(t.map(|t| t.tpot_p99_ms), 3),
        o.bottleneck.unwrap_or("").to_owned(),
        result.frontier.contains(&c.index).to_string(),
        (result.best == Some(c.index)).to_string(),
        o.trials.len().to_string(),
        o.simulated_requests().to_string(),
        note,
    ];
    cells.iter().map(|s| csv_field(s)).collect::<Vec<_>>().join(",")
}

/// `to` relative to the folder `from` (both made absolute against the
/// current folder first).
fn relative_to(to: &Path, from: &Path) -> PathBuf {
    let abs = |p: &Path| {
        let p = if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir().unwrap_or_default().join(p) };
        std::fs::canonicalize(&p).unwrap_or(p)
    };
    let (to, from) = (abs(to), abs(from));
    let a: Vec<Component<'_>> = to.components().collect();
    let b: Vec<Component<'_>> = from.components().collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &a[common..] {
        out.push(c.as_os_str());
    }
    out
}

/// The best candidate's scenario as a file for `out_dir`: the candidate
/// at the target rate with the trials' request count and seed, its trace
/// and model files named relative to `out_dir`, under a header that
/// states the claim. `pdsim run` on it gives the trial's numbers.
///
/// # Errors
/// The scenario cannot be made again (a bug) or serialized.
pub fn best_toml(plan: &Plan, result: &PlanResult, best: &Outcome, out_dir: &Path) -> Result<String, String> {
    let mut captured = None;
    let t = &result.traffic;
    space::scenario(&plan.spec, &plan.base, &best.candidate, |table| {
        t.set_rate(&plan.base, table, t.target)?;
        captured = Some(table.clone());
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    let mut table = captured.ok_or("the candidate's table was not made")?;
    if let Some(toml::Value::String(p)) = table.get("workload").and_then(|w| w.get("trace")).and_then(|t| t.get("path"))
    {
        let rel = relative_to(Path::new(p), out_dir).display().to_string();
        space::set(&mut table, "workload.trace.path", toml::Value::String(rel))?;
    }
    if let Some(toml::Value::String(p)) = table.get("model").and_then(|m| m.get("config")) {
        let rel = relative_to(Path::new(p), out_dir).display().to_string();
        space::set(&mut table, "model.config", toml::Value::String(rel))?;
    }
    table.insert("seed".into(), toml::Value::Integer(plan.base.seed() as i64));
    let body = toml::to_string(&table).map_err(|e| format!("cannot serialize best.toml: {e}"))?;
    let c = &best.candidate;
    let trial = best.trials.first().ok_or("the best candidate ran no trial")?;
    let slo = plan.base.slo();
    let bounds: Vec<String> = [("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms), ("E2E", slo.e2e_ms)]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k} <= {v} ms")))
        .collect();
    let mut head = String::new();
    let _ = writeln!(
        head,
        "# The cheapest deployment `pdsim plan {}` found: {}, {} GPUs.",
        plan.base.source(),
        c.shape.label(),
        c.gpus()
    );
    let _ = writeln!(
        head,
        "# Claim: at {} req/s ({} requests, seed {}), {:.2} % of requests meet every SLO bound ({}), at least the {:.2} % asked.",
        f(t.target, 4),
        t.requests,
        plan.base.seed(),
        100.0 * trial.attainment,
        bounds.join(", "),
        100.0 * plan.spec.attainment
    );
    if let Some(m) = best.max_rate {
        let _ = writeln!(head, "# Its highest rate meeting them (bisection): {} req/s.", f(m, 4));
    }
    let _ = writeln!(head, "# Check it: pdsim run best.toml (digest {}).", crate::report::digest_hex(trial.digest));
    head.push('\n');
    head.push_str(&body);
    Ok(head)
}

/// The HuggingFace id `vllm serve` takes for a model preset.
fn hf_id(preset: &str) -> Option<&'static str> {
    Some(match preset {
        "llama-3.1-8b" => "meta-llama/Llama-3.1-8B",
        "qwen3-8b" => "Qwen/Qwen3-8B",
        "qwen3-30b-a3b" => "Qwen/Qwen3-30B-A3B",
        "mistral-7b-v0.3" => "mistralai/Mistral-7B-v0.3",
        "gpt-oss-20b" => "openai/gpt-oss-20b",
        "nemotron-h-8b" => "nvidia/Nemotron-H-8B-Base-8K",
        "deepseek-v3" => "deepseek-ai/DeepSeek-V3",
        _ => return None,
    })
}

/// NIXL's connector as vLLM 0.33 takes it in `--kv-transfer-config`.
pub const NIXL_CONFIG: &str = r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#;

/// GPUs per node the launch lines assume (a rank's TP stays in a node).
pub const GPUS_PER_NODE: u32 = 8;

/// The vLLM launch lines of candidate `c`: one `vllm serve` per rank,
/// GPUs given out node by node (a rank never spans two nodes), P/D ranks
/// with NIXL's `--kv-transfer-config`.
pub fn launch_lines(plan: &Plan, c: &Candidate) -> String {
    let s = &plan.base;
    let model = match s.model_origin() {
        Some(o) if o.starts_with("preset ") => {
            let id = &o["preset ".len()..];
            hf_id(id).map_or_else(|| id.to_owned(), str::to_owned)
        }
        Some(o) => {
            o.strip_prefix("config ").map_or(o, |p| p.trim_end_matches("config.json").trim_end_matches('/')).to_owned()
        }
        None => s.model_spec().name.clone().unwrap_or_else(|| "MODEL".to_owned()),
    };
    let kv_dtype = s
        .model_source()
        .and_then(|m| m.get("kv_cache_dtype"))
        .and_then(toml::Value::as_str)
        .filter(|d| !matches!(*d, "auto"));
    let d = s.deployment();
    let e = effective(plan, c);
    let roles: Vec<(&str, u32, u32)> = match c.shape {
        Shape::Aggregated { ranks, tp } => vec![("aggregated", ranks, tp)],
        Shape::Disaggregated { prefill, prefill_tp, decode, decode_tp } => {
            vec![("prefill", prefill, prefill_tp), ("decode", decode, decode_tp)]
        }
    };
    let mut out = String::new();
    let _ = writeln!(out, "#!/bin/sh");
    let _ = writeln!(
        out,
        "# vLLM 0.33 launch lines for {} ({} GPUs), from `pdsim plan {}`.",
        c.shape.label(),
        c.gpus(),
        s.source()
    );
    let _ = writeln!(out, "# One `vllm serve` per rank; GPUs numbered within each node of {GPUS_PER_NODE}.");
    if matches!(c.shape, Shape::Disaggregated { .. }) {
        let _ = writeln!(
            out,
            "# P/D: a router sends each request to a prefill rank (max_tokens 1, kv_transfer_params \
             {{\"do_remote_decode\": true}}), then to a decode rank with the prefill's kv_transfer_params."
        );
    } else {
        let _ = writeln!(out, "# Aggregated: a load balancer spreads requests over the ranks ({}).", e.router_policy);
    }
    let (mut node, mut used) = (0u32, 0u32);
    let mut port = 8100u32;
    let mut side = 5600u32;
    for (role, count, tp) in roles {
        let spec = match role {
            "aggregated" => d.aggregated.as_ref().or(d.prefill.as_ref()),
            "prefill" => d.prefill.as_ref().or(d.aggregated.as_ref()),
            _ => d.decode.as_ref().or(d.aggregated.as_ref()),
        };
        for k in 0..count {
            if used + tp > GPUS_PER_NODE && used > 0 {
                node += 1;
                used = 0;
            }
            let gpus: Vec<String> = (used..used + tp).map(|g| g.to_string()).collect();
            used += tp;
            let mut line = format!("# node {node}, {role} rank {k}\n");
            let mut env = format!("CUDA_VISIBLE_DEVICES={}", gpus.join(","));
            if role != "aggregated" {
                let _ = write!(env, " VLLM_NIXL_SIDE_CHANNEL_PORT={side}");
                side += tp.max(1);
            }
            let _ = write!(
                line,
                "{env} vllm serve {model} --port {port} --tensor-parallel-size {tp} --max-num-batched-tokens {} \
                 --max-num-seqs {}",
                e.max_num_batched_tokens, e.max_num_seqs
            );
            port += 1;
            if let Some(spec) = spec {
                if !spec.prefix_caching {
                    line.push_str(" --no-enable-prefix-caching");
                }
                if let Some(u) = spec.gpu_memory_utilization {
                    let _ = write!(line, " --gpu-memory-utilization {u}");
                }
                if let Some(m) = spec.max_model_len {
                    let _ = write!(line, " --max-model-len {}", m.get());
                }
            }
            if let Some(dtype) = kv_dtype {
                let _ = write!(line, " --kv-cache-dtype {dtype}");
            }
            if role != "aggregated" {
                let _ = write!(line, " --kv-transfer-config '{NIXL_CONFIG}'");
            }
            line.push_str(" &\n");
            out.push_str(&line);
        }
    }
    out.push_str("wait\n");
    out
}

/// The terminal summary.
pub fn summary(plan: &Plan, result: &PlanResult, out_dir: &Path) -> String {
    let t = &result.traffic;
    let mut s = String::new();
    let count = |st: &str| result.outcomes.iter().filter(|o| o.status.name() == st).count();
    let trials: usize = result.outcomes.iter().map(|o| o.trials.len()).sum();
    let requests: u64 = result.outcomes.iter().map(Outcome::simulated_requests).sum();
    let _ = writeln!(s, "pdsim {}: plan {}", env!("CARGO_PKG_VERSION"), plan.base.source());
    let slo = plan.base.slo();
    let bounds: Vec<String> = [("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms), ("E2E", slo.e2e_ms)]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k} <= {v} ms")))
        .collect();
    let _ = writeln!(
        s,
        "question     at most {} GPUs; {} req/s ({} requests a trial); {} for {:.2} % of requests",
        plan.spec.max_gpus,
        f(t.target, 3),
        t.requests,
        bounds.join(", "),
        100.0 * plan.spec.attainment
    );
    let _ = writeln!(
        s,
        "candidates   {} ({} simulated, {} pruned by bounds, {} infeasible); {} trials, {} requests simulated",
        result.outcomes.len(),
        count("simulated"),
        count("pruned"),
        count("infeasible"),
        trials,
        requests
    );
    match result.best.map(|i| &result.outcomes[i]) {
        None => {
            let _ = writeln!(
                s,
                "best         none meets the SLO at {} req/s within {} GPUs",
                f(t.target, 3),
                plan.spec.max_gpus
            );
        }
        Some(b) => {
            let tr = &b.trials[0];
            let _ = writeln!(
                s,
                "best         {} ({}, {} GPUs): attainment {:.2} % at {} req/s, goodput {} req/s per GPU",
                b.candidate.shape.label(),
                mode_name(&b.candidate.shape),
                b.candidate.gpus(),
                100.0 * tr.attainment,
                f(t.target, 3),
                f(tr.goodput / f64::from(b.candidate.gpus()), 3),
            );
            if let (Some(m), Some(g)) = (b.max_rate, b.goodput_per_gpu()) {
                let _ = writeln!(
                    s,
                    "             highest rate meeting the SLO {} req/s ({} req/s per GPU)",
                    f(m, 3),
                    f(g, 3)
                );
            }
            let e = effective(plan, &b.candidate);
            let _ = writeln!(
                s,
                "             candidate #{}: max_num_batched_tokens {}, max_num_seqs {}, router {}, step time {}{}",
                b.candidate.index,
                e.max_num_batched_tokens,
                e.max_num_seqs,
                e.router_policy,
                e.step_time,
                e.link_bandwidth_gb_s.map(|bw| format!(", link {bw} GB/s")).unwrap_or_default()
            );
            let _ = writeln!(
                s,
                "             TTFT p99 {} ms, TPOT p99 {} ms; bottleneck {}",
                f(tr.ttft_p99_ms, 1),
                f(tr.tpot_p99_ms, 2),
                b.bottleneck.unwrap_or("-")
            );
            // The cheapest of each mode, for comparison.
            for mode in ["aggregated", "disaggregated"] {
                let cheapest = result
                    .outcomes
                    .iter()
                    .filter(|o| o.meets && mode_name(&o.candidate.shape) == mode)
                    .min_by(|a, b| {
                        a.candidate.gpus().cmp(&b.candidate.gpus()).then(
                            b.goodput_per_gpu().partial_cmp(&a.goodput_per_gpu()).unwrap_or(std::cmp::Ordering::Equal),
                        )
                    });
                if let Some(o) = cheapest.filter(|o| o.candidate.index != b.candidate.index) {
                    let _ = writeln!(
                        s,
                        "             cheapest {mode}: {} ({} GPUs)",
                        o.candidate.shape.label(),
                        o.candidate.gpus()
                    );
                } else if cheapest.is_none() {
                    let _ = writeln!(s, "             no {mode} candidate meets it");
                }
            }
        }
    }
    if !result.frontier.is_empty() {
        let most = |pick: fn(&Outcome) -> Option<f64>| {
            result
                .frontier
                .iter()
                .map(|&i| &result.outcomes[i])
                .max_by(|a, b| pick(a).unwrap_or(0.0).total_cmp(&pick(b).unwrap_or(0.0)))
                .map(|o| {
                    format!(
                        "#{} {} ({} req/s/GPU at {} tok/s/user)",
                        o.candidate.index,
                        o.candidate.shape.label(),
                        opt(o.goodput_per_gpu(), 3),
                        opt(o.interactivity(), 1)
                    )
                })
                .unwrap_or_default()
        };
        let _ = writeln!(
            s,
            "frontier     {} candidates; most goodput per GPU: {}; most interactive: {}",
            result.frontier.len(),
            most(Outcome::goodput_per_gpu),
            most(Outcome::interactivity)
        );
    }
    if let Some(b) = result.best.map(|i| &result.outcomes[i]) {
        s.push_str("launch       (launch.sh)\n");
        for line in launch_lines(plan, &b.candidate).lines().filter(|l| l.contains("vllm serve") && !l.starts_with('#'))
        {
            let _ = writeln!(s, "  {line}");
        }
    }
    let files = if result.best.is_some() {
        "candidates.csv, best.toml, launch.sh, plan.html"
    } else {
        "candidates.csv, plan.html"
    };
    let _ = writeln!(s, "wrote        {}/{{{files}}}", out_dir.display());
    s
}
