//! `pdsim serve SCENARIO`: a live OpenAI-compatible endpoint whose timing
//! is the simulation's (see `pdsim::serve`).

use std::io::Write as _;
use std::path::PathBuf;

use pdsim::scenario;
use pdsim::serve::{Options, ServeError, serve};

use super::{CmdError, INTERRUPTED};

/// Arguments of `pdsim serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The scenario whose deployment serves the requests.
    pub scenario: PathBuf,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port to listen on (0: any free port; the address bound is the
    /// first line printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Simulated seconds per wall second: 10 divides every latency by ten.
    #[arg(long, default_value_t = 1.0, value_name = "X")]
    pub speed: f64,
    /// Write every arrival (simulated time, prompt and output tokens) to
    /// FILE as a Mooncake trace, which `pdsim run` replays to the same
    /// timings.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// The model name `/v1/models` and the responses give (default: the
    /// scenario's name). Requests may name any model.
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
}

/// Loads the scenario and serves it until Ctrl-C or SIGTERM.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let scenario = scenario::load(&args.scenario)?;
    let options = Options {
        host: args.host.clone(),
        port: args.port,
        speed: args.speed,
        record: args.record.clone(),
        model_name: args.served_model_name.clone(),
    };
    let announce = |addr| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "pdsim serve: listening on http://{addr}");
        let _ = out.flush();
    };
    serve(&scenario, &options, &INTERRUPTED, announce).map_err(|e| match e {
        ServeError::BadInput(m) => CmdError::BadInput(m),
        ServeError::Internal(m) => CmdError::Internal(m),
    })
}
