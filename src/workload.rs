//! The `[workload]` table of a scenario and the request streams it makes.
//!
//! A workload is either **synthetic** (arrivals, prompt and output lengths
//! drawn from distributions) or a **trace** replayed row by row
//! ([`crate::trace`]). Either way [`WorkloadSpec::source`] gives a
//! [`WorkloadSource`], an [`actors::workload::RequestSource`] that makes one
//! request at a time, and [`WorkloadSpec::arrival_mode`] says whether
//! requests enter at their arrival times (open loop) or at a fixed
//! concurrency (closed loop).
//!
//! ```toml
//! [workload]
//! requests = 2000
//! arrival = { kind = "poisson", rate_per_s = 4.0 }
//! prompt_tokens = { kind = "lognormal", mean = 4000, std = 3000, max = 32000 }
//! output_tokens = { kind = "uniform", min = 100, max = 500 }
//! shared_prefix = { groups = 8, tokens = 1024 }
//! priorities = [{ value = 0, weight = 3.0 }, { value = 1, weight = 1.0 }]
//! ```
//!
//! # Determinism
//!
//! Every draw comes from a ChaCha stream of the scenario seed
//! ([`sim_core::rng::stream_for`]); each quantity has its own stream
//! (`workload/arrival`, `workload/prompt`, `workload/output`,
//! `workload/prefix`, `workload/priority`), so changing the arrival rate leaves every prompt and
//! output length as it was (common random numbers across sweep points).
//! Sampled gaps are rounded once to whole nanoseconds and added as
//! integers; the first request arrives at time 0.
//!
//! The distributions come from `rand_distr`. Its exponential and normal
//! ziggurats call the platform's `exp` and `ln` (glibc's on x86-64 Linux)
//! in their rare wedge and tail branches; its gamma and log-normal go
//! through `num-traits`, which is `libm` in a build of pdsim and the
//! platform's in a test build (criterion and proptest turn its `std` on).
//! Where two maths libraries round a last bit differently, a draw can
//! differ only if that bit moves a gap across a whole nanosecond or a
//! length across a whole token: about one draw in 10¹⁰ or fewer. pdsim's
//! own `ln`s (the log-normal's parameters here, `crate::accuracy`'s
//! arrivals) are `libm`'s.

use actors::router::{MAX_ARRIVAL, MAX_REQUEST_TOKENS};
use actors::units::Tokens;
use actors::workload::{ArrivalMode, PrefixIds, RequestSource, RequestSpec, WorkloadError, mix};
use rand::Rng;
use rand_distr::{Distribution, Exp, Gamma, LogNormal, Normal};
use serde::{Deserialize, Serialize};
use sim_core::rng::{ActorRng, stream_for};
use sim_core::{SimDuration, SimTime};

use crate::check::{FieldError, at_least_one, non_negative, positive};
use crate::trace::{TraceReader, TraceSpec};

/// Tokens one id of a synthetic shared prefix covers (vLLM's default block
/// size; any pool block size works, see [`PrefixIds::key_through`]).
pub const SHARED_PREFIX_BLOCK_TOKENS: u64 = 16;

/// The `[workload]` table: what requests a run serves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// How many requests. Required for a synthetic workload; for a trace,
    /// absent means every row (up to the trace's `limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    /// When requests enter. Required for a synthetic workload; a trace
    /// defaults to its own timestamps (`kind = "trace"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival: Option<ArrivalSpec>,
    /// Prompt lengths of a synthetic workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<LengthSpec>,
    /// Output lengths of a synthetic workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<LengthSpec>,
    /// Shared-prefix groups of a synthetic workload, for prefix caching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_prefix: Option<SharedPrefixSpec>,
    /// vLLM request priorities of a synthetic workload, drawn per request
    /// by weight (absent: every request 0); ranks under
    /// `policy = "priority"` follow them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priorities: Option<Vec<PriorityShare>>,
    /// A trace to replay instead of drawing requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceSpec>,
}

/// When requests enter the system.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ArrivalSpec {
    /// Exponential gaps at `rate_per_s` requests per second.
    Poisson {
        /// Mean requests per second.
        rate_per_s: f64,
    },
    /// Gamma-distributed gaps with mean `1 / rate_per_s` and coefficient of
    /// variation `cv` (1 is Poisson; above 1 is burstier).
    Gamma {
        /// Mean requests per second.
        rate_per_s: f64,
        /// Standard deviation of a gap over its mean.
        cv: f64,
    },
    /// `concurrency` requests in flight: one enters whenever one leaves.
    ClosedLoop {
        /// Requests in flight.
        concurrency: u32,
    },
    /// The trace's own timestamps (the default with a trace; refused
    /// without one).
    Trace,
}

