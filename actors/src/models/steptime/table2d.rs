//! The two-dimensional table model ([`StepTimeSpec::Table2d`]): a step's
//! prefill part and decode part priced apart, each term zero when its part
//! is empty (a P/D prefill rank pays only the first, a decode rank only the
//! second), and a step with both parts priced as the one forward pass it
//! is (below).
//!
//! - Prefill: `P(N) + self × (Σ k(k+1)/2 − N(N+1)/2) + cached × Σ k·c`,
//!   with `P` a 1-D table of one prompt of N tokens on an empty cache, N
//!   the prefill tokens, and the sums over the prefill sequences (chunks of
//!   k tokens on c cached). The middle term is never positive: a batch of
//!   several prompts does less causal attention than one prompt of all
//!   their tokens. The last prices attention over what was cached.
//! - Decode: a grid of (decoding sequences, context per sequence) read
//!   bilinearly at (d, X/d), X the tokens the d decoding sequences had in
//!   their cache before the step, linearly extrapolated outside.
//!
//! - A mixed step ([`MixedStep::OneForwardPass`], the default): one
//!   forward pass reads the weights once and pays the step's fixed costs
//!   (launches, sampling) once, but each term was measured on a pass of
//!   its own, so each holds them. A term's *floor* is its value at its
//!   smallest step, where the work above them is nil: `Fp = P(1)` (a
//!   one-token prompt on an empty cache), `Fd` = the grid at one sequence
//!   on an empty context (extrapolated, at least 0). The step is
//!   `max(Fp, Fd) + (prefill − Fp)⁺ + (decode − Fd)⁺`: the larger floor
//!   once, and each part's own work above its floor (its GEMM rows beyond
//!   the weight read, its attention and KV reads). On AIConfigurator's
//!   Llama-3.1-8B/H200 TP 1 grid `Fp` = 5,220.131 µs and `Fd` = 4,830.321
//!   µs, so a decode step of 64 sequences at 1,024 tokens that also
//!   recomputes one landed handoff's last prompt token costs the decode
//!   term plus 389.810 µs and that token's cached attention, not plus
//!   5.2 ms. [`MixedStep::PrefillPlusDecode`], asked for by name, adds the
//!   two terms as AISimulate prices an aggregated step.
//!
//! Integer arithmetic throughout: tables in picoseconds, the pair rates in
//! femtoseconds, the grid read as one exact fraction (an `f64` fallback
//! only where an extrapolation far outside the grid would overflow 128
//! bits); the step rounded up to whole nanoseconds once.
//!
//! [`StepTimeSpec::Table2d`]: crate::deploy::config::StepTimeSpec::Table2d

use sim_core::SimDuration;

use super::{BatchShape, StepTimeModel, interpolate, points_ps, us_to_ps};
use super::{DecodeGrid, MixedStep};

/// Femtoseconds in a picosecond.
const FS_PER_PS: i128 = 1000;
/// Femtoseconds in a nanosecond.
const FS_PER_NS: i128 = 1_000_000;
/// The largest pair rate the model takes, ns (a millisecond a pair is a
/// typo).
pub const MAX_PAIR_NS: f64 = 1e6;

/// Prefill table plus attention-pair corrections, plus a decode grid.
#[derive(Clone, Debug, PartialEq)]
pub struct Table2dStepTime {
    /// (tokens, ps) of one prompt on an empty cache, tokens strictly increasing.
    prefill: Vec<(u64, u64)>,
    /// fs per pair of the batch correction.
    self_pair_fs: i128,
    /// fs per (query, cached key) pair.
    cached_pair_fs: i128,
    /// Decoding sequences, strictly increasing, each ≥ 1.
    seqs: Vec<u64>,
    /// Context per decoding sequence before the step, strictly increasing.
    context: Vec<u64>,
    /// ps at (seqs[i], context[j]), at `i × context.len() + j`.
    grid: Vec<u64>,
    /// The axes and the grid are within [`small_bilinear`]'s bounds.
    small: bool,
    /// How a step with both parts is priced.
    mixed: MixedStep,
    /// The prefill term's floor, `P(1)`, fs.
    prefill_floor: i128,
    /// The decode term's floor, the grid at one sequence on no context
    /// (at least 0), fs.
    decode_floor: i128,
}

/// The terms of a step, fs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Terms {
    table: i128,
    correction: i128,
    cached: i128,
    decode: i128,
    /// What a mixed step does not pay twice (≤ 0): the one-pass step less
    /// the sum of its parts; 0 for a step of one part.
    one_pass: i128,
}

impl Terms {
    /// The prefill term, at least 0.
    fn prefill(&self) -> i128 {
        self.table.saturating_add(self.correction).saturating_add(self.cached).max(0)
    }

