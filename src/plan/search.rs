//! Pricing the candidates: analytic bounds first, then trials.
//!
//! **The traffic.** Every trial serves the same requests (the workload's
//! first `n`, drawn with the scenario's seed, or the trace's first rows);
//! only the rate changes: a Poisson or gamma workload's `rate_per_s` (its
//! gaps are drawn from their own stream, so they scale exactly), a
//! trace's `time_scale` (its arrivals scaled, its rows the same).
//!
//! **Bounds.** A rate above what a candidate's busiest role can do at
//! best cannot meet the SLO for long, so a candidate whose bound is below
//! the target is not simulated ("pruned"). Per rank, with the role's own
//! step-time model (as a run builds it):
//! - prefill: `M / t(M)` tokens per second, `t(M)` the time of a step
//!   of `M = max_num_batched_tokens` tokens made of prompts of the mean
//!   uncached length (what an unbounded prefix cache would leave), over
//!   that length per request; an aggregated rank's requests also bring
//!   their output tokens (each a token of some step);
//! - decode: `S / t(S)` tokens per second, `t(S)` the time of a step of
//!   `S = max_num_seqs` sequences each holding the mean prompt, over the
//!   mean output less one per request;
//! - link (P/D): the links' bandwidth (one per prefill/decode pair, or one
//!   shared) over the mean handoff bytes.
//!
//! The bound is the least of the roles' (ranks × per rank). It counts no
//! queueing, no KV limit and no attention over generated tokens, so it
//! lies above what the candidate serves.
//!
//! **Trials.** A trial runs the candidate's scenario at one rate and
//! passes when the share of requests meeting every `[slo]` bound is at
//! least `attainment`. It stops as soon as more requests have missed than
//! the attainment allows (records arrive as requests end, and a miss is
//! final), which decides it exactly and makes failing trials cheap.
//!
//! **Bisection** (`search = "max_rate"`): first the target rate; from a
//! pass, up (to 0.9 of the bound, then the bound, or four times the last
//! pass, whichever is less; doubling past the bound) until a trial fails; from a failure,
//! down by halves until one passes (after two failures, one trial at
//! 1/64 of the target first: a candidate that fails there meets the SLO
//! at no rate worth naming, and is done); then
//! geometric bisection until the lowest failing and highest passing rates
//! are within `rate_tolerance`. Each rate is simulated once. Attainment
//! is taken to fall as the rate rises; the highest passing rate found is
//! one that passed. The answer of each candidate depends only on the
//! candidate, so it is the same whatever the number of threads.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use actors::metrics::meets_slo;
use actors::model::Role;
use actors::sim::Deployment;
use actors::steptime::{BatchShape, StepTimeModel};
use actors::units::Tokens;
use actors::workload::RequestSource;

use super::space::{self, Candidate};
use super::{DEFAULT_MAX_TRIAL_REQUESTS, Plan, SearchMode};
use crate::runner::{self, Keep, RunError};
use crate::scenario::Scenario;
use crate::workload::ArrivalSpec;

/// Where the bisection tries first above a pass: this share of the bound.
const NEAR_BOUND: f64 = 0.9;

/// The traffic every trial serves, as measured once.
#[derive(Clone, Debug)]
pub struct Traffic {
    /// Requests per trial.
    pub requests: u64,
    /// The workload's own rate (a trace's: arrivals after the first over
    /// the time from the first to the last, at its `time_scale`).
    pub own_rate: f64,
    /// The target rate: `[plan] rate_per_s`, else `own_rate`.
    pub target: f64,
    /// Mean prompt tokens.
    pub mean_prompt: f64,
    /// Mean output tokens.
    pub mean_output: f64,
    /// Mean prompt tokens an unbounded prefix cache would not hold.
    pub mean_uncached: f64,
    /// Every prompt length (for the handoff bytes).
    prompts: Vec<u64>,
}

