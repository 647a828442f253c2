//! What a batching policy may do while it forms one step: the operations of
//! [`Step`], each of which keeps the scheduler's invariants (blocks held
//! ahead are settled before an allocation needs them, allocations are all
//! or nothing, members of the decoding set are counted, never visited).

use super::seqs::{Seq, SeqKey};
use super::{Core, Finished, Mode, Reservation};
use crate::base::units::Tokens;
use crate::kv::ConnectorHit;
use crate::models::steptime::BatchShape;
use crate::vllm::mamba::{Chunk, aligned_chunk};
use crate::vllm::{admission, handoff};

/// The step cannot be formed with the decoding set in place (a sequence
/// needs a preemption): the scheduler brings every member up to date and
/// asks the policy again. Only the scheduler makes one; a policy passes it
/// on with `?`.
#[derive(Debug)]
pub struct Replan(());

/// One step being formed: the running sequences (in admission order), the
/// waiting queue (in queue order) and the token budget left.
///
/// Members of the decoding set (sequences that decode one token a step)
/// are already in the step and already counted in the budget; the running
/// indices a policy visits skip them ([`Step::next_to_compute`]).
pub struct Step<'a> {
    core: &'a mut Core,
    /// Planning with the decoding set in place (a preemption replans).
    lazy: bool,
    shape: BatchShape,
    budget: u64,
    preempted: usize,
    /// Blocks the prefills in flight still need: read at a reservation,
    /// kept for the next ones until the step puts another sequence in (a
    /// waiting one whose chunk leaves it prefilling joins vLLM's
    /// `_inflight_prefills` at once, and the next load keeps its blocks).
    inflight: Option<u64>,
    /// The last admission attempt failed for want of budget, not of blocks
    /// (vLLM's align mode left its chunk no tokens, or chunked prefill is
    /// off and its tokens do not fit).
    clipped: bool,
    /// The most tokens one sequence gets in this step (vLLM's
    /// `long_prefill_token_threshold`, as it applies to this step; 0: no cap).
    cap: u64,
}

impl<'a> Step<'a> {
    pub(super) fn new(core: &'a mut Core, lazy: bool, shape: BatchShape, budget: u64) -> Self {
        core.batch.clear();
        core.pool.new_step(core.calls);
        let cap = match core.opts.long_prefill_token_threshold {
            0 => 0,
            _ => core.opts.long_prefill_cap(core.running_and_waiting(), core.limits.max_num_batched_tokens),
        };
        Step { core, lazy, shape, budget, preempted: 0, inflight: None, clipped: false, cap }
    }

    pub(super) fn shape(&self) -> BatchShape {
        self.shape
    }

    /// Tokens the step may still compute (`max_num_batched_tokens` less
    /// what is scheduled).
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The rank's `max_num_seqs`.
    pub fn max_num_seqs(&self) -> usize {
        self.core.limits.max_num_seqs
    }

    /// The most sequences admission lets run (vLLM's `max_num_active_seqs`,
    /// by default `max_num_seqs`).
    pub fn max_num_active_seqs(&self) -> usize {
        self.core.opts.max_num_active_seqs.unwrap_or(self.core.limits.max_num_seqs)
    }

    /// Of `left` tokens a running sequence has to compute, those this step
    /// may give it: at most vLLM's `long_prefill_token_threshold` (unless
    /// it is the only request running or waiting) and the budget left.
    /// A threshold of 24, 100 tokens left, a budget of 64: 24.
    pub fn share(&self, left: u64) -> u64 {
        capped(left, self.cap).min(self.budget)
    }

    /// Sequences admitted (running), members of the decoding set included.
    pub fn running(&self) -> usize {
        self.core.seqs.running.len()
    }

    /// Sequences waiting to be admitted.
    pub fn waiting(&self) -> usize {
        self.core.seqs.waiting.len()
    }

    /// Sequences preempted while forming this step: they wait at the front
    /// of the queue (under the priority policy, in their place).
    pub fn preempted(&self) -> usize {
        self.preempted
    }

