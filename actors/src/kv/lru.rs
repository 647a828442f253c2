//! The pool's cached entries and their eviction order: a slab of
//! [`Entry`], the unpinned ones in the order they were unpinned (the head
//! least recently), so that unpinning, re-pinning and evicting are O(1)
//! (amortised: stale items are passed or compacted away later).
//!
//! The order is a ring of slot numbers with lazy removal, not a linked
//! list. An entry on it records its position in the ring, and the item
//! there is marked live; a pin takes the entry off by clearing the mark,
//! and the ring keeps the item, stale, until the head passes it or the
//! ring is compacted (when stale items far outnumber live ones). Stale
//! items are told by their mark alone, so passing or dropping one reads no
//! entry. Eviction reads the ring front to back, so the entries it will
//! take next are known many evictions ahead and can be fetched together
//! ([`Lru::pop_run`] takes a run of them at once). A linked list gives its next entry only once
//! the current one has arrived: on a trace whose cache holds more than the
//! processor's caches (the Mooncake conversation trace), each eviction
//! waited for one entry after another, and eviction was a third of the
//! run.
//!
//! The head and the tail of the ring are always live entries (or the ring
//! is empty), so both ends read as the order's.

use super::keymap::{prefetch_index, prefetch_read};
use super::pool::Kind;

/// The position of the first entry put on an empty order: room for
/// 2^62 entries put back at the head (undone evictions) and as many
/// appended, so positions never run out.
/// (Tests start three items short of a 2^32 boundary: an entry keeps its
/// position's low 32 bits only, [`Lru::position`].)
const FIRST: u64 = if cfg!(test) { (1 << 62) + (1 << 32) - 3 } else { 1 << 62 };

/// Items of the first ring (it grows by doubling; tests start smaller, so
/// that short sequences wrap and grow).
const FIRST_RING: usize = if cfg!(test) { 4 } else { 64 };

/// The ring is compacted once it holds more than `SPAN` times as many
/// items as live ones, plus [`SLACK`]. A compaction renumbers the live
/// items' entries, `1 / (SPAN - 1)` entry writes a stale item dropped.
const SPAN: u64 = 4;

/// The mark of a live item (slot numbers stay below it).
const LIVE: u32 = 1 << 31;

/// Stale items the ring may hold beyond [`SPAN`] times its live ones
/// before it is compacted. (Tests take less, so that short sequences
/// compact.)
const SLACK: usize = if cfg!(test) { 2 } else { 64 };

/// How many items ahead of its writes a compaction fetches their entries.
const COMPACT_AHEAD: u64 = 16;

/// How far behind the item it takes [`Lru::pop_run`] fetches entries.
const POP_AHEAD: u64 = 32;

/// A cached entry, in the slab: 16 bytes, four to a cache line. (On the
/// Mooncake conversation trace, 16 bytes took a fifth less time than 32,
/// and 64 a third more than 32, by medians of paired runs: each block's
/// entry is written when it is registered, and read and written when it
/// is unpinned and when it is evicted, long apart, so the slab, as large
/// as the pool's cache, streams through the processor's caches three
/// times a block.)
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    /// Its cache key (to remove it from the key map when evicted); a
    /// nameless run's blocks.
    key: u64,
    /// Requests pinning it in the low bits ([`REFS`]; while zero it is on
    /// the order), and above them ([`TAG_SHIFT`]) what it caches: a
    /// [`Kind`] (one block in each full-attention group, one in each
    /// aligned state group, or one in one cached window group) or
    /// [`NAMELESS`].
    word: u32,
    /// Its position in the ring while on the order, the low 32 bits
    /// ([`Lru::position`] restores the rest: the ring holds fewer than 2^32
    /// items). Stale while it is off the order.
    at: u32,
}

/// The bits of [`Entry::word`] counting pins.
const REFS: u32 = (1 << TAG_SHIFT) - 1;

/// Where [`Entry::word`]'s tag starts.
const TAG_SHIFT: u32 = 30;

