//! The end-to-end benchmark's runs, pinned: their digests (every request's
//! outcome, counts and times) must not move unless a rule changes on
//! purpose, so the benchmark compares like with like across a change.

#[path = "../../../benches/common/mod.rs"]
mod common;

use actors::sim::{self, Deployment};

/// (case, digest of its 10,000 requests).
const PINNED: [(&str, u64); 3] = [
    ("llama8b_aggregated", 0xa264_946d_7698_a16d),
    ("llama8b_1p1d", 0xd7ca_a093_1971_c354),
    ("glm_hybrid_1p1d", 0x75f2_a8d7_a52b_9e5f),
];

#[test]
fn benchmark_runs_give_their_pinned_digests() {
    let mut got = Vec::new();
    for ((name, model, spec), (pinned_name, _)) in common::cases().into_iter().zip(PINNED) {
        assert_eq!(name, pinned_name);
        let dep = Deployment::build(&model, &spec).unwrap();
        let out = sim::run(&dep, common::workload()).unwrap();
        assert_eq!(out.violations, Vec::<String>::new(), "{name}");
        assert_eq!(out.summary.completed, common::REQUESTS, "{name}");
        got.push((name, out.digest));
    }
    let want: Vec<(&str, u64)> = PINNED.to_vec();
    assert_eq!(got, want, "digests changed; if on purpose, pin the new ones");
}
