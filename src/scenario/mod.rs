//! Scenario files: the TOML format, includes, and the loader that checks
//! everything and reports the first problem with its file, line and field.
//!
//! # Format
//!
//! ```toml
//! name = "glm-5.3-flash-1p1d"        # optional
//! description = "..."                # optional
//! seed = 1                           # default 1
//! include = ["models/glm-5.3-flash-tp4-fp8.toml"]   # or one string
//!
//! vllm_version = "0.32.0"            # every rank's, unless a role names its own
//!
//! # [model] is given whole (in an included fragment here), or named:
//! # [model]
//! # preset = "llama-3.1-8b"          # presets/models/<id>.json; or config = "config.json"
//! # kv_cache_dtype = "auto"          # auto (16-bit) | bf16 | fp16 | fp8
//!
//! # [hardware]                       # for the roofline and num_blocks from memory
//! # gpu = "h200"                     # presets/gpus.toml; numbers given here win
//!
//! [prefill]                          # and [decode]; or [aggregated] alone
//! count = 1                          # ranks (default 1)
//! tp = 4                             # TP size (default: the model's, else 1)
//! num_blocks = 3066                  # KV pool blocks (absent: from GPU memory)
//! # gpu_memory_utilization = 0.9     # the share of it, when num_blocks is absent
//! max_num_batched_tokens = 8192      # default 8192
//! max_num_seqs = 256                 # default 256
//! # block_size_tokens = 16           # linear models only
//! # max_model_len = 131072          # prompts that reach it fail; outputs are capped
//! # prefix_caching = true            # default true
//! # vllm_version = "0.31.0"          # overrides the top-level one
//! step_time = { kind = "linear", fixed_us = 4000, per_token_us = 40, per_seq_us = 0, per_context_token_us = 0.002 }
//! # or { kind = "table", points = [[1, 5000], [8192, 330000]], per_context_token_us = 0 }
//! # or { kind = "table2d", prefill = [[1, 5000], [8192, 200000]], prefill_self_pair_ns = 0.8,
//! #      prefill_cached_pair_ns = 0.2, decode = { seqs = [1, 256], context = [512, 4096],
//! #      us = [[4800, 5000], [12000, 38000]] } }   (on one line; see `pdsim calibrate`)
//! # or { kind = "roofline" }         # needs the model's layers and [hardware]
//!
//! [link]                             # all optional
//! bandwidth_gb_s = 50.0              # default 50 (10^9 bytes/s)
//! latency_us = 20.0                  # default 0
//! sharing = "processor_sharing"      # or "fifo"
//! topology = "per_pair"              # or "shared"
//!
//! [router]                           # round_robin | least_outstanding | kv_aware
//! prefill_policy = "round_robin"
//! decode_policy = "least_outstanding"
//!
//! [faults]
//! decode_abort_probability = 0.0
//! # source_lease_s = 30             # the lease (default: the version's, 30 s), or:
//! # source_hold_s = 480             # a fixed hold instead
//! # decode_crashes = [{ rank = 0, at_s = 120.0 }]
//!
//! [frontend]                         # vLLM's API server; absent: the version's,
//! # request_us = 3600                # arrival to the engine core (default 3,600)
//! # response_us = 3600               # a step's outputs to the client (default 3,600)
//!
//! timeline_interval_ms = 100.0       # no effect (the timeline is exact); before any [table]
//! check_invariants = false
//!
//! [workload]                         # see crate::workload
//! requests = 2000
//! arrival = { kind = "poisson", rate_per_s = 4.0 }
//! prompt_tokens = { kind = "lognormal", mean = 4000, std = 3000, max = 32000 }
//! output_tokens = { kind = "lognormal", mean = 300, std = 200, max = 2000 }
//!
//! [slo]                              # optional bounds for goodput, ms
//! ttft_ms = 2000
//! tpot_ms = 50
//! ```
//!
//! `[model]` is [`actors::model::ModelSpec`]; the deployment keys are the
//! fields of [`actors::config::DeploymentSpec`] at top level, with its
//! defaults; `[workload]` is [`WorkloadSpec`]; `[slo]` is
//! [`actors::config::SloSpec`]. Unknown keys are refused everywhere.
//!
//! # Includes
//!
//! `include` names files relative to the including file; they are read the
//! same way (and may include others). Override is **by top-level key**: a
//! top-level key (a table such as `[model]` or `[prefill]`, or a value such
//! as `seed`) present in the including file replaces the included one
//! whole — tables are not merged field by field. Among several includes a
//! later one replaces an earlier one. An include cycle is an error.
//!
//! # Errors
//!
//! Every error is one line, `file:line: field: problem`, e.g.
//! `scenarios/x.toml:14: workload.arrival.rate_per_s: must be > 0, got -3`.
//! The line is that of the field when the file has it, else of the nearest
//! enclosing table; a field that no file has at all (a missing `[model]`)
//! names the file only.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use actors::arch::hf;
use actors::config::{DeploymentSpec, RoleSpec, SloSpec};
use actors::hardware::HardwareSpec;
use actors::model::{FrontEnd, GateError, Location, Model, ModelSpec, Role};
use actors::sim::{ConfigError, Deployment};
use actors::validate::{self, FieldError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use crate::trace::TraceReader;
use crate::workload::WorkloadSpec;
use crate::{files, presets};

mod sources;
use sources::*;

/// The top-level keys a scenario file may have.
pub const TOP_LEVEL_KEYS: &[&str] = &[
    "name",
    "description",
    "seed",
    "include",
    "model",
    "vllm_version",
    "prefill",
    "decode",
    "aggregated",
    "link",
    "router",
    "faults",
    "frontend",
    "timeline_interval_ms",
    "check_invariants",
    "hardware",
    "workload",
    "slo",
];

/// The deployment keys, passed to [`DeploymentSpec`].
const DEPLOYMENT_KEYS: &[&str] = &[
    "vllm_version",
    "prefill",
    "decode",
    "aggregated",
    "link",
    "router",
    "faults",
    "frontend",
    "timeline_interval_ms",
    "check_invariants",
    "hardware",
];

/// A scenario file refused: one line naming the file, the line (when the
/// field is in a file), the field, and the problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ScenarioError {
    file: String,
    line: Option<usize>,
    field: Option<String>,
    message: String,
}

