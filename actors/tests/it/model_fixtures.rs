//! Model specs shared by the rule and gate tests.

use actors::model::{CacheGroupKind, CacheGroupSpec, Model, ModelSpec, Role};
use actors::units::{Blocks, Bytes, Tokens};

/// The page of every GLM-5.3-Flash-like group at TP 4, fp8.
pub const GLM_PAGE: u64 = 13_045_120;
/// GLM full attention: 11 × 1,114,112 + 11 × 71,808.
pub const GLM_FA: u64 = 11 * 1_114_112 + 11 * 71_808;
/// GLM tail ring: 11 × 2,048.
pub const GLM_RING: u64 = 11 * 2_048;
/// GLM kda 0 and kda 1: 9 × 1,085,440.
pub const GLM_KDA9: u64 = 9 * 1_085_440;
/// GLM kda 2 and kda 3: 8 × 1,085,440.
pub const GLM_KDA8: u64 = 8 * 1_085_440;
/// GLM block size.
pub const GLM_B: u64 = 2_176;

/// A group spec with every field present.
pub fn group(name: &str, kind: CacheGroupKind, b: u64, page: u64, transfer: u64) -> CacheGroupSpec {
    CacheGroupSpec {
        name: name.to_owned(),
        kind,
        block_size_tokens: Tokens::new(b),
        page_bytes: Bytes::new(page),
        transfer_bytes_per_block: Some(Bytes::new(transfer)),
        prefix_cacheable: Some(true),
        window_tokens: None,
        checkpoint_blocks: None,
        heads: None,
    }
}

/// A full-attention group whose transfer equals its page.
pub fn fa(name: &str, b: u64, bytes: u64) -> CacheGroupSpec {
    group(name, CacheGroupKind::FullAttention, b, bytes, bytes)
}

/// A sliding-window group whose transfer equals its page.
pub fn window(name: &str, w: u64, b: u64, bytes: u64) -> CacheGroupSpec {
    CacheGroupSpec {
        window_tokens: Some(Tokens::new(w)),
        ..group(name, CacheGroupKind::SlidingWindow, b, bytes, bytes)
    }
}

/// A state group; `mamba` makes it prefix cacheable (Mamba-type).
pub fn state(name: &str, b: u64, page: u64, transfer: u64, mamba: bool) -> CacheGroupSpec {
    CacheGroupSpec { prefix_cacheable: Some(mamba), ..group(name, CacheGroupKind::State, b, page, transfer) }
}

/// A grouped model spec from groups.
pub fn spec(groups: Vec<CacheGroupSpec>) -> ModelSpec {
    ModelSpec { cache_groups: groups, ..Default::default() }
}

/// Validates `spec` as a prefill model, panicking on a gate error.
pub fn model(spec: &ModelSpec) -> Model {
    spec.validate(Role::Prefill).expect("fixture model is valid")
}

/// The GLM-5.3-Flash-like model at TP 4 with an fp8 cache (six groups),
/// with one prefill checkpoint block per KDA group (GLM5Next KDA).
pub fn glm_spec() -> ModelSpec {
    let kda = |name: &str, bytes: u64| CacheGroupSpec {
        checkpoint_blocks: Some(Blocks::new(1)),
        heads: None,
        ..state(name, GLM_B, GLM_PAGE, bytes, true)
    };
    spec(vec![
        group("full attention", CacheGroupKind::FullAttention, GLM_B, GLM_PAGE, GLM_FA),
        state("tail ring", GLM_B, GLM_PAGE, GLM_RING, false),
        kda("kda 0", GLM_KDA9),
        kda("kda 1", GLM_KDA9),
        kda("kda 2", GLM_KDA8),
        kda("kda 3", GLM_KDA8),
    ])
}

/// The validated GLM-like model.
pub fn glm() -> Model {
    model(&glm_spec())
}

/// A linear model of `kv` bytes per token.
pub fn linear_spec(kv: u64) -> ModelSpec {
    ModelSpec { kv_bytes_per_token: Some(Bytes::new(kv)), ..Default::default() }
}
