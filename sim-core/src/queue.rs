//! The pending-event queue: keys ordered by (time, insertion sequence).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One queued event: when, its global insertion sequence (the tie-breaker),
/// and where its body lives. Ordered by (time, seq) only; `seq` is unique,
/// so the order is total.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Key {
    pub time: u64,
    pub seq: u64,
    pub slot: u32,
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.time == other.time && self.seq == other.seq
    }
}
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest key.
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// A min-queue of [`Key`]s.
#[derive(Default)]
pub(crate) struct EventQueue {
    heap: BinaryHeap<Key>,
}

impl EventQueue {
    #[inline]
    pub fn push(&mut self, key: Key) {
        self.heap.push(key);
    }

    /// Pops the earliest key if its time is not after `limit`.
    #[inline]
    pub fn pop_if_not_after(&mut self, limit: u64) -> Option<Key> {
        if self.heap.peek()?.time > limit {
            return None;
        }
        self.heap.pop()
    }
}