impl ScenarioError {
    fn new(file: &str, line: Option<usize>, field: Option<&str>, message: impl Into<String>) -> Self {
        let message: String = message.into();
        // One line, whatever the source of the text.
        let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
        ScenarioError { file: file.to_owned(), line, field: field.map(str::to_owned), message }
    }

    /// An error about `field` of `file` with no line (a table the file
    /// lacks).
    pub fn at(file: &str, field: Option<&str>, message: impl Into<String>) -> Self {
        ScenarioError::new(file, None, field, message)
    }

    /// The file, as the user named it (includes joined to the including
    /// file's folder).
    pub fn file(&self) -> &str {
        &self.file
    }
    /// The 1-based line, when the problem has a place in the file.
    pub fn line(&self) -> Option<usize> {
        self.line
    }
    /// The dotted field path (`workload.arrival.rate_per_s`), when there is
    /// one.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }
    /// The problem, without the place.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        f.write_str(": ")?;
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// A checked scenario: the resolved form of a file and its includes, every
/// default filled in, and the validated model.
///
/// Every `Scenario` has passed every check [`load`] makes; it serializes
/// (TOML, JSON) to its resolved form, which loads back to an equal scenario.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scenario {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    seed: u64,
    model: ModelSpec,
    #[serde(flatten)]
    deployment: DeploymentSpec,
    workload: WorkloadSpec,
    slo: SloSpec,
    #[serde(skip)]
    source: String,
    /// Where the model came from when it was derived: `preset <id>` or
    /// `config <path>`.
    #[serde(skip)]
    model_origin: Option<String>,
    /// The `[model]` table as the file named its source (a preset or a
    /// `config.json`, the path resolved), when it was derived: what
    /// [`Scenario::with_edit`] derives the model from again at the edited
    /// TP sizes.
    #[serde(skip)]
    model_source: Option<toml::Table>,
    #[serde(skip)]
    validated: Model,
    /// The API server in front of the engines, as the run prices it.
    #[serde(skip)]
    front_end: FrontEnd,
    /// The files read from the disk to make it, each with the field that
    /// named it (`scenario`, `include`, `model.config`,
    /// `workload.trace.path`).
    #[serde(skip)]
    inputs: Vec<(&'static str, PathBuf)>,
    /// The folder of the file it was loaded from (its paths are relative
    /// to it in the resolved form report.json holds).
    #[serde(skip)]
    dir: PathBuf,
}

impl Scenario {
    /// The scenario's name, if the file gave one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
    /// The scenario's description, if the file gave one.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }
    /// The seed of every random stream (default 1).
    pub fn seed(&self) -> u64 {
        self.seed
    }
    /// Replaces the seed (`pdsim run --seed`); any seed is valid.
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
    }
    /// The deployment: roles, link, router, faults, timeline interval.
    pub fn deployment(&self) -> &DeploymentSpec {
        &self.deployment
    }
    /// The model as the file gives it.
    pub fn model_spec(&self) -> &ModelSpec {
        &self.model
    }
    /// Where the model came from when the file did not give it whole:
    /// `preset llama-3.1-8b`, or `config <path>` (a HuggingFace
    /// config.json).
    pub fn model_origin(&self) -> Option<&str> {
        self.model_origin.as_deref()
    }
    /// The `[model]` table as the file named its source (`preset` or a
    /// resolved `config`, `kv_cache_dtype`, `name`), when the model was
    /// derived rather than given.
    pub fn model_source(&self) -> Option<&toml::Table> {
        self.model_source.as_ref()
    }
    /// The validated model (it passed [`ModelSpec::validate`] for every role
    /// present, and the version and pairing gates).
    pub fn model(&self) -> &Model {
        &self.validated
    }

