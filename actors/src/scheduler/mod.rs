//! The scheduler of one rank: a vLLM-like continuous-batching scheduler
//! that owns the rank's KV pool and its sequences.
//!
//! A room with one door. Everything a rank does with blocks goes through
//! `Scheduler`: queueing requests, starting and finishing steps, a
//! prefill rank's sources, a decode rank's reservations, reading the pool's
//! counts. Each entry keeps the invariants itself (blocks a planned run
//! holds ahead are settled before anything reads or allocates them;
//! allocations are all or nothing), so a caller cannot break them by
//! forgetting a step. The one thing a rank must do is call
//! `Scheduler::cut` before it handles anything but the end of the step in
//! flight; the rank's single entry point (`ranks::Rank`) does.
//!
//! Inside, one concern per file:
//! - [`policy`]: what runs, what is admitted and what is preempted in a
//!   step ([`BatchPolicy`]; [`VllmPolicy`] is vLLM's rules and the default);
//! - [`step`]: the operations a policy may use while it forms a step;
//! - `decoding`: the decoding set, which makes a decoding sequence cost
//!   nothing per step;
//! - `plan`: one event per step, and one per run of pure decode steps,
//!   with the blocks held ahead of the steps that need them;
//! - `seqs`: the sequences, in a slotmap, with the queue and running list;
//! - `pool`: the KV block pool, with the prefix cache;
//! - `stats`: step counters and inter-token gaps.
//!
//! One step is one engine event: the rank starts the step (at the end of
//! the instant, with everything that arrived then queued), the step-time
//! model says how long it takes, and the rank finishes it when the timer
//! fires. The work per step is proportional to the batch, never to the
//! tokens in it.

mod decoding;
mod plan;
pub mod policy;
mod seqs;
mod stats;
pub mod step;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;

use sim_core::{SimDuration, SimTime};

pub use policy::{BatchPolicy, VllmPolicy};
pub use stats::StepStats;
pub use step::{Replan, Step};

use crate::base::units::Tokens;
use crate::kv::{Alloc, KvPool};
use crate::models::model::CacheGroup;
use crate::models::steptime::StepTimeModel;
use crate::requests::request::{ReqId, Request};
use crate::stats::histogram::Histogram;
use crate::vllm::admission;
use crate::vllm::engine::{self, EngineLoop, Finishing};
use crate::vllm::options::SchedulerOptions;
use plan::{Ahead, StepKv, StepLog};
use seqs::{Seq, SeqKey, Seqs};
use stats::Stats;

/// What a rank's sequences compute towards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Compute the (backed-off) prompt, then hand it off: no output tokens.
    PrefillOnly,
    /// Compute the prompt, then generate output tokens one step at a time.
    Generate,
}

/// The scheduler's limits per step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Tokens computed per step at most.
    pub(crate) max_num_batched_tokens: u64,
    /// Sequences running at once at most.
    pub(crate) max_num_seqs: usize,
}

/// The longest run of decode steps planned as one event.
pub(crate) const DEFAULT_MAX_RUN: usize = 4096;

/// A sequence that finished in the step that just ended.
#[derive(Debug)]
pub(crate) enum Finished {
    /// It produced its last output token; its blocks are free.
    Completed(Box<Request>),
    /// A prefill-only sequence computed its tokens (T, now the request's
    /// `transferred_tokens`); it keeps the blocks of the handoff (the
    /// source release applied).
    Prefilled {
        /// The request.
        req: Box<Request>,
        /// Its blocks, held for the transfer.
        source: Source,
    },
}

/// A prefill rank's source: the blocks of a handoff, held for the transfer
/// until [`Scheduler::release_source`].
#[derive(Debug)]
#[must_use = "a source's blocks stay held until released"]
pub(crate) struct Source {
    alloc: Alloc,
}

/// A decode rank's reservation for a handoff: the blocks the landed KV goes
/// into, until it joins the queue ([`Scheduler::enqueue_landed`]) or is
/// cancelled ([`Scheduler::cancel_reservation`]).
#[derive(Debug)]
#[must_use = "a reservation's blocks stay held until it lands or is cancelled"]
pub(crate) struct Reservation {
    alloc: Alloc,
    /// Its place in the order of reservations: landed loads wait in it.
    no: u64,
    /// Blocks it still needs to hold its whole prompt once landed
    /// ([`Core::load_short`]).
    short: u64,
    /// When its handoff reached the rank ([`Seq::arrived`]).
    arrived: SimTime,
    /// The tokens its window groups hit on their own (vLLM's connector
    /// lookup keeps each group's hit apart beside a Mamba state,
    /// [`KvPool::load_window_hit`]; the full-attention hit elsewhere):
    /// what those groups read starts there.
    window_hit: Tokens,
}

impl Reservation {
    /// The tokens its window groups hit on their own.
    pub(crate) fn window_hit(&self) -> Tokens {
        self.window_hit
    }
}

/// The pool's counts, read with nothing held ahead.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Counts<'a> {
    pub(crate) used: u64,
    pub(crate) free: u64,
    pub(crate) cached_free: u64,
    pub(crate) group_used: &'a [u64],
    /// Waiting sequences, remote loads not counted.
    pub(crate) waiting: usize,
    pub(crate) running: usize,
}

/// What a rank needs from its scheduler's end of the run.
#[derive(Clone, Debug)]
pub(crate) struct PoolReport {
    pub(crate) num_blocks: u64,
    pub(crate) peak_used: u64,
    pub(crate) evicted_blocks: u64,
}

