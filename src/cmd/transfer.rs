//! `pdsim transfer SCENARIO --prompt-tokens N`: the KV handoff of one
//! prompt, priced with the scenario's model and link by the transfer rules
//! of `actors::rules` (the grouped transfer rules).

use std::path::PathBuf;

use actors::model::{DEFAULT_LINEAR_BLOCK_SIZE, Model};
use actors::rules::{Payload, RuleError, payload};
use actors::tp::Reads;
use actors::units::{Bandwidth, Bytes, Link, Tokens};
use pdsim::scenario;
use serde::Serialize;
use sim_core::SimDuration;

use super::{CmdError, emit};

/// Arguments of `pdsim transfer`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The scenario whose model and [link] price the handoff.
    pub scenario: PathBuf,
    /// Prompt tokens N of the request handed off.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub prompt_tokens: u64,
    /// Leading prompt tokens K the decode rank's prefix cache holds; at most
    /// N. The hit it serves is min(K, N − 1) rounded down to every group's
    /// block size (their least common multiple), as vLLM's.
    #[arg(long, value_name = "K", default_value_t = 0, allow_negative_numbers = true)]
    pub decode_cached_tokens: u64,
    /// Link bandwidth in GB/s (10^9 bytes/s), instead of the scenario's.
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub bandwidth_gb_s: Option<f64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// What `--json` prints.
#[derive(Debug, Serialize)]
struct Report {
    scenario: String,
    model: Option<String>,
    /// `blocks` (grouped model) or `tokens` (linear model).
    units: &'static str,
    prompt_tokens: u64,
    decode_cached_tokens: u64,
    /// The hit the decode rank serves: min(K, N − 1) rounded down to the
    /// groups' block sizes.
    decode_hit_tokens: u64,
    /// T: tokens the prefill computes and hands off.
    transferred_tokens: u64,
    /// Bytes one decode TP rank reads.
    payload_bytes: u64,
    prefill_tp: u32,
    decode_tp: u32,
    /// Prefill TP ranks one decode TP rank reads from.
    prefill_ranks_read: u32,
    /// Bytes over the busiest NIC: `payload_bytes` times the decode ranks
    /// reading from one prefill rank (`decode_tp / prefill_tp` when larger
    /// than 1); the delay is priced on these.
    link_bytes: u64,
    /// Bytes of the window and state groups (0 for a linear model).
    fixed_bytes: u64,
    full_decode_hit: bool,
    groups: Vec<GroupRow>,
    /// Tokens whose KV moves, in whole blocks (linear model only).
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens: Option<u64>,
    /// Blocks that move (linear model only).
    #[serde(skip_serializing_if = "Option::is_none")]
    blocks: Option<u64>,
    bandwidth_gb_s: f64,
    latency_us: f64,
    delay_ns: u64,
    delay_ms: f64,
}

#[derive(Debug, Serialize)]
struct GroupRow {
    name: String,
    kind: &'static str,
    blocks: u64,
    bytes: u64,
}

/// Loads the scenario, checks the flags, prices the handoff and prints it.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let scenario = scenario::load(&args.scenario)?;
    let n = args.prompt_tokens;
    let k = args.decode_cached_tokens;
    if n == 0 {
        return Err(CmdError::BadInput("--prompt-tokens: must be >= 1, got 0".into()));
    }
    if k > n {
        return Err(CmdError::BadInput(format!("--decode-cached-tokens: {k} exceeds --prompt-tokens {n}")));
    }
    let link_spec = &scenario.deployment().link;
    let (gb_s, flag) = match args.bandwidth_gb_s {
        Some(x) => (x, "--bandwidth-gb-s"),
        None => (link_spec.bandwidth_gb_s, "link.bandwidth_gb_s"),
    };
    let bandwidth = Bandwidth::parse_gb_per_s(gb_s).map_err(|why| CmdError::BadInput(format!("{flag}: {why}")))?;
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
    let model = &scenario.model().clone().with_block_size(block.unwrap_or(DEFAULT_LINEAR_BLOCK_SIZE));
    let p = payload(model, Tokens::new(n), Tokens::new(k)).map_err(|e| match e {
        RuleError::HitExceedsPrompt { .. } => CmdError::BadInput(format!("--decode-cached-tokens: {e}")),
        _ => CmdError::BadInput(format!("--prompt-tokens: {e}")),
    })?;
    // The busiest NIC: a prefill rank sends what each of its readers takes.
    let link_bytes = Bytes::new(p.bytes().get().saturating_mul(u64::from(reads.readers)));
    let delay = link.delay(link_bytes);
    let report = Report {
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
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CmdError::Internal(format!("cannot serialize the report: {e}")))?;
        emit(&format!("{text}\n"))
    } else {
        emit(&table(&report, model))
    }
}

/// The human-readable form of a report.
fn table(r: &Report, model: &Model) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!("scenario     {}", r.scenario));
    let shape = match model {
        Model::Linear(m) => {
            format!("linear: the handoff moves whole blocks of {} tokens", thousands(m.block_size().get()))
        }
        Model::Grouped(g) => format!(
            "grouped: {} cache groups, the handoff counts blocks{}",
            g.groups().len(),
            if g.is_mamba_type() { "; Mamba-type, so the prefill stops one token short" } else { "" }
        ),
    };
    line(format!("model        {} ({shape})", r.model.as_deref().unwrap_or("unnamed")));
    line(format!(
        "prompt       {} tokens, {} cached on the decode rank (a hit of {}); {} tokens handed off",
        thousands(r.prompt_tokens),
        thousands(r.decode_cached_tokens),
        thousands(r.decode_hit_tokens),
        thousands(r.transferred_tokens)
    ));
    line(format!("link         {} GB/s, latency {} us", r.bandwidth_gb_s, r.latency_us));
    if r.prefill_tp != r.decode_tp {
        line(format!(
            "tp           prefill {}, decode {}: each decode rank reads from {} prefill rank(s); {} bytes over the busiest NIC",
            r.prefill_tp,
            r.decode_tp,
            r.prefill_ranks_read,
            thousands(r.link_bytes)
        ));
    }
    line(String::new());
    if r.groups.is_empty() {
        let (tokens, blocks) = (r.tokens.unwrap_or(0), r.blocks.unwrap_or(0));
        line(format!("tokens moved {:>15} ({} blocks)", thousands(tokens), thousands(blocks)));
    } else {
        let width = r.groups.iter().map(|g| g.name.len()).max().unwrap_or(5).max(5);
        line(format!("{:<width$}  {:<14}  {:>8}  {:>15}", "group", "kind", "blocks", "bytes"));
        for g in &r.groups {
            line(format!("{:<width$}  {:<14}  {:>8}  {:>15}", g.name, g.kind, thousands(g.blocks), thousands(g.bytes)));
        }
    }
    line(format!(
        "payload      {:>15} bytes (window and state groups: {})",
        thousands(r.payload_bytes),
        thousands(r.fixed_bytes)
    ));
    if r.full_decode_hit {
        line("full decode hit: the hit covers every token handed off, so nothing moves".to_owned());
    }
    line(format!("delay        {} ms", r.delay_ms));
    out
}

/// `1234567` → `1,234,567`.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
