//! Every check of a deployment, in one place.
//!
//! [`crate::deploy::sim::Deployment::build`] runs them all and refuses the first
//! problem; the harness only places the error in its scenario file. A check
//! names the refused field as a scenario file spells it (a dotted path,
//! array elements as `name[i]`) in a [`FieldError`]; the model and pairing
//! gates of [`crate::models::model`] keep their [`GateError`], which names the role
//! and the model's group.
//!
//! The order is: the roles present, each role's fields (its step time
//! among them), the link, the faults, the timeline interval, then the model
//! gates of every role and the pairing, then what the model makes of each
//! role's pool (its groups, and byte counts that must fit in 64 bits).
//!
//! Adding a deployment knob means adding its field to [`crate::deploy::config`] and
//! its check here.

use sim_core::{SimDuration, SimTime};

use crate::base::field::micros;
use crate::base::units::{Bandwidth, Tokens};
use crate::deploy::config::{DeploymentSpec, FaultSpec, LinkSpec, RoleSpec, SloSpec, StepTimeSpec};
use crate::deploy::sim::MAX_RANKS;
use crate::kv::MAX_GROUPS;
use crate::models::hardware::Gpu;
use crate::models::model::{
    CacheGroup, CacheGroupKind, CacheGroupSpec, FrontEnd, GateError, Model, ModelSpec, RankRules, Role,
};
use crate::models::model::{DEFAULT_LINEAR_BLOCK_SIZE, check_pairing, check_rank};
use crate::models::tp::Reads;

pub use crate::base::field::{FieldError, at_least_one, non_negative, positive};

/// A deployment spec that failed a check.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A field of the deployment.
    #[error(transparent)]
    Field(#[from] FieldError),
    /// A model or pairing gate.
    #[error(transparent)]
    Gate(#[from] GateError),
}

/// `v` seconds must be finite and within `lo..=hi`.
fn seconds_within(field: &str, v: f64, lo: f64, hi: f64, what: &str) -> Result<f64, FieldError> {
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(FieldError::new(field, format!("must be from {what}, got {v}")))
    }
}

/// One role's checked ranks.
#[derive(Clone, Debug)]
pub(crate) struct CheckedRole {
    pub(crate) role: Role,
    pub(crate) spec: RoleSpec,
    pub(crate) rules: RankRules,
    pub(crate) groups: Vec<CacheGroup>,
    /// The pool's blocks: the spec's, or derived from GPU memory.
    pub(crate) num_blocks: u64,
    /// The rank's TP size.
    pub(crate) tp: u32,
}

/// Everything a deployment runs with, once checked.
#[derive(Clone, Debug)]
pub(crate) struct Checked {
    pub(crate) model: Model,
    pub(crate) roles: Vec<CheckedRole>,
    pub(crate) bandwidth: Bandwidth,
    pub(crate) latency: SimDuration,
    pub(crate) faults: Faults,
    /// The API server in front of the engines.
    pub(crate) front_end: FrontEnd,
    /// How a handoff reads between the prefill and decode TP sizes (P/D only).
    pub(crate) reads: Option<Reads>,
    /// The checked `[hardware]`, when the deployment gives one.
    pub(crate) gpu: Option<Gpu>,
}

/// A role whose step time is a roofline needs the model's `arch` and the
/// deployment's `[hardware]`.
fn roofline_inputs(model: &ModelSpec, spec: &DeploymentSpec, roles: &[CheckedRole]) -> Result<(), FieldError> {
    let Some(r) = roles.iter().find(|r| matches!(r.spec.step_time, StepTimeSpec::Roofline(_))) else {
        return Ok(());
    };
    let at = format!("{}.step_time.kind", r.role.as_str());
    if model.arch.is_none() {
        return Err(FieldError::new(at, format!("a roofline needs the model's layers: {NAME_A_MODEL}")));
    }
    if spec.hardware.is_none() {
        return Err(FieldError::new(at, "a roofline needs the GPU: add `[hardware] gpu = \"h200\"` (or its numbers)"));
    }
    Ok(())
}

