//! Run planning: one event per step, and one event per run of pure decode
//! steps.
//!
//! Runs of steps in which nothing but decoding happens are planned as one
//! event: up to the first member's last token, the rank's next timeline
//! sample, or the scheduler's longest run, with the blocks members need
//! over the run taken when it starts. Anything that could change the batch
//! (a new sequence, freed blocks) cuts the run at the end of the step in
//! progress ([`Core::cut`]). The blocks members need later in a run are
//! taken when the run starts (a chunk at a time), from plain free blocks
//! and, short of them, by evicting cached blocks as stepping would at that
//! step, and given back when a cut leaves them ahead and anything needs or
//! reads them ([`Core::settle`]); the evictions made for steps a cut drops
//! are undone at the cut, before the message that cut the run touches the
//! pool. So whenever anything looks at the pool it holds what stepping one
//! event at a time would have made it. Steps that need more (a prefill chunk, an admission,
//! a preemption) are planned one at a time, per sequence, with every member
//! of the decoding set brought up to date first when a preemption may be
//! needed.
//!
//! Every entry of the scheduler that reads or allocates settles first (or
//! makes room: settles when what it takes would need blocks held ahead).
//!
//! A run's length does not depend on the rank's timeline: the timeline's
//! rows for the steps inside a run come from [`StepKv`], the pool's counts
//! after each step of the run that changes them, kept as the run is
//! planned and written out by the rank once the steps have happened.

use sim_core::{SimDuration, SimTime};

use super::Core;
use super::policy::BatchPolicy;
use super::seqs::Seq;
use super::seqs::SeqKey;
use super::step::Step;
use crate::base::units::Tokens;
use crate::models::steptime::BatchShape;
use crate::vllm::engine::EngineLoop;

/// The steps: how many completed, and the end times of steps
/// `base ..`: completed ones, then the `planned` ones in flight.
pub(super) struct StepLog {
    /// Steps completed.
    pub(super) step: u64,
    /// Ends of steps `base ..`: a `Vec`, as only the last end outlives
    /// the event that planned it (`forget_before_last`), so that pushing
    /// and reading an end, once a step, never wrap.
    ends: Vec<SimTime>,
    base: u64,
    /// Steps of the event in flight.
    pub(super) planned: usize,
}

impl Default for StepLog {
    fn default() -> Self {
        // Step 0 ends at time zero.
        StepLog { step: 0, ends: vec![SimTime::ZERO], base: 0, planned: 0 }
    }
}

impl StepLog {
    /// End time of step `n` (step 0 ends at time zero).
    pub(super) fn end(&self, n: u64) -> SimTime {
        self.ends[(n - self.base) as usize]
    }

    /// The end of the last step planned.
    pub(super) fn last_end(&self) -> SimTime {
        *self.ends.last().expect("step 0 at least")
    }

    fn push(&mut self, end: SimTime) {
        self.ends.push(end);
    }

    /// How many of the ends just pushed to drop to keep `k`.
    fn to_drop(&self, k: u64) -> usize {
        let pushed = self.ends.len() as u64 - (self.step - self.base) - 1;
        (pushed - k) as usize
    }

    fn drop_last(&mut self, n: usize) {
        self.ends.truncate(self.ends.len() - n);
    }

    /// Completes the `planned` steps in flight.
    pub(super) fn complete(&mut self) -> u64 {
        let k = self.planned as u64;
        self.planned = 0;
        self.step += k;
        k
    }

    /// Only the end of the last step is needed from here on.
    pub(super) fn forget_before_last(&mut self) {
        self.ends.drain(..(self.step - self.base) as usize);
        self.base = self.step;
    }
}

/// The pool's counts after each step of the run in flight that changes
/// them, for the rank's timeline: while a run holds the blocks of its later
/// steps, the pool's own counts are those after the run's last step.
///
/// Rows of `[start ns, used, free, cached free, used by group 0, ...]`: the
/// first (the base) is the counts after the run's first step, at its start;
/// each other one the counts after a later step, at that step's start.
/// Rows up to `head` have been written out (or are the base). Kept only
/// when the rank's timeline stores rows; the buffer is reused from run to
/// run.
#[derive(Default)]
pub(crate) struct StepKv {
    /// Kept at all.
    pub(super) on: bool,
    rows: Vec<u64>,
    head: usize,
}

/// Columns of a [`StepKv`] row before the groups'.
const KV_FIXED: usize = 4;

