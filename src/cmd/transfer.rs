//! `pdsim transfer SCENARIO --prompt-tokens N`: the KV handoff of one
//! prompt, priced with the scenario's model and link by the transfer rules
//! of `actors::rules` (the grouped transfer rules).

use std::path::PathBuf;

use actors::model::Model;
use pdsim::scenario;
use pdsim::transfer::{Transfer, price};

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

/// Loads the scenario, checks the flags, prices the handoff and prints it.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let scenario = scenario::load(&args.scenario)?;
    let (report, model) = price(&scenario, args.prompt_tokens, args.decode_cached_tokens, args.bandwidth_gb_s)
        .map_err(|e| CmdError::BadInput(format!("{}: {}", e.flag(), e.problem)))?;
    let model = &model;
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CmdError::Internal(format!("cannot serialize the report: {e}")))?;
        emit(&format!("{text}\n"))
    } else {
        emit(&table(&report, model))
    }
}

/// The human-readable form of a report.
fn table(r: &Transfer, model: &Model) -> String {
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
