//! `pdsim accuracy [DIR]`: the real vLLM runs of `validation/` replayed
//! with presets and defaults, predicted against measured, per stage point,
//! with the mean absolute percentage error of each figure.

use std::path::PathBuf;

use pdsim::accuracy;

use super::{CmdError, emit};

/// Arguments of `pdsim accuracy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The folder of the runs: its `measured.csv` (one row per run and
    /// stage) is replayed.
    #[arg(default_value = "validation")]
    pub dir: PathBuf,
    /// Draws of the random arrivals each run is replayed with (seeds 1 to
    /// N): each figure is its median over them. One draw shows one
    /// realisation, as a real run is; the recorded table takes 16.
    #[arg(long, default_value_t = accuracy::DRAWS, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub draws: u64,
    /// Replays run at once (the table does not depend on it).
    #[arg(long, default_value_t = pdsim::runner::default_jobs())]
    pub jobs: usize,
}

/// Replays the points and prints the table.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let rows = accuracy::replay_dir(&args.dir, args.draws, args.jobs).map_err(CmdError::BadInput)?;
    emit(&accuracy::table(&rows))
}
