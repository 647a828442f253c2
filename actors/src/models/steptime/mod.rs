//! Forward-pass time of one scheduler step.
//!
//! A rank asks its [`StepTimeModel`] how long a step takes given the shape
//! of the batch. Four models come from scenario files ([`StepTimeSpec`]):
//! [`LinearStepTime`], [`TableStepTime`], [`Table2dStepTime`]
//! (`table2d.rs`: prefill and decode priced apart, the form `pdsim
//! calibrate` fits to measured steps) and [`RooflineStepTime`]
//! (`roofline.rs`); any other can be plugged in by implementing the trait.

use sim_core::SimDuration;

pub mod roofline;

use roofline::{RankInputs, RooflineStepTime};

use crate::base::field::FieldError;

mod spec;

pub use spec::{DecodeGrid, MixedStep, StepTimeSpec};

pub mod table2d;

pub use table2d::Table2dStepTime;

/// What a step computes, summed over its batch.
///
/// The first three fields are the step as a whole; the rest split it into
/// its prefill part (sequences computing prompt tokens: a prompt chunk, a
/// recompute after preemption) and its decode part (sequences computing
/// their one next token), for the models that price the two apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchShape {
    /// Tokens computed in the step (prefill chunks plus one per decoding sequence).
    pub new_tokens: u64,
    /// Sequences in the step.
    pub seqs: u64,
    /// Tokens of context attended to: for each sequence, the tokens it has
    /// after the step.
    pub context_tokens: u64,
    /// Sequences computing prompt tokens (every sequence but the decoding
    /// ones: those computing one token past their prompt).
    pub prefill_seqs: u64,
    /// Tokens the prefill sequences compute.
    pub prefill_tokens: u64,
    /// Tokens the prefill sequences already had in their cache (read by
    /// their attention, not computed).
    pub prefill_cached: u64,
    /// Σ k(k + 1)/2 over the prefill sequences' chunks of k tokens: the
    /// (query, key) pairs of their causal attention within the chunk.
    pub prefill_self_pairs: u128,
    /// Σ k·c over the prefill sequences (c tokens cached): the pairs of
    /// their attention over what was cached.
    pub prefill_cached_pairs: u128,
    /// Tokens the decoding sequences had in their cache before the step
    /// (the KV their attention reads besides their new token).
    pub decode_context: u64,
}

impl BatchShape {
    /// Decoding sequences (each computes one token).
    pub const fn decode_seqs(&self) -> u64 {
        self.seqs - self.prefill_seqs
    }

    /// Adds a sequence computing `k` tokens on top of `cached` ones;
    /// `decoding`: it computes its one next token past its prompt.
    pub fn add(&mut self, k: u64, cached: u64, decoding: bool) {
        self.new_tokens += k;
        self.seqs += 1;
        self.context_tokens += cached + k;
        if decoding {
            self.decode_context += cached;
        } else {
            self.prefill_seqs += 1;
            self.prefill_tokens += k;
            self.prefill_cached += cached;
            self.prefill_self_pairs += u128::from(k) * (u128::from(k) + 1) / 2;
            self.prefill_cached_pairs += u128::from(k) * u128::from(cached);
        }
    }

    /// Takes out a sequence [`BatchShape::add`] added with the same
    /// arguments (a step's sequence preempted before the step runs).
    pub fn remove(&mut self, k: u64, cached: u64, decoding: bool) {
        self.new_tokens -= k;
        self.seqs -= 1;
        self.context_tokens -= cached + k;
        if decoding {
            self.decode_context -= cached;
        } else {
            self.prefill_seqs -= 1;
            self.prefill_tokens -= k;
            self.prefill_cached -= cached;
            self.prefill_self_pairs -= u128::from(k) * (u128::from(k) + 1) / 2;
            self.prefill_cached_pairs -= u128::from(k) * u128::from(cached);
        }
    }

    /// Adds `n` sequences alike, each as [`BatchShape::add`] adds one (the
    /// same shape, in O(1)).
    pub fn add_many(&mut self, n: u64, k: u64, cached: u64, decoding: bool) {
        self.new_tokens += n * k;
        self.seqs += n;
        self.context_tokens += n * (cached + k);
        if decoding {
            self.decode_context += n * cached;
        } else {
            let (n, k128) = (u128::from(n), u128::from(k));
            self.prefill_seqs += n as u64;
            self.prefill_tokens += n as u64 * k;
            self.prefill_cached += n as u64 * cached;
            self.prefill_self_pairs += n * (k128 * (k128 + 1) / 2);
            self.prefill_cached_pairs += n * k128 * u128::from(cached);
        }
    }