    /// Whether nothing is in the step yet (members of the decoding set
    /// count as in it, as stepping one by one would).
    pub fn is_empty(&self) -> bool {
        self.core.batch.is_empty() && self.core.dec.count == 0
    }

    /// The first running index from `from` on whose sequence is not in the
    /// decoding set and has tokens to compute (with the asynchronous
    /// engine loop, a sequence whose last token is in flight runs until it
    /// comes out but computes nothing: vLLM's `scheduler.py:800-812`); O(1)
    /// when every running sequence is a member.
    pub fn next_to_compute(&self, from: usize) -> Option<usize> {
        let seqs = &self.core.seqs;
        if seqs.running.len() as u64 == self.core.dec.count {
            return None;
        }
        (from..seqs.running.len()).find(|&i| {
            let seq = seqs.get(seqs.running[i]);
            seq.member.is_none() && !seq.finished
        })
    }

    /// Tokens the running sequence at `i` has to compute before its next
    /// output token (or its hand-off).
    pub fn tokens_left(&self, i: usize) -> Tokens {
        let seq = self.core.seqs.get(self.core.seqs.running[i]);
        seq.goal(self.core.mode) - seq.computed
    }

    /// Of `k` tokens the running sequence at `i` could compute, those it may:
    /// in vLLM's Mamba "align" mode a prefill chunk is clipped to end where
    /// states are cached (`crate::vllm::mamba::aligned_chunk`, vLLM's
    /// `_mamba_block_aligned_split`); 0 means it computes nothing this
    /// step (vLLM skips it and goes on with the next). `k` otherwise.
    pub fn chunk(&self, i: usize, k: u64) -> u64 {
        let seq = self.core.seqs.get(self.core.seqs.running[i]);
        self.core.aligned(seq, seq.computed, k)
    }

    /// Gives the running sequence at `i` the blocks of its next `k` tokens
    /// (at most what it has left) and puts them in the step. `false` when
    /// the pool cannot give them (nothing changed but the blocks vLLM frees
    /// before it checks, `KvPool::resize`), or when `i` is a member of the
    /// decoding set (already in the step). Call it once per sequence per
    /// step.
    pub fn schedule_running(&mut self, i: usize, k: u64) -> bool {
        let core = &mut *self.core;
        let key = core.seqs.running[i];
        let (mode, checkpoints) = (core.mode, core.checkpoints);
        let seq = core.seqs.get(key);
        if seq.member.is_some() {
            return false;
        }
        let k = k.min((seq.goal(mode) - seq.computed).get());
        let to = seq.computed + Tokens::new(k);
        let ckpt = checkpoints && mode == Mode::PrefillOnly && to == seq.goal(mode);
        // The pool's step starts where vLLM frees skipped blocks from: with
        // the asynchronous loop, for a sequence in the step that just ended
        // here (vLLM's batch still in flight when it schedules this one,
        // [`Core::in_flight`]), where that step started
        // ([`Core::lags_skips`]).
        let from = if core.lags_skips() && core.in_flight(seq) {
            seq.alloc.processed_start(seq.stepped_from)
        } else {
            seq.computed
        };
        let mid = seq.computed;
        let extra = core.pool.extra_needed_lagging(&seq.alloc, from, mid, to, ckpt);
        core.make_room(extra);
        let seq = core.seqs.get_mut(key);
        if core.pool.resize_lagging(&mut seq.alloc, from, mid, to, ckpt).is_err() {
            return false;
        }
        self.put(key, k, to);
        true
    }

