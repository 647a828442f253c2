//! Scenarios on named presets: models derived from a HuggingFace
//! config.json, GPUs from the preset table, KV capacity from GPU memory,
//! and the errors that name the field when one is wrong or missing.

use pdsim::scenario;

use crate::common::{outcome, pdsim, scratch, scratch_dir};

/// An aggregated Llama-3.1-8B rank on an H200 with `model` as the
/// `[model]` body, `hardware` as the `[hardware]` body and `role` as extra
/// lines of `[aggregated]`.
fn on_presets(model: &str, hardware: &str, role: &str) -> String {
    format!(
        "name = \"presets\"\n\n[model]\n{model}\n\n[hardware]\n{hardware}\n\n[aggregated]\n{role}\n\
         step_time = {{ kind = \"roofline\" }}\n\n[workload]\nrequests = 20\n\
         arrival = {{ kind = \"poisson\", rate_per_s = 4.0 }}\n\
         prompt_tokens = {{ kind = \"fixed\", value = 1000 }}\noutput_tokens = {{ kind = \"fixed\", value = 20 }}\n"
    )
}

fn refused(name: &str, text: &str) -> String {
    let path = scratch(name, text);
    scenario::load(&path).unwrap_err().to_string()
}

#[test]
fn a_preset_model_on_a_preset_gpu_sizes_its_own_pool() {
    let path = scratch("presets-ok.toml", &on_presets("preset = \"llama-3.1-8b\"", "gpu = \"h200\"", "tp = 1"));
    let s = scenario::load(&path).unwrap();
    assert_eq!(s.model_origin(), Some("preset llama-3.1-8b"));
    // 32 layers × 2 × 8 KV heads × 128 × 2 bytes, at TP 1.
    assert_eq!(s.model_spec().kv_bytes_per_token.map(|b| b.get()), Some(131_072));
    let hw = s.deployment().hardware.as_ref().unwrap();
    assert_eq!((hw.hbm_tb_s, hw.memory_gib), (Some(4.8), Some(140.4)));
    // actors::arch::memory's worked number: 56,127 blocks of 16 tokens.
    let dep = actors::sim::Deployment::build(s.model_spec(), s.deployment()).unwrap();
    assert_eq!(dep.num_blocks(actors::model::Role::Aggregated), Some(56_127));

    let dir = scratch_dir("presets-run");
    let out = pdsim(&["run", path.to_str().unwrap(), "--no-trace", "--no-timeline", "--out", dir.to_str().unwrap()]);
    let (code, stdout, stderr) = outcome(&out);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("setup        model preset llama-3.1-8b, GPU preset h200"), "{stdout}");
    assert!(stdout.contains("20 entered, 20 completed, 0 failed"), "{stdout}");
}

#[test]
fn a_number_given_beside_a_gpu_preset_wins() {
    let path = scratch(
        "presets-override.toml",
        &on_presets("preset = \"llama-3.1-8b\"", "gpu = \"h200\"\nmemory_gib = 80.0", "tp = 1"),
    );
    let s = scenario::load(&path).unwrap();
    assert_eq!(s.deployment().hardware.as_ref().unwrap().memory_gib, Some(80.0));
}

#[test]
fn a_config_file_is_read_relative_to_the_scenario() {
    let config = std::fs::read_to_string(crate::common::root().join("presets/models/qwen3-8b.json")).unwrap();
    scratch("qwen3-8b-config.json", &config);
    let path = scratch(
        "presets-config.toml",
        &on_presets("config = \"qwen3-8b-config.json\"", "gpu = \"h100-sxm\"", "tp = 2"),
    );
    let s = scenario::load(&path).unwrap();
    assert!(s.model_origin().unwrap().starts_with("config "), "{:?}", s.model_origin());
    // Qwen3-8B: 36 layers × 2 × (8 KV heads / TP 2) × 128 × 2 bytes = 73,728.
    assert_eq!(s.model_spec().kv_bytes_per_token.map(|b| b.get()), Some(73_728));
}

#[test]
fn wrong_or_missing_presets_name_their_field() {
    let e = refused("presets-bad-model.toml", &on_presets("preset = \"llama-9\"", "gpu = \"h200\"", "tp = 1"));
    assert!(e.contains("model.preset: unknown model preset \"llama-9\" (known: codellama-34b, deepseek-v3,"), "{e}");
    let e = refused("presets-bad-gpu.toml", &on_presets("preset = \"llama-3.1-8b\"", "gpu = \"h900\"", "tp = 1"));
    assert!(e.contains("hardware.gpu: unknown GPU preset \"h900\" (known: a100-80gb, b200, h100-sxm, h200)"), "{e}");
    let e = refused(
        "presets-both.toml",
        &on_presets("preset = \"llama-3.1-8b\"\nconfig = \"x.json\"", "gpu = \"h200\"", "tp = 1"),
    );
    assert!(e.contains("model.config: give `preset` or `config`, not both"), "{e}");
    let e = refused("presets-no-file.toml", &on_presets("config = \"nowhere.json\"", "gpu = \"h200\"", "tp = 1"));
    assert!(e.contains("model.config:"), "{e}");
    let e = refused(
        "presets-dtype.toml",
        &on_presets("preset = \"llama-3.1-8b\"\nkv_cache_dtype = \"int3\"", "gpu = \"h200\"", "tp = 1"),
    );
    assert!(e.contains("model.kv_cache_dtype: unknown cache dtype \"int3\""), "{e}");
    // No GPU: neither a roofline nor a pool sized from memory can be built.
    let text = on_presets("preset = \"llama-3.1-8b\"", "", "tp = 1").replace("[hardware]\n", "");
    let e = refused("presets-no-gpu.toml", &text);
    assert!(e.contains("aggregated.num_blocks: missing: give the pool's blocks"), "{e}");
    let text = text.replace("tp = 1", "tp = 1\nnum_blocks = 1000");
    let e = refused("presets-no-gpu-roofline.toml", &text);
    assert!(e.contains("aggregated.step_time.kind: a roofline needs the GPU"), "{e}");
    // A model too big for the GPU's memory says where the memory went.
    let e = refused("presets-too-big.toml", &on_presets("preset = \"deepseek-v3\"", "gpu = \"h200\"", "tp = 1"));
    assert!(e.contains("aggregated.num_blocks: the GPU's memory leaves no KV cache"), "{e}");
}

