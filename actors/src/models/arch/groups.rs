//! The cache layout vLLM 0.33 gives a [`ModelArch`]: [`ModelArch::model_spec`].
//!
//! A model whose every layer is full attention (GQA or MLA) is one cache
//! group of one spec (vLLM `_get_kv_cache_groups_uniform_spec` /
//! `_uniform_type`), which pdsim writes as a linear [`ModelSpec`]: KV bytes
//! a token on one rank, with `tp` and `kv_heads` so [`crate::models::tp`] can take
//! it to other TP sizes. A model with sliding-window or Mamba layers is
//! grouped the way `_get_kv_cache_groups_uniform_page_size`
//! (`v1/core/kv_cache_planning.py`) groups it:
//!
//! 1. Layers are bucketed by spec (full attention, each sliding window,
//!    Mamba), in the order of each spec's first layer.
//! 2. The group size is the smallest bucket's layer count, or the largest
//!    when that is under 1.5 times the smallest (gpt-oss-20b with an EAGLE
//!    layer: 12 sliding and 13 full make groups of 13); a bucket of L
//!    layers becomes `cdiv(L, size)` groups, layer j in group `j mod n`.
//! 3. Group k of every bucket shares the same `size` KV tensors, so one
//!    block id is one page in each: a pool block is `size` pages
//!    (`page_bytes`), and a group moves only its own layers' real bytes
//!    (`transfer_bytes_per_block`, padding excluded).
//!
//! Pages must be one size. Sliding and full attention with the same bytes
//! a token share the block size (16 tokens unless `block_size` says
//! otherwise; vLLM's sliding layers take the largest kernel block whose page
//! fits the primary one, which for FlashAttention's multiples of 16 is the
//! primary block size). In a Mamba hybrid the attention block size is
//! raised (`Platform._align_hybrid_block_size`, `platforms/interface.py`):
//!
//! ```text
//! B = A × cdiv(mamba_page, A × attention_bytes_per_token)
//! ```
//!
//! with `A = max(16, block_size)` (the kernel's block alignment; the Mamba2
//! mixer declares no checkpoint alignment, so prefix caching's "align" mode
//! adds nothing), and the Mamba page is padded up to `B ×
//! attention_bytes_per_token`. With prefix caching on (vLLM's default; the
//! mode the fragments describe) the Mamba block size is `B` too, the Mamba
//! groups are prefix cacheable, and each takes one prefill checkpoint
//! block (`mamba_mixer2.py` `get_kv_cache_spec`:
//! `num_prefill_checkpoint_blocks=1`).
//!
//! Bytes on one rank of TP `t` (vLLM `kv_cache_interface.py`,
//! `mamba_utils.py`):
//!
//! - attention, a token and a layer: `2 × max(1, H_kv / t) × head_dim ×
//!   kv_bytes` (K and V; KV heads split, replicated past `t = H_kv`);
//! - MLA, a token and a layer: `(kv_lora_rank + qk_rope_head_dim) ×
//!   kv_bytes`, one latent replicated on every rank, so it does not shrink
//!   with TP (`MLAAttentionSpec`, `num_kv_heads=1`, `max_tp_shards=1`);
//! - Mamba2, a layer: conv `(conv_kernel − 1) × (d_inner + 2 × G × state) /
//!   t` plus SSM `heads / t × head_dim × state`, times the state's bytes
//!   ([`MAMBA_STATE_BITS`]), where `G` is `n_groups`, raised to `t` when
//!   `t` does not divide it (`extra_groups_for_head_shards`).
//!
//! Worked numbers, from the fixtures in `presets/models/`:
//!
//! - Llama-3.1-8B at TP 4, bf16 KV: 32 layers × 2 × (8 / 4) × 128 × 2 =
//!   32,768 bytes a token (`scenarios/models/llama-3.1-8b-tp4.toml`).
//! - DeepSeek-V3 at any TP, bf16 KV: 61 × (512 + 64) × 2 = 70,272 bytes a
//!   token.
//! - gpt-oss-20b at TP 1, bf16: 12 sliding (128) and 12 full layers, 2 × 8
//!   × 64 × 2 = 2,048 bytes a token and layer, B = 16; group size 12, so
//!   `page_bytes` = 12 × 16 × 2,048 = 393,216 in both groups, all of it
//!   moved (`gpt-oss-like.toml`).
//! - Nemotron-H-8B at TP 1, bf16: 4 attention (8 KV heads of 128: 4,096
//!   bytes a token) and 24 Mamba2 layers (conv 3 × (8,192 + 2 × 8 × 128) ×
//!   2 = 61,440, SSM 128 × 64 × 128 × 2 = 2,097,152: 2,158,592 a layer). B
//!   = 16 × cdiv(2,158,592, 16 × 4,096) = 16 × 33 = 528; a layer's page is
//!   528 × 4,096 = 2,162,688; group size 4 gives one attention and 6 Mamba
//!   groups, `page_bytes` 4 × 2,162,688 = 8,650,752, Mamba transfer 4 ×
//!   2,158,592 = 8,634,368 (`mamba2-hybrid-like.toml`).
//!
//! Group order: vLLM numbers groups by the first layer of each spec.
//! [`ModelArch`] keeps attention groups in that order (gpt-oss-20b's layer
//! 0 slides, so its sliding group comes first) but does not record whether
//! a Mamba or an attention layer comes first, so Mamba groups are listed
//! after attention. vLLM's own order for Nemotron-H-8B (layer 0 is Mamba)
//! is Mamba 0–5, then attention. The order changes no byte count.
//!
//! Not derived (refused with an [`HfError`]): attention-free and
//! Mamba-only models, MLA next to other attention or Mamba layers,
//! attention groups with different bytes a token in a grouped model
//! (vLLM would scale or pad their pages).

