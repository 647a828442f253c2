//! The KV block pool of one rank: one budget shared by every cache group,
//! as vLLM's hybrid allocator has it, with a prefix cache of full-attention
//! blocks and LRU eviction of the cached blocks no request uses.
//!
//! A request's holding is an [`Alloc`]: the token range of its current (or
//! last) step and whether the step takes checkpoint blocks. What each group
//! holds follows from that by the rules ([`rules::blocks_for_step`]): full
//! attention every block, a window group its in-window blocks (the skipped
//! ones are freed before the next allocation, as vLLM's
//! `remove_skipped_blocks` does), a state group one block (plus its
//! checkpoint blocks during the step that ends a vLLM 0.32.0 prefill).
//!
//! Prefix caching: a full-attention block whose content is named by the
//! request's [`PrefixIds`] is registered under that name once a step that
//! fills it is scheduled (vLLM caches blocks when it allocates them); a
//! later request with the same leading content pins the cached blocks
//! instead of computing them. Cached blocks no request pins stay in the pool
//! as free-but-cached and are evicted least recently used first when free
//! blocks run out (a freed request's tail first, as vLLM frees in
//! reverse). Hits are counted in whole full-attention blocks (one
//! cached entry covers the block in every full-attention group); without
//! the window cache below, the window and state blocks at the hit position
//! are allocated fresh.
//!
//! A request's blocks that its prefix ids do not name (its own prompt
//! content, its generated tokens) have keys of the request's own; they are
//! registered when it is preempted ([`KvPool::register_own`]), so that its
//! recompute hits them as vLLM's does.
//!
//! Reuse order, as vLLM's block pool (`block_pool.py` `free_blocks`):
//! freed blocks that hold no cached content are reused first (vLLM puts
//! them at the front of its free queue), cached ones are evicted least
//! recently freed first (it appends them at the back). vLLM has hashed
//! every full block of computed KV, so a finished request's own
//! full-attention blocks wait their turn in that order too: pdsim keeps
//! them as a nameless run in the LRU order ([`KvPool::release`]), a count
//! with no keys, since nothing can hit them. Nameless blocks with no named
//! entry before them are next in line and can never hit, so they are plain
//! free blocks.
//!
//! The window cache ([`Win`]): a sliding-window group's full blocks are
//! cached too, as vLLM's are: those of named content as pinned entries of
//! their own kind, registered with the full-attention ones; blocks leaving
//! the window go into the eviction order (the request's own under keys of
//! its own); a hit also needs the window blocks before its end cached
//! ([`KvPool::lookup`]), so a window-only model hits as well. Where pdsim
//! departs: other mixes of groups (a window beside a state group, windows
//! of different specs) free window blocks as plain blocks and hit on full
//! attention alone; and with several full-attention groups vLLM
//! frees group by group (own blocks then shared ones, group 0 first),
//! where one pdsim entry stands for a block in each, so all the groups'
//! own blocks go ahead of the shared entries.
//!
//! The same content computed twice (two requests that did not hit it, or
//! a landed handoff whose content another request cached meanwhile) is
//! cached twice, as vLLM's `BlockHashToBlockMap` keeps several blocks per
//! hash: each copy is freed into the eviction order by its own holders, a
//! hit pins the first, and the content stays cached until its last copy is
//! evicted.
//!
//! Evictions ahead of time: a run of decode steps planned as one event
//! takes its later steps' blocks when it starts, evicting cached blocks
//! where the plain free ones fall short ([`KvPool::resize_ahead`]). Those
//! evictions are journaled, and a cut that drops their steps puts them back
//! at the head of the LRU order in reverse ([`KvPool::undo_evictions_after`]),
//! copies in their places, so the cache is the one stepping one event at a
//! time would have. They stand only while nothing else touches the pool
//! (the public operations assert it in debug builds).
//!
//! Conservation: `private + shared + cached_free + free = num_blocks`
//! (`cached_free` counting the nameless runs).

use super::keymap::KeyMap;
use super::lru::{Back, Entry, Lru};
use crate::base::fxmap::FxHashMap;
use crate::base::keys::plain_key;
use crate::base::units::{BlockSize, Blocks, Tokens};
use crate::models::model::{CacheGroup, CacheGroupKind, block_size_lcm};
use crate::requests::workload::{PrefixIds, mix};
use crate::vllm::handoff as rules;

/// How many blocks ahead of a run of key map operations their cells are
/// fetched ([`KeyMap::prefetch`]).
pub(super) const PREFETCH_AHEAD: usize = 16;

/// Salts the keys of a request's own content (see `KvPool::key`).
const OWN_CONTENT: u64 = 0x6f77_6e5f_636f_6e74;

/// Salts the keys of cached states (align mode) from their block's key.
const STATE_ENTRY: u64 = 0x7374_6174_655f_6b65;

/// Salts the keys of cached window blocks from their position's key.
const WINDOW_ENTRY: u64 = 0x7769_6e64_6f77_5f6b;

/// Most cache groups a model may have (a pool keeps per-group counts in
/// fixed arrays on its hot path).
pub(crate) const MAX_GROUPS: usize = 16;

/// One request's holding in a pool. The pool keeps part of a holding's
/// state by its owner (the cached entries it pins), so a pool has at most
/// one holding per owner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Alloc {
    /// Tokens whose KV was present before the step.
    from: Tokens,
    /// Tokens whose KV is present after the step.
    to: Tokens,
    /// Whether the step holds the groups' checkpoint blocks.
    checkpoints: bool,
    /// Leading full-attention blocks held through the prefix cache.
    shared: u32,
    /// Blocks held for this request alone, all groups.
    private: u64,
    /// When the state is a decode step (`from + 1 == to`, no checkpoint
    /// blocks): the largest `to` whose decode step holds the same blocks in
    /// every group, so that moving there needs no accounting. Zero otherwise.
    stable_to: Tokens,
    /// The request it belongs to: names the blocks its prefix ids do not
    /// cover (its own, or generated, content) when they are cached.
    owner: u64,
    /// In align mode, how many cached state entries it pins (at most the
    /// block of the state its step starts from and the one it writes,
    /// [`KvPool::group_blocks`]); which ones, the pool keeps by owner
    /// (`KvPool::state_pins`), so that a holding stays small.
    pinned: u8,
    /// With the window cache: the window blocks `wfirst .. wfirst +
    /// wpinned` are cached entries it pins (the pool keeps their slots by
    /// owner, `KvPool::win_slots`); its other window blocks are its own.
    wfirst: u32,
    wpinned: u32,
}

impl Alloc {
    /// An empty holding for request `owner`.
    pub(crate) fn owned_by(owner: u64) -> Self {
        Alloc { owner, ..Alloc::default() }
    }
    /// Tokens covered after the current step.
    pub(crate) fn tokens(&self) -> Tokens {
        self.to
    }
    /// For a decode-step state, the largest `to` whose decode step holds the
    /// same blocks (zero for other states).
    pub(crate) fn stable_to(&self) -> Tokens {
        self.stable_to
    }
    /// Whether it holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.private == 0 && self.shared == 0 && self.pinned == 0 && self.wpinned == 0
    }

    /// Cached state entries it pins.
    fn pinned_states(&self) -> u64 {
        u64::from(self.pinned)
    }
}

/// A sequence as admission checks it: from its hit (`from`) to everything it
/// knows (`to`), with checkpoint blocks if its prefill takes them, with
/// steps of at most `in_flight` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Whole {
    /// Tokens the hit covers.
    pub from: Tokens,
    /// Tokens it knows (prompt, and output so far).
    pub to: Tokens,
    /// Whether its prefill's last step takes checkpoint blocks.
    pub checkpoints: bool,
    /// The most tokens one step computes (`max_num_batched_tokens`).
    pub in_flight: Tokens,
}

/// Not enough free blocks: how many the operation needed and had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shortfall {
    /// Blocks the operation needed.
    pub needed: u64,
    /// Blocks free or evictable.
    pub available: u64,
}

/// What a cached entry stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// One block in each full-attention group.
    Full = 0,
    /// One block in each aligned state group (align mode).
    State = 1,
    /// One block in each sliding-window group (the window cache).
    Window = 2,
}

/// The window cache: vLLM caches a sliding-window group's full blocks as
/// it does full-attention ones, frees those that leave the window into the
/// eviction order, and a hit needs the `need = cdiv(W − 1, B)` window blocks
/// before its end cached (`single_type_kv_cache_manager.py`
/// `SlidingWindowManager.find_longest_cache_hit`). pdsim keeps it when
/// every other group is a full-attention one and the window groups share
/// one window and one block size, a multiple of the full-attention
/// groups' (if any).
#[derive(Clone, Copy, Debug)]
struct Win {
    block: Tokens,
    window: Tokens,
    /// Window groups: a window entry is one block in each.
    groups: u64,
    /// Cached window blocks a hit needs before its end (at least one).
    need: u32,
    /// Window blocks a holding keeps at a block-aligned hit: `cdiv(W − 1,
    /// B)`, `need` but for a window of one token (0).
    held: u32,
}

impl Win {
    /// Window blocks skipped (freed) by a step starting at `from`.
    fn skipped(self, from: Tokens) -> u32 {
        u32::try_from(rules::skipped_blocks(from, self.window, self.block).get()).unwrap_or(u32::MAX)
    }
}

/// An eviction made for a decode step taken ahead of its time
/// ([`KvPool::resize_ahead`]), kept so that it can be undone exactly if the
/// step does not run: the entries leave the LRU order's head one at a time,
/// so putting them back at the head in reverse restores the order.
#[derive(Clone, Copy, Debug)]
enum Evicted {
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

/// The slots of the leading full-attention entries the last
/// [`KvPool::fa_hit`] found, for the request and the key map it found them
/// in: pinning that hit then needs no second lookup of its keys.
#[derive(Clone, Debug, Default)]
struct HitMemo {
    /// Owner, prompt, and the prefix ids' address and length looked up.
    of: (u64, Tokens, usize, usize),
    /// [`KeyMap::changes`] when found; `u64::MAX`: none.
    changes: u64,
    slots: Vec<u32>,
}

/// The key of the entry in a slot, for [`KeyMap`]'s lookups.
#[inline]
fn keys(slots: &[Entry]) -> impl Fn(u32) -> u64 + '_ {
    move |s| slots[s as usize].key()
}

