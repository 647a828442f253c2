//! The grouped KV transfer rules of vLLM's NIXL connector: the backoff,
//! what each group moves (from what it holds, [`super::blocks`] and
//! [`super::window`]), the payload of one handoff and the source release at
//! prefill completion.
//!
//! Every count here is per request and per TP rank. Notation: `cdiv(a, b) =
//! ceil(a / b)`; N = prompt tokens; T = tokens the prefill computes and hands
//! off; B = block size; W = window.
//!
//! The rules take validated models ([`crate::models::model`]) and do no allocation
//! except where a result names every group ([`payload`], [`source_release`]),
//! so a KV pool may call [`blocks_held`] and [`blocks_for_step`]
//! ([`super::blocks`]) on every scheduler step.
//!
//! ```
//! use actors::model::{CacheGroupKind, CacheGroupSpec, ModelSpec, Role};
//! use actors::rules::{payload, Payload};
//! use actors::units::{Bytes, Tokens};
//!
//! let fa = CacheGroupSpec {
//!     name: "full attention".into(),
//!     kind: CacheGroupKind::FullAttention,
//!     block_size_tokens: Tokens::new(16),
//!     page_bytes: Bytes::new(32_768),
//!     transfer_bytes_per_block: Some(Bytes::new(32_768)),
//!     prefix_cacheable: Some(true),
//!     window_tokens: None,
//!     checkpoint_blocks: None,
//!     heads: None,
//! };
//! let model = ModelSpec { cache_groups: vec![fa], ..Default::default() }
//!     .validate(Role::Prefill)
//!     .unwrap();
//! let p = payload(&model, Tokens::new(1_000), Tokens::ZERO).unwrap();
//! // cdiv(1000, 16) = 63 blocks of 32,768 bytes.
//! assert_eq!(p.bytes(), Bytes::new(63 * 32_768));
//! assert!(matches!(p, Payload::Blocks(_)));
//! ```

use super::blocks::{STATE_BLOCKS, blocks_for_step, blocks_held, full_attention_blocks};
use super::window::skipped_blocks;
use crate::base::units::{Blocks, Bytes, Tokens};
use crate::models::model::{CacheGroup, CacheGroupKind, GroupedModel, LinearModel, Model};

/// The tokens a handoff prefill leaves to the decode rank: 1 for a Mamba-type
/// model, 0 otherwise.
///
/// vLLM's NIXL connector (`distributed/kv_transfer/kv_connector/v1/nixl/`,
/// scheduler side) stops the prefill of a model with Mamba state one token
/// short, because the decode rank must compute the last prompt token itself
/// to advance the state; its `get_num_new_matched_tokens` offers
/// `(N − 1 if Mamba else N) − local_hit` tokens.
pub fn backoff_tokens(model: &Model) -> Tokens {
    if model.is_mamba_type() { Tokens::new(1) } else { Tokens::ZERO }
}

/// T, the prompt tokens the prefill computes and hands off: `N − backoff`,
/// except that a prompt not longer than the backoff keeps all its tokens.
///
/// Mamba-type model: N = 1,000 → T = 999; N = 1 → T = 1. Other models: T = N.
/// (vLLM's NIXL connector truncates the prefill by the backoff only when the
/// prompt is longer than it.)
pub fn transferred_tokens(model: &Model, prompt_tokens: Tokens) -> Tokens {
    let backoff = backoff_tokens(model);
    if prompt_tokens <= backoff { prompt_tokens } else { prompt_tokens - backoff }
}