impl StepKv {
    fn width(groups: usize) -> usize {
        KV_FIXED + groups
    }

    /// Starts the rows of a run planned at `now`: the base.
    fn begin(&mut self, now: SimTime, pool: &super::KvPool) {
        self.rows.clear();
        self.head = 0;
        self.push(now, pool);
    }

    /// A row of the pool's counts now, for the step starting at `start`
    /// (none if no count changed since the row before).
    fn push(&mut self, start: SimTime, pool: &super::KvPool) {
        let w = Self::width(pool.group_used().len());
        let counts = [pool.used(), pool.free(), pool.cached_free()];
        if self.rows.len() >= w {
            let prev = &self.rows[self.rows.len() - w..];
            if prev[1..KV_FIXED] == counts && prev[KV_FIXED..] == *pool.group_used() {
                return;
            }
        }
        self.rows.push(start.as_nanos());
        self.rows.extend_from_slice(&counts);
        self.rows.extend_from_slice(pool.group_used());
    }

    /// Forgets every row (the run's remaining steps will not run).
    pub(super) fn clear(&mut self) {
        self.rows.clear();
        self.head = 0;
    }

    /// Keeps only the rows of steps starting before `end` (a cut run's).
    fn keep_before(&mut self, end: SimTime, groups: usize) {
        let w = Self::width(groups);
        let mut n = self.rows.len() / w;
        while n > 1 && self.rows[(n - 1) * w] >= end.as_nanos() {
            n -= 1;
        }
        self.rows.truncate(n * w);
        if n <= 1 {
            self.clear();
        }
    }

    /// When the first step not written out yet starts, if any.
    pub(super) fn first_pending(&self, groups: usize) -> Option<SimTime> {
        let w = Self::width(groups);
        self.rows.get((self.head + 1) * w).map(|&t| SimTime::from_nanos(t))
    }

    /// How much column `col` (1: used, 2: free, 3: cached free, 4 + g:
    /// group g's used) changes over the steps not written out yet, modulo
    /// 2^64: the pool's count less this is the count at the start of the
    /// first of them.
    pub(super) fn pending(&self, col: usize, groups: usize) -> u64 {
        let w = Self::width(groups);
        let n = self.rows.len() / w;
        if n == 0 {
            return 0;
        }
        self.rows[(n - 1) * w + col].wrapping_sub(self.rows[self.head * w + col])
    }

    /// Hands each step starting at or before `now` not written out yet to
    /// `row` (its start, and each column's change since the row before,
    /// modulo 2^64), in step order; forgets them.
    pub(super) fn take_until(&mut self, now: SimTime, groups: usize, mut row: impl FnMut(SimTime, &[u64])) {
        let w = Self::width(groups);
        let mut delta = [0u64; KV_FIXED + crate::kv::MAX_GROUPS];
        while let Some(&t) = self.rows.get((self.head + 1) * w) {
            if t > now.as_nanos() {
                return;
            }
            let (before, after) = self.rows[self.head * w..].split_at(w);
            for (d, (a, b)) in delta.iter_mut().zip(after[..w].iter().zip(before)).skip(1) {
                *d = a.wrapping_sub(*b);
            }
            row(SimTime::from_nanos(t), &delta[..w]);
            self.head += 1;
        }
        self.clear();
    }
}

/// The blocks a run took ahead of the steps that need them.
#[derive(Default)]
pub(super) struct Ahead {
    /// Members given blocks of steps after the first of the run in flight
    /// (taken from plain free blocks; given back by `settle` once a cut run
    /// leaves them ahead and anything needs or reads them).
    pub(super) members: Vec<(SeqKey, u32)>,
    /// Blocks the changes held ahead gave back (a window group's blocks
    /// leaving the window before the step that frees them).
    pub(super) freed: u64,
    /// (step, blocks in use after its block changes) for the steps of the
    /// run in flight, for the peak.
    pub(super) step_used: Vec<(u64, u64)>,
    /// The step being planned frees blocks while something waits for
    /// blocks: it runs alone.
    freed_next: bool,
    /// An empty schedule call just before this one freed blocks (it only
    /// preempted): the step being planned runs alone.
    pub(super) freed_before: bool,
    /// Scratch for [`Core::take_blocks`]: (key, membership, tokens at the step).
    step_changes: Vec<(SeqKey, u32, Tokens)>,
    /// Scratch for [`Core::take_blocks`]: the entries due at a step.
    due: Vec<(SeqKey, u32)>,
    /// The run in flight was cut short.
    pub(super) cut_short: bool,
    /// A plan with the decoding set in place is being formed: the members
    /// hold the next step's blocks already (taken before the policy ran),
    /// as stepping would have them once the running sequences are
    /// scheduled, so `settle` gives back only what lies past that step.
    pub(super) planning: bool,
}

