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
//! Keys with the top bit set ([`GROUPED`]) go further: up to 32 keys that
//! differ only in their low 5 bits share one cell, which points at a
//! record of their slots (the pool groups the blocks of one prefix id so:
//! on that trace, 16-token blocks of 512-token ids, an id's 32 blocks are
//! registered, looked up and evicted one after another through one cell
//! and one record, not 32 cells at random; the run took a quarter less
//! time). A key's group is its own business: any key is valid grouped or
//! not, so the encoding can never make two keys one.
//! Nothing reads it in table order where the order could reach results:
//! [`KeyMap::values`] serves checks only.
//!
//! It counts its changes, so that slots found by a lookup can be used
//! again while the count stands (the pool's hit memo): every change goes
//! through [`KeyMap::insert`], [`KeyMap::insert_if_vacant`] (or its runs,
//! [`KeyMap::insert_run_if_vacant`] and
//! [`KeyMap::insert_group_if_vacant`]), [`KeyMap::remove`] or
//! [`KeyMap::fill`], and each counts it.

use super::pool::PREFETCH_AHEAD;
#[cfg(test)]
use crate::base::keys::PLACE_BITS;
use crate::base::keys::{GROUP_LEN, GROUPED};

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
pub(super) fn prefetch_read<T>(r: &T) {
    prefetch_index(std::slice::from_ref(r), 0);
}

/// Hints that `s[i]` will be read soon, for any `i`: past the end, the
/// hint names memory the program may not own, which a prefetch neither
/// reads nor can fault on, so no bounds are checked (a hot loop may ask for
/// an element it only guesses is there).
#[inline(always)]
pub(super) fn prefetch_index<T>(s: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing a program can observe and cannot
    // fault, whatever the address; the address is made with
    // `wrapping_add`, which is defined for any offset. Its `sse` target
    // feature is part of the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(s.as_ptr().wrapping_add(i).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, i);
}

/// A cell's value with this bit set is a group's index, not a slot (slot
/// numbers stay below it).
const GROUP_CELL: u32 = 1 << 31;

/// The slots of a group's keys ([`EMPTY`]: none at that place). (Laid out
/// as written, for [`KeyMap::prefetch_record`].)
#[derive(Clone, Debug)]
#[repr(C)]
struct Group {
    /// The group's key: a grouped key without its place.
    id: u64,
    /// Places taken.
    len: u32,
    slots: [u32; GROUP_LEN],
}

// (`KeyMap::prefetch_record` names every 48 bytes of it: the id, places 9
// and 21, the last place.)
const _: () = assert!(std::mem::size_of::<Group>() == 144 && std::mem::offset_of!(Group, slots) == 12);

/// Where [`KeyMap::fill`] puts the key [`KeyMap::entry`] found vacant.
#[derive(Debug)]
enum At {
    /// A plain key, or the first of a new group, at this free cell.
    Cell { cell: usize, tag: u32, group: Option<(u64, usize)> },
    /// A place in an existing group.
    Group { index: u32, place: usize },
}

/// The answer of [`KeyMap::entry`] for a key the map lacks: where it would
/// go, valid until the map next changes ([`KeyMap::fill`] checks).
#[derive(Debug)]
pub(super) struct Vacant {
    at: At,
    changes: u64,
}

/// Key -> slot, keeping only the key's tag beside the slot (8 bytes a cell,
/// so that the table of a pool full of cached blocks stays small enough to
/// stay in cache). The full key is the entry's in the slot: every lookup
/// takes `key_of`, which gives a mapped slot's key, and a cell whose tag
/// matches is checked against it. The caller's entries must keep the key
/// they are mapped under while mapped. Grouped keys ([`GROUPED`]) share a
/// cell per group, checked against the group's record.
#[derive(Clone, Debug)]
pub(super) struct KeyMap {
    /// (tag, slot or [`GROUP_CELL`] | group); slot [`EMPTY`]: a free cell.
    /// A power of two long.
    cells: Vec<(u32, u32)>,
    /// 32 − log2(cells): the shift that takes a tag to its home cell.
    shift: u32,
    /// Keys mapped.
    len: usize,
    /// Cells taken (plain keys and groups).
    used: usize,
    groups: Vec<Group>,
    /// Indices of unused records in `groups`.
    free_groups: Vec<u32>,
    /// The group an operation last found or made, and its record's index
    /// (id 0: none; no group's id is 0): the blocks of one prefix id are
    /// looked up, registered and evicted one after another, and all but the
    /// first of a run then skip the probe. A record keeps its index while
    /// the group has keys, whatever cells move; freeing any group's record
    /// (its last key removed) forgets it.
    last: std::cell::Cell<(u64, u32)>,
    changes: u64,
}

