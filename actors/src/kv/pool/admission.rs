//! Admission's count: whether a sequence's whole known sequence fits
//! (vLLM's whole-sequence admission, `crate::vllm::admission`).

use super::{KvPool, Shortfall};
use crate::base::units::Tokens;
use crate::requests::workload::PrefixIds;
use crate::vllm::admission::{Whole, group_blocks_counted};

impl KvPool {
    /// Whether a sequence new to the pool, pinning `hit` cached blocks, could
    /// hold its whole known sequence (`from..whole`, with or without
    /// checkpoint blocks) from the free and evictable blocks now; no side
    /// effects. vLLM admits a waiting request only then
    /// (`scheduler_reserve_full_isl`, on by default: `kv_cache_manager.py`
    /// `allocate_slots(full_sequence_must_fit=True)`), even though it
    /// allocates only the first chunk. The shortfall counts every block the
    /// sequence would hold (the hit's included). `keep` blocks must be left
    /// free besides (vLLM's watermark).
    ///
    /// B = 16, 8 usable blocks, one 64-token request running (4 blocks): a
    /// 100-token prompt needs cdiv(100, 16) = 7 > 4 free and waits, even
    /// with a token budget of 32 whose first chunk would fit in 2.
    ///
    /// A window group counts at most its admission cap, as vLLM's
    /// `SlidingWindowSpec.max_admission_blocks_per_request`:
    /// `cdiv(W − 1 + in_flight, B) + 1` blocks, `in_flight` being the most
    /// tokens a step computes (`max_num_batched_tokens`), since blocks below
    /// the window are freed as the prefill goes. W = 33, B = 16, a budget
    /// of 32: at most cdiv(64, 16) + 1 = 5 window blocks, however long the
    /// prompt.
    pub(crate) fn whole_fits(
        &self,
        prefix: &PrefixIds,
        prompt: Tokens,
        owner: u64,
        hit: u32,
        whole: Whole,
        keep: u64,
    ) -> Result<(), Shortfall> {
        let need = match self.win() {
            Some(w) => self.whole_blocks_after_window_hit(w, hit, whole),
            None => self.whole_blocks(whole).saturating_sub(u64::from(hit) * self.fa_groups),
        };
        self.can_pin_and_take(prefix, prompt, owner, (hit, self.hit_tokens(hit)), need, keep).map_err(|short| {
            Shortfall {
                needed: need + u64::from(hit) * self.fa_groups + u64::from(self.win_pins(hit)) * self.wg(),
                available: short.available,
            }
        })
    }

    /// Whether a decode rank's remote load of `span` = (T, N) tokens (T
    /// loaded of an N-token prompt, [`crate::vllm::handoff::load_whole`])
    /// passes vLLM's whole-sequence check after pinning its hit of `hit`
    /// blocks: every group's blocks for N tokens against the free and
    /// evictable blocks, keeping `keep` free (vLLM's watermark; the blocks
    /// kept for others are the allocation's check,
    /// [`KvPool::pin_and_allocate_leaving`]).
    pub(crate) fn whole_load_fits(
        &self,
        prefix: &PrefixIds,
        prompt: Tokens,
        owner: u64,
        hit: u32,
        (t, n): (Tokens, Tokens),
        keep: u64,
    ) -> Result<(), Shortfall> {
        let need = self.blocks_after_hit(hit, n, n, false);
        self.can_pin_and_take(prefix, prompt, owner, (hit, t), need, keep)
    }

    /// Blocks a sequence holds for its whole known sequence (`from..to`),
    /// as admission counts them ([`group_blocks_counted`]); hit blocks
    /// included.
    pub(crate) fn whole_blocks(&self, whole: Whole) -> u64 {
        let align = self.align().is_some();
        self.groups.iter().map(|g| group_blocks_counted(g, align, whole)).sum()
    }
}
