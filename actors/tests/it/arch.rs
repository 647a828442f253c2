//! Real `config.json` files (`presets/models/`): their parameter counts
//! against the published ones, and the cache layout derived from them
//! against the hand-written fragments (`scenarios/models/`).
//!
//! Parameter counts leave out biases and norms (see `actors::arch`), so
//! each total is checked exactly against its arithmetic and within 0.5 %
//! of the published figure (given to 3 significant digits). Published
//! "active" counts follow each vendor's own convention, stated per model.

use actors::arch::ModelArch;
use actors::arch::hf::from_config_json;
use actors::model::{CacheGroupKind, CacheGroupSpec, ModelSpec, Role};
use actors::units::{Bytes, Tokens};
use serde::Deserialize;

fn read(rel: &str) -> String {
    let path = format!("{}/../{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn fixture(id: &str) -> ModelArch {
    from_config_json(&read(&format!("presets/models/{id}.json"))).unwrap_or_else(|e| panic!("{id}: {e}"))
}

/// A model fragment: one `[model]` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Fragment {
    model: ModelSpec,
}

fn fragment(file: &str) -> ModelSpec {
    toml::from_str::<Fragment>(&read(&format!("scenarios/models/{file}"))).expect("fragment parses").model
}

/// `got` within `pct` percent of `published`.
fn near(got: u64, published: f64, pct: f64) {
    let off = (got as f64 - published).abs() / published * 100.0;
    assert!(off <= pct, "{got} is {off:.2} % from {published}");
}

#[test]
fn llama_3_1_8b_has_8_03_b_parameters() {
    let a = fixture("llama-3.1-8b");
    let p = a.params();
    // Attention 2 × 4,096 × 32 × 128 + 2 × 4,096 × 8 × 128 = 41,943,040 and
    // MLP 3 × 4,096 × 14,336 = 176,160,768 a layer, × 32 = 6,979,321,856;
    // embedding and LM head 2 × 128,256 × 4,096 = 1,050,673,152.
    assert_eq!(p.mixers + p.dense_ffn, 32 * (41_943_040 + 176_160_768));
    assert_eq!(p.total(), 8_029_995_008);
    near(p.total(), 8.03e9, 0.5);
    assert_eq!((a.weight_bits, a.max_position_embeddings), (16, Some(131_072)));
}

#[test]
fn qwen3_8b_has_8_19_b_parameters() {
    let p = fixture("qwen3-8b").params();
    // head_dim 128 given: q and o 2 × 4,096 × 32 × 128 = 33,554,432, k and v
    // 2 × 4,096 × 8 × 128 = 8,388,608; MLP 3 × 4,096 × 12,288 = 150,994,944;
    // 36 × 192,937,984 = 6,945,767,424; embeddings 2 × 151,936 × 4,096 =
    // 1,244,659,712 (untied).
    assert_eq!(p.total(), 6_945_767_424 + 1_244_659_712);
    assert_eq!(p.total(), 8_190_427_136);
    near(p.total(), 8.19e9, 0.5);
}

#[test]
fn mistral_7b_v0_3_has_7_25_b_parameters() {
    let a = fixture("mistral-7b-v0.3");
    // Llama-3.1-8B's layers (32 × 218,103,808 = 6,979,321,856) with a
    // 32,768-token vocabulary: 2 × 32,768 × 4,096 = 268,435,456.
    assert_eq!(a.params().total(), 7_247_757_312);
    near(a.params().total(), 7.25e9, 0.5);
    // v0.3 has no sliding window (`sliding_window: null`).
    assert_eq!(a.attention.len(), 1);
    assert_eq!(a.attention[0].window, None);
}

#[test]
fn llama_2_7b_has_6_74_b_parameters() {
    let a = fixture("llama-2-7b");
    // Attention 4 × 4,096 × 4,096 = 67,108,864 (32 KV heads: no grouping),
    // MLP 3 × 4,096 × 11,008 = 135,266,304, × 32 layers = 6,476,005,376;
    // embeddings 2 × 32,000 × 4,096 = 262,144,000.
    assert_eq!(a.params().total(), 6_476_005_376 + 262_144_000);
    near(a.params().total(), 6.74e9, 0.5);
    assert_eq!((a.weight_bits, a.max_position_embeddings), (16, Some(4096)));
}

