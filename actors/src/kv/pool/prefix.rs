//! The prefix cache's full-attention side: cache keys, the longest hit,
//! pinning a hit and allocating the rest all or nothing, and registering
//! blocks as they fill.

use super::{Alloc, ConnectorHit, Kind, KvPool, Shortfall, Take, keys, state, window};
use crate::base::keys::plain_key;
use crate::base::units::{Blocks, Tokens};
use crate::models::model::CacheGroupKind;
use crate::requests::workload::{PrefixIds, mix};
use crate::vllm::prefix;

/// Salts the keys of a request's own content (see `KvPool::key`).
pub(super) const OWN_CONTENT: u64 = 0x6f77_6e5f_636f_6e74;

/// The slots of the leading full-attention entries the last
/// [`KvPool::fa_hit`] found, for the request and the key map it found them
/// in: pinning that hit then needs no second lookup of its keys.
#[derive(Clone, Debug, Default)]
pub(super) struct HitMemo {
    /// Owner, prompt, and the prefix ids' address and length looked up.
    pub(super) of: (u64, Tokens, usize, usize),
    /// [`KeyMap::changes`] when found; `u64::MAX`: none.
    pub(super) changes: u64,
    pub(super) slots: Vec<u32>,
}

impl KvPool {
    /// The cache key of full-attention block `block` of a request: its
    /// prefix ids' where they cover it (content other requests may share),
    /// else one of the request's own (content no other request has: the
    /// rest of its prompt, and its generated tokens).
    pub(super) fn key(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, block: u32) -> u64 {
        let b = self.cache_block();
        Self::key_at(prefix, prompt, owner, Tokens::new((u64::from(block) + 1) * b.get()), b)
    }

    /// The cache key of a request's content through `end` tokens (see
    /// [`KvPool::key`]).
    pub(super) fn key_at(prefix: &PrefixIds, prompt: Tokens, owner: u64, end: Tokens, b: Tokens) -> u64 {
        prefix.key_through(end, prompt, b).unwrap_or_else(|| plain_key(mix(owner ^ OWN_CONTENT, end.get())))
    }

    /// Leading full-attention blocks of the prompt present in the cache
    /// that a sequence computing towards `goal` tokens may use: only blocks
    /// that end before its last token, since the cache never serves the
    /// last token of what is to be computed (vLLM's
    /// `get_computed_blocks` looks up at most `num_tokens − 1` tokens, so
    /// that the last one is computed for its logits). This is the one place
    /// that rule lives.
    ///
    /// B = 16, a 64-token prompt fully cached: 63 tokens may hit, so 3
    /// blocks (48 tokens), never 4.
    ///
    /// A request's own blocks (past its prefix ids) are in the cache only
    /// after it was preempted ([`KvPool::register_own`]), so only its
    /// recompute hits them.
    pub(crate) fn cached_prefix(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, goal: Tokens) -> u32 {
        debug_assert!(self.evicted_ahead.is_empty(), "the pool touched while evictions made ahead stand");
        if self.state_groups == 0 && self.win().is_none() {
            return self.fa_hit(prefix, prompt, owner, goal);
        }
        self.lookup(prefix, prompt, owner, goal).0
    }

