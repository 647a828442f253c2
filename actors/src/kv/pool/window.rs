//! The window cache: a sliding-window group's full blocks cached as vLLM
//! caches them ([`Win`]).

use super::{Alloc, Kind, KvPool, Shortfall, Span, Take, keys};
use crate::base::keys::plain_key;
use crate::base::units::Tokens;
use crate::models::model::{CacheGroup, CacheGroupKind};
use crate::requests::workload::{PrefixIds, mix};
use crate::vllm::admission::{Whole, group_blocks_counted};
use crate::vllm::{blocks, prefix, window};

/// Salts the keys of cached window blocks from their position's key.
pub(super) const WINDOW_ENTRY: u64 = 0x7769_6e64_6f77_5f6b;

/// The window cache: vLLM caches a sliding-window group's full blocks as
/// it does full-attention ones, frees those that leave the window into the
/// eviction order, and a hit needs the `need = cdiv(W − 1, B)` window blocks
/// before its end cached (`single_type_kv_cache_manager.py`
/// `SlidingWindowManager.find_longest_cache_hit`). pdsim keeps it when
/// every other group is a full-attention one and the window groups share
/// one window and one block size, a multiple of the full-attention
/// groups' (if any).
#[derive(Clone, Copy, Debug)]
pub(super) struct Win {
    pub(super) block: Tokens,
    pub(super) window: Tokens,
    /// Window groups: a window block index is an entry in each, cached,
    /// pinned, freed and evicted apart (vLLM's block pool keys a cached
    /// block by its hash and its group, and its coordinator frees a
    /// request's blocks group by group), so that an eviction can take one
    /// group's copy of a content and leave another's.
    pub(super) groups: u64,
    /// Cached window blocks a hit needs before its end (at least one).
    pub(super) need: u32,
    /// Window blocks a holding keeps at a block-aligned hit: `cdiv(W − 1,
    /// B)`, `need` but for a window of one token (0).
    pub(super) held: u32,
}

/// The key of a window block in window group `g` whose position key is
/// `base`: each group's copy is an entry of its own.
#[inline]
pub(super) fn win_entry_key(base: u64, g: u64) -> u64 {
    plain_key(mix(base, WINDOW_ENTRY + g))
}

impl Win {
    /// Window blocks skipped (freed) by a step starting at `from`.
    pub(super) fn skipped(self, from: Tokens) -> u32 {
        u32::try_from(window::skipped_blocks(from, self.window, self.block).get()).unwrap_or(u32::MAX)
    }
}

impl KvPool {
    /// The window cache of a pool of `groups`: every non-full-attention
    /// group a prefix-cacheable sliding window (or a state group that opts
    /// out of prefix caching), the windows with one window and one block
    /// size, a multiple of the full-attention groups' (if any), and those
    /// cached. Beside a Mamba state group in align mode (`align`: its block
    /// size) too, where the full-attention, window and state groups share
    /// one block size and the window groups come before the state groups
    /// (vLLM frees a request's blocks group by group in that order).
    /// Otherwise none: window blocks are then freed as plain blocks and hits
    /// are taken on the other groups alone (a departure from vLLM, named in
    /// the README).
    pub(super) fn window_cache(
        groups: &[CacheGroup],
        prefix_caching: bool,
        caching: bool,
        fa_block: Option<Tokens>,
        align: Option<Tokens>,
    ) -> Option<Win> {
        let first = groups.iter().find(|g| g.kind() == CacheGroupKind::SlidingWindow)?;
        let (block, window) = (first.block_size(), first.window()?);
        let cached_state = |g: &CacheGroup| g.kind() == CacheGroupKind::State && g.prefix_cacheable();
        let beside_states = align.is_some_and(|b| {
            let last_window = groups.iter().rposition(|g| g.kind() == CacheGroupKind::SlidingWindow);
            let first_state = groups.iter().position(cached_state);
            b == block && fa_block == Some(block) && last_window < first_state
        });
        // (Groups that opt out of prefix caching, such as a tail ring, take
        // no part in hits: vLLM's coordinator skips them.)
        let same = groups.iter().filter(|g| g.kind() != CacheGroupKind::FullAttention).all(|g| {
            (g.kind() == CacheGroupKind::SlidingWindow
                && g.prefix_cacheable()
                && g.block_size() == block
                && g.window() == Some(window))
                || (g.kind() == CacheGroupKind::State && !g.prefix_cacheable())
                || (beside_states && cached_state(g))
        });
        let fa_ok = fa_block.is_none_or(|b| caching && block.get().is_multiple_of(b.get()));
        if !prefix_caching || !same || !fa_ok {
            return None;
        }
        let groups = groups.iter().filter(|g| g.kind() == CacheGroupKind::SlidingWindow).count() as u64;
        let held = window::window_blocks_at_boundary(window, block);
        Some(Win { block, window, groups, need: window::hit_run_blocks(window, block), held })
    }