/// The pool.
#[derive(Clone, Debug)]
pub(crate) struct KvPool {
    groups: Vec<CacheGroup>,
    /// Full-attention groups; a cached entry is one block in each.
    fa_groups: u64,
    /// Block size of the full-attention groups (prefix-cache granularity).
    fa_block: Option<Tokens>,
    /// The block size, when every group is full attention of that one
    /// size: a holding of `t` tokens is then `cdiv(t, B)` blocks in each
    /// group, which the hot paths compute without visiting the groups
    /// (and by a shift, for a power of two).
    uniform_fa: Option<BlockSize>,
    /// Hits are a multiple of this many full-attention blocks: the least
    /// common multiple of every group's block size, in them.
    hit_align: u32,
    num_blocks: u64,
    free: u64,
    private: u64,
    /// Blocks of cached entries that some request pins.
    shared: u64,
    /// Blocks of cached entries no request pins (evictable), the nameless
    /// runs' included.
    cached_free: u64,
    /// Blocks of the nameless runs in the LRU order (of `cached_free`).
    nameless: u64,
    /// Blocks in use per group: each allocation's own blocks, plus one per
    /// pinned cache entry in every group it spans (full attention, aligned
    /// states, cached windows).
    group_used: Vec<u64>,
    caching: bool,
    /// Cache key -> slot in `lru` of its first copy, the one a hit pins.
    entries: KeyMap,
    /// What the last full-attention lookup found (see [`HitMemo`]).
    hit_memo: std::cell::RefCell<HitMemo>,
    /// The later copies of a full-attention or window key, in the order
    /// they were cached (rare: see `KvPool::register_block`).
    copies: FxHashMap<u64, Vec<u32>>,
    /// By owner: the slots of the cached entries a holding's shared
    /// full-attention blocks pin, in block order (the copy each pins, and
    /// unpinning without recomputing keys). One holding per owner in a
    /// pool, as for `state_pins`.
    held_slots: FxHashMap<u64, Vec<u32>>,
    /// Emptied `held_slots` lists, for reuse.
    spare_slot_lists: Vec<Vec<u32>>,
    /// Room for the keys `register` inserts (empty between calls).
    key_scratch: Vec<u64>,
    /// Runs of one group's keys being registered, (first key, blocks).
    group_scratch: Vec<(u64, u64)>,
    /// The slots of the entries an eviction takes off the order at once,
    /// and their keys (kept for their capacity).
    evict_scratch: (Vec<u32>, Vec<u64>),
    lru: Lru,
    /// Most blocks ever in use (private + shared).
    peak_used: u64,
    /// Cached blocks evicted to make room (named ones: a nameless run's
    /// blocks become plain when the entry before them goes, uncounted).
    evicted_blocks: u64,
    /// Set while some blocks are held ahead of the step that needs them, so
    /// that they never count towards the peak.
    suspend_peak: bool,
    /// vLLM's Mamba "align" mode (a prefix-cacheable state group with
    /// prefix caching on): the state groups' block size, at whose
    /// boundaries prefill chunks end (`align::aligned_chunk`).
    align: Option<Tokens>,
    /// Aligned state groups (prefix-cacheable state groups in align mode);
    /// a cached state entry is one block in each.
    state_groups: u64,
    /// State entries registered during the step being formed (vLLM's
    /// `cached_blocks_this_step`): a hit on one waits for the next step.
    states_this_step: Vec<u64>,
    /// The schedule call `states_this_step` belongs to.
    states_call: u64,
    /// The state entries each holding that pins any does (key, block
    /// index; key 0: none), by owner.
    state_pins: FxHashMap<u64, [(u64, u32); 2]>,
    /// The window cache, if the model's groups allow it ([`Win`]).
    win: Option<Win>,
    /// By owner: the slots of the window entries a holding pins, in block
    /// order (`Alloc::wfirst ..`).
    win_slots: FxHashMap<u64, Vec<u32>>,
    /// The groups an entry of each kind spans ([`KvPool::spans_of`]).
    spans: [u16; 3],
    /// The groups that hold alike, one of each with how many there are
    /// ([`KvPool::holding_classes`]): what every group holds together is
    /// summed over these (a GLM-like model's five state groups are two).
    classes: Vec<(CacheGroup, u64)>,
    /// See [`KvPool::frees_plain_midway`].
    frees_plain_midway: bool,
    /// The evictions made for decode steps taken ahead of their time, in
    /// order ([`KvPool::resize_ahead`]); empty whenever anything but the
    /// run that made them touches the pool.
    evicted_ahead: Vec<Evicted>,
    /// The step the eviction being made is for, while `resize_ahead` runs.
    ahead_step: Option<u64>,
}

impl KvPool {
    /// A pool of `num_blocks` shared by `groups`, with or without a prefix cache.
    pub(crate) fn new(groups: Vec<CacheGroup>, num_blocks: u64, prefix_caching: bool) -> Self {
        let fa: Vec<&CacheGroup> = groups.iter().filter(|g| g.kind() == CacheGroupKind::FullAttention).collect();
        let fa_groups = fa.len() as u64;
        let fa_block = fa.first().map(|g| g.block_size());
        let caching = prefix_caching && fa_groups > 0 && fa.iter().all(|g| g.prefix_cacheable());
        let lcm = block_size_lcm(&groups).get();
        let hit_align = fa_block.map_or(1, |b| u32::try_from(lcm / b.get()).unwrap_or(u32::MAX));
        let align = groups
            .iter()
            .find(|g| prefix_caching && g.kind() == CacheGroupKind::State && g.prefix_cacheable())
            .map(|g| g.block_size());
        let state_groups = if align.is_some() {
            groups.iter().filter(|g| g.kind() == CacheGroupKind::State && g.prefix_cacheable()).count() as u64
        } else {
            0
        };
        let win = Self::window_cache(&groups, prefix_caching, caching, fa_block);
        KvPool {
            win,
            win_slots: FxHashMap::default(),
            evicted_ahead: Vec::new(),
            ahead_step: None,
            spans: Self::spans_of(&groups),
            classes: Self::holding_classes(&groups),
            frees_plain_midway: win.is_none()
                && groups
                    .iter()
                    .any(|g| matches!(g.kind(), CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution)),
            align,
            state_groups,
            states_this_step: Vec::new(),
            states_call: 0,
            state_pins: FxHashMap::default(),
            hit_align,
            group_used: vec![0; groups.len()],
            uniform_fa: fa_block
                .filter(|&b| groups.iter().all(|g| g.kind() == CacheGroupKind::FullAttention && g.block_size() == b))
                .map(BlockSize::new),
            groups,
            fa_groups,
            fa_block,
            num_blocks,
            free: num_blocks,
            private: 0,
            shared: 0,
            cached_free: 0,
            nameless: 0,
            caching,
            entries: KeyMap::default(),
            hit_memo: std::cell::RefCell::new(HitMemo { changes: u64::MAX, ..HitMemo::default() }),
            copies: FxHashMap::default(),
            held_slots: FxHashMap::default(),
            spare_slot_lists: Vec::new(),
            key_scratch: Vec::new(),
            group_scratch: Vec::new(),
            evict_scratch: (Vec::new(), Vec::new()),
            lru: Lru::default(),
            peak_used: 0,
            evicted_blocks: 0,
            suspend_peak: false,
        }
    }

    /// The window cache of a pool of `groups`: every non-full-attention
    /// group a prefix-cacheable sliding window (or a state group that opts
    /// out of prefix caching), the windows with one window and one block
    /// size, a multiple of the full-attention groups' (if any), and those
    /// cached. Otherwise none: window blocks are then freed as plain blocks
    /// and hits are taken on the full-attention groups alone (a departure
    /// from vLLM, named in the README).
    fn window_cache(
        groups: &[CacheGroup],
        prefix_caching: bool,
        caching: bool,
        fa_block: Option<Tokens>,
    ) -> Option<Win> {
        let first = groups.iter().find(|g| g.kind() == CacheGroupKind::SlidingWindow)?;
        let (block, window) = (first.block_size(), first.window()?);
        // (Groups that opt out of prefix caching, such as a tail ring, take
        // no part in hits: vLLM's coordinator skips them.)
        let same = groups.iter().filter(|g| g.kind() != CacheGroupKind::FullAttention).all(|g| {
            (g.kind() == CacheGroupKind::SlidingWindow
                && g.prefix_cacheable()
                && g.block_size() == block
                && g.window() == Some(window))
                || (g.kind() == CacheGroupKind::State && !g.prefix_cacheable())
        });
        let fa_ok = fa_block.is_none_or(|b| caching && block.get().is_multiple_of(b.get()));
        if !prefix_caching || !same || !fa_ok {
            return None;
        }
        let groups = groups.iter().filter(|g| g.kind() == CacheGroupKind::SlidingWindow).count() as u64;
        let held = u32::try_from(window.get().saturating_sub(1).div_ceil(block.get())).unwrap_or(u32::MAX);
        Some(Win { block, window, groups, need: held.max(1), held })
    }

    /// The prefix cache's block size: the full-attention groups', or with
    /// none, the window groups'.
    fn cache_block(&self) -> Tokens {
        self.fa_block.or(self.win.map(|w| w.block)).or(self.align).expect("caching needs a cacheable group")
    }

    /// Window blocks pinned by a hit of `n` blocks (0 without a window cache).
    #[inline]
    fn win_pins(&self, n: u32) -> u32 {
        self.win.map_or(0, |w| self.win_blocks(n).min(w.held))
    }

    /// The window blocks a hit of `n` cache blocks covers (a hit is a
    /// multiple of the window's block size).
    #[inline]
    fn win_blocks(&self, n: u32) -> u32 {
        match (self.win, self.fa_block) {
            (Some(w), Some(b)) => u32::try_from(u64::from(n) * b.get() / w.block.get()).unwrap_or(u32::MAX),
            _ => n,
        }
    }

    /// Window blocks per window entry (0 without a window cache).
    #[inline]
    fn wg(&self) -> u64 {
        self.win.map_or(0, |w| w.groups)
    }

    /// The budget.
    pub(crate) fn num_blocks(&self) -> u64 {
        self.num_blocks
    }
    /// Blocks in use by requests.
    pub(crate) fn used(&self) -> u64 {
        self.private + self.shared
    }
    /// Blocks free, cached-but-unpinned ones included.
    pub(crate) fn free(&self) -> u64 {
        self.free + self.cached_free
    }
    /// Blocks `alloc` holds, its share of cached blocks included.
    pub(crate) fn held_by(&self, alloc: &Alloc) -> u64 {
        alloc.private
            + u64::from(alloc.shared) * self.fa_groups
            + alloc.pinned_states() * self.state_groups
            + u64::from(alloc.wpinned) * self.wg()
    }

    /// The state entries `alloc` pins (key, block index; key 0: none).
    fn pins(&self, alloc: &Alloc) -> [(u64, u32); 2] {
        if alloc.pinned == 0 { [(0, 0); 2] } else { self.state_pins.get(&alloc.owner).copied().unwrap_or_default() }
    }

    /// Records the state entries `alloc` pins.
    fn set_pins(&mut self, alloc: &mut Alloc, pins: [(u64, u32); 2]) {
        let n = pins.iter().filter(|p| p.0 != 0).count();
        alloc.pinned = u8::try_from(n).unwrap_or(u8::MAX);
        if n == 0 {
            self.state_pins.remove(&alloc.owner);
        } else {
            self.state_pins.insert(alloc.owner, pins);
        }
    }

    /// Blocks one cached entry stands for.
    fn entry_blocks(&self, kind: Kind) -> u64 {
        match kind {
            Kind::Full => self.fa_groups,
            Kind::State => self.state_groups,
            Kind::Window => self.win.map_or(0, |w| w.groups),
        }
    }

    /// The state-group block indices the step `from..to` holds in align
    /// mode: the one it writes, and the one it starts from if that differs.
    fn state_blocks_held(&self, from: Tokens, to: Tokens) -> [Option<u32>; 2] {
        let Some(b) = self.align else { return [None, None] };
        let idx = |t: Tokens| u32::try_from(t.blocks_ceil(b).get().saturating_sub(1)).unwrap_or(u32::MAX);
        let cur = (!to.is_zero()).then(|| idx(to));
        let prev = (!from.is_zero() && from < to && from.blocks_ceil(b) != to.blocks_ceil(b)).then(|| idx(from));
        [prev, cur]
    }

