//! `pdsim run [SCENARIO]`: simulate a scenario and write its reports; also
//! what `pdsim` with no arguments does (the embedded default scenario).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actors::metrics::{Stat, Summary};
use pdsim::report::{self, digest_hex};
use pdsim::runner::{self, Run, default_jobs, ordered_parallel};
use pdsim::scenario::{self, DEFAULT_SCENARIO_LABEL, Scenario};

use super::live::{Live, TRACE_SPILLS};
use super::sweep::SummaryCsv;
use super::{
    CmdError, CsvFile, INTERRUPTED, ProgressGate, create_dir, emit, interrupted, list_error, remove_if_present,
};

/// Arguments of `pdsim run`.
#[derive(Debug, Default, clap::Args)]
pub struct Args {
    /// The scenario file (default: the embedded default scenario,
    /// scenarios/default.toml).
    pub scenario: Option<PathBuf>,
    /// Seed of every random stream (default: the scenario's `seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Serve this many requests instead of the scenario's count (a trace's
    /// `limit` still caps it).
    #[arg(long, value_name = "N", value_parser = super::count_at_least_one)]
    pub requests: Option<u64>,
    /// Folder for the report files (default: out/<scenario name, or the
    /// file's stem>); created if missing, files in it replaced.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
    /// Run R replicas with seeds S, S+1, …, S+R−1 in parallel, replica k
    /// (from 0, seed S+k) into DIR/replica-<k>/, and one row per replica in
    /// DIR/replicas.csv.
    #[arg(long, value_name = "R", value_parser = super::count_at_least_one)]
    pub replicas: Option<u64>,
    /// Worker threads for --replicas (default: the available parallelism).
    #[arg(long, short, value_name = "J", value_parser = super::count_at_least_one, requires = "replicas")]
    pub jobs: Option<u64>,
    /// Do not write trace.json (the largest file of a long run).
    #[arg(long)]
    pub no_trace: bool,
    /// Do not write timeline.csv (nothing else changes).
    #[arg(long)]
    pub no_timeline: bool,
    /// Do not write vllm-bench.json (the run as `vllm bench serve
    /// --save-result --save-detailed` writes it; its per-request lists
    /// hold one number per output token).
    #[arg(long)]
    pub no_vllm_bench: bool,
    /// The percentiles of report.json's `bench` statistics (and of
    /// replicas.csv's columns), comma-separated, in the form of vLLM's
    /// `--metric-percentiles` and named as vLLM names them (`p99`,
    /// `p99.9`); pdsim's default is 50,90,95,99 (vLLM's is 99 alone).
    #[arg(long, value_name = "P,...", default_value = "50,90,95,99", value_parser = super::percentiles_arg, allow_hyphen_values = true)]
    pub percentiles: super::Percentiles,
    /// Keep at most N values of each latency statistic exactly, then a
    /// quantile sketch (percentiles within 0.2 % of the exact ones; count,
    /// mean, max exact), so that memory stops growing with the requests:
    /// for runs of 10^7 requests and more. Default: every value exact.
    #[arg(long, value_name = "N")]
    pub sketch_above: Option<u64>,
    /// Also write report.html (as `pdsim report DIR` does) once the other
    /// files are whole; with --replicas, one in each replica's folder.
    #[arg(long)]
    pub html: bool,
}

/// The files of one run, in the order they are written.
pub const FILES: &[&str] =
    &["report.json", "requests.csv", "timeline.csv", "trace.json", pdsim::vllm_result::FILE_NAME];

/// Files made from a run's files (`--html`): removed with them before a
/// run, so that none is left from an earlier one.
pub const DERIVED: &[&str] = &[pdsim::html::FILE_NAME];

impl Args {
    /// The files this run writes.
    fn files(&self) -> Vec<&'static str> {
        FILES
            .iter()
            .copied()
            .filter(|f| {
                !(self.no_timeline && *f == "timeline.csv"
                    || self.no_trace && *f == "trace.json"
                    || self.no_vllm_bench && *f == pdsim::vllm_result::FILE_NAME)
            })
            .chain(self.html.then_some(pdsim::html::FILE_NAME))
            .collect()
    }
}

/// Writes `dir/report.html` when `--html` asked for it.
fn write_html(args: &Args, dir: &Path) -> Result<(), CmdError> {
    if args.html {
        pdsim::html::write(dir, None)?;
    }
    Ok(())
}