/// The tag of a nameless run: this many cached blocks (its `key`) no
/// lookup can name (a finished request's own and generated content),
/// keeping their place in the eviction order; no key, never pinned. It is
/// no [`Kind`]'s, so that one comparison tells an entry of a kind from the
/// rest.
const NAMELESS: u32 = 3;

const _: () = assert!(std::mem::size_of::<Entry>() == 16);
const _: () =
    assert!((Kind::Full as u32) < NAMELESS && (Kind::State as u32) < NAMELESS && (Kind::Window as u32) < NAMELESS);

impl Entry {
    #[inline(always)]
    fn named(key: u64, kind: Kind, refs: u32) -> Entry {
        Entry { key, word: (kind as u32) << TAG_SHIFT | refs, at: 0 }
    }

    #[inline]
    fn nameless_run(blocks: u64) -> Entry {
        debug_assert!(blocks > 0, "a nameless run holds blocks");
        Entry { key: blocks, word: NAMELESS << TAG_SHIFT, at: 0 }
    }

    /// The tag: a [`Kind`] as a number, or [`NAMELESS`].
    #[inline(always)]
    fn tag(&self) -> u32 {
        self.word >> TAG_SHIFT
    }

    /// Requests pinning it.
    #[inline(always)]
    pub(super) fn refs(&self) -> u32 {
        self.word & REFS
    }

    /// Its cache key (0 for a nameless run).
    #[inline(always)]
    pub(super) fn key(&self) -> u64 {
        if self.tag() == NAMELESS { 0 } else { self.key }
    }

    /// What it caches (a nameless run caches full-attention blocks).
    #[inline]
    pub(super) fn kind(&self) -> Kind {
        const STATE: u32 = Kind::State as u32;
        const WINDOW: u32 = Kind::Window as u32;
        match self.tag() {
            STATE => Kind::State,
            WINDOW => Kind::Window,
            _ => Kind::Full,
        }
    }

    /// A nameless run's blocks (0 for a named entry).
    #[inline(always)]
    pub(super) fn nameless(&self) -> u64 {
        if self.tag() == NAMELESS { self.key } else { 0 }
    }
}

/// The ring's items indexed by position: `p` masked to the ring's length,
/// a power of two. The length is checked to be a power of two (so not
/// zero) once, when a loop
/// takes the view, so that the compiler sees every masked index is inside
/// the ring and no access in the loop checks its bounds.
struct Masked<'a> {
    items: &'a mut [u32],
    mask: usize,
}

impl<'a> Masked<'a> {
    #[inline(always)]
    fn new(items: &'a mut [u32]) -> Self {
        assert!(items.len().is_power_of_two(), "the ring is a power of two long");
        let mask = items.len() - 1;
        Masked { items, mask }
    }

    #[inline(always)]
    fn get(&self, p: u64) -> u32 {
        self.items[p as usize & self.mask]
    }

    #[inline(always)]
    fn set(&mut self, p: u64, v: u32) {
        self.items[p as usize & self.mask] = v;
    }

    /// Whether the item at position `p` is live.
    #[inline(always)]
    fn live(&self, p: u64) -> bool {
        self.get(p) & LIVE != 0
    }

    /// The ring's ends `front..end` once the item at `at` between them is
    /// unmarked: past the stale items it leaves at either end.
    #[inline(always)]
    fn ends_without(&self, at: u64, mut front: u64, mut end: u64) -> (u64, u64) {
        if at == front {
            while front < end && !self.live(front) {
                front += 1;
            }
        } else if at + 1 == end {
            while front < end && !self.live(end - 1) {
                end -= 1;
            }
        }
        (front, end)
    }
}

/// What [`Lru::put_front`] puts back.
#[derive(Clone, Copy, Debug)]
pub(super) enum Back {
    Named { key: u64, kind: Kind },
    Nameless { blocks: u64 },
}

