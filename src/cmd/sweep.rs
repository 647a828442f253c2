//! `pdsim sweep SWEEP.toml`: run every point of a sweep (or one shard of
//! them) on worker threads and write one row per point to a CSV file, in
//! point order whatever the number of threads.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use pdsim::report::{self, Report};
use pdsim::runner::{default_jobs, ordered_parallel};
use pdsim::sweep::{Shard, Sweep, axis_cells, f6, metric_header, metrics_cells, row, run_point, value_text};

use super::{
    CmdError, CsvFile, INTERRUPTED, ProgressGate, create_dir, emit, interrupted, list_error, remove_if_present,
    write_file,
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
    /// The percentiles of the `bench` columns, comma-separated, in the form
    /// of vLLM's `--metric-percentiles` and named as vLLM names them
    /// (`p99`, `p99.9`); pdsim's default is 50,90,95,99 (vLLM's is 99
    /// alone).
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
    /// Its row of the table printed on the terminal.
    printed: Vec<String>,
}

/// The compact table of the points a sweep prints on the terminal: the
/// point, its axis values (and seed, with several), then what was served
/// and its latencies. At most [`PointTable::HEAD`] points from the start
/// and as many from the end are kept (the rest are counted), so the
/// table is bounded however large the sweep; `sweep.csv` has every
/// column of every point.
struct PointTable {
    header: Vec<String>,
    head: Vec<Vec<String>>,
    tail: std::collections::VecDeque<Vec<String>>,
    skipped: usize,
    seeds: bool,
    slo: bool,
    /// The columns aligned to the left: the point and the axes.
    left: usize,
}

impl PointTable {
    /// Rows kept from the start, and from the end.
    const HEAD: usize = 20;

    fn new(sweep: &Sweep) -> Self {
        let seeds = sweep.seeds.len() > 1;
        let slo = {
            let s = sweep.base.slo();
            s.ttft_ms.is_some() || s.tpot_ms.is_some() || s.e2e_ms.is_some()
        };
        let mut header = vec!["point".to_owned()];
        header.extend(short_axis_names(sweep.axes()));
        if seeds {
            header.push("seed".into());
        }
        header.extend(
            ["completed", "req/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms"].map(String::from),
        );
        if slo {
            header.push("SLO met".into());
        }
        header.push("overloaded".into());
        let left = 1 + sweep.axes().len();
        PointTable { header, head: Vec::new(), tail: std::collections::VecDeque::new(), skipped: 0, seeds, slo, left }
    }

    /// A point's cells.
    fn cells(&self, p: &pdsim::sweep::Point, rep: &Report<'_>) -> Vec<String> {
        let s = rep.summary;
        let mut c = vec![p.index.to_string()];
        c.extend(p.values.iter().map(value_text));
        if self.seeds {
            c.push(p.seed.to_string());
        }
        c.push(format!("{}/{}", s.completed, s.requests));
        c.push(format!("{:.2}", s.request_throughput));
        for x in [s.ttft_ms.median, s.ttft_ms.p99, s.tpot_ms.median, s.tpot_ms.p99] {
            c.push(if s.completed == 0 { "-".into() } else { format!("{x:.1}") });
        }
        if self.slo {
            c.push(format!("{:.1}%", 100.0 * s.slo_attainment));
        }
        c.push(if rep.overload.overloaded { "yes".into() } else { "no".into() });
        c
    }

    fn push(&mut self, row: Vec<String>) {
        if self.head.len() < Self::HEAD {
            self.head.push(row);
        } else {
            self.tail.push_back(row);
            if self.tail.len() > Self::HEAD {
                self.tail.pop_front();
                self.skipped += 1;
            }
        }
    }

    /// The table, columns aligned (the first and the axis columns to the
    /// left, numbers to the right).
    fn render(&self) -> String {
        let rows: Vec<&Vec<String>> = self.head.iter().chain(&self.tail).collect();
        if rows.is_empty() {
            return String::new();
        }
        let axes_end = self.left;
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                rows.iter().map(|r| r[c].chars().count()).chain([self.header[c].chars().count()]).max().unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let parts: Vec<String> =
                cells
                    .iter()
                    .enumerate()
                    .map(|(c, v)| {
                        if c < axes_end { format!("{v:<w$}", w = widths[c]) } else { format!("{v:>w$}", w = widths[c]) }
                    })
                    .collect();
            format!("  {}\n", parts.join("  ").trim_end())
        };
        let mut t = line(&self.header);
        for r in &self.head {
            t.push_str(&line(r));
        }
        if self.skipped > 0 {
            t.push_str(&format!("  ... {} more points (every point is in sweep.csv) ...\n", self.skipped));
        }
        for r in &self.tail {
            t.push_str(&line(r));
        }
        t
    }
}