/// The scheduler of one rank. See the module documentation.
pub(crate) struct Scheduler {
    policy: Box<dyn BatchPolicy>,
    core: Core,
}

/// The scheduler's state; each file of the module works on its part.
struct Core {
    mode: Mode,
    limits: Limits,
    /// Prefill steps that end the prompt take the groups' checkpoint blocks.
    checkpoints: bool,
    pool: KvPool,
    step_time: Box<dyn StepTimeModel>,
    seqs: Seqs,
    /// The step in flight's sequences outside the decoding set.
    batch: Vec<SeqKey>,
    stepping: bool,
    step_started: SimTime,
    stats: Stats,
    check_invariants: bool,
    /// The rank runs vLLM's KV connector (a P/D decode rank): a finishing
    /// request frees its skipped blocks first
    /// ([`KvPool::release_with_connector`]).
    connector: bool,
    /// Sequences that cannot fit in the pool even alone, with the blocks
    /// their step needed (their blocks are still held).
    stuck: Vec<(Seq, u64)>,
    /// Blocks the last admission that fell short needed in all.
    last_need: u64,
    max_run: usize,
    lazy_decoding: bool,
    log: StepLog,
    dec: decoding::DecodingSet,
    ahead: Ahead,
    /// The step times a cut run computed and did not run.
    spare: plan::Spare,
    /// The run of decode steps in flight, for its later chunks.
    run: plan::Run,
    /// The pool's counts after each step of the run in flight, for the
    /// rank's timeline.
    step_kv: StepKv,
    /// Scratch: the groups' counts as stepping has them now.
    group_now: Vec<u64>,
    /// Schedule calls so far (plans started).
    calls: u64,
    /// Remote loads the last schedule calls reserved, with their hits, for
    /// the rank to start their transfers ([`Scheduler::take_reserved`]).
    reserved: Vec<(Box<Request>, Tokens, Reservation)>,
    /// Handoffs admitted to be computed here, their prefill's KV unread
    /// ([`Scheduler::take_computed_locally`]): request and prefill rank.
    computed_locally: Vec<(ReqId, Option<u32>)>,
    /// Blocks the remote loads reserved and not yet scheduled (loading, or
    /// landed and waiting) still need to hold their whole prompt
    /// ([`Core::load_short`]): vLLM counts them among the prefills in
    /// flight.
    loads_short: u64,
    /// Reservations made so far (numbers them, in order).
    reservations_made: u64,
    /// Remote loads not reserved at the first schedule call that could.
    reservations_waited: u64,
    /// Sequences finished in the step being finished, in order.
    done: Vec<Seq>,
    /// Requests preempted by the last plan (kept for the step log).
    preempted: Vec<ReqId>,
    /// How the rank's engine loop drives the scheduler.
    engine: EngineLoop,
    /// Whether the last schedule call planned a step: vLLM's batch in
    /// flight at the next call is then that step, else nothing that writes
    /// (an empty call is followed by the next at once).
    last_call_ran: bool,
    /// The last plan left a victim unpreempted because the step in flight
    /// writes its blocks ([`Core::defers_frees`]); if it planned nothing,
    /// the next schedule call, at once, has nothing in flight.
    victim_held: bool,
    /// Whether skipped-block frees lag ([`Core::lags_skips`]): fixed by the
    /// engine loop and the pool's groups, so read once.
    lags: bool,
    /// vLLM's scheduler options the rank runs with (admission by the whole
    /// sequence, the long-prefill cap, chunked prefill, the active bound,
    /// the watermark).
    opts: SchedulerOptions,
    /// Remote loads reserved whose KV has not landed (vLLM keeps them in its
    /// waiting queue, where the long-prefill cap counts them).
    loads_out: usize,
    /// Hold new work back as the asynchronous loop does
    /// ([`engine::visible_at_plan`]); off where the caller numbers the
    /// schedule calls itself (`pdsim steps`).
    hold_inputs: bool,
    /// Running sequences whose last token came out (`Seq::finished`) and
    /// that leave only after the next schedule call (the asynchronous
    /// loop, [`Finishing::AfterNextSchedule`]).
    finishing: usize,
    /// Sequences that left after the last schedule calls, their blocks
    /// freed (or held as a source), for the rank
    /// ([`Scheduler::take_released`]).
    released: Vec<Finished>,
    /// New work held back: (the step it arrived in, the sequence, whether it
    /// holds its blocks already).
    inbox: VecDeque<(u64, Seq, bool)>,
    /// Every output token as it comes out, (request, time), for a live run
    /// ([`Scheduler::set_token_log`]); `None`, the default, keeps none.
    token_log: Option<Vec<(ReqId, SimTime)>>,
}

impl Scheduler {
    /// A scheduler over a pool of `num_blocks` shared by `groups` (with or
    /// without prefix caching), with its step-time model and batching
    /// policy. `checkpoints`: prefill steps that end the prompt take the
    /// groups' checkpoint blocks.
    pub(crate) fn new(
        mode: Mode,
        limits: Limits,
        checkpoints: bool,
        (groups, num_blocks, prefix_caching): (Vec<CacheGroup>, u64, bool),
        step_time: Box<dyn StepTimeModel>,
        policy: Box<dyn BatchPolicy>,
    ) -> Self {
        let pool = KvPool::new(groups, num_blocks, prefix_caching);
        Self::with_pool(mode, limits, checkpoints, pool, step_time, policy)
    }

