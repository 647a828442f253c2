//! What `pdsim validate` checks beyond [`crate::scenario::load`]: the
//! deployment builds, the synthetic arrivals stay within simulated time,
//! and a trace workload reads to its end (streamed, so that a malformed
//! row deep in the file is found now rather than mid-run).

use actors::model::Role;
use actors::sim::Deployment;
use actors::validate::DEFAULT_GPU_MEMORY_UTILIZATION;
use actors::workload::RequestSource;

use crate::scenario::Scenario;

/// Why a loaded scenario is refused, or pdsim failed on it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValidateError {
    /// The input is wrong: one line naming the file, the line (a trace
    /// row's) and the field.
    #[error("{0}")]
    BadInput(String),
    /// A loaded scenario failed to build (a bug in pdsim).
    #[error("{0}")]
    Internal(String),
}

/// Checks a loaded scenario as `pdsim validate` does, and returns what it
/// checked as lines of text (the pool sizes derived from GPU memory, the
/// trace rows read): every row a run could read, up to the trace's
/// `limit` and past the workload's `requests`, which `run --requests`
/// replaces.
///
/// # Errors
/// See [`ValidateError`].
pub fn check(scenario: &Scenario) -> Result<Vec<String>, ValidateError> {
    let mut notes = Vec::new();
    let dep = Deployment::build(scenario.model_spec(), scenario.deployment())
        .map_err(|e| ValidateError::Internal(format!("a loaded scenario failed to build: {e}")))?;
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
                "{role}: num_blocks = {n}, what {util} of the GPU's memory leaves after the weights, \
                 activations and reserve"
            ));
        }
    }
    scenario
        .workload()
        .check_arrival_span(None, "")
        .map_err(|e| ValidateError::BadInput(format!("{}: {e}", scenario.source())))?;
    if let Some(trace) = &scenario.workload().trace {
        // `Some(u64::MAX)` in place of the file's `requests`: the trace's
        // `limit` is the only cap, as for any `run --requests`.
        let bad = |e: actors::workload::WorkloadError| ValidateError::BadInput(e.0);
        let mut source = scenario.workload().source(scenario.seed(), Some(u64::MAX)).map_err(bad)?;
        while source.next_request().map_err(bad)?.is_some() {}
        let s = source.stats();
        let scope = match trace.limit {
            Some(l) if s.requests >= l => format!("up to its limit of {l} requests"),
            _ => "to its end".to_owned(),
        };
        notes.push(format!(
            "trace {}: {} requests from {} rows ({} malformed rows skipped, {} failed requests skipped), checked {scope}",
            trace.path.display(),
            s.requests,
            s.rows_read,
            s.skipped_malformed,
            s.skipped_failed
        ));
        if let Some(n) = scenario.workload().requests.filter(|&n| n < s.requests) {
            notes.push(format!("a run replays the first {n} (workload.requests; --requests replaces it)"));
        }
    }
    Ok(notes)
}
