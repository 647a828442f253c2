//! A roofline step-time model: a step priced from the work its batch does
//! on a named GPU, with no measurement.
//!
//! # The formula
//!
//! Per rank of TP size `t`, for a step of N tokens computed over S
//! sequences (P of them prefilling, D decoding):
//!
//! ```text
//! step = overhead + layers × layer_overhead
//!      + max(GEMM FLOPs / (peak × gemm_efficiency),  weight bytes / (HBM × weight_memory_efficiency))
//!      + max(prefill attention FLOPs / (bf16 peak × attention_efficiency),
//!            prefill KV bytes / (HBM × kv_memory_efficiency),
//!            attention layers × prefill_attention_floor)            (only with prompt tokens)
//!      + max(decode attention FLOPs / (bf16 peak × attention_efficiency),
//!            decode KV bytes / (HBM × kv_memory_efficiency))        (only with decoding sequences)
//!      + all-reduces × (allreduce_latency + 2(t − 1)/t × N × hidden × 2 bytes / (NVLink × network_efficiency))
//! ```
//!
//! - One forward pass: the weights are streamed once and every layer's
//!   small kernels (norms, residual adds, RoPE, the gated activation,
//!   attention's launch) run once, whatever the batch and however it
//!   splits into prefill and decode.
//! - GEMM FLOPs = 2 × (parameters one token multiplies by) / t × N
//!   plus 2 × vocabulary × hidden / t × S (the LM head runs once per
//!   sequence); the peak is the fp8 one for 8-bit weights.
//! - Weight bytes = the rank's weights read once per step: every
//!   parameter but the routed experts, plus the experts the step's tokens
//!   touch (per MoE layer, E × (1 − (1 − k/E)^N) of E experts when each
//!   token picks k). Weights stream at a lower share of HBM than KV reads
//!   (GEMV kernels against long contiguous KV pages): one efficiency each.
//! - Attention FLOPs = 4 × heads/t × head dim per (query, key) pair and
//!   layer (QKᵀ and PV); prefill pairs are Σk(k+1)/2 + Σk·c over its
//!   chunks of k tokens on c cached, decode pairs Σ(c + 1); a sliding
//!   window caps a sequence's keys at W; MLA counts its per-head query and
//!   value dimensions (prefill) or its latent (decode, absorbed).
//! - KV bytes come from the rank's cache groups (the bytes the pool holds,
//!   so the same dtype): a prefill reads its cached tokens and writes its
//!   new ones, a decode reads its context; a state group (Mamba) reads and
//!   writes its state once per sequence.
//! - With TP > 1, one all-reduce after each block (each mixer and each
//!   MLP: two a layer for Llama, one a block for Nemotron-H's separate
//!   mixer and MLP blocks), of the step's bf16 activations, on a ring: an
//!   α–β model, so a small message costs its latency and a large one
//!   reaches `network_efficiency` of NVLink, the ring's 2(t − 1)/t growing
//!   with TP.
//!
//! [`RooflineParams`] says where each default comes from.
//!
//! Worked number: Llama-3.1-8B (bf16) on one H200 (989.4 TFLOP/s bf16,
//! 4.8 TB/s), TP 1, the defaults, 64 decoding sequences of 1,024 cached
//! tokens each:
//! - layers: 32 × 38.63 µs = 1.23616 ms;
//! - weights: 525,336,576 (LM head) + 1,342,177,280 (attention) +
//!   5,637,144,576 (MLP) = 7,504,658,432 parameters × 2 = 15,009,316,864
//!   bytes / (4.8e12 × 0.87) = 3.594185 ms; GEMMs: 2 × 6,979,321,856 × 64
//!   plus 2 × 525,336,576 × 64 = 960,596,279,296 FLOP / (989.4e12 × 0.7) =
//!   1.386987 ms: weight-bound, 3.594185 ms;
//! - decode attention: 64 × 1,025 = 65,600 pairs × 32 layers × 4 × 32 ×
//!   128 = 34,393,292,800 FLOP (0.069523 ms) against 131,072 bytes × 65,600
//!   tokens = 8,598,323,200 KV bytes / (4.8e12 × 0.77) = 2.326386 ms;
//! - step = 1.23616 + 3.594185 + 2.326386 = 7.156731 ms (AIConfigurator's
//!   measured-kernel model: 7.5688 ms, so −5.4 %).

