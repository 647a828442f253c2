//! A vLLM-like continuous-batching scheduler, shared by every rank role.
//!
//! Each step: running sequences first, in admission order, each takes the
//! tokens it still has to compute before its next output token (a prefill
//! chunk, or one token when decoding), up to the step's token budget
//! (`max_num_batched_tokens`, chunked prefill); then waiting sequences are
//! admitted in order while the budget, `max_num_seqs` and the KV pool allow.
//! A running sequence that cannot get its blocks preempts the most recently
//! admitted running sequence (vLLM's recompute preemption): its blocks are
//! freed and it goes back to the front of the queue to recompute its prompt
//! and the tokens generated so far. No admission happens in a step that
//! preempted, unless the step would otherwise be empty.
//!
//! One step is one engine event: the rank schedules the step, asks its
//! step-time model how long it takes, and applies the results when the
//! timer fires. The work per step is proportional to the batch, never to
//! the tokens in it.
//!
//! Runs of identical decode steps are fast-forwarded: when every sequence
//! in the batch is decoding (one token a step, each step producing a token)
//! and nothing more can be admitted, the next steps keep the same batch
//! until the first sequence finishes. The scheduler then plans up to that
//! many steps at once (each with its own duration, as the context grows),
//! allocates their blocks up front, and schedules one event at the end of
//! the last. Every per-token figure is kept: each token's time is a step
//! end, so first-token times, inter-token gaps (into the histogram, one
//! entry per gap and count) and the last token come out as if each step had
//! been an event. Anything that could change the batch (a new sequence, a
//! cancelled reservation's blocks) cuts the run short at the end of the
//! step in progress ([`Batcher::cut`]). A run also ends at the rank's next
//! timeline sample, so sampled use stays at its interval. The one visible
//! difference: the blocks of the whole run are reserved when it starts, so
//! the pool shows them up to a run early.

use std::collections::VecDeque;

use sim_core::{SimDuration, SimTime};

use crate::pool::{Alloc, KvPool};
use crate::request::Request;
use crate::steptime::{BatchShape, StepTimeModel};
use crate::units::Tokens;

/// What a sequence is computing towards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Compute the (backed-off) prompt, then hand it off: no output tokens.
    PrefillOnly,
    /// Compute the prompt, then generate output tokens one step at a time.
    Generate,
}

/// A sequence in a rank.
#[derive(Debug)]
pub struct Seq {
    /// The request.
    pub req: Box<Request>,
    /// Its KV blocks.
    pub alloc: Alloc,
    /// Tokens whose KV is computed.
    pub computed: Tokens,
    /// Tokens a prefill-only sequence computes (T).
    pub prefill_target: Tokens,
    /// Whether the prefix cache was consulted (at first admission, and after a preemption).
    pub looked_up: bool,
    /// When its last output token came out.
    last_token: Option<SimTime>,
    /// Tokens it computes in the current step.
    step_tokens: Tokens,
}

impl Seq {
    /// A sequence for `req`, with `computed` tokens of KV already present in `alloc`.
    pub fn new(req: Box<Request>, alloc: Alloc, computed: Tokens, prefill_target: Tokens, looked_up: bool) -> Self {
        Seq { req, alloc, computed, prefill_target, looked_up, last_token: None, step_tokens: Tokens::ZERO }
    }

    /// Tokens it must have computed before its next output (or hand-off).
    fn goal(&self, mode: Mode) -> Tokens {
        match mode {
            Mode::PrefillOnly => self.prefill_target,
            Mode::Generate => self.req.prompt + self.req.generated,
        }
    }
}

/// A finished sequence, handed back to the rank.
#[derive(Debug)]
pub struct Finished {
    /// The sequence.
    pub seq: Seq,
    /// Where its last step started (for the source release).
    pub last_step_from: Tokens,
}

/// Step-level counters of one rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatcherStats {
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
}

/// The scheduler of one rank.
pub struct Batcher {
    mode: Mode,
    max_batched: u64,
    max_seqs: usize,
    checkpoints: bool,
    /// The rank's KV pool.
    pub pool: KvPool,
    model: Box<dyn StepTimeModel>,
    seqs: Vec<Option<Seq>>,
    free_slots: Vec<u32>,
    waiting: VecDeque<u32>,
    running: Vec<u32>,
    batch: Vec<u32>,
    /// Whether a step is in flight.
    pub stepping: bool,
    step_started: SimTime,
    /// Counters.
    pub stats: BatcherStats,
    /// Gaps between consecutive output tokens of a sequence, as a histogram.
    pub itl: crate::metrics::Histogram,
    /// Check the pool's conservation after every step.
    pub check_invariants: bool,
    /// Sequences that cannot fit in the pool even alone; the rank fails them
    /// (their blocks are still held, for the rank to release).
    pub stuck: Vec<Seq>,
    /// End times of the steps planned in flight (more than one: a
    /// fast-forwarded run of decode steps).
    ends: Vec<SimTime>,
    /// Longest run of steps planned as one event.
    pub max_run: usize,
}

