//! `pdsim validate SCENARIO`: check a scenario and print its resolved form.

use std::path::PathBuf;

use pdsim::scenario;
use pdsim::validate::ValidateError;

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
    let checked = pdsim::validate::check(&scenario).map_err(|e| match e {
        ValidateError::BadInput(m) => CmdError::BadInput(m),
        ValidateError::Internal(m) => CmdError::Internal(m),
    })?;
    let mut notes = vec![format!("# pdsim validate: {} is valid", scenario.source())];
    notes.extend(checked.iter().map(|n| format!("# {n}")));
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