use serde::{Deserialize, Serialize};
use sim_core::SimDuration;

use crate::base::field::FieldError;
use crate::models::arch::ModelArch;
use crate::models::hardware::Gpu;
use crate::models::model::{CacheGroup, CacheGroupKind};
use crate::models::steptime::{BatchShape, StepTimeModel};

/// The roofline's named factors: what share of a peak each kind of work
/// reaches, and the fixed costs. A scenario's `step_time = { kind =
/// "roofline", … }` is this (each factor absent takes its default).
///
/// Every default is derived once from public measurements, never fitted
/// to a model (the grids it is checked against are of other sizes):
/// - `weight_memory_efficiency` 0.87, `layer_overhead_us` 38.63 and
///   `allreduce_latency_us` 5: a decode step of one sequence on no
///   context on AIConfigurator's H200 grid of Llama-3.1-8B (measured vLLM
///   kernels) takes 4,830.3 µs at TP 1 and 2,453.7 µs at TP 4. Both run
///   the same 32 layers of small kernels; TP 4 streams a quarter of the
///   15.0 GB of weights (3,126.9 µs at the datasheet's 4.8 TB/s, 781.7 µs
///   at TP 4) and adds 64 all-reduces of 8 KiB. With an all-reduce of a
///   small message at 5 µs (vLLM's custom all-reduce and NCCL on NVLink
///   both take about 5 µs), the difference, 2,376.6 µs = 2,345.2 µs / e −
///   321.9 µs, gives the weight stream's share e = 0.869 (0.87: a long
///   GEMV on Hopper reaches near the HBM bandwidth a copy does), and the
///   TP 1 step less its weight stream (3,594.2 µs) leaves 1,236.1 µs over
///   32 layers: 38.63 µs a layer, whatever its batch (the GEMMs' launch,
///   ramp and tail, two norms, two residual adds, RoPE, the gated
///   activation, the attention kernel's launch and split-K reduction).
///   The TP 4 step is then 2,456.6 µs (+0.1 %). (Taking the grid's whole
///   TP 4 excess as all-reduce latency, 16.75 µs each, gives 0.68 and
///   7.25 µs instead: the same price for this 32-layer model, but an
///   all-reduce at three times what the kernels take, and a long weight
///   stream too slow: Mixtral-8x7B's decode steps (46.5 GB of weights a
///   rank at TP 2) came out 17–23 % longer than on the real H100 servers
///   of `validation/`, 1–5 % shorter with these defaults.)
/// - `kv_memory_efficiency` 0.77: the same grid's growth with context (KV
///   bytes over the added time) is 0.74–0.79 of HBM peak.
/// - `prefill_attention_floor_us` 12.18: what a layer's prefill attention
///   kernel (flash attention over variable-length chunks) costs at least:
///   that grid's one-token prefill, 5,220.1 µs, less its one-sequence
///   decode on no context, 4,830.3 µs, over 32 layers.
/// - `network_efficiency` 0.93: NCCL's published all-reduce bus bandwidth
///   on NVLink reaches about 0.93 of the link's peak on large messages.
/// - `gemm_efficiency` 0.7 and `attention_efficiency` 0.5: dense bf16
///   GEMMs of a few thousand rows and flash attention on Hopper (their
///   published throughput, about 700 and 500 TFLOP/s of 989).
/// - `overhead_us` 0: the step's CPU side (scheduling, input preparation,
///   sampling) is not in a kernel grid; a scenario that prices a served
///   engine loop adds it here.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RooflineParams {
    /// Share of the tensor-core peak dense GEMMs reach.
    pub gemm_efficiency: f64,
    /// Share of the bf16 peak attention kernels reach.
    pub attention_efficiency: f64,
    /// Share of HBM bandwidth the weight stream reaches.
    pub weight_memory_efficiency: f64,
    /// Share of HBM bandwidth KV-cache reads and writes reach.
    pub kv_memory_efficiency: f64,
    /// Share of NVLink bandwidth an all-reduce reaches on large messages.
    pub network_efficiency: f64,
    /// Latency of one all-reduce (its cost on a small message), µs.
    pub allreduce_latency_us: f64,
    /// Fixed cost of one decoder layer in a step (norms, residual adds,
    /// RoPE, the activation, attention's launch), µs.
    pub layer_overhead_us: f64,
    /// Least time of one layer's prefill attention in a step with prompt
    /// tokens, µs.
    pub prefill_attention_floor_us: f64,
    /// Fixed cost of a step outside its kernels (scheduling, sampling), µs.
    pub overhead_us: f64,
}