use super::ModelArch;
use super::hf::HfError;
use crate::base::units::{Blocks, Bytes, Tokens};
use crate::models::model::{CacheGroupKind, CacheGroupSpec, ModelSpec};

/// vLLM's block size when nothing sets one (`CacheConfig.DEFAULT_BLOCK_SIZE`),
/// which is also FlashAttention's kernel block alignment (`MultipleOf(16)`).
pub const DEFAULT_BLOCK_SIZE: u64 = 16;

/// Bits of a Mamba state element: vLLM's `mamba_cache_dtype` and
/// `mamba_ssm_cache_dtype` default to `auto`, the model's dtype, which is
/// 16-bit for every family [`super::hf`] reads (the KV cache dtype does
/// not apply to Mamba state).
pub const MAMBA_STATE_BITS: u32 = 16;

/// One spec's layers (vLLM's `same_type_layers` bucket), on one rank.
struct Bucket {
    kind: CacheGroupKind,
    layers: u64,
    window: Option<u64>,
    /// Heads over the whole model (KV heads; Mamba heads; 1 for MLA).
    heads: u32,
    /// Bytes of a token in one layer (attention and MLA; 0 for Mamba).
    token_bytes: u64,
    /// Bytes of one layer's state (Mamba; 0 for attention).
    state_bytes: u64,
}

fn err(field: impl Into<String>, problem: impl Into<String>) -> HfError {
    HfError::new(field, problem)
}

/// `a × b`, or an error naming `field` on overflow.
fn mul(a: u64, b: u64, field: &str) -> Result<u64, HfError> {
    a.checked_mul(b).ok_or_else(|| err(field, "bytes overflow 64 bits"))
}

/// KV heads on one rank of TP `tp`: split, or replicated once there are
/// more ranks than heads; vLLM asserts one divides the other.
fn kv_heads_per_rank(kv: u32, tp: u32, field: &str) -> Result<u64, HfError> {
    if kv == 0 {
        return Err(err(field, "must be greater than 0"));
    }
    if kv.is_multiple_of(tp) {
        Ok(u64::from(kv / tp))
    } else if tp.is_multiple_of(kv) {
        Ok(1)
    } else {
        Err(err(field, format!("{kv} KV heads and tp {tp}: one must divide the other")))
    }
}

