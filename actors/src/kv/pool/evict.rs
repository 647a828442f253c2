//! The free blocks and the eviction order: taking blocks (plain free
//! ones first, then evicting cached ones from the LRU order's head),
//! freeing them, and pinning and unpinning cached entries.

use super::ahead::Evicted;
use super::{Kind, KvPool, PREFETCH_AHEAD, Shortfall, Take, keys};

impl KvPool {
    #[inline]
    pub(super) fn take(&mut self, n: u64, how: Take) -> Result<(), Shortfall> {
        if n <= self.free {
            self.free -= n;
            return Ok(());
        }
        self.take_evicting(n, how)
    }

    /// A holding of `held` private blocks moving to `need`: takes the
    /// growth ([`KvPool::take`]) or frees the rest.
    #[inline]
    pub(super) fn take_or_free(&mut self, held: u64, need: u64, how: Take) -> Result<(), Shortfall> {
        if need > held {
            self.take(need - held, how)
        } else {
            self.free += held - need;
            Ok(())
        }
    }

    /// [`KvPool::take`] short of plain free blocks: evicts from the head
    /// of the eviction order, if `evict` and there are enough.
    #[inline(never)]
    pub(super) fn take_evicting(&mut self, n: u64, how: Take) -> Result<(), Shortfall> {
        let available = if how.evicts() { self.free + self.cached_free } else { self.free };
        if n > available {
            return Err(Shortfall { needed: n, available });
        }
        // The entries about to go, and then their key map cells, are
        // fetched ahead of their eviction: those of the first evictions
        // together here, then one of each an eviction (`Lru::pop_run`
        // fetches entries, the loop below key map cells).
        let want = usize::try_from(n - self.free).unwrap_or(usize::MAX);
        for d in 0..want.min(2 * PREFETCH_AHEAD) {
            self.lru.prefetch_entry(d);
        }
        for d in 0..want.min(PREFETCH_AHEAD) {
            self.entries.prefetch(self.lru.key_hint(d));
        }
        let (mut run, mut gone) = std::mem::take(&mut self.evict_scratch);
        while self.free < n {
            // The head is named (`absorb_front`): it and the entries of its
            // kind after it, as many as the shortfall needs, leave the
            // order together, then the key map one by one, in order.
            let kind =
                self.lru.head().map(|i| self.lru.get(i).kind()).expect("cached_free > 0 means an unpinned entry");
            let each = self.entry_blocks(kind);
            let most = usize::try_from((n - self.free).div_ceil(each)).unwrap_or(usize::MAX);
            run.clear();
            gone.clear();
            let taken = self.lru.pop_run(kind, most, &mut run, &mut gone) as u64;
            if self.copies.is_empty() {
                // Every key has one copy: the run leaves the key map at once.
                let removed = self.entries.remove_run(&gone, keys(self.lru.slots()));
                debug_assert_eq!(removed, gone.len(), "an evicted entry is mapped");
                if let Some(step) = how.ahead() {
                    self.evicted_ahead.record_named(step, kind, &gone);
                }
            } else {
                for (j, (&i, &key)) in run.iter().zip(&gone).enumerate() {
                    if let Some(&ahead) = gone.get(j + PREFETCH_AHEAD) {
                        self.entries.prefetch(ahead);
                    }
                    let copy = self.forget_copy(key, i);
                    if let Some(step) = how.ahead() {
                        self.evicted_ahead.record(Evicted::Named { step, key, kind, copy });
                    }
                }
            }
            let blocks = taken * each;
            self.cached_free -= blocks;
            self.free += blocks;
            self.evicted_blocks += blocks;
            self.absorb_front(how.ahead());
        }
        self.evict_scratch = (run, gone);
        self.free -= n;
        Ok(())
    }

    /// An evicted copy (slot `i`) of `key` leaves the key map: the first
    /// copy's place goes to the next copy, if any (vLLM's
    /// `BlockHashToBlockMap` serves the first block it holds for a hash).
    /// Returns where it stood among the later copies (`None`: it was the
    /// first).
    #[inline]
    pub(super) fn forget_copy(&mut self, key: u64, i: u32) -> Option<usize> {
        if self.copies.is_empty() {
            self.entries.remove(key, keys(self.lru.slots()));
            return None;
        }
        let Some(later) = self.copies.get_mut(&key) else {
            self.entries.remove(key, keys(self.lru.slots()));
            return None;
        };
        let at = if self.entries.get(key, keys(self.lru.slots())) == Some(i) {
            let next = later.remove(0);
            self.entries.insert(key, next, keys(self.lru.slots()));
            None
        } else {
            let at = later.iter().position(|&c| c == i).expect("an evicted copy is listed");
            later.remove(at);
            Some(at)
        };
        if later.is_empty() {
            self.copies.remove(&key);
        }
        at
    }

    /// Keeps the LRU order's head named: nameless blocks with no named entry
    /// before them are next to be reused and nothing can hit them, so they
    /// are plain free blocks (which lets the decoding set take them ahead).
    #[inline(always)]
    pub(super) fn absorb_front(&mut self, ahead: Option<u64>) {
        if self.lru.head_nameless() {
            self.absorb_front_runs(ahead);
        }
    }