/// The step times a cut run of decode steps computed for the steps it
/// dropped, with the shape of the first of them. A plan whose steps go on
/// with the same batch (a decode rank's run cut by a message that changes
/// nothing in it, such as a reservation) takes them instead of asking the
/// model again: a step's time is a pure function of its shape
/// ([`crate::models::steptime::StepTimeModel`]), so a match on the first shape is
/// the whole check, and a run's later shapes follow from its first.
#[derive(Default)]
pub(super) struct Spare {
    /// The first shape of the run in flight, then (after a cut) of the
    /// first step dropped.
    shape: BatchShape,
    times: Vec<SimDuration>,
}

/// The run of decode steps in flight, for its later chunks: a run's step
/// times are computed a chunk at a time (its step timer is re-armed at a
/// chunk's end, [`Core::extend`]), so that a run cut early has not asked
/// the model for the steps it never runs. Its blocks are taken chunk by
/// chunk too; nothing else touches the rank's pool before a chunk's end
/// (any message cuts the run first), so taking them then is taking them
/// at the plan.
#[derive(Default)]
pub(super) struct Run {
    /// The steps the run may have (to its first finish, or `max_run`).
    most: u64,
    /// The last computed step's shape.
    shape: BatchShape,
    /// No blocks of an earlier cut run were held ahead at its plan (its
    /// block counts after each step are then the stepping ones).
    exact: bool,
    /// Steps the last run ran: the first chunk of the next is as many (at
    /// least `MIN_CHUNK`). Runs on a rank that handoffs or arrivals keep
    /// cutting tend to run alike; twice as many priced half a chunk of steps
    /// that never ran (Llama 1P1D, 2,000 requests: 58.3k step-time calls
    /// for 37.7k steps, now 51.5k).
    last: u64,
}

impl Run {
    /// The run in flight ended after `k` steps. Only runs of decode steps
    /// that could have gone on count (a step with prefill work is one step
    /// by itself and says nothing of how long the next run will last).
    pub(super) fn ran(&mut self, k: u64) {
        if self.most > 1 || k > 1 {
            self.last = k;
        }
    }
}

/// The fewest steps a run's first chunk computes.
const MIN_CHUNK: u64 = 4;

impl Spare {
    /// The spare times for a run starting at `first` (none if it starts
    /// elsewhere).
    #[inline]
    fn for_run(&self, first: &BatchShape) -> usize {
        if !self.times.is_empty() && self.shape == *first { self.times.len() } else { 0 }
    }
}

impl Core {
    /// Whether the decoding set runs ([`Scheduler::set_lazy_decoding`]).
    /// (Under vLLM's priority policy too: a step that needs a preemption is
    /// planned again one by one, whichever the victim.)
    pub(super) fn lazy(&self) -> bool {
        self.lazy_decoding
    }

    /// Whether a running sequence that just computed `step_tokens` in the
    /// step that ended may join the decoding set now: always, but where
    /// skipped-block frees lag, only after a step of one token, so that
    /// every step of its membership starts where the step before it
    /// started ([`Member::step_from`](super::decoding::Member::step_from)); after a longer chunk it
    /// steps once more one by one first.
    #[inline]
    pub(super) fn may_join(&self, step_tokens: Tokens) -> bool {
        self.lazy() && (step_tokens.get() == 1 || !self.lags_skips())
    }

    /// Whether a sequence's skipped blocks are freed on the processed-token
    /// basis, one step late: vLLM's asynchronous loop frees the blocks a
    /// step skips with `remove_skipped_blocks(num_computed −
    /// num_in_flight)` (`kv_cache_manager.py:561-568`), and a sequence that
    /// was in the step in flight still has that step's tokens in flight, so
    /// its window starts where that step started, and in Mamba's align mode
    /// it still holds the state block of where that step started
    /// (`crate::vllm::mamba::earlier_states`).
    #[inline]
    pub(super) fn lags_skips(&self) -> bool {
        self.lags
    }