impl Default for RooflineParams {
    fn default() -> Self {
        RooflineParams {
            gemm_efficiency: 0.7,
            attention_efficiency: 0.5,
            weight_memory_efficiency: 0.87,
            kv_memory_efficiency: 0.77,
            network_efficiency: 0.93,
            allreduce_latency_us: 5.0,
            layer_overhead_us: 38.63,
            prefill_attention_floor_us: 12.18,
            overhead_us: 0.0,
        }
    }
}

impl RooflineParams {
    /// The factors' checks: each efficiency a share in (0, 1], each time a
    /// finite number of µs ≥ 0 (no more than 10⁹). The field is relative to
    /// `step_time`.
    pub fn check(&self) -> Result<(), FieldError> {
        for (field, v) in [
            ("gemm_efficiency", self.gemm_efficiency),
            ("attention_efficiency", self.attention_efficiency),
            ("weight_memory_efficiency", self.weight_memory_efficiency),
            ("kv_memory_efficiency", self.kv_memory_efficiency),
            ("network_efficiency", self.network_efficiency),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 1.0) {
                return Err(FieldError::new(field, format!("must be a share in (0, 1], got {v}")));
            }
        }
        for (field, v) in [
            ("allreduce_latency_us", self.allreduce_latency_us),
            ("layer_overhead_us", self.layer_overhead_us),
            ("prefill_attention_floor_us", self.prefill_attention_floor_us),
            ("overhead_us", self.overhead_us),
        ] {
            if !(v.is_finite() && (0.0..=1e9).contains(&v)) {
                return Err(FieldError::new(field, format!("must be from 0 to 1e9 µs, got {v}")));
            }
        }
        Ok(())
    }
}

/// One kind of attention layer, per rank: FLOPs per (query, key) pair
/// (prefill and decode forms), the window capping a sequence's keys.
#[derive(Clone, Copy, Debug, PartialEq)]
struct AttnKind {
    prefill_pair_flops: f64,
    decode_pair_flops: f64,
    window: Option<f64>,
}

/// One group of the pool, as the roofline reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum KvRead {
    /// Bytes per token, the window if any.
    Tokens { bytes_per_token: f64, window: Option<f64> },
    /// A state read and written once per sequence.
    State { bytes: f64 },
}

/// MoE layers alike: how many, experts, experts per token, bytes of one
/// expert on one rank.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Moe {
    layers: f64,
    experts: u32,
    active: u32,
    expert_bytes: f64,
}

