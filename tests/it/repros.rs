//! The reproductions 14 and 17–29 of the second fuzzing campaign
//! (`tests/fixtures/repros/<folder>/`, named after its findings): inputs
//! that made pdsim allocate for what it was not asked to do, count wrong,
//! refuse its own output, or write, replace or remove files outside what
//! it was asked to write. Each test runs the reproduction's input and
//! checks what happens now.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Csv, fixture, names_in, outcome, pdsim, pdsim_in, pdsim_with_small_files, scratch_dir};

fn repro(rel: &str) -> PathBuf {
    fixture(&format!("repros/{rel}"))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Exit 2 with one line holding every part; the line.
fn refused(out: &std::process::Output, parts: &[&str]) -> String {
    let (code, _, err) = outcome(out);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    for p in parts {
        assert!(err.contains(p), "{p:?} not in {err}");
    }
    err
}

fn ok(out: &std::process::Output) -> String {
    let (code, stdout, err) = outcome(out);
    assert_eq!(code, 0, "{err}");
    stdout
}

/// Runs `pdsim args` under a 300 s `timeout` (a run that hangs fails the
/// test instead of stalling the suite).
fn pdsim_bounded(args: &[&str]) -> std::process::Output {
    Command::new("timeout").arg("300").arg(env!("CARGO_BIN_EXE_pdsim")).args(args).output().unwrap()
}

/// 14: step times (or a transfer) long enough to carry the clock past the
/// end of simulated time, 2^62 ns. A P/D run then looped for ever where the
/// clock saturated (2^64 - 1 ns); an aggregated one reported every request
/// completed there. Now each run stops at 2^62 ns and exits 2 naming the
/// field that made it: the role's step time, or the link.
#[test]
fn fourteen_a_run_stops_at_the_end_of_simulated_time() {
    let dir = scratch_dir("repro14");
    for (file, field, what) in [
        ("hang.toml", "prefill.step_time", "a step"),
        ("roofline.toml", "prefill.step_time", "a step"),
        ("saturated.toml", "aggregated.step_time", "a step"),
        ("link.toml", "link.bandwidth_gb_s", "a transfer"),
    ] {
        let scenario = repro(&format!("14-simulated-time-saturates/{file}"));
        let out = dir.join(file);
        let run = pdsim_bounded(&["run", s(&scenario), "--quiet", "--no-trace", "--out", s(&out)]);
        let err = refused(&run, &[file, field, "2^62 ns", what]);
        assert!(!err.contains("panicked"), "{err}");
        assert!(!out.join("report.json").exists(), "{file}: a refused run leaves no report");
    }
}

/// 15: `tp = 0` on a role beside a model derived from a preset divided by
/// zero while the model was laid out at that TP (exit 1). Now it is placed
/// as it is beside a model given whole, for every role and every command
/// that reads the scenario.
#[test]
fn fifteen_tp_zero_is_placed_beside_a_derived_model() {
    let dir = scratch_dir("repro15");
    let derived = std::fs::read_to_string(repro("15-derived-model-tp0-panic/s.toml")).unwrap();
    for file in ["s.toml", "given.toml"] {
        let scenario = repro(&format!("15-derived-model-tp0-panic/{file}"));
        refused(&pdsim(&["validate", s(&scenario)]), &[&format!("{file}:"), "decode.tp: must be >= 1, got 0"]);
        let out = dir.join(file);
        refused(&pdsim(&["run", s(&scenario), "--quiet", "--out", s(&out)]), &["decode.tp: must be >= 1, got 0"]);
    }
    // The prefill role, and an aggregated one.
    let prefill = derived.replacen("tp = 1", "tp = 0", 1).replacen(
        "tp = 0\nnum_blocks = 1000\nstep_time = { kind = \"linear\", fixed_us = 1000.0 }\n[workload]",
        "tp = 1\nnum_blocks = 1000\nstep_time = { kind = \"linear\", fixed_us = 1000.0 }\n[workload]",
        1,
    );
    assert!(prefill.contains("[prefill]\ntp = 0"), "{prefill}");
    let path = dir.join("prefill.toml");
    std::fs::write(&path, &prefill).unwrap();
    refused(&pdsim(&["validate", s(&path)]), &["prefill.tp: must be >= 1, got 0"]);
    let aggregated = "[model]\npreset = \"llama-3.1-8b\"\n[hardware]\ngpu = \"h200\"\n[aggregated]\ntp = 0\n\
                      num_blocks = 1000\nstep_time = { kind = \"linear\", fixed_us = 1000.0 }\n";
    let path = dir.join("aggregated.toml");
    std::fs::write(&path, aggregated).unwrap();
    refused(&pdsim(&["validate", s(&path)]), &["aggregated.toml:6: aggregated.tp: must be >= 1, got 0"]);
}

/// 16: two prefix-cacheable state groups of block sizes 16 and 32 passed
/// validate, then broke the pool's block count (one request) or panicked
/// (two). vLLM gives every Mamba layer one block size, so such a model is
/// refused by validate, placed at the second group's `block_size_tokens`;
/// with one block size it runs, every request completed.
#[test]
fn sixteen_state_groups_share_one_block_size() {
    let scenario = repro("16-state-groups-of-two-block-sizes/s.toml");
    let parts = ["s.toml:18:", "model.cache_groups[1].block_size_tokens", "differs from 16", "share one block size"];
    refused(&pdsim(&["validate", s(&scenario)]), &parts);
    let dir = scratch_dir("repro16");
    refused(&pdsim(&["run", s(&scenario), "--requests", "2", "--quiet", "--out", s(&dir.join("o"))]), &parts);
    let text = std::fs::read_to_string(&scenario).unwrap().replace("block_size_tokens = 32", "block_size_tokens = 16");
    std::fs::write(dir.join("one.toml"), text).unwrap();
    let out = dir.join("one");
    ok(&pdsim(&["run", s(&dir.join("one.toml")), "--requests", "3", "--quiet", "--no-trace", "--out", s(&out)]));
    let rows = Csv::read(&out.join("requests.csv"));
    assert_eq!(rows.column("outcome"), ["completed"; 3]);
}

/// 17: `--replicas 2^64 - 1` made every seed before the first replica ran
/// (8 bytes a replica: SIGABRT under a 2 GiB limit). Now replica k's seed
/// is made as it starts: under the same limit the replicas run until
/// Ctrl-C stops them, which leaves the rows of the replicas done. And a
/// count whose last seed passes 2^64 - 1 is refused at once.
#[test]
fn seventeen_replicas_are_made_as_they_start() {
    let scenario = repro("17-replicas-count-allocated-up-front/s.toml");
    let dir = scratch_dir("repro17");
    let out = dir.join("o");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 2097152; exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_pdsim"))
        .args(["run", s(&scenario), "--replicas", "18446744073709551615", "--jobs", "1", "--quiet"])
        .args(["--no-trace", "--no-timeline", "--out", s(&out)])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait (a bounded while) for two replicas to be whole, then Ctrl-C.
    let guard = Instant::now();
    while !out.join("replica-1/report.json").exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("pdsim ended before its second replica: {status}");
        }
        assert!(guard.elapsed() < Duration::from_secs(120), "no second replica in 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    let csv = Csv::read(&out.join("replicas.csv"));
    assert!(csv.rows.len() >= 2, "{} rows", csv.rows.len());
    // Seeds 1, 2, … (the scenario's seed is 1), replica k's seed 1 + k.
    let seeds = csv.column("seed");
    assert!(seeds.iter().enumerate().all(|(k, s)| *s == (1 + k).to_string()), "{seeds:?}");
    // Seed 2 with 2^64 - 1 replicas: the last seed would be 2^64.
    let out = pdsim(&["run", s(&scenario), "--seed", "2", "--replicas", "18446744073709551615", "--quiet"]);
    refused(&out, &["--replicas 18446744073709551615", "2^64 - 1"]);
}

/// A sweep file of four axes of `n` values each.
fn grid_sweep(dir: &Path, name: &str, base: &Path, axes: &[(&str, Vec<String>)]) -> PathBuf {
    std::fs::copy(base, dir.join("base.toml")).unwrap();
    let mut text = String::from("scenario = \"base.toml\"\n[axes]\n");
    for (k, values) in axes {
        text.push_str(&format!("\"{k}\" = [{}]\n", values.join(", ")));
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// 18: 4 axes of 65,536 values are 2^64 points, which wrapped to "0
/// points" (exit 0, a header-only sweep.csv). Now the count is checked:
/// exit 2 naming the sweep file, and nothing written.
#[test]
fn eighteen_a_grid_too_large_to_count_is_refused() {
    let dir = scratch_dir("repro18");
    let values: Vec<String> = (1..=65_536).map(|i| i.to_string()).collect();
    let axes: Vec<(&str, Vec<String>)> = ["link.bandwidth_gb_s", "link.latency_us", "slo.ttft_ms", "slo.tpot_ms"]
        .into_iter()
        .map(|k| (k, values.clone()))
        .collect();
    let sweep = grid_sweep(&dir, "wrap.toml", &repro("18-sweep-point-count-overflows/base.toml"), &axes);
    let out = dir.join("o");
    let err = refused(&pdsim(&["sweep", s(&sweep), "--quiet", "--out", s(&out)]), &["wrap.toml", "axes: "]);
    assert!(err.contains("65536 x 65536 x 65536 x 65536 x 1") && err.contains("more than pdsim can count"), "{err}");
    assert!(!out.exists());
}

/// 19: a shard built and checked every point of the grid before it ran
/// its own. Now it builds only its points: here the points with a rate
/// of 10^-6 per second and 10^7 requests arrive past the end of
/// simulated time (10^13 s, past 2^62 ns), which a shard of the first
/// point alone never sees, while the shard that holds the first of them
/// refuses it before running anything.
#[test]
fn nineteen_a_shard_builds_only_its_points() {
    let dir = scratch_dir("repro19");
    let many: Vec<String> = (1..=100).map(|i| format!("{i}.0")).collect();
    let sweep = grid_sweep(
        &dir,
        "g.toml",
        &repro("19-sweep-shard-builds-every-point/base.toml"),
        &[
            ("workload.arrival.rate_per_s", vec!["4.0".into(), "1e-6".into()]),
            ("workload.requests", vec!["2".into(), "10000000".into()]),
            ("link.latency_us", many.clone()),
            ("slo.ttft_ms", many),
        ],
    );
    // 2 x 2 x 100 x 100 = 40,000 points; shard 1 of 40,000 is point 0.
    let out = dir.join("o");
    ok(&pdsim(&["sweep", s(&sweep), "--quiet", "--jobs", "1", "--shard", "1/40000", "--out", s(&out)]));
    let csv = Csv::read(&out.join("sweep.shard-00001-of-40000.csv"));
    assert_eq!(csv.column("point"), ["0"]);
    // Point 1 x 20,000 + 1 x 10,000 = 30,000 (rate 10^-6, 10^7 requests)
    // is shard 30,001's.
    let err = refused(
        &pdsim(&["sweep", s(&sweep), "--quiet", "--shard", "30001/40000", "--out", s(&out)]),
        &["g.toml: point 30000: "],
    );
    assert!(err.contains("past the end of simulated time"), "{err}");
}

/// 20: the sweep page drew a faint dot per seed, uncut. Now a line has at
/// most 200 (the values at evenly spaced ranks where a point has more
/// seeds), and the chart says so.
#[test]
fn twenty_the_sweep_page_does_not_grow_with_the_seeds() {
    let dir = scratch_dir("repro20");
    std::fs::copy(repro("20-sweep-page-grows-with-seeds/base.toml"), dir.join("base.toml")).unwrap();
    let seeds: Vec<String> = (1..=300).map(|i| i.to_string()).collect();
    let text = format!(
        "scenario = \"base.toml\"\nseeds = [{}]\n[axes]\n\"link.bandwidth_gb_s\" = [10.0, 100.0]\n\"slo.ttft_ms\" = [500.0, 1000.0]\n",
        seeds.join(", ")
    );
    std::fs::write(dir.join("s.toml"), text).unwrap();
    let out = dir.join("o");
    ok(&pdsim(&["sweep", s(&dir.join("s.toml")), "--quiet", "--out", s(&out)]));
    ok(&pdsim(&["report", s(&out), "--quiet"]));
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    // Each chart draws 2 lines (one per value of the other axis) of 2
    // points; 2 x 300 seed dots a line would be 600, cut to 200.
    let mut charts = 0;
    for fig in page.split("<figure").skip(1) {
        let faint = fig.matches("fill-opacity=\"0.45\"").count();
        assert!(faint <= 2 * 200, "{faint} seed dots in one chart");
        charts += usize::from(faint > 0);
    }
    assert!(charts > 0, "no chart with seed dots");
    assert!(page.contains("at most 200 seed dots a line"));
}

/// 21: `run --html` of a valid 28P28D deployment with per-pair links
/// (4,704 rank and link series) refused its own timeline.csv (exit 2, no
/// page). Now the page draws the first series up to its cap and names
/// the entities it leaves out.
#[test]
fn twenty_one_the_page_of_a_large_deployment_is_made() {
    let dir = scratch_dir("repro21");
    let out = dir.join("o");
    let s21 = repro("21-run-html-over-4096-series/s.toml");
    ok(&pdsim(&["run", s(&s21), "--quiet", "--no-trace", "--html", "--out", s(&out)]));
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(page.contains(" entities past them are left out of the charts over time"), "no note");
    ok(&pdsim(&["report", s(&out), "--quiet"]));
    assert_eq!(std::fs::read_to_string(out.join("report.html")).unwrap(), page);
}

/// A file outside the output folder that must survive.
fn precious(dir: &Path) -> PathBuf {
    let p = dir.join("precious.txt");
    std::fs::write(&p, "a file pdsim did not write").unwrap();
    p
}

fn unchanged(p: &Path) {
    assert_eq!(std::fs::read_to_string(p).unwrap(), "a file pdsim did not write", "{} was written", p.display());
}

/// 22: sweep.csv, sweep_summary.csv, a shard's CSV and report.html.partial
/// were opened through a link at their name, overwriting a file
/// elsewhere. Now a link at an output name is refused (exit 2 naming it),
/// the file it points to kept, the link left.
#[test]
fn twenty_two_no_output_is_written_through_a_link() {
    let dir = scratch_dir("repro22");
    let sweep = repro("22-sweep-writes-through-symlinks/sweep.toml");
    for (name, extra) in [("sweep.csv", None), ("sweep_summary.csv", None), ("sweep.shard-1-of-3.csv", Some("1/3"))] {
        let out = dir.join(format!("out-{name}"));
        std::fs::create_dir_all(&out).unwrap();
        let target = precious(&dir);
        std::os::unix::fs::symlink(&target, out.join(name)).unwrap();
        let mut args = vec!["sweep", s(&sweep), "--quiet", "--jobs", "1", "--out", s(&out)];
        if let Some(k) = extra {
            args.extend(["--shard", k]);
        }
        refused(&pdsim(&args), &[name, "a symbolic link is in its place"]);
        unchanged(&target);
        assert!(std::fs::symlink_metadata(out.join(name)).unwrap().file_type().is_symlink());
    }
    let run = dir.join("run");
    ok(&pdsim(&["run", s(&repro("22-sweep-writes-through-symlinks/base.toml")), "--quiet", "--out", s(&run)]));
    let target = precious(&dir);
    std::os::unix::fs::symlink(&target, run.join("report.html.partial")).unwrap();
    refused(&pdsim(&["report", s(&run), "--quiet"]), &["report.html.partial", "a symbolic link"]);
    unchanged(&target);
    assert!(!run.join("report.html").exists());
}

/// 23: `replica-0` a link to a folder of the user's: --replicas removed
/// its report.json and requests.csv and wrote replica 0 there. Now the
/// link is refused before anything runs, and the folder is as it was.
#[test]
fn twenty_three_replicas_are_not_written_through_a_linked_folder() {
    let dir = scratch_dir("repro23");
    let (out, mine) = (dir.join("out"), dir.join("mine"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&mine).unwrap();
    for (f, text) in
        [("report.json", "{\"my\": \"own report\"}"), ("requests.csv", "my,own,requests"), ("notes.txt", "n")]
    {
        std::fs::write(mine.join(f), text).unwrap();
    }
    std::os::unix::fs::symlink(&mine, out.join("replica-0")).unwrap();
    let base = repro("23-replicas-write-through-a-linked-folder/base.toml");
    let args = ["run", s(&base), "--replicas", "2", "--quiet", "--no-trace", "--no-timeline", "--out", s(&out)];
    refused(&pdsim(&args), &["replica-0", "a symbolic link is in its place"]);
    assert_eq!(std::fs::read_to_string(mine.join("report.json")).unwrap(), "{\"my\": \"own report\"}");
    assert_eq!(std::fs::read_to_string(mine.join("requests.csv")).unwrap(), "my,own,requests");
    assert_eq!(names_in(&mine), ["notes.txt", "report.json", "requests.csv"]);
    // A single run leaves the link (and what it leads to) alone.
    ok(&pdsim(&["run", s(&base), "--quiet", "--no-trace", "--no-timeline", "--out", s(&out)]));
    assert_eq!(names_in(&mine), ["notes.txt", "report.json", "requests.csv"]);
}

/// Makes a named pipe at `p` (no process ever opens it: pdsim must not).
fn mkfifo(p: &Path) {
    assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
}

/// 24: `calibrate --out` and `report --out` renamed FILE.partial over
/// FILE, turning a device or a named pipe into a regular file. Now
/// anything but a regular file at FILE is refused, and stays what it was.
#[test]
fn twenty_four_out_files_replace_only_regular_files() {
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch_dir("repro24");
    let run = dir.join("run");
    ok(&pdsim(&["run", s(&repro("24-out-file-replaces-device-or-pipe/base.toml")), "--quiet", "--out", s(&run)]));
    let steps = repro("24-out-file-replaces-device-or-pipe/steps.csv");
    let pipe = dir.join("pipe");
    mkfifo(&pipe);
    let link = dir.join("link");
    let target = precious(&dir);
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for (t, kind) in [(&pipe, "a named pipe"), (&link, "a symbolic link")] {
        let calibrate = ["calibrate", s(&steps), "--kind", "linear", "--out", s(t)];
        refused(&pdsim(&calibrate), &[s(t), kind]);
        refused(&pdsim(&["report", s(&run), "--out", s(t), "--quiet"]), &[s(t), kind]);
    }
    assert!(std::fs::symlink_metadata(&pipe).unwrap().file_type().is_fifo());
    unchanged(&target);
    // A regular file there is replaced.
    let file = dir.join("fit.toml");
    std::fs::write(&file, "old").unwrap();
    ok(&pdsim(&["calibrate", s(&steps), "--kind", "linear", "--out", s(&file)]));
    assert!(std::fs::read_to_string(&file).unwrap().contains("step_time = {"));
}

/// 25: a scenario's `name` chose the output folder: `../../victim` or an
/// absolute path sent the run (and its clearing) anywhere. Now a name
/// must be one plain folder name: exit 2 naming the file and the field,
/// nothing written.
#[test]
fn twenty_five_a_name_is_one_folder_name() {
    let dir = scratch_dir("repro25");
    let (work, victim) = (dir.join("work"), dir.join("victim"));
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("report.json"), "{\"the user\": \"own report\"}").unwrap();
    let base = repro("25-scenario-name-picks-any-output-folder/base.toml");
    for name in ["../../victim".to_owned(), victim.display().to_string(), "..".to_owned(), String::new()] {
        std::fs::write(work.join("shared.toml"), format!("name = {name:?}\ninclude = [{:?}]\n", s(&base))).unwrap();
        for verb in ["run", "validate"] {
            refused(
                &pdsim_in(&work, &[verb, "shared.toml", "--quiet"][..if verb == "run" { 3 } else { 2 }]),
                &["shared.toml:1: name: ", "one plain folder name"],
            );
        }
        assert_eq!(names_in(&work), ["shared.toml"]);
        assert_eq!(std::fs::read_to_string(victim.join("report.json")).unwrap(), "{\"the user\": \"own report\"}");
    }
    // A plain name is the folder under out/.
    std::fs::write(work.join("shared.toml"), format!("name = \"my run\"\ninclude = [{:?}]\n", s(&base))).unwrap();
    ok(&pdsim_in(&work, &["run", "shared.toml", "--quiet", "--no-trace"]));
    assert!(work.join("out/my run/report.json").is_file());
}

/// 26: a sweep removed `points/`, `report.html` and shard-named paths
/// recursively, the user's files in them too. Now only what a sweep
/// writes is removed (a point folder's report.json, and the folder once
/// empty; report.html and shard CSVs only as regular files).
#[test]
fn twenty_six_a_sweep_removes_only_what_it_wrote() {
    let sweep = repro("26-sweep-deletes-files-it-did-not-write/sweep.toml");
    for (k, rel) in
        ["points/notes.txt", "points/0/my-analysis.ipynb", "report.html/index.txt", "sweep.shard-1-of-2.csv/keep.txt"]
            .into_iter()
            .enumerate()
    {
        let out = scratch_dir(&format!("repro26-{k}"));
        let p = out.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "the user's").unwrap();
        ok(&pdsim(&["sweep", s(&sweep), "--quiet", "--jobs", "1", "--reports", "--out", s(&out)]));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "the user's", "{rel}");
        // Again, a shard over the sweep's own reports: they are
        // replaced, the user's file stays.
        ok(&pdsim(&["sweep", s(&sweep), "--quiet", "--jobs", "1", "--shard", "1/3", "--reports", "--out", s(&out)]));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "the user's", "{rel}");
    }
    // A sweep's own point reports go when a later sweep does not write
    // them (no --reports), and an emptied points/ with them.
    let out = scratch_dir("repro26-own");
    ok(&pdsim(&["sweep", s(&sweep), "--quiet", "--reports", "--out", s(&out)]));
    assert!(out.join("points").is_dir());
    ok(&pdsim(&["sweep", s(&sweep), "--quiet", "--out", s(&out)]));
    assert!(!out.join("points").exists());
}