const NAME_A_MODEL: &str = "name a preset (`[model] preset = \"llama-3.1-8b\"`), a `config` (a HuggingFace \
                            config.json) or give `[model.arch]`";

/// The blocks a `role` rank's pool gets from GPU memory when its
/// `num_blocks` is absent ([`crate::models::arch::memory`]).
fn kv_capacity(
    role: Role,
    rs: &RoleSpec,
    model: &ModelSpec,
    gpu: Option<&Gpu>,
    tp: u32,
    m: &Model,
) -> Result<u64, FieldError> {
    let at = format!("{}.num_blocks", role.as_str());
    let Some(arch) = &model.arch else {
        return Err(FieldError::new(
            at,
            format!(
                "missing: give the pool's blocks, or let the GPU's memory size it: {NAME_A_MODEL}, and a `[hardware]`"
            ),
        ));
    };
    let Some(gpu) = gpu else {
        return Err(FieldError::new(
            at,
            "missing: give the pool's blocks, or let the GPU's memory size it: add `[hardware] gpu = \"h200\"`",
        ));
    };
    let page = match m {
        Model::Grouped(g) => g.page_bytes().get(),
        Model::Linear(l) => {
            let b = rs.block_size_tokens.unwrap_or(DEFAULT_LINEAR_BLOCK_SIZE);
            b.get().saturating_mul(l.kv_bytes_per_token().get())
        }
    };
    let util = rs.gpu_memory_utilization.unwrap_or(DEFAULT_GPU_MEMORY_UTILIZATION);
    let budget =
        arch.memory_budget(gpu.memory_bytes(), util, tp, rs.max_num_batched_tokens, u64::from(rs.max_num_seqs));
    let blocks = (budget.kv_bytes() / page as f64).floor();
    if blocks < 1.0 {
        return Err(FieldError::new(
            at,
            format!(
                "the GPU's memory leaves no KV cache: {:.2} GiB × {util} = {:.2} GiB, weights {:.2} GiB, \
                 activations {:.2} GiB, reserve {:.2} GiB (raise tp or gpu_memory_utilization)",
                gpu.memory_bytes() / GIB,
                budget.budget / GIB,
                budget.weights / GIB,
                budget.activations / GIB,
                budget.reserve / GIB
            ),
        ));
    }
    Ok(blocks as u64)
}

const GIB: f64 = 1_073_741_824.0;

/// vLLM's default `--gpu-memory-utilization`.
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// The checked faults.
#[derive(Clone, Debug)]
pub(crate) struct Faults {
    pub(crate) hold: Option<SimDuration>,
    pub(crate) lease: Option<SimDuration>,
    pub(crate) crashes: Vec<(u32, SimTime)>,
}

