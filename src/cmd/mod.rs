//! The verbs of `pdsim`, one module each, and what they share: the error
//! type with its exit status, and writing to stdout.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use actors::workload::WorkloadError;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pdsim::output::TempFile;
use pdsim::runner::RunError;
use pdsim::scenario::ScenarioError;
use pdsim::sweep::SweepError;

pub mod accuracy;
pub mod calibrate;
mod live;
pub mod plan;
pub mod report;
pub mod run;
pub mod serve;
pub mod steps;
pub mod steptime;
pub mod sweep;
pub mod transfer;
pub mod validate;

/// Why a verb failed; decides the exit status.
#[derive(Debug)]
pub enum CmdError {
    /// The input is wrong (a scenario, a trace, a flag), or an output
    /// cannot be written (a full disk, a folder without write access):
    /// exit 2.
    BadInput(String),
    /// pdsim failed on good input (a bug): exit 1.
    Internal(String),
    /// Ctrl-C stopped the work; what was finished is written: exit 130.
    Interrupted(String),
}

/// Set by the first Ctrl-C: runs stop at their next progress slice, sweeps
/// and replicas start nothing more, and what has finished is written. A
/// second Ctrl-C exits at once.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Installs the Ctrl-C handler (once, at start).
pub fn handle_interrupts() {
    // Without a handler (it cannot be installed) Ctrl-C ends the process
    // as usual, which is no worse than before.
    let _ = ctrlc::set_handler(|| {
        if INTERRUPTED.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
    });
}

/// The error for work that Ctrl-C stopped.
pub fn interrupted(what: impl std::fmt::Display) -> CmdError {
    CmdError::Interrupted(format!("interrupted: {what}"))
}

impl From<ScenarioError> for CmdError {
    fn from(e: ScenarioError) -> Self {
        CmdError::BadInput(e.to_string())
    }
}

impl From<RunError> for CmdError {
    fn from(e: RunError) -> Self {
        match e {
            RunError::BadInput(m) => CmdError::BadInput(m),
            RunError::Internal(m) => CmdError::Internal(m),
        }
    }
}

impl From<SweepError> for CmdError {
    fn from(e: SweepError) -> Self {
        CmdError::BadInput(e.0)
    }
}

impl From<pdsim::html::ReportError> for CmdError {
    fn from(e: pdsim::html::ReportError) -> Self {
        CmdError::BadInput(e.to_string())
    }
}

impl From<WorkloadError> for CmdError {
    fn from(e: WorkloadError) -> Self {
        CmdError::BadInput(e.0)
    }
}

/// Writes `text` to stderr, ignoring a failure: with stderr unwritable
/// (`2>/dev/full`, a closed terminal) there is nowhere to report it, and
/// the exit status still says what happened (`eprintln!` would panic, and
/// panic again in the panic hook, which aborts).
pub fn say(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// Writes `text` to stdout; a closed pipe (`pdsim ... | head`) is not an
/// error.
pub fn emit(text: &str) -> Result<(), CmdError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CmdError::BadInput(format!("cannot write to stdout: {e}"))),
    }
}

/// Parses a count flag that must be at least 1 (`--requests`,
/// `--replicas`, `--jobs`).
pub fn count_at_least_one(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1, got 0".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("expected a whole number >= 1, got {s:?}")),
    }
}

/// The percentiles of `--percentiles` (default 50,90,95,99; vLLM's
/// `--metric-percentiles`, whose form this takes, defaults to 99 alone).
#[derive(Clone, Debug, PartialEq)]
pub struct Percentiles(pub Vec<f64>);

impl Default for Percentiles {
    fn default() -> Self {
        Percentiles(actors::bench::DEFAULT_PERCENTILES.to_vec())
    }
}

/// Parses `--percentiles`: comma-separated numbers, each within 0..=100,
/// no two with the same name (`99` and `99.0` are one).
pub fn percentiles_arg(s: &str) -> Result<Percentiles, String> {
    let mut ps = Vec::new();
    for part in s.split(',') {
        let t = part.trim();
        match t.parse::<f64>() {
            Ok(p) if p.is_finite() => ps.push(p),
            _ => return Err(format!("expected comma-separated percentiles in 0..=100 (e.g. 50,90,99.9), got {t:?}")),
        }
    }
    actors::bench::check_percentiles(&ps)?;
    Ok(Percentiles(ps))
}

/// Creates `dir` and its parents. A folder that cannot be made is the
/// user's `--out` (or the current folder) at fault: bad input, exit 2.
pub fn create_dir(dir: &Path) -> Result<(), CmdError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CmdError::BadInput(format!("--out: cannot create the output folder {}: {e}", dir.display())))
}

