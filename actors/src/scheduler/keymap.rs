//! The prefix cache's key map: cache key (a 64-bit content hash) -> slot of
//! the entry that serves it, in an open-addressing table made for that one
//! job.
//!
//! Every cached block is registered, looked up and evicted through it, so
//! on a trace with prefix ids it is the pool's hottest structure (the
//! Mooncake conversation trace: an insert and a remove for each of its
//! millions of blocks). A general hash map spends most of an operation on
//! what these keys do not need: control bytes, a hasher over the bytes, a
//! second probe sequence. Here a key is placed by one multiplication
//! (Fibonacci hashing of its top bits), probed linearly, and removed by
//! shifting the run after it back, so no tombstones build up; the table
//! stays at most half full. Nothing reads it in table order where the
//! order could reach results: [`KeyMap::values`] serves checks only.
//!
//! It counts its changes, so that slots found by a lookup can be used
//! again while the count stands (the pool's hit memo): every change goes
//! through [`KeyMap::insert`], [`KeyMap::remove`] or
//! [`KeyMap::insert_vacant`].

/// No entry in a table cell (slot numbers stay below it: there are fewer
/// cached entries than blocks, and blocks fit in `u32`).
const EMPTY: u32 = u32::MAX;

/// Cells of the first table (it doubles when half full).
const FIRST_CELLS: usize = 16;

#[derive(Clone, Debug)]
pub(super) struct KeyMap {
    /// (key, slot); slot [`EMPTY`]: a free cell. A power of two long.
    cells: Vec<(u64, u32)>,
    /// 64 − log2(cells): the shift that takes a hash to a cell.
    shift: u32,
    len: usize,
    changes: u64,
}

impl Default for KeyMap {
    fn default() -> Self {
        KeyMap { cells: vec![(0, EMPTY); FIRST_CELLS], shift: 64 - FIRST_CELLS.trailing_zeros(), len: 0, changes: 0 }
    }
}