    /// [`KvPool::cached_prefix`], and where a longer full-attention hit
    /// ends than the one every group holds (vLLM's
    /// `shared_prefix_boundary`, `kv_cache_manager.py:323`; zero if none).
    ///
    /// In align mode a hit must end where a state was cached as well
    /// (`HybridKVCacheCoordinator.find_longest_cache_hit`,
    /// `kv_cache_coordinator.py:806`; `MambaManager.find_longest_cache_hit`
    /// searches right to left for a cached state): the longest full-attention
    /// hit is cut back to the last block whose state entry is cached (a
    /// request's own states too: vLLM caches a state at every block
    /// boundary it passes, `register_state`).
    ///
    /// With the window cache, a hit also needs the window blocks before its
    /// end cached ([`KvPool::window_hit`]); with both, vLLM's coordinator
    /// asks the window group, then the state group, for a hit no longer
    /// than the last one's, until neither cuts it
    /// (`HybridKVCacheCoordinator.find_longest_cache_hit`'s fixed point).
    /// B = 16, W = 33 (a hit needs 2 window blocks before its end), a
    /// full-attention hit of 6 blocks, window blocks 0 to 3 cached, states
    /// after 2 and 5 blocks: the window cuts the hit to 4 blocks, the state
    /// to 2, and both agree with 2 (the junction: 96 tokens).
    #[inline]
    pub(crate) fn lookup(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, goal: Tokens) -> (u32, Tokens) {
        debug_assert!(self.evicted_ahead.is_empty(), "the pool touched while evictions made ahead stand");
        if let Some(w) = self.win() {
            if self.state_groups == 0 {
                return (self.window_hit(w, prefix, prompt, owner, goal), Tokens::ZERO);
            }
            let fa = self.fa_hit(prefix, prompt, owner, goal);
            let mut n = fa;
            loop {
                let wn = self.window_hit_within(w, prefix, prompt, owner, self.win_blocks(n));
                let m = self.deepest_state(prefix, prompt, owner, wn);
                if m >= n {
                    break;
                }
                n = m;
            }
            return (n, if n < fa { self.hit_tokens(fa) } else { Tokens::ZERO });
        }
        // With no full-attention group, vLLM's Mamba manager hits alone:
        // the last cached state before the last token.
        let n = if self.fa_groups == 0 && self.state_groups > 0 {
            let b = self.cache_block();
            u32::try_from(prefix::hit_limit(goal).blocks_floor(b).get()).unwrap_or(u32::MAX)
        } else {
            self.fa_hit(prefix, prompt, owner, goal)
        };
        if self.state_groups == 0 || n == 0 {
            return (n, Tokens::ZERO);
        }
        let m = self.deepest_state(prefix, prompt, owner, n);
        let junction = if m < n && self.fa_groups > 0 { self.hit_tokens(n) } else { Tokens::ZERO };
        (m, junction)
    }

    /// What a decode rank's remote load of `t` transferred tokens finds
    /// in the cache (vLLM's `get_computed_blocks_for_connector`,
    /// `kv_cache_manager.py:330-378`, which the NIXL connector asks for).
    /// With a Mamba hybrid, the full-attention hit, whether or not a state
    /// was cached at its end (the connector moves the state anyway), unless
    /// some state is cached past it (its full-attention blocks were
    /// evicted): then the hit every group agrees on
    /// ([`KvPool::cached_prefix`]). But a full-attention hit that covers
    /// all `t` tokens with no state cached at its end leaves the connector
    /// nothing to load: vLLM falls back to the hit every group agrees on
    /// and computes the rest of the prompt itself, the prefill's KV unread
    /// (`scheduler.py:1197-1208`, `hit_diverged`). Other models:
    /// [`KvPool::cached_prefix`].
    ///
    /// B = 8, a 104-token prompt whose first 72 tokens another request's
    /// load cached, its state cached at 120 only: 9 blocks (72 tokens), where
    /// an admission would hit none.
    ///
    /// With a window cache beside the Mamba group the same holds group by
    /// group: the window group's own hit (at most the full-attention one,
    /// [`KvPool::load_window_hit`]) is one more that may lag or run deeper.
    pub(crate) fn connector_hit(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, t: Tokens) -> ConnectorHit {
        if !self.caching || self.state_groups == 0 || self.fa_groups == 0 {
            return ConnectorHit::Load(self.cached_prefix(prefix, prompt, owner, prompt));
        }
        let n = self.fa_hit(prefix, prompt, owner, prompt);
        if n == 0 {
            return ConnectorHit::Load(self.cached_prefix(prefix, prompt, owner, prompt));
        }
        let most = u32::try_from(prefix::hit_limit(prompt).blocks_floor(self.cache_block()).get()).unwrap_or(u32::MAX);
        // Each group's own hit, looked up alone (`find_longest_cache_hit_per_group`).
        let window = self.win().map(|w| self.window_hit_within(w, prefix, prompt, owner, self.win_blocks(most)));
        let deeper =
            window.is_some_and(|h| h > n) || (n + 1..=most).any(|m| self.hit_entry(prefix, prompt, owner, m) != 0);
        if deeper {
            return ConnectorHit::Load(self.cached_prefix(prefix, prompt, owner, prompt));
        }
        let lags = window.is_some_and(|h| h < n) || self.hit_entry(prefix, prompt, owner, n) == 0;
        if self.hit_tokens(n) >= t && lags {
            return ConnectorHit::ComputeLocally;
        }
        ConnectorHit::Load(n)
    }