    /// The step: the prefill and decode terms (each at least 0), less what
    /// one forward pass does not pay twice.
    fn total(&self) -> i128 {
        self.prefill().saturating_add(self.decode.max(0)).saturating_add(self.one_pass)
    }
}

fn fs_to_us(fs: i128) -> f64 {
    fs as f64 / 1e9
}

/// `v` as i128, saturating (values past 2^127 only come from shapes no
/// step has).
fn sat(v: u128) -> i128 {
    i128::try_from(v).unwrap_or(i128::MAX)
}

/// The two neighbours on `axis` of a point for which `before(v)` holds for
/// exactly the axis values below it: the segment whose right end is the
/// first value at or past the point (the first or last segment outside the
/// axis). One value: that value twice.
fn segment(axis: &[u64], before: impl FnMut(&u64) -> bool) -> (usize, usize) {
    if axis.len() == 1 {
        return (0, 0);
    }
    let i = axis.partition_point(before).clamp(1, axis.len() - 1);
    (i - 1, i)
}

/// The segment of `axis` (contexts) around the mean context X/d of `d`
/// sequences with `x` tokens of context between them, compared exactly:
/// c·d < X is c < ⌈X/d⌉ for whole numbers (one division, not a 128-bit
/// product per probe).
fn context_segment(axis: &[u64], d: u64, x: u64) -> (usize, usize) {
    let mean_ceil = x.div_ceil(d);
    segment(axis, |&c| c < mean_ceil)
}

impl Table2dStepTime {
    /// The model of a `table2d` spec (see [`crate::deploy::validate`] for the
    /// checks, with field paths); `None` if a value is refused.
    pub fn from_spec(
        prefill: &[[f64; 2]],
        self_pair_ns: f64,
        cached_pair_ns: f64,
        decode: &DecodeGrid,
    ) -> Option<Self> {
        let rate = |ns: f64| (ns.is_finite() && (0.0..=MAX_PAIR_NS).contains(&ns)).then(|| (ns * 1e6).round() as i128);
        let increasing = |axis: &[u64]| !axis.is_empty() && axis.windows(2).all(|w| w[0] < w[1]);
        if !increasing(&decode.seqs) || decode.seqs[0] == 0 || !increasing(&decode.context) {
            return None;
        }
        if decode.us.len() != decode.seqs.len() {
            return None;
        }
        let mut grid = Vec::with_capacity(decode.seqs.len() * decode.context.len());
        for row in &decode.us {
            if row.len() != decode.context.len() {
                return None;
            }
            for &us in row {
                if !(0.0..=1e9).contains(&us) {
                    return None;
                }
                grid.push(us_to_ps(us));
            }
        }
        Some(
            Table2dStepTime {
                prefill: points_ps(prefill)?,
                self_pair_fs: rate(self_pair_ns)?,
                cached_pair_fs: rate(cached_pair_ns)?,
                seqs: decode.seqs.clone(),
                context: decode.context.clone(),
                small: small_axes(&decode.seqs, &decode.context, &grid),
                grid,
                mixed: MixedStep::OneForwardPass,
                prefill_floor: 0,
                decode_floor: 0,
            }
            .with_floors(),
        )
    }

    /// The same model with mixed steps priced as `mixed` says.
    pub fn with_mixed(mut self, mixed: MixedStep) -> Self {
        self.mixed = mixed;
        self
    }

    /// Sets each term's floor: `P(1)`, and the grid at (1, 0) at least 0.
    fn with_floors(mut self) -> Self {
        self.prefill_floor = sat(interpolate(&self.prefill, 1)).saturating_mul(FS_PER_PS);
        self.decode_floor = self.decode_fs(&BatchShape::decoding(1, 0)).max(0);
        self
    }

    /// The floors of the prefill and decode terms, µs: what a step of one
    /// token of each part costs, the weight read and fixed costs that one
    /// forward pass pays once.
    pub fn floors_us(&self) -> (f64, f64) {
        (fs_to_us(self.prefill_floor), fs_to_us(self.decode_floor))
    }

    fn terms_fs(&self, b: &BatchShape) -> Terms {
        let mut t = Terms { decode: self.decode_fs(b), ..Terms::default() };
        if b.prefill_seqs > 0 {
            let n = u128::from(b.prefill_tokens);
            t.table = sat(interpolate(&self.prefill, b.prefill_tokens)).saturating_mul(FS_PER_PS);
            // n(n + 1) < 2^128 for any u64 n.
            let one_prompt = n * (n + 1) / 2;
            let missing = one_prompt.saturating_sub(b.prefill_self_pairs);
            t.correction = -sat(missing).saturating_mul(self.self_pair_fs);
            t.cached = sat(b.prefill_cached_pairs).saturating_mul(self.cached_pair_fs);
            if b.decode_seqs() > 0 && self.mixed == MixedStep::OneForwardPass {
                t.one_pass = self.one_pass_fs(t.prefill(), t.decode.max(0));
            }
        }
        t
    }

