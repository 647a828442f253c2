//! Output folders that hold more than pdsim's own files: every command
//! that writes (`run`, `run --replicas`, `sweep` whole and `--shard`,
//! `report`, `calibrate --out`) meets a symbolic link at each of its
//! output names (to a file outside the folder, and dangling), a folder
//! and a named pipe in place of an output file, odd folder names, and the
//! user's own files beside its outputs. A link or anything but a regular
//! file at an output name is refused (exit 2, one line naming it) and
//! left as it was, the file it points to unchanged; the user's files
//! stay; odd names are only names.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{fixture, names_in, outcome, pdsim, scratch_dir};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A small aggregated scenario (2 requests) and a sweep of it (2 points x
/// 2 seeds), and measured steps to fit.
fn base() -> PathBuf {
    fixture("repros/22-sweep-writes-through-symlinks/base.toml")
}
fn sweep_file() -> PathBuf {
    fixture("repros/22-sweep-writes-through-symlinks/sweep.toml")
}
fn steps() -> PathBuf {
    fixture("repros/24-out-file-replaces-device-or-pipe/steps.csv")
}

/// A command that writes into (or to) `out`.
struct Writer {
    what: &'static str,
    /// Its arguments, given the output folder (or file).
    args: fn(&Path) -> Vec<String>,
    /// Names it writes in the folder (or, with `file`, the file itself).
    names: &'static [&'static str],
    /// The output is a file (`--out FILE`), not a folder.
    file: bool,
    /// Makes what the command reads from, in `out` (a run to report on).
    prepare: fn(&Path),
}

fn run_into(out: &Path) {
    let (code, _, err) = outcome(&pdsim(&["run", s(&base()), "--quiet", "--out", s(out)]));
    assert_eq!(code, 0, "{err}");
}

fn writers() -> Vec<Writer> {
    vec![
        Writer {
            what: "run",
            args: |o| ["run", s(&base()), "--quiet", "--html", "--out", s(o)].iter().map(|a| (*a).to_owned()).collect(),
            names: &[
                "report.json",
                "requests.csv",
                "timeline.csv",
                "trace.json",
                "report.html",
                "requests.csv.partial",
                "trace.json.slices.partial",
            ],
            file: false,
            prepare: |_| {},
        },
        Writer {
            what: "run --replicas",
            args: |o| {
                ["run", s(&base()), "--quiet", "--replicas", "2", "--no-trace", "--out", s(o)]
                    .iter()
                    .map(|a| (*a).to_owned())
                    .collect()
            },
            names: &["replicas.csv", "replicas_summary.csv", "replicas.csv.partial", "replica-1"],
            file: false,
            prepare: |_| {},
        },
        Writer {
            what: "sweep",
            args: |o| {
                ["sweep", s(&sweep_file()), "--quiet", "--jobs", "1", "--reports", "--out", s(o)]
                    .iter()
                    .map(|a| (*a).to_owned())
                    .collect()
            },
            names: &["sweep.csv", "sweep_summary.csv", "sweep.csv.partial", "points"],
            file: false,
            prepare: |_| {},
        },
        Writer {
            what: "sweep --shard",
            args: |o| {
                ["sweep", s(&sweep_file()), "--quiet", "--jobs", "1", "--shard", "2/2", "--out", s(o)]
                    .iter()
                    .map(|a| (*a).to_owned())
                    .collect()
            },
            names: &["sweep.shard-2-of-2.csv", "sweep.shard-2-of-2.csv.partial"],
            file: false,
            prepare: |_| {},
        },
        Writer {
            what: "report",
            args: |o| ["report", s(o), "--quiet"].iter().map(|a| (*a).to_owned()).collect(),
            names: &["report.html", "report.html.partial"],
            file: false,
            prepare: run_into,
        },
        Writer {
            what: "calibrate --out",
            args: |o| {
                ["calibrate", s(&steps()), "--kind", "linear", "--out", s(o)].iter().map(|a| (*a).to_owned()).collect()
            },
            names: &[""],
            file: true,
            prepare: |_| {},
        },
    ]
}

fn go(w: &Writer, out: &Path) -> Output {
    let args = (w.args)(out);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    pdsim(&args)
}

fn refused(w: &Writer, out: &Path, name: &str, kind: &str) {
    let (code, _, err) = outcome(&go(w, out));
    assert_eq!(code, 2, "{} with {kind} at {name:?}: {err}", w.what);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(kind) && err.contains(name), "{} with {kind} at {name:?}: {err}", w.what);
    assert!(!err.contains("internal error"), "{err}");
}