    /// The window group's part of a decode rank's load hit of `hit` blocks
    /// (in cache blocks): beside a Mamba group the load's hit is the
    /// full-attention one ([`KvPool::connector_hit`]), and the window group
    /// holds its own hit within it, which may be shorter (the cached window
    /// blocks it needs before its end, [`KvPool::window_hit`]). Elsewhere,
    /// the hit.
    pub(crate) fn load_window_hit(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, hit: u32) -> u32 {
        match self.win() {
            Some(w) if self.state_groups > 0 && hit > 0 => {
                self.window_hit_within(w, prefix, prompt, owner, self.win_blocks(hit))
            }
            _ => hit,
        }
    }

    /// Whether a hit of `n` blocks ends where a state is cached (align mode;
    /// never otherwise).
    pub(crate) fn hit_state_cached(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, n: u32) -> bool {
        self.align().is_some() && self.hit_entry(prefix, prompt, owner, n) != 0
    }

    /// The longest leading run of cached full-attention blocks a sequence
    /// may use (see [`KvPool::cached_prefix`]).
    pub(super) fn fa_hit(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, goal: Tokens) -> u32 {
        if !self.caching {
            return 0;
        }
        let limit = prefix::hit_limit(goal);
        let max = limit.blocks_floor(self.fa_block.expect("caching needs a full-attention group")).get();
        let first =
            if max > 0 { self.entries.get(self.key(prefix, prompt, owner, 0), keys(self.lru.slots())) } else { None };
        let Some(first) = first else {
            // No hit: nothing to pin, so the memo may stand as it is.
            return 0;
        };
        let mut n = 1u32;
        let mut memo = self.hit_memo.borrow_mut();
        memo.slots.clear();
        memo.slots.push(first);
        // Blocks the prefix ids name in groups: a group's run at a time,
        // through one lookup of its record (the same slots as a key a
        // block; the loop below goes on from where they end).
        if let Some(runs) = prefix.group_runs_of(self.cache_block(), 1, prompt, max - 1) {
            for (k, len) in runs {
                let got = self.entries.get_group_run(k, len as usize, &mut memo.slots);
                n += got as u32;
                if got < len as usize {
                    break;
                }
            }
        }
        while u64::from(n) < max {
            let Some(slot) = self.entries.get(self.key(prefix, prompt, owner, n), keys(self.lru.slots())) else {
                break;
            };
            memo.slots.push(slot);
            n += 1;
        }
        if cfg!(test) {
            // (The unit tests check the runs' slots against a lookup a
            // block at a time.)
            let one_by_one: Vec<u32> = (0..n)
                .map(|i| self.entries.get(self.key(prefix, prompt, owner, i), keys(self.lru.slots())))
                .collect::<Option<_>>()
                .expect("the hit's blocks are cached");
            assert_eq!(memo.slots, one_by_one, "a hit's group runs are its blocks' slots");
            let next = u64::from(n) < max;
            assert!(!next || !self.entries.contains_key(self.key(prefix, prompt, owner, n), keys(self.lru.slots())));
        }
        memo.of = (owner, prompt, prefix.ids.as_ptr() as usize, prefix.ids.len());
        memo.changes = self.entries.changes();
        // A hit is a multiple of every group's block size (vLLM's scheduler
        // block size, the lcm): FA B = 16 beside a window B = 32 hits in
        // pairs of blocks.
        n - n % self.hit_align
    }