    /// The API server in front of the engines, as a run prices it: the
    /// file's `[frontend]`, each field it leaves out the vLLM version's.
    pub fn front_end(&self) -> FrontEnd {
        self.front_end
    }
    /// The workload; trace paths are resolved (joined to the folder of the
    /// file that named them).
    pub fn workload(&self) -> &WorkloadSpec {
        &self.workload
    }
    /// The SLOs for goodput (every bound optional).
    pub fn slo(&self) -> &SloSpec {
        &self.slo
    }
    /// Where the scenario came from: the file as named, or a label for an
    /// embedded or overridden scenario.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The files on the disk this scenario was made of, each with the
    /// field that named it (`scenario` for the file itself, `include`,
    /// `model.config`, `workload.trace.path`), as paths from the current
    /// folder: what a run must not remove or replace.
    pub fn inputs(&self) -> &[(&'static str, PathBuf)] {
        &self.inputs
    }

    /// The folder of the scenario's file (of the file it was made from,
    /// for a sweep's point), from the current folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The resolved form with its paths relative to [`Scenario::dir`]: the
    /// same whatever folder pdsim ran in (what report.json holds).
    pub fn beside_its_file(&self) -> Scenario {
        self.relative_to(&self.dir)
    }

    /// A copy whose paths (a trace's) are written relative to the folder
    /// `dir` instead of the current folder: the resolved form of a
    /// scenario saved in `dir` (beside the scenario it came from, for
    /// `dir` its folder) reads its files back, since a scenario's paths
    /// are relative to the file that names them. A path that cannot be
    /// put relative to `dir` (the two on different sides of a `..` that
    /// the names alone cannot resolve) is made absolute.
    pub fn relative_to(&self, dir: &Path) -> Scenario {
        let mut s = self.clone();
        if let Some(t) = &mut s.workload.trace {
            t.path = relative_path(dir, &t.path);
        }
        s
    }

    /// The vLLM version a rank of `role` runs: the role's own, else the
    /// top-level one.
    pub fn vllm_version(&self, role: Role) -> Option<&str> {
        let spec = match role {
            Role::Prefill => self.deployment.prefill.as_ref(),
            Role::Decode => self.deployment.decode.as_ref(),
            Role::Aggregated => self.deployment.aggregated.as_ref(),
        };
        spec.and_then(|r| r.vllm_version.as_deref()).or(self.deployment.vllm_version.as_deref())
    }

    /// The resolved scenario as TOML (what `pdsim validate` prints).
    ///
    /// # Errors
    /// A seed above `i64::MAX` (TOML integers are signed 64-bit).
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    fn to_table(&self) -> Result<toml::Table, toml::ser::Error> {
        toml::Table::try_from(self)
    }

    /// A copy with some fields replaced, checked again as a whole: each
    /// override is a dotted path of table keys (`decode.count`,
    /// `link.bandwidth_gb_s`, `workload.arrival.rate_per_s`, `seed`) and a
    /// value. Missing tables on the way are created. This is how a sweep
    /// makes its points.
    ///
    /// ```
    /// let s = pdsim::scenario::load_default().unwrap();
    /// let t = s.with_overrides(&[("decode.count", toml::Value::Integer(2))]).unwrap();
    /// assert_eq!(t.deployment().decode.as_ref().unwrap().count, 2);
    /// assert!(s.with_overrides(&[("decode.count", toml::Value::Integer(0))]).is_err());
    /// ```
    ///
    /// # Errors
    /// A path through a value that is not a table, or any check the result
    /// fails; the error names the overrides in place of a file.
    pub fn with_overrides(&self, overrides: &[(&str, toml::Value)]) -> Result<Scenario, ScenarioError> {
        let described: Vec<String> = overrides.iter().map(|(k, v)| format!("{k} = {v}")).collect();
        let label = format!("{} with {}", self.source, described.join(", "));
        let mut table =
            self.to_table().map_err(|e| ScenarioError::new(&label, None, None, format!("cannot serialize: {e}")))?;
        for (path, value) in overrides {
            set_path(&mut table, path, value.clone()).map_err(|m| ScenarioError::new(&label, None, Some(path), m))?;
        }
        let made = Self::from_table(&table, &label)?;
        Ok(self.keep_origin(made))
    }

    /// `made` (built from this scenario's resolved table) with this
    /// scenario's input files and folder: the same inputs, the same paths.
    fn keep_origin(&self, mut made: Scenario) -> Scenario {
        let mut inputs: Vec<_> = self.inputs.iter().filter(|(f, _)| *f != "workload.trace.path").cloned().collect();
        inputs.append(&mut made.inputs);
        made.inputs = inputs;
        made.dir = self.dir.clone();
        made
    }

    /// A copy whose resolved form `edit` changes as a whole (roles added
    /// or removed, say), checked again as a whole and named `label` in
    /// errors. Unlike [`Scenario::with_overrides`], a model the file
    /// derived from a preset or a `config.json` is derived again, at the
    /// edited roles' TP sizes (as a file with those roles would derive
    /// it), so a layout vLLM builds differently at another TP size is
    /// refused, not scaled. This is how `pdsim plan` makes its candidates.
    ///
    /// # Errors
    /// An `edit` that fails (its message, placed at no field), or any
    /// check the result fails.
    pub fn with_edit(
        &self,
        label: &str,
        edit: impl FnOnce(&mut toml::Table) -> Result<(), String>,
    ) -> Result<Scenario, ScenarioError> {
        let mut table =
            self.to_table().map_err(|e| ScenarioError::new(label, None, None, format!("cannot serialize: {e}")))?;
        if let Some(source) = &self.model_source {
            table.insert("model".to_owned(), toml::Value::Table(source.clone()));
        }
        edit(&mut table).map_err(|m| ScenarioError::new(label, None, None, m))?;
        let made = Self::from_table(&table, label)?;
        Ok(self.keep_origin(made))
    }

    /// Loads a resolved table (no file: errors carry `label` and no line).
    fn from_table(table: &toml::Table, label: &str) -> Result<Scenario, ScenarioError> {
        let text = toml::to_string(table)
            .map_err(|e| ScenarioError::new(label, None, None, format!("cannot serialize: {e}")))?;
        let files = Embedded(vec![(String::new(), text)]);
        load_from(&files, Path::new(""), label, false)
    }
}

/// Sets the dotted `path` in `table` to `value`, creating tables on the way.
fn set_path(table: &mut toml::Table, path: &str, value: toml::Value) -> Result<(), String> {
    let mut keys = path.split('.').peekable();
    let mut here = table;
    while let Some(key) = keys.next() {
        if key.is_empty() {
            return Err("empty key in the override path".into());
        }
        if keys.peek().is_none() {
            here.insert(key.to_owned(), value);
            return Ok(());
        }
        let next = here.entry(key.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        here = next.as_table_mut().ok_or_else(|| format!("`{key}` is not a table, so it has no fields"))?;
    }
    Ok(())
}

/// Loads, resolves and checks the scenario file at `path`.
///
/// # Errors
/// The first problem found, as one line naming the file, line and field.
pub fn load(path: impl AsRef<Path>) -> Result<Scenario, ScenarioError> {
    let path = normalize(path.as_ref());
    let label = path.display().to_string();
    load_from(&Disk, &path, &label, true)
}

/// Loads, resolves and checks a scenario given as TOML text, named `label`
/// in errors and reports; the paths it names (includes, traces) are
/// relative to the folder `dir`. Errors name the label, the line of the
/// text and the field, as [`load`]'s name the file.
///
/// ```
/// use std::path::Path;
/// let text = "name = \"x\"\nseed = \"one\"\n";
/// let e = pdsim::scenario::load_str(text, "<text>", Path::new(".")).unwrap_err();
/// assert_eq!((e.file(), e.line(), e.field()), ("<text>", Some(2), Some("seed")));
/// ```
///
/// # Errors
/// As [`load`].
pub fn load_str(text: &str, label: &str, dir: &Path) -> Result<Scenario, ScenarioError> {
    // A name no file has: the text's own place among the files, so that an
    // include of any real file is read from the disk.
    let root = normalize(&dir.join("\u{0}scenario text"));
    let text = text.strip_prefix(files::BOM).unwrap_or(text).to_owned();
    load_from(&Text { root: root.clone(), text }, &root, label, true)
}

/// The scenario `pdsim` runs with no arguments: `scenarios/default.toml`,
/// embedded in the binary with the files it includes.
///
/// # Errors
/// None in a released binary (a test loads it); an error would be a bug.
pub fn load_default() -> Result<Scenario, ScenarioError> {
    let files = Embedded(EMBEDDED.iter().map(|(p, t)| ((*p).to_owned(), (*t).to_owned())).collect());
    load_from(&files, Path::new(DEFAULT_SCENARIO), DEFAULT_SCENARIO_LABEL, true)
}

/// Path of the default scenario within the embedded files.
const DEFAULT_SCENARIO: &str = "scenarios/default.toml";
/// How the embedded default scenario names itself in errors and reports.
pub const DEFAULT_SCENARIO_LABEL: &str = "scenarios/default.toml (embedded)";

/// One file read while resolving includes.
struct SourceFile {
    label: String,
    path: PathBuf,
    dir: PathBuf,
    text: String,
    show_lines: bool,
}

impl SourceFile {
    fn line_of(&self, offset: usize) -> Option<usize> {
        if !self.show_lines {
            return None;
        }
        let end = offset.min(self.text.len());
        Some(self.text.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1)
    }

    fn error(&self, span: Option<Range<usize>>, field: Option<&str>, message: impl Into<String>) -> ScenarioError {
        let line = span.and_then(|s| self.line_of(s.start));
        ScenarioError::new(&self.label, line, field, message)
    }
}

/// [`load`] for a file that may hold one more top-level table, `key`,
/// read by another verb (`pdsim plan`'s `[plan]`): the scenario and that
/// table, deserialized (unknown fields refused) and then checked by
/// `check` against the scenario; every error is placed as a scenario
/// field's is (`file:line: plan.max_gpus: ...`; `check`'s
/// [`FieldError`] names the field by its whole path, e.g.
/// `plan.max_gpus` or `workload.arrival.kind`).
///
/// # Errors
/// As [`load`], and the table's own problems.
pub fn load_with_table<T: DeserializeOwned>(
    path: impl AsRef<Path>,
    key: &str,
    check: &dyn Fn(&T, &Scenario) -> Result<(), FieldError>,
) -> Result<(Scenario, Option<T>), ScenarioError> {
    let path = normalize(path.as_ref());
    let label = path.display().to_string();
    let mut out = None;
    let extra = Extra {
        key,
        read: &mut |ctx: &Ctx<'_>, scenario: &Scenario| {
            let value: Option<T> = ctx.get(key)?;
            if let Some(v) = &value {
                check(v, scenario).map_err(|e| ctx.field(e))?;
            }
            out = value;
            Ok(())
        },
    };
    let scenario = load_from_with(&Disk, &path, &label, true, Some(extra))?;
    Ok((scenario, out))
}

/// A top-level table besides the scenario's own, and what reads it.
struct Extra<'f> {
    key: &'f str,
    read: &'f mut dyn FnMut(&Ctx<'_>, &Scenario) -> Result<(), ScenarioError>,
}

