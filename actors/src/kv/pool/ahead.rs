//! Evictions made ahead of their step: a run of decode steps planned as
//! one event takes its later steps' blocks when it starts, and the
//! evictions it makes are journaled so that a cut can put them back
//! exactly. The journal is empty whenever anything but the run that made
//! it touches the pool.

use super::{Alloc, Kind, KvPool, Shortfall, Span, Take, keys};
use crate::base::units::Tokens;
use crate::kv::lru::Back;

/// An eviction made for a decode step taken ahead of its time
/// ([`KvPool::resize_ahead`]), kept so that it can be undone exactly if the
/// step does not run: the entries leave the LRU order's head one at a time,
/// so putting them back at the head in reverse restores the order.
#[derive(Clone, Copy, Debug)]
pub(super) enum Evicted {
    /// A named entry: its key, what it caches, and where it stood among
    /// the key's copies (`None`: the first, the one the key map serves).
    Named { step: u64, key: u64, kind: Kind, copy: Option<usize> },
    /// A nameless run that became plain free blocks once the entry before
    /// it went.
    Nameless { step: u64, blocks: u64 },
}

impl Evicted {
    fn step(self) -> u64 {
        match self {
            Evicted::Named { step, .. } | Evicted::Nameless { step, .. } => step,
        }
    }
}

/// The evictions made for decode steps taken ahead of their time, in the
/// order they were made (so in step order).
///
/// Invariant: it is empty whenever anything but the run that made its
/// evictions touches the pool (every other entry of the pool asserts it in
/// debug builds): they are the evictions stepping one event at a time
/// would make only while nothing else changes the eviction order. A run's
/// end commits them ([`KvPool::commit_evictions`]); a cut undoes those of
/// the steps it drops ([`KvPool::undo_evictions_after`]) and commits the
/// rest.
#[derive(Clone, Debug, Default)]
pub(super) struct Journal {
    made: Vec<Evicted>,
}

impl Journal {
    /// Whether no eviction made ahead stands.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.made.is_empty()
    }

    /// Records an eviction made for a step taken ahead.
    #[inline]
    pub(super) fn record(&mut self, ev: Evicted) {
        debug_assert!(self.made.last().is_none_or(|last| last.step() <= ev.step()), "evictions in step order");
        self.made.push(ev);
    }

    /// Records the evictions of named entries of `kind`, keys `keys` (each
    /// the first copy of its key), made for step `step`.
    #[inline]
    pub(super) fn record_named(&mut self, step: u64, kind: Kind, keys: &[u64]) {
        self.made.extend(keys.iter().map(|&key| Evicted::Named { step, key, kind, copy: None }));
    }

    /// The last eviction made for a step after `step`, taken out.
    fn pop_after(&mut self, step: u64) -> Option<Evicted> {
        if self.made.last()?.step() <= step {
            return None;
        }
        self.made.pop()
    }

    /// Forgets every eviction: they stand as made.
    fn commit(&mut self) {
        self.made.clear();
    }
}

impl KvPool {
    /// [`KvPool::resize`] of a decode step `n` taken ahead of its time (a
    /// run of decode steps planned as one event): cached blocks it evicts
    /// are recorded, so that [`KvPool::undo_evictions_after`] can put them
    /// back exactly if step `n` does not run, and the peak is left alone.
    /// Nothing else may touch the pool until they are undone or committed
    /// ([`KvPool::commit_evictions`]): the evictions are those stepping one
    /// event at a time would make at step `n` only if nothing changes the
    /// eviction order before then.
    pub(crate) fn resize_ahead(
        &mut self,
        alloc: &mut Alloc,
        from: Tokens,
        to: Tokens,
        n: u64,
    ) -> Result<(), Shortfall> {
        self.resize_inner(alloc, Span::new(from, to), Take::Ahead(n))
    }

    /// Whether evictions made ahead of their steps are still recorded.
    pub(crate) fn evicted_ahead(&self) -> bool {
        !self.evicted_ahead.is_empty()
    }

    /// Puts back the evictions made ahead for steps after `step`, last
    /// first, at the head of the eviction order (the blocks they freed
    /// must be free again: the caller gave back the holdings that took
    /// them); those of `step` and before stay made.
    pub(crate) fn undo_evictions_after(&mut self, step: u64) {
        while let Some(ev) = self.evicted_ahead.pop_after(step) {
            let (back, blocks) = match ev {
                Evicted::Named { key, kind, .. } => (Back::Named { key, kind }, self.entry_blocks(kind)),
                Evicted::Nameless { blocks, .. } => (Back::Nameless { blocks }, blocks),
            };
            let slot = self.lru.put_front(back);
            match ev {
                Evicted::Named { key, copy, .. } => {
                    match copy {
                        Some(at) => self.copies.entry(key).or_default().insert(at, slot),
                        None => {
                            if let Some(first) = self.entries.insert(key, slot, keys(self.lru.slots())) {
                                self.copies.entry(key).or_default().insert(0, first);
                            }
                        }
                    }
                    self.evicted_blocks -= blocks;
                }
                Evicted::Nameless { .. } => self.nameless += blocks,
            }
            self.free -= blocks;
            self.cached_free += blocks;
        }
        self.evicted_ahead.commit();
    }

    /// The evictions made ahead are now those of steps that ran.
    pub(crate) fn commit_evictions(&mut self) {
        self.evicted_ahead.commit();
    }
}