/// Loads the scenario (or the embedded default) with the label reports
/// name it by.
fn load(args: &Args) -> Result<(Scenario, String), CmdError> {
    match &args.scenario {
        Some(path) => Ok((scenario::load(path)?, path.display().to_string())),
        None => Ok((scenario::load_default()?, DEFAULT_SCENARIO_LABEL.to_owned())),
    }
}

/// `out/<scenario name>`, or `out/<file stem>` for a scenario with no name.
fn default_out(scenario: &Scenario, args: &Args) -> PathBuf {
    let name = scenario
        .name()
        .map(str::to_owned)
        .or_else(|| args.scenario.as_ref().and_then(|p| p.file_stem()).map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "default".to_owned());
    Path::new("out").join(name)
}

/// Runs the scenario (or replicas of it), writes the files, prints the
/// summary.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let (mut scenario, label) = load(args)?;
    let seed = args.seed.unwrap_or(scenario.seed());
    scenario.set_seed(seed);
    // Refused before the output folder is touched.
    scenario
        .workload()
        .check_arrival_span(args.requests, "--requests")
        .map_err(|e| CmdError::BadInput(format!("{}: {e}", scenario.source())))?;
    let dir = args.out.clone().unwrap_or_else(|| default_out(&scenario, args));
    keeps_inputs(&scenario, &dir, args)?;
    match args.replicas {
        None => single(args, &scenario, &label, &dir),
        Some(r) => replicas(args, &scenario, &label, &dir, r),
    }
}

fn single(args: &Args, scenario: &Scenario, label: &str, dir: &Path) -> Result<(), CmdError> {
    let total = args.requests.or(scenario.workload().requests());
    let mut progress = ProgressGate::new(args.quiet, total, "requests");
    let result = simulate_live(args, scenario, dir, |p| {
        progress.update(p.finished, || format!("simulated {:.0} s", p.now.as_secs_f64()));
    });
    progress.finish();
    let (run, live) = result?;
    write_files(args, scenario, label, &run, dir, live)?;
    write_html(args, dir)?;
    check_violations(&run)?;
    if !args.quiet {
        emit(&human_summary(scenario, label, &run, dir, &args.files()))?;
    }
    if run.interrupted {
        let o = &run.output;
        return Err(interrupted(format_args!(
            "stopped at simulated {:.3} s; {} covers the {} requests that entered by then",
            o.final_time.as_secs_f64(),
            dir.display(),
            o.summary.requests
        )));
    }
    Ok(())
}

/// Simulates `scenario` into `dir` with every file written as the run goes
/// ([`Live`]), so that a run of any length holds only what is in flight.
/// The folder is cleared first ([`clear_dir`]); a run that fails leaves
/// none of its files. The files are finished by [`write_files`].
fn simulate_live(
    args: &Args,
    scenario: &Scenario,
    dir: &Path,
    on_progress: impl FnMut(actors::sim::Progress),
) -> Result<(Run, Live), CmdError> {
    let files = args.files();
    let (want_timeline, want_trace) = (files.contains(&"timeline.csv"), files.contains(&"trace.json"));
    clear_dir(dir)?;
    let deployment = scenario.deployment();
    let shape = (deployment.prefill.is_some(), deployment.link.topology, scenario.front_end().response);
    let live = Live::create(dir, shape, want_timeline, want_trace)?;
    let keep = runner::Keep {
        timelines: want_timeline || want_trace,
        record_sink: Some(live.record_sink()),
        sample_sink: live.sample_sink(),
        percentiles: args.percentiles.0.clone(),
        sketch_above: args.sketch_above,
    };
    match runner::simulate_with(scenario, scenario.seed(), args.requests, on_progress, &INTERRUPTED, keep) {
        Ok(run) => Ok((run, live)),
        Err(e) => {
            live.discard();
            Err(e.into())
        }
    }
}

/// Creates `dir` and removes every file an earlier run may have left there
/// ([`FILES`], [`DERIVED`] and their `.partial` siblings, the trace's
/// spills), and what an earlier `--replicas` run left ([`clear_replicas`]).
/// Anything but a regular file under one of those names (a link, a
/// folder, a device) is refused before anything is removed, and left.
fn clear_dir(dir: &Path) -> Result<(), CmdError> {
    create_dir(dir)?;
    let replica_files = REPLICA_FILES.iter().flat_map(|f| [f.to_string(), format!("{f}.partial")]);
    for name in run_file_names().chain(replica_files) {
        pdsim::output::check_target(&dir.join(name)).map_err(CmdError::BadInput)?;
    }
    remove_run_files(dir)?;
    clear_replicas(dir)
}

