//! `pdsim sweep SWEEP.toml`: run every point of a sweep (or one shard of
//! them) on worker threads and write one row per point to a CSV file, in
//! point order whatever the number of threads.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use actors::bench::{Bench, Value};
use pdsim::report::{self, Report, csv_field};
use pdsim::runner::{self, default_jobs, ordered_parallel};
use pdsim::sweep::{Shard, Sweep, value_text};

use super::{
    CmdError, CsvFile, INTERRUPTED, ProgressGate, create_dir, emit, interrupted, list_error, remove_if_present,
    write_error, write_file,
};

/// Arguments of `pdsim sweep`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The sweep file (a base scenario, seeds, and axes).
    pub sweep: PathBuf,
    /// Worker threads (default: the available parallelism). The output does
    /// not depend on it.
    #[arg(long, short, value_name = "J", value_parser = super::count_at_least_one)]
    pub jobs: Option<u64>,
    /// Run only shard K of N (1-based): the K-th of N contiguous slices of
    /// the points. Writes DIR/sweep.shard-K-of-N.csv, with the header in
    /// shard 1 only, so that `cat DIR/sweep.shard-*-of-N.csv` is the whole
    /// sweep's sweep.csv, byte for byte.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<Shard>,
    /// Serve this many requests at every point, replacing the sweep file's
    /// `requests` (for a quick trial of a big sweep).
    #[arg(long, value_name = "N", value_parser = super::count_at_least_one)]
    pub requests: Option<u64>,
    /// Output folder (default: out/<sweep file stem>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
    /// The percentiles of the `bench` columns, as vLLM's
    /// `--metric-percentiles`.
    #[arg(long, value_name = "P,...", default_value = "50,90,95,99", value_parser = super::percentiles_arg, allow_hyphen_values = true)]
    pub percentiles: super::Percentiles,
    /// Also write each point's report.json, as `pdsim run` of the point's
    /// scenario would write it, into DIR/points/<point>/report.json.
    #[arg(long)]
    pub reports: bool,
}

/// The file of each grid point's statistics over its seeds.
pub const SUMMARY_FILE: &str = "sweep_summary.csv";

/// What a point hands to the writer.
struct PointOut {
    /// Its sweep.csv row (no newline).
    row: String,
    /// Its axis cells, each followed by a comma.
    axes: String,
    /// Its metric cells ([`metric_header`]'s columns).
    metrics: String,
    /// Its report.json, with `--reports`.
    report: Option<Vec<u8>>,
}

/// The folder of a point's files under the output folder `dir`
/// (`--reports`): `DIR/points/<name>/`, `name` from
/// [`Sweep::point_folder`] (its axis values and seed).
pub fn point_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join(POINTS_DIR).join(name)
}

/// The folder of the points' reports, in the sweep's folder.
const POINTS_DIR: &str = "points";

/// The first metric columns of `sweep.csv`, after `point`, the axes and
/// `seed`; the `bench` ones follow ([`metric_header`]).
pub const METRIC_COLUMNS: &[&str] = &[
    "requests",
    "completed",
    "failed",
    "request_throughput",
    "output_token_throughput",
    "goodput",
    "slo_attainment",
    "ttft_mean_ms",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_mean_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "itl_p99_ms",
    "e2e_mean_ms",
    "e2e_p99_ms",
    "transfer_wait_mean_ms",
    "transfer_time_mean_ms",
    "preemptions",
    "transfer_bytes",
    "prefill_hit_tokens",
    "decode_hit_tokens",
    "prefill_busy_share",
    "decode_busy_share",
    "aggregated_busy_share",
    "link_busy_share",
    "prefill_peak_kv_used_fraction",
    "decode_peak_kv_used_fraction",
    "aggregated_peak_kv_used_fraction",
    "overloaded",
    "bottleneck",
    "slo_ttft_ms",
    "slo_tpot_ms",
    "slo_e2e_ms",
    "digest",
];

/// The roles of the `<role>_busy_share` and `<role>_peak_kv_used_fraction`
/// columns, in column order.
const ROLES: [&str; 3] = ["prefill", "decode", "aggregated"];

