//! The prefix cache's key map: cache key (a 64-bit content hash) -> slot of
//! the entry that serves it, in an open-addressing table made for that one
//! job.
//!
//! Every cached block is registered, looked up and evicted through it, so
//! on a trace with prefix ids it is the pool's hottest structure (the
//! Mooncake conversation trace: an insert and a remove for each of its
//! millions of blocks, at random places in a table as large as the pool's
//! cache). A general hash map spends most of an operation on what these
//! keys do not need: control bytes, a hasher over the bytes, a second probe
//! sequence. Here a key is placed by one multiplication (Fibonacci hashing:
//! the top bits of its product), probed linearly, and removed by shifting
//! the run after it back, so no tombstones build up; the table stays at
//! most half full. A cell holds the top 32 bits of the key's product (its
//! tag) and the slot, 8 bytes: a cell whose tag matches is checked against
//! the key of the entry in its slot, which the caller gives. Half the
//! 16 bytes of a cell holding the key keeps twice the table in cache; on
//! that trace, the run spent most of its time waiting for the table.
//! Nothing reads it in table order where the order could reach results:
//! [`KeyMap::values`] serves checks only.
//!
//! It counts its changes, so that slots found by a lookup can be used
//! again while the count stands (the pool's hit memo): every change goes
//! through [`KeyMap::insert`], [`KeyMap::remove`] or [`KeyMap::fill`].

/// No entry in a table cell (slot numbers stay below it: there are fewer
/// cached entries than blocks, and blocks fit in `u32`).
const EMPTY: u32 = u32::MAX;

/// Cells of the first table (it grows by doubling).
const FIRST_CELLS: usize = 16;

/// The table grows once more than `LOAD_NUM / LOAD_DEN` of its cells are
/// taken. (At 3/4 the table can be half the size, but the probes and the
/// removal's shifts grow longer: 22 % more instructions on the Mooncake
/// trace, and slower.)
const LOAD_NUM: usize = 1;
const LOAD_DEN: usize = 2;

/// Fibonacci hashing's multiplier (2^64 / φ).
const PHI: u64 = 0x9e37_79b9_7f4a_7c15;

/// A key's tag: the top 32 bits of its Fibonacci hash. Its top bits are the
/// key's home cell, so a table of at most 2^32 cells can move cells
/// without the keys.
#[inline]
fn tag(k: u64) -> u32 {
    (k.wrapping_mul(PHI) >> 32) as u32
}

/// Hints that `*r` will be read soon (an x86-64 prefetch; nothing
/// elsewhere).
#[inline(always)]
fn prefetch_read<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing a program can observe and cannot
    // fault, whatever the address; `r` is a live reference besides. Its
    // `sse` target feature is part of the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(r).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}

/// The answer of [`KeyMap::entry`] for a key the map lacks: the cell it
/// would take, valid until the map next changes ([`KeyMap::fill`] checks).
#[derive(Debug)]
pub(super) struct Vacant {
    cell: usize,
    tag: u32,
    changes: u64,
}

/// Key -> slot, keeping only the key's tag beside the slot (8 bytes a cell,
/// so that the table of a pool full of cached blocks stays small enough to
/// stay in cache). The full key is the entry's in the slot: every lookup
/// takes `key_of`, which gives a mapped slot's key, and a cell whose tag
/// matches is checked against it. The caller's entries must keep the key
/// they are mapped under while mapped.
#[derive(Clone, Debug)]
pub(super) struct KeyMap {
    /// (tag, slot); slot [`EMPTY`]: a free cell. A power of two long.
    cells: Vec<(u32, u32)>,
    /// 32 − log2(cells): the shift that takes a tag to its home cell.
    shift: u32,
    len: usize,
    changes: u64,
}

impl Default for KeyMap {
    fn default() -> Self {
        KeyMap { cells: vec![(0, EMPTY); FIRST_CELLS], shift: 32 - FIRST_CELLS.trailing_zeros(), len: 0, changes: 0 }
    }
}

