//! `pdsim steps`: one JSON line per schedule call, and bad cases refused
//! with the file and the field.

use serde_json::Value;

use crate::common::{outcome, pdsim, root, scratch};

#[test]
fn prints_one_line_per_schedule_call_with_the_batch_in_order() {
    // case1: budget 48, requests 0 (40 tokens) and 1 (30) from step 0, 2
    // (100) from step 1. Step 0: request 0 takes 40, request 1 the 8 left.
    // Step 1: 0 decodes 1, 1 finishes its prompt (22), 2 takes the
    // 48 - 1 - 22 = 25 left.
    let case = root().join("conformance/cases/case1.json");
    let (code, stdout, stderr) = outcome(&pdsim(&["steps", case.to_str().unwrap()]));
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["step"], 0);
    assert_eq!(lines[0]["batch"], serde_json::json!({"0": 40, "1": 8}));
    assert_eq!(lines[1]["batch"], serde_json::json!({"0": 1, "1": 22, "2": 25}));
    // The batch is written in scheduling order (a parsed object would sort it).
    let raw: Vec<&str> = stdout.lines().collect();
    assert!(raw[1].contains(r#""batch":{"0":1,"1":22,"2":25}"#), "{}", raw[1]);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["step"], i as u64, "steps are numbered without gaps");
    }
    let mut finished: Vec<u64> = lines
        .iter()
        .flat_map(|l| l["finished_after"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()))
        .collect();
    finished.sort_unstable();
    assert_eq!(finished, [0, 1, 2, 3, 4, 5], "every request finishes once");
}

#[test]
fn a_bad_case_names_the_file_and_the_field() {
    let path = scratch(
        "steps-bad.json",
        r#"{"max_num_seqs": 0, "max_num_batched_tokens": 32, "num_blocks": 21, "block_size": 16,
            "prefix_caching": false, "requests": []}"#,
    );
    let (code, _, stderr) = outcome(&pdsim(&["steps", path.to_str().unwrap()]));
    assert_eq!(code, 2);
    assert!(stderr.contains("steps-bad.json: max_num_seqs: must be at least 1"), "{stderr}");
}

/// Full-attention groups of two block sizes: `pdsim run` refuses such a
/// model, and a case of one crashed the pool or never ended. It is refused
/// the same way, placed at the second group's block size.
#[test]
fn a_case_pdsim_cannot_model_is_refused_not_run() {
    let groups = |second: u64| {
        format!(
            r#"{{"max_num_seqs": 4, "max_num_batched_tokens": 64, "num_blocks": 40, "block_size": 16,
                "prefix_caching": true, "cache_groups": [
                  {{"kind": "full_attention", "block_size_tokens": 16, "prefix_cacheable": true}},
                  {{"kind": "full_attention", "block_size_tokens": {second}, "prefix_cacheable": true}}],
                "requests": [{{"id": 0, "arrival_step": 0, "prompt": 40, "output": 3}},
                             {{"id": 1, "arrival_step": 0, "prompt": 20, "output": 2}}]}}"#
        )
    };
    let bad = scratch("steps-two-block-sizes.json", &groups(32));
    let (code, _, stderr) = outcome(&pdsim(&["steps", bad.to_str().unwrap()]));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(
            "steps-two-block-sizes.json: cache_groups[1].block_size_tokens: block_size_tokens 32 differs from 16"
        ),
        "{stderr}"
    );
    // One block size: both requests run to their end.
    let good = scratch("steps-one-block-size.json", &groups(16));
    let (code, stdout, stderr) = outcome(&pdsim(&["steps", good.to_str().unwrap()]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.lines().count() >= 3, "{stdout}");
}
