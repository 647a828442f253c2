//! One rank's scheduler, step by step, on a small case: the log that is
//! compared with vLLM's own scheduler driven on the same case.
//!
//! A case (JSON, the format of the vLLM-oracle driver `vllm_steps.py`):
//!
//! ```json
//! {"max_num_seqs": 8, "max_num_batched_tokens": 32, "num_blocks": 21,
//!  "block_size": 16, "prefix_caching": false,
//!  "requests": [{"id": 0, "arrival_step": 0, "prompt": 64, "output": 30,
//!                "prefix_group": 1, "prefix_tokens": 32}]}
//! ```
//!
//! - `num_blocks` counts vLLM's blocks, its null block (block 0) included,
//!   so the rank's pool has `num_blocks − 1`.
//! - A request with `arrival_step = s` joins the queue before the `s`-th
//!   schedule call (the first is step 0).
//! - Requests of one `prefix_group` share their first `prefix_tokens`
//!   tokens; every other token is unique. Every prompt is named for the
//!   prefix cache, token by token, as vLLM hashes every request's blocks.
//! - `cache_groups` (optional): a hybrid model as a list of pdsim cache
//!   groups (`kind`, `block_size_tokens`, `window_tokens`,
//!   `prefix_cacheable`, `checkpoint_blocks`); absent, one full-attention
//!   group of `block_size`.
//!
//! - vLLM's scheduler options (optional, vLLM's defaults when absent):
//!   `async_scheduling`, `scheduler_reserve_full_isl`,
//!   `long_prefill_token_threshold`, `long_prefill_token_threshold_adaptive`,
//!   `enable_chunked_prefill`, `max_num_active_seqs`, `watermark`,
//!   `policy` (`"fcfs"` or `"priority"`, with a request's `priority`).
//!
//! - `role` (optional): `"aggregated"` (the default) or `"decode"`: a
//!   decode rank of a P/D deployment, whose requests arrive as handoffs
//!   (remote loads, `Scheduler::enqueue_remote`); a schedule call reserves
//!   their blocks, and the KV of one reserved in call `s` lands (is ready)
//!   before call `s + load_steps` (per request, default 1); it then
//!   computes its last prompt token and decodes.
//!
//! The scheduler runs as such a rank would (vLLM's policy, every sequence
//! handled one by one each step), with 1 ms steps. One [`StepLine`] per
//! schedule call, empty steps included so that step numbers line up; a
//! decode case's lines also list the loads each call reserved.

use std::collections::BTreeMap;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use sim_core::{SimDuration, SimTime};

use crate::base::units::{Blocks, Bytes, Tokens};
use crate::deploy::validate::FieldError;
use crate::models::model::{CacheGroupKind, CacheGroupSpec, Model, Role};
use crate::models::steptime::{BatchShape, StepTimeModel};
use crate::requests::request::{ReqId, Request};
use crate::requests::workload::{PrefixIds, mix};
use crate::scheduler::{Finished, Limits, Mode, Reservation, Scheduler, VllmPolicy};
use crate::vllm::engine::EngineLoop;
use crate::vllm::handoff;
use crate::vllm::options::SchedulerOptions;