    /// The tokens `blocks` cached full-attention blocks cover.
    pub(crate) fn hit_tokens(&self, blocks: u32) -> Tokens {
        self.fa_block
            .or(self.win().map(|w| w.block))
            .or(self.align())
            .map_or(Tokens::ZERO, |b| Blocks::new(u64::from(blocks)).tokens(b))
    }

    /// Whether pinning the first `n` cached blocks of the prompt and then
    /// taking `need` private blocks would succeed, without doing either.
    ///
    /// Pinning and allocating one after the other may evict cached blocks
    /// for the first part before the second fails; vLLM checks the whole
    /// allocation against the free and evictable blocks first (the hit's
    /// own evictable blocks excepted), so a failed attempt changes nothing.
    /// [`KvPool::pin_and_allocate_leaving`] checks with this before it pins.
    ///
    /// `lag` (0: none) is a state entry counted as vLLM's count counts a
    /// hit block it does not pin: taken when it is evictable, and unusable
    /// when cached in this schedule call ([`KvPool::lagging_state`]).
    #[expect(clippy::too_many_arguments, reason = "the hit, the step, what to leave, and the lagging state")]
    pub(super) fn can_pin_and_take(
        &self,
        prefix: &PrefixIds,
        prompt: Tokens,
        owner: u64,
        (n, wn, from): (u32, u32, Tokens),
        need: u64,
        keep: u64,
        lag: u64,
    ) -> Result<(), Shortfall> {
        let sk = self.hit_entry(prefix, prompt, owner, n);
        let sb = if sk != 0 { self.state_groups } else { 0 };
        let lb = if lag != 0 { self.state_groups } else { 0 };
        let need = self.pin_and_take_need(n, need).saturating_sub(sb);
        let in_pool = self.free();
        let this_step = |k: u64| k != 0 && self.states_this_step.contains(&k);
        if !this_step(sk) && !this_step(lag) {
            // It fits even if every block of the hit were evictable (they
            // are among the cached free ones): no need to look at them.
            let wins = if self.win().is_some() { self.win_blocks(wn) - self.win_lo(wn, from) } else { 0 };
            let most = u64::from(n) * self.fa_groups + u64::from(wins) * self.wg() + sb + lb;
            if need <= in_pool.saturating_sub(keep + most.min(self.cached_free)) {
                return Ok(());
            }
        }
        // The hit's entries no request pins leave the eviction order when
        // pinned, so they count against the free and evictable blocks.
        let evictable =
            |k: u64| self.entries.get(k, keys(self.lru.slots())).is_some_and(|i| self.lru.get(i).refs() == 0);
        let mut touched = 0u64;
        if self.fa_groups > 0 && self.caching {
            for i in 0..n {
                if evictable(self.key(prefix, prompt, owner, i)) {
                    touched += self.fa_groups;
                }
            }
        }
        if self.win().is_some() {
            for i in self.win_lo(wn, from)..self.win_blocks(wn) {
                let base = self.win_base(prefix, prompt, owner, i);
                touched += (0..self.wg()).filter(|&g| evictable(window::win_entry_key(base, g))).count() as u64;
            }
        }
        if sk != 0 && evictable(sk) {
            touched += sb;
        }
        if lag != 0 && evictable(lag) {
            touched += lb;
        }
        let available = in_pool.saturating_sub(keep + touched);
        if this_step(sk) || this_step(lag) {
            // vLLM's Mamba manager cannot use a state another request
            // caches in the same step (`get_num_blocks_to_allocate`
            // returns more blocks than the pool has): it waits.
            return Err(Shortfall { needed: self.num_blocks + 1, available });
        }
        if need > available {
            return Err(Shortfall { needed: need, available });
        }
        Ok(())
    }

