//! A sliding window's rules (vLLM's `SlidingWindowManager`,
//! `v1/core/single_type_kv_cache_manager.py:946`, and `SlidingWindowSpec`,
//! `v1/kv_cache_interface.py:901`): which blocks fall out of the window and
//! are freed, what stays, what the prefill side hands over, what admission
//! counts, and what a prefix hit needs. Notation: W the window, B the block
//! size, T the tokens computed.

use crate::base::units::{Blocks, Tokens};

/// Blocks of T tokens that lie wholly before the window of the next token:
/// `floor(max(0, T − W + 1) / B)`.
///
/// vLLM `v1/core/single_type_kv_cache_manager.py:1148`,
/// `SlidingWindowManager.get_num_skipped_tokens` gives `max(0, T − W + 1)`
/// skipped tokens; `remove_skipped_blocks` replaces the whole blocks among
/// them by the null block. T = 1,000, W = 33, B = 16 → floor(968 / 16) = 60.
///
/// # Panics
/// If `b` is zero; validated groups never have one.
pub const fn skipped_blocks(t: Tokens, w: Tokens, b: Tokens) -> Blocks {
    // max(0, T − W + 1) without overflow: positive exactly when T ≥ W (W ≥ 1).
    let skipped = if t.get() >= w.get() { t.get() - w.get() + 1 } else { 0 };
    Tokens::new(skipped).blocks_floor(b)
}

/// Blocks a window group holds, and moves, for T tokens: the blocks inside
/// the window of the next token,
/// `in_window(T) = cdiv(T, B) − floor(max(0, T − W + 1) / B)`.
///
/// vLLM `v1/core/single_type_kv_cache_manager.py` (sliding window manager,
/// after `remove_skipped_blocks`); the decode rank allocates and reads only
/// these. W = 33, B = 16, T = 1,000 → 63 − 60 = 3 blocks; W = 32, B = 16,
/// T = 1,024 → 64 − 62 = 2 blocks. Never more than
/// [`prefill_clip_blocks`]`(W, B)`; for T ≥ W − 1 it is `cdiv(W − 1, B)` or
/// one more, so it is not monotone in T.
///
/// # Panics
/// If `b` is zero; validated groups never have one.
pub const fn in_window_blocks(t: Tokens, w: Tokens, b: Tokens) -> Blocks {
    let all = t.blocks_ceil(b);
    Blocks::new(all.get() - skipped_blocks(t, w, b).get())
}

/// The prefill side's clip of a window group's block list:
/// `cdiv(W, B) + 1` blocks.
///
/// vLLM's NIXL connector, `request_finished`, hands the decode rank only the
/// last `cdiv(W, B) + 1` blocks of a window group (never dropping a real
/// block); the decode worker then reads its `in_window` of them.
/// W = 33, B = 16 → 3 + 1 = 4 blocks.
///
/// # Panics
/// If `b` is zero; validated groups never have one.
pub const fn prefill_clip_blocks(w: Tokens, b: Tokens) -> Blocks {
    Blocks::new(w.blocks_ceil(b).get().saturating_add(1))
}

/// The most blocks of a window group admission counts for one request,
/// `cdiv(W − 1 + in_flight, B) + 1`: while a long prompt is prefilled in
/// chunks, the blocks that leave the window are freed before each chunk is
/// allocated, so a request never holds more than the window's last
/// `W − 1` tokens and one step's tokens, plus one block where the window
/// does not start on a boundary. `in_flight` is the most tokens scheduled
/// and not yet settled (`max_num_batched_tokens` for the synchronous
/// scheduler).
///
/// vLLM `SlidingWindowSpec.max_admission_blocks_per_request`
/// (`v1/kv_cache_interface.py:918-944`), which also caps the tokens at
/// `max_model_len` (pdsim does not: a request never exceeds it by then).
/// W = 33, B = 16, a budget of 32: cdiv(64, 16) + 1 = 5 blocks, however long
/// the prompt.
#[inline]
pub(crate) const fn admission_cap_blocks(w: Tokens, b: Tokens, in_flight: Tokens) -> u64 {
    // (Saturating: a full-attention group held as a window of 2^32 + 1
    // tokens, `KvPool::full_groups_apart`, beside a huge budget.)
    (w.get() - 1).saturating_add(in_flight.get()).div_ceil(b.get()).saturating_add(1)
}

/// The window blocks a prefix hit needs cached before its end: the blocks
/// of the `W − 1` tokens the next token attends to, `cdiv(W − 1, B)`, and at
/// least one.
///
/// vLLM `SlidingWindowManager.find_longest_cache_hit`
/// (`v1/core/single_type_kv_cache_manager.py:969`) walks back from the
/// full-attention hit for `cdiv(sliding_window − 1, block_size)` cached
/// blocks in a row. W = 33, B = 16: 2 blocks; W = 1: 1.
#[inline]
pub(crate) const fn hit_run_blocks(w: Tokens, b: Tokens) -> u32 {
    let held = window_blocks_at_boundary(w, b);
    if held == 0 { 1 } else { held }
}

/// The window blocks a holding keeps at a block-aligned position,
/// `cdiv(W − 1, B)` (0 for a window of one token): what a hit pins of the
/// window blocks before its end.
#[inline]
pub(crate) const fn window_blocks_at_boundary(w: Tokens, b: Tokens) -> u32 {
    let n = w.get().saturating_sub(1).div_ceil(b.get());
    if n > u32::MAX as u64 { u32::MAX } else { n as u32 }
}