    /// Whether `seq`'s last step is still in flight to vLLM at this plan:
    /// under the asynchronous loop, the plan at the end of step `n` is
    /// vLLM's schedule call made while step `n` ran, unless the call
    /// before this one was empty (then the next call comes at once, with
    /// nothing in flight).
    #[inline]
    pub(super) fn in_flight(&self, seq: &Seq) -> bool {
        self.engine == EngineLoop::Async && self.last_call_ran && seq.stepped == self.log.step
    }

    /// Whether vLLM fences this rank's block frees behind the batches in
    /// flight (`defer_block_free`, `scheduler.py:188-195`): a KV consumer
    /// (a decode rank) whose engine runs more than one batch at once.
    #[inline]
    pub(super) fn defers_frees(&self) -> bool {
        self.connector && self.engine.concurrent_batches() > 1
    }

    /// Whether a running sequence outside the decoding set that computes
    /// in the next step comes before a member in running order. The set
    /// plans its members first; stepping one by one, as vLLM does, goes in
    /// running order: the budget a chunk sees (vLLM takes a member's token
    /// only when it reaches it, so it gives a chunk the budget binds the
    /// tokens of the members after it too) and the order of evictions and
    /// preemptions then differ, so such a step is planned one by one.
    ///
    /// Looked for in Mamba's align mode, where a chunk ends on a block
    /// boundary and leaves budget over for sequences after a prompt still
    /// being computed, and where skipped-block frees lag, where a sequence
    /// steps once more one by one after its last chunk while one admitted
    /// after it, whose last prompt step was of one token (a whole-prompt
    /// hit), may have joined; and with vLLM's long-prefill threshold, which
    /// leaves budget over after a capped chunk. Elsewhere a sequence is admitted only when
    /// the budget is left over after the chunks before it, so the chunk
    /// before it was its sequence's last, and a sequence joins the set once
    /// its prompt is computed, before any admitted after it can. O(1) there,
    /// and when every running sequence is a member.
    fn computes_ahead_of_members(&self) -> bool {
        let running = &self.seqs.running;
        let capped = self.opts.long_prefill_token_threshold > 0;
        if (self.pool.align().is_none() && !self.lags && !capped) || running.len() as u64 == self.dec.count {
            return false;
        }
        let mut computing = false;
        for &key in running {
            let seq = self.seqs.get(key);
            if seq.member.is_some() {
                if computing {
                    return true;
                }
            } else {
                computing |= !seq.finished;
            }
        }
        false
    }