/// Checks `spec` for `model`: every check of this module, in its order.
pub(crate) fn deployment(model: &ModelSpec, spec: &DeploymentSpec) -> Result<Checked, ConfigError> {
    let model_spec = model;
    let present = roles(spec)?;
    // Whether the file gives groups; a model with both is refused by its gate.
    let grouped = !model.cache_groups.is_empty();
    for &(role, rs) in &present {
        self::role(rs, grouped).map_err(|e| e.under(role.as_str()))?;
    }
    let (bandwidth, latency) = link(&spec.link).map_err(|e| e.under("link"))?;
    if let Some(w) = spec.router.kv_overlap_weight
        && !(w.is_finite() && w >= 0.0)
    {
        return Err(
            FieldError::new("router.kv_overlap_weight", format!("must be a finite number >= 0, got {w}")).into()
        );
    }
    let decode_ranks = spec.decode.as_ref().map_or(0, |d| d.count);
    let faults = faults(&spec.faults, decode_ranks).map_err(|e| e.under("faults"))?;
    let request_us = spec.frontend.request_us.map(|v| micros("request_us", v)).transpose();
    let response_us = spec.frontend.response_us.map(|v| micros("response_us", v)).transpose();
    let (request_us, response_us) =
        (request_us.map_err(|e| e.under("frontend"))?, response_us.map_err(|e| e.under("frontend"))?);
    // Checked for the files that still give it; the timeline is exact.
    timeline_interval(spec.timeline_interval_ms)?;

    let mut gated: Vec<(Role, &RoleSpec, Model, RankRules)> = Vec::new();
    for &(role, rs) in &present {
        let m = model.validate(role)?;
        let version = rs.vllm_version.as_deref().or(spec.vllm_version.as_deref());
        let rules = check_rank(role, &m, version)?;
        gated.push((role, rs, m, rules));
    }
    // One scenario has one model, but each role validates its own copy, so
    // the pairing gate sees what each side would run.
    if let [(Role::Prefill, _, p, _), (Role::Decode, _, d, _)] = gated.as_slice() {
        check_pairing(p, d)?;
    }

    tp_fields(model)?;
    if let Some(arch) = &model.arch {
        arch.check().map_err(|e| {
            let field = if e.field.is_empty() { "model.arch".to_owned() } else { format!("model.arch.{}", e.field) };
            FieldError::new(field, e.problem)
        })?;
    }
    let gpu = spec.hardware.as_ref().map(|h| h.resolve().map_err(|e| e.under("hardware"))).transpose()?;
    let reads = tp_pairing(model, &present)?;
    // Each role holds the model's bytes at its own TP size.
    let mut roles = Vec::new();
    let mut last = None;
    for (role, rs, _, rules) in &gated {
        let tp = rs.tp_under(model);
        let at = model.at_tp(tp).map_err(|e| {
            let field = format!("model.{}", e.field);
            FieldError::new(field, format!("{} ({} rank at tp {tp})", e.problem, role))
        })?;
        let m = at.validate(*role)?;
        let num_blocks = match rs.num_blocks {
            Some(n) => n,
            None => kv_capacity(*role, rs, model_spec, gpu.as_ref(), tp, &m)?,
        };
        let groups = pool_groups(*role, rs, &m, num_blocks)?;
        let mut spec = (*rs).clone();
        // vLLM's default max_model_len is the model's context limit.
        if spec.max_model_len.is_none() {
            spec.max_model_len = model_spec.arch.as_ref().and_then(|a| a.max_position_embeddings).map(Tokens::new);
        }
        model_len_checks(&spec).map_err(|e| e.under(role.as_str()))?;
        roles.push(CheckedRole { role: *role, spec, rules: *rules, groups, num_blocks, tp });
        last = Some(m);
    }
    let model = last.expect("roles() found at least one role");
    roofline_inputs(model_spec, spec, &roles)?;
    // The front end is the version's of the rank a request meets first
    // (every release pdsim knows has the same), each field the file gives
    // in its place.
    let default = roles[0].rules.front_end();
    let us = |v: f64| SimDuration::from_secs_f64(v / 1e6);
    let front_end = FrontEnd {
        request: request_us.map_or(default.request, us),
        response: response_us.map_or(default.response, us),
    };
    Ok(Checked { model, roles, bandwidth, latency, faults, front_end, reads, gpu })
}

/// The model's TP fields: its `tp`, `kv_heads` and every group's `heads`
/// are at least 1.
fn tp_fields(model: &ModelSpec) -> Result<(), FieldError> {
    if let Some(t) = model.tp {
        at_least_one("model.tp", u64::from(t))?;
    }
    if let Some(h) = model.kv_heads {
        at_least_one("model.kv_heads", u64::from(h))?;
    }
    for (i, g) in model.cache_groups.iter().enumerate() {
        if let Some(h) = g.heads {
            at_least_one(&format!("model.cache_groups[{i}].heads"), u64::from(h))?;
        }
    }
    Ok(())
}

