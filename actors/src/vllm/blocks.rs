//! What a cache group holds, the rules of vLLM's single-type KV cache
//! managers (`v1/core/single_type_kv_cache_manager.py`: `FullAttentionManager`
//! at line 739, `SlidingWindowManager` at 946, `MambaManager` at 1428): every
//! block of the computed tokens for full attention, the in-window blocks for
//! a window ([`super::window`]), one running block for a state, plus what a
//! step takes on top (checkpoint blocks, and in Mamba align mode the state
//! it starts from, [`super::mamba`]).

use super::mamba;
use super::window::{in_window_blocks, skipped_blocks};
use crate::base::units::{Blocks, Tokens};
use crate::models::model::{CacheGroup, CacheGroupKind};

/// Blocks a full-attention group holds, and moves, for T tokens:
/// `cdiv(T, B)`, a partly filled last block included.
///
/// vLLM `v1/core/single_type_kv_cache_manager.py`, `FullAttentionManager`:
/// every block of the computed tokens. T = 999, B = 2,176 → 1 block;
/// T = 8,191 → 4 blocks.
///
/// # Panics
/// If `b` is zero; validated groups never have one.
pub const fn full_attention_blocks(t: Tokens, b: Tokens) -> Blocks {
    t.blocks_ceil(b)
}

/// Blocks a state group holds, and moves: exactly 1.
///
/// vLLM's NIXL worker reads one block for a Mamba group (the running state at
/// T); a tail ring also lives in one block. vLLM
/// `v1/core/single_type_kv_cache_manager.py`, `MambaManager`.
pub const STATE_BLOCKS: Blocks = Blocks::new(1);

/// Blocks `group` holds once T tokens are computed and the skipped blocks are
/// removed: full attention `cdiv(T, B)`; window [`in_window_blocks`]; state
/// 1 (0 before the first token). No allocation; a KV pool may call it every
/// step.
///
/// This is also what a decode rank holds for the group once a handoff of T
/// tokens has landed. A Mamba group's previous-step block ("align" prefix
/// caching) and speculative blocks are not counted.
pub fn blocks_held(group: &CacheGroup, computed: Tokens) -> Blocks {
    let b = group.block_size();
    match (group.kind(), group.window()) {
        (CacheGroupKind::FullAttention, _) => full_attention_blocks(computed, b),
        (CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution, Some(w)) => in_window_blocks(computed, w, b),
        // A validated window group always has a window; hold every block if not.
        (CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution, None) => full_attention_blocks(computed, b),
        (CacheGroupKind::State, _) => {
            if computed.is_zero() {
                Blocks::ZERO
            } else {
                STATE_BLOCKS
            }
        }
    }
}

/// Blocks `group` holds while a scheduler step computes tokens `from..to`:
/// vLLM removes the blocks skipped at `from` before it allocates up to `to`
/// (`v1/core/sched/scheduler.py` → `allocate_slots` →
/// `remove_skipped_blocks(num_computed_tokens)`).
///
/// Full attention `cdiv(to, B)`; window `cdiv(to, B) − skipped(from)`;
/// state 1, plus the group's `checkpoint_blocks` when `with_checkpoints`.
/// Pass `with_checkpoints = true` for the step that reaches the end of the
/// (backed-off) prompt on a prefill rank with prefix caching on (vLLM's
/// "align" mode, the only one that takes them).
///
/// A 1,024-token prompt in one step (`from` 0), W = 32, B = 16: the window
/// group holds all 64 blocks during the step; [`blocks_held`] after it is 2.
/// A `from` past `to` is read as `to`.
pub fn blocks_for_step(group: &CacheGroup, from: Tokens, to: Tokens, with_checkpoints: bool) -> Blocks {
    let from = from.min(to);
    let b = group.block_size();
    match (group.kind(), group.window()) {
        (CacheGroupKind::FullAttention, _) | (CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution, None) => {
            full_attention_blocks(to, b)
        }
        (CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution, Some(w)) => {
            Blocks::new(to.blocks_ceil(b).get() - skipped_blocks(from, w, b).get())
        }
        (CacheGroupKind::State, _) => {
            if to.is_zero() {
                Blocks::ZERO
            } else if with_checkpoints {
                STATE_BLOCKS.saturating_add(group.checkpoint_blocks())
            } else {
                STATE_BLOCKS
            }
        }
    }
}

/// Blocks `group` holds during the step computing `mid..to` whose skipped
/// blocks vLLM frees from `from` on (`from ≤ mid`; `from < mid` under the
/// asynchronous loop, for a request whose step before is in flight) in a
/// pool whose Mamba groups are in align mode or not (`align`):
/// [`blocks_for_step`] from `from`, and in align mode a prefix-cacheable
/// state group's blocks of the earlier states it still holds besides the
/// one it writes ([`mamba::earlier_states`]).
/// No allocation: a pool calls it for every group it cannot sum otherwise.
#[inline]
pub(crate) fn blocks_for_step_in(
    group: &CacheGroup,
    align: bool,
    from: Tokens,
    mid: Tokens,
    to: Tokens,
    checkpoints: bool,
) -> u64 {
    let held = blocks_for_step(group, from, to, checkpoints).get();
    if align { held + mamba::earlier_states(group, from, mid, to) } else { held }
}
