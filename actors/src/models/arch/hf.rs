//! A [`ModelArch`] from a HuggingFace `config.json`.
//!
//! [`from_config_json`] reads the text of a model's `config.json` (the caller
//! reads the file; nothing here touches the network or the disk) and returns
//! its layer groups. It reads the keys each family really uses and ignores
//! every other key; a key it needs that is missing, or has the wrong type or
//! an impossible value, is an [`HfError`] naming that key.
//!
//! Families, by `model_type`:
//!
//! | `model_type` | mixers | feed-forward |
//! |---|---|---|
//! | `llama`, `mistral`, `qwen2`, `qwen3` | GQA attention | gated MLP (`intermediate_size`) |
//! | `gemma2`, `gemma3_text` | GQA, sliding and full | gated MLP |
//! | `mixtral` | GQA (`sliding_window` on every layer, if set) | MoE: `num_local_experts` of `intermediate_size` |
//! | `qwen3_moe` | GQA | MoE: `num_experts` of `moe_intermediate_size`; dense where `mlp_only_layers` / `decoder_sparse_step` say |
//! | `gpt_oss` | GQA, `layer_types` sliding / full | MoE: `num_local_experts` of `intermediate_size` |
//! | `nemotron_h` | `hybrid_override_pattern`: `M` Mamba2, `*` attention | `-` non-gated (squared-ReLU) MLP |
//! | `deepseek_v2`, `deepseek_v3` | MLA | dense below `first_k_dense_replace`, MoE with shared experts above |
//!
//! The shared rules:
//!
//! - Head dimension: `head_dim` where the config gives one (Qwen3, Gemma,
//!   gpt-oss), else `hidden_size / num_attention_heads` (Llama, Mistral),
//!   which must then divide. `num_key_value_heads` absent means MHA (as
//!   many KV heads as query heads), as in transformers.
//! - Sliding windows, as vLLM 0.33 assigns them: per layer from
//!   `layer_types` (`sliding_attention` / `full_attention`) where the
//!   config has the list, else by the family's rule: gpt-oss slides on even
//!   layers (`layer_idx % 2 == 0`, `gpt_oss.py`), Gemma 2 on even layers,
//!   Gemma 3 on all but every `sliding_window_pattern`-th (6); Mistral and
//!   Mixtral slide on every layer when `sliding_window` is set; Qwen2/3 only
//!   with `use_sliding_window: true` (transformers drops the window
//!   otherwise); Llama never without `layer_types`. A `sliding_window` of 0
//!   is no window (vLLM's rule). Layers are grouped by window, in order of
//!   their first layer.
//! - Weight bits: `torch_dtype` (or `dtype`) `bfloat16`, `float16` and
//!   `float32` all give 16 (vLLM's `dtype="auto"` serves a float32
//!   checkpoint in 16 bits), as does a config with neither key;
//!   `quantization_config.quant_method` `fp8` gives 8 (DeepSeek-V3),
//!   `mxfp4` gives experts 4 bits and leaves the rest (gpt-oss). Other
//!   quantization methods are refused rather than priced wrong.
//! - `tie_word_embeddings` absent takes the family's default (tied for
//!   Gemma, untied for the others).
//!
//! Left out: biases, norms, attention sinks, DeepSeek's multi-token
//! prediction layer (`num_nextn_predict_layers`, not part of the served
//! model unless speculative decoding uses it) and Nemotron-H MoE (`E`)
//! layers (refused). Worked numbers for every fixture in
//! `presets/models/` are in the integration tests (`tests/it/arch.rs`).
//!
//! ```
//! use actors::arch::hf::from_config_json;
//!
//! let arch = from_config_json(
//!     r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
//!         "num_attention_heads": 32, "num_key_value_heads": 8,
//!         "intermediate_size": 14336, "vocab_size": 128256,
//!         "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#,
//! )
//! .unwrap();
//! assert_eq!(arch.params().total(), 8_029_995_008);
//!
//! let err = from_config_json(r#"{"model_type": "llama", "hidden_size": 4096}"#).unwrap_err();
//! assert_eq!(err.field, "num_hidden_layers");
//! ```

use serde_json::{Map, Value};

use super::{AttentionLayers, MambaLayers, MlaLayers, MlpLayers, ModelArch};