    /// [`KvPool::absorb_front`]'s work, kept out of line.
    #[inline(never)]
    pub(super) fn absorb_front_runs(&mut self, ahead: Option<u64>) {
        while self.lru.head_nameless() {
            let i = self.lru.pop_front().expect("a head");
            let blocks = self.lru.get(i).nameless();
            if let Some(step) = ahead {
                self.evicted_ahead.record(Evicted::Nameless { step, blocks });
            }
            self.cached_free -= blocks;
            self.nameless -= blocks;
            self.free += blocks;
        }
    }

    /// Caches `blocks` nameless blocks just freed: at the LRU order's tail,
    /// or, with no named entry to wait behind, as plain free blocks.
    pub(super) fn free_nameless(&mut self, blocks: u64) {
        if blocks == 0 {
            return;
        }
        if self.lru.len() == 0 {
            self.free += blocks;
        } else {
            self.lru.push_nameless(blocks);
            self.cached_free += blocks;
            self.nameless += blocks;
        }
    }

    pub(super) fn ref_entry(&mut self, k: u64) {
        let i = self.entries.get(k, keys(self.lru.slots())).expect("entry exists");
        self.ref_slot(i);
    }

    /// [`KvPool::ref_entry`] of the entry in slot `i`.
    #[inline]
    pub(super) fn ref_slot(&mut self, i: u32) {
        if let Some(was_head) = self.lru.pin(i) {
            if was_head {
                self.absorb_front(None);
            }
            let kind = self.lru.get(i).kind();
            let blocks = self.entry_blocks(kind);
            self.cached_free -= blocks;
            self.shared += blocks;
            self.used_add(kind, 1);
        }
    }

    /// [`KvPool::ref_slot`] of each entry of `kind` in `slots`, in order,
    /// the counts changed once for the run.
    #[inline]
    pub(super) fn ref_slots(&mut self, slots: &[u32], kind: Kind) {
        debug_assert!(slots.iter().all(|&i| self.lru.get(i).kind() == kind));
        // (Absorbing once at the end of the run leaves the order as absorbing
        // after each pin of the head would: the nameless runs that come to
        // head it are the same, in the same order.)
        let (taken, head) = self.lru.pin_run(slots);
        if head {
            self.absorb_front(None);
        }
        if taken > 0 {
            let blocks = taken * self.entry_blocks(kind);
            self.cached_free -= blocks;
            self.shared += blocks;
            self.used_add(kind, taken as i64);
        }
    }

    /// [`KvPool::unref_slot`] of each entry of `kind` in `slots`, last
    /// first (those left unpinned join the LRU order's tail in that order),
    /// the counts changed once for the run.
    #[inline]
    pub(super) fn unref_slots_rev(&mut self, slots: &[u32], kind: Kind) {
        debug_assert!(slots.iter().all(|&i| self.lru.get(i).kind() == kind));
        let freed = self.lru.unpin_rev(slots);
        if freed > 0 {
            let blocks = freed * self.entry_blocks(kind);
            self.shared -= blocks;
            self.cached_free += blocks;
            self.used_add(kind, -(freed as i64));
        }
    }

    /// Drops one pin of entry `k`; unpinned, it joins the LRU order's tail.
    pub(super) fn unref(&mut self, k: u64) {
        let i = self.entries.get(k, keys(self.lru.slots())).expect("pinned entry exists");
        self.unref_slot(i);
    }

    /// [`KvPool::unref`] of the entry in slot `i`.
    #[inline]
    pub(super) fn unref_slot(&mut self, i: u32) {
        if self.lru.unpin(i) {
            let kind = self.lru.get(i).kind();
            let blocks = self.entry_blocks(kind);
            self.shared -= blocks;
            self.cached_free += blocks;
            self.used_add(kind, -1);
        }
    }

    /// Drops a request's pin on its first `n` cached blocks. Blocks no
    /// request pins any more join the LRU order tail first, as vLLM frees a
    /// request's blocks in reverse (`single_type_kv_cache_manager.py`
    /// `free` → `block_pool.free_blocks(reversed(...))`): the end of a
    /// prompt is evicted before its start, so an eviction costs later
    /// requests the fewest leading hits.
    pub(super) fn unpin(&mut self, n: u32, owner: u64) {
        if n == 0 {
            return;
        }
        let mut slots = self.held_slots.remove(&owner).expect("a holding with shared blocks has its slots");
        debug_assert_eq!(slots.len(), n as usize);
        self.unref_slots_rev(&slots, Kind::Full);
        slots.clear();
        self.spare_slot_lists.push(slots);
    }

    /// A new pinned entry of `kind` under key `k`: the key's first copy, or
    /// a later one if the content is cached already.
    #[inline(always)]
    pub(super) fn new_entry(&mut self, k: u64, kind: Kind) -> u32 {
        let slot = self.lru.alloc(k, kind);
        if self.entries.insert_if_vacant(k, slot, keys(self.lru.slots())).is_some() {
            self.copies.entry(k).or_default().push(slot);
        }
        slot
    }
}