    /// Plans the next step with `policy`, or a run of steps of pure decoding
    /// ending at the latest at `horizon`. Returns the time until the event
    /// that ends it, or `None` if there is nothing to run (or a step is in
    /// flight).
    pub(super) fn plan_step(
        &mut self,
        policy: &mut dyn BatchPolicy,
        now: SimTime,
        horizon: SimTime,
    ) -> Option<SimDuration> {
        if self.stepping {
            return None;
        }
        self.calls += 1;
        self.victim_held = false;
        // Only the last plan's preemptions are kept (for the step log).
        self.preempted.clear();
        // The decoding set first, costing nothing per member; if it does not
        // fit the budget, its blocks, or a sequence needs a preemption, fall
        // back to planning every sequence one by one.
        let mut shape = None;
        self.ahead.freed_next = false;
        let budget = self.limits.max_num_batched_tokens;
        if self.lazy()
            && self.dec.count <= budget
            && !self.computes_ahead_of_members()
            && self.take_blocks(self.log.step + 1).is_ok()
        {
            let after = self.dec.context(self.log.step + 1);
            let members = BatchShape::decoding(self.dec.count, after - self.dec.count);
            self.ahead.planning = true;
            let mut step = Step::new(self, true, members, budget - members.new_tokens);
            let planned = policy.schedule(&mut step).is_ok().then(|| step.shape());
            self.ahead.planning = false;
            shape = planned;
        }
        let mut shape = match shape {
            Some(s) => s,
            None => {
                self.materialize_all();
                let mut step = Step::new(self, false, BatchShape::default(), budget);
                policy.schedule(&mut step).expect("planning one by one preempts instead of replanning");
                step.shape()
            }
        };
        self.last_call_ran = !(self.batch.is_empty() && self.dec.count == 0);
        if !self.last_call_ran {
            return None;
        }
        // The blocks of the step about to run (unless a cut run still holds
        // some ahead).
        self.pool.note_peak();
        self.stepping = true;
        self.step_started = now;
        let first = shape;
        let spare = self.spare.for_run(&first) as u64;
        // Saturating: a step time past the end of simulated time must not wrap
        // the clock (the run stops at `END_OF_TIME` with an error instead).
        let mut end =
            now.saturating_add(if spare > 0 { self.spare.times[0] } else { self.step_time.step_time(&shape) });
        self.log.push(end);
        let mut k = 1u64;
        if self.batch.is_empty() {
            // Pure decoding: the same batch until the first member finishes.
            let last = self.next_finish().expect("members have finish steps");
            let mut most = (last - self.log.step).min(self.max_run as u64);
            if self.ahead.freed_next || self.ahead.freed_before {
                most = 1; // see take_blocks, and Scheduler::start_step
            }
            if self.finishing > 0 || !self.inbox.is_empty() {
                // The asynchronous loop: sequences that finished leave after
                // this plan, and work held back may be taken at the next.
                most = 1;
            }
            self.run.most = most;
            self.run.exact = self.ahead.members.is_empty();
            let chunk = most.min(self.run.last.max(MIN_CHUNK));
            // The times of a cut run's steps first, then the model's.
            while k < chunk.min(spare) && end < horizon {
                shape.next_decode_step();
                end = end.saturating_add(self.spare.times[k as usize]);
                self.log.push(end);
                k += 1;
            }
            if k < chunk && end < horizon {
                let log = &mut self.log;
                self.step_time.decode_run(&mut shape, &mut |t| {
                    end = end.saturating_add(t);
                    log.push(end);
                    k += 1;
                    k < chunk && end < horizon
                });
            }
            if k > 1 && self.step_kv.on {
                self.step_kv.begin(now, &self.pool);
            }
            if k > 1
                && let Err(short) = self.take_blocks(self.log.step + k)
            {
                // Stop the run before the first step whose blocks are missing.
                debug_assert!(short > self.log.step + 1, "the first step's blocks are held");
                k = short - 1 - self.log.step;
                let n = self.log.to_drop(k);
                self.log.drop_last(n);
                self.run.most = k;
            }
            if end >= horizon {
                self.run.most = k;
            }
            self.run.shape = shape;
        } else {
            self.run.most = 1;
        }
        self.spare.times.clear();
        self.spare.shape = first;
        self.log.planned = k as usize;
        if k == 1 {
            self.step_kv.clear();
        }
        Some(self.log.last_end() - now)
    }

    /// At the end of a run's chunk: computes the next chunk (as many steps
    /// again as the run has, up to its first finish) and takes its blocks;
    /// returns the run's new end, or `None` if the run ends here.
    pub(super) fn extend(&mut self) -> Option<SimTime> {
        let planned = self.log.planned as u64;
        if !self.stepping || planned >= self.run.most || self.ahead.cut_short {
            return None;
        }
        let k = self.run.most.min(2 * planned);
        let mut end = self.log.last_end();
        if self.step_kv.on && self.step_kv.rows.is_empty() {
            // The rank wrote out the chunk's rows (the last one was the
            // base of the next): the counts now are the base of this one.
            self.step_kv.begin(end, &self.pool);
        }
        let mut shape = self.run.shape;
        let (log, mut left) = (&mut self.log, k - planned);
        self.step_time.decode_run(&mut shape, &mut |t| {
            end = end.saturating_add(t);
            log.push(end);
            left -= 1;
            left > 0
        });
        self.run.shape = shape;
        let mut k = k;
        if let Err(short) = self.take_blocks(self.log.step + k) {
            // The chunk's steps from the first whose blocks are missing do
            // not run: the run ends before it.
            k = short - 1 - self.log.step;
            let n = self.log.to_drop(k);
            self.log.drop_last(n);
            self.run.most = k;
            if k == planned {
                return None;
            }
        }
        self.log.planned = k as usize;
        Some(self.log.last_end())
    }