/// Reads the traffic of `plan`: its first requests, once.
///
/// # Errors
/// The workload cannot be read (a trace row refused), or it has no
/// request, or its arrivals are all at one instant.
pub fn traffic(plan: &Plan) -> Result<Traffic, String> {
    let w = plan.base.workload();
    let requests = match plan.spec.requests {
        Some(n) => n,
        None => w.requests().map_or(DEFAULT_MAX_TRIAL_REQUESTS, |n| n.min(DEFAULT_MAX_TRIAL_REQUESTS)),
    };
    let mut source = w.source(plan.base.seed(), Some(requests)).map_err(|e| e.0)?;
    source.set_file(plan.base.source());
    let (mut n, mut prompt, mut output, mut uncached) = (0u64, 0u128, 0u128, 0u128);
    let (mut first, mut last) = (None, None);
    let mut seen = std::collections::HashSet::new();
    let mut prompts = Vec::new();
    while let Some(r) = source.next_request().map_err(|e| e.0)? {
        n += 1;
        prompt += u128::from(r.prompt.get());
        output += u128::from(r.output.get());
        prompts.push(r.prompt.get());
        first.get_or_insert(r.arrival);
        last = Some(r.arrival);
        // The leading ids already seen are what a cache could hold (it
        // never serves the last token).
        let block = r.prefix.block_tokens.get();
        let mut hit = 0u64;
        let mut leading = true;
        for &id in &r.prefix.ids {
            let new = seen.insert(id);
            if leading && !new {
                hit += block;
            } else {
                leading = false;
            }
        }
        uncached += u128::from(r.prompt.get() - hit.min(r.prompt.get().saturating_sub(1)));
    }
    if n == 0 {
        return Err(format!("{}: workload: has no request to plan with", plan.base.source()));
    }
    let own_rate = match w.arrival.as_ref() {
        Some(ArrivalSpec::Poisson { rate_per_s } | ArrivalSpec::Gamma { rate_per_s, .. }) => *rate_per_s,
        _ => match (first, last) {
            (Some(a), Some(b)) if b > a && n >= 2 => (n - 1) as f64 / b.saturating_since(a).as_secs_f64(),
            _ => {
                return Err(format!(
                    "{}: workload.trace: its first {n} requests arrive at one instant, so they have no rate to scale",
                    plan.base.source()
                ));
            }
        },
    };
    let nf = n as f64;
    Ok(Traffic {
        requests: n,
        own_rate,
        target: plan.spec.rate_per_s.unwrap_or(own_rate),
        mean_prompt: prompt as f64 / nf,
        mean_output: output as f64 / nf,
        mean_uncached: uncached as f64 / nf,
        prompts,
    })
}

impl Traffic {
    /// Edits a scenario table to serve these requests at `rate`.
    pub fn set_rate(&self, base: &Scenario, table: &mut toml::Table, rate: f64) -> Result<(), String> {
        space::set(table, "workload.requests", toml::Value::Integer(self.requests as i64))?;
        match base.workload().arrival.as_ref() {
            Some(ArrivalSpec::Poisson { .. } | ArrivalSpec::Gamma { .. }) => {
                space::set(table, "workload.arrival.rate_per_s", toml::Value::Float(rate))
            }
            _ => {
                let scale = base.workload().trace.as_ref().map_or(1.0, |t| t.time_scale);
                space::set(table, "workload.trace.time_scale", toml::Value::Float(scale * self.own_rate / rate))
            }
        }
    }

    /// Most requests that may miss the SLO in a trial that passes.
    pub fn allowed_misses(&self, attainment: f64) -> u64 {
        let n = self.requests;
        let passes = |m: u64| (n - m) as f64 / n as f64 >= attainment;
        let mut m = ((1.0 - attainment) * n as f64).floor().clamp(0.0, n as f64) as u64;
        while m > 0 && !passes(m) {
            m -= 1;
        }
        while m < n && passes(m + 1) {
            m += 1;
        }
        m
    }
}