fn load_from(files: &dyn Files, path: &Path, label: &str, show_lines: bool) -> Result<Scenario, ScenarioError> {
    load_from_with(files, path, label, show_lines, None)
}

/// [`load_from`], reading `extra` (another verb's table) as well.
fn load_from_with(
    files: &dyn Files,
    path: &Path,
    label: &str,
    show_lines: bool,
    extra: Option<Extra<'_>>,
) -> Result<Scenario, ScenarioError> {
    let mut sources = Vec::new();
    let mut stack = Vec::new();
    gather(files, path, label.to_owned(), show_lines, None, &mut stack, &mut sources)?;
    let docs: Vec<Spanned<DeTable<'_>>> = sources
        .iter()
        .map(|s| DeTable::parse(&s.text).map_err(|e| s.error(e.span(), None, e.message())))
        .collect::<Result<_, _>>()?;
    let ctx = Ctx::new(&sources, &docs, files, extra.as_ref().map(|e| e.key))?;
    let mut scenario = ctx.build()?;
    scenario.source = label.to_owned();
    scenario.dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    if files.on_disk() {
        let n = sources.len();
        // The file itself comes last, after its includes.
        for (i, s) in sources.iter().enumerate() {
            scenario.inputs.push((if i + 1 == n { "scenario" } else { "include" }, s.path.clone()));
        }
        for (_, p) in ctx.step_time_files.borrow().iter() {
            scenario.inputs.push(("step_time.file", p.clone()));
        }
        if let Some(p) = scenario.model_origin.as_deref().and_then(|o| o.strip_prefix("config ")) {
            scenario.inputs.push(("model.config", PathBuf::from(p)));
        }
    }
    if let Some(t) = &scenario.workload.trace {
        scenario.inputs.push(("workload.trace.path", t.path.clone()));
    }
    if let Some(extra) = extra {
        (extra.read)(&ctx, &scenario)?;
    }
    Ok(scenario)
}

