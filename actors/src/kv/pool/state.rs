//! vLLM's Mamba align mode in the pool: cached states at block boundaries,
//! which holdings pin, and the state block a step holds besides the one it
//! writes (`crate::vllm::mamba`).

use super::{Alloc, Kind, KvPool, MAX_GROUPS, Shortfall, Span, Take, keys};
use crate::base::keys::plain_key;
use crate::base::units::Tokens;
use crate::models::model::CacheGroupKind;
use crate::requests::workload::{PrefixIds, mix};

/// Salts the keys of cached states (align mode) from their block's key.
pub(super) const STATE_ENTRY: u64 = 0x7374_6174_655f_6b65;

/// A pinned state entry's handle: its slot in the LRU order, plus one (so
/// that 0 is none).
pub(super) fn state_handle(slot: u32) -> u64 {
    u64::from(slot) + 1
}

/// The LRU slot of a state entry's handle.
pub(super) fn state_slot(handle: u64) -> u32 {
    debug_assert!(handle != 0);
    (handle - 1) as u32
}

impl KvPool {
    /// The state entries `alloc` pins (handle, block index; handle 0: none;
    /// [`state_handle`]).
    pub(super) fn pins(&self, alloc: &Alloc) -> [(u64, u32); 3] {
        if alloc.pinned == 0 { [(0, 0); 3] } else { self.state_pins.get(&alloc.owner).copied().unwrap_or_default() }
    }

    /// Records the state entries `alloc` pins.
    pub(super) fn set_pins(&mut self, alloc: &mut Alloc, pins: [(u64, u32); 3]) {
        let n = pins.iter().filter(|p| p.0 != 0).count();
        alloc.pinned = u8::try_from(n).unwrap_or(u8::MAX);
        if n == 0 {
            self.state_pins.remove(&alloc.owner);
        } else {
            self.state_pins.insert(alloc.owner, pins);
        }
    }

    /// The state-group block indices a step computing `mid..to`, freeing
    /// from `from ≤ mid`, holds in align mode: those of the states after
    /// `from` and after `mid` where they lie before the block of the one it
    /// writes, and that one ([`mamba::earlier_states`]).
    pub(super) fn state_blocks_held(&self, from: Tokens, mid: Tokens, to: Tokens) -> [Option<u32>; 3] {
        let Some(b) = self.align() else { return [None; 3] };
        let idx = |t: Tokens| u32::try_from(t.blocks_ceil(b).get().saturating_sub(1)).unwrap_or(u32::MAX);
        let cur = (!to.is_zero()).then(|| idx(to));
        let before = |t: Tokens| !t.is_zero() && t < to && t.blocks_ceil(b) != to.blocks_ceil(b);
        let at_mid = before(mid).then(|| idx(mid));
        let at_from = (before(from) && from.blocks_ceil(b) != mid.blocks_ceil(b)).then(|| idx(from));
        [at_from, at_mid, cur]
    }

    /// How many of `alloc`'s pinned state entries the step computing
    /// `mid..to`, freeing from `from`, still holds.
    pub(super) fn states_kept(&self, alloc: &Alloc, from: Tokens, mid: Tokens, to: Tokens) -> u64 {
        if alloc.pinned == 0 {
            return 0;
        }
        let held = self.state_blocks_held(from, mid, to);
        self.pins(alloc).iter().filter(|&&(k, i)| k != 0 && held.contains(&Some(i))).count() as u64
    }

    /// In align mode, whether the decode step `from..to` caches the state it
    /// writes (it ends on a block boundary) or frees a cached one `alloc`
    /// pins (into the eviction order, so not ahead of time either).
    #[inline]
    pub(crate) fn caches_state(&self, alloc: &Alloc, from: Tokens, to: Tokens) -> bool {
        let Some(sb) = self.align() else { return false };
        to.get().is_multiple_of(sb.get())
            || (alloc.pinned != 0 && self.states_kept(alloc, from, from, to) < alloc.pinned_states())
    }

    /// [`KvPool::resize_inner`] in align mode: state entries pinned and
    /// unpinned too. On a shortfall the state the step no longer needs is
    /// freed all the same (into the eviction order if cached): vLLM's
    /// `allocate_slots` runs `remove_skipped_blocks` (`last_state_block_idx`)
    /// before it checks the free blocks, and a preemption then frees the
    /// rest after it.
    ///
    /// `before`: the holding as its groups other than the window ones hold
    /// it (`*alloc` but where the window cache has just freed the blocks
    /// leaving the window, [`KvPool::skip_window`], which moves the
    /// holding's start).
    #[inline(never)]
    pub(super) fn resize_aligned(
        &mut self,
        alloc: &mut Alloc,
        before: Alloc,
        span: Span,
        how: Take,
    ) -> Result<(), Shortfall> {
        let from = span.from;
        let result = self.resize_aligned_once(alloc, before, span, how);
        // What it holds once the states before `from` are freed: the step
        // it was in, from `from` (at its end: the synchronous loop; at its
        // start, where the step before it was in flight: the asynchronous
        // one).
        // (A decoding set's member may hold an earlier step's blocks, the
        // same through `stable_to`: it is at `from` then.)
        let at = before.to.max(from);
        if result.is_err()
            && how.evicts()
            && from > before.from
            && from <= before.to.max(before.stable_to)
            && self.state_blocks_held(from, from, at) != self.state_blocks_held(before.from, before.mid, before.to)
        {
            let left = Span::new(from, at);
            self.resize_aligned_once(alloc, before, left, how).expect("giving blocks back fits");
        }
        result
    }