/// A `config.json` (or a derivation from a [`ModelArch`]) refused: the key
/// that is missing or wrong, as the file spells it (nested keys joined with
/// dots, e.g. `quantization_config.quant_method`), and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct HfError {
    /// The key (or argument) refused.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl HfError {
    pub(crate) fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        HfError { field: field.into(), problem: problem.into() }
    }
}

/// The families [`from_config_json`] reads, for the error on any other.
const FAMILIES: &str = "llama, mistral, qwen2, qwen3, gemma2, gemma3_text, mixtral, qwen3_moe, gpt_oss, nemotron_h, deepseek_v2, deepseek_v3";

/// Parses the text of a HuggingFace `config.json` into the model's layer
/// groups. Unknown keys are ignored; a missing or wrong key the family
/// needs, an unknown `model_type`, or text that is not a JSON object is an
/// [`HfError`] naming the key (`config.json` for the text itself).
pub fn from_config_json(text: &str) -> Result<ModelArch, HfError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| HfError::new("config.json", format!("is not JSON: {e}")))?;
    let Value::Object(map) = &value else {
        return Err(HfError::new("config.json", "is not a JSON object"));
    };
    let c = Cfg { map, prefix: String::new() };
    let model_type = c.str("model_type")?;
    let arch = match model_type {
        "llama" | "mistral" | "qwen2" | "qwen3" | "gemma2" | "gemma3_text" | "mixtral" | "qwen3_moe" | "gpt_oss" => {
            decoder(&c, model_type)?
        }
        "nemotron_h" => nemotron_h(&c)?,
        "deepseek_v2" | "deepseek_v3" => deepseek(&c)?,
        other => {
            return Err(HfError::new("model_type", format!("{other:?} is not a family pdsim reads ({FAMILIES})")));
        }
    };
    // A config's own keys are checked as they are read; this catches what
    // only the whole can show (a parameter count past 64 bits).
    arch.check().map_err(|e| {
        let problem = if e.field.is_empty() { e.problem } else { format!("{}: {}", e.field, e.problem) };
        HfError::new("config.json", problem)
    })?;
    Ok(arch)
}

/// One JSON object of the config, with the path of its keys for errors.
struct Cfg<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
}

impl Cfg<'_> {
    fn field(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
    fn err(&self, key: &str, problem: impl Into<String>) -> HfError {
        HfError::new(self.field(key), problem)
    }
    /// The value of `key`, `None` when absent or `null`.
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }
    fn missing(&self, key: &str) -> HfError {
        self.err(key, "missing")
    }
    fn opt_u64(&self, key: &str) -> Result<Option<u64>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_u64().map(Some).ok_or_else(|| self.err(key, format!("expected a non-negative integer, found {v}")))
            }
        }
    }
    /// A positive integer, or `None` when absent.
    fn opt_pos_u64(&self, key: &str) -> Result<Option<u64>, HfError> {
        match self.opt_u64(key)? {
            Some(0) => Err(self.err(key, "must be greater than 0")),
            n => Ok(n),
        }
    }
    fn pos_u64(&self, key: &str) -> Result<u64, HfError> {
        self.opt_pos_u64(key)?.ok_or_else(|| self.missing(key))
    }
    fn opt_pos_u32(&self, key: &str) -> Result<Option<u32>, HfError> {
        self.opt_pos_u64(key)?
            .map(|n| u32::try_from(n).map_err(|_| self.err(key, format!("{n} does not fit in 32 bits"))))
            .transpose()
    }
    fn pos_u32(&self, key: &str) -> Result<u32, HfError> {
        self.opt_pos_u32(key)?.ok_or_else(|| self.missing(key))
    }
    /// A non-negative integer that fits in 32 bits, or `None` when absent.
    fn opt_u32(&self, key: &str) -> Result<Option<u32>, HfError> {
        self.opt_u64(key)?
            .map(|n| u32::try_from(n).map_err(|_| self.err(key, format!("{n} does not fit in 32 bits"))))
            .transpose()
    }
    fn opt_bool(&self, key: &str) -> Result<Option<bool>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.err(key, format!("expected true or false, found {v}"))),
        }
    }
    fn opt_str(&self, key: &str) -> Result<Option<&str>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.err(key, format!("expected a string, found {v}"))),
        }
    }
    fn str(&self, key: &str) -> Result<&str, HfError> {
        self.opt_str(key)?.ok_or_else(|| self.missing(key))
    }
    fn opt_array(&self, key: &str) -> Result<Option<&Vec<Value>>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| self.err(key, format!("expected a list, found {v}"))),
        }
    }
    fn opt_object(&self, key: &str) -> Result<Option<Cfg<'_>>, HfError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Cfg { map, prefix: format!("{}.", self.field(key)) })),
            Some(v) => Err(self.err(key, format!("expected an object, found {v}"))),
        }
    }
}

