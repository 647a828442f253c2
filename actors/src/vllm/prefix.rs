//! Prefix-cache hits as vLLM takes them.

use crate::base::units::Tokens;

/// The most tokens of what a sequence computes towards (`goal`) that a
/// prefix-cache hit may cover: all but the last, which is always computed
/// for its logits. So a hit is the cached blocks that end at or before
/// `goal − 1`.
///
/// vLLM's `KVCacheManager.get_computed_blocks`
/// (`v1/core/kv_cache_manager.py:296-305`): `max_cache_hit_length =
/// request.num_tokens − 1`. B = 16, a 64-token prompt fully cached: 63
/// tokens may hit, so 3 blocks (48 tokens), never 4.
#[inline]
pub(crate) const fn hit_limit(goal: Tokens) -> Tokens {
    goal.saturating_sub(Tokens::new(1))
}
