//! `pdsim._core`: the pdsim library behind the Python package `pdsim`.
//!
//! Every function here is a thin call into the root `pdsim` crate (the
//! harness library the command line is built from) and `actors`: nothing
//! is computed here that the command line computes differently. The
//! Python side (`python/pdsim/`) turns what these return into dicts and
//! pandas data frames. Each simulation runs with the GIL released
//! (`Python::detach`), so other Python threads go on meanwhile and several
//! threads may simulate at once; calls share no state.
//!
//! A scenario reaches these functions as `(kind, source, overrides)`:
//! `kind` is `"path"` (a file), `"toml"` (the text of one) or `"json"` (a
//! dict, as JSON text), `overrides` the JSON text of an object of dotted
//! paths to values (as sweeps name them), or `None`. Bad input raises
//! `pdsim.ScenarioError` (with the file, line and field) or
//! `pdsim.PdsimError`; a bug in pdsim raises `pdsim.InternalError`.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use actors::model::Role;
use pdsim::calibrate::StepCounts;
use pdsim::columns::{Table, Values};
use pdsim::runner::{Keep, Run, RunError, default_jobs, ordered_parallel, simulate_with};
use pdsim::scenario::{self, Scenario, ScenarioError};
use pdsim::steptime::StepTimeError;
use pdsim::sweep::{Sweep, axis_cells, metrics_cells, row, run_point};
use pdsim::validate::ValidateError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

/// What goes wrong, before it becomes a Python exception (built where the
/// GIL is held).
enum Failure {
    /// A scenario refused, with its place.
    Scenario(ScenarioError),
    /// Other bad input: one line, naming the file, line and field where
    /// there are some.
    BadInput(String),
    /// A bug in pdsim.
    Internal(String),
}

impl From<ScenarioError> for Failure {
    fn from(e: ScenarioError) -> Self {
        Failure::Scenario(e)
    }
}

impl From<RunError> for Failure {
    fn from(e: RunError) -> Self {
        match e {
            RunError::BadInput(m) => Failure::BadInput(m),
            RunError::Internal(m) => Failure::Internal(m),
        }
    }
}

impl Failure {
    /// The Python exception: an instance of a class of `pdsim._errors`.
    fn into_py(self, py: Python<'_>) -> PyErr {
        let errors = match py.import("pdsim._errors") {
            Ok(m) => m,
            Err(e) => return e,
        };
        let made = match self {
            Failure::Scenario(e) => errors.getattr("ScenarioError").and_then(|c| {
                let place = (e.file().to_owned(), e.line(), e.field().map(str::to_owned));
                c.call1((e.to_string(), place.0, place.1, place.2, e.message().to_owned()))
            }),
            Failure::BadInput(m) => errors.getattr("_bad_input").and_then(|f| f.call1((m,))),
            Failure::Internal(m) => errors.getattr("InternalError").and_then(|c| c.call1((m,))),
        };
        match made {
            Ok(value) => PyErr::from_value(value),
            Err(e) => e,
        }
    }
}

type Outcome<T> = Result<T, Failure>;

/// Converts a failure under the GIL.
fn raise<T>(py: Python<'_>, r: Outcome<T>) -> PyResult<T> {
    r.map_err(|f| f.into_py(py))
}

/// A scenario as Python hands it over.
#[derive(Clone)]
struct Source {
    kind: String,
    source: String,
    overrides: Option<String>,
    /// The folder relative paths in a text or dict scenario start from.
    dir: PathBuf,
}

/// JSON text (a dict from Python) as a TOML value. TOML has no null: a
/// key whose value is `None` is left out, as absent (what
/// `pdsim.validate` returns for an unset field loads back); a `None` in a
/// list is an error.
fn toml_of_json(what: &str, text: &str) -> Result<toml::Value, String> {
    fn drop_nulls(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.retain(|_, x| !x.is_null());
                m.values_mut().for_each(drop_nulls);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(drop_nulls),
            _ => {}
        }
    }
    let mut json: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("{what}: not JSON: {e}"))?;
    drop_nulls(&mut json);
    toml::Value::try_from(&json).map_err(|e| format!("{what}: has no TOML form (a None in a list?): {e}"))
}