/// 27: a run cleared its output folder before it read its trace, so a
/// trace kept as `data/trace.json` with `--out data` was deleted, then
/// could not be read. Now the run refuses such a folder before touching
/// it (exit 2 naming the input and the field).
#[test]
fn twenty_seven_a_run_does_not_remove_its_own_input() {
    let dir = scratch_dir("repro27");
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::copy(repro("27-run-deletes-its-own-input/trace.jsonl"), dir.join("data/trace.json")).unwrap();
    std::fs::copy(repro("27-run-deletes-its-own-input/s.toml"), dir.join("s.toml")).unwrap();
    let before = std::fs::read(dir.join("data/trace.json")).unwrap();
    for extra in [&[][..], &["--no-trace"][..], &["--replicas", "2"][..]] {
        let mut args = vec!["run", "s.toml", "--quiet", "--no-timeline", "--out", "data"];
        args.extend_from_slice(extra);
        refused(&pdsim_in(&dir, &args), &["--out data", "data/trace.json", "workload.trace.path of s.toml"]);
        assert_eq!(std::fs::read(dir.join("data/trace.json")).unwrap(), before);
        assert_eq!(names_in(&dir.join("data")), ["trace.json"]);
    }
    // Elsewhere it runs.
    ok(&pdsim_in(&dir, &["run", "s.toml", "--quiet", "--out", "o"]));
}

