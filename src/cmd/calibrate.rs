//! `pdsim calibrate CSV… [--kind linear|table2d] [--out FILE]`: a
//! step-time model fitted to measured steps, its error by region, and the
//! `step_time = { … }` line to paste into a scenario's role (see
//! `pdsim::calibrate` for the CSV shapes and the fits).

use std::io::Write as _;
use std::path::PathBuf;

use pdsim::calibrate::{self, Kind};

use super::{CmdError, emit, write_file};

/// A model form, as `--kind` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KindArg {
    /// fixed + per token + per sequence + per context token, each >= 0.
    Linear,
    /// A prefill table with attention-pair corrections, plus a decode grid.
    Table2d,
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
    /// Write the fitted `step_time` (headed by the error table, as comments)
    /// to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Reads the steps, fits, prints the errors and the model.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let mut points = Vec::new();
    for path in &args.csv {
        points.extend(calibrate::read_points(path).map_err(CmdError::BadInput)?);
    }
    let (kind, name) = match args.kind {
        KindArg::Linear => (Kind::Linear, "linear"),
        KindArg::Table2d => (Kind::Table2d, "table2d"),
    };
    let files: Vec<String> = args.csv.iter().map(|p| p.display().to_string()).collect();
    let spec = calibrate::fit(kind, &points).map_err(|e| CmdError::BadInput(format!("{}: {e}", files.join(", "))))?;
    // Priced by the model as written and read back, built as a run builds it.
    let toml = calibrate::step_time_toml(&spec);
    let written = calibrate::read_step_time_toml(&toml)
        .map_err(|e| CmdError::Internal(format!("the fitted step_time does not read back: {e}")))?;
    let model = actors::steptime::build(&written, None)
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
            write_file(path, |w| w.write_all(format!("{text}{toml}").as_bytes()))?;
            emit(&format!("{text}# step_time written to {}\n", path.display()))
        }
    }
}
