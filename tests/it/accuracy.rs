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
    let rows = accuracy::replay_dir(&dir, 2).unwrap();
    // Eight runs: six of two stages' worth of points, twelve in all, two
    // of them overloaded (the reasoning runs).
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
    let one = accuracy::table(&accuracy::replay_dir(&dir, 1).unwrap());
    let three = accuracy::table(&accuracy::replay_dir(&dir, 3).unwrap());
    assert_eq!(one, three);
}

#[test]
fn a_missing_folder_is_named() {
    let e = accuracy::replay_dir(&root().join("no-such-folder"), 1).unwrap_err();
    assert!(e.contains("no-such-folder/measured.csv"), "{e}");
}
