//! The accuracy table (`pdsim accuracy`): the real vLLM runs of
//! `validation/` replayed with presets and defaults give, character for
//! character, the table recorded in `validation/accuracy.md`. The
//! simulation is deterministic, so there is no tolerance: a change that
//! moves a figure updates the recorded table (and the README's Accuracy
//! section) on purpose, in a commit that says why.

use pdsim::accuracy;

use crate::common::root;

#[test]
fn the_replayed_runs_give_the_recorded_table() {
    let dir = root().join("validation");
    let rows = accuracy::replay_dir(&dir, accuracy::DRAWS, 2).unwrap();
    // Eight runs: four of two stages and four of one, twelve points in
    // all, two of them overloaded (the reasoning runs).
    assert_eq!(rows.len(), 12);
    assert_eq!(rows.iter().filter(|r| r.point.overloaded()).count(), 2);
    // Every point the real server overloaded, the simulation overloads
    // too; every stable one it serves.
    for r in &rows {
        assert_eq!(r.predicted_overloaded, r.point.overloaded(), "{}", r.point.label());
    }
    let recorded = std::fs::read_to_string(dir.join("accuracy.md")).unwrap();
    let table = accuracy::table(&rows);
    assert!(table == recorded, "the accuracy table changed; if on purpose, record it:\n{table}");
    // The README's Accuracy section quotes the same table.
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(readme.contains(&recorded), "README.md's Accuracy section does not quote validation/accuracy.md");
}

#[test]
fn the_table_does_not_depend_on_the_jobs() {
    let dir = root().join("validation");
    // Two draws a run: 16 replays, shared out over one and three jobs.
    let one = accuracy::table(&accuracy::replay_dir(&dir, 2, 1).unwrap());
    let three = accuracy::table(&accuracy::replay_dir(&dir, 2, 3).unwrap());
    assert_eq!(one, three);
}

#[test]
fn a_missing_folder_is_named() {
    let e = accuracy::replay_dir(&root().join("no-such-folder"), 1, 1).unwrap_err();
    assert!(e.contains("no-such-folder/measured.csv"), "{e}");
}

#[test]
fn the_command_prints_the_recorded_table_and_refuses_a_bad_file_in_one_line() {
    use crate::common::{outcome, pdsim, scratch_dir};
    let (code, stdout, stderr) = outcome(&pdsim(&["accuracy", "--jobs", "2"]));
    assert_eq!(code, 0, "{stderr}");
    let recorded = std::fs::read_to_string(root().join("validation/accuracy.md")).unwrap();
    assert_eq!(stdout, recorded);
    // One draw is another table (one realisation of the arrivals), of
    // the same points; no draw at all is refused.
    let (code, one, stderr) = outcome(&pdsim(&["accuracy", "--draws", "1"]));
    assert_eq!(code, 0, "{stderr}");
    assert_ne!(one, recorded);
    assert_eq!(one.lines().count(), recorded.lines().count());
    let (code, _, stderr) = outcome(&pdsim(&["accuracy", "--draws", "0"]));
    assert_eq!(code, 2, "{stderr}");
    // A measured.csv whose rate is not a number: exit 2, one line naming
    // the file, the line and the column.
    let good = std::fs::read_to_string(root().join("validation/measured.csv")).unwrap();
    let bad = good.replacen(",5.0,600,", ",fast,600,", 1);
    let dir = scratch_dir("accuracy-bad");
    std::fs::write(dir.join("measured.csv"), bad).unwrap();
    let dir = dir.to_str().unwrap().to_owned();
    let (code, _, stderr) = outcome(&pdsim(&["accuracy", &dir]));
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("measured.csv:2: rate_per_s: expected a number >= 0, got \"fast\""), "{stderr}");
}
