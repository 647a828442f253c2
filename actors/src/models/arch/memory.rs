//! KV capacity from GPU memory, as vLLM sizes its cache when no block
//! count is given (`gpu_worker.py` `determine_available_memory`):
//!
//! ```text
//! KV bytes = memory × gpu_memory_utilization − weights − peak activations − non-torch reserve
//! blocks   = ⌊KV bytes / page bytes⌋
//! ```
//!
//! vLLM measures the last two by running a dummy forward pass of
//! `max_num_batched_tokens` tokens; pdsim estimates them (the one part of
//! this that is not exact, and says so):
//! - peak activations: per token of that pass, the residual stream and its
//!   normed copy, the QKV output and the MLP's gate and up outputs (per
//!   rank), 2 bytes each; plus the sampler's fp32 logits for
//!   `max_num_seqs` sequences over the rank's share of the vocabulary;
//! - non-torch reserve: 1 GiB (CUDA context, NCCL and cuBLAS workspaces,
//!   CUDA graphs), a round figure within the 0.5–1.5 GiB vLLM logs report.
//!
//! Llama-3.1-8B on one H200 (140.4 GiB), TP 1, utilization 0.9, 8,192
//! tokens, 256 sequences:
//! - budget 0.9 × 140.4 GiB = 135,678,016,880.6 bytes;
//! - weights 16,059,990,016 bytes;
//! - activations 8,192 × (2 × 4,096 + 6,144 + 2 × 14,336) × 2 = 704,643,072
//!   bytes, logits 256 × 128,256 × 4 = 131,334,144: 835,977,216;
//! - reserve 1,073,741,824;
//! - KV 117,708,307,824.6 bytes: 56,127 blocks of 16 tokens × 131,072 bytes
//!   (2,097,152), 898,032 tokens.

use crate::models::arch::ModelArch;

/// Where a rank's memory goes, bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryBudget {
    /// Device memory × `gpu_memory_utilization`.
    pub budget: f64,
    /// The rank's weights.
    pub weights: f64,
    /// Peak activations of the profiling pass (estimated).
    pub activations: f64,
    /// CUDA context, communication workspaces, CUDA graphs (estimated).
    pub reserve: f64,
}

impl MemoryBudget {
    /// What is left for the KV cache (0 when nothing is).
    pub fn kv_bytes(&self) -> f64 {
        (self.budget - self.weights - self.activations - self.reserve).max(0.0)
    }
}

/// The non-torch reserve, bytes.
pub const RESERVE_BYTES: f64 = 1_073_741_824.0;

impl ModelArch {
    /// The memory of one rank of TP `tp` on a device of `memory_bytes` at
    /// `utilization`, for a profiling pass of `tokens` tokens and `seqs`
    /// sequences.
    pub fn memory_budget(&self, memory_bytes: f64, utilization: f64, tp: u32, tokens: u64, seqs: u64) -> MemoryBudget {
        let t = u64::from(tp.max(1));
        let hidden = self.hidden_size;
        let qkv: u64 = self
            .attention
            .iter()
            .map(|a| u64::from(a.heads + 2 * a.kv_heads) * u64::from(a.head_dim))
            .max()
            .unwrap_or(0)
            .max(self.mamba.as_ref().map_or(0, |m| 2 * m.d_inner()));
        let mlp = self.mlp.iter().map(|m| m.intermediate.max(m.shared_intermediate)).max().unwrap_or(0);
        let per_token = 2 * hidden + qkv / t + 2 * mlp / t;
        let activations = tokens as f64 * per_token as f64 * 2.0 + seqs as f64 * (self.vocab_size / t) as f64 * 4.0;
        MemoryBudget {
            budget: memory_bytes * utilization,
            weights: self.weight_bytes_per_rank(tp) as f64,
            activations,
            reserve: RESERVE_BYTES,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::models::arch::llama_3_1_8b;

    #[test]
    fn llama_on_an_h200_has_the_module_s_blocks() {
        let m = llama_3_1_8b().memory_budget(140.4 * 1_073_741_824.0, 0.9, 1, 8192, 256);
        assert_eq!(m.weights, 16_059_990_016.0);
        assert_eq!(m.activations, 835_977_216.0);
        let blocks = (m.kv_bytes() / 2_097_152.0).floor();
        assert_eq!(blocks, 56_127.0);
    }
}