    /// Preempts the most recently admitted running sequence (recompute: its
    /// blocks are freed and it goes to the front of the queue); returns the
    /// running index it had, or `None` when vLLM would not preempt it
    /// because the step in flight still writes its blocks
    /// (`Step::held_by_step_in_flight`: the policy stops scheduling
    /// running sequences then). With the decoding set in place, asks for a
    /// replan instead.
    pub fn preempt_last(&mut self) -> Result<Option<usize>, Replan> {
        if self.lazy {
            return Err(Replan(()));
        }
        let key = *self.core.seqs.running.last().expect("running is not empty");
        if self.held_by_step_in_flight(key) {
            return Ok(None);
        }
        self.core.seqs.running.pop();
        let seq = self.core.seqs.get(key);
        let hashable = seq.hashable(self.core.in_flight(seq));
        self.preempt(key, hashable);
        Ok(Some(self.core.seqs.running.len()))
    }

    /// Whether the sequence `key` may not be preempted because vLLM would
    /// have to defer the free of its blocks: on a decode rank (vLLM's KV
    /// connector as a consumer) with two batches in flight, vLLM's
    /// scheduler fences block frees behind the steps still running
    /// (`defer_block_free`, `scheduler.py:188-195`), and "a deferred free
    /// will not help with immediate allocation": the running loop stops
    /// instead of preempting a request the batch in flight was scheduled
    /// with (`scheduler.py:940-942`, `_request_blocks_can_be_freed`). Here
    /// the batch vLLM has in flight at a plan is the step that just ended,
    /// unless the schedule call before this one was empty
    /// ([`Core::in_flight`]). Notes the hold for the scheduler, which then
    /// schedules again at once if the plan comes out empty.
    fn held_by_step_in_flight(&mut self, key: SeqKey) -> bool {
        let core = &mut *self.core;
        let held = core.defers_frees() && core.in_flight(core.seqs.get(key));
        core.victim_held |= held;
        held
    }

    /// Whether the rank runs vLLM's priority policy
    /// ([`crate::vllm::options::SchedulerOptions::priority`]).
    pub fn by_priority(&self) -> bool {
        self.core.opts.priority
    }

    /// Preempts the running sequence vLLM's priority policy picks: the
    /// largest (priority, arrival), the first in running order among equals;
    /// returns the running index it had. One already in this step (before
    /// the sequence being scheduled) is taken out of it first: its tokens
    /// go back to the budget, and what its allocation cached stays cached,
    /// as vLLM's does (`scheduler.py:944-967`).
    pub fn preempt_lowest_priority(&mut self) -> Result<Option<usize>, Replan> {
        if self.lazy {
            return Err(Replan(()));
        }
        let v = self.core.seqs.lowest_priority_running();
        if self.held_by_step_in_flight(self.core.seqs.running[v]) {
            return Ok(None);
        }
        let core = &mut *self.core;
        let key = core.seqs.running.remove(v);
        let seq = core.seqs.get(key);
        let mut hashable = seq.hashable(core.in_flight(seq));
        if let Some(bi) = core.batch.iter().position(|&k| k == key) {
            core.batch.remove(bi);
            let k = seq.step_tokens.get();
            let from = seq.computed.get();
            self.budget += k;
            self.shape.remove(k, from, k == 1 && from >= seq.req.prompt.get());
            // vLLM cached its blocks through min(computed + new, the tokens
            // it knows) when it allocated them: with the asynchronous loop,
            // not the token its step in flight samples.
            let in_flight = core.in_flight(seq) && seq.last_token == Some(core.log.last_end());
            let known = seq.goal(core.mode) - Tokens::new(u64::from(in_flight));
            hashable = (seq.computed + seq.step_tokens).min(known).max(hashable);
        }
        self.preempt(key, hashable);
        Ok(Some(v))
    }

