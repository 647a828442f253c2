//! A model's architecture: the shape of its layers, from which pdsim
//! derives its cache groups (the bytes a handoff moves) and the work of a
//! forward pass (the parameters a step reads, the FLOPs it computes).
//!
//! A [`ModelArch`] is layer groups, not a layer list: a run of identical
//! mixers ([`AttentionLayers`], [`MlaLayers`], [`MambaLayers`]) and a run of
//! identical feed-forward blocks ([`MlpLayers`]), each with its count. A
//! Llama-3.1-8B is one attention group of 32 layers and one dense MLP group
//! of 32; a gpt-oss-20b is 12 sliding-window and 12 full-attention layers
//! over 24 MoE blocks; a Nemotron-H-8B is 4 attention and 24 Mamba2 mixers
//! over 24 MLPs.
//!
//! Parameter counts ([`ModelArch::params`]) are what the step-time model
//! reads; they leave out biases and norms (well under 0.1 % of a model).
//! Llama-3.1-8B (hidden 4,096, 32 layers, 32 heads, 8 KV heads of 128,
//! intermediate 14,336, vocabulary 128,256, embeddings not tied):
//!
//! - attention per layer: q 4,096 × 4,096 + k, v 2 × 4,096 × 1,024 + o
//!   4,096 × 4,096 = 41,943,040;
//! - MLP per layer (gated): 3 × 4,096 × 14,336 = 176,160,768;
//! - 32 layers: 32 × 218,103,808 = 6,979,321,856;
//! - embedding and LM head: 2 × 128,256 × 4,096 = 1,050,673,152;
//! - total 8,029,995,008 (the published 8.03 B).

pub mod groups;
pub mod hf;
pub mod memory;

use serde::{Deserialize, Serialize};

/// A model's layers, as groups of identical layers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelArch {
    /// Width of the residual stream (`hidden_size`).
    pub hidden_size: u64,
    /// Vocabulary (`vocab_size`).
    pub vocab_size: u64,
    /// Whether the LM head shares the embedding's weights.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Bits of one weight as served (16 for bf16, 8 for fp8).
    #[serde(default = "sixteen")]
    pub weight_bits: u32,
    /// Bits of one MoE expert weight when they differ from `weight_bits`
    /// (gpt-oss ships its experts in MXFP4: 4, plus scales).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_weight_bits: Option<u32>,
    /// The model's context limit (`max_position_embeddings`), vLLM's
    /// default `max_model_len`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<u64>,
    /// Attention mixers with separate K and V (GQA, MQA, MHA).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attention: Vec<AttentionLayers>,
    /// Multi-head latent attention mixers (DeepSeek V2/V3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaLayers>,
    /// Mamba2 mixers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mamba: Option<MambaLayers>,
    /// Feed-forward blocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mlp: Vec<MlpLayers>,
}

fn sixteen() -> u32 {
    16
}

/// `count` attention layers alike.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionLayers {
    /// How many layers.
    pub count: u32,
    /// Query heads.
    pub heads: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Dimension of one head.
    pub head_dim: u32,
    /// A sliding window of this many tokens; absent for full attention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
}

/// `count` multi-head latent attention layers alike (DeepSeek V3: a
/// compressed KV latent of `kv_lora_rank` plus a shared RoPE key of
/// `qk_rope_head_dim` per token and layer, one "head" replicated on every
/// TP rank).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlaLayers {
    /// How many layers.
    pub count: u32,
    /// Query heads.
    pub heads: u32,
    /// Rank of the query compression (absent: queries projected directly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q_lora_rank: Option<u32>,
    /// Rank of the KV latent.
    pub kv_lora_rank: u32,
    /// Per-head query/key dimension without RoPE.
    pub qk_nope_head_dim: u32,
    /// Per-head query/key RoPE dimension (the key's is shared by all heads).
    pub qk_rope_head_dim: u32,
    /// Per-head value dimension.
    pub v_head_dim: u32,
}

/// `count` Mamba2 mixers alike.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MambaLayers {
    /// How many layers.
    pub count: u32,
    /// SSM heads (`mamba_num_heads`).
    pub heads: u32,
    /// Dimension of one SSM head (`mamba_head_dim`).
    pub head_dim: u32,
    /// SSM state size (`ssm_state_size`).
    pub state_size: u32,
    /// B/C groups (`n_groups`).
    pub groups: u32,
    /// Convolution kernel (`conv_kernel`).
    pub conv_kernel: u32,
}

impl MambaLayers {
    /// The inner width, heads × head dimension.
    pub fn d_inner(&self) -> u64 {
        u64::from(self.heads) * u64::from(self.head_dim)
    }
}

/// `count` feed-forward blocks alike: a gated MLP (`experts = 0`) or a
/// mixture of experts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlpLayers {
    /// How many blocks.
    pub count: u32,
    /// Intermediate width of the dense MLP, or of one expert.
    pub intermediate: u64,
    /// Routed experts (0: a dense MLP).
    #[serde(default)]
    pub experts: u32,
    /// Experts each token is routed to.
    #[serde(default)]
    pub active_experts: u32,
    /// Intermediate width of the shared experts taken together (0: none).
    #[serde(default)]
    pub shared_intermediate: u64,
    /// Whether the MLP is gated (three matrices; two otherwise).
    #[serde(default = "yes")]
    pub gated: bool,
}