    /// `seqs` decoding sequences with `context` tokens in cache between
    /// them before the step.
    pub const fn decoding(seqs: u64, context: u64) -> Self {
        BatchShape {
            new_tokens: seqs,
            seqs,
            context_tokens: context + seqs,
            prefill_seqs: 0,
            prefill_tokens: 0,
            prefill_cached: 0,
            prefill_self_pairs: 0,
            prefill_cached_pairs: 0,
            decode_context: context,
        }
    }

    /// The same sequences one step later, in a run of pure decode steps:
    /// each computes one token on top of all it had after this step (a
    /// landed handoff that computed its last prompt token in the run's
    /// first step decodes from the second on).
    pub fn next_decode_step(&mut self) {
        *self = BatchShape::decoding(self.seqs, self.context_tokens);
    }
}

/// How long a step of a given shape takes.
pub trait StepTimeModel {
    /// The step's duration: a pure function of the shape (the scheduler
    /// reuses a time it computed for a step that did not run when a later
    /// step has the same shape).
    fn step_time(&self, batch: &BatchShape) -> SimDuration;

    /// Prices the steps of a run of pure decoding that follow a step of
    /// shape `shape`: advances `shape` one [`BatchShape::next_decode_step`]
    /// at a time and passes each step's duration to `each` until `each`
    /// returns false, leaving `shape` the last step priced. The durations
    /// are [`StepTimeModel::step_time`]'s of those shapes, bit for bit; a
    /// model may find them incrementally (the scheduler's runs price their
    /// steps here). The default calls `step_time` once a step.
    fn decode_run(&self, shape: &mut BatchShape, each: &mut dyn FnMut(SimDuration) -> bool) {
        loop {
            shape.next_decode_step();
            if !each(self.step_time(shape)) {
                return;
            }
        }
    }

    /// The step time broken into the model's terms, in µs, for a person
    /// checking a model point by point (`pdsim steptime --json`); a
    /// simulation never calls it. The default names no terms.
    fn terms(&self, _batch: &BatchShape) -> Vec<(&'static str, f64)> {
        Vec::new()
    }
}

/// Picoseconds, so that microsecond coefficients with fractions stay exact
/// integers and a step's time is rounded once, to whole nanoseconds.
fn us_to_ps(us: f64) -> u64 {
    (us * 1e6).round() as u64
}

fn ps_to_duration(ps: u128) -> SimDuration {
    SimDuration::from_nanos(u64::try_from(ps.div_ceil(1000)).unwrap_or(u64::MAX))
}

/// `fixed + per_token × new + per_seq × seqs + per_context_token × context`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearStepTime {
    fixed_ps: u64,
    per_token_ps: u64,
    per_seq_ps: u64,
    per_context_token_ps: u64,
}

impl LinearStepTime {
    /// A linear model from microsecond coefficients (each ≥ 0, finite).
    pub fn from_micros(fixed: f64, per_token: f64, per_seq: f64, per_context_token: f64) -> Self {
        LinearStepTime {
            fixed_ps: us_to_ps(fixed),
            per_token_ps: us_to_ps(per_token),
            per_seq_ps: us_to_ps(per_seq),
            per_context_token_ps: us_to_ps(per_context_token),
        }
    }
}

impl StepTimeModel for LinearStepTime {
    #[inline]
    fn step_time(&self, b: &BatchShape) -> SimDuration {
        // u64 picoseconds cover 213 days of one step; past that, u128.
        let fast = self
            .per_token_ps
            .checked_mul(b.new_tokens)
            .and_then(|x| x.checked_add(self.per_seq_ps.checked_mul(b.seqs)?))
            .and_then(|x| x.checked_add(self.per_context_token_ps.checked_mul(b.context_tokens)?))
            .and_then(|x| x.checked_add(self.fixed_ps));
        if let Some(ps) = fast {
            return SimDuration::from_nanos(ps.div_ceil(1000));
        }
        let ps = u128::from(self.fixed_ps)
            + u128::from(self.per_token_ps) * u128::from(b.new_tokens)
            + u128::from(self.per_seq_ps) * u128::from(b.seqs)
            + u128::from(self.per_context_token_ps) * u128::from(b.context_tokens);
        ps_to_duration(ps)
    }