/// Llama-2-70B, Llama-3.1-70B and CodeLlama-34B share a layer's attention
/// (64 heads and 8 KV heads of 128 on 8,192): q and o 2 × 8,192 × 8,192 =
/// 134,217,728, k and v 2 × 8,192 × 1,024 = 16,777,216.
const ATTN_8192_GQA8: u64 = 150_994_944;

#[test]
fn llama_2_70b_has_69_0_b_parameters() {
    let p = fixture("llama-2-70b").params();
    // MLP 3 × 8,192 × 28,672 = 704,643,072; 80 × 855,638,016 =
    // 68,451,041,280; embeddings 2 × 32,000 × 8,192 = 524,288,000.
    assert_eq!(p.mixers + p.dense_ffn, 80 * (ATTN_8192_GQA8 + 704_643_072));
    assert_eq!(p.total(), 68_975_329_280);
    near(p.total(), 69.0e9, 0.5);
}

#[test]
fn llama_3_1_70b_has_70_6_b_parameters() {
    let a = fixture("llama-3.1-70b");
    // Llama-2-70B's layers (68,451,041,280) with a 128,256-token
    // vocabulary: 2 × 128,256 × 8,192 = 2,101,346,304.
    assert_eq!(a.params().total(), 68_451_041_280 + 2_101_346_304);
    near(a.params().total(), 70.6e9, 0.5);
    assert_eq!(a.max_position_embeddings, Some(131_072));
}

#[test]
fn codellama_34b_has_33_7_b_parameters() {
    let p = fixture("codellama-34b").params();
    // MLP 3 × 8,192 × 22,016 = 541,065,216; 48 × 692,060,160 =
    // 33,218,887,680; embeddings 2 × 32,000 × 8,192 = 524,288,000.
    assert_eq!(p.mixers + p.dense_ffn, 48 * (ATTN_8192_GQA8 + 541_065_216));
    assert_eq!(p.total(), 33_743_175_680);
    near(p.total(), 33.7e9, 0.5);
}

#[test]
fn qwen3_32b_has_32_8_b_parameters() {
    let p = fixture("qwen3-32b").params();
    // q and o 2 × 5,120 × 64 × 128 = 83,886,080, k and v 2 × 5,120 × 8 ×
    // 128 = 10,485,760; MLP 3 × 5,120 × 25,600 = 393,216,000; 64 ×
    // 487,587,840 = 31,205,621,760; embeddings 2 × 151,936 × 5,120 =
    // 1,555,824,640 (untied).
    assert_eq!(p.total(), 31_205_621_760 + 1_555_824_640);
    near(p.total(), 32.8e9, 0.5);
}

#[test]
fn mixtral_8x7b_has_46_7_b_parameters_12_9_b_active() {
    let p = fixture("mixtral-8x7b").params();
    // Attention: q and o 2 × 4,096 × 4,096, k and v 2 × 4,096 × 1,024 =
    // 41,943,040 × 32 = 1,342,177,280.
    assert_eq!(p.mixers, 1_342_177_280);
    // 8 experts of 3 × 4,096 × 14,336 = 176,160,768 on 32 layers:
    // 45,097,156,608; routers 32 × 4,096 × 8 = 1,048,576; embeddings 2 ×
    // 32,000 × 4,096 = 262,144,000.
    assert_eq!(p.experts, 45_097_156_608);
    assert_eq!(p.total(), 1_342_177_280 + 45_097_156_608 + 1_048_576 + 262_144_000);
    near(p.total(), 46.7e9, 0.5);
    // Mistral's 12.9 B active counts the embeddings: 1,342,177,280 +
    // 1,048,576 + 32 × 2 × 176,160,768 + 262,144,000 = 12,879,659,008.
    assert_eq!(p.active_per_token() + p.embedding + p.lm_head, 12_879_659_008);
    near(p.active_per_token() + p.embedding + p.lm_head, 12.9e9, 0.5);
}

