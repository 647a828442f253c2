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
//! cached entry covers the block in every full-attention group, but where
//! the groups are held apart, [`KvPool::full_groups_apart`]); without
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
//! ([`KvPool::lookup`]), so a window-only model hits as well; beside a
//! Mamba state group in align mode too, where a hit needs both the window
//! blocks and a state ([`Layout::WindowedAligned`]). Where pdsim departs:
//! other mixes of groups (windows of different specs, a window beside a
//! Mamba group of another block size or before it) free window blocks as
//! plain blocks and hit on the other groups alone; and with several
//! full-attention groups beside window
//! or Mamba-type groups vLLM frees group by group (own blocks then shared
//! ones, group 0 first), where one pdsim entry stands for a block in
//! each, so all the groups' own blocks go ahead of the shared entries.
//! (Beside no other cached kind, every full-attention group but the first
//! is held as a window no block ever leaves, [`KvPool::full_groups_apart`].)
//! Each window group's blocks are entries of their own, as vLLM keys a
//! cached block by hash and group: freed group by group, each the last
//! first, so an eviction takes one group's copy of a content before
//! another's, and a hit needs the content cached in every group.
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

mod admission;
mod ahead;
mod alloc;
mod blocks;
mod evict;
mod prefix;
mod resize;
mod state;
mod window;

use ahead::Journal;
pub(crate) use alloc::Alloc;
use prefix::HitMemo;
use window::Win;

use super::keymap::KeyMap;
use super::lru::{Entry, Lru};
use crate::base::fxmap::FxHashMap;
use crate::base::units::{BlockSize, Tokens};
use crate::models::model::{CacheGroup, CacheGroupKind, block_size_lcm};

/// How many blocks ahead of a run of key map operations their cells are
/// fetched ([`KeyMap::prefetch`]).
pub(super) const PREFETCH_AHEAD: usize = 16;

/// The window of a full-attention group held apart as a window group
/// ([`KvPool::full_groups_apart`]): one token more than a request may hold,
/// so that no block ever leaves it.
pub(crate) const UNBOUNDED_WINDOW: Tokens = Tokens::new(crate::requests::request::MAX_REQUEST_TOKENS + 1);

/// Most cache groups a model may have (a pool keeps per-group counts in
/// fixed arrays on its hot path).
pub(crate) const MAX_GROUPS: usize = 16;

/// What a decode rank's remote load finds in the cache
/// ([`KvPool::connector_hit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnectorHit {
    /// Load the rest past a hit of this many cache blocks.
    Load(u32),
    /// Nothing to load: the rank computes the prompt itself.
    ComputeLocally,
}

/// Not enough free blocks: how many the operation needed and had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shortfall {
    /// Blocks the operation needed.
    pub needed: u64,
    /// Blocks free or evictable.
    pub available: u64,
}

/// Where a resize may take the blocks it needs from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Take {
    /// Plain free blocks, then cached ones evicted from the LRU order's
    /// head; the peak is noted.
    Evicting,
    /// Plain free blocks only: never evicts, never notes the peak (blocks
    /// taken ahead of the step that needs them, which must be undone
    /// exactly if the step does not run).
    PlainOnly,
    /// As `Evicting`, for decode step `n` taken ahead of its time: every
    /// eviction is journaled ([`Journal`]) so that it can be undone, and
    /// the peak is left alone.
    Ahead(u64),
}

impl Take {
    /// Whether cached blocks may be evicted.
    #[inline]
    fn evicts(self) -> bool {
        !matches!(self, Take::PlainOnly)
    }
    /// The step evictions are journaled for, if they are.
    #[inline]
    fn ahead(self) -> Option<u64> {
        match self {
            Take::Ahead(n) => Some(n),
            _ => None,
        }
    }
}

/// The step a holding moves to: where vLLM frees its skipped blocks from
/// (`from`), the tokens computed before it (`mid`, past `from` only under
/// the asynchronous loop, for a request whose step before is in flight)
/// and after it, and whether it takes the groups' checkpoint blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    from: Tokens,
    mid: Tokens,
    to: Tokens,
    checkpoints: bool,
}

