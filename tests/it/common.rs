//! Paths to fixtures, scratch files, and running the built `pdsim`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

/// The package root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A file under `tests/fixtures/`.
pub fn fixture(rel: &str) -> PathBuf {
    root().join("tests/fixtures").join(rel)
}

/// A file under `scenarios/`.
pub fn scenario_file(rel: &str) -> PathBuf {
    root().join("scenarios").join(rel)
}

/// Writes `text` to the file `name` in this test run's scratch folder and
/// returns its path.
///
/// Tests run on parallel threads and a shared helper may write the same
/// name from several of them, so the text goes to a file of its own first
/// and is renamed into place: a reader sees a whole file, never one another
/// thread is still writing. Two writers of one name must write the same
/// text.
pub fn scratch(name: &str, text: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pdsim-it");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let part = dir.join(format!(".{name}.{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&part, text).unwrap();
    std::fs::rename(&part, &path).unwrap();
    path
}

/// A small valid P/D scenario on the GLM-like model (included by absolute
/// path), one field per line so tests can break a known line:
///
/// ```text
///  1 name = "scratch"
///  2 include = [".../scenarios/models/glm-5.3-flash-tp4-fp8.toml"]
///  3 vllm_version = "0.32.0"
///  4
///  5 [prefill]
///  6 num_blocks = 100
///  7 step_time = { kind = "linear", fixed_us = 1000 }
///  8
///  9 [decode]
/// 10 num_blocks = 100
/// 11 step_time = { kind = "linear", fixed_us = 1000 }
/// 12
/// 13 [workload]
/// 14 requests = 10
/// 15 arrival = { kind = "poisson", rate_per_s = 4.0 }
/// 16 prompt_tokens = { kind = "fixed", value = 100 }
/// 17 output_tokens = { kind = "fixed", value = 10 }
/// ```
pub fn base_scenario() -> String {
    let model = scenario_file("models/glm-5.3-flash-tp4-fp8.toml");
    format!(
        r#"name = "scratch"
include = [{model:?}]
vllm_version = "0.32.0"

[prefill]
num_blocks = 100
step_time = {{ kind = "linear", fixed_us = 1000 }}

[decode]
num_blocks = 100
step_time = {{ kind = "linear", fixed_us = 1000 }}

[workload]
requests = 10
arrival = {{ kind = "poisson", rate_per_s = 4.0 }}
prompt_tokens = {{ kind = "fixed", value = 100 }}
output_tokens = {{ kind = "fixed", value = 10 }}
"#
    )
}

/// [`base_scenario`] with line `line` (1-based) replaced by `with` (which
/// may hold several lines).
pub fn base_with_line(line: usize, with: &str) -> String {
    base_with_lines(&[(line, with)])
}

/// [`base_scenario`] with each `(line, text)` replacing its line (1-based,
/// numbered before any replacement).
pub fn base_with_lines(edits: &[(usize, &str)]) -> String {
    let mut lines: Vec<String> = base_scenario().lines().map(str::to_owned).collect();
    for (line, with) in edits {
        lines[line - 1] = (*with).to_owned();
    }
    lines.join("\n") + "\n"
}

/// Runs the built `pdsim` with `args` in the package root.
pub fn pdsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pdsim")).args(args).current_dir(root()).output().unwrap()
}

/// The exit code, stdout and stderr of a run.
pub fn outcome(out: &Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fresh, empty folder `name` in this test run's scratch folder. Names
/// must be unique across tests.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pdsim-it-dirs").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The names in folder `dir`, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// Runs the built `pdsim` with `args` under a file-size limit of 20 blocks
/// (10 KiB in `sh`, 20 KiB in bash) with SIGXFSZ ignored, so that a write
/// past it fails with EFBIG as one on a full disk fails with ENOSPC.
pub fn pdsim_with_small_files(args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 20; exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_pdsim"))
        .args(args)
        .output()
        .unwrap()
}

/// Runs the built `pdsim` with `args` in the folder `cwd`.
pub fn pdsim_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pdsim")).args(args).current_dir(cwd).output().unwrap()
}

/// Parses CSV text (RFC 4180 quoting) into rows of fields.
pub fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => field.push(c),
        }
    }
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    rows
}

/// A parsed CSV file: its header and rows, with cells looked up by column
/// name.
pub struct Csv {
    /// The header.
    pub header: Vec<String>,
    /// The data rows.
    pub rows: Vec<Vec<String>>,
}

impl Csv {
    /// Reads and parses `path`; the first row is the header.
    pub fn read(path: &Path) -> Csv {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut rows = parse_csv(&text);
        assert!(!rows.is_empty(), "{} is empty", path.display());
        let header = rows.remove(0);
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(r.len(), header.len(), "{} row {}: {r:?}", path.display(), i + 1);
        }
        Csv { header, rows }
    }

    /// The index of column `name`.
    pub fn col(&self, name: &str) -> usize {
        self.header.iter().position(|h| h == name).unwrap_or_else(|| panic!("no column {name} in {:?}", self.header))
    }

    /// Every cell of column `name`.
    pub fn column(&self, name: &str) -> Vec<&str> {
        let i = self.col(name);
        self.rows.iter().map(|r| r[i].as_str()).collect()
    }
}