impl Source {
    /// Loads and checks the scenario, overrides applied.
    fn load(&self) -> Outcome<Scenario> {
        let scenario = match self.kind.as_str() {
            "path" => scenario::load(&self.source)?,
            "toml" => scenario::load_str(&self.source, "<string>", &self.dir)?,
            "json" => {
                let value = toml_of_json("the scenario dict", &self.source).map_err(Failure::BadInput)?;
                let text = toml::to_string(&value)
                    .map_err(|e| Failure::BadInput(format!("the scenario dict: has no TOML form: {e}")))?;
                scenario::load_str(&text, "<dict>", &self.dir)?
            }
            other => return Err(Failure::Internal(format!("unknown scenario kind {other:?}"))),
        };
        let Some(overrides) = &self.overrides else { return Ok(scenario) };
        let toml::Value::Table(table) = toml_of_json("overrides", overrides).map_err(Failure::BadInput)? else {
            return Err(Failure::BadInput("overrides: must be a dict of dotted paths to values".into()));
        };
        if table.is_empty() {
            return Ok(scenario);
        }
        let pairs: Vec<(&str, toml::Value)> = table.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        Ok(scenario.with_overrides(&pairs)?)
    }
}

/// A finished run, held in Rust until Python asks for its parts.
#[pyclass(frozen, module = "pdsim._core")]
struct RunOutput {
    run: Run,
    /// report.json's text.
    report: String,
    disaggregated: bool,
}

/// A table as Python builds a data frame from it: per column `(name,
/// kind, data, categories)`, `kind` one of `"int64"`, `"float64"` (the
/// values' native-endian bytes) or `"category"` (int32 codes, `-1` for an
/// empty cell, and the list of categories).
fn table_to_py<'py>(py: Python<'py>, table: &Table) -> PyResult<Bound<'py, PyList>> {
    let items = PyList::empty(py);
    for (name, values) in &table.columns {
        let item = match values {
            Values::Int(v) => {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
                PyTuple::new(
                    py,
                    [
                        name.into_pyobject(py)?.into_any(),
                        "int64".into_pyobject(py)?.into_any(),
                        PyBytes::new(py, &bytes).into_any(),
                        py.None().into_bound(py),
                    ],
                )?
            }
            Values::Float(v) => {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
                PyTuple::new(
                    py,
                    [
                        name.into_pyobject(py)?.into_any(),
                        "float64".into_pyobject(py)?.into_any(),
                        PyBytes::new(py, &bytes).into_any(),
                        py.None().into_bound(py),
                    ],
                )?
            }
            Values::Category { codes, categories } => {
                let bytes: Vec<u8> = codes.iter().flat_map(|x| x.to_ne_bytes()).collect();
                PyTuple::new(
                    py,
                    [
                        name.into_pyobject(py)?.into_any(),
                        "category".into_pyobject(py)?.into_any(),
                        PyBytes::new(py, &bytes).into_any(),
                        PyList::new(py, categories)?.into_any(),
                    ],
                )?
            }
        };
        items.append(item)?;
    }
    Ok(items)
}

#[pymethods]
impl RunOutput {
    /// report.json's text: what `pdsim run` writes for the same scenario,
    /// seed and request count.
    fn report_json(&self) -> &str {
        &self.report
    }

    /// requests.csv as columns (see `table_to_py`).
    fn requests<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let table = py.detach(|| pdsim::columns::requests(&self.run.output.records, self.disaggregated));
        table_to_py(py, &table)
    }

    /// timeline.csv as columns (empty when the run kept no timeline).
    fn timeline<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let table = py.detach(|| pdsim::columns::timeline(&self.run.output.ranks, &self.run.output.links));
        table_to_py(py, &table)
    }

    /// Wall-clock seconds of the simulation (never in a report).
    #[getter]
    fn wall_s(&self) -> f64 {
        self.run.wall.as_secs_f64()
    }
}

/// The label report.json names a scenario by.
fn label(src: &Source) -> String {
    match src.kind.as_str() {
        "path" => src.source.clone(),
        "toml" => "<string>".into(),
        _ => "<dict>".into(),
    }
}

