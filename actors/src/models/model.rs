//! Models and their cache groups, the vLLM versions pdsim knows, and the
//! gates that refuse a rank or a pairing before any arithmetic runs.
//!
//! Scenario files carry a [`ModelSpec`] (every optional field an `Option`, so
//! a missing field becomes a [`GateError`] that names the role and the field,
//! not a parse error). [`ModelSpec::validate`] turns it into a [`Model`]:
//! either [`LinearModel`] (counts the handoff in tokens) or [`GroupedModel`]
//! (counts it in blocks, per cache group). Validated types have private
//! fields, so every `Model` in the program has passed the gate.
//!
//! ```
//! use actors::model::{CacheGroupKind, ModelSpec, Role};
//! use actors::units::Bytes;
//!
//! let spec = ModelSpec {
//!     name: Some("llama-like".into()),
//!     kv_bytes_per_token: Some(Bytes::new(32_768)),
//!     ..Default::default()
//! };
//! let model = spec.validate(Role::Prefill).unwrap();
//! assert!(model.as_linear().is_some());
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};
use sim_core::SimDuration;

use crate::base::units::{Blocks, Bytes, Tokens};

/// What a cache group holds for the computed tokens of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheGroupKind {
    /// Every block of the computed tokens (vLLM `FullAttentionSpec`).
    FullAttention,
    /// The blocks inside the window of the next token (vLLM
    /// `SlidingWindowSpec`).
    SlidingWindow,
    /// A short convolution over the last tokens; treated as a window of
    /// `window_tokens`.
    Convolution,
    /// One running block: a Mamba / linear-attention state, or the one block
    /// of a tail ring (vLLM `MambaSpec`).
    State,
}

impl CacheGroupKind {
    /// Whether the group holds a window of tokens (`sliding_window` or
    /// `convolution`) and so needs `window_tokens`.
    pub const fn is_window(self) -> bool {
        matches!(self, CacheGroupKind::SlidingWindow | CacheGroupKind::Convolution)
    }

    /// The name used in scenario files: `full_attention`, `sliding_window`,
    /// `convolution`, `state`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CacheGroupKind::FullAttention => "full_attention",
            CacheGroupKind::SlidingWindow => "sliding_window",
            CacheGroupKind::Convolution => "convolution",
            CacheGroupKind::State => "state",
        }
    }
}

impl fmt::Display for CacheGroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One cache group as a scenario file gives it (not yet validated).
///
/// In TOML, one `[[model.cache_groups]]` table:
///
/// ```toml
/// [[model.cache_groups]]
/// name = "kda 0"
/// kind = "state"
/// block_size_tokens = 2176
/// page_bytes = 13045120
/// transfer_bytes_per_block = 9768960
/// prefix_cacheable = true
/// checkpoint_blocks = 1
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheGroupSpec {
    /// A name unique within the model, used in errors and reports.
    pub name: String,
    /// What the group holds.
    pub kind: CacheGroupKind,
    /// Tokens per block (B).
    pub block_size_tokens: Tokens,
    /// Bytes of one pool block, padding included (every group shares one pool
    /// whose blocks all have this size).
    pub page_bytes: Bytes,
    /// Bytes that move for one block of this group on one TP rank, padding
    /// excluded. Required.
    pub transfer_bytes_per_block: Option<Bytes>,
    /// Whether the group's blocks enter the prefix cache. Required; a `state`
    /// group with `true` is a Mamba-type state.
    pub prefix_cacheable: Option<bool>,
    /// The window (W) of a `sliding_window` or `convolution` group; refused on
    /// other kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_tokens: Option<Tokens>,
    /// Prefill checkpoint blocks of a Mamba-type state group: extra blocks the
    /// prefill step that reaches the end of the prompt takes in this group
    /// (vLLM's `MambaSpec.num_prefill_checkpoint_blocks`, which each model
    /// family's layer sets: 1 for Kimi and GLM5Next KDA with a checkpointing
    /// backend, the Mamba2 mixer and Qwen GDN), freed when the prefill
    /// completes; never moved. vLLM takes them only with prefix caching on
    /// ("align" mode), and so does a prefill rank here. Absent means 0;
    /// refused on other groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_blocks: Option<Blocks>,
    /// The heads behind the group's bytes, over the whole model (not per
    /// rank): KV heads of an attention group, heads of a state group. With
    /// the model's `tp`, they let a rank of another TP size derive its
    /// bytes ([`crate::models::tp`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<u32>,
}

/// A model as a scenario file gives it (not yet validated): exactly one of
/// `kv_bytes_per_token` (linear) or `cache_groups` (grouped).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// A display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// KV bytes of one token on one TP rank, for a linear model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_bytes_per_token: Option<Bytes>,
    /// The cache groups of a grouped model, in vLLM's group order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache_groups: Vec<CacheGroupSpec>,
    /// The TP size the byte counts are given for (per TP rank at this
    /// size). Absent: at the ranks' own `tp`, which must then be the same
    /// on prefill and decode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<u32>,
    /// KV heads of a linear model (over the whole model), for other TP
    /// sizes (see `tp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u32>,
    /// The model's layers ([`crate::models::arch`]), for the step-time models that
    /// price a step from its work (roofline) and for KV capacity from GPU
    /// memory. The cache groups above stay what the handoff moves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<crate::models::arch::ModelArch>,
}