    /// A mixed step's one-pass price less the sum of its terms `p` and
    /// `d` (each ≥ 0): `max(Fp, Fd) + (p − Fp)⁺ + (d − Fd)⁺ − p − d`,
    /// never positive.
    fn one_pass_fs(&self, p: i128, d: i128) -> i128 {
        let (fp, fd) = (self.prefill_floor, self.decode_floor);
        let one = fp.max(fd).saturating_add((p - fp).max(0)).saturating_add((d - fd).max(0));
        one.saturating_sub(p.saturating_add(d)).min(0)
    }

    /// The grid at (d, X/d), fs; 0 with no decoding sequence.
    fn decode_fs(&self, b: &BatchShape) -> i128 {
        let d = b.decode_seqs();
        if d == 0 {
            return 0;
        }
        let x = b.decode_context;
        let (i0, i1) = segment(&self.seqs, |&s| s < d);
        let (j0, j1) = context_segment(&self.context, d, x);
        let n = self.context.len();
        let v = |i: usize, j: usize| self.grid[i * n + j];
        let corners = [v(i0, j0), v(i0, j1), v(i1, j0), v(i1, j1)];
        let axes = ([self.seqs[i0], self.seqs[i1]], [self.context[j0], self.context[j1]]);
        if self.small && d < SMALL_SEQS && x < SMALL_CONTEXT {
            return small_bilinear(d, x, axes, corners);
        }
        exact_bilinear(d, x, axes, corners).unwrap_or_else(|| approx_bilinear(d, x, axes, corners))
    }
}

/// The bilinear form at d sequences of X context between them, in fs, as
/// one fraction:
///
/// ```text
///   [ (s1 − d)·((c1·d − X)·v00 + (X − c0·d)·v01)
///   + (d − s0)·((c1·d − X)·v10 + (X − c0·d)·v11) ] / ((s1 − s0)·(c1 − c0)·d)
/// ```
///
/// (the weights of the mean context X/d multiplied through by d); an axis
/// of one value weighs its one corner 1. `None` on overflow.
fn exact_bilinear(d: u64, x: u64, ([s0, s1], [c0, c1]): ([u64; 2], [u64; 2]), v: [u64; 4]) -> Option<i128> {
    let (d, x) = (i128::from(d), i128::from(x));
    let (s0, s1, c0, c1) = (i128::from(s0), i128::from(s1), i128::from(c0), i128::from(c1));
    let (ws0, ws1, ds) = if s0 == s1 { (1, 0, 1) } else { (s1 - d, d - s0, s1 - s0) };
    let (wc0, wc1, dc) =
        if c0 == c1 { (1, 0, 1) } else { (c1.checked_mul(d)? - x, x - c0.checked_mul(d)?, (c1 - c0).checked_mul(d)?) };
    let [v00, v01, v10, v11] = v.map(i128::from);
    let row = |a: i128, b: i128| wc0.checked_mul(a)?.checked_add(wc1.checked_mul(b)?);
    let num = ws0.checked_mul(row(v00, v01)?)?.checked_add(ws1.checked_mul(row(v10, v11)?)?)?;
    let den = ds.checked_mul(dc)?;
    Some(num.checked_mul(FS_PER_PS)?.div_euclid(den))
}

/// Bounds under which [`small_bilinear`] cannot overflow: sequences (on
/// the axis and in the step) below 2^20, contexts on the axis below 2^32
/// and a step's total context below 2^52 tokens, grid values below 2^40 ps
/// (1.1 s).
const SMALL_SEQS: u64 = 1 << 20;
const SMALL_CONTEXT: u64 = 1 << 52;
const SMALL_AXIS_CONTEXT: u64 = 1 << 32;
const SMALL_PS: u64 = 1 << 40;

fn small_axes(seqs: &[u64], context: &[u64], grid: &[u64]) -> bool {
    seqs.iter().all(|&s| s < SMALL_SEQS)
        && context.iter().all(|&c| c < SMALL_AXIS_CONTEXT)
        && grid.iter().all(|&v| v < SMALL_PS)
}