/// Simulates a scenario as `pdsim run` does (its own seed unless `seed`,
/// its request count unless `requests`), keeping every request's record
/// and, with `timeline`, every timeline row.
#[pyfunction]
#[pyo3(signature = (kind, source, overrides, dir, seed, requests, timeline, percentiles))]
#[allow(clippy::too_many_arguments)]
fn run(
    py: Python<'_>,
    kind: String,
    source: String,
    overrides: Option<String>,
    dir: PathBuf,
    seed: Option<u64>,
    requests: Option<u64>,
    timeline: bool,
    percentiles: Option<Vec<f64>>,
) -> PyResult<RunOutput> {
    let src = Source { kind, source, overrides, dir };
    let out = py.detach(move || -> Outcome<RunOutput> {
        let mut scenario = src.load()?;
        if let Some(seed) = seed {
            scenario.set_seed(seed);
        }
        let percentiles = percentiles.unwrap_or_else(|| actors::bench::DEFAULT_PERCENTILES.to_vec());
        actors::bench::check_percentiles(&percentiles).map_err(|e| Failure::BadInput(format!("percentiles: {e}")))?;
        let keep = Keep { timelines: timeline, record_sink: None, sample_sink: None, percentiles, sketch_above: None };
        let run = simulate_with(&scenario, scenario.seed(), requests, |_| {}, &AtomicBool::new(false), keep)?;
        if !run.output.violations.is_empty() {
            return Err(Failure::Internal(format!(
                "seed {}: the simulation broke {} conservation check(s): {} (this is a bug in pdsim)",
                run.seed,
                run.output.violations.len(),
                run.output.violations.join("; ")
            )));
        }
        let name = label(&src);
        let rep = pdsim::report::report(&scenario, &name, &run);
        let mut bytes = Vec::new();
        pdsim::report::write_report(&mut bytes, &rep)
            .map_err(|e| Failure::Internal(format!("cannot format report.json: {e}")))?;
        let report = String::from_utf8(bytes).map_err(|e| Failure::Internal(e.to_string()))?;
        let disaggregated = scenario.deployment().prefill.is_some();
        Ok(RunOutput { run, report, disaggregated })
    });
    raise(py, out)
}

/// The load and simulation alone, timed in Rust: what `pdsim.run` wraps,
/// for `benches/python_overhead.py`. Returns the wall-clock seconds.
#[pyfunction]
#[pyo3(signature = (path, seed, requests))]
fn _library_call_seconds(py: Python<'_>, path: String, seed: Option<u64>, requests: Option<u64>) -> PyResult<f64> {
    let out = py.detach(move || -> Outcome<f64> {
        let start = std::time::Instant::now();
        let mut scenario = scenario::load(&path)?;
        if let Some(seed) = seed {
            scenario.set_seed(seed);
        }
        let run =
            simulate_with(&scenario, scenario.seed(), requests, |_| {}, &AtomicBool::new(false), Keep::default())?;
        std::hint::black_box(&run);
        Ok(start.elapsed().as_secs_f64())
    });
    raise(py, out)
}

/// Checks a scenario as `pdsim validate` does; returns the resolved
/// scenario as JSON (what `validate --json` prints) and the notes of what
/// was checked.
#[pyfunction]
#[pyo3(signature = (kind, source, overrides, dir))]
fn validate(
    py: Python<'_>,
    kind: String,
    source: String,
    overrides: Option<String>,
    dir: PathBuf,
) -> PyResult<(String, Vec<String>)> {
    let src = Source { kind, source, overrides, dir };
    let out = py.detach(move || -> Outcome<(String, Vec<String>)> {
        let scenario = src.load()?;
        let notes = pdsim::validate::check(&scenario).map_err(|e| match e {
            ValidateError::BadInput(m) => Failure::BadInput(m),
            ValidateError::Internal(m) => Failure::Internal(m),
        })?;
        let json = serde_json::to_string(&scenario)
            .map_err(|e| Failure::Internal(format!("cannot serialize the scenario: {e}")))?;
        Ok((json, notes))
    });
    raise(py, out)
}

/// Prices one handoff as `pdsim transfer --json` does; returns its JSON.
#[pyfunction]
#[pyo3(signature = (kind, source, overrides, dir, prompt_tokens, decode_cached_tokens, bandwidth_gb_s))]
#[allow(clippy::too_many_arguments)]
fn transfer(
    py: Python<'_>,
    kind: String,
    source: String,
    overrides: Option<String>,
    dir: PathBuf,
    prompt_tokens: u64,
    decode_cached_tokens: u64,
    bandwidth_gb_s: Option<f64>,
) -> PyResult<String> {
    let src = Source { kind, source, overrides, dir };
    let out = py.detach(move || -> Outcome<String> {
        let scenario = src.load()?;
        let (t, _) = pdsim::transfer::price(&scenario, prompt_tokens, decode_cached_tokens, bandwidth_gb_s)
            .map_err(|e| Failure::BadInput(e.to_string()))?;
        serde_json::to_string(&t).map_err(|e| Failure::Internal(e.to_string()))
    });
    raise(py, out)
}