/// vLLM splits query heads across ranks and asserts they divide.
fn check_query_heads(heads: u32, tp: u32, field: &str) -> Result<(), HfError> {
    if heads == 0 || !heads.is_multiple_of(tp) {
        return Err(err(field, format!("{heads} query heads cannot be split across tp {tp}")));
    }
    Ok(())
}

impl ModelArch {
    /// The [`ModelSpec`] vLLM 0.33 would run this model with on one rank of
    /// TP `tp`, with a KV cache of `kv_bits` a value (16 for bf16/fp16, 8
    /// for fp8, 32 for fp32) and a requested block size of `block_size`
    /// tokens (`--block-size`; [`DEFAULT_BLOCK_SIZE`] when `None`; a
    /// multiple of 16). See the module docs for every rule.
    ///
    /// A model whose layers are all full attention (GQA or MLA) gives a
    /// linear spec (`kv_bytes_per_token`, `tp`, `kv_heads`; its block size
    /// is the rank's `block_size_tokens`, so `block_size` plays no part);
    /// a sliding-window or Mamba hybrid gives `cache_groups`, with `heads`
    /// on each group and `tp`. The spec carries this arch (`arch`).
    ///
    /// Refused, naming the argument (`tp`, `kv_bits`, `block_size`) or the
    /// arch's field (`attention[0].kv_heads`, `mamba.groups`, …): a zero
    /// `tp`; `kv_bits` other than 8, 16, 32; a block size that is not a
    /// positive multiple of 16; heads that `tp` does not divide as vLLM
    /// requires; the layouts the module docs list as not derived.
    ///
    /// ```
    /// use actors::arch::hf::from_config_json;
    /// use actors::units::Bytes;
    ///
    /// let arch = from_config_json(
    ///     r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
    ///         "num_attention_heads": 32, "num_key_value_heads": 8,
    ///         "intermediate_size": 14336, "vocab_size": 128256}"#,
    /// )
    /// .unwrap();
    /// // 32 layers × 2 × (8 / 4) × 128 × 2 bytes.
    /// let spec = arch.model_spec("llama", 4, 16, None).unwrap();
    /// assert_eq!(spec.kv_bytes_per_token, Some(Bytes::new(32_768)));
    /// assert_eq!((spec.tp, spec.kv_heads), (Some(4), Some(8)));
    /// assert_eq!(arch.model_spec("llama", 3, 16, None).unwrap_err().field, "attention[0].heads");
    /// ```
    pub fn model_spec(&self, name: &str, tp: u32, kv_bits: u32, block_size: Option<u64>) -> Result<ModelSpec, HfError> {
        if tp == 0 {
            return Err(err("tp", "must be greater than 0"));
        }
        let kv_bytes = match kv_bits {
            8 | 16 | 32 => u64::from(kv_bits / 8),
            _ => return Err(err("kv_bits", format!("{kv_bits}: pdsim derives 8-, 16- and 32-bit KV caches"))),
        };
        let base = block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
        if base == 0 || !base.is_multiple_of(DEFAULT_BLOCK_SIZE) {
            return Err(err("block_size", format!("{base}: must be a positive multiple of 16 (the kernel block)")));
        }
        let mut buckets = self.attention_buckets(tp, kv_bytes)?;
        let mamba = match &self.mamba {
            Some(m) if m.count > 0 => Some(self.mamba_bucket(tp)?),
            _ => None,
        };
        let mla = self.mla.as_ref().filter(|m| m.count > 0);
        if let Some(m) = mla {
            if !buckets.is_empty() || mamba.is_some() {
                return Err(err("mla", "MLA next to other attention or Mamba layers is not derived"));
            }
            check_query_heads(m.heads, tp, "mla.heads")?;
            let token = u64::from(m.kv_lora_rank) + u64::from(m.qk_rope_head_dim);
            buckets.push(Bucket {
                kind: CacheGroupKind::FullAttention,
                layers: u64::from(m.count),
                window: None,
                heads: 1,
                token_bytes: mul(token, kv_bytes, "mla.kv_lora_rank")?,
                state_bytes: 0,
            });
        }
        if buckets.is_empty() {
            let what = if mamba.is_some() { "a Mamba model without attention" } else { "a model without attention" };
            return Err(err("attention", format!("{what} is not derived")));
        }
        let windows = buckets.iter().any(|b| b.kind == CacheGroupKind::SlidingWindow);
        if !windows && mamba.is_none() {
            return self.linear_spec(name, tp, &buckets, mla.is_some());
        }
        self.grouped_spec(name, tp, base, buckets, mamba)
    }