/// [`exact_bilinear`]'s operations, in the same order, without overflow
/// checks: within the bounds above, every weight is below 2^52 in size
/// (c·d < 2^32 · 2^20, X < 2^52), a row below 2^93, the numerator below
/// 2^114 and times 1,000 fs/ps below 2^124, so no operation overflows and
/// the result is the checked one's (the step time model's hot path: a
/// checked i128 multiply costs several times a plain one).
fn small_bilinear(d: u64, x: u64, axes: ([u64; 2], [u64; 2]), v: [u64; 4]) -> i128 {
    let (num, den) = small_fraction(d, x, axes, v);
    floor_div(num, den)
}

/// [`small_bilinear`] before its division: the numerator (in fs) and the
/// denominator, which is positive.
#[inline]
fn small_fraction(d: u64, x: u64, ([s0, s1], [c0, c1]): ([u64; 2], [u64; 2]), v: [u64; 4]) -> (i128, i128) {
    let (d, x) = (i128::from(d), i128::from(x));
    let (s0, s1, c0, c1) = (i128::from(s0), i128::from(s1), i128::from(c0), i128::from(c1));
    let (ws0, ws1, ds) = if s0 == s1 { (1, 0, 1) } else { (s1 - d, d - s0, s1 - s0) };
    let (wc0, wc1, dc) = if c0 == c1 { (1, 0, 1) } else { (c1 * d - x, x - c0 * d, (c1 - c0) * d) };
    let [v00, v01, v10, v11] = v.map(i128::from);
    let num = ws0 * (wc0 * v00 + wc1 * v01) + ws1 * (wc0 * v10 + wc1 * v11);
    (num * FS_PER_PS, ds * dc)
}

/// ⌊num/den⌋ for a positive `den`. A non-negative quotient of operands
/// that fit in 64 bits (the usual case: a step of milliseconds) is the
/// same in u64, without a 128-bit division.
#[inline]
fn floor_div(num: i128, den: i128) -> i128 {
    if let (Ok(n), Ok(q)) = (u64::try_from(num), u64::try_from(den)) {
        return i128::from(n / q);
    }
    num.div_euclid(den)
}

/// The numerator [`small_fraction`] gains when X grows by `d` with the
/// segments unchanged: it is affine in X, the first context weight losing
/// one a token and the second gaining one (nothing on an axis of one
/// context value). Below 2^91 in size within the bounds above.
fn small_fraction_step(d: u64, ([s0, s1], [c0, c1]): ([u64; 2], [u64; 2]), v: [u64; 4]) -> i128 {
    if c0 == c1 {
        return 0;
    }
    let (d, s0, s1) = (i128::from(d), i128::from(s0), i128::from(s1));
    let (ws0, ws1) = if s0 == s1 { (1, 0) } else { (s1 - d, d - s0) };
    let [v00, v01, v10, v11] = v.map(i128::from);
    (ws0 * (v01 - v00) + ws1 * (v11 - v10)) * d * FS_PER_PS
}

/// [`exact_bilinear`] in `f64`, for the far extrapolations that overflow
/// it (still deterministic: the same IEEE operations in the same order).
fn approx_bilinear(d: u64, x: u64, ([s0, s1], [c0, c1]): ([u64; 2], [u64; 2]), v: [u64; 4]) -> i128 {
    let (d, x) = (d as f64, x as f64);
    let (s0, s1, c0, c1) = (s0 as f64, s1 as f64, c0 as f64, c1 as f64);
    let ts = if s0 == s1 { 0.0 } else { (d - s0) / (s1 - s0) };
    let tc = if c0 == c1 { 0.0 } else { (x / d - c0) / (c1 - c0) };
    let [v00, v01, v10, v11] = v.map(|p| p as f64);
    let lo = v00 + (v01 - v00) * tc;
    let hi = v10 + (v11 - v10) * tc;
    // `as` saturates at the ends of i128 (and takes NaN to 0).
    ((lo + (hi - lo) * ts) * FS_PER_PS as f64) as i128
}

/// A step of `fs` femtoseconds, rounded up to whole nanoseconds.
#[inline]
fn fs_to_duration(fs: i128) -> SimDuration {
    if let Ok(fs) = u64::try_from(fs) {
        // The usual case, in u64: the same ceiling, without i128 divisions.
        return SimDuration::from_nanos(fs.div_ceil(FS_PER_NS as u64));
    }
    let ns = fs.div_euclid(FS_PER_NS) + i128::from(fs.rem_euclid(FS_PER_NS) != 0);
    SimDuration::from_nanos(u64::try_from(ns.max(0)).unwrap_or(u64::MAX))
}

impl StepTimeModel for Table2dStepTime {
    fn step_time(&self, b: &BatchShape) -> SimDuration {
        fs_to_duration(self.terms_fs(b).total())
    }

