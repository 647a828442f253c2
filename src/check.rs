//! Field checks shared by the scenario and workload specs: actors' own
//! ([`actors::validate`]), so that a deployment field and a workload field
//! are refused in one type and one wording.
//!
//! A check returns a [`FieldError`]: the dotted path of the field it refuses
//! and why. The scenario loader turns the path into a file and line
//! (`scenarios/x.toml:14: workload.arrival.rate_per_s: must be > 0, got -3`).

pub use actors::validate::{FieldError, at_least_one, non_negative, positive};
