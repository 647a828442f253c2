//! The deployment a simulation runs: ranks, link, router, faults and SLOs.
//!
//! These are plain data with serde derives so that the harness can read them
//! from scenario files (unknown fields refused); this crate never touches a
//! file. [`crate::deploy::sim::Deployment::build`] checks them with
//! [`crate::deploy::validate`] and reports the first problem with the field's path.

use serde::{Deserialize, Serialize};

use crate::base::units::Tokens;
use crate::vllm::options::SchedulerOptions;

pub use crate::models::steptime::{DecodeGrid, MixedStep, StepTimeSpec};
pub use crate::serving::link::Sharing;
pub use crate::serving::router::Policy;
pub use crate::stats::slo::SloSpec;

/// Everything about a deployment except the model and the workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentSpec {
    /// vLLM version of every rank unless a role names its own.
    #[serde(default)]
    pub vllm_version: Option<String>,
    /// Prefill ranks of a disaggregated deployment.
    #[serde(default)]
    pub prefill: Option<RoleSpec>,
    /// Decode ranks of a disaggregated deployment.
    #[serde(default)]
    pub decode: Option<RoleSpec>,
    /// Ranks that prefill and decode with no handoff (the baseline). Exclusive
    /// with `prefill`/`decode`.
    #[serde(default)]
    pub aggregated: Option<RoleSpec>,
    /// The KV link between prefill and decode ranks.
    #[serde(default)]
    pub link: LinkSpec,
    /// How requests are spread over ranks.
    #[serde(default)]
    pub router: RouterSpec,
    /// Failures and the source hold.
    #[serde(default)]
    pub faults: FaultSpec,
    /// The API server between the clients and the engines (absent fields:
    /// the vLLM version's).
    #[serde(default)]
    pub frontend: FrontEndSpec,
    /// No longer has an effect: the timeline records every change at its
    /// instant. Accepted (from 1e-6 to 1e9 ms) so that older files load.
    #[serde(default = "default_sample_ms")]
    pub timeline_interval_ms: f64,
    /// Check the conservation invariants after every scheduler step (slower).
    #[serde(default)]
    pub check_invariants: bool,
    /// The GPU every rank runs on (a preset's numbers, filled in by the
    /// harness, or the user's): needed by the roofline step time and by KV
    /// capacity from GPU memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<crate::models::hardware::HardwareSpec>,
}

fn default_sample_ms() -> f64 {
    100.0
}

