//! Moving a holding from step to step (`resize`), and giving it back
//! (`release`, and a prefill's source release).

use super::{Alloc, KvPool, Layout, MAX_GROUPS, Shortfall, Span, Take, state};
use crate::base::units::Tokens;
use crate::models::model::CacheGroupKind;
use crate::vllm::{blocks, handoff};

impl KvPool {
    /// Moves `alloc` to the step `from..to` (with or without checkpoint
    /// blocks), taking or returning private blocks. On a shortfall nothing
    /// changes but what vLLM frees before it checks the free blocks (and
    /// keeps freed): window blocks leaving the window with the window
    /// cache, in align mode the state the step no longer needs.
    pub(crate) fn resize(
        &mut self,
        alloc: &mut Alloc,
        from: Tokens,
        to: Tokens,
        checkpoints: bool,
    ) -> Result<(), Shortfall> {
        self.resize_lagging(alloc, from, from, to, checkpoints)
    }

    /// [`KvPool::resize`] to a step computing `mid..to` whose skipped
    /// blocks vLLM frees from `from ≤ mid` on (the asynchronous loop, a
    /// request whose step before is in flight).
    pub(crate) fn resize_lagging(
        &mut self,
        alloc: &mut Alloc,
        from: Tokens,
        mid: Tokens,
        to: Tokens,
        checkpoints: bool,
    ) -> Result<(), Shortfall> {
        debug_assert!(self.evicted_ahead.is_empty(), "the pool touched while evictions made ahead stand");
        self.resize_inner(alloc, Span { from, mid, to, checkpoints }, Take::Evicting)
    }

    /// [`KvPool::resize`] from plain free blocks only: never evicts a cached
    /// block (and leaves the peak alone), so that taking blocks ahead of the
    /// step that needs them can be undone exactly (the decoding set never
    /// takes ahead a step that frees blocks into the eviction order).
    #[inline]
    pub(crate) fn resize_from_free(&mut self, alloc: &mut Alloc, from: Tokens, to: Tokens) -> Result<(), Shortfall> {
        self.resize_inner(alloc, Span::new(from, to), Take::PlainOnly)
    }

    #[inline(always)]
    pub(super) fn resize_inner(&mut self, alloc: &mut Alloc, mut span: Span, how: Take) -> Result<(), Shortfall> {
        span.from = alloc.step_from(span.from);
        span.mid = span.mid.max(span.from);
        let (from, to) = (span.from, span.to);
        if span.decode_lag().is_some() && to >= alloc.to && to <= alloc.stable_to && to - from == alloc.to - alloc.from
        {
            // The next decode step (of the same lag) holds what this one
            // holds (most steps).
            (alloc.from, alloc.mid, alloc.to) = (from, span.mid, to);
            return Ok(());
        }
        match self.layout {
            Layout::UniformFull(b) => {
                // cdiv(t, B) blocks in every group (no window pins): the hot
                // path of full-attention models, inline.
                let (new, old) = (b.blocks_ceil(to).get(), b.blocks_ceil(alloc.to).get());
                let need = (new - u64::from(alloc.shared)) * self.fa_groups;
                self.take_or_free(alloc.private, need, how)?;
                let d = std::iter::repeat(new as i64 - old as i64);
                self.commit_resize(alloc, span, need, d, how);
                Ok(())
            }
            Layout::Windowed(w) => self.resize_win(w, alloc, span, how),
            Layout::Aligned(_) => self.resize_aligned(alloc, *alloc, span, how),
            Layout::WindowedAligned(w, _) => {
                // The window blocks first, then the states: vLLM's
                // `remove_skipped_blocks` goes group by group, and the
                // window groups come first (`KvPool::window_cache`). The
                // other groups still hold what the holding held before.
                let before = *alloc;
                if self.skips_cached(alloc, span.from) {
                    self.skip_window(w, alloc, span.from, false);
                }
                self.resize_aligned(alloc, before, span, how)
            }
            Layout::ByGroup => self.resize_plain(alloc, span, how),
        }
    }

