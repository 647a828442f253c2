//! The accuracy table (`pdsim accuracy`): real vLLM serving runs replayed
//! with presets and defaults, predicted against measured.
//!
//! The runs are `validation/`'s (eight runs of vLLM v0.15.1 on H100, its
//! README says where from and how to read them): `measured.csv` has one row
//! per run and stage. Each run is replayed as the real server served it:
//!
//! - the model and GPU presets the run names (`meta-llama/Llama-2-7b-hf` →
//!   `llama-2-7b`, `mistralai/Mixtral-8x7B-v0.1` → `mixtral-8x7b`, on
//!   `h100-sxm`), one aggregated rank at the run's TP size, the run's vLLM
//!   flags (`max_num_batched_tokens`, `max_num_seqs`, `max_model_len`),
//!   vLLM's defaults otherwise (16-token blocks, prefix caching on, 0.9 of
//!   GPU memory), and the default step time: the roofline with its default
//!   factors. Nothing is fitted to the runs.
//! - the requests inference-perf sent (its `loadgen/` and
//!   `datagen/shared_prefix_datagen.py`): a stage's `rate × duration`
//!   requests at random times ([`load_times`]: its `constant` load is a
//!   Poisson process given the count, not one request every `1/rate`
//!   seconds); request `n` of a stage sends entry `n mod (groups × prompts
//!   per group)` of the prompt list, shuffled once for the run
//!   ([`prompt_order`]), prompt `p` being group `p / prompts per group`'s
//!   `system_prompt_len` tokens followed by a question of its own of
//!   `question_len` tokens, so that two prompts of one group share their
//!   system prompt and a prompt sent again is the same prompt; every
//!   request generates `output_len` tokens (`ignore_eos`).
//! - the stages one after another on one server ([`replay_run`]): a stage
//!   starts 2 s after the poll that finds the one before it done
//!   (`next_stage_start`), and meets the prefix cache it left.
//! - each run [`DRAWS`] times, with the arrivals drawn from seeds 1, 2, …:
//!   a point's predicted figures are their medians over the draws, and it
//!   is overloaded when more than half of the draws overload.
//!
//! Measured TPOT is the README's `(E2E mean − TTFT mean) / (output_len −
//! 1)`, and so is the predicted one (the same formula on the simulated
//! means). A point whose real server failed requests (the two `reasoning`
//! runs: requests timed out at 300 s) is *overloaded*: its row says whether
//! the simulation overloads too (the `report.json` overload rule), and it
//! is left out of the mean absolute percentage errors, which are taken over
//! the stable points.

use std::fmt::Write as _;
use std::ops::Range;
use std::path::Path;

