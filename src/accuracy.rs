//! The accuracy table (`pdsim accuracy`): real vLLM serving runs replayed
//! with presets and defaults, predicted against measured.
//!
//! The runs are `validation/`'s (eight runs of vLLM v0.15.1 on H100, its
//! README says where from and how to read them): `measured.csv` has one row
//! per run and stage. Each stage point is replayed on its own, as the real
//! server served it:
//!
//! - the model and GPU presets the run names (`meta-llama/Llama-2-7b-hf` →
//!   `llama-2-7b`, `mistralai/Mixtral-8x7B-v0.1` → `mixtral-8x7b`, on
//!   `h100-sxm`), one aggregated rank at the run's TP size, the run's vLLM
//!   flags (`max_num_batched_tokens`, `max_num_seqs`, `max_model_len`),
//!   vLLM's defaults otherwise (16-token blocks, prefix caching on, 0.9 of
//!   GPU memory), and the default step time: the roofline with its default
//!   factors. Nothing is fitted to the runs.
//! - the requests inference-perf sent: `rate × duration` of them, one every
//!   `1/rate` seconds from 0; request `i` sends prompt `i mod (groups ×
//!   prompts per group)`, prompt `p` being group `p / prompts per group`'s
//!   `system_prompt_len` tokens followed by a question of its own of
//!   `question_len` tokens, so that two prompts of one group share their
//!   system prompt and a prompt sent again is the same prompt (its
//!   `shared_prefix_datagen.py`); every request generates `output_len`
//!   tokens (`ignore_eos`).
//!
//! Measured TPOT is the README's `(E2E mean − TTFT mean) / (output_len −
//! 1)`, and so is the predicted one (the same formula on the simulated
//! means). A point whose real server failed requests (the two `reasoning`
//! runs: requests timed out at 300 s) is *overloaded*: its row says whether
//! the simulation overloads too (the `report.json` overload rule), and it
//! is left out of the mean absolute percentage errors, which are taken over
//! the stable points.

use std::fmt::Write as _;
use std::path::Path;

use actors::units::Tokens;
use actors::workload::{ArrivalMode, PrefixIds, RequestSpec, mix};
use sim_core::SimTime;

use crate::files;
use crate::report;
use crate::runner::Run;
use crate::scenario::{self, Scenario};

/// The measured figures of one stage point, or their predictions (ms,
/// requests per second).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    /// TTFT mean, ms.
    pub ttft_mean: f64,
    /// TTFT 90th percentile, ms.
    pub ttft_p90: f64,
    /// TTFT 99th percentile, ms.
    pub ttft_p99: f64,
    /// TPOT, ms: (E2E mean − TTFT mean) / (output tokens − 1).
    pub tpot: f64,
    /// E2E mean, ms.
    pub e2e_mean: f64,
    /// E2E 99th percentile, ms.
    pub e2e_p99: f64,
    /// Completed requests per second.
    pub throughput: f64,
}

impl Figures {
    /// The figures in table order, with their names.
    pub fn named(&self) -> [(&'static str, f64); 7] {
        [
            ("TTFT mean", self.ttft_mean),
            ("TTFT p90", self.ttft_p90),
            ("TTFT p99", self.ttft_p99),
            ("TPOT", self.tpot),
            ("E2E mean", self.e2e_mean),
            ("E2E p99", self.e2e_p99),
            ("throughput", self.throughput),
        ]
    }
}

/// One stage of one real run: how it was served and what was measured.
#[derive(Clone, Debug, PartialEq)]
pub struct StagePoint {
    /// The run's folder name under `validation/runs/`.
    pub experiment: String,
    /// The HuggingFace model id.
    pub model: String,
    /// Tensor-parallel size.
    pub tp: u32,
    /// vLLM's `--max-num-batched-tokens`.
    pub max_num_batched_tokens: u64,
    /// vLLM's `--max-num-seqs`.
    pub max_num_seqs: u32,
    /// vLLM's `--max-model-len`.
    pub max_model_len: u64,
    /// The stage's index.
    pub stage: u32,
    /// Requests per second, constant.
    pub rate_per_s: f64,
    /// The stage's length, s.
    pub duration_s: u64,
    /// Shared-prefix groups.
    pub num_groups: u64,
    /// Prompts of each group.
    pub prompts_per_group: u64,
    /// Tokens of a group's system prompt.
    pub system_prompt_len: u64,
    /// Tokens of a prompt's own question.
    pub question_len: u64,
    /// Tokens each request generates.
    pub output_len: u64,
    /// Requests the real server failed (timed out).
    pub failures: u64,
    /// What was measured.
    pub measured: Figures,
}

impl StagePoint {
    /// The real server failed requests: the point is overloaded.
    pub fn overloaded(&self) -> bool {
        self.failures > 0
    }