/// 28: validate's resolved form wrote the trace path relative to the
/// folder validate ran in, so saved beside its scenario it named a file
/// that is not there. Now its paths are relative to the scenario's folder
/// (a header line says so), and the saved form reads back from anywhere.
#[test]
fn twenty_eight_the_resolved_form_reads_back_beside_its_scenario() {
    let dir = scratch_dir("repro28");
    std::fs::create_dir_all(dir.join("sc")).unwrap();
    for f in ["s.toml", "t.jsonl"] {
        std::fs::copy(repro(&format!("28-resolved-form-paths-relative-to-cwd/sc/{f}")), dir.join("sc").join(f))
            .unwrap();
    }
    let resolved = ok(&pdsim_in(&dir, &["validate", "sc/s.toml"]));
    assert!(resolved.contains("path = \"t.jsonl\""), "{resolved}");
    assert!(resolved.contains("# paths are relative to sc, the scenario's folder"), "{resolved}");
    std::fs::write(dir.join("sc/resolved.toml"), &resolved).unwrap();
    ok(&pdsim_in(&dir, &["validate", "sc/resolved.toml"]));
    ok(&pdsim_in(&dir.join("sc"), &["validate", "resolved.toml"]));
    // From inside the folder, the same path.
    let again = ok(&pdsim_in(&dir.join("sc"), &["validate", "s.toml"]));
    assert!(again.contains("path = \"t.jsonl\""), "{again}");
}

/// 29: a run that failed while writing (a full disk, here a file-size
/// limit) left the files it had finished (requests.csv, timeline.csv).
/// Now every file stays under its partial name until all are whole, and
/// a failure removes them all: the folder holds nothing of the run.
#[test]
fn twenty_nine_a_failed_run_leaves_none_of_its_files() {
    let dir = scratch_dir("repro29");
    let out = dir.join("o");
    let base = repro("29-failed-run-leaves-some-of-its-files/base.toml");
    // 12 requests: requests.csv (2.5 KB) and timeline.csv (5.6 KB) fit
    // under the 10 KiB limit, trace.json (17 KB) does not.
    let run = pdsim_with_small_files(&["run", s(&base), "--requests", "12", "--quiet", "--out", s(&out)]);
    refused(&run, &["cannot write ", "trace.json"]);
    assert!(names_in(&out).is_empty(), "left: {:?}", names_in(&out));
}