/// A case.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// Sequences running at once at most.
    pub max_num_seqs: u32,
    /// Tokens computed per step at most.
    pub max_num_batched_tokens: u64,
    /// vLLM's blocks, its null block included.
    pub num_blocks: u64,
    /// Tokens per block (of the one full-attention group when there are no
    /// `cache_groups`).
    pub block_size: u64,
    /// Prefix caching on.
    pub prefix_caching: bool,
    /// The requests.
    pub requests: Vec<CaseRequest>,
    /// A hybrid model's groups.
    #[serde(default)]
    pub cache_groups: Option<Vec<CaseGroup>>,
    /// vLLM's `max_model_len` (the driver's default 8,192); not used by
    /// pdsim's scheduler.
    #[serde(default)]
    pub max_model_len: Option<u64>,
    /// `"aggregated"` (default) or `"decode"`.
    #[serde(default)]
    pub role: Option<String>,
    /// vLLM's `async_scheduling` (default false here: the case format's
    /// first cases were synchronous): the asynchronous engine loop, with
    /// schedule calls and their outputs interleaved as
    /// `EngineCore.step_with_batch_queue` interleaves them.
    #[serde(default)]
    pub async_scheduling: bool,
    /// vLLM's `scheduler_reserve_full_isl` (default true): a waiting
    /// request is admitted only if its whole known sequence fits; false,
    /// if its first chunk does.
    #[serde(default = "yes")]
    pub scheduler_reserve_full_isl: bool,
    /// vLLM's `long_prefill_token_threshold` (default 0, off).
    #[serde(default)]
    pub long_prefill_token_threshold: u64,
    /// vLLM's `long_prefill_token_threshold_adaptive` (default false).
    #[serde(default)]
    pub long_prefill_token_threshold_adaptive: bool,
    /// vLLM's `enable_chunked_prefill` (default true; false needs a
    /// `max_num_batched_tokens` of at least `max_model_len`, as in vLLM).
    #[serde(default = "yes")]
    pub enable_chunked_prefill: bool,
    /// vLLM's `max_num_active_seqs` (default `max_num_seqs`).
    #[serde(default)]
    pub max_num_active_seqs: Option<u32>,
    /// vLLM's `watermark`, a share of `num_blocks` (default 0).
    #[serde(default)]
    pub watermark: f64,
    /// vLLM's `policy`: `"fcfs"` (default) or `"priority"` (the requests'
    /// `priority` fields order the queue and pick preemption victims).
    #[serde(default)]
    pub policy: Option<String>,
}

/// The driver's `max_model_len` when a case gives none.
const DRIVER_MAX_MODEL_LEN: u64 = 8192;

fn yes() -> bool {
    true
}

/// A request of a case.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseRequest {
    /// Its id (unique in the case).
    pub id: u64,
    /// The schedule call it arrives before.
    pub arrival_step: u64,
    /// Prompt tokens.
    pub prompt: u64,
    /// Output tokens.
    pub output: u64,
    /// Requests of one group share their first `prefix_tokens` tokens.
    #[serde(default)]
    pub prefix_group: Option<u64>,
    /// Shared tokens of the group.
    #[serde(default)]
    pub prefix_tokens: Option<u64>,
    /// Its priority (lower first; default 0), read under the priority
    /// policy.
    #[serde(default)]
    pub priority: i32,
    /// A decode case: schedule calls from the one that reserves its
    /// blocks to the one its KV is ready for (default 1).
    #[serde(default)]
    pub load_steps: Option<u64>,
}

/// A cache group of a case (pdsim's group fields; bytes do not matter here).
#[derive(Clone, Debug, Deserialize)]
pub struct CaseGroup {
    /// Its name (optional).
    #[serde(default)]
    pub name: Option<String>,
    /// Its kind.
    pub kind: CacheGroupKind,
    /// Tokens per block.
    pub block_size_tokens: u64,
    /// A window group's window.
    #[serde(default)]
    pub window_tokens: Option<u64>,
    /// Whether its blocks enter the prefix cache.
    pub prefix_cacheable: bool,
    /// A Mamba-type group's prefill checkpoint blocks.
    #[serde(default)]
    pub checkpoint_blocks: Option<u64>,
}

/// One schedule call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepLine {
    /// The call's number, from 0.
    pub step: u64,
    /// (request id, tokens) scheduled, in scheduling order.
    pub batch: Vec<(ReqId, u64)>,
    /// Requests preempted by the call, by id.
    pub preempted: Vec<ReqId>,
    /// Requests that finished once the step was applied, by id.
    pub finished_after: Vec<ReqId>,
    /// A decode case: the remote loads the call reserved, in order (`None`
    /// for an aggregated case).
    pub reserved: Option<Vec<ReqId>>,
}

impl Serialize for StepLine {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Batch<'a>(&'a [(ReqId, u64)]);
        impl Serialize for Batch<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(self.0.len()))?;
                for (id, tokens) in self.0 {
                    m.serialize_entry(&id.to_string(), tokens)?;
                }
                m.end()
            }
        }
        let mut m = s.serialize_map(Some(4 + usize::from(self.reserved.is_some())))?;
        m.serialize_entry("step", &self.step)?;
        m.serialize_entry("batch", &Batch(&self.batch))?;
        m.serialize_entry("preempted", &self.preempted)?;
        m.serialize_entry("finished_after", &self.finished_after)?;
        if let Some(r) = &self.reserved {
            m.serialize_entry("reserved", r)?;
        }
        m.end()
    }
}