/// A distribution of token counts. Samples are rounded to the nearest
/// integer and clamped to at least 1 (and to `max` where given).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LengthSpec {
    /// Always `value`.
    Fixed {
        /// The length, at least 1.
        value: u64,
    },
    /// Uniform over the integers `min..=max`.
    Uniform {
        /// Smallest length, at least 1.
        min: u64,
        /// Largest length, at least `min`.
        max: u64,
    },
    /// Normal with `mean` and `std` (of the token count).
    Normal {
        /// Mean, > 0.
        mean: f64,
        /// Standard deviation, >= 0.
        std: f64,
        /// Upper clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u64>,
    },
    /// Log-normal whose token count has mean `mean` and standard deviation
    /// `std` (not those of the log): `σ² = ln(1 + std²/mean²)`,
    /// `μ = ln(mean) − σ²/2`.
    Lognormal {
        /// Mean of the token count, > 0.
        mean: f64,
        /// Standard deviation of the token count, >= 0.
        std: f64,
        /// Upper clamp.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u64>,
    },
    /// One of `values`, each equally likely.
    Empirical {
        /// The lengths to pick from, each at least 1.
        values: Vec<u64>,
    },
}

/// Shared-prefix groups: each request joins one of `groups` uniformly, and
/// its first `tokens` prompt tokens (capped at its prompt) are the group's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedPrefixSpec {
    /// Number of groups, at least 1.
    pub groups: u64,
    /// Tokens of the shared prefix, at least 1.
    pub tokens: u64,
}

/// One priority of a synthetic workload and its share of the requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriorityShare {
    /// The priority (vLLM's: lower is served first).
    pub value: i32,
    /// Its weight, positive: its share is the weight over their sum.
    pub weight: f64,
}

impl WorkloadSpec {
    /// Checks every field; paths in the [`FieldError`] are relative to the
    /// `[workload]` table (`arrival.rate_per_s`).
    pub fn check(&self) -> Result<(), FieldError> {
        if let Some(n) = self.requests {
            at_least_one("requests", n)?;
        }
        match &self.trace {
            None => {
                if self.requests.is_none() {
                    return Err(FieldError::new(
                        "requests",
                        "missing field (a synthetic workload needs a request count)",
                    ));
                }
                match &self.arrival {
                    None => {
                        return Err(FieldError::new(
                            "arrival",
                            "missing field (poisson, gamma or closed_loop; or give a [workload.trace])",
                        ));
                    }
                    Some(ArrivalSpec::Trace) => {
                        return Err(FieldError::new("arrival", "kind \"trace\" needs a [workload.trace] to replay"));
                    }
                    Some(a) => a.check().map_err(|i| i.under("arrival"))?,
                }
                let Some(prompt) = &self.prompt_tokens else {
                    return Err(FieldError::new("prompt_tokens", "missing field (a synthetic workload needs one)"));
                };
                prompt.check().map_err(|i| i.under("prompt_tokens"))?;
                let Some(output) = &self.output_tokens else {
                    return Err(FieldError::new("output_tokens", "missing field (a synthetic workload needs one)"));
                };
                output.check().map_err(|i| i.under("output_tokens"))?;
                let (p, o) = (prompt.largest(), output.largest());
                if p + o > MAX_REQUEST_TOKENS {
                    return Err(FieldError::new(
                        "output_tokens",
                        format!(
                            "up to {p} prompt and {o} output tokens: a request holds at most {MAX_REQUEST_TOKENS} together"
                        ),
                    ));
                }
                if let Some(sp) = &self.shared_prefix {
                    at_least_one("shared_prefix.groups", sp.groups)?;
                    at_least_one("shared_prefix.tokens", sp.tokens)?;
                }
                if let Some(ps) = &self.priorities {
                    if ps.is_empty() {
                        return Err(FieldError::new("priorities", "must list at least one { value, weight }"));
                    }
                    for (i, p) in ps.iter().enumerate() {
                        if !(p.weight.is_finite() && p.weight > 0.0) {
                            return Err(FieldError::new(
                                format!("priorities[{i}].weight"),
                                format!("must be a positive number, got {}", p.weight),
                            ));
                        }
                    }
                }
            }
            Some(trace) => {
                for (name, present) in [
                    ("prompt_tokens", self.prompt_tokens.is_some()),
                    ("output_tokens", self.output_tokens.is_some()),
                    ("shared_prefix", self.shared_prefix.is_some()),
                    ("priorities", self.priorities.is_some()),
                ] {
                    if present {
                        return Err(FieldError::new(name, "not allowed with a trace (the trace gives every request)"));
                    }
                }
                if let Some(a) = &self.arrival {
                    a.check().map_err(|i| i.under("arrival"))?;
                }
                trace.check().map_err(|i| i.under("trace"))?;
            }
        }
        Ok(())
    }