    /// One bucket per attention spec (window, bytes a token, heads), in
    /// the order of the arch's groups; groups alike merge.
    fn attention_buckets(&self, tp: u32, kv_bytes: u64) -> Result<Vec<Bucket>, HfError> {
        let mut buckets: Vec<Bucket> = Vec::new();
        for (i, a) in self.attention.iter().enumerate().filter(|(_, a)| a.count > 0) {
            let field = |k: &str| format!("attention[{i}].{k}");
            check_query_heads(a.heads, tp, &field("heads"))?;
            let per_rank = kv_heads_per_rank(a.kv_heads, tp, &field("kv_heads"))?;
            // K and V: 2 × heads on the rank × head_dim × bytes.
            let token =
                mul(mul(2 * per_rank, u64::from(a.head_dim), &field("head_dim"))?, kv_bytes, &field("head_dim"))?;
            let kind = if a.window.is_some() { CacheGroupKind::SlidingWindow } else { CacheGroupKind::FullAttention };
            if a.window == Some(0) {
                return Err(err(field("window"), "must be greater than 0"));
            }
            match buckets.iter_mut().find(|b| b.window == a.window && b.token_bytes == token && b.heads == a.kv_heads) {
                Some(b) => b.layers += u64::from(a.count),
                None => buckets.push(Bucket {
                    kind,
                    layers: u64::from(a.count),
                    window: a.window,
                    heads: a.kv_heads,
                    token_bytes: token,
                    state_bytes: 0,
                }),
            }
        }
        Ok(buckets)
    }

    /// The Mamba2 layers' bucket: one layer's conv and SSM state on a rank.
    fn mamba_bucket(&self, tp: u32) -> Result<Bucket, HfError> {
        let Some(m) = &self.mamba else { return Err(err("mamba", "missing")) };
        let t = u64::from(tp);
        if m.heads == 0 || !m.heads.is_multiple_of(tp) {
            return Err(err("mamba.heads", format!("{} heads cannot be split across tp {tp}", m.heads)));
        }
        // n_groups is split with the heads; when tp does not divide it,
        // vLLM replicates groups up to tp (extra_groups_for_head_shards).
        let groups = if m.groups > 0 && m.groups.is_multiple_of(tp) {
            u64::from(m.groups)
        } else if m.groups > 0 && tp.is_multiple_of(m.groups) {
            t
        } else {
            return Err(err("mamba.groups", format!("{} groups and tp {tp}: one must divide the other", m.groups)));
        };
        let f = "mamba.state_size";
        let conv_dim = mul(2 * groups, u64::from(m.state_size), f)?
            .checked_add(m.d_inner())
            .ok_or_else(|| err(f, "bytes overflow 64 bits"))?;
        if !conv_dim.is_multiple_of(t) {
            return Err(err("mamba.head_dim", format!("conv width {conv_dim} cannot be split across tp {tp}")));
        }
        let bytes = u64::from(MAMBA_STATE_BITS / 8);
        let conv = mul(mul(u64::from(m.conv_kernel.saturating_sub(1)), conv_dim / t, f)?, bytes, f)?;
        let ssm =
            mul(mul(mul(u64::from(m.heads) / t, u64::from(m.head_dim), f)?, u64::from(m.state_size), f)?, bytes, f)?;
        Ok(Bucket {
            kind: CacheGroupKind::State,
            layers: u64::from(m.count),
            window: None,
            heads: m.heads,
            token_bytes: 0,
            state_bytes: conv.checked_add(ssm).ok_or_else(|| err(f, "bytes overflow 64 bits"))?,
        })
    }

