//! `pdsim plan FILE`: every candidate deployment within `[plan] max_gpus`,
//! simulated on the file's traffic, and the cheapest that meets its SLOs.

use std::path::PathBuf;

use pdsim::plan::{self, output, search};
use pdsim::runner::default_jobs;

use super::{CmdError, INTERRUPTED, ProgressGate, create_dir, emit, interrupted, remove_if_present, write_file};

/// Arguments of `pdsim plan`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The plan file: a scenario (model, hardware, workload or trace,
    /// [slo]) with a [plan] table (`max_gpus = N` at least).
    pub file: PathBuf,
    /// Output folder (default: out/<plan file stem>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Worker threads (default: the available parallelism). The answer
    /// does not depend on it.
    #[arg(long, short, value_name = "J", value_parser = super::count_at_least_one)]
    pub jobs: Option<u64>,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `pdsim plan --help`'s text after the usage.
pub const LONG_ABOUT: &str = "\
Find the cheapest deployment that meets a scenario's SLOs, by simulating every candidate on its traffic.

FILE is a scenario (model, [hardware], workload or trace, [slo]) plus a [plan] table:

  [plan]
  max_gpus = 16            # required: candidates use at most this many GPUs
  attainment = 0.99        # share of requests that must meet every [slo] bound
  rate_per_s = 20.0        # target rate (default: the workload's own)
  search = \"max_rate\"      # or \"fixed\": only whether each candidate meets the target
  requests = 10000         # per trial (default: the workload's, at most 10,000)
  rate_tolerance = 0.05    # bisection precision, a share of the rate
  modes = [\"aggregated\", \"disaggregated\"]
  tp = [1, 2, 4, 8]        # TP sizes per role (prefill and decode may differ)
  # optional axes: max_num_batched_tokens, max_num_seqs, link_bandwidth_gb_s,
  # router_policy, step_time (a list of step times); [plan.step_time_by_tp]

Candidates: aggregated (ranks x TP) and P/D (prefill ranks x TP + decode ranks x TP) within max_gpus, \
times the axes. Each candidate whose analytic bound (its roles' roofline capacity, the handoff's bytes \
over the link) reaches the target is simulated: first at the target, then by bisection on the rate with \
the workload's shape kept (a trace's arrivals scaled), each trial stopping once it cannot meet the \
attainment. The best: the fewest GPUs that meet the target, then the highest goodput per GPU.

Writes DIR/candidates.csv (a row per candidate), DIR/best.toml (a scenario `pdsim run` takes as it is \
and that reproduces the claim), DIR/launch.sh (vLLM launch lines, NIXL's --kv-transfer-config for P/D) \
and DIR/plan.html (the frontier of goodput per GPU against interactivity, and the candidates), and prints \
a summary. The same file gives the same answer whatever --jobs.";

/// Runs `pdsim plan`.
///
/// # Errors
/// A bad plan file (exit 2), a run that fails, or Ctrl-C.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let plan = plan::load(&args.file)?;
    let out_dir = args.out.clone().unwrap_or_else(|| {
        let stem = args.file.file_stem().map_or_else(|| "plan".into(), |s| s.to_string_lossy().into_owned());
        PathBuf::from("out").join(stem)
    });
    create_dir(&out_dir)?;
    let jobs = args.jobs.map_or_else(default_jobs, |j| usize::try_from(j).unwrap_or(usize::MAX));
    let total = plan::space::candidates(&plan.spec, &plan.base).map_or(0, |c| c.len() as u64);
    let mut progress = ProgressGate::new(args.quiet, Some(total), "candidates");
    let mut met = 0usize;
    let result = search::run(&plan, jobs, &INTERRUPTED, |done, _, o| {
        met += usize::from(o.meets);
        progress.update(done as u64, || format!("{met} meet the SLO"));
    });
    progress.finish();
    let result = result?;
    if INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(interrupted("pdsim plan stopped before every candidate was priced; nothing written"));
    }
    write_file(&out_dir.join("candidates.csv"), |w| {
        use std::io::Write as _;
        writeln!(w, "{}", output::CSV_HEADER)?;
        for o in &result.outcomes {
            writeln!(w, "{}", output::csv_row(&plan, &result, o))?;
        }
        Ok(())
    })?;
    match result.best.map(|i| &result.outcomes[i]) {
        Some(best) => {
            let text = output::best_toml(&plan, &result, best, &out_dir).map_err(CmdError::Internal)?;
            write_file(&out_dir.join("best.toml"), |w| std::io::Write::write_all(w, text.as_bytes()))?;
            let lines = output::launch_lines(&plan, &best.candidate);
            write_file(&out_dir.join("launch.sh"), |w| std::io::Write::write_all(w, lines.as_bytes()))?;
        }
        None => {
            remove_if_present(&out_dir.join("best.toml"))?;
            remove_if_present(&out_dir.join("launch.sh"))?;
        }
    }
    let html = pdsim::html::plan_page(&plan, &result);
    write_file(&out_dir.join("plan.html"), |w| std::io::Write::write_all(w, html.as_bytes()))?;
    if !args.quiet {
        emit(&output::summary(&plan, &result, &out_dir))?;
    }
    Ok(())
}