fn yes() -> bool {
    true
}

/// Parameters of a model by where they sit, over the whole model (not per
/// TP rank).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParamCounts {
    /// The input embedding.
    pub embedding: u64,
    /// The LM head (0 when tied to the embedding).
    pub lm_head: u64,
    /// Attention, MLA and Mamba mixers.
    pub mixers: u64,
    /// Dense MLPs, shared experts and routers: read by every token.
    pub dense_ffn: u64,
    /// Routed experts, all of them.
    pub experts: u64,
    /// Routed experts one token computes with (`active_experts` of each block).
    pub experts_active: u64,
}

impl ParamCounts {
    /// Every parameter.
    pub fn total(&self) -> u64 {
        self.embedding + self.lm_head + self.mixers + self.dense_ffn + self.experts
    }
    /// Parameters one token's forward pass multiplies by, the LM head
    /// aside (it runs once per sampled token, not per token computed).
    pub fn active_per_token(&self) -> u64 {
        self.mixers + self.dense_ffn + self.experts_active
    }
}

impl AttentionLayers {
    /// Parameters of one layer: q, k, v and o projections.
    pub fn params(&self, hidden: u64) -> u64 {
        let (h, kv, d) = (u64::from(self.heads), u64::from(self.kv_heads), u64::from(self.head_dim));
        hidden * h * d * 2 + hidden * kv * d * 2
    }
}

impl MlaLayers {
    /// Parameters of one layer: the query path (compressed or direct), the
    /// KV down-projection with the shared RoPE key, the up-projection to
    /// per-head keys and values, and o.
    pub fn params(&self, hidden: u64) -> u64 {
        let h = u64::from(self.heads);
        let qk = u64::from(self.qk_nope_head_dim) + u64::from(self.qk_rope_head_dim);
        let q = match self.q_lora_rank {
            Some(r) => hidden * u64::from(r) + u64::from(r) * h * qk,
            None => hidden * h * qk,
        };
        let lora = u64::from(self.kv_lora_rank);
        let kv_down = hidden * (lora + u64::from(self.qk_rope_head_dim));
        let kv_up = lora * h * (u64::from(self.qk_nope_head_dim) + u64::from(self.v_head_dim));
        let o = h * u64::from(self.v_head_dim) * hidden;
        q + kv_down + kv_up + o
    }
}

impl MambaLayers {
    /// Parameters of one layer: the input projection (z, x, B, C, dt), the
    /// convolution over x, B and C, and the output projection.
    pub fn params(&self, hidden: u64) -> u64 {
        let inner = self.d_inner();
        let bc = 2 * u64::from(self.groups) * u64::from(self.state_size);
        let in_proj = hidden * (2 * inner + bc + u64::from(self.heads));
        let conv = (inner + bc) * u64::from(self.conv_kernel);
        in_proj + conv + inner * hidden
    }
}

impl MlpLayers {
    fn matrices(&self) -> u64 {
        if self.gated { 3 } else { 2 }
    }
    /// Parameters of one block read by every token: a dense MLP, or the
    /// shared experts and the router.
    pub fn dense_params(&self, hidden: u64) -> u64 {
        if self.experts == 0 {
            return self.matrices() * hidden * self.intermediate;
        }
        self.matrices() * hidden * self.shared_intermediate + hidden * u64::from(self.experts)
    }
    /// Parameters of one routed expert.
    pub fn expert_params(&self, hidden: u64) -> u64 {
        if self.experts == 0 { 0 } else { self.matrices() * hidden * self.intermediate }
    }
}

