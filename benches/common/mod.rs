//! The end-to-end benchmark's cases, shared with the `actors` test that
//! pins their digests (so a refactoring that changes a result is caught,
//! and the benchmark measures the same runs before and after).
//!
//! Shape: 1,024 prompt / 128 output tokens, a closed loop at concurrency 16,
//! 10,000 requests; a Llama-3.1-8B-like linear model at TP 4 (32,768 KV
//! bytes per token per rank) aggregated and 1P1D, and the GLM-like hybrid
//! 1P1D.

use actors::config::{DeploymentSpec, LinkSpec, RoleSpec, SloSpec, StepTimeSpec};
use actors::model::{CacheGroupKind, CacheGroupSpec, ModelSpec};
use actors::sim::RunInput;
use actors::units::{Blocks, Bytes, Tokens};
use actors::workload::{ArrivalMode, PrefixIds, RequestSpec};
use sim_core::SimTime;

/// Requests per run.
pub const REQUESTS: u64 = 10_000;

fn role(num_blocks: u64, fixed_us: f64, per_token_us: f64) -> RoleSpec {
    RoleSpec {
        tp: Some(4),
        num_blocks: Some(num_blocks),
        step_time: StepTimeSpec::Linear { fixed_us, per_token_us, per_seq_us: 0.0, per_context_token_us: 0.001 },
        ..RoleSpec::default()
    }
}

fn deployment(vllm: Option<&str>, roles: (Option<RoleSpec>, Option<RoleSpec>, Option<RoleSpec>)) -> DeploymentSpec {
    DeploymentSpec {
        vllm_version: vllm.map(str::to_owned),
        prefill: roles.0,
        decode: roles.1,
        aggregated: roles.2,
        link: LinkSpec { bandwidth_gb_s: 50.0, ..LinkSpec::default() },
        router: Default::default(),
        faults: Default::default(),
        frontend: Default::default(),
        timeline_interval_ms: 100.0,
        check_invariants: false,
        hardware: None,
    }
}

fn llama() -> ModelSpec {
    ModelSpec { kv_bytes_per_token: Some(Bytes::new(32_768)), ..Default::default() }
}

fn glm() -> ModelSpec {
    let g = |name: &str, kind, transfer: u64, cacheable: bool, ckpt: u64| CacheGroupSpec {
        name: name.into(),
        kind,
        block_size_tokens: Tokens::new(2_176),
        page_bytes: Bytes::new(13_045_120),
        transfer_bytes_per_block: Some(Bytes::new(transfer)),
        prefix_cacheable: Some(cacheable),
        window_tokens: None,
        checkpoint_blocks: Some(Blocks::new(ckpt)),
        heads: None,
    };
    let fa = CacheGroupKind::FullAttention;
    let st = CacheGroupKind::State;
    ModelSpec {
        cache_groups: vec![
            g("full attention", fa, 13_045_120, true, 0),
            g("tail ring", st, 22_528, false, 0),
            g("kda 0", st, 9_768_960, true, 1),
            g("kda 1", st, 9_768_960, true, 1),
            g("kda 2", st, 8_683_520, true, 1),
            g("kda 3", st, 8_683_520, true, 1),
        ],
        ..Default::default()
    }
}

/// The closed-loop workload of every case.
pub fn workload() -> RunInput {
    let spec = RequestSpec {
        arrival: SimTime::ZERO,
        prompt: Tokens::new(1_024),
        output: Tokens::new(128),
        prefix: PrefixIds::none(),
        priority: 0,
    };
    RunInput {
        seed: 1,
        source: Box::new(std::iter::repeat_n(spec, REQUESTS as usize)),
        arrivals: ArrivalMode::Closed { concurrency: 16 },
        max_requests: None,
        slo: SloSpec::default(),
        until: None,
    }
}

/// The benchmark's deployments: (name, model, deployment).
pub fn cases() -> [(&'static str, ModelSpec, DeploymentSpec); 3] {
    [
        ("llama8b_aggregated", llama(), deployment(None, (None, None, Some(role(20_000, 6_000.0, 40.0))))),
        (
            "llama8b_1p1d",
            llama(),
            deployment(None, (Some(role(20_000, 6_000.0, 40.0)), Some(role(20_000, 6_000.0, 40.0)), None)),
        ),
        (
            "glm_hybrid_1p1d",
            glm(),
            deployment(Some("0.32.0"), (Some(role(2_000, 8_000.0, 60.0)), Some(role(2_000, 8_000.0, 60.0)), None)),
        ),
    ]
}
