//! Whole-sequence admission: vLLM admits a waiting request only if its
//! whole known sequence would fit in the free blocks now, though it
//! allocates only the first chunk (`scheduler_reserve_full_isl`, on by
//! default, `config/scheduler.py:190`; the scheduler passes it as
//! `full_sequence_must_fit` to `KVCacheManager.allocate_slots`,
//! `v1/core/sched/scheduler.py:1449`, which checks it at
//! `v1/core/kv_cache_manager.py:531-546`). What the check counts is here:
//! the span ([`Whole`], [`whole_sequence`]) and each group's blocks for it
//! ([`group_blocks_counted`]: a window group at most its admission cap).
//! The pool compares the count with its free and evictable blocks
//! (`KvPool::whole_fits`). With `scheduler_reserve_full_isl = false` vLLM
//! skips this check alone (the first chunk's allocation is still checked,
//! and a remote load still leaves the prefills in flight their blocks):
//! the scheduler's `full_isl` switch (`Scheduler::set_reserve_full_isl`).
//!
//! B = 16, 8 usable blocks, one 64-token request running (4 blocks): a
//! 100-token prompt needs cdiv(100, 16) = 7 > 4 free and waits, even with a
//! token budget of 32 whose first chunk would fit in 2.

use super::blocks::blocks_for_step_in;
use super::window::admission_cap_blocks;
use crate::base::units::Tokens;
use crate::models::model::{CacheGroup, CacheGroupKind};

/// A sequence as admission checks it: from its hit (`from`) to everything it
/// knows (`to`), with checkpoint blocks if its prefill takes them, with
/// steps of at most `in_flight` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Whole {
    /// Tokens the hit covers.
    pub(crate) from: Tokens,
    /// Tokens it knows (prompt, and output so far).
    pub(crate) to: Tokens,
    /// Whether its prefill's last step takes checkpoint blocks.
    pub(crate) checkpoints: bool,
    /// The most tokens scheduled and not yet settled (the step's
    /// `max_num_batched_tokens`).
    pub(crate) in_flight: Tokens,
}

/// What must fit for a sequence to be admitted from `from` (its hit):
/// everything it knows, `goal` (its prompt, and after a preemption the
/// output so far), vLLM's `request.num_tokens`.
#[inline]
pub(crate) fn whole_sequence(from: Tokens, goal: Tokens, checkpoints: bool, in_flight: Tokens) -> Whole {
    Whole { from, to: goal, checkpoints, in_flight }
}

/// The blocks admission counts for `group` over `whole` (`align`: the pool
/// is in Mamba align mode): what the group holds for the span, a window
/// group at most its admission cap ([`admission_cap_blocks`]), as vLLM's
/// `get_num_blocks_to_allocate(apply_admission_cap=True)`.
#[inline]
pub(crate) fn group_blocks_counted(group: &CacheGroup, align: bool, whole: Whole) -> u64 {
    let blocks = blocks_for_step_in(group, align, whole.from, whole.from, whole.to, whole.checkpoints);
    match (group.kind(), group.window()) {
        (CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution, Some(w)) => {
            blocks.min(admission_cap_blocks(w, group.block_size(), whole.in_flight))
        }
        _ => blocks,
    }
}
