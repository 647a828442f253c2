//! The pending-event queue.
//!
//! Events leave in (time, insertion sequence) order. The engine's queue is a
//! monotone radix heap ([`RadixQueue`]) with 64-way digits: virtual time
//! never moves backwards, so every key pushed is at or after the last key
//! popped, `last`. A key is filed by the highest 6-bit digit in which its
//! time differs from `last` (its level) and by its own value of that digit
//! (its slot): 11 levels of 64 buckets, one occupancy word per level. Keys
//! of a lower level, or of a lower slot of the same level, are all earlier,
//! so the earliest keys sit in the lowest occupied slot of the lowest
//! occupied level, found with two `trailing_zeros`. Popping from an empty
//! `now` bucket advances `last` to the earliest time in that bucket and
//! refiles its keys, each into a strictly lower level (the earliest into
//! `now`): a key moves at most once per digit (at most twice for delays
//! below 2^12 ns) where a binary radix heap moves it once per bit. A push is
//! O(1); nothing is sifted.
//!
//! Keys with equal times always share a bucket and keep their push order
//! (pushes append; refiling walks a bucket front to back), so ties leave in
//! insertion order without a sequence number in the key. A plain binary heap
//! over (time, seq) is the reference the radix heap is tested against.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub time: u64,
    pub slot: u32,
    pub generation: u32,
}

/// What the engine needs of its pending-event queue.
pub(crate) trait EventQueue: Default {
    /// Adds a key; its time must be at or after the last key popped (any
    /// time if the queue is empty).
    fn push(&mut self, key: Key);
    /// Removes and returns the earliest key (the first pushed among equal
    /// times) if its time is at or before `limit`.
    fn pop_if_not_after(&mut self, limit: u64) -> Option<Key>;
    /// The earliest key's time.
    fn next_time(&self) -> Option<u64>;
}

/// Bits per digit, and slots per level.
const DIGIT_BITS: u32 = 6;
const SLOTS: usize = 1 << DIGIT_BITS;
/// Levels: 64 bits in 6-bit digits (the last holds 4).
const LEVELS: usize = 64usize.div_ceil(DIGIT_BITS as usize);

pub(crate) struct RadixQueue {
    /// At or before every key queued: the time of the last key popped.
    last: u64,
    /// Keys at exactly `last`, in push order, from `head` on.
    now: Vec<Key>,
    head: usize,
    /// `LEVELS × SLOTS` buckets, level-major.
    buckets: Box<[Vec<Key>]>,
    /// Per level, the slots holding keys.
    occupied: [u64; LEVELS],
    /// The levels with an occupied slot.
    levels: u32,
    len: usize,
}

impl Default for RadixQueue {
    fn default() -> Self {
        RadixQueue {
            last: 0,
            now: Vec::new(),
            head: 0,
            buckets: (0..LEVELS * SLOTS).map(|_| Vec::new()).collect(),
            occupied: [0; LEVELS],
            levels: 0,
            len: 0,
        }
    }
}

impl RadixQueue {
    /// Files `key` relative to `last`.
    #[inline]
    fn place(&mut self, key: Key) {
        let differ = key.time ^ self.last;
        if differ == 0 {
            self.now.push(key);
            return;
        }
        let level = (u64::BITS - 1 - differ.leading_zeros()) / DIGIT_BITS;
        let slot = (key.time >> (level * DIGIT_BITS)) as usize & (SLOTS - 1);
        self.occupied[level as usize] |= 1 << slot;
        self.levels |= 1 << level;
        self.buckets[level as usize * SLOTS + slot].push(key);
    }

    /// The lowest occupied bucket's index, if any.
    #[inline]
    fn first_bucket(&self) -> Option<usize> {
        if self.levels == 0 {
            return None;
        }
        let level = self.levels.trailing_zeros() as usize;
        Some(level * SLOTS + self.occupied[level].trailing_zeros() as usize)
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
        if self.head == self.now.len() {
            let i = self.first_bucket()?;
            let min = self.buckets[i].iter().map(|k| k.time).min().expect("an occupied bucket");
            if min > limit {
                return None;
            }
            // Every key of the bucket agrees with `min` above the level's
            // digit and in it (the slot), and every other key queued is
            // later: with `last` at `min`, each moves to a strictly lower
            // level, and the earliest to `now`.
            let (level, slot) = (i / SLOTS, i % SLOTS);
            self.occupied[level] &= !(1 << slot);
            if self.occupied[level] == 0 {
                self.levels &= !(1 << level);
            }
            self.last = min;
            let mut drained = std::mem::take(&mut self.buckets[i]);
            for &key in &drained {
                self.place(key);
            }
            drained.clear();
            self.buckets[i] = drained; // keep its capacity
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
        self.buckets[self.first_bucket()?].iter().map(|k| k.time).min()
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
                    // Up to the top level (4 bits), and to u64::MAX, where
                    // saturating pushes make ties.
                    let spread = [0, 1, 7, 1_000, 1 << 40, 1 << 63][rng.random_range(0..6)];
                    let time = now.saturating_add(if spread == 0 { 0 } else { rng.random_range(0..spread) });
                    slot += 1;
                    let key = Key { time, slot, generation: 0 };
                    radix.push(key);
                    reference.push(key);
                } else {
                    let limit =
                        if rng.random_bool(0.8) { u64::MAX } else { now.saturating_add(rng.random_range(0..2_000)) };
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