    fn with_pool(
        mode: Mode,
        limits: Limits,
        checkpoints: bool,
        pool: KvPool,
        step_time: Box<dyn StepTimeModel>,
        policy: Box<dyn BatchPolicy>,
    ) -> Self {
        let dec = decoding::DecodingSet::new(pool.uniform_fa());
        let core = Core {
            mode,
            limits,
            checkpoints,
            pool,
            step_time,
            seqs: Seqs::default(),
            batch: Vec::new(),
            stepping: false,
            step_started: SimTime::ZERO,
            stats: Stats::default(),
            check_invariants: false,
            connector: false,
            stuck: Vec::new(),
            last_need: 0,
            max_run: DEFAULT_MAX_RUN,
            lazy_decoding: true,
            log: StepLog::default(),
            dec,
            ahead: Ahead::default(),
            spare: plan::Spare::default(),
            run: plan::Run::default(),
            step_kv: StepKv::default(),
            group_now: Vec::new(),
            calls: 0,
            reserved: Vec::new(),
            computed_locally: Vec::new(),
            loads_short: 0,
            reservations_made: 0,
            reservations_waited: 0,
            done: Vec::new(),
            preempted: Vec::new(),
            engine: EngineLoop::Sync,
            lags: false,
            last_call_ran: false,
            victim_held: false,
            opts: SchedulerOptions::default(),
            loads_out: 0,
            hold_inputs: false,
            finishing: 0,
            released: Vec::new(),
            inbox: VecDeque::new(),
            token_log: None,
        };
        Scheduler { policy, core }
    }

    /// Checks the pool's conservation after every step (a broken one panics:
    /// it is a bug in pdsim).
    pub(crate) fn set_check_invariants(&mut self, on: bool) {
        self.core.check_invariants = on;
    }

    /// The rank runs vLLM's KV connector (a P/D decode rank): a request
    /// that finishes frees the blocks its processed tokens skip before the
    /// rest (vLLM's `_connector_finished`).
    pub(crate) fn set_kv_connector(&mut self, on: bool) {
        self.core.connector = on;
    }

    /// Drives the scheduler as `engine` says (vLLM's synchronous
    /// `Scheduler` by default here; the rank sets its version's). With
    /// `hold_inputs`, new work is held back as the asynchronous loop holds
    /// it (from the plan after the one that follows the step it arrived in);
    /// without, every enqueued sequence may be scheduled by the next plan.
    pub(crate) fn set_engine_loop(&mut self, engine: EngineLoop, hold_inputs: bool) {
        self.core.engine = engine;
        let pool = &self.core.pool;
        self.core.lags = engine == EngineLoop::Async && (pool.has_window() || pool.align().is_some());
        self.core.hold_inputs = hold_inputs && engine.holds_inputs();
    }

    /// How the rank's engine loop drives this scheduler.
    pub(crate) fn engine_loop(&self) -> EngineLoop {
        self.core.engine
    }

    /// Runs with vLLM's scheduler options `opts` (its defaults until set).
    pub(crate) fn set_options(&mut self, opts: SchedulerOptions) {
        self.core.opts = opts;
        self.core.seqs.set_priority_order(opts.priority);
    }

    /// Uses the decoding set (on by default). Off, every step handles every
    /// sequence one by one: the reference the decoding set is tested against.
    pub(crate) fn set_lazy_decoding(&mut self, on: bool) {
        self.core.lazy_decoding = on;
    }

    /// Logs every output token, (request, time), for
    /// [`Scheduler::take_tokens`], and turns the decoding set off so that
    /// each step hands out its tokens as it ends (the records are the same
    /// either way, to the nanosecond). Off by default: a run that does not
    /// ask logs nothing and pays nothing for it.
    pub(crate) fn set_token_log(&mut self, on: bool) {
        self.core.token_log = on.then(Vec::new);
        if on {
            self.core.lazy_decoding = false;
        }
    }

    /// Moves the output tokens logged since the last call to `out`, in the
    /// order they came out.
    pub(crate) fn take_tokens(&mut self, out: &mut Vec<(ReqId, SimTime)>) {
        if let Some(log) = &mut self.core.token_log {
            out.append(log);
        }
    }

    /// The longest run of decode steps planned as one event.
    #[cfg(test)]
    pub(crate) fn set_max_run(&mut self, steps: usize) {
        self.core.max_run = steps.max(1);
    }

    /// Queues a new request: a prefill-only rank computes `prefill_target`
    /// tokens of it (T), a generating one its prompt and output.
    pub(crate) fn enqueue(&mut self, req: Box<Request>, prefill_target: Tokens, now: SimTime) {
        let alloc = Alloc::owned_by(req.id);
        // (It reached vLLM's server when the client sent it: the server
        // stamps its arrival before it tokenizes, `renderers/base.py`.)
        let arrived = req.t.arrival;
        self.core.take_in(Seq::new(req, arrived, alloc, Tokens::ZERO, prefill_target, false), false, now);
    }

    /// The fewest blocks `req` must hold at once here, and the pool's
    /// budget: a prefill-only rank's last step (with checkpoint blocks
    /// where the version takes them); a generating rank's first decode step
    /// or its last, whichever holds more. A lower bound, so a request above
    /// the budget can never fit; one that passes may still fail later if a
    /// chunked prefill's window blocks push it over (the scheduler fails it
    /// then, [`Scheduler::take_stuck`]).
    pub(crate) fn least_blocks(&self, req: &Request) -> (u64, u64) {
        let pool = &self.core.pool;
        let needed = match self.core.mode {
            Mode::PrefillOnly => pool.blocks_needed(req.transferred_tokens, self.core.checkpoints),
            Mode::Generate => {
                let last = req.prompt.saturating_add(req.output).saturating_sub(Tokens::new(1));
                pool.blocks_needed(req.prompt, false).max(pool.blocks_needed(last, false))
            }
        };
        (needed, pool.num_blocks())
    }