/// The slab and the order (see the module's documentation).
#[derive(Clone, Debug)]
pub(super) struct Lru {
    slots: Vec<Entry>,
    /// Free slots, the last freed on top.
    free_slots: Vec<u32>,
    /// Slots in order: the item at position `p` (`front <= p < end`) is
    /// `ring[p & mask]`, the slot, marked [`LIVE`] while its entry is on
    /// the order at `p`. A power of two long.
    ring: Vec<u32>,
    mask: u64,
    /// The head's position.
    front: u64,
    /// The position after the tail's.
    end: u64,
    /// Entries on the order.
    len: usize,
}

impl Default for Lru {
    fn default() -> Self {
        Lru {
            slots: Vec::new(),
            free_slots: Vec::new(),
            ring: vec![0; FIRST_RING],
            mask: FIRST_RING as u64 - 1,
            front: FIRST,
            end: FIRST,
            len: 0,
        }
    }
}

impl Lru {
    /// The slab, for the key map's lookups (an entry's key by slot).
    #[inline]
    pub(super) fn slots(&self) -> &[Entry] {
        &self.slots
    }

    /// The entry in slot `i`.
    #[inline]
    pub(super) fn get(&self, i: u32) -> &Entry {
        &self.slots[i as usize]
    }

    /// Entries on the order.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The head's slot.
    #[inline]
    pub(super) fn head(&self) -> Option<u32> {
        (self.front < self.end).then(|| self.item(self.front))
    }