#[test]
fn gpt_oss_20b_has_20_9_b_parameters_3_6_b_active() {
    let a = fixture("gpt-oss-20b");
    let p = a.params();
    // Attention (head_dim 64): q and o 2 × 2,880 × 64 × 64 = 23,592,960, k
    // and v 2 × 2,880 × 8 × 64 = 2,949,120: 26,542,080 × 24 = 637,009,920.
    assert_eq!(p.mixers, 637_009_920);
    // 32 experts of 3 × 2,880 × 2,880 = 24,883,200 on 24 layers:
    // 19,110,297,600; routers 24 × 2,880 × 32 = 2,211,840.
    assert_eq!(p.experts, 19_110_297_600);
    assert_eq!(p.dense_ffn, 2_211_840);
    // Embedding and LM head 2 × 201,088 × 2,880 = 1,158,266,880.
    assert_eq!(p.total(), 20_907_786_240);
    near(p.total(), 20.9e9, 0.5);
    // OpenAI's 3.6 B active counts the unembedding, not the embedding:
    // 637,009,920 + 2,211,840 + 24 × 4 × 24,883,200 + 579,133,440.
    assert_eq!(p.active_per_token() + p.lm_head, 3_607_142_400);
    near(p.active_per_token() + p.lm_head, 3.6e9, 0.5);
    // 12 sliding (128, layer 0 first) and 12 full layers; experts in MXFP4.
    let windows: Vec<_> = a.attention.iter().map(|g| (g.count, g.window)).collect();
    assert_eq!(windows, [(12, Some(128)), (12, None)]);
    assert_eq!((a.weight_bits, a.expert_weight_bits), (16, Some(4)));
}

#[test]
fn qwen3_30b_a3b_has_30_5_b_parameters_3_3_b_active() {
    let p = fixture("qwen3-30b-a3b").params();
    // Attention: q and o 2 × 2,048 × 32 × 128 = 16,777,216, k and v 2 ×
    // 2,048 × 4 × 128 = 2,097,152: 18,874,368 × 48 = 905,969,664.
    assert_eq!(p.mixers, 905_969_664);
    // 128 experts of 3 × 2,048 × 768 = 4,718,592 on 48 layers:
    // 28,991,029,248; routers 48 × 2,048 × 128 = 12,582,912.
    assert_eq!(p.experts, 28_991_029_248);
    // Embeddings 2 × 151,936 × 2,048 = 622,329,856.
    assert_eq!(p.total(), 30_531_911_680);
    near(p.total(), 30.5e9, 0.5);
    // Qwen's 3.3 B activated counts both embeddings: 905,969,664 +
    // 12,582,912 + 48 × 8 × 4,718,592 + 622,329,856 = 3,352,821,760
    // (1.6 % over the rounded figure).
    assert_eq!(p.active_per_token() + p.embedding + p.lm_head, 3_352_821_760);
    near(p.active_per_token() + p.embedding + p.lm_head, 3.3e9, 2.0);
}

#[test]
fn deepseek_v3_has_671_b_parameters_37_b_active() {
    let a = fixture("deepseek-v3");
    let p = a.params();
    // MLA a layer: q 7,168 × 1,536 + 1,536 × 128 × 192 = 48,758,784; KV down
    // 7,168 × (512 + 64) = 4,128,768; up 512 × 128 × (128 + 128) =
    // 16,777,216; o 128 × 128 × 7,168 = 117,440,512: 187,105,280 × 61.
    assert_eq!(p.mixers, 61 * 187_105_280);
    // 3 dense MLPs of 3 × 7,168 × 18,432 = 396,361,728; 58 MoE layers with a
    // shared expert (3 × 7,168 × 2,048 = 44,040,192) and a router (7,168 ×
    // 256 = 1,835,008), and 256 routed experts of 44,040,192.
    assert_eq!(p.dense_ffn, 3 * 396_361_728 + 58 * (44_040_192 + 1_835_008));
    assert_eq!(p.experts, 58 * 256 * 44_040_192);
    // Embeddings 2 × 129,280 × 7,168 = 1,853,358,080. The MTP layer is not
    // counted (the published 671 B leaves it out too; 685 B with it).
    assert_eq!(p.total(), 671_025_397_760);
    near(p.total(), 671e9, 0.5);
    // Active: 8 routed experts a layer (58 × 8 × 44,040,192 =
    // 20,434,649,088) plus everything dense, plus the LM head: 36.6 B,
    // 1.0 % under the published 37 B (37.6 B with the embedding as well).
    assert_eq!(p.active_per_token() + p.lm_head, 36_624_596_992);
    near(p.active_per_token() + p.lm_head, 37e9, 2.0);
    assert_eq!(a.weight_bits, 8);
}

