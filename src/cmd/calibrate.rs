//! `pdsim calibrate CSV… [--kind linear|table2d|roofline [--scenario S [--role R]]] [--out FILE]`: a
//! step-time model fitted to measured steps, its error by region, and the
//! `step_time = { … }` line to paste into a scenario's role (see
//! `pdsim::calibrate` for the CSV shapes and the fits).

use std::io::Write as _;
use std::path::PathBuf;

use actors::config::StepTimeSpec;
use actors::model::Role;
use actors::sim::Deployment;
use pdsim::calibrate::{self, Kind};
use pdsim::scenario::{self, Scenario};

use super::{CmdError, emit, write_file};

/// A model form, as `--kind` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KindArg {
    /// fixed + per token + per sequence + per context token, each >= 0.
    Linear,
    /// A prefill table with attention-pair corrections, plus a decode grid.
    Table2d,
    /// The roofline's six factors, for the rank `--scenario` (and `--role`)
    /// describes: its model's layers, GPU, TP size and pool.
    Roofline,
}

/// Arguments of `pdsim calibrate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// CSV files of measured steps: `prefill_tokens,decode_seqs,context_tokens,step_us` (optional
    /// `prefill_seqs`, `prefill_cached`), or AIConfigurator's `batch,isl,prefix,new_tokens,ms`
    /// (prefill) or `batch,context,ms` (decode).
    #[arg(required = true, value_name = "CSV")]
    pub csv: Vec<PathBuf>,
    /// The model to fit.
    #[arg(long, value_enum, default_value_t = KindArg::Table2d)]
    pub kind: KindArg,
    /// With `--kind roofline`: the scenario whose rank the roofline prices
    /// (it needs the model's layers, a preset or config, and `[hardware]`).
    #[arg(long, value_name = "SCENARIO")]
    pub scenario: Option<PathBuf>,
    /// With `--scenario`: the role whose rank it is (default: the only one,
    /// or prefill's when there are two).
    #[arg(long, value_enum)]
    pub role: Option<RoleArg>,
    /// Write the fitted `step_time` (headed by the error table, as comments)
    /// to FILE instead of stdout (its folder made if missing; a role reads
    /// it with `step_time = { file = "FILE" }`).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Reads the steps, fits, prints the errors and the model.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let mut points = Vec::new();
    for path in &args.csv {
        points.extend(calibrate::read_points(path).map_err(CmdError::BadInput)?);
    }
    let files: Vec<String> = args.csv.iter().map(|p| p.display().to_string()).collect();
    if points.is_empty() {
        return Err(CmdError::BadInput(format!("{}: no steps to fit", files.join(", "))));
    }
    // The rank a roofline prices.
    let loaded = match (args.kind, &args.scenario) {
        (KindArg::Roofline, None) => {
            return Err(CmdError::BadInput(
                "--scenario: --kind roofline fits the factors of a rank: name the scenario that has it".into(),
            ));
        }
        (KindArg::Roofline, Some(path)) => {
            let s = scenario::load(path)?;
            let dep = Deployment::build(s.model_spec(), s.deployment())
                .map_err(|e| CmdError::Internal(format!("a loaded scenario failed to build: {e}")))?;
            Some((s, dep))
        }
        (_, Some(_)) => return Err(CmdError::BadInput("--scenario: only --kind roofline uses a scenario".into())),
        (_, None) => None,
    };
    let (spec, name) = match (args.kind, &loaded) {
        (KindArg::Linear, _) => (calibrate::fit(Kind::Linear, &points), "linear"),
        (KindArg::Table2d, _) => (calibrate::fit(Kind::Table2d, &points), "table2d"),
        (KindArg::Roofline, Some((s, dep))) => {
            let role = pick_role(s, args.role)?;
            let rank = dep.rank_inputs(role).ok_or_else(|| {
                CmdError::BadInput(format!(
                    "--scenario: {}: a roofline needs the model's layers (a preset or config) and [hardware]",
                    s.source()
                ))
            })?;
            (Ok(StepTimeSpec::Roofline(calibrate::fit_roofline(&points, rank))), "roofline")
        }
        (KindArg::Roofline, None) => unreachable!("checked above"),
    };
    let spec = spec.map_err(|e| CmdError::BadInput(format!("{}: {e}", files.join(", "))))?;
    // Priced by the model as written and read back, built as a run builds it.
    let toml = calibrate::step_time_toml(&spec);
    let written = calibrate::read_step_time_toml(&toml)
        .map_err(|e| CmdError::Internal(format!("the fitted step_time does not read back: {e}")))?;
    let rank = match &loaded {
        Some((s, dep)) => dep.rank_inputs(pick_role(s, args.role)?),
        None => None,
    };
    let model = actors::steptime::build(&written, rank)
        .map_err(|e| CmdError::BadInput(format!("{}: the fitted model is refused: {e}", files.join(", "))))?;
    let fits = calibrate::fit_errors(model.as_ref(), &points);
    let mut text = format!(
        "# pdsim calibrate: {name} fit of {} steps from {}\n# error = |model - measured| / measured, the model as \
         written\n",
        points.len(),
        files.join(", ")
    );
    text.push_str(&calibrate::error_table(&fits));
    match &args.out {
        None => emit(&format!("{text}{toml}")),
        Some(path) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                super::create_dir(dir)?;
            }
            write_file(path, |w| w.write_all(format!("{text}{toml}").as_bytes()))?;
            emit(&format!("{text}# step_time written to {}\n", path.display()))
        }
    }
}

/// A role, as `--role` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RoleArg {
    /// The prefill ranks.
    Prefill,
    /// The decode ranks.
    Decode,
    /// The aggregated ranks.
    Aggregated,
}

/// The role `--role` names, else the scenario's only one (prefill's of
/// two); an error naming `--role` when it names a role the scenario lacks.
fn pick_role(s: &Scenario, arg: Option<RoleArg>) -> Result<Role, CmdError> {
    let d = s.deployment();
    let present = |r: Role| match r {
        Role::Prefill => d.prefill.is_some(),
        Role::Decode => d.decode.is_some(),
        Role::Aggregated => d.aggregated.is_some(),
    };
    let role = match arg {
        Some(RoleArg::Prefill) => Role::Prefill,
        Some(RoleArg::Decode) => Role::Decode,
        Some(RoleArg::Aggregated) => Role::Aggregated,
        None if d.aggregated.is_some() => Role::Aggregated,
        None => Role::Prefill,
    };
    if present(role) {
        Ok(role)
    } else {
        Err(CmdError::BadInput(format!("--role: {} has no {role} ranks", s.source())))
    }
}
