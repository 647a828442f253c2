//! `pdsim steps CASE.json`: one rank's scheduler step by step on a small
//! case, one JSON line per schedule call, in the form of the vLLM-oracle
//! driver's log (`conformance/` compares the two).

use std::fmt::Write as _;
use std::path::PathBuf;

use actors::steps::{self, Case};

use super::{CmdError, emit};

/// Arguments of `pdsim steps`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The case file (JSON; see `actors::steps` for its fields).
    pub case: PathBuf,
}

/// Reads the case, runs it, prints the log.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let place = args.case.display();
    let text = pdsim::files::read_text(&args.case, pdsim::files::MAX_TEXT_BYTES)
        .map_err(|e| CmdError::BadInput(format!("{place}: {e}")))?;
    let case: Case = serde_json::from_str(&text).map_err(|e| CmdError::BadInput(format!("{place}: {e}")))?;
    let lines = steps::run_case(&case).map_err(|e| CmdError::BadInput(format!("{place}: {e}")))?;
    let mut out = String::new();
    for line in &lines {
        let json = serde_json::to_string(line).map_err(|e| CmdError::Internal(format!("cannot write a step: {e}")))?;
        writeln!(out, "{json}").expect("writing to a String");
    }
    emit(&out)
}