/// Where an include was named: the including file, the span, and the field
/// (`include[1]`).
struct Site<'a> {
    file: &'a SourceFile,
    span: Range<usize>,
    field: String,
}

/// Reads `path` and, first, every file it includes (depth first), pushing
/// each onto `out` after its includes: later entries override earlier ones.
fn gather(
    files: &dyn Files,
    path: &Path,
    label: String,
    show_lines: bool,
    site: Option<Site<'_>>,
    stack: &mut Vec<(PathBuf, String)>,
    out: &mut Vec<SourceFile>,
) -> Result<(), ScenarioError> {
    let fail = |message: String| match &site {
        Some(s) => s.file.error(Some(s.span.clone()), Some(&s.field), message),
        None => ScenarioError::new(&label, None, None, message),
    };
    let id = files.identity(path);
    if stack.iter().any(|(p, _)| *p == id) {
        let chain: Vec<&str> = stack.iter().map(|(_, l)| l.as_str()).chain([label.as_str()]).collect();
        return Err(fail(format!("include cycle: {}", chain.join(" -> "))));
    }
    let text = files.read(path).map_err(|e| fail(format!("cannot read {label}: {e}")))?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let file = SourceFile { label: label.clone(), path: path.to_owned(), dir, text, show_lines };
    let includes = {
        let doc = DeTable::parse(&file.text).map_err(|e| file.error(e.span(), None, e.message()))?;
        include_list(&file, doc.get_ref())?
    };
    stack.push((id, label));
    for (i, (rel, span)) in includes.into_iter().enumerate() {
        let child = normalize(&file.dir.join(&rel));
        let child_label = child.display().to_string();
        let site = Site { file: &file, span, field: format!("include[{i}]") };
        gather(files, &child, child_label, show_lines, Some(site), stack, out)?;
    }
    stack.pop();
    out.push(file);
    Ok(())
}

/// The `include` paths of a document, with their spans.
fn include_list(file: &SourceFile, doc: &DeTable<'_>) -> Result<Vec<(String, Range<usize>)>, ScenarioError> {
    let Some(value) = doc.get("include") else { return Ok(Vec::new()) };
    let bad = |span| file.error(Some(span), Some("include"), "must be a path or an array of paths");
    match value.get_ref() {
        DeValue::String(s) => Ok(vec![(s.to_string(), value.span())]),
        DeValue::Array(items) => items
            .iter()
            .map(|item| match item.get_ref() {
                DeValue::String(s) => Ok((s.to_string(), item.span())),
                _ => Err(bad(item.span())),
            })
            .collect(),
        _ => Err(bad(value.span())),
    }
}

/// One top-level key after includes: the file it comes from and its value.
struct Entry<'a> {
    file: &'a SourceFile,
    key_span: Range<usize>,
    value: &'a Spanned<DeValue<'a>>,
}

/// The merged top-level keys of a scenario, with their origins.
struct Ctx<'a> {
    root: &'a SourceFile,
    entries: BTreeMap<&'a str, Entry<'a>>,
    /// Where `step_time = { file = … }` reads from.
    files: &'a dyn Files,
    /// The step-time files read, with the role that read each (for
    /// [`Scenario::inputs`], and to name the file in a refusal of its
    /// table).
    step_time_files: std::cell::RefCell<Vec<(String, PathBuf)>>,
}

