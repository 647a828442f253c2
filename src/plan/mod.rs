//! `pdsim plan`: the cheapest deployment that meets a scenario's SLOs,
//! found by simulating every candidate on the scenario's own traffic.
//!
//! A plan file is a scenario (model, hardware, workload or trace, `[slo]`)
//! with a `[plan]` table ([`PlanSpec`]; `max_gpus` is the only required
//! key):
//!
//! ```toml
//! [plan]
//! max_gpus = 16                  # every candidate uses at most this many GPUs
//! attainment = 0.99              # share of requests that must meet every [slo] bound
//! # rate_per_s = 20.0            # the target rate (default: the workload's own)
//! # search = "max_rate"          # or "fixed": only whether each meets the target
//! # requests = 10000             # per trial (default: the workload's, at most 10,000)
//! # rate_tolerance = 0.05        # bisection stops within this share of the rate
//! # modes = ["aggregated", "disaggregated"]
//! # tp = [1, 2, 4, 8]            # TP sizes per role (default: powers of two up to 8)
//! # heterogeneous_tp = true      # prefill and decode TP may differ (one divides the other)
//! # max_num_batched_tokens = [2048, 8192]   # optional axes, every role alike
//! # max_num_seqs = [128, 256]
//! # link_bandwidth_gb_s = [25.0, 50.0]
//! # router_policy = ["round_robin", "least_outstanding"]
//! # step_time = [{ kind = "roofline" }, { kind = "roofline", gemm_efficiency = 0.6 }]
//! # [plan.step_time_by_tp]       # a step time per TP size (a calibrated table each)
//! # 1 = { kind = "table2d", ... }
//! ```
//!
//! [`space`] makes the candidates (aggregated and P/D shapes, TP per role,
//! the axes), [`search`] prices each with analytic bounds and simulates
//! the ones the bounds leave, bisecting on the rate with the workload's
//! shape kept, and [`output`] writes `candidates.csv`, `best.toml`, the
//! vLLM launch lines and the summary.

use std::collections::BTreeMap;
use std::path::Path;

use actors::config::{Policy, StepTimeSpec};
use actors::validate::FieldError;
use serde::{Deserialize, Serialize};

use crate::scenario::{self, Scenario, ScenarioError};
use crate::workload::ArrivalSpec;

pub mod output;
pub mod search;
pub mod space;

/// Requests a trial simulates by default at most.
pub const DEFAULT_MAX_TRIAL_REQUESTS: u64 = 10_000;
/// Candidates a plan may have at most (its axes multiply).
pub const MAX_CANDIDATES: usize = 20_000;
/// The most GPUs a plan may ask for.
pub const MAX_GPUS: u32 = 4096;

/// The `[plan]` table: what to search and what to answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    /// Every candidate uses at most this many GPUs (ranks × TP, summed
    /// over roles).
    pub max_gpus: u32,
    /// The share of all requests that must complete within every `[slo]`
    /// bound (default 0.99).
    #[serde(default = "default_attainment")]
    pub attainment: f64,
    /// The target rate, requests per second (default: the workload's own
    /// rate; a trace's, at its `time_scale`).
    #[serde(default)]
    pub rate_per_s: Option<f64>,
    /// `max_rate` (default): each candidate's highest rate meeting the
    /// SLO, by bisection; `fixed`: only whether it meets the target.
    #[serde(default)]
    pub search: SearchMode,
    /// Requests one trial simulates (default: the workload's count, at
    /// most [`DEFAULT_MAX_TRIAL_REQUESTS`]).
    #[serde(default)]
    pub requests: Option<u64>,
    /// The bisection stops once the highest passing and the lowest failing
    /// rate are within this share of the latter (default 0.05).
    #[serde(default = "default_tolerance")]
    pub rate_tolerance: f64,
    /// The deployment modes to consider (default both).
    #[serde(default)]
    pub modes: Option<Vec<Mode>>,
    /// TP sizes a role may take (default: 1, 2, 4, 8 up to `max_gpus`;
    /// with a step time that is a table for one TP size, that size only).
    #[serde(default)]
    pub tp: Option<Vec<u32>>,
    /// Whether prefill and decode may run different TP sizes (default
    /// true; one must divide the other, as vLLM's NIXL connector pairs
    /// them).
    #[serde(default)]
    pub heterogeneous_tp: Option<bool>,
    /// An axis: every role's `max_num_batched_tokens`.
    #[serde(default)]
    pub max_num_batched_tokens: Option<Vec<u64>>,
    /// An axis: every role's `max_num_seqs`.
    #[serde(default)]
    pub max_num_seqs: Option<Vec<u32>>,
    /// An axis: the link's `bandwidth_gb_s` (P/D candidates).
    #[serde(default)]
    pub link_bandwidth_gb_s: Option<Vec<f64>>,
    /// An axis: the router's `prefill_policy` (the aggregated ranks' too).
    #[serde(default)]
    pub router_policy: Option<Vec<Policy>>,
    /// An axis: every role's step time.
    #[serde(default)]
    pub step_time: Option<Vec<StepTimeSpec>>,
    /// A step time per TP size (keys: the TP size), for tables calibrated
    /// at each size; it replaces the roles' own at that size.
    #[serde(default)]
    pub step_time_by_tp: Option<BTreeMap<String, StepTimeSpec>>,
}

fn default_attainment() -> f64 {
    0.99
}

fn default_tolerance() -> f64 {
    0.05
}

/// What a plan answers per candidate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchMode {
    /// The highest rate meeting the SLO (bisection).
    #[default]
    MaxRate,
    /// Whether the target rate meets it.
    Fixed,
}

/// A deployment mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Ranks that prefill and decode.
    Aggregated,
    /// Prefill ranks and decode ranks with a KV handoff.
    Disaggregated,
}