    /// The most private blocks pinning `n` cached blocks and then growing to
    /// `need` holds at once: a window group may hold one block more at the
    /// hit than after it.
    pub(crate) fn pin_and_take_need(&self, n: u32, need: u64) -> u64 {
        need.max(if n == 0 { 0 } else { self.hit_private(n) })
    }

    /// Private blocks a holding has right after pinning a hit of `n` blocks
    /// (the window and state blocks at the hit not pinned).
    #[inline]
    pub(super) fn hit_private(&self, n: u32) -> u64 {
        let t = self.hit_tokens(n);
        self.private_need(t, t, false, self.fa_pins(n)) - u64::from(self.win_pins(n)) * self.wg()
    }

    /// Full-attention entries a hit of `n` blocks pins (none without a
    /// full-attention group).
    #[inline]
    pub(super) fn fa_pins(&self, n: u32) -> u32 {
        if self.fa_groups > 0 { n } else { 0 }
    }

    /// Pins the first `n` cached blocks of the prompt for an empty `alloc`
    /// (`n` from [`KvPool::cached_prefix`]) and allocates the other groups' blocks
    /// at that point; its state becomes "`n` blocks computed". Called only
    /// after [`KvPool::can_pin_and_take`] said it fits; on a shortfall all
    /// is given back, but the unpinned entries rejoin the LRU tail (a
    /// nameless run they headed may have become plain).
    pub(super) fn pin(
        &mut self,
        alloc: &mut Alloc,
        prefix: &PrefixIds,
        prompt: Tokens,
        n: u32,
    ) -> Result<(), Shortfall> {
        debug_assert!(alloc.is_empty());
        if n == 0 {
            return Ok(());
        }
        // Pin first, so the cached blocks cannot be evicted to make room for
        // the window and state blocks.
        let fa = self.fa_pins(n);
        // With the window cache, the window blocks before the hit's end.
        let wpins = self.win_pins(n);
        let nw = self.win_blocks(n);
        self.pin_hit_entries(alloc, prefix, prompt, fa, nw - wpins..nw);
        let sk = self.hit_entry(prefix, prompt, alloc.owner, n);
        if sk != 0 {
            self.ref_entry(sk);
        }
        let t = self.hit_tokens(n);
        let need = self.hit_private(n) - if sk != 0 { self.state_groups } else { 0 };
        if let Err(e) = self.take(need, Take::Evicting) {
            self.unpin(fa, alloc.owner);
            let mut pinned = Alloc { wpinned: wpins, ..*alloc };
            self.unpin_window(&mut pinned);
            if sk != 0 {
                self.unref(sk);
            }
            return Err(e);
        }
        let align = self.align().is_some();
        for (i, g) in self.groups.iter().enumerate() {
            if g.kind() != CacheGroupKind::FullAttention {
                let pinned = match g.kind() {
                    CacheGroupKind::State => u64::from(sk != 0 && g.prefix_cacheable()),
                    CacheGroupKind::SlidingWindow => u64::from(wpins),
                    _ => 0,
                };
                self.group_used[i] += Self::group_blocks(g, align, t, t, t, false) - pinned;
            }
        }
        self.private += need;
        *alloc = Alloc {
            from: t,
            mid: t,
            to: t,
            checkpoints: false,
            shared: fa,
            private: need,
            stable_to: Tokens::ZERO,
            owner: alloc.owner,
            pinned: 0,
            wfirst: nw - wpins,
            wpinned: wpins,
        };
        if sk != 0 {
            let slot = self.entries.get(sk, keys(self.lru.slots())).expect("a hit's state entry exists");
            let pins = [(0, 0), (0, 0), (state::state_handle(slot), self.state_index(t))];
            self.set_pins(alloc, pins);
        }
        self.note_peak();
        Ok(())
    }