#[test]
fn nemotron_h_8b_has_8_1_b_parameters() {
    let a = fixture("nemotron-h-8b");
    let p = a.params();
    // 24 Mamba2 layers: in_proj 4,096 × (2 × 8,192 + 2 × 8 × 128 + 128) =
    // 76,021,760, conv (8,192 + 2,048) × 4 = 40,960, out_proj 8,192 × 4,096
    // = 33,554,432: 109,617,152 each. 4 attention layers of 41,943,040.
    assert_eq!(p.mixers, 24 * 109_617_152 + 4 * 41_943_040);
    // 24 squared-ReLU MLPs (up and down): 2 × 4,096 × 21,504 = 176,160,768.
    assert_eq!(p.dense_ffn, 24 * 176_160_768);
    // Embeddings 2 × 131,072 × 4,096 = 1,073,741,824.
    assert_eq!(p.total(), 8_100_184_064);
    near(p.total(), 8.1e9, 0.5);
}

#[test]
fn llama_derives_the_tp4_fragment_byte_for_byte() {
    let arch = fixture("llama-3.1-8b");
    let derived = arch.model_spec("llama-3.1-8b-tp4", 4, 16, None).unwrap();
    // The derived spec carries its arch; the fragment names none.
    assert_eq!(derived.arch.as_ref(), Some(&arch));
    let expected = fragment("llama-3.1-8b-tp4.toml");
    assert_eq!(ModelSpec { arch: None, ..derived }, expected);
    // 32 × 2 × (8 / 4) × 128 × 2 = 32,768.
    assert_eq!(expected.kv_bytes_per_token, Some(Bytes::new(32_768)));
}

/// A group without `heads` (the fragments give none), for comparing a
/// derived group with a written one.
fn without_heads(g: &CacheGroupSpec) -> CacheGroupSpec {
    CacheGroupSpec { heads: None, ..g.clone() }
}

#[test]
fn gpt_oss_20b_derives_the_sliding_window_fragment() {
    let derived = fixture("gpt-oss-20b").model_spec("gpt-oss-like", 1, 16, None).unwrap();
    let expected = fragment("gpt-oss-like.toml");
    derived.validate(Role::Prefill).unwrap();
    // vLLM numbers groups by their first layer, and gpt-oss-20b's layer 0
    // slides: the derived order is (sliding, full); the fragment lists full
    // attention first. Matched by kind, each group is the fragment's (name
    // included) but for its heads (8 KV heads): 12 × 16 ×
    // 2,048 = 393,216 bytes a page, all moved; window 128.
    let kinds: Vec<_> = derived.cache_groups.iter().map(|g| g.kind).collect();
    assert_eq!(kinds, [CacheGroupKind::SlidingWindow, CacheGroupKind::FullAttention]);
    assert_eq!(derived.cache_groups.len(), expected.cache_groups.len());
    for e in &expected.cache_groups {
        let d = derived.cache_groups.iter().find(|d| d.kind == e.kind).expect("a group of each kind");
        assert_eq!(&without_heads(d), e);
        assert_eq!(d.heads, Some(8));
    }
    assert_eq!(derived.cache_groups[0].page_bytes, Bytes::new(393_216));
    assert_eq!((derived.tp, expected.tp), (Some(1), None));
}