/// Bits of the weights as served, and of the MoE experts where they
/// differ: see the module's rules.
fn weight_bits(c: &Cfg) -> Result<(u32, Option<u32>), HfError> {
    let dtype = match c.opt_str("torch_dtype")? {
        Some(d) => Some(("torch_dtype", d)),
        None => c.opt_str("dtype")?.map(|d| ("dtype", d)),
    };
    let mut bits = 16;
    if let Some((key, d)) = dtype
        && !matches!(d, "bfloat16" | "float16" | "float32")
    {
        return Err(c.err(key, format!("{d:?} is not a dtype pdsim reads (bfloat16, float16, float32)")));
    }
    let mut expert_bits = None;
    if let Some(q) = c.opt_object("quantization_config")? {
        match q.str("quant_method")? {
            "fp8" => bits = 8,
            "mxfp4" => expert_bits = Some(4),
            other => {
                return Err(q.err("quant_method", format!("{other:?} is not a quantization pdsim reads (fp8, mxfp4)")));
            }
        }
    }
    Ok((bits, expert_bits))
}

/// The most layers a config may have: far above any model's (hundreds),
/// low enough that a per-layer walk is cheap.
const MAX_LAYERS: u32 = 1 << 16;

/// `num_hidden_layers`, at most [`MAX_LAYERS`].
fn layer_count(c: &Cfg) -> Result<u32, HfError> {
    let n = c.pos_u32("num_hidden_layers")?;
    if n > MAX_LAYERS {
        return Err(c.err("num_hidden_layers", format!("{n}: more than {MAX_LAYERS} layers")));
    }
    Ok(n)
}

/// `head_dim` if given, else `hidden_size / num_attention_heads`.
fn head_dim(c: &Cfg, keys: &[&str], hidden: u64, heads: u32) -> Result<u32, HfError> {
    for key in keys {
        if let Some(d) = c.opt_pos_u32(key)? {
            return Ok(d);
        }
    }
    if !hidden.is_multiple_of(u64::from(heads)) {
        return Err(c.err(
            keys[0],
            format!("missing, and hidden_size {hidden} is not a multiple of num_attention_heads {heads}"),
        ));
    }
    u32::try_from(hidden / u64::from(heads)).map_err(|_| c.err(keys[0], "hidden_size / num_attention_heads overflows"))
}

/// The sliding window of each of `layers` layers (`None`: full
/// attention), by the rules in the module's docs.
fn layer_windows(c: &Cfg, model_type: &str, layers: u32) -> Result<Vec<Option<u64>>, HfError> {
    // A window of 0 means none (vLLM `config/model.py`).
    let window = c.opt_u64("sliding_window")?.filter(|&w| w > 0);
    let n = layers as usize;
    if let Some(types) = c.opt_array("layer_types")? {
        if types.len() != n {
            return Err(c.err("layer_types", format!("has {} entries for num_hidden_layers {layers}", types.len())));
        }
        return types
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("full_attention") => Ok(None),
                Some("sliding_attention") => window
                    .map(Some)
                    .ok_or_else(|| c.err("sliding_window", "missing, and layer_types has sliding layers")),
                _ => Err(c.err(
                    "layer_types",
                    format!("entry {i} is {t}; pdsim reads \"full_attention\" and \"sliding_attention\""),
                )),
            })
            .collect();
    }
    let every = |w: Option<u64>| vec![w; n];
    let alternating = |slides: &dyn Fn(usize) -> bool| -> Result<Vec<Option<u64>>, HfError> {
        let w = window.ok_or_else(|| c.missing("sliding_window"))?;
        Ok((0..n).map(|i| slides(i).then_some(w)).collect())
    };
    match model_type {
        "mistral" | "mixtral" => Ok(every(window)),
        "qwen2" | "qwen3" | "qwen3_moe" => {
            Ok(every(if c.opt_bool("use_sliding_window")?.unwrap_or(false) { window } else { None }))
        }
        "gpt_oss" | "gemma2" => alternating(&|i| i % 2 == 0),
        "gemma3_text" => {
            let pattern = c.opt_pos_u64("sliding_window_pattern")?.unwrap_or(6) as usize;
            alternating(&|i| (i + 1) % pattern != 0)
        }
        _ => Ok(every(None)),
    }
}