/// N of a shard's file name (`sweep.shard-K-of-N.csv`, as [`file_name`]
/// makes it), or `None` for any other name.
fn shard_count(name: &str) -> Option<usize> {
    let (k, n) = name.strip_prefix("sweep.shard-")?.strip_suffix(".csv")?.split_once("-of-")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(k) && digits(n)).then(|| n.parse().ok()).flatten()
}

/// The CSV file name: `sweep.csv`, or `sweep.shard-K-of-N.csv` with K
/// zero-padded to the width of N (so the files sort in shard order).
pub fn file_name(shard: Option<Shard>) -> String {
    match shard {
        None => "sweep.csv".to_owned(),
        Some(Shard { k, n }) => {
            let width = n.to_string().len();
            format!("sweep.shard-{k:0width$}-of-{n}.csv")
        }
    }
}

/// Rates, fractions and milliseconds with six decimals (the statistics
/// come from nanoseconds, so more digits would be rounding noise).
fn f6(x: f64) -> String {
    format!("{x:.6}")
}

/// Whether a `bench` field is a column of its own (`completed`, `failed`
/// and `request_throughput` are already [`METRIC_COLUMNS`], with the same
/// values).
fn own_column(name: &str) -> bool {
    !METRIC_COLUMNS.contains(&name)
}

/// Every metric column: [`METRIC_COLUMNS`], then the `bench` fields under
/// their report.json names, for these percentiles.
pub fn metric_header(percentiles: &[f64]) -> String {
    let mut cols: Vec<String> = METRIC_COLUMNS.iter().map(|c| (*c).to_owned()).collect();
    cols.extend(Bench::keys(percentiles).into_iter().filter(|k| own_column(k)));
    cols.join(",")
}

/// The cells of [`metric_header`]'s columns (no newline), taken from the
/// run's report (so that every cell is the number report.json holds, to
/// six decimals).
pub(crate) fn metrics_cells(rep: &Report<'_>) -> String {
    let mut cells = first_cells(rep);
    for (k, v) in rep.bench.entries() {
        if own_column(&k) {
            cells.push(',');
            match v {
                Value::Int(i) => cells.push_str(&i.to_string()),
                Value::Float(x) => cells.push_str(&f6(x)),
                Value::Null => {}
            }
        }
    }
    cells
}

fn first_cells(rep: &Report<'_>) -> String {
    let s = rep.summary;
    let mut cells = vec![
        s.requests.to_string(),
        s.completed.to_string(),
        s.failed.to_string(),
        f6(s.request_throughput),
        f6(s.output_token_throughput),
        f6(s.goodput),
        f6(s.slo_attainment),
        f6(s.ttft_ms.mean),
        f6(s.ttft_ms.median),
        f6(s.ttft_ms.p99),
        f6(s.tpot_ms.mean),
        f6(s.tpot_ms.median),
        f6(s.tpot_ms.p99),
        f6(s.itl_ms.p99),
        f6(s.e2e_ms.mean),
        f6(s.e2e_ms.p99),
        f6(s.transfer_wait_ms.mean),
        f6(s.transfer_time_ms.mean),
        s.preemptions.to_string(),
        s.transfer_bytes.to_string(),
        s.prefill_hit_tokens.to_string(),
        s.decode_hit_tokens.to_string(),
    ];
    // A role the deployment does not have leaves its cells empty.
    let busy = |role: &str| rep.overload.busy_share.get(role).map_or_else(String::new, |b| f6(*b));
    cells.extend(ROLES.iter().chain(&["link"]).map(|r| busy(r)));
    cells.extend(ROLES.iter().map(|&role| {
        rep.ranks
            .iter()
            .filter(|r| r.role.as_str() == role)
            .map(|r| r.peak_used_fraction)
            .reduce(f64::max)
            .map_or_else(String::new, f6)
    }));
    // The overload check and its bottleneck (report.json's `overload`),
    // and the scenario's SLO bounds (empty when it sets none), so that a
    // sweep's page can mark overloaded points and draw the bounds.
    cells.push(rep.overload.overloaded.to_string());
    cells.push(rep.overload.bottleneck.unwrap_or("").to_owned());
    let slo = rep.scenario.resolved.get("slo");
    for bound in ["ttft_ms", "tpot_ms", "e2e_ms"] {
        cells.push(slo.and_then(|s| s.get(bound)).and_then(serde_json::Value::as_f64).map_or_else(String::new, f6));
    }
    cells.push(rep.digest.clone());
    cells.join(",")
}