    /// Every layer full attention: one rate of bytes a token, the sum over
    /// layers.
    fn linear_spec(&self, name: &str, tp: u32, buckets: &[Bucket], mla: bool) -> Result<ModelSpec, HfError> {
        let mut total = 0u64;
        for b in buckets {
            total = mul(b.layers, b.token_bytes, "attention")?
                .checked_add(total)
                .ok_or_else(|| err("attention", "bytes overflow 64 bits"))?;
        }
        // tp.rs scales a linear model by its one KV-head count: MLA's one
        // replicated latent, or the attention groups' common count.
        let kv_heads = if mla {
            Some(1)
        } else {
            let first = self.attention.iter().find(|a| a.count > 0).map(|a| a.kv_heads);
            first.filter(|&kv| self.attention.iter().filter(|a| a.count > 0).all(|a| a.kv_heads == kv))
        };
        Ok(ModelSpec {
            name: Some(name.to_owned()),
            kv_bytes_per_token: Some(Bytes::new(total)),
            cache_groups: Vec::new(),
            tp: Some(tp),
            kv_heads,
            arch: Some(self.clone()),
        })
    }

    /// A sliding-window or Mamba hybrid: vLLM's uniform-page grouping.
    fn grouped_spec(
        &self,
        name: &str,
        tp: u32,
        base: u64,
        mut buckets: Vec<Bucket>,
        mamba: Option<Bucket>,
    ) -> Result<ModelSpec, HfError> {
        // One page size: every attention bucket must have the same bytes a
        // token (vLLM would otherwise scale block sizes or pad pages).
        let token = buckets[0].token_bytes;
        if buckets.iter().any(|b| b.token_bytes != token) {
            return Err(err("attention", "attention groups with different bytes a token are not derived"));
        }
        if token == 0 {
            return Err(err("attention", "zero bytes a token"));
        }
        let block = match &mamba {
            // B = A × cdiv(mamba_page, A × token), A = max(16, base) = base.
            Some(m) => {
                let step = mul(base, token, "block_size")?;
                mul(base, m.state_bytes.div_ceil(step).max(1), "block_size")?
            }
            None => base,
        };
        let page = mul(block, token, "block_size")?;
        if let Some(m) = mamba {
            buckets.push(m);
        }
        let min = buckets.iter().map(|b| b.layers).min().unwrap_or(1).max(1);
        let max = buckets.iter().map(|b| b.layers).max().unwrap_or(1);
        // max < 1.5 × min: pad the smaller buckets up to the largest.
        let size = if 2 * u128::from(max) < 3 * u128::from(min) { max } else { min };
        let page_bytes = Bytes::new(mul(size, page, "block_size")?);
        let has_window = buckets.iter().any(|b| b.kind == CacheGroupKind::SlidingWindow);
        let base_name = |b: &Bucket| match b.kind {
            CacheGroupKind::FullAttention if has_window => "full attention".to_owned(),
            CacheGroupKind::FullAttention => "attention".to_owned(),
            CacheGroupKind::SlidingWindow => "sliding window".to_owned(),
            CacheGroupKind::State => "mamba".to_owned(),
            CacheGroupKind::Convolution => "convolution".to_owned(),
        };
        // Two windows of different sizes: tell their groups apart.
        let windows = buckets.iter().filter(|b| b.kind == CacheGroupKind::SlidingWindow).count();
        let mut groups = Vec::new();
        for b in &buckets {
            let n = b.layers.div_ceil(size);
            let mut label = base_name(b);
            if b.kind == CacheGroupKind::SlidingWindow && windows > 1 {
                label = format!("{label} {}", b.window.unwrap_or(0));
            }
            let real = if b.kind == CacheGroupKind::State { b.state_bytes } else { page };
            for i in 0..n {
                // Layer j goes to group j mod n: group i holds cdiv(L − i, n).
                let layers = (b.layers - i).div_ceil(n);
                groups.push(CacheGroupSpec {
                    name: if n > 1 { format!("{label} {i}") } else { label.clone() },
                    kind: b.kind,
                    block_size_tokens: Tokens::new(block),
                    page_bytes,
                    transfer_bytes_per_block: Some(Bytes::new(mul(layers, real, "block_size")?)),
                    prefix_cacheable: Some(true),
                    window_tokens: b.window.map(Tokens::new),
                    checkpoint_blocks: (b.kind == CacheGroupKind::State).then_some(Blocks::new(1)),
                    heads: Some(b.heads),
                });
            }
        }
        Ok(ModelSpec {
            name: Some(name.to_owned()),
            kv_bytes_per_token: None,
            cache_groups: groups,
            tp: Some(tp),
            kv_heads: None,
            arch: Some(self.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{AttentionLayers, MambaLayers, MlaLayers, llama_3_1_8b};
    use super::*;
    use crate::models::model::Role;

    fn nemotron_like() -> ModelArch {
        ModelArch {
            attention: vec![AttentionLayers { count: 4, heads: 32, kv_heads: 8, head_dim: 128, window: None }],
            mamba: Some(MambaLayers {
                count: 24,
                heads: 128,
                head_dim: 64,
                state_size: 128,
                groups: 8,
                conv_kernel: 4,
            }),
            ..llama_3_1_8b()
        }
    }

    #[test]
    fn a_full_attention_model_is_linear_at_every_tp() {
        let arch = llama_3_1_8b();
        let at = |t| arch.model_spec("l", t, 16, None).unwrap().kv_bytes_per_token.unwrap().get();
        // 32 × 2 × max(1, 8 / t) × 128 × 2.
        assert_eq!((at(1), at(4), at(8), at(16)), (131_072, 32_768, 16_384, 16_384));
        // fp8: one byte a value.
        assert_eq!(arch.model_spec("l", 4, 8, None).unwrap().kv_bytes_per_token, Some(Bytes::new(16_384)));
        // The derived spec at TP 4 and tp.rs's scaling of it agree at TP 2.
        let at_2 = arch.model_spec("l", 4, 16, None).unwrap().at_tp(2).unwrap();
        assert_eq!(at_2.kv_bytes_per_token, Some(Bytes::new(at(2))));
    }

    #[test]
    fn mla_replicates_its_latent_on_every_rank() {
        let arch = ModelArch {
            attention: vec![],
            mla: Some(MlaLayers {
                count: 61,
                heads: 128,
                q_lora_rank: Some(1_536),
                kv_lora_rank: 512,
                qk_nope_head_dim: 128,
                qk_rope_head_dim: 64,
                v_head_dim: 128,
            }),
            ..llama_3_1_8b()
        };
        for t in [1, 8, 16] {
            let spec = arch.model_spec("ds", t, 16, None).unwrap();
            // 61 × (512 + 64) × 2, at any TP.
            assert_eq!(spec.kv_bytes_per_token, Some(Bytes::new(70_272)));
            assert_eq!(spec.kv_heads, Some(1));
        }
        assert_eq!(arch.model_spec("ds", 3, 16, None).unwrap_err().field, "mla.heads");
    }

    #[test]
    fn a_mamba_hybrid_raises_its_block_size_at_each_tp() {
        let arch = nemotron_like();
        let spec = |t| arch.model_spec("n", t, 16, None).unwrap();
        // TP 2: 4 KV heads (2,048 bytes a token), state 2,158,592 / 2 =
        // 1,079,296; B = 16 × cdiv(1,079,296, 32,768) = 16 × 33 = 528.
        let s2 = spec(2);
        assert_eq!(s2.cache_groups[0].block_size_tokens, Tokens::new(528));
        assert_eq!(s2.cache_groups[0].page_bytes, Bytes::new(4 * 528 * 2_048));
        assert_eq!(s2.cache_groups[1].transfer_bytes_per_block, Some(Bytes::new(4 * 1_079_296)));
        // TP 16: KV heads replicate (1 a rank, 512 bytes a token); 8 groups
        // do not split 16 ways, so vLLM replicates them to 16: conv 3 ×
        // (8,192 + 2 × 16 × 128) / 16 × 2 = 4,608, SSM 8 × 64 × 128 × 2 =
        // 131,072: 135,680; B = 16 × cdiv(135,680, 8,192) = 16 × 17 = 272.
        let s16 = spec(16);
        assert_eq!(s16.cache_groups[0].block_size_tokens, Tokens::new(272));
        assert_eq!(s16.cache_groups[1].transfer_bytes_per_block, Some(Bytes::new(4 * 135_680)));
        // A larger requested block size is the alignment step: 32 × cdiv(2,158,592, 32 × 4,096) = 544.
        let s = arch.model_spec("n", 1, 16, Some(32)).unwrap();
        assert_eq!(s.cache_groups[0].block_size_tokens, Tokens::new(544));
        for s in [s2, s16, s] {
            s.validate(Role::Prefill).unwrap();
        }
        assert_eq!(arch.model_spec("n", 3, 16, None).unwrap_err().field, "attention[0].heads");
    }

    #[test]
    fn group_size_pads_a_near_equal_bucket() {
        // 12 sliding + 13 full (gpt-oss-20b with an EAGLE layer): 13 < 1.5 × 12,
        // so groups of 13; the sliding group has 12 layers in 13 tensors.
        let arch = ModelArch {
            attention: vec![
                AttentionLayers { count: 12, heads: 64, kv_heads: 8, head_dim: 64, window: Some(128) },
                AttentionLayers { count: 13, heads: 64, kv_heads: 8, head_dim: 64, window: None },
            ],
            ..llama_3_1_8b()
        };
        let s = arch.model_spec("g", 1, 16, None).unwrap();
        assert_eq!(s.cache_groups.len(), 2);
        assert_eq!(s.cache_groups[0].page_bytes, Bytes::new(13 * 16 * 2_048));
        assert_eq!(s.cache_groups[0].transfer_bytes_per_block, Some(Bytes::new(12 * 16 * 2_048)));
        assert_eq!(s.cache_groups[1].transfer_bytes_per_block, Some(Bytes::new(13 * 16 * 2_048)));
        // 5 sliding + 2 full (5 ≥ 1.5 × 2): groups of 2; the sliding bucket
        // makes cdiv(5, 2) = 3 groups, of 2, 2 and 1 layers (2 tensors each).
        let arch = ModelArch {
            attention: vec![
                AttentionLayers { count: 5, heads: 64, kv_heads: 8, head_dim: 64, window: Some(128) },
                AttentionLayers { count: 2, heads: 64, kv_heads: 8, head_dim: 64, window: None },
            ],
            ..llama_3_1_8b()
        };
        let s = arch.model_spec("g", 1, 16, None).unwrap();
        let names: Vec<_> = s.cache_groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["sliding window 0", "sliding window 1", "sliding window 2", "full attention"]);
        let moved: Vec<_> = s.cache_groups.iter().map(|g| g.transfer_bytes_per_block.unwrap().get() / 32_768).collect();
        assert_eq!(moved, [2, 2, 1, 2]);
    }

    #[test]
    fn bad_arguments_name_themselves() {
        let arch = llama_3_1_8b();
        assert_eq!(arch.model_spec("l", 0, 16, None).unwrap_err().field, "tp");
        assert_eq!(arch.model_spec("l", 1, 4, None).unwrap_err().field, "kv_bits");
        assert_eq!(nemotron_like().model_spec("n", 1, 16, Some(24)).unwrap_err().field, "block_size");
        assert_eq!(arch.model_spec("l", 3, 16, None).unwrap_err().field, "attention[0].heads");
        let no_attention = ModelArch { attention: vec![], ..nemotron_like() };
        assert_eq!(no_attention.model_spec("m", 1, 16, None).unwrap_err().field, "attention");
        let huge = ModelArch {
            attention: vec![AttentionLayers {
                count: u32::MAX,
                heads: 1,
                kv_heads: 1,
                head_dim: u32::MAX,
                window: None,
            }],
            ..llama_3_1_8b()
        };
        // 4,294,967,295 layers × 2 × 4,294,967,295 × 4 bytes overflows: an error, not a panic.
        assert_eq!(huge.model_spec("h", 1, 32, None).unwrap_err().field, "attention");
    }
}