/// One attention group per distinct window, in order of its first layer.
fn attention_groups(windows: &[Option<u64>], heads: u32, kv_heads: u32, head_dim: u32) -> Vec<AttentionLayers> {
    let mut groups: Vec<AttentionLayers> = Vec::new();
    for &w in windows {
        match groups.iter_mut().find(|g| g.window == w) {
            Some(g) => g.count += 1,
            None => groups.push(AttentionLayers { count: 1, heads, kv_heads, head_dim, window: w }),
        }
    }
    groups
}

/// Adds one block to the feed-forward group alike, or a new group.
fn push_mlp(mlp: &mut Vec<MlpLayers>, block: MlpLayers) {
    match mlp.iter_mut().find(|m| MlpLayers { count: m.count, ..block.clone() } == **m) {
        Some(m) => m.count += block.count,
        None => mlp.push(block),
    }
}

fn dense_mlp(intermediate: u64, gated: bool) -> MlpLayers {
    MlpLayers { count: 1, intermediate, experts: 0, active_experts: 0, shared_intermediate: 0, gated }
}

/// Decoder-only transformers with GQA attention: Llama, Mistral, Qwen2/3,
/// Gemma 2/3, Mixtral, Qwen3-MoE, gpt-oss.
fn decoder(c: &Cfg, model_type: &str) -> Result<ModelArch, HfError> {
    let hidden = c.pos_u64("hidden_size")?;
    let layers = layer_count(c)?;
    let heads = c.pos_u32("num_attention_heads")?;
    let kv_heads = c.opt_pos_u32("num_key_value_heads")?.unwrap_or(heads);
    let head_dim = head_dim(c, &["head_dim"], hidden, heads)?;
    let vocab = c.pos_u64("vocab_size")?;
    let windows = layer_windows(c, model_type, layers)?;
    let attention = attention_groups(&windows, heads, kv_heads, head_dim);
    let mut mlp = Vec::new();
    match model_type {
        "mixtral" | "gpt_oss" => {
            let experts = c.pos_u32("num_local_experts")?;
            let active = match c.opt_pos_u32("num_experts_per_tok")? {
                Some(k) => k,
                None if model_type == "gpt_oss" => c.pos_u32("experts_per_token")?,
                None => return Err(c.missing("num_experts_per_tok")),
            };
            check_active(c, "num_experts_per_tok", active, experts)?;
            let width = c.pos_u64("intermediate_size")?;
            push_mlp(
                &mut mlp,
                MlpLayers {
                    count: layers,
                    intermediate: width,
                    experts,
                    active_experts: active,
                    shared_intermediate: 0,
                    gated: true,
                },
            );
        }
        "qwen3_moe" => {
            let experts = c.opt_u32("num_experts")?.unwrap_or(0);
            let step = c.opt_pos_u64("decoder_sparse_step")?.unwrap_or(1);
            let dense_only = match c.opt_array("mlp_only_layers")? {
                None => Vec::new(),
                Some(list) => list
                    .iter()
                    .map(|v| {
                        v.as_u64().ok_or_else(|| c.err("mlp_only_layers", format!("entry {v} is not a layer index")))
                    })
                    .collect::<Result<Vec<u64>, _>>()?,
            };
            // Qwen3-MoE (`qwen3_moe.py`): layer i is sparse when it is not in
            // mlp_only_layers, there are experts, and (i + 1) % step == 0.
            for i in 0..u64::from(layers) {
                if !dense_only.contains(&i) && experts > 0 && (i + 1).is_multiple_of(step) {
                    let active = c.pos_u32("num_experts_per_tok")?;
                    check_active(c, "num_experts_per_tok", active, experts)?;
                    let width = c.pos_u64("moe_intermediate_size")?;
                    push_mlp(
                        &mut mlp,
                        MlpLayers {
                            count: 1,
                            intermediate: width,
                            experts,
                            active_experts: active,
                            shared_intermediate: 0,
                            gated: true,
                        },
                    );
                } else {
                    push_mlp(&mut mlp, dense_mlp(c.pos_u64("intermediate_size")?, true));
                }
            }
        }
        _ => {
            let width = c.pos_u64("intermediate_size")?;
            push_mlp(&mut mlp, MlpLayers { count: layers, ..dense_mlp(width, true) });
        }
    }
    let (weight_bits, expert_weight_bits) = weight_bits(c)?;
    let tied_default = model_type.starts_with("gemma");
    Ok(ModelArch {
        hidden_size: hidden,
        vocab_size: vocab,
        tie_word_embeddings: c.opt_bool("tie_word_embeddings")?.unwrap_or(tied_default),
        weight_bits,
        expert_weight_bits,
        max_position_embeddings: c.opt_pos_u64("max_position_embeddings")?,
        attention,
        mla: None,
        mamba: None,
        mlp,
    })
}