impl KeyMap {
    /// The cell a key of tag `t` is placed at first.
    #[inline]
    fn home(&self, t: u32) -> usize {
        (t >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.cells.len() - 1
    }

    /// The cell holding `k`, or the free cell where it would go.
    #[inline]
    fn find(&self, k: u64, key_of: impl Fn(u32) -> u64) -> (usize, bool) {
        let t = tag(k);
        let mask = self.mask();
        let mut i = self.home(t);
        loop {
            let (ct, slot) = self.cells[i];
            if slot == EMPTY {
                return (i, false);
            }
            if ct == t && key_of(slot) == k {
                return (i, true);
            }
            i = (i + 1) & mask;
        }
    }

    /// Asks the processor to bring the cell `k` is placed at first into
    /// cache, for an operation on `k` a little later: a batch of
    /// operations then waits for its cells together rather than one after
    /// another. A hint only; nothing it does can change an answer.
    #[inline(always)]
    pub(super) fn prefetch(&self, k: u64) {
        prefetch_read(&self.cells[self.home(tag(k))]);
    }

    /// The slot `k` maps to.
    #[inline]
    pub(super) fn get(&self, k: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        match self.find(k, key_of) {
            (i, true) => Some(self.cells[i].1),
            _ => None,
        }
    }

    #[inline]
    pub(super) fn contains_key(&self, k: u64, key_of: impl Fn(u32) -> u64) -> bool {
        self.find(k, key_of).1
    }

    /// Changes so far (inserts, and removals of a key it had).
    #[inline]
    pub(super) fn changes(&self) -> u64 {
        self.changes
    }

    /// Maps `k` to `slot` (whose entry has key `k` already); the slot it
    /// mapped to before.
    #[inline]
    pub(super) fn insert(&mut self, k: u64, slot: u32, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        debug_assert_ne!(slot, EMPTY);
        debug_assert_eq!(key_of(slot), k, "a slot is mapped under its entry's key");
        self.changes += 1;
        match self.find(k, key_of) {
            (i, true) => Some(std::mem::replace(&mut self.cells[i].1, slot)),
            (i, false) => {
                self.place(i, tag(k), slot);
                None
            }
        }
    }

    /// The slot `k` maps to, or where it would go ([`KeyMap::fill`]).
    #[inline]
    pub(super) fn entry(&self, k: u64, key_of: impl Fn(u32) -> u64) -> Result<u32, Vacant> {
        match self.find(k, key_of) {
            (i, true) => Ok(self.cells[i].1),
            (cell, false) => Err(Vacant { cell, tag: tag(k), changes: self.changes }),
        }
    }

    /// Maps the key [`KeyMap::entry`] found vacant to `slot` (whose entry
    /// has that key).
    #[inline]
    pub(super) fn fill(&mut self, v: Vacant, slot: u32) {
        assert_eq!(v.changes, self.changes, "the key map changed since the cell was found");
        debug_assert_ne!(slot, EMPTY);
        self.changes += 1;
        self.place(v.cell, v.tag, slot);
    }

    /// Puts tag `t` in the free cell `i` found for it, growing the table
    /// past its load limit.
    #[inline]
    fn place(&mut self, i: usize, t: u32, slot: u32) {
        self.cells[i] = (t, slot);
        self.len += 1;
        if self.len * LOAD_DEN > self.cells.len() * LOAD_NUM {
            self.grow();
        }
    }

    #[cold]
    fn grow(&mut self) {
        assert!(self.shift > 0, "a key map of 2^32 cells is full");
        let cells = vec![(0, EMPTY); self.cells.len() * 2];
        let old = std::mem::replace(&mut self.cells, cells);
        self.shift -= 1;
        let mask = self.mask();
        for (t, slot) in old {
            if slot != EMPTY {
                let mut i = self.home(t);
                while self.cells[i].1 != EMPTY {
                    i = (i + 1) & mask;
                }
                self.cells[i] = (t, slot);
            }
        }
    }

    /// Unmaps `k`; the slot it mapped to. The cells after it that could sit
    /// closer to their home move back into the hole, so every key stays
    /// reachable from its home without gaps.
    #[inline]
    pub(super) fn remove(&mut self, k: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        let (mut hole, found) = self.find(k, key_of);
        if !found {
            // Nothing changed: what was looked up before stands.
            return None;
        }
        self.changes += 1;
        let slot = self.cells[hole].1;
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let (t, s) = self.cells[j];
            if s == EMPTY {
                break;
            }
            // The cell at j may fill the hole unless its home lies
            // (cyclically) after the hole, up to j.
            let home = self.home(t);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.cells[hole] = (t, s);
                hole = j;
            }
        }
        self.cells[hole] = (0, EMPTY);
        self.len -= 1;
        Some(slot)
    }

    /// The slots mapped to, in table order (for checks: the order depends
    /// on the keys and the table's history).
    pub(super) fn values(&self) -> impl Iterator<Item = u32> + '_ {
        self.cells.iter().filter(|c| c.1 != EMPTY).map(|c| c.1)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64),
        Vacant(u64),
        Remove(u64),
    }

    /// The multiplicative inverse of [`PHI`] mod 2^64 (Newton's iteration):
    /// `c · PHI_INV` hashes to `c`, so small multiples share tag 0.
    fn phi_inv() -> u64 {
        let mut x = PHI;
        for _ in 0..6 {
            x = x.wrapping_mul(2u64.wrapping_sub(PHI.wrapping_mul(x)));
        }
        assert_eq!(x.wrapping_mul(PHI), 1);
        x
    }

    /// Keys from a small range, so that operations meet; keys that share a
    /// home; and distinct keys that share a tag, which only the check of the
    /// slot's key tells apart.
    fn op() -> impl Strategy<Value = Op> {
        let inv = phi_inv();
        let key = prop_oneof![
            0u64..64,
            any::<u64>(),
            (0u64..16).prop_map(|k| k << 58),
            (0u64..16).prop_map(move |c| c.wrapping_mul(inv)),
        ];
        prop_oneof![key.clone().prop_map(Op::Insert), key.clone().prop_map(Op::Vacant), key.prop_map(Op::Remove),]
    }

    proptest! {
        /// Any sequence of inserts and removals leaves the map holding what
        /// a BTreeMap holds after the same sequence, every answer on the way
        /// agreeing, and the change count counting every change (and nothing
        /// else: removing a missing key is none). Each insert
        /// maps its key to a new slot whose entry has that key.
        #[test]
        fn the_key_map_answers_as_a_map_does(ops in prop::collection::vec(op(), 0..600)) {
            let mut m = KeyMap::default();
            let mut model = BTreeMap::new();
            let mut slot_keys: Vec<u64> = Vec::new();
            let mut changes = 0;
            for op in ops {
                match op {
                    Op::Insert(k) => {
                        slot_keys.push(k);
                        let s = (slot_keys.len() - 1) as u32;
                        let keys = |s: u32| slot_keys[s as usize];
                        prop_assert_eq!(m.insert(k, s, keys), model.insert(k, s));
                        changes += 1;
                    }
                    Op::Vacant(k) => {
                        let found = m.entry(k, |s: u32| slot_keys[s as usize]);
                        prop_assert_eq!(found.as_ref().ok().copied(), model.get(&k).copied());
                        if let Err(v) = found {
                            slot_keys.push(k);
                            let s = (slot_keys.len() - 1) as u32;
                            m.fill(v, s);
                            model.insert(k, s);
                            changes += 1;
                        }
                    }
                    Op::Remove(k) => {
                        let removed = model.remove(&k);
                        prop_assert_eq!(m.remove(k, |s: u32| slot_keys[s as usize]), removed);
                        // (Removing a key the map lacks changes nothing.)
                        changes += u64::from(removed.is_some());
                    }
                }
                prop_assert_eq!(m.changes(), changes);
                prop_assert_eq!(m.len, model.len());
                prop_assert!(m.len * LOAD_DEN <= m.cells.len() * LOAD_NUM);
            }
            for (&k, &s) in &model {
                prop_assert_eq!(m.get(k, |s: u32| slot_keys[s as usize]), Some(s));
            }
            let mut all: Vec<(u64, u32)> = m.values().map(|s| (slot_keys[s as usize], s)).collect();
            all.sort_unstable();
            prop_assert_eq!(all, model.into_iter().collect::<Vec<_>>());
        }
    }

    /// A cell found vacant is only filled while the map is as it was.
    #[test]
    #[should_panic(expected = "changed since")]
    fn a_vacant_cell_found_before_a_change_is_not_filled() {
        let keys = [1u64, 2];
        let mut m = KeyMap::default();
        let v = m.entry(1, |s: u32| keys[s as usize]).expect_err("empty");
        m.insert(2, 1, |s: u32| keys[s as usize]);
        m.fill(v, 0);
    }
}