impl KeyMap {
    /// The cell `k` is placed at first.
    #[inline]
    fn home(&self, k: u64) -> usize {
        (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.cells.len() - 1
    }

    /// The cell holding `k`, or the free cell where it would go.
    #[inline]
    fn find(&self, k: u64) -> (usize, bool) {
        let mask = self.mask();
        let mut i = self.home(k);
        loop {
            let (key, slot) = self.cells[i];
            if slot == EMPTY {
                return (i, false);
            }
            if key == k {
                return (i, true);
            }
            i = (i + 1) & mask;
        }
    }

    /// The slot `k` maps to.
    #[inline]
    pub(super) fn get(&self, k: &u64) -> Option<&u32> {
        match self.find(*k) {
            (i, true) => Some(&self.cells[i].1),
            _ => None,
        }
    }

    #[inline]
    pub(super) fn contains_key(&self, k: &u64) -> bool {
        self.find(*k).1
    }

    /// Changes so far (inserts and removals).
    #[inline]
    pub(super) fn changes(&self) -> u64 {
        self.changes
    }

    /// Maps `k` to `slot`; the slot it mapped to before.
    #[inline]
    pub(super) fn insert(&mut self, k: u64, slot: u32) -> Option<u32> {
        debug_assert_ne!(slot, EMPTY);
        self.changes += 1;
        match self.find(k) {
            (i, true) => Some(std::mem::replace(&mut self.cells[i].1, slot)),
            (i, false) => {
                self.place(i, k, slot);
                None
            }
        }
    }

    /// Maps `k` to `slot()` if it maps to nothing; whether it did.
    #[inline]
    pub(super) fn insert_vacant(&mut self, k: u64, slot: impl FnOnce() -> u32) -> bool {
        match self.find(k) {
            (_, true) => false,
            (i, false) => {
                self.changes += 1;
                let s = slot();
                debug_assert_ne!(s, EMPTY);
                self.place(i, k, s);
                true
            }
        }
    }

    /// Puts `k` in the free cell `i` found for it, growing the table past
    /// half full.
    #[inline]
    fn place(&mut self, i: usize, k: u64, slot: u32) {
        self.cells[i] = (k, slot);
        self.len += 1;
        if self.len * 2 > self.cells.len() {
            self.grow();
        }
    }

    #[cold]
    fn grow(&mut self) {
        let cells = vec![(0, EMPTY); self.cells.len() * 2];
        let old = std::mem::replace(&mut self.cells, cells);
        self.shift -= 1;
        for (k, slot) in old {
            if slot != EMPTY {
                let (i, _) = self.find(k);
                self.cells[i] = (k, slot);
            }
        }
    }

    /// Unmaps `k`; the slot it mapped to. The cells after it that could sit
    /// closer to their home move back into the hole, so every key stays
    /// reachable from its home without gaps.
    #[inline]
    pub(super) fn remove(&mut self, k: &u64) -> Option<u32> {
        self.changes += 1;
        let (mut hole, found) = self.find(*k);
        if !found {
            return None;
        }
        let slot = self.cells[hole].1;
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let (key, s) = self.cells[j];
            if s == EMPTY {
                break;
            }
            // The cell at j may fill the hole unless its home lies
            // (cyclically) after the hole, up to j.
            let home = self.home(key);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.cells[hole] = (key, s);
                hole = j;
            }
        }
        self.cells[hole] = (0, EMPTY);
        self.len -= 1;
        Some(slot)
    }

    /// The slots mapped to, in table order (for checks: the order depends
    /// on the keys and the table's history).
    pub(super) fn values(&self) -> impl Iterator<Item = &u32> {
        self.cells.iter().filter(|c| c.1 != EMPTY).map(|c| &c.1)
    }

    /// (key, slot) pairs, in table order.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (&u64, &u32)> {
        self.cells.iter().filter(|c| c.1 != EMPTY).map(|c| (&c.0, &c.1))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u32),
        Vacant(u64, u32),
        Remove(u64),
    }

    /// Keys from a small range, so that operations meet, and some that
    /// share a home (multiples of a power of two whose product with the
    /// multiplier agrees in the top bits are rare; a dense range collides
    /// often in a small table).
    fn op() -> impl Strategy<Value = Op> {
        let key = prop_oneof![0u64..64, any::<u64>(), (0u64..16).prop_map(|k| k << 58)];
        prop_oneof![
            (key.clone(), 0u32..1000).prop_map(|(k, s)| Op::Insert(k, s)),
            (key.clone(), 0u32..1000).prop_map(|(k, s)| Op::Vacant(k, s)),
            key.prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// Any sequence of inserts and removals leaves the map holding what
        /// a BTreeMap holds after the same sequence, every answer on the way
        /// agreeing, and the change count counting every change.
        #[test]
        fn the_key_map_answers_as_a_map_does(ops in prop::collection::vec(op(), 0..600)) {
            let mut m = KeyMap::default();
            let mut model = BTreeMap::new();
            let mut changes = 0;
            for op in ops {
                match op {
                    Op::Insert(k, s) => {
                        prop_assert_eq!(m.insert(k, s), model.insert(k, s));
                        changes += 1;
                    }
                    Op::Vacant(k, s) => {
                        let vacant = !model.contains_key(&k);
                        if vacant {
                            model.insert(k, s);
                            changes += 1;
                        }
                        prop_assert_eq!(m.insert_vacant(k, || s), vacant);
                    }
                    Op::Remove(k) => {
                        prop_assert_eq!(m.remove(&k), model.remove(&k));
                        changes += 1;
                    }
                }
                prop_assert_eq!(m.changes(), changes);
                prop_assert_eq!(m.len, model.len());
                prop_assert!(m.len * 2 <= m.cells.len());
            }
            for (k, s) in &model {
                prop_assert_eq!(m.get(k), Some(s));
            }
            let mut all: Vec<(u64, u32)> = m.iter().map(|(&k, &s)| (k, s)).collect();
            all.sort_unstable();
            prop_assert_eq!(all, model.into_iter().collect::<Vec<_>>());
        }
    }
}