    /// Preempts `key`, out of the running list already: its blocks through
    /// `hashable` stay cached for its recompute, the rest are freed, and it
    /// waits again (or, its last token in flight, finishes).
    fn preempt(&mut self, key: SeqKey, hashable: Tokens) {
        let core = &mut *self.core;
        let seq = core.seqs.get_mut(key);
        // Its full blocks stay cached for its recompute, generated ones too
        // (those whose tokens vLLM knows, `Seq::hashable`); a state written
        // past them was never cached.
        core.pool.forget_states_past(&mut seq.alloc, hashable);
        core.pool.register_own(&mut seq.alloc, &seq.req.prefix, seq.req.prompt, hashable);
        core.pool.release(&mut seq.alloc, hashable);
        seq.computed = Tokens::ZERO;
        seq.prefilling = false;
        seq.looked_up = false;
        seq.req.preemptions += 1;
        core.preempted.push(seq.req.id);
        core.stats.preempted();
        if seq.finished && core.mode == Mode::Generate {
            // Its last token is in flight (the asynchronous loop): vLLM
            // delivers it and the request finishes (`_preempt_request`
            // keeps in-flight output, `update_from_output` stops it), its
            // blocks already free. (A prefill's would hand off freed
            // blocks: pdsim recomputes it instead, below.)
            core.finishing -= 1;
            let seq = core.seqs.remove(key);
            core.released.push(Finished::Completed(seq.req));
        } else {
            if seq.finished {
                seq.finished = false;
                core.finishing -= 1;
            }
            core.seqs.requeue_preempted(key);
        }
        self.preempted += 1;
    }

    /// Tries to admit the waiting sequence at `wi` with its first chunk of
    /// this step (what the budget allows of what it has left): a sequence
    /// new to the cache is admitted only if its whole known sequence would
    /// fit (`KvPool::whole_fits`); it then pins its cached prefix and
    /// allocates the chunk, all or nothing. A sequence that holds its
    /// blocks already (a landed handoff) only allocates its chunk. On
    /// success it leaves the queue, runs, and its tokens are taken from the
    /// budget.
    ///
    /// A decode rank's remote load is reserved instead: it pins its cached
    /// prefix and allocates the KV of its whole prompt, all or nothing, and
    /// on success leaves the queue without running (no tokens, no running
    /// slot) until its KV lands.
    pub fn admit(&mut self, wi: usize) -> bool {
        self.clipped = false;
        let key = self.core.seqs.waiting[wi];
        let seq = self.core.seqs.get_mut(key);
        if std::mem::take(&mut seq.uncached) {
            // A landed handoff reached: its blocks enter the cache now.
            let upto = seq.req.transferred_tokens;
            self.core.pool.register(&mut seq.alloc, &seq.req.prefix, seq.req.prompt, upto);
        }
        let mut local_load = false;
        if self.core.seqs.get(key).remote {
            let core = &*self.core;
            let seq = core.seqs.get(key);
            match core.pool.connector_hit(&seq.req.prefix, seq.req.prompt, seq.req.id, seq.req.transferred_tokens) {
                ConnectorHit::Load(hit) => return self.reserve(wi, hit),
                // Nothing to load: admitted as a new request from the hit
                // every group agrees on (as vLLM reconciles a diverged hit),
                // or left a remote load to be looked at again.
                ConnectorHit::ComputeLocally => {
                    self.core.seqs.set_remote(key, false);
                    local_load = true;
                }
            }
        }
        // (The prefill rank's hit, which a first lookup here would take the
        // place of.)
        let prefill_hit = self.core.seqs.get(key).req.prefill_hit;
        let held = !self.core.seqs.get(key).alloc.is_empty();
        if !self.first_chunk(key) {
            if local_load {
                self.core.seqs.set_remote(key, true);
            }
            return false;
        }
        let core = &mut *self.core;
        core.seqs.unqueue(wi, held);
        core.seqs.admit(key);
        if local_load {
            // The prefill's KV is not read: its source goes back now (vLLM's
            // worker tells the prefill side that it reads no block).
            let seq = core.seqs.get_mut(key);
            seq.req.decode_hit = seq.computed;
            seq.req.prefill_hit = prefill_hit;
            seq.req.transferred_tokens = Tokens::ZERO;
            core.computed_locally.push((seq.req.id, seq.req.prefill_rank));
        }
        // A landed load scheduled: no longer among the prefills in flight.
        let seq = core.seqs.get_mut(key);
        core.loads_short -= std::mem::take(&mut seq.load_short);
        // A sequence whose first step is already a decode step (a handoff
        // landed: one token left to compute) joins the decoding set at once.
        // Not a recompute with one token left: its first token's gap runs
        // from its last token before the preemption, which the set's step
        // gaps cannot give; it joins once that token is out.
        let seq = core.seqs.get(key);
        if self.lazy
            && core.mode == Mode::Generate
            && !seq.alloc.holds_past(seq.computed)
            && seq.last_token.is_none()
            && seq.step_tokens.get() == 1
            && seq.computed + seq.step_tokens == seq.goal(core.mode)
        {
            core.batch.pop();
            core.join(key, false);
        }
        true
    }