/// Where `name` is for writer `w` in the case folder `case`: the output
/// folder and the path of the name.
fn place(w: &Writer, case: &Path, name: &str) -> (PathBuf, PathBuf) {
    if w.file {
        let f = case.join("fit.toml");
        (f.clone(), if name.is_empty() { f } else { case.join(format!("fit.toml{name}")) })
    } else {
        let out = case.join("out");
        std::fs::create_dir_all(&out).unwrap();
        (out.clone(), out.join(name))
    }
}

#[test]
fn links_at_output_names_are_refused_and_their_targets_kept() {
    for (wi, w) in writers().iter().enumerate() {
        let mut names: Vec<&str> = w.names.to_vec();
        if w.file {
            names.push(".partial");
        }
        for (ni, name) in names.iter().enumerate() {
            for dangling in [false, true] {
                let case = scratch_dir(&format!("outputs-link-{wi}-{ni}-{dangling}"));
                let target = case.join("precious.txt");
                if !dangling {
                    std::fs::write(&target, "mine").unwrap();
                }
                let (out, at) = place(w, &case, name);
                if !w.file {
                    (w.prepare)(&out);
                }
                std::os::unix::fs::symlink(&target, &at).unwrap();
                refused(w, &out, at.file_name().unwrap().to_str().unwrap(), "a symbolic link is in its place");
                assert!(std::fs::symlink_metadata(&at).unwrap().file_type().is_symlink(), "{}: {name}", w.what);
                if dangling {
                    assert!(!target.exists(), "{}: {name}: a file was made through a dangling link", w.what);
                } else {
                    assert_eq!(std::fs::read_to_string(&target).unwrap(), "mine", "{}: {name}", w.what);
                }
            }
        }
    }
}

#[test]
fn folders_and_pipes_in_place_of_output_files_are_refused() {
    use std::os::unix::fs::FileTypeExt;
    for (wi, w) in writers().iter().enumerate() {
        // An output file's name (a folder's name holds a folder anyway).
        let name = w.names.iter().find(|n| n.contains('.') || n.is_empty()).unwrap();
        for kind in ["a folder", "a named pipe"] {
            let case = scratch_dir(&format!("outputs-odd-{wi}-{}", kind.len()));
            let (out, at) = place(w, &case, name);
            if !w.file {
                (w.prepare)(&out);
            }
            if kind == "a folder" {
                std::fs::create_dir_all(at.join("inside")).unwrap();
            } else {
                assert!(Command::new("mkfifo").arg(&at).status().unwrap().success());
            }
            refused(w, &out, at.file_name().unwrap().to_str().unwrap(), &format!("{kind} is in its place"));
            let t = std::fs::symlink_metadata(&at).unwrap().file_type();
            assert!(if kind == "a folder" { t.is_dir() } else { t.is_fifo() }, "{}: {name} was replaced", w.what);
        }
    }
}

#[test]
fn the_users_files_stay_and_odd_folder_names_are_names() {
    for (wi, w) in writers().iter().enumerate() {
        // A folder name with spaces, quotes, a dollar sign, a leading dash
        // and non-ASCII letters: only a name.
        let case = scratch_dir(&format!("outputs-odd-name-{wi}"));
        let odd = case.join("-a folder 'of' $HOME \"ü\" ✓");
        std::fs::create_dir_all(&odd).unwrap();
        let (out, _) = if w.file { (odd.join("fit.toml"), PathBuf::new()) } else { (odd.join("out"), PathBuf::new()) };
        let folder = if w.file { odd.clone() } else { out.clone() };
        std::fs::create_dir_all(&folder).unwrap();
        // The user's things: a file, a folder with a file, a file named
        // like pdsim's but not one of its names.
        let mine = ["notes.txt", "analysis/nb.ipynb", "report.json.bak", "replica-x/keep.txt", "points.txt"];
        for m in mine {
            let p = folder.join(m);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "the user's").unwrap();
        }
        if !w.file {
            (w.prepare)(&out);
        }
        for _ in 0..2 {
            let (code, _, err) = outcome(&go(w, &out));
            assert_eq!(code, 0, "{}: {err}", w.what);
            for m in mine {
                assert_eq!(std::fs::read_to_string(folder.join(m)).unwrap(), "the user's", "{}: {m}", w.what);
            }
        }
        // Nothing of pdsim's is left under a partial name.
        let left: Vec<String> = names_in(&folder).into_iter().filter(|n| n.ends_with(".partial")).collect();
        assert!(left.is_empty(), "{}: {left:?}", w.what);
        // Nothing was written outside the case folder's own subfolders.
        let mut top = names_in(&case);
        top.retain(|n| !n.starts_with("-a folder"));
        assert!(top.is_empty(), "{}: {top:?}", w.what);
    }
}
