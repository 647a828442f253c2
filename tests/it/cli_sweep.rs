//! `pdsim sweep`: rows in point order whatever `--jobs`, shards that
//! concatenate to the whole sweep, axes in file order, points equal to the
//! plain runs they stand for, and bad sweep files refused with exit 2.

use std::path::Path;

use serde_json::Value;

use crate::common::{Csv, base_with_lines, names_in, outcome, pdsim, pdsim_in, scenario_file, scratch, scratch_dir};

const SHIPPED: &str = "sweeps/glm-decode-bandwidth.toml";

fn sweep(file: &Path, out: &Path, extra: &[&str]) -> String {
    let mut args = vec!["sweep", file.to_str().unwrap(), "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = outcome(&pdsim(&args));
    assert_eq!(code, 0, "{args:?}: {stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    stdout
}

/// The sweep file `text`, written as `sweep-{name}`, is refused: exit 2,
/// one line on stderr naming the file and holding each of `wants`, and
/// nothing written.
fn assert_refused(name: &str, text: &str, wants: &[&str]) {
    let file = scratch(&format!("sweep-{name}"), text);
    let out = scratch_dir(&format!("sweep-bad-{name}"));
    let (code, stdout, stderr) = outcome(&pdsim(&["sweep", file.to_str().unwrap(), "--out", out.to_str().unwrap()]));
    assert_eq!(code, 2, "{name}: {stderr}");
    assert!(stdout.is_empty(), "{name}");
    assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
    assert!(stderr.contains(&format!("sweep-{name}:")), "{name}: {stderr}");
    for want in wants {
        assert!(stderr.contains(want), "{name}: {want:?} missing from {stderr}");
    }
    assert!(!out.join("sweep.csv").exists(), "{name}: nothing runs");
}

#[test]
fn shipped_sweep_is_the_same_for_any_jobs() {
    let (one, two) = (scratch_dir("sweep-jobs-1"), scratch_dir("sweep-jobs-2"));
    let file = scenario_file(SHIPPED);
    let stdout = sweep(&file, &one, &["--jobs", "1", "--requests", "12"]);
    assert!(stdout.contains("36 points"), "{stdout}");
    sweep(&file, &two, &["--jobs", "2", "--requests", "12"]);
    let (a, b) = (std::fs::read(one.join("sweep.csv")).unwrap(), std::fs::read(two.join("sweep.csv")).unwrap());
    assert!(a == b, "sweep.csv differs between --jobs 1 and --jobs 2");

    let csv = Csv::read(&one.join("sweep.csv"));
    assert_eq!(
        csv.header[..5],
        ["point", "decode.count", "link.bandwidth_gb_s", "workload.arrival.rate_per_s", "seed"]
    );
    for col in ["completed", "p99_ttft_ms", "p50_tpot_ms", "request_goodput", "mean_transfer_time_ms", "digest"] {
        csv.col(col);
    }
    assert_eq!(csv.rows.len(), 36);
    let points: Vec<usize> = csv.column("point").iter().map(|p| p.parse().unwrap()).collect();
    assert_eq!(points, (0..36).collect::<Vec<_>>());
    // The first axis varies slowest, the seed fastest.
    let row = |i: usize| csv.rows[i][1..5].join(" ");
    assert_eq!(row(0), "1 1 4.0 1");
    assert_eq!(row(1), "1 1 4.0 2");
    assert_eq!(row(2), "1 1 8.0 1");
    assert_eq!(row(4), "1 10 4.0 1");
    assert_eq!(row(12), "2 1 4.0 1");
    assert_eq!(row(35), "4 100 8.0 2");
    assert!(csv.column("requests").iter().all(|r| *r == "12"));
    // Two seeds of one axis point differ; one seed of two points too.
    let digests = csv.column("digest");
    assert_ne!(digests[0], digests[1]);
    assert_ne!(digests[0], digests[2]);
}

#[test]
fn shards_concatenate_to_the_whole_sweep() {
    let file = scenario_file(SHIPPED);
    let all = scratch_dir("sweep-shard-all");
    sweep(&file, &all, &["--requests", "8"]);
    let shards = scratch_dir("sweep-shards");
    sweep(&file, &shards, &["--requests", "8", "--shard", "1/2", "--jobs", "2"]);
    sweep(&file, &shards, &["--requests", "8", "--shard", "2/2", "--jobs", "1"]);
    let read = |name: &str| std::fs::read_to_string(shards.join(name)).unwrap();
    let (s1, s2) = (read("sweep.shard-1-of-2.csv"), read("sweep.shard-2-of-2.csv"));
    let whole = std::fs::read_to_string(all.join("sweep.csv")).unwrap();
    let header = whole.lines().next().unwrap();
    assert_eq!(s1.lines().next(), Some(header), "shard 1 has the header");
    assert!(!s2.starts_with("point,"), "only shard 1 has the header");
    // Shard k holds the k-th half of the 36 points.
    let points = |text: &str| -> Vec<usize> {
        text.lines()
            .filter(|l| !l.starts_with("point,"))
            .map(|l| l.split(',').next().unwrap().parse().unwrap())
            .collect()
    };
    assert_eq!(points(&s1), (0..18).collect::<Vec<_>>());
    assert_eq!(points(&s2), (18..36).collect::<Vec<_>>());
    // `cat` of the shards is the whole sweep, byte for byte.
    assert_eq!(format!("{s1}{s2}"), whole);
    // Rows of another split go: a whole sweep's shards, and a shard's
    // whole sweep and shards of another count.
    let csvs = || -> Vec<String> { names_in(&shards).into_iter().filter(|n| n.ends_with(".csv")).collect() };
    sweep(&file, &shards, &["--requests", "8", "--shard", "1/3"]);
    assert_eq!(csvs(), ["sweep.shard-1-of-3.csv"]);
    sweep(&file, &shards, &["--requests", "8", "--shard", "2/3"]);
    assert_eq!(csvs(), ["sweep.shard-1-of-3.csv", "sweep.shard-2-of-3.csv"], "shards of one count stay");
    sweep(&file, &shards, &["--requests", "8"]);
    assert_eq!(csvs(), ["sweep.csv", "sweep_summary.csv"], "two seeds: a summary");
    sweep(&file, &shards, &["--requests", "8", "--shard", "3/3"]);
    assert_eq!(csvs(), ["sweep.shard-3-of-3.csv"]);
}

#[test]
fn axes_keep_the_file_order_and_points_equal_plain_runs() {
    let base = scenario_file("glm-5.3-flash-1p1d.toml");
    let file = scratch(
        "sweep-order.toml",
        &format!(
            r#"scenario = {base:?}
seeds = [5]
requests = 10
[axes]
"workload.arrival.rate_per_s" = [3.0]
"decode.count" = [1]
"link.sharing" = ["fifo", "processor_sharing"]
"#
        ),
    );
    let out = scratch_dir("sweep-order");
    sweep(&file, &out, &["-q"]);
    let csv = Csv::read(&out.join("sweep.csv"));
    assert_eq!(csv.header[..5], ["point", "workload.arrival.rate_per_s", "decode.count", "link.sharing", "seed"]);
    assert_eq!(csv.column("link.sharing"), ["fifo", "processor_sharing"]);

    // A point with no axes is the base scenario: the same digest as `run`.
    let bare = scratch("sweep-bare.toml", &format!("scenario = {base:?}\nseeds = [5]\nrequests = 10\n"));
    let out = scratch_dir("sweep-bare");
    sweep(&bare, &out, &["-q"]);
    let csv = Csv::read(&out.join("sweep.csv"));
    assert_eq!(csv.header[..2], ["point", "seed"]);
    assert_eq!(csv.rows.len(), 1);
    let run = scratch_dir("sweep-bare-run");
    let (code, _, stderr) = outcome(&pdsim(&[
        "run",
        base.to_str().unwrap(),
        "--seed",
        "5",
        "--requests",
        "10",
        "-q",
        "--out",
        run.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["digest"].as_str().unwrap(), csv.column("digest")[0]);
}

#[test]
fn bad_sweeps_exit_2_naming_the_file_and_axis() {
    let base = scenario_file("glm-5.3-flash-1p1d.toml");
    let cases = [
        (
            "bad-axis.toml",
            format!("scenario = {base:?}\nrequests = 5\n[axes]\n\"decode.count\" = [1]\n\"decode.cout\" = [2]\n"),
            vec![":5:", "axes.\"decode.cout\"", "unknown field `cout`"],
        ),
        (
            "bad-value.toml",
            format!("scenario = {base:?}\n[axes]\n\"link.bandwidth_gb_s\" = [50, -1]\n"),
            vec![":3:", "axes.\"link.bandwidth_gb_s\"", "-1", "must be > 0"],
        ),
        (
            "not-a-list.toml",
            format!("scenario = {base:?}\n[axes]\n\"decode.count\" = 2\n"),
            vec![":3:", "axes.\"decode.count\""],
        ),
        ("unknown-key.toml", format!("scenario = {base:?}\nseed = 3\n"), vec![":2:", "unknown key `seed`"]),
        ("no-scenario.toml", "requests = 3\n".to_owned(), vec!["scenario", "missing"]),
        ("missing-scenario.toml", "scenario = \"nope.toml\"\n".to_owned(), vec![":1:", "nope.toml"]),
        ("zero-requests.toml", format!("scenario = {base:?}\nrequests = 0\n"), vec![":2:", "requests", "must be >= 1"]),
        // Point 1's arrivals are sure to pass the end of simulated time:
        // refused before point 0 runs (and so in every shard).
        (
            "slow-point.toml",
            format!("scenario = {base:?}\nrequests = 20000\n[axes]\n\"workload.arrival.rate_per_s\" = [4.0, 1e-6]\n"),
            vec!["point 1: workload.arrival.rate_per_s: 20000 requests (the sweep's requests) at 0.000001 per second"],
        ),
    ];
    for (name, text, wants) in cases {
        assert_refused(name, &text, &wants);
    }
    let file = scenario_file(SHIPPED);
    for shard in ["0/2", "3/2", "2", "a/b"] {
        let (code, _, stderr) = outcome(&pdsim(&["sweep", file.to_str().unwrap(), "--shard", shard]));
        assert_eq!(code, 2, "{shard}: {stderr}");
        assert!(stderr.contains("--shard") && stderr.contains("K/N"), "{shard}: {stderr}");
    }
}

/// `[[zip]]` tables: each is one dimension of the grid whose lists advance
/// together, placed at its first key among the axes; each zipped path is a
/// column. Here zip 0 (2 coordinates) comes first, then the axis (2
/// values), then zip 1 (3 coordinates): 2 × 2 × 3 = 12 grid points × 2
/// seeds = 24 points, zip 0 varying slowest and the seed fastest.
#[test]
fn zips_advance_together_in_a_grid() {
    let base = scenario_file("glm-5.3-flash-1p1d.toml");
    let file = scratch(
        "sweep-zip.toml",
        &format!(
            r#"scenario = {base:?}
seeds = [3, 4]
requests = 6

[[zip]]
"prefill.count" = [1, 2]
"decode.count" = [3, 2]

[axes]
"link.bandwidth_gb_s" = [10, 100]

[[zip]]
"workload.arrival.rate_per_s" = [2.0, 4.0, 6.0]
"link.sharing" = ["fifo", "processor_sharing", "fifo"]
"#
        ),
    );
    let out = scratch_dir("sweep-zip");
    let stdout = sweep(&file, &out, &["--jobs", "2"]);
    assert!(stdout.contains("24 points, 5 axes in 3 dimensions"), "{stdout}");
    let csv = Csv::read(&out.join("sweep.csv"));
    assert_eq!(
        csv.header[..7],
        [
            "point",
            "prefill.count",
            "decode.count",
            "link.bandwidth_gb_s",
            "workload.arrival.rate_per_s",
            "link.sharing",
            "seed"
        ]
    );
    assert_eq!(csv.rows.len(), 24);
    // Point i: seed = seeds[i % 2], then i / 2 = g, the grid point:
    // zip 1's coordinate g % 3, the axis (g / 3) % 2, zip 0's g / 6.
    let zip0 = [("1", "3"), ("2", "2")];
    let bandwidth = ["10", "100"];
    let zip1 = [("2.0", "fifo"), ("4.0", "processor_sharing"), ("6.0", "fifo")];
    for (i, row) in csv.rows.iter().enumerate() {
        let g = i / 2;
        let (p, d) = zip0[g / 6];
        let (rate, sharing) = zip1[g % 3];
        let want = [i.to_string(), p.into(), d.into(), bandwidth[(g / 3) % 2].into(), rate.into(), sharing.into()];
        assert_eq!(row[..6], want, "point {i}");
        assert_eq!(row[6], ["3", "4"][i % 2], "point {i}");
    }
    // Never a split the zip does not list (1P2D, 2P3D): the pairs advance
    // together.
    let pairs: std::collections::BTreeSet<(&str, &str)> =
        csv.column("prefill.count").into_iter().zip(csv.column("decode.count")).collect();
    assert_eq!(pairs.into_iter().collect::<Vec<_>>(), [("1", "3"), ("2", "2")]);

    // A zipped point is the scenario with those values: the same digest
    // as a sweep that sets them as plain one-value axes (point 15: grid
    // point 7 = zip 0's coordinate 1, 10 GB/s, zip 1's coordinate 1;
    // seed 4).
    let plain = scratch(
        "sweep-zip-plain.toml",
        &format!(
            r#"scenario = {base:?}
seeds = [4]
requests = 6
[axes]
"prefill.count" = [2]
"decode.count" = [2]
"link.bandwidth_gb_s" = [10]
"workload.arrival.rate_per_s" = [4.0]
"link.sharing" = ["processor_sharing"]
"#
        ),
    );
    let out_plain = scratch_dir("sweep-zip-plain");
    sweep(&plain, &out_plain, &["-q"]);
    let one = Csv::read(&out_plain.join("sweep.csv"));
    assert_eq!(csv.rows[15][1..6], one.rows[0][1..6]);
    assert_eq!((csv.rows[15][6].as_str(), one.rows[0][6].as_str()), ("4", "4"));
    assert_eq!(csv.column("digest")[15], one.column("digest")[0]);
    // The two seeds differ, and so do the splits.
    assert_ne!(csv.column("digest")[14], csv.column("digest")[15]);
    assert_ne!(csv.column("digest")[3], csv.column("digest")[15]);
}

/// The shipped zip example runs: 3 splits × 2 rates × 3 seeds.
#[test]
fn shipped_zip_sweep_runs() {
    let out = scratch_dir("sweep-zip-shipped");
    let stdout = sweep(&scenario_file("sweeps/glm-split-4-ranks.toml"), &out, &["--requests", "5"]);
    assert!(stdout.contains("18 points"), "{stdout}");
    let csv = Csv::read(&out.join("sweep.csv"));
    for row in &csv.rows {
        let (p, d): (u32, u32) =
            (row[csv.col("prefill.count")].parse().unwrap(), row[csv.col("decode.count")].parse().unwrap());
        assert_eq!(p + d, 4, "{row:?}");
    }
}

#[test]
fn bad_zips_exit_2_naming_the_file_line_and_key() {
    let base = scenario_file("glm-5.3-flash-1p1d.toml");
    let head = format!("scenario = {base:?}\nrequests = 5\n");
    let cases = [
        (
            "zip-lengths.toml",
            format!("{head}[[zip]]\n\"prefill.count\" = [1, 2]\n\"decode.count\" = [3, 2, 1]\n"),
            vec![":5:", "zip[0].\"decode.count\"", "lists 3 value(s)", "zip[0].\"prefill.count\" (line 4) lists 2"],
        ),
        (
            "zip-empty.toml",
            format!("{head}[[zip]]\n\"decode.count\" = [1]\n[[zip]]\n[axes]\n\"link.sharing\" = [\"fifo\"]\n"),
            vec![":5:", "zip[1]", "is empty"],
        ),
        (
            "zip-twice-axis.toml",
            format!(
                "{head}[axes]\n\"decode.count\" = [1, 2]\n[[zip]]\n\"prefill.count\" = [1, 2]\n\"decode.count\" = [3, 2]\n"
            ),
            vec![":7:", "zip[0].\"decode.count\"", "axes.\"decode.count\" (line 4)", "one place only"],
        ),
        (
            "zip-twice-zip.toml",
            format!(
                "{head}[[zip]]\n\"decode.count\" = [1, 2]\n\"link.sharing\" = [\"fifo\", \"fifo\"]\n[[zip]]\n\"prefill.count\" = [1, 2]\n\"decode.count\" = [3, 2]\n"
            ),
            vec![":8:", "zip[1].\"decode.count\"", "zip[0].\"decode.count\" (line 4)", "one place only"],
        ),
        (
            "zip-bad-coordinate.toml",
            format!("{head}[[zip]]\n\"prefill.count\" = [1, 2]\n\"decode.count\" = [3, 0]\n"),
            vec![
                ":5:",
                "zip[0].\"decode.count\"",
                "coordinate 1 (\"prefill.count\" = 2, \"decode.count\" = 0)",
                "decode.count: must be",
            ],
        ),
        (
            // The table replaced as a whole would undo the rate varied inside it.
            "zip-inside-axis.toml",
            format!(
                "{head}[[zip]]\n\"workload.arrival.rate_per_s\" = [4.0, 50.0]\n\"prefill.count\" = [1, 2]\n[axes]\n\"workload.arrival\" = [{{kind = \"poisson\", rate_per_s = 2.0}}]\n"
            ),
            vec![
                ":7:",
                "axes.\"workload.arrival\"",
                "overlaps zip[0].\"workload.arrival.rate_per_s\" (line 4)",
                "`workload.arrival` holds `workload.arrival.rate_per_s`",
            ],
        ),
        ("zip-not-tables.toml", format!("{head}zip = 3\n"), vec![":3:", "zip:", "array of tables"]),
        ("zip-seed.toml", format!("{head}[[zip]]\n\"seed\" = [1, 2]\n"), vec![":4:", "zip[0].\"seed\"", "`seeds`"]),
        (
            "zip-requests.toml",
            format!("{head}[[zip]]\n\"workload.requests\" = [5]\n"),
            vec![":4:", "zip[0].\"workload.requests\"", "top-level `requests`"],
        ),
    ];
    for (name, text, wants) in cases {
        assert_refused(name, &text, &wants);
    }
}

/// A sweep of [`crate::common::base_scenario`] in `cwd/s/` (the base as
/// `s/base.toml`, the sweep as `s/sweep.toml`): a zip of the decode pool
/// (line 10) and the arrival rate (line 15), three seeds, 8 requests.
const ZIP_SWEEP: &str = r#"scenario = "base.toml"
seeds = [1, 2, 3]
requests = 8
[[zip]]
"decode.num_blocks" = [100, 200]
"workload.arrival.rate_per_s" = [4.0, 8.0]
"#;

/// The base scenario of [`ZIP_SWEEP`] with a decode pool of `blocks` and
/// a Poisson rate of `rate`: a zip coordinate written as a file.
fn zip_point(blocks: &str, rate: &str) -> String {
    base_with_lines(&[
        (10, &format!("num_blocks = {blocks}")),
        (15, &format!("arrival = {{ kind = \"poisson\", rate_per_s = {rate} }}")),
    ])
}

/// Writes [`ZIP_SWEEP`] and its base into `cwd/s/` and runs it from `cwd`
/// into `cwd/out` with `extra` flags.
fn run_zip_sweep(cwd: &Path, extra: &[&str]) -> Csv {
    std::fs::create_dir_all(cwd.join("s")).unwrap();
    std::fs::write(cwd.join("s/base.toml"), crate::common::base_scenario()).unwrap();
    std::fs::write(cwd.join("s/sweep.toml"), ZIP_SWEEP).unwrap();
    let mut args = vec!["sweep", "s/sweep.toml", "--out", "out"];
    args.extend_from_slice(extra);
    let (code, _, stderr) = outcome(&pdsim_in(cwd, &args));
    assert_eq!(code, 0, "{stderr}");
    Csv::read(&cwd.join("out/sweep.csv"))
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// `--reports`: one report.json per point in out/points/<point>/ (named by
/// the point's axis values and seed, `num_blocks=100,rate_per_s=4.0,seed=1`),
/// the very
/// bytes `pdsim run` writes for the point's scenario (here each zip
/// coordinate written out as a file at the same relative path,
/// `s/base.toml`, so that the label matches) with the point's seed and
/// request count. The new columns of its row are that report's numbers.
#[test]
fn reports_are_the_bytes_of_a_direct_run_and_rows_match_them() {
    let cwd = scratch_dir("sweep-reports");
    // What an earlier, larger sweep left: point reports past this sweep's
    // and a page; neither may survive into this sweep's folder.
    for stale in ["out/points/6", "out/points/num_blocks=300,rate_per_s=4.0,seed=1"] {
        std::fs::create_dir_all(cwd.join(stale)).unwrap();
        std::fs::write(cwd.join(stale).join("report.json"), "{}").unwrap();
    }
    std::fs::write(cwd.join("out/report.html"), "stale").unwrap();
    let csv = run_zip_sweep(&cwd, &["--reports", "--jobs", "2", "-q"]);
    assert_eq!(csv.rows.len(), 6);
    assert!(!cwd.join("out/report.html").exists(), "a stale page stays beside this sweep's rows");
    let mut listed: Vec<String> = std::fs::read_dir(cwd.join("out/points"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    // In point order: the zip's coordinates, each with seeds 1 to 3.
    let names: Vec<String> = csv
        .rows
        .iter()
        .map(|row| {
            let cell = |c: &str| row[csv.col(c)].as_str();
            format!(
                "num_blocks={},rate_per_s={},seed={}",
                cell("decode.num_blocks"),
                cell("workload.arrival.rate_per_s"),
                cell("seed")
            )
        })
        .collect();
    assert_eq!(names[0], "num_blocks=100,rate_per_s=4.0,seed=1");
    assert_eq!(names[5], "num_blocks=200,rate_per_s=8.0,seed=3");
    let mut sorted = names.clone();
    sorted.sort();
    listed.sort();
    assert_eq!(listed, sorted);
    for (i, row) in csv.rows.iter().enumerate() {
        let cell = |c: &str| row[csv.col(c)].as_str();
        let (blocks, rate, seed) = (cell("decode.num_blocks"), cell("workload.arrival.rate_per_s"), cell("seed"));
        let direct = scratch_dir(&format!("sweep-reports-direct-{i}"));
        std::fs::create_dir_all(direct.join("s")).unwrap();
        std::fs::write(direct.join("s/base.toml"), zip_point(blocks, rate)).unwrap();
        let args = ["run", "s/base.toml", "--seed", seed, "--requests", "8", "--out", "o", "-q", "--no-trace"];
        let (code, _, stderr) = outcome(&pdsim_in(&direct, &args));
        assert_eq!(code, 0, "{stderr}");
        let ours = cwd.join("out/points").join(&names[i]).join("report.json");
        let (a, b) = (std::fs::read(&ours).unwrap(), std::fs::read(direct.join("o/report.json")).unwrap());
        assert!(a == b, "point {i}: {} differs from pdsim run's report.json", ours.display());

        // The row's cells are the report's numbers, to six decimals.
        let rep = json(&ours);
        assert_eq!(cell("digest"), rep["digest"].as_str().unwrap());
        for (col, want) in [
            ("transfer_bytes", &rep["summary"]["transfer_bytes"]),
            ("prefill_hit_tokens", &rep["summary"]["prefill_hit_tokens"]),
            ("decode_hit_tokens", &rep["summary"]["decode_hit_tokens"]),
            ("completed", &rep["bench"]["completed"]),
            ("total_input_tokens", &rep["bench"]["total_input_tokens"]),
        ] {
            assert_eq!(cell(col), want.to_string(), "point {i}: {col}");
        }
        // Six decimals of the report's f64 (JSON keeps it exactly).
        let near = |col: &str, want: f64| assert_eq!(cell(col), format!("{want:.6}"), "point {i}: {col}");
        let overload = &rep["overload"]["busy_share"];
        near("prefill_busy_share", overload["prefill"].as_f64().unwrap());
        near("decode_busy_share", overload["decode"].as_f64().unwrap());
        near("link_busy_share", overload["link"].as_f64().unwrap());
        // One rank of each role: its busy share is its busy_fraction.
        let ranks = rep["ranks"].as_array().unwrap();
        let of = |role: &str, key: &str| -> Vec<f64> {
            ranks.iter().filter(|r| r["role"] == role).map(|r| r[key].as_f64().unwrap()).collect()
        };
        assert_eq!(of("decode", "busy_fraction"), [overload["decode"].as_f64().unwrap()]);
        // Peak KV: the largest peak_used_fraction of the role's ranks; the
        // decode pool of this point holds `blocks` blocks.
        let decode_peak = of("decode", "peak_used_blocks")[0];
        near("decode_peak_kv_used_fraction", decode_peak / blocks.parse::<f64>().unwrap());
        near("prefill_peak_kv_used_fraction", of("prefill", "peak_used_fraction").into_iter().fold(0.0, f64::max));
        assert!(decode_peak > 0.0, "point {i}: the decode pool was used");
        // No aggregated rank: those cells are empty.
        assert_eq!((cell("aggregated_busy_share"), cell("aggregated_peak_kv_used_fraction")), ("", ""));
        // The bench columns (p90/p95, ITL mean) are report.json's bench.
        for col in ["p90_ttft_ms", "p95_ttft_ms", "mean_itl_ms", "p95_e2el_ms"] {
            near(col, rep["bench"][col].as_f64().unwrap());
        }
    }
    // Without --reports, nothing is written under points/ for a new
    // folder.
    let plain = scratch_dir("sweep-reports-none");
    run_zip_sweep(&plain, &["-q"]);
    assert!(!plain.join("out/points").exists());
}

/// With several seeds, sweep_summary.csv holds, per grid point, the mean
/// over its seeds, the sample standard deviation and the 95 % confidence
/// interval of the mean, here recomputed from sweep.csv's rows.
#[test]
fn sweep_summary_aggregates_each_grid_point_over_its_seeds() {
    let cwd = scratch_dir("sweep-summary");
    let csv = run_zip_sweep(&cwd, &["-q"]);
    let sum = Csv::read(&cwd.join("out/sweep_summary.csv"));
    // Its columns: the axes, statistic, seeds, then sweep.csv's metrics.
    let metrics = &csv.header[csv.col("seed") + 1..];
    assert_eq!(sum.header[..4], ["decode.num_blocks", "workload.arrival.rate_per_s", "statistic", "seeds"]);
    assert_eq!(&sum.header[4..], metrics);
    // Two grid points (the zip's coordinates), four rows each.
    assert_eq!(sum.rows.len(), 8);
    assert_eq!(sum.column("statistic"), ["mean", "std", "ci95_low", "ci95_high"].repeat(2));
    assert!(sum.column("seeds").iter().all(|n| *n == "3"));
    assert_eq!(sum.column("decode.num_blocks"), ["100", "100", "100", "100", "200", "200", "200", "200"]);
    assert!(sum.column("digest").iter().all(|d| d.is_empty()));
    assert!(sum.column("aggregated_busy_share").iter().all(|d| d.is_empty()), "no such role");
    // Grid point g is sweep.csv's rows 3g .. 3g + 3 (the seed varies
    // fastest). With n = 3: mean = Σx / 3, std = √(Σ(x − mean)² / 2),
    // the interval mean ± t(0.975, 2) · std / √3 with t(0.975, 2) = 4.303.
    let mut spread = 0;
    for g in 0..2 {
        assert_eq!(csv.column("seed")[3 * g..3 * g + 3], ["1", "2", "3"]);
        for col in ["mean_ttft_ms", "request_throughput", "decode_busy_share", "p99_itl_ms", "transfer_bytes"] {
            let x: Vec<f64> = csv.column(col)[3 * g..3 * g + 3].iter().map(|v| v.parse().unwrap()).collect();
            let mean = (x[0] + x[1] + x[2]) / 3.0;
            let std = (x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
            let half = 4.303 * std / 3f64.sqrt();
            let got: Vec<f64> = sum.column(col)[4 * g..4 * g + 4].iter().map(|v| v.parse().unwrap()).collect();
            let want = [mean, std, mean - half, mean + half];
            for (k, (a, b)) in got.iter().zip(want).enumerate() {
                assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "grid point {g} {col} {k}: {a} vs {b}");
            }
            if matches!(col, "request_throughput" | "decode_busy_share") {
                spread += usize::from(std > 0.0);
            }
        }
    }
    // The seeds draw different Poisson arrivals: the throughput and the
    // decode rank's busy share differ at both grid points.
    assert_eq!(spread, 4, "the seeds differ");

    // One seed: no summary, and none left by the sweep before.
    let one = ZIP_SWEEP.replace("seeds = [1, 2, 3]", "seeds = [1]");
    std::fs::write(cwd.join("s/sweep.toml"), one).unwrap();
    let (code, stdout, stderr) = outcome(&pdsim_in(&cwd, &["sweep", "s/sweep.toml", "--out", "out"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(!stdout.contains("sweep_summary"), "{stdout}");
    assert!(!cwd.join("out/sweep_summary.csv").exists());
    // A shard may hold only some seeds of a grid point: no summary.
    std::fs::write(cwd.join("s/sweep.toml"), ZIP_SWEEP).unwrap();
    let (code, _, stderr) = outcome(&pdsim_in(&cwd, &["sweep", "s/sweep.toml", "--out", "sharded", "--shard", "1/2"]));
    assert_eq!(code, 0, "{stderr}");
    assert!(!cwd.join("sharded/sweep_summary.csv").exists());
}
