//! Layer 4, vLLM's rules: each in one named place that cites vLLM 0.33.0's
//! file and line, called by the KV pool and the scheduler. To change how
//! pdsim follows one rule, read and touch its file:
//!
//! | rule | file | vLLM |
//! |---|---|---|
//! | what a group holds for a step | [`blocks`] | `single_type_kv_cache_manager.py` managers |
//! | window blocks freed below the window, what stays | [`window`] | `SlidingWindowManager.remove_skipped_blocks` |
//! | a window's admission cap, its hit run | [`window`] | `SlidingWindowSpec.max_admission_blocks_per_request` |
//! | whole-sequence admission | [`admission`] | `allocate_slots(full_sequence_must_fit)` |
//! | Mamba align mode: chunk split, previous state block | [`mamba`] | `_mamba_block_aligned_split`, `MambaManager` |
//! | a hit never covers the last token | [`prefix`] | `get_computed_blocks` |
//! | the handoff: backoff, payload, source release | [`handoff`] | NIXL connector |
//! | the engine loop: synchronous or asynchronous (batch queue) | [`engine`] | `EngineCore.step_with_batch_queue` |
//! | scheduler options followed, and those not modelled and why | [`options`] | `SchedulerConfig` |
//!
//! The loop order (running first, preemption, admission in queue order) is
//! the scheduler's policy (`crate::scheduler::VllmPolicy`).

pub(crate) mod admission;
pub(crate) mod blocks;
pub(crate) mod engine;
pub(crate) mod handoff;
pub(crate) mod mamba;
pub mod options;
pub(crate) mod prefix;
pub(crate) mod window;