/// [`FILES`], [`DERIVED`], their `.partial` siblings and the trace's
/// spills: every name a run writes in its folder.
fn run_file_names() -> impl Iterator<Item = String> {
    FILES
        .iter()
        .chain(DERIVED)
        .flat_map(|f| [f.to_string(), format!("{f}.partial")])
        .chain(TRACE_SPILLS.iter().map(|s| s.to_string()))
}

/// Removes [`run_file_names`] from `dir`.
fn remove_run_files(dir: &Path) -> Result<(), CmdError> {
    for name in run_file_names() {
        remove_if_present(&dir.join(name))?;
    }
    Ok(())
}

/// Whether `name` is a replica's folder as pdsim names it:
/// `replica-<k>`, `k` without leading zeros.
fn replica_index(name: &str) -> Option<u64> {
    let k = name.strip_prefix("replica-")?;
    k.parse::<u64>().ok().filter(|v| v.to_string() == k)
}

/// Removes what a `--replicas` run left in `dir`: replicas.csv and
/// replicas_summary.csv (their `.partial` siblings too), and in each
/// `replica-<k>` folder (`k` as pdsim writes it: no leading zeros) the run
/// files, and the folder once empty (one that still holds other files is
/// left with them: pdsim removes only the names it writes). So a folder
/// never lists replicas of two runs, nor a single run beside replicas,
/// even when a replicas run stops before its last replica. A
/// `replica-<k>` that is not a folder (a link to one elsewhere) is not
/// pdsim's, and left alone; so is anything but a regular file in one.
fn clear_replicas(dir: &Path) -> Result<(), CmdError> {
    for name in REPLICA_FILES {
        remove_if_present(&dir.join(name))?;
        remove_if_present(&dir.join(format!("{name}.partial")))?;
    }
    let entries = std::fs::read_dir(dir).map_err(|e| list_error(dir, &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| list_error(dir, &e))?;
        let name = entry.file_name();
        let replica = name.to_str().and_then(replica_index).is_some();
        // The entry's own type: a link is not followed.
        if replica && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let sub = entry.path();
            for name in run_file_names() {
                pdsim::output::remove_file_if_own(&sub.join(name)).map_err(CmdError::BadInput)?;
            }
            let _ = std::fs::remove_dir(&sub);
        }
    }
    Ok(())
}

/// Refuses an output folder whose clearing or writing would remove or
/// replace one of the run's own inputs (a trace kept as `data/trace.json`
/// with `--out data`), before anything is touched: the run would delete
/// its input and then fail to read it.
fn keeps_inputs(scenario: &Scenario, dir: &Path, args: &Args) -> Result<(), CmdError> {
    let Ok(real_dir) = std::fs::canonicalize(dir) else { return Ok(()) };
    // Every name a run (or its replicas) may remove or write there.
    let mut names: Vec<PathBuf> = run_file_names().map(|n| real_dir.join(n)).collect();
    names.extend(REPLICA_FILES.iter().flat_map(|n| [real_dir.join(n), real_dir.join(format!("{n}.partial"))]));
    for (field, input) in scenario.inputs() {
        // The input as its folder lists it, and the file it leads to.
        let listed = input
            .parent()
            .map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p })
            .and_then(|p| std::fs::canonicalize(p).ok())
            .zip(input.file_name())
            .map(|(p, n)| p.join(n));
        let real = std::fs::canonicalize(input).ok();
        let in_replica = |p: &Path| {
            p.parent().is_some_and(|sub| {
                sub.parent() == Some(real_dir.as_path())
                    && sub.file_name().and_then(|n| n.to_str()).and_then(replica_index).is_some()
                    && p.file_name().is_some_and(|n| run_file_names().any(|r| n == r.as_str()))
            })
        };
        let hit = [listed, real].into_iter().flatten().any(|p| names.contains(&p) || in_replica(&p));
        if hit {
            let flag = if args.out.is_some() { "--out" } else { "the output folder" };
            return Err(CmdError::BadInput(format!(
                "{flag} {}: the run would remove and rewrite {}, which is its own input ({} of {}); write \
                 the run elsewhere, or rename the input",
                dir.display(),
                input.display(),
                field,
                scenario.source()
            )));
        }
    }
    Ok(())
}

/// The files of a `--replicas` run's folder, beside its `replica-<k>`
/// folders.
const REPLICA_FILES: [&str; 2] = ["replicas.csv", "replicas_summary.csv"];