    /// Open loop at the arrival times, or closed loop at a concurrency.
    pub fn arrival_mode(&self) -> ArrivalMode {
        match self.arrival {
            Some(ArrivalSpec::ClosedLoop { concurrency }) => ArrivalMode::Closed { concurrency },
            _ => ArrivalMode::Open,
        }
    }

    /// The request count the file gives: `requests`, capped by a trace's
    /// `limit`; `None` for a trace with neither (every row).
    pub fn requests(&self) -> Option<u64> {
        let limit = self.trace.as_ref().and_then(|t| t.limit);
        match (self.requests, limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Refuses, before anything runs, a drawn arrival process that is sure
    /// to pass the end of simulated time: a synthetic workload whose
    /// `requests` (or the file's count) Poisson or gamma arrivals at
    /// `rate_per_s` would bring the last one after [`MAX_ARRIVAL`] even six
    /// standard deviations early. (The sum of n − 1 gaps has mean
    /// (n − 1) / rate and standard deviation cv times that over √(n − 1).)
    /// Without it, a long run would simulate until its draws got there and
    /// only then stop; one closer to the end still stops at the request
    /// that passes it, naming it. The text names the field (and `from`,
    /// where a `requests` that replaces the file's came from:
    /// `--requests`); the caller places it in the scenario file.
    ///
    /// # Errors
    /// The field and what is wrong.
    pub fn check_arrival_span(&self, requests: Option<u64>, from: &str) -> Result<(), String> {
        // (A trace's rows may be fewer than its cap: only a synthetic
        // workload's count is known before reading.)
        if self.trace.is_some() {
            return Ok(());
        }
        let cap = requests.or(self.requests);
        let (rate, cv) = match self.arrival {
            Some(ArrivalSpec::Poisson { rate_per_s }) => (rate_per_s, 1.0),
            Some(ArrivalSpec::Gamma { rate_per_s, cv }) => (rate_per_s, cv),
            _ => return Ok(()),
        };
        let Some(n) = cap.filter(|&n| n >= 2) else { return Ok(()) };
        if rate > 1e9 {
            // Gaps under a nanosecond are rounded to whole ones: no bound.
            return Ok(());
        }
        let gaps = (n - 1) as f64;
        let mean = gaps / rate;
        let early = mean * (1.0 - 6.0 * cv / gaps.sqrt());
        if early > MAX_ARRIVAL.as_secs_f64() {
            let count = if requests.is_some() { format!(" ({from})") } else { String::new() };
            return Err(format!(
                "workload.arrival.rate_per_s: {n} requests{count} at {rate} per second arrive over {mean:.3e} s on \
                 average, past the end of simulated time (arrivals must come within {:.0} s); raise the rate or \
                 serve fewer requests",
                MAX_ARRIVAL.as_secs_f64()
            ));
        }
        Ok(())
    }

    /// The request stream for `seed`: `requests` (when given) replaces the
    /// file's `requests` (a trace's `limit` still caps it).
    ///
    /// # Errors
    /// A trace that cannot be opened or whose header is wrong; the text
    /// names the file (and line).
    pub fn source(&self, seed: u64, requests: Option<u64>) -> Result<WorkloadSource, WorkloadError> {
        let cap = match requests {
            Some(n) => Some(self.trace.as_ref().and_then(|t| t.limit).map_or(n, |l| l.min(n))),
            None => self.requests(),
        };
        let retime = match &self.arrival {
            Some(a @ (ArrivalSpec::Poisson { .. } | ArrivalSpec::Gamma { .. })) => {
                Some(ArrivalClock::new(a, stream_for(seed, "workload/arrival")))
            }
            _ => None,
        };
        let closed = matches!(self.arrival, Some(ArrivalSpec::ClosedLoop { .. }));
        let inner = match &self.trace {
            Some(trace) => {
                // The trace's timestamps matter only when nothing replaces them.
                let reader = TraceReader::open(trace, retime.is_none() && !closed)?;
                Inner::Trace(Box::new(reader))
            }
            None => Inner::Synthetic(Box::new(SyntheticSource::new(self, seed)?)),
        };
        Ok(WorkloadSource { inner, retime, closed, cap, stats: SourceStats::default(), file: String::new() })
    }
}

/// An arrival rate: positive, and at least one request in 11.6 days
/// (1e-6 per second), since slower rates only push simulated time past its
/// range.
fn rate(path: &str, v: f64) -> Result<(), FieldError> {
    positive(path, v)?;
    if v < 1e-6 {
        return Err(FieldError::new(path, format!("must be at least 1e-6 requests per second, got {v}")));
    }
    Ok(())
}

impl ArrivalSpec {
    fn check(&self) -> Result<(), FieldError> {
        match *self {
            ArrivalSpec::Poisson { rate_per_s } => rate("rate_per_s", rate_per_s),
            ArrivalSpec::Gamma { rate_per_s, cv } => {
                rate("rate_per_s", rate_per_s)?;
                positive("cv", cv)
            }
            ArrivalSpec::ClosedLoop { concurrency } => at_least_one("concurrency", u64::from(concurrency)),
            ArrivalSpec::Trace => Ok(()),
        }
    }
}

impl LengthSpec {
    /// Checks the parameters; paths are relative to the distribution.
    pub fn check(&self) -> Result<(), FieldError> {
        self.check_ranges()?;
        let largest = self.largest();
        if largest > MAX_REQUEST_TOKENS - 1 {
            let field = match self {
                LengthSpec::Fixed { .. } => "value",
                LengthSpec::Empirical { .. } => "values",
                _ => "max",
            };
            return Err(FieldError::new(
                field,
                format!(
                    "{largest} tokens is more than a request may hold ({MAX_REQUEST_TOKENS} prompt and output together)"
                ),
            ));
        }
        if self.sampler().is_none() {
            return Err(FieldError::new("std", "out of range: the distribution cannot be sampled"));
        }
        Ok(())
    }

    /// The most tokens a draw can give.
    pub fn largest(&self) -> u64 {
        match self {
            LengthSpec::Fixed { value } => *value,
            LengthSpec::Uniform { max, .. } => *max,
            LengthSpec::Normal { max, .. } | LengthSpec::Lognormal { max, .. } => max.unwrap_or(UNBOUNDED_MAX),
            LengthSpec::Empirical { values } => values.iter().copied().max().unwrap_or(0),
        }
    }

    fn check_ranges(&self) -> Result<(), FieldError> {
        match self {
            LengthSpec::Fixed { value } => at_least_one("value", *value),
            LengthSpec::Uniform { min, max } => {
                at_least_one("min", *min)?;
                if max < min {
                    return Err(FieldError::new("max", format!("must be >= min {min}, got {max}")));
                }
                Ok(())
            }
            LengthSpec::Normal { mean, std, max } | LengthSpec::Lognormal { mean, std, max } => {
                positive("mean", *mean)?;
                non_negative("std", *std)?;
                if let Some(m) = max {
                    at_least_one("max", *m)?;
                }
                Ok(())
            }
            LengthSpec::Empirical { values } => {
                if values.is_empty() {
                    return Err(FieldError::new("values", "must not be empty"));
                }
                match values.iter().position(|&v| v == 0) {
                    Some(i) => Err(FieldError::new(format!("values[{i}]"), "must be >= 1, got 0")),
                    None => Ok(()),
                }
            }
        }
    }

    /// The mean of the distribution before rounding and clamping (for
    /// `uniform` and `empirical`, the exact mean of the samples).
    pub fn mean(&self) -> f64 {
        match self {
            LengthSpec::Fixed { value } => *value as f64,
            LengthSpec::Uniform { min, max } => (*min as f64 + *max as f64) / 2.0,
            LengthSpec::Normal { mean, .. } | LengthSpec::Lognormal { mean, .. } => *mean,
            LengthSpec::Empirical { values } => values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64,
        }
    }

    /// A sampler of this distribution; `None` when a parameter is out of
    /// range (a checked spec always gives one).
    pub fn sampler(&self) -> Option<LengthSampler> {
        let s = match self {
            LengthSpec::Fixed { value } => LengthSampler::Fixed(*value),
            LengthSpec::Uniform { min, max } if min <= max => LengthSampler::Uniform(*min, *max),
            LengthSpec::Uniform { .. } => return None,
            LengthSpec::Normal { mean, std, max } => {
                LengthSampler::Normal(Normal::new(*mean, *std).ok()?, max.unwrap_or(UNBOUNDED_MAX))
            }
            LengthSpec::Lognormal { mean, std, max } => {
                if !(mean.is_finite() && *mean > 0.0) {
                    return None;
                }
                // libm, not the platform's log, so every machine gets the same bits.
                let sigma2 = libm::log(1.0 + (std / mean) * (std / mean));
                let mu = libm::log(*mean) - sigma2 / 2.0;
                LengthSampler::LogNormal(LogNormal::new(mu, sigma2.sqrt()).ok()?, max.unwrap_or(UNBOUNDED_MAX))
            }
            LengthSpec::Empirical { values } if !values.is_empty() => LengthSampler::Empirical(values.clone()),
            LengthSpec::Empirical { .. } => return None,
        };
        Some(s)
    }
}

/// Where a `normal` or `lognormal` length without a `max` is clamped: half
/// of what a request may hold, so that any prompt and output drawn fit
/// together (no real draw comes near it).
pub const UNBOUNDED_MAX: u64 = MAX_REQUEST_TOKENS / 2;

/// Draws token counts from a [`LengthSpec`]: rounded, at least 1, at most
/// the spec's `max` (or [`UNBOUNDED_MAX`]).
#[derive(Clone, Debug)]
pub enum LengthSampler {
    /// Always this.
    Fixed(u64),
    /// Uniform over `min..=max`.
    Uniform(u64, u64),
    /// Normal, then clamped to `1..=max`.
    Normal(Normal<f64>, u64),
    /// Log-normal, then clamped to `1..=max`.
    LogNormal(LogNormal<f64>, u64),
    /// One of the values.
    Empirical(Vec<u64>),
}

impl LengthSampler {
    /// One token count.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Tokens {
        let n = match self {
            LengthSampler::Fixed(v) => *v,
            LengthSampler::Uniform(lo, hi) => rng.random_range(*lo..=*hi),
            LengthSampler::Normal(d, max) => round_clamp(d.sample(rng), *max),
            LengthSampler::LogNormal(d, max) => round_clamp(d.sample(rng), *max),
            LengthSampler::Empirical(values) => values[rng.random_range(0..values.len())],
        };
        Tokens::new(n.max(1))
    }
}

/// Rounds `x` to the nearest integer in `1..=max` (NaN gives 1).
fn round_clamp(x: f64, max: u64) -> u64 {
    let r = x.round();
    if r.is_nan() || r < 1.0 {
        1
    } else if r >= max as f64 {
        max
    } else {
        r as u64
    }
}

/// Open-loop arrival times from a Poisson or Gamma gap distribution: 0,
/// then each time plus one sampled gap (rounded to whole nanoseconds).
#[derive(Clone, Debug)]
struct ArrivalClock {
    gaps: Gaps,
    rng: ActorRng,
    next: Option<SimTime>,
}

#[derive(Clone, Debug)]
enum Gaps {
    Exp(Exp<f64>),
    Gamma(Gamma<f64>),
    Zero,
}

impl ArrivalClock {
    fn new(spec: &ArrivalSpec, rng: ActorRng) -> Self {
        let gaps = match *spec {
            ArrivalSpec::Poisson { rate_per_s } => Exp::new(rate_per_s).map_or(Gaps::Zero, Gaps::Exp),
            // Shape k = 1/cv², scale θ = 1/(rate·k): mean kθ = 1/rate, cv = 1/√k.
            ArrivalSpec::Gamma { rate_per_s, cv } => {
                let k = 1.0 / (cv * cv);
                Gamma::new(k, 1.0 / (rate_per_s * k)).map_or(Gaps::Zero, Gaps::Gamma)
            }
            ArrivalSpec::ClosedLoop { .. } | ArrivalSpec::Trace => Gaps::Zero,
        };
        ArrivalClock { gaps, rng, next: None }
    }