#[test]
fn an_fp8_cache_halves_the_bytes() {
    let path = scratch(
        "presets-fp8.toml",
        &on_presets("preset = \"llama-3.1-8b\"\nkv_cache_dtype = \"fp8\"", "gpu = \"h200\"", "tp = 1"),
    );
    let s = scenario::load(&path).unwrap();
    assert_eq!(s.model_spec().kv_bytes_per_token.map(|b| b.get()), Some(65_536));
}

#[test]
fn a_hand_written_arch_is_checked_like_a_config() {
    // A model given whole, with its layers: a zero context limit would make
    // every prompt fail, so it is refused where it is written.
    let text = "[model]\nkv_bytes_per_token = 131072\n\n[model.arch]\nhidden_size = 4096\nvocab_size = 128256\n\
                max_position_embeddings = 0\n[[model.arch.attention]]\ncount = 32\nheads = 32\nkv_heads = 8\n\
                head_dim = 128\n[[model.arch.mlp]]\ncount = 32\nintermediate = 14336\n\n[aggregated]\n\
                num_blocks = 1000\nstep_time = { kind = \"linear\", fixed_us = 1000 }\n\n[workload]\nrequests = 1\n\
                arrival = { kind = \"poisson\", rate_per_s = 1.0 }\nprompt_tokens = { kind = \"fixed\", value = 10 }\n\
                output_tokens = { kind = \"fixed\", value = 1 }\n";
    let e = refused("presets-arch-zero.toml", text);
    assert!(e.contains("model.arch.max_position_embeddings: must be at least 1"), "{e}");
    let e = refused("presets-arch-bits.toml", &text.replace("max_position_embeddings = 0", "weight_bits = 0"));
    assert!(e.contains("model.arch.weight_bits: must be 4, 8, 16 or 32"), "{e}");
    let huge = text
        .replace("max_position_embeddings = 0", "")
        .replace("hidden_size = 4096", "hidden_size = 9223372036854775807");
    let e = refused("presets-arch-huge.toml", &huge);
    assert!(e.contains("model.arch: about") && e.contains("too many to count in 64 bits"), "{e}");
}

#[test]
fn roles_at_tp_sizes_vllm_lays_out_differently_are_refused() {
    // Nemotron-H-8B: at TP 1 its attention blocks are 528 tokens (the Mamba
    // state of 2,158,592 bytes over 4,096 bytes a token, in steps of 16);
    // at TP 16 the state shrinks and vLLM picks 272. One layout cannot be
    // both.
    let pd = |decode_tp: u32| {
        format!(
            "[model]\npreset = \"nemotron-h-8b\"\n[hardware]\ngpu = \"h200\"\n[prefill]\ntp = 1\n\
             step_time = {{ kind = \"roofline\" }}\n[decode]\ntp = {decode_tp}\nstep_time = {{ kind = \"roofline\" }}\n\
             [workload]\nrequests = 5\narrival = {{ kind = \"poisson\", rate_per_s = 5.0 }}\n\
             prompt_tokens = {{ kind = \"fixed\", value = 1000 }}\noutput_tokens = {{ kind = \"fixed\", value = 5 }}\n"
        )
    };
    let e = refused("presets-tp16.toml", &pd(16));
    assert!(e.contains("decode.tp: nemotron-h-8b at tp 16 is laid out differently from tp 1"), "{e}");
    // Llama's layout scales with its KV heads: TP 1 prefill, TP 8 decode is fine.
    let llama = pd(8).replace("nemotron-h-8b", "llama-3.1-8b");
    assert!(scenario::load(scratch("presets-llama-1-8.toml", &llama)).is_ok());
}

#[test]
fn calibrate_refuses_times_no_model_can_hold_and_prices_huge_batches_at_once() {
    let csv = scratch("calibrate-huge.csv", "batch,context,ms\n1,512,1e308\n");
    let (code, _, stderr) = outcome(&pdsim(&["calibrate", csv.to_str().unwrap()]));
    assert_eq!(code, 2);
    assert!(stderr.contains("calibrate-huge.csv:2: column ms: must be a time from 1 ns to 10^9 µs"), "{stderr}");
    // Ten million sequences a row are summed in closed form, not one by one.
    let rows: String = (0..2000).map(|i| format!("10000000,{},5.0\n", 512 + i)).collect();
    let csv = scratch("calibrate-wide.csv", &format!("batch,context,ms\n{rows}"));
    let (code, _, stderr) = outcome(&pdsim(&["calibrate", csv.to_str().unwrap(), "--kind", "linear"]));
    assert_eq!(code, 0, "{stderr}");
}