/// A step priced: the role, the step in µs, the model's terms and the
/// rounding up to a whole nanosecond.
type Priced = (String, f64, Vec<(String, f64)>, f64);

/// Prices one step as `pdsim steptime --json` does; returns the role, the
/// step in µs, the terms and the rounding.
#[pyfunction]
#[pyo3(signature = (kind, source, overrides, dir, role, prefill_tokens, prefill_seqs, prefill_cached, decode_seqs, context_tokens))]
#[allow(clippy::too_many_arguments)]
fn steptime(
    py: Python<'_>,
    kind: String,
    source: String,
    overrides: Option<String>,
    dir: PathBuf,
    role: Option<String>,
    prefill_tokens: u64,
    prefill_seqs: Option<u64>,
    prefill_cached: Option<u64>,
    decode_seqs: u64,
    context_tokens: u64,
) -> PyResult<Priced> {
    let src = Source { kind, source, overrides, dir };
    let out = py.detach(move || -> Outcome<Priced> {
        let role = match role.as_deref() {
            None => None,
            Some("prefill") => Some(Role::Prefill),
            Some("decode") => Some(Role::Decode),
            Some("aggregated") => Some(Role::Aggregated),
            Some(other) => {
                return Err(Failure::BadInput(format!(
                    "role: expected \"prefill\", \"decode\" or \"aggregated\", got {other:?}"
                )));
            }
        };
        let scenario = src.load()?;
        let counts = StepCounts { prefill_tokens, prefill_seqs, prefill_cached, decode_seqs, context_tokens };
        let p = pdsim::steptime::price(&scenario, role, &counts).map_err(|e| match e {
            StepTimeError::Arg(a) => Failure::BadInput(a.to_string()),
            StepTimeError::Scenario(m) => Failure::BadInput(m),
            StepTimeError::Internal(m) => Failure::Internal(m),
        })?;
        let terms = p.terms.iter().map(|&(n, us)| (n.to_owned(), us)).collect();
        Ok((p.role.as_str().to_owned(), p.step_us, terms, p.rounding_us()))
    });
    raise(py, out)
}

/// A sweep given as a file or as text.
fn load_sweep(kind: &str, source: &str, dir: &Path) -> Outcome<Sweep> {
    let sweep = match kind {
        "path" => Sweep::load(source),
        "toml" => Sweep::load_str(source, "<string>", dir),
        "json" => {
            let value = toml_of_json("the sweep dict", source).map_err(Failure::BadInput)?;
            let text = toml::to_string(&value)
                .map_err(|e| Failure::BadInput(format!("the sweep dict: has no TOML form: {e}")))?;
            Sweep::load_str(&text, "<dict>", dir)
        }
        other => return Err(Failure::Internal(format!("unknown sweep kind {other:?}"))),
    };
    sweep.map_err(|e| Failure::BadInput(e.0))
}

/// A sweep's points, checked, with the request count they run.
struct Plan {
    sweep: Sweep,
    points: Vec<pdsim::sweep::Point>,
    requests: Option<u64>,
    percentiles: Vec<f64>,
}

fn plan(kind: &str, source: &str, dir: &Path, requests: Option<u64>, percentiles: Option<Vec<f64>>) -> Outcome<Plan> {
    let sweep = load_sweep(kind, source, dir)?;
    let percentiles = percentiles.unwrap_or_else(|| actors::bench::DEFAULT_PERCENTILES.to_vec());
    actors::bench::check_percentiles(&percentiles).map_err(|e| Failure::BadInput(format!("percentiles: {e}")))?;
    let points = sweep.points().map_err(|e| Failure::BadInput(e.0))?;
    let requests = requests.or(sweep.requests);
    let from = if requests == sweep.requests { "the sweep's requests" } else { "requests" };
    for p in &points {
        p.scenario
            .workload()
            .check_arrival_span(requests, from)
            .map_err(|e| Failure::BadInput(format!("{}: point {}: {e}", sweep.file, p.index)))?;
    }
    Ok(Plan { sweep, points, requests, percentiles })
}

/// One point's metric cells ([`pdsim::sweep::metric_header`]'s columns).
/// `place` names the point in an error (`sweep.toml: point 3`).
fn point_cells(
    place: &str,
    scenario: &Scenario,
    seed: u64,
    requests: Option<u64>,
    percentiles: &[f64],
) -> Outcome<String> {
    let run = run_point(scenario, seed, requests, percentiles, &AtomicBool::new(false))?;
    if !run.output.violations.is_empty() {
        return Err(Failure::Internal(format!(
            "{place}: the simulation broke conservation checks: {} (this is a bug in pdsim)",
            run.output.violations.join("; ")
        )));
    }
    // The label appears in no metric cell.
    Ok(metrics_cells(&pdsim::report::report(scenario, "", &run)))
}

