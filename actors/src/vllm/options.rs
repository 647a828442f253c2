//! vLLM 0.33.0's scheduler options pdsim does not model (`SchedulerConfig`,
//! `vllm/config/scheduler.py`), each with vLLM's default, which is what
//! pdsim runs, and why another value is not modelled. A scenario that sets
//! one is refused with the reason, placed at the field, rather than run
//! as if it were not there.

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
        name: "policy",
        default: "\"fcfs\"",
        why: "priority scheduling orders and preempts by per-request priorities, which pdsim's workloads \
              and traces do not carry",
    },
    UnmodelledOption {
        name: "enable_chunked_prefill",
        default: "true",
        why: "without chunking vLLM schedules a prompt whole or not at all, a second admission rule \
              pdsim does not have",
    },
    UnmodelledOption {
        name: "long_prefill_token_threshold",
        default: "0 (no cap on one request's share of the token budget)",
        why: "with a threshold vLLM caps and counts long prefills per step (with max_num_partial_prefills), \
              which pdsim's admission does not",
    },
    UnmodelledOption {
        name: "max_num_partial_prefills",
        default: "1",
        why: "concurrent partial prefills are counted only with long_prefill_token_threshold, which pdsim \
              does not model",
    },
    UnmodelledOption {
        name: "max_long_partial_prefills",
        default: "1",
        why: "concurrent partial prefills are counted only with long_prefill_token_threshold, which pdsim \
              does not model",
    },
    UnmodelledOption {
        name: "watermark",
        default: "0 (no free blocks held back from admission)",
        why: "a reserve of free blocks at admission is not modelled",
    },
    UnmodelledOption {
        name: "prefill_schedule_interval",
        default: "1 (waiting requests are considered at every step)",
        why: "admitting only every few steps is not modelled",
    },
    UnmodelledOption {
        name: "max_num_active_seqs",
        default: "unset (max_num_seqs alone bounds the batch)",
        why: "a second bound on active sequences is not modelled; use max_num_seqs",
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