/// A validated cache group: every field present and consistent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheGroup {
    name: String,
    kind: CacheGroupKind,
    block_size: Tokens,
    page_bytes: Bytes,
    transfer_bytes_per_block: Bytes,
    prefix_cacheable: bool,
    window: Option<Tokens>,
    checkpoint_blocks: Blocks,
}

impl CacheGroup {
    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What the group holds.
    pub const fn kind(&self) -> CacheGroupKind {
        self.kind
    }
    /// Tokens per block (B), never zero.
    pub const fn block_size(&self) -> Tokens {
        self.block_size
    }
    /// Bytes of one pool block, padding included, never zero.
    pub const fn page_bytes(&self) -> Bytes {
        self.page_bytes
    }
    /// Bytes that move for one block, never zero and never above
    /// [`CacheGroup::page_bytes`].
    pub const fn transfer_bytes_per_block(&self) -> Bytes {
        self.transfer_bytes_per_block
    }
    /// Whether the group's blocks enter the prefix cache.
    pub const fn prefix_cacheable(&self) -> bool {
        self.prefix_cacheable
    }
    /// The window (W) of a window group, never zero; `None` for other kinds.
    pub const fn window(&self) -> Option<Tokens> {
        self.window
    }
    /// Prefill checkpoint blocks (non-zero only on a Mamba-type state group).
    pub const fn checkpoint_blocks(&self) -> Blocks {
        self.checkpoint_blocks
    }
    /// Whether this is a Mamba-type state: a `state` group that is prefix
    /// cacheable (a tail ring is a `state` group that is not).
    pub const fn is_mamba_state(&self) -> bool {
        matches!(self.kind, CacheGroupKind::State) && self.prefix_cacheable
    }
    /// This group as a sliding window of `window` tokens (W ≥ 1), all else
    /// alike: how a KV pool may hold a full-attention group whose blocks
    /// never leave a window longer than any sequence.
    pub(crate) fn as_window(&self, window: Tokens) -> CacheGroup {
        debug_assert!(!window.is_zero());
        CacheGroup { kind: CacheGroupKind::SlidingWindow, window: Some(window), ..self.clone() }
    }
}

/// The block size of a linear model whose rank names none: vLLM's default
/// on GPUs, 16 tokens.
pub const DEFAULT_LINEAR_BLOCK_SIZE: Tokens = Tokens::new(16);

/// A validated linear model: one rate of KV bytes per token, in one
/// full-attention group of blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearModel {
    name: Option<String>,
    kv_bytes_per_token: Bytes,
    block_size: Tokens,
}

impl LinearModel {
    /// The display name, if the file gave one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
    /// KV bytes of one token on one TP rank, never zero.
    pub const fn kv_bytes_per_token(&self) -> Bytes {
        self.kv_bytes_per_token
    }
    /// Tokens per block (the rank's `block_size_tokens`,
    /// [`DEFAULT_LINEAR_BLOCK_SIZE`] unless [`Model::with_block_size`] set
    /// it), never zero: a handoff moves whole blocks.
    pub const fn block_size(&self) -> Tokens {
        self.block_size
    }
}

/// A validated grouped model: its cache groups and what they imply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupedModel {
    name: Option<String>,
    groups: Vec<CacheGroup>,
    mamba_type: bool,
    full_attention_block_size: Option<Tokens>,
    page_bytes: Bytes,
}

impl GroupedModel {
    /// The display name, if the file gave one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
    /// The cache groups, in file order (never empty).
    pub fn groups(&self) -> &[CacheGroup] {
        &self.groups
    }
    /// Whether any group is a Mamba-type state, which makes vLLM stop the
    /// prefill one token short.
    pub const fn is_mamba_type(&self) -> bool {
        self.mamba_type
    }
    /// The one block size of the full-attention groups, `None` when the model
    /// has none.
    pub const fn full_attention_block_size(&self) -> Option<Tokens> {
        self.full_attention_block_size
    }
    /// Bytes of one pool block (every group's `page_bytes`).
    pub const fn page_bytes(&self) -> Bytes {
        self.page_bytes
    }
    /// What a prefix hit is a multiple of: the least common multiple of
    /// every group's block size (vLLM's scheduler block size); `None` when
    /// no group is prefix cacheable (no hit at all).
    pub fn hit_alignment(&self) -> Option<Tokens> {
        if !self.groups.iter().any(|g| g.prefix_cacheable()) {
            return None;
        }
        Some(block_size_lcm(&self.groups))
    }
}