/// The roofline model of one rank (see the module for the formula).
#[derive(Clone, Debug, PartialEq)]
pub struct RooflineStepTime {
    params: RooflineParams,
    gemm_rate: f64,
    attn_rate: f64,
    weight_rate: f64,
    kv_rate: f64,
    net_rate: f64,
    /// Decoder layers (attention or Mamba mixers), for the per-layer costs.
    layers: f64,
    /// Layers with attention (full or windowed, MLA), for the prefill floor.
    attention_layers: f64,
    gemm_flops_per_token: f64,
    head_flops_per_seq: f64,
    dense_weight_bytes: f64,
    moe: Vec<Moe>,
    attn: Vec<(f64, AttnKind)>,
    mamba_flops_per_token: f64,
    kv: Vec<KvRead>,
    allreduces: f64,
    allreduce_bytes_per_token: f64,
    ring_factor: f64,
}

/// What the model needs to know of one rank.
#[derive(Clone, Copy, Debug)]
pub struct RankInputs<'a> {
    /// The model's layers.
    pub arch: &'a ModelArch,
    /// The GPU.
    pub gpu: &'a Gpu,
    /// The rank's TP size.
    pub tp: u32,
    /// The rank's pool groups (their bytes at this TP size).
    pub groups: &'a [CacheGroup],
}

impl RooflineStepTime {
    /// The model of one rank.
    pub fn new(inputs: RankInputs<'_>, params: RooflineParams) -> Self {
        let RankInputs { arch, gpu, tp, groups } = inputs;
        let t = f64::from(tp.max(1));
        let p = arch.params();
        let bits = arch.weight_bits;
        let expert_bits = arch.expert_weight_bits.unwrap_or(bits);
        let hidden = arch.hidden_size as f64;
        let head = arch.vocab_size as f64 * hidden;
        let dense_params =
            (p.lm_head.max(p.embedding * u64::from(arch.tie_word_embeddings)) + p.mixers + p.dense_ffn) as f64;
        let moe = arch
            .mlp
            .iter()
            .filter(|m| m.experts > 0)
            .map(|m| Moe {
                layers: f64::from(m.count),
                experts: m.experts,
                active: m.active_experts.min(m.experts),
                expert_bytes: m.expert_params(arch.hidden_size) as f64 * f64::from(expert_bits) / 8.0 / t,
            })
            .collect();
        let mut attn = Vec::new();
        for a in &arch.attention {
            let heads = (f64::from(a.heads) / t).ceil();
            let f = 4.0 * heads * f64::from(a.head_dim);
            let kind = AttnKind { prefill_pair_flops: f, decode_pair_flops: f, window: a.window.map(|w| w as f64) };
            attn.push((f64::from(a.count), kind));
        }
        if let Some(m) = &arch.mla {
            let heads = (f64::from(m.heads) / t).ceil();
            let qk = f64::from(m.qk_nope_head_dim + m.qk_rope_head_dim);
            let prefill = heads * 2.0 * (qk + f64::from(m.v_head_dim));
            // Absorbed: queries meet the latent and its RoPE key, values are the latent.
            let latent = f64::from(m.kv_lora_rank);
            let decode = heads * 2.0 * (latent + f64::from(m.qk_rope_head_dim) + latent);
            attn.push((
                f64::from(m.count),
                AttnKind { prefill_pair_flops: prefill, decode_pair_flops: decode, window: None },
            ));
        }
        // The SSD scan: about 6 FLOPs per inner channel and state element.
        let mamba_flops_per_token = arch
            .mamba
            .as_ref()
            .map_or(0.0, |m| f64::from(m.count) * 6.0 * (m.d_inner() as f64 / t) * f64::from(m.state_size));
        let kv = groups
            .iter()
            .map(|g| {
                let bytes = g.transfer_bytes_per_block().get() as f64;
                match g.kind() {
                    CacheGroupKind::State => KvRead::State { bytes },
                    _ => KvRead::Tokens {
                        bytes_per_token: bytes / g.block_size().get() as f64,
                        window: g.window().map(|w| w.get() as f64),
                    },
                }
            })
            .collect();
        let layers = arch.mixer_layers() + arch.mlp.iter().map(|m| m.count).sum::<u32>();
        RooflineStepTime {
            params,
            gemm_rate: gpu.flops(bits) * params.gemm_efficiency,
            attn_rate: gpu.bf16_flops() * params.attention_efficiency,
            weight_rate: gpu.hbm_bytes_s() * params.weight_memory_efficiency,
            kv_rate: gpu.hbm_bytes_s() * params.kv_memory_efficiency,
            layers: f64::from(arch.mixer_layers()),
            attention_layers: f64::from(
                arch.attention.iter().map(|a| a.count).sum::<u32>() + arch.mla.as_ref().map_or(0, |m| m.count),
            ),
            net_rate: gpu.nvlink_bytes_s() * params.network_efficiency,
            gemm_flops_per_token: 2.0 * p.active_per_token() as f64 / t,
            head_flops_per_seq: 2.0 * head / t,
            dense_weight_bytes: dense_params * f64::from(bits) / 8.0 / t,
            moe,
            attn,
            mamba_flops_per_token,
            kv,
            allreduces: if tp > 1 { f64::from(layers) } else { 0.0 },
            allreduce_bytes_per_token: hidden * 2.0,
            ring_factor: 2.0 * (t - 1.0) / t,
        }
    }