/// The highest rate a candidate could sustain, and the role that sets it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bound {
    /// Requests per second.
    pub rate: f64,
    /// `prefill`, `decode`, `aggregated` or `link`.
    pub role: &'static str,
}

/// Seconds of a step of `shape` under `model`.
fn secs(model: &dyn StepTimeModel, shape: &BatchShape) -> f64 {
    model.step_time(shape).as_secs_f64()
}

/// Prefill tokens per second of one rank: a step of `budget` tokens made
/// of chunks of `chunk` tokens, nothing cached.
fn prefill_tokens_per_s(model: &dyn StepTimeModel, budget: u64, chunk: u64) -> f64 {
    let chunk = chunk.clamp(1, budget.max(1));
    let mut shape = BatchShape::default();
    shape.add_many(budget / chunk, chunk, 0, false);
    if !budget.is_multiple_of(chunk) {
        shape.add(budget % chunk, 0, false);
    }
    budget as f64 / secs(model, &shape).max(1e-12)
}

/// Decode tokens per second of one rank: `seqs` sequences each holding
/// `context` tokens.
fn decode_tokens_per_s(model: &dyn StepTimeModel, seqs: u64, context: u64) -> f64 {
    let shape = BatchShape::decoding(seqs, seqs.saturating_mul(context));
    seqs as f64 / secs(model, &shape).max(1e-12)
}

/// The bound of a candidate's scenario (see the module documentation).
pub fn bound(s: &Scenario, t: &Traffic) -> Result<Bound, String> {
    let dep = Deployment::build(s.model_spec(), s.deployment()).map_err(|e| e.to_string())?;
    let d = s.deployment();
    let caching = |r: &actors::config::RoleSpec| if r.prefix_caching { t.mean_uncached } else { t.mean_prompt };
    let decode_tokens = (t.mean_output - 1.0).max(1.0);
    let context = t.mean_prompt.round() as u64;
    let mut bounds: Vec<Bound> = Vec::new();
    let model = |role: Role| dep.step_time_for(role).ok_or_else(|| format!("no {} role", role.as_str()));
    if let Some(r) = &d.aggregated {
        let m = model(Role::Aggregated)?;
        let per_request = caching(r) + decode_tokens;
        let chunk = caching(r).round() as u64;
        let ranks = f64::from(r.count);
        let prefill = prefill_tokens_per_s(m.as_ref(), r.max_num_batched_tokens, chunk) / per_request;
        let decode = decode_tokens_per_s(m.as_ref(), u64::from(r.max_num_seqs), context) / decode_tokens;
        bounds.push(Bound { rate: ranks * prefill.min(decode), role: "aggregated" });
    }
    if let (Some(p), Some(dr)) = (&d.prefill, &d.decode) {
        let mp = model(Role::Prefill)?;
        let chunk = caching(p).round() as u64;
        let prefill = prefill_tokens_per_s(mp.as_ref(), p.max_num_batched_tokens, chunk) / caching(p).max(1.0);
        bounds.push(Bound { rate: f64::from(p.count) * prefill, role: "prefill" });
        let md = model(Role::Decode)?;
        let decode = decode_tokens_per_s(md.as_ref(), u64::from(dr.max_num_seqs), context) / decode_tokens;
        bounds.push(Bound { rate: f64::from(dr.count) * decode, role: "decode" });
        let mut bytes = 0u128;
        for &prompt in &t.prompts {
            let size = actors::rules::handoff_size(dep.model(), Tokens::new(prompt), Tokens::new(0))
                .map_err(|e| e.to_string())?;
            bytes += u128::from(size.bytes.get());
        }
        let mean_bytes = bytes as f64 / t.prompts.len().max(1) as f64;
        if mean_bytes > 0.0 {
            let links = match d.link.topology {
                actors::config::LinkTopology::PerPair => f64::from(p.count) * f64::from(dr.count),
                actors::config::LinkTopology::Shared => 1.0,
            };
            let rate = links * d.link.bandwidth_gb_s * 1e9 / mean_bytes;
            bounds.push(Bound { rate, role: "link" });
        }
    }
    bounds
        .into_iter()
        .fold(None, |best: Option<Bound>, b| match best {
            Some(x) if x.rate <= b.rate => Some(x),
            _ => Some(b),
        })
        .ok_or_else(|| "the scenario has no role".to_owned())
}