/// The least common multiple of the groups' block sizes (1 for none),
/// saturating.
pub(crate) fn block_size_lcm(groups: &[CacheGroup]) -> Tokens {
    let lcm = groups.iter().map(|g| g.block_size().get()).fold(1u64, |a, b| {
        let (mut x, mut y) = (a, b);
        while y != 0 {
            (x, y) = (y, x % y);
        }
        (a / x).saturating_mul(b)
    });
    Tokens::new(lcm)
}

/// A validated model: linear (tokens) or grouped (blocks); the two never mix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Model {
    /// One rate of KV bytes per token; the handoff counts tokens.
    Linear(LinearModel),
    /// Cache groups; the handoff counts blocks per group.
    Grouped(GroupedModel),
}

impl Model {
    /// The display name, if the file gave one.
    pub fn name(&self) -> Option<&str> {
        match self {
            Model::Linear(m) => m.name(),
            Model::Grouped(m) => m.name(),
        }
    }
    /// The grouped model, if this is one.
    pub fn as_grouped(&self) -> Option<&GroupedModel> {
        match self {
            Model::Grouped(m) => Some(m),
            Model::Linear(_) => None,
        }
    }
    /// The linear model, if this is one.
    pub fn as_linear(&self) -> Option<&LinearModel> {
        match self {
            Model::Linear(m) => Some(m),
            Model::Grouped(_) => None,
        }
    }
    /// Whether vLLM stops this model's handoff prefill one token short
    /// (a grouped model with a Mamba-type state).
    pub fn is_mamba_type(&self) -> bool {
        matches!(self, Model::Grouped(m) if m.is_mamba_type())
    }
    /// The model as a rank whose `block_size_tokens` is `block_size` runs
    /// it: a linear model takes the block size (its handoff moves whole
    /// blocks of it); a grouped model's groups name their own, and it is
    /// returned as is. A zero block size is ignored (validation refuses one).
    #[must_use]
    pub fn with_block_size(mut self, block_size: Tokens) -> Model {
        if let Model::Linear(m) = &mut self
            && !block_size.is_zero()
        {
            m.block_size = block_size;
        }
        self
    }
}

/// The role of a rank in a deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Computes prompts and is the source of handoffs.
    Prefill,
    /// Receives handoffs and decodes.
    Decode,
    /// Does both, with no handoff.
    Aggregated,
}

/// Which end of a handoff a command belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandoffSide {
    /// SubmitHandoffPrefill, ReleaseSource, CancelSource.
    Source,
    /// ReserveDestination, StartTransfer, CancelDestination and the like.
    Destination,
}

impl Role {
    /// The name used in scenario files and errors: `prefill`, `decode`,
    /// `aggregated`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Aggregated => "aggregated",
        }
    }

    /// Whether a rank of this role accepts handoff commands of `side`: source
    /// commands only on prefill ranks, destination commands only on decode
    /// ranks, none on an aggregated rank.
    pub const fn accepts(self, side: HandoffSide) -> bool {
        matches!((self, side), (Role::Prefill, HandoffSide::Source) | (Role::Decode, HandoffSide::Destination))
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One vLLM release pdsim knows, with the facts that change its rules.
///
/// Rows live in [`VLLM_VERSIONS`]; adding a version is adding one row.
/// What a release does with a family's Mamba-type state (its prefill
/// checkpoint blocks) is not here: the model fragment says it
/// (`checkpoint_blocks`), since vLLM sets it per model family and backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VllmVersion {
    /// The version string as a scenario file writes it, e.g. `"0.32.0"`.
    pub version: &'static str,
    /// Whether vLLM's NIXL connector moves grouped (hybrid) caches by group in
    /// this release, so a grouped prefill or decode rank may run it.
    pub grouped_handoff: bool,
    /// The lease under which the prefill side holds a source
    /// (`kv_lease_duration`): granted when the source is held, renewed by
    /// the decode rank's heartbeats every lease/6, each extending it to 2/3
    /// of a lease ahead, reaped every step. A source lapses only once its
    /// decode rank has gone silent.
    pub source_lease: SimDuration,
    /// Whether the engine core runs the asynchronous scheduler by default
    /// (`--async-scheduling` unset): a batch scheduled while the one before
    /// it executes (`crate::vllm::engine`).
    pub async_scheduling: bool,
    /// What its OpenAI-compatible API server adds to a request's path
    /// between the client and the engine core.
    pub front_end: FrontEnd,
    /// Where in the release the row's facts were read.
    pub source: &'static str,
}

/// The path between a client and the engine core through vLLM's
/// OpenAI-compatible API server, as fixed times a request spends on it.
///
/// - `request`: from the request's arrival at the server to its place in
///   the engine core's input queue: the HTTP handler, tokenizing the
///   prompt, the input processor, the hand-off to the engine core's
///   process (ZMQ) and the core's input thread.
/// - `response`: from a step's outputs leaving the engine core to the
///   client's stream: the core's output thread, ZMQ, the API server's
///   output handler (detokenizing), the response's SSE chunk.
///
/// A request meets `request` once on its way in and every output meets
/// `response` once on its way out, so TTFT and E2E grow by their sum and
/// the gaps between tokens do not change. In P/D, the proxy waits for the
/// prefill server's answer before it sends the request to the decode
/// server: that hop crosses one `response` (prefill server) and one
/// `request` (decode server) between the prefill's end and the decode
/// rank's reservation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrontEnd {
    /// Arrival at the server to the engine core's input queue.
    pub request: SimDuration,
    /// A step's outputs to the client's stream.
    pub response: SimDuration,
}