    /// Each term in seconds: overhead, linear (GEMMs against weights),
    /// prefill attention, decode attention, all-reduce.
    fn seconds(&self, b: &BatchShape) -> [f64; 5] {
        let n = b.new_tokens as f64;
        let s = b.seqs as f64;
        let d = b.decode_seqs() as f64;
        let p_tok = b.prefill_tokens as f64;
        // Linear layers.
        let gemm = self.gemm_flops_per_token * n + self.head_flops_per_seq * s + self.mamba_flops_per_token * n;
        let mut weights = self.dense_weight_bytes;
        for m in &self.moe {
            weights += m.layers * experts_touched(m.experts, m.active, b.new_tokens) * m.expert_bytes;
        }
        let linear = if b.seqs == 0 { 0.0 } else { (gemm / self.gemm_rate).max(weights / self.weight_rate) };
        // Attention, prefill and decode apart (they are bound differently).
        let pairs = (b.prefill_self_pairs + b.prefill_cached_pairs) as f64;
        let decode_pairs = b.decode_context as f64 + d;
        let (mut pf, mut df) = (0.0, 0.0);
        for &(layers, a) in &self.attn {
            let (pp, dp) = match a.window {
                Some(w) => (pairs.min(p_tok * w), decode_pairs.min(d * w)),
                None => (pairs, decode_pairs),
            };
            pf += layers * a.prefill_pair_flops * pp;
            df += layers * a.decode_pair_flops * dp;
        }
        let (mut pb, mut db) = (0.0, 0.0);
        for kv in &self.kv {
            match *kv {
                KvRead::Tokens { bytes_per_token, window } => {
                    let (pc, dc) = match window {
                        Some(w) => (
                            (b.prefill_cached as f64).min(b.prefill_seqs as f64 * w),
                            (b.decode_context as f64).min(d * w),
                        ),
                        None => (b.prefill_cached as f64, b.decode_context as f64),
                    };
                    pb += bytes_per_token * (pc + p_tok);
                    db += bytes_per_token * (dc + d);
                }
                KvRead::State { bytes } => {
                    pb += 2.0 * bytes * b.prefill_seqs as f64;
                    db += 2.0 * bytes * d;
                }
            }
        }
        // A prefill's attention costs at least its kernels' floor a layer.
        let floor = self.attention_layers * self.params.prefill_attention_floor_us * 1e-6;
        let prefill = if b.prefill_seqs == 0 { 0.0 } else { (pf / self.attn_rate).max(pb / self.kv_rate).max(floor) };
        let decode = if d == 0.0 { 0.0 } else { (df / self.attn_rate).max(db / self.kv_rate) };
        let allreduce = if b.seqs == 0 {
            0.0
        } else {
            self.allreduces
                * (self.params.allreduce_latency_us * 1e-6
                    + self.ring_factor * n * self.allreduce_bytes_per_token / self.net_rate)
        };
        let fixed =
            if b.seqs == 0 { 0.0 } else { self.params.overhead_us + self.layers * self.params.layer_overhead_us };
        [fixed * 1e-6, linear, prefill, decode, allreduce]
    }
}