    /// How many of `alloc`'s pinned state entries the step `from..to` still holds.
    fn states_kept(&self, alloc: &Alloc, from: Tokens, to: Tokens) -> u64 {
        if alloc.pinned == 0 {
            return 0;
        }
        let held = self.state_blocks_held(from, to);
        self.pins(alloc).iter().filter(|&&(k, i)| k != 0 && held.contains(&Some(i))).count() as u64
    }
    /// Blocks in use per group.
    pub(crate) fn group_used(&self) -> &[u64] {
        &self.group_used
    }
    /// Blocks kept in the prefix cache with no request pinning them that a
    /// later request could hit (the nameless runs, which wait their turn in
    /// the eviction order but never hit, not counted).
    pub(crate) fn cached_free(&self) -> u64 {
        self.cached_free - self.nameless
    }
    /// Most blocks ever in use at once.
    pub(crate) fn peak_used(&self) -> u64 {
        self.peak_used
    }
    /// Cached blocks evicted to make room.
    pub(crate) fn evicted_blocks(&self) -> u64 {
        self.evicted_blocks
    }
    /// Stops (or resumes) counting blocks in use towards the peak, while
    /// blocks are held ahead of the steps that need them.
    pub(crate) fn suspend_peak(&mut self, suspended: bool) {
        self.suspend_peak = suspended;
    }

    /// In vLLM's Mamba "align" mode, the state groups' block size.
    pub(crate) fn align(&self) -> Option<Tokens> {
        self.align
    }

    /// Plain free blocks (cached-but-unpinned ones not counted).
    pub(crate) fn free_plain(&self) -> u64 {
        self.free
    }

    /// The blocks moving `alloc` to the decode step `from..to` takes
    /// (negative: gives back); no side effects.
    #[inline]
    pub(crate) fn change_in_blocks(&self, alloc: &Alloc, from: Tokens, to: Tokens) -> i64 {
        let kept = if self.state_groups == 0 { 0 } else { self.states_kept(alloc, from, to) * self.state_groups };
        let wkept = if self.win.is_some() { self.win_step(alloc, from).0 } else { 0 };
        (self.private_need(from, to, false, alloc.shared) - kept - wkept) as i64 - alloc.private as i64
    }

    /// In align mode, whether the decode step `from..to` caches the state it
    /// writes (it ends on a block boundary) or frees a cached one `alloc`
    /// pins (into the eviction order, so not ahead of time either).
    #[inline]
    pub(crate) fn caches_state(&self, alloc: &Alloc, from: Tokens, to: Tokens) -> bool {
        let Some(sb) = self.align else { return false };
        to.get().is_multiple_of(sb.get())
            || (alloc.pinned != 0 && self.states_kept(alloc, from, to) < alloc.pinned_states())
    }

    /// The block size, if every group is full attention of that one size.
    #[inline]
    pub(crate) fn uniform_fa(&self) -> Option<Tokens> {
        self.uniform_fa.map(BlockSize::tokens)
    }

    /// Whether the pool keeps a window cache ([`Win`]).
    #[inline]
    pub(crate) fn window_cached(&self) -> bool {
        self.win.is_some()
    }

    /// With the window cache, whether moving `alloc` to a step from `from`
    /// frees window blocks (into the eviction order, so not ahead of time).
    #[inline]
    pub(crate) fn skips_cached(&self, alloc: &Alloc, from: Tokens) -> bool {
        self.win.is_some_and(|w| w.skipped(from) > w.skipped(alloc.from) && !alloc.to.is_zero())
    }

    /// Blocks of `alloc`'s own that a step from `from` frees into the
    /// eviction order (window blocks leaving the window; 0 without the
    /// window cache): they leave it but do not become plain free blocks.
    #[inline]
    pub(crate) fn cached_by_step(&self, alloc: &Alloc, from: Tokens) -> u64 {
        if self.win.is_some() { self.win_step(alloc, from).1 } else { 0 }
    }

    /// With the window cache, for `alloc` moving to a step from `from`: the
    /// blocks of the window entries it still pins, and of its own window
    /// blocks the step frees into the eviction order.
    #[inline(never)]
    fn win_step(&self, alloc: &Alloc, from: Tokens) -> (u64, u64) {
        let Some(w) = self.win else { return (0, 0) };
        let (old, new) = (w.skipped(alloc.from), w.skipped(from));
        if new <= old || alloc.to.is_zero() {
            return (u64::from(alloc.wpinned) * w.groups, 0);
        }
        let held_end = u32::try_from(alloc.to.blocks_ceil(w.block).get()).unwrap_or(u32::MAX);
        let new = new.min(held_end);
        let dropped =
            if alloc.wpinned == 0 { 0 } else { new.min(alloc.wfirst + alloc.wpinned).saturating_sub(alloc.wfirst) };
        let own = new.saturating_sub(old) - dropped;
        (u64::from(alloc.wpinned - dropped) * w.groups, u64::from(own) * w.groups)
    }

    /// How many more blocks moving `alloc` to the step `from..to` takes (0
    /// if it gives blocks back); no side effects.
    pub(crate) fn extra_needed(&self, alloc: &Alloc, from: Tokens, to: Tokens, checkpoints: bool) -> u64 {
        let kept = if self.state_groups == 0 { 0 } else { self.states_kept(alloc, from, to) * self.state_groups };
        let (wkept, cached) = if self.win.is_some() { self.win_step(alloc, from) } else { (0, 0) };
        (self.private_need(from, to, checkpoints, alloc.shared) - kept - wkept).saturating_sub(alloc.private - cached)
    }

    /// Blocks a new allocation holds for the step `from..to` after pinning
    /// `hit` cached blocks; no side effects.
    pub(crate) fn blocks_after_hit(&self, hit: u32, from: Tokens, to: Tokens, checkpoints: bool) -> u64 {
        let all = self.all_blocks(from, to, checkpoints);
        let wpins = self.win_blocks(hit) - self.win_lo(hit, from);
        all.saturating_sub(u64::from(hit) * self.fa_groups + u64::from(wpins) * self.wg())
    }

    /// With the window cache, the first window block a hit of `hit` blocks
    /// pins for a first step from `from`: of the `held` before its end,
    /// those in that step's window (a decode rank's reservation starts past
    /// its hit, and vLLM never touches the hit's blocks below the window,
    /// `add_local_computed_blocks`). `hit` without a window cache.
    #[inline]
    fn win_lo(&self, hit: u32, from: Tokens) -> u32 {
        let n = self.win_blocks(hit);
        match self.win {
            Some(w) => (n - n.min(w.held)).max(w.skipped(from)).min(n),
            None => n,
        }
    }

    /// Blocks every group holds together for an allocation state.
    #[inline]
    fn all_blocks(&self, from: Tokens, to: Tokens, checkpoints: bool) -> u64 {
        if let Some(b) = self.uniform_fa {
            // (Full attention takes no checkpoint blocks.)
            return b.blocks_ceil(to).get() * self.fa_groups;
        }
        self.all_blocks_by_group(from, to, checkpoints)
    }

    /// [`KvPool::all_blocks`], group by group: one of each class of groups
    /// that hold alike, times its groups.
    #[inline(never)]
    fn all_blocks_by_group(&self, from: Tokens, to: Tokens, checkpoints: bool) -> u64 {
        let align = self.align.is_some();
        self.classes.iter().map(|(g, n)| n * Self::group_blocks(g, align, from, to, checkpoints)).sum()
    }

    /// The groups folded into classes that hold alike for any allocation
    /// state: the same of all that [`KvPool::group_blocks`] reads (kind,
    /// block size, window, checkpoint blocks, prefix caching), in the order
    /// of their first groups.
    fn holding_classes(groups: &[CacheGroup]) -> Vec<(CacheGroup, u64)> {
        let holds =
            |g: &CacheGroup| (g.kind(), g.block_size(), g.window(), g.checkpoint_blocks(), g.prefix_cacheable());
        let mut classes: Vec<(CacheGroup, u64)> = Vec::new();
        for g in groups {
            match classes.iter_mut().find(|(c, _)| holds(c) == holds(g)) {
                Some((_, n)) => *n += 1,
                None => classes.push((g.clone(), 1)),
            }
        }
        classes
    }

    /// Classes of groups that hold alike ([`KvPool::holding_classes`]).
    #[cfg(test)]
    pub(crate) fn classes(&self) -> usize {
        self.classes.len()
    }

    /// [`KvPool::all_blocks`] over the classes and group by group, to
    /// check one against the other.
    #[cfg(test)]
    pub(crate) fn all_blocks_both_ways(&self, from: Tokens, to: Tokens, checkpoints: bool) -> (u64, u64) {
        let align = self.align.is_some();
        let each = self.groups.iter().map(|g| Self::group_blocks(g, align, from, to, checkpoints)).sum();
        (self.all_blocks(from, to, checkpoints), each)
    }

    /// Blocks one group holds for an allocation state; `align`: the pool is
    /// in vLLM's Mamba "align" mode ([`KvPool::align`]).
    ///
    /// In align mode a prefix-cacheable state group's block `p` holds the
    /// state after `(p + 1) × B` tokens, so a step that moves into a new
    /// block holds two: the block of the state it starts from and the one
    /// it writes (`single_type_kv_cache_manager.py` `MambaManager`:
    /// `allocate_new_blocks` puts the new state at `cdiv(to, B) − 1` and
    /// keeps the previous one as `last_state_block_idx`, which
    /// `remove_skipped_blocks` frees before the next step's allocation).
    /// B = 8: the step 8..13 holds 2, the steps 13..16 and 0..8 hold 1.
    #[inline]
    fn group_blocks(g: &CacheGroup, align: bool, from: Tokens, to: Tokens, checkpoints: bool) -> u64 {
        let held = rules::blocks_for_step(g, from, to, checkpoints).get();
        if align && g.kind() == CacheGroupKind::State && g.prefix_cacheable() && Self::moves_block(g, from, to) {
            held + 1
        } else {
            held
        }
    }

    /// Whether the step `from..to` ends in another block of `g` than the
    /// one holding the state it starts from (none at 0).
    #[inline]
    fn moves_block(g: &CacheGroup, from: Tokens, to: Tokens) -> bool {
        let b = g.block_size();
        !from.is_zero() && from < to && from.blocks_ceil(b) != to.blocks_ceil(b)
    }

    /// Total private blocks for a state with `shared` cached leading blocks.
    fn private_need(&self, from: Tokens, to: Tokens, checkpoints: bool, shared: u32) -> u64 {
        let all = self.all_blocks(from, to, checkpoints);
        all - u64::from(shared) * self.fa_groups
    }

    /// Blocks a request holds, at the least, during a step that ends with
    /// `tokens` computed (no hit; the step computing one token, so a window
    /// group holds only its in-window blocks; with `checkpoints`, the
    /// groups' checkpoint blocks too). A lower bound of what reaching
    /// `tokens` needs: a request above the pool's budget can never fit.
    pub(crate) fn blocks_needed(&self, tokens: Tokens, checkpoints: bool) -> u64 {
        if tokens.is_zero() {
            return 0;
        }
        self.private_need(tokens - Tokens::new(1), tokens, checkpoints, 0)
    }

