//! Service-level objectives, and whether a request met them.

use serde::{Deserialize, Serialize};
use sim_core::SimDuration;

use crate::requests::request::{Outcome, Request};

/// Service-level objectives for goodput. A request meets the SLO when it
/// completed and every named bound holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloSpec {
    /// Time to first token bound, ms.
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    /// Time per output token bound, ms.
    #[serde(default)]
    pub tpot_ms: Option<f64>,
    /// End-to-end latency bound, ms.
    #[serde(default)]
    pub e2e_ms: Option<f64>,
}

/// Whether a completed request meets every bound of `slo`.
pub fn meets_slo(r: &Request, slo: &SloSpec) -> bool {
    if r.outcome != Outcome::Completed {
        return false;
    }
    let within = |bound: Option<f64>, v: Option<SimDuration>| match (bound, v) {
        (None, _) => true,
        (Some(b), Some(v)) => v.as_millis_f64() <= b,
        (Some(_), None) => true, // TPOT of a one-token output: nothing to bound
    };
    within(slo.ttft_ms, r.ttft()) && within(slo.tpot_ms, r.tpot()) && within(slo.e2e_ms, r.e2e())
}