    /// Starts the next step (or run of decode steps, ending at the latest
    /// at `horizon`) if none is in flight and there is work; returns the
    /// time until it ends. Requests first scheduled now get `started`
    /// stamped. The remote loads it reserved wait in
    /// [`Scheduler::take_reserved`].
    ///
    /// `caller_between`: the caller applies outputs of its own between an
    /// empty asynchronous call and the next (a prefill rank's polled
    /// source frees, which vLLM applies before that next call). Such a call
    /// then returns `None` with everything queued made visible, and the
    /// caller makes the next call itself once its outputs are applied.
    pub(crate) fn start_step(
        &mut self,
        now: SimTime,
        horizon: SimTime,
        started: fn(&mut Request) -> &mut Option<SimTime>,
        caller_between: bool,
    ) -> Option<SimDuration> {
        // (`freed_before` is false here unless a call since the last step
        // was an empty one that preempted and the caller made the next:
        // see below.)
        loop {
            let released = self.core.released.len();
            if let Some(dt) = self.start_one_step(now, horizon, started) {
                self.core.ahead.freed_before = false;
                return Some(dt);
            }
            let core = &mut self.core;
            if core.stepping {
                core.ahead.freed_before = false;
                return None;
            }
            // The asynchronous loop's empty schedule call takes no time: the
            // sequences that finished leave, the work held back is taken in,
            // and the engine schedules again at once.
            // (So does one that held a victim back for the step in flight:
            // the next call has none.)
            let held = std::mem::take(&mut core.victim_held);
            if core.engine == EngineLoop::Async && (core.released.len() > released || !core.inbox.is_empty() || held) {
                core.take_inbox(u64::MAX);
                if caller_between {
                    return None;
                }
                continue;
            }
            // A schedule call that only preempted is an empty step, which
            // takes no time: schedule again (what it preempted waits now;
            // a sequence that can never fit is given up, so this ends). The
            // blocks it freed may let a waiter in after the next step, as
            // stepping one by one would retry it then: that step runs alone.
            if core.preempted.is_empty() || core.seqs.waiting.is_empty() {
                core.ahead.freed_before = false;
                return None;
            }
            core.ahead.freed_before = true;
            if caller_between {
                return None;
            }
        }
    }

    /// One schedule call: [`Scheduler::start_step`] without the new call
    /// that follows an empty step that preempted (the step log counts it).
    pub(crate) fn start_one_step(
        &mut self,
        now: SimTime,
        horizon: SimTime,
        started: fn(&mut Request) -> &mut Option<SimTime>,
    ) -> Option<SimDuration> {
        if !self.core.stepping {
            let ended = self.core.log.step;
            self.core.take_inbox(ended);
        }
        let dt = self.core.plan_step(self.policy.as_mut(), now, horizon);
        let core = &mut self.core;
        if dt.is_some() {
            for &key in core.batch.iter().chain(&core.dec.fresh) {
                started(&mut core.seqs.get_mut(key).req).get_or_insert(now);
            }
        }
        // The sequences that finished in the step before this plan leave now.
        if core.finishing > 0 {
            core.finishing = 0;
            core.seqs.take_finished(&mut core.done);
            for seq in core.done.drain(..) {
                core.released.push(core_finished(&mut core.pool, core.mode, core.connector, seq));
            }
        }
        dt
    }

    /// Moves the sequences that left after the last schedule calls (the
    /// asynchronous loop's finished ones, [`Finishing::AfterNextSchedule`])
    /// to `done`, their blocks freed (or, for a prefill, held as the
    /// source), in the order they left.
    pub(crate) fn take_released(&mut self, done: &mut Vec<Finished>) {
        done.append(&mut self.core.released);
    }

    /// When the step (or run of steps) in flight ends, if one is.
    pub(crate) fn step_end(&self) -> Option<SimTime> {
        self.core.stepping.then(|| self.core.log.last_end())
    }

    /// Moves the ids of the requests the last plan preempted to `out`.
    pub(crate) fn take_preempted(&mut self, out: &mut Vec<ReqId>) {
        out.append(&mut self.core.preempted);
    }