    /// Reserves the remote load at `wi` past its hit of `hit` cache blocks
    /// (`KvPool::connector_hit`; see [`Step::admit`]). As vLLM's
    /// decode scheduler does for an async load (`reserved_blocks`), it
    /// must leave free the blocks that the prefills in flight (running
    /// sequences whose prompt is not all computed after this step: a
    /// preempted request's recompute, in chunks) still need to hold their
    /// whole known sequence.
    fn reserve(&mut self, wi: usize, hit: u32) -> bool {
        // (The loads reserved in this step count from their reservation on.)
        let keep = *self.inflight.get_or_insert_with(|| self.core.inflight_prefill_blocks() - self.core.loads_short)
            + self.core.loads_short;
        let core = &mut *self.core;
        let wm = core.watermark();
        let key = core.seqs.waiting[wi];
        let seq = core.seqs.get(key);
        let n = seq.req.prompt;
        let t = seq.req.transferred_tokens;
        let windows = core.pool.window_cached() || core.pool.frees_plain_midway();
        let state = handoff::reservation_span(t, n, windows);
        let wn = core.pool.load_window_hit(&seq.req.prefix, n, seq.req.id, hit);
        let need = core.pool.blocks_after_hits(hit, wn, state.0, state.1, false);
        core.make_room(core.pool.pin_and_take_need(hit, need) + keep + wm);
        if t < n && core.opts.reserve_full_isl {
            // (With T = N the allocation's own check is the stricter; with
            // `scheduler_reserve_full_isl` off there is none.)
            let whole = handoff::load_whole(n);
            core.make_room(
                core.pool.pin_and_take_need(hit, core.pool.blocks_after_hits(hit, wn, whole.0, whole.1, false)) + wm,
            );
            let seq = core.seqs.get(key);
            let in_flight = Tokens::new(core.engine.in_flight_tokens(core.limits.max_num_batched_tokens));
            if let Err(short) = core.pool.whole_load_fits(&seq.req.prefix, n, seq.req.id, hit, (t, n), in_flight, wm) {
                core.last_need = short.needed;
                return false;
            }
        }
        let seq = core.seqs.get_mut(key);
        let prefix = &seq.req.prefix;
        // (vLLM's count, which may be above what the reservation holds:
        // `KvPool::load_fits`.)
        let counted = core.pool.load_fits(prefix, n, seq.req.id, hit, (t, t), keep + wm);
        if let Err(short) = counted
            .and_then(|()| core.pool.pin_and_allocate_leaving(&mut seq.alloc, prefix, n, hit, state, false, keep + wm))
        {
            core.last_need = short.needed;
            return false;
        }
        let key = core.seqs.unqueue(wi, false);
        let seq = core.seqs.remove(key);
        if core.calls > seq.first_call {
            core.reservations_waited += 1;
        }
        core.reservations_made += 1;
        core.loads_out += 1;
        let short = core.load_short(&seq.req, &seq.alloc);
        core.loads_short += short;
        let window_hit = core.pool.hit_tokens(wn);
        let reservation =
            Reservation { alloc: seq.alloc, no: core.reservations_made, short, arrived: seq.arrived, window_hit };
        core.reserved.push((seq.req, core.pool.hit_tokens(hit), reservation));
        true
    }

