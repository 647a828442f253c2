//! The shipped model fragments parse, validate and give their documented numbers.

use actors::model::{CacheGroupKind, Model, ModelSpec, Role, check_pairing, check_rank};
use actors::rules::{Payload, payload, source_release, transferred_tokens};
use actors::units::{Blocks, Bytes, Tokens};
use serde::Deserialize;

use crate::model_fixtures::glm;

/// A model fragment: one `[model]` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Fragment {
    model: ModelSpec,
}

const GLM: &str = include_str!("../../../scenarios/models/glm-5.3-flash-tp4-fp8.toml");
const GPT_OSS: &str = include_str!("../../../scenarios/models/gpt-oss-like.toml");
const MAMBA2: &str = include_str!("../../../scenarios/models/mamba2-hybrid-like.toml");
const LLAMA: &str = include_str!("../../../scenarios/models/llama-3.1-8b-tp4.toml");

fn load(text: &str) -> Model {
    let fragment: Fragment = toml::from_str(text).expect("fragment parses");
    fragment.model.validate(Role::Prefill).expect("fragment validates")
}

fn bytes(m: &Model, n: u64) -> u64 {
    payload(m, Tokens::new(n), Tokens::ZERO).unwrap().bytes().get()
}

#[test]
fn glm_file_gives_the_worked_numbers() {
    let m = load(GLM);
    // The shipped file has the groups of the oracle tests' fixture.
    assert_eq!(m.as_grouped().unwrap().groups(), glm().as_grouped().unwrap().groups());
    assert_eq!(m.name(), Some("glm-5.3-flash-like-tp4-fp8"));
    assert!(m.is_mamba_type());
    // 13,045,120 × cdiv(N − 1, 2,176) + 36,927,488.
    assert_eq!(bytes(&m, 1_000), 13_045_120 + 36_927_488);
    assert_eq!(bytes(&m, 2_177), 13_045_120 + 36_927_488);
    assert_eq!(bytes(&m, 8_192), 13_045_120 * 4 + 36_927_488);
    assert_eq!(bytes(&m, 131_072), 13_045_120 * 61 + 36_927_488);
    let Payload::Blocks(p) = payload(&m, Tokens::new(1_000), Tokens::ZERO).unwrap() else { panic!("grouped") };
    assert_eq!(p.fixed_bytes(), Bytes::new(22_528 + 2 * 9_768_960 + 2 * 8_683_520));
    // N = 8,192 with prefix caching: frees the 4 checkpoint blocks and holds 4 + 1 + 4 = 9.
    assert!(check_rank(Role::Prefill, &m, Some("0.32.0")).is_ok());
    let t = transferred_tokens(&m, Tokens::new(8_192));
    let r = source_release(m.as_grouped().unwrap(), Tokens::ZERO, t, true);
    assert_eq!((r.kept(), r.freed()), (Blocks::new(9), Blocks::new(4)));
    let decode = load(GLM);
    assert!(check_pairing(&m, &decode).is_ok());
}

#[test]
fn gpt_oss_like_file() {
    let m = load(GPT_OSS);
    let g = m.as_grouped().unwrap();
    assert!(!m.is_mamba_type());
    assert_eq!(g.page_bytes(), Bytes::new(12 * 16 * 2 * 8 * 64 * 2));
    assert_eq!(g.groups()[1].kind(), CacheGroupKind::SlidingWindow);
    assert_eq!(g.groups()[1].window(), Some(Tokens::new(128)));
    // N = 1,024: (64 + 8) blocks × 393,216 = 28,311,552.
    assert_eq!(bytes(&m, 1_024), (64 + 8) * 393_216);
    assert_eq!(bytes(&m, 1_024), 28_311_552);
}

#[test]
fn mamba2_hybrid_like_file() {
    let m = load(MAMBA2);
    let g = m.as_grouped().unwrap();
    assert!(m.is_mamba_type());
    assert_eq!(g.groups().len(), 7);
    assert_eq!(g.full_attention_block_size(), Some(Tokens::new(16 * 33)));
    // Mamba2 layer state: conv (4 − 1) × (8,192 + 2 × 8 × 128) × 2 + ssm 128 × 64 × 128 × 2.
    let mamba_layer = 3 * (8_192 + 2 * 8 * 128) * 2 + 128 * 64 * 128 * 2;
    assert_eq!(mamba_layer, 2_158_592);
    assert_eq!(g.groups()[1].transfer_bytes_per_block(), Bytes::new(4 * mamba_layer));
    assert_eq!(g.page_bytes(), Bytes::new(4 * 528 * 4_096));
    // N = 1,000: 8,650,752 × cdiv(999, 528) + 6 × 8,634,368 = 69,107,712.
    assert_eq!(bytes(&m, 1_000), 8_650_752 * 2 + 6 * 8_634_368);
    assert_eq!(bytes(&m, 1_000), 69_107_712);
    // The Mamba2 mixer's one prefill checkpoint block per Mamba group: the
    // last prefill step holds 2 blocks in each of the 6, and frees 6.
    let checkpoints: Vec<u64> = g.groups().iter().map(|x| x.checkpoint_blocks().get()).collect();
    assert_eq!(checkpoints, [0, 1, 1, 1, 1, 1, 1]);
    let r = source_release(g, Tokens::ZERO, Tokens::new(999), true);
    assert_eq!((r.held(), r.freed()), (Blocks::new(2 + 6 * 2), Blocks::new(6)));
}

#[test]
fn llama_file_is_linear() {
    let m = load(LLAMA);
    // 32 layers × 2 (K, V) × (8 KV heads / TP 4) × 128 dims × 2 bytes.
    assert_eq!(m.as_linear().unwrap().kv_bytes_per_token(), Bytes::new(32 * 2 * (8 / 4) * 128 * 2));
    // Whole blocks of 16 tokens: cdiv(1,000, 16) = 63 blocks × 16 × 32,768.
    assert_eq!(bytes(&m, 1_000), 63 * 16 * 32_768);
    assert_eq!(bytes(&m, 1_000), 33_030_144);
    assert!(check_rank(Role::Decode, &m, None).is_ok());
}

#[test]
fn fragments_refuse_unknown_fields_and_kinds() {
    let typo = "[model]\nname = \"x\"\nkv_bytes_per_tokn = 1\n";
    let err = toml::from_str::<Fragment>(typo).err().expect("unknown field refused").to_string();
    assert!(err.contains("kv_bytes_per_tokn"), "{err}");
    let bad_group = GLM.replacen("prefix_cacheable = true", "prefix_cachable = true", 1);
    let err = toml::from_str::<Fragment>(&bad_group).err().expect("unknown field refused").to_string();
    assert!(err.contains("prefix_cachable"), "{err}");
    let bad_kind = GLM.replacen("kind = \"state\"", "kind = \"mamba\"", 1);
    let err = toml::from_str::<Fragment>(&bad_kind).err().expect("unknown kind refused").to_string();
    assert!(err.contains("mamba"), "{err}");
    // A group without its marker parses, and the gate names role and field.
    let no_marker = GLM.replacen("transfer_bytes_per_block = 22528      # 11 x 2,048\n", "", 1);
    let fragment: Fragment = toml::from_str(&no_marker).unwrap();
    let err = fragment.model.validate(Role::Decode).unwrap_err().to_string();
    assert_eq!(err, r#"decode rank: cache_groups[1] "tail ring": missing field transfer_bytes_per_block"#);
}