    /// The step in flight's sequences outside the decoding set, with the
    /// tokens each computes, in scheduling order.
    pub(crate) fn scheduled(&self) -> impl Iterator<Item = (ReqId, u64)> + '_ {
        let seqs = &self.core.seqs;
        self.core.batch.iter().map(|&k| (seqs.get(k).req.id, seqs.get(k).step_tokens.get()))
    }

    /// A sequence that can never fit in the pool, even alone, with the
    /// blocks its step needed (its blocks given back); the rank fails it.
    pub(crate) fn take_stuck(&mut self) -> Option<(Box<Request>, u64)> {
        let (mut seq, needed) = self.core.stuck.pop()?;
        self.core.pool.release(&mut seq.alloc, seq.computed);
        Some((seq.req, needed))
    }

    /// Something may change the batch at `now`: ends a planned run at the
    /// end of the step in progress. Returns the run's new end, if it moved
    /// (the rank reschedules its step timer).
    pub(crate) fn cut(&mut self, now: SimTime) -> Option<SimTime> {
        self.core.cut(now)
    }

    /// The end of the simulation at `end`: a run in flight is cut at the
    /// step in progress, and its steps that ended by then are finished.
    pub(crate) fn close(&mut self, end: SimTime) {
        self.core.finish_ended(end);
    }

    /// At the end of a chunk of a run of decode steps: the run's new end if
    /// it goes on (the rank re-arms its step timer), else `None` (the run,
    /// or step, ends now: [`Scheduler::finish_step`]).
    pub(crate) fn extend(&mut self) -> Option<SimTime> {
        self.core.extend()
    }

    /// Applies the step (or run of steps) that just ended at `now`; appends
    /// the sequences that finished to `done`, their blocks freed (or, for a
    /// prefill, held as the source).
    pub(crate) fn finish_step(&mut self, now: SimTime, done: &mut Vec<Finished>) {
        self.core.finish_step(now);
        let core = &mut self.core;
        for seq in core.done.drain(..) {
            done.push(core_finished(&mut core.pool, core.mode, core.connector, seq));
        }
        if core.check_invariants
            && let Err(e) = core.pool.check()
        {
            panic!("KV pool invariant broken at {now}: {e}");
        }
    }

    /// Gives back a prefill's source (transfer done, cancelled or expired).
    pub(crate) fn release_source(&mut self, source: Source) {
        let Source { mut alloc } = source;
        // Its KV is computed through its holding's end (the prompt).
        let computed = alloc.tokens();
        self.core.pool.release(&mut alloc, computed);
    }

    /// Queues a decode rank's handoff as a remote load: a schedule call
    /// reserves its destination blocks in its waiting loop, as vLLM's
    /// decode scheduler allocates a remote load
    /// (`scheduler.py` `schedule()`, the `load_kv_async` path): in queue
    /// order behind the landed handoffs and the preempted sequences (under
    /// the priority policy, in (priority, arrival here) order), only
    /// in a step that preempted nothing, while the token budget and
    /// `max_num_seqs` allow, and the first that cannot get its blocks stops
    /// admission. A reserved load takes no tokens and no running slot; it
    /// leaves the scheduler ([`Scheduler::take_reserved`]) until its KV
    /// lands ([`Scheduler::enqueue_landed`]).
    pub(crate) fn enqueue_remote(&mut self, req: Box<Request>, now: SimTime) {
        let alloc = Alloc::owned_by(req.id);
        let mut seq = Seq::new(req, now, alloc, Tokens::ZERO, Tokens::ZERO, false);
        seq.remote = true;
        seq.first_call = self.core.calls + 1;
        self.core.take_in(seq, false, now);
    }

    /// Moves the remote loads the last schedule calls reserved to `out`, in
    /// the order they were reserved, each with the tokens its prefix-cache
    /// hit covers (never the last prompt token) and its reservation: what
    /// its first decode step holds (the KV of all N prompt tokens, as vLLM
    /// allocates for the whole prompt), its cached prefix pinned.
    pub(crate) fn take_reserved(&mut self, out: &mut Vec<(Box<Request>, Tokens, Reservation)>) {
        out.append(&mut self.core.reserved);
    }

    /// Moves the handoffs the last schedule calls admitted to compute here
    /// instead of loading them to `out`, each with its prefill rank: their
    /// sources are to be released unread. With a Mamba-type group, a
    /// handoff whose full-attention hit covers the tokens the prefill
    /// computed, but with no state cached at its end, has nothing to load
    /// (vLLM's connector counts tokens past the full-attention hit): vLLM
    /// computes it from the hit every group agrees on, as a new request
    /// (`KvPool::connector_hit`).
    pub(crate) fn take_computed_locally(&mut self, out: &mut Vec<(ReqId, Option<u32>)>) {
        out.append(&mut self.core.computed_locally);
    }

    /// Takes out the waiting remote load of request `id` (its handoff was
    /// cancelled before its reservation).
    pub(crate) fn cancel_waiting(&mut self, id: ReqId) -> Option<Box<Request>> {
        let seqs = &mut self.core.seqs;
        let wi = seqs.waiting.iter().position(|&k| seqs.get(k).remote && seqs.get(k).req.id == id)?;
        let key = seqs.unqueue(wi, false);
        Some(seqs.remove(key).req)
    }

    /// Remote loads waiting for their reservation.
    pub(crate) fn remote_waiting(&self) -> usize {
        self.core.seqs.remote_waiting() + self.core.inbox.iter().filter(|(_, s, _)| s.remote).count()
    }

    /// Remote loads that were not reserved at the first schedule call that
    /// could have reserved them (they waited for blocks, or behind a
    /// sequence that did).
    pub(crate) fn reservations_waited(&self) -> u64 {
        self.core.reservations_waited
    }

    /// Gives back a reservation whose transfer will not land.
    pub(crate) fn cancel_reservation(&mut self, reservation: Reservation) {
        let mut alloc = reservation.alloc;
        self.core.loads_out -= 1;
        self.core.loads_short -= reservation.short;
        // Nothing landed: no block of it holds computed KV.
        self.core.pool.release(&mut alloc, Tokens::ZERO);
    }

    /// The KV of `req` landed in `reservation`: it queues to compute its
    /// last prompt token (vLLM computes it on the decode side: never
    /// computed by a Mamba-type prefill, recomputed for its logits
    /// otherwise). Its blocks go into the prefix cache when a schedule
    /// call's admission first reaches it ([`Step::admit`]), as vLLM caches
    /// them when its waiting loop peeks the request, not when the read
    /// ends: landed handoffs are cached in queue order.
    ///
    /// It waits ahead of every sequence that holds no blocks, among the
    /// landed handoffs in the order they were reserved (under the priority
    /// policy, in priority order; vLLM keeps a load
    /// in its `kv_holding_waiting` queue from its reservation on, skipped
    /// while it loads, and drains that queue before `waiting`).
    pub(crate) fn enqueue_landed(&mut self, req: Box<Request>, reservation: Reservation, now: SimTime) {
        let Reservation { alloc, no, short, arrived, .. } = reservation;
        self.core.loads_out -= 1;
        let computed = req.prompt.saturating_sub(Tokens::new(1));
        let mut seq = Seq::new(req, arrived, alloc, computed, Tokens::ZERO, true);
        seq.reservation = no;
        seq.load_short = short;
        seq.uncached = true;
        self.core.take_in(seq, true, now);
    }

    /// The pool's counts and the queue lengths, as stepping one event at a
    /// time would have them now (the steps of the run in flight whose
    /// counts were not taken with [`Scheduler::take_step_counts`] yet have
    /// not started).
    pub(crate) fn counts(&mut self) -> Counts<'_> {
        let core = &mut self.core;
        // The blocks a run in flight holds for its later steps are its own
        // until a cut leaves some of them ahead: settling then would forget
        // which members hold them (so a later cut could not give them
        // back); the steps not started yet are taken out of the counts
        // instead.
        if !core.stepping || core.ahead.cut_short {
            core.settle();
        }
        let groups = core.pool.group_used().len();
        let kv = &core.step_kv;
        core.group_now.clear();
        let pending = (0..groups).map(|g| kv.pending(4 + g, groups));
        core.group_now.extend(core.pool.group_used().iter().zip(pending).map(|(&u, p)| u.wrapping_sub(p)));
        Counts {
            used: core.pool.used().wrapping_sub(kv.pending(1, groups)),
            free: core.pool.free().wrapping_sub(kv.pending(2, groups)),
            cached_free: core.pool.cached_free().wrapping_sub(kv.pending(3, groups)),
            group_used: &core.group_now,
            // (Work held back counts as waiting: the rank holds it.)
            waiting: core.seqs.waiting.len() - core.seqs.remote_waiting()
                + core.inbox.iter().filter(|(_, s, _)| !s.remote).count(),
            running: core.seqs.running.len(),
        }
    }

    /// Keeps the pool's counts after each step of a planned run (for a
    /// timeline that stores its rows): see [`Scheduler::take_step_counts`].
    pub(crate) fn set_step_counts(&mut self, on: bool) {
        self.core.step_kv.on = on;
        self.core.step_kv.clear();
    }

    /// Hands the counts after each step of the run in flight that started
    /// at or before `now` and changed them to `row`, in step order, as
    /// (its start, the change of [used, free, cached free, used by each
    /// group] since the step before, modulo 2^64); forgets them.
    pub(crate) fn take_step_counts(&mut self, now: SimTime, mut row: impl FnMut(SimTime, &[u64])) {
        let groups = self.core.pool.group_used().len();
        self.core.step_kv.take_until(now, groups, |t, d| row(t, &d[1..]));
    }

    /// When the first step of the run in flight whose counts
    /// [`Scheduler::take_step_counts`] has not handed out starts, if any.
    pub(crate) fn step_counts_from(&self) -> Option<SimTime> {
        self.core.step_kv.first_pending(self.core.pool.group_used().len())
    }

    /// Forgets the counts of the steps of the run in flight that have not
    /// started (they will not: the rank crashed, or the run ended).
    pub(crate) fn drop_step_counts(&mut self) {
        self.core.step_kv.clear();
    }

    /// The rank stopped for good at `now` (it crashed): the step in flight,
    /// if any, never ends, but the rank was busy with it until now.
    pub(crate) fn crashed(&mut self, now: SimTime) {
        let core = &mut self.core;
        core.finish_ended(now);
        if core.stepping {
            core.stats.cut_off(now - core.step_started);
        }
    }

    /// Removes every sequence, its blocks given back (end-of-run accounting,
    /// or a crash).
    #[expect(clippy::vec_box, reason = "requests travel boxed in messages; unboxing them to box again copies each")]
    pub(crate) fn drain(&mut self) -> Vec<Box<Request>> {
        let core = &mut self.core;
        core.materialize_all();
        // A step cut off by a crash made its evictions.
        core.pool.commit_evictions();
        core.batch.clear();
        core.finishing = 0;
        let mut out = Vec::new();
        for (_, mut seq, _) in core.inbox.drain(..) {
            core.pool.release(&mut seq.alloc, seq.computed);
            out.push(seq.req);
        }
        for f in core.released.drain(..) {
            match f {
                Finished::Completed(req) => out.push(req),
                Finished::Prefilled { req, source } => {
                    let Source { mut alloc } = source;
                    let computed = alloc.tokens();
                    core.pool.release(&mut alloc, computed);
                    out.push(req);
                }
            }
        }
        for mut seq in core.seqs.drain() {
            core.pool.release(&mut seq.alloc, seq.computed);
            out.push(seq.req);
        }
        // Reserved loads the rank has not taken yet (none between its calls).
        for (req, _, Reservation { mut alloc, short, .. }) in core.reserved.drain(..) {
            core.pool.release(&mut alloc, Tokens::ZERO);
            core.loads_out -= 1;
            core.loads_short -= short;
            out.push(req);
        }
        out
    }

    /// The pool's conservation: what is wrong, if anything.
    pub(crate) fn check(&self) -> Result<(), String> {
        self.core.pool.check()
    }

    /// Step counters.
    pub(crate) fn stats(&self) -> StepStats {
        self.core.stats.counters
    }

    /// Gaps between consecutive output tokens.
    pub(crate) fn itl(&self) -> &Histogram {
        &self.core.stats.itl
    }

    /// Counts output tokens in 1 s windows from `origin` (default: time
    /// zero), each `delay` after its step ends (when its client gets it);
    /// set before the first step.
    pub(crate) fn set_token_origin(&mut self, origin: SimTime, delay: SimDuration) {
        self.core.stats.tokens = crate::stats::bench::TokenWindows::delayed(origin, delay);
    }

    /// The output tokens of each 1 s window (left empty).
    pub(crate) fn take_token_windows(&mut self) -> crate::stats::bench::TokenWindows {
        let empty = self.core.stats.tokens.emptied();
        std::mem::replace(&mut self.core.stats.tokens, empty)
    }

    /// The pool's budget, peak and evictions.
    pub(crate) fn pool_report(&self) -> PoolReport {
        let pool = &self.core.pool;
        PoolReport { num_blocks: pool.num_blocks(), peak_used: pool.peak_used(), evicted_blocks: pool.evicted_blocks() }
    }
}