/// The case's scheduler options, checked as vLLM checks them.
fn options(case: &Case) -> Result<SchedulerOptions, FieldError> {
    let len = case.max_model_len.unwrap_or(DRIVER_MAX_MODEL_LEN);
    if case.long_prefill_token_threshold > len {
        return Err(FieldError::new("long_prefill_token_threshold", format!("must not exceed max_model_len ({len})")));
    }
    if !case.enable_chunked_prefill && case.max_num_batched_tokens < len {
        return Err(FieldError::new(
            "enable_chunked_prefill",
            format!("false needs max_num_batched_tokens of at least max_model_len ({len}), as vLLM does"),
        ));
    }
    if let Some(n) = case.max_num_active_seqs
        && !(1..=case.max_num_seqs).contains(&n)
    {
        return Err(FieldError::new("max_num_active_seqs", "must be from 1 to max_num_seqs"));
    }
    if !(case.watermark.is_finite() && (0.0..1.0).contains(&case.watermark)) {
        return Err(FieldError::new("watermark", "must be in [0, 1)"));
    }
    Ok(SchedulerOptions {
        reserve_full_isl: case.scheduler_reserve_full_isl,
        long_prefill_token_threshold: case.long_prefill_token_threshold,
        long_prefill_adaptive: case.long_prefill_token_threshold_adaptive,
        chunked_prefill: case.enable_chunked_prefill,
        max_num_active_seqs: case.max_num_active_seqs.map(|n| n as usize),
        watermark_blocks: SchedulerOptions::watermark_blocks_of(case.watermark, case.num_blocks),
        priority: match case.policy.as_deref() {
            None | Some("fcfs") => false,
            Some("priority") => true,
            Some(other) => {
                return Err(FieldError::new("policy", format!("must be \"fcfs\" or \"priority\", got {other:?}")));
            }
        },
    })
}

/// Every step takes 1 ms (only the order of events matters here).
struct OneMs;
impl StepTimeModel for OneMs {
    fn step_time(&self, _: &BatchShape) -> SimDuration {
        SimDuration::from_millis(1)
    }
}

/// The most schedule calls a case may take.
pub const MAX_STEPS: u64 = 1_000_000;

