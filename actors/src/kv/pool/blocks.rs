//! What a holding holds: the blocks every group holds for a step
//! (vLLM's rules, `crate::vllm::blocks`), summed over the groups that hold
//! alike, and how far a decoding holding goes before its blocks change.

#[cfg(doc)]
use super::Span;
use super::{Alloc, KvPool};
use crate::base::units::Tokens;
use crate::models::model::{CacheGroup, CacheGroupKind};
use crate::vllm::{blocks, mamba};

impl KvPool {
    /// The blocks moving `alloc` to the decode step `from..to` takes
    /// (negative: gives back); no side effects.
    #[inline]
    pub(crate) fn change_in_blocks(&self, alloc: &Alloc, from: Tokens, to: Tokens) -> i64 {
        let from = alloc.step_from(from);
        let kept = if self.state_groups == 0 { 0 } else { self.states_kept(alloc, from, from, to) * self.state_groups };
        let wkept = if self.win().is_some() { self.win_step(alloc, from).0 } else { 0 };
        (self.private_need(from, to, false, alloc.shared) - kept - wkept) as i64 - alloc.private as i64
    }

    /// How many more blocks moving `alloc` to the step `from..to` takes (0
    /// if it gives blocks back); no side effects.
    pub(crate) fn extra_needed(&self, alloc: &Alloc, from: Tokens, to: Tokens, checkpoints: bool) -> u64 {
        self.extra_needed_lagging(alloc, from, from, to, checkpoints)
    }

    /// [`KvPool::extra_needed`] for a step computing `mid..to` whose
    /// skipped blocks vLLM frees from `from ≤ mid` on (the asynchronous
    /// loop, a request whose step before is in flight).
    pub(crate) fn extra_needed_lagging(
        &self,
        alloc: &Alloc,
        from: Tokens,
        mid: Tokens,
        to: Tokens,
        checkpoints: bool,
    ) -> u64 {
        let from = alloc.step_from(from);
        let mid = mid.max(from);
        let kept = if self.state_groups == 0 { 0 } else { self.states_kept(alloc, from, mid, to) * self.state_groups };
        let (wkept, cached) = if self.win().is_some() { self.win_step(alloc, from) } else { (0, 0) };
        let need = self.private_need(from, to, checkpoints, alloc.shared) + self.mid_states(from, mid, to);
        (need - kept - wkept).saturating_sub(alloc.private - cached)
    }

    /// In align mode, the state blocks a step computing `mid..to` and
    /// freeing from `from` holds beyond what [`KvPool::private_need`]
    /// counts for the step `from..to` (all state groups): the block of the
    /// state after `mid` when it lies strictly between those after `from`
    /// (or none, from 0) and after `to` ([`mamba::earlier_states`]). B = 16,
    /// from 32, mid 64, to 96: one; from 30, mid 33, to 34: none (the
    /// state after 33 shares the block of the one after 34).
    #[inline]
    pub(super) fn mid_states(&self, from: Tokens, mid: Tokens, to: Tokens) -> u64 {
        match self.align() {
            Some(b) if mid > from => {
                let with_mid = mamba::earlier_state_blocks(b, from, mid, to);
                (with_mid - mamba::earlier_state_blocks(b, from, from, to)) * self.state_groups
            }
            _ => 0,
        }
    }

    /// Blocks a new allocation holds for the step `from..to` after pinning
    /// `hit` cached blocks; no side effects.
    pub(crate) fn blocks_after_hit(&self, hit: u32, from: Tokens, to: Tokens, checkpoints: bool) -> u64 {
        self.blocks_after_hits(hit, hit, from, to, checkpoints)
    }

    /// [`KvPool::blocks_after_hit`] where the window groups hold a hit of
    /// their own, `wn` blocks (a decode rank's load,
    /// [`KvPool::load_window_hit`]).
    pub(crate) fn blocks_after_hits(&self, hit: u32, wn: u32, from: Tokens, to: Tokens, checkpoints: bool) -> u64 {
        let all = self.all_blocks(from, to, checkpoints);
        let wpins = self.win_blocks(wn) - self.win_lo(wn, from);
        all.saturating_sub(u64::from(hit) * self.fa_groups + u64::from(wpins) * self.wg())
    }

    /// Blocks every group holds together for an allocation state.
    #[inline]
    pub(super) fn all_blocks(&self, from: Tokens, to: Tokens, checkpoints: bool) -> u64 {
        if let Some(b) = self.uniform() {
            // (Full attention takes no checkpoint blocks.)
            return b.blocks_ceil(to).get() * self.fa_groups;
        }
        self.all_blocks_by_group(from, to, checkpoints)
    }

    /// [`KvPool::all_blocks`], group by group: one of each class of groups
    /// that hold alike, times its groups.
    #[inline(never)]
    pub(super) fn all_blocks_by_group(&self, from: Tokens, to: Tokens, checkpoints: bool) -> u64 {
        let align = self.align().is_some();
        self.classes.iter().map(|(g, n)| n * Self::group_blocks(g, align, from, from, to, checkpoints)).sum()
    }