    /// Gives every member the blocks of each step up to `e` it has not got
    /// yet, step by step in step order, as stepping one event at a time
    /// would. On a shortfall, returns the first step whose blocks are missing
    /// (the changes of earlier steps stay made). Past the next step, blocks
    /// are recorded as held ahead, so that a cut can give them back and the
    /// pool is, whenever anything else looks at it, what stepping one event
    /// at a time would have made it.
    ///
    /// A step's changes are made all or none, from plain free blocks and,
    /// where they fall short, by evicting cached blocks from the head of the
    /// LRU order (journaled when the step is ahead, so that a cut undoes
    /// them). Evicting is exact only if the order the members' changes are
    /// made in cannot matter and stepping would have no other free blocks:
    /// no member gives blocks back in the step, no window group frees plain
    /// blocks midway, and ahead of the step no blocks of a cut run are
    /// held. Otherwise, or if the free and evictable blocks fall short, it
    /// is a shortfall (for the next step, the caller then plans every
    /// sequence one by one, with evictions and preemptions in their order). A window
    /// group's holding also shrinks as tokens leave the window; since the
    /// growth alone must fit, blocks freed by one member never serve
    /// another's growth in the same step earlier than stepping would. Blocks
    /// freed into the eviction order (the window cache, Mamba states in
    /// align mode) are never freed ahead, and the members of a step that
    /// frees some are visited in running order, the order stepping one by
    /// one frees them in.
    fn take_blocks(&mut self, e: u64) -> Result<(), u64> {
        // Pool counts read while blocks of a cut run are still held ahead
        // are not the stepping ones, so they only count towards the peak
        // once given back.
        let exact = if self.stepping && self.log.planned > 1 { self.run.exact } else { self.ahead.members.is_empty() };
        let lagging = self.lags_skips();
        let mut step_changes = std::mem::take(&mut self.ahead.step_changes);
        let window_cache = self.pool.window_cached();
        let align = self.pool.align();
        let may_evict = !self.pool.frees_plain_midway();
        let repeats = self.dec.changes.may_repeat();
        let mut due = std::mem::take(&mut self.ahead.due);
        let result = loop {
            let Some(n) = self.dec.changes.next_due(e) else { break Ok(()) };
            let ahead = n > self.log.step + 1;
            // This step's changes, and how many blocks they grow by.
            step_changes.clear();
            let mut grow = 0u64;
            let mut net = 0i64;
            // With the window cache, blocks leaving the window go into the
            // eviction order, where nothing can take them back: a step that
            // frees some is never taken ahead.
            let mut caches = false;
            for &(key, g) in self.dec.changes.take_step(n, &mut due) {
                let Some(seq) = self.seqs.member(key, g) else { continue };
                let m = seq.member.expect("member");
                // (Steps are looked at from after the last completed one on.)
                debug_assert!(n > m.join, "a member's changes come after it joined");
                let to = m.tokens_at(n);
                if seq.alloc.tokens() >= to || (repeats && step_changes.iter().any(|&(k, ..)| k == key)) {
                    // A stale entry (left by a give-back) or a second copy
                    // (a heap's; a ring's bucket names a member once): the
                    // member holds this step's blocks already, and its live
                    // entry carries on.
                    continue;
                }
                let from = m.step_from(n, to, lagging);
                let delta = self.pool.change_in_blocks(&seq.alloc, from, to);
                // (Blocks freed into the eviction order are not plain free.)
                let mut cached = 0;
                if window_cache {
                    cached = self.pool.cached_by_step(&seq.alloc, from) as i64;
                    caches |= self.pool.skips_cached(&seq.alloc, from);
                }
                if align.is_some() {
                    caches |= self.pool.caches_state(&seq.alloc, from, to);
                }
                grow += (delta + cached).max(0) as u64;
                net += delta;
                step_changes.push((key, g, to));
            }
            if caches {
                // Window blocks join the eviction order in running order, as
                // stepping one by one frees them; with sequences outside the
                // set running too, only stepping one by one has that order.
                if self.seqs.running.len() as u64 > self.dec.count {
                    for &(key, g, _) in &step_changes {
                        self.dec.changes.push(n, key, g);
                    }
                    break Err(n);
                }
            }
            if caches || (exact && net < grow as i64) {
                // Blocks freed into the eviction order join it in running
                // order; and where some member gives blocks back, the peak
                // of the step is the largest count after each member's
                // change in running order, as stepping one by one notes it.
                let seqs = &self.seqs;
                step_changes.sort_unstable_by_key(|&(key, ..)| seqs.get(key).admitted);
            }
            if !ahead && !self.ahead.members.is_empty() {
                self.make_room(grow);
                if self.ahead.members.is_empty() {
                    // Given back: the members' blocks moved, so gather the
                    // step again (settle queued their changes anew).
                    for &(key, g, _) in &step_changes {
                        self.dec.changes.push(n, key, g);
                    }
                    continue;
                }
            }
            // Blocks freed at the start of step n (a window group's leaving
            // the window) can let something waiting for blocks in: a waiting
            // sequence at step n's admission, a decode rank's reservation at
            // its end, when stepping one by one retries them. Step n must
            // then start a plan of its own and run alone.
            let waiters = !self.seqs.waiting.is_empty();
            // Short of plain free blocks, the step evicts cached ones as
            // stepping would, when that is exact: no member gives blocks
            // back in it (then which member goes first would decide how
            // many are evicted) and, ahead of the step, no blocks of a cut
            // run are held (stepping would take those first); the
            // evictions of a step ahead are undone if it does not run
            // (`settle`).
            let evicts = grow > self.pool.free_plain();
            let short =
                evicts && (!may_evict || caches || net != grow as i64 || (ahead && !exact) || grow > self.pool.free());
            if short || (net < 0 && waiters && ahead) || (caches && ahead) {
                for &(key, g, _) in &step_changes {
                    self.dec.changes.push(n, key, g);
                }
                break Err(n);
            }
            if net < 0 && waiters {
                self.ahead.freed_next = true;
            }
            let mut most = 0;
            for &(key, g, to) in &step_changes {
                let seq = self.seqs.get_mut(key);
                let m = seq.member.expect("member");
                let free_before = self.pool.free_plain();
                let from = m.step_from(n, to, lagging);
                let resized = match (evicts, ahead) {
                    (false, _) => self.pool.resize_from_free(&mut seq.alloc, from, to),
                    (true, false) => self.pool.resize(&mut seq.alloc, from, to, false),
                    (true, true) => self.pool.resize_ahead(&mut seq.alloc, from, to, n),
                };
                resized.expect("the step's growth fits the free and evictable blocks");
                if align.is_some_and(|b| to.get().is_multiple_of(b.get())) {
                    // The state it writes on the boundary is cached, as
                    // stepping one by one caches it (`Step::put`).
                    self.pool.register_state(&mut seq.alloc, &seq.req.prefix, seq.req.prompt, to);
                }
                if ahead {
                    self.ahead.members.push((key, g));
                    if !evicts {
                        // (An evicting step gives nothing back.)
                        self.ahead.freed += self.pool.free_plain().saturating_sub(free_before);
                    }
                    self.pool.suspend_peak(true);
                }
                let next = m.change_step(seq.alloc.stable_to(u64::from(lagging)));
                self.dec.changes.push(next, key, g);
                most = most.max(self.pool.used());
            }
            if exact {
                self.ahead.step_used.push((n, most));
            }
            if ahead && self.step_kv.on {
                // Counts read with blocks of an earlier cut run still ahead
                // would not be the stepping ones; the rank's timeline reads
                // the pool at the end of every instant, which settles them.
                debug_assert!(exact, "a run planned with blocks of a cut run still held ahead");
                let start = self.log.end(n - 1);
                self.step_kv.push(start, &self.pool);
            }
            self.dec.changes.done(n);
        };
        self.ahead.step_changes = step_changes;
        self.ahead.due = due;
        result
    }