    /// Requests of the stage: rate × duration.
    pub fn requests(&self) -> u64 {
        (self.rate_per_s * self.duration_s as f64).round() as u64
    }

    /// A short label: `llama-2-7b-tp1-codegen/0`.
    pub fn label(&self) -> String {
        // The folder name after its date and time stamps.
        let name = self.experiment.splitn(3, '-').nth(2).unwrap_or(&self.experiment);
        format!("{name}/{}", self.stage)
    }
}

/// The model preset standing for a run's HuggingFace id.
pub fn preset_of(model: &str) -> Option<&'static str> {
    match model {
        "meta-llama/Llama-2-7b-hf" => Some("llama-2-7b"),
        "meta-llama/Llama-2-70b-hf" => Some("llama-2-70b"),
        "mistralai/Mixtral-8x7B-v0.1" => Some("mixtral-8x7b"),
        "codellama/CodeLlama-34b-Instruct-hf" | "codellama/CodeLlama-34b-hf" => Some("codellama-34b"),
        _ => None,
    }
}

/// The columns of `measured.csv` the replay reads.
const COLUMNS: [&str; 23] = [
    "experiment",
    "model",
    "tp",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "stage",
    "rate_per_s",
    "duration_s",
    "num_groups",
    "num_prompts_per_group",
    "system_prompt_len",
    "question_len",
    "output_len",
    "failures",
    "ttft_mean",
    "ttft_p90",
    "ttft_p99",
    "e2e_mean",
    "e2e_p99",
    "requests_per_s",
    "successes",
    "prompt_len_mean",
];

/// Reads `measured.csv` (`path`): one [`StagePoint`] per row.
///
/// # Errors
/// One line naming the file, and the line and column of a bad cell.
pub fn read_points(path: &Path) -> Result<Vec<StagePoint>, String> {
    let text = files::read_text(path, 1 << 20).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_points(&path.display().to_string(), &text)
}

/// [`read_points`] of `text`, named `file` in errors.
///
/// # Errors
/// As [`read_points`].
pub fn parse_points(file: &str, text: &str) -> Result<Vec<StagePoint>, String> {
    let mut lines = text.lines().enumerate();
    let (_, header) = lines.next().ok_or_else(|| format!("{file}: empty, expected a header"))?;
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    let mut at = [0usize; COLUMNS.len()];
    for (k, col) in COLUMNS.iter().enumerate() {
        at[k] = names.iter().position(|n| n == col).ok_or_else(|| format!("{file}:1: no `{col}` column"))?;
    }
    let mut out = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let cell = |k: usize| -> Result<&str, String> {
            cells.get(at[k]).copied().ok_or_else(|| format!("{file}:{}: no `{}` cell", i + 1, COLUMNS[k]))
        };
        let num = |k: usize| -> Result<f64, String> {
            let c = cell(k)?;
            c.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("{file}:{}: {}: expected a number >= 0, got {c:?}", i + 1, COLUMNS[k]))
        };
        let int = |k: usize| -> Result<u64, String> {
            let c = cell(k)?;
            c.parse::<u64>()
                .map_err(|_| format!("{file}:{}: {}: expected a whole number, got {c:?}", i + 1, COLUMNS[k]))
        };
        let small = |k: usize| -> Result<u32, String> {
            u32::try_from(int(k)?).map_err(|_| format!("{file}:{}: {}: too large", i + 1, COLUMNS[k]))
        };
        let output_len = int(13)?;
        let (ttft_mean, e2e_mean) = (num(15)?, num(18)?);
        let p = StagePoint {
            experiment: cell(0)?.to_owned(),
            model: cell(1)?.to_owned(),
            tp: small(2)?,
            max_num_batched_tokens: int(3)?,
            max_num_seqs: small(4)?,
            max_model_len: int(5)?,
            stage: small(6)?,
            rate_per_s: num(7)?,
            duration_s: int(8)?,
            num_groups: int(9)?,
            prompts_per_group: int(10)?,
            system_prompt_len: int(11)?,
            question_len: int(12)?,
            output_len,
            failures: int(14)?,
            measured: Figures {
                ttft_mean,
                ttft_p90: num(16)?,
                ttft_p99: num(17)?,
                tpot: tpot(e2e_mean, ttft_mean, output_len),
                e2e_mean,
                e2e_p99: num(19)?,
                throughput: num(20)?,
            },
        };
        if p.rate_per_s <= 0.0 || p.num_groups == 0 || p.prompts_per_group == 0 || p.output_len < 2 {
            return Err(format!(
                "{file}:{}: a stage needs a rate > 0, groups and prompts >= 1 and output_len >= 2",
                i + 1
            ));
        }
        if p.system_prompt_len + p.question_len == 0 {
            return Err(format!("{file}:{}: a prompt needs tokens (system_prompt_len + question_len)", i + 1));
        }
        out.push(p);
    }
    Ok(out)
}

