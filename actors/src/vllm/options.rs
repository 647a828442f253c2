//! vLLM 0.33.0's scheduler options (`SchedulerConfig`,
//! `vllm/config/scheduler.py`): those pdsim follows ([`SchedulerOptions`]),
//! and those it does not model ([`UNMODELLED_SCHEDULER_OPTIONS`]), each with
//! vLLM's default, which is what pdsim runs, and why another value is not
//! modelled. A scenario that sets one of those is refused with the reason,
//! placed at the field, rather than run as if it were not there.
//!
//! (`max_num_partial_prefills` and `max_long_partial_prefills` are not
//! options of vLLM 0.33: its v1 scheduler has no partial-prefill limits,
//! so a role that gives them is refused as an unknown field.)

/// The scheduler options of vLLM 0.33.0 pdsim follows, per rank, each
/// with vLLM's default ([`SchedulerOptions::default`]); the rules are
/// `v1/core/sched/scheduler.py` `schedule()` and `kv_cache_manager.py`
/// `allocate_slots`, followed in `crate::scheduler`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SchedulerOptions {
    /// `scheduler_reserve_full_isl` (true): a waiting request is admitted
    /// only if its whole known sequence fits; false, if its first chunk
    /// does (`crate::vllm::admission`).
    pub reserve_full_isl: bool,
    /// `long_prefill_token_threshold` (0, off): a step gives one request at
    /// most this many tokens, running or admitted, unless it is the only
    /// request running or waiting (`scheduler.py:754-770`, `:844`,
    /// `:1332`); in Mamba's align mode it also bounds the chunk the split
    /// may round down to a block boundary (`scheduler.py:612-617`).
    pub long_prefill_token_threshold: u64,
    /// `long_prefill_token_threshold_adaptive` (false): the threshold is
    /// raised to `max_num_batched_tokens / (running + waiting)` when that is
    /// larger (`scheduler.py:764-769`).
    pub long_prefill_adaptive: bool,
    /// `enable_chunked_prefill` (true): false, a waiting request whose
    /// tokens do not all fit the step's budget left stops admission for the
    /// step (`scheduler.py:1335-1345`); vLLM then refuses a budget below
    /// `max_model_len` (`config/scheduler.py:317-328`).
    pub chunked_prefill: bool,
    /// `max_num_active_seqs` (unset: `max_num_seqs`): admission stops once
    /// this many requests run (`scheduler.py:1071-1074`).
    pub max_num_active_seqs: Option<usize>,
    /// `watermark` as blocks, `int(watermark × num_blocks)` of vLLM's
    /// blocks (its null block counted) (0): an admission, a reservation or
    /// a preempted request's return must leave this many blocks free, when
    /// a request is already running (`kv_cache_manager.py:518-526`,
    /// `:546`, `:585`).
    pub watermark_blocks: u64,
    /// `policy` (`"fcfs"`): `"priority"` orders the waiting queues by
    /// (priority, arrival, request id) (`request_queue.py`
    /// `PriorityRequestQueue`, `request.py` `Request.__lt__`) and preempts
    /// the running request of the largest (priority, arrival), first in
    /// running order among equals, taking it out of the step if it is in it
    /// already (`scheduler.py:932-979`); a running request that preempts
    /// itself lets the ones after it try (`scheduler.py:983-993`).
    pub priority: bool,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            reserve_full_isl: true,
            long_prefill_token_threshold: 0,
            long_prefill_adaptive: false,
            chunked_prefill: true,
            max_num_active_seqs: None,
            watermark_blocks: 0,
            priority: false,
        }
    }
}

impl SchedulerOptions {
    /// The threshold a step applies, with `eligible` requests running or
    /// waiting and a budget of `max_num_batched_tokens` (0: no cap).
    ///
    /// A threshold of 24 with 3 requests and a budget of 96: 24, or,
    /// adaptive, max(24, 96 / 3) = 32; with 1 request: no cap.
    pub fn long_prefill_cap(&self, eligible: usize, max_num_batched_tokens: u64) -> u64 {
        let t = self.long_prefill_token_threshold;
        if t == 0 || eligible <= 1 {
            return 0;
        }
        if self.long_prefill_adaptive { t.max(max_num_batched_tokens / eligible as u64) } else { t }
    }

    /// The most tokens the Mamba align split may leave a prefill chunk
    /// before it rounds down (`max_prefill_tokens`, `scheduler.py:612-617`:
    /// the threshold as configured, however many requests there are).
    pub fn max_prefill_tokens(&self, max_num_batched_tokens: u64) -> u64 {
        match self.long_prefill_token_threshold {
            0 => max_num_batched_tokens,
            t => max_num_batched_tokens.min(t),
        }
    }

    /// `watermark` (a share of the pool, `[0, 1)`) as blocks of a pool of
    /// `num_blocks` vLLM blocks (its null block counted), as vLLM rounds it.
    pub fn watermark_blocks_of(watermark: f64, num_blocks: u64) -> u64 {
        (watermark * num_blocks as f64) as u64
    }
}

/// A scheduler option of vLLM that pdsim refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnmodelledOption {
    /// vLLM's name (`--name` with `_` for `-` on its command line), as a
    /// role's field would be written.
    pub name: &'static str,
    /// vLLM's default, the behaviour pdsim runs.
    pub default: &'static str,
    /// Why another value is not modelled.
    pub why: &'static str,
}

/// The options, by name.
pub const UNMODELLED_SCHEDULER_OPTIONS: &[UnmodelledOption] = &[
    UnmodelledOption {
        name: "prefill_schedule_interval",
        default: "1 (waiting requests are considered at every step)",
        why: "its cadence counts executed steps and lifts itself once a step cannot drain the queue \
              (`prefill_capacity_bound`), an engine-loop state pdsim does not model",
    },
    UnmodelledOption {
        name: "stream_interval",
        default: "1 (each step's tokens leave the engine at once)",
        why: "pdsim's times are the engine's; batching outputs for the API server is not modelled",
    },
];

/// The option named `name`, if pdsim refuses it.
pub fn unmodelled_scheduler_option(name: &str) -> Option<&'static UnmodelledOption> {
    UNMODELLED_SCHEDULER_OPTIONS.iter().find(|o| o.name == name)
}
