//! `pdsim validate SCENARIO`: check a scenario and print its resolved form.

use std::path::PathBuf;

use actors::model::Role;
use actors::sim::Deployment;
use actors::validate::DEFAULT_GPU_MEMORY_UTILIZATION;
use actors::workload::RequestSource;
use pdsim::scenario;

use super::{CmdError, emit};

/// Arguments of `pdsim validate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The scenario file.
    pub scenario: PathBuf,
    /// Print the resolved scenario as JSON instead of TOML.
    #[arg(long)]
    pub json: bool,
}

/// Loads the scenario (every check of [`scenario::load`]), reads a trace
/// workload to its end (streamed, so a malformed row deep in the file is
/// found now rather than mid-run): every row a run could read, that is up
/// to the trace's `limit` and past the workload's `requests`, which
/// `run --requests` replaces. Prints the resolved scenario: TOML headed by
/// comment lines that say what was checked, or JSON.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let scenario = scenario::load(&args.scenario)?;
    let mut notes = vec![format!("# pdsim validate: {} is valid", scenario.source())];
    let dep = Deployment::build(scenario.model_spec(), scenario.deployment())
        .map_err(|e| CmdError::Internal(format!("a loaded scenario failed to build: {e}")))?;
    for (role, spec) in [
        (Role::Prefill, &scenario.deployment().prefill),
        (Role::Decode, &scenario.deployment().decode),
        (Role::Aggregated, &scenario.deployment().aggregated),
    ] {
        if let (Some(spec), Some(n)) = (spec, dep.num_blocks(role))
            && spec.num_blocks.is_none()
        {
            let util = spec.gpu_memory_utilization.unwrap_or(DEFAULT_GPU_MEMORY_UTILIZATION);
            notes.push(format!(
                "# {role}: num_blocks = {n}, what {util} of the GPU's memory leaves after the weights, \
                 activations and reserve"
            ));
        }
    }
    scenario
        .workload()
        .check_arrival_span(None, "")
        .map_err(|e| CmdError::BadInput(format!("{}: {e}", scenario.source())))?;
    if let Some(trace) = &scenario.workload().trace {
        // `Some(u64::MAX)` in place of the file's `requests`: the trace's
        // `limit` is the only cap, as for any `run --requests`.
        let mut source = scenario.workload().source(scenario.seed(), Some(u64::MAX))?;
        while source.next_request()?.is_some() {}
        let s = source.stats();
        let scope = match trace.limit {
            Some(l) if s.requests >= l => format!("up to its limit of {l} requests"),
            _ => "to its end".to_owned(),
        };
        notes.push(format!(
            "# trace {}: {} requests from {} rows ({} malformed rows skipped, {} failed requests skipped), checked {scope}",
            trace.path.display(),
            s.requests,
            s.rows_read,
            s.skipped_malformed,
            s.skipped_failed
        ));
        if let Some(n) = scenario.workload().requests.filter(|&n| n < s.requests) {
            notes.push(format!("# a run replays the first {n} (workload.requests; --requests replaces it)"));
        }
    }
    // The resolved form's paths, as any scenario's, are relative to the
    // file that holds them: this one saved beside the scenario.
    let dir = scenario.dir().to_path_buf();
    let scenario = scenario.beside_its_file();
    if let Some(t) = &scenario.workload().trace {
        let at = if dir.as_os_str().is_empty() { ".".to_owned() } else { dir.display().to_string() };
        notes.push(format!(
            "# paths are relative to {at}, the scenario's folder (trace {}): save this file there",
            t.path.display()
        ));
    }
    if args.json {
        let text = serde_json::to_string_pretty(&scenario)
            .map_err(|e| CmdError::Internal(format!("cannot serialize the scenario: {e}")))?;
        emit(&format!("{text}\n"))
    } else {
        let text = scenario.to_toml().map_err(|e| CmdError::Internal(format!("cannot serialize the scenario: {e}")))?;
        emit(&format!("{}\n\n{text}", notes.join("\n")))
    }
}