    fn next_arrival(&mut self) -> SimTime {
        let t = match self.next {
            None => SimTime::ZERO,
            Some(prev) => {
                let secs = match &self.gaps {
                    Gaps::Exp(d) => d.sample(&mut self.rng),
                    Gaps::Gamma(d) => d.sample(&mut self.rng),
                    Gaps::Zero => 0.0,
                };
                prev.saturating_add(SimDuration::from_secs_f64(secs))
            }
        };
        self.next = Some(t);
        t
    }
}

/// Requests drawn from the distributions of a synthetic workload.
#[derive(Clone, Debug)]
struct SyntheticSource {
    index: u64,
    prompt: LengthSampler,
    output: LengthSampler,
    prompt_rng: ActorRng,
    output_rng: ActorRng,
    prefix: Option<(SharedPrefixSpec, ActorRng)>,
    /// The priorities with their cumulative weights, and their stream.
    priorities: Option<(Vec<(f64, i32)>, ActorRng)>,
    /// Each group's ids of its whole prefix, made at its first prompt that
    /// runs past the prefix (every such prompt of the group has them):
    /// empty until then, and kept only while all groups' fit in
    /// [`PREFIX_CACHE_IDS`] and there are at most [`PREFIX_CACHE_GROUPS`].
    group_ids: Vec<Vec<u64>>,
}

/// The most ids the shared-prefix groups keep made (8 MiB).
const PREFIX_CACHE_IDS: u64 = 1 << 20;

/// The most groups whose ids are kept made (their lists, 1.5 MiB).
const PREFIX_CACHE_GROUPS: u64 = 1 << 16;

impl SyntheticSource {
    fn new(spec: &WorkloadSpec, seed: u64) -> Result<Self, WorkloadError> {
        let sampler = |name: &str, d: &Option<LengthSpec>| {
            d.as_ref()
                .and_then(LengthSpec::sampler)
                .ok_or_else(|| WorkloadError(format!("workload.{name}: missing or out of range")))
        };
        Ok(SyntheticSource {
            index: 0,
            prompt: sampler("prompt_tokens", &spec.prompt_tokens)?,
            output: sampler("output_tokens", &spec.output_tokens)?,
            prompt_rng: stream_for(seed, "workload/prompt"),
            output_rng: stream_for(seed, "workload/output"),
            prefix: spec.shared_prefix.clone().map(|sp| (sp, stream_for(seed, "workload/prefix"))),
            priorities: spec.priorities.as_ref().map(|ps| {
                let mut sum = 0.0;
                let cumulative = ps
                    .iter()
                    .map(|p| {
                        sum += p.weight;
                        (sum, p.value)
                    })
                    .collect();
                (cumulative, stream_for(seed, "workload/priority"))
            }),
            group_ids: Vec::new(),
        })
    }

