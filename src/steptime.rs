//! One step priced without simulating anything (`pdsim steptime`): the
//! step-time model a run builds for a role's ranks, applied to the batch
//! of given counts ([`StepCounts::shape`]), with the model's terms.

use actors::config::DeploymentSpec;
use actors::model::Role;
use actors::sim::Deployment;

use crate::calibrate::{StepCounts, price_us};
use crate::scenario::Scenario;
use crate::transfer::ArgError;

/// A step priced.
#[derive(Clone, Debug, PartialEq)]
pub struct StepPrice {
    /// The role whose model priced it.
    pub role: Role,
    /// The step's time, µs.
    pub step_us: f64,
    /// The model's terms (name, µs), as `StepTimeModel::terms` gives them.
    pub terms: Vec<(&'static str, f64)>,
}

impl StepPrice {
    /// What the step has above the sum of its terms, µs, to the picosecond:
    /// a step lasts a whole number of nanoseconds (the engine's clock) and
    /// the terms are exact, so their sum may be a fraction of one below it.
    pub fn rounding_us(&self) -> f64 {
        let sum: f64 = self.terms.iter().map(|&(_, us)| us).sum();
        ((self.step_us - sum) * 1e6).round() / 1e6
    }
}

/// Why a step could not be priced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StepTimeError {
    /// An argument is refused: the role, or a count.
    #[error("{0}")]
    Arg(ArgError),
    /// The engine refuses the scenario's deployment (the message names
    /// the scenario).
    #[error("{0}")]
    Scenario(String),
    /// pdsim failed on good input (a bug).
    #[error("{0}")]
    Internal(String),
}

/// The role `asked` for, or the only one `d` has.
///
/// # Errors
/// The scenario has no ranks of the role asked for, or several roles and
/// none was asked for (the error's argument is `role`).
pub fn pick_role(d: &DeploymentSpec, asked: Option<Role>) -> Result<Role, ArgError> {
    let present: Vec<Role> =
        [(Role::Prefill, &d.prefill), (Role::Decode, &d.decode), (Role::Aggregated, &d.aggregated)]
            .into_iter()
            .filter_map(|(r, s)| s.as_ref().map(|_| r))
            .collect();
    let names = present.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(" and ");
    match asked {
        Some(r) if present.contains(&r) => Ok(r),
        Some(r) => Err(ArgError::new("role", format!("the scenario has no {r} ranks (it has {names})"))),
        None => match present.as_slice() {
            [only] => Ok(*only),
            _ => Err(ArgError::new("role", format!("the scenario has {names} ranks; name one"))),
        },
    }
}

/// Prices the step of `counts` with the model a run of `scenario` builds
/// for the ranks of `role` (default: the scenario's only role).
///
/// # Errors
/// See [`StepTimeError`].
pub fn price(scenario: &Scenario, role: Option<Role>, counts: &StepCounts) -> Result<StepPrice, StepTimeError> {
    let role = pick_role(scenario.deployment(), role).map_err(StepTimeError::Arg)?;
    let dep = Deployment::build(scenario.model_spec(), scenario.deployment())
        .map_err(|e| StepTimeError::Scenario(format!("{}: {e}", scenario.source())))?;
    let model =
        dep.step_time_for(role).ok_or_else(|| StepTimeError::Internal(format!("no {role} role after checks")))?;
    let shape = counts.shape().map_err(|e| StepTimeError::Arg(ArgError::new(e.count, e.problem)))?;
    Ok(StepPrice { role, step_us: price_us(model.as_ref(), &shape), terms: model.terms(&shape) })
}