/// The ranks of one role: all alike.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleSpec {
    /// How many ranks (data-parallel replicas) of this role.
    #[serde(default = "one")]
    pub count: u32,
    /// Tensor-parallel size of one rank. The model's byte counts are
    /// derived at it when the model gives its own `tp` (the size its counts
    /// are for); absent, the model's `tp` (or 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<u32>,
    /// Blocks in the rank's KV pool, shared by every cache group. Absent:
    /// what the GPU's memory leaves once the weights are loaded, as vLLM
    /// sizes it ([`crate::models::arch::memory`]; needs the model's `arch` and the
    /// deployment's `[hardware]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_blocks: Option<u64>,
    /// The share of GPU memory the rank may use (vLLM's
    /// `--gpu-memory-utilization`, default 0.9), when `num_blocks` is
    /// derived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_utilization: Option<f64>,
    /// Token budget of one scheduler step.
    #[serde(default = "default_batched_tokens")]
    pub max_num_batched_tokens: u64,
    /// Most sequences in one step.
    #[serde(default = "default_num_seqs")]
    pub max_num_seqs: u32,
    /// Block size of a linear model's pool (grouped models carry their own).
    #[serde(default)]
    pub block_size_tokens: Option<Tokens>,
    /// The longest sequence a rank serves (vLLM's `--max-model-len`, whose
    /// default is the model's `max_position_embeddings`): as vLLM, a rank
    /// refuses a request whose prompt leaves no room for an output token
    /// (prompt >= max_model_len; it fails when it arrives), and stops one
    /// whose output would run past the limit there (its output is capped
    /// at `max_model_len − prompt`). Absent: the model's
    /// `arch.max_position_embeddings` when it gives its layers (as vLLM),
    /// else no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<Tokens>,
    /// Whether the pool keeps a prefix cache.
    #[serde(default = "yes")]
    pub prefix_caching: bool,
    /// vLLM version of this role (overrides the deployment's).
    #[serde(default)]
    pub vllm_version: Option<String>,
    /// vLLM's `--async-scheduling`: a step is scheduled while the one before
    /// it executes, so a request that arrives during a step is first
    /// scheduled two steps later, and a finished request frees its blocks
    /// one schedule call later (`actors/src/vllm/engine.rs`). Absent: the
    /// version's default (on, in every version pdsim knows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub async_scheduling: Option<bool>,
    /// vLLM's `--scheduler-reserve-full-isl` (default true): a waiting
    /// request is admitted only if its whole known sequence (its prompt,
    /// and after a preemption its output so far) fits in the free blocks;
    /// false, if its first chunk does, so a long prompt may start in a
    /// pool it cannot finish in and be preempted (`actors/src/vllm/admission.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_reserve_full_isl: Option<bool>,
    /// vLLM's `--long-prefill-token-threshold` (default 0, off): a step
    /// gives one request at most this many tokens (a long prompt is
    /// computed in chunks of it), unless it is the only request running or
    /// waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_prefill_token_threshold: Option<u64>,
    /// vLLM's `--long-prefill-token-threshold-adaptive` (default false): the
    /// threshold is raised to `max_num_batched_tokens` over the requests
    /// running and waiting when that is larger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_prefill_token_threshold_adaptive: Option<bool>,
    /// vLLM's `--enable-chunked-prefill` (default true): false, a prompt is
    /// scheduled whole or waits (and, as vLLM, `max_num_batched_tokens`
    /// must be at least `max_model_len`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_chunked_prefill: Option<bool>,
    /// vLLM's `--max-num-active-seqs` (default: `max_num_seqs`): admission
    /// stops once this many requests run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_active_seqs: Option<u32>,
    /// vLLM's `--watermark`, a share of the pool in [0, 1) (default 0): an
    /// admission must leave that many blocks free while a request runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<f64>,
    /// vLLM's `--scheduling-policy` (default `"fcfs"`): `"priority"` serves
    /// waiting requests in order of their `priority` (lower first; a
    /// trace's `priority` field, 0 by default), then arrival, and preempts
    /// the lowest-priority running request (`actors/src/vllm/options.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<SchedulingPolicy>,
    /// The forward-pass time of one step.
    pub step_time: StepTimeSpec,
}

/// vLLM's scheduling policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulingPolicy {
    /// First come, first served (vLLM's default).
    Fcfs,
    /// By request priority, then arrival.
    Priority,
}

fn one() -> u32 {
    1
}

impl Default for RoleSpec {
    /// One rank with vLLM's defaults (a token budget of 8,192, 256
    /// sequences, prefix caching on), its pool sized from GPU memory and
    /// its steps priced by the roofline: what a role table gives with only
    /// its `step_time` set to `{ kind = "roofline" }`.
    fn default() -> Self {
        RoleSpec {
            count: one(),
            tp: None,
            num_blocks: None,
            gpu_memory_utilization: None,
            max_num_batched_tokens: default_batched_tokens(),
            max_num_seqs: default_num_seqs(),
            block_size_tokens: None,
            max_model_len: None,
            prefix_caching: yes(),
            vllm_version: None,
            async_scheduling: None,
            scheduler_reserve_full_isl: None,
            long_prefill_token_threshold: None,
            long_prefill_token_threshold_adaptive: None,
            enable_chunked_prefill: None,
            max_num_active_seqs: None,
            watermark: None,
            policy: None,
            step_time: StepTimeSpec::Roofline(Default::default()),
        }
    }
}

impl RoleSpec {
    /// The rank's TP size under `model`: its own `tp`, else the model's,
    /// else 1.
    pub fn tp_under(&self, model: &crate::models::model::ModelSpec) -> u32 {
        self.tp.or(model.tp).unwrap_or(1)
    }

    /// vLLM's scheduler options as the role gives them, each absent one at
    /// vLLM's default, for a pool of `num_blocks` blocks (vLLM's count, a
    /// block more with its null block, is what the watermark is a share of).
    pub fn scheduler_options(&self, num_blocks: u64) -> SchedulerOptions {
        let d = SchedulerOptions::default();
        SchedulerOptions {
            reserve_full_isl: self.scheduler_reserve_full_isl.unwrap_or(d.reserve_full_isl),
            long_prefill_token_threshold: self.long_prefill_token_threshold.unwrap_or(0),
            long_prefill_adaptive: self.long_prefill_token_threshold_adaptive.unwrap_or(d.long_prefill_adaptive),
            chunked_prefill: self.enable_chunked_prefill.unwrap_or(d.chunked_prefill),
            max_num_active_seqs: self.max_num_active_seqs.map(|n| n as usize),
            watermark_blocks: SchedulerOptions::watermark_blocks_of(
                self.watermark.unwrap_or(0.0),
                num_blocks.saturating_add(1),
            ),
            priority: self.policy == Some(SchedulingPolicy::Priority),
        }
    }
}
fn yes() -> bool {
    true
}
fn default_batched_tokens() -> u64 {
    8192
}
fn default_num_seqs() -> u32 {
    256
}

