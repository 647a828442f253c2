//! The pdsim harness: scenario files, workloads and traces, and the pieces
//! the `pdsim` command line is built from.
//!
//! - [`scenario`]: the TOML scenario format, includes, and [`scenario::load`],
//!   which checks everything and reports the first problem as one line
//!   naming the file, line and field.
//! - [`workload`]: the `[workload]` table and the request streams it makes
//!   (synthetic arrivals and lengths, shared-prefix groups).
//! - [`trace`]: Mooncake, Azure and BurstGPT traces, streamed row by row.
//! - [`runner`]: one seeded simulation of a scenario, and many at once on
//!   worker threads with their results in a fixed order.
//! - [`report`]: the files of `pdsim run` (`report.json`, `requests.csv`,
//!   `timeline.csv`, `trace.json`).
//! - [`html`]: `report.html`, the page of tables and inline-SVG charts
//!   made from a run folder's or a sweep folder's files.
//! - [`plan`]: `pdsim plan`: the candidate deployments within a GPU
//!   budget, their analytic bounds and trials, the cheapest that meets
//!   the SLOs, and what the verb writes.
//! - [`sweep`]: sweep files (a base scenario, axes, seeds) and their points.
//! - [`calibrate`]: measured steps from CSV files, the step-time models
//!   fitted to them and their error point by point; the batch of a step of
//!   given counts (`pdsim steptime`, `pdsim calibrate`).
//! - [`transfer`], [`steptime`], [`validate`]: `pdsim transfer`,
//!   `pdsim steptime` and `pdsim validate` as functions.
//! - [`columns`]: `requests.csv` and `timeline.csv` as typed columns, for
//!   data frames.
//! - [`output`]: writing output files: a partial file renamed into place,
//!   never through a link, never over anything but a regular file.
//! - [`vllm_result`]: `vllm-bench.json`, a run as `vllm bench serve
//!   --save-result` writes it.
//! - [`accuracy`]: real vLLM runs (`validation/`) replayed with presets and
//!   defaults, predicted against measured (`pdsim accuracy`).
//! - [`serve`]: `pdsim serve`: the OpenAI-compatible endpoint over a live
//!   simulation (HTTP on tokio and axum, the driver thread, `/metrics`).
//! - [`files`]: bounded reads of input files (regular files only, size caps,
//!   byte-order marks dropped).
//!
//! ```
//! let scenario = pdsim::scenario::load_default().unwrap();
//! let source = scenario.workload().source(scenario.seed(), None).unwrap();
//! # let _ = source;
//! ```
#![warn(missing_docs)]

pub mod accuracy;
pub mod calibrate;
pub mod check;
pub mod columns;
pub mod files;
pub mod heap;
pub mod html;
pub mod output;
pub mod plan;
pub mod presets;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod serve;
pub mod steptime;
pub mod sweep;
pub mod trace;
pub mod transfer;
pub mod validate;
pub mod vllm_result;
pub mod workload;