/// Runs `case`; one line per schedule call.
///
/// # Errors
/// A field of the case that cannot be run (named by its path), or a case
/// that has not ended after [`MAX_STEPS`] calls.
pub fn run_case(case: &Case) -> Result<Vec<StepLine>, FieldError> {
    let (model, groups) = groups(case)?;
    if case.num_blocks < 2 {
        return Err(FieldError::new("num_blocks", "must be at least 2 (vLLM keeps block 0 as its null block)"));
    }
    let limits = Limits {
        max_num_batched_tokens: positive("max_num_batched_tokens", case.max_num_batched_tokens)?,
        max_num_seqs: positive("max_num_seqs", u64::from(case.max_num_seqs))? as usize,
    };
    let decode = match case.role.as_deref() {
        None | Some("aggregated") => false,
        Some("decode") => true,
        Some(other) => {
            return Err(FieldError::new("role", format!("must be \"aggregated\" or \"decode\", got {other:?}")));
        }
    };
    let pool = (groups, case.num_blocks - 1, case.prefix_caching);
    let mut sched = Scheduler::new(Mode::Generate, limits, false, pool, Box::new(OneMs), Box::new(VllmPolicy));
    sched.set_lazy_decoding(false);
    sched.set_check_invariants(true);
    sched.set_kv_connector(decode);
    sched.set_options(options(case)?);
    if case.async_scheduling {
        // The case numbers the schedule calls itself: nothing is held back.
        sched.set_engine_loop(EngineLoop::Async, false);
    }

    let mut pending: Vec<(usize, &CaseRequest)> = case.requests.iter().enumerate().collect();
    let mut seen = BTreeMap::new();
    for (i, r) in &pending {
        let at = |f: &str| format!("requests[{i}].{f}");
        if seen.insert(r.id, *i).is_some() {
            return Err(FieldError::new(at("id"), format!("{} is used twice", r.id)));
        }
        positive(&at("prompt"), r.prompt)?;
        positive(&at("output"), r.output)?;
        if !case.enable_chunked_prefill
            && r.prompt.saturating_add(r.output) >= case.max_model_len.unwrap_or(DRIVER_MAX_MODEL_LEN)
        {
            // (It could never be scheduled whole: vLLM refuses it.)
            return Err(FieldError::new(
                at("prompt"),
                "with chunked prefill off, prompt + output must be below max_model_len",
            ));
        }
        if r.prefix_tokens.unwrap_or(0) > r.prompt {
            return Err(FieldError::new(at("prefix_tokens"), "must not exceed the prompt"));
        }
        match (decode, r.load_steps) {
            (false, Some(_)) => return Err(FieldError::new(at("load_steps"), "only in a decode case")),
            (true, Some(0)) => return Err(FieldError::new(at("load_steps"), "must be at least 1")),
            _ => {}
        }
    }
    let load_steps: BTreeMap<ReqId, u64> = case.requests.iter().map(|r| (r.id, r.load_steps.unwrap_or(1))).collect();
    // Reserved loads by the call their KV is ready for.
    let mut landing: BTreeMap<u64, Vec<(Box<Request>, Reservation)>> = BTreeMap::new();
    let mut reserved = Vec::new();
    pending.sort_by_key(|&(_, r)| (std::cmp::Reverse(r.arrival_step), std::cmp::Reverse(r.id)));

    if case.async_scheduling {
        return run_async(&mut sched, &mut pending, decode.then_some((&model, &load_steps)));
    }
    let mut lines = Vec::new();
    let (mut now, mut step, mut in_flight) = (SimTime::ZERO, 0u64, 0usize);
    let mut done = Vec::new();
    while !pending.is_empty() || in_flight > 0 {
        if step >= MAX_STEPS {
            return Err(FieldError::new("requests", format!("the case has not ended after {MAX_STEPS} steps")));
        }
        for (req, reservation) in landing.remove(&step).unwrap_or_default() {
            sched.enqueue_landed(req, reservation, now);
        }
        while let Some(&(_, r)) = pending.last()
            && r.arrival_step <= step
        {
            pending.pop();
            arrive(&mut sched, r, decode.then_some(&model), now);
            in_flight += 1;
        }
        let mut line = StepLine {
            step,
            batch: Vec::new(),
            preempted: Vec::new(),
            finished_after: Vec::new(),
            reserved: decode.then(Vec::new),
        };
        let planned = sched.start_one_step(now, SimTime::MAX, |r| &mut r.t.prefill_started);
        sched.take_reserved(&mut reserved);
        // (A handoff computed here is in the batch; its source is the
        // prefill's business, which a case does not model.)
        sched.take_computed_locally(&mut Vec::new());
        for (req, _hit, reservation) in reserved.drain(..) {
            line.reserved.as_mut().expect("a decode case").push(req.id);
            landing.entry(step + load_steps[&req.id]).or_default().push((req, reservation));
        }
        sched.take_preempted(&mut line.preempted);
        line.preempted.sort_unstable();
        if let Some(dt) = planned {
            line.batch.extend(sched.scheduled());
            now += dt;
            sched.finish_step(now, &mut done);
            for f in done.drain(..) {
                let Finished::Completed(r) = f else { unreachable!("a generating rank") };
                line.finished_after.push(r.id);
            }
        } else {
            now += SimDuration::from_millis(1);
        }
        // A request that can never fit, even alone, ends (vLLM would wait
        // for ever).
        while let Some((r, _)) = sched.take_stuck() {
            line.finished_after.push(r.id);
        }
        in_flight -= line.finished_after.len();
        line.finished_after.sort_unstable();
        lines.push(line);
        step += 1;
    }
    Ok(lines)
}