/// The axes' names for the terminal table: a short path whole
/// (`decode.count`), a long one by its last part (`rate_per_s` for
/// `workload.arrival.rate_per_s`) unless two axes share that part.
fn short_axis_names(axes: &[pdsim::sweep::Axis]) -> Vec<String> {
    let last = |p: &str| p.rsplit('.').next().unwrap_or(p).to_owned();
    axes.iter()
        .map(|a| {
            let short = last(&a.path);
            let shared = axes.iter().filter(|b| last(&b.path) == short).count() > 1;
            if a.path.len() <= 16 || shared { a.path.clone() } else { short }
        })
        .collect()
}

/// The folder of a point's files under the output folder `dir`
/// (`--reports`): `DIR/points/<name>/`, `name` from
/// [`Sweep::point_folder`] (its axis values and seed).
pub fn point_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join(POINTS_DIR).join(name)
}

/// The folder of the points' reports, in the sweep's folder.
const POINTS_DIR: &str = "points";

/// The files a sweep (or `pdsim report` of a point) writes in a point's
/// folder.
const POINT_FILES: [&str; 4] = ["report.json", "report.json.partial", "report.html", "report.html.partial"];

/// Removes what a sweep wrote in the point folder `sub` ([`POINT_FILES`],
/// regular files only) and the folder once empty; anything else in it is
/// the user's and stays, with the folder. A link or a file at `sub` is
/// not a folder pdsim made, and is left alone.
fn clear_point(sub: &Path) -> Result<(), CmdError> {
    if !std::fs::symlink_metadata(sub).is_ok_and(|m| m.file_type().is_dir()) {
        return Ok(());
    }
    for f in POINT_FILES {
        pdsim::output::remove_file_if_own(&sub.join(f)).map_err(CmdError::BadInput)?;
    }
    let _ = std::fs::remove_dir(sub);
    Ok(())
}

