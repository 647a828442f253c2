//! The P/D serving domain of pdsim, on the `sim-core` engine.
//!
//! # Layers
//!
//! The crate is cut into layers, each a folder that imports only from the
//! layers below it (`tests/it/layers.rs` fails on an import that points
//! up):
//!
//! 0. `base`: units, cache keys, the field error.
//! 1. `models`: the model's layers and cache groups, TP, the GPU, step times.
//! 2. `requests`: a request and the streams of them.
//! 3. `stats`: instruments fed as things happen, and the summaries made of them.
//! 4. `vllm`: vLLM's rules, one named place each.
//! 5. `kv`: the KV block pool with its prefix cache.
//! 6. [`scheduler`]: one rank's vLLM-like scheduler over its pool.
//! 7. `serving`: the actors (router, ranks, links) and their messages.
//! 8. `deploy`: a deployment as data, its checks, the wiring and the run.
//!
//! # The API
//!
//! The public modules below are the crate's API, re-exported from the
//! layers: what a deployment is ([`config`], [`model`], [`units`]), what it
//! runs ([`workload`]), how to run it ([`sim`]), what comes out
//! ([`metrics`], [`bench`](mod@bench), [`records`], [`request`]), and the
//! pieces a caller may use on their own or plug in: the handoff's
//! [`rules`], [`tp`], [`arch`], [`hardware`], [`steptime`], [`router`]'s
//! policies, [`scheduler`]'s batching policies, [`steps`] (one rank's
//! scheduler on a small case) and [`validate`].
#![warn(missing_docs, unreachable_pub)]

mod base;
mod deploy;
mod kv;
mod models;
mod requests;
pub mod scheduler;
mod serving;
mod stats;
mod vllm;

pub use base::units;
pub use deploy::{config, sim, steps, validate};
pub use models::{arch, hardware, model, steptime, tp};
pub use requests::{request, workload};
pub use serving::router;
pub use stats::{bench, records, sketch};

/// A run's statistics: its summary, the instruments it is made of, and
/// the exact timelines of its ranks and links.
pub mod metrics {
    pub use crate::stats::bench::{Bench, Load, TokenWindows};
    pub use crate::stats::histogram::{Column, Histogram, Stat};
    pub use crate::stats::slo::{SloSpec, meets_slo};
    pub use crate::stats::summary::{Summary, SummaryBuilder, summarise};
    pub use crate::stats::timeline::{EntitySample, Metric, Sample, SampleLog, Timeline};
}

/// The grouped transfer rules of vLLM's NIXL connector: what each cache
/// group holds and moves, the payload of one handoff and the source
/// release at prefill completion.
pub mod rules {
    pub use crate::vllm::blocks::{STATE_BLOCKS, blocks_for_step, blocks_held, full_attention_blocks};
    pub use crate::vllm::handoff::*;
    pub use crate::vllm::window::{in_window_blocks, prefill_clip_blocks, skipped_blocks};
}

/// vLLM's scheduler options pdsim does not model, with vLLM's defaults
/// (what pdsim runs) and why.
pub use vllm::options;
