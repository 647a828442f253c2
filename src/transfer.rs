//! One KV handoff priced without simulating anything (`pdsim transfer`):
//! a prompt's payload under a scenario's model, by the transfer rules of
//! `actors::rules`, and its delay on the scenario's link.

use actors::model::{DEFAULT_LINEAR_BLOCK_SIZE, Model};
use actors::rules::{Payload, RuleError, payload};
use actors::tp::Reads;
use actors::units::{Bandwidth, Bytes, Link, Tokens};
use serde::Serialize;
use sim_core::SimDuration;

use crate::scenario::Scenario;

/// An argument refused: which one (`prompt_tokens`, or a scenario field
/// such as `link.bandwidth_gb_s`) and why. The command line names it as
/// its flag, the Python package as its keyword.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{arg}: {problem}")]
pub struct ArgError {
    /// The argument, snake_case, or the dotted scenario field.
    pub arg: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl ArgError {
    /// `arg` refused for `problem`.
    pub fn new(arg: &'static str, problem: impl Into<String>) -> Self {
        ArgError { arg, problem: problem.into() }
    }

    /// The argument as a command-line flag (`--prompt-tokens`); a scenario
    /// field stays as it is.
    pub fn flag(&self) -> String {
        if self.arg.contains('.') { self.arg.to_owned() } else { format!("--{}", self.arg.replace('_', "-")) }
    }
}

/// One handoff priced: what `pdsim transfer --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Transfer {
    /// The scenario, as named.
    pub scenario: String,
    /// The model's name, if it has one.
    pub model: Option<String>,
    /// `blocks` (grouped model) or `tokens` (linear model).
    pub units: &'static str,
    /// N: the prompt tokens of the request.
    pub prompt_tokens: u64,
    /// K: leading prompt tokens the decode rank's prefix cache holds.
    pub decode_cached_tokens: u64,
    /// The hit the decode rank serves: min(K, N − 1) rounded down to the
    /// groups' block sizes.
    pub decode_hit_tokens: u64,
    /// T: tokens the prefill computes and hands off.
    pub transferred_tokens: u64,
    /// Bytes one decode TP rank reads.
    pub payload_bytes: u64,
    /// The prefill ranks' TP size.
    pub prefill_tp: u32,
    /// The decode ranks' TP size.
    pub decode_tp: u32,
    /// Prefill TP ranks one decode TP rank reads from.
    pub prefill_ranks_read: u32,
    /// Bytes over the busiest NIC: `payload_bytes` times the decode ranks
    /// reading from one prefill rank (`decode_tp / prefill_tp` when larger
    /// than 1); the delay is priced on these.
    pub link_bytes: u64,
    /// Bytes of the window and state groups (0 for a linear model).
    pub fixed_bytes: u64,
    /// The decode rank's hit covers every token handed off (a Mamba-type
    /// model's notification only: nothing moves).
    pub full_decode_hit: bool,
    /// Per cache group, its blocks and bytes (empty for a linear model).
    pub groups: Vec<GroupRow>,
    /// Tokens whose KV moves, in whole blocks (linear model only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Blocks that move (linear model only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u64>,
    /// The link bandwidth priced, GB/s (10^9 bytes/s).
    pub bandwidth_gb_s: f64,
    /// The link's latency, µs.
    pub latency_us: f64,
    /// The handoff's delay on an idle link, ns: latency + link bytes / bandwidth.
    pub delay_ns: u64,
    /// The delay in ms.
    pub delay_ms: f64,
}

/// One cache group's share of a grouped handoff.
#[derive(Clone, Debug, Serialize)]
pub struct GroupRow {
    /// The group's name.
    pub name: String,
    /// Its kind (`full_attention`, `sliding_window`, `convolution`, `state`).
    pub kind: &'static str,
    /// Blocks that move.
    pub blocks: u64,
    /// Bytes that move (blocks × transfer bytes per block).
    pub bytes: u64,
}