/// The longest run of decode steps planned as one event.
pub const DEFAULT_MAX_RUN: usize = 4096;

impl Batcher {
    /// A scheduler with its pool and step-time model. `checkpoints`: prefill
    /// steps that end the prompt take the groups' checkpoint blocks.
    pub fn new(
        mode: Mode,
        max_batched: u64,
        max_seqs: u32,
        checkpoints: bool,
        pool: KvPool,
        model: Box<dyn StepTimeModel>,
    ) -> Self {
        Batcher {
            mode,
            max_batched,
            max_seqs: max_seqs as usize,
            checkpoints,
            pool,
            model,
            seqs: Vec::new(),
            free_slots: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            batch: Vec::new(),
            stepping: false,
            step_started: SimTime::ZERO,
            stats: BatcherStats::default(),
            itl: crate::metrics::Histogram::default(),
            check_invariants: false,
            stuck: Vec::new(),
            ends: Vec::new(),
            max_run: DEFAULT_MAX_RUN,
        }
    }

    /// Adds a sequence at the back of the queue.
    pub fn enqueue(&mut self, seq: Seq) {
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.seqs[s as usize] = Some(seq);
                s
            }
            None => {
                self.seqs.push(Some(seq));
                (self.seqs.len() - 1) as u32
            }
        };
        self.waiting.push_back(slot);
    }

    /// Sequences waiting to be admitted.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
    /// Sequences admitted.
    pub fn running(&self) -> usize {
        self.running.len()
    }
    /// Whether the rank has nothing queued or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    fn seq(&mut self, slot: u32) -> &mut Seq {
        self.seqs[slot as usize].as_mut().expect("live slot")
    }

    /// Frees the blocks of the running sequence `slot` and puts it at the
    /// front of the queue to recompute.
    fn preempt(&mut self, slot: u32) {
        let pool = &mut self.pool;
        let seq = self.seqs[slot as usize].as_mut().expect("live slot");
        pool.release(&mut seq.alloc, &seq.req.prefix, seq.req.prompt);
        seq.computed = Tokens::ZERO;
        seq.looked_up = false;
        seq.req.preemptions += 1;
        self.stats.preemptions += 1;
        self.waiting.push_front(slot);
    }

    /// Plans the next step (or run of identical decode steps, ending at the
    /// latest at `horizon`). Returns the time until the event that ends it,
    /// or `None` if there is nothing to run (or a step is already in flight).
    pub fn plan_step(&mut self, now: SimTime, horizon: SimTime) -> Option<SimDuration> {
        if self.stepping {
            return None;
        }
        let mode = self.mode;
        let mut budget = self.max_batched;
        let mut shape = BatchShape::default();
        self.batch.clear();
        let mut preempted = false;

        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            let (from, k, checkpoints) = {
                let checkpoints = self.checkpoints;
                let seq = self.seq(slot);
                let remaining = seq.goal(mode) - seq.computed;
                let k = remaining.get().min(budget);
                let to = seq.computed + Tokens::new(k);
                (seq.computed, k, checkpoints && mode == Mode::PrefillOnly && to == seq.goal(mode))
            };
            if k == 0 {
                i += 1;
                continue;
            }
            let to = from + Tokens::new(k);
            let scheduled = loop {
                let pool = &mut self.pool;
                let seq = self.seqs[slot as usize].as_mut().expect("live slot");
                if pool.resize(&mut seq.alloc, from, to, checkpoints).is_ok() {
                    break true;
                }
                let victim = *self.running.last().expect("running is not empty");
                self.running.pop();
                self.preempt(victim);
                preempted = true;
                if victim == slot {
                    break false;
                }
            };
            if !scheduled {
                break;
            }
            self.seq(slot).step_tokens = Tokens::new(k);
            self.batch.push(slot);
            budget -= k;
            shape.new_tokens += k;
            shape.seqs += 1;
            shape.context_tokens += to.get();
            i += 1;
        }

        // Admission in queue order. A sequence that cannot get its blocks
        // stops admission (first come, first served) unless the step is still
        // empty: then later sequences that fit may go ahead, so that a
        // preempted sequence needing a large recompute cannot stall requests
        // whose blocks are already reserved.
        let mut wi = 0;
        while budget > 0 && self.running.len() < self.max_seqs && wi < self.waiting.len() {
            if preempted && !self.batch.is_empty() {
                break;
            }
            let slot = self.waiting[wi];
            if self.admit(slot, budget, &mut shape) {
                self.waiting.remove(wi);
                self.running.push(slot);
                budget -= self.seq(slot).step_tokens.get();
                continue;
            }
            // With nothing else holding blocks, it can never fit.
            let own = self.pool.held_by(&self.seqs[slot as usize].as_ref().expect("live slot").alloc);
            if self.running.is_empty() && self.pool.used() == own {
                self.waiting.remove(wi);
                let seq = self.seqs[slot as usize].take().expect("live slot");
                self.free_slots.push(slot);
                self.stuck.push(seq);
                continue;
            }
            if !self.batch.is_empty() {
                break;
            }
            wi += 1;
        }

        if self.batch.is_empty() {
            return None;
        }
        self.stepping = true;
        self.step_started = now;
        let dt = self.model.step_time(&shape);
        self.ends.clear();
        self.ends.push(now + dt);
        if mode == Mode::Generate && !preempted && shape.new_tokens == shape.seqs {
            self.fast_forward(shape, horizon);
        }
        Some(*self.ends.last().expect("one step") - now)
    }

    /// Extends a step of pure decoding into a run of identical steps, up to
    /// the first sequence's last token, `horizon` and [`Batcher::max_run`].
    fn fast_forward(&mut self, mut shape: BatchShape, horizon: SimTime) {
        let mode = self.mode;
        let mut run = self.max_run;
        for &slot in &self.batch {
            let seq = self.seqs[slot as usize].as_ref().expect("live slot");
            // Each step must produce a token: the step reaches the goal.
            if seq.computed + seq.step_tokens != seq.goal(mode) {
                return;
            }
            run = run.min((seq.req.output - seq.req.generated).get() as usize);
        }
        let mut end = self.ends[0];
        while self.ends.len() < run && end < horizon {
            shape.context_tokens += shape.seqs;
            end += self.model.step_time(&shape);
            self.ends.push(end);
        }
        let k = self.ends.len() as u64;
        if k == 1 {
            return;
        }
        // Take the blocks of the whole run now, or run one step.
        for bi in 0..self.batch.len() {
            let slot = self.batch[bi];
            let seq = self.seqs[slot as usize].as_mut().expect("live slot");
            let last = seq.computed + Tokens::new(k - 1);
            if self.pool.resize(&mut seq.alloc, last, last + Tokens::new(1), false).is_err() {
                for &undo in &self.batch[..bi] {
                    let seq = self.seqs[undo as usize].as_mut().expect("live slot");
                    let c = seq.computed;
                    self.pool.resize(&mut seq.alloc, c, c + Tokens::new(1), false).expect("restores a held state");
                }
                self.ends.truncate(1);
                return;
            }
        }
    }

    /// Something may change the batch at `now`: ends a fast-forwarded run at
    /// the end of the step in progress. Returns the new end of the run, if
    /// it moved (the rank reschedules its event).
    pub fn cut(&mut self, now: SimTime) -> Option<SimTime> {
        if !self.stepping || self.ends.len() < 2 {
            return None;
        }
        let keep = self.ends.partition_point(|&e| e < now) + 1;
        if keep >= self.ends.len() {
            return None;
        }
        self.ends.truncate(keep);
        self.ends.last().copied()
    }

    /// Tries to give the waiting sequence `slot` its first chunk of this step.
    fn admit(&mut self, slot: u32, budget: u64, shape: &mut BatchShape) -> bool {
        let mode = self.mode;
        let checkpoints = self.checkpoints;
        let pool = &mut self.pool;
        let seq = self.seqs[slot as usize].as_mut().expect("live slot");
        let fresh_lookup = !seq.looked_up;
        if fresh_lookup {
            // Never the whole goal from the cache: at least one token is computed.
            let limit = seq.goal(mode).saturating_sub(Tokens::new(1));
            let hit = pool.lookup(&seq.req.prefix, seq.req.prompt, limit);
            if pool.pin(&mut seq.alloc, &seq.req.prefix, seq.req.prompt, hit).is_err() {
                return false;
            }
            seq.computed = pool.hit_tokens(hit);
            seq.looked_up = true;
        }
        let k = (seq.goal(mode) - seq.computed).get().min(budget);
        let (from, to) = (seq.computed, seq.computed + Tokens::new(k));
        let ckpt = checkpoints && mode == Mode::PrefillOnly && to == seq.goal(mode);
        if pool.resize(&mut seq.alloc, from, to, ckpt).is_err() {
            if fresh_lookup {
                pool.release(&mut seq.alloc, &seq.req.prefix, seq.req.prompt);
                seq.computed = Tokens::ZERO;
                seq.looked_up = false;
            }
            return false;
        }
        if fresh_lookup && seq.req.preemptions == 0 {
            // A decode rank looks up at reservation, so a first lookup here
            // is the prefill's (or the aggregated rank's).
            seq.req.prefill_hit = seq.computed;
        }
        seq.step_tokens = Tokens::new(k);
        self.batch.push(slot);
        shape.new_tokens += k;
        shape.seqs += 1;
        shape.context_tokens += to.get();
        true
    }

    /// Requests in the step now in flight were first scheduled at `now` if
    /// they had no start yet; `started` picks the stamp to set.
    pub fn stamp_started(&mut self, now: SimTime, started: fn(&mut Request) -> &mut Option<SimTime>) {
        for &slot in &self.batch {
            let seq = self.seqs[slot as usize].as_mut().expect("live slot");
            started(&mut seq.req).get_or_insert(now);
        }
    }

    /// Applies the step that just ended at `now`; appends the sequences that
    /// finished (prefill done, or last output token) to `done`.
    pub fn finish_step(&mut self, now: SimTime, done: &mut Vec<Finished>) {
        debug_assert!(self.stepping);
        debug_assert_eq!(Some(&now), self.ends.last());
        self.stepping = false;
        let mode = self.mode;
        let mut any_done = false;
        // A run of k steps: every sequence decodes k tokens, one per step end.
        let k = self.ends.len() as u64;
        let first_end = self.ends[0];
        let mut longest_gap = SimDuration::ZERO;
        for w in self.ends.windows(2) {
            let gap = w[1] - w[0];
            longest_gap = longest_gap.max(gap);
            self.itl.record_n(gap, self.batch.len() as u64);
        }
        self.stats.steps += k;
        self.stats.busy += now - self.step_started;
        for bi in 0..self.batch.len() {
            let slot = self.batch[bi];
            let pool = &mut self.pool;
            let seq = self.seqs[slot as usize].as_mut().expect("live slot");
            let from = seq.computed;
            let computed_now = seq.step_tokens + Tokens::new(k - 1);
            seq.computed += computed_now;
            self.stats.tokens += computed_now.get();
            pool.register(&mut seq.alloc, &seq.req.prefix, seq.req.prompt, seq.computed);
            if seq.computed < seq.goal(mode) {
                continue;
            }
            let finished = match mode {
                Mode::PrefillOnly => true,
                Mode::Generate => {
                    seq.req.generated += Tokens::new(k);
                    self.stats.output_tokens += k;
                    match seq.last_token {
                        None => {
                            seq.req.t.first_token.get_or_insert(first_end);
                        }
                        Some(prev) => {
                            let gap = first_end - prev;
                            seq.req.max_itl = seq.req.max_itl.max(gap);
                            self.itl.record(gap);
                        }
                    }
                    seq.req.max_itl = seq.req.max_itl.max(longest_gap);
                    seq.last_token = Some(now);
                    seq.req.t.last_token = Some(now);
                    seq.req.generated >= seq.req.output
                }
            };
            if finished {
                any_done = true;
                let seq = self.seqs[slot as usize].take().expect("live slot");
                self.free_slots.push(slot);
                done.push(Finished { seq, last_step_from: from });
            }
        }
        if any_done {
            let seqs = &self.seqs;
            self.running.retain(|&s| seqs[s as usize].is_some());
        }
        if self.check_invariants
            && let Err(e) = self.pool.check()
        {
            panic!("KV pool invariant broken at {now}: {e}");
        }
    }

    /// Removes every sequence, for the end-of-run accounting.
    pub fn drain(&mut self) -> Vec<Seq> {
        self.waiting.clear();
        self.running.clear();
        self.batch.clear();
        self.free_slots.clear();
        self.seqs.drain(..).flatten().collect()
    }

    /// When the step in flight started.
    pub fn step_started(&self) -> SimTime {
        self.step_started
    }
}
