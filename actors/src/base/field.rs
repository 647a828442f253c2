//! A refused field ([`FieldError`]), the one error type of every check in
//! the crate, and the checks every layer shares.

/// A refused field: its dotted path and a one-line reason.
///
/// ```
/// use actors::validate::FieldError;
/// let e = FieldError::new("fixed_us", "must be >= 0, got -5").under("step_time").under("prefill");
/// assert_eq!(e.to_string(), "prefill.step_time.fixed_us: must be >= 0, got -5");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct FieldError {
    /// Dotted path of the field, as a scenario file spells it
    /// (`decode.num_blocks`, `faults.decode_crashes[0].rank`); array
    /// elements as `name[i]`.
    pub field: String,
    /// What is wrong with it, one line.
    pub problem: String,
}

impl FieldError {
    /// The field `field` refused for `problem`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        FieldError { field: field.into(), problem: problem.into() }
    }

    /// The same error with `prefix.` put before its path.
    #[must_use]
    pub fn under(mut self, prefix: &str) -> Self {
        self.field = if self.field.is_empty() { prefix.to_owned() } else { format!("{prefix}.{}", self.field) };
        self
    }
}

/// `v` must be finite and greater than 0.
pub fn positive(field: &str, v: f64) -> Result<(), FieldError> {
    if v.is_finite() && v > 0.0 { Ok(()) } else { Err(FieldError::new(field, format!("must be > 0, got {v}"))) }
}

/// `v` must be finite and at least 0.
pub fn non_negative(field: &str, v: f64) -> Result<(), FieldError> {
    if v.is_finite() && v >= 0.0 { Ok(()) } else { Err(FieldError::new(field, format!("must be >= 0, got {v}"))) }
}

/// A count that must be at least 1.
pub fn at_least_one(field: &str, v: u64) -> Result<(), FieldError> {
    if v >= 1 { Ok(()) } else { Err(FieldError::new(field, "must be >= 1, got 0")) }
}

/// The most microseconds of one time (a step's term, the link latency):
/// 1,000 s. Anything larger is a typo, and would push simulated time past
/// its range.
pub(crate) const MAX_MICROS: f64 = 1e9;

/// Why `v` µs is refused, if it is: negative or not a number, or past
/// [`MAX_MICROS`].
pub(crate) fn micros_problem(v: f64) -> Option<String> {
    if v.is_nan() || v < 0.0 {
        Some(format!("must be >= 0, got {v}"))
    } else if v > MAX_MICROS {
        Some(format!("must be at most 1e9 µs (1,000 s), got {v}"))
    } else {
        None
    }
}

pub(crate) fn micros(field: &str, v: f64) -> Result<f64, FieldError> {
    match micros_problem(v) {
        Some(p) => Err(FieldError::new(field, p)),
        None => Ok(v),
    }
}