fn check_active(c: &Cfg, key: &str, active: u32, experts: u32) -> Result<(), HfError> {
    if active > experts {
        return Err(c.err(key, format!("{active} experts a token, of {experts}")));
    }
    Ok(())
}

/// Nemotron-H: a `hybrid_override_pattern` of one character a layer, `M`
/// a Mamba2 mixer, `*` attention, `-` a non-gated MLP (vLLM
/// `nemotron_h.py`: `up_proj`, `down_proj`, squared ReLU). Newer configs
/// give `layers_block_type` (`mamba`, `attention`, `mlp`, `moe`) instead.
fn nemotron_h(c: &Cfg) -> Result<ModelArch, HfError> {
    let pattern: Vec<char> = match c.opt_str("hybrid_override_pattern")? {
        Some(p) => p.chars().collect(),
        None => match c.opt_array("layers_block_type")? {
            Some(list) => list
                .iter()
                .map(|v| match v.as_str() {
                    Some("mamba") => Ok('M'),
                    Some("attention") => Ok('*'),
                    Some("mlp") => Ok('-'),
                    Some("moe") => Ok('E'),
                    _ => Err(c.err("layers_block_type", format!("entry {v} is not mamba, attention, mlp or moe"))),
                })
                .collect::<Result<_, _>>()?,
            None => return Err(c.missing("hybrid_override_pattern")),
        },
    };
    let key = "hybrid_override_pattern";
    if pattern.is_empty() {
        return Err(c.err(key, "is empty"));
    }
    if let Some(n) = c.opt_u64("num_hidden_layers")?
        && n != pattern.len() as u64
    {
        return Err(c.err(key, format!("has {} layers for num_hidden_layers {n}", pattern.len())));
    }
    let count = |ch: char| pattern.iter().filter(|&&p| p == ch).count() as u32;
    if let Some(bad) = pattern.iter().find(|p| !matches!(p, 'M' | '*' | '-')) {
        let why = if *bad == 'E' { "MoE layers (E) are not read" } else { "is not M, * or -" };
        return Err(c.err(key, format!("layer {:?} {why}", bad)));
    }
    let hidden = c.pos_u64("hidden_size")?;
    let vocab = c.pos_u64("vocab_size")?;
    let (attn, mamba_n, mlp_n) = (count('*'), count('M'), count('-'));
    let mut attention = Vec::new();
    if attn > 0 {
        let heads = c.pos_u32("num_attention_heads")?;
        let kv_heads = c.opt_pos_u32("num_key_value_heads")?.unwrap_or(heads);
        let head_dim = head_dim(c, &["head_dim", "attention_head_dim"], hidden, heads)?;
        attention.push(AttentionLayers { count: attn, heads, kv_heads, head_dim, window: None });
    }
    let mamba = if mamba_n > 0 {
        Some(MambaLayers {
            count: mamba_n,
            heads: c.pos_u32("mamba_num_heads")?,
            head_dim: c.pos_u32("mamba_head_dim")?,
            state_size: c.pos_u32("ssm_state_size")?,
            groups: c.pos_u32("n_groups")?,
            conv_kernel: c.pos_u32("conv_kernel")?,
        })
    } else {
        None
    };
    let mut mlp = Vec::new();
    if mlp_n > 0 {
        // `intermediate_size` is one width, or one per MLP layer (vLLM reads
        // a list by the MLP's index; a list of one applies to all).
        match c.get("intermediate_size") {
            Some(Value::Array(list)) if list.len() == 1 || list.len() == mlp_n as usize => {
                for i in 0..mlp_n as usize {
                    let v = &list[if list.len() == 1 { 0 } else { i }];
                    let w = v
                        .as_u64()
                        .filter(|&w| w > 0)
                        .ok_or_else(|| c.err("intermediate_size", format!("entry {v} is not a positive integer")))?;
                    push_mlp(&mut mlp, dense_mlp(w, false));
                }
            }
            Some(Value::Array(list)) => {
                return Err(c.err("intermediate_size", format!("has {} widths for {mlp_n} MLP layers", list.len())));
            }
            _ => push_mlp(&mut mlp, MlpLayers { count: mlp_n, ..dense_mlp(c.pos_u64("intermediate_size")?, false) }),
        }
    }
    let (weight_bits, expert_weight_bits) = weight_bits(c)?;
    Ok(ModelArch {
        hidden_size: hidden,
        vocab_size: vocab,
        tie_word_embeddings: c.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        weight_bits,
        expert_weight_bits,
        max_position_embeddings: c.opt_pos_u64("max_position_embeddings")?,
        attention,
        mla: None,
        mamba,
        mlp,
    })
}

