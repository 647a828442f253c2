//! `pdsim sweep`: rows in point order whatever `--jobs`, shards that
//! concatenate to the whole sweep, axes in file order, points equal to the
//! plain runs they stand for, and bad sweep files refused with exit 2.

use std::path::Path;

use crate::common::{Csv, outcome, pdsim, scenario_file, scratch, scratch_dir};

const SHIPPED: &str = "sweeps/glm-decode-bandwidth.toml";

fn sweep(file: &Path, out: &Path, extra: &[&str]) -> String {
    let mut args = vec!["sweep", file.to_str().unwrap(), "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = outcome(&pdsim(&args));
    assert_eq!(code, 0, "{args:?}: {stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    stdout
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
    for col in ["completed", "ttft_p99_ms", "tpot_p50_ms", "goodput", "transfer_time_mean_ms", "digest"] {
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
    ];
    for (name, text, wants) in cases {
        let file = scratch(&format!("sweep-{name}"), &text);
        let out = scratch_dir(&format!("sweep-bad-{name}"));
        let (code, stdout, stderr) =
            outcome(&pdsim(&["sweep", file.to_str().unwrap(), "--out", out.to_str().unwrap()]));
        assert_eq!(code, 2, "{name}: {stderr}");
        assert!(stdout.is_empty(), "{name}");
        assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
        assert!(stderr.contains(&format!("sweep-{name}")), "{name}: {stderr}");
        for want in wants {
            assert!(stderr.contains(want), "{name}: {want:?} missing from {stderr}");
        }
        assert!(!out.join("sweep.csv").exists(), "{name}: nothing runs");
    }
    let file = scenario_file(SHIPPED);
    for shard in ["0/2", "3/2", "2", "a/b"] {
        let (code, _, stderr) = outcome(&pdsim(&["sweep", file.to_str().unwrap(), "--shard", shard]));
        assert_eq!(code, 2, "{shard}: {stderr}");
        assert!(stderr.contains("--shard") && stderr.contains("K/N"), "{shard}: {stderr}");
    }
}