    fn terms(&self, b: &BatchShape) -> Vec<(&'static str, f64)> {
        let term = |ps: u64, n: u64| ps_to_us(u128::from(ps) * u128::from(n));
        vec![
            ("fixed", term(self.fixed_ps, 1)),
            ("per_token", term(self.per_token_ps, b.new_tokens)),
            ("per_seq", term(self.per_seq_ps, b.seqs)),
            ("per_context_token", term(self.per_context_token_ps, b.context_tokens)),
        ]
    }
}

/// A measured profile: step time against tokens computed, linearly
/// interpolated (and extrapolated from the nearest two points), plus a
/// per-context-token term.
#[derive(Clone, Debug, PartialEq)]
pub struct TableStepTime {
    /// (tokens, picoseconds), tokens strictly increasing.
    points: Vec<(u64, u64)>,
    per_context_token_ps: u64,
}

impl TableStepTime {
    /// A table from `[tokens, µs]` points; `None` if the points are empty,
    /// negative, or not strictly increasing in tokens.
    pub fn from_micros(points: &[[f64; 2]], per_context_token_us: f64) -> Option<Self> {
        Some(TableStepTime { points: points_ps(points)?, per_context_token_ps: us_to_ps(per_context_token_us) })
    }

    fn interpolate(&self, x: u64) -> u128 {
        interpolate(&self.points, x)
    }
}

/// The piecewise-linear function through `points` (x strictly increasing,
/// at least one point) at `x`, extrapolated from the end segments and
/// clamped at 0.
fn interpolate(p: &[(u64, u64)], x: u64) -> u128 {
    if p.len() == 1 {
        return u128::from(p[0].1);
    }
    // The segment whose right end is the first point at or past x (the
    // first or last segment outside the table's range).
    let i = p.partition_point(|&(t, _)| t < x).clamp(1, p.len() - 1);
    let ((x0, y0), (x1, y1)) = (p[i - 1], p[i]);
    let (x, x0, x1) = (i128::from(x), i128::from(x0), i128::from(x1));
    let (y0, y1) = (i128::from(y0), i128::from(y1));
    // |y1 − y0| < 2^64 and |x − x0| < 2^64: the product fits in i128.
    let y = y0 + (y1 - y0) * (x - x0) / (x1 - x0);
    u128::try_from(y.max(0)).unwrap_or(0)
}

/// Whole `[tokens, µs]` points as (tokens, ps); `None` if empty, negative,
/// past 1e9 µs, or not strictly increasing in whole tokens.
fn points_ps(points: &[[f64; 2]]) -> Option<Vec<(u64, u64)>> {
    let mut out = Vec::with_capacity(points.len());
    for &[tokens, us] in points {
        if !(tokens >= 0.0 && us >= 0.0 && tokens.is_finite() && us <= 1e9) {
            return None;
        }
        let t = tokens.round() as u64;
        if out.last().is_some_and(|&(prev, _)| prev >= t) {
            return None;
        }
        out.push((t, us_to_ps(us)));
    }
    (!out.is_empty()).then_some(out)
}

fn ps_to_us(ps: u128) -> f64 {
    ps as f64 / 1e6
}

impl StepTimeModel for TableStepTime {
    fn step_time(&self, b: &BatchShape) -> SimDuration {
        let ps = self.interpolate(b.new_tokens) + u128::from(self.per_context_token_ps) * u128::from(b.context_tokens);
        ps_to_duration(ps)
    }

    fn terms(&self, b: &BatchShape) -> Vec<(&'static str, f64)> {
        vec![
            ("table", ps_to_us(self.interpolate(b.new_tokens))),
            ("per_context_token", ps_to_us(u128::from(self.per_context_token_ps) * u128::from(b.context_tokens))),
        ]
    }
}