/// DeepSeek V2/V3: MLA on every layer; a dense MLP on the first
/// `first_k_dense_replace` layers and on layers off the `moe_layer_freq`
/// stride, MoE (routed plus `n_shared_experts` shared experts of
/// `moe_intermediate_size`) on the others (vLLM `deepseek_v2.py`).
fn deepseek(c: &Cfg) -> Result<ModelArch, HfError> {
    let hidden = c.pos_u64("hidden_size")?;
    let layers = layer_count(c)?;
    let mla = MlaLayers {
        count: layers,
        heads: c.pos_u32("num_attention_heads")?,
        q_lora_rank: c.opt_pos_u32("q_lora_rank")?,
        kv_lora_rank: c.pos_u32("kv_lora_rank")?,
        qk_nope_head_dim: c.pos_u32("qk_nope_head_dim")?,
        qk_rope_head_dim: c.pos_u32("qk_rope_head_dim")?,
        v_head_dim: c.pos_u32("v_head_dim")?,
    };
    let first_dense = c.opt_u64("first_k_dense_replace")?.unwrap_or(0);
    let freq = c.opt_pos_u64("moe_layer_freq")?.unwrap_or(1);
    let experts = c.opt_u32("n_routed_experts")?.unwrap_or(0);
    let mut mlp = Vec::new();
    for i in 0..u64::from(layers) {
        if experts > 0 && i >= first_dense && i.is_multiple_of(freq) {
            let active = c.pos_u32("num_experts_per_tok")?;
            check_active(c, "num_experts_per_tok", active, experts)?;
            let width = c.pos_u64("moe_intermediate_size")?;
            let shared = u64::from(c.opt_u32("n_shared_experts")?.unwrap_or(0));
            push_mlp(
                &mut mlp,
                MlpLayers {
                    count: 1,
                    intermediate: width,
                    experts,
                    active_experts: active,
                    shared_intermediate: shared * width,
                    gated: true,
                },
            );
        } else {
            push_mlp(&mut mlp, dense_mlp(c.pos_u64("intermediate_size")?, true));
        }
    }
    let (weight_bits, expert_weight_bits) = weight_bits(c)?;
    Ok(ModelArch {
        hidden_size: hidden,
        vocab_size: c.pos_u64("vocab_size")?,
        tie_word_embeddings: c.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        weight_bits,
        expert_weight_bits,
        max_position_embeddings: c.opt_pos_u64("max_position_embeddings")?,
        attention: Vec::new(),
        mla: Some(mla),
        mamba: None,
        mlp,
    })
}