    /// Pins a hit's entries for the empty `alloc`: the first `fa`
    /// full-attention ones and the window ones of blocks `window`.
    pub(super) fn pin_hit_entries(
        &mut self,
        alloc: &Alloc,
        prefix: &PrefixIds,
        prompt: Tokens,
        fa: u32,
        window: std::ops::Range<u32>,
    ) {
        if fa > 0 {
            let mut slots = self.take_slots(alloc);
            let memo = self.hit_memo.take();
            let of = (alloc.owner, prompt, prefix.ids.as_ptr() as usize, prefix.ids.len());
            if memo.changes == self.entries.changes() && memo.of == of && memo.slots.len() >= fa as usize {
                // The key map is as the lookup left it: the slots it found.
                debug_assert!((0..fa).all(|i| {
                    self.entries.get(self.key(prefix, prompt, alloc.owner, i), keys(self.lru.slots()))
                        == Some(memo.slots[i as usize])
                }));
                self.ref_slots(&memo.slots[..fa as usize], Kind::Full);
                slots.extend_from_slice(&memo.slots[..fa as usize]);
            } else {
                for i in 0..fa {
                    let k = self.key(prefix, prompt, alloc.owner, i);
                    let slot = self.entries.get(k, keys(self.lru.slots())).expect("a hit's entries exist");
                    self.ref_slot(slot);
                    slots.push(slot);
                }
            }
            // Its room kept for the next lookup.
            *self.hit_memo.get_mut() = HitMemo { changes: u64::MAX, ..memo };
            self.put_slots(alloc.owner, slots);
        }
        if !window.is_empty() {
            let mut slots = self.take_win_slots(alloc);
            for i in window {
                let base = self.win_base(prefix, prompt, alloc.owner, i);
                for g in 0..self.wg() {
                    let k = window::win_entry_key(base, g);
                    let slot = self.entries.get(k, keys(self.lru.slots())).expect("a hit's window entries exist");
                    self.ref_win_slot(slot, g);
                    slots.push(slot);
                }
            }
            self.put_win_slots(alloc.owner, slots);
        }
    }

    /// [`KvPool::pin_and_allocate_leaving`] leaving nothing (the unit
    /// tests' form).
    #[cfg(test)]
    pub(crate) fn pin_and_allocate(
        &mut self,
        alloc: &mut Alloc,
        prefix: &PrefixIds,
        prompt: Tokens,
        hit: u32,
        span: (Tokens, Tokens),
        checkpoints: bool,
    ) -> Result<(), Shortfall> {
        self.pin_and_allocate_leaving(alloc, prefix, prompt, hit, span, checkpoints, 0)
    }

    /// Pins the first `hit` cached blocks of the prompt for an empty
    /// `alloc` (`hit` from [`KvPool::cached_prefix`]), then allocates it for
    /// the step `from..to` (with or without checkpoint blocks): all or
    /// nothing, as vLLM's `allocate_slots` checks the whole allocation
    /// against the free and evictable blocks (the hit's own evictable blocks
    /// excepted) before it touches any, and only if `keep` free or evictable
    /// blocks are left afterwards (vLLM's `reserved_blocks` and watermark).
    /// On a shortfall nothing changes, no cached block is evicted, and the
    /// shortfall counts every block the allocation would hold (the hit's
    /// included). Used by admission and by a decode rank's reservation
    /// alike.
    #[expect(clippy::too_many_arguments, reason = "pin_and_allocate's, and what to leave")]
    pub(crate) fn pin_and_allocate_leaving(
        &mut self,
        alloc: &mut Alloc,
        prefix: &PrefixIds,
        prompt: Tokens,
        hit: u32,
        (from, to): (Tokens, Tokens),
        checkpoints: bool,
        keep: u64,
    ) -> Result<(), Shortfall> {
        debug_assert!(alloc.is_empty());
        debug_assert!(self.evicted_ahead.is_empty(), "the pool touched while evictions made ahead stand");
        let load = self.win().is_some() && from > self.hit_tokens(hit);
        let wn = if load { self.load_window_hit(prefix, prompt, alloc.owner, hit) } else { hit };
        let need = self.blocks_after_hits(hit, wn, from, to, checkpoints);
        if let Err(short) = self.can_pin_and_take(prefix, prompt, alloc.owner, (hit, wn, from), need, keep, 0) {
            let needed = self.all_blocks(from, to, checkpoints);
            return Err(Shortfall { needed, available: short.available });
        }
        if load {
            self.pin_into(alloc, prefix, prompt, hit, (from, to));
            return Ok(());
        }
        self.pin(alloc, prefix, prompt, hit).expect("checked: pinning fits");
        // The check covered the larger of the pinned state and the step's, so
        // the step fits too.
        self.resize(alloc, from, to, checkpoints).expect("checked: the step fits after pinning");
        Ok(())
    }

