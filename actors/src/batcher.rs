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
//! preempted, unless the step would otherwise be empty; then the sequences
//! it preempted sit it out (taking them straight back can loop forever) and
//! the ones behind them may run.
//!
//! One step is one engine event: the rank schedules the step, asks its
//! step-time model how long it takes, and applies the results when the
//! timer fires. The work per step is proportional to the batch, never to
//! the tokens in it.
//!
//! Decoding costs nothing per sequence per step. A sequence that has
//! produced a token and goes on decoding joins the rank's *decoding set*:
//! from then on it computes one token and produces one token every step, so
//! its state is a function of the rank's step counter (tokens = tokens at
//! joining + steps since), kept without touching it. The rank keeps the end
//! time of every step since the oldest member joined, a heap of the steps at
//! which members finish, and a heap of the steps at which a member's blocks
//! change (once per block of tokens). A step costs O(1) plus the members that
//! finish or need a block in it; first-token, last-token and every
//! inter-token gap come out as if each step had been handled one by one
//! (gaps go into the histogram once per step, counted over the members, and
//! a finishing member's longest gap is read off the step log).
//!
//! Runs of steps in which nothing but decoding happens are planned as one
//! event: up to the first member's last token, the rank's next timeline
//! sample, or [`Batcher::max_run`] steps, with the blocks members need over
//! the run taken when it starts. Anything that could change the batch (a new
//! sequence, freed blocks) cuts the run at the end of the step in progress
//! ([`Batcher::cut`]); the rank cuts before anything else touches its pool.
//! The blocks members need later in a run are taken from plain free blocks
//! when the run starts (a run stops before a step that would need an
//! eviction) and given back on a cut, so whenever anything looks at the pool
//! it holds what stepping one event at a time would have made it. Steps that
//! need more (a prefill chunk, an admission, a
//! preemption) are planned one at a time, per sequence, with every member of
//! the decoding set brought up to date first when a preemption may be needed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

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
    /// While it is in the decoding set: when it joined and its counts then.
    lazy: Option<Lazy>,
}

/// A member of the decoding set: the step count when it joined, and its
/// computed and generated tokens then.
#[derive(Clone, Copy, Debug)]
struct Lazy {
    join: u64,
    computed: Tokens,
    generated: Tokens,
    /// The first step whose gap (from the step before) is one of its
    /// inter-token gaps: the step after joining, or the one after that when
    /// it joined before its first token.
    first_gap: u64,
}

impl Lazy {
    /// Tokens a member holds the KV of through step `n` (at least its first
    /// step after joining).
    fn tokens_at(self, n: u64) -> Tokens {
        self.computed + Tokens::new(n.max(self.join + 1) - self.join)
    }
}