#[test]
fn nemotron_h_8b_derives_the_mamba_hybrid_fragment() {
    let derived = fixture("nemotron-h-8b").model_spec("mamba2-hybrid-like", 1, 16, None).unwrap();
    let expected = fragment("mamba2-hybrid-like.toml");
    derived.validate(Role::Prefill).unwrap();
    // Equal but for what the fragment does not give: the reference tp, each
    // group's heads (8 KV heads; 128 Mamba heads) and the arch.
    let heads: Vec<_> = derived.cache_groups.iter().map(|g| g.heads).collect();
    assert_eq!(heads, [Some(8), Some(128), Some(128), Some(128), Some(128), Some(128), Some(128)]);
    let stripped = ModelSpec {
        tp: None,
        arch: None,
        cache_groups: derived.cache_groups.iter().map(without_heads).collect(),
        ..derived.clone()
    };
    assert_eq!(stripped, expected);
    // B = 16 × cdiv(2,158,592, 16 × 4,096) = 528; page 4 × 528 × 4,096 =
    // 8,650,752; a Mamba group moves 4 × 2,158,592 = 8,634,368.
    assert_eq!(derived.cache_groups[0].block_size_tokens, Tokens::new(528));
    assert_eq!(derived.cache_groups[1].transfer_bytes_per_block, Some(Bytes::new(8_634_368)));
}

#[test]
fn deepseek_v3_is_linear_and_replicated() {
    let arch = fixture("deepseek-v3");
    // 61 × (512 + 64) × 2 bytes a token, at TP 1 and TP 8 alike.
    for tp in [1, 8] {
        let s = arch.model_spec("deepseek-v3", tp, 16, None).unwrap();
        assert_eq!(s.kv_bytes_per_token, Some(Bytes::new(70_272)));
        assert_eq!((s.tp, s.kv_heads), (Some(tp), Some(1)));
    }
    // 128 query heads do not split 3 ways.
    assert_eq!(arch.model_spec("deepseek-v3", 3, 16, None).unwrap_err().field, "mla.heads");
}

#[test]
fn the_other_fixtures_derive_linear_specs() {
    // Qwen3-8B at TP 2: 36 × 2 × 4 × 128 × 2 = 73,728. Qwen3-30B-A3B at TP 4
    // (4 KV heads, 1 a rank): 48 × 2 × 1 × 128 × 2 = 24,576. Mistral at TP 1:
    // 32 × 2 × 8 × 128 × 2 = 131,072.
    let kv = |id: &str, tp| fixture(id).model_spec(id, tp, 16, None).unwrap().kv_bytes_per_token.unwrap().get();
    assert_eq!(kv("qwen3-8b", 2), 73_728);
    assert_eq!(kv("qwen3-30b-a3b", 4), 24_576);
    assert_eq!(kv("mistral-7b-v0.3", 1), 131_072);
    // TP 8 past Qwen3-30B-A3B's 4 KV heads replicates them: still 24,576.
    assert_eq!(kv("qwen3-30b-a3b", 8), 24_576);
}

#[test]
fn a_missing_key_is_named() {
    let text = read("presets/models/llama-3.1-8b.json");
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value.as_object_mut().unwrap().remove("num_key_value_heads");
    value.as_object_mut().unwrap().remove("intermediate_size");
    let e = from_config_json(&value.to_string()).unwrap_err();
    assert_eq!((e.field.as_str(), e.problem.as_str()), ("intermediate_size", "missing"));
    assert_eq!(e.to_string(), "intermediate_size: missing");

    let text = read("presets/models/nemotron-h-8b.json");
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value.as_object_mut().unwrap().remove("ssm_state_size");
    assert_eq!(from_config_json(&value.to_string()).unwrap_err().field, "ssm_state_size");

    let text = read("presets/models/deepseek-v3.json");
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["kv_lora_rank"] = serde_json::json!("512");
    let e = from_config_json(&value.to_string()).unwrap_err();
    assert_eq!(e.field, "kv_lora_rank");
    assert!(e.problem.contains("integer"), "{e}");
}

#[test]
fn an_unknown_model_type_is_named() {
    let text = read("presets/models/llama-3.1-8b.json").replace("\"llama\"", "\"falcon\"");
    let e = from_config_json(&text).unwrap_err();
    assert_eq!(e.field, "model_type");
    assert!(e.problem.starts_with("\"falcon\" is not a family"), "{e}");
}