    /// Once a step that brings the request to `computed` tokens is
    /// scheduled (vLLM caches blocks at allocation): registers
    /// its newly full, named full-attention blocks in the cache (content
    /// another request already cached becomes a later copy,
    /// `register_block`).
    pub(crate) fn register(&mut self, alloc: &mut Alloc, prefix: &PrefixIds, prompt: Tokens, computed: Tokens) {
        debug_assert!(self.evicted_ahead.is_empty(), "the pool touched while evictions made ahead stand");
        // States of its own content too (vLLM caches every state block it
        // fills, align mode).
        if self.state_groups > 0 && (self.caching || self.fa_groups == 0) {
            self.register_state(alloc, prefix, prompt, computed);
        }
        if prefix.ids.is_empty() {
            return;
        }
        if let Some(w) = self.win() {
            self.register_window(w, alloc, prefix, prompt, computed);
        }
        if !self.caching {
            return;
        }
        let full =
            computed.min(alloc.to).blocks_floor(self.fa_block.expect("caching needs a full-attention group")).get();
        let b = self.fa_block.expect("caching needs a full-attention group");
        if u64::from(alloc.shared) < full {
            let mut slots = self.take_slots(alloc);
            let (first, had) = (u64::from(alloc.shared), slots.len());
            // Only content the prefix ids name, which others may share: new
            // entries for its blocks (`new_entry` a key, at once).
            let mut groups = std::mem::take(&mut self.group_scratch);
            if prefix.push_group_runs(b, first, prompt, full - first, &mut groups) {
                // A group's run at a time, its keys counted up from its
                // first; the cells of the runs two ahead and the records of
                // the next are asked for meanwhile (as
                // `KeyMap::insert_run_if_vacant` asks a run of keys ahead).
                for &(k, _) in groups.iter().take(2) {
                    self.entries.prefetch(k);
                }
                for (r, &(k, n)) in groups.iter().enumerate() {
                    if let Some(&(ahead, _)) = groups.get(r + 2) {
                        self.entries.prefetch(ahead);
                    }
                    if let Some(&(next, _)) = groups.get(r + 1) {
                        self.entries.prefetch_record(next);
                    }
                    let at = slots.len();
                    self.lru.alloc_run(n as usize, |j| k + j as u64, Kind::Full, &mut slots);
                    let (copies, new) = (&mut self.copies, &slots[at..]);
                    self.entries.insert_group_if_vacant(k, new, |j, _| {
                        copies.entry(k + j as u64).or_default().push(new[j]);
                    });
                }
                groups.clear();
            } else {
                let mut run = std::mem::take(&mut self.key_scratch);
                prefix.push_block_keys(b, first, prompt, full - first, &mut run);
                self.lru.alloc_run(run.len(), |j| run[j], Kind::Full, &mut slots);
                let (copies, new) = (&mut self.copies, &slots[had..]);
                self.entries.insert_run_if_vacant(&run, new, keys(self.lru.slots()), |j, _| {
                    copies.entry(run[j]).or_default().push(new[j]);
                });
                run.clear();
                self.key_scratch = run;
            }
            self.group_scratch = groups;
            if cfg!(test) {
                // (The unit tests check the runs against the keys a block
                // at a time: each new entry under its block's key, mapped.)
                let mut want = Vec::new();
                prefix.push_block_keys(b, first, prompt, full - first, &mut want);
                let got: Vec<u64> = slots[had..].iter().map(|&i| self.lru.get(i).key()).collect();
                assert_eq!(got, want, "a group's run registers its blocks' keys");
                assert!(want.iter().all(|&k| self.entries.contains_key(k, keys(self.lru.slots()))));
            }
            let added = (slots.len() - had) as u64;
            self.shared += added * self.fa_groups;
            self.private -= added * self.fa_groups;
            alloc.private -= added * self.fa_groups;
            alloc.shared += added as u32;
            self.put_slots(alloc.owner, slots);
        }
    }