/// [`clear_point`] on every folder in `points` (the point folders of an
/// earlier sweep, whatever their names), then `points` itself once empty.
fn clear_points(points: &Path) -> Result<(), CmdError> {
    if !std::fs::symlink_metadata(points).is_ok_and(|m| m.file_type().is_dir()) {
        return Ok(());
    }
    let entries = std::fs::read_dir(points).map_err(|e| list_error(points, &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| list_error(points, &e))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            clear_point(&entry.path())?;
        }
    }
    let _ = std::fs::remove_dir(points);
    Ok(())
}

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

    /// Renames the file into place.
    pub(crate) fn finish(self) -> Result<(), CmdError> {
        self.csv.finish()
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

/// Loads the sweep, checks this shard's points (every point, for a whole
/// sweep), runs them and writes their rows.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let start = Instant::now();
    let sweep = Sweep::load(&args.sweep)?;
    let total = sweep.len();
    // The points this run covers: the work grows with them, not with the
    // grid (a shard of one point of a huge grid builds one scenario).
    let mine = args.shard.map_or(0..total, |s| s.range(total));
    let requests = args.requests.or(sweep.requests);
    let from = if args.requests.is_some() { "--requests" } else { "the sweep's requests" };
    // Each point is built and checked before anything runs (and dropped:
    // a worker builds it again), so a bad point fails before any is run.
    for i in mine.clone() {
        let p = sweep.point(i)?;
        p.scenario
            .workload()
            .check_arrival_span(requests, from)
            .map_err(|e| CmdError::BadInput(format!("{}: point {}: {e}", args.sweep.display(), p.index)))?;
    }
    let dir = args.out.clone().unwrap_or_else(|| {
        let stem = args.sweep.file_stem().map_or_else(|| "sweep".into(), |s| s.to_string_lossy().into_owned());
        Path::new("out").join(stem)
    });
    create_dir(&dir)?;
    let points_dir = dir.join(POINTS_DIR);
    if args.reports {
        // Refused before anything is cleared: reports go into folders of
        // the sweep's own, never through a link.
        pdsim::output::own_dir(&dir, &points_dir).map_err(CmdError::BadInput)?;
    }
    let path = dir.join(file_name(args.shard));
    let mut csv = CsvFile::create(&path)?;
    // The axis columns, each followed by a comma.
    let axes_header = sweep.axes_header();
    let metrics_header = metric_header(&args.percentiles.0);
    if args.shard.is_none_or(|s| s.k == 1) {
        csv.line(&sweep.header(&args.percentiles.0))?;
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
    // clears its own points only. Only what a sweep writes goes: each
    // point folder's report.json (and its page), the folder once empty;
    // anything else there is the user's and stays.
    let own = |p: &Path| pdsim::output::remove_file_if_own(p).map_err(CmdError::BadInput);
    match args.shard {
        None => clear_points(&points_dir)?,
        Some(_) => mine.clone().try_for_each(|i| clear_point(&point_dir(&dir, &sweep.point_folder(i))))?,
    }
    // The page describes rows that are being rewritten, whichever shard
    // this is.
    own(&dir.join(pdsim::html::FILE_NAME))?;
    // Rows of another split of the points: a whole sweep's beside shards,
    // or shards of another count. (Shards of this count are this sweep's
    // other slices, and stay.)
    if args.shard.is_some() {
        own(&dir.join(file_name(None)))?;
        own(&summary_path)?;
    }
    let entries = std::fs::read_dir(&dir).map_err(|e| list_error(&dir, &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| list_error(&dir, &e))?;
        let name = entry.file_name();
        let count = name.to_str().and_then(shard_count);
        if count.is_some_and(|n| args.shard.is_none_or(|s| s.n != n)) {
            own(&entry.path())?;
        }
    }
    // The metric cells of the current grid point's seeds so far.
    let mut group: Vec<String> = Vec::with_capacity(seeds);
    // A point's report names the base scenario as the sweep file reaches it.
    let label = sweep.scenario_path.display().to_string();
    let jobs = args.jobs.map_or_else(default_jobs, |j| usize::try_from(j).unwrap_or(usize::MAX));
    let mut progress = ProgressGate::new(args.quiet, Some(mine.len() as u64), "points");
    let mut table = PointTable::new(&sweep);
    let mut done = 0u64;
    // The workers format their table rows with a copy of the columns.
    let table_cells = PointTable::new(&sweep);
    let result = ordered_parallel(
        mine.len(),
        jobs,
        |i| -> Result<(usize, PointOut), CmdError> {
            let p = &sweep.point(mine.start + i)?;
            let written = || format!("{} holds the rows of the points before point {}", path.display(), p.index);
            if INTERRUPTED.load(Ordering::Relaxed) {
                return Err(interrupted(written()));
            }
            // A point's row and report need only the summary and the rank
            // and link reports.
            let run = run_point(&p.scenario, p.seed, requests, &args.percentiles.0, &INTERRUPTED)?;
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
            let axes = axis_cells(&p.values);
            let rep = report::report(&p.scenario, &label, &run);
            let metrics = metrics_cells(&rep);
            let row = row(p.index, &axes, p.seed, &metrics);
            let report = if args.reports {
                let mut bytes = Vec::new();
                report::write_report(&mut bytes, &rep)
                    .map_err(|e| CmdError::Internal(format!("point {}: cannot format report.json: {e}", p.index)))?;
                Some(bytes)
            } else {
                None
            };
            let printed = table_cells.cells(p, &rep);
            Ok((p.index, PointOut { row, axes, metrics, report, printed }))
        },
        |_, (index, out)| {
            // A point's report is whole before its row is written, so
            // that every row of sweep.csv has its report.
            if let Some(bytes) = out.report {
                let sub = point_dir(&dir, &sweep.point_folder(index));
                pdsim::output::own_dir(&dir, &sub).map_err(CmdError::BadInput)?;
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
            table.push(out.printed);
            done += 1;
            progress.update(done, String::new);
            Ok(())
        },
    );
    progress.finish();
    // The rows of the points before one that stopped or failed stay (so
    // does the summary of the grid points whose seeds all finished).
    let placed = csv.finish().and(summary.take().map_or(Ok(()), SummaryCsv::finish));
    result?;
    placed?;
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
            total,
            sweep.axes().len(),
            sweep.seeds.len(),
            jobs.min(mine.len().max(1))
        );
        t.push_str(&table.render());
        let _ = writeln!(t, "wall time    {:.2} s", start.elapsed().as_secs_f64());
        let _ = writeln!(t, "wrote        {}", path.display());
        if seeds > 1 && args.shard.is_none() {
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