    /// The next request, with arrival 0 (the caller sets it).
    fn next(&mut self) -> RequestSpec {
        let prompt = self.prompt.sample(&mut self.prompt_rng);
        let output = self.output.sample(&mut self.output_rng);
        let prefix = match &mut self.prefix {
            Some((sp, rng)) => {
                let group = rng.random_range(0..sp.groups);
                let whole = sp.tokens / SHARED_PREFIX_BLOCK_TOKENS;
                let cached = whole > 0
                    && sp.groups <= PREFIX_CACHE_GROUPS
                    && sp.groups.saturating_mul(whole) <= PREFIX_CACHE_IDS;
                if !cached || prompt.get() <= sp.tokens {
                    shared_prefix_ids(group, sp.tokens, prompt)
                } else {
                    // A prompt past the prefix: its group's ids of the whole
                    // prefix, whatever its length.
                    if self.group_ids.is_empty() {
                        self.group_ids = vec![Vec::new(); sp.groups as usize];
                    }
                    let ids = &mut self.group_ids[group as usize];
                    if ids.is_empty() {
                        *ids = shared_prefix_ids(group, sp.tokens, prompt).ids;
                    }
                    PrefixIds { block_tokens: Tokens::new(SHARED_PREFIX_BLOCK_TOKENS), ids: ids.clone() }
                }
            }
            None => PrefixIds::none(),
        };
        let priority = match &mut self.priorities {
            Some((cumulative, rng)) => {
                let total = cumulative.last().map_or(0.0, |&(w, _)| w);
                let x = rng.random::<f64>() * total;
                cumulative.iter().find(|&&(w, _)| x < w).or(cumulative.last()).map_or(0, |&(_, v)| v)
            }
            None => 0,
        };
        self.index += 1;
        RequestSpec { arrival: SimTime::ZERO, prompt, output, prefix, priority }
    }
}

const GROUP_SALT: u64 = 0x5348_4152_4544_5052; // "SHAREDPR"

/// The chained ids of a synthetic prompt of `prompt` tokens in
/// shared-prefix group `group` whose prefix is `shared` tokens long, in
/// blocks of [`SHARED_PREFIX_BLOCK_TOKENS`].
///
/// Block `j` ends at token `e = min(16(j + 1), prompt)`. The ids cover the
/// blocks within the shared prefix (`e ≤ min(shared, prompt)`): block `j`'s
/// id is `mix(mix(GROUP_SALT ^ group, j), e)`, equal for every request of the
/// group. Mixing in `e` keeps a partial last block distinct from a full one,
/// as [`PrefixIds`] requires. The blocks after the prefix hold the request's
/// own tokens, which no other prompt shares, so they get no id: a prefix
/// cache then never spends time registering and evicting them.
///
/// ```
/// use actors::units::Tokens;
/// use pdsim::workload::shared_prefix_ids;
/// let a = shared_prefix_ids(3, 40, Tokens::new(100));
/// let b = shared_prefix_ids(3, 40, Tokens::new(60));
/// // 40 shared tokens: blocks 0 and 1 (tokens 0..32) are the group's;
/// // block 2 (tokens 32..48) straddles the end of the prefix: no id.
/// assert_eq!(a.ids, b.ids);
/// assert_eq!(a.ids.len(), 2);
/// ```
pub fn shared_prefix_ids(group: u64, shared: u64, prompt: Tokens) -> PrefixIds {
    let b = SHARED_PREFIX_BLOCK_TOKENS;
    let n = prompt.get();
    let shared = shared.min(n);
    // Whole blocks of the prefix, and a partial last block when the prompt
    // ends inside the prefix.
    let blocks = if shared == n { n.div_ceil(b) } else { shared / b };
    let ids = (0..blocks)
        .map(|j| {
            let end = ((j + 1) * b).min(n);
            mix(mix(GROUP_SALT ^ group, j), end)
        })
        .collect();
    PrefixIds { block_tokens: Tokens::new(b), ids }
}

/// What a [`WorkloadSource`] has read and made so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SourceStats {
    /// Requests handed out.
    pub requests: u64,
    /// Data rows of a trace read (blank lines and the header not counted).
    pub rows_read: u64,
    /// Malformed rows skipped under `skip_malformed = true`.
    pub skipped_malformed: u64,
    /// Rows of failed requests skipped (BurstGPT rows with 0 response
    /// tokens).
    pub skipped_failed: u64,
    /// The first malformed row's error, when any was skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_malformed: Option<String>,
}