    /// Before a preempted request's blocks are freed: registers the rest of
    /// its full blocks, through `computed` tokens (its own prompt blocks and
    /// its generated ones), so that its recompute hits them as vLLM's does
    /// (vLLM hashes and caches every full block, generated tokens
    /// included). Other requests never hit them, so pdsim registers them
    /// only here.
    pub(crate) fn register_own(&mut self, alloc: &mut Alloc, prefix: &PrefixIds, prompt: Tokens, computed: Tokens) {
        if let Some(w) = self.win() {
            self.register_own_window(w, alloc, prefix, prompt, computed);
        }
        if !self.caching {
            return;
        }
        // `computed`, not the holding's `to`: a decoding sequence's holding
        // keeps its state while its blocks stay the same (`stable_to`), and
        // holds every full block through `computed`.
        let full = computed.blocks_floor(self.fa_block.expect("caching needs a full-attention group")).get();
        debug_assert!(full <= alloc.to.max(computed).blocks_ceil(self.fa_block.expect("checked")).get());
        if u64::from(alloc.shared) < full {
            let mut slots = self.take_slots(alloc);
            while u64::from(alloc.shared) < full {
                let k = self.key(prefix, prompt, alloc.owner, alloc.shared);
                self.register_block(alloc, k, &mut slots);
            }
            self.put_slots(alloc.owner, slots);
        }
    }

    /// The slot list of `alloc`'s pinned entries, taken out of the map while
    /// blocks are registered (a new one if it pins none).
    pub(super) fn take_slots(&mut self, alloc: &Alloc) -> Vec<u32> {
        if alloc.shared == 0 {
            self.spare_slot_lists.pop().unwrap_or_default()
        } else {
            self.held_slots.remove(&alloc.owner).expect("a holding with shared blocks has its slots")
        }
    }

    /// Puts back a slot list [`KvPool::take_slots`] took.
    pub(super) fn put_slots(&mut self, owner: u64, slots: Vec<u32>) {
        if slots.is_empty() {
            self.spare_slot_lists.push(slots);
        } else {
            self.held_slots.insert(owner, slots);
        }
    }

    /// Registers `alloc`'s first private full-attention block (the one after
    /// its shared ones) under key `k`, its slot appended to `slots` (the
    /// holding's list, out of the map meanwhile).
    ///
    /// Content another request cached meanwhile (a landed handoff's, on a
    /// decode rank) is cached again as a later copy, which this holding
    /// pins: vLLM keeps both blocks (`BlockHashToBlockMap` holds several
    /// blocks per hash and serves the first), so each is freed into the
    /// eviction order by its own holders, and the content stays cached
    /// until its last copy is evicted.
    pub(super) fn register_block(&mut self, alloc: &mut Alloc, k: u64, slots: &mut Vec<u32>) {
        let slot = self.new_entry(k, Kind::Full);
        slots.push(slot);
        self.shared += self.fa_groups;
        self.private -= self.fa_groups;
        alloc.private -= self.fa_groups;
        alloc.shared += 1;
    }
}