    #[inline]
    fn take(&mut self, n: u64, evict: bool) -> Result<(), Shortfall> {
        if n <= self.free {
            self.free -= n;
            return Ok(());
        }
        self.take_evicting(n, evict)
    }

    /// A holding of `held` private blocks moving to `need`: takes the
    /// growth ([`KvPool::take`]) or frees the rest.
    #[inline]
    fn take_or_free(&mut self, held: u64, need: u64, evict: bool) -> Result<(), Shortfall> {
        if need > held {
            self.take(need - held, evict)
        } else {
            self.free += held - need;
            Ok(())
        }
    }

    /// [`KvPool::take`] short of plain free blocks: evicts from the head
    /// of the eviction order, if `evict` and there are enough.
    #[inline(never)]
    fn take_evicting(&mut self, n: u64, evict: bool) -> Result<(), Shortfall> {
        let available = if evict { self.free + self.cached_free } else { self.free };
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
                if let Some(step) = self.ahead_step {
                    self.evicted_ahead.extend(gone.iter().map(|&key| Evicted::Named { step, key, kind, copy: None }));
                }
            } else {
                for (j, (&i, &key)) in run.iter().zip(&gone).enumerate() {
                    if let Some(&ahead) = gone.get(j + PREFETCH_AHEAD) {
                        self.entries.prefetch(ahead);
                    }
                    let copy = self.forget_copy(key, i);
                    if let Some(step) = self.ahead_step {
                        self.evicted_ahead.push(Evicted::Named { step, key, kind, copy });
                    }
                }
            }
            let blocks = taken * each;
            self.cached_free -= blocks;
            self.free += blocks;
            self.evicted_blocks += blocks;
            self.absorb_front();
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
    fn forget_copy(&mut self, key: u64, i: u32) -> Option<usize> {
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
    fn absorb_front(&mut self) {
        if self.lru.head_nameless() {
            self.absorb_front_runs();
        }
    }

    /// [`KvPool::absorb_front`]'s work, kept out of line.
    #[inline(never)]
    fn absorb_front_runs(&mut self) {
        while self.lru.head_nameless() {
            let i = self.lru.pop_front().expect("a head");
            let blocks = self.lru.get(i).nameless();
            if let Some(step) = self.ahead_step {
                self.evicted_ahead.push(Evicted::Nameless { step, blocks });
            }
            self.cached_free -= blocks;
            self.nameless -= blocks;
            self.free += blocks;
        }
    }

    /// Caches `blocks` nameless blocks just freed: at the LRU order's tail,
    /// or, with no named entry to wait behind, as plain free blocks.
    fn free_nameless(&mut self, blocks: u64) {
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

    /// Records the blocks in use now as the peak if they exceed it (unless
    /// suspended while blocks are held ahead of the steps that need them).
    pub(crate) fn note_peak(&mut self) {
        if !self.suspend_peak {
            self.peak_used = self.peak_used.max(self.private + self.shared);
        }
    }

    /// Records `used` blocks in use (at a moment read earlier, while the
    /// counts were the stepping ones) as the peak if it exceeds it.
    pub(crate) fn note_peak_of(&mut self, used: u64) {
        self.peak_used = self.peak_used.max(used);
    }

    /// Moves `alloc` to the step `from..to` (with or without checkpoint
    /// blocks), taking or returning private blocks. On a shortfall nothing
    /// changes but what vLLM frees before it checks the free blocks (and
    /// keeps freed): window blocks leaving the window with the window
    /// cache, in align mode the state the step no longer needs.
    pub(crate) fn resize(
        &mut self,
        alloc: &mut Alloc,
        from: Tokens,
        to: Tokens,
        checkpoints: bool,
    ) -> Result<(), Shortfall> {
        debug_assert!(self.evicted_ahead.is_empty(), "the pool touched while evictions made ahead stand");
        self.resize_inner(alloc, from, to, checkpoints, true)
    }

    /// [`KvPool::resize`] from plain free blocks only: never evicts a cached
    /// block (and leaves the peak alone), so that taking blocks ahead of the
    /// step that needs them can be undone exactly (the decoding set never
    /// takes ahead a step that frees blocks into the eviction order).
    #[inline]
    pub(crate) fn resize_from_free(&mut self, alloc: &mut Alloc, from: Tokens, to: Tokens) -> Result<(), Shortfall> {
        self.resize_inner(alloc, from, to, false, false)
    }

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
        self.ahead_step = Some(n);
        let result = self.resize_inner(alloc, from, to, false, true);
        self.ahead_step = None;
        result
    }

    /// Whether a request's holding can give blocks back to the plain free
    /// ones as it goes on (window and convolution groups without the window
    /// cache free the blocks that leave the window as plain blocks). Then
    /// the order in which one step's holdings change decides how many
    /// cached blocks it evicts, so only stepping one by one evicts right.
    #[inline]
    pub(crate) fn frees_plain_midway(&self) -> bool {
        self.frees_plain_midway
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
        while let Some(&ev) = self.evicted_ahead.last() {
            if ev.step() <= step {
                break;
            }
            self.evicted_ahead.pop();
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
        self.evicted_ahead.clear();
    }

    /// The evictions made ahead are now those of steps that ran.
    pub(crate) fn commit_evictions(&mut self) {
        self.evicted_ahead.clear();
    }

    #[inline(always)]
    fn resize_inner(
        &mut self,
        alloc: &mut Alloc,
        from: Tokens,
        to: Tokens,
        checkpoints: bool,
        evict: bool,
    ) -> Result<(), Shortfall> {
        let decode_step = from + Tokens::new(1) == to && !checkpoints;
        if decode_step && to >= alloc.to && to <= alloc.stable_to {
            // The next decode step holds what this one holds (most steps).
            (alloc.from, alloc.to) = (from, to);
            return Ok(());
        }
        if let Some(b) = self.uniform_fa {
            // cdiv(t, B) blocks in every group (no window pins): the hot
            // path of full-attention models, inline.
            let (new, old) = (b.blocks_ceil(to).get(), b.blocks_ceil(alloc.to).get());
            let need = (new - u64::from(alloc.shared)) * self.fa_groups;
            self.take_or_free(alloc.private, need, evict)?;
            let d = std::iter::repeat(new as i64 - old as i64);
            self.commit_resize(alloc, (from, to), checkpoints, need, d, decode_step, evict);
            Ok(())
        } else if let Some(w) = self.win {
            self.resize_win(w, alloc, (from, to), checkpoints, evict, decode_step)
        } else if self.align.is_none() {
            self.resize_plain(alloc, (from, to), checkpoints, evict, decode_step)
        } else {
            self.resize_aligned(alloc, (from, to), checkpoints, evict, decode_step)
        }
    }

    /// [`KvPool::resize_inner`] in align mode: state entries pinned and
    /// unpinned too. On a shortfall the state the step no longer needs is
    /// freed all the same (into the eviction order if cached): vLLM's
    /// `allocate_slots` runs `remove_skipped_blocks` (`last_state_block_idx`)
    /// before it checks the free blocks, and a preemption then frees the
    /// rest after it.
    #[inline(never)]
    fn resize_aligned(
        &mut self,
        alloc: &mut Alloc,
        (from, to): (Tokens, Tokens),
        checkpoints: bool,
        evict: bool,
        decode_step: bool,
    ) -> Result<(), Shortfall> {
        let result = self.resize_aligned_once(alloc, (from, to), checkpoints, evict, decode_step);
        if result.is_err() && evict && from == alloc.to && self.state_blocks_held(alloc.from, alloc.to)[0].is_some() {
            self.resize_aligned_once(alloc, (from, from), false, evict, false).expect("giving blocks back fits");
        }
        result
    }

    /// [`KvPool::resize_aligned`]'s move, all or nothing.
    fn resize_aligned_once(
        &mut self,
        alloc: &mut Alloc,
        (from, to): (Tokens, Tokens),
        checkpoints: bool,
        evict: bool,
        decode_step: bool,
    ) -> Result<(), Shortfall> {
        // Per group, what the new state holds and the change from the old.
        let mut all = 0u64;
        let mut deltas = [0i64; MAX_GROUPS];
        let align = true;
        // Cached state entries it pins: those the new state no longer holds
        // are unpinned first, as vLLM frees them (`remove_skipped_blocks`)
        // before it allocates.
        let (mut dropped, mut old_pinned, mut kept) = ([0u64; 2], 0, 0);
        if alloc.pinned != 0 {
            let held = self.state_blocks_held(from, to);
            for (d, &(k, i)) in dropped.iter_mut().zip(&self.pins(alloc)) {
                if k != 0 && !held.contains(&Some(i)) {
                    *d = k;
                }
            }
            old_pinned = alloc.pinned_states();
            kept = old_pinned - dropped.iter().filter(|&&k| k != 0).count() as u64;
        }
        for (i, g) in self.groups.iter().enumerate() {
            let new = Self::group_blocks(g, align, from, to, checkpoints);
            let old = Self::group_blocks(g, align, alloc.from, alloc.to, alloc.checkpoints);
            all += new;
            deltas[i] = new as i64 - old as i64;
        }
        if old_pinned != kept {
            // Pinned entries count once, through their pins.
            for (d, g) in deltas.iter_mut().zip(&self.groups) {
                if g.kind() == CacheGroupKind::State && g.prefix_cacheable() {
                    *d += (old_pinned - kept) as i64;
                }
            }
        }
        let need = all - u64::from(alloc.shared) * self.fa_groups - kept * self.state_groups;
        if old_pinned == kept {
            if need > alloc.private {
                self.take(need - alloc.private, evict)?;
            } else {
                self.free += alloc.private - need;
            }
        } else {
            for &k in dropped.iter().filter(|&&k| k != 0) {
                self.unref(k);
            }
            if need > alloc.private
                && let Err(e) = self.take(need - alloc.private, evict)
            {
                for &k in dropped.iter().filter(|&&k| k != 0) {
                    self.ref_entry(k);
                }
                return Err(e);
            }
            if need <= alloc.private {
                self.free += alloc.private - need;
            }
            let mut pins = self.pins(alloc);
            for (slot, d) in pins.iter_mut().zip(dropped) {
                if d != 0 {
                    *slot = (0, 0);
                }
            }
            self.set_pins(alloc, pins);
        }
        self.commit_resize(alloc, (from, to), checkpoints, need, deltas, decode_step, evict);
        Ok(())
    }

    /// [`KvPool::resize_inner`] outside align mode (no state entries): the
    /// hot path of every other model, kept apart.
    #[inline(never)]
    fn resize_plain(
        &mut self,
        alloc: &mut Alloc,
        (from, to): (Tokens, Tokens),
        checkpoints: bool,
        evict: bool,
        decode_step: bool,
    ) -> Result<(), Shortfall> {
        let mut all = 0u64;
        let mut deltas = [0i64; MAX_GROUPS];
        for (i, g) in self.groups.iter().enumerate() {
            let new = rules::blocks_for_step(g, from, to, checkpoints).get();
            let old = rules::blocks_for_step(g, alloc.from, alloc.to, alloc.checkpoints).get();
            all += new;
            deltas[i] = new as i64 - old as i64;
        }
        let need = all - u64::from(alloc.shared) * self.fa_groups - u64::from(alloc.wpinned) * self.wg();
        self.take_or_free(alloc.private, need, evict)?;
        self.commit_resize(alloc, (from, to), checkpoints, need, deltas, decode_step, evict);
        Ok(())
    }

    /// [`KvPool::resize_inner`] with the window cache: the window blocks the
    /// step skips are freed into the eviction order first, and stay freed
    /// if the rest does not fit (vLLM's `allocate_slots` calls
    /// `remove_skipped_blocks` before it checks the free blocks); then the
    /// growth is all or nothing.
    #[inline(never)]
    fn resize_win(
        &mut self,
        w: Win,
        alloc: &mut Alloc,
        (from, to): (Tokens, Tokens),
        checkpoints: bool,
        evict: bool,
        decode_step: bool,
    ) -> Result<(), Shortfall> {
        if self.skips_cached(alloc, from) {
            debug_assert!(from <= alloc.to.max(alloc.stable_to), "a step starts inside what its holding covers");
            self.skip_window(w, alloc, from, false);
        }
        debug_assert!(
            w.skipped(from) >= w.skipped(alloc.from),
            "window blocks freed into the cache are not taken back"
        );
        // Then as any other model (its pins are kept).
        self.resize_plain(alloc, (from, to), checkpoints, evict, decode_step)
    }

    /// Frees `alloc`'s window blocks below the window of a step from
    /// `from` into the eviction order, the last first (vLLM's
    /// `_remove_blocks_in_range` frees them backwards, all hashed): its
    /// own under keys of its own (its recompute after a preemption may hit
    /// them), or with `nameless` as a nameless run (a finished prefill's,
    /// never computed again), then the entries it pins. Its holding then
    /// starts at `from`.
    fn skip_window(&mut self, w: Win, alloc: &mut Alloc, from: Tokens, nameless: bool) {
        // A decoding holding kept its state while its blocks stayed the same
        // (`stable_to`): its blocks are those of the step ending at `from`.
        alloc.to = alloc.to.max(from);
        let old = w.skipped(alloc.from);
        let held_end = u32::try_from(alloc.to.blocks_ceil(w.block).get()).unwrap_or(u32::MAX);
        let new = w.skipped(from).min(held_end);
        let pin_end = alloc.wfirst + alloc.wpinned;
        let pinned = |i: u32| alloc.wpinned > 0 && i >= alloc.wfirst && i < pin_end;
        let own = (old..new).filter(|&i| !pinned(i)).count() as u64;
        if nameless {
            self.free_nameless(own * w.groups);
        } else {
            for i in (old..new).rev().filter(|&i| !pinned(i)) {
                // (As `win_key` makes it for content no prefix id names.)
                let end = Tokens::new((u64::from(i) + 1) * w.block.get());
                let k = plain_key(mix(
                    Self::key_at(&PrefixIds::none(), Tokens::ZERO, alloc.owner, end, w.block),
                    WINDOW_ENTRY,
                ));
                let slot = self.new_entry(k, Kind::Window);
                self.lru.unpin(slot);
            }
            self.cached_free += own * w.groups;
        }
        self.private -= own * w.groups;
        alloc.private -= own * w.groups;
        for (i, g) in self.groups.iter().enumerate() {
            if g.kind() == CacheGroupKind::SlidingWindow {
                self.group_used[i] -= own;
            }
        }
        let dropped = if alloc.wpinned == 0 { 0 } else { new.min(pin_end).saturating_sub(alloc.wfirst) };
        if dropped > 0 {
            let mut slots =
                self.win_slots.remove(&alloc.owner).expect("a holding pinning window entries has their slots");
            self.unref_slots_rev(&slots[..dropped as usize], Kind::Window);
            slots.drain(..dropped as usize);
            alloc.wfirst += dropped;
            alloc.wpinned -= dropped;
            self.put_win_slots(alloc.owner, slots);
        }
        alloc.from = from;
        alloc.stable_to = Tokens::ZERO;
    }

    /// Drops every pin `alloc` holds on window entries, the last block first.
    fn unpin_window(&mut self, alloc: &mut Alloc) {
        if alloc.wpinned == 0 {
            return;
        }
        let mut slots = self.win_slots.remove(&alloc.owner).expect("a holding pinning window entries has their slots");
        self.unref_slots_rev(&slots, Kind::Window);
        slots.clear();
        self.spare_slot_lists.push(slots);
        alloc.wpinned = 0;
    }

    /// Puts back a holding's window slot list.
    fn put_win_slots(&mut self, owner: u64, slots: Vec<u32>) {
        if slots.is_empty() {
            self.spare_slot_lists.push(slots);
        } else {
            self.win_slots.insert(owner, slots);
        }
    }

    /// Takes a holding's window slot list out of the map (a spare one if it
    /// pins none).
    fn take_win_slots(&mut self, alloc: &Alloc) -> Vec<u32> {
        if alloc.wpinned == 0 {
            self.spare_slot_lists.pop().unwrap_or_default()
        } else {
            self.win_slots.remove(&alloc.owner).expect("a holding pinning window entries has their slots")
        }
    }

    /// The end of a resize both forms share: the groups' counts, the
    /// private count and the holding's new span (`need` private blocks).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn commit_resize(
        &mut self,
        alloc: &mut Alloc,
        (from, to): (Tokens, Tokens),
        checkpoints: bool,
        need: u64,
        deltas: impl IntoIterator<Item = i64>,
        decode_step: bool,
        evict: bool,
    ) {
        for (used, d) in self.group_used.iter_mut().zip(deltas) {
            *used = used.checked_add_signed(d).expect("a group's count stays >= 0");
        }
        self.private = self.private + need - alloc.private;
        (alloc.from, alloc.to, alloc.checkpoints, alloc.private) = (from, to, checkpoints, need);
        alloc.stable_to = if decode_step { self.stable_to(to) } else { Tokens::ZERO };
        if evict && self.ahead_step.is_none() {
            self.note_peak();
        }
    }

    /// For a decode step ending at `to`: the largest `t ≥ to` whose decode
    /// step (`t − 1 .. t`) holds the same blocks in every group.
    ///
    /// Full attention holds `cdiv(t, B)`: the same up to `cdiv(to, B) × B`.
    /// A window group holds `cdiv(t, B) − floor(max(0, t − W) / B)`: the
    /// second term stays at `m = floor(max(0, to − W) / B)` while
    /// `t ≤ W + (m + 1) × B − 1`. A state group holds one block throughout,
    /// but in align mode two in the step from a block boundary (`kB .. kB +
    /// 1`): stable through the end of the block, or only that step.
    #[inline]
    fn stable_to(&self, to: Tokens) -> Tokens {
        if let Some(b) = self.uniform_fa {
            return b.round_up(to);
        }
        self.stable_to_by_group(to)
    }

    /// [`KvPool::stable_to`], group by group.
    #[inline(never)]
    fn stable_to_by_group(&self, to: Tokens) -> Tokens {
        let t = to.get();
        let mut stable = u64::MAX;
        let align = self.align.is_some();
        for g in &self.groups {
            let b = g.block_size().get();
            let end_of_block = t.div_ceil(b) * b;
            let g_stable = match (g.kind(), g.window()) {
                (CacheGroupKind::State, _) if align && g.prefix_cacheable() => {
                    // Up to the step that ends on the boundary, which caches
                    // the state it writes (`register_state`).
                    if Self::moves_block(g, to.saturating_sub(Tokens::new(1)), to) || t == end_of_block {
                        t
                    } else {
                        end_of_block - 1
                    }
                }
                (CacheGroupKind::State, _) => u64::MAX,
                (CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution, Some(w)) => {
                    let w = w.get();
                    let m = t.saturating_sub(w) / b;
                    end_of_block.min(w + (m + 1) * b - 1)
                }
                _ => end_of_block,
            };
            stable = stable.min(g_stable);
        }
        Tokens::new(stable)
    }

    /// Returns everything `alloc` holds, its KV computed through `computed`
    /// tokens; pinned cached blocks become evictable when no other request
    /// pins them.
    ///
    /// With prefix caching, vLLM has hashed (cached) every full block of
    /// computed KV, so its full-attention blocks past the shared ones (its own and
    /// generated content) take their turn in the eviction order, as a
    /// nameless run, instead of being reused first; nothing can hit them
    /// (a finished request never comes back), so only their place in the
    /// order counts. B = 16, a request of 40 prompt and 20 generated tokens
    /// (59 computed) holding 1 shared block: 3 full blocks, 2 of them its
    /// own, go to the LRU tail, then the shared one; its partial fourth
    /// block is reused first.
    pub(crate) fn release(&mut self, alloc: &mut Alloc, computed: Tokens) {
        debug_assert!(self.evicted_ahead.is_empty(), "the pool touched while evictions made ahead stand");
        let nameless = match self.fa_block {
            Some(b) if self.caching => {
                let full = computed.blocks_floor(b).get().min(alloc.to.blocks_ceil(b).get());
                full.saturating_sub(u64::from(alloc.shared)) * self.fa_groups
            }
            _ => 0,
        };
        // With the window cache, the window groups' full blocks of its own
        // too (the ones it pins are unpinned).
        let win_nameless = self.win.map_or(0, |w| {
            let held_end = alloc.to.blocks_ceil(w.block).get();
            let full = computed.blocks_floor(w.block).get().min(held_end);
            let start =
                u64::from(w.skipped(alloc.from).max(if alloc.wpinned > 0 { alloc.wfirst + alloc.wpinned } else { 0 }));
            full.saturating_sub(start) * w.groups
        });
        debug_assert!(nameless + win_nameless <= alloc.private);
        self.free += alloc.private - nameless - win_nameless;
        self.private -= alloc.private;
        let align = self.align.is_some();
        let pinned = alloc.pinned_states();
        for (i, g) in self.groups.iter().enumerate() {
            let held = Self::group_blocks(g, align, alloc.from, alloc.to, alloc.checkpoints);
            let shared = match g.kind() {
                CacheGroupKind::FullAttention => u64::from(alloc.shared),
                CacheGroupKind::State if align && g.prefix_cacheable() => pinned,
                CacheGroupKind::SlidingWindow if self.win.is_some() => u64::from(alloc.wpinned),
                _ => 0,
            };
            self.group_used[i] -= held - shared;
        }
        // Freed in reverse (vLLM's `free_blocks(reversed(...))`), group by
        // group: its own blocks, then the shared ones.
        self.free_nameless(nameless);
        self.unpin(alloc.shared, alloc.owner);
        if self.win.is_some() {
            self.free_nameless(win_nameless);
            self.unpin_window(alloc);
        }
        // Then the state entries, the later block first (vLLM frees each
        // group's blocks in reverse, group by group).
        if alloc.pinned != 0 {
            let mut states = self.pins(alloc);
            self.state_pins.remove(&alloc.owner);
            states.sort_unstable_by_key(|&(_, i)| std::cmp::Reverse(i));
            for (k, _) in states {
                if k != 0 {
                    self.unref(k);
                }
            }
        }
        *alloc = Alloc::owned_by(alloc.owner);
    }

    /// The cache key of full-attention block `block` of a request: its
    /// prefix ids' where they cover it (content other requests may share),
    /// else one of the request's own (content no other request has: the
    /// rest of its prompt, and its generated tokens).
    fn key(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, block: u32) -> u64 {
        let b = self.cache_block();
        Self::key_at(prefix, prompt, owner, Tokens::new((u64::from(block) + 1) * b.get()), b)
    }

    /// The cache key of a request's content through `end` tokens (see
    /// [`KvPool::key`]).
    fn key_at(prefix: &PrefixIds, prompt: Tokens, owner: u64, end: Tokens, b: Tokens) -> u64 {
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
        if self.state_groups == 0 && self.win.is_none() {
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
    /// end cached ([`KvPool::window_hit`]).
    #[inline]
    pub(crate) fn lookup(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, goal: Tokens) -> (u32, Tokens) {
        debug_assert!(self.evicted_ahead.is_empty(), "the pool touched while evictions made ahead stand");
        if let Some(w) = self.win {
            return (self.window_hit(w, prefix, prompt, owner, goal), Tokens::ZERO);
        }
        // With no full-attention group, vLLM's Mamba manager hits alone:
        // the last cached state before the last token.
        let n = if self.fa_groups == 0 && self.state_groups > 0 {
            let b = self.cache_block();
            u32::try_from(goal.saturating_sub(Tokens::new(1)).blocks_floor(b).get()).unwrap_or(u32::MAX)
        } else {
            self.fa_hit(prefix, prompt, owner, goal)
        };
        if self.state_groups == 0 || n == 0 {
            return (n, Tokens::ZERO);
        }
        let mut m = n;
        while m > 0 {
            if self.entries.contains_key(self.state_key(prefix, prompt, owner, m), keys(self.lru.slots())) {
                break;
            }
            m -= self.hit_align.min(m);
        }
        let junction = if m < n && self.fa_groups > 0 { self.hit_tokens(n) } else { Tokens::ZERO };
        (m, junction)
    }

    /// The window cache's hit, as vLLM's `SlidingWindowManager.find_longest_cache_hit`
    /// after the full-attention one (`kv_cache_coordinator.py:806`, one
    /// pass for one full-attention and one other kind of group): from the
    /// end of the full-attention hit (with no full-attention group, of what
    /// may hit: `cdiv` of all but the last token, floored) back, the first
    /// place where `need = cdiv(W − 1, B)` cached window blocks in a row
    /// end; with none, the run of cached window blocks from the start.
    ///
    /// W = 33, B = 16 (need 2), a full-attention hit of 5 blocks, window
    /// blocks 0, 1, 2 and 4 cached: block 4 alone, then 2 and 1 in a row:
    /// the hit is 1 + 2 = 3 blocks.
    fn window_hit(&self, w: Win, prefix: &PrefixIds, prompt: Tokens, owner: u64, goal: Tokens) -> u32 {
        let n = if self.fa_groups > 0 {
            self.win_blocks(self.fa_hit(prefix, prompt, owner, goal))
        } else {
            u32::try_from(goal.saturating_sub(Tokens::new(1)).blocks_floor(w.block).get()).unwrap_or(u32::MAX)
        };
        let mut run = 0u32;
        let mut hit = None;
        for i in (0..n).rev() {
            if self.entries.contains_key(self.win_key(prefix, prompt, owner, i), keys(self.lru.slots())) {
                run += 1;
                if run >= w.need {
                    hit = Some(i + w.need);
                    break;
                }
            } else {
                run = 0;
            }
        }
        // In cache blocks.
        let per = self.fa_block.map_or(1, |b| w.block.get() / b.get());
        u32::try_from(u64::from(hit.unwrap_or(run)) * per).unwrap_or(u32::MAX)
    }

    /// The key of window block `block` of a request.
    fn win_key(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, block: u32) -> u64 {
        let b = self.win.expect("a window cache").block;
        plain_key(mix(
            Self::key_at(prefix, prompt, owner, Tokens::new((u64::from(block) + 1) * b.get()), b),
            WINDOW_ENTRY,
        ))
    }

    /// The key of the state cached after the first `n` full-attention
    /// blocks of the prompt.
    fn state_key(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, n: u32) -> u64 {
        plain_key(mix(self.key(prefix, prompt, owner, n - 1), STATE_ENTRY))
    }

    /// The cached state entry a hit of `n` blocks pins (0: none, or a hit on
    /// the request's own content, whose state is allocated fresh).
    #[inline]
    fn hit_entry(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, n: u32) -> u64 {
        if self.state_groups == 0 || n == 0 {
            return 0;
        }
        let k = self.state_key(prefix, prompt, owner, n);
        if self.entries.contains_key(k, keys(self.lru.slots())) { k } else { 0 }
    }

    /// The state-group block index of the state after `t` tokens.
    fn state_index(&self, t: Tokens) -> u32 {
        let b = self.align.expect("align mode");
        u32::try_from(t.blocks_ceil(b).get().saturating_sub(1)).unwrap_or(u32::MAX)
    }

    /// Starts a new schedule call (`calls`): states cached in earlier ones
    /// may be hit again (vLLM's `new_step_starts`).
    pub(crate) fn new_step(&mut self, calls: u64) {
        if self.states_call != calls {
            self.states_call = calls;
            self.states_this_step.clear();
        }
    }

    /// The longest leading run of cached full-attention blocks a sequence
    /// may use (see [`KvPool::cached_prefix`]).
    fn fa_hit(&self, prefix: &PrefixIds, prompt: Tokens, owner: u64, goal: Tokens) -> u32 {
        if !self.caching {
            return 0;
        }
        let limit = goal.saturating_sub(Tokens::new(1));
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
            .or(self.win.map(|w| w.block))
            .or(self.align)
            .map_or(Tokens::ZERO, |b| Blocks::new(u64::from(blocks)).tokens(b))
    }

    /// Whether pinning the first `n` cached blocks of the prompt and then
    /// taking `need` private blocks would succeed, without doing either.
    ///
    /// Pinning and allocating one after the other may evict cached blocks
    /// for the first part before the second fails; vLLM checks the whole
    /// allocation against the free and evictable blocks first (the hit's
    /// own evictable blocks excepted), so a failed attempt changes nothing.
    /// [`KvPool::pin_and_allocate`] checks with this before it pins.
    fn can_pin_and_take(
        &self,
        prefix: &PrefixIds,
        prompt: Tokens,
        owner: u64,
        (n, from): (u32, Tokens),
        need: u64,
        keep: u64,
    ) -> Result<(), Shortfall> {
        let sk = self.hit_entry(prefix, prompt, owner, n);
        let sb = if sk != 0 { self.state_groups } else { 0 };
        let need = self.pin_and_take_need(n, need).saturating_sub(sb);
        let in_pool = self.free();
        if !(sk != 0 && self.states_this_step.contains(&sk)) {
            // It fits even if every block of the hit were evictable (they
            // are among the cached free ones): no need to look at them.
            let wins = if self.win.is_some() { self.win_blocks(n) - self.win_lo(n, from) } else { 0 };
            let most = u64::from(n) * self.fa_groups + u64::from(wins) * self.wg() + sb;
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
        if self.win.is_some() {
            for i in self.win_lo(n, from)..self.win_blocks(n) {
                if evictable(self.win_key(prefix, prompt, owner, i)) {
                    touched += self.wg();
                }
            }
        }
        if sk != 0 && evictable(sk) {
            touched += sb;
        }
        let available = in_pool.saturating_sub(keep + touched);
        if sk != 0 && self.states_this_step.contains(&sk) {
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
    fn hit_private(&self, n: u32) -> u64 {
        let t = self.hit_tokens(n);
        self.private_need(t, t, false, self.fa_pins(n)) - u64::from(self.win_pins(n)) * self.wg()
    }

    /// Full-attention entries a hit of `n` blocks pins (none without a
    /// full-attention group).
    #[inline]
    fn fa_pins(&self, n: u32) -> u32 {
        if self.fa_groups > 0 { n } else { 0 }
    }

    /// Pins the first `n` cached blocks of the prompt for an empty `alloc`
    /// (`n` from [`KvPool::cached_prefix`]) and allocates the other groups' blocks
    /// at that point; its state becomes "`n` blocks computed". Called only
    /// after [`KvPool::can_pin_and_take`] said it fits; on a shortfall all
    /// is given back, but the unpinned entries rejoin the LRU tail (a
    /// nameless run they headed may have become plain).
    fn pin(&mut self, alloc: &mut Alloc, prefix: &PrefixIds, prompt: Tokens, n: u32) -> Result<(), Shortfall> {
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
        if let Err(e) = self.take(need, true) {
            self.unpin(fa, alloc.owner);
            let mut pinned = Alloc { wpinned: wpins, ..*alloc };
            self.unpin_window(&mut pinned);
            if sk != 0 {
                self.unref(sk);
            }
            return Err(e);
        }
        let align = self.align.is_some();
        for (i, g) in self.groups.iter().enumerate() {
            if g.kind() != CacheGroupKind::FullAttention {
                let pinned = match g.kind() {
                    CacheGroupKind::State => u64::from(sk != 0 && g.prefix_cacheable()),
                    CacheGroupKind::SlidingWindow => u64::from(wpins),
                    _ => 0,
                };
                self.group_used[i] += Self::group_blocks(g, align, t, t, false) - pinned;
            }
        }
        self.private += need;
        *alloc = Alloc {
            from: t,
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
            let pins = [(0, 0), (sk, self.state_index(t))];
            self.set_pins(alloc, pins);
        }
        self.note_peak();
        Ok(())
    }

    /// Pins a hit's entries for the empty `alloc`: the first `fa`
    /// full-attention ones and the window ones of blocks `window`.
    fn pin_hit_entries(
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
                let k = self.win_key(prefix, prompt, alloc.owner, i);
                let slot = self.entries.get(k, keys(self.lru.slots())).expect("a hit's window entries exist");
                self.ref_slot(slot);
                slots.push(slot);
            }
            self.put_win_slots(alloc.owner, slots);
        }
    }

    /// Pins the first `hit` cached blocks of the prompt for an empty
    /// `alloc` (`hit` from [`KvPool::cached_prefix`]), then allocates it for
    /// the step `from..to` (with or without checkpoint blocks): all or
    /// nothing, as vLLM's `allocate_slots` checks the whole allocation
    /// against the free and evictable blocks (the hit's own evictable blocks
    /// excepted) before it touches any. On a shortfall nothing changes, no
    /// cached block is evicted, and the shortfall counts every block the
    /// allocation would hold (the hit's included).
    ///
    /// Used by admission and by a decode rank's reservation alike.
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

    /// [`KvPool::pin_and_allocate`], but only if `keep` free or evictable
    /// blocks are left for others afterwards (vLLM's `reserved_blocks`).
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
        let need = self.blocks_after_hit(hit, from, to, checkpoints);
        if let Err(short) = self.can_pin_and_take(prefix, prompt, alloc.owner, (hit, from), need, keep) {
            let needed = self.all_blocks(from, to, checkpoints);
            return Err(Shortfall { needed, available: short.available });
        }
        if self.win.is_some() && from > self.hit_tokens(hit) {
            self.pin_into(alloc, prefix, prompt, hit, (from, to));
            return Ok(());
        }
        self.pin(alloc, prefix, prompt, hit).expect("checked: pinning fits");
        // The check covered the larger of the pinned state and the step's, so
        // the step fits too.
        self.resize(alloc, from, to, checkpoints).expect("checked: the step fits after pinning");
        Ok(())
    }

    /// With the window cache, [`KvPool::pin_and_allocate`] for a first
    /// step that starts past the hit (a decode rank's reservation): pins
    /// the hit's blocks in that step's window only and allocates the step
    /// in one go, as vLLM's `allocate_slots` does for a remote load. Called
    /// after the check.
    fn pin_into(
        &mut self,
        alloc: &mut Alloc,
        prefix: &PrefixIds,
        prompt: Tokens,
        hit: u32,
        (from, to): (Tokens, Tokens),
    ) {
        debug_assert!(alloc.is_empty());
        let fa = self.fa_pins(hit);
        let lo = self.win_lo(hit, from);
        let nw = self.win_blocks(hit);
        self.pin_hit_entries(alloc, prefix, prompt, fa, lo..nw);
        let mut need = 0;
        for (i, g) in self.groups.iter().enumerate() {
            let held = rules::blocks_for_step(g, from, to, false).get();
            let pinned = match g.kind() {
                CacheGroupKind::FullAttention => u64::from(fa),
                CacheGroupKind::SlidingWindow => u64::from(nw - lo),
                _ => 0,
            };
            self.group_used[i] += held - pinned;
            need += held - pinned;
        }
        self.take(need, true).expect("checked: the step fits");
        self.private += need;
        let decode_step = from + Tokens::new(1) == to;
        *alloc =
            Alloc { from, to, shared: fa, private: need, wfirst: lo, wpinned: nw - lo, ..Alloc::owned_by(alloc.owner) };
        alloc.stable_to = if decode_step { self.stable_to(to) } else { Tokens::ZERO };
        self.note_peak();
    }

    /// Whether a sequence new to the pool, pinning `hit` cached blocks, could
    /// hold its whole known sequence (`from..whole`, with or without
    /// checkpoint blocks) from the free and evictable blocks now; no side
    /// effects. vLLM admits a waiting request only then
    /// (`scheduler_reserve_full_isl`, on by default: `kv_cache_manager.py`
    /// `allocate_slots(full_sequence_must_fit=True)`), even though it
    /// allocates only the first chunk. The shortfall counts every block the
    /// sequence would hold (the hit's included).
    ///
    /// B = 16, 8 usable blocks, one 64-token request running (4 blocks): a
    /// 100-token prompt needs cdiv(100, 16) = 7 > 4 free and waits, even
    /// with a token budget of 32 whose first chunk would fit in 2.
    ///
    /// A window group counts at most its admission cap, as vLLM's
    /// `SlidingWindowSpec.max_admission_blocks_per_request`:
    /// `cdiv(W − 1 + in_flight, B) + 1` blocks, `in_flight` being the most
    /// tokens a step computes (`max_num_batched_tokens`), since blocks below
    /// the window are freed as the prefill goes. W = 33, B = 16, a budget
    /// of 32: at most cdiv(64, 16) + 1 = 5 window blocks, however long the
    /// prompt.
    pub(crate) fn whole_fits(
        &self,
        prefix: &PrefixIds,
        prompt: Tokens,
        owner: u64,
        hit: u32,
        whole: Whole,
    ) -> Result<(), Shortfall> {
        let need = match self.win {
            Some(w) => self.whole_blocks_after_window_hit(w, hit, whole),
            None => self.whole_blocks(whole).saturating_sub(u64::from(hit) * self.fa_groups),
        };
        self.can_pin_and_take(prefix, prompt, owner, (hit, self.hit_tokens(hit)), need, 0).map_err(|short| Shortfall {
            needed: need + u64::from(hit) * self.fa_groups + u64::from(self.win_pins(hit)) * self.wg(),
            available: short.available,
        })
    }

    /// With the window cache, the blocks beyond a hit of `hit` blocks that
    /// admission counts for the whole known sequence, as vLLM's
    /// `get_num_blocks_to_allocate` does for a new request: per group, its
    /// blocks for the whole sequence (a window group's capped, see
    /// [`KvPool::whole_fits`]) less the hit's (the window group's hit list
    /// counting its skipped blocks too).
    ///
    /// W = 33, B = 16, a budget of 32, a hit of 4 blocks, 200 tokens known:
    /// full attention cdiv(200, 16) − 4 = 9, the window min(13, 5) − 4 = 1.
    fn whole_blocks_after_window_hit(&self, w: Win, hit: u32, whole: Whole) -> u64 {
        let nw = u64::from(self.win_blocks(hit));
        let hit = u64::from(hit);
        self.groups
            .iter()
            .map(|g| {
                let blocks = whole.to.blocks_ceil(g.block_size()).get();
                if g.kind() == CacheGroupKind::SlidingWindow {
                    let cap = (w.window.get() - 1 + whole.in_flight.get()).div_ceil(w.block.get()) + 1;
                    blocks.min(cap).saturating_sub(nw)
                } else {
                    blocks.saturating_sub(hit)
                }
            })
            .sum()
    }

    /// Blocks a sequence holds for its whole known sequence (`from..to`),
    /// a window group counted at most at its admission cap (see
    /// [`KvPool::whole_fits`]); hit blocks included.
    pub(crate) fn whole_blocks(&self, whole: Whole) -> u64 {
        let Whole { from, to: whole, checkpoints, in_flight } = whole;
        let align = self.align.is_some();
        self.groups
            .iter()
            .map(|g| {
                let blocks = Self::group_blocks(g, align, from, whole, checkpoints);
                match (g.kind(), g.window()) {
                    (CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution, Some(w)) => {
                        let b = g.block_size().get();
                        let cap = (w.get() - 1 + in_flight.get()).div_ceil(b) + 1;
                        blocks.min(cap)
                    }
                    _ => blocks,
                }
            })
            .sum()
    }

    /// The source release of a completed handoff prefill: frees, group by
    /// group, what [`rules::group_release`] says the group frees (a window
    /// group's blocks below the window, a state group's checkpoint blocks),
    /// keeping the source. Freed blocks go back to the free list; full
    /// attention frees nothing, so cached blocks stay cached.
    pub(crate) fn release_to_source(&mut self, alloc: &mut Alloc) {
        debug_assert!(self.evicted_ahead.is_empty(), "the pool touched while evictions made ahead stand");
        // With the window cache, the window blocks below the window go into
        // the eviction order (all full, so hashed), its own as a nameless
        // run: a finished prefill never computes them again.
        if let Some(w) = self.win
            && self.skips_cached(alloc, alloc.to)
        {
            self.skip_window(w, alloc, alloc.to, true);
        }
        let mut freed = 0u64;
        let align = self.align.is_some();
        // A cached state it started the last step from is unpinned instead.
        let [prev, _] = self.state_blocks_held(alloc.from, alloc.to);
        let mut pins = self.pins(alloc);
        let prev_entry = pins.iter().position(|&(k, i)| k != 0 && Some(i) == prev);
        if let Some(slot) = prev_entry {
            let k = pins[slot].0;
            pins[slot] = (0, 0);
            self.set_pins(alloc, pins);
            self.unref(k);
        }
        for (i, g) in self.groups.iter().enumerate() {
            let r = rules::group_release(g, alloc.from, alloc.to, alloc.checkpoints);
            // In align mode the state it started the last step from goes too
            // (vLLM's `remove_skipped_blocks` when a connector-held request
            // finishes).
            let previous = u64::from(
                align
                    && g.kind() == CacheGroupKind::State
                    && g.prefix_cacheable()
                    && Self::moves_block(g, alloc.from, alloc.to)
                    && prev_entry.is_none(),
            );
            let free = r.free().get() + previous;
            debug_assert_eq!(r.keep().get(), Self::group_blocks(g, align, alloc.to, alloc.to, false));
            self.group_used[i] -= free;
            freed += free;
        }
        debug_assert!(freed <= alloc.private, "a source frees only private blocks");
        self.private -= freed;
        self.free += freed;
        alloc.private -= freed;
        (alloc.from, alloc.checkpoints, alloc.stable_to) = (alloc.to, false, Tokens::ZERO);
    }

    fn ref_entry(&mut self, k: u64) {
        let i = self.entries.get(k, keys(self.lru.slots())).expect("entry exists");
        self.ref_slot(i);
    }

    /// [`KvPool::ref_entry`] of the entry in slot `i`.
    #[inline]
    fn ref_slot(&mut self, i: u32) {
        if let Some(was_head) = self.lru.pin(i) {
            if was_head {
                self.absorb_front();
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
    fn ref_slots(&mut self, slots: &[u32], kind: Kind) {
        debug_assert!(slots.iter().all(|&i| self.lru.get(i).kind() == kind));
        // (Absorbing once at the end of the run leaves the order as absorbing
        // after each pin of the head would: the nameless runs that come to
        // head it are the same, in the same order.)
        let (taken, head) = self.lru.pin_run(slots);
        if head {
            self.absorb_front();
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
    fn unref_slots_rev(&mut self, slots: &[u32], kind: Kind) {
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
    fn unref(&mut self, k: u64) {
        let i = self.entries.get(k, keys(self.lru.slots())).expect("pinned entry exists");
        self.unref_slot(i);
    }

    /// [`KvPool::unref`] of the entry in slot `i`.
    #[inline]
    fn unref_slot(&mut self, i: u32) {
        if self.lru.unpin(i) {
            let kind = self.lru.get(i).kind();
            let blocks = self.entry_blocks(kind);
            self.shared -= blocks;
            self.cached_free += blocks;
            self.used_add(kind, -1);
        }
    }

    /// Adds one block (or takes one) to the count of every group an entry
    /// of `kind` spans: the full-attention groups, the aligned state groups
    /// or the cached window groups.
    #[inline]
    fn used_add(&mut self, kind: Kind, delta: i64) {
        let mut spans = self.spans[kind as usize];
        while spans != 0 {
            let i = spans.trailing_zeros() as usize;
            self.group_used[i] = self.group_used[i].checked_add_signed(delta).expect("count stays >= 0");
            spans &= spans - 1;
        }
    }

    /// The groups an entry of each [`Kind`] spans, as bit masks (bit `i`:
    /// group `i`), for [`KvPool::used_add`].
    fn spans_of(groups: &[CacheGroup]) -> [u16; 3] {
        let mask = |spans: &dyn Fn(&CacheGroup) -> bool| {
            groups.iter().enumerate().filter(|(_, g)| spans(g)).fold(0u16, |m, (i, _)| m | 1 << i)
        };
        [
            mask(&|g| g.kind() == CacheGroupKind::FullAttention),
            mask(&|g| g.kind() == CacheGroupKind::State && g.prefix_cacheable()),
            mask(&|g| g.kind() == CacheGroupKind::SlidingWindow),
        ]
    }

    /// Drops a request's pin on its first `n` cached blocks. Blocks no
    /// request pins any more join the LRU order tail first, as vLLM frees a
    /// request's blocks in reverse (`single_type_kv_cache_manager.py`
    /// `free` → `block_pool.free_blocks(reversed(...))`): the end of a
    /// prompt is evicted before its start, so an eviction costs later
    /// requests the fewest leading hits.
    fn unpin(&mut self, n: u32, owner: u64) {
        if n == 0 {
            return;
        }
        let mut slots = self.held_slots.remove(&owner).expect("a holding with shared blocks has its slots");
        debug_assert_eq!(slots.len(), n as usize);
        self.unref_slots_rev(&slots, Kind::Full);
        slots.clear();
        self.spare_slot_lists.push(slots);
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
        if let Some(w) = self.win {
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

    /// With the window cache, registers the newly full window blocks of
    /// content the prefix ids name that the step holds, as pinned entries
    /// (vLLM caches every group's full blocks at allocation; the blocks
    /// below the window are freed into the eviction order at the next step,
    /// [`KvPool::skip_window`]).
    fn register_window(&mut self, w: Win, alloc: &mut Alloc, prefix: &PrefixIds, prompt: Tokens, computed: Tokens) {
        let full = u32::try_from(computed.min(alloc.to).blocks_floor(w.block).get()).unwrap_or(u32::MAX);
        // Past its pins (named content comes first), else from the window.
        let mut i = if alloc.wpinned > 0 { alloc.wfirst + alloc.wpinned } else { w.skipped(alloc.from) };
        if i >= full {
            return;
        }
        let mut slots = self.take_win_slots(alloc);
        while i < full {
            let Some(k) = prefix.key_through(Tokens::new((u64::from(i) + 1) * w.block.get()), prompt, w.block) else {
                break;
            };
            let k = plain_key(mix(k, WINDOW_ENTRY));
            if alloc.wpinned == 0 {
                alloc.wfirst = i;
            }
            debug_assert_eq!(alloc.wfirst + alloc.wpinned, i, "a holding's window pins are contiguous");
            let slot = self.new_entry(k, Kind::Window);
            slots.push(slot);
            self.shared += w.groups;
            self.private -= w.groups;
            alloc.private -= w.groups;
            alloc.wpinned += 1;
            i += 1;
        }
        self.put_win_slots(alloc.owner, slots);
    }

    /// In align mode, a state on a block boundary is cached: the one a step
    /// that ends there writes (vLLM caches a state block once full, at
    /// allocation; a non-final chunk ends there by `align::aligned_chunk`;
    /// a decode step at every boundary it reaches), or a landed handoff's at
    /// `computed` (on a decode rank vLLM caches the loaded state at T when T
    /// is block-aligned); of content the prefix ids name or of the
    /// request's own (its recompute after a preemption may hit it). It is
    /// freed into the eviction order when the holding moves on (vLLM's
    /// `remove_skipped_blocks`, `last_state_block_idx`). Another request's
    /// copy of the same state is shared and this one's freed. Where pdsim
    /// departs: vLLM keeps both state blocks, as it does full-attention
    /// ones (`register_block`).
    pub(crate) fn register_state(&mut self, alloc: &mut Alloc, prefix: &PrefixIds, prompt: Tokens, computed: Tokens) {
        let Some(sb) = self.align else { return };
        let fb = self.fa_block.unwrap_or(sb);
        let to = computed;
        if self.state_groups == 0 || to.is_zero() || !to.get().is_multiple_of(sb.get()) {
            return;
        }
        if !self.state_blocks_held(alloc.from, alloc.to).contains(&Some(self.state_index(to))) {
            return;
        }
        if !to.get().is_multiple_of(fb.get()) {
            return;
        }
        let n = u32::try_from(to.get() / fb.get()).unwrap_or(u32::MAX);
        let k = self.state_key(prefix, prompt, alloc.owner, n);
        let idx = self.state_index(to);
        let mut pins = self.pins(alloc);
        if pins.iter().any(|&(key, _)| key == k) {
            return;
        }
        let Some(slot) = pins.iter().position(|&(key, _)| key == 0) else { return };
        let sg = self.state_groups;
        match self.entries.entry(k, keys(self.lru.slots())) {
            Err(vacant) => {
                let slot = self.lru.alloc(k, Kind::State);
                self.entries.fill(vacant, slot);
                self.shared += sg;
            }
            Ok(i) => {
                self.free += sg;
                self.used_add(Kind::State, -1);
                self.ref_slot(i);
            }
        }
        self.private -= sg;
        alloc.private -= sg;
        pins[slot] = (k, idx);
        self.set_pins(alloc, pins);
        self.states_this_step.push(k);
    }

    /// Before a preempted request's blocks are freed: registers the rest of
    /// its full blocks, through `computed` tokens (its own prompt blocks and
    /// its generated ones), so that its recompute hits them as vLLM's does
    /// (vLLM hashes and caches every full block, generated tokens
    /// included). Other requests never hit them, so pdsim registers them
    /// only here.
    pub(crate) fn register_own(&mut self, alloc: &mut Alloc, prefix: &PrefixIds, prompt: Tokens, computed: Tokens) {
        if let Some(w) = self.win {
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

    /// [`KvPool::register_own`] for the window groups: its full window
    /// blocks past those it pins, through `computed` tokens.
    fn register_own_window(&mut self, w: Win, alloc: &mut Alloc, prefix: &PrefixIds, prompt: Tokens, computed: Tokens) {
        let held_end = u32::try_from(alloc.to.max(computed).blocks_ceil(w.block).get()).unwrap_or(u32::MAX);
        let full = u32::try_from(computed.blocks_floor(w.block).get()).unwrap_or(u32::MAX).min(held_end);
        let start = if alloc.wpinned > 0 { alloc.wfirst + alloc.wpinned } else { w.skipped(alloc.from) };
        if start >= full {
            return;
        }
        let mut slots = self.take_win_slots(alloc);
        if alloc.wpinned == 0 {
            alloc.wfirst = start;
        }
        for i in start..full {
            let k = self.win_key(prefix, prompt, alloc.owner, i);
            let slot = self.new_entry(k, Kind::Window);
            slots.push(slot);
        }
        let n = full - start;
        self.shared += u64::from(n) * w.groups;
        self.private -= u64::from(n) * w.groups;
        alloc.private -= u64::from(n) * w.groups;
        alloc.wpinned += n;
        self.put_win_slots(alloc.owner, slots);
    }

    /// The slot list of `alloc`'s pinned entries, taken out of the map while
    /// blocks are registered (a new one if it pins none).
    fn take_slots(&mut self, alloc: &Alloc) -> Vec<u32> {
        if alloc.shared == 0 {
            self.spare_slot_lists.pop().unwrap_or_default()
        } else {
            self.held_slots.remove(&alloc.owner).expect("a holding with shared blocks has its slots")
        }
    }

    /// Puts back a slot list [`KvPool::take_slots`] took.
    fn put_slots(&mut self, owner: u64, slots: Vec<u32>) {
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
    fn register_block(&mut self, alloc: &mut Alloc, k: u64, slots: &mut Vec<u32>) {
        let slot = self.new_entry(k, Kind::Full);
        slots.push(slot);
        self.shared += self.fa_groups;
        self.private -= self.fa_groups;
        alloc.private -= self.fa_groups;
        alloc.shared += 1;
    }

    /// A new pinned entry of `kind` under key `k`: the key's first copy, or
    /// a later one if the content is cached already.
    #[inline(always)]
    fn new_entry(&mut self, k: u64, kind: Kind) -> u32 {
        let slot = self.lru.alloc(k, kind);
        if self.entries.insert_if_vacant(k, slot, keys(self.lru.slots())).is_some() {
            self.copies.entry(k).or_default().push(slot);
        }
        slot
    }

    /// The pool's state in a form two pools can be compared by (slot
    /// numbers and the key maps' iteration order left out): the counts, the
    /// LRU order, and each key's copies in order with their pins.
    #[cfg(test)]
    pub(crate) fn canonical(&self) -> String {
        let order: Vec<_> = self.lru.order().map(|e| (e.key(), e.kind(), e.nameless())).collect();
        let mut keys: Vec<(u64, Vec<(Kind, u32)>)> = self
            .entries
            .values()
            .map(|first| {
                let k = self.lru.get(first).key();
                let later = self.copies.get(&k).into_iter().flatten();
                let copies = std::iter::once(&first).chain(later).map(|&c| self.lru.get(c));
                (k, copies.map(|e| (e.kind(), e.refs())).collect())
            })
            .collect();
        keys.sort_unstable_by_key(|&(k, _)| k);
        let counts = (self.free, self.private, self.shared, self.cached_free, self.nameless, self.evicted_blocks);
        format!("{counts:?} {:?} {order:?} {keys:?} {}", self.group_used, self.copies.len())
    }

    /// Checks `private + shared + cached_free + free = num_blocks` and the
    /// per-group counts; returns what is wrong.
    pub(crate) fn check(&self) -> Result<(), String> {
        let sum = self.private + self.shared + self.cached_free + self.free;
        if sum != self.num_blocks {
            return Err(format!(
                "private {} + shared {} + cached_free {} + free {} = {sum}, budget {}",
                self.private, self.shared, self.cached_free, self.free, self.num_blocks
            ));
        }
        let per_group: u64 = self.group_used.iter().sum();
        if per_group != self.private + self.shared {
            return Err(format!("groups use {per_group} blocks, pool counts {}", self.private + self.shared));
        }
        let unpinned: u64 = self
            .entries
            .values()
            .chain(self.copies.values().flatten().copied())
            .map(|i| self.lru.get(i))
            .filter(|e| e.refs() == 0)
            .map(|e| self.entry_blocks(e.kind()))
            .sum();
        // Every pin of a full-attention or window entry is a holding's
        // listed slot.
        let mut listed: FxHashMap<u32, u32> = FxHashMap::default();
        for (lists, kind) in [(&self.held_slots, Kind::Full), (&self.win_slots, Kind::Window)] {
            for (owner, slots) in lists {
                if slots.is_empty() {
                    return Err(format!("holding {owner}: an empty {kind:?} slot list"));
                }
                for &slot in slots {
                    let e = self.lru.get(slot);
                    let live = self.entries.get(e.key(), keys(self.lru.slots())) == Some(slot)
                        || self.copies.get(&e.key()).is_some_and(|c| c.contains(&slot));
                    if e.kind() != kind || !live {
                        return Err(format!("holding {owner}: slot {slot} is no live {kind:?} entry"));
                    }
                    *listed.entry(slot).or_default() += 1;
                }
            }
        }
        for slot in self.entries.values().chain(self.copies.values().flatten().copied()) {
            let e = self.lru.get(slot);
            if e.kind() != Kind::State && e.refs() != listed.get(&slot).copied().unwrap_or(0) {
                return Err(format!(
                    "entry in slot {slot}: {} pins, {:?} holdings list it",
                    e.refs(),
                    listed.get(&slot)
                ));
            }
        }
        let nameless: u64 = self.lru.order().map(|e| e.nameless()).sum();
        if self.lru.head_nameless() {
            return Err("a nameless run heads the LRU order (it should be plain free blocks)".into());
        }
        if unpinned + nameless != self.cached_free || nameless != self.nameless {
            return Err(format!(
                "{unpinned} unpinned cached blocks and {nameless} nameless ones, cached_free {}, nameless {}",
                self.cached_free, self.nameless
            ));
        }
        Ok(())
    }
}