/// Prices the handoff of a `prompt_tokens`-token prompt of which the
/// decode rank's cache holds the first `decode_cached_tokens`, on the
/// scenario's link (at `bandwidth_gb_s` when given), and returns it with the
/// model it was priced with (a linear model at the decode rank's block size).
///
/// # Errors
/// A count out of range (no tokens, more cached than the prompt), or a
/// bandwidth that is not a positive number.
pub fn price(
    scenario: &Scenario,
    prompt_tokens: u64,
    decode_cached_tokens: u64,
    bandwidth_gb_s: Option<f64>,
) -> Result<(Transfer, Model), ArgError> {
    let n = prompt_tokens;
    let k = decode_cached_tokens;
    if n == 0 {
        return Err(ArgError::new("prompt_tokens", "must be >= 1, got 0"));
    }
    if k > n {
        return Err(ArgError::new("decode_cached_tokens", format!("{k} exceeds the prompt's {n} tokens")));
    }
    let link_spec = &scenario.deployment().link;
    let (gb_s, arg) = match bandwidth_gb_s {
        Some(x) => (x, "bandwidth_gb_s"),
        None => (link_spec.bandwidth_gb_s, "link.bandwidth_gb_s"),
    };
    let bandwidth = Bandwidth::parse_gb_per_s(gb_s).map_err(|why| ArgError::new(arg, why))?;
    let link = Link { latency: SimDuration::from_secs_f64(link_spec.latency_us / 1e6), bandwidth };
    // A linear model moves whole blocks of the decode rank's block size; the
    // model's bytes are the decode rank's (at its TP size).
    let dep = scenario.deployment();
    let (prefill_tp, decode_tp) = match (&dep.prefill, &dep.decode) {
        (Some(p), Some(d)) => (p.tp_under(scenario.model_spec()), d.tp_under(scenario.model_spec())),
        _ => (1, 1),
    };
    let reads = Reads::for_model(scenario.model_spec(), prefill_tp, decode_tp);
    let block = dep.decode.as_ref().or(dep.aggregated.as_ref()).and_then(|r| r.block_size_tokens);
    let model = scenario.model().clone().with_block_size(block.unwrap_or(DEFAULT_LINEAR_BLOCK_SIZE));
    let p = payload(&model, Tokens::new(n), Tokens::new(k)).map_err(|e| match e {
        RuleError::HitExceedsPrompt { .. } => ArgError::new("decode_cached_tokens", e.to_string()),
        _ => ArgError::new("prompt_tokens", e.to_string()),
    })?;
    // The busiest NIC: a prefill rank sends what each of its readers takes.
    let link_bytes = Bytes::new(p.bytes().get().saturating_mul(u64::from(reads.readers)));
    let delay = link.delay(link_bytes);
    let report = Transfer {
        scenario: scenario.source().to_owned(),
        model: model.name().map(str::to_owned),
        units: match p {
            Payload::Tokens(_) => "tokens",
            Payload::Blocks(_) => "blocks",
        },
        prompt_tokens: n,
        decode_cached_tokens: k,
        decode_hit_tokens: match &p {
            Payload::Tokens(t) => t.hit_tokens().get(),
            Payload::Blocks(b) => b.hit_tokens().get(),
        },
        transferred_tokens: p.transferred_tokens().get(),
        payload_bytes: p.bytes().get(),
        prefill_tp,
        decode_tp,
        prefill_ranks_read: reads.sources,
        link_bytes: link_bytes.get(),
        fixed_bytes: match &p {
            Payload::Tokens(_) => 0,
            Payload::Blocks(b) => b.fixed_bytes().get(),
        },
        full_decode_hit: match &p {
            Payload::Tokens(_) => false,
            Payload::Blocks(b) => b.full_decode_hit(),
        },
        groups: match &p {
            Payload::Tokens(_) => Vec::new(),
            Payload::Blocks(b) => b
                .groups()
                .iter()
                .map(|g| GroupRow {
                    name: g.name().to_owned(),
                    kind: g.kind().as_str(),
                    blocks: g.blocks().get(),
                    bytes: g.bytes().get(),
                })
                .collect(),
        },
        tokens: match &p {
            Payload::Tokens(t) => Some(t.tokens().get()),
            Payload::Blocks(_) => None,
        },
        blocks: match &p {
            Payload::Tokens(t) => Some(t.blocks().get()),
            Payload::Blocks(_) => None,
        },
        bandwidth_gb_s: bandwidth.as_gb_per_s(),
        latency_us: link_spec.latency_us,
        delay_ns: delay.as_nanos(),
        delay_ms: delay.as_nanos() as f64 / 1e6,
    };
    Ok((report, model))
}