    /// Whether the waiting sequence at `wi` can never fit: it failed to get
    /// its blocks with nothing else running or holding any. Never a remote
    /// load: the decode rank checked at its arrival that its reservation
    /// fits the empty pool (`RankCore::fits`), and its source must be
    /// cancelled with it, which only the rank can do.
    pub fn never_fits(&self, wi: usize) -> bool {
        let core = &*self.core;
        let seq = core.seqs.get(core.seqs.waiting[wi]);
        let own = core.pool.held_by(&seq.alloc);
        !self.clipped && !seq.remote && core.seqs.running.is_empty() && core.pool.used() == own
    }

    /// Takes the waiting sequence at `wi` out: the rank fails it as one that
    /// does not fit, with the blocks its last attempt needed.
    pub fn give_up(&mut self, wi: usize) {
        let core = &mut *self.core;
        let held = !core.seqs.get(core.seqs.waiting[wi]).alloc.is_empty();
        let key = core.seqs.unqueue(wi, held);
        let seq = core.seqs.remove(key);
        core.stuck.push((seq, core.last_need));
    }

    /// The first chunk of the waiting sequence `key`, allocated and put in
    /// the step; `false` when the pool cannot give it (nothing changed).
    fn first_chunk(&mut self, key: SeqKey) -> bool {
        let (budget, cap) = (self.budget, self.cap);
        let core = &mut *self.core;
        let (mode, checkpoints) = (core.mode, core.checkpoints);
        if !core.ahead.members.is_empty() {
            // What the admission takes, at most: a fresh sequence's whole
            // first step (no hit assumed), or an allocated one's growth.
            let seq = core.seqs.get(key);
            let k = (seq.goal(mode) - seq.computed).get().min(budget);
            let (from, to) = (seq.computed, seq.computed + Tokens::new(k));
            // (A fresh one is checked against its whole sequence, unless
            // admission counts its first chunk alone.)
            let need = if seq.looked_up {
                core.pool.extra_needed(&seq.alloc, from, to, checkpoints)
            } else {
                let upto = if core.opts.reserve_full_isl { seq.goal(mode).max(Tokens::new(k)) } else { Tokens::new(k) };
                core.pool.blocks_after_hit(0, Tokens::ZERO, upto, checkpoints)
            };
            core.make_room(need + core.watermark());
        }
        // The blocks vLLM's watermark keeps free (with a request running).
        let wm = core.watermark();
        let pool = &mut core.pool;
        let seq = core.seqs.get_mut(key);
        let goal = seq.goal(mode);
        if !seq.looked_up {
            let (hit, junction) = pool.lookup(&seq.req.prefix, seq.req.prompt, seq.req.id, goal);
            let from = pool.hit_tokens(hit);
            seq.junction = junction;
            let want = capped((goal - from).get(), cap);
            if !core.opts.chunked_prefill && want > budget {
                // Without chunked prefill vLLM stops admission here.
                self.clipped = true;
                return false;
            }
            let k = core.aligned_in(key, from, want.min(budget));
            if k == 0 {
                self.clipped = true;
                return false;
            }
            let pool = &mut core.pool;
            let seq = core.seqs.get_mut(key);
            let to = from + Tokens::new(k);
            let ckpt = checkpoints && mode == Mode::PrefillOnly && to == goal;
            // Whole-sequence admission: it waits unless everything it knows
            // (prompt, and output so far after a preemption) would fit;
            // with `scheduler_reserve_full_isl` off, its first chunk alone.
            let in_flight = Tokens::new(core.engine.in_flight_tokens(core.limits.max_num_batched_tokens));
            let whole = admission::whole_sequence(from, goal, checkpoints && mode == Mode::PrefillOnly, in_flight);
            let fits = match core.opts.reserve_full_isl {
                true => pool.whole_fits(&seq.req.prefix, seq.req.prompt, seq.req.id, hit, whole, wm),
                false => Ok(()),
            };
            let admitted = fits.and_then(|()| {
                let prefix = &seq.req.prefix;
                pool.pin_and_allocate_leaving(&mut seq.alloc, prefix, seq.req.prompt, hit, (from, to), ckpt, wm)
            });
            if let Err(short) = admitted {
                core.last_need = short.needed;
                return false;
            }
            seq.computed = from;
            seq.looked_up = true;
            if seq.req.preemptions == 0 {
                // A decode rank looks up at reservation, so a first lookup
                // here is the prefill's (or the aggregated rank's).
                seq.req.prefill_hit = from;
            }
            self.put(key, k, to);
        } else {
            let computed = seq.computed;
            let want = capped((goal - computed).get(), cap);
            if !core.opts.chunked_prefill && want > budget {
                self.clipped = true;
                return false;
            }
            let k = core.aligned_in(key, computed, want.min(budget));
            if k == 0 {
                self.clipped = true;
                return false;
            }
            let pool = &mut core.pool;
            let seq = core.seqs.get_mut(key);
            let (from, to) = (seq.computed, seq.computed + Tokens::new(k));
            let ckpt = checkpoints && mode == Mode::PrefillOnly && to == goal;
            if wm > 0 {
                let extra = pool.extra_needed(&seq.alloc, from, to, ckpt);
                if extra + wm > pool.free() {
                    core.last_need = pool.held_by(&seq.alloc) + extra + wm;
                    return false;
                }
            }
            if let Err(short) = pool.resize(&mut seq.alloc, from, to, ckpt) {
                core.last_need = pool.held_by(&seq.alloc) + short.needed;
                return false;
            }
            self.put(key, k, to);
        }
        true
    }