/// (E2E mean − TTFT mean) / (output tokens − 1), ms.
fn tpot(e2e_mean: f64, ttft_mean: f64, output: u64) -> f64 {
    (e2e_mean - ttft_mean) / (output.saturating_sub(1).max(1)) as f64
}

/// The scenario a stage point is replayed on (its workload is replaced by
/// [`requests`]).
pub fn scenario_text(p: &StagePoint) -> Result<String, String> {
    let preset = preset_of(&p.model).ok_or_else(|| format!("{}: no model preset for {:?}", p.experiment, p.model))?;
    Ok(format!(
        "name = \"validation-{label}\"\n\
         description = \"{model} on one H100 at TP {tp}, as the real run served it\"\n\
         seed = 1\n\n\
         [model]\npreset = \"{preset}\"\n\n\
         [hardware]\ngpu = \"h100-sxm\"\n\n\
         [aggregated]\ncount = 1\ntp = {tp}\nmax_num_batched_tokens = {mnbt}\nmax_num_seqs = {mns}\n\
         max_model_len = {mml}\nblock_size_tokens = 16\nstep_time = {{ kind = \"roofline\" }}\n\n\
         [workload]\nrequests = {n}\narrival = {{ kind = \"poisson\", rate_per_s = {rate} }}\n\
         prompt_tokens = {{ kind = \"fixed\", value = {prompt} }}\n\
         output_tokens = {{ kind = \"fixed\", value = {out} }}\n",
        label = p.label().replace('/', "-"),
        model = p.model,
        tp = p.tp,
        mnbt = p.max_num_batched_tokens,
        mns = p.max_num_seqs,
        mml = p.max_model_len,
        n = p.requests(),
        rate = p.rate_per_s,
        prompt = p.system_prompt_len + p.question_len,
        out = p.output_len,
    ))
}

/// Tokens one prefix id covers: vLLM's block size.
const PREFIX_BLOCK_TOKENS: u64 = 16;
/// Salts that keep a group's ids apart from a prompt's.
const GROUP_SALT: u64 = 0x5eed_0000_0000_0001;
const PROMPT_SALT: u64 = 0x5eed_0000_0000_0002;

/// The requests of a stage point, in arrival order (see the module).
pub fn requests(p: &StagePoint) -> impl Iterator<Item = RequestSpec> + use<> {
    let prompts = p.num_groups * p.prompts_per_group;
    let (per_group, system, prompt) = (p.prompts_per_group, p.system_prompt_len, p.system_prompt_len + p.question_len);
    let (rate, output) = (p.rate_per_s, p.output_len);
    (0..p.requests()).map(move |i| {
        let k = i % prompts;
        let group = k / per_group;
        // Block j's id names the prompt through the end of block j: the
        // group's while the block ends inside the system prompt, the
        // prompt's own from the block holding its first question token.
        let ids = (0..prompt.div_ceil(PREFIX_BLOCK_TOKENS))
            .map(|j| {
                let end = ((j + 1) * PREFIX_BLOCK_TOKENS).min(prompt);
                if end <= system { mix(mix(GROUP_SALT, group), j) } else { mix(mix(PROMPT_SALT, k), j) }
            })
            .collect();
        // Constant rate: request i at i / rate, in whole nanoseconds.
        let arrival = SimTime::from_nanos((i as f64 * 1e9 / rate).round() as u64);
        RequestSpec {
            arrival,
            prompt: Tokens::new(prompt),
            output: Tokens::new(output),
            prefix: PrefixIds { block_tokens: Tokens::new(PREFIX_BLOCK_TOKENS), ids },
            priority: 0,
        }
    })
}