/// What a decode rank's reservation for a remote load of T tokens
/// ([`transferred_tokens`]) holds, as a step from its first token to its
/// last: the KV of the T tokens, as if all were computed before the step
/// (`(T, T)`), so a window group holds only the blocks inside the window of
/// token T.
///
/// vLLM's decode scheduler allocates a load with `allocate_slots(0 new
/// tokens, the local hit, the external tokens)` (`v1/core/sched/scheduler.py`
/// waiting loop, `load_kv_async`): slots for `total_computed_tokens` = local
/// hit + external = T tokens (`v1/core/kv_cache_manager.py:564-578`), and
/// every group skips what lies below the window of T
/// (`single_type_kv_cache_manager.py:236-241` `get_num_blocks_to_allocate`,
/// `:1148-1183` `SlidingWindowManager.get_num_skipped_tokens`: `T − W + 1`
/// tokens), not of T − 1. W = 17, B = 16, T = 80: the window group holds
/// cdiv(80, 16) − floor(64 / 16) = 1 block, not 2. The first decode step
/// after the load (which recomputes token T − 1 of a full-attention
/// handoff) takes back none of the skipped blocks: vLLM replaced them by
/// its null block, and `allocate_new_blocks` counts them as held.
///
/// With a Mamba group, where the hit ends at a cached state vLLM's checks
/// count one state block more than the reservation then holds
/// (`KvPool::load_fits`).
///
/// Without window groups and with T = N (full attention) the state is the
/// step `(T − 1, T)`, which holds the same blocks and is a decode step's,
/// so the landed load joins a rank's decoding set at once (`windows`: the
/// pool has window or convolution groups).
#[inline]
pub(crate) fn reservation_span(transferred: Tokens, prompt: Tokens, windows: bool) -> (Tokens, Tokens) {
    if windows || transferred < prompt || transferred.is_zero() {
        (transferred, transferred)
    } else {
        (transferred - Tokens::new(1), transferred)
    }
}

/// What vLLM's whole-sequence check counts for a remote load of T of an
/// N-token prompt, as a step: every group's blocks for all N tokens with
/// the KV of T present, `(N, N)` (a state group one block, a window group
/// its blocks inside the window of token N), checked against the free and
/// evictable blocks before the load's own allocation
/// ([`reservation_span`]) is checked against them less the blocks kept
/// for the prefills in flight.
///
/// vLLM's waiting loop passes `full_sequence_must_fit` for a remote load
/// as for any admission (`v1/core/sched/scheduler.py:1434-1450`), and
/// `allocate_slots` counts `request.num_tokens` = N tokens
/// (`v1/core/kv_cache_manager.py:531-546`). It matters only where T < N:
/// a Mamba-type model, whose full-attention group needs `cdiv(N, B)`
/// blocks there but `cdiv(T, B)` for the load (one fewer when B divides
/// T). B = 16, N = 49, T = 48: 4 full-attention blocks checked, 3
/// allocated.
#[inline]
pub(crate) const fn load_whole(prompt: Tokens) -> (Tokens, Tokens) {
    (prompt, prompt)
}

/// Why a payload could not be computed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// A request with no prompt tokens.
    #[error("prompt_tokens must be at least 1")]
    EmptyPrompt,
    /// The decode rank claims more cached tokens than the prompt has.
    #[error("decode_cached_tokens {cached} exceeds prompt_tokens {prompt}")]
    HitExceedsPrompt {
        /// The decode hit given.
        cached: u64,
        /// The prompt length given.
        prompt: u64,
    },
    /// The payload does not fit in `u64` bytes.
    #[error("prompt_tokens {prompt}: the payload overflows u64 bytes")]
    Overflow {
        /// The prompt length given.
        prompt: u64,
    },
}

/// The handoff payload of a linear model: one full-attention group of the
/// model's block size, moved in whole blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenPayload {
    transferred_tokens: Tokens,
    hit: Tokens,
    blocks: Blocks,
    tokens: Tokens,
    bytes: Bytes,
}

impl TokenPayload {
    /// T = N: a linear model hands off the whole prompt.
    pub const fn transferred_tokens(&self) -> Tokens {
        self.transferred_tokens
    }
    /// The decode hit, [`decode_hit_tokens`].
    pub const fn hit_tokens(&self) -> Tokens {
        self.hit
    }
    /// Blocks that move: `cdiv(N, B) − hit / B`.
    pub const fn blocks(&self) -> Blocks {
        self.blocks
    }
    /// Tokens whose KV moves, in whole blocks: `blocks × B` (a partly
    /// filled last block moves whole).
    pub const fn tokens(&self) -> Tokens {
        self.tokens
    }
    /// `tokens × kv_bytes_per_token`.
    pub const fn bytes(&self) -> Bytes {
        self.bytes
    }
}

/// What one cache group moves in a grouped handoff.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupTransfer {
    name: String,
    kind: CacheGroupKind,
    blocks: Blocks,
    bytes: Bytes,
}