/// Builds the model a spec describes, once its checks
/// ([`StepTimeSpec::check`]) pass; the error names the field (`step_time.per_token_us`). A roofline
/// needs the `rank` it prices (its layers, GPU, TP size and pool groups).
pub fn build(spec: &StepTimeSpec, rank: Option<RankInputs<'_>>) -> Result<Box<dyn StepTimeModel>, FieldError> {
    spec.check().map_err(|e| e.under("step_time"))?;
    match spec {
        StepTimeSpec::Linear { fixed_us, per_token_us, per_seq_us, per_context_token_us } => {
            Ok(Box::new(LinearStepTime::from_micros(*fixed_us, *per_token_us, *per_seq_us, *per_context_token_us)))
        }
        StepTimeSpec::Table { points, per_context_token_us } => {
            TableStepTime::from_micros(points, *per_context_token_us)
                .map(|t| Box::new(t) as Box<dyn StepTimeModel>)
                .ok_or_else(|| FieldError::new("step_time.points", "refused by the table model"))
        }
        StepTimeSpec::Table2d { prefill, prefill_self_pair_ns, prefill_cached_pair_ns, decode, mixed } => {
            Table2dStepTime::from_spec(prefill, *prefill_self_pair_ns, *prefill_cached_pair_ns, decode)
                .map(|t| t.with_mixed(*mixed))
                .map(|t| Box::new(t) as Box<dyn StepTimeModel>)
                .ok_or_else(|| FieldError::new("step_time", "refused by the table2d model"))
        }
        StepTimeSpec::Roofline(params) => {
            let rank = rank.ok_or_else(|| {
                FieldError::new("step_time.kind", "a roofline needs the model's `arch` and the `[hardware]`")
            })?;
            Ok(Box::new(RooflineStepTime::new(rank, *params)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_many_alike_is_adding_them_one_by_one() {
        for (n, k, c, decoding) in [(0, 5, 7, false), (3, 1, 9, true), (4, 1000, 24, false), (7, 1, 0, true)] {
            let mut one = BatchShape::default();
            one.add(17, 3, false);
            let mut many = one;
            for _ in 0..n {
                one.add(k, c, decoding);
            }
            many.add_many(n, k, c, decoding);
            assert_eq!(one, many);
        }
    }

    #[test]
    fn removing_a_sequence_leaves_the_shape_of_the_batch_without_it() {
        // A batch of a prefill chunk, a decode and a recompute; each taken
        // out (a victim of the priority policy already in the step) leaves
        // the shape of the other two added alone.
        let seqs = [(300, 40, false), (1, 512, true), (64, 0, false)];
        for out in 0..seqs.len() {
            let mut shape = BatchShape::default();
            let mut without = BatchShape::default();
            for (i, &(k, c, d)) in seqs.iter().enumerate() {
                shape.add(k, c, d);
                if i != out {
                    without.add(k, c, d);
                }
            }
            let (k, c, d) = seqs[out];
            shape.remove(k, c, d);
            assert_eq!(shape, without, "sequence {out} taken out");
        }
    }

    #[test]
    fn linear_sums_its_terms_in_integer_picoseconds() {
        let m = LinearStepTime::from_micros(5_000.0, 30.0, 1.0, 0.5);
        let b = BatchShape { new_tokens: 999, seqs: 1, context_tokens: 999, ..BatchShape::default() };
        // 5,000 + 999 × 30 + 1 + 999 × 0.5 = 5,000 + 29,970 + 1 + 499.5 = 35,470.5 µs
        assert_eq!(m.step_time(&b), SimDuration::from_nanos(35_470_500));
        let terms = [("fixed", 5_000.0), ("per_token", 29_970.0), ("per_seq", 1.0), ("per_context_token", 499.5)];
        assert_eq!(m.terms(&b), terms);
    }

    #[test]
    fn table_interpolates_and_extrapolates() {
        let t = TableStepTime::from_micros(&[[1.0, 10_000.0], [1025.0, 20_000.0], [2049.0, 40_000.0]], 0.0).unwrap();
        let at = |n| {
            t.step_time(&BatchShape { new_tokens: n, seqs: 1, context_tokens: 0, ..BatchShape::default() }).as_nanos()
        };
        assert_eq!(at(1), 10_000_000);
        assert_eq!(at(513), 15_000_000); // halfway between 1 and 1025
        assert_eq!(at(1537), 30_000_000); // halfway between 1025 and 2049
        assert_eq!(at(3073), 60_000_000); // one more segment's slope past the end
        assert_eq!(at(0), 9_990_235); // 10 ms − 10 ms/1024, rounded up to the ns
        let t = TableStepTime::from_micros(&[[1.0, 10_000.0], [1025.0, 20_000.0]], 0.5).unwrap();
        let b = BatchShape { new_tokens: 513, seqs: 1, context_tokens: 1_000, ..BatchShape::default() };
        // 15,000 µs from the table, 1,000 × 0.5 = 500 µs of context.
        assert_eq!(t.terms(&b), [("table", 15_000.0), ("per_context_token", 500.0)]);
        assert_eq!(t.step_time(&b).as_nanos(), 15_500_000);
        assert!(TableStepTime::from_micros(&[[2.0, 1.0], [2.0, 3.0]], 0.0).is_none());
        assert!(TableStepTime::from_micros(&[], 0.0).is_none());
    }
}