impl<'a> Ctx<'a> {
    fn new(
        sources: &'a [SourceFile],
        docs: &'a [Spanned<DeTable<'a>>],
        files: &'a dyn Files,
        extra: Option<&str>,
    ) -> Result<Self, ScenarioError> {
        let mut entries = BTreeMap::new();
        for (file, doc) in sources.iter().zip(docs) {
            for (key, value) in doc.get_ref().iter() {
                let name: &str = key.get_ref();
                if !TOP_LEVEL_KEYS.contains(&name) && Some(name) != extra {
                    let hint = if name == "plan" { " (a [plan] table is read by `pdsim plan`)" } else { "" };
                    return Err(file.error(
                        Some(key.span()),
                        Some(name),
                        format!("unknown field `{name}`, expected one of {}{hint}", quoted(TOP_LEVEL_KEYS)),
                    ));
                }
                if name != "include" {
                    entries.insert(name, Entry { file, key_span: key.span(), value });
                }
            }
        }
        let root = sources.last().expect("gather pushes the root file last");
        Ok(Ctx { root, entries, files, step_time_files: std::cell::RefCell::new(Vec::new()) })
    }

    /// The role `key` (`prefill`, `decode`, `aggregated`), if present. A
    /// role's `step_time = { file = "…" }` is the `step_time` of that file
    /// (relative to the file that names it; what `pdsim calibrate --out`
    /// writes), so one calibrated table serves several roles and
    /// scenarios without copying it.
    fn role(&self, key: &str) -> Result<Option<RoleSpec>, ScenarioError> {
        let Some(entry) = self.entries.get(key) else { return Ok(None) };
        if let DeValue::Table(t) = entry.value.get_ref() {
            // vLLM's scheduler options pdsim does not model: refused with
            // the reason, not taken for a typo.
            for (name, _) in t.iter() {
                if let Some(o) = actors::options::unmodelled_scheduler_option(name.get_ref()) {
                    return Err(self.err(
                        &format!("{key}.{}", o.name),
                        format!(
                            "vLLM's `{}` is not modelled: {}. pdsim runs vLLM's default, {}; leave the field out",
                            o.name, o.why, o.default
                        ),
                    ));
                }
            }
        }
        let reference = match entry.value.get_ref() {
            DeValue::Table(t) => t.get("step_time").filter(|v| match v.get_ref() {
                DeValue::Table(st) => st.contains_key("file"),
                _ => false,
            }),
            _ => None,
        };
        let Some(reference) = reference else { return self.get(key) };
        let field = format!("{key}.step_time");
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct FileRef {
            file: String,
        }
        let r = FileRef::deserialize(ValueDeserializer::from(reference.clone())).map_err(|e| {
            let span = e.span().unwrap_or_else(|| reference.span());
            entry.file.error(
                Some(span),
                Some(&field),
                format!("{} (a step time from a file is {{ file = \"…\" }} alone)", e.message()),
            )
        })?;
        let path = normalize(&entry.file.dir.join(&r.file));
        let at_file = |m: String| self.err(&format!("{field}.file"), m);
        let text = self.files.read(&path).map_err(|e| at_file(format!("cannot read {}: {e}", path.display())))?;
        let doc: toml::Table =
            toml::from_str(&text).map_err(|e| at_file(format!("{}: {}", path.display(), e.message())))?;
        let extra: Vec<&str> = doc.keys().map(String::as_str).filter(|k| *k != "step_time").collect();
        let Some(value) = doc.get("step_time").filter(|_| extra.is_empty()) else {
            return Err(at_file(format!(
                "{} must hold one `step_time = {{ … }}` (what pdsim calibrate --out writes){}",
                path.display(),
                if extra.is_empty() { String::new() } else { format!(", not {}", extra.join(", ")) }
            )));
        };
        // The role as written, with the file's table in place of the
        // reference.
        let mut role = toml::Table::deserialize(ValueDeserializer::from(entry.value.clone()))
            .map_err(|e| entry.file.error(e.span(), Some(key), e.message()))?;
        role.insert("step_time".to_owned(), value.clone());
        self.step_time_files.borrow_mut().push((key.to_owned(), path.clone()));
        serde_path_to_error::deserialize(toml::Value::Table(role)).map(Some).map_err(|e| {
            let inner = e.path().to_string();
            let message = e.inner().message().to_owned();
            if inner == "step_time" || inner.starts_with("step_time.") {
                at_file(format!("{}: {inner}: {message}", path.display()))
            } else {
                self.err(&format!("{key}.{inner}"), message)
            }
        })
    }

    /// Deserializes the top-level `key`, if present, with errors placed at
    /// the field toml points to.
    fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, ScenarioError> {
        let Some(entry) = self.entries.get(key) else { return Ok(None) };
        let de = ValueDeserializer::from(entry.value.clone());
        T::deserialize(de).map(Some).map_err(|e| {
            let span = e.span().unwrap_or_else(|| entry.value.span());
            let mut path = key.to_owned();
            path_at(entry.value, span.start, &mut path);
            entry.file.error(Some(span), Some(&path), e.message())
        })
    }

    /// An error about the field at dotted `path`, placed at the deepest part
    /// of the path some file has.
    fn err(&self, path: &str, message: impl Into<String>) -> ScenarioError {
        self.err_near(path, path, message)
    }

    /// An error about field `field`, placed at the deepest part of `near`
    /// some file has.
    fn err_near(&self, near: &str, field: &str, message: impl Into<String>) -> ScenarioError {
        let segments = split_path(near);
        let Some((Seg::Key(top), rest)) = segments.split_first() else {
            return ScenarioError::new(&self.root.label, None, Some(field), message);
        };
        match self.entries.get(top.as_str()) {
            None => ScenarioError::new(&self.root.label, None, Some(field), message),
            Some(entry) => {
                let span = if rest.is_empty() { entry.key_span.clone() } else { span_of(entry.value, rest) };
                entry.file.error(Some(span), Some(field), message)
            }
        }
    }

    /// A refused field, placed at the field it names; a missing `[prefill]`
    /// or `[decode]` is placed at the other one, which the file has.
    fn field(&self, mut e: FieldError) -> ScenarioError {
        // A refused field of a table read from a step-time file: name it.
        let from_file = self.step_time_files.borrow().iter().find_map(|(role, path)| {
            let at = format!("{role}.step_time");
            (e.field == at || e.field.starts_with(&format!("{at}."))).then(|| path.clone())
        });
        if let Some(path) = from_file {
            e.problem = format!("{} (in {}, the step_time this role reads)", e.problem, path.display());
        }
        let partner = match e.field.as_str() {
            "prefill" => "decode",
            "decode" => "prefill",
            _ => return self.err(&e.field, e.problem),
        };
        if self.entries.contains_key(e.field.as_str()) {
            self.err(&e.field, e.problem)
        } else {
            self.err_near(partner, &e.field, e.problem)
        }
    }

    fn build(&self) -> Result<Scenario, ScenarioError> {
        let name: Option<String> = self.get("name")?;
        // `pdsim run` writes to out/<name>: one folder inside out/.
        if let Some(n) = &name {
            crate::output::plain_component(n).map_err(|e| {
                self.err(
                    "name",
                    format!("{e}; it names the output folder out/<name>, so it must be one plain folder name"),
                )
            })?;
        }
        let description: Option<String> = self.get("description")?;
        let seed: u64 = self.get("seed")?.unwrap_or(1);
        let deployment = self.deployment()?;
        let (model, model_origin, model_source) = match self.model(&deployment)? {
            Some((m, origin, source)) => (Some(m), origin, source),
            None => (None, None, None),
        };
        let workload: Option<WorkloadSpec> = self.get("workload")?;
        let slo: SloSpec = self.get("slo")?.unwrap_or_default();

        let model = model.ok_or_else(|| {
            self.err("model", "missing table [model] (kv_bytes_per_token, or [[model.cache_groups]])")
        })?;
        let mut workload = workload.ok_or_else(|| self.err("workload", "missing table [workload]"))?;

        // Every check of the deployment and its model is actors'; this only
        // places the error in the file.
        let built = Deployment::build(&model, &deployment).map_err(|e| match e {
            ConfigError::Field(f) => self.field(f),
            ConfigError::Gate(g) => self.gate(&deployment, &g),
        })?;
        let (validated, front_end) = (built.model().clone(), built.front_end());
        validate::slo(&slo).map_err(|e| self.field(e.under("slo")))?;
        workload.check().map_err(|e| self.field(e.under("workload")))?;

        // Resolve the trace path against the file that named it, and check
        // that the file opens and its header is right.
        if let Some(trace) = &mut workload.trace {
            let entry = &self.entries["workload"];
            trace.path = normalize(&entry.file.dir.join(&trace.path));
            TraceReader::open(trace, true).map_err(|e| self.err("workload.trace.path", e.0))?;
        }

        Ok(Scenario {
            name,
            description,
            seed,
            deployment,
            model,
            workload,
            slo,
            source: String::new(),
            model_origin,
            model_source,
            validated,
            front_end,
            inputs: Vec::new(),
            dir: PathBuf::new(),
        })
    }

    /// The deployment keys through [`DeploymentSpec`]'s own deserializer
    /// (its defaults), each key from the file that has it.
    fn deployment(&self) -> Result<DeploymentSpec, ScenarioError> {
        let mut spec: DeploymentSpec = DeploymentSpec::deserialize_default();
        for key in DEPLOYMENT_KEYS {
            match *key {
                "vllm_version" => spec.vllm_version = self.get("vllm_version")?,
                "prefill" => spec.prefill = self.role("prefill")?,
                "decode" => spec.decode = self.role("decode")?,
                "aggregated" => spec.aggregated = self.role("aggregated")?,
                "link" => spec.link = self.get("link")?.unwrap_or(spec.link),
                "router" => spec.router = self.get("router")?.unwrap_or(spec.router),
                "faults" => spec.faults = self.get("faults")?.unwrap_or(spec.faults),
                "frontend" => spec.frontend = self.get("frontend")?.unwrap_or(spec.frontend),
                "timeline_interval_ms" => {
                    spec.timeline_interval_ms = self.get("timeline_interval_ms")?.unwrap_or(spec.timeline_interval_ms)
                }
                "check_invariants" => {
                    spec.check_invariants = self.get("check_invariants")?.unwrap_or(spec.check_invariants)
                }
                "hardware" => spec.hardware = self.hardware()?,
                _ => unreachable!("DEPLOYMENT_KEYS lists only the keys above"),
            }
        }
        Ok(spec)
    }

    /// `[model]`: given whole, or derived from a HuggingFace `config.json`
    /// (a preset's, or a file's) at the first role's TP size.
    #[allow(clippy::type_complexity)]
    fn model(
        &self,
        deployment: &DeploymentSpec,
    ) -> Result<Option<(ModelSpec, Option<String>, Option<toml::Table>)>, ScenarioError> {
        let Some(entry) = self.entries.get("model") else { return Ok(None) };
        let derived = match entry.value.get_ref() {
            DeValue::Table(t) => t.iter().any(|(k, _)| matches!(k.get_ref().as_ref(), "preset" | "config")),
            _ => false,
        };
        if !derived {
            return Ok(self.get("model")?.map(|m| (m, None, None)));
        }
        let src: ModelSource = self.get("model")?.expect("the entry is present");
        let (field, label, text) = match (&src.preset, &src.config) {
            (Some(_), Some(_)) => return Err(self.err("model.config", "give `preset` or `config`, not both")),
            (Some(id), None) => {
                let text = presets::model_config(id).ok_or_else(|| {
                    let known = presets::model_ids().join(", ");
                    self.err("model.preset", format!("unknown model preset {id:?} (known: {known})"))
                })?;
                ("model.preset", id.clone(), text.to_owned())
            }
            (None, Some(path)) => {
                let p = normalize(&entry.file.dir.join(path));
                let text = files::read_text(&p, MAX_CONFIG_BYTES).map_err(|e| self.err("model.config", e))?;
                ("model.config", p.display().to_string(), text)
            }
            (None, None) => unreachable!("derived means one of the two keys"),
        };
        let arch = hf::from_config_json(&text)
            .map_err(|e| self.err(field, format!("{label}: `{}`: {}", e.field, e.problem)))?;
        let kv_bits = match src.kv_cache_dtype.as_deref() {
            None | Some("auto" | "bf16" | "bfloat16" | "fp16" | "float16" | "half") => 16,
            Some("fp8" | "fp8_e4m3" | "fp8_e5m2") => 8,
            Some(other) => {
                return Err(self.err(
                    "model.kv_cache_dtype",
                    format!("unknown cache dtype {other:?} (auto, bf16, fp16, fp8, fp8_e4m3, fp8_e5m2)"),
                ));
            }
        };
        // The TP sizes are checked here, before the model is laid out at
        // them (the role checks that place this come later).
        for (role, r) in
            [("prefill", &deployment.prefill), ("decode", &deployment.decode), ("aggregated", &deployment.aggregated)]
        {
            if r.as_ref().and_then(|r| r.tp) == Some(0) {
                return Err(self.err(&format!("{role}.tp"), "must be >= 1, got 0".to_owned()));
            }
        }
        let first = deployment.prefill.as_ref().or(deployment.aggregated.as_ref());
        let tp = first.and_then(|r| r.tp).unwrap_or(1);
        let name = src.name.clone().or(src.preset.clone()).unwrap_or_else(|| label.clone());
        let spec = arch
            .model_spec(&name, tp, kv_bits, None)
            .map_err(|e| self.err(field, format!("{label} at tp {tp}: `{}`: {}", e.field, e.problem)))?;
        // A role at another TP size takes its bytes from `tp` and the
        // groups' heads (actors' tp.rs); vLLM lays a model out anew at each
        // TP size (a Mamba hybrid's block size depends on it). Refuse where
        // the two differ rather than run a layout vLLM would not build.
        for (role, r) in [("prefill", &deployment.prefill), ("decode", &deployment.decode)] {
            let Some(other) = r.as_ref().and_then(|r| r.tp).filter(|&t| t != tp) else { continue };
            let laid_out = arch.model_spec(&name, other, kv_bits, None).ok();
            let scaled = spec.at_tp(other).ok();
            let same = match (&laid_out, &scaled) {
                (Some(a), Some(b)) => a.cache_groups == b.cache_groups && a.kv_bytes_per_token == b.kv_bytes_per_token,
                _ => false,
            };
            if !same {
                return Err(self.err(
                    &format!("{role}.tp"),
                    format!(
                        "{label} at tp {other} is laid out differently from tp {tp} (vLLM derives its block \
                         sizes and pages at each TP size); pdsim runs one layout: give both roles tp {tp}, or \
                         give the model's cache groups"
                    ),
                ));
            }
        }
        let origin = if src.preset.is_some() { format!("preset {label}") } else { format!("config {label}") };
        let mut source = toml::Table::new();
        match &src.preset {
            Some(id) => source.insert("preset".to_owned(), toml::Value::String(id.clone())),
            None => source.insert("config".to_owned(), toml::Value::String(label.clone())),
        };
        if let Some(n) = &src.name {
            source.insert("name".to_owned(), toml::Value::String(n.clone()));
        }
        if let Some(d) = &src.kv_cache_dtype {
            source.insert("kv_cache_dtype".to_owned(), toml::Value::String(d.clone()));
        }
        Ok(Some((spec, Some(origin), Some(source))))
    }

    /// `[hardware]`, a preset's numbers filled in under the ones given.
    fn hardware(&self) -> Result<Option<HardwareSpec>, ScenarioError> {
        let Some(mut spec) = self.get::<HardwareSpec>("hardware")? else { return Ok(None) };
        if let Some(id) = &spec.gpu {
            let preset = presets::gpu(id).ok_or_else(|| {
                let known = presets::gpu_ids().join(", ");
                self.err("hardware.gpu", format!("unknown GPU preset {id:?} (known: {known})"))
            })?;
            spec.fill_from(&preset);
        }
        Ok(Some(spec))
    }

    /// A gate error of actors, placed at the field it names.
    fn gate(&self, d: &DeploymentSpec, e: &GateError) -> ScenarioError {
        let field = e.field();
        let role = e.role.as_str();
        let (path, message) = if field == "vllm_version" {
            let role_has = match e.role {
                Role::Prefill => d.prefill.as_ref(),
                Role::Decode => d.decode.as_ref(),
                Role::Aggregated => d.aggregated.as_ref(),
            }
            .is_some_and(|r| r.vllm_version.is_some());
            let path = if role_has || d.vllm_version.is_none() { format!("{role}.vllm_version") } else { field.into() };
            (path, format!("{role} rank: {}", e.problem))
        } else {
            match &e.location {
                Location::Model => (format!("model.{field}"), format!("{role} rank: {}", e.problem)),
                Location::Group { index, name } => (
                    format!("model.cache_groups[{index}].{field}"),
                    format!("{role} rank, group {name:?}: {}", e.problem),
                ),
            }
        };
        self.err(&path, message)
    }
}

/// `[model]` when it names a `config.json` (a preset's or a file's)
/// instead of giving the model.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelSource {
    /// A preset's id (`presets/models/<id>.json`).
    preset: Option<String>,
    /// A HuggingFace `config.json`, relative to this file.
    config: Option<String>,
    /// A display name (default: the preset's id, or the file).
    name: Option<String>,
    /// vLLM's `--kv-cache-dtype`: `auto` (default: the model's 16-bit
    /// dtype), `bf16`, `fp16`, `fp8`.
    kv_cache_dtype: Option<String>,
}

/// The most bytes of a `config.json` read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Deserializing a [`DeploymentSpec`] from an empty table gives actors'
/// defaults for every optional field.
trait DeserializeDefault {
    fn deserialize_default() -> Self;
}

impl DeserializeDefault for DeploymentSpec {
    fn deserialize_default() -> Self {
        toml::from_str("").expect("every DeploymentSpec field has a default")
    }
}

fn quoted(keys: &[&str]) -> String {
    keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
}