/// A finished sequence as the rank gets it: a generating one's blocks
/// freed, a prefill's source release applied ([`crate::vllm::handoff::source_release`]: a window group
/// keeps its in-window blocks, a state group its running block; the rest,
/// checkpoint blocks included, is freed).
fn core_finished(pool: &mut KvPool, mode: Mode, connector: bool, seq: Seq) -> Finished {
    let Seq { mut req, mut alloc, computed, .. } = seq;
    match mode {
        Mode::Generate => {
            // Every block it computed is cached, the last one's too: the
            // asynchronous loop's output of its last step is applied before
            // it is freed, and that update caches through all it computed
            // (`update_from_output` calls `cache_blocks(num_computed −
            // num_in_flight)` with nothing left in flight, `scheduler.py`
            // 2406-2416), where a preemption frees on the placeholder's
            // basis ([`Seq::hashable`]).
            if connector {
                pool.release_with_connector(&mut alloc, computed);
            } else {
                pool.release(&mut alloc, computed);
            }
            Finished::Completed(req)
        }
        Mode::PrefillOnly => {
            pool.release_to_source(&mut alloc);
            req.transferred_tokens = computed;
            Finished::Prefilled { req, source: Source { alloc } }
        }
    }
}

impl Core {
    /// Blocks the prefills in flight still need to hold their whole known
    /// sequence (vLLM's `_inflight_prefill_reserved_blocks`): running
    /// sequences outside the decoding set whose goal is not reached after
    /// the step being planned, if it schedules them, or else after the
    /// last step they computed in ([`Seq::prefilling`]: vLLM's set keeps a
    /// request from the chunk that leaves it prefilling to the next step
    /// scheduled for it). O(running + batch). Read while a step is planned
    /// (`batch` is then that step's).
    fn inflight_prefill_blocks(&self) -> u64 {
        let in_flight = Tokens::new(self.engine.in_flight_tokens(self.limits.max_num_batched_tokens));
        let remaining = |s: &Seq| {
            let whole = admission::whole_sequence(s.computed, s.goal(self.mode), false, in_flight);
            self.pool.remaining_blocks(&s.alloc, whole)
        };
        let seqs = &self.seqs;
        let unscheduled: u64 = seqs
            .running
            .iter()
            .map(|&k| seqs.get(k))
            .filter(|s| s.member.is_none() && s.prefilling)
            .map(remaining)
            .sum();
        // The step's own sequences (all running, outside the set) count by
        // what it schedules for them instead.
        let (mut added, mut taken) = (0u64, 0u64);
        for s in self.batch.iter().map(|&k| seqs.get(k)) {
            let after = s.computed + s.step_tokens < s.goal(self.mode);
            if after != s.prefilling {
                let r = remaining(s);
                if after { added += r } else { taken += r }
            }
        }
        debug_assert!(taken <= unscheduled + added, "the step's sequences are among the running ones");
        unscheduled + added - taken + self.loads_short
    }