impl Span {
    /// A step computing `from..to`, without checkpoint blocks.
    #[inline]
    fn new(from: Tokens, to: Tokens) -> Span {
        Span { from, mid: from, to, checkpoints: false }
    }
    /// Whether it is a decode step, and how many tokens before its own it
    /// starts (its lag): one token computed from `to − 1` (lag 0), or, with
    /// vLLM's asynchronous loop, from `to − 2`, where the step before it
    /// started (lag 1: the skipped blocks are freed one step late,
    /// [`KvPool::stable_to`]); no checkpoint blocks.
    #[inline]
    fn decode_lag(self) -> Option<u64> {
        match self.to.get().checked_sub(self.from.get()) {
            Some(d @ 1..=2) if !self.checkpoints => Some(d - 1),
            _ => None,
        }
    }
}

/// How a pool's groups hold blocks, which decides how a holding is
/// counted and resized.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Every group full attention of one block size: a holding of `t`
    /// tokens is `cdiv(t, B)` blocks in each group, which the hot paths
    /// compute without visiting the groups (by a shift, for a power of two).
    UniformFull(BlockSize),
    /// Sliding-window groups whose full blocks are cached ([`Win`]).
    Windowed(Win),
    /// vLLM's Mamba align mode (a prefix-cacheable state group with prefix
    /// caching on): the state groups' block size, at whose boundaries
    /// prefill chunks end (`crate::vllm::mamba::aligned_chunk`).
    Aligned(Tokens),
    /// Both: sliding-window groups beside a Mamba state group in align
    /// mode, each cached as vLLM caches it (a hit needs the window blocks
    /// before its end and a state at it, [`KvPool::lookup`]).
    WindowedAligned(Win, Tokens),
    /// Any other mix: counted group by group.
    ByGroup,
}

/// What a cached entry stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// One block in each full-attention group.
    Full = 0,
    /// One block in each aligned state group (align mode).
    State = 1,
    /// One block in one sliding-window group (the window cache): vLLM
    /// caches each group's blocks apart (keyed by hash and group), and frees
    /// and evicts them group by group.
    Window = 2,
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
    /// How the groups hold blocks ([`Layout`]).
    layout: Layout,
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
    /// The later copies of a full-attention, window or state key, in the
    /// order they were cached (rare: see `KvPool::register_block`,
    /// `KvPool::register_state`).
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
    /// Aligned state groups (prefix-cacheable state groups in align mode);
    /// a cached state entry is one block in each.
    state_groups: u64,
    /// State entries registered during the step being formed (vLLM's
    /// `cached_blocks_this_step`): a hit on one waits for the next step.
    states_this_step: Vec<u64>,
    /// The schedule call `states_this_step` belongs to.
    states_call: u64,
    /// The state entries each holding that pins any does (the entry's
    /// handle, its slot in `lru` + 1, and its block index; handle 0:
    /// none), by owner: a pin names the copy it holds.
    state_pins: FxHashMap<u64, [(u64, u32); 3]>,
    /// By owner: the slots of the window entries a holding pins, in block
    /// order (`Alloc::wfirst ..`), each block's window groups in order.
    win_slots: FxHashMap<u64, Vec<u32>>,
    /// The index of each window group among all groups, in order (a window
    /// entry is one block in one of them, [`Win`]).
    win_idx: [u8; MAX_GROUPS],
    /// The groups an entry of each kind spans ([`KvPool::spans_of`]).
    spans: [u16; 3],
    /// The groups that hold alike, one of each with how many there are
    /// ([`KvPool::holding_classes`]): what every group holds together is
    /// summed over these (a GLM-like model's five state groups are two).
    classes: Vec<(CacheGroup, u64)>,
    /// See [`KvPool::frees_plain_midway`].
    frees_plain_midway: bool,
    /// The evictions made for decode steps taken ahead of their time
    /// ([`KvPool::resize_ahead`]).
    evicted_ahead: Journal,
}