/// Finishes the files `live` streamed into the cleared `dir` and writes
/// report.json last, once the others are whole. So the folder never mixes
/// two runs, and a folder with a report.json holds all of its run's
/// files, whatever stopped the writing (a full disk, a second Ctrl-C).
fn write_files(
    args: &Args,
    scenario: &Scenario,
    label: &str,
    run: &Run,
    dir: &Path,
    live: Live,
) -> Result<(), CmdError> {
    let rep = report::report(scenario, label, run);
    let path = dir.join("report.json");
    live.finish(label, run, |requests| {
        let mut last = Vec::new();
        if !args.no_vllm_bench {
            // From requests.csv (whole, not yet in place), before
            // report.json, which comes last.
            let model = scenario.model_spec().name.as_deref().or(scenario.name()).unwrap_or(label);
            let setup = pdsim::vllm_result::Setup {
                label: scenario.name(),
                model,
                num_prompts: run.output.summary.requests,
                workload: scenario.workload(),
                bench: rep.bench,
            };
            let target = dir.join(pdsim::vllm_result::FILE_NAME);
            let mut f = pdsim::output::TempFile::create(&target).map_err(CmdError::BadInput)?;
            pdsim::vllm_result::write(f.writer(), requests, &setup).map_err(|e| super::write_error(&target, &e))?;
            last.push(f);
        }
        let mut f = pdsim::output::TempFile::create(&path).map_err(CmdError::BadInput)?;
        report::write_report(f.writer(), &rep).map_err(|e| super::write_error(&path, &e))?;
        last.push(f);
        Ok(last)
    })
}

/// A run whose conservation checks failed is a bug in pdsim: exit 1, after
/// the files are written (they help find it).
fn check_violations(run: &Run) -> Result<(), CmdError> {
    let v = &run.output.violations;
    if v.is_empty() {
        Ok(())
    } else {
        Err(CmdError::Internal(format!(
            "seed {}: the simulation broke {} conservation check(s): {} (this is a bug in pdsim)",
            run.seed,
            v.len(),
            v.join("; ")
        )))
    }
}

fn stat_cols(s: &Stat) -> String {
    if s.count == 0 { "-".to_owned() } else { format!("{:>10.2} {:>10.2} {:>10.2}", s.mean, s.median, s.p99) }
}

fn rate(count: f64, wall: Duration) -> f64 {
    let secs = wall.as_secs_f64();
    if secs > 0.0 { count / secs } else { f64::INFINITY }
}

/// Where the model and the GPU came from, when a preset or a config
/// named them: `setup        model preset llama-3.1-8b, GPU preset h200`.
fn setup_line(scenario: &Scenario) -> Option<String> {
    let gpu = scenario.deployment().hardware.as_ref().map(|h| match &h.gpu {
        Some(id) => format!("GPU preset {id}"),
        None => "GPU as given".to_owned(),
    });
    let model = scenario.model_origin().map(|o| format!("model {o}"));
    let parts: Vec<String> = model.into_iter().chain(gpu).collect();
    (!parts.is_empty()).then(|| format!("setup        {}", parts.join(", ")))
}

/// The summary's line for an overloaded run (see [`report::Overload`]):
/// offered and served rates, the backlog, and the bottleneck with its
/// wait and every role's busy share.
pub fn overload_line(o: &report::Overload) -> Option<String> {
    if !o.overloaded {
        return None;
    }
    let busy: Vec<String> = o.busy_share.iter().map(|(k, b)| format!("{k} {:.1}%", 100.0 * b)).collect();
    let bottleneck = o.bottleneck.map_or_else(String::new, |b| {
        let wait = o.wait_ms.get(b).copied().unwrap_or(0.0);
        let share = o.bottleneck_ttft_share.map(|x| format!(", {:.0}% of mean TTFT", 100.0 * x)).unwrap_or_default();
        format!("; bottleneck {b} (waited in front of it {wait:.1} ms{share}; busy {})", busy.join(", "))
    });
    Some(format!(
        "overload     offered {:.2} req/s > served {:.2} req/s: {} requests in the system at the last arrival, growing {:.2}/s{bottleneck}",
        o.arrival_rate_per_s.unwrap_or(0.0),
        o.completion_rate_per_s,
        o.backlog_at_last_arrival,
        o.backlog_growth_per_s,
    ))
}

