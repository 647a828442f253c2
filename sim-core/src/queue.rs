//! The pending-event queue.
//!
//! Events leave in (time, insertion sequence) order. The engine's queue is a
//! monotone radix heap ([`RadixQueue`]): virtual time never moves backwards,
//! so every key pushed is at or after the last key popped, and keys can be
//! bucketed by the highest bit in which they differ from it. A push is O(1);
//! a pop is amortised O(log of the time span), touches contiguous memory,
//! and does not slow down as the number of pending events grows the way a
//! binary heap's sift does. Keys with equal times always share a bucket and
//! keep their push order (pushes append; redistribution walks a bucket front
//! to back), so ties leave in insertion order without a sequence number in
//! the key. A plain binary heap over (time, seq) is the reference the radix
//! heap is tested against.

/// One queued event: when, and where its body lives (slot and generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub time: u64,
    pub slot: u32,
    pub generation: u32,
}

/// A queue of [`Key`]s that pops in (time, push order) order.
pub(crate) trait EventQueue: Default {
    /// Adds a key. Its time must not be before the time of the last key popped.
    fn push(&mut self, key: Key);
    /// Pops the earliest key (the first pushed among equal times) if its
    /// time is not after `limit`.
    fn pop_if_not_after(&mut self, limit: u64) -> Option<Key>;
    /// The earliest queued key's time (a cancelled event's included), if
    /// any key is queued.
    fn next_time(&self) -> Option<u64>;
}

/// The monotone radix heap; see the module docs.
pub(crate) struct RadixQueue {
    /// The time of the last key popped; every queued key is at or after it.
    last: u64,
    /// Keys at `last`, in push order; `head` of them have been popped.
    now: Vec<Key>,
    head: usize,
    /// Bucket i (1..=64) holds keys whose time differs from `last` first in
    /// bit i − 1, in push order. Index 0 is unused.
    buckets: [Vec<Key>; 65],
    /// Bit i − 1 set ⇔ bucket i is non-empty.
    occupied: u64,
    /// Keys queued.
    len: usize,
}

impl Default for RadixQueue {
    fn default() -> Self {
        RadixQueue {
            last: 0,
            now: Vec::new(),
            head: 0,
            buckets: std::array::from_fn(|_| Vec::new()),
            occupied: 0,
            len: 0,
        }
    }
}

impl RadixQueue {
    #[inline]
    fn place(&mut self, key: Key) {
        let b = (u64::BITS - (key.time ^ self.last).leading_zeros()) as usize;
        if b == 0 {
            self.now.push(key);
        } else {
            self.occupied |= 1 << (b - 1);
            self.buckets[b].push(key);
        }
    }
}

impl EventQueue for RadixQueue {
    #[inline]
    fn push(&mut self, key: Key) {
        if self.len == 0 {
            // Any origin at or before every future key is valid for an empty
            // queue, and zero is. (The caller's clock may lag the last key
            // popped, when that key was a cancelled event it skipped.)
            self.last = 0;
        }
        debug_assert!(key.time >= self.last, "time moved backwards");
        self.len += 1;
        self.place(key);
    }

    #[inline]
    fn pop_if_not_after(&mut self, limit: u64) -> Option<Key> {
        if self.now.is_empty() {
            if self.occupied == 0 {
                return None;
            }
            let b = self.occupied.trailing_zeros() as usize + 1;
            let min = self.buckets[b].iter().map(|k| k.time).min().expect("occupied bucket");
            if min > limit {
                return None;
            }
            // Every key in bucket b is below any key in a higher bucket, and
            // lower buckets are empty: redistribute it around the new minimum.
            self.last = min;
            self.occupied &= !(1 << (b - 1));
            let mut drained = std::mem::take(&mut self.buckets[b]);
            for &key in &drained {
                self.place(key);
            }
            drained.clear();
            self.buckets[b] = drained; // keep its capacity
        } else if self.last > limit {
            return None;
        }
        let key = self.now[self.head];
        self.len -= 1;
        self.head += 1;
        if self.head == self.now.len() {
            self.now.clear();
            self.head = 0;
        }
        Some(key)
    }

