//! vLLM's Mamba "align" mode (`mamba_cache_mode = "align"`, which vLLM
//! sets for a Mamba hybrid with prefix caching on): a state group's block
//! `p` holds the state after exactly `(p + 1) × B` tokens, and states are
//! written only at the end of a step, so a prefill chunk that is not the
//! prompt's last must end on a block boundary ([`aligned_chunk`]), and a
//! step that moves into a new block holds the block of the state it
//! starts from as well as the one it writes, and under the asynchronous
//! loop the block of the state its step before started from too, while
//! that step is in flight ([`earlier_states`]).
//!
//! [`aligned_chunk`] is `Scheduler._mamba_block_aligned_split`
//! (`v1/core/sched/scheduler.py:546-660`) for the configurations pdsim
//! models: every group of one block size (so the hash block is the
//! scheduler block and fine-grained partial hits are off,
//! `kv_cache_utils.py:762` `partial_hash_hits_enabled`), no speculative
//! decoding (no EAGLE block drop, no hash lookahead) and no
//! `long_prefill_token_threshold`. Where pdsim departs from it on purpose:
//! a backend that saves the prompt's checkpoint inside the last chunk
//! (`use_internal_checkpoint`, a `MambaSpec` with a
//! `prefill_checkpoint_alignment`) is not modelled; pdsim's checkpoint
//! blocks only add blocks to that step.

use crate::base::units::Tokens;
use crate::models::model::{CacheGroup, CacheGroupKind};

/// The state groups' block size when a pool of `groups` is in align mode:
/// prefix caching on and a prefix-cacheable state group (a Mamba state:
/// vLLM's config sets `mamba_cache_mode = "align"` for a hybrid with prefix
/// caching, `config/vllm.py`). `None` otherwise.
pub(crate) fn align_block(groups: &[CacheGroup], prefix_caching: bool) -> Option<Tokens> {
    groups
        .iter()
        .find(|g| prefix_caching && g.kind() == CacheGroupKind::State && g.prefix_cacheable())
        .map(|g| g.block_size())
}

/// The state blocks a prefix-cacheable state group holds in align mode
/// besides the one its step writes, for a step computing `mid..to` whose
/// blocks vLLM frees from `from` on (`from ≤ mid`): the blocks of the
/// states after `from` and after `mid`, those before `to`'s block (none at
/// 0, one for the two when they share a block).
///
/// vLLM's `MambaManager.remove_skipped_blocks(processed)` (lines 1629-1660)
/// frees every state block before the one of the state after `processed`
/// tokens; `allocate_new_blocks` writes a step's state in a new block when
/// the step moves into one. The synchronous loop frees from `mid` (`from
/// == mid`: one block more when the step moves block). The asynchronous
/// loop frees from where the step before started, whose tokens are still
/// in flight (`processed = computed − in flight`, `kv_cache_manager.py:
/// 561-568`): B = 16, chunks of 32, the chunk 64..96 scheduled while
/// 32..64 runs holds the states after 32, 64 and 96 (three blocks, two
/// when scheduled synchronously); a decode step 33..34 scheduled while
/// 32..33 runs still holds the state after 32 (block 1) beside block 2.
#[inline]
pub(crate) fn earlier_states(group: &CacheGroup, from: Tokens, mid: Tokens, to: Tokens) -> u64 {
    if group.kind() != CacheGroupKind::State || !group.prefix_cacheable() {
        return 0;
    }
    earlier_state_blocks(group.block_size(), from, mid, to)
}

/// [`earlier_states`] for state blocks of `b` tokens.
#[inline]
pub(crate) fn earlier_state_blocks(b: Tokens, from: Tokens, mid: Tokens, to: Tokens) -> u64 {
    let idx = |t: Tokens| t.blocks_ceil(b);
    u64::from(!mid.is_zero() && idx(mid) < idx(to)) + u64::from(!from.is_zero() && idx(from) < idx(mid))
}

/// Whether the step `from..to` ends in another block of `group` than the
/// one holding the state it starts from (none at 0).
#[inline]
pub(crate) fn moves_block(group: &CacheGroup, from: Tokens, to: Tokens) -> bool {
    let b = group.block_size();
    !from.is_zero() && from < to && from.blocks_ceil(b) != to.blocks_ceil(b)
}

/// One sequence's chunk as the split sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Chunk {
    /// Tokens computed before the chunk (its prefix-cache hit included).
    pub(crate) start: Tokens,
    /// Tokens the chunk would compute before the split.
    pub(crate) tokens: u64,
    /// The request's known tokens (`request.num_tokens`: prompt and output
    /// so far).
    pub(crate) known: Tokens,
    /// Its prompt tokens.
    pub(crate) prompt: Tokens,
    /// Where the request's prefix-cache lookup found a shared prefix that a
    /// state group has not cached yet (`request.shared_prefix_boundary`;
    /// zero for none).
    pub(crate) junction: Tokens,
}