    /// [`KvPool::resize_aligned`]'s move, all or nothing.
    pub(super) fn resize_aligned_once(
        &mut self,
        alloc: &mut Alloc,
        before: Alloc,
        span: Span,
        how: Take,
    ) -> Result<(), Shortfall> {
        let Span { from, mid, to, checkpoints } = span;
        // Per group, what the new state holds and the change from the old.
        let mut all = 0u64;
        let mut deltas = [0i64; MAX_GROUPS];
        let align = true;
        // Cached state entries it pins: those the new state no longer holds
        // are unpinned first, as vLLM frees them (`remove_skipped_blocks`)
        // before it allocates.
        let (mut dropped, mut old_pinned, mut kept) = ([0u64; 3], 0, 0);
        if alloc.pinned != 0 {
            let held = self.state_blocks_held(from, mid, to);
            for (d, &(k, i)) in dropped.iter_mut().zip(&self.pins(alloc)) {
                if k != 0 && !held.contains(&Some(i)) {
                    *d = k;
                }
            }
            old_pinned = alloc.pinned_states();
            kept = old_pinned - dropped.iter().filter(|&&k| k != 0).count() as u64;
        }
        for (i, g) in self.groups.iter().enumerate() {
            let new = Self::group_blocks(g, align, from, mid, to, checkpoints);
            let was = if g.kind() == CacheGroupKind::SlidingWindow { &*alloc } else { &before };
            let old = Self::group_blocks(g, align, was.from, was.mid, was.to, was.checkpoints);
            all += new;
            deltas[i] = new as i64 - old as i64;
        }
        if old_pinned != kept {
            // Pinned entries count once, through their pins.
            for (d, g) in deltas.iter_mut().zip(&self.groups) {
                if g.kind() == CacheGroupKind::State && g.prefix_cacheable() {
                    *d += (old_pinned - kept) as i64;
                }
            }
        }
        let need = all
            - u64::from(alloc.shared) * self.fa_groups
            - kept * self.state_groups
            - u64::from(alloc.wpinned) * self.wg();
        if old_pinned == kept {
            if need > alloc.private {
                self.take(need - alloc.private, how)?;
            } else {
                self.free += alloc.private - need;
            }
        } else {
            for &h in dropped.iter().filter(|&&h| h != 0) {
                self.unref_slot(state_slot(h));
            }
            if need > alloc.private
                && let Err(e) = self.take(need - alloc.private, how)
            {
                for &h in dropped.iter().filter(|&&h| h != 0) {
                    self.ref_slot(state_slot(h));
                }
                return Err(e);
            }
            if need <= alloc.private {
                self.free += alloc.private - need;
            }
            let mut pins = self.pins(alloc);
            for (slot, d) in pins.iter_mut().zip(dropped) {
                if d != 0 {
                    *slot = (0, 0);
                }
            }
            self.set_pins(alloc, pins);
        }
        self.commit_resize(alloc, span, need, deltas, how);
        Ok(())
    }

    /// The key of the state cached after the first `n` full-attention
    /// blocks of the prompt.
    pub(super) fn state_key(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, n: u32) -> u64 {
        plain_key(mix(self.key(prefix, prompt, owner, n - 1), STATE_ENTRY))
    }

    /// The cached state entry a hit of `n` blocks pins (0: none, or a hit on
    /// the request's own content, whose state is allocated fresh).
    #[inline]
    pub(super) fn hit_entry(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, n: u32) -> u64 {
        if self.state_groups == 0 || n == 0 {
            return 0;
        }
        let k = self.state_key(prefix, prompt, owner, n);
        if self.entries.contains_key(k, keys(self.lru.slots())) { k } else { 0 }
    }

    /// In align mode, beside a full-attention hit of `n` blocks with no
    /// state cached at its end, the deepest state cached below it (the
    /// Mamba group's own hit, which a connector's lookup keeps apart,
    /// [`KvPool::load_fits`]); 0: none, or the hit ends at a state.
    pub(super) fn lagging_state(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, n: u32) -> u64 {
        if self.align().is_none() || self.fa_groups == 0 || n == 0 || self.hit_entry(prefix, prompt, owner, n) != 0 {
            return 0;
        }
        let m = self.deepest_state(prefix, prompt, owner, n - self.hit_align.min(n));
        self.hit_entry(prefix, prompt, owner, m)
    }

    /// The most blocks `m ≤ n`, in steps of the hit alignment down from
    /// `n`, after which a state is cached (0: none): vLLM's Mamba manager
    /// searches right to left for a cached state.
    #[inline]
    pub(super) fn deepest_state(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, n: u32) -> u32 {
        let mut m = n;
        while m > 0 {
            if self.entries.contains_key(self.state_key(prefix, prompt, owner, m), keys(self.lru.slots())) {
                break;
            }
            m -= self.hit_align.min(m);
        }
        m
    }