/// [`run_case`] with the asynchronous engine loop: vLLM's
/// `EngineCore.step_with_batch_queue` with a queue of two batches, emulated
/// call for call. Each iteration takes the requests of the next schedule
/// call in; then, if anything is unfinished or a finished request is still
/// to be reported, it is a schedule call: the step planned by the call
/// before it is finished (its outputs, as the placeholders count them) and
/// the call plans its step, after which the sequences that finished in the
/// step before leave (vLLM applies that step's outputs after this call).
/// A call's line is written once the outputs of its step are applied (its
/// `finished_after`), as vLLM writes it; with nothing to do the engine
/// waits for the next request.
///
/// A decode case's remote loads land as `vllm_pd_steps.py` reports them:
/// a load reserved by call `r` with `load_steps` k is reported in the
/// outputs of call `r + k - 1`, which vLLM applies after call `r + k`, so
/// it may be scheduled from call `r + k + 1` on.
fn run_async(
    sched: &mut Scheduler,
    pending: &mut Vec<(usize, &CaseRequest)>,
    decode: Option<(&Model, &BTreeMap<ReqId, u64>)>,
) -> Result<Vec<StepLine>, FieldError> {
    let mut lines: Vec<StepLine> = Vec::new();
    let (mut now, mut step, mut in_flight) = (SimTime::ZERO, 0u64, 0usize);
    let (mut planned, mut unreported, mut open) = (None::<SimDuration>, false, None::<usize>);
    let mut done = Vec::new();
    let mut landing: BTreeMap<u64, Vec<(Box<Request>, Reservation)>> = BTreeMap::new();
    let mut reserved = Vec::new();
    loop {
        if step >= MAX_STEPS {
            return Err(FieldError::new("requests", format!("the case has not ended after {MAX_STEPS} steps")));
        }
        for (req, reservation) in landing.remove(&step).unwrap_or_default() {
            sched.enqueue_landed(req, reservation, now);
        }
        while let Some(&(_, r)) = pending.last()
            && r.arrival_step <= step
        {
            pending.pop();
            arrive(sched, r, decode.map(|(m, _)| m), now);
            in_flight += 1;
        }
        if in_flight == 0 && !unreported {
            // Nothing to schedule: the queue drains, then the engine waits.
            match pending.last() {
                Some(&(_, r)) => {
                    step = step.max(r.arrival_step);
                    continue;
                }
                None => break,
            }
        }
        // The step the last call planned: its outputs, counted ahead.
        if let Some(dt) = planned.take() {
            now += dt;
            sched.finish_step(now, &mut done);
            debug_assert!(done.is_empty(), "the asynchronous loop's finished sequences leave after the next call");
        }
        let mut line = StepLine {
            step,
            batch: Vec::new(),
            preempted: Vec::new(),
            finished_after: Vec::new(),
            reserved: decode.map(|_| Vec::new()),
        };
        planned = sched.start_one_step(now, SimTime::MAX, |r| &mut r.t.prefill_started);
        if let Some((_, load_steps)) = decode {
            sched.take_reserved(&mut reserved);
            sched.take_computed_locally(&mut Vec::new());
            for (req, _hit, reservation) in reserved.drain(..) {
                line.reserved.as_mut().expect("a decode case").push(req.id);
                landing.entry(step + load_steps[&req.id] + 1).or_default().push((req, reservation));
            }
        }
        if planned.is_some() {
            line.batch.extend(sched.scheduled());
        } else {
            now += SimDuration::from_millis(1);
        }
        sched.take_preempted(&mut line.preempted);
        line.preempted.sort_unstable();
        // This call reports what finished before it; what finished in the
        // step before it leaves now, in the line of the call that planned it.
        unreported = false;
        sched.take_released(&mut done);
        let left: Vec<ReqId> = done.drain(..).map(|f| finished_id(&f)).collect();
        if !left.is_empty() {
            let at = open.expect("a finished sequence was planned by an earlier call");
            lines[at].finished_after.extend(&left);
            lines[at].finished_after.sort_unstable();
            in_flight -= left.len();
            unreported = true;
        }
        // A request that can never fit, even alone, ends (vLLM would wait
        // for ever).
        while let Some((r, _)) = sched.take_stuck() {
            line.finished_after.push(r.id);
            in_flight -= 1;
        }
        line.finished_after.sort_unstable();
        open = Some(lines.len());
        lines.push(line);
        step += 1;
    }
    Ok(lines)
}

