//! `pdsim`: the command line of the P/D serving simulator.
//!
//! Each verb is one module under `src/cmd/` with an `Args` struct (clap
//! derive) and a `run(&Args) -> Result<(), CmdError>`; adding a verb is a
//! variant of [`Command`] and one arm in [`dispatch`]. Errors print as one
//! line, `pdsim: <problem>`, on stderr; the exit status is 0 on success, 2
//! for bad input (a scenario, a trace or a flag), 1 for an internal error
//! (a bug: a panic is caught and reported the same way, without a
//! backtrace), 130 when Ctrl-C stopped the work (what had finished is
//! written).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

/// Deterministic discrete-event simulator of prefill/decode disaggregated
/// LLM serving.
#[derive(Debug, Parser)]
#[command(name = "pdsim", version, about, long_about = None)]
struct Cli {
    /// With no verb, `pdsim` runs the embedded default scenario
    /// (scenarios/default.toml) into out/default and prints the summary,
    /// as `pdsim run` does.
    #[command(subcommand)]
    command: Option<Command>,
}

/// The verbs.
#[derive(Debug, Subcommand)]
enum Command {
    /// Simulate a scenario (default: the embedded default scenario) and
    /// write report.json, requests.csv, timeline.csv and trace.json (and
    /// report.html with --html).
    Run(cmd::run::Args),
    /// Run every point of a sweep file (axes x seeds) in parallel and write
    /// one row per point to sweep.csv.
    Sweep(cmd::sweep::Args),
    /// Find the cheapest deployment (GPUs, aggregated or P/D, TP per role,
    /// batch limits) that meets a scenario's SLOs, by simulating every
    /// candidate within [plan] max_gpus on its traffic.
    #[command(long_about = cmd::plan::LONG_ABOUT)]
    Plan(cmd::plan::Args),
    /// Write report.html, a self-contained page of tables and charts, for a
    /// run folder (report.json, requests.csv, timeline.csv) or a sweep
    /// folder (sweep.csv).
    Report(cmd::report::Args),
    /// Check a scenario file and print its resolved form (includes and
    /// defaults filled in) as TOML.
    Validate(cmd::validate::Args),
    /// Price the KV handoff of one prompt with a scenario's model and link.
    Transfer(cmd::transfer::Args),
    /// Run one rank's scheduler step by step on a small case (JSON) and
    /// print one JSON line per schedule call, as vLLM's scheduler is logged.
    Steps(cmd::steps::Args),
    /// Price one step (prefill tokens, decoding sequences, context) with a
    /// scenario role's step-time model, as a run builds it, and its terms.
    Steptime(cmd::steptime::Args),
    /// Fit a step-time model (linear, table2d, or a scenario rank's roofline)
    /// to measured steps in CSV files, print its error by region and the
    /// step_time to paste.
    Calibrate(cmd::calibrate::Args),
    /// Replay the real vLLM runs of validation/ with presets and defaults
    /// and print predicted against measured TTFT, TPOT, E2E and throughput
    /// per stage point, with the MAPE of each.
    Accuracy(cmd::accuracy::Args),
    /// Serve an OpenAI-compatible endpoint (completions, chat completions,
    /// streamed as vLLM streams them, /v1/models, /health, /metrics) whose
    /// every request is a request of the running simulation, its tokens
    /// sent at their simulated times (--speed X: X simulated seconds per
    /// wall second).
    Serve(cmd::serve::Args),
}

fn dispatch(command: Option<&Command>) -> Result<(), cmd::CmdError> {
    let Some(command) = command else { return cmd::run::run(&cmd::run::Args::default()) };
    match command {
        Command::Run(args) => cmd::run::run(args),
        Command::Sweep(args) => cmd::sweep::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Report(args) => cmd::report::run(args),
        Command::Validate(args) => cmd::validate::run(args),
        Command::Transfer(args) => cmd::transfer::run(args),
        Command::Steps(args) => cmd::steps::run(args),
        Command::Steptime(args) => cmd::steptime::run(args),
        Command::Calibrate(args) => cmd::calibrate::run(args),
        Command::Accuracy(args) => cmd::accuracy::run(args),
        Command::Serve(args) => cmd::serve::run(args),
    }
}

fn main() -> ExitCode {
    pdsim::heap::keep_slack();
    cmd::quiet_panics();
    cmd::handle_interrupts();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return cmd::usage_error(&e),
    };
    cmd::finish(std::panic::catch_unwind(|| dispatch(cli.command.as_ref())))
}