    /// Blocks a remote load holding `alloc` (`req`'s reservation) still
    /// needs to hold its whole prompt: `(blocks for N tokens from T) −
    /// held`, vLLM's `_request_remaining_blocks` of a request in
    /// `_inflight_prefills` (`v1/core/sched/scheduler.py:3404-3436`; a load
    /// joins the set at its reservation, line 1542, and leaves it once
    /// scheduled past its prompt, line 1871). Zero where T = N (full
    /// attention, windows); with a Mamba group, where B divides T = N − 1,
    /// the full-attention block of token N and in align mode the next
    /// state block ([`crate::vllm::handoff::load_whole`]).
    fn load_short(&self, req: &Request, alloc: &Alloc) -> u64 {
        let (t, n) = (req.transferred_tokens, req.prompt);
        if t >= n {
            return 0;
        }
        let in_flight = Tokens::new(self.engine.in_flight_tokens(self.limits.max_num_batched_tokens));
        let whole = admission::whole_sequence(t, n, false, in_flight);
        self.pool.remaining_blocks(alloc, whole)
    }

    /// Applies the step (or run of steps) that just ended at `now`: the
    /// finished sequences go to `self.done`, in order.
    fn finish_step(&mut self, now: SimTime) {
        debug_assert!(self.stepping);
        debug_assert_eq!(now, self.log.last_end());
        self.stepping = false;
        let mode = self.mode;
        let before = self.log.step;
        let k = self.log.complete();
        // The run's evictions made ahead were for steps that have now run.
        self.pool.commit_evictions();
        self.run.ran(k);
        self.stats.run(k, now - self.step_started);
        // The decoding set: one token per member per step, one gap per step.
        for n in before + 1..=self.log.step {
            let gap = self.log.end(n) - self.log.end(n - 1);
            // Members that joined before their first token have no gap at
            // the run's first step.
            let fresh = if n == before + 1 { self.dec.fresh.len() as u64 } else { 0 };
            self.stats.gaps(gap, self.dec.count - fresh);
            self.stats.tokens_at(self.log.end(n), self.dec.count);
            self.dec.note_gap(n, gap, n == before + 1);
        }
        self.stats.decoded(self.dec.count, k);
        if !std::mem::take(&mut self.ahead.cut_short) {
            self.keep_ahead_past(self.log.step);
        }
        self.pool.note_peak();
        for (n, used) in self.ahead.step_used.drain(..) {
            if n <= self.log.step {
                self.pool.note_peak_of(used);
            }
        }
        self.first_tokens_of_fresh(before);
        // Everything else in the step, one by one (a step with any is a single step).
        let mut any_done = false;
        for bi in 0..self.batch.len() {
            let key = self.batch[bi];
            let seq = self.seqs.get_mut(key);
            seq.stepped_from = seq.computed;
            seq.computed += seq.step_tokens;
            seq.stepped = self.log.step;
            self.stats.computed(seq.step_tokens.get());
            seq.prefilling = seq.computed < seq.goal(mode);
            if seq.prefilling {
                // A chunk samples nothing, and every token it computed was
                // known when it was scheduled (a prompt's, or a recompute's
                // output): all of it is cached.
                seq.placeholder = false;
                continue;
            }
            // The asynchronous loop scheduled this step with the token the
            // step before it sampled as a placeholder.
            seq.placeholder = self.engine == EngineLoop::Async && seq.last_token == Some(self.step_started);
            let finished = match mode {
                Mode::PrefillOnly => true,
                Mode::Generate => {
                    seq.req.generated += Tokens::new(1);
                    let gap = match seq.last_token {
                        None => {
                            seq.req.t.first_token.get_or_insert(now);
                            None
                        }
                        Some(prev) => {
                            let gap = now - prev;
                            seq.req.max_itl = seq.req.max_itl.max(gap);
                            let g = u128::from(gap.as_nanos());
                            seq.req.itl_sq_sum = seq.req.itl_sq_sum.saturating_add(g * g);
                            Some(gap)
                        }
                    };
                    self.stats.output_token(gap);
                    self.stats.tokens_at(now, 1);
                    seq.last_token = Some(now);
                    seq.req.t.last_token = Some(now);
                    if let Some(log) = &mut self.token_log {
                        log.push((seq.req.id, now));
                    }
                    seq.req.generated >= seq.req.output
                }
            };
            let step_tokens = seq.step_tokens;
            if finished {
                any_done = true;
                seq.finished = true;
            } else if self.may_join(step_tokens) {
                self.join(key, true);
            }
        }
        // Members whose last token came out in this run.
        if self.pop_finished_members() {
            any_done = true;
        }
        if any_done {
            match self.engine.finishing() {
                Finishing::AtOnce => self.seqs.take_finished(&mut self.done),
                Finishing::AfterNextSchedule => {
                    let seqs = &self.seqs;
                    self.finishing = seqs.running.iter().filter(|&&k| seqs.get(k).finished).count();
                }
            }
        }
        self.log.forget_before_last();
    }