    fn next_time(&self) -> Option<u64> {
        if self.head < self.now.len() {
            return Some(self.last);
        }
        if self.occupied == 0 {
            return None;
        }
        let b = self.occupied.trailing_zeros() as usize + 1;
        self.buckets[b].iter().map(|k| k.time).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    /// A binary heap over (time, seq): simple, obviously right, O(log n) per
    /// operation. The reference that [`RadixQueue`] is checked against.
    #[derive(Default)]
    struct HeapQueue {
        heap: BinaryHeap<Reverse<(u64, u64, u32, u32)>>,
        seq: u64,
    }

    impl EventQueue for HeapQueue {
        fn push(&mut self, key: Key) {
            self.seq += 1;
            self.heap.push(Reverse((key.time, self.seq, key.slot, key.generation)));
        }

        fn pop_if_not_after(&mut self, limit: u64) -> Option<Key> {
            let Reverse((time, ..)) = self.heap.peek()?;
            if *time > limit {
                return None;
            }
            let Reverse((time, _, slot, generation)) = self.heap.pop()?;
            Some(Key { time, slot, generation })
        }

        fn next_time(&self) -> Option<u64> {
            self.heap.peek().map(|Reverse((time, ..))| *time)
        }
    }

    /// Random interleavings of pushes (at or after the last pop, often at the
    /// same instant) and pops with limits: the radix heap pops exactly what
    /// the binary heap pops, and peeks the same next time.
    #[test]
    fn radix_heap_pops_what_the_reference_heap_pops() {
        for seed in 0..200u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let (mut radix, mut reference) = (RadixQueue::default(), HeapQueue::default());
            let mut now = 0u64;
            let mut slot = 0u32;
            for _ in 0..2_000 {
                assert_eq!(radix.next_time(), reference.next_time(), "seed {seed}");
                if rng.random_bool(0.55) {
                    let spread = [0, 1, 7, 1_000, 1 << 40][rng.random_range(0..5)];
                    let time = now + if spread == 0 { 0 } else { rng.random_range(0..spread) };
                    slot += 1;
                    let key = Key { time, slot, generation: 0 };
                    radix.push(key);
                    reference.push(key);
                } else {
                    let limit = if rng.random_bool(0.8) { u64::MAX } else { now + rng.random_range(0..2_000) };
                    let popped = radix.pop_if_not_after(limit);
                    assert_eq!(popped, reference.pop_if_not_after(limit), "seed {seed}");
                    if let Some(k) = popped {
                        now = k.time;
                    }
                }
            }
            while let Some(k) = reference.pop_if_not_after(u64::MAX) {
                assert_eq!(radix.pop_if_not_after(u64::MAX), Some(k), "seed {seed}");
            }
            assert_eq!(radix.pop_if_not_after(u64::MAX), None);
        }
    }

    /// Emptied at t = 50, the queue accepts pushes from t = 20 on (the
    /// engine's clock may lag the last key popped when that key was a
    /// cancelled event), in any order.
    #[test]
    fn an_empty_queue_accepts_any_time() {
        let mut q = RadixQueue::default();
        q.push(Key { time: 50, slot: 1, generation: 0 });
        assert_eq!(q.pop_if_not_after(u64::MAX).map(|k| k.time), Some(50));
        q.push(Key { time: 30, slot: 3, generation: 0 });
        q.push(Key { time: 20, slot: 2, generation: 0 });
        q.push(Key { time: 20, slot: 4, generation: 0 });
        let order: Vec<u32> = std::iter::from_fn(|| q.pop_if_not_after(u64::MAX)).map(|k| k.slot).collect();
        assert_eq!(order, vec![2, 4, 3]);
    }
}
