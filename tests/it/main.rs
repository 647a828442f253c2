//! Integration tests of the pdsim harness, in one test binary so that the
//! suite links once: scenario files, workloads, trace readers, and the
//! `validate`, `transfer`, `run`, `sweep`, `plan` and `report` verbs run as a user
//! runs them, and the report's page in a headless browser.

mod accuracy;
mod browser;
mod cli_calibrate;
mod cli_plan;
mod cli_report;
mod cli_run;
mod cli_steps;
mod cli_steptime;
mod cli_sweep;
mod cli_transfer;
mod cli_validate;
mod columns;
mod common;
mod newcomer;
mod outputs;
mod pinned;
mod presets;
mod repros;
mod robust;
mod scenario;
mod serve;
mod steptime_fidelity;
mod timed;
mod timeline;
mod traces;
mod vllm_bench;
mod workload;