    /// New work: into the waiting queue, or, with the asynchronous loop,
    /// held back if it arrived while a step was in flight or as one ended
    /// (`now` is the end of the last step), until the plan that may take it
    /// ([`engine::visible_at_plan`]).
    fn take_in(&mut self, seq: Seq, holding: bool, now: SimTime) {
        if self.hold_inputs && (self.stepping || (self.log.step > 0 && self.log.last_end() == now)) {
            let arrived_in = if self.stepping { self.log.step + self.log.planned as u64 } else { self.log.step };
            self.inbox.push_back((arrived_in, seq, holding));
            return;
        }
        if holding {
            self.seqs.enqueue_holding(seq);
        } else {
            self.seqs.enqueue(seq);
        }
    }

    /// Requests running or waiting as vLLM counts them at a schedule call
    /// (`get_request_counts`): a remote load is in its waiting queue from
    /// its reservation until it is scheduled, landed or not; new work held
    /// back has not reached it.
    fn running_and_waiting(&self) -> usize {
        let held_landed = self.inbox.iter().filter(|(_, _, holding)| *holding).count();
        self.seqs.running.len() + self.seqs.waiting.len() + self.loads_out + held_landed
    }

    /// Queues the held work a plan after step `ended` may take, in the
    /// order it came.
    fn take_inbox(&mut self, ended: u64) {
        // (It came in step order, so what a plan may take is a prefix.)
        while self.inbox.front().is_some_and(|&(arrived_in, ..)| engine::visible_at_plan(arrived_in, ended)) {
            let (_, seq, holding) = self.inbox.pop_front().expect("a front");
            if holding {
                self.seqs.enqueue_holding(seq);
            } else {
                self.seqs.enqueue(seq);
            }
        }
    }
}