impl Default for KeyMap {
    fn default() -> Self {
        KeyMap {
            cells: vec![(0, EMPTY); FIRST_CELLS],
            shift: 32 - FIRST_CELLS.trailing_zeros(),
            len: 0,
            used: 0,
            groups: Vec::new(),
            free_groups: Vec::new(),
            last: std::cell::Cell::new((0, 0)),
            changes: 0,
        }
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

    /// The cell of tag `t` whose value `is` the one sought, or the free cell
    /// where it would go (linear probing from the tag's home).
    #[inline(always)]
    fn probe(&self, t: u32, is: impl Fn(u32) -> bool) -> (usize, bool) {
        let mask = self.mask();
        let mut i = self.home(t);
        loop {
            let (ct, v) = self.cells[i];
            if v == EMPTY {
                return (i, false);
            }
            if ct == t && is(v) {
                return (i, true);
            }
            i = (i + 1) & mask;
        }
    }

    /// The cell holding a plain key `k`, or the free cell where it would go.
    #[inline]
    fn find(&self, k: u64, key_of: impl Fn(u32) -> u64) -> (usize, bool) {
        self.probe(tag(k), |v| v & GROUP_CELL == 0 && key_of(v) == k)
    }

    /// The cell of the group `id`, or the free cell where it would go.
    #[inline]
    fn find_group(&self, id: u64) -> (usize, bool) {
        self.probe(tag(id), |v| v & GROUP_CELL != 0 && self.groups[(v & !GROUP_CELL) as usize].id == id)
    }

    /// The record of the group `id`, if it has one ([`KeyMap::last`] first).
    #[inline(always)]
    fn group_index(&self, id: u64) -> Result<u32, usize> {
        let (last, index) = self.last.get();
        if last == id {
            return Ok(index);
        }
        match self.find_group(id) {
            (i, true) => {
                let index = self.group_at(i);
                self.last.set((id, index));
                Ok(index)
            }
            (cell, false) => Err(cell),
        }
    }

    /// A grouped key's group and place.
    #[inline]
    fn split(k: u64) -> (u64, usize) {
        (k & !(GROUP_LEN as u64 - 1), (k & (GROUP_LEN as u64 - 1)) as usize)
    }

    /// The record of the group in cell `i`.
    #[inline]
    fn group_at(&self, i: usize) -> u32 {
        self.cells[i].1 & !GROUP_CELL
    }

    /// Asks the processor to bring the cell `k` is placed at first into
    /// cache, for an operation on `k` a little later: a batch of
    /// operations then waits for its cells together rather than one after
    /// another. A hint only; nothing it does can change an answer.
    #[inline(always)]
    pub(super) fn prefetch(&self, k: u64) {
        let t = if k & GROUPED != 0 {
            let id = Self::split(k).0;
            if id == self.last.get().0 {
                return; // its record is found without the cell
            }
            tag(id)
        } else {
            tag(k)
        };
        prefetch_read(&self.cells[self.home(t)]);
    }

    /// For a grouped key whose cell [`KeyMap::prefetch`] asked for a
    /// while ago: asks for the group's record (what the cell at its home
    /// points at). A hint only.
    #[inline(always)]
    pub(super) fn prefetch_record(&self, k: u64) {
        let id = Self::split(k).0;
        if k & GROUPED == 0 || id == self.last.get().0 {
            return;
        }
        let v = self.cells[self.home(tag(id))].1;
        if v != EMPTY && v & GROUP_CELL != 0 {
            // The whole record, not only the line of `k`'s place: a run
            // walks the places from there up (registration) or down
            // (eviction) to either end. Its 144 bytes span three or four
            // cache lines; a hint every 48 bytes names each.
            let g = &self.groups[(v & !GROUP_CELL) as usize];
            prefetch_read(&g.id);
            for p in [9, 21, GROUP_LEN - 1] {
                prefetch_read(&g.slots[p]);
            }
        }
    }

    /// The slot `k` maps to.
    #[inline]
    pub(super) fn get(&self, k: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        self.entry(k, key_of).ok()
    }

    /// The slots of the grouped keys `first`, `first + 1`, … (at most `n`,
    /// places of one group) up to the first the map lacks, appended to
    /// `out`; how many. One lookup of the group's record for them all (a
    /// prefix hit's path: an id's blocks are looked up one after another).
    #[inline]
    pub(super) fn get_group_run(&self, first: u64, n: usize, out: &mut Vec<u32>) -> usize {
        let (id, place) = Self::split(first);
        assert!(first & GROUPED != 0 && place + n <= GROUP_LEN, "the keys of one group");
        let Ok(index) = self.group_index(id) else {
            return 0;
        };
        let slots = &self.groups[index as usize].slots[place..][..n];
        let got = slots.iter().take_while(|&&s| s != EMPTY).count();
        out.extend_from_slice(&slots[..got]);
        got
    }

    #[inline]
    pub(super) fn contains_key(&self, k: u64, key_of: impl Fn(u32) -> u64) -> bool {
        self.get(k, key_of).is_some()
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
        debug_assert_eq!(key_of(slot), k, "a slot is mapped under its entry's key");
        assert!(slot & GROUP_CELL == 0, "slot numbers stay below 2^31");
        match self.entry(k, &key_of) {
            Ok(_) => {
                self.changes += 1;
                if k & GROUPED != 0 {
                    let (id, place) = Self::split(k);
                    let g = self.group_index(id).expect("a grouped key found has its group") as usize;
                    Some(std::mem::replace(&mut self.groups[g].slots[place], slot))
                } else {
                    let (i, _) = self.find(k, &key_of);
                    Some(std::mem::replace(&mut self.cells[i].1, slot))
                }
            }
            Err(v) => {
                self.fill(v, slot);
                None
            }
        }
    }

    /// Maps `k` to `slot` (whose entry has key `k` already) unless `k` is
    /// mapped; the slot it maps to if so (and nothing changes). A key of
    /// the group last found goes straight to its place.
    #[inline(always)]
    pub(super) fn insert_if_vacant(&mut self, k: u64, slot: u32, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        debug_assert_eq!(key_of(slot), k, "a slot is mapped under its entry's key");
        if k & GROUPED != 0 {
            let (id, place) = Self::split(k);
            let (last, index) = self.last.get();
            if last == id {
                let s = self.groups[index as usize].slots[place];
                if s != EMPTY {
                    return Some(s);
                }
                self.fill(Vacant { at: At::Group { index, place }, changes: self.changes }, slot);
                return None;
            }
        }
        match self.entry(k, key_of) {
            Ok(s) => Some(s),
            Err(v) => {
                self.fill(v, slot);
                None
            }
        }
    }

    /// [`KeyMap::insert_if_vacant`] of each key of `run` with the slot
    /// beside it in `slots`, in order; `mapped(j, s)` for each `run[j]`
    /// that was mapped already (to `s`, which stays). Keys of one group one
    /// after another share one lookup of its record. Cells and records are
    /// fetched ahead: the first keys' cells at once, then at each new group
    /// [`KeyMap::prefetch_ahead`] (at each plain key, the cell of the key
    /// [`PREFETCH_AHEAD`] ahead), so the run waits for them together.
    #[inline]
    pub(super) fn insert_run_if_vacant(
        &mut self,
        run: &[u64],
        slots: &[u32],
        key_of: impl Fn(u32) -> u64,
        mut mapped: impl FnMut(usize, u32),
    ) {
        assert_eq!(run.len(), slots.len(), "a slot for each key");
        assert!(slots.iter().fold(0, |or, &s| or | s) & GROUP_CELL == 0, "slot numbers stay below 2^31");
        debug_assert!(run.iter().zip(slots).all(|(&k, &s)| key_of(s) == k), "a slot is mapped under its entry's key");
        for &k in run.iter().take(PREFETCH_AHEAD).chain(run.get(GROUP_LEN)) {
            self.prefetch(k);
        }
        let mut j = 0;
        while let (Some(&k), Some(&slot)) = (run.get(j), slots.get(j)) {
            if k & GROUPED == 0 {
                if let Some(&ahead) = run.get(j + PREFETCH_AHEAD) {
                    self.prefetch(ahead);
                }
                if let Some(s) = self.insert_if_vacant(k, slot, &key_of) {
                    mapped(j, s);
                }
                j += 1;
                continue;
            }
            // A new group, whose keys from here go in at once. The cell of
            // the group two ahead is asked for, and the record of the next
            // (whose cell was asked for at the last group).
            self.prefetch_ahead(run, j);
            // (Its keys from here with the places counted up: a key out of
            // that line starts a run of its own.)
            let most = (slots.len() - j).min(GROUP_LEN - Self::split(k).1);
            let n = run[j..]
                .iter()
                .take(most)
                .zip((0..).map(|d| k.wrapping_add(d)))
                .take_while(|&(&k, want)| k == want)
                .count();
            let from = j;
            self.insert_group_if_vacant(k, &slots[j..j + n], |i, s| mapped(from + i, s));
            j += n;
        }
    }

    /// [`KeyMap::insert_if_vacant`] of the grouped keys `first`,
    /// `first + 1`, … of one group (the place counted up), each with the
    /// slot beside it in `slots`; `mapped(j, s)` for each key `first + j`
    /// that was mapped already (to `s`, which stays). The group's record
    /// is found once; the keys need not be written down.
    #[inline]
    pub(super) fn insert_group_if_vacant(&mut self, first: u64, slots: &[u32], mut mapped: impl FnMut(usize, u32)) {
        let (id, place) = Self::split(first);
        assert!(first & GROUPED != 0 && place + slots.len() <= GROUP_LEN, "the keys of one group");
        // (The pool's slab hands out no slot of 2^31 or more,
        // `Lru::alloc_entry`; the first is checked again by `fill`.)
        debug_assert!(slots.iter().fold(0, |or, &s| or | s) & GROUP_CELL == 0, "slot numbers stay below 2^31");
        let Some((&slot, _)) = slots.split_first() else {
            return;
        };
        let (index, made) = match self.group_index(id) {
            Ok(index) => (index, 0),
            Err(cell) => {
                // The first key makes the record.
                let group = Some((id, place));
                self.fill(Vacant { at: At::Cell { cell, tag: tag(id), group }, changes: self.changes }, slot);
                (self.last.get().1, 1)
            }
        };
        let g = &mut self.groups[index as usize];
        // Counted in a local, not in the record at every key.
        let mut new = 0;
        let cells = &mut g.slots[place..][..slots.len()];
        for j in made..slots.len() {
            match cells[j] {
                EMPTY => {
                    cells[j] = slots[j];
                    new += 1;
                }
                s => mapped(j, s),
            }
        }
        g.len += new;
        // (`group_index` or `fill` left the group last found this one.)
        self.len += new as usize;
        self.changes += u64::from(new);
    }

    /// The slot `k` maps to, or where it would go ([`KeyMap::fill`]).
    #[inline(always)]
    pub(super) fn entry(&self, k: u64, key_of: impl Fn(u32) -> u64) -> Result<u32, Vacant> {
        let at = if k & GROUPED != 0 {
            let (id, place) = Self::split(k);
            match self.group_index(id) {
                Ok(index) => {
                    let s = self.groups[index as usize].slots[place];
                    if s != EMPTY {
                        return Ok(s);
                    }
                    At::Group { index, place }
                }
                Err(cell) => At::Cell { cell, tag: tag(id), group: Some((id, place)) },
            }
        } else {
            match self.find(k, key_of) {
                (i, true) => return Ok(self.cells[i].1),
                (cell, false) => At::Cell { cell, tag: tag(k), group: None },
            }
        };
        Err(Vacant { at, changes: self.changes })
    }

    /// Maps the key [`KeyMap::entry`] found vacant to `slot` (whose entry
    /// has that key).
    #[inline(always)]
    pub(super) fn fill(&mut self, v: Vacant, slot: u32) {
        assert_eq!(v.changes, self.changes, "the key map changed since the cell was found");
        assert!(slot & GROUP_CELL == 0, "slot numbers stay below 2^31");
        self.changes += 1;
        self.len += 1;
        match v.at {
            At::Group { index, place } => {
                let g = &mut self.groups[index as usize];
                g.slots[place] = slot;
                g.len += 1;
            }
            At::Cell { cell, tag, group: None } => self.place(cell, tag, slot),
            At::Cell { cell, tag, group: Some((id, place)) } => {
                let mut slots = [EMPTY; GROUP_LEN];
                slots[place] = slot;
                let g = Group { id, len: 1, slots };
                let index = match self.free_groups.pop() {
                    Some(i) => {
                        self.groups[i as usize] = g;
                        i
                    }
                    None => {
                        self.groups.push(g);
                        let i = u32::try_from(self.groups.len() - 1).unwrap_or(u32::MAX);
                        // (A cell holds `GROUP_CELL | i`; all ones is EMPTY.)
                        assert!(i < GROUP_CELL - 1, "fewer groups than 2^31 - 1");
                        i
                    }
                };
                self.last.set((id, index));
                self.place(cell, tag, GROUP_CELL | index);
            }
        }
    }

    /// Puts tag `t` and value `v` in the free cell `i` found for them,
    /// growing the table past its load limit.
    #[inline]
    fn place(&mut self, i: usize, t: u32, v: u32) {
        self.cells[i] = (t, v);
        self.used += 1;
        if self.used * LOAD_DEN > self.cells.len() * LOAD_NUM {
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
        for (t, v) in old {
            if v != EMPTY {
                let mut i = self.home(t);
                while self.cells[i].1 != EMPTY {
                    i = (i + 1) & mask;
                }
                self.cells[i] = (t, v);
            }
        }
    }

    /// Unmaps `k`; the slot it mapped to. A key of the group last found,
    /// not its last, is taken from its place inline (eviction's path: an
    /// id's blocks go one after another); the rest out of line.
    #[inline(always)]
    pub(super) fn remove(&mut self, k: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        if k & GROUPED != 0 {
            let (id, place) = Self::split(k);
            let (last, index) = self.last.get();
            if last == id {
                let g = &mut self.groups[index as usize];
                let slot = g.slots[place];
                if slot != EMPTY && g.len > 1 {
                    g.slots[place] = EMPTY;
                    g.len -= 1;
                    self.changes += 1;
                    self.len -= 1;
                    return Some(slot);
                }
            }
        }
        self.remove_slow(k, key_of)
    }

    /// At a new group at `run[j]`: asks for the cell of the key
    /// 2·[`GROUP_LEN`] keys ahead and the record of the key [`GROUP_LEN`]
    /// ahead (a group's keys come together, at most that many).
    #[inline(always)]
    fn prefetch_ahead(&self, run: &[u64], j: usize) {
        if let Some(&ahead) = run.get(j + 2 * GROUP_LEN) {
            self.prefetch(ahead);
        }
        if let Some(&ahead) = run.get(j + GROUP_LEN) {
            self.prefetch_record(ahead);
        }
    }

    /// [`KeyMap::remove`] of each key of `run`, in order; how many it
    /// had. Keys of one group one after another share one lookup of its
    /// record, and cells are fetched ahead as
    /// [`KeyMap::insert_run_if_vacant`] fetches them (eviction's path: the
    /// entries leaving the order's head together).
    #[inline]
    pub(super) fn remove_run(&mut self, run: &[u64], key_of: impl Fn(u32) -> u64) -> usize {
        for &k in run.iter().take(PREFETCH_AHEAD).chain(run.get(GROUP_LEN)) {
            self.prefetch(k);
        }
        // Grouped keys removed here, and plain ones by `remove` (which
        // counts them).
        let (mut removed, mut plain) = (0, 0);
        let mut j = 0;
        while let Some(&k) = run.get(j) {
            if k & GROUPED == 0 {
                if let Some(&ahead) = run.get(j + PREFETCH_AHEAD) {
                    self.prefetch(ahead);
                }
                plain += usize::from(self.remove(k, &key_of).is_some());
                j += 1;
                continue;
            }
            self.prefetch_ahead(run, j);
            let id = Self::split(k).0;
            let Ok(index) = self.group_index(id) else {
                // None of the group's keys is mapped.
                j += 1;
                continue;
            };
            let g = &mut self.groups[index as usize];
            // (Counted in a local, not in the record at every key.)
            let mut gone = 0;
            while let Some(&k) = run.get(j) {
                let (of, place) = Self::split(k);
                if of != id {
                    break;
                }
                gone += u32::from(g.slots[place] != EMPTY);
                g.slots[place] = EMPTY;
                j += 1;
            }
            g.len -= gone;
            removed += gone as usize;
            if g.len == 0 {
                self.free_group(id, index);
            } else {
                self.last.set((id, index));
            }
        }
        self.changes += removed as u64;
        self.len -= removed;
        removed + plain
    }

    /// Frees the record `index` of the group `id`, whose last key went,
    /// and its cell (which forgets the group last found).
    fn free_group(&mut self, id: u64, index: u32) {
        let (i, found) = self.find_group(id);
        debug_assert!(found);
        self.unplace(i);
        self.free_groups.push(index);
        self.last.set((0, 0));
    }

    /// [`KeyMap::remove`] but for its inline case.
    #[inline(never)]
    fn remove_slow(&mut self, k: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        if k & GROUPED != 0 {
            let (id, place) = Self::split(k);
            let Ok(index) = self.group_index(id) else { return None };
            let g = &mut self.groups[index as usize];
            let slot = std::mem::replace(&mut g.slots[place], EMPTY);
            if slot == EMPTY {
                // Nothing changed: what was looked up before stands.
                return None;
            }
            g.len -= 1;
            if g.len == 0 {
                self.free_group(id, index);
            }
            self.changes += 1;
            self.len -= 1;
            return Some(slot);
        }
        let (hole, found) = self.find(k, key_of);
        if !found {
            // Nothing changed: what was looked up before stands.
            return None;
        }
        self.changes += 1;
        self.len -= 1;
        let slot = self.cells[hole].1;
        self.unplace(hole);
        Some(slot)
    }

    /// Empties cell `hole`. The cells after it that could sit closer to
    /// their home move back into the hole, so every key stays reachable
    /// from its home without gaps.
    #[inline]
    fn unplace(&mut self, mut hole: usize) {
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
        self.used -= 1;
    }

    /// The slots mapped to, in table order (for checks: the order depends
    /// on the keys and the table's history).
    pub(super) fn values(&self) -> impl Iterator<Item = u32> + '_ {
        self.cells.iter().filter(|c| c.1 != EMPTY).flat_map(move |&(_, v)| {
            let (own, group) = if v & GROUP_CELL != 0 {
                (None, Some(&self.groups[(v & !GROUP_CELL) as usize].slots))
            } else {
                (Some(v), None)
            };
            own.into_iter().chain(group.into_iter().flatten().copied().filter(|&s| s != EMPTY))
        })
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
        IfVacant(u64),
        /// `insert_if_vacant` of a run of keys at once.
        IfVacantRun(Vec<u64>),
        Remove(u64),
        /// `remove` of a run of keys at once.
        RemoveRun(Vec<u64>),
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
            // Grouped keys: a few groups, their places, and groups whose
            // own keys share a tag.
            (0u64..4, 0u64..GROUP_LEN as u64).prop_map(|(g, p)| GROUPED | g << PLACE_BITS | p),
            (0u64..4, 0u64..4).prop_map(move |(c, p)| (c.wrapping_mul(inv) & !(GROUP_LEN as u64 - 1)) | GROUPED | p),
        ];
        // Runs as the pool registers them: a group's places in order from
        // a key of it (some maybe taken already, a group met twice), plain
        // keys among them; now and then counted on past the group's last
        // place, into the next group's first.
        let run = prop::collection::vec((key.clone(), 1u64..40, any::<bool>()), 0..12).prop_map(|starts| {
            let mut keys = Vec::new();
            for (k, n, on) in starts {
                if k & GROUPED == 0 {
                    keys.push(k);
                } else if on {
                    keys.extend((0..n).map(|d| k.wrapping_add(d)));
                } else {
                    let (g, p) = KeyMap::split(k);
                    keys.extend((p as u64..(p as u64 + n).min(GROUP_LEN as u64)).map(|q| g | q));
                }
            }
            keys
        });
        prop_oneof![
            key.clone().prop_map(Op::Insert),
            run.clone().prop_map(Op::IfVacantRun),
            run.prop_map(Op::RemoveRun),
            key.clone().prop_map(Op::Vacant),
            key.clone().prop_map(Op::IfVacant),
            key.prop_map(Op::Remove),
        ]
    }