/// Refuses a config whose parameter count, times 32 bits, would overflow
/// the 64-bit sums of [`ModelArch::params`] and
/// [`ModelArch::weight_bytes_per_rank`]: an upper bound of that count by
/// the same formulas (a term or two more), in 128 bits. Every term is
/// non-negative, so no partial sum exceeds the total.
pub(crate) fn fits_in_64_bits(a: &ModelArch) -> Result<(), HfError> {
    let w = |n: u64| Sat(u128::from(n));
    let h = w(a.hidden_size);
    let mut total = w(2) * w(a.vocab_size) * h;
    for g in &a.attention {
        let (q, kv, d) = (w(g.heads.into()), w(g.kv_heads.into()), w(g.head_dim.into()));
        total = total + w(g.count.into()) * (w(2) * h * q * d + w(2) * h * kv * d);
    }
    if let Some(m) = &a.mla {
        let (n, q) = (w(m.heads.into()), w(m.q_lora_rank.unwrap_or(0).into()));
        let (nope, rope, v) = (w(m.qk_nope_head_dim.into()), w(m.qk_rope_head_dim.into()), w(m.v_head_dim.into()));
        let lora = w(m.kv_lora_rank.into());
        let per = h * q
            + q * n * (nope + rope)
            + h * n * (nope + rope)
            + h * (lora + rope)
            + lora * n * (nope + v)
            + n * v * h;
        total = total + w(m.count.into()) * per;
    }
    if let Some(m) = &a.mamba {
        let inner = w(m.heads.into()) * w(m.head_dim.into());
        let bc = w(2) * w(m.groups.into()) * w(m.state_size.into());
        let per = h * (w(2) * inner + bc + w(m.heads.into())) + (inner + bc) * w(m.conv_kernel.into()) + inner * h;
        total = total + w(m.count.into()) * per;
    }
    for f in &a.mlp {
        let experts = w(f.experts.into());
        let per = w(3) * h * (w(f.intermediate) + w(f.shared_intermediate)) * (w(1) + experts) + h * experts;
        total = total + w(f.count.into()) * per;
    }
    if (total * w(32)).0 > u128::from(u64::MAX) {
        return Err(HfError::new("config.json", format!("about {} parameters: too many to count in 64 bits", total.0)));
    }
    Ok(())
}

/// A count that saturates instead of overflowing (only compared against
/// a bound far below `u128::MAX`).
#[derive(Clone, Copy)]
struct Sat(u128);

impl std::ops::Add for Sat {
    type Output = Sat;
    fn add(self, o: Sat) -> Sat {
        Sat(self.0.saturating_add(o.0))
    }
}