/// The printed summary of one run.
pub fn human_summary(scenario: &Scenario, label: &str, run: &Run, dir: &Path, files: &[&str]) -> String {
    let s: &Summary = &run.output.summary;
    let out = &run.output;
    let mut t = String::new();
    let name = scenario.name().unwrap_or("unnamed");
    let _ = writeln!(t, "pdsim {}: {name} ({label}), seed {}", report::PDSIM_VERSION, run.seed);
    if let Some(line) = setup_line(scenario) {
        let _ = writeln!(t, "{line}");
    }
    let _ = writeln!(t, "requests     {} entered, {} completed, {} failed", s.requests, s.completed, s.failed);
    for (reason, n) in &s.failure_reasons {
        let _ = writeln!(t, "  failed     {n} x {reason}");
    }
    let _ = writeln!(
        t,
        "throughput   {:.2} req/s, {:.1} output tok/s, {:.1} total tok/s over {:.1} s",
        s.request_throughput, s.output_token_throughput, s.total_token_throughput, s.duration_s
    );
    if let Some(line) = overload_line(&report::overload(scenario, run)) {
        let _ = writeln!(t, "{line}");
    }
    let slo = scenario.slo();
    if slo.ttft_ms.is_some() || slo.tpot_ms.is_some() || slo.e2e_ms.is_some() {
        let _ = writeln!(t, "goodput      {:.2} req/s, SLO attainment {:.1}%", s.goodput, 100.0 * s.slo_attainment);
    }
    let _ = writeln!(t, "{:<11}{:>10} {:>10} {:>10}", "latency ms", "mean", "median", "p99");
    for (what, stat) in [
        ("TTFT", &s.ttft_ms),
        ("TPOT", &s.tpot_ms),
        ("ITL", &s.itl_ms),
        ("E2E", &s.e2e_ms),
        ("prefill q", &s.prefill_queue_ms),
        ("decode q", &s.decode_queue_ms),
    ] {
        let _ = writeln!(t, "  {what:<9}{}", stat_cols(stat));
    }
    if !out.links.is_empty() {
        let transfers: u64 = out.links.iter().map(|l| l.stats.transfers).sum();
        let _ = writeln!(
            t,
            "transfers    {transfers} over {} link(s), {:.2} GB; wait mean {:.3} ms p99 {:.3} ms; time mean {:.3} ms p99 {:.3} ms",
            out.links.len(),
            s.transfer_bytes as f64 / 1e9,
            s.transfer_wait_ms.mean,
            s.transfer_wait_ms.p99,
            s.transfer_time_ms.mean,
            s.transfer_time_ms.p99
        );
    }
    let _ = writeln!(
        t,
        "cache        {} preemptions; prefix hits {} prefill-side + {} decode-side tokens",
        s.preemptions, s.prefill_hit_tokens, s.decode_hit_tokens
    );
    let peak = out
        .ranks
        .iter()
        .map(|r| format!("{} {:.0}%", r.name, 100.0 * r.peak_used_blocks as f64 / r.num_blocks.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(t, "peak KV      {peak}");
    let _ = writeln!(
        t,
        "simulated    {:.1} s in {:.2} s wall: {:.0} requests/s, {:.0}x real time, {} events; digest {}",
        out.final_time.as_secs_f64(),
        run.wall.as_secs_f64(),
        rate(s.requests as f64, run.wall),
        rate(out.final_time.as_secs_f64(), run.wall),
        out.events,
        digest_hex(out.digest)
    );
    let _ = writeln!(t, "wrote        {}/{{{}}}", dir.display(), files.join(", "));
    t
}

/// One row of `replicas.csv` (no newline): the replica and its seed, then
/// the same metric columns as a sweep row ([`pdsim::sweep::metric_header`]).
fn replica_row(k: u64, scenario: &Scenario, label: &str, run: &Run) -> String {
    format!("{k},{},{}", run.seed, pdsim::sweep::metrics_cells(&report::report(scenario, label, run)))
}

/// Refuses a `replica-<k>` (k below `count`) in `dir` that is not a
/// folder (a link to a folder elsewhere, a file): a replica is written
/// only into a folder of its own, never through a link. Before anything
/// is cleared or run.
fn check_replica_dirs(dir: &Path, count: u64) -> Result<(), CmdError> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for entry in entries {
        let entry = entry.map_err(|e| list_error(dir, &e))?;
        let k = entry.file_name().to_str().and_then(replica_index);
        if k.is_some_and(|k| k < count) && !entry.file_type().is_ok_and(|t| t.is_dir()) {
            pdsim::output::own_dir(dir, &entry.path()).map_err(CmdError::BadInput)?;
        }
    }
    Ok(())
}

fn replicas(args: &Args, scenario: &Scenario, label: &str, dir: &Path, count: u64) -> Result<(), CmdError> {
    let start = Instant::now();
    let seed = scenario.seed();
    let jobs = args.jobs.map_or_else(default_jobs, |j| usize::try_from(j).unwrap_or(usize::MAX));
    let n = usize::try_from(count).map_err(|_| CmdError::BadInput(format!("--replicas {count}: too many")))?;
    // Every seed must fit before anything runs; seed S + k is made as
    // replica k starts, so nothing grows with the count asked for.
    let last_seed = seed
        .checked_add(count - 1)
        .ok_or_else(|| CmdError::BadInput(format!("--seed {seed} --replicas {count}: the seeds pass 2^64 - 1")))?;
    check_replica_dirs(dir, count)?;
    // No single run's files beside the replicas', and no replica of an
    // earlier run (each replica clears its folder again as it starts).
    clear_dir(dir)?;
    let csv_path = dir.join("replicas.csv");
    let mut csv = CsvFile::create(&csv_path)?;
    csv.line(&format!("replica,seed,{}", pdsim::sweep::metric_header(&args.percentiles.0)))?;
    let (mut lines, mut rows) = (Vec::new(), Vec::new());
    let mut progress = ProgressGate::new(args.quiet, Some(count), "replicas");
    let result = ordered_parallel(
        n,
        jobs,
        |k| -> Result<(String, String), CmdError> {
            if INTERRUPTED.load(Ordering::Relaxed) {
                return Err(interrupted(format_args!(
                    "replica {k} was not started; replicas.csv lists the replicas before it"
                )));
            }
            let mut scenario = scenario.clone();
            scenario.set_seed(seed + k as u64);
            let sub = dir.join(format!("replica-{k}"));
            pdsim::output::own_dir(dir, &sub).map_err(CmdError::BadInput)?;
            // Each replica streams its files as a single run does, so
            // that memory holds only what the running replicas have in
            // flight.
            let (run, live) = simulate_live(args, &scenario, &sub, |_| {})?;
            if run.interrupted {
                live.discard();
                let _ = std::fs::remove_dir(&sub);
                return Err(interrupted(format_args!(
                    "replica {k} was stopped and not written; replicas.csv lists the replicas before it"
                )));
            }
            write_files(args, &scenario, label, &run, &sub, live)?;
            write_html(args, &sub)?;
            check_violations(&run)?;
            let s = &run.output.summary;
            let line = format!(
                "  replica-{k:<3} seed {:<6} {:>6} completed {:>4} failed  {:>8.2} req/s  TTFT p50 {:>9.2} p99 {:>9.2} ms  TPOT p50 {:>7.2} p99 {:>7.2} ms  {}",
                run.seed,
                s.completed,
                s.failed,
                s.request_throughput,
                s.ttft_ms.median,
                s.ttft_ms.p99,
                s.tpot_ms.median,
                s.tpot_ms.p99,
                digest_hex(run.output.digest)
            );
            Ok((replica_row(k as u64, &scenario, label, &run), line))
        },
        |k, (row, line)| {
            csv.line(&row)?;
            rows.push(row);
            lines.push(line);
            progress.update(k as u64 + 1, String::new);
            Ok(())
        },
    );
    progress.finish();
    // The rows of the replicas before one that stopped or failed stay.
    let placed = csv.finish();
    result?;
    placed?;
    let header = pdsim::sweep::metric_header(&args.percentiles.0);
    let mut summary = SummaryCsv::create(&dir.join("replicas_summary.csv"), "", "replicas", &header)?;
    let cells: Vec<Vec<&str>> = rows.iter().map(|r| r.split(',').skip(2).collect()).collect();
    summary.group("", &cells)?;
    summary.finish()?;
    if !args.quiet {
        let mut t = String::new();
        let name = scenario.name().unwrap_or("unnamed");
        let _ = writeln!(
            t,
            "pdsim {}: {name} ({label}), {count} replicas, seeds {seed}..={}, {jobs} jobs",
            report::PDSIM_VERSION,
            last_seed,
        );
        for l in &lines {
            let _ = writeln!(t, "{l}");
        }
        let _ = writeln!(t, "wall time    {:.2} s", start.elapsed().as_secs_f64());
        let _ = writeln!(t, "wrote        {} and {}/replica-<k>/", csv_path.display(), dir.display());
        emit(&t)?;
    }
    Ok(())
}
