//! The verbs of `pdsim`, one module each, and what they share: the error
//! type with its exit status, and writing to stdout.

use std::io::Write;
use std::process::ExitCode;

use actors::workload::WorkloadError;
use pdsim::scenario::ScenarioError;

pub mod transfer;
pub mod validate;

/// Why a verb failed; decides the exit status.
#[derive(Debug)]
pub enum CmdError {
    /// The input is wrong (a scenario, a trace, a flag): exit 2.
    BadInput(String),
    /// pdsim failed on good input (a bug, or an I/O error writing output):
    /// exit 1.
    Internal(String),
}

impl From<ScenarioError> for CmdError {
    fn from(e: ScenarioError) -> Self {
        CmdError::BadInput(e.to_string())
    }
}

impl From<WorkloadError> for CmdError {
    fn from(e: WorkloadError) -> Self {
        CmdError::BadInput(e.0)
    }
}

/// Writes `text` to stdout; a closed pipe (`pdsim ... | head`) is not an
/// error.
pub fn emit(text: &str) -> Result<(), CmdError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CmdError::Internal(format!("cannot write to stdout: {e}"))),
    }
}

/// Replaces the default panic message (with its backtrace hint) by one line
/// on stderr.
pub fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned());
        let place = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("pdsim: internal error: {msg}{place} (this is a bug in pdsim)");
    }));
}

/// Help and version go to stdout with status 0; a usage error is one line
/// on stderr with status 2.
pub fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = emit(&e.render().to_string());
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            eprint!("{}", e.render());
            ExitCode::from(2)
        }
        _ => {
            // clap's first paragraph, on one line (it may list missing
            // arguments on the lines after the first).
            let rendered = e.render().to_string();
            let para: Vec<&str> = rendered
                .lines()
                .skip_while(|l| l.trim().is_empty())
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let text = para.join(" ");
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            eprintln!("pdsim: {text} (see pdsim --help)");
            ExitCode::from(2)
        }
    }
}

/// The exit status of a verb's result (a caught panic is an internal error,
/// already reported by the panic hook).
pub fn finish(result: std::thread::Result<Result<(), CmdError>>) -> ExitCode {
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(CmdError::BadInput(msg))) => {
            eprintln!("pdsim: {msg}");
            ExitCode::from(2)
        }
        Ok(Err(CmdError::Internal(msg))) => {
            eprintln!("pdsim: internal error: {msg}");
            ExitCode::from(1)
        }
        Err(_) => ExitCode::from(1),
    }
}