/// Queues the case's request `r`: on a decode case (`model` given) as a
/// remote load of the tokens the prefill computed (every prompt token, or
/// for a Mamba-type model all but the last). It arrives at its step's
/// millisecond (vLLM's driver gives it its step as its arrival time),
/// whatever the runner's clock says (the asynchronous one's lags a step
/// behind the call count after a step ran).
fn arrive(sched: &mut Scheduler, r: &CaseRequest, model: Option<&Model>, now: SimTime) {
    match model {
        Some(model) => {
            let mut req = request(r);
            req.transferred_tokens = handoff::transferred_tokens(model, req.prompt);
            let arrival = req.t.arrival;
            sched.enqueue_remote(req, arrival);
        }
        None => sched.enqueue(request(r), Tokens::ZERO, now),
    }
}

/// The id of a finished sequence's request.
fn finished_id(f: &Finished) -> ReqId {
    match f {
        Finished::Completed(r) | Finished::Prefilled { req: r, .. } => r.id,
    }
}

fn positive(field: &str, v: u64) -> Result<u64, FieldError> {
    if v == 0 { Err(FieldError::new(field, "must be at least 1")) } else { Ok(v) }
}

/// The case's groups as pdsim cache groups (one full-attention group of
/// `block_size` when it names none).
fn groups(case: &Case) -> Result<(Model, Vec<crate::models::model::CacheGroup>), FieldError> {
    let one;
    let list: &[CaseGroup] = match &case.cache_groups {
        Some(g) if !g.is_empty() => g,
        Some(_) => return Err(FieldError::new("cache_groups", "must name at least one group")),
        None => {
            positive("block_size", case.block_size)?;
            one = [CaseGroup {
                name: Some("full attention".into()),
                kind: CacheGroupKind::FullAttention,
                block_size_tokens: case.block_size,
                window_tokens: None,
                prefix_cacheable: true,
                checkpoint_blocks: None,
            }];
            &one
        }
    };
    let cache_groups = list
        .iter()
        .enumerate()
        .map(|(i, g)| CacheGroupSpec {
            name: g.name.clone().unwrap_or_else(|| format!("group {i}")),
            kind: g.kind,
            block_size_tokens: Tokens::new(g.block_size_tokens),
            page_bytes: Bytes::new(1),
            transfer_bytes_per_block: Some(Bytes::new(1)),
            prefix_cacheable: Some(g.prefix_cacheable),
            window_tokens: g.window_tokens.map(Tokens::new),
            checkpoint_blocks: g.checkpoint_blocks.map(Blocks::new),
            heads: None,
        })
        .collect();
    // The groups together pass the gate `pdsim run` applies (full-attention
    // groups of one block size, say): what it refuses, a case cannot run.
    let spec = crate::models::model::ModelSpec { cache_groups, ..Default::default() };
    match spec.validate(Role::Aggregated) {
        Ok(Model::Grouped(m)) => {
            let groups = m.groups().to_vec();
            Ok((Model::Grouped(m), groups))
        }
        Ok(Model::Linear(_)) => unreachable!("a model of cache groups is grouped"),
        Err(e) => {
            let field = match e.location {
                crate::models::model::Location::Group { index, .. } => format!("cache_groups[{index}].{}", e.field()),
                crate::models::model::Location::Model => "cache_groups".to_owned(),
            };
            Err(FieldError::new(field, e.problem.to_string()))
        }
    }
}

/// The request: every token named (shared tokens of its group alike
/// across the group, the rest unique), as vLLM hashes its blocks.
/// The request `r`, arriving at its step's millisecond (as vLLM's driver
/// gives it its step as its arrival time: the priority policy orders by
/// it, and the asynchronous loop's clock is not the step count).
fn request(r: &CaseRequest) -> Box<Request> {
    let now = SimTime::ZERO + SimDuration::from_millis(r.arrival_step);
    let shared = r.prefix_group.map_or(0, |_| r.prefix_tokens.unwrap_or(0));
    let group = r.prefix_group.unwrap_or(0);
    let ids = (0..r.prompt)
        .map(|i| if i < shared { mix(0x5eed_0000 ^ group, i) } else { mix(0xfeed_0000_0000 ^ r.id, i) })
        .collect();
    let prefix = PrefixIds { block_tokens: Tokens::new(1), ids };
    let mut req = Request::new(r.id, Tokens::new(r.prompt), Tokens::new(r.output), prefix, now);
    req.priority = r.priority;
    Box::new(req)
}
