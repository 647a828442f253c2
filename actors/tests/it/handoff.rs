//! The handoff payload against vLLM 0.33.0's own NIXL pull path, on the
//! recorded queries of `conformance/handoff/` (`models.json`: the shipped
//! fragments and seeded random models; `answers.jsonl`: for each query
//! (model, N, K) the blocks vLLM's decode worker reads per group and
//! whether the handoff was a notification only; recorded by
//! `conformance/handoff.sh`).
//!
//! Every query must agree: `rules::payload` moves the same blocks in every
//! group (a linear model: the same blocks of its one group), and says a
//! full decode hit exactly when vLLM moves nothing.

use std::path::{Path, PathBuf};

use actors::model::{CacheGroupSpec, Model, ModelSpec, Role};
use actors::rules::{Payload, payload};
use actors::units::{Bytes, Tokens};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/handoff")
}

fn model(m: &Value) -> Model {
    let name = m["name"].as_str().unwrap().to_owned();
    if let Some(lin) = m.get("linear") {
        let spec = ModelSpec {
            name: Some(name),
            kv_bytes_per_token: Some(Bytes::new(lin["kv_bytes_per_token"].as_u64().unwrap())),
            ..Default::default()
        };
        let b = Tokens::new(lin["block_size"].as_u64().unwrap());
        return spec.validate(Role::Decode).unwrap().with_block_size(b);
    }
    let groups: Vec<CacheGroupSpec> = serde_json::from_value(m["groups"].clone()).unwrap();
    ModelSpec { name: Some(name), cache_groups: groups, ..Default::default() }.validate(Role::Decode).unwrap()
}

#[test]
fn payloads_match_vllm_on_the_recorded_queries() {
    let models: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir().join("models.json")).unwrap()).unwrap();
    let models: Vec<(String, Model)> =
        models.iter().map(|m| (m["name"].as_str().unwrap().to_owned(), model(m))).collect();
    let answers = std::fs::read_to_string(dir().join("answers.jsonl")).unwrap();
    let mut count = 0;
    let mut kinds = [0usize; 3]; // linear, grouped with a hit, full hits
    let mut wrong = Vec::new();
    for line in answers.lines().filter(|l| !l.trim().is_empty()) {
        let a: Value = serde_json::from_str(line).unwrap();
        let (name, m) = &models[a["model"].as_u64().unwrap() as usize];
        let (n, k) = (a["n"].as_u64().unwrap(), a["k"].as_u64().unwrap());
        let theirs: Vec<u64> = a["blocks"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect();
        let full_hit = a["full_hit"].as_bool().unwrap();
        let p = payload(m, Tokens::new(n), Tokens::new(k)).unwrap();
        let (ours, our_full_hit) = match &p {
            Payload::Tokens(t) => {
                kinds[0] += 1;
                (vec![t.blocks().get()], false)
            }
            Payload::Blocks(b) => {
                kinds[1] += usize::from(!b.hit_tokens().is_zero());
                (b.groups().iter().map(|g| g.blocks().get()).collect(), b.full_decode_hit())
            }
        };
        kinds[2] += usize::from(full_hit);
        if (ours.as_slice(), our_full_hit) != (theirs.as_slice(), full_hit) {
            wrong.push(format!(
                "{name} N={n} K={k}: pdsim {ours:?} (full hit {our_full_hit}), vLLM {theirs:?} ({full_hit})"
            ));
        }
        count += 1;
    }
    // The recording covers what it should: many queries, linear models,
    // hits, and notification-only handoffs.
    assert!(count >= 10_000, "{count} recorded queries");
    assert!(kinds.iter().all(|&k| k >= 50), "linear, hit, full-hit queries: {kinds:?}");
    assert!(wrong.is_empty(), "{} of {count} disagree:\n{}", wrong.len(), wrong.join("\n"));
}
