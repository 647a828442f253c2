//! A step-time model as a scenario file gives it ([`StepTimeSpec`]), and
//! its checks.

use serde::{Deserialize, Serialize};

use crate::base::field::{FieldError, micros, micros_problem};

/// A forward-pass time model. All times in microseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum StepTimeSpec {
    /// `fixed + per_token × new tokens + per_seq × sequences + per_context_token × context tokens read`.
    Linear {
        /// Fixed cost of a step, µs.
        #[serde(default)]
        fixed_us: f64,
        /// Per token computed in the step, µs.
        #[serde(default)]
        per_token_us: f64,
        /// Per sequence in the step, µs.
        #[serde(default)]
        per_seq_us: f64,
        /// Per token of context attended to (sum over the batch), µs.
        #[serde(default)]
        per_context_token_us: f64,
    },
    /// A profile: step time at given batch sizes (tokens computed), linearly
    /// interpolated between points and extrapolated from the last two, plus
    /// an optional per-context-token term.
    Table {
        /// `[tokens, µs]` pairs, tokens strictly increasing.
        points: Vec<[f64; 2]>,
        /// Per token of context attended to, µs.
        #[serde(default)]
        per_context_token_us: f64,
    },
    /// A prefill term and a decode term, each zero when its part of the
    /// step is empty (a P/D prefill rank pays only the first, a decode
    /// rank only the second); a step with both parts is one forward pass
    /// that reads the weights once, composed as `mixed` says.
    ///
    /// Prefill: `P(N) + prefill_self_pair_ns × (Σ k(k+1)/2 − N(N+1)/2) +
    /// prefill_cached_pair_ns × Σ k·c` over the prefill sequences (chunks
    /// of k tokens on c cached), N their tokens, `P` the `prefill` table
    /// (one prompt of N tokens, nothing cached). The middle term takes off
    /// the causal attention a batch of several prompts does not do; the
    /// last prices attention over cached tokens.
    ///
    /// Decode: the `decode` grid, bilinear in (decoding sequences, mean
    /// context per decoding sequence).
    Table2d {
        /// `[tokens, µs]`: one prompt of that many tokens, nothing cached;
        /// tokens strictly increasing. Linearly interpolated, extrapolated
        /// from the end segments.
        prefill: Vec<[f64; 2]>,
        /// Per (query, key) pair of causal attention within the prefill
        /// chunks, ns: the batch correction's rate (≥ 0).
        #[serde(default)]
        prefill_self_pair_ns: f64,
        /// Per (query, cached key) pair of the prefill chunks' attention
        /// over their cached tokens, ns (≥ 0).
        #[serde(default)]
        prefill_cached_pair_ns: f64,
        /// The decode step time against decoding sequences and context.
        decode: DecodeGrid,
        /// How a step with both parts is priced: one forward pass (the
        /// default) or, asked for by name, the two terms added.
        #[serde(default)]
        mixed: MixedStep,
    },
    /// Priced from the batch's work on the deployment's `[hardware]`,
    /// with the model's `arch` ([`super::roofline`] has the
    /// formula); every factor has a default.
    Roofline(super::roofline::RooflineParams),
}

/// How the `table2d` model prices a step that has a prefill part and a
/// decode part ([`super::table2d`] has the arithmetic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MixedStep {
    /// One forward pass: the weights are read, and the step's fixed costs
    /// paid, once. Each part's floor is its term at its smallest step (a
    /// one-token prompt on an empty cache; one sequence on an empty
    /// context), the larger floor is paid once, and each part adds what it
    /// costs above its own floor: `max(Fp, Fd) + (P − Fp) + (D − Fd)`.
    #[default]
    OneForwardPass,
    /// The prefill term plus the decode term, as AISimulate prices an
    /// aggregated step (each part pays its own weight read): pdsim's
    /// behaviour before the one-pass composition, kept for comparisons.
    PrefillPlusDecode,
}

/// A decode step's time on a grid of (sequences, context per sequence),
/// bilinearly interpolated and linearly extrapolated outside.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeGrid {
    /// Decoding sequences in the step, strictly increasing, each ≥ 1.
    pub seqs: Vec<u64>,
    /// Tokens each decoding sequence has in its cache before the step (the
    /// KV its attention reads besides its new token), strictly increasing.
    pub context: Vec<u64>,
    /// µs, one row per `seqs` value, one column per `context` value.
    pub us: Vec<Vec<f64>>,
}