    /// A new slot for each key of `run`, in order, its entry's key
    /// recorded in `slot_keys` (a slot is its index there).
    fn new_slots(slot_keys: &mut Vec<u64>, run: &[u64]) -> Vec<u32> {
        run.iter()
            .map(|&k| {
                slot_keys.push(k);
                (slot_keys.len() - 1) as u32
            })
            .collect()
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
                    Op::IfVacant(k) => {
                        slot_keys.push(k);
                        let s = (slot_keys.len() - 1) as u32;
                        let had = model.get(&k).copied();
                        prop_assert_eq!(m.insert_if_vacant(k, s, |s: u32| slot_keys[s as usize]), had);
                        if had.is_none() {
                            model.insert(k, s);
                            changes += 1;
                        }
                    }
                    Op::IfVacantRun(run) => {
                        let slots = new_slots(&mut slot_keys, &run);
                        let mut expect = Vec::new();
                        for (j, (&k, &s)) in run.iter().zip(&slots).enumerate() {
                            match model.get(&k) {
                                Some(&had) => expect.push((j, had)),
                                None => {
                                    model.insert(k, s);
                                    changes += 1;
                                }
                            }
                        }
                        let mut got = Vec::new();
                        m.insert_run_if_vacant(&run, &slots, |s: u32| slot_keys[s as usize], |j, s| got.push((j, s)));
                        prop_assert_eq!(got, expect);
                    }
                    Op::RemoveRun(run) => {
                        let had = run.iter().filter(|&k| model.remove(k).is_some()).count();
                        prop_assert_eq!(m.remove_run(&run, |s: u32| slot_keys[s as usize]), had);
                        changes += had as u64;
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
                prop_assert!(m.used * LOAD_DEN <= m.cells.len() * LOAD_NUM);
                prop_assert_eq!(m.used, m.cells.iter().filter(|c| c.1 != EMPTY).count());
                prop_assert_eq!(m.groups.len() - m.free_groups.len(), m.cells.iter().filter(|c| c.1 != EMPTY && c.1 & GROUP_CELL != 0).count());
                // A placed group has keys, as many as its record's places
                // taken (its last removal frees it).
                for c in m.cells.iter().filter(|c| c.1 != EMPTY && c.1 & GROUP_CELL != 0) {
                    let g = &m.groups[(c.1 & !GROUP_CELL) as usize];
                    prop_assert!(g.len > 0);
                    prop_assert_eq!(g.len as usize, g.slots.iter().filter(|&&s| s != EMPTY).count());
                }
            }
            for (&k, &s) in &model {
                prop_assert_eq!(m.get(k, |s: u32| slot_keys[s as usize]), Some(s));
            }
            let mut all: Vec<(u64, u32)> = m.values().map(|s| (slot_keys[s as usize], s)).collect();
            all.sort_unstable();
            prop_assert_eq!(all, model.into_iter().collect::<Vec<_>>());
        }
    }

    proptest! {
        /// A run inserted or removed at once leaves the map exactly as the
        /// same keys one at a time do: the same cells, records, counts and
        /// group last found, the same answers on the way; and the group
        /// last found is always a live record of that group.
        #[test]
        fn a_run_leaves_the_map_as_its_keys_one_by_one_do(ops in prop::collection::vec(op(), 0..250)) {
            let (mut runs, mut one_by_one) = (KeyMap::default(), KeyMap::default());
            let mut slot_keys: Vec<u64> = Vec::new();
            for op in ops {
                // The keys the op names, to look up as group runs after it.
                let probe = match &op {
                    Op::IfVacantRun(run) | Op::RemoveRun(run) => run.clone(),
                    &(Op::Insert(k) | Op::IfVacant(k) | Op::Vacant(k) | Op::Remove(k)) => vec![k],
                };
                match op {
                    Op::IfVacantRun(run) => {
                        let slots = new_slots(&mut slot_keys, &run);
                        let mut got = Vec::new();
                        runs.insert_run_if_vacant(&run, &slots, |s: u32| slot_keys[s as usize], |j, s| got.push((j, s)));
                        let mut expect = Vec::new();
                        for (j, (&k, &s)) in run.iter().zip(&slots).enumerate() {
                            if let Some(had) = one_by_one.insert_if_vacant(k, s, |s: u32| slot_keys[s as usize]) {
                                expect.push((j, had));
                            }
                        }
                        prop_assert_eq!(got, expect);
                    }
                    Op::RemoveRun(run) => {
                        let removed = runs.remove_run(&run, |s: u32| slot_keys[s as usize]);
                        let expect = run.iter().filter(|&&k| one_by_one.remove(k, |s: u32| slot_keys[s as usize]).is_some()).count();
                        prop_assert_eq!(removed, expect);
                    }
                    Op::Insert(k) | Op::IfVacant(k) | Op::Vacant(k) => {
                        slot_keys.push(k);
                        let s = (slot_keys.len() - 1) as u32;
                        prop_assert_eq!(runs.insert_if_vacant(k, s, |s: u32| slot_keys[s as usize]), one_by_one.insert_if_vacant(k, s, |s: u32| slot_keys[s as usize]));
                    }
                    Op::Remove(k) => {
                        prop_assert_eq!(runs.remove(k, |s: u32| slot_keys[s as usize]), one_by_one.remove(k, |s: u32| slot_keys[s as usize]));
                    }
                }
                prop_assert_eq!(format!("{runs:?}"), format!("{one_by_one:?}"));
                // A group's run from any of its keys: the slots of the keys
                // from there, up to the first the map lacks.
                for &k in probe.iter().filter(|&&k| k & GROUPED != 0) {
                    // To the group's end, and a shorter run.
                    let rest = GROUP_LEN - KeyMap::split(k).1;
                    for n in [rest, rest / 2] {
                        let want: Vec<u32> = (0..n as u64)
                            .map_while(|d| one_by_one.get(k + d, |s: u32| slot_keys[s as usize]))
                            .collect();
                        let mut got = vec![EMPTY];
                        prop_assert_eq!(runs.get_group_run(k, n, &mut got), want.len());
                        prop_assert_eq!(&got[1..], &want[..]);
                    }
                }
                let (id, index) = runs.last.get();
                if id != 0 {
                    let g = &runs.groups[index as usize];
                    prop_assert!(!runs.free_groups.contains(&index) && g.id == id && g.len > 0);
                }
            }
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
