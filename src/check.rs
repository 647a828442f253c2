//! Field checks shared by the scenario and workload specs.
//!
//! A check returns an [`Issue`]: the dotted path of the field it refuses and
//! why. The scenario loader turns the path into a file and line
//! (`scenarios/x.toml:14: workload.arrival.rate_per_s: must be > 0, got -3`).

use std::fmt;

/// A refused field: its dotted path (`workload.arrival.rate_per_s`,
/// `model.cache_groups[2].page_bytes`) and a one-line reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issue {
    /// Dotted path of the field, as a scenario file spells it; array elements
    /// as `name[i]`.
    pub path: String,
    /// Why the field is refused, one line.
    pub message: String,
}

impl Issue {
    /// An issue with `path` and `message`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Issue { path: path.into(), message: message.into() }
    }

    /// The same issue with `prefix.` put before its path.
    pub fn under(mut self, prefix: &str) -> Self {
        self.path = if self.path.is_empty() { prefix.to_owned() } else { format!("{prefix}.{}", self.path) };
        self
    }
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// `v` must be finite and greater than 0.
pub fn positive(path: &str, v: f64) -> Result<(), Issue> {
    if v.is_finite() && v > 0.0 { Ok(()) } else { Err(Issue::new(path, format!("must be > 0, got {v}"))) }
}

/// `v` must be finite and at least 0.
pub fn non_negative(path: &str, v: f64) -> Result<(), Issue> {
    if v.is_finite() && v >= 0.0 { Ok(()) } else { Err(Issue::new(path, format!("must be >= 0, got {v}"))) }
}

/// A count that must be at least 1.
pub fn at_least_one(path: &str, v: u64) -> Result<(), Issue> {
    if v >= 1 { Ok(()) } else { Err(Issue::new(path, "must be >= 1, got 0")) }
}