/// The TP sizes of a prefill and a decode role: equal, or (heterogeneous
/// TP, as vLLM's NIXL connector supports it) dividing one another, with a
/// model that says at which TP size its bytes are given (`model.tp`) so
/// that each side's can be derived. Returns how a handoff reads.
fn tp_pairing(model: &ModelSpec, present: &[(Role, &RoleSpec)]) -> Result<Option<Reads>, FieldError> {
    let [(Role::Prefill, p), (Role::Decode, d)] = present else { return Ok(None) };
    let (pt, dt) = (p.tp_under(model), d.tp_under(model));
    if pt != dt {
        if model.tp.is_none() {
            return Err(FieldError::new(
                "decode.tp",
                format!(
                    "{dt} differs from prefill.tp {pt}: heterogeneous TP needs the model's tp (the TP size \
                     its byte counts are for) and each group's heads"
                ),
            ));
        }
        if !pt.is_multiple_of(dt) && !dt.is_multiple_of(pt) {
            return Err(FieldError::new(
                "decode.tp",
                format!("{dt} and prefill.tp {pt} must divide one another (vLLM's NIXL maps ranks by their ratio)"),
            ));
        }
    }
    Ok(Some(Reads::for_model(model, pt, dt)))
}

/// The roles present: prefill and decode, or aggregated alone.
fn roles(d: &DeploymentSpec) -> Result<Vec<(Role, &RoleSpec)>, FieldError> {
    match (&d.prefill, &d.decode, &d.aggregated) {
        (Some(p), Some(dec), None) => Ok(vec![(Role::Prefill, p), (Role::Decode, dec)]),
        (None, None, Some(a)) => Ok(vec![(Role::Aggregated, a)]),
        (None, None, None) => Err(FieldError::new(
            "prefill",
            "missing table [prefill] (a disaggregated deployment needs [prefill] and [decode]; \
             an aggregated one, [aggregated])",
        )),
        (Some(_), None, None) => Err(FieldError::new(
            "decode",
            "missing table [decode] (a disaggregated deployment needs prefill and decode ranks)",
        )),
        (None, Some(_), None) => Err(FieldError::new(
            "prefill",
            "missing table [prefill] (a disaggregated deployment needs prefill and decode ranks)",
        )),
        (_, _, Some(_)) => Err(FieldError::new(
            "aggregated",
            "cannot be combined with [prefill]/[decode] (a deployment is either disaggregated \
             or aggregated; write two scenarios to compare them)",
        )),
    }
}

/// One role's ranks; paths are relative to the role's table. `grouped`:
/// whether the model gives cache groups.
fn role(r: &RoleSpec, grouped: bool) -> Result<(), FieldError> {
    if r.count == 0 || r.count > MAX_RANKS {
        return Err(FieldError::new("count", format!("must be from 1 to {MAX_RANKS}, got {}", r.count)));
    }
    if let Some(tp) = r.tp {
        at_least_one("tp", u64::from(tp))?;
    }
    if let Some(n) = r.num_blocks {
        at_least_one("num_blocks", n)?;
    }
    if let Some(u) = r.gpu_memory_utilization
        && !(u.is_finite() && u > 0.0 && u <= 1.0)
    {
        return Err(FieldError::new("gpu_memory_utilization", format!("must be a share in (0, 1], got {u}")));
    }
    at_least_one("max_num_batched_tokens", r.max_num_batched_tokens)?;
    at_least_one("max_num_seqs", u64::from(r.max_num_seqs))?;
    if let Some(b) = r.block_size_tokens {
        if grouped {
            return Err(FieldError::new(
                "block_size_tokens",
                "not allowed with a grouped model (its cache groups carry their block sizes)",
            ));
        }
        at_least_one("block_size_tokens", b.get())?;
    }
    if let Some(m) = r.max_model_len {
        at_least_one("max_model_len", m.get())?;
    }
    // vLLM's own checks (`config/scheduler.py`).
    if let Some(n) = r.max_num_active_seqs
        && !(1..=r.max_num_seqs).contains(&n)
    {
        return Err(FieldError::new(
            "max_num_active_seqs",
            format!("must be from 1 to max_num_seqs ({}), got {n}", r.max_num_seqs),
        ));
    }
    if let Some(w) = r.watermark
        && !(w.is_finite() && (0.0..1.0).contains(&w))
    {
        return Err(FieldError::new("watermark", format!("must be a share of the pool in [0, 1), got {w}")));
    }
    r.step_time.check().map_err(|e| e.under("step_time"))
}