use actors::metrics::{Histogram, summarise};
use actors::units::Tokens;
use actors::workload::{ArrivalMode, PrefixIds, RequestSpec, mix};
use rand::Rng;
use rand::seq::SliceRandom;
use sim_core::rng::{ActorRng, stream_for};
use sim_core::{SimDuration, SimTime};

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
    /// The median of each figure over `draws` (the mean of the middle two
    /// for an even count); empty gives zeros.
    fn median(draws: &[Figures]) -> Figures {
        let mid = |f: fn(&Figures) -> f64| {
            let mut v: Vec<f64> = draws.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            match v.len() {
                0 => 0.0,
                n if n % 2 == 1 => v[n / 2],
                n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
            }
        };
        Figures {
            ttft_mean: mid(|f| f.ttft_mean),
            ttft_p90: mid(|f| f.ttft_p90),
            ttft_p99: mid(|f| f.ttft_p99),
            tpot: mid(|f| f.tpot),
            e2e_mean: mid(|f| f.e2e_mean),
            e2e_p99: mid(|f| f.e2e_p99),
            throughput: mid(|f| f.throughput),
        }
    }

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

    /// Requests of the stage: rate × duration, rounded down (as
    /// inference-perf counts them).
    pub fn requests(&self) -> u64 {
        (self.rate_per_s * self.duration_s as f64) as u64
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

/// The arrival times of a stage's requests, from the stage's start, as
/// inference-perf's `constant` load timer (`ConstantLoadTimer` of its
/// `loadgen/load_timer.py`, the same from its March 2025 versions to the
/// runs') makes them: [`StagePoint::requests`] gaps drawn from an
/// exponential of mean `1 / rate`, scaled so that they add up to the
/// stage's duration, request `k` sent after the first `k + 1` of them. The
/// arrivals are therefore those of a Poisson process given how many
/// arrive in the stage, not one every `1 / rate` seconds: what makes the
/// queueing tails. inference-perf draws from an unseeded generator, so the
/// real runs' draws are unknown; the replay draws its own from `rng`.
///
/// The scaling cancels the mean, so each gap is drawn as `−ln(1 − u)` of
/// a uniform `u` in [0, 1), with `libm`'s `log`: the same bits on every
/// machine (`rand_distr`'s exponential calls the platform's `exp` and
/// `log` in its rare branches).
pub fn load_times(p: &StagePoint, rng: &mut ActorRng) -> Vec<SimDuration> {
    let n = p.requests() as usize;
    let gaps: Vec<f64> = (0..n).map(|_| -libm::log(1.0 - rng.random::<f64>())).collect();
    let total: f64 = gaps.iter().sum();
    let scale = if total > 0.0 { p.duration_s as f64 / total } else { 0.0 };
    let mut at = 0.0;
    gaps.iter()
        .map(|g| {
            at += g * scale;
            SimDuration::from_nanos((at * 1e9).round() as u64)
        })
        .collect()
}

/// The order inference-perf's shared-prefix generator sends its prompts
/// in: it makes prompt `p` of group `p / prompts per group`, shuffles the
/// list once (`random.shuffle`), and request `n` of a stage sends entry
/// `n mod len` of it. Entry `k` of the result is the prompt's index.
pub fn prompt_order(p: &StagePoint, rng: &mut ActorRng) -> Vec<u64> {
    let mut order: Vec<u64> = (0..p.num_groups * p.prompts_per_group).collect();
    order.shuffle(rng);
    order
}

/// The requests of a stage point, in arrival order (see the module): the
/// stage's requests arriving `start` plus [`load_times`], request `n`
/// sending prompt `order[n mod order.len()]`.
pub fn requests(
    p: &StagePoint,
    order: &[u64],
    start: SimTime,
    times: Vec<SimDuration>,
) -> impl Iterator<Item = RequestSpec> + use<> {
    let order = order.to_vec();
    let (per_group, system, prompt) = (p.prompts_per_group, p.system_prompt_len, p.system_prompt_len + p.question_len);
    let output = p.output_len;
    times.into_iter().enumerate().map(move |(n, at)| {
        let k = order[n % order.len()];
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
        RequestSpec {
            arrival: start + at,
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

/// The pause inference-perf makes between two stages of a run, after the
/// last request of the first has finished: it polls for that once a
/// second from the time it queued the stage's requests, sleeps the load's
/// `interval` (1 s in every run here), and starts the next stage's timer
/// one second after queuing its requests. So the next stage starts 2 s
/// after the first poll that finds every request finished.
const POLL: SimDuration = SimDuration::from_secs(1);
const STAGE_INTERVAL: SimDuration = SimDuration::from_secs(1);
const QUEUE_LEAD: SimDuration = SimDuration::from_secs(1);

/// When the stage after one that started at `start` starts, its last
/// request having finished at `last` (see [`POLL`]).
fn next_stage_start(start: SimTime, last: SimTime) -> SimTime {
    // The polls run from the queuing, one lead before the start: the one
    // at `start − lead + k × poll` for the least k reaching `last` finds
    // the stage done, and the next stage starts an interval and a lead
    // after it.
    let since_queued = last.saturating_since(start) + QUEUE_LEAD;
    let polls = since_queued.as_nanos().div_ceil(POLL.as_nanos());
    start + SimDuration::from_nanos(polls * POLL.as_nanos()) + STAGE_INTERVAL
}

/// A run's stages simulated (see [`replay_run`]).
struct Simulated {
    scenario: Scenario,
    /// One run holding every stage's requests, in id order.
    output: actors::sim::SimOutput,
    /// Stage `k`'s records: `output.records[stages[k].clone()]`.
    stages: Vec<Range<usize>>,
}

/// The simulation of a run's stages (see [`replay_run`]); `None` for no
/// stages.
fn simulate_run(points: &[StagePoint], seed: u64) -> Result<Option<Simulated>, String> {
    let Some(first) = points.first() else { return Ok(None) };
    for (k, p) in points.iter().enumerate() {
        let same_server = p.model == first.model
            && p.tp == first.tp
            && p.max_num_batched_tokens == first.max_num_batched_tokens
            && p.max_num_seqs == first.max_num_seqs
            && p.max_model_len == first.max_model_len;
        let same_prompts = (p.num_groups, p.prompts_per_group, p.system_prompt_len, p.question_len, p.output_len)
            == (
                first.num_groups,
                first.prompts_per_group,
                first.system_prompt_len,
                first.question_len,
                first.output_len,
            );
        if p.stage as usize != k || !same_server || !same_prompts {
            return Err(format!(
                "{}: the run's rows must be its stages 0, 1, … in order, with one server and one prompt set",
                p.experiment
            ));
        }
    }
    let text = scenario_text(first)?;
    let label = format!("validation:{}", first.experiment);
    let scenario: Scenario = scenario::load_str(&text, &label, Path::new(".")).map_err(|e| e.to_string())?;
    let dep = actors::sim::Deployment::build(scenario.model_spec(), scenario.deployment())
        .map_err(|e| format!("{label}: {e}"))?;
    let order = prompt_order(first, &mut stream_for(seed, "validation/prompts"));
    // Runs of one shape (rate, duration) draw the same arrivals and
    // shuffle for a seed: common random numbers, as a sweep's points.
    let times: Vec<Vec<SimDuration>> = points
        .iter()
        .map(|p| load_times(p, &mut stream_for(seed, &format!("validation/arrival/{}", p.stage))))
        .collect();
    let mut stages = Vec::with_capacity(points.len());
    let mut from = 0;
    for t in &times {
        stages.push(from..from + t.len());
        from += t.len();
    }
    let simulate = |starts: &[SimTime]| {
        let source = starts
            .iter()
            .zip(points)
            .zip(&times)
            .flat_map(|((&start, p), t)| requests(p, &order, start, t.clone()))
            .collect::<Vec<_>>()
            .into_iter();
        let input = actors::sim::RunInput {
            seed,
            source: Box::new(source),
            arrivals: ArrivalMode::Open,
            max_requests: None,
            slo: scenario.slo().clone(),
            until: None,
        };
        actors::sim::run(&dep, input).map_err(|e| format!("{label}: {e}"))
    };
    // Each stage starts when the one before it has finished, so the
    // stages are simulated one more at a time (what came before a stage
    // does not depend on it) and the last run holds them all.
    // (Stage 0 is simulated once per stage: a two-stage run costs about
    // one and a half.)
    let mut starts = vec![SimTime::ZERO];
    let mut output = simulate(&starts)?;
    while starts.len() < points.len() {
        let k = starts.len() - 1;
        let last = output.records[stages[k].clone()].iter().filter_map(|r| r.t.finished).max().unwrap_or(starts[k]);
        starts.push(next_stage_start(starts[k], last));
        output = simulate(&starts)?;
    }
    Ok(Some(Simulated { scenario, output, stages }))
}

/// Replays the stages of one run (`points`, its rows in stage order) as
/// the real server served them: one after another on one server, a
/// stage's requests meeting the prefix cache the stages before it left
/// (see the module).
///
/// # Errors
/// A run whose rows are not its stages 0, 1, … with the same server, or
/// whose scenario the engine refuses, named.
pub fn replay_run(points: &[StagePoint], seed: u64) -> Result<Vec<Replayed>, String> {
    let Some(Simulated { scenario, output, stages }) = simulate_run(points, seed)? else { return Ok(Vec::new()) };
    let mut rows = Vec::with_capacity(points.len());
    for (p, range) in points.iter().zip(stages) {
        let s = summarise(&output.records[range], &Histogram::default(), 0, scenario.slo());
        let predicted = Figures {
            ttft_mean: s.ttft_ms.mean,
            ttft_p90: s.ttft_ms.p90,
            ttft_p99: s.ttft_ms.p99,
            tpot: tpot(s.e2e_ms.mean, s.ttft_ms.mean, p.output_len),
            e2e_mean: s.e2e_ms.mean,
            e2e_p99: s.e2e_ms.p99,
            throughput: s.request_throughput,
        };
        // The overload rule reads the stage's own summary (and the run's
        // ranks and links, to name a bottleneck), not the records.
        let stage_output = actors::sim::SimOutput {
            records: Vec::new(),
            summary: s,
            ranks: output.ranks.clone(),
            links: output.links.clone(),
            violations: Vec::new(),
            ..output
        };
        let run = Run {
            seed,
            requests: None,
            output: stage_output,
            workload: Default::default(),
            wall: std::time::Duration::ZERO,
            interrupted: false,
            sketch_above: None,
        };
        let predicted_overloaded = report::overload(&scenario, &run).overloaded;
        rows.push(Replayed { point: p.clone(), predicted, predicted_overloaded });
    }
    Ok(rows)
}

/// How many draws of the arrivals each run is replayed with by default
/// (seeds 1, 2, …): the table gives the median of each figure over them.
///
/// One draw is one realisation of inference-perf's random arrivals, as
/// the real run was; near a server's limit its tails depend on the draw
/// (Llama-2-7B at 20 req/s: a TTFT p99 from 70 to 781 ms over sixteen
/// single draws). The median is the prediction of one run's figure whose
/// expected absolute error is least, the error the table's MAPE counts;
/// a mean would follow the rare draws whose bursts overrun the server.
/// Sixteen draws put the table's MAPEs within 0.3 points of 32 draws'
/// but TTFT p99's (60.2 % against 57.0 %, from that one point).
pub const DRAWS: u64 = 16;

/// Replays every run of `measured.csv` in `dir` `draws` times (seeds 1
/// to `draws`; [`DRAWS`] is the table's), `jobs` replays at a time, and
/// gives each stage point with the median of its figures over the draws,
/// in the file's order (a run's rows one after another).
///
/// # Errors
/// As [`read_points`] and [`replay_run`].
pub fn replay_dir(dir: &Path, draws: u64, jobs: usize) -> Result<Vec<Replayed>, String> {
    if draws == 0 {
        return Err("draws: expected at least 1".to_owned());
    }
    let points = read_points(&dir.join("measured.csv"))?;
    let mut runs: Vec<&[StagePoint]> = Vec::new();
    let mut rest = &points[..];
    while let Some(first) = rest.first() {
        let n = rest.iter().take_while(|p| p.experiment == first.experiment).count();
        runs.push(&rest[..n]);
        rest = &rest[n..];
    }
    let draws = usize::try_from(draws).map_err(|_| "draws: too many".to_owned())?;
    let mut out: Vec<Replayed> = Vec::with_capacity(points.len());
    // The draws of the run being gathered, by point.
    let mut run: Vec<Vec<Replayed>> = Vec::new();
    crate::runner::ordered_parallel(
        runs.len() * draws,
        jobs,
        |i| replay_run(runs[i / draws], 1 + (i % draws) as u64),
        |i, rows| {
            run.resize_with(rows.len(), Vec::new);
            for (k, r) in rows.into_iter().enumerate() {
                run[k].push(r);
            }
            if i % draws == draws - 1 {
                for mut of_point in run.drain(..) {
                    let figures: Vec<Figures> = of_point.iter().map(|r| r.predicted).collect();
                    let overloading = of_point.iter().filter(|r| r.predicted_overloaded).count();
                    let mut r = of_point.swap_remove(0);
                    r.predicted = Figures::median(&figures);
                    // Overloaded when most draws overload.
                    r.predicted_overloaded = 2 * overloading > draws;
                    out.push(r);
                }
            }
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
        // The identity order, to read prompt indices off request numbers.
        let order: Vec<u64> = (0..100).collect();
        let times = (0..201).map(SimDuration::from_millis).collect();
        let start = SimTime::from_nanos(5);
        let r: Vec<RequestSpec> = requests(&p, &order, start, times).collect();
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
        // Request 3 at the stage's start plus its time: 5 ns + 3 ms.
        assert_eq!(r[3].arrival.as_nanos(), 3_000_005);
        // A shuffled order sends its prompts in that order: entry 0 is
        // prompt 7, so request 0 and request 100 send prompt 7.
        let mut shuffled = order.clone();
        shuffled.swap(0, 7);
        let times = (0..101).map(|_| SimDuration::ZERO).collect();
        let s: Vec<RequestSpec> = requests(&p, &shuffled, SimTime::ZERO, times).collect();
        assert_eq!(s[0].prefix, r[7].prefix);
        assert_eq!(s[100].prefix, r[7].prefix);
        assert_eq!(s[7].prefix, r[0].prefix);
    }

    #[test]
    fn the_prompt_order_is_a_shuffle_of_every_prompt_and_follows_the_seed() {
        let p = point();
        let a = prompt_order(&p, &mut stream_for(1, "validation/prompts"));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<u64>>());
        assert_ne!(a, sorted, "shuffled");
        assert_eq!(a, prompt_order(&p, &mut stream_for(1, "validation/prompts")));
        assert_ne!(a, prompt_order(&p, &mut stream_for(2, "validation/prompts")));
    }

    #[test]
    fn load_times_are_random_gaps_that_fill_the_stage_exactly() {
        // 5 req/s for 600 s: 3,000 arrivals, rising, the last at the
        // stage's end (the gaps are scaled to add up to 600 s).
        let p = point();
        let t = load_times(&p, &mut stream_for(1, "validation/arrival/0"));
        assert_eq!(t.len(), 3000);
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(t[2999], SimDuration::from_secs(600));
        // Not one every 200 ms: exponential gaps of mean 200 ms have a
        // standard deviation of 200 ms too (a constant rate's is 0), and
        // about e^-1 = 37 % of them are longer than their mean.
        let gaps: Vec<f64> = std::iter::once(t[0].as_nanos() as f64)
            .chain(t.windows(2).map(|w| (w[1].as_nanos() - w[0].as_nanos()) as f64))
            .map(|g| g / 1e6)
            .collect();
        let mean = gaps.iter().sum::<f64>() / 3000.0;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / 3000.0).sqrt();
        assert!((mean - 200.0).abs() < 1e-3, "{mean}");
        assert!((sd - 200.0).abs() < 20.0, "{sd}");
        let long = gaps.iter().filter(|&&g| g > 200.0).count() as f64 / 3000.0;
        assert!((long - (-1.0f64).exp()).abs() < 0.03, "{long}");
        // The same stream gives the same times; another seed others.
        assert_eq!(t, load_times(&p, &mut stream_for(1, "validation/arrival/0")));
        assert_ne!(t, load_times(&p, &mut stream_for(2, "validation/arrival/0")));
    }

    #[test]
    fn the_next_stage_starts_two_seconds_after_the_poll_that_finds_the_stage_done() {
        let s = |secs: f64| SimTime::from_nanos((secs * 1e9).round() as u64);
        // A stage starting at 10 s was queued at 9 s and polled at 9, 10,
        // 11, … s; its last request finishing at 612.3 s is found at 613 s,
        // and the next stage starts 1 s (interval) + 1 s (lead) later.
        assert_eq!(next_stage_start(s(10.0), s(612.3)), s(615.0));
        // Finishing on a poll is found on that poll.
        assert_eq!(next_stage_start(s(10.0), s(613.0)), s(615.0));
        // The first stage starts at 0 (queued at -1 s, polled at -1, 0,
        // 1, … s): finishing at 600.5 s is found at 601 s.
        assert_eq!(next_stage_start(SimTime::ZERO, s(600.5)), s(603.0));
    }

    #[test]
    fn a_run_s_second_stage_follows_its_first_on_the_same_server_and_meets_its_cache() {
        // Two stages of 5 req/s for 40 s: 200 requests each, 100 prompts.
        let mut first = point();
        first.duration_s = 40;
        let mut second = first.clone();
        second.stage = 1;
        let points = [first, second];
        let Simulated { output: out, stages, .. } = simulate_run(&points, 1).unwrap().unwrap();
        assert_eq!(out.records.len(), 400);
        assert_eq!(stages, [0..200, 200..400]);
        assert!(out.records.iter().all(|r| r.t.finished.is_some() && r.generated.get() == 247));
        let (one, two) = out.records.split_at(200);
        // The second starts 2 s after the poll (once a second from 1 s
        // before the first's start at 0) that finds the first done; its
        // first request arrives its first gap later.
        let last = one.iter().filter_map(|r| r.t.finished).max().unwrap();
        let polled = last.as_nanos().div_ceil(1_000_000_000) * 1_000_000_000;
        let first_gap = load_times(&points[1], &mut stream_for(1, "validation/arrival/1"))[0];
        assert_eq!(two[0].t.arrival.as_nanos(), polled + 2_000_000_000 + first_gap.as_nanos());
        // The first stage's first request sees a cold cache; every request
        // of the second finds its whole prompt cached but the last,
        // partial block (566 tokens: 35 whole blocks of 16 = 560).
        assert_eq!(one[0].prefill_hit.get(), 0);
        assert!(two.iter().all(|r| r.prefill_hit.get() == 560), "{:?}", two.iter().map(|r| r.prefill_hit.get()).min());
        // The replay gives one row per stage, the second's TTFT p99 that of
        // a warm server: below the first's, which pays the cold prefills.
        let rows = replay_run(&points, 1).unwrap();
        assert_eq!(rows.len(), 2);
        assert!(rows[1].predicted.ttft_p99 < rows[0].predicted.ttft_p99);
        // Rows that are not a run's stages in order are refused, named.
        let e = replay_run(&[points[1].clone(), points[0].clone()], 1).unwrap_err();
        assert!(e.contains("llama-2-7b-tp1-codegen: the run's rows must be its stages 0, 1,"), "{e}");
    }

    #[test]
    fn the_median_of_draws_is_taken_figure_by_figure() {
        let f = |x: f64| Figures { ttft_p99: x, throughput: 10.0 - x, ..Figures::default() };
        // Odd: the middle one, whatever the order.
        let m = Figures::median(&[f(3.0), f(100.0), f(1.0)]);
        assert_eq!((m.ttft_p99, m.throughput), (3.0, 7.0));
        // Even: the mean of the middle two; one draw far out moves it
        // no more than any other above the middle would.
        let m = Figures::median(&[f(1.0), f(2.0), f(4.0), f(1000.0)]);
        assert_eq!((m.ttft_p99, m.throughput), (3.0, 7.0));
        assert_eq!(Figures::median(&[]), Figures::default());
    }

    #[test]
    fn a_bad_cell_is_named() {
        let e = parse_points("m.csv", "experiment\nx\n").unwrap_err();
        assert_eq!(e, "m.csv:1: no `model` column");
    }
}
