//! Step statistics of one rank: steps, busy time, tokens, preemptions, the
//! histogram of gaps between consecutive output tokens, and the output
//! tokens of each 1 s window.

use sim_core::{SimDuration, SimTime};

use crate::stats::bench::TokenWindows;
use crate::stats::histogram::Histogram;

/// Step-level counters of one rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepStats {
    /// Steps run.
    pub steps: u64,
    /// Time spent in steps.
    pub busy: SimDuration,
    /// Preemptions.
    pub preemptions: u64,
    /// Tokens computed.
    pub tokens: u64,
    /// Output tokens generated.
    pub output_tokens: u64,
    /// Step events (a fast-forwarded run of steps is one).
    pub runs: u64,
}

/// The counters, the inter-token gaps and the output tokens per window.
#[derive(Default)]
pub(super) struct Stats {
    pub(super) counters: StepStats,
    pub(super) itl: Histogram,
    pub(super) tokens: TokenWindows,
}

impl Stats {
    /// A run of `steps` steps, one event, `busy` long.
    pub(super) fn run(&mut self, steps: u64, busy: SimDuration) {
        self.counters.steps += steps;
        self.counters.runs += 1;
        self.counters.busy += busy;
    }

    /// A step in flight stopped unfinished after `busy` (a crash).
    pub(super) fn cut_off(&mut self, busy: SimDuration) {
        self.counters.busy += busy;
    }

    /// `n` output tokens came out at `at` (a step's end).
    #[inline]
    pub(super) fn tokens_at(&mut self, at: SimTime, n: u64) {
        self.tokens.add(at, n);
    }

    /// `n` decoding sequences each computed and produced a token `steps` times.
    pub(super) fn decoded(&mut self, n: u64, steps: u64) {
        self.counters.output_tokens += n * steps;
        self.counters.tokens += n * steps;
    }

    /// A sequence computed `tokens` tokens in a step.
    pub(super) fn computed(&mut self, tokens: u64) {
        self.counters.tokens += tokens;
    }

    /// A sequence produced an output token, `gap` after its previous one.
    pub(super) fn output_token(&mut self, gap: Option<SimDuration>) {
        self.counters.output_tokens += 1;
        if let Some(gap) = gap {
            self.itl.record(gap);
        }
    }

    /// `n` sequences produced a token `gap` after their previous one.
    #[inline]
    pub(super) fn gaps(&mut self, gap: SimDuration, n: u64) {
        self.itl.record_n(gap, n);
    }

    /// A sequence was preempted.
    pub(super) fn preempted(&mut self) {
        self.counters.preemptions += 1;
    }
}