/// Student's t at 0.975 for `df` degrees of freedom: 1 to 30 as tabled,
/// past that the Cornish–Fisher expansion in 1/df to the third order
/// (within 1e-4 of the table from 30 on: 2.0211 at 40, 2.0003 at 60,
/// 1.9799 at 120; 1.96 in the limit). Rounding a df between rows to a row
/// made the interval too narrow (2.021 for 31, where t is 2.040).
fn t_975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => T[df - 1],
        _ => {
            // z: the normal's 0.975 quantile.
            let (z, v) = (1.959_963_984_540_054_f64, df as f64);
            let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
            z + (z3 + z) / (4.0 * v)
                + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * v * v)
                + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * v * v * v)
        }
    }
}

/// The statistics of a summary file, one row each, in this order.
pub const STATISTICS: [&str; 4] = ["mean", "std", "ci95_low", "ci95_high"];

/// A summary across seeds of rows of metric cells ([`metric_header`]'s
/// columns): `replicas_summary.csv` (one group, the replicas) and
/// `sweep_summary.csv` (one group per grid point, its seeds). For each
/// group, one row per [`STATISTICS`]: per column, the mean over the
/// group's rows, the sample standard deviation, and the 95 % confidence
/// interval of the mean (mean ± t(0.975, n − 1) × std / √n). A column
/// that is not a number in every row (a null goodput, a role the
/// deployment lacks), and the digest, are left empty; with one row, std
/// and the interval are too. Written a group at a time, flushed.
pub(crate) struct SummaryCsv {
    csv: CsvFile,
    header: String,
}

impl SummaryCsv {
    /// Creates `path` with its header: the `lead` columns (each followed
    /// by a comma, or empty), `statistic`, `count` (the column of each
    /// group's number of rows: `replicas`, `seeds`), then `header`.
    pub(crate) fn create(path: &Path, lead: &str, count: &str, header: &str) -> Result<Self, CmdError> {
        let mut csv = CsvFile::create(path)?;
        csv.line(&format!("{lead}statistic,{count},{header}"))?;
        Ok(SummaryCsv { csv, header: header.to_owned() })
    }

    /// Writes the rows of one group: `lead` (its leading cells, each
    /// followed by a comma) and its rows' cells, one `Vec` per row.
    pub(crate) fn group(&mut self, lead: &str, rows: &[Vec<&str>]) -> Result<(), CmdError> {
        let mut out: [Vec<String>; 4] = Default::default();
        for (c, name) in self.header.split(',').enumerate() {
            // The digest is hex: a number only by accident.
            let values: Option<Vec<f64>> = if name == "digest" {
                None
            } else {
                rows.iter().map(|r| r.get(c).and_then(|v| v.parse::<f64>().ok())).collect()
            };
            let (mean, std, lo, hi) = match values {
                Some(v) if !v.is_empty() && v.iter().all(|x| x.is_finite()) => {
                    let n = v.len() as f64;
                    let mean = v.iter().sum::<f64>() / n;
                    if v.len() < 2 {
                        (Some(mean), None, None, None)
                    } else {
                        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
                        let std = var.sqrt();
                        let half = t_975(v.len() - 1) * std / n.sqrt();
                        (Some(mean), Some(std), Some(mean - half), Some(mean + half))
                    }
                }
                _ => (None, None, None, None),
            };
            for (cells, x) in out.iter_mut().zip([mean, std, lo, hi]) {
                cells.push(x.map_or_else(String::new, f6));
            }
        }
        let n = rows.len();
        for (name, cells) in STATISTICS.iter().zip(&out) {
            self.csv.line(&format!("{lead}{name},{n},{}", cells.join(",")))?;
        }
        Ok(())
    }
}

