//! The presets a scenario can name, built into the binary: GPUs
//! (`presets/gpus.toml`, `[hardware] gpu = "h200"`) and models
//! (`presets/models/<id>.json`, HuggingFace `config.json` files,
//! `[model] preset = "llama-3.1-8b"`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use actors::hardware::HardwareSpec;

const GPUS: &str = include_str!("../presets/gpus.toml");

/// (id, config.json text) of every model preset.
const MODELS: &[(&str, &str)] = &[
    ("codellama-34b", include_str!("../presets/models/codellama-34b.json")),
    ("deepseek-v3", include_str!("../presets/models/deepseek-v3.json")),
    ("gpt-oss-20b", include_str!("../presets/models/gpt-oss-20b.json")),
    ("llama-2-70b", include_str!("../presets/models/llama-2-70b.json")),
    ("llama-2-7b", include_str!("../presets/models/llama-2-7b.json")),
    ("llama-3.1-70b", include_str!("../presets/models/llama-3.1-70b.json")),
    ("llama-3.1-8b", include_str!("../presets/models/llama-3.1-8b.json")),
    ("mistral-7b-v0.3", include_str!("../presets/models/mistral-7b-v0.3.json")),
    ("mixtral-8x7b", include_str!("../presets/models/mixtral-8x7b.json")),
    ("nemotron-h-8b", include_str!("../presets/models/nemotron-h-8b.json")),
    ("qwen3-30b-a3b", include_str!("../presets/models/qwen3-30b-a3b.json")),
    ("qwen3-32b", include_str!("../presets/models/qwen3-32b.json")),
    ("qwen3-8b", include_str!("../presets/models/qwen3-8b.json")),
];

/// The `config.json` of model preset `id`, or `None`.
pub fn model_config(id: &str) -> Option<&'static str> {
    MODELS.iter().find(|(m, _)| *m == id).map(|(_, text)| *text)
}

/// The model presets' ids, sorted.
pub fn model_ids() -> Vec<&'static str> {
    MODELS.iter().map(|(id, _)| *id).collect()
}

fn gpus() -> &'static BTreeMap<String, HardwareSpec> {
    static TABLE: OnceLock<BTreeMap<String, HardwareSpec>> = OnceLock::new();
    TABLE.get_or_init(|| toml::from_str(GPUS).expect("presets/gpus.toml is a table of [hardware] tables"))
}

/// The numbers of GPU preset `id`, or `None`.
pub fn gpu(id: &str) -> Option<HardwareSpec> {
    let mut spec = gpus().get(id)?.clone();
    spec.gpu = Some(id.to_owned());
    Some(spec)
}

/// The GPU presets' ids, sorted.
pub fn gpu_ids() -> Vec<&'static str> {
    gpus().keys().map(String::as_str).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_preset_parses() {
        let ids = model_ids();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted);
        for id in ids {
            actors::arch::hf::from_config_json(model_config(id).unwrap()).unwrap();
        }
    }

    #[test]
    fn every_gpu_preset_resolves() {
        assert_eq!(gpu_ids(), ["a100-80gb", "b200", "h100-sxm", "h200"]);
        for id in gpu_ids() {
            let g = gpu(id).unwrap().resolve().unwrap();
            assert_eq!(g.name(), id);
        }
        // The A100 has no fp8 tensor cores: fp8 weights run at the bf16 rate.
        let a100 = gpu("a100-80gb").unwrap().resolve().unwrap();
        assert_eq!(a100.flops(8), a100.flops(16));
        let h200 = gpu("h200").unwrap().resolve().unwrap();
        assert_eq!(h200.flops(8), 1978.9e12);
        assert_eq!(h200.hbm_bytes_s(), 4.8e12);
    }
}
