//! The GPU a rank runs on: what the roofline step-time model
//! ([`crate::models::steptime::roofline`]) and KV capacity from GPU memory need.
//!
//! A scenario names a preset (`[hardware] gpu = "h200"`; the harness keeps
//! the table, with each number's source) or gives the numbers; any number
//! given overrides the preset's.

use serde::{Deserialize, Serialize};

use crate::base::field::FieldError;

/// A deployment's GPU as a scenario gives it: a preset's name and/or the
/// numbers. Every number is needed once a model uses it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareSpec {
    /// The preset the numbers came from (informational once resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// Dense bf16 tensor-core throughput, 10¹² FLOP/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bf16_tflops: Option<f64>,
    /// Dense fp8 tensor-core throughput, 10¹² FLOP/s (absent: no fp8
    /// tensor cores; fp8 weights then run at the bf16 rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_tflops: Option<f64>,
    /// HBM bandwidth, 10¹² bytes/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hbm_tb_s: Option<f64>,
    /// Device memory as the driver reports it, GiB (2³⁰ bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<f64>,
    /// NVLink bandwidth one way per GPU, 10⁹ bytes/s (half the
    /// bidirectional figure datasheets quote).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_gb_s: Option<f64>,
}

/// A checked GPU: every number present, finite and positive.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpu {
    name: String,
    bf16_flops: f64,
    fp8_flops: Option<f64>,
    hbm_bytes_s: f64,
    memory_bytes: f64,
    nvlink_bytes_s: f64,
}

fn positive(v: Option<f64>, field: &str) -> Result<f64, FieldError> {
    match v {
        None => Err(FieldError::new(field, "missing: name a preset (`gpu = \"h200\"`) or give the number")),
        Some(x) if x.is_finite() && x > 0.0 => Ok(x),
        Some(x) => Err(FieldError::new(field, format!("must be a finite number > 0, got {x}"))),
    }
}

impl HardwareSpec {
    /// The checked GPU, or the first field missing or wrong (relative to
    /// `hardware`).
    pub fn resolve(&self) -> Result<Gpu, FieldError> {
        let fp8 = match self.fp8_tflops {
            None => None,
            v => Some(positive(v, "fp8_tflops")? * 1e12),
        };
        Ok(Gpu {
            name: self.gpu.clone().unwrap_or_else(|| "custom".to_owned()),
            bf16_flops: positive(self.bf16_tflops, "bf16_tflops")? * 1e12,
            fp8_flops: fp8,
            hbm_bytes_s: positive(self.hbm_tb_s, "hbm_tb_s")? * 1e12,
            memory_bytes: positive(self.memory_gib, "memory_gib")? * f64::from(1u32 << 30),
            nvlink_bytes_s: positive(self.nvlink_gb_s, "nvlink_gb_s")? * 1e9,
        })
    }

    /// Fills every number this spec lacks from `preset` (the numbers given
    /// win).
    pub fn fill_from(&mut self, preset: &HardwareSpec) {
        let fill = |mine: &mut Option<f64>, theirs: Option<f64>| {
            if mine.is_none() {
                *mine = theirs;
            }
        };
        fill(&mut self.bf16_tflops, preset.bf16_tflops);
        fill(&mut self.fp8_tflops, preset.fp8_tflops);
        fill(&mut self.hbm_tb_s, preset.hbm_tb_s);
        fill(&mut self.memory_gib, preset.memory_gib);
        fill(&mut self.nvlink_gb_s, preset.nvlink_gb_s);
    }
}

impl Gpu {
    /// The preset's name, or `custom`.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Dense tensor-core FLOP/s for weights of `bits` (8: fp8 when the GPU
    /// has it; anything else: bf16).
    pub fn flops(&self, bits: u32) -> f64 {
        match (bits, self.fp8_flops) {
            (8, Some(f)) => f,
            _ => self.bf16_flops,
        }
    }
    /// Dense bf16 FLOP/s.
    pub fn bf16_flops(&self) -> f64 {
        self.bf16_flops
    }
    /// HBM bytes/s.
    pub fn hbm_bytes_s(&self) -> f64 {
        self.hbm_bytes_s
    }
    /// Device memory, bytes.
    pub fn memory_bytes(&self) -> f64 {
        self.memory_bytes
    }
    /// NVLink bytes/s one way.
    pub fn nvlink_bytes_s(&self) -> f64 {
        self.nvlink_bytes_s
    }
}