/// Loads the sweep, checks every point, runs this shard's points and
/// writes their rows.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let start = Instant::now();
    let sweep = Sweep::load(&args.sweep)?;
    // Every point is checked, whatever the shard, so that every shard of a
    // bad sweep fails the same way before anything runs.
    let points = sweep.points()?;
    let requests = args.requests.or(sweep.requests);
    let from = if args.requests.is_some() { "--requests" } else { "the sweep's requests" };
    for p in &points {
        p.scenario
            .workload()
            .check_arrival_span(requests, from)
            .map_err(|e| CmdError::BadInput(format!("{}: point {}: {e}", args.sweep.display(), p.index)))?;
    }
    let mine: Vec<usize> = args.shard.map_or(0..points.len(), |s| s.range(points.len())).collect();
    let dir = args.out.clone().unwrap_or_else(|| {
        let stem = args.sweep.file_stem().map_or_else(|| "sweep".into(), |s| s.to_string_lossy().into_owned());
        Path::new("out").join(stem)
    });
    create_dir(&dir)?;
    let path = dir.join(file_name(args.shard));
    let mut csv = CsvFile::create(&path)?;
    // The axis columns, each followed by a comma.
    let axes_header: String = sweep.axes().iter().map(|a| csv_field(&a.path) + ",").collect();
    let metrics_header = metric_header(&args.percentiles.0);
    if args.shard.is_none_or(|s| s.k == 1) {
        csv.line(&format!("point,{axes_header}seed,{metrics_header}"))?;
    }
    // With several seeds, each grid point's statistics over its seeds (a
    // shard may hold only some seeds of a grid point: none there).
    let summary_path = dir.join(SUMMARY_FILE);
    let seeds = sweep.seeds.len();
    let mut summary = None;
    if args.shard.is_none() {
        if seeds > 1 {
            summary = Some(SummaryCsv::create(&summary_path, &axes_header, "seeds", &metrics_header)?);
        } else {
            // One an earlier sweep left would not be this sweep's.
            remove_if_present(&summary_path)?;
        }
    }
    // Point reports and a page an earlier sweep left in the folder would
    // not describe this sweep's rows. Shards share the folder: each
    // clears its own points only.
    let gone = |p: &Path| match std::fs::remove_dir_all(p).or_else(|_| std::fs::remove_file(p)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(write_error(p, &e)),
        _ => Ok(()),
    };
    match args.shard {
        None => gone(&dir.join(POINTS_DIR))?,
        Some(_) => mine.iter().try_for_each(|&i| gone(&point_dir(&dir, &sweep.point_folder(points[i].index))))?,
    }
    // The page describes rows that are being rewritten, whichever shard
    // this is.
    gone(&dir.join("report.html"))?;
    // Rows of another split of the points: a whole sweep's beside shards,
    // or shards of another count. (Shards of this count are this sweep's
    // other slices, and stay.)
    if args.shard.is_some() {
        gone(&dir.join(file_name(None)))?;
        gone(&summary_path)?;
    }
    let entries = std::fs::read_dir(&dir).map_err(|e| list_error(&dir, &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| list_error(&dir, &e))?;
        let name = entry.file_name();
        let count = name.to_str().and_then(shard_count);
        if count.is_some_and(|n| args.shard.is_none_or(|s| s.n != n)) {
            gone(&entry.path())?;
        }
    }
    // The metric cells of the current grid point's seeds so far.
    let mut group: Vec<String> = Vec::with_capacity(seeds);
    // A point's report names the base scenario as the sweep file reaches it.
    let label = sweep.scenario_path.display().to_string();
    let jobs = args.jobs.map_or_else(default_jobs, |j| usize::try_from(j).unwrap_or(usize::MAX));
    let mut progress = ProgressGate::new(args.quiet, Some(mine.len() as u64), "points");
    let mut done = 0u64;
    let result = ordered_parallel(
        mine.len(),
        jobs,
        |i| -> Result<(usize, PointOut), CmdError> {
            let p = &points[mine[i]];
            let written = || format!("{} holds the rows of the points before point {}", path.display(), p.index);
            if INTERRUPTED.load(Ordering::Relaxed) {
                return Err(interrupted(written()));
            }
            // A point's row and report need only the summary and the rank
            // and link reports: no record or timeline sample is kept
            // (neither changes another number), so a point holds only what
            // is in flight.
            let keep = runner::Keep {
                timelines: false,
                record_sink: Some(Box::new(|_| {})),
                sample_sink: None,
                percentiles: args.percentiles.0.clone(),
                sketch_above: None,
            };
            let run = runner::simulate_with(&p.scenario, p.seed, requests, |_| {}, &INTERRUPTED, keep)?;
            if run.interrupted {
                return Err(interrupted(written()));
            }
            if !run.output.violations.is_empty() {
                return Err(CmdError::Internal(format!(
                    "{}: point {}: the simulation broke conservation checks: {} (this is a bug in pdsim)",
                    sweep.file,
                    p.index,
                    run.output.violations.join("; ")
                )));
            }
            let axes: String = p.values.iter().map(|v| csv_field(&value_text(v)) + ",").collect();
            let rep = report::report(&p.scenario, &label, &run);
            let metrics = metrics_cells(&rep);
            let row = format!("{},{axes}{},{metrics}", p.index, p.seed);
            let report = if args.reports {
                let mut bytes = Vec::new();
                report::write_report(&mut bytes, &rep)
                    .map_err(|e| CmdError::Internal(format!("point {}: cannot format report.json: {e}", p.index)))?;
                Some(bytes)
            } else {
                None
            };
            Ok((p.index, PointOut { row, axes, metrics, report }))
        },
        |_, (index, out)| {
            // A point's report is whole before its row is written, so
            // that every row of sweep.csv has its report.
            if let Some(bytes) = out.report {
                let sub = point_dir(&dir, &sweep.point_folder(index));
                create_dir(&sub)?;
                write_file(&sub.join("report.json"), |w| w.write_all(&bytes))?;
            }
            csv.line(&out.row)?;
            if let Some(summary) = &mut summary {
                // Seeds vary fastest: a grid point's rows come together.
                group.push(out.metrics);
                if group.len() == seeds {
                    let cells: Vec<Vec<&str>> = group.iter().map(|m| m.split(',').collect()).collect();
                    summary.group(&out.axes, &cells)?;
                    group.clear();
                }
            }
            done += 1;
            progress.update(done, String::new);
            Ok(())
        },
    );
    progress.finish();
    result?;
    if !args.quiet {
        let mut t = String::new();
        let zipped = if sweep.dims().iter().any(|d| d.zip.is_some()) {
            format!(" in {} dimensions (zips advance together)", sweep.dims().len())
        } else {
            String::new()
        };
        let shard = args.shard.map(|s| format!(" (shard {s}: {} of them)", mine.len())).unwrap_or_default();
        let _ = writeln!(
            t,
            "pdsim {}: sweep {} of {}: {} points{shard}, {} axes{zipped} x {} seed(s), {} jobs",
            pdsim::report::PDSIM_VERSION,
            sweep.file,
            sweep.scenario_path.display(),
            points.len(),
            sweep.axes().len(),
            sweep.seeds.len(),
            jobs.min(mine.len().max(1))
        );
        let _ = writeln!(t, "wall time    {:.2} s", start.elapsed().as_secs_f64());
        let _ = writeln!(t, "wrote        {}", path.display());
        if summary.is_some() {
            let _ = writeln!(t, "wrote        {}", summary_path.display());
        }
        if args.reports {
            let _ = writeln!(
                t,
                "wrote        {}/<point>/report.json (<point>: {}, …)",
                dir.join(POINTS_DIR).display(),
                sweep.point_folder(0)
            );
        }
        emit(&t)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The expansion against the printed table (t at 0.975: df 31 2.0395,
    /// 40 2.0211, 60 2.0003, 120 1.9799, 1000 1.9623) and its continuity
    /// with the tabled rows at 30 (2.0423).
    #[test]
    fn t_past_the_table_is_the_tables_value() {
        for (df, t) in [(31, 2.0395), (40, 2.0211), (60, 2.0003), (120, 1.9799), (1000, 1.9623)] {
            assert!((super::t_975(df) - t).abs() < 2e-4, "df {df}: {} against {t}", super::t_975(df));
        }
        assert!((super::t_975(31) - super::t_975(30)).abs() < 0.005);
        assert!(super::t_975(31) < super::t_975(30));
    }
}