    /// Window blocks pinned by a hit of `n` blocks (0 without a window cache).
    #[inline]
    pub(super) fn win_pins(&self, n: u32) -> u32 {
        self.win().map_or(0, |w| self.win_blocks(n).min(w.held))
    }

    /// The window blocks a hit of `n` cache blocks covers (a hit is a
    /// multiple of the window's block size).
    #[inline]
    pub(super) fn win_blocks(&self, n: u32) -> u32 {
        match (self.win(), self.fa_block) {
            (Some(w), Some(b)) => u32::try_from(u64::from(n) * b.get() / w.block.get()).unwrap_or(u32::MAX),
            _ => n,
        }
    }

    /// Window groups, so window entries per window block index (0 without
    /// a window cache).
    #[inline]
    pub(super) fn wg(&self) -> u64 {
        self.win().map_or(0, |w| w.groups)
    }

    /// With the window cache, whether moving `alloc` to a step from `from`
    /// frees window blocks (into the eviction order, so not ahead of time).
    #[inline]
    pub(crate) fn skips_cached(&self, alloc: &Alloc, from: Tokens) -> bool {
        self.win().is_some_and(|w| w.skipped(from) > w.skipped(alloc.from) && !alloc.to.is_zero())
    }

    /// Blocks of `alloc`'s own that a step from `from` frees into the
    /// eviction order (window blocks leaving the window; 0 without the
    /// window cache): they leave it but do not become plain free blocks.
    #[inline]
    pub(crate) fn cached_by_step(&self, alloc: &Alloc, from: Tokens) -> u64 {
        if self.win().is_some() { self.win_step(alloc, from).1 } else { 0 }
    }

    /// With the window cache, for `alloc` moving to a step from `from`: the
    /// blocks of the window entries it still pins, and of its own window
    /// blocks the step frees into the eviction order.
    #[inline(never)]
    pub(super) fn win_step(&self, alloc: &Alloc, from: Tokens) -> (u64, u64) {
        let Some(w) = self.win() else { return (0, 0) };
        let (old, new) = (w.skipped(alloc.from), w.skipped(from));
        if new <= old || alloc.to.is_zero() {
            return (u64::from(alloc.wpinned) * w.groups, 0);
        }
        let held_end = u32::try_from(alloc.to.blocks_ceil(w.block).get()).unwrap_or(u32::MAX);
        let new = new.min(held_end);
        let dropped =
            if alloc.wpinned == 0 { 0 } else { new.min(alloc.wfirst + alloc.wpinned).saturating_sub(alloc.wfirst) };
        let own = new.saturating_sub(old) - dropped;
        (u64::from(alloc.wpinned - dropped) * w.groups, u64::from(own) * w.groups)
    }