/// vLLM's checks of the options against `max_model_len` (the role's, or
/// the model's default): `config/scheduler.py` `verify_max_model_len`.
fn model_len_checks(r: &RoleSpec) -> Result<(), FieldError> {
    let len = r.max_model_len.map(Tokens::get);
    if let (Some(t), Some(len)) = (r.long_prefill_token_threshold, len)
        && t > len
    {
        return Err(FieldError::new(
            "long_prefill_token_threshold",
            format!("must not exceed max_model_len ({len}), got {t}"),
        ));
    }
    if r.enable_chunked_prefill == Some(false) {
        match len {
            Some(len) if r.max_num_batched_tokens < len => {
                return Err(FieldError::new(
                    "enable_chunked_prefill",
                    format!(
                        "false needs max_num_batched_tokens ({}) of at least max_model_len ({len}), as vLLM does",
                        r.max_num_batched_tokens
                    ),
                ));
            }
            Some(_) => {}
            None => {
                return Err(FieldError::new(
                    "enable_chunked_prefill",
                    "false needs a max_model_len (the role's, or the model's arch.max_position_embeddings) \
                     no larger than max_num_batched_tokens, as vLLM does",
                ));
            }
        }
    }
    Ok(())
}

/// The link; paths are relative to `link`.
fn link(l: &LinkSpec) -> Result<(Bandwidth, SimDuration), FieldError> {
    let bandwidth = Bandwidth::parse_gb_per_s(l.bandwidth_gb_s).map_err(|why| {
        positive("bandwidth_gb_s", l.bandwidth_gb_s).err().unwrap_or_else(|| FieldError::new("bandwidth_gb_s", why))
    })?;
    let latency_us = micros("latency_us", l.latency_us)?;
    Ok((bandwidth, SimDuration::from_secs_f64(latency_us / 1e6)))
}

/// The faults, for a deployment of `decode_ranks` decode ranks; paths are
/// relative to `faults`.
fn faults(f: &FaultSpec, decode_ranks: u32) -> Result<Faults, FieldError> {
    let p = f.decode_abort_probability;
    if !(0.0..=1.0).contains(&p) {
        return Err(FieldError::new("decode_abort_probability", format!("must be in [0, 1], got {p}")));
    }
    let hold = match f.source_hold_s {
        Some(s) => Some(seconds_within("source_hold_s", s, 1e-9, 1e7, "1e-9 to 1e7 seconds")?),
        None => None,
    };
    let lease = match f.source_lease_s {
        Some(_) if hold.is_some() => {
            return Err(FieldError::new("source_lease_s", "give source_hold_s or source_lease_s, not both"));
        }
        Some(s) => Some(seconds_within("source_lease_s", s, 1e-6, 1e7, "1e-6 to 1e7 seconds")?),
        None => None,
    };
    let mut crashes = Vec::new();
    for (i, c) in f.decode_crashes.iter().enumerate() {
        let at = format!("decode_crashes[{i}]");
        if c.rank >= decode_ranks {
            let what = if decode_ranks == 0 {
                "there are no decode ranks".to_string()
            } else {
                format!("decode ranks are 0..{decode_ranks}")
            };
            return Err(FieldError::new(format!("{at}.rank"), format!("{what}, got {}", c.rank)));
        }
        let s = seconds_within(&format!("{at}.at_s"), c.at_s, 0.0, 1e6, "0 to 1e6 seconds")?;
        crashes.push((c.rank, SimTime::ZERO.saturating_add(SimDuration::from_secs_f64(s))));
    }
    Ok(Faults { hold: hold.map(SimDuration::from_secs_f64), lease: lease.map(SimDuration::from_secs_f64), crashes })
}