impl ModelArch {
    /// Checks what a file may get wrong when it gives `[model.arch]`
    /// itself (a config.json's keys are checked as they are read): every
    /// size at least 1, weight bits of 4, 8, 16 or 32, no more active
    /// experts than experts, and a parameter count (× 32 bits) that fits
    /// in 64 bits. The error's field is relative to `arch`.
    pub fn check(&self) -> Result<(), hf::HfError> {
        let err = |f: String, p: &str| Err(hf::HfError::new(f, p));
        let one = |f: String, v: u64| if v == 0 { err(f, "must be at least 1") } else { Ok(()) };
        one("hidden_size".into(), self.hidden_size)?;
        one("vocab_size".into(), self.vocab_size)?;
        for (f, b) in [("weight_bits", Some(self.weight_bits)), ("expert_weight_bits", self.expert_weight_bits)] {
            if let Some(b) = b
                && ![4, 8, 16, 32].contains(&b)
            {
                return err(f.into(), "must be 4, 8, 16 or 32");
            }
        }
        if let Some(m) = self.max_position_embeddings {
            one("max_position_embeddings".into(), m)?;
        }
        for (i, a) in self.attention.iter().enumerate() {
            let at = |k: &str| format!("attention[{i}].{k}");
            for (k, v) in [("count", a.count), ("heads", a.heads), ("kv_heads", a.kv_heads), ("head_dim", a.head_dim)] {
                one(at(k), v.into())?;
            }
            if let Some(w) = a.window {
                one(at("window"), w)?;
            }
        }
        if let Some(m) = &self.mla {
            for (k, v) in [
                ("count", m.count),
                ("heads", m.heads),
                ("kv_lora_rank", m.kv_lora_rank),
                ("qk_rope_head_dim", m.qk_rope_head_dim),
                ("v_head_dim", m.v_head_dim),
            ] {
                one(format!("mla.{k}"), v.into())?;
            }
            if let Some(r) = m.q_lora_rank {
                one("mla.q_lora_rank".into(), r.into())?;
            }
        }
        if let Some(m) = &self.mamba {
            for (k, v) in [
                ("count", m.count),
                ("heads", m.heads),
                ("head_dim", m.head_dim),
                ("state_size", m.state_size),
                ("groups", m.groups),
                ("conv_kernel", m.conv_kernel),
            ] {
                one(format!("mamba.{k}"), v.into())?;
            }
        }
        for (i, f) in self.mlp.iter().enumerate() {
            one(format!("mlp[{i}].count"), f.count.into())?;
            one(format!("mlp[{i}].intermediate"), f.intermediate)?;
            if f.active_experts > f.experts || (f.experts > 0 && f.active_experts == 0) {
                return err(format!("mlp[{i}].active_experts"), "must be from 1 to `experts` (0 for a dense MLP)");
            }
        }
        if self.mixer_layers() == 0 {
            return err("attention".into(), "a model needs at least one attention, MLA or Mamba layer");
        }
        hf::fits_in_64_bits(self).map_err(|e| hf::HfError::new("", e.problem))
    }

    /// Mixer layers of every kind.
    pub fn mixer_layers(&self) -> u32 {
        self.attention.iter().map(|a| a.count).sum::<u32>()
            + self.mla.as_ref().map_or(0, |m| m.count)
            + self.mamba.as_ref().map_or(0, |m| m.count)
    }

    /// The model's parameters by where they sit.
    pub fn params(&self) -> ParamCounts {
        let hidden = self.hidden_size;
        let embedding = self.vocab_size * hidden;
        let mut p = ParamCounts {
            embedding,
            lm_head: if self.tie_word_embeddings { 0 } else { embedding },
            ..ParamCounts::default()
        };
        for a in &self.attention {
            p.mixers += u64::from(a.count) * a.params(hidden);
        }
        if let Some(m) = &self.mla {
            p.mixers += u64::from(m.count) * m.params(hidden);
        }
        if let Some(m) = &self.mamba {
            p.mixers += u64::from(m.count) * m.params(hidden);
        }
        for f in &self.mlp {
            let n = u64::from(f.count);
            p.dense_ffn += n * f.dense_params(hidden);
            p.experts += n * u64::from(f.experts) * f.expert_params(hidden);
            p.experts_active += n * u64::from(f.active_experts) * f.expert_params(hidden);
        }
        p
    }

    /// Bytes of the weights one rank of TP `tp` holds: everything split
    /// `tp` ways (embedding and LM head by vocabulary, layers by heads and
    /// intermediate width, experts by their width), experts at their own
    /// bits.
    pub fn weight_bytes_per_rank(&self, tp: u32) -> u64 {
        let p = self.params();
        let bits = u64::from(self.weight_bits);
        let expert_bits = u64::from(self.expert_weight_bits.unwrap_or(self.weight_bits));
        let bits_total = (p.embedding + p.lm_head + p.mixers + p.dense_ffn) * bits + p.experts * expert_bits;
        (bits_total / 8).div_ceil(u64::from(tp.max(1)))
    }
}

/// Llama-3.1-8B, for unit tests (the module's worked number).
#[cfg(test)]
pub(crate) fn llama_3_1_8b() -> ModelArch {
    ModelArch {
        hidden_size: 4096,
        vocab_size: 128_256,
        tie_word_embeddings: false,
        weight_bits: 16,
        expert_weight_bits: None,
        max_position_embeddings: Some(131_072),
        attention: vec![AttentionLayers { count: 32, heads: 32, kv_heads: 8, head_dim: 128, window: None }],
        mla: None,
        mamba: None,
        mlp: vec![MlpLayers {
            count: 32,
            intermediate: 14_336,
            experts: 0,
            active_experts: 0,
            shared_intermediate: 0,
            gated: true,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_3_1_8b_has_its_published_parameter_count() {
        let p = llama_3_1_8b().params();
        // See the module's worked number.
        assert_eq!(p.mixers, 32 * 41_943_040);
        assert_eq!(p.dense_ffn, 32 * 176_160_768);
        assert_eq!(p.embedding + p.lm_head, 1_050_673_152);
        assert_eq!(p.total(), 8_029_995_008);
        assert_eq!(p.active_per_token(), 6_979_321_856);
        // bf16 at TP 4: 8,029,995,008 × 2 / 4 bytes.
        assert_eq!(llama_3_1_8b().weight_bytes_per_rank(4), 4_014_997_504);
    }
}