    /// The ring seen through [`Masked`], for a loop over its items.
    #[inline(always)]
    fn masked(ring: &mut [u32]) -> Masked<'_> {
        Masked::new(ring)
    }

    /// The position whose low 32 bits an entry on the order keeps
    /// ([`Entry::at`]): the one at or after `front` (a live item's
    /// position is at or after the head's, by less than 2^32).
    #[inline(always)]
    fn position(at: u32, front: u64) -> u64 {
        front + u64::from(at.wrapping_sub(front as u32))
    }

    /// The slot of the item at position `p` (live or not).
    #[inline(always)]
    fn item(&self, p: u64) -> u32 {
        self.ring[(p & self.mask) as usize] & !LIVE
    }

    /// Whether the item at position `p` is live.
    #[inline(always)]
    fn live(&self, p: u64) -> bool {
        self.ring[(p & self.mask) as usize] & LIVE != 0
    }

    /// A new entry pinned once (not on the order).
    #[inline]
    pub(super) fn alloc(&mut self, key: u64, kind: Kind) -> u32 {
        self.alloc_entry(Entry::named(key, kind, 1))
    }

    /// [`Lru::alloc`] of an entry of `kind` under each of the keys
    /// `key(0)`, …, `key(n - 1)`, in order, their slots appended to `out`
    /// (the same slots, in the same order, as one `alloc` a key). The keys
    /// come by index, not as an iterator: zipped with the reused slots
    /// taken last first, an iterator of keys cost 4 instructions more a
    /// block (the Mooncake conversation trace).
    #[inline]
    pub(super) fn alloc_run(&mut self, n: usize, key: impl Fn(usize) -> u64, kind: Kind, out: &mut Vec<u32>) {
        let reused = n.min(self.free_slots.len());
        let from = self.free_slots.len() - reused;
        // The last freed first, as `alloc` pops them.
        let reuse = &self.free_slots[from..];
        for (j, &i) in reuse.iter().rev().enumerate() {
            self.slots[i as usize] = Entry::named(key(j), kind, 1);
        }
        out.extend(reuse.iter().rev());
        self.free_slots.truncate(from);
        for j in reused..n {
            out.push(self.alloc(key(j), kind));
        }
    }

    #[inline]
    fn alloc_entry(&mut self, e: Entry) -> u32 {
        if let Some(i) = self.free_slots.pop() {
            self.slots[i as usize] = e;
            i
        } else {
            self.slots.push(e);
            let i = u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX);
            assert!(i < LIVE, "fewer cached entries than 2^31");
            i
        }
    }

    /// Pins entry `i` once more. `Some(was the head)` when that took it off
    /// the order (its first pin).
    #[inline]
    pub(super) fn pin(&mut self, i: u32) -> Option<bool> {
        let (taken, head) = self.pin_run(std::slice::from_ref(&i));
        (taken > 0).then_some(head)
    }

    /// [`Lru::pin`] of each entry in `slots`, in order: how many that took
    /// off the order, and whether one of them was the head when it went.
    /// As [`Lru::unpin_rev`], the ring's ends stay in locals for the run;
    /// a compaction due waits for its end.
    #[inline]
    pub(super) fn pin_run(&mut self, slots: &[u32]) -> (u64, bool) {
        let (mut front, mut end, mut ring) = (self.front, self.end, Self::masked(&mut self.ring));
        let (mut taken, mut head) = (0u64, false);
        for &i in slots {
            let e = &mut self.slots[i as usize];
            assert!(e.refs() < REFS, "fewer pins of an entry than 2^30");
            debug_assert!(e.tag() != NAMELESS, "a nameless run is never pinned");
            e.word += 1;
            if e.refs() > 1 {
                continue;
            }
            let at = Self::position(e.at, front);
            debug_assert_eq!(ring.get(at), i | LIVE, "an entry taken off the order is on it");
            ring.set(at, ring.get(at) & !LIVE);
            taken += 1;
            head |= at == front;
            (front, end) = ring.ends_without(at, front, end);
        }
        self.len -= taken as usize;
        (self.front, self.end) = if front == end { (FIRST, FIRST) } else { (front, end) };
        if self.end - self.front > SPAN * self.len as u64 + SLACK as u64 {
            self.compact();
        }
        (taken, head)
    }

    /// Drops entry `i`, pinned once and so off the order, altogether: its
    /// slot is reused (a cached block that turns out not to be cached).
    #[inline]
    pub(super) fn forget(&mut self, i: u32) {
        debug_assert_eq!(self.slots[i as usize].refs(), 1, "only an entry pinned once is forgotten");
        self.slots[i as usize].word &= !REFS;
        self.free_slots.push(i);
    }

    /// Drops one pin of entry `i`; whether that put it on the order (at
    /// the tail: its last pin).
    #[inline]
    pub(super) fn unpin(&mut self, i: u32) -> bool {
        self.unpin_rev(std::slice::from_ref(&i)) > 0
    }

    #[inline]
    fn push_back(&mut self, i: u32) {
        self.reserve(1);
        let p = self.end;
        self.ring[(p & self.mask) as usize] = i | LIVE;
        self.slots[i as usize].at = p as u32;
        self.end += 1;
        self.len += 1;
    }

    /// Puts an entry back at the head, unpinned (an eviction undone); its
    /// slot.
    pub(super) fn put_front(&mut self, back: Back) -> u32 {
        let e = match back {
            Back::Named { key, kind } => Entry::named(key, kind, 0),
            Back::Nameless { blocks } => Entry::nameless_run(blocks),
        };
        self.reserve(1);
        self.front -= 1;
        let i = self.alloc_entry(Entry { at: self.front as u32, ..e });
        self.ring[(self.front & self.mask) as usize] = i | LIVE;
        self.len += 1;
        i
    }

    /// Makes room in the ring for `n` more items.
    #[inline(always)]
    fn reserve(&mut self, n: u64) {
        if self.end - self.front + n > self.ring.len() as u64 {
            self.grow(n);
        }
    }

    /// Room for `n` more items: the ring compacted if half of it is stale,
    /// and doubled (or more) if that is not room enough.
    #[cold]
    fn grow(&mut self, n: u64) {
        if (self.len as u64) * 2 <= self.end - self.front {
            self.compact();
        }
        let need = self.end - self.front + n;
        if need <= self.ring.len() as u64 {
            return;
        }
        let cells = usize::try_from(need).expect("a ring fits in memory").next_power_of_two().max(2 * self.ring.len());
        // (Entries keep their positions' low 32 bits.)
        assert!(cells as u64 <= 1 << 32, "a ring of at most 2^32 items");
        let mut ring = vec![0; cells];
        let mask = ring.len() as u64 - 1;
        for p in self.front..self.end {
            ring[(p & mask) as usize] = self.ring[(p & self.mask) as usize];
        }
        self.ring = ring;
        self.mask = mask;
    }

    /// [`Lru::unpin`] of each entry in `slots`, the last first (those left
    /// unpinned join the tail in that order); how many joined. The ring's
    /// ends are kept in locals for the run (a field updated in memory at
    /// each entry made this loop wait on its own stores).
    #[inline]
    pub(super) fn unpin_rev(&mut self, slots: &[u32]) -> u64 {
        self.reserve(slots.len() as u64);
        let (mut end, mut ring) = (self.end, Self::masked(&mut self.ring));
        // (The slab as a local slice: its start and length stay in
        // registers across the ring's stores.)
        let entries = &mut self.slots[..];
        for &i in slots.iter().rev() {
            let e = &mut entries[i as usize];
            debug_assert!(e.refs() > 0, "an entry unpinned is pinned");
            e.word -= 1;
            if e.refs() == 0 {
                e.at = end as u32;
                ring.set(end, i | LIVE);
                end += 1;
            }
        }
        let joined = end - self.end;
        self.end = end;
        self.len += joined as usize;
        joined
    }

    /// Drops the stale items, moving the live ones up to the head and
    /// renumbering their entries. (An item moves to a position at most its
    /// own, one already read, so the ring is compacted in place.)
    #[cold]
    fn compact(&mut self) {
        let mut to = self.front;
        for p in self.front..self.end {
            let ahead = p + COMPACT_AHEAD;
            if ahead < self.end && self.live(ahead) {
                prefetch_read(&self.slots[self.item(ahead) as usize]);
            }
            let raw = self.ring[(p & self.mask) as usize];
            if raw & LIVE != 0 {
                self.slots[(raw & !LIVE) as usize].at = to as u32;
                self.ring[(to & self.mask) as usize] = raw;
                to += 1;
            }
        }
        self.end = to;
        debug_assert_eq!(self.end - self.front, self.len as u64);
    }

    /// Takes the head off the order and frees its slot; the slot. The entry
    /// stays as it was in the slot ([`Lru::get`]) until the slot is reused.
    #[inline(always)]
    pub(super) fn pop_front(&mut self) -> Option<u32> {
        let i = self.head()?;
        // (As `pin_run` takes an entry off, but for its compaction check:
        // the stale items after the head are dropped as it passes them;
        // compacting is left to pins and to growing.)
        let mut ring = Self::masked(&mut self.ring);
        ring.set(self.front, ring.get(self.front) & !LIVE);
        self.len -= 1;
        let (front, end) = ring.ends_without(self.front, self.front, self.end);
        (self.front, self.end) = if front == end { (FIRST, FIRST) } else { (front, end) };
        self.free_slots.push(i);
        Some(i)
    }

    /// Takes up to `most` entries off the head as [`Lru::pop_front`] would
    /// one at a time, stopping before the first that is a nameless run or
    /// caches other than `kind` (or at the end), and appends their slots to
    /// `out` in order, and their keys to `keys` (read with the kind, from
    /// the same entry: no second pass over the entries for them). One pass:
    /// the stale items passed are skipped, and the ends and the count are
    /// written once. Returns how many it took.
    pub(super) fn pop_run(&mut self, kind: Kind, most: usize, out: &mut Vec<u32>, keys: &mut Vec<u64>) -> usize {
        let (mut front, end) = (self.front, self.end);
        let (start, key_start) = (out.len(), keys.len());
        // Written in place: room for all it may take (no more than the
        // live items), cut to what it took.
        let most = most.min(self.len);
        out.resize(start + most, 0);
        keys.resize(key_start + most, 0);
        let (room, key_room) = (&mut out[start..][..most], &mut keys[key_start..][..most]);
        let mut taken = 0;
        let ring = Self::masked(&mut self.ring);
        while taken < most && front < end {
            let raw = ring.get(front);
            if raw & LIVE != 0 {
                let i = raw & !LIVE;
                let e = &mut self.slots[i as usize];
                // (A nameless run's tag is no kind's.)
                if e.tag() != kind as u32 {
                    break;
                }
                room[taken] = i;
                key_room[taken] = e.key;
                taken += 1;
                // (Past the tail the item is whatever the ring held there,
                // a hint wasted and harmless.)
                prefetch_index(&self.slots, (ring.get(front + POP_AHEAD) & !LIVE) as usize);
            }
            front += 1;
        }
        out.truncate(start + taken);
        keys.truncate(key_start + taken);
        // The new head is live (the stale items after the last taken are
        // passed).
        while front < end && !ring.live(front) {
            front += 1;
        }
        self.len -= taken;
        (self.front, self.end) = if front == end { (FIRST, FIRST) } else { (front, end) };
        self.free_slots.extend_from_slice(&out[start..]);
        taken
    }

    /// Asks for the entry `d` items behind the head to be fetched (a hint).
    #[inline(always)]
    pub(super) fn prefetch_entry(&self, d: usize) {
        let p = self.front + d as u64;
        if p < self.end {
            prefetch_read(&self.slots[self.item(p) as usize]);
        }
    }

    /// The key of the entry `d` items behind the head (0 past the end; a
    /// hint: the item may be stale).
    #[inline(always)]
    pub(super) fn key_hint(&self, d: usize) -> u64 {
        let p = self.front + d as u64;
        if p < self.end { self.slots[self.item(p) as usize].key() } else { 0 }
    }

    /// Appends `blocks` nameless cached blocks at the tail: to the tail's
    /// run if it is one, else as a new run. The caller keeps the order's
    /// head named (`KvPool::absorb_front`).
    pub(super) fn push_nameless(&mut self, blocks: u64) {
        if self.front < self.end {
            let t = self.item(self.end - 1) as usize;
            if self.slots[t].tag() == NAMELESS {
                self.slots[t].key += blocks;
                return;
            }
        }
        let i = self.alloc_entry(Entry::nameless_run(blocks));
        self.push_back(i);
    }

    /// Whether the head is a nameless run.
    #[inline]
    pub(super) fn head_nameless(&self) -> bool {
        self.head().is_some_and(|i| self.slots[i as usize].tag() == NAMELESS)
    }

    /// The entries on the order, the head first.
    pub(super) fn order(&self) -> impl Iterator<Item = &Entry> + '_ {
        (self.front..self.end).filter(|&p| self.live(p)).map(|p| &self.slots[self.item(p) as usize])
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// A new entry, caching window blocks if true (full attention else).
        New(bool),
        /// New entries under a run of keys at once.
        NewRun(bool, usize),
        Pin(usize),
        Unpin(usize),
        UnpinRun(usize, usize),
        PinRun(usize, usize),
        Pop,
        PopRun(usize),
        PutFront,
        Nameless(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => any::<bool>().prop_map(Op::New),
            1 => (any::<bool>(), 0usize..5).prop_map(|(w, n)| Op::NewRun(w, n)),
            3 => any::<usize>().prop_map(Op::Pin),
            4 => any::<usize>().prop_map(Op::Unpin),
            2 => (any::<usize>(), 0usize..12).prop_map(|(x, n)| Op::UnpinRun(x, n)),
            2 => (any::<usize>(), 0usize..12).prop_map(|(x, n)| Op::PinRun(x, n)),
            2 => Just(Op::Pop),
            2 => (0usize..6).prop_map(Op::PopRun),
            1 => Just(Op::PutFront),
            1 => (1u64..4).prop_map(Op::Nameless),
        ]
    }

    /// The model: the order as a list of slots, and each live slot's pins.
    #[derive(Default)]
    struct Model {
        order: Vec<u32>,
        refs: std::collections::BTreeMap<u32, u32>,
        nameless: std::collections::BTreeMap<u32, u64>,
        window: std::collections::BTreeSet<u32>,
    }

    proptest! {
        /// Any sequence of pins, unpins, evictions, evictions undone and
        /// nameless runs leaves the order the one a plain list keeps: the
        /// same entries in the same order, the same head, the same answers
        /// on the way; live slots are never handed
        /// out twice. Long sequences make the ring wrap, grow and compact.
        #[test]
        fn the_ring_keeps_the_order_a_list_keeps(ops in prop::collection::vec(op(), 0..800)) {
            let mut lru = Lru::default();
            let mut m = Model::default();
            let mut next_key = 1u64;
            for op in ops {
                match op {
                    Op::New(window) => {
                        let i = lru.alloc(next_key, if window { Kind::Window } else { Kind::Full });
                        next_key += 1;
                        prop_assert!(!m.refs.contains_key(&i), "slot {} handed out twice", i);
                        m.refs.insert(i, 1);
                        m.window.remove(&i);
                        if window {
                            m.window.insert(i);
                        }
                    }
                    Op::NewRun(window, n) => {
                        let kind = if window { Kind::Window } else { Kind::Full };
                        let keys: Vec<u64> = (next_key..next_key + n as u64).collect();
                        next_key += n as u64;
                        // The slots `alloc` would hand out one key at a time.
                        let mut one_by_one = lru.clone();
                        let expect: Vec<u32> = keys.iter().map(|&k| one_by_one.alloc(k, kind)).collect();
                        let mut out = vec![u32::MAX];
                        lru.alloc_run(keys.len(), |j| keys[j], kind, &mut out);
                        prop_assert_eq!(&out[1..], &expect[..]);
                        for (&i, &k) in out[1..].iter().zip(&keys) {
                            prop_assert!(!m.refs.contains_key(&i), "slot {} handed out twice", i);
                            let e = lru.get(i);
                            prop_assert_eq!((e.key(), e.kind(), e.refs(), e.nameless()), (k, kind, 1, 0));
                            m.refs.insert(i, 1);
                            m.window.remove(&i);
                            if window {
                                m.window.insert(i);
                            }
                        }
                    }
                    Op::Pin(x) => {
                        let named: Vec<u32> = m.refs.keys().copied().filter(|i| !m.nameless.contains_key(i)).collect();
                        if named.is_empty() { continue; }
                        let i = named[x % named.len()];
                        let r = m.refs.get_mut(&i).expect("live");
                        *r += 1;
                        let expect = (*r == 1).then(|| {
                            let at = m.order.iter().position(|&s| s == i).expect("unpinned is ordered");
                            m.order.remove(at);
                            at == 0
                        });
                        prop_assert_eq!(lru.pin(i), expect);
                    }
                    Op::Unpin(x) => {
                        let pinned: Vec<u32> = m.refs.iter().filter(|&(_, &r)| r > 0).map(|(&i, _)| i).collect();
                        if pinned.is_empty() { continue; }
                        let i = pinned[x % pinned.len()];
                        let r = m.refs.get_mut(&i).expect("live");
                        *r -= 1;
                        if *r == 0 { m.order.push(i); }
                        prop_assert_eq!(lru.unpin(i), *r == 0);
                    }
                    Op::UnpinRun(x, n) => {
                        // Up to n distinct pinned entries, in some order.
                        let mut pinned: Vec<u32> = m.refs.iter().filter(|&(_, &r)| r > 0).map(|(&i, _)| i).collect();
                        if pinned.is_empty() { continue; }
                        let by = x % pinned.len();
                        pinned.rotate_left(by);
                        pinned.truncate(n);
                        let mut joined = 0;
                        for &i in pinned.iter().rev() {
                            let r = m.refs.get_mut(&i).expect("live");
                            *r -= 1;
                            if *r == 0 {
                                m.order.push(i);
                                joined += 1;
                            }
                        }
                        prop_assert_eq!(lru.unpin_rev(&pinned), joined);
                    }
                    Op::PinRun(x, n) => {
                        // Up to n distinct named entries, pinned or not.
                        let mut named: Vec<u32> = m.refs.keys().copied().filter(|i| !m.nameless.contains_key(i)).collect();
                        if named.is_empty() { continue; }
                        let by = x % named.len();
                        named.rotate_left(by);
                        named.truncate(n);
                        let (mut taken, mut head) = (0, false);
                        for &i in &named {
                            let r = m.refs.get_mut(&i).expect("live");
                            *r += 1;
                            if *r == 1 {
                                let at = m.order.iter().position(|&s| s == i).expect("unpinned is ordered");
                                m.order.remove(at);
                                taken += 1;
                                head |= at == 0;
                            }
                        }
                        prop_assert_eq!(lru.pin_run(&named), (taken, head));
                    }
                    Op::Pop => {
                        let want = (!m.order.is_empty()).then(|| m.order.remove(0));
                        let got = lru.pop_front();
                        prop_assert_eq!(got, want);
                        if let Some(i) = want {
                            m.refs.remove(&i);
                            m.nameless.remove(&i);
                        }
                    }
                    Op::PopRun(most) => {
                        // The named entries at the head of the head's kind,
                        // up to `most`.
                        let window = m.order.first().is_some_and(|i| m.window.contains(i));
                        let n = m.order.iter().take(most)
                            .take_while(|i| !m.nameless.contains_key(i) && m.window.contains(i) == window)
                            .count();
                        let want: Vec<u32> = m.order.drain(..n).collect();
                        let want_keys: Vec<u64> = want.iter().map(|&i| lru.get(i).key()).collect();
                        let (mut got, mut got_keys) = (vec![u32::MAX], vec![u64::MAX]);
                        let kind = if window { Kind::Window } else { Kind::Full };
                        prop_assert_eq!(lru.pop_run(kind, most, &mut got, &mut got_keys), n);
                        prop_assert_eq!(&got[1..], &want[..]);
                        prop_assert_eq!(&got_keys[1..], &want_keys[..]);
                        for i in want {
                            m.refs.remove(&i);
                        }
                    }
                    Op::PutFront => {
                        let i = lru.put_front(Back::Named { key: next_key, kind: Kind::Full });
                        next_key += 1;
                        prop_assert!(!m.refs.contains_key(&i), "slot {} handed out twice", i);
                        m.refs.insert(i, 0);
                        m.window.remove(&i);
                        m.order.insert(0, i);
                    }
                    Op::Nameless(b) => {
                        lru.push_nameless(b);
                        match m.order.last() {
                            Some(t) if m.nameless.contains_key(t) => *m.nameless.get_mut(t).expect("run") += b,
                            _ => {
                                let i = lru.item(lru.end - 1);
                                prop_assert!(!m.refs.contains_key(&i), "slot {} handed out twice", i);
                                m.refs.insert(i, 0);
                                m.window.remove(&i);
                                m.nameless.insert(i, b);
                                m.order.push(i);
                            }
                        }
                    }
                }
                prop_assert_eq!(lru.len(), m.order.len());
                prop_assert_eq!(lru.head(), m.order.first().copied());
                let keys: Vec<(u64, u64)> = lru.order().map(|e| (e.key(), e.nameless())).collect();
                let want: Vec<(u64, u64)> = m.order.iter().map(|&i| {
                    let e = lru.get(i);
                    (e.key(), m.nameless.get(&i).copied().unwrap_or(0))
                }).collect();
                prop_assert_eq!(keys, want);
                prop_assert!(lru.end - lru.front <= lru.ring.len() as u64);
                // The ring's ends are live, and a live item's entry knows
                // its position.
                if lru.front < lru.end {
                    prop_assert!(lru.live(lru.front) && lru.live(lru.end - 1));
                } else {
                    prop_assert_eq!((lru.front, lru.end), (FIRST, FIRST));
                }
                for p in (lru.front..lru.end).filter(|&p| lru.live(p)) {
                    prop_assert_eq!(Lru::position(lru.get(lru.item(p)).at, lru.front), p);
                }
                for (&i, &r) in &m.refs {
                    prop_assert_eq!(lru.get(i).refs(), r);
                }
            }
        }
    }
}