/// A plan file, loaded and checked: the base scenario and its `[plan]`.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The scenario part of the file.
    pub base: Scenario,
    /// The `[plan]` table.
    pub spec: PlanSpec,
}

/// Loads a plan file: a scenario with a `[plan]` table. Every problem is
/// one line naming the file, the line and the field (`plan.max_gpus`).
///
/// # Errors
/// The scenario's problems, a missing or wrong `[plan]`, and plan checks
/// that need the scenario (open-loop arrivals, an `[slo]` bound, step
/// times for the TP sizes listed).
pub fn load(path: impl AsRef<Path>) -> Result<Plan, ScenarioError> {
    let path = path.as_ref();
    let (base, spec) = scenario::load_with_table::<PlanSpec>(path, "plan", &check)?;
    let spec = spec.ok_or_else(|| {
        ScenarioError::at(
            &path.display().to_string(),
            Some("plan"),
            "missing table [plan] (pdsim plan needs at least `max_gpus = N`)",
        )
    })?;
    Ok(Plan { base, spec })
}

/// No value listed twice, and at least one.
fn distinct<T: PartialEq + std::fmt::Debug>(field: &str, list: &[T]) -> Result<(), FieldError> {
    if list.is_empty() {
        return Err(FieldError::new(field, "must list at least one value"));
    }
    for (i, v) in list.iter().enumerate() {
        if list[..i].contains(v) {
            return Err(FieldError::new(format!("{field}[{i}]"), format!("{v:?} is listed twice")));
        }
    }
    Ok(())
}

/// Every check of `[plan]` against its scenario (field paths absolute).
fn check(p: &PlanSpec, s: &Scenario) -> Result<(), FieldError> {
    if p.max_gpus == 0 || p.max_gpus > MAX_GPUS {
        return Err(FieldError::new("plan.max_gpus", format!("must be from 1 to {MAX_GPUS}, got {}", p.max_gpus)));
    }
    if !(p.attainment > 0.0 && p.attainment <= 1.0) {
        return Err(FieldError::new("plan.attainment", format!("must be in (0, 1], got {}", p.attainment)));
    }
    if let Some(r) = p.rate_per_s
        && !(r.is_finite() && r > 0.0)
    {
        return Err(FieldError::new("plan.rate_per_s", format!("must be > 0, got {r}")));
    }
    if p.requests == Some(0) {
        return Err(FieldError::new("plan.requests", "must be >= 1, got 0"));
    }
    if !(p.rate_tolerance > 0.0 && p.rate_tolerance <= 0.5) {
        return Err(FieldError::new("plan.rate_tolerance", format!("must be in (0, 0.5], got {}", p.rate_tolerance)));
    }
    if let Some(m) = &p.modes {
        distinct("plan.modes", m)?;
    }
    if let Some(tps) = &p.tp {
        distinct("plan.tp", tps)?;
        for (i, &t) in tps.iter().enumerate() {
            if t == 0 || t > p.max_gpus {
                return Err(FieldError::new(
                    format!("plan.tp[{i}]"),
                    format!("must be from 1 to max_gpus ({}), got {t}", p.max_gpus),
                ));
            }
        }
    }
    if let Some(v) = &p.max_num_batched_tokens {
        distinct("plan.max_num_batched_tokens", v)?;
        if let Some(i) = v.iter().position(|&x| x == 0) {
            return Err(FieldError::new(format!("plan.max_num_batched_tokens[{i}]"), "must be >= 1, got 0"));
        }
    }
    if let Some(v) = &p.max_num_seqs {
        distinct("plan.max_num_seqs", v)?;
        if let Some(i) = v.iter().position(|&x| x == 0) {
            return Err(FieldError::new(format!("plan.max_num_seqs[{i}]"), "must be >= 1, got 0"));
        }
    }
    if let Some(v) = &p.link_bandwidth_gb_s {
        distinct("plan.link_bandwidth_gb_s", v)?;
        if let Some(i) = v.iter().position(|&x| !(x.is_finite() && x > 0.0)) {
            return Err(FieldError::new(
                format!("plan.link_bandwidth_gb_s[{i}]"),
                format!("must be > 0, got {}", v[i]),
            ));
        }
    }
    if let Some(v) = &p.router_policy {
        distinct("plan.router_policy", v)?;
    }
    if let Some(v) = &p.step_time {
        distinct("plan.step_time", v)?;
    }
    if let Some(m) = &p.step_time_by_tp {
        for k in m.keys() {
            if !k.parse::<u32>().is_ok_and(|t| t >= 1) {
                return Err(FieldError::new(
                    format!("plan.step_time_by_tp.{k}"),
                    "keys are TP sizes (whole numbers >= 1)",
                ));
            }
        }
    }
    if p.step_time.is_some() && p.step_time_by_tp.is_some() {
        return Err(FieldError::new(
            "plan.step_time_by_tp",
            "give `step_time` (an axis) or `step_time_by_tp` (one per TP size), not both",
        ));
    }
    let slo = s.slo();
    if slo.ttft_ms.is_none() && slo.tpot_ms.is_none() && slo.e2e_ms.is_none() {
        return Err(FieldError::new(
            "slo",
            "pdsim plan needs at least one bound (ttft_ms, tpot_ms or e2e_ms) for candidates to meet",
        ));
    }
    if let Some(ArrivalSpec::ClosedLoop { .. }) = s.workload().arrival.as_ref() {
        return Err(FieldError::new(
            "workload.arrival.kind",
            "pdsim plan searches on the request rate, so it needs open-loop arrivals (poisson, gamma or trace), \
             not closed_loop",
        ));
    }
    space::check_tps(p, s)?;
    Ok(())
}