impl GroupTransfer {
    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The group's kind.
    pub const fn kind(&self) -> CacheGroupKind {
        self.kind
    }
    /// Blocks that move (the decode rank allocates these and reads them).
    pub const fn blocks(&self) -> Blocks {
        self.blocks
    }
    /// `blocks × transfer_bytes_per_block`.
    pub const fn bytes(&self) -> Bytes {
        self.bytes
    }
}

/// The handoff payload of a grouped model: it counts blocks, per group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockPayload {
    transferred_tokens: Tokens,
    hit: Tokens,
    groups: Vec<GroupTransfer>,
    total_bytes: Bytes,
    fixed_bytes: Bytes,
    full_decode_hit: bool,
}

impl BlockPayload {
    /// T: the prompt tokens the prefill computed (N − 1 for a Mamba-type
    /// model); the decode rank computes the other N − T.
    pub const fn transferred_tokens(&self) -> Tokens {
        self.transferred_tokens
    }
    /// The decode hit, [`decode_hit_tokens`]: leading prompt tokens the
    /// decode rank serves from its prefix cache in every group.
    pub const fn hit_tokens(&self) -> Tokens {
        self.hit
    }
    /// Per group, in the model's group order.
    pub fn groups(&self) -> &[GroupTransfer] {
        &self.groups
    }
    /// Bytes of every group.
    pub const fn total_bytes(&self) -> Bytes {
        self.total_bytes
    }
    /// Bytes of the groups that are not full attention (window and state):
    /// 36,927,488 for the GLM-5.3-Flash-like model at TP 4.
    pub const fn fixed_bytes(&self) -> Bytes {
        self.fixed_bytes
    }
    /// Bytes of the full-attention groups: `total − fixed`.
    pub const fn full_attention_bytes(&self) -> Bytes {
        Bytes::new(self.total_bytes.get() - self.fixed_bytes.get())
    }
    /// Whether the decode hit covers all of T, so vLLM moves nothing at all
    /// (notification only). Only a Mamba-type model can have one: otherwise
    /// T = N and a hit never covers the last prompt token.
    pub const fn full_decode_hit(&self) -> bool {
        self.full_decode_hit
    }
}

/// The KV a handoff moves for one request on one TP rank; its variant says
/// whether it counts tokens (linear) or blocks (grouped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// A linear model's payload, in tokens.
    Tokens(TokenPayload),
    /// A grouped model's payload, in blocks per group.
    Blocks(BlockPayload),
}

impl Payload {
    /// All bytes that move; the one number a link needs.
    pub const fn bytes(&self) -> Bytes {
        match self {
            Payload::Tokens(p) => p.bytes,
            Payload::Blocks(p) => p.total_bytes,
        }
    }
    /// T: the prompt tokens the prefill handed off; the decode rank computes
    /// the rest of the prompt.
    pub const fn transferred_tokens(&self) -> Tokens {
        match self {
            Payload::Tokens(p) => p.transferred_tokens,
            Payload::Blocks(p) => p.transferred_tokens,
        }
    }
    /// Whether nothing moves (a full decode hit): the decode rank only
    /// notifies the prefill rank.
    pub const fn moves_nothing(&self) -> bool {
        self.bytes().is_zero()
    }
}

/// The decode hit vLLM serves from a prefix cache that holds the first K
/// prompt tokens of an N-token prompt, in every group: `min(K, N − 1)`
/// rounded down to the hit alignment L.
///
/// - A hit never covers the last prompt token: vLLM looks up at most
///   N − 1 tokens (`kv_cache_manager.py` `get_computed_blocks`), so the
///   last one is computed for its logits.
/// - L is the least common multiple of every group's block size (vLLM's
///   scheduler block size, `kv_cache_utils.py`
///   `resolve_kv_cache_block_sizes`; the decode scheduler offers the
///   connector a hit rounded down to it); a linear model's block size.
/// - Every kind of group hits, so a model without full attention (window
///   or Mamba only) hits too. A grouped model with no prefix-cacheable
///   group has no hit.
///
/// GLM-5.3-Flash-like (B = 2,176 everywhere), N = K = 2,176: min(2,176,
/// 2,175) = 2,175 → 0 (nothing cached counts). Full attention B = 16 with a
/// window group of B = 32, K = 500: L = 32, hit 480.
pub fn decode_hit_tokens(model: &Model, prompt_tokens: Tokens, decode_cached_tokens: Tokens) -> Tokens {
    let limit = decode_cached_tokens.min(prompt_tokens.saturating_sub(Tokens::new(1)));
    let align = match model {
        Model::Linear(m) => m.block_size(),
        Model::Grouped(m) => match m.hit_alignment() {
            Some(l) => l,
            None => return Tokens::ZERO,
        },
    };
    limit.blocks_floor(align).tokens(align)
}