/// One simulation of a candidate at one rate.
#[derive(Clone, Debug, PartialEq)]
pub struct Trial {
    /// Requests per second offered.
    pub rate: f64,
    /// The share of requests meeting the SLO reached `attainment`.
    pub pass: bool,
    /// The trial stopped once too many requests had missed.
    pub stopped_early: bool,
    /// The share of requests that met every bound (of those that entered,
    /// for a trial stopped early).
    pub attainment: f64,
    /// Requests meeting every bound per second.
    pub goodput: f64,
    /// Output tokens of completed requests per second.
    pub output_tokens_per_s: f64,
    /// TTFT p99, ms.
    pub ttft_p99_ms: f64,
    /// TPOT p99, ms.
    pub tpot_p99_ms: f64,
    /// TPOT mean, ms.
    pub tpot_mean_ms: f64,
    /// The busiest role (the overload check's bottleneck).
    pub bottleneck: Option<&'static str>,
    /// Requests that entered.
    pub simulated: u64,
    /// The run's digest (what `pdsim run` prints for the same scenario).
    pub digest: u64,
}

/// Runs `scenario` (a candidate at one rate) as a trial.
///
/// # Errors
/// The run fails (a bug, or a trace row refused mid-run).
pub fn trial(
    scenario: &Scenario,
    rate: f64,
    t: &Traffic,
    attainment: f64,
    interrupt: &AtomicBool,
) -> Result<Trial, RunError> {
    let allowed = t.allowed_misses(attainment);
    let stop = Arc::new(AtomicBool::new(false));
    let misses = Rc::new(Cell::new(0u64));
    let slo = scenario.slo().clone();
    let sink = {
        let (stop, misses) = (Arc::clone(&stop), Rc::clone(&misses));
        Box::new(move |r: &actors::request::Request| {
            if !meets_slo(r, &slo) {
                misses.set(misses.get() + 1);
                if misses.get() > allowed {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        })
    };
    let keep = Keep { timelines: false, record_sink: Some(sink), ..Keep::default() };
    let on_progress = |_| {
        if interrupt.load(Ordering::Relaxed) {
            stop.store(true, Ordering::Relaxed);
        }
    };
    let run = runner::simulate_with(scenario, scenario.seed(), None, on_progress, &stop, keep)?;
    let s = &run.output.summary;
    let stopped_early = misses.get() > allowed;
    let pass = !stopped_early && !run.interrupted && s.slo_attainment >= attainment;
    let bottleneck = crate::report::overload(scenario, &run).bottleneck;
    Ok(Trial {
        rate,
        pass,
        stopped_early,
        attainment: s.slo_attainment,
        goodput: s.goodput,
        output_tokens_per_s: s.output_token_throughput,
        ttft_p99_ms: s.ttft_ms.p99,
        tpot_p99_ms: s.tpot_ms.p99,
        tpot_mean_ms: s.tpot_ms.mean,
        bottleneck,
        simulated: s.requests,
        digest: run.output.digest,
    })
}

/// What became of a candidate.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    /// It makes no valid scenario (the reason).
    Infeasible(String),
    /// Its bound is below the target: not simulated.
    Pruned,
    /// Simulated.
    Simulated,
}

impl Status {
    /// `infeasible`, `pruned` or `simulated`.
    pub fn name(&self) -> &'static str {
        match self {
            Status::Infeasible(_) => "infeasible",
            Status::Pruned => "pruned",
            Status::Simulated => "simulated",
        }
    }
}