    /// Gives back the blocks members hold ahead of the steps that need them,
    /// bringing the pool to what stepping one event at a time would hold now
    /// (through the step in flight, or the last completed one).
    pub(super) fn settle(&mut self) {
        if self.ahead.members.is_empty() {
            return;
        }
        let target = match (self.stepping, self.ahead.planning) {
            (true, _) => self.log.step + self.log.planned as u64,
            (false, true) => self.log.step + 1,
            (false, false) => self.log.step,
        };
        let mut ahead = std::mem::take(&mut self.ahead.members);
        let lagging = self.lags_skips();
        // Blocks given back first, then the window blocks taken back that a
        // member freed ahead of the step that frees them: the end state is
        // the stepping one, which fits, so the second pass always finds room.
        for regrow in [false, true] {
            for &(key, g) in &ahead {
                let Some(seq) = self.seqs.member_mut(key, g) else { continue };
                let m = seq.member.expect("member");
                let to = m.tokens_at(target);
                if seq.alloc.tokens() <= to {
                    continue;
                }
                let from = m.step_from(target, to, lagging);
                if (self.pool.extra_needed(&seq.alloc, from, to, false) > 0) != regrow {
                    continue;
                }
                self.pool
                    .resize_from_free(&mut seq.alloc, from, to)
                    .expect("blocks given back first leave room for the ones taken back");
                // The old heap entry stays; take_blocks skips it when it
                // comes up (the member holds that step's blocks by then).
                let next = m.change_step(seq.alloc.stable_to(u64::from(lagging)));
                self.dec.changes.push(next, key, g);
            }
        }
        // (The list's room serves the next run.)
        ahead.clear();
        if self.ahead.members.is_empty() {
            self.ahead.members = ahead;
        }
        // The evictions made for the steps given back, last first, now that
        // the blocks they freed are free again.
        self.pool.undo_evictions_after(target);
        self.ahead.freed = 0;
        self.ahead.step_used.retain(|&(n, _)| n <= target);
        self.pool.suspend_peak(false);
        self.pool.note_peak();
    }

