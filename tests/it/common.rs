//! Paths to fixtures, scratch files, and running the built `pdsim`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

/// Writes `text` to a fresh file `name` in this test run's scratch folder
/// and returns its path. Names must be unique across tests.
pub fn scratch(name: &str, text: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pdsim-it");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
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