    /// With the window cache, the first window block a hit of `hit` blocks
    /// pins for a first step from `from`: of the `held` before its end,
    /// those in that step's window (a decode rank's reservation starts past
    /// its hit, and vLLM never touches the hit's blocks below the window,
    /// `add_local_computed_blocks`). `hit` without a window cache.
    #[inline]
    pub(super) fn win_lo(&self, hit: u32, from: Tokens) -> u32 {
        let n = self.win_blocks(hit);
        match self.win() {
            Some(w) => (n - n.min(w.held)).max(w.skipped(from)).min(n),
            None => n,
        }
    }

    /// [`KvPool::resize_inner`] with the window cache: the window blocks the
    /// step skips are freed into the eviction order first, and stay freed
    /// if the rest does not fit (vLLM's `allocate_slots` calls
    /// `remove_skipped_blocks` before it checks the free blocks); then the
    /// growth is all or nothing.
    #[inline(never)]
    pub(super) fn resize_win(&mut self, w: Win, alloc: &mut Alloc, span: Span, how: Take) -> Result<(), Shortfall> {
        let from = span.from;
        if self.skips_cached(alloc, from) {
            debug_assert!(from <= alloc.to.max(alloc.stable_to), "a step starts inside what its holding covers");
            self.skip_window(w, alloc, from, false);
        }
        debug_assert!(
            w.skipped(from) >= w.skipped(alloc.from),
            "window blocks freed into the cache are not taken back"
        );
        // Then as any other model (its pins are kept).
        self.resize_plain(alloc, span, how)
    }

    /// Frees `alloc`'s window blocks below the window of a step from
    /// `from` into the eviction order, group by group, each group's the
    /// last first (vLLM's `_remove_blocks_in_range` frees them backwards,
    /// all hashed, one group after another): its own under keys of its own
    /// (its recompute after a preemption may hit them), or with `nameless`
    /// as a nameless run (a finished request's, never computed again), then
    /// the entries it pins. Its holding then starts at `from`.
    pub(super) fn skip_window(&mut self, w: Win, alloc: &mut Alloc, from: Tokens, nameless: bool) {
        // A decoding holding kept its state while its blocks stayed the same
        // (`stable_to`): its blocks are those of the step ending at `from`.
        alloc.to = alloc.to.max(from);
        let old = w.skipped(alloc.from);
        let held_end = u32::try_from(alloc.to.blocks_ceil(w.block).get()).unwrap_or(u32::MAX);
        let new = w.skipped(from).min(held_end);
        let pin_end = alloc.wfirst + alloc.wpinned;
        let pinned = |i: u32| alloc.wpinned > 0 && i >= alloc.wfirst && i < pin_end;
        let own = (old..new).filter(|&i| !pinned(i)).count() as u64;
        let dropped = if alloc.wpinned == 0 { 0 } else { new.min(pin_end).saturating_sub(alloc.wfirst) };
        let slots = (dropped > 0)
            .then(|| self.win_slots.remove(&alloc.owner).expect("a holding pinning window entries has their slots"));
        // Group by group, as vLLM's `remove_skipped_blocks` goes through its
        // managers: each group's own blocks, then the entries it pins.
        for g in 0..w.groups {
            if nameless {
                self.free_nameless(own);
            } else {
                for i in (old..new).rev().filter(|&i| !pinned(i)) {
                    // (Content no prefix id names: keys of its own.)
                    let k = win_entry_key(self.win_base(&PrefixIds::none(), Tokens::ZERO, alloc.owner, i), g);
                    let slot = self.new_entry(k, Kind::Window);
                    self.lru.unpin(slot);
                }
                self.cached_free += own;
            }
            if let Some(slots) = &slots {
                for j in (0..dropped).rev() {
                    self.unref_win_slot(slots[(u64::from(j) * w.groups + g) as usize], g);
                }
            }
        }
        self.private -= own * w.groups;
        alloc.private -= own * w.groups;
        for (i, g) in self.groups.iter().enumerate() {
            if g.kind() == CacheGroupKind::SlidingWindow {
                self.group_used[i] -= own;
            }
        }
        if let Some(mut slots) = slots {
            slots.drain(..(u64::from(dropped) * w.groups) as usize);
            alloc.wfirst += dropped;
            alloc.wpinned -= dropped;
            self.put_win_slots(alloc.owner, slots);
        }
        (alloc.from, alloc.mid) = (from, from);
        alloc.stable_to = Tokens::ZERO;
    }