/// The front end of every release pdsim knows, and of one it does not:
/// 3.6 ms each way, 7.2 ms in all.
///
/// From the real H100 servers of `validation/` (vLLM v0.15.1 with its
/// asynchronous engine loop, Llama-2-7B and Mixtral-8x7B, measured by a
/// streaming client on the same cluster): with the async loop a request
/// that arrives during a step is first scheduled two steps later, so its
/// first token leaves the engine after the rest of that step and two more,
/// (2 + U) steps for U uniform on [0, 1): the median TTFT is the front end
/// plus 2.5 step periods, and the step period is the measured TPOT. Median
/// TTFT − 2.5 × TPOT at the eight points under 10 req/s: 6.1, 6.3, 6.4,
/// 6.7, 7.7, 7.9, 9.0 and 9.2 ms, median 7.2 ms (independent of pdsim's
/// step-time model). The data fix the sum of the two legs only; the split
/// is even (each crosses the process boundary once and runs Python on the
/// API server's event loop once).
pub const DEFAULT_FRONT_END: FrontEnd =
    FrontEnd { request: SimDuration::from_micros(3_600), response: SimDuration::from_micros(3_600) };

/// The vLLM versions pdsim knows, oldest first.
///
/// All three move grouped caches by the same rules and hold a source under
/// a 30 s lease (read in the released wheels, `nixl/base_scheduler.py`
/// `kv_lease_duration` default 30, heartbeats every `lease // 6`,
/// `base_worker.py` extension to `now + lease * 2 // 3`). 0.32.0 to 0.33.0
/// changes nothing in hybrid payloads, holding or backoff. Each runs the
/// asynchronous scheduler unless an option it does not support is set
/// (0.33.0: `config/vllm.py:1685-1719`; the same default since 0.27,
/// `config/vllm.py:1095-1143` there).
pub static VLLM_VERSIONS: &[VllmVersion] = &[
    VllmVersion {
        version: "0.31.0",
        grouped_handoff: true,
        source_lease: DEFAULT_SOURCE_LEASE,
        async_scheduling: true,
        front_end: DEFAULT_FRONT_END,
        source: "vllm 0.31.0 wheel: kv_connector/v1/nixl/base_scheduler.py (kv_lease_duration = 30)",
    },
    VllmVersion {
        version: "0.32.0",
        grouped_handoff: true,
        source_lease: DEFAULT_SOURCE_LEASE,
        async_scheduling: true,
        front_end: DEFAULT_FRONT_END,
        source: "vllm 0.32.0 wheel: kv_connector/v1/nixl/base_scheduler.py (kv_lease_duration = 30)",
    },
    VllmVersion {
        version: "0.33.0",
        grouped_handoff: true,
        source_lease: DEFAULT_SOURCE_LEASE,
        async_scheduling: true,
        front_end: DEFAULT_FRONT_END,
        source: "vllm 0.33.0 wheel: kv_connector/v1/nixl/base_scheduler.py:81-88 (kv_lease_duration = 30)",
    },
];

/// The source lease of a rank whose version pdsim does not know: vLLM's
/// default `kv_lease_duration`, 30 s (every release since 0.25).
pub const DEFAULT_SOURCE_LEASE: SimDuration = SimDuration::from_secs(30);

impl VllmVersion {
    /// The row of `version`, matched exactly (`"0.32.0"`, not `"v0.32"`).
    pub fn find(version: &str) -> Option<&'static VllmVersion> {
        VLLM_VERSIONS.iter().find(|v| v.version == version)
    }

    /// The versions a grouped rank of `role` may run, comma-separated (for
    /// error texts): those with `grouped_handoff` for a prefill or decode
    /// rank (`0.31.0, 0.32.0, 0.33.0`), every row for an aggregated rank.
    pub fn supported_for_grouped(role: Role) -> String {
        let names: Vec<&str> =
            VLLM_VERSIONS.iter().filter(|v| role == Role::Aggregated || v.grouped_handoff).map(|v| v.version).collect();
        names.join(", ")
    }
}

/// Where in a model a [`GateError`] points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A field of the rank or of the model itself.
    Model,
    /// A field of one cache group.
    Group {
        /// Position in `cache_groups`, from 0.
        index: usize,
        /// The group's name.
        name: String,
    },
}

/// Writes `cache_groups[2] "kda 0": ` for a group, nothing for the model.
impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Model => Ok(()),
            Location::Group { index, name } => write!(f, "cache_groups[{index}] {name:?}: "),
        }
    }
}