/// The payload of handing off an N-token prompt to a decode rank whose
/// prefix cache holds the first `decode_cached_tokens` (K) prompt tokens;
/// the hit is [`decode_hit_tokens`] (h tokens, a whole number of blocks of
/// every group).
///
/// Linear model (block size B): `cdiv(N, B) − h / B` blocks of `B ×
/// kv_bytes_per_token` bytes: vLLM reads whole blocks, a partly filled last
/// one included.
///
/// Grouped model, T = [`transferred_tokens`]:
/// - full attention: `cdiv(T, B) − h / B` blocks;
/// - window: the [`in_window_blocks`](super::window::in_window_blocks) of T that the hit does not hold
///   (vLLM's decode side allocates only uncached in-window blocks, and its
///   worker reads the last `n_local` of the remote blocks per non-Mamba
///   group): `cdiv(T, B) − max(skipped(T), h / B)`;
/// - state: [`STATE_BLOCKS`];
/// - bytes per group = blocks × `transfer_bytes_per_block`, never
///   `page_bytes`.
///
/// When the hit covers all of T (h ≥ T, a Mamba-type model whose N − 1 is a
/// multiple of L), vLLM moves nothing at all: decode's
/// `get_num_new_matched_tokens` returns `T − h = 0`, so there is nothing to
/// read and the handoff is a notification only. The payload is then zero
/// for every group and [`BlockPayload::full_decode_hit`] is true.
///
/// Checked against vLLM 0.33.0's own NIXL pull path on 10,000 queries
/// (`conformance/handoff.sh`; the recorded answers in
/// `conformance/handoff/`, checked in CI).
///
/// GLM-5.3-Flash-like model at TP 4, N = 1,000, K = 0: T = 999,
/// 13,045,120 × cdiv(999, 2,176) + 36,927,488 = 49,972,608 bytes; the same
/// for N = K = 2,176 (the hit is 0, see [`decode_hit_tokens`]).
///
/// # Errors
/// [`RuleError::EmptyPrompt`] for N = 0, [`RuleError::HitExceedsPrompt`]
/// for K > N (names `decode_cached_tokens`), [`RuleError::Overflow`] when the
/// bytes do not fit in `u64`.
pub fn payload(model: &Model, prompt_tokens: Tokens, decode_cached_tokens: Tokens) -> Result<Payload, RuleError> {
    check_query(prompt_tokens, decode_cached_tokens)?;
    let hit = decode_hit_tokens(model, prompt_tokens, decode_cached_tokens);
    match model {
        Model::Linear(m) => linear_payload(m, prompt_tokens, hit).map(Payload::Tokens),
        Model::Grouped(m) => {
            let t = transferred_tokens(model, prompt_tokens);
            grouped_payload(m, prompt_tokens, t, hit).map(Payload::Blocks)
        }
    }
}

fn check_query(prompt_tokens: Tokens, decode_cached_tokens: Tokens) -> Result<(), RuleError> {
    if prompt_tokens.is_zero() {
        return Err(RuleError::EmptyPrompt);
    }
    if decode_cached_tokens > prompt_tokens {
        return Err(RuleError::HitExceedsPrompt { cached: decode_cached_tokens.get(), prompt: prompt_tokens.get() });
    }
    Ok(())
}

/// What a handoff moves, in brief: T, the bytes, and whether nothing moves.
/// The same numbers as [`payload`], without the per-group breakdown (and
/// without allocating), for a simulation that prices every request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandoffSize {
    /// T, the prompt tokens the prefill handed off.
    pub transferred_tokens: Tokens,
    /// All bytes that move.
    pub bytes: Bytes,
    /// Whether nothing moves (a full decode hit on a Mamba-type model), as
    /// [`Payload::moves_nothing`]; a linear handoff always moves its last
    /// block.
    pub moves_nothing: bool,
}