impl StepTimeSpec {
    /// Its checks; paths are relative to `step_time`. What passes,
    /// [`build`](super::build) builds.
    pub fn check(&self) -> Result<(), FieldError> {
        match self {
            StepTimeSpec::Linear { fixed_us, per_token_us, per_seq_us, per_context_token_us } => {
                micros("fixed_us", *fixed_us)?;
                micros("per_token_us", *per_token_us)?;
                micros("per_seq_us", *per_seq_us)?;
                micros("per_context_token_us", *per_context_token_us)?;
            }
            StepTimeSpec::Roofline(p) => p.check()?,
            StepTimeSpec::Table { points, per_context_token_us } => {
                self::points("points", points)?;
                micros("per_context_token_us", *per_context_token_us)?;
            }
            StepTimeSpec::Table2d { prefill, prefill_self_pair_ns, prefill_cached_pair_ns, decode, mixed: _ } => {
                self::points("prefill", prefill)?;
                pair_ns("prefill_self_pair_ns", *prefill_self_pair_ns)?;
                pair_ns("prefill_cached_pair_ns", *prefill_cached_pair_ns)?;
                decode_grid(decode).map_err(|e| e.under("decode"))?;
            }
        }
        Ok(())
    }
}

/// A pair rate of the `table2d` model, ns: from 0 to
/// [`MAX_PAIR_NS`](super::table2d::MAX_PAIR_NS).
fn pair_ns(field: &str, v: f64) -> Result<(), FieldError> {
    if v.is_nan() || v < 0.0 {
        Err(FieldError::new(field, format!("must be >= 0, got {v}")))
    } else if v > super::table2d::MAX_PAIR_NS {
        Err(FieldError::new(field, format!("must be at most 1e6 ns a pair, got {v}")))
    } else {
        Ok(())
    }
}

/// `[tokens, µs]` points of a table (`name[i]`): at least one, whole
/// tokens strictly increasing, times in range.
fn points(name: &str, points: &[[f64; 2]]) -> Result<(), FieldError> {
    if points.is_empty() {
        return Err(FieldError::new(name, "must have at least one [tokens, µs] point"));
    }
    for (i, &[tokens, us]) in points.iter().enumerate() {
        let at = format!("{name}[{i}]");
        if !(tokens.is_finite() && tokens >= 0.0) {
            return Err(FieldError::new(at, format!("tokens must be >= 0, got {tokens}")));
        }
        if let Some(p) = micros_problem(us) {
            return Err(FieldError::new(at, format!("time {p}")));
        }
        let Some(&[prev, _]) = i.checked_sub(1).map(|j| &points[j]) else { continue };
        if tokens <= prev {
            return Err(FieldError::new(
                at,
                format!(
                    "tokens {tokens} is not above the previous point's {prev} (points must be strictly \
                     increasing in tokens)"
                ),
            ));
        }
        // The model keeps whole tokens.
        let (whole, prev_whole) = (tokens.round() as u64, prev.round() as u64);
        if whole <= prev_whole {
            return Err(FieldError::new(
                at,
                format!(
                    "tokens {tokens} rounds to {whole}, as the previous point's {prev} does (points \
                     must be strictly increasing in whole tokens)"
                ),
            ));
        }
    }
    Ok(())
}

/// The `decode` grid of a `table2d` model; paths are relative to it.
fn decode_grid(g: &DecodeGrid) -> Result<(), FieldError> {
    axis("seqs", &g.seqs, 1)?;
    axis("context", &g.context, 0)?;
    if g.us.len() != g.seqs.len() {
        return Err(FieldError::new(
            "us",
            format!("has {} rows, one per seqs value needs {}", g.us.len(), g.seqs.len()),
        ));
    }
    for (i, row) in g.us.iter().enumerate() {
        if row.len() != g.context.len() {
            return Err(FieldError::new(
                format!("us[{i}]"),
                format!("has {} values, one per context value needs {}", row.len(), g.context.len()),
            ));
        }
        for (j, &us) in row.iter().enumerate() {
            micros(&format!("us[{i}][{j}]"), us)?;
        }
    }
    Ok(())
}

/// An axis of the decode grid: at least one value, each at least `least`,
/// strictly increasing.
fn axis(name: &str, values: &[u64], least: u64) -> Result<(), FieldError> {
    if values.is_empty() {
        return Err(FieldError::new(name, "must have at least one value"));
    }
    for (i, &v) in values.iter().enumerate() {
        if v < least {
            return Err(FieldError::new(format!("{name}[{i}]"), format!("must be >= {least}, got {v}")));
        }
        if let Some(&prev) = i.checked_sub(1).map(|j| &values[j])
            && v <= prev
        {
            return Err(FieldError::new(
                format!("{name}[{i}]"),
                format!("{v} is not above the previous value {prev} (must be strictly increasing)"),
            ));
        }
    }
    Ok(())
}