/// What is wrong with a field; every variant names its field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateProblem {
    /// A required field is absent.
    #[error("missing field {field}")]
    Missing {
        /// The field.
        field: &'static str,
    },
    /// A count that must be positive is zero.
    #[error("{field} must be greater than 0")]
    Zero {
        /// The field.
        field: &'static str,
    },
    /// A field is set where it has no meaning.
    #[error("{field} is not allowed {reason}")]
    NotAllowed {
        /// The field.
        field: &'static str,
        /// Why, starting with "on"/"with"/"for": `on a full_attention group`.
        reason: &'static str,
    },
    /// A model sets both `kv_bytes_per_token` and `cache_groups`.
    #[error(
        "kv_bytes_per_token and cache_groups are both set; a model is either linear \
         (kv_bytes_per_token) or grouped (cache_groups)"
    )]
    BothLinearAndGrouped,
    /// A model sets neither `kv_bytes_per_token` nor `cache_groups`.
    #[error("missing field kv_bytes_per_token or cache_groups (a model needs one of them)")]
    NeitherLinearNorGrouped,
    /// `transfer_bytes_per_block` is larger than `page_bytes`.
    #[error(
        "transfer_bytes_per_block {transfer} exceeds page_bytes {page}; a block cannot move \
         more than its page holds (give bytes per TP rank)"
    )]
    TransferExceedsPage {
        /// The transfer bytes given.
        transfer: u64,
        /// The page bytes given.
        page: u64,
    },
    /// Two groups share a name.
    #[error("name is a duplicate of cache_groups[{first}]")]
    DuplicateName {
        /// Index of the first group with this name.
        first: usize,
    },
    /// Full-attention groups disagree on their block size.
    #[error(
        "block_size_tokens {this} differs from {first} of full-attention group \
         cache_groups[{first_index}]; the full-attention groups share one block size"
    )]
    FullAttentionBlockSize {
        /// This group's block size.
        this: u64,
        /// The first full-attention group's block size.
        first: u64,
        /// Index of the first full-attention group.
        first_index: usize,
    },
    /// Prefix-cacheable state groups disagree on their block size.
    #[error(
        "block_size_tokens {this} differs from {first} of prefix-cacheable state group \
         cache_groups[{first_index}]; the prefix-cacheable state groups share one block size \
         (vLLM gives every Mamba layer one `mamba_block_size`, and checkpoints them together)"
    )]
    StateBlockSize {
        /// This group's block size.
        this: u64,
        /// The first prefix-cacheable state group's block size.
        first: u64,
        /// Index of the first prefix-cacheable state group.
        first_index: usize,
    },
    /// Groups disagree on the page size of the one shared pool.
    #[error(
        "page_bytes {this} differs from {first} of cache_groups[0]; every group draws from \
         one block pool, so vLLM pads all pages to one size"
    )]
    PageBytes {
        /// This group's page bytes.
        this: u64,
        /// The first group's page bytes.
        first: u64,
    },
    /// A grouped prefill or decode rank has no `vllm_version`.
    #[error("missing field vllm_version (a grouped {role} rank needs one of: {supported})")]
    MissingVersion {
        /// The rank's role.
        role: Role,
        /// The supported versions.
        supported: String,
    },
    /// A grouped rank names a version pdsim does not support for it.
    #[error("vllm_version {given:?} is not supported for a grouped {role} rank (supported: {supported})")]
    UnsupportedVersion {
        /// The version given.
        given: String,
        /// The rank's role.
        role: Role,
        /// The supported versions.
        supported: String,
    },
    /// A grouped rank is paired with a linear one.
    #[error(
        "cache_groups: a {this} {role} rank cannot pair with a {other} {other_role} rank \
         (a grouped rank counts the handoff in blocks, a linear rank in tokens)"
    )]
    LinearWithGrouped {
        /// This rank's role.
        role: Role,
        /// `grouped` or `linear`.
        this: &'static str,
        /// The other rank's role.
        other_role: Role,
        /// `grouped` or `linear`.
        other: &'static str,
    },
    /// Paired ranks have different cache groups.
    #[error("cache_groups differ from the {other_role} rank's: {detail}")]
    GroupsDiffer {
        /// The other rank's role.
        other_role: Role,
        /// The first difference found.
        detail: String,
    },
    /// Paired linear ranks have different KV bytes per token.
    #[error("kv_bytes_per_token {this} differs from the {other_role} rank's {other}")]
    KvBytesDiffer {
        /// This rank's value.
        this: u64,
        /// The other rank's role.
        other_role: Role,
        /// The other rank's value.
        other: u64,
    },
}

