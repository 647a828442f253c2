//! `pdsim steptime SCENARIO --prefill-tokens N … --decode-seqs D
//! --context-tokens C`: the time of one step of a role's ranks, priced by
//! the step-time model a run of the scenario builds for them, with the
//! model's terms.

use std::fmt::Write as _;
use std::path::PathBuf;

use actors::model::Role;
use pdsim::calibrate::StepCounts;
use pdsim::scenario;
use pdsim::steptime::{StepPrice, StepTimeError, price};

use super::{CmdError, emit};

/// A role, as `--role` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RoleArg {
    /// The prefill ranks of a P/D deployment.
    Prefill,
    /// The decode ranks of a P/D deployment.
    Decode,
    /// The ranks of an aggregated deployment.
    Aggregated,
}

impl From<RoleArg> for Role {
    fn from(r: RoleArg) -> Role {
        match r {
            RoleArg::Prefill => Role::Prefill,
            RoleArg::Decode => Role::Decode,
            RoleArg::Aggregated => Role::Aggregated,
        }
    }
}

/// Arguments of `pdsim steptime`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The scenario whose role's `step_time` prices the step.
    pub scenario: PathBuf,
    /// The role whose ranks run the step (default: the only one the
    /// scenario has).
    #[arg(long, value_enum)]
    pub role: Option<RoleArg>,
    /// N: prompt tokens the step computes (prefill chunks).
    #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true)]
    pub prefill_tokens: u64,
    /// P: sequences the N tokens are spread over, evenly (default 1 when
    /// N > 0).
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub prefill_seqs: Option<u64>,
    /// X: of the C context tokens, those the prefill sequences have cached
    /// (spread evenly over them; default all of C when D = 0, else 0).
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub prefill_cached: Option<u64>,
    /// D: sequences decoding one token each.
    #[arg(long, value_name = "D", default_value_t = 0, allow_negative_numbers = true)]
    pub decode_seqs: u64,
    /// C: KV the step reads beyond the tokens it computes, summed over all
    /// its sequences (C − X of it spread evenly over the D decoding ones).
    #[arg(long, value_name = "C", default_value_t = 0, allow_negative_numbers = true)]
    pub context_tokens: u64,
    /// Print `{"step_us": …, "terms": {…}}` instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// Loads the scenario, builds the role's model as a run does, prices the step.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let scenario = scenario::load(&args.scenario)?;
    let counts = StepCounts {
        prefill_tokens: args.prefill_tokens,
        prefill_seqs: args.prefill_seqs,
        prefill_cached: args.prefill_cached,
        decode_seqs: args.decode_seqs,
        context_tokens: args.context_tokens,
    };
    let priced = price(&scenario, args.role.map(Role::from), &counts).map_err(|e| match e {
        StepTimeError::Arg(a) if a.arg == "role" => match args.role {
            Some(r) => CmdError::BadInput(format!("--role {}: {}", Role::from(r), a.problem)),
            None => CmdError::BadInput(format!("--role: {} with --role", a.problem)),
        },
        StepTimeError::Arg(a) => CmdError::BadInput(format!("{}: {}", a.flag(), a.problem)),
        StepTimeError::Scenario(m) => CmdError::BadInput(m),
        StepTimeError::Internal(m) => CmdError::Internal(m),
    })?;
    let rounding = priced.rounding_us();
    let StepPrice { step_us, terms, .. } = priced;
    if args.json {
        let terms: serde_json::Map<String, serde_json::Value> =
            terms.iter().map(|&(name, us)| (name.to_owned(), serde_json::json!(us))).collect();
        let v = serde_json::json!({ "step_us": step_us, "terms": terms, "rounding_us": rounding });
        return emit(&format!("{v}\n"));
    }
    let mut out = format!("{step_us:.3} µs\n");
    let milli = |us: f64| (us * 1e3).round() as i64;
    for (name, us) in &terms {
        writeln!(out, "  {name:<26} {us:>14.3} µs").expect("writing to a String");
    }
    // What the printed terms leave to the printed step: the rounding up to
    // a whole nanosecond (and of the terms to three decimals), so the
    // column adds up.
    let left = milli(step_us) - terms.iter().map(|&(_, us)| milli(us)).sum::<i64>();
    if left != 0 {
        let label = "rounded up to whole ns";
        writeln!(out, "  {label:<26} {:>+14.3} µs", left as f64 / 1e3).expect("writing to a String");
    }
    emit(&out)
}