    /// The state-group block index of the state after `t` tokens.
    pub(super) fn state_index(&self, t: Tokens) -> u32 {
        let b = self.align().expect("align mode");
        u32::try_from(t.blocks_ceil(b).get().saturating_sub(1)).unwrap_or(u32::MAX)
    }

    /// Starts a new schedule call (`calls`): states cached in earlier ones
    /// may be hit again (vLLM's `new_step_starts`).
    pub(crate) fn new_step(&mut self, calls: u64) {
        if self.states_call != calls {
            self.states_call = calls;
            self.states_this_step.clear();
        }
    }

    /// The states `alloc` registered at block boundaries past `hashable`
    /// go back to it as blocks of its own, uncached (the inverse of
    /// [`KvPool::register_state`]): a preemption under the asynchronous
    /// loop with the step that wrote such a state still in flight. That
    /// step's input token was a placeholder when it was scheduled, so vLLM
    /// could not hash the state's block then (`cache_blocks` stops at the
    /// tokens known, `Request.block_hashes`); it would have at the
    /// request's next allocation, once the token is known, but the
    /// preemption frees the block first, uncached (evicted first).
    /// A state another request pinned meanwhile stays cached. (Its key
    /// stays among the states cached in this call, which only keeps other
    /// requests from hitting it in this call: it is the request's own
    /// generated content, which no other request names.)
    ///
    /// B = 8: a decode step 1151..1152 scheduled while 1150..1151 is in
    /// flight, then a preemption: hashable 1151, so the state at 1152
    /// is freed as a plain block.
    pub(crate) fn forget_states_past(&mut self, alloc: &mut Alloc, hashable: Tokens) {
        let Some(sb) = self.align() else { return };
        if alloc.pinned == 0 {
            return;
        }
        let mut pins = self.pins(alloc);
        let sg = self.state_groups;
        let mut changed = false;
        for p in &mut pins {
            let (h, idx) = *p;
            let boundary = (u64::from(idx) + 1) * sb.get();
            if h == 0 || boundary <= hashable.get() {
                continue;
            }
            let slot = state_slot(h);
            if self.lru.get(slot).refs() != 1 {
                continue;
            }
            let key = self.lru.get(slot).key();
            self.forget_copy(key, slot);
            self.lru.forget(slot);
            self.shared -= sg;
            self.private += sg;
            alloc.private += sg;
            *p = (0, 0);
            changed = true;
        }
        if changed {
            self.set_pins(alloc, pins);
        }
    }

    /// In align mode, a state on a block boundary is cached: the one a step
    /// that ends there writes (vLLM caches a state block once full, at
    /// allocation; a non-final chunk ends there by `align::aligned_chunk`;
    /// a decode step at every boundary it reaches), or a landed handoff's at
    /// `computed` (on a decode rank vLLM caches the loaded state at T when T
    /// is block-aligned); of content the prefix ids name or of the
    /// request's own (its recompute after a preemption may hit it). It is
    /// freed into the eviction order when the holding moves on (vLLM's
    /// `remove_skipped_blocks`, `last_state_block_idx`). The same state
    /// another request cached (both computed it) is cached again as a later
    /// copy: vLLM keeps both blocks (`BlockHashToBlockMap`), as it does
    /// full-attention ones (`register_block`), and a hit pins the first.
    pub(crate) fn register_state(&mut self, alloc: &mut Alloc, prefix: &PrefixIds, prompt: Tokens, computed: Tokens) {
        let Some(sb) = self.align() else { return };
        let fb = self.fa_block.unwrap_or(sb);
        let to = computed;
        if self.state_groups == 0 || to.is_zero() || !to.get().is_multiple_of(sb.get()) {
            return;
        }
        if !self.state_blocks_held(alloc.from, alloc.mid, alloc.to).contains(&Some(self.state_index(to))) {
            return;
        }
        if !to.get().is_multiple_of(fb.get()) {
            return;
        }
        let n = u32::try_from(to.get() / fb.get()).unwrap_or(u32::MAX);
        let k = self.state_key(prefix, prompt, alloc.owner, n);
        let idx = self.state_index(to);
        let mut pins = self.pins(alloc);
        if pins.iter().any(|&(h, _)| h != 0 && self.lru.get(state_slot(h)).key() == k) {
            return;
        }
        let Some(at) = pins.iter().position(|&(h, _)| h == 0) else { return };
        let sg = self.state_groups;
        // Its own block becomes the cached entry; where another request
        // cached the same state, a later copy of it.
        let slot = self.lru.alloc(k, Kind::State);
        match self.entries.entry(k, keys(self.lru.slots())) {
            Err(vacant) => self.entries.fill(vacant, slot),
            Ok(_) => self.copies.entry(k).or_default().push(slot),
        }
        self.shared += sg;
        self.private -= sg;
        alloc.private -= sg;
        pins[at] = (state_handle(slot), idx);
        self.set_pins(alloc, pins);
        self.states_this_step.push(k);
    }
}