impl GateProblem {
    /// The field the problem is about, as scenario files spell it.
    pub fn field(&self) -> &'static str {
        match self {
            GateProblem::Missing { field } | GateProblem::Zero { field } | GateProblem::NotAllowed { field, .. } => {
                field
            }
            GateProblem::BothLinearAndGrouped | GateProblem::NeitherLinearNorGrouped => "cache_groups",
            GateProblem::TransferExceedsPage { .. } => "transfer_bytes_per_block",
            GateProblem::DuplicateName { .. } => "name",
            GateProblem::FullAttentionBlockSize { .. } | GateProblem::StateBlockSize { .. } => "block_size_tokens",
            GateProblem::PageBytes { .. } => "page_bytes",
            GateProblem::MissingVersion { .. } | GateProblem::UnsupportedVersion { .. } => "vllm_version",
            GateProblem::LinearWithGrouped { .. } | GateProblem::GroupsDiffer { .. } => "cache_groups",
            GateProblem::KvBytesDiffer { .. } => "kv_bytes_per_token",
        }
    }
}

/// A rank, a model or a pairing refused by a gate. The text names the role,
/// the group where there is one, and the field:
/// `decode rank: cache_groups[2] "kda 0": missing field transfer_bytes_per_block`.
///
/// The harness prefixes the file position.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{role} rank: {location}{problem}")]
pub struct GateError {
    /// The role of the rank refused.
    pub role: Role,
    /// Where in the model, if in a group.
    pub location: Location,
    /// What is wrong.
    pub problem: GateProblem,
}

impl GateError {
    fn model(role: Role, problem: GateProblem) -> Self {
        GateError { role, location: Location::Model, problem }
    }

    fn group(role: Role, index: usize, name: &str, problem: GateProblem) -> Self {
        GateError { role, location: Location::Group { index, name: name.to_owned() }, problem }
    }

    /// The field refused, as scenario files spell it.
    pub fn field(&self) -> &'static str {
        self.problem.field()
    }
}

impl CacheGroupSpec {
    /// Checks this group alone (as group `index` of a `role` rank) and returns
    /// the validated group. Cross-group checks are in [`ModelSpec::validate`].
    ///
    /// A group is refused when: `block_size_tokens` or `page_bytes` is 0;
    /// `transfer_bytes_per_block` or `prefix_cacheable` is missing;
    /// `transfer_bytes_per_block` is 0 or larger than `page_bytes`; a window
    /// kind lacks `window_tokens` or has 0; another kind has `window_tokens`;
    /// `checkpoint_blocks` is non-zero on a group that is not a Mamba-type
    /// state.
    pub fn validate(&self, role: Role, index: usize) -> Result<CacheGroup, GateError> {
        let err = |problem| GateError::group(role, index, &self.name, problem);
        if self.block_size_tokens.is_zero() {
            return Err(err(GateProblem::Zero { field: "block_size_tokens" }));
        }
        if self.page_bytes.is_zero() {
            return Err(err(GateProblem::Zero { field: "page_bytes" }));
        }
        let Some(transfer) = self.transfer_bytes_per_block else {
            return Err(err(GateProblem::Missing { field: "transfer_bytes_per_block" }));
        };
        if transfer.is_zero() {
            return Err(err(GateProblem::Zero { field: "transfer_bytes_per_block" }));
        }
        if transfer > self.page_bytes {
            return Err(err(GateProblem::TransferExceedsPage {
                transfer: transfer.get(),
                page: self.page_bytes.get(),
            }));
        }
        let Some(prefix_cacheable) = self.prefix_cacheable else {
            return Err(err(GateProblem::Missing { field: "prefix_cacheable" }));
        };
        let window = match (self.kind.is_window(), self.window_tokens) {
            (true, None) => return Err(err(GateProblem::Missing { field: "window_tokens" })),
            (true, Some(w)) if w.is_zero() => {
                return Err(err(GateProblem::Zero { field: "window_tokens" }));
            }
            (true, Some(w)) => Some(w),
            (false, None) => None,
            (false, Some(_)) => {
                return Err(err(GateProblem::NotAllowed {
                    field: "window_tokens",
                    reason: "on a group that is not sliding_window or convolution",
                }));
            }
        };
        let checkpoint_blocks = self.checkpoint_blocks.unwrap_or(Blocks::ZERO);
        let mamba_state = self.kind == CacheGroupKind::State && prefix_cacheable;
        if !checkpoint_blocks.is_zero() && !mamba_state {
            return Err(err(GateProblem::NotAllowed {
                field: "checkpoint_blocks",
                reason: "on a group that is not a prefix-cacheable state group",
            }));
        }
        Ok(CacheGroup {
            name: self.name.clone(),
            kind: self.kind,
            block_size: self.block_size_tokens,
            page_bytes: self.page_bytes,
            transfer_bytes_per_block: transfer,
            prefix_cacheable,
            window,
            checkpoint_blocks,
        })
    }
}