/// One replayed stage point.
#[derive(Clone, Debug, PartialEq)]
pub struct Replayed {
    /// The point, with what was measured.
    pub point: StagePoint,
    /// What the simulation gives.
    pub predicted: Figures,
    /// The simulation overloads ([`report::overload`]).
    pub predicted_overloaded: bool,
}

/// Replays one stage point (see the module).
///
/// # Errors
/// A point whose scenario the engine refuses, named.
pub fn replay(p: &StagePoint) -> Result<Replayed, String> {
    let text = scenario_text(p)?;
    let label = format!("validation:{}", p.label());
    let scenario: Scenario = scenario::load_str(&text, &label, Path::new(".")).map_err(|e| e.to_string())?;
    let dep = actors::sim::Deployment::build(scenario.model_spec(), scenario.deployment())
        .map_err(|e| format!("{label}: {e}"))?;
    let input = actors::sim::RunInput {
        seed: scenario.seed(),
        source: Box::new(requests(p)),
        arrivals: ArrivalMode::Open,
        max_requests: None,
        slo: scenario.slo().clone(),
        until: None,
    };
    let output = actors::sim::run(&dep, input).map_err(|e| format!("{label}: {e}"))?;
    let s = &output.summary;
    let predicted = Figures {
        ttft_mean: s.ttft_ms.mean,
        ttft_p90: s.ttft_ms.p90,
        ttft_p99: s.ttft_ms.p99,
        tpot: tpot(s.e2e_ms.mean, s.ttft_ms.mean, p.output_len),
        e2e_mean: s.e2e_ms.mean,
        e2e_p99: s.e2e_ms.p99,
        throughput: s.request_throughput,
    };
    let run = Run {
        seed: scenario.seed(),
        requests: None,
        output,
        workload: Default::default(),
        wall: std::time::Duration::ZERO,
        interrupted: false,
        sketch_above: None,
    };
    let predicted_overloaded = report::overload(&scenario, &run).overloaded;
    Ok(Replayed { point: p.clone(), predicted, predicted_overloaded })
}

/// Replays every point of `measured.csv` in `dir`, `jobs` at a time, in
/// the file's order.
///
/// # Errors
/// As [`read_points`] and [`replay`].
pub fn replay_dir(dir: &Path, jobs: usize) -> Result<Vec<Replayed>, String> {
    let points = read_points(&dir.join("measured.csv"))?;
    let mut out = Vec::with_capacity(points.len());
    crate::runner::ordered_parallel(
        points.len(),
        jobs,
        |i| replay(&points[i]),
        |_, r| {
            out.push(r);
            Ok(())
        },
    )?;
    Ok(out)
}

/// |predicted − measured| / measured, in per cent (signed: predicted
/// above measured is positive).
fn error_pct(predicted: f64, measured: f64) -> f64 {
    (predicted - measured) / measured * 100.0
}

/// The mean absolute percentage error of each figure over the stable
/// points (those the real server did not overload), in [`Figures::named`]
/// order; `None` without a stable point.
pub fn mape(rows: &[Replayed]) -> Option<[f64; 7]> {
    let stable: Vec<&Replayed> = rows.iter().filter(|r| !r.point.overloaded()).collect();
    if stable.is_empty() {
        return None;
    }
    let mut sum = [0.0; 7];
    for r in &stable {
        for (k, ((_, pred), (_, meas))) in r.predicted.named().iter().zip(r.point.measured.named()).enumerate() {
            sum[k] += error_pct(*pred, meas).abs();
        }
    }
    Some(sum.map(|s| s / stable.len() as f64))
}