    /// Drops every pin `alloc` holds on window entries, group by group,
    /// each the last block first, each group's after `before(self)` (its own
    /// blocks freed first).
    pub(super) fn unpin_window_after(&mut self, alloc: &mut Alloc, before: impl Fn(&mut Self)) {
        let groups = self.wg();
        if alloc.wpinned == 0 {
            for _ in 0..groups {
                before(self);
            }
            return;
        }
        let mut slots = self.win_slots.remove(&alloc.owner).expect("a holding pinning window entries has their slots");
        debug_assert_eq!(slots.len() as u64, u64::from(alloc.wpinned) * groups);
        for g in 0..groups {
            before(self);
            for j in (0..u64::from(alloc.wpinned)).rev() {
                self.unref_win_slot(slots[(j * groups + g) as usize], g);
            }
        }
        slots.clear();
        self.spare_slot_lists.push(slots);
        alloc.wpinned = 0;
    }

    /// Drops every pin `alloc` holds on window entries
    /// ([`KvPool::unpin_window_after`]).
    pub(super) fn unpin_window(&mut self, alloc: &mut Alloc) {
        self.unpin_window_after(alloc, |_| {});
    }

    /// Pins the window entry in slot `slot` of window group `g`.
    #[inline]
    pub(super) fn ref_win_slot(&mut self, slot: u32, g: u64) {
        if let Some(was_head) = self.lru.pin(slot) {
            if was_head {
                self.absorb_front(None);
            }
            self.cached_free -= 1;
            self.shared += 1;
            self.group_used[usize::from(self.win_idx[g as usize])] += 1;
        }
    }

    /// Drops a pin of the window entry in slot `slot` of window group `g`;
    /// unpinned, it joins the LRU order's tail.
    #[inline]
    pub(super) fn unref_win_slot(&mut self, slot: u32, g: u64) {
        if self.lru.unpin(slot) {
            self.shared -= 1;
            self.cached_free += 1;
            self.group_used[usize::from(self.win_idx[g as usize])] -= 1;
        }
    }

    /// Puts back a holding's window slot list.
    pub(super) fn put_win_slots(&mut self, owner: u64, slots: Vec<u32>) {
        if slots.is_empty() {
            self.spare_slot_lists.push(slots);
        } else {
            self.win_slots.insert(owner, slots);
        }
    }

    /// Takes a holding's window slot list out of the map (a spare one if it
    /// pins none).
    pub(super) fn take_win_slots(&mut self, alloc: &Alloc) -> Vec<u32> {
        if alloc.wpinned == 0 {
            self.spare_slot_lists.pop().unwrap_or_default()
        } else {
            self.win_slots.remove(&alloc.owner).expect("a holding pinning window entries has their slots")
        }
    }

    /// The window cache's hit, as vLLM's `SlidingWindowManager.find_longest_cache_hit`
    /// after the full-attention one (`kv_cache_coordinator.py:806`, one
    /// pass for one full-attention and one other kind of group): from the
    /// end of the full-attention hit (with no full-attention group, of what
    /// may hit: `cdiv` of all but the last token, floored) back, the first
    /// place where `need = cdiv(W − 1, B)` cached window blocks in a row
    /// end; with none, the run of cached window blocks from the start.
    ///
    /// W = 33, B = 16 (need 2), a full-attention hit of 5 blocks, window
    /// blocks 0, 1, 2 and 4 cached: block 4 alone, then 2 and 1 in a row:
    /// the hit is 1 + 2 = 3 blocks.
    pub(super) fn window_hit(&self, w: Win, prefix: &PrefixIds, prompt: Tokens, owner: u64, goal: Tokens) -> u32 {
        let n = if self.fa_groups > 0 {
            self.win_blocks(self.fa_hit(prefix, prompt, owner, goal))
        } else {
            u32::try_from(prefix::hit_limit(goal).blocks_floor(w.block).get()).unwrap_or(u32::MAX)
        };
        self.window_hit_within(w, prefix, prompt, owner, n)
    }