impl ModelSpec {
    /// Validates the model of a `role` rank; every refusal happens here,
    /// before any rule does arithmetic.
    ///
    /// Refused: both or neither of `kv_bytes_per_token` and `cache_groups`; a
    /// zero `kv_bytes_per_token`; any group [`CacheGroupSpec::validate`]
    /// refuses; two groups with one name; full-attention groups with
    /// different `block_size_tokens`; prefix-cacheable state groups with
    /// different `block_size_tokens`; groups with different `page_bytes`.
    ///
    /// ```
    /// use actors::model::{ModelSpec, Role};
    /// let err = ModelSpec::default().validate(Role::Decode).unwrap_err();
    /// assert!(err.to_string().starts_with("decode rank: missing field kv_bytes_per_token"));
    /// ```
    pub fn validate(&self, role: Role) -> Result<Model, GateError> {
        match (self.kv_bytes_per_token, self.cache_groups.is_empty()) {
            (Some(_), false) => Err(GateError::model(role, GateProblem::BothLinearAndGrouped)),
            (None, true) => Err(GateError::model(role, GateProblem::NeitherLinearNorGrouped)),
            (Some(kv), true) => {
                if kv.is_zero() {
                    return Err(GateError::model(role, GateProblem::Zero { field: "kv_bytes_per_token" }));
                }
                Ok(Model::Linear(LinearModel {
                    name: self.name.clone(),
                    kv_bytes_per_token: kv,
                    block_size: DEFAULT_LINEAR_BLOCK_SIZE,
                }))
            }
            (None, false) => self.validate_groups(role).map(Model::Grouped),
        }
    }

    fn validate_groups(&self, role: Role) -> Result<GroupedModel, GateError> {
        let mut groups: Vec<CacheGroup> = Vec::with_capacity(self.cache_groups.len());
        let mut first_fa: Option<(usize, Tokens)> = None;
        let mut first_state: Option<(usize, Tokens)> = None;
        for (index, spec) in self.cache_groups.iter().enumerate() {
            let group = spec.validate(role, index)?;
            if let Some(first) = groups.iter().position(|g| g.name == group.name) {
                return Err(GateError::group(role, index, &spec.name, GateProblem::DuplicateName { first }));
            }
            if let Some(first) = groups.first()
                && first.page_bytes != group.page_bytes
            {
                return Err(GateError::group(
                    role,
                    index,
                    &spec.name,
                    GateProblem::PageBytes { this: group.page_bytes.get(), first: first.page_bytes.get() },
                ));
            }
            // Full-attention groups share one block size, and so do
            // prefix-cacheable state groups: the first of each kind sets it.
            let kinds = [
                (group.kind == CacheGroupKind::FullAttention, &mut first_fa, true),
                (group.is_mamba_state(), &mut first_state, false),
            ];
            for (of_kind, first, full_attention) in kinds {
                if !of_kind {
                    continue;
                }
                match *first {
                    None => *first = Some((index, group.block_size)),
                    Some((first_index, b)) if b != group.block_size => {
                        let (this, first) = (group.block_size.get(), b.get());
                        let problem = if full_attention {
                            GateProblem::FullAttentionBlockSize { this, first, first_index }
                        } else {
                            GateProblem::StateBlockSize { this, first, first_index }
                        };
                        return Err(GateError::group(role, index, &spec.name, problem));
                    }
                    Some(_) => {}
                }
            }
            groups.push(group);
        }
        let mamba_type = groups.iter().any(CacheGroup::is_mamba_state);
        let page_bytes = groups[0].page_bytes;
        Ok(GroupedModel {
            name: self.name.clone(),
            groups,
            mamba_type,
            full_attention_block_size: first_fa.map(|(_, b)| b),
            page_bytes,
        })
    }
}

/// What a rank that passed [`check_rank`] runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankRules {
    /// The rank's role.
    pub role: Role,
    /// The vLLM version row, when the rank named a version pdsim knows.
    pub version: Option<&'static VllmVersion>,
}

impl RankRules {
    /// The lease a source is held under by default: the version's, or
    /// [`DEFAULT_SOURCE_LEASE`].
    pub fn source_lease(&self) -> SimDuration {
        self.version.map_or(DEFAULT_SOURCE_LEASE, |v| v.source_lease)
    }

    /// Whether the rank's engine runs the asynchronous scheduler by
    /// default: the version's, or, for a rank that names no version pdsim
    /// knows, vLLM 0.33's (yes).
    pub fn async_scheduling(&self) -> bool {
        self.version.is_none_or(|v| v.async_scheduling)
    }

    /// The API server's front end by default: the version's, or
    /// [`DEFAULT_FRONT_END`].
    pub fn front_end(&self) -> FrontEnd {
        self.version.map_or(DEFAULT_FRONT_END, |v| v.front_end)
    }
}