    /// [`KvPool::all_blocks`] over the classes and group by group, to
    /// check one against the other.
    #[cfg(test)]
    pub(crate) fn all_blocks_both_ways(&self, from: Tokens, to: Tokens, checkpoints: bool) -> (u64, u64) {
        let align = self.align().is_some();
        let each = self.groups.iter().map(|g| Self::group_blocks(g, align, from, from, to, checkpoints)).sum();
        (self.all_blocks(from, to, checkpoints), each)
    }

    /// Blocks one group holds for an allocation state; `align`: the pool is
    /// in vLLM's Mamba "align" mode ([`KvPool::align`]).
    ///
    /// In align mode a prefix-cacheable state group's block `p` holds the
    /// state after `(p + 1) × B` tokens, so a step that moves into a new
    /// block holds two: the block of the state it starts from and the one
    /// it writes (`single_type_kv_cache_manager.py` `MambaManager`:
    /// `allocate_new_blocks` puts the new state at `cdiv(to, B) − 1` and
    /// keeps the previous one as `last_state_block_idx`, which
    /// `remove_skipped_blocks` frees before the next step's allocation).
    /// B = 8: the step 8..13 holds 2, the steps 13..16 and 0..8 hold 1.
    ///
    /// `mid`: the tokens computed before the step, past `from` under the
    /// asynchronous loop ([`mamba::earlier_states`]).
    #[inline]
    pub(super) fn group_blocks(
        g: &CacheGroup,
        align: bool,
        from: Tokens,
        mid: Tokens,
        to: Tokens,
        checkpoints: bool,
    ) -> u64 {
        blocks::blocks_for_step_in(g, align, from, mid, to, checkpoints)
    }

    /// Total private blocks for a state with `shared` cached leading blocks.
    pub(super) fn private_need(&self, from: Tokens, to: Tokens, checkpoints: bool, shared: u32) -> u64 {
        let all = self.all_blocks(from, to, checkpoints);
        all - u64::from(shared) * self.fa_groups
    }

    /// Blocks a request holds, at the least, during a step that ends with
    /// `tokens` computed (no hit; the step computing one token, so a window
    /// group holds only its in-window blocks; with `checkpoints`, the
    /// groups' checkpoint blocks too). A lower bound of what reaching
    /// `tokens` needs: a request above the pool's budget can never fit.
    pub(crate) fn blocks_needed(&self, tokens: Tokens, checkpoints: bool) -> u64 {
        if tokens.is_zero() {
            return 0;
        }
        self.private_need(tokens - Tokens::new(1), tokens, checkpoints, 0)
    }

    /// For a decode step ending at `to` that starts `lag` tokens before its
    /// own token ([`Span::decode_lag`]): the largest `t ≥ to` whose decode
    /// step of the same lag (`t − 1 − lag .. t`) holds the same blocks in
    /// every group.
    ///
    /// Full attention holds `cdiv(t, B)`: the same up to `cdiv(to, B) × B`.
    /// A window group holds `cdiv(t, B) − floor(max(0, t − W − lag) / B)`
    /// (the skipped blocks of a step from `t − 1 − lag`: a lag widens the
    /// window by as many tokens): the second term stays at `m = floor(max(0,
    /// to − W − lag) / B)` while `t ≤ W + lag + (m + 1) × B − 1`. A state
    /// group holds one block throughout, but in align mode two in the step
    /// from a block boundary (`kB .. kB + 1`): stable through the end of
    /// the block, or only that step; with lag 1, two (the same two) in the
    /// steps ending at `kB + 1` and `kB + 2`, one after them (B = 16: from
    /// 33, stable to 34; from 35, to 47; the step ending at 48 caches its
    /// state, so it is a change of its own).
    #[inline]
    pub(super) fn stable_to(&self, to: Tokens, lag: u64) -> Tokens {
        if let Some(b) = self.uniform() {
            return b.round_up(to);
        }
        self.stable_to_by_group(to, lag)
    }

    /// [`KvPool::stable_to`], group by group.
    #[inline(never)]
    pub(super) fn stable_to_by_group(&self, to: Tokens, lag: u64) -> Tokens {
        let t = to.get();
        let mut stable = u64::MAX;
        let align = self.align().is_some();
        for g in &self.groups {
            let b = g.block_size().get();
            let end_of_block = t.div_ceil(b) * b;
            let g_stable = match (g.kind(), g.window()) {
                (CacheGroupKind::State, _) if align && g.prefix_cacheable() => {
                    // Up to the step that ends on the boundary, which caches
                    // the state it writes (`register_state`). Lag 1 holds
                    // two blocks in the steps ending at kB + 1 and kB + 2
                    // (the same two: stable to kB + 2), one after.
                    let r = t % b;
                    if t == end_of_block || b == 1 {
                        t
                    } else if lag == 0 {
                        if mamba::moves_block(g, to.saturating_sub(Tokens::new(1)), to) { t } else { end_of_block - 1 }
                    } else if r == 1 {
                        (t + 1).min(end_of_block - 1)
                    } else if r == 2 {
                        t
                    } else {
                        end_of_block - 1
                    }
                }
                (CacheGroupKind::State, _) => u64::MAX,
                (CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution, Some(w)) => {
                    let w = w.get() + lag;
                    let m = t.saturating_sub(w) / b;
                    end_of_block.min(w + (m + 1) * b - 1)
                }
                _ => end_of_block,
            };
            stable = stable.min(g_stable);
        }
        Tokens::new(stable)
    }
}