/// [`payload`]'s T, bytes and "moves nothing", with the same errors.
pub fn handoff_size(
    model: &Model,
    prompt_tokens: Tokens,
    decode_cached_tokens: Tokens,
) -> Result<HandoffSize, RuleError> {
    handoff_size_split(model, prompt_tokens, decode_cached_tokens, decode_cached_tokens)
}

/// [`handoff_size`] of a load whose sliding-window groups hit only the
/// first `window_cached_tokens` on their own (at most K): beside a Mamba
/// state vLLM's connector lookup keeps each group's hit apart
/// (`get_computed_blocks_for_connector`), and a window group reads the
/// in-window blocks past its own hit. W = 128, B = 32, T = 48, a
/// full-attention hit of 32 tokens and a window hit of 0: the window reads
/// cdiv(48, 32) − max(0, 0) = 2 blocks, not 1.
pub fn handoff_size_split(
    model: &Model,
    prompt_tokens: Tokens,
    decode_cached_tokens: Tokens,
    window_cached_tokens: Tokens,
) -> Result<HandoffSize, RuleError> {
    check_query(prompt_tokens, decode_cached_tokens)?;
    let hit = decode_hit_tokens(model, prompt_tokens, decode_cached_tokens);
    let window_hit = decode_hit_tokens(model, prompt_tokens, window_cached_tokens.min(decode_cached_tokens));
    match model {
        Model::Linear(m) => {
            let p = linear_payload(m, prompt_tokens, hit)?;
            Ok(HandoffSize {
                transferred_tokens: p.transferred_tokens,
                bytes: p.bytes,
                moves_nothing: p.bytes.is_zero(),
            })
        }
        Model::Grouped(m) => {
            let t = transferred_tokens(model, prompt_tokens);
            let mut total = Bytes::ZERO;
            if hit < t {
                for g in m.groups() {
                    let h = if g.kind() == CacheGroupKind::SlidingWindow { window_hit } else { hit };
                    let bytes = moved_blocks(g, t, h)
                        .checked_bytes(g.transfer_bytes_per_block())
                        .and_then(|b| total.checked_add(b))
                        .ok_or(RuleError::Overflow { prompt: prompt_tokens.get() })?;
                    total = bytes;
                }
            }
            Ok(HandoffSize { transferred_tokens: t, bytes: total, moves_nothing: total.is_zero() })
        }
    }
}

/// `hit` is [`decode_hit_tokens`], below N.
fn linear_payload(m: &LinearModel, n: Tokens, hit: Tokens) -> Result<TokenPayload, RuleError> {
    let b = m.block_size();
    let blocks = Blocks::new(n.blocks_ceil(b).get() - hit.blocks_floor(b).get());
    let overflow = RuleError::Overflow { prompt: n.get() };
    let tokens = blocks.get().checked_mul(b.get()).map(Tokens::new).ok_or_else(|| overflow.clone())?;
    let bytes = tokens.checked_bytes(m.kv_bytes_per_token()).ok_or(overflow)?;
    Ok(TokenPayload { transferred_tokens: n, hit, blocks, tokens, bytes })
}

/// `hit` is [`decode_hit_tokens`].
fn grouped_payload(m: &GroupedModel, n: Tokens, t: Tokens, hit: Tokens) -> Result<BlockPayload, RuleError> {
    let overflow = RuleError::Overflow { prompt: n.get() };
    let full_hit = hit >= t;
    let mut groups = Vec::with_capacity(m.groups().len());
    let mut total = Bytes::ZERO;
    let mut fixed = Bytes::ZERO;
    for g in m.groups() {
        let blocks = if full_hit { Blocks::ZERO } else { moved_blocks(g, t, hit) };
        let bytes = blocks.checked_bytes(g.transfer_bytes_per_block()).ok_or_else(|| overflow.clone())?;
        total = total.checked_add(bytes).ok_or_else(|| overflow.clone())?;
        if g.kind() != CacheGroupKind::FullAttention {
            fixed += bytes; // fixed ≤ total, which did not overflow
        }
        groups.push(GroupTransfer { name: g.name().to_owned(), kind: g.kind(), blocks, bytes });
    }
    Ok(BlockPayload {
        transferred_tokens: t,
        hit,
        groups,
        total_bytes: total,
        fixed_bytes: fixed,
        full_decode_hit: full_hit,
    })
}