/// A candidate's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The candidate.
    pub candidate: Candidate,
    /// Whether it was simulated.
    pub status: Status,
    /// Its analytic bound (when it makes a scenario).
    pub bound: Option<Bound>,
    /// It meets the SLO at the target rate.
    pub meets: bool,
    /// `max_rate`: the highest rate that passed (`None`: none above 1/64
    /// of the target).
    pub max_rate: Option<f64>,
    /// The lowest rate that failed (`None`: none tried failed).
    pub min_failing: Option<f64>,
    /// The trial its figures come from: at `max_rate` (`max_rate` search)
    /// or at the target (`fixed`).
    pub at: Option<Trial>,
    /// The bottleneck where it breaks: of the lowest failing trial, else
    /// of `at`.
    pub bottleneck: Option<&'static str>,
    /// Every trial, in the order run.
    pub trials: Vec<Trial>,
}

impl Outcome {
    /// Requests simulated over every trial.
    pub fn simulated_requests(&self) -> u64 {
        self.trials.iter().map(|t| t.simulated).sum()
    }

    /// Goodput per GPU at the reported trial, req/s.
    pub fn goodput_per_gpu(&self) -> Option<f64> {
        self.at.as_ref().map(|t| t.goodput / f64::from(self.candidate.gpus()))
    }

    /// Output tokens per second per user at the reported trial: 1000 over
    /// the mean TPOT.
    pub fn interactivity(&self) -> Option<f64> {
        self.at.as_ref().filter(|t| t.tpot_mean_ms > 0.0).map(|t| 1000.0 / t.tpot_mean_ms)
    }
}

/// Prices candidate `c` of `plan` (bound, then trials).
///
/// # Errors
/// A run that fails (a bug, or a trace row refused mid-run).
pub fn evaluate(plan: &Plan, t: &Traffic, c: &Candidate, interrupt: &AtomicBool) -> Result<Outcome, RunError> {
    let p = &plan.spec;
    let at_rate = |rate: f64| space::scenario(p, &plan.base, c, |table| t.set_rate(&plan.base, table, rate));
    let mut out = Outcome {
        candidate: c.clone(),
        status: Status::Simulated,
        bound: None,
        meets: false,
        max_rate: None,
        min_failing: None,
        at: None,
        bottleneck: None,
        trials: Vec::new(),
    };
    let target_scenario = match at_rate(t.target) {
        Ok(s) => s,
        Err(e) => {
            out.status = Status::Infeasible(e.message().to_owned());
            return Ok(out);
        }
    };
    let bound = match bound(&target_scenario, t) {
        Ok(b) => b,
        Err(e) => {
            out.status = Status::Infeasible(e);
            return Ok(out);
        }
    };
    out.bound = Some(bound);
    if bound.rate < t.target {
        out.status = Status::Pruned;
        out.bottleneck = Some(bound.role);
        return Ok(out);
    }
    let run = |rate: f64, out: &mut Outcome| -> Result<Trial, RunError> {
        let s = if rate == t.target {
            target_scenario.clone()
        } else {
            at_rate(rate).map_err(|e| {
                RunError::BadInput(format!("at {rate:.4} req/s the workload makes no valid scenario: {e}"))
            })?
        };
        let trial = trial(&s, rate, t, p.attainment, interrupt)?;
        out.trials.push(trial.clone());
        Ok(trial)
    };
    let first = run(t.target, &mut out)?;
    out.meets = first.pass;
    if p.search == SearchMode::Fixed {
        out.bottleneck = first.bottleneck;
        out.at = Some(first);
        return Ok(out);
    }
    // The highest pass and the lowest failure so far.
    let (mut lo, mut hi): (Option<Trial>, Option<Trial>) =
        if first.pass { (Some(first), None) } else { (None, Some(first)) };
    let floor = t.target / 64.0;
    let mut past_bound = 0;
    let mut tried_floor = false;
    loop {
        if interrupt.load(Ordering::Relaxed) {
            break;
        }
        let next = match (&lo, &hi) {
            (Some(l), None) => {
                if l.rate >= bound.rate {
                    past_bound += 1;
                    if past_bound > 4 {
                        break;
                    }
                    l.rate * 2.0
                } else if l.rate < NEAR_BOUND * bound.rate && NEAR_BOUND * bound.rate <= 4.0 * l.rate {
                    // The bound is close to what a candidate serves (its
                    // highest rate is mostly 0.85 to 0.95 of it): just
                    // under it first, then the bound itself.
                    NEAR_BOUND * bound.rate
                } else {
                    bound.rate.min(4.0 * l.rate)
                }
            }
            (None, Some(h)) => {
                if h.rate <= floor {
                    break;
                }
                // After two failures, the floor: a candidate that misses
                // even there (a prompt whose prefill alone breaks the TTFT
                // bound) is done in one more trial.
                if h.rate < t.target && !tried_floor {
                    tried_floor = true;
                    floor
                } else {
                    h.rate / 2.0
                }
            }
            (Some(l), Some(h)) => {
                if h.rate - l.rate <= p.rate_tolerance * h.rate {
                    break;
                }
                (l.rate * h.rate).sqrt()
            }
            (None, None) => unreachable!("the first trial is one or the other"),
        };
        let trial = run(next, &mut out)?;
        if trial.pass {
            lo = Some(trial);
        } else {
            hi = Some(trial);
        }
    }
    out.max_rate = lo.as_ref().map(|l| l.rate);
    out.min_failing = hi.as_ref().map(|h| h.rate);
    out.bottleneck = hi.as_ref().or(lo.as_ref()).and_then(|x| x.bottleneck);
    out.at = lo;
    Ok(out)
}