    /// A run's steps decode the same d sequences on X, X + d, X + 2d, …
    /// tokens of context: ⌈X/d⌉ grows by one a step, so the segments stay
    /// until it passes the context axis value that ends its segment, and
    /// within them `small_fraction`'s numerator grows by a constant. Each
    /// step then costs an addition and a division, not two searches and
    /// the bilinear form; the quotient is `small_bilinear`'s, and the
    /// step's time [`StepTimeModel::step_time`]'s (no prefill term: the
    /// prefill part of a decode step is empty). Outside
    /// `small_bilinear`'s bounds, a step at a time.
    fn decode_run(&self, shape: &mut BatchShape, each: &mut dyn FnMut(SimDuration) -> bool) {
        loop {
            shape.next_decode_step();
            let (d, x) = (shape.seqs, shape.decode_context);
            if !self.small || d == 0 || d >= SMALL_SEQS || x >= SMALL_CONTEXT {
                if !each(self.step_time(shape)) {
                    return;
                }
                continue;
            }
            let (i0, i1) = segment(&self.seqs, |&s| s < d);
            let (j0, j1) = context_segment(&self.context, d, x);
            let n = self.context.len();
            // Steps after this one in the same segments: ⌈X/d⌉ ≤ c[j1]
            // still holds (the last segment extends without end), and X
            // stays within the bounds.
            let in_segment = if j1 + 1 < n { self.context[j1] - x.div_ceil(d) } else { u64::MAX };
            let mut left = in_segment.min((SMALL_CONTEXT - 1 - x) / d);
            let v = |i: usize, j: usize| self.grid[i * n + j];
            let corners = [v(i0, j0), v(i0, j1), v(i1, j0), v(i1, j1)];
            let axes = ([self.seqs[i0], self.seqs[i1]], [self.context[j0], self.context[j1]]);
            let (mut num, den) = small_fraction(d, x, axes, corners);
            let gain = small_fraction_step(d, axes, corners);
            loop {
                if !each(fs_to_duration(floor_div(num, den).max(0))) {
                    return;
                }
                if left == 0 {
                    break;
                }
                shape.next_decode_step();
                num += gain;
                left -= 1;
            }
        }
    }

