//! The presets a scenario can name, built into the binary: GPUs
//! (`presets/gpus.toml`, `[hardware] gpu = "h200"`) and models
//! (`presets/models/<id>.json`, HuggingFace `config.json` files,
//! `[model] preset = "llama-3.1-8b"`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use actors::hardware::HardwareSpec;

const GPUS: &str = include_str!("../presets/gpus.toml");

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