#[derive(Debug)]
enum Inner {
    Synthetic(Box<SyntheticSource>),
    Trace(Box<TraceReader>),
}

/// The request stream of a workload: a synthetic source or a trace, with
/// arrivals from the trace, from a Poisson/Gamma clock, or all 0 in a
/// closed loop; stops after the request count.
#[derive(Debug)]
pub struct WorkloadSource {
    inner: Inner,
    retime: Option<ArrivalClock>,
    closed: bool,
    cap: Option<u64>,
    stats: SourceStats,
    /// The scenario file, for errors about its fields (not the trace's).
    file: String,
}

impl WorkloadSource {
    /// Names the scenario file in errors about its `[workload]` fields
    /// (a trace's rows are placed in the trace file).
    pub fn set_file(&mut self, file: &str) {
        self.file = file.to_owned();
    }

    /// What the source has read and made so far (final once it returned
    /// `None`).
    pub fn stats(&self) -> SourceStats {
        let mut s = self.stats.clone();
        if let Inner::Trace(t) = &self.inner {
            let ts = t.stats();
            s.rows_read = ts.rows_read;
            s.skipped_malformed = ts.skipped_malformed;
            s.skipped_failed = ts.skipped_failed;
            s.first_malformed = ts.first_malformed.clone();
        }
        s
    }
}