/// The top-level `timeline_interval_ms`, which no longer has an effect
/// (the timeline records every change, `metrics`): still checked, so that
/// a file giving it stays valid exactly when it was.
fn timeline_interval(ms: f64) -> Result<SimDuration, FieldError> {
    if !(ms.is_finite() && (1e-6..=1e9).contains(&ms)) {
        return Err(FieldError::new("timeline_interval_ms", format!("must be from 1e-6 to 1e9 ms, got {ms}")));
    }
    Ok(SimDuration::from_millis_f64(ms))
}

/// The cache groups of a `role` rank's pool under model `m`, and the byte
/// counts they reach, which must fit in 64 bits. Paths are full.
fn pool_groups(role: Role, rs: &RoleSpec, m: &Model, num_blocks: u64) -> Result<Vec<CacheGroup>, ConfigError> {
    let name = role.as_str();
    let groups = match m {
        Model::Grouped(g) => {
            let n = g.groups().len();
            if n > MAX_GROUPS {
                return Err(FieldError::new(
                    "model.cache_groups",
                    format!("{n} groups; pdsim supports at most {MAX_GROUPS}"),
                )
                .into());
            }
            g.groups().to_vec()
        }
        Model::Linear(l) => {
            let b = rs.block_size_tokens.unwrap_or(DEFAULT_LINEAR_BLOCK_SIZE);
            let page = b
                .checked_bytes(l.kv_bytes_per_token())
                .ok_or_else(|| FieldError::new("model.kv_bytes_per_token", "times the block size overflows 64 bits"))?;
            let spec = CacheGroupSpec {
                name: "kv".into(),
                kind: CacheGroupKind::FullAttention,
                block_size_tokens: b,
                page_bytes: page,
                transfer_bytes_per_block: Some(page),
                prefix_cacheable: Some(true),
                window_tokens: None,
                checkpoint_blocks: None,
                heads: None,
            };
            vec![spec.validate(role, 0)?]
        }
    };
    // Every byte count a request can reach stays below a full pool's.
    let per_block = groups.iter().try_fold(0u64, |acc, g| acc.checked_add(g.transfer_bytes_per_block().get()));
    if per_block.and_then(|b| b.checked_mul(num_blocks)).is_none() {
        return Err(FieldError::new(
            format!("{name}.num_blocks"),
            "the bytes of a full pool (num_blocks x transfer bytes of a block in every group) overflow 64 bits",
        )
        .into());
    }
    Ok(groups)
}

/// The SLO bounds of a run (every one optional, each > 0 ms); paths are
/// relative to `slo`. Not part of a deployment: [`crate::deploy::sim::RunInput`]
/// takes them, and a caller checks them before a run.
pub fn slo(s: &SloSpec) -> Result<(), FieldError> {
    for (name, v) in [("ttft_ms", s.ttft_ms), ("tpot_ms", s.tpot_ms), ("e2e_ms", s.e2e_ms)] {
        if let Some(v) = v {
            positive(name, v)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_prefixes_a_path_and_fills_an_empty_one() {
        assert_eq!(FieldError::new("rank", "x").under("decode_crashes[0]").field, "decode_crashes[0].rank");
        assert_eq!(FieldError::new("", "x").under("slo").field, "slo");
    }

    #[test]
    fn micros_are_from_0_to_1e9() {
        assert_eq!(micros("f", 0.0), Ok(0.0));
        assert_eq!(micros("f", 1e9), Ok(1e9));
        assert_eq!(micros("f", -1.0).unwrap_err().problem, "must be >= 0, got -1");
        assert_eq!(micros("f", f64::NAN).unwrap_err().problem, "must be >= 0, got NaN");
        assert_eq!(micros("f", f64::INFINITY).unwrap_err().problem, "must be at most 1e9 µs (1,000 s), got inf");
    }

    #[test]
    fn the_timeline_interval_is_from_1e_6_to_1e9_ms() {
        assert!(timeline_interval(1e-6).is_ok());
        assert_eq!(
            timeline_interval(0.0).unwrap_err().to_string(),
            "timeline_interval_ms: must be from 1e-6 to 1e9 ms, got 0"
        );
        assert!(timeline_interval(f64::NAN).is_err());
    }
}