    /// [`KvPool::window_hit`] of at most `n` window blocks, in cache blocks.
    pub(super) fn window_hit_within(&self, w: Win, prefix: &PrefixIds, prompt: Tokens, owner: u64, n: u32) -> u32 {
        let mut run = 0u32;
        let mut hit = None;
        for i in (0..n).rev() {
            // Cached in every window group (vLLM's `get_cached_block` for the
            // groups of one spec).
            let base = self.win_base(prefix, prompt, owner, i);
            if (0..w.groups).all(|g| self.entries.contains_key(win_entry_key(base, g), keys(self.lru.slots()))) {
                run += 1;
                if run >= w.need {
                    hit = Some(i + w.need);
                    break;
                }
            } else {
                run = 0;
            }
        }
        // In cache blocks.
        let per = self.fa_block.map_or(1, |b| w.block.get() / b.get());
        u32::try_from(u64::from(hit.unwrap_or(run)) * per).unwrap_or(u32::MAX)
    }

    /// The position key window block `block` of a request is cached under
    /// in each window group ([`win_entry_key`]).
    pub(super) fn win_base(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, block: u32) -> u64 {
        let b = self.win().expect("a window cache").block;
        Self::key_at(prefix, prompt, owner, Tokens::new((u64::from(block) + 1) * b.get()), b)
    }

    /// With the window cache, [`KvPool::pin_and_allocate_leaving`] for a first
    /// step that starts past the hit (a decode rank's reservation): pins
    /// the hit's blocks in that step's window only and allocates the step
    /// in one go, as vLLM's `allocate_slots` does for a remote load. Called
    /// after the check.
    pub(super) fn pin_into(
        &mut self,
        alloc: &mut Alloc,
        prefix: &PrefixIds,
        prompt: Tokens,
        hit: u32,
        (from, to): (Tokens, Tokens),
    ) {
        debug_assert!(alloc.is_empty());
        let fa = self.fa_pins(hit);
        let wn = self.load_window_hit(prefix, prompt, alloc.owner, hit);
        let lo = self.win_lo(wn, from);
        let nw = self.win_blocks(wn);
        self.pin_hit_entries(alloc, prefix, prompt, fa, lo..nw);
        let mut need = 0;
        for (i, g) in self.groups.iter().enumerate() {
            let held = blocks::blocks_for_step(g, from, to, false).get();
            let pinned = match g.kind() {
                CacheGroupKind::FullAttention => u64::from(fa),
                CacheGroupKind::SlidingWindow => u64::from(nw - lo),
                _ => 0,
            };
            self.group_used[i] += held - pinned;
            need += held - pinned;
        }
        self.take(need, Take::Evicting).expect("checked: the step fits");
        self.private += need;
        *alloc = Alloc {
            from,
            mid: from,
            to,
            shared: fa,
            private: need,
            wfirst: lo,
            wpinned: nw - lo,
            ..Alloc::owned_by(alloc.owner)
        };
        alloc.stable_to = Span::new(from, to).decode_lag().map_or(Tokens::ZERO, |lag| self.stable_to(to, lag));
        self.note_peak();
    }