impl RequestSource for WorkloadSource {
    fn next_request(&mut self) -> Result<Option<RequestSpec>, WorkloadError> {
        if self.cap.is_some_and(|cap| self.stats.requests >= cap) {
            return Ok(None);
        }
        let next = match &mut self.inner {
            Inner::Synthetic(s) => Some(s.next()),
            Inner::Trace(t) => t.next_request()?,
        };
        let Some(mut req) = next else { return Ok(None) };
        if self.closed {
            req.arrival = SimTime::ZERO;
        } else if let Some(clock) = &mut self.retime {
            req.arrival = clock.next_arrival();
            if req.arrival > MAX_ARRIVAL {
                let place = if self.file.is_empty() { String::new() } else { format!("{}: ", self.file) };
                return Err(WorkloadError(format!(
                    "{place}workload.arrival.rate_per_s: request {} would arrive at {:.0} s, past the end of \
                     simulated time (arrivals must come within {:.0} s); raise the rate or serve fewer requests",
                    self.stats.requests,
                    req.arrival.as_secs_f64(),
                    MAX_ARRIVAL.as_secs_f64()
                )));
            }
        }
        self.stats.requests += 1;
        Ok(Some(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The span check against its arithmetic: simulated time ends at
    /// 2^62 ns = 4.611686e9 s; n requests span n − 1 gaps of mean 1/rate,
    /// with a standard deviation cv times the mean over √(n − 1).
    #[test]
    fn arrival_span_is_refused_only_when_sure_to_pass_the_end() {
        let spec = |arrival: ArrivalSpec, requests: u64| WorkloadSpec {
            requests: Some(requests),
            arrival: Some(arrival),
            prompt_tokens: None,
            output_tokens: None,
            shared_prefix: None,
            priorities: None,
            trace: None,
        };
        let poisson = |rate_per_s| ArrivalSpec::Poisson { rate_per_s };
        // 20,000 at 1e-6/s: mean 1.99999e10 s, six deviations early
        // 1.99999e10 x (1 - 6/141.4) = 1.915e10 s > 4.61e9: refused.
        let err = spec(poisson(1e-6), 20_000).check_arrival_span(None, "--requests").unwrap_err();
        assert!(err.starts_with("workload.arrival.rate_per_s: 20000 requests at "), "{err}");
        // 5,000: mean 4.999e9 s, early 4.999e9 x (1 - 6/70.7) = 4.575e9 s,
        // under 4.61e9: left to the draws.
        assert!(spec(poisson(1e-6), 5_000).check_arrival_span(None, "--requests").is_ok());
        // --requests replaces the count, and says so.
        assert!(spec(poisson(1e-6), 20_000).check_arrival_span(Some(50), "--requests").is_ok());
        let err = spec(poisson(1e-6), 50).check_arrival_span(Some(20_000), "--requests").unwrap_err();
        assert!(err.contains("20000 requests (--requests) at"), "{err}");
        // Gamma with cv 4: 20,000 is early 1.99999e10 x (1 - 24/141.4) =
        // 1.66e10 s, refused; 6,000 is early 5.999e9 x (1 - 24/77.5) =
        // 4.14e9 s, not (its mean, 6.0e9 s, is past the end).
        let gamma = ArrivalSpec::Gamma { rate_per_s: 1e-6, cv: 4.0 };
        assert!(spec(gamma.clone(), 20_000).check_arrival_span(None, "--requests").is_err());
        assert!(spec(gamma, 6_000).check_arrival_span(None, "--requests").is_ok());
        // One request arrives at 0; a closed loop has no span; nor is a
        // trace's count known before its rows are read.
        assert!(spec(poisson(1e-6), 1).check_arrival_span(None, "--requests").is_ok());
        assert!(
            spec(ArrivalSpec::ClosedLoop { concurrency: 1 }, u64::MAX).check_arrival_span(None, "--requests").is_ok()
        );
        let mut traced = spec(poisson(1e-6), 20_000);
        traced.trace = Some(TraceSpec::new(crate::trace::TraceFormat::Mooncake, "t.jsonl"));
        assert!(traced.check_arrival_span(None, "--requests").is_ok());
        // u64::MAX requests at 1e9/s: 1.8e10 s, refused, with no overflow.
        assert!(spec(poisson(1e9), u64::MAX).check_arrival_span(None, "--requests").is_err());
    }

    #[test]
    fn round_clamp_bounds() {
        assert_eq!(round_clamp(-5.0, 10), 1);
        assert_eq!(round_clamp(f64::NAN, 10), 1);
        assert_eq!(round_clamp(4.5, 10), 5);
        assert_eq!(round_clamp(1e30, 10), 10);
        assert_eq!(round_clamp(1e30, u64::MAX), u64::MAX);
    }

    #[test]
    fn shared_prefix_partial_last_block_keeps_its_length() {
        // Two prompts of one group shorter than the prefix: equal ids up to
        // the last full block, different ids for partial last blocks of
        // different lengths.
        let a = shared_prefix_ids(0, 1000, Tokens::new(20));
        let b = shared_prefix_ids(0, 1000, Tokens::new(24));
        let c = shared_prefix_ids(0, 1000, Tokens::new(20));
        assert_eq!(a.ids[0], b.ids[0]);
        assert_ne!(a.ids[1], b.ids[1]);
        assert_eq!(a, c);
    }
}