/// The table as Markdown: one row per stage point, predicted / measured
/// and the signed error of each figure, then the MAPE row.
pub fn table(rows: &[Replayed]) -> String {
    let mut out = String::new();
    let names = Figures::default().named().map(|(n, _)| n);
    let _ = write!(out, "| point | rate |");
    for n in names {
        let unit = if n == "throughput" { "req/s" } else { "ms" };
        let _ = write!(out, " {n} ({unit}) |");
    }
    out.push_str(" overloaded |\n|---|---:|");
    for _ in names {
        out.push_str("---:|");
    }
    out.push_str("---|\n");
    for r in rows {
        let p = &r.point;
        let _ = write!(out, "| {} | {} |", p.label(), p.rate_per_s);
        for ((_, pred), (_, meas)) in r.predicted.named().iter().zip(p.measured.named()) {
            if p.overloaded() {
                let _ = write!(out, " {} / {} |", fmt(*pred), fmt(meas));
            } else {
                let _ = write!(out, " {} / {} ({:+.1} %) |", fmt(*pred), fmt(meas), error_pct(*pred, meas));
            }
        }
        let yes = |b: bool| if b { "yes" } else { "no" };
        let _ = writeln!(out, " {} / {} |", yes(r.predicted_overloaded), yes(p.overloaded()));
    }
    if let Some(m) = mape(rows) {
        let stable = rows.iter().filter(|r| !r.point.overloaded()).count();
        let _ = write!(out, "| **MAPE** ({stable} stable points) | |");
        for v in m {
            let _ = write!(out, " **{v:.1} %** |");
        }
        out.push_str(" |\n");
    }
    out
}

/// A figure as printed: three significant digits past the point for small
/// values, whole numbers from 1,000 on.
fn fmt(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point() -> StagePoint {
        let csv = "experiment,model,tp,max_num_batched_tokens,max_num_seqs,max_model_len,stage,rate_per_s,\
                   duration_s,num_groups,num_prompts_per_group,system_prompt_len,question_len,output_len,\
                   prompt_len_mean,successes,failures,ttft_mean,ttft_p50,ttft_p90,ttft_p99,e2e_mean,e2e_p50,\
                   e2e_p90,e2e_p99,requests_per_s\n\
                   20260217-155451-llama-2-7b-tp1-codegen,meta-llama/Llama-2-7b-hf,1,2048,128,4096,0,5.0,600,\
                   10,10,100,466,247,591.63,3000,0,25.037,24.261,28.373,45.97,1810.322,1796.575,1940.095,\
                   2188.828,4.9868\n";
        parse_points("m.csv", csv).unwrap().remove(0)
    }

    #[test]
    fn a_row_reads_with_its_tpot_as_the_readme_defines_it() {
        let p = point();
        assert_eq!(p.label(), "llama-2-7b-tp1-codegen/0");
        assert_eq!(p.requests(), 3000);
        // (1,810.322 − 25.037) / 246 = 7.25725… ms.
        assert!((p.measured.tpot - 1785.285 / 246.0).abs() < 1e-12);
        assert!(!p.overloaded());
    }

    #[test]
    fn prompts_repeat_every_hundred_and_share_their_group_s_system_prompt() {
        let p = point();
        let r: Vec<RequestSpec> = requests(&p).take(201).collect();
        // 566 tokens: 36 blocks of 16 (the last of 6 tokens); the system
        // prompt's 100 tokens fill 6 whole blocks.
        assert_eq!(r[0].prompt.get(), 566);
        assert_eq!(r[0].prefix.ids.len(), 36);
        // Prompts 0 and 1 (group 0) share 6 blocks, then differ.
        assert_eq!(r[0].prefix.ids[..6], r[1].prefix.ids[..6]);
        assert_ne!(r[0].prefix.ids[6], r[1].prefix.ids[6]);
        // Prompt 10 is group 1's: nothing shared with prompt 0.
        assert_ne!(r[0].prefix.ids[0], r[10].prefix.ids[0]);
        // Request 100 and 200 send prompt 0 again.
        assert_eq!(r[100].prefix, r[0].prefix);
        assert_eq!(r[200].prefix, r[0].prefix);
        // One every 200 ms.
        assert_eq!(r[3].arrival.as_nanos(), 600_000_000);
    }

    #[test]
    fn a_bad_cell_is_named() {
        let e = parse_points("m.csv", "experiment\nx\n").unwrap_err();
        assert_eq!(e, "m.csv:1: no `model` column");
    }
}
