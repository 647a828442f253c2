//! How vLLM's engine core drives its scheduler: synchronously, or
//! asynchronously with a batch queue (vLLM 0.33's default).
//!
//! Synchronous (`Scheduler`, `EngineCore.step`): a step is scheduled once
//! the step before it has produced its outputs, so it sees every token and
//! every finished request of that step.
//!
//! Asynchronous (`AsyncScheduler` driven by
//! `EngineCore.step_with_batch_queue`, `v1/engine/core.py:708-822`, with a
//! queue of two batches, `config/vllm.py:588` `max_concurrent_batches`):
//! batch `n + 1` is scheduled while batch `n` executes, and batch `n`'s
//! outputs are applied (`update_from_output`) only after that. The
//! scheduler counts the tokens batch `n` will sample as output placeholders
//! (`async_scheduler.py` `_update_after_schedule`), so what it schedules is
//! what it would schedule with them sampled, except that:
//!
//! - a request whose last token is in batch `n` is not scheduled again
//!   (`scheduler.py:800-812`), but it still runs, holds its blocks and a
//!   running slot until batch `n`'s outputs are applied, after batch `n + 1`
//!   is scheduled ([`Finishing::AfterNextSchedule`]);
//! - a request that arrives while batch `n` executes is first scheduled in
//!   batch `n + 2`: the engine takes new requests between its schedule
//!   calls, and batch `n + 1` was scheduled when batch `n` started
//!   ([`visible_at_plan`]); unless batch `n + 1` turned out empty, when it
//!   is scheduled as soon as batch `n` ends;
//! - blocks a step skips (below a sliding window, a Mamba state's earlier
//!   states in align mode) are freed on the processed-token basis
//!   (`kv_cache_manager.py:561-568`): a request in batch `n` still has
//!   batch `n`'s tokens in flight when batch `n + 1` is scheduled, so its
//!   window starts where batch `n` started, one step behind the
//!   synchronous loop's, and it still holds the state block batch `n`
//!   started from (`Core::lags_skips` in the scheduler,
//!   `crate::vllm::mamba::earlier_states`); a state written by a step whose
//!   token is still a placeholder is cached at once, where vLLM waits for
//!   the token (not yet followed: `tests/it/timed.rs`);
//! - a finished request's blocks are all cached when it is freed: the
//!   update that finishes it caches through everything it computed (a
//!   preempted one's only through what was processed).
//!
//! pdsim plans the batch that executes from `e(n)` on at `e(n)`, the end of
//! batch `n` (the state it needs, batch `n`'s outputs, is known then), and
//! applies the first two rules, which make that plan the one vLLM made at
//! `e(n − 1)`. vLLM 0.33 enables it unless an option it does not support is
//! set (`config/vllm.py:1685-1719`: pooling models, pipeline parallelism,
//! some speculative methods, executors without support), none of which
//! pdsim models.

/// How a rank's engine loop drives its scheduler (vLLM's
/// `--async-scheduling`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum EngineLoop {
    /// `Scheduler`: each step scheduled after the one before it produced
    /// its outputs.
    Sync,
    /// `AsyncScheduler` with a batch queue of two (vLLM 0.33's default).
    #[default]
    Async,
}

/// When a sequence whose last token came out leaves the running batch and
/// frees its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finishing {
    /// At once: before the next step is scheduled.
    AtOnce,
    /// After the next step is scheduled (it holds its blocks and its running
    /// slot through that schedule call, and is not scheduled in it).
    AfterNextSchedule,
}

impl EngineLoop {
    /// When finished sequences leave ([`Finishing`]).
    #[inline]
    pub(crate) fn finishing(self) -> Finishing {
        match self {
            EngineLoop::Sync => Finishing::AtOnce,
            EngineLoop::Async => Finishing::AfterNextSchedule,
        }
    }

    /// Batches that may be scheduled and not yet settled at once
    /// (`VllmConfig.max_concurrent_batches`, `config/vllm.py:588-598`): two
    /// with the batch queue.
    #[inline]
    pub(crate) fn concurrent_batches(self) -> u64 {
        match self {
            EngineLoop::Sync => 1,
            EngineLoop::Async => 2,
        }
    }

    /// The most tokens scheduled and not yet settled, for a step budget of
    /// `max_num_batched_tokens` (`VllmConfig.max_in_flight_tokens`,
    /// `config/vllm.py:601-609`): what a window group's admission cap
    /// leaves room for ([`crate::vllm::window::admission_cap_blocks`]).
    #[inline]
    pub(crate) fn in_flight_tokens(self, max_num_batched_tokens: u64) -> u64 {
        self.concurrent_batches().saturating_mul(max_num_batched_tokens)
    }

    /// Whether new work is held back from the plan that follows the step in
    /// flight when it arrived ([`visible_at_plan`]).
    #[inline]
    pub(crate) fn holds_inputs(self) -> bool {
        self == EngineLoop::Async
    }
}

/// Whether work that arrived during step `arrived_in` (the step in flight
/// then, or the one that had just ended at that instant) may be scheduled
/// by a plan made at the end of step `ended`: with the asynchronous loop,
/// only from the plan after the one at the end of `arrived_in` on (the
/// plan at `e(arrived_in)` is vLLM's schedule call at `e(arrived_in − 1)`,
/// made before the work came). The engine's other rule (an empty plan makes
/// everything visible at once) is the scheduler's.
#[inline]
pub(crate) fn visible_at_plan(arrived_in: u64, ended: u64) -> bool {
    arrived_in < ended
}