    /// Puts `k` tokens of `key`, reaching `to`, in the step. The blocks the
    /// step fills enter the prefix cache now, as vLLM caches full blocks
    /// when it allocates them (`allocate_slots` → `cache_blocks`): a request
    /// scheduled later in the same step already hits them.
    fn put(&mut self, key: SeqKey, k: u64, to: Tokens) {
        let core = &mut *self.core;
        let seq = core.seqs.get_mut(key);
        seq.step_tokens = Tokens::new(k);
        core.pool.register(&mut seq.alloc, &seq.req.prefix, seq.req.prompt, to);
        core.batch.push(key);
        self.inflight = None;
        self.budget -= k;
        // A sequence decodes when its one token lies past its prompt; a
        // prompt chunk or a recompute prefills.
        let from = to.get() - k;
        let decoding = k == 1 && from >= seq.req.prompt.get();
        self.shape.add(k, from, decoding);
    }
}

/// `k` tokens capped at `cap` (0: no cap), as vLLM applies
/// `long_prefill_token_threshold` (`if 0 < threshold < k`).
fn capped(k: u64, cap: u64) -> u64 {
    if cap > 0 && cap < k { cap } else { k }
}

impl Core {
    /// The free blocks vLLM's watermark keeps from an admission: its
    /// `watermark` blocks once a request is running (`has_scheduled_reqs`,
    /// `kv_cache_manager.py:518-526`), else none.
    pub(super) fn watermark(&self) -> u64 {
        if self.seqs.running.is_empty() { 0 } else { self.opts.watermark_blocks }
    }

    /// Of `k` tokens `seq` could compute from `start` on, those it may
    /// (vLLM's Mamba align split, [`aligned_chunk`], in align mode, else all `k`).
    pub(super) fn aligned(&self, seq: &Seq, start: Tokens, k: u64) -> u64 {
        let Some(block) = self.pool.align() else { return k };
        let known = seq.goal(self.mode);
        let chunk = Chunk { start, tokens: k, known, prompt: seq.req.prompt.min(known), junction: seq.junction };
        aligned_chunk(chunk, block, self.opts.max_prefill_tokens(self.limits.max_num_batched_tokens))
    }

    /// [`Core::aligned`] for the sequence `key`.
    pub(super) fn aligned_in(&self, key: SeqKey, start: Tokens, k: u64) -> u64 {
        self.aligned(self.seqs.get(key), start, k)
    }
}
