//! One request's holding in a pool ([`Alloc`]): the token range of its
//! current step and what it pins; the pool keeps the rest by its owner.

use crate::base::units::Tokens;

/// One request's holding in a pool. The pool keeps part of a holding's
/// state by its owner (the cached entries it pins), so a pool has at most
/// one holding per owner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Alloc {
    /// Where the step's skipped blocks are freed from: the tokens whose KV
    /// was present before the step, or under the asynchronous loop before
    /// the step before it, still in flight when this one was scheduled.
    pub(super) from: Tokens,
    /// Tokens whose KV was present before the step (`from` but under the
    /// asynchronous loop; in align mode a state block of its own,
    /// `mamba::earlier_states`). The decoding set's members leave it at
    /// `from` (their steps go through `KvPool::resize` and the like): for a
    /// decode step from `to − 2` the state after `to − 1` shares a block with
    /// the one after `to − 2` or `to` when state blocks hold more than one
    /// token, as vLLM's do.
    pub(super) mid: Tokens,
    /// Tokens whose KV is present after the step.
    pub(super) to: Tokens,
    /// Whether the step holds the groups' checkpoint blocks.
    pub(super) checkpoints: bool,
    /// Leading full-attention blocks held through the prefix cache.
    pub(super) shared: u32,
    /// Blocks held for this request alone, all groups.
    pub(super) private: u64,
    /// When the state is a decode step (`from + 1 == to`, no checkpoint
    /// blocks): the largest `to` whose decode step holds the same blocks in
    /// every group, so that moving there needs no accounting. Zero otherwise.
    pub(super) stable_to: Tokens,
    /// The request it belongs to: names the blocks its prefix ids do not
    /// cover (its own, or generated, content) when they are cached.
    pub(super) owner: u64,
    /// In align mode, how many cached state entries it pins (at most the
    /// block of the state its step starts from and the one it writes,
    /// [`KvPool::group_blocks`]); which ones, the pool keeps by owner
    /// (`KvPool::state_pins`), so that a holding stays small.
    pub(super) pinned: u8,
    /// With the window cache: the window blocks `wfirst .. wfirst +
    /// wpinned` are cached entries it pins (the pool keeps their slots by
    /// owner, `KvPool::win_slots`); its other window blocks are its own.
    pub(super) wfirst: u32,
    pub(super) wpinned: u32,
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
    /// same blocks (zero for other states), read for decode steps that
    /// start `lag` tokens before their own token (`KvPool::stable_to`):
    /// the state's bound holds for steps of its own lag, and of one more
    /// (a window that only widens keeps its blocks at least as long); zero
    /// for a state that lags more than the steps that read it.
    pub(crate) fn stable_to(&self, lag: u64) -> Tokens {
        if self.to - self.from <= Tokens::new(1 + lag) { self.stable_to } else { Tokens::ZERO }
    }
    /// Whether it holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.private == 0 && self.shared == 0 && self.pinned == 0 && self.wpinned == 0
    }

    /// Where a step from `from` starts as this holding sees it: never
    /// before the tokens whose KV it holds. Only a landed load's first
    /// decode step starts before them (it recomputes its last prompt token,
    /// whose KV arrived with the rest): it takes back none of the window
    /// blocks its reservation skipped
    /// ([`crate::vllm::handoff::reservation_span`]).
    #[inline]
    pub(super) fn step_from(&self, from: Tokens) -> Tokens {
        // (Only a reservation's state covers no step, `from == to`; every
        // step's state has `from < to`, also one taken ahead.)
        if self.from == self.to { from.max(self.from) } else { from }
    }

    /// Where a step starts whose skipped blocks are freed through
    /// `processed` tokens (vLLM's asynchronous loop): there, but never
    /// before the start this holding already has (what vLLM has processed
    /// only grows; a landed load's first step starts past its last prompt
    /// token, whose skipped blocks its reservation never held).
    #[inline]
    pub(crate) fn processed_start(&self, processed: Tokens) -> Tokens {
        processed.max(self.from)
    }

    /// Where its current step starts (no later step of a holding starts
    /// before it).
    #[inline]
    pub(crate) fn step_start(&self) -> Tokens {
        self.from
    }

    /// Whether it holds the KV of tokens past `computed` (a landed load
    /// before its first decode step, [`Alloc::step_from`]).
    #[inline]
    pub(crate) fn holds_past(&self, computed: Tokens) -> bool {
        self.step_from(computed) > computed
    }

    /// Cached state entries it pins.
    pub(super) fn pinned_states(&self) -> u64 {
        u64::from(self.pinned)
    }
}