/// Distinct experts `n` tokens touch when each picks `k` of `e`
/// uniformly: e × (1 − (1 − k/e)^n). The power is taken by squaring, so
/// the value is the same on every machine.
fn experts_touched(e: u32, k: u32, n: u64) -> f64 {
    if e == 0 || n == 0 {
        return 0.0;
    }
    let miss = 1.0 - f64::from(k) / f64::from(e);
    let (mut base, mut exp, mut acc) = (miss, n, 1.0f64);
    while exp > 0 && acc > 0.0 {
        if exp & 1 == 1 {
            acc *= base;
        }
        base *= base;
        exp >>= 1;
    }
    f64::from(e) * (1.0 - acc)
}

impl StepTimeModel for RooflineStepTime {
    fn step_time(&self, b: &BatchShape) -> SimDuration {
        let total: f64 = self.seconds(b).iter().sum();
        SimDuration::from_nanos((total * 1e9).ceil().min(u64::MAX as f64) as u64)
    }

    fn terms(&self, b: &BatchShape) -> Vec<(&'static str, f64)> {
        let [overhead, linear, prefill, decode, allreduce] = self.seconds(b);
        vec![
            ("overhead", overhead * 1e6),
            ("linear", linear * 1e6),
            ("prefill_attention", prefill * 1e6),
            ("decode_attention", decode * 1e6),
            ("allreduce", allreduce * 1e6),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::units::{Bytes, Tokens};
    use crate::models::arch::llama_3_1_8b;
    use crate::models::hardware::HardwareSpec;
    use crate::models::model::{CacheGroupSpec, Role};

    fn h200() -> Gpu {
        let h = HardwareSpec {
            gpu: Some("h200".into()),
            bf16_tflops: Some(989.4),
            fp8_tflops: Some(1978.9),
            hbm_tb_s: Some(4.8),
            memory_gib: Some(140.4),
            nvlink_gb_s: Some(450.0),
        };
        h.resolve().unwrap()
    }

    /// Llama's one full-attention group at TP `tp`: 131,072 bytes a token at TP 1.
    fn kv(tp: u64) -> Vec<CacheGroup> {
        let block = 16 * 131_072 / tp;
        let g = CacheGroupSpec {
            name: "kv".into(),
            kind: CacheGroupKind::FullAttention,
            block_size_tokens: Tokens::new(16),
            page_bytes: Bytes::new(block),
            transfer_bytes_per_block: Some(Bytes::new(block)),
            prefix_cacheable: Some(true),
            window_tokens: None,
            checkpoint_blocks: None,
            heads: None,
        };
        vec![g.validate(Role::Aggregated, 0).unwrap()]
    }

    fn llama(tp: u32, gpu: &Gpu, groups: &[CacheGroup]) -> RooflineStepTime {
        let arch = llama_3_1_8b();
        RooflineStepTime::new(RankInputs { arch: &arch, gpu, tp, groups }, RooflineParams::default())
    }

    #[test]
    fn the_worked_number_of_the_module() {
        let (gpu, groups) = (h200(), kv(1));
        let m = llama(1, &gpu, &groups);
        let b = BatchShape::decoding(64, 64 * 1024);
        // 1.23616 + 3.594185 + 2.326386 ms (the module's arithmetic).
        let ns = m.step_time(&b).as_nanos();
        assert!((7_156_726..=7_156_736).contains(&ns), "{ns}");
        let terms = m.terms(&b);
        assert!((terms[0].1 - 1236.16).abs() < 1e-9, "{terms:?}");
        assert!((terms[1].1 - 3594.185).abs() < 0.01, "{terms:?}");
        assert!((terms[3].1 - 2326.386).abs() < 0.01, "{terms:?}");
        assert_eq!(terms[2].1, 0.0, "no prefill");
    }

    #[test]
    fn a_prompt_pays_the_attention_floor_and_a_decode_step_does_not() {
        let (gpu, groups) = (h200(), kv(1));
        let m = llama(1, &gpu, &groups);
        // One token: attention is far below the floor, 32 layers × 12.18 µs
        // = 389.76 µs; a decode step of one sequence on no context pays
        // none (its KV read: 131,072 bytes / 3.696e12 B/s = 0.035 µs).
        let mut one = BatchShape::default();
        one.add(1, 0, false);
        assert!((m.terms(&one)[2].1 - 389.76).abs() < 1e-9, "{:?}", m.terms(&one));
        let d = BatchShape::decoding(1, 0);
        assert!(m.terms(&d)[3].1 < 0.1, "{:?}", m.terms(&d));
    }

    #[test]
    fn a_long_prefill_is_compute_bound_and_pays_its_attention() {
        let (gpu, groups) = (h200(), kv(1));
        let m = llama(1, &gpu, &groups);
        let mut b = BatchShape::default();
        b.add(8192, 0, false);
        let t = m.terms(&b);
        // GEMMs 2 × 6,979,321,856 × 8,192 + 2 × 525,336,576 = 114,350,259,961,856 FLOP
        // / 692.58e12 = 165.1077 ms (weights would take 3.68 ms).
        assert!((t[1].1 - 165_107.7).abs() < 0.1, "{t:?}");
        // Attention: 8,192 × 8,193 / 2 = 33,558,528 pairs × 32 × 4 × 32 × 128
        // = 17,594,333,528,064 FLOP / 494.7e12 = 35.5657 ms.
        assert!((t[2].1 - 35_565.7).abs() < 0.1, "{t:?}");
        // One prompt of 8,192 costs more than eight of 1,024 (less attention).
        let mut eight = BatchShape::default();
        for _ in 0..8 {
            eight.add(1024, 0, false);
        }
        assert!(m.step_time(&eight) < m.step_time(&b));
    }

    #[test]
    fn tensor_parallel_ranks_split_the_work_and_pay_all_reduces() {
        let gpu = h200();
        let (g1, g4) = (kv(1), kv(4));
        let (one, four) = (llama(1, &gpu, &g1), llama(4, &gpu, &g4));
        let b = BatchShape::decoding(1, 1024);
        let t1 = one.terms(&b);
        let t4 = four.terms(&b);
        assert_eq!(t1[4].1, 0.0);
        // 64 all-reduces × (5 µs + 1.5 × 8,192 bytes / 418.5e9 B/s)
        // = 64 × 5.029362 µs = 321.879 µs.
        assert!((t4[4].1 - 321.879).abs() < 0.01, "{t4:?}");
        // Weights split four ways.
        assert!((t4[1].1 * 4.0 - t1[1].1).abs() < 0.01, "{t1:?} {t4:?}");
    }

    #[test]
    fn experts_touched_saturate_at_all_experts() {
        // One token touches exactly k of e.
        assert!((experts_touched(128, 8, 1) - 8.0).abs() < 1e-9);
        // 128 × (1 − (120/128)^2) = 128 × 0.12109375 = 15.5
        assert!((experts_touched(128, 8, 2) - 15.5).abs() < 1e-9);
        assert!((experts_touched(128, 8, 1 << 20) - 128.0).abs() < 1e-9);
        assert_eq!(experts_touched(0, 0, 5), 0.0);
        assert_eq!(experts_touched(128, 8, 0), 0.0);
    }
}