/// The KV link between prefill and decode ranks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// Bandwidth of one link, GB/s (10^9 bytes per second).
    #[serde(default = "default_bandwidth")]
    pub bandwidth_gb_s: f64,
    /// Fixed latency of one transfer, µs (not shared).
    #[serde(default)]
    pub latency_us: f64,
    /// How concurrent transfers share a link's bandwidth.
    #[serde(default)]
    pub sharing: Sharing,
    /// One link per prefill/decode pair, or one link for all.
    #[serde(default)]
    pub topology: LinkTopology,
}

fn default_bandwidth() -> f64 {
    50.0
}

impl Default for LinkSpec {
    fn default() -> Self {
        LinkSpec {
            bandwidth_gb_s: default_bandwidth(),
            latency_us: 0.0,
            sharing: Sharing::default(),
            topology: LinkTopology::default(),
        }
    }
}

/// Which links exist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkTopology {
    /// A link per (prefill rank, decode rank) pair.
    #[default]
    PerPair,
    /// One link that every transfer shares.
    Shared,
}

/// Routing policies.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterSpec {
    /// Policy for prefill (or aggregated) ranks.
    #[serde(default)]
    pub prefill_policy: Policy,
    /// Policy for decode ranks.
    #[serde(default)]
    pub decode_policy: Policy,
    /// `kv_aware`'s weight of a prompt token a rank would have to compute
    /// (not in its cache) against one token of load it already has
    /// outstanding (default 1): it sends a request where
    /// `weight × uncached prompt tokens + outstanding tokens` is least.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_overlap_weight: Option<f64>,
}

/// vLLM's API server in front of the engines, as fixed times a request
/// spends crossing it ([`crate::model::FrontEnd`]); each absent field takes
/// the version's default ([`crate::model::DEFAULT_FRONT_END`], 3.6 ms each
/// way). Zero for both prices the engines alone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontEndSpec {
    /// From a request's arrival at the server to the engine core's input
    /// queue (HTTP, tokenizing, the hand-off to the engine core), µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_us: Option<f64>,
    /// From a step's outputs leaving the engine core to the client's
    /// stream (detokenizing, the response chunk), µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_us: Option<f64>,
}

impl FrontEndSpec {
    /// No time in the API server: the engines alone, a request's times
    /// those of its engine core.
    pub fn none() -> Self {
        FrontEndSpec { request_us: Some(0.0), response_us: Some(0.0) }
    }
}

/// Failures and the source hold.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// Chance that a decode rank aborts a handoff when asked to reserve it
    /// (the source is then cancelled).
    #[serde(default)]
    pub decode_abort_probability: f64,
    /// Hold sources for a fixed time instead of under a lease, seconds: a
    /// source with no answer is freed this long after it was held, even if
    /// its decode rank is alive but backed up. Not vLLM's behaviour (it
    /// holds under a lease); for what-if studies. Not with `source_lease_s`.
    #[serde(default)]
    pub source_hold_s: Option<f64>,
    /// The lease sources are held under, seconds (default: the vLLM
    /// version's `kv_lease_duration`, 30 s on 0.31.0 to 0.33.0): the decode rank that accepted a handoff renews it every
    /// lease/6 with a heartbeat that moves the expiry to at least 2/3 of a
    /// lease ahead, so a source expires only once its decode rank has gone
    /// silent. Not with `source_hold_s`.
    #[serde(default)]
    pub source_lease_s: Option<f64>,
    /// Decode ranks that crash: at `at_s` the rank stops, silently. Its
    /// requests fail, the router stops sending it work, and the sources it
    /// was to release stay held on the prefill ranks until their hold (or
    /// lease) runs out.
    #[serde(default)]
    pub decode_crashes: Vec<CrashSpec>,
}

/// A decode rank that crashes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrashSpec {
    /// Index of the decode rank, from 0.
    pub rank: u32,
    /// When, seconds of simulated time.
    pub at_s: f64,
}