    fn terms(&self, b: &BatchShape) -> Vec<(&'static str, f64)> {
        let t = self.terms_fs(b);
        vec![
            ("prefill_table", fs_to_us(t.table)),
            ("prefill_batch_correction", fs_to_us(t.correction)),
            ("prefill_cached_attention", fs_to_us(t.cached)),
            ("decode_grid", fs_to_us(t.decode)),
            ("weights_read_once", fs_to_us(t.one_pass)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(seqs: &[u64], context: &[u64], us: &[&[f64]]) -> DecodeGrid {
        DecodeGrid { seqs: seqs.to_vec(), context: context.to_vec(), us: us.iter().map(|r| r.to_vec()).collect() }
    }

    /// Prefill table 1,024 → 20 ms, 8,192 → 200 ms; 0.778 ns a pair of
    /// the correction, 0.5 ns a cached pair; decode 1 or 3 sequences at
    /// 100 or 300 tokens of context.
    fn model() -> Table2dStepTime {
        let decode = grid(&[1, 3], &[100, 300], &[&[10.0, 30.0], &[20.0, 60.0]]);
        Table2dStepTime::from_spec(&[[1024.0, 20_000.0], [8192.0, 200_000.0]], 0.778, 0.5, &decode).unwrap()
    }

    fn prompts(n: u64, k: u64, cached: u64) -> BatchShape {
        let mut b = BatchShape::default();
        for _ in 0..n {
            b.add(k, cached, false);
        }
        b
    }

    fn decoding(contexts: &[u64]) -> BatchShape {
        let mut b = BatchShape::default();
        for &c in contexts {
            b.add(1, c, true);
        }
        b
    }

    fn ns(m: &Table2dStepTime, b: &BatchShape) -> u64 {
        m.step_time(b).as_nanos()
    }

    #[test]
    fn one_prompt_is_the_table() {
        let m = model();
        // Σ k(k+1)/2 = N(N+1)/2 for one prompt: no correction.
        assert_eq!(ns(&m, &prompts(1, 8192, 0)), 200_000_000);
        // Halfway between 1,024 and 8,192 tokens: (20 + 200)/2 = 110 ms.
        assert_eq!(ns(&m, &prompts(1, 4608, 0)), 110_000_000);
        // Past the end: one more segment's slope, 200 + 180 × 1,024/7,168
        // = 225.714285… ms, rounded up to the ns.
        assert_eq!(ns(&m, &prompts(1, 9216, 0)), 225_714_286);
    }

    #[test]
    fn a_batch_of_prompts_pays_less_attention_than_one_long_prompt() {
        let m = model();
        // 8 × 1,024 tokens: Σ k(k+1)/2 = 8 × 524,800 = 4,198,400 pairs;
        // one prompt of 8,192: 8,192 × 8,193/2 = 33,558,528 pairs, so
        // 29,360,128 fewer, × 0.778 ns = 22,842,179.584 ns.
        // 200,000,000 − 22,842,179.584 = 177,157,820.416 ns, rounded up.
        let b = prompts(8, 1024, 0);
        assert_eq!(ns(&m, &b), 177_157_821);
        let terms = m.terms(&b);
        assert_eq!(terms[0], ("prefill_table", 200_000.0));
        assert_eq!(terms[1], ("prefill_batch_correction", -22_842.179584));
        assert_eq!(terms[2], ("prefill_cached_attention", 0.0));
        assert_eq!(terms[3], ("decode_grid", 0.0));
    }

    #[test]
    fn cached_tokens_cost_their_attention_pairs() {
        let m = model();
        // 256 tokens on 768 cached: P(256) extrapolates the first segment,
        // 20,000 − 180,000 × 768/7,168 = 714.285714… µs (in whole ps,
        // 714,285,715); 256 × 768 = 196,608 cached pairs × 0.5 ns = 98,304
        // ns. 714,285.715 + 98,304 = 812,589.715 ns, rounded up.
        assert_eq!(ns(&m, &prompts(1, 256, 768)), 812_590);
    }

    #[test]
    fn the_decode_grid_is_bilinear_in_sequences_and_mean_context() {
        let m = model();
        // At the corners, the grid.
        assert_eq!(ns(&m, &decoding(&[100])), 10_000);
        assert_eq!(ns(&m, &decoding(&[300, 300, 300])), 60_000);
        // 2 sequences at 200 on average (150 + 250): rows 1 → 20 µs, 3 → 40
        // µs at context 200, 30 µs halfway.
        assert_eq!(ns(&m, &decoding(&[150, 250])), 30_000);
        // Mean context 601/3 = 200.333…: 20 + 40 × 100.333…/200
        // = 24,040/600 µs = 40.0666… µs, rounded up to 40,067 ns.
        assert_eq!(ns(&m, &decoding(&[200, 200, 201])), 40_067);
        // Outside: 5 sequences at 500. Row 1 at 500: 10 + 20 × 400/200 = 50;
        // row 3: 20 + 40 × 2 = 100; 5 sequences: 50 + 50 × (5 − 1)/2 = 150 µs.
        assert_eq!(ns(&m, &decoding(&[500; 5])), 150_000);
        // Below the grid: 1 sequence at context 0, 10 − 20 × 100/200 = 0 µs.
        assert_eq!(ns(&m, &decoding(&[0])), 0);
        // Further below, negative, clamped at 0: 1 sequence at 0 on a grid
        // whose first column is 100 and 400 µs further on.
        let steep = grid(&[1, 3], &[100, 300], &[&[10.0, 410.0], &[20.0, 60.0]]);
        let m = Table2dStepTime::from_spec(&[[1.0, 5.0]], 0.0, 0.0, &steep).unwrap();
        assert_eq!(ns(&m, &decoding(&[0])), 0);
    }

    #[test]
    fn summed_a_mixed_step_pays_both_terms_and_an_empty_part_nothing() {
        let m = model().with_mixed(MixedStep::PrefillPlusDecode);
        let mut b = prompts(1, 8192, 0);
        b.add(1, 100, true);
        // 200 ms of prefill + 10 µs of decode.
        assert_eq!(ns(&m, &b), 200_010_000);
        assert_eq!(ns(&m, &BatchShape::default()), 0);
    }

    /// Prefill 1 → 5 ms, 1,025 → 21 ms; decode 1 or 9 sequences at 0 or
    /// 1,000 tokens: floors Fp = P(1) = 5 ms, Fd = 4 ms.
    fn floored() -> Table2dStepTime {
        let decode = grid(&[1, 9], &[0, 1000], &[&[4000.0, 4100.0], &[4200.0, 5000.0]]);
        Table2dStepTime::from_spec(&[[1.0, 5000.0], [1025.0, 21_000.0]], 0.0, 0.5, &decode).unwrap()
    }

    #[test]
    fn a_mixed_step_reads_the_weights_once() {
        let m = floored();
        assert_eq!(m.floors_us(), (5000.0, 4000.0));
        // A prompt of 1,025 tokens beside 9 sequences at 1,000: P = 21 ms,
        // D = 5 ms; one pass: max(5, 4) + (21 − 5) + (5 − 4) = 22 ms (summed:
        // 26 ms, the 4 ms floor paid twice).
        let mut b = prompts(1, 1025, 0);
        b.add_many(9, 1, 1000, true);
        assert_eq!(ns(&m, &b), 22_000_000);
        assert_eq!(ns(&m.clone().with_mixed(MixedStep::PrefillPlusDecode), &b), 26_000_000);
        let t = m.terms(&b);
        assert_eq!(t[0], ("prefill_table", 21_000.0));
        assert_eq!(t[3], ("decode_grid", 5000.0));
        assert_eq!(t[4], ("weights_read_once", -4000.0));
        // A decode rank recomputing a landed handoff's last prompt token
        // (1 token on 1,000 cached: P(1) + 1,000 pairs × 0.5 ns = 5,000.5
        // µs) beside the same 9: 5,000 + 0.5 + (5,000 − 4,000) = 6,000.5
        // µs, the decode term plus Fp − Fd and the token's attention.
        let mut r = BatchShape::default();
        r.add(1, 1000, false);
        r.add_many(9, 1, 1000, true);
        assert_eq!(ns(&m, &r), 6_000_500);
        // A step of one part is its term alone.
        assert_eq!(ns(&m, &prompts(1, 1025, 0)), 21_000_000);
        assert_eq!(ns(&m, &decoding(&[1000; 9])), 5_000_000);
    }

    #[test]
    fn one_value_axes_are_constant_along_them() {
        let decode = grid(&[4], &[1000], &[&[7.0]]);
        let m = Table2dStepTime::from_spec(&[[1.0, 5.0]], 0.0, 0.0, &decode).unwrap();
        assert_eq!(ns(&m, &decoding(&[1, 2, 3])), 7_000);
        assert_eq!(ns(&m, &prompts(3, 100, 0)), 5_000);
        // One context value, two sequence values: linear in sequences only.
        let decode = grid(&[1, 2], &[1000], &[&[10.0], &[20.0]]);
        let m = Table2dStepTime::from_spec(&[[1.0, 5.0]], 0.0, 0.0, &decode).unwrap();
        assert_eq!(ns(&m, &decoding(&[5, 5, 5, 5])), 40_000);
    }

    #[test]
    fn far_extrapolations_saturate_rather_than_overflow() {
        let m = model();
        let b = BatchShape::decoding(u64::MAX / 4, u64::MAX / 2);
        assert!(m.step_time(&b) > SimDuration::from_nanos(0));
        let mut p = BatchShape::default();
        p.add(u64::MAX / 4, u64::MAX / 4, false);
        let _ = m.step_time(&p);
    }

    #[test]
    fn refused_specs() {
        let ok = grid(&[1, 3], &[100, 300], &[&[10.0, 30.0], &[20.0, 60.0]]);
        let points = [[1.0, 5.0]];
        assert!(Table2dStepTime::from_spec(&points, 0.0, 0.0, &ok).is_some());
        assert!(Table2dStepTime::from_spec(&points, -1.0, 0.0, &ok).is_none());
        assert!(Table2dStepTime::from_spec(&points, 0.0, f64::NAN, &ok).is_none());
        assert!(Table2dStepTime::from_spec(&[], 0.0, 0.0, &ok).is_none());
        assert!(
            Table2dStepTime::from_spec(&points, 0.0, 0.0, &grid(&[0, 3], &[100, 300], &[&[1.0, 1.0], &[1.0, 1.0]]))
                .is_none()
        );
        assert!(
            Table2dStepTime::from_spec(&points, 0.0, 0.0, &grid(&[3, 3], &[100, 300], &[&[1.0, 1.0], &[1.0, 1.0]]))
                .is_none()
        );
        assert!(Table2dStepTime::from_spec(&points, 0.0, 0.0, &grid(&[1, 3], &[100, 300], &[&[1.0, 1.0]])).is_none());
        assert!(
            Table2dStepTime::from_spec(&points, 0.0, 0.0, &grid(&[1, 3], &[100, 300], &[&[1.0, 1.0], &[1.0]]))
                .is_none()
        );
        assert!(
            Table2dStepTime::from_spec(&points, 0.0, 0.0, &grid(&[1, 3], &[100, 300], &[&[1.0, 1.0], &[1.0, -1.0]]))
                .is_none()
        );
    }

    proptest::proptest! {
        /// Within its bounds, the unchecked form is the checked one, bit
        /// for bit, extrapolations (X past c1·d, d past s1) included.
        #[test]
        fn the_unchecked_bilinear_is_the_checked_one(
            s0 in 1u64..SMALL_SEQS, ds in 0u64..4096, d in 1u64..SMALL_SEQS,
            c0 in 0u64..SMALL_AXIS_CONTEXT, dc in 0u64..1 << 20, x in 0u64..SMALL_CONTEXT,
            v in proptest::array::uniform4(0u64..SMALL_PS),
        ) {
            let (s1, c1) = ((s0 + ds).min(SMALL_SEQS - 1), (c0 + dc).min(SMALL_AXIS_CONTEXT - 1));
            let axes = ([s0, s1], [c0, c1]);
            proptest::prop_assert_eq!(Some(small_bilinear(d, x, axes, v)), exact_bilinear(d, x, axes, v));
        }

        /// At a measured grid's magnitudes (steps of milliseconds, contexts
        /// of thousands of tokens) the quotient is taken in u64: still the
        /// checked one, negative extrapolations (the i128 path) included.
        #[test]
        fn the_u64_quotient_is_the_checked_one(
            s0 in 1u64..256, ds in 0u64..64, d in 1u64..512,
            c0 in 0u64..8_192, dc in 0u64..4_096, x in 0u64..1 << 23,
            v in proptest::array::uniform4(0u64..1 << 24),
        ) {
            let axes = ([s0, s0 + ds], [c0, c0 + dc]);
            proptest::prop_assert_eq!(Some(small_bilinear(d, x, axes, v)), exact_bilinear(d, x, axes, v));
        }

        /// A run priced incrementally is the run priced a step at a time,
        /// duration for duration: grids that fall as well as rise (steps
        /// clamped at 0), axes of one value, runs that cross context
        /// segments, leave the grid or the small bounds, and first steps
        /// with a prompt in them.
        #[test]
        fn a_run_priced_incrementally_is_priced_step_by_step(
            seqs in proptest::collection::btree_set(1u64..600, 1..5),
            context in proptest::collection::btree_set(0u64..20_000, 1..7),
            ps in proptest::collection::vec(0u64..1 << 26, 30),
            d in 1u64..700,
            x in proptest::prop_oneof![0u64..1 << 22, SMALL_CONTEXT - (1 << 16)..SMALL_CONTEXT + (1 << 10)],
            prompt in proptest::prop_oneof![proptest::strategy::Just(0u64), 1u64..4096],
            steps in 1usize..400,
        ) {
            let (seqs, context): (Vec<u64>, Vec<u64>) = (seqs.into_iter().collect(), context.into_iter().collect());
            let us: Vec<Vec<f64>> = (0..seqs.len())
                .map(|i| (0..context.len()).map(|j| ps[(i * context.len() + j) % ps.len()] as f64 / 1e6).collect())
                .collect();
            let decode = DecodeGrid { seqs, context, us };
            let m = Table2dStepTime::from_spec(&[[1.0, 5.0], [4096.0, 900.0]], 0.1, 0.05, &decode).unwrap();
            let mut first = BatchShape::decoding(d, x);
            if prompt > 0 {
                first.add(prompt, 100, false);
            }
            let mut by_step = Vec::new();
            let mut shape = first;
            for _ in 0..steps {
                shape.next_decode_step();
                by_step.push(m.step_time(&shape));
            }
            let mut run = Vec::new();
            let mut last = first;
            m.decode_run(&mut last, &mut |t| {
                run.push(t);
                run.len() < steps
            });
            proptest::prop_assert_eq!(run, by_step);
            proptest::prop_assert_eq!(last, shape);
        }

        /// A mixed step costs no more than its two terms added and no less
        /// than the larger of them.
        #[test]
        fn one_pass_lies_between_the_larger_part_and_the_sum(
            n in 1u64..5000, cached in 0u64..5000, d in 1u64..40, c in 0u64..3000,
        ) {
            let m = floored();
            let mut b = prompts(1, n, cached);
            b.add_many(d, 1, c, true);
            let (p, dec) = (ns(&m, &prompts(1, n, cached)), ns(&m, &BatchShape::decoding(d, d * c)));
            let sum = ns(&m.clone().with_mixed(MixedStep::PrefillPlusDecode), &b);
            let one = ns(&m, &b);
            proptest::prop_assert!(one <= sum && one + 1 >= p.max(dec), "{one} {sum} {p} {dec}");
        }

        /// The context segment of mean context X/d, found as c < ⌈X/d⌉, is
        /// the one of c·d < X.
        #[test]
        fn the_mean_context_segment_is_exact(
            axis in proptest::collection::btree_set(0u64..10_000, 1..12), d in 1u64..300,
            at in 0usize..12, off in -2i64..=2,
        ) {
            let axis: Vec<u64> = axis.into_iter().collect();
            // X at an axis point's c·d, or within 2 tokens of it.
            let x = (axis[at % axis.len()] * d).saturating_add_signed(off);
            let by_product = segment(&axis, |&c| u128::from(c) * u128::from(d) < u128::from(x));
            proptest::prop_assert_eq!(context_segment(&axis, d, x), by_product);
        }
    }
}