    /// [`KvPool::resize_inner`] outside align mode (no state entries): the
    /// hot path of every other model, kept apart.
    #[inline(never)]
    pub(super) fn resize_plain(&mut self, alloc: &mut Alloc, span: Span, how: Take) -> Result<(), Shortfall> {
        let Span { from, to, checkpoints, .. } = span;
        let (need, deltas) = self.plain_need(alloc, from, to, checkpoints);
        if let Err(short) = self.take_or_free(alloc.private, need, how) {
            if from > alloc.from {
                self.skip_uncached(alloc, from);
            }
            return Err(short);
        }
        self.commit_resize(alloc, span, need, deltas, how);
        Ok(())
    }

    /// The private blocks `alloc` holds for a step `from..to` (with or
    /// without checkpoint blocks), outside align mode, and each group's
    /// change from what it holds now.
    #[inline(always)]
    fn plain_need(&self, alloc: &Alloc, from: Tokens, to: Tokens, checkpoints: bool) -> (u64, [i64; MAX_GROUPS]) {
        let mut all = 0u64;
        let mut deltas = [0i64; MAX_GROUPS];
        for (i, g) in self.groups.iter().enumerate() {
            let new = blocks::blocks_for_step(g, from, to, checkpoints).get();
            let old = blocks::blocks_for_step(g, alloc.from, alloc.to, alloc.checkpoints).get();
            all += new;
            deltas[i] = new as i64 - old as i64;
        }
        (all - u64::from(alloc.shared) * self.fa_groups - u64::from(alloc.wpinned) * self.wg(), deltas)
    }

    /// On a shortfall, what vLLM frees before it checks the free blocks,
    /// and keeps freed, outside the window cache (`resize_win` does it
    /// there): `allocate_slots` removes the blocks below a window first
    /// (`kv_cache_manager.py:561-568`), whether the step then gets its
    /// blocks or not. They become plain free blocks; `alloc` then holds
    /// the blocks of its tokens from `from` on. (Seen when a step that
    /// cannot get its blocks preempts nothing: a decode rank under the
    /// asynchronous loop, `Step::preempt_last`.)
    fn skip_uncached(&mut self, alloc: &mut Alloc, from: Tokens) {
        let (need, deltas) = self.plain_need(alloc, from, alloc.to, alloc.checkpoints);
        if need >= alloc.private {
            return;
        }
        self.free += alloc.private - need;
        for (used, d) in self.group_used.iter_mut().zip(deltas) {
            *used = used.checked_add_signed(d).expect("a group's count stays >= 0");
        }
        self.private = self.private + need - alloc.private;
        (alloc.from, alloc.mid, alloc.private, alloc.stable_to) = (from, from, need, Tokens::ZERO);
    }