/// Every candidate's answer, the best and the frontier.
#[derive(Clone, Debug)]
pub struct PlanResult {
    /// The traffic the trials served.
    pub traffic: Traffic,
    /// One per candidate, in the plan's order.
    pub outcomes: Vec<Outcome>,
    /// The index of the best candidate: the fewest GPUs meeting the
    /// target, then the highest goodput per GPU, then the first.
    pub best: Option<usize>,
    /// Indices of the candidates meeting the target on the Pareto
    /// frontier of goodput per GPU against interactivity.
    pub frontier: Vec<usize>,
}

/// The best candidate and the frontier of `outcomes`.
pub fn choose(outcomes: &[Outcome]) -> (Option<usize>, Vec<usize>) {
    let meeting: Vec<&Outcome> = outcomes.iter().filter(|o| o.meets && o.at.is_some()).collect();
    let mut best: Option<&Outcome> = None;
    for o in &meeting {
        let better = match best {
            None => true,
            Some(b) => {
                o.candidate.gpus() < b.candidate.gpus()
                    || (o.candidate.gpus() == b.candidate.gpus() && o.goodput_per_gpu() > b.goodput_per_gpu())
            }
        };
        if better {
            best = Some(o);
        }
    }
    let point = |o: &Outcome| (o.interactivity().unwrap_or(0.0), o.goodput_per_gpu().unwrap_or(0.0));
    let mut frontier = Vec::new();
    for o in &meeting {
        let (x, y) = point(o);
        let dominated = meeting.iter().any(|q| {
            let (qx, qy) = point(q);
            qx >= x && qy >= y && (qx > x || qy > y)
        });
        if !dominated {
            frontier.push(o.candidate.index);
        }
    }
    (best.map(|b| b.candidate.index), frontier)
}