/// Blocks of `g` that move for T tokens when the decode rank caches the
/// first `hit` tokens (a whole number of `g`'s blocks, below T).
fn moved_blocks(g: &CacheGroup, t: Tokens, hit: Tokens) -> Blocks {
    let b = g.block_size();
    match (g.kind(), g.window()) {
        (CacheGroupKind::State, _) => STATE_BLOCKS,
        (CacheGroupKind::FullAttention, _) | (CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution, None) => {
            let all = full_attention_blocks(t, b);
            all.saturating_sub(hit.blocks_floor(b))
        }
        (CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution, Some(w)) => {
            let all = t.blocks_ceil(b);
            let first_needed = skipped_blocks(t, w, b).max(hit.blocks_floor(b).min(all));
            all - first_needed
        }
    }
}

/// What the prefill side does with one group's blocks when a handoff prefill
/// completes; `keep + free = held`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GroupRelease {
    held: Blocks,
    keep: Blocks,
    free: Blocks,
}

impl GroupRelease {
    /// Blocks the group held at completion.
    pub const fn held(&self) -> Blocks {
        self.held
    }
    /// Blocks kept for the transfer (the source).
    pub const fn keep(&self) -> Blocks {
        self.keep
    }
    /// Blocks freed now (they stay in the prefix cache where caching is on).
    pub const fn free(&self) -> Blocks {
        self.free
    }
}

/// The release of a completed handoff prefill, per group in the model's
/// group order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceRelease {
    groups: Vec<GroupRelease>,
}

impl SourceRelease {
    /// Per group, in the model's group order.
    pub fn groups(&self) -> &[GroupRelease] {
        &self.groups
    }
    /// Blocks held at completion, all groups.
    pub fn held(&self) -> Blocks {
        self.groups.iter().map(|g| g.held).sum()
    }
    /// Blocks kept as the source, all groups.
    pub fn kept(&self) -> Blocks {
        self.groups.iter().map(|g| g.keep).sum()
    }
    /// Blocks freed at completion, all groups.
    pub fn freed(&self) -> Blocks {
        self.groups.iter().map(|g| g.free).sum()
    }
}

/// What the prefill rank frees when a handoff prefill of T = `computed` tokens
/// completes, before it holds the source for the transfer. `last_step_from`
/// is where the last prefill step started (0 for a prompt prefilled in one
/// step); `with_checkpoints` as for [`blocks_for_step`].
///
/// Held per group = [`blocks_for_step`]`(last_step_from, computed)`; kept =
/// [`blocks_held`]`(computed)`: a window group keeps its in-window blocks
/// only; a state group keeps its running block, so a Mamba-type group frees
/// its checkpoint blocks (vLLM 0.32.0); full attention keeps every block.
/// vLLM (since 0.18, `v1/core/sched/scheduler.py`) runs
/// `remove_skipped_blocks` when a connector-held request finishes.
///
/// 1,024 tokens in one step, W = 32, B = 16: the window group holds 64,
/// keeps 2, frees 62. GLM-5.3-Flash-like model on 0.32.0, N = 8,192
/// (T = 8,191) in one step: holds 4 + 1 + 4 × 2 = 13 blocks, keeps 9, frees
/// the 4 checkpoint blocks.
pub fn source_release(
    model: &GroupedModel,
    last_step_from: Tokens,
    computed: Tokens,
    with_checkpoints: bool,
) -> SourceRelease {
    let groups = model.groups().iter().map(|g| group_release(g, last_step_from, computed, with_checkpoints)).collect();
    SourceRelease { groups }
}

/// [`source_release`] for one group: what it held during the last prefill
/// step (`last_step_from..computed`), keeps as the source, and frees. The
/// prefill rank's pool applies exactly this, group by group.
pub fn group_release(
    group: &CacheGroup,
    last_step_from: Tokens,
    computed: Tokens,
    with_checkpoints: bool,
) -> GroupRelease {
    let held = blocks_for_step(group, last_step_from, computed, with_checkpoints);
    let keep = blocks_held(group, computed);
    debug_assert!(keep <= held, "group {:?} keeps more than it holds", group.name());
    let keep = keep.min(held);
    GroupRelease { held, keep, free: held - keep }
}