    /// The end of a resize both forms share: the groups' counts, the
    /// private count and the holding's new span (`need` private blocks).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn commit_resize(
        &mut self,
        alloc: &mut Alloc,
        span: Span,
        need: u64,
        deltas: impl IntoIterator<Item = i64>,
        how: Take,
    ) {
        for (used, d) in self.group_used.iter_mut().zip(deltas) {
            *used = used.checked_add_signed(d).expect("a group's count stays >= 0");
        }
        self.private = self.private + need - alloc.private;
        (alloc.from, alloc.mid, alloc.to, alloc.checkpoints, alloc.private) =
            (span.from, span.mid, span.to, span.checkpoints, need);
        alloc.stable_to = span.decode_lag().map_or(Tokens::ZERO, |lag| self.stable_to(span.to, lag));
        if how == Take::Evicting {
            self.note_peak();
        }
    }

    /// [`KvPool::release`] of a request finishing on a rank with vLLM's KV
    /// connector (a P/D decode rank): vLLM's `_connector_finished` first
    /// frees the blocks the processed tokens skip
    /// (`remove_skipped_blocks`, `scheduler.py:3366-3375`), group by
    /// group: a window group's blocks below the window of `computed`, which
    /// the last step's allocation kept, and in align mode a state group's
    /// superseded state blocks (before the block of the state at
    /// `computed`, the later first), all ahead of the full-attention blocks
    /// in the eviction order; then the rest, as `release` frees it.
    pub(crate) fn release_with_connector(&mut self, alloc: &mut Alloc, computed: Tokens) {
        // (The other groups count what they held from the holding as it was.)
        let before = *alloc;
        // A window group's blocks below the window of `computed` go first,
        // group by group, as nameless runs and unpinned entries (a finished
        // request is never computed again); the window groups come before
        // the state groups.
        if let Some(w) = self.win()
            && self.skips_cached(alloc, computed)
        {
            self.skip_window(w, alloc, computed, true);
        }
        if alloc.pinned != 0
            && let Some(b) = self.align()
        {
            let cur = u32::try_from(computed.blocks_ceil(b).get().saturating_sub(1)).unwrap_or(u32::MAX);
            let mut pins = self.pins(alloc);
            pins.sort_unstable_by_key(|&(_, i)| std::cmp::Reverse(i));
            for p in &mut pins {
                if p.0 != 0 && p.1 < cur {
                    self.unref_slot(state::state_slot(p.0));
                    *p = (0, 0);
                }
            }
            // (Its count of pins stays: `release` counts the state blocks it
            // held as it held them, and skips the pins dropped here.)
            self.state_pins.insert(alloc.owner, pins);
        }
        self.release_after(alloc, computed, before);
    }

    /// Returns everything `alloc` holds, its KV computed through `computed`
    /// tokens; pinned cached blocks become evictable when no other request
    /// pins them.
    ///
    /// With prefix caching, vLLM has hashed (cached) every full block of
    /// computed KV, so its full-attention blocks past the shared ones (its own and
    /// generated content) take their turn in the eviction order, as a
    /// nameless run, instead of being reused first; nothing can hit them
    /// (a finished request never comes back), so only their place in the
    /// order counts. B = 16, a request of 40 prompt and 20 generated tokens
    /// (59 computed) holding 1 shared block: 3 full blocks, 2 of them its
    /// own, go to the LRU tail, then the shared one; its partial fourth
    /// block is reused first.
    pub(crate) fn release(&mut self, alloc: &mut Alloc, computed: Tokens) {
        let before = *alloc;
        self.release_after(alloc, computed, before);
    }

    /// [`KvPool::release`] of a holding whose window blocks below the
    /// window were just freed ([`KvPool::skip_window`]): the window groups
    /// hold as `alloc` says, the other groups as `before`, the holding
    /// before that, says.
    fn release_after(&mut self, alloc: &mut Alloc, computed: Tokens, before: Alloc) {
        debug_assert!(self.evicted_ahead.is_empty(), "the pool touched while evictions made ahead stand");
        let nameless = match self.fa_block {
            Some(b) if self.caching => {
                let full = computed.blocks_floor(b).get().min(before.to.blocks_ceil(b).get());
                full.saturating_sub(u64::from(alloc.shared)) * self.fa_groups
            }
            _ => 0,
        };
        // With the window cache, the window groups' full blocks of its own
        // too (the ones it pins are unpinned).
        let win_nameless = self.win().map_or(0, |w| {
            let held_end = alloc.to.blocks_ceil(w.block).get();
            let full = computed.blocks_floor(w.block).get().min(held_end);
            let start =
                u64::from(w.skipped(alloc.from).max(if alloc.wpinned > 0 { alloc.wfirst + alloc.wpinned } else { 0 }));
            full.saturating_sub(start) * w.groups
        });
        debug_assert!(nameless + win_nameless <= alloc.private);
        self.free += alloc.private - nameless - win_nameless;
        self.private -= alloc.private;
        let align = self.align().is_some();
        let pinned = alloc.pinned_states();
        for (i, g) in self.groups.iter().enumerate() {
            let h = if g.kind() == CacheGroupKind::SlidingWindow { &*alloc } else { &before };
            let held = Self::group_blocks(g, align, h.from, h.mid, h.to, h.checkpoints);
            let shared = match g.kind() {
                CacheGroupKind::FullAttention => u64::from(alloc.shared),
                CacheGroupKind::State if align && g.prefix_cacheable() => pinned,
                CacheGroupKind::SlidingWindow if self.win().is_some() => u64::from(alloc.wpinned),
                _ => 0,
            };
            self.group_used[i] -= held - shared;
        }
        // Freed in reverse (vLLM's `free_blocks(reversed(...))`), group by
        // group: its own blocks, then the shared ones.
        self.free_nameless(nameless);
        self.unpin(alloc.shared, alloc.owner);
        if self.win().is_some() {
            // Each window group's own blocks, then the entries it pins.
            let own = win_nameless / self.wg();
            self.unpin_window_after(alloc, |pool| pool.free_nameless(own));
        }
        // Then the state entries, the later block first (vLLM frees each
        // group's blocks in reverse, group by group).
        if alloc.pinned != 0 {
            let mut states = self.pins(alloc);
            self.state_pins.remove(&alloc.owner);
            states.sort_unstable_by_key(|&(_, i)| std::cmp::Reverse(i));
            for (h, _) in states {
                if h != 0 {
                    self.unref_slot(state::state_slot(h));
                }
            }
        }
        *alloc = Alloc::owned_by(alloc.owner);
    }

    /// The source release of a completed handoff prefill: frees, group by
    /// group, what [`rules::group_release`] says the group frees (a window
    /// group's blocks below the window, a state group's checkpoint blocks),
    /// keeping the source. Freed blocks go back to the free list; full
    /// attention frees nothing, so cached blocks stay cached.
    pub(crate) fn release_to_source(&mut self, alloc: &mut Alloc) {
        debug_assert!(self.evicted_ahead.is_empty(), "the pool touched while evictions made ahead stand");
        // With the window cache, the window blocks below the window go into
        // the eviction order (all full, so hashed), its own as a nameless
        // run: a finished prefill never computes them again. (The other
        // groups count what they held from the holding as it was.)
        let before = *alloc;
        if let Some(w) = self.win()
            && self.skips_cached(alloc, alloc.to)
        {
            self.skip_window(w, alloc, alloc.to, true);
        }
        let mut freed = 0u64;
        let align = self.align().is_some();
        // In align mode the earlier states it still holds go too (vLLM's
        // `remove_skipped_blocks` when a connector-held request finishes):
        // cached ones are unpinned, its own freed. The later one first:
        // vLLM frees the range from its end (`MambaManager.
        // _remove_blocks_in_range`, `single_type_kv_cache_manager.py:1620`),
        // so it is evicted before the earlier one.
        let [at_from, at_mid, _] = self.state_blocks_held(before.from, before.mid, before.to);
        let mut pins = self.pins(alloc);
        let mut own_earlier = 0;
        for idx in [at_mid, at_from].into_iter().flatten() {
            match pins.iter().position(|&(k, i)| k != 0 && i == idx) {
                Some(slot) => {
                    let h = pins[slot].0;
                    pins[slot] = (0, 0);
                    self.set_pins(alloc, pins);
                    self.unref_slot(state::state_slot(h));
                }
                None => own_earlier += 1,
            }
        }
        for (i, g) in self.groups.iter().enumerate() {
            let h = if g.kind() == CacheGroupKind::SlidingWindow { &*alloc } else { &before };
            let r = handoff::group_release(g, h.from, h.to, h.checkpoints);
            let previous =
                if align && g.kind() == CacheGroupKind::State && g.prefix_cacheable() { own_earlier } else { 0 };
            let free = r.free().get() + previous;
            debug_assert_eq!(r.keep().get(), Self::group_blocks(g, align, alloc.to, alloc.to, alloc.to, false));
            self.group_used[i] -= free;
            freed += free;
        }
        debug_assert!(freed <= alloc.private, "a source frees only private blocks");
        self.private -= freed;
        self.free += freed;
        alloc.private -= freed;
        (alloc.from, alloc.mid, alloc.checkpoints, alloc.stable_to) = (alloc.to, alloc.to, false, Tokens::ZERO);
    }
}
