//! Admission's count: whether a sequence's whole known sequence fits
//! (vLLM's whole-sequence admission, `crate::vllm::admission`).

use super::{Alloc, KvPool, Shortfall};
use crate::base::units::Tokens;
use crate::models::model::CacheGroupKind;
use crate::requests::workload::PrefixIds;
use crate::vllm::admission::{Whole, group_blocks_counted};
use crate::vllm::window::admission_cap_blocks;

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
        self.can_pin_and_take(prefix, prompt, owner, (hit, hit, self.hit_tokens(hit)), need, keep, 0).map_err(|short| {
            Shortfall {
                needed: need + u64::from(hit) * self.fa_groups + u64::from(self.win_pins(hit)) * self.wg(),
                available: short.available,
            }
        })
    }

    /// Whether a decode rank's remote load of T tokens, pinning its hit of
    /// `hit` blocks, passes vLLM's check of its blocks for `to` tokens (T:
    /// the allocation's, N: the whole sequence's) with `keep` free blocks
    /// left: where the hit ends at a cached state, vLLM's Mamba manager
    /// counts the state block of `to` as new besides it (and the hit's
    /// state as taken when it is evictable), though the state it then holds
    /// is one block (`MambaManager.get_num_blocks_to_allocate`): the count
    /// of the step from the hit. Otherwise what the load holds.
    ///
    /// Where no state is cached at the hit's end but one is below it (the
    /// connector's lookup takes each group's own hit,
    /// `get_computed_blocks_for_connector`, `kv_cache_manager.py:330-378`),
    /// vLLM's count takes that state too when it is evictable (Mamba's
    /// `get_num_blocks_to_allocate` counts the evictable blocks of its hit)
    /// though the load never holds it (`add_local_computed_blocks` skips a
    /// hit below T − 1): B = 16, a 32-token hit whose state is cached at
    /// 16 only, that state evictable, counts one block more.
    pub(crate) fn load_fits(
        &self,
        prefix: &PrefixIds,
        prompt: Tokens,
        owner: u64,
        hit: u32,
        (t, to): (Tokens, Tokens),
        keep: u64,
    ) -> Result<(), Shortfall> {
        self.load_check(prefix, prompt, owner, hit, (t, to), None, keep)
    }

    /// Whether a decode rank's remote load of `span` = (T, N) tokens (T
    /// loaded of an N-token prompt, [`crate::vllm::handoff::load_whole`])
    /// passes vLLM's whole-sequence check after pinning its hit of `hit`
    /// blocks: every group's blocks for N tokens (counted as
    /// [`KvPool::load_fits`] counts them) against the free and evictable
    /// blocks, keeping `keep` free (vLLM's watermark; the blocks kept for
    /// others are the allocation's check).
    ///
    /// With the window cache, the window groups count as vLLM's
    /// `get_num_blocks_to_allocate(apply_admission_cap=True)` counts them
    /// there: `min(cdiv(N, B), cap)` ([`admission_cap_blocks`]; `in_flight`,
    /// the most tokens a step computes) less the larger of the blocks T
    /// skips and the window's hit, not what a step to N holds. W = 16,
    /// B = 8, a budget of 16, N = 81 with no hit: min(11, 5) − 8 skipped =
    /// 0, where the step 81..81 holds 3.
    #[expect(clippy::too_many_arguments, reason = "load_fits's, and the budget the window's cap needs")]
    pub(crate) fn whole_load_fits(
        &self,
        prefix: &PrefixIds,
        prompt: Tokens,
        owner: u64,
        hit: u32,
        (t, n): (Tokens, Tokens),
        in_flight: Tokens,
        keep: u64,
    ) -> Result<(), Shortfall> {
        self.load_check(prefix, prompt, owner, hit, (t, n), Some(in_flight), keep)
    }

    /// [`KvPool::load_fits`] (`in_flight`: none) and
    /// [`KvPool::whole_load_fits`] (the budget its window cap needs).
    #[expect(clippy::too_many_arguments, reason = "whole_load_fits's")]
    fn load_check(
        &self,
        prefix: &PrefixIds,
        prompt: Tokens,
        owner: u64,
        hit: u32,
        (t, to): (Tokens, Tokens),
        in_flight: Option<Tokens>,
        keep: u64,
    ) -> Result<(), Shortfall> {
        let from = if self.hit_state_cached(prefix, prompt, owner, hit) { self.hit_tokens(hit) } else { to };
        let wn = self.load_window_hit(prefix, prompt, owner, hit);
        let need = match self.win() {
            Some(w) if self.state_groups > 0 => {
                // Group by group: the window groups count from T all the
                // same (vLLM skips the window blocks below T's window and
                // counts its hit's, `num_local_computed_blocks`, nulls
                // included); the count from the hit is the state groups'
                // alone.
                let local = u64::from(self.win_blocks(wn)).max(u64::from(w.skipped(t)));
                let align = self.align().is_some();
                self.groups
                    .iter()
                    .map(|g| match g.kind() {
                        CacheGroupKind::FullAttention => to.blocks_ceil(g.block_size()).get() - u64::from(hit),
                        CacheGroupKind::SlidingWindow => {
                            let blocks = to.blocks_ceil(w.block).get();
                            let cap = in_flight.map_or(u64::MAX, |f| admission_cap_blocks(w.window, w.block, f));
                            blocks.min(cap).saturating_sub(local)
                        }
                        _ => Self::group_blocks(g, align, from, from, to, false),
                    })
                    .sum()
            }
            _ => self.blocks_after_hits(hit, wn, from, to, false),
        };
        let lag = self.lagging_state(prefix, prompt, owner, hit);
        self.can_pin_and_take(prefix, prompt, owner, (hit, wn, t), need, keep, lag)
    }

    /// Blocks the holding `alloc` must still allocate to hold its whole
    /// known sequence `whole`, as vLLM counts a prefill in flight's
    /// (`_request_remaining_blocks` → `get_num_blocks_to_allocate`): per
    /// group, what admission counts for `whole` less what the group holds;
    /// a window group, the whole sequence's blocks at most its admission
    /// cap less every block position through the tokens allocated (vLLM's
    /// block table keeps a skipped block as a null block); a Mamba group
    /// in align mode needs one block when the last state's
    /// block lies past its block table, else none (`MambaManager` caps the
    /// new blocks at one, `single_type_kv_cache_manager.py:1740-1790`,
    /// whatever state block it holds now).
    ///
    /// B = 4, a recompute of 26 known tokens holding its first chunk (0..4:
    /// one block of each group): 6 full-attention blocks and 1 state block,
    /// where the whole count less the blocks held gives 6.
    pub(crate) fn remaining_blocks(&self, alloc: &Alloc, whole: Whole) -> u64 {
        let align = self.align().is_some();
        self.groups
            .iter()
            .map(|g| {
                let b = g.block_size();
                if align && g.kind() == CacheGroupKind::State && g.prefix_cacheable() {
                    whole.to.blocks_ceil(b).get().saturating_sub(alloc.to.blocks_ceil(b).get()).min(1)
                } else if let (CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution, Some(w)) =
                    (g.kind(), g.window())
                {
                    // vLLM counts a window group's block table, whose
                    // skipped blocks stay in it as null blocks: every
                    // position through the tokens allocated, against the
                    // whole sequence's positions at most the admission cap.
                    let cap = admission_cap_blocks(w, b, whole.in_flight);
                    whole.to.blocks_ceil(b).get().min(cap).saturating_sub(alloc.to.blocks_ceil(b).get())
                } else {
                    let held = Self::group_blocks(g, align, alloc.from, alloc.mid, alloc.to, alloc.checkpoints);
                    group_blocks_counted(g, align, whole).saturating_sub(held)
                }
            })
            .sum()
    }

    /// Blocks a sequence holds for its whole known sequence (`from..to`),
    /// as admission counts them ([`group_blocks_counted`]); hit blocks
    /// included.
    pub(crate) fn whole_blocks(&self, whole: Whole) -> u64 {
        let align = self.align().is_some();
        self.groups.iter().map(|g| group_blocks_counted(g, align, whole)).sum()
    }
}