/// Runs the whole plan on `jobs` threads, calling `on_done(done, total)`
/// on this thread as each candidate's answer is handed over (in order).
///
/// # Errors
/// The traffic cannot be read, the candidates are too many, or a run fails.
pub fn run(
    plan: &Plan,
    jobs: usize,
    interrupt: &AtomicBool,
    mut on_done: impl FnMut(usize, usize, &Outcome),
) -> Result<PlanResult, RunError> {
    let traffic = traffic(plan).map_err(RunError::BadInput)?;
    let candidates = space::candidates(&plan.spec, &plan.base)
        .map_err(|e| RunError::BadInput(format!("{}: {e}", plan.base.source())))?;
    let total = candidates.len();
    let mut outcomes = Vec::with_capacity(total);
    runner::ordered_parallel(
        total,
        jobs,
        |i| evaluate(plan, &traffic, &candidates[i], interrupt),
        |i, o| {
            on_done(i + 1, total, &o);
            outcomes.push(o);
            Ok(())
        },
    )?;
    let (best, frontier) = choose(&outcomes);
    Ok(PlanResult { traffic, outcomes, best, frontier })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::space::{Knobs, Shape};

    fn traffic(requests: u64) -> Traffic {
        Traffic {
            requests,
            own_rate: 1.0,
            target: 1.0,
            mean_prompt: 1.0,
            mean_output: 1.0,
            mean_uncached: 1.0,
            prompts: Vec::new(),
        }
    }

    #[test]
    fn misses_allowed_by_the_attainment() {
        // 0.99 of 1,000: 990 must meet it, so 10 may miss (990/1000 = 0.99
        // passes, 989/1000 does not).
        assert_eq!(traffic(1000).allowed_misses(0.99), 10);
        // 0.99 of 400: 396 (0.99), so 4.
        assert_eq!(traffic(400).allowed_misses(0.99), 4);
        // 0.99 of 150: 148.5 rounds up to 149 meeting, so 1.
        assert_eq!(traffic(150).allowed_misses(0.99), 1);
        // Every request: none may miss; 0.5 of 3: 2 meeting, 1 missing.
        assert_eq!(traffic(7).allowed_misses(1.0), 0);
        assert_eq!(traffic(3).allowed_misses(0.5), 1);
    }

    fn outcome(index: usize, shape: Shape, meets: bool, goodput: f64, tpot_ms: f64) -> Outcome {
        let trial = Trial {
            rate: 1.0,
            pass: meets,
            stopped_early: false,
            attainment: 1.0,
            goodput,
            output_tokens_per_s: 0.0,
            ttft_p99_ms: 0.0,
            tpot_p99_ms: 0.0,
            tpot_mean_ms: tpot_ms,
            bottleneck: None,
            simulated: 1,
            digest: 0,
        };
        Outcome {
            candidate: Candidate { index, shape, knobs: Knobs::default() },
            status: Status::Simulated,
            bound: None,
            meets,
            max_rate: Some(1.0),
            min_failing: None,
            at: Some(trial.clone()),
            bottleneck: None,
            trials: vec![trial],
        }
    }

    #[test]
    fn the_best_is_the_fewest_gpus_then_the_most_goodput_per_gpu() {
        let agg = |ranks, tp| Shape::Aggregated { ranks, tp };
        let outcomes = vec![
            outcome(0, agg(1, 1), false, 10.0, 10.0), // 1 GPU, misses
            outcome(1, agg(2, 1), true, 20.0, 20.0),  // 2 GPUs: 10 per GPU
            outcome(2, agg(1, 2), true, 24.0, 10.0),  // 2 GPUs: 12 per GPU
            outcome(3, agg(4, 1), true, 80.0, 25.0),  // 4 GPUs: 20 per GPU
        ];
        let (best, frontier) = choose(&outcomes);
        assert_eq!(best, Some(2));
        // Interactivity 1000/TPOT: #1 50, #2 100, #3 40 tok/s/user; per
        // GPU: 10, 12, 20. #1 is dominated by #2 (more of both); #2 (most
        // interactive) and #3 (most per GPU) are not.
        assert_eq!(frontier, vec![2, 3]);
        let (best, frontier) = choose(&outcomes[..1]);
        assert_eq!((best, frontier), (None, vec![]));
    }
}