/// The tokens `chunk` computes once clipped to where states must be
/// cached, with state blocks of `block` tokens and at most `max_prefill`
/// tokens a step (`max_num_scheduled_tokens`); 0 when nothing aligned fits
/// (vLLM then skips a running request, and stops admission at a waiting
/// one).
///
/// - Only during a prefill (or a recompute replaying its output): from
///   `prefill_end = max(prompt, known − 1)` on, the chunk is kept.
/// - A chunk that ends before `prefill_end` ends on a block boundary
///   (rounded down), unless that leaves nothing and a block is wider than
///   a step (then it advances sub-block).
/// - It stops, strictly inside itself, at the earliest of: the next block
///   boundary when it starts mid-block; the last cacheable boundary
///   `⌊(known − 1) / B⌋ × B` (`get_mamba_prefill_checkpoint_position`,
///   `kv_cache_interface.py:1169`); the shared-prefix junction, rounded
///   down to a block past `start`.
///
/// B = 8, a 13-token prompt, a budget of 16: the first chunk stops at the
/// last cacheable boundary, 8, not at 13.
pub(crate) fn aligned_chunk(chunk: Chunk, block: Tokens, max_prefill: u64) -> u64 {
    let Chunk { start, tokens, known, prompt, junction } = chunk;
    let (start, known, b) = (start.get(), known.get(), block.get().max(1));
    let prefill_end = prompt.get().max(known.saturating_sub(1));
    if start >= prefill_end {
        return tokens;
    }
    let last_cache_position = known.saturating_sub(1) / b * b;
    let mut end = start + tokens;
    if end < prefill_end {
        let aligned = end / b * b;
        if aligned > start || b <= max_prefill {
            end = aligned;
        }
    }
    let next_boundary = if start % b != 0 { (start / b + 1) * b } else { 0 };
    let junction = junction.get();
    let junction_stop = if start < junction && junction < end { start + (junction - start) / b * b } else { 0 };
    let stop = [next_boundary, last_cache_position, junction_stop].into_iter().filter(|&s| start < s && s < end).min();
    stop.unwrap_or(end).saturating_sub(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(start: u64, tokens: u64, known: u64, prompt: u64, junction: u64) -> Chunk {
        Chunk {
            start: Tokens::new(start),
            tokens,
            known: Tokens::new(known),
            prompt: Tokens::new(prompt),
            junction: Tokens::new(junction),
        }
    }

    #[test]
    fn a_last_chunk_stops_at_the_last_cacheable_boundary() {
        // B = 8, 13 tokens, budget 16: state cached at 8, then 5 more.
        assert_eq!(aligned_chunk(chunk(0, 13, 13, 13, 0), Tokens::new(8), 16), 8);
        assert_eq!(aligned_chunk(chunk(8, 5, 13, 13, 0), Tokens::new(8), 16), 5);
        // 16 tokens: the last cacheable boundary is 8 (15 // 8 * 8).
        assert_eq!(aligned_chunk(chunk(0, 16, 16, 16, 0), Tokens::new(8), 64), 8);
    }

    #[test]
    fn a_middle_chunk_ends_on_a_block_boundary() {
        // B = 8, 100 tokens, budget 13 left: 8.
        assert_eq!(aligned_chunk(chunk(0, 13, 100, 100, 0), Tokens::new(8), 64), 8);
        // Less than a block of budget: nothing (B fits a step).
        assert_eq!(aligned_chunk(chunk(0, 5, 100, 100, 0), Tokens::new(8), 64), 0);
        // A block wider than a step advances sub-block, then re-aligns.
        assert_eq!(aligned_chunk(chunk(0, 6, 100, 100, 0), Tokens::new(8), 6), 6);
        assert_eq!(aligned_chunk(chunk(6, 6, 100, 100, 0), Tokens::new(8), 6), 2);
    }

    #[test]
    fn decode_steps_and_the_junction() {
        // Decoding: untouched.
        assert_eq!(aligned_chunk(chunk(20, 1, 21, 20, 0), Tokens::new(8), 64), 1);
        // A junction at 24 inside 0..40 of a 100-token prompt: stop there.
        assert_eq!(aligned_chunk(chunk(0, 40, 100, 100, 24), Tokens::new(8), 64), 24);
        // A junction mid-block is rounded down past the start.
        assert_eq!(aligned_chunk(chunk(8, 40, 100, 100, 21), Tokens::new(8), 64), 8);
    }
}