impl std::ops::Mul for Sat {
    type Output = Sat;
    fn mul(self, o: Sat) -> Sat {
        Sat(self.0.saturating_mul(o.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_json_and_unknown_families_name_the_problem() {
        assert_eq!(from_config_json("{").unwrap_err().field, "config.json");
        assert_eq!(from_config_json("[1]").unwrap_err().field, "config.json");
        let e = from_config_json(r#"{"model_type": "bert"}"#).unwrap_err();
        assert_eq!(e.field, "model_type");
        assert!(e.problem.contains("\"bert\""), "{e}");
        assert_eq!(from_config_json(r#"{"hidden_size": 1}"#).unwrap_err().field, "model_type");
    }

    #[test]
    fn wrong_types_and_zeros_name_the_key() {
        let base = r#""model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 16, "vocab_size": 10"#;
        let e = from_config_json(&format!(r#"{{{base}, "hidden_size": "big"}}"#)).unwrap_err();
        assert_eq!(e.field, "hidden_size");
        let e = from_config_json(&format!(r#"{{{base}, "hidden_size": 0}}"#)).unwrap_err();
        assert_eq!((e.field.as_str(), e.problem.as_str()), ("hidden_size", "must be greater than 0"));
        // 10 / 4 does not divide: the head dimension must be given.
        let e = from_config_json(&format!(r#"{{{base}, "hidden_size": 10}}"#)).unwrap_err();
        assert_eq!(e.field, "head_dim");
        let e = from_config_json(&format!(r#"{{{base}, "hidden_size": 8, "torch_dtype": "int4"}}"#)).unwrap_err();
        assert_eq!(e.field, "torch_dtype");
        let e = from_config_json(&format!(
            r#"{{{base}, "hidden_size": 8, "quantization_config": {{"quant_method": "gptq"}}}}"#
        ))
        .unwrap_err();
        assert_eq!(e.field, "quantization_config.quant_method");
        let e = from_config_json(&format!(r#"{{{base}, "hidden_size": 8, "quantization_config": {{}}}}"#)).unwrap_err();
        assert_eq!((e.field.as_str(), e.problem.as_str()), ("quantization_config.quant_method", "missing"));
    }

    #[test]
    fn absurd_sizes_are_refused_not_overflowed() {
        let e = from_config_json(
            r#"{"model_type": "mixtral", "hidden_size": 4294967295, "num_hidden_layers": 4000000000,
                "num_attention_heads": 1, "num_key_value_heads": 1, "intermediate_size": 18446744073709551615,
                "vocab_size": 18446744073709551615, "num_local_experts": 4000000000, "num_experts_per_tok": 1}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "num_hidden_layers");
        let e = from_config_json(
            r#"{"model_type": "mixtral", "hidden_size": 4294967295, "num_hidden_layers": 60000,
                "num_attention_heads": 1, "num_key_value_heads": 1, "intermediate_size": 18446744073709551615,
                "vocab_size": 18446744073709551615, "num_local_experts": 4000000000, "num_experts_per_tok": 1}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "config.json");
    }

    #[test]
    fn layer_types_and_family_rules_give_the_windows() {
        // Gemma 3: every sixth layer is full, the rest slide.
        let arch = from_config_json(
            r#"{"model_type": "gemma3_text", "hidden_size": 8, "num_hidden_layers": 12,
                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
                "intermediate_size": 16, "vocab_size": 10, "sliding_window": 512}"#,
        )
        .unwrap();
        let counts: Vec<_> = arch.attention.iter().map(|a| (a.count, a.window)).collect();
        assert_eq!(counts, vec![(10, Some(512)), (2, None)]);
        assert!(arch.tie_word_embeddings);
        // layer_types must cover every layer, with known entries.
        let e = from_config_json(
            r#"{"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
                "intermediate_size": 16, "vocab_size": 10, "layer_types": ["full_attention"]}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "layer_types");
        let e = from_config_json(
            r#"{"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                "intermediate_size": 16, "vocab_size": 10, "layer_types": ["sliding_attention"]}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "sliding_window");
        // Qwen: the window counts only with use_sliding_window.
        let qwen = |use_sw: bool| {
            from_config_json(&format!(
                r#"{{"model_type": "qwen2", "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
                    "intermediate_size": 16, "vocab_size": 10, "sliding_window": 4096,
                    "use_sliding_window": {use_sw}}}"#
            ))
            .unwrap()
            .attention[0]
                .window
        };
        assert_eq!((qwen(false), qwen(true)), (None, Some(4096)));
    }

    #[test]
    fn nemotron_h_refuses_what_it_does_not_read() {
        let base = r#""model_type": "nemotron_h", "hidden_size": 8, "vocab_size": 10, "num_attention_heads": 2,
            "mamba_num_heads": 2, "mamba_head_dim": 4, "ssm_state_size": 4, "n_groups": 1, "conv_kernel": 4,
            "intermediate_size": 16"#;
        let e = from_config_json(&format!(r#"{{{base}, "hybrid_override_pattern": "M*E"}}"#)).unwrap_err();
        assert_eq!(e.field, "hybrid_override_pattern");
        assert!(e.problem.contains("MoE"), "{e}");
        let e = from_config_json(&format!(r#"{{{base}, "hybrid_override_pattern": "M*-", "num_hidden_layers": 4}}"#))
            .unwrap_err();
        assert_eq!(e.field, "hybrid_override_pattern");
        let arch =
            from_config_json(&format!(r#"{{{base}, "layers_block_type": ["mamba", "attention", "mlp"]}}"#)).unwrap();
        assert_eq!(arch.mixer_layers(), 2);
        assert!(!arch.mlp[0].gated);
    }
}