    /// Settles first if taking `extra` blocks would need blocks held ahead
    /// (so an allocation never fails or evicts because of them).
    ///
    /// Blocks held ahead make the plain free count smaller than stepping
    /// one by one would, but blocks a window group freed ahead make it
    /// larger; counting the latter out, an allocation that the count allows
    /// succeeds from plain free blocks either way.
    pub(super) fn make_room(&mut self, extra: u64) {
        if !self.ahead.members.is_empty() && extra + self.ahead.freed > self.pool.free_plain() {
            self.settle();
        }
    }

    /// Something may change the batch at `now`: ends a planned run at the end
    /// of the step in progress. Returns the run's new end, if it moved.
    pub(super) fn cut(&mut self, now: SimTime) -> Option<SimTime> {
        if !self.stepping || self.log.planned < 2 {
            return None;
        }
        let log = &mut self.log;
        let first = log.ends.len() - log.planned;
        let keep = log.ends[first..].iter().take_while(|&&e| e < now).count() + 1;
        // Whatever the message brings, the run goes no further than the
        // step in progress: no later chunk.
        self.run.most = self.run.most.min(keep as u64);
        if keep >= log.planned {
            // Every step planned has started: its evictions were made.
            self.pool.commit_evictions();
            return None;
        }
        // The dropped steps' times, for a plan that goes on with this batch.
        self.spare.times.clear();
        let dropped = log.ends[first + keep - 1..].iter();
        self.spare.times.extend(dropped.clone().zip(dropped.skip(1)).map(|(&a, &b)| b - a));
        for _ in 0..keep {
            self.spare.shape.next_decode_step();
        }
        log.ends.truncate(first + keep);
        log.planned = keep;
        let end = log.last_end();
        self.step_kv.keep_before(end, self.pool.group_used().len());
        // The blocks taken for the steps that will not run now stay held
        // until something needs them or looks at the pool (`settle`); but
        // cached blocks evicted for them must be back before anything else
        // touches the pool (the message that cut the run will).
        self.ahead.cut_short = true;
        if self.pool.evicted_ahead() {
            self.settle();
        }
        Some(end)
    }

    /// Where a run's own end never comes (the end of the simulation at
    /// `now`, a crash): the run is cut at the step in progress, and the
    /// steps before it, which ended by `now`, are finished as stepping one
    /// event at a time would have finished them (their tokens, gaps and
    /// counts); the step in progress stays in flight.
    pub(super) fn finish_ended(&mut self, now: SimTime) {
        self.cut(now);
        if !self.stepping || self.log.planned < 2 {
            return;
        }
        let in_progress = self.log.last_end();
        self.log.drop_last(1);
        self.log.planned -= 1;
        let started = self.log.last_end();
        self.finish_step(started);
        debug_assert!(self.done.is_empty(), "no member finishes before its run's last step");
        self.stepping = true;
        self.step_started = started;
        self.log.push(in_progress);
        self.log.planned = 1;
    }

    /// After a run that ran to its end: every block it took ahead is now
    /// needed. Blocks an earlier, cut run took for steps past this one's
    /// end stay ahead.
    pub(super) fn keep_ahead_past(&mut self, step: u64) {
        let seqs = &self.seqs;
        self.ahead.members.retain(|&(key, g)| {
            seqs.member(key, g).is_some_and(|seq| seq.alloc.tokens() > seq.member.expect("member").tokens_at(step))
        });
        if self.ahead.members.is_empty() {
            self.ahead.freed = 0;
            self.pool.suspend_peak(false);
        }
    }
}