/// An output file that cannot be written: the environment's fault (a full
/// disk, no write access), not a bug: exit 2, naming the file.
pub fn write_error(path: &Path, e: &std::io::Error) -> CmdError {
    CmdError::BadInput(format!("cannot write {}: {e}", path.display()))
}

/// Removes the file `path` if it is there and a regular file (pdsim's own
/// output name); a link, folder, device or pipe there is refused
/// ([`pdsim::output::remove_file`]).
pub fn remove_if_present(path: &Path) -> Result<(), CmdError> {
    pdsim::output::remove_file(path).map_err(CmdError::BadInput)
}

/// An output folder that cannot be listed (to clear what an earlier run
/// left): exit 2, naming it.
pub fn list_error(dir: &Path, e: &std::io::Error) -> CmdError {
    CmdError::BadInput(format!("cannot read the output folder {}: {e}", dir.display()))
}

/// Writes the file `path` through `write`, buffered; an I/O error names the
/// file. The bytes go to `path.partial` first (created new) and are
/// renamed into place when whole, so a file under its own name is never
/// cut off (by a second Ctrl-C, say), and nothing but a regular file at
/// `path` is replaced ([`pdsim::output`]).
pub fn write_file(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), CmdError> {
    pdsim::output::write_atomic(path, write).map_err(CmdError::BadInput)
}

/// A CSV file written a line at a time under its partial name (flushed
/// after each line, so its progress can be followed) and renamed into
/// place by [`CsvFile::finish`]: an interrupted sweep finishes it with the
/// lines done so far; dropped unfinished (a failed write), it is removed.
pub struct CsvFile {
    file: TempFile,
}

impl CsvFile {
    /// Starts writing `path` (a regular file there is replaced when the
    /// file is finished; anything else is refused now).
    pub fn create(path: &Path) -> Result<Self, CmdError> {
        Ok(CsvFile { file: TempFile::create(path).map_err(CmdError::BadInput)? })
    }

    /// Writes `line` and a newline, and flushes.
    pub fn line(&mut self, line: &str) -> Result<(), CmdError> {
        let f = &mut self.file;
        f.write_all(line.as_bytes())
            .and_then(|()| f.write_all(b"\n"))
            .and_then(|()| f.flush())
            .map_err(CmdError::BadInput)
    }

    /// Renames the file into place.
    pub fn finish(self) -> Result<(), CmdError> {
        self.file.commit().map_err(CmdError::BadInput)
    }
}

/// A progress bar on stderr that appears only when stderr is a terminal,
/// the command is not quiet, and the work has lasted over a second.
pub struct ProgressGate {
    start: Instant,
    enabled: bool,
    total: Option<u64>,
    unit: &'static str,
    bar: Option<ProgressBar>,
}

impl ProgressGate {
    /// A gate for `total` items (unknown: a counter with a spinner) of
    /// `unit` (`requests`, `points`).
    pub fn new(quiet: bool, total: Option<u64>, unit: &'static str) -> Self {
        let enabled = !quiet && std::io::stderr().is_terminal();
        ProgressGate { start: Instant::now(), enabled, total, unit, bar: None }
    }

    /// Moves the bar to `done` items, with a message after it.
    pub fn update(&mut self, done: u64, message: impl FnOnce() -> String) {
        if !self.enabled {
            return;
        }
        if self.bar.is_none() {
            if self.start.elapsed() < Duration::from_secs(1) {
                return;
            }
            let template = match self.total {
                Some(_) => {
                    format!("{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {} (eta {{eta}}) {{msg}}", self.unit)
                }
                None => format!("{{spinner}} {{elapsed_precise}} {{pos}} {} {{msg}}", self.unit),
            };
            let style = ProgressStyle::with_template(&template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            let bar = ProgressBar::with_draw_target(self.total, ProgressDrawTarget::stderr())
                .with_style(style)
                .with_elapsed(self.start.elapsed());
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_message(message());
            bar.set_position(done);
        }
    }

    /// Removes the bar, if it was shown.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
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
        say(&format!("pdsim: internal error: {msg}{place} (this is a bug in pdsim)\n"));
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
            say(&e.render().to_string());
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
            say(&format!("pdsim: {text} (see pdsim --help)\n"));
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
            say(&format!("pdsim: {msg}\n"));
            ExitCode::from(2)
        }
        Ok(Err(CmdError::Internal(msg))) => {
            say(&format!("pdsim: internal error: {msg}\n"));
            ExitCode::from(1)
        }
        Ok(Err(CmdError::Interrupted(msg))) => {
            say(&format!("pdsim: {msg}\n"));
            ExitCode::from(130)
        }
        Err(_) => ExitCode::from(1),
    }
}