impl Seq {
    /// A sequence for `req`, with `computed` tokens of KV already present in `alloc`.
    pub fn new(req: Box<Request>, alloc: Alloc, computed: Tokens, prefill_target: Tokens, looked_up: bool) -> Self {
        Seq { req, alloc, computed, prefill_target, looked_up, last_token: None, step_tokens: Tokens::ZERO, lazy: None }
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
    /// Step events (a fast-forwarded run of steps is one).
    pub runs: u64,
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
    /// Sequences that cannot fit in the pool even alone, with the blocks
    /// their step needed; the rank fails them (their blocks are still held,
    /// for the rank to release).
    pub stuck: Vec<(Seq, u64)>,
    /// Blocks the last admission that fell short needed in all.
    last_need: u64,
    /// Longest run of steps planned as one event.
    pub max_run: usize,
    /// Use the decoding set (on by default). Off, every step handles every
    /// sequence one by one: the reference the decoding set is tested against.
    pub lazy_decoding: bool,
    /// Steps completed.
    step: u64,
    /// End times of steps `log_base ..`: completed ones, then the `planned`
    /// ones in flight.
    ends: VecDeque<SimTime>,
    log_base: u64,
    planned: usize,
    /// Members of the decoding set.
    dec_count: u64,
    /// Σ over members of (computed at joining − step at joining): a member's
    /// context after step n is its term + n.
    dec_ctx: i128,
    /// Per slot, bumped when its sequence leaves the decoding set, so heap
    /// entries of an earlier membership are skipped.
    generation: Vec<u32>,
    /// (step of its last token, slot, generation) per member.
    finishes: BinaryHeap<Reverse<(u64, u32, u32)>>,
    /// (first step whose blocks it does not hold yet, slot, generation).
    changes: BinaryHeap<Reverse<(u64, u32, u32)>>,
    /// Members that joined before their first token, in the run in flight.
    fresh: Vec<u32>,
    /// Members given blocks of steps after the first of the run in flight
    /// (taken from plain free blocks; given back by `settle` once a cut run
    /// leaves them ahead and anything needs or reads them).
    ahead: Vec<(u32, u32)>,
    /// Blocks the changes held ahead gave back (a window group's blocks
    /// leaving the window before the step that frees them).
    ahead_freed: u64,
    /// (step, blocks in use after its block changes) for the steps of the
    /// run in flight, for the peak.
    step_used: Vec<(u64, u64)>,
    /// The step being planned frees blocks while something waits for
    /// blocks: it runs alone.
    freed_next: bool,
    /// Something outside the batch waits for blocks (a decode rank's
    /// reservations); set by the rank.
    pub blocked_outside: bool,
    /// Scratch for [`Batcher::take_blocks`]: (slot, generation, tokens at the step).
    step_changes: Vec<(u32, u32, Tokens)>,
    /// The run in flight was cut short.
    cut_short: bool,
    /// (step, gap before it) with gaps strictly decreasing: the longest gap
    /// of any suffix of steps is the first entry inside it.
    gaps: Vec<(u64, SimDuration)>,
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
            last_need: 0,
            max_run: DEFAULT_MAX_RUN,
            lazy_decoding: true,
            step: 0,
            ends: VecDeque::new(),
            log_base: 0,
            planned: 0,
            dec_count: 0,
            dec_ctx: 0,
            generation: Vec::new(),
            finishes: BinaryHeap::new(),
            changes: BinaryHeap::new(),
            fresh: Vec::new(),
            ahead: Vec::new(),
            ahead_freed: 0,
            step_used: Vec::new(),
            step_changes: Vec::new(),
            freed_next: false,
            blocked_outside: false,
            cut_short: false,
            gaps: Vec::new(),
        }
        .with_step_zero()
    }

    fn with_step_zero(mut self) -> Self {
        self.ends.push_back(SimTime::ZERO);
        self
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
                self.generation.push(0);
                (self.seqs.len() - 1) as u32
            }
        };
        self.waiting.push_back(slot);
    }

    /// Whether prefill steps that end the prompt take checkpoint blocks.
    pub fn checkpoints(&self) -> bool {
        self.checkpoints
    }

    /// Sequences waiting to be admitted.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
    /// Sequences admitted.
    pub fn running(&self) -> usize {
        self.running.len()
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

    /// Plans the next step, or a run of steps of pure decoding ending at
    /// the latest at `horizon`. Returns the time until the event that ends
    /// it, or `None` if there is nothing to run (or a step is in flight).
    pub fn plan_step(&mut self, now: SimTime, horizon: SimTime) -> Option<SimDuration> {
        if self.stepping {
            return None;
        }
        let mut shape = BatchShape::default();
        let mut budget = self.max_batched;
        self.batch.clear();
        // The decoding set first, costing nothing per member; if it does not
        // fit the budget, its blocks, or a sequence needs a preemption, fall
        // back to planning every sequence one by one.
        let mut lazy = false;
        self.freed_next = false;
        if self.lazy_decoding && self.dec_count <= budget && self.take_blocks(self.step + 1).is_ok() {
            shape = BatchShape {
                new_tokens: self.dec_count,
                seqs: self.dec_count,
                context_tokens: self.dec_context(self.step + 1),
            };
            budget -= self.dec_count;
            lazy = self.fill(true, &mut shape, &mut budget).is_ok();
        }
        if !lazy {
            self.materialize_all();
            shape = BatchShape::default();
            budget = self.max_batched;
            self.batch.clear();
            self.fill(false, &mut shape, &mut budget).expect("the per-sequence path preempts instead of failing");
        }
        if self.batch.is_empty() && self.dec_count == 0 {
            return None;
        }
        // The blocks of the step about to run (unless a cut run still holds
        // some ahead).
        self.pool.note_peak();
        self.stepping = true;
        self.step_started = now;
        let mut end = now + self.model.step_time(&shape);
        self.ends.push_back(end);
        let mut k = 1u64;
        if self.batch.is_empty() {
            // Pure decoding: the same batch until the first member finishes.
            let last = self.next_finish().expect("members have finish steps");
            let mut most = (last - self.step).min(self.max_run as u64);
            if self.freed_next {
                most = 1; // see take_blocks
            }
            while k < most && end < horizon {
                shape.context_tokens += self.dec_count;
                end += self.model.step_time(&shape);
                self.ends.push_back(end);
                k += 1;
            }
            if k > 1
                && let Err(short) = self.take_blocks(self.step + k)
            {
                // Stop the run before the first step whose blocks are missing.
                k = short - 1 - self.step;
                self.ends.truncate(self.ends.len() - self.to_drop(k));
            }
        }
        self.planned = k as usize;
        Some(*self.ends.back().expect("planned") - now)
    }

    /// How many of the ends just pushed to drop to keep `k`.
    fn to_drop(&self, k: u64) -> usize {
        let pushed = self.ends.len() as u64 - (self.step - self.log_base) - 1;
        (pushed - k) as usize
    }

    /// Fills the step with the running sequences outside the decoding set
    /// and new admissions. With `lazy`, a sequence that cannot get its
    /// blocks fails the plan (the caller falls back); without, it preempts.
    fn fill(&mut self, lazy: bool, shape: &mut BatchShape, budget: &mut u64) -> Result<(), ()> {
        let mode = self.mode;
        let mut preempted = 0usize;
        // With every running sequence in the decoding set there is nothing
        // to visit here.
        let mut i = if self.running.len() as u64 == self.dec_count { self.running.len() } else { 0 };
        while i < self.running.len() && *budget > 0 {
            let slot = self.running[i];
            if self.seqs[slot as usize].as_ref().expect("live slot").lazy.is_some() {
                i += 1; // a member of the decoding set, counted already
                continue;
            }
            let (from, k, checkpoints) = {
                let checkpoints = self.checkpoints;
                let seq = self.seq(slot);
                let remaining = seq.goal(mode) - seq.computed;
                let k = remaining.get().min(*budget);
                let to = seq.computed + Tokens::new(k);
                (seq.computed, k, checkpoints && mode == Mode::PrefillOnly && to == seq.goal(mode))
            };
            if k == 0 {
                i += 1;
                continue;
            }
            let to = from + Tokens::new(k);
            let extra = self.pool.extra_needed(
                &self.seqs[slot as usize].as_ref().expect("live slot").alloc,
                from,
                to,
                checkpoints,
            );
            self.make_room(extra);
            let scheduled = loop {
                let pool = &mut self.pool;
                let seq = self.seqs[slot as usize].as_mut().expect("live slot");
                if pool.resize(&mut seq.alloc, from, to, checkpoints).is_ok() {
                    break true;
                }
                if lazy {
                    return Err(());
                }
                let victim = *self.running.last().expect("running is not empty");
                self.running.pop();
                self.preempt(victim);
                preempted += 1;
                if victim == slot {
                    break false;
                }
            };
            if !scheduled {
                break;
            }
            self.seq(slot).step_tokens = Tokens::new(k);
            self.batch.push(slot);
            *budget -= k;
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
        //
        // The sequences preempted in this plan wait at the front of the
        // queue. If the step is empty, taking them straight back could
        // repeat forever: a recompute whose first chunk fits but whose
        // second does not, beside sequences that hold the rest of the pool
        // and wait behind it for the token budget, is preempted and taken
        // back at every step (vLLM's own order would loop there). They sit
        // this step out, so the sequences behind them can run and free
        // their blocks (unless nothing else can: then they are taken back).
        let mut wi = preempted;
        let mut sitting_out = preempted > 0;
        loop {
            if wi >= self.waiting.len() || *budget == 0 || self.running.len() >= self.max_seqs {
                if sitting_out && self.batch.is_empty() && self.dec_count == 0 {
                    sitting_out = false;
                    wi = 0;
                    continue;
                }
                break;
            }
            // "Empty" counts the decoding set, as stepping one by one would.
            let empty = self.batch.is_empty() && self.dec_count == 0;
            if preempted > 0 && !empty {
                break;
            }
            let slot = self.waiting[wi];
            if self.admit(slot, *budget, shape) {
                self.waiting.remove(wi);
                self.running.push(slot);
                let seq = self.seq(slot);
                *budget -= seq.step_tokens.get();
                // A sequence whose first step is already a decode step (a
                // handoff landed: one token left to compute) joins at once.
                if lazy
                    && mode == Mode::Generate
                    && seq.step_tokens.get() == 1
                    && seq.computed + seq.step_tokens == seq.goal(mode)
                {
                    self.batch.pop();
                    self.join(slot, false);
                }
                continue;
            }
            // With nothing else holding blocks, it can never fit.
            let own = self.pool.held_by(&self.seqs[slot as usize].as_ref().expect("live slot").alloc);
            if self.running.is_empty() && self.pool.used() == own {
                self.waiting.remove(wi);
                let seq = self.seqs[slot as usize].take().expect("live slot");
                self.free_slots.push(slot);
                self.stuck.push((seq, self.last_need));
                continue;
            }
            if !empty {
                break;
            }
            wi += 1;
        }

        Ok(())
    }

    /// End time of step `n` (step 0 ends at time zero).
    fn end(&self, n: u64) -> SimTime {
        self.ends[(n - self.log_base) as usize]
    }

    /// Context after step `n` summed over the decoding set.
    fn dec_context(&self, n: u64) -> u64 {
        u64::try_from(self.dec_ctx + i128::from(self.dec_count) * i128::from(n)).expect("context is positive")
    }

    /// The step of the next member's last token.
    fn next_finish(&mut self) -> Option<u64> {
        while let Some(&Reverse((f, slot, g))) = self.finishes.peek() {
            if self.generation[slot as usize] == g {
                return Some(f);
            }
            self.finishes.pop();
        }
        None
    }

    /// Gives every member the blocks of each step up to `e` it has not got
    /// yet, step by step in step order, as stepping one event at a time
    /// would. On a shortfall, returns the first step whose blocks are missing
    /// (the changes of earlier steps stay made). Past the next step, blocks
    /// are recorded as held ahead, so that a cut can give them back and the
    /// pool is, whenever anything else looks at it, what stepping one event
    /// at a time would have made it.
    ///
    /// A step's changes are made all or none, and only from plain free
    /// blocks: if the blocks its members grow by exceed them, it is a
    /// shortfall (for the next step, the caller then plans every sequence
    /// one by one, with evictions and preemptions in their order). A window
    /// group's holding also shrinks as tokens leave the window; since the
    /// growth alone must fit, the order stepping one by one visits the
    /// members in cannot matter, and blocks freed by one member never serve
    /// another's growth in the same step earlier than stepping would.
    fn take_blocks(&mut self, e: u64) -> Result<(), u64> {
        // Pool counts read while blocks of a cut run are still held ahead
        // are not the stepping ones, so they only count towards the peak
        // once given back.
        let exact = self.ahead.is_empty();
        let mut step_changes = std::mem::take(&mut self.step_changes);
        let result = loop {
            let n = match self.changes.peek() {
                Some(&Reverse((n, ..))) if n <= e => n,
                _ => break Ok(()),
            };
            let ahead = n > self.step + 1;
            // This step's changes, and how many blocks they grow by.
            step_changes.clear();
            let mut grow = 0u64;
            let mut net = 0i64;
            while let Some(&Reverse((m, slot, g))) = self.changes.peek() {
                if m != n {
                    break;
                }
                self.changes.pop();
                if self.generation[slot as usize] != g {
                    continue;
                }
                let seq = self.seqs[slot as usize].as_ref().expect("member slot");
                let l = seq.lazy.expect("member");
                let to = l.tokens_at(n);
                if seq.alloc.tokens() >= to || step_changes.iter().any(|&(s, ..)| s == slot) {
                    // A stale entry (left by a give-back) or a second copy:
                    // the member holds this step's blocks already, and its
                    // live entry carries on.
                    continue;
                }
                let delta = self.pool.change_in_blocks(&seq.alloc, to - Tokens::new(1), to);
                grow += delta.max(0) as u64;
                net += delta;
                step_changes.push((slot, g, to));
            }
            if !ahead && !self.ahead.is_empty() {
                self.make_room(grow);
                if self.ahead.is_empty() {
                    // Given back: the members' blocks moved, so gather the
                    // step again (settle queued their changes anew).
                    for &(slot, g, _) in &step_changes {
                        self.changes.push(Reverse((n, slot, g)));
                    }
                    continue;
                }
            }
            // Blocks freed at the start of step n (a window group's leaving
            // the window) can let something waiting for blocks in: a waiting
            // sequence at step n's admission, a decode rank's reservation at
            // its end, when stepping one by one retries them. Step n must
            // then start a plan of its own and run alone.
            let waiters = self.blocked_outside || !self.waiting.is_empty();
            if grow > self.pool.free_plain() || (net < 0 && waiters && ahead) {
                for &(slot, g, _) in &step_changes {
                    self.changes.push(Reverse((n, slot, g)));
                }
                break Err(n);
            }
            if net < 0 && waiters {
                self.freed_next = true;
            }
            for &(slot, g, to) in &step_changes {
                let seq = self.seqs[slot as usize].as_mut().expect("member slot");
                let l = seq.lazy.expect("member");
                let free_before = self.pool.free_plain();
                self.pool
                    .resize_from_free(&mut seq.alloc, to - Tokens::new(1), to)
                    .expect("the step's growth fits the plain free blocks");
                if ahead {
                    self.ahead.push((slot, g));
                    self.ahead_freed += self.pool.free_plain().saturating_sub(free_before);
                    self.pool.suspend_peak = true;
                }
                let next = Self::change_step(l, seq.alloc.stable_to());
                self.changes.push(Reverse((next, slot, g)));
            }
            if exact {
                self.step_used.push((n, self.pool.used()));
            }
        };
        self.step_changes = step_changes;
        result
    }

    /// The first step at which a member needs blocks its allocation, held
    /// the same up to `stable_to` tokens, does not have.
    fn change_step(l: Lazy, stable_to: Tokens) -> u64 {
        l.join.saturating_add(stable_to.get().saturating_sub(l.computed.get())).saturating_add(1)
    }

    /// Puts the running sequence `slot` into the decoding set: after it
    /// produced a token (`has_token`), or before its first token when its
    /// first step is a decode step.
    fn join(&mut self, slot: u32, has_token: bool) {
        let step = self.step;
        let seq = self.seqs[slot as usize].as_mut().expect("live slot");
        let first_gap = if has_token { step + 1 } else { step + 2 };
        let l = Lazy { join: step, computed: seq.computed, generated: seq.req.generated, first_gap };
        if !has_token {
            self.fresh.push(slot);
        }
        seq.lazy = Some(l);
        self.dec_count += 1;
        self.dec_ctx += i128::from(l.computed.get()) - i128::from(step);
        let g = self.generation[slot as usize];
        let last = step + (seq.req.output - seq.req.generated).get();
        self.finishes.push(Reverse((last, slot, g)));
        let change =
            if seq.alloc.stable_to() > l.computed { Self::change_step(l, seq.alloc.stable_to()) } else { step + 1 };
        self.changes.push(Reverse((change, slot, g)));
    }

    /// Takes `slot` out of the decoding set, bringing its counts, its last
    /// token and its longest gap up to the current step.
    fn leave(&mut self, slot: u32) {
        let step = self.step;
        let seq = self.seqs[slot as usize].as_mut().expect("live slot");
        let l = seq.lazy.take().expect("member");
        let d = step - l.join;
        seq.computed = l.computed + Tokens::new(d);
        seq.req.generated = l.generated + Tokens::new(d);
        if d > 0 {
            let last = self.ends[(step - self.log_base) as usize];
            seq.last_token = Some(last);
            seq.req.t.last_token = Some(last);
            // The longest gap among steps first_gap..=step.
            let i = self.gaps.partition_point(|&(n, _)| n < l.first_gap);
            if let Some(&(_, longest)) = self.gaps.get(i) {
                seq.req.max_itl = seq.req.max_itl.max(longest);
            }
        }
        self.dec_count -= 1;
        self.dec_ctx -= i128::from(l.computed.get()) - i128::from(l.join);
        self.generation[slot as usize] = self.generation[slot as usize].wrapping_add(1);
    }

    /// Brings every member of the decoding set up to date and empties it.
    fn materialize_all(&mut self) {
        if self.dec_count == 0 {
            return;
        }
        // One by one, every sequence's blocks must be the stepping ones.
        self.settle();
        for i in 0..self.running.len() {
            let slot = self.running[i];
            if self.seqs[slot as usize].as_ref().is_some_and(|s| s.lazy.is_some()) {
                self.leave(slot);
            }
        }
        self.finishes.clear();
        self.changes.clear();
    }

    /// Gives back the blocks members hold ahead of the steps that need them,
    /// bringing the pool to what stepping one event at a time would hold now
    /// (through the step in flight, or the last completed one). Call before
    /// anything reads the pool's counts.
    pub fn settle(&mut self) {
        if self.ahead.is_empty() {
            return;
        }
        let target = if self.stepping { self.step + self.planned as u64 } else { self.step };
        let ahead = std::mem::take(&mut self.ahead);
        // Blocks given back first, then the window blocks taken back that a
        // member freed ahead of the step that frees them: the end state is
        // the stepping one, which fits, so the second pass always finds room.
        for regrow in [false, true] {
            for &(slot, g) in &ahead {
                if self.generation[slot as usize] != g {
                    continue;
                }
                let seq = self.seqs[slot as usize].as_mut().expect("member slot");
                let l = seq.lazy.expect("member");
                let to = l.tokens_at(target);
                if seq.alloc.tokens() <= to {
                    continue;
                }
                let from = to - Tokens::new(1);
                if (self.pool.extra_needed(&seq.alloc, from, to, false) > 0) != regrow {
                    continue;
                }
                self.pool
                    .resize_from_free(&mut seq.alloc, from, to)
                    .expect("blocks given back first leave room for the ones taken back");
                // The old heap entry stays; take_blocks skips it when it
                // comes up (the member holds that step's blocks by then).
                let next = Self::change_step(l, seq.alloc.stable_to());
                self.changes.push(Reverse((next, slot, g)));
            }
        }
        self.ahead_freed = 0;
        self.step_used.retain(|&(n, _)| n <= target);
        self.pool.suspend_peak = false;
        self.pool.note_peak();
    }

    /// Settles first if taking `extra` blocks would need blocks held ahead
    /// (so an allocation never fails or evicts because of them).
    ///
    /// Blocks held ahead make the plain free count smaller than stepping
    /// one by one would, but blocks a window group freed ahead make it
    /// larger; counting the latter out, an allocation that the count allows
    /// succeeds from plain free blocks either way.
    pub fn make_room(&mut self, extra: u64) {
        if !self.ahead.is_empty() && extra + self.ahead_freed > self.pool.free_plain() {
            self.settle();
        }
    }

    /// Something may change the batch at `now`: ends a planned run at the end
    /// of the step in progress. Returns the run's new end, if it moved (the
    /// rank reschedules its event).
    pub fn cut(&mut self, now: SimTime) -> Option<SimTime> {
        if !self.stepping || self.planned < 2 {
            return None;
        }
        let first = self.ends.len() - self.planned;
        let keep = self.ends.range(first..).take_while(|&&e| e < now).count() + 1;
        if keep >= self.planned {
            return None;
        }
        self.ends.truncate(first + keep);
        self.planned = keep;
        // The blocks taken for the steps that will not run now stay held
        // until something needs them or looks at the pool (`settle`).
        self.cut_short = true;
        self.ends.back().copied()
    }

    /// Tries to give the waiting sequence `slot` its first chunk of this step.
    fn admit(&mut self, slot: u32, budget: u64, shape: &mut BatchShape) -> bool {
        let mode = self.mode;
        let checkpoints = self.checkpoints;
        if !self.ahead.is_empty() {
            // What the admission takes, at most: a fresh sequence's whole
            // first step (no hit assumed), or an allocated one's growth.
            let seq = self.seqs[slot as usize].as_ref().expect("live slot");
            let k = (seq.goal(mode) - seq.computed).get().min(budget);
            let (from, to) = (seq.computed, seq.computed + Tokens::new(k));
            let need = if seq.looked_up {
                self.pool.extra_needed(&seq.alloc, from, to, checkpoints)
            } else {
                self.pool.blocks_after_hit(0, Tokens::ZERO, Tokens::new(k), checkpoints)
            };
            self.make_room(need);
        }
        let pool = &mut self.pool;
        let seq = self.seqs[slot as usize].as_mut().expect("live slot");
        let fresh_lookup = !seq.looked_up;
        if fresh_lookup {
            // Never the whole goal from the cache: at least one token is computed.
            let limit = seq.goal(mode).saturating_sub(Tokens::new(1));
            let hit = pool.lookup(&seq.req.prefix, seq.req.prompt, limit);
            // All or nothing, as vLLM allocates: the hit and the first chunk.
            let from = pool.hit_tokens(hit);
            let to = from + Tokens::new((seq.goal(mode) - from).get().min(budget));
            let ckpt = checkpoints && mode == Mode::PrefillOnly && to == seq.goal(mode);
            let need = pool.blocks_after_hit(hit, from, to, ckpt);
            if pool.can_pin_and_take(&seq.req.prefix, seq.req.prompt, hit, need).is_err() {
                self.last_need = need + u64::from(hit) * pool.fa_groups();
                return false;
            }
            pool.pin(&mut seq.alloc, &seq.req.prefix, seq.req.prompt, hit).expect("checked");
            seq.computed = pool.hit_tokens(hit);
            seq.looked_up = true;
        }
        let k = (seq.goal(mode) - seq.computed).get().min(budget);
        let (from, to) = (seq.computed, seq.computed + Tokens::new(k));
        let ckpt = checkpoints && mode == Mode::PrefillOnly && to == seq.goal(mode);
        if let Err(short) = pool.resize(&mut seq.alloc, from, to, ckpt) {
            self.last_need = pool.held_by(&seq.alloc) + short.needed;
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
        for &slot in self.batch.iter().chain(&self.fresh) {
            let seq = self.seqs[slot as usize].as_mut().expect("live slot");
            started(&mut seq.req).get_or_insert(now);
        }
    }

    /// Applies the step (or run of steps) that just ended at `now`; appends
    /// the sequences that finished (prefill done, or last output token) to
    /// `done`.
    pub fn finish_step(&mut self, now: SimTime, done: &mut Vec<Finished>) {
        debug_assert!(self.stepping);
        debug_assert_eq!(Some(&now), self.ends.back());
        self.stepping = false;
        let mode = self.mode;
        let k = self.planned as u64;
        self.planned = 0;
        let before = self.step;
        self.step += k;
        self.stats.steps += k;
        self.stats.runs += 1;
        self.stats.busy += now - self.step_started;
        // The decoding set: one token per member per step, one gap per step.
        for n in before + 1..=self.step {
            let gap = self.end(n) - self.end(n - 1);
            // Members that joined before their first token have no gap at
            // the run's first step.
            let fresh = if n == before + 1 { self.fresh.len() as u64 } else { 0 };
            self.itl.record_n(gap, self.dec_count - fresh);
            while self.gaps.last().is_some_and(|&(_, g)| g <= gap) {
                self.gaps.pop();
            }
            self.gaps.push((n, gap));
        }
        self.stats.output_tokens += self.dec_count * k;
        self.stats.tokens += self.dec_count * k;
        if !std::mem::take(&mut self.cut_short) {
            // The run ran to its end: every block it took ahead is now
            // needed. Blocks an earlier, cut run took for steps past this
            // one's end stay ahead.
            let (seqs, generation, step) = (&self.seqs, &self.generation, self.step);
            self.ahead.retain(|&(slot, g)| {
                generation[slot as usize] == g
                    && seqs[slot as usize].as_ref().is_some_and(|seq| {
                        let l = seq.lazy.expect("member");
                        seq.alloc.tokens() > l.tokens_at(step)
                    })
            });
            if self.ahead.is_empty() {
                self.ahead_freed = 0;
                self.pool.suspend_peak = false;
            }
        }
        self.pool.note_peak();
        for (n, used) in self.step_used.drain(..) {
            if n <= self.step {
                self.pool.note_peak_of(used);
            }
        }
        let first_end = self.end(before + 1);
        for slot in self.fresh.drain(..) {
            let seq = self.seqs[slot as usize].as_mut().expect("fresh members finish no earlier than here");
            seq.req.t.first_token.get_or_insert(first_end);
            // Its first step computed the last prompt token: register the
            // block that completed, as a per-sequence step would.
            let computed = seq.lazy.expect("member").computed + Tokens::new(1);
            self.pool.register(&mut seq.alloc, &seq.req.prefix, seq.req.prompt, computed);
        }
        // Everything else in the step, one by one (a step with any is a single step).
        let mut any_done = false;
        for bi in 0..self.batch.len() {
            let slot = self.batch[bi];
            let pool = &mut self.pool;
            let seq = self.seqs[slot as usize].as_mut().expect("live slot");
            let from = seq.computed;
            seq.computed += seq.step_tokens;
            self.stats.tokens += seq.step_tokens.get();
            pool.register(&mut seq.alloc, &seq.req.prefix, seq.req.prompt, seq.computed);
            if seq.computed < seq.goal(mode) {
                continue;
            }
            let finished = match mode {
                Mode::PrefillOnly => true,
                Mode::Generate => {
                    seq.req.generated += Tokens::new(1);
                    self.stats.output_tokens += 1;
                    match seq.last_token {
                        None => {
                            seq.req.t.first_token.get_or_insert(now);
                        }
                        Some(prev) => {
                            let gap = now - prev;
                            seq.req.max_itl = seq.req.max_itl.max(gap);
                            self.itl.record(gap);
                        }
                    }
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
            } else if self.lazy_decoding {
                self.join(slot, true);
            }
        }
        // Members whose last token came out in this run.
        while let Some(f) = self.next_finish() {
            if f > self.step {
                break;
            }
            let Reverse((_, slot, _)) = self.finishes.pop().expect("peeked");
            self.leave(slot);
            any_done = true;
            let seq = self.seqs[slot as usize].take().expect("live slot");
            self.free_slots.push(slot);
            let from = seq.computed - Tokens::new(1);
            done.push(Finished { seq, last_step_from: from });
        }
        if any_done {
            let seqs = &self.seqs;
            self.running.retain(|&s| seqs[s as usize].is_some());
        }
        // Only the end of the last step is needed from here on.
        self.ends.drain(..(self.step - self.log_base) as usize);
        self.log_base = self.step;
        if self.check_invariants
            && let Err(e) = self.pool.check()
        {
            panic!("KV pool invariant broken at {now}: {e}");
        }
    }

    /// Removes every sequence, for the end-of-run accounting.
    pub fn drain(&mut self) -> Vec<Seq> {
        self.materialize_all();
        self.waiting.clear();
        self.running.clear();
        self.batch.clear();
        self.free_slots.clear();
        self.seqs.drain(..).flatten().collect()
    }
}