    /// With the window cache, the blocks beyond a hit of `hit` blocks that
    /// admission counts for the whole known sequence, as vLLM's
    /// `get_num_blocks_to_allocate` does for a new request: per group, its
    /// blocks for the whole sequence (a window group's capped, see
    /// [`KvPool::whole_fits`]) less the hit's (the window group's hit list
    /// counting its skipped blocks too).
    ///
    /// W = 33, B = 16, a budget of 32, a hit of 4 blocks, 200 tokens known:
    /// full attention cdiv(200, 16) − 4 = 9, the window min(13, 5) − 4 = 1.
    pub(super) fn whole_blocks_after_window_hit(&self, w: Win, hit: u32, whole: Whole) -> u64 {
        let nw = u64::from(self.win_blocks(hit));
        let hit = u64::from(hit);
        self.groups
            .iter()
            .map(|g| {
                let blocks = whole.to.blocks_ceil(g.block_size()).get();
                match g.kind() {
                    CacheGroupKind::SlidingWindow => {
                        let cap = window::admission_cap_blocks(w.window, w.block, whole.in_flight);
                        blocks.min(cap).saturating_sub(nw)
                    }
                    // A state group counts as it does without the window
                    // cache ([`KvPool::whole_blocks`]).
                    CacheGroupKind::State => group_blocks_counted(g, self.align().is_some(), whole),
                    _ => blocks.saturating_sub(hit),
                }
            })
            .sum()
    }

    /// With the window cache, registers the newly full window blocks of
    /// content the prefix ids name that the step holds, as pinned entries
    /// (vLLM caches every group's full blocks at allocation; the blocks
    /// below the window are freed into the eviction order at the next step,
    /// [`KvPool::skip_window`]).
    pub(super) fn register_window(
        &mut self,
        w: Win,
        alloc: &mut Alloc,
        prefix: &PrefixIds,
        prompt: Tokens,
        computed: Tokens,
    ) {
        let full = u32::try_from(computed.min(alloc.to).blocks_floor(w.block).get()).unwrap_or(u32::MAX);
        // Past its pins (named content comes first), else from the window.
        let mut i = if alloc.wpinned > 0 { alloc.wfirst + alloc.wpinned } else { w.skipped(alloc.from) };
        if i >= full {
            return;
        }
        let mut slots = self.take_win_slots(alloc);
        while i < full {
            let Some(k) = prefix.key_through(Tokens::new((u64::from(i) + 1) * w.block.get()), prompt, w.block) else {
                break;
            };
            if alloc.wpinned == 0 {
                alloc.wfirst = i;
            }
            debug_assert_eq!(alloc.wfirst + alloc.wpinned, i, "a holding's window pins are contiguous");
            for g in 0..w.groups {
                let slot = self.new_entry(win_entry_key(k, g), Kind::Window);
                slots.push(slot);
            }
            self.shared += w.groups;
            self.private -= w.groups;
            alloc.private -= w.groups;
            alloc.wpinned += 1;
            i += 1;
        }
        self.put_win_slots(alloc.owner, slots);
    }

    /// [`KvPool::register_own`] for the window groups: its full window
    /// blocks past those it pins, through `computed` tokens.
    pub(super) fn register_own_window(
        &mut self,
        w: Win,
        alloc: &mut Alloc,
        prefix: &PrefixIds,
        prompt: Tokens,
        computed: Tokens,
    ) {
        let held_end = u32::try_from(alloc.to.max(computed).blocks_ceil(w.block).get()).unwrap_or(u32::MAX);
        let full = u32::try_from(computed.blocks_floor(w.block).get()).unwrap_or(u32::MAX).min(held_end);
        let start = if alloc.wpinned > 0 { alloc.wfirst + alloc.wpinned } else { w.skipped(alloc.from) };
        if start >= full {
            return;
        }
        let mut slots = self.take_win_slots(alloc);
        if alloc.wpinned == 0 {
            alloc.wfirst = start;
        }
        for i in start..full {
            let base = self.win_base(prefix, prompt, alloc.owner, i);
            for g in 0..w.groups {
                let slot = self.new_entry(win_entry_key(base, g), Kind::Window);
                slots.push(slot);
            }
        }
        let n = full - start;
        self.shared += u64::from(n) * w.groups;
        self.private -= u64::from(n) * w.groups;
        alloc.private -= u64::from(n) * w.groups;
        alloc.wpinned += n;
        self.put_win_slots(alloc.owner, slots);
    }
}