/// Runs every point of a sweep on `jobs` threads (default: the available
/// parallelism) and returns sweep.csv's text, rows in point order: the
/// bytes `pdsim sweep` writes.
#[pyfunction]
#[pyo3(signature = (kind, source, dir, requests, percentiles, jobs))]
fn sweep(
    py: Python<'_>,
    kind: String,
    source: String,
    dir: PathBuf,
    requests: Option<u64>,
    percentiles: Option<Vec<f64>>,
    jobs: Option<usize>,
) -> PyResult<String> {
    let out = py.detach(move || -> Outcome<String> {
        let plan = plan(&kind, &source, &dir, requests, percentiles)?;
        let mut text = plan.sweep.header(&plan.percentiles);
        text.push('\n');
        let points = &plan.points;
        ordered_parallel(
            points.len(),
            jobs.unwrap_or_else(default_jobs),
            |i| {
                let p = &points[i];
                let place = format!("{}: point {}", plan.sweep.file, p.index);
                let cells = point_cells(&place, &p.scenario, p.seed, plan.requests, &plan.percentiles)?;
                Ok::<_, Failure>(row(p.index, &axis_cells(&p.values), p.seed, &cells))
            },
            |_, line: String| {
                text.push_str(&line);
                text.push('\n');
                Ok(())
            },
        )?;
        Ok(text)
    });
    raise(py, out)
}

/// A sweep cut into tasks for an executor: sweep.csv's header, and per
/// point the start of its row (index, axis cells, seed) and what
/// [`sweep_point`] needs: the point's resolved scenario as TOML (includes
/// and presets resolved, so a worker needs no scenario file), the seed,
/// the request count and the percentiles.
#[pyfunction]
#[pyo3(signature = (kind, source, dir, requests, percentiles))]
#[allow(clippy::type_complexity)]
fn sweep_tasks(
    py: Python<'_>,
    kind: String,
    source: String,
    dir: PathBuf,
    requests: Option<u64>,
    percentiles: Option<Vec<f64>>,
) -> PyResult<(String, Vec<(String, String, String, u64, Option<u64>, Vec<f64>)>)> {
    let out = py.detach(move || -> Outcome<_> {
        let plan = plan(&kind, &source, &dir, requests, percentiles)?;
        let mut tasks = Vec::with_capacity(plan.points.len());
        for p in &plan.points {
            let toml = p.scenario.to_toml().map_err(|e| {
                Failure::BadInput(format!("{}: point {}: the scenario has no TOML form: {e}", plan.sweep.file, p.index))
            })?;
            let lead = format!("{},{}{},", p.index, axis_cells(&p.values), p.seed);
            let name = format!("{}: point {}", plan.sweep.file, p.index);
            tasks.push((lead, name, toml, p.seed, plan.requests, plan.percentiles.clone()));
        }
        Ok((plan.sweep.header(&plan.percentiles), tasks))
    });
    raise(py, out)
}

/// Runs one point of [`sweep_tasks`]: its metric cells.
#[pyfunction]
#[pyo3(signature = (name, toml, seed, requests, percentiles))]
fn sweep_point(
    py: Python<'_>,
    name: String,
    toml: String,
    seed: u64,
    requests: Option<u64>,
    percentiles: Vec<f64>,
) -> PyResult<String> {
    let out = py.detach(move || -> Outcome<String> {
        let scenario = scenario::load_str(&toml, &name, Path::new(""))?;
        point_cells(&name, &scenario, seed, requests, &percentiles)
    });
    raise(py, out)
}

/// The native half of the `pdsim` package.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", pdsim::report::PDSIM_VERSION)?;
    m.add_class::<RunOutput>()?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(_library_call_seconds, m)?)?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_function(wrap_pyfunction!(transfer, m)?)?;
    m.add_function(wrap_pyfunction!(steptime, m)?)?;
    m.add_function(wrap_pyfunction!(sweep, m)?)?;
    m.add_function(wrap_pyfunction!(sweep_tasks, m)?)?;
    m.add_function(wrap_pyfunction!(sweep_point, m)?)?;
    Ok(())
}