/// The gate of one rank: `role` running `model` on vLLM `version`.
///
/// - A grouped prefill or decode rank needs a version whose row has
///   `grouped_handoff` (0.31.0, 0.32.0, 0.33.0): a missing or other version is
///   refused, naming the role and `vllm_version`.
/// - A grouped aggregated rank moves nothing, so it may omit the version;
///   a version it names must be in [`VLLM_VERSIONS`] (the row decides the
///   lease it would hold sources under).
/// - A linear rank accepts any version or none: its handoff is priced in
///   tokens by no version-dependent rule. A known version still gives its
///   row (hold timeout); an unknown one is recorded as `None`.
///
/// ```
/// use actors::model::{check_rank, ModelSpec, Role};
/// use actors::units::Bytes;
/// let linear = ModelSpec { kv_bytes_per_token: Some(Bytes::new(32_768)), ..Default::default() }
///     .validate(Role::Prefill)
///     .unwrap();
/// assert!(check_rank(Role::Prefill, &linear, Some("0.20.2")).unwrap().version.is_none());
/// ```
pub fn check_rank(role: Role, model: &Model, version: Option<&str>) -> Result<RankRules, GateError> {
    let row = version.and_then(VllmVersion::find);
    if let Model::Grouped(_) = model {
        let handoff = role != Role::Aggregated;
        match (version, row) {
            (None, _) if handoff => {
                return Err(GateError::model(
                    role,
                    GateProblem::MissingVersion { role, supported: VllmVersion::supported_for_grouped(role) },
                ));
            }
            // A version pdsim does not know, or one without grouped handoff
            // on a rank that hands off.
            (Some(given), row) if row.is_none_or(|r| handoff && !r.grouped_handoff) => {
                return Err(GateError::model(
                    role,
                    GateProblem::UnsupportedVersion {
                        given: given.to_owned(),
                        role,
                        supported: VllmVersion::supported_for_grouped(role),
                    },
                ));
            }
            _ => {}
        }
    }
    Ok(RankRules { role, version: row })
}

fn shape(model: &Model) -> &'static str {
    match model {
        Model::Linear(_) => "linear",
        Model::Grouped(_) => "grouped",
    }
}

/// The gate of a disaggregated pairing: the decode rank must have the cache
/// layout of the prefill rank it reads from. Refuses a linear rank with a
/// grouped one, grouped ranks whose groups differ in any field (names
/// included), and linear ranks with different `kv_bytes_per_token`. Errors
/// name the decode role.
pub fn check_pairing(prefill: &Model, decode: &Model) -> Result<(), GateError> {
    let role = Role::Decode;
    match (prefill, decode) {
        (Model::Linear(p), Model::Linear(d)) => {
            if p.kv_bytes_per_token != d.kv_bytes_per_token {
                return Err(GateError::model(
                    role,
                    GateProblem::KvBytesDiffer {
                        this: d.kv_bytes_per_token.get(),
                        other_role: Role::Prefill,
                        other: p.kv_bytes_per_token.get(),
                    },
                ));
            }
            Ok(())
        }
        (Model::Grouped(p), Model::Grouped(d)) => match groups_difference(&p.groups, &d.groups) {
            None => Ok(()),
            Some(detail) => {
                Err(GateError::model(role, GateProblem::GroupsDiffer { other_role: Role::Prefill, detail }))
            }
        },
        _ => Err(GateError::model(
            role,
            GateProblem::LinearWithGrouped {
                role,
                this: shape(decode),
                other_role: Role::Prefill,
                other: shape(prefill),
            },
        )),
    }
}

/// The first difference between two group lists, worded from the decode side.
fn groups_difference(prefill: &[CacheGroup], decode: &[CacheGroup]) -> Option<String> {
    if prefill.len() != decode.len() {
        return Some(format!("{} groups here, {} on prefill", decode.len(), prefill.len()));
    }
    for (i, (p, d)) in prefill.iter().zip(decode).enumerate() {
        if p == d {
            continue;
        }
        let field_diff = |field: &str, here: String, there: String| {
            format!("cache_groups[{i}] {:?}: {field} {here} here, {there} on prefill", d.name)
        };
        let detail = if p.name != d.name {
            field_diff("name", format!("{:?}", d.name), format!("{:?}", p.name))
        } else if p.kind != d.kind {
            field_diff("kind", d.kind.to_string(), p.kind.to_string())
        } else if p.block_size != d.block_size {
            field_diff("block_size_tokens", d.block_size.get().to_string(), p.block_size.get().to_string())
        } else if p.page_bytes != d.page_bytes {
            field_diff("page_bytes", d.page_bytes.get().to_string(), p.page_bytes.get().to_string())
        } else if p.transfer_bytes_per_block != d.transfer_bytes_per_block {
            field_diff(
                "transfer_bytes_per_block",
                d.transfer_bytes_per_block.get().to_string(),
                p.transfer_bytes_per_block.get().to_string(),
            )
        } else if p.prefix_cacheable != d.prefix_cacheable {
            field_diff("prefix_cacheable", d.prefix_cacheable.to_string(), p.prefix_cacheable.to_string())
        } else if p.window != d.window {
            let w = |w: Option<Tokens>| w.map_or("none".to_owned(), |w| w.get().to_string());
            field_diff("window_tokens", w(d.window), w(p.window))
        } else {
            field_diff(
                "checkpoint_blocks",
                d.checkpoint_blocks.get().to_string(),
                p.checkpoint_blocks.get().to_string(),
            )
        };
        return Some(detail);
    }
    None
}