impl KvPool {
    /// A pool of `num_blocks` shared by `groups`, with or without a prefix cache.
    pub(crate) fn new(groups: Vec<CacheGroup>, num_blocks: u64, prefix_caching: bool) -> Self {
        let groups = Self::full_groups_apart(groups, prefix_caching);
        let fa: Vec<&CacheGroup> = groups.iter().filter(|g| g.kind() == CacheGroupKind::FullAttention).collect();
        let fa_groups = fa.len() as u64;
        let fa_block = fa.first().map(|g| g.block_size());
        let caching = prefix_caching && fa_groups > 0 && fa.iter().all(|g| g.prefix_cacheable());
        let lcm = block_size_lcm(&groups).get();
        let hit_align = fa_block.map_or(1, |b| u32::try_from(lcm / b.get()).unwrap_or(u32::MAX));
        let align = crate::vllm::mamba::align_block(&groups, prefix_caching);
        let state_groups = if align.is_some() {
            groups.iter().filter(|g| g.kind() == CacheGroupKind::State && g.prefix_cacheable()).count() as u64
        } else {
            0
        };
        let win = Self::window_cache(&groups, prefix_caching, caching, fa_block, align);
        let uniform = fa_block
            .filter(|&b| groups.iter().all(|g| g.kind() == CacheGroupKind::FullAttention && g.block_size() == b))
            .map(BlockSize::new);
        let layout = match (uniform, win, align) {
            (Some(b), ..) => Layout::UniformFull(b),
            (None, Some(w), Some(b)) => Layout::WindowedAligned(w, b),
            (None, Some(w), None) => Layout::Windowed(w),
            (None, None, Some(b)) => Layout::Aligned(b),
            (None, None, None) => Layout::ByGroup,
        };
        KvPool {
            layout,
            win_slots: FxHashMap::default(),
            win_idx: Self::window_groups(&groups),
            evicted_ahead: Journal::default(),
            spans: Self::spans_of(&groups),
            classes: Self::holding_classes(&groups),
            frees_plain_midway: win.is_none()
                && groups
                    .iter()
                    .any(|g| matches!(g.kind(), CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution)),
            state_groups,
            states_this_step: Vec::new(),
            states_call: 0,
            state_pins: FxHashMap::default(),
            hit_align,
            group_used: vec![0; groups.len()],
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

    /// The prefix cache's block size: the full-attention groups', or with
    /// none, the window groups'.
    fn cache_block(&self) -> Tokens {
        self.fa_block.or(self.win().map(|w| w.block)).or(self.align()).expect("caching needs a cacheable group")
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

    /// Blocks one cached entry stands for.
    fn entry_blocks(&self, kind: Kind) -> u64 {
        match kind {
            Kind::Full => self.fa_groups,
            Kind::State => self.state_groups,
            Kind::Window => 1,
        }
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
    #[inline]
    pub(crate) fn align(&self) -> Option<Tokens> {
        match self.layout {
            Layout::Aligned(b) | Layout::WindowedAligned(_, b) => Some(b),
            _ => None,
        }
    }

    /// The window cache, if the pool keeps one.
    #[inline]
    fn win(&self) -> Option<Win> {
        match self.layout {
            Layout::Windowed(w) | Layout::WindowedAligned(w, _) => Some(w),
            _ => None,
        }
    }

    /// The block size, if every group is full attention of that one size.
    #[inline]
    fn uniform(&self) -> Option<BlockSize> {
        match self.layout {
            Layout::UniformFull(b) => Some(b),
            _ => None,
        }
    }

    /// Plain free blocks (cached-but-unpinned ones not counted).
    pub(crate) fn free_plain(&self) -> u64 {
        self.free
    }

    /// The block size, if every group is full attention of that one size.
    #[inline]
    pub(crate) fn uniform_fa(&self) -> Option<Tokens> {
        self.uniform().map(BlockSize::tokens)
    }

    /// Whether the pool keeps a window cache ([`Win`]).
    #[inline]
    pub(crate) fn window_cached(&self) -> bool {
        self.win().is_some()
    }

    /// Whether a step frees blocks below a sliding window (some group has
    /// a window).
    pub(crate) fn has_window(&self) -> bool {
        self.groups.iter().any(|g| g.kind() == CacheGroupKind::SlidingWindow && g.window().is_some())
    }

    /// Several full-attention groups of one block size (vLLM groups a
    /// model's layers into groups of equal size, so a model with more
    /// full-attention layers than others has several), with prefix caching:
    /// vLLM caches, frees and evicts each group's blocks apart (a freed
    /// request's blocks go into the eviction order group by group, each
    /// tail first, `kv_cache_coordinator.py:404-412`), and a hit needs its
    /// blocks cached in every group. The window cache ([`Win`]) does exactly
    /// that for window groups, and to vLLM's managers a full-attention
    /// group is a window no block ever leaves: its hit, scanned from the
    /// right for a run of `cdiv(W − 1, B)` cached blocks, finds none that
    /// long and takes the run from the start, which is the full-attention
    /// hit. So every such group but the first is held as a window of
    /// [`UNBOUNDED_WINDOW`] tokens, longer than any request (each group's
    /// blocks entries of their own, [`Win`]). Only where
    /// the window cache then takes them: every other group a state group
    /// that opts out of prefix caching (a tail ring); beside windows or
    /// Mamba-type states they stay folded (a departure the README names).
    fn full_groups_apart(groups: Vec<CacheGroup>, prefix_caching: bool) -> Vec<CacheGroup> {
        let fa: Vec<&CacheGroup> = groups.iter().filter(|g| g.kind() == CacheGroupKind::FullAttention).collect();
        let apart = prefix_caching
            && fa.len() >= 2
            && fa.iter().all(|g| g.block_size() == fa[0].block_size() && g.prefix_cacheable())
            && groups.iter().all(|g| match g.kind() {
                CacheGroupKind::FullAttention => true,
                CacheGroupKind::State => !g.prefix_cacheable(),
                _ => false,
            });
        if !apart {
            return groups;
        }
        let mut seen = false;
        groups
            .into_iter()
            .map(|g| match g.kind() {
                CacheGroupKind::FullAttention if seen => g.as_window(UNBOUNDED_WINDOW),
                CacheGroupKind::FullAttention => {
                    seen = true;
                    g
                }
                _ => g,
            })
            .collect()
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

    /// Whether a request's holding can give blocks back to the plain free
    /// ones as it goes on (window and convolution groups without the window
    /// cache free the blocks that leave the window as plain blocks). Then
    /// the order in which one step's holdings change decides how many
    /// cached blocks it evicts, so only stepping one by one evicts right.
    #[inline]
    pub(crate) fn frees_plain_midway(&self) -> bool {
        self.frees_plain_midway
    }

    /// Adds one block (or takes one) to the count of every group an entry
    /// of `kind` spans: the full-attention groups, the aligned state groups
    /// or the cached window groups.
    #[inline]
    fn used_add(&mut self, kind: Kind, delta: i64) {
        debug_assert!(kind != Kind::Window, "a window entry's group counts on its own paths");
        let mut spans = self.spans[kind as usize];
        while spans != 0 {
            let i = spans.trailing_zeros() as usize;
            self.group_used[i] = self.group_used[i].checked_add_signed(delta).expect("count stays >= 0");
            spans &= spans - 1;
        }
    }

    /// The groups an entry of each [`Kind`] spans, as bit masks (bit `i`:
    /// group `i`), for [`KvPool::used_add`]. A window entry is one block in
    /// one window group, counted where it is pinned and unpinned
    /// ([`KvPool::ref_win_slot`]), so its mask is empty.
    fn spans_of(groups: &[CacheGroup]) -> [u16; 3] {
        let mask = |spans: &dyn Fn(&CacheGroup) -> bool| {
            groups.iter().enumerate().filter(|(_, g)| spans(g)).fold(0u16, |m, (i, _)| m | 1 << i)
        };
        [
            mask(&|g| g.kind() == CacheGroupKind::FullAttention),
            mask(&|g| g.kind() == CacheGroupKind::State && g.prefix_cacheable()),
            0,
        ]
    }

    /// The indices of the sliding-window groups among `groups`, in order.
    fn window_groups(groups: &[CacheGroup]) -> [u8; MAX_GROUPS] {
        let mut idx = [0u8; MAX_GROUPS];
        let windows = groups.iter().enumerate().filter(|(_, g)| g.kind() == CacheGroupKind::SlidingWindow);
        for (slot, (i, _)) in idx.iter_mut().zip(windows) {
            *slot = u8::try_from(i).expect("fewer than 256 groups");
        }
        idx
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
        // Every pin of a state entry is a holding's pin of that copy.
        for (owner, pins) in &self.state_pins {
            for &(h, _) in pins.iter().filter(|p| p.0 != 0) {
                let slot = state::state_slot(h);
                let e = self.lru.get(slot);
                let live = self.entries.get(e.key(), keys(self.lru.slots())) == Some(slot)
                    || self.copies.get(&e.key()).is_some_and(|c| c.contains(&slot));
                if e.kind() != Kind::State || !live {
                    return Err(format!("holding {owner}: state pin {slot} is no live state entry"));
                }
                *listed.entry(slot).or_default() += 1;
            }
        }
        for slot in self.entries.values().chain(self.copies.values().flatten().copied()) {
            let e = self.lru.get(slot);
            if e.refs() != listed.get(&slot).copied().unwrap_or(0) {
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
